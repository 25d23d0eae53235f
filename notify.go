// notify.go: wake-ups, one LISTEN connection that turns PostgreSQL
// notifications into pokes for the relay and the workers.
//
// A notification is a hint, never the truth: the relay and the workers also
// run on their own tickers, so a lost notification costs latency, not an
// event. That is why nothing here queues notifications: a wake-up channel
// holds at most one pending poke, and any number of notifications while a
// pass runs fold into one more pass.
//
// Producers notify the relays only while one may be asleep: the relays
// publish that in outbox.relay_state, and one that goes to sleep first
// waits out every producer that may have read "busy" (recorderBarrier),
// then looks once more (schema.sql, outbox.notify_events, has the argument).

package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// The pool modes (-pool-mode): how outboxd's connections reach PostgreSQL.
//
// poolModeSession: each connection is one PostgreSQL session for its whole
// life, directly or through a pooler in session mode. One connection of
// its own LISTENs (listener), and the retention sweeper holds a session
// advisory lock for a cycle (retention.go, sweepHold).
//
// poolModeTransaction: behind a pooler in transaction mode (PgBouncer's
// pool_mode = transaction), where consecutive transactions of one client
// connection may run on different server sessions, so nothing may rely on
// session state outliving a transaction:
//   - No LISTEN: a LISTEN registers on whichever server session ran it, and
//     its notifications reach nobody. The relay runs on its sweep, every
//     transactionModeRelaySweep unless -relay-sweep is given; the workers
//     on their poll (-job-poll) and on the relay's poke after a pass that
//     enqueued jobs.
//   - The relay publishes busy once at start (quietProducers), so that
//     producers skip a NOTIFY nobody hears, and never publishes idle.
//   - Retention takes a transaction-scoped lock per batch
//     (RetentionConfig.XactLocks).
//
// Neither mode relies on anything else per session: every statement with
// parameters goes as one unnamed Parse/Bind/Execute/Sync (newDBPool's
// binary_parameters; lib/pq otherwise syncs between the Parse and the
// Bind, and a transaction pooler may move the Bind to another session),
// no statement is prepared by name, no temporary table is made, every SET
// is SET LOCAL, set_config(..., true) or a function's own SET clause, and
// every other advisory lock is transaction-scoped
// (pgbouncer_test.go tests both modes behind PgBouncer).
//
// Producers are unaffected either way: the recording lock in
// outbox.record's trigger is transaction-scoped and keyed by the server
// session's pid, which a pooler lends for the whole transaction, and a
// NOTIFY is sent at commit.
const (
	poolModeSession     = "session"
	poolModeTransaction = "transaction"
)

// transactionModeRelaySweep is the relay's sweep without -relay-sweep in
// transaction mode, where no notification wakes it: an event waits for the
// relay at most a second, where a NOTIFY would take milliseconds, and an
// idle relay costs one claim a second, an index probe of an empty partial
// index (events_unfanned_by_id).
const transactionModeRelaySweep = time.Second

// quietProducers publishes relay_state busy, for a relay that no
// notification can wake (transaction mode): producers then skip the NOTIFY
// and its serializing lock at commit (schema.sql, outbox.relay_state). A
// relay of another replica that listens sets it idle again before it
// sleeps, which costs NOTIFYs, never an event. A failure costs the same,
// so it is logged, not returned.
func quietProducers(ctx context.Context, db *sql.DB, logger *slog.Logger) {
	if _, err := publishRelayState(ctx, db, false); err != nil && ctx.Err() == nil {
		logger.Warn("relay state busy not published; producers keep notifying", "err", err)
	}
}

// wakeups are the pokes for the relay (events) and the workers (jobs).
type wakeups struct {
	events chan struct{}
	jobs   chan struct{}
	// origin names this process's relay in the payload of the workers'
	// NOTIFY (relay.notifyOrigin, schema.sql's outbox.notify_jobs). Every
	// relay transaction sends one (jobs_notify_workers fires for each
	// INSERT statement, even of no row, and the notifications of one
	// transaction fold into one), and the relay pokes this process's
	// workers itself after a pass that enqueued jobs: woken a second time
	// by its own NOTIFY, the workers would run a claim for nothing after
	// every relay pass, so the listener skips it (counted in ownSkipped).
	// Other replicas' relays, replays and retries still wake them.
	origin string

	// Counters, only ever incremented: jobs notifications that woke the
	// workers, and those of this process's own relay, skipped.
	jobsNotified atomic.Int64
	ownSkipped   atomic.Int64
}

func newWakeups() *wakeups {
	return &wakeups{events: make(chan struct{}, 1), jobs: make(chan struct{}, 1), origin: newNotifyOrigin()}
}

// newNotifyOrigin is a name no other process's relay has: 64 random bits.
func newNotifyOrigin() string {
	b := make([]byte, 8)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// poke leaves one pending wake-up on ch without ever blocking.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// all wakes everyone, after a reconnect: notifications sent while the
// connection was down are gone, so every loop should look now.
func (w *wakeups) all() {
	poke(w.events)
	poke(w.jobs)
}

const (
	// listenerPingInterval and listenerPingTimeout bound how long a half-open
	// LISTEN connection (a failover, a NAT dropping state) goes unnoticed:
	// without a ping, no error surfaces until TCP gives up, minutes to hours
	// later.
	listenerPingInterval = 30 * time.Second
	listenerPingTimeout  = 5 * time.Second
	// listenerRetryPause is the pause before a new listener after one failed.
	listenerRetryPause = time.Second
)

// listener owns the LISTEN connection. It is not from the pool: a pooled
// connection is reused by others and LISTEN is a session state.
type listener struct {
	dsn    string
	wake   *wakeups
	logger *slog.Logger
}

func newListener(dsn string, wake *wakeups, logger *slog.Logger) *listener {
	return &listener{dsn: dsn, wake: wake, logger: logger}
}

// Run keeps a healthy LISTEN connection until ctx ends, recreating it when
// a ping goes unanswered.
func (l *listener) Run(ctx context.Context) error {
	for {
		err := l.listen(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.logger.Warn("listener lost; recreating it, sweeps cover the gap", "err", err)
		l.wake.all()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(listenerRetryPause):
		}
	}
}

// listen runs one pq.Listener until ctx ends or it fails a ping.
func (l *listener) listen(ctx context.Context) error {
	pl := pq.NewDialListener(keepAliveDialer{}, l.dsn, 100*time.Millisecond, 10*time.Second,
		func(ev pq.ListenerEventType, err error) {
			if err != nil {
				l.logger.Warn("listener connection event", "event", ev.String(), "err", err)
			}
		})
	// Close on every exit path; it also unblocks a Listen that waits for a
	// connection that cannot be made.
	defer pl.Close()

	listened := make(chan error, 1)
	go func() {
		listened <- errors.Join(pl.Listen(eventsChannel), pl.Listen(jobsChannel))
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-listened:
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	l.logger.Debug("listening", "channels", []string{eventsChannel, jobsChannel})
	// Anything recorded before LISTEN took effect sent its notification to
	// nobody.
	l.wake.all()

	ping := time.NewTicker(listenerPingInterval)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case n := <-pl.Notify:
			switch {
			case n == nil: // pq reconnected: notifications in between are lost
				l.wake.all()
			case n.Channel == eventsChannel:
				poke(l.wake.events)
			case n.Channel == jobsChannel && n.Extra == l.wake.origin:
				l.wake.ownSkipped.Add(1)
			case n.Channel == jobsChannel:
				l.wake.jobsNotified.Add(1)
				poke(l.wake.jobs)
			}
		case <-ping.C:
			if err := pingWithin(pl, listenerPingTimeout); err != nil {
				return fmt.Errorf("listener ping: %w", err)
			}
		}
	}
}

// pingWithin is pl.Ping with a deadline: Ping itself waits for an answer
// forever, which is exactly what a half-open connection never sends.
func pingWithin(pl *pq.Listener, timeout time.Duration) error {
	done := make(chan error, 1) // buffered: the goroutine ends after Close
	go func() { done <- pl.Ping() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("no answer within %s", timeout)
	}
}

// keepAliveDialer dials the LISTEN connection with TCP keep-alives tuned to
// notice a dead peer in under a minute rather than the kernel's two hours.
type keepAliveDialer struct{}

func (keepAliveDialer) dialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: timeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     15 * time.Second,
			Interval: 5 * time.Second,
			Count:    3,
		},
	}
}

func (d keepAliveDialer) Dial(network, address string) (net.Conn, error) {
	return d.dialer(10*time.Second).Dial(network, address)
}

func (d keepAliveDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	return d.dialer(timeout).Dial(network, address)
}

// recordingLockClass is the first key of the recording locks: the shared
// advisory lock (recordingLockClass, its backend pid) that outbox.record's
// trigger takes, held to commit, before it reads relay_state (schema.sql,
// outbox.notify_events, where it is written out as 1868722290). "obpr".
const recordingLockClass = 0x6f627072

// publishRelayStateSQL sets relay_state.idle to $1 and says whether that
// changed it: the statement writes nothing when it already is, so a relay
// may run it before every sleep.
const publishRelayStateSQL = `
UPDATE outbox.relay_state
SET idle = $1,
    changed_at = now()
WHERE idle <> $1`

// publishRelayState tells producers whether to notify (idle) or not
// (busy), and reports whether the flag changed.
func publishRelayState(ctx context.Context, db *sql.DB, idle bool) (changed bool, err error) {
	res, err := db.ExecContext(ctx, publishRelayStateSQL, idle)
	if err != nil {
		return false, fmt.Errorf("publish relay state idle=%t: %w", idle, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("publish relay state idle=%t: %w", idle, err)
	}
	return n == 1, nil
}

// recordersSQL lists the backends that hold a recording lock now: those
// inside a transaction that recorded an event. A prepared transaction's
// lock keeps the pid it was taken by in its key, so it is listed too.
const recordersSQL = `
SELECT l.objid::bigint
FROM pg_locks AS l
WHERE l.locktype = 'advisory'
  AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND l.classid = $1
  AND l.objsubid = 2
  AND l.granted`

// awaitRecorderSQL waits until backend $2's recording lock is free, that
// is, until the transaction holding it ended. Run outside a transaction,
// its lock is released when the statement ends: at once, and on whatever
// pooled connection ran it, so a cancelled wait leaks nothing.
const awaitRecorderSQL = `SELECT pg_advisory_xact_lock($1, $2)`

// awaitRecorders returns once every transaction that held a recording lock
// when it was called has ended. It waits for one backend at a time, so no
// backend's next transaction waits on the wait for another.
func awaitRecorders(ctx context.Context, db *sql.DB) error {
	pids, err := queryAll(ctx, db, scanID, recordersSQL, recordingLockClass)
	if err != nil {
		return fmt.Errorf("await recorders: list: %w", err)
	}
	for _, pid := range pids {
		if _, err := db.ExecContext(ctx, awaitRecorderSQL, recordingLockClass, pid); err != nil {
			return fmt.Errorf("await recorder %d: %w", pid, err)
		}
	}
	return nil
}

// recorderBarrier runs awaitRecorders beside the relay's loop, so that a
// producer that keeps its transaction open holds up the relay's sleep,
// never its passes: notifications keep waking it meanwhile. At most one
// wait is in flight; its owner calls stop before it returns.
type recorderBarrier struct {
	db     *sql.DB
	logger *slog.Logger
	// passed is poked when a wait is over: time for the re-check.
	passed chan struct{}
	cancel context.CancelFunc // ends the wait in flight; nil if none
	exited chan struct{}      // closed when the wait in flight returned
}

func newRecorderBarrier(db *sql.DB, logger *slog.Logger) *recorderBarrier {
	return &recorderBarrier{db: db, logger: logger, passed: make(chan struct{}, 1)}
}

// start begins a wait for the transactions recording now, ending any
// wait in flight: that one listed recorders from before, and those that
// read "busy" since must be waited for too.
func (b *recorderBarrier) start(ctx context.Context) {
	b.stop()
	waitCtx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	b.cancel, b.exited = cancel, exited
	go func() {
		defer close(exited)
		err := awaitRecorders(waitCtx, b.db)
		if waitCtx.Err() != nil {
			return
		}
		if err != nil {
			// The re-check still runs; an event it misses waits for the
			// next wake-up or sweep.
			b.logger.Warn("waiting for recording transactions failed", "err", err)
		}
		poke(b.passed)
	}()
}

// stop ends the wait in flight, if any, and returns once it has.
func (b *recorderBarrier) stop() {
	if b.cancel == nil {
		return
	}
	b.cancel()
	<-b.exited
	b.cancel, b.exited = nil, nil
}
