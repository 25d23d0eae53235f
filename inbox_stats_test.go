// inbox_stats_test.go: the inbox counts what each source sent, per minute
// (received, duplicates, refused by class, the last refusal's reason), the
// retention sweep bounds those counts, and the Inbox page and the API show
// them, in total and over time.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// inboxStatsSumsSQL is outbox.inbox_stats summed per source (a test may
// cross a minute's end), one line a source: received, duplicates,
// bad_signature, stale_timestamp, unknown_source, too_large, malformed.
const inboxStatsSumsSQL = `
SELECT source || ' ' || concat_ws(' ', sum(received), sum(duplicates), sum(bad_signature), sum(stale_timestamp),
                                  sum(unknown_source), sum(too_large), sum(malformed))
FROM outbox.inbox_stats
GROUP BY source
ORDER BY source`

// Real deliveries through the HTTP handler, signed well and badly: each
// is counted once in its class, under its source (a name no source has
// under "(unknown)"), the last refusal's reason kept truncated to 200
// characters; GET /api/sources and the Inbox page show the same numbers.
func TestInboxStatsCountEveryClassAndTheLastReason(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	secret := api.createSource("billing", "")
	shopSecret := api.createSource("shop", "")
	url := api.srv.URL + "/webhooks/billing"
	body := []byte(`{"type":"invoice.paid","subject":"inv-7","data":{"cents":1200}}`)
	other := newWebhookSecret()
	longID := strings.Repeat("w", 250) // its reason is longer than 200 characters

	for _, tc := range []struct {
		name   string
		url    string
		secret []byte
		id     string
		ts     time.Time
		body   []byte
		edit   func(http.Header)
		want   int
	}{
		{"new", url, secret, "1", time.Now(), body, nil, http.StatusOK},
		{"another new", url, secret, "2", time.Now(), body, nil, http.StatusOK},
		{"duplicate", url, secret, "1", time.Now(), body, nil, http.StatusOK},
		{"old timestamp", url, secret, "3", time.Now().Add(-6 * time.Minute), body, nil, http.StatusUnauthorized},
		{"future timestamp", url, secret, "3", time.Now().Add(6 * time.Minute), body, nil, http.StatusUnauthorized},
		{"missing signature", url, secret, "3", time.Now(), body, func(h http.Header) { h.Del(headerWebhookSignature) }, http.StatusBadRequest},
		{"malformed timestamp", url, secret, "3", time.Now(), body, func(h http.Header) { h.Set(headerWebhookTimestamp, "soon") }, http.StatusBadRequest},
		{"not a webhook body", url, secret, "3", time.Now(), []byte(`[1, 2]`), nil, http.StatusBadRequest},
		{"oversize body", url, secret, "3", time.Now(), bytes.Repeat([]byte(" "), maxInboxBody+1), nil, http.StatusRequestEntityTooLarge},
		{"impossible name", api.srv.URL + "/webhooks/%ff", secret, "3", time.Now(), body, nil, http.StatusNotFound},
		{"unknown source", api.srv.URL + "/webhooks/nobody", secret, "3", time.Now(), body, nil, http.StatusNotFound},
		{"bad signature", url, other, "3", time.Now(), body, nil, http.StatusUnauthorized},
		{"bad signature, last", url, other, "last-bad", time.Now(), body, nil, http.StatusUnauthorized},
		{"shop: new", api.srv.URL + "/webhooks/shop", shopSecret, "1", time.Now(), body, nil, http.StatusOK},
		{"shop: bad signature, long id", api.srv.URL + "/webhooks/shop", other, longID, time.Now(), body, nil, http.StatusUnauthorized},
	} {
		if status := postWebhook(t, tc.url, tc.secret, tc.id, tc.ts, tc.body, tc.edit); status != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, status, tc.want)
		}
	}

	// source received duplicates bad_signature stale_timestamp unknown_source too_large malformed
	want := []string{
		"(unknown) 0 0 0 0 2 0 0",
		"billing 2 1 2 2 0 1 3",
		"shop 1 0 1 0 0 0 0",
	}
	if diff := cmp.Diff(want, queryStrings(t, db, inboxStatsSumsSQL)); diff != "" {
		t.Errorf("outbox.inbox_stats (-want +got):\n%s", diff)
	}

	status, resp := api.do("GET", "/api/sources", "")
	var list struct{ Sources []InboxSource }
	if err := json.Unmarshal(resp, &list); status != http.StatusOK || err != nil || len(list.Sources) != 2 {
		t.Fatalf("list: %d %s", status, resp)
	}
	billing := list.Sources[0].Stats
	wantBilling := InboxStats{Received: 2, Duplicates: 1, Refused: 8, BadSignature: 2, StaleTimestamp: 2, TooLarge: 1, Malformed: 3,
		LastRefusalReason: `verify webhook: webhook-id "last-bad": no matching webhook signature`}
	if billing == nil || billing.LastHour.LastRefusedAt == nil || billing.LastDay.LastRefusedAt == nil {
		t.Fatalf("billing's stats %+v, want both windows with a last refusal", billing)
	}
	// The refusal's class is kept with its reason (the newest first).
	if r := billing.LastHour.RecentRefusals; len(r) == 0 || r[0].Class != refusedBadSignature || r[0].Reason != wantBilling.LastRefusalReason {
		t.Errorf("billing's recent refusals %+v, want the last bad signature first", r)
	}
	for _, w := range []InboxStats{billing.LastHour, billing.LastDay} {
		if age := time.Since(*w.LastRefusedAt); age < 0 || age > time.Minute {
			t.Errorf("last refused %s ago, want within the test's minute", age)
		}
		w.LastRefusedAt = nil
		w.SeriesStepMinutes, w.Series, w.RecentRefusals = 0, nil, nil // TestInboxStatsOverTime's
		w.RefusalsByMinute = nil                                      // TestInboxKeepsEveryRefusalReasonOfAMinute's
		if diff := cmp.Diff(wantBilling, w); diff != "" {
			t.Errorf("billing's stats in GET /api/sources (-want +got):\n%s", diff)
		}
	}
	shopReason := list.Sources[1].Stats.LastHour.LastRefusalReason
	if n := len([]rune(shopReason)); n != 200 || !strings.HasPrefix(shopReason, `verify webhook: webhook-id "www`) || !strings.HasSuffix(shopReason, "w…") {
		t.Errorf("shop's last reason %q (%d characters), want its first 199 and an ellipsis: 200", shopReason, n)
	}

	code, page := panelPage(t, api.srv, "/sources")
	if code != http.StatusOK {
		t.Fatalf("GET /sources: %d", code)
	}
	for _, row := range []string{
		// received duplicates refused bad_signature stale_timestamp unknown_source too_large malformed
		`<td rowspan="2">billing</td><td>last hour</td>
  <td>2</td><td>1</td><td>8</td>
  <td>2</td><td>2</td><td>0</td><td>1</td><td>3</td>`,
		`<td>last 24 h</td>
  <td>2</td><td>1</td><td>8</td>
  <td>2</td><td>2</td><td>0</td><td>1</td><td>3</td>`,
		`<td rowspan="2">unknown source</td><td>last hour</td>
  <td>0</td><td>0</td><td>2</td>
  <td>0</td><td>0</td><td>2</td><td>0</td><td>0</td>`,
		`<small>verify webhook: webhook-id &#34;last-bad&#34;: no matching webhook signature</small>`,
		`<small>no inbox source &#34;nobody&#34;</small>`,
	} {
		if !strings.Contains(page, row) {
			t.Errorf("the Inbox page lacks\n%s\nin:\n%s", row, page)
		}
	}
}

// seedInboxStatsSQL writes minutes of outbox.inbox_stats, each $1[i]
// minutes before the current one, of source $2[i], with received $3[i],
// duplicates $4[i], bad signatures $5[i], and a last refusal $6[i] of
// class $7[i] (both NULL for none, the class alone for a row counted
// before classes were kept) $8[i] seconds into the minute; and answers
// the current minute.
const seedInboxStatsSQL = `
WITH seeded AS (
  INSERT INTO outbox.inbox_stats (minute, source, received, duplicates, bad_signature,
                                  last_refusal_reason, last_refusal_class, last_refused_at)
  SELECT date_trunc('minute', now()) - make_interval(mins => ago), source, received, duplicates, bad,
         reason, class,
         CASE WHEN reason IS NOT NULL THEN date_trunc('minute', now()) - make_interval(mins => ago) + make_interval(secs => secs) END
  FROM unnest($1::int[], $2::text[], $3::int[], $4::int[], $5::int[], $6::text[], $7::text[], $8::int[])
       AS s(ago, source, received, duplicates, bad, reason, class, secs)
  RETURNING 1
)
SELECT date_trunc('minute', now()), (SELECT count(*) FROM seeded)`

// A source's numbers over time come from outbox.inbox_stats' minutes, all
// sources in one read: the last hour a point a minute (the current one
// last), the last 24 hours a point per 15 minutes counted from the
// window's first minute; minutes outside a window are not in it; the
// recent refusals are the distinct last reasons of the points, newest
// first, at most 5, with their class. GET /api/sources and the Inbox
// page show them.
func TestInboxStatsOverTime(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	api.createSource("billing", "")
	api.createSource("shop", "")

	type row struct {
		ago                  int
		source               string
		received, duplicates int
		bad                  int
		reason, class        *string
		secs                 int
	}
	text := func(s string) *string { return &s }
	rows := []row{
		{ago: 0, source: "billing", received: 3, duplicates: 1},
		{ago: 1, source: "billing", received: 2, bad: 1, reason: text("reason A"), class: text("bad_signature"), secs: 10},
		{ago: 5, source: "billing", received: 4, bad: 2, reason: text("reason B"), class: text("bad_signature"), secs: 5},
		{ago: 6, source: "billing", bad: 1, reason: text("reason A"), class: text("bad_signature"), secs: 50},               // older A: not again
		{ago: 59, source: "billing", received: 7},                                                                           // the hour's first minute, and the day's point 92
		{ago: 60, source: "billing", received: 11},                                                                          // before the hour: the day's point 91 ...
		{ago: 74, source: "billing", received: 13},                                                                          // ... with this one (1,439 - 74 = 1,365 = 91 × 15)
		{ago: 75, source: "billing", received: 17, bad: 1, reason: text("reason C"), class: text("bad_signature"), secs: 1}, // point 90
		{ago: 600, source: "billing", bad: 1, reason: text("reason D"), secs: 1},                                            // counted before classes
		{ago: 700, source: "billing", bad: 1, reason: text("reason E"), class: text("bad_signature"), secs: 1},
		{ago: 800, source: "billing", bad: 1, reason: text("reason F"), class: text("bad_signature"), secs: 1}, // the sixth: left out
		{ago: 1439, source: "billing", received: 19},                                                           // the day's first minute, point 0
		{ago: 1440, source: "billing", received: 23},                                                           // before the day
		{ago: 2, source: "shop", duplicates: 5},
	}
	var ago, received, duplicates, bad, secs []int64
	var sources []string
	var reasons, classes []sql.NullString
	for _, r := range rows {
		ago, received, duplicates, bad, secs = append(ago, int64(r.ago)), append(received, int64(r.received)),
			append(duplicates, int64(r.duplicates)), append(bad, int64(r.bad)), append(secs, int64(r.secs))
		sources = append(sources, r.source)
		reasons = append(reasons, nullString(r.reason))
		classes = append(classes, nullString(r.class))
	}

	// The current minute may end between the seeding and the reads: then
	// everything is a minute older than seeded, and the test seeds again.
	var list struct{ Sources []InboxSource }
	var page string
	for try := 0; ; try++ {
		mustExec(t, db, `DELETE FROM outbox.inbox_stats`)
		var seededAt time.Time
		var n int
		if err := db.QueryRow(seedInboxStatsSQL, pq.Array(ago), pq.Array(sources), pq.Array(received), pq.Array(duplicates),
			pq.Array(bad), pq.Array(reasons), pq.Array(classes), pq.Array(secs)).Scan(&seededAt, &n); err != nil || n != len(rows) {
			t.Fatalf("seed: %d rows, %v", n, err)
		}
		status, resp := api.do("GET", "/api/sources", "")
		if err := json.Unmarshal(resp, &list); status != http.StatusOK || err != nil || len(list.Sources) != 2 {
			t.Fatalf("list: %d %s", status, resp)
		}
		var code int
		if code, page = panelPage(t, api.srv, "/sources"); code != http.StatusOK {
			t.Fatalf("GET /sources: %d", code)
		}
		var now time.Time
		if err := db.QueryRow(statsNowSQL).Scan(&now); err != nil {
			t.Fatal(err)
		}
		if now.Equal(seededAt) {
			break
		}
		if try == 2 {
			t.Fatalf("the minute ended during each of 3 tries")
		}
	}

	billing := list.Sources[0].Stats
	hour, day := billing.LastHour, billing.LastDay
	if hour.SeriesStepMinutes != 1 || len(hour.Series) != 60 || day.SeriesStepMinutes != 15 || len(day.Series) != 96 {
		t.Fatalf("series of %d points %d minutes apart and %d points %d minutes apart, want 60 × 1 and 96 × 15",
			len(hour.Series), hour.SeriesStepMinutes, len(day.Series), day.SeriesStepMinutes)
	}
	if step := hour.Series[59].From.Sub(hour.Series[58].From); step != time.Minute {
		t.Errorf("hour's points %s apart", step)
	}
	if gap := hour.Series[59].From.Sub(day.Series[95].From); gap != 15*time.Minute-time.Minute {
		t.Errorf("the day's last point starts %s before the current minute, want 14m0s", gap)
	}
	// Every point that is not zero, by index: received duplicates refused.
	nonZero := func(series []InboxPoint) map[int]string {
		m := map[int]string{}
		for i, p := range series {
			if p != (InboxPoint{From: p.From}) {
				m[i] = fmt.Sprintf("%d %d %d", p.Received, p.Duplicates, p.Refused)
			}
		}
		return m
	}
	if diff := cmp.Diff(map[int]string{59: "3 1 0", 58: "2 0 1", 54: "4 0 2", 53: "0 0 1", 0: "7 0 0"}, nonZero(hour.Series)); diff != "" {
		t.Errorf("billing's last hour, by point (-want +got):\n%s", diff)
	}
	// 1,439 minutes before now is point 0; n minutes before now is point
	// (1,439 - n) / 15: 0-14 are 95, 59 is 92, 60-74 are 91, 75 is 90,
	// 600 is 55, 700 is 49, 800 is 42.
	if diff := cmp.Diff(map[int]string{95: "9 1 4", 92: "7 0 0", 91: "24 0 0", 90: "17 0 1", 55: "0 0 1", 49: "0 0 1", 42: "0 0 1", 0: "19 0 0"},
		nonZero(day.Series)); diff != "" {
		t.Errorf("billing's last 24 hours, by point (-want +got):\n%s", diff)
	}
	totals := func(st InboxStats) string {
		return fmt.Sprintf("%d %d %d %d", st.Received, st.Duplicates, st.Refused, st.BadSignature)
	}
	if got := totals(hour) + " / " + totals(day); got != "16 1 4 4 / 76 1 8 8" {
		t.Errorf("billing's totals (received duplicates refused bad_signature) %s, want 16 1 4 4 / 76 1 8 8", got)
	}

	recent := func(st InboxStats) []string {
		var lines []string
		for _, r := range st.RecentRefusals {
			lines = append(lines, fmt.Sprintf("%s %s %q", hour.Series[59].From.Sub(r.At), r.Class, r.Reason))
		}
		return lines
	}
	if diff := cmp.Diff([]string{`50s bad_signature "reason A"`, `4m55s bad_signature "reason B"`}, recent(hour)); diff != "" {
		t.Errorf("billing's recent refusals in the last hour (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{`50s bad_signature "reason A"`, `4m55s bad_signature "reason B"`, `1h14m59s bad_signature "reason C"`,
		`9h59m59s  "reason D"`, `11h39m59s bad_signature "reason E"`}, recent(day)); diff != "" {
		t.Errorf("billing's recent refusals in the last 24 hours (-want +got):\n%s", diff)
	}
	if hour.LastRefusalReason != "reason A" || hour.LastRefusedAt == nil || !hour.LastRefusedAt.Equal(hour.RecentRefusals[0].At) {
		t.Errorf("billing's last refusal %q at %v, want the newest recent one", hour.LastRefusalReason, hour.LastRefusedAt)
	}

	shop := list.Sources[1].Stats
	if diff := cmp.Diff(map[int]string{57: "0 5 0"}, nonZero(shop.LastHour.Series)); diff != "" {
		t.Errorf("shop's last hour (-want +got):\n%s", diff)
	}
	if len(shop.LastDay.RecentRefusals) != 0 || shop.LastDay.LastRefusedAt != nil {
		t.Errorf("shop's refusals %+v, want none", shop.LastDay.RecentRefusals)
	}

	// The page: a chart a window for each source that sent something,
	// with its legend's totals, and billing's recent refusals; the unknown
	// names' bucket, empty, says so.
	if n := strings.Count(page, `<svg class="dchart"`); n != 4 {
		t.Errorf("the Inbox page has %d charts, want 4: 2 for each of billing and shop", n)
	}
	for _, want := range []string{
		`aria-label="webhooks to billing received, duplicate and refused, per minute over the last hour"`,
		"received (new): 16", "duplicates: 1", "refused: 4", // billing's hour
		"received (new): 76", "refused: 8", // billing's day
		`<polyline class="received"`, `<polyline class="refused"`, "per 15 minutes", "one point per 15 minutes",
		`<td><code>bad_signature</code></td><td><small>reason E</small></td>`,
		`<td>—</td><td><small>reason D</small></td>`,
		"No refusals in the last 24 hours.", // shop's
		"<h3>unknown source</h3>\n<p>Nothing sent in the last 24 hours.</p>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the Inbox page lacks %s", want)
		}
	}
	if strings.Contains(page, "reason F") {
		t.Errorf("the Inbox page shows a sixth recent refusal")
	}
}

// nullString is s as a parameter: NULL for nil.
func nullString(s *string) sql.NullString {
	if s == nil {
		return sql.NullString{}
	}
	return sql.NullString{String: *s, Valid: true}
}

// The sweep deletes the minutes older than -delivery-stats-retention
// (7 days) and no others.
func TestInboxStatsRetentionDeletesOnlyOldMinutes(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `
		INSERT INTO outbox.inbox_stats (minute, source, received)
		SELECT date_trunc('minute', now() - age), source, 1
		FROM unnest(ARRAY['billing', 'shop', 'billing', 'shop', '(unknown)'],
		            ARRAY['30 days', '7 days 2 minutes', '6 days 23 hours 58 minutes', '1 hour', '0']::interval[])
		     AS s(source, age)`)
	cfg := defaultConfig().Retention
	if cfg.DeliveryStats != 7*24*time.Hour {
		t.Fatalf("default -delivery-stats-retention = %v, want 168h", cfg.DeliveryStats)
	}
	cfg.BatchSize = 1 // two rows to go: two batches
	sw := newSweeper(db, cfg, "test", testLogger(t))
	res, err := sw.sweepOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Deleted["inbox_stats"]; got != 2 {
		t.Errorf("deleted %d rows, want 2", got)
	}
	left := queryStrings(t, db, `
		SELECT source || ' ' || justify_interval(date_trunc('minute', now()) - minute)::text
		FROM outbox.inbox_stats
		ORDER BY minute`)
	if diff := cmp.Diff([]string{"billing 6 days 23:58:00", "shop 01:00:00", "(unknown) 00:00:00"}, left); diff != "" {
		t.Errorf("rows left, by age (-want +got):\n%s", diff)
	}
}

// Deliveries at once add to their source's minute (the upsert loses none),
// and the counts agree with the dedup: of 10 concurrent deliveries of one
// webhook-id one is received and 9 are duplicates.
func TestInboxStatsConcurrentDeliveriesAddUp(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	secret := api.createSource("billing", "")
	url := api.srv.URL + "/webhooks/billing"
	body := []byte(`{"type":"invoice.paid","data":{}}`)
	ids := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
	for range 10 {
		ids = append(ids, "same")
	}
	statuses := make(chan string, len(ids))
	for _, id := range ids {
		go func() {
			req, err := http.NewRequest("POST", url, bytes.NewReader(body))
			if err != nil {
				statuses <- err.Error()
				return
			}
			setWebhookHeaders(req.Header, [][]byte{secret}, id, time.Now(), body)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				statuses <- err.Error()
				return
			}
			resp.Body.Close()
			statuses <- resp.Status
		}()
	}
	for range ids {
		if s := <-statuses; s != "200 OK" {
			t.Errorf("delivery: %s, want 200 OK", s)
		}
	}
	// source received duplicates bad_signature stale_timestamp unknown_source too_large malformed
	if diff := cmp.Diff([]string{"billing 11 9 0 0 0 0 0"}, queryStrings(t, db, inboxStatsSumsSQL)); diff != "" {
		t.Errorf("outbox.inbox_stats (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 11 {
		t.Errorf("%d events, want 11", n)
	}
}

// A minute keeps every refusal reason with its count, not only its last:
// in the database, in GET /api/sources and on the Inbox page; and at most
// maxRefusalReasons of them, the rest counted under their class and
// "(other reasons)".
func TestInboxKeepsEveryRefusalReasonOfAMinute(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	secret := api.createSource("billing", "")
	url := api.srv.URL + "/webhooks/billing"
	body := []byte(`{"type":"invoice.paid","subject":"inv-7","data":{"cents":1200}}`)
	other := newWebhookSecret()
	for _, tc := range []struct {
		secret []byte
		ts     time.Time
		edit   func(http.Header)
		want   int
	}{
		{other, time.Now(), nil, http.StatusUnauthorized},
		{other, time.Now(), nil, http.StatusUnauthorized},
		{secret, time.Now().Add(-6 * time.Minute), nil, http.StatusUnauthorized},
		{secret, time.Now(), func(h http.Header) { h.Del(headerWebhookSignature) }, http.StatusBadRequest},
	} {
		if status := postWebhook(t, url, tc.secret, "1", tc.ts, body, tc.edit); status != tc.want {
			t.Fatalf("status %d, want %d", status, tc.want)
		}
	}
	byClass := map[string]int{}
	rows, err := db.Query(`SELECT split_part(r.key, ' ', 1), sum(r.value::bigint) FROM outbox.inbox_stats AS s, jsonb_each_text(s.refusal_reasons) AS r
WHERE s.source = 'billing' GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var class string
		var n int
		if err := rows.Scan(&class, &n); err != nil {
			t.Fatal(err)
		}
		byClass[class] = n
	}
	rows.Close()
	if diff := cmp.Diff(map[string]int{"bad_signature": 2, "stale_timestamp": 1, "malformed": 1}, byClass); diff != "" {
		t.Errorf("refusal reasons kept, by class (-want +got):\n%s", diff)
	}

	var list struct{ Sources []InboxSource }
	if code := apiCall(t, api.srv, "GET", "/api/sources", "", &list); code != http.StatusOK || len(list.Sources) != 1 {
		t.Fatalf("GET /api/sources: %d %+v", code, list)
	}
	counts := map[string]int64{}
	for _, r := range list.Sources[0].Stats.LastHour.RefusalsByMinute {
		counts[r.Class+" "+r.Reason] += r.Count
	}
	if len(counts) != 3 {
		t.Errorf("the API's refusals by minute %+v, want 3 reasons", counts)
	}
	_, page := panelPage(t, api.srv, "/sources")
	table := between(page, `<table class="refusals-by-minute">`, `</table>`)
	for key, n := range counts {
		class, reason, _ := strings.Cut(key, " ")
		row := fmt.Sprintf(`<td><code>%s</code></td><td><small>%s</small></td><td class="count">%d</td>`, class, template.HTMLEscapeString(reason), n)
		if !strings.Contains(table, row) {
			t.Errorf("the Inbox page's refusals by minute lack %s:\n%s", row, table)
		}
	}

	// A sender that varies its mistakes: one transaction is one minute
	// (now() stands still in it), 25 reasons counted, 20 kept.
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for i := range 25 {
		if _, err := tx.Exec(countRefusedSQL, "varied", "malformed", fmt.Sprintf("reason %d", i), maxRefusalReasons); err != nil {
			t.Fatal(err)
		}
	}
	var keys, others int
	if err := tx.QueryRow(`SELECT (SELECT count(*) FROM jsonb_object_keys(refusal_reasons)), coalesce((refusal_reasons ->> 'malformed (other reasons)')::int, 0)
FROM outbox.inbox_stats WHERE source = 'varied'`).Scan(&keys, &others); err != nil {
		t.Fatal(err)
	}
	if keys != 21 || others != 5 {
		t.Errorf("25 reasons in a minute kept as %d keys with %d under other reasons, want 20 reasons and 5 others (21 keys)", keys, others)
	}
}
