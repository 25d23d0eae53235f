// ownerevents_test.go: an owner's search of the events its endpoints
// were sent, through the API, the portal and a browser, within the
// tenancy boundary, and the index that serves it.

package main

import (
	"database/sql"
	"fmt"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// ownerSearchWorld is two owners, acme and globex, and the admin, each
// with an endpoint taking order.* and outboxd.*, and the events recorded
// for them, every one with the payload {"subject": "cust-42"} but acme's
// a2.
type ownerSearchWorld struct {
	db                  *sql.DB
	srv                 *httptest.Server
	acme, globex        ownerWithToken
	acmeEp              Endpoint
	a1, b1, n1, a2, bo  int64
	no, ao, a3, missing int64
}

func newOwnerSearchWorld(t *testing.T) ownerSearchWorld {
	t.Helper()
	db, _ := newTestDB(t)
	w := ownerSearchWorld{db: db, srv: newTestAdmin(t, db)}
	w.acme, w.globex = newOwner(t, w.srv, "acme"), newOwner(t, w.srv, "globex")
	hook := `{"url": "http://127.0.0.1:9/hook", "topics": ["order.*", "outboxd.*"]}`
	decodeAs(t, w.srv, w.acme.Token, "POST", "/api/endpoints", hook, 201, &w.acmeEp)
	decodeAs(t, w.srv, w.globex.Token, "POST", "/api/endpoints", hook, 201, nil)
	decodeAs(t, w.srv, testToken, "POST", "/api/endpoints", hook, 201, nil)
	w.a1 = recordAddressed(t, db, w.acme.Key, "order.paid", "cust-42")
	w.b1 = recordAddressed(t, db, w.globex.Key, "order.paid", "cust-42")
	w.n1 = record(t, db, "order.paid", "cust-42") // to no owner: the admin's endpoint
	w.a2 = recordAddressed(t, db, w.acme.Key, "order.paid", "cust-7")
	w.bo = recordAddressed(t, db, w.globex.Key, "outboxd.endpoint.failing", "cust-42")
	w.no = record(t, db, "outboxd.endpoint.failing", "cust-42")
	w.ao = recordAddressed(t, db, w.acme.Key, "outboxd.endpoint.failing", "cust-42")
	w.a3 = recordAddressed(t, db, w.acme.Key, "order.refunded", "cust-42")
	w.missing = w.a3 + 1000
	relayAll(t, db)
	// a3 was delivered: its job has left the queue for the history.
	mustExec(t, db, `INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, outcome, duration_ms, status_code)
		SELECT id, 1, event_id, kind, endpoint_id, 'completed', 12, 200 FROM outbox.jobs WHERE event_id = $1`, w.a3)
	mustExec(t, db, `DELETE FROM outbox.jobs WHERE event_id = $1`, w.a3)
	return w
}

// searchAs is the page of the stream token's GET path answers.
func searchAs(t *testing.T, srv *httptest.Server, token, path string) eventsAnswer {
	t.Helper()
	var got eventsAnswer
	decodeAs(t, srv, token, "GET", path, "", 200, &got)
	return got
}

// An owner's search finds, newest first and paged, the events its
// endpoints were sent, from the queue and from the history, and none of
// another owner's or the admin's, though their payloads match as well:
// outboxd's own events included.
func TestOwnerSearchesOnlyTheEventsItsEndpointsWereSent(t *testing.T) {
	t.Parallel()
	w := newOwnerSearchWorld(t)
	cust42 := `{"subject": "cust-42"}`
	// The admin's search finds every owner's: the payload matches them all.
	admin := searchAs(t, w.srv, testToken, payloadQuery(cust42, ""))
	if diff := cmp.Diff([]int64{w.a3, w.ao, w.no, w.bo, w.n1, w.b1, w.a1}, idsOf(admin.Events)); diff != "" {
		t.Fatalf("the admin's search (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		name, token, path string
		want              []int64
	}{
		{"acme by payload", w.acme.Token, payloadQuery(cust42, ""), []int64{w.a3, w.ao, w.a1}},
		{"globex by payload", w.globex.Token, payloadQuery(cust42, ""), []int64{w.bo, w.b1}},
		{"acme's outboxd events", w.acme.Token, payloadQuery(`{}`, "&topic=outboxd.*"), []int64{w.ao}},
		{"acme by topic", w.acme.Token, "/api/events?topic=order.paid", []int64{w.a2, w.a1}},
		{"acme, everything", w.acme.Token, "/api/events", []int64{w.a3, w.ao, w.a2, w.a1}},
		{"acme, another customer", w.acme.Token, payloadQuery(`{"subject": "cust-9"}`, ""), []int64{}},
	} {
		got := searchAs(t, w.srv, c.token, c.path)
		if diff := cmp.Diff(c.want, idsOf(got.Events)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
		for _, e := range got.Events {
			if e.Outcome != nil {
				t.Errorf("%s: event %d shows an outcome, which counts every endpoint's jobs", c.name, e.ID)
			}
		}
	}
	first := searchAs(t, w.srv, w.acme.Token, payloadQuery(cust42, "&limit=2"))
	second := searchAs(t, w.srv, w.acme.Token, payloadQuery(cust42, fmt.Sprintf("&limit=2&before=%d", first.NextBefore)))
	if !cmp.Equal([]int64{w.a3, w.ao}, idsOf(first.Events)) || !cmp.Equal([]int64{w.a1}, idsOf(second.Events)) ||
		second.NextBefore != 0 || second.NextAfter == 0 {
		t.Errorf("acme's pages of two: %v then %v (next_before %d, next_after %d), want [%d %d] then [%d]",
			idsOf(first.Events), idsOf(second.Events), second.NextBefore, second.NextAfter, w.a3, w.ao, w.a1)
	}
}

// An owner reads by id an event its endpoints were sent, with its own
// endpoints' jobs alone; another owner's event, the admin's, or an
// outboxd event about another's endpoint is the 404 of a missing one.
func TestOwnerReadsItsEventAndNotAnothersByID(t *testing.T) {
	t.Parallel()
	w := newOwnerSearchWorld(t)
	var got eventWithJobs
	decodeAs(t, w.srv, w.acme.Token, "GET", fmt.Sprintf("/api/events/%d", w.a1), "", 200, &got)
	if got.ID != w.a1 || len(got.Jobs) != 1 || got.Jobs[0].EndpointID == nil || *got.Jobs[0].EndpointID != w.acmeEp.ID {
		t.Errorf("acme's event %d = %+v, want it with its one job to endpoint %d", w.a1, got, w.acmeEp.ID)
	}
	decodeAs(t, w.srv, w.acme.Token, "GET", fmt.Sprintf("/api/events/%d", w.a3), "", 200, nil) // from the history
	_, missing := callAs(t, w.srv, w.acme.Token, "GET", fmt.Sprintf("/api/events/%d", w.missing), "")
	for _, id := range []int64{w.b1, w.n1, w.bo, w.no} {
		status, b := callAs(t, w.srv, w.acme.Token, "GET", fmt.Sprintf("/api/events/%d", id), "")
		if status != 404 || strings.ReplaceAll(string(b), fmt.Sprint(id), "N") != strings.ReplaceAll(string(missing), fmt.Sprint(w.missing), "N") {
			t.Errorf("acme's GET of event %d = %d %s; a missing one: %s", id, status, b, missing)
		}
	}
}

// An owner's search refuses a bad payload naming payload, and the
// admin's state and outcome filters naming them.
func TestOwnerSearchRefusesBadInput(t *testing.T) {
	t.Parallel()
	w := newOwnerSearchWorld(t)
	for _, c := range []struct{ path, want string }{
		{payloadQuery(`["vip"]`, ""), "payload must be a JSON object"},
		{payloadQuery(`{"a": 1`, ""), "payload is not one JSON value"},
		{"/api/events?state=poisoned", "state: an owner's search takes"},
		{"/api/events?outcome=failed", "outcome: an owner's search takes"},
	} {
		status, b := callAs(t, w.srv, w.acme.Token, "GET", c.path, "")
		if status != 400 || !strings.Contains(string(b), c.want) {
			t.Errorf("acme's GET %s = %d %s, want 400 saying %q", c.path, status, b, c.want)
		}
	}
}

// The portal's events page: the navigation names it, its form searches,
// and each event links to its endpoint's page of it; another owner's
// matching event is not there.
func TestPortalEventsPageSearchesTheOwnersEvents(t *testing.T) {
	t.Parallel()
	w := newOwnerSearchWorld(t)
	browser := signInAs(t, w.srv, w.acme.Token)
	status, page := browse(t, browser, w.srv, "GET", "/events?payload="+url.QueryEscape(`{"subject": "cust-42"}`)+"&topic=order.*", nil)
	if status != 200 {
		t.Fatalf("acme's GET /events: %d\n%s", status, page)
	}
	for _, want := range []string{
		`<a href="/events" aria-current="page">Events</a>`,
		fmt.Sprintf(`<a href="/endpoints/%d/events/%d">`, w.acmeEp.ID, w.a1),
		fmt.Sprintf(`<a href="/endpoints/%d/events/%d">`, w.acmeEp.ID, w.a3),
		fmt.Sprintf(`<tr id="event-%d">`, w.a1),
		`name="payload" value="{&#34;subject&#34;: &#34;cust-42&#34;}"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("acme's events page lacks %s:\n%s", want, page)
		}
	}
	for _, id := range []int64{w.b1, w.n1, w.a2, w.ao} {
		if strings.Contains(page, fmt.Sprintf(`id="event-%d"`, id)) {
			t.Errorf("acme's search lists event %d:\n%s", id, page)
		}
	}
	// The link of an event delivered, its job gone to the history, opens.
	if status, page := browse(t, browser, w.srv, "GET", fmt.Sprintf("/endpoints/%d/events/%d", w.acmeEp.ID, w.a3), nil); status != 200 {
		t.Errorf("acme's link to the delivered event %d = %d:\n%.500s", w.a3, status, page)
	}
	if status, page := browse(t, browser, w.srv, "GET", "/events?payload="+url.QueryEscape(`[1]`), nil); status != 400 || !strings.Contains(page, "payload must be a JSON object") {
		t.Errorf("a bad payload on the portal: %d, want a 400 page naming payload:\n%.500s", status, page)
	}
}

// An owner's selective payload search is planned through
// events_by_payload too, not by reading the stream from its newest event
// down and asking of each whether its endpoints were sent it.
func TestOwnerEventsSearchUsesThePayloadIndex(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	recordCustomerEvents(t, db)
	f := EventFilter{Payload: `{"customer": {"id": 1234}}`, Limit: defaultPageSize, Owner: 1}
	if plan := searchPlan(t, db, f); !strings.Contains(plan, "events_by_payload") {
		t.Errorf("the owner's search is not planned through events_by_payload:\n%s", plan)
	}
}

// In a browser: an owner signs in to the portal, searches its events by
// payload and sees its matching event alone.
func TestOwnerSearchesEventsInPortalBrowser(t *testing.T) {
	t.Parallel()
	w := newOwnerSearchWorld(t)
	br := startBrowser(t)
	br.open(w.srv.URL + "/login")
	br.typeInto("input[name=token]", w.acme.Token)
	br.click("form.login button")
	br.find("#portal-owner")
	br.click(`nav a[href="/events"]`)
	br.typeInto("form.filter input[name=payload]", `{"subject": "cust-42"}`)
	br.typeInto("form.filter input[name=topic]", "order.paid")
	br.click("form.filter button")
	// The unsearched page lists the event too: wait for the page that
	// lists it alone.
	waitFor(t, "acme's events page searched for cust-42's order.paid", 20*time.Second, func() bool {
		return br.count("table tbody tr") == 1
	})
	br.find(fmt.Sprintf(`a[href="/endpoints/%d/events/%d"]`, w.acmeEp.ID, w.a1))
}
