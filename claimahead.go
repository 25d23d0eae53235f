// claimahead.go: the claim ahead of an endpoint's requests. The workers
// of a registered replica claim a healthy endpoint's jobs ahead of its
// requests, up to twice the requests they may have in flight to it
// (claimJobsSQL; the rule is schema.sql's outbox.lane_room), and hold
// those requests to that limit here, at the endpoint's gate
// (endpointGates), each job waiting for a request to end.
//
// It replaces the simple claim, which outbox.claim_due_jobs still is: a
// delivery takes its endpoint's place from its claim to the end of its
// request, and a request ending waits for the next claim's statement and
// commit before the place is used again. For a receiver that answers in
// milliseconds that wait, not the receiver, paces the endpoint: its
// cap's worth of requests a claim. The simple claim so holds an endpoint
// at the default cap (16) to little more than half the deliveries a
// second it gets claimed ahead (docs/performance.md has the figures):
// too much to give up for the simpler code. Claimed ahead, the next job
// is already in the process when a request ends, and starts at once.

package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// endpointGates hold this process's requests to each endpoint to the
// limit its latest claim ahead set (Job.laneLimit): the endpoint's cap
// less the deliveries of other replicas running at that claim. A claim
// ahead takes up to twice that, so that when a request ends the next
// starts here at once.
//
// Why the cap holds across replicas (outbox.lane_room): every claim
// counts each other replica's running jobs whole, those waiting at its
// gates included. A claim ahead at time t keeps this process's requests
// to the cap less the others' jobs at t, and the others' jobs only
// shrink until one of them claims, whose claim counts this process's
// jobs, the waiting ones too. Every job with an endpoint passes its gate,
// also those of a claim that sets no limit (not ahead: its claim counts
// this process's waiting jobs as in flight, so whatever it takes may
// start). Limits are set by the workers' claims alone, one at a time
// (claimer.fill), in the order they were taken.
//
// A job waits at most gateWait, holding its worker, and is then released
// unsent: back in the queue as before its claim (jobReleased), so that a
// receiver that slows down holds its cap of workers, not twice it; its
// endpoint is then cooling for gateCooling, claimed no further than its
// cap (cooling). An answer that failed or asked to wait (a Retry-After)
// releases every job waiting for that endpoint, and a Retry-After every
// job that comes to its gate before the hold ends: the next claim sees
// the endpoint as that answer left it, as it would have without claims
// ahead.
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
// claim ahead set one), its requests in flight, the jobs waiting for one
// to end, first come first in, and until when an answer asked it to
// wait. Kept once made: a limit dropped while jobs of a claim ahead were
// about to enter would let them all in.
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

// claimed notes a claim's job of endpointID, in the order the claim took
// them: a claim ahead (limited) sets the endpoint's limit, letting in whom
// a higher one admits; and any claim of an endpoint's job ends this
// process's hold of it. The claim read the endpoint's hold as the
// database keeps it (held_until, which every replica's claims read, on
// the database's clock), so a job it returns is due: the process's own
// hold only keeps back the jobs claimed before the answer that asked to
// wait.
func (g *endpointGates) claimed(endpointID int64, limit int, limited bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.gate(endpointID)
	e.heldUntil = time.Time{}
	if limited {
		e.limit, e.limited = limit, true
		e.admit()
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
