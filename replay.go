// replay.go: sending an endpoint the events it has seen (or missed) again,
// over a window of time (its start clamped by resend.go's rule) and
// optionally a narrower set of topics; the dry run that says what such a
// replay would send without enqueuing it; and an endpoint's recent
// attempts.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/lib/pq"
)

// ReplayRequest is a replay as an operator asks for it, through the API
// or the panel's form.
type ReplayRequest struct {
	Since time.Time // required: events recorded at or after it
	// Until, if set, ends the window: events recorded before it. Zero, or
	// a time still to come, means now: a replay resends what was recorded
	// before it started; what is recorded while it runs is delivered live.
	Until time.Time
	// Topics narrows the endpoint's topics: an event is replayed only if
	// the endpoint's patterns and these both select it. Empty: the
	// endpoint's alone.
	Topics []string
}

// validate refuses what no replay could mean, before any database work.
func (q ReplayRequest) validate() error {
	if q.Since.IsZero() {
		return fmt.Errorf(`%w: "since" (an RFC 3339 time) is required`, errInvalid)
	}
	if !q.Until.IsZero() && !q.Until.After(q.Since) {
		return fmt.Errorf(`%w: "until" (%s) must be after "since" (%s)`, errInvalid, q.Until.Format(time.RFC3339Nano), q.Since.Format(time.RFC3339Nano))
	}
	if len(q.Topics) > maxEndpointTopics {
		return fmt.Errorf(`%w: "topics" has %d patterns, at most %d`, errInvalid, len(q.Topics), maxEndpointTopics)
	}
	for _, p := range q.Topics {
		if err := topicPatternValid(p); err != nil {
			return fmt.Errorf(`%w (in "topics")`, err)
		}
	}
	return nil
}

// parseReplayTime reads the API's "since" or "until" (name), an RFC 3339
// time, saying which one is wrong.
func parseReplayTime(name, s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q is %q, not an RFC 3339 time such as 2026-05-01T00:00:00Z", errInvalid, name, s)
	}
	return t, nil
}

// ReplayWindow is the events a replay covers: those recorded in [From,
// To). From is Requested unless the dedup rule clamped it (Clamped, with
// Message saying why); To is the request's until, or the time the replay
// (or its dry run) started.
type ReplayWindow struct {
	Requested time.Time `json:"requested"`
	From      time.Time `json:"from"`
	To        time.Time `json:"to"`
	Clamped   bool      `json:"clamped"`
	Message   string    `json:"message,omitempty"`
}

// ReplayResult says what a replay did: its window, and the jobs it
// enqueued (new ones, and finished ones set to run again).
type ReplayResult struct {
	ReplayWindow
	Jobs int64 `json:"jobs"`
}

// ReplayPreview is a dry run's answer: what a replay with the same
// request would do now. Events is the number of jobs it would enqueue
// (its ReplayResult.Jobs), not of events in the window: an event whose
// delivery to the endpoint still waits or runs is left to it and not
// counted. ByTopic splits Events by topic; EstimatedSeconds is
// estimateReplaySeconds'.
type ReplayPreview struct {
	ReplayWindow
	Events           int64            `json:"events"`
	ByTopic          map[string]int64 `json:"by_topic"`
	EstimatedSeconds int64            `json:"estimated_seconds"`
}

// replayRange is the events one replay pass selects, beside the
// endpoint's topics: recorded in [from, until) (until zero: no end) and
// selected by topics (empty: all the endpoint takes).
type replayRange struct {
	from, until time.Time
	topics      []string
}

// args are replayCandidatesSQL's $5 and $6.
func (r replayRange) args() (sql.NullTime, any) {
	topics := r.topics
	if topics == nil {
		topics = []string{}
	}
	return sql.NullTime{Time: r.until, Valid: !r.until.IsZero()}, pq.Array(topics)
}

// replayCandidatesSQL is one batch of a replay: up to $4 fanned-out events
// with ids above $3, recorded at or after $2 and before $5 (NULL: no end),
// that the endpoint's topics select and, unless $6 is empty, the
// replay's topics too. replaySQL enqueues them and replayCountSQL counts
// them, so a dry run counts what the replay enqueues
// (TestReplayDryRunCountsWhatTheReplayEnqueues).
const replayCandidatesSQL = `
WITH endpoint AS (
  SELECT id, topics, ordering
  FROM outbox.endpoints
  WHERE id = $1
    AND disabled_at IS NULL
),
candidates AS (
  SELECT e.id, e.topic, e.subject, endpoint.ordering
  FROM outbox.events AS e, endpoint
  WHERE e.fanned_out_at IS NOT NULL
    AND e.created_at >= $2
    AND ($5::timestamptz IS NULL OR e.created_at < $5)
    AND e.id > $3
    AND outbox.topic_matches(endpoint.topics, e.topic)
    AND (cardinality($6::text[]) = 0 OR outbox.topic_matches($6, e.topic))
  ORDER BY e.id
  LIMIT $4
)`

// replayRerunStatesSQL are the states of an endpoint's job that a replay
// sets to run again; a job in any other state (waiting, running) is left
// as it is, and the replay adds nothing for its event. replaySQL and
// replayCountSQL share it.
const replayRerunStatesSQL = `('completed', 'discarded')`

// replaySQL enqueues the endpoint's delivery of replayCandidatesSQL's
// events. The (endpoint, event) pair is unique, so a pair that was
// delivered before is reset to run again if $8 says so; one still waiting
// or running is left as it is. The job keeps its attempt count and
// errors, and gets one more attempt if it had used them all; $7 is a new
// job's attempts. With $8 false only the events the endpoint has no job
// for are enqueued: what it missed, never twice.
const replaySQL = replayCandidatesSQL + `,
enqueued AS (
  INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at, lane_key)
  SELECT 'webhook', c.id, $1, $7,
         CASE WHEN c.ordering = 'subject' THEN 'infinity'::timestamptz ELSE now() END,
         CASE WHEN c.ordering = 'subject' THEN c.subject END
  FROM candidates AS c
  ON CONFLICT (endpoint_id, event_id) WHERE endpoint_id IS NOT NULL
  DO UPDATE` + retrySetSQL + `
  WHERE outbox.jobs.state IN ` + replayRerunStatesSQL + `
    AND $8
  RETURNING endpoint_id, lane_key
),
lanes AS (
  SELECT DISTINCT endpoint_id, lane_key FROM enqueued WHERE lane_key IS NOT NULL
)
SELECT (SELECT count(*) FROM candidates),
       coalesce((SELECT max(id) FROM candidates), 0),
       (SELECT count(*) FROM enqueued),
       (SELECT coalesce(array_agg(endpoint_id ORDER BY lane_key), '{}') FROM lanes),
       (SELECT coalesce(array_agg(lane_key ORDER BY lane_key), '{}') FROM lanes)`

// replayCountSQL is replaySQL with $8 true, counting instead of writing:
// of the same candidates, those it would enqueue (the endpoint has no job
// for the event, or a finished one), by topic.
const replayCountSQL = replayCandidatesSQL + `,
enqueued AS (
  SELECT c.topic
  FROM candidates AS c
  WHERE NOT EXISTS (
    SELECT 1
    FROM outbox.jobs AS j
    WHERE j.endpoint_id = $1
      AND j.event_id = c.id
      AND j.state NOT IN ` + replayRerunStatesSQL + `
  )
)
SELECT (SELECT count(*) FROM candidates),
       coalesce((SELECT max(id) FROM candidates), 0),
       coalesce((SELECT json_object_agg(topic, n)
                 FROM (SELECT topic, count(*) AS n FROM enqueued GROUP BY topic) AS t), '{}')`

// planReplay is what a replay and its dry run share: the request checked,
// and its window. The start is clamped by resendCutoff: older events may
// already be pruned, and a receiver's dedup record of them too, and a
// replay that silently skipped some would mislead. A disabled endpoint
// refuses both.
func planReplay(ctx context.Context, db *sql.DB, id int64, req ReplayRequest, retention time.Duration, maxAttempts int) (ReplayWindow, Endpoint, error) {
	w := ReplayWindow{Requested: req.Since, From: req.Since}
	if err := req.validate(); err != nil {
		return w, Endpoint{}, err
	}
	now, err := databaseNow(ctx, db)
	if err != nil {
		return w, Endpoint{}, fmt.Errorf("replay endpoint %d: %w", id, err)
	}
	if req.Since.After(now) {
		return w, Endpoint{}, fmt.Errorf("%w: replay from %s is in the future", errInvalid, req.Since.Format(time.RFC3339))
	}
	w.To = now
	if !req.Until.IsZero() && req.Until.Before(now) {
		w.To = req.Until
	}
	ep, err := getEndpoint(ctx, db, id)
	if err != nil {
		return w, ep, err
	}
	if oldest, why, bounded := resendCutoff(now, retention, maxAttempts, ep.dedupWindow()); bounded && req.Since.Before(oldest) {
		w.From, w.Clamped = oldest, true
		w.Message = fmt.Sprintf("replay starts at %s, not %s: %s", oldest.Format(time.RFC3339), req.Since.Format(time.RFC3339), why)
		if !w.From.Before(w.To) {
			w.Message += fmt.Sprintf("; that is not before its end, %s, so nothing is replayed", w.To.Format(time.RFC3339))
		}
	}
	if ep.State == endpointDisabled {
		return w, ep, fmt.Errorf("%w: endpoint %d is disabled; enable it before replaying", errInvalid, id)
	}
	return w, ep, nil
}

// replayEndpoint replays to endpoint id the events req selects, in
// batches of their own transactions, so a replay of a week holds no long
// lock.
func replayEndpoint(ctx context.Context, db *sql.DB, id int64, req ReplayRequest, retention time.Duration, maxAttempts int) (ReplayResult, error) {
	w, _, err := planReplay(ctx, db, id, req, retention, maxAttempts)
	res := ReplayResult{ReplayWindow: w}
	if err != nil {
		return res, err
	}
	res.Jobs, err = enqueueReplay(ctx, db, id, replayRange{from: w.From, until: w.To, topics: req.Topics}, maxAttempts, true)
	return res, err
}

// previewReplay is replayEndpoint's dry run: the same window, counted by
// countReplay, enqueuing nothing, with an estimate of how long sending it
// would take.
func previewReplay(ctx context.Context, db *sql.DB, id int64, req ReplayRequest, retention time.Duration, maxAttempts int) (ReplayPreview, error) {
	w, ep, err := planReplay(ctx, db, id, req, retention, maxAttempts)
	pv := ReplayPreview{ReplayWindow: w, ByTopic: map[string]int64{}}
	if err != nil {
		return pv, err
	}
	pv.ByTopic, err = countReplay(ctx, db, id, replayRange{from: w.From, until: w.To, topics: req.Topics})
	if err != nil {
		return pv, err
	}
	for _, n := range pv.ByTopic {
		pv.Events += n
	}
	var attempts int64
	var meanMS float64
	if err := db.QueryRowContext(ctx, endpointPaceSQL, id).Scan(&attempts, &meanMS); err != nil {
		return pv, fmt.Errorf("dry run of replay to endpoint %d: its pace: %w", id, err)
	}
	pv.EstimatedSeconds = estimateReplaySeconds(pv.Events, ep.MaxInFlight, ep.RateLimitPerSecond, attempts, meanMS)
	return pv, nil
}

// countReplay runs replayCountSQL over r from its start, batch by batch
// as enqueueReplay does, and adds up the jobs the replay would enqueue,
// by topic.
func countReplay(ctx context.Context, db *sql.DB, id int64, r replayRange) (map[string]int64, error) {
	until, topics := r.args()
	byTopic := map[string]int64{}
	var after int64
	for {
		var candidates int64
		var counts []byte
		if err := db.QueryRowContext(ctx, replayCountSQL, id, r.from, after, manualBatch, until, topics).Scan(&candidates, &after, &counts); err != nil {
			return byTopic, fmt.Errorf("dry run of replay to endpoint %d: %w", id, err)
		}
		var batch map[string]int64
		if err := json.Unmarshal(counts, &batch); err != nil {
			return byTopic, fmt.Errorf("dry run of replay to endpoint %d: its counts by topic: %w", id, err)
		}
		for topic, n := range batch {
			byTopic[topic] += n
		}
		if candidates < manualBatch {
			return byTopic, nil
		}
	}
}

// replayDefaultRate is the rate, in events a second, that a dry run's
// estimate assumes for an endpoint with no attempt in the last hour.
const replayDefaultRate = 10.0

// endpointPaceSQL is the endpoint's attempts that finished in the last
// hour, and their mean duration in milliseconds (0 without any).
const endpointPaceSQL = `
SELECT count(*), coalesce(avg(duration_ms), 0)::float8
FROM outbox.deliveries
WHERE endpoint_id = $1
  AND finished_at > now() - interval '1 hour'`

// estimateReplaySeconds is how long sending events once each should take,
// rounded up to a second. A replay is a backlog, and a backlog drains at
// the endpoint's capacity, not at the pace of its recent traffic: its cap
// on deliveries at once (maxInFlight) over the mean duration of its
// attempts in the last hour (meanMS of attempts), or replayDefaultRate
// without any; and never faster than its rate limit. It assumes the
// receiver keeps answering as fast and as well, and workers to spare: it
// counts no retries, no live traffic beside the replay, no pause.
func estimateReplaySeconds(events int64, maxInFlight int, rateLimit *float64, attempts int64, meanMS float64) int64 {
	if events <= 0 {
		return 0
	}
	rate := replayDefaultRate
	if attempts > 0 {
		rate = float64(max(maxInFlight, 1)) * 1000 / max(meanMS, 1)
	}
	if rateLimit != nil && *rateLimit > 0 && *rateLimit < rate {
		rate = *rateLimit
	}
	return int64(math.Ceil(float64(events) / rate))
}

// replayBatches runs replaySQL over every event recorded since from (no
// end, every topic the endpoint takes) and wakes the workers: a
// recovery's replay (probe.go), whose last pass must also see events
// fanned out after it began. resendDelivered is replaySQL's $8; false
// enqueues only what the endpoint missed.
func replayBatches(ctx context.Context, db *sql.DB, id int64, from time.Time, maxAttempts int, resendDelivered bool) (int64, error) {
	return enqueueReplay(ctx, db, id, replayRange{from: from}, maxAttempts, resendDelivered)
}

// enqueueReplay runs replaySQL over r from its start, batch by batch, and
// wakes the workers.
func enqueueReplay(ctx context.Context, db *sql.DB, id int64, r replayRange, maxAttempts int, resendDelivered bool) (int64, error) {
	until, topics := r.args()
	var after, total int64
	for {
		candidates, jobs, err := replayBatch(ctx, db, id, r, &after, until, topics, maxAttempts, resendDelivered)
		if err != nil {
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

// replayBatch runs one batch of replaySQL after event *after, moving it
// on, and advances the ordered lanes the batch's deliveries joined (held,
// as fan-out holds them), in one transaction.
func replayBatch(ctx context.Context, db *sql.DB, id int64, r replayRange, after *int64, until, topics any, maxAttempts int, resendDelivered bool) (candidates, jobs int64, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback()
	var lanes laneKeys
	if err := tx.QueryRowContext(ctx, replaySQL, id, r.from, *after, manualBatch, until, topics, maxAttempts, resendDelivered).Scan(
		&candidates, after, &jobs, pq.Array(&lanes.endpointIDs), pq.Array(&lanes.keys)); err != nil {
		return 0, 0, err
	}
	if err := advanceLanes(ctx, tx, lanes); err != nil {
		return 0, 0, err
	}
	return candidates, jobs, tx.Commit()
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
