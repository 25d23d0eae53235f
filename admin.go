// admin.go: the HTTP surface: every route, access control and the
// conventions every handler follows. The JSON handlers are in api.go, the
// panel's in panel.go.

package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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
	logger         *slog.Logger
	// box seals the secrets of endpoints and sources; nil without
	// -secrets-key (secrets.go).
	box *secretBox
}

// routes is every route of outboxd in one place.
func routes(a *admin) http.Handler {
	// The JSON API, every route of it behind the admin token.
	api := http.NewServeMux()
	apiRoute := func(pattern string, h apiFunc) { api.Handle(pattern, a.serveJSON(h)) }
	apiRoute("GET /api/overview", handleOverview(a))
	apiRoute("POST /api/alerts/{name}/acknowledge", handleAcknowledgeAlert(a))
	apiRoute("GET /api/events", handleListEvents(a))
	apiRoute("POST /api/events", handleRecordEvent(a))
	apiRoute("GET /api/events/{id}", handleGetEvent(a))
	apiRoute("POST /api/events/{id}/requeue", handleRequeueEvent(a))
	apiRoute("GET /api/jobs", handleListJobs(a))
	apiRoute("POST /api/jobs/{id}/retry", handleRetryJob(a))
	apiRoute("POST /api/jobs/retry-discarded", handleRetryEveryDiscarded(a))
	apiRoute("GET /api/endpoints", handleListEndpoints(a))
	apiRoute("POST /api/endpoints", handleCreateEndpoint(a))
	apiRoute("GET /api/endpoints/{id}", handleGetEndpoint(a))
	apiRoute("PATCH /api/endpoints/{id}", handleUpdateEndpoint(a))
	apiRoute("DELETE /api/endpoints/{id}", handleDeleteEndpoint(a))
	apiRoute("POST /api/endpoints/{id}/enable", handleEnableEndpoint(a))
	apiRoute("POST /api/endpoints/{id}/pause", handlePauseEndpoint(a))
	apiRoute("POST /api/endpoints/{id}/resume", handleResumeEndpoint(a))
	apiRoute("POST /api/endpoints/{id}/disable", handleDisableEndpoint(a))
	apiRoute("POST /api/endpoints/{id}/rotate-secret", handleRotateEndpointSecret(a))
	apiRoute("POST /api/endpoints/{id}/replay", handleReplayEndpoint(a))
	apiRoute("POST /api/endpoints/{id}/retry-discarded", handleRetryDiscarded(a))
	apiRoute("GET /api/endpoints/{id}/replays", handleListReplays(a))
	apiRoute("POST /api/endpoints/{id}/replays/{replay_id}/cancel", handleCancelReplay(a))
	apiRoute("GET /api/endpoints/{id}/deliveries", handleEndpointDeliveries(a))
	apiRoute("GET /api/endpoints/{id}/stats", handleEndpointStatsWindow(a))
	apiRoute("GET /api/stats", handleStats(a))
	apiRoute("GET /api/sources", handleListSources(a))
	apiRoute("POST /api/sources", handleCreateSource(a))
	apiRoute("DELETE /api/sources/{name}", handleDeleteSource(a))
	apiRoute("POST /api/sources/{name}/rotate-secret", handleRotateSourceSecret(a))
	apiRoute("GET /api/subjects", handleListSubjects(a))
	apiRoute("/api/", handleNoRoute())

	mux := http.NewServeMux()
	mux.Handle("/api/", a.requireToken(api))
	mux.Handle("GET /healthz", a.serveJSON(handleHealthz()))
	mux.Handle("GET /readyz", a.serveJSON(handleReadyz(a)))
	if a.metricsPublic {
		mux.Handle("GET /metrics", handleMetrics(a))
	} else {
		mux.Handle("GET /metrics", a.requireToken(handleMetrics(a)))
	}
	// The inbox authenticates each request by its source's signature, not
	// by the admin token: senders hold no token.
	mux.Handle("POST /webhooks/{source}", advertiseDedupWindow(a.endpoints.InboxWindow, a.serveJSON(handleInbox(a))))
	if a.demo != nil {
		mux.Handle("POST /demo/hook", a.demo.receiver()) // signed, like any webhook
	}

	// The panel: HTML pages for a browser, signed in by a session cookie.
	p := a.panel
	static, _ := fs.Sub(staticFS, "static")
	staticFiles := http.StripPrefix("/static/", http.FileServerFS(static))
	mux.Handle("GET /static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The stylesheet changes only with a release: an hour's caching
		// bounds how long a browser shows the old one after an upgrade.
		w.Header().Set("Cache-Control", "max-age=3600")
		staticFiles.ServeHTTP(w, r)
	}))
	mux.Handle("GET /login", a.servePage(p.handleLoginForm()))
	mux.Handle("POST /login", a.servePage(p.handleLogin(a)))
	mux.Handle("POST /logout", a.servePage(p.handleLogout(a)))
	pageRoute := func(pattern string, h pageFunc) { mux.Handle(pattern, p.requireSession(a, a.servePage(h))) }
	pageRoute("GET /{$}", p.handleOverview(a))
	pageRoute("GET /events", p.handleEvents(a))
	pageRoute("GET /events/{id}", p.handleEvent(a))
	pageRoute("POST /events/{id}/requeue", p.handleRequeue(a))
	pageRoute("GET /endpoints", p.handleEndpoints(a))
	pageRoute("POST /endpoints", p.handleCreateEndpoint(a))
	pageRoute("GET /endpoints/{id}", p.handleEndpoint(a))
	pageRoute("POST /endpoints/{id}/{action}", p.handleEndpointAction(a))
	pageRoute("GET /sources", p.handleSources(a))
	pageRoute("POST /sources", p.handleCreateSource(a))
	pageRoute("POST /sources/{name}/{action}", p.handleSourceAction(a))
	pageRoute("GET /jobs", p.handleJobs(a))
	pageRoute("POST /jobs/{id}/retry", p.handleRetry(a))
	pageRoute("POST /jobs/retry-discarded", p.handleRetryEveryDiscarded(a))
	pageRoute("GET /subjects", p.handleSubjects(a))
	pageRoute("POST /alerts/{name}/acknowledge", p.handleAcknowledgeAlert(a))

	// Browsers may not make state-changing requests across origins; API
	// clients without Origin or Sec-Fetch-Site headers are unaffected.
	return withRequestID(withDeadline(a.deadline(), securityHeaders(http.NewCrossOriginProtection().Handler(mux))))
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

// securityHeaders: no framing, no sniffing, no inline script anywhere (the
// panel has none), no referrer leaking a URL, and no answer kept by a
// browser or a proxy (pages and answers show secrets, whsec_ ones among
// them, and state that is stale a second later); the static assets
// alone say otherwise.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

// requireToken lets a request through with "Authorization: Bearer <token>"
// (compared in constant time) or a live panel session.
func (a *admin) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bearerValid(a.token, r) {
			next.ServeHTTP(w, r)
			return
		}
		ok, err := a.hasSession(r)
		switch {
		case err != nil:
			a.answerFailure(w, r, err)
		case !ok:
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
			writeError(w, http.StatusUnauthorized, errors.New("missing or wrong admin token"))
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func bearerValid(token string, r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && tokenEqual(got, token)
}

// tokenEqual compares in constant time: an early mismatch takes as long
// as a late one, so timing tells an attacker nothing about the token.
func tokenEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// sessionCookie is the panel's session: a random id of sessionIDBytes,
// hex-encoded. The database knows it only by its HMAC under the token
// (outbox.panel_sessions in schema.sql), so neither the token nor a usable
// cookie sits in a table, and changing the token signs every session out.
const sessionCookie = "outboxd_session"

const (
	sessionIDBytes = 32
	// sessionLifetime is how long a sign-in lasts, on the server as in
	// the cookie.
	sessionLifetime = 12 * time.Hour
	// maxSessions bounds the sessions table: a sign-in past it signs the
	// oldest session out. An operator team signs in a few times a day.
	maxSessions = 1000
	// sessionSweep is the most expired sessions one sign-in deletes: more
	// than the one it adds, so that expired rows cannot pile up.
	sessionSweep = 100
)

// startSessionSQL records session $1 for $2 seconds, first deleting up to
// $3 expired sessions, oldest first, and up to $3 live ones beyond the
// newest $4.
const startSessionSQL = `
WITH swept AS (
  DELETE FROM outbox.panel_sessions
  WHERE id_hash IN (
    (SELECT id_hash
     FROM outbox.panel_sessions
     WHERE expires_at <= now()
     ORDER BY expires_at
     LIMIT $3)
    UNION ALL
    (SELECT id_hash
     FROM outbox.panel_sessions
     WHERE expires_at > now()
     ORDER BY expires_at DESC
     OFFSET $4
     LIMIT $3)
  )
)
INSERT INTO outbox.panel_sessions (id_hash, expires_at)
VALUES ($1, now() + make_interval(secs => $2))`

const sessionLiveSQL = `
SELECT EXISTS (
  SELECT 1
  FROM outbox.panel_sessions
  WHERE id_hash = $1
    AND expires_at > now()
)`

const endSessionSQL = `
DELETE FROM outbox.panel_sessions
WHERE id_hash = $1`

// sessionHash is what the database keeps of session id: its HMAC under
// the token.
func (a *admin) sessionHash(id []byte) []byte {
	mac := hmac.New(sha256.New, []byte(a.token))
	mac.Write(id)
	return mac.Sum(nil)
}

// sessionID is the id r's session cookie holds, or nil if it has none
// that could be one.
func sessionID(r *http.Request) []byte {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	id, err := hex.DecodeString(c.Value)
	if err != nil || len(id) != sessionIDBytes {
		return nil
	}
	return id
}

// hasSession reports whether r carries a session that is signed in and
// not expired: one row lookup, which every replica answers alike.
func (a *admin) hasSession(r *http.Request) (bool, error) {
	id := sessionID(r)
	if id == nil {
		return false, nil
	}
	var live bool
	if err := a.db.QueryRowContext(r.Context(), sessionLiveSQL, a.sessionHash(id)).Scan(&live); err != nil {
		return false, fmt.Errorf("read session: %w", err)
	}
	return live, nil
}

// startSession signs the browser in: a new session, and its cookie.
// Secure is set wherever browsers keep a Secure cookie: over TLS and on
// loopback.
func (a *admin) startSession(w http.ResponseWriter, r *http.Request) error {
	id := make([]byte, sessionIDBytes)
	rand.Read(id)
	if _, err := a.db.ExecContext(r.Context(), startSessionSQL,
		a.sessionHash(id), sessionLifetime.Seconds(), sessionSweep, maxSessions-1); err != nil {
		return fmt.Errorf("start session: %w", err)
	}
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    hex.EncodeToString(id),
		Path:     "/",
		MaxAge:   int(sessionLifetime.Seconds()),
		HttpOnly: true,
		Secure:   r.TLS != nil || isLoopbackHost(r.Host),
		SameSite: http.SameSiteStrictMode,
	})
	return nil
}

// endSession signs the browser out: its session is deleted, so that every
// replica refuses the cookie from now on, wherever a copy of it is, and
// the browser is told to forget it. If the delete fails the cookie is
// kept, and the error shown: the operator must not believe a session ended
// that did not.
func (a *admin) endSession(w http.ResponseWriter, r *http.Request) error {
	if id := sessionID(r); id != nil {
		if _, err := a.db.ExecContext(r.Context(), endSessionSQL, a.sessionHash(id)); err != nil {
			return fmt.Errorf("end session: %w", err)
		}
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return nil
}

func isLoopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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
		r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
		status, body, err := h(r)
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
// operator must see once; a 4xx is the client's, and its answer says all
// there is. A request that outran requestTimeout failed for that, whatever
// its cancelled query said.
func (a *admin) failed(r *http.Request, err error) (int, error) {
	if errors.Is(r.Context().Err(), context.Canceled) {
		// The client went away and its cancelled query failed: nobody
		// reads this answer, and it is not the server's fault.
		a.logger.Debug("request abandoned by its client", "method", r.Method, "path", r.URL.Path, "request_id", requestID(r))
		return statusClientClosedRequest, err
	}
	if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		err = &httpError{status: http.StatusServiceUnavailable, text: fmt.Sprintf("request took longer than %s", a.deadline()), err: err}
	}
	status := statusOf(err)
	if status >= 500 {
		a.logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", status,
			"request_id", requestID(r), "err", err)
	}
	return status, err
}

// statusClientClosedRequest is the status of a request whose client left
// before its answer (nginx's 499): written to no one, but not a 5xx.
const statusClientClosedRequest = 499

// statusOf maps an error to its HTTP status: the one place that does.
func statusOf(err error) int {
	if he, ok := errors.AsType[*httpError](err); ok {
		return he.status
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errInvalid):
		return http.StatusBadRequest
	case errors.Is(err, errNotFound):
		return http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// httpError is an error that picks its own answer, for the few failures
// that are not the domain's errors statusOf maps. text, when set, is what
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

// writeError answers {"error": "..."}; a server error's text is the
// operation that failed, which is what the operator needs, unless the
// error chose what the client is told.
func writeError(w http.ResponseWriter, status int, err error) {
	msg := strings.TrimPrefix(err.Error(), errInvalid.Error()+": ")
	if he, ok := errors.AsType[*httpError](err); ok && he.text != "" {
		msg = he.text
	}
	writeJSON(w, status, map[string]string{"error": msg})
}

// byID is the handler of a route on one row: it parses {id} and answers
// 200 with do's result.
func byID[T any](do func(ctx context.Context, id int64) (T, error)) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		v, err := do(r.Context(), id)
		return http.StatusOK, v, err
	}
}

// byIDWithBody is byID for a route that takes a JSON body, which decode
// (decodeJSON, or decodeOptionalJSON where it may be left out) reads into
// an In for do once {id} parsed.
func byIDWithBody[In, Out any](decode func(*http.Request, any) error, do func(ctx context.Context, id int64, in In) (Out, error)) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		var in In
		if err := decode(r, &in); err != nil {
			return 0, nil, err
		}
		v, err := do(r.Context(), id, in)
		return http.StatusOK, v, err
	}
}

// pathText is the path value key, a name of something stored as text. A
// value PostgreSQL cannot hold as text (isText) names nothing that can
// exist: not found, without asking the database, which would refuse it.
func pathText(r *http.Request, key string) (string, error) {
	v := r.PathValue(key)
	if !isText(v) {
		return "", fmt.Errorf("%s %q: %w", key, v, errNotFound)
	}
	return v, nil
}

// isText reports whether PostgreSQL can hold s as text: valid UTF-8
// without NUL. It refuses anything else (SQLSTATE 22021), which would
// answer the client's mistake as the server's 500.
func isText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: id %q is not a positive integer", errInvalid, r.PathValue("id"))
	}
	return id, nil
}

// decodeJSON reads one JSON object from the (bounded) body, refusing
// unknown fields (a typo in a field name is an error, not a silent
// default).
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("request body larger than %d bytes: %w", tooBig.Limit, err)
		}
		return fmt.Errorf("%w: request body: %v", errInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: request body: more than one JSON value", errInvalid)
	}
	return nil
}

// decodeOptionalJSON is decodeJSON for a body that may be left out, which
// leaves v as it is.
func decodeOptionalJSON(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decodeJSON(r, v)
}

// query reads a request's query parameters, for the API and the panel
// alike, or a panel form's fields (formOf). A reader that meets a bad
// value keeps the first such error in err and returns the parameter's
// default, so a handler reads every parameter it takes and then checks err
// once.
type query struct {
	values url.Values
	err    error
}

func queryOf(r *http.Request) *query { return &query{values: r.URL.Query()} }

// formOf reads the fields of a panel form, a body of at most limit bytes.
func formOf(w http.ResponseWriter, r *http.Request, limit int64) *query {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	q := &query{}
	if err := r.ParseForm(); err != nil {
		if _, tooBig := errors.AsType[*http.MaxBytesError](err); tooBig {
			q.err = fmt.Errorf("form larger than %d bytes: %w", limit, err)
		} else {
			q.err = fmt.Errorf("%w: form: %v", errInvalid, err)
		}
	}
	q.values = r.PostForm
	return q
}

// fail keeps err unless an earlier reader failed first.
func (q *query) fail(err error) {
	if q.err == nil {
		q.err = err
	}
}

// text is a parameter as given; absent, or not text (isText), "".
func (q *query) text(name string) string {
	s := q.values.Get(name)
	if !isText(s) {
		q.fail(fmt.Errorf("%w: %s is not UTF-8 text without NUL", errInvalid, name))
		return ""
	}
	return s
}

// natural is an optional non-negative integer: an id to page from or to
// filter by, or a page size that the list then bounds. Absent, 0.
func (q *query) natural(name string) int64 {
	return q.integer(name, 0, 0, math.MaxInt64, name+`: %q is not a non-negative integer`)
}

// limit is ?limit=, a page size from 1 to most; absent, most.
func (q *query) limit(most int) int {
	return int(q.integer("limit", int64(most), 1, int64(most), `limit %q must be between 1 and `+strconv.Itoa(most)))
}

// integer is an optional integer parameter: absent, def; present, one from
// lo to hi, or the request is refused with bad, a format given the value.
func (q *query) integer(name string, def, lo, hi int64, bad string) int64 {
	s := q.values.Get(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		q.fail(fmt.Errorf("%w: "+bad, errInvalid, s))
		return def
	}
	return n
}

// instant is an optional RFC 3339 time; absent, the zero time.
func (q *query) instant(name string) time.Time {
	s := q.values.Get(name)
	if s == "" {
		return time.Time{}
	}
	t, err := parseReplayTime(name, s)
	if err != nil {
		q.fail(err)
	}
	return t
}

// eventFilterFrom reads the stream's filter from the query.
func eventFilterFrom(q *query) EventFilter {
	return EventFilter{Topic: q.text("topic"), Subject: q.text("subject"), State: q.text("state"),
		Outcome: q.text("outcome"), Since: q.instant("since"), Until: q.instant("until"),
		Before: q.natural("before"), After: q.natural("after"), Limit: int(q.natural("limit"))}
}

// jobFilterFrom reads the job list's filter from the query.
func jobFilterFrom(q *query) JobFilter {
	return JobFilter{State: q.text("state"), Before: q.natural("before"), EventID: q.natural("event_id"),
		EndpointID: q.natural("endpoint_id"), Limit: int(q.natural("limit"))}
}

// idPage is one page of a list read newest first and paged by id, the
// stream or the job list, as the API and the panel both read it.
type idPage[F, T any] struct {
	filter F
	rows   []T
	// before is where the page after this one starts: below the last
	// row's id, or 0 when this page is empty.
	before int64
	// after is where the page just newer than this one starts, for a list
	// that pages both ways (the stream): above the first row's id, or 0
	// when nothing newer matches.
	after int64
}

// readIDPage reads the filter from the query, lists the page it selects
// and finds where the next page starts.
func readIDPage[F, T any](r *http.Request, db *sql.DB, filterFrom func(*query) F,
	list func(context.Context, *sql.DB, F) ([]T, error), id func(T) int64) (idPage[F, T], error) {
	q := queryOf(r)
	pg := idPage[F, T]{filter: filterFrom(q)}
	if q.err != nil {
		return pg, q.err
	}
	rows, err := list(r.Context(), db, pg.filter)
	if err != nil {
		return pg, err
	}
	pg.rows = rows
	if len(rows) > 0 {
		pg.before = id(rows[len(rows)-1])
	}
	return pg, nil
}

// readEventPage reads a page of the stream, older than ?before= or just
// newer than ?after=, with where the pages either side start when the
// filter selects more events that way (before, after; 0 when none).
func readEventPage(r *http.Request, db *sql.DB) (idPage[EventFilter, Event], error) {
	q := queryOf(r)
	pg := idPage[EventFilter, Event]{filter: eventFilterFrom(q)}
	if q.err != nil {
		return pg, q.err
	}
	list, err := listEventPage(r.Context(), db, pg.filter)
	if err != nil {
		return pg, err
	}
	pg.rows = list.events
	// An empty page has no edge rows: its neighbours start at its cursor.
	switch {
	case list.older && len(list.events) > 0:
		pg.before = list.events[len(list.events)-1].ID
	case list.older:
		pg.before = pg.filter.After + 1
	}
	switch {
	case list.newer && len(list.events) > 0:
		pg.after = list.events[0].ID
	case list.newer:
		pg.after = pg.filter.Before - 1
	}
	return pg, addEventOutcomes(r.Context(), db, pg.rows)
}

// readJobPage reads a page of the job list.
func readJobPage(r *http.Request, db *sql.DB) (idPage[JobFilter, JobView], error) {
	return readIDPage(r, db, jobFilterFrom, listJobs, func(j JobView) int64 { return j.ID })
}
