// dedupwindow_test.go: the receiver's dedup window as a sender keeps it
// (cleared when the receiver stops advertising one), and the bound it
// puts on a delivery held past it by a pause.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A receiver that stops advertising a window no longer has one: the 2xx
// without webhook-dedup-window clears what an earlier 2xx stored, while
// an answer that is not a 2xx, which may come from a proxy, leaves it.
func TestA2xxWithoutTheHeaderClearsTheWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var header atomic.Value // the webhook-dedup-window to answer with; "" for none
	var status atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := header.Load().(string); v != "" {
			w.Header().Set(headerDedupWindow, v)
		}
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(receiver.Close)
	ep := api.createEndpoint(receiver.URL)
	workers := chainWorkers(t, db, defaultConfig().Workers)
	deliver := func(subject string) {
		t.Helper()
		record(t, db, "order.paid", subject)
		relayAll(t, db)
		if _, err := workers.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}

	header.Store("3600")
	status.Store(http.StatusOK)
	deliver("advertised")
	if got := endpointWindow(t, api, ep.ID); got != 3600 {
		t.Fatalf("after a 2xx advertising 3600 s: window %d s, want 3600", got)
	}
	header.Store("")
	status.Store(http.StatusInternalServerError)
	deliver("failed")
	if got := endpointWindow(t, api, ep.ID); got != 3600 {
		t.Errorf("after a 500 without the header: window %d s, want 3600 kept", got)
	}
	status.Store(http.StatusOK)
	deliver("not advertised")
	if got := endpointWindow(t, api, ep.ID); got != 0 {
		t.Errorf("after a 2xx without the header: window %d s, want none", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE id = $1 AND dedup_window_seen_at IS NULL`, ep.ID); n != 1 {
		t.Errorf("dedup_window_seen_at kept without a window")
	}
}

// lossyProxy forwards to target; while lose is set it forwards, then
// answers 500 itself: the receiver recorded the webhook, and its 2xx was
// lost on the way back. It counts the requests the receiver saw, by
// webhook-id.
type lossyProxy struct {
	srv  *httptest.Server
	lose atomic.Bool
	mu   sync.Mutex // protects seen
	seen map[string]int
}

func newLossyProxy(t *testing.T, target string) *lossyProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(u)
	p := &lossyProxy{seen: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.seen[r.Header.Get("webhook-id")]++
		p.mu.Unlock()
		if p.lose.Load() {
			forward.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "the receiver's answer was lost", http.StatusInternalServerError)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *lossyProxy) requests(eventID int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[itoa(eventID)]
}

// The duplicate a pause could cause. B, an outboxd inbox at the defaults,
// advertises 287h. A's delivery reaches B, which records it, and B's 2xx
// is lost; A pauses the endpoint before its retry and resumes it once B's
// window has passed and B's sweep has removed the record. The retry must
// not reach B: it would be recorded a second time. It ends discarded,
// without a request, saying why; a delivery that never reached B, queued
// during the pause, still goes.
func TestPauseOutlastingTheReceiverWindowSendsNoDuplicate(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	ctx := context.Background()
	dbA, _ := newTestDB(t)
	dbB, _ := newTestDB(t)
	apiA := newTestAPI(t, dbA, testPolicy)
	window := advertisedWindow(cfg.Retention.Inbox, cfg.Retention.Interval)
	apiB := newTestAPI(t, dbB, chainPolicy(window))
	proxy := newLossyProxy(t, apiB.srv.URL)
	ep := apiA.createEndpoint(proxy.srv.URL + "/webhooks/a")
	body, _ := json.Marshal(map[string]string{"name": "a", "secret": ep.Secret})
	if status, resp := apiB.do("POST", "/api/sources", string(body)); status != http.StatusCreated {
		t.Fatalf("create source in B: %d %s", status, resp)
	}
	workers := chainWorkers(t, dbA, cfg.Workers)
	deliver := func() {
		t.Helper()
		relayAll(t, dbA)
		if _, err := workers.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	inB := func(subject string) int {
		return queryInt(t, dbB, `SELECT count(*) FROM outbox.events WHERE topic = 'a.order.paid' AND subject = $1`, subject)
	}
	endpointCall := func(action string) {
		t.Helper()
		if status, resp := apiA.do("POST", fmt.Sprintf("/api/endpoints/%d/%s", ep.ID, action), ""); status != http.StatusOK {
			t.Fatalf("%s: %d %s", action, status, resp)
		}
	}

	record(t, dbA, "order.paid", "first")
	deliver()
	if got := endpointWindow(t, apiA, ep.ID); got != 287*3600 {
		t.Fatalf("A recorded B's window as %d s, want 1033200 (287h)", got)
	}
	proxy.lose.Store(true)
	lost := record(t, dbA, "order.paid", "lost")
	deliver()
	if inB("lost") != 1 || proxy.requests(lost) != 1 {
		t.Fatalf("B has the event %d times after %d requests, want 1 and 1", inB("lost"), proxy.requests(lost))
	}
	proxy.lose.Store(false)
	endpointCall("pause")
	held := record(t, dbA, "order.paid", "held")
	deliver()
	if n := proxy.requests(held); n != 0 {
		t.Fatalf("a paused endpoint's delivery reached B %d times", n)
	}

	// B's window passes, and B's sweep removes its record of the event.
	ageDatabase(t, dbA, window+time.Hour)
	ageDatabase(t, dbB, window+time.Hour)
	if _, err := newSweeper(dbB, cfg.Retention, "b:1", testLogger(t)).sweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, dbB, `SELECT count(*) FROM outbox.inbox WHERE webhook_id = $1`, itoa(lost)); n != 0 {
		t.Fatalf("B still keeps its record of the event (%d rows): this test proves nothing", n)
	}
	endpointCall("resume")
	deliver()

	if n := proxy.requests(lost); n != 1 || inB("lost") != 1 {
		t.Errorf("after the resume, B saw the event %d times and recorded it %d times, want once each", n, inB("lost"))
	}
	var state, errs string
	if err := dbA.QueryRow(`SELECT state::text, errors::text FROM outbox.jobs WHERE event_id = $1`, lost).Scan(&state, &errs); err != nil {
		t.Fatal(err)
	}
	t.Logf("the delivery's errors: %s", errs)
	if state != "discarded" || !strings.Contains(errs, "not sent") || !strings.Contains(errs, headerDedupWindow) {
		t.Errorf("the lost answer's delivery is %s with errors %s, want discarded, not sent, naming the receiver's window", state, errs)
	}
	if n := proxy.requests(held); n != 1 || inB("held") != 1 {
		t.Errorf("the delivery queued during the pause reached B %d times and was recorded %d times, want once each", n, inB("held"))
	}
}

// The claim's bound on a delivery that may have reached its receiver, at
// its edges: the receiver's window when it is longer than the retry
// horizon (104h4m49.2s at 18 attempts), else the horizon; none for a
// receiver that advertised no window, and none for a first delivery (the
// claim gives it no window).
func TestResendTooLateAtItsEdges(t *testing.T) {
	t.Parallel()
	if h := retryHorizon(18); h != 104*time.Hour+4*time.Minute+49200*time.Millisecond {
		t.Fatalf("retry horizon at 18 attempts %s, want 104h4m49.2s", h)
	}
	created := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		window time.Duration
		age    time.Duration
		late   bool
	}{
		{"within a 287h window", 287 * time.Hour, 287*time.Hour - time.Second, false},
		{"at a 287h window", 287 * time.Hour, 287 * time.Hour, true},
		{"a 1h window, within the retry horizon", time.Hour, 104 * time.Hour, false},
		{"a 1h window, at the retry horizon", time.Hour, 104*time.Hour + 4*time.Minute + 49200*time.Millisecond, true},
		{"no window advertised, or a first delivery", 0, 10_000 * time.Hour, false},
	} {
		job := Job{MaxAttempts: 18, resendWindow: tc.window, claimedAt: created.Add(tc.age), Event: Event{ID: 7, CreatedAt: created}}
		err := resendTooLate(job)
		if (err != nil) != tc.late {
			t.Errorf("%s: resendTooLate = %v, want late %v", tc.name, err, tc.late)
		}
		if err != nil && !strings.Contains(err.Error(), "not sent") {
			t.Errorf("%s: %v, want it to say the attempt was not sent", tc.name, err)
		}
	}
}

// The same bound under an open breaker, whose one attempt at a time can
// hold a backlog past the receiver's window: the claim does not send a
// delivery that failed once (its request may have been recorded) once
// its event is older than the receiver's 300h window.
func TestOpenBreakerHeldPastTheWindowSendsNoResend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var requests atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(receiver.Close)
	ep := api.createEndpoint(receiver.URL)
	workers := chainWorkers(t, db, defaultConfig().Workers)
	eventID := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	if _, err := workers.workOnce(ctx, 10); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `UPDATE outbox.endpoints
		SET dedup_window_seconds = 300 * 3600, dedup_window_seen_at = now(), breaker_opened_at = now(), consecutive_failures = 5
		WHERE id = $1`, ep.ID)
	ageDatabase(t, db, 300*time.Hour)
	mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state = 'retryable'`)
	if _, err := workers.workOnce(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("the receiver got %d requests, want 1: the first attempt's", n)
	}
	var state, errs string
	if err := db.QueryRow(`SELECT state::text, errors->-1->>'error' FROM outbox.jobs WHERE id = $1`, webhookJob(t, db, eventID, ep.ID)).Scan(&state, &errs); err != nil {
		t.Fatal(err)
	}
	if state != "discarded" || !strings.HasPrefix(errs, "not sent") {
		t.Errorf("the delivery is %s, last error %q; want discarded, not sent", state, errs)
	}
}
