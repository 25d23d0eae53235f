// retention_test.go: the storage bounds, each sweep and the sweeper's lock.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

const day = 24 * time.Hour

func newTestSweeper(t testing.TB, db *sql.DB, cfg RetentionConfig) *sweeper {
	t.Helper()
	return newSweeper(db, cfg, t.Name(), testLogger(t))
}

// addEvent inserts an event as it would be age ago: "fanned" (fanned out
// then), "unfanned" or "poisoned". Explicit past timestamps stand in for
// time passing.
func addEvent(t testing.TB, db *sql.DB, state string, age time.Duration) int64 {
	t.Helper()
	var id int64
	err := db.QueryRow(`
		INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at, poisoned_at, relay_attempts)
		SELECT 't', $1, at,
		       CASE WHEN $1 = 'fanned' THEN at END,
		       CASE WHEN $1 = 'poisoned' THEN at END,
		       CASE WHEN $1 = 'poisoned' THEN 5 ELSE 0 END
		FROM (SELECT now() - make_interval(secs => $2) AS at) AS t
		RETURNING id`, state, age.Seconds()).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// addJob inserts a job of event in state, finished (completed, discarded)
// or last attempted age ago.
func addJob(t testing.TB, db *sql.DB, eventID int64, state jobState, age time.Duration) int64 {
	t.Helper()
	var id int64
	err := db.QueryRow(`
		INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, created_at, attempted_at, finalized_at)
		SELECT 'sub:x', $1, 18, $2::outbox.job_state,
		       CASE WHEN $2 = 'available' THEN 0 ELSE 1 END,
		       at,
		       CASE WHEN $2 <> 'available' THEN at END,
		       CASE WHEN $2 IN ('completed', 'discarded') THEN at END
		FROM (SELECT now() - make_interval(secs => $3) AS at) AS t
		RETURNING id`, eventID, string(state), age.Seconds()).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// ids reads a query's ids in order.
func ids(t testing.TB, db *sql.DB, query string) []int64 {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// advisoryLocks counts the advisory locks held in db's database, by anyone.
func advisoryLocks(t testing.TB, db *sql.DB) int {
	t.Helper()
	return queryInt(t, db, `
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory'
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
}

func sweepOnce(t testing.TB, s *sweeper) cycleResult {
	t.Helper()
	res, err := s.sweepOnce(context.Background())
	if err != nil {
		t.Fatalf("sweep cycle: %v", err)
	}
	return res
}

func TestEventsRetentionDeletesOnlyOldFannedEvents(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Retention // 7 days

	addEvent(t, db, "fanned", 8*day)
	oldFannedDone := addEvent(t, db, "fanned", 8*day)
	addJob(t, db, oldFannedDone, jobCompleted, 8*day)
	oldUnfanned := addEvent(t, db, "unfanned", 30*day)
	oldPoisoned := addEvent(t, db, "poisoned", 30*day)
	freshFanned := addEvent(t, db, "fanned", 6*day)
	freshUnfanned := addEvent(t, db, "unfanned", time.Minute)
	// Recorded long ago, poisoned, requeued and fanned out an hour ago: the
	// window counts from fan-out, so it gets its full window.
	lateFanned := addEvent(t, db, "fanned", time.Hour)
	mustExec(t, db, `UPDATE outbox.events SET created_at = now() - interval '30 days' WHERE id = $1`, lateFanned)

	res := sweepOnce(t, newTestSweeper(t, db, cfg))
	// The completed job went first (the job cleaner), then both old events.
	if diff := cmp.Diff(map[string]int64{"jobs_completed": 1, "jobs_discarded": 0, "events": 2, "idempotency_keys": 0, "inbox": 0, "delivery_stats": 0, "fanout_stats": 0, "inbox_stats": 0, "audit_log": 0}, res.Deleted); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
	want := []int64{oldUnfanned, oldPoisoned, freshFanned, freshUnfanned, lateFanned}
	if diff := cmp.Diff(want, ids(t, db, `SELECT id FROM outbox.events ORDER BY id`)); diff != "" {
		t.Errorf("events kept (-want +got):\n%s", diff)
	}
}

// A delivery never finds its event gone: an old fanned event is kept while
// any of its jobs is not completed, a discarded one included (it may be
// retried by hand); once the cleaner removes the discarded job, it goes.
func TestEventsRetentionKeepsEventsOfUnfinishedJobs(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Retention

	kept := map[jobState]int64{}
	for _, state := range []jobState{jobAvailable, jobRunning, jobRetryable, jobDiscarded} {
		ev := addEvent(t, db, "fanned", 8*day)
		addJob(t, db, ev, jobCompleted, time.Hour) // a sibling that is done
		addJob(t, db, ev, state, 6*day)            // younger than the discarded window
		kept[state] = ev
	}
	res := sweepOnce(t, newTestSweeper(t, db, cfg))
	if got := res.Deleted["events"]; got != 0 {
		t.Errorf("deleted %d events with unfinished jobs, want 0", got)
	}
	want := []int64{kept[jobAvailable], kept[jobRunning], kept[jobRetryable], kept[jobDiscarded]}
	if diff := cmp.Diff(want, ids(t, db, `SELECT id FROM outbox.events ORDER BY id`)); diff != "" {
		t.Errorf("events kept (-want +got):\n%s", diff)
	}

	// Past its window the discarded job goes, and its event with it.
	mustExec(t, db, `UPDATE outbox.jobs SET finalized_at = now() - interval '8 days' WHERE state = 'discarded'`)
	res = sweepOnce(t, newTestSweeper(t, db, cfg))
	if diff := cmp.Diff(map[string]int64{"jobs_completed": 0, "jobs_discarded": 1, "events": 1, "idempotency_keys": 0, "inbox": 0, "delivery_stats": 0, "fanout_stats": 0, "inbox_stats": 0, "audit_log": 0}, res.Deleted); diff != "" {
		t.Errorf("second cycle deleted (-want +got):\n%s", diff)
	}
	if got := ids(t, db, `SELECT event_id FROM outbox.jobs WHERE state = 'discarded'`); len(got) != 0 {
		t.Errorf("discarded jobs left: %v", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1`, kept[jobDiscarded]); n != 0 {
		t.Errorf("the discarded job's event outlived the job")
	}
}

func TestSweepDeletesInBatchesWithExactCount(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Retention
	cfg.BatchSize = 10
	mustExec(t, db, `
		INSERT INTO outbox.events (topic, created_at, fanned_out_at)
		SELECT 't', now() - interval '8 days', now() - interval '8 days'
		FROM generate_series(1, 35)`)
	addEvent(t, db, "fanned", time.Hour) // young: stays
	// Count DELETE statements as the database sees them.
	mustExec(t, db, `CREATE TABLE delete_statements (rows bigint NOT NULL)`)
	mustExec(t, db, `
		CREATE FUNCTION count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  INSERT INTO delete_statements SELECT count(*) FROM gone;
		  RETURN NULL;
		END $$`)
	mustExec(t, db, `
		CREATE TRIGGER count_delete AFTER DELETE ON outbox.events
		REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION count_delete()`)

	s := newTestSweeper(t, db, cfg)
	res := sweepOnce(t, s)
	if got := res.Deleted["events"]; got != 35 {
		t.Errorf("cycle reports %d events deleted, want 35", got)
	}
	if diff := cmp.Diff([]int64{10, 10, 10, 5}, ids(t, db, `SELECT rows FROM delete_statements ORDER BY rows DESC`)); diff != "" {
		t.Errorf("rows per DELETE statement (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 1 {
		t.Errorf("%d events left, want the young one", n)
	}
	if got := s.PrunedByTable()["outbox.events"]; got != 35 {
		t.Errorf("pruned counter for outbox.events = %d, want 35", got)
	}
}

// A cycle that would delete more than the cap stops at it, reports it, and
// runs no further sweep.
func TestSweepStopsCycleAtAnomalyCap(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Retention
	cfg.BatchSize = 10
	cfg.AnomalyCap = 25
	for range 40 {
		addJob(t, db, addEvent(t, db, "fanned", 30*day), jobCompleted, 30*day)
	}

	s := newTestSweeper(t, db, cfg)
	res, err := s.sweepOnce(context.Background())
	if !errors.Is(err, errAnomalyCap) {
		t.Fatalf("cycle error = %v, want errAnomalyCap", err)
	}
	if diff := cmp.Diff(map[string]int64{"jobs_completed": 25}, res.Deleted); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 15 {
		t.Errorf("%d jobs left, want 15: the sweep must stop at the cap", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 40 {
		t.Errorf("%d events left, want 40: the cycle must stop at the cap", n)
	}
	want := []sweepStats{
		{Sweep: "jobs_completed", Table: "outbox.jobs", Rows: 25, CapHits: 1},
		{Sweep: "jobs_discarded", Table: "outbox.jobs"},
		{Sweep: "events", Table: "outbox.events"},
		{Sweep: "idempotency_keys", Table: "outbox.idempotency_keys"},
		{Sweep: "inbox", Table: "outbox.inbox"},
		{Sweep: "delivery_stats", Table: "outbox.delivery_stats"},
		{Sweep: "fanout_stats", Table: "outbox.fanout_stats"},
		{Sweep: "inbox_stats", Table: "outbox.inbox_stats"},
		{Sweep: "audit_log", Table: "outbox.audit_log"},
	}
	if diff := cmp.Diff(want, s.Stats()); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	var metrics strings.Builder
	if err := writeMetrics(&metrics, Overview{}, &processCounters{retention: s}); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`outboxd_retention_cycles_total{result="swept"} 1`,
		`outboxd_retention_cycles_total{result="failed"} 1`,
		`outboxd_retention_anomaly_cap_stops_total{sweep="jobs_completed"} 1`,
		`outboxd_retention_anomaly_cap_stops_total{sweep="events"} 0`,
	} {
		if !strings.Contains(metrics.String(), line+"\n") {
			t.Errorf("metrics lack %s:\n%s", line, metrics.String())
		}
	}
	if n := advisoryLocks(t, db); n != 0 {
		t.Errorf("%d advisory locks held after the capped cycle, want 0", n)
	}
}

// A window of 0 disables its sweep and no other.
func TestRetentionWindowZeroLeavesTablesUntouched(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	oldEvent := addEvent(t, db, "fanned", 400*day)
	addJob(t, db, addEvent(t, db, "fanned", 400*day), jobCompleted, 400*day)
	addJob(t, db, addEvent(t, db, "fanned", 400*day), jobDiscarded, 400*day)

	cfg := defaultConfig().Retention
	cfg.Events, cfg.CompletedJobs, cfg.DiscardedJobs, cfg.Inbox, cfg.DeliveryStats = 0, 0, 0, 0, 0
	cfg.Audit = 0
	res := sweepOnce(t, newTestSweeper(t, db, cfg))
	if diff := cmp.Diff(map[string]int64{}, res.Deleted); diff != "" {
		t.Errorf("all windows 0: deleted (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT (SELECT count(*) FROM outbox.events) + (SELECT count(*) FROM outbox.jobs)`); n != 5 {
		t.Errorf("%d rows left, want all 5", n)
	}

	cfg = defaultConfig().Retention
	cfg.Events = 0
	res = sweepOnce(t, newTestSweeper(t, db, cfg))
	if diff := cmp.Diff(map[string]int64{"jobs_completed": 1, "jobs_discarded": 1, "inbox": 0, "delivery_stats": 0, "fanout_stats": 0, "inbox_stats": 0, "audit_log": 0}, res.Deleted); diff != "" {
		t.Errorf("events window 0: deleted (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 3 {
		t.Errorf("%d events left, want all 3 (event %d and the two whose jobs went)", n, oldEvent)
	}
}

func TestJobCleanerDeletesOldFinishedJobs(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ev := addEvent(t, db, "fanned", time.Hour) // young: events retention leaves it
	addJob(t, db, ev, jobCompleted, 25*time.Hour)
	addJob(t, db, ev, jobDiscarded, 8*day)
	keep := []int64{
		addJob(t, db, ev, jobCompleted, 23*time.Hour),
		addJob(t, db, ev, jobDiscarded, 6*day),
		addJob(t, db, ev, jobAvailable, 30*day),
		addJob(t, db, ev, jobRunning, 30*day),
		addJob(t, db, ev, jobRetryable, 30*day),
	}

	res := sweepOnce(t, newTestSweeper(t, db, defaultConfig().Retention))
	if diff := cmp.Diff(map[string]int64{"jobs_completed": 1, "jobs_discarded": 1, "events": 0, "idempotency_keys": 0, "inbox": 0, "delivery_stats": 0, "fanout_stats": 0, "inbox_stats": 0, "audit_log": 0}, res.Deleted); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(keep, ids(t, db, `SELECT id FROM outbox.jobs ORDER BY id`)); diff != "" {
		t.Errorf("jobs kept (-want +got):\n%s", diff)
	}
}

// Inbox records older than the inbox window are deleted, younger kept.
func TestInboxRetentionDeletesOldRecords(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	s := newTestSweeper(t, db, defaultConfig().Retention) // inbox: 12 days
	mustExec(t, db, `
		INSERT INTO outbox.inbox (source, webhook_id, received_at)
		VALUES ('a', '1', now() - interval '13 days'),
		       ('a', '2', now() - interval '11 days'),
		       ('b', '1', now())`)
	res := sweepOnce(t, s)
	if got := res.Deleted["inbox"]; got != 1 {
		t.Errorf("inbox deleted %d, want 1", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.inbox`); n != 2 {
		t.Errorf("%d inbox rows left, want the 2 younger than 12 days", n)
	}
}

// Events are pruned before the inbox, so a cycle that fails on events
// leaves every inbox record: a dedup record outlives its event, never the
// other way round.
func TestEventsArePrunedBeforeInbox(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `INSERT INTO outbox.inbox (source, webhook_id, received_at) VALUES ('a', '1', now() - interval '30 days')`)
	addEvent(t, db, "fanned", 30*day)
	refuseDeletes(t, db, "outbox.events", "events are not to be deleted today")

	s := newTestSweeper(t, db, defaultConfig().Retention)
	if _, err := s.sweepOnce(context.Background()); err == nil || !strings.Contains(err.Error(), "not to be deleted today") {
		t.Fatalf("cycle error = %v, want the trigger's", err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.inbox`); n != 1 {
		t.Errorf("the inbox was swept after events failed: %d rows left, want 1", n)
	}

	mustExec(t, db, `DROP TRIGGER refuse_delete ON outbox.events`)
	res := sweepOnce(t, s)
	if res.Deleted["events"] != 1 || res.Deleted["inbox"] != 1 {
		t.Errorf("after the fix: deleted %v, want one event and one inbox record", res.Deleted)
	}
}

// Two replicas sweep at once: the one holding the lock sweeps, the other
// skips at once, and the lock is free when the cycle ends.
func TestOnlyOneReplicaSweepsACycle(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Retention
	old := addEvent(t, db, "fanned", 8*day)
	a, b := newTestSweeper(t, db, cfg), newTestSweeper(t, db, cfg)

	// Hold a inside its cycle, lock taken: its events DELETE waits for
	// this transaction's table lock.
	hold, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.Exec(`LOCK TABLE outbox.events IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res cycleResult
		err error
	}
	aDone := make(chan outcome, 1)
	go func() {
		res, err := a.sweepOnce(context.Background())
		aDone <- outcome{res, err}
	}()
	waitFor(t, "replica a to hold the lock and wait on the events table", 30*time.Second, func() bool {
		return advisoryLocks(t, db) == 1 && queryInt(t, db, `
			SELECT count(*) FROM pg_locks
			WHERE relation = 'outbox.events'::regclass AND NOT granted`) == 1
	})

	// b must skip at once, not wait for a: a deadline turns waiting into
	// a failure.
	bCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := b.sweepOnce(bCtx)
	if err != nil || !res.Skipped {
		t.Fatalf("replica b during a's cycle: %+v, %v; want skipped", res, err)
	}
	if n := advisoryLocks(t, db); n != 1 {
		t.Errorf("%d advisory locks after b skipped, want a's alone", n)
	}
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	got := <-aDone
	if got.err != nil || got.res.Skipped || got.res.Deleted["events"] != 1 {
		t.Fatalf("replica a: %+v, %v; want event %d deleted", got.res, got.err, old)
	}
	if n := advisoryLocks(t, db); n != 0 {
		t.Errorf("%d advisory locks after a's cycle, want 0", n)
	}
	if a.cycles.Load() != 1 || b.skipped.Load() != 1 || b.cycles.Load() != 0 {
		t.Errorf("a swept %d, b swept %d and skipped %d; want 1, 0, 1", a.cycles.Load(), b.cycles.Load(), b.skipped.Load())
	}
	// Free for the next replica.
	if res := sweepOnce(t, b); res.Skipped {
		t.Error("b skipped the next cycle: the lock is still held")
	}
}

// A failed statement ends the cycle, and the lock is released with it.
func TestSweepReleasesLockAfterFailedStatement(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	addEvent(t, db, "fanned", 8*day)
	mustExec(t, db, `
		CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  RAISE EXCEPTION 'refused';
		END $$`)
	mustExec(t, db, `CREATE TRIGGER refuse_delete BEFORE DELETE ON outbox.events FOR EACH ROW EXECUTE FUNCTION refuse_delete()`)

	s := newTestSweeper(t, db, defaultConfig().Retention)
	if _, err := s.sweepOnce(context.Background()); err == nil || errors.Is(err, errAnomalyCap) {
		t.Fatalf("cycle error = %v, want the trigger's", err)
	}
	// The unlock ran on the sweeper's session before sweepOnce returned.
	if n := advisoryLocks(t, db); n != 0 {
		t.Fatalf("%d advisory locks after a failed cycle, want 0", n)
	}
	mustExec(t, db, `DROP TRIGGER refuse_delete ON outbox.events`)
	if res := sweepOnce(t, s); res.Skipped || res.Deleted["events"] != 1 {
		t.Errorf("next cycle: %+v; want it to sweep the event", res)
	}
}

// The sweeper's connection dies mid-cycle: the session's end released the
// lock, and the next cycle takes it again on a new connection.
func TestSweepReleasesLockWhenItsConnectionDies(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	addEvent(t, db, "fanned", 8*day)
	mustExec(t, db, `CREATE TABLE kill_switch (on_delete boolean NOT NULL)`)
	mustExec(t, db, `INSERT INTO kill_switch VALUES (true)`)
	mustExec(t, db, `
		CREATE FUNCTION kill_deleter() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  IF (SELECT on_delete FROM kill_switch) THEN
		    PERFORM pg_terminate_backend(pg_backend_pid());
		  END IF;
		  RETURN OLD;
		END $$`)
	mustExec(t, db, `CREATE TRIGGER kill_deleter BEFORE DELETE ON outbox.events FOR EACH ROW EXECUTE FUNCTION kill_deleter()`)

	s := newTestSweeper(t, db, defaultConfig().Retention)
	if _, err := s.sweepOnce(context.Background()); err == nil {
		t.Fatal("cycle whose connection died succeeded")
	}
	waitFor(t, "the dead session's lock to go", 10*time.Second, func() bool { return advisoryLocks(t, db) == 0 })
	mustExec(t, db, `UPDATE kill_switch SET on_delete = false`)
	if res := sweepOnce(t, s); res.Skipped || res.Deleted["events"] != 1 {
		t.Errorf("next cycle: %+v; want it to sweep the event", res)
	}
	if n := advisoryLocks(t, db); n != 0 {
		t.Errorf("%d advisory locks after the next cycle, want 0", n)
	}
}

// Shutdown in the middle of a cycle: the blocked DELETE is cancelled, the
// cycle returns, and its lock goes with its session.
func TestSweepReleasesLockWhenCancelledMidCycle(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	addEvent(t, db, "fanned", 8*day)
	hold, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.Exec(`LOCK TABLE outbox.events IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	s := newTestSweeper(t, db, defaultConfig().Retention)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.sweepOnce(ctx)
		done <- err
	}()
	waitFor(t, "the sweeper to hold the lock and wait on the events table", 30*time.Second, func() bool {
		return advisoryLocks(t, db) == 1 && queryInt(t, db, `
			SELECT count(*) FROM pg_locks
			WHERE relation = 'outbox.events'::regclass AND NOT granted`) == 1
	})
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("cancelled cycle returned no error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("cycle did not return after cancel")
	}
	waitFor(t, "the cancelled cycle's lock to go", 10*time.Second, func() bool { return advisoryLocks(t, db) == 0 })
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	if res := sweepOnce(t, s); res.Skipped || res.Deleted["events"] != 1 {
		t.Errorf("next cycle: %+v; want it to sweep the event", res)
	}
}

// The session loses its lock mid-cycle: unlock answers false, the cycle
// says so, and the connection is closed rather than pooled.
func TestSweepDiscardsConnectionWhenLockLost(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	addEvent(t, db, "fanned", 8*day)
	mustExec(t, db, `CREATE TABLE sweeper_sessions (pid integer NOT NULL)`)
	mustExec(t, db, `
		CREATE FUNCTION drop_locks() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  PERFORM pg_advisory_unlock_all();
		  INSERT INTO sweeper_sessions VALUES (pg_backend_pid());
		  RETURN NULL;
		END $$`)
	mustExec(t, db, `CREATE TRIGGER drop_locks AFTER DELETE ON outbox.events FOR EACH STATEMENT EXECUTE FUNCTION drop_locks()`)

	s := newTestSweeper(t, db, defaultConfig().Retention)
	if _, err := s.sweepOnce(context.Background()); !errors.Is(err, errLockLost) {
		t.Fatalf("cycle error = %v, want errLockLost", err)
	}
	pid := queryInt(t, db, `SELECT pid FROM sweeper_sessions`)
	waitFor(t, "the sweeper's session to be closed", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == 0
	})
}

// A sweep rests at least as long as its last batch worked, and never less
// than the minimum pause: a long prune keeps its backend busy half the
// time at most, so it cannot starve the relay on a small machine.
func TestSweepPauseMatchesTheBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ took, want time.Duration }{
		{0, sweepBatchPause},
		{5 * time.Millisecond, sweepBatchPause},
		{sweepBatchPause, sweepBatchPause},
		{80 * time.Millisecond, 80 * time.Millisecond},
		{2 * time.Second, 2 * time.Second},
	} {
		if got := sweepPause(tc.took); got != tc.want {
			t.Errorf("sweepPause(%s) = %s, want %s", tc.took, got, tc.want)
		}
	}
}

func TestSweepJitter(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	for i := range 20 {
		seed := fmt.Sprintf("host-a:%d", 1000+i)
		j := sweepJitter(seed, time.Hour)
		if j < 0 || j >= time.Hour {
			t.Errorf("sweepJitter(%q, 1h) = %s, want in [0, 1h)", seed, j)
		}
		if again := sweepJitter(seed, time.Hour); again != j {
			t.Errorf("sweepJitter(%q) = %s, then %s; want the same", seed, j, again)
		}
		seen[j] = true
	}
	if len(seen) < 15 {
		t.Errorf("20 processes got only %d distinct offsets", len(seen))
	}
}

// The loop waits for its process's offset before the first cycle, and
// sweeps when the offset has passed, not before.
func TestSweeperWaitsForItsJitter(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Retention
	s := newSweeper(db, cfg, "host-a:1000", testLogger(t))
	if s.jitter == 0 {
		t.Fatal("this seed's jitter is 0; pick another so the test can tell")
	}
	waited := make(chan time.Duration, 1)
	offsetPassed := make(chan time.Time)
	s.after = func(d time.Duration) <-chan time.Time {
		waited <- d
		return offsetPassed
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	select {
	case d := <-waited:
		if d != sweepJitter("host-a:1000", time.Hour) {
			t.Errorf("the loop waited %s before its first cycle, want the jitter %s", d, s.jitter)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not wait for its jitter before its first cycle")
	}
	if n := s.cycles.Load() + s.skipped.Load(); n != 0 {
		t.Fatalf("%d cycles ran before the offset passed, want 0", n)
	}
	close(offsetPassed)
	waitFor(t, "the first cycle", 10*time.Second, func() bool { return s.cycles.Load() == 1 })
}

// The loop sweeps at start and on every tick, survives failing cycles,
// recovers, and stops with its context.
func TestSweeperLoopSurvivesErrorsAndStops(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	addEvent(t, db, "fanned", 8*day)
	refuseDeletes(t, db, "outbox.events", "refused")
	cfg := defaultConfig().Retention
	cfg.Interval = 20 * time.Millisecond
	s := newTestSweeper(t, db, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop := func() error { stopped = true; cancel(); return <-done }
	defer func() {
		if !stopped {
			stop()
		}
	}()

	waitFor(t, "two failed cycles", 30*time.Second, func() bool { return s.failed.Load() >= 2 })
	mustExec(t, db, `DROP TRIGGER refuse_delete ON outbox.events`)
	waitFor(t, "a cycle after the fix to delete the event", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.events`) == 0
	})
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	// A cycle cut short by the cancel ends its session to release the
	// lock, and a session's end is asynchronous.
	waitFor(t, "no advisory lock after Run stopped", 10*time.Second, func() bool { return advisoryLocks(t, db) == 0 })
}

// The inbox window follows the dedup rule (replay.go): by default the first
// whole day above events retention + retry horizon + retention interval
// (and a day above events retention); given, it must be longer than that,
// to the second; with events kept forever, it must keep its records too.
func TestParseConfigRetention(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args      []string
		env       map[string]string
		wantInbox time.Duration
	}{
		{nil, nil, 12 * day}, // 168h + 104h4m49.2s + 1h = 273h4m49.2s
		{[]string{"-events-retention", "240h"}, nil, 15 * day},                         // 345h4m49.2s: the inbox follows
		{[]string{"-job-max-attempts", "20"}, nil, 14 * day},                           // 321h4m49.2s
		{[]string{"-retention-interval", "24h"}, nil, 13 * day},                        // 296h4m49.2s
		{[]string{"-job-max-attempts", "1"}, nil, 8 * day},                             // 169h, and the day's floor: 192h
		{[]string{"-job-max-attempts", "5", "-events-retention", "24h"}, nil, 2 * day}, // 29h, floor 48h
		{nil, map[string]string{"OUTBOXD_EVENTS_RETENTION": "0"}, 0},                   // events kept, so their dedup records too
		{[]string{"-inbox-retention", "273h4m50s"}, nil, 273*time.Hour + 4*time.Minute + 50*time.Second},
		{[]string{"-job-max-attempts", "1", "-inbox-retention", "192h"}, nil, 192 * time.Hour},
		{nil, map[string]string{"OUTBOXD_INBOX_RETENTION": "0"}, 0},
		{[]string{"-events-retention", "0", "-inbox-retention", "0"}, nil, 0},
	} {
		cfg, err := parseConfig(tc.args, envFrom(tc.env), io.Discard)
		if err != nil {
			t.Errorf("parseConfig(%q, %v): %v", tc.args, tc.env, err)
			continue
		}
		if cfg.Retention.Inbox != tc.wantInbox {
			t.Errorf("parseConfig(%q, %v): inbox retention %s, want %s", tc.args, tc.env, cfg.Retention.Inbox, tc.wantInbox)
		}
	}

	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-inbox-retention", "273h4m49s"}, nil,
			"-inbox-retention (OUTBOXD_INBOX_RETENTION) = 273h4m49s must be longer than -events-retention (OUTBOXD_EVENTS_RETENTION) = 168h0m0s" +
				" + the retry horizon of -job-max-attempts (OUTBOXD_JOB_MAX_ATTEMPTS) = 18 (104h4m49.2s) + -retention-interval (OUTBOXD_RETENTION_INTERVAL) = 1h0m0s" +
				" = 273h4m49.2s, and a day longer than events retention, so that an inbox record outlives every resend of its event (left unset it is 288h0m0s)"},
		{nil, map[string]string{"OUTBOXD_INBOX_RETENTION": "192h"}, "-inbox-retention (OUTBOXD_INBOX_RETENTION) = 192h0m0s must be longer than"},
		{[]string{"-inbox-retention", "288h", "-retention-interval", "24h"}, nil,
			"-retention-interval (OUTBOXD_RETENTION_INTERVAL) = 24h0m0s = 296h4m49.2s"},
		{[]string{"-inbox-retention", "300h", "-job-max-attempts", "20"}, nil,
			"-job-max-attempts (OUTBOXD_JOB_MAX_ATTEMPTS) = 20 (152h4m49.2s)"},
		{[]string{"-job-max-attempts", "1", "-inbox-retention", "191h59m59s"}, nil, "a day longer than events retention"},
		{[]string{"-events-retention", "0", "-inbox-retention", "8760h"}, nil,
			"-inbox-retention (OUTBOXD_INBOX_RETENTION) = 8760h0m0s bounds the inbox, but -events-retention (OUTBOXD_EVENTS_RETENTION) = 0 keeps events, and lets a replay resend them, forever"},
		{[]string{"-events-retention", "-1h"}, nil, "-events-retention (OUTBOXD_EVENTS_RETENTION) must be between"},
		{nil, map[string]string{"OUTBOXD_RETENTION_BATCH": "5001"}, "-retention-batch (OUTBOXD_RETENTION_BATCH) must be between 1 and 5000, got 5001"},
		{[]string{"-retention-anomaly-cap", "0"}, nil, "-retention-anomaly-cap (OUTBOXD_RETENTION_ANOMALY_CAP)"},
		{[]string{"-retention-interval", "0s"}, nil, "-retention-interval (OUTBOXD_RETENTION_INTERVAL)"},
	} {
		_, err := parseConfig(tc.args, envFrom(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseConfig(%q, %v) = %v, want an error containing %q", tc.args, tc.env, err, tc.want)
		}
	}
}

// The queue tables are vacuumed after 2% dead rows, not PostgreSQL's 20%
// (every row is updated and deleted once), and after 2% inserted, without
// the vacuum's cost delay; their pages keep room for updated versions, and
// the statistics rows, updated in place, for many.
func TestQueueTablesVacuumAggressively(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	queue := []string{"autovacuum_analyze_scale_factor=0.02", "autovacuum_vacuum_cost_delay=0",
		"autovacuum_vacuum_insert_scale_factor=0.02", "autovacuum_vacuum_scale_factor=0.02"}
	stats := []string{"autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=50", "fillfactor=50"}
	want := map[string][]string{
		"outbox.events":         append(slices.Clone(queue), "fillfactor=90"),
		"outbox.jobs":           append(slices.Clone(queue), "fillfactor=80"),
		"outbox.delivery_stats": stats,
		"outbox.fanout_stats":   stats,
	}
	for table, opts := range want {
		var got []string
		if err := db.QueryRow(`SELECT reloptions FROM pg_class WHERE oid = $1::regclass`, table).Scan(pq.Array(&got)); err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		slices.Sort(opts)
		if !slices.Equal(got, opts) {
			t.Errorf("%s reloptions %q, want %q", table, got, opts)
		}
	}
}

// An endpoint failing for 5 days is disabled with its reason and gets no
// new jobs; one failing for less, and a healthy one, are left alone.
func TestEndpointFailingTooLongIsDisabled(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	var long, short, healthy int64
	for _, ep := range []struct {
		id      *int64
		failing string
	}{{&long, "5 days 1 minute"}, {&short, "4 days 23 hours"}, {&healthy, ""}} {
		err := db.QueryRow(`
			INSERT INTO outbox.endpoints (url, secret, failing_since)
			VALUES ('https://hooks.example/' || md5(random()::text), decode(repeat('ab', 32), 'hex'),
			        CASE WHEN $1 = '' THEN NULL ELSE now() - $1::interval END)
			RETURNING id`, ep.failing).Scan(ep.id)
		if err != nil {
			t.Fatal(err)
		}
	}
	cfg := defaultConfig().Retention
	res, err := newTestSweeper(t, db, cfg).sweepOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{long}, res.Disabled); diff != "" {
		t.Errorf("disabled endpoints (-want +got):\n%s", diff)
	}
	var reason string
	if err := db.QueryRow(`SELECT disabled_reason FROM outbox.endpoints WHERE id = $1 AND disabled_at IS NOT NULL`, long).Scan(&reason); err != nil {
		t.Fatalf("the long-failing endpoint is not disabled: %v", err)
	}
	if !strings.Contains(reason, "failing continuously since") || !strings.Contains(reason, "5 days") {
		t.Errorf("disable reason %q does not say why", reason)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE disabled_at IS NOT NULL`); n != 1 {
		t.Errorf("%d endpoints disabled, want 1", n)
	}

	// The relay enqueues nothing for it from now on; the others get theirs.
	r := newTestRelay(t, db, defaultConfig().Relay)
	recordN(t, db, "t", 1)
	if _, err := r.relayOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1`, long); n != 0 {
		t.Errorf("the disabled endpoint got %d new jobs", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id IN ($1, $2)`, short, healthy); n != 2 {
		t.Errorf("the enabled endpoints got %d jobs, want 2", n)
	}

	// 0 never disables.
	mustExec(t, db, `UPDATE outbox.endpoints SET failing_since = now() - interval '30 days' WHERE id = $1`, short)
	cfg.EndpointDisableAfter = 0
	if res, err := newTestSweeper(t, db, cfg).sweepOnce(ctx); err != nil || len(res.Disabled) != 0 {
		t.Errorf("with -endpoint-disable-after 0: disabled %v, err %v", res.Disabled, err)
	}
}

// A rotated-out secret, of an endpoint or a source, is cleared by the
// retention cycle once its window has ended, at most a batch a table a
// cycle; one still in its window is kept.
func TestRetentionClearsRotatedOutSecrets(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	mustExec(t, db, `
		INSERT INTO outbox.endpoints (url, secret, previous_secret, previous_secret_expires_at)
		VALUES ('https://hooks.example/ended-1', decode(repeat('ab', 32), 'hex'), decode(repeat('cd', 32), 'hex'), now() - interval '1 second'),
		       ('https://hooks.example/ended-2', decode(repeat('ab', 32), 'hex'), decode(repeat('cd', 32), 'hex'), now() - interval '1 day'),
		       ('https://hooks.example/open', decode(repeat('ab', 32), 'hex'), decode(repeat('cd', 32), 'hex'), now() + interval '1 hour'),
		       ('https://hooks.example/none', decode(repeat('ab', 32), 'hex'), NULL, NULL)`)
	mustExec(t, db, `
		INSERT INTO outbox.inbox_sources (name, secret, previous_secret, previous_secret_expires_at, topic_prefix)
		VALUES ('ended', '\x01', '\x02', now() - interval '1 second', ''),
		       ('open', '\x01', '\x02', now() + interval '1 hour', '')`)
	previousSecrets := func() []string {
		rows, err := queryAll(ctx, db, func(row rowScanner) (s string, err error) { return s, row.Scan(&s) }, `
			SELECT url FROM outbox.endpoints WHERE previous_secret IS NOT NULL OR previous_secret_expires_at IS NOT NULL
			UNION ALL
			SELECT name FROM outbox.inbox_sources WHERE previous_secret IS NOT NULL OR previous_secret_expires_at IS NOT NULL`)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}

	cfg := defaultConfig().Retention
	cfg.BatchSize = 1
	s := newTestSweeper(t, db, cfg)
	for i, want := range []struct {
		cleared int64
		left    int // rows with a previous secret; the two still open among them
	}{{2, 3}, {1, 2}, {0, 2}} {
		res, err := s.sweepOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left := previousSecrets()
		if res.SecretsCleared != want.cleared || len(left) != want.left || !slices.Contains(left, "open") || !slices.Contains(left, "https://hooks.example/open") {
			t.Errorf("cycle %d cleared %d, left %q; want %d cleared and %d left, the open ones among them", i+1, res.SecretsCleared, left, want.cleared, want.left)
		}
	}
}

// Per-batch locks (-pool-mode transaction): a cycle that finds the lock
// held at its first batch skips, having deleted nothing; one whose lock
// is taken in a pause between two batches hands the rest over without an
// error; and the next cycle, the lock free, finishes the job.
func TestXactLockSweepSkipsAndHandsOver(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Retention
	cfg.XactLocks = true
	cfg.BatchSize = 2
	s := newTestSweeper(t, db, cfg)
	addOldEvents(t, db, 5)

	hold, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.Exec(`SELECT pg_advisory_xact_lock($1)`, retentionLockKey); err != nil {
		t.Fatal(err)
	}
	if res := sweepOnce(t, s); !res.Skipped || s.skipped.Load() != 1 || s.cycles.Load() != 0 {
		t.Fatalf("cycle while another transaction holds the lock: %+v, skipped %d, swept %d; want skipped", res, s.skipped.Load(), s.cycles.Load())
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 5 {
		t.Fatalf("%d events left after a skipped cycle, want 5", n)
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}

	// Another transaction takes the lock in the pause after the first
	// batch: the sweeper's wait (after) is where it does.
	hold, err = db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	// The hook runs on the sweeper's goroutine: it notes what it saw, and
	// this one checks it once the cycle is done.
	pauses, left := 0, 0
	var locked bool
	var leftErr, lockErr error
	s.after = func(d time.Duration) <-chan time.Time {
		pauses++
		if pauses == 1 {
			leftErr = db.QueryRow(`SELECT count(*) FROM outbox.events`).Scan(&left)
			lockErr = hold.QueryRow(`SELECT pg_try_advisory_xact_lock($1)`, retentionLockKey).Scan(&locked)
		}
		ready := make(chan time.Time, 1)
		ready <- time.Now()
		return ready
	}
	type outcome struct {
		res cycleResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := s.sweepOnce(context.Background())
		done <- outcome{res, err}
	}()
	got := <-done
	if leftErr != nil || left != 3 {
		t.Errorf("%d events left in the pause after the first batch (%v), want 3", left, leftErr)
	}
	if lockErr != nil || !locked {
		t.Errorf("take the lock in the sweeper's pause: %t, %v; want it taken", locked, lockErr)
	}
	if got.err != nil || !got.res.HandedOver || got.res.Deleted["events"] != 2 || s.cycles.Load() != 1 || s.failed.Load() != 0 {
		t.Errorf("cycle whose lock was taken between batches: %+v, %v, swept %d, failed %d; want handed over after 2 events", got.res, got.err, s.cycles.Load(), s.failed.Load())
	}
	if pauses != 1 {
		t.Errorf("the sweeper paused %d times, want once: after its first batch, before it found the lock taken", pauses)
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if res := sweepOnce(t, s); res.Skipped || res.HandedOver || res.Deleted["events"] != 3 {
		t.Errorf("next cycle: %+v; want the other 3 events deleted", res)
	}
}
