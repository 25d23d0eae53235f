// replay.go: sending an endpoint the events it has seen (or missed) again,
// over a window of time (its start clamped by resend.go's rule) and
// optionally a narrower set of topics; the dry run that says what such a
// replay would send without enqueuing it; the record of each replay
// (outbox.replays), whose jobs run in the endpoint's replay lane, with
// its progress and its cancel; and an endpoint's recent attempts.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

// ReplayResult says what a replay does: its window, the jobs it enqueues
// (new ones, and finished ones set to run again; replayEndpoint says how
// they are counted), and its id, under which GET
// /api/endpoints/{id}/replays shows its progress.
type ReplayResult struct {
	ReplayWindow
	Jobs     int64 `json:"jobs"`
	ReplayID int64 `json:"replay_id"`
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
// endpoint's topics: recorded in [from, until) (until zero: no end),
// selected by topics (empty: all the endpoint takes), and with ids up to
// through (NULL: no end), the last event a replay's count found.
type replayRange struct {
	from, until time.Time
	topics      []string
	through     sql.NullInt64
}

// args are replayCandidatesSQL's $5, $6 and $7.
func (r replayRange) args() (until sql.NullTime, topics any, through sql.NullInt64) {
	patterns := r.topics
	if patterns == nil {
		patterns = []string{}
	}
	return sql.NullTime{Time: r.until, Valid: !r.until.IsZero()}, pq.Array(patterns), r.through
}

// replayCandidatesSQL is one batch of a replay: up to $4 fanned-out events,
// not erased (erasure.go) nor a test send's (topics.go), with ids above $3 and up to $7 (NULL: no end), recorded at or after $2
// and before $5 (NULL: no end), that the endpoint's topics select and,
// unless $6 is empty, the replay's topics too, and whose payload the
// endpoint's filter passes, as the fan-out tests it (outbox.fan_out,
// silent: unknown is no match; a filter held after an error passes
// nothing), within the tenancy boundary the fan-out keeps
// (outbox.owner_admits): an owner's endpoint replays its owner's events
// and nobody else's, whatever its topics; the filter and the owner's
// grants are as each batch reads them. replaySQL enqueues them and replayCountSQL counts
// them, so a dry run counts what the replay enqueues
// (TestReplayDryRunCountsWhatTheReplayEnqueues). Both lists of patterns
// are split once, in the statement's one-row CTEs, and tested against
// each event with topic_selected (schema.sql), which the planner
// inlines: the walk passes every event of the window, of every topic.
const replayCandidatesSQL = `
WITH endpoint AS (
  SELECT ep.id, ep.ordering, ep.filter_path, ep.filter_error_at, t.names, t.prefixes, t.every_topic,
         o.key AS owner_key, o.allowed_topics, o.shared_topics
  FROM outbox.endpoints AS ep
  CROSS JOIN LATERAL outbox.topic_split(ep.topics) AS t
  LEFT JOIN outbox.owners AS o ON o.id = ep.owner_id
  WHERE ep.id = $1
    AND ep.disabled_at IS NULL
),
narrowed AS (
  SELECT cardinality($6::text[]) = 0 AS by_endpoint_alone, t.names, t.prefixes, t.every_topic
  FROM outbox.topic_split($6) AS t
),
candidates AS (
  SELECT e.id, e.topic, e.subject, endpoint.ordering
  FROM outbox.events AS e, endpoint, narrowed
  WHERE e.fanned_out_at IS NOT NULL
    AND e.erased_at IS NULL
    AND e.test IS NOT TRUE
    AND e.created_at >= $2
    AND ($5::timestamptz IS NULL OR e.created_at < $5)
    AND e.id > $3
    AND ($7::bigint IS NULL OR e.id <= $7)
    AND outbox.topic_selected(e.topic, endpoint.names, endpoint.prefixes, endpoint.every_topic)
    AND (narrowed.by_endpoint_alone OR outbox.topic_selected(e.topic, narrowed.names, narrowed.prefixes, narrowed.every_topic))
    AND outbox.owner_admits(e.owner, e.topic, endpoint.owner_key, endpoint.allowed_topics, endpoint.shared_topics)
    AND (endpoint.filter_path IS NULL
         OR (endpoint.filter_error_at IS NULL AND jsonb_path_match(e.payload, endpoint.filter_path, silent => true)))
  ORDER BY e.id
  LIMIT $4
)`

// replayRerunStatesSQL are the states of an endpoint's job that a replay
// sets to run again; a job in any other state (waiting, running) is left
// as it is, and the replay adds nothing for its event. replaySQL and
// replayCountSQL share it.
const replayRerunStatesSQL = `('completed', 'discarded')`

// replaySQL enqueues the endpoint's delivery of replayCandidatesSQL's
// events. The (endpoint, event) pair is unique, so a pair whose job was
// discarded is run again if $9 says so (schema.sql, outbox.run_again);
// one still waiting or running is left as it is. The job keeps its
// attempt count and errors, and gets one more attempt if it had used them
// all; $8 is a new job's attempts. A delivered pair has no job (it left the queue), and gets a
// new one if $9 says so. With $9 false only the events the endpoint has
// neither a job nor a delivery for are enqueued: what it missed, never
// twice. Every job it enqueues
// joins replay $10 (NULL: none, a live delivery).
const replaySQL = replayCandidatesSQL + `,
inserted AS (
  INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at, lane_key, replay_id)
  SELECT 'webhook', c.id, $1, $8,
         CASE WHEN c.ordering = 'subject' THEN 'infinity'::timestamptz ELSE now() END,
         CASE WHEN c.ordering = 'subject' THEN c.subject END,
         $10
  FROM candidates AS c
  WHERE $9 OR NOT EXISTS (SELECT 1 FROM outbox.deliveries AS d
                          WHERE d.event_id = c.id AND d.endpoint_id = $1 AND d.outcome = 'completed')
  ON CONFLICT (endpoint_id, event_id) WHERE endpoint_id IS NOT NULL DO NOTHING
  RETURNING endpoint_id, lane_key
),
reran AS (
  SELECT r.endpoint_id, r.lane_key
  FROM outbox.run_again(ARRAY(SELECT j.id
                              FROM candidates AS c
                              JOIN outbox.jobs AS j ON j.endpoint_id = $1 AND j.event_id = c.id
                              WHERE $9 AND j.state IN ` + replayRerunStatesSQL + `
                              ORDER BY j.id
                              FOR UPDATE OF j), $10) AS r
),
enqueued AS (
  SELECT * FROM inserted UNION ALL SELECT * FROM reran
),
lanes AS (
  SELECT DISTINCT endpoint_id, lane_key FROM enqueued WHERE lane_key IS NOT NULL
)
SELECT (SELECT count(*) FROM candidates),
       coalesce((SELECT max(id) FROM candidates), 0),
       (SELECT count(*) FROM enqueued),
       (SELECT coalesce(array_agg(endpoint_id ORDER BY lane_key), '{}') FROM lanes),
       (SELECT coalesce(array_agg(lane_key ORDER BY lane_key), '{}') FROM lanes)`

// replayCountSQL is replaySQL with $9 true, counting instead of writing:
// of the same candidates, those it would enqueue (the endpoint has no job
// for the event, or a finished one), by topic; and the first and last
// candidate.
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
       coalesce((SELECT min(id) FROM candidates), 0),
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
	if o := principalIn(ctx).owner; o != nil && o.MaxReplayWindowSeconds != nil {
		// The owner's own bound (owners.go), after the dedup rule's: the
		// later start wins.
		oldest := now.Add(-time.Duration(*o.MaxReplayWindowSeconds) * time.Second)
		if w.From.Before(oldest) {
			w.From, w.Clamped = oldest, true
			w.Message = fmt.Sprintf("replay starts at %s, not %s: an owner's replays reach back %s at most",
				oldest.Format(time.RFC3339), req.Since.Format(time.RFC3339), time.Duration(*o.MaxReplayWindowSeconds)*time.Second)
		}
	}
	if ep.State == endpointDisabled {
		return w, ep, fmt.Errorf("%w: endpoint %d is disabled; enable it before replaying", errInvalid, id)
	}
	if ep.FilterError != nil {
		return w, ep, fmt.Errorf("%w: endpoint %d's filter is held after an error (%s); write its filter again before replaying", errInvalid, id, *ep.FilterError)
	}
	return w, ep, nil
}

// replayEndpoint replays to endpoint id the events req selects. Its jobs
// join a replay of their own (outbox.replays), which runs in the
// endpoint's replay lane. It counts them first, as its dry run does,
// and enqueues only the first batch (replayFeedBatch events); the
// feeder enqueues the others as the lane drains (feedReplays). Its
// answer's Jobs is that count, or, when one batch held them all, the
// jobs it enqueued.
func replayEndpoint(ctx context.Context, db *sql.DB, id int64, req ReplayRequest, retention time.Duration, maxAttempts int) (ReplayResult, error) {
	w, _, err := planReplay(ctx, db, id, req, retention, maxAttempts)
	res := ReplayResult{ReplayWindow: w}
	if err != nil {
		return res, err
	}
	counted, err := countReplay(ctx, db, id, replayRange{from: w.From, until: w.To, topics: req.Topics})
	if err != nil {
		return res, fmt.Errorf("replay endpoint %d: %w", id, err)
	}
	res.ReplayID, err = createReplay(ctx, db, id, replayKindReplay, &w, req.Topics)
	if err != nil {
		return res, err
	}
	// Only now may the workers feed it: a batch fed before the count was
	// written would be counted twice. Its enqueue walks from the first
	// event the count found to the last, not from the table's start to
	// its end: an event fanned out after the count is left to its live
	// delivery.
	if _, err := db.ExecContext(ctx, `UPDATE outbox.replays SET jobs_total = $2, enqueue_after = $3, last_event_id = $4 WHERE id = $1`,
		res.ReplayID, counted.jobs(), max(counted.first-1, 0), counted.last); err != nil {
		return res, fmt.Errorf("replay %d: write its count: %w", res.ReplayID, err)
	}
	if err := feedReplay(ctx, db, res.ReplayID, maxAttempts); err != nil {
		return res, err
	}
	if err := notify(ctx, db, jobsChannel); err != nil {
		return res, fmt.Errorf("replay endpoint %d: %w", id, err)
	}
	if err := db.QueryRowContext(ctx, `SELECT jobs_total FROM outbox.replays WHERE id = $1`, res.ReplayID).Scan(&res.Jobs); err != nil {
		return res, fmt.Errorf("replay %d: read its total: %w", res.ReplayID, err)
	}
	return res, nil
}

// replayFeedBatch is how many events one batch of a replay's enqueue
// covers, and how few of its jobs may wait before the workers enqueue
// the next batch: at most twice as many wait at once. Enqueued all at
// its start, a replay of 100,000 events would insert them in its first
// half minute, the worst minute of live latency beside it; a batch at a
// time, its inserts are spread over its run.
const replayFeedBatch = 500

// replayFeedInterval is how often the feeder looks for a replay whose
// lane is running short (feedReplays): a few times within the time a lane
// takes to drain a batch, so that it never runs dry between looks.
const replayFeedInterval = 250 * time.Millisecond

// replayFeeder enqueues the next batch of every replay whose lane runs
// short (feedReplays), every replayFeedInterval, until ctx ends.
type replayFeeder struct {
	db          *sql.DB
	maxAttempts int
	logger      *slog.Logger
}

func newReplayFeeder(db *sql.DB, maxAttempts int, logger *slog.Logger) *replayFeeder {
	return &replayFeeder{db: db, maxAttempts: maxAttempts, logger: logger.With("loop", "replay-feeder")}
}

// Run feeds the replays until ctx ends.
func (f *replayFeeder) Run(ctx context.Context) error {
	tick := time.NewTicker(replayFeedInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if err := feedReplays(ctx, f.db, f.maxAttempts); err != nil && ctx.Err() == nil {
			f.logger.Error("enqueue replays failed", "err", err)
		}
	}
}

// replaysToFeedSQL is the replays still being enqueued of which fewer
// than $1 jobs wait.
const replaysToFeedSQL = `
SELECT r.id
FROM outbox.replays AS r
WHERE r.enqueued_at IS NULL
  AND r.enqueue_after IS NOT NULL
  AND (SELECT count(*)
       FROM (SELECT 1
             FROM outbox.jobs AS j
             WHERE j.replay_id = r.id
               AND j.state IN ('available', 'retryable')
             LIMIT $1) AS waiting) < $1
ORDER BY r.id`

// feedReplays enqueues the next batch of every replay whose lane is
// running short. The replay feeder runs it every replayFeedInterval.
func feedReplays(ctx context.Context, db *sql.DB, maxAttempts int) error {
	ids, err := queryAll(ctx, db, scanID, replaysToFeedSQL, replayFeedBatch)
	if err != nil {
		return fmt.Errorf("replays to enqueue: %w", err)
	}
	for _, id := range ids {
		if err := feedReplay(ctx, db, id, maxAttempts); err != nil {
			return err
		}
	}
	return nil
}

// lockFeedSQL locks replay $1 for a batch of its enqueue, and reads where
// the batch starts and where the enqueue ends, unless it is enqueued (or
// cancelled, which ends its enqueue) or another transaction holds it: a
// replica feeding it, or a cancel. The lock orders batches and the
// cancel, as joinReplay does.
const lockFeedSQL = `
SELECT endpoint_id, window_from, window_to, coalesce(topics, '{}'), enqueue_after, last_event_id
FROM outbox.replays
WHERE id = $1
  AND enqueued_at IS NULL
  AND enqueue_after IS NOT NULL
FOR NO KEY UPDATE SKIP LOCKED`

// fedSQL moves replay $1's cursor to $2 past a batch of $3 jobs; $4 says
// the batch was its last, which ends its enqueue and sets its total to
// what it enqueued.
const fedSQL = `
UPDATE outbox.replays
SET enqueue_after = greatest(enqueue_after, $2),
    jobs_enqueued = jobs_enqueued + $3,
    jobs_total = CASE WHEN $4 THEN jobs_enqueued + $3
                      ELSE greatest(jobs_total, jobs_enqueued + $3) END,
    enqueued_at = CASE WHEN $4 THEN now() END
WHERE id = $1`

// feedReplay enqueues the next batch of replay id, in one transaction,
// unless it is enqueued, cancelled, or being fed elsewhere.
func feedReplay(ctx context.Context, db *sql.DB, id int64, maxAttempts int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("enqueue replay %d: %w", id, err)
	}
	defer tx.Rollback()
	if err := feedReplayTx(ctx, tx, id, maxAttempts); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("enqueue replay %d: %w", id, err)
	}
	return nil
}

// feedReplayTx is feedReplay's work in tx. It locks outbox.events first
// (lockEventsFirst): the replay's row is locked, and the batch's
// statement reads the endpoint, before the events.
func feedReplayTx(ctx context.Context, tx *sql.Tx, id int64, maxAttempts int) error {
	if err := lockEventsFirst(ctx, tx); err != nil {
		return fmt.Errorf("enqueue replay %d: %w", id, err)
	}
	var endpointID, after int64
	var r replayRange
	var topics []string
	err := tx.QueryRowContext(ctx, lockFeedSQL, id).Scan(&endpointID, &r.from, &r.until, pq.Array(&topics), &after, &r.through)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("enqueue replay %d: %w", id, err)
	}
	r.topics = topics
	candidates, jobs, err := replayBatchTx(ctx, tx, endpointID, id, r, &after, replayFeedBatch, maxAttempts, true)
	if err != nil {
		return fmt.Errorf("enqueue replay %d: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, fedSQL, id, after, jobs, candidates < replayFeedBatch); err != nil {
		return fmt.Errorf("enqueue replay %d: move its cursor: %w", id, err)
	}
	return nil
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
	counted, err := countReplay(ctx, db, id, replayRange{from: w.From, until: w.To, topics: req.Topics})
	if err != nil {
		return pv, err
	}
	pv.ByTopic, pv.Events = counted.byTopic, counted.jobs()
	var attempts int64
	var slotMS float64
	if err := db.QueryRowContext(ctx, endpointPaceSQL, id, paceSample).Scan(&attempts, &slotMS); err != nil {
		return pv, fmt.Errorf("dry run of replay to endpoint %d: its pace: %w", id, err)
	}
	var liveFlows bool
	if err := db.QueryRowContext(ctx, `SELECT outbox.live_flows($1)`, id).Scan(&liveFlows); err != nil {
		return pv, fmt.Errorf("dry run of replay to endpoint %d: its lane's width: %w", id, err)
	}
	pv.EstimatedSeconds = estimateReplaySeconds(pv.Events, ep.MaxInFlight, liveFlows, ep.RateLimitPerSecond, attempts, slotMS)
	return pv, nil
}

// replayShare is how many of an endpoint's deliveries its replay lane
// runs at once while no live ones flow: a quarter of its cap, at least 1.
// schema.sql's outbox.replay_share, which the claim enforces, is the same
// rule; outbox.replay_width narrows the lane to 1 while live deliveries
// flow.
func replayShare(maxInFlight int) int {
	return max(1, maxInFlight/4)
}

// replayCount is what countReplay found: the jobs a replay would
// enqueue, by topic, and the first and last event it selects (0 if none),
// between which its enqueue walks.
type replayCount struct {
	byTopic     map[string]int64
	first, last int64
}

// jobs is the jobs of every topic.
func (c replayCount) jobs() int64 {
	var n int64
	for _, jobs := range c.byTopic {
		n += jobs
	}
	return n
}

// countReplay runs replayCountSQL over r from its start, batch by batch
// as feedReplay does, and adds up the jobs the replay would enqueue,
// by topic.
func countReplay(ctx context.Context, db *sql.DB, id int64, r replayRange) (replayCount, error) {
	c := replayCount{byTopic: map[string]int64{}}
	for {
		// A read-only transaction a batch: replayBatchPlanSQL's settings
		// end with it, where a SET would stay on a pooled connection (or
		// on PgBouncer's server connection in transaction mode).
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			return c, fmt.Errorf("dry run of replay to endpoint %d: %w", id, err)
		}
		batch, err := countReplayBatch(ctx, tx, id, r, c.last)
		tx.Rollback() // read only: nothing to commit
		if err != nil {
			return c, fmt.Errorf("dry run of replay to endpoint %d: %w", id, err)
		}
		if c.first == 0 {
			c.first = batch.first
		}
		c.last = max(c.last, batch.last)
		for topic, n := range batch.byTopic {
			c.byTopic[topic] += n
		}
		if batch.candidates < manualBatch {
			return c, nil
		}
	}
}

// replayCountBatch is one batch of replayCountSQL: its candidates, and of
// them the jobs to enqueue by topic and the first and last (0 if none).
type replayCountBatch struct {
	replayCount
	candidates int64
}

// countReplayBatch runs one batch of replayCountSQL after event after,
// in tx, under replayBatchPlanSQL.
func countReplayBatch(ctx context.Context, tx *sql.Tx, id int64, r replayRange, after int64) (replayCountBatch, error) {
	var b replayCountBatch
	if _, err := tx.ExecContext(ctx, replayBatchPlanSQL); err != nil {
		return b, err
	}
	until, topics, through := r.args()
	var counts []byte
	if err := tx.QueryRowContext(ctx, replayCountSQL, id, r.from, after, manualBatch, until, topics, through).Scan(
		&b.candidates, &b.first, &b.last, &counts); err != nil {
		return b, err
	}
	if err := json.Unmarshal(counts, &b.byTopic); err != nil {
		return b, fmt.Errorf("its counts by topic: %w", err)
	}
	return b, nil
}

// replayDefaultRate is the rate, in events a second, that a dry run's
// estimate assumes for an endpoint with no attempt in the last hour.
const replayDefaultRate = 10.0

// endpointPaceSQL is how many of the endpoint's attempts were recorded in
// the last hour (at most the last paceSample), and how long each of them
// held its place under the cap, on average, in milliseconds (0 without
// any): from its claim to the commit that recorded its outcome
// (outbox.deliveries: attempted_at, finished_at). That is the time the
// claim counts it as running, the request and everything around it, of
// which a loopback receiver's request is a small part.
const endpointPaceSQL = `
SELECT count(*), coalesce(avg(greatest(extract(epoch FROM a.finished_at - a.attempted_at) * 1000, 0)), 0)::float8
FROM (
  SELECT finished_at, attempted_at
  FROM outbox.deliveries
  WHERE endpoint_id = $1
    AND finished_at > now() - interval '1 hour'
    AND attempted_at IS NOT NULL
  ORDER BY finished_at DESC
  LIMIT $2
) AS a`

// paceSample bounds the attempts endpointPaceSQL averages, so that a dry
// run reads the same few rows however busy the endpoint was.
const paceSample = 1000

// estimateReplaySeconds is how long sending events once each should take,
// rounded up to a second. A replay is a backlog, and a backlog drains at
// the capacity of the lane it runs in, not at the pace of the endpoint's
// recent traffic: the replay lane's width (replayShare of maxInFlight, or
// 1 while live deliveries flow: schema.sql, outbox.replay_width, as it is
// at the dry run) over how long an attempt holds its place
// (slotMS, endpointPaceSQL's mean over the last hour's attempts), or
// replayDefaultRate without any; and never faster than its rate limit. It
// assumes the receiver keeps answering as fast and as well, and workers to
// spare: it counts no retries, no live traffic taking the replay's room,
// no pause, and not the moment between an outcome's commit and the next
// claim (docs/replays.md: how far it can be off).
func estimateReplaySeconds(events int64, maxInFlight int, liveFlows bool, rateLimit *float64, attempts int64, slotMS float64) int64 {
	if events <= 0 {
		return 0
	}
	width := replayShare(maxInFlight)
	if liveFlows {
		width = 1
	}
	rate := replayDefaultRate
	if attempts > 0 {
		rate = float64(width) * 1000 / max(slotMS, 1)
	}
	if rateLimit != nil && *rateLimit > 0 && *rateLimit < rate {
		rate = *rateLimit
	}
	return int64(math.Ceil(float64(events) / rate))
}

// replayBatches runs replaySQL over every event recorded since from (no
// end, every topic the endpoint takes), batch by batch in transactions
// of their own, and wakes the workers: a recovery's replay (probe.go),
// whose last pass must also see events fanned out after it began. Its
// jobs are live deliveries, of no replay. resendDelivered is replaySQL's
// $8; false enqueues only what the endpoint missed.
func replayBatches(ctx context.Context, db *sql.DB, id int64, from time.Time, maxAttempts int, resendDelivered bool) (int64, error) {
	r := replayRange{from: from}
	var after, total int64
	for {
		candidates, jobs, err := replayBatch(ctx, db, id, r, &after, maxAttempts, resendDelivered)
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

// replayBatch runs one batch of manualBatch events of replayBatchTx, of
// no replay, in a transaction of its own.
func replayBatch(ctx context.Context, db *sql.DB, id int64, r replayRange, after *int64, maxAttempts int, resendDelivered bool) (candidates, jobs int64, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback()
	if candidates, jobs, err = replayBatchTx(ctx, tx, id, 0, r, after, manualBatch, maxAttempts, resendDelivered); err != nil {
		return 0, 0, err
	}
	return candidates, jobs, tx.Commit()
}

// replayBatchPlanSQL pins the plan of a batch of replayCandidatesSQL, for
// the rest of the batch's transaction: a walk of events_pkey in id order
// from the batch's start, which its LIMIT stops. The planner, with
// estimates that find few events of the replay's topics (always so for a
// match by function), read every event after the start instead, in a
// bitmap scan, and sorted them: each batch of 500 read to the end of the
// table, so a replay cost the square of its length. A count's batch, which only
// reads, was planned as a parallel walk under a Gather Merge instead,
// where the LIMIT does not stop the workers either: one handed the part
// of the index past the window read it to the end. Set in the batch's
// transaction only (replayBatchTx restores them after its statement, for
// the statements that follow it there); TestReplayBatchesWalkTheirEventsInOrder
// holds both.
const replayBatchPlanSQL = `
SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true),
       set_config('enable_sort', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)`

// replayBatchPlanResetSQL gives replayBatchPlanSQL's settings back their
// values, for the rest of the transaction.
const replayBatchPlanResetSQL = `
SELECT set_config(name, reset_val, true) FROM pg_settings
WHERE name IN ('enable_bitmapscan', 'enable_seqscan', 'enable_sort', 'max_parallel_workers_per_gather')`

// replayBatchTx runs one batch of replaySQL, of up to limit events after
// event *after, moving it on, and advances the ordered lanes the batch's
// deliveries joined (held, as fan-out holds them), in tx; its jobs join
// replay replayID (0: none).
func replayBatchTx(ctx context.Context, tx *sql.Tx, id, replayID int64, r replayRange, after *int64, limit int, maxAttempts int, resendDelivered bool) (candidates, jobs int64, err error) {
	if _, err := tx.ExecContext(ctx, replayBatchPlanSQL); err != nil {
		return 0, 0, err
	}
	until, topics, through := r.args()
	var lanes laneKeys
	if err := tx.QueryRowContext(ctx, replaySQL, id, r.from, *after, limit, until, topics, through, maxAttempts, resendDelivered,
		sql.NullInt64{Int64: replayID, Valid: replayID != 0}).Scan(
		&candidates, after, &jobs, pq.Array(&lanes.endpointIDs), pq.Array(&lanes.keys)); err != nil {
		return 0, 0, err
	}
	if _, err := tx.ExecContext(ctx, replayBatchPlanResetSQL); err != nil {
		return 0, 0, err
	}
	if err := advanceLanes(ctx, tx, lanes); err != nil {
		return 0, 0, err
	}
	return candidates, jobs, nil
}

// Replay kinds: a replay of a window of events, and a retry of an
// endpoint's discarded deliveries (jobs.go), which runs in the same lane.
const (
	replayKindReplay         = "replay"
	replayKindRetryDiscarded = "retry_discarded"
)

// replayHistory is how many finished replays of an endpoint are kept:
// every new one deletes the older ones (schema.sql, outbox.replays).
const replayHistory = 20

// createReplaySQL records a replay of endpoint $1, of kind $2 (for a
// 'replay', its window $3 to $4 and topics $5), to which its jobs are
// then added batch by batch.
const createReplaySQL = `
INSERT INTO outbox.replays (endpoint_id, kind, window_from, window_to, topics)
VALUES ($1, $2, $3, $4, $5)
RETURNING id`

// pruneReplaysSQL deletes endpoint $1's finished replays beyond the
// newest $2. A deleted replay's jobs are finished ones, and lose its id
// (ON DELETE SET NULL).
const pruneReplaysSQL = `
DELETE FROM outbox.replays
WHERE endpoint_id = $1
  AND finished_at IS NOT NULL
  AND id < coalesce((SELECT min(k.id)
                     FROM (SELECT r.id FROM outbox.replays AS r
                           WHERE r.endpoint_id = $1 AND r.finished_at IS NOT NULL
                           ORDER BY r.id DESC
                           LIMIT $2) AS k), 0)`

// createReplay records a new replay of endpoint id, after settling and
// pruning the endpoint's earlier ones, and returns its id. window and
// topics are those of a replay of events; nil for a retry of discarded
// deliveries.
func createReplay(ctx context.Context, db *sql.DB, id int64, kind string, window *ReplayWindow, topics []string) (int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("record replay of endpoint %d: %w", id, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, settleReplaysSQL, id); err != nil {
		return 0, fmt.Errorf("record replay of endpoint %d: settle earlier ones: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, pruneReplaysSQL, id, replayHistory); err != nil {
		return 0, fmt.Errorf("record replay of endpoint %d: prune earlier ones: %w", id, err)
	}
	var from, to sql.NullTime
	var patterns any
	if window != nil {
		from, to = sql.NullTime{Time: window.From, Valid: true}, sql.NullTime{Time: window.To, Valid: true}
		patterns = pq.Array(append([]string{}, topics...))
	}
	var replayID int64
	if err := tx.QueryRowContext(ctx, createReplaySQL, id, kind, from, to, patterns).Scan(&replayID); err != nil {
		return 0, fmt.Errorf("record replay of endpoint %d: %w", id, err)
	}
	return replayID, tx.Commit()
}

// errReplayCancelled says that a replay was cancelled: its enqueue stops.
var errReplayCancelled = errors.New("replay cancelled")

// joinReplay locks replay id's row for a batch of its jobs, in the
// batch's transaction, or answers errReplayCancelled. The lock orders
// batches and the cancel: a cancel waits for a batch in flight, and its
// discard then sees the batch's jobs; a batch after a cancel finds it.
// A replay id of 0 is none: nothing to lock.
func joinReplay(ctx context.Context, tx *sql.Tx, id int64) error {
	if id == 0 {
		return nil
	}
	var cancelled bool
	err := tx.QueryRowContext(ctx, `SELECT cancelled_at IS NOT NULL FROM outbox.replays WHERE id = $1 FOR NO KEY UPDATE`, id).Scan(&cancelled)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Its endpoint was deleted, which ends it as surely.
		return errReplayCancelled
	case err != nil:
		return fmt.Errorf("replay %d: %w", id, err)
	case cancelled:
		return errReplayCancelled
	}
	return nil
}

// countReplayJobs adds n jobs to replay id's total, in the transaction
// that enqueued them. A replay id of 0 is none.
func countReplayJobs(ctx context.Context, tx *sql.Tx, id, n int64) error {
	if id == 0 || n == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE outbox.replays SET jobs_total = jobs_total + $2, jobs_enqueued = jobs_enqueued + $2 WHERE id = $1`, id, n); err != nil {
		return fmt.Errorf("replay %d: count its jobs: %w", id, err)
	}
	return nil
}

// endEnqueueTimeout bounds endEnqueue's write, which runs even when the
// enqueue ended because its request did.
const endEnqueueTimeout = 5 * time.Second

// endEnqueue marks replay id enqueued: no batch adds to it any more, and
// it is finished once its jobs are. It runs after the enqueue, however
// that ended (a failed batch, the request's end), so it has a context of
// its own. A replay left unmarked by a crash is taken as enqueued an hour
// after it began (settleReplaysSQL).
func endEnqueue(ctx context.Context, db *sql.DB, id int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endEnqueueTimeout)
	defer cancel()
	if _, err := db.ExecContext(ctx, `UPDATE outbox.replays SET enqueued_at = coalesce(enqueued_at, now()) WHERE id = $1`, id); err != nil {
		return fmt.Errorf("replay %d: mark it enqueued: %w", id, err)
	}
	return nil
}

// replayPendingStatesSQL are the states of a replay's jobs still to be
// done: waiting or running.
const replayPendingStatesSQL = `('available', 'retryable', 'running')`

// settleReplaysSQL writes finished_at on endpoint $1's replays whose jobs
// are all finished, once they are enqueued: the time their last job
// finished (at least when the replay was enqueued, or cancelled). A
// retry of discarded deliveries whose enqueue was cut off by a crash,
// and so never marked, is taken as enqueued an hour after it began:
// longer than any request runs (requestTimeout, admin.go). A replay's
// enqueue is not cut off: the workers carry it on from its cursor
// (feedReplays). Reads of an endpoint's replays run it first, so a
// replay is found finished by its first read after its end.
const settleReplaysSQL = `
UPDATE outbox.replays AS r
SET enqueued_at = coalesce(r.enqueued_at, now()),
    finished_at = greatest(r.created_at, r.enqueued_at, r.cancelled_at,
                           (SELECT max(j.finalized_at)
                            FROM outbox.jobs AS j
                            WHERE j.replay_id = r.id
                              AND j.state IN ('completed', 'discarded')),
                           (SELECT max(d.finished_at)
                            FROM outbox.deliveries AS d
                            WHERE d.replay_id = r.id AND d.outcome = 'completed'))
WHERE r.endpoint_id = $1
  AND r.finished_at IS NULL
  AND (r.enqueued_at IS NOT NULL
       OR (r.enqueue_after IS NULL AND r.created_at < now() - interval '1 hour'))
  AND NOT EXISTS (SELECT 1
                  FROM outbox.jobs AS j
                  WHERE j.replay_id = r.id
                    AND j.state IN ` + replayPendingStatesSQL + `)`

// ReplayView is a replay as the API and the panel show it. Done counts
// its jobs finished (completed, or discarded: by failing, or by a
// cancel) as Total less Pending (which includes a replay's jobs not
// enqueued yet), so that finished jobs the job cleaner
// removed still count. Rate is jobs done a second over the last minute
// (since it began, in its first minute; over its whole run, once
// finished); ExpectedFinish is when Pending runs out at that rate, null
// when it has no rate or nothing pending.
type ReplayView struct {
	ID         int64      `json:"id"`
	EndpointID int64      `json:"endpoint_id"`
	Kind       string     `json:"kind"`
	State      string     `json:"state"` // running, cancelled or finished
	From       *time.Time `json:"from"`  // a replay's window; null for retry_discarded
	To         *time.Time `json:"to"`
	Topics     []string   `json:"topics"`
	Total      int64      `json:"total"`
	Done       int64      `json:"done"`
	Pending    int64      `json:"pending"` // waiting or running, or not enqueued yet
	Running    int64      `json:"running"`
	Rate       float64    `json:"rate"`
	// ExpectedFinish assumes the rate holds: the replay lane's pace,
	// with live traffic as it was in the last minute.
	ExpectedFinish *time.Time `json:"expected_finish"`
	CreatedAt      time.Time  `json:"created_at"`
	EnqueuedAt     *time.Time `json:"enqueued_at"` // null while its batches are still enqueued
	CancelledAt    *time.Time `json:"cancelled_at"`
	FinishedAt     *time.Time `json:"finished_at"`
}

// Replay states, as ReplayView.State says them.
const (
	replayRunning   = "running"
	replayCancelled = "cancelled"
	replayFinished  = "finished"
)

// Cancellable says whether a cancel would change the replay: it runs.
func (v ReplayView) Cancellable() bool { return v.State == replayRunning }

// replayRateWindow is how far back a running replay's rate looks.
const replayRateWindow = time.Minute

// listReplaysSQL reads endpoint $1's newest $2 replays with, for the
// unfinished ones, their jobs waiting and running, with those a replay
// has still to enqueue, and those finished in the last minute: discarded
// ones in the queue (jobs_by_replay_state), delivered ones in the history
// (deliveries_by_replay_finished_at); and the database's now.
const listReplaysSQL = `
SELECT r.id, r.endpoint_id, r.kind, r.window_from, r.window_to, r.topics, r.jobs_total,
       r.created_at, r.enqueued_at, r.cancelled_at, r.finished_at, now(),
       coalesce(p.pending, 0)
         + CASE WHEN r.enqueued_at IS NULL AND r.enqueue_after IS NOT NULL
                THEN greatest(r.jobs_total - r.jobs_enqueued, 0) ELSE 0 END,
       coalesce(p.running, 0), coalesce(m.recent, 0)
FROM outbox.replays AS r
LEFT JOIN LATERAL (
  SELECT count(*) AS pending, count(*) FILTER (WHERE j.state = 'running') AS running
  FROM outbox.jobs AS j
  WHERE r.finished_at IS NULL
    AND j.replay_id = r.id
    AND j.state IN ` + replayPendingStatesSQL + `
) AS p ON true
LEFT JOIN LATERAL (
  SELECT (SELECT count(*)
          FROM outbox.jobs AS j
          WHERE r.finished_at IS NULL
            AND j.replay_id = r.id
            AND j.state IN ('completed', 'discarded')
            AND j.finalized_at > now() - make_interval(secs => $3))
       + (SELECT count(*)
          FROM outbox.deliveries AS d
          WHERE r.finished_at IS NULL
            AND d.replay_id = r.id
            AND d.outcome = 'completed'
            AND d.finished_at > now() - make_interval(secs => $3)) AS recent
) AS m ON true
WHERE r.endpoint_id = $1
  AND ($4::bigint = 0 OR r.id = $4)
ORDER BY r.id DESC
LIMIT $2`

// scanReplayView reads one row of listReplaysSQL and works out its
// progress.
func scanReplayView(row rowScanner) (ReplayView, error) {
	var v ReplayView
	var now time.Time
	var recent int64
	err := row.Scan(&v.ID, &v.EndpointID, &v.Kind, &v.From, &v.To, pq.Array(&v.Topics), &v.Total,
		&v.CreatedAt, &v.EnqueuedAt, &v.CancelledAt, &v.FinishedAt, &now,
		&v.Pending, &v.Running, &recent)
	if err != nil {
		return v, err
	}
	v.Done = max(v.Total-v.Pending, 0)
	switch {
	case v.CancelledAt != nil:
		v.State = replayCancelled
	case v.FinishedAt != nil:
		v.State = replayFinished
	default:
		v.State = replayRunning
	}
	v.Rate = replayRate(v, now, recent)
	if v.FinishedAt == nil && v.Pending > 0 && v.Rate > 0 {
		at := now.Add(time.Duration(float64(v.Pending) / v.Rate * float64(time.Second)))
		v.ExpectedFinish = &at
	}
	return v, nil
}

// replayRate is v's jobs done a second, as ReplayView says: over its
// whole run once finished, since it began in its first replayRateWindow,
// over that window after (recent jobs finished in it).
func replayRate(v ReplayView, now time.Time, recent int64) float64 {
	if v.FinishedAt != nil {
		if took := v.FinishedAt.Sub(v.CreatedAt).Seconds(); took > 0 {
			return float64(v.Total) / took
		}
		return 0
	}
	if since := now.Sub(v.CreatedAt); since < replayRateWindow {
		if since <= 0 {
			return 0
		}
		return float64(v.Done) / since.Seconds()
	}
	return float64(recent) / replayRateWindow.Seconds()
}

// listReplays reads endpoint id's replays, newest first, after settling
// the finished ones (settleReplaysSQL). An unknown endpoint is not found.
func listReplays(ctx context.Context, db *sql.DB, id int64) ([]ReplayView, error) {
	if _, err := getEndpoint(ctx, db, id); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, settleReplaysSQL, id); err != nil {
		return nil, fmt.Errorf("replays of endpoint %d: settle finished ones: %w", id, err)
	}
	replays, err := queryAll(ctx, db, scanReplayView, listReplaysSQL, id, replayHistory+maxUnfinishedReplaysShown, replayRateWindow.Seconds(), 0)
	if err != nil {
		return nil, fmt.Errorf("replays of endpoint %d: %w", id, err)
	}
	return replays, nil
}

// maxUnfinishedReplaysShown bounds, beside the replayHistory finished
// ones, how many replays listReplays reads: an endpoint's unfinished
// replays are bounded only by its jobs.
const maxUnfinishedReplaysShown = 80

// replayCancelledError is the error a cancelled replay's waiting jobs are
// discarded with.
const replayCancelledError = "replay cancelled by an operator"

// cancelReplaySQL marks replay $2 of endpoint $1 cancelled, unless it was
// already, or had finished; a cancel also ends its enqueue, and a
// replay's total is then what it enqueued: the events its enqueue had not
// reached are not sent, and have no job to discard.
const cancelReplaySQL = `
UPDATE outbox.replays
SET cancelled_at = now(),
    enqueued_at = coalesce(enqueued_at, now()),
    jobs_total = CASE WHEN enqueued_at IS NULL AND enqueue_after IS NOT NULL
                      THEN jobs_enqueued ELSE jobs_total END
WHERE id = $2
  AND endpoint_id = $1
  AND cancelled_at IS NULL
  AND finished_at IS NULL
RETURNING id`

// discardReplayJobsSQL ends replay $1's waiting jobs, held ones of
// ordered lanes included, without a request: discarded with $2 as their
// last error (schema.sql, outbox.discard_jobs). Running ones are left to
// finish. It returns each one's lane for advanceLanes.
const discardReplayJobsSQL = `
SELECT r.endpoint_id, r.lane_key
FROM outbox.discard_jobs(ARRAY(SELECT j.id FROM outbox.jobs AS j
                               WHERE j.replay_id = $1 AND j.state IN ('available', 'retryable')
                               ORDER BY j.id
                               FOR UPDATE OF j), $2) AS r`

// cancelReplay cancels replay replayID of endpoint id, and answers it as
// it is then. In one transaction: the replay is marked (which waits for
// a batch of its enqueue in flight, and stops the next), its waiting jobs
// are discarded without a request, and the ordered lanes whose head was
// one of them advance. Its running jobs finish as they would. A replay
// already cancelled or finished is answered as it is. An unknown replay,
// or another endpoint's, is not found.
func cancelReplay(ctx context.Context, db *sql.DB, id, replayID int64) (ReplayView, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return ReplayView{}, fmt.Errorf("cancel replay %d: %w", replayID, err)
	}
	defer tx.Rollback()
	var marked int64
	err = tx.QueryRowContext(ctx, cancelReplaySQL, id, replayID).Scan(&marked)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return ReplayView{}, fmt.Errorf("cancel replay %d: %w", replayID, err)
	}
	if err == nil {
		rows, err := queryAll(ctx, tx, scanFinishedLane, discardReplayJobsSQL, replayID, replayCancelledError)
		if err != nil {
			return ReplayView{}, fmt.Errorf("cancel replay %d: discard its waiting jobs: %w", replayID, err)
		}
		if err := advanceLanes(ctx, tx, finishedLanes(rows)); err != nil {
			return ReplayView{}, fmt.Errorf("cancel replay %d: %w", replayID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, settleReplaysSQL, id); err != nil {
		return ReplayView{}, fmt.Errorf("cancel replay %d: %w", replayID, err)
	}
	views, err := queryAll(ctx, tx, scanReplayView, listReplaysSQL, id, 1, replayRateWindow.Seconds(), replayID)
	if err != nil {
		return ReplayView{}, fmt.Errorf("cancel replay %d: %w", replayID, err)
	}
	if len(views) == 0 {
		return ReplayView{}, fmt.Errorf("replay %d of endpoint %d: %w", replayID, id, errNotFound)
	}
	return views[0], tx.Commit()
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
	// Test marks an attempt of a test send (topics.go), by its event's
	// mark: the history keeps none of its own.
	Test bool `json:"test,omitempty"`
}

// EndpointStats is an endpoint's recent record.
type EndpointStats struct {
	Recent      []DeliveryView `json:"recent"`
	Attempts    int            `json:"attempts"`     // in the last hour
	Successes   int            `json:"successes"`    // 2xx in the last hour
	SuccessRate float64        `json:"success_rate"` // successes/attempts, 0..1
	Discarded   int            `json:"discarded"`    // jobs waiting for a hand
}

// recentDeliveriesSQL is the endpoint's last $2 attempts, from the
// history (deliveries_by_endpoint_finished_at).
const recentDeliveriesSQL = `
SELECT d.job_id, d.event_id, d.attempt, d.finished_at, d.duration_ms, d.status_code, d.error, d.response_excerpt,
       coalesce((SELECT e.test FROM outbox.events AS e WHERE e.id = d.event_id), false)
FROM outbox.deliveries AS d
WHERE d.endpoint_id = $1
ORDER BY d.finished_at DESC
LIMIT $2`

// endpointRatesSQL reads the hour's attempts from the endpoint's 60
// newest minutes of outbox.delivery_stats (the same hour as the endpoint's
// statistics, stats.go): 60 rows at most, where counting the hour's
// outbox.deliveries read a row per attempt, hundreds of thousands at a
// few thousand deliveries a second.
const endpointRatesSQL = `
SELECT coalesce(sum(attempts), 0),
       coalesce(sum(successes), 0),
       (SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'discarded')
FROM outbox.delivery_stats
WHERE endpoint_id = $1
  AND minute > date_trunc('minute', now()) - interval '1 hour'`

func scanDeliveryView(row rowScanner) (DeliveryView, error) {
	var d DeliveryView
	err := row.Scan(&d.JobID, &d.EventID, &d.Attempt, &d.FinishedAt, &d.DurationMS, &d.StatusCode, &d.Error, &d.Excerpt, &d.Test)
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

// manualBatch bounds one statement of work an operator starts by hand (a
// replay, a retry of an endpoint's discarded deliveries), like every
// sweep's batch: a replay of a week runs in many short statements that
// hold few locks, not one.
const manualBatch = 5000
