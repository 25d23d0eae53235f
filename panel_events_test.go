package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The events list says where an event went in coloured badges, each with
// why and the endpoints it names: "delivered 3", "2 retrying, breaker
// open", "1 endpoint disabled"; and the jobs list names endpoints, not
// ids, each a link to its page.
func TestEventBadgesSayWhyAndNameEndpoints(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var eps []int64
	for _, host := range []string{"a", "b", "c", "d", "e", "f"} {
		eps = append(eps, api.createEndpoint("https://"+host+".example/hook").ID)
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET description = 'Orders service' WHERE id = $1`, eps[0])
	ev := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', attempt = 1, attempted_at = now(), finalized_at = now()
WHERE endpoint_id = ANY($1::bigint[])`, fmt.Sprintf("{%d,%d,%d}", eps[0], eps[1], eps[2]))
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'retryable', attempt = 5, attempted_at = now(), scheduled_at = now() + interval '5 minutes'
WHERE endpoint_id = ANY($1::bigint[])`, fmt.Sprintf("{%d,%d}", eps[3], eps[4]))
	mustExec(t, db, `UPDATE outbox.endpoints SET consecutive_failures = 5, breaker_opened_at = now(), failing_since = now()
WHERE id = ANY($1::bigint[])`, fmt.Sprintf("{%d,%d}", eps[3], eps[4]))
	mustExec(t, db, `UPDATE outbox.endpoints SET disabled_at = now(), disabled_reason = 'by hand' WHERE id = $1`, eps[5])

	_, page := panelPage(t, api.srv, "/events")
	row := regexp.MustCompile(fmt.Sprintf(`(?s)<a href="/events/%d">.*?</tr>`, ev)).FindString(page)
	outcome := regexp.MustCompile(`(?s)<td class="outcome">.*?</td>`).FindString(row)
	want := fmt.Sprintf(`<td class="outcome"><div><span class="badge badge-ok">delivered 3</span> `+
		`<a href="/endpoints/%d">Orders service</a>, <a href="/endpoints/%d">https://b.example/hook</a>, <a href="/endpoints/%d">https://c.example/hook</a></div>`+
		`<div><span class="badge badge-bad">1 endpoint disabled</span> <a href="/endpoints/%d">https://f.example/hook</a></div>`+
		`<div><span class="badge badge-warn">2 retrying, breaker open</span> <a href="/endpoints/%d">https://d.example/hook</a>, <a href="/endpoints/%d">https://e.example/hook</a></div></td>`,
		eps[0], eps[1], eps[2], eps[5], eps[3], eps[4])
	if outcome != want {
		t.Errorf("the event's outcome reads\n%s\nwant\n%s", outcome, want)
	}

	_, jobs := panelPage(t, api.srv, "/jobs")
	if cell := fmt.Sprintf(`<td><a href="/endpoints/%d">Orders service</a></td>`, eps[0]); !strings.Contains(jobs, cell) {
		t.Errorf("the jobs list does not name endpoint %d by its description in a link to its page (%s):\n%s", eps[0], cell, jobs)
	}
	if cell := fmt.Sprintf(`<td><a href="/endpoints/%d">https://b.example/hook</a></td>`, eps[1]); !strings.Contains(jobs, cell) {
		t.Errorf("the jobs list does not name an endpoint without a description by its URL (%s)", cell)
	}
	_, filtered := panelPage(t, api.srv, fmt.Sprintf("/jobs?endpoint_id=%d", eps[0]))
	if h1 := regexp.MustCompile(`<h1>.*?</h1>`).FindString(filtered); !strings.Contains(h1, ">Orders service</a>") {
		t.Errorf("the filtered jobs list's heading %s does not name the endpoint", h1)
	}
}

// Every time field of the panel is the same UTC, 24-hour text field
// ("2026-01-01 02:00"): the events filter reads it without RFC 3339, the
// endpoint's replay form has no 12-hour picker, and a time that does not
// read answers a 400 page naming its field.
func TestPanelTimeFieldsAreUTC24Hour(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := api.createEndpoint("https://a.example/hook")
	var ids []int64
	for h := range 4 {
		var id int64
		if err := db.QueryRow(`INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at)
VALUES ('order.paid', $1, timestamptz '2026-01-01 00:00:00Z' + $2 * interval '1 hour', now()) RETURNING id`, fmt.Sprint(h), h).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}

	status, page := panelPage(t, api.srv, "/events?topic=order.paid&since=2026-01-01+01:00&until=2026-01-01T03:00")
	if status != 200 {
		t.Fatalf("GET /events with typed times: %d\n%s", status, page)
	}
	var listed []string
	for _, m := range regexp.MustCompile(`<td><a href="/events/(\d+)">`).FindAllStringSubmatch(page, -1) {
		listed = append(listed, m[1])
	}
	if want := []string{itoa(ids[2]), itoa(ids[1])}; strings.Join(listed, ",") != strings.Join(want, ",") {
		t.Errorf("events from 01:00 until 03:00 listed %v, want %v", listed, want)
	}
	field := func(name, value string) string {
		return `<input name="` + name + `" value="` + value + `" pattern="\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2})?" placeholder="YYYY-MM-DD HH:MM"`
	}
	for _, want := range []string{field("since", "2026-01-01 01:00"), field("until", "2026-01-01 03:00"), "Since <small>(UTC)</small>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the events filter lacks %s", want)
		}
	}

	_, endpointPage := panelPage(t, api.srv, "/endpoints/"+itoa(ep.ID))
	for _, p := range []string{page, endpointPage} {
		if strings.Contains(p, "datetime-local") || strings.Contains(p, "RFC 3339") {
			t.Errorf("a page still asks for a browser's local picker or RFC 3339:\n%s", p)
		}
	}
	if !strings.Contains(endpointPage, field("since", "")) || !strings.Contains(endpointPage, field("until", "")) {
		t.Errorf("the replay form's times are not the panel's time field:\n%s", endpointPage)
	}
	code, preview, _ := postPanelForm(t, signIn(t, api.srv), api.srv, "/endpoints/"+itoa(ep.ID)+"/replay",
		url.Values{"dry_run": {"1"}, "since": {time.Now().UTC().Add(-time.Hour).Format("2006-01-02 15:04")}})
	if code != 200 || !strings.Contains(preview, `id="replay-preview"`) {
		t.Errorf("a replay from a typed UTC time answered %d:\n%s", code, preview)
	}

	for _, bad := range []struct{ path, want string }{
		{"/events?since=yesterday", `since &#34;yesterday&#34; is not a UTC time such as 2026-05-01 14:30`},
		{"/events?until=2026-01-01+3pm", `until &#34;2026-01-01 3pm&#34; is not a UTC time such as 2026-05-01 14:30`},
	} {
		if status, page := panelPage(t, api.srv, bad.path); status != 400 || !strings.Contains(page, bad.want) {
			t.Errorf("GET %s: %d, want 400 saying %s:\n%s", bad.path, status, bad.want, page)
		}
	}
	code, refused, _ := postPanelForm(t, signIn(t, api.srv), api.srv, "/endpoints/"+itoa(ep.ID)+"/replay",
		url.Values{"dry_run": {"1"}, "since": {"01/02/2026 10:00 PM"}})
	if want := `replay from &#34;01/02/2026 10:00 PM&#34; is not a UTC time`; code != 400 || !strings.Contains(refused, want) {
		t.Errorf("a replay from a 12-hour time answered %d, want 400 saying %s:\n%s", code, want, refused)
	}
}

// An event's payload is indented and wraps, whole however long; its jobs'
// errors read once: eighteen attempts that failed alike are one line, and
// the receiver's answer shows once, unescaped.
func TestEventPayloadFormattedAndErrorsOnce(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := api.createEndpoint("https://a.example/hook")
	long := strings.Repeat("abcdefghij", 300) // 3000 characters, no space to break at
	var ev int64
	if err := db.QueryRow(`SELECT outbox.record('order.paid', 'o-1', jsonb_build_object('note', $1::text, 'items', jsonb_build_array(1, 2)))`, long).Scan(&ev); err != nil {
		t.Fatal(err)
	}
	relayAll(t, db)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'discarded', attempt = 18, attempted_at = now(), finalized_at = now(),
  errors = (SELECT jsonb_agg(jsonb_build_object('attempt', i, 'at', now(), 'error',
              'webhook: answered 500 Internal Server Error: "{\"error\":\"upstream database unavailable\"}"')) FROM generate_series(1, 18) AS i)
WHERE endpoint_id = $1`, ep.ID)

	_, page := panelPage(t, api.srv, "/events/"+itoa(ev))
	payload := regexp.MustCompile(`(?s)<pre class="payload" id="payload">(.*?)</pre>`).FindStringSubmatch(page)
	if payload == nil {
		t.Fatalf("the event page has no payload block:\n%s", page)
	}
	want := "{\n  &#34;note&#34;: &#34;" + long + "&#34;,\n  &#34;items&#34;: [\n    1,\n    2\n  ]\n}"
	if payload[1] != want {
		t.Errorf("the payload reads\n%s\nwant it indented and whole", payload[1])
	}
	errs := regexp.MustCompile(`(?s)<td><div class="err">.*?</td>`).FindString(page)
	if n := strings.Count(errs, `<div class="err">`); n != 1 || !strings.Contains(errs, `#1–#18 <time`) || !strings.Contains(errs, `: webhook: answered 500 Internal Server Error</div>`) {
		t.Errorf("18 alike attempts read as %d lines, want one #1–#18:\n%s", n, errs)
	}
	if n := strings.Count(page, "upstream database unavailable"); n != 1 || !strings.Contains(errs, `<pre class="answer">{
  &#34;error&#34;: &#34;upstream database unavailable&#34;
}</pre>`) {
		t.Errorf("the answer shows %d times, want once, indented and unescaped:\n%s", n, errs)
	}
	css := readStyle(t, api.srv)
	if !regexp.MustCompile(`pre\.payload \{[^}]*white-space: pre-wrap;[^}]*overflow-wrap: anywhere`).MatchString(css) {
		t.Errorf("style.css does not wrap the payload")
	}
}

// readStyle is the panel's stylesheet.
func readStyle(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	resp, err := http.Get(srv.URL + "/static/style.css")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	css, _ := io.ReadAll(resp.Body)
	return string(css)
}
