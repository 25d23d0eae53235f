// browser_views_test.go: the operator's pages in a browser:
// acknowledging an alert, jobs filtered by endpoint, where an event went,
// an endpoint's delivery statistics, the retry of every discarded job, a
// source's webhooks over time. TestPanelInBrowser drives the rest.

package main

import (
	"fmt"
	"strings"
	"testing"
)

func TestPanelOperatorViewsInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)

	// One event, fanned out to two endpoints: delivered to a, discarded
	// at b (which the discarded-jobs alert then reports).
	var a, b, event int64
	for _, ep := range []*int64{&a, &b} {
		if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret) VALUES ('https://hooks.example/' || md5(random()::text), decode(repeat('ab', 32), 'hex')) RETURNING id`).Scan(ep); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.QueryRow(`INSERT INTO outbox.events (topic, subject, fanned_out_at) VALUES ('order.paid', '42', now()) RETURNING id`).Scan(&event); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at)
		VALUES ('webhook', $1, $2, 18, 'completed', 1, now(), now()), ('webhook', $1, $3, 18, 'discarded', 18, now(), now())`, event, a, b)
	// a's last minutes: 4 attempts, 3 delivered (two within 10 ms of
	// their commit, one within 100 ms), one answered 500.
	mustExec(t, db, `
		INSERT INTO outbox.delivery_stats (endpoint_id, minute, attempts, successes, failed_timeout, failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
		VALUES ($1, date_trunc('minute', now()) - interval '2 minutes', 4, 3, 0, 0, 1, 0, 0, '{0,0,0,2,0,0,1,0,0,0,0,0,0,0,0,0,0,0,0}')`, a)

	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("#backlog")

	// Acknowledge the discarded-jobs alert: it stays listed, marked.
	if br.count("#alert-jobs_discarded form.ack button") != 1 {
		t.Fatal("the discarded-jobs alert has no Acknowledge button")
	}
	br.click("#alert-jobs_discarded form.ack button")
	br.find("#alert-jobs_discarded .ack")
	if got := br.text("#alert-jobs_discarded .ack"); !strings.HasPrefix(got, "acknowledged") {
		t.Errorf("after Acknowledge the alert says %q, want acknowledged", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.alert_acks WHERE name = 'jobs_discarded'`); n != 1 {
		t.Errorf("%d acknowledgements stored for jobs_discarded, want 1", n)
	}

	// The alert links to what it counts: the discarded jobs.
	br.click("#alert-jobs_discarded strong a")
	if got := br.text("h1"); !strings.Contains(got, "discarded") {
		t.Errorf("the discarded-jobs alert's link leads to %q, want the discarded jobs", got)
	}

	// Jobs of endpoint b only, filtered with the form: its discarded
	// delivery, and the bulk retry. The heading links the endpoint only
	// once the filtered page has loaded.
	br.open(srv.URL + "/jobs")
	br.typeInto("#jobs-filter input[name=endpoint_id]", fmt.Sprint(b))
	br.click("#jobs-filter button")
	br.find(fmt.Sprintf(`h1 a[href="/endpoints/%d"]`, b))
	if got := br.text("h1"); !strings.Contains(got, fmt.Sprintf("endpoint %d", b)) {
		t.Errorf("filtered jobs page heading %q, want it to name endpoint %d", got, b)
	}
	if rows := br.count("table tbody tr"); rows != 1 {
		t.Errorf("%d jobs listed for endpoint %d, want 1", rows, b)
	}
	br.open(fmt.Sprintf("%s/jobs?endpoint_id=%d&state=discarded", srv.URL, b))
	if br.count(fmt.Sprintf(`form[action="/endpoints/%d/retry-discarded"] button`, b)) != 1 {
		t.Error("no bulk retry of the endpoint's discarded deliveries")
	}

	// The event: where it went, a job per endpoint with its state.
	br.open(fmt.Sprintf("%s/events/%d", srv.URL, event))
	jobs := br.text("table")
	for _, want := range []string{"completed", "discarded"} {
		if !strings.Contains(jobs, want) {
			t.Errorf("the event page's jobs do not show %q:\n%s", want, jobs)
		}
	}

	// Endpoint a's statistics, as seeded.
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, a))
	for css, want := range map[string]string{
		"#stats-1h .attempts":     "4",
		"#stats-1h .delivered":    "3",
		"#stats-1h .success-rate": "75.0%",
		"#stats-1h .p50":          "≤ 10 ms",
		"#stats-1h .p99":          "≤ 100 ms",
	} {
		if got := br.text(css); got != want {
			t.Errorf("endpoint page %s = %q, want %q", css, got, want)
		}
	}
	if br.count("#chart-1h svg") != 1 {
		t.Error("no delivery chart for the last hour")
	}
	br.screenshot(artifactDir + "/endpoint-stats.png")

	// Every endpoint's discarded jobs, retried from the list with one
	// button; the list it returns to says what it did.
	br.open(srv.URL + "/jobs?state=discarded")
	br.click(`form[action="/jobs/retry-discarded"] button`)
	br.find(".flash")
	if got := br.text(".flash"); !strings.HasPrefix(got, "1 discarded jobs will be sent again: 1 deliveries to 1 endpoints") {
		t.Errorf("after the retry of every discarded job the list says %q", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'available'`, b); n != 1 {
		t.Errorf("%d of b's deliveries available after the retry, want its discarded one", n)
	}

	// The Inbox page: a source's webhooks over time, charted, with its
	// recent refusal and its class.
	mustExec(t, db, `INSERT INTO outbox.inbox_sources (name, secret, topic_prefix) VALUES ('billing', decode(repeat('ab', 32), 'hex'), 'billing.')`)
	mustExec(t, db, `
		INSERT INTO outbox.inbox_stats (minute, source, received, bad_signature, last_refusal_reason, last_refusal_class, last_refused_at)
		VALUES (date_trunc('minute', now()) - interval '3 minutes', 'billing', 12, 2, 'verify webhook: no matching webhook signature',
		        'bad_signature', date_trunc('minute', now()) - interval '3 minutes' + interval '20 seconds')`)
	br.open(srv.URL + "/sources")
	if n := br.count("section.inbox-source svg.dchart"); n != 2 {
		t.Errorf("%d inbox charts, want 2: billing's hour and day (the unknown names sent nothing)", n)
	}
	if got := br.text("section.inbox-source table.refusals"); !strings.Contains(got, "bad_signature") || !strings.Contains(got, "no matching webhook signature") {
		t.Errorf("billing's recent refusals read %q", got)
	}
	br.screenshot(artifactDir + "/inbox-over-time.png")
}
