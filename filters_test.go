// filters_test.go: endpoint filters (docs/filters.md) against a real
// PostgreSQL: the fan-out delivers what a filter passes and nothing else,
// an error on a payload is no match, a bad filter is refused with why,
// replays, dry runs and the probe's gap replay apply it, the statistics
// count what it kept out, and the preview counts what it would pass; a
// filter whose cost would grow faster than the payload is refused, one
// that fails the relay's pass anyway is held for its endpoint alone, and
// a preview too costly to run answers 400.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// paidFilter is docs/filters.md's first example.
const paidFilter = `$.status == "paid" && $.amount_cents > 1000`

// createFilteredEndpoint creates an endpoint for url with topics and
// filter (JSON null when empty) through the API.
func createFilteredEndpoint(t *testing.T, api *testAPI, url, filter string, topics ...string) Endpoint {
	t.Helper()
	body := map[string]any{"url": url, "topics": topics, "filter": nil}
	if filter != "" {
		body["filter"] = filter
	}
	b, _ := json.Marshal(body)
	status, resp := api.do("POST", "/api/endpoints", string(b))
	if status != http.StatusCreated {
		t.Fatalf("create endpoint with filter %q: %d %s", filter, status, resp)
	}
	var e Endpoint
	if err := json.Unmarshal(resp, &e); err != nil {
		t.Fatal(err)
	}
	return e
}

// recordPayload records an event with payload and returns its id.
func recordPayload(t *testing.T, db *sql.DB, topic, subject, payload string) int64 {
	t.Helper()
	var id int64
	if err := db.QueryRow(`SELECT outbox.record($1, $2, $3)`, topic, subject, payload).Scan(&id); err != nil {
		t.Fatalf("record %s: %v", payload, err)
	}
	return id
}

// jobEvents is endpoint id's jobs' event ids, in order.
func jobEvents(t *testing.T, db *sql.DB, id int64) []int64 {
	t.Helper()
	return ids(t, db, fmt.Sprintf(`SELECT event_id FROM outbox.jobs WHERE endpoint_id = %d ORDER BY event_id`, id))
}

// The fan-out gives a filtered endpoint exactly the events its filter
// passes, and its neighbour without a filter every one. A payload the
// filter cannot be evaluated on (a wrong type, strict mode's missing
// member) is no match; so is one on which it raises an error (proved by
// evaluating it without silent), and the pass neither fails nor poisons
// anything.
func TestFanOutAppliesTheFilter(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	paid := createFilteredEndpoint(t, api, "http://127.0.0.1:1/paid", paidFilter, "order.*")
	strict := createFilteredEndpoint(t, api, "http://127.0.0.1:1/strict", `strict $.customer.tier == "gold"`, "order.*")
	// A filter that answers false on an empty object, so it is stored,
	// but no item at all on a paid order, which is not a boolean result:
	// jsonb_path_match without silent raises on it.
	raising := createFilteredEndpoint(t, api, "http://127.0.0.1:1/raising", `($.status == "paid") ? (@ == false)`, "order.*")
	every := createFilteredEndpoint(t, api, "http://127.0.0.1:1/every", "", "order.*")
	if paid.Filter == nil || *paid.Filter != paidFilter || every.Filter != nil {
		t.Fatalf("created filters %v and %v, want %q echoed and null", paid.Filter, every.Filter, paidFilter)
	}

	big := recordPayload(t, db, "order.paid", "a", `{"status": "paid", "amount_cents": 1500, "customer": {"tier": "gold"}}`)
	small := recordPayload(t, db, "order.paid", "b", `{"status": "paid", "amount_cents": 500}`)
	unpaid := recordPayload(t, db, "order.created", "c", `{"status": "new", "amount_cents": 5000}`)
	wrongType := recordPayload(t, db, "order.paid", "d", `{"status": "paid", "amount_cents": "lots", "customer": "gold"}`)
	notObject := recordPayload(t, db, "order.paid", "e", `[1, 2, 3]`)
	recordPayload(t, db, "user.created", "f", `{"status": "paid", "amount_cents": 9999}`) // no endpoint's topic

	var raised sql.NullBool
	if err := db.QueryRow(`SELECT jsonb_path_match(payload, $1::jsonpath) FROM outbox.events WHERE id = $2`,
		*raising.Filter, big).Scan(&raised); err == nil || !strings.Contains(err.Error(), "single boolean result is expected") {
		t.Fatalf("the raising filter on a paid order answered %v, %v; want it to raise", raised, err)
	}

	res, err := newTestRelay(t, db, defaultConfig().Relay).relayOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(passResult{Claimed: 6, Fanned: 6, Jobs: 2 + 5}, res); diff != "" {
		t.Errorf("pass (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{big}, jobEvents(t, db, paid.ID)); diff != "" {
		t.Errorf("the paid filter's jobs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{big}, jobEvents(t, db, strict.ID)); diff != "" {
		t.Errorf("the strict filter's jobs (-want +got):\n%s", diff)
	}
	if got := jobEvents(t, db, raising.ID); len(got) != 0 {
		t.Errorf("the raising filter's jobs: %v, want none", got)
	}
	if diff := cmp.Diff([]int64{big, small, unpaid, wrongType, notObject}, jobEvents(t, db, every.ID)); diff != "" {
		t.Errorf("the unfiltered endpoint's jobs (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL OR relay_attempts > 0 OR poisoned_at IS NOT NULL`); n != 0 {
		t.Errorf("%d events not fanned out cleanly", n)
	}
}

// The statistics count, per endpoint, the events of its topics its filter
// kept out, in the row the fan-out writes for the pass; the stats API
// shows them, for one endpoint and for all.
func TestStatsCountWhatTheFilterKeptOut(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	paid := createFilteredEndpoint(t, api, "http://127.0.0.1:1/paid", paidFilter, "order.*")
	every := createFilteredEndpoint(t, api, "http://127.0.0.1:1/every", "", "order.*")
	mustExec(t, db, `SELECT outbox.record('order.paid', 's' || i, jsonb_build_object('status', 'paid', 'amount_cents', i * 100))
		FROM generate_series(1, 30) AS i`) // 20 of them above 1000 cents
	relayAll(t, db)

	if n := queryInt(t, db, `SELECT count(*) FROM outbox.fanout_stats WHERE endpoint_id = $1`, paid.ID); n != 1 {
		t.Errorf("%d statistics rows for the filtered endpoint, want 1 (one pass, one minute)", n)
	}
	for _, tc := range []struct {
		path                  string
		produced, filteredOut int64
	}{
		{"/api/endpoints/" + itoa(paid.ID) + "/stats", 20, 10},
		{"/api/endpoints/" + itoa(every.ID) + "/stats", 30, 0},
		{"/api/stats", 50, 10},
	} {
		var st DeliveryStats
		if code := apiCall(t, api.srv, "GET", tc.path, "", &st); code != http.StatusOK {
			t.Fatalf("GET %s = %d", tc.path, code)
		}
		if st.Produced != tc.produced || st.FilteredOut != tc.filteredOut {
			t.Errorf("GET %s: produced %d, filtered out %d; want %d and %d", tc.path, st.Produced, st.FilteredOut, tc.produced, tc.filteredOut)
		}
		var series int64
		for _, m := range st.Series {
			series += m.FilteredOut
		}
		if series != tc.filteredOut {
			t.Errorf("GET %s: the series filtered out %d, want %d", tc.path, series, tc.filteredOut)
		}
	}
	req, _ := http.NewRequest("GET", api.srv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	metrics := parseMetrics(t, resp.Body)
	resp.Body.Close()
	if got := metrics["outboxd_delivery_stats_last_hour_filtered_out"]; got != 10 {
		t.Errorf("/metrics outboxd_delivery_stats_last_hour_filtered_out = %v, want 10", got)
	}
}

// A filter is echoed by every answer, changed and removed by PATCH (left
// out, it stays), and one that cannot be stored answers 400 naming the
// field and the problem, PostgreSQL's own parse message among them.
func TestEndpointFilterIsEchoedAndBadOnesRefused(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := createFilteredEndpoint(t, api, "http://127.0.0.1:1/hook", paidFilter, "order.*")
	path := "/api/endpoints/" + itoa(ep.ID)
	filterOf := func(body []byte) *string {
		var e Endpoint
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatal(err)
		}
		return e.Filter
	}
	if got := api.endpoint(ep.ID).Filter; got == nil || *got != paidFilter {
		t.Errorf("GET filter %v, want %q", got, paidFilter)
	}
	if status, body := api.do("PATCH", path, `{"description": "kept"}`); status != http.StatusOK || filterOf(body) == nil || *filterOf(body) != paidFilter {
		t.Errorf("PATCH without filter = %d %s, want the filter kept", status, body)
	}
	if status, body := api.do("PATCH", path, `{"filter": "$.region == \"eu\""}`); status != http.StatusOK || filterOf(body) == nil || *filterOf(body) != `$.region == "eu"` {
		t.Errorf("PATCH filter = %d %s, want the new one", status, body)
	}
	if status, body := api.do("PATCH", path, `{"filter": null}`); status != http.StatusOK || filterOf(body) != nil {
		t.Errorf("PATCH filter null = %d %s, want none", status, body)
	}

	for _, tc := range []struct{ filter, want string }{
		{`$.status ==`, `filter: syntax error at end of jsonpath input`},
		{`$.a like_regex "("`, `filter: invalid regular expression: parentheses () not balanced`},
		{`$.status`, `filter: not a predicate`},
		{`$.amount > $min`, `filter: a filter may not use variables`},
		{`$.at.datetime() > "2026-01-01".datetime()`, `filter: .datetime() is not supported`},
		{` `, `filter is empty`},
		{`$.a == "` + strings.Repeat("x", 4096) + `"`, `filter is 4105 bytes, at most 4096`},
	} {
		b, _ := json.Marshal(map[string]any{"url": "http://127.0.0.1:1/bad", "filter": tc.filter})
		for _, req := range []struct{ method, path string }{{"POST", "/api/endpoints"}, {"PATCH", path}} {
			status, body := api.do(req.method, req.path, string(b))
			if msg := errorOf(t, body); status != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Errorf("%s %s filter %.40q = %d %q, want 400 containing %q", req.method, req.path, tc.filter, status, msg, tc.want)
			}
		}
	}
	if got := api.endpoint(ep.ID).Filter; got != nil {
		t.Errorf("a refused PATCH changed the filter to %q", *got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 1 {
		t.Errorf("%d endpoints, want the one: a refused POST stored one", n)
	}
	// A direct SQL write is held to the same rule.
	if _, err := db.Exec(`UPDATE outbox.endpoints SET filter = '$x == 1'`); err == nil || !strings.Contains(err.Error(), "endpoints_filter_allowed") {
		t.Errorf("a variable written by SQL: %v, want endpoints_filter_allowed to refuse it", err)
	}
}

// An ordered endpoint holds a subject's later delivery while an earlier
// event of the subject waits to be fanned out. When that event comes and
// the filter keeps it out, the later delivery is released: a filtered
// event holds nothing up.
func TestFilteredEventReleasesItsOrderedLane(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := createFilteredEndpoint(t, api, "http://127.0.0.1:1/ordered", paidFilter, "order.*")
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"ordering": "subject"}`); status != http.StatusOK {
		t.Fatalf("order by subject: %d %s", status, body)
	}
	first := recordPayload(t, db, "order.created", "o1", `{"status": "new"}`)
	second := recordPayload(t, db, "order.paid", "o1", `{"status": "paid", "amount_cents": 2000}`)
	fanOne := func(id int64) {
		t.Helper()
		mustExec(t, db, `SELECT * FROM outbox.fan_out(1, $1, '[]', 18, 300, '')`, id)
	}
	dueAt := func() string {
		t.Helper()
		var due string
		if err := db.QueryRow(`SELECT CASE WHEN scheduled_at = 'infinity' THEN 'held' ELSE 'due' END FROM outbox.jobs WHERE event_id = $1`, second).Scan(&due); err != nil {
			t.Fatal(err)
		}
		return due
	}
	fanOne(second)
	if got := dueAt(); got != "held" {
		t.Fatalf("the later delivery is %s while the earlier event waits, want held", got)
	}
	fanOne(first)
	if diff := cmp.Diff([]int64{second}, jobEvents(t, db, ep.ID)); diff != "" {
		t.Errorf("jobs (-want +got):\n%s", diff)
	}
	if got := dueAt(); got != "due" {
		t.Errorf("the later delivery is %s after the earlier event was filtered out, want due", got)
	}
}

// A replay and its dry run select only the events the filter passes, so
// the dry run counts what the replay enqueues.
func TestReplayAndDryRunApplyTheFilter(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var since time.Time
	if err := db.QueryRow(`SELECT now() - interval '1 minute'`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	want := []int64{
		recordPayload(t, db, "order.paid", "a", `{"status": "paid", "amount_cents": 1500}`),
		recordPayload(t, db, "order.paid", "c", `{"status": "paid", "amount_cents": 3000}`),
	}
	recordPayload(t, db, "order.paid", "b", `{"status": "paid", "amount_cents": 100}`)
	recordPayload(t, db, "order.paid", "d", `{"status": "paid", "amount_cents": "n/a"}`)
	relayAll(t, db)
	// Created after the fan-out: it has no job, and a replay is how it
	// gets the earlier events.
	ep := createFilteredEndpoint(t, api, "http://127.0.0.1:1/late", paidFilter, "order.*")
	path := "/api/endpoints/" + itoa(ep.ID) + "/replay"
	body := func(dryRun bool) string {
		b, _ := json.Marshal(map[string]any{"since": since.Format(time.RFC3339Nano), "dry_run": dryRun})
		return string(b)
	}
	var pv ReplayPreview
	if code := apiCall(t, api.srv, "POST", path, body(true), &pv); code != http.StatusOK || pv.Events != 2 {
		t.Errorf("dry run = %d, %d events; want 200, 2", code, pv.Events)
	}
	var res ReplayResult
	if code := apiCall(t, api.srv, "POST", path, body(false), &res); code != http.StatusOK || res.Jobs != 2 {
		t.Errorf("replay = %d, %d jobs; want 200, 2", code, res.Jobs)
	}
	enqueueWhole(t, db, res.ReplayID)
	if diff := cmp.Diff(want, jobEvents(t, db, ep.ID)); diff != "" {
		t.Errorf("the replay's jobs (-want +got):\n%s", diff)
	}
}

// A recovered endpoint's gap replay (probe.go) sends what it missed that
// its filter passes, and nothing else.
func TestProbeGapReplayAppliesTheFilter(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := createFilteredEndpoint(t, api, rc.srv.URL+"/hook", paidFilter, "order.*")
	disableForFailure(t, db, 2*time.Hour, ep.ID)
	missed := recordPayload(t, db, "order.paid", "a", `{"status": "paid", "amount_cents": 1500}`)
	recordPayload(t, db, "order.paid", "b", `{"status": "refunded", "amount_cents": 1500}`)
	recordPayload(t, db, "order.paid", "c", `"not an object"`)
	relayAll(t, db)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1`, ep.ID); n != 0 {
		t.Fatalf("%d jobs for the disabled endpoint, want none", n)
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET next_probe_at = now() WHERE id = $1`, ep.ID)
	if round := probeRoundOf(t, newTestProber(t, db, nil)); len(round.Recovered) != 1 {
		t.Fatalf("recovered %v, want [%d]", round.Recovered, ep.ID)
	}
	if diff := cmp.Diff([]int64{missed}, jobEvents(t, db, ep.ID)); diff != "" {
		t.Errorf("the gap replay's jobs (-want +got):\n%s", diff)
	}
}

// The preview runs a filter, saved or not, over the newest events of the
// topics: by default the newest 500, at most 10,000, and counts what it
// passes and what it could not be evaluated on.
func TestFilterPreviewCounts(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	// 600 orders, one in four paid above 1000 cents; among the newest
	// 500 (ids 101..600) that is 125. Every tenth has a text amount,
	// which the filter cannot compare: unknown.
	mustExec(t, db, `SELECT outbox.record('order.paid', 's' || i,
		CASE WHEN i % 10 = 0 THEN jsonb_build_object('status', 'paid', 'amount_cents', 'n/a')
		     WHEN i % 4 = 1 THEN jsonb_build_object('status', 'paid', 'amount_cents', 2000)
		     ELSE jsonb_build_object('status', 'new', 'amount_cents', 2000) END)
		FROM generate_series(1, 600) AS i`)
	recordPayload(t, db, "user.created", "u", `{"status": "paid", "amount_cents": 5000}`)

	preview := func(path, body string) FilterPreview {
		t.Helper()
		var pv FilterPreview
		if code := apiCall(t, api.srv, "POST", path, body, &pv); code != http.StatusOK {
			t.Fatalf("POST %s %s = %d", path, body, code)
		}
		return pv
	}
	pv := preview("/api/endpoints/filter-preview", `{"topics": ["order.*"], "filter": "$.status == \"paid\" && $.amount_cents > 1000"}`)
	if pv.Limit != 500 || pv.Events != 500 || pv.Matched != 125 || pv.Unknown != 50 {
		t.Errorf("preview = %+v, want 125 of 500 (limit 500), 50 unknown", pv)
	}
	if all := preview("/api/endpoints/filter-preview", `{"topics": ["order.*"], "limit": 10000}`); all.Events != 600 || all.Matched != 600 {
		t.Errorf("preview without a filter = %+v, want 600 of 600", all)
	}

	ep := createFilteredEndpoint(t, api, "http://127.0.0.1:1/hook", paidFilter, "order.*")
	own := preview("/api/endpoints/"+itoa(ep.ID)+"/filter-preview", ``)
	if own.Events != 500 || own.Matched != 125 || own.Filter == nil || *own.Filter != paidFilter {
		t.Errorf("the endpoint's own filter = %+v, want 125 of 500", own)
	}
	tried := preview("/api/endpoints/"+itoa(ep.ID)+"/filter-preview", `{"filter": "$.status == \"new\"", "limit": 100}`)
	if tried.Events != 100 || tried.Matched != 65 {
		t.Errorf("another filter over the newest 100 = %+v, want 65 of 100", tried)
	}

	for _, tc := range []struct{ path, body, want string }{
		{"/api/endpoints/filter-preview", `{"topics": ["order.*"], "limit": 10001}`, "limit must be between 1 and 10000"},
		{"/api/endpoints/filter-preview", `{"topics": ["order.*"], "limit": 0}`, "limit must be between 1 and 10000"},
		{"/api/endpoints/filter-preview", `{"topics": ["order.*"], "filter": "$.a ="}`, "filter: syntax error"},
		{"/api/endpoints/filter-preview", `{"topics": ["bad topic"]}`, "topic pattern"},
		{"/api/endpoints/" + itoa(ep.ID) + "/filter-preview", `{"filter": "$.a"}`, "filter: not a predicate"},
	} {
		status, body := api.do("POST", tc.path, tc.body)
		if msg := errorOf(t, body); status != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("POST %s %s = %d %q, want 400 containing %q", tc.path, tc.body, status, msg, tc.want)
		}
	}
}

// The endpoint page shows the filter, what it kept out, and a form that
// previews another one on the spot, saving nothing; its edit form sets
// and removes the filter, and a bad one is refused with why.
func TestEndpointPageShowsAndPreviewsTheFilter(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := createFilteredEndpoint(t, api, "http://127.0.0.1:1/hook", paidFilter, "order.*")
	mustExec(t, db, `SELECT outbox.record('order.paid', 's' || i, jsonb_build_object('status', 'paid', 'amount_cents', i * 100))
		FROM generate_series(1, 30) AS i`) // 20 of them above 1000 cents
	relayAll(t, db)
	browser := signIn(t, api.srv)
	path := api.srv.URL + "/endpoints/" + itoa(ep.ID)
	post := func(action string, form url.Values) (int, string) {
		t.Helper()
		resp, err := browser.PostForm(path+"/"+action, form)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	code, page := panelPage(t, api.srv, "/endpoints/"+itoa(ep.ID))
	if code != http.StatusOK {
		t.Fatalf("endpoint page = %d", code)
	}
	for _, want := range []string{
		`<code id="filter">$.status == &#34;paid&#34; &amp;&amp; $.amount_cents &gt; 1000</code>`,
		`<span id="filtered-1h">10</span>`, `<span id="filtered-24h">10</span>`,
		`action="/endpoints/` + itoa(ep.ID) + `/filter-preview"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("endpoint page lacks %s", want)
		}
	}

	code, page = post("filter-preview", url.Values{"filter": {`$.amount_cents > 2500`}, "limit": {"20"}})
	if code != http.StatusOK || !strings.Contains(page, `<strong id="filter-preview-matched">5</strong> of the newest <span id="filter-preview-events">20</span>`) {
		t.Errorf("preview = %d, want 5 of the newest 20:\n%s", code, between(page, `<section id="filter-section">`, `</section>`))
	}
	if got := api.endpoint(ep.ID).Filter; got == nil || *got != paidFilter {
		t.Errorf("the preview changed the filter to %v", got)
	}
	code, page = post("filter-preview", url.Values{"filter": {`$.amount_cents >`}})
	if code != http.StatusOK || !strings.Contains(page, `id="filter-preview-refused"`) || !strings.Contains(page, "filter: syntax error") {
		t.Errorf("preview of a bad filter = %d, want its refusal shown:\n%s", code, between(page, `<section id="filter-section">`, `</section>`))
	}

	form := url.Values{"url": {"http://127.0.0.1:1/hook"}, "topics": {"order.*"}, "max_in_flight": {"16"}, "ordering": {"none"}}
	form.Set("filter", `$.a`)
	if code, page := post("edit", form); code != http.StatusBadRequest || !strings.Contains(page, "filter: not a predicate") {
		t.Errorf("edit with a bad filter = %d, want 400 saying why", code)
	}
	form.Set("filter", "")
	if code, _ := post("edit", form); code != http.StatusSeeOther {
		t.Errorf("edit without a filter = %d, want 303", code)
	}
	if got := api.endpoint(ep.ID).Filter; got != nil {
		t.Errorf("filter after an edit that emptied it: %q, want none", *got)
	}

	form.Set("filter", `$.region == "eu"`)
	resp, err := browser.PostForm(api.srv.URL+"/endpoints", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE filter = '$.region == "eu"'`) != 1 {
		t.Errorf("create with a filter = %d, want 200 and the endpoint stored with it", resp.StatusCode)
	}
	form.Set("filter", `$.region ==`)
	resp, err = browser.PostForm(api.srv.URL+"/endpoints", form)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "filter: syntax error") || !strings.Contains(string(b), `value="$.region ==`) {
		t.Errorf("create with a bad filter = %d, want 400 saying why with the form as typed", resp.StatusCode)
	}
}

// exponentialFilter applies keyvalue() to its own result 14 times, which
// makes 3^13 objects of each member of the payload: seconds and
// gigabytes for a payload of two members. The rules refuse it
// (filter_problem); a test stores it by SQL, around them.
var exponentialFilter = "exists($" + strings.Repeat(".keyvalue()", 14) + " ? (@ == 7))"

// storeFilterAroundTheRules gives endpoint id filter by SQL, with the
// rule that would refuse it dropped from this test's database: a filter
// stored before the rules, or by hand.
func storeFilterAroundTheRules(t *testing.T, db *sql.DB, id int64, filter string) {
	t.Helper()
	mustExec(t, db, `ALTER TABLE outbox.endpoints DROP CONSTRAINT IF EXISTS endpoints_filter_allowed`)
	mustExec(t, db, `UPDATE outbox.endpoints SET filter = $2 WHERE id = $1`, id, filter)
}

// A filter that fails the relay's pass (one raises an error silent does
// not cover, one runs far past the pass's timeout) costs its own endpoint
// its events, and no other endpoint anything: the pass is held for the
// timeout once, the failing filters are held with their error shown, the
// endpoint without a filter gets every event, none is poisoned, and the
// next pass neither evaluates the held filters nor times out. Writing the
// filter again lifts the hold.
func TestFilterThatFailsAPassCostsOnlyItsEndpoint(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	plain := createFilteredEndpoint(t, api, "http://127.0.0.1:1/plain", "", "order.*")
	slow := createFilteredEndpoint(t, api, "http://127.0.0.1:1/slow", "", "order.*")
	raising := createFilteredEndpoint(t, api, "http://127.0.0.1:1/raising", "", "order.*")
	storeFilterAroundTheRules(t, db, slow.ID, exponentialFilter)
	// A date compared with a time with a zone raises, silent or not.
	storeFilterAroundTheRules(t, db, raising.ID, `$.at.datetime() < "2026-01-01T00:00:00+00:00".datetime()`)

	first := []int64{
		recordPayload(t, db, "order.paid", "a", `{"status": "paid", "at": "2026-01-01"}`),
		recordPayload(t, db, "order.paid", "b", `{"status": "new", "at": "2026-01-02"}`),
	}
	cfg := defaultConfig().Relay
	cfg.PassTimeout = 2 * time.Second
	r := newTestRelay(t, db, cfg)
	res, err := r.relayOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(passResult{Claimed: 2, Fanned: 2, Jobs: 2}, res); diff != "" {
		t.Errorf("pass (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(first, jobEvents(t, db, plain.ID)); diff != "" {
		t.Errorf("the endpoint without a filter's jobs (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL OR relay_attempts > 0 OR poisoned_at IS NOT NULL`); n != 0 {
		t.Errorf("%d events not fanned out cleanly", n)
	}
	for _, tc := range []struct {
		ep   Endpoint
		want string
	}{
		{slow, "the filter ran longer than 1s"},
		{raising, "cannot convert value from date to timestamptz"},
	} {
		got := api.endpoint(tc.ep.ID)
		if got.FilterError == nil || got.FilterErrorAt == nil || !strings.Contains(*got.FilterError, tc.want) {
			t.Errorf("endpoint %s: filter_error %v at %v, want it held with an error containing %q", tc.ep.URL, got.FilterError, got.FilterErrorAt, tc.want)
		}
		if n := len(jobEvents(t, db, tc.ep.ID)); n != 0 {
			t.Errorf("endpoint %s: %d jobs, want none while its filter is held", tc.ep.URL, n)
		}
	}
	if n := r.filtersHeld.Load(); n != 2 {
		t.Errorf("%d filters held, want 2", n)
	}

	timeouts := r.passTimeouts.Load()
	second := recordPayload(t, db, "order.paid", "c", `{"status": "paid", "at": "2026-01-03"}`)
	if res, err := r.relayOnce(context.Background()); err != nil || res.Fanned != 1 || res.Jobs != 1 {
		t.Errorf("the next pass: %+v, %v; want the one event fanned out to the one endpoint", res, err)
	}
	if n := r.passTimeouts.Load(); n != timeouts {
		t.Errorf("the next pass timed out: the held filter was evaluated again")
	}
	if diff := cmp.Diff(append(first, second), jobEvents(t, db, plain.ID)); diff != "" {
		t.Errorf("the endpoint without a filter's jobs (-want +got):\n%s", diff)
	}

	var st DeliveryStats
	if code := apiCall(t, api.srv, "GET", "/api/endpoints/"+itoa(slow.ID)+"/stats", "", &st); code != http.StatusOK {
		t.Fatalf("stats = %d", code)
	}
	if st.FilterErrors != 3 || st.FilteredOut != 0 || st.Produced != 0 {
		t.Errorf("the held endpoint's stats: %d filter errors, %d filtered out, %d produced; want 3, 0, 0", st.FilterErrors, st.FilteredOut, st.Produced)
	}
	_, page := panelPage(t, api.srv, "/endpoints/"+itoa(raising.ID))
	if !strings.Contains(page, `id="filter-error"`) || !strings.Contains(page, "cannot convert value from date to timestamptz") {
		t.Errorf("the endpoint page does not show the held filter's error")
	}
	if status, body := api.do("POST", "/api/endpoints/"+itoa(raising.ID)+"/replay", `{"since": "2026-01-01T00:00:00Z", "dry_run": true}`); status != http.StatusBadRequest || !strings.Contains(errorOf(t, body), "held after an error") {
		t.Errorf("dry run of a replay while the filter is held = %d %s, want 400", status, body)
	}
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(raising.ID), `{"filter": "$.status == \"paid\""}`); status != http.StatusOK {
		t.Fatalf("PATCH filter = %d %s", status, body)
	}
	if got := api.endpoint(raising.ID); got.FilterError != nil || got.FilterErrorAt != nil {
		t.Errorf("a filter written again is still held: %v", *got.FilterError)
	}
}

// docsFilterExamples is every filter of docs/filters.md's table of
// examples, as written there (the table escapes |).
func docsFilterExamples(t *testing.T) []string {
	t.Helper()
	doc := readDoc(t, "docs/filters.md")
	_, section, ok := strings.Cut(doc, "\n## Examples\n")
	if !ok {
		t.Fatal("docs/filters.md has no Examples section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `(.+?)` \\|")
	var examples []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		examples = append(examples, strings.ReplaceAll(m[1], `\|`, "|"))
	}
	if len(examples) < 10 {
		t.Fatalf("found %d examples in docs/filters.md, want its whole table", len(examples))
	}
	return examples
}

// The rules that bound a filter's cost refuse what would grow faster than
// the payload, each answering 400 with the rule's reason, by POST and
// PATCH alike, and refuse it to a direct SQL write too; every example
// docs/filters.md gives, and what stays linear (chained wildcards, one
// keyvalue(), arithmetic between paths), is accepted.
func TestFilterRulesBoundItsCost(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := createFilteredEndpoint(t, api, "http://127.0.0.1:1/hook", paidFilter, "order.*")
	path := "/api/endpoints/" + itoa(ep.ID)

	keyvalues := func(n int) string {
		return "exists($" + strings.Repeat(".keyvalue()", n) + " ? (@ == 7))"
	}
	for _, tc := range []struct{ filter, want string }{
		{exponentialFilter, "filter: keyvalue() may appear once"},
		{keyvalues(12), "filter: keyvalue() may appear once"},
		{keyvalues(2), "filter: keyvalue() may appear once"},
		{`exists($.keyvalue() ? (@.value.keyvalue().size() > 1))`, "filter: keyvalue() may appear once"},
		{`$.** == 1`, "filter: .** (any level) is not allowed"},
		{`exists($.a.**{2 to last} ? (@ == 1))`, "filter: .** (any level) is not allowed"},
		{`$.a[0,0][0,0] == 1`, "filter: a subscript is [*], a number"},
		{`$.a[$.i] == 1`, "filter: a subscript is [*], a number"},
		{`$.a == $.b`, "filter: a comparison of two paths"},
		{`$.items[*].price < $.limits[*]`, "filter: a comparison of two paths"},
		{`$.a == -$.b && $.c == 1`, "filter: a comparison of two paths"},
		{`exists($.items[*] ? (@.a == @.b))`, "filter: a comparison of two paths"},
		{`exists($.items[*] ? (@.sku == $.wanted))`, "filter: $ inside a filter expression"},
		{`exists($.a ? (exists(@.b ? (@ == $.c))))`, "filter: $ inside a filter expression"},
		{`$.a like_regex "^(a*)\\1$"`, "filter: a like_regex pattern may not use backreferences"},
		{`$.a like_regex "a(?=b)"`, "filter: a like_regex pattern may not use lookahead or lookbehind"},
		{`$.a like_regex "(?<!b)a"`, "filter: a like_regex pattern may not use lookahead or lookbehind"},
		{strings.Repeat(`$.a like_regex "x" || `, 8) + `$.a like_regex "y"`, "filter: like_regex may appear at most 8 times"},
	} {
		b, _ := json.Marshal(map[string]any{"url": "http://127.0.0.1:1/bad", "filter": tc.filter})
		for _, req := range []struct{ method, path string }{{"POST", "/api/endpoints"}, {"PATCH", path}} {
			status, body := api.do(req.method, req.path, string(b))
			if msg := errorOf(t, body); status != http.StatusBadRequest || !strings.HasPrefix(msg, tc.want) {
				t.Errorf("%s %s filter %q = %d %q, want 400 starting %q", req.method, req.path, tc.filter, status, msg, tc.want)
			}
		}
		if _, err := db.Exec(`UPDATE outbox.endpoints SET filter = $1`, tc.filter); err == nil || !strings.Contains(err.Error(), "endpoints_filter_allowed") {
			t.Errorf("filter %q written by SQL: %v, want endpoints_filter_allowed to refuse it", tc.filter, err)
		}
	}

	accepted := append(docsFilterExamples(t),
		// Each step of a path goes one level down the payload, so a path
		// meets each value at most once however many wildcards it chains.
		`$.*.*.* == 1`,
		`$[*][*][*] == 1`,
		`exists($.items[*] ? (@.sku == "A" && @.qty > 2))`,
		`exists($.tags.keyvalue() ? (@.key starts with "x"))`,
		`$.a[last - 1] == 1 && $.a[1 to last] == 2`,
		`$.total == $.net + $.tax`,
		`$.a like_regex "\\\\1"`, // a backslash, then 1: no backreference
		`$."$weird" == "@" && $."[0,0]" == "$.a == $.b"`,
	)
	for _, filter := range accepted {
		b, _ := json.Marshal(map[string]any{"filter": filter})
		if status, body := api.do("PATCH", path, string(b)); status != http.StatusOK {
			t.Errorf("PATCH filter %q = %d %s, want it accepted", filter, status, body)
		}
	}
}

// A database whose endpoint stored a filter that the rules now refuse,
// under the constraint of before, gets it held by the migration, which
// names the rule; every other write of the row goes through, and the
// fan-out leaves the filter unevaluated.
func TestMigrationHoldsFiltersTheRulesRefuse(t *testing.T) {
	t.Parallel()
	db := migratedThrough(t, newMigration(nil), 5) // a database of 0.5.0
	var ep Endpoint
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, topics)
		VALUES ('http://127.0.0.1:1/old', decode(repeat('ab', 32), 'hex'), '{order.*}') RETURNING id`).Scan(&ep.ID); err != nil {
		t.Fatal(err)
	}
	storeFilterAroundTheRules(t, db, ep.ID, exponentialFilter)
	mustExec(t, db, `ALTER TABLE outbox.endpoints ADD CONSTRAINT endpoints_filter_allowed
		CHECK (outbox.filter_problem(filter_path) IS NULL) NOT VALID`)
	if err := migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	api := newTestAPI(t, db, testPolicy)
	got := api.endpoint(ep.ID)
	if got.FilterError == nil || !strings.Contains(*got.FilterError, "keyvalue() may appear once") {
		t.Fatalf("filter_error %v, want the filter held naming its rule", got.FilterError)
	}
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"description": "kept"}`); status != http.StatusOK {
		t.Errorf("PATCH description = %d %s, want the row writable", status, body)
	}
	recordPayload(t, db, "order.paid", "a", `{"status": "paid", "amount_cents": 1500}`)
	relayAll(t, db)
	if n := queryInt(t, db, `SELECT filter_errors FROM outbox.fanout_stats WHERE endpoint_id = $1`, ep.ID); n != 1 {
		t.Errorf("%d filter errors counted, want the one event", n)
	}
}

// A preview runs under a statement timeout in its own transaction: a
// filter within the rules that is too slow over the events at hand (here
// products of 131,000-digit numbers, a tenth of a second or more each)
// answers 400 saying so, on both routes, and a cheap one over the same
// events still answers.
func TestCostlyFilterPreviewAnswers400(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	a := testAdmin(t, db, testPolicy, testLogger(t), nil)
	a.previewTimeout = 100 * time.Millisecond
	api := &testAPI{t: t, srv: httptest.NewServer(routes(a))}
	t.Cleanup(api.srv.Close)
	ep := createFilteredEndpoint(t, api, "http://127.0.0.1:1/hook", "", "big.*")
	mustExec(t, db, `SELECT outbox.record('big.numbers', 's' || i,
		jsonb_build_object('a', repeat('7', 131000)::numeric, 'b', repeat('3', 131000)::numeric))
		FROM generate_series(1, 20) AS i`)

	costly := `$.a * $.b > 0`
	for _, tc := range []struct{ path, body string }{
		{"/api/endpoints/filter-preview", `{"topics": ["big.*"], "filter": "` + costly + `"}`},
		{"/api/endpoints/" + itoa(ep.ID) + "/filter-preview", `{"filter": "` + costly + `"}`},
	} {
		status, body := api.do("POST", tc.path, tc.body)
		if msg := errorOf(t, body); status != http.StatusBadRequest || !strings.Contains(msg, "filter: too costly to preview") {
			t.Errorf("POST %s %s = %d %q, want 400 saying it is too costly to preview", tc.path, tc.body, status, msg)
		}
	}
	var pv FilterPreview
	if code := apiCall(t, api.srv, "POST", "/api/endpoints/filter-preview", `{"topics": ["big.*"], "filter": "$.a > 0"}`, &pv); code != http.StatusOK || pv.Events != 20 || pv.Matched != 20 {
		t.Errorf("a cheap filter's preview = %d %+v, want 20 of 20", code, pv)
	}
}
