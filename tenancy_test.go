// tenancy_test.go: events addressed to an owner reach that owner's
// endpoints and nobody else's, whatever their topics, on every path that
// gives or shows an endpoint an event (docs/owners.md, the boundary); and
// what the admin grants an owner bounds what its endpoints ask for.

package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// tenants is two owners, alpha and bravo, each with an endpoint of
// topics ["*"], and the admin's endpoint of ["*"]: the probe's setup.
type tenants struct {
	db                 *sql.DB
	srv                *httptest.Server
	alpha, bravo       ownerWithToken
	alphaEp, bravoEp   Endpoint
	adminEp            Endpoint
	alphaEv, bravoEv   int64 // one event addressed to each
	unaddressed        int64 // one addressed to no owner
	alphaOwn, bravoOwn int64 // outboxd.endpoint.failing of each one's endpoint
}

func newTenants(t *testing.T) tenants {
	t.Helper()
	db, _ := newTestDB(t)
	w := tenants{db: db, srv: newTestAdmin(t, db)}
	decodeAs(t, w.srv, testToken, "POST", "/api/owners", `{"name": "Alpha", "key": "cust_alpha"}`, 201, &w.alpha)
	decodeAs(t, w.srv, testToken, "POST", "/api/owners", `{"name": "Bravo", "key": "cust_bravo"}`, 201, &w.bravo)
	// Each owner widens its own endpoint's topics as far as they go.
	decodeAs(t, w.srv, w.alpha.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/alpha", "topics": ["*", "outboxd.*"]}`, 201, &w.alphaEp)
	decodeAs(t, w.srv, w.bravo.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/bravo", "topics": ["*", "outboxd.*"]}`, 201, &w.bravoEp)
	decodeAs(t, w.srv, testToken, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/admin", "topics": ["*"]}`, 201, &w.adminEp)

	var rec struct{ ID int64 }
	decodeAs(t, w.srv, testToken, "POST", "/api/events",
		`{"topic": "card.charged", "subject": "b-1", "owner": "cust_bravo", "payload": {"bravo_secret": "B-ONLY-PAYLOAD", "card_last4": "4242"}}`, 201, &rec)
	w.bravoEv = rec.ID
	w.alphaEv = recordAddressed(t, db, "cust_alpha", "card.charged", "a-1")
	w.unaddressed = record(t, db, "card.charged", "n-1")
	// Each owner's endpoint fails once: its state event is its owner's.
	mustExec(t, db, `UPDATE outbox.endpoints SET failing_since = now() WHERE id = ANY($1)`, fmt.Sprintf("{%d,%d}", w.alphaEp.ID, w.bravoEp.ID))
	w.alphaOwn = int64(queryInt(t, db, `SELECT id FROM outbox.events WHERE topic = 'outboxd.endpoint.failing' AND subject = $1`, fmt.Sprint(w.alphaEp.ID)))
	w.bravoOwn = int64(queryInt(t, db, `SELECT id FROM outbox.events WHERE topic = 'outboxd.endpoint.failing' AND subject = $1`, fmt.Sprint(w.bravoEp.ID)))
	relayAll(t, db)
	return w
}

// eventsOf is the ids of the events endpoint id has a delivery of.
func (w tenants) eventsOf(t *testing.T, id int64) []string {
	t.Helper()
	return queryStrings(t, w.db, `SELECT event_id::text FROM outbox.jobs WHERE endpoint_id = $1 ORDER BY event_id`, id)
}

func eventIDList(events ...int64) []string {
	out := []string{}
	for _, id := range events {
		out = append(out, fmt.Sprint(id))
	}
	return out
}

// An owner whose endpoint subscribes to "*" and "outboxd.*" receives its
// own events and its own endpoint's news, and nothing of another owner's
// or of the events addressed to nobody; the admin's "*" endpoint receives
// the unaddressed ones alone.
func TestOwnersEndpointsReceiveOnlyTheirOwnersEvents(t *testing.T) {
	t.Parallel()
	w := newTenants(t)
	for _, c := range []struct {
		name string
		ep   int64
		want []string
	}{
		{"alpha", w.alphaEp.ID, eventIDList(w.alphaEv, w.alphaOwn)},
		{"bravo", w.bravoEp.ID, eventIDList(w.bravoEv, w.bravoOwn)},
		{"admin", w.adminEp.ID, eventIDList(w.unaddressed)},
	} {
		if diff := cmp.Diff(c.want, w.eventsOf(t, c.ep)); diff != "" {
			t.Errorf("%s's endpoint's deliveries, by event (-want +got):\n%s", c.name, diff)
		}
	}
	var ev Event
	decodeAs(t, w.srv, testToken, "GET", fmt.Sprintf("/api/events/%d", w.bravoEv), "", 200, &ev)
	if ev.Owner == nil || *ev.Owner != "cust_bravo" {
		t.Errorf("GET /api/events/%d owner = %v, want cust_bravo", w.bravoEv, ev.Owner)
	}
}

// Nothing alpha can call shows it bravo's event: its replay and dry run
// reach back over every event and count only alpha's, its filter preview
// counts only alpha's, and the event page of bravo's event answers the
// 404 of an event that does not exist.
func TestOwnerCannotReadAnotherOwnersEvents(t *testing.T) {
	t.Parallel()
	w := newTenants(t)
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	alphaPath := fmt.Sprintf("/api/endpoints/%d", w.alphaEp.ID)

	var dry ReplayPreview
	decodeAs(t, w.srv, w.alpha.Token, "POST", alphaPath+"/replay", fmt.Sprintf(`{"since": %q, "dry_run": true}`, since), 200, &dry)
	mustExec(t, w.db, `UPDATE outbox.jobs SET state = 'completed', finalized_at = now() WHERE endpoint_id = $1`, w.alphaEp.ID)
	decodeAs(t, w.srv, w.alpha.Token, "POST", alphaPath+"/replay", fmt.Sprintf(`{"since": %q, "dry_run": true}`, since), 200, &dry)
	if dry.Events != 2 {
		t.Errorf("alpha's dry run counts %d events, want its own 2 (%+v)", dry.Events, dry)
	}
	decodeAs(t, w.srv, w.alpha.Token, "POST", alphaPath+"/replay", fmt.Sprintf(`{"since": %q}`, since), 200, nil)
	if diff := cmp.Diff(eventIDList(w.alphaEv, w.alphaOwn), w.eventsOf(t, w.alphaEp.ID)); diff != "" {
		t.Errorf("after alpha's replay, its endpoint's deliveries by event (-want +got):\n%s", diff)
	}

	var pv FilterPreview
	decodeAs(t, w.srv, w.alpha.Token, "POST", alphaPath+"/filter-preview", `{"filter": "exists($.bravo_secret)"}`, 200, &pv)
	if pv.Events != 2 || pv.Matched != 0 {
		t.Errorf("alpha's preview of exists($.bravo_secret) = %+v, want 2 events of its own, none matched", pv)
	}

	status, b := callAs(t, w.srv, w.alpha.Token, "GET", fmt.Sprintf("%s/events/%d", alphaPath, w.bravoEv), "")
	if status != 404 || strings.Contains(string(b), "B-ONLY") {
		t.Errorf("alpha reading bravo's event = %d %s, want 404", status, b)
	}
	// Even with a delivery of it made behind the boundary's back (a
	// release before it, a path that forgot it), the page shows nothing.
	mustExec(t, w.db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts) VALUES ('webhook', $1, $2, 18)`, w.bravoEv, w.alphaEp.ID)
	status, b = callAs(t, w.srv, w.alpha.Token, "GET", fmt.Sprintf("%s/events/%d", alphaPath, w.bravoEv), "")
	if status != 404 || strings.Contains(string(b), "B-ONLY") {
		t.Errorf("alpha reading bravo's event it has a job of = %d %s, want 404", status, b)
	}
}

// The admin shares topics of unaddressed events with an owner, and
// allows it only some topics of its own: the fan-out and the owner's
// writes keep to both.
func TestOwnerGrantsShareAndNarrowTopics(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	var o ownerWithToken
	decodeAs(t, srv, testToken, "POST", "/api/owners",
		`{"name": "Gamma", "key": "gamma", "allowed_topics": ["invoice.*"], "shared_topics": ["announce.*"]}`, 201, &o)
	if diff := cmp.Diff([]string{"invoice.*"}, o.AllowedTopics); diff != "" {
		t.Errorf("allowed_topics echoed (-want +got):\n%s", diff)
	}
	status, b := callAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/g", "topics": ["*"]}`)
	if status != 400 || !strings.Contains(string(b), "topics") {
		t.Errorf(`an owner allowed invoice.* asking for ["*"] = %d %s, want 400 naming topics`, status, b)
	}
	var ep Endpoint
	decodeAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/g", "topics": ["invoice.*", "announce.*"]}`, 201, &ep)
	// The admin may give it wider topics; the fan-out keeps to the grants.
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", ep.ID), `{"topics": ["*"]}`, 200, nil)

	invoice := recordAddressed(t, db, "gamma", "invoice.paid", "i-1")
	recordAddressed(t, db, "gamma", "order.paid", "o-1") // its own, not allowed
	announce := record(t, db, "announce.maintenance", "m-1")
	record(t, db, "invoice.paid", "i-2") // addressed to nobody, not shared
	relayAll(t, db)
	got := queryStrings(t, db, `SELECT event_id::text FROM outbox.jobs WHERE endpoint_id = $1 ORDER BY event_id`, ep.ID)
	if diff := cmp.Diff(eventIDList(invoice, announce), got); diff != "" {
		t.Errorf("gamma's deliveries by event (-want +got):\n%s", diff)
	}
}

// An owner's limits, as the admin sets them, hold what its endpoints ask
// for: the defaults are 10 endpoints of at most 8 in flight; a rate limit
// bound makes one required; a lower limit brings its endpoints down.
func TestOwnerLimitsHoldItsEndpoints(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	var o ownerWithToken
	decodeAs(t, srv, testToken, "POST", "/api/owners", `{"name": "Delta"}`, 201, &o)
	if o.Key != fmt.Sprintf("owner-%d", o.ID) || o.MaxEndpoints != 10 || o.MaxInFlight != 8 || o.MaxRateLimitPerSecond != nil {
		t.Errorf("a new owner = %+v; want key owner-%d, 10 endpoints, 8 in flight, no rate bound", o, o.ID)
	}
	var first Endpoint
	decodeAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/d"}`, 201, &first)
	if first.MaxInFlight != 8 {
		t.Errorf("an owner's endpoint made without max_in_flight has %d, want its owner's 8", first.MaxInFlight)
	}
	if status, b := callAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/d", "max_in_flight": 1000}`); status != 400 || !strings.Contains(string(b), "max_in_flight") {
		t.Errorf("an owner asking for max_in_flight 1000 = %d %s, want 400", status, b)
	}
	if status, b := callAs(t, srv, o.Token, "PATCH", fmt.Sprintf("/api/endpoints/%d", first.ID), `{"max_in_flight": 9}`); status != 400 {
		t.Errorf("an owner raising max_in_flight to 9 = %d %s, want 400", status, b)
	}
	for range 9 {
		decodeAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/d"}`, 201, nil)
	}
	if status, b := callAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/d"}`); status != 400 || !strings.Contains(string(b), "max_endpoints") {
		t.Errorf("an owner's 11th endpoint = %d %s, want 400 naming max_endpoints", status, b)
	}

	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", o.ID), `{"max_in_flight": 2, "max_rate_limit_per_second": 5}`, 200, nil)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE owner_id = $1 AND (max_in_flight > 2 OR rate_limit_per_second IS DISTINCT FROM 5)`, o.ID); n != 0 {
		t.Errorf("%d of the owner's endpoints kept settings above its lowered limits", n)
	}
	if status, b := callAs(t, srv, o.Token, "PATCH", fmt.Sprintf("/api/endpoints/%d", first.ID), `{"rate_limit_per_second": null}`); status != 400 {
		t.Errorf("an owner removing its rate limit under a bound = %d %s, want 400", status, b)
	}
	// The admin keeps every right.
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", first.ID), `{"max_in_flight": 100}`, 200, nil)
}

// An endpoint the admin gives an owner, on create or by a change, counts
// against the owner's max_endpoints as the owner's own create does; one
// the owner has already is not counted again.
func TestEndpointsTheAdminGivesCountAgainstMaxEndpoints(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o := newOwner(t, srv, "Foxtrot")
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", o.ID), `{"max_endpoints": 2}`, 200, nil)
	given := endpointAs(t, srv, testToken, o.ID)
	endpointAs(t, srv, o.Token, 0)
	adminsOwn := endpointAs(t, srv, testToken, 0)
	refused := []struct{ method, path, body string }{
		{"POST", "/api/endpoints", fmt.Sprintf(`{"url": "http://127.0.0.1:9/d", "owner_id": %d}`, o.ID)},
		{"PATCH", fmt.Sprintf("/api/endpoints/%d", adminsOwn.ID), fmt.Sprintf(`{"owner_id": %d}`, o.ID)},
	}
	for _, req := range refused {
		if status, b := callAs(t, srv, testToken, req.method, req.path, req.body); status != 400 || !strings.Contains(string(b), "max_endpoints") {
			t.Errorf("the admin's %s %s giving a third endpoint = %d %s, want 400 naming max_endpoints", req.method, req.path, status, b)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE owner_id = $1`, o.ID); n != 2 {
		t.Errorf("the owner has %d endpoints after the refusals, want 2", n)
	}
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", o.ID), `{"max_endpoints": 1}`, 200, nil)
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", given.ID), fmt.Sprintf(`{"owner_id": %d, "description": "kept"}`, o.ID), 200, nil)
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", o.ID), `{"max_endpoints": 2}`, 200, nil)
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", given.ID), `{"owner_id": null}`, 200, nil)
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", adminsOwn.ID), fmt.Sprintf(`{"owner_id": %d}`, o.ID), 200, nil)
}

// An owner's replays reach back no further than the admin allows it.
func TestOwnerReplayWindowIsBounded(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	var o ownerWithToken
	decodeAs(t, srv, testToken, "POST", "/api/owners", `{"name": "Echo", "key": "echo", "max_replay_window_seconds": 3600}`, 201, &o)
	var ep Endpoint
	decodeAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/e"}`, 201, &ep)
	since := time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339)
	var dry ReplayPreview
	decodeAs(t, srv, o.Token, "POST", fmt.Sprintf("/api/endpoints/%d/replay", ep.ID), fmt.Sprintf(`{"since": %q, "dry_run": true}`, since), 200, &dry)
	if !dry.Clamped || time.Since(dry.From) > time.Hour+time.Minute {
		t.Errorf("an owner's replay from 24 h ago starts at %s (clamped %t), want an hour ago", dry.From, dry.Clamped)
	}
	decodeAs(t, srv, testToken, "POST", fmt.Sprintf("/api/endpoints/%d/replay", ep.ID), fmt.Sprintf(`{"since": %q, "dry_run": true}`, since), 200, &dry)
	if dry.Clamped {
		t.Errorf("the admin's replay was clamped to the owner's window: %+v", dry)
	}
}

// POST /api/events takes "owner"; an Idempotency-Key sent again with
// another owner is another request; an address no owner could have is
// refused; an inbox source's events carry its owner.
func TestEventsAreAddressedThroughTheAPIAndTheInbox(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	status, id, _ := postEvent(t, srv.URL, testToken, "k1", `{"topic": "a.b", "owner": "cust_1"}`)
	if status != 201 {
		t.Fatalf("POST /api/events with an owner = %d", status)
	}
	if got := queryStrings(t, db, `SELECT owner FROM outbox.events WHERE id = $1`, id); !cmp.Equal(got, []string{"cust_1"}) {
		t.Errorf("the event's owner = %q, want cust_1", got)
	}
	if status, _, _ := postEvent(t, srv.URL, testToken, "k1", `{"topic": "a.b", "owner": "cust_2"}`); status != 422 {
		t.Errorf("the key again with another owner = %d, want 422", status)
	}
	if status, _, _ := postEvent(t, srv.URL, testToken, "k1", `{"topic": "a.b", "owner": "cust_1"}`); status != 200 {
		t.Errorf("the key again with the same owner = %d, want 200 (a retry)", status)
	}
	if status, b := callAs(t, srv, testToken, "POST", "/api/events", `{"topic": "a.b", "owner": "no spaces please"}`); status != 400 || !strings.Contains(string(b), "owner") {
		t.Errorf("an owner no key could be = %d %s, want 400 naming owner", status, b)
	}
	if _, err := db.Exec(`SELECT outbox.record('a.b', '', '{}', 'bad key')`); err == nil {
		t.Error("outbox.record took an owner no key could be")
	}
}

// A source with an owner addresses every event its webhooks become to
// that owner; one without addresses none.
func TestInboxSourceAddressesItsEvents(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	status, b := api.do("POST", "/api/sources", `{"name": "acme", "owner": "cust_42"}`)
	var src inboxSourceWithSecret
	if status != 201 || json.Unmarshal(b, &src) != nil || src.Owner == nil || *src.Owner != "cust_42" {
		t.Fatalf("POST /api/sources with an owner = %d %s", status, b)
	}
	secret, err := parseWebhookSecret(src.Secret)
	if err != nil {
		t.Fatal(err)
	}
	plain := api.createSource("plain", "")
	body := []byte(`{"id":"1","type":"invoice.paid","subject":"inv-7","data":{}}`)
	for _, s := range []struct {
		name   string
		secret []byte
	}{{"acme", secret}, {"plain", plain}} {
		if status := postWebhook(t, api.srv.URL+"/webhooks/"+s.name, s.secret, "1", time.Now(), body, nil); status != 200 {
			t.Fatalf("a webhook to %s: %d", s.name, status)
		}
	}
	got := queryStrings(t, db, `SELECT topic || ' ' || coalesce(owner, '-') FROM outbox.events ORDER BY id`)
	if diff := cmp.Diff([]string{"acme.invoice.paid cust_42", "plain.invoice.paid -"}, got); diff != "" {
		t.Errorf("the events received, as topic and owner (-want +got):\n%s", diff)
	}
	if status, b := api.do("POST", "/api/sources", `{"name": "bad", "owner": "two words"}`); status != 400 || !strings.Contains(string(b), "owner") {
		t.Errorf("a source with an owner no key could be = %d %s, want 400", status, b)
	}
}

// The endpoint page's edit form holds an owner to its limits as its token
// is: max_in_flight above the owner's bound is refused and nothing is
// saved; a setting the admin raised beyond the bound, sent back as the
// page shows it, does not stop the owner saving another field.
func TestOwnerEditFormIsHeldToItsLimits(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o := newOwner(t, srv, "Echo")
	var ep Endpoint
	decodeAs(t, srv, o.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/e", "topics": ["order.*"]}`, 201, &ep)
	code, _ := signinLinkFor(t, srv, o.ID)
	status, browser := useLink(t, srv, code)
	if status != http.StatusSeeOther {
		t.Fatalf("sign-in with the link: %d", status)
	}
	form := func(maxInFlight, description string) url.Values {
		return url.Values{"url": {ep.URL}, "topics": {"order.*"}, "description": {description},
			"max_in_flight": {maxInFlight}, "ordering": {ep.Ordering}}
	}
	path := fmt.Sprintf("/endpoints/%d/edit", ep.ID)

	status, page := browse(t, browser, srv, "POST", path, form("100", "raised"))
	if status != http.StatusBadRequest || !strings.Contains(page, "max_in_flight 100: this owner&#39;s endpoints may ask for 8 at most") {
		t.Errorf("the owner's form asking for max_in_flight 100: %d, want 400 naming the bound:\n%.600s", status, page)
	}
	if n := queryInt(t, db, `SELECT max_in_flight FROM outbox.endpoints WHERE id = $1`, ep.ID); n != 8 {
		t.Errorf("after the refused form max_in_flight is %d, want 8", n)
	}

	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", ep.ID), `{"max_in_flight": 50}`, 200, nil)
	if status, page := browse(t, browser, srv, "POST", path, form("50", "renamed")); status != http.StatusSeeOther {
		t.Errorf("the owner's form changing the description beside the admin's 50: %d\n%.600s", status, page)
	}
	var description string
	var maxInFlight int
	if err := db.QueryRow(`SELECT description, max_in_flight FROM outbox.endpoints WHERE id = $1`, ep.ID).Scan(&description, &maxInFlight); err != nil {
		t.Fatal(err)
	}
	if description != "renamed" || maxInFlight != 50 {
		t.Errorf("after the owner's save: description %q, max_in_flight %d; want renamed, 50", description, maxInFlight)
	}
}
