// inbox.go: the receiving side, signed webhooks from other senders turned
// into local events once per webhook-id, and the sources they come from.
//
// Guarantees (README, "Guarantees, hop by hop", hop 6):
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
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// headerDedupWindow is outboxd's own response header, not part of
// Standard Webhooks: the inbox's dedup window in whole seconds
// (advertisedWindow, replay.go), how long after a first delivery it still
// recognises a second one. An outboxd sender records it from 2xx answers
// per endpoint, clamps its resends to it and alerts when it is shorter
// than its own resend horizon (README, "The inbox").
const headerDedupWindow = "webhook-dedup-window"

// InboxSource is one row of outbox.inbox_sources as the API shows it; the
// secret only in the answers to create and rotate-secret.
type InboxSource struct {
	Name                    string     `json:"name"`
	TopicPrefix             string     `json:"topic_prefix"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	CreatedAt               time.Time  `json:"created_at"`
	URLPath                 string     `json:"url_path"` // where the sender posts
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
  name, topic_prefix,
  CASE WHEN previous_secret_expires_at > now() THEN previous_secret_expires_at END,
  created_at`

func scanSource(row rowScanner) (InboxSource, error) {
	var s InboxSource
	err := row.Scan(&s.Name, &s.TopicPrefix, &s.PreviousSecretExpiresAt, &s.CreatedAt)
	s.URLPath = "/webhooks/" + s.Name
	return s, err
}

// sourceInput is the body of POST /api/sources. Secret is the sender's
// (whsec_... or bare base64); empty generates one to give the sender.
// TopicPrefix nil means name + ".".
type sourceInput struct {
	Name        string  `json:"name"`
	Secret      string  `json:"secret"`
	TopicPrefix *string `json:"topic_prefix"`
}

// parseSourceSecret reads a given secret, or makes one when none is given.
func parseSourceSecret(text string) (webhookSecret, error) {
	if text == "" {
		return newWebhookSecret(), nil
	}
	s, err := parseWebhookSecret(text)
	if err != nil {
		return nil, fmt.Errorf("%w: secret: %v", errInvalid, err)
	}
	if len(s) > maxSecretLen {
		return nil, fmt.Errorf("%w: secret is %d bytes, at most %d", errInvalid, len(s), maxSecretLen)
	}
	return s, nil
}

const createSourceSQL = `
INSERT INTO outbox.inbox_sources (name, secret, topic_prefix)
VALUES ($1, $2, $3)
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
	secret, err := parseSourceSecret(in.Secret)
	if err != nil {
		return inboxSourceWithSecret{}, err
	}
	s, err := scanSource(db.QueryRowContext(ctx, createSourceSQL, in.Name, box.seal(sourceSecretRow(in.Name), secret), prefix))
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
	sources, err := queryAll(ctx, db, scanSource, listSourcesSQL)
	if err != nil {
		return nil, fmt.Errorf("list sources: %w", err)
	}
	return sources, nil
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
       topic_prefix
FROM outbox.inbox_sources
WHERE name = $1`

// sourceSecrets reads what verifying a delivery to source name needs: its
// secrets, opened by box (the current one first, then the previous one
// inside its rotation window), and its topic prefix. A secret that does
// not open makes the source unreadable, as a failed read does.
func sourceSecrets(ctx context.Context, db *sql.DB, box *secretBox, name string) (secrets [][]byte, prefix string, err error) {
	var secret, previous []byte
	err = db.QueryRowContext(ctx, sourceVerifySQL, name).Scan(&secret, &previous, &prefix)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", fmt.Errorf("%w %q", errUnknownSource, name)
	}
	if err != nil {
		return nil, "", fmt.Errorf("%w %q: %w", errSourceUnreadable, name, err)
	}
	stored := [][]byte{secret}
	if previous != nil {
		stored = append(stored, previous)
	}
	if secrets, err = box.openAll(sourceSecretRow(name), stored); err != nil {
		return nil, "", fmt.Errorf("%w %q: %w", errSourceUnreadable, name, err)
	}
	return secrets, prefix, nil
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

// receive records a verified webhook as a local event, once per webhook-id.
// It returns the new event's id, or duplicate.
func receive(ctx context.Context, db *sql.DB, source, webhookID, topic string, wh receivedWebhook) (eventID int64, duplicate bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, fmt.Errorf("receive webhook: %w", err)
	}
	defer tx.Rollback()
	var one int
	err = tx.QueryRowContext(ctx, claimInboxSQL, source, webhookID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("receive webhook: dedup: %w", err)
	}
	if eventID, err = recordEvent(ctx, tx, topic, wh.Subject, wh.Data); err != nil {
		return 0, false, err
	}
	if _, err := tx.ExecContext(ctx, setInboxEventSQL, source, webhookID, eventID); err != nil {
		return 0, false, fmt.Errorf("receive webhook: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, false, fmt.Errorf("receive webhook: commit: %w", err)
	}
	return eventID, false, nil
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
// webhook-id was recorded before. body is read only once the source is
// known, so an unknown source is refused whatever it sent; the signature
// is checked on the raw bytes before anything in them is believed.
func receiveWebhook(ctx context.Context, db *sql.DB, box *secretBox, name string, header http.Header, body io.Reader, now time.Time) (eventID int64, duplicate bool, err error) {
	// A name outside namePattern cannot be a source's (createSource and
	// schema.sql's inbox_sources_name_format refuse it). It is not sent to
	// the database either: one that is not UTF-8, or holds a NUL, would
	// fail the query (SQLSTATE 22021) as if the database were at fault.
	if !namePattern.MatchString(name) {
		return 0, false, fmt.Errorf("%w %q", errUnknownSource, name)
	}
	secrets, prefix, err := sourceSecrets(ctx, db, box, name)
	if err != nil {
		return 0, false, err
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		return 0, false, fmt.Errorf("%w: read body: %w", errInvalid, err)
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
	return receive(ctx, db, name, webhookID, prefix+wh.Type, wh)
}
