package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/lib/pq"
)

// Claims ahead (claimahead.go; schema.sql, outbox.lane_room): a
// registered replica holds up to twice the requests it may have in
// flight to a healthy endpoint, and starts the rest as requests end; the
// endpoint's cap (max_in_flight) still holds over every replica and
// whatever its receiver does.

// registeredReplica registers a replica row for a test and returns it.
func registeredReplica(t *testing.T, db *sql.DB, pid int) *replicaRegistry {
	t.Helper()
	r := newReplicaRegistry(db, defaultConfig().Replicas, testReplica("0.1.0", pid), testLogger(t))
	if err := r.register(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// insertEndpointWithJobs inserts an endpoint of cap maxInFlight and n due
// deliveries to it, and returns its id.
func insertEndpointWithJobs(t *testing.T, db *sql.DB, url string, maxInFlight, n int) int64 {
	t.Helper()
	var endpoint int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, max_in_flight)
		VALUES ($1, decode(repeat('ab', 32), 'hex'), $2) RETURNING id`, url, maxInFlight).Scan(&endpoint); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at)
		SELECT 'webhook', outbox.record('t', i::text, '{}'), $1, 18, now() - interval '1 minute'
		FROM generate_series(1, $2) AS i`, endpoint, n)
	return endpoint
}

// claimAhead runs outbox.claim_lane_jobs with ahead for replica, with the
// answered jobs and the endpoints cooling, and returns the ids claimed and
// their lane limits.
func claimAhead(t *testing.T, db *sql.DB, replica int64, answered []int64, cooling ...int64) (ids []int64, limits []int64) {
	t.Helper()
	rows, err := db.Query(`SELECT (c.job).id, coalesce(c.lane_limit, 0) FROM outbox.claim_lane_jobs(50, $1, $2, true, $3) AS c`,
		replica, pq.Array(append([]int64{}, answered...)), pq.Array(append([]int64{}, cooling...)))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, limit int64
		if err := rows.Scan(&id, &limit); err != nil {
			t.Fatal(err)
		}
		ids, limits = append(ids, id), append(limits, limit)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids, limits
}

// A claim ahead of a healthy endpoint with a cap of 2 takes 4 jobs and
// says 2 may be in flight; with those 4 running it takes none, and
// neither does another replica's claim, ahead or not, which counts them
// all; 2 of them answered, it takes 2 more. An endpoint that has just
// failed, whose requests have run longer than 250 ms, or that is cooling
// after a release, is claimed no further than its cap.
func TestClaimAheadTakesTwiceTheLimitAndOtherReplicasCountIt(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	a := registeredReplica(t, db, 401)
	b := registeredReplica(t, db, 402)
	insertEndpointWithJobs(t, db, "https://healthy.example.com/", 2, 10)

	first, limits := claimAhead(t, db, a.ID(), nil)
	if len(first) != 4 {
		t.Fatalf("a's first claim ahead took %v, want 4 jobs: twice the cap of 2", first)
	}
	for _, l := range limits {
		if l != 2 {
			t.Errorf("lane limits %v, want 2 for each job: the cap, no other replica running any", limits)
			break
		}
	}
	if got, _ := claimAhead(t, db, a.ID(), nil); len(got) != 0 {
		t.Errorf("a's claim with its 4 jobs running took %v, want none", got)
	}
	if got, _ := claimAhead(t, db, b.ID(), nil); len(got) != 0 {
		t.Errorf("b's claim ahead beside a's 4 running jobs took %v, want none", got)
	}
	if got := queryInt(t, db, `SELECT count(*) FROM outbox.claim_due_jobs(50, $1)`, b.ID()); got != 0 {
		t.Errorf("b's claim_due_jobs beside a's 4 running jobs took %d, want none", got)
	}
	// Claimed just now, as the claims of a receiver that answers at once
	// are, however slowly this test runs.
	fresh := func() { mustExec(t, db, `UPDATE outbox.jobs SET attempted_at = now() WHERE state = 'running'`) }
	fresh()
	second, _ := claimAhead(t, db, a.ID(), first[:2])
	if len(second) != 2 {
		t.Errorf("a's claim with 2 of its 4 jobs answered took %v, want 2", second)
	}
	// All of the first 4 answered, the 2 after them running, one of them
	// for 300 ms: no room beyond the cap's, which they hold.
	fresh()
	mustExec(t, db, `UPDATE outbox.jobs SET attempted_at = now() - interval '300 milliseconds' WHERE id = $1`, second[0])
	if got, _ := claimAhead(t, db, a.ID(), first); len(got) != 0 {
		t.Errorf("a's claim beside a request running 300 ms took %v, want none: its cap of 2 is held", got)
	}
	fresh()
	if got, _ := claimAhead(t, db, a.ID(), first); len(got) != 2 {
		t.Errorf("a's claim beside 2 requests running just now took %v, want 2 ahead", got)
	}

	cooling := insertEndpointWithJobs(t, db, "https://cooling.example.com/", 2, 10)
	if got, _ := claimAhead(t, db, a.ID(), nil, cooling); len(got) != 2 {
		t.Errorf("a's claim of an endpoint cooling after a release took %v, want 2 jobs, its cap", got)
	}

	failing := insertEndpointWithJobs(t, db, "https://failing.example.com/", 2, 10)
	mustExec(t, db, `UPDATE outbox.endpoints SET consecutive_failures = 1 WHERE id = $1`, failing)
	got, limits := claimAhead(t, db, a.ID(), nil, cooling)
	if len(got) != 2 || limits[0] != 2 {
		t.Errorf("a's claim of an endpoint that has just failed took %v with limits %v, want 2 jobs, its cap, limit 2", got, limits)
	}
}

// A replica claiming ahead holds more of an endpoint's jobs running than
// its cap of 2 (twice the cap claimed when its first request arrives),
// and its receiver still never sees more than 2 requests at once: the
// gate holds the rest until one ends. Claimed is running or completed:
// on a busy machine the second request can end, and the claim it frees
// take a fifth job, before the first request's handler reads the table.
func TestClaimAheadKeepsRequestsWithinTheCap(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var inFlight concurrency
	claimedAtFirst := make(chan int, 1)
	slow := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		inFlight.enter()
		defer inFlight.leave()
		if n == 1 {
			var claimed int
			if err := db.QueryRow(`SELECT (SELECT count(*) FROM outbox.jobs WHERE state = 'running')
				+ (SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed')`).Scan(&claimed); err != nil {
				t.Error(err)
			}
			claimedAtFirst <- claimed
		}
		time.Sleep(20 * time.Millisecond) // the receiver's work, so requests overlap
	})
	createTunedEndpoint(t, api, slow.srv.URL, `"max_in_flight": 2`)
	recordFor(t, db, slow.srv.URL, 30)
	runRegisteredWebhookWorkers(t, db, 501)
	waitFor(t, "30 deliveries", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed'`) == 30
	})
	if peak := inFlight.peak.Load(); peak != 2 {
		t.Errorf("the receiver saw %d requests at once, want the cap, 2", peak)
	}
	if n := <-claimedAtFirst; n < 4 {
		t.Errorf("%d jobs were claimed at the first request, want at least 4: twice the cap, claimed ahead", n)
	}
}

// The gate lets in up to its limit, in arrival order, a waiting job as
// a request ends, and gives up a wait when its context ends.
func TestEndpointGateAdmitsUpToItsLimit(t *testing.T) {
	t.Parallel()
	g := endpointGates{byEndpoint: map[int64]*endpointGate{}}
	g.claimed(7, 2, true)
	ctx := context.Background()
	leave1, _ := g.enter(ctx, 7)
	leave2, _ := g.enter(ctx, 7)
	third := make(chan func(), 1)
	go func() {
		leave, err := g.enter(ctx, 7)
		if err != nil {
			panic(fmt.Sprint("third enter: ", err))
		}
		third <- leave
	}()
	waitFor(t, "the third to wait", 5*time.Second, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.byEndpoint[7].waiting) == 1
	})
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.enter(cancelled, 7); err == nil {
		t.Error("an enter whose context ended got a place at a full gate")
	}
	select {
	case <-third:
		t.Fatal("a third request entered a gate of limit 2 with 2 in flight")
	default:
	}
	leave1()
	leave3 := <-third
	g.mu.Lock()
	inFlight, waiting := g.byEndpoint[7].inFlight, len(g.byEndpoint[7].waiting)
	g.mu.Unlock()
	if inFlight != 2 || waiting != 0 {
		t.Errorf("after one left: %d in flight and %d waiting, want 2 and 0", inFlight, waiting)
	}
	leave2()
	leave3()
	if leave, err := g.enter(ctx, 8); err != nil {
		t.Errorf("an endpoint with no limit set refused a request: %v", err)
	} else {
		leave()
	}
}

// A job waits at a gate at most gateWait (250 ms) and is then released
// unsent, its endpoint cooling for a second; a failed answer releases the
// jobs waiting, and a Retry-After also those that come before the hold
// ends.
func TestEndpointGateReleasesWhatWaits(t *testing.T) {
	t.Parallel()
	if gateWait != 250*time.Millisecond {
		t.Errorf("gateWait %s, want 250ms", gateWait)
	}
	g := endpointGates{byEndpoint: map[int64]*endpointGate{}}
	g.claimed(7, 1, true)
	ctx := context.Background()
	leave, err := g.enter(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.cooling(); len(got) != 0 {
		t.Errorf("endpoints cooling before any release: %v, want none", got)
	}
	began := time.Now()
	if _, err := g.enter(ctx, 7); !errors.Is(err, errReleased) || time.Since(began) < gateWait {
		t.Errorf("a job at a full gate: %v after %s, want released after %s", err, time.Since(began), gateWait)
	}
	if got := g.cooling(); !slices.Equal(got, []int64{7}) || gateCooling != time.Second {
		t.Errorf("endpoints cooling after a release: %v for %s, want [7] for 1s", got, gateCooling)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := g.enter(ctx, 7)
		waiting <- err
	}()
	waitFor(t, "a job to wait", 5*time.Second, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.byEndpoint[7].waiting) == 1
	})
	g.answered(7, true, 0)
	if err := <-waiting; !errors.Is(err, errReleased) {
		t.Errorf("a job waiting when a request failed: %v, want released", err)
	}
	g.answered(7, false, time.Minute)
	leave()
	if _, err := g.enter(ctx, 7); !errors.Is(err, errReleased) {
		t.Errorf("a job coming to a free gate during a Retry-After hold: %v, want released", err)
	}
	// Other replicas hold the whole cap: a limit of 0 lets nothing in.
	g.claimed(9, 0, true)
	if _, err := g.enter(ctx, 9); !errors.Is(err, errReleased) {
		t.Errorf("a job at a gate of limit 0: %v, want released", err)
	}
}

// A released outcome (a job its gate sent back unsent, from this release
// or the one before) puts its job back as it was before its claim: its
// attempt not counted, available or retryable as before, due where it
// was.
func TestReleasedOutcomePutsTheJobBack(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ep := insertEndpointWithJobs(t, db, "https://released.example.com/", 4, 2)
	mustExec(t, db, `UPDATE outbox.jobs SET attempt = 1, state = 'retryable' WHERE id = (SELECT max(id) FROM outbox.jobs)`)
	jobs, err := webhookWorkers(t, db, defaultConfig().Workers, time.Second).claim(context.Background(), 10)
	if err != nil || len(jobs) != 2 {
		t.Fatalf("claimed %d: %v", len(jobs), err)
	}
	var results []jobResult
	for _, j := range jobs {
		results = append(results, jobResult{ID: j.ID, Attempt: j.Attempt, jobOutcome: jobOutcome{State: jobReleased}})
	}
	if err := writeOutcomes(context.Background(), db, results, 5); err != nil {
		t.Fatal(err)
	}
	got := queryStrings(t, db, fmt.Sprintf(`SELECT state || ' ' || attempt || ' ' || (scheduled_at < now() - interval '30 seconds')
		FROM outbox.jobs WHERE endpoint_id = %d ORDER BY id`, ep))
	if want := []string{"available 0 true", "retryable 1 true"}; !slices.Equal(got, want) {
		t.Errorf("released jobs %q, want %q", got, want)
	}
}

// insertEndpoint inserts an endpoint of cap maxInFlight subscribed to
// topic, with the settings set (an UPDATE's SET list, or ""), and returns
// its id.
func insertEndpoint(t *testing.T, db *sql.DB, topic string, maxInFlight int, set string) int64 {
	t.Helper()
	var id int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, topics, secret, max_in_flight)
		VALUES ('https://receiver.example.com/' || $1, ARRAY[$1], decode(repeat('ab', 32), 'hex'), $2)
		RETURNING id`, topic, maxInFlight).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if set != "" {
		mustExec(t, db, `UPDATE outbox.endpoints SET `+set+` WHERE id = $1`, id)
	}
	return id
}

// Two registered replicas, each claiming ahead with 8 workers and its
// share of them, respect one endpoint's cap of 3 together.
func TestTwoReplicasClaimingAheadRespectOneCap(t *testing.T) {
	t.Parallel()
	twoReplicasAgainstACapOf3(t, func(t *testing.T, replica *sql.DB, i int) {
		runRegisteredWebhookWorkers(t, replica, 601+i)
	})
}

// runRegisteredWebhookWorkers is runWebhookWorkers as a registered
// replica: its claims record it (held_by) and go ahead.
func runRegisteredWebhookWorkers(t *testing.T, db *sql.DB, pid int) {
	t.Helper()
	cfg := defaultConfig().Workers
	cfg.PollInterval = 20 * time.Millisecond
	cfg.Concurrency = 8
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 30 * time.Second})
	wp := newWorkerPool(db, cfg, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, client, nil, nil, testLogger(t)).deliver}, testLogger(t))
	wp.replica = registeredReplica(t, db, pid)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wp.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
}
