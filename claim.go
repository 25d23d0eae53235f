// claim.go: claiming due jobs, the step between the job table and the
// workers. The claimed job and its columns are declared here once; the
// workers' own claims and the relay's claim in its pass (relay.go,
// outbox.fan_out_claiming) both take slots of the same pool through it.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

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
	// startAt is when the job may start, by this process's clock: its
	// place in its endpoint's rate limit; zero for no wait.
	startAt time.Time
	// wakeOnOutcome, from the claim, says that recording this job's
	// outcome may let due work be claimed at once: the claim filled its
	// endpoint's room or replay share (or the subscribers' share of the
	// batch), or it heads an ordered lane (outbox.claim_due_jobs).
	wakeOnOutcome bool
	// yieldsToLive, from the claim, marks a replayed delivery claimed
	// into a replay lane narrowed by live traffic: when it ends, its
	// place waits for the next claim, or replayYield for one of its own
	// (outbox.claim_due_jobs, replay_yields).
	yieldsToLive bool
	// resendWindow is, for a delivery that may have reached its receiver
	// before (an earlier attempt, or a replay's), the dedup window the
	// receiver advertised; 0 otherwise. claimedAt is the claim's time by
	// the database's clock, the one that stamped Event.CreatedAt. Together
	// they say whether the attempt would come too late (resendTooLate).
	resendWindow time.Duration
	claimedAt    time.Time
	// committedAt is when the event's transaction committed, as the relay
	// kept it (outbox.events.committed_at), or the event's created_at
	// where it kept none: where the time to the first 2xx starts.
	committedAt time.Time
	// laneLimit is, from a claim ahead (claimJobsSQL), the most requests
	// this process may have in flight to the job's endpoint (laneLimited);
	// any other claim sets none (endpointGates).
	laneLimit   int
	laneLimited bool
	Event       Event
}

// deliveryEndpoint is an endpoint as one attempt sees it.
type deliveryEndpoint struct {
	URL            string
	Secrets        [][]byte // as stored, sealed if a key is set (secrets.go); current first, then the previous during a rotation
	DisabledReason *string
}

// jobHandler runs one attempt of a job. Its error, if any, is the outcome
// decideOutcome reads: permanentError and retryAfterError steer it.
type jobHandler func(ctx context.Context, job Job) error

// claimBatchMax bounds one claim: big enough that a backlog costs one
// round trip per many jobs, small enough to share work among replicas.
const claimBatchMax = 100

// claimer takes due jobs into the free slots of one worker pool. The
// pool's own claims fill free slots (fill); the relay reserves slots for
// the claim in its pass (reserve) and hands the pool what it claimed
// (handOff). Either way a claimed batch of jobs runs in a slot of its own,
// started by the pool (jobStarter).
type claimer struct {
	db *sql.DB
	// replica, if set, is the registry whose id every claim records
	// (replicas.go); nil claims under no id, rescued by the horizon alone.
	replica *replicaRegistry
	pool    jobStarter
	// kinds are the job kinds the pool runs (workerPool.kinds): every
	// claim, the relay's too, takes jobs of these kinds alone.
	kinds []string

	slots     chan struct{} // one token per running batch
	slotFreed chan struct{} // poked when a slot frees
	// answered are the deliveries whose attempt has succeeded and whose
	// outcome the completer has not written yet: each claim passes them,
	// so that an endpoint's cap counts requests in flight, not outcomes
	// waiting for their batch's commit (schema.sql, outbox.claim_due_jobs).
	answered answeredJobs
	// gates hold each endpoint's requests from this process to the limit
	// its latest claim ahead set: a claim takes more of an endpoint's
	// jobs than may be in flight, and they start as requests end.
	gates endpointGates

	// mu guards the fields below it, and is held by fill from counting
	// free slots to starting the jobs claimed into them, so that no
	// reservation of the relay's takes a slot in between.
	mu        sync.Mutex
	accepting bool            // the pool runs: claims may start jobs
	running   *sync.WaitGroup // the pool's, which its shutdown waits for

	// What the claims cost, for /metrics: how often each runs, how long it
	// takes and how many jobs it carries say where a job's wait goes.
	claims      *histogram // one claim statement, seconds
	claimsBegun atomic.Int64
	claimedJobs atomic.Int64
}

// jobStarter is the worker pool as the claimer sees it: how claimed jobs
// group into batches (one subscriber's jobs run together), and how one
// batch starts in a slot the caller holds.
type jobStarter interface {
	batches(jobs []Job) [][]Job
	start(batch []Job)
}

func newClaimer(db *sql.DB, slots int, kinds []string, pool jobStarter) *claimer {
	return &claimer{
		db:        db,
		pool:      pool,
		kinds:     kinds,
		slots:     make(chan struct{}, slots),
		slotFreed: make(chan struct{}, 1),
		answered:  answeredJobs{ids: map[int64]struct{}{}},
		gates:     endpointGates{byEndpoint: map[int64]*endpointGate{}},
		claims:    newHistogram(latencyBuckets),
	}
}

// open lets claims start jobs, counted in running.
func (c *claimer) open(running *sync.WaitGroup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.accepting, c.running = true, running
}

// close stops the relay's reservations; the pool's own claims stop with
// its loop.
func (c *claimer) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.accepting = false
}

// fill claims into the free slots and starts what it claimed, when at
// least atFree slots are free, or any while the last claim came back
// short (moreDue false). It reports whether the claim filled every slot
// it asked for: then more may be due. A claim in flight runs to its end
// when shutdown begins: cancelled after its statement committed, its
// jobs would be running, held by no worker here, until a rescue returned
// them. Claimed, they run within the grace period like any.
func (c *claimer) fill(ctx context.Context, atFree int, moreDue bool) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	free := cap(c.slots) - len(c.slots)
	if free < atFree && (free == 0 || moreDue) {
		return moreDue, nil
	}
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	n := min(free, claimBatchMax)
	jobs, err := c.claim(claimCtx, n)
	for _, batch := range c.pool.batches(jobs) {
		c.slots <- struct{}{}
		c.pool.start(batch)
	}
	return len(jobs) == n, err
}

// release frees the slot of a batch that has ended.
func (c *claimer) release() {
	<-c.slots
	poke(c.slotFreed)
}

// claimAtFree is how many slots must be free before a claim under load:
// a quarter of them, so that one claim statement fetches several jobs
// instead of one.
func (c *claimer) claimAtFree() int {
	return max(1, cap(c.slots)/4)
}

// workerShare is the most of this replica's workers that one endpoint's
// deliveries may hold at once, passed to every claim that starts them
// (schema.sql, worker_share of outbox.claim_lane_jobs, claim_due_jobs and
// fan_out): half. An endpoint's max_in_flight (up to 1,000) bounds its
// requests over every replica, not its part of one replica's workers,
// and the round robin shares workers only between endpoints with work
// due at the moment of a claim: without a bound, a slow receiver's
// backlog claimed while nothing else was due takes every free worker and
// holds each for as long as the receiver takes to answer, and the next
// delivery to any other endpoint waits for one of them. Half is what the
// round robin gives an endpoint beside one other with work due at every
// claim. The half it leaves is more than the quarter that the relay's
// passes leave to the pool's own claims (claimAtFree), so the other
// endpoints' deliveries still start in the pass that makes them
// (reserve) instead of waiting for a claim. At least 1: a single worker
// serves every endpoint in turn. docs/endpoints.md#endpoint-isolation
// has the command that measures what it keeps from another endpoint's
// latency.
func (c *claimer) workerShare() int {
	return max(1, cap(c.slots)/2)
}

// reserve takes up to n free slots for a claim the relay makes in its
// pass (relay.go, outbox.fan_out_claiming), and reports how many: none
// while Run is not running, or while its own claim is counting and
// filling slots (the relay then leaves the claim to it). It leaves
// claimAtFree slots to the pool's own claims: a relay under load passes
// back to back, and while its pass held every free slot the pool could
// claim nothing, its jobs waiting for the relay's claims, which take only
// what a pass leaves. A reservation of any slot must be ended by handOff,
// which Run's shutdown waits for.
func (c *claimer) reserve(n int) int {
	if !c.mu.TryLock() {
		return 0
	}
	defer c.mu.Unlock()
	if !c.accepting {
		return 0
	}
	n = min(n, cap(c.slots)-len(c.slots)-c.claimAtFree())
	reserved := 0
take:
	for reserved < n {
		select {
		case c.slots <- struct{}{}:
			reserved++
		default:
			break take // every slot is taken
		}
	}
	if reserved > 0 {
		c.running.Add(1) // the reservation, ended by handOff
	}
	return reserved
}

// handOff starts the jobs a claim in reserved slots took (none if it
// failed), one batch to a slot, and frees the slots left over. It ends
// the reservation.
func (c *claimer) handOff(jobs []Job, reserved int) {
	defer c.running.Done()
	c.claimsBegun.Add(1) // a claim was made: replayed deliveries' places are taken (claimUnlessClaimed)
	c.gates.claimed(jobs)
	batches := c.pool.batches(jobs)
	for _, batch := range batches {
		c.pool.start(batch)
	}
	for range reserved - len(batches) {
		<-c.slots
	}
	if reserved > len(batches) {
		poke(c.slotFreed)
	}
}

// answeredJobs is claimer.answered: a set of job ids, shared by the
// workers (add), the completer (remove) and the claim (list).
type answeredJobs struct {
	mu  sync.Mutex
	ids map[int64]struct{}
}

// add notes the jobs of results whose attempts have ended and free their
// place at once (jobResult.freesItsPlace), and reports whether one of them
// was claimed into a full place (Job.wakeOnOutcome).
func (a *answeredJobs) add(results []jobResult) (wake bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range results {
		if r.freesItsPlace() {
			a.ids[r.ID] = struct{}{}
			wake = wake || r.wakeOnOutcome
		}
	}
	return wake
}

// remove forgets the jobs of a batch of outcomes the completer wrote, or
// failed to write (they are then running until the rescuer returns them,
// and count against their endpoint's cap as any running job).
func (a *answeredJobs) remove(results []jobResult) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range results {
		delete(a.ids, r.ID)
	}
}

// list is the set as it is now: never nil, which the claim would take for
// an SQL NULL, and with it no running job for any cap to count.
func (a *answeredJobs) list() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.AppendSeq(make([]int64, 0, len(a.ids)), maps.Keys(a.ids))
}

// claimTimeout bounds a claim, which shutdown does not cancel (Run).
const claimTimeout = 10 * time.Second

// claimJobsSQL takes up to $1 due jobs, soonest first, marks them running
// with their next attempt number, held by replica $2 (NULL: none), and
// returns each with its event and, for a delivery, its endpoint. $3 are
// the answered deliveries, $4 the endpoints cooling, $5 the workerShare
// and $6 the kinds the workers run, the only ones it claims. The
// statement is schema.sql's outbox.claim_lane_jobs, which pins its plan
// and reads everything in one snapshot. It claims ahead: for a healthy
// endpoint, up to twice the requests this replica may have in flight
// (lane_limit), so that a request ending starts the next one here and
// then, not at the next claim's commit (endpointGates).
const claimJobsSQL = `
SELECT ` + claimedColumns + `, claim.lane_limit
FROM outbox.claim_lane_jobs($1, $2, $3, true, $4, $5, $6) AS claim, LATERAL (SELECT (claim.job).*) AS job`

// claimedColumns are the attributes of schema.sql's outbox.claimed_job, in
// the order claimedRow.dest scans them: the one list every claim selects,
// followed by the claim's lane_limit (claimJobsSQL), or NULL where the
// claim does not claim ahead (relay.go, fanOutAndClaimSQL).
const claimedColumns = `
       id, kind, attempt, max_attempts, endpoint_id,
       event_id, topic, subject, payload, created_at,
       traceparent, tracestate,
       url, secret, previous_secret, disabled_reason,
       start_in_ms, wake_on_outcome, replay_yields,
       resend_window_seconds, claimed_at,
       committed_at`

// claim takes up to n due jobs in one statement, under this process's
// replica id. Without one (declared dead, not registered again yet) it
// claims nothing.
func (c *claimer) claim(ctx context.Context, n int) ([]Job, error) {
	replica, ok := c.claimReplica()
	if !ok {
		return nil, nil
	}
	// A rate-limited job's start_in_ms counts from the claim's now(), the
	// moment the statement began; counted from its arrival instead, a slow
	// claim would start its batch late and squeeze it against the next.
	sent := time.Now()
	c.claimsBegun.Add(1)
	scan := func(row rowScanner) (Job, error) { return scanClaimedJob(row, sent) }
	jobs, err := queryAll(ctx, c.db, scan, claimJobsSQL, n, replica, pq.Array(c.answered.list()), pq.Array(c.gates.cooling()),
		c.workerShare(), pq.Array(c.kinds))
	c.claims.Observe(time.Since(sent).Seconds())
	c.claimedJobs.Add(int64(len(jobs)))
	if err != nil {
		c.claimFailed(replica, err)
		return nil, fmt.Errorf("claim jobs: %w", err)
	}
	c.gates.claimed(jobs)
	return jobs, nil
}

// claimFailed notes a claim under replica that failed with err: if the
// replica was declared dead, this process claims nothing until it is
// registered again.
func (c *claimer) claimFailed(replica *int64, err error) {
	if replica != nil && pq.As(err, errReplicaNotRegistered) != nil {
		c.replica.lost(*replica)
	}
}

// claimReplica is the replica id a claim records (nil: none, without a
// registry), and false while this process has none (declared dead, not
// registered again yet), when it must claim nothing.
func (c *claimer) claimReplica() (*int64, bool) {
	if c.replica == nil {
		return nil, true
	}
	id := c.replica.ID()
	if id == 0 {
		return nil, false
	}
	return &id, true
}

// scanClaimedJob reads one row of claimJobsSQL, a claim sent at sent.
func scanClaimedJob(row rowScanner, sent time.Time) (Job, error) {
	var c claimedRow
	if err := row.Scan(c.dest()...); err != nil {
		return Job{}, err
	}
	j, _ := c.job(sent)
	return j, nil
}

// claimedRow is an outbox.claimed_job and its lane limit, in
// claimedColumns' order, as claimJobsSQL and the relay's fanOutAndClaimSQL
// select them. Every one may be NULL: the relay's row for a pass that
// claimed no job has none.
type claimedRow struct {
	id, attempt, maxAttempts, endpointID, eventID, startInMS sql.NullInt64
	resendWindowSeconds, laneLimit                           sql.NullInt64
	kind, topic, subject, url                                sql.NullString
	traceparent, tracestate, disabledReason                  *string
	payload, secret, previous                                []byte
	createdAt, claimedAt, committedAt                        sql.NullTime
	wakeOnOutcome, yieldsToLive                              sql.NullBool
}

// dest is what Scan fills, in the columns' order.
func (r *claimedRow) dest() []any {
	return []any{&r.id, &r.kind, &r.attempt, &r.maxAttempts, &r.endpointID,
		&r.eventID, &r.topic, &r.subject, &r.payload, &r.createdAt,
		&r.traceparent, &r.tracestate,
		&r.url, &r.secret, &r.previous, &r.disabledReason, &r.startInMS, &r.wakeOnOutcome, &r.yieldsToLive,
		&r.resendWindowSeconds, &r.claimedAt, &r.committedAt, &r.laneLimit}
}

// job is the row as a Job claimed by a statement sent at sent, and
// whether there is one.
func (r *claimedRow) job(sent time.Time) (Job, bool) {
	if !r.id.Valid {
		return Job{}, false
	}
	j := Job{
		ID:            r.id.Int64,
		Kind:          r.kind.String,
		Attempt:       int(r.attempt.Int64),
		MaxAttempts:   int(r.maxAttempts.Int64),
		EndpointID:    r.endpointID.Int64,
		wakeOnOutcome: r.wakeOnOutcome.Bool,
		yieldsToLive:  r.yieldsToLive.Bool,
		resendWindow:  time.Duration(r.resendWindowSeconds.Int64) * time.Second,
		claimedAt:     r.claimedAt.Time,
		committedAt:   r.committedAt.Time,
		laneLimit:     int(r.laneLimit.Int64),
		laneLimited:   r.laneLimit.Valid,
		Event: Event{
			ID:          r.eventID.Int64,
			Topic:       r.topic.String,
			Subject:     r.subject.String,
			Payload:     r.payload,
			CreatedAt:   r.createdAt.Time,
			Traceparent: r.traceparent,
			Tracestate:  r.tracestate,
		},
	}
	if r.startInMS.Int64 > 0 {
		j.startAt = sent.Add(time.Duration(r.startInMS.Int64) * time.Millisecond)
	}
	if r.url.Valid {
		j.endpoint = &deliveryEndpoint{URL: r.url.String, Secrets: [][]byte{r.secret}, DisabledReason: r.disabledReason}
		if r.previous != nil {
			j.endpoint.Secrets = append(j.endpoint.Secrets, r.previous)
		}
	}
	return j, true
}

// sendsRequest says whether the job's attempt may reach a receiver: a
// delivery to an endpoint that still exists and is not disabled.
func (j Job) sendsRequest() bool {
	return j.EndpointID != 0 && j.endpoint != nil && j.endpoint.DisabledReason == nil
}

// recordAttempt leaves what an attempt did on its job, for the completer
// to write with the job's outcome (recordOutcomes).
func (j Job) recordAttempt(a deliveryAttempt, change endpointChange) {
	if j.attempt == nil {
		return // not run by a worker pool: nobody would write it
	}
	*j.attempt = attemptRecord{deliveryAttempt: a, EndpointID: j.EndpointID, Change: change, At: time.Now(), set: true}
}

// endpointGates hold this process's requests to each endpoint to the
// limit its latest claim ahead set (Job.laneLimit): the endpoint's cap
// less the deliveries of other replicas running at that claim. A claim
// ahead takes up to twice that, so that when a request ends the next
// starts here at once, where a claim of its own would make it wait for
// the claim's statement and commit while the endpoint's place stood
// empty: a place is held while a request is in flight.
//
// Why the cap holds across replicas (outbox.claim_lane_jobs): every
// claim counts each other replica's running jobs whole, those waiting
// at its gates included. A claim ahead at time t keeps this process's
// requests to the cap less the others' jobs at t, and the others' jobs
// only shrink until one of them claims, whose claim counts this
// process's jobs, the waiting ones too. Every job with an endpoint
// passes its gate, also those claimed by the relay's pass (which sets no
// limit: its claim counts this process's waiting jobs as in flight, so
// whatever it takes may start). Limits are set only by the workers'
// claims, one at a time (claimer.fill), in the order they were taken.
//
// A job waits at most gateWait, holding its worker, and is then released
// unsent: back in the queue as before its claim (jobReleased), so that a
// receiver that slows down holds its cap of workers, not twice it; its
// endpoint is then cooling for gateCooling, claimed no further than its
// cap (cooling). An
// answer that failed or asked to wait (a Retry-After) releases every job
// waiting for that endpoint, and a Retry-After every job that comes to
// its gate before the hold ends: the next claim sees the endpoint as that
// answer left it, as it would have without claims ahead.
type endpointGates struct {
	mu         sync.Mutex
	byEndpoint map[int64]*endpointGate
}

// gateWait bounds a job's wait at its endpoint's gate: long enough for
// the requests of a receiver answering in milliseconds to make room many
// times over, short enough that a hanging one holds the waiting jobs'
// workers for no longer than a claim's round trip or two would.
const gateWait = 250 * time.Millisecond

// gateCooling is how long an endpoint that released a job is claimed no
// further than its cap: a receiver answering in a little more than
// gateWait would otherwise have every claim ahead of it released.
const gateCooling = time.Second

// errReleased is a gate's answer to a job it sends back unsent.
var errReleased = errors.New("released unsent: its endpoint's requests did not make room")

// jobReleased is the outcome of a job released unsent: not a state of
// outbox.job_state but what outbox.record_outcomes reads as one, putting
// the job back as it was before its claim.
const jobReleased jobState = "released"

// endpointGate is one endpoint's: its limit (if limited; none before a
// claim ahead set one), its
// requests in flight, the jobs waiting for one to end, first come first
// in, and until when an answer asked it to wait. Kept once made: a limit
// dropped while jobs of a claim ahead were about to enter would let them
// all in.
type endpointGate struct {
	limit        int
	limited      bool
	inFlight     int
	waiting      []*gateWaiter
	heldUntil    time.Time
	lastReleased time.Time
}

// gateWaiter is a job waiting at a gate: in is closed when it may go, or
// is released (released set first).
type gateWaiter struct {
	in       chan struct{}
	released bool
}

// cooling lists the endpoints that released a job within gateCooling:
// never nil, which the claim would take for an SQL NULL.
func (g *endpointGates) cooling() []int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := []int64{}
	for id, e := range g.byEndpoint {
		if time.Since(e.lastReleased) < gateCooling {
			ids = append(ids, id)
		}
	}
	return ids
}

// gate is endpointID's gate; g.mu is held.
func (g *endpointGates) gate(endpointID int64) *endpointGate {
	e := g.byEndpoint[endpointID]
	if e == nil {
		e = new(endpointGate)
		g.byEndpoint[endpointID] = e
	}
	return e
}

// claimed notes a claim's jobs, in the order it took them: a claim ahead
// sets its endpoint's limit, letting in whom a higher one admits; and any
// claim of an endpoint's job ends this process's hold of it. The claim
// read the endpoint's hold as the database keeps it (held_until, which
// every replica's claims read, on the database's clock), so a job it
// returns is due: the process's own hold only keeps back the jobs claimed
// before the answer that asked to wait.
func (g *endpointGates) claimed(jobs []Job) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, j := range jobs {
		if j.EndpointID == 0 {
			continue
		}
		e := g.gate(j.EndpointID)
		e.heldUntil = time.Time{}
		if j.laneLimited {
			e.limit, e.limited = j.laneLimit, true
			e.admit()
		}
	}
}

// admit lets waiting jobs in while the limit allows; g.mu is held.
func (e *endpointGate) admit() {
	for len(e.waiting) > 0 && (!e.limited || e.inFlight < e.limit) {
		close(e.waiting[0].in)
		e.waiting = e.waiting[1:]
		e.inFlight++
	}
}

// answered notes what a request to endpointID got: a failure releases
// the jobs waiting for it, and a hold (a Retry-After) them and those that
// come before it ends.
func (g *endpointGates) answered(endpointID int64, failed bool, hold time.Duration) {
	if !failed && hold <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.gate(endpointID)
	if until := time.Now().Add(hold); hold > 0 && until.After(e.heldUntil) {
		e.heldUntil = until
	}
	for _, w := range e.waiting {
		w.released = true
		close(w.in)
	}
	if len(e.waiting) > 0 {
		e.lastReleased = time.Now()
	}
	e.waiting = nil
}

// enter waits for a place for one request to endpointID, at most
// gateWait and until ctx ends, and returns the call that gives it back
// when the request has ended; errReleased if the job is to go back to
// the queue unsent.
func (g *endpointGates) enter(ctx context.Context, endpointID int64) (leave func(), err error) {
	leave = func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		e := g.byEndpoint[endpointID]
		e.inFlight--
		e.admit()
	}
	g.mu.Lock()
	e := g.gate(endpointID)
	if time.Now().Before(e.heldUntil) {
		e.lastReleased = time.Now()
		g.mu.Unlock()
		return nil, errReleased
	}
	if len(e.waiting) == 0 && (!e.limited || e.inFlight < e.limit) {
		e.inFlight++
		g.mu.Unlock()
		return leave, nil
	}
	w := &gateWaiter{in: make(chan struct{})}
	e.waiting = append(e.waiting, w)
	g.mu.Unlock()
	return leave, g.wait(ctx, e, w)
}

// wait is enter's wait for w at e; it returns nil when w is let in.
func (g *endpointGates) wait(ctx context.Context, e *endpointGate, w *gateWaiter) error {
	timer := time.NewTimer(gateWait)
	defer timer.Stop()
	var err error
	select {
	case <-w.in:
	case <-timer.C:
		err = errReleased
	case <-ctx.Done():
		err = ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(e.waiting, w); i >= 0 {
		e.waiting = slices.Delete(e.waiting, i, i+1)
		if errors.Is(err, errReleased) {
			e.lastReleased = time.Now()
		}
		return err
	}
	if w.released {
		return errReleased
	}
	if err != nil { // let in as the wait ended: give the place to the next
		e.inFlight--
		e.admit()
	}
	return err
}
