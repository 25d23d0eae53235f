// replay_test.go: resends an operator starts (a replay, a retry by hand)
// stay inside what a receiver's dedup window covers.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A retry by hand resends a discarded delivery only for an event within
// events retention (7 days here): a discarded job keeps its event for
// -discarded-jobs-retention after the discard, and a resend of it could
// outlive a receiver's dedup record. A minute inside the window is
// retried, a minute outside stays discarded, and the answer says so.
func TestRetriesByHandStayWithinEventsRetention(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook")
	mustExec(t, db, `INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at) VALUES
		('t', 'inside', now() - interval '7 days' + interval '1 minute', now() - interval '6 days'),
		('t', 'outside', now() - interval '7 days' - interval '1 minute', now() - interval '6 days')`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'webhook', id, $1, 18, 'discarded', 18, now(), now() FROM outbox.events ORDER BY id`, id)
	// A subscriber's job reaches no receiver: it is not clamped.
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'sub:x', id, 18, 'discarded', 18, now(), now() FROM outbox.events WHERE subject = 'outside'`)
	jobOf := func(kind, subject string) int64 {
		return int64(queryInt(t, db, `SELECT j.id FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id WHERE j.kind = $1 AND e.subject = $2`, kind, subject))
	}
	states := func() []string {
		return queryStrings(t, db, `SELECT j.kind || ' ' || e.subject || ' ' || j.state FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id ORDER BY j.id`)
	}

	var e struct{ Error string }
	if code := apiCall(t, srv, "POST", fmt.Sprintf("/api/jobs/%d/retry", jobOf("webhook", "outside")), "", &e); code != http.StatusBadRequest ||
		!strings.Contains(e.Error, "stays discarded") || !strings.Contains(e.Error, "retention window (168h0m0s)") {
		t.Errorf("retry of the delivery outside the window: %d %q, want 400 saying why", code, e.Error)
	}
	if code := apiCall(t, srv, "POST", fmt.Sprintf("/api/jobs/%d/retry", jobOf("sub:x", "outside")), "", nil); code != http.StatusOK {
		t.Errorf("retry of the subscriber's job outside the window: %d, want 200", code)
	}
	var res RetryResult
	if code := apiCall(t, srv, "POST", fmt.Sprintf("/api/endpoints/%d/retry-discarded", id), "", &res); code != http.StatusOK {
		t.Fatalf("retry-discarded: %d", code)
	}
	if res.Jobs != 1 || res.Skipped != 1 || !strings.Contains(res.Message, "1 discarded deliveries stay discarded") {
		t.Errorf("retry-discarded answered %+v, want 1 job retried, 1 skipped, and a message", res)
	}
	want := []string{"webhook inside available", "webhook outside discarded", "sub:x outside available"}
	if diff := cmp.Diff(want, states()); diff != "" {
		t.Errorf("jobs after the retries (-want +got):\n%s", diff)
	}
}

// A replay's batches, those that enqueue and those that count, walk their
// window's events in id order and stop at the batch's end, however few
// events of its topics the planner expects. The planner read every event
// after the batch's start, and sorted them, in each batch that enqueued
// (a bitmap scan), and in each batch that counted walked the rest of the
// table in parallel: a replay cost the square of its length. Here the
// window's 1,200 events are followed by 20,000 of another topic; parallel
// plans are made cheap, and the table is vacuumed but not analyzed.
func TestReplayBatchesWalkTheirEventsInOrder(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	// As the load's periodic vacuum leaves the table where autovacuum is
	// off: its size known, no column statistics. Off here too, before the
	// insert: an autovacuum's ANALYZE of it, racing the test, gives the
	// planner statistics and a plan that reads one entry more.
	mustExec(t, db, `ALTER TABLE outbox.events SET (autovacuum_enabled = false)`)
	mustExec(t, db, `INSERT INTO outbox.events (topic, subject, payload, fanned_out_at)
		SELECT CASE WHEN i <= 1200 THEN 'replayed.event' ELSE 'live.event' END, 's' || i, '{}', now()
		FROM generate_series(1, 21200) AS i`)
	mustExec(t, db, `VACUUM outbox.events`)
	var endpointID int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, topics)
		VALUES ('https://hooks.example.com/replay', decode(repeat('ab', 32), 'hex'), '{replayed.*,live.*}')
		RETURNING id`).Scan(&endpointID); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := replayRange{from: time.Now().Add(-time.Hour), topics: []string{"replayed.*"}}
	until, topics, through := r.args()
	cheapParallel := func(tx *sql.Tx) {
		t.Helper()
		for _, set := range []string{`SET LOCAL parallel_setup_cost = 0`, `SET LOCAL parallel_tuple_cost = 0`,
			`SET LOCAL min_parallel_index_scan_size = 0`, `SET LOCAL min_parallel_table_scan_size = 0`} {
			if _, err := tx.Exec(set); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Index entries read, and whether the plan went parallel (a parallel
	// worker's reads are its own, not counted in this session's). A walk
	// of the table itself is a fault of its own.
	reads := func(run func(tx *sql.Tx) error) (entries int, parallel bool) {
		t.Helper()
		scanned, entries := statementReads(t, db, "outbox.events", "outbox.events_pkey", func(tx *sql.Tx) error {
			cheapParallel(tx)
			return run(tx)
		})
		if scanned > 0 {
			t.Errorf("a batch read %d rows of events in a walk of the table, not of events_pkey", scanned)
		}
		return entries, entries == 0
	}
	countPlan := func(tx *sql.Tx) (string, error) {
		lines, err := queryAll(ctx, tx, scanString, `EXPLAIN `+replayCountSQL, endpointID, r.from, 500, manualBatch, until, topics, through)
		return strings.Join(lines, "\n"), err
	}

	// The faults this guards against, shown first: without the batch's
	// settings, both statements read far past their batch, the enqueue
	// in a walk of the index or of the table itself.
	scannedBefore, entriesBefore := statementReads(t, db, "outbox.events", "outbox.events_pkey", func(tx *sql.Tx) error {
		cheapParallel(tx)
		var n, after, jobs int64
		var ids, keys []byte
		return tx.QueryRow(replaySQL, endpointID, r.from, 500, 500, until, topics, through, 18, true, nil).Scan(&n, &after, &jobs, &ids, &keys)
	})
	if scannedBefore+entriesBefore < 5000 {
		t.Fatalf("without its settings, an enqueue batch read %d rows of events and %d entries of events_pkey; this test wants the plan that reads to the table's end",
			scannedBefore, entriesBefore)
	}
	var before string
	reads(func(tx *sql.Tx) (err error) { before, err = countPlan(tx); return err })
	if !strings.Contains(before, "Gather") {
		t.Fatalf("without its settings, a count batch was planned without a parallel walk; this test wants one:\n%s", before)
	}

	after := int64(500)
	var candidates, jobs int64
	entries, _ := reads(func(tx *sql.Tx) (err error) {
		candidates, jobs, err = replayBatchTx(ctx, tx, endpointID, 0, r, &after, 500, 18, true)
		return err
	})
	// 500 in the walk (and one past it at most), and 500 in the foreign key
	// checks of the jobs it inserts, one each.
	if candidates != 500 || jobs != 500 || after != 1000 || entries > 1002 {
		t.Errorf("an enqueue batch after event 500: %d candidates, %d jobs, up to event %d, reading %d entries of events_pkey; want 500, 500, 1000, at most 1002",
			candidates, jobs, after, entries)
	}
	after = 0
	entries, parallel := reads(func(tx *sql.Tx) (err error) {
		batch, err := countReplayBatch(ctx, tx, endpointID, r, after)
		if err != nil {
			return err
		}
		candidates = batch.candidates
		plan, err := countPlan(tx)
		if strings.Contains(plan, "Gather") {
			t.Errorf("in a count batch's transaction, its statement is planned in parallel:\n%s", plan)
		}
		return err
	})
	// 1,200 candidates, then the 20,000 events of the other topic up to
	// the batch's limit of 5,000 events or the end: a count batch reads
	// past the window, as it must to know the window ended, but in order.
	if candidates != 1200 || parallel || entries > 21200 {
		t.Errorf("a count batch: %d candidates, reading %d entries of events_pkey (parallel: %t); want 1200, at most 21200, not parallel",
			candidates, entries, parallel)
	}
	counted, err := countReplay(ctx, db, endpointID, r)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int64{"replayed.event": 1200}, counted.byTopic); diff != "" {
		t.Errorf("count of the window (-want +got):\n%s", diff)
	}
	if counted.first != 1 || counted.last != 1200 {
		t.Errorf("the count found events %d to %d, want 1 to 1200", counted.first, counted.last)
	}

	// Bounded by the last event its count found, a replay's batch stops
	// there, where without the bound it walks the 20,000 events after it
	// (as the count's batch above did) to find no more.
	r.through = sql.NullInt64{Int64: counted.last, Valid: true}
	after = 1000
	entries, _ = reads(func(tx *sql.Tx) (err error) {
		candidates, jobs, err = replayBatchTx(ctx, tx, endpointID, 0, r, &after, 500, 18, true)
		return err
	})
	if candidates != 200 || jobs != 200 || after != 1200 || entries > 402 {
		t.Errorf("the last enqueue batch, after event 1000 up to event 1200: %d candidates, %d jobs, up to event %d, reading %d entries of events_pkey; want 200, 200, 1200, at most 402",
			candidates, jobs, after, entries)
	}
}
