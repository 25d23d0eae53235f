// admin.go: the HTTP surface: every route, and who may use it: the admin
// token on the API, and on the panel a session, signed in and out here,
// and ended for good when the token changes. The JSON handlers are in
// api.go, the panel's pages in panel.go, and what serving a request takes
// is in httpserve.go (the budget of wrong tokens among it) and request.go.

package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

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
	apiRoute("GET /api/jobs/discarded", handleDiscardedGroups(a))
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
	apiRoute("POST /api/endpoints/filter-preview", handleFilterPreview(a))
	apiRoute("POST /api/endpoints/{id}/filter-preview", handleEndpointFilterPreview(a))
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
	mux.Handle("GET /login", a.servePage(handleLoginForm(a)))
	mux.Handle("POST /login", a.servePage(handleLogin(a)))
	mux.Handle("POST /logout", a.servePage(handleLogout(a)))
	pageRoute := func(pattern string, h pageFunc) { mux.Handle(pattern, a.requireSession(a.servePage(h))) }
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
	return withRequestID(withDeadline(a.deadline(), securityHeaders(a.overHTTPS, http.NewCrossOriginProtection().Handler(mux))))
}

// requireToken lets a request through with "Authorization: Bearer <token>"
// (compared in constant time) or a live panel session. A wrong bearer
// token counts against its address (checkToken); one from an address
// past its budget is answered 429, unchecked.
func (a *admin) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got, sent := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); sent {
			switch verdict, retry := a.checkToken(r, got, authViaBearer); verdict {
			case tokenAccepted:
				next.ServeHTTP(w, r)
				return
			case tokenThrottled:
				w.Header().Set("Retry-After", strconv.Itoa(retry))
				writeError(w, http.StatusTooManyRequests, fmt.Errorf("too many wrong admin tokens from this address: try again in %d s", retry))
				return
			}
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

// tokenEqual compares in constant time: an early mismatch takes as long
// as a late one, so timing tells an attacker nothing about the token.
func tokenEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// checkToken judges a token sent via a way (authViaBearer, authViaSignIn)
// against the admin token, from r's client address (clientAddr): a
// throttled verdict comes with the seconds until that address may try
// again.
func (a *admin) checkToken(r *http.Request, token, via string) (tokenVerdict, int) {
	return a.auth.check(a.clientAddr(r), via, tokenEqual(token, a.token))
}

// requireSession sends a browser without a session to the sign-in form.
// The URL outboxd logs at start carries ?token=: it signs in and redirects
// to the same page without the token, so it leaves the address bar.
func (a *admin) requireSession(next http.Handler) http.Handler {
	return a.servePage(func(w http.ResponseWriter, r *http.Request) error {
		if t := queryOf(r).text("token"); t != "" && r.Method == http.MethodGet {
			if signedIn, err := a.signInWith(w, r, t); !signedIn || err != nil {
				return err
			}
			u := *r.URL
			q := u.Query()
			q.Del("token")
			u.RawQuery = q.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return nil
		}
		signedIn, err := a.hasSession(r)
		switch {
		case err != nil:
			return err
		case !signedIn && r.Method != http.MethodGet:
			http.Error(w, "sign in first", http.StatusUnauthorized)
		case !signedIn:
			http.Redirect(w, r, "/login", http.StatusSeeOther)
		default:
			next.ServeHTTP(w, r)
		}
		return nil
	})
}

// handleLoginForm is GET /login.
func handleLoginForm(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		a.panel.render(w, http.StatusOK, "login", page{Title: "Sign in"})
		return nil
	}
}

// signInWith signs the browser in with token, typed into the sign-in
// form or carried by the panel's URL, and reports true; or shows the form
// again, saying why not, and reports false.
func (a *admin) signInWith(w http.ResponseWriter, r *http.Request, token string) (bool, error) {
	switch verdict, retry := a.checkToken(r, token, authViaSignIn); verdict {
	case tokenThrottled:
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		a.panel.render(w, http.StatusTooManyRequests, "login", page{Title: "Sign in",
			Data: fmt.Sprintf("Too many wrong tokens from your address: try again in %d seconds.", retry)})
		return false, nil
	case tokenRefused:
		a.panel.render(w, http.StatusUnauthorized, "login", page{Title: "Sign in", Data: "That token is not right."})
		return false, nil
	}
	return true, a.startSession(w, r)
}

// handleLogin is POST /login: the token typed in signs the browser in.
func handleLogin(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		f := formOf(w, r, 4096)
		token := f.text("token")
		if f.err != nil {
			return f.err
		}
		if signedIn, err := a.signInWith(w, r, token); !signedIn || err != nil {
			return err
		}
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return nil
	}
}

// handleLogout is POST /logout: the session ends on every replica.
func handleLogout(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := a.endSession(w, r); err != nil {
			return err
		}
		http.Redirect(w, r, "/login", http.StatusSeeOther)
		return nil
	}
}

// sessionCookie is the panel's session: a random id of sessionIDBytes,
// hex-encoded. The database knows it only by its HMAC under the token
// (outbox.panel_sessions in schema.sql), so neither the token nor a usable
// cookie sits in a table, and changing the token signs every session out:
// for good, as the start with the new token deletes them all
// (keepSessionsOfToken).
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
func (a *admin) startSession(w http.ResponseWriter, r *http.Request) error {
	id := make([]byte, sessionIDBytes)
	rand.Read(id)
	if _, err := a.db.ExecContext(r.Context(), startSessionSQL,
		a.sessionHash(id), sessionLifetime.Seconds(), sessionSweep, maxSessions-1); err != nil {
		return fmt.Errorf("start session: %w", err)
	}
	a.setSessionCookie(w, r, hex.EncodeToString(id), int(sessionLifetime.Seconds()))
	return nil
}

// setSessionCookie sets the session cookie to value for maxAge seconds
// (negative: forget it). It is Secure wherever the browser reached
// outboxd over HTTPS (overHTTPS: the public URL says so, TLS, or a trusted
// proxy) and on loopback, where browsers keep a Secure cookie over plain
// HTTP.
func (a *admin) setSessionCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    value,
		Path:     "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   a.overHTTPS(r) || isLoopbackHost(r.Host),
		SameSite: http.SameSiteStrictMode,
	})
}

// sessionTokenSQL records fingerprint $1 as the admin token's and, if it
// differs from the one recorded (or none is), deletes every session: at
// most the table's bound (maxSessions live, and the expired ones each
// sign-in sweeps), so in one statement. It answers whether the token
// changed and how many sessions ended.
const sessionTokenSQL = `
WITH changed AS (
  INSERT INTO outbox.panel_session_token AS t (fingerprint)
  VALUES ($1)
  ON CONFLICT (only_row) DO UPDATE
  SET fingerprint = EXCLUDED.fingerprint,
      changed_at = now()
  WHERE t.fingerprint <> EXCLUDED.fingerprint
  RETURNING 1
), ended AS (
  DELETE FROM outbox.panel_sessions
  WHERE EXISTS (SELECT 1 FROM changed)
  RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM changed), (SELECT count(*) FROM ended)`

// keepSessionsOfToken runs at start: sessions signed in under another
// admin token than token are deleted, so that none comes back with that
// token, should it come back. The token is known to the database by its
// HMAC of a fixed text, which tells nothing of a token of the strength
// start asks (validateAdminToken) and shares no value with a session's
// HMAC.
func keepSessionsOfToken(ctx context.Context, db *sql.DB, token string, logger *slog.Logger) error {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("outboxd admin token fingerprint"))
	var changed bool
	var ended int64
	if err := db.QueryRowContext(ctx, sessionTokenSQL, mac.Sum(nil)).Scan(&changed, &ended); err != nil {
		return fmt.Errorf("record the admin token's sessions: %w", err)
	}
	if changed && ended > 0 {
		logger.Info("the admin token changed: every panel session is signed out", "sessions", ended)
	}
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
	a.setSessionCookie(w, r, "", -1)
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
