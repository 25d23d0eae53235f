// subscribe_test.go: every subscriber outboxd registers is idempotent, and
// the subject index keeps the latest event per subject.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// sampleTopics are topics a subscriber's patterns select, one per pattern.
func sampleTopics(patterns []string) []string {
	if len(patterns) == 0 {
		patterns = []string{"*"}
	}
	var topics []string
	for _, p := range patterns {
		switch {
		case p == "*":
			topics = append(topics, "sample.created", "sample.updated")
		case strings.HasSuffix(p, ".*"):
			topics = append(topics, strings.TrimSuffix(p, "*")+"sample")
		default:
			topics = append(topics, p)
		}
	}
	return topics
}

// recordedEvent records an event and reads it back as a worker gets it.
func recordedEvent(t *testing.T, db *sql.DB, topic, subject, payload string) Event {
	t.Helper()
	ctx := context.Background()
	id, err := recordEvent(ctx, db, topic, subject, json.RawMessage(payload))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := getEvent(ctx, db, id)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// tableSnapshot is every user table of the database: its row count and a
// hash of its rows' text, in order.
func tableSnapshot(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.Query(`
		SELECT schemaname, tablename
		FROM pg_tables
		WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
		ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var schema, table string
		if err := rows.Scan(&schema, &table); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, pq.QuoteIdentifier(schema)+"."+pq.QuoteIdentifier(table))
	}
	rows.Close()
	snap := map[string]string{}
	for _, table := range tables {
		var n int
		var hash string
		err := db.QueryRow(`SELECT count(*), coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), '') FROM `+table+` AS t`).Scan(&n, &hash)
		if err != nil {
			t.Fatal(err)
		}
		snap[table] = fmt.Sprintf("%d rows %s", n, hash)
	}
	return snap
}

// Every subscriber of the default registry, given every event twice, has
// the effect of once: the whole database after the second delivery equals
// the database after the first. The registry is run()'s own, so a new
// subscriber that is not idempotent fails here without anyone editing this
// test.
func TestEveryRegisteredSubscriberIsIdempotent(t *testing.T) {
	t.Parallel()
	subs := defaultSubscribers(true, testLogger(t)).all() // with -demo's subscriber too
	if len(subs) == 0 {
		t.Fatal("the default registry is empty")
	}
	for _, sub := range subs {
		t.Run(sub.Name, func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			ctx := context.Background()
			var events []Event
			for i, topic := range sampleTopics(sub.Topics) {
				for j, subject := range []string{"s-1", "s-2", "s-1", ""} {
					events = append(events, recordedEvent(t, db, topic, subject, fmt.Sprintf(`{"topic": %q, "n": %d}`, topic, i*10+j)))
				}
			}
			deliverAll := func() {
				t.Helper()
				for _, ev := range events {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					if err := sub.Handle(ctx, tx, ev); err != nil {
						tx.Rollback()
						t.Fatalf("event %d: %v", ev.ID, err)
					}
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
				}
			}
			deliverAll()
			once := tableSnapshot(t, db)
			deliverAll()
			twice := tableSnapshot(t, db)
			if diff := cmp.Diff(once, twice); diff != "" {
				t.Errorf("subscriber %s: a second delivery of every event changed the database (-once +twice):\n%s", sub.Name, diff)
			}
			if sub.HandleBatch == nil {
				return
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := sub.HandleBatch(ctx, tx, events); err != nil {
				tx.Rollback()
				t.Fatalf("batch: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(once, tableSnapshot(t, db)); diff != "" {
				t.Errorf("subscriber %s: a batch of events already delivered changed the database (-before +after):\n%s", sub.Name, diff)
			}
		})
	}
}

// The subject index's HandleBatch leaves the index as Handle does, event
// by event in the batch's order: for each topic and subject the highest
// id, whatever order the events come in, and nothing for events without a
// subject.
func TestSubjectIndexBatchEqualsOneByOne(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	sub := subjectIndexSubscriber()
	mustExec(t, db, `INSERT INTO outbox.subjects (subject, topic, last_event_id, payload, updated_at)
		VALUES ('kept', 'old.topic', 1000000, '{"newer": true}', now())`)
	var events []Event
	for i, subject := range []string{"a", "b", "a", "", "kept", "c", "b", "a"} {
		topic := "t"
		if subject == "kept" {
			topic = "old.topic" // the index holds a later event of it
		}
		events = append(events, recordedEvent(t, db, topic, subject, fmt.Sprintf(`{"n": %d}`, i)))
	}
	events[0], events[len(events)-1] = events[len(events)-1], events[0] // the latest "a" comes first

	index := func(handle func(tx *sql.Tx) error) []string {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() // each way starts from the same index
		if err := handle(tx); err != nil {
			t.Fatal(err)
		}
		return queryStrings(t, tx, `SELECT subject || ' ' || topic || ' ' || last_event_id || ' ' || payload::text FROM outbox.subjects ORDER BY subject, topic`)
	}
	oneByOne := index(func(tx *sql.Tx) error {
		for _, ev := range events {
			if err := sub.Handle(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	})
	batch := index(func(tx *sql.Tx) error { return sub.HandleBatch(ctx, tx, events) })
	if len(oneByOne) != 4 {
		t.Fatalf("one by one indexed %q, want 4 subjects", oneByOne)
	}
	if diff := cmp.Diff(oneByOne, batch); diff != "" {
		t.Errorf("batch differs from one by one (-one by one +batch):\n%s", diff)
	}
}

// subjectsRow reads one subject's index entry as "topic event payload".
func subjectsRow(t *testing.T, db *sql.DB, subject string) string {
	t.Helper()
	var topic, payload string
	var eventID int64
	err := db.QueryRow(`SELECT topic, last_event_id, payload::text FROM outbox.subjects WHERE subject = $1`, subject).Scan(&topic, &eventID, &payload)
	if err == sql.ErrNoRows {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s %d %s", topic, eventID, payload)
}

// Ten events for one subject in one relay batch make one subject-index
// job, for the latest, whose payload wins. An older event (a lower id)
// that commits later goes through the relay too, and changes nothing.
// Webhooks in the same batch are not coalesced.
func TestSubjectIndexCoalescesAndNeverMovesBack(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	api.createEndpoint(rc.srv.URL, "order.*")
	relay := newTestRelay(t, db, defaultConfig().Relay, subjectIndexSubscriber())
	cfg := defaultConfig().Workers
	cfg.PollInterval = 20 * time.Millisecond
	runPool(t, db, cfg, subjectIndexSubscriber())
	ctx := context.Background()

	mustExec(t, db, `SELECT outbox.record('order.updated', 'order-1', jsonb_build_object('v', i)) FROM generate_series(1, 10) AS i`)
	mustExec(t, db, `SELECT outbox.record('order.updated', 'order-2', '{"v": 1}')`)
	if res, err := relay.relayOnce(ctx); err != nil || res.Claimed != 11 {
		t.Fatalf("relay pass: %+v, %v; want 11 events in one batch", res, err)
	}
	latest := queryInt(t, db, `SELECT max(id) FROM outbox.events WHERE subject = 'order-1'`)
	var jobEvents []int
	rows, err := db.Query(`SELECT e.subject, j.event_id FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id WHERE j.kind = 'sub:subjects' ORDER BY e.subject`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var subject string
		var id int
		if err := rows.Scan(&subject, &id); err != nil {
			t.Fatal(err)
		}
		jobEvents = append(jobEvents, id)
	}
	rows.Close()
	if len(jobEvents) != 2 || jobEvents[0] != latest {
		t.Fatalf("subject-index jobs for events %v, want one for order-1's latest (%d) and one for order-2", jobEvents, latest)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'webhook'`); n != 11 {
		t.Errorf("%d webhook jobs, want 11: webhooks never coalesce", n)
	}
	waitFor(t, "the index jobs", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'sub:subjects' AND state = 'completed'`) == 2
	})
	want := fmt.Sprintf(`order.updated %d {"v": 10}`, latest)
	if got := subjectsRow(t, db, "order-1"); got != want {
		t.Fatalf("order-1 indexed as %q, want %q", got, want)
	}

	// An older event commits after a newer one of the same subject.
	older, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback()
	olderID, err := recordEvent(ctx, older, "order.updated", "order-1", json.RawMessage(`{"v": "older"}`))
	if err != nil {
		t.Fatal(err)
	}
	newerID, _ := recordEvent(ctx, db, "order.updated", "order-1", json.RawMessage(`{"v": "newer"}`))
	if _, err := relay.relayOnce(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the newer event indexed", 10*time.Second, func() bool {
		return strings.HasPrefix(subjectsRow(t, db, "order-1"), fmt.Sprintf("order.updated %d ", newerID))
	})
	if err := older.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.relayOnce(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the older event's job", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'sub:subjects' AND event_id = $1 AND state = 'completed'`, olderID) == 1
	})
	want = fmt.Sprintf(`order.updated %d {"v": "newer"}`, newerID)
	if got := subjectsRow(t, db, "order-1"); got != want {
		t.Errorf("after the older event: order-1 indexed as %q, want %q", got, want)
	}

	// The search, by prefix; LIKE's wildcards in the prefix are literal.
	var page struct{ Subjects []SubjectEntry }
	if status := apiCall(t, api.srv, "GET", "/api/subjects?prefix=order-", "", &page); status != http.StatusOK {
		t.Fatalf("GET /api/subjects: %d", status)
	}
	var names []string
	for _, s := range page.Subjects {
		names = append(names, s.Subject)
	}
	if diff := cmp.Diff([]string{"order-1", "order-2"}, names); diff != "" {
		t.Errorf("subjects by prefix (-want +got):\n%s", diff)
	}
	if status := apiCall(t, api.srv, "GET", "/api/subjects?prefix=order_", "", &page); status != http.StatusOK || len(page.Subjects) != 0 {
		t.Errorf("prefix order_ matched %d subjects, want 0 (the _ is literal)", len(page.Subjects))
	}

	// The panel's page, signed in.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	if resp, err := browser.PostForm(api.srv.URL+"/login", url.Values{"token": {testToken}}); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	resp, err := browser.Get(api.srv.URL + "/subjects?prefix=order-1")
	if err != nil {
		t.Fatal(err)
	}
	html, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(html), "<td>order-1</td>") || strings.Contains(string(html), "<td>order-2</td>") {
		t.Errorf("panel /subjects?prefix=order-1: %d\n%s", resp.StatusCode, html)
	}
}

// Rows of two watched tables that share a primary key value have the same
// subject; each keeps its own entry in the subject index, one relay pass
// coalescing per topic and subject, and the index pages through both.
func TestSubjectIndexKeepsWatchedTablesApart(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)`,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL)`,
		`SELECT outbox.watch('orders', 'order.changed', NULL)`,
		`SELECT outbox.watch('accounts', 'account.changed', NULL)`,
		`INSERT INTO orders VALUES (42, 'new')`,
		`UPDATE orders SET status = 'paid' WHERE id = 42`,
		`INSERT INTO accounts VALUES (42, 'Ada')`,
	} {
		mustExec(t, db, q)
	}
	logger := testLogger(t)
	subs := defaultSubscribers(false, logger)
	res, err := newRelay(db, defaultConfig().Relay, 18, fanOutTargets(subs), logger).relayOnce(ctx)
	if err != nil || res.Fanned != 3 {
		t.Fatalf("relay: %+v, %v; want 3 events fanned out", res, err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'sub:subjects'`); n != 2 {
		t.Errorf("%d subject-index jobs for 3 events of 2 topics and one subject, want 2 (one per topic and subject)", n)
	}
	if _, err := newWorkerPool(db, defaultConfig().Workers, 0, subs, nil, logger).workOnce(ctx, 10); err != nil {
		t.Fatal(err)
	}
	got := queryStrings(t, db, `SELECT subject || ' ' || topic || ' ' || (payload->'new'->>'id') FROM outbox.subjects ORDER BY subject, topic`)
	if diff := cmp.Diff([]string{"42 account.changed 42", "42 order.changed 42"}, got); diff != "" {
		t.Errorf("subject index (-want +got):\n%s", diff)
	}
	if s := queryStrings(t, db, `SELECT payload->'new'->>'status' FROM outbox.subjects WHERE topic = 'order.changed'`); len(s) != 1 || s[0] != "paid" {
		t.Errorf("the order's entry holds %q, want its latest status paid", s)
	}

	first, err := listSubjects(ctx, db, "4", subjectCursor{}, 1)
	if err != nil || len(first) != 1 {
		t.Fatalf("first page: %v, %v", first, err)
	}
	second, err := listSubjects(ctx, db, "4", cursorAfter(first), 1)
	if err != nil || len(second) != 1 || second[0].Topic == first[0].Topic {
		t.Errorf("pages of one: %v then %v (%v); want each topic's entry once", first, second, err)
	}
}

// An index made when subjects alone were the key takes the new key when
// schema.sql is applied again, its rows kept.
func TestSubjectIndexKeyMigratesInPlace(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `ALTER TABLE outbox.subjects DROP CONSTRAINT subjects_pkey, ADD CONSTRAINT subjects_pkey PRIMARY KEY (subject)`)
	mustExec(t, db, `INSERT INTO outbox.subjects (subject, topic, last_event_id, payload) VALUES ('42', 'order.changed', 7, '{}')`)
	mustExec(t, db, schemaSQL)
	key := queryStrings(t, db, `SELECT a.attname FROM pg_constraint AS c
		JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
		WHERE c.conname = 'subjects_pkey' AND c.conrelid = 'outbox.subjects'::regclass ORDER BY a.attnum`)
	if diff := cmp.Diff([]string{"subject", "topic"}, key); diff != "" {
		t.Errorf("the subject index's key after migrating (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.subjects`); n != 1 {
		t.Errorf("%d rows after migrating, want the 1 kept", n)
	}
}
