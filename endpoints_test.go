// endpoints_test.go: the endpoint API, its validation and its answers.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testAPI serves routes() for the test's database.
type testAPI struct {
	t   *testing.T
	srv *httptest.Server
}

func newTestAPI(t *testing.T, db *sql.DB, policy endpointPolicy) *testAPI {
	t.Helper()
	return &testAPI{t: t, srv: newTestServer(t, db, policy)}
}

// testPolicy allows loopback endpoints (the receivers are httptest
// servers) and opens a one-hour rotation window.
var testPolicy = endpointPolicy{AllowPrivate: true, RotationWindow: time.Hour}

// do sends an authorised request and returns the status and the body.
func (a *testAPI) do(method, path, body string) (int, []byte) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.srv.URL+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, b
}

// createEndpoint registers an endpoint for url with topics and returns it
// with its secret.
func (a *testAPI) createEndpoint(url string, topics ...string) endpointWithSecret {
	a.t.Helper()
	if topics == nil {
		topics = []string{}
	}
	body, _ := json.Marshal(map[string]any{"url": url, "topics": topics})
	status, resp := a.do("POST", "/api/endpoints", string(body))
	if status != http.StatusCreated {
		a.t.Fatalf("create endpoint %s: %d %s", url, status, resp)
	}
	var e endpointWithSecret
	if err := json.Unmarshal(resp, &e); err != nil {
		a.t.Fatal(err)
	}
	return e
}

// endpoint reads an endpoint through the API.
func (a *testAPI) endpoint(id int64) Endpoint {
	a.t.Helper()
	status, resp := a.do("GET", "/api/endpoints/"+itoa(id), "")
	if status != http.StatusOK {
		a.t.Fatalf("get endpoint %d: %d %s", id, status, resp)
	}
	var e Endpoint
	if err := json.Unmarshal(resp, &e); err != nil {
		a.t.Fatal(err)
	}
	return e
}

func itoa(id int64) string { return strconv.FormatInt(id, 10) }

// The whole life of an endpoint through the API, and the JSON shape other
// programs rely on (docs/http-api.md).
func TestEndpointAPILifecycle(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)

	status, body := api.do("POST", "/api/endpoints",
		`{"url": "https://hooks.example.com/outboxd", "topics": ["order.*", "user.created"], "description": "billing", "owner_email": "ops@example.com"}`)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	var created map[string]any
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"id", "url", "topics", "state", "secret", "description", "owner_email",
		"failing_since", "disabled_at", "disabled_reason", "created_at",
		"max_in_flight", "rate_limit_per_second", "ordering", "in_flight", "breaker", "held_until", "paused_at",
		"max_attempts", "retry_window_seconds", "timeout_seconds", "headers"} {
		if _, ok := created[key]; !ok {
			t.Errorf("create answer has no %q: %s", key, body)
		}
	}
	secret, _ := created["secret"].(string)
	if _, err := parseWebhookSecret(secret); err != nil || !strings.HasPrefix(secret, "whsec_") {
		t.Errorf("secret %q is not a whsec_ secret: %v", secret, err)
	}
	id := int64(created["id"].(float64))
	want := Endpoint{
		ID: id, URL: "https://hooks.example.com/outboxd", Description: "billing", OwnerEmail: "ops@example.com",
		Topics: []string{"order.*", "user.created"}, State: "enabled", Health: "ok",
		MaxInFlight: 16, Ordering: "none", Breaker: breaker{State: "closed"}, RecoveryProbes: true, Signature: "v1",
		Headers: json.RawMessage(`{}`),
	}
	ignoreTimes := cmp.FilterPath(func(p cmp.Path) bool {
		switch p.Last().String() {
		case ".CreatedAt", ".UpdatedAt", ".DisabledAt", ".PreviousSecretExpiresAt":
			return true
		}
		return false
	}, cmp.Ignore())
	if diff := cmp.Diff(want, api.endpoint(id), ignoreTimes); diff != "" {
		t.Errorf("get after create (-want +got):\n%s", diff)
	}
	if _, body := api.do("GET", "/api/endpoints/"+itoa(id), ""); bytes.Contains(body, []byte("whsec_")) {
		t.Errorf("GET shows the secret: %s", body)
	}

	status, body = api.do("PATCH", "/api/endpoints/"+itoa(id), `{"topics": [], "description": "everything"}`)
	if status != http.StatusOK {
		t.Fatalf("patch: %d %s", status, body)
	}
	want.Topics, want.Description = []string{}, "everything"
	if diff := cmp.Diff(want, api.endpoint(id), ignoreTimes); diff != "" {
		t.Errorf("after patch (-want +got):\n%s", diff)
	}

	if status, body = api.do("POST", "/api/endpoints/"+itoa(id)+"/disable", `{"reason": "receiver moved"}`); status != http.StatusOK {
		t.Fatalf("disable: %d %s", status, body)
	}
	got := api.endpoint(id)
	if got.State != "disabled" || got.DisabledAt == nil || got.DisabledReason == nil || *got.DisabledReason != "receiver moved" {
		t.Errorf("after disable: state %s, disabled_at %v, reason %v", got.State, got.DisabledAt, got.DisabledReason)
	}
	if status, body = api.do("POST", "/api/endpoints/"+itoa(id)+"/enable", ``); status != http.StatusOK {
		t.Fatalf("enable: %d %s", status, body)
	}
	if diff := cmp.Diff(want, api.endpoint(id), ignoreTimes); diff != "" {
		t.Errorf("after enable (-want +got):\n%s", diff)
	}

	status, body = api.do("POST", "/api/endpoints/"+itoa(id)+"/rotate-secret", ``)
	var rotated endpointWithSecret
	if err := json.Unmarshal(body, &rotated); status != http.StatusOK || err != nil {
		t.Fatalf("rotate: %d %s", status, body)
	}
	if rotated.Secret == secret || !strings.HasPrefix(rotated.Secret, "whsec_") {
		t.Errorf("rotated secret %q, want a new whsec_ secret", rotated.Secret)
	}
	if rotated.PreviousSecretExpiresAt == nil || time.Until(*rotated.PreviousSecretExpiresAt) < 59*time.Minute {
		t.Errorf("previous secret expires at %v, want in an hour", rotated.PreviousSecretExpiresAt)
	}

	status, body = api.do("GET", "/api/endpoints", "")
	var list struct{ Endpoints []Endpoint }
	if err := json.Unmarshal(body, &list); status != http.StatusOK || err != nil || len(list.Endpoints) != 1 || list.Endpoints[0].ID != id {
		t.Errorf("list: %d %s", status, body)
	}

	if status, body = api.do("DELETE", "/api/endpoints/"+itoa(id), ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", status, body)
	}
	if status, _ = api.do("GET", "/api/endpoints/"+itoa(id), ""); status != http.StatusNotFound {
		t.Errorf("get after delete: %d, want 404", status)
	}
}

// Bad input gets a 4xx with a message and changes nothing.
func TestEndpointAPIRefusesBadInput(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	strict := newTestAPI(t, db, endpointPolicy{AllowPrivate: false, RotationWindow: time.Hour})
	existing := api.createEndpoint("https://hooks.example.com/a", "order.*")
	path := "/api/endpoints/" + itoa(existing.ID)
	before := api.endpoint(existing.ID)

	tooManyTopics := `{"url": "https://x.example.com", "topics": [` + strings.Repeat(`"a",`, 100) + `"b"]}`
	for _, tc := range []struct {
		name, method, path, body string
		api                      *testAPI
		status                   int
		message                  string // in the error
	}{
		{"malformed JSON", "POST", "/api/endpoints", `{"url": `, api, 400, "request body"},
		{"not an object", "POST", "/api/endpoints", `["https://x.example.com"]`, api, 400, "request body"},
		{"two JSON values", "POST", "/api/endpoints", `{"url": "https://x.example.com"} {}`, api, 400, "more than one JSON value"},
		{"unknown field", "POST", "/api/endpoints", `{"url": "https://x.example.com", "secret": "whsec_AAAA"}`, api, 400, `unknown field "secret"`},
		{"no url", "POST", "/api/endpoints", `{"topics": ["a"]}`, api, 400, "url is required"},
		{"relative url", "POST", "/api/endpoints", `{"url": "/hooks"}`, api, 400, "scheme must be http or https"},
		{"ftp url", "POST", "/api/endpoints", `{"url": "ftp://x.example.com/"}`, api, 400, "scheme must be http or https"},
		{"url with credentials", "POST", "/api/endpoints", `{"url": "https://u:p@x.example.com/"}`, api, 400, "credentials"},
		{"url too long", "POST", "/api/endpoints", `{"url": "https://x.example.com/` + strings.Repeat("a", 2100) + `"}`, api, 400, "longer than 2048"},
		{"loopback url without -allow-private-endpoints", "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/"}`, strict, 400, "allow-private-endpoints"},
		{"bad topic pattern", "POST", "/api/endpoints", `{"url": "https://x.example.com", "topics": ["order.*.paid"]}`, api, 400, "topic pattern"},
		{"empty topic pattern", "POST", "/api/endpoints", `{"url": "https://x.example.com", "topics": [""]}`, api, 400, "topic pattern"},
		{"too many topics", "POST", "/api/endpoints", tooManyTopics, api, 400, "at most 100"},
		{"description too long", "POST", "/api/endpoints", `{"url": "https://x.example.com", "description": "` + strings.Repeat("d", 1001) + `"}`, api, 400, "description is 1001 bytes"},
		{"bad owner email", "POST", "/api/endpoints", `{"url": "https://x.example.com", "owner_email": "Ops <ops@example.com>"}`, api, 400, "owner_email"},
		{"oversized body", "POST", "/api/endpoints", `{"url": "https://x.example.com", "description": "` + strings.Repeat("d", 2<<20) + `"}`, api, 413, "larger than"},
		{"patch with bad url", "PATCH", path, `{"url": "javascript:alert(1)"}`, api, 400, "scheme"},
		{"patch with unknown field", "PATCH", path, `{"state": "enabled"}`, api, 400, `unknown field "state"`},
		{"patch with bad topics", "PATCH", path, `{"topics": ["no spaces"]}`, api, 400, "topic pattern"},
		{"patch of a missing endpoint", "PATCH", "/api/endpoints/999999", `{"description": "x"}`, api, 404, "not found"},
		{"id not a number", "GET", "/api/endpoints/abc", ``, api, 400, "not a positive integer"},
		{"disable with an oversized reason", "POST", path + "/disable", `{"reason": "` + strings.Repeat("r", 501) + `"}`, api, 400, "reason"},
		{"rotate a missing endpoint", "POST", "/api/endpoints/999999/rotate-secret", ``, api, 404, "not found"},
		{"bad page size", "GET", "/api/endpoints?limit=0", ``, api, 400, "limit"},
	} {
		status, body := tc.api.do(tc.method, tc.path, tc.body)
		var answer struct{ Error string }
		json.Unmarshal(body, &answer)
		if status != tc.status || !strings.Contains(answer.Error, tc.message) {
			t.Errorf("%s: %d %s, want %d with an error containing %q", tc.name, status, truncate(string(body), 300), tc.status, tc.message)
		}
	}

	req, _ := http.NewRequest("POST", api.srv.URL+"/api/endpoints", strings.NewReader(`{"url": "https://x.example.com"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("create without a token: %d, want 401", resp.StatusCode)
	}

	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 1 {
		t.Errorf("%d endpoints after bad input, want the 1 there was", n)
	}
	if diff := cmp.Diff(before, api.endpoint(existing.ID)); diff != "" {
		t.Errorf("the existing endpoint changed (-before +after):\n%s", diff)
	}
}

// An endpoint's secrets are stored as they are without a key, as before
// keys existed, and sealed to the endpoint with one; a rotation keeps the
// old secret as the previous one either way.
func TestEndpointSecretsStoredSealedOnlyWithAKey(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	for _, box := range []*secretBox{nil, testBox(t, testSecretsKey(1), "")} {
		api := newSealingTestAPI(t, db, box)
		created := api.createEndpoint("https://hooks.example.com/a")
		status, body := api.do("POST", "/api/endpoints/"+itoa(created.ID)+"/rotate-secret", "")
		var rotated endpointWithSecret
		if err := json.Unmarshal(body, &rotated); status != http.StatusOK || err != nil {
			t.Fatalf("rotate: %d %s", status, body)
		}
		secret, previous := storedSecrets(t, db, endpointSecretsQuery, created.ID)
		if isSealed(secret) != (box != nil) || isSealed(previous) != (box != nil) {
			t.Errorf("key %v: stored %d and %d bytes", box != nil, len(secret), len(previous))
		}
		got, err := box.openAll(endpointSecretRow(created.ID), [][]byte{secret, previous})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([][]byte{secretOf(t, rotated), secretOf(t, created)}, got); diff != "" {
			t.Errorf("key %v: secrets as stored (-want +got):\n%s", box != nil, diff)
		}
	}
}

// A delete that deadlocks with the completer (which locks a job, then its
// endpoint, as the delete does the other way round) is tried again, and
// the endpoint is gone.
func TestDeleteEndpointOutlivesADeadlockWithTheCompleter(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := api.createEndpoint("https://hooks.example/x")
	ev := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	job := webhookJob(t, db, ev, ep.ID)

	completer, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer completer.Rollback()
	// PostgreSQL looks for a deadlock once, deadlock_timeout after a wait
	// begins, and aborts whoever looks first and finds one. The delete
	// looks 5 s into its wait, the completer 60 s into its own, which
	// begins as soon as the delete is seen waiting: the delete loses, as
	// it would with equal timeouts, without depending on how soon this
	// test sees it wait.
	if _, err := completer.Exec(`SET LOCAL deadlock_timeout = '60s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := completer.Exec(`UPDATE outbox.jobs SET errors = errors WHERE id = $1`, job); err != nil {
		t.Fatal(err)
	}
	deleterDSN := dsn + " deadlock_timeout=5s" // a run-time parameter, in either of lib/pq's forms
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		q := u.Query()
		q.Set("deadlock_timeout", "5s")
		u.RawQuery = q.Encode()
		deleterDSN = u.String()
	}
	deleter, err := openDB(context.Background(), deleterDSN, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer deleter.Close()
	deleted := make(chan error, 1)
	go func() { deleted <- deleteEndpoint(context.Background(), deleter, ep.ID, testLogger(t)) }()
	waitFor(t, "the delete waiting for the job's lock", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%DELETE FROM outbox.endpoints%'`) == 1
	})
	// The completer now wants the endpoint the delete holds: a deadlock,
	// which the delete (waiting longer) detects and loses.
	if _, err := completer.Exec(`UPDATE outbox.endpoints SET failing_since = now() WHERE id = $1`, ep.ID); err != nil {
		t.Fatalf("the completer's side of the deadlock: %v", err)
	}
	if err := completer.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("delete after a deadlock: %v", err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints after the delete, want 0", n)
	}
}
