// signin_test.go: who may sign in, and for how long: the token's rules at
// start, the sessions of a token that changed, the cookie's flags behind
// a proxy, and the throttle on wrong tokens.

package main

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startProcess runs outboxd on dsn with token and the settings in env,
// as a restart would, until the returned stop is called; it returns the
// address it serves.
func startProcess(t *testing.T, dsn, token string, env map[string]string) (addr string, stop func()) {
	t.Helper()
	addr = freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	vars := map[string]string{"DATABASE_URL": dsn}
	for k, v := range env {
		vars[k] = v
	}
	go func() {
		defer close(exited)
		err := run(ctx, []string{"-addr", addr, "-admin-token", token}, envFrom(vars), io.Discard, testWriter{t})
		if err != nil {
			t.Errorf("run with a token: %v", err)
		}
	}()
	awaitHealthy(t, addr, exited)
	return addr, func() { cancel(); <-exited }
}

// sessionCookieOf signs in to addr with token and returns the session
// cookie's value.
func sessionCookieOf(t *testing.T, addr, token string) string {
	t.Helper()
	resp, err := noRedirect(nil).PostForm("http://"+addr+"/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie && c.Value != "" {
			return c.Value
		}
	}
	t.Fatalf("sign-in to %s: %d and no session cookie", addr, resp.StatusCode)
	return ""
}

// statusWithCookie is the status of GET path on addr with the session
// cookie only.
func statusWithCookie(t *testing.T, addr, path, cookie string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	req.AddCookie(&http.Cookie{Name: sessionCookie, Value: cookie})
	resp, err := noRedirect(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A session belongs to the token it was signed in under: a restart with
// the same token keeps it, and one with another token ends it for good,
// so that going back to the first token does not revive it.
func TestChangedTokenEndsSessionsForGood(t *testing.T) {
	t.Parallel()
	_, dsn := newTestDB(t)
	const tokenA = "first-admin-token-0123456789"
	const tokenB = "second-admin-token-9876543210"

	addr, stop := startProcess(t, dsn, tokenA, nil)
	cookie := sessionCookieOf(t, addr, tokenA)
	if got := statusWithCookie(t, addr, "/api/overview", cookie); got != http.StatusOK {
		t.Fatalf("the fresh session, GET /api/overview: %d, want 200", got)
	}
	stop()

	addr, stop = startProcess(t, dsn, tokenA, nil)
	if got := statusWithCookie(t, addr, "/api/overview", cookie); got != http.StatusOK {
		t.Errorf("after a restart with the same token, GET /api/overview: %d, want 200", got)
	}
	stop()

	addr, stop = startProcess(t, dsn, tokenB, nil)
	if got := statusWithCookie(t, addr, "/api/overview", cookie); got != http.StatusUnauthorized {
		t.Errorf("after a restart with another token, GET /api/overview: %d, want 401", got)
	}
	stop()

	addr, stop = startProcess(t, dsn, tokenA, nil)
	defer stop()
	if got := statusWithCookie(t, addr, "/api/overview", cookie); got != http.StatusUnauthorized {
		t.Errorf("back to the first token, the first session, GET /api/overview: %d, want 401", got)
	}
	if got := statusWithCookie(t, addr, "/", cookie); got != http.StatusSeeOther {
		t.Errorf("back to the first token, the first session, GET /: %d, want 303 to sign in", got)
	}
	if got := statusWithCookie(t, addr, "/api/overview", sessionCookieOf(t, addr, tokenA)); got != http.StatusOK {
		t.Errorf("a new sign-in with the first token, GET /api/overview: %d, want 200", got)
	}
}

// A weak admin token refuses to start, with a message that names the
// setting and never the token: the deploy example's placeholder, a short
// one, one of few kinds of characters, one character repeated. A
// generated one, the tests' and those of the usual generators start.
func TestWeakAdminTokensRefuseToStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, token string
		want        string // in the error; "" starts
	}{
		{"the deploy example's placeholder", "change-me-to-32-random-characters", "placeholder"},
		{"a placeholder in capitals", "CHANGEME-CHANGEME-CHANGEME-1234", "placeholder"},
		{"one letter repeated", "aaaaaaaaaaaaaaaa", "bits"},
		{"one letter repeated, long", strings.Repeat("a", 64), "more than a third"},
		{"two letters alternating", strings.Repeat("ab", 32), "more than a third"},
		{"short", "Xy7-Qp2!", "bits"},
		{"digits only, 38", "12345678901234567890123456789012345678", "bits"},
		{"hex, 31 digits: 124 bits", "0123456789abcdef0123456789abcde", "bits"},
		{"letters only, 27", "thequickbrownfoxjumpsoverth", "bits"},
		{"hex, 32 digits (openssl rand -hex 16)", "9f86d081884c7d659a2feaa0c55ad015", ""},
		{"hex, 48 digits (generated)", randomToken(), ""},
		{"base64 of 32 bytes (openssl rand -base64 32)", "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=", ""},
		{"letters and digits, 22", "k3Jq9ZxT2mLw8RvN5bYc7H", ""},
		{"the tests' token", testToken, ""},
		{"the faults test's token", faultAdminToken, ""},
		{"the upgrade test's token", upgradeAdminToken, ""},
		{"-starts-with-a-dash", "-starts-with-a-dash-0123", ""},
	} {
		_, err := parseConfig(nil, envFrom(map[string]string{"OUTBOXD_ADMIN_TOKEN": tc.token}), io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want it to start", tc.name, err)
		case tc.want == "":
		case err == nil:
			t.Errorf("%s: starts, want it refused", tc.name)
		case !strings.Contains(err.Error(), "-admin-token (OUTBOXD_ADMIN_TOKEN)") || !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: %v, want the setting named and %q", tc.name, err, tc.want)
		case strings.Contains(err.Error(), tc.token):
			t.Errorf("%s: the error quotes the token: %v", tc.name, err)
		}
	}
}

// signInFrom posts token to the sign-in form of srv as if from host (the
// Host header) with extra headers, and returns the answer, its body read.
func signInFrom(t *testing.T, base, host, token string, header map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Host = host
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// cookieFlags is the session cookie's Secure flag, and the HSTS header,
// of a sign-in's answer.
func cookieFlags(t *testing.T, resp *http.Response) (secure bool, hsts string) {
	t.Helper()
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie {
			return c.Secure, resp.Header.Get("Strict-Transport-Security")
		}
	}
	t.Fatalf("sign-in answered %d without a session cookie", resp.StatusCode)
	return false, ""
}

// Behind a proxy that terminates TLS, outboxd is served plain HTTP under
// a public name: the session cookie is Secure, and HSTS sent, when
// -public-url is https, or when a trusted proxy says https; never on a
// proxy's word that is not trusted.
func TestSessionCookieIsSecureBehindATLSProxy(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	const host = "outboxd.example.com"
	const hsts = "max-age=31536000" // a year
	https := map[string]string{"X-Forwarded-Proto": "https"}
	for _, tc := range []struct {
		name      string
		publicURL string
		trusted   string
		header    map[string]string
		secure    bool
	}{
		{"no public URL, no proxy trusted", "", "", nil, false},
		{"public URL https", "https://" + host, "", nil, true},
		{"public URL http", "http://" + host, "", nil, false},
		{"a trusted proxy says https", "", "127.0.0.0/8", https, true},
		{"a trusted proxy says http", "", "127.0.0.0/8", map[string]string{"X-Forwarded-Proto": "http"}, false},
		{"an untrusted peer says https", "", "10.0.0.0/8", https, false},
	} {
		a := testAdmin(t, db, testPolicy, testLogger(t), nil)
		a.publicURL, _ = parsePublicURL(tc.publicURL)
		if err := a.trustedProxies.Set(tc.trusted); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(routes(a))
		secure, gotHSTS := cookieFlags(t, signInFrom(t, srv.URL, host, testToken, tc.header))
		srv.Close()
		if want := map[bool]string{true: hsts}[tc.secure]; secure != tc.secure || gotHSTS != want {
			t.Errorf("%s: cookie Secure %v, Strict-Transport-Security %q; want %v and %q", tc.name, secure, gotHSTS, tc.secure, want)
		}
	}

	// The image's way: plain HTTP beyond loopback, the public URL set.
	addr, stop := startProcess(t, dsn, testToken, map[string]string{"OUTBOXD_PUBLIC_URL": "https://" + host + "/"})
	defer stop()
	if secure, gotHSTS := cookieFlags(t, signInFrom(t, "http://"+addr, host, testToken, nil)); !secure || gotHSTS != hsts {
		t.Errorf("outboxd with OUTBOXD_PUBLIC_URL=https://%s/: cookie Secure %v, Strict-Transport-Security %q; want Secure and %q", host, secure, gotHSTS, hsts)
	}
}

// -public-url is an absolute http(s) URL of outboxd's root, and
// -trusted-proxies a list of addresses and prefixes; anything else
// refuses to start, naming the setting.
func TestPublicURLAndTrustedProxiesAreValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want string // in the error; "" starts
	}{
		{map[string]string{"OUTBOXD_PUBLIC_URL": "https://outboxd.example.com"}, ""},
		{map[string]string{"OUTBOXD_PUBLIC_URL": "http://10.0.0.5:8080/"}, ""},
		{map[string]string{"OUTBOXD_PUBLIC_URL": "outboxd.example.com"}, "-public-url (OUTBOXD_PUBLIC_URL) must be an absolute http or https URL"},
		{map[string]string{"OUTBOXD_PUBLIC_URL": "ftp://outboxd.example.com"}, "-public-url (OUTBOXD_PUBLIC_URL)"},
		{map[string]string{"OUTBOXD_PUBLIC_URL": "https://"}, "-public-url (OUTBOXD_PUBLIC_URL)"},
		{map[string]string{"OUTBOXD_PUBLIC_URL": "https://outboxd.example.com/outboxd"}, "-public-url (OUTBOXD_PUBLIC_URL)"},
		{map[string]string{"OUTBOXD_PUBLIC_URL": "https://user:pass@outboxd.example.com"}, "-public-url (OUTBOXD_PUBLIC_URL)"},
		{map[string]string{"OUTBOXD_PUBLIC_URL": "https://outboxd.example.com/?a=b"}, "-public-url (OUTBOXD_PUBLIC_URL)"},
		{map[string]string{"OUTBOXD_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.1.7,fd00::/8"}, ""},
		{map[string]string{"OUTBOXD_TRUSTED_PROXIES": "10.0.0.0/8,proxy.internal"}, `OUTBOXD_TRUSTED_PROXIES="10.0.0.0/8,proxy.internal": "proxy.internal" is neither an address nor a CIDR prefix`},
		{map[string]string{"OUTBOXD_TRUSTED_PROXIES": "10.0.0.0/33"}, "OUTBOXD_TRUSTED_PROXIES"},
	} {
		cfg, err := parseConfig(nil, envFrom(tc.env), io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v, want it to start", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error containing %q", tc.env, err, tc.want)
		case tc.want == "" && tc.env["OUTBOXD_TRUSTED_PROXIES"] != "":
			if got := cfg.TrustedProxies.String(); got != "10.0.0.0/8,192.168.1.7/32,fd00::/8" {
				t.Errorf("trusted proxies %q, want 10.0.0.0/8,192.168.1.7/32,fd00::/8", got)
			}
		}
	}
}

// throttleTestServer serves the real routes behind a proxy at 127.0.0.1
// that is trusted to name each request's client in X-Forwarded-For, with
// the throttle's clock standing still at the returned time's value.
func throttleTestServer(t *testing.T, db *sql.DB) (*httptest.Server, *admin, *time.Time) {
	t.Helper()
	a := testAdmin(t, db, testPolicy, testLogger(t), nil)
	if err := a.trustedProxies.Set("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a.auth.now = func() time.Time { return now }
	srv := httptest.NewServer(routes(a))
	t.Cleanup(srv.Close)
	return srv, a, &now
}

// bearerFrom sends GET /api/overview with token as from client, and
// returns the status and Retry-After.
func bearerFrom(t *testing.T, srv *httptest.Server, client, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+"/api/overview", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Forwarded-For", client)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// metricSample is the value of one sample line of /metrics, read with
// the admin token from an address that never failed.
func metricSample(t *testing.T, srv *httptest.Server, sample string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("X-Forwarded-For", "192.0.2.200")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	t.Fatalf("/metrics (%d) has no sample %s", resp.StatusCode, sample)
	return ""
}

// A burst of wrong tokens from one address is refused with 429 and
// Retry-After after 10, unchecked, a right token from it included, while
// another address signs in at once, and sessions already signed in go on;
// the budget refills one try every 6 s. Every wrong token is counted, and
// 50 within the alert's window fire auth_failures.
func TestWrongTokensAreThrottledPerAddress(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv, a, now := throttleTestServer(t, db)
	const attacker, operator = "203.0.113.7", "198.51.100.20"
	earlier := signInFrom(t, srv.URL, "", testToken, map[string]string{"X-Forwarded-For": attacker})

	for i := range 10 {
		if status, _ := bearerFrom(t, srv, attacker, "wrong-token-"+strconv.Itoa(i)); status != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, status)
		}
	}
	if status, retry := bearerFrom(t, srv, attacker, "wrong-token-10"); status != http.StatusTooManyRequests || retry != "6" {
		t.Errorf("the 11th wrong token: %d, Retry-After %q; want 429 and 6", status, retry)
	}
	if status, _ := bearerFrom(t, srv, attacker, testToken); status != http.StatusTooManyRequests {
		t.Errorf("the right token from the throttled address: %d, want 429, unchecked", status)
	}
	if resp := signInFrom(t, srv.URL, "", testToken, map[string]string{"X-Forwarded-For": attacker}); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a sign-in from the throttled address: %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if status, _ := bearerFrom(t, srv, operator, testToken); status != http.StatusOK {
		t.Errorf("the right token from another address: %d, want 200", status)
	}
	if resp := signInFrom(t, srv.URL, "", testToken, map[string]string{"X-Forwarded-For": operator}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a sign-in from another address: %d, want 303", resp.StatusCode)
	}
	for _, c := range earlier.Cookies() {
		req, _ := http.NewRequest("GET", srv.URL+"/api/overview", nil)
		req.AddCookie(c)
		req.Header.Set("X-Forwarded-For", attacker)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("a session signed in before, from the throttled address: %d, want 200", resp.StatusCode)
		}
	}

	*now = now.Add(6 * time.Second) // one try back
	if status, _ := bearerFrom(t, srv, attacker, testToken); status != http.StatusOK {
		t.Errorf("the right token 6 s later: %d, want 200", status)
	}

	for sample, want := range map[string]string{
		`outboxd_auth_failures_total{via="bearer"}`:   "10",
		`outboxd_auth_failures_total{via="sign_in"}`:  "0",
		`outboxd_auth_throttled_total{via="bearer"}`:  "2",
		`outboxd_auth_throttled_total{via="sign_in"}`: "1",
	} {
		if got := metricSample(t, srv, sample); got != want {
			t.Errorf("%s = %s, want %s", sample, got, want)
		}
	}
	alerting := func() bool {
		var o Overview
		if status := apiCall(t, srv, "GET", "/api/overview", "", &o); status != http.StatusOK {
			t.Fatalf("GET /api/overview: %d", status)
		}
		return slices.Contains(alertNamesOf(o.Alerts), "auth_failures")
	}
	if alerting() {
		t.Error("auth_failures fires after 13 wrong tokens, want 50")
	}
	for i := range 37 { // 13 + 37 = 50, from addresses of their own
		bearerFrom(t, srv, "192.0.2."+strconv.Itoa(i/5+1), "wrong")
	}
	if !alerting() {
		t.Errorf("auth_failures does not fire after 50 wrong tokens (%d counted)", a.auth.recentFailures())
	}
}

// Without a trusted proxy, X-Forwarded-For is the client's own word: a
// guesser writing a new address into it each time keeps its own budget.
func TestForwardedForFromAnUntrustedPeerIsIgnored(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	a := testAdmin(t, db, testPolicy, testLogger(t), nil)
	now := time.Now()
	a.auth.now = func() time.Time { return now }
	srv := httptest.NewServer(routes(a))
	defer srv.Close()
	for i := range 10 {
		if status, _ := bearerFrom(t, srv, "203.0.113."+strconv.Itoa(i+1), "wrong"); status != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, status)
		}
	}
	if status, _ := bearerFrom(t, srv, "203.0.113.99", "wrong"); status != http.StatusTooManyRequests {
		t.Errorf("the 11th wrong token, under yet another forwarded address: %d, want 429", status)
	}
}

// The throttle remembers at most maxAuthBudgets addresses, forgetting
// the one that failed longest ago, and forgets each once its budget has
// refilled: a flood of addresses cannot grow it.
func TestThrottleForgetsAddresses(t *testing.T) {
	t.Parallel()
	l := newAuthLimiter(newAuthMetrics(), testLogger(t))
	now := time.Now()
	l.now = func() time.Time { return now }
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
	for range 10 {
		l.check(addr(0), authViaBearer, false)
	}
	if v, _ := l.check(addr(0), authViaBearer, true); v != tokenThrottled {
		t.Fatalf("the first address after 10 wrong tokens: verdict %d, want throttled", v)
	}
	for i := 1; i <= 10_000; i++ {
		l.check(addr(i), authViaBearer, false)
	}
	if n := len(l.budgets); n != 10_000 || l.order.Len() != 10_000 {
		t.Errorf("%d addresses remembered (%d in order), want 10,000", n, l.order.Len())
	}
	if v, _ := l.check(addr(0), authViaBearer, true); v != tokenAccepted {
		t.Errorf("the address that failed longest ago, past the bound: verdict %d, want it forgotten and accepted", v)
	}
	now = now.Add(10 * 6 * time.Second)
	l.check(addr(1), authViaBearer, false)
	if n := len(l.budgets); n != 1 {
		t.Errorf("%d addresses remembered once every budget refilled, want 1", n)
	}
	// IPv6 addresses share the budget of their /64.
	for i := range 10 {
		l.check(netip.MustParseAddr("2001:db8::"+strconv.Itoa(i+1)), authViaSignIn, false)
	}
	if v, _ := l.check(netip.MustParseAddr("2001:db8::ffff"), authViaSignIn, true); v != tokenThrottled {
		t.Errorf("another address of the same /64: verdict %d, want throttled", v)
	}
}

// auth_failures fires at 50 wrong tokens within its window, not at 49.
func TestAuthFailuresAlertThreshold(t *testing.T) {
	t.Parallel()
	for _, n := range []int64{49, 50} {
		cfg := defaultConfig().Alerts
		cfg.AuthFailures = func() int64 { return n }
		got := slices.Contains(alertNamesOf(evaluateAlerts(cfg, Overview{}, alertStarts{})), "auth_failures")
		if got != (n >= 50) {
			t.Errorf("%d wrong tokens: auth_failures firing %v", n, got)
		}
	}
}
