// panel_isolation_test.go: the panel's side of endpoint isolation (issue
// 16): an endpoint's page and the list show its lane (cap, in flight, rate
// limit, breaker, hold, pause), its Pause and Resume buttons work, and its
// forms set the delivery settings or say why they cannot.

package main

import (
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// postPanelForm posts a panel form as the signed-in browser does and
// returns the status, the page and where a redirect leads.
func postPanelForm(t *testing.T, browser *http.Client, srv *httptest.Server, path string, form url.Values) (int, string, string) {
	t.Helper()
	resp, err := browser.PostForm(srv.URL+path, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(page), resp.Header.Get("Location")
}

// nullableFloat reads a nullable numeric column as text: "" for NULL.
func nullableFloat(t *testing.T, db *sql.DB, query string, args ...any) string {
	t.Helper()
	var v sql.NullString
	if err := db.QueryRow(query, args...).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v.String
}

// mustContain fails the test for each want the page lacks.
func mustContain(t *testing.T, what, page string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(page, want) {
			t.Errorf("%s lacks %q:\n%s", what, want, page)
		}
	}
}

// mustLack fails the test for each unwanted string the page holds.
func mustLack(t *testing.T, what, page string, unwanted ...string) {
	t.Helper()
	for _, u := range unwanted {
		if strings.Contains(page, u) {
			t.Errorf("%s holds %q:\n%s", what, u, page)
		}
	}
}

// The endpoint page shows the lane as the row and the job table hold it:
// the cap with what runs now, the rate limit, the breaker, and the hold a
// receiver's Retry-After set; an endpoint with none of them says so.
func TestPanelEndpointShowsItsLane(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	troubled := api.createEndpoint("https://a.example/hook")
	calm := api.createEndpoint("https://b.example/hook")
	mustExec(t, db, `UPDATE outbox.endpoints
		SET rate_limit_per_second = 2.5, consecutive_failures = 7, breaker_opened_at = now(),
		    held_until = now() + interval '10 minutes'
		WHERE id = $1`, troubled.ID)
	mustExec(t, db, `INSERT INTO outbox.events (topic, fanned_out_at) SELECT 't', now() FROM generate_series(1, 3)`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at)
		SELECT 'webhook', id, $1, 18, 'running', 1, now() FROM outbox.events`, troubled.ID)

	status, page := panelPage(t, api.srv, "/endpoints/"+itoa(troubled.ID))
	if status != http.StatusOK {
		t.Fatalf("GET /endpoints/%d: %d\n%s", troubled.ID, status, page)
	}
	mustContain(t, "the troubled endpoint's page", page,
		`<dd id="in-flight">3 of 16 in flight</dd>`, // 16: defaultMaxInFlight
		`<dd id="rate-limit">2.5 requests a second</dd>`,
		`id="breaker" class="breaker-open">open since <time`,
		`one attempt at a time; 7 failed in a row</dd>`,
		`<dt>held until</dt><dd id="held-until"><time`,
		`<dd id="paused-at">—</dd>`,
		`<button id="pause">Pause</button>`,
		`name="max_in_flight" type="number" min="1" max="1000" step="1" value="16"`,
		`name="rate_limit_per_second" type="number" min="0.01" max="10000" step="any" value="2.5"`)
	mustLack(t, "the troubled endpoint's page", page, `id="resume"`)

	_, page = panelPage(t, api.srv, "/endpoints/"+itoa(calm.ID))
	mustContain(t, "the calm endpoint's page", page,
		`<dd id="in-flight">0 of 16 in flight</dd>`,
		`<dd id="rate-limit">none</dd>`,
		`<dd id="breaker" class="breaker-closed">closed; 0 failed in a row</dd>`,
		`name="rate_limit_per_second" type="number" min="0.01" max="10000" step="any" value=""`)
	mustLack(t, "the calm endpoint's page", page, `id="held-until"`)

	// A hold that has passed is no hold.
	mustExec(t, db, `UPDATE outbox.endpoints SET held_until = now() - interval '1 second' WHERE id = $1`, troubled.ID)
	_, page = panelPage(t, api.srv, "/endpoints/"+itoa(troubled.ID))
	mustLack(t, "the page after the hold passed", page, `id="held-until"`)

	_, list := panelPage(t, api.srv, "/endpoints")
	mustContain(t, "the endpoint list", list,
		`<td class="in-flight">3 of 16</td>`,
		`<td class="in-flight">0 of 16</td>`,
		`<span class="breaker-open">breaker open</span>`)
	if n := strings.Count(list, "breaker open"); n != 1 {
		t.Errorf("the list marks %d breakers open, want 1 (the troubled endpoint's)", n)
	}
}

// Pause holds the endpoint (its row's paused_at set, the page offering
// Resume, the list showing it paused); Resume lets it flow again. Both are
// forms like Enable and Disable, and a cross-origin post is refused as
// theirs are.
func TestPanelPauseAndResume(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := api.createEndpoint("https://a.example/hook")
	browser := signIn(t, api.srv)
	pagePath := "/endpoints/" + itoa(ep.ID)
	paused := func() int {
		return queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE id = $1 AND paused_at IS NOT NULL`, ep.ID)
	}

	req, _ := http.NewRequest("POST", api.srv.URL+pagePath+"/pause", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := browser.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || paused() != 0 {
		t.Errorf("cross-site pause: %d, paused %d; want 403 and not paused", resp.StatusCode, paused())
	}

	status, _, location := postPanelForm(t, browser, api.srv, pagePath+"/pause", nil)
	if status != http.StatusSeeOther || !strings.HasPrefix(location, pagePath+"?done=Paused") {
		t.Fatalf("pause: %d to %q, want 303 to the endpoint's page saying Paused", status, location)
	}
	if paused() != 1 {
		t.Fatal("clicking Pause left paused_at unset")
	}
	_, page := panelPage(t, api.srv, location)
	mustContain(t, "the paused endpoint's page", page,
		`<p class="flash">Paused:`,
		`<dd id="state" class="endpoint-paused">paused</dd>`,
		`<dd id="paused-at"><time`,
		`<button id="resume">Resume</button>`)
	mustLack(t, "the paused endpoint's page", page, `id="pause"`)
	_, list := panelPage(t, api.srv, "/endpoints")
	mustContain(t, "the list with a paused endpoint", list, `<td class="endpoint-paused">paused</td>`)

	status, _, location = postPanelForm(t, browser, api.srv, pagePath+"/resume", nil)
	if status != http.StatusSeeOther || !strings.HasPrefix(location, pagePath+"?done=Resumed") {
		t.Fatalf("resume: %d to %q, want 303 to the endpoint's page saying Resumed", status, location)
	}
	if paused() != 0 {
		t.Fatal("clicking Resume left paused_at set")
	}
	_, page = panelPage(t, api.srv, pagePath)
	mustContain(t, "the resumed endpoint's page", page,
		`<dd id="state" class="endpoint-enabled">enabled</dd>`,
		`<dd id="paused-at">—</dd>`,
		`<button id="pause">Pause</button>`)
	mustLack(t, "the resumed endpoint's page", page, `id="resume"`)
}

// The create and edit forms set max_in_flight and rate_limit_per_second:
// left empty on create, the default cap and no limit; emptied on edit, the
// limit goes.
func TestPanelEndpointFormsSetDeliverySettings(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	browser := signIn(t, srv)
	settings := func(id int64) (int, string) {
		t.Helper()
		return queryInt(t, db, `SELECT max_in_flight FROM outbox.endpoints WHERE id = $1`, id),
			nullableFloat(t, db, `SELECT rate_limit_per_second::text FROM outbox.endpoints WHERE id = $1`, id)
	}

	status, page, _ := postPanelForm(t, browser, srv, "/endpoints", url.Values{
		"url": {"https://a.example/hook"}, "max_in_flight": {"4"}, "rate_limit_per_second": {"2.5"}})
	if status != http.StatusOK || !strings.Contains(page, `id="secret">whsec_`) {
		t.Fatalf("create with settings: %d\n%s", status, page)
	}
	id := int64(queryInt(t, db, `SELECT max(id) FROM outbox.endpoints`))
	if cap, rate := settings(id); cap != 4 || rate != "2.5" {
		t.Errorf("created with max_in_flight 4 and 2.5/s: the row holds %d and %q", cap, rate)
	}
	mustContain(t, "the created endpoint's page", page, `<dd id="in-flight">0 of 4 in flight</dd>`, `<dd id="rate-limit">2.5 requests a second</dd>`)

	postPanelForm(t, browser, srv, "/endpoints", url.Values{
		"url": {"https://b.example/hook"}, "max_in_flight": {""}, "rate_limit_per_second": {""}})
	plain := int64(queryInt(t, db, `SELECT max(id) FROM outbox.endpoints`))
	if cap, rate := settings(plain); plain == id || cap != 16 || rate != "" {
		t.Errorf("created with both fields empty: endpoint %d holds %d and %q, want a new one with 16 and no limit", plain, cap, rate)
	}

	edit := "/endpoints/" + itoa(id) + "/edit"
	status, _, location := postPanelForm(t, browser, srv, edit, url.Values{
		"url": {"https://a.example/hook"}, "max_in_flight": {"1000"}, "rate_limit_per_second": {""}})
	if status != http.StatusSeeOther || !strings.Contains(location, "done=Saved") {
		t.Fatalf("edit: %d to %q, want 303 saying Saved", status, location)
	}
	if cap, rate := settings(id); cap != 1000 || rate != "" {
		t.Errorf("edited to 1000 with the limit emptied: the row holds %d and %q", cap, rate)
	}
	postPanelForm(t, browser, srv, edit, url.Values{
		"url": {"https://a.example/hook"}, "max_in_flight": {"1"}, "rate_limit_per_second": {"0.01"}})
	if cap, rate := settings(id); cap != 1 || rate != "0.01" {
		t.Errorf("edited to 1 at 0.01/s: the row holds %d and %q", cap, rate)
	}
}

// A form with a setting out of bounds is shown again as typed, with
// validate's message and a 400, and changes nothing; the server logs no
// error for it.
func TestPanelEndpointFormsRefuseBadSettings(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv, logs := newLoggingTestServer(t, db)
	browser := signIn(t, srv)
	id := createTestEndpoint(t, srv, "https://a.example/hook")
	mustExec(t, db, `UPDATE outbox.endpoints SET max_in_flight = 7, rate_limit_per_second = 3 WHERE id = $1`, id)
	before := func() string {
		return nullableFloat(t, db, `SELECT concat_ws(' ', url, max_in_flight, rate_limit_per_second, updated_at)
			FROM outbox.endpoints WHERE id = $1`, id)
	}
	row := before()
	formError := regexp.MustCompile(`<span class="error" id="form-error">([^<]*)</span>`)

	for _, tc := range []struct {
		name, maxInFlight, rate, message string
	}{
		{"no cap", "0", "", "max_in_flight must be between 1 and 1000, got 0"},
		{"a cap above 1000", "1001", "", "max_in_flight must be between 1 and 1000, got 1001"},
		{"a cap that is no number", "lots", "", "max_in_flight must be a whole number between 1 and 1000, got &#34;lots&#34;"},
		{"a rate of 0", "5", "0", "rate_limit_per_second must be between 0.01 and 10000 requests a second, or null for none, got 0"},
		{"a rate that is no number", "5", "fast", "rate_limit_per_second must be a number of requests a second, or empty for none, got &#34;fast&#34;"},
	} {
		form := url.Values{"url": {"https://typed.example/hook"}, "topics": {"order.*"},
			"max_in_flight": {tc.maxInFlight}, "rate_limit_per_second": {tc.rate}}
		for _, path := range []string{"/endpoints", "/endpoints/" + itoa(id) + "/edit"} {
			status, page, _ := postPanelForm(t, browser, srv, path, form)
			if status != http.StatusBadRequest {
				t.Errorf("%s to %s: %d, want 400\n%s", tc.name, path, status, page)
				continue
			}
			if m := formError.FindStringSubmatch(page); m == nil || m[1] != tc.message {
				t.Errorf("%s to %s: the form says %q, want %q", tc.name, path, m, tc.message)
			}
			mustContain(t, tc.name+" to "+path, page,
				`name="url" type="url" value="https://typed.example/hook"`,
				`name="topics" value="order.*"`,
				`value="`+tc.maxInFlight+`"`)
			mustLack(t, tc.name+" to "+path, page, "<title>Error · outboxd</title>", `id="secret"`)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 1 {
		t.Errorf("%d endpoints after refused forms, want the 1 made before", n)
	}
	if after := before(); after != row {
		t.Errorf("refused edits changed the endpoint: %q, was %q", after, row)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("refused forms logged as the server's errors:\n%s", logs.String())
	}
}
