package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Endpoint isolation (docs/endpoints.md): every endpoint is a
// lane of the workers' claim (outbox.claim_lane_jobs), and its trouble
// stays its own.

// concurrency counts the requests a handler is serving at once, and the
// most it ever served at once.
type concurrency struct {
	now, peak atomic.Int64
}

func (c *concurrency) enter() {
	n := c.now.Add(1)
	for {
		p := c.peak.Load()
		if n <= p || c.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (c *concurrency) leave() { c.now.Add(-1) }

// createTunedEndpoint creates an endpoint for url with the delivery
// settings given as JSON fields (`"max_in_flight": 2`).
func createTunedEndpoint(t *testing.T, api *testAPI, url, settings string) Endpoint {
	t.Helper()
	// Each endpoint subscribes to its own topics, named after its
	// receiver's address, so that recordFor reaches one endpoint.
	body := fmt.Sprintf(`{"url": %q, "topics": [%q], %s}`, url, topicFor(url)+".*", settings)
	status, resp := api.do("POST", "/api/endpoints", body)
	if status != http.StatusCreated {
		t.Fatalf("create endpoint: %d %s", status, resp)
	}
	var e Endpoint
	if err := json.Unmarshal(resp, &e); err != nil {
		t.Fatal(err)
	}
	return e
}

// topicFor is the topic prefix of the events meant for the endpoint at url.
func topicFor(url string) string {
	return "to_" + strings.NewReplacer("http://", "", ":", "_", ".", "_").Replace(url)
}

// recordFor records n events for the endpoint at url and fans them out.
func recordFor(t *testing.T, db *sql.DB, url string, n int) {
	t.Helper()
	mustExec(t, db, `SELECT outbox.record($1, i::text, '{}') FROM generate_series(1, $2) AS i`, topicFor(url)+".e", n)
	relayAll(t, db)
}

// newHangingReceiver is a receiver whose every request hangs until
// release is closed (or the request ends), then answers 500; hung counts
// its requests at once.
func newHangingReceiver(t *testing.T) (bad *receiver, release chan struct{}, hung *concurrency) {
	release, hung = make(chan struct{}), new(concurrency)
	bad = newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		hung.enter()
		defer hung.leave()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusInternalServerError)
	})
	return bad, release, hung
}

// A receiver that hangs holds only its own cap of workers: the healthy
// endpoint beside it gets every delivery while the hanging one has 40
// queued, and the hanging receiver never sees more requests at once than
// its cap. (Before endpoints were lanes, the 40 took all 8 workers.) So
// too when its jobs are claimed ahead, by a registered replica: the jobs
// claimed beyond its 2 hanging requests go back to the queue unsent
// within gateWait, their attempts not counted, and it holds its cap of
// workers, not twice it.
func TestHangingReceiverHoldsOnlyItsCap(t *testing.T) {
	t.Parallel()
	for name, ahead := range map[string]bool{"claimed ahead": true, "not ahead": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			api := newTestAPI(t, db, testPolicy)
			bad, release, hung := newHangingReceiver(t)
			good := newReceiver(t, nil)
			createTunedEndpoint(t, api, bad.srv.URL, `"max_in_flight": 2`)
			createTunedEndpoint(t, api, good.srv.URL, `"max_in_flight": 2`)
			recordFor(t, db, bad.srv.URL, 40)
			if ahead {
				runRegisteredWebhookWorkers(t, db, 701)
			} else {
				runWebhookWorkers(t, db, 30*time.Second)
			}
			defer close(release) // deferred calls run before cleanups: the pool's jobs end, then it stops

			waitFor(t, "the hanging receiver to hold its cap", 10*time.Second, func() bool { return hung.now.Load() == 2 })
			waitFor(t, "no more jobs running than it holds", 10*time.Second, func() bool {
				return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'running'`) == 2
			})
			recordFor(t, db, good.srv.URL, 10)
			waitFor(t, "the healthy endpoint's 10 deliveries", 10*time.Second, func() bool {
				return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed'`) == 10
			})
			if peak := hung.peak.Load(); peak != 2 {
				t.Errorf("the hanging receiver saw %d requests at once, want its cap, 2", peak)
			}
			if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'running'`); n != 2 {
				t.Errorf("%d jobs running, want the hanging endpoint's 2", n)
			}
			if n := queryInt(t, db, `SELECT max(attempt) FROM outbox.jobs WHERE state = 'available'`); n != 0 {
				t.Errorf("a job sent back unsent has attempt %d, want 0: a release counts no attempt", n)
			}
		})
	}
}

// The claim shares a batch between lanes round robin: an endpoint with a
// long backlog of older jobs takes no more than its turn, and subscribers'
// jobs keep theirs.
func TestClaimSharesTheBatchBetweenLanes(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret, max_in_flight)
		VALUES ('https://busy.example.com/', decode(repeat('ab', 32), 'hex'), 1000),
		       ('https://quiet.example.com/', decode(repeat('ab', 32), 'hex'), 1000)`)
	enqueue := func(url string, n int, age string) {
		mustExec(t, db, `
			INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at)
			SELECT 'webhook', outbox.record('t', i::text, '{}'),
			       (SELECT id FROM outbox.endpoints WHERE url = $1), 18, now() - $3::interval
			FROM generate_series(1, $2) AS i`, url, n, age)
	}
	enqueue("https://busy.example.com/", 500, "1 hour")
	enqueue("https://quiet.example.com/", 5, "1 minute")
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts)
		SELECT 'sub:x', outbox.record('t', i::text, '{}'), 18 FROM generate_series(1, 5) AS i`)

	got := map[string]int{}
	rows := queryStrings(t, db, `SELECT coalesce(ep.url, c.kind) FROM outbox.claim_due_jobs(20) AS c
		LEFT JOIN outbox.endpoints AS ep ON ep.id = c.endpoint_id`)
	for _, lane := range rows {
		got[lane]++
	}
	want := map[string]int{"https://busy.example.com/": 10, "https://quiet.example.com/": 5, "sub:x": 5}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("a claim of 20 per lane (-want +got):\n%s", diff)
	}
}

// Two replicas, each with 8 workers, respect one endpoint's cap of 3
// together: the cap is counted in the database, not in a process.
func TestTwoReplicasRespectOneCap(t *testing.T) {
	t.Parallel()
	twoReplicasAgainstACapOf3(t, func(t *testing.T, replica *sql.DB, _ int) {
		runWebhookWorkers(t, replica, 30*time.Second)
	})
}

// twoReplicasAgainstACapOf3 starts two replicas with start (each on a
// pool of its own, i its number) against one endpoint whose cap is 3 and
// whose receiver takes 20 ms a request, records 60 events for it, and
// checks that the receiver never saw more than 3 requests at once, nor
// fewer than 2 (the replicas ran side by side).
func twoReplicasAgainstACapOf3(t *testing.T, start func(t *testing.T, replica *sql.DB, i int)) {
	db, dsn := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var inFlight concurrency
	slow := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		inFlight.enter()
		defer inFlight.leave()
		time.Sleep(20 * time.Millisecond) // the receiver's work, so requests overlap
	})
	createTunedEndpoint(t, api, slow.srv.URL, `"max_in_flight": 3`)
	recordFor(t, db, slow.srv.URL, 60)
	for i := range 2 {
		replica, err := openDB(context.Background(), dsn, 10)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { replica.Close() })
		start(t, replica, i)
	}
	waitFor(t, "60 deliveries", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed'`) == 60
	})
	if peak := inFlight.peak.Load(); peak > 3 || peak < 2 {
		t.Errorf("the receiver saw %d requests at once from two replicas, want at most the cap, 3 (and more than 1: they ran side by side)", peak)
	}
}

// Under a rate limit, the claims of two replicas together space the
// endpoint's requests 1/rate apart: the start times they hand out never
// come closer than that, whoever claims.
func TestRateLimitSpacesRequestsAcrossReplicas(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret, max_in_flight, rate_limit_per_second)
		VALUES ('https://limited.example.com/', decode(repeat('ab', 32), 'hex'), 1000, 20)`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts)
		SELECT 'webhook', outbox.record('t', i::text, '{}'), (SELECT id FROM outbox.endpoints), 18
		FROM generate_series(1, 200) AS i`)
	var mu sync.Mutex
	var starts []time.Time
	claimAll := func(db *sql.DB) error {
		for range 10 {
			rows, err := db.Query(`SELECT now() + start_in_ms * interval '1 millisecond' FROM outbox.claim_due_jobs(100)`)
			if err != nil {
				return err
			}
			for rows.Next() {
				var at time.Time
				if err := rows.Scan(&at); err != nil {
					return err
				}
				mu.Lock()
				starts = append(starts, at)
				mu.Unlock()
			}
			if err := rows.Close(); err != nil {
				return err
			}
		}
		return nil
	}
	replica, err := openDB(context.Background(), dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	errs := make(chan error, 2)
	go func() { errs <- claimAll(db) }()
	go func() { errs <- claimAll(replica) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// 20 a second, one second ahead at most: each claim hands out at most
	// 21 start times, and the 20 claims here run within a second or two.
	if len(starts) < 21 {
		t.Fatalf("the replicas claimed %d jobs, want more than one second's worth (21)", len(starts))
	}
	slices.SortFunc(starts, time.Time.Compare)
	for i := 1; i < len(starts); i++ {
		// 1/20 s apart, less a millisecond: start_in_ms is rounded up to
		// whole milliseconds from each claim's own now().
		if gap := starts[i].Sub(starts[i-1]); gap < 49*time.Millisecond {
			t.Fatalf("requests %d and %d start %s apart, want at least 50ms (20 a second)", i-1, i, gap)
		}
	}
}

// A 429 with Retry-After holds the whole endpoint, not just the job: none
// of its other deliveries is claimed before then, while another
// endpoint's are.
func TestRetryAfterHoldsTheWholeEndpoint(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	busy := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	other := newReceiver(t, nil)
	held := createTunedEndpoint(t, api, busy.srv.URL, `"max_in_flight": 1`)
	createTunedEndpoint(t, api, other.srv.URL, `"max_in_flight": 1`)
	recordFor(t, db, busy.srv.URL, 5)
	recordFor(t, db, other.srv.URL, 5)
	runWebhookWorkers(t, db, 30*time.Second)
	waitFor(t, "the other endpoint's deliveries", 10*time.Second, func() bool { return len(other.requests()) == 5 })
	// The 429's outcome, and the hold with it, may still be on its way
	// to the completer: its endpoint's place stays taken until then.
	waitFor(t, "the 429's outcome", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'running'`, held.ID) == 0
	})
	if n := len(busy.requests()); n != 1 {
		t.Errorf("the receiver that asked to wait 120 s got %d requests, want 1", n)
	}
	e := api.endpoint(held.ID)
	if e.HeldUntil == nil || time.Until(*e.HeldUntil) < 100*time.Second {
		t.Errorf("held_until %v, want about 120 s from now", e.HeldUntil)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'available'`, held.ID); n != 4 {
		t.Errorf("%d of the held endpoint's deliveries still wait, want 4", n)
	}
}

// Pause holds deliveries and loses none, across a restart of the workers;
// resume sends them all.
func TestPauseHoldsDeliveriesAcrossARestart(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := createTunedEndpoint(t, api, rc.srv.URL, `"max_in_flight": 4`)
	status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/pause", "")
	var paused Endpoint
	if err := json.Unmarshal(body, &paused); err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK || paused.State != "paused" || paused.PausedAt == nil {
		t.Fatalf("pause: %d %s, want 200 with state paused", status, body)
	}
	recordFor(t, db, rc.srv.URL, 10)

	for restart := range 2 {
		wp := webhookWorkers(t, db, defaultConfig().Workers, 10*time.Second)
		if n, err := wp.workOnce(context.Background(), 100); err != nil || n != 0 {
			t.Fatalf("workers' turn %d while paused claimed %d jobs (%v), want 0", restart, n, err)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'available'`, ep.ID); n != 10 {
		t.Fatalf("%d deliveries wait while paused, want all 10", n)
	}
	// A pause has no end of its own: the overview says what it holds.
	o, err := readOverview(context.Background(), db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(alertNamesOf(o.Alerts), "endpoint_paused") || o.Endpoints.Paused != 1 || o.Endpoints.PausedQueued != 10 {
		t.Errorf("overview while paused: %+v, alerts %v; want 1 paused holding 10, and endpoint_paused", o.Endpoints, alertNamesOf(o.Alerts))
	}

	status, body = api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/resume", "")
	var resumed Endpoint
	if err := json.Unmarshal(body, &resumed); err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK || resumed.State != "enabled" || resumed.PausedAt != nil {
		t.Fatalf("resume: %d %s, want 200 with state enabled", status, body)
	}
	runWebhookWorkers(t, db, 30*time.Second)
	waitFor(t, "the 10 held deliveries", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, ep.ID) == 10
	})
	if n := len(rc.requests()); n != 10 {
		t.Errorf("the receiver got %d requests, want 10: each held delivery once", n)
	}
}

// A receiver that fails one request in ten never opens the breaker (5 in
// a row): every delivery goes at once and succeeds on its retry, and none
// is deferred 5 minutes. One failure used to defer every new delivery.
func TestFlakyReceiverKeepsItsBreakerClosed(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	// Every 10th request fails, but never the same event's twice, so each
	// failed delivery succeeds on its first retry (1 s later).
	var mu sync.Mutex
	failed := map[string]bool{}
	flaky := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if id := r.Header.Get("webhook-id"); n%10 == 0 && !failed[id] {
			failed[id] = true
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	ep := createTunedEndpoint(t, api, flaky.srv.URL, `"max_in_flight": 4`)
	runWebhookWorkers(t, db, 30*time.Second)
	for range 5 {
		recordFor(t, db, flaky.srv.URL, 20)
	}
	// A first retry waits 1 s (attempt⁴ seconds).
	waitFor(t, "100 deliveries", 20*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, ep.ID) == 100
	})
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND status_code = 500`, ep.ID); n < 5 {
		t.Fatalf("the receiver failed %d requests, want one in ten of at least 100", n)
	}
	if e := api.endpoint(ep.ID); e.Breaker.State != "closed" || e.Breaker.OpenedAt != nil {
		t.Errorf("breaker %+v after one failure in ten, want closed", e.Breaker)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND scheduled_at > created_at + interval '1 minute'`, ep.ID); n != 0 {
		t.Errorf("%d deliveries were deferred, want none", n)
	}
}

// A dead receiver opens the breaker at the 5th failure in a row: then one
// attempt at a time, and new deliveries are scheduled 5 minutes out. The
// first success closes it. With -breaker-threshold 1 the first failure
// opens it: the rule before breakers.
func TestBreakerOpensAtTheThresholdAndASuccessClosesIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		threshold, failures int
	}{{5, 5}, {1, 1}} {
		t.Run(fmt.Sprintf("threshold %d", tc.threshold), func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			api := newTestAPI(t, db, testPolicy)
			var up atomic.Bool
			rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if !up.Load() {
					w.WriteHeader(http.StatusInternalServerError)
				}
			})
			ep := createTunedEndpoint(t, api, rc.srv.URL, `"max_in_flight": 1`)
			cfg := defaultConfig().Workers
			cfg.BreakerThreshold = tc.threshold
			wp := newWorkerPool(db, cfg, time.Minute, newSubscriberRegistry(),
				map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil,
					newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second}), nil, nil, testLogger(t)).deliver},
				testLogger(t))
			recordFor(t, db, rc.srv.URL, 20)
			// turn is one turn of the workers, counting the endpoint's jobs
			// it claimed: the owner notifications of the endpoint's state
			// changes (jobs of no endpoint) are not this test's.
			turn := func() int {
				t.Helper()
				mustExec(t, db, `DELETE FROM outbox.jobs WHERE endpoint_id IS NULL`)
				n, err := wp.workOnce(context.Background(), 100)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			for i := 1; i <= tc.failures; i++ {
				if e := api.endpoint(ep.ID); e.Breaker.State != "closed" || e.Breaker.ConsecutiveFailures != i-1 {
					t.Fatalf("before failure %d: breaker %+v, want closed with %d failures", i, e.Breaker, i-1)
				}
				mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state = 'retryable'`)
				if n := turn(); n != 1 {
					t.Fatalf("turn %d claimed %d, want the cap, 1", i, n)
				}
			}
			e := api.endpoint(ep.ID)
			if e.Breaker.State != "open" || e.Breaker.OpenedAt == nil || e.Breaker.ConsecutiveFailures != tc.failures {
				t.Fatalf("after %d failures: breaker %+v, want open", tc.failures, e.Breaker)
			}
			// Open: new deliveries 5 minutes out.
			recordFor(t, db, rc.srv.URL, 1)
			if due := queryInt(t, db, `SELECT extract(epoch FROM max(scheduled_at) - now())::int FROM outbox.jobs WHERE endpoint_id = $1 AND attempt = 0`, ep.ID); due < 290 || due > 300 {
				t.Errorf("a new delivery while open is due in %d s, want 300", due)
			}
			// A cap of 1000 gives way to one attempt at a time while open.
			mustExec(t, db, `UPDATE outbox.endpoints SET max_in_flight = 1000`)
			mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state IN ('available', 'retryable')`)
			if n := turn(); n != 1 {
				t.Fatalf("a turn while open claimed %d, want one probe", n)
			}
			if e := api.endpoint(ep.ID); e.Breaker.ConsecutiveFailures != tc.failures+1 {
				t.Errorf("after a failed probe: %+v, want %d failures in a row", e.Breaker, tc.failures+1)
			}
			up.Store(true)
			mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state IN ('available', 'retryable')`)
			if n := turn(); n != 1 {
				t.Fatalf("the probe turn claimed %d, want 1", n)
			}
			e = api.endpoint(ep.ID)
			if e.Breaker.State != "closed" || e.Breaker.ConsecutiveFailures != 0 || e.State != "enabled" {
				t.Errorf("after a success: state %s, breaker %+v; want enabled and closed", e.State, e.Breaker)
			}
			if n := turn(); n != 20 {
				t.Errorf("a turn once closed claimed %d, want the other 20", n)
			}
		})
	}
}

// The breaker's transitions, as the completer writes them: a batch's
// attempts to one endpoint, in completion order, move its count of
// failures in a row, open the breaker at the threshold (5) and close it
// at a success; failing_since follows the first failure after a success.
// A 410 disables the endpoint instead of counting.
func TestBreakerTransitions(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	const threshold = 5
	ok, fail := endpointSucceeded, endpointFailed
	for _, tc := range []struct {
		name        string
		before      int  // failures in a row before the batch
		open        bool // breaker open before the batch
		batch       []endpointChange
		after       int
		wantOpen    bool
		wantFailing bool
	}{
		{"a failure starts the count", 0, false, []endpointChange{fail}, 1, false, true},
		{"four more reach the threshold", 1, false, []endpointChange{fail, fail, fail, fail}, 5, true, true},
		{"one short of it stays closed", 3, false, []endpointChange{fail}, 4, false, true},
		{"a success restarts the count", 4, false, []endpointChange{fail, ok}, 0, false, false},
		{"failures after a success count from it", 4, false, []endpointChange{ok, fail, fail}, 2, false, true},
		{"a success closes an open breaker", 9, true, []endpointChange{ok}, 0, false, false},
		{"a failed probe keeps it open", 9, true, []endpointChange{fail}, 10, true, true},
		{"a 410 disables it, counting nothing more", 4, false, []endpointChange{endpointGone}, 4, false, true},
		{"a 410 after a success still disables it", 4, false, []endpointChange{ok, endpointGone}, 4, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var id int64
			if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, consecutive_failures, breaker_opened_at, failing_since)
				VALUES ('https://hooks.example.com/', decode(repeat('ab', 32), 'hex'), $1,
				        CASE WHEN $2 THEN now() - interval '1 minute' END,
				        CASE WHEN $1 > 0 THEN now() - interval '1 minute' END)
				RETURNING id`, tc.before, tc.open).Scan(&id); err != nil {
				t.Fatal(err)
			}
			// The batch's attempts, each of a running job of the endpoint,
			// with no outcome: the jobs stay as they are.
			var batch []jobResult
			for _, c := range tc.batch {
				batch = append(batch, jobResult{ID: statsJob(t, db, id, 1), Attempt: 1,
					record: &attemptRecord{EndpointID: id, Change: c}})
			}
			if err := writeOutcomes(context.Background(), db, batch, threshold); err != nil {
				t.Fatal(err)
			}
			var after int
			var open, failing, disabled bool
			if err := db.QueryRow(`SELECT consecutive_failures, breaker_opened_at IS NOT NULL, failing_since IS NOT NULL,
				       disabled_at IS NOT NULL
				FROM outbox.endpoints WHERE id = $1`, id).Scan(&after, &open, &failing, &disabled); err != nil {
				t.Fatal(err)
			}
			wantDisabled := slices.Contains(tc.batch, endpointGone)
			if after != tc.after || open != tc.wantOpen || failing != tc.wantFailing || disabled != wantDisabled {
				t.Errorf("after %d failures in a row (open %v), batch %v: %d in a row, open %v, failing %v, disabled %v; want %d, %v, %v, %v",
					tc.before, tc.open, tc.batch, after, open, failing, disabled, tc.after, tc.wantOpen, tc.wantFailing, wantDisabled)
			}
		})
	}
}

// A job whose attempt has ended but whose outcome is not written yet is
// still running in the table; the claiming replica names it (answered),
// and the endpoint's cap does not count it: the cap bounds requests in
// flight. Unnamed, as another replica's claim sees it, it counts.
func TestClaimDoesNotCountAnsweredJobsAgainstTheCap(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var endpoint int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, max_in_flight)
		VALUES ('https://hooks.example.com/', decode(repeat('ab', 32), 'hex'), 1) RETURNING id`).Scan(&endpoint); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at)
		SELECT 'webhook', outbox.record('t', i::text, '{}'), $1, 18, now() - interval '1 minute'
		FROM generate_series(1, 2) AS i`, endpoint)
	claim := func(answered string) []int64 {
		t.Helper()
		ids, err := queryAll(context.Background(), db, scanID, `SELECT id FROM outbox.claim_due_jobs(10, NULL, $1::bigint[])`, answered)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	first := claim("{}")
	if len(first) != 1 {
		t.Fatalf("the first claim took %v, want one job (the cap is 1)", first)
	}
	if got := claim("{}"); len(got) != 0 {
		t.Errorf("with the first job running and not answered, a claim took %v; want nothing", got)
	}
	if got := claim(fmt.Sprintf("{%d}", first[0])); len(got) != 1 || got[0] == first[0] {
		t.Errorf("with the first job answered, a claim took %v; want the other job", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'running'`); n != 2 {
		t.Errorf("%d jobs running, want 2: the answered one's outcome is not written", n)
	}
}

// defaultShare is the workerShare of a process with the default workers,
// as its claims pass it.
var defaultShare = newClaimer(nil, defaultConfig().Workers.Concurrency, nil, nil).workerShare()

// The numbers of the rule: half of a replica's workers, at least one.
func TestWorkerShareNumbers(t *testing.T) {
	t.Parallel()
	got := map[int]int{}
	for _, workers := range []int{1, 2, 3, 4, 128, 1000} {
		got[workers] = newClaimer(nil, workers, nil, nil).workerShare()
	}
	want := map[int]int{1: 1, 2: 1, 3: 1, 4: 2, 128: 64, 1000: 500}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("workerShare by workers (-want +got):\n%s", diff)
	}
}

// The claim keeps an endpoint to the claiming replica's share of its
// workers, however high the endpoint's cap, whether it claims ahead or
// not. The replica holds one of the endpoint's deliveries already and
// another replica two, which count against the cap but not against this
// replica's share: with a share of 3, it claims 2.
func TestClaimKeepsAnEndpointToItsShareOfTheWorkers(t *testing.T) {
	t.Parallel()
	const share = 3
	for name, claim := range map[string]string{
		"ahead":         `SELECT (c.job).id FROM outbox.claim_lane_jobs(50, $1, '{}', true, '{}', $2) AS c`,
		"without ahead": `SELECT c.id FROM outbox.claim_due_jobs(50, $1, '{}', $2) AS c`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			replica := registeredReplica(t, db, 601).ID()
			other := registeredReplica(t, db, 602).ID()
			ep := insertEndpoint(t, db, "share", 1000, "")
			mustExec(t, db, `
				INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, held_by)
				SELECT 'webhook', outbox.record('elsewhere', '', '{}'), $1, 18, 'running', 1, now(), h.held_by
				FROM unnest(ARRAY[$2, $3, $3]::bigint[]) AS h(held_by)`, ep, replica, other)
			mustExec(t, db, `
				INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at)
				SELECT 'webhook', outbox.record('elsewhere', '', '{}'), $1, 18, now() - interval '1 minute'
				FROM generate_series(1, 10)`, ep)

			if got := claimedIDs(t, db, claim, replica, share); len(got) != share-1 {
				t.Errorf("claimed %v, want %d jobs: the share of %d less the one the replica holds", got, share-1, share)
			}
			if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'running' AND held_by = $2`, ep, replica); n != share {
				t.Errorf("the replica holds %d of the endpoint's deliveries, want its share, %d", n, share)
			}
		})
	}
}

// claimedIDs runs a claim and returns the ids of the jobs it took.
func claimedIDs(t *testing.T, db *sql.DB, query string, args ...any) []int64 {
	t.Helper()
	ids, err := queryAll(context.Background(), db, scanID, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// A slow receiver holds no more than its share of a replica's workers,
// however high its endpoint's cap: with 4 workers, an endpoint of
// max_in_flight 1000 whose receiver holds every request until released
// has 20 deliveries due and takes 2 workers, and another endpoint's event
// is delivered while those 2 requests still hang. The whole process runs
// here: a registered replica, whose workers claim ahead.
func TestSlowEndpointHoldsOnlyItsShareOfTheWorkers(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	release := make(chan struct{})
	var held concurrency
	slow := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		held.enter()
		defer held.leave()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	heldThen := make(chan int64, 1)
	fast := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			heldThen <- held.now.Load()
		}
	})
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		run(ctx, []string{"-addr", addr, "-database-url", dsn, "-admin-token", testToken, "-allow-private-endpoints",
			"-workers", "4"}, envFrom(nil), io.Discard, testWriter{t})
	}()
	defer func() { cancel(); <-exited }()
	awaitHealthy(t, addr, exited)
	releaseSlow := sync.OnceFunc(func() { close(release) })
	defer releaseSlow() // before the shutdown, which waits for the requests
	api := &testAPI{t: t, srv: &httptest.Server{URL: "http://" + addr}}
	slowEP := createTunedEndpoint(t, api, slow.srv.URL, `"max_in_flight": 1000`)
	createTunedEndpoint(t, api, fast.srv.URL, `"max_in_flight": 1000`)

	mustExec(t, db, `SELECT outbox.record($1, i::text, '{}') FROM generate_series(1, 20) AS i`, topicFor(slow.srv.URL)+".e")
	waitFor(t, "the slow receiver to hold requests", 10*time.Second, func() bool { return held.now.Load() >= 2 })
	mustExec(t, db, `SELECT outbox.record($1, '', '{}')`, topicFor(fast.srv.URL)+".e")
	select {
	case n := <-heldThen:
		if n != 2 {
			t.Errorf("the slow receiver held %d requests when the other endpoint's delivery came, want its share, 2", n)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the other endpoint's delivery did not come while the slow receiver held %d requests", held.now.Load())
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'running'`, slowEP.ID); n != 2 {
		t.Errorf("%d of the slow endpoint's deliveries running, want its share of the 4 workers, 2", n)
	}

	releaseSlow()
	waitFor(t, "every delivery", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed'`) == 21
	})
	if peak := held.peak.Load(); peak != 2 {
		t.Errorf("the slow receiver saw %d requests at once, want its share of the 4 workers, 2", peak)
	}
}
