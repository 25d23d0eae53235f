// badinput_test.go: bad input at every door, with the outcome asserted:
// payloads through outbox.record and POST /api/events, endpoint URLs,
// concurrent admin actions on one row, and a database that turns read-only
// under a running outboxd.

package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// incompressible is n bytes of hex text: TOAST cannot shrink it under a
// size check.
func incompressible(n int) string {
	b := make([]byte, n/2+1)
	rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// deepJSON is an array nested n deep.
func deepJSON(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// Through outbox.record, in the application's own transaction, bad input
// fails the statement with a precise SQLSTATE, and the business write beside
// it goes nowhere: the transaction cannot commit.
func TestRecordInSQLRefusesBadPayloads(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `CREATE TABLE orders (id int PRIMARY KEY)`)
	for i, tc := range []struct {
		name    string
		topic   any
		payload any // sent as a text parameter cast to jsonb
		want    pqerror.Code
	}{
		{"malformed JSON", "order.paid", `{"amount": `, pqerror.InvalidTextRepresentation},
		{"a lone surrogate", "order.paid", `{"s": "\ud800"}`, pqerror.InvalidTextRepresentation},
		{"an escaped NUL", "order.paid", `{"s": "a\u0000b"}`, pqerror.UntranslatableCharacter},
		{"invalid UTF-8", "order.paid", []byte("{\"s\": \"\xff\xfe\"}"), pqerror.CharacterNotInRepertoire},
		{"over 1 MiB", "order.paid", `{"s": "` + incompressible(1<<20+100) + `"}`, pqerror.CheckViolation},
		{"nested 100,000 deep", "order.paid", deepJSON(100_000), pqerror.StatementTooComplex},
		{"a topic with a space", "order paid", `{}`, pqerror.CheckViolation},
		{"a NULL topic", nil, `{}`, pqerror.NotNullViolation},
	} {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(`INSERT INTO orders (id) VALUES ($1)`, i); err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(`SELECT outbox.record($1, 's', $2::text::jsonb)`, tc.topic, tc.payload)
		if pq.As(err, tc.want) == nil {
			t.Errorf("%s: %v, want SQLSTATE %s", tc.name, err, tc.want)
		}
		if err := tx.Commit(); err == nil {
			t.Errorf("%s: the transaction committed after outbox.record failed", tc.name)
		}
	}
	if n := queryInt(t, db, `SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM outbox.events)`); n != 0 {
		t.Errorf("%d business rows and events left by failed transactions, want 0", n)
	}

	// What is well-formed gets in: deep but sane nesting, an exactly
	// sized payload, a topic nobody subscribes to, and NULLs that default.
	for _, q := range []string{
		`SELECT outbox.record('order.paid', 's', (repeat('[', 1000) || repeat(']', 1000))::jsonb)`,
		`SELECT outbox.record('nobody.listens', 's', '{}')`,
		`SELECT outbox.record('order.paid', NULL, NULL)`,
	} {
		mustExec(t, db, q)
	}
}

// POST /api/events answers every bad payload with a 4xx that says what is
// wrong, never a 500, and records nothing.
func TestRecordAPIRefusesBadPayloads(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	event := func(payload string) string {
		return `{"topic": "order.paid", "subject": "1", "payload": ` + payload + `}`
	}
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"malformed body", `{"topic": "order.paid", "payload": `, 400},
		{"payload not JSON", event(`{nope}`), 400},
		{"invalid UTF-8 in the payload", event("{\"s\": \"\xff\xfe\"}"), 400},
		{"an escaped NUL in the payload", event(`{"s": "a\u0000b"}`), 400},
		{"a lone surrogate in the payload", event(`{"s": "\ud800"}`), 400},
		{"payload over 1 MiB, body under the limit", event(`{"s": "` + incompressible(1<<20+100) + `"}`), 400},
		{"body over the limit", event(`{"s": "` + incompressible(2<<20) + `"}`), 413},
		{"nested past the decoder's depth", event(deepJSON(20_000)), 400},
		{"bad topic", `{"topic": "order paid", "payload": {}}`, 400},
		{"invalid UTF-8 in the topic", "{\"topic\": \"order.\xff\", \"payload\": {}}", 400},
		{"subject too long", `{"topic": "order.paid", "subject": "` + strings.Repeat("s", 501) + `", "payload": {}}`, 400},
		{"unknown field", `{"topic": "order.paid", "payload": {}, "id": 7}`, 400},
	} {
		status, body := api.do("POST", "/api/events", tc.body)
		var answer struct{ Error string }
		if err := json.Unmarshal(body, &answer); err != nil || answer.Error == "" {
			t.Errorf("%s: answer %s is not {\"error\": ...}", tc.name, truncate(string(body), 200))
		}
		if status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, status, truncate(string(body), 200), tc.status)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 0 {
		t.Errorf("%d events recorded from bad input, want 0", n)
	}

	// Accepted: nesting the decoder and jsonb both take, invalid UTF-8 in
	// the subject (the decoder replaces it), and an unknown topic.
	for _, body := range []string{
		event(deepJSON(5000)),
		"{\"topic\": \"order.paid\", \"subject\": \"\xff\", \"payload\": {}}",
		`{"topic": "nobody.listens", "payload": {}}`,
	} {
		if status, resp := api.do("POST", "/api/events", body); status != http.StatusCreated {
			t.Errorf("%s: %d %s, want 201", truncate(body, 60), status, truncate(string(resp), 200))
		}
	}
}

// A topic no subscriber and no endpoint selects is fanned out to nothing:
// marked fanned, no job, nothing stuck in the backlog.
func TestUnknownTopicFansOutToNothing(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	api.createEndpoint("https://hooks.example.com/orders", "order.*")
	r := newTestRelay(t, db, defaultConfig().Relay, Subscriber{
		Name: "orders", Topics: []string{"order.*"},
		Handle: func(context.Context, *sql.Tx, Event) error { return nil },
	})
	mustExec(t, db, `SELECT outbox.record('nobody.listens', 's', '{}')`)
	mustExec(t, db, `SELECT outbox.record('order', 's', '{}')`) // "order.*" wants a dot
	if _, err := r.relayOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL`); n != 0 {
		t.Errorf("%d events left un-fanned, want 0", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Errorf("%d jobs for topics nobody subscribes to, want 0", n)
	}
}

// POST /api/endpoints refuses odd URLs with a 4xx, at the API, whatever the
// private-address policy.
func TestEndpointAPIRefusesOddURLs(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	for _, policy := range []endpointPolicy{testPolicy, {}} {
		api := newTestAPI(t, db, policy)
		for _, u := range []string{
			"ftp://hooks.example.com/",
			"file:///etc/passwd",
			"gopher://hooks.example.com/",
			"javascript:alert(1)",
			"data:text/plain,hi",
			"ws://hooks.example.com/",
			"http:hooks.example.com",
			"//hooks.example.com/hook",
			"http://user:secret@hooks.example.com/",
			"https://user@hooks.example.com/",
			"http://[fe80::1%25eth0]/",
			"http://[fe80::1%eth0]/",
			"http://[::1%25lo]:8080/",
			"http://" + strings.Repeat("a", 2000) + ".example.com/",
			"http://" + strings.Repeat("a.", 1000) + "example.com/",
			"http://" + strings.Repeat("a", 2100) + ".example.com/",
			"http://hooks.example.com\x00.evil.com/",
			"http://hooks.exa mple.com/",
			"",
		} {
			body, _ := json.Marshal(map[string]any{"url": u})
			status, resp := api.do("POST", "/api/endpoints", string(body))
			if status < 400 || status > 499 {
				t.Errorf("allow private %t: POST %q: %d %s, want 4xx", policy.AllowPrivate, truncate(u, 60), status, truncate(string(resp), 200))
			}
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints registered from odd URLs, want 0", n)
	}
}
