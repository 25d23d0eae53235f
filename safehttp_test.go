// Tests for the outbound HTTP client: its address guard, redirects and bounds.

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestForbiddenIPReason(t *testing.T) {
	t.Parallel()
	// Every address maps to the reason it is refused; "" means allowed.
	want := map[string]string{
		// Public: what a webhook is for.
		"8.8.8.8":              "",
		"1.1.1.1":              "",
		"93.184.215.14":        "",
		"100.63.255.255":       "", // just below CGNAT
		"100.128.0.0":          "", // just above CGNAT
		"172.15.255.255":       "", // just below RFC 1918
		"172.32.0.0":           "",
		"2606:4700::1111":      "",
		"2001:4860:4860::8888": "",
		"::ffff:8.8.8.8":       "",
		"64:ff9b::808:808":     "", // NAT64 of 8.8.8.8
		"2002:808:808::1":      "", // 6to4 of 8.8.8.8

		"127.0.0.1":        "loopback",
		"127.255.255.254":  "loopback",
		"::1":              "loopback",
		"0.0.0.0":          "unspecified",
		"::":               "unspecified",
		"0.1.2.3":          "in 0.0.0.0/8, this network (RFC 791)",
		"10.0.0.1":         "private (RFC 1918)",
		"172.16.0.1":       "private (RFC 1918)",
		"172.31.255.255":   "private (RFC 1918)",
		"192.168.1.1":      "private (RFC 1918)",
		"169.254.169.254":  "the cloud metadata service",
		"169.254.1.1":      "link-local",
		"fe80::1":          "link-local",
		"100.64.0.1":       "shared address space for carrier-grade NAT (RFC 6598)",
		"100.100.100.200":  "shared address space for carrier-grade NAT (RFC 6598)",
		"224.0.0.1":        "multicast",
		"ff02::1":          "multicast",
		"255.255.255.255":  "broadcast",
		"240.0.0.1":        "reserved (RFC 1112)",
		"fc00::1":          "unique local (RFC 4193)",
		"fd00:ec2::254":    "unique local (RFC 4193)",
		"fec0::1":          "site-local (deprecated, RFC 3879)",
		"198.18.0.1":       "benchmarking (RFC 2544)",
		"198.19.255.255":   "benchmarking (RFC 2544)",
		"2001:2::1":        "benchmarking (RFC 5180)",
		"192.0.0.192":      "reserved for IETF protocol assignments (RFC 6890)",
		"192.0.2.1":        "documentation (RFC 5737)",
		"198.51.100.1":     "documentation (RFC 5737)",
		"203.0.113.1":      "documentation (RFC 5737)",
		"2001:db8::1":      "documentation (RFC 3849)",
		"3fff::1":          "documentation (RFC 9637)",
		"192.88.99.1":      "6to4 relay anycast (RFC 7526)",
		"168.63.129.16":    "the Azure platform endpoint",
		"100::1":           "discard-only (RFC 6666)",
		"::7f00:1":         "IPv4-compatible (deprecated, RFC 4291)",
		"2001::1":          "Teredo (RFC 4380)",
		"64:ff9b:1::a00:1": "local-use NAT64 (RFC 8215)",
		"4000::1":          "outside IPv6 global unicast 2000::/3",
		"fe80::1%eth0":     "scoped (has an IPv6 zone)",

		// Other spellings of internal IPv4 addresses.
		"::ffff:127.0.0.1":       "loopback",
		"::ffff:169.254.169.254": "the cloud metadata service",
		"64:ff9b::7f00:1":        "NAT64 for 127.0.0.1, which is loopback",
		"64:ff9b::a9fe:a9fe":     "NAT64 for 169.254.169.254, which is the cloud metadata service",
		"2002:7f00:1::":          "6to4 for 127.0.0.1, which is loopback",
		"2002:c0a8:101::1":       "6to4 for 192.168.1.1, which is private (RFC 1918)",
	}
	got := make(map[string]string, len(want))
	for s := range want {
		got[s] = forbiddenIPReason(netip.MustParseAddr(s))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("forbiddenIPReason mismatch (-want +got):\n%s", diff)
	}
	if reason := forbiddenIPReason(netip.Addr{}); reason == "" {
		t.Error("the zero netip.Addr is allowed, want refused")
	}
}

func TestValidateEndpointURL(t *testing.T) {
	t.Parallel()
	const (
		ok        = "ok"
		forbidden = "forbidden" // wraps errForbiddenAddress
		invalid   = "invalid"
	)
	outcome := func(raw string, allowPrivate bool) string {
		u, err := validateEndpointURL(raw, allowPrivate)
		switch {
		case err == nil && u != nil:
			return ok
		case errors.Is(err, errForbiddenAddress):
			return forbidden
		case err != nil:
			return invalid
		}
		return "nil url without error"
	}

	tests := []struct {
		raw          string
		allowPrivate bool
		want         string
	}{
		{"https://example.com/hook", false, ok},
		{"http://example.com:8080/a/b?c=d", false, ok},
		{"HTTPS://Example.COM/hook", false, ok},
		{"https://8.8.8.8/hook", false, ok},
		{"https://[2606:4700::1111]:8443/hook", false, ok},
		{"http://10.1.2.3.example.com/", false, ok}, // a name, checked when dialed
		{"http://127.0.0.1:8080/", true, ok},
		{"http://[::1]:8080/", true, ok},
		{"http://localhost:8080/", true, ok},

		{"http://127.0.0.1:8080/", false, forbidden},
		{"http://[::1]/", false, forbidden},
		{"http://[::]/", false, forbidden},
		{"http://0.0.0.0/", false, forbidden},
		{"http://10.1.2.3/", false, forbidden},
		{"http://172.16.0.1/", false, forbidden},
		{"http://192.168.1.1/", false, forbidden},
		{"http://169.254.169.254/latest/meta-data/", false, forbidden},
		{"http://100.64.0.1/", false, forbidden},
		{"http://[fe80::1]/", false, forbidden},
		{"http://[fd00::1]/", false, forbidden},
		{"http://[::ffff:127.0.0.1]/", false, forbidden},
		{"http://[::ffff:7f00:1]/", false, forbidden},
		{"http://[64:ff9b::7f00:1]/", false, forbidden},
		{"http://[2002:7f00:1::]/", false, forbidden},
		{"http://localhost/", false, forbidden},
		{"http://LocalHost./", false, forbidden},
		{"http://api.localhost/", false, forbidden},

		// Non-standard IPv4 spellings: refused even when private
		// endpoints are allowed, as ambiguous.
		{"http://2130706433/", false, invalid},
		{"http://2130706433/", true, invalid},
		{"http://0177.0.0.1/", false, invalid},
		{"http://0177.0.0.1/", true, invalid},
		{"http://127.1/", false, invalid},
		{"http://0x7f.0.0.1/", false, invalid},
		{"http://0x7F000001/", false, invalid},
		{"http://127.0.0.1./", false, invalid},
		{"http://example.123/", false, invalid},

		{"", false, invalid},
		{"example.com/hook", false, invalid},
		{"/hook", false, invalid},
		{"//example.com/hook", false, invalid},
		{"http:example.com", false, invalid},
		{"ftp://example.com/", false, invalid},
		{"file:///etc/passwd", false, invalid},
		{"javascript:alert(1)", false, invalid},
		{"http:///hook", false, invalid},
		{"http://:8080/hook", false, invalid},
		{"http://user:pass@example.com/", false, invalid},
		{"http://user@example.com/", false, invalid},
		{"http://example.com/#frag", false, invalid},
		{"http://example.com/#", false, invalid},
		{"http://[fe80::1%25eth0]/", false, invalid},
		{"http://[fe80::1%25eth0]/", true, invalid},
		{"http://example.com:0/", false, invalid},
		{"http://example.com:65536/", false, invalid},
		{"http://exa mple.com/", false, invalid},
		{"http://example.com/" + strings.Repeat("a", maxEndpointURLLen-len("http://example.com/")), false, ok},
		{"http://example.com/" + strings.Repeat("a", maxEndpointURLLen-len("http://example.com/")+1), false, invalid},
	}
	for _, tc := range tests {
		if got := outcome(tc.raw, tc.allowPrivate); got != tc.want {
			t.Errorf("validateEndpointURL(%.60q, allowPrivate=%t) is %s, want %s", tc.raw, tc.allowPrivate, got, tc.want)
		}
	}
}

func TestValidateEndpointURLErrors(t *testing.T) {
	t.Parallel()
	_, err := validateEndpointURL("ftp://user:hunter2@example.com/", false)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v: want a refusal that does not repeat the password", err)
	}
	_, err = validateEndpointURL("http://user:hunter2@exa mple.com/", false)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v: want a parse error that does not repeat the password", err)
	}
	_, err = validateEndpointURL("http://127.0.0.1:8080/", false)
	for _, part := range []string{"127.0.0.1", "loopback", "-allow-private-endpoints"} {
		if err == nil || !strings.Contains(err.Error(), part) {
			t.Errorf("error %v: want it to name %q", err, part)
		}
	}
}

// fakeLookup answers from a table, so tests need no DNS server; a name it
// does not know fails the lookup (not the guard), so a test that resolves
// something it did not expect cannot pass by accident.
func fakeLookup(answers map[string][]string) func(context.Context, string, string) ([]netip.Addr, error) {
	return func(_ context.Context, _, host string) ([]netip.Addr, error) {
		texts, ok := answers[host]
		if !ok {
			return nil, &net.DNSError{Err: "no such host (fake)", Name: host, IsNotFound: true}
		}
		addrs := make([]netip.Addr, 0, len(texts))
		for _, s := range texts {
			addrs = append(addrs, netip.MustParseAddr(s))
		}
		return addrs, nil
	}
}

// countingServer is a loopback receiver that counts the requests reaching
// it: a refused request must leave the count at zero.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestSafeClientRefusesInternalAddresses(t *testing.T) {
	t.Parallel()
	srv, hits := countingServer(t)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	at := func(host string) string {
		return fmt.Sprintf("http://%s/hook", net.JoinHostPort(host, fmt.Sprint(port)))
	}

	tests := []struct {
		name    string
		url     string
		answers map[string][]string
	}{
		{"loopback literal", srv.URL, nil},
		{"IPv6 loopback literal", at("::1"), nil},
		{"localhost by name", at("localhost"), map[string][]string{"localhost": {"127.0.0.1"}}},
		{"RFC 1918 literal", at("10.0.0.1"), nil},
		{"RFC 1918 by name", at("intranet.example"), map[string][]string{"intranet.example": {"192.168.1.10"}}},
		{"link-local", at("169.254.1.1"), nil},
		{"cloud metadata", "http://169.254.169.254/latest/meta-data/", nil},
		{"CGNAT", at("100.64.0.1"), nil},
		// Linux connects 0.0.0.0 to the local host: without the guard
		// this one would reach the test server.
		{"unspecified", at("0.0.0.0"), nil},
		{"IPv4-mapped loopback", at("::ffff:127.0.0.1"), nil},
		{"NAT64 of loopback", at("64:ff9b::7f00:1"), nil},
		{"name answering IPv4-mapped loopback", at("mapped.example"), map[string][]string{"mapped.example": {"::ffff:127.0.0.1"}}},
		// Go reads these hosts as names; a libc resolver (cgo) answers
		// them as inet_aton does, which the fake lookup reproduces.
		{"decimal IPv4", at("2130706433"), map[string][]string{"2130706433": {"127.0.0.1"}}},
		{"octal IPv4", at("0177.0.0.1"), map[string][]string{"0177.0.0.1": {"127.0.0.1"}}},
		// Fail closed: one bad answer condemns the name, even when a
		// public address comes first and would have been dialled first.
		{"public then private", at("mixed.example"), map[string][]string{"mixed.example": {"93.184.215.14", "127.0.0.1"}}},
		{"private then public", at("mixed.example"), map[string][]string{"mixed.example": {"127.0.0.1", "93.184.215.14"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			client := newSafeHTTPClient(safeHTTPOptions{Timeout: 5 * time.Second, LookupIP: fakeLookup(tc.answers)})
			resp, err := client.Post(tc.url, "application/json", strings.NewReader(`{}`))
			if err == nil {
				resp.Body.Close()
				t.Fatalf("POST %s: status %s, want a refused dial", tc.url, resp.Status)
			}
			if !errors.Is(err, errForbiddenAddress) {
				t.Fatalf("POST %s: %v, want an error wrapping errForbiddenAddress", tc.url, err)
			}
		})
	}
	t.Cleanup(func() {
		// Cleanups run after the parallel subtests finish.
		if n := hits.Load(); n != 0 {
			t.Errorf("the internal server received %d requests, want 0", n)
		}
	})
}

func TestSafeClientRefusesDNSRebinding(t *testing.T) {
	t.Parallel()
	srv, hits := countingServer(t)
	port := srv.Listener.Addr().(*net.TCPAddr).Port

	// The name answers a public address first, then loopback: what an
	// attacker's DNS server does to a check made before the request.
	var lookups atomic.Int64
	rebinding := func(_ context.Context, _, host string) ([]netip.Addr, error) {
		if lookups.Add(1) == 1 {
			return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
		}
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}

	earlier, err := rebinding(context.Background(), "ip", "rebind.example")
	if err != nil || forbiddenIPReason(earlier[0]) != "" {
		t.Fatalf("the first answer %v (%v) should pass an early check", earlier, err)
	}
	u := fmt.Sprintf("http://rebind.example:%d/hook", port)
	if _, err := validateEndpointURL(u, false); err != nil {
		t.Fatalf("validateEndpointURL(%s): %v, want it accepted (names are checked when dialled)", u, err)
	}

	client := newSafeHTTPClient(safeHTTPOptions{Timeout: 5 * time.Second, LookupIP: rebinding})
	resp, err := client.Post(u, "application/json", strings.NewReader(`{}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("POST %s: status %s, want a refused dial", u, resp.Status)
	}
	if !errors.Is(err, errForbiddenAddress) {
		t.Fatalf("POST %s: %v, want an error wrapping errForbiddenAddress", u, err)
	}
	if n := lookups.Load(); n != 2 {
		t.Errorf("%d lookups, want 2: the client must resolve when it dials", n)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the internal server received %d requests, want 0", n)
	}
}

// The Control hook guards the socket itself, whoever resolved the name.
func TestSafeDialerControl(t *testing.T) {
	t.Parallel()
	srv, _ := countingServer(t)
	addr := srv.Listener.Addr().String()

	_, err := newSafeDialer(false, nil).DialContext(t.Context(), "tcp", addr)
	var fe *forbiddenAddressError
	if !errors.As(err, &fe) || fe.subject != "address 127.0.0.1" || fe.reason != "loopback" {
		t.Errorf("guarded dial %s: %v, want a refusal of 127.0.0.1 as loopback", addr, err)
	}

	conn, err := newSafeDialer(true, nil).DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatalf("unguarded dial %s: %v", addr, err)
	}
	conn.Close()

	tests := []struct {
		network, address string
		wantRefused      bool
	}{
		{"tcp4", "8.8.8.8:443", false},
		{"tcp6", "[2606:4700::1111]:443", false},
		{"tcp4", "127.0.0.1:80", true},
		{"tcp6", "[::ffff:10.0.0.1]:80", true},
		{"tcp6", "[fe80::1%eth0]:80", true},
		{"udp4", "8.8.8.8:53", true},
		{"tcp4", "example.com:80", true},
		{"tcp4", "garbage", true},
	}
	for _, tc := range tests {
		err := guardDialControl(t.Context(), tc.network, tc.address, nil)
		if refused := errors.Is(err, errForbiddenAddress); refused != tc.wantRefused {
			t.Errorf("guardDialControl(%s, %s) = %v, want refused %t", tc.network, tc.address, err, tc.wantRefused)
		}
	}
}

func TestSafeClientAllowPrivateReachesLoopback(t *testing.T) {
	t.Parallel()
	srv, hits := countingServer(t)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	client := newSafeHTTPClient(safeHTTPOptions{
		AllowPrivate: true,
		Timeout:      5 * time.Second,
		LookupIP:     fakeLookup(map[string][]string{"localhost": {"127.0.0.1"}}),
	})

	for _, u := range []string{srv.URL, fmt.Sprintf("http://localhost:%d/", port)} {
		resp, err := client.Post(u, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatalf("POST %s: %v", u, err)
		}
		body, truncated, err := readLimited(resp.Body, 1<<10)
		resp.Body.Close()
		if err != nil || truncated || string(body) != "ok" || resp.StatusCode != http.StatusOK {
			t.Errorf("POST %s: %s %q (truncated %t, err %v), want 200 \"ok\"", u, resp.Status, body, truncated, err)
		}
	}
	if n := hits.Load(); n != 2 {
		t.Errorf("server received %d requests, want 2", n)
	}
}

// Deliveries to one host reuse their connection rather than pay a new
// handshake each.
func TestSafeClientReusesConnections(t *testing.T) {
	t.Parallel()
	srv, _ := countingServer(t)
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second})

	var reused []bool
	for range 3 {
		var info httptrace.GotConnInfo
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { info = i },
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", srv.URL, err)
		}
		// Read to the end so the connection goes back to the pool.
		if _, _, err := readLimited(resp.Body, 1<<10); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		reused = append(reused, info.Reused)
	}
	if diff := cmp.Diff([]bool{false, true, true}, reused); diff != "" {
		t.Errorf("connection reuse mismatch (-want +got):\n%s", diff)
	}
}

func TestSafeClientDoesNotFollowRedirects(t *testing.T) {
	t.Parallel()
	// Private endpoints are allowed here so that both servers are
	// reachable: the redirect must stop on its own, not by the guard.
	internal, hits := countingServer(t)
	target := internal.URL + "/admin"
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		redirector := httptest.NewServer(http.RedirectHandler(target, code))
		t.Cleanup(redirector.Close)
		client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second})

		resp, err := client.Post(redirector.URL, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatalf("POST to a %d redirector: %v, want the 3xx response itself", code, err)
		}
		resp.Body.Close()
		if resp.StatusCode != code || resp.Header.Get("Location") != target {
			t.Errorf("POST to a %d redirector: %s to %q, want %d to %q", code, resp.Status, resp.Header.Get("Location"), code, target)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the redirect target received %d requests, want 0", n)
	}
}

func TestSafeClientVerifiesCertificates(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second})

	resp, err := client.Get(srv.URL)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("GET %s: status %s, want a certificate error for the self-signed test certificate", srv.URL, resp.Status)
	}
	var certErr *tls.CertificateVerificationError
	if !errors.As(err, &certErr) {
		t.Errorf("GET %s: %v, want a certificate verification error", srv.URL, err)
	}

	tr := client.Transport.(*http.Transport)
	if tr.TLSClientConfig.InsecureSkipVerify || tr.TLSClientConfig.MinVersion != tls.VersionTLS12 {
		t.Errorf("TLS config: InsecureSkipVerify %t, MinVersion %#x; want false, TLS 1.2", tr.TLSClientConfig.InsecureSkipVerify, tr.TLSClientConfig.MinVersion)
	}
}

func TestNewSafeHTTPClientSettings(t *testing.T) {
	t.Parallel()
	client := newSafeHTTPClient(safeHTTPOptions{})
	tr := client.Transport.(*http.Transport)

	type settings struct {
		Timeout, ResponseHeaderTimeout, TLSHandshakeTimeout, IdleConnTimeout time.Duration
		ProxySet, ForceAttemptHTTP2                                          bool
		MaxIdleConnsPerHost                                                  int
		RedirectErr                                                          error
	}
	got := settings{
		Timeout:               client.Timeout,
		ResponseHeaderTimeout: tr.ResponseHeaderTimeout,
		TLSHandshakeTimeout:   tr.TLSHandshakeTimeout,
		IdleConnTimeout:       tr.IdleConnTimeout,
		ProxySet:              tr.Proxy != nil,
		ForceAttemptHTTP2:     tr.ForceAttemptHTTP2,
		MaxIdleConnsPerHost:   tr.MaxIdleConnsPerHost,
		RedirectErr:           client.CheckRedirect(nil, nil),
	}
	want := settings{
		Timeout:               defaultSafeHTTPTimeout,
		ResponseHeaderTimeout: defaultSafeHTTPTimeout,
		TLSHandshakeTimeout:   safeTLSHandshakeTimeout,
		IdleConnTimeout:       safeIdleConnTimeout,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   defaultSafeMaxIdleConnsPerHost,
		RedirectErr:           http.ErrUseLastResponse,
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
		t.Errorf("client settings mismatch (-want +got):\n%s", diff)
	}
}

// As many requests at once as the client was made for, all to one host,
// find their connections kept: a second round opens none. With net/http's
// default of 2 idle connections per host (or any number below the
// concurrency), most of a busy endpoint's deliveries would each open a new
// connection.
func TestSafeClientKeepsAConnectionPerConcurrentRequest(t *testing.T) {
	t.Parallel()
	const concurrency = 48
	var opened atomic.Int64
	arrived := make(chan struct{}, concurrency)
	var release atomic.Pointer[chan struct{}] // closed when a round's requests may answer
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-*release.Load() // every request of the round holds its connection at once
	}))
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second, Concurrency: concurrency})

	round := func() int64 {
		before := opened.Load()
		gate := make(chan struct{})
		release.Store(&gate)
		var wg sync.WaitGroup
		for range concurrency {
			wg.Go(func() {
				resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body) // at EOF the connection is back in the pool
				resp.Body.Close()
			})
		}
		for range concurrency {
			<-arrived
		}
		close(gate)
		wg.Wait()
		return opened.Load() - before
	}
	if n := round(); n != concurrency {
		t.Fatalf("first round opened %d connections, want %d", n, concurrency)
	}
	if n := round(); n != 0 {
		t.Errorf("second round opened %d new connections, want 0: each request should find its own idle connection", n)
	}
}

func TestSafeClientTimesOutSilentReceiver(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done(): // the client gave up and hung up
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs first: never leave a handler blocked
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 100 * time.Millisecond})

	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("POST to a silent receiver: status %s, want a timeout", resp.Status)
	}
	var urlErr *url.Error
	if !errors.As(err, &urlErr) || !urlErr.Timeout() {
		t.Errorf("POST to a silent receiver: %v, want a timeout error", err)
	}
}

func TestSafeClientCutsEndlessBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := []byte(strings.Repeat("x", 32<<10))
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return // the client closed the connection
			}
		}
	}))
	t.Cleanup(srv.Close)
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})

	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatalf("POST to an endless receiver: %v", err)
	}
	defer resp.Body.Close()
	const limit = 100 << 10
	body, truncated, err := readLimited(resp.Body, limit)
	if err != nil || !truncated || len(body) != limit {
		t.Errorf("readLimited(endless, %d) = %d bytes, truncated %t, err %v; want %d bytes, truncated", limit, len(body), truncated, err, limit)
	}
}

func TestReadLimited(t *testing.T) {
	t.Parallel()
	type result struct {
		Body      string
		Truncated bool
		Err       bool
	}
	tests := []struct {
		in   io.Reader
		n    int64
		want result
	}{
		{strings.NewReader(""), 0, result{}},
		{strings.NewReader(""), 3, result{}},
		{strings.NewReader("abc"), 3, result{Body: "abc"}},
		{strings.NewReader("abcd"), 3, result{Body: "abc", Truncated: true}},
		{strings.NewReader("a"), 0, result{Truncated: true}},
		{io.MultiReader(strings.NewReader("ab"), iotest.ErrReader(errors.New("reset"))), 3, result{Body: "ab", Err: true}},
	}
	for i, tc := range tests {
		body, truncated, err := readLimited(tc.in, tc.n)
		got := result{Body: string(body), Truncated: truncated, Err: err != nil}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("case %d: readLimited(_, %d) mismatch (-want +got):\n%s", i, tc.n, diff)
		}
	}
}

// An allowed address (-demo's own receiver) is reachable through the guard;
// another port on the same loopback address is not.
func TestSafeClientReachesOnlyTheAllowedInternalAddress(t *testing.T) {
	t.Parallel()
	allowed, allowedHits := countingServer(t)
	other, otherHits := countingServer(t)
	client := newSafeHTTPClient(safeHTTPOptions{
		Timeout:    5 * time.Second,
		AllowAddrs: []netip.AddrPort{netip.MustParseAddrPort(allowed.Listener.Addr().String())},
	})
	resp, err := client.Post(allowed.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatalf("POST to the allowed address: %v", err)
	}
	resp.Body.Close()
	if _, err := client.Post(other.URL, "application/json", strings.NewReader(`{}`)); !errors.Is(err, errForbiddenAddress) {
		t.Fatalf("POST to another loopback port: %v, want the dial refused", err)
	}
	if a, o := allowedHits.Load(), otherHits.Load(); a != 1 || o != 0 {
		t.Errorf("the allowed receiver got %d requests, the other %d; want 1 and 0", a, o)
	}
}
