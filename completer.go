// completer.go: the completer, which writes the workers' outcomes in
// batches: each job's outcome with its attempt, its statistics and what it
// did to its endpoint, in one call of schema.sql's outbox.record_outcomes.
//
// Guarantees (docs/guarantees.md, hops 4 and 5):
//   - An outcome is written only while the job is still running with the
//     attempt number the worker claimed. A worker that lost its job to the
//     rescuer (or to a retry by hand) changes nothing.
//   - A batch whose write failed leaves its jobs running: the rescuer runs
//     them again. A duplicate run is the price, never a lost job.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// completer writes the outcomes that come on results, in batches, until
// results is closed.
type completer struct {
	db               *sql.DB
	breakerThreshold int // WorkerConfig.BreakerThreshold
	results          chan jobResult
	// answered is the claimer's set of succeeded attempts not yet
	// written: a batch leaves it once written (or failed).
	answered *answeredJobs
	// recorded is poked after a batch that held a job claimed into a full
	// place (Job.wakeOnOutcome): the workers may claim more now.
	recorded chan struct{}
	// outcomeLinger is completeLinger, which tests lengthen.
	outcomeLinger time.Duration
	logger        *slog.Logger

	// What the outcome writes cost, for /metrics.
	outcomeBatches *histogram // one batch written, retries included, seconds
	outcomeJobs    atomic.Int64
}

func newCompleter(db *sql.DB, breakerThreshold, queue int, answered *answeredJobs, recorded chan struct{}, logger *slog.Logger) *completer {
	return &completer{
		db:               db,
		breakerThreshold: breakerThreshold,
		results:          make(chan jobResult, queue),
		answered:         answered,
		recorded:         recorded,
		outcomeLinger:    completeLinger,
		logger:           logger,
		outcomeBatches:   newHistogram(latencyBuckets),
	}
}

// completeBatchMax bounds one outcome statement.
const completeBatchMax = 500

// completeLinger is how long the completer waits for more outcomes to join
// a batch whose deliveries have all succeeded and already freed their
// places (jobResult.freesItsPlace). A statement of outcomes costs about
// the same for one job as for ten, and at a steady rate of a few hundred
// deliveries a second each would come alone: one statement a delivery, a
// third of the database's time per event. Nothing waits
// for such a batch: the receiver has its answer, the endpoint's place is
// free, and no claim is woken by it. Any other outcome (a failure, a hold,
// an ordered lane's head) is written at once, with whatever waits with it.
const completeLinger = 10 * time.Millisecond

// completeLoop writes outcomes in batches (gatherOutcomes) until results
// is closed.
func (c *completer) completeLoop() {
	for first := range c.results {
		batch := c.gatherOutcomes(first)
		began := time.Now()
		err := c.recordOutcomesRetrying(batch)
		c.answered.remove(batch)
		if err != nil {
			// The jobs stay running; the rescuer retries them. A duplicate
			// run is the price, never a lost job.
			c.logger.Error("record job outcomes failed; the rescuer will retry these jobs", "jobs", len(batch), "err", err)
		} else if slices.ContainsFunc(batch, func(r jobResult) bool { return r.wakeOnOutcome }) {
			poke(c.recorded)
		}
		// Counted last: once a batch shows in them, its poke is done.
		c.outcomeBatches.Observe(time.Since(began).Seconds())
		c.outcomeJobs.Add(int64(len(batch)))
	}
}

// gatherOutcomes is the batch that starts with first: every outcome
// waiting behind it, and, while every one of them may wait
// (mayWaitForBatch), those that come within the pool's outcomeLinger, up
// to completeBatchMax. It returns early when results is closed.
func (c *completer) gatherOutcomes(first jobResult) []jobResult {
	batch := []jobResult{first}
	mayWait := first.mayWaitForBatch()
	var linger <-chan time.Time // started when the batch first has to wait
	for len(batch) < completeBatchMax {
		var r jobResult
		var ok bool
		select {
		case r, ok = <-c.results:
		default:
			if !mayWait {
				return batch
			}
			if linger == nil {
				timer := time.NewTimer(c.outcomeLinger)
				defer timer.Stop()
				linger = timer.C
			}
			select {
			case r, ok = <-c.results:
			case <-linger:
				return batch
			}
		}
		if !ok {
			return batch
		}
		batch = append(batch, r)
		mayWait = mayWait && r.mayWaitForBatch()
	}
	return batch
}

// recordOutcomeTries bounds the writes of one batch of outcomes,
// recordOutcomeBackoff is the wait before the second (doubling after), and
// recordOutcomeTimeout bounds them all together.
const (
	recordOutcomeTries   = 4
	recordOutcomeBackoff = 50 * time.Millisecond
	recordOutcomeTimeout = 30 * time.Second
)

// recordOutcomesRetrying writes a batch of outcomes, trying again after a
// failure that says nothing about the rows (a connection the database
// killed since its last use, a restart). Writing again is safe: outcomes
// are fenced on the attempt, attempt records are inserted ON CONFLICT DO
// NOTHING, and endpoint states are set, not toggled, so a commit whose
// answer was lost changes nothing the second time. Giving up at once left
// the jobs running until the rescuer ran them again: a delivery repeated
// for nothing.
//
// It has a context of its own: at shutdown the loops' context is gone, and
// these are the last writes that matter. One deadline covers every try, so
// a database that does not answer holds the workers (and a shutdown) up
// for recordOutcomeTimeout, not that many times over.
func (c *completer) recordOutcomesRetrying(batch []jobResult) error {
	ctx, cancel := context.WithTimeout(context.Background(), recordOutcomeTimeout)
	defer cancel()
	wait := recordOutcomeBackoff
	for try := 1; ; try++ {
		err := c.recordOutcomes(ctx, batch)
		if err == nil || isRowFault(err) || ctx.Err() != nil || try == recordOutcomeTries {
			return err
		}
		c.logger.Warn("record job outcomes failed; trying again", "jobs", len(batch), "try", try, "err", err)
		pause := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			pause.Stop()
			return err
		case <-pause.C:
		}
		wait *= 2
	}
}

// recordOutcomesSQL writes a batch of outcomes with everything they
// record, in one statement and one commit (schema.sql,
// outbox.record_outcomes): the completer's transaction is most of a
// delivery's bookkeeping, and every job of the batch waits for its round
// trips. The rows go as JSON ($1 to $5: outcomeRows' fields).
const recordOutcomesSQL = `SELECT outbox.record_outcomes($1, $2, $3, $4, $5, $6, $7)`

// recordOutcomes writes a batch of outcomes, with the attempts they record
// and their endpoints' new states (recordOutcomesSQL).
func (c *completer) recordOutcomes(ctx context.Context, batch []jobResult) error {
	return writeOutcomes(ctx, c.db, batch, c.breakerThreshold)
}

// writeOutcomes is recordOutcomes on a database, or in a transaction,
// with a breaker threshold.
func writeOutcomes(ctx context.Context, db execer, batch []jobResult, breakerThreshold int) error {
	args, err := newOutcomeRows(batch).args(breakerThreshold)
	if err == nil {
		_, err = db.ExecContext(ctx, recordOutcomesSQL, args...)
	}
	if err != nil {
		return fmt.Errorf("record %d job outcomes: %w", len(batch), err)
	}
	return nil
}

// outcomeRows are a batch of outcomes as outbox.record_outcomes takes
// them: a row per job, a row per attempt made, and the endpoints the
// attempts moved.
type outcomeRows struct {
	Outcomes []outcomeRow
	Attempts []attemptRow
	Health   []healthRow
	Gone     []int64 // endpoints whose receiver answered 410 Gone
	Windows  []windowRow
}

// outcomeRow is a job's outcome.
type outcomeRow struct {
	ID      int64    `json:"id"`
	Attempt int      `json:"attempt"`
	State   jobState `json:"state"`
	DelayMS int64    `json:"delay_ms"`
	Error   string   `json:"error"`
}

// attemptRow is one request or mail made: what its row of
// outbox.deliveries keeps, and what it counts in outbox.delivery_stats.
type attemptRow struct {
	JobID      int64  `json:"job_id"`
	Attempt    int    `json:"attempt"`
	EndpointID int64  `json:"endpoint_id"`
	DurationMS int64  `json:"duration_ms"`
	StatusCode int    `json:"status_code"`
	Error      string `json:"error"`
	Excerpt    string `json:"excerpt"`
	Class      string `json:"class"`
	Minute     int64  `json:"minute"` // Unix seconds
	Bucket     int    `json:"bucket"` // latency bucket of a success, 0-based
}

// healthRow is endpointHealth as the statement reads it.
type healthRow struct {
	ID        int64 `json:"id"`
	Succeeded bool  `json:"succeeded"`
	Failures  int   `json:"failures"`
	HoldMS    int64 `json:"hold_ms"`
}

// windowRow is the dedup window an endpoint's receiver advertised in a
// 2xx answer; Seconds nil: the answer advertised none, which clears it.
type windowRow struct {
	ID      int64  `json:"id"`
	Seconds *int64 `json:"seconds"`
}

// noteWindow keeps in windows what rec's answer said of its receiver's
// dedup window, if it said anything (a 2xx). Of two answers in one batch,
// the shorter window wins, and any window over none: the one that bounds
// resends more (resendCutoff), while the receivers behind one URL differ.
func noteWindow(windows map[int64]time.Duration, rec *attemptRecord) {
	if !rec.DedupWindowRead {
		return
	}
	if w, seen := windows[rec.EndpointID]; !seen || (rec.DedupWindow > 0 && (w == 0 || rec.DedupWindow < w)) {
		windows[rec.EndpointID] = rec.DedupWindow
	}
}

// newOutcomeRows turns a batch, in completion order, into rows.
// Endpoints go in id order: one lock order for every replica's completer.
func newOutcomeRows(batch []jobResult) outcomeRows {
	var rows outcomeRows
	health := map[int64]*endpointHealth{}
	gone := map[int64]bool{}
	windows := map[int64]time.Duration{}
	for _, r := range batch {
		if r.State != "" { // "": completed in its handler's transaction
			rows.Outcomes = append(rows.Outcomes, newOutcomeRow(r))
		}
		rec := r.record
		if rec == nil {
			continue
		}
		rows.Attempts = append(rows.Attempts, newAttemptRow(r))
		if rec.EndpointID == 0 {
			continue
		}
		if rec.Change != endpointUnchanged || rec.Hold > 0 {
			h := health[rec.EndpointID]
			if h == nil {
				h = new(endpointHealth)
				health[rec.EndpointID] = h
			}
			h.add(rec.Change, rec.Hold)
		}
		gone[rec.EndpointID] = gone[rec.EndpointID] || rec.Change == endpointGone
		noteWindow(windows, rec)
	}
	for _, id := range slices.Sorted(maps.Keys(health)) {
		// A gone endpoint is disabled, with failing_since, in one change:
		// one "disabled" notification, not a "failing" one first.
		if h := health[id]; !gone[id] {
			rows.Health = append(rows.Health, healthRow{id, h.succeeded, h.failures, h.hold.Milliseconds()})
		}
	}
	for _, id := range slices.Sorted(maps.Keys(gone)) {
		if gone[id] {
			rows.Gone = append(rows.Gone, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(windows)) {
		row := windowRow{ID: id}
		if w := windows[id]; w > 0 {
			row.Seconds = new(int64(w / time.Second))
		}
		rows.Windows = append(rows.Windows, row)
	}
	return rows
}

func newOutcomeRow(r jobResult) outcomeRow {
	return outcomeRow{ID: r.ID, Attempt: r.Attempt, State: r.State, DelayMS: r.Delay.Milliseconds(), Error: r.Error}
}

func newAttemptRow(r jobResult) attemptRow {
	rec := r.record
	return attemptRow{
		JobID:      r.ID,
		Attempt:    r.Attempt,
		EndpointID: rec.EndpointID,
		DurationMS: rec.Duration.Milliseconds(),
		StatusCode: rec.StatusCode,
		Error:      rec.Error,
		Excerpt:    rec.ResponseExcerpt,
		Class:      rec.Class.String(),
		Minute:     rec.At.Truncate(time.Minute).Unix(),
		Bucket:     latencyBucket(rec.CommitTo2xx),
	}
}

// args are outbox.record_outcomes' arguments. JSON goes as text, which
// the function's json parameters parse as they are.
func (rows outcomeRows) args(breakerThreshold int) ([]any, error) {
	var args []any
	for _, v := range []any{rows.Outcomes, rows.Attempts, rows.Health} {
		text, err := jsonArray(v)
		if err != nil {
			return nil, err
		}
		args = append(args, text)
	}
	windows, err := jsonArray(rows.Windows)
	if err != nil {
		return nil, err
	}
	return append(args, pq.Array(nonNil(rows.Gone)), windows, breakerThreshold, statsBuckets), nil
}

// jsonArray is v, a slice, as a JSON array: [] for none, never null.
func jsonArray(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode outcome rows: %w", err)
	}
	if string(b) == "null" {
		return "[]", nil
	}
	return string(b), nil
}

// nonNil is ids, or an empty slice for none: a nil one goes as SQL NULL.
func nonNil(ids []int64) []int64 {
	if ids == nil {
		return []int64{}
	}
	return ids
}
