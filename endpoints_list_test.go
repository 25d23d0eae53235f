package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
	mustExec(t, db, `INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, outcome, duration_ms, status_code, error)
SELECT id, 1, event_id, kind, $2, 'retryable', 12, 500, 'webhook: answered 500 Internal Server Error: "{\"error\":\"upstream database unavailable\"}"'
FROM outbox.jobs WHERE id = $1`, job, ep.ID)
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
		`>500 Internal Server Error</span>`,
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

// The endpoints list puts the failing endpoints first, then the degraded,
// whatever their ids; its last error is the cause a person reads ("500
// Internal Server Error", "connection refused"), the whole error on
// hover; and its owner column names an endpoint's owner.
func TestEndpointsListFailingFirstWithCauseAndOwner(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + closed.Addr().String() + "/hook"
	closed.Close()
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":"upstream down"}`, http.StatusInternalServerError)
	})
	o := newOwner(t, api.srv, "Payments team")

	healthy := api.createEndpoint("https://healthy.example/hook", "nothing.*")
	refused := api.createEndpoint(refusedURL, "order.*")
	broken := api.createEndpoint(rc.srv.URL+"/hook", "order.*")
	var owned Endpoint
	decodeAs(t, api.srv, testToken, "POST", "/api/endpoints",
		fmt.Sprintf(`{"url": "https://owned.example/hook", "topics": ["nothing.*"], "owner_id": %d, "owner_email": "oncall@example.com"}`, o.ID), 201, &owned)

	mustExec(t, db, `SELECT outbox.record('order.paid', 'order-1', '{}')`)
	relayAll(t, db)
	runWebhookWorkers(t, db, 5*time.Second)
	waitFor(t, "a failed attempt to each of the two receivers", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(DISTINCT endpoint_id) FROM outbox.deliveries WHERE endpoint_id IN ($1, $2)`, refused.ID, broken.ID) == 2
	})
	// One failed attempt leaves both degraded; an open breaker makes the
	// later one failing.
	mustExec(t, db, `UPDATE outbox.endpoints SET breaker_opened_at = now(), consecutive_failures = 5 WHERE id = $1`, broken.ID)

	status, page := panelPage(t, api.srv, "/endpoints")
	if status != http.StatusOK {
		t.Fatalf("GET /endpoints: %d\n%s", status, page)
	}
	var order []int64
	for _, m := range regexp.MustCompile(`<tr id="endpoint-(\d+)">`).FindAllStringSubmatch(page, -1) {
		id, _ := strconv.ParseInt(m[1], 10, 64)
		order = append(order, id)
	}
	if diff := cmp.Diff([]int64{broken.ID, refused.ID, healthy.ID, owned.ID}, order); diff != "" {
		t.Errorf("the list's order, failing, degraded, then by id (-want +got):\n%s", diff)
	}
	row := func(id int64) string {
		start := strings.Index(page, `<tr id="endpoint-`+itoa(id)+`">`)
		return page[start : start+strings.Index(page[start:], "</tr>")]
	}
	cell := regexp.MustCompile(`<td class="last-error"><span title="([^"]*)">([^<]*)</span>`)
	for _, c := range []struct {
		id         int64
		cause, all string
	}{
		{broken.ID, "500 Internal Server Error", "webhook: answered 500 Internal Server Error"},
		{refused.ID, "connection refused", "webhook: Post &#34;" + refusedURL + "&#34;: dial tcp "},
	} {
		m := cell.FindStringSubmatch(row(c.id))
		if m == nil || m[2] != c.cause || !strings.HasPrefix(m[1], c.all) {
			t.Errorf("endpoint %d's last error reads %q, want %q with %q… on hover", c.id, m, c.cause, c.all)
		}
	}
	wantOwner := fmt.Sprintf(`<td class="owner"><a href="/owners#owner-%d">Payments team</a><br><small title="where its failure notices are mailed">oncall@example.com</small></td>`, o.ID)
	if got := row(owned.ID); !strings.Contains(got, wantOwner) {
		t.Errorf("the owned endpoint's row lacks %s:\n%s", wantOwner, got)
	}
	if got := row(healthy.ID); !strings.Contains(got, `<td class="owner">—</td>`) {
		t.Errorf("an endpoint of no owner shows one:\n%s", got)
	}
}

// A list's cell shows an attempt's error by its cause alone.
func TestBriefCause(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ err, want string }{
		{`webhook: answered 500 Internal Server Error: "{\"error\":\"down\"}"`, "500 Internal Server Error"},
		{`webhook: answered 410 Gone: endpoint disabled`, "410 Gone: endpoint disabled"},
		{`webhook: Post "http://127.0.0.1:9/hook": dial tcp 127.0.0.1:9: connect: connection refused`, "connection refused"},
		{`webhook: Post "https://a.example/hook": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`,
			"context deadline exceeded (Client.Timeout exceeded while awaiting headers)"},
		{`webhook: Post "https://a.example/hook": dial tcp 10.0.0.1:443: address 10.0.0.1 is private; set -allow-private-endpoints to allow`,
			"address 10.0.0.1 is private; set -allow-private-endpoints to allow"},
		{`endpoint deleted; not sent`, "endpoint deleted; not sent"},
	} {
		if got := briefCause(c.err); got != c.want {
			t.Errorf("briefCause(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}
