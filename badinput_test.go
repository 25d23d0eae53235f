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
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
		{"invalid UTF-8 in the subject", "{\"topic\": \"order.paid\", \"subject\": \"\xff\", \"payload\": {}}", 400},
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

	// Accepted: nesting the decoder and jsonb both take, and an unknown
	// topic.
	for _, body := range []string{
		event(deepJSON(5000)),
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

// apiStatus is testAPI.do for goroutines: it reports instead of failing.
func apiStatus(a *testAPI, method, path, body string) (int, error) {
	req, err := http.NewRequest(method, a.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Requeue while relaying: two relays drain a backlog, half of it poisoned,
// while requeues hit every event. Each requeue answers 200 (it was
// un-fanned) or 404 (already fanned), and in the end every event is fanned
// once, with one job per subscriber and endpoint, none poisoned.
func TestRequeueWhileRelaying(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	api.createEndpoint("https://hooks.example.com/all")
	recordN(t, db, "order.paid", 300)
	mustExec(t, db, `UPDATE outbox.events SET poisoned_at = now(), relay_attempts = 5, relay_error = 'injected' WHERE id % 2 = 0`)
	ids := make([]int64, 0, 300)
	rows, err := db.Query(`SELECT id FROM outbox.events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		ids = append(ids, id)
	}
	rows.Close()

	cfg := defaultConfig().Relay
	cfg.BatchSize = 20
	ctx, cancel := context.WithCancel(context.Background())
	var relays sync.WaitGroup
	for range 2 {
		r := newTestRelay(t, db, cfg, noopSubscriber("audit"))
		relays.Go(func() {
			for ctx.Err() == nil {
				if _, err := r.relayOnce(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("relay pass: %v", err)
					return
				}
			}
		})
	}
	var requeues sync.WaitGroup
	var unexpected atomic.Int64
	for w := range 4 {
		requeues.Go(func() {
			for i := w; i < len(ids); i += 4 {
				status, err := apiStatus(api, "POST", "/api/events/"+itoa(ids[i])+"/requeue", "")
				if err != nil || (status != http.StatusOK && status != http.StatusNotFound) {
					unexpected.Add(1)
					t.Errorf("requeue %d: %d %v, want 200 or 404", ids[i], status, err)
				}
			}
		})
	}
	requeues.Wait()
	cancel()
	relays.Wait()
	// Whatever was requeued after the last pass. A pass cancelled above may
	// still hold its rows for a moment (its rollback is asynchronous), and
	// SKIP LOCKED passes over them: pass again until nothing is left, as the
	// sweep would.
	final := newTestRelay(t, db, cfg, noopSubscriber("audit"))
	waitFor(t, "the backlog to drain", 30*time.Second, func() bool {
		if _, err := final.relayOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL`) == 0
	})

	for id, n := range jobsPerEvent(t, db) {
		if n != 2 {
			t.Errorf("event %d has %d jobs, want 2 (the subscriber and the endpoint)", id, n)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL OR poisoned_at IS NOT NULL`); n != 0 {
		t.Errorf("%d events un-fanned or poisoned after every requeue, want 0", n)
	}
}

// Re-enable while disabling: enable and disable race on one endpoint while
// events are recorded, relayed and delivered. Every call answers 200; the
// row stays consistent (a reason exactly when disabled); and every job for
// the endpoint ends either delivered (the receiver has its webhook-id) or
// discarded as "disabled; not sent", nothing in between and nothing gone.
func TestEnableWhileDisablingLosesNothing(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL + "/hook")
	runWebhookWorkers(t, db, 5*time.Second)

	path := "/api/endpoints/" + itoa(ep.ID)
	var wg sync.WaitGroup
	for _, action := range []string{"/enable", "/disable", "/enable", "/disable"} {
		wg.Go(func() {
			for range 40 {
				status, err := apiStatus(api, "POST", path+action, `{"reason": "flapping"}`)
				if err != nil || status != http.StatusOK {
					t.Errorf("POST %s: %d %v, want 200", action, status, err)
				}
			}
		})
	}
	wg.Go(func() {
		r := newTestRelay(t, db, defaultConfig().Relay)
		for i := range 100 {
			if _, err := recordEvent(context.Background(), db, "order.paid", itoa(int64(i)), nil); err != nil {
				t.Errorf("record: %v", err)
			}
			if _, err := r.relayOnce(context.Background()); err != nil {
				t.Errorf("relay: %v", err)
			}
		}
	})
	wg.Wait()
	relayAll(t, db)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE (disabled_at IS NULL) <> (disabled_reason IS NULL)`); n != 0 {
		t.Errorf("endpoint disabled without a reason or with one while enabled")
	}
	if st := api.endpoint(ep.ID).State; st != endpointEnabled && st != endpointDisabled {
		t.Errorf("state after the race = %q, want enabled or disabled", st)
	}
	// Only the deliveries: each disable also records an outboxd.endpoint
	// event whose owner notification these workers do not run.
	waitFor(t, "every delivery to end", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'webhook' AND state NOT IN ('completed', 'discarded')`) == 0
	})
	got := map[string]bool{}
	for _, r := range rc.requests() {
		got[r.Header.Get("webhook-id")] = true
	}
	rows, err := db.Query(`SELECT event_id, state, errors::text FROM outbox.jobs WHERE endpoint_id = $1`, ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	jobs := 0
	for rows.Next() {
		var eventID int64
		var state, errs string
		if err := rows.Scan(&eventID, &state, &errs); err != nil {
			t.Fatal(err)
		}
		jobs++
		switch {
		case state == "completed" && got[itoa(eventID)]:
		case state == "discarded" && strings.Contains(errs, "disabled") && !got[itoa(eventID)]:
		default:
			t.Errorf("event %d: job %s (errors %s), received %t: want delivered, or discarded as disabled and not sent", eventID, state, errs, got[itoa(eventID)])
		}
	}
	if jobs == 0 {
		t.Error("no job was ever enqueued for the flapping endpoint; the race was not run")
	}
}

// A database that turns read-only under a running outboxd (an operator's
// freeze), simulated with ALTER DATABASE ... SET
// default_transaction_read_only and cut connections so every new session
// starts read-only: outboxd reports it (log, a 5xx on POST /api/events),
// claims no job, poisons nothing, and when the database is writable again
// delivers every event recorded before.
//
// The setting is only a default: lib/pq begins every explicit transaction
// READ WRITE, so the relay's transactions still fan out; the workers'
// single-statement claim is what the freeze stops. A real standby refuses
// READ WRITE too.
func TestReadOnlyDatabaseLosesNothing(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	rc := newReceiver(t, nil)
	addr := freeAddr(t)
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		run(ctx, []string{"-addr", addr, "-database-url", dsn, "-admin-token", testToken, "-allow-private-endpoints",
			"-relay-sweep", "100ms", "-job-poll", "100ms", "-webhook-timeout", "2s"}, envFrom(nil), io.Discard, &logs)
	}()
	defer func() { cancel(); <-exited }()
	awaitHealthy(t, addr, exited)
	api := &testAPI{t: t, srv: &httptest.Server{URL: "http://" + addr}}
	api.createEndpoint(rc.srv.URL + "/hook")

	// The test's own session, opened before the switch, stays writable:
	// it stands for the events committed before the database went
	// read-only as far as outboxd can tell.
	own, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	readOnly := func(on bool) {
		t.Helper()
		value := map[bool]string{true: "on", false: "off"}[on]
		for _, q := range []string{
			`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = ` + value + `', current_database()); END $$`,
			`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			 WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`,
		} {
			if _, err := own.ExecContext(context.Background(), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	readOnly(true)
	var ids []int64
	for i := range 20 {
		var id int64
		if err := own.QueryRowContext(context.Background(), `SELECT outbox.record('order.paid', $1, '{}')`, itoa(int64(i))).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}

	waitFor(t, "outboxd to report the read-only database in its log", 30*time.Second, func() bool {
		return strings.Contains(logs.String(), "read-only transaction")
	})
	if status, _ := apiStatus(api, "POST", "/api/events", `{"topic": "order.paid", "payload": {}}`); status < 500 {
		t.Errorf("POST /api/events on a read-only database: %d, want a 5xx", status)
	}
	// Every event is still in the backlog or has its job waiting, the
	// endpoint's delivery.
	var o Overview
	if status := apiCallJSON(t, addr, "/api/overview", &o); status != http.StatusOK || o.Backlog+o.Jobs.Available+o.Jobs.Retryable != 20 {
		t.Errorf("overview on a read-only database: %d, backlog %d, jobs waiting %d, want 200 and backlog + waiting = 20", status, o.Backlog, o.Jobs.Available+o.Jobs.Retryable)
	}
	if n := len(rc.requests()); n != 0 {
		t.Errorf("%d webhooks sent while the database was read-only, want 0 (a job cannot be claimed)", n)
	}
	var touched int
	if err := own.QueryRowContext(context.Background(),
		`SELECT count(*) FROM outbox.events WHERE relay_attempts > 0 OR poisoned_at IS NOT NULL`).Scan(&touched); err != nil {
		t.Fatal(err)
	}
	if touched != 0 {
		t.Errorf("%d events counted a relay failure or poisoned by the outage, want 0", touched)
	}

	readOnly(false)
	waitFor(t, "every event recorded while read-only to be delivered", 60*time.Second, func() bool {
		got := map[string]bool{}
		for _, r := range rc.requests() {
			got[r.Header.Get("webhook-id")] = true
		}
		for _, id := range ids {
			if !got[itoa(id)] {
				return false
			}
		}
		return true
	})
}

// apiCallJSON GETs path from a running outboxd with the test token.
func apiCallJSON(t *testing.T, addr, path string, out any) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}
