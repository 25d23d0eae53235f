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
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
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
// the job, with its outcome (jobOutcomesSQL), and it has no row in
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

// attemptClassNames are the classes as outbox.record_outcomes counts them
// (attemptsAndStatsSQL).
var attemptClassNames = [...]string{
	classNone: "none", classSuccess: "success", classTimeout: "timeout", class4xx: "4xx",
	class5xx: "5xx", classConnection: "connection", classOther: "other",
}

func (c attemptClass) String() string { return attemptClassNames[c] }

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

// completeLinger is how long the completer waits for more outcomes to join
// a batch whose deliveries have all succeeded and already freed their
// places (jobResult.freesItsPlace). A statement of outcomes costs about
// the same for one job as for ten, and at a steady rate of a few hundred
// deliveries a second each came alone: one statement a delivery, a third
// of the database's time per event (README, "Performance"). Nothing waits
// for such a batch: the receiver has its answer, the endpoint's place is
// free, and no claim is woken by it. Any other outcome (a failure, a hold,
// an ordered lane's head) is written at once, with whatever waits with it.
const completeLinger = 10 * time.Millisecond

// completeLoop writes outcomes in batches (gatherOutcomes) until results
// is closed.
func (p *workerPool) completeLoop() {
	for first := range p.results {
		batch := p.gatherOutcomes(first)
		began := time.Now()
		err := p.recordOutcomesRetrying(batch)
		p.answered.remove(batch)
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

// gatherOutcomes is the batch that starts with first: every outcome
// waiting behind it, and, while every one of them may wait
// (mayWaitForBatch), those that come within the pool's outcomeLinger, up
// to completeBatchMax. It returns early when results is closed.
func (p *workerPool) gatherOutcomes(first jobResult) []jobResult {
	batch := []jobResult{first}
	mayWait := first.mayWaitForBatch()
	var linger <-chan time.Time // started when the batch first has to wait
	for len(batch) < completeBatchMax {
		var r jobResult
		var ok bool
		select {
		case r, ok = <-p.results:
		default:
			if !mayWait {
				return batch
			}
			if linger == nil {
				timer := time.NewTimer(p.outcomeLinger)
				defer timer.Stop()
				linger = timer.C
			}
			select {
			case r, ok = <-p.results:
			case <-linger:
				return batch
			}
		}
		if !ok {
			return batch
		}
		batch = append(batch, r)
		mayWait = mayWait && r.mayWaitForBatch()
	}
	return batch
}

// mayWaitForBatch says that nothing waits for this outcome's write: a
// delivery that succeeded, freed its place when it ended, and wakes no
// claim when written.
func (r jobResult) mayWaitForBatch() bool {
	return r.freesItsPlace() && !r.wakeOnOutcome
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

// recordOutcomesSQL writes a batch of outcomes with everything they
// record, in one statement: outbox.record_outcomes
// (recordOutcomesFunctionSQL), whose arguments recordOutcomesArgs builds.
// One statement is one round trip and one commit: the completer's
// transaction is most of a delivery's bookkeeping, and under load each
// round trip of it cost milliseconds that every job it records waited for
// (README, "Against River"), six of them when it was a transaction of
// statements.
const recordOutcomesSQL = `SELECT outbox.record_outcomes(` +
	`$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, ` +
	`$19, $20, $21, $22, $23, $24, $25, $26, $27)`

// recordOutcomesFunctionSQL defines outbox.record_outcomes, the
// completer's transaction as one PL/pgSQL function, which keeps its
// statements' plans for the session. It runs, in this order (every
// completer locks rows in it, so two of them wait rather than deadlock):
//
//  1. jobOutcomesSQL: the jobs' outcomes, fenced on their attempts;
//  2. outbox.advance_lanes for the ordered lanes whose delivery finished,
//     in the same transaction: never a moment with a lane held and
//     nothing running;
//  3. attemptsAndStatsSQL: the attempts not kept on their jobs, and the
//     statistics of those whose outcome the jobs took;
//  4. endpointHealthSQL, endpointGoneSQL and endpointDedupWindowSQL: the
//     endpoints, in id order.
//
// Its commit does not wait for the WAL to reach the disk, as every
// pipeline transaction's (beginPipelineTx says why that loses nothing).
// The migration applies it after schema.sql, in the same transaction
// (newMigration). Its parameters are named in_*, its variables written_*
// and lane_*, so that no name in a statement can be taken for one of
// them.
var recordOutcomesFunctionSQL = `
DROP FUNCTION IF EXISTS outbox.record_outcomes(bigint[], integer[], text[], bigint[], text[], integer[], integer[],
  bigint[], integer[], bigint[], integer[], integer[], text[], text[], boolean[], text[], bigint[], integer[], integer,
  bigint[], boolean[], integer[], bigint[], integer, bigint[], bigint[], bigint[]);
CREATE FUNCTION outbox.record_outcomes(
  -- the outcomes, one per job: jobOutcomesSQL
  in_ids bigint[], in_attempts integer[], in_states text[], in_delays bigint[], in_errors text[],
  in_statuses integer[], in_durations integer[],
  -- the attempts, one per attempt made: attemptsAndStatsSQL
  in_attempt_job_ids bigint[], in_attempt_numbers integer[], in_attempt_endpoints bigint[],
  in_attempt_durations integer[], in_attempt_statuses integer[], in_attempt_errors text[],
  in_attempt_excerpts text[], in_attempt_kept boolean[], in_attempt_classes text[],
  in_attempt_minutes bigint[], in_attempt_buckets integer[], in_buckets integer,
  -- the endpoints: endpointHealthSQL, endpointGoneSQL, endpointDedupWindowSQL
  in_health_ids bigint[], in_health_succeeded boolean[], in_health_failures integer[], in_health_holds bigint[],
  in_breaker_threshold integer, in_gone_ids bigint[], in_window_ids bigint[], in_window_seconds bigint[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $record_outcomes$
DECLARE
  written_ids bigint[];
  written_attempts integer[];
  lane_endpoints bigint[];
  lane_keys text[];
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
` + jobOutcomesSQL + `;
  IF lane_endpoints IS NOT NULL THEN
    PERFORM outbox.advance_lanes(lane_endpoints, lane_keys, false);
  END IF;
` + attemptsAndStatsSQL + `;
  IF cardinality(in_health_ids) > 0 THEN
` + endpointHealthSQL + `;
  END IF;
  IF cardinality(in_gone_ids) > 0 THEN
` + endpointGoneSQL + `;
  END IF;
  IF cardinality(in_window_ids) > 0 THEN
` + endpointDedupWindowSQL + `;
  END IF;
END
$record_outcomes$;
`

// jobOutcomesSQL writes the outcomes. Each row is fenced on (id, attempt,
// running): an outcome of an attempt that is no longer the job's current
// one changes nothing. It keeps the attempts it wrote (written_*), and the
// ordered lanes whose delivery finished (lane_*, each once; NULL for none).
//
// A delivery that completes keeps its attempt's status code and duration
// on the job (in_statuses, in_durations; -1 for none: an attempt not kept
// on its job, jobResult.keptOnJob, or a mail's status) instead of a row in
// outbox.deliveries (schema.sql, outbox.jobs).
const jobOutcomesSQL = `
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
    FROM unnest(in_ids, in_attempts, in_states, in_delays, in_errors, in_statuses, in_durations)
         AS o(id, attempt, state, delay_ms, error, status_code, duration_ms)
    WHERE j.id = o.id
      AND j.attempt = o.attempt
      AND j.state = 'running'
    RETURNING j.id, j.attempt, j.endpoint_id, j.lane_key, j.state
  ),
  finished AS (
    SELECT DISTINCT r.endpoint_id, r.lane_key
    FROM recorded AS r
    WHERE r.lane_key IS NOT NULL
      AND r.state IN ('completed', 'discarded')
  )
  SELECT (SELECT array_agg(r.id) FROM recorded AS r),
         (SELECT array_agg(r.attempt) FROM recorded AS r),
         (SELECT array_agg(f.endpoint_id ORDER BY f.endpoint_id, f.lane_key) FROM finished AS f),
         (SELECT array_agg(f.lane_key ORDER BY f.endpoint_id, f.lane_key) FROM finished AS f)
  INTO written_ids, written_attempts, lane_endpoints, lane_keys`

// attemptsAndStatsSQL keeps a batch's attempts and counts them. An attempt
// is a row of outbox.deliveries unless it is a success whose outcome its
// job took (in_attempt_kept, and written): that one is on the job. An
// attempt is recorded once; a rescued attempt's late worker records under
// its own number.
//
// The statistics count each attempt whose outcome its job took, with that
// outcome, in a row of outbox.delivery_stats per endpoint and minute
// (in_attempt_minutes, Unix seconds of its start). An attempt the fence
// refused (a worker that lost its job to the rescuer, or this batch
// written again after its commit's answer was lost) counts nothing, and
// one that made no request (class 'none') neither. A success adds one to
// its latency bucket (in_attempt_buckets, 0-based, of in_buckets). The rows
// go in (endpoint, minute) order, so two completers adding to the same rows
// lock them in the same order.
const attemptsAndStatsSQL = `
  WITH attempt AS (
    SELECT a.*, w.id IS NOT NULL AS written
    FROM unnest(in_attempt_job_ids, in_attempt_numbers, in_attempt_endpoints, in_attempt_durations,
                in_attempt_statuses, in_attempt_errors, in_attempt_excerpts, in_attempt_kept,
                in_attempt_classes, in_attempt_minutes, in_attempt_buckets)
         AS a(job_id, attempt, endpoint_id, duration_ms, status_code, error, excerpt, kept, class, minute, bucket)
    LEFT JOIN unnest(written_ids, written_attempts) AS w(id, attempt)
      ON w.id = a.job_id AND w.attempt = a.attempt
  ),
  kept AS (
    INSERT INTO outbox.deliveries (job_id, attempt, endpoint_id, duration_ms, status_code, error, response_excerpt)
    SELECT a.job_id, a.attempt, nullif(a.endpoint_id, 0), a.duration_ms, nullif(a.status_code, 0), a.error, a.excerpt
    FROM attempt AS a
    WHERE NOT (a.kept AND a.written)
    ON CONFLICT (job_id, attempt) DO NOTHING
  ),
  counted AS (
    SELECT a.endpoint_id, a.minute,
           count(*) AS attempts,
           count(*) FILTER (WHERE a.class = 'success') AS successes,
           count(*) FILTER (WHERE a.class = 'timeout') AS failed_timeout,
           count(*) FILTER (WHERE a.class = '4xx') AS failed_4xx,
           count(*) FILTER (WHERE a.class = '5xx') AS failed_5xx,
           count(*) FILTER (WHERE a.class = 'connection') AS failed_connection,
           count(*) FILTER (WHERE a.class = 'other') AS failed_other,
           array_agg(a.bucket) FILTER (WHERE a.class = 'success') AS buckets
    FROM attempt AS a
    WHERE a.written
      AND a.endpoint_id <> 0
      AND a.class <> 'none'
    GROUP BY a.endpoint_id, a.minute
  )
  INSERT INTO outbox.delivery_stats AS s (endpoint_id, minute, attempts, successes, failed_timeout,
                                          failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
  SELECT c.endpoint_id, to_timestamp(c.minute), c.attempts, c.successes, c.failed_timeout,
         c.failed_4xx, c.failed_5xx, c.failed_connection, c.failed_other,
         ARRAY(
           SELECT count(b.bucket)
           FROM generate_series(0, in_buckets - 1) AS g(bucket)
           LEFT JOIN unnest(c.buckets) AS b(bucket) ON b.bucket = g.bucket
           GROUP BY g.bucket
           ORDER BY g.bucket
         )
  FROM counted AS c
  ORDER BY c.endpoint_id, c.minute
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

// recordOutcomes writes a batch of outcomes, with the attempts they record
// and their endpoints' new states, in one statement (recordOutcomesSQL).
func (p *workerPool) recordOutcomes(ctx context.Context, batch []jobResult) error {
	return writeOutcomes(ctx, p.db, batch, p.cfg.BreakerThreshold)
}

// writeOutcomes is recordOutcomes on a database with a breaker threshold.
func writeOutcomes(ctx context.Context, db *sql.DB, batch []jobResult, breakerThreshold int) error {
	if _, err := db.ExecContext(ctx, recordOutcomesSQL, recordOutcomesArgs(batch, breakerThreshold)...); err != nil {
		return fmt.Errorf("record %d job outcomes: %w", len(batch), err)
	}
	return nil
}

// recordOutcomesArgs are outbox.record_outcomes' arguments for a batch,
// in its parameters' order.
func recordOutcomesArgs(batch []jobResult, breakerThreshold int) []any {
	var (
		ids, attempts, delays, statuses, durations []int64
		states, errs                               []string

		attemptJobIDs, attemptNumbers, attemptEndpoints, attemptDurations []int64
		attemptStatuses, attemptMinutes, attemptBuckets                   []int64
		attemptErrs, attemptExcerpts, attemptClasses                      []string
		attemptKept                                                       []bool
	)
	health := map[int64]*endpointHealth{} // batch order is completion order
	var gone []int64
	windows := map[int64]time.Duration{}
	for _, r := range batch {
		if r.State != "" {
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
		rec := r.record
		if rec == nil {
			continue
		}
		attemptJobIDs = append(attemptJobIDs, r.ID)
		attemptNumbers = append(attemptNumbers, int64(r.Attempt))
		attemptEndpoints = append(attemptEndpoints, rec.EndpointID)
		attemptDurations = append(attemptDurations, rec.Duration.Milliseconds())
		attemptStatuses = append(attemptStatuses, int64(rec.StatusCode))
		attemptErrs = append(attemptErrs, rec.Error)
		attemptExcerpts = append(attemptExcerpts, rec.ResponseExcerpt)
		attemptKept = append(attemptKept, r.keptOnJob())
		attemptClasses = append(attemptClasses, rec.Class.String())
		attemptMinutes = append(attemptMinutes, rec.At.Truncate(time.Minute).Unix())
		attemptBuckets = append(attemptBuckets, int64(latencyBucket(rec.CommitTo2xx)))
		if rec.EndpointID == 0 {
			continue
		}
		if rec.Change != endpointUnchanged || rec.Hold > 0 {
			h := health[rec.EndpointID]
			if h == nil {
				h = new(endpointHealth)
				health[rec.EndpointID] = h
			}
			h.add(rec.Change, rec.Hold)
		}
		if rec.Change == endpointGone {
			gone = append(gone, rec.EndpointID)
		}
		if rec.DedupWindow > 0 {
			windows[rec.EndpointID] = rec.DedupWindow
		}
	}
	for _, id := range gone {
		// Disabled by endpointGoneSQL, with failing_since, in one change:
		// one "disabled" notification, not a "failing" one first.
		delete(health, id)
	}
	slices.Sort(gone)
	gone = slices.Compact(gone)

	// Endpoints in id order: one lock order for every replica's completer.
	healthIDs := slices.Sorted(maps.Keys(health))
	succeeded := make([]bool, len(healthIDs))
	failures := make([]int64, len(healthIDs))
	holds := make([]int64, len(healthIDs))
	for i, id := range healthIDs {
		h := health[id]
		succeeded[i], failures[i], holds[i] = h.succeeded, int64(h.failures), h.hold.Milliseconds()
	}
	windowIDs := slices.Sorted(maps.Keys(windows))
	seconds := make([]int64, len(windowIDs))
	for i, id := range windowIDs {
		seconds[i] = int64(windows[id] / time.Second)
	}

	return []any{
		pq.Array(ids), pq.Array(attempts), pq.Array(states), pq.Array(delays), pq.Array(errs),
		pq.Array(statuses), pq.Array(durations),
		pq.Array(attemptJobIDs), pq.Array(attemptNumbers), pq.Array(attemptEndpoints),
		pq.Array(attemptDurations), pq.Array(attemptStatuses), pq.Array(attemptErrs),
		pq.Array(attemptExcerpts), pq.Array(attemptKept), pq.Array(attemptClasses),
		pq.Array(attemptMinutes), pq.Array(attemptBuckets), statsBuckets,
		pq.Array(healthIDs), pq.Array(succeeded), pq.Array(failures), pq.Array(holds),
		breakerThreshold, pq.Array(gone), pq.Array(windowIDs), pq.Array(seconds),
	}
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
WHERE id = ANY (in_gone_ids)
  AND disabled_at IS NULL`

// endpointHealthSQL moves each endpoint by what a batch's attempts to it
// did (endpointHealth): in_health_succeeded says whether one of them
// succeeded, in_health_failures how many failed after the last success (or
// at all, without one), in_health_holds the longest hold an answer asked
// for, in milliseconds. A success restarts the count of consecutive
// failures; the count reaching in_breaker_threshold opens the breaker, and a success closes it. failing_since is set by the first
// failure after a success and cleared by a success. A hold only ever
// extends held_until. The WHERE skips the write when nothing changes, so a
// healthy endpoint's row is not rewritten on every delivery.
const endpointHealthSQL = `
UPDATE outbox.endpoints AS ep
SET consecutive_failures = h.failures + CASE WHEN h.succeeded THEN 0 ELSE ep.consecutive_failures END,
    breaker_opened_at = CASE
      WHEN h.failures + CASE WHEN h.succeeded THEN 0 ELSE ep.consecutive_failures END >= in_breaker_threshold
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
FROM unnest(in_health_ids, in_health_succeeded, in_health_failures, in_health_holds) AS h(id, succeeded, failures, hold_ms)
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
FROM unnest(in_window_ids, in_window_seconds) AS w(id, seconds)
WHERE ep.id = w.id
  AND (ep.dedup_window_seconds IS DISTINCT FROM w.seconds
       OR ep.dedup_window_seen_at < now() - interval '1 hour')`

// attemptRecord is what one attempt leaves behind: its row in
// outbox.deliveries and its effect on the endpoint. The handler fills it
// in; the completer writes it in the transaction that records the job's
// outcome (outbox.record_outcomes), so a job's state, its attempt and its
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

// recordAttempt leaves what an attempt did on its job, for the completer
// to write with the job's outcome (recordOutcomes).
func (j Job) recordAttempt(a deliveryAttempt, change endpointChange) {
	if j.attempt == nil {
		return // not run by a worker pool: nobody would write it
	}
	*j.attempt = attemptRecord{deliveryAttempt: a, EndpointID: j.EndpointID, Change: change, At: time.Now(), set: true}
}
