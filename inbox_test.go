// inbox_test.go: the inbox records a signed webhook once, refuses what it
// cannot verify, and changes nothing on a duplicate or a refusal.

package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// createSource adds an inbox source through the API; secret "" lets the
// server generate one. It returns the secret's bytes.
func (a *testAPI) createSource(name, secret string) []byte {
	a.t.Helper()
	body, _ := json.Marshal(map[string]string{"name": name, "secret": secret})
	status, resp := a.do("POST", "/api/sources", string(body))
	if status != http.StatusCreated {
		a.t.Fatalf("create source %s: %d %s", name, status, resp)
	}
	var s inboxSourceWithSecret
	if err := json.Unmarshal(resp, &s); err != nil {
		a.t.Fatal(err)
	}
	key, err := parseWebhookSecret(s.Secret)
	if err != nil {
		a.t.Fatal(err)
	}
	return key
}

// postWebhook sends body to url as a Standard Webhooks delivery signed
// with secret at ts, without the admin token, and returns the status.
func postWebhook(t *testing.T, url string, secret []byte, id string, ts time.Time, body []byte, edit func(http.Header)) int {
	t.Helper()
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	setWebhookHeaders(req.Header, [][]byte{secret}, id, ts, body)
	req.Header.Set("Content-Type", "application/json")
	if edit != nil {
		edit(req.Header)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// inboxState is everything a received webhook may change.
type inboxState struct {
	Events []string // "topic subject payload"
	Inbox  []string // "source webhook_id has-event"
}

func readInboxState(t *testing.T, db *sql.DB) inboxState {
	t.Helper()
	var s inboxState
	for _, q := range []struct {
		sql string
		out *[]string
	}{
		{`SELECT topic || ' ' || subject || ' ' || payload::text FROM outbox.events ORDER BY id`, &s.Events},
		{`SELECT source || ' ' || webhook_id || ' ' || (event_id IS NOT NULL)::text FROM outbox.inbox ORDER BY received_at, webhook_id`, &s.Inbox},
	} {
		rows, err := db.Query(q.sql)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			*q.out = append(*q.out, v)
		}
		rows.Close()
	}
	return s
}

// A valid delivery is recorded once as a local event under the source's
// prefix; the same webhook-id again answers 200 and changes nothing; every
// refusal gets its status and changes nothing; none needs the admin token.
func TestInboxRecordsOnceAndRefusesWhatItCannotVerify(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	secret := api.createSource("billing", "")
	url := api.srv.URL + "/webhooks/billing"
	body := []byte(`{"id":"41","type":"invoice.paid","subject":"inv-7","timestamp":"2026-01-02T03:04:05Z","data":{"cents":1200}}`)

	if status := postWebhook(t, url, secret, "41", time.Now(), body, nil); status != http.StatusOK {
		t.Fatalf("valid delivery: status %d, want 200", status)
	}
	want := inboxState{
		Events: []string{`billing.invoice.paid inv-7 {"cents": 1200}`},
		Inbox:  []string{"billing 41 true"},
	}
	if diff := cmp.Diff(want, readInboxState(t, db)); diff != "" {
		t.Fatalf("after the delivery (-want +got):\n%s", diff)
	}

	// The sender's retry: same webhook-id, a later timestamp, signed anew.
	if status := postWebhook(t, url, secret, "41", time.Now().Add(time.Second), body, nil); status != http.StatusOK {
		t.Errorf("duplicate: status %d, want 200", status)
	}
	if diff := cmp.Diff(want, readInboxState(t, db)); diff != "" {
		t.Errorf("after the duplicate (-want +got):\n%s", diff)
	}

	other := newWebhookSecret()
	for _, tc := range []struct {
		name   string
		url    string
		secret []byte
		ts     time.Time
		body   []byte
		edit   func(http.Header)
		want   int
	}{
		{"bad signature", url, other, time.Now(), body, nil, http.StatusUnauthorized},
		{"old timestamp", url, secret, time.Now().Add(-6 * time.Minute), body, nil, http.StatusUnauthorized},
		{"future timestamp", url, secret, time.Now().Add(6 * time.Minute), body, nil, http.StatusUnauthorized},
		{"body changed after signing", url, secret, time.Now(), body, func(h http.Header) {
			h.Set(headerWebhookSignature, signWebhook(secret, "42", time.Now(), []byte(`{"type":"x"}`)))
		}, http.StatusUnauthorized},
		{"missing signature", url, secret, time.Now(), body, func(h http.Header) { h.Del(headerWebhookSignature) }, http.StatusBadRequest},
		{"malformed timestamp", url, secret, time.Now(), body, func(h http.Header) { h.Set(headerWebhookTimestamp, "soon") }, http.StatusBadRequest},
		{"unknown source", api.srv.URL + "/webhooks/nobody", secret, time.Now(), body, nil, http.StatusNotFound},
		{"oversize body", url, secret, time.Now(), bytes.Repeat([]byte(" "), maxInboxBody+1), nil, http.StatusRequestEntityTooLarge},
		{"verified but not a webhook body", url, secret, time.Now(), []byte(`[1, 2]`), nil, http.StatusBadRequest},
		{"verified but a bad type", url, secret, time.Now(), []byte(`{"type": "no spaces allowed"}`), nil, http.StatusBadRequest},
	} {
		id := "42"
		if status := postWebhook(t, tc.url, tc.secret, id, tc.ts, tc.body, tc.edit); status != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, status, tc.want)
		}
		if diff := cmp.Diff(want, readInboxState(t, db)); diff != "" {
			t.Errorf("%s changed the database (-want +got):\n%s", tc.name, diff)
		}
	}
}

// Sources through the API: the secret can be given (the sender's own) or
// generated; a rotation keeps the old secret verifying for the window; a
// deleted source's URL answers 404.
func TestInboxSourcesAPIAndRotation(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	senderSecret := newWebhookSecret()
	got := api.createSource("shop", senderSecret.Encode())
	if !bytes.Equal(got, senderSecret) {
		t.Fatalf("created with the sender's secret, answered another")
	}
	status, resp := api.do("POST", "/api/sources", `{"name": "shop"}`)
	if status != http.StatusBadRequest {
		t.Errorf("second source of one name: %d %s, want 400", status, resp)
	}
	status, resp = api.do("POST", "/api/sources", `{"name": "Bad Name"}`)
	if status != http.StatusBadRequest {
		t.Errorf("bad name: %d %s, want 400", status, resp)
	}

	status, resp = api.do("GET", "/api/sources", "")
	var list struct{ Sources []InboxSource }
	if err := json.Unmarshal(resp, &list); status != http.StatusOK || err != nil {
		t.Fatalf("list: %d %s", status, resp)
	}
	if len(list.Sources) != 1 || list.Sources[0].TopicPrefix != "shop." || list.Sources[0].URLPath != "/webhooks/shop" || strings.Contains(string(resp), "secret\"") {
		t.Errorf("list: %s", resp)
	}

	newSecret := newWebhookSecret()
	status, resp = api.do("POST", "/api/sources/shop/rotate-secret", `{"secret": "`+newSecret.Encode()+`"}`)
	if status != http.StatusOK {
		t.Fatalf("rotate: %d %s", status, resp)
	}
	url := api.srv.URL + "/webhooks/shop"
	for i, secret := range [][]byte{senderSecret, newSecret} {
		body := []byte(`{"type":"order.created","subject":"o-` + strconv.Itoa(i) + `","data":{}}`)
		if status := postWebhook(t, url, secret, "r-"+strconv.Itoa(i), time.Now(), body, nil); status != http.StatusOK {
			t.Errorf("secret %d during the rotation window: %d, want 200", i, status)
		}
	}
	mustExec(t, db, `UPDATE outbox.inbox_sources SET previous_secret_expires_at = now() - interval '1 second'`)
	if status := postWebhook(t, url, senderSecret, "r-old", time.Now(), []byte(`{"type":"t"}`), nil); status != http.StatusUnauthorized {
		t.Errorf("old secret after the window: %d, want 401", status)
	}

	if status, resp := api.do("DELETE", "/api/sources/shop", ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", status, resp)
	}
	if status := postWebhook(t, url, newSecret, "r-2", time.Now(), []byte(`{"type":"t"}`), nil); status != http.StatusNotFound {
		t.Errorf("deleted source: %d, want 404", status)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 2 {
		t.Errorf("%d events recorded, want 2", n)
	}
}

// With a key a source's secrets are stored sealed and verify as before;
// a replica without the key cannot read them and answers 503, recording
// nothing, rather than verify with the sealed bytes.
func TestInboxSourceSecretsSealedAtRest(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newSealingTestAPI(t, db, testBox(t, testSecretsKey(1), ""))
	first := api.createSource("shop", "")
	second := newWebhookSecret()
	if status, resp := api.do("POST", "/api/sources/shop/rotate-secret", `{"secret": "`+second.Encode()+`"}`); status != http.StatusOK {
		t.Fatalf("rotate: %d %s", status, resp)
	}
	secret, previous := storedSecrets(t, db, sourceSecretsQuery, "shop")
	if !isSealed(secret) || !isSealed(previous) {
		t.Errorf("stored %d and %d bytes, want both sealed", len(secret), len(previous))
	}
	url := api.srv.URL + "/webhooks/shop"
	for i, key := range [][]byte{first, second} {
		body := []byte(`{"type":"order.created","subject":"o-` + strconv.Itoa(i) + `"}`)
		if status := postWebhook(t, url, key, "w-"+strconv.Itoa(i), time.Now(), body, nil); status != http.StatusOK {
			t.Errorf("secret %d: %d, want 200", i, status)
		}
	}

	withoutKey := newTestAPI(t, db, testPolicy)
	if status := postWebhook(t, withoutKey.srv.URL+"/webhooks/shop", second, "w-2", time.Now(), []byte(`{"type":"t"}`), nil); status != http.StatusServiceUnavailable {
		t.Errorf("without the key: %d, want 503", status)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.inbox`); n != 2 {
		t.Errorf("%d webhooks recorded, want 2", n)
	}
}

// A source name no source can have (invalid UTF-8, which PostgreSQL
// refuses with SQLSTATE 22021, or a NUL) is an unknown source: 404 with
// a JSON error, and nothing logged, as for any other unknown name.
func TestInboxAnswersImpossibleSourceNamesNotFound(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv, logs := newLoggingTestServer(t, db)
	for _, path := range []string{"/webhooks/%ff", "/webhooks/%00", "/webhooks/a%00b", "/webhooks/" + strings.Repeat("a", 51)} {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(`{"type":"t"}`))
		if err != nil {
			t.Fatal(err)
		}
		var answer map[string]string
		decodeErr := json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || decodeErr != nil || answer["error"] == "" {
			t.Errorf("POST %s: %d %v (%v), want 404 with an error", path, resp.StatusCode, answer, decodeErr)
		}
	}
	if logs.String() != "" {
		t.Errorf("log after posts to impossible sources:\n%s\nwant nothing", logs.String())
	}
}

// The inbox advertises its dedup window on its answers, in whole seconds;
// an inbox that keeps its records forever advertises none.
func TestInboxAdvertisesItsDedupWindow(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig()
	if got := advertisedWindow(cfg.Retention.Inbox, cfg.Retention.Interval); got != 287*time.Hour {
		t.Fatalf("advertised window at the defaults %s, want 287h (288h less the 1h interval)", got)
	}
	policy := testPolicy
	policy.InboxWindow = 287 * time.Hour
	api := newTestAPI(t, db, policy)
	secret := api.createSource("billing", "")
	post := func(srv string, id string) (int, string) {
		t.Helper()
		body := []byte(`{"type":"invoice.paid","data":{}}`)
		req, err := http.NewRequest("POST", srv+"/webhooks/billing", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		setWebhookHeaders(req.Header, [][]byte{secret}, id, time.Now(), body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Webhook-Dedup-Window")
	}
	for _, id := range []string{"1", "1"} { // recorded, then a duplicate
		if status, window := post(api.srv.URL, id); status != http.StatusOK || window != "1033200" {
			t.Errorf("webhook %s: %d with webhook-dedup-window %q, want 200 with 1033200", id, status, window)
		}
	}
	forever := newTestAPI(t, db, testPolicy) // InboxWindow 0: records kept
	if status, window := post(forever.srv.URL, "2"); status != http.StatusOK || window != "" {
		t.Errorf("inbox keeping its records: %d with webhook-dedup-window %q, want 200 without it", status, window)
	}
}

// A source's secret is 24 to 64 bytes, as Standard Webhooks asks: one
// given through the API outside that range is refused with a 400 saying
// the rule, and none given generates 32 bytes. A shorter secret stored
// before the rule verifies nothing, not even a delivery it signed, and
// the refusal the Inbox page shows says to rotate it; once rotated, the
// sender's deliveries under the new secret are recorded.
func TestInboxSourceSecretsAre24To64Bytes(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	for _, tc := range []struct {
		secret string
		want   int
	}{
		{"whsec_AA==", http.StatusBadRequest},
		{webhookSecret(bytes.Repeat([]byte{7}, 23)).Encode(), http.StatusBadRequest},
		{webhookSecret(bytes.Repeat([]byte{7}, 24)).Encode(), http.StatusCreated},
		{webhookSecret(bytes.Repeat([]byte{7}, 64)).Encode(), http.StatusCreated},
		{webhookSecret(bytes.Repeat([]byte{7}, 65)).Encode(), http.StatusBadRequest},
	} {
		n, _ := parseWebhookSecret(tc.secret)
		body, _ := json.Marshal(map[string]string{"name": "s" + strconv.Itoa(len(n)), "secret": tc.secret})
		status, resp := api.do("POST", "/api/sources", string(body))
		if status != tc.want || status == http.StatusBadRequest && !strings.Contains(errorOf(t, resp), "Standard Webhooks asks for 24 to 64") {
			t.Errorf("a %d-byte secret: %d %s, want %d (a 400 saying 24 to 64)", len(n), status, resp, tc.want)
		}
	}
	if key := api.createSource("generated", ""); len(key) != 32 {
		t.Errorf("a generated secret is %d bytes, want 32", len(key))
	}
	if status, resp := api.do("POST", "/api/sources/s24/rotate-secret", `{"secret": "whsec_AA=="}`); status != http.StatusBadRequest {
		t.Errorf("rotating to a 1-byte secret: %d %s, want 400", status, resp)
	}

	mustExec(t, db, `INSERT INTO outbox.inbox_sources (name, secret, topic_prefix) VALUES ('legacy', '\x01', 'legacy.')`)
	url := api.srv.URL + "/webhooks/legacy"
	body := []byte(`{"type": "invoice.paid", "data": {}}`)
	if status := postWebhook(t, url, []byte{1}, "w-1", time.Now(), body, nil); status != http.StatusUnauthorized {
		t.Errorf("a delivery signed with the stored 1-byte secret: %d, want 401", status)
	}
	var reason string
	if err := db.QueryRow(`SELECT last_refusal_reason FROM outbox.inbox_stats WHERE source = 'legacy'`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "1 bytes, under the 24 Standard Webhooks asks; rotate it (POST /api/sources/legacy/rotate-secret)") {
		t.Errorf("the refusal's reason %q does not say to rotate the short secret", reason)
	}
	status, resp := api.do("POST", "/api/sources/legacy/rotate-secret", "")
	if status != http.StatusOK {
		t.Fatalf("rotate: %d %s", status, resp)
	}
	var rotated inboxSourceWithSecret
	json.Unmarshal(resp, &rotated)
	key, _ := parseWebhookSecret(rotated.Secret)
	if status := postWebhook(t, url, []byte{1}, "w-2", time.Now(), body, nil); status != http.StatusUnauthorized {
		t.Errorf("the 1-byte secret inside its rotation window: %d, want 401", status)
	}
	if status := postWebhook(t, url, key, "w-3", time.Now(), body, nil); status != http.StatusOK {
		t.Errorf("a delivery signed with the rotated secret: %d, want 200", status)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE topic = 'legacy.invoice.paid'`); n != 1 {
		t.Errorf("%d events recorded, want only the one the rotated secret signed", n)
	}
}
