// Tests for -egress-proxy: deliveries through an HTTP CONNECT proxy, with
// the address guard judging each target before the proxy hears of it.

package main

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// connectProxy is a CONNECT proxy on loopback that records what it was
// asked to connect to, and with which Proxy-Authorization.
type connectProxy struct {
	srv *httptest.Server
	// wantAuth, if set, is the Proxy-Authorization it requires (407
	// otherwise).
	wantAuth string

	mu      sync.Mutex // protects the fields below
	targets []string
	auths   []string
	conns   []net.Conn
}

// newConnectProxy starts a proxy, spoken to over TLS if overTLS, and
// returns it with its URL (user, if not nil, in its userinfo).
func newConnectProxy(t testing.TB, overTLS bool, user *url.Userinfo) (*connectProxy, *url.URL) {
	t.Helper()
	p := &connectProxy{}
	var tunnels sync.WaitGroup
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.targets = append(p.targets, r.Host)
		p.auths = append(p.auths, r.Header.Get("Proxy-Authorization"))
		p.mu.Unlock()
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		if p.wantAuth != "" && r.Header.Get("Proxy-Authorization") != p.wantAuth {
			w.Header().Set("Proxy-Authenticate", `Basic realm="test"`)
			http.Error(w, "who are you", http.StatusProxyAuthRequired)
			return
		}
		upstream, err := net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			upstream.Close()
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, conn, upstream)
		p.mu.Unlock()
		io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
		tunnels.Add(1)
		go func() {
			defer tunnels.Done()
			io.Copy(upstream, buf)
			upstream.Close()
		}()
		io.Copy(conn, upstream)
		conn.Close()
	})
	if overTLS {
		p.srv = httptest.NewTLSServer(handler)
	} else {
		p.srv = httptest.NewServer(handler)
	}
	t.Cleanup(func() {
		p.srv.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		tunnels.Wait()
	})
	u, _ := url.Parse(p.srv.URL)
	u.User = user
	return p, u
}

// roots are the authorities that verify the proxy's test certificate.
func (p *connectProxy) roots() *x509.CertPool {
	if p.srv.Certificate() == nil {
		return nil // a plain http:// proxy
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.srv.Certificate())
	return pool
}

// seen is what the proxy was asked to CONNECT to, in order.
func (p *connectProxy) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string{}, p.targets...)
}

func (p *connectProxy) seenAuth() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string{}, p.auths...)
}

// hostReceiver is a receiver that records the Host header and TLS server
// name of every request it answers.
func hostReceiver(t *testing.T, overTLS bool) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sni := ""
		if r.TLS != nil {
			sni = " sni=" + r.TLS.ServerName
		}
		mu.Lock()
		seen = append(seen, r.Host+sni)
		mu.Unlock()
		io.WriteString(w, "ok")
	})
	var srv *httptest.Server
	if overTLS {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string{}, seen...)
	}
}

// TestEgressProxyCarriesDeliveries sends through http:// and https://
// proxies to http and https receivers named example.com (the name the
// test servers' certificate carries), resolved here to loopback: the
// proxy is asked for the resolved address, with the credentials of the
// proxy URL, and the receiver sees the name, in Host and in TLS's SNI.
func TestEgressProxyCarriesDeliveries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		proxyTLS, targetTLS bool
	}{
		{"http proxy, http receiver", false, false},
		{"http proxy, https receiver", false, true},
		{"https proxy, http receiver", true, false},
		{"https proxy, https receiver", true, true},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			receiver, received := hostReceiver(t, tc.targetTLS)
			proxy, proxyURL := newConnectProxy(t, tc.proxyTLS, url.UserPassword("relay", "p@ss:word"))
			proxy.wantAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte("relay:p@ss:word"))
			port := receiver.Listener.Addr().(*net.TCPAddr).Port
			opts := safeHTTPOptions{
				AllowPrivate: true, Timeout: 5 * time.Second, Proxy: proxyURL, ProxyRootCAs: proxy.roots(),
				LookupIP: fakeLookup(map[string][]string{"example.com": {"127.0.0.1"}}),
			}
			if tc.targetTLS {
				opts.RootCAs = x509.NewCertPool()
				opts.RootCAs.AddCert(receiver.Certificate())
			}
			client := newSafeHTTPClient(opts)
			t.Cleanup(client.CloseIdleConnections)
			target := strings.Replace(receiver.URL, "127.0.0.1", "example.com", 1)

			resp, err := client.Post(target+"/hook", "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Fatalf("POST %s through the proxy: %v", target, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("POST %s through the proxy: %s, want 200", target, resp.Status)
			}
			vetted := "127.0.0.1:" + strconv.Itoa(port)
			if diff := cmp.Diff([]string{vetted}, proxy.seen()); diff != "" {
				t.Errorf("CONNECTs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{proxy.wantAuth}, proxy.seenAuth()); diff != "" {
				t.Errorf("Proxy-Authorization (-want +got):\n%s", diff)
			}
			want := "example.com:" + strconv.Itoa(port)
			if tc.targetTLS {
				want += " sni=example.com"
			}
			if diff := cmp.Diff([]string{want}, received()); diff != "" {
				t.Errorf("receiver saw (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEgressProxyConnectsToTheVettedAddress: a name that resolves to an
// allowed address when the guard checks it, and to the metadata service
// at any later lookup, is tunnelled to the address the guard allowed:
// the proxy never sees the name, so it cannot resolve it again.
func TestEgressProxyConnectsToTheVettedAddress(t *testing.T) {
	t.Parallel()
	receiver, received := hostReceiver(t, false)
	proxy, proxyURL := newConnectProxy(t, false, nil)
	allowed := netip.MustParseAddrPort(receiver.Listener.Addr().String())
	var lookups atomic.Int64
	rebinding := func(context.Context, string, string) ([]netip.Addr, error) {
		if lookups.Add(1) == 1 {
			return []netip.Addr{allowed.Addr()}, nil
		}
		return []netip.Addr{netip.MustParseAddr("169.254.169.254")}, nil
	}
	// The guard is on: only the receiver's exact address is allowed.
	client := newSafeHTTPClient(safeHTTPOptions{
		Timeout: 5 * time.Second, LookupIP: rebinding, Proxy: proxyURL, AllowAddrs: []netip.AddrPort{allowed},
	})
	t.Cleanup(client.CloseIdleConnections)

	target := "http://rebind.example:" + strconv.Itoa(int(allowed.Port())) + "/hook"
	resp, err := client.Post(target, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatalf("POST %s: %v", target, err)
	}
	resp.Body.Close()
	if diff := cmp.Diff([]string{allowed.String()}, proxy.seen()); diff != "" {
		t.Errorf("CONNECTs (-want +got):\n%s", diff)
	}
	if n := lookups.Load(); n != 1 {
		t.Errorf("%d lookups of the name, want 1: the one the guard judged", n)
	}
	if got := received(); len(got) != 1 {
		t.Errorf("receiver saw %v, want one request", got)
	}

	// The same name answered with the metadata service from the start
	// never reaches the proxy.
	lookups.Store(1)
	client.CloseIdleConnections()
	resp, err = client.Post(target, "application/json", strings.NewReader(`{}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("POST %s resolving to the metadata service: %s, want refused", target, resp.Status)
	}
	if !errors.Is(err, errForbiddenAddress) {
		t.Errorf("POST %s resolving to the metadata service: %v, want errForbiddenAddress", target, err)
	}
	if n := len(proxy.seen()); n != 1 {
		t.Errorf("the proxy was asked %d times, want only the first, allowed request", n)
	}
}

// TestEgressProxyRefusalIsTheDeliveryError: a proxy that will not
// connect (wrong credentials here) fails the delivery with its answer.
func TestEgressProxyRefusalIsTheDeliveryError(t *testing.T) {
	t.Parallel()
	receiver, received := hostReceiver(t, false)
	proxy, proxyURL := newConnectProxy(t, false, url.UserPassword("relay", "wrong"))
	proxy.wantAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte("relay:right"))
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second, Proxy: proxyURL})
	resp, err := client.Post(receiver.URL, "application/json", strings.NewReader(`{}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("POST through a proxy refusing us: %s, want an error", resp.Status)
	}
	if !strings.Contains(err.Error(), "407") {
		t.Errorf("POST through a proxy refusing us: %v, want its 407 named", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error %q quotes the proxy password", err)
	}
	if got := received(); len(got) != 0 {
		t.Errorf("receiver saw %v, want nothing", got)
	}
}

// TestEgressProxySetting: a proxy URL outboxd cannot use refuses to start,
// naming the setting and never the password.
func TestEgressProxySetting(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"socks5://proxy.internal:1080",
		"proxy.internal:3128",
		"http://",
		"http://proxy.internal:3128/path",
		"http://proxy.internal:3128?x=1",
		"http://user:hunter2@proxy.internal:99999",
		"http://user:hunter2@proxy internal",
	} {
		_, err := parseConfig([]string{"-egress-proxy", bad}, envFrom(nil), io.Discard)
		if err == nil {
			t.Errorf("-egress-proxy %q: started, want refused", bad)
			continue
		}
		if !strings.Contains(err.Error(), "-egress-proxy (OUTBOXD_EGRESS_PROXY)") {
			t.Errorf("-egress-proxy %q: %v, want the setting named", bad, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("-egress-proxy %q: %v quotes the password", bad, err)
		}
	}
	for _, good := range []string{"", "http://proxy.internal:3128", "https://user:pass@proxy.example/", "http://127.0.0.1:8888"} {
		if _, err := parseConfig(nil, envFrom(map[string]string{"OUTBOXD_EGRESS_PROXY": good}), io.Discard); err != nil {
			t.Errorf("OUTBOXD_EGRESS_PROXY=%q: %v, want accepted", good, err)
		}
	}
}

// BenchmarkEgressProxy compares a delivery's round trip directly and
// through a CONNECT proxy on loopback, over kept-alive connections (one
// CONNECT per connection, not per request): go test -run '^$' -bench
// BenchmarkEgressProxy -benchtime 2000x.
func BenchmarkEgressProxy(b *testing.B) {
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer receiver.Close()
	proxy, proxyURL := newConnectProxy(b, false, nil)
	for _, bc := range []struct {
		name  string
		proxy *url.URL
	}{{"direct", nil}, {"proxy", proxyURL}} {
		b.Run(bc.name, func(b *testing.B) {
			client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second, Proxy: bc.proxy})
			defer client.CloseIdleConnections()
			for b.Loop() {
				resp, err := client.Post(receiver.URL, "application/json", strings.NewReader(`{}`))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			b.ReportMetric(float64(len(proxy.seen())), "connects")
		})
	}
}

// TestRunDeliversThroughTheEgressProxy: outboxd started with
// OUTBOXD_EGRESS_PROXY sends its deliveries through the proxy, asking it
// for the receiver's address, and logs the proxy without its password.
func TestRunDeliversThroughTheEgressProxy(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	receiver, received := hostReceiver(t, false)
	proxy, proxyURL := newConnectProxy(t, false, url.UserPassword("relay", "s3cret-pw"))
	addr := freeAddr(t)
	token := strings.Repeat("0123456789abcdef", 3)
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		run(ctx, []string{"-addr", addr}, envFrom(map[string]string{
			"DATABASE_URL": dsn, "OUTBOXD_ADMIN_TOKEN": token, "OUTBOXD_ALLOW_PRIVATE_ENDPOINTS": "true",
			"OUTBOXD_EGRESS_PROXY": proxyURL.String(), "OUTBOXD_JOB_POLL": "50ms",
		}), io.Discard, &logs)
	}()
	defer func() { cancel(); <-exited }()
	awaitHealthy(t, addr, exited)

	req, _ := http.NewRequest("POST", "http://"+addr+"/api/endpoints", strings.NewReader(`{"url": "`+receiver.URL+`/hook", "topics": ["t"]}`))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create endpoint: %s", resp.Status)
	}
	if _, err := recordEvent(context.Background(), db, "t", "s", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the delivery through the proxy", 30*time.Second, func() bool { return len(received()) == 1 })
	if diff := cmp.Diff([]string{strings.TrimPrefix(receiver.URL, "http://")}, proxy.seen()); diff != "" {
		t.Errorf("CONNECTs (-want +got):\n%s", diff)
	}
	cancel()
	<-exited
	if !strings.Contains(logs.String(), "deliveries go through an egress proxy") || strings.Contains(logs.String(), "s3cret-pw") {
		t.Errorf("the start log does not name the proxy, or shows its password:\n%s", logs.String())
	}
}
