// claim.go: claiming due jobs, the step between the job table and the
// workers: one statement (schema.sql, outbox.claim_lane_jobs) takes due
// jobs into the pool's free slots. The claimed job and its columns are
// declared here once; the claim ahead of an endpoint's requests, and the
// gates that hold them to its cap, are claimahead.go.

package main

import (
	"context"
	"database/sql"
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
	// batch), or it heads an ordered lane (outbox.claim_lane_jobs).
	wakeOnOutcome bool
	// yieldsToLive, from the claim, marks a replayed delivery claimed
	// into a replay lane narrowed by live traffic: when it ends, its
	// place waits for the next claim, or replayYield for one of its own
	// (outbox.claim_lane_jobs, replay_yields).
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
	// a claim that does not claim ahead sets none (claimahead.go).
	laneLimit   int
	laneLimited bool
	Event       Event
}

// deliveryEndpoint is an endpoint as one attempt sees it.
type deliveryEndpoint struct {
	URL            string
	Secrets        [][]byte // as stored, sealed if a key is set (secrets.go); current first, then the previous during a rotation
	DisabledReason *string
	// request is its own retry schedule, timeout and headers
	// (endpointrequest.go).
	request endpointRequest
	// PublicKeys holds, for each of Secrets, in its place, the ed25519
	// public key of a secret that is a v1a seed, nil for a v1 HMAC key
	// (signingKeysOf).
	PublicKeys [][]byte
}

// jobHandler runs one attempt of a job. Its error, if any, is the outcome
// decideOutcome reads: permanentError and retryAfterError steer it.
type jobHandler func(ctx context.Context, job Job) error

// claimBatchMax bounds one claim: big enough that a backlog costs one
// round trip per many jobs, small enough to share work among replicas.
const claimBatchMax = 100

// claimer takes due jobs into the free slots of one worker pool (fill).
// A claimed batch of jobs runs in a slot of its own, started by the pool
// (jobStarter).
type claimer struct {
	db *sql.DB
	// replica, if set, is the registry whose id every claim records
	// (replicas.go); nil claims under no id, rescued by the horizon alone.
	replica *replicaRegistry
	pool    jobStarter
	// kinds are the job kinds the pool runs (workerPool.kinds): every
	// claim takes jobs of these kinds alone.
	kinds []string

	slots     chan struct{} // one token per running batch
	slotFreed chan struct{} // poked when a slot frees
	// answered are the deliveries whose attempt has succeeded and whose
	// outcome the completer has not written yet: each claim passes them,
	// so that an endpoint's cap counts requests in flight, not outcomes
	// waiting for their batch's commit (schema.sql, outbox.lane_room).
	answered answeredJobs
	// gates hold this process's requests to each endpoint to the limit its
	// latest claim ahead set: a claim takes more of a healthy endpoint's
	// jobs than may be in flight, and they start as requests end
	// (claimahead.go).
	gates endpointGates

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

// fill claims into the free slots and starts what it claimed, when at
// least atFree slots are free, or any while the last claim came back
// short (moreDue false). It reports whether the claim filled every slot
// it asked for: then more may be due. A claim in flight runs to its end
// when shutdown begins: cancelled after its statement committed, its
// jobs would be running, held by no worker here, until a rescue returned
// them. Claimed, they run within the grace period like any.
func (c *claimer) fill(ctx context.Context, atFree int, moreDue bool) (bool, error) {
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
// (schema.sql, worker_share of outbox.lane_room): half. An endpoint's max_in_flight (up to 1,000) bounds its
// requests over every replica, not its part of one replica's workers,
// and the round robin shares workers only between endpoints with work
// due at the moment of a claim: without a bound, a slow receiver's
// backlog claimed while nothing else was due takes every free worker and
// holds each for as long as the receiver takes to answer, and the next
// delivery to any other endpoint waits for one of them. Half is what the
// round robin gives an endpoint beside one other with work due at every
// claim. At least 1: a single worker
// serves every endpoint in turn. docs/endpoints.md#endpoint-isolation
// has the command that measures what it keeps from another endpoint's
// latency.
func (c *claimer) workerShare() int {
	return max(1, cap(c.slots)/2)
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
// returns each with its event and, for a delivery, its endpoint, and its
// lane limit. $3 are the answered deliveries, $4 the endpoints cooling
// (endpointGates.cooling), $5 the workerShare and $6 the kinds the
// workers run, the only ones it claims (schema.sql,
// outbox.claim_lane_jobs). It claims ahead (claimahead.go). After each
// job's lane limit come its endpoint's request settings
// (endpointRequestColumns), read beside the claim rather than returned by
// it, then whether its event is a test send's (topics.go), which /metrics
// leaves out (webhookSender.observe). The statement locks every table it names as it is
// parsed, before the claim runs: it names the claimed job's event first,
// so that it takes outbox.events before the endpoints and the jobs, in
// the order a migration locks them (migrate.go). Both joins are outer: a
// job the claim's own snapshot found, and the outer one not, still
// comes back, with the service's defaults.
const claimJobsSQL = `
WITH claimed AS MATERIALIZED (
  SELECT ` + claimedColumns + `, claim.lane_limit
  FROM outbox.claim_lane_jobs($1, $2, $3, true, $4, $5, $6) AS claim, LATERAL (SELECT (claim.job).*) AS job
)
SELECT claimed.*, ` + endpointRequestColumns + `,
       e.test IS TRUE AS test
FROM claimed
LEFT JOIN outbox.events AS e ON e.id = claimed.event_id
LEFT JOIN outbox.endpoints AS ep ON ep.id = claimed.endpoint_id`

// claimedColumns are the attributes of schema.sql's outbox.claimed_job, in
// the order claimedRow.dest scans them, before the claim's lane_limit.
const claimedColumns = `
       id, kind, attempt, max_attempts, endpoint_id,
       event_id, topic, subject, payload, created_at,
       traceparent, tracestate,
       url, secret, previous_secret, disabled_reason,
       start_in_ms, wake_on_outcome, replay_yields,
       resend_window_seconds, claimed_at,
       committed_at,
       public_key, previous_public_key`

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
	jobs, err := queryAll(ctx, c.db, scan, claimJobsSQL, n, replica, pq.Array(c.answered.list()),
		pq.Array(c.gates.cooling()), c.workerShare(), pq.Array(c.kinds))
	c.claims.Observe(time.Since(sent).Seconds())
	c.claimedJobs.Add(int64(len(jobs)))
	if err != nil {
		c.claimFailed(replica, err)
		return nil, fmt.Errorf("claim jobs: %w", err)
	}
	for _, j := range jobs {
		if j.EndpointID != 0 {
			c.gates.claimed(j.EndpointID, j.laneLimit, j.laneLimited)
		}
	}
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

// claimedRow is an outbox.claimed_job, in claimedColumns' order, its
// lane limit, and its endpoint's request settings.
type claimedRow struct {
	id, attempt, maxAttempts, endpointID, eventID, startInMS sql.NullInt64
	resendWindowSeconds, laneLimit                           sql.NullInt64
	kind, topic, subject, url                                sql.NullString
	traceparent, tracestate, disabledReason                  *string
	payload, secret, previous                                []byte
	publicKey, previousPublicKey                             []byte
	createdAt, claimedAt, committedAt                        sql.NullTime
	wakeOnOutcome, yieldsToLive                              sql.NullBool
	// endpointRequestColumns'
	epMaxAttempts, retryWindowSeconds, timeoutSeconds sql.NullInt64
	firstFailure                                      sql.NullTime
	headers, secretHeaders                            []byte
	test                                              bool
}

// dest is what Scan fills, in the columns' order.
func (r *claimedRow) dest() []any {
	return []any{&r.id, &r.kind, &r.attempt, &r.maxAttempts, &r.endpointID,
		&r.eventID, &r.topic, &r.subject, &r.payload, &r.createdAt,
		&r.traceparent, &r.tracestate,
		&r.url, &r.secret, &r.previous, &r.disabledReason, &r.startInMS, &r.wakeOnOutcome, &r.yieldsToLive,
		&r.resendWindowSeconds, &r.claimedAt, &r.committedAt,
		&r.publicKey, &r.previousPublicKey, &r.laneLimit,
		&r.epMaxAttempts, &r.retryWindowSeconds, &r.firstFailure, &r.timeoutSeconds, &r.headers, &r.secretHeaders, &r.test}
}

// request is the row's endpoint's request settings.
func (r *claimedRow) request() endpointRequest {
	return endpointRequest{
		maxAttempts:   int(r.epMaxAttempts.Int64),
		retryWindow:   time.Duration(r.retryWindowSeconds.Int64) * time.Second,
		firstFailure:  r.firstFailure.Time,
		timeout:       time.Duration(r.timeoutSeconds.Int64) * time.Second,
		headers:       r.headers,
		secretHeaders: r.secretHeaders,
	}
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
			Test:        r.test,
		},
	}
	if r.startInMS.Int64 > 0 {
		j.startAt = sent.Add(time.Duration(r.startInMS.Int64) * time.Millisecond)
	}
	if r.url.Valid {
		j.endpoint = &deliveryEndpoint{URL: r.url.String, Secrets: [][]byte{r.secret}, DisabledReason: r.disabledReason,
			request: r.request(), PublicKeys: [][]byte{r.publicKey}}
		if r.previous != nil {
			j.endpoint.Secrets = append(j.endpoint.Secrets, r.previous)
			j.endpoint.PublicKeys = append(j.endpoint.PublicKeys, r.previousPublicKey)
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
