package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The endpoints list triages: each endpoint by its name (description,
// else URL), with its last hour's success rate, its queued and scheduled
// deliveries, its last error cut to its cause, and its receiver's dedup
// window in days and hours, not "687600 s".
func TestEndpointsListTriages(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL, "order.*")
	plain := api.createEndpoint("https://plain.example/hook", "nothing.*")
	mustExec(t, db, `UPDATE outbox.endpoints SET description = 'Billing webhooks', dedup_window_seconds = 687600, dedup_window_seen_at = now() WHERE id = $1`, ep.ID)
	mustExec(t, db, `SELECT outbox.record('order.paid', 'order-' || i, '{}') FROM generate_series(1, 3) AS i`)
	relay := newTestRelay(t, db, defaultConfig().Relay)
	if res, err := relay.relayOnce(context.Background()); err != nil || res.Jobs != 3 {
		t.Fatalf("relay pass: %+v, %v; want 3 jobs", res, err)
	}
	job := queryInt(t, db, `SELECT min(id) FROM outbox.jobs WHERE endpoint_id = $1`, ep.ID)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'retryable', attempt = 1, scheduled_at = now() + interval '1 hour' WHERE id = $1`, job)
	mustExec(t, db, `INSERT INTO outbox.deliveries (job_id, attempt, endpoint_id, duration_ms, status_code, error)
VALUES ($1, 1, $2, 12, 500, 'webhook: answered 500 Internal Server Error: "{\"error\":\"upstream database unavailable\"}"')`, job, ep.ID)
	mustExec(t, db, `INSERT INTO outbox.delivery_stats (endpoint_id, minute, attempts, successes, failed_timeout, failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
VALUES ($1, date_trunc('minute', now()) - interval '10 minutes', 4, 1, 0, 0, 3, 0, 0, array_fill(0::bigint, ARRAY[19])),
       ($1, date_trunc('minute', now()) - interval '2 hours', 100, 100, 0, 0, 0, 0, 0, array_fill(0::bigint, ARRAY[19]))`, ep.ID)

	status, page := panelPage(t, api.srv, "/endpoints")
	if status != http.StatusOK {
		t.Fatalf("GET /endpoints: %d\n%s", status, page)
	}
	row := func(id int64) string {
		start := strings.Index(page, `<tr id="endpoint-`+itoa(id)+`">`)
		if start < 0 {
			t.Fatalf("no row for endpoint %d in\n%s", id, page)
		}
		end := strings.Index(page[start:], "</tr>")
		return page[start : start+end]
	}
	got := row(ep.ID)
	for _, want := range []string{
		`<a href="/endpoints/` + itoa(ep.ID) + `">Billing webhooks</a>`,
		`<td class="success-rate">25.0% <small>of 4</small></td>`, // the last hour only: not the 100 of 2 hours ago
		`<td class="queued">2</td>`,
		`<td class="scheduled">1</td>`,
		`>webhook: answered 500 Internal Server Error</span>`,
		`<td class="dedup-window">7d 23h</td>`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("endpoint %d's row lacks %s:\n%s", ep.ID, want, got)
		}
	}
	got = row(plain.ID)
	for _, want := range []string{
		`<a href="/endpoints/` + itoa(plain.ID) + `">https://plain.example/hook</a>`,
		`<td class="success-rate">—</td>`, `<td class="queued">0</td>`, `<td class="last-error">—</td>`, `<td class="dedup-window">—</td>`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("endpoint %d's row lacks %s:\n%s", plain.ID, want, got)
		}
	}
}

// Every duration the panel shows reads in its two largest units.
func TestRoughDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{500 * time.Millisecond, "<1s"},
		{45 * time.Second, "45s"},
		{60 * time.Second, "1m"},
		{90 * time.Second, "1m 30s"},
		{3*time.Hour + 5*time.Minute + 59*time.Second, "3h 5m"},
		{24 * time.Hour, "1d"},
		{687600 * time.Second, "7d 23h"},
	} {
		if got := roughDuration(c.d); got != c.want {
			t.Errorf("roughDuration(%s) = %q, want %q", c.d, got, c.want)
		}
	}
}
