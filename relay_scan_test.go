// relay_scan_test.go: the relay's scan bound skips what a held snapshot
// leaves behind and never passes over an event that commits late.

package main

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"
)

// lateCommitRun is one run of the cursor bug's scene under a held
// snapshot: a producer records an event and holds its transaction open
// while later events commit and are relayed, the relay trying to move its
// bound between passes; then the producer commits.
type lateCommitRun struct {
	late          int64 // the event whose transaction stayed open
	before, after int64 // the last event before it and the last after it
	boundBefore   int64 // the bound once the events before it were relayed
	boundHeld     int64 // the highest bound seen while it was open
	lateFanned    bool  // the late event was fanned out after its commit
}

// runLateCommit plays the scene on db, moving the bound with advance and
// relaying with the bound each pass.
func runLateCommit(t *testing.T, db *sql.DB) lateCommitRun {
	t.Helper()
	ctx := context.Background()
	var run lateCommitRun
	// A long transaction that wrote nothing, as an analytics query or a
	// forgotten psql session: it holds back the horizon and has no xid.
	hold, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if n := queryTxInt(t, hold, `SELECT count(*) FROM outbox.events`); n != 0 {
		t.Fatalf("the hold's snapshot sees %d events, want 0", n)
	}

	var scan relayScan
	pass := func() { relayFromBound(t, db, &scan) }
	relayAll := func() {
		t.Helper()
		for range 3 {
			pass()
		}
	}
	for i := range 20 {
		run.before = recordEventOrFatal(t, db, "before"+string(rune('a'+i)))
	}
	// Transactions that wrote, anywhere on the server (other tests', in
	// parallel), hold the proof back while they run: it moves once they
	// end.
	waitFor(t, "the bound to move past the events relayed", time.Minute, func() bool {
		pass()
		return scan.from > run.before
	})
	run.boundBefore = scan.from

	producer, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback()
	if err := producer.QueryRow(`SELECT outbox.record('late.commit', 'late', '{}')`).Scan(&run.late); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		run.after = recordEventOrFatal(t, db, "after"+string(rune('a'+i)))
		relayAll()
		run.boundHeld = max(run.boundHeld, scan.from)
	}
	if err := producer.Commit(); err != nil {
		t.Fatal(err)
	}
	relayAll()
	run.lateFanned = queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND fanned_out_at IS NOT NULL`, run.late) == 1
	return run
}

// relayFromBound tries to move scan's bound, as the relay does before a
// pass, without its pacing, and runs a pass from it.
func relayFromBound(t *testing.T, db *sql.DB, scan *relayScan) {
	t.Helper()
	scan.tried = time.Time{}
	if err := scan.advance(context.Background(), db, time.Now()); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, fanOutSQL, 200, nil, `[]`, 18, 300.0, "", scan.from)
}

func queryTxInt(t *testing.T, tx *sql.Tx, query string) int {
	t.Helper()
	var n int
	if err := tx.QueryRow(query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Under a held snapshot the bound moves past what was relayed, never past
// an event whose transaction is still open, and the event is relayed once
// it commits.
func TestRelayScanNeverPassesALateCommit(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	run := runLateCommit(t, db)
	if run.boundHeld > run.late {
		t.Errorf("bound %d while event %d's transaction was open: it passed over the event", run.boundHeld, run.late)
	}
	if !run.lateFanned {
		t.Errorf("event %d, committed after events up to %d were relayed, was never fanned out", run.late, run.after)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL`); n != 0 {
		t.Errorf("%d events left un-fanned", n)
	}
}

// The scene catches a bound that moves without its proof: with the
// xmin check taken out of outbox.advance_relay_scan, the bound passes the
// open transaction's event and the relay never claims it.
func TestRelayScanSceneCatchesABoundWithoutProof(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var def string
	if err := db.QueryRow(`SELECT pg_get_functiondef('outbox.advance_relay_scan(bigint, bigint, xid8, bigint)'::regprocedure)`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	const proof = "pg_snapshot_xmin(pg_current_snapshot()) >= in_candidate_xmax"
	if !strings.Contains(def, proof) {
		t.Fatalf("outbox.advance_relay_scan no longer holds %q:\n%s", proof, def)
	}
	mustExec(t, db, strings.Replace(def, proof, "true", 1))

	run := runLateCommit(t, db)
	if run.boundHeld <= run.late {
		t.Errorf("without its proof the bound stayed at %d, not past event %d: the scene did not tempt it", run.boundHeld, run.late)
	}
	if run.lateFanned {
		t.Errorf("without its proof the bound still let event %d be fanned out: the scene cannot tell a bound that moves too early", run.late)
	}
}

// A requeued event waits again below the bound: the next move of the
// bound starts over from the start, and the relay claims it.
func TestRelayScanStartsOverAfterARequeue(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	poisoned := recordEventOrFatal(t, db, "poisoned")
	mustExec(t, db, `UPDATE outbox.events SET poisoned_at = now(), relay_attempts = 5, relay_error = 'bad' WHERE id = $1`, poisoned)
	var last int64
	for i := range 5 {
		last = recordEventOrFatal(t, db, "later"+string(rune('a'+i)))
	}
	var scan relayScan
	waitFor(t, "the bound to move past the events relayed", time.Minute, func() bool {
		relayFromBound(t, db, &scan)
		return scan.from > last
	})
	if found, err := updateOneAndNotify(ctx, db, eventsChannel, requeueEventSQL, poisoned); err != nil || !found {
		t.Fatalf("requeue event %d: found %t, %v", poisoned, found, err)
	}
	scan.tried = time.Time{}
	if err := scan.advance(ctx, db, time.Now()); err != nil {
		t.Fatal(err)
	}
	if scan.from > poisoned {
		t.Errorf("bound %d after event %d was requeued, want at most its id", scan.from, poisoned)
	}
	mustExec(t, db, fanOutSQL, 200, nil, `[]`, 18, 300.0, "", scan.from)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND fanned_out_at IS NOT NULL`, poisoned); n != 1 {
		t.Errorf("the requeued event %d was not fanned out", poisoned)
	}

	// An operator's own UPDATE counts as a requeue too; a change that
	// leaves nothing waiting (erasure marks the event fanned out) does not.
	again := recordEventOrFatal(t, db, "again")
	mustExec(t, db, `UPDATE outbox.events SET poisoned_at = now(), relay_attempts = 5 WHERE id = $1`, again)
	before := queryInt(t, db, `SELECT last_value FROM outbox.events_requeued`)
	mustExec(t, db, `UPDATE outbox.events SET poisoned_at = NULL WHERE id = $1`, again)
	if n := queryInt(t, db, `SELECT last_value FROM outbox.events_requeued`); n != before+1 {
		t.Errorf("an UPDATE that cleared poisoned_at left events_requeued at %d, want %d", n, before+1)
	}
	mustExec(t, db, `UPDATE outbox.events SET poisoned_at = now() WHERE id = $1`, again)
	mustExec(t, db, `UPDATE outbox.events SET poisoned_at = NULL, fanned_out_at = now() WHERE id = $1`, again)
	if n := queryInt(t, db, `SELECT last_value FROM outbox.events_requeued`); n != before+1 {
		t.Errorf("an UPDATE that left the event fanned out moved events_requeued to %d, want %d", n, before+1)
	}
}

// The pace of the bound's moves, pinned.
func TestRelayScanTriesOnceASecond(t *testing.T) {
	if relayScanEvery != time.Second {
		t.Errorf("relayScanEvery is %s, want 1s", relayScanEvery)
	}
	s := relayScan{from: 7, tried: time.Unix(100, 0)}
	if err := s.advance(context.Background(), nil, time.Unix(100, 999_000_000)); err != nil || s.from != 7 {
		t.Errorf("a try 999ms after the last ran: from %d, err %v", s.from, err)
	}
}
