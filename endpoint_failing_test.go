// endpoint_failing_test.go: the endpoint_failing alert at its edges, and
// read from a real database: an endpoint answering 500 fails, a blip on a
// healthy one is degraded.

package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The rule's edges at the defaults: 50% success for 3 minutes, to the
// minute, or an open breaker; paused and disabled endpoints never fire.
func TestEndpointFailingAlertEdges(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig().Alerts
	if cfg.EndpointSuccessBelow != 0.5 || cfg.EndpointFailingFor != 3*time.Minute {
		t.Fatalf("defaults %v, %s; want 0.5, 3m", cfg.EndpointSuccessBelow, cfg.EndpointFailingFor)
	}
	now := time.Date(2025, 3, 1, 12, 0, 30, 0, time.UTC)
	minute := func(hhmm int) *time.Time {
		m := time.Date(2025, 3, 1, hhmm/100, hhmm%100, 0, 0, time.UTC)
		return &m
	}
	opened := now.Add(-time.Minute)
	failed := func(successes, attempts int64, first, last int) EndpointHealth {
		return EndpointHealth{ID: 7, Name: "orders", Successes: successes, Attempts: attempts,
			FirstFailed: minute(first), LastFailed: minute(last), LastError: `receiver answered 500: "{\"error\":\"down\"}"`}
	}
	paused, disabled := failed(0, 10, 1157, 1200), failed(0, 10, 1157, 1200)
	paused.Paused, disabled.Disabled = true, true
	breakerPaused := EndpointHealth{ID: 7, BreakerOpenedAt: &opened, Paused: true}
	for _, tc := range []struct {
		name string
		h    EndpointHealth
		want []string
	}{
		{"breaker open", EndpointHealth{ID: 7, BreakerOpenedAt: &opened}, []string{"endpoint_failing"}},
		{"breaker open, paused", breakerPaused, []string{}},
		{"every attempt failed for 3 minutes", failed(0, 10, 1157, 1200), []string{"endpoint_failing"}},
		{"40% for 3 minutes", failed(4, 10, 1157, 1200), []string{"endpoint_failing"}},
		{"at the threshold, 50%", failed(5, 10, 1157, 1200), []string{}},
		{"failing for 2 minutes only", failed(0, 10, 1158, 1200), []string{}},
		{"no failure in the last minute", failed(0, 10, 1157, 1158), []string{}},
		{"failing up to the minute before", failed(0, 10, 1157, 1159), []string{"endpoint_failing"}},
		{"a blip: one 503 of 25", failed(24, 25, 1200, 1200), []string{}},
		{"a lone failed attempt 3 minutes ago", failed(0, 1, 1157, 1157), []string{}},
		{"paused", paused, []string{}},
		{"disabled", disabled, []string{}},
	} {
		got := alertNamesOf(evaluateAlerts(cfg, Overview{EndpointHealth: []EndpointHealth{tc.h}}, alertStarts{Now: now}))
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// An endpoint answering 500 on every attempt raises endpoint_failing
// naming it, its last error (the answer unquoted) and its page; one 503
// among an hour's successes on another leaves that one degraded.
func TestEndpointFailingFromDatabase(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	var dead, blip, event int64
	for _, ep := range []struct {
		id   *int64
		desc string
	}{{&dead, "Orders service"}, {&blip, ""}} {
		if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, description, secret, failing_since)
			VALUES ('https://hooks.example/' || md5(random()::text), $1, decode(repeat('ab', 32), 'hex'), now() - interval '10 minutes') RETURNING id`, ep.desc).Scan(ep.id); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.QueryRow(`INSERT INTO outbox.events (topic, subject, fanned_out_at) VALUES ('order.paid', '42', now()) RETURNING id`).Scan(&event); err != nil {
		t.Fatal(err)
	}
	// dead: every attempt of the last 5 minutes answered 500 (the 4 that
	// overlap the last 3 minutes count, 12 attempts); blip: one
	// 503 in the current minute among 24 successes.
	mustExec(t, db, `
		INSERT INTO outbox.delivery_stats (endpoint_id, minute, attempts, successes, failed_timeout, failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
		SELECT $1::bigint, date_trunc('minute', now()) - m * interval '1 minute', 3, 0, 0, 0, 3, 0, 0, array_fill(0::bigint, ARRAY[19])
		FROM generate_series(0, 4) AS m
		UNION ALL
		SELECT $2::bigint, date_trunc('minute', now()), 25, 24, 0, 0, 1, 0, 0, array_fill(0::bigint, ARRAY[19])`, dead, blip)
	for _, ep := range []struct {
		id     int64
		status int
		err    string
	}{{dead, 500, `receiver answered 500: "{\"error\":\"upstream database unavailable\"}"`}, {blip, 503, `receiver answered 503`}} {
		mustExec(t, db, `
			WITH j AS (INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at)
			           VALUES ('webhook', $1, $2, 18, 'retryable', 1, now()) RETURNING id)
			INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, outcome, duration_ms, status_code, error, response_excerpt)
			SELECT id, 1, $1, 'webhook', $2, 'retryable', 12, $3, $4, '' FROM j`, event, ep.id, ep.status, ep.err)
	}

	o, err := readOverview(ctx, db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	health := map[int64]string{}
	for _, h := range o.EndpointHealth {
		health[h.ID] = h.Health
	}
	if diff := cmp.Diff(map[int64]string{dead: "failing", blip: "degraded"}, health); diff != "" {
		t.Errorf("endpoints' health (-want +got):\n%s", diff)
	}
	if c := o.EndpointCards(); c.Failing != 1 || c.Degraded != 1 {
		t.Errorf("%d failing and %d degraded, want 1 and 1", c.Failing, c.Degraded)
	}
	var found []Alert
	for _, a := range o.Alerts {
		if a.Name == "endpoint_failing" {
			found = append(found, a)
		}
	}
	if len(found) != 1 {
		t.Fatalf("endpoint_failing fired %d times, want once: %+v", len(found), o.Alerts)
	}
	a := found[0]
	if want := fmt.Sprintf("/endpoints/%d", dead); a.Link != want {
		t.Errorf("the alert links %q, want %q", a.Link, want)
	}
	for _, want := range []string{`"Orders service"`, "0 of its 12 attempts", "last error: receiver answered 500"} {
		if !strings.Contains(a.Message, want) {
			t.Errorf("the alert says %q, want it to say %s", a.Message, want)
		}
	}
	if strings.Contains(a.Message, `\"`) {
		t.Errorf("the alert's message %q carries escaped quotes", a.Message)
	}

	// The API's health says what the panel says: dead fails by its
	// success rate (its breaker closed), blip's one failure is degraded;
	// both keep the contract's state, failing.
	srv := newTestAdmin(t, db)
	want := map[int64]string{dead: "failing", blip: "degraded"}
	var listed struct{ Endpoints []Endpoint }
	apiCall(t, srv, "GET", "/api/endpoints", "", &listed)
	got := map[int64]string{}
	for _, e := range listed.Endpoints {
		got[e.ID] = e.Health
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GET /api/endpoints' health (-want +got):\n%s", diff)
	}
	for id, state := range want {
		var e Endpoint
		apiCall(t, srv, "GET", fmt.Sprintf("/api/endpoints/%d", id), "", &e)
		_, page := panelPage(t, srv, fmt.Sprintf("/endpoints/%d", id))
		panelState := regexp.MustCompile(`<dd id="state" class="endpoint-(\w+)">`).FindStringSubmatch(page)
		if e.Health != state || e.State != "failing" || panelState == nil || panelState[1] != state {
			t.Errorf("endpoint %d: the API says health %s state %s, its page %v; want health and page %s, state failing", id, e.Health, e.State, panelState, state)
		}
		_, list := panelPage(t, srv, "/endpoints")
		if row := fmt.Sprintf(`<td class="endpoint-%s">%s`, state, state); !strings.Contains(between(list, fmt.Sprintf(`<tr id="endpoint-%d">`, id), "</tr>"), row) {
			t.Errorf("endpoint %d: the endpoints list lacks %s", id, row)
		}
	}
}
