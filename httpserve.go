// httpserve.go: how every request is served, below the routes (admin.go)
// and the handlers (api.go, panel.go): what the handlers share (admin),
// the deadline, id and headers every request gets, who sent it and over
// what (the proxies in front tell), the budget of wrong admin tokens each
// client address has, the two shapes a handler takes (a JSON answer or a
// page), and how a failure becomes a status, told and logged once; and
// the two reads the API and the panel both show.

package main

import (
	"container/list"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// admin is what the HTTP handlers need, built once in run.
type admin struct {
	db       *sql.DB
	token    string
	alerts   AlertConfig
	counters *processCounters
	panel    *panel
	// endpoints is what endpoint validation and rotation need.
	endpoints endpointPolicy
	// eventsRetention clamps replays; maxAttempts is a replayed job's.
	eventsRetention time.Duration
	maxAttempts     int
	// demo, with -demo, receives the demo's webhooks on /demo/hook.
	demo *demo
	// metricsPublic serves /metrics without the token, for a scraper on a
	// private network that cannot hold secrets.
	metricsPublic bool
	// requestTimeout, when set, replaces the package's requestTimeout:
	// for a test that must see a request outrun it.
	requestTimeout time.Duration
	// previewTimeout, when set, replaces filterPreviewTimeout (filters.go):
	// for a test that must see a filter preview outrun it.
	previewTimeout time.Duration
	logger         *slog.Logger
	// box seals the secrets of endpoints and sources; nil without
	// -secrets-key (secrets.go).
	box *secretBox
	// publicURL is where browsers reach outboxd (-public-url); nil
	// when it is not set.
	publicURL *url.URL
	// listenURL is the scheme outboxd serves and the address its
	// listener bound (the port it chose for -addr's port 0): where a
	// sign-in link points without publicURL. Never a request's Host
	// header, which its sender writes.
	listenURL url.URL
	// tokenGenerated says token was made up at start, not configured:
	// the ready line shows it (readyLine, main.go).
	tokenGenerated bool
	// trustedProxies may say whom they forward and over what scheme
	// (-trusted-proxies).
	trustedProxies prefixList
	// auth slows and counts wrong admin tokens, per client address
	// (admin.go).
	auth *authLimiter
	// signinLinks is how long a sign-in link for an owner stays good
	// (-signin-link-lifetime, owners.go).
	signinLinks time.Duration
}

// requestTimeout bounds every request: its context ends then, which
// cancels its queries, and it answers 503 (failed). The longest handlers
// are an endpoint's replay and retry of its discarded deliveries, 5,000
// jobs a statement (manualBatch); a minute is tens of such statements. The
// server's write timeout (newHTTPServer) is set above it, so that the 503
// is still written rather than the connection cut.
const requestTimeout = time.Minute

// deadline is how long a request may run: requestTimeout, unless a test
// set a shorter one.
func (a *admin) deadline() time.Duration {
	if a.requestTimeout > 0 {
		return a.requestTimeout
	}
	return requestTimeout
}

// withDeadline ends every request's context after d.
func withDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// requestIDHeader carries a request's id, answered on every response and
// logged with every 5xx, so that the failure a client reports can be found
// in the log.
const requestIDHeader = "X-Request-Id"

// saneRequestID is an id a client or a proxy in front may choose, so one
// request can be followed through both logs: short, and without anything
// that could forge a log field or a header.
var saneRequestID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// requestIDKey keys the request's id in its context.
type requestIDKey struct{}

// withRequestID gives each request an id: the incoming X-Request-Id if it
// is sane, otherwise a random one.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(requestIDHeader)
		if !saneRequestID.MatchString(id) {
			id = rand.Text()
		}
		w.Header().Set(requestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	})
}

// requestID is the id withRequestID gave r.
func requestID(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	return id
}

// hstsMaxAge is how long a browser that reached outboxd over HTTPS
// refuses to reach it over plain HTTP: a year, the least the browsers'
// HSTS preload lists accept, and longer than the months an operator may
// go between two visits to the panel. Without includeSubDomains: outboxd
// speaks for its own host, not for its domain's others.
const hstsMaxAge = 365 * 24 * time.Hour

// securityHeaders: no framing, no sniffing, no inline script anywhere (the
// panel has none), no referrer leaking a URL, and no answer kept by a
// browser or a proxy (pages and answers show secrets, whsec_ ones among
// them, and state that is stale a second later); the static assets
// alone say otherwise. A request that came over HTTPS (overHTTPS) gets
// HSTS.
func securityHeaders(overHTTPS func(*http.Request) bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if overHTTPS(r) {
			h.Set("Strict-Transport-Security", fmt.Sprintf("max-age=%d", int64(hstsMaxAge.Seconds())))
		}
		h.Set("Cache-Control", "no-store")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

// panelBase is the root URL a person outside opens outboxd at: the
// public URL, else the address its listener bound. The ready line and
// owners' sign-in links start from it.
func (a *admin) panelBase() url.URL {
	if a.publicURL != nil {
		return *a.publicURL
	}
	return a.listenURL
}

// overHTTPS reports whether the browser reached outboxd over HTTPS:
// -public-url says so, outboxd terminated TLS itself, or a trusted proxy
// in front did and says so in X-Forwarded-Proto (the first value: the
// scheme the outermost proxy was reached over).
func (a *admin) overHTTPS(r *http.Request) bool {
	switch {
	case r.TLS != nil:
		return true
	case a.publicURL != nil && a.publicURL.Scheme == "https":
		return true
	case !a.trustedProxies.contains(peerAddr(r)):
		return false
	}
	first, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	return strings.EqualFold(strings.TrimSpace(first), "https")
}

// clientAddr is the address a request came from: its peer's, unless the
// peer is a trusted proxy; then the nearest address in X-Forwarded-For
// that is not one, read from the right, where each proxy appends the
// peer it heard from. Whatever a client writes there itself sits to the
// left of the address its proxy appended, and is never reached, unless
// that address is a trusted proxy's too.
func (a *admin) clientAddr(r *http.Request) netip.Addr {
	client := peerAddr(r)
	if !a.trustedProxies.contains(client) {
		return client
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		hop, ok := parseHop(strings.TrimSpace(hops[i]))
		if !ok {
			return client // a proxy wrote no address: its peer is all we know
		}
		if client = hop; !a.trustedProxies.contains(hop) {
			break
		}
	}
	return client
}

// parseHop reads one X-Forwarded-For entry: an address, or an address
// and port as some proxies write it (1.2.3.4:5678, [2001:db8::1]:5678).
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// peerAddr is the address of r's connection's other end; the zero
// address if it has none (a test's request).
func peerAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// A token's verdict: right, wrong, or not checked because its address
// sent too many wrong ones.
type tokenVerdict int

const (
	tokenAccepted tokenVerdict = iota
	tokenRefused
	tokenThrottled
)

// Each client address may send authFailureBurst wrong admin tokens, and
// one more every authFailureRefill after: an operator mistyping or
// pasting the wrong token a few times never meets the limit, and a
// guesser gets 14,400 tries a day, nothing against the 2^128 tokens start
// allows (validateAdminToken). An address past its budget is answered
// 429 with Retry-After, its tokens unchecked, so that what it sends tells
// it nothing; and at once: a delay would hold a goroutine, and a
// connection, for every try, which is what an attacker would pay for.
// The budget is each address's: a right token from any other address is
// never refused, and sessions already signed in go on, from any address.
const (
	authFailureBurst  = 10
	authFailureRefill = 6 * time.Second
)

// maxAuthBudgets bounds the addresses remembered at once: at about 200
// bytes each, 2 MB. An address is forgotten once its budget has refilled
// (authFailureBurst × authFailureRefill after its last wrong token); past
// the bound the one that failed longest ago is, whose budget is the
// fullest. More addresses than that failing within a minute are an
// attack no per-address budget stops: auth_failures fires for it.
const maxAuthBudgets = 10_000

// authLimiter keeps the budget of wrong admin tokens of each client
// address that sent one recently, and counts them all (authMetrics).
// IPv6 clients are budgeted by /64, the least a site is given, so that
// one host cannot spend the addresses of its network one by one.
type authLimiter struct {
	metrics *authMetrics
	logger  *slog.Logger
	now     func() time.Time // time.Now; a test's stands still
	mu      sync.Mutex       // protects following fields
	budgets map[netip.Prefix]*list.Element
	order   list.List // of *authBudget, the least recently failed first
}

// authBudget is one address's wrong tokens: it had tokens left after
// its last, at. logged says its running out was logged: once until it is
// forgotten, however often it runs out meanwhile.
type authBudget struct {
	key    netip.Prefix
	tokens float64
	at     time.Time
	logged bool
}

func newAuthLimiter(metrics *authMetrics, logger *slog.Logger) *authLimiter {
	return &authLimiter{metrics: metrics, logger: logger, now: time.Now, budgets: map[netip.Prefix]*list.Element{}}
}

// recentFailures is how many wrong tokens were sent within
// authFailureWindow: what the auth_failures alert judges.
func (l *authLimiter) recentFailures() int64 { return l.metrics.recent(l.now()) }

// left is how many wrong tokens b may still send at now.
func (b *authBudget) left(now time.Time) float64 {
	return min(authFailureBurst, b.tokens+float64(now.Sub(b.at))/float64(authFailureRefill))
}

// check judges a token from client that was right or not; a throttled
// verdict carries the seconds until client may try again. The first wrong
// token that spends an address's last try is logged, naming it.
func (l *authLimiter) check(client netip.Addr, via string, right bool) (tokenVerdict, int) {
	verdict, retry, spent := l.judge(budgetKey(client), via, right, l.now())
	if spent {
		l.logger.Warn("too many wrong admin tokens from one address: its tokens are refused unchecked until its budget refills",
			"client", client, "via", via, "burst", authFailureBurst, "refill", authFailureRefill)
	}
	return verdict, retry
}

// throttled reports whether client is past its budget, with the seconds
// until it may try again, spending nothing: for a check whose try uses
// something up (a sign-in link), made before it.
func (l *authLimiter) throttled(client netip.Addr) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.forget(now)
	if e := l.budgets[budgetKey(client)]; e != nil && e.Value.(*authBudget).left(now) < 1 {
		return true, retryAfter(e.Value.(*authBudget), now)
	}
	return false, 0
}

// judge is check under the lock: spent says that this wrong token was
// key's last try, for the first time since key was remembered.
func (l *authLimiter) judge(key netip.Prefix, via string, right bool, now time.Time) (verdict tokenVerdict, retry int, spent bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forget(now)
	e := l.budgets[key]
	if e != nil && e.Value.(*authBudget).left(now) < 1 {
		l.metrics.failed(via, true, now)
		return tokenThrottled, retryAfter(e.Value.(*authBudget), now), false
	}
	if right {
		return tokenAccepted, 0, false
	}
	l.metrics.failed(via, false, now)
	if e == nil {
		if l.order.Len() >= maxAuthBudgets {
			delete(l.budgets, l.order.Remove(l.order.Front()).(*authBudget).key)
		}
		e = l.order.PushBack(&authBudget{key: key, tokens: authFailureBurst, at: now})
		l.budgets[key] = e
	}
	b := e.Value.(*authBudget)
	b.tokens, b.at = b.left(now)-1, now
	l.order.MoveToBack(e)
	spent = b.tokens < 1 && !b.logged
	b.logged = b.logged || spent
	return tokenRefused, 0, spent
}

// forget drops the budgets refilled by now from the front of the order,
// that of their last wrong token, up to the first that has not: what it
// leaves behind is bounded by maxAuthBudgets all the same.
func (l *authLimiter) forget(now time.Time) {
	for e := l.order.Front(); e != nil; e = l.order.Front() {
		b := e.Value.(*authBudget)
		if b.left(now) < authFailureBurst {
			return
		}
		l.order.Remove(e)
		delete(l.budgets, b.key)
	}
}

// retryAfter is the whole seconds until b may send a token again.
func retryAfter(b *authBudget, now time.Time) int {
	wait := time.Duration((1 - b.left(now)) * float64(authFailureRefill))
	return max(1, int((wait+time.Second-1)/time.Second))
}

// budgetKey is the address a budget is kept for: an IPv4 address, or an
// IPv6 address's /64.
func budgetKey(a netip.Addr) netip.Prefix {
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.Prefix(64) // the zero address (no peer) keys the zero prefix
	return p
}

// apiFunc is a JSON handler, the one shape of them all: it answers status
// with body as JSON (a 204 without one), or fails with err.
type apiFunc func(r *http.Request) (status int, body any, err error)

// maxRequestBody bounds every body serveJSON reads: an event payload may be
// up to 1 MiB (schema.sql) plus its envelope.
const maxRequestBody = 1<<20 + 4096

// serveJSON is the adapter every JSON handler is served through, so that
// none can forget the body bound, and every error is answered and logged
// the same way.
func (a *admin) serveJSON(h apiFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = markedBody{http.MaxBytesReader(w, r.Body, maxRequestBody)}
		status, body, err := h(r)
		if wh, ok := body.(withHeader); ok {
			for name, values := range wh.header {
				w.Header()[name] = values
			}
			body = wh.body
		}
		switch {
		case err != nil:
			a.answerFailure(w, r, err)
		case status == http.StatusNoContent:
			w.WriteHeader(status)
		default:
			if err := writeJSON(w, status, body); err != nil {
				a.failed(r, err) // answered already; failed logs it
			}
		}
	})
}

// withHeader is a JSON handler's answer with header fields besides, for
// the few answers whose body does not say all (a replayed POST
// /api/events says so in Idempotent-Replayed).
type withHeader struct {
	header http.Header
	body   any
}

// answerFailure answers a JSON request that failed with err, as failed
// says.
func (a *admin) answerFailure(w http.ResponseWriter, r *http.Request, err error) {
	status, err := a.failed(r, err)
	writeError(w, status, err)
}

// pageFunc is a panel handler, the one shape of them all: it renders a
// page or redirects, or fails with err.
type pageFunc func(w http.ResponseWriter, r *http.Request) error

// servePage is the adapter every panel handler is served through: a
// failure is shown on the panel's error page, and answered and logged as
// failed says, like the API's.
func (a *admin) servePage(h pageFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			status, err := a.failed(r, err)
			a.panel.renderError(w, status, err)
		}
	})
}

// failed is the status a failed request answers and the error it tells,
// and the one place that logs it: a 5xx is the server's fault, which the
// operator must see once, with the error whole; a 4xx is the client's,
// and its answer says all there is. The error told is answerOf's text,
// never the driver's or the socket's. A request that outran
// requestTimeout failed for that, whatever its cancelled query said.
func (a *admin) failed(r *http.Request, err error) (int, error) {
	status, text := answerOf(err)
	switch {
	case status == http.StatusRequestTimeout:
		// The body stalled: the server's read timeout also ended the
		// request's context, but the client is there to read a 408.
		a.logger.Debug("request body not received in time", "method", r.Method, "path", r.URL.Path,
			"request_id", requestID(r), "err", err)
		return status, errors.New(text)
	case errors.Is(r.Context().Err(), context.Canceled):
		// The client went away and its cancelled query failed: nobody
		// reads this answer, and it is not the server's fault.
		a.logger.Debug("request abandoned by its client", "method", r.Method, "path", r.URL.Path, "request_id", requestID(r))
		return statusClientClosedRequest, errors.New("client closed the request")
	case errors.Is(r.Context().Err(), context.DeadlineExceeded):
		status, text = http.StatusServiceUnavailable, fmt.Sprintf("request took longer than %s", a.deadline())
	}
	if status >= 500 {
		a.logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", status,
			"request_id", requestID(r), "err", err)
	}
	return status, errors.New(text)
}

// statusClientClosedRequest is the status of a request whose client left
// before its answer (nginx's 499): written to no one, but not a 5xx.
const statusClientClosedRequest = 499

// answerOf maps a failure to its HTTP status and the message its answer
// tells: the one place that does. The message never holds a driver's
// error text or a socket's address, which only the log shows:
//   - an httpError tells its text, when it chose one;
//   - a body that stalled past the server's read timeout is a 408, one
//     that broke off a 400, each with a plain message;
//   - the database's refusal of a value the client gave (a CHECK, a NOT
//     NULL, a value its type cannot hold) is a 400 naming the field and
//     its rule (inputRefusal);
//   - a 5xx names the operation that failed, its cause cut off
//     (operationOf).
func answerOf(err error) (int, string) {
	he, _ := errors.AsType[*httpError](err)
	var status int
	_, tooBig := errors.AsType[*http.MaxBytesError](err)
	refusal, refused := inputRefusal(err)
	switch {
	case he != nil:
		status = he.status
	case errors.Is(err, errBodyRead) && errors.Is(err, os.ErrDeadlineExceeded):
		return http.StatusRequestTimeout, "request body not received within the server's read timeout"
	case errors.Is(err, errBodyRead):
		return http.StatusBadRequest, "request body broke off before its end"
	case refused:
		return http.StatusBadRequest, refusal
	case tooBig:
		status = http.StatusRequestEntityTooLarge
	case errors.Is(err, errInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, errNotFound):
		status = http.StatusNotFound
	case errors.Is(err, errConflict):
		status = http.StatusConflict
	case errors.Is(err, errIdempotencyKeyReused):
		status = http.StatusUnprocessableEntity
	case errors.Is(err, context.DeadlineExceeded):
		status = http.StatusServiceUnavailable
	default:
		status = http.StatusInternalServerError
	}
	switch {
	case he != nil && he.text != "":
		return status, he.text
	case status >= 500:
		return status, operationOf(err)
	}
	text := strings.TrimPrefix(err.Error(), errInvalid.Error()+": ")
	return status, strings.TrimPrefix(text, errConflict.Error()+": ")
}

// operationOf is a server error's text without its cause when the cause
// is the driver's or the network's (a SQLSTATE message, an address):
// "create source: pq: ..." tells "create source: database error". An
// error whose text does not end in its cause's, as every wrap here does
// (%w last), tells nothing but that it failed.
func operationOf(err error) string {
	var cause error
	what := "database error"
	if pqErr, ok := errors.AsType[*pq.Error](err); ok {
		cause = pqErr
	} else if netErr, ok := errors.AsType[net.Error](err); ok {
		cause, what = netErr, "network error"
	}
	text := err.Error()
	if cause == nil {
		return text
	}
	if op, ok := strings.CutSuffix(text, ": "+cause.Error()); ok {
		return op + ": " + what
	}
	return "internal error: " + what
}

// constraintRules names, for every CHECK an API request can break, the
// field it gave and the rule, which the 400 tells in place of the
// constraint: the Go code checks most of them first, and these are the
// last word (schema.sql). TestConstraintRulesNameSchemaConstraints holds
// the names to the schema.
var constraintRules = map[string]string{
	"events_topic_format":               "topic: 1-200 characters of letters, digits and _ . : / - (not starting with a symbol)",
	"events_subject_length":             "subject: at most 500 characters",
	"events_payload_size":               "payload: at most 1 MiB (1,048,576 bytes) as PostgreSQL stores it",
	"inbox_webhook_id_length":           "webhook-id: 1 to 256 characters",
	"inbox_sources_name_format":         "name: 1-50 of a-z 0-9 _ -",
	"inbox_sources_topic_prefix_format": "topic_prefix: empty, or up to 100 topic characters",
	"inbox_sources_secret_length":       "secret: 24 to 64 bytes",
	"endpoints_url_scheme":              "url: http://, https:// or mailto:, at most 2048 bytes",
	"endpoints_description_length":      "description: at most 1000 characters",
	"endpoints_owner_email_length":      "owner_email: at most 254 characters",
	"endpoints_topics_count":            "topics: at most 100",
	"endpoints_max_in_flight_range":     "max_in_flight: 1 to 1000",
	"endpoints_rate_limit_range":        "rate_limit_per_second: 0.01 to 10000",
	"endpoints_ordering_known":          `ordering: "none" or "subject"`,
	"endpoints_filter_length":           "filter: at most 4096 bytes",
	"endpoints_filter_allowed":          "filter: a predicate, without variables or .datetime()",
	"endpoints_tls_material_https":      "client_certificate, ca_certificate: for an https:// url only; remove them (null) to use another",
	"idempotency_keys_key_length":       "Idempotency-Key: 1 to 255 characters",
	"topics_name_format":                "name: 1-200 characters of letters, digits and _ . : / - (not starting with a symbol)",
	"topics_description_length":         "description: at most 2000 characters",
	"topics_example_size":               "example: at most 64 KiB as PostgreSQL stores it",
}

// valueRules says, by SQLSTATE, what is wrong with a value PostgreSQL
// could not take as its column's type; the field comes from the error
// (inputRefusal).
var valueRules = map[pqerror.Code]string{
	pqerror.InvalidTextRepresentation:   "not valid for its type (for JSON: a lone UTF-16 surrogate escape)",
	pqerror.UntranslatableCharacter:     `\u0000 is not allowed (PostgreSQL's text and jsonb hold no NUL)`,
	pqerror.CharacterNotInRepertoire:    "must be UTF-8 text without NUL",
	pqerror.StringDataRightTruncation:   "too long",
	pqerror.NumericValueOutOfRange:      "number out of range",
	pqerror.InvalidParameterValue:       "not a value this field takes",
	pqerror.DatetimeFieldOverflow:       "not a valid time",
	pqerror.InvalidDatetimeFormat:       "not a valid time",
	pqerror.NullValueNotAllowed:         "required",
	pqerror.NotNullViolation:            "required",
	pqerror.InvalidBinaryRepresentation: "not valid for its type",
}

// inputRefusal is the 400's message for the database's refusal of a value
// the client gave, and whether err is one: a CHECK (constraintRules) or a
// NOT NULL broken, or a value of class 22 (data exception). The field is
// the constraint's, the column's, or the one the operation named
// (fieldError), else "request".
func inputRefusal(err error) (string, bool) {
	pqErr := pq.As(err)
	if pqErr == nil {
		return "", false
	}
	if rule, ok := constraintRules[pqErr.Constraint]; ok && pqErr.Code == pqerror.CheckViolation {
		return rule, true
	}
	if pqErr.Code.Class() != "22" && pqErr.Code != pqerror.CheckViolation && pqErr.Code != pqerror.NotNullViolation {
		return "", false
	}
	field := "request"
	if fe, ok := errors.AsType[*fieldError](err); ok {
		field = fe.field
	} else if pqErr.Column != "" {
		field = pqErr.Column
	}
	rule, ok := valueRules[pqErr.Code]
	if !ok {
		rule = "a value outside what the database accepts"
	}
	return field + ": " + rule, true
}

// httpError is an error that picks its own answer, for the few failures
// that are not the domain's errors answerOf maps. text, when set, is what
// the client is told instead of err, which then only the log shows.
type httpError struct {
	status int
	text   string
	err    error
}

func (e *httpError) Error() string {
	switch {
	case e.err == nil:
		return e.text
	case e.text == "":
		return e.err.Error()
	}
	return e.text + ": " + e.err.Error()
}

func (e *httpError) Unwrap() error { return e.err }

// writeJSON answers v as JSON. A v that cannot be encoded is the server's
// fault: the client gets a 500 that says so, and the error is returned for
// the log.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encode response"}`)
		err = fmt.Errorf("encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
	return err
}

// writeError answers {"error": "..."}: err's text as failed (answerOf)
// made it, or a text the caller wrote.
func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// overview is the overview with what the process counted beside the
// database: the API and the panel show the same.
func (a *admin) overview(ctx context.Context) (Overview, error) {
	o, err := readOverview(ctx, a.db, a.alerts)
	if err != nil {
		return o, err
	}
	a.counters.addTo(&o)
	return o, nil
}

// eventWithJobs is an event and every job it made, as GET
// /api/events/{id} and the panel's event page show it.
type eventWithJobs struct {
	Event
	Jobs []JobView `json:"jobs"`
}

// readEventWithJobs reads event id and every job it made.
func readEventWithJobs(ctx context.Context, db *sql.DB, id int64) (eventWithJobs, error) {
	ev, err := getEvent(ctx, db, id)
	if err != nil {
		return eventWithJobs{}, err
	}
	jobs, err := listJobs(ctx, db, JobFilter{EventID: id, Limit: maxEventPage})
	if err != nil {
		return eventWithJobs{}, err
	}
	return eventWithJobs{Event: ev, Jobs: jobs}, nil
}
