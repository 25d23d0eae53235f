// outbox_test.go: hop 1, a business write and its event commit together.

package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRecordIsPartOfTheCallersTransaction(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE orders (id int PRIMARY KEY, status text)`)

	// Rolled back: neither the change nor the event.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO orders VALUES (1, 'new')`); err != nil {
		t.Fatal(err)
	}
	if _, err := recordEvent(ctx, tx, "order.created", "1", json.RawMessage(`{"n":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 0 {
		t.Fatalf("after rollback: %d events, want 0", n)
	}

	// Committed: exactly one event, with what was recorded.
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO orders VALUES (2, 'new')`); err != nil {
		t.Fatal(err)
	}
	id, err := recordEvent(ctx, tx, "order.created", "2", json.RawMessage(`{"n": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 1 {
		t.Fatalf("after commit: %d events, want 1", n)
	}
	ev, err := getEvent(ctx, db, id)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{ev.Topic, ev.Subject, string(ev.Payload)}
	if diff := cmp.Diff([]string{"order.created", "2", `{"n": 2}`}, got); diff != "" {
		t.Errorf("recorded event (-want +got):\n%s", diff)
	}
	if ev.FannedOutAt != nil || ev.PoisonedAt != nil {
		t.Errorf("a new event is un-fanned and not poisoned, got fanned %v poisoned %v", ev.FannedOutAt, ev.PoisonedAt)
	}
}

func TestRecordRefusesBadInput(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, topic, subject string
		payload              string
	}{
		{"empty topic", "", "s", `{}`},
		{"topic with space", "order created", "s", `{}`},
		{"topic starting with a dot", ".order", "s", `{}`},
		{"subject too long", "t", string(make([]byte, 501)), `{}`},
		{"payload not JSON", "t", "s", `{nope`},
	} {
		if _, err := recordEvent(ctx, db, tc.topic, tc.subject, json.RawMessage(tc.payload)); err == nil {
			t.Errorf("%s: recorded, want an error", tc.name)
		}
	}
	// The database refuses the same things when the application calls
	// outbox.record directly, without outboxd's Go checks.
	if _, err := db.Exec(`SELECT outbox.record('order created', 's', '{}')`); err == nil {
		t.Error("outbox.record took a topic with a space")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 0 {
		t.Errorf("%d events recorded from bad input, want 0", n)
	}
}

func TestWatchRecordsRealChangesOnly(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `CREATE TABLE accounts (id int PRIMARY KEY, email text, plan text, seen_at timestamptz)`)
	mustExec(t, db, `SELECT outbox.watch('accounts', 'account.changed', ARRAY['email', 'plan'])`)
	// Watching again replaces the triggers rather than doubling them.
	mustExec(t, db, `SELECT outbox.watch('accounts', 'account.changed', ARRAY['email', 'plan'])`)

	mustExec(t, db, `INSERT INTO accounts VALUES (7, 'a@example.com', 'free', now())`)
	mustExec(t, db, `UPDATE accounts SET seen_at = now() WHERE id = 7`)               // unwatched column: no event
	mustExec(t, db, `UPDATE accounts SET plan = 'free' WHERE id = 7`)                 // same value: no event
	mustExec(t, db, `UPDATE accounts SET plan = 'pro' WHERE id = 7`)                  // watched: one event
	mustExec(t, db, `UPDATE accounts SET email = NULL WHERE id = 7`)                  // to NULL is a change
	mustExec(t, db, `UPDATE accounts SET email = NULL, seen_at = now() WHERE id = 7`) // NULL to NULL is not
	mustExec(t, db, `DELETE FROM accounts WHERE id = 7`)
	// The sentinel: everything before it has been recorded (triggers run
	// inside their statements), so the sequence below is complete.
	if _, err := recordEvent(context.Background(), db, "test.sentinel", "", nil); err != nil {
		t.Fatal(err)
	}

	rows, err := db.Query(`SELECT topic, subject, coalesce(payload->>'op', '') FROM outbox.events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got [][3]string
	for rows.Next() {
		var r [3]string
		if err := rows.Scan(&r[0], &r[1], &r[2]); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	want := [][3]string{
		{"account.changed", "7", "insert"},
		{"account.changed", "7", "update"},
		{"account.changed", "7", "update"},
		{"account.changed", "7", "delete"},
		{"test.sentinel", "", ""},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	var payload struct {
		Table string         `json:"table"`
		Old   map[string]any `json:"old"`
		New   map[string]any `json:"new"`
	}
	var raw []byte
	if err := db.QueryRow(`SELECT payload FROM outbox.events WHERE payload->>'op' = 'update' ORDER BY id LIMIT 1`).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &payload); err != nil {
		t.Fatal(err)
	}
	if payload.Table != "public.accounts" || payload.Old["plan"] != "free" || payload.New["plan"] != "pro" {
		t.Errorf("update payload = %s, want table public.accounts and plan free → pro", raw)
	}
}

func TestWatchAllColumnsAndCompositeKeys(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `CREATE TABLE seats (hall text, seat int, holder text, PRIMARY KEY (hall, seat))`)
	mustExec(t, db, `SELECT outbox.watch('seats', 'seat.changed', NULL)`)
	mustExec(t, db, `INSERT INTO seats VALUES ('A', 12, NULL)`)
	mustExec(t, db, `UPDATE seats SET holder = NULL`) // no change at all: no event
	mustExec(t, db, `UPDATE seats SET holder = 'kim'`)
	mustExec(t, db, `SELECT outbox.unwatch('seats', 'seat.changed')`)
	mustExec(t, db, `DELETE FROM seats`)
	var subjects []string
	rows, err := db.Query(`SELECT subject || ':' || (payload->>'op') FROM outbox.events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		subjects = append(subjects, s)
	}
	if diff := cmp.Diff([]string{"A,12:insert", "A,12:update"}, subjects); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestWatchRefusesUnknownColumn(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `CREATE TABLE notes (id int PRIMARY KEY, body text)`)
	_, err := db.Exec(`SELECT outbox.watch('notes', 'note.changed', ARRAY['title'])`)
	if err == nil || !strings.Contains(err.Error(), "has no column title") {
		t.Fatalf("watch of a missing column: err = %v, want one naming the column", err)
	}
}
