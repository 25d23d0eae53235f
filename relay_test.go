// relay_test.go: hops 2 and 3, events become jobs exactly once.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// noopSubscriber subscribes to every topic and does nothing.
func noopSubscriber(name string) Subscriber {
	return Subscriber{Name: name, Handle: func(context.Context, *sql.Tx, Event) error { return nil }}
}

func newTestRelay(t testing.TB, db *sql.DB, cfg RelayConfig, subs ...Subscriber) *relay {
	t.Helper()
	reg := newSubscriberRegistry()
	for _, s := range subs {
		reg.Register(s)
	}
	return newRelay(db, cfg, 18, fanOutTargets(reg), testLogger(t))
}

// recordN records n events in one transaction, subject "s<i>".
func recordN(t testing.TB, db *sql.DB, topic string, n int) {
	t.Helper()
	mustExec(t, db, `SELECT outbox.record($1, 's' || i, jsonb_build_object('i', i)) FROM generate_series(1, $2) AS i`, topic, n)
}

// jobsPerEvent maps each event id to its number of jobs, events without
// jobs included.
func jobsPerEvent(t testing.TB, db *sql.DB) map[int64]int {
	t.Helper()
	rows, err := db.Query(`
		SELECT e.id, count(j.id)
		FROM outbox.events e LEFT JOIN outbox.jobs j ON j.event_id = e.id
		GROUP BY e.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		got[id] = n
	}
	return got
}

func TestRelayFansOutToMatchingSubscribers(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	orders := noopSubscriber("orders")
	orders.Topics = []string{"order.*"}
	exact := noopSubscriber("paid")
	exact.Topics = []string{"order.paid"}
	r := newTestRelay(t, db, defaultConfig().Relay, noopSubscriber("all"), orders, exact)

	recordN(t, db, "order.paid", 1)
	recordN(t, db, "order.created", 1)
	recordN(t, db, "user.created", 1)
	res, err := r.relayOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(passResult{Claimed: 3, Fanned: 3, Jobs: 6}, res); diff != "" {
		t.Errorf("pass (-want +got):\n%s", diff)
	}
	rows, err := db.Query(`SELECT e.topic || ' → ' || j.kind FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		got = append(got, s)
	}
	want := []string{
		"order.created → sub:all", "order.created → sub:orders",
		"order.paid → sub:all", "order.paid → sub:orders", "order.paid → sub:paid",
		"user.created → sub:all",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("jobs (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL`); n != 0 {
		t.Errorf("%d events left un-fanned", n)
	}
}

// A cursor relay remembers the highest id it has seen. Event 1 takes its id
// first but commits after event 2 has been relayed; the cursor has passed
// it. Claiming by row relays it anyway.
func TestRelayClaimsRowsNotCursor(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	r := newTestRelay(t, db, defaultConfig().Relay, noopSubscriber("all"))

	slow, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback()
	slowID, err := recordEvent(ctx, slow, "t", "slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	fastID, err := recordEvent(ctx, db, "t", "fast", nil)
	if err != nil {
		t.Fatal(err)
	}
	if slowID >= fastID {
		t.Fatalf("setup: slow id %d should be below fast id %d", slowID, fastID)
	}

	res, err := r.relayOnce(ctx)
	if err != nil || res.Fanned != 1 {
		t.Fatalf("first pass: %+v, %v; want the committed event only", res, err)
	}
	if err := slow.Commit(); err != nil {
		t.Fatal(err)
	}
	res, err = r.relayOnce(ctx)
	if err != nil || res.Fanned != 1 {
		t.Fatalf("second pass: %+v, %v; want the late-committing lower id", res, err)
	}
	if diff := cmp.Diff(map[int64]int{slowID: 1, fastID: 1}, jobsPerEvent(t, db)); diff != "" {
		t.Errorf("jobs per event (-want +got):\n%s", diff)
	}
}

// The relay's connection dies at commit, after its jobs were inserted and
// its events marked: all of it rolls back, nothing counts against the rows,
// and the next pass relays every row exactly once.
func TestRelayCrashMidBatchRollsBackTogether(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	r := newTestRelay(t, db, defaultConfig().Relay, noopSubscriber("all"))
	recordN(t, db, "t", 50)

	// A deferred constraint trigger fires at COMMIT, after the fan-out
	// statement: it kills its own backend, as a crash would.
	mustExec(t, db, `CREATE TABLE crash_switch (on_commit boolean NOT NULL)`)
	mustExec(t, db, `INSERT INTO crash_switch VALUES (true)`)
	mustExec(t, db, `
		CREATE FUNCTION crash_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  IF (SELECT on_commit FROM crash_switch) THEN
		    PERFORM pg_terminate_backend(pg_backend_pid());
		  END IF;
		  RETURN NULL;
		END $$`)
	mustExec(t, db, `
		CREATE CONSTRAINT TRIGGER crash_at_commit AFTER INSERT ON outbox.jobs
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION crash_at_commit()`)

	if _, err := r.relayOnce(ctx); err == nil {
		t.Fatal("relay pass with a crash at commit succeeded")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Errorf("%d jobs survived the crash, want 0", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NOT NULL OR relay_attempts > 0`); n != 0 {
		t.Errorf("%d events marked or charged by the crashed pass, want 0", n)
	}

	mustExec(t, db, `UPDATE crash_switch SET on_commit = false`)
	res, err := r.relayOnce(ctx)
	if err != nil || res.Fanned != 50 {
		t.Fatalf("pass after the crash: %+v, %v; want all 50 relayed", res, err)
	}
	for id, n := range jobsPerEvent(t, db) {
		if n != 1 {
			t.Errorf("event %d has %d jobs, want 1", id, n)
		}
	}
}

// A row the relay cannot fan out is retried alone and poisoned after
// MaxFailures passes, while the rest of its batch goes through: whether
// its job insert fails or the marking of the event itself.
func TestRelayPoisonsOneBadRowAndRelaysTheRest(t *testing.T) {
	t.Parallel()
	for _, refuse := range []struct{ name, trigger, drop string }{
		{"job insert", `CREATE TRIGGER refuse_poison BEFORE INSERT ON outbox.jobs FOR EACH ROW EXECUTE FUNCTION refuse_poison()`,
			`DROP TRIGGER refuse_poison ON outbox.jobs`},
		{"event mark", `CREATE TRIGGER refuse_poison BEFORE UPDATE ON outbox.events FOR EACH ROW
			WHEN (OLD.fanned_out_at IS NULL AND NEW.fanned_out_at IS NOT NULL) EXECUTE FUNCTION refuse_poison()`,
			`DROP TRIGGER refuse_poison ON outbox.events`},
	} {
		t.Run(refuse.name, func(t *testing.T) {
			t.Parallel()
			relayPoisonsOneBadRow(t, refuse.trigger, refuse.drop)
		})
	}
}

func relayPoisonsOneBadRow(t *testing.T, trigger, drop string) {
	db, _ := newTestDB(t)
	ctx := context.Background()
	cfg := defaultConfig().Relay
	r := newTestRelay(t, db, cfg, noopSubscriber("all"))

	recordN(t, db, "t", 99)
	badID, err := recordEvent(ctx, db, "t", "poison", nil)
	if err != nil {
		t.Fatal(err)
	}
	recordN(t, db, "t", 100) // 200 in all: one full batch, the bad row in the middle
	mustExec(t, db, `
		CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE
		  -- a job's event_id, or an event's own id
		  event_id bigint := coalesce(to_jsonb(NEW)->>'event_id', to_jsonb(NEW)->>'id');
		BEGIN
		  IF (SELECT subject FROM outbox.events WHERE id = event_id) = 'poison' THEN
		    RAISE EXCEPTION 'cannot fan out event %', event_id;
		  END IF;
		  RETURN NEW;
		END $$`)
	mustExec(t, db, trigger)

	res, err := r.relayOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(passResult{Claimed: 200, Fanned: 199, Jobs: 199, Failed: 1}, res); diff != "" {
		t.Errorf("first pass (-want +got):\n%s", diff)
	}
	for pass := 2; pass <= cfg.MaxFailures; pass++ {
		res, err := r.relayOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := passResult{Claimed: 1, Failed: 1}
		if pass == cfg.MaxFailures {
			want.Poisoned = 1
		}
		if diff := cmp.Diff(want, res); diff != "" {
			t.Errorf("pass %d (-want +got):\n%s", pass, diff)
		}
	}
	ev, err := getEvent(ctx, db, badID)
	if err != nil {
		t.Fatal(err)
	}
	if ev.PoisonedAt == nil || ev.RelayAttempts != cfg.MaxFailures || ev.RelayError == nil ||
		!strings.Contains(*ev.RelayError, "cannot fan out event") {
		t.Fatalf("bad row after %d passes: poisoned %v, attempts %d, error %v; want poisoned with the trigger's error",
			cfg.MaxFailures, ev.PoisonedAt, ev.RelayAttempts, ev.RelayError)
	}
	// Poisoned rows are out of the backlog: the next pass claims nothing.
	if res, err := r.relayOnce(ctx); err != nil || res.Claimed != 0 {
		t.Fatalf("pass after poisoning: %+v, %v; want nothing claimed", res, err)
	}

	// Fixed and requeued, it relays like any other row.
	mustExec(t, db, drop)
	if err := requeueEvent(ctx, db, badID); err != nil {
		t.Fatal(err)
	}
	if res, err := r.relayOnce(ctx); err != nil || res.Fanned != 1 {
		t.Fatalf("pass after requeue: %+v, %v; want the requeued row relayed", res, err)
	}
	for id, n := range jobsPerEvent(t, db) {
		if n != 1 {
			t.Errorf("event %d has %d jobs, want 1", id, n)
		}
	}
}

// A database outage is not the rows' fault: failures that say nothing
// about a row never poison it.
func TestIsRowFault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pq.Error{Code: "P0001"}, true},  // raise_exception in a trigger
		{&pq.Error{Code: "23505"}, true},  // unique_violation
		{&pq.Error{Code: "22P02"}, true},  // invalid_text_representation
		{&pq.Error{Code: "08006"}, false}, // connection_failure
		{&pq.Error{Code: "57P01"}, false}, // admin_shutdown
		{&pq.Error{Code: "40P01"}, false}, // deadlock_detected
		{&pq.Error{Code: "25006"}, false}, // read_only_sql_transaction
		{&pq.Error{Code: "53100"}, false}, // disk_full
		{context.Canceled, false},
		{fmt.Errorf("relay: fan out: %w", &pq.Error{Code: "P0001"}), true},
		{fmt.Errorf("relay: commit: %w", sql.ErrConnDone), false},
	} {
		if got := isRowFault(tc.err); got != tc.want {
			t.Errorf("isRowFault(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestRelayDrainsBulkWriteInBoundedPasses(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	cfg := defaultConfig().Relay
	r := newTestRelay(t, db, cfg, noopSubscriber("all"))
	recordN(t, db, "bulk.import", 2000) // the seed's bulk import, one transaction

	var passes []int
	for {
		res, err := r.relayOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			break
		}
		if res.Claimed > cfg.BatchSize || res.Jobs > cfg.BatchSize {
			t.Fatalf("pass claimed %d events and enqueued %d jobs; the bound is %d", res.Claimed, res.Jobs, cfg.BatchSize)
		}
		passes = append(passes, res.Claimed)
	}
	if len(passes) != 10 {
		t.Errorf("2,000 events drained in %d passes (%v), want 10 of 200", len(passes), passes)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 2000 {
		t.Errorf("%d jobs, want 2000", n)
	}
}

// The claim walks events_unfanned_by_id in id order and stops after one
// batch, whatever the planner estimates. In a 1,000,000-event drain on a
// never-analyzed table it estimated 14 un-fanned rows and chose to read
// all 900,000 and sort them (a bitmap scan, then a sort spilling to disk):
// 625 ms a pass, so the relay slowed down as the backlog grew. Here a high
// random_page_cost stands in for such estimates: it makes the same
// read-everything-and-sort plan look cheapest.
func TestRelayClaimReadsOneBatchWhateverTheEstimates(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	const batch, backlog = 200, 5000
	recordN(t, db, "claim.plan", backlog)

	// The whole relay statement, claim and fan-out: its UPDATE must find
	// the claimed rows by key too, not by scanning the backlog.
	var claimed, jobs int
	scanned, indexEntries := statementReads(t, db, "outbox.events", "outbox.events_unfanned_by_id", func(tx *sql.Tx) error {
		return tx.QueryRow(fanOutSQL, batch, nil, `[]`, 18, 300.0, "", 0).Scan(&claimed, &jobs)
	})
	if claimed != batch || scanned != 0 || indexEntries > batch {
		t.Errorf("claimed %d of a %d backlog, scanning %d table rows and reading %d index entries; want %d claimed, 0 scanned, at most %d entries",
			claimed, backlog, scanned, indexEntries, batch, batch)
	}
}

// statementReads runs fn in a transaction in which index reads look 25
// times dearer than usual (random_page_cost = 100, a stand-in for bad
// estimates), and returns the rows fn read from table by scanning it and
// the entries it read from index. The transaction is rolled back.
func statementReads(t *testing.T, db *sql.DB, table, index string, fn func(tx *sql.Tx) error) (scanned, indexEntries int) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The xact statistics functions read this session's unflushed counts,
	// earlier transactions' included: flush them first.
	if _, err := conn.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SET LOCAL random_page_cost = 100`); err != nil {
		t.Fatal(err)
	}
	if err := fn(tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, `
		SELECT pg_stat_get_xact_tuples_returned($1::regclass),
		       pg_stat_get_xact_tuples_returned($2::regclass)`, table, index).Scan(&scanned, &indexEntries); err != nil {
		t.Fatal(err)
	}
	return scanned, indexEntries
}

// With no notification at all, the sweep alone relays a new event, and
// the pass that enqueues its job wakes this process's workers (a pass that
// enqueues nothing wakes nobody).
func TestRelaySweepCoversLostNotifications(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Relay
	cfg.SweepInterval = 50 * time.Millisecond
	r := newTestRelay(t, db, cfg, noopSubscriber("all"))

	ctx, cancel := context.WithCancel(context.Background())
	never := make(chan struct{}) // the suppressed notifications
	done := make(chan error, 1)
	jobsWake := make(chan struct{}, 1)
	go func() { done <- r.Run(ctx, never, jobsWake) }()
	defer func() { cancel(); <-done }()

	// Only after the start-up pass, so that pass cannot be what relays it.
	waitFor(t, "the start-up pass", 5*time.Second, func() bool { return r.passes.Load() >= 1 })
	if len(jobsWake) != 0 {
		t.Error("a pass that enqueued nothing woke the workers")
	}
	id, err := recordEvent(context.Background(), db, "t", "late", nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sweep to relay the event", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND fanned_out_at IS NOT NULL`, id) == 1
	})
	waitFor(t, "the pass to wake the workers", 5*time.Second, func() bool { return len(jobsWake) == 1 })
}

// startTestListener runs a listener on dsn until the test ends and
// returns its wake-ups once it listens, the poke it gives everyone then
// taken.
func startTestListener(t *testing.T, dsn string) *wakeups {
	t.Helper()
	wake := newWakeups()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- newListener(dsn, wake, testLogger(t)).Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-wake.events:
	case <-time.After(10 * time.Second):
		t.Fatal("listener never started listening")
	}
	<-wake.jobs
	return wake
}

// The LISTEN connection turns a NOTIFY from outbox.record into a wake-up.
func TestListenerWakesRelayOnRecord(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	wake := startTestListener(t, dsn)
	if _, err := recordEvent(context.Background(), db, "t", "s", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake.events:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up for the relay after outbox.record")
	}
}

// A relay pass's commit sends jobs_notify_workers' NOTIFY, and the relay
// pokes its own process's workers itself: the listener must not wake them
// a second time for the same pass, or every pass costs a claim for
// nothing. Jobs inserted by anyone else (another process's relay, a plain
// insert) still wake them. Notifications arrive in commit order, so once
// the last session's has been heard, the relay's has been too. The
// control, a relay that does not name itself, shows the doubled wake-up
// the test is about.
func TestListenerSkipsTheOwnRelaysNotification(t *testing.T) {
	t.Parallel()
	for _, tell := range []bool{true, false} {
		t.Run(fmt.Sprintf("relay tells the listener %t", tell), func(t *testing.T) {
			t.Parallel()
			db, dsn := newTestDB(t)
			wake := startTestListener(t, dsn)
			r := newTestRelay(t, db, defaultConfig().Relay, noopSubscriber("all"))
			if tell {
				r.notifyOrigin = wake.origin
			}
			recordN(t, db, "t", 3)
			res, err := r.relayOnce(context.Background())
			if err != nil || res.Jobs != 3 {
				t.Fatalf("relay pass: %+v, %v; want 3 jobs", res, err)
			}
			// Another replica's relay, which names itself too.
			other := newTestRelay(t, db, defaultConfig().Relay, noopSubscriber("all"))
			other.notifyOrigin = newNotifyOrigin()
			recordN(t, db, "t", 2)
			if res, err := other.relayOnce(context.Background()); err != nil || res.Jobs != 2 {
				t.Fatalf("the other relay's pass: %+v, %v; want 2 jobs", res, err)
			}
			// Someone else's job: a replay, a retry by hand.
			mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts)
				SELECT 'other', min(id), 1 FROM outbox.events`)
			waitFor(t, "the other sessions' notifications", 10*time.Second, func() bool {
				return wake.jobsNotified.Load()+wake.ownSkipped.Load() >= 3
			})
			got := []int64{wake.jobsNotified.Load(), wake.ownSkipped.Load()}
			want := []int64{2, 1}
			if !tell {
				want = []int64{3, 0}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("jobs notifications that woke the workers, own skipped (-want +got):\n%s", diff)
			}
		})
	}
}

// Two relays and two worker pools on one database relay and run every job
// exactly once.
func TestConcurrentRelaysAndWorkersRunEachJobOnce(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `CREATE TABLE effects (event_id bigint NOT NULL, kind text NOT NULL)`) // no unique key: duplicates must show
	effect := func(name string) Subscriber {
		return Subscriber{Name: name, Handle: func(ctx context.Context, tx *sql.Tx, ev Event) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ($1, $2)`, ev.ID, name)
			return err
		}}
	}
	reg := newSubscriberRegistry()
	reg.Register(effect("a"))
	reg.Register(effect("b"))
	relayCfg := defaultConfig().Relay
	relayCfg.BatchSize = 50
	relayCfg.SweepInterval = 20 * time.Millisecond
	workerCfg := defaultConfig().Workers
	workerCfg.PollInterval = 20 * time.Millisecond
	workerCfg.Concurrency = 4

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 2 {
		rl := newRelay(db, relayCfg, 18, fanOutTargets(reg), testLogger(t).With("relay", i))
		wp := newWorkerPool(db, workerCfg, time.Minute, reg, nil, testLogger(t).With("pool", i))
		wg.Go(func() { rl.Run(ctx, nil, nil) })
		wg.Go(func() { wp.Run(ctx, nil) })
	}
	defer func() { cancel(); wg.Wait() }()

	const producers, perProducer = 4, 100
	var pw sync.WaitGroup
	for p := range producers {
		pw.Go(func() {
			for i := range perProducer {
				if _, err := recordEvent(context.Background(), db, "t", fmt.Sprintf("%d-%d", p, i), nil); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	pw.Wait()
	const want = producers * perProducer * 2
	waitFor(t, "every job completed", 60*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed'`) == want
	})
	if n := queryInt(t, db, `SELECT count(*) FROM effects`); n != want {
		t.Errorf("%d effects, want %d", n, want)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM (SELECT 1 FROM effects GROUP BY event_id, kind HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d (event, subscriber) pairs ran more than once", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Errorf("%d jobs left in the queue, want none: every one delivered", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome <> 'completed' OR attempt <> 1`); n != 0 {
		t.Errorf("%d attempts not completed on their job's first attempt", n)
	}
}
