// http_test.go: the HTTP surface's own promises, route by route: bad text
// refused cleanly, request ids, caching, sessions, and the server's
// timeouts and TLS.

package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// noRedirect is a client that answers with the first response, so a test
// sees a redirect as the redirect.
func noRedirect(jar http.CookieJar) *http.Client {
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// signIn signs a browser in through the panel's form with the admin's
// token; its jar holds the session cookie.
func signIn(t *testing.T, srv *httptest.Server) *http.Client {
	t.Helper()
	return signInAs(t, srv, testToken)
}

// signInAs signs a browser in through the form with token.
func signInAs(t *testing.T, srv *httptest.Server, token string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	browser := noRedirect(jar)
	resp, err := browser.PostForm(srv.URL+"/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in = %d, want 303", resp.StatusCode)
	}
	return browser
}

// panelPage signs a browser in and reads one panel page: its status and
// its HTML.
func panelPage(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := signIn(t, srv).Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(page)
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
	srv, logs := newFailingTestServer(t)

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
		{"POST", endpoint + "/rotate-secret", "confirm=yes"},            // shows the new secret
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

// serveForTest runs serve, as run does, on a loopback port until t ends,
// and returns the address.
func serveForTest(t *testing.T, handler http.Handler) string {
	t.Helper()
	return serveForTestWith(t, newHTTPServer(handler, testLogger(t)), Config{ShutdownGrace: time.Second})
}

// serveShortLimitsForTest serves handler through the production server
// with its time limits cut to fractions of a second, so that a test sees
// each one enforced without waiting minutes; TestHTTPServerLimits pins
// the production values.
func serveShortLimitsForTest(t *testing.T, handler http.Handler) string {
	t.Helper()
	srv := newHTTPServer(handler, testLogger(t))
	srv.ReadHeaderTimeout, srv.ReadTimeout, srv.IdleTimeout = 300*time.Millisecond, 600*time.Millisecond, 300*time.Millisecond
	return serveForTestWith(t, srv, Config{ShutdownGrace: time.Second})
}

// serveForTestWith serves srv with cfg's HTTP settings.
func serveForTestWith(t *testing.T, srv *http.Server, cfg Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, srv, cfg, "outboxd ready", testLogger(t), io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// trickleUntilCut sends head, then piece every 100 ms, as a slow-loris
// client does, and returns once the server has closed the connection. It
// fails the test if the server keeps it open for longer than within, a
// bound far above the server's own.
func trickleUntilCut(t *testing.T, addr, head, piece string, within time.Duration) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cut := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, conn) // until the server closes it: EOF (nil) or a reset
		cut <- err
	}()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	pace := time.NewTicker(100 * time.Millisecond) // the trickle's pace, not a wait for anything
	defer pace.Stop()
	giveUp := time.After(within)
	for {
		select {
		case err := <-cut:
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("reading the connection: %v, want it closed by the server", err)
			}
			return
		case <-pace.C:
			io.WriteString(conn, piece) // fails once the server has closed it; cut says so
		case <-giveUp:
			t.Fatalf("the server kept a trickling connection open for %s", within)
		}
	}
}

// The limits of the server outboxd runs, as literals: every test below
// runs the same server with shorter ones.
func TestHTTPServerLimits(t *testing.T) {
	t.Parallel()
	srv := newHTTPServer(http.NotFoundHandler(), testLogger(t))
	for _, l := range []struct {
		name      string
		got, want any
	}{
		{"read header timeout", srv.ReadHeaderTimeout, 10 * time.Second},
		{"read timeout", srv.ReadTimeout, 30 * time.Second},
		{"write timeout", srv.WriteTimeout, 75 * time.Second},
		{"idle timeout", srv.IdleTimeout, 2 * time.Minute},
		{"header bytes", srv.MaxHeaderBytes, 64 << 10},
		{"request deadline", requestTimeout, time.Minute},
	} {
		if l.got != l.want {
			t.Errorf("%s %v, want %v", l.name, l.got, l.want)
		}
	}
	if srv.WriteTimeout <= requestTimeout {
		t.Errorf("write timeout %s is not above the request deadline %s: a 503 for an overrun would be cut", srv.WriteTimeout, requestTimeout)
	}
}

// A client that trickles its headers or its body is cut by the server
// serve runs, and an oversized header block is refused.
func TestSlowClientsAreCut(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	addr := serveShortLimitsForTest(t, testRoutes(t, db, testPolicy, testLogger(t), nil))
	mustExec(t, db, `INSERT INTO outbox.inbox_sources (name, secret, topic_prefix) VALUES ('shop', '\x01', 'shop.')`)

	t.Run("headers trickled", func(t *testing.T) {
		t.Parallel()
		trickleUntilCut(t, addr, "GET /healthz HTTP/1.1\r\nHost: outboxd\r\n", "X-Trickle: 1\r\n", 30*time.Second)
	})
	t.Run("body trickled", func(t *testing.T) {
		t.Parallel()
		trickleUntilCut(t, addr, "POST /webhooks/shop HTTP/1.1\r\nHost: outboxd\r\nContent-Type: application/json\r\n"+
			"Content-Length: 100000\r\n\r\n{", " ", 30*time.Second)
	})
	t.Run("headers too large", func(t *testing.T) {
		t.Parallel()
		req, _ := http.NewRequest("GET", "http://"+addr+"/healthz", nil)
		req.Header.Set("X-Large", strings.Repeat("a", 100<<10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("100 KiB of headers: %d, want 431", resp.StatusCode)
		}
	})
}

// A connection kept alive and left idle is closed by the server.
func TestIdleConnectionIsClosed(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	addr := serveShortLimitsForTest(t, testRoutes(t, db, testPolicy, testLogger(t), nil))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: outboxd\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /healthz: %d, closing %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // far above the server's bound
	if n, err := r.Read(make([]byte, 1)); n != 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
		t.Errorf("reading an idle kept-alive connection: %d bytes, %v; want it closed by the server", n, err)
	}
}

// A handler that outruns the request deadline is stopped and answers 503,
// logged once with its request id, so the answer is written before the
// server's write timeout cuts the connection.
func TestRequestOutrunningItsDeadlineAnswers503(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var logs syncBuffer
	a := testAdmin(t, db, testPolicy, slog.New(slog.NewTextHandler(&logs, nil)), nil)
	a.requestTimeout = 500 * time.Millisecond
	addr := serveForTest(t, routes(a))
	mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret) VALUES ('https://hooks.example/x', decode(repeat('ab', 32), 'hex'))`)
	// The PATCH waits for this row lock until its deadline ends it.
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`SELECT 1 FROM outbox.endpoints FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	req, _ := http.NewRequest("PATCH", "http://"+addr+"/api/endpoints/1", strings.NewReader(`{"description": "waits"}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("X-Request-Id", "slow-patch")
	client := &http.Client{Timeout: 30 * time.Second} // far above the server's bound
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "request took longer than 500ms") {
		t.Errorf("PATCH held by a row lock: %d %s, want 503 saying the request took too long", resp.StatusCode, body)
	}
	if lines := strings.Split(strings.TrimSpace(logs.String()), "\n"); len(lines) != 1 ||
		!strings.Contains(lines[0], "level=ERROR") || !strings.Contains(lines[0], "request_id=slow-patch") || !strings.Contains(lines[0], "status=503") {
		t.Errorf("log after the 503:\n%s\nwant one ERROR line with its request id", logs.String())
	}
}

// On an address beyond loopback outboxd serves HTTPS or is told it may
// not (a proxy in front terminates TLS), and never with a token it made up
// and logged; each refusal names the settings.
func TestParseConfigGuardsPublicAddresses(t *testing.T) {
	t.Parallel()
	token := "OUTBOXD_ADMIN_TOKEN=" + testToken
	for _, tc := range []struct {
		env  []string
		want string // in the error; "" accepts
	}{
		{[]string{"OUTBOXD_TLS_CERT=cert.pem"}, "-tls-cert (OUTBOXD_TLS_CERT) and -tls-key (OUTBOXD_TLS_KEY) go together"},
		{[]string{"OUTBOXD_TLS_KEY=key.pem"}, "-tls-cert (OUTBOXD_TLS_CERT) and -tls-key (OUTBOXD_TLS_KEY) go together"},
		{[]string{"OUTBOXD_ADDR=0.0.0.0:8080", token}, "-addr (OUTBOXD_ADDR) 0.0.0.0:8080 is not a loopback address: " +
			"serve HTTPS with -tls-cert (OUTBOXD_TLS_CERT) and -tls-key (OUTBOXD_TLS_KEY), or give -insecure-http (OUTBOXD_INSECURE_HTTP)"},
		{[]string{"OUTBOXD_ADDR=:8080", token}, "-addr (OUTBOXD_ADDR) :8080 is not a loopback address"},
		{[]string{"OUTBOXD_ADDR=outboxd.internal:8080", token}, "-addr (OUTBOXD_ADDR) outboxd.internal:8080 is not a loopback address"},
		{[]string{"OUTBOXD_ADDR=[::]:8080", token}, "-addr (OUTBOXD_ADDR) [::]:8080 is not a loopback address"},
		{[]string{"OUTBOXD_ADDR=10.0.0.5:8080", "OUTBOXD_INSECURE_HTTP=1"}, "-addr (OUTBOXD_ADDR) 10.0.0.5:8080 is not a loopback address: " +
			"set -admin-token (OUTBOXD_ADMIN_TOKEN)"},
		{[]string{"OUTBOXD_ADDR=10.0.0.5:8080", "OUTBOXD_TLS_CERT=cert.pem", "OUTBOXD_TLS_KEY=key.pem"}, "set -admin-token (OUTBOXD_ADMIN_TOKEN)"},
		{[]string{"OUTBOXD_ADDR=0.0.0.0:8080", token, "OUTBOXD_INSECURE_HTTP=1"}, ""},
		{[]string{"OUTBOXD_ADDR=0.0.0.0:8080", token, "OUTBOXD_TLS_CERT=cert.pem", "OUTBOXD_TLS_KEY=key.pem"}, ""},
		{[]string{"OUTBOXD_ADDR=127.0.0.1:8080"}, ""},
		{[]string{"OUTBOXD_ADDR=localhost:8080"}, ""},
		{[]string{"OUTBOXD_ADDR=[::1]:8080"}, ""},
		{[]string{"OUTBOXD_ADDR=127.0.0.1:8443", "OUTBOXD_TLS_CERT=cert.pem", "OUTBOXD_TLS_KEY=key.pem"}, ""},
	} {
		env := map[string]string{}
		for _, kv := range tc.env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		_, err := parseConfig(nil, envFrom(env), io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v refused: %v", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error containing %q", tc.env, err, tc.want)
		}
	}
	cfg, err := parseConfig([]string{"-addr", "0.0.0.0:8443", "-admin-token", testToken, "-tls-cert", "c.pem", "-tls-key", "k.pem"}, envFrom(nil), io.Discard)
	if err != nil || cfg.TLSCert != "c.pem" || cfg.TLSKey != "k.pem" || cfg.InsecureHTTP {
		t.Errorf("TLS by flags: %+v, %v", cfg, err)
	}
}

// selfSignedCert writes a certificate for 127.0.0.1 and its key to files
// in dir, and returns their paths and the pool that trusts it.
func selfSignedCert(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "outboxd test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// With -tls-cert and -tls-key, serve answers HTTPS with that certificate,
// and the session cookie it sets is Secure.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	certFile, keyFile, roots := selfSignedCert(t, t.TempDir())
	addr := serveForTestWith(t, newHTTPServer(testRoutes(t, db, testPolicy, testLogger(t), nil), testLogger(t)),
		Config{ShutdownGrace: time.Second, TLSCert: certFile, TLSKey: keyFile})
	client := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	t.Cleanup(client.CloseIdleConnections)

	resp, err := client.Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || len(resp.TLS.PeerCertificates) != 1 ||
		resp.TLS.PeerCertificates[0].Subject.CommonName != "outboxd test" {
		t.Errorf("GET https://%s/healthz: %d, TLS %v; want 200 with the configured certificate", addr, resp.StatusCode, resp.TLS)
	}
	resp, err = client.PostForm("https://"+addr+"/login", url.Values{"token": {testToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if cookies := resp.Cookies(); len(cookies) != 1 || !cookies[0].Secure {
		t.Errorf("session cookie over TLS: %v, want one Secure cookie", cookies)
	}
	resp, err = http.Get("http://" + addr + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP is answered 200 on the TLS port")
		}
	}
}

// A certificate that cannot be loaded stops serve at once, naming the
// settings.
func TestServeRefusesUnreadableCertificate(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	cfg := Config{ShutdownGrace: time.Second, TLSCert: filepath.Join(dir, "missing.pem"), TLSKey: filepath.Join(dir, "missing-key.pem")}
	err = serve(context.Background(), ln, newHTTPServer(http.NotFoundHandler(), testLogger(t)), cfg, "outboxd ready", testLogger(t), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-tls-cert (OUTBOXD_TLS_CERT), -tls-key (OUTBOXD_TLS_KEY)") {
		t.Errorf("serve with a missing certificate: %v, want an error naming the settings", err)
	}
}

// copyOfCookie is a request client carrying only the session cookie jar
// holds for srv: a copy of it, taken elsewhere.
func copyOfCookie(t *testing.T, browser *http.Client, srv *httptest.Server) string {
	t.Helper()
	u, _ := url.Parse(srv.URL)
	for _, c := range browser.Jar.Cookies(u) {
		if c.Name == "outboxd_session" {
			return c.Value
		}
	}
	t.Fatal("no session cookie after sign-in")
	return ""
}

// withCookie sends a GET with the session cookie only and returns the
// status.
func withCookie(t *testing.T, srv *httptest.Server, path, cookie string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+path, nil)
	req.AddCookie(&http.Cookie{Name: "outboxd_session", Value: cookie})
	resp, err := noRedirect(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A panel session lives in the database: every replica honours it, and
// once signed out or expired, no replica does, a copy of the cookie
// included.
func TestSessionsAreRevocableOnEveryReplica(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	one, other := newTestAdmin(t, db), newTestAdmin(t, db) // two replicas
	browser := signIn(t, one)
	cookie := copyOfCookie(t, browser, one)
	if strings.Contains(cookie, testToken) {
		t.Fatal("the session cookie holds the token")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.panel_sessions WHERE id_hash <> decode($1, 'hex')`, cookie); n != 1 {
		t.Errorf("%d session rows not holding the cookie's id, want 1", n)
	}
	for _, srv := range []*httptest.Server{one, other} {
		if got := withCookie(t, srv, "/", cookie); got != http.StatusOK {
			t.Errorf("a copy of the cookie before sign-out, GET /: %d, want 200", got)
		}
		if got := withCookie(t, srv, "/api/overview", cookie); got != http.StatusOK {
			t.Errorf("a copy of the cookie before sign-out, GET /api/overview: %d, want 200", got)
		}
	}

	resp, err := browser.PostForm(one.URL+"/logout", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Errorf("sign-out: %d to %q, want 303 to /login", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, srv := range []*httptest.Server{one, other} {
		if got := withCookie(t, srv, "/", cookie); got != http.StatusSeeOther {
			t.Errorf("a copy of the cookie after sign-out, GET /: %d, want 303 to sign in", got)
		}
		if got := withCookie(t, srv, "/api/overview", cookie); got != http.StatusUnauthorized {
			t.Errorf("a copy of the cookie after sign-out, GET /api/overview: %d, want 401", got)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.panel_sessions`); n != 0 {
		t.Errorf("%d session rows after sign-out, want 0", n)
	}

	// An expired session is refused, though the browser still sends it.
	browser = signIn(t, other)
	again := copyOfCookie(t, browser, other)
	if again == cookie {
		t.Error("two sign-ins got the same session id")
	}
	if got := withCookie(t, one, "/", again); got != http.StatusOK {
		t.Fatalf("a fresh session: %d, want 200", got)
	}
	mustExec(t, db, `UPDATE outbox.panel_sessions SET expires_at = now() - interval '1 second'`)
	if got := withCookie(t, one, "/", again); got != http.StatusSeeOther {
		t.Errorf("an expired session, GET /: %d, want 303 to sign in", got)
	}
	if got := withCookie(t, one, "/api/overview", again); got != http.StatusUnauthorized {
		t.Errorf("an expired session, GET /api/overview: %d, want 401", got)
	}
}

// A session lasts 12 hours, and the sessions table stays bounded without a
// sweep: each sign-in deletes up to 100 expired sessions, oldest first,
// and the oldest live ones beyond 1,000.
func TestSignInKeepsSessionsBounded(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	mustExec(t, db, `INSERT INTO outbox.panel_sessions (id_hash, expires_at)
		SELECT sha256(('expired ' || i)::bytea), now() - i * interval '1 minute' FROM generate_series(1, 150) AS i`)
	mustExec(t, db, `INSERT INTO outbox.panel_sessions (id_hash, expires_at)
		SELECT sha256(('live ' || i)::bytea), now() + i * interval '1 second' FROM generate_series(1, 1000) AS i`)

	signIn(t, srv)
	count := func(where string) int {
		return queryInt(t, db, `SELECT count(*) FROM outbox.panel_sessions WHERE `+where)
	}
	if got := count(`expires_at <= now()`); got != 50 {
		t.Errorf("%d expired sessions after a sign-in among 150, want 50", got)
	}
	if got := count(`expires_at <= now() - interval '51 minutes'`); got != 0 {
		t.Errorf("%d of the 100 oldest expired sessions (51 to 150 minutes) left, want 0", got)
	}
	if got := count(`expires_at > now()`); got != 1000 {
		t.Errorf("%d live sessions after a sign-in among 1000, want 1000", got)
	}
	if got := count(`id_hash = sha256('live 1'::bytea)`); got != 0 {
		t.Error("the oldest live session outlived a sign-in past 1,000")
	}
	if got := count(`expires_at BETWEEN now() + interval '11 hours 59 minutes' AND now() + interval '12 hours'`); got != 1 { // the others end within 17 minutes
		t.Errorf("%d sessions expiring in 12 hours, want the new one", got)
	}
}

// Run by systemd as Type=notify, serve says READY=1 once it accepts and
// STOPPING=1 when it begins to shut down, on the socket it is given.
func TestServeTellsSystemdReadyAndStopping(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "notify")
	manager, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer manager.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	cfg := Config{ShutdownGrace: time.Second, NotifySocket: socket}
	go func() {
		served <- serve(ctx, ln, newHTTPServer(http.NotFoundHandler(), testLogger(t)), cfg, "outboxd ready", testLogger(t), io.Discard)
	}()

	read := func() string {
		t.Helper()
		manager.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 64)
		n, err := manager.Read(buf)
		if err != nil {
			t.Fatalf("read the notify socket: %v", err)
		}
		return string(buf[:n])
	}
	if got := read(); got != "READY=1" {
		t.Errorf("first notification %q, want READY=1", got)
	}
	cancel()
	if got := read(); got != "STOPPING=1" {
		t.Errorf("second notification %q, want STOPPING=1", got)
	}
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
}
