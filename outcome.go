// outcome.go: what an attempt's result does to its job and its endpoint,
// decided (decideOutcome, over the backoff schedule) and then written by the
// completer, which records a batch of outcomes with their attempts and their
// endpoints' new states in one transaction.
//
// Guarantees (README, "Guarantees, hop by hop", hops 4 and 5):
//   - An outcome is written only while the job is still running with the
//     attempt number the worker claimed. A worker that lost its job to the
//     rescuer (or to a retry by hand) changes nothing.
//   - A failure is retried with a backoff of attempt⁴ seconds (±10%) until
//     MaxAttempts, then discarded with every attempt's error kept: nothing
//     ends silently, and a discarded job can be retried by hand.

package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/lib/pq"
)

// jobState is outbox.job_state.
type jobState string

const (
	jobAvailable jobState = "available"
	jobRunning   jobState = "running"
	jobRetryable jobState = "retryable"
	jobCompleted jobState = "completed"
	jobDiscarded jobState = "discarded"
)

// Errors a handler returns to steer its outcome; any other error is a
// retryable failure.
type (
	// permanentError discards the job at once: retrying cannot help.
	permanentError struct{ err error }
	// retryAfterError retries after the given delay or the backoff,
	// whichever is longer (a receiver's Retry-After): a receiver may slow
	// its retries down, never speed them up past the schedule.
	retryAfterError struct {
		err   error
		delay time.Duration
	}
)

// maxRetryAfter bounds how far a handler's retryAfterError (a receiver's
// Retry-After) may push one retry: an hour rides out a deploy or a
// rate-limit window, and retryHorizon counts it, so the schedule still ends
// inside events retention whatever receivers answer.
const maxRetryAfter = time.Hour

func (e permanentError) Error() string  { return e.err.Error() }
func (e permanentError) Unwrap() error  { return e.err }
func (e retryAfterError) Error() string { return e.err.Error() }
func (e retryAfterError) Unwrap() error { return e.err }

// maxBackoff caps one retry delay; attempt⁴ passes it only beyond the 17th
// attempt, so with the default 18 attempts it is a guard for larger limits.
const maxBackoff = 24 * time.Hour

// backoff is the delay before attempt+1 after attempt failed: attempt⁴
// seconds, ±10% jitter (jitter in [0, 1)) so jobs that failed together do not
// retry together. Attempts 1..17 wait:
//
//	1s 16s 81s 4m16s 10m25s 21m36s 40m1s 1h8m 1h49m 2h47m 4h4m 5h46m
//	7h56m 10h40m 14h3m 18h12m 23h12m  (sum ≈ 3.8 days)
func backoff(attempt int, jitter float64) time.Duration {
	d := time.Duration(math.Pow(float64(attempt), 4) * float64(time.Second))
	d = time.Duration(float64(d) * (0.9 + 0.2*jitter))
	return min(max(d, time.Second), maxBackoff)
}

// retryHorizon is the longest time from a job's first attempt to its
// discard with n attempts, counting the jitter's upper bound and a
// receiver's Retry-After, which may stretch any delay to
// maxRetryAfter.
func retryHorizon(n int) time.Duration {
	var total time.Duration
	for attempt := 1; attempt < n; attempt++ {
		total += max(backoff(attempt, 1), maxRetryAfter)
	}
	return total
}

// jobOutcome is the decision after an attempt.
type jobOutcome struct {
	State jobState      // completed, retryable or discarded
	Delay time.Duration // with retryable: wait before the next attempt
	Error string        // with retryable and discarded: what went wrong
}

// decideOutcome classifies one attempt's result. It is the only place that
// turns an error into a next state.
func decideOutcome(attempt, maxAttempts int, err error, jitter float64) jobOutcome {
	if err == nil {
		return jobOutcome{State: jobCompleted}
	}
	msg := truncate(err.Error(), maxErrorLen)
	var perm permanentError
	if errors.As(err, &perm) || attempt >= maxAttempts {
		return jobOutcome{State: jobDiscarded, Error: msg}
	}
	var after retryAfterError
	if errors.As(err, &after) {
		return jobOutcome{State: jobRetryable, Delay: min(max(after.delay, backoff(attempt, jitter)), maxBackoff), Error: msg}
	}
	return jobOutcome{State: jobRetryable, Delay: backoff(attempt, jitter), Error: msg}
}

// jobResult is an outcome on its way to the database.
type jobResult struct {
	ID      int64
	Attempt int
	jobOutcome
	record *attemptRecord // nil, or the attempt as the panel shows it
	// wakeOnOutcome is the job's (Job.wakeOnOutcome): once this outcome
	// is recorded, the workers claim again.
	wakeOnOutcome bool
}

// keptOnJob says the attempt completed its job without a note (a mail not
// sent for want of a server has one): its status code and duration go on
// the job, with its outcome (recordOutcomesSQL), and it has no row in
// outbox.deliveries, provided the job took the outcome.
func (r jobResult) keptOnJob() bool {
	return r.record != nil && r.State == jobCompleted && r.record.Error == ""
}

// outcome decides what an attempt's error means for its job, counts it
// and logs it.
func (p *workerPool) outcome(job Job, err error, start time.Time) jobResult {
	res := jobResult{ID: job.ID, Attempt: job.Attempt, wakeOnOutcome: job.wakeOnOutcome}
	res.jobOutcome = decideOutcome(job.Attempt, job.MaxAttempts, err, rand.Float64())
	// The attributes are built per call, not with logger.With: With copies
	// them for every job, and most jobs complete at debug level, unlogged.
	attrs := func(more ...any) []any {
		return append([]any{"job_id", job.ID, "kind", job.Kind, "event_id", job.Event.ID,
			"attempt", job.Attempt, "duration", time.Since(start).Round(time.Millisecond)}, more...)
	}
	switch res.State {
	case jobCompleted:
		p.completed.Add(1)
		if p.logger.Enabled(context.Background(), slog.LevelDebug) {
			p.logger.Debug("job completed", attrs()...)
		}
	case jobRetryable:
		p.retried.Add(1)
		p.logger.Warn("job failed; will retry", attrs("retry_in", res.Delay.Round(time.Second), "err", err)...)
	case jobDiscarded:
		p.discarded.Add(1)
		p.logger.Error("job discarded", attrs("max_attempts", job.MaxAttempts, "err", err)...)
	}
	return res
}

// deliveryAttempt is what one attempt leaves for the panel, and what its
// answer said of the receiver.
type deliveryAttempt struct {
	Duration        time.Duration
	StatusCode      int // 0: no answer
	Error           string
	ResponseExcerpt string
	// DedupWindow is the receiver's dedup window a 2xx answer advertised
	// (webhook-dedup-window); 0: none, and the endpoint's stays as it is.
	DedupWindow time.Duration
	// Hold is how long the answer asked the whole endpoint to wait (a 429
	// or 503 with Retry-After); 0: no hold.
	Hold time.Duration
	// Class is what the attempt counts as in outbox.delivery_stats;
	// classNone (no request was made) counts nothing.
	Class attemptClass
	// CommitTo2xx is, for a success, the time from the event's commit to
	// this answer: its first 2xx, as a job succeeds once.
	CommitTo2xx time.Duration
}

// attemptClass is what one attempt counts as in outbox.delivery_stats
// (schema.sql lists the classes).
type attemptClass uint8

const (
	classNone       attemptClass = iota // no request was made: not counted
	classSuccess                        // a 2xx, or a mail sent
	classTimeout                        // no answer in time
	class4xx                            // a 4xx answer
	class5xx                            // a 5xx answer
	classConnection                     // refused, reset, DNS, TLS, the SSRF guard: no answer
	classOther                          // a 1xx or 3xx answer
)

// classifyAttempt is the class of an attempt that was made: status is
// the answer's status code (0: none came), err the transport's error.
func classifyAttempt(status int, err error) attemptClass {
	switch {
	case status >= 200 && status <= 299:
		return classSuccess
	case status >= 400 && status <= 499:
		return class4xx
	case status >= 500 && status <= 599:
		return class5xx
	case status != 0:
		return classOther
	case err == nil:
		return classSuccess // no status and no error: a mail sent
	}
	var netErr interface{ Timeout() bool }
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) {
		return classTimeout
	}
	return classConnection
}

// completeBatchMax bounds one outcome statement.
const completeBatchMax = 500

// completeLoop writes outcomes as they come, as many per statement as are
// waiting, until results is closed.
func (p *workerPool) completeLoop() {
	for first := range p.results {
		batch := []jobResult{first}
	more:
		for len(batch) < completeBatchMax {
			select {
			case r, ok := <-p.results:
				if !ok {
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		began := time.Now()
		err := p.recordOutcomesRetrying(batch)
		if err != nil {
			// The jobs stay running; the rescuer retries them. A duplicate
			// run is the price, never a lost job.
			p.logger.Error("record job outcomes failed; the rescuer will retry these jobs", "jobs", len(batch), "err", err)
		} else if slices.ContainsFunc(batch, func(r jobResult) bool { return r.wakeOnOutcome }) {
			poke(p.recorded)
		}
		// Counted last: once a batch shows in them, its poke is done.
		p.outcomeBatches.Observe(time.Since(began).Seconds())
		p.outcomeJobs.Add(int64(len(batch)))
	}
}

// recordOutcomeTries bounds the writes of one batch of outcomes,
// recordOutcomeBackoff is the wait before the second (doubling after), and
// recordOutcomeTimeout bounds them all together.
const (
	recordOutcomeTries   = 4
	recordOutcomeBackoff = 50 * time.Millisecond
	recordOutcomeTimeout = 30 * time.Second
)

// recordOutcomesRetrying writes a batch of outcomes, trying again after a
// failure that says nothing about the rows (a connection the database
// killed since its last use, a restart). Writing again is safe: outcomes
// are fenced on the attempt, attempt records are inserted ON CONFLICT DO
// NOTHING, and endpoint states are set, not toggled, so a commit whose
// answer was lost changes nothing the second time. Giving up at once left
// the jobs running until the rescuer ran them again: a delivery repeated
// for nothing.
//
// It has a context of its own: at shutdown the loops' context is gone, and
// these are the last writes that matter. One deadline covers every try, so
// a database that does not answer holds the workers (and a shutdown) up
// for recordOutcomeTimeout, not that many times over.
func (p *workerPool) recordOutcomesRetrying(batch []jobResult) error {
	ctx, cancel := context.WithTimeout(context.Background(), recordOutcomeTimeout)
	defer cancel()
	wait := recordOutcomeBackoff
	for try := 1; ; try++ {
		err := p.recordOutcomes(ctx, batch)
		if err == nil || isRowFault(err) || ctx.Err() != nil || try == recordOutcomeTries {
			return err
		}
		p.logger.Warn("record job outcomes failed; trying again", "jobs", len(batch), "try", try, "err", err)
		pause := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			pause.Stop()
			return err
		case <-pause.C:
		}
		wait *= 2
	}
}

// recordOutcomesSQL writes a batch of outcomes in one statement. Each row
// is fenced on (id, attempt, running): an outcome of an attempt that is no
// longer the job's current one changes nothing. It returns a row for every
// job it wrote, with the ordered lane whose delivery finished, if any
// (NULLs otherwise: for unordered endpoints, and for retries).
//
// A delivery that completes keeps its attempt's status code and duration
// on the job ($6, $7; -1 for none: an attempt not kept on its job,
// jobResult.keptOnJob, or a mail's status) instead of a row in
// outbox.deliveries (schema.sql, outbox.jobs).
const recordOutcomesSQL = `
WITH recorded AS (
UPDATE outbox.jobs AS j
SET state = o.state::outbox.job_state,
    scheduled_at = CASE WHEN o.state = 'retryable'
                        THEN now() + o.delay_ms * interval '1 millisecond'
                        ELSE j.scheduled_at END,
    finalized_at = CASE WHEN o.state IN ('completed', 'discarded') THEN now() END,
    errors = CASE WHEN o.error = '' THEN j.errors
                  ELSE j.errors || jsonb_build_array(jsonb_build_object(
                         'attempt', j.attempt, 'at', now(), 'error', o.error))
             END,
    status_code = CASE WHEN o.state = 'completed' THEN nullif(o.status_code, -1) ELSE j.status_code END,
    duration_ms = CASE WHEN o.state = 'completed' THEN nullif(o.duration_ms, -1) ELSE j.duration_ms END
FROM unnest($1::bigint[], $2::integer[], $3::text[], $4::bigint[], $5::text[], $6::integer[], $7::integer[])
     AS o(id, attempt, state, delay_ms, error, status_code, duration_ms)
WHERE j.id = o.id
  AND j.attempt = o.attempt
  AND j.state = 'running'
RETURNING j.id, j.attempt, j.endpoint_id, j.lane_key, j.state
)
SELECT id, attempt,
       CASE WHEN lane_key IS NOT NULL AND state IN ('completed', 'discarded') THEN endpoint_id END,
       CASE WHEN state IN ('completed', 'discarded') THEN lane_key END
FROM recorded`

// recordOutcomes writes a batch of outcomes, with the attempts they record
// and their endpoints' new states, in one transaction: one commit for the
// whole batch.
func (p *workerPool) recordOutcomes(ctx context.Context, batch []jobResult) error {
	ids := make([]int64, 0, len(batch))
	attempts := make([]int64, 0, len(batch))
	states := make([]string, 0, len(batch))
	delays := make([]int64, 0, len(batch))
	errs := make([]string, 0, len(batch))
	statuses := make([]int64, 0, len(batch))
	durations := make([]int64, 0, len(batch))
	for _, r := range batch {
		if r.State == "" {
			continue
		}
		ids = append(ids, r.ID)
		attempts = append(attempts, int64(r.Attempt))
		states = append(states, string(r.State))
		delays = append(delays, r.Delay.Milliseconds())
		errs = append(errs, r.Error)
		status, duration := int64(-1), int64(-1)
		if r.keptOnJob() {
			duration = r.record.Duration.Milliseconds()
			if r.record.StatusCode != 0 {
				status = int64(r.record.StatusCode)
			}
		}
		statuses = append(statuses, status)
		durations = append(durations, duration)
	}
	tx, err := beginPipelineTx(ctx, p.db)
	if err != nil {
		return fmt.Errorf("record %d job outcomes: %w", len(ids), err)
	}
	defer tx.Rollback()
	var stats []any                 // deliveryStatsArgs, written with the attempts
	var written map[jobAttempt]bool // the attempts whose outcome the jobs took
	if len(ids) > 0 {
		recorded, err := queryAll(ctx, tx, scanRecordedOutcome, recordOutcomesSQL,
			pq.Array(ids), pq.Array(attempts), pq.Array(states), pq.Array(delays), pq.Array(errs),
			pq.Array(statuses), pq.Array(durations))
		if err != nil {
			return fmt.Errorf("record %d job outcomes: %w", len(ids), err)
		}
		finished := make([]finishedLane, len(recorded))
		written = make(map[jobAttempt]bool, len(recorded))
		for i, r := range recorded {
			finished[i], written[r.jobAttempt] = r.lane, true
		}
		// An ordered lane whose active delivery finished lets its next one
		// go, in this transaction: never a moment with the lane held and
		// nothing running.
		if err := advanceLanesHolding(ctx, tx, finishedLanes(finished), false); err != nil {
			return fmt.Errorf("record %d job outcomes: %w", len(ids), err)
		}
		stats = deliveryStatsArgs(batch, written)
	}
	if err := writeAttemptRecords(ctx, tx, batch, written, stats, p.cfg.BreakerThreshold); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("record %d job outcomes: %w", len(ids), err)
	}
	return nil
}

// finishedLane is the lane of a job that left it, finished or put back:
// a row of recordOutcomesSQL, or of the statements putBack and a replay's
// cancel run. Both are NULL for a job of no ordered lane.
type finishedLane struct {
	endpointID sql.NullInt64
	key        sql.NullString
}

func scanFinishedLane(row rowScanner) (finishedLane, error) {
	var l finishedLane
	err := row.Scan(&l.endpointID, &l.key)
	return l, err
}

// recordedOutcome is a row of recordOutcomesSQL: a job whose outcome was
// written, and the lane it finished, if any.
type recordedOutcome struct {
	jobAttempt
	lane finishedLane
}

// jobAttempt names one attempt of one job.
type jobAttempt struct {
	id      int64
	attempt int
}

func scanRecordedOutcome(row rowScanner) (recordedOutcome, error) {
	var r recordedOutcome
	err := row.Scan(&r.id, &r.attempt, &r.lane.endpointID, &r.lane.key)
	return r, err
}

// finishedLanes are the ordered lanes of the rows, each once, in endpoint
// id order.
func finishedLanes(rows []finishedLane) laneKeys {
	type lane struct {
		endpointID int64
		key        string
	}
	seen := map[lane]bool{}
	var lanes []lane
	for _, r := range rows {
		l := lane{r.endpointID.Int64, r.key.String}
		if !r.endpointID.Valid || !r.key.Valid || seen[l] {
			continue
		}
		seen[l] = true
		lanes = append(lanes, l)
	}
	slices.SortFunc(lanes, func(a, b lane) int {
		return cmp.Or(cmp.Compare(a.endpointID, b.endpointID), strings.Compare(a.key, b.key))
	})
	var out laneKeys
	for _, l := range lanes {
		out.endpointIDs = append(out.endpointIDs, l.endpointID)
		out.keys = append(out.keys, l.key)
	}
	return out
}

// endpointChange is what an attempt's answer does to its endpoint.
type endpointChange int

const (
	endpointUnchanged endpointChange = iota // no request was made
	endpointSucceeded                       // clears failing_since and the failure count
	endpointFailed                          // sets failing_since if unset, counts a failure
	endpointGone                            // 410: disables the endpoint
)

// endpointGoneReason is disabled_reason after a receiver answered 410 Gone.
const endpointGoneReason = "the receiver answered 410 Gone"

// endpointGoneSQL disables the endpoints whose receiver answered 410.
const endpointGoneSQL = `
UPDATE outbox.endpoints
SET disabled_at = now(),
    disabled_reason = '` + endpointGoneReason + `',
    disabled_cause = 'gone',
    failing_since = coalesce(failing_since, now())
WHERE id = ANY($1::bigint[])
  AND disabled_at IS NULL`

// endpointHealthSQL moves each endpoint by what a batch's attempts to it
// did: $2 says whether one of them succeeded, $3 how many failed after the
// last success (or at all, without one), $4 the longest hold an answer
// asked for, in milliseconds. A success restarts the count of consecutive
// failures; the count reaching $5, the breaker threshold, opens the
// breaker, and a success closes it. failing_since is set by the first
// failure after a success and cleared by a success. A hold only ever
// extends held_until. The WHERE skips the write when nothing changes, so a
// healthy endpoint's row is not rewritten on every delivery.
const endpointHealthSQL = `
UPDATE outbox.endpoints AS ep
SET consecutive_failures = h.failures + CASE WHEN h.succeeded THEN 0 ELSE ep.consecutive_failures END,
    breaker_opened_at = CASE
      WHEN h.failures + CASE WHEN h.succeeded THEN 0 ELSE ep.consecutive_failures END >= $5
      THEN coalesce(ep.breaker_opened_at, now())
    END,
    failing_since = CASE
      WHEN h.failures = 0 THEN NULL
      WHEN h.succeeded THEN now()
      ELSE coalesce(ep.failing_since, now())
    END,
    held_until = CASE
      WHEN h.hold_ms > 0 THEN greatest(ep.held_until, now() + h.hold_ms * interval '1 millisecond')
      ELSE ep.held_until
    END
FROM unnest($1::bigint[], $2::boolean[], $3::integer[], $4::bigint[]) AS h(id, succeeded, failures, hold_ms)
WHERE ep.id = h.id
  AND (h.failures > 0 OR h.hold_ms > 0
       OR ep.consecutive_failures > 0 OR ep.failing_since IS NOT NULL OR ep.breaker_opened_at IS NOT NULL)`

// endpointHealth is what a batch's attempts did to one endpoint, in
// completion order: endpointHealthSQL's row.
type endpointHealth struct {
	succeeded bool          // an attempt succeeded
	failures  int           // attempts failed after the last success (or at all)
	hold      time.Duration // the longest hold asked for
}

// add counts one attempt's change.
func (h *endpointHealth) add(change endpointChange, hold time.Duration) {
	switch change {
	case endpointSucceeded:
		h.succeeded, h.failures = true, 0
	case endpointFailed, endpointGone:
		h.failures++
	}
	h.hold = max(h.hold, hold)
}

// endpointDedupWindowSQL keeps the dedup window each endpoint's receiver
// last advertised. A window unchanged is written at most hourly, to say
// it is still advertised without rewriting the row on every delivery.
const endpointDedupWindowSQL = `
UPDATE outbox.endpoints AS ep
SET dedup_window_seconds = w.seconds,
    dedup_window_seen_at = now()
FROM unnest($1::bigint[], $2::bigint[]) AS w(id, seconds)
WHERE ep.id = w.id
  AND (ep.dedup_window_seconds IS DISTINCT FROM w.seconds
       OR ep.dedup_window_seen_at < now() - interval '1 hour')`

// attemptRecord is what one attempt leaves behind: its row in
// outbox.deliveries and its effect on the endpoint. The handler fills it
// in; the completer writes it in the transaction that records the job's
// outcome (writeAttemptRecords), so a job's state, its attempt and its
// endpoint's state are never seen apart, and a delivery costs no commit
// of its own.
type attemptRecord struct {
	deliveryAttempt
	EndpointID int64
	Change     endpointChange
	// At is when the attempt ended: its minute in outbox.delivery_stats.
	// It is this process's clock, as CommitTo2xx is; outboxd reads
	// minutes, so replicas' clocks need agree only to seconds.
	At  time.Time
	set bool
}

// insertDeliveriesSQL keeps a batch of attempts. An attempt is recorded
// once; a rescued attempt's late worker records under its own number.
const insertDeliveriesSQL = `
INSERT INTO outbox.deliveries (job_id, attempt, endpoint_id, duration_ms, status_code, error, response_excerpt)
SELECT a.job_id, a.attempt, nullif(a.endpoint_id, 0), a.duration_ms, nullif(a.status_code, 0), a.error, a.excerpt
FROM unnest($1::bigint[], $2::integer[], $3::bigint[], $4::integer[], $5::integer[], $6::text[], $7::text[])
     AS a(job_id, attempt, endpoint_id, duration_ms, status_code, error, excerpt)
ON CONFLICT (job_id, attempt) DO NOTHING`

// writeAttemptRecords writes a batch's attempts, and its statistics (stats:
// deliveryStatsArgs, nil for none) in the same statement, and moves each
// endpoint to the state its attempts in the batch left it in. A success
// whose outcome its job took (written) is on the job, not a row of its
// own: only the other attempts are rows of outbox.deliveries. Statistics
// rows before the endpoints' rows: every completer locks them in that
// order. One statement for attempts and statistics, not two: the
// completer's transaction is most of a delivery's bookkeeping, and under
// load each round trip of it costs milliseconds that every job it records
// waits for (README, "Against River").
func writeAttemptRecords(ctx context.Context, tx *sql.Tx, batch []jobResult, written map[jobAttempt]bool, stats []any, breakerThreshold int) error {
	var jobIDs, endpointIDs []int64
	var attempts, durations, statuses []int64
	var errs, excerpts []string
	health := map[int64]*endpointHealth{} // batch order is completion order
	var gone []int64
	windows := map[int64]time.Duration{}
	for _, r := range batch {
		rec := r.record
		if rec == nil {
			continue
		}
		if !r.keptOnJob() || !written[jobAttempt{r.ID, r.Attempt}] {
			jobIDs = append(jobIDs, r.ID)
			attempts = append(attempts, int64(r.Attempt))
			endpointIDs = append(endpointIDs, rec.EndpointID)
			durations = append(durations, rec.Duration.Milliseconds())
			statuses = append(statuses, int64(rec.StatusCode))
			errs = append(errs, rec.Error)
			excerpts = append(excerpts, rec.ResponseExcerpt)
		}
		if rec.EndpointID != 0 && (rec.Change != endpointUnchanged || rec.Hold > 0) {
			h := health[rec.EndpointID]
			if h == nil {
				h = new(endpointHealth)
				health[rec.EndpointID] = h
			}
			h.add(rec.Change, rec.Hold)
		}
		if rec.EndpointID != 0 && rec.Change == endpointGone {
			gone = append(gone, rec.EndpointID)
		}
		if rec.EndpointID != 0 && rec.DedupWindow > 0 {
			windows[rec.EndpointID] = rec.DedupWindow
		}
	}
	if len(jobIDs) > 0 || stats != nil {
		query, args := insertDeliveriesSQL, []any{pq.Array(jobIDs), pq.Array(attempts), pq.Array(endpointIDs),
			pq.Array(durations), pq.Array(statuses), pq.Array(errs), pq.Array(excerpts)}
		if stats != nil {
			query, args = insertDeliveriesWithStatsSQL, append(args, stats...)
		}
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("record webhook attempts: %w", err)
		}
	}
	for _, id := range gone {
		// Disabled below, with failing_since, in one change: one
		// "disabled" notification, not a "failing" one first.
		delete(health, id)
	}
	if err := writeEndpointHealth(ctx, tx, health, breakerThreshold); err != nil {
		return err
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		if _, err := tx.ExecContext(ctx, endpointGoneSQL, pq.Array(gone)); err != nil {
			return fmt.Errorf("record webhook attempts: disable gone endpoints: %w", err)
		}
	}
	return writeDedupWindows(ctx, tx, windows)
}

// insertDeliveriesWithStatsSQL is insertDeliveriesSQL ($1..$7) with the
// statistics of the same attempts added to outbox.delivery_stats in the
// same statement: one row per endpoint and minute ($8 the endpoint ids,
// $9 the minutes as Unix seconds, $10..$16 the counters, $17 the rows'
// latency_buckets arrays end to end, $18 (statsBuckets) apiece). The rows
// go in (endpoint, minute) order, the order the completer sorted them in,
// so two completers adding to the same rows lock them in the same order
// and wait rather than deadlock.
const insertDeliveriesWithStatsSQL = `
WITH kept AS (` + insertDeliveriesSQL + `
)
INSERT INTO outbox.delivery_stats AS s (endpoint_id, minute, attempts, successes, failed_timeout,
                                        failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
SELECT r.endpoint_id, to_timestamp(r.minute), r.attempts, r.successes, r.failed_timeout,
       r.failed_4xx, r.failed_5xx, r.failed_connection, r.failed_other,
       ($17::bigint[])[(r.n - 1) * $18 + 1 : r.n * $18]
FROM unnest($8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[],
            $15::bigint[], $16::bigint[])
     WITH ORDINALITY AS r(endpoint_id, minute, attempts, successes, failed_timeout,
                          failed_4xx, failed_5xx, failed_connection, failed_other, n)
ORDER BY r.endpoint_id, r.minute
ON CONFLICT (endpoint_id, minute) DO UPDATE
SET attempts = s.attempts + EXCLUDED.attempts,
    successes = s.successes + EXCLUDED.successes,
    failed_timeout = s.failed_timeout + EXCLUDED.failed_timeout,
    failed_4xx = s.failed_4xx + EXCLUDED.failed_4xx,
    failed_5xx = s.failed_5xx + EXCLUDED.failed_5xx,
    failed_connection = s.failed_connection + EXCLUDED.failed_connection,
    failed_other = s.failed_other + EXCLUDED.failed_other,
    latency_buckets = ARRAY(
      SELECT a + b
      FROM unnest(s.latency_buckets, EXCLUDED.latency_buckets) WITH ORDINALITY AS t(a, b, i)
      ORDER BY i
    )`

// statsKey is a row of outbox.delivery_stats: an endpoint and a minute
// (Unix seconds of its start).
type statsKey struct {
	endpointID int64
	minute     int64
}

// deliveryStatsArgs are insertDeliveriesWithStatsSQL's $8..$18 for the attempts
// of a batch whose outcomes were written (written: the recordOutcomesSQL
// rows), nil if none counts: a row per endpoint and minute. An attempt
// whose outcome the fence refused (a worker that lost its job to the
// rescuer, or this batch written again after its commit's answer was
// lost) counts nothing: each attempt counts once, with the outcome its
// job kept.
func deliveryStatsArgs(batch []jobResult, written map[jobAttempt]bool) []any {
	type row struct {
		statsCounts
		latency latencyCounts
	}
	rows := map[statsKey]*row{}
	for _, r := range batch {
		rec := r.record
		if rec == nil || rec.EndpointID == 0 || rec.Class == classNone || !written[jobAttempt{r.ID, r.Attempt}] {
			continue
		}
		k := statsKey{rec.EndpointID, rec.At.Truncate(time.Minute).Unix()}
		w := rows[k]
		if w == nil {
			w = new(row)
			rows[k] = w
		}
		w.Attempts++
		c := &w.FailuresByClass
		switch rec.Class {
		case classSuccess:
			w.Successes++
			w.latency[latencyBucket(rec.CommitTo2xx)]++
		case classTimeout:
			c.Timeout++
		case class4xx:
			c.Status4xx++
		case class5xx:
			c.Status5xx++
		case classConnection:
			c.Connection++
		default:
			c.Other++
		}
	}
	if len(rows) == 0 {
		return nil
	}
	keys := slices.SortedFunc(maps.Keys(rows), func(a, b statsKey) int {
		return cmp.Or(cmp.Compare(a.endpointID, b.endpointID), cmp.Compare(a.minute, b.minute))
	})
	n := len(keys)
	ids, minutes := make([]int64, n), make([]int64, n)
	attempts, successes := make([]int64, n), make([]int64, n)
	timeouts, s4xx, s5xx, conns, others := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	latency := make([]int64, 0, n*statsBuckets)
	for i, k := range keys {
		w := rows[k]
		ids[i], minutes[i] = k.endpointID, k.minute
		attempts[i], successes[i] = w.Attempts, w.Successes
		c := w.FailuresByClass
		timeouts[i], s4xx[i], s5xx[i], conns[i], others[i] = c.Timeout, c.Status4xx, c.Status5xx, c.Connection, c.Other
		latency = append(latency, w.latency[:]...)
	}
	return []any{pq.Array(ids), pq.Array(minutes), pq.Array(attempts),
		pq.Array(successes), pq.Array(timeouts), pq.Array(s4xx), pq.Array(s5xx), pq.Array(conns), pq.Array(others),
		pq.Array(latency), statsBuckets}
}

// writeEndpointHealth moves each endpoint by what its attempts did, in
// endpoint id order: one lock order for every replica's completer.
func writeEndpointHealth(ctx context.Context, tx *sql.Tx, health map[int64]*endpointHealth, breakerThreshold int) error {
	if len(health) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(health))
	succeeded := make([]bool, len(ids))
	failures := make([]int64, len(ids))
	holds := make([]int64, len(ids))
	for i, id := range ids {
		h := health[id]
		succeeded[i], failures[i], holds[i] = h.succeeded, int64(h.failures), h.hold.Milliseconds()
	}
	if _, err := tx.ExecContext(ctx, endpointHealthSQL, pq.Array(ids), pq.Array(succeeded), pq.Array(failures), pq.Array(holds), breakerThreshold); err != nil {
		return fmt.Errorf("record webhook attempts: endpoint state: %w", err)
	}
	return nil
}

// writeDedupWindows keeps the dedup windows a batch's 2xx answers
// advertised, the last one per endpoint.
func writeDedupWindows(ctx context.Context, tx *sql.Tx, windows map[int64]time.Duration) error {
	if len(windows) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(windows))
	seconds := make([]int64, len(ids))
	for i, id := range ids {
		seconds[i] = int64(windows[id] / time.Second)
	}
	if _, err := tx.ExecContext(ctx, endpointDedupWindowSQL, pq.Array(ids), pq.Array(seconds)); err != nil {
		return fmt.Errorf("record webhook attempts: receivers' dedup windows: %w", err)
	}
	return nil
}

// recordAttempt leaves what an attempt did on its job, for the completer
// to write with the job's outcome (writeAttemptRecords).
func (j Job) recordAttempt(a deliveryAttempt, change endpointChange) {
	if j.attempt == nil {
		return // not run by a worker pool: nobody would write it
	}
	*j.attempt = attemptRecord{deliveryAttempt: a, EndpointID: j.EndpointID, Change: change, At: time.Now(), set: true}
}
