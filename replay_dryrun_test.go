// replay_dryrun_test.go: a replay's filters (until, topics) and its dry
// run: the dry run counts exactly what the replay then enqueues, enqueues
// nothing itself, estimates as docs/replays.md says, refuses bad input
// as the replay does, and the panel shows it before a replay is confirmed.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// seedReplayWindow records, for endpoint id (topics "order.*" and
// "user.created"), events inside and outside a window of [3 days ago, 1
// day ago), of topics the endpoint and a filter of "order.*" and
// "billing.*" select or not, with jobs of the endpoint in every state for
// some. Inside the window and selected by both, the replay enqueues:
// order.paid 3 (no job, completed, discarded), order.created 2 and
// order.bulk 6,000 (more than one batch, manualBatch), and leaves the
// order.paid events whose delivery waits, retries or runs.
func seedReplayWindow(t *testing.T, db *sql.DB, id, other int64) {
	t.Helper()
	mustExec(t, db, `INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at) VALUES
		('order.paid', 'new', now() - interval '2 days', now() - interval '2 days'),
		('order.paid', 'completed', now() - interval '2 days', now() - interval '2 days'),
		('order.paid', 'discarded', now() - interval '2 days', now() - interval '2 days'),
		('order.paid', 'available', now() - interval '2 days', now() - interval '2 days'),
		('order.paid', 'retryable', now() - interval '2 days', now() - interval '2 days'),
		('order.paid', 'running', now() - interval '2 days', now() - interval '2 days'),
		('order.created', 'a', now() - interval '47 hours', now() - interval '47 hours'),
		('order.created', 'b', now() - interval '25 hours', now() - interval '25 hours'),
		('order.paid', 'before since', now() - interval '4 days', now() - interval '4 days'),
		('order.paid', 'after until', now() - interval '12 hours', now() - interval '12 hours'),
		('user.created', 'not in the filter', now() - interval '2 days', now() - interval '2 days'),
		('billing.paid', 'not the endpoint''s', now() - interval '2 days', now() - interval '2 days'),
		('order.paid', 'not fanned out', now() - interval '2 days', NULL)`)
	mustExec(t, db, `INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at)
		SELECT 'order.bulk', 'bulk ' || i, now() - interval '30 hours', now() - interval '30 hours'
		FROM generate_series(1, 6000) AS i`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'webhook', id, $1, 18, subject::outbox.job_state,
		       CASE WHEN subject = 'available' THEN 0 ELSE 1 END,
		       CASE WHEN subject = 'available' THEN NULL ELSE now() END,
		       CASE WHEN subject IN ('completed', 'discarded') THEN now() END
		FROM outbox.events WHERE subject IN ('completed', 'discarded', 'available', 'retryable', 'running')`, id)
	// Another endpoint's waiting job changes nothing for this one.
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts)
		SELECT 'webhook', id, $1, 18 FROM outbox.events WHERE subject = 'new'`, other)
}

// replayJobs is endpoint id's jobs as "topic subject state attempt", the
// bulk ones counted rather than listed.
func replayJobs(t *testing.T, db *sql.DB, id int64) []string {
	t.Helper()
	return queryStrings(t, db, fmt.Sprintf(`
		SELECT s FROM (
		SELECT e.topic || ' ' || e.subject || ' ' || j.state || ' ' || j.attempt
		FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id
		WHERE j.endpoint_id = %[1]d AND e.topic <> 'order.bulk'
		UNION ALL
		SELECT 'order.bulk ' || count(*) || ' ' || string_agg(DISTINCT j.state::text, ',')
		FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id
		WHERE j.endpoint_id = %[1]d AND e.topic = 'order.bulk'
		HAVING count(*) > 0
		) AS jobs (s)
		ORDER BY s COLLATE "C"`, id))
}

// The dry run's "events" is the number of jobs the replay with the same
// parameters enqueues: new ones and finished ones set to run again, not
// the events in the window whose delivery still waits or runs. Events
// before since, at or after until, of a topic the filter or the endpoint
// does not select, or not fanned out yet count in neither. The dry run
// enqueues nothing.
func TestReplayDryRunCountsWhatTheReplayEnqueues(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook", "order.*", "user.created")
	other := createTestEndpoint(t, srv, "http://127.0.0.1:1/other")
	seedReplayWindow(t, db, id, other)
	var since, until time.Time
	if err := db.QueryRow(`SELECT now() - interval '3 days', now() - interval '1 day'`).Scan(&since, &until); err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/api/endpoints/%d/replay", id)
	body := func(dryRun bool) string {
		b, _ := json.Marshal(map[string]any{"since": since.Format(time.RFC3339Nano), "until": until.Format(time.RFC3339Nano),
			"topics": []string{"order.*", "billing.*"}, "dry_run": dryRun})
		return string(b)
	}
	before := replayJobs(t, db, id)

	var pv ReplayPreview
	if code := apiCall(t, srv, "POST", path, body(true), &pv); code != http.StatusOK {
		t.Fatalf("dry run = %d, want 200", code)
	}
	wantByTopic := map[string]int64{"order.paid": 3, "order.created": 2, "order.bulk": 6000}
	if diff := cmp.Diff(wantByTopic, pv.ByTopic); diff != "" {
		t.Errorf("dry run's by_topic (-want +got):\n%s", diff)
	}
	if pv.Events != 6005 || !pv.From.Equal(since) || !pv.To.Equal(until) || pv.Clamped || pv.Message != "" {
		t.Errorf("dry run = %+v, want 6005 events from %s to %s, not clamped", pv.ReplayWindow, since, until)
	}
	if diff := cmp.Diff(before, replayJobs(t, db, id)); diff != "" {
		t.Errorf("the dry run changed the endpoint's jobs (-before +after):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 6 {
		t.Errorf("%d jobs after the dry run, want the 6 seeded", n)
	}

	var res ReplayResult
	if code := apiCall(t, srv, "POST", path, body(false), &res); code != http.StatusOK {
		t.Fatalf("replay = %d, want 200", code)
	}
	if res.Jobs != pv.Events {
		t.Errorf("the replay enqueued %d jobs, its dry run counted %d events", res.Jobs, pv.Events)
	}
	enqueueWhole(t, db, res.ReplayID)
	if !res.From.Equal(pv.From) || !res.To.Equal(pv.To) {
		t.Errorf("the replay's window %s..%s, its dry run's %s..%s", res.From, res.To, pv.From, pv.To)
	}
	want := []string{
		"order.bulk 6000 available",
		"order.created a available 0",
		"order.created b available 0",
		"order.paid available available 0",
		"order.paid completed available 1",
		"order.paid discarded available 1",
		"order.paid new available 0",
		"order.paid retryable retryable 1",
		"order.paid running running 1",
	}
	if diff := cmp.Diff(want, replayJobs(t, db, id)); diff != "" {
		t.Errorf("the endpoint's jobs after the replay (-want +got):\n%s", diff)
	}

	// Now everything in the window waits: a second dry run counts none,
	// and a second replay enqueues none.
	var again ReplayPreview
	if code := apiCall(t, srv, "POST", path, body(true), &again); code != http.StatusOK || again.Events != 0 || len(again.ByTopic) != 0 {
		t.Errorf("dry run after the replay = %d %+v, want 0 events", code, again)
	}
	var second ReplayResult
	if code := apiCall(t, srv, "POST", path, body(false), &second); code != http.StatusOK || second.Jobs != 0 {
		t.Errorf("second replay = %d %+v, want 0 jobs", code, second)
	}
}

// Without until and topics (or with an until still to come), the window
// ends when the replay starts and takes every topic the endpoint does;
// the dry run and the replay agree there too.
func TestReplayDryRunWithoutFiltersEndsNow(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook", "order.*", "user.created")
	other := createTestEndpoint(t, srv, "http://127.0.0.1:1/other")
	seedReplayWindow(t, db, id, other)
	path := fmt.Sprintf("/api/endpoints/%d/replay", id)
	since := time.Now().Add(-3 * 24 * time.Hour).UTC().Format(time.RFC3339)
	body := func(dryRun bool) string {
		return fmt.Sprintf(`{"since": %q, "dry_run": %t}`, since, dryRun)
	}
	var pv ReplayPreview
	if code := apiCall(t, srv, "POST", path, body(true), &pv); code != http.StatusOK {
		t.Fatalf("dry run = %d, want 200", code)
	}
	// The filtered run's 6005, the order.paid after until, and
	// user.created; not billing.paid, which the endpoint does not take.
	wantByTopic := map[string]int64{"order.paid": 4, "order.created": 2, "order.bulk": 6000, "user.created": 1}
	if diff := cmp.Diff(wantByTopic, pv.ByTopic); diff != "" {
		t.Errorf("dry run's by_topic (-want +got):\n%s", diff)
	}
	if pv.Events != 6007 || time.Since(pv.To) < 0 || time.Since(pv.To) > time.Minute {
		t.Errorf("dry run = %d events to %s, want 6007 to now", pv.Events, pv.To)
	}
	// An until still to come is now as well.
	var later ReplayPreview
	if code := apiCall(t, srv, "POST", path, `{"since": "`+since+`", "until": "2999-01-01T00:00:00Z", "dry_run": true}`, &later); code != http.StatusOK ||
		later.Events != 6007 || later.To.Year() == 2999 {
		t.Errorf("dry run until 2999 = %d, %d events to %s, want 6007 to now", code, later.Events, later.To)
	}
	var res ReplayResult
	if code := apiCall(t, srv, "POST", path, body(false), &res); code != http.StatusOK || res.Jobs != pv.Events {
		t.Errorf("replay = %d, %d jobs; its dry run counted %d", code, res.Jobs, pv.Events)
	}
}

// A dry run clamps as the replay does and says so; a window that ends
// before the clamped start replays nothing, and says that too.
func TestReplayDryRunClampsAsTheReplayDoes(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook")
	mustExec(t, db, `INSERT INTO outbox.events (topic, created_at, fanned_out_at) VALUES
		('t', now() - interval '10 days', now()), ('t', now() - interval '2 days', now())`)
	path := fmt.Sprintf("/api/endpoints/%d/replay", id)
	since := time.Now().Add(-30 * 24 * time.Hour).UTC().Format(time.RFC3339)

	var pv ReplayPreview
	if code := apiCall(t, srv, "POST", path, `{"since": "`+since+`", "dry_run": true}`, &pv); code != http.StatusOK {
		t.Fatalf("dry run = %d", code)
	}
	if !pv.Clamped || !strings.Contains(pv.Message, "retention window (168h0m0s)") || pv.Events != 1 {
		t.Errorf("dry run from 30 days ago = %+v, want clamped to events retention, saying so, with 1 event", pv)
	}
	if age := pv.To.Sub(pv.From); age != 7*24*time.Hour {
		t.Errorf("dry run's window is %s long, want 168h0m0s (events retention)", age)
	}
	var res ReplayResult
	if code := apiCall(t, srv, "POST", path, `{"since": "`+since+`"}`, &res); code != http.StatusOK ||
		!res.Clamped || !strings.Contains(res.Message, "retention window (168h0m0s)") || res.Jobs != pv.Events {
		t.Errorf("replay = %d %+v, want clamped like its dry run %+v", code, res, pv)
	}

	until := time.Now().Add(-20 * 24 * time.Hour).UTC().Format(time.RFC3339)
	if code := apiCall(t, srv, "POST", path, `{"since": "`+since+`", "until": "`+until+`", "dry_run": true}`, &pv); code != http.StatusOK ||
		pv.Events != 0 || !strings.Contains(pv.Message, "so nothing is replayed") {
		t.Errorf("dry run of a window wholly before the clamp = %d %+v, want 0 events, saying why", code, pv)
	}
}

// The estimate's numbers: 10 events a second without an attempt in the
// last hour, the replay lane's share of the cap (a quarter, at least 1)
// over the mean time an attempt held its place with them, and never faster than the
// rate limit; rounded up to a second.
func TestReplayEstimateNumbers(t *testing.T) {
	t.Parallel()
	two, thousand := 2.0, 1000.0
	for _, tc := range []struct {
		name        string
		events      int64
		maxInFlight int
		liveFlows   bool
		rateLimit   *float64
		attempts    int64
		slotMS      float64
		want        int64
	}{
		{"nothing to send", 0, 16, false, nil, 0, 0, 0},
		{"no history: 10 a second", 25, 16, false, nil, 0, 0, 3},
		{"no history, limited to 2 a second", 25, 16, false, &two, 0, 0, 13},
		{"no history, a limit above the default", 25, 16, false, &thousand, 0, 0, 3},
		{"a cap of 4 replays 1 at once; 500 ms each: 2 a second", 25, 4, false, nil, 10, 500, 13},
		{"a cap of 2 still replays 1 at once", 25, 2, false, nil, 10, 500, 13},
		{"a cap of 16 replays 4 at once; 100 ms each: 40 a second", 1600, 16, false, nil, 10, 100, 40},
		{"40 a second, limited to 2", 1600, 16, false, &two, 10, 100, 800},
		{"attempts of 0 ms count as 1 ms: 4,000 a second", 16000, 16, false, nil, 10, 0, 4},
		{"live deliveries flowing: 1 at once; 100 ms each: 10 a second", 1600, 16, true, nil, 10, 100, 160},
		{"no history, live deliveries flowing: 10 a second", 25, 16, true, nil, 0, 0, 3},
	} {
		if got := estimateReplaySeconds(tc.events, tc.maxInFlight, tc.liveFlows, tc.rateLimit, tc.attempts, tc.slotMS); got != tc.want {
			t.Errorf("%s: %d s, want %d", tc.name, got, tc.want)
		}
	}
}

// Through the API, the estimate reads the endpoint's attempts of the last
// hour (older ones do not count), how long each held its place from its
// claim to its recorded outcome (not the request alone), and its settings.
func TestReplayDryRunEstimatesFromTheLastHour(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook")
	mustExec(t, db, `INSERT INTO outbox.events (topic, created_at, fanned_out_at)
		SELECT 't', now() - interval '1 day', now() - interval '1 day' FROM generate_series(1, 25)`)
	path := fmt.Sprintf("/api/endpoints/%d/replay", id)
	since := time.Now().Add(-2 * 24 * time.Hour).UTC().Format(time.RFC3339)
	estimate := func() int64 {
		t.Helper()
		var pv ReplayPreview
		if code := apiCall(t, srv, "POST", path, `{"since": "`+since+`", "dry_run": true}`, &pv); code != http.StatusOK || pv.Events != 25 {
			t.Fatalf("dry run = %d %+v, want 25 events", code, pv)
		}
		return pv.EstimatedSeconds
	}
	// Two hours ago an attempt held its place 10 s: not recent, the default.
	mustExec(t, db, `INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, outcome, attempted_at,
		finished_at, duration_ms, status_code)
		SELECT id, 1, id, 'webhook', $1, 'completed', now() - interval '2 hours 10 seconds', now() - interval '2 hours', 10000, 200
		FROM outbox.events ORDER BY id LIMIT 1`, id)
	if got := estimate(); got != 3 {
		t.Errorf("estimate with no attempt in the last hour = %d s, want 3 (25 at 10 a second)", got)
	}
	// In the last hour: a job's second attempt, a request of 100 ms
	// recorded 500 ms after its claim; 4 at once (the replay lane's share
	// of a cap of 16): 8 a second, where the request's 100 ms alone would
	// say 40 (1 s). Its first attempt, 20 minutes ago, has no claim time
	// to pair with: it does not count, or the mean would be 250 ms (2 s).
	mustExec(t, db, `UPDATE outbox.endpoints SET max_in_flight = 16 WHERE id = $1`, id)
	mustExec(t, db, `INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, outcome, attempted_at,
		finished_at, duration_ms, status_code)
		SELECT 2, a.n, e.id, 'webhook', $1, a.outcome::outbox.job_state, a.claimed, a.finished, a.took, a.status
		FROM (SELECT max(id) AS id FROM outbox.events) AS e,
		     (VALUES (1, 'retryable', NULL::timestamptz, now() - interval '20 minutes', 1, 500),
		             (2, 'completed', now() - interval '10 minutes 500 milliseconds', now() - interval '10 minutes', 100, 200))
		       AS a(n, outcome, claimed, finished, took, status)`, id)
	if got := estimate(); got != 4 {
		t.Errorf("estimate at 8 a second = %d s, want 4", got)
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET rate_limit_per_second = 2 WHERE id = $1`, id)
	if got := estimate(); got != 13 {
		t.Errorf("estimate limited to 2 a second = %d s, want 13", got)
	}
}

// Bad input answers 400 with what is wrong, in a dry run and a replay
// alike, and enqueues nothing; the same request made right enqueues.
func TestReplayRefusesBadFilters(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook", "order.*")
	mustExec(t, db, `INSERT INTO outbox.events (topic, created_at, fanned_out_at) VALUES ('order.paid', now() - interval '1 day', now())`)
	path := fmt.Sprintf("/api/endpoints/%d/replay", id)
	since := time.Now().Add(-2 * 24 * time.Hour).UTC().Format(time.RFC3339)
	earlier := time.Now().Add(-3 * 24 * time.Hour).UTC().Format(time.RFC3339)
	tooMany := make([]string, 101)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("t%d", i)
	}
	tooManyJSON, _ := json.Marshal(tooMany)
	for _, tc := range []struct {
		name, fields, want string
	}{
		{"until before since", `"since": "` + since + `", "until": "` + earlier + `"`, `"until" (` + earlier + `) must be after "since"`},
		{"until equal to since", `"since": "` + since + `", "until": "` + since + `"`, `must be after "since"`},
		{"malformed since", `"since": "yesterday"`, `"since" is "yesterday", not an RFC 3339 time`},
		{"since without a zone", `"since": "2026-05-01T00:00:00"`, `not an RFC 3339 time`},
		{"malformed until", `"since": "` + since + `", "until": "2026-13-01T00:00:00Z"`, `"until" is "2026-13-01T00:00:00Z", not an RFC 3339 time`},
		{"since left out", `"until": "` + since + `"`, `"since" (an RFC 3339 time) is required`},
		{"since in the future", `"since": "2999-01-01T00:00:00Z"`, `is in the future`},
		{"a bad topic pattern", `"since": "` + since + `", "topics": ["order.*", "order paid"]`, `topic pattern "order paid" must be`},
		{"a pattern with a wildcard inside", `"since": "` + since + `", "topics": ["order.*.paid"]`, `topic pattern "order.*.paid"`},
		{"too many patterns", `"since": "` + since + `", "topics": ` + string(tooManyJSON), `"topics" has 101 patterns, at most 100`},
		{"topics not a list", `"since": "` + since + `", "topics": "order.*"`, `topics: want an array of strings, got a string`},
		{"an unknown field", `"since": "` + since + `", "untill": "` + since + `"`, `unknown field "untill"`},
		{"dry_run not a boolean", `"since": "` + since + `", "dry_run": "yes"`, `dry_run: want true or false, got a string`},
	} {
		for _, dryRun := range []string{``, `, "dry_run": true`} {
			if strings.Contains(tc.fields, `"dry_run"`) && dryRun != "" {
				continue
			}
			var e struct{ Error string }
			code := apiCall(t, srv, "POST", path, "{"+tc.fields+dryRun+"}", &e)
			if code != http.StatusBadRequest || !strings.Contains(e.Error, tc.want) {
				t.Errorf("%s%s: %d %q, want 400 saying %q", tc.name, dryRun, code, e.Error, tc.want)
			}
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Errorf("%d jobs after refused replays, want 0", n)
	}
	var res ReplayResult
	if code := apiCall(t, srv, "POST", path, `{"since": "`+since+`", "topics": ["order.*"]}`, &res); code != http.StatusOK || res.Jobs != 1 {
		t.Errorf("the good replay = %d %+v, want 1 job", code, res)
	}
}

// The panel's replay form shows the dry run first, enqueuing nothing; its
// Confirm button posts the same request without dry_run, which enqueues
// what the preview counted. A form it cannot read answers 400.
func TestPanelReplayPreviewsBeforeItEnqueues(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook", "order.*", "user.created")
	other := createTestEndpoint(t, srv, "http://127.0.0.1:1/other")
	seedReplayWindow(t, db, id, other)
	browser := signIn(t, srv)
	path := fmt.Sprintf("/endpoints/%d/replay", id)
	const field = "2006-01-02T15:04:05" // datetime-local, as a browser sends it
	since := time.Now().Add(-3 * 24 * time.Hour).UTC().Format(field)
	until := time.Now().Add(-24 * time.Hour).UTC().Format(field)

	_, page := panelPage(t, srv, fmt.Sprintf("/endpoints/%d", id))
	mustContain(t, "the endpoint's page", page, `<input name="until" value="" pattern=`, `name="topics"`, `name="dry_run" value="1"`, "Preview replay")
	mustLack(t, "the endpoint's page", page, `id="replay-preview"`)

	code, page, _ := postPanelForm(t, browser, srv, path, url.Values{"dry_run": {"1"}, "since": {since}, "until": {until}, "topics": {"order.*, billing.*"}})
	if code != http.StatusOK {
		t.Fatalf("preview = %d, want 200:\n%s", code, page)
	}
	mustContain(t, "the preview", page, `id="replay-preview"`, `<strong id="preview-events">6005</strong>`,
		`<td><code>order.bulk</code></td><td>6000</td>`, `<td><code>order.created</code></td><td>2</td>`, `<td><code>order.paid</code></td><td>3</td>`,
		`<span id="preview-from">`+since+`Z</span>`, `<span id="preview-to">`+until+`Z</span>`,
		`<span id="preview-estimate">10m1s</span>`, // 6005 at 10 a second: no attempts yet
		`of the topics <code>order.* billing.*</code>`, `Confirm: replay 6005 events`)
	mustLack(t, "the preview", page, `id="preview-clamped"`)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 6 {
		t.Errorf("%d jobs after the preview, want the 6 seeded", n)
	}

	confirm := url.Values{}
	form := regexp.MustCompile(`(?s)<form method="post" action="` + path + `">(.*?)</form>`).FindStringSubmatch(page)
	if form == nil {
		t.Fatalf("the preview has no Confirm form:\n%s", page)
	}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="(\w+)" value="([^"]*)">`).FindAllStringSubmatch(form[1], -1) {
		confirm.Set(m[1], m[2])
	}
	if confirm.Has("dry_run") || confirm.Get("topics") != "order.* billing.*" || !strings.HasPrefix(confirm.Get("until"), until) {
		t.Errorf("the Confirm form posts %v, want the request without dry_run", confirm)
	}
	code, _, location := postPanelForm(t, browser, srv, path, confirm)
	if code != http.StatusSeeOther || !strings.Contains(location, url.QueryEscape("Replaying 6005 events")) {
		t.Errorf("confirm = %d to %q, want 303 saying it replays 6005 events", code, location)
	}
	enqueueWhole(t, db, int64(queryInt(t, db, `SELECT max(id) FROM outbox.replays`)))
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'available'`, id); n != 6006 {
		t.Errorf("%d of the endpoint's jobs available after the confirm, want 6006 (6005 enqueued, 1 waiting before)", n)
	}

	// A start before events retention: the preview says it is clamped.
	old := time.Now().Add(-30 * 24 * time.Hour).UTC().Format(field)
	code, page, _ = postPanelForm(t, browser, srv, path, url.Values{"dry_run": {"1"}, "since": {old}})
	if code != http.StatusOK {
		t.Fatalf("preview from 30 days ago = %d", code)
	}
	mustContain(t, "the clamped preview", page, `id="preview-clamped"`, "retention window (168h0m0s)")

	for _, bad := range []url.Values{
		{"dry_run": {"1"}, "since": {since}, "until": {"tomorrow"}},
		{"dry_run": {"1"}, "since": {since}, "until": {old}},
		{"dry_run": {"1"}, "since": {since}, "topics": {"order.*.paid"}},
		{"since": {since}, "until": {old}},
	} {
		before := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`)
		if code, page, _ := postPanelForm(t, browser, srv, path, bad); code != http.StatusBadRequest {
			t.Errorf("replay form %v = %d, want 400:\n%s", bad, code, page)
		}
		if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != before {
			t.Errorf("replay form %v changed the jobs: %d, then %d", bad, before, n)
		}
	}
}

// enqueueWhole enqueues the rest of replay id at once, batch after batch,
// as the workers would as its lane drained (feedReplays): what a replay
// enqueues does not depend on when.
func enqueueWhole(t *testing.T, db *sql.DB, id int64) {
	t.Helper()
	for range 1000 {
		if queryInt(t, db, `SELECT count(*) FROM outbox.replays WHERE id = $1 AND enqueued_at IS NULL`, id) == 0 {
			return
		}
		if err := feedReplay(context.Background(), db, id, defaultConfig().Workers.MaxAttempts); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("replay %d still enqueuing after 1000 batches", id)
}
