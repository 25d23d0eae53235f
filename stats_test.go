// stats_test.go: the delivery statistics against a seeded database, as the
// completers write them and the API and the panel read them.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
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

// The bucket bounds are part of what stored rows mean (schema.sql), and
// the ones /metrics uses for its in-process histogram.
func TestStatsLatencyBoundsArePinned(t *testing.T) {
	t.Parallel()
	want := []time.Duration{
		1 * time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
		25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
		500 * time.Millisecond, 1 * time.Second, 2500 * time.Millisecond, 5 * time.Second,
		10 * time.Second, 30 * time.Second, 60 * time.Second, 300 * time.Second,
		1800 * time.Second, 3600 * time.Second,
	}
	if diff := cmp.Diff(want, statsLatencyBounds[:]); diff != "" {
		t.Errorf("bounds (-want +got):\n%s", diff)
	}
	if statsBuckets != 19 {
		t.Errorf("statsBuckets = %d, want 19 (schema.sql's CHECK)", statsBuckets)
	}
	for i, s := range latencyBuckets {
		if got := time.Duration(s * float64(time.Second)); got != statsLatencyBounds[i] {
			t.Errorf("bound %d: /metrics %v, statistics %v", i, got, statsLatencyBounds[i])
		}
	}
	if got := defaultConfig().Retention.DeliveryStats; got != 7*24*time.Hour {
		t.Errorf("default -delivery-stats-retention = %v, want 168h", got)
	}
}

func TestLatencyBucketAndQuantile(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0}, {time.Millisecond, 0}, {time.Millisecond + 1, 1}, {2500 * time.Microsecond, 1},
		{3 * time.Millisecond, 2}, {40 * time.Second, 14}, {time.Hour, 17}, {time.Hour + 1, 18}, {1000 * time.Hour, 18},
	} {
		if got := latencyBucket(c.d); got != c.want {
			t.Errorf("latencyBucket(%v) = %d, want %d", c.d, got, c.want)
		}
	}
	var c latencyCounts
	if _, ok := c.quantile(0.5); ok {
		t.Error("quantile of no latencies: ok, want none")
	}
	c[0], c[2], c[18] = 1, 97, 2 // 100 latencies: 1 ≤ 1 ms, 97 ≤ 5 ms, 2 above an hour
	for _, q := range []struct {
		q    float64
		want time.Duration
	}{
		{0.01, time.Millisecond}, {0.02, 5 * time.Millisecond}, {0.5, 5 * time.Millisecond},
		{0.98, 5 * time.Millisecond}, {0.99, time.Hour}, {1, time.Hour},
	} {
		if got, _ := c.quantile(q.q); got != q.want {
			t.Errorf("quantile(%v) = %v, want %v", q.q, got, q.want)
		}
	}
}

func TestClassifyAttempt(t *testing.T) {
	t.Parallel()
	timeout := &net.OpError{Op: "dial", Err: timeoutError{}}
	for _, c := range []struct {
		status int
		err    error
		want   attemptClass
	}{
		{200, nil, classSuccess},
		{204, nil, classSuccess},
		{0, nil, classSuccess}, // a mail sent
		{302, nil, classOther},
		{101, nil, classOther},
		{400, nil, class4xx},
		{410, nil, class4xx},
		{429, nil, class4xx},
		{500, nil, class5xx},
		{503, nil, class5xx},
		{0, context.DeadlineExceeded, classTimeout},
		{0, fmt.Errorf("post: %w", timeout), classTimeout},
		{0, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, classConnection},
		{0, errors.New("tls: handshake failure"), classConnection},
	} {
		if got := classifyAttempt(c.status, c.err); got != c.want {
			t.Errorf("classifyAttempt(%d, %v) = %d, want %d", c.status, c.err, got, c.want)
		}
	}
}

type timeoutError struct{}

func (timeoutError) Error() string { return "i/o timeout" }
func (timeoutError) Timeout() bool { return true }

// statsAnswer is the part of a stats answer the tests compare.
type statsAnswer struct {
	Produced        int64          `json:"produced"`
	Attempts        int64          `json:"attempts"`
	Successes       int64          `json:"successes"`
	Failures        int64          `json:"failures"`
	FailuresByClass failureClasses `json:"failures_by_class"`
	SuccessRate     *float64       `json:"success_rate"`
	LatencyP50MS    *float64       `json:"latency_p50_ms"`
	LatencyP99MS    *float64       `json:"latency_p99_ms"`
	Latency         []latencyBucketView
	Series          []statsMinute `json:"series"`
}

func (a *statsAnswer) UnmarshalJSON(b []byte) error {
	type plain statsAnswer
	var v struct {
		plain
		Latency []latencyBucketView `json:"latency_buckets"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*a = statsAnswer(v.plain)
	a.Latency = v.Latency
	return nil
}

// getStats reads path (a stats route) and fails the test on anything but
// a 200.
func getStats(t *testing.T, srv *httptest.Server, path string) statsAnswer {
	t.Helper()
	var st statsAnswer
	if code := apiCall(t, srv, "GET", path, "", &st); code != http.StatusOK {
		t.Fatalf("GET %s: %d", path, code)
	}
	return st
}

// activeMinutes is the series' minutes with an attempt, as (delivered,
// failed, p50, p99) strings.
func activeMinutes(series []statsMinute) []string {
	var out []string
	for _, m := range series {
		if m.Delivered+m.Failed == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s delivered %d failed %d p50 %s p99 %s", m.Minute.UTC().Format("15:04"),
			m.Delivered, m.Failed, msText(m.LatencyP50MS), msText(m.LatencyP99MS)))
	}
	return out
}

func msText(ms *float64) string {
	if ms == nil {
		return "none"
	}
	return fmt.Sprintf("%gms", *ms)
}

// bucketCounts is the non-zero buckets of an answer, as "le_ms:count".
func bucketCounts(bs []latencyBucketView) []string {
	var out []string
	for _, b := range bs {
		if b.Count == 0 {
			continue
		}
		le := "+Inf"
		if b.LeMS != nil {
			le = fmt.Sprintf("%g", *b.LeMS)
		}
		out = append(out, fmt.Sprintf("%s:%d", le, b.Count))
	}
	return out
}

// Real deliveries, through the workers, the webhook sender and the
// completer, to a receiver that answers each event as its subject says
// and to an endpoint that refuses connections: the statistics count every
// class and bucket the latencies from each event's commit, in the table
// and in the API, and a new server on the same database (a restart, or
// another replica) reads the same numbers.
func TestDeliveryStatsCountRealDeliveries(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	srv := newTestAdmin(t, db)
	var requests atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		var body struct{ Subject string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		switch {
		case strings.HasPrefix(body.Subject, "ok"):
			w.WriteHeader(http.StatusOK)
		case body.Subject == "e500":
			w.WriteHeader(http.StatusInternalServerError)
		case body.Subject == "e404":
			w.WriteHeader(http.StatusNotFound)
		case body.Subject == "moved":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		case body.Subject == "slow":
			select { // past the sender's timeout
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}
	}))
	t.Cleanup(receiver.Close)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + closed.Addr().String() + "/hook"
	closed.Close() // nothing listens there now: connections are refused

	a := createTestEndpoint(t, srv, receiver.URL+"/hook", "a.*")
	b := createTestEndpoint(t, srv, refusedURL, "b.*")
	// Each success's event was committed this long before its delivery:
	// in the middle of its bucket, far from either bound, so the time the
	// test itself takes cannot move it. Set as the commit time the relay
	// keeps (outbox.commit_time keeps one already set).
	ago := map[string]string{"ok-1.2s": "1.2 seconds", "ok-7s": "7 seconds", "ok-40s": "40 seconds"}
	for _, subject := range []string{"ok-1.2s", "ok-7s", "ok-40s", "e500", "e404", "moved", "slow"} {
		id := record(t, db, "a.thing", subject)
		if d, ok := ago[subject]; ok {
			mustExec(t, db, `UPDATE outbox.events SET committed_at = now() - $2::interval WHERE id = $1`, id, d)
		}
	}
	record(t, db, "b.thing", "r-1")
	record(t, db, "b.thing", "r-2")
	relayAll(t, db)

	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 500 * time.Millisecond})
	sender := newWebhookSender(db, nil, client, nil, nil, testLogger(t))
	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: sender.deliver}, testLogger(t))
	if n, err := wp.workOnce(context.Background(), 20); err != nil || n != 9 {
		t.Fatalf("workOnce: %d jobs, %v; want 9", n, err)
	}
	if got := requests.Load(); got != 7 {
		t.Fatalf("receiver got %d requests, want 7", got)
	}

	// The table: per endpoint (a minute may have turned during the run,
	// so the rows of each endpoint are summed).
	type tableSums struct {
		Rows, Attempts, Successes, Timeout, S4xx, S5xx, Connection, Other int64
		Buckets                                                           string
	}
	sums := func(id int64) tableSums {
		var s tableSums
		err := db.QueryRow(`
			SELECT count(*), sum(attempts), sum(successes), sum(failed_timeout), sum(failed_4xx),
			       sum(failed_5xx), sum(failed_connection), sum(failed_other),
			       (SELECT array_agg(n ORDER BY i)::text FROM (
			          SELECT b.i, sum(b.n)::bigint AS n
			          FROM outbox.delivery_stats AS d, unnest(d.latency_buckets) WITH ORDINALITY AS b(n, i)
			          WHERE d.endpoint_id = $1
			          GROUP BY b.i) AS x)
			FROM outbox.delivery_stats
			WHERE endpoint_id = $1`, id).Scan(&s.Rows, &s.Attempts, &s.Successes, &s.Timeout, &s.S4xx,
			&s.S5xx, &s.Connection, &s.Other, &s.Buckets)
		if err != nil {
			t.Fatal(err)
		}
		if s.Rows < 1 || s.Rows > 2 {
			t.Errorf("endpoint %d: %d rows, want 1 (or 2 across a minute's turn)", id, s.Rows)
		}
		s.Rows = 0
		return s
	}
	wantA := tableSums{Attempts: 7, Successes: 3, Timeout: 1, S4xx: 1, S5xx: 1, Other: 1,
		// 2 s ≤ 2.5 s (the 11th), 7 s ≤ 10 s (13th), 40 s ≤ 60 s (15th).
		Buckets: "{0,0,0,0,0,0,0,0,0,0,1,0,1,0,1,0,0,0,0}"}
	wantB := tableSums{Attempts: 2, Connection: 2, Buckets: "{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}"}
	if diff := cmp.Diff(wantA, sums(a)); diff != "" {
		t.Errorf("endpoint a's rows (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantB, sums(b)); diff != "" {
		t.Errorf("endpoint b's rows (-want +got):\n%s", diff)
	}

	// The API, for each endpoint and for all of them.
	want := map[string]statsAnswer{
		"/api/endpoints/" + itoa(a) + "/stats?window=1h": {Produced: 7, Attempts: 7, Successes: 3, Failures: 4,
			FailuresByClass: failureClasses{Timeout: 1, Status4xx: 1, Status5xx: 1, Other: 1},
			SuccessRate:     ptr(3.0 / 7), LatencyP50MS: ptr(10000.0), LatencyP99MS: ptr(60000.0)},
		"/api/endpoints/" + itoa(b) + "/stats?window=24h": {Produced: 2, Attempts: 2, Failures: 2,
			FailuresByClass: failureClasses{Connection: 2}, SuccessRate: ptr(0.0)},
		"/api/stats": {Produced: 9, Attempts: 9, Successes: 3, Failures: 6,
			FailuresByClass: failureClasses{Timeout: 1, Status4xx: 1, Status5xx: 1, Connection: 2, Other: 1},
			SuccessRate:     ptr(3.0 / 9), LatencyP50MS: ptr(10000.0), LatencyP99MS: ptr(60000.0)},
	}
	wantBuckets := map[string][]string{
		"/api/endpoints/" + itoa(a) + "/stats?window=1h":  {"2500:1", "10000:1", "60000:1"},
		"/api/endpoints/" + itoa(b) + "/stats?window=24h": nil,
		"/api/stats": {"2500:1", "10000:1", "60000:1"},
	}
	wantSeries := map[string]struct{ points, produced, delivered, failed int64 }{
		"/api/endpoints/" + itoa(a) + "/stats?window=1h":  {60, 7, 3, 4},
		"/api/endpoints/" + itoa(b) + "/stats?window=24h": {1440, 2, 0, 2},
		"/api/stats": {60, 9, 3, 6},
	}
	check := func(srv *httptest.Server) map[string][]string {
		active := map[string][]string{}
		for path, w := range want {
			got := getStats(t, srv, path)
			if diff := cmp.Diff(wantBuckets[path], bucketCounts(got.Latency)); diff != "" {
				t.Errorf("%s: buckets (-want +got):\n%s", path, diff)
			}
			if len(got.Latency) != 19 {
				t.Errorf("%s: %d buckets, want 19", path, len(got.Latency))
			}
			var produced, delivered, failed int64
			for _, m := range got.Series {
				produced += m.Produced
				delivered += m.Delivered
				failed += m.Failed
			}
			ws := wantSeries[path]
			if int64(len(got.Series)) != ws.points || produced != ws.produced || delivered != ws.delivered || failed != ws.failed {
				t.Errorf("%s: series of %d points, %d produced, %d delivered, %d failed; want %d, %d, %d, %d",
					path, len(got.Series), produced, delivered, failed, ws.points, ws.produced, ws.delivered, ws.failed)
			}
			active[path] = activeMinutes(got.Series)
			got.Latency, got.Series = nil, nil
			if diff := cmp.Diff(w, got); diff != "" {
				t.Errorf("%s (-want +got):\n%s", path, diff)
			}
		}
		return active
	}
	before := check(srv)

	// A restart: a new pool and a new server on the same database.
	db2, err := newDBPool(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db2.Close() })
	srv.Close()
	after := check(newTestAdmin(t, db2))
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("per-minute series after a restart (-before +after):\n%s", diff)
	}
}

// statsJob is a running webhook job of endpoint for the seeded tests:
// its event recorded, claimed at attempt.
func statsJob(t *testing.T, db *sql.DB, endpoint int64, attempt int) int64 {
	t.Helper()
	var id int64
	err := db.QueryRow(`
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at)
		VALUES ('webhook', outbox.record('t', 's', '{}'), $1, 18, 'running', $2, now())
		RETURNING id`, endpoint, attempt).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// attemptResult is what a worker hands the completer after one attempt:
// the job's outcome and the attempt's record, with its class, its
// latency and the time it ended.
func attemptResult(job int64, attempt int, endpoint int64, class attemptClass, latency time.Duration, at time.Time) jobResult {
	out := jobOutcome{State: jobCompleted}
	change := endpointSucceeded
	if class != classSuccess {
		out, change = jobOutcome{State: jobRetryable, Delay: time.Hour, Error: "failed"}, endpointFailed
	}
	if class == classNone {
		change = endpointUnchanged
	}
	return jobResult{ID: job, Attempt: attempt, jobOutcome: out, record: &attemptRecord{
		deliveryAttempt: deliveryAttempt{Class: class, CommitTo2xx: latency},
		EndpointID:      endpoint, Change: change, At: at, set: true,
	}}
}

// statsRowOf is one row of outbox.delivery_stats as text, for diffs.
func statsRows(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`
		SELECT endpoint_id, to_char(minute AT TIME ZONE 'UTC', 'HH24:MI'), attempts, successes, failed_timeout,
		       failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets::text
		FROM outbox.delivery_stats
		ORDER BY endpoint_id, minute`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var ep, att, ok, to, s4, s5, conn, other int64
		var minute, buckets string
		if err := rows.Scan(&ep, &minute, &att, &ok, &to, &s4, &s5, &conn, &other, &buckets); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("ep%d %s attempts %d ok %d timeout %d 4xx %d 5xx %d conn %d other %d %s",
			ep, minute, att, ok, to, s4, s5, conn, other, buckets))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A known set of attempts across two minutes and two endpoints, written
// by the completer: one row per endpoint and minute with exact counts and
// buckets, the minute's p50 and p99 in the series; an attempt whose
// outcome the fence refused, and one that made no request, count nothing.
func TestDeliveryStatsAcrossTwoMinutesAndTwoEndpoints(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	a := createTestEndpoint(t, srv, "http://127.0.0.1:9/a", "a")
	b := createTestEndpoint(t, srv, "http://127.0.0.1:9/b", "b")
	var now time.Time
	if err := db.QueryRow(`SELECT date_trunc('minute', now())`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	m1, m2 := now.Add(-3*time.Minute), now.Add(-2*time.Minute) // well inside the hour
	ms := time.Millisecond
	var batch []jobResult
	add := func(ep int64, class attemptClass, latency time.Duration, at time.Time) {
		batch = append(batch, attemptResult(statsJob(t, db, ep, 1), 1, ep, class, latency, at))
	}
	add(a, classSuccess, 3*ms, m1.Add(5*time.Second))
	add(a, classSuccess, 4*ms, m1.Add(10*time.Second))
	add(a, classSuccess, 40*ms, m1.Add(59*time.Second))
	add(a, classTimeout, 0, m1.Add(20*time.Second))
	add(a, class5xx, 0, m1.Add(30*time.Second))
	add(b, classSuccess, 2*time.Second, m1.Add(0))
	add(b, class5xx, 0, m1.Add(1*time.Second))
	add(b, class5xx, 0, m1.Add(2*time.Second))
	add(a, classSuccess, 800*time.Microsecond, m2.Add(1*time.Second))
	add(a, classSuccess, 7*ms, m2)
	add(a, class4xx, 0, m2.Add(3*time.Second))
	add(a, classConnection, 0, m2.Add(4*time.Second))
	add(b, classOther, 0, m2.Add(50*time.Second))
	add(b, classNone, 0, m2.Add(50*time.Second)) // no request made: not counted
	// A worker that lost its job to the rescuer reports attempt 1 of a job
	// now at attempt 2: fenced out, not counted.
	batch = append(batch, attemptResult(statsJob(t, db, a, 2), 1, a, classSuccess, ms, m2))

	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), nil, testLogger(t))
	// In two batches, the second written twice, as after a commit whose
	// answer was lost: the fence makes the second write count nothing.
	if err := wp.recordOutcomes(context.Background(), batch[:7]); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := wp.recordOutcomes(context.Background(), batch[7:]); err != nil {
			t.Fatal(err)
		}
	}

	hm := func(m time.Time) string { return m.UTC().Format("15:04") }
	wantRows := []string{
		fmt.Sprintf("ep%d %s attempts 5 ok 3 timeout 1 4xx 0 5xx 1 conn 0 other 0 {0,0,2,0,0,1,0,0,0,0,0,0,0,0,0,0,0,0,0}", a, hm(m1)),
		fmt.Sprintf("ep%d %s attempts 4 ok 2 timeout 0 4xx 1 5xx 0 conn 1 other 0 {1,0,0,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}", a, hm(m2)),
		fmt.Sprintf("ep%d %s attempts 3 ok 1 timeout 0 4xx 0 5xx 2 conn 0 other 0 {0,0,0,0,0,0,0,0,0,0,1,0,0,0,0,0,0,0,0}", b, hm(m1)),
		fmt.Sprintf("ep%d %s attempts 1 ok 0 timeout 0 4xx 0 5xx 0 conn 0 other 1 {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}", b, hm(m2)),
	}
	if diff := cmp.Diff(wantRows, statsRows(t, db)); diff != "" {
		t.Errorf("outbox.delivery_stats (-want +got):\n%s", diff)
	}

	gotA := getStats(t, srv, "/api/endpoints/"+itoa(a)+"/stats?window=1h")
	// a's five latencies: 0.8 ms (≤ 1), 3 and 4 ms (≤ 5), 7 ms (≤ 10),
	// 40 ms (≤ 50): the 3rd is ≤ 5 ms, the 5th ≤ 50 ms.
	if diff := cmp.Diff([]string{
		hm(m1) + " delivered 3 failed 2 p50 5ms p99 50ms",
		hm(m2) + " delivered 2 failed 2 p50 1ms p99 10ms",
	}, activeMinutes(gotA.Series)); diff != "" {
		t.Errorf("a's series (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"1:1", "5:2", "10:1", "50:1"}, bucketCounts(gotA.Latency)); diff != "" {
		t.Errorf("a's buckets (-want +got):\n%s", diff)
	}
	gotA.Series, gotA.Latency = nil, nil
	if diff := cmp.Diff(statsAnswer{Attempts: 9, Successes: 5, Failures: 4,
		FailuresByClass: failureClasses{Timeout: 1, Status4xx: 1, Status5xx: 1, Connection: 1},
		SuccessRate:     ptr(5.0 / 9), LatencyP50MS: ptr(5.0), LatencyP99MS: ptr(50.0)}, gotA); diff != "" {
		t.Errorf("a's stats (-want +got):\n%s", diff)
	}
	all := getStats(t, srv, "/api/stats?window=24h")
	// Six latencies: 0.8, 3, 4, 7, 40 ms and 2 s: the 3rd is ≤ 5 ms, the
	// 6th ≤ 2.5 s.
	if diff := cmp.Diff([]string{
		hm(m1) + " delivered 4 failed 4 p50 5ms p99 2500ms",
		hm(m2) + " delivered 2 failed 3 p50 1ms p99 10ms",
	}, activeMinutes(all.Series)); diff != "" {
		t.Errorf("all endpoints' series (-want +got):\n%s", diff)
	}
	all.Series, all.Latency = nil, nil
	if diff := cmp.Diff(statsAnswer{Attempts: 13, Successes: 6, Failures: 7,
		FailuresByClass: failureClasses{Timeout: 1, Status4xx: 1, Status5xx: 3, Connection: 1, Other: 1},
		SuccessRate:     ptr(6.0 / 13), LatencyP50MS: ptr(5.0), LatencyP99MS: ptr(2500.0)}, all); diff != "" {
		t.Errorf("all endpoints' stats (-want +got):\n%s", diff)
	}

	// /metrics has the last hour of every endpoint, from the table.
	req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	metrics := parseMetrics(t, resp.Body)
	resp.Body.Close()
	for name, want := range map[string]float64{
		"outboxd_delivery_stats_last_hour_produced":                                     0,
		`outboxd_delivery_stats_last_hour_attempts{outcome="success"}`:                  6,
		`outboxd_delivery_stats_last_hour_attempts{outcome="timeout"}`:                  1,
		`outboxd_delivery_stats_last_hour_attempts{outcome="4xx"}`:                      1,
		`outboxd_delivery_stats_last_hour_attempts{outcome="5xx"}`:                      3,
		`outboxd_delivery_stats_last_hour_attempts{outcome="connection"}`:               1,
		`outboxd_delivery_stats_last_hour_attempts{outcome="other"}`:                    1,
		`outboxd_delivery_stats_last_hour_commit_to_first_2xx_seconds{quantile="0.5"}`:  0.005,
		`outboxd_delivery_stats_last_hour_commit_to_first_2xx_seconds{quantile="0.99"}`: 2.5,
	} {
		if got, ok := metrics[name]; !ok || got != want {
			t.Errorf("/metrics %s = %v (present: %v), want %v", name, got, ok, want)
		}
	}

	// The endpoint's page shows the same numbers for both windows, and
	// charts them with axes, units and a legend, without a script.
	code, page := panelPage(t, srv, "/endpoints/"+itoa(a))
	if code != http.StatusOK {
		t.Fatalf("endpoint page: %d", code)
	}
	for _, window := range []string{"1h", "24h"} {
		row := between(page, `<tr id="stats-`+window+`">`, `</tr>`)
		cells := strings.NewReplacer("\n", "", " ", "").Replace(stripTags(row))
		title := map[string]string{"1h": "Lasthour", "24h": "Last24hours"}[window]
		// produced (none: the jobs were not fanned out by the relay),
		// attempts, delivered, rate, timeout, 4xx, 5xx, connection,
		// other, p50, p99
		if want := title + "|0|9|5|55.6%|1|1|1|1|0|≤5ms|≤50ms|"; cells != want {
			t.Errorf("stats row %s = %q, want %q", window, cells, want)
		}
		chart := between(page, `<figure id="chart-`+window+`">`, `</figure>`)
		for _, want := range []string{`<svg class="dchart"`, "per minute", "time (UTC)", "produced: 0", "delivered (2xx): 5", "failed attempts: 4",
			`<polyline class="delivered"`, `<polyline class="failed"`, `class="xlabel"`, `class="ylabel"`} {
			if !strings.Contains(chart, want) {
				t.Errorf("chart %s lacks %q", window, want)
			}
		}
		// The latency chart: a's two minutes, p50 at 5 and 1 ms, p99 at
		// 50 and 10 ms, each line one segment between them.
		latency := between(page, `<figure id="latency-`+window+`">`, `</figure>`)
		for _, want := range []string{"commit → first 2xx (log)", ">1 ms<", ">1 h<", "p50 (median)", `<path class="p50" d="M`, `<path class="p99" d="M`} {
			if !strings.Contains(latency, want) {
				t.Errorf("latency chart %s lacks %q", window, want)
			}
		}
		for _, class := range []string{"p50", "p99"} {
			d := between(latency, `<path class="`+class+`" d="`, `"`)
			if strings.Count(d, "M") != 1 || strings.Count(d, "L") != 1 {
				t.Errorf("latency chart %s: %s path %q, want one point and one line to the next minute", window, class, d)
			}
		}
	}
	if strings.Contains(page, "<script") {
		t.Error("the endpoint page has a script")
	}

	// The overview shows every endpoint's.
	code, page = panelPage(t, srv, "/")
	if code != http.StatusOK {
		t.Fatalf("overview: %d", code)
	}
	row := strings.NewReplacer("\n", "", " ", "").Replace(stripTags(between(page, `<tr id="stats-1h">`, `</tr>`)))
	if want := "Lasthour|0|13|6|46.2%|1|1|3|1|1|≤5ms|≤2.5s|"; row != want {
		t.Errorf("overview's stats row = %q, want %q", row, want)
	}
	if !strings.Contains(between(page, `<figure id="chart-24h">`, `</figure>`), "delivered (2xx): 6") {
		t.Error("overview's 24-hour chart lacks its 6 deliveries")
	}
}

// between is the text of s from the end of start to the next end, failing
// nothing: "" when start is missing.
func between(s, start, end string) string {
	i := strings.Index(s, start)
	if i < 0 {
		return ""
	}
	s = s[i+len(start):]
	if j := strings.Index(s, end); j >= 0 {
		return s[:j]
	}
	return s
}

// stripTags turns a table row's cells into text separated by |.
func stripTags(row string) string {
	row = strings.ReplaceAll(row, "</td>", "|")
	var b strings.Builder
	in := false
	for _, r := range row {
		switch {
		case r == '<':
			in = true
		case r == '>':
			in = false
		case !in:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Two completers (two replicas' workers) add to the same endpoint-minute
// rows at once: they queue on the rows, in one order whatever their
// batches' order, and the rows hold the sum.
func TestDeliveryStatsTwoCompletersSumIntoOneRow(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	srv := newTestAdmin(t, db)
	a := createTestEndpoint(t, srv, "http://127.0.0.1:9/a", "a")
	b := createTestEndpoint(t, srv, "http://127.0.0.1:9/b", "b")
	var minute time.Time
	if err := db.QueryRow(`SELECT date_trunc('minute', now()) - interval '1 minute'`).Scan(&minute); err != nil {
		t.Fatal(err)
	}
	at := minute.Add(30 * time.Second)
	// Both rows exist, and a transaction holds the first: both completers
	// must wait on it, so their writes overlap.
	seed := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), nil, testLogger(t))
	if err := seed.recordOutcomes(context.Background(), []jobResult{
		attemptResult(statsJob(t, db, a, 1), 1, a, classSuccess, time.Millisecond, at),
		attemptResult(statsJob(t, db, b, 1), 1, b, classSuccess, time.Millisecond, at),
	}); err != nil {
		t.Fatal(err)
	}
	hold, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.Exec(`SELECT 1 FROM outbox.delivery_stats WHERE endpoint_id = $1 FOR UPDATE`, a); err != nil {
		t.Fatal(err)
	}

	// Replica one lists b first, replica two a first; each on a pool of
	// its own, as two processes would be.
	var batches [2][]jobResult
	for i := range 10 {
		batches[0] = append(batches[0], attemptResult(statsJob(t, db, b, 1), 1, b, class5xx, 0, at))
		batches[1] = append(batches[1], attemptResult(statsJob(t, db, a, 1), 1, a, classSuccess, time.Duration(i+1)*time.Millisecond, at))
		batches[0] = append(batches[0], attemptResult(statsJob(t, db, a, 1), 1, a, classTimeout, 0, at))
		batches[1] = append(batches[1], attemptResult(statsJob(t, db, b, 1), 1, b, classSuccess, 20*time.Millisecond, at))
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		pool, err := newDBPool(dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pool.Close() })
		wp := newWorkerPool(pool, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), nil, testLogger(t))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = wp.recordOutcomes(context.Background(), batches[i])
		}()
	}
	waitFor(t, "both completers to wait on the held row", 10*time.Second, func() bool {
		return queryInt(t, db, `
			SELECT count(*)
			FROM pg_stat_activity
			WHERE datname = current_database()
			  AND wait_event_type = 'Lock'
			  AND query LIKE '%outbox.record_outcomes(%'`) == 2
	})
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("completer %d: %v", i+1, err)
		}
	}
	hm := minute.UTC().Format("15:04")
	if diff := cmp.Diff([]string{
		// 1 + 10 successes (1 ms twice, then 2 to 10 ms), 10 timeouts.
		fmt.Sprintf("ep%d %s attempts 21 ok 11 timeout 10 4xx 0 5xx 0 conn 0 other 0 {2,1,3,5,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}", a, hm),
		// 1 + 10 successes (1 ms, 20 ms ×10), 10 5xx.
		fmt.Sprintf("ep%d %s attempts 21 ok 11 timeout 0 4xx 0 5xx 10 conn 0 other 0 {1,0,0,0,10,0,0,0,0,0,0,0,0,0,0,0,0,0,0}", b, hm),
	}, statsRows(t, db)); diff != "" {
		t.Errorf("outbox.delivery_stats (-want +got):\n%s", diff)
	}
}

// The retention sweep deletes the rows whose minute is older than
// -delivery-stats-retention, of both tables, in batches, and only those.
func TestDeliveryStatsRetentionDeletesOnlyOldRows(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `
		INSERT INTO outbox.delivery_stats (endpoint_id, minute, attempts, successes, failed_timeout, failed_4xx,
		                                   failed_5xx, failed_connection, failed_other, latency_buckets)
		SELECT ep, date_trunc('minute', now() - age), 1, 1, 0, 0, 0, 0, 0, array_fill(0::bigint, ARRAY[19])
		FROM unnest(ARRAY[1, 1, 2, 1, 2, 1]::bigint[],
		            ARRAY['30 days', '8 days', '7 days 2 minutes', '6 days 23 hours 58 minutes', '1 hour', '0']::interval[])
		     AS s(ep, age)`)
	mustExec(t, db, `
		INSERT INTO outbox.fanout_stats (endpoint_id, minute, deliveries)
		SELECT endpoint_id, minute, 1 FROM outbox.delivery_stats`)
	cfg := defaultConfig().Retention
	if cfg.DeliveryStats != 7*24*time.Hour {
		t.Fatalf("default -delivery-stats-retention = %v, want 168h", cfg.DeliveryStats)
	}
	cfg.BatchSize = 2 // three rows to go: two batches
	sw := newSweeper(db, cfg, "test", testLogger(t))
	res, err := sw.sweepOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"delivery_stats", "fanout_stats"} {
		if got := res.Deleted[table]; got != 3 {
			t.Errorf("%s: deleted %d rows, want 3", table, got)
		}
		if got := sw.PrunedByTable()["outbox."+table]; got != 3 {
			t.Errorf("%s: pruned counter %d, want 3", table, got)
		}
		var left []string
		rows, err := db.Query(`
			SELECT endpoint_id || ' ' || justify_interval(date_trunc('minute', now()) - minute)::text
			FROM outbox.` + table + `
			ORDER BY minute`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			left = append(left, s)
		}
		rows.Close()
		if diff := cmp.Diff([]string{"1 6 days 23:58:00", "2 01:00:00", "1 00:00:00"}, left); diff != "" {
			t.Errorf("%s: rows left, by age (-want +got):\n%s", table, diff)
		}
	}
}

// A window other than 1h or 24h is a 400 that says which are taken; an
// unknown endpoint is a 404.
func TestStatsRefusesBadWindow(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	a := createTestEndpoint(t, srv, "http://127.0.0.1:9/a", "a")
	for _, path := range []string{"/api/stats?window=7d", "/api/endpoints/" + itoa(a) + "/stats?window=1", "/api/stats?window=1H"} {
		var body struct{ Error string }
		if code := apiCall(t, srv, "GET", path, "", &body); code != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", path, code)
		}
		if !strings.Contains(body.Error, "want 1h or 24h") {
			t.Errorf("GET %s: error %q does not say which windows are taken", path, body.Error)
		}
	}
	if code := apiCall(t, srv, "GET", "/api/endpoints/999999/stats", "", nil); code != http.StatusNotFound {
		t.Errorf("stats of no endpoint: %d, want 404", code)
	}
	if st := getStats(t, srv, "/api/endpoints/"+itoa(a)+"/stats"); len(st.Series) != 60 || st.SuccessRate != nil || st.LatencyP50MS != nil {
		t.Errorf("default window of an idle endpoint: %d points, rate %v, p50 %v; want 60, null, null", len(st.Series), st.SuccessRate, st.LatencyP50MS)
	}
}

func TestNiceAxis(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		v     float64
		top   float64
		steps int
	}{
		{0, 5, 5}, {1, 5, 5}, {5, 5, 5}, {6, 10, 5}, {11, 20, 4}, {20, 20, 4}, {21, 50, 5}, {499, 500, 5}, {501, 1000, 5}, {1999, 2000, 4},
	} {
		if top, steps := niceAxis(c.v); top != c.top || steps != c.steps {
			t.Errorf("niceAxis(%v) = %v, %d; want %v, %d", c.v, top, steps, c.top, c.steps)
		}
	}
}

// An endpoint's recent record (GET /api/endpoints/{id}/deliveries) counts
// the hour's attempts from its statistics: the 60 newest minutes, not a
// minute older, and no other endpoint's.
func TestEndpointDeliveriesCountTheHourFromStatistics(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "https://a.example/hook")
	other := createTestEndpoint(t, srv, "https://b.example/hook")
	seed := `INSERT INTO outbox.delivery_stats (endpoint_id, minute, attempts, successes, failed_timeout, failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
		VALUES ($1, date_trunc('minute', now()) - $2::int * interval '1 minute', $3::int, $4::int, 0, 0, $3::int - $4::int, 0, 0, array_fill(0, ARRAY[19]))`
	mustExec(t, db, seed, id, 0, 4, 3)    // this minute
	mustExec(t, db, seed, id, 59, 6, 2)   // the hour's oldest minute
	mustExec(t, db, seed, id, 60, 50, 50) // an hour ago: outside
	mustExec(t, db, seed, other, 1, 7, 7) // another endpoint's
	var got struct {
		Attempts    int     `json:"attempts"`
		Successes   int     `json:"successes"`
		SuccessRate float64 `json:"success_rate"`
	}
	if code := apiCall(t, srv, "GET", "/api/endpoints/"+itoa(id)+"/deliveries", "", &got); code != 200 {
		t.Fatalf("GET deliveries = %d", code)
	}
	if got.Attempts != 10 || got.Successes != 5 || got.SuccessRate != 0.5 {
		t.Errorf("the hour's record = %+v, want 10 attempts, 5 successes, rate 0.5", got)
	}
}

// An endpoint's queue now and its recent failures grouped by error, in GET
// /api/endpoints/{id}/stats and on its page, from a seeded database: each
// waiting delivery counted once where it waits, live or replayed, and the
// next attempt the soonest of them; failures grouped by status code, or by
// the error when no answer came, within the window, without a fenced-out
// 2xx or another endpoint's.
func TestEndpointQueueAndRecentFailures(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "https://a.example/hook")
	other := createTestEndpoint(t, srv, "https://b.example/hook")
	var now time.Time
	var replay int64
	if err := db.QueryRow(`SELECT date_trunc('second', now())`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`INSERT INTO outbox.replays (endpoint_id, kind) VALUES ($1, 'replay') RETURNING id`, id).Scan(&replay); err != nil {
		t.Fatal(err)
	}
	job := func(endpoint int64, state string, scheduledAt any, replayID any, laneKey any) (jobID, eventID int64) {
		t.Helper()
		err := db.QueryRow(`
			INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at,
			                         scheduled_at, replay_id, lane_key)
			VALUES ('webhook', outbox.record('t', 's', '{}'), $1, 18, $2::text::outbox.job_state,
			        CASE WHEN $2 = 'available' THEN 0 ELSE 1 END,
			        CASE WHEN $2 = 'available' THEN NULL ELSE now() END,
			        CASE WHEN $2 IN ('completed', 'discarded') THEN now() END,
			        $3::timestamptz, $4, $5)
			RETURNING id, event_id`, endpoint, state, scheduledAt, replayID, laneKey).Scan(&jobID, &eventID)
		if err != nil {
			t.Fatal(err)
		}
		return jobID, eventID
	}
	soonest := now.Add(-2 * time.Minute)
	job(id, "available", soonest, nil, nil)                  // due
	job(id, "retryable", now.Add(-time.Minute), nil, nil)    // due
	job(id, "available", now.Add(-time.Second), replay, nil) // due, replayed
	job(id, "retryable", now.Add(5*time.Minute), nil, nil)   // scheduled
	job(id, "available", now.Add(time.Hour), replay, nil)    // scheduled, replayed
	job(id, "available", "infinity", nil, "order-1")         // held: an ordered lane's next
	job(id, "running", now.Add(-time.Minute), nil, nil)      // in flight
	failedJob, failedEvent := job(id, "discarded", now.Add(-time.Hour), nil, nil)
	refusedJob, refusedEvent := job(id, "completed", now.Add(-time.Hour), nil, nil)
	otherJob, _ := job(other, "available", now.Add(-time.Minute), nil, nil) // another endpoint's

	attempt := func(job, endpoint int64, n int, ago time.Duration, status any, errText string) {
		t.Helper()
		mustExec(t, db, `INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, finished_at, duration_ms, status_code, error)
			SELECT $1, $2, j.event_id, j.kind, $3, $4, 10, $5, $6 FROM outbox.jobs AS j WHERE j.id = $1`, job, n, endpoint, now.Add(-ago), status, errText)
	}
	attempt(failedJob, id, 1, 3*time.Minute, 500, `endpoint answered 500: "a"`)
	attempt(failedJob, id, 2, 2*time.Minute, 500, `endpoint answered 500: "b"`)
	attempt(failedJob, id, 3, time.Minute, 500, `endpoint answered 500: "c"`)
	attempt(refusedJob, id, 1, 90*time.Second, nil, "dial tcp 192.0.2.1:443: connect: connection refused")
	attempt(refusedJob, id, 2, 30*time.Second, nil, "dial tcp 192.0.2.1:443: connect: connection refused")
	attempt(refusedJob, id, 3, 10*time.Second, 200, "")                 // a 2xx whose outcome was fenced out
	attempt(failedJob, id, 4, 25*time.Hour, 503, "outside the window")  // older than the day
	attempt(otherJob, other, 1, time.Minute, 500, "another endpoint's") // not this endpoint's

	var got DeliveryStats
	if code := apiCall(t, srv, "GET", "/api/endpoints/"+itoa(id)+"/stats?window=24h", "", &got); code != http.StatusOK {
		t.Fatalf("GET stats = %d", code)
	}
	wantQueue := &DeliveryQueue{Due: 3, Scheduled: 2, Held: 1, InFlight: 1, NextAttemptAt: &soonest}
	if diff := cmp.Diff(wantQueue, got.Queue, cmp.Comparer(time.Time.Equal)); diff != "" {
		t.Errorf("queue (-want +got):\n%s", diff)
	}
	status500 := 500
	wantFailures := []FailureGroup{
		{StatusCode: &status500, Error: `endpoint answered 500: "c"`, Attempts: 3,
			FirstAt: now.Add(-3 * time.Minute), LastAt: now.Add(-time.Minute), LastEventID: failedEvent},
		{Error: "dial tcp 192.0.2.1:443: connect: connection refused", Attempts: 2,
			FirstAt: now.Add(-90 * time.Second), LastAt: now.Add(-30 * time.Second), LastEventID: refusedEvent},
	}
	if diff := cmp.Diff(wantFailures, got.RecentFailures, cmp.Comparer(time.Time.Equal)); diff != "" {
		t.Errorf("recent failures (-want +got):\n%s", diff)
	}
	var every map[string]json.RawMessage
	apiCall(t, srv, "GET", "/api/stats?window=24h", "", &every)
	if _, ok := every["queue"]; ok {
		t.Errorf("every endpoint's statistics carry one endpoint's queue: %s", every["queue"])
	}

	_, html := panelPage(t, srv, "/endpoints/"+itoa(id))
	for _, want := range []string{
		`<span id="queue-due">3</span>`, `<span id="queue-scheduled">2</span>`, `<span id="queue-held">1</span>`,
		`<dd id="next-attempt">now: 3 due</dd>`,
		`<td class="failure-attempts">3</td>`, `<td class="failure-attempts">2</td>`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the endpoint's page has no %s", want)
		}
	}
	if n := strings.Count(html, `class="failure-group"`); n != 2 {
		t.Errorf("the endpoint's page lists %d failure groups, want 2", n)
	}

	// With nothing due, the next attempt is the soonest scheduled one.
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', finalized_at = now()
		WHERE endpoint_id = $1 AND state IN ('available', 'retryable') AND scheduled_at <= now()`, id)
	_, html = panelPage(t, srv, "/endpoints/"+itoa(id))
	if want := `<dd id="next-attempt"><time datetime="` + now.Add(5*time.Minute).UTC().Format(time.RFC3339) + `"`; !strings.Contains(html, want) {
		t.Errorf("with nothing due, the endpoint's page has no %s", want)
	}
}

// A batch of outcomes written again after its commit's answer was lost
// changes nothing: the success that completed a job is in the history
// once, and the endpoint's recent attempts list it once; a success that
// came after its job was taken from it (rescued, at attempt 2 now) is
// kept there too, with no outcome.
func TestOutcomesWrittenTwiceKeepEachSuccessOnce(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	ep := createTestEndpoint(t, srv, "http://127.0.0.1:9/a")
	done := statsJob(t, db, ep, 1)
	taken := statsJob(t, db, ep, 2)
	now := time.Now()
	batch := []jobResult{
		attemptResult(done, 1, ep, classSuccess, time.Millisecond, now),
		attemptResult(taken, 1, ep, classSuccess, time.Millisecond, now),
	}
	for _, r := range batch {
		r.record.StatusCode = 200
	}
	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), nil, testLogger(t))
	for range 2 {
		if err := wp.recordOutcomes(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	got := queryStrings(t, db, `SELECT job_id || ' ' || coalesce(outcome::text, 'fenced') FROM outbox.deliveries ORDER BY job_id`)
	if want := []string{fmt.Sprintf("%d completed", done), fmt.Sprintf("%d fenced", taken)}; !cmp.Equal(got, want) {
		t.Errorf("outbox.deliveries holds %q, want %q", got, want)
	}
	recent, err := queryAll(context.Background(), db, scanDeliveryView, recentDeliveriesSQL, ep, 10)
	if err != nil {
		t.Fatal(err)
	}
	var listed []int64
	for _, d := range recent {
		listed = append(listed, d.JobID)
	}
	slices.Sort(listed)
	if !cmp.Equal(listed, []int64{done, taken}) {
		t.Errorf("the endpoint's recent attempts are of jobs %v, want [%d %d]: each success once", listed, done, taken)
	}
}
