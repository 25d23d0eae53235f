// probe.go: the prober, which brings back endpoints disabled for failing.
// An endpoint disabled by the 5-day sweep (disabled_cause 'failure',
// retention.go) gets a signed probe on the schedule of schema.sql's
// outbox.probe_interval (hourly through the first day, then every 6 hours);
// the first 2xx re-enables it, replays what it missed since it was
// disabled, records why, and notifies its owner. One disabled by an
// operator or by a 410, or one that opted out (recovery_probes false), is
// never probed.
//
// Guarantees (docs/endpoints.md, recovery probes):
//   - Replicas share the probes: a probe is claimed by locking its endpoint
//     row (SKIP LOCKED), and the claim commits the next probe's time before
//     the request is sent, so a crash or a restart skips a probe and never
//     sends a burst of them.
//   - The re-enable and the owner's recovered event commit together.
//   - The replay enqueues only the events recorded since the disable that
//     the endpoint has no job for, so nothing is sent twice. It runs at
//     once and again once every relay statement that began before the
//     re-enable has ended (recoveryReplayMargin): a relay that read the
//     endpoint as disabled may mark events fanned out after the first pass
//     looked. recovery_replay_from keeps the pass due across a crash.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

const (
	// probeInterval is how often the prober looks for due probes. The
	// schedule is hourly at its tightest, so a minute late is nothing.
	probeInterval = time.Minute
	// probeBatch bounds the probes one claim takes; they are sent at once,
	// each bounded by its endpoint's timeout, else -webhook-timeout.
	probeBatch = 32
	// recoveryReplayMargin is how long after a re-enable the replay's last
	// pass runs. A relay statement takes milliseconds; five minutes is far
	// beyond any that began before the re-enable committed.
	recoveryReplayMargin = 5 * time.Minute
	// probeType is the body's "type" of a probe.
	probeType = internalTopicPrefix + "probe"
	// probeInFlightNote is last_probe_error from the claim until the answer
	// is written: a prober that stopped in between leaves it.
	probeInFlightNote = "sent; no answer recorded yet"
)

// prober sends recovery probes and re-enables the endpoints that answer.
type prober struct {
	db        *sql.DB
	box       *secretBox
	client    *http.Client
	userAgent string
	// eventsRetention clamps the replay, as every replay is (replay.go);
	// maxAttempts is a replayed job's.
	eventsRetention time.Duration
	maxAttempts     int
	interval        time.Duration
	logger          *slog.Logger
	// endpointTLS, if set, are the clients of endpoints with TLS
	// material (clientcert.go), which probes present as deliveries do.
	endpointTLS *endpointClients
}

func newProber(db *sql.DB, box *secretBox, client *http.Client, eventsRetention time.Duration, maxAttempts int, logger *slog.Logger) *prober {
	return &prober{
		db:              db,
		box:             box,
		client:          client,
		userAgent:       "outboxd/" + version,
		eventsRetention: eventsRetention,
		maxAttempts:     maxAttempts,
		interval:        probeInterval,
		logger:          logger.With("loop", "prober"),
	}
}

// Run probes once at start, then every interval.
func (p *prober) Run(ctx context.Context) error {
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	for {
		if _, err := p.probeOnce(ctx); err != nil && ctx.Err() == nil {
			p.logger.Error("probe round failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// probeRound is what one round did.
type probeRound struct {
	Probed    int     // probes sent (or tried: a secret this process cannot open)
	Recovered []int64 // endpoints re-enabled
	Replayed  int64   // jobs the replays' last passes enqueued
}

// probeOnce sends every due probe, batch by batch, then runs the replays'
// last passes that are due.
func (p *prober) probeOnce(ctx context.Context) (probeRound, error) {
	var round probeRound
	for {
		probes, err := p.claim(ctx)
		if err != nil {
			return round, err
		}
		round.Probed += len(probes)
		recovered := make([]bool, len(probes))
		var wg sync.WaitGroup
		for i, pr := range probes {
			wg.Go(func() { recovered[i] = p.probe(ctx, pr) })
		}
		wg.Wait()
		for i, ok := range recovered {
			if ok {
				round.Recovered = append(round.Recovered, probes[i].endpointID)
			}
		}
		if len(probes) < probeBatch {
			break
		}
	}
	n, err := p.finishReplays(ctx)
	round.Replayed = n
	return round, err
}

// claimProbesSQL claims up to $1 due probes and schedules each endpoint's
// next one in the same statement, which commits before any is sent.
// disabled_cause = 'failure' repeats probe_due_at's first condition so
// that only those rows are read; endpoints are few (people create them),
// and the table has no index for this.
const claimProbesSQL = `
WITH due AS (
  SELECT id
  FROM outbox.endpoints
  WHERE disabled_cause = 'failure'
    AND outbox.probe_due_at(disabled_cause, recovery_probes, url, disabled_at, next_probe_at) <= now()
  ORDER BY id
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE outbox.endpoints AS ep
SET next_probe_at = now() + outbox.probe_interval(ep.disabled_at, now()),
    last_probe_at = now(),
    last_probe_error = $2
FROM due
WHERE ep.id = due.id
RETURNING ep.id, ep.url, ep.disabled_at, ep.disabled_reason, ep.secret,
          CASE WHEN ep.previous_secret_expires_at > now() THEN ep.previous_secret END,
          now(),
          ep.public_key,
          CASE WHEN ep.previous_secret_expires_at > now() THEN ep.previous_public_key END,
          ep.timeout_seconds, ep.headers, ep.secret_headers`

// claimedProbe is one probe to send: the endpoint as its claim read it.
type claimedProbe struct {
	endpointID     int64
	url            string
	disabledAt     time.Time
	disabledReason string
	secrets        [][]byte // as stored (secrets.go): current, then previous in its window
	at             time.Time
	publicKeys     [][]byte // of secrets, in their places (deliveryEndpoint.PublicKeys)
	// request is the endpoint's own timeout and headers, which a probe
	// carries as a delivery does: a receiver that wants its API key
	// refuses a probe without it.
	request endpointRequest
}

func scanClaimedProbe(row rowScanner) (claimedProbe, error) {
	var pr claimedProbe
	var secret, previous, public, previousPublic []byte
	var timeoutSeconds sql.NullInt64
	err := row.Scan(&pr.endpointID, &pr.url, &pr.disabledAt, &pr.disabledReason, &secret, &previous, &pr.at, &public, &previousPublic,
		&timeoutSeconds, &pr.request.headers, &pr.request.secretHeaders)
	pr.request.timeout = time.Duration(timeoutSeconds.Int64) * time.Second
	pr.secrets, pr.publicKeys = [][]byte{secret}, [][]byte{public}
	if previous != nil {
		pr.secrets, pr.publicKeys = append(pr.secrets, previous), append(pr.publicKeys, previousPublic)
	}
	return pr, err
}

func (p *prober) claim(ctx context.Context) ([]claimedProbe, error) {
	probes, err := queryAll(ctx, p.db, scanClaimedProbe, claimProbesSQL, probeBatch, probeInFlightNote)
	if err != nil {
		return nil, fmt.Errorf("claim probes: %w", err)
	}
	return probes, nil
}

// probeID is a probe's webhook-id and body id: unique per endpoint and
// second, and never an event's (those are digits only).
func probeID(endpointID int64, at time.Time) string {
	return fmt.Sprintf("probe-%d-%d", endpointID, at.Unix())
}

// encodeProbeBody is a probe's body: a delivery's fields, with the
// endpoint's id as the subject and no data.
func encodeProbeBody(endpointID int64, at time.Time) []byte {
	body, _ := json.Marshal(webhookBody{ // strings and a literal: cannot fail
		ID:        probeID(endpointID, at),
		Type:      probeType,
		Subject:   strconv.FormatInt(endpointID, 10),
		Timestamp: at.UTC().Format(time.RFC3339Nano),
		Data:      json.RawMessage(`{}`),
	})
	return body
}

// probe sends one probe and writes what its answer means; it reports
// whether the endpoint was re-enabled. Errors are logged: one endpoint's
// trouble is not the round's.
func (p *prober) probe(ctx context.Context, pr claimedProbe) bool {
	log := p.logger.With("endpoint_id", pr.endpointID)
	status, err := p.send(ctx, pr)
	if ctx.Err() != nil {
		return false // stopping: last_probe_error says no answer was recorded
	}
	if err == nil {
		ok, err := p.recover(ctx, pr, status)
		if err != nil {
			log.Error("endpoint answered its recovery probe, and the re-enable failed; the next probe tries again", "err", err)
		}
		return ok
	}
	gone := status == http.StatusGone
	if werr := p.recordFailure(ctx, pr, err, gone); werr != nil {
		log.Error("recording a failed recovery probe failed", "err", werr, "probe_err", err)
		return false
	}
	if gone {
		log.Warn("endpoint answered its recovery probe 410 Gone: disabled for good, no more probes")
	} else {
		log.Info("recovery probe failed; the endpoint stays disabled", "err", err)
	}
	return false
}

// send makes one probe request: opened, signed and sent as a delivery
// is (webhook.go, signature.go), with the endpoint's custom headers and
// timeout, through the deliveries' client (safehttp.go). A non-2xx
// answer is an error that names it, with the status.
func (p *prober) send(ctx context.Context, pr claimedProbe) (int, error) {
	keys, custom, err := openRequest(p.box, pr.endpointID, pr.secrets, pr.publicKeys, pr.request)
	if err != nil {
		return 0, fmt.Errorf("%w; not sent", err)
	}
	client := p.client
	if p.endpointTLS != nil {
		if client, err = p.endpointTLS.client(ctx, pr.endpointID); err != nil {
			return 0, fmt.Errorf("probe: %w; not sent", err)
		}
	}
	ans, err := signedRequest{url: pr.url, keys: keys, custom: custom, msgID: probeID(pr.endpointID, pr.at),
		body: encodeProbeBody(pr.endpointID, pr.at), userAgent: p.userAgent}.send(ctx, pr.request.client(client))
	if err != nil {
		return 0, fmt.Errorf("probe: %w", err)
	}
	if ans.status >= 200 && ans.status <= 299 {
		return ans.status, nil
	}
	err = fmt.Errorf("probe: answered %d %s", ans.status, http.StatusText(ans.status))
	if excerpt := truncate(ans.excerpt, webhookErrorExcerptLen); excerpt != "" {
		err = fmt.Errorf("%w: %q", err, excerpt)
	}
	return ans.status, err
}

// probeFailedSQL writes a failed probe's error to the endpoint it was
// claimed for, if it is still disabled by the same failure. A 410 makes
// the receiver's word the cause, which ends the probes.
const probeFailedSQL = `
UPDATE outbox.endpoints
SET last_probe_error = $3,
    disabled_cause = CASE WHEN $4 THEN 'gone' ELSE disabled_cause END,
    disabled_reason = CASE WHEN $4 THEN '` + endpointGoneReason + `' ELSE disabled_reason END
WHERE id = $1
  AND disabled_at = $2
  AND disabled_cause = 'failure'`

func (p *prober) recordFailure(ctx context.Context, pr claimedProbe, probeErr error, gone bool) error {
	if _, err := p.db.ExecContext(ctx, probeFailedSQL, pr.endpointID, pr.disabledAt, truncate(probeErr.Error(), maxErrorLen), gone); err != nil {
		return fmt.Errorf("record probe of endpoint %d: %w", pr.endpointID, err)
	}
	return nil
}

// recoverEndpointSQL re-enables an endpoint as enableEndpointSQL does,
// with a clean slate, if it is still disabled by the failure the probe was
// claimed for and still wants probes (an operator may have acted since).
// updated_at is the API's: a recovery has recovered_at.
const recoverEndpointSQL = `
UPDATE outbox.endpoints
SET disabled_at = NULL,
    disabled_reason = NULL,
    disabled_cause = NULL,
    failing_since = NULL,
    consecutive_failures = 0,
    breaker_opened_at = NULL,
    last_probe_error = NULL,
    recovered_at = now(),
    recovered_reason = $3,
    recovery_replay_from = $4
WHERE id = $1
  AND disabled_at = $2
  AND disabled_cause = 'failure'
  AND recovery_probes
RETURNING url, owner_email, recovered_at,
          coalesce((SELECT o.key FROM outbox.owners AS o WHERE o.id = owner_id), '')`

// recover re-enables the endpoint that answered pr with status, records
// the owner's event with it, then runs the replay's first pass. It
// reports false, without an error, when the endpoint changed since the
// claim.
func (p *prober) recover(ctx context.Context, pr claimedProbe, status int) (bool, error) {
	from, clampNote := pr.disabledAt, ""
	if oldest, why, bounded := resendCutoff(pr.at, p.eventsRetention, p.maxAttempts, 0); bounded && from.Before(oldest) {
		from, clampNote = oldest, fmt.Sprintf(" (not since it was disabled: %s)", why)
	}
	reason := truncate(fmt.Sprintf("a recovery probe at %s was answered %d %s after %s disabled; replaying the events recorded since %s%s",
		pr.at.UTC().Format(time.RFC3339), status, http.StatusText(status), pr.at.Sub(pr.disabledAt).Round(time.Minute),
		from.UTC().Format(time.RFC3339), clampNote), maxRecoveredReasonLen)

	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("recover endpoint %d: %w", pr.endpointID, err)
	}
	defer tx.Rollback()
	payload := endpointStatePayload{
		EndpointID: pr.endpointID, State: endpointRecovered,
		DisabledAt: &pr.disabledAt, DisabledReason: &pr.disabledReason, RecoveredReason: &reason,
	}
	var ownerKey string // the event's address: the endpoint's owner (outbox.endpoint_state_event)
	err = tx.QueryRowContext(ctx, recoverEndpointSQL, pr.endpointID, pr.disabledAt, reason, from).
		Scan(&payload.URL, &payload.OwnerEmail, &payload.RecoveredAt, &ownerKey)
	if errors.Is(err, sql.ErrNoRows) {
		// Opted out since the claim (an operator's disable or enable
		// ends the failure, and probeFailedSQL then writes nothing).
		return false, p.recordFailure(ctx, pr, fmt.Errorf("answered %d %s; not re-enabled: the endpoint changed since the probe was sent", status, http.StatusText(status)), false)
	}
	if err != nil {
		return false, fmt.Errorf("recover endpoint %d: %w", pr.endpointID, err)
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return false, fmt.Errorf("recover endpoint %d: %w", pr.endpointID, err)
	}
	recovered := eventInput{Topic: endpointRecoveredTopic, Subject: strconv.FormatInt(pr.endpointID, 10), Payload: b, Owner: ownerKey}
	if _, err := recovered.record(ctx, tx); err != nil {
		return false, fmt.Errorf("recover endpoint %d: %w", pr.endpointID, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("recover endpoint %d: %w", pr.endpointID, err)
	}
	log := p.logger.With("endpoint_id", pr.endpointID)
	log.Warn("endpoint re-enabled: it answered a recovery probe", "reason", reason)
	// The last pass (finishReplays) runs whatever happens here.
	if jobs, err := replayBatches(ctx, p.db, pr.endpointID, from, p.maxAttempts, false); err != nil {
		log.Error("recovery replay failed; its last pass runs later", "err", err)
	} else {
		log.Info("recovery replay enqueued what the endpoint missed", "jobs", jobs, "since", from)
	}
	return true, nil
}

// maxRecoveredReasonLen bounds recovered_reason; schema.sql's CHECK
// repeats it.
const maxRecoveredReasonLen = 1000

// dueReplaysSQL lists the recoveries whose replay's last pass is due: $1
// seconds after the re-enable.
const dueReplaysSQL = `
SELECT id, recovery_replay_from, recovered_at
FROM outbox.endpoints
WHERE recovery_replay_from IS NOT NULL
  AND recovered_at <= now() - make_interval(secs => $1)
ORDER BY id`

// replayDoneSQL ends a recovery's replay, unless another recovery began
// since.
const replayDoneSQL = `
UPDATE outbox.endpoints
SET recovery_replay_from = NULL
WHERE id = $1
  AND recovered_at = $2`

// finishReplays runs the last pass of every due recovery replay. Two
// replicas may run one together: the pass enqueues only what has no job,
// so neither adds what the other did.
func (p *prober) finishReplays(ctx context.Context) (int64, error) {
	type due struct {
		id              int64
		from, recovered time.Time
	}
	replays, err := queryAll(ctx, p.db, func(row rowScanner) (due, error) {
		var d due
		return d, row.Scan(&d.id, &d.from, &d.recovered)
	}, dueReplaysSQL, recoveryReplayMargin.Seconds())
	if err != nil {
		return 0, fmt.Errorf("recovery replays: %w", err)
	}
	var total int64
	var errs []error
	for _, d := range replays {
		jobs, err := replayBatches(ctx, p.db, d.id, d.from, p.maxAttempts, false)
		total += jobs
		if err == nil {
			_, err = p.db.ExecContext(ctx, replayDoneSQL, d.id, d.recovered)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("recovery replay of endpoint %d: %w", d.id, err))
			continue
		}
		if jobs > 0 {
			p.logger.Warn("recovery replay's last pass found events the first missed", "endpoint_id", d.id, "jobs", jobs)
		}
	}
	return total, errors.Join(errs...)
}
