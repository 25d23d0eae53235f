// inbox.go: the receiving side, signed webhooks from other senders turned
// into local events once per webhook-id, and the sources they come from.
//
// Guarantees (docs/guarantees.md, hop 6):
//   - The signature is checked on the raw bytes received (Standard
//     Webhooks, signature.go), with the ±5 minute timestamp tolerance.
//   - The dedup row (source, webhook-id) and the local event commit in one
//     transaction; the sender gets its 2xx only after that commit. A second
//     delivery of the same webhook-id answers 2xx and changes nothing, for
//     as long as inbox retention keeps the row: longer than every resend
//     of a sender configured alike (the dedup rule, replay.go), and told
//     to every sender in headerDedupWindow.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// headerDedupWindow is outboxd's own response header, not part of
// Standard Webhooks: the inbox's dedup window in whole seconds
// (advertisedWindow, replay.go), how long after a first delivery it still
// recognises a second one. An outboxd sender records it from 2xx answers
// per endpoint, clamps its resends to it and alerts when it is shorter
// than its own resend horizon (docs/inbox.md).
const headerDedupWindow = "webhook-dedup-window"

// InboxSource is one row of outbox.inbox_sources as the API shows it; the
// secret only in the answers to create and rotate-secret.
type InboxSource struct {
	Name        string `json:"name"`
	TopicPrefix string `json:"topic_prefix"`
	// Owner is the key its webhooks' events are addressed to (events.owner);
	// nil: to no owner.
	Owner                   *string    `json:"owner"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	CreatedAt               time.Time  `json:"created_at"`
	URLPath                 string     `json:"url_path"` // where the sender posts
	// Stats is what the source sent in the last hour and the last 24
	// hours (outbox.inbox_stats), in the list only.
	Stats *InboxSourceStats `json:"stats,omitempty"`
}

type inboxSourceWithSecret struct {
	InboxSource
	Secret string `json:"secret"`
}

// maxTopicPrefixLen matches schema.sql's inbox_sources_topic_prefix_format:
// a prefix leaves room for the sender's type within a topic's 200.
const maxTopicPrefixLen = 100

// topicPrefixValid reports whether p may start a topic: empty, or up to
// maxTopicPrefixLen characters of a topic.
func topicPrefixValid(p string) bool {
	return p == "" || (len(p) <= maxTopicPrefixLen && topicPattern.MatchString(p))
}

const sourceColumns = `
  name, topic_prefix, owner,
  CASE WHEN previous_secret_expires_at > now() THEN previous_secret_expires_at END,
  created_at`

func scanSource(row rowScanner) (InboxSource, error) {
	var s InboxSource
	err := row.Scan(&s.Name, &s.TopicPrefix, &s.Owner, &s.PreviousSecretExpiresAt, &s.CreatedAt)
	s.URLPath = "/webhooks/" + s.Name
	return s, err
}

// sourceInput is the body of POST /api/sources. Secret is the sender's
// (whsec_... or bare base64); empty generates one to give the sender.
// TopicPrefix nil means name + "."; Owner nil, to no owner.
type sourceInput struct {
	Name        string  `json:"name"`
	Secret      string  `json:"secret"`
	TopicPrefix *string `json:"topic_prefix"`
	Owner       *string `json:"owner"`
}

// minSourceSecretLen is the shortest source secret outboxd takes or
// verifies with: Standard Webhooks asks for 24 bytes (192 bits) at least.
// Every byte short of that is a factor of 256 off a forger's work: with a
// 1-byte secret, one forged webhook in 256 tries verifies.
const minSourceSecretLen = 24

// parseSourceSecret reads a given secret, or makes one when none is given.
func parseSourceSecret(text string) (webhookSecret, error) {
	if text == "" {
		return newWebhookSecret(), nil
	}
	s, err := parseWebhookSecret(text)
	if err != nil {
		return nil, fmt.Errorf("%w: secret: %v", errInvalid, err)
	}
	if len(s) < minSourceSecretLen || len(s) > maxSecretLen {
		return nil, fmt.Errorf("%w: secret is %d bytes; Standard Webhooks asks for %d to %d (leave it out to have one generated)",
			errInvalid, len(s), minSourceSecretLen, maxSecretLen)
	}
	return s, nil
}

// errWeakSourceSecret is a source whose every stored secret is shorter
// than minSourceSecretLen (stored before outboxd refused such secrets):
// nothing it receives verifies until it is rotated, since a webhook signed
// with it could be forged.
var errWeakSourceSecret = errors.New("source secret too short to verify with")

// strongSecrets is secrets without those shorter than minSourceSecretLen,
// or errWeakSourceSecret, naming the rotation that mends it, when none is
// left.
func strongSecrets(name string, secrets [][]byte) ([][]byte, error) {
	strong := slices.DeleteFunc(slices.Clone(secrets), func(s []byte) bool { return len(s) < minSourceSecretLen })
	if len(strong) == 0 {
		return nil, fmt.Errorf("%w: %d bytes, under the %d Standard Webhooks asks; rotate it (POST /api/sources/%s/rotate-secret) and give the sender the new one",
			errWeakSourceSecret, len(secrets[0]), minSourceSecretLen, name)
	}
	return strong, nil
}

const createSourceSQL = `
INSERT INTO outbox.inbox_sources (name, secret, topic_prefix, owner)
VALUES ($1, $2, $3, $4)
RETURNING` + sourceColumns

// createSource stores a source with its secret, sealed by box.
func createSource(ctx context.Context, db *sql.DB, box *secretBox, in sourceInput) (inboxSourceWithSecret, error) {
	if !namePattern.MatchString(in.Name) {
		return inboxSourceWithSecret{}, fmt.Errorf("%w: name %q must be 1-50 of a-z 0-9 _ -", errInvalid, in.Name)
	}
	prefix := in.Name + "."
	if in.TopicPrefix != nil {
		prefix = *in.TopicPrefix
	}
	if !topicPrefixValid(prefix) {
		return inboxSourceWithSecret{}, fmt.Errorf("%w: topic_prefix %q must be empty or up to 100 topic characters", errInvalid, prefix)
	}
	if in.Owner != nil {
		if err := validOwnerKey("owner", *in.Owner); err != nil {
			return inboxSourceWithSecret{}, err
		}
	}
	secret, err := parseSourceSecret(in.Secret)
	if err != nil {
		return inboxSourceWithSecret{}, err
	}
	s, err := scanSource(db.QueryRowContext(ctx, createSourceSQL, in.Name, box.seal(sourceSecretRow(in.Name), secret), prefix, in.Owner))
	if pq.As(err, pqerror.UniqueViolation) != nil {
		return inboxSourceWithSecret{}, fmt.Errorf("%w: source %q exists", errInvalid, in.Name)
	}
	if err != nil {
		return inboxSourceWithSecret{}, fmt.Errorf("create source: %w", err)
	}
	return inboxSourceWithSecret{InboxSource: s, Secret: secret.Encode()}, nil
}

const listSourcesSQL = `
SELECT` + sourceColumns + `
FROM outbox.inbox_sources
ORDER BY name
LIMIT 1000`

func listSources(ctx context.Context, db *sql.DB) ([]InboxSource, error) {
	sources, _, err := listSourcesWithStats(ctx, db)
	return sources, err
}

// listSourcesWithStats lists the sources, each with its Stats, and gives
// unknownSourceBucket's numbers besides.
func listSourcesWithStats(ctx context.Context, db *sql.DB) (sources []InboxSource, unknown InboxSourceStats, err error) {
	sources, err = queryAll(ctx, db, scanSource, listSourcesSQL)
	if err != nil {
		return nil, unknown, fmt.Errorf("list sources: %w", err)
	}
	stats, err := readInboxStats(ctx, db)
	if err != nil {
		return nil, unknown, err
	}
	for i := range sources {
		st := stats.of(sources[i].Name)
		sources[i].Stats = &st
	}
	return sources, stats.of(unknownSourceBucket), nil
}

// deleteSourceSQL removes a source; its inbox rows stay until retention,
// so a source deleted and added again still dedupes what it received.
const deleteSourceSQL = `
DELETE FROM outbox.inbox_sources
WHERE name = $1`

func deleteSource(ctx context.Context, db *sql.DB, name string) error {
	res, err := db.ExecContext(ctx, deleteSourceSQL, name)
	if err != nil {
		return fmt.Errorf("delete source %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("source %q: %w", name, errNotFound)
	}
	return nil
}

// rotateSourceSecretSQL makes $2 the secret and keeps the current one
// verifying for $3 seconds more, as endpoints do (the current one moves as
// it is stored, sealed or not).
const rotateSourceSecretSQL = `
UPDATE outbox.inbox_sources
SET previous_secret = secret,
    previous_secret_expires_at = now() + make_interval(secs => $3),
    secret = $2
WHERE name = $1
RETURNING` + sourceColumns

// rotateSourceSecret makes secret, sealed by box, the source's secret.
func rotateSourceSecret(ctx context.Context, db *sql.DB, box *secretBox, name string, secret webhookSecret, window time.Duration) (InboxSource, error) {
	s, err := scanSource(db.QueryRowContext(ctx, rotateSourceSecretSQL, name, box.seal(sourceSecretRow(name), secret), window.Seconds()))
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("source %q: %w", name, errNotFound)
	}
	if err != nil {
		return s, fmt.Errorf("rotate secret of source %q: %w", name, err)
	}
	return s, nil
}

// sourceVerifySQL reads what verification needs: the secret and, inside
// its rotation window, the previous one.
const sourceVerifySQL = `
SELECT secret,
       CASE WHEN previous_secret_expires_at > now() THEN previous_secret END,
       topic_prefix,
       coalesce(owner, '')
FROM outbox.inbox_sources
WHERE name = $1`

// sourceSecrets reads what verifying a delivery to source name needs: its
// secrets, opened by box (the current one first, then the previous one
// inside its rotation window), its topic prefix and the owner its events
// are addressed to ("": none). A secret that does not open makes the
// source unreadable, as a failed read does.
func sourceSecrets(ctx context.Context, db *sql.DB, box *secretBox, name string) (secrets [][]byte, prefix, owner string, err error) {
	var secret, previous []byte
	err = db.QueryRowContext(ctx, sourceVerifySQL, name).Scan(&secret, &previous, &prefix, &owner)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", "", fmt.Errorf("%w %q", errUnknownSource, name)
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("%w %q: %w", errSourceUnreadable, name, err)
	}
	stored := [][]byte{secret}
	if previous != nil {
		stored = append(stored, previous)
	}
	if secrets, err = box.openAll(sourceSecretRow(name), stored); err != nil {
		return nil, "", "", fmt.Errorf("%w %q: %w", errSourceUnreadable, name, err)
	}
	return secrets, prefix, owner, nil
}

// receivedWebhook is the body of a Standard Webhooks delivery as outboxd
// sends it; only type is required.
type receivedWebhook struct {
	Type    string          `json:"type"`
	Subject string          `json:"subject"`
	Data    json.RawMessage `json:"data"`
}

// claimInboxSQL takes the dedup row; no row back means this webhook-id
// of this source was recorded before.
const claimInboxSQL = `
INSERT INTO outbox.inbox (source, webhook_id)
VALUES ($1, $2)
ON CONFLICT (source, webhook_id) DO NOTHING
RETURNING 1`

const setInboxEventSQL = `
UPDATE outbox.inbox
SET event_id = $3
WHERE source = $1
  AND webhook_id = $2`

// receive records a verified webhook as a local event, once per webhook-id,
// under the trace context the delivery carried (tc), so that a chain of
// senders continues one trace. It returns the new event's id, or
// duplicate.
func receive(ctx context.Context, db *sql.DB, source, webhookID string, ev eventInput, tc traceContext) (eventID int64, duplicate bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, fmt.Errorf("receive webhook: %w", err)
	}
	defer tx.Rollback()
	var one int
	err = tx.QueryRowContext(ctx, claimInboxSQL, source, webhookID).Scan(&one)
	duplicate = errors.Is(err, sql.ErrNoRows)
	if err != nil && !duplicate {
		return 0, false, fmt.Errorf("receive webhook: dedup: %w", err)
	}
	if !duplicate {
		if tc != (traceContext{}) {
			if err := setTraceContext(ctx, tx, tc); err != nil {
				return 0, false, fmt.Errorf("receive webhook: %w", err)
			}
		}
		if eventID, err = ev.record(ctx, tx); err != nil {
			return 0, false, err
		}
		if _, err := tx.ExecContext(ctx, setInboxEventSQL, source, webhookID, eventID); err != nil {
			return 0, false, fmt.Errorf("receive webhook: %w", err)
		}
	}
	// Last, so that the row lock its upsert takes is held only for the
	// commit: concurrent deliveries of one source queue on it.
	if _, err := tx.ExecContext(ctx, countReceivedSQL, source, !duplicate); err != nil {
		return 0, false, fmt.Errorf("receive webhook: count: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, false, fmt.Errorf("receive webhook: commit: %w", err)
	}
	return eventID, duplicate, nil
}

// Why receiveWebhook records nothing, beside errInvalid (a delivery that
// verified but cannot be recorded), an *unverifiedError and a failure of
// the database. The HTTP layer gives each its answer (api.go, inboxError).
var (
	// errUnknownSource: no source has the name.
	errUnknownSource = errors.New("no inbox source")
	// errSourceUnreadable: the source could not be read, so nothing about
	// the delivery is known yet.
	errSourceUnreadable = errors.New("read inbox source")
)

// unverifiedError is a delivery that does not verify as its source's;
// verifyWebhook's error, which it wraps, says how.
type unverifiedError struct{ err error }

func (e *unverifiedError) Error() string { return e.err.Error() }
func (e *unverifiedError) Unwrap() error { return e.err }

// maxWebhookIDLen bounds the dedup key the sender chooses, as schema.sql's
// inbox_webhook_id_length does; checked here first so the sender is told
// so with a 400 rather than a constraint's 500.
const maxWebhookIDLen = 256

// receiveWebhook records a delivery to source name as a local event, once
// per webhook-id, and returns the event's id, or duplicate when that
// webhook-id was recorded before. Either is counted in outbox.inbox_stats
// with the event; a refusal is counted there after it (countRefusal). A
// refusal that could not be counted is answered as the database's failure
// it is, so the sender tries again.
func receiveWebhook(ctx context.Context, db *sql.DB, box *secretBox, name string, header http.Header, body io.Reader, now time.Time) (eventID int64, duplicate bool, err error) {
	eventID, duplicate, err = verifyAndReceive(ctx, db, box, name, header, body, now)
	if class := refusalClass(err); class != "" {
		if countErr := countRefusal(ctx, db, name, class, err); countErr != nil {
			return 0, false, countErr
		}
	}
	return eventID, duplicate, err
}

// verifyAndReceive is receiveWebhook before counting. body is read only
// once the source is known, so an unknown source is refused whatever it
// sent; the signature is checked on the raw bytes before anything in them
// is believed.
func verifyAndReceive(ctx context.Context, db *sql.DB, box *secretBox, name string, header http.Header, body io.Reader, now time.Time) (eventID int64, duplicate bool, err error) {
	// A name outside namePattern cannot be a source's (createSource and
	// schema.sql's inbox_sources_name_format refuse it). It is not sent to
	// the database either: one that is not UTF-8, or holds a NUL, would
	// fail the query (SQLSTATE 22021) as if the database were at fault.
	if !namePattern.MatchString(name) {
		return 0, false, fmt.Errorf("%w %q", errUnknownSource, name)
	}
	secrets, prefix, owner, err := sourceSecrets(ctx, db, box, name)
	if err != nil {
		return 0, false, err
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		return 0, false, fmt.Errorf("%w: read body: %w", errInvalid, err)
	}
	secrets, err = strongSecrets(name, secrets)
	if err != nil {
		return 0, false, &unverifiedError{err}
	}
	if err := verifyWebhook(secrets, header, raw, now); err != nil {
		return 0, false, &unverifiedError{err}
	}
	webhookID := header.Get(headerWebhookID)
	if len(webhookID) > maxWebhookIDLen {
		return 0, false, fmt.Errorf("%w: %s is %d bytes, at most %d", errInvalid, headerWebhookID, len(webhookID), maxWebhookIDLen)
	}
	var wh receivedWebhook
	if err := json.Unmarshal(raw, &wh); err != nil || wh.Type == "" {
		return 0, false, fmt.Errorf(`%w: body must be a JSON object with a "type"`, errInvalid)
	}
	ev := eventInput{Topic: prefix + wh.Type, Subject: wh.Subject, Payload: wh.Data, Owner: owner}
	return receive(ctx, db, name, webhookID, ev, traceContextOf(header))
}

// Refusal classes, the columns of outbox.inbox_stats that count them
// (schema.sql). refusalClass decides which a refusal is.
const (
	refusedBadSignature   = "bad_signature"   // 401: no signature matches
	refusedStaleTimestamp = "stale_timestamp" // 401: more than 5 minutes old or ahead
	refusedUnknownSource  = "unknown_source"  // 404: no source has the name
	refusedTooLarge       = "too_large"       // 413: the body past maxInboxBody
	refusedMalformed      = "malformed"       // 400: a header, the webhook-id or the body
)

// unknownSourceBucket is the source every webhook sent to a name no source
// has is counted under: one row a minute however many names a flood makes
// up, and no name that is not a source's ever stored as one. The name sent
// to stays in the refusal's reason, quoted and truncated.
const unknownSourceBucket = "(unknown)"

// maxRefusalReasonLen bounds last_refusal_reason, in characters, as
// schema.sql's inbox_stats_last_refusal_reason_length does.
const maxRefusalReasonLen = 200

// refusalClass is the class of a delivery verifyAndReceive did not record
// for a reason of the request's (the status inboxError gives it), or ""
// for none: success, a source that could not be read or the database's
// failure (not the sender's doing), and a body that never arrived (its
// request ended with it, leaving nothing to count it with).
func refusalClass(err error) string {
	if err == nil {
		return ""
	}
	_, tooBig := errors.AsType[*http.MaxBytesError](err)
	_, unverified := errors.AsType[*unverifiedError](err)
	switch {
	case errors.Is(err, errUnknownSource):
		return refusedUnknownSource
	case errors.Is(err, errSourceUnreadable), errors.Is(err, errBodyRead):
		return ""
	case tooBig:
		return refusedTooLarge
	case errors.Is(err, errWebhookTooOld), errors.Is(err, errWebhookTooNew):
		return refusedStaleTimestamp
	case errors.Is(err, errWebhookMissingHeader), errors.Is(err, errWebhookBadTimestamp):
		return refusedMalformed
	case unverified:
		return refusedBadSignature
	case errors.Is(err, errInvalid):
		return refusedMalformed
	}
	return ""
}

// refusalReason is err's text as last_refusal_reason stores it: valid
// UTF-8 without NULs (PostgreSQL's text takes neither), at most
// maxRefusalReasonLen characters.
func refusalReason(err error) string {
	text := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", "")
	if r := []rune(text); len(r) > maxRefusalReasonLen {
		text = string(r[:maxRefusalReasonLen-1]) + "…"
	}
	return text
}

// countReceivedSQL adds a delivery accepted in the receiving transaction
// to its source's minute: $2 true for a new one, false for a duplicate.
const countReceivedSQL = `
INSERT INTO outbox.inbox_stats AS s (minute, source, received, duplicates)
VALUES (date_trunc('minute', now()), $1, $2::boolean::int, (NOT $2::boolean)::int)
ON CONFLICT (minute, source) DO UPDATE
SET received = s.received + excluded.received,
    duplicates = s.duplicates + excluded.duplicates`

// maxRefusalReasons bounds the distinct reasons a source's minute keeps
// (inbox_stats.refusal_reasons); past it a refusal counts under its class
// and otherRefusalReasons. Twenty tell one sender's mistakes apart, and
// bound the row however it varies them.
const (
	maxRefusalReasons   = 20
	otherRefusalReasons = "(other reasons)"
)

// countRefusedSQL adds one refusal of class $2 to source $1's minute,
// counts its reason $3 among the minute's reasons (at most $4 of them,
// then under otherRefusalReasons) and makes it the minute's last.
const countRefusedSQL = `
INSERT INTO outbox.inbox_stats AS s (minute, source, bad_signature, stale_timestamp, unknown_source,
                                     too_large, malformed, last_refusal_reason, last_refusal_class, last_refused_at,
                                     refusal_reasons)
VALUES (date_trunc('minute', now()), $1,
        ($2::text = 'bad_signature')::int,
        ($2::text = 'stale_timestamp')::int,
        ($2::text = 'unknown_source')::int,
        ($2::text = 'too_large')::int,
        ($2::text = 'malformed')::int,
        $3, $2, now(),
        jsonb_build_object($2::text || ' ' || $3::text, 1))
ON CONFLICT (minute, source) DO UPDATE
SET bad_signature = s.bad_signature + excluded.bad_signature,
    stale_timestamp = s.stale_timestamp + excluded.stale_timestamp,
    unknown_source = s.unknown_source + excluded.unknown_source,
    too_large = s.too_large + excluded.too_large,
    malformed = s.malformed + excluded.malformed,
    last_refusal_reason = excluded.last_refusal_reason,
    last_refusal_class = excluded.last_refusal_class,
    last_refused_at = excluded.last_refused_at,
    refusal_reasons = (
      SELECT jsonb_set(s.refusal_reasons, ARRAY[k.key], to_jsonb(coalesce((s.refusal_reasons ->> k.key)::bigint, 0) + 1))
      FROM (SELECT CASE WHEN s.refusal_reasons ? ($2::text || ' ' || $3::text)
                          OR (SELECT count(*) FROM jsonb_object_keys(s.refusal_reasons)) < $4::int
                        THEN $2::text || ' ' || $3::text
                        ELSE $2::text || ' ` + otherRefusalReasons + `'
                   END AS key) AS k)`

// countRefusal counts a refusal of class for source name with one
// statement of its own (there is no transaction to join: nothing else is
// written). Only the reason is kept, never the request.
func countRefusal(ctx context.Context, db *sql.DB, name, class string, refusal error) error {
	source := name
	if class == refusedUnknownSource {
		source = unknownSourceBucket
	}
	if _, err := db.ExecContext(ctx, countRefusedSQL, source, class, refusalReason(refusal), maxRefusalReasons); err != nil {
		return fmt.Errorf("count refused webhook: %w", err)
	}
	return nil
}

// InboxSourceStats is one source's numbers over the last hour and the
// last 24 hours.
type InboxSourceStats struct {
	LastHour InboxStats `json:"last_hour"`
	LastDay  InboxStats `json:"last_24h"`
}

// InboxStats is what a source sent over a window of whole minutes ending
// with the current one: accepted (received new, duplicates) and refused,
// by class, with the window's last refusal; the same over time (Series),
// and the window's recent refusal reasons.
type InboxStats struct {
	Received          int64      `json:"received"`
	Duplicates        int64      `json:"duplicates"`
	Refused           int64      `json:"refused"` // the sum of the classes
	BadSignature      int64      `json:"bad_signature"`
	StaleTimestamp    int64      `json:"stale_timestamp"`
	UnknownSource     int64      `json:"unknown_source"`
	TooLarge          int64      `json:"too_large"`
	Malformed         int64      `json:"malformed"`
	LastRefusalReason string     `json:"last_refusal_reason,omitempty"`
	LastRefusedAt     *time.Time `json:"last_refused_at"`
	// Series is the window's points, oldest first, SeriesStepMinutes
	// apart: every minute of the last hour, every inboxDayBucket of the
	// last 24 hours. The last holds the current minute.
	SeriesStepMinutes int          `json:"series_step_minutes"`
	Series            []InboxPoint `json:"series"`
	// RecentRefusals are the distinct last refusals of the window's
	// points, newest first, at most maxRecentRefusals: each point keeps
	// only its last reason, so a reason given in between is not here.
	RecentRefusals []InboxRefusal `json:"recent_refusals"`
	// RefusalsByMinute is every reason refused in each minute of the
	// last hour with its count, newest minute first, the most frequent
	// first within it, at most maxRefusalRows; only in last_hour.
	RefusalsByMinute []InboxRefusalCount `json:"refusals_by_minute,omitempty"`
}

// InboxRefusalCount is how many refusals of one class and reason a
// source's minute counted.
type InboxRefusalCount struct {
	Minute time.Time `json:"minute"`
	Class  string    `json:"class"`
	Reason string    `json:"reason"`
	Count  int64     `json:"count"`
}

// maxRefusalRows bounds a source's RefusalsByMinute: an hour of a
// sender's every mistake is a page to read, not a log to scroll.
const maxRefusalRows = 60

// refusalsByMinuteSQL reads every source's refusal reasons of the last
// $1 minutes (the current one included), at most $2 a source, newest
// minute first, by the primary key.
const refusalsByMinuteSQL = `
SELECT source, minute, class, reason, n
FROM (
  SELECT s.source, s.minute, split_part(r.key, ' ', 1) AS class,
         substr(r.key, strpos(r.key, ' ') + 1) AS reason, r.value::bigint AS n,
         row_number() OVER (PARTITION BY s.source ORDER BY s.minute DESC, r.value::bigint DESC, r.key) AS rank
  FROM outbox.inbox_stats AS s,
       jsonb_each_text(s.refusal_reasons) AS r (key, value)
  WHERE s.minute >= date_trunc('minute', now()) - make_interval(mins => $1 - 1)
) AS ranked
WHERE rank <= $2
ORDER BY source, minute DESC, n DESC, class, reason`

// addRefusalsByMinute reads the last hour's refusal reasons of every
// source that has statistics into its LastHour.
func (in inboxStatsReading) addRefusalsByMinute(ctx context.Context, db *sql.DB) error {
	type row struct {
		source string
		InboxRefusalCount
	}
	rows, err := queryAll(ctx, db, func(rs rowScanner) (row, error) {
		var r row
		err := rs.Scan(&r.source, &r.Minute, &r.Class, &r.Reason, &r.Count)
		return r, err
	}, refusalsByMinuteSQL, statsWindows["1h"], maxRefusalRows)
	if err != nil {
		return fmt.Errorf("read inbox refusals: %w", err)
	}
	for _, r := range rows {
		if st, ok := in.bySource[r.source]; ok {
			st.LastHour.RefusalsByMinute = append(st.LastHour.RefusalsByMinute, r.InboxRefusalCount)
		}
	}
	return nil
}

// InboxPoint is what a source sent in one point's span of a series.
type InboxPoint struct {
	From       time.Time `json:"from"` // the start of its first minute
	Received   int64     `json:"received"`
	Duplicates int64     `json:"duplicates"`
	Refused    int64     `json:"refused"`
}

// InboxRefusal is the last refusal of a point: when, its class (a
// refusal class; empty for one counted before outbox.inbox_stats kept
// classes) and its reason.
type InboxRefusal struct {
	At     time.Time `json:"at"`
	Class  string    `json:"class"`
	Reason string    `json:"reason"`
}

// inboxDayBucket is the span of a point of the 24-hour series: 96 points,
// light enough to draw and send for every source on one page, where a
// point a minute would be 1,440 a source. It divides an hour, so the last
// hour is the day's last 4 points exactly.
const inboxDayBucket = 15 * time.Minute

// maxRecentRefusals bounds a window's RecentRefusals: a handful tells one
// misconfigured sender from another without a list to scroll.
const maxRecentRefusals = 5

// inboxStatsSQL reads every source's last $1 minutes (the current one
// included, as the delivery statistics' windows do, stats.go) by the
// primary key, in one statement for every source and both windows: a row
// for each minute of the last $2, and one for each $3 minutes before
// them, counted from the window's first minute, each with its last
// refusal. The window's first minute leads every row, and is all there
// is in the one row answered when no source sent anything.
const inboxStatsSQL = `
WITH w AS (
  SELECT date_trunc('minute', now()) - make_interval(mins => $1 - 1) AS day_from,
         date_trunc('minute', now()) - make_interval(mins => $2 - 1) AS hour_from
)
SELECT w.day_from, s.source, s.span,
       coalesce(s.received, 0), coalesce(s.duplicates, 0),
       coalesce(s.bad_signature, 0), coalesce(s.stale_timestamp, 0), coalesce(s.unknown_source, 0),
       coalesce(s.too_large, 0), coalesce(s.malformed, 0),
       s.last_refusal_reason, s.last_refusal_class, s.last_refused_at
FROM w
LEFT JOIN LATERAL (
  SELECT source,
         CASE WHEN minute >= w.hour_from THEN minute
              ELSE date_bin(make_interval(mins => $3), minute, w.day_from)
         END AS span,
         sum(received) AS received, sum(duplicates) AS duplicates,
         sum(bad_signature) AS bad_signature, sum(stale_timestamp) AS stale_timestamp,
         sum(unknown_source) AS unknown_source, sum(too_large) AS too_large, sum(malformed) AS malformed,
         (array_agg(last_refusal_reason ORDER BY last_refused_at DESC NULLS LAST, minute DESC))[1] AS last_refusal_reason,
         (array_agg(last_refusal_class ORDER BY last_refused_at DESC NULLS LAST, minute DESC))[1] AS last_refusal_class,
         max(last_refused_at) AS last_refused_at
  FROM outbox.inbox_stats
  WHERE minute >= w.day_from
  GROUP BY source, span
) AS s ON true`

// inboxSpan is a row of inboxStatsSQL: one source's point, or the empty
// row of a window no source sent anything in (source "").
type inboxSpan struct {
	dayFrom time.Time
	source  string
	from    time.Time
	InboxStats
	last *InboxRefusal
}

func scanInboxSpan(row rowScanner) (inboxSpan, error) {
	var s inboxSpan
	var source, reason, class sql.NullString
	var from, refusedAt sql.NullTime
	err := row.Scan(&s.dayFrom, &source, &from, &s.Received, &s.Duplicates, &s.BadSignature, &s.StaleTimestamp,
		&s.UnknownSource, &s.TooLarge, &s.Malformed, &reason, &class, &refusedAt)
	s.source, s.from = source.String, from.Time
	s.Refused = s.BadSignature + s.StaleTimestamp + s.UnknownSource + s.TooLarge + s.Malformed
	if reason.Valid && refusedAt.Valid {
		s.last = &InboxRefusal{At: refusedAt.Time, Class: class.String, Reason: reason.String}
	}
	return s, err
}

// inboxStatsReading is every source's numbers as one read found them.
type inboxStatsReading struct {
	dayFrom  time.Time // the first minute of the 24 hours
	bySource map[string]*InboxSourceStats
}

// readInboxStats reads every source's last hour and last 24 hours,
// unknownSourceBucket's included, in one statement.
func readInboxStats(ctx context.Context, db *sql.DB) (inboxStatsReading, error) {
	hour, day := statsWindows["1h"], statsWindows["24h"]
	spans, err := queryAll(ctx, db, scanInboxSpan, inboxStatsSQL, day, hour, int(inboxDayBucket/time.Minute))
	if err != nil {
		return inboxStatsReading{}, fmt.Errorf("read inbox stats: %w", err)
	}
	if len(spans) == 0 {
		return inboxStatsReading{}, fmt.Errorf("read inbox stats: no row for the window") // unreachable: w has one
	}
	in := inboxStatsReading{dayFrom: spans[0].dayFrom, bySource: map[string]*InboxSourceStats{}}
	for _, sp := range spans {
		if sp.source == "" {
			continue
		}
		st, ok := in.bySource[sp.source]
		if !ok {
			st = in.empty()
			in.bySource[sp.source] = st
		}
		st.LastDay.add(sp, inboxDayBucket)
		st.LastHour.add(sp, time.Minute)
	}
	for _, st := range in.bySource {
		st.LastHour.settleRefusals()
		st.LastDay.settleRefusals()
	}
	return in, in.addRefusalsByMinute(ctx, db)
}

// of is source name's numbers: zero, with a series of zeros, when it
// sent nothing.
func (in inboxStatsReading) of(name string) InboxSourceStats {
	if st, ok := in.bySource[name]; ok {
		return *st
	}
	return *in.empty()
}

// empty is the numbers of a source that sent nothing: its series zeros.
func (in inboxStatsReading) empty() *InboxSourceStats {
	series := func(minutes int, step time.Duration) InboxStats {
		from := in.dayFrom.Add(time.Duration(statsWindows["24h"]-minutes) * time.Minute)
		st := InboxStats{SeriesStepMinutes: int(step / time.Minute), Series: make([]InboxPoint, time.Duration(minutes)*time.Minute/step),
			RecentRefusals: []InboxRefusal{}}
		for i := range st.Series {
			st.Series[i].From = from.Add(time.Duration(i) * step)
		}
		return st
	}
	return &InboxSourceStats{LastHour: series(statsWindows["1h"], time.Minute), LastDay: series(statsWindows["24h"], inboxDayBucket)}
}

// add counts a span into the window and into its point, the points step
// apart, if the span is within the window: a bucket before the last hour
// is not the hour's, and a minute after the window (begun after the
// read's now) is the next read's.
func (st *InboxStats) add(sp inboxSpan, step time.Duration) {
	i := int(sp.from.Sub(st.Series[0].From) / step)
	if sp.from.Before(st.Series[0].From) || i >= len(st.Series) {
		return
	}
	p := &st.Series[i]
	p.Received += sp.Received
	p.Duplicates += sp.Duplicates
	p.Refused += sp.Refused
	st.Received += sp.Received
	st.Duplicates += sp.Duplicates
	st.Refused += sp.Refused
	st.BadSignature += sp.BadSignature
	st.StaleTimestamp += sp.StaleTimestamp
	st.UnknownSource += sp.UnknownSource
	st.TooLarge += sp.TooLarge
	st.Malformed += sp.Malformed
	if sp.last != nil {
		st.RecentRefusals = append(st.RecentRefusals, *sp.last)
	}
}

// settleRefusals keeps the newest of each distinct refusal, newest first,
// at most maxRecentRefusals, and makes the newest the window's last.
func (st *InboxStats) settleRefusals() {
	slices.SortStableFunc(st.RecentRefusals, func(a, b InboxRefusal) int { return b.At.Compare(a.At) })
	seen := map[InboxRefusal]bool{}
	kept := st.RecentRefusals[:0]
	for _, r := range st.RecentRefusals {
		key := InboxRefusal{Class: r.Class, Reason: r.Reason}
		if seen[key] || len(kept) == maxRecentRefusals {
			continue
		}
		seen[key] = true
		kept = append(kept, r)
	}
	st.RecentRefusals = kept
	if len(kept) > 0 {
		st.LastRefusalReason, st.LastRefusedAt = kept[0].Reason, &kept[0].At
	}
}
