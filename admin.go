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

// apiRoute is one route of the JSON API and who may use it (owners.go):
// every route declares its audience, and TestEveryRouteDeclaresItsAudience
// walks this list to hold each one to it.
type apiRoute struct {
	pattern string
	who     audience
	h       apiFunc
}

// apiRoutes is every route of the JSON API, each behind a token (the
// admin's or an owner's) or a panel session.
func apiRoutes(a *admin) []apiRoute {
	return []apiRoute{
		{"GET /api/overview", forAdmin, handleOverview(a)},
		{"POST /api/alerts/{name}/acknowledge", forAdmin, handleAcknowledgeAlert(a)},
		{"GET /api/events", forEveryone, handleListEvents(a)},
		{"POST /api/events", forAdmin, handleRecordEvent(a)},
		{"GET /api/events/{id}", forEveryone, handleGetEvent(a)},
		{"POST /api/events/{id}/requeue", forAdmin, handleRequeueEvent(a)},
		{"GET /api/jobs", forAdmin, handleListJobs(a)},
		{"POST /api/jobs/{id}/retry", forAdmin, handleRetryJob(a)},
		{"POST /api/jobs/retry-discarded", forAdmin, handleRetryEveryDiscarded(a)},
		{"GET /api/jobs/discarded", forAdmin, handleDiscardedGroups(a)},
		{"GET /api/endpoints", forEveryone, handleListEndpoints(a)},
		{"POST /api/endpoints", forEveryone, handleCreateEndpoint(a)},
		{"GET /api/endpoints/{id}", forOwnedEndpoint, handleGetEndpoint(a)},
		{"PATCH /api/endpoints/{id}", forOwnedEndpoint, handleUpdateEndpoint(a)},
		{"DELETE /api/endpoints/{id}", forOwnedEndpoint, handleDeleteEndpoint(a)},
		{"POST /api/endpoints/{id}/enable", forOwnedEndpoint, handleEnableEndpoint(a)},
		{"POST /api/endpoints/{id}/pause", forOwnedEndpoint, handlePauseEndpoint(a)},
		{"POST /api/endpoints/{id}/resume", forOwnedEndpoint, handleResumeEndpoint(a)},
		{"POST /api/endpoints/{id}/disable", forOwnedEndpoint, handleDisableEndpoint(a)},
		{"POST /api/endpoints/{id}/rotate-secret", forOwnedEndpoint, handleRotateEndpointSecret(a)},
		{"POST /api/endpoints/{id}/replay", forOwnedEndpoint, handleReplayEndpoint(a)},
		{"POST /api/endpoints/{id}/retry-discarded", forOwnedEndpoint, handleRetryDiscarded(a)},
		{"POST /api/endpoints/filter-preview", forAdmin, handleFilterPreview(a)},
		{"POST /api/endpoints/{id}/filter-preview", forOwnedEndpoint, handleEndpointFilterPreview(a)},
		{"GET /api/endpoints/{id}/replays", forOwnedEndpoint, handleListReplays(a)},
		{"POST /api/endpoints/{id}/replays/{replay_id}/cancel", forOwnedEndpoint, handleCancelReplay(a)},
		{"GET /api/endpoints/{id}/deliveries", forOwnedEndpoint, handleEndpointDeliveries(a)},
		{"GET /api/endpoints/{id}/stats", forOwnedEndpoint, handleEndpointStatsWindow(a)},
		{"GET /api/endpoints/{id}/events/{event_id}", forOwnedEndpoint, handleEndpointEvent(a)},
		{"GET /api/endpoints/{id}/alerts", forOwnedEndpoint, handleEndpointAlerts(a)},
		{"POST /api/endpoints/{id}/test", forOwnedEndpoint, handleTestEndpoint(a)},
		{"GET /api/topics", forEveryone, handleListTopics(a)},
		{"POST /api/topics", forAdmin, handleCreateTopic(a)},
		{"GET /api/topics/{name...}", forAdmin, handleGetTopic(a)},
		{"PATCH /api/topics/{name...}", forAdmin, handleUpdateTopic(a)},
		{"DELETE /api/topics/{name...}", forAdmin, handleDeleteTopic(a)},
		{"GET /api/stats", forAdmin, handleStats(a)},
		{"GET /api/sources", forAdmin, handleListSources(a)},
		{"POST /api/sources", forAdmin, handleCreateSource(a)},
		{"DELETE /api/sources/{name}", forAdmin, handleDeleteSource(a)},
		{"POST /api/sources/{name}/rotate-secret", forAdmin, handleRotateSourceSecret(a)},
		{"GET /api/subjects", forAdmin, handleListSubjects(a)},
		{"POST /api/erasures", forAdmin, handleErase(a)},
		{"GET /api/owners", forAdmin, handleListOwners(a)},
		{"POST /api/owners", forAdmin, handleCreateOwner(a)},
		{"PATCH /api/owners/{id}", forAdmin, handleUpdateOwner(a)},
		{"DELETE /api/owners/{id}", forAdmin, handleDeleteOwner(a)},
		{"POST /api/owners/{id}/rotate-token", forAdmin, handleRotateOwnerToken(a)},
		{"POST /api/owners/{id}/signin-links", forAdmin, handleCreateSigninLink(a)},
		{"GET /api/audit", forEveryone, handleListAudit(a)},
		{"/api/", forEveryone, handleNoRoute()},
	}
}

// pageRoute is one page of the panel and who may see it, as apiRoute.
type pageRoute struct {
	pattern string
	who     audience
	h       pageFunc
}

// pageRoutes is every page of the panel behind a session.
func pageRoutes(a *admin) []pageRoute {
	p := a.panel
	return []pageRoute{
		{"GET /{$}", forEveryone, p.handleOverview(a)},
		{"GET /events", forEveryone, p.handleEvents(a)},
		{"GET /events/{id}", forAdmin, p.handleEvent(a)},
		{"POST /events/{id}/requeue", forAdmin, p.handleRequeue(a)},
		{"GET /endpoints", forEveryone, p.handleEndpoints(a)},
		{"POST /endpoints", forEveryone, p.handleCreateEndpoint(a)},
		{"GET /endpoints/{id}", forOwnedEndpoint, p.handleEndpoint(a)},
		{"GET /endpoints/{id}/events/{event_id}", forOwnedEndpoint, handleEndpointEventPage(a)},
		{"POST /endpoints/{id}/signin-link", forAdmin, handleSigninLinkPage(a)},
		{"POST /endpoints/{id}/owner", forAdmin, handleEndpointOwnerPage(a)},
		{"POST /endpoints/{id}/test", forOwnedEndpoint, handleTestEndpointPage(a)},
		{"POST /endpoints/{id}/{action}", forOwnedEndpoint, p.handleEndpointAction(a)},
		{"GET /sources", forAdmin, p.handleSources(a)},
		{"POST /sources", forAdmin, p.handleCreateSource(a)},
		{"POST /sources/{name}/{action}", forAdmin, p.handleSourceAction(a)},
		{"GET /jobs", forAdmin, p.handleJobs(a)},
		{"POST /jobs/{id}/retry", forAdmin, p.handleRetry(a)},
		{"POST /jobs/retry-discarded", forAdmin, p.handleRetryEveryDiscarded(a)},
		{"GET /subjects", forAdmin, p.handleSubjects(a)},
		{"GET /topics", forEveryone, handleTopicsPage(a)},
		{"POST /topics", forAdmin, handleSaveTopicPage(a)},
		{"POST /topics/delete", forAdmin, handleDeleteTopicPage(a)},
		{"POST /erasures", forAdmin, handleErasurePage(a)},
		{"POST /alerts/{name}/acknowledge", forAdmin, p.handleAcknowledgeAlert(a)},
		{"GET /audit", forEveryone, handleAuditPage(a)},
		{"GET /owners", forAdmin, handleOwnersPage(a)},
		{"POST /owners", forAdmin, handleCreateOwnerPage(a)},
		{"POST /owners/{id}/{action}", forAdmin, handleOwnerAction(a)},
	}
}

// routes is every route of outboxd in one place: the API's and the
// panel's lists above, and the open routes beside them.
func routes(a *admin) http.Handler {
	api := http.NewServeMux()
	for _, rt := range apiRoutes(a) {
		api.Handle(rt.pattern, a.serveJSON(a.audited(rt.pattern, a.allowAPI(rt.who, rt.h))))
	}

	mux := http.NewServeMux()
	mux.Handle("/api/", a.requireToken(api))
	mux.Handle("GET /healthz", a.serveJSON(handleHealthz()))
	mux.Handle("GET /readyz", a.serveJSON(handleReadyz(a)))
	if a.metricsPublic {
		mux.Handle("GET /metrics", handleMetrics(a))
	} else {
		mux.Handle("GET /metrics", a.requireToken(a.adminsOnly(handleMetrics(a))))
	}
	// The inbox authenticates each request by its source's signature, not
	// by the admin token: senders hold no token.
	mux.Handle("POST /webhooks/{source}", advertiseDedupWindow(a.endpoints.InboxWindow, a.serveJSON(handleInbox(a))))
	if a.demo != nil {
		mux.Handle("POST /demo/hook", a.demo.receiver()) // signed, like any webhook
	}

	// The panel: HTML pages for a browser, signed in by a session cookie.
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
	mux.Handle("GET /signin", a.servePage(handleSigninLinkForm(a)))
	mux.Handle("POST /signin", a.servePage(handleSigninWithLink(a)))
	for _, rt := range pageRoutes(a) {
		mux.Handle(rt.pattern, a.requireSession(a.servePage(a.auditedPage(a.allowPage(rt.who, rt.h)))))
	}

	// Browsers may not make state-changing requests across origins; API
	// clients without Origin or Sec-Fetch-Site headers are unaffected.
	return withRequestID(withDeadline(a.deadline(), securityHeaders(a.overHTTPS, http.NewCrossOriginProtection().Handler(mux))))
}

// requireToken lets a request through as its principal (owners.go): the
// admin for "Authorization: Bearer <admin token>" (compared in constant
// time), an owner for its token, or whoever a live panel session is. A
// wrong bearer token, the admin's or an owner's, counts against its
// address (checkToken); one from an address past its budget is answered
// 429, unchecked.
func (a *admin) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got, sent := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); sent {
			who, verdict, retry, err := a.checkToken(r, got, authViaBearer)
			switch {
			case err != nil:
				a.answerFailure(w, r, err)
				return
			case verdict == tokenAccepted:
				next.ServeHTTP(w, withPrincipal(r, who))
				return
			case verdict == tokenThrottled:
				w.Header().Set("Retry-After", strconv.Itoa(retry))
				writeError(w, http.StatusTooManyRequests, fmt.Errorf("too many wrong tokens from this address: try again in %d s", retry))
				return
			}
		}
		who, err := a.sessionOf(r)
		switch {
		case err != nil:
			a.answerFailure(w, r, err)
		case !who.admin && who.owner == nil:
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
			writeError(w, http.StatusUnauthorized, errors.New("missing or wrong admin token"))
		default:
			next.ServeHTTP(w, withPrincipal(r, who))
		}
	})
}

// adminsOnly serves next to the admin, and answers an owner 403.
func (a *admin) adminsOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := a.allowed(r, forAdmin); err != nil {
			a.answerFailure(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// tokenEqual compares in constant time: an early mismatch takes as long
// as a late one, so timing tells an attacker nothing about the token.
func tokenEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// checkToken judges a token sent via a way (authViaBearer, authViaSignIn)
// against the admin token and then the owners' (ownerOfToken), from r's
// client address (clientAddr): an accepted verdict comes with whose token
// it is, a throttled one with the seconds until that address may try
// again. A wrong owner's token spends the same budget as a wrong admin
// token: the budget is of guesses, whoever they aim at.
func (a *admin) checkToken(r *http.Request, token, via string) (principal, tokenVerdict, int, error) {
	who := principal{admin: tokenEqual(token, a.token)}
	if !who.admin {
		o, err := ownerOfToken(r.Context(), a.db, token)
		if err != nil {
			return principal{}, tokenRefused, 0, err
		}
		who.owner = o
	}
	verdict, retry := a.auth.check(a.clientAddr(r), via, who.admin || who.owner != nil)
	return who, verdict, retry, nil
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
		who, err := a.sessionOf(r)
		signedIn := who.admin || who.owner != nil
		switch {
		case err != nil:
			return err
		case !signedIn && r.Method != http.MethodGet:
			http.Error(w, "sign in first", http.StatusUnauthorized)
		case !signedIn:
			http.Redirect(w, r, "/login", http.StatusSeeOther)
		default:
			if who.owner != nil {
				w = portalWriter{w, who.owner.Name}
			}
			next.ServeHTTP(w, withPrincipal(r, who))
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
	who, verdict, retry, err := a.checkToken(r, token, authViaSignIn)
	if err != nil {
		return false, err
	}
	switch verdict {
	case tokenThrottled:
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		a.panel.render(w, http.StatusTooManyRequests, "login", page{Title: "Sign in",
			Data: fmt.Sprintf("Too many wrong tokens from your address: try again in %d seconds.", retry)})
		return false, nil
	case tokenRefused:
		a.panel.render(w, http.StatusUnauthorized, "login", page{Title: "Sign in", Data: "That token is not right."})
		return false, nil
	}
	return true, a.startSession(w, r, who)
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
		http.Redirect(w, r, homeOf(token), http.StatusSeeOther)
		return nil
	}
}

// homeOf is where signing in with token lands: an owner's endpoints, or
// the admin's overview.
func homeOf(token string) string {
	if strings.HasPrefix(token, ownerTokenPrefix) {
		return "/endpoints"
	}
	return "/"
}

// handleSigninLinkForm is GET /signin?code=: a sign-in link's page, whose
// button signs in. The GET itself uses nothing up: a mail scanner or a
// chat's preview that fetches the link must not spend its one use.
func handleSigninLinkForm(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		code := queryOf(r).text("code")
		a.panel.render(w, http.StatusOK, "signin", page{Title: "Sign in", Data: code})
		return nil
	}
}

// handleSigninWithLink is POST /signin: the link's code signs the browser
// in as its owner, once. A code that is no good spends the address's
// budget of wrong tokens, as a wrong token does; an address past its
// budget is refused before the code is looked at, so that the refusal
// does not use up a good link.
func handleSigninWithLink(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		f := formOf(w, r, 4096)
		code := f.text("code")
		if f.err != nil {
			return f.err
		}
		client := a.clientAddr(r)
		var o *Owner
		if throttled, _ := a.auth.throttled(client); !throttled {
			var err error
			if o, err = useSigninLink(r.Context(), a.db, code); err != nil {
				return err
			}
		}
		// Throttled, the check counts the try and spends nothing.
		switch verdict, retry := a.auth.check(client, authViaSignIn, o != nil); verdict {
		case tokenThrottled:
			w.Header().Set("Retry-After", strconv.Itoa(retry))
			a.panel.render(w, http.StatusTooManyRequests, "login", page{Title: "Sign in",
				Data: fmt.Sprintf("Too many wrong tokens from your address: try again in %d seconds.", retry)})
			return nil
		case tokenRefused:
			a.panel.render(w, http.StatusUnauthorized, "login", page{Title: "Sign in",
				Data: "That sign-in link is used up or expired: ask for a new one, or sign in with your token."})
			return nil
		}
		if err := a.startSession(w, r, principal{owner: o}); err != nil {
			return err
		}
		http.Redirect(w, r, "/endpoints", http.StatusSeeOther)
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

// sessionOf is who r's session is signed in as: the admin, an owner
// (ownerSessionOf), or nobody, for no session or one ended or expired;
// one row lookup for the admin's, which every replica answers alike.
func (a *admin) sessionOf(r *http.Request) (principal, error) {
	id := sessionID(r)
	if id == nil {
		return principal{}, nil
	}
	var live bool
	if err := a.db.QueryRowContext(r.Context(), sessionLiveSQL, a.sessionHash(id)).Scan(&live); err != nil {
		return principal{}, fmt.Errorf("read session: %w", err)
	}
	if live {
		return principal{admin: true}, nil
	}
	o, err := ownerSessionOf(r.Context(), a.db, a.sessionHash(id))
	return principal{owner: o}, err
}

// startSession signs the browser in as who: a new session, and its
// cookie.
func (a *admin) startSession(w http.ResponseWriter, r *http.Request, who principal) error {
	id := make([]byte, sessionIDBytes)
	rand.Read(id)
	var err error
	if who.owner != nil {
		err = startOwnerSession(r.Context(), a.db, a.sessionHash(id), who.owner.ID)
	} else {
		_, err = a.db.ExecContext(r.Context(), startSessionSQL,
			a.sessionHash(id), sessionLifetime.Seconds(), sessionSweep, maxSessions-1)
	}
	if err != nil {
		return fmt.Errorf("start session: %w", err)
	}
	a.setSessionCookie(w, r, hex.EncodeToString(id), int(sessionLifetime.Seconds()))
	return nil
}

// startOwnerSessionSQL is startSessionSQL for an owner's session ($5).
const startOwnerSessionSQL = `
WITH swept AS (
  DELETE FROM outbox.owner_sessions
  WHERE id_hash IN (
    (SELECT id_hash
     FROM outbox.owner_sessions
     WHERE expires_at <= now()
     ORDER BY expires_at
     LIMIT $3)
    UNION ALL
    (SELECT id_hash
     FROM outbox.owner_sessions
     WHERE expires_at > now()
     ORDER BY expires_at DESC
     OFFSET $4
     LIMIT $3)
  )
)
INSERT INTO outbox.owner_sessions (id_hash, expires_at, owner_id)
VALUES ($1, now() + make_interval(secs => $2), $5)`

// startOwnerSession records session hash for owner ownerID.
func startOwnerSession(ctx context.Context, db *sql.DB, hash []byte, ownerID int64) error {
	_, err := db.ExecContext(ctx, startOwnerSessionSQL, hash, sessionLifetime.Seconds(), sessionSweep, maxSessions-1, ownerID)
	return err
}

const ownerSessionSQL = `
SELECT` + ownerColumns + `
FROM outbox.owners
WHERE id = (
  SELECT owner_id
  FROM outbox.owner_sessions
  WHERE id_hash = $1
    AND expires_at > now()
)`

// ownerSessionOf is the owner session hash is signed in as, or nil.
func ownerSessionOf(ctx context.Context, db *sql.DB, hash []byte) (*Owner, error) {
	o, err := scanOwner(db.QueryRowContext(ctx, ownerSessionSQL, hash))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read owner session: %w", err)
	}
	return &o, nil
}

const endOwnerSessionSQL = `
DELETE FROM outbox.owner_sessions
WHERE id_hash = $1`

func endOwnerSession(ctx context.Context, db *sql.DB, hash []byte) error {
	if _, err := db.ExecContext(ctx, endOwnerSessionSQL, hash); err != nil {
		return fmt.Errorf("end owner session: %w", err)
	}
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
		if err := endOwnerSession(r.Context(), a.db, a.sessionHash(id)); err != nil {
			return err
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
