// jobs.go: the job table as the operator sees it, listing jobs with their
// errors and retrying them by hand.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// JobView is a job as the API and the panel show it.
type JobView struct {
	ID          int64           `json:"id"`
	Kind        string          `json:"kind"`
	EventID     int64           `json:"event_id"`
	State       string          `json:"state"`
	Attempt     int             `json:"attempt"`
	MaxAttempts int             `json:"max_attempts"`
	CreatedAt   time.Time       `json:"created_at"`
	ScheduledAt time.Time       `json:"scheduled_at"`
	AttemptedAt *time.Time      `json:"attempted_at"`
	FinalizedAt *time.Time      `json:"finalized_at"`
	Errors      json.RawMessage `json:"errors"`
}

// JobFilter selects jobs, newest first, paged by id.
type JobFilter struct {
	State   string // "" or a job state
	EventID int64  // 0: any
	Before  int64
	Limit   int
}

func (f *JobFilter) validate() error {
	switch jobState(f.State) {
	case "", jobAvailable, jobRunning, jobRetryable, jobCompleted, jobDiscarded:
	default:
		return fmt.Errorf("%w: state %q must be available, running, retryable, completed or discarded", errInvalid, f.State)
	}
	if f.Limit <= 0 {
		f.Limit = defaultPageSize
	}
	f.Limit = min(f.Limit, maxEventPage)
	return nil
}

const listJobsSQL = `
SELECT id, kind, event_id, state::text, attempt, max_attempts,
       created_at, scheduled_at, attempted_at, finalized_at, errors
FROM outbox.jobs
WHERE ($1::bigint = 0 OR id < $1::bigint)
  AND ($2 = '' OR state = $2::outbox.job_state)
  AND ($3::bigint = 0 OR event_id = $3::bigint)
ORDER BY id DESC
LIMIT $4`

// listJobs reads one page of jobs.
func listJobs(ctx context.Context, db *sql.DB, f JobFilter) ([]JobView, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	jobs, err := queryAll(ctx, db, scanJobView, listJobsSQL, f.Before, f.State, f.EventID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return jobs, nil
}

func scanJobView(row rowScanner) (JobView, error) {
	var j JobView
	var errs []byte
	err := row.Scan(&j.ID, &j.Kind, &j.EventID, &j.State, &j.Attempt, &j.MaxAttempts,
		&j.CreatedAt, &j.ScheduledAt, &j.AttemptedAt, &j.FinalizedAt, &errs)
	j.Errors = errs
	return j, err
}

// manualBatch bounds one statement of work an operator starts by hand (a
// replay, a retry of an endpoint's discarded deliveries), like every
// sweep's batch: a replay of a week runs in many short statements that
// hold few locks, not one.
const manualBatch = 5000

// retrySetSQL is how a job is put back in the queue, by hand or by a
// replay: due now and not finished, with its error history kept. A job
// that used all its attempts gets one more, so the claim's attempt + 1
// stays within max_attempts. The statements that use it update
// outbox.jobs without an alias.
const retrySetSQL = `
SET state = 'available',
    scheduled_at = now(),
    finalized_at = NULL,
    max_attempts = greatest(outbox.jobs.max_attempts, outbox.jobs.attempt + 1)`

// retryJobSQL retries one job that is not running or completed.
const retryJobSQL = `
UPDATE outbox.jobs` + retrySetSQL + `
WHERE id = $1
  AND state IN ('discarded', 'retryable', 'available')
RETURNING id`

// retryJob retries one job by hand and wakes the workers.
func retryJob(ctx context.Context, db *sql.DB, id int64) error {
	found, err := updateOneAndNotify(ctx, db, jobsChannel, retryJobSQL, id)
	if err != nil {
		return fmt.Errorf("retry job %d: %w", id, err)
	}
	if !found {
		return fmt.Errorf("retry job %d: %w (or running, or completed)", id, errNotFound)
	}
	return nil
}

// retryDiscardedSQL retries up to $2 of an endpoint's discarded jobs.
const retryDiscardedSQL = `
WITH discarded AS (
  SELECT id
  FROM outbox.jobs
  WHERE endpoint_id = $1
    AND state = 'discarded'
  ORDER BY id
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
UPDATE outbox.jobs` + retrySetSQL + `
FROM discarded
WHERE outbox.jobs.id = discarded.id`

// retryDiscarded retries every discarded delivery of an endpoint, in
// batches of manualBatch, and wakes the workers.
func retryDiscarded(ctx context.Context, db *sql.DB, endpointID int64) (int64, error) {
	if _, err := getEndpoint(ctx, db, endpointID); err != nil {
		return 0, err
	}
	var total int64
	for {
		res, err := db.ExecContext(ctx, retryDiscardedSQL, endpointID, manualBatch)
		if err != nil {
			return total, fmt.Errorf("retry discarded jobs of endpoint %d: %w", endpointID, err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < manualBatch {
			break
		}
	}
	if err := notify(ctx, db, jobsChannel); err != nil {
		return total, fmt.Errorf("retry discarded jobs of endpoint %d: %w", endpointID, err)
	}
	return total, nil
}
