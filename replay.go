// replay.go: sending an endpoint the events it has seen (or missed) again,
// from a point in time (clamped by resend.go's rule), and an endpoint's
// recent attempts.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ReplayResult says what a replay did, and whether it had to start later
// than asked because older events are gone.
type ReplayResult struct {
	Requested time.Time `json:"requested"`
	From      time.Time `json:"from"`
	Clamped   bool      `json:"clamped"`
	Message   string    `json:"message,omitempty"`
	Jobs      int64     `json:"jobs"`
}

// replaySQL enqueues the endpoint's delivery of up to $4 fanned events with
// ids above $3, recorded at or after $2, that its topics select. The
// (endpoint, event) pair is unique, so a pair that was delivered before is
// reset to run again if $6 says so; one still waiting or running is left
// as it is. The job keeps its attempt count and errors, and gets one more
// attempt if it had used them all. With $6 false only the events the
// endpoint has no job for are enqueued: what it missed, never twice.
const replaySQL = `
WITH endpoint AS (
  SELECT id, topics
  FROM outbox.endpoints
  WHERE id = $1
    AND disabled_at IS NULL
),
candidates AS (
  SELECT e.id
  FROM outbox.events AS e, endpoint
  WHERE e.fanned_out_at IS NOT NULL
    AND e.created_at >= $2
    AND e.id > $3
    AND outbox.topic_matches(endpoint.topics, e.topic)
  ORDER BY e.id
  LIMIT $4
),
enqueued AS (
  INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts)
  SELECT 'webhook', c.id, $1, $5
  FROM candidates AS c
  ON CONFLICT (endpoint_id, event_id) WHERE endpoint_id IS NOT NULL
  DO UPDATE` + retrySetSQL + `
  WHERE outbox.jobs.state IN ('completed', 'discarded')
    AND $6
  RETURNING 1
)
SELECT (SELECT count(*) FROM candidates),
       coalesce((SELECT max(id) FROM candidates), 0),
       (SELECT count(*) FROM enqueued)`

// replayEndpoint replays to endpoint id every event recorded since since,
// clamped by resendCutoff: older events may already be pruned, and a
// receiver's dedup record of them too, and a replay that silently skipped
// some would mislead. Batches run in their own transactions, so a replay
// of a week holds no long lock.
func replayEndpoint(ctx context.Context, db *sql.DB, id int64, since time.Time, retention time.Duration, maxAttempts int) (ReplayResult, error) {
	res := ReplayResult{Requested: since, From: since}
	now, err := databaseNow(ctx, db)
	if err != nil {
		return res, fmt.Errorf("replay endpoint %d: %w", id, err)
	}
	if since.After(now) {
		return res, fmt.Errorf("%w: replay from %s is in the future", errInvalid, since.Format(time.RFC3339))
	}
	ep, err := getEndpoint(ctx, db, id)
	if err != nil {
		return res, err
	}
	if oldest, why, bounded := resendCutoff(now, retention, maxAttempts, ep.dedupWindow()); bounded && since.Before(oldest) {
		res.From, res.Clamped = oldest, true
		res.Message = fmt.Sprintf("replay starts at %s, not %s: %s", oldest.Format(time.RFC3339), since.Format(time.RFC3339), why)
	}
	if ep.State == endpointDisabled {
		return res, fmt.Errorf("%w: endpoint %d is disabled; enable it before replaying", errInvalid, id)
	}
	res.Jobs, err = replayBatches(ctx, db, id, res.From, maxAttempts, true)
	return res, err
}

// replayBatches runs replaySQL from the start over every event recorded
// since from, and wakes the workers. resendDelivered is replaySQL's $6;
// false enqueues only what the endpoint missed (a recovery, probe.go).
func replayBatches(ctx context.Context, db *sql.DB, id int64, from time.Time, maxAttempts int, resendDelivered bool) (int64, error) {
	var after, total int64
	for {
		var candidates, jobs int64
		if err := db.QueryRowContext(ctx, replaySQL, id, from, after, manualBatch, maxAttempts, resendDelivered).Scan(&candidates, &after, &jobs); err != nil {
			return total, fmt.Errorf("replay endpoint %d: %w", id, err)
		}
		total += jobs
		if candidates < manualBatch {
			break
		}
	}
	if err := notify(ctx, db, jobsChannel); err != nil {
		return total, fmt.Errorf("replay endpoint %d: %w", id, err)
	}
	return total, nil
}

// DeliveryView is one attempt as the panel shows it.
type DeliveryView struct {
	JobID      int64     `json:"job_id"`
	EventID    int64     `json:"event_id"`
	Attempt    int       `json:"attempt"`
	FinishedAt time.Time `json:"finished_at"`
	DurationMS int       `json:"duration_ms"`
	StatusCode *int      `json:"status_code"`
	Error      string    `json:"error"`
	Excerpt    string    `json:"response_excerpt"`
}

// EndpointStats is an endpoint's recent record.
type EndpointStats struct {
	Recent      []DeliveryView `json:"recent"`
	Attempts    int            `json:"attempts"`     // in the last hour
	Successes   int            `json:"successes"`    // 2xx in the last hour
	SuccessRate float64        `json:"success_rate"` // successes/attempts, 0..1
	Discarded   int            `json:"discarded"`    // jobs waiting for a hand
}

const recentDeliveriesSQL = `
SELECT d.job_id, j.event_id, d.attempt, d.finished_at, d.duration_ms,
       d.status_code, d.error, d.response_excerpt
FROM outbox.deliveries AS d
JOIN outbox.jobs AS j ON j.id = d.job_id
WHERE d.endpoint_id = $1
ORDER BY d.finished_at DESC
LIMIT $2`

const endpointRatesSQL = `
SELECT count(*),
       count(*) FILTER (WHERE status_code BETWEEN 200 AND 299),
       (SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'discarded')
FROM outbox.deliveries
WHERE endpoint_id = $1
  AND finished_at > now() - interval '1 hour'`

func scanDeliveryView(row rowScanner) (DeliveryView, error) {
	var d DeliveryView
	err := row.Scan(&d.JobID, &d.EventID, &d.Attempt, &d.FinishedAt, &d.DurationMS, &d.StatusCode, &d.Error, &d.Excerpt)
	return d, err
}

// readEndpointStats reads an endpoint's last n attempts and its success
// rate over the last hour.
func readEndpointStats(ctx context.Context, db *sql.DB, id int64, n int) (EndpointStats, error) {
	var st EndpointStats
	recent, err := queryAll(ctx, db, scanDeliveryView, recentDeliveriesSQL, id, n)
	if err != nil {
		return st, fmt.Errorf("endpoint %d deliveries: %w", id, err)
	}
	st.Recent = recent
	err = db.QueryRowContext(ctx, endpointRatesSQL, id).Scan(&st.Attempts, &st.Successes, &st.Discarded)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("endpoint %d rates: %w", id, err)
	}
	if st.Attempts > 0 {
		st.SuccessRate = float64(st.Successes) / float64(st.Attempts)
	}
	return st, nil
}
