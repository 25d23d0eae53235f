package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The retry window's bound is what the 18 attempts of the default
// schedule span without jitter: Σ attempt⁴ s for attempts 1 to 17.
func TestRetryWindowBoundIsTheDefaultSchedulesSpan(t *testing.T) {
	t.Parallel()
	var span time.Duration
	for attempt := 1; attempt < maxEndpointAttempts; attempt++ {
		span += time.Duration(attempt*attempt*attempt*attempt) * time.Second
	}
	if span != 327369*time.Second || maxRetryWindowSeconds != 327369 || defaultConfig().Workers.MaxAttempts != maxEndpointAttempts {
		t.Errorf("18 attempts span %s, bound %d s, default attempts %d; want 327369 s, 327369, 18",
			span, maxRetryWindowSeconds, defaultConfig().Workers.MaxAttempts)
	}
}

func TestEndRetriesAt(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	retry := jobOutcome{State: jobRetryable, Delay: 16 * time.Second, Error: "webhook: answered 500"}
	for _, tc := range []struct {
		name  string
		in    jobOutcome
		until time.Time
		want  jobState
	}{
		{"no window", retry, time.Time{}, jobRetryable},
		{"the next attempt inside the window", retry, now.Add(16 * time.Second), jobRetryable},
		{"the next attempt past the window", retry, now.Add(15 * time.Second), jobDiscarded},
		{"a success stays one", jobOutcome{State: jobCompleted}, now.Add(-time.Hour), jobCompleted},
		{"a discard stays one", jobOutcome{State: jobDiscarded, Error: "gone"}, now.Add(time.Hour), jobDiscarded},
	} {
		got := endRetriesAt(tc.in, tc.until, now)
		if got.State != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got.State, tc.want)
		}
		if tc.in.State == jobRetryable && got.State == jobDiscarded && !strings.Contains(got.Error, "retry window") {
			t.Errorf("%s: error %q does not say the retry window ended it", tc.name, got.Error)
		}
	}
}

// An endpoint's request settings and headers are taken, echoed and
// changed through the API; a secret header's value is never shown back.
func TestEndpointRequestSettingsThroughTheAPI(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	const secret = "sk_live_0123456789abcdef"
	status, body := api.do("POST", "/api/endpoints", `{"url": "https://hooks.example.com/a", "max_attempts": 3,
		"retry_window_seconds": 600, "timeout_seconds": 5,
		"headers": {"X-Tenant": "acme", "Authorization": {"value": "Bearer `+secret+`", "secret": true}}}`)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	var created struct {
		ID                 int64          `json:"id"`
		MaxAttempts        *int           `json:"max_attempts"`
		RetryWindowSeconds *int           `json:"retry_window_seconds"`
		TimeoutSeconds     *int           `json:"timeout_seconds"`
		Headers            map[string]any `json:"headers"`
	}
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	wantHeaders := map[string]any{"X-Tenant": "acme", "Authorization": map[string]any{"secret": true}}
	if *created.MaxAttempts != 3 || *created.RetryWindowSeconds != 600 || *created.TimeoutSeconds != 5 {
		t.Errorf("create answered %d attempts, %d s window, %d s timeout; want 3, 600, 5",
			*created.MaxAttempts, *created.RetryWindowSeconds, *created.TimeoutSeconds)
	}
	if diff := cmp.Diff(wantHeaders, created.Headers); diff != "" {
		t.Errorf("headers as created (-want +got):\n%s", diff)
	}
	id := itoa(created.ID)
	answers := [][]byte{body}
	// Null goes back to the default; a secret header given without its
	// value keeps the one stored; headers replace the set.
	status, body = api.do("PATCH", "/api/endpoints/"+id, `{"timeout_seconds": null, "max_attempts": 18,
		"headers": {"Authorization": {"secret": true}, "X-Region": "eu"}}`)
	if status != http.StatusOK {
		t.Fatalf("patch: %d %s", status, body)
	}
	answers = append(answers, body)
	for _, path := range []string{"/api/endpoints/" + id, "/api/endpoints"} {
		status, body = api.do("GET", path, "")
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		answers = append(answers, body)
	}
	got := api.endpoint(created.ID)
	if got.TimeoutSeconds != nil || *got.MaxAttempts != 18 || *got.RetryWindowSeconds != 600 {
		t.Errorf("after the patch: timeout %v, attempts %v, window %v; want null, 18, 600", got.TimeoutSeconds, *got.MaxAttempts, *got.RetryWindowSeconds)
	}
	var gotHeaders map[string]any
	if err := json.Unmarshal(got.Headers, &gotHeaders); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]any{"X-Region": "eu", "Authorization": map[string]any{"secret": true}}, gotHeaders); diff != "" {
		t.Errorf("headers after the patch (-want +got):\n%s", diff)
	}
	kept, err := openSecretHeaders(nil, created.ID, queryBytes(t, db, `SELECT secret_headers FROM outbox.endpoints WHERE id = $1`, created.ID))
	if err != nil || kept["Authorization"] != "Bearer "+secret {
		t.Errorf("the secret header kept by the patch: %q (%v), want the one created", kept["Authorization"], err)
	}
	for _, a := range answers {
		if bytes.Contains(a, []byte(secret)) {
			t.Errorf("an answer shows the secret header's value: %s", a)
		}
	}
	// PATCH {"headers": null} removes them all.
	if status, body = api.do("PATCH", "/api/endpoints/"+id, `{"headers": null}`); status != http.StatusOK || !strings.Contains(string(body), `"headers":{}`) {
		t.Errorf("patch headers null: %d %s, want 200 and no headers", status, body)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE secret_headers IS NOT NULL`); n != 0 {
		t.Errorf("%d endpoints keep secret headers after their removal, want 0", n)
	}
}

// Every bad setting or header is refused with a 400 naming the field,
// and never quoting a header's value.
func TestEndpointRequestSettingsRefused(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	many := map[string]string{}
	for i := range 21 {
		many[fmt.Sprintf("X-H%d", i)] = "v"
	}
	manyJSON, _ := json.Marshal(many)
	for _, tc := range []struct{ body, want string }{
		{`"max_attempts": 0`, "max_attempts must be between 1 and 18"},
		{`"max_attempts": 19`, "max_attempts must be between 1 and 18"},
		{`"retry_window_seconds": 0`, "retry_window_seconds must be between 1 and 327369"},
		{`"retry_window_seconds": 327370`, "retry_window_seconds must be between 1 and 327369"},
		{`"timeout_seconds": 0`, "timeout_seconds must be between 1 and 60"},
		{`"timeout_seconds": 61`, "timeout_seconds must be between 1 and 60"},
		{`"headers": ["X-A"]`, "headers must be an object"},
		{`"headers": {"webhook-id": "1"}`, "headers: webhook-id is set by outboxd"},
		{`"headers": {"Webhook-Signature": "v1,x"}`, "headers: Webhook-Signature is set by outboxd"},
		{`"headers": {"Content-Type": "text/plain"}`, "headers: Content-Type is set by outboxd"},
		{`"headers": {"content-length": "1"}`, "headers: content-length is set by outboxd"},
		{`"headers": {"User-Agent": "me"}`, "headers: User-Agent is set by outboxd"},
		{`"headers": {"traceparent": "00-x"}`, "headers: traceparent is set by outboxd"},
		{`"headers": {"Tracestate": "a=b"}`, "headers: Tracestate is set by outboxd"},
		{`"headers": {"Host": "evil.example"}`, "headers: Host is set by outboxd"},
		{`"headers": {"Connection": "close"}`, "headers: Connection is set by outboxd"},
		{`"headers": {"Keep-Alive": "1"}`, "headers: Keep-Alive is set by outboxd"},
		{`"headers": {"Proxy-Authorization": "x"}`, "headers: Proxy-Authorization is set by outboxd"},
		{`"headers": {"TE": "trailers"}`, "headers: TE is set by outboxd"},
		{`"headers": {"Trailer": "x"}`, "headers: Trailer is set by outboxd"},
		{`"headers": {"Transfer-Encoding": "chunked"}`, "headers: Transfer-Encoding is set by outboxd"},
		{`"headers": {"Upgrade": "h2c"}`, "headers: Upgrade is set by outboxd"},
		{`"headers": {"X Bad": "v"}`, `headers: "X Bad" is not a header name`},
		{`"headers": {"": "v"}`, `headers: "" is not a header name`},
		{`"headers": {"X-A": "one\r\nX-Injected: two"}`, "headers.X-A: value holds a control character"},
		{`"headers": {"X-A": ""}`, "headers.X-A: value must be 1 to 4096 bytes"},
		{`"headers": {"X-A": " padded"}`, "headers.X-A: value starts or ends with white space"},
		{`"headers": {"X-A": 7}`, "headers.X-A: want a string, or an object"},
		{`"headers": {"X-A": {"value": "v", "hidden": true}}`, "headers.X-A: want a string, or an object"},
		{`"headers": {"X-A": {"secret": true}}`, "headers.X-A: a new secret header needs its value"},
		{`"headers": {"X-A": "1", "x-a": "2"}`, `headers: "X-A" and "x-a" name one header`},
		{`"headers": ` + string(manyJSON), "headers: 21 headers, at most 20"},
		{`"headers": {"X-A": "` + strings.Repeat("a", 4096) + `", "X-B": "` + strings.Repeat("b", 4096) + `"}`, "headers: 8198 bytes of names and values, at most 8192"},
	} {
		status, body := api.do("POST", "/api/endpoints", `{"url": "https://hooks.example.com/a", `+tc.body+`}`)
		var refusal struct{ Error string }
		json.Unmarshal(body, &refusal)
		if status != http.StatusBadRequest || !strings.Contains(refusal.Error, tc.want) {
			t.Errorf("create with %.60s: %d %s, want 400 saying %q", tc.body, status, body, tc.want)
		}
		if strings.Contains(tc.body, "Injected") && strings.Contains(string(body), "Injected") {
			t.Errorf("the refusal quotes the header's value: %s", body)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints stored, want none", n)
	}
}

// The custom headers arrive with every delivery, through the real claim
// and sender, beside outboxd's own; a secret one, sealed at rest, is in
// no log line of the API or the workers.
func TestCustomHeadersArriveAndSecretsStayHidden(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	box := testBox(t, testSecretsKey(1), "")
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	api := &testAPI{t: t, srv: serveAdmin(t, testAdmin(t, db, testPolicy, logger, box))}
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			http.Error(w, "once more", http.StatusInternalServerError)
		}
	})
	const secret = "sk_live_secret_value_42"
	status, body := api.do("POST", "/api/endpoints", `{"url": "`+rc.srv.URL+`", "headers": {"X-Tenant": "acme",
		"X-Api-Key": {"value": "`+secret+`", "secret": true}}}`)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	var ep endpointWithSecret
	if err := json.Unmarshal(body, &ep); err != nil {
		t.Fatal(err)
	}
	if stored := queryBytes(t, db, `SELECT secret_headers FROM outbox.endpoints WHERE id = $1`, ep.ID); bytes.Contains(stored, []byte(secret)) || !isSealedBlob(stored) {
		t.Errorf("secret headers stored as %q, want them sealed", stored)
	}
	eventID := record(t, db, "t", "s")
	relayAll(t, db)
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(),
		map[string]jobHandler{webhookJobKind: newWebhookSender(db, box, client, nil, nil, logger).deliver}, logger)
	job := webhookJob(t, db, eventID, ep.ID)
	for range 2 { // a failure, logged, then the retry
		if _, err := wp.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
		mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE id = $1 AND state = 'retryable'`, job)
	}
	reqs := rc.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	for i, r := range reqs {
		if got := [2]string{r.Header.Get("X-Tenant"), r.Header.Get("X-Api-Key")}; got != [2]string{"acme", secret} {
			t.Errorf("request %d carried X-Tenant %q and X-Api-Key %q, want acme and the secret", i+1, got[0], got[1])
		}
		if r.Header.Get("Content-Type") != "application/json" || r.Header.Get("webhook-id") != itoa(eventID) {
			t.Errorf("request %d: outboxd's own headers %v", i+1, r.Header)
		}
		if err := verifyWebhook([][]byte{secretOf(t, ep)}, r.Header, r.Body, time.Now()); err != nil {
			t.Errorf("request %d: %v", i+1, err)
		}
	}
	if !strings.Contains(logs.String(), "job failed; will retry") {
		t.Fatalf("the workers logged no failure; logs:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("a log line holds the secret header's value:\n%s", logs.String())
	}
}

// A queued delivery follows its endpoint's retry settings as they are when
// its next attempt is claimed: fewer attempts, or a retry window, end it
// after that attempt fails, as after its last.
func TestEndpointRetrySettingsEndQueuedDeliveries(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusBadGateway)
	})
	attempts := api.createEndpoint(rc.srv.URL, "attempts")
	status, body := api.do("POST", "/api/endpoints", `{"url": "`+rc.srv.URL+`", "topics": ["window"], "retry_window_seconds": 10}`)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	var window Endpoint
	if err := json.Unmarshal(body, &window); err != nil {
		t.Fatal(err)
	}
	fewer, windowed := record(t, db, "attempts", "a"), record(t, db, "window", "w")
	relayAll(t, db)
	fewer, windowed = webhookJob(t, db, fewer, attempts.ID), webhookJob(t, db, windowed, window.ID)
	wp := webhookWorkers(t, db, defaultConfig().Workers, 10*time.Second)
	work := func() {
		t.Helper()
		if _, err := wp.workOnce(context.Background(), 10); err != nil {
			t.Fatal(err)
		}
		mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state = 'retryable'`)
	}
	work()
	for _, job := range []int64{fewer, windowed} {
		if r := readJob(t, db, job); r.State != "retryable" || r.Attempt != 1 {
			t.Fatalf("job %d after its first failure: %+v, want retryable after attempt 1", job, r)
		}
	}
	// Lowered while the delivery waits for its second attempt.
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(attempts.ID), `{"max_attempts": 2}`); status != http.StatusOK {
		t.Fatalf("patch: %d %s", status, body)
	}
	work()
	for _, job := range []int64{fewer, windowed} {
		if r := readJob(t, db, job); r.State != "discarded" || r.Attempt != 2 {
			t.Errorf("job %d after its second failure: %+v, want discarded after attempt 2", job, r)
		}
	}
	var last string
	db.QueryRow(`SELECT errors->1->>'error' FROM outbox.jobs WHERE id = $1`, windowed).Scan(&last)
	if !strings.Contains(last, "retry window") || !strings.Contains(last, "502 Bad Gateway") {
		t.Errorf("the windowed job's last error %q, want the window and the answer", last)
	}
	if n := len(rc.requests()); n != 4 {
		t.Errorf("receiver got %d requests, want 4", n)
	}
}

// An endpoint's timeout replaces the service's for its requests, longer
// (the attempt's limit and the transport's wait for headers grow with it)
// or shorter.
func TestEndpointTimeoutBoundsItsRequests(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	release := make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		wait := time.After(1500 * time.Millisecond) // the slow one answers then
		if r.URL.Path == "/hang" {
			wait = nil
		}
		select {
		case <-r.Context().Done():
		case <-release:
		case <-wait:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the receiver's Close
	create := func(path string, timeout int) int64 {
		t.Helper()
		status, body := api.do("POST", "/api/endpoints", fmt.Sprintf(`{"url": "%s%s", "topics": ["t%s"], "timeout_seconds": %d}`,
			rc.srv.URL, path, strings.TrimPrefix(path, "/"), timeout))
		var e Endpoint
		if err := json.Unmarshal(body, &e); status != http.StatusCreated || err != nil {
			t.Fatalf("create: %d %s", status, body)
		}
		return e.ID
	}
	slow, hang := create("/slow", 3), create("/hang", 1)
	slowJob, hangJob := record(t, db, "tslow", "s"), record(t, db, "thang", "h")
	relayAll(t, db)
	slowJob, hangJob = webhookJob(t, db, slowJob, slow), webhookJob(t, db, hangJob, hang)

	run := func(serviceTimeout time.Duration) {
		t.Helper()
		cfg := defaultConfig()
		cfg.AllowPrivateEndpoints = true
		cfg.Webhooks.Timeout, cfg.Workers.AttemptTimeout = serviceTimeout, serviceTimeout
		client, _ := deliveryClients(cfg, db, nil, testLogger(t))
		wp := newWorkerPool(db, cfg.Workers, time.Minute, newSubscriberRegistry(),
			map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, client, nil, nil, testLogger(t)).deliver}, testLogger(t))
		if _, err := wp.workOnce(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	run(300 * time.Millisecond) // the slow one's 3 s beat the service's 300 ms
	if r := readJob(t, db, slowJob); r.State != "completed" {
		t.Errorf("a 1.5 s answer to an endpoint of 3 s under a service of 300 ms: %+v, want completed", r)
	}
	start := time.Now()
	run(20 * time.Second) // the hanging one's 1 s cuts the service's 20 s
	var durationMS int
	if err := db.QueryRow(`SELECT duration_ms FROM outbox.deliveries WHERE job_id = $1`, hangJob).Scan(&durationMS); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); durationMS < 1000 || durationMS > 5000 || took > 10*time.Second || readJob(t, db, hangJob).State != "retryable" {
		t.Errorf("a hanging receiver of an endpoint of 1 s: attempt of %d ms, %s in all, %s; want about 1 s, retryable",
			durationMS, took, readJob(t, db, hangJob).State)
	}
}

// A delivery to an endpoint with a longer timeout than the attempt
// timeout is rescued only past its own timeout plus the margin: its live
// worker may still hold it until then.
func TestRescueWaitsOutAnEndpointsLongerTimeout(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	status, body := api.do("POST", "/api/endpoints", `{"url": "https://hooks.example.com/a", "timeout_seconds": 60}`)
	var e Endpoint
	if err := json.Unmarshal(body, &e); status != http.StatusCreated || err != nil {
		t.Fatalf("create: %d %s", status, body)
	}
	job := record(t, db, "t", "s")
	relayAll(t, db)
	job = webhookJob(t, db, job, e.ID)
	cfg := defaultConfig().Workers // 30 s timeout + 1 min margin: 90 s, and 60 s + 1 min for this endpoint
	rescue := func(ago int) string {
		t.Helper()
		mustExec(t, db, `UPDATE outbox.jobs SET state = 'running', attempt = 1, attempted_at = now() - make_interval(secs => $2) WHERE id = $1`, job, ago)
		if _, err := newRescuer(db, cfg, defaultConfig().Replicas, testLogger(t)).rescueOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		return readJob(t, db, job).State
	}
	cfg.AttemptTimeout = time.Second // 1 s + 1 min: 61 s, and the endpoint's 120 s
	if s := rescue(100); s != "running" {
		t.Errorf("running for 100 s with an endpoint timeout of 60 s: %s, want still running", s)
	}
	if s := rescue(121); s != "retryable" {
		t.Errorf("running for 121 s with an endpoint timeout of 60 s: %s, want rescued", s)
	}
}

// queryBytes is the one bytea value query returns.
func queryBytes(t *testing.T, db *sql.DB, query string, args ...any) []byte {
	t.Helper()
	var b []byte
	if err := db.QueryRow(query, args...).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Secret headers stored before -secrets-key was set are sealed by
// `outboxd secrets encrypt`, as the signing secrets are, and re-sealed by
// rotate-key, so they still open once the old key is gone.
func TestSecretsCommandsSealSecretHeaders(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	api := newTestAPI(t, db, testPolicy)
	status, body := api.do("POST", "/api/endpoints", `{"url": "https://hooks.example.com/a", "headers": {"X-Api-Key": {"value": "k-plain", "secret": true}}}`)
	var e Endpoint
	if err := json.Unmarshal(body, &e); status != http.StatusCreated || err != nil {
		t.Fatalf("create: %d %s", status, body)
	}
	stored := func() []byte {
		return queryBytes(t, db, `SELECT secret_headers FROM outbox.endpoints WHERE id = $1`, e.ID)
	}
	if isSealedBlob(stored()) {
		t.Fatal("sealed without a key")
	}
	key1, key2 := testSecretsKey(1), testSecretsKey(2)
	for _, step := range []struct {
		name string
		box  *secretBox
		want int
	}{
		{"secrets encrypt", testBox(t, key1, ""), 1},
		{"secrets encrypt again", testBox(t, key1, ""), 0},
		{"secrets rotate-key", testBox(t, key2, key1), 1},
	} {
		sealed, err := sealStoredSecrets(ctx, db, step.box, testLogger(t))
		if err != nil || sealed[secretHeadersColumn] != step.want {
			t.Errorf("%s rewrote %d secret headers (%v), want %d", step.name, sealed[secretHeadersColumn], err, step.want)
		}
	}
	values, err := openSecretHeaders(testBox(t, key2, ""), e.ID, stored())
	if err != nil || values["X-Api-Key"] != "k-plain" || !isSealedBlob(stored()) || bytes.Contains(stored(), []byte("k-plain")) {
		t.Errorf("after the rotation: %v (%v), stored %q; want the value, sealed under the new key alone", values, err, stored())
	}
}
