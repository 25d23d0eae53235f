// held.go: the held work's fault and its watch. While the run's command
// runs, a REPEATABLE READ transaction in the run's database holds its
// snapshot, idle, from one time to another, as a forgotten psql session or
// an analytics transaction would: vacuum can then remove no row version
// that died after the snapshot was taken, and every claim of the queue
// wades through them. Every so often a sample of the queue's dead row
// versions and backlog goes into the run's log.

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// heldPlan is one held run's fault and watch, its times counted from the
// start of the run's command.
type heldPlan struct {
	// DatabaseURL is the run's own database: PostgreSQL's horizon for
	// ordinary tables counts only the backends of the same database, so a
	// snapshot held anywhere else would leave the queue's tables alone.
	DatabaseURL string
	System      string // "outboxd" or "river": which tables the samples read
	From, Until time.Duration
	Every       time.Duration // between samples
}

// errRunEnded is a wait cut short by the run's command ending.
var errRunEnded = errors.New("the run's command ended")

// runHeld runs argv, its output into log, while it holds the snapshot and
// samples the queue as plan says. A hold that did not take, or that ended
// before plan.Until, fails the run (and stops the command): a fault that
// did not hit is not a measurement.
func runHeld(ctx context.Context, argv []string, plan heldPlan, log io.Writer) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(runCtx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// SIGTERM rather than a kill, so that the load program stops its own
	// child (outboxd, or the River sender) too.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", argv[0], err)
	}
	exited := make(chan struct{})
	var holdErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		if holdErr = holdDuring(runCtx, exited, plan, start, log); holdErr != nil {
			cancel()
		}
	})
	wg.Go(func() { sampleEvery(runCtx, exited, plan, start, log) })
	err := cmd.Wait()
	close(exited)
	wg.Wait()
	if holdErr != nil {
		return fmt.Errorf("held snapshot: %w", holdErr)
	}
	return err
}

// holdDuring holds the snapshot from plan.From to plan.Until, samples
// the queue at its end and logs that sample: the dead row versions at the
// end of the hold.
func holdDuring(ctx context.Context, exited <-chan struct{}, plan heldPlan, start time.Time, log io.Writer) error {
	if err := waitUntil(ctx, exited, start.Add(plan.From)); err != nil {
		return fmt.Errorf("before the hold began at %s: %w", plan.From, err)
	}
	hold, err := holdSnapshot(ctx, plan.DatabaseURL)
	if err != nil {
		return err
	}
	defer hold.close()
	fmt.Fprintf(log, "held %s: snapshot held, backend_xmin %s (REPEATABLE READ, idle in transaction until %s); autovacuum %s\n",
		seconds(time.Since(start)), hold.xmin, seconds(plan.Until), hold.autovacuum)
	if err := waitUntil(ctx, exited, start.Add(plan.Until)); err != nil {
		return fmt.Errorf("before the hold's end at %s: %w", plan.Until, err)
	}
	s, err := sampleQueue(ctx, plan.DatabaseURL, plan.System)
	if err != nil {
		return fmt.Errorf("the sample at the hold's end: %w", err)
	}
	// COMMIT fails if the session was ended meanwhile, and with it the
	// hold: then the run was not the fault it claims.
	if _, err := hold.conn.Exec(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("commit the held transaction: %w", err)
	}
	fmt.Fprintln(log, s.endOfHold(time.Since(start)))
	return nil
}

// heldSnapshot is a connection idle in a transaction that holds a snapshot.
type heldSnapshot struct {
	conn *pgx.Conn
	xmin string // its backend_xmin: the oldest transaction vacuum must keep
	// The server's autovacuum setting, for the log: with it off no vacuum
	// runs, hold or no hold, and only the pruning that claims and scans
	// do on their way is held back.
	autovacuum string
}

// holdSnapshot opens a connection to dbURL, begins a REPEATABLE READ
// transaction and takes its snapshot with a query, then checks from
// another connection that PostgreSQL counts it: the holder is idle in its
// transaction with its backend_xmin set. The holder speaks the simple
// protocol, as psql does: an extended-protocol portal left open would
// hold a snapshot of its own, even in READ COMMITTED, and the check would
// not tell the two apart.
func holdSnapshot(ctx context.Context, dbURL string) (*heldSnapshot, error) {
	config, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse the held snapshot's URL: %w", err)
	}
	config.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("connect for the held snapshot: %w", err)
	}
	h := &heldSnapshot{conn: conn}
	// A server's idle_in_transaction_session_timeout would end the hold,
	// and the fault with it, before its time.
	for _, sql := range []string{"SET idle_in_transaction_session_timeout = 0", "BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT count(*) FROM pg_class"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			h.close()
			return nil, fmt.Errorf("%s: %w", sql, err)
		}
	}
	if err := conn.QueryRow(ctx, "SELECT current_setting('autovacuum')").Scan(&h.autovacuum); err != nil {
		h.close()
		return nil, fmt.Errorf("read autovacuum: %w", err)
	}
	if h.xmin, err = heldXmin(ctx, dbURL, conn.PgConn().PID()); err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}

// heldXmin is the backend_xmin of the backend pid, idle in its
// transaction, as another connection sees it; an error if it holds none.
func heldXmin(ctx context.Context, dbURL string, pid uint32) (string, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("connect to check the held snapshot: %w", err)
	}
	defer conn.Close(context.Background())
	var state, xmin *string
	if err := conn.QueryRow(ctx, "SELECT state, backend_xmin::text FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&state, &xmin); err != nil {
		return "", fmt.Errorf("read the held snapshot's backend_xmin: %w", err)
	}
	if state == nil || *state != "idle in transaction" || xmin == nil {
		return "", fmt.Errorf("the holder's backend is %s with backend_xmin %s: no snapshot is held", deref(state), deref(xmin))
	}
	return *xmin, nil
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// close ends the connection; a transaction still open rolls back.
func (h *heldSnapshot) close() {
	h.conn.Close(context.Background())
}

// sampleEvery logs a sample of the queue every plan.Every until the
// command ends. A sample that fails (outboxd's schema not there yet, say)
// is logged as such; the run goes on.
func sampleEvery(ctx context.Context, exited <-chan struct{}, plan heldPlan, start time.Time, log io.Writer) {
	for next := plan.Every; ; next += plan.Every {
		if waitUntil(ctx, exited, start.Add(next)) != nil {
			return
		}
		s, err := sampleQueue(ctx, plan.DatabaseURL, plan.System)
		if err != nil {
			fmt.Fprintf(log, "held %s: sample failed: %v\n", seconds(time.Since(start)), err)
			continue
		}
		fmt.Fprintf(log, "held %s: %s\n", seconds(time.Since(start)), s)
	}
}

// queueSample is what a sample reads: the dead row versions that the
// statistics count in the queue's tables, the jobs waiting to be claimed
// and, for outboxd, the events its relay has not fanned out yet.
type queueSample struct {
	system     string
	deadRows   int64
	waiting    int64
	notFanned  int64
	deadTables string
}

func (s queueSample) String() string {
	text := fmt.Sprintf("dead row versions %d (%s), jobs waiting %d", s.deadRows, s.deadTables, s.waiting)
	if s.system == "outboxd" {
		text += fmt.Sprintf(", events not fanned out %d", s.notFanned)
	}
	return text
}

// endOfHold is the line of the sample taken at the hold's end, at the
// time since the command's start: its last figure is what the held rows
// read (reHeld).
func (s queueSample) endOfHold(at time.Duration) string {
	return fmt.Sprintf("held %s: snapshot released (COMMIT); %s; dead row versions at the end of the hold %d", seconds(at), s, s.deadRows)
}

// Each sample is one statement on a connection of its own, outside any
// transaction, so it sees the queue as it is now. n_dead_tup is the
// statistics' count: backends report theirs about once a second, and a
// vacuum sets it to what it could not remove.
const (
	outboxdSample = `SELECT
  (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = 'outbox')::bigint,
  (SELECT count(*) FROM outbox.jobs WHERE state IN ('available', 'retryable')),
  (SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL)`
	riverSample = `SELECT
  (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname = 'river_job')::bigint,
  (SELECT count(*) FROM river_job WHERE state = 'available'),
  0::bigint`
)

func sampleQueue(ctx context.Context, dbURL, system string) (queueSample, error) {
	s := queueSample{system: system, deadTables: "river_job"}
	query := riverSample
	if system == "outboxd" {
		s.deadTables, query = "outbox.* tables", outboxdSample
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return s, fmt.Errorf("connect for a sample: %w", err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, query).Scan(&s.deadRows, &s.waiting, &s.notFanned); err != nil {
		return s, fmt.Errorf("sample the queue: %w", err)
	}
	return s, nil
}

// waitUntil waits for t; it answers errRunEnded if the command ends
// first, the context's error if it is cancelled.
func waitUntil(ctx context.Context, exited <-chan struct{}, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-exited:
		return errRunEnded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// seconds shows d as whole seconds since the run's command started.
func seconds(d time.Duration) string {
	return fmt.Sprintf("%.0fs", d.Seconds())
}

// syncBuffer is a run's log, which the command, the hold and the samples
// write to at once.
type syncBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
