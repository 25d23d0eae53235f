// jobs.go: the job table as the operator sees it, listing jobs with their
// errors and retrying them by hand.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
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
	rows, err := db.QueryContext(ctx, listJobsSQL, f.Before, f.State, f.EventID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	defer rows.Close()
	jobs := []JobView{}
	for rows.Next() {
		var j JobView
		var errs []byte
		if err := rows.Scan(&j.ID, &j.Kind, &j.EventID, &j.State, &j.Attempt, &j.MaxAttempts,
			&j.CreatedAt, &j.ScheduledAt, &j.AttemptedAt, &j.FinalizedAt, &errs); err != nil {
			return nil, fmt.Errorf("list jobs: %w", err)
		}
		j.Errors = errs
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return jobs, nil
}

// retryJobSQL makes a discarded or waiting job run now. A job that used
// all its attempts gets one more, so the claim's attempt + 1 stays within
// max_attempts; its error history stays.
const retryJobSQL = `
UPDATE outbox.jobs
SET state = 'available',
    scheduled_at = now(),
    finalized_at = NULL,
    max_attempts = greatest(max_attempts, attempt + 1)
WHERE id = $1
  AND state IN ('discarded', 'retryable', 'available')
RETURNING id`

// retryJob retries one job by hand and wakes the workers.
func retryJob(ctx context.Context, db *sql.DB, id int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("retry job %d: %w", id, err)
	}
	defer tx.Rollback()
	err = tx.QueryRowContext(ctx, retryJobSQL, id).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("retry job %d: %w (or running, or completed)", id, errNotFound)
	}
	if err != nil {
		return fmt.Errorf("retry job %d: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_notify('outbox_jobs', '')`); err != nil {
		return fmt.Errorf("retry job %d: notify: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("retry job %d: %w", id, err)
	}
	return nil
}
