// inbox_stats_test.go: the inbox counts what each source sent, per minute
// (received, duplicates, refused by class, the last refusal's reason), the
// retention sweep bounds those counts, and the Inbox page and the API show
// them.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
	for _, w := range []InboxStats{billing.LastHour, billing.LastDay} {
		if age := time.Since(*w.LastRefusedAt); age < 0 || age > time.Minute {
			t.Errorf("last refused %s ago, want within the test's minute", age)
		}
		w.LastRefusedAt = nil
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
