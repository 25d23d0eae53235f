// jobs.go: the job table as the operator sees it, listing jobs with their
// errors and retrying them by hand.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/lib/pq"
)

// JobView is a job as the API and the panel show it.
type JobView struct {
	ID         int64  `json:"id"`
	Kind       string `json:"kind"`
	EventID    int64  `json:"event_id"`
	EndpointID *int64 `json:"endpoint_id"` // a delivery's endpoint; null for other kinds, or once it was deleted
	// EndpointName is how an operator knows that endpoint: its
	// description, else its URL.
	EndpointName string `json:"endpoint_name,omitempty"`
	// ReplayID is the replay (or retry of discarded deliveries) the job
	// runs for, in its endpoint's replay lane; null for a live delivery.
	ReplayID    *int64    `json:"replay_id"`
	State       string    `json:"state"`
	Attempt     int       `json:"attempt"`
	MaxAttempts int       `json:"max_attempts"`
	CreatedAt   time.Time `json:"created_at"`
	// ScheduledAt is when it may run; null while it waits for its turn
	// in an ordered lane (WaitingForTurn).
	ScheduledAt    *time.Time      `json:"scheduled_at"`
	WaitingForTurn bool            `json:"waiting_for_turn"`
	AttemptedAt    *time.Time      `json:"attempted_at"`
	FinalizedAt    *time.Time      `json:"finalized_at"`
	Errors         json.RawMessage `json:"errors"`
	// NotSent is, for a job completed without its effect, why nothing
	// was sent ("not sent: no SMTP server configured (-smtp-url)"): its
	// completing attempt's error in the history (jobRowsSQL).
	NotSent string `json:"not_sent,omitempty"`
	// Test marks a test send's delivery (topics.go); absent for every
	// other job.
	Test bool `json:"test,omitempty"`
	// BreakerOpenedAt is when its endpoint's circuit breaker opened, set
	// while the job waits (available or retryable) behind it: the claim
	// lets one of the endpoint's jobs through at a time, and fan-out
	// schedules new ones -failing-endpoint-delay out. The panel's alone.
	BreakerOpenedAt *time.Time `json:"-"`
	// NoRunner marks a job waiting to run (available or retryable) whose
	// kind no live replica runs (noRunnerSQL): none claims it until one
	// that runs its kind is up. The panel's alone.
	NoRunner bool `json:"-"`
}

// JobFilter selects jobs, newest first, paged by id.
type JobFilter struct {
	State      string // "" or a job state
	EventID    int64  // 0: any
	EndpointID int64  // 0: any
	Before     int64
	Limit      int
}

func (f *JobFilter) validate() error {
	switch jobState(f.State) {
	case "", jobAvailable, jobRunning, jobRetryable, jobCompleted, jobDiscarded:
	default:
		return fmt.Errorf("%w: state %q must be available, running, retryable, completed or discarded", errInvalid, f.State)
	}
	if f.Limit <= 0 {
		f.Limit = defaultPageSize
	}
	f.Limit = min(f.Limit, maxEventPage)
	return nil
}

const listJobsSQL = `
SELECT j.id, j.kind, j.event_id, j.endpoint_id, ` + endpointNameSQL + `, j.replay_id, j.state::text,
       j.attempt, j.max_attempts, j.created_at, nullif(j.scheduled_at, 'infinity'),
       coalesce(j.scheduled_at = 'infinity', false), j.attempted_at, j.finalized_at, j.errors,
       coalesce(j.not_sent, ''),
       CASE WHEN j.state IN ('available', 'retryable') THEN ep.breaker_opened_at END,
       j.state IN ('available', 'retryable') AND ` + noRunnerSQL + `,
       j.test IS TRUE
FROM ` + jobRowsSQL + ` AS j
LEFT JOIN outbox.endpoints AS ep ON ep.id = j.endpoint_id
WHERE ($1::bigint = 0 OR j.id < $1::bigint)
  AND ($2 = '' OR j.state = $2::outbox.job_state)
  AND ($3::bigint = 0 OR j.event_id = $3::bigint)
  AND ($5::bigint = 0 OR j.endpoint_id = $5::bigint)
ORDER BY j.id DESC
LIMIT $4`

// jobRowsSQL is every job as the API and the panel list them: the
// queue's (outbox.jobs) and the delivered ones, which leave the queue and
// stand in the history (outbox.deliveries) as the attempt that completed
// them. Of a delivered job the history keeps no max_attempts (its attempt
// stands for it), no due or claim time, and no creation time: it was made
// when its event was fanned out; its errors are its earlier attempts'.
// Nor does it keep a test send's mark: its event's is its job's.
const jobRowsSQL = `(
SELECT j.id, j.kind, j.event_id, j.endpoint_id, j.replay_id, j.state, j.attempt, j.max_attempts,
       j.created_at, j.scheduled_at, j.attempted_at, j.finalized_at, j.errors, NULL AS not_sent,
       j.test
FROM outbox.jobs AS j
UNION ALL
SELECT d.job_id, d.kind, d.event_id, d.endpoint_id, d.replay_id, 'completed', d.attempt, d.attempt,
       coalesce(e.fanned_out_at, d.finished_at), NULL, NULL, d.finished_at,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('attempt', p.attempt, 'at', p.finished_at, 'error', p.error)
                                  ORDER BY p.attempt), '[]')
        FROM outbox.deliveries AS p
        WHERE p.job_id = d.job_id AND p.attempt < d.attempt AND p.error <> ''),
       nullif(d.error, ''),
       e.test
FROM outbox.deliveries AS d
LEFT JOIN outbox.events AS e ON e.id = d.event_id
WHERE d.outcome = 'completed')`

// endpointNameSQL is the name of endpoint ep, as endpointRow.Name says
// it: its description, else its URL; empty for none.
const endpointNameSQL = `coalesce(nullif(ep.description, ''), ep.url, '')`

// listJobs reads one page of jobs.
func listJobs(ctx context.Context, db *sql.DB, f JobFilter) ([]JobView, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	jobs, err := queryAll(ctx, db, scanJobView, listJobsSQL, f.Before, f.State, f.EventID, f.Limit, f.EndpointID)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return jobs, nil
}

func scanJobView(row rowScanner) (JobView, error) {
	var j JobView
	var errs []byte
	err := row.Scan(&j.ID, &j.Kind, &j.EventID, &j.EndpointID, &j.EndpointName, &j.ReplayID, &j.State, &j.Attempt, &j.MaxAttempts,
		&j.CreatedAt, &j.ScheduledAt, &j.WaitingForTurn, &j.AttemptedAt, &j.FinalizedAt, &errs, &j.NotSent, &j.BreakerOpenedAt,
		&j.NoRunner, &j.Test)
	j.Errors = errs
	return j, err
}

// retryJobSQL retries one job that is not running or completed, of an
// event not erased; a discarded delivery only if its event was recorded
// at or after $2 (NULL: any), the cutoff retryJob checked, so that a job
// discarded since the check is not resent unchecked. The event's row is
// locked FOR SHARE, so that an erasure in flight is waited for and seen. A discarded job of a replay leaves it
// and runs live: one job retried by hand is an operator's, not the
// replay's. A waiting one stays in its replay: the retry only brings its
// next attempt forward.
const retryJobSQL = `
SELECT r.endpoint_id, r.lane_key
FROM outbox.run_again(ARRAY(
  SELECT j.id
  FROM outbox.jobs AS j
  WHERE j.id = $1
    AND j.state IN ('discarded', 'retryable', 'available')
    AND EXISTS (SELECT 1 FROM outbox.events AS e WHERE e.id = j.event_id AND e.erased_at IS NULL FOR SHARE)
    AND (j.state <> 'discarded'
         OR j.endpoint_id IS NULL
         OR $2::timestamptz IS NULL
         OR j.event_id IN (SELECT id FROM outbox.events WHERE created_at >= $2))
  FOR UPDATE OF j), NULL) AS r`

// jobResendSQL reads what bounds a retry of one job by hand: its state,
// whether it has an endpoint and the window that endpoint's receiver
// advertised, its event's age, and whether its event was erased.
const jobResendSQL = `
SELECT j.state::text, j.endpoint_id IS NOT NULL, coalesce(ep.dedup_window_seconds, 0),
       e.created_at, now(), e.erased_at IS NOT NULL
FROM outbox.jobs AS j
JOIN outbox.events AS e ON e.id = j.event_id
LEFT JOIN outbox.endpoints AS ep ON ep.id = j.endpoint_id
WHERE j.id = $1`

// retryJob retries one job by hand and wakes the workers. A discarded
// delivery of an event older than resendCutoff allows is refused: sent
// again, it could reach its receiver after the receiver's dedup record is
// gone (the dedup rule, replay.go). A retryable or available job is still
// in a run of attempts the rule covers; retrying it only brings its next
// attempt forward. Jobs without an endpoint reach no receiver.
func retryJob(ctx context.Context, db *sql.DB, id int64, eventsRetention time.Duration, maxAttempts int) error {
	var state string
	var delivery bool
	var windowSeconds int64
	var created, now time.Time
	var erased bool
	err := db.QueryRowContext(ctx, jobResendSQL, id).Scan(&state, &delivery, &windowSeconds, &created, &now, &erased)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("retry job %d: %w", id, errNotFound)
	}
	if err != nil {
		return fmt.Errorf("retry job %d: %w", id, err)
	}
	if erased {
		return fmt.Errorf("%w: job %d stays as it is: its event's payload was erased", errInvalid, id)
	}
	var cutoff *time.Time
	window := time.Duration(windowSeconds) * time.Second
	if from, why, bounded := resendCutoff(now, eventsRetention, maxAttempts, window); delivery && bounded {
		if jobState(state) == jobDiscarded && created.Before(from) {
			return fmt.Errorf("%w: job %d stays discarded: its event was recorded at %s, before %s, and %s",
				errInvalid, id, created.Format(time.RFC3339), from.Format(time.RFC3339), why)
		}
		cutoff = &from
	}
	n, err := putBack(ctx, db, 0, retryJobSQL, id, cutoff)
	if err != nil {
		return fmt.Errorf("retry job %d: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("retry job %d: %w (or running, or completed)", id, errNotFound)
	}
	return nil
}

// putBack runs query, a statement that puts jobs back in the queue and
// returns each one's endpoint_id and lane_key; advances the ordered
// lanes they joined, and wakes the workers, in one transaction; one of
// replay replayID (joinReplay, replay.go), whose jobs they join, unless
// that is 0. It reports how many jobs it put back.
func putBack(ctx context.Context, db *sql.DB, replayID int64, query string, args ...any) (int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := joinReplay(ctx, tx, replayID); err != nil {
		return 0, err
	}
	rows, err := queryAll(ctx, tx, scanFinishedLane, query, args...)
	if err != nil {
		return 0, err
	}
	if err := advanceLanes(ctx, tx, finishedLanes(rows)); err != nil {
		return 0, err
	}
	if err := countReplayJobs(ctx, tx, replayID, int64(len(rows))); err != nil {
		return 0, err
	}
	if len(rows) > 0 {
		if err := notify(ctx, tx, jobsChannel); err != nil {
			return 0, err
		}
	}
	return int64(len(rows)), tx.Commit()
}

// RetryResult says what a retry of an endpoint's discarded deliveries did,
// and how many it left discarded because their events are older than a
// resend may be for (resendCutoff). The retry is a replay (ReplayID),
// whose jobs run in the endpoint's replay lane.
type RetryResult struct {
	Jobs     int64  `json:"jobs"`
	Skipped  int64  `json:"skipped"`
	Message  string `json:"message,omitempty"`
	ReplayID int64  `json:"replay_id"`
}

// lastErrorSQL is a job's last error, the one it was discarded with; empty
// for a job discarded without an attempt (a cancelled replay's).
const lastErrorSQL = `coalesce(j.errors -> -1 ->> 'error', '')`

// retryDiscardedSQL retries up to $2 of endpoint $1's discarded jobs
// whose events were recorded at or after $3 (NULL: any) and whose last
// error is $5 (NULL: any), as jobs of replay $4; with $1 = 0, the
// discarded jobs of no endpoint (in-process subscribers, owner
// notifications, deliveries of a deleted endpoint), with $3 NULL and
// $4 = 0: live, as retryJobSQL retries one of them.
const retryDiscardedSQL = `
WITH discarded AS (
  SELECT j.id
  FROM outbox.jobs AS j
  JOIN outbox.events AS e ON e.id = j.event_id
  WHERE (j.endpoint_id = $1 OR ($1 = 0 AND j.endpoint_id IS NULL))
    AND j.state = 'discarded'
    AND e.erased_at IS NULL
    AND ($3::timestamptz IS NULL OR e.created_at >= $3)
    AND ($5::text IS NULL OR ` + lastErrorSQL + ` = $5::text)
  ORDER BY j.id
  LIMIT $2
  FOR UPDATE OF j SKIP LOCKED
)
SELECT r.endpoint_id, r.lane_key
FROM outbox.run_again(ARRAY(SELECT d.id FROM discarded AS d), nullif($4::bigint, 0)) AS r`

// tooOldDiscardedSQL counts an endpoint's discarded jobs whose events were
// recorded before $2 and whose last error is $3 (NULL: any): the ones
// retryDiscarded leaves.
const tooOldDiscardedSQL = `
SELECT count(*)
FROM outbox.jobs AS j
JOIN outbox.events AS e ON e.id = j.event_id
WHERE j.endpoint_id = $1
  AND j.state = 'discarded'
  AND e.created_at < $2
  AND ($3::text IS NULL OR ` + lastErrorSQL + ` = $3::text)`

// retryDiscarded retries the discarded deliveries of an endpoint, in
// batches of manualBatch, and wakes the workers. Like a replay, it resends
// only events resendCutoff allows, and says how many it left; and like a
// replay's, its jobs join a replay of their own (kind retry_discarded),
// which runs in the endpoint's replay lane and can be cancelled.
func retryDiscarded(ctx context.Context, db *sql.DB, endpointID int64, eventsRetention time.Duration, maxAttempts int) (RetryResult, error) {
	return retryDiscardedWithError(ctx, db, endpointID, nil, eventsRetention, maxAttempts)
}

// retryDiscardedWithError is retryDiscarded for the deliveries whose last
// attempt failed with exactly lastError (nil: any): one row of the
// discarded jobs grouped by endpoint and error (listDiscardedGroups).
func retryDiscardedWithError(ctx context.Context, db *sql.DB, endpointID int64, lastError *string, eventsRetention time.Duration, maxAttempts int) (res RetryResult, err error) {
	ep, err := getEndpoint(ctx, db, endpointID)
	if err != nil {
		return res, err
	}
	now, err := databaseNow(ctx, db)
	if err != nil {
		return res, fmt.Errorf("retry discarded jobs of endpoint %d: %w", endpointID, err)
	}
	var cutoff *time.Time
	from, why, bounded := resendCutoff(now, eventsRetention, maxAttempts, ep.dedupWindow())
	if bounded {
		cutoff = &from
	}
	if res.ReplayID, err = createReplay(ctx, db, endpointID, replayKindRetryDiscarded, nil, nil); err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, endEnqueue(ctx, db, res.ReplayID)) }()
	for {
		n, err := putBack(ctx, db, res.ReplayID, retryDiscardedSQL, endpointID, manualBatch, cutoff, res.ReplayID, lastError)
		if errors.Is(err, errReplayCancelled) {
			break
		}
		if err != nil {
			return res, fmt.Errorf("retry discarded jobs of endpoint %d: %w", endpointID, err)
		}
		res.Jobs += n
		if n < manualBatch {
			break
		}
	}
	if bounded {
		if err := db.QueryRowContext(ctx, tooOldDiscardedSQL, endpointID, from, lastError).Scan(&res.Skipped); err != nil {
			return res, fmt.Errorf("retry discarded jobs of endpoint %d: %w", endpointID, err)
		}
	}
	if res.Skipped > 0 {
		res.Message = fmt.Sprintf("%d discarded deliveries stay discarded: their events were recorded before %s, and %s",
			res.Skipped, from.Format(time.RFC3339), why)
	}
	if err := notify(ctx, db, jobsChannel); err != nil {
		return res, fmt.Errorf("retry discarded jobs of endpoint %d: %w", endpointID, err)
	}
	return res, nil
}

// BulkRetryResult says what a retry of every discarded job did: for each
// endpoint that had discarded deliveries, what its retryDiscarded did (a
// replay of its own, in its replay lane); and how many jobs of no
// endpoint run again, live, as a retried job does.
type BulkRetryResult struct {
	Jobs            int64                 `json:"jobs"`             // every job that runs again
	Skipped         int64                 `json:"skipped"`          // deliveries left discarded: too old to resend
	WithoutEndpoint int64                 `json:"without_endpoint"` // of Jobs, those of no endpoint
	Endpoints       []EndpointRetryResult `json:"endpoints"`
}

// EndpointRetryResult is one endpoint's part of a BulkRetryResult.
type EndpointRetryResult struct {
	EndpointID int64 `json:"endpoint_id"`
	RetryResult
}

// DiscardedFilter narrows a retry of every discarded job to one group of
// them; the zero filter is every discarded job.
type DiscardedFilter struct {
	EndpointID      int64   `json:"endpoint_id"`      // 0: every endpoint's
	WithoutEndpoint bool    `json:"without_endpoint"` // only the jobs of no endpoint
	Error           *string `json:"error"`            // only jobs whose last attempt failed with exactly this error
}

func (f DiscardedFilter) validate() error {
	if f.EndpointID < 0 {
		return fmt.Errorf("%w: endpoint_id %d is not an endpoint id", errInvalid, f.EndpointID)
	}
	if f.EndpointID != 0 && f.WithoutEndpoint {
		return fmt.Errorf("%w: endpoint_id and without_endpoint exclude each other", errInvalid)
	}
	return nil
}

// discardedEndpointsSQL lists the endpoints with a discarded delivery
// whose last error is $1 (NULL: any), by
// jobs_finished_by_state_finalized_at: the discarded jobs, which the job
// cleaner keeps for a week.
const discardedEndpointsSQL = `
SELECT DISTINCT j.endpoint_id
FROM outbox.jobs AS j
WHERE j.state = 'discarded'
  AND j.endpoint_id IS NOT NULL
  AND ($1::text IS NULL OR ` + lastErrorSQL + ` = $1::text)
ORDER BY j.endpoint_id`

// retryEveryDiscarded retries every discarded job f selects: each
// endpoint's deliveries through retryDiscardedWithError, so that they run
// in its replay lane and only as far back as a resend to it may go; then
// the jobs of no endpoint, in batches of manualBatch, as retryJob retries
// one. An endpoint deleted meanwhile is passed over: its deliveries are
// then of no endpoint, and retried as such.
func retryEveryDiscarded(ctx context.Context, db *sql.DB, f DiscardedFilter, eventsRetention time.Duration, maxAttempts int) (BulkRetryResult, error) {
	res := BulkRetryResult{Endpoints: []EndpointRetryResult{}}
	if err := f.validate(); err != nil {
		return res, err
	}
	ids := []int64{f.EndpointID}
	if f.WithoutEndpoint {
		ids = nil
	} else if f.EndpointID == 0 {
		var err error
		if ids, err = queryAll(ctx, db, scanID, discardedEndpointsSQL, f.Error); err != nil {
			return res, fmt.Errorf("retry discarded jobs: %w", err)
		}
	}
	for _, id := range ids {
		r, err := retryDiscardedWithError(ctx, db, id, f.Error, eventsRetention, maxAttempts)
		if errors.Is(err, errNotFound) && f.EndpointID == 0 {
			continue
		}
		if err != nil {
			return res, err
		}
		res.Endpoints = append(res.Endpoints, EndpointRetryResult{EndpointID: id, RetryResult: r})
		res.Jobs += r.Jobs
		res.Skipped += r.Skipped
	}
	for f.EndpointID == 0 {
		n, err := putBack(ctx, db, 0, retryDiscardedSQL, 0, manualBatch, nil, 0, f.Error)
		if err != nil {
			return res, fmt.Errorf("retry discarded jobs of no endpoint: %w", err)
		}
		res.WithoutEndpoint += n
		if n < manualBatch {
			break
		}
	}
	res.Jobs += res.WithoutEndpoint
	return res, nil
}

// DiscardedGroup is the discarded jobs of one endpoint (none: EndpointID
// nil) that failed last with one error: what the panel's discarded list
// shows as one row with one retry button.
type DiscardedGroup struct {
	EndpointID   *int64    `json:"endpoint_id"`
	EndpointName string    `json:"endpoint_name"` // its description, else its URL
	Error        string    `json:"error"`
	Jobs         int64     `json:"jobs"`
	FirstSeen    time.Time `json:"first_seen"` // when the first of them was discarded
	LastSeen     time.Time `json:"last_seen"`
}

// maxDiscardedGroups bounds the groups listed: past a hundred distinct
// errors, the errors themselves vary (an id or a time in each), and the
// endpoint's page is the better view.
const maxDiscardedGroups = 100

// maxDiscardedGrouped bounds the discarded jobs grouped: the newest
// 10,000, read backwards through jobs_finished_by_state_finalized_at.
// A week of a dead receiver's deliveries may be millions, and grouping
// them all would take the page seconds (docs/panel.md). A group's retry still sends every discarded job of its endpoint and
// error, however old.
const maxDiscardedGrouped = 10_000

// discardedGroupsSQL groups the newest $3 discarded jobs, of endpoint $1
// (0: any), by endpoint and last error, the most recent group first, at
// most $2.
const discardedGroupsSQL = `
SELECT j.endpoint_id,
       ` + endpointNameSQL + `,
       ` + lastErrorSQL + `,
       count(*),
       min(j.finalized_at),
       max(j.finalized_at)
FROM (SELECT endpoint_id, errors, finalized_at
      FROM outbox.jobs
      WHERE state = 'discarded'
        AND ($1::bigint = 0 OR endpoint_id = $1::bigint)
      ORDER BY finalized_at DESC
      LIMIT $3) AS j
LEFT JOIN outbox.endpoints AS ep ON ep.id = j.endpoint_id
GROUP BY 1, 2, 3
ORDER BY max(j.finalized_at) DESC, 1, 3
LIMIT $2`

// DiscardedGroups is the discarded jobs grouped by endpoint and error;
// Partial says only the newest maxDiscardedGrouped of them were read.
type DiscardedGroups struct {
	Groups  []DiscardedGroup `json:"groups"`
	Partial bool             `json:"partial"`
}

// listDiscardedGroups reads the discarded jobs grouped by endpoint and
// error.
func listDiscardedGroups(ctx context.Context, db *sql.DB, endpointID int64) (DiscardedGroups, error) {
	groups, err := queryAll(ctx, db, func(row rowScanner) (DiscardedGroup, error) {
		var g DiscardedGroup
		err := row.Scan(&g.EndpointID, &g.EndpointName, &g.Error, &g.Jobs, &g.FirstSeen, &g.LastSeen)
		return g, err
	}, discardedGroupsSQL, endpointID, maxDiscardedGroups, maxDiscardedGrouped)
	if err != nil {
		return DiscardedGroups{}, fmt.Errorf("group discarded jobs: %w", err)
	}
	res := DiscardedGroups{Groups: groups}
	var read int64
	for _, g := range groups {
		read += g.Jobs
	}
	res.Partial = read >= maxDiscardedGrouped || len(groups) == maxDiscardedGroups
	return res, nil
}

// eventOutcomesSQL counts the jobs of a page of events ($1): those of the
// queue, through jobs_by_event_id, and the delivered ones in the history,
// through deliveries_by_event_id.
const eventOutcomesSQL = `
SELECT j.event_id,
       count(*),
       count(*) FILTER (WHERE j.state = 'completed'),
       count(*) FILTER (WHERE j.state = 'discarded')
FROM (SELECT event_id, state FROM outbox.jobs WHERE event_id = ANY($1::bigint[])
      UNION ALL
      SELECT event_id, 'completed' FROM outbox.deliveries WHERE event_id = ANY($1::bigint[]) AND outcome = 'completed') AS j
GROUP BY j.event_id`

// addEventOutcomes sets the Outcome of every event of a page.
func addEventOutcomes(ctx context.Context, db *sql.DB, events []Event) error {
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	type counted struct {
		eventID int64
		EventOutcome
	}
	rows, err := queryAll(ctx, db, func(row rowScanner) (counted, error) {
		var c counted
		err := row.Scan(&c.eventID, &c.Jobs, &c.Completed, &c.Discarded)
		c.Pending = c.Jobs - c.Completed - c.Discarded
		return c, err
	}, eventOutcomesSQL, pq.Array(ids))
	if err != nil {
		return fmt.Errorf("event outcomes: %w", err)
	}
	byEvent := make(map[int64]EventOutcome, len(rows))
	for _, c := range rows {
		byEvent[c.eventID] = c.EventOutcome
	}
	for i := range events {
		o := byEvent[events[i].ID]
		events[i].Outcome = &o
	}
	return nil
}

// outcomeBadge is one coloured badge of the events list: how many of an
// event's jobs stand one way, and why ("2 retrying, breaker open"), with
// the endpoints they go to.
type outcomeBadge struct {
	Reason    string
	Class     string // ok, bad, warn or wait: the badge's colour
	Jobs      int64
	Endpoints []endpointLink
}

// endpointLink is an endpoint named for a link to its page; ID 0 for the
// jobs of no endpoint (in-process subscribers, owner notifications),
// named by their kind ("sub:log").
type endpointLink struct {
	ID   int64
	Name string
}

// Text is the badge's words: "delivered 3", else the count first.
func (b outcomeBadge) Text() string {
	if b.Reason == reasonDelivered {
		return fmt.Sprintf("delivered %d", b.Jobs)
	}
	return fmt.Sprintf("%d %s", b.Jobs, b.Reason)
}

// The reasons a job stands where it does, in the order the badges show
// them, each with its colour: what finished first, then what holds the
// rest back, the operator's part before the receiver's.
const reasonDelivered = "delivered"

var outcomeReasons = []struct{ reason, class string }{
	{reasonDelivered, "ok"},
	{"not sent", "warn"},
	{"failed", "bad"},
	{"endpoint disabled", "bad"},
	{"endpoint paused", "wait"},
	{"retrying, breaker open", "warn"},
	{"queued, breaker open", "warn"},
	{"held: the receiver asked to wait", "warn"},
	{"retrying", "warn"},
	{"sending", "wait"},
	{"waiting for its turn", "wait"},
	{"queued", "wait"},
}

// outcomeBadgesSQL counts the jobs of a page of events ($1), of the
// queue and delivered (as eventOutcomesSQL reads them), by why they stand
// where they do and by endpoint. The reasons are outcomeReasons'.
const outcomeBadgesSQL = `
SELECT j.event_id,
       CASE
         WHEN j.not_sent IS NOT NULL THEN 'not sent'
         WHEN j.state = 'completed' THEN 'delivered'
         WHEN j.state = 'discarded' THEN 'failed'
         WHEN ep.disabled_at IS NOT NULL THEN 'endpoint disabled'
         WHEN ep.paused_at IS NOT NULL THEN 'endpoint paused'
         WHEN j.state = 'running' THEN 'sending'
         WHEN ep.breaker_opened_at IS NOT NULL AND j.state = 'retryable' THEN 'retrying, breaker open'
         WHEN ep.breaker_opened_at IS NOT NULL THEN 'queued, breaker open'
         WHEN ep.held_until > now() THEN 'held: the receiver asked to wait'
         WHEN j.state = 'retryable' THEN 'retrying'
         WHEN j.scheduled_at = 'infinity' THEN 'waiting for its turn'
         ELSE 'queued'
       END,
       coalesce(j.endpoint_id, 0),
       coalesce(nullif(ep.description, ''), ep.url, j.kind),
       count(*)
FROM (SELECT j.event_id, j.state, j.endpoint_id, j.kind, j.scheduled_at, NULL AS not_sent
      FROM outbox.jobs AS j
      WHERE j.event_id = ANY($1::bigint[])
      UNION ALL
      SELECT d.event_id, 'completed', d.endpoint_id, d.kind, NULL, nullif(d.error, '')
      FROM outbox.deliveries AS d
      WHERE d.event_id = ANY($1::bigint[]) AND d.outcome = 'completed') AS j
LEFT JOIN outbox.endpoints AS ep ON ep.id = j.endpoint_id
GROUP BY 1, 2, 3, 4
ORDER BY 1, 3`

// readOutcomeBadges reads the badges of a page of events, by event id,
// each event's in outcomeReasons' order.
func readOutcomeBadges(ctx context.Context, db *sql.DB, events []Event) (map[int64][]outcomeBadge, error) {
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	type counted struct {
		eventID int64
		reason  string
		ep      endpointLink
		jobs    int64
	}
	rows, err := queryAll(ctx, db, func(row rowScanner) (counted, error) {
		var c counted
		err := row.Scan(&c.eventID, &c.reason, &c.ep.ID, &c.ep.Name, &c.jobs)
		return c, err
	}, outcomeBadgesSQL, pq.Array(ids))
	if err != nil {
		return nil, fmt.Errorf("event outcome badges: %w", err)
	}
	byEvent := map[int64][]outcomeBadge{}
	for _, r := range outcomeReasons {
		for _, c := range rows {
			if c.reason != r.reason {
				continue
			}
			badges := byEvent[c.eventID]
			if n := len(badges); n == 0 || badges[n-1].Reason != r.reason {
				badges = append(badges, outcomeBadge{Reason: r.reason, Class: r.class})
			}
			b := &badges[len(badges)-1]
			b.Jobs += c.jobs
			b.Endpoints = append(b.Endpoints, c.ep)
			byEvent[c.eventID] = badges
		}
	}
	return byEvent, nil
}
