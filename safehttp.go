// The one outbound HTTP client for every user-given URL: the guard against SSRF.

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"
)

// errForbiddenAddress is wrapped by every refusal of an address: at dial
// time, for a name that resolves to one, and at validation, for a literal.
var errForbiddenAddress = errors.New("forbidden address")

// forbiddenAddressError says what was refused and why, and names the switch,
// because a developer pointing an endpoint at localhost is the common case.
type forbiddenAddressError struct {
	subject string // "address 10.0.0.1", "host localhost"
	reason  string
}

func refuseAddr(ip netip.Addr, reason string) *forbiddenAddressError {
	return &forbiddenAddressError{subject: "address " + ip.String(), reason: reason}
}

func (e *forbiddenAddressError) Error() string {
	return fmt.Sprintf("%s is %s; set -allow-private-endpoints to allow", e.subject, e.reason)
}

func (e *forbiddenAddressError) Is(target error) bool { return target == errForbiddenAddress }

type ipRange struct {
	prefix netip.Prefix
	reason string
}

// forbiddenIPv4 lists the IANA special-purpose ranges a webhook has no
// business reaching. The first match names the reason, so narrow entries
// come before the ranges that hold them. Cloud metadata services live in
// these ranges too: AWS, GCP and Azure at 169.254.169.254, Alibaba at
// 100.100.100.200 (CGNAT), Oracle at 192.0.0.192 (IETF assignments).
var forbiddenIPv4 = []ipRange{
	{netip.MustParsePrefix("0.0.0.0/32"), "unspecified"},
	// Linux connects 0.0.0.0/8 to the local host.
	{netip.MustParsePrefix("0.0.0.0/8"), "in 0.0.0.0/8, this network (RFC 791)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space for carrier-grade NAT (RFC 6598)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.169.254/32"), "the cloud metadata service"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved for IETF protocol assignments (RFC 6890)"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation (RFC 5737)"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast (RFC 7526)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking (RFC 2544)"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation (RFC 5737)"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation (RFC 5737)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (RFC 1112)"},
	// A public address, but only ever answered inside Azure, by the host
	// platform (agent, DHCP, DNS), never by a webhook receiver.
	{netip.MustParsePrefix("168.63.129.16/32"), "the Azure platform endpoint"},
}

// forbiddenIPv6 lists the ranges refused before the catch-all: any IPv6
// address outside global unicast 2000::/3 is refused too, since nothing
// outside it is reachable on the internet (AWS's IPv6 metadata service,
// fd00:ec2::254, is unique local).
var forbiddenIPv6 = []ipRange{
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated, RFC 4291)"},
	{netip.MustParsePrefix("100::/64"), "discard-only (RFC 6666)"},
	// The local-use NAT64 prefix may embed the IPv4 address at any of six
	// offsets depending on how the operator set it up, so we cannot read
	// it back: refuse the range (the well-known prefix is checked instead).
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64 (RFC 8215)"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (RFC 4193)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated, RFC 3879)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	// Teredo tunnels to an obfuscated IPv4 address of any kind.
	{netip.MustParsePrefix("2001::/32"), "Teredo (RFC 4380)"},
	{netip.MustParsePrefix("2001:2::/48"), "benchmarking (RFC 5180)"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation (RFC 3849)"},
	{netip.MustParsePrefix("3fff::/20"), "documentation (RFC 9637)"},
}

var (
	globalUnicastIPv6 = netip.MustParsePrefix("2000::/3")
	// Prefixes that carry an IPv4 address a gateway will connect to: the
	// IPv6 address is as forbidden as the IPv4 one inside it.
	nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052: IPv4 in the last 32 bits
	sixToFour      = netip.MustParsePrefix("2002::/16")    // RFC 3056: IPv4 in bits 16 to 47
)

// forbiddenIPReason says why a webhook must not connect to ip, or returns ""
// when ip is a public unicast address.
func forbiddenIPReason(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid"
	}
	if ip.Zone() != "" {
		// Scoped addresses are link-local by nature, and netip.Prefix
		// never matches an address with a zone: fail closed.
		return "scoped (has an IPv6 zone)"
	}
	// ::ffff:127.0.0.1 is 127.0.0.1 to the kernel.
	ip = ip.Unmap()
	if ip.Is4() {
		for _, r := range forbiddenIPv4 {
			if r.prefix.Contains(ip) {
				return r.reason
			}
		}
		return ""
	}

	if nat64WellKnown.Contains(ip) {
		b := ip.As16()
		return embeddedIPv4Reason("NAT64", netip.AddrFrom4([4]byte(b[12:16])))
	}
	for _, r := range forbiddenIPv6 {
		if r.prefix.Contains(ip) {
			return r.reason
		}
	}
	if sixToFour.Contains(ip) {
		b := ip.As16()
		return embeddedIPv4Reason("6to4", netip.AddrFrom4([4]byte(b[2:6])))
	}
	if !globalUnicastIPv6.Contains(ip) {
		return "outside IPv6 global unicast 2000::/3"
	}
	return ""
}

func embeddedIPv4Reason(kind string, v4 netip.Addr) string {
	if reason := forbiddenIPReason(v4); reason != "" {
		return fmt.Sprintf("%s for %s, which is %s", kind, v4, reason)
	}
	return ""
}

// maxEndpointURLLen bounds what we store, log and show for an endpoint:
// 2048 bytes is the longest URL that common browsers, proxies and CDNs
// reliably carry, so a longer one is a mistake or an attack on storage.
const maxEndpointURLLen = 2048

// validateEndpointURL checks a URL when an endpoint is registered or
// edited, to give its owner a fast, clear error. It is not the guard: a
// name can resolve elsewhere at send time, and the dial-time check in
// newSafeHTTPClient is what stops that.
func validateEndpointURL(raw string, allowPrivate bool) (*url.URL, error) {
	if len(raw) > maxEndpointURLLen {
		return nil, fmt.Errorf("endpoint url: longer than %d bytes", maxEndpointURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return nil, fmt.Errorf("endpoint url: %w", err)
	}
	// Messages quote the URL without its password, if it has one.
	shown := u.Redacted()
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("endpoint url %q: scheme must be http or https", shown)
	case u.Opaque != "":
		return nil, fmt.Errorf("endpoint url %q: not an absolute url (want scheme://host/...)", shown)
	case u.User != nil:
		// Credentials in the URL end up in logs and on the panel; a
		// receiver authenticates us by the signature instead.
		return nil, errors.New("endpoint url: credentials in the url are not allowed")
	case strings.Contains(raw, "#"):
		// Never sent on the wire, so it can only mislead.
		return nil, fmt.Errorf("endpoint url %q: fragment not allowed", shown)
	}
	if err := checkEndpointHost(u, shown, allowPrivate); err != nil {
		return nil, err
	}
	return u, nil
}

// checkEndpointHost checks an endpoint URL's host and port (shown names
// the URL in messages): an IP address must be public unless private
// endpoints are allowed, and a name must be one DNS can answer and not read
// as an address.
func checkEndpointHost(u *url.URL, shown string, allowPrivate bool) error {
	host, err := foldHost(u.Hostname())
	if err != nil {
		return fmt.Errorf("endpoint url %q: %w", shown, err)
	}
	if host == "" {
		return fmt.Errorf("endpoint url %q: host required", shown)
	}
	if strings.Contains(host, "%") {
		return fmt.Errorf("endpoint url %q: IPv6 zone not allowed", shown)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("endpoint url %q: port out of range", shown)
		}
	}

	if ip, err := netip.ParseAddr(host); err == nil {
		if reason := forbiddenIPReason(ip); reason != "" && !allowPrivate {
			return fmt.Errorf("endpoint url %q: %w", shown, refuseAddr(ip, reason))
		}
		return nil
	}
	if name := strings.TrimSuffix(host, "."); len(name) > 253 || slices.ContainsFunc(strings.Split(name, "."), func(l string) bool { return len(l) > 63 }) {
		// RFC 1035: no resolver answers for such a name, so every
		// delivery would fail; say so at registration.
		return fmt.Errorf("endpoint url: host name longer than DNS allows (253 bytes, 63 a label)")
	}
	if endsInNumber(host) {
		// 2130706433, 0177.0.0.1, 127.1 and 0x7f.1 are all 127.0.0.1 to
		// inet_aton, and so to a libc resolver, while Go reads them as
		// names. Refused even with private endpoints allowed, as
		// ambiguous: its owner can write the dotted quad.
		return fmt.Errorf("endpoint url %q: host reads as an IPv4 address in a non-standard form; write it as a.b.c.d", shown)
	}
	if name := strings.ToLower(strings.TrimSuffix(host, ".")); !allowPrivate && (name == "localhost" || strings.HasSuffix(name, ".localhost")) {
		// RFC 6761: these names always resolve to loopback.
		return fmt.Errorf("endpoint url %q: %w", shown, &forbiddenAddressError{subject: "host " + host, reason: "loopback"})
	}
	return nil
}

// foldHost is host as the HTTP client will dial it, as far as that matters
// here: net/http maps a non-ASCII host through IDNA (UTS #46) before it
// resolves it, and that mapping folds compatibility forms to ASCII, so
// "１２７。０。０。１" is dialled as 127.0.0.1 and "ｌｏｃａｌｈｏｓｔ" as
// localhost. The dial-time guard refuses those anyway; folding here lets
// registration refuse them too. Fullwidth forms and the three IDNA dots
// fold; digits and other compatibility characters outside ASCII are
// refused outright, since their ASCII reading is what an attacker would
// hide behind them and no real host name needs them.
func foldHost(host string) (string, error) {
	var b strings.Builder
	for _, r := range host {
		switch {
		case r < utf8.RuneSelf:
			b.WriteRune(r)
		case r >= 0xFF01 && r <= 0xFF5E: // fullwidth ASCII
			b.WriteRune(r - 0xFF01 + '!')
		case r == '\u3002' || r == '\uFF0E' || r == '\uFF61': // ideographic, fullwidth and halfwidth full stops
			b.WriteByte('.')
		case unicode.In(r, unicode.Nd, unicode.Nl, unicode.No),
			r >= 0x2460 && r <= 0x24FF,   // enclosed alphanumerics
			r >= 0x1D400 && r <= 0x1D7FF, // mathematical alphanumerics
			r >= 0x1F100 && r <= 0x1F1FF, // enclosed alphanumeric supplement
			r >= 0xFF00 && r <= 0xFFEF:   // the rest of the halfwidth and fullwidth forms
			return "", fmt.Errorf("host %q has a compatibility character (%U) that resolves as another; write the host in ASCII", host, r)
		default:
			b.WriteRune(r)
		}
	}
	return strings.ToLower(b.String()), nil
}

// endsInNumber reports whether a host's last label is decimal or 0x-hex
// digits, the WHATWG URL standard's test for "this is an IPv4 address".
// No top-level domain is numeric, so no real name is refused.
func endsInNumber(host string) bool {
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	last := labels[len(labels)-1]
	if rest, ok := strings.CutPrefix(strings.ToLower(last), "0x"); ok {
		return strings.Trim(rest, "0123456789abcdef") == ""
	}
	return last != "" && strings.Trim(last, "0123456789") == ""
}

// Transport settings for webhook deliveries.
const (
	// defaultSafeHTTPTimeout is used when the caller sets none: an
	// unbounded request would hold a worker forever.
	defaultSafeHTTPTimeout = 30 * time.Second
	// safeDialTimeout bounds one connection attempt, so that an address
	// that drops packets leaves time in the request's budget to try the
	// name's next address.
	safeDialTimeout = 10 * time.Second
	// safeTLSHandshakeTimeout is net/http's default, kept explicit
	// because a custom Transport starts at zero, meaning none.
	safeTLSHandshakeTimeout = 10 * time.Second
	// safeIdleConnTimeout is below the keep-alive timeout of common
	// servers (nginx 75 s) so that we usually close an idle connection
	// before the server does, instead of racing it with a POST that
	// cannot be retried.
	safeIdleConnTimeout = 30 * time.Second
	// defaultSafeMaxIdleConnsPerHost is the idle connections kept per
	// host when the caller does not say how many requests it runs at
	// once (safeHTTPOptions.Concurrency); net/http's default keeps 2.
	defaultSafeMaxIdleConnsPerHost = 32
	// safeMaxIdleConns caps idle connections over all endpoints: the
	// net/http default, enough for a few busy hosts at once.
	safeMaxIdleConns = 100
	// safeMaxResponseHeaderBytes: a webhook answer needs a few headers;
	// net/http's 1 MiB default is memory a hostile receiver could take
	// from every worker.
	safeMaxResponseHeaderBytes = 64 << 10
)

type safeHTTPOptions struct {
	// AllowPrivate turns the address guard off, so that endpoints on
	// loopback and private networks are reachable: development and tests.
	AllowPrivate bool
	// Timeout bounds a whole request, reading the response body included.
	// Zero means defaultSafeHTTPTimeout, not forever.
	Timeout time.Duration
	// LongestTimeout, if longer than Timeout, is the longest a copy of
	// the client given a Timeout of its own may wait for an answer's
	// headers over the shared transport: an endpoint's timeout_seconds
	// (endpointrequest.go).
	LongestTimeout time.Duration
	// Concurrency is how many requests the caller runs at once, all of
	// which may go to one busy endpoint. That many idle connections are
	// kept per host: with fewer, every request beyond them closes its
	// connection after use and the next one pays a new TCP (and TLS)
	// handshake, which under a backlog is most of them. Zero means
	// defaultSafeMaxIdleConnsPerHost.
	Concurrency int
	// LookupIP resolves host names; nil means net.DefaultResolver's
	// LookupNetIP. Tests answer here so they need no DNS server.
	LookupIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
	// AllowAddrs are exact addresses (IP and port) reachable whatever the
	// guard says of them: -demo's own receiver on outboxd's listener, so
	// that the demo needs no guard turned off for every endpoint.
	AllowAddrs []netip.AddrPort
	// Proxy, if set, is the HTTP CONNECT proxy every connection goes
	// through (-egress-proxy). The target is still resolved and judged
	// here, and the proxy is asked for the vetted address, never the
	// name, so it cannot resolve the name to somewhere else.
	Proxy *url.URL
	// ProxyRootCAs verify an https:// proxy; nil: the system's roots.
	ProxyRootCAs *x509.CertPool
	// ClientCertificate, if set, is presented to a receiver that asks
	// for one (an endpoint's client_certificate, clientcert.go).
	ClientCertificate *tls.Certificate
	// RootCAs, if set, are the only authorities a receiver's certificate
	// may chain to (an endpoint's ca_certificate); nil: the system's.
	RootCAs *x509.CertPool
}

// newSafeHTTPClient returns the client for every request to a user-given
// URL: webhook deliveries, test pings, notifications. It does not follow
// redirects: the caller gets the 3xx response and counts it a failed
// delivery, as Standard Webhooks asks, and a receiver cannot bounce us to
// an internal address. Callers read bodies with readLimited.
func newSafeHTTPClient(opts safeHTTPOptions) *http.Client {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = defaultSafeHTTPTimeout
	}
	idlePerHost := opts.Concurrency
	if idlePerHost <= 0 {
		idlePerHost = defaultSafeMaxIdleConnsPerHost
	}
	lookup := opts.LookupIP
	if lookup == nil {
		lookup = net.DefaultResolver.LookupNetIP
	}
	allowAddrs := make([]netip.AddrPort, len(opts.AllowAddrs))
	for i, ap := range opts.AllowAddrs {
		allowAddrs[i] = unmapPort(ap)
	}
	d := &safeDialer{
		allowPrivate: opts.AllowPrivate,
		allowAddrs:   allowAddrs,
		lookup:       lookup,
		dialer:       newSafeDialer(opts.AllowPrivate, allowAddrs),
	}
	if opts.Proxy != nil {
		d.proxy = newEgressProxy(opts.Proxy, opts.ProxyRootCAs)
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: opts.RootCAs}
	if cert := opts.ClientCertificate; cert != nil {
		tlsConfig.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{
		Transport: &http.Transport{
			// An environment proxy would connect for us, to addresses
			// our dialer never sees.
			Proxy:       nil,
			DialContext: d.dialContext,
			// A custom DialContext turns HTTP/2 off unless forced.
			ForceAttemptHTTP2: true,
			TLSClientConfig:   tlsConfig,
			// The client's Timeout already covers this; repeated on the
			// transport so the bound holds for anyone who reuses it.
			ResponseHeaderTimeout:  max(timeout, opts.LongestTimeout),
			TLSHandshakeTimeout:    safeTLSHandshakeTimeout,
			IdleConnTimeout:        safeIdleConnTimeout,
			MaxIdleConns:           max(safeMaxIdleConns, idlePerHost),
			MaxIdleConnsPerHost:    idlePerHost,
			MaxResponseHeaderBytes: safeMaxResponseHeaderBytes,
		},
		Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// newSafeDialer returns a dialer whose Control hook sees the address each
// socket is about to connect to, after every resolution, so no DNS answer
// (however it changes between lookups) reaches a forbidden address.
func newSafeDialer(allowPrivate bool, allowAddrs []netip.AddrPort) *net.Dialer {
	d := &net.Dialer{Timeout: safeDialTimeout}
	if !allowPrivate {
		d.ControlContext = func(ctx context.Context, network, address string, c syscall.RawConn) error {
			if ap, err := netip.ParseAddrPort(address); err == nil && slices.Contains(allowAddrs, unmapPort(ap)) {
				return nil
			}
			return guardDialControl(ctx, network, address, c)
		}
	}
	return d
}

// unmapPort is ap with an IPv4-mapped address read as IPv4, the form
// AllowAddrs are compared in.
func unmapPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// guardDialControl is the last word on every connection: it refuses
// anything it cannot positively read as TCP to a public address.
func guardDialControl(_ context.Context, network, address string, _ syscall.RawConn) error {
	if network != "tcp4" && network != "tcp6" {
		return fmt.Errorf("refuse network %q: %w", network, errForbiddenAddress)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("refuse unreadable address %q: %w", address, errForbiddenAddress)
	}
	if reason := forbiddenIPReason(ap.Addr()); reason != "" {
		return refuseAddr(ap.Addr(), reason)
	}
	return nil
}

// safeDialer resolves names itself, to refuse a name outright when any of
// its addresses is forbidden. Otherwise a name answering one public and one
// internal address would reach the internal one whenever the public one
// fails to connect, which its owner can arrange. The Control hook then
// checks each connection again.
type safeDialer struct {
	allowPrivate bool
	allowAddrs   []netip.AddrPort
	lookup       func(ctx context.Context, network, host string) ([]netip.Addr, error)
	dialer       *net.Dialer
	proxy        *egressProxy // nil: connect directly
}

func (d *safeDialer) dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", address, err)
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		var ipNetwork string
		switch network {
		case "tcp":
			ipNetwork = "ip"
		case "tcp4":
			ipNetwork = "ip4"
		case "tcp6":
			ipNetwork = "ip6"
		default:
			return nil, fmt.Errorf("dial %s %s: refuse network: %w", network, address, errForbiddenAddress)
		}
		addrs, err = d.lookup(ctx, ipNetwork, host)
		if err != nil {
			return nil, fmt.Errorf("dial %s %s: %w", network, address, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("dial %s %s: no addresses", network, address)
		}
	}
	if !d.allowPrivate {
		portNum, _ := strconv.ParseUint(port, 10, 16)
		for _, ip := range addrs {
			if slices.Contains(d.allowAddrs, netip.AddrPortFrom(ip.Unmap(), uint16(portNum))) {
				continue
			}
			if reason := forbiddenIPReason(ip); reason != "" {
				return nil, fmt.Errorf("dial %s %s: %w", network, address, refuseAddr(ip, reason))
			}
		}
	}

	return d.dialFirst(ctx, network, addrs, port)
}

// dialFirst connects to the first of addrs (vetted) on port that answers,
// directly or through the egress proxy: in the resolver's order (RFC 6724
// preference), one at a time; the first error is the one worth
// reporting, as net.Dialer does.
func (d *safeDialer) dialFirst(ctx context.Context, network string, addrs []netip.Addr, port string) (net.Conn, error) {
	var firstErr error
	for _, ip := range addrs {
		target := net.JoinHostPort(ip.Unmap().String(), port)
		var conn net.Conn
		var err error
		if d.proxy != nil {
			conn, err = d.proxy.connect(ctx, target)
		} else {
			conn, err = d.dialer.DialContext(ctx, network, target)
		}
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// egressProxy is -egress-proxy: an HTTP CONNECT proxy every delivery
// goes through. It is the operator's choice, so no guard judges its own
// address (it may well be on loopback); safeDialer judges each target
// before asking the proxy for it.
type egressProxy struct {
	addr string      // host:port
	tls  *tls.Config // nil: an http:// proxy, spoken to in the clear
	// auth is the Proxy-Authorization value, from the URL's userinfo; ""
	// sends none.
	auth   string
	dialer *net.Dialer
}

// newEgressProxy is the proxy at u, which parseEgressProxy accepted;
// roots verify an https:// proxy (nil: the system's).
func newEgressProxy(u *url.URL, roots *x509.CertPool) *egressProxy {
	p := &egressProxy{dialer: &net.Dialer{Timeout: safeDialTimeout}}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	p.addr = net.JoinHostPort(u.Hostname(), port)
	if u.Scheme == "https" {
		p.tls = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname(), RootCAs: roots}
	}
	if u.User != nil {
		password, _ := u.User.Password()
		p.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+password))
	}
	return p
}

// connect opens a tunnel through the proxy to target, an address (IP and
// port) the caller has vetted. The transport then speaks HTTP, or TLS
// with the endpoint's host name for SNI and verification, through it.
func (p *egressProxy) connect(ctx context.Context, target string) (net.Conn, error) {
	conn, err := p.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s: %w", p.addr, err)
	}
	// The exchange below reads and writes without deadlines of its own:
	// closing the connection is what ends it when ctx does.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	tunnel, err := p.handshake(conn, target)
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("egress proxy %s: connect %s: %w", p.addr, target, ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("egress proxy %s: connect %s: %w", p.addr, target, err)
	}
	return tunnel, nil
}

// handshake speaks TLS to an https:// proxy, then asks it for target.
func (p *egressProxy) handshake(conn net.Conn, target string) (net.Conn, error) {
	if p.tls != nil {
		tc := tls.Client(conn, p.tls)
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		conn = tc
	}
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
	if p.auth != "" {
		req.Header.Set("Proxy-Authorization", p.auth)
	}
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("proxy answered %s", resp.Status)
	}
	if br.Buffered() > 0 {
		// Neither HTTP nor TLS lets a server speak first, so this is
		// a proxy that does not tunnel what it is sent.
		return nil, errors.New("proxy sent data ahead of the tunnel")
	}
	return conn, nil
}

// parseEgressProxy reads -egress-proxy: an http:// or https:// URL of a
// CONNECT proxy, with an optional user:password for Basic
// authentication, and nothing else. Its errors never quote the password.
func parseEgressProxy(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err // it quotes the whole URL, password included
		}
		return nil, err
	}
	shown := u.Redacted()
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%q: scheme must be http or https", shown)
	case u.Opaque != "" || u.Hostname() == "":
		return nil, fmt.Errorf("%q: want http(s)://[user:password@]host[:port]", shown)
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.Fragment != "":
		return nil, fmt.Errorf("%q: a proxy URL has no path, query or fragment", shown)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%q: port out of range", shown)
		}
	}
	return u, nil
}

// validateEgressProxy checks -egress-proxy at start; empty is none.
func validateEgressProxy(raw string) error {
	if raw == "" {
		return nil
	}
	if _, err := parseEgressProxy(raw); err != nil {
		return fmt.Errorf("%s: %w", setting("egress-proxy"), err)
	}
	return nil
}

// readLimited reads r up to n bytes (n >= 0). truncated reports that r held
// more, which is then left unread: the caller closes the body, and the
// connection with it, rather than drain an answer that may never end.
func readLimited(r io.Reader, n int64) (body []byte, truncated bool, err error) {
	body, err = io.ReadAll(io.LimitReader(r, n+1))
	if err != nil {
		return body, false, fmt.Errorf("read body: %w", err)
	}
	if int64(len(body)) > n {
		return body[:n], true, nil
	}
	return body, false, nil
}
