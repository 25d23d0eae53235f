// replaylane_test.go: the replay lane (docs/replays.md): replays and
// retries of discarded deliveries run behind an endpoint's live
// deliveries, at most a quarter of its cap at once (one at a time while
// live deliveries flow); their progress reads
// right, and a cancel ends their waiting jobs visibly, without a request.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// The share is a quarter of the cap, at least 1, in Go (the dry run's
// estimate) and in the database (the claim) alike; the default cap of 16
// replays 4 at once.
func TestReplayShareNumbers(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	for limit, want := range map[int]int{1: 1, 2: 1, 4: 1, 7: 1, 8: 2, 16: 4, 17: 4, 1000: 250} {
		if got := replayShare(limit); got != want {
			t.Errorf("replayShare(%d) = %d, want %d", limit, got, want)
		}
		if got := queryInt(t, db, `SELECT outbox.replay_share($1)`, limit); got != want {
			t.Errorf("outbox.replay_share(%d) = %d, want %d", limit, got, want)
		}
	}
}

// A claim asks whether live deliveries flow to a lane (live_flows) once
// per lane in each of its two statements (the first asks only for a lane
// with replayed work alone, as here, through replay_width), and both
// functions keep their plans for the session. As SQL functions, whose
// subquery keeps them from being inlined, they were parsed and planned
// again in every claim, and the claim asked twice per lane in its second
// statement (the subquery, flattened, was copied into both uses of the
// width): a third of a claim's time in a drain.
// pg_stat_xact_user_functions counts this transaction's calls;
// track_functions = all counts SQL functions too, so the test sees the
// calls whatever language the functions are in.
func TestClaimAsksWhetherLiveFlowsOncePerLane(t *testing.T) {
	t.Parallel()
	db, _ := newReplayingEndpoint(t, 10)
	langs := queryStrings(t, db, `
		SELECT p.proname || ' ' || l.lanname FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
		WHERE p.oid IN ('outbox.live_flows(bigint)'::regprocedure, 'outbox.replay_width(bigint, integer)'::regprocedure)
		ORDER BY p.proname`)
	if diff := cmp.Diff([]string{"live_flows plpgsql", "replay_width plpgsql"}, langs); diff != "" {
		t.Errorf("the claim's functions and their languages (-want +got); in sql they are planned again in every statement:\n%s", diff)
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SET LOCAL track_functions = 'all'`); err != nil {
		t.Fatal(err)
	}
	var claimed int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM outbox.claim_due_jobs(100)`).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	var calls int
	if err := tx.QueryRowContext(ctx, `
		SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
		WHERE schemaname = 'outbox' AND funcname = 'live_flows'`).Scan(&calls); err != nil {
		t.Fatal(err)
	}
	if claimed != 2 || calls != 2 {
		t.Errorf("a claim from one endpoint's replay lane took %d jobs and asked live_flows %d times; want 2 jobs (its share of a cap of 8) and 2 calls", claimed, calls)
	}
}

// replayFor enqueues the endpoint's replay of everything recorded in the
// last day through the API and returns its answer.
func replayFor(t *testing.T, api *testAPI, endpointID int64) ReplayResult {
	t.Helper()
	since := time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339)
	status, body := api.do("POST", "/api/endpoints/"+itoa(endpointID)+"/replay", `{"since": "`+since+`"}`)
	var res ReplayResult
	if err := json.Unmarshal(body, &res); status != http.StatusOK || err != nil || res.ReplayID == 0 {
		t.Fatalf("replay: %d %s, want 200 with a replay_id", status, body)
	}
	return res
}

// replaysOf reads GET /api/endpoints/{id}/replays.
func replaysOf(t *testing.T, api *testAPI, endpointID int64) []ReplayView {
	t.Helper()
	status, body := api.do("GET", "/api/endpoints/"+itoa(endpointID)+"/replays", "")
	var page struct {
		Replays []ReplayView `json:"replays"`
	}
	if err := json.Unmarshal(body, &page); status != http.StatusOK || err != nil {
		t.Fatalf("GET replays: %d %s", status, body)
	}
	return page.Replays
}

// seedFanned records n events of subject for the endpoint at url, fanned
// out an hour ago and never delivered to it: what a replay of the last
// day enqueues a new job for.
func seedFanned(t *testing.T, db *sql.DB, url, subject string, n int) {
	t.Helper()
	mustExec(t, db, `INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at)
		SELECT $1, $2, now() - interval '1 hour', now() - interval '1 hour' FROM generate_series(1, $3)`,
		topicFor(url)+".e", subject, n)
}

// replayingHook is newReplayingEndpoint's URL: nothing answers there,
// and the tests that use it only claim.
const replayingHook = "http://192.0.2.1:9"

// newReplayingEndpoint is a fresh database with one endpoint, at
// replayingHook with a cap of 8 (a replay share of 2), replaying n events
// recorded an hour ago.
func newReplayingEndpoint(t *testing.T, n int) (*sql.DB, Endpoint) {
	t.Helper()
	return newReplayingEndpointCapped(t, n, 8)
}

// newReplayingEndpointCapped is newReplayingEndpoint with a cap of
// maxInFlight.
func newReplayingEndpointCapped(t *testing.T, n, maxInFlight int) (*sql.DB, Endpoint) {
	t.Helper()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := createTunedEndpoint(t, api, replayingHook, `"max_in_flight": `+strconv.Itoa(maxInFlight))
	seedFanned(t, db, replayingHook, "old", n)
	replayFor(t, api, ep.ID)
	return db, ep
}

// claimLanes runs one claim of up to 100 jobs and counts what it took:
// live deliveries and replayed ones.
func claimLanes(t *testing.T, db *sql.DB) (live, replayed int) {
	t.Helper()
	return claimBatch(t, db, 100)
}

// claimBatch is claimLanes for a claim of up to batch jobs.
func claimBatch(t *testing.T, db *sql.DB, batch int) (live, replayed int) {
	t.Helper()
	for _, r := range queryStrings(t, db, `
		SELECT (j.replay_id IS NOT NULL)::text
		FROM outbox.claim_due_jobs(`+strconv.Itoa(batch)+`) AS c
		JOIN outbox.jobs AS j ON j.id = c.id`) {
		if r == "true" {
			replayed++
		} else {
			live++
		}
	}
	return live, replayed
}

// A claim takes an endpoint's live deliveries before its replayed ones,
// however much older those are, and replayed ones only in the room left
// and never more than the share (2 of a cap of 8) running at once; a
// replay alone runs at its share, not at the cap.
func TestClaimTakesLiveBeforeReplayWithinTheShare(t *testing.T) {
	t.Parallel()
	const hook = replayingHook
	db, _ := newReplayingEndpoint(t, 10)
	mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() - interval '1 hour' WHERE replay_id IS NOT NULL`)
	recordFor(t, db, hook, 10)
	// Fanned out a minute ago: the endpoint is quiet, and its replay lane
	// as wide as its share (TestReplayLaneNarrowsWhileLiveFlows).
	mustExec(t, db, `UPDATE outbox.fanout_stats SET last_fanned_at = now() - interval '1 minute'`)
	finish := func(replayed bool, n int) {
		t.Helper()
		mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', finalized_at = now()
			WHERE id IN (SELECT id FROM outbox.jobs WHERE state = 'running' AND (replay_id IS NOT NULL) = $1 ORDER BY id LIMIT $2)`,
			replayed, n)
	}
	for i, step := range []struct {
		before               func()
		live, replayed       int
		liveRun, replayedRun int // running after the claim
	}{
		// 10 live due, 10 replayed due for an hour: the cap goes to live.
		{nil, 8, 0, 8, 0},
		// 2 live left, 6 slots free: both, and the share of replayed.
		{func() { finish(false, 8) }, 2, 2, 2, 2},
		// 4 slots free, but the share is taken.
		{nil, 0, 0, 2, 2},
		// Live all done, 6 slots free: still the share, no more.
		{func() { finish(false, 2) }, 0, 0, 0, 2},
		// One replayed done: one more.
		{func() { finish(true, 1) }, 0, 1, 0, 2},
	} {
		if step.before != nil {
			step.before()
		}
		live, replayed := claimLanes(t, db)
		liveRun := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'running' AND replay_id IS NULL`)
		replayedRun := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'running' AND replay_id IS NOT NULL`)
		if live != step.live || replayed != step.replayed || liveRun != step.liveRun || replayedRun != step.replayedRun {
			t.Errorf("claim %d took %d live and %d replayed, leaving %d and %d running; want %d and %d, leaving %d and %d",
				i+1, live, replayed, liveRun, replayedRun, step.live, step.replayed, step.liveRun, step.replayedRun)
		}
	}
}

// A claim serves the live deliveries of every endpoint before any
// replayed one, however long that has waited: endpoints with live work
// come before those with replayed work alone, and of the jobs the lanes
// lock, every live one is taken first. A claim of 1, with endpoint A's
// replay due for an hour and B's live delivery due now, takes B's; a
// claim of 3, with a live delivery for A too and one more for B, takes
// the 3 live ones, though A's lane also locked its replayed ones.
func TestClaimTakesLiveOfAnyEndpointFirst(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const replaying, busy = "http://192.0.2.1:9", "http://192.0.2.2:9"
	a := createTunedEndpoint(t, api, replaying, `"max_in_flight": 8`)
	b := createTunedEndpoint(t, api, busy, `"max_in_flight": 8`)
	seedFanned(t, db, replaying, "old", 3)
	replayFor(t, api, a.ID)
	mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() - interval '1 hour' WHERE replay_id IS NOT NULL`)
	recordFor(t, db, busy, 1)
	got := queryStrings(t, db, `SELECT c.endpoint_id::text FROM outbox.claim_due_jobs(1) AS c`)
	if len(got) != 1 || got[0] != itoa(b.ID) {
		t.Errorf("a claim of 1 took the jobs of endpoints %v, want the live delivery of endpoint %d", got, b.ID)
	}
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', finalized_at = now() WHERE state = 'running'`)
	recordFor(t, db, replaying, 1)
	recordFor(t, db, busy, 2)
	if live, replayed := claimBatch(t, db, 3); live != 3 || replayed != 0 {
		t.Errorf("a claim of 3 took %d live and %d replayed, want 3 and 0", live, replayed)
	}
}

// gatedReceiver answers live deliveries at once and holds the replayed
// ones (events up to replayedUpTo) until release is closed, counting
// them in flight.
type gatedReceiver struct {
	*receiver
	replayedUpTo int64
	release      chan struct{}
	releaseOnce  sync.Once
	replayed     concurrency
	all          concurrency
}

// open lets the held requests and every later one through.
func (g *gatedReceiver) open() { g.releaseOnce.Do(func() { close(g.release) }) }

func newGatedReceiver(t *testing.T) *gatedReceiver {
	g := &gatedReceiver{release: make(chan struct{})}
	t.Cleanup(g.open)
	g.receiver = newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		g.all.enter()
		defer g.all.leave()
		id, err := strconv.ParseInt(r.Header.Get("webhook-id"), 10, 64)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if id <= g.replayedUpTo {
			g.replayed.enter()
			defer g.replayed.leave()
			select {
			case <-g.release:
			case <-r.Context().Done():
			}
		}
	})
	return g
}

// End to end: while a replay of 20 events to an endpoint with a cap of 8
// holds its share (2) of requests at the receiver, 12 live deliveries go
// through the other 6 slots; the replay never has more than 2 requests in
// flight (the 2 it had when live ones began keep their places; the lane
// then narrows to 1 as they finish), drains once its receiver answers,
// and its progress says so.
func TestReplayLaneHoldsItsShareWhileLiveFlows(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newGatedReceiver(t)
	ep := createTunedEndpoint(t, api, rc.srv.URL, `"max_in_flight": 8`)
	seedFanned(t, db, rc.srv.URL, "old", 20)
	rc.replayedUpTo = int64(queryInt(t, db, `SELECT max(id) FROM outbox.events`))
	runWebhookWorkers(t, db, 30*time.Second) // 8 workers

	res := replayFor(t, api, ep.ID)
	if res.Jobs != 20 {
		t.Fatalf("the replay enqueued %d jobs, want 20", res.Jobs)
	}
	waitFor(t, "the replay to hold its share at the receiver", 10*time.Second, func() bool { return rc.replayed.now.Load() == 2 })
	recordFor(t, db, rc.srv.URL, 12)
	waitFor(t, "12 live deliveries beside the held replay", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND replay_id IS NULL AND outcome = 'completed'`, ep.ID) == 12
	})
	if n := rc.replayed.now.Load(); n != 2 {
		t.Errorf("%d replayed requests in flight after the live ones, want the share, 2", n)
	}
	replays := replaysOf(t, api, ep.ID)
	if len(replays) != 1 || replays[0].ID != res.ReplayID || replays[0].Total != 20 || replays[0].Done != 0 ||
		replays[0].Pending != 20 || replays[0].Running != 2 || replays[0].State != "running" || replays[0].FinishedAt != nil {
		t.Errorf("replays while held: %+v, want replay %d running, 0 of 20 done, 20 pending, 2 running", replays, res.ReplayID)
	}

	rc.open()
	waitFor(t, "the replay to drain", 20*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE replay_id = $1 AND outcome = 'completed'`, res.ReplayID) == 20
	})
	if peak := rc.replayed.peak.Load(); peak != 2 {
		t.Errorf("the receiver saw %d replayed requests at once, want the share, 2", peak)
	}
	if peak := rc.all.peak.Load(); peak > 8 {
		t.Errorf("the receiver saw %d requests at once, more than the cap, 8", peak)
	}
	replays = replaysOf(t, api, ep.ID)
	if len(replays) != 1 || replays[0].State != "finished" || replays[0].Done != 20 || replays[0].Pending != 0 ||
		replays[0].FinishedAt == nil || replays[0].ExpectedFinish != nil || replays[0].Rate <= 0 {
		t.Errorf("replays after the drain: %+v, want it finished, 20 done, with a rate", replays)
	}
}

// While live deliveries flow to an endpoint (the relay fanned some out
// to it within the last second), its replay lane runs one replayed
// delivery at a time, not its share, and that delivery's end does not
// wake the claim loop on its own (replay_yields): the next claim takes
// its place. Quiet again, the lane is as wide as its share. Cap 8, a
// share of 2; and cap 4, a share of 1, where the width does not change
// but the replayed delivery yields all the same (it woke a claim of its
// own when narrowing was read from the width). 6 replayed deliveries due.
func TestReplayLaneNarrowsWhileLiveFlows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		maxInFlight             int
		quiet, live, quietAgain []string
	}{
		{8, []string{"true true false", "true true false"}, []string{"true false true", "false false false"}, []string{"true true false"}},
		{4, []string{"true true false"}, []string{"true false true", "false false false"}, nil},
	} {
		t.Run("max_in_flight="+strconv.Itoa(tc.maxInFlight), func(t *testing.T) {
			t.Parallel()
			const hook = replayingHook
			db, ep := newReplayingEndpointCapped(t, 6, tc.maxInFlight)
			claim := func() []string {
				t.Helper()
				return queryStrings(t, db, `
					SELECT (j.replay_id IS NOT NULL)::text || ' ' || c.wake_on_outcome::text || ' ' || c.replay_yields::text
					FROM outbox.claim_due_jobs(100, NULL::bigint, '{}') AS c
					JOIN outbox.jobs AS j ON j.id = c.id
					ORDER BY j.replay_id IS NULL, j.id`)
			}
			finishReplayed := func() {
				t.Helper()
				mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', finalized_at = now() WHERE state = 'running' AND replay_id IS NOT NULL`)
			}

			// Quiet: the share, each filling it, none yielding.
			if diff := cmp.Diff(tc.quiet, claim()); diff != "" {
				t.Errorf("quiet endpoint: claimed (replayed, wake on outcome, yields) (-want +got):\n%s", diff)
			}
			finishReplayed()

			// A live event fanned out by the relay: its delivery, and one replayed.
			recordFor(t, db, hook, 1)
			if n := queryInt(t, db, `SELECT count(*) FROM outbox.fanout_stats AS f
				WHERE f.endpoint_id = $1 AND f.last_fanned_at >= (SELECT max(e.created_at) FROM outbox.events AS e)`, ep.ID); n != 1 {
				t.Fatalf("%d fanout_stats rows of endpoint %d note the live fan-out, want 1", n, ep.ID)
			}
			// However slow this machine, the fan-out stays within the last second.
			mustExec(t, db, `UPDATE outbox.fanout_stats SET minute = date_trunc('minute', now() + interval '1 hour'), last_fanned_at = now() + interval '1 hour'`)
			if diff := cmp.Diff(tc.live, claim()); diff != "" {
				t.Errorf("live flowing: claimed (replayed, wake on outcome, yields) (-want +got):\n%s", diff)
			}
			if got := claim(); len(got) != 0 {
				t.Errorf("live flowing, one replayed running: claimed %v, want nothing", got)
			}

			// Quiet again, the replayed one still running: the rest of
			// the share, if any.
			mustExec(t, db, `UPDATE outbox.fanout_stats SET last_fanned_at = now() - interval '2 seconds'`)
			if diff := cmp.Diff(tc.quietAgain, claim(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("quiet again: claimed (replayed, wake on outcome, yields) (-want +got):\n%s", diff)
			}
		})
	}
}

// A replay beside a trickle of live deliveries does not wait for the poll:
// with live deliveries flowing (held so for the test) and a poll of a
// minute, the narrowed lane's deliveries still follow one another, each
// claimed replayYield after the last one's end at the latest. One at a
// time: the receiver never sees two replayed requests at once.
func TestNarrowedReplayLaneClaimsWithoutLiveTraffic(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newGatedReceiver(t)
	rc.open()
	ep := createTunedEndpoint(t, api, rc.srv.URL, `"max_in_flight": 8`)
	seedFanned(t, db, rc.srv.URL, "old", 10)
	rc.replayedUpTo = int64(queryInt(t, db, `SELECT max(id) FROM outbox.events`))
	mustExec(t, db, `INSERT INTO outbox.fanout_stats (endpoint_id, minute, deliveries, last_fanned_at)
		VALUES ($1, date_trunc('minute', now() + interval '1 hour'), 1, now() + interval '1 hour')`, ep.ID)
	res := replayFor(t, api, ep.ID)

	runWebhookWorkersPolling(t, db, 10*time.Second, time.Minute)

	waitFor(t, "the replay to drain without a poll", 20*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE replay_id = $1 AND outcome = 'completed'`, res.ReplayID) == 10
	})
	if peak := rc.replayed.peak.Load(); peak != 1 {
		t.Errorf("the receiver saw %d replayed requests at once, want 1: the lane narrowed by live traffic", peak)
	}
}

// Progress counts what its jobs did, and a cancel discards the waiting
// ones without a request (no attempt, no delivery record), with the
// reason as their last error, while a running one finishes; the replay
// is finished once that one is.
func TestReplayProgressAndCancel(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const hook = "http://192.0.2.1:9"
	ep := createTunedEndpoint(t, api, hook, `"max_in_flight": 8`)
	other := createTunedEndpoint(t, api, hook+"/other", `"max_in_flight": 8`)
	seedFanned(t, db, hook, "s", 10)
	res := replayFor(t, api, ep.ID)
	if res.Jobs != 10 || queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1`, res.ReplayID) != 10 {
		t.Fatalf("the replay enqueued %d jobs, want 10 of replay %d", res.Jobs, res.ReplayID)
	}
	// 3 completed, 1 discarded by failing, 1 running, 5 waiting.
	mustExec(t, db, `
		WITH j AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox.jobs WHERE replay_id = $1)
		UPDATE outbox.jobs AS o
		SET state = CASE WHEN j.n <= 3 THEN 'completed' WHEN j.n = 4 THEN 'discarded' ELSE 'running' END::outbox.job_state,
		    attempt = 1, attempted_at = now(),
		    finalized_at = CASE WHEN j.n <= 4 THEN now() END
		FROM j
		WHERE o.id = j.id AND j.n <= 5`, res.ReplayID)

	replays := replaysOf(t, api, ep.ID)
	if len(replays) != 1 {
		t.Fatalf("%d replays, want 1", len(replays))
	}
	r := replays[0]
	if r.ID != res.ReplayID || r.Kind != "replay" || r.State != "running" || r.Total != 10 || r.Done != 4 ||
		r.Pending != 6 || r.Running != 1 || r.From == nil || r.To == nil || r.EnqueuedAt == nil || r.CancelledAt != nil || r.FinishedAt != nil {
		t.Errorf("progress: %+v, want replay %d running, 4 of 10 done, 6 pending, 1 running", r, res.ReplayID)
	}
	if r.Rate <= 0 || r.ExpectedFinish == nil || !r.ExpectedFinish.After(r.CreatedAt) {
		t.Errorf("progress: rate %v, expected finish %v; want a rate and a finish after the start %v", r.Rate, r.ExpectedFinish, r.CreatedAt)
	}

	cancelPath := "/api/endpoints/" + itoa(ep.ID) + "/replays/" + itoa(res.ReplayID) + "/cancel"
	status, body := api.do("POST", cancelPath, "")
	var c ReplayView
	if err := json.Unmarshal(body, &c); status != http.StatusOK || err != nil {
		t.Fatalf("cancel: %d %s", status, body)
	}
	if c.State != "cancelled" || c.CancelledAt == nil || c.Done != 9 || c.Pending != 1 || c.Running != 1 || c.FinishedAt != nil {
		t.Errorf("cancelled: %+v, want cancelled, 9 done, the running one pending", c)
	}
	var discarded, unsent, reasoned, held int
	if err := db.QueryRow(`
		SELECT count(*) FILTER (WHERE state = 'discarded' AND finalized_at IS NOT NULL),
		       count(*) FILTER (WHERE attempt = 0 AND NOT EXISTS (SELECT 1 FROM outbox.deliveries AS d WHERE d.job_id = j.id)),
		       count(*) FILTER (WHERE errors -> -1 ->> 'error' = 'replay cancelled by an operator'),
		       count(*) FILTER (WHERE scheduled_at = 'infinity')
		FROM outbox.jobs AS j
		WHERE replay_id = $1 AND state <> 'completed' AND id NOT IN (SELECT id FROM outbox.jobs WHERE state = 'running')`,
		res.ReplayID).Scan(&discarded, &unsent, &reasoned, &held); err != nil {
		t.Fatal(err)
	}
	// The 5 waiting, and the one discarded before (attempted once, another error).
	if discarded != 6 || unsent != 5 || reasoned != 5 || held != 0 {
		t.Errorf("after the cancel: %d discarded, %d of them unsent, %d with the cancel's error, %d held; want 6, 5, 5, 0",
			discarded, unsent, reasoned, held)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1 AND state = 'running'`, res.ReplayID); n != 1 {
		t.Errorf("%d running after the cancel, want the 1 that ran, left to finish", n)
	}
	// Visible where an operator looks for discarded deliveries.
	status, body = api.do("GET", "/api/jobs?state=discarded&endpoint_id="+itoa(ep.ID), "")
	var jobs struct {
		Jobs []JobView `json:"jobs"`
	}
	if err := json.Unmarshal(body, &jobs); status != http.StatusOK || err != nil || len(jobs.Jobs) != 6 {
		t.Fatalf("discarded jobs of the endpoint: %d %s, want 6", status, body)
	}
	newest := jobs.Jobs[0]
	var errs []struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(newest.Errors, &errs); err != nil || newest.ReplayID == nil || *newest.ReplayID != res.ReplayID ||
		len(errs) != 1 || errs[0].Error != "replay cancelled by an operator" {
		t.Errorf("a cancelled job as the API lists it: replay_id %v, errors %s; want %d and the cancel's error alone", newest.ReplayID, newest.Errors, res.ReplayID)
	}

	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', finalized_at = now() WHERE replay_id = $1 AND state = 'running'`, res.ReplayID)
	r = replaysOf(t, api, ep.ID)[0]
	if r.State != "cancelled" || r.FinishedAt == nil || r.Done != 10 || r.Pending != 0 {
		t.Errorf("after its running job finished: %+v, want cancelled and finished, 10 done", r)
	}
	status, body = api.do("POST", cancelPath, "")
	var again ReplayView
	if err := json.Unmarshal(body, &again); status != http.StatusOK || err != nil || !again.CancelledAt.Equal(*c.CancelledAt) {
		t.Errorf("a second cancel: %d %s, want 200 with the first cancel's time", status, body)
	}

	for _, tc := range []struct {
		path string
		want int
	}{
		{"/api/endpoints/" + itoa(other.ID) + "/replays/" + itoa(res.ReplayID) + "/cancel", http.StatusNotFound},
		{"/api/endpoints/" + itoa(ep.ID) + "/replays/" + itoa(res.ReplayID+100) + "/cancel", http.StatusNotFound},
		{"/api/endpoints/" + itoa(ep.ID) + "/replays/x/cancel", http.StatusBadRequest},
		{"/api/endpoints/" + itoa(ep.ID) + "/replays/0/cancel", http.StatusBadRequest},
	} {
		if status, body := api.do("POST", tc.path, ""); status != tc.want {
			t.Errorf("POST %s: %d %s, want %d", tc.path, status, body, tc.want)
		}
	}
	if status, body := api.do("GET", "/api/endpoints/"+itoa(other.ID+100)+"/replays", ""); status != http.StatusNotFound {
		t.Errorf("replays of no endpoint: %d %s, want 404", status, body)
	}
}

// In an ordered endpoint a replayed delivery holds its subject's lane
// like any other; cancelling the replay discards its held deliveries and
// lets the live one waiting behind them go.
func TestCancelAdvancesAnOrderedLane(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const hook = "http://192.0.2.1:9"
	ep := createTunedEndpoint(t, api, hook, `"ordering": "subject"`)
	seedFanned(t, db, hook, "s", 3)
	res := replayFor(t, api, ep.ID)
	live := record(t, db, topicFor(hook)+".e", "s")
	relayAll(t, db)
	due := func() []string {
		return queryStrings(t, db, `SELECT CASE WHEN replay_id IS NULL THEN 'live' ELSE 'replayed' END
			FROM outbox.jobs WHERE endpoint_id = `+itoa(ep.ID)+` AND state = 'available' AND scheduled_at < 'infinity' ORDER BY event_id`)
	}
	held := `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND scheduled_at = 'infinity'`
	if got := due(); len(got) != 1 || got[0] != "replayed" || queryInt(t, db, held, ep.ID) != 3 {
		t.Fatalf("before the cancel: due %v with %d held, want the first replayed one due and 3 held behind it", got, queryInt(t, db, held, ep.ID))
	}
	if status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/replays/"+itoa(res.ReplayID)+"/cancel", ""); status != http.StatusOK {
		t.Fatalf("cancel: %d %s", status, body)
	}
	if got := due(); len(got) != 1 || got[0] != "live" || queryInt(t, db, held, ep.ID) != 0 {
		t.Errorf("after the cancel: due %v with %d held, want the live one due and none held", got, queryInt(t, db, held, ep.ID))
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1 AND state = 'discarded'`, res.ReplayID); n != 3 {
		t.Errorf("%d replayed deliveries discarded, want 3", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1 AND replay_id IS NULL`, live); n != 1 {
		t.Errorf("the live event has %d live deliveries, want 1", n)
	}
}

// Retrying an endpoint's discarded deliveries is a replay too: its jobs
// run in the replay lane (one at a time for a cap of 4), it answers its
// id, and its progress is listed as a retry of discarded deliveries.
func TestRetryDiscardedRunsInTheReplayLane(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const hook = "http://192.0.2.1:9"
	ep := createTunedEndpoint(t, api, hook, `"max_in_flight": 4`)
	recordFor(t, db, hook, 5)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'discarded', attempt = 1, finalized_at = now() WHERE endpoint_id = $1`, ep.ID)

	status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/retry-discarded", "")
	var res RetryResult
	if err := json.Unmarshal(body, &res); status != http.StatusOK || err != nil || res.Jobs != 5 || res.ReplayID == 0 {
		t.Fatalf("retry discarded: %d %s, want 200 with 5 jobs and a replay_id", status, body)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1 AND state = 'available'`, res.ReplayID); n != 5 {
		t.Errorf("%d of the retried jobs wait in replay %d, want 5", n, res.ReplayID)
	}
	replays := replaysOf(t, api, ep.ID)
	if len(replays) != 1 || replays[0].Kind != "retry_discarded" || replays[0].Total != 5 || replays[0].Pending != 5 ||
		replays[0].From != nil || replays[0].Topics != nil {
		t.Errorf("replays: %+v, want one retry_discarded of 5, 5 pending, without a window", replays)
	}
	if live, replayed := claimLanes(t, db); live != 0 || replayed != 1 {
		t.Errorf("a claim took %d live and %d retried, want 0 and the share of a cap of 4, 1", live, replayed)
	}
}

// An endpoint keeps its newest 20 finished replays; an unfinished one,
// however old, stays.
func TestFinishedReplaysAreBounded(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const hook = "http://192.0.2.1:9"
	ep := createTunedEndpoint(t, api, hook, `"max_in_flight": 4`)
	seedFanned(t, db, hook, "s", 2)
	unfinished := replayFor(t, api, ep.ID).ReplayID
	var last int64
	for range 25 {
		last = replayFor(t, api, ep.ID).ReplayID // nothing left to replay: finished at once
	}
	replays := replaysOf(t, api, ep.ID)
	finished := 0
	for _, r := range replays {
		if r.FinishedAt != nil {
			finished++
		}
	}
	if len(replays) != 22 || finished != 21 || replays[0].ID != last || replays[len(replays)-1].ID != unfinished {
		t.Errorf("%d replays listed, %d finished, newest %d, oldest %d; want 22: the newest %d first, 20 kept and it finished, the unfinished %d last",
			len(replays), finished, replays[0].ID, replays[len(replays)-1].ID, last, unfinished)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.replays`); n != 22 {
		t.Errorf("%d replay rows, want 22", n)
	}
}

// The endpoint page lists the running replay with its progress and a
// Cancel button; clicking it cancels the replay, and the page then shows
// it cancelled, without the button.
func TestPanelShowsAndCancelsAReplay(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const hook = "http://192.0.2.1:9"
	ep := createTunedEndpoint(t, api, hook, `"max_in_flight": 8`)
	seedFanned(t, db, hook, "s", 4)
	res := replayFor(t, api, ep.ID)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', attempt = 1, attempted_at = now(), finalized_at = now()
		WHERE id = (SELECT min(id) FROM outbox.jobs WHERE replay_id = $1)`, res.ReplayID)
	pagePath := "/endpoints/" + itoa(ep.ID)
	button := `<button id="cancel-replay-` + itoa(res.ReplayID) + `">Cancel</button>`

	_, page := panelPage(t, api.srv, pagePath)
	mustContain(t, "the endpoint's page", page,
		`at most 2 at once`,
		`<tr id="replay-`+itoa(res.ReplayID)+`">`,
		`<td class="replay-running">running</td>`,
		`<td class="replay-progress">1 / 4 (3 pending, 0 running)</td>`,
		`<td class="replay-finish"><time`,
		button)

	browser := signIn(t, api.srv)
	status, _, location := postPanelForm(t, browser, api.srv, pagePath+"/cancel-replay", url.Values{"replay_id": {itoa(res.ReplayID)}})
	if status != http.StatusSeeOther || location != pagePath+"?done="+url.QueryEscape("Replay "+itoa(res.ReplayID)+" cancelled: its waiting deliveries were discarded without a request; 0 already running will finish.") {
		t.Fatalf("cancel: %d to %q, want 303 to the endpoint's page saying it was cancelled", status, location)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1 AND state = 'discarded'`, res.ReplayID); n != 3 {
		t.Errorf("clicking Cancel discarded %d deliveries, want the 3 waiting", n)
	}
	_, page = panelPage(t, api.srv, location)
	mustContain(t, "the page after the cancel", page, `<td class="replay-cancelled">cancelled, ended <time`, `<td class="replay-progress">4 / 4</td>`)
	mustLack(t, "the page after the cancel", page, button)

	status, _, _ = postPanelForm(t, browser, api.srv, pagePath+"/cancel-replay", url.Values{"replay_id": {"x"}})
	if status != http.StatusBadRequest {
		t.Errorf("cancel with replay_id x: %d, want 400", status)
	}
}

// A replay counts its jobs when it starts and enqueues them a batch of
// 500 events at a time, the next only once fewer than 500 of its jobs
// wait: of 1,600 events, the POST enqueues 500 and answers the count;
// progress counts the 1,100 not yet enqueued as pending; a replay still
// enqueuing is not taken for finished, however old; and its last batch
// (100 events, fewer than 500) ends its enqueue.
func TestReplayEnqueuesABatchAtATime(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const hook = "http://192.0.2.1:9"
	ep := createTunedEndpoint(t, api, hook, `"max_in_flight": 8`)
	seedFanned(t, db, hook, "s", 1600)
	res := replayFor(t, api, ep.ID)
	enqueued := func() int {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1`, res.ReplayID)
	}
	if res.Jobs != 1600 || enqueued() != 500 {
		t.Fatalf("the POST answered %d jobs and enqueued %d, want the count, 1600, and one batch, 500", res.Jobs, enqueued())
	}
	// Older than the hour after which an unmarked enqueue is taken for
	// cut off by a crash: a replay's is carried on instead.
	mustExec(t, db, `UPDATE outbox.replays SET created_at = now() - interval '2 hours' WHERE id = $1`, res.ReplayID)
	if r := replaysOf(t, api, ep.ID)[0]; r.Total != 1600 || r.Pending != 1600 || r.Done != 0 || r.State != "running" || r.EnqueuedAt != nil {
		t.Errorf("progress after the first batch: %+v, want running, 0 of 1600 done, 1600 pending, not enqueued", r)
	}
	feed := func() {
		t.Helper()
		if err := feedReplays(context.Background(), db, 18); err != nil {
			t.Fatal(err)
		}
	}
	finish := func(n int) {
		t.Helper()
		mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', attempt = 1, attempted_at = now(), finalized_at = now()
			WHERE id IN (SELECT id FROM outbox.jobs WHERE replay_id = $1 AND state = 'available' ORDER BY id LIMIT $2)`, res.ReplayID, n)
	}
	feed()
	if n := enqueued(); n != 500 {
		t.Errorf("with 500 waiting, a feed enqueued %d in all, want still 500", n)
	}
	finish(1)
	feed()
	if n := enqueued(); n != 1000 {
		t.Errorf("with 499 waiting, a feed enqueued %d in all, want 1000", n)
	}
	if r := replaysOf(t, api, ep.ID)[0]; r.Total != 1600 || r.Pending != 1599 || r.Done != 1 || r.EnqueuedAt != nil {
		t.Errorf("progress after the second batch: %+v, want 1 of 1600 done, 1599 pending, not enqueued", r)
	}
	finish(1000)
	feed()
	finish(1000)
	feed()
	if n := enqueued(); n != 1600 {
		t.Errorf("after two more feeds %d enqueued, want 1600", n)
	}
	finish(1000)
	r := replaysOf(t, api, ep.ID)[0]
	if r.Total != 1600 || r.Done != 1600 || r.Pending != 0 || r.State != "finished" || r.EnqueuedAt == nil {
		t.Errorf("progress once drained: %+v, want finished, 1600 of 1600 done", r)
	}
	var jobsEnqueued int
	if err := db.QueryRow(`SELECT jobs_enqueued FROM outbox.replays WHERE id = $1`, res.ReplayID).Scan(&jobsEnqueued); err != nil || jobsEnqueued != 1600 {
		t.Errorf("jobs_enqueued %d (%v), want 1600", jobsEnqueued, err)
	}
}

// The count a replay starts with is what the events then were: an event
// whose delivery to the endpoint is still pending when its batch comes is
// left to it, and the last batch sets the total to the jobs enqueued
// (1,000 of 1,010). A cancel between batches ends the enqueue: the total
// is what was enqueued, and no feed adds to it.
func TestReplayTotalIsWhatItEnqueued(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const hook = "http://192.0.2.1:9"
	ep := createTunedEndpoint(t, api, hook, `"max_in_flight": 8`)
	seedFanned(t, db, hook, "s", 1010)
	res := replayFor(t, api, ep.ID)
	if res.Jobs != 1010 {
		t.Fatalf("the POST answered %d jobs, want the count, 1010", res.Jobs)
	}
	// The last 10 events get a live delivery still waiting.
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts)
		SELECT 'webhook', id, $1, 18 FROM outbox.events ORDER BY id DESC LIMIT 10`, ep.ID)
	for range 3 {
		mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', attempt = 1, attempted_at = now(), finalized_at = now()
			WHERE replay_id = $1 AND state = 'available'`, res.ReplayID)
		if err := feedReplays(context.Background(), db, 18); err != nil {
			t.Fatal(err)
		}
	}
	if r := replaysOf(t, api, ep.ID)[0]; r.Total != 1000 || r.EnqueuedAt == nil ||
		queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1`, res.ReplayID) != 1000 {
		t.Errorf("after the last batch: %+v, want a total of 1000, enqueued", r)
	}

	// The 1,000 delivered again and 1,200 new; the 10 still waiting are
	// left to their live delivery.
	seedFanned(t, db, hook, "t", 1200)
	second := replayFor(t, api, ep.ID)
	if second.Jobs != 2200 {
		t.Fatalf("the second replay answered %d jobs, want 2200", second.Jobs)
	}
	status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/replays/"+itoa(second.ReplayID)+"/cancel", "")
	var c ReplayView
	if err := json.Unmarshal(body, &c); status != http.StatusOK || err != nil {
		t.Fatalf("cancel: %d %s", status, body)
	}
	if c.State != "cancelled" || c.Total != 500 || c.Done != 500 || c.Pending != 0 {
		t.Errorf("cancelled after its first batch: %+v, want a total of the 500 enqueued, all done (discarded)", c)
	}
	if err := feedReplays(context.Background(), db, 18); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1`, second.ReplayID); n != 500 {
		t.Errorf("%d jobs in the cancelled replay after a feed, want the 500 enqueued before the cancel", n)
	}
}

// A replay's enqueue walks the events its count found, from the first to
// the last, and stops there: an event of the window fanned out after the
// count (its transaction began before the window's end and committed
// later) is left to its live delivery, and the walk never reads on to
// the end of the table for it.
func TestReplayEnqueuesWhatItsCountFound(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const hook = "http://192.0.2.1:9"
	ep := createTunedEndpoint(t, api, hook, `"max_in_flight": 8`)
	mustExec(t, db, `INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at)
		SELECT 'elsewhere.e', 's', now() - interval '1 hour', now() - interval '1 hour' FROM generate_series(1, 50)`)
	seedFanned(t, db, hook, "s", 600)
	last := queryInt(t, db, `SELECT max(id) FROM outbox.events`)
	res := replayFor(t, api, ep.ID)
	if res.Jobs != 600 {
		t.Fatalf("the POST answered %d jobs, want 600", res.Jobs)
	}
	if end := queryInt(t, db, `SELECT last_event_id FROM outbox.replays WHERE id = $1`, res.ReplayID); end != last {
		t.Errorf("the replay ends at event %d, want the last its count found, %d", end, last)
	}
	late := queryInt(t, db, `INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at)
		VALUES ($1, 's', now() - interval '1 hour', now()) RETURNING id`, topicFor(hook)+".e")
	for range 2 {
		mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', attempt = 1, attempted_at = now(), finalized_at = now()
			WHERE replay_id = $1 AND state = 'available'`, res.ReplayID)
		if err := feedReplays(context.Background(), db, 18); err != nil {
			t.Fatal(err)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE replay_id = $1`, res.ReplayID); n != 600 {
		t.Errorf("the replay enqueued %d jobs, want the 600 its count found", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1`, late); n != 0 {
		t.Errorf("the event fanned out after the count has %d jobs of the replay, want none", n)
	}
	if r := replaysOf(t, api, ep.ID)[0]; r.Total != 600 || r.EnqueuedAt == nil {
		t.Errorf("after the last batch: %+v, want a total of 600, enqueued", r)
	}
}

// A claim says of each job whether its outcome frees a place that due
// work may wait for (wake_on_outcome): the worker claims again when such
// an outcome is recorded, and only then. Endpoint full (cap 2, 3 due):
// both its jobs. Endpoint roomy (cap 16, 1 due): not its job, whose
// outcome frees nothing a claim could use. Endpoint replaying (cap 16, so
// a share of 4; 6 replayed due): the 4 it took filled the share. Woken
// by every recorded batch instead, the workers would claim for nothing
// while no endpoint is near its cap.
func TestClaimSaysWhichOutcomesFreeAPlace(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const full, roomy, replaying = "http://192.0.2.1:9", "http://192.0.2.2:9", "http://192.0.2.3:9"
	createTunedEndpoint(t, api, full, `"max_in_flight": 2`)
	createTunedEndpoint(t, api, roomy, `"max_in_flight": 16`)
	r := createTunedEndpoint(t, api, replaying, `"max_in_flight": 16`)
	seedFanned(t, db, replaying, "old", 6)
	replayFor(t, api, r.ID)
	recordFor(t, db, full, 3)
	recordFor(t, db, roomy, 1)

	got := queryStrings(t, db, `
		SELECT ep.url || ' ' || (j.replay_id IS NOT NULL)::text || ' ' || c.wake_on_outcome::text
		FROM outbox.claim_due_jobs(100, NULL::bigint) AS c
		JOIN outbox.jobs AS j ON j.id = c.id
		JOIN outbox.endpoints AS ep ON ep.id = c.endpoint_id
		ORDER BY ep.url, j.id`)
	want := []string{
		full + " false true", full + " false true",
		roomy + " false false",
		replaying + " true true", replaying + " true true", replaying + " true true", replaying + " true true",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("claimed (endpoint, replayed, wake on outcome) (-want +got):\n%s", diff)
	}
}

// The completer wakes the claim loop after a batch only when one of its
// jobs was claimed into a full place.
func TestCompleterWakesTheClaimOnlyForAFreedPlace(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Workers
	p := newWorkerPool(db, cfg, time.Second, newSubscriberRegistry(), nil, testLogger(t))
	done := make(chan struct{})
	go func() { defer close(done); p.completeLoop() }()
	defer func() { close(p.results); <-done }()

	// No job of these exists: the batch writes nothing, and the poke
	// depends on the flag alone.
	p.results <- jobResult{ID: -1, Attempt: 1, wakeOnOutcome: false}
	p.results <- jobResult{ID: -2, Attempt: 1, wakeOnOutcome: true}
	waitFor(t, "the two outcomes written", 10*time.Second, func() bool { return p.outcomeJobs.Load() == 2 })
	select {
	case <-p.recorded:
	default:
		t.Fatal("a batch with a job claimed into a full place did not wake the claim loop")
	}
	p.results <- jobResult{ID: -3, Attempt: 1, wakeOnOutcome: false}
	waitFor(t, "the third outcome written", 10*time.Second, func() bool { return p.outcomeJobs.Load() == 3 })
	select {
	case <-p.recorded:
		t.Fatal("a batch that freed no full place woke the claim loop")
	default:
	}
}
