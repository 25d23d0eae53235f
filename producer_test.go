// producer_test.go: what recording an event costs the producer's
// transaction in wake-ups: a NOTIFY only while a relay may be asleep, and
// no event left for the sweep when a relay goes to sleep (schema.sql,
// outbox.notify_events; notify.go; relay.go, Run).

package main

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// listenEvents listens on the relays' channel from a connection of the
// test's own, closed when the test ends.
func listenEvents(t *testing.T, dsn string) *pq.Listener {
	t.Helper()
	l := pq.NewListener(dsn, 10*time.Millisecond, time.Second, nil)
	t.Cleanup(func() { l.Close() })
	if err := l.Listen(eventsChannel); err != nil {
		t.Fatal(err)
	}
	return l
}

// notifiedBefore sends a marker on the relays' channel in a transaction of
// its own and returns the payloads that arrived before it. Notifications
// reach a listener in commit order, so these are the ones sent by every
// transaction that committed before the marker's: an empty list says that
// they sent none, without waiting for one not to come.
func notifiedBefore(t *testing.T, l *pq.Listener, db *sql.DB) []string {
	t.Helper()
	const marker = "marker"
	mustExec(t, db, `SELECT pg_notify($1, $2)`, eventsChannel, marker)
	got := []string{}
	for {
		select {
		case n := <-l.Notify:
			if n == nil {
				t.Fatal("listener reconnected: notifications may be lost")
			}
			if n.Extra == marker {
				return got
			}
			got = append(got, n.Extra)
		case <-time.After(10 * time.Second):
			t.Fatal("the marker notification never arrived")
		}
	}
}

// setRelayIdle sets relay_state the way a relay publishes it.
func setRelayIdle(t *testing.T, db *sql.DB, idle bool) {
	t.Helper()
	if _, err := publishRelayState(context.Background(), db, idle); err != nil {
		t.Fatal(err)
	}
}

func relayIdle(t *testing.T, db *sql.DB) bool {
	t.Helper()
	var idle bool
	if err := db.QueryRow(`SELECT idle FROM outbox.relay_state`).Scan(&idle); err != nil {
		t.Fatal(err)
	}
	return idle
}

// A producer's commit notifies the relays while relay_state says idle,
// and only then; outside READ COMMITTED it always notifies, because its
// read of the flag may predate a relay's going idle; and a missing row
// reads as idle.
func TestRecordNotifiesOnlyWhileARelayIsIdle(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	l := listenEvents(t, dsn)
	if !relayIdle(t, db) {
		t.Fatal("relay_state starts busy: producers would not wake a relay that never ran")
	}
	record := func(isolation sql.IsolationLevel) func(t *testing.T) {
		return func(t *testing.T) {
			tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: isolation})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := recordEvent(context.Background(), tx, "order.paid", "o-1", nil); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name      string
		idle      bool
		isolation sql.IsolationLevel
		want      []string
	}{
		{"idle", true, sql.LevelReadCommitted, []string{""}},
		{"busy", false, sql.LevelReadCommitted, []string{}},
		{"busy, repeatable read", false, sql.LevelRepeatableRead, []string{""}},
		{"busy, serializable", false, sql.LevelSerializable, []string{""}},
		{"idle again", true, sql.LevelReadCommitted, []string{""}},
	} {
		setRelayIdle(t, db, tc.idle)
		record(tc.isolation)(t)
		if diff := cmp.Diff(tc.want, notifiedBefore(t, l, db)); diff != "" {
			t.Errorf("%s: notifications (-want +got):\n%s", tc.name, diff)
		}
	}
	mustExec(t, db, `DELETE FROM outbox.relay_state`)
	record(sql.LevelReadCommitted)(t)
	if diff := cmp.Diff([]string{""}, notifiedBefore(t, l, db)); diff != "" {
		t.Errorf("no relay_state row: notifications (-want +got):\n%s", diff)
	}
}

// A recording transaction holds its recording lock, shared, on the key
// (0x6f627072, its backend pid), from its record to its commit: what a
// relay going idle waits for.
func TestRecordHoldsItsRecordingLockToCommit(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	if recordingLockClass != 1868722290 {
		t.Fatalf("recordingLockClass = %d; schema.sql's outbox.notify_events writes 1868722290", recordingLockClass)
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var pid int64
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	held := func() []string {
		t.Helper()
		locks, err := queryAll(ctx, db, func(row rowScanner) (string, error) {
			var s string
			return s, row.Scan(&s)
		}, `
			SELECT l.mode || ' ' || l.classid || ' ' || l.objid || ' ' || l.objsubid
			FROM pg_locks AS l
			WHERE l.locktype = 'advisory' AND l.pid = $1 AND l.granted`, pid)
		if err != nil {
			t.Fatal(err)
		}
		return locks
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	setRelayIdle(t, db, false) // held whatever the flag says
	for range 2 {              // taken once however many records
		if _, err := recordEvent(ctx, tx, "order.paid", "o-1", nil); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"ShareLock 1868722290 " + itoa(pid) + " 2"}
	if diff := cmp.Diff(want, held()); diff != "" {
		t.Errorf("locks while recording (-want +got):\n%s", diff)
	}
	got, err := queryAll(ctx, db, scanID, recordersSQL, recordingLockClass)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{pid}, got); diff != "" {
		t.Errorf("recorders (-want +got):\n%s", diff)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{}, held()); diff != "" {
		t.Errorf("locks after commit (-want +got):\n%s", diff)
	}
}

// The race a busy flag opens, closed: a producer read "busy" and is still
// open when the relay goes idle. The relay, with no notification to come
// and its sweep an hour away, waits for that transaction, and its re-check
// relays the event once it commits. While it waits, other producers record
// and commit: it waits for one backend, not for everyone.
func TestRelayGoingIdleWaitsForProducersThatReadBusy(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	setRelayIdle(t, db, false) // as a relay under load left it

	slow, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	var slowPID int64
	if err := slow.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&slowPID); err != nil {
		t.Fatal(err)
	}
	tx, err := slow.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	id, err := recordEvent(ctx, tx, "order.paid", "slow", nil) // reads busy: no NOTIFY
	if err != nil {
		t.Fatal(err)
	}

	cfg := defaultConfig().Relay
	cfg.SweepInterval = time.Hour
	r := newTestRelay(t, db, cfg, noopSubscriber("all"))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	never := make(chan struct{}) // no notification can wake it
	go func() { done <- r.Run(runCtx, never, nil) }()
	defer func() { cancel(); <-done }()

	waitFor(t, "the relay to publish idle", 10*time.Second, func() bool { return relayIdle(t, db) })
	waitFor(t, "the relay to wait for the open producer", 10*time.Second, func() bool {
		return queryInt(t, db, `
			SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2
			  AND mode = 'ExclusiveLock' AND NOT granted`, recordingLockClass, slowPID) == 1
	})

	// Another producer is not held up by that wait; it reads idle and
	// notifies (into nothing here).
	other, cancelOther := context.WithTimeout(ctx, 10*time.Second)
	defer cancelOther()
	if _, err := recordEvent(other, db, "order.paid", "other", nil); err != nil {
		t.Fatalf("a producer waited behind the relay's wait for another: %v", err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND fanned_out_at IS NOT NULL`, id); n != 0 {
		t.Fatal("the event was relayed before its transaction committed")
	}

	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-check to relay the event that read busy", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND fanned_out_at IS NOT NULL`, id) == 1
	})
}

// A relay that is asleep, with its sweep an hour away, is woken by the
// NOTIFY of a producer that commits: the listener hears it, and the event
// is relayed.
func TestIdleRelayIsWokenByARecord(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	var running []chan error
	defer func() {
		cancel()
		for _, done := range running {
			<-done
		}
	}()
	goRun := func(run func(context.Context) error) {
		done := make(chan error, 1)
		running = append(running, done)
		go func() { done <- run(ctx) }()
	}

	wake := newWakeups()
	goRun(newListener(dsn, wake, testLogger(t)).Run)
	select { // the listener pokes once it listens
	case <-wake.events:
	case <-time.After(10 * time.Second):
		t.Fatal("listener never started listening")
	}
	// The relay's wake-ups pass through here, to be counted.
	relayWake := make(chan struct{}, 1)
	forwarded := make(chan struct{}, 1)
	goRun(func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-wake.events:
				poke(forwarded)
				poke(relayWake)
			}
		}
	})
	cfg := defaultConfig().Relay
	cfg.SweepInterval = time.Hour
	r := newTestRelay(t, db, cfg, noopSubscriber("all"))
	goRun(func(ctx context.Context) error { return r.Run(ctx, relayWake, nil) })
	waitFor(t, "the start-up pass", 10*time.Second, func() bool { return r.passes.Load() >= 1 })
	if !relayIdle(t, db) {
		t.Fatal("relay_state busy with an empty outbox")
	}

	id, err := recordEvent(context.Background(), db, "order.paid", "o-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-forwarded:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification for a record while the relay was idle")
	}
	waitFor(t, "the woken relay to relay the event", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND fanned_out_at IS NOT NULL`, id) == 1
	})
}

// Producers committing faster than the relays sleep turn them busy: they
// publish busy and keep claiming; when the producers stop, the flag is
// idle again, and every event was relayed. Two relays, each with its own
// listener, share the one flag.
func TestRelayIsBusyUnderLoadAndIdleAfter(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	var running []chan error
	defer func() {
		cancel()
		for _, done := range running {
			<-done
		}
	}()
	goRun := func(run func(context.Context) error) {
		done := make(chan error, 1)
		running = append(running, done)
		go func() { done <- run(ctx) }()
	}
	cfg := defaultConfig().Relay
	cfg.SweepInterval = time.Hour
	for range 2 {
		wake := newWakeups()
		goRun(newListener(dsn, wake, testLogger(t)).Run)
		r := newTestRelay(t, db, cfg, noopSubscriber("all"))
		goRun(func(ctx context.Context) error { return r.Run(ctx, wake.events, nil) })
	}

	const producers = 4
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	recorded := make(chan int, producers)
	for range producers {
		go func() {
			n := 0
			for loadCtx.Err() == nil {
				if _, err := recordEvent(loadCtx, db, "order.paid", "o", nil); err == nil {
					n++
				}
			}
			recorded <- n
		}()
	}
	waitFor(t, "the relay to publish busy", 30*time.Second, func() bool { return !relayIdle(t, db) })
	stopLoad()
	total := 0
	for range producers {
		total += <-recorded
	}
	waitFor(t, "the relay to publish idle", 30*time.Second, func() bool { return relayIdle(t, db) })
	waitFor(t, "every event relayed", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL`) == 0
	})
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n < total {
		t.Errorf("%d events stored, %d recorded", n, total)
	}
}

// runBusyRelay records an event and starts a relay whose first pass finds
// it with a notification pending (producers outrunning it), so that it
// publishes busy; it stays busy for an hour after its last find, no
// notification reaches it afterwards, and its sweep is an hour away. It
// returns once the relay says busy; stop (also run at cleanup) cancels
// the relay and waits for Run to return.
func runBusyRelay(t *testing.T, db *sql.DB) (stop func()) {
	t.Helper()
	if _, err := recordEvent(context.Background(), db, "order.paid", "o-1", nil); err != nil {
		t.Fatal(err)
	}
	cfg := defaultConfig().Relay
	cfg.SweepInterval = time.Hour
	cfg.BusyLinger = time.Hour
	r := newTestRelay(t, db, cfg, noopSubscriber("all"))
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, wake, nil) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	waitFor(t, "the relay to publish busy", 10*time.Second, func() bool { return !relayIdle(t, db) })
	return stop
}

// A busy relay lingers: after its passes stop finding events it keeps
// re-checking, the flag still busy, so producers in the gaps of a steady
// stream do not notify. Only a re-check can relay the event recorded
// after the relay went busy.
func TestBusyRelayRechecksWithoutNotifications(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	runBusyRelay(t, db)

	id, err := recordEvent(context.Background(), db, "order.paid", "o-2", nil) // reads busy: no NOTIFY
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a re-check to relay the event recorded while busy", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND fanned_out_at IS NOT NULL`, id) == 1
	})
	if relayIdle(t, db) {
		t.Error("the relay published idle within its linger")
	}
}

// A relay that stops while busy publishes idle as it goes, so that
// producers notify the relays of other replicas, which may be asleep.
func TestRelayStoppedWhileBusyPublishesIdle(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	stop := runBusyRelay(t, db)
	stop()
	if !relayIdle(t, db) {
		t.Error("the relay stopped and left relay_state busy: producers would not wake another replica's relay")
	}
}

// A lost wake-up costs latency, never the event: with relay_state left
// busy (a relay that died under load) no producer notifies, the sweep
// relays the event anyway, and the relay publishes idle again.
func TestLostWakeUpIsRelayedBySweep(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Relay
	cfg.SweepInterval = 50 * time.Millisecond
	r := newTestRelay(t, db, cfg, noopSubscriber("all"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	never := make(chan struct{})
	go func() { done <- r.Run(ctx, never, nil) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the start-up pass", 10*time.Second, func() bool { return r.passes.Load() >= 1 })

	setRelayIdle(t, db, false)
	id, err := recordEvent(context.Background(), db, "order.paid", "o-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sweep to relay the event", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND fanned_out_at IS NOT NULL`, id) == 1
	})
	waitFor(t, "the relay to publish idle again", 10*time.Second, func() bool { return relayIdle(t, db) })
}
