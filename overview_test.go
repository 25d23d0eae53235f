// overview_test.go: table health, old transactions and retention's last
// cycle, read from a real database and raised as alerts.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The thresholds of the health alerts, walked at their edges.
func TestEvaluateHealthAlertThresholds(t *testing.T) {
	t.Parallel()
	cfg := AlertConfig{BacklogRows: 1000, BacklogAge: 5 * time.Minute, DeadRatio: 0.2, XactAge: time.Hour}
	bloated := func(name string, dead int64, ratio float64) Overview {
		return Overview{Tables: []TableHealth{{Name: name, DeadRows: dead, DeadRatio: ratio}}}
	}
	for _, tc := range []struct {
		name string
		o    Overview
		want []string
	}{
		{"jobs past the dead ratio", bloated("jobs", 20_000, 0.21), []string{"table_bloat"}},
		{"events past the dead ratio", bloated("events", 20_000, 0.5), []string{"table_bloat"}},
		{"at the dead ratio", bloated("jobs", 20_000, 0.2), []string{}},
		{"a small table's dead rows", bloated("jobs", 9_999, 0.9), []string{}},
		{"a table that is not a queue", bloated("subjects", 50_000, 0.9), []string{}},
		{"a transaction older than the threshold", Overview{OldestXactAgeSeconds: 3601}, []string{"old_transaction"}},
		{"a transaction at the threshold", Overview{OldestXactAgeSeconds: 3600}, []string{}},
		{"the last retention cycle failed", Overview{RetentionLastCycle: &RetentionCycle{Error: "anomaly cap reached"}}, []string{"retention_failed"}},
		{"the last retention cycle succeeded", Overview{RetentionLastCycle: &RetentionCycle{}}, []string{}},
	} {
		got := alertNamesOf(evaluateAlerts(cfg, tc.o, alertStarts{}))
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// jobs_no_runner fires while any due job's kind has no live runner, and
// names each such kind with its jobs; its level is their sum, and its
// start the first of them to come due.
func TestNoRunnerAlertNamesEachKind(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if got := alertNamesOf(evaluateAlerts(defaultConfig().Alerts, Overview{}, alertStarts{})); len(got) != 0 {
		t.Errorf("alerts with every kind run: %v, want none", got)
	}
	alerts := evaluateAlerts(defaultConfig().Alerts, Overview{KindsWithoutRunner: []KindWithoutRunner{
		{Kind: "owner-notify", Jobs: 2, Since: at},
		{Kind: "sub:b", Jobs: 5, Since: at.Add(-time.Hour)},
	}}, alertStarts{})
	if len(alerts) != 1 || alerts[0].Name != "jobs_no_runner" || alerts[0].Level != 7 || !alerts[0].Since.Equal(at.Add(-time.Hour)) ||
		!strings.Contains(alerts[0].Message, "7 due jobs") || !strings.Contains(alerts[0].Message, "owner-notify (2), sub:b (5)") {
		t.Errorf("alerts %+v; want jobs_no_runner at level 7 since the older kind's jobs, naming both kinds with their jobs", alerts)
	}
}

// receiver_window_short at its threshold: a receiver's window must be
// longer than this sender's resend horizon, 272h4m49.2s at the defaults
// (7 days + the 18-attempt retry horizon); with events kept forever no
// window is long enough.
func TestReceiverWindowAlertThreshold(t *testing.T) {
	t.Parallel()
	defaults := defaultConfig().Alerts
	if defaults.ResendHorizon != 272*time.Hour+4*time.Minute+49200*time.Millisecond {
		t.Fatalf("default resend horizon %s, want 272h4m49.2s", defaults.ResendHorizon)
	}
	window := func(seconds ...int64) Overview {
		var o Overview
		for i, s := range seconds {
			o.ReceiverWindows = append(o.ReceiverWindows, ReceiverWindow{EndpointID: int64(i + 1), Seconds: s})
		}
		return o
	}
	for _, tc := range []struct {
		name    string
		horizon time.Duration
		o       Overview
		want    []string
	}{
		{"no receiver advertised a window", defaults.ResendHorizon, Overview{}, []string{}},
		{"a window a second longer", defaults.ResendHorizon, window(979_490), []string{}},
		{"a window shorter by a fraction of a second", defaults.ResendHorizon, window(979_489), []string{"receiver_window_short"}},
		{"an outboxd inbox at the defaults (288h less the interval)", defaults.ResendHorizon, window(1_033_200), []string{}},
		{"an outboxd inbox at the old default (192h less the interval)", defaults.ResendHorizon, window(687_600), []string{"receiver_window_short"}},
		{"one short among long ones", defaults.ResendHorizon, window(3_600, 1_033_200), []string{"receiver_window_short"}},
		{"events kept forever", 0, window(315_360_000), []string{"receiver_window_short"}},
	} {
		cfg := defaults
		cfg.ResendHorizon = tc.horizon
		got := alertNamesOf(evaluateAlerts(cfg, tc.o, alertStarts{}))
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	alerts := evaluateAlerts(defaults, window(3_600, 1_033_200, 687_600), alertStarts{})
	if len(alerts) != 1 || !strings.Contains(alerts[0].Message, "2 endpoints' receivers") ||
		!strings.Contains(alerts[0].Message, "endpoint 1 (1h0m0s), endpoint 3 (191h0m0s)") || !strings.Contains(alerts[0].Message, "272h4m49s") {
		t.Errorf("alerts %+v, want one naming endpoints 1 and 3 and the horizon", alerts)
	}
}

// The overview reads the dead rows vacuum has not removed yet, and the age
// of a transaction that holds a snapshot, from the database itself.
func TestOverviewReadsTableHealthAndOldTransactions(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	// Vacuum must not clean up before the overview looks.
	mustExec(t, db, `ALTER TABLE outbox.jobs SET (autovacuum_enabled = false)`)
	mustExec(t, db, `SELECT outbox.record('t', 's', '{}')`)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{
		`INSERT INTO outbox.jobs (kind, event_id, max_attempts)
		 SELECT 'sub:x', (SELECT max(id) FROM outbox.events), 18 FROM generate_series(1, 12000)`,
		`DELETE FROM outbox.jobs WHERE id > 1000`,
		// The deleting session's statistics reach the overview's session at
		// its next flush; force it rather than wait for one.
		`SELECT pg_stat_force_next_flush()`,
		`SELECT 1`,
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// A transaction that holds a snapshot, open while the overview reads
	// (repeatable read keeps its first statement's snapshot to the end).
	holder, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.ExecContext(ctx, `SELECT count(*) FROM outbox.events`); err != nil {
		t.Fatal(err)
	}

	cfg := defaultConfig().Alerts
	cfg.XactAge = time.Millisecond
	var o Overview
	waitFor(t, "the deleted jobs counted dead", 10*time.Second, func() bool {
		o, err = readOverview(ctx, db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range o.Tables {
			if h.Name == "jobs" {
				return h.DeadRows >= 11_000
			}
		}
		return false
	})
	for _, h := range o.Tables {
		if h.Name == "jobs" && (h.DeadRatio < 0.9 || h.LiveRows > 1_000) {
			t.Errorf("jobs: %d live, %d dead, ratio %.2f; want at most 1,000 live and a ratio above 0.9", h.LiveRows, h.DeadRows, h.DeadRatio)
		}
	}
	if o.OldestXactAgeSeconds <= 0 {
		t.Errorf("oldest transaction age %v s with one open, want above 0", o.OldestXactAgeSeconds)
	}
	names := alertNamesOf(o.Alerts)
	for _, want := range []string{"table_bloat", "old_transaction"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("alerts %v, want %s among them", names, want)
		}
	}
}

// A retention cycle that fails leaves its error for every replica's
// overview, which alerts until a cycle succeeds.
func TestRetentionFailureAlertsUntilACycleSucceeds(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	s := newSweeper(db, defaultConfig().Retention, "host-a:1", testLogger(t))
	// Refuse deletes from the jobs table, so the cycle fails at its first
	// sweep; one old completed job gives that sweep something to delete.
	mustExec(t, db, `SELECT outbox.record('t', 's', '{}')`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at)
		VALUES ('sub:x', (SELECT max(id) FROM outbox.events), 18, 'completed', 1, now() - interval '3 days', now() - interval '2 days')`)
	refuseDeletes(t, db, "outbox.jobs", "deletes refused by the test")

	s.cycle(ctx)
	o, err := readOverview(ctx, db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.RetentionLastCycle; c == nil || !strings.Contains(c.Error, "deletes refused by the test") {
		t.Fatalf("last cycle %+v, want the failure recorded", c)
	}
	if diff := cmp.Diff([]string{"retention_failed"}, alertNamesOf(o.Alerts)); diff != "" {
		t.Errorf("alerts after a failed cycle (-want +got):\n%s", diff)
	}

	mustExec(t, db, `DROP TRIGGER refuse_delete ON outbox.jobs`)
	s.cycle(ctx)
	o, err = readOverview(ctx, db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.RetentionLastCycle; c == nil || c.Error != "" {
		t.Errorf("last cycle %+v, want a success", c)
	}
	if len(o.Alerts) != 0 {
		t.Errorf("alerts after a good cycle: %v", alertNamesOf(o.Alerts))
	}
}

// Jobs waiting to run are split into those due now and those scheduled
// later (a backoff, a failing endpoint's delay), so that many available
// jobs with none running read as waiting, not stuck.
func TestOverviewSplitsWaitingJobsIntoDueAndLater(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `SELECT outbox.record('t', 's', '{}')`)
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, scheduled_at)
		SELECT 'sub:x', (SELECT max(id) FROM outbox.events), 18, w.state::outbox.job_state,
		       CASE WHEN w.state = 'available' THEN 0 ELSE 1 END,
		       CASE WHEN w.state = 'available' THEN NULL ELSE now() END,
		       now() + w.due_in
		FROM (VALUES ('available', interval '-1 second'), ('available', interval '0'), ('available', interval '5 minutes'),
		             ('retryable', interval '-1 minute'), ('retryable', interval '1 hour'), ('retryable', interval '2 hours'),
		             ('running', interval '-1 minute')) AS w(state, due_in)`)
	o, err := readOverview(context.Background(), db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	got := [2]int64{o.Jobs.DueNow, o.Jobs.ScheduledLater}
	if got != [2]int64{3, 3} || o.Jobs.Available != 3 || o.Jobs.Retryable != 3 || o.Jobs.Running != 1 {
		t.Errorf("jobs %+v; want 3 due now and 3 scheduled later of 3 available and 3 retryable, 1 running", o.Jobs)
	}
	// The relay's backlog and the workers' side by side: the event was
	// never fanned out (its jobs were written by hand), so it is the
	// relay's 1; the 7 unfinished jobs are the workers'.
	if o.Backlog != 1 || o.DeliveryBacklog != 7 {
		t.Errorf("backlog %d, delivery backlog %d; want 1 and 7", o.Backlog, o.DeliveryBacklog)
	}
	_, html := panelPage(t, newTestAdmin(t, db), "/")
	for id, want := range map[string]int64{"backlog": 1, "due-now": 3, "scheduled-later": 3, "running": 1} {
		if span := fmt.Sprintf(`<span class="n" id="%s">%d</span>`, id, want); !strings.Contains(html, span) {
			t.Errorf("the overview has no %s", span)
		}
	}
	for _, want := range []string{`<span id="delivery-backlog">7</span> unfinished`, `retryable 3</a>`, `available 3</a>`} {
		if !strings.Contains(html, want) {
			t.Errorf("the overview has no %s", want)
		}
	}
}

// An acknowledgement holds while the alert stays at or below its level in
// the episode acknowledged; a worse level, or an episode that begins after
// it, fires again; an alert without a known start goes by level alone.
func TestApplyAcks(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	acks := []alertAck{{Name: "jobs_discarded", Level: 5, AcknowledgedAt: at}, {Name: "table_bloat", Level: 20_000, AcknowledgedAt: at}}
	for _, tc := range []struct {
		name  string
		alert Alert
		want  bool
	}{
		{"as acknowledged", Alert{Name: "jobs_discarded", Level: 5, Since: at.Add(-time.Hour), startKnown: true}, true},
		{"better since", Alert{Name: "jobs_discarded", Level: 3, Since: at.Add(-time.Hour), startKnown: true}, true},
		{"worse: new discards", Alert{Name: "jobs_discarded", Level: 6, Since: at.Add(-time.Hour), startKnown: true}, false},
		{"a new episode", Alert{Name: "jobs_discarded", Level: 1, Since: at.Add(time.Minute), startKnown: true}, false},
		{"another alert", Alert{Name: "events_poisoned", Level: 1, Since: at.Add(-time.Hour), startKnown: true}, false},
		{"no known start, same level", Alert{Name: "table_bloat", Level: 20_000, Since: at.Add(time.Hour)}, true},
		{"no known start, worse", Alert{Name: "table_bloat", Level: 20_001, Since: at.Add(time.Hour)}, false},
	} {
		alerts := []Alert{tc.alert}
		applyAcks(alerts, acks)
		if alerts[0].Acknowledged != tc.want {
			t.Errorf("%s: acknowledged %t, want %t", tc.name, alerts[0].Acknowledged, tc.want)
		}
	}
}

// Acknowledged through the API, a discarded-jobs alert stays listed as
// acknowledged, fires again at a new discard, and answers 404 when it is
// not firing.
func TestAcknowledgeAnAlertUntilItGetsWorse(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	discard := func() {
		mustExec(t, db, `SELECT outbox.record('t', 's', '{}')`)
		mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at)
			VALUES ('sub:x', (SELECT max(id) FROM outbox.events), 18, 'discarded', 1, now(), now())`)
	}
	var alert Alert
	if status := apiCall(t, api.srv, "POST", "/api/alerts/jobs_discarded/acknowledge", "", &alert); status != http.StatusNotFound {
		t.Errorf("acknowledging an alert that does not fire: %d, want 404", status)
	}
	discard()
	if status := apiCall(t, api.srv, "POST", "/api/alerts/jobs_discarded/acknowledge", "", &alert); status != http.StatusOK || !alert.Acknowledged || alert.Level != 1 {
		t.Fatalf("acknowledge: %d %+v, want 200 with the alert acknowledged at level 1", status, alert)
	}
	firing := func() Alert {
		t.Helper()
		o, err := readOverview(context.Background(), db, defaultConfig().Alerts)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range o.Alerts {
			if a.Name == "jobs_discarded" {
				return a
			}
		}
		t.Fatal("jobs_discarded is not listed")
		return Alert{}
	}
	if a := firing(); !a.Acknowledged {
		t.Errorf("after acknowledging: %+v, want acknowledged", a)
	}
	discard()
	if a := firing(); a.Acknowledged || a.Level != 2 {
		t.Errorf("after a new discard: %+v, want level 2 and not acknowledged", a)
	}
	if _, html := panelPage(t, api.srv, "/"); !strings.Contains(html, `action="/alerts/jobs_discarded/acknowledge"`) {
		t.Errorf("the overview offers no button to acknowledge the alert again")
	}
	resp, err := signIn(t, api.srv).PostForm(api.srv.URL+"/alerts/jobs_discarded/acknowledge", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if a := firing(); resp.StatusCode != http.StatusSeeOther || !a.Acknowledged || a.Level != 2 {
		t.Errorf("the panel's button: %d, then %+v; want 303 and the alert acknowledged at level 2", resp.StatusCode, a)
	}
}

// Every alert links to the panel page that explains it, and that page
// answers: the rows it counts where it counts rows, the endpoints where it
// names endpoints, the overview's table figures for the database's health.
func TestEveryAlertLinksToItsPage(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	cfg := AlertConfig{BacklogRows: 1000, BacklogAge: 5 * time.Minute, DeadRatio: 0.2, XactAge: time.Hour, ResendHorizon: time.Hour,
		AuthFailures: func() int64 { return 50 }}
	everything := Overview{
		Backlog: 1001, Poisoned: 1,
		Jobs:                 JobCounts{Discarded: 1},
		NotifyQueueUsage:     0.5,
		Tables:               []TableHealth{{Name: "jobs", DeadRows: 20_000, DeadRatio: 0.5}},
		OldestXactAgeSeconds: 3601,
		RetentionLastCycle:   &RetentionCycle{Error: "anomaly cap reached"},
		ReceiverWindows:      []ReceiverWindow{{EndpointID: 1, Seconds: 60}},
		Endpoints:            EndpointCounts{Disabled: 1, Paused: 1},
		KindsWithoutRunner:   []KindWithoutRunner{{Kind: "sub:gone", Jobs: 1}},
	}
	got := map[string]string{}
	for _, a := range evaluateAlerts(cfg, everything, alertStarts{}) {
		got[a.Name] = a.Link
	}
	want := map[string]string{
		"events_backlog":        "/events?state=unfanned",
		"events_poisoned":       "/events?state=poisoned",
		"jobs_discarded":        "/jobs?state=discarded",
		"jobs_no_runner":        "/jobs?state=available",
		"notify_queue":          "/#tables",
		"table_bloat":           "/#tables",
		"old_transaction":       "/#tables",
		"retention_failed":      "/#tables",
		"receiver_window_short": "/endpoints",
		"endpoint_disabled":     "/endpoints",
		"endpoint_paused":       "/endpoints",
		"auth_failures":         "/#replicas",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("alert links (-want +got):\n%s", diff)
	}
	for name, link := range got {
		path, anchor, _ := strings.Cut(link, "#")
		status, page := panelPage(t, srv, path)
		if status != http.StatusOK {
			t.Errorf("%s links to %s, which answers %d", name, link, status)
		}
		if anchor != "" && !strings.Contains(page, `id="`+anchor+`"`) {
			t.Errorf("%s links to %s, but the page has no element %q", name, link, anchor)
		}
	}
	// receiver_window_short names endpoints by their windows: the list it
	// links to shows each endpoint's.
	id := createTestEndpoint(t, srv, "https://a.example/hook")
	mustExec(t, db, `UPDATE outbox.endpoints SET dedup_window_seconds = 60, dedup_window_seen_at = now() WHERE id = $1`, id)
	if _, page := panelPage(t, srv, got["receiver_window_short"]); !strings.Contains(page, `<td class="dedup-window">1m</td>`) {
		t.Errorf("receiver_window_short links to %s, which does not show endpoint %d's 60 s window", got["receiver_window_short"], id)
	}
}

// A paused endpoint's deliveries are held, neither due nor scheduled
// later, whenever they are due: counted once, as held, and with the
// paused endpoints; the delivery backlog still holds them.
func TestOverviewCountsAPausedEndpointsDeliveriesAsHeldNotDue(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `SELECT outbox.record('t', 's' || i, '{}') FROM generate_series(1, 3) AS i`)
	mustExec(t, db, `
		INSERT INTO outbox.endpoints (url, secret, paused_at)
		VALUES ('https://paused.example/', decode(repeat('ab', 32), 'hex'), now()),
		       ('https://flowing.example/', decode(repeat('ab', 32), 'hex'), NULL)`)
	// Two due deliveries to the paused endpoint, one to the flowing one,
	// and one of the paused endpoint's scheduled for later.
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at)
		SELECT 'webhook', e.id, ep.id, 18, now() + d.due_in
		FROM (VALUES ('https://paused.example/', 1, interval '-1 second'), ('https://paused.example/', 2, interval '0'),
		             ('https://flowing.example/', 1, interval '-1 second'), ('https://paused.example/', 3, interval '1 hour')) AS d(url, n, due_in)
		JOIN outbox.endpoints AS ep ON ep.url = d.url
		JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox.events) AS e ON e.n = d.n`)
	o, err := readOverview(context.Background(), db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	got := [5]int64{o.Jobs.DueNow, o.Jobs.ScheduledLater, o.Jobs.HeldByPause, o.Endpoints.PausedQueued, o.DeliveryBacklog}
	if got != [5]int64{1, 0, 3, 3, 4} {
		t.Errorf("due now, scheduled later, held by the pause (jobs, endpoints), delivery backlog = %v; want [1 0 3 3 4]", got)
	}
}

// The overview shows each fact once: with every unfinished job scheduled
// later, its number is one figure, not three (the delivery backlog, the
// scheduled, the available); and the table list leaves out the tables
// too small for their dead rows to matter, saying how many it left out.
func TestOverviewShowsEachFactOnceAndOnlyTablesThatMatter(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `SELECT outbox.record('t', 's', '{}')`)
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, scheduled_at)
		SELECT 'sub:x', (SELECT max(id) FROM outbox.events), 18, 'available', 0, now() + interval '5 minutes'
		FROM generate_series(1, 7)`)
	_, html := panelPage(t, newTestAdmin(t, db), "/")
	if n := len(regexp.MustCompile(`<span class="n"[^>]*>7</span>`).FindAllString(html, -1)); n != 1 {
		t.Errorf("the 7 jobs scheduled later are %d figures on the overview, want 1", n)
	}
	if !strings.Contains(html, `<span class="n" id="scheduled-later">7</span>`) {
		t.Error("the overview does not show the 7 jobs scheduled later")
	}
	// A fresh database: every table is tiny, so none is listed.
	tables := regexp.MustCompile(`(?s)<h2 id="tables">.*?</table>`).FindString(html)
	if strings.Contains(tables, "<td>events</td>") || strings.Contains(tables, "<td>jobs</td>") {
		t.Errorf("the overview lists tiny tables:\n%s", tables)
	}
	if !regexp.MustCompile(`<p id="small-tables">\d+ tables under 10000 rows and 64 MB not listed`).MatchString(html) {
		t.Errorf("the overview does not say it left tiny tables out:\n%s", html)
	}
	for _, tc := range []struct {
		h    TableHealth
		want bool
	}{
		{TableHealth{LiveRows: 1, DeadRows: 49}, false}, // 98% dead, 50 rows
		{TableHealth{LiveRows: 5_000, DeadRows: 4_999}, false},
		{TableHealth{LiveRows: 5_000, DeadRows: 5_000}, true},
		{TableHealth{LiveRows: 10, TotalBytes: 64 << 20}, true},
		{TableHealth{LiveRows: 10, TotalBytes: 64<<20 - 1}, false},
	} {
		if got := tc.h.Matters(); got != tc.want {
			t.Errorf("%+v matters: %v, want %v", tc.h, got, tc.want)
		}
	}
}

// Two firings of one alert have ids of their own on the overview, and
// alert messages give durations as people write them ("3m", "5m"), not
// as Go prints them ("3m0s").
func TestAlertIDsUniqueAndDurationsRough(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	a := api.createEndpoint("https://a.example/hook")
	b := api.createEndpoint("https://b.example/hook")
	mustExec(t, db, `UPDATE outbox.endpoints SET breaker_opened_at = now(), consecutive_failures = 5, failing_since = now() WHERE id IN ($1, $2)`, a.ID, b.ID)
	_, html := panelPage(t, api.srv, "/")
	ids := regexp.MustCompile(`<div class="alert[^"]*" id="([^"]+)">`).FindAllStringSubmatch(html, -1)
	var got []string
	for _, m := range ids {
		got = append(got, m[1])
	}
	if strings.Join(got, " ") != "alert-endpoint_failing alert-endpoint_failing-2" {
		t.Errorf("the overview's alert ids are %v, want alert-endpoint_failing and alert-endpoint_failing-2", got)
	}

	cfg := defaultConfig().Alerts
	now := time.Date(2025, 3, 1, 12, 0, 30, 0, time.UTC)
	first, last := time.Date(2025, 3, 1, 11, 57, 0, 0, time.UTC), time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	o := Overview{Backlog: 3, OldestUnfannedAgeSeconds: 400, EndpointHealth: []EndpointHealth{
		{ID: 7, Name: "orders", Successes: 0, Attempts: 10, FirstFailed: &first, LastFailed: &last}}}
	for _, al := range evaluateAlerts(cfg, o, alertStarts{Now: now}) {
		if regexp.MustCompile(`\d+[hm]0s\b`).MatchString(al.Message) {
			t.Errorf("%s prints a Go duration: %s", al.Name, al.Message)
		}
		want := map[string]string{"events_backlog": "the oldest for 6m 40s (threshold 5m)", "endpoint_failing": "in the last 3m succeeded"}[al.Name]
		if want != "" && !strings.Contains(al.Message, want) {
			t.Errorf("%s reads %q, want it to say %q", al.Name, al.Message, want)
		}
	}
}
