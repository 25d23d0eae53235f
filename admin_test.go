// admin_test.go: the overview, alerts, metrics, API actions and access
// control, against a real database through the real routes.

package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

const testToken = "test-admin-token-0123456789"

// newTestAdmin serves the real routes over db, with loopback endpoints
// allowed.
func newTestAdmin(t *testing.T, db *sql.DB) *httptest.Server {
	t.Helper()
	return newTestServer(t, db, testPolicy)
}

// newTestServer serves the real routes over db with an endpoint policy.
func newTestServer(t *testing.T, db *sql.DB, policy endpointPolicy) *httptest.Server {
	t.Helper()
	return newTestServerLogging(t, db, policy, testLogger(t))
}

// newSealingTestServer is newTestServer with secrets sealed by box.
func newSealingTestServer(t *testing.T, db *sql.DB, policy endpointPolicy, box *secretBox) *httptest.Server {
	t.Helper()
	return serveAdmin(t, testAdmin(t, db, policy, testLogger(t), box))
}

// newTestServerLogging is newTestServer whose handlers log to logger, for
// a test that reads what they log.
func newTestServerLogging(t *testing.T, db *sql.DB, policy endpointPolicy, logger *slog.Logger) *httptest.Server {
	t.Helper()
	return serveAdmin(t, testAdmin(t, db, policy, logger, nil))
}

// serveAdmin serves a's routes on a test server whose listener's address
// is a's listenURL, as run's is.
func serveAdmin(t *testing.T, a *admin) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(routes(a))
	a.listenURL = url.URL{Scheme: "http", Host: srv.Listener.Addr().String()}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// testRoutes is the real routes over db, for a test to serve; box seals
// secrets (nil: none).
func testRoutes(t *testing.T, db *sql.DB, policy endpointPolicy, logger *slog.Logger, box *secretBox) http.Handler {
	t.Helper()
	return routes(testAdmin(t, db, policy, logger, box))
}

// testAdmin is the admin a process would build, over db.
func testAdmin(t *testing.T, db *sql.DB, policy endpointPolicy, logger *slog.Logger, box *secretBox) *admin {
	t.Helper()
	pnl, err := newPanel(testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	counters := &processCounters{deliveries: newDeliveryMetrics(), auth: newAuthMetrics()}
	auth := newAuthLimiter(counters.auth, logger)
	alerts := defaultConfig().Alerts
	alerts.AuthFailures = auth.recentFailures
	return &admin{
		db:              db,
		token:           testToken,
		alerts:          alerts,
		counters:        counters,
		panel:           pnl,
		endpoints:       policy,
		eventsRetention: 7 * 24 * time.Hour,
		maxAttempts:     18,
		logger:          logger,
		box:             box,
		auth:            auth,
		signinLinks:     time.Hour,
	}
}

// newLoggingTestServer serves the real routes over db, as the minimal
// admin of a process, logging to the buffer it returns.
func newLoggingTestServer(t *testing.T, db *sql.DB) (*httptest.Server, *syncBuffer) {
	t.Helper()
	var logs syncBuffer
	return newTestServerLogging(t, db, testPolicy, slog.New(slog.NewTextHandler(&logs, nil))), &logs
}

// apiCall sends a request with the admin token and decodes a JSON answer.
func apiCall(t *testing.T, srv *httptest.Server, method, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// seedOverviewState writes a known mix of events and jobs: 3 un-fanned (the
// oldest 10 minutes old), 2 poisoned, 1 fanned with jobs in every state.
func seedOverviewState(t *testing.T, db *sql.DB) {
	t.Helper()
	mustExec(t, db, `INSERT INTO outbox.events (topic, created_at) VALUES ('t', now() - interval '10 minutes'), ('t', now()), ('t', now())`)
	mustExec(t, db, `INSERT INTO outbox.events (topic, relay_attempts, relay_error, poisoned_at) VALUES ('t', 5, 'boom', now()), ('t', 5, 'boom', now())`)
	mustExec(t, db, `INSERT INTO outbox.events (topic, fanned_out_at) VALUES ('fanned', now())`)
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'sub:x', (SELECT id FROM outbox.events WHERE topic = 'fanned'), 18, s::outbox.job_state,
		       CASE WHEN s = 'available' THEN 0 ELSE 1 END,
		       CASE WHEN s = 'available' THEN NULL ELSE now() END,
		       CASE WHEN s IN ('completed', 'discarded') THEN now() END
		FROM unnest(ARRAY['available', 'running', 'running', 'retryable', 'completed', 'completed', 'completed', 'discarded']) AS s`)
}

func TestOverviewMatchesDatabaseAndAlertsFireAndClear(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	seedOverviewState(t, db)

	o, err := readOverview(ctx, db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	if o.Backlog != 3 || o.Poisoned != 2 {
		t.Errorf("backlog %d, poisoned %d; want 3 and 2", o.Backlog, o.Poisoned)
	}
	if o.OldestUnfannedAgeSeconds < 590 || o.OldestUnfannedAgeSeconds > 900 {
		t.Errorf("oldest un-fanned age %.0f s, want about 600", o.OldestUnfannedAgeSeconds)
	}
	if diff := cmp.Diff(JobCounts{Available: 1, Running: 2, Retryable: 1, Completed: 3, Discarded: 1, DueNow: 2}, o.Jobs); diff != "" {
		t.Errorf("jobs by state (-want +got):\n%s", diff)
	}
	if o.TableBytes.Events <= 0 || o.TableBytes.Jobs <= 0 {
		t.Errorf("table sizes %+v, want positive sizes for events and jobs", o.TableBytes)
	}
	if diff := cmp.Diff([]string{"events_backlog", "events_poisoned", "jobs_discarded"}, alertNamesOf(o.Alerts)); diff != "" {
		t.Errorf("firing alerts (-want +got):\n%s", diff)
	}

	// End each condition; each alert clears.
	mustExec(t, db, `UPDATE outbox.events SET fanned_out_at = now() WHERE fanned_out_at IS NULL AND poisoned_at IS NULL`)
	mustExec(t, db, `UPDATE outbox.events SET poisoned_at = NULL, fanned_out_at = now() WHERE poisoned_at IS NOT NULL`)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed' WHERE state = 'discarded'`)
	o, err = readOverview(ctx, db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Alerts) != 0 {
		t.Errorf("alerts after every condition ended: %v", alertNamesOf(o.Alerts))
	}
}

func alertNamesOf(alerts []Alert) []string {
	names := []string{}
	for _, a := range alerts {
		names = append(names, a.Name)
	}
	return names
}

func TestEvaluateAlertThresholds(t *testing.T) {
	t.Parallel()
	cfg := AlertConfig{BacklogRows: 1000, BacklogAge: 5 * time.Minute}
	for _, tc := range []struct {
		name string
		o    Overview
		want []string
	}{
		{"quiet", Overview{}, []string{}},
		{"backlog at the threshold", Overview{Backlog: 1000, OldestUnfannedAgeSeconds: 1}, []string{}},
		{"backlog above the threshold", Overview{Backlog: 1001, OldestUnfannedAgeSeconds: 1}, []string{"events_backlog"}},
		{"one old event", Overview{Backlog: 1, OldestUnfannedAgeSeconds: 301}, []string{"events_backlog"}},
		{"old but at the age threshold", Overview{Backlog: 1, OldestUnfannedAgeSeconds: 300}, []string{}},
		{"any poisoned", Overview{Poisoned: 1}, []string{"events_poisoned"}},
		{"any discarded", Overview{Jobs: JobCounts{Discarded: 1}}, []string{"jobs_discarded"}},
		{"any endpoint disabled", Overview{Endpoints: EndpointCounts{Failing: 3, Disabled: 1}}, []string{"endpoint_disabled"}},
		{"failing endpoints alone", Overview{Endpoints: EndpointCounts{Failing: 3}}, []string{}},
		{"any endpoint paused", Overview{Endpoints: EndpointCounts{Paused: 1, PausedQueued: 40}}, []string{"endpoint_paused"}},
		{"NOTIFY queue half full", Overview{NotifyQueueUsage: 0.5}, []string{"notify_queue"}},
		{"NOTIFY queue in normal use", Overview{NotifyQueueUsage: 0.01}, []string{}},
	} {
		got := alertNamesOf(evaluateAlerts(cfg, tc.o, alertStarts{}))
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestAPIOverviewShape(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	seedOverviewState(t, db)
	srv := newTestAdmin(t, db)
	var got map[string]any
	if code := apiCall(t, srv, "GET", "/api/overview", "", &got); code != 200 {
		t.Fatalf("GET /api/overview = %d", code)
	}
	for _, key := range []string{"backlog", "poisoned", "oldest_unfanned_age_seconds", "jobs", "table_bytes", "alerts"} {
		if _, ok := got[key]; !ok {
			t.Errorf("overview has no %q", key)
		}
	}
	jobs, _ := got["jobs"].(map[string]any)
	for _, key := range []string{"available", "running", "retryable", "completed", "discarded"} {
		if _, ok := jobs[key]; !ok {
			t.Errorf("overview jobs has no %q", key)
		}
	}
	alerts, _ := got["alerts"].([]any)
	if len(alerts) != 3 {
		t.Fatalf("alerts = %v, want 3", got["alerts"])
	}
	first, _ := alerts[0].(map[string]any)
	for _, key := range []string{"name", "message", "since"} {
		if _, ok := first[key]; !ok {
			t.Errorf("alert has no %q", key)
		}
	}
}

func TestAPIRecordRequeueAndRetry(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)

	var created struct{ ID int64 }
	if code := apiCall(t, srv, "POST", "/api/events", `{"topic":"order.paid","subject":"42","payload":{"n":1}}`, &created); code != 201 || created.ID == 0 {
		t.Fatalf("POST /api/events = %d, %+v", code, created)
	}
	// Bad input is refused with a message and records nothing.
	for _, body := range []string{`{"topic":"bad topic"}`, `{"topic":"t","extra":1}`, `{nope`, `{"topic":"t","payload":` + strings.Repeat(" ", 2<<20) + `1}`} {
		var e struct{ Error string }
		code := apiCall(t, srv, "POST", "/api/events", body, &e)
		if code/100 != 4 || e.Error == "" {
			t.Errorf("POST /api/events %.40q = %d %q, want 4xx with a message", body, code, e.Error)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 1 {
		t.Errorf("%d events after one good and four bad requests, want 1", n)
	}

	// Requeue: only the poisoned event changes, and only as it says.
	mustExec(t, db, `UPDATE outbox.events SET relay_attempts = 5, relay_error = 'boom', poisoned_at = now() WHERE id = $1`, created.ID)
	var ev Event
	if code := apiCall(t, srv, "POST", "/api/events/"+strconv.FormatInt(created.ID, 10)+"/requeue", "", &ev); code != 200 {
		t.Fatalf("requeue = %d", code)
	}
	if ev.PoisonedAt != nil || ev.RelayAttempts != 0 || ev.RelayError != nil || ev.FannedOutAt != nil {
		t.Errorf("after requeue: %+v, want un-poisoned, un-fanned, attempts reset", ev)
	}
	if code := apiCall(t, srv, "POST", "/api/events/999999/requeue", "", nil); code != 404 {
		t.Errorf("requeue of a missing event = %d, want 404", code)
	}

	// Retry: a discarded job becomes available now with one more attempt.
	mustExec(t, db, `UPDATE outbox.events SET fanned_out_at = now() WHERE id = $1`, created.ID)
	var jobID int64
	db.QueryRow(`INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at, errors)
		VALUES ('sub:x', $1, 18, 'discarded', 18, now(), now(), '[{"attempt":18,"error":"down"}]') RETURNING id`, created.ID).Scan(&jobID)
	var job JobView
	if code := apiCall(t, srv, "POST", "/api/jobs/"+strconv.FormatInt(jobID, 10)+"/retry", "", &job); code != 200 {
		t.Fatalf("retry = %d", code)
	}
	if job.State != "available" || job.Attempt != 18 || job.MaxAttempts != 19 || job.FinalizedAt != nil || !strings.Contains(string(job.Errors), "down") {
		t.Errorf("after retry: %+v, want available, attempt 18 of 19, errors kept", job)
	}
	var listed struct{ Jobs []JobView }
	apiCall(t, srv, "GET", "/api/jobs?state=discarded", "", &listed)
	if len(listed.Jobs) != 0 {
		t.Errorf("discarded jobs after retry: %d, want 0", len(listed.Jobs))
	}
	var stream struct{ Events []Event }
	apiCall(t, srv, "GET", "/api/events?topic=order.*&state=fanned", "", &stream)
	if len(stream.Events) != 1 || stream.Events[0].ID != created.ID {
		t.Errorf("stream filtered by order.* and fanned = %+v, want the one event", stream.Events)
	}
}

func TestAccessControl(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	status := func(method, path, auth string, header map[string]string) int {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, method, path, auth string
		header                   map[string]string
		want                     int
	}{
		{"no token", "GET", "/api/overview", "", nil, 401},
		{"wrong token", "GET", "/api/overview", "Bearer wrong-token-0123456789", nil, 401},
		{"token of another scheme", "GET", "/api/overview", "Basic " + testToken, nil, 401},
		{"right token", "GET", "/api/overview", "Bearer " + testToken, nil, 200},
		{"metrics need the token", "GET", "/metrics", "", nil, 401},
		{"health is open", "GET", "/healthz", "", nil, 200},
		{"readiness is open", "GET", "/readyz", "", nil, 200},
		{"panel sends strangers to sign in", "GET", "/", "", nil, 303},
		{"cross-site POST is refused even with the token", "POST", "/api/events", "Bearer " + testToken,
			map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"cross-origin POST is refused", "POST", "/api/events", "Bearer " + testToken,
			map[string]string{"Origin": "https://evil.example"}, 403},
	} {
		if got := status(tc.method, tc.path, tc.auth, tc.header); got != tc.want {
			t.Errorf("%s: %s %s = %d, want %d", tc.name, tc.method, tc.path, got, tc.want)
		}
	}

	// Sign in through the form: the cookie is HttpOnly, SameSite and does
	// not contain the token.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	resp, err := browser.PostForm(srv.URL+"/login", url.Values{"token": {testToken}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "<h1>Overview</h1>") {
		t.Fatalf("sign-in ended at %d without the overview", resp.StatusCode)
	}
	u, _ := url.Parse(srv.URL)
	cookies := jar.Cookies(u)
	if len(cookies) != 1 || strings.Contains(cookies[0].Value, testToken) {
		t.Fatalf("cookies after sign-in: %v", cookies)
	}
	resp, _ = browser.PostForm(srv.URL+"/login", url.Values{"token": {"wrong"}})
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("sign-in with a wrong token = %d, want 401", resp.StatusCode)
	}
	if got := resp.Header.Get("Content-Security-Policy"); !strings.Contains(got, "default-src 'none'") || strings.Contains(got, "unsafe-inline") {
		t.Errorf("CSP = %q", got)
	}
}

// promLine is the exposition format's sample line grammar.
var promLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)?\})? (-?[0-9.e+-]+|\+Inf|-Inf|NaN)$`)

// parseMetrics checks every line of a /metrics answer against the format
// and returns the samples by "name{labels}".
func parseMetrics(t *testing.T, r io.Reader) map[string]float64 {
	t.Helper()
	samples := map[string]float64{}
	typed := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || !map[string]bool{"counter": true, "gauge": true, "histogram": true}[f[1]] {
				t.Errorf("bad TYPE line %q", line)
			}
			typed[f[0]] = true
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		m := promLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("line does not parse as a sample: %q", line)
			continue
		}
		family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m[1], "_bucket"), "_sum"), "_count")
		if !typed[m[1]] && !typed[family] {
			t.Errorf("sample %q before its TYPE line", line)
		}
		v, err := strconv.ParseFloat(m[4], 64)
		if err != nil && m[4] != "+Inf" {
			t.Errorf("value of %q: %v", line, err)
		}
		samples[m[1]+m[2]] = v
	}
	return samples
}

func TestMetricsParseAndMatchOverview(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	seedOverviewState(t, db)
	srv := newTestAdmin(t, db)
	req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q", ct)
	}
	got := parseMetrics(t, resp.Body)

	o, err := readOverview(context.Background(), db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"outboxd_events_backlog":                         float64(o.Backlog),
		"outboxd_events_poisoned":                        float64(o.Poisoned),
		`outboxd_jobs{state="available"}`:                float64(o.Jobs.Available),
		`outboxd_jobs{state="running"}`:                  float64(o.Jobs.Running),
		`outboxd_jobs{state="retryable"}`:                float64(o.Jobs.Retryable),
		`outboxd_jobs{state="completed"}`:                float64(o.Jobs.Completed),
		`outboxd_jobs{state="discarded"}`:                float64(o.Jobs.Discarded),
		`outboxd_alerts_firing{alert="events_backlog"}`:  1,
		`outboxd_alerts_firing{alert="events_poisoned"}`: 1,
		`outboxd_alerts_firing{alert="jobs_discarded"}`:  1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (as the overview says)", k, got[k], v)
		}
	}
	if age := got["outboxd_events_oldest_unfanned_age_seconds"]; age < 590 {
		t.Errorf("oldest age metric %v, want about 600", age)
	}
}

func TestHistogramExposition(t *testing.T) {
	t.Parallel()
	h := newHistogram([]float64{0.1, 1})
	for _, v := range []float64{0.05, 0.5, 0.5, 3} {
		h.Observe(v)
	}
	var b strings.Builder
	p := &promWriter{w: bufio.NewWriter(&b)}
	p.family("x_seconds", "histogram", "test")
	p.histogram("x_seconds", `endpoint="7"`, h)
	p.w.Flush()
	got := parseMetrics(t, strings.NewReader(b.String()))
	want := map[string]float64{
		`x_seconds_bucket{endpoint="7",le="0.1"}`:  1,
		`x_seconds_bucket{endpoint="7",le="1"}`:    3,
		`x_seconds_bucket{endpoint="7",le="+Inf"}`: 4,
		`x_seconds_sum{endpoint="7"}`:              4.05,
		`x_seconds_count{endpoint="7"}`:            4,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("histogram samples (-want +got):\n%s", diff)
	}
}

// createTestEndpoint makes an endpoint through the API and returns its id.
func createTestEndpoint(t *testing.T, srv *httptest.Server, url string, topics ...string) int64 {
	t.Helper()
	if topics == nil {
		topics = []string{}
	}
	body, _ := json.Marshal(map[string]any{"url": url, "topics": topics})
	var ep struct{ ID int64 }
	if code := apiCall(t, srv, "POST", "/api/endpoints", string(body), &ep); code != 201 {
		t.Fatalf("create endpoint: %d", code)
	}
	return ep.ID
}

func TestReplayEnqueuesFromATimeAndClampsToRetention(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook", "order.*")
	// Three fanned events: 10 days old (past retention), 2 days old, and
	// one of a topic the endpoint does not take. The 2-day-old one was
	// delivered before; the old one was never delivered.
	mustExec(t, db, `INSERT INTO outbox.events (topic, created_at, fanned_out_at) VALUES
		('order.old', now() - interval '10 days', now()),
		('order.recent', now() - interval '2 days', now()),
		('user.other', now() - interval '1 day', now())`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'webhook', id, $1, 18, 'completed', 1, now(), now() FROM outbox.events WHERE topic = 'order.recent'`, id)

	var res ReplayResult
	since := time.Now().Add(-30 * 24 * time.Hour).UTC().Format(time.RFC3339)
	if code := apiCall(t, srv, "POST", fmt.Sprintf("/api/endpoints/%d/replay", id), `{"since":"`+since+`"}`, &res); code != 200 {
		t.Fatalf("replay = %d", code)
	}
	if !res.Clamped || !strings.Contains(res.Message, "retention") || res.Jobs != 1 {
		t.Errorf("replay from 30 days ago: %+v, want clamped to the window, saying so, with 1 job", res)
	}
	got := queryInt(t, db, `SELECT count(*) FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id
		WHERE j.endpoint_id = $1 AND j.state = 'available' AND e.topic = 'order.recent' AND j.attempt = 1`, id)
	if got != 1 {
		t.Errorf("the delivered recent event was not reset to run again")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1`, id); n != 1 {
		t.Errorf("%d jobs for the endpoint after replay, want 1 (the old event is outside the window, the other topic not subscribed)", n)
	}

	// Within the window: not clamped.
	since = time.Now().Add(-3 * 24 * time.Hour).UTC().Format(time.RFC3339)
	apiCall(t, srv, "POST", fmt.Sprintf("/api/endpoints/%d/replay", id), `{"since":"`+since+`"}`, &res)
	if res.Clamped {
		t.Errorf("replay from 3 days ago was clamped: %+v", res)
	}
	var e struct{ Error string }
	if code := apiCall(t, srv, "POST", fmt.Sprintf("/api/endpoints/%d/replay", id), `{}`, &e); code != 400 || e.Error == "" {
		t.Errorf("replay without since = %d %q, want 400 with a message", code, e.Error)
	}
}

func TestEndpointActionsChangeWhatTheySay(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook")
	path := fmt.Sprintf("/api/endpoints/%d", id)
	state := func() (string, string) {
		var ep Endpoint
		apiCall(t, srv, "GET", path, "", &ep)
		reason := ""
		if ep.DisabledReason != nil {
			reason = *ep.DisabledReason
		}
		return ep.State, reason
	}

	apiCall(t, srv, "POST", path+"/disable", `{"reason":"maintenance"}`, nil)
	if s, r := state(); s != "disabled" || r != "maintenance" {
		t.Errorf("after disable: %s %q", s, r)
	}
	var o Overview
	apiCall(t, srv, "GET", "/api/overview", "", &o)
	if !slices.Contains(alertNamesOf(o.Alerts), "endpoint_disabled") || o.Endpoints.Disabled != 1 {
		t.Errorf("overview with a disabled endpoint: alerts %v, endpoints %+v", alertNamesOf(o.Alerts), o.Endpoints)
	}
	apiCall(t, srv, "POST", path+"/enable", "", nil)
	if s, r := state(); s != "enabled" || r != "" {
		t.Errorf("after enable: %s %q", s, r)
	}

	// Retry discarded: only this endpoint's discarded jobs change.
	other := createTestEndpoint(t, srv, "http://127.0.0.1:2/hook")
	mustExec(t, db, `INSERT INTO outbox.events (topic, fanned_out_at) VALUES ('t', now())`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'webhook', (SELECT max(id) FROM outbox.events), ep, 18, 'discarded', 18, now(), now() FROM unnest(ARRAY[$1, $2]::bigint[]) AS ep`, id, other)
	var retried struct{ Jobs int64 }
	apiCall(t, srv, "POST", path+"/retry-discarded", "", &retried)
	if retried.Jobs != 1 {
		t.Errorf("retried %d jobs, want 1", retried.Jobs)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'discarded'`, other); n != 1 {
		t.Error("retry-discarded touched another endpoint's job")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'available' AND max_attempts = 19`, id); n != 1 {
		t.Error("the endpoint's discarded job is not available with one more attempt")
	}
}

// newFailingTestServer serves the real routes over a database without its
// subject index, so that GET /api/subjects fails as the server's fault,
// and returns what the server logs.
func newFailingTestServer(t *testing.T) (*httptest.Server, *syncBuffer) {
	t.Helper()
	db, _ := newTestDB(t)
	srv, logs := newLoggingTestServer(t, db)
	mustExec(t, db, `DROP TABLE outbox.subjects`) // every read of the index now fails
	return srv, logs
}

// A server error is logged once, with its route, and answered as JSON; a
// client's error is answered and not logged.
func TestServerErrorsAreLoggedOnce(t *testing.T) {
	t.Parallel()
	srv, logs := newFailingTestServer(t)

	var answer map[string]string
	if status := apiCall(t, srv, "GET", "/api/subjects", "", &answer); status != http.StatusInternalServerError || answer["error"] == "" {
		t.Fatalf("GET /api/subjects without its table: %d %v, want 500 with an error", status, answer)
	}
	if status := apiCall(t, srv, "GET", "/api/subjects?limit=0", "", &answer); status != http.StatusBadRequest {
		t.Fatalf("GET /api/subjects?limit=0: %d, want 400", status)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") || !strings.Contains(lines[0], "path=/api/subjects") || !strings.Contains(lines[0], "status=500") {
		t.Errorf("log after a 500 and a 400:\n%s\nwant one ERROR line for the 500", logs.String())
	}
}

// A signed-in browser's error page says what went wrong, with the way back,
// not a sign-in form.
func TestPanelErrorPageIsNotTheSignInForm(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	status, page := panelPage(t, newTestServer(t, db, testPolicy), "/events/999")
	if status != http.StatusNotFound || strings.Contains(page, "Sign in</h1>") ||
		!strings.Contains(page, "event 999") || !strings.Contains(page, `href="/"`) {
		t.Errorf("GET /events/999: %d\n%s\nwant a 404 page naming the event, without the sign-in form", status, page)
	}
}

// A request whose client went away fails with its cancelled query; that is
// not the server's fault, and no ERROR is logged for it.
func TestAbandonedRequestIsNotAServerError(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	a := &admin{logger: slog.New(slog.NewTextHandler(&logs, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest("GET", "/api/events", nil).WithContext(ctx)
	status, _ := a.failed(r, fmt.Errorf("list events: %w", context.Canceled))
	if status != 499 || strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("abandoned request: status %d, log %q; want 499 and no ERROR", status, logs.String())
	}
}

// The job list names each delivery's endpoint and filters by it, in the
// API and on the panel.
func TestJobsFilterByEndpoint(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	a := api.createEndpoint("https://a.example/hook")
	b := api.createEndpoint("https://b.example/hook")
	record(t, db, "order.paid", "o-1")
	record(t, db, "order.paid", "o-2")
	relayAll(t, db)

	var page struct {
		Jobs []JobView `json:"jobs"`
	}
	if status := apiCall(t, api.srv, "GET", "/api/jobs?endpoint_id="+itoa(a.ID), "", &page); status != http.StatusOK {
		t.Fatalf("GET /api/jobs?endpoint_id=: %d", status)
	}
	if len(page.Jobs) != 2 {
		t.Fatalf("%d jobs of endpoint %d, want 2", len(page.Jobs), a.ID)
	}
	for _, j := range page.Jobs {
		if j.EndpointID == nil || *j.EndpointID != a.ID {
			t.Errorf("job %d of endpoint %v in endpoint %d's list", j.ID, j.EndpointID, a.ID)
		}
	}
	_, html := panelPage(t, api.srv, "/jobs?endpoint_id="+itoa(b.ID))
	if n := strings.Count(html, `<a href="/endpoints/`+itoa(b.ID)+`">`); n != 3 { // the heading and two rows
		t.Errorf("panel jobs of endpoint %d link it %d times, want 3:\n%s", b.ID, n, html)
	}
	if strings.Contains(html, `<a href="/endpoints/`+itoa(a.ID)+`">`) {
		t.Errorf("panel jobs of endpoint %d show endpoint %d's", b.ID, a.ID)
	}
	if field := `name="endpoint_id" type="number" min="1" step="1" value="` + itoa(b.ID) + `"`; !strings.Contains(html, field) {
		t.Errorf("the jobs page's filter form does not show endpoint %d:\n%s", b.ID, html)
	}
	// The filter form as a browser sends it, with state "any" (empty).
	status, html := panelPage(t, api.srv, "/jobs?endpoint_id="+itoa(a.ID)+"&state=")
	if n := strings.Count(html, `<a href="/endpoints/`+itoa(a.ID)+`">`); status != http.StatusOK || n != 3 {
		t.Errorf("the filter form's GET for endpoint %d: %d, its links %d times, want 200 and 3", a.ID, status, n)
	}
}

// The job list filtered to an endpoint's discarded deliveries offers to
// retry them all, and the button retries every one.
func TestJobsRetryTheFilteredDiscarded(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := api.createEndpoint("https://a.example/hook")
	record(t, db, "order.paid", "o-1")
	record(t, db, "order.paid", "o-2")
	relayAll(t, db)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'discarded', attempt = 1, attempted_at = now(), finalized_at = now() WHERE endpoint_id = $1`, ep.ID)

	_, page := panelPage(t, api.srv, "/jobs?endpoint_id="+itoa(ep.ID)+"&state=discarded")
	if action := `action="/endpoints/` + itoa(ep.ID) + `/retry-discarded"`; !strings.Contains(page, action) {
		t.Fatalf("the filtered discarded list has no retry-all button:\n%s", page)
	}
	resp, err := signIn(t, api.srv).PostForm(api.srv.URL+"/endpoints/"+itoa(ep.ID)+"/retry-discarded", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'available'`, ep.ID); n != 2 {
		t.Errorf("%d of the endpoint's 2 discarded deliveries available again", n)
	}
}

// The job list filtered to the discarded jobs of every endpoint offers to
// retry them all, and the button retries exactly those: each endpoint's
// deliveries in a replay of its own, as far back as a resend to it may go
// (an older one stays discarded, and is counted), the jobs of no endpoint
// live; no other job changes. The list it returns to says what it did;
// POST /api/jobs/retry-discarded answers the same numbers.
func TestJobsRetryEveryDiscarded(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	a := api.createEndpoint("https://a.example/hook")
	b := api.createEndpoint("https://b.example/hook")
	c := api.createEndpoint("https://c.example/hook")
	e1 := record(t, db, "order.paid", "o-1")
	e2 := record(t, db, "order.paid", "o-2")
	e3 := record(t, db, "order.paid", "o-3")
	relayAll(t, db)
	discard := `UPDATE outbox.jobs SET state = 'discarded', attempt = 1, attempted_at = now(), finalized_at = now()
		WHERE endpoint_id = $1 AND event_id = ANY($2::bigint[])`
	mustExec(t, db, discard, a.ID, pq.Array([]int64{e1, e2}))
	mustExec(t, db, discard, b.ID, pq.Array([]int64{e1, e3}))
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', attempt = 1, attempted_at = now(), finalized_at = now()
		WHERE endpoint_id = $1 AND event_id = $2`, c.ID, e1)
	mustExec(t, db, `UPDATE outbox.events SET created_at = now() - interval '8 days' WHERE id = $1`, e3) // past events retention
	// Jobs of no endpoint (an in-process subscriber's): two discarded, one
	// completed.
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'test.subscriber', $1, 5, s::outbox.job_state, 5, now(), now()
		FROM unnest(ARRAY['discarded', 'discarded', 'completed']) AS s`, e2)

	// Every job as "id endpoint state replay", the endpoint and the replay
	// by name: "-" for none, "r:a" for a retry_discarded replay of a.
	names := map[int64]string{a.ID: "a", b.ID: "b", c.ID: "c"}
	jobs := func() map[int64]string {
		t.Helper()
		rows, err := db.Query(`
			SELECT j.id, coalesce(j.endpoint_id, 0), j.state::text, coalesce(r.endpoint_id, 0), coalesce(r.kind, '')
			FROM outbox.jobs AS j
			LEFT JOIN outbox.replays AS r ON r.id = j.replay_id
			ORDER BY j.id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[int64]string{}
		for rows.Next() {
			var id, endpoint, replayEndpoint int64
			var state, kind string
			if err := rows.Scan(&id, &endpoint, &state, &replayEndpoint, &kind); err != nil {
				t.Fatal(err)
			}
			replay := "-"
			if kind != "" {
				replay = kind + ":" + names[replayEndpoint]
			}
			name := "-"
			if endpoint != 0 {
				name = names[endpoint]
			}
			m[id] = fmt.Sprintf("%s %s %s", name, state, replay)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	want := jobs()
	moved := 0
	for id, j := range want {
		switch j {
		case "a discarded -":
			want[id], moved = "a available retry_discarded:a", moved+1
		case "- discarded -":
			want[id], moved = "- available -", moved+1
		}
	}
	e1b := int64(queryInt(t, db, `SELECT id FROM outbox.jobs WHERE endpoint_id = $1 AND event_id = $2`, b.ID, e1))
	want[e1b] = "b available retry_discarded:b" // b's delivery of e3 is too old: it stays
	if moved != 4 || len(want) != 3*3+3 {
		t.Fatalf("seeded %d jobs, %d of them discarded of a or no endpoint: want 12 and 4", len(want), moved)
	}

	_, page := panelPage(t, api.srv, "/jobs?state=discarded")
	if !strings.Contains(page, `<form method="post" action="/jobs/retry-discarded"><button>Send every discarded job again</button>`) {
		t.Fatalf("the discarded list of every endpoint has no retry-all button:\n%s", page)
	}
	browser := signIn(t, api.srv)
	resp, err := browser.PostForm(api.srv.URL+"/jobs/retry-discarded", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if diff := cmp.Diff(want, jobs()); diff != "" {
		t.Errorf("jobs after the retry, by id (-want +got):\n%s", diff)
	}
	done := "5 discarded jobs will be sent again: 3 deliveries to 2 endpoints and 2 jobs of no endpoint." +
		` 1 deliveries stay discarded: their events are too old to send again safely: "https://b.example/hook", 1; each endpoint's page says why.`
	location := resp.Header.Get("Location")
	if wantLocation := "/jobs?state=discarded&done=" + url.QueryEscape(done); resp.StatusCode != http.StatusSeeOther || location != wantLocation {
		t.Fatalf("the retry answered %d to %q, want 303 to %q", resp.StatusCode, location, wantLocation)
	}
	resp, err = browser.Get(api.srv.URL + location)
	if err != nil {
		t.Fatal(err)
	}
	html, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if flash := `<p class="flash">` + template.HTMLEscapeString(done) + `</p>`; !strings.Contains(string(html), flash) {
		t.Errorf("the list after the retry lacks %s", flash)
	}

	// The API, once c's delivery of e2 is discarded too: that one runs,
	// b's too old one is counted again, and nothing else is discarded.
	mustExec(t, db, discard, c.ID, pq.Array([]int64{e2}))
	status, body := api.do("POST", "/api/jobs/retry-discarded", "")
	var got BulkRetryResult
	if err := json.Unmarshal(body, &got); status != http.StatusOK || err != nil {
		t.Fatalf("POST /api/jobs/retry-discarded: %d %s", status, body)
	}
	for i := range got.Endpoints {
		if got.Endpoints[i].ReplayID == 0 {
			t.Errorf("endpoint %d's retry has no replay", got.Endpoints[i].EndpointID)
		}
		got.Endpoints[i].ReplayID, got.Endpoints[i].Message = 0, ""
	}
	wantAPI := BulkRetryResult{Jobs: 1, Skipped: 1, Endpoints: []EndpointRetryResult{
		{EndpointID: b.ID, RetryResult: RetryResult{Skipped: 1}},
		{EndpointID: c.ID, RetryResult: RetryResult{Jobs: 1}},
	}}
	if diff := cmp.Diff(wantAPI, got); diff != "" {
		t.Errorf("POST /api/jobs/retry-discarded (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'discarded'`); n != 1 {
		t.Errorf("%d jobs discarded after both retries, want b's too old one", n)
	}
}

// The stream says where each event went: of its jobs, how many completed,
// were discarded or still wait, in the API and on the panel.
func TestEventsShowWhereTheyWent(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	a := api.createEndpoint("https://a.example/hook")
	b := api.createEndpoint("https://b.example/hook")
	api.createEndpoint("https://c.example/hook")
	ev := record(t, db, "order.paid", "o-1")
	relayAll(t, db) // three deliveries
	for state, endpoint := range map[string]int64{"discarded": a.ID, "completed": b.ID} {
		mustExec(t, db, `UPDATE outbox.jobs SET state = $1::outbox.job_state, attempt = 1, attempted_at = now(), finalized_at = now()
			WHERE endpoint_id = $2`, state, endpoint)
	}

	var page struct {
		Events []Event `json:"events"`
	}
	if status := apiCall(t, api.srv, "GET", "/api/events", "", &page); status != http.StatusOK || len(page.Events) != 1 {
		t.Fatalf("GET /api/events: %d, %d events", status, len(page.Events))
	}
	if diff := cmp.Diff(&EventOutcome{Jobs: 3, Completed: 1, Discarded: 1, Pending: 1}, page.Events[0].Outcome); diff != "" {
		t.Errorf("event %d's outcome (-want +got):\n%s", ev, diff)
	}
	if _, html := panelPage(t, api.srv, "/events"); !strings.Contains(html, `<span class="badge badge-ok">delivered 1</span>`) || !strings.Contains(html, `<span class="badge badge-bad">1 failed</span>`) || !strings.Contains(html, `<span class="badge badge-wait">1 queued</span>`) {
		t.Errorf("the panel's stream does not say where the event went:\n%s", html)
	}
}
