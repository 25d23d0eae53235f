// rescue.go: the rescuer, which returns to the queue the jobs whose worker
// died: a job still running past the attempt timeout plus a margin is one
// no live worker can still hold. A late outcome from such a worker changes
// nothing (deliver.go fences outcomes on the attempt number).

package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// rescuer returns jobs whose worker died to the queue.
type rescuer struct {
	db      *sql.DB
	cfg     WorkerConfig
	logger  *slog.Logger
	rescued atomic.Int64
}

func newRescuer(db *sql.DB, cfg WorkerConfig, logger *slog.Logger) *rescuer {
	return &rescuer{db: db, cfg: cfg, logger: logger.With("loop", "rescuer")}
}

// Run rescues stuck jobs once at start, then every RescueInterval.
func (r *rescuer) Run(ctx context.Context) error {
	tick := time.NewTicker(r.cfg.RescueInterval)
	defer tick.Stop()
	for {
		if n, err := r.rescueOnce(ctx); err != nil && ctx.Err() == nil {
			r.logger.Error("rescue failed", "err", err)
		} else if n > 0 {
			r.logger.Warn("rescued jobs whose worker stopped answering", "jobs", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// rescueBatch bounds one rescue statement.
const rescueBatch = 1000

// rescueJobsSQL finds jobs running for longer than the horizon ($1 seconds:
// the attempt timeout plus a margin, so no live worker can still hold one)
// and makes them retryable now, or discarded if that was their last
// attempt. now() is the database's clock, the one that stamped attempted_at.
const rescueJobsSQL = `
WITH stuck AS (
  SELECT id
  FROM outbox.jobs
  WHERE state = 'running'
    AND attempted_at < now() - make_interval(secs => $1)
  ORDER BY attempted_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
UPDATE outbox.jobs AS j
SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'discarded'
                 ELSE 'retryable' END::outbox.job_state,
    scheduled_at = now(),
    finalized_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempt, 'at', now(),
               'error', 'rescued: still running after ' || $1 || ' s; its worker stopped'))
FROM stuck
WHERE j.id = stuck.id`

// rescueOnce rescues every stuck job, in batches.
func (r *rescuer) rescueOnce(ctx context.Context) (int64, error) {
	horizon := (r.cfg.AttemptTimeout + r.cfg.RescueMargin).Seconds()
	var total int64
	for {
		res, err := r.db.ExecContext(ctx, rescueJobsSQL, horizon, rescueBatch)
		if err != nil {
			return total, fmt.Errorf("rescue jobs: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		r.rescued.Add(n)
		if n < rescueBatch {
			return total, nil
		}
	}
}
