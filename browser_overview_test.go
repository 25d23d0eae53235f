// browser_overview_test.go: the overview in a browser, as a newcomer
// reads it: cards that add up to their total, each said in plain words,
// and the page's margin kept to its foot.

package main

import (
	"database/sql"
	"strconv"
	"strings"
	"testing"
)

func TestOverviewInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	paused := seedOverlappingEndpoints(t, db)
	seedWaitingJobs(t, db, paused)

	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("#backlog")

	// Five endpoints, three of them in two states at once: each is in one
	// card, and the cards add up to the total shown.
	t.Run("endpoint cards partition", func(t *testing.T) {
		br := br.in(t)
		want := map[string]int{"healthy": 1, "degraded": 1, "failing": 1, "paused": 1, "disabled": 1}
		sum := 0
		for card, n := range want {
			got := figure(t, br, "#endpoints-"+card)
			sum += got
			if got != n {
				t.Errorf("%s endpoints: %d, want %d", card, got, n)
			}
		}
		if total := figure(t, br, "#endpoints-total"); total != 5 || sum != total {
			t.Errorf("the endpoint cards add up to %d, the total shown is %d; want both 5", sum, total)
		}
		if got := br.text("#endpoint-precedence"); !strings.Contains(got, "the first of disabled, paused, failing and degraded") {
			t.Errorf("the endpoints' cards are explained as %q, want it to say which card an endpoint in two states is in", got)
		}
	})

	// The unfinished jobs: ready now, waiting for a later time, held by
	// a pause, running; each said in words, and adding up to the total.
	t.Run("job figures in words", func(t *testing.T) {
		br := br.in(t)
		cards := []struct {
			id, words string
			n         int
		}{
			{"due-now", "ready to run now", 2},
			{"scheduled-later", "waiting for a later time", 3},
			{"held-by-pause", "held by a paused endpoint", 2},
			{"running", "running", 1},
		}
		sum := 0
		for _, c := range cards {
			got := figure(t, br, "#"+c.id)
			sum += got
			if got != c.n {
				t.Errorf("%s: %d, want %d", c.words, got, c.n)
			}
			if text := br.text("#card-" + c.id); !strings.Contains(text, c.words) {
				t.Errorf("the %s card reads %q, want it to say %q", c.id, text, c.words)
			}
		}
		if total := figure(t, br, "#delivery-backlog"); total != 8 || sum != total {
			t.Errorf("the job cards add up to %d, the unfinished total is %d; want both 8", sum, total)
		}
		states := br.text("#job-states")
		for _, want := range []string{"available 4 not tried yet", "retryable 3 failed, to be tried again"} {
			if !strings.Contains(states, want) {
				t.Errorf("the jobs by state read %q, want %q", states, want)
			}
		}
	})

	// The version footer starts where the page's content does.
	t.Run("footer margin", func(t *testing.T) {
		br := br.in(t)
		var left struct {
			Main   float64 `json:"main"`
			Footer float64 `json:"footer"`
		}
		br.execute(`return {main: document.querySelector('main h1').getBoundingClientRect().left,
			footer: document.querySelector('footer small').getBoundingClientRect().left};`, &left)
		if left.Main == 0 || left.Footer != left.Main {
			t.Errorf("the footer starts at %.0f px, the page's content at %.0f px; want the same", left.Footer, left.Main)
		}
	})
}

// in is d reporting to t, a subtest's.
func (d *webDriver) in(t *testing.T) *webDriver {
	c := *d
	c.t = t
	return &c
}

// figure reads the whole number an element of the page shows.
func figure(t *testing.T, br *webDriver, css string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(br.text(css)))
	if err != nil {
		t.Fatalf("%s shows %q, not a number", css, br.text(css))
	}
	return n
}

// seedOverlappingEndpoints writes five endpoints, three of them in two
// states at once: one healthy; one degraded by a failed attempt in the
// last minute, its last attempt a success (enabled, and in trouble); one
// failing, its breaker open; one failing and disabled; one degraded and
// paused. It returns the paused one's id.
func seedOverlappingEndpoints(t *testing.T, db *sql.DB) (paused int64) {
	t.Helper()
	ids := map[string]int64{}
	for _, ep := range []struct{ name, set string }{
		{"healthy", ``},
		{"blip", ``},
		{"failing", `breaker_opened_at = now(), consecutive_failures = 5, failing_since = now() - interval '10 minutes'`},
		{"failing-disabled", `breaker_opened_at = now() - interval '5 days', consecutive_failures = 900, failing_since = now() - interval '5 days',
			disabled_at = now(), disabled_reason = 'failed for 5 days', disabled_cause = 'failure'`},
		{"degraded-paused", `paused_at = now(), failing_since = now() - interval '1 minute'`},
	} {
		var id int64
		if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, description, secret)
			VALUES ('https://hooks.example/' || $1, $1, decode(repeat('ab', 32), 'hex')) RETURNING id`, ep.name).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if ep.set != "" {
			mustExec(t, db, `UPDATE outbox.endpoints SET `+ep.set+` WHERE id = $1`, id)
		}
		ids[ep.name] = id
	}
	mustExec(t, db, `
		INSERT INTO outbox.delivery_stats (endpoint_id, minute, attempts, successes, failed_timeout, failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
		VALUES ($1, date_trunc('minute', now()) - interval '1 minute', 10, 9, 0, 0, 1, 0, 0, array_fill(0::bigint, ARRAY[19]))`, ids["blip"])
	return ids["degraded-paused"]
}

// seedWaitingJobs writes 8 unfinished jobs: 2 due now (an available and a
// retryable), 3 scheduled later (an available in 5 minutes, two
// retryable in an hour and two), 2 of the paused endpoint (one due, one
// later), 1 running; and 1 completed, 1 discarded.
func seedWaitingJobs(t *testing.T, db *sql.DB, paused int64) {
	t.Helper()
	// Two events: a delivery to an endpoint is one an event.
	mustExec(t, db, `SELECT outbox.record('t', 's' || i, '{}') FROM generate_series(1, 2) AS i`)
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at, scheduled_at)
		SELECT CASE WHEN w.held THEN 'webhook' ELSE 'sub:x' END,
		       CASE WHEN w.due_in > interval '0' THEN (SELECT max(id) FROM outbox.events) ELSE (SELECT min(id) FROM outbox.events) END,
		       CASE WHEN w.held THEN $1::bigint END, 18, w.state::outbox.job_state,
		       CASE WHEN w.state = 'available' THEN 0 ELSE 1 END,
		       CASE WHEN w.state = 'available' THEN NULL ELSE now() END,
		       CASE WHEN w.state IN ('completed', 'discarded') THEN now() END,
		       now() + w.due_in
		FROM (VALUES ('available', interval '-1 second', false), ('retryable', interval '-1 minute', false),
		             ('available', interval '5 minutes', false), ('retryable', interval '1 hour', false), ('retryable', interval '2 hours', false),
		             ('available', interval '-1 second', true), ('available', interval '1 hour', true),
		             ('running', interval '-1 minute', false), ('completed', interval '-1 minute', false), ('discarded', interval '-1 minute', false)
		     ) AS w(state, due_in, held)`, paused)
}
