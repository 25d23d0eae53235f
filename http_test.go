// http_test.go: the HTTP surface's own promises, route by route: bad text
// refused cleanly, request ids, caching, sessions, and the server's
// timeouts and TLS.

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// noRedirect is a client that answers with the first response, so a test
// sees a redirect as the redirect.
func noRedirect(jar http.CookieJar) *http.Client {
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// signIn signs a browser in through the panel's form; its jar holds the
// session cookie.
func signIn(t *testing.T, srv *httptest.Server) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	browser := noRedirect(jar)
	resp, err := browser.PostForm(srv.URL+"/login", url.Values{"token": {testToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in = %d, want 303", resp.StatusCode)
	}
	return browser
}

// request is one request of a route table: the API's with the token, the
// panel's with a signed-in browser's cookie. body is the API's JSON or the
// panel's form.
type request struct {
	method, path string
	body         string
}

// send sends req and returns the answer with its body read.
func (req request) send(t *testing.T, srv *httptest.Server, browser *http.Client) (*http.Response, []byte) {
	t.Helper()
	r, err := http.NewRequest(req.method, srv.URL+req.path, strings.NewReader(req.body))
	if err != nil {
		t.Fatal(err)
	}
	client := browser
	if strings.HasPrefix(req.path, "/api/") {
		r.Header.Set("Authorization", "Bearer "+testToken)
		client = noRedirect(nil)
	} else if req.body != "" {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := client.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// Text PostgreSQL cannot hold (invalid UTF-8, NUL) in a query parameter,
// a path value or a form field is the client's mistake: a 400, or a 404
// for a path naming what cannot exist, answered as every refusal is, and
// not logged as the server's error.
func TestBadTextIsRefusedNotFailed(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var logs syncBuffer
	srv := newTestServerLogging(t, db, testPolicy, slog.New(slog.NewTextHandler(&logs, nil)))
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook")
	if code := apiCall(t, srv, "POST", "/api/sources", `{"name": "shop"}`, nil); code != http.StatusCreated {
		t.Fatalf("create source: %d", code)
	}
	browser := signIn(t, srv)
	endpoint := fmt.Sprintf("/endpoints/%d", id)
	goodEndpoint := "url=http%3A%2F%2F127.0.0.1%3A1%2Fhook&topics=t"

	for _, tc := range []struct {
		request
		want int
	}{
		{request{"GET", "/api/events?subject=%ff", ""}, 400},
		{request{"GET", "/api/events?subject=a%00b", ""}, 400},
		{request{"GET", "/api/events?topic=%ff", ""}, 400},
		{request{"GET", "/api/events?state=%ff", ""}, 400},
		{request{"GET", "/api/jobs?state=%ff", ""}, 400},
		{request{"GET", "/api/subjects?prefix=%ff", ""}, 400},
		{request{"GET", "/api/subjects?after=%ff", ""}, 400},
		{request{"GET", "/api/subjects?after=a%00", ""}, 400},
		{request{"DELETE", "/api/sources/%ff", ""}, 404},
		{request{"DELETE", "/api/sources/%00", ""}, 404},
		{request{"POST", "/api/sources/%ff/rotate-secret", ""}, 404},
		{request{"GET", "/events?subject=%ff", ""}, 400},
		{request{"GET", "/events?topic=a%00", ""}, 400},
		{request{"GET", "/jobs?state=%ff", ""}, 400},
		{request{"GET", "/subjects?prefix=%ff", ""}, 400},
		{request{"GET", "/subjects?after=%00", ""}, 400},
		{request{"POST", "/endpoints", goodEndpoint + "&description=%ff"}, 400},
		{request{"POST", "/endpoints", goodEndpoint + "&owner_email=a%00%40example.com"}, 400},
		{request{"POST", endpoint + "/edit", goodEndpoint + "&description=a%00b"}, 400},
		{request{"POST", endpoint + "/disable", "reason=%ff"}, 400},
		{request{"POST", endpoint + "/replay", "since=%ff"}, 400},
		{request{"POST", "/sources", "name=billing&topic_prefix=%ff"}, 400},
		{request{"POST", "/sources", "name=billing&secret=whsec_%00"}, 400},
		{request{"POST", "/sources/%ff/delete", ""}, 404},
		{request{"POST", "/sources/%00/rotate-secret", ""}, 404},
	} {
		resp, body := tc.send(t, srv, browser)
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s %s = %d, want %d: %s", tc.method, tc.path, tc.body, resp.StatusCode, tc.want, body)
			continue
		}
		if strings.HasPrefix(tc.path, "/api/") {
			var answer struct{ Error string }
			if err := json.Unmarshal(body, &answer); err != nil || answer.Error == "" {
				t.Errorf("%s %s: answer %q, want {\"error\": ...}", tc.method, tc.path, body)
			}
		} else if !strings.Contains(string(body), "<title>Error · outboxd</title>") {
			t.Errorf("%s %s %s: not the panel's error page:\n%s", tc.method, tc.path, tc.body, body)
		}
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("refusals logged as the server's errors:\n%s", logs.String())
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 1 {
		t.Errorf("%d endpoints after refused forms, want the 1 created", n)
	}
}

// Every answer carries a request id, a sane one the client sent or one made
// here, and the log line of a 5xx names it, so an operator finds the
// failure a client reports.
func TestRequestIDIsAnsweredAndLoggedWithA5xx(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var logs syncBuffer
	srv := newTestServerLogging(t, db, testPolicy, slog.New(slog.NewTextHandler(&logs, nil)))
	mustExec(t, db, `DROP TABLE outbox.subjects`) // every read of the index now fails

	get := func(path, id string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Request-Id")
	}

	if status, id := get("/api/subjects", "trace-7f3a.9:b_c"); status != 500 || id != "trace-7f3a.9:b_c" {
		t.Errorf("a sane incoming id: %d with id %q, want 500 with the id sent", status, id)
	}
	if !strings.Contains(logs.String(), "request_id=trace-7f3a.9:b_c") {
		t.Errorf("the 500's log line does not name its request id:\n%s", logs.String())
	}
	for _, insane := range []string{strings.Repeat("a", 65), "two words", `quote"d`, "line\tbreak"} {
		status, id := get("/api/subjects", insane)
		if status != 500 || id == "" || id == insane {
			t.Errorf("incoming id %q: %d with id %q, want 500 with an id made here", insane, status, id)
			continue
		}
		if !strings.Contains(logs.String(), "request_id="+id+" ") {
			t.Errorf("the 500 answered with id %q is not logged with it:\n%s", id, logs.String())
		}
	}
	_, first := get("/healthz", "")
	_, second := get("/healthz", "")
	if first == "" || first == second {
		t.Errorf("ids made for two requests: %q and %q, want two different ids", first, second)
	}
}

// No panel page and no API answer is kept by a browser or a proxy, above
// all those that show a secret; the static assets may be.
func TestAnswersAreNotStoredButAssetsMayBe(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook")
	mustExec(t, db, `INSERT INTO outbox.events (topic) VALUES ('t')`)
	browser := signIn(t, srv)
	endpoint := fmt.Sprintf("/endpoints/%d", id)

	for _, req := range []request{
		{"GET", "/", ""},
		{"GET", "/login", ""},
		{"GET", "/events", ""},
		{"GET", "/events/1", ""},
		{"GET", "/endpoints", ""},
		{"GET", endpoint, ""},
		{"POST", "/endpoints", "url=http%3A%2F%2F127.0.0.1%3A2%2Fhook"}, // shows the new secret
		{"POST", endpoint + "/rotate-secret", ""},                       // shows the new secret
		{"POST", endpoint + "/enable", ""},                              // a redirect
		{"GET", "/jobs", ""},
		{"GET", "/subjects", ""},
		{"GET", "/sources", ""},
		{"POST", "/sources", "name=billing"}, // shows the new secret
		{"GET", "/events/999", ""},           // the error page
		{"GET", "/api/overview", ""},
		{"GET", "/api/events", ""},
		{"GET", "/api/events/1", ""},
		{"GET", "/api/endpoints", ""},
		{"GET", "/api" + endpoint, ""},
		{"POST", "/api/endpoints", `{"url": "http://127.0.0.1:3/hook"}`}, // the new secret
		{"POST", "/api" + endpoint + "/rotate-secret", ""},               // the new secret
		{"POST", "/api/sources", `{"name": "shop"}`},                     // the new secret
		{"POST", "/api/sources/shop/rotate-secret", ""},                  // the new secret
		{"GET", "/api/sources", ""},
		{"GET", "/api/subjects", ""},
		{"GET", "/api/no-such-route", ""},
		{"GET", "/metrics", ""},
		{"GET", "/healthz", ""},
	} {
		resp, _ := req.send(t, srv, browser)
		if got := resp.Header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("%s %s: %d with Cache-Control %q, want no-store", req.method, req.path, resp.StatusCode, got)
		}
	}
	resp, err := http.Get(srv.URL + "/static/style.css")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Cache-Control"); resp.StatusCode != 200 || got != "max-age=3600" {
		t.Errorf("GET /static/style.css: %d with Cache-Control %q, want 200 with max-age=3600", resp.StatusCode, got)
	}
}
