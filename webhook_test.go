// webhook_test.go: hops 4 to 6 for webhooks, from fan-out to an httptest
// receiver: once per endpoint, signed, retried, and the endpoint's state.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// received is one request a test receiver got.
type received struct {
	Header http.Header
	Body   []byte
	At     time.Time
}

// receiver is an httptest server that keeps every request and answers
// with answer (200 when nil).
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex // protects reqs
	reqs   []received
	answer func(n int, w http.ResponseWriter, r *http.Request) // n counts from 1
}

func newReceiver(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, received{Header: r.Header.Clone(), Body: body, At: time.Now()})
		n := len(rc.reqs)
		rc.mu.Unlock()
		if rc.answer != nil {
			rc.answer(n, w, r)
		}
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.reqs...)
}

// runWebhookWorkers runs a worker pool that sends webhooks with the safe
// client (loopback allowed) until the test ends.
func runWebhookWorkers(t *testing.T, db *sql.DB, timeout time.Duration) {
	t.Helper()
	runWebhookWorkersPolling(t, db, timeout, 20*time.Millisecond)
}

// runWebhookWorkersPolling is runWebhookWorkers with workers that look for
// due jobs without a notification every poll. It returns the running pool.
func runWebhookWorkersPolling(t *testing.T, db *sql.DB, timeout, poll time.Duration) *workerPool {
	t.Helper()
	cfg := defaultConfig().Workers
	cfg.PollInterval = poll
	cfg.Concurrency = 8
	wp := webhookWorkers(t, db, cfg, timeout)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wp.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	return wp
}

// webhookWorkers is a worker pool, not started, that runs deliveries,
// with a client that reaches the tests' receivers, each request within
// timeout, and the jobs of subs; no other kind.
func webhookWorkers(t testing.TB, db *sql.DB, cfg WorkerConfig, timeout time.Duration, subs ...Subscriber) *workerPool {
	t.Helper()
	reg := newSubscriberRegistry()
	for _, s := range subs {
		reg.Register(s)
	}
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: timeout})
	return newWorkerPool(db, cfg, time.Minute, reg,
		map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, client, nil, nil, testLogger(t)).deliver}, testLogger(t))
}

// relayAll fans out every un-fanned event, as the relay's passes would.
func relayAll(t *testing.T, db *sql.DB) {
	t.Helper()
	r := newTestRelay(t, db, defaultConfig().Relay)
	for {
		res, err := r.relayOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			return
		}
	}
}

// record records one event and returns its id.
func record(t *testing.T, db *sql.DB, topic, subject string) int64 {
	t.Helper()
	return recordAddressed(t, db, "", topic, subject)
}

// recordAddressed is record with the event addressed to the owner whose key is
// owner ("": none).
func recordAddressed(t *testing.T, db *sql.DB, owner, topic, subject string) int64 {
	t.Helper()
	ev := eventInput{Topic: topic, Subject: subject, Payload: json.RawMessage(`{"subject": "` + subject + `"}`), Owner: owner}
	id, err := ev.record(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// webhookJob is the id of the webhook job of (event, endpoint).
// webhookJob is the id of the delivery of event eventID to endpoint
// endpointID: in the queue, or in the history once delivered.
func webhookJob(t *testing.T, db *sql.DB, eventID, endpointID int64) int64 {
	t.Helper()
	return int64(queryInt(t, db, `
		SELECT j.id FROM (
		  SELECT id, 0 AS delivered FROM outbox.jobs WHERE event_id = $1 AND endpoint_id = $2
		  UNION ALL
		  SELECT job_id, 1 FROM outbox.deliveries WHERE event_id = $1 AND endpoint_id = $2 AND outcome = 'completed'
		) AS j
		ORDER BY j.delivered, j.id DESC
		LIMIT 1`, eventID, endpointID))
}

func secretOf(t *testing.T, e endpointWithSecret) []byte {
	t.Helper()
	s, err := parseWebhookSecret(e.Secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestEncodeWebhookBody(t *testing.T) {
	t.Parallel()
	ev := Event{
		ID: 42, Topic: "order.paid", Subject: "o-7",
		Payload:   json.RawMessage(`{"note": "<b>&", "cents": 1200}`),
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.FixedZone("CET", 3600)),
	}
	got, err := encodeWebhookBody(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"42","type":"order.paid","subject":"o-7","timestamp":"2026-01-02T02:04:05.123456Z","data":{"note":"<b>&","cents":1200}}`
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
}

// webhook-dedup-window is whole seconds above 0; anything else advertises
// nothing, and ten years is the most it says.
func TestParseDedupWindow(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]time.Duration{
		"1033200":              287 * time.Hour,
		" 60 ":                 time.Minute,
		"":                     0,
		"0":                    0,
		"-5":                   0,
		"1.5":                  0,
		"12d":                  0,
		"99999999999999999999": 0, // not an int64
		"9223372036854775807":  maxRetention,
	} {
		if got := parseDedupWindow(v); got != want {
			t.Errorf("parseDedupWindow(%q) = %s, want %s", v, got, want)
		}
	}
}

// The outcome rules of the issue, one row each: what an answer does to the
// endpoint and, through decideOutcome, to the job.
func TestClassifyWebhookResponse(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	type result struct {
		Change endpointChange
		State  jobState
		Delay  time.Duration
	}
	const backoff3 = 81 * time.Second // attempt 3, jitter 0.5
	for _, tc := range []struct {
		name       string
		attempt    int
		status     int
		retryAfter string
		err        error
		want       result
	}{
		{"200 succeeds", 3, 200, "", nil, result{endpointSucceeded, jobCompleted, 0}},
		{"204 succeeds", 3, 204, "", nil, result{endpointSucceeded, jobCompleted, 0}},
		{"410 disables and discards", 3, 410, "", nil, result{endpointGone, jobDiscarded, 0}},
		{"500 retries with backoff", 3, 500, "", nil, result{endpointFailed, jobRetryable, backoff3}},
		{"503 with Retry-After seconds", 3, 503, "120", nil, result{endpointFailed, jobRetryable, 120 * time.Second}},
		{"Retry-After shorter than the backoff", 3, 503, "10", nil, result{endpointFailed, jobRetryable, backoff3}},
		{"Retry-After capped at an hour", 3, 429, "86400", nil, result{endpointFailed, jobRetryable, time.Hour}},
		{"Retry-After as an HTTP date", 3, 429, now.Add(10 * time.Minute).Format(http.TimeFormat), nil, result{endpointFailed, jobRetryable, 10 * time.Minute}},
		{"Retry-After unreadable", 3, 429, "soon", nil, result{endpointFailed, jobRetryable, backoff3}},
		{"408 retries", 3, 408, "", nil, result{endpointFailed, jobRetryable, backoff3}},
		{"other 4xx retries", 3, 400, "", nil, result{endpointFailed, jobRetryable, backoff3}},
		{"Retry-After ignored on 404", 3, 404, "600", nil, result{endpointFailed, jobRetryable, backoff3}},
		{"redirect is a failure", 3, 302, "", nil, result{endpointFailed, jobRetryable, backoff3}},
		{"timeout retries", 3, 0, "", context.DeadlineExceeded, result{endpointFailed, jobRetryable, backoff3}},
		{"forbidden address retries", 3, 0, "", fmt.Errorf("dial: %w", errForbiddenAddress), result{endpointFailed, jobRetryable, backoff3}},
		{"last attempt discards", 18, 500, "", nil, result{endpointFailed, jobDiscarded, 0}},
		{"410 on the last attempt", 18, 410, "", nil, result{endpointGone, jobDiscarded, 0}},
	} {
		change, err := classifyWebhookResponse(tc.status, tc.retryAfter, tc.err, now)
		out := decideOutcome(tc.attempt, 18, err, 0.5)
		got := result{change, out.State, out.Delay}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
		if (out.State == jobCompleted) != (out.Error == "") {
			t.Errorf("%s: state %s with error %q", tc.name, out.State, out.Error)
		}
	}
}

func TestValidateRetryHorizon(t *testing.T) {
	t.Parallel()
	week := 7 * 24 * time.Hour
	for _, tc := range []struct {
		attempts  int
		retention time.Duration
		ok        bool
	}{
		{18, week, true},
		{18, 0, true}, // retention off: nothing is pruned
		{1, time.Hour, true},
		{18, 3 * 24 * time.Hour, false},
		{30, week, false},
	} {
		err := validateRetryHorizon(tc.attempts, tc.retention)
		if (err == nil) != tc.ok {
			t.Errorf("validateRetryHorizon(%d, %s) = %v, want ok %v", tc.attempts, tc.retention, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "-job-max-attempts (OUTBOXD_JOB_MAX_ATTEMPTS)") {
			t.Errorf("error %q does not name the setting", err)
		}
	}
	if _, err := parseConfig([]string{"-job-max-attempts", "30"}, envFrom(nil), io.Discard); err == nil {
		t.Error("start-up accepted 30 attempts, whose retries outlive a week's retention")
	}
}

// The webhook settings parse from flags and environment, and refuse bad
// values by name.
func TestWebhookSettings(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig([]string{"-webhook-timeout", "5s"}, envFrom(map[string]string{
		"OUTBOXD_FAILING_ENDPOINT_DELAY":         "1m",
		"OUTBOXD_WEBHOOK_SECRET_ROTATION_WINDOW": "2h",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := []time.Duration{cfg.Webhooks.Timeout, cfg.Relay.FailingEndpointDelay, cfg.Webhooks.SecretRotationWindow}
	if diff := cmp.Diff([]time.Duration{5 * time.Second, time.Minute, 2 * time.Hour}, got); diff != "" {
		t.Errorf("settings (-want +got):\n%s", diff)
	}
	for env, want := range map[string]string{
		"OUTBOXD_WEBHOOK_TIMEOUT":        "-webhook-timeout (OUTBOXD_WEBHOOK_TIMEOUT)",
		"OUTBOXD_FAILING_ENDPOINT_DELAY": "-failing-endpoint-delay (OUTBOXD_FAILING_ENDPOINT_DELAY)",
	} {
		_, err := parseConfig(nil, envFrom(map[string]string{env: "-1s"}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=-1s: %v, want an error naming %s", env, err, want)
		}
	}
}

// N events × M endpoints with topic filters: each subscribing endpoint gets
// each event exactly once, signed with its own secret, webhook-id equal to
// the event id and to the body's id.
func TestWebhooksArriveOncePerSubscribingEndpoint(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	type sub struct {
		topics   []string
		receiver *receiver
		endpoint endpointWithSecret
	}
	subs := []*sub{{topics: nil}, {topics: []string{"order.*"}}, {topics: []string{"user.created", "audit.*"}}}
	for _, s := range subs {
		s.receiver = newReceiver(t, nil)
		s.endpoint = api.createEndpoint(s.receiver.srv.URL+"/hook", s.topics...)
	}
	events := map[int64]string{} // id → topic
	for i := range 8 {
		for _, topic := range []string{"order.paid", "order.created", "user.created", "billing.run"} {
			events[record(t, db, topic, fmt.Sprintf("s%d", i))] = topic
		}
	}
	relayAll(t, db)
	runWebhookWorkers(t, db, 10*time.Second)

	want := 0
	for _, s := range subs {
		for _, topic := range events {
			if topicMatches(s.topics, topic) {
				want++
			}
		}
	}
	waitFor(t, "every webhook job completed", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE kind = 'webhook' AND outcome = 'completed'`) == want
	})
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Errorf("%d jobs left in the queue, want none: every one delivered", n)
	}

	for i, s := range subs {
		secret := secretOf(t, s.endpoint)
		got := map[int64]int{}
		for _, r := range s.receiver.requests() {
			var body webhookBody
			if err := json.Unmarshal(r.Body, &body); err != nil {
				t.Fatalf("endpoint %d: body %s: %v", i, r.Body, err)
			}
			id, _ := strconv.ParseInt(r.Header.Get("webhook-id"), 10, 64)
			if body.ID != r.Header.Get("webhook-id") || events[id] == "" {
				t.Errorf("endpoint %d: webhook-id %q, body id %q, want both the event id", i, r.Header.Get("webhook-id"), body.ID)
			}
			if body.Type != events[id] || body.Subject == "" || string(body.Data) != `{"subject":"`+body.Subject+`"}` {
				t.Errorf("endpoint %d: body %s does not carry event %d", i, r.Body, id)
			}
			if _, err := time.Parse(time.RFC3339, body.Timestamp); err != nil {
				t.Errorf("endpoint %d: timestamp %q: %v", i, body.Timestamp, err)
			}
			if err := verifyWebhook([][]byte{secret}, r.Header, r.Body, time.Now()); err != nil {
				t.Errorf("endpoint %d: event %d: %v", i, id, err)
			}
			if ct, ua := r.Header.Get("Content-Type"), r.Header.Get("User-Agent"); ct != "application/json" || ua != "outboxd/"+version {
				t.Errorf("endpoint %d: content-type %q, user-agent %q", i, ct, ua)
			}
			got[id]++
		}
		wantIDs := map[int64]int{}
		for id, topic := range events {
			if topicMatches(s.topics, topic) {
				wantIDs[id] = 1
			}
		}
		if diff := cmp.Diff(wantIDs, got); diff != "" {
			t.Errorf("endpoint %d (topics %v): deliveries per event id (-want +got):\n%s", i, s.topics, diff)
		}
	}
	// Each one was recorded in the history, once, as the attempt that
	// completed its job.
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed' AND status_code = 200 AND duration_ms >= 0`); n != want {
		t.Errorf("%d deliveries recorded as 200, want %d", n, want)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries`); n != want {
		t.Errorf("%d rows in outbox.deliveries, want %d: one an attempt, each one succeeded", n, want)
	}
}

// A delivery's first 2xx is observed once in the commit→first-2xx
// histogram of its endpoint, and a failed attempt is not.
func TestCommitToFirst2xxIsObservedPerEndpoint(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	failFirst := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	ep := api.createEndpoint(failFirst.srv.URL+"/hook", "order.*")
	record(t, db, "order.paid", "o-1")
	relayAll(t, db)

	metrics := newDeliveryMetrics()
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	sender := newWebhookSender(db, nil, client, metrics, nil, testLogger(t))
	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: sender.deliver}, testLogger(t))
	count := func() uint64 { return metrics.commitTo2xx.With(itoa(ep.ID)).count.Load() }

	if _, err := wp.workOnce(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("after a 500: %d observations, want 0", n)
	}
	mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state = 'retryable'`)
	if _, err := wp.workOnce(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("after the 2xx: %d observations, want 1", n)
	}
	var out strings.Builder
	if err := writeMetrics(&out, Overview{}, &processCounters{deliveries: metrics}); err != nil {
		t.Fatal(err)
	}
	if line := `outboxd_commit_to_first_2xx_seconds_count{endpoint="` + itoa(ep.ID) + `"} 1`; !strings.Contains(out.String(), line+"\n") {
		t.Errorf("/metrics lacks %s:\n%s", line, out.String())
	}
}

// A receiver that fails twice, then succeeds, gets three attempts with one
// webhook-id; the retry delays grow. Delays are read from scheduled_at and
// then skipped, never waited for.
// The database kills every connection of outboxd while a delivery is in
// flight. The completer then meets a dead connection when it writes the
// outcome; it writes again on a new one, and the job completes. (It gave
// up at once before, and the job stayed running until the rescuer sent it
// again: a duplicate delivery for nothing. The fault suite found it.)
func TestOutcomeWriteSurvivesAKilledConnection(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	killer, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close()
	// The killer's one connection spares itself, so the test watches the job
	// through it: the test's own reads must not meet the dead connections
	// the fault aims at outboxd (they did, and failed the test in CI).
	killer.SetMaxOpenConns(1)
	api := newTestAPI(t, db, testPolicy)
	var killed atomic.Int64
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			var n int64
			err := killer.QueryRow(`SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&n)
			if err != nil {
				t.Error(err)
			}
			killed.Store(n)
		}
	})
	ep := api.createEndpoint(rc.srv.URL)
	eventID := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	job := webhookJob(t, db, eventID, ep.ID)
	runWebhookWorkers(t, db, 10*time.Second)

	waitFor(t, "the delivered job to complete", 10*time.Second, func() bool { return readJob(t, killer, job).State == "completed" })
	if killed.Load() == 0 {
		t.Error("the fault killed no connection of outboxd's while the delivery was in flight")
	}
	if n := len(rc.requests()); n != 1 {
		t.Errorf("receiver got %d requests, want 1", n)
	}
}

func TestWebhookRetriesKeepWebhookIDAndBackOff(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n <= 2 {
			http.Error(w, "try again", http.StatusInternalServerError)
		}
	})
	ep := api.createEndpoint(rc.srv.URL)
	eventID := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	job := webhookJob(t, db, eventID, ep.ID)
	runWebhookWorkers(t, db, 10*time.Second)

	var delays []float64
	for attempt := 1; attempt <= 2; attempt++ {
		waitFor(t, fmt.Sprintf("failed attempt %d", attempt), 10*time.Second, func() bool {
			r := readJob(t, db, job)
			return r.State == "retryable" && r.Attempt == attempt
		})
		delays = append(delays, readJob(t, db, job).DueInSecond)
		mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE id = $1`, job)
	}
	waitFor(t, "the third attempt to succeed", 10*time.Second, func() bool { return readJob(t, db, job).State == "completed" })

	if r := readJob(t, db, job); r.Attempt != 3 || r.Errors != 2 {
		t.Errorf("completed on attempt %d with %d errors kept, want 3 and 2", r.Attempt, r.Errors)
	}
	if !(delays[0] <= 1.1 && delays[1] > 12 && delays[1] <= 17.6) {
		t.Errorf("retry delays %v s, want about 1 then 16", delays)
	}
	reqs := rc.requests()
	if len(reqs) != 3 {
		t.Fatalf("receiver got %d requests, want 3", len(reqs))
	}
	for i, r := range reqs {
		if id := r.Header.Get("webhook-id"); id != strconv.FormatInt(eventID, 10) {
			t.Errorf("attempt %d: webhook-id %q, want the event id %d", i+1, id, eventID)
		}
		if err := verifyWebhook([][]byte{secretOf(t, ep)}, r.Header, r.Body, time.Now()); err != nil {
			t.Errorf("attempt %d: %v", i+1, err)
		}
		if string(r.Body) != string(reqs[0].Body) {
			t.Errorf("attempt %d: body %s differs from the first %s", i+1, r.Body, reqs[0].Body)
		}
	}
	// The endpoint's attempts as the panel lists them, newest first: the
	// two failures are rows of outbox.deliveries, the success is on the
	// job, and none is listed twice.
	st, err := readEndpointStats(context.Background(), db, ep.ID, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range st.Recent {
		status := 0
		if d.StatusCode != nil {
			status = *d.StatusCode
		}
		got = append(got, fmt.Sprintf("%d %d %s", d.Attempt, status, strings.TrimSpace(d.Excerpt)))
	}
	if diff := cmp.Diff([]string{"3 200 ", "2 500 try again", "1 500 try again"}, got); diff != "" {
		t.Errorf("recorded attempts (-want +got):\n%s", diff)
	}
	if got := queryStrings(t, db, `SELECT attempt || ' ' || outcome FROM outbox.deliveries WHERE job_id = $1 ORDER BY attempt`, job); !slices.Equal(got, []string{"1 retryable", "2 retryable", "3 completed"}) {
		t.Errorf("the history of the job: %q, want its 2 failed attempts and the one that completed it", got)
	}
}

// An endpoint's state follows its deliveries: a failure sets
// failing_since, new deliveries still go at once (the breaker is closed:
// isolation_test.go), a success clears it, 410 disables it, a disabled
// endpoint gets no jobs, re-enabling resumes.
func TestEndpointStateFollowsDeliveries(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var answer atomic.Int64
	answer.Store(http.StatusServiceUnavailable)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(answer.Load()))
	})
	ep := api.createEndpoint(rc.srv.URL)
	runWebhookWorkers(t, db, 10*time.Second)
	state := func() string { return api.endpoint(ep.ID).State }

	first := record(t, db, "t", "first")
	relayAll(t, db)
	firstJob := webhookJob(t, db, first, ep.ID)
	waitFor(t, "the first delivery to fail", 10*time.Second, func() bool { return readJob(t, db, firstJob).State == "retryable" })
	// One failure, its breaker closed: failing in the contract's state,
	// with failing_since set, and degraded in its health, as the panel
	// says (TestEndpointFailingFromDatabase).
	if e := api.endpoint(ep.ID); e.State != "failing" || e.Health != "degraded" || e.FailingSince == nil {
		t.Fatalf("after a failure: state %s, health %s, failing_since %v; want failing, degraded", e.State, e.Health, e.FailingSince)
	}

	// Failing, with one failure of the 5 that open its breaker: a new
	// delivery is due at once, not 5 minutes out.
	second := record(t, db, "t", "second")
	relayAll(t, db)
	secondJob := webhookJob(t, db, second, ep.ID)
	// The workers may have tried it already (the receiver still answers
	// 503): then it was due at once, and waits out its own backoff now.
	if j := readJob(t, db, secondJob); j.Attempt == 0 && j.DueInSecond > 1 {
		t.Errorf("a failing endpoint's new delivery, its breaker closed, is due in %.0f s, want now", j.DueInSecond)
	}

	// A success clears failing_since; new deliveries go at once again.
	answer.Store(http.StatusOK)
	mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE id IN ($1, $2)`, firstJob, secondJob)
	waitFor(t, "both deliveries to succeed", 10*time.Second, func() bool {
		return readJob(t, db, firstJob).State == "completed" && readJob(t, db, secondJob).State == "completed"
	})
	if e := api.endpoint(ep.ID); e.State != "enabled" || e.FailingSince != nil {
		t.Fatalf("after a success: state %s, failing_since %v; want enabled", e.State, e.FailingSince)
	}
	third := record(t, db, "t", "third")
	relayAll(t, db)
	thirdJob := webhookJob(t, db, third, ep.ID)
	if due := readJob(t, db, thirdJob).DueInSecond; due > 1 {
		t.Errorf("a healthy endpoint's delivery is due in %.0f s, want now", due)
	}
	waitFor(t, "the third delivery", 10*time.Second, func() bool { return readJob(t, db, thirdJob).State == "completed" })

	// 410 Gone disables the endpoint and discards the delivery.
	answer.Store(http.StatusGone)
	fourth := record(t, db, "t", "fourth")
	relayAll(t, db)
	fourthJob := webhookJob(t, db, fourth, ep.ID)
	waitFor(t, "the 410 to discard the delivery", 10*time.Second, func() bool { return readJob(t, db, fourthJob).State == "discarded" })
	e := api.endpoint(ep.ID)
	if e.State != "disabled" || e.DisabledReason == nil || *e.DisabledReason != "the receiver answered 410 Gone" {
		t.Fatalf("after 410: state %s, reason %v; want disabled with the 410 reason", e.State, e.DisabledReason)
	}

	// Disabled: the relay enqueues nothing for it.
	fifth := record(t, db, "t", "fifth")
	relayAll(t, db)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1`, fifth); n != 0 {
		t.Errorf("a disabled endpoint got %d new jobs, want 0", n)
	}

	// Re-enabled, with a clean slate: deliveries resume.
	answer.Store(http.StatusOK)
	if status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/enable", ""); status != http.StatusOK {
		t.Fatalf("enable: %d %s", status, body)
	}
	if s := state(); s != "enabled" {
		t.Fatalf("after enable: state %s", s)
	}
	sixth := record(t, db, "t", "sixth")
	relayAll(t, db)
	sixthJob := webhookJob(t, db, sixth, ep.ID)
	waitFor(t, "delivery after re-enable", 10*time.Second, func() bool { return readJob(t, db, sixthJob).State == "completed" })
	if s := state(); s != "enabled" {
		t.Errorf("at the end: state %s, want enabled", s)
	}
}

// firstAttemptOf is a job's first error and its first recorded attempt's
// error and status.
func firstAttemptOf(t *testing.T, db *sql.DB, job int64) (jobErr, deliveryErr string, status sql.NullInt64) {
	t.Helper()
	if err := db.QueryRow(`
		SELECT j.errors->0->>'error', d.error, d.status_code
		FROM outbox.jobs j JOIN outbox.deliveries d ON d.job_id = j.id
		WHERE j.id = $1
		  AND d.attempt = 1`, job).Scan(&jobErr, &deliveryErr, &status); err != nil {
		t.Fatal(err)
	}
	return jobErr, deliveryErr, status
}

// Deliveries queued for an endpoint that is then disabled or deleted end
// discarded without a request, and say why.
func TestDeliveryToDisabledOrDeletedEndpointEndsWithoutRequest(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	disabled := api.createEndpoint(rc.srv.URL + "/disabled")
	deleted := api.createEndpoint(rc.srv.URL + "/deleted")
	eventID := record(t, db, "t", "s")
	relayAll(t, db)
	disabledJob, deletedJob := webhookJob(t, db, eventID, disabled.ID), webhookJob(t, db, eventID, deleted.ID)

	if status, body := api.do("POST", "/api/endpoints/"+itoa(disabled.ID)+"/disable", `{"reason": "maintenance"}`); status != http.StatusOK {
		t.Fatalf("disable: %d %s", status, body)
	}
	if status, body := api.do("DELETE", "/api/endpoints/"+itoa(deleted.ID), ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", status, body)
	}
	runWebhookWorkers(t, db, 10*time.Second)
	waitFor(t, "both deliveries to end", 10*time.Second, func() bool {
		return readJob(t, db, disabledJob).State == "discarded" && readJob(t, db, deletedJob).State == "discarded"
	})
	if n := len(rc.requests()); n != 0 {
		t.Errorf("receiver got %d requests, want none", n)
	}
	for job, want := range map[int64]string{disabledJob: "is disabled (maintenance); not sent", deletedJob: "deleted; not sent"} {
		jobErr, deliveryErr, status := firstAttemptOf(t, db, job)
		if !strings.Contains(jobErr, want) || !strings.Contains(deliveryErr, want) || status.Valid {
			t.Errorf("job %d: error %q, delivery %q (status %v); want %q and no status", job, jobErr, deliveryErr, status, want)
		}
	}
}

// A delivery that fails every time ends discarded after 18 attempts with
// every attempt's error kept.
func TestWebhookDiscardedAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		http.Error(w, fmt.Sprintf("down %d", n), http.StatusBadGateway)
	})
	ep := api.createEndpoint(rc.srv.URL)
	eventID := record(t, db, "t", "s")
	relayAll(t, db)
	job := webhookJob(t, db, eventID, ep.ID)
	runWebhookWorkers(t, db, 10*time.Second)

	waitFor(t, "the delivery to be discarded", 60*time.Second, func() bool {
		mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE id = $1 AND state = 'retryable'`, job)
		return readJob(t, db, job).State == "discarded"
	})
	if r := readJob(t, db, job); r.Attempt != 18 || r.Errors != 18 {
		t.Errorf("discarded after %d attempts with %d errors, want 18 and 18", r.Attempt, r.Errors)
	}
	var last string
	db.QueryRow(`SELECT errors->17->>'error' FROM outbox.jobs WHERE id = $1`, job).Scan(&last)
	if !strings.Contains(last, "502 Bad Gateway") || !strings.Contains(last, "down 18") {
		t.Errorf("last error %q, want the status and the answer", last)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE job_id = $1 AND status_code = 502`, job); n != 18 {
		t.Errorf("%d attempts recorded, want 18", n)
	}
	if n := len(rc.requests()); n != 18 {
		t.Errorf("receiver got %d requests, want 18", n)
	}
}

// A receiver that never answers costs one timeout, not a worker; the
// attempt is a retryable failure with no status.
func TestWebhookSlowReceiverTimesOut(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	release := make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done(): // the sender gave up
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the receiver's Close
	ep := api.createEndpoint(rc.srv.URL)
	eventID := record(t, db, "t", "s")
	relayAll(t, db)
	job := webhookJob(t, db, eventID, ep.ID)
	const timeout = 300 * time.Millisecond
	runWebhookWorkers(t, db, timeout)

	waitFor(t, "the attempt to time out", 10*time.Second, func() bool { return readJob(t, db, job).State == "retryable" })
	var status sql.NullInt64
	var durationMS int
	var errText string
	if err := db.QueryRow(`SELECT status_code, duration_ms, error FROM outbox.deliveries WHERE job_id = $1`, job).Scan(&status, &durationMS, &errText); err != nil {
		t.Fatal(err)
	}
	if status.Valid || durationMS < int(timeout.Milliseconds()) || durationMS > 5000 || !strings.Contains(errText, "Timeout") {
		t.Errorf("attempt: status %v, %d ms, error %q; want no status, about %s, a timeout", status, durationMS, errText, timeout)
	}
	if h := api.endpoint(ep.ID).Health; h != "degraded" {
		t.Errorf("endpoint health %s after a timeout, want degraded (failed once, its breaker closed)", h)
	}
}

// A receiver that streams an endless answer is cut at the bound: the
// attempt ends long before the timeout, a success completing its job
// (whose duration it keeps), a failure keeping a bounded excerpt.
func TestWebhookEndlessAnswerIsCut(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	endless := func(status int) *receiver {
		return newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			chunk := []byte(strings.Repeat("x", 4096))
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		})
	}
	ok := api.createEndpoint(endless(http.StatusOK).srv.URL)
	failing := api.createEndpoint(endless(http.StatusInternalServerError).srv.URL)
	eventID := record(t, db, "t", "s")
	relayAll(t, db)
	okJob, failedJob := webhookJob(t, db, eventID, ok.ID), webhookJob(t, db, eventID, failing.ID)
	runWebhookWorkers(t, db, 30*time.Second)

	waitFor(t, "one delivery to complete and the other to fail", 10*time.Second, func() bool {
		return readJob(t, db, okJob).State == "completed" && readJob(t, db, failedJob).State == "retryable"
	})
	if ms := queryInt(t, db, `SELECT duration_ms FROM outbox.deliveries WHERE job_id = $1`, okJob); ms > 5000 {
		t.Errorf("the success took %d ms; want well under the timeout", ms)
	}
	var durationMS, excerptLen int
	if err := db.QueryRow(`SELECT duration_ms, octet_length(response_excerpt) FROM outbox.deliveries WHERE job_id = $1`, failedJob).Scan(&durationMS, &excerptLen); err != nil {
		t.Fatal(err)
	}
	if durationMS > 5000 || excerptLen > webhookExcerptLen+len("…") || excerptLen < webhookExcerptLen {
		t.Errorf("the failure took %d ms and kept %d bytes; want well under the timeout and %d", durationMS, excerptLen, webhookExcerptLen)
	}
}

// During a rotation window both secrets sign; after it, only the new one.
func TestRotateSecretSignsWithBothUntilWindowEnds(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL)
	oldSecret := secretOf(t, ep)
	status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/rotate-secret", "")
	var rotated endpointWithSecret
	if err := json.Unmarshal(body, &rotated); status != http.StatusOK || err != nil {
		t.Fatalf("rotate: %d %s", status, body)
	}
	newSecret := secretOf(t, rotated)
	runWebhookWorkers(t, db, 10*time.Second)

	deliverOne := func() received {
		t.Helper()
		n := len(rc.requests())
		record(t, db, "t", "s")
		relayAll(t, db)
		waitFor(t, "a delivery", 10*time.Second, func() bool { return len(rc.requests()) == n+1 })
		return rc.requests()[n]
	}

	during := deliverOne()
	if n := len(strings.Fields(during.Header.Get("webhook-signature"))); n != 2 {
		t.Errorf("during the window: %d signatures, want 2", n)
	}
	for name, secret := range map[string][]byte{"old": oldSecret, "new": newSecret} {
		if err := verifyWebhook([][]byte{secret}, during.Header, during.Body, time.Now()); err != nil {
			t.Errorf("during the window, the %s secret alone: %v", name, err)
		}
	}

	// The window ends (moved, not waited for).
	mustExec(t, db, `UPDATE outbox.endpoints SET previous_secret_expires_at = now() - interval '1 second' WHERE id = $1`, ep.ID)
	after := deliverOne()
	if err := verifyWebhook([][]byte{oldSecret}, after.Header, after.Body, time.Now()); !errors.Is(err, errWebhookNoSignature) {
		t.Errorf("after the window, the old secret alone: %v, want errWebhookNoSignature", err)
	}
	if err := verifyWebhook([][]byte{newSecret}, after.Header, after.Body, time.Now()); err != nil {
		t.Errorf("after the window, the new secret: %v", err)
	}
	if e := api.endpoint(ep.ID); e.PreviousSecretExpiresAt != nil {
		t.Errorf("after the window the API still shows it open until %v", e.PreviousSecretExpiresAt)
	}
}

// A delivery opens its endpoint's sealed secrets and signs with both of a
// rotation. A worker without the key sends nothing: the attempt fails,
// says why, and is retried, and the endpoint is not marked failing.
func TestSealedEndpointSecretsSignAndFailVisiblyWithoutTheKey(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	box := testBox(t, testSecretsKey(1), "")
	api := newSealingTestAPI(t, db, box)
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL)
	status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/rotate-secret", "")
	var rotated endpointWithSecret
	if err := json.Unmarshal(body, &rotated); status != http.StatusOK || err != nil {
		t.Fatalf("rotate: %d %s", status, body)
	}
	work := func(box *secretBox) {
		t.Helper()
		client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
		sender := newWebhookSender(db, box, client, nil, nil, testLogger(t))
		wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: sender.deliver}, testLogger(t))
		if _, err := wp.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}

	signed := record(t, db, "t", "signed")
	relayAll(t, db)
	work(box)
	reqs := rc.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	for _, secret := range [][]byte{secretOf(t, ep), secretOf(t, rotated)} {
		if err := verifyWebhook([][]byte{secret}, reqs[0].Header, reqs[0].Body, time.Now()); err != nil {
			t.Errorf("a secret of the rotation does not verify: %v", err)
		}
	}
	if s := readJob(t, db, webhookJob(t, db, signed, ep.ID)).State; s != "completed" {
		t.Errorf("delivery with the key: %s, want completed", s)
	}

	unsent := record(t, db, "t", "unsent")
	relayAll(t, db)
	work(nil)
	job := webhookJob(t, db, unsent, ep.ID)
	want := fmt.Sprintf("secret of endpoint %d is sealed under key fca31f12, and -secrets-key (OUTBOXD_SECRETS_KEY) is not set; not sent", ep.ID)
	jobErr, deliveryErr, statusCode := firstAttemptOf(t, db, job)
	if jobErr != want || deliveryErr != want || statusCode.Valid {
		t.Errorf("without the key: job error %q, delivery %q (status %v); want %q and no status", jobErr, deliveryErr, statusCode, want)
	}
	if s := readJob(t, db, job).State; s != "retryable" {
		t.Errorf("without the key: %s, want retryable", s)
	}
	if n := len(rc.requests()); n != 1 {
		t.Errorf("%d requests, want only the first", n)
	}
	if s := api.endpoint(ep.ID).State; s != "enabled" {
		t.Errorf("endpoint %s, want enabled: its receiver did not fail", s)
	}
}
