// retention.go: every periodic bound on storage, swept by one replica at a time.
//
// One mechanism serves every table. A sweep is a name, a window (rows older
// than it go; 0 disables it) and a DELETE of at most one batch of rows; the
// sweeper runs the sweeps in order, once a cycle, under an advisory lock,
// so that no two replicas ever sweep at once: a session lock held by one
// connection for the whole cycle, or, behind a transaction pooler
// (-pool-mode transaction), a transaction-scoped lock taken by every batch
// (sweepHold). Each sweep deletes in batches of at
// most BatchSize rows, pausing between batches, and stops the cycle with
// errAnomalyCap when it has deleted AnomalyCap rows: a jumped clock must not
// be trusted to empty a table. Rows deleted, cycles swept, skipped and
// failed, and anomaly-cap stops are counted for the overview and /metrics.

package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync/atomic"
	"time"
)

// RetentionConfig holds the storage bounds; a window of 0 disables its sweep.
type RetentionConfig struct {
	// Events: fanned events are deleted this long after their fan-out,
	// once every job that references them is completed.
	Events time.Duration
	// Inbox: inbox records are deleted this long after they were received.
	// It must be longer than Events plus the retry horizon plus Interval
	// (the dedup rule, replay.go; validated at start): the record that
	// dedupes an event must outlive every resend of it.
	Inbox time.Duration
	// CompletedJobs and DiscardedJobs: finished jobs are deleted this long
	// after they finished. Discarded ones stay longer, to be looked at and
	// retried by hand.
	CompletedJobs time.Duration
	DiscardedJobs time.Duration
	// DeliveryStats: rows of outbox.delivery_stats and fanout_stats are
	// deleted this long after their minute (stats.go), and so are rows
	// of outbox.inbox_stats (inbox.go).
	DeliveryStats time.Duration
	// Interval is the cadence of the sweep cycle, offset per process by a
	// deterministic jitter.
	Interval time.Duration
	// BatchSize is the most rows one DELETE statement removes (at most
	// retentionBatchMax).
	BatchSize int
	// AnomalyCap is the most rows one sweep deletes in one cycle. Reaching
	// it stops the cycle with a warning instead of trusting a clock that may
	// have jumped, or a window that was set by mistake.
	AnomalyCap int
	// XactLocks takes the retention lock per batch, transaction-scoped,
	// instead of per cycle on one session (sweepHold): set by -pool-mode
	// transaction, where no session outlives a transaction.
	XactLocks bool
	// EndpointDisableAfter: an endpoint failing continuously this long is
	// disabled, so a receiver that is gone for good stops collecting
	// deliveries that can only be discarded. Five days outlasts a long
	// weekend's outage and the 18-attempt retry horizon (about four days),
	// so a receiver back within the horizon loses nothing. 0 never disables.
	EndpointDisableAfter time.Duration
	// Audit: audit trail entries are deleted this long after the change
	// they record (audit.go).
	Audit time.Duration
}

// retentionBatchMax bounds one DELETE statement: 5,000 rows hold row locks
// and write WAL for well under a second, so a sweep never stalls the relay or
// replication, and a first sweep over months of rows goes in many short
// statements rather than one that holds the table for minutes.
const retentionBatchMax = 5_000

// sweepBatchPause is the shortest pause between two batches of one sweep:
// room for autovacuum, replication and the relay's own writes between
// deletes.
const sweepBatchPause = 20 * time.Millisecond

// sweepPause is the pause after a batch that took batchTook: at least as
// long as the batch, so a long sweep keeps its server backend busy at most
// half the time: with a fixed pause after long batches, a big prune kept
// one of two cores nearly busy, and the live deliveries' latency rose
// while it ran. Retention is hourly; taking twice as long to prune is the
// cheaper side.
func sweepPause(batchTook time.Duration) time.Duration {
	return max(sweepBatchPause, batchTook)
}

// retentionLockKey is the advisory lock that makes one replica at a time
// the sweeper, held per cycle or per batch (sweepHold). It differs from schemaLockKey, which shares the key
// space.
const retentionLockKey = 0x6f7574626f7873 // "outboxs"

// unlockTimeout bounds the unlock at the end of a cycle, which runs even
// when the cycle's context has ended (shutdown).
const unlockTimeout = 5 * time.Second

var (
	// errAnomalyCap ends a cycle in which one sweep deleted AnomalyCap rows.
	errAnomalyCap = errors.New("anomaly cap reached; check the clock and the window before raising -retention-anomaly-cap")
	// errLockLost says the sweeper's session no longer held its lock at the
	// end of a cycle (the session was reset, or a transaction pooler ran the
	// unlock on another server connection): another replica may have swept
	// at the same time. The deletes are idempotent, so nothing is lost.
	errLockLost = errors.New("retention lock lost during the cycle (behind a transaction pooler such as PgBouncer, set -pool-mode transaction)")
)

// sweep is one periodic bound: a table, its window and its delete.
type sweep struct {
	name   string        // as logs and metrics name it
	table  string        // for metrics: rows pruned by table
	window time.Duration // rows older than this go; 0 disables the sweep
	// deleteSQL deletes at most $2 rows older than $1 seconds by
	// PostgreSQL's clock, the one that stamped them.
	deleteSQL string

	// Counters for the overview and /metrics, only ever incremented.
	rows    atomic.Int64 // rows deleted
	capHits atomic.Int64 // cycles this sweep stopped at the anomaly cap
}

// deleteFinishedJobsSQL deletes jobs in a final state (completed or
// discarded, each with its own window) finished before the cutoff; the
// inner SELECT is served by jobs_finished_by_state_finalized_at. The state
// is written into the statement, not passed: a constant is what lets the
// planner prove the partial index's predicate.
//
// FOR UPDATE SKIP LOCKED in each sweep's inner SELECT re-checks every row
// against the WHERE as it is locked, so a row changed since the statement
// began (a discarded job retried by hand) is left alone, and a row that
// someone holds is skipped instead of waited for.
func deleteFinishedJobsSQL(state jobState) string {
	return `
DELETE FROM outbox.jobs
WHERE id IN (
  SELECT id
  FROM outbox.jobs
  WHERE state = '` + string(state) + `'
    AND finalized_at < now() - make_interval(secs => $1)
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`
}

// deleteEventsSQL deletes events fanned out before the cutoff whose jobs
// are all completed, oldest first. The ORDER BY is what makes the planner
// walk events_fanned_by_fanned_out_at and probe jobs_by_event_id per row,
// stopping after one batch; without it, it scans and anti-joins whole
// tables.
//
// Un-fanned and poisoned events are the backlog and are never deleted here:
// fanned_out_at IS NOT NULL excludes both (a poisoned row is never fanned).
// That predicate is also why a cycle does not drain the relay before it
// prunes: a relay pass first could only add fanned rows too young to go.
//
// A delivery never finds its event gone. Jobs read their event when they
// run, and jobs.event_id cascades on delete, so an event is kept while any
// of its jobs is not completed: available, running and retryable jobs will
// still run, and a discarded job may be retried by hand until the job
// cleaner removes it (DiscardedJobs), which then frees its event. The age is
// counted from fan-out, never earlier than created_at, so a replay clamped
// to the window by created_at never meets a row this deletes, and an event
// requeued after long poisoning still gets its full window.
const deleteEventsSQL = `
DELETE FROM outbox.events
WHERE id IN (
  SELECT e.id
  FROM outbox.events AS e
  WHERE e.fanned_out_at IS NOT NULL
    AND e.fanned_out_at < now() - make_interval(secs => $1)
    AND NOT EXISTS (
      SELECT 1
      FROM outbox.jobs AS j
      WHERE j.event_id = e.id
        AND j.state <> 'completed'
    )
  ORDER BY e.fanned_out_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`

// deleteInboxSQL deletes inbox records received before the cutoff. It
// deletes by ctid so that it assumes nothing of the inbox's key, only its
// received_at column; the inbox table wants an index on received_at.
const deleteInboxSQL = `
DELETE FROM outbox.inbox
WHERE ctid = ANY(ARRAY(
  SELECT ctid
  FROM outbox.inbox
  WHERE received_at < now() - make_interval(secs => $1)
  LIMIT $2
  FOR UPDATE SKIP LOCKED
))`

// deleteIdempotencyKeysSQL deletes POST /api/events's idempotency keys
// kept before the cutoff (the events window: a key answers as long as
// events retention promises), oldest first along
// idempotency_keys_by_created_at.
const deleteIdempotencyKeysSQL = `
DELETE FROM outbox.idempotency_keys
WHERE key IN (
  SELECT key
  FROM outbox.idempotency_keys
  WHERE created_at < now() - make_interval(secs => $1)
  ORDER BY created_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`

// deleteAuditSQL deletes audit trail entries recorded before the cutoff,
// oldest first along audit_log_by_at.
const deleteAuditSQL = `
DELETE FROM outbox.audit_log
WHERE id IN (
  SELECT id
  FROM outbox.audit_log
  WHERE at < now() - make_interval(secs => $1)
  ORDER BY at, id
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`

// newSweeps is the table of sweeps, in the order a cycle runs them. Adding
// a table is one line here and one window in RetentionConfig.
//
// The order is load-bearing:
//   - Finished jobs go before events, so an event's completed jobs are mostly
//     gone before the event is, and its delete cascades to few rows.
//   - Events go before the inbox, each sweep in its own statements and never
//     both in one transaction. A failure between them (the cycle stops at its
//     first error) then leaves inbox records that outlive their events, the
//     safe direction: a dedup record without its event costs a few bytes, an
//     event without its dedup record can be delivered twice. Never reorder.
//     Idempotency keys go after events for the same reason: a key without
//     its event answers its id and records nothing.
func newSweeps(cfg RetentionConfig) []*sweep {
	return []*sweep{
		{name: "jobs_completed", table: "outbox.jobs", window: cfg.CompletedJobs, deleteSQL: deleteFinishedJobsSQL(jobCompleted)},
		{name: "jobs_discarded", table: "outbox.jobs", window: cfg.DiscardedJobs, deleteSQL: deleteFinishedJobsSQL(jobDiscarded)},
		{name: "events", table: "outbox.events", window: cfg.Events, deleteSQL: deleteEventsSQL},
		{name: "idempotency_keys", table: "outbox.idempotency_keys", window: cfg.Events, deleteSQL: deleteIdempotencyKeysSQL},
		{name: "inbox", table: "outbox.inbox", window: cfg.Inbox, deleteSQL: deleteInboxSQL},
		{name: "delivery_stats", table: "outbox.delivery_stats", window: cfg.DeliveryStats, deleteSQL: deleteStatsSQL("outbox.delivery_stats")},
		{name: "fanout_stats", table: "outbox.fanout_stats", window: cfg.DeliveryStats, deleteSQL: deleteStatsSQL("outbox.fanout_stats")},
		{name: "inbox_stats", table: "outbox.inbox_stats", window: cfg.DeliveryStats, deleteSQL: deleteStatsSQL("outbox.inbox_stats")},
		{name: "audit_log", table: "outbox.audit_log", window: cfg.Audit, deleteSQL: deleteAuditSQL},
	}
}

// sweeper runs the sweeps. Run drives it; sweepOnce is one cycle.
type sweeper struct {
	db     *sql.DB
	cfg    RetentionConfig
	sweeps []*sweep // fixed at construction
	jitter time.Duration
	// after is time.After, the wait for the jitter and the pause between
	// two batches; a test sees and controls those waits through it.
	after  func(time.Duration) <-chan time.Time
	logger *slog.Logger

	// Counters for /metrics, only ever incremented.
	cycles  atomic.Int64 // cycles this process swept
	skipped atomic.Int64 // cycles skipped: another replica held the lock
	failed  atomic.Int64 // cycles that ended in an error (the anomaly cap included)
}

// newSweeper builds the sweeper. jitterSeed names this process (hostname and
// pid in run), so that its sweeps are offset from other processes'.
func newSweeper(db *sql.DB, cfg RetentionConfig, jitterSeed string, logger *slog.Logger) *sweeper {
	return &sweeper{
		db:     db,
		cfg:    cfg,
		sweeps: newSweeps(cfg),
		jitter: sweepJitter(jitterSeed, cfg.Interval),
		after:  time.After,
		logger: logger.With("loop", "retention"),
	}
}

// sweepJitter is the offset of a process's cycles within the interval, a
// hash of seed: replicas started together, and a replica after a restart,
// sweep at different times, while one process always keeps its own rhythm.
func sweepJitter(seed string, interval time.Duration) time.Duration {
	if interval <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(seed))
	return time.Duration(h.Sum64() % uint64(interval))
}

// Run sweeps once after the jitter, then every Interval, until ctx ends. An
// error ends the cycle, not the loop: the next tick tries again.
func (s *sweeper) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.after(s.jitter):
	}
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		s.cycle(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// cycle runs sweepOnce, logs its outcome and leaves it in the database for
// the overview: the loop's boundary.
func (s *sweeper) cycle(ctx context.Context) {
	res, err := s.sweepOnce(ctx)
	if !res.Skipped && ctx.Err() == nil {
		if recErr := s.recordCycle(err); recErr != nil {
			s.logger.Warn("retention: record the cycle's outcome", "err", recErr)
		}
	}
	switch {
	case errors.Is(err, errAnomalyCap):
		s.logger.Warn("retention cycle stopped at the anomaly cap", "deleted", res.Deleted, "cap", s.cfg.AnomalyCap, "err", err)
	case err != nil && ctx.Err() == nil:
		s.logger.Error("retention cycle failed", "deleted", res.Deleted, "err", err)
	case res.Skipped:
		s.logger.Debug("retention cycle skipped: another replica is sweeping")
	case res.HandedOver:
		s.logger.Info("retention cycle handed over: another replica took the lock between two batches", "deleted", res.Deleted)
	case err == nil:
		var total int64
		for _, n := range res.Deleted {
			total += n
		}
		level := slog.LevelDebug
		if total > 0 {
			level = slog.LevelInfo
		}
		s.logger.Log(ctx, level, "retention cycle done", "deleted", res.Deleted)
	}
}

// recordCycleSQL keeps the outcome of the last cycle; ” is success.
const recordCycleSQL = `
INSERT INTO outbox.retention_last_cycle (singleton, finished_at, error)
VALUES (true, now(), $1)
ON CONFLICT (singleton) DO UPDATE
SET finished_at = EXCLUDED.finished_at,
    error = EXCLUDED.error`

// recordCycle writes a cycle's outcome through the pool, not the lock's
// connection, which a failure may have taken down with it.
func (s *sweeper) recordCycle(cycleErr error) error {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	var text string
	if cycleErr != nil {
		text = truncate(cycleErr.Error(), maxErrorLen)
	}
	if _, err := s.db.ExecContext(ctx, recordCycleSQL, text); err != nil {
		return fmt.Errorf("retention: record cycle: %w", err)
	}
	return nil
}

// cycleResult is what one cycle did.
type cycleResult struct {
	Skipped bool // another replica held the lock; nothing was done
	// HandedOver: per-batch locks only, another replica took the lock
	// between two batches and sweeps the rest (sweepHold).
	HandedOver bool
	Deleted    map[string]int64 // rows deleted, by sweep name; swept sweeps only
	Disabled   []int64          // endpoints disabled for failing too long
	// SecretsCleared counts the rotated-out secrets cleared, of endpoints
	// and sources.
	SecretsCleared int64
}

// sweepOnce is one cycle: take the lock or skip, run every sweep in order
// under it, release it. It stops at the first error: a failed statement may
// mean the lock is gone.
func (s *sweeper) sweepOnce(ctx context.Context) (cycleResult, error) {
	hold, locked, err := s.lock(ctx)
	if err != nil {
		return cycleResult{}, err
	}
	if !locked {
		s.skipped.Add(1)
		return cycleResult{Skipped: true}, nil
	}
	res, err := s.sweepAll(ctx, hold)
	if unlockErr := hold.release(ctx); unlockErr != nil {
		err = errors.Join(err, unlockErr)
	}
	switch {
	case errors.Is(err, errSweepTaken) && hold.batches == 0:
		// Per-batch locks: another replica held the lock at this cycle's
		// first batch, so it sweeps and this one did nothing.
		s.skipped.Add(1)
		return cycleResult{Skipped: true}, nil
	case errors.Is(err, errSweepTaken):
		// Another replica took the lock between two batches and is
		// sweeping; what this cycle leaves stays expired for the next.
		res.HandedOver, err = true, nil
	}
	s.cycles.Add(1)
	if err != nil {
		s.failed.Add(1)
	}
	return res, err
}

// sweepAll runs every sweep in order, then the endpoint and secret bounds,
// each statement under hold.
func (s *sweeper) sweepAll(ctx context.Context, hold *sweepHold) (res cycleResult, err error) {
	res.Deleted = map[string]int64{}
	for _, sw := range s.sweeps {
		n, swept, err := s.runSweep(ctx, hold, sw)
		if swept {
			res.Deleted[sw.name] = n
		}
		if err != nil {
			return res, err
		}
	}
	if res.Disabled, err = s.disableFailingEndpoints(ctx, hold); err != nil {
		return res, err
	}
	res.SecretsCleared, err = s.clearRotatedOutSecrets(ctx, hold)
	return res, err
}

// sweepQuerier is what a batch's statements run on: the session that holds
// the session lock (*sql.Conn), or the batch's own transaction (*sql.Tx).
type sweepQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// sweepHold is a cycle's hold on the retention lock, in one of two forms.
//
// Session (conn set): one connection holds the session advisory lock for
// the whole cycle and runs every statement, so among any number of
// replicas exactly one sweeps a cycle. It needs a session that lasts the
// cycle, which a transaction pooler (PgBouncer, pool_mode = transaction)
// does not give: there the lock stays on whichever server connection ran
// the try-lock, the unlock runs on another, and cycles mostly skip.
//
// Per batch (conn nil, RetentionConfig.XactLocks): every batch is its own
// transaction, which first takes the transaction-scoped lock
// (pg_try_advisory_xact_lock) and holds it to its commit. Nothing outlives
// the transaction, so it is correct through any pooler, and no two
// replicas ever run a batch at once. A cycle that finds the lock taken at
// its first batch skips; one that finds it taken later hands over
// (cycleResult.HandedOver): another replica took it in a pause between two
// batches and is sweeping, and any row this cycle leaves stays expired for
// the next cycle, of either replica.
type sweepHold struct {
	conn *sql.Conn // the session that holds the session lock; nil per batch
	db   *sql.DB   // per batch: where each batch's transaction begins
	// batches is how many batches took the per-batch lock.
	batches int
}

// errSweepTaken says a batch's transaction found the per-batch lock held by
// another replica.
var errSweepTaken = errors.New("retention lock held by another replica")

// lock begins a cycle's hold. Session: it takes the session lock on a
// connection of its own and reports whether it got it. Per batch: each
// batch takes the lock, so this takes nothing.
func (s *sweeper) lock(ctx context.Context) (hold *sweepHold, locked bool, err error) {
	if s.cfg.XactLocks {
		return &sweepHold{db: s.db}, true, nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("retention: connect: %w", err)
	}
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, retentionLockKey).Scan(&locked); err != nil {
		discardConn(conn) // the lock may have been granted before the error
		return nil, false, fmt.Errorf("retention: try lock: %w", err)
	}
	if !locked {
		conn.Close() // holds no lock: back to the pool
		return nil, false, nil
	}
	return &sweepHold{conn: conn}, true, nil
}

// tryXactLockSQL takes the per-batch lock, released at the transaction's
// end; it answers false at once when another transaction holds it.
const tryXactLockSQL = `SELECT pg_try_advisory_xact_lock($1)`

// run runs one batch's statements under the lock: on the session, or in a
// transaction of its own that takes the lock first and commits after
// batch, or returns errSweepTaken without running it.
func (h *sweepHold) run(ctx context.Context, batch func(q sweepQuerier) error) error {
	if h.conn != nil {
		return batch(h.conn)
	}
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("retention: begin batch: %w", err)
	}
	defer tx.Rollback()
	var locked bool
	if err := tx.QueryRowContext(ctx, tryXactLockSQL, retentionLockKey).Scan(&locked); err != nil {
		return fmt.Errorf("retention: try lock: %w", err)
	}
	if !locked {
		return errSweepTaken
	}
	h.batches++
	if err := batch(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("retention: commit batch: %w", err)
	}
	return nil
}

// release ends the hold: the session lock's unlock (releaseLock); nothing
// per batch, whose locks ended with their transactions.
func (h *sweepHold) release(ctx context.Context) error {
	if h.conn == nil {
		return nil
	}
	return releaseLock(ctx, h.conn)
}

// disableFailingEndpointsSQL disables endpoints failing for longer than $1
// seconds and records why. failing_since is cleared by any 2xx, so it is
// the start of an unbroken run of failures. The statement is bounded by
// the number of endpoints, which people create by hand.
const disableFailingEndpointsSQL = `
UPDATE outbox.endpoints
SET disabled_at = now(),
    disabled_reason = 'failing continuously since '
                      || to_char(failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"')
                      || ' (longer than ' || justify_interval(make_interval(secs => $1))::text || ')',
    disabled_cause = 'failure',
    updated_at = now()
WHERE disabled_at IS NULL
  AND failing_since < now() - make_interval(secs => $1)
RETURNING id`

// disableFailingEndpoints is the endpoint bound: deliveries to a receiver
// that has been failing for EndpointDisableAfter stop being enqueued (the
// relay skips disabled endpoints) until its owner re-enables it, or a
// recovery probe's 2xx does (probe.go). It runs
// under the lock, so one replica does it.
func (s *sweeper) disableFailingEndpoints(ctx context.Context, hold *sweepHold) ([]int64, error) {
	if s.cfg.EndpointDisableAfter <= 0 {
		return nil, nil
	}
	var ids []int64
	err := hold.run(ctx, func(q sweepQuerier) (err error) {
		ids, err = queryAll(ctx, q, scanID, disableFailingEndpointsSQL, s.cfg.EndpointDisableAfter.Seconds())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("retention: disable failing endpoints: %w", err)
	}
	for _, id := range ids {
		s.logger.Warn("endpoint disabled: failing for too long; its owner can re-enable it", "endpoint_id", id, "after", s.cfg.EndpointDisableAfter)
	}
	return ids, nil
}

// clearEndpointSecretsSQL and clearSourceSecretsSQL forget, in at most $1
// rows, a previous secret whose rotation window has ended: nothing signs or
// verifies with it any more (every read stops at
// previous_secret_expires_at), so keeping it only keeps a secret. SKIP
// LOCKED leaves a row being rotated to its rotation, which rewrites both
// columns anyway. Neither table has an index for this: both hold rows
// people create by hand.
const clearEndpointSecretsSQL = `
UPDATE outbox.endpoints
SET previous_secret = NULL,
    previous_secret_expires_at = NULL,
    previous_public_key = NULL
WHERE id IN (
  SELECT id
  FROM outbox.endpoints
  WHERE previous_secret_expires_at <= now()
  LIMIT $1
  FOR NO KEY UPDATE SKIP LOCKED
)`

const clearSourceSecretsSQL = `
UPDATE outbox.inbox_sources
SET previous_secret = NULL,
    previous_secret_expires_at = NULL
WHERE name IN (
  SELECT name
  FROM outbox.inbox_sources
  WHERE previous_secret_expires_at <= now()
  LIMIT $1
  FOR NO KEY UPDATE SKIP LOCKED
)`

// clearRotatedOutSecrets clears, under the lock, at most one batch of
// rotated-out secrets per table a cycle; any left over wait for the next
// cycle, harmlessly, since none of them is read.
func (s *sweeper) clearRotatedOutSecrets(ctx context.Context, hold *sweepHold) (int64, error) {
	var cleared int64
	err := hold.run(ctx, func(q sweepQuerier) error {
		for _, query := range []string{clearEndpointSecretsSQL, clearSourceSecretsSQL} {
			r, err := q.ExecContext(ctx, query, s.cfg.BatchSize)
			if err != nil {
				return fmt.Errorf("retention: clear rotated-out secrets: %w", err)
			}
			n, err := r.RowsAffected()
			if err != nil {
				return fmt.Errorf("retention: clear rotated-out secrets: %w", err)
			}
			cleared += n
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if cleared > 0 {
		s.logger.Info("rotated-out secrets cleared: their rotation windows have ended", "secrets", cleared)
	}
	return cleared, nil
}

// runSweep deletes sw's expired rows in batches under hold. swept is false
// when the sweep is disabled.
func (s *sweeper) runSweep(ctx context.Context, hold *sweepHold, sw *sweep) (deleted int64, swept bool, err error) {
	if sw.window <= 0 {
		return 0, false, nil
	}
	capacity := int64(s.cfg.AnomalyCap)
	for {
		limit := min(int64(s.cfg.BatchSize), capacity-deleted)
		start := time.Now()
		var n int64
		err := hold.run(ctx, func(q sweepQuerier) error {
			r, err := q.ExecContext(ctx, sw.deleteSQL, sw.window.Seconds(), limit)
			if err != nil {
				return err
			}
			n, err = r.RowsAffected()
			return err
		})
		if err != nil {
			return deleted, true, fmt.Errorf("retention: sweep %s: %w", sw.name, err)
		}
		deleted += n
		sw.rows.Add(n)
		if n < limit {
			return deleted, true, nil
		}
		if deleted >= capacity {
			sw.capHits.Add(1)
			return deleted, true, fmt.Errorf("retention: sweep %s deleted %d rows in one cycle: %w", sw.name, deleted, errAnomalyCap)
		}
		select {
		case <-ctx.Done():
			return deleted, true, fmt.Errorf("retention: sweep %s: %w", sw.name, ctx.Err())
		case <-s.after(sweepPause(time.Since(start))):
		}
	}
}

// releaseLock ends the cycle's hold on the retention lock. It unlocks on the
// session that locked, and only a true answer (the session held the lock and
// now does not) lets the connection go back to the pool. (*sql.Conn).Close
// alone would return it still holding the lock, and every later try-lock,
// on every replica, would fail. On an error or a false answer the connection
// is discarded instead: PostgreSQL drops a session's locks when it ends.
func releaseLock(ctx context.Context, conn *sql.Conn) error {
	// The cycle's context may have ended (shutdown); the unlock must run.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	var unlocked bool
	err := conn.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, retentionLockKey).Scan(&unlocked)
	if err != nil {
		discardConn(conn)
		return fmt.Errorf("retention: unlock (connection closed instead): %w", err)
	}
	if !unlocked {
		discardConn(conn)
		return fmt.Errorf("retention: unlock: %w", errLockLost)
	}
	return conn.Close()
}

// discardConn closes conn's session instead of returning it to the pool:
// database/sql closes a connection when Raw's function reports it bad.
func discardConn(conn *sql.Conn) {
	conn.Raw(func(any) error { return driver.ErrBadConn })
	conn.Close() // ErrConnDone: already closed
}

// sweepStats is one sweep's counters, as /metrics reads them.
type sweepStats struct {
	Sweep   string // jobs_completed, jobs_discarded, events, inbox
	Table   string // outbox.jobs, outbox.events, outbox.inbox
	Rows    int64  // rows deleted since start
	CapHits int64  // cycles stopped by the anomaly cap
}

// Stats lists every sweep's counters in cycle order.
func (s *sweeper) Stats() []sweepStats {
	stats := make([]sweepStats, 0, len(s.sweeps))
	for _, sw := range s.sweeps {
		stats = append(stats, sweepStats{Sweep: sw.name, Table: sw.table, Rows: sw.rows.Load(), CapHits: sw.capHits.Load()})
	}
	return stats
}

// PrunedByTable is the rows deleted since start, by table.
func (s *sweeper) PrunedByTable() map[string]int64 {
	pruned := map[string]int64{}
	for _, sw := range s.sweeps {
		pruned[sw.table] += sw.rows.Load()
	}
	return pruned
}
