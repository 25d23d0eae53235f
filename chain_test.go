// chain_test.go: two outboxd setups chained, A's endpoint being B's inbox:
// every event of A is recorded in B exactly once, through a receiver that
// fails at random, A's retries and a replay; and through a replay at the
// edge of A's events window that retries through an outage of B for the
// whole retry horizon, with both sides' sweeps running.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// flakyProxy forwards to target, failing at random (seeded): it drops a
// request before B sees it, or forwards it and loses B's answer, which is
// the case that makes A send a duplicate B has already recorded.
type flakyProxy struct {
	srv       *httptest.Server
	mu        sync.Mutex // protects rng
	rng       *rand.Rand
	forwarded atomic.Int64 // requests B saw
	lost      atomic.Int64 // of those, answers A never got
}

func newFlakyProxy(t *testing.T, target string, seed uint64) *flakyProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(u)
	p := &flakyProxy{rng: rand.New(rand.NewPCG(seed, seed))}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		roll := p.rng.IntN(10)
		p.mu.Unlock()
		switch {
		case roll < 3:
			http.Error(w, "flaky: dropped before the receiver", http.StatusBadGateway)
		case roll < 5:
			p.forwarded.Add(1)
			p.lost.Add(1)
			forward.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "flaky: the receiver's answer was lost", http.StatusGatewayTimeout)
		default:
			p.forwarded.Add(1)
			forward.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func TestChainAToBExactlyOnceThroughFlakyReceiver(t *testing.T) {
	t.Parallel()
	dbA, _ := newTestDB(t)
	dbB, _ := newTestDB(t)
	apiA := newTestAPI(t, dbA, testPolicy)
	apiB := newTestAPI(t, dbB, testPolicy)
	proxy := newFlakyProxy(t, apiB.srv.URL, 6)

	ep := apiA.createEndpoint(proxy.srv.URL + "/webhooks/a")
	body, _ := json.Marshal(map[string]string{"name": "a", "secret": ep.Secret})
	if status, resp := apiB.do("POST", "/api/sources", string(body)); status != http.StatusCreated {
		t.Fatalf("create source in B: %d %s", status, resp)
	}

	const n = 40
	mustExec(t, dbA, `SELECT outbox.record('order.paid', 'o-' || i, jsonb_build_object('i', i)) FROM generate_series(1, $1) AS i`, n)
	relayAll(t, dbA)
	runWebhookWorkers(t, dbA, 10*time.Second)
	allDelivered := func() bool {
		kickRetries(t, dbA)
		return queryInt(t, dbA, `SELECT count(*) FROM outbox.jobs WHERE kind = 'webhook'`) == 0 &&
			queryInt(t, dbA, `SELECT count(DISTINCT event_id) FROM outbox.deliveries WHERE kind = 'webhook' AND outcome = 'completed'`) == n
	}
	waitFor(t, "A to deliver every event", 60*time.Second, allDelivered)

	// What A recorded, B has once each, under the source's prefix, keyed
	// in its inbox by A's event id.
	wantEvents := queryStrings(t, dbA, `SELECT 'a.' || topic || ' ' || subject || ' ' || payload::text FROM outbox.events WHERE topic = 'order.paid' ORDER BY 1`)
	wantInbox := queryStrings(t, dbA, `SELECT 'a ' || id FROM outbox.events WHERE topic = 'order.paid' ORDER BY 1`)
	check := func(when string) {
		t.Helper()
		gotEvents := queryStrings(t, dbB, `SELECT topic || ' ' || subject || ' ' || payload::text FROM outbox.events ORDER BY 1`)
		if diff := cmp.Diff(wantEvents, gotEvents); diff != "" {
			t.Errorf("%s: B's events (-A's +B's):\n%s", when, diff)
		}
		gotInbox := queryStrings(t, dbB, `SELECT source || ' ' || webhook_id FROM outbox.inbox WHERE event_id IS NOT NULL ORDER BY 1`)
		if diff := cmp.Diff(wantInbox, gotInbox); diff != "" {
			t.Errorf("%s: B's inbox (-want +got):\n%s", when, diff)
		}
	}
	check("after A's retries")
	if proxy.lost.Load() == 0 || proxy.forwarded.Load() <= n {
		t.Fatalf("B saw %d requests, %d of them answered into the void: the seed made no duplicate, so this test proved nothing",
			proxy.forwarded.Load(), proxy.lost.Load())
	}
	t.Logf("B saw %d requests for %d events (%d answers lost)", proxy.forwarded.Load(), n, proxy.lost.Load())

	// A replay by hand: delivered events are sent again, with the same
	// webhook-id.
	seen := proxy.forwarded.Load()
	mustExec(t, dbA, `
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts)
		SELECT 'webhook', d.event_id, d.endpoint_id, 18
		FROM outbox.deliveries AS d
		WHERE d.kind = 'webhook' AND d.outcome = 'completed'
		ORDER BY d.job_id
		LIMIT 10`)
	waitFor(t, "the replay to be delivered", 60*time.Second, allDelivered)
	if proxy.forwarded.Load() < seen+10 {
		t.Errorf("the replay reached B %d times, want at least 10", proxy.forwarded.Load()-seen)
	}
	check("after the replay")
}

// outageProxy forwards to target, or, while down, answers 503 with
// Retry-After: 3600, as a receiver's load balancer in an outage might:
// every retry then waits the longest the schedule allows (retryHorizon
// counts a Retry-After at its hour).
type outageProxy struct {
	srv  *httptest.Server
	down atomic.Bool
}

func newOutageProxy(t *testing.T, target string) *outageProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(u)
	p := &outageProxy{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.down.Load() {
			w.Header().Set("Retry-After", "3600")
			http.Error(w, "outage", http.StatusServiceUnavailable)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// ageDatabase moves every timestamp of outboxd's rows in db back by d: as
// if they were written d earlier, which is how these tests let days pass.
func ageDatabase(t *testing.T, db *sql.DB, d time.Duration) {
	t.Helper()
	by := fmt.Sprintf("%d microseconds", d.Microseconds())
	mustExec(t, db, `UPDATE outbox.events SET created_at = created_at - $1::interval, fanned_out_at = fanned_out_at - $1::interval`, by)
	mustExec(t, db, `UPDATE outbox.jobs SET created_at = created_at - $1::interval, scheduled_at = scheduled_at - $1::interval,
		attempted_at = attempted_at - $1::interval, finalized_at = finalized_at - $1::interval`, by)
	mustExec(t, db, `UPDATE outbox.inbox SET received_at = received_at - $1::interval`, by)
	mustExec(t, db, `UPDATE outbox.endpoints SET held_until = held_until - $1::interval, rate_next_at = rate_next_at - $1::interval`, by)
}

// chainWorkers is A's worker pool, driven one turn at a time (workOnce).
func chainWorkers(t *testing.T, db *sql.DB, cfg WorkerConfig) *workerPool {
	t.Helper()
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	return newWorkerPool(db, cfg, time.Minute, newSubscriberRegistry(),
		map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, client, nil, nil, testLogger(t)).deliver}, testLogger(t))
}

// chainPolicy is an endpoint policy that advertises an inbox window.
func chainPolicy(inboxWindow time.Duration) endpointPolicy {
	p := testPolicy
	p.InboxWindow = inboxWindow
	return p
}

// The duplicate at its boundary. Both sides run the default
// configuration. A's event reached B; later, with the event a minute short
// of A's events window (its completed job long cleaned away), an operator
// replays A's endpoint from a month ago. B is down, and A retries for the
// whole retry horizon, each retry waiting what B's Retry-After asks; B's
// clock moves on with A's schedule and B's retention sweeps run. When B is
// back, A's last attempt must find B's dedup record: B has the event once.
func TestChainReplayAtTheEdgeOfTheWindowReachesBOnce(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig(nil, envFrom(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dbA, _ := newTestDB(t)
	dbB, _ := newTestDB(t)
	apiA := newTestAPI(t, dbA, testPolicy)
	apiB := newTestAPI(t, dbB, chainPolicy(advertisedWindow(cfg.Retention.Inbox, cfg.Retention.Interval)))
	proxy := newOutageProxy(t, apiB.srv.URL)
	ep := apiA.createEndpoint(proxy.srv.URL + "/webhooks/a")
	body, _ := json.Marshal(map[string]string{"name": "a", "secret": ep.Secret})
	if status, resp := apiB.do("POST", "/api/sources", string(body)); status != http.StatusCreated {
		t.Fatalf("create source in B: %d %s", status, resp)
	}
	sweepA := newSweeper(dbA, cfg.Retention, "a:1", testLogger(t))
	sweepB := newSweeper(dbB, cfg.Retention, "b:1", testLogger(t))
	workers := chainWorkers(t, dbA, cfg.Workers)
	workOnce := func() {
		t.Helper()
		if _, err := workers.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	inB := func() int { return queryInt(t, dbB, `SELECT count(*) FROM outbox.events WHERE topic = 'a.order.paid'`) }

	eventID := record(t, dbA, "order.paid", "o-1")
	relayAll(t, dbA)
	workOnce()
	if n := inB(); n != 1 {
		t.Fatalf("after the first delivery B has the event %d times, want 1", n)
	}
	// A learned B's window (288h less the interval), which covers it: the
	// replay below is bounded by A's own events retention alone.
	if got := endpointWindow(t, apiA, ep.ID); got != 287*3600 {
		t.Fatalf("A recorded B's dedup window as %d s, want 1033200", got)
	}

	// Both sides a minute short of A's events window later. A's sweep
	// removes the completed job (a day's window) and keeps the event.
	edge := cfg.Retention.Events - time.Minute
	ageDatabase(t, dbA, edge)
	ageDatabase(t, dbB, edge)
	if _, err := sweepA.sweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, dbA, `SELECT count(*) FROM outbox.jobs WHERE kind = 'webhook'`); n != 0 {
		t.Fatalf("A's job cleaner left %d webhook jobs, want 0", n)
	}
	since := time.Now().Add(-30 * 24 * time.Hour).UTC().Format(time.RFC3339)
	status, resp := apiA.do("POST", fmt.Sprintf("/api/endpoints/%d/replay", ep.ID), `{"since":"`+since+`"}`)
	var replay ReplayResult
	if err := json.Unmarshal(resp, &replay); status != http.StatusOK || err != nil || replay.Jobs != 1 || !strings.Contains(replay.Message, "retention window") {
		t.Fatalf("replay: %d %s, want 200 with the event replayed, clamped to events retention", status, resp)
	}

	// B's outage: each failed attempt waits what it scheduled, on both
	// clocks, and B sweeps after each wait.
	proxy.down.Store(true)
	elapsed := time.Duration(0)
	for attempt := 1; attempt < cfg.Workers.MaxAttempts; attempt++ {
		workOnce()
		var wait time.Duration
		if err := dbA.QueryRow(`SELECT (extract(epoch FROM scheduled_at - attempted_at) * 1e6)::bigint * 1000
			FROM outbox.jobs WHERE event_id = $1 AND state = 'retryable' AND attempt = $2`, eventID, attempt).Scan(&wait); err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		elapsed += wait
		ageDatabase(t, dbA, wait)
		ageDatabase(t, dbB, wait)
		mustExec(t, dbA, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state = 'retryable'`)
		if _, err := sweepB.sweepOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	proxy.down.Store(false)
	workOnce()
	if state := queryStrings(t, dbA, `SELECT outcome::text || ' ' || attempt FROM outbox.deliveries
		WHERE outcome = 'completed' AND replay_id IS NOT NULL AND event_id = `+itoa(eventID)); !cmp.Equal(state, []string{"completed 18"}) {
		t.Fatalf("A's replayed job: %v, want completed at its 18th attempt", state)
	}
	t.Logf("the last attempt reached B %s after the first delivery (%s after the replay)", (edge + elapsed).Round(time.Minute), elapsed.Round(time.Minute))
	if n := inB(); n != 1 {
		t.Errorf("B recorded A's event %d times, want once: its dedup record (window %s) was gone %s after the first delivery",
			n, cfg.Retention.Inbox, (edge + elapsed).Round(time.Minute))
	}
}

// endpointWindow is the dedup window A's API shows for an endpoint, in
// seconds; 0 when none was advertised.
func endpointWindow(t *testing.T, api *testAPI, id int64) int64 {
	t.Helper()
	status, resp := api.do("GET", fmt.Sprintf("/api/endpoints/%d", id), "")
	var ep Endpoint
	if err := json.Unmarshal(resp, &ep); status != http.StatusOK || err != nil {
		t.Fatalf("get endpoint %d: %d %s", id, status, resp)
	}
	if ep.DedupWindowSeconds == nil {
		return 0
	}
	if ep.DedupWindowSeenAt == nil {
		t.Errorf("endpoint %d: a window without the time it was seen", id)
	}
	return *ep.DedupWindowSeconds
}

// A receiver whose window does not cover A, through real deliveries: B
// advertises 191h (an outboxd at the old default inbox retention of 192h),
// shorter than A's resend horizon of 272h4m49.2s. A records it from B's
// 2xx, its overview raises receiver_window_short, and a replay and a retry
// by hand resend only events younger than B's window less A's retry
// horizon (86h55m10.8s): an event of 4 days stays unsent, while B, which
// has it once, would have forgotten it before a resend's last attempt.
func TestChainShortReceiverWindowClampsResendsAndAlerts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbA, _ := newTestDB(t)
	dbB, _ := newTestDB(t)
	apiA := newTestAPI(t, dbA, testPolicy)
	apiB := newTestAPI(t, dbB, chainPolicy(191*time.Hour))
	ep := apiA.createEndpoint(apiB.srv.URL + "/webhooks/a")
	body, _ := json.Marshal(map[string]string{"name": "a", "secret": ep.Secret})
	if status, resp := apiB.do("POST", "/api/sources", string(body)); status != http.StatusCreated {
		t.Fatalf("create source in B: %d %s", status, resp)
	}
	workers := chainWorkers(t, dbA, defaultConfig().Workers)
	deliver := func() {
		t.Helper()
		relayAll(t, dbA)
		if _, err := workers.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	inB := func() []string {
		return queryStrings(t, dbB, `SELECT subject FROM outbox.events WHERE topic = 'a.order.paid' ORDER BY subject`)
	}

	if got := endpointWindow(t, apiA, ep.ID); got != 0 {
		t.Fatalf("a window of %d s before any answer", got)
	}
	old := record(t, dbA, "order.paid", "old")
	deliver()
	if got := endpointWindow(t, apiA, ep.ID); got != 687_600 {
		t.Fatalf("A recorded B's dedup window as %d s, want 687600 (191h)", got)
	}
	var o Overview
	if status, resp := apiA.do("GET", "/api/overview", ""); status != http.StatusOK || json.Unmarshal(resp, &o) != nil {
		t.Fatalf("overview: %d %s", status, resp)
	}
	if names := alertNamesOf(o.Alerts); !cmp.Equal(names, []string{"receiver_window_short"}) ||
		!strings.Contains(o.Alerts[0].Message, fmt.Sprintf("endpoint %d (191h0m0s)", ep.ID)) {
		t.Errorf("A's alerts %v, want receiver_window_short naming endpoint %d: %+v", names, ep.ID, o.Alerts)
	}

	// Four days on, a new event; the old one's job is discarded, as if
	// its delivery had failed for good.
	ageDatabase(t, dbA, 4*24*time.Hour)
	ageDatabase(t, dbB, 4*24*time.Hour)
	record(t, dbA, "order.paid", "new")
	deliver()
	mustExec(t, dbA, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at)
		VALUES ('webhook', $1, $2, 18, 'discarded', 1, now(), now())`, old, ep.ID)
	if diff := cmp.Diff([]string{"new", "old"}, inB()); diff != "" {
		t.Fatalf("B's events (-want +got):\n%s", diff)
	}

	var retried RetryResult
	status, resp := apiA.do("POST", fmt.Sprintf("/api/endpoints/%d/retry-discarded", ep.ID), "")
	if err := json.Unmarshal(resp, &retried); status != http.StatusOK || err != nil || retried.Jobs != 0 || retried.Skipped != 1 ||
		!strings.Contains(retried.Message, "webhook-dedup-window") {
		t.Errorf("retry-discarded: %d %s, want the old event's delivery skipped because of B's window", status, resp)
	}
	job := webhookJob(t, dbA, old, ep.ID)
	if status, resp := apiA.do("POST", fmt.Sprintf("/api/jobs/%d/retry", job), ""); status != http.StatusBadRequest {
		t.Errorf("retry of the old event's delivery: %d %s, want 400", status, resp)
	}
	since := time.Now().Add(-30 * 24 * time.Hour).UTC().Format(time.RFC3339)
	status, resp = apiA.do("POST", fmt.Sprintf("/api/endpoints/%d/replay", ep.ID), `{"since":"`+since+`"}`)
	var replay ReplayResult
	if err := json.Unmarshal(resp, &replay); status != http.StatusOK || err != nil || replay.Jobs != 1 || !replay.Clamped ||
		!strings.Contains(replay.Message, "191h0m0s") {
		t.Fatalf("replay: %d %s, want only the new event, clamped to B's window", status, resp)
	}
	if from := time.Since(replay.From); from < 86*time.Hour || from > 87*time.Hour {
		t.Errorf("replay from %s ago, want 86h55m10.8s (191h less the retry horizon)", from)
	}
	deliver()
	if diff := cmp.Diff([]string{"new", "old"}, inB()); diff != "" {
		t.Errorf("B's events after the replay (-want +got):\n%s", diff)
	}
	if state := queryStrings(t, dbA, `SELECT state::text FROM outbox.jobs WHERE id = `+itoa(job)); !cmp.Equal(state, []string{"discarded"}) {
		t.Errorf("the old event's delivery is %v, want it still discarded", state)
	}

	// The window is the receiver's: an edit keeps it, a new URL drops it.
	path := fmt.Sprintf("/api/endpoints/%d", ep.ID)
	if status, resp := apiA.do("PATCH", path, `{"description": "B"}`); status != http.StatusOK || endpointWindow(t, apiA, ep.ID) != 687_600 {
		t.Errorf("after a new description: %d %s, want the window kept", status, resp)
	}
	if status, resp := apiA.do("PATCH", path, `{"url": "`+apiB.srv.URL+`/webhooks/elsewhere"}`); status != http.StatusOK || endpointWindow(t, apiA, ep.ID) != 0 {
		t.Errorf("after a new URL: %d %s, want no window", status, resp)
	}
}

// queryStrings runs a query of one text column, on a pool or in a
// transaction.
func queryStrings(t *testing.T, db interface {
	Query(string, ...any) (*sql.Rows, error)
}, query string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
