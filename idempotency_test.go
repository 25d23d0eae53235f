// idempotency_test.go: POST /api/events with an Idempotency-Key records
// once: across a restart, under concurrent retries, and never for a
// different request under the same key; the keys are pruned with the
// events.

package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// postEvent sends body to POST /api/events at base with token and key
// (none when ""), and returns the status, the id answered (0 if none) and
// the Idempotent-Replayed header.
func postEvent(t *testing.T, base, token, key, body string) (status int, id int64, replayed string) {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/api/events", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var answer struct{ ID int64 }
	json.Unmarshal(b, &answer)
	return resp.StatusCode, answer.ID, resp.Header.Get("Idempotent-Replayed")
}

// A client whose 201 was lost retries with the same key after outboxd
// restarted: the retry answers the first event's id, says it is a replay,
// and records nothing.
func TestIdempotencyKeyHoldsAcrossARestart(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	token := rand.Text()
	const body = `{"topic": "order.paid", "subject": "o-1", "payload": {"cents": 1200}}`
	start := func() (addr string, stop func()) {
		addr = freeAddr(t)
		ctx, cancel := context.WithCancel(context.Background())
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			if err := run(ctx, []string{"-addr", addr}, envFrom(map[string]string{"DATABASE_URL": dsn, "OUTBOXD_ADMIN_TOKEN": token}), io.Discard, testWriter{t}); err != nil {
				t.Errorf("run: %v", err)
			}
		}()
		awaitHealthy(t, addr, exited)
		return addr, func() { cancel(); <-exited }
	}

	addr, stop := start()
	status, first, replayed := postEvent(t, "http://"+addr, token, "order-o-1-paid", body)
	stop()
	if status != http.StatusCreated || first == 0 || replayed != "" {
		t.Fatalf("first POST: %d id %d replayed %q, want 201 with an id and no replay header", status, first, replayed)
	}

	addr, stop = start()
	defer stop()
	status, again, replayed := postEvent(t, "http://"+addr, token, "order-o-1-paid", body)
	if status != http.StatusOK || again != first || replayed != "true" {
		t.Errorf("the retry after a restart: %d id %d replayed %q, want 200 id %d replayed true", status, again, replayed, first)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE topic = 'order.paid'`); n != 1 {
		t.Errorf("%d events recorded, want 1", n)
	}
}

// Concurrent requests with one key record one event: every one answers
// its id, one with 201 and the others as replays.
func TestIdempotencyKeyConcurrentRequestsRecordOneEvent(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	const requests = 16
	type answer struct {
		status   int
		id       int64
		replayed string
	}
	answers := make([]answer, requests)
	var wg sync.WaitGroup
	startLine := make(chan struct{})
	for i := range requests {
		wg.Go(func() {
			<-startLine
			var a answer
			a.status, a.id, a.replayed = postEvent(t, srv.URL, testToken, "k-1", `{"topic": "order.paid", "payload": {"n": 1}}`)
			answers[i] = a
		})
	}
	close(startLine)
	wg.Wait()

	events := ids(t, db, `SELECT id FROM outbox.events`)
	if len(events) != 1 {
		t.Fatalf("%d events recorded by %d requests with one key, want 1", len(events), requests)
	}
	created := 0
	for i, a := range answers {
		switch {
		case a.id != events[0]:
			t.Errorf("request %d answered id %d, want %d", i, a.id, events[0])
		case a.status == http.StatusCreated && a.replayed == "":
			created++
		case a.status != http.StatusOK || a.replayed != "true":
			t.Errorf("request %d: %d replayed %q, want 201, or 200 replayed", i, a.status, a.replayed)
		}
	}
	if created != 1 {
		t.Errorf("%d requests answered 201, want 1", created)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.idempotency_keys WHERE key = 'k-1' AND event_id = $1`, events[0]); n != 1 {
		t.Errorf("%d key rows for the event, want 1", n)
	}
}

// The same key with another request answers 422 and records nothing; a
// retry that only re-spaces its JSON is the same request; a malformed key
// is a 400; without a key, every POST records.
func TestIdempotencyKeyRefusesADifferentRequest(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	status, first, _ := postEvent(t, srv.URL, testToken, "k-2", `{"topic": "order.paid", "subject": "o-2", "payload": {"cents": 1200}}`)
	if status != http.StatusCreated {
		t.Fatalf("first POST: %d", status)
	}
	if status, id, replayed := postEvent(t, srv.URL, testToken, "k-2", `{"payload":{"cents":1200},"subject":"o-2","topic":"order.paid"}`); status != http.StatusOK || id != first || replayed != "true" {
		t.Errorf("the same request re-encoded: %d id %d replayed %q, want 200 id %d replayed true", status, id, replayed, first)
	}
	for _, body := range []string{
		`{"topic": "order.paid", "subject": "o-2", "payload": {"cents": 1300}}`,
		`{"topic": "order.refunded", "subject": "o-2", "payload": {"cents": 1200}}`,
		`{"topic": "order.paid", "subject": "o-3", "payload": {"cents": 1200}}`,
	} {
		if status, _, _ := postEvent(t, srv.URL, testToken, "k-2", body); status != http.StatusUnprocessableEntity {
			t.Errorf("key k-2 with %s: %d, want 422", body, status)
		}
	}
	for _, key := range []string{strings.Repeat("k", 256), "tab\there", "é"} {
		if status, _, _ := postEvent(t, srv.URL, testToken, key, `{"topic": "order.paid"}`); status != http.StatusBadRequest {
			t.Errorf("key %q: %d, want 400", key, status)
		}
	}
	if status, _, _ := postEvent(t, srv.URL, testToken, strings.Repeat("k", 255), `{"topic": "order.paid"}`); status != http.StatusCreated {
		t.Errorf("a key of 255 characters: %d, want 201", status)
	}
	postEvent(t, srv.URL, testToken, "", `{"topic": "order.paid"}`)
	postEvent(t, srv.URL, testToken, "", `{"topic": "order.paid"}`)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 4 {
		t.Errorf("%d events, want 4: the first, the 255-character key's and two without a key", n)
	}
}

// The retention sweep prunes keys older than events retention, after the
// events, and keeps the younger ones.
func TestRetentionPrunesIdempotencyKeys(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `
		INSERT INTO outbox.idempotency_keys (key, request_digest, event_id, created_at)
		VALUES ('old', sha256('a'), 1, now() - interval '8 days'),
		       ('young', sha256('b'), 2, now() - interval '6 days')`)
	res := sweepOnce(t, newTestSweeper(t, db, defaultConfig().Retention))
	if got := res.Deleted["idempotency_keys"]; got != 1 {
		t.Errorf("deleted %d keys, want 1", got)
	}
	var kept []string
	rows, err := db.Query(`SELECT key FROM outbox.idempotency_keys ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		rows.Scan(&k)
		kept = append(kept, k)
	}
	if diff := cmp.Diff([]string{"young"}, kept); diff != "" {
		t.Errorf("keys kept (-want +got):\n%s", diff)
	}
}
