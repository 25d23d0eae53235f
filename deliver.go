// deliver.go: the job table's workers, which claim due jobs, run them,
// classify the outcome and record it, and the rescuer for jobs whose worker
// died.
//
// Guarantees (DESIGN.md, hops 4 and 5):
//   - No transaction is open across a job's run: a claim commits, the job
//     runs, and its outcome is recorded in a second short transaction.
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
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// WorkerConfig holds the job workers' numbers.
type WorkerConfig struct {
	// Concurrency: deliveries wait on the network, not the CPU, and the
	// more run at once the more jobs each claim and each outcome statement
	// carries. 64 lets a 2-core machine deliver as fast as 16 producers
	// commit (outboxd load, README "Performance"); 16 fell behind.
	Concurrency int
	// MaxAttempts: with attempt^4-second backoff, 18 attempts span about
	// 3.8 days, under the 5-day endpoint disable and the 7-day retention.
	MaxAttempts int
	// AttemptTimeout bounds one run of a job.
	AttemptTimeout time.Duration
	// RescueMargin is added to AttemptTimeout to decide that a running job's
	// worker is gone: a job is rescued only when no live worker can still be
	// running it.
	RescueMargin time.Duration
	// PollInterval is how often workers look for due jobs without a
	// notification: retries come due without one.
	PollInterval time.Duration
	// RescueInterval is how often the rescuer looks for stuck jobs.
	RescueInterval time.Duration
}

// Job is one claimed attempt of a job, with the event it delivers.
type Job struct {
	ID          int64
	Kind        string
	Attempt     int // this attempt's number, from 1
	MaxAttempts int
	// EndpointID is a webhook job's endpoint; 0 once the endpoint was
	// deleted (the column is set to NULL) and for every other kind.
	EndpointID int64
	// endpoint is a delivery's endpoint as the claim read it; nil when the
	// job has none or it was deleted.
	endpoint *deliveryEndpoint
	// attempt, set by runJob for kinds that keep attempt records, is where
	// the handler leaves what its attempt did; it is written in the same
	// transaction as the job's outcome.
	attempt *attemptRecord
	Event   Event
}

// deliveryEndpoint is an endpoint as one attempt sees it.
type deliveryEndpoint struct {
	URL            string
	Secrets        [][]byte // current first; the previous one during a rotation
	DisabledReason *string
}

// deliveryAttempt is what one attempt leaves for the panel.
type deliveryAttempt struct {
	Duration        time.Duration
	StatusCode      int // 0: no answer
	Error           string
	ResponseExcerpt string
}

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
}

// workerPool runs jobs: one fetch loop claims due jobs while there are free
// slots, each job runs in its own goroutine, and one completer writes their
// outcomes in batches.
type workerPool struct {
	db          *sql.DB
	cfg         WorkerConfig
	grace       time.Duration // how long in-flight jobs may finish after Run's ctx ends
	subscribers *subscriberRegistry
	// handlers run every other kind of job. A kind without one is left
	// to a process that has it (it retries meanwhile, visibly).
	handlers map[string]jobHandler
	logger   *slog.Logger

	slots     chan struct{} // one token per running job
	slotFreed chan struct{} // poked when a job finishes
	results   chan jobResult

	// Counters for /metrics, only ever incremented.
	completed atomic.Int64
	retried   atomic.Int64
	discarded atomic.Int64
}

// jobHandler runs one attempt of a job. Its error, if any, is the outcome
// decideOutcome reads: permanentError and retryAfterError steer it.
type jobHandler func(ctx context.Context, job Job) error

func newWorkerPool(db *sql.DB, cfg WorkerConfig, grace time.Duration, subs *subscriberRegistry, handlers map[string]jobHandler, logger *slog.Logger) *workerPool {
	return &workerPool{
		db:          db,
		cfg:         cfg,
		grace:       grace,
		subscribers: subs,
		handlers:    handlers,
		logger:      logger.With("loop", "workers"),
		slots:       make(chan struct{}, cfg.Concurrency),
		slotFreed:   make(chan struct{}, 1),
		results:     make(chan jobResult, cfg.Concurrency),
	}
}

// claimBatchMax bounds one claim: big enough that a backlog costs one
// round trip per many jobs, small enough to share work among replicas.
const claimBatchMax = 100

// Run claims and runs jobs until ctx ends, waking on wake and every
// PollInterval. Then it stops claiming, gives in-flight jobs the grace
// period to finish (after which their contexts are cancelled), records
// their outcomes and returns.
//
// Unlike the relay and the sweeper, whose Run repeats their once-function,
// Run overlaps claims with runs: a job runs in its own goroutine as soon as
// it is claimed, and the next claim does not wait for the slowest job of
// the last one. workOnce is the same turn done synchronously.
func (p *workerPool) Run(ctx context.Context, wake <-chan struct{}) error {
	// Jobs run under jobCtx, not ctx, so that a shutdown lets them finish.
	jobCtx, cancelJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelJobs()
	var running sync.WaitGroup
	completerDone := make(chan struct{})
	go func() {
		defer close(completerDone)
		p.completeLoop()
	}()

	poll := time.NewTicker(p.cfg.PollInterval)
	defer poll.Stop()
	moreDue := true // a claim filled every free slot: more may be waiting
	// Under load, wait for a quarter of the slots to free up before the next
	// claim, so one claim statement fetches several jobs instead of one.
	claimAtFree := max(1, cap(p.slots)/4)
	for ctx.Err() == nil {
		if free := cap(p.slots) - len(p.slots); free >= claimAtFree || (free > 0 && !moreDue) {
			jobs, err := p.claim(ctx, min(free, claimBatchMax))
			if err != nil && ctx.Err() == nil {
				p.logger.Error("claim jobs failed", "err", err)
			}
			moreDue = len(jobs) == min(free, claimBatchMax)
			for _, batch := range p.batches(jobs) {
				p.slots <- struct{}{}
				running.Go(func() {
					defer func() { <-p.slots; poke(p.slotFreed) }()
					for _, res := range p.runBatch(jobCtx, batch) {
						p.results <- res
					}
				})
			}
		}
		freed := p.slotFreed
		if !moreDue {
			freed = nil // nothing waits for a slot: don't claim on every finish
		}
		select {
		case <-ctx.Done():
		case <-wake:
		case <-poll.C:
		case <-freed:
		}
	}
	p.stop(&running, cancelJobs)
	<-completerDone
	return ctx.Err()
}

// stop waits for the jobs still running, at most the grace period, then
// cancels them, waits for them to return, and closes results, which ends
// the completer once it has written every outcome.
func (p *workerPool) stop(running *sync.WaitGroup, cancelJobs context.CancelFunc) {
	allDone := make(chan struct{})
	go func() { running.Wait(); close(allDone) }()
	select {
	case <-allDone:
	case <-time.After(p.grace):
		p.logger.Warn("grace period over; cancelling running jobs", "grace", p.grace)
		cancelJobs()
		<-allDone
	}
	close(p.results)
}

// workOnce is one turn of the workers, synchronously: claim up to n due
// jobs, run them one batch after another, and record their outcomes. It
// reports how many jobs it claimed. Tests drive the workers with it.
func (p *workerPool) workOnce(ctx context.Context, n int) (int, error) {
	jobs, err := p.claim(ctx, min(n, claimBatchMax))
	if err != nil {
		return 0, err
	}
	var results []jobResult
	for _, batch := range p.batches(jobs) {
		results = append(results, p.runBatch(ctx, batch)...)
	}
	if len(results) == 0 {
		return len(jobs), nil
	}
	return len(jobs), p.recordOutcomesRetrying(results)
}

// claimJobsSQL takes up to $1 due jobs, soonest first, marks them running
// with their next attempt number, and returns each with its event and, for
// a delivery, its endpoint. The statement is schema.sql's outbox.claim_jobs,
// which pins its plan and reads everything in one snapshot.
const claimJobsSQL = `
SELECT id, kind, attempt, max_attempts, endpoint_id,
       event_id, topic, subject, payload, created_at,
       url, secret, previous_secret, disabled_reason
FROM outbox.claim_jobs($1)`

// claim takes up to n due jobs in one statement.
func (p *workerPool) claim(ctx context.Context, n int) ([]Job, error) {
	rows, err := p.db.QueryContext(ctx, claimJobsSQL, n)
	if err != nil {
		return nil, fmt.Errorf("claim jobs: %w", err)
	}
	defer rows.Close()
	var jobs []Job
	for rows.Next() {
		var j Job
		var payload []byte
		var endpointID sql.NullInt64
		var url sql.NullString
		var secret, previous []byte
		var disabledReason *string
		if err := rows.Scan(&j.ID, &j.Kind, &j.Attempt, &j.MaxAttempts, &endpointID,
			&j.Event.ID, &j.Event.Topic, &j.Event.Subject, &payload, &j.Event.CreatedAt,
			&url, &secret, &previous, &disabledReason); err != nil {
			return nil, fmt.Errorf("claim jobs: %w", err)
		}
		j.Event.Payload = payload
		j.EndpointID = endpointID.Int64
		if url.Valid {
			j.endpoint = &deliveryEndpoint{URL: url.String, Secrets: [][]byte{secret}, DisabledReason: disabledReason}
			if previous != nil {
				j.endpoint.Secrets = append(j.endpoint.Secrets, previous)
			}
		}
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim jobs: %w", err)
	}
	return jobs, nil
}

// errCompletedInTx is what a handler's attempt reports when it already
// completed its job in its own transaction, so the completer has nothing
// to write.
var errCompletedInTx = errors.New("completed in the handler's transaction")

// batches groups claimed jobs for running: the jobs of one in-process
// subscriber run together in one transaction (runSubscriberBatch), every
// other job alone.
func (p *workerPool) batches(jobs []Job) [][]Job {
	var batches [][]Job
	bySubscriber := map[string]int{} // kind → index in batches
	for _, job := range jobs {
		if _, ok := p.subscribers.lookup(job.Kind); ok {
			if i, seen := bySubscriber[job.Kind]; seen {
				batches[i] = append(batches[i], job)
				continue
			}
			bySubscriber[job.Kind] = len(batches)
		}
		batches = append(batches, []Job{job})
	}
	return batches
}

// runBatch runs one batch of batches: a subscriber's jobs together in one
// transaction, any other job alone.
func (p *workerPool) runBatch(ctx context.Context, batch []Job) []jobResult {
	if sub, ok := p.subscribers.lookup(batch[0].Kind); ok {
		return p.runSubscriberBatch(ctx, sub, batch)
	}
	return []jobResult{p.runJob(ctx, batch[0])}
}

// runJob runs one attempt of job within AttemptTimeout and decides its
// outcome. A panic is a failed attempt, not a dead process.
func (p *workerPool) runJob(ctx context.Context, job Job) jobResult {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AttemptTimeout)
	defer cancel()
	start := time.Now()
	job.attempt = new(attemptRecord) // set by handlers that keep attempt records
	err := p.guard(job, func() error { return p.work(ctx, job) })
	if errors.Is(err, errCompletedInTx) {
		p.completed.Add(1)
		return jobResult{ID: job.ID, Attempt: job.Attempt} // nothing left to record
	}
	res := p.outcome(job, err, start)
	if job.attempt != nil && job.attempt.set {
		res.record = job.attempt
	}
	return res
}

// guard runs fn, turning a panic into the attempt's error.
func (p *workerPool) guard(job Job, fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			p.logger.Error("job panicked", "job_id", job.ID, "kind", job.Kind, "panic", v, "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	return fn()
}

// outcome decides what an attempt's error means for its job, counts it
// and logs it.
func (p *workerPool) outcome(job Job, err error, start time.Time) jobResult {
	res := jobResult{ID: job.ID, Attempt: job.Attempt}
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

// noopJobKind is a job that does nothing, so `outboxd load -mode jobs` can
// measure the job table alone: claim, run, record.
const noopJobKind = "noop"

// work dispatches a job to the handler of its kind.
func (p *workerPool) work(ctx context.Context, job Job) error {
	if job.Kind == noopJobKind {
		return nil
	}
	if handle, ok := p.handlers[job.Kind]; ok {
		return handle(ctx, job)
	}
	// Another replica (a newer version) may know this kind: retry rather
	// than discard, and the backoff makes the wait visible.
	return fmt.Errorf("no handler for job kind %q in this process", job.Kind)
}

// lockOwnJobsSQL locks the batch's jobs that are still this worker's:
// running, with the attempt number it claimed. Holding the lock keeps the
// rescuer (which skips locked rows) away until the batch commits.
const lockOwnJobsSQL = `
SELECT j.id
FROM unnest($1::bigint[], $2::integer[]) AS c(id, attempt)
JOIN outbox.jobs AS j ON j.id = c.id
                     AND j.attempt = c.attempt
                     AND j.state = 'running'
ORDER BY j.id
FOR UPDATE OF j`

// completeJobsSQL completes the batch's jobs whose effect succeeded; they
// are locked by this transaction, so no fence can have moved.
const completeJobsSQL = `
UPDATE outbox.jobs
SET state = 'completed',
    finalized_at = now()
WHERE id = ANY($1::bigint[])`

// runSubscriberBatch runs one subscriber's jobs in one transaction: lock
// the jobs still ours, handle each event, complete the ones that
// succeeded, commit once. Effects and completions commit together or not
// at all; a job lost to the rescuer meanwhile is skipped, its effect never
// made. The failed ones' outcomes go to the completer like any job's.
//
// A savepoint around each event would let a failing event roll back only
// its own effect, but costs two round trips per event. So the first try
// runs without them; only if a handler fails is that transaction rolled
// back whole and the batch run again with a savepoint per event. The
// handlers that succeeded run twice then, once in a transaction that never
// commits.
func (p *workerPool) runSubscriberBatch(ctx context.Context, sub Subscriber, jobs []Job) []jobResult {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AttemptTimeout)
	defer cancel()
	start := time.Now()
	results, err := p.subscriberTx(ctx, sub, jobs, start, false)
	if errors.Is(err, errHandlerFailed) {
		results, err = p.subscriberTx(ctx, sub, jobs, start, true)
	}
	if err != nil {
		results = make([]jobResult, 0, len(jobs))
		for _, job := range jobs {
			results = append(results, p.outcome(job, fmt.Errorf("subscriber %s: %w", sub.Name, err), start))
		}
	}
	return results
}

// errHandlerFailed is subscriberTx's answer, without savepoints, when a
// handler failed: its transaction is rolled back, and the batch needs the
// run with savepoints.
var errHandlerFailed = errors.New("a handler failed")

// subscriberTx is one transaction of runSubscriberBatch. It returns the
// outcomes of the jobs that failed (with savepoints), or an error that
// fails the whole batch.
func (p *workerPool) subscriberTx(ctx context.Context, sub Subscriber, jobs []Job, start time.Time, savepoints bool) ([]jobResult, error) {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()

	ids := make([]int64, len(jobs))
	attempts := make([]int64, len(jobs))
	for i, job := range jobs {
		ids[i], attempts[i] = job.ID, int64(job.Attempt)
	}
	rows, err := tx.QueryContext(ctx, lockOwnJobsSQL, pq.Array(ids), pq.Array(attempts))
	if err != nil {
		return nil, fmt.Errorf("lock jobs: %w", err)
	}
	own := map[int64]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("lock jobs: %w", err)
		}
		own[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lock jobs: %w", err)
	}

	var done []int64
	var results []jobResult
	if !savepoints && sub.HandleBatch != nil {
		done, err = p.handleTogether(ctx, tx, sub, jobs, own)
	} else {
		done, results, err = p.handleEach(ctx, tx, sub, jobs, own, start, savepoints)
	}
	if err != nil {
		return nil, err
	}
	if len(done) > 0 {
		if _, err := tx.ExecContext(ctx, completeJobsSQL, pq.Array(done)); err != nil {
			return nil, fmt.Errorf("complete jobs: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	p.completed.Add(int64(len(done)))
	return results, nil
}

// handleTogether gives the events of the jobs still ours to
// sub.HandleBatch in one call. A failure fails the try: errHandlerFailed.
func (p *workerPool) handleTogether(ctx context.Context, tx *sql.Tx, sub Subscriber, jobs []Job, own map[int64]bool) (done []int64, err error) {
	var evs []Event
	for _, job := range jobs {
		if own[job.ID] { // else rescued meanwhile: the new attempt does the work
			evs = append(evs, job.Event)
			done = append(done, job.ID)
		}
	}
	if len(evs) == 0 {
		return nil, nil
	}
	if err := p.guard(jobs[0], func() error { return sub.HandleBatch(ctx, tx, evs) }); err != nil {
		return nil, errHandlerFailed
	}
	return done, nil
}

// handleEach gives the events of the jobs still ours to sub.Handle one by
// one. Without savepoints the first failure fails the try
// (errHandlerFailed); with them, a failing event's effect is rolled back
// and its failure becomes its job's outcome.
func (p *workerPool) handleEach(ctx context.Context, tx *sql.Tx, sub Subscriber, jobs []Job, own map[int64]bool, start time.Time, savepoints bool) (done []int64, failed []jobResult, err error) {
	for _, job := range jobs {
		if !own[job.ID] {
			continue // rescued meanwhile: the new attempt does the work
		}
		if savepoints {
			if _, err := tx.ExecContext(ctx, "SAVEPOINT job"); err != nil {
				return nil, nil, fmt.Errorf("savepoint: %w", err)
			}
		}
		handleErr := p.guard(job, func() error { return sub.Handle(ctx, tx, job.Event) })
		switch {
		case handleErr != nil && !savepoints:
			return nil, nil, errHandlerFailed
		case handleErr != nil:
			if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT job"); err != nil {
				return nil, nil, fmt.Errorf("rollback to savepoint: %w", err)
			}
			failed = append(failed, p.outcome(job, fmt.Errorf("subscriber %s: %w", sub.Name, handleErr), start))
			continue
		case savepoints:
			if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT job"); err != nil {
				return nil, nil, fmt.Errorf("release savepoint: %w", err)
			}
		}
		done = append(done, job.ID)
	}
	return done, failed, nil
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
		if err := p.recordOutcomesRetrying(batch); err != nil {
			// The jobs stay running; the rescuer retries them. A duplicate
			// run is the price, never a lost job.
			p.logger.Error("record job outcomes failed; the rescuer will retry these jobs", "jobs", len(batch), "err", err)
		}
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
// longer the job's current one changes nothing.
const recordOutcomesSQL = `
UPDATE outbox.jobs AS j
SET state = o.state::outbox.job_state,
    scheduled_at = CASE WHEN o.state = 'retryable'
                        THEN now() + o.delay_ms * interval '1 millisecond'
                        ELSE j.scheduled_at END,
    finalized_at = CASE WHEN o.state IN ('completed', 'discarded') THEN now() END,
    errors = CASE WHEN o.error = '' THEN j.errors
                  ELSE j.errors || jsonb_build_array(jsonb_build_object(
                         'attempt', j.attempt, 'at', now(), 'error', o.error))
             END
FROM unnest($1::bigint[], $2::integer[], $3::text[], $4::bigint[], $5::text[])
     AS o(id, attempt, state, delay_ms, error)
WHERE j.id = o.id
  AND j.attempt = o.attempt
  AND j.state = 'running'`

// recordOutcomes writes a batch of outcomes, with the attempts they record
// and their endpoints' new states, in one transaction: one commit for the
// whole batch.
func (p *workerPool) recordOutcomes(ctx context.Context, batch []jobResult) error {
	ids := make([]int64, 0, len(batch))
	attempts := make([]int64, 0, len(batch))
	states := make([]string, 0, len(batch))
	delays := make([]int64, 0, len(batch))
	errs := make([]string, 0, len(batch))
	for _, r := range batch {
		if r.State == "" {
			continue
		}
		ids = append(ids, r.ID)
		attempts = append(attempts, int64(r.Attempt))
		states = append(states, string(r.State))
		delays = append(delays, r.Delay.Milliseconds())
		errs = append(errs, r.Error)
	}
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("record %d job outcomes: %w", len(ids), err)
	}
	defer tx.Rollback()
	if len(ids) > 0 {
		if _, err := tx.ExecContext(ctx, recordOutcomesSQL,
			pq.Array(ids), pq.Array(attempts), pq.Array(states), pq.Array(delays), pq.Array(errs)); err != nil {
			return fmt.Errorf("record %d job outcomes: %w", len(ids), err)
		}
	}
	if err := writeAttemptRecords(ctx, tx, batch); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("record %d job outcomes: %w", len(ids), err)
	}
	return nil
}

// rescuer returns jobs whose worker died to the queue.
type rescuer struct {
	db      *sql.DB
	cfg     WorkerConfig
	logger  *slog.Logger
	rescued atomic.Int64
}

func newRescuer(db *sql.DB, cfg WorkerConfig, logger *slog.Logger) *rescuer {
	return &rescuer{db: db, cfg: cfg, logger: logger.With("loop", "rescuer")}
}

// Run rescues stuck jobs once at start, then every RescueInterval.
func (r *rescuer) Run(ctx context.Context) error {
	tick := time.NewTicker(r.cfg.RescueInterval)
	defer tick.Stop()
	for {
		if n, err := r.rescueOnce(ctx); err != nil && ctx.Err() == nil {
			r.logger.Error("rescue failed", "err", err)
		} else if n > 0 {
			r.logger.Warn("rescued jobs whose worker stopped answering", "jobs", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// rescueBatch bounds one rescue statement.
const rescueBatch = 1000

// rescueJobsSQL finds jobs running for longer than the horizon ($1 seconds:
// the attempt timeout plus a margin, so no live worker can still hold one)
// and makes them retryable now, or discarded if that was their last
// attempt. now() is the database's clock, the one that stamped attempted_at.
const rescueJobsSQL = `
WITH stuck AS (
  SELECT id
  FROM outbox.jobs
  WHERE state = 'running'
    AND attempted_at < now() - make_interval(secs => $1)
  ORDER BY attempted_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
UPDATE outbox.jobs AS j
SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'discarded'
                 ELSE 'retryable' END::outbox.job_state,
    scheduled_at = now(),
    finalized_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempt, 'at', now(),
               'error', 'rescued: still running after ' || $1 || ' s; its worker stopped'))
FROM stuck
WHERE j.id = stuck.id`

// rescueOnce rescues every stuck job, in batches.
func (r *rescuer) rescueOnce(ctx context.Context) (int64, error) {
	horizon := (r.cfg.AttemptTimeout + r.cfg.RescueMargin).Seconds()
	var total int64
	for {
		res, err := r.db.ExecContext(ctx, rescueJobsSQL, horizon, rescueBatch)
		if err != nil {
			return total, fmt.Errorf("rescue jobs: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		r.rescued.Add(n)
		if n < rescueBatch {
			return total, nil
		}
	}
}

// Attempt records: what a delivery attempt leaves behind, written by the
// completer in the transaction that records its job's outcome.

// endpointChange is what an attempt's answer does to its endpoint.
type endpointChange int

const (
	endpointUnchanged endpointChange = iota // no request was made
	endpointSucceeded                       // clears failing_since
	endpointFailed                          // sets failing_since if unset
	endpointGone                            // 410: disables the endpoint
)

// endpointGoneReason is disabled_reason after a receiver answered 410 Gone.
const endpointGoneReason = "the receiver answered 410 Gone"

// The endpoint's state after an attempt; each skips the write when there
// is nothing to change, so a healthy endpoint's row is not rewritten on
// every delivery.
const (
	endpointSucceededSQL = `
UPDATE outbox.endpoints
SET failing_since = NULL
WHERE id = ANY($1::bigint[])
  AND failing_since IS NOT NULL`

	endpointFailedSQL = `
UPDATE outbox.endpoints
SET failing_since = now()
WHERE id = ANY($1::bigint[])
  AND failing_since IS NULL`

	endpointGoneSQL = `
UPDATE outbox.endpoints
SET disabled_at = now(),
    disabled_reason = '` + endpointGoneReason + `',
    failing_since = coalesce(failing_since, now())
WHERE id = ANY($1::bigint[])
  AND disabled_at IS NULL`
)

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
	set        bool
}

// insertDeliveriesSQL keeps a batch of attempts. An attempt is recorded
// once; a rescued attempt's late worker records under its own number.
const insertDeliveriesSQL = `
INSERT INTO outbox.deliveries (job_id, attempt, endpoint_id, duration_ms, status_code, error, response_excerpt)
SELECT a.job_id, a.attempt, nullif(a.endpoint_id, 0), a.duration_ms, nullif(a.status_code, 0), a.error, a.excerpt
FROM unnest($1::bigint[], $2::integer[], $3::bigint[], $4::integer[], $5::integer[], $6::text[], $7::text[])
     AS a(job_id, attempt, endpoint_id, duration_ms, status_code, error, excerpt)
ON CONFLICT (job_id, attempt) DO NOTHING`

// writeAttemptRecords writes a batch's attempts and moves each endpoint to
// the state its last attempt in the batch left it in.
func writeAttemptRecords(ctx context.Context, tx *sql.Tx, batch []jobResult) error {
	var jobIDs, endpointIDs []int64
	var attempts, durations, statuses []int64
	var errs, excerpts []string
	last := map[int64]endpointChange{} // batch order is completion order
	for _, r := range batch {
		rec := r.record
		if rec == nil {
			continue
		}
		jobIDs = append(jobIDs, r.ID)
		attempts = append(attempts, int64(r.Attempt))
		endpointIDs = append(endpointIDs, rec.EndpointID)
		durations = append(durations, rec.Duration.Milliseconds())
		statuses = append(statuses, int64(rec.StatusCode))
		errs = append(errs, rec.Error)
		excerpts = append(excerpts, rec.ResponseExcerpt)
		if rec.EndpointID != 0 && rec.Change != endpointUnchanged {
			last[rec.EndpointID] = rec.Change
		}
	}
	if len(jobIDs) == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, insertDeliveriesSQL, pq.Array(jobIDs), pq.Array(attempts), pq.Array(endpointIDs),
		pq.Array(durations), pq.Array(statuses), pq.Array(errs), pq.Array(excerpts)); err != nil {
		return fmt.Errorf("record webhook attempts: %w", err)
	}
	byChange := map[endpointChange][]int64{}
	for id, change := range last {
		byChange[change] = append(byChange[change], id)
	}
	for _, step := range []struct {
		change endpointChange
		query  string
	}{{endpointGone, endpointGoneSQL}, {endpointFailed, endpointFailedSQL}, {endpointSucceeded, endpointSucceededSQL}} {
		ids := byChange[step.change]
		if len(ids) == 0 {
			continue
		}
		slices.Sort(ids) // one lock order for every replica's completer
		if _, err := tx.ExecContext(ctx, step.query, pq.Array(ids)); err != nil {
			return fmt.Errorf("record webhook attempts: endpoint state: %w", err)
		}
	}
	return nil
}

// recordAttempt leaves what an attempt did on its job, for the completer
// to write with the job's outcome (writeAttemptRecords).
func (j Job) recordAttempt(a deliveryAttempt, change endpointChange) {
	if j.attempt == nil {
		return // not run by a worker pool: nobody would write it
	}
	*j.attempt = attemptRecord{deliveryAttempt: a, EndpointID: j.EndpointID, Change: change, set: true}
}
