// subscribe_test.go: every subscriber outboxd registers is idempotent, and
// the subject index keeps the latest event per subject.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

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

// The relay's index of a batch equals the index of its events relayed one
// at a time, in any order: for each topic and subject the highest id, and
// nothing for events without a subject; an entry already newer than the
// batch stays.
func TestSubjectIndexOfABatchEqualsOneByOne(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	relay := newTestRelay(t, db, defaultConfig().Relay)
	var ids []int64
	for i, subject := range []string{"a", "b", "a", "", "kept", "c", "b", "a"} {
		topic := "t"
		if subject == "kept" {
			topic = "old.topic" // the index holds a later event of it
		}
		ids = append(ids, recordedEvent(t, db, topic, subject, fmt.Sprintf(`{"n": %d}`, i)).ID)
	}
	index := func(relayAll func()) []string {
		t.Helper()
		mustExec(t, db, `DELETE FROM outbox.subjects`)
		mustExec(t, db, `INSERT INTO outbox.subjects (subject, topic, last_event_id, payload, updated_at)
			VALUES ('kept', 'old.topic', 1000000, '{"newer": true}', now())`)
		mustExec(t, db, `UPDATE outbox.events SET fanned_out_at = NULL`)
		relayAll()
		return queryStrings(t, db, `SELECT subject || ' ' || topic || ' ' || last_event_id || ' ' || payload::text FROM outbox.subjects ORDER BY subject, topic`)
	}
	batch := index(func() {
		if res, err := relay.relayOnce(ctx); err != nil || res.Fanned != len(ids) {
			t.Fatalf("relay pass: %+v, %v; want %d events", res, err, len(ids))
		}
	})
	oneByOne := index(func() {
		for _, i := range []int{7, 0, 3, 5, 1, 4, 6, 2} { // the latest "a" first
			if fanned, _, err := relay.fanOut(ctx, ids[i]); err != nil || fanned != 1 {
				t.Fatalf("relay event %d alone: %d fanned, %v", ids[i], fanned, err)
			}
		}
	})
	if len(batch) != 4 {
		t.Fatalf("the batch indexed %q, want 4 subjects", batch)
	}
	if !strings.HasPrefix(batch[0], fmt.Sprintf(`a t %d {"n": 7}`, ids[7])) || batch[3] != `kept old.topic 1000000 {"newer": true}` {
		t.Errorf("the batch indexed %q, want a's latest event and the newer entry of kept left alone", batch)
	}
	if diff := cmp.Diff(batch, oneByOne); diff != "" {
		t.Errorf("one by one differs from the batch (-batch +one by one):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Errorf("%d jobs for events no one subscribes to, want 0: the relay keeps the index itself", n)
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

// Ten events for one subject in one relay batch index the latest, whose
// payload wins. An older event (a lower id) that commits later goes
// through the relay too, and changes nothing. Webhooks in the same batch
// are not coalesced.
func TestSubjectIndexCoalescesAndNeverMovesBack(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	api.createEndpoint(rc.srv.URL, "order.*")
	relay := newTestRelay(t, db, defaultConfig().Relay)
	ctx := context.Background()

	mustExec(t, db, `SELECT outbox.record('order.updated', 'order-1', jsonb_build_object('v', i)) FROM generate_series(1, 10) AS i`)
	mustExec(t, db, `SELECT outbox.record('order.updated', 'order-2', '{"v": 1}')`)
	if res, err := relay.relayOnce(ctx); err != nil || res.Claimed != 11 || res.Jobs != 11 {
		t.Fatalf("relay pass: %+v, %v; want 11 events in one batch, and 11 jobs, the webhooks", res, err)
	}
	latest := queryInt(t, db, `SELECT max(id) FROM outbox.events WHERE subject = 'order-1'`)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'webhook'`); n != 11 {
		t.Errorf("%d webhook jobs, want 11: webhooks never coalesce", n)
	}
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
	if res, err := relay.relayOnce(ctx); err != nil || res.Fanned != 1 {
		t.Fatalf("relay pass over the newer event: %+v, %v", res, err)
	}
	if got := subjectsRow(t, db, "order-1"); !strings.HasPrefix(got, fmt.Sprintf("order.updated %d ", newerID)) {
		t.Fatalf("order-1 indexed as %q, want the newer event %d", got, newerID)
	}
	if err := older.Commit(); err != nil {
		t.Fatal(err)
	}
	if res, err := relay.relayOnce(ctx); err != nil || res.Fanned != 1 {
		t.Fatalf("relay pass over the older event %d: %+v, %v", olderID, res, err)
	}
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
// indexing per topic and subject, and the index pages through both.
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
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Errorf("%d jobs for 3 events no one subscribes to, want 0", n)
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

// A database made by a build before the first release (its
// outbox.schema_applied names no release) is brought forward from the
// first migration, each file running over what it finds: here a subjects
// table keyed by subject alone, which takes the key of (subject, topic),
// its rows kept.
func TestABuildBeforeTheFirstReleaseMigratesFromTheFirstFile(t *testing.T) {
	t.Parallel()
	db, _ := newEmptyTestDB(t)
	mustExec(t, db, `CREATE SCHEMA outbox`)
	mustExec(t, db, `CREATE TABLE outbox.schema_applied (checksum text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)
	mustExec(t, db, `INSERT INTO outbox.schema_applied (checksum) VALUES ('a build before any release')`)
	mustExec(t, db, `CREATE TABLE outbox.subjects (subject text PRIMARY KEY, topic text NOT NULL, last_event_id bigint NOT NULL,
		payload jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`)
	mustExec(t, db, `INSERT INTO outbox.subjects (subject, topic, last_event_id, payload) VALUES ('42', 'order.changed', 7, '{}')`)
	var logs syncBuffer
	if err := newMigration(slog.New(slog.NewTextHandler(&logs, nil))).run(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "migration=001_0.1.0.sql") {
		t.Errorf("the first migration was not applied:\n%s", logs.String())
	}
	key := queryStrings(t, db, `SELECT a.attname FROM pg_constraint AS c
		JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
		WHERE c.conname = 'subjects_pkey' AND c.conrelid = 'outbox.subjects'::regclass ORDER BY a.attnum`)
	if diff := cmp.Diff([]string{"subject", "topic"}, key); diff != "" {
		t.Errorf("the subject index's key after migrating (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.subjects`); n != 1 {
		t.Errorf("%d rows after migrating, want the 1 kept", n)
	}
	last := len(embeddedMigrations())
	if got := migrationFinished(t, db, last); got != "finished" {
		t.Errorf("the last migration is %s, want finished", got)
	}
}
