// deliver.go: the job table's workers, which claim due jobs and run each
// through the handler of its kind (webhook.go, ownernotify.go, or an
// in-process subscriber's transaction); outcome.go decides what each
// attempt's result means, and the completer (completer.go) writes it.
//
// Guarantees (docs/guarantees.md, hop 4):
//   - No transaction is open across a job's run: a claim commits, the job
//     runs, and its outcome is recorded in a second short transaction.
//   - A subscriber's effect and its job's completion commit in one
//     transaction, or neither does.

package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/url"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// WorkerConfig holds the job workers' numbers.
type WorkerConfig struct {
	// Concurrency: deliveries wait on the network, not the CPU, and the
	// more run at once the more jobs each claim and each outcome statement
	// carries, and the less CPU an event costs. 128 lets a 2-core machine
	// deliver as fast as 16 producers commit; 64 fall behind, their
	// backlog growing (bench/load -mode keepup, docs/performance.md). Past
	// 128 a drain gains little, and each worker costs memory.
	Concurrency int
	// MaxAttempts: with attempt^4-second backoff, 18 attempts span about
	// 3.8 days, under the 5-day endpoint disable and the 7-day retention.
	// It is stamped on each job as the job is made (max_attempts), and the
	// workers keep to the job's own: replicas started with different
	// values during a rolling restart agree on every job, and a lower
	// value never discards unattempted the jobs queued under a higher one.
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
	// BreakerThreshold is how many attempts to one endpoint must fail in a
	// row, with no success between them, to open its circuit breaker:
	// then one attempt at a time, and new deliveries scheduled
	// FailingEndpointDelay out, until a success closes it. One failure is
	// too few: a receiver failing one request in ten would be treated as
	// dead, a third of its deliveries pushed out by minutes
	// (TestFlakyReceiverKeepsItsBreakerClosed); 1 restores that rule.
	BreakerThreshold int
}

// workerPool runs jobs: its loop claims due jobs while there are free
// slots (claimer), each batch of jobs runs in its own goroutine, and the
// completer writes their outcomes in batches.
type workerPool struct {
	*claimer
	*completer

	db          *sql.DB
	cfg         WorkerConfig
	grace       time.Duration // how long in-flight jobs may finish after Run's ctx ends
	subscribers *subscriberRegistry
	// handlers run every other kind of job. A kind with neither is not
	// claimed here: it waits for a process that runs it (kinds).
	handlers map[string]jobHandler
	logger   *slog.Logger

	// jobCtx and running are set by Run before it lets claims start
	// jobs: jobs run under jobCtx and count in running, which Run's
	// shutdown waits for.
	jobCtx  context.Context
	running *sync.WaitGroup
	// inFlight is the jobs running now, which a shutdown names.
	inFlight inFlightJobs
	// recorded is poked when a job claimed into a full place
	// (Job.wakeOnOutcome) has freed it: when its attempt succeeded
	// (answeredJobs.add), and when its outcome was written (a failure's
	// place; an ordered lane's next delivery is made due then).
	recorded chan struct{}

	// Counters for /metrics, only ever incremented.
	completed atomic.Int64
	retried   atomic.Int64
	discarded atomic.Int64
}

func newWorkerPool(db *sql.DB, cfg WorkerConfig, grace time.Duration, subs *subscriberRegistry, handlers map[string]jobHandler, logger *slog.Logger) *workerPool {
	logger = logger.With("loop", "workers")
	p := &workerPool{
		db:          db,
		cfg:         cfg,
		grace:       grace,
		subscribers: subs,
		handlers:    handlers,
		logger:      logger,
		recorded:    make(chan struct{}, 1),
	}
	p.claimer = newClaimer(db, cfg.Concurrency, p.kinds(), p)
	p.completer = newCompleter(db, cfg.BreakerThreshold, cfg.Concurrency, &p.claimer.answered, p.recorded, logger)
	return p
}

// kinds are the job kinds the pool runs, sorted: its handlers' and its
// subscribers'. Its claims take no other (claimer.kinds): a job of
// another kind waits for a process that runs it, where claimed here it
// would fail and retry until discarded. Its replica's row names them
// (replicaSelf.Kinds), so that a kind no live replica runs is seen (the
// overview's jobs_no_runner). Never nil, which the claims would take for
// every kind.
func (p *workerPool) kinds() []string {
	kinds := make([]string, 0, len(p.handlers)+len(p.subscribers.byKind))
	for kind := range p.handlers {
		kinds = append(kinds, kind)
	}
	for _, s := range p.subscribers.all() {
		kinds = append(kinds, s.jobKind())
	}
	slices.Sort(kinds)
	return kinds
}

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
	p.jobCtx, p.running = jobCtx, &running

	moreDue := true // a claim filled every free slot: more may be waiting
	for ctx.Err() == nil {
		var err error
		if moreDue, err = p.fill(ctx, p.claimAtFree(), moreDue); err != nil {
			p.logger.Error("claim jobs failed", "err", err)
		}
		// A claim that filled the free slots claims again as slots free
		// up. One that came back short waits for a reason to look again:
		// new jobs, the poll, or the completer having recorded the outcome
		// of a job claimed into a full place (Job.wakeOnOutcome), which is
		// when an endpoint held at its cap (the claim counts its running
		// jobs) may take more. Woken by every recorded batch, the workers
		// would run a claim for nothing after each one while no endpoint
		// is near its cap.
		freed, recorded := p.slotFreed, p.recorded
		if moreDue {
			recorded = nil
		} else {
			freed = nil // nothing waits for a slot: don't claim on every finish
		}
		select {
		case <-ctx.Done():
		case <-wake:
		case <-poll.C:
		case <-freed:
		case <-recorded:
		}
	}
	p.stop(&running, cancelJobs)
	<-completerDone
	return ctx.Err()
}

// start runs a batch of claimed jobs in a goroutine of Run's, in a slot
// the caller holds, which the goroutine frees when the batch's outcomes
// are with the completer.
func (p *workerPool) start(batch []Job) {
	p.inFlight.add(batch)
	p.running.Go(func() {
		defer p.release()
		results := p.runBatch(p.jobCtx, batch)
		p.inFlight.remove(batch)
		if p.claimer.answered.add(results) {
			poke(p.recorded)
		}
		if batch[0].yieldsToLive {
			p.claimUnlessClaimed(replayYield)
		}
		for _, res := range results {
			p.results <- res
		}
	})
}

// replayYield is how long a replayed delivery's place, in a replay lane
// narrowed by live traffic, waits for a claim the live deliveries bring
// before the workers claim for it alone. Live deliveries at hundreds a
// second claim every few milliseconds, and the replay rides along at no
// cost of its own; a trickle of live ones would leave the replay to the
// poll, a delivery a second. 10 ms bounds it at about a hundred a second.
const replayYield = 10 * time.Millisecond

// claimUnlessClaimed wakes the claim loop after wait unless a claim has
// begun meanwhile.
func (p *workerPool) claimUnlessClaimed(wait time.Duration) {
	before := p.claimsBegun.Load()
	time.AfterFunc(wait, func() {
		if p.claimsBegun.Load() == before {
			poke(p.recorded)
		}
	})
}

// stop waits for the jobs still running, at most the grace period, then
// cancels them, waits for them to return, and closes results, which ends
// the completer once it has written every outcome. While jobs run, it
// first says how many and where to: a stop that waits in silence looks
// hung, and is interrupted again.
func (p *workerPool) stop(running *sync.WaitGroup, cancelJobs context.CancelFunc) {
	allDone := make(chan struct{})
	go func() { running.Wait(); close(allDone) }()
	if n, to := p.inFlight.targets(); n > 0 {
		p.logger.Info("stopping: waiting for the jobs in flight; a second interrupt or SIGTERM stops at once, and they are rescued as after a crash",
			"jobs", n, "to", to, "grace", p.grace)
	}
	select {
	case <-allDone:
	case <-time.After(p.grace):
		p.logger.Warn("grace period over; cancelling running jobs", "grace", p.grace)
		cancelJobs()
		<-allDone
	}
	close(p.results)
}

// inFlightJobs is the jobs the pool's goroutines run now, by id.
type inFlightJobs struct {
	mu   sync.Mutex // protects jobs
	jobs map[int64]Job
}

func (f *inFlightJobs) add(batch []Job) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.jobs == nil {
		f.jobs = make(map[int64]Job)
	}
	for _, job := range batch {
		f.jobs[job.ID] = job
	}
}

func (f *inFlightJobs) remove(batch []Job) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, job := range batch {
		delete(f.jobs, job.ID)
	}
}

// maxNamedTargets bounds the targets a shutdown's log line names: the
// workers (128) may be sending to as many endpoints.
const maxNamedTargets = 10

// targets is how many jobs are in flight, and where they go, the most
// jobs first: "2 to endpoint 3 (https://...)", or a job of no endpoint
// by its kind, "1 to sub:log"; past maxNamedTargets, how many more.
func (f *inFlightJobs) targets() (int, []string) {
	f.mu.Lock()
	counts := map[string]int{}
	for _, job := range f.jobs {
		counts[job.targetName()]++
	}
	n := len(f.jobs)
	f.mu.Unlock()
	names := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		return cmp.Or(counts[b]-counts[a], strings.Compare(a, b))
	})
	to := []string{}
	for i, name := range names {
		if i == maxNamedTargets {
			to = append(to, fmt.Sprintf("and %d more", len(names)-i))
			break
		}
		to = append(to, fmt.Sprintf("%d to %s", counts[name], name))
	}
	return n, to
}

// targetName is where a job goes, for a log line: its endpoint, by id
// and URL (without a password it may hold), or its kind.
func (job Job) targetName() string {
	switch {
	case job.EndpointID == 0:
		return job.Kind
	case job.endpoint == nil:
		return fmt.Sprintf("endpoint %d", job.EndpointID)
	}
	shown := job.endpoint.URL
	if u, err := url.Parse(shown); err == nil {
		shown = u.Redacted()
	}
	return fmt.Sprintf("endpoint %d (%s)", job.EndpointID, shown)
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

// runJob runs one attempt of job within AttemptTimeout, after its place in
// its endpoint's rate limit has come and its endpoint's gate has let it
// in, and decides its outcome. A panic is a failed attempt, not a dead
// process.
func (p *workerPool) runJob(ctx context.Context, job Job) jobResult {
	if wait := time.Until(job.startAt); wait > 0 {
		// At most a second (outbox.lane_room); a shutdown that cancels
		// the jobs cancels the wait, and the attempt fails as cancelled.
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		timer.Stop()
	}
	job.attempt = new(attemptRecord) // set by handlers that keep attempt records
	// A claim ahead holds more of an endpoint's jobs than may be in
	// flight: the rest wait at its gate for a request to end (claimahead.go).
	done, held := p.passGate(ctx, job)
	if held != nil {
		return *held
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, job.attemptTimeout(p.cfg.AttemptTimeout))
	defer cancel()
	start := time.Now()
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

// attemptTimeout is the time limit of job's attempt: def, or its
// endpoint's longer request timeout (endpointRequest.attemptTimeout).
func (job Job) attemptTimeout(def time.Duration) time.Duration {
	if job.endpoint == nil {
		return def
	}
	return job.endpoint.request.attemptTimeout(def)
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

// work dispatches a job to the handler of its kind.
func (p *workerPool) work(ctx context.Context, job Job) error {
	if handle, ok := p.handlers[job.Kind]; ok {
		return handle(ctx, job)
	}
	// Every claim takes only the kinds the pool runs (kinds), so no job
	// comes here without a handler. Were one to, another replica may run
	// its kind: retry rather than discard.
	return fmt.Errorf("no handler for job kind %q in this process", job.Kind)
}

// passGate holds job at its endpoint's gate until it may send (runJob),
// if it sends a request. It returns the call that gives the place back
// once the attempt has run, telling the gate what the answer did to the
// endpoint; or, if the job is not to run, its result: released unsent,
// or failed as its wait was cancelled.
func (p *workerPool) passGate(ctx context.Context, job Job) (done func(), res *jobResult) {
	if !job.sendsRequest() {
		return func() {}, nil
	}
	leave, err := p.gates.enter(ctx, job.EndpointID)
	if errors.Is(err, errReleased) {
		return nil, &jobResult{ID: job.ID, Attempt: job.Attempt, jobOutcome: jobOutcome{State: jobReleased}, wakeOnOutcome: true}
	}
	if err != nil {
		failed := p.outcome(job, fmt.Errorf("waiting for a place in endpoint %d's requests: %w", job.EndpointID, err), time.Now())
		return nil, &failed
	}
	return func() {
		rec := job.attempt
		p.gates.answered(job.EndpointID, rec.Change == endpointFailed || rec.Change == endpointGone, rec.Hold)
		leave()
	}, nil
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

// completedResults are the outcomes of the jobs done, of jobs: completed.
func completedResults(jobs []Job, done []int64) []jobResult {
	results := make([]jobResult, 0, len(done))
	for _, job := range jobs {
		if slices.Contains(done, job.ID) {
			results = append(results, jobResult{ID: job.ID, Attempt: job.Attempt, jobOutcome: jobOutcome{State: jobCompleted}})
		}
	}
	return results
}

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
	tx, err := beginPipelineTx(ctx, p.db)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	// outbox.events first (lockEventsFirst): the jobs are locked before a
	// handler runs, and a handler may record events (outbox.record), as
	// the completion may advance a lane.
	if err := lockEventsFirst(ctx, tx); err != nil {
		return nil, err
	}

	ids := make([]int64, len(jobs))
	attempts := make([]int64, len(jobs))
	for i, job := range jobs {
		ids[i], attempts[i] = job.ID, int64(job.Attempt)
	}
	locked, err := queryAll(ctx, tx, scanID, lockOwnJobsSQL, pq.Array(ids), pq.Array(attempts))
	if err != nil {
		return nil, fmt.Errorf("lock jobs: %w", err)
	}
	own := make(map[int64]bool, len(locked))
	for _, id := range locked {
		own[id] = true
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
		// Locked by this transaction, so no fence can have moved: the
		// jobs leave the queue, and their attempts go to the history.
		if err := writeOutcomes(ctx, tx, completedResults(jobs, done), p.cfg.BreakerThreshold); err != nil {
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

// outcome decides what an attempt's error means for its job, counts it
// and logs it.
func (p *workerPool) outcome(job Job, err error, start time.Time) jobResult {
	res := jobResult{ID: job.ID, Attempt: job.Attempt, wakeOnOutcome: job.wakeOnOutcome}
	// An endpoint's own schedule, as the claim read it, may end the
	// retries sooner: fewer attempts, or a retry window.
	maxAttempts, now := job.MaxAttempts, time.Now()
	var retryUntil time.Time
	if ep := job.endpoint; ep != nil {
		maxAttempts, retryUntil = ep.request.attemptsAllowed(maxAttempts), ep.request.retryUntil(now)
	}
	res.jobOutcome = endRetriesAt(decideOutcome(job.Attempt, maxAttempts, err, rand.Float64()), retryUntil, now)
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
		level := slog.LevelError
		if errors.Is(err, errEndpointDeleted) {
			level = slog.LevelDebug // the delete logged them all, once
		}
		p.logger.Log(context.Background(), level, "job discarded", attrs("max_attempts", maxAttempts, "err", err)...)
	}
	return res
}
