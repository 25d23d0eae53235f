// rescue.go: the rescuer, which returns to the queue the jobs whose worker
// died. Three ways to know it died:
//
//   - its process is gone, seen by a replica starting on the same host
//     (declareGoneProcessesDead): a restart after a crash declares its
//     predecessor dead as it registers, and the rescuer's first pass
//     rescues its jobs, without waiting out its dead_after;
//   - its replica stopped heartbeating (replicas.go): a replica not seen
//     within its dead_after (15 s) is declared dead, its row deleted, and
//     every job still running under its id is rescued, within seconds;
//   - the horizon, the fallback for jobs of no known replica (claimed
//     before this process registered, or by psql): a job still
//     running past the attempt timeout plus a margin is one no live worker
//     can still hold.
//
// Either way a late outcome from that worker changes nothing (the
// completer fences outcomes on the attempt number), and a replica declared dead
// claims nothing more under its id (outbox.claim_lane_jobs).

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lib/pq"
)

// rescuer returns jobs whose worker died to the queue.
type rescuer struct {
	db       *sql.DB
	cfg      WorkerConfig
	replicas ReplicaConfig
	logger   *slog.Logger

	// Counters for /metrics, only ever incremented.
	rescued       atomic.Int64 // jobs rescued past the horizon
	rescuedOfDead atomic.Int64 // jobs rescued from replicas declared dead
	declaredDead  atomic.Int64 // replicas this process declared dead
}

func newRescuer(db *sql.DB, cfg WorkerConfig, replicas ReplicaConfig, logger *slog.Logger) *rescuer {
	return &rescuer{db: db, cfg: cfg, replicas: replicas, logger: logger.With("loop", "rescuer")}
}

// Run rescues once at start, then the jobs of dead replicas every
// heartbeat and stuck jobs every RescueInterval.
func (r *rescuer) Run(ctx context.Context) error {
	horizon := time.NewTicker(r.cfg.RescueInterval)
	defer horizon.Stop()
	dead := time.NewTicker(r.replicas.Heartbeat)
	defer dead.Stop()
	byHorizon, byHeartbeat := true, true
	for {
		if byHeartbeat {
			if _, err := r.rescueDeadReplicas(ctx); err != nil && ctx.Err() == nil {
				r.logger.Error("rescue of dead replicas' jobs failed", "err", err)
			}
		}
		if byHorizon {
			if n, err := r.rescueOnce(ctx); err != nil && ctx.Err() == nil {
				r.logger.Error("rescue failed", "err", err)
			} else if n > 0 {
				r.logger.Warn("rescued jobs whose worker stopped answering", "jobs", n)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-horizon.C:
			byHorizon, byHeartbeat = true, false
		case <-dead.C:
			byHorizon, byHeartbeat = false, true
		}
	}
}

// rescueBatch bounds one rescue statement.
const rescueBatch = 1000

// rescueJobsSQL finds jobs running for longer than the horizon ($1 seconds:
// the attempt timeout plus a margin, so no live worker can still hold one;
// for a delivery to an endpoint with a longer timeout of its own, that
// timeout plus the margin, $3 seconds, as the worker's attempt lasts that
// long: endpointRequest.attemptTimeout) and ends their attempts
// (schema.sql, outbox.rescue_jobs): retryable now, or discarded if that
// was their last. now() is the database's clock, the one that stamped
// attempted_at.
var rescueJobsSQL = `
WITH stuck AS (
  SELECT j.id
  FROM outbox.jobs AS j
  LEFT JOIN outbox.endpoints AS ep ON ep.id = j.endpoint_id
  WHERE j.state = 'running'
    AND j.attempted_at < now() - make_interval(secs => $1)
    AND (ep.timeout_seconds IS NULL OR j.attempted_at < now() - make_interval(secs => ep.timeout_seconds + $3::double precision))
  ORDER BY j.attempted_at
  LIMIT $2
  FOR UPDATE OF j SKIP LOCKED
)
SELECT r.endpoint_id, r.lane_key
FROM outbox.rescue_jobs(ARRAY(SELECT s.id FROM stuck AS s ORDER BY s.id),
                        ARRAY(SELECT 'rescued: still running after ' || $1 || ' s; its worker stopped'
                              FROM stuck AS s ORDER BY s.id)) AS r`

// rescueOnce rescues every stuck job, in batches.
func (r *rescuer) rescueOnce(ctx context.Context) (int64, error) {
	horizon := (r.cfg.AttemptTimeout + r.cfg.RescueMargin).Seconds()
	n, err := r.rescueAll(ctx, &r.rescued, rescueJobsSQL, horizon, rescueBatch, r.cfg.RescueMargin.Seconds())
	if err != nil {
		return n, fmt.Errorf("rescue jobs: %w", err)
	}
	return n, nil
}

// rescueAll runs a rescue batch by batch (rescueBatchOf) until one comes
// back short, counting what it rescued in counted.
func (r *rescuer) rescueAll(ctx context.Context, counted *atomic.Int64, query string, args ...any) (int64, error) {
	var total int64
	for {
		n, err := r.rescueBatchOf(ctx, query, args...)
		if err != nil {
			return total, err
		}
		total += n
		counted.Add(n)
		if n < rescueBatch {
			return total, nil
		}
	}
}

// rescueBatchOf runs one batch of a rescue (rescueJobsSQL or
// rescueOrphanedJobsSQL, which return each job's lane) and advances the
// ordered lanes of the jobs it rescued, in one transaction, as the
// completer does after an outcome: a job discarded on its last attempt
// has left its lane, and its subject's next delivery may go. One made
// retryable is still its lane's active delivery, and advances nothing
// (schema.sql, outbox.advance_lanes). It reports how many it rescued.
func (r *rescuer) rescueBatchOf(ctx context.Context, query string, args ...any) (int64, error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	n, err := rescueBatchTx(ctx, tx, query, args...)
	if err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// rescueBatchTx is rescueBatchOf's work in tx. It locks outbox.events
// first (lockEventsFirst): the rescue reads jobs and replicas, and the
// lanes' advance events, after them.
func rescueBatchTx(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	if err := lockEventsFirst(ctx, tx); err != nil {
		return 0, err
	}
	rows, err := queryAll(ctx, tx, scanFinishedLane, query, args...)
	if err != nil {
		return 0, err
	}
	if err := advanceLanes(ctx, tx, finishedLanes(rows)); err != nil {
		return 0, err
	}
	return int64(len(rows)), nil
}

// declareDeadReplicasSQL deletes the rows of the replicas not seen within
// their own dead_after: they are declared dead. Deleting a row waits for
// a claim of that replica in flight (outbox.claim_lane_jobs locks its row), so
// the statement after it sees every job the dead replica claimed, and no
// claim under its id succeeds after.
const declareDeadReplicasSQL = `
DELETE FROM outbox.replicas
WHERE last_seen < now() - dead_after
RETURNING id, host, pid, extract(epoch FROM now() - last_seen)::float8`

// rescueOrphanedJobsSQL rescues up to $1 running jobs whose replica is no
// longer registered (declared dead, or stopped without finishing them),
// like rescueJobsSQL does past the horizon. A replica's id is never used
// again, so a job held by a missing id is one no live worker holds. Jobs
// locked by a paused replica's transaction are skipped, and found by a
// later pass. Read through jobs_running_by_attempted_at: the running jobs
// are at most the replicas' worker slots.
var rescueOrphanedJobsSQL = `
WITH orphaned AS (
  SELECT j.id, j.held_by
  FROM outbox.jobs AS j
  WHERE j.state = 'running'
    AND j.held_by IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM outbox.replicas AS r WHERE r.id = j.held_by)
  ORDER BY j.attempted_at
  LIMIT $1
  FOR UPDATE OF j SKIP LOCKED
)
SELECT r.endpoint_id, r.lane_key
FROM outbox.rescue_jobs(ARRAY(SELECT o.id FROM orphaned AS o ORDER BY o.id),
                        ARRAY(SELECT 'rescued: replica ' || o.held_by || ' running it stopped heartbeating'
                              FROM orphaned AS o ORDER BY o.id)) AS r`

// deadReplica is a replica declared dead.
type deadReplica struct {
	ID         int64
	Host       string
	PID        int
	SilentSecs float64 // since its last heartbeat
}

func scanDeadReplica(row rowScanner) (deadReplica, error) {
	var d deadReplica
	err := row.Scan(&d.ID, &d.Host, &d.PID, &d.SilentSecs)
	return d, err
}

// rescueDeadReplicas declares dead the replicas that stopped heartbeating,
// then rescues every running job of a replica no longer registered. It
// returns how many jobs it rescued.
func (r *rescuer) rescueDeadReplicas(ctx context.Context) (int64, error) {
	dead, err := queryAll(ctx, r.db, scanDeadReplica, declareDeadReplicasSQL)
	if err != nil {
		return 0, fmt.Errorf("declare dead replicas: %w", err)
	}
	for _, d := range dead {
		r.declaredDead.Add(1)
		r.logger.Warn("replica declared dead: no heartbeat within its dead_after; rescuing its running jobs",
			"replica", d.ID, "host", d.Host, "pid", d.PID, "silent", time.Duration(d.SilentSecs*float64(time.Second)).Round(time.Millisecond))
	}
	total, err := r.rescueAll(ctx, &r.rescuedOfDead, rescueOrphanedJobsSQL, rescueBatch)
	if err != nil {
		return total, fmt.Errorf("rescue jobs of dead replicas: %w", err)
	}
	if total > 0 {
		r.logger.Warn("rescued the running jobs of replicas no longer registered", "jobs", total)
	}
	return total, nil
}

// localReplicasSQL lists the other registrations from this host whose pid
// is a number of this process's pid namespace in this boot ($2,
// replicaSelf.PIDNamespace): those whose process this one can look up.
// One row per process there, and up to $4.
const localReplicasSQL = `
SELECT id, pid, coalesce(pid_start, 0)
FROM outbox.replicas
WHERE host = $1
  AND pid_namespace = $2
  AND id <> $3
ORDER BY id
LIMIT $4`

// localReplica is a row of localReplicasSQL.
type localReplica struct {
	ID      int64
	PID     int
	Started int64 // clock ticks after boot; 0 unknown
}

func scanLocalReplica(row rowScanner) (localReplica, error) {
	var l localReplica
	err := row.Scan(&l.ID, &l.PID, &l.Started)
	return l, err
}

// declareGoneSQL declares dead the replicas $1, whose process is gone:
// their rows are deleted, as declareDeadReplicasSQL deletes those of
// replicas that stopped heartbeating, and their jobs are then orphans
// (rescueOrphanedJobsSQL).
const declareGoneSQL = `
DELETE FROM outbox.replicas
WHERE id = ANY ($1)
RETURNING id, host, pid, extract(epoch FROM now() - last_seen)::float8`

// declareGoneProcessesDead declares dead, at once, the replicas registered
// from this host and pid namespace whose process is gone (processGone):
// after a crash and a restart, the predecessor's row would otherwise keep
// its running jobs for its whole dead_after (15 s), though the restart can
// see that its process no longer runs. The rescuer's next pass, the first
// of a process that just started, rescues their jobs. self is this process, registered as selfID. It declares
// nothing when this process does not know its pid namespace (off Linux).
func declareGoneProcessesDead(ctx context.Context, db *sql.DB, self replicaSelf, selfID int64, logger *slog.Logger) (int, error) {
	if self.PIDNamespace == "" {
		return 0, nil
	}
	local, err := queryAll(ctx, db, scanLocalReplica, localReplicasSQL, self.Host, self.PIDNamespace, selfID, rescueBatch)
	if err != nil {
		return 0, fmt.Errorf("list this host's replicas: %w", err)
	}
	var gone []int64
	for _, l := range local {
		if processGone(l.PID, l.Started) {
			gone = append(gone, l.ID)
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	dead, err := queryAll(ctx, db, scanDeadReplica, declareGoneSQL, pq.Array(gone))
	if err != nil {
		return 0, fmt.Errorf("declare dead the replicas whose process is gone: %w", err)
	}
	for _, d := range dead {
		logger.Warn("replica declared dead: its process on this host is gone; its running jobs are rescued now",
			"replica", d.ID, "pid", d.PID, "silent", time.Duration(d.SilentSecs*float64(time.Second)).Round(time.Millisecond))
	}
	return len(dead), nil
}

// processGone reports whether the process numbered pid in this pid
// namespace, which started at started (clock ticks after boot), has ended:
// no process has that number, the one that has it is a zombie, or it
// started at another time (the number was given to a later process, as
// pid 1 is to every container's first). When it cannot tell (no /proc, or
// a process it may not look at) it says no: a live replica declared dead
// would have its deliveries in flight sent again.
func processGone(pid int, started int64) bool {
	if pid <= 0 || started <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	state, now, err := readProcStat(pid)
	if err != nil {
		return false
	}
	return state == 'Z' || state == 'X' || now != started
}
