// endpoint_page_test.go: an endpoint's page puts the cause first, and
// shows a receiver's answer once, unescaped and indented.

package main

import (
	"fmt"
	"strings"
	"testing"
)

// A failing endpoint's page: its state and last error above the failures
// grouped by error, those above the first chart; the JSON answer shown
// once a row, as JSON, not as a Go-quoted string; no retry button for
// discarded deliveries it has none of.
func TestEndpointPageShowsTheCauseFirst(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	var ep, event int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, description, secret, failing_since, breaker_opened_at, consecutive_failures)
		VALUES ('https://hooks.example/orders', 'Orders service', decode(repeat('ab', 32), 'hex'), now() - interval '10 minutes', now() - interval '5 minutes', 7)
		RETURNING id`).Scan(&ep); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`INSERT INTO outbox.events (topic, subject, fanned_out_at) VALUES ('order.paid', '42', now()) RETURNING id`).Scan(&event); err != nil {
		t.Fatal(err)
	}
	body := `{"error":"upstream database unavailable"}`
	mustExec(t, db, `
		WITH j AS (INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at)
		           VALUES ('webhook', $1, $2, 18, 'retryable', 1, now()) RETURNING id)
		INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, outcome, duration_ms, status_code, error, response_excerpt)
		SELECT id, 1, $1, 'webhook', $2, 'retryable', 12, 500, $3, $4 FROM j`, event, ep, "receiver answered 500: "+fmt.Sprintf("%q", body), body)

	status, page := panelPage(t, srv, fmt.Sprintf("/endpoints/%d", ep))
	if status != 200 {
		t.Fatalf("GET the endpoint's page: %d\n%s", status, page)
	}
	order := []string{`<dd id="state" class="endpoint-failing">failing</dd>`, `id="last-error"`, "receiver answered 500",
		`id="recent-failures"`, `<figure id="chart-1h"`}
	at := 0
	for _, want := range order {
		i := strings.Index(page[at:], want)
		if i < 0 {
			t.Fatalf("the page does not show %q after what came before it (%q, in order):\n%s", want, order, page)
		}
		at += i
	}
	// html/template writes a quote as &#34;: the answer, indented, is
	// "error": "upstream ...", with no backslash before any quote.
	if want := `&#34;error&#34;: &#34;upstream database unavailable&#34;`; !strings.Contains(page, want) {
		t.Errorf("the page does not show the answer as indented JSON (%s)", want)
	}
	if strings.Contains(page, `\&#34;`) {
		t.Error("the page shows the answer's quotes escaped")
	}
	recent := page[strings.Index(page, "<h2>Recent attempts</h2>"):]
	recent = recent[:strings.Index(recent, "</table>")]
	if n := strings.Count(recent, "upstream database unavailable"); n != 1 {
		t.Errorf("the recent attempt's row shows the answer %d times, want once:\n%s", n, recent)
	}
	if strings.Contains(page, "Retry 0 discarded") {
		t.Error(`the page offers "Retry 0 discarded"`)
	}
}
