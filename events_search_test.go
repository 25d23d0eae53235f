// events_search_test.go: the stream searched by payload, jsonb
// containment, through the API, the panel and a browser, and the index
// that serves it.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// searchStream records the events the search tests look through, and
// returns their ids in order.
func searchStream(t *testing.T, db interface {
	QueryRow(string, ...any) *sql.Row
}) []int64 {
	t.Helper()
	var ids []int64
	for _, e := range []struct{ topic, payload string }{
		{"order.paid", `{"id": 1, "amount_cents": 1200, "customer": {"id": 42, "country": "DE"}, "tags": ["vip", "b2b"]}`},
		{"order.paid", `{"id": 2, "amount_cents": 900, "customer": {"id": 7, "country": "DE"}, "tags": []}`},
		{"order.refunded", `{"id": 3, "amount_cents": 1200, "customer": {"id": 42, "country": "FR"}}`},
		{"order.paid", `{"id": 4, "amount_cents": "1200", "customer": {"id": "42"}, "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}`},
		{"user.created", `{"id": 42}`},
	} {
		var id int64
		if err := db.QueryRow(`SELECT outbox.record($1, 's', $2::jsonb)`, e.topic, e.payload).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// payloadQuery is the stream's path searching for payload, with more
// parameters after it.
func payloadQuery(payload, more string) string {
	return "/api/events?payload=" + url.QueryEscape(payload) + more
}

// A search returns, newest first, the events whose payload contains the
// object: nested objects by their members, arrays by their elements,
// numbers and strings by type as well as value; alongside the other
// filters, and paged like the rest of the stream.
func TestEventsSearchByPayloadContainment(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ids := searchStream(t, db)
	for _, c := range []struct {
		payload, more string
		want          []int
	}{
		{`{"customer": {"id": 42}}`, "", []int{3, 1}},
		{`{"customer": {"id": "42"}}`, "", []int{4}}, // a string is not the number
		{`{"amount_cents": 1200}`, "", []int{3, 1}},
		{`{"amount_cents": 1200, "customer": {"country": "DE"}}`, "", []int{1}},
		{`{"tags": ["vip"]}`, "", []int{1}},
		{`{"lines": [{"sku": "B-7"}]}`, "", []int{4}},
		{`{"id": 42}`, "", []int{5}},
		{`{"customer": {"id": 42}}`, "&topic=order.paid", []int{1}},
		{`{"customer": {"id": 99}}`, "", []int{}},
		{`{}`, "&topic=order.*", []int{4, 3, 2, 1}},
	} {
		got := listStream(t, api, payloadQuery(c.payload, c.more))
		want := []int64{}
		for _, n := range c.want {
			want = append(want, ids[n-1])
		}
		if diff := cmp.Diff(want, idsOf(got.Events)); diff != "" {
			t.Errorf("payload %s%s (-want +got):\n%s", c.payload, c.more, diff)
		}
	}

	// Paged one event at a time: the older page, then back.
	first := listStream(t, api, payloadQuery(`{"amount_cents": 1200}`, "&limit=1"))
	if diff := cmp.Diff([]int64{ids[2]}, idsOf(first.Events)); diff != "" || first.NextBefore == 0 {
		t.Fatalf("first page of one (-want +got):\n%s\nnext_before %d", diff, first.NextBefore)
	}
	second := listStream(t, api, payloadQuery(`{"amount_cents": 1200}`, fmt.Sprintf("&limit=1&before=%d", first.NextBefore)))
	if diff := cmp.Diff([]int64{ids[0]}, idsOf(second.Events)); diff != "" || second.NextBefore != 0 || second.NextAfter == 0 {
		t.Errorf("second page of one (-want +got):\n%s\nnext_before %d, next_after %d", diff, second.NextBefore, second.NextAfter)
	}
}

// A payload that is not one JSON object, or not text PostgreSQL takes as
// it was sent, is a 400 that names payload and says what is wrong.
func TestEventsSearchRefusesABadPayload(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	for _, c := range []struct{ payload, want string }{
		{`[1]`, `payload must be a JSON object, such as {"status": "paid"}`},
		{`42`, `payload must be a JSON object`},
		{`{"a": 1`, `payload is not one JSON value`},
		{`{"a": 1} {"b": 2}`, `payload is not one JSON value`},
		{`{"a": 1, "a": 2}`, `payload: "a" given twice in one object`},
		{`{"a": "\ud800"}`, `payload: a: \ud800 is a lone UTF-16 surrogate`},
	} {
		var body struct {
			Error string `json:"error"`
		}
		status := apiCall(t, api.srv, "GET", payloadQuery(c.payload, ""), "", &body)
		if status != http.StatusBadRequest || !strings.Contains(body.Error, c.want) {
			t.Errorf("payload %s: %d %q, want 400 saying %q", c.payload, status, body.Error, c.want)
		}
	}
}

// The search a page asks for, a selective value in a stream of thousands,
// is planned through events_by_payload rather than by reading the stream
// from its newest event down.
func TestEventsSearchByPayloadUsesItsIndex(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	recordCustomerEvents(t, db)
	f := EventFilter{Payload: `{"customer": {"id": 1234}}`, Limit: defaultPageSize}
	if plan := searchPlan(t, db, f); !strings.Contains(plan, "events_by_payload") {
		t.Errorf("the search is not planned through events_by_payload:\n%s", plan)
	}
	events, err := listEvents(context.Background(), db, f, f.Limit+1)
	if err != nil || len(events) != 10 {
		t.Errorf("customer 1234's events: %d (%v), want the 10 of them", len(events), err)
	}
}

// recordCustomerEvents inserts 20,000 events of 2,000 customers (10
// each), and analyzes the table, as a planner would see a large stream.
func recordCustomerEvents(t *testing.T, db *sql.DB) {
	t.Helper()
	mustExec(t, db, `
		INSERT INTO outbox.events (topic, subject, payload)
		SELECT 'order.paid', i::text, jsonb_build_object('id', i, 'customer', jsonb_build_object('id', i % 2000), 'status', 'paid')
		FROM generate_series(1, 20000) AS i`)
	mustExec(t, db, `ANALYZE outbox.events`)
}

// searchPlan is the plan of the stream's first page searched by f.
func searchPlan(t *testing.T, db *sql.DB, f EventFilter) string {
	t.Helper()
	plan, err := queryAll(context.Background(), db, func(r rowScanner) (string, error) {
		var line string
		return line, r.Scan(&line)
	}, "EXPLAIN "+listEventsOlderSQL, f.args(f.Limit+1)...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

// The panel's stream takes the same search in its form, shows it back,
// and keeps it in the link to the older page; a bad one is a 400 page
// that names it.
func TestPanelEventsSearchByPayload(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ids := searchStream(t, db)
	status, page := panelPage(t, api.srv, "/events?limit=1&payload="+url.QueryEscape(`{"customer": {"id": 42}}`))
	if status != http.StatusOK {
		t.Fatalf("GET /events with a payload: %d\n%s", status, page)
	}
	for _, want := range []string{
		`<a href="/events/` + itoa(ids[2]) + `">`,
		`name="payload" value="{&#34;customer&#34;: {&#34;id&#34;: 42}}"`,
		"payload=%7B%22customer%22%3A&#43;%7B%22id%22%3A&#43;42%7D%7D", // the older page keeps the search
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the searched page lacks %s:\n%s", want, page)
		}
	}
	if strings.Contains(page, `<a href="/events/`+itoa(ids[1])+`">`) {
		t.Error("the searched page lists an event whose payload does not contain the object")
	}
	if status, page := panelPage(t, api.srv, "/events?payload="+url.QueryEscape(`["vip"]`)); status != http.StatusBadRequest || !strings.Contains(page, "payload must be a JSON object") {
		t.Errorf("a bad payload search: %d, want a 400 page naming payload:\n%.500s", status, page)
	}
}

// In a browser: the operator types an object into the events page's
// search and sees the events about that customer alone.
func TestPanelEventsSearchInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	ids := searchStream(t, db)

	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("#backlog")
	br.open(srv.URL + "/events")
	br.typeInto("form.filter input[name=payload]", `{"customer": {"country": "FR"}}`)
	br.click("form.filter button")
	// The unfiltered page lists the event too: wait for the page that
	// lists it alone.
	waitFor(t, "the events page searched for the customer in FR", 20*time.Second, func() bool {
		return br.count("table tbody tr") == 1
	})
	br.find(fmt.Sprintf(`a[href="/events/%d"]`, ids[2]))
}
