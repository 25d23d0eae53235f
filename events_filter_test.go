package main

import (
	"database/sql"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// streamT0 is the hour the seeded stream starts: event i of
// seedFilterStream was recorded i hours after it.
var streamT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// seededEvent is one event of seedFilterStream: what it is, and the states
// of the jobs it made.
type seededEvent struct {
	topic, subject string
	relay          string // "fanned", "unfanned" or "poisoned"
	jobs           []string
}

// filterStream is the seeded stream, event i+1 its i-th row; the comment
// is the outcome each has.
var filterStream = []seededEvent{
	{"order.paid", "s-1", "fanned", []string{"completed", "completed"}},     // 1 delivered
	{"order.paid", "s-2", "fanned", []string{"completed", "discarded"}},     // 2 failed
	{"user.created", "s-1", "fanned", []string{"available"}},                // 3 pending
	{"order.shipped", "s-1", "unfanned", nil},                               // 4 pending
	{"order.paid", "s-3", "fanned", nil},                                    // 5 none: nobody subscribed
	{"order.paid", "s-1", "poisoned", nil},                                  // 6 none
	{"user.created", "s-2", "fanned", []string{"discarded", "running"}},     // 7 failed and pending
	{"order.paid", "s-1", "fanned", []string{"completed"}},                  // 8 delivered
	{"order.refunded", "s-2", "fanned", []string{"retryable", "completed"}}, // 9 pending
}

// seedFilterStream records filterStream, event i+1 at streamT0 + i+1
// hours, with its jobs in their states, and returns the ids in order.
func seedFilterStream(t *testing.T, db *sql.DB) []int64 {
	t.Helper()
	var ids []int64
	for i, e := range filterStream {
		id := record(t, db, e.topic, e.subject)
		at := streamT0.Add(time.Duration(i+1) * time.Hour)
		mustExec(t, db, `UPDATE outbox.events SET created_at = $2 WHERE id = $1`, id, at)
		switch e.relay {
		case "fanned":
			mustExec(t, db, `UPDATE outbox.events SET fanned_out_at = $2 WHERE id = $1`, id, at)
		case "poisoned":
			mustExec(t, db, `UPDATE outbox.events SET poisoned_at = $2, relay_attempts = 3, relay_error = 'boom' WHERE id = $1`, id, at)
		}
		for _, state := range e.jobs {
			mustExec(t, db, `
				INSERT INTO outbox.jobs (kind, event_id, state, attempt, max_attempts, attempted_at, finalized_at)
				VALUES ('test', $1, $2::outbox.job_state, 1, 5, $3,
				        CASE WHEN $2 IN ('completed', 'discarded') THEN $3::timestamptz END)`, id, state, at)
		}
		ids = append(ids, id)
	}
	return ids
}

// eventsAnswer is GET /api/events's answer.
type eventsAnswer struct {
	Events     []Event `json:"events"`
	NextBefore int64   `json:"next_before"`
	NextAfter  int64   `json:"next_after"`
}

// listStream asks the API for path and returns the answer, failing unless
// it is a 200.
func listStream(t *testing.T, api *testAPI, path string) eventsAnswer {
	t.Helper()
	var page eventsAnswer
	if status := apiCall(t, api.srv, "GET", path, "", &page); status != http.StatusOK {
		t.Fatalf("GET %s: %d", path, status)
	}
	return page
}

// streamIDs are the seeded ids of the 1-based events ns.
func streamIDs(ids []int64, ns ...int) []int64 {
	out := []int64{}
	for _, n := range ns {
		out = append(out, ids[n-1])
	}
	return out
}

func idsOf(events []Event) []int64 {
	out := []int64{}
	for _, e := range events {
		out = append(out, e.ID)
	}
	return out
}

// hour is streamT0 plus h hours as a query parameter.
func hour(h int) string {
	return url.QueryEscape(streamT0.Add(time.Duration(h) * time.Hour).Format(time.RFC3339))
}

// Every filter of the stream, alone and combined, selects exactly the
// events it names, newest first.
func TestEventsFilterByTimeTopicSubjectOutcome(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ids := seedFilterStream(t, db)

	for _, tc := range []struct {
		query string
		want  []int
	}{
		{"", []int{9, 8, 7, 6, 5, 4, 3, 2, 1}},
		{"outcome=delivered", []int{8, 1}},
		{"outcome=failed", []int{7, 2}},
		{"outcome=pending", []int{9, 7, 4, 3}},
		{"since=" + hour(3), []int{9, 8, 7, 6, 5, 4, 3}}, // since is inclusive
		{"until=" + hour(3), []int{2, 1}},                // until is exclusive
		{"since=" + hour(2) + "&until=" + hour(5), []int{4, 3, 2}},
		{"since=" + url.QueryEscape("2026-01-01T03:30:00+01:00"), []int{9, 8, 7, 6, 5, 4, 3}}, // 02:30Z
		{"topic=order.*", []int{9, 8, 6, 5, 4, 2, 1}},
		{"topic=order.*&outcome=delivered", []int{8, 1}},
		{"subject=s-1&outcome=pending", []int{4, 3}},
		{"topic=user.created&outcome=failed&since=" + hour(4), []int{7}},
		{"state=fanned&outcome=pending", []int{9, 7, 3}},
		{"state=unfanned&outcome=pending", []int{4}},
		{"state=poisoned&outcome=pending", []int{}},
		{"subject=s-2&outcome=failed&until=" + hour(7), []int{2}},
		{"topic=order.*&since=" + hour(4) + "&until=" + hour(9) + "&outcome=pending", []int{4}},
	} {
		page := listStream(t, api, "/api/events?"+tc.query)
		if diff := cmp.Diff(streamIDs(ids, tc.want...), idsOf(page.Events)); diff != "" {
			t.Errorf("GET /api/events?%s (-want +got):\n%s", tc.query, diff)
		}
	}
}

// A bad since, until or outcome is a 400 that names what is wrong.
func TestEventsFilterRefusesBadValues(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)

	for _, tc := range []struct{ query, want string }{
		{"since=yesterday", `"since" is "yesterday", not an RFC 3339 time such as 2026-05-01T00:00:00Z`},
		{"until=2026-01-01", `"until" is "2026-01-01", not an RFC 3339 time such as 2026-05-01T00:00:00Z`},
		{"since=" + hour(2) + "&until=" + hour(2), "until 2026-01-01T02:00:00Z must be after since 2026-01-01T02:00:00Z"},
		{"since=" + hour(3) + "&until=" + hour(2), "until 2026-01-01T02:00:00Z must be after since 2026-01-01T03:00:00Z"},
		{"outcome=done", `outcome "done" must be delivered, failed or pending`},
		{"before=5&after=2", "before and after page in opposite directions: give one"},
	} {
		var answer struct {
			Error string `json:"error"`
		}
		status := apiCall(t, api.srv, "GET", "/api/events?"+tc.query, "", &answer)
		if status != http.StatusBadRequest || answer.Error != tc.want {
			t.Errorf("GET /api/events?%s: %d %q, want 400 %q", tc.query, status, answer.Error, tc.want)
		}
	}
}

// A filtered stream pages older to its end and newer back to its start,
// each page newest first, the same pages both ways, with cursors only
// where more events lie.
func TestEventsPageBothWays(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ids := seedFilterStream(t, db)

	const filter = "/api/events?topic=order.*&limit=2"
	type pageIDs struct {
		Events        []int64
		Before, After int64 // 0: no such page
	}
	wantPages := []pageIDs{
		{streamIDs(ids, 9, 8), ids[8-1], 0},
		{streamIDs(ids, 6, 5), ids[5-1], ids[6-1]},
		{streamIDs(ids, 4, 2), ids[2-1], ids[4-1]},
		{streamIDs(ids, 1), 0, ids[1-1]},
	}
	got := func(path string) pageIDs {
		p := listStream(t, api, path)
		return pageIDs{idsOf(p.Events), p.NextBefore, p.NextAfter}
	}

	var older []pageIDs
	for path := filter; ; {
		p := got(path)
		older = append(older, p)
		if p.Before == 0 || len(older) > len(wantPages) {
			break
		}
		path = filter + "&before=" + itoa(p.Before)
	}
	if diff := cmp.Diff(wantPages, older); diff != "" {
		t.Fatalf("older pages (-want +got):\n%s", diff)
	}

	newer := []pageIDs{older[len(older)-1]}
	for p := newer[0]; p.After != 0 && len(newer) <= len(wantPages); {
		p = got(filter + "&after=" + itoa(p.After))
		newer = append([]pageIDs{p}, newer...)
	}
	if diff := cmp.Diff(wantPages, newer); diff != "" {
		t.Errorf("newer pages, walked back from the oldest (-want +got):\n%s", diff)
	}

	// A page asked from the middle, and from past either end.
	if diff := cmp.Diff(pageIDs{streamIDs(ids, 5, 4), ids[4-1], ids[5-1]}, got(filter+"&after="+itoa(ids[2-1]))); diff != "" {
		t.Errorf("the page after event 2 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(pageIDs{[]int64{}, ids[9-1] + 1, 0}, got(filter+"&after="+itoa(ids[9-1]))); diff != "" {
		t.Errorf("the page after the newest (-want +got):\n%s", diff)
	}
}

// The panel's stream filters by the same parameters, shows them back in
// its form, and links the newer and older pages with the filter kept.
func TestPanelEventsFilterAndPage(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ids := seedFilterStream(t, db)

	// order.* since hour 2: 9, 8, 6, 5, 4, 2; of them pending: 9, 4.
	filter := url.Values{"topic": {"order.*"}, "since": {streamT0.Add(2 * time.Hour).Format(time.RFC3339)},
		"outcome": {"pending"}, "limit": {"1"}}
	status, page := panelPage(t, api.srv, "/events?"+filter.Encode()+"&after="+itoa(ids[4-1]))
	if status != http.StatusOK {
		t.Fatalf("GET /events: %d\n%s", status, page)
	}
	for n, want := range map[int]bool{9: true, 8: false, 4: false, 2: false} {
		row := `<a href="/events/` + itoa(ids[n-1]) + `">`
		if strings.Contains(page, row) != want {
			t.Errorf("event %d listed: %v, want %v", n, !want, want)
		}
	}
	link := func(cursor string, id int64) string {
		q := url.Values{}
		for k, v := range filter {
			q[k] = v
		}
		q.Set(cursor, itoa(id))
		return `href="` + html.EscapeString("/events?"+q.Encode()) + `"`
	}
	if want := link("before", ids[9-1]); !strings.Contains(page, want+`>Older`) {
		t.Errorf("no older link %s:\n%s", want, page)
	}
	if strings.Contains(page, "Newer") {
		t.Errorf("a newer link on the newest page:\n%s", page)
	}
	for _, field := range []string{`value="order.*"`, `value="2026-01-01 02:00"`, `<option value="pending" selected>`} {
		if !strings.Contains(page, field) {
			t.Errorf("the form does not show %s back:\n%s", field, page)
		}
	}

	_, page = panelPage(t, api.srv, "/events?"+filter.Encode()+"&before="+itoa(ids[9-1]))
	if !strings.Contains(page, `<a href="/events/`+itoa(ids[4-1])+`">`) {
		t.Errorf("the older page does not list event 4:\n%s", page)
	}
	if want := link("after", ids[4-1]); !strings.Contains(page, want+`>← Newer`) {
		t.Errorf("no newer link %s:\n%s", want, page)
	}
	if strings.Contains(page, "Older") {
		t.Errorf("an older link on the oldest page:\n%s", page)
	}

	if status, page := panelPage(t, api.srv, "/events?outcome=lost"); status != http.StatusBadRequest || !strings.Contains(page, "must be delivered, failed or pending") {
		t.Errorf("GET /events?outcome=lost: %d\n%s", status, page)
	}
}
