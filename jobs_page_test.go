package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// The jobs page's state links carry their counts and mark the current
// one; a job's timestamps are one short line, the absolute time on hover,
// so that a screen holds more than a dozen rows.
func TestJobsPageStateLinksCountAndTimesDoNotWrap(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := api.createEndpoint("https://a.example/hook", "order.*")
	mustExec(t, db, `SELECT outbox.record('order.paid', 'order-' || i, '{}') FROM generate_series(1, 3) AS i`)
	relay := newTestRelay(t, db, defaultConfig().Relay)
	if res, err := relay.relayOnce(context.Background()); err != nil || res.Jobs != 3 {
		t.Fatalf("relay pass: %+v, %v; want 3 jobs", res, err)
	}
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'discarded', attempt = 1, attempted_at = now(), finalized_at = now(),
  errors = jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', 'webhook: answered 500 Internal Server Error'))
WHERE id = (SELECT min(id) FROM outbox.jobs WHERE endpoint_id = $1)`, ep.ID)

	status, page := panelPage(t, api.srv, "/jobs?state=discarded")
	if status != http.StatusOK {
		t.Fatalf("GET /jobs?state=discarded: %d\n%s", status, page)
	}
	links := regexp.MustCompile(`(?s)<p class="states">.*?</p>`).FindString(page)
	for _, want := range []string{
		`<a href="/jobs?state=">all <span class="count">3</span></a>`,
		`<a href="/jobs?state=available">available <span class="count">2</span></a>`,
		`<a href="/jobs?state=running">running <span class="count">0</span></a>`,
		`<a href="/jobs?state=discarded" class="current" aria-current="page">discarded <span class="count">1</span></a>`,
	} {
		if !strings.Contains(links, want) {
			t.Errorf("state links lack %s:\n%s", want, links)
		}
	}
	if strings.Count(links, `class="current"`) != 1 {
		t.Errorf("state links mark %d as current, want 1:\n%s", strings.Count(links, `class="current"`), links)
	}
	// The error's time: relative, with the absolute time only in its title.
	errTime := regexp.MustCompile(`<div class="err">#1 <time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">[^<]+</time>: webhook: answered 500`)
	if !errTime.MatchString(page) {
		t.Errorf("the discarded job's error time is not a short time with the absolute one in its title:\n%s", page)
	}
	resp, err := http.Get(api.srv.URL + "/static/style.css")
	if err != nil {
		t.Fatal(err)
	}
	css, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^[^{]*\btime\b[^{]*\{[^}]*white-space: nowrap`).Match(css) {
		t.Errorf("style.css does not keep a time on one line:\n%s", css)
	}
}

// The discarded jobs are listed by endpoint and error: the endpoint's
// name, the error once, how many, when first and last; one button a group
// sends that group again and nothing else, and the API groups and
// retries the same way.
func TestDiscardedJobsGroupedByEndpointAndError(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	a := api.createEndpoint("https://a.example/hook", "order.*")
	b := api.createEndpoint("https://b.example/hook", "order.*")
	mustExec(t, db, `UPDATE outbox.endpoints SET description = 'Orders service' WHERE id = $1`, a.ID)
	mustExec(t, db, `SELECT outbox.record('order.paid', 'order-' || i, '{}') FROM generate_series(1, 4) AS i`)
	relayAll(t, db)
	const down = `webhook: answered 500 Internal Server Error: "{\"error\":\"database down\"}"`
	const refused = `webhook: Post "https://a.example/hook": dial tcp 10.0.0.1:443: connect: connection refused`
	discard := func(endpointID int64, limit int, errText string) {
		t.Helper()
		mustExec(t, db, `UPDATE outbox.jobs SET state = 'discarded', attempt = 2, attempted_at = now(), finalized_at = now(),
  errors = jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', 'an earlier error'),
                             jsonb_build_object('attempt', 2, 'at', now(), 'error', $3::text))
WHERE id IN (SELECT id FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'available' ORDER BY id LIMIT $2)`, endpointID, limit, errText)
	}
	discard(a.ID, 3, down)
	discard(a.ID, 1, refused)
	discard(b.ID, 2, down)

	_, page := panelPage(t, api.srv, "/jobs?state=discarded")
	groups := regexp.MustCompile(`(?s)<table id="discarded-groups">.*?</table>`).FindString(page)
	if n := strings.Count(groups, `<tr class="discarded-group">`); n != 3 {
		t.Fatalf("%d groups of discarded jobs, want 3 (a's two errors, b's one):\n%s", n, page)
	}
	for _, want := range []string{
		`<a href="/endpoints/` + itoa(a.ID) + `">Orders service</a>`,
		`<a href="/endpoints/` + itoa(b.ID) + `">https://b.example/hook</a>`,
		`<td class="count">3</td>`, `<td class="count">2</td>`, `<td class="count">1</td>`,
		`&#34;error&#34;: &#34;database down&#34;`,
		`<button>Send these 3 again</button>`,
	} {
		if !strings.Contains(groups, want) {
			t.Errorf("the discarded groups lack %s:\n%s", want, groups)
		}
	}
	// Each error once a group: a's refused connection, whose URL would
	// otherwise repeat on every row, shows once (and once more in its
	// button's hidden field).
	if n := strings.Count(groups, "connection refused</span>"); n != 1 {
		t.Errorf("the refused connection's error shows %d times in the groups, want once", n)
	}
	if strings.Contains(groups, "an earlier error") {
		t.Error("the groups show an earlier attempt's error, want the last one's")
	}

	resp, err := signIn(t, api.srv).PostForm(api.srv.URL+"/jobs/retry-discarded",
		url.Values{"endpoint_id": {itoa(a.ID)}, "error": {down}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the group's retry answered %d, want 303", resp.StatusCode)
	}
	state := func(endpointID int64, errText string) string {
		t.Helper()
		var s string
		if err := db.QueryRow(`SELECT string_agg(DISTINCT state::text, ',') FROM outbox.jobs
WHERE endpoint_id = $1 AND errors -> -1 ->> 'error' = $2`, endpointID, errText).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got := state(a.ID, down); got != "available" {
		t.Errorf("a's deliveries that failed with the 500 are %s after their group's retry, want available", got)
	}
	if got := state(a.ID, refused); got != "discarded" {
		t.Errorf("a's refused delivery is %s after the other group's retry, want discarded", got)
	}
	if got := state(b.ID, down); got != "discarded" {
		t.Errorf("b's deliveries are %s after a's group's retry, want discarded", got)
	}

	// The API: the groups left, and a retry of one of them.
	var listed struct{ Groups []DiscardedGroup }
	if code := apiCall(t, api.srv, "GET", "/api/jobs/discarded", "", &listed); code != http.StatusOK || len(listed.Groups) != 2 {
		t.Fatalf("GET /api/jobs/discarded: %d, %+v; want the 2 groups left", code, listed)
	}
	body, _ := json.Marshal(map[string]any{"endpoint_id": b.ID, "error": down})
	var res BulkRetryResult
	if code := apiCall(t, api.srv, "POST", "/api/jobs/retry-discarded", string(body), &res); code != http.StatusOK || res.Jobs != 2 {
		t.Fatalf("POST /api/jobs/retry-discarded for b's group: %d, %+v; want its 2 jobs", code, res)
	}
	if got := state(b.ID, down); got != "available" {
		t.Errorf("b's deliveries are %s after their group's retry, want available", got)
	}
	if got := state(a.ID, refused); got != "discarded" {
		t.Errorf("a's refused delivery is %s after b's group's retry, want discarded", got)
	}
	var refusal map[string]string
	if code := apiCall(t, api.srv, "POST", "/api/jobs/retry-discarded", `{"endpoint_id": 1, "without_endpoint": true}`, &refusal); code != http.StatusBadRequest ||
		!strings.Contains(refusal["error"], "without_endpoint") {
		t.Errorf("a filter of an endpoint and of none answered %d %v, want 400 naming without_endpoint", code, refusal)
	}

	// Past the newest 10,000 discarded jobs the groups are of those, and
	// say so; their buttons still send every one.
	if maxDiscardedGrouped != 10_000 || maxDiscardedGroups != 100 {
		t.Fatalf("grouping bounds %d jobs, %d groups; want 10000 and 100", maxDiscardedGrouped, maxDiscardedGroups)
	}
	mustExec(t, db, `WITH e AS (INSERT INTO outbox.events (topic, subject, fanned_out_at)
                              SELECT 'order.paid', 'bulk-' || i, now() FROM generate_series(1, 10000) AS i RETURNING id)
INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at, errors)
SELECT 'webhook', e.id, $1, 18, 'discarded', 1, now(), now(),
       jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', $2::text))
FROM e`, b.ID, down)
	_, page = panelPage(t, api.srv, "/jobs?state=discarded")
	if !strings.Contains(page, `<p id="discarded-partial">Grouped from the newest 10000 discarded jobs`) || !strings.Contains(page, "<button>Send them again</button>") {
		t.Errorf("10,001 discarded jobs grouped without saying the groups are of the newest 10000:\n%s", between(page, "<h2>Discarded", "</table>"))
	}
}

// A job waiting behind its endpoint's open circuit breaker says so beside
// its time, which fan-out put -failing-endpoint-delay out; a job of an
// endpoint whose breaker is closed says nothing of one. The endpoint
// filter says it takes an endpoint's id.
func TestJobsPageSaysWhenABreakerHoldsAJob(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	held := api.createEndpoint("https://held.example/hook", "order.*")
	free := api.createEndpoint("https://free.example/hook", "order.*")
	mustExec(t, db, `UPDATE outbox.endpoints SET breaker_opened_at = now() - interval '3 minutes', consecutive_failures = 5, failing_since = now() - interval '10 minutes' WHERE id = $1`, held.ID)
	mustExec(t, db, `SELECT outbox.record('order.paid', 'order-1', '{}')`)
	relayAll(t, db)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND scheduled_at > now() + interval '4 minutes'`, held.ID); n != 1 {
		t.Fatalf("%d of the held endpoint's jobs scheduled minutes out, want its one", n)
	}

	status, page := panelPage(t, api.srv, "/jobs")
	if status != http.StatusOK {
		t.Fatalf("GET /jobs: %d\n%s", status, page)
	}
	rowOf := func(endpointID int64) string {
		for _, row := range regexp.MustCompile(`(?s)<tr>.*?</tr>`).FindAllString(page, -1) {
			if strings.Contains(row, `<a href="/endpoints/`+itoa(endpointID)+`">`) {
				return row
			}
		}
		t.Fatalf("no job row of endpoint %d in\n%s", endpointID, page)
		return ""
	}
	const note = `held by its endpoint's circuit breaker, open since 3m ago: one attempt at a time`
	if got := rowOf(held.ID); !strings.Contains(got, note) || !strings.Contains(got, `<td>0/`) {
		t.Errorf("the held job's row lacks %q:\n%s", note, got)
	}
	if got := rowOf(free.ID); strings.Contains(got, "breaker") {
		t.Errorf("a job of a closed breaker's endpoint mentions one:\n%s", got)
	}
	filter := regexp.MustCompile(`(?s)<form method="get" action="/jobs" class="filter" id="jobs-filter">.*?</form>`).FindString(page)
	if !strings.Contains(filter, `<label>Endpoint id <input name="endpoint_id"`) || !strings.Contains(filter, "the number after # on the Endpoints page") {
		t.Errorf("the endpoint filter does not say it takes an endpoint's id:\n%s", filter)
	}
}
