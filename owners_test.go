// owners_test.go: owners and their portal (docs/owners.md): tokens kept
// hashed and replaced by rotation, the audience of every route of the API
// and the panel walked from admin.go's own lists, and sign-in links that
// expire and sign in once.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// callAs sends a request with "Authorization: Bearer token" and returns
// the status and the body.
func callAs(t *testing.T, srv *httptest.Server, token, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := noRedirect(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// decodeAs is callAs that wants status and decodes the answer into out.
func decodeAs(t *testing.T, srv *httptest.Server, token, method, path, body string, want int, out any) {
	t.Helper()
	status, b := callAs(t, srv, token, method, path, body)
	if status != want {
		t.Fatalf("%s %s = %d %s, want %d", method, path, status, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
}

// newOwner creates an owner through the API.
func newOwner(t *testing.T, srv *httptest.Server, name string) ownerWithToken {
	t.Helper()
	var o ownerWithToken
	decodeAs(t, srv, testToken, "POST", "/api/owners", fmt.Sprintf(`{"name": %q}`, name), 201, &o)
	return o
}

// endpointAs creates an endpoint with token; the admin's may give ownerID.
func endpointAs(t *testing.T, srv *httptest.Server, token string, ownerID int64) Endpoint {
	t.Helper()
	body := `{"url": "http://127.0.0.1:9/hook"}`
	if ownerID != 0 {
		body = fmt.Sprintf(`{"url": "http://127.0.0.1:9/hook", "owner_id": %d}`, ownerID)
	}
	var e Endpoint
	decodeAs(t, srv, token, "POST", "/api/endpoints", body, 201, &e)
	return e
}

// browse sends a panel request (a form when form is not nil) with browser.
func browse(t *testing.T, browser *http.Client, srv *httptest.Server, method, path string, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return send(t, browser, req)
}

// send sends req with browser and returns the status and the body.
func send(t *testing.T, browser *http.Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := browser.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestOwnerTokensAreStoredHashed(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)

	o := newOwner(t, srv, "Payments team")
	if !regexp.MustCompile(`^obo_[0-9a-f]{88}$`).MatchString(o.Token) {
		t.Fatalf("token %q: want obo_ and 88 hex digits (12 bytes of selector, 32 of verifier)", o.Token)
	}
	if o.Name != "Payments team" || o.ID == 0 {
		t.Errorf("created owner = %+v", o.Owner)
	}
	// Nothing the database holds is the token, or its secret part.
	var row string
	if err := db.QueryRow(`SELECT row_to_json(o)::text FROM outbox.owners AS o WHERE id = $1`, o.ID).Scan(&row); err != nil {
		t.Fatal(err)
	}
	verifier := o.Token[len(o.Token)-64:]
	if strings.Contains(row, o.Token) || strings.Contains(row, verifier) || strings.Contains(row, `\x`+verifier) {
		t.Errorf("outbox.owners holds the token: %s", row)
	}
	var listed struct{ Owners []map[string]any }
	decodeAs(t, srv, testToken, "GET", "/api/owners", "", 200, &listed)
	if len(listed.Owners) != 1 || listed.Owners[0]["token"] != nil || listed.Owners[0]["name"] != "Payments team" {
		t.Errorf("GET /api/owners = %+v, want the owner without its token", listed.Owners)
	}

	if status, b := callAs(t, srv, o.Token, "GET", "/api/endpoints", ""); status != 200 {
		t.Errorf("the owner's token: %d %s, want 200", status, b)
	}
	// The same selector with another verifier, and a token one digit
	// off, are refused.
	last := o.Token[len(o.Token)-1]
	off := o.Token[:len(o.Token)-1] + map[bool]string{true: "1", false: "0"}[last == '0']
	for _, wrong := range []string{off, strings.ToUpper(o.Token[:4]) + o.Token[4:], o.Token + "0", "obo_"} {
		if status, _ := callAs(t, srv, wrong, "GET", "/api/endpoints", ""); status != 401 {
			t.Errorf("token %q = %d, want 401", wrong, status)
		}
	}
	for _, bad := range []string{`{"name": ""}`, `{"name": "  "}`, `{"name": "a\nb"}`, `{"name": "` + strings.Repeat("n", 201) + `"}`, `{}`} {
		if status, b := callAs(t, srv, testToken, "POST", "/api/owners", bad); status != 400 || !strings.Contains(string(b), "name") {
			t.Errorf("POST /api/owners %s = %d %s, want 400 naming name", bad, status, b)
		}
	}
}

func TestRotatingAnOwnerTokenRefusesTheOldOne(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o := newOwner(t, srv, "Shipping")
	browser := signInAs(t, srv, o.Token)
	if status, _ := browse(t, browser, srv, "GET", "/endpoints", nil); status != 200 {
		t.Fatalf("the owner's session: %d, want 200", status)
	}

	var rotated ownerWithToken
	decodeAs(t, srv, testToken, "POST", fmt.Sprintf("/api/owners/%d/rotate-token", o.ID), "", 200, &rotated)
	if rotated.Token == o.Token || rotated.ID != o.ID || !rotated.TokenRotatedAt.After(o.TokenRotatedAt) {
		t.Fatalf("rotated = %+v, was %+v", rotated, o)
	}
	if status, _ := callAs(t, srv, o.Token, "GET", "/api/endpoints", ""); status != 401 {
		t.Errorf("the old token after rotation = %d, want 401", status)
	}
	if status, _ := callAs(t, srv, rotated.Token, "GET", "/api/endpoints", ""); status != 200 {
		t.Errorf("the new token = %d, want 200", status)
	}
	// The session signed in with the old token ended with it.
	if status, _ := browse(t, browser, srv, "GET", "/endpoints", nil); status != http.StatusSeeOther {
		t.Errorf("the old token's session after rotation = %d, want 303 to sign in", status)
	}

	// Deleting the owner refuses its token and leaves its endpoints to
	// the admin.
	ep := endpointAs(t, srv, rotated.Token, 0)
	decodeAs(t, srv, testToken, "DELETE", fmt.Sprintf("/api/owners/%d", o.ID), "", 204, nil)
	if status, _ := callAs(t, srv, rotated.Token, "GET", "/api/endpoints", ""); status != 401 {
		t.Errorf("a deleted owner's token = %d, want 401", status)
	}
	var got Endpoint
	decodeAs(t, srv, testToken, "GET", fmt.Sprintf("/api/endpoints/%d", ep.ID), "", 200, &got)
	if got.OwnerID != nil {
		t.Errorf("a deleted owner's endpoint has owner_id %d, want null", *got.OwnerID)
	}
	for _, path := range []string{"/api/owners/%d", "/api/owners/%d/rotate-token"} {
		method := map[bool]string{true: "DELETE", false: "POST"}[path == "/api/owners/%d"]
		if status, _ := callAs(t, srv, testToken, method, fmt.Sprintf(path, o.ID), ""); status != 404 {
			t.Errorf("%s %s of a deleted owner = %d, want 404", method, path, status)
		}
	}
}

// isolationWorld is two owners, each with an endpoint, and the admin's
// routes over them.
type isolationWorld struct {
	srv      *httptest.Server
	a        *admin
	mine     ownerWithToken
	theirs   ownerWithToken
	theirsEp Endpoint
	missing  int64 // an endpoint id that does not exist
}

func newIsolationWorld(t *testing.T) isolationWorld {
	t.Helper()
	db, _ := newTestDB(t)
	a := testAdmin(t, db, testPolicy, testLogger(t), nil)
	srv := serveAdmin(t, a)
	w := isolationWorld{srv: srv, a: a, mine: newOwner(t, srv, "mine"), theirs: newOwner(t, srv, "theirs")}
	// The walks below make endpoints of both, one or two a route: past
	// the default max_endpoints, which TestOwnerLimitsHoldItsEndpoints
	// holds.
	for _, o := range []ownerWithToken{w.mine, w.theirs} {
		decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", o.ID), `{"max_endpoints": 1000}`, 200, nil)
	}
	w.theirsEp = endpointAs(t, srv, w.theirs.Token, 0)
	w.missing = w.theirsEp.ID + 1000
	return w
}

// concrete is a route's pattern as a request: its method and a path with
// id, the given endpoint (or owner) id, and placeholder names.
func concrete(pattern string, id int64) (method, path string) {
	method, path, found := strings.Cut(pattern, " ")
	if !found {
		method, path = "GET", pattern
	}
	path = strings.NewReplacer("{id}", strconv.FormatInt(id, 10), "{name}", "src", "{replay_id}", "1", "{event_id}", "1",
		"{action}", "pause", "{$}", "").Replace(path)
	if strings.HasSuffix(pattern, "/api/") {
		path += "no-such-route"
	}
	return method, path
}

// sameAnswer reports whether two answers tell the same, ids aside.
func sameAnswer(a, b string, idA, idB int64) bool {
	return strings.ReplaceAll(a, "endpoint "+strconv.FormatInt(idA, 10), "endpoint ID") ==
		strings.ReplaceAll(b, "endpoint "+strconv.FormatInt(idB, 10), "endpoint ID")
}

// contractAudience is who docs/owners.md says may use a route, read from
// its path alone: an owner has its endpoint list (/ takes it there), its
// endpoints' routes, the audit trail, the list of topics (by method
// too: only the admin changes the catalog) and the search of the events
// its endpoints were sent; every other route is the admin's. The walks below
// hold each route's declaration to it, so that a route declared wider
// than the contract fails as surely as one enforced narrower.
func contractAudience(pattern string) audience {
	switch pattern {
	case "GET /api/topics", "GET /topics": // the topics its endpoints may receive
		return forEveryone
	case "GET /api/events", "GET /api/events/{id}", "GET /events": // the events its endpoints were sent
		return forEveryone
	}
	_, path, found := strings.Cut(pattern, " ")
	if !found {
		path = pattern
	}
	path = strings.TrimPrefix(path, "/api")
	switch {
	case path == "/" || path == "/{$}" || path == "/endpoints" || path == "/audit":
		return forEveryone
	case path == "/endpoints/{id}/signin-link" || path == "/endpoints/{id}/owner":
		return forAdmin
	case path == "/endpoints/{id}" || strings.HasPrefix(path, "/endpoints/{id}/"):
		return forOwnedEndpoint
	}
	return forAdmin
}

// TestEveryRouteDeclaresItsAudience walks admin.go's list of API routes:
// every route declares who may use it, and an owner's token gets what
// the declaration says: 403 on the admin's routes, on another owner's
// endpoint the 404 of an endpoint that does not exist, and on its own
// endpoint what the admin gets; the admin is refused nowhere.
func TestEveryRouteDeclaresItsAudience(t *testing.T) {
	t.Parallel()
	w := newIsolationWorld(t)
	for _, rt := range apiRoutes(w.a) {
		t.Run(rt.pattern, func(t *testing.T) {
			body := "{}"
			if want := contractAudience(rt.pattern); rt.who != want && rt.who != audienceUndeclared {
				t.Errorf("%s is declared for %s; docs/owners.md gives it to %s", rt.pattern, rt.who, want)
			}
			switch rt.who {
			case audienceUndeclared:
				t.Fatalf("%s declares no audience: give it forAdmin, forOwnedEndpoint or forEveryone", rt.pattern)
			case forAdmin:
				method, path := concrete(rt.pattern, 1)
				status, b := callAs(t, w.srv, w.mine.Token, method, path, body)
				if status != 403 || !strings.Contains(string(b), "this route is the admin's") {
					t.Errorf("an owner's %s %s = %d %s, want 403", method, path, status, b)
				}
			case forOwnedEndpoint:
				method, path := concrete(rt.pattern, w.theirsEp.ID)
				status, b := callAs(t, w.srv, w.mine.Token, method, path, body)
				_, missingPath := concrete(rt.pattern, w.missing)
				missingStatus, missingBody := callAs(t, w.srv, w.mine.Token, method, missingPath, body)
				if status != 404 || missingStatus != 404 || !sameAnswer(string(b), string(missingBody), w.theirsEp.ID, w.missing) {
					t.Errorf("another owner's endpoint: %s %s = %d %s; a missing one = %d %s; want the same 404",
						method, path, status, b, missingStatus, missingBody)
				}
				// Its own endpoint answers the owner as a twin answers the
				// admin.
				own, twin := endpointAs(t, w.srv, w.mine.Token, 0), endpointAs(t, w.srv, testToken, w.mine.ID)
				method, path = concrete(rt.pattern, own.ID)
				status, b = callAs(t, w.srv, w.mine.Token, method, path, body)
				_, twinPath := concrete(rt.pattern, twin.ID)
				twinStatus, _ := callAs(t, w.srv, testToken, method, twinPath, body)
				refused := fmt.Sprintf(`{"error":"endpoint %d: not found"}`, own.ID)
				if status != twinStatus || status == 403 || strings.TrimSpace(string(b)) == refused {
					t.Errorf("the owner's own endpoint: %s %s = %d %s; the admin's twin = %d", method, path, status, b, twinStatus)
				}
			case forEveryone:
				method, path := concrete(rt.pattern, 1)
				if method == "POST" {
					body = `{"url": "http://127.0.0.1:9/hook"}`
				}
				if status, b := callAs(t, w.srv, w.mine.Token, method, path, body); status == 403 || status == 401 {
					t.Errorf("an owner's %s %s = %d %s, want its own view", method, path, status, b)
				}
			}
			// The admin keeps every right, on a row of its own: the walk
			// deletes and rotates.
			id := endpointAs(t, w.srv, testToken, w.theirs.ID).ID
			if strings.Contains(rt.pattern, "/api/owners/") {
				id = newOwner(t, w.srv, "throwaway").ID
			}
			method, path := concrete(rt.pattern, id)
			if status, b := callAs(t, w.srv, testToken, method, path, body); status == 403 || status == 401 {
				t.Errorf("the admin's %s %s = %d %s", method, path, status, b)
			}
		})
	}
	// /metrics is the admin's too.
	if status, _ := callAs(t, w.srv, w.mine.Token, "GET", "/metrics", ""); status != 403 {
		t.Errorf("an owner's GET /metrics = %d, want 403", status)
	}
}

// TestEveryPageDeclaresItsAudience is the same walk over the panel's
// pages, with an owner's signed-in browser.
func TestEveryPageDeclaresItsAudience(t *testing.T) {
	t.Parallel()
	w := newIsolationWorld(t)
	browser := signInAs(t, w.srv, w.mine.Token)
	for _, rt := range pageRoutes(w.a) {
		t.Run(rt.pattern, func(t *testing.T) {
			if want := contractAudience(rt.pattern); rt.who != want && rt.who != audienceUndeclared {
				t.Errorf("%s is declared for %s; docs/owners.md gives it to %s", rt.pattern, rt.who, want)
			}
			var form url.Values
			if strings.HasPrefix(rt.pattern, "POST ") {
				form = url.Values{"url": {"http://127.0.0.1:9/hook"}}
			}
			switch rt.who {
			case audienceUndeclared:
				t.Fatalf("%s declares no audience", rt.pattern)
			case forAdmin:
				method, path := concrete(rt.pattern, 1)
				if status, page := browse(t, browser, w.srv, method, path, form); status != 403 {
					t.Errorf("an owner's %s %s = %d, want 403:\n%s", method, path, status, page)
				}
			case forOwnedEndpoint:
				method, path := concrete(rt.pattern, w.theirsEp.ID)
				status, page := browse(t, browser, w.srv, method, path, form)
				_, missingPath := concrete(rt.pattern, w.missing)
				missingStatus, missingPage := browse(t, browser, w.srv, method, missingPath, form)
				if status != 404 || missingStatus != 404 || !sameAnswer(page, missingPage, w.theirsEp.ID, w.missing) {
					t.Errorf("another owner's endpoint: %s %s = %d; a missing one = %d; want the same 404:\n%s\n%s",
						method, path, status, missingStatus, page, missingPage)
				}
				own := endpointAs(t, w.srv, w.mine.Token, 0)
				method, path = concrete(rt.pattern, own.ID)
				refused := fmt.Sprintf(`<p class="error">endpoint %d: not found</p>`, own.ID)
				if status, page := browse(t, browser, w.srv, method, path, form); status == 403 || (status >= 400 && status != 404) || strings.Contains(page, refused) {
					t.Errorf("the owner's own endpoint: %s %s = %d:\n%s", method, path, status, page)
				}
			case forEveryone:
				method, path := concrete(rt.pattern, 1)
				if status, page := browse(t, browser, w.srv, method, path, form); status >= 400 {
					t.Errorf("an owner's %s %s = %d:\n%s", method, path, status, page)
				}
			}
		})
	}
}

func TestOwnersSeeAndMakeOnlyTheirEndpoints(t *testing.T) {
	t.Parallel()
	w := newIsolationWorld(t)
	mine := endpointAs(t, w.srv, w.mine.Token, 0)
	if mine.OwnerID == nil || *mine.OwnerID != w.mine.ID {
		t.Fatalf("an owner's new endpoint has owner_id %v, want %d", mine.OwnerID, w.mine.ID)
	}
	adminsOwn := endpointAs(t, w.srv, testToken, 0)
	if adminsOwn.OwnerID != nil {
		t.Errorf("the admin's endpoint without owner_id has owner_id %d, want null", *adminsOwn.OwnerID)
	}

	var listed struct{ Endpoints []Endpoint }
	decodeAs(t, w.srv, w.mine.Token, "GET", "/api/endpoints", "", 200, &listed)
	if len(listed.Endpoints) != 1 || listed.Endpoints[0].ID != mine.ID {
		t.Errorf("the owner's list = %+v, want only endpoint %d", listed.Endpoints, mine.ID)
	}
	decodeAs(t, w.srv, testToken, "GET", "/api/endpoints", "", 200, &listed)
	if len(listed.Endpoints) != 3 {
		t.Errorf("the admin's list has %d endpoints, want all 3", len(listed.Endpoints))
	}

	// An owner_id from an owner's token is refused, naming it, on create
	// and on change, its own id included.
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/api/endpoints", fmt.Sprintf(`{"url": "http://127.0.0.1:9/hook", "owner_id": %d}`, w.theirs.ID)},
		{"POST", "/api/endpoints", fmt.Sprintf(`{"url": "http://127.0.0.1:9/hook", "owner_id": %d}`, w.mine.ID)},
		{"PATCH", fmt.Sprintf("/api/endpoints/%d", mine.ID), fmt.Sprintf(`{"owner_id": %d}`, w.theirs.ID)},
		{"PATCH", fmt.Sprintf("/api/endpoints/%d", mine.ID), `{"owner_id": null}`},
	} {
		if status, b := callAs(t, w.srv, w.mine.Token, req.method, req.path, req.body); status != 400 || !strings.Contains(string(b), "owner_id") {
			t.Errorf("an owner's %s %s %s = %d %s, want 400 naming owner_id", req.method, req.path, req.body, status, b)
		}
	}
	// The admin gives an endpoint to an owner, and takes it back; an
	// owner that does not exist is refused.
	var got Endpoint
	decodeAs(t, w.srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", adminsOwn.ID), fmt.Sprintf(`{"owner_id": %d}`, w.mine.ID), 200, &got)
	if got.OwnerID == nil || *got.OwnerID != w.mine.ID {
		t.Errorf("after the admin's PATCH owner_id = %v, want %d", got.OwnerID, w.mine.ID)
	}
	decodeAs(t, w.srv, w.mine.Token, "GET", fmt.Sprintf("/api/endpoints/%d", adminsOwn.ID), "", 200, nil)
	decodeAs(t, w.srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", adminsOwn.ID), `{"description": "kept"}`, 200, &got)
	if got.OwnerID == nil {
		t.Error("a PATCH without owner_id dropped the owner")
	}
	decodeAs(t, w.srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", adminsOwn.ID), `{"owner_id": null}`, 200, &got)
	if got.OwnerID != nil {
		t.Errorf("after owner_id null, owner_id = %d", *got.OwnerID)
	}
	if status, _ := callAs(t, w.srv, w.mine.Token, "GET", fmt.Sprintf("/api/endpoints/%d", adminsOwn.ID), ""); status != 404 {
		t.Errorf("an endpoint taken back answers its former owner %d, want 404", status)
	}
	if status, b := callAs(t, w.srv, testToken, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/hook", "owner_id": 999999}`); status != 400 || !strings.Contains(string(b), "owner_id 999999: no such owner") {
		t.Errorf("owner_id of no owner = %d %s, want 400", status, b)
	}

	// The owner manages its endpoint: pause, resume, rotate its secret,
	// a replay's dry run, its deliveries and statistics.
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/api/endpoints/%d/pause", ""},
		{"POST", "/api/endpoints/%d/resume", ""},
		{"POST", "/api/endpoints/%d/rotate-secret", ""},
		{"PATCH", "/api/endpoints/%d", `{"description": "mine now"}`},
		{"POST", "/api/endpoints/%d/replay", `{"since": "2026-01-01T00:00:00Z", "dry_run": true}`},
		{"GET", "/api/endpoints/%d/deliveries", ""},
		{"GET", "/api/endpoints/%d/stats?window=1h", ""},
		{"GET", "/api/endpoints/%d/replays", ""},
	} {
		path := fmt.Sprintf(req.path, mine.ID)
		if status, b := callAs(t, w.srv, w.mine.Token, req.method, path, req.body); status != 200 {
			t.Errorf("the owner's %s %s = %d %s, want 200", req.method, path, status, b)
		}
	}
}

// The budget of wrong tokens is spent by wrong owners' tokens too: ten
// from one address, and its next is refused unchecked, the right one too.
func TestWrongOwnerTokensSpendTheBudget(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o := newOwner(t, srv, "guessed")
	wrong := o.Token[:len(o.Token)-8] + "00000000"
	if wrong == o.Token {
		wrong = o.Token[:len(o.Token)-8] + "11111111"
	}
	for i := range 10 {
		if status, _ := callAs(t, srv, wrong, "GET", "/api/endpoints", ""); status != 401 {
			t.Fatalf("wrong owner token %d = %d, want 401", i+1, status)
		}
	}
	status, b := callAs(t, srv, o.Token, "GET", "/api/endpoints", "")
	if status != 429 {
		t.Errorf("the right owner token after 10 wrong ones = %d %s, want 429", status, b)
	}
}

// signinLinkFor makes a sign-in link for owner id through the API and
// returns its code.
func signinLinkFor(t *testing.T, srv *httptest.Server, id int64) (string, signinLink) {
	t.Helper()
	var link signinLink
	decodeAs(t, srv, testToken, "POST", fmt.Sprintf("/api/owners/%d/signin-links", id), "", 201, &link)
	u, err := url.Parse(link.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get("code"), link
}

// useLink posts code to /signin from a new browser, which it returns.
func useLink(t *testing.T, srv *httptest.Server, code string) (int, *http.Client) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	browser := noRedirect(jar)
	status, _ := browse(t, browser, srv, "POST", "/signin", url.Values{"code": {code}})
	return status, browser
}

func TestSigninLinksExpireAndSignInOnce(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o := newOwner(t, srv, "Linked")
	ep := endpointAs(t, srv, o.Token, 0)
	other := endpointAs(t, srv, testToken, 0)

	code, link := signinLinkFor(t, srv, o.ID)
	if !strings.HasPrefix(link.URL, srv.URL+"/signin?code=obl_") || link.OwnerID != o.ID {
		t.Errorf("link = %+v", link)
	}
	if d := time.Until(link.ExpiresAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("link expires in %s, want the 1 h the admin set", d)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.owner_signin_links WHERE position(convert_to($1, 'UTF8') IN code_hash) > 0 OR code_hash = convert_to($1, 'UTF8')`, code); n != 0 {
		t.Error("the table holds the link's code")
	}
	// Opening the link uses nothing: a preview may fetch it.
	for range 2 {
		status, page := browse(t, noRedirect(nil), srv, "GET", "/signin?code="+code, nil)
		if status != 200 || !strings.Contains(page, `value="`+code+`"`) {
			t.Fatalf("GET the link = %d:\n%s", status, page)
		}
	}
	status, browser := useLink(t, srv, code)
	if status != http.StatusSeeOther {
		t.Fatalf("the link's first use = %d, want 303", status)
	}
	if status, page := browse(t, browser, srv, "GET", "/endpoints", nil); status != 200 || !strings.Contains(page, fmt.Sprintf(`href="/endpoints/%d"`, ep.ID)) ||
		strings.Contains(page, fmt.Sprintf(`href="/endpoints/%d"`, other.ID)) {
		t.Errorf("the link's session sees %d, want the owner's endpoint only:\n%s", status, page)
	}
	if status, _ := browse(t, browser, srv, "GET", "/jobs", nil); status != 403 {
		t.Errorf("the link's session on the job list = %d, want 403", status)
	}
	if status, _ := useLink(t, srv, code); status != 401 {
		t.Errorf("the link's second use = %d, want 401", status)
	}

	// An expired link signs nobody in.
	expired, _ := signinLinkFor(t, srv, o.ID)
	mustExec(t, db, `UPDATE outbox.owner_signin_links SET expires_at = now() - interval '1 second' WHERE code_hash = sha256(convert_to($1, 'UTF8'))`, expired)
	if status, _ := useLink(t, srv, expired); status != 401 {
		t.Errorf("an expired link = %d, want 401", status)
	}

	// Two uses racing: one signs in.
	raced, _ := signinLinkFor(t, srv, o.ID)
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Go(func() { statuses[i], _ = useLink(t, srv, raced) })
	}
	wg.Wait()
	signedIn := 0
	for _, s := range statuses {
		if s == http.StatusSeeOther {
			signedIn++
		}
	}
	if signedIn != 1 {
		t.Errorf("8 racing uses of one link signed in %d times (%v), want 1", signedIn, statuses)
	}
	if status, _ := callAs(t, srv, testToken, "POST", "/api/owners/999999/signin-links", ""); status != 404 {
		t.Errorf("a link for no owner = %d, want 404", status)
	}
}

// Rotating an owner's token, through the API or the Owners page, voids
// the links made before it, and only that owner's: a link made after it
// signs in.
func TestRotatingAnOwnerTokenVoidsItsSigninLinks(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o, other := newOwner(t, srv, "Rotated"), newOwner(t, srv, "Untouched")
	admin := signIn(t, srv)

	beforeAPI, _ := signinLinkFor(t, srv, o.ID)
	othersLink, _ := signinLinkFor(t, srv, other.ID)
	decodeAs(t, srv, testToken, "POST", fmt.Sprintf("/api/owners/%d/rotate-token", o.ID), "", 200, nil)
	if status, _ := useLink(t, srv, beforeAPI); status != 401 {
		t.Errorf("a link made before POST /api/owners/{id}/rotate-token = %d, want 401", status)
	}
	beforePage, _ := signinLinkFor(t, srv, o.ID)
	if status, _ := browse(t, admin, srv, "POST", fmt.Sprintf("/owners/%d/rotate-token", o.ID), url.Values{}); status != 200 {
		t.Fatalf("rotate on the Owners page = %d, want 200", status)
	}
	if status, _ := useLink(t, srv, beforePage); status != 401 {
		t.Errorf("a link made before the Owners page's rotation = %d, want 401", status)
	}
	after, _ := signinLinkFor(t, srv, o.ID)
	if status, _ := useLink(t, srv, after); status != http.StatusSeeOther {
		t.Errorf("a link made after the rotation = %d, want 303", status)
	}
	if status, _ := useLink(t, srv, othersLink); status != http.StatusSeeOther {
		t.Errorf("another owner's link, made before the rotation = %d, want 303", status)
	}
}

// sendWithHost sends req with browser as if to host (the Host header, not
// where the request goes) and returns the status and the body.
func sendWithHost(t *testing.T, browser *http.Client, req *http.Request, host string) (int, string) {
	t.Helper()
	req.Host = host
	return send(t, browser, req)
}

// A sign-in link points at -public-url, else at the address the listener
// bound, whatever Host header the request that made it came with: the
// API's and the endpoint page's alike.
func TestSigninLinkIgnoresTheHostHeader(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	const forged = "evil.example:666"
	for _, publicURL := range []string{"", "https://outboxd.example.com"} {
		a := testAdmin(t, db, testPolicy, testLogger(t), nil)
		a.publicURL, _ = parsePublicURL(publicURL)
		srv := serveAdmin(t, a)
		want := srv.URL + "/signin?code=obl_"
		if publicURL != "" {
			want = publicURL + "/signin?code=obl_"
		}
		o := newOwner(t, srv, "Phished "+publicURL)
		ep := endpointAs(t, srv, testToken, o.ID)

		req, _ := http.NewRequest("POST", fmt.Sprintf("%s/api/owners/%d/signin-links", srv.URL, o.ID), nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		status, body := sendWithHost(t, http.DefaultClient, req, forged)
		var link signinLink
		if err := json.Unmarshal([]byte(body), &link); status != 201 || err != nil || !strings.HasPrefix(link.URL, want) {
			t.Errorf("-public-url %q: the API's link with Host %s = %d %s, want 201 with a URL starting %s", publicURL, forged, status, body, want)
		}

		req, _ = http.NewRequest("POST", fmt.Sprintf("%s/endpoints/%d/signin-link", srv.URL, ep.ID), strings.NewReader(""))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		// The client picks a jar's cookies by the Host header.
		for _, c := range signIn(t, srv).Jar.Cookies(req.URL) {
			req.AddCookie(c)
		}
		status, page := sendWithHost(t, http.DefaultClient, req, forged)
		m := regexp.MustCompile(`id="signin-link">([^<]+)<`).FindStringSubmatch(page)
		if status != 200 || m == nil || !strings.HasPrefix(m[1], want) {
			t.Errorf("-public-url %q: the endpoint page's link with Host %s = %d, %q; want 200 with a URL starting %s", publicURL, forged, status, m, want)
		}
	}
}

// outboxd listening on -addr 127.0.0.1:0 makes its links on the port it
// was given, not on port 0 nor on a request's Host header.
func TestSigninLinkIsOnTheBoundAddress(t *testing.T) {
	t.Parallel()
	_, dsn := newTestDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	var stdout syncBuffer
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		if err := run(ctx, []string{"-addr", "127.0.0.1:0", "-admin-token", testToken}, envFrom(map[string]string{"DATABASE_URL": dsn}), &stdout, testWriter{t}); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-exited })
	listening := regexp.MustCompile(`outboxd ready: open the panel at http://(127\.0\.0\.1:\d+)/`)
	waitFor(t, "outboxd to say where it listens", 60*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatal("outboxd exited before it listened")
		default:
		}
		return listening.MatchString(stdout.String())
	})
	addr := listening.FindStringSubmatch(stdout.String())[1]
	if strings.HasSuffix(addr, ":0") {
		t.Fatalf("outboxd says it listens on %s", addr)
	}

	call := func(path, body string, out any) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		status, body := sendWithHost(t, http.DefaultClient, req, "evil.example:666")
		if status != 201 || json.Unmarshal([]byte(body), out) != nil {
			t.Fatalf("POST %s = %d %s, want 201", path, status, body)
		}
	}
	var o ownerWithToken
	call("/api/owners", `{"name": "Phished"}`, &o)
	var link signinLink
	call(fmt.Sprintf("/api/owners/%d/signin-links", o.ID), "", &link)
	if want := "http://" + addr + "/signin?code=obl_"; !strings.HasPrefix(link.URL, want) {
		t.Errorf("link %s, want it on %s", link.URL, want)
	}
}

// POST /api/owners/{id}/signin-links takes an optional body, read as
// every route's: {"lifetime": "30m"}, a minute to a week; without it, or
// with null, -signin-link-lifetime. A bad lifetime, malformed JSON and an
// unknown field are 400s naming the problem, a body past the bound a 413,
// and none of them makes a link.
func TestSigninLinkBodyIsChecked(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	a := testAdmin(t, db, testPolicy, testLogger(t), nil)
	a.signinLinks = 10 * time.Minute
	srv := serveAdmin(t, a)
	o := newOwner(t, srv, "Timed")
	path := fmt.Sprintf("/api/owners/%d/signin-links", o.ID)
	for _, tc := range []struct {
		body string
		want time.Duration // the link's lifetime
	}{
		{"", 10 * time.Minute},
		{`{}`, 10 * time.Minute},
		{`{"lifetime": null}`, 10 * time.Minute},
		{`{"lifetime": "30m"}`, 30 * time.Minute},
		{`{"lifetime": "1m"}`, time.Minute},
		{`{"lifetime": "168h"}`, 168 * time.Hour},
	} {
		var link signinLink
		decodeAs(t, srv, testToken, "POST", path, tc.body, 201, &link)
		if d := time.Until(link.ExpiresAt); d < tc.want-time.Minute || d > tc.want+time.Minute {
			t.Errorf("%s: the link expires in %s, want %s", tc.body, d, tc.want)
		}
	}
	made := queryInt(t, db, `SELECT count(*) FROM outbox.owner_signin_links`)

	for _, tc := range []struct {
		body   string
		status int
		want   string // in the error
	}{
		{`{"lifetime": "1000h"}`, 400, "lifetime: 1000h0m0s must be between 1m0s and 168h0m0s"},
		{`{"lifetime": "168h1s"}`, 400, "lifetime: 168h0m1s must be between"},
		{`{"lifetime": "59s"}`, 400, "lifetime: 59s must be between"},
		{`{"lifetime": "-1h"}`, 400, "lifetime: -1h0m0s must be between"},
		{`{"lifetime": "soon"}`, 400, `lifetime: "soon" is not a duration`},
		{`{"lifetime": ""}`, 400, `lifetime: "" is not a duration`},
		{`{"lifetime": 1800}`, 400, "lifetime"},
		{`{`, 400, "request body"},
		{`{"lifetime": "30m"} {}`, 400, "more than one JSON value"},
		{`{"lifetme": "30m"}`, 400, `unknown field "lifetme"`},
		{`{"lifetime": "` + strings.Repeat("1", 1100<<10) + `m"}`, 413, "larger than"},
	} {
		status, b := callAs(t, srv, testToken, "POST", path, tc.body)
		if status != tc.status || !strings.Contains(errorOf(t, b), tc.want) {
			t.Errorf("%s: %d %s, want %d naming %q", truncate(tc.body, 40), status, truncate(string(b), 200), tc.status, tc.want)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.owner_signin_links`); n != made {
		t.Errorf("%d links after the refused bodies, want the %d made before", n, made)
	}
}

// The admin's endpoint page shows the owner and makes a link to hand over.
func TestEndpointPageMakesASigninLink(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	a := testAdmin(t, db, testPolicy, testLogger(t), nil)
	a.signinLinks = 10 * time.Minute
	srv := serveAdmin(t, a)
	o := newOwner(t, srv, "Handed over")
	ep := endpointAs(t, srv, testToken, o.ID)
	unowned := endpointAs(t, srv, testToken, 0)
	admin := signIn(t, srv)

	_, page := browse(t, admin, srv, "GET", fmt.Sprintf("/endpoints/%d", ep.ID), nil)
	if !strings.Contains(page, `id="make-signin-link"`) || !strings.Contains(page, `id="owner-name">Handed over<`) {
		t.Fatalf("the endpoint page shows no owner block:\n%s", page)
	}
	status, page := browse(t, admin, srv, "POST", fmt.Sprintf("/endpoints/%d/signin-link", ep.ID), url.Values{})
	m := regexp.MustCompile(`id="signin-link">([^<]+)<`).FindStringSubmatch(page)
	if status != 200 || m == nil || !strings.Contains(page, "Handed over") || !strings.Contains(page, "10m0s") {
		t.Fatalf("make a sign-in link = %d:\n%s", status, page)
	}
	u, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
	if err != nil {
		t.Fatal(err)
	}
	if status, _ := useLink(t, srv, u.Query().Get("code")); status != http.StatusSeeOther {
		t.Errorf("the panel's link = %d, want 303", status)
	}
	if status, page := browse(t, admin, srv, "POST", fmt.Sprintf("/endpoints/%d/signin-link", unowned.ID), url.Values{}); status != 400 || !strings.Contains(page, "no owner") {
		t.Errorf("a link for an endpoint without owner = %d:\n%s", status, page)
	}
	_, page = browse(t, admin, srv, "GET", fmt.Sprintf("/endpoints/%d", unowned.ID), nil)
	if strings.Contains(page, `id="make-signin-link"`) {
		t.Error("an endpoint without an owner offers a sign-in link")
	}
}

// The portal's pages show an owner only its own: the navigation names
// no global page, and the endpoint page offers no sign-in link, and no
// owner to give the endpoint to.
func TestPortalNavigationHidesGlobalPages(t *testing.T) {
	t.Parallel()
	w := newIsolationWorld(t)
	ep := endpointAs(t, w.srv, w.mine.Token, 0)
	browser := signInAs(t, w.srv, w.mine.Token)
	for _, path := range []string{"/endpoints", fmt.Sprintf("/endpoints/%d", ep.ID), "/audit"} {
		status, page := browse(t, browser, w.srv, "GET", path, nil)
		if status != 200 {
			t.Fatalf("GET %s = %d", path, status)
		}
		nav := page[strings.Index(page, "<header>"):strings.Index(page, "</header>")]
		// /events is there: the portal's search of the events its
		// endpoints were sent (ownerevents_test.go).
		for _, global := range []string{`href="/jobs"`, `href="/sources"`, `href="/subjects"`, `href="/"`} {
			if strings.Contains(nav, global) {
				t.Errorf("%s: the owner's navigation links %s", path, global)
			}
		}
		if !strings.Contains(nav, `id="portal-owner">mine<`) {
			t.Errorf("%s: the header does not name the owner signed in:\n%s", path, nav)
		}
		if strings.Contains(page, "make-signin-link") {
			t.Errorf("%s: an owner is offered to make sign-in links", path)
		}
		if strings.Contains(page, `id="owner-form"`) || strings.Contains(page, ">theirs<") {
			t.Errorf("%s: an owner is offered to give its endpoint away, or shown another owner's name", path)
		}
	}
	_, page := browse(t, signIn(t, w.srv), w.srv, "GET", "/endpoints", nil)
	if !strings.Contains(page, `href="/events"`) {
		t.Error("the admin's navigation lost the events page")
	}
}

// An owner who opens / lands on its endpoints, the portal's header
// naming it; the admin's / is the overview.
func TestOwnerOpeningTheOverviewLandsOnItsEndpoints(t *testing.T) {
	t.Parallel()
	w := newIsolationWorld(t)
	browser := signInAs(t, w.srv, w.mine.Token)
	req, err := http.NewRequest("GET", w.srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := browser.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/endpoints" {
		t.Fatalf("an owner's GET / = %d to %q, want 303 to /endpoints", resp.StatusCode, resp.Header.Get("Location"))
	}
	status, page := browse(t, browser, w.srv, "GET", "/endpoints", nil)
	if status != 200 || !strings.Contains(page, `id="portal-owner">mine<`) {
		t.Errorf("the owner's endpoints = %d, without its name in the header:\n%s", status, page)
	}
	if status, page := browse(t, signIn(t, w.srv), w.srv, "GET", "/", nil); status != 200 || !strings.Contains(page, "<title>Overview") {
		t.Errorf("the admin's GET / = %d, want the overview:\n%s", status, page)
	}
}

// An owner reads what its endpoint was sent, the payload among it, and
// nothing of an event sent elsewhere.
func TestOwnerSeesWhatItsEndpointWasSent(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o := newOwner(t, srv, "reader")
	var mine Endpoint
	decodeAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/hook", "topics": ["order.*"]}`, 201, &mine)
	decodeAs(t, srv, testToken, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/other", "topics": ["user.*"]}`, 201, nil)
	sent, elsewhere := recordAddressed(t, db, o.Key, "order.paid", "o-1"), record(t, db, "user.created", "u-1")
	relayAll(t, db)

	var got eventWithJobs
	decodeAs(t, srv, o.Token, "GET", fmt.Sprintf("/api/endpoints/%d/events/%d", mine.ID, sent), "", 200, &got)
	if got.ID != sent || got.Topic != "order.paid" || !strings.Contains(string(got.Payload), `"o-1"`) ||
		len(got.Jobs) != 1 || got.Jobs[0].EndpointID == nil || *got.Jobs[0].EndpointID != mine.ID {
		t.Errorf("the owner's view of event %d = %+v", sent, got)
	}
	status, b := callAs(t, srv, o.Token, "GET", fmt.Sprintf("/api/endpoints/%d/events/%d", mine.ID, elsewhere), "")
	missingStatus, missing := callAs(t, srv, o.Token, "GET", fmt.Sprintf("/api/endpoints/%d/events/%d", mine.ID, elsewhere+100), "")
	if status != 404 || missingStatus != 404 ||
		strings.ReplaceAll(string(b), fmt.Sprint(elsewhere), "N") != strings.ReplaceAll(string(missing), fmt.Sprint(elsewhere+100), "N") {
		t.Errorf("an event sent elsewhere = %d %s; a missing one = %d %s; want the same 404", status, b, missingStatus, missing)
	}
	_, page := browse(t, signInAs(t, srv, o.Token), srv, "GET", fmt.Sprintf("/endpoints/%d/events/%d", mine.ID, sent), nil)
	if payload := between(page, `id="payload">`, "</pre>"); !strings.Contains(payload, `&#34;subject&#34;: &#34;o-1&#34;`) {
		t.Errorf("the owner's event page shows no payload:\n%s", page)
	}
}

// The links table stays bounded however many links the admin makes: each
// new one deletes the expired ones and the live ones past the newest 1000.
func TestSigninLinksStayBounded(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	o, err := createOwner(t.Context(), db, ownerInput{Name: ptr("many links")})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO outbox.owner_signin_links (code_hash, owner_id, expires_at)
		SELECT sha256(convert_to('expired ' || i, 'UTF8')), $1, now() - interval '1 minute' FROM generate_series(1, 150) AS i`, o.ID)
	mustExec(t, db, `INSERT INTO outbox.owner_signin_links (code_hash, owner_id, expires_at)
		SELECT sha256(convert_to('live ' || i, 'UTF8')), $1, now() + interval '1 hour' FROM generate_series(1, 1005) AS i`, o.ID)
	if _, err := storeSigninLink(t.Context(), db, signinCodeHash("obl_new"), o.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	expired := queryInt(t, db, `SELECT count(*) FROM outbox.owner_signin_links WHERE expires_at <= now()`)
	live := queryInt(t, db, `SELECT count(*) FROM outbox.owner_signin_links WHERE expires_at > now()`)
	if expired != 50 || live != 1000 {
		t.Errorf("after one new link: %d expired (want 150 - 100 = 50) and %d live (want the newest 1000)", expired, live)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.owner_signin_links WHERE code_hash = $1`, signinCodeHash("obl_new")); n != 1 {
		t.Error("the new link is not among the live ones")
	}
}

// The admin's Owners page creates an owner and shows its token once,
// replaces a token, and deletes an owner; each is in the audit trail.
func TestOwnersPageCreatesRotatesAndDeletes(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	admin := signIn(t, srv)
	tokenOf := regexp.MustCompile(`id="owner-token">(obo_[0-9a-f]+)<`)

	status, page := browse(t, admin, srv, "POST", "/owners", url.Values{"name": {"Ops"}})
	m := tokenOf.FindStringSubmatch(page)
	if status != 200 || m == nil {
		t.Fatalf("create an owner on the panel = %d:\n%s", status, page)
	}
	first := m[1]
	if status, _ := callAs(t, srv, first, "GET", "/api/endpoints", ""); status != 200 {
		t.Errorf("the panel's new token = %d, want 200", status)
	}
	if _, page := browse(t, admin, srv, "GET", "/owners", nil); tokenOf.MatchString(page) || !strings.Contains(page, `id="owner-1"`) {
		t.Errorf("the owners list shows a token, or not the owner:\n%s", page)
	}
	_, page = browse(t, admin, srv, "POST", "/owners/1/rotate-token", url.Values{})
	if m = tokenOf.FindStringSubmatch(page); m == nil || m[1] == first {
		t.Fatalf("rotate on the panel shows no new token:\n%s", page)
	}
	if status, _ := callAs(t, srv, first, "GET", "/api/endpoints", ""); status != 401 {
		t.Errorf("the replaced token = %d, want 401", status)
	}
	if status, page := browse(t, admin, srv, "POST", "/owners", url.Values{"name": {""}}); status != 400 || !strings.Contains(page, "name") {
		t.Errorf("an owner without a name = %d:\n%s", status, page)
	}
	if status, _ := browse(t, admin, srv, "POST", "/owners/1/delete", url.Values{"confirm": {"yes"}}); status != http.StatusSeeOther {
		t.Errorf("delete on the panel = %d, want 303", status)
	}
	if status, _ := callAs(t, srv, m[1], "GET", "/api/endpoints", ""); status != 401 {
		t.Errorf("a deleted owner's token = %d, want 401", status)
	}
	var trail struct{ Entries []AuditEntry }
	decodeAs(t, srv, testToken, "GET", "/api/audit", "", 200, &trail)
	want := []auditLine{
		{Actor: "admin", Via: "panel", Action: "POST /owners/{id}/delete", Kind: "owner", Subject: "1", Fields: "confirm"},
		{Actor: "admin", Via: "panel", Action: "POST /owners/{id}/rotate-token", Kind: "owner", Subject: "1"},
		{Actor: "admin", Via: "panel", Action: "POST /owners", Kind: "owner", Subject: "1", Fields: "name"},
	}
	if diff := cmp.Diff(want, linesOf(trail.Entries)); diff != "" {
		t.Errorf("the panel's owner changes in the trail (-want +got):\n%s", diff)
	}
}

// An address past its budget of wrong tokens is refused a sign-in link
// without the link being used up: the owner signs in with it once the
// budget refills.
func TestThrottledAddressDoesNotSpendASigninLink(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	a := testAdmin(t, db, testPolicy, testLogger(t), nil)
	start, passed := time.Now(), atomic.Int64{} // the limiter's clock, read by the handlers
	a.auth.now = func() time.Time { return start.Add(time.Duration(passed.Load())) }
	srv := serveAdmin(t, a)
	o := newOwner(t, srv, "behind a busy NAT")
	code, _ := signinLinkFor(t, srv, o.ID)
	for i := range 10 {
		if status, _ := useLink(t, srv, fmt.Sprintf("obl_wrong%d", i)); status != 401 {
			t.Fatalf("wrong code %d = %d, want 401", i+1, status)
		}
	}
	if status, _ := useLink(t, srv, code); status != 429 {
		t.Fatalf("the right code after 10 wrong ones = %d, want 429", status)
	}
	passed.Store(int64(6 * time.Second)) // one try refilled
	if status, _ := useLink(t, srv, code); status != http.StatusSeeOther {
		t.Errorf("the link after the budget refilled = %d, want 303: the throttled try used it up", status)
	}
}

// An owner reads its endpoint's alerts, as the overview has them.
func TestOwnerReadsItsEndpointsAlerts(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o := newOwner(t, srv, "paged")
	failing, quiet := endpointAs(t, srv, o.Token, 0), endpointAs(t, srv, o.Token, 0)
	adminsFailing := endpointAs(t, srv, testToken, 0)
	mustExec(t, db, `UPDATE outbox.endpoints SET breaker_opened_at = now(), consecutive_failures = 5, failing_since = now() WHERE id IN ($1, $2)`,
		failing.ID, adminsFailing.ID)

	var got struct{ Alerts []Alert }
	decodeAs(t, srv, o.Token, "GET", fmt.Sprintf("/api/endpoints/%d/alerts", failing.ID), "", 200, &got)
	if len(got.Alerts) != 1 || got.Alerts[0].Name != "endpoint_failing" || got.Alerts[0].Link != fmt.Sprintf("/endpoints/%d", failing.ID) ||
		got.Alerts[0].Level != 1 { // not the 2 endpoints failing in all
		t.Errorf("the failing endpoint's alerts = %+v, want its endpoint_failing alone", got.Alerts)
	}
	decodeAs(t, srv, o.Token, "GET", fmt.Sprintf("/api/endpoints/%d/alerts", quiet.ID), "", 200, &got)
	if len(got.Alerts) != 0 {
		t.Errorf("a quiet endpoint's alerts = %+v, want none", got.Alerts)
	}
}
