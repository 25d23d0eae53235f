// ssrf_test.go: the SSRF conformance table. Every way of writing an
// address that a webhook must never reach, checked at registration and at
// delivery, directly and through -egress-proxy; the README's table is rendered from ssrfForms, and a test fails
// when the two differ.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	neturl "net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var updateREADME = flag.Bool("update-readme", false, "rewrite the README's generated tables from the tests")

// ssrfForm is one address form. Its host is written into an endpoint URL
// on the test receiver's port; names resolve through answers (or rebind),
// as a resolver the attacker controls would answer them.
type ssrfForm struct {
	group   string
	name    string
	host    string
	answers []string // the resolver's answer for host, when it is a name
	rebind  bool     // a public address at registration, loopback at delivery
	// registered is what registration does: "refused" (the address or its
	// spelling is forbidden) or "accepted" (a name, checked when dialled).
	registered string
	// delivered is what a delivery does: "refused at dial" for every form
	// here but the redirect, which is "3xx not followed".
	delivered string
}

const (
	refused       = "refused"
	accepted      = "accepted (a name: checked at dial)"
	refusedAtDial = "refused at dial"
	// refusedBeforeConnect is every refused form through -egress-proxy:
	// the target is judged before the proxy is asked for it.
	refusedBeforeConnect = "refused before CONNECT (the proxy sees nothing)"
)

// proxied is what a delivery through -egress-proxy does: the same as
// directly, the refusal coming before any CONNECT.
func (f ssrfForm) proxied() string {
	if f.delivered == refusedAtDial {
		return refusedBeforeConnect
	}
	return f.delivered
}

var ssrfForms = []ssrfForm{
	{"IPv4 literal", "loopback", "127.0.0.1", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "loopback, last address", "127.255.255.254", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "unspecified (Linux dials the local host)", "0.0.0.0", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "private (RFC 1918), 10.x", "10.0.0.1", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "private (RFC 1918), 172.16.x", "172.16.0.1", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "private (RFC 1918), 192.168.x", "192.168.1.1", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "link-local", "169.254.1.1", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "cloud metadata (AWS, GCP, Azure, DigitalOcean)", "169.254.169.254", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "cloud metadata (Alibaba), CGNAT range", "100.100.100.200", nil, false, refused, refusedAtDial},
	{"IPv4 literal", "Azure platform endpoint", "168.63.129.16", nil, false, refused, refusedAtDial},
	{"IPv4 spelling", "decimal", "2130706433", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IPv4 spelling", "octal", "0177.0.0.1", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IPv4 spelling", "hex", "0x7f.0.0.1", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IPv4 spelling", "hex, one number", "0x7F000001", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IPv4 spelling", "short form", "127.1", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IPv4 spelling", "trailing dot", "127.0.0.1.", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IPv6 literal", "loopback", "::1", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "unspecified", "::", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "link-local", "fe80::1", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "unique local", "fd00::1", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "AWS metadata over IPv6", "fd00:ec2::254", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "IPv4-mapped loopback", "::ffff:127.0.0.1", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "IPv4-mapped loopback, hex", "::ffff:7f00:1", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "IPv4-compatible loopback", "::127.0.0.1", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "NAT64 of loopback", "64:ff9b::7f00:1", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "NAT64 of metadata", "64:ff9b::a9fe:a9fe", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "6to4 of loopback", "2002:7f00:1::", nil, false, refused, refusedAtDial},
	{"IPv6 literal", "Teredo", "2001::1", nil, false, refused, refusedAtDial},
	{"name", "localhost", "localhost", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"name", "localhost, any case, trailing dot", "LocalHost.", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"name", "a subdomain of localhost", "api.localhost", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"name", "resolving to a private address", "intranet.example", []string{"192.168.1.10"}, false, accepted, refusedAtDial},
	{"name", "resolving to the metadata service", "metadata.example", []string{"169.254.169.254"}, false, accepted, refusedAtDial},
	{"name", "resolving to IPv4-mapped loopback", "mapped.example", []string{"::ffff:127.0.0.1"}, false, accepted, refusedAtDial},
	{"name", "resolving to a public, then a private address", "mixed.example", []string{"93.184.215.14", "127.0.0.1"}, false, accepted, refusedAtDial},
	{"name", "DNS rebinding: public at registration, loopback at delivery", "rebind.example", nil, true, accepted, refusedAtDial},
	{"IDNA", "fullwidth loopback", "１２７.０.０.１", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IDNA", "ideographic full stops", "127。0。0。1", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IDNA", "fullwidth localhost", "ｌｏｃａｌｈｏｓｔ", []string{"127.0.0.1"}, false, refused, refusedAtDial},
	{"IDNA", "circled digits", "①②⑦.0.0.1", []string{"127.0.0.1"}, false, refused, refusedAtDial},
}

// A receiver that redirects elsewhere is the one form not refused at dial:
// its 3xx is the delivery's outcome, and the client never follows it.
var ssrfRedirect = ssrfForm{"redirect", "a receiver answering 3xx to an internal URL", "example.com", nil, false, accepted, "3xx not followed"}

func TestSSRFConformance(t *testing.T) {
	t.Parallel()
	internal, hits := countingServer(t)
	port := internal.Listener.Addr().(*net.TCPAddr).Port
	proxy, proxyURL := newConnectProxy(t, false, nil)
	var redirectorAddr atomic.Value // the redirector's URL, once it runs
	for _, f := range ssrfForms {
		t.Run(f.testName(), func(t *testing.T) {
			t.Parallel()
			url := "http://" + net.JoinHostPort(f.host, fmt.Sprint(port)) + "/hook"
			if got := registration(url); got != f.registered {
				t.Errorf("registering %s: %s, want %s", url, got, f.registered)
			}
			for _, through := range []*neturl.URL{nil, proxyURL} {
				client := newSafeHTTPClient(safeHTTPOptions{Timeout: 5 * time.Second, LookupIP: ssrfLookup(t, f), Proxy: through})
				resp, err := client.Post(url, "application/json", strings.NewReader(`{}`))
				if err == nil {
					resp.Body.Close()
					t.Fatalf("delivering to %s (proxy %v): %s, want the dial refused", url, through, resp.Status)
				}
				if !errors.Is(err, errForbiddenAddress) {
					t.Fatalf("delivering to %s (proxy %v): %v, want the dial refused (errForbiddenAddress)", url, through, err)
				}
			}
		})
	}
	t.Run(ssrfRedirect.testName(), func(t *testing.T) {
		t.Parallel()
		if got := registration("http://example.com/hook"); got != ssrfRedirect.registered {
			t.Errorf("registering the redirector: %s, want %s", got, ssrfRedirect.registered)
		}
		// Private addresses allowed, so both test servers are reachable:
		// the redirect must stop on its own, not by the guard.
		redirector := httptest.NewServer(http.RedirectHandler(internal.URL+"/admin", http.StatusFound))
		t.Cleanup(redirector.Close)
		redirectorAddr.Store(redirector.URL)
		for _, through := range []*neturl.URL{nil, proxyURL} {
			client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second, Proxy: through})
			resp, err := client.Post(redirector.URL, "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusFound {
				t.Errorf("delivering to a redirector (proxy %v): %s, want the 302 itself", through, resp.Status)
			}
			client.CloseIdleConnections()
		}
	})
	t.Cleanup(func() {
		if n := hits.Load(); n != 0 {
			t.Errorf("the internal server received %d requests, want 0", n)
		}
		// The redirector's one CONNECT is all the proxy may have seen.
		if seen := proxy.seen(); len(seen) != 1 || seen[0] != strings.TrimPrefix(redirectorAddr.Load().(string), "http://") {
			t.Errorf("the proxy was asked to CONNECT to %v, want the redirector alone", seen)
		}
	})
}

// ssrfLookup is a resolver answering f's name as an attacker's DNS would:
// as written and as the transport's IDNA mapping spells it, and for the
// rebinding form a public address to the first lookup (which this makes,
// as registration would) and loopback to every later one.
func ssrfLookup(t *testing.T, f ssrfForm) func(context.Context, string, string) ([]netip.Addr, error) {
	t.Helper()
	if !f.rebind {
		names := map[string][]string{f.host: f.answers, strings.TrimSuffix(f.host, "."): f.answers}
		if folded, err := foldHost(f.host); err == nil {
			names[folded] = f.answers
		}
		return fakeLookup(names)
	}
	var lookups atomic.Int64
	lookup := func(context.Context, string, string) ([]netip.Addr, error) {
		if lookups.Add(1) == 1 {
			return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
		}
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	if addrs, _ := lookup(context.Background(), "ip", f.host); forbiddenIPReason(addrs[0]) != "" {
		t.Fatal("the rebinding name's first answer must pass a check made at registration")
	}
	return lookup
}

// testName is the form's subtest name, as go test prints it.
func (f ssrfForm) testName() string {
	return strings.ReplaceAll(f.group+": "+f.name, " ", "_")
}

// registration is what validateEndpointURL does with url: refused or
// accepted.
func registration(url string) string {
	_, err := validateEndpointURL(url, false)
	if err != nil {
		return refused
	}
	return accepted
}

const (
	ssrfTableBegin = "<!-- ssrf-conformance: rendered from ssrfForms in ssrf_test.go; go test -run TestREADMESSRFTable -update-readme rewrites it -->"
	ssrfTableEnd   = "<!-- end ssrf-conformance -->"
)

// ssrfTable renders the conformance table as the README shows it.
func ssrfTable() string {
	var b strings.Builder
	b.WriteString("| form | written as | at registration | at delivery | through -egress-proxy | test |\n|---|---|---|---|---|---|\n")
	for _, f := range append(ssrfForms[:len(ssrfForms):len(ssrfForms)], ssrfRedirect) {
		host := "`" + f.host + "`"
		if len(f.answers) > 0 && !strings.ContainsAny(f.host[:1], "0123456789") {
			host += " → " + strings.Join(f.answers, ", ")
		}
		test := "`TestSSRFConformance/" + f.testName() + "`"
		fmt.Fprintf(&b, "| %s: %s | %s | %s | %s | %s | %s |\n", f.group, f.name, host, f.registered, f.delivered, f.proxied(), test)
	}
	return b.String()
}

// docs/security.md's conformance table is the test's table.
func TestREADMESSRFTable(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range append(ssrfForms[:len(ssrfForms):len(ssrfForms)], ssrfRedirect) {
		if seen[f.testName()] || strings.Contains(f.testName(), "/") {
			t.Fatalf("form %q: its subtest name must be unique and without a slash, or the README names another test", f.testName())
		}
		seen[f.testName()] = true
	}
	readme := string(raw)
	begin, end := strings.Index(readme, ssrfTableBegin), strings.Index(readme, ssrfTableEnd)
	if begin < 0 || end < begin {
		t.Fatalf("README.md has no section between %q and %q", ssrfTableBegin, ssrfTableEnd)
	}
	got := readme[begin+len(ssrfTableBegin) : end]
	want := "\n" + ssrfTable()
	if got == want {
		return
	}
	if *updateREADME {
		if err := os.WriteFile("docs/security.md", []byte(readme[:begin+len(ssrfTableBegin)]+want+readme[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("README.md's SSRF table differs from ssrfForms; run go test -run TestREADMESSRFTable -update-readme. Want:\n%s", want)
}
