// deliver_test.go: hops 4 and 5, jobs run, retry, end, and are rescued.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestBackoffSchedule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		attempt  int
		jitter   float64
		min, max time.Duration
	}{
		{1, 0.5, time.Second, time.Second}, // 1s, raised to the 1 s floor at any jitter
		{2, 0.5, 16 * time.Second, 16 * time.Second},
		{2, 0, 14400 * time.Millisecond, 14400 * time.Millisecond},     // -10%
		{2, 0.999, 17590 * time.Millisecond, 17600 * time.Millisecond}, // +10%
		{5, 0.5, 625 * time.Second, 625 * time.Second},
		{17, 0.5, 83521 * time.Second, 83521 * time.Second}, // 23 h 12 m
		{40, 0.5, maxBackoff, maxBackoff},
	} {
		got := backoff(tc.attempt, tc.jitter)
		if got < tc.min || got > tc.max {
			t.Errorf("backoff(%d, %v) = %s, want in [%s, %s]", tc.attempt, tc.jitter, got, tc.min, tc.max)
		}
	}
	// 18 attempts must end well inside the 7-day events retention and the
	// 5-day endpoint disable, so no retry finds its event pruned.
	if h := retryHorizon(18); h < 3*24*time.Hour || h >= 5*24*time.Hour {
		t.Errorf("retryHorizon(18) = %s, want between 3 and 5 days", h)
	}
}

func TestDecideOutcome(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name            string
		attempt, maxAtt int
		err             error
		want            jobOutcome
	}{
		{"success", 1, 18, nil, jobOutcome{State: jobCompleted}},
		{"failure retries with backoff", 3, 18, boom, jobOutcome{State: jobRetryable, Delay: 81 * time.Second, Error: "boom"}},
		{"last attempt discards", 18, 18, boom, jobOutcome{State: jobDiscarded, Error: "boom"}},
		{"permanent discards at once", 1, 18, permanentError{boom}, jobOutcome{State: jobDiscarded, Error: "boom"}},
		{"retry-after overrides backoff", 1, 18, retryAfterError{boom, 5 * time.Minute}, jobOutcome{State: jobRetryable, Delay: 5 * time.Minute, Error: "boom"}},
		{"retry-after is capped", 1, 18, retryAfterError{boom, 1000 * time.Hour}, jobOutcome{State: jobRetryable, Delay: maxBackoff, Error: "boom"}},
		{"retry-after on the last attempt discards", 18, 18, retryAfterError{boom, time.Minute}, jobOutcome{State: jobDiscarded, Error: "boom"}},
		{"not sent completes with its note", 1, 18, notSentError{"not sent: why"}, jobOutcome{State: jobCompleted, Error: "not sent: why"}},
		{"not sent on the last attempt completes", 18, 18, fmt.Errorf("owner-notify: %w", notSentError{"not sent: why"}), jobOutcome{State: jobCompleted, Error: "owner-notify: not sent: why"}},
	} {
		got := decideOutcome(tc.attempt, tc.maxAtt, tc.err, 0.5)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// runPool runs a worker pool until the test ends.
func runPool(t *testing.T, db *sql.DB, cfg WorkerConfig, subs ...Subscriber) *workerPool {
	t.Helper()
	reg := newSubscriberRegistry()
	for _, s := range subs {
		reg.Register(s)
	}
	wp := newWorkerPool(db, cfg, time.Minute, reg, nil, testLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wp.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	return wp
}

// enqueueJob records an event and a job of kind for it, as the relay would.
func enqueueJob(t *testing.T, db *sql.DB, kind string, maxAttempts int) int64 {
	t.Helper()
	var id int64
	err := db.QueryRow(`
		INSERT INTO outbox.jobs (kind, event_id, max_attempts)
		VALUES ($1, outbox.record('t', 's', '{}'), $2)
		RETURNING id`, kind, maxAttempts).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

type jobRow struct {
	State       string
	Attempt     int
	Errors      int
	DueInSecond float64 // scheduled_at - now(), seconds
}

func readJob(t *testing.T, db *sql.DB, id int64) jobRow {
	t.Helper()
	var r jobRow
	// A delivered job has left the queue: its completing attempt in the
	// history stands for it, with its earlier attempts' errors.
	err := db.QueryRow(`
		SELECT state::text, attempt, jsonb_array_length(errors),
		       extract(epoch FROM scheduled_at - now())::float8
		FROM outbox.jobs WHERE id = $1
		UNION ALL
		SELECT 'completed', d.attempt,
		       (SELECT count(*) FROM outbox.deliveries AS p WHERE p.job_id = d.job_id AND p.attempt < d.attempt AND p.error <> '')::integer,
		       0
		FROM outbox.deliveries AS d WHERE d.job_id = $1 AND d.outcome = 'completed'`, id).Scan(&r.State, &r.Attempt, &r.Errors, &r.DueInSecond)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// workOnce claims at most the jobs it is asked for, runs them, and has
// their outcomes written before it returns: a handled job is completed. A
// job of a kind this process does not run is not claimed: it waits,
// unattempted, for a process that runs it.
func TestWorkOnceRunsOneClaimToItsOutcomes(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var handled atomic.Int64
	count := Subscriber{Name: "count", Handle: func(context.Context, *sql.Tx, Event) error {
		handled.Add(1)
		return nil
	}}
	reg := newSubscriberRegistry()
	reg.Register(count)
	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, reg, nil, testLogger(t))
	ctx := context.Background()
	unknown := enqueueJob(t, db, "no-such-kind", 18) // the oldest: the first a claim of every kind would take
	var counted []int64
	for range 3 {
		counted = append(counted, enqueueJob(t, db, count.jobKind(), 18))
	}

	for _, want := range []int{2, 1, 0} {
		n, err := wp.workOnce(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("workOnce(2) claimed %d jobs, want %d", n, want)
		}
	}
	if got := handled.Load(); got != 3 {
		t.Errorf("handler ran %d times, want 3", got)
	}
	for _, id := range counted {
		if s := readJob(t, db, id).State; s != "completed" {
			t.Errorf("job %d: state %s, want completed", id, s)
		}
	}
	if r := readJob(t, db, unknown); r.State != "available" || r.Attempt != 0 || r.Errors != 0 {
		t.Errorf("job of a kind this process does not run: %s, attempt %d, %d errors; want available, unattempted", r.State, r.Attempt, r.Errors)
	}
}

// Each lane of the workers' claim walks its index in order and stops after
// the jobs it takes, whatever the planner estimates: the claim's cost does
// not grow with the queue. In a 100,000-event drain, statistics taken while
// the table was nearly empty had every claim read all due jobs and sort
// them. Here the statistics are taken the same way, and a high
// random_page_cost makes reading the whole table look cheaper than
// fetching the claimed rows by key. Every kind of lane is tried: jobs of
// no endpoint (subscribers), one endpoint's deliveries, and its replay
// lane (a share of 250 of its cap of 1,000, so that the batch, not the
// share, bounds the claim).
func TestJobClaimReadsOneBatchWhateverTheEstimates(t *testing.T) {
	t.Parallel()
	const batch, due = 100, 5000
	for _, lane := range []struct {
		name, index, enqueue string
	}{
		{"subscriber", "outbox.jobs_waiting_without_endpoint", `
			INSERT INTO outbox.jobs (kind, event_id, max_attempts)
			SELECT 'sub:plan', (SELECT max(id) FROM outbox.events), 18 FROM generate_series(1, $1)`},
		{"endpoint", "outbox.jobs_waiting_by_endpoint", `
			INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts)
			SELECT 'webhook', e.id, (SELECT max(id) FROM outbox.endpoints), 18
			FROM generate_series(1, $1) AS g,
			LATERAL (SELECT outbox.record('claim.plan', g::text, '{}')) AS e(id)`},
		{"replay", "outbox.jobs_waiting_by_endpoint", `
			INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, replay_id)
			SELECT 'webhook', e.id, (SELECT max(id) FROM outbox.endpoints), 18, (SELECT max(id) FROM outbox.replays)
			FROM generate_series(1, $1) AS g,
			LATERAL (SELECT outbox.record('claim.plan', g::text, '{}')) AS e(id)`},
	} {
		t.Run(lane.name, func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			mustExec(t, db, `SELECT outbox.record('claim.plan', '', '{}')`)
			mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret, max_in_flight)
				VALUES ('https://hooks.example.com/plan', decode(repeat('ab', 32), 'hex'), 1000)`)
			mustExec(t, db, `INSERT INTO outbox.replays (endpoint_id, kind) SELECT max(id), 'replay' FROM outbox.endpoints`)
			mustExec(t, db, lane.enqueue, 1)
			mustExec(t, db, `ANALYZE outbox.jobs`)
			mustExec(t, db, lane.enqueue, due-1)

			claimed := 0
			scanned, indexEntries := statementReads(t, db, "outbox.jobs", lane.index, func(tx *sql.Tx) error {
				// The kinds a replica running subscriber plan claims.
				rows, err := tx.Query(claimJobsSQL, batch, nil, "{}", "{}", nil, "{owner-notify,sub:plan,webhook}")
				if err != nil {
					return err
				}
				defer rows.Close()
				for rows.Next() {
					claimed++
				}
				return rows.Err()
			})
			// An endpoint's lane also reads its first entry to find the
			// endpoint (the loose scan), and one more to learn it is the last.
			if claimed != batch || scanned != 0 || indexEntries > batch+2 {
				t.Errorf("claimed %d of %d due jobs, scanning %d table rows and reading %d index entries; want %d claimed, 0 scanned, at most %d entries",
					claimed, due, scanned, indexEntries, batch, batch+2)
			}
		})
	}
}

// Every job the claim marks running, it returns: a job fanned out while a
// claim statement runs is either claimed with its event or left for the
// next claim. (A first version read events in the calling statement, whose
// snapshot could predate the job: such a job was marked running, never
// returned, and waited 90 s for the rescuer.) Here the calling statement
// takes its snapshot, sleeps, and only then calls the claim; the job
// commits during the sleep.
func TestJobClaimReturnsEveryJobItMarksRunning(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	type claimResult struct {
		ids []string
		err error
	}
	done := make(chan claimResult, 1)
	go func() {
		rows, err := db.Query(`
			SELECT c.id::text
			FROM (SELECT pg_sleep(0.5)) AS snapshot_first
			CROSS JOIN LATERAL outbox.claim_due_jobs(100) AS c`)
		if err != nil {
			done <- claimResult{err: err}
			return
		}
		defer rows.Close()
		var res claimResult
		for rows.Next() {
			var id string
			res.err = rows.Scan(&id)
			res.ids = append(res.ids, id)
		}
		if res.err == nil {
			res.err = rows.Err()
		}
		done <- res
	}()
	waitFor(t, "the claim statement to sleep", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()`) == 1
	})
	enqueueJob(t, db, "sub:late", 18)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	running := queryStrings(t, db, `SELECT id::text FROM outbox.jobs WHERE state = 'running' ORDER BY id`)
	if diff := cmp.Diff(running, res.ids, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("jobs running (-) and jobs the claim returned (+) differ:\n%s", diff)
	}
}

// A failing job is retried with growing delays, keeping each error; the
// delays are read from scheduled_at, not waited for.
func TestWorkerRetriesWithGrowingBackoff(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var calls atomic.Int64
	flaky := Subscriber{Name: "flaky", Handle: func(ctx context.Context, tx *sql.Tx, ev Event) error {
		calls.Add(1)
		return errors.New("receiver down")
	}}
	cfg := defaultConfig().Workers
	cfg.PollInterval = 20 * time.Millisecond
	runPool(t, db, cfg, flaky)
	id := enqueueJob(t, db, flaky.jobKind(), 18)

	var delays []float64
	for attempt := 1; attempt <= 3; attempt++ {
		waitFor(t, "a failed attempt", 10*time.Second, func() bool {
			r := readJob(t, db, id)
			return r.State == "retryable" && r.Attempt == attempt
		})
		r := readJob(t, db, id)
		if r.Errors != attempt {
			t.Fatalf("after attempt %d: %d errors kept, want %d", attempt, r.Errors, attempt)
		}
		delays = append(delays, r.DueInSecond)
		// Make it due now instead of waiting for the backoff.
		mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE id = $1`, id)
	}
	// Expected 1 s, 16 s, 81 s, each ±10% and less the time since it was set.
	if !(delays[0] <= 1.1 && delays[1] > 12 && delays[1] <= 17.6 && delays[2] > 70 && delays[2] <= 89.1) {
		t.Errorf("retry delays %v s, want about 1, 16, 81", delays)
	}
	if calls.Load() < 3 {
		t.Errorf("handler ran %d times, want at least 3", calls.Load())
	}
}

// One subscriber's jobs claimed together run in one transaction, handed
// over one by one or, with HandleBatch, in one call. An event whose
// handler fails keeps none of its effect, not even the write it made
// before failing, and gets its outcome (here discarded: it has one
// attempt); the others' effects and completions commit.
func TestSubscriberBatchKeepsNothingOfTheFailingEvent(t *testing.T) {
	t.Parallel()
	for _, withBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("HandleBatch=%t", withBatch), func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			mustExec(t, db, `CREATE TABLE effects (event_id bigint PRIMARY KEY)`)
			var jobIDs []int64
			for i := range 5 {
				attempts := 18
				if i == 2 {
					attempts = 1
				}
				jobIDs = append(jobIDs, enqueueJob(t, db, "sub:effects", attempts))
			}
			var failing int64
			if err := db.QueryRow(`SELECT event_id FROM outbox.jobs WHERE id = $1`, jobIDs[2]).Scan(&failing); err != nil {
				t.Fatal(err)
			}
			handle := func(ctx context.Context, tx *sql.Tx, ev Event) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ($1)`, ev.ID); err != nil {
					return err
				}
				if ev.ID == failing {
					return errors.New("fails after its write")
				}
				return nil
			}
			sub := Subscriber{Name: "effects", Handle: handle}
			if withBatch {
				sub.HandleBatch = func(ctx context.Context, tx *sql.Tx, evs []Event) error {
					for _, ev := range evs {
						if err := handle(ctx, tx, ev); err != nil {
							return err
						}
					}
					return nil
				}
			}
			runPool(t, db, defaultConfig().Workers, sub) // all five are due: one claim, one batch

			waitFor(t, "four completed jobs and one discarded", 10*time.Second, func() bool {
				return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'discarded'`)+
					queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed'`) == 5
			})
			if r := readJob(t, db, jobIDs[2]); r.State != "discarded" || r.Errors != 1 {
				t.Errorf("failing job: %+v, want discarded with its error", r)
			}
			if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE outcome = 'completed'`); n != 4 {
				t.Errorf("%d jobs completed, want 4", n)
			}
			got := queryStrings(t, db, `SELECT event_id::text FROM effects ORDER BY event_id`)
			want := queryStrings(t, db, fmt.Sprintf(
				`SELECT event_id::text FROM outbox.deliveries WHERE event_id <> %d AND outcome = 'completed' ORDER BY event_id`, failing))
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("effects (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWorkerDiscardsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	failing := Subscriber{Name: "failing", Handle: func(context.Context, *sql.Tx, Event) error {
		return errors.New("always fails")
	}}
	cfg := defaultConfig().Workers
	cfg.PollInterval = 10 * time.Millisecond
	runPool(t, db, cfg, failing)
	const maxAttempts = 18
	id := enqueueJob(t, db, failing.jobKind(), maxAttempts)

	waitFor(t, "the job to be discarded", 60*time.Second, func() bool {
		mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE id = $1 AND state = 'retryable'`, id)
		return readJob(t, db, id).State == "discarded"
	})
	r := readJob(t, db, id)
	if r.Attempt != maxAttempts || r.Errors != maxAttempts {
		t.Errorf("discarded after %d attempts with %d errors, want %d and %d", r.Attempt, r.Errors, maxAttempts, maxAttempts)
	}
	var finalized bool
	db.QueryRow(`SELECT finalized_at IS NOT NULL FROM outbox.jobs WHERE id = $1`, id).Scan(&finalized)
	if !finalized {
		t.Error("discarded job has no finalized_at")
	}
}

// -job-max-attempts applies to new jobs only: a restart with a lower
// value leaves a job queued before it with the limit it was made with,
// and the workers keep to each job's own, the old job retrying on past
// the new limit while a job made after the restart is discarded at it.
// The flag's help and docs/configuration.md say so.
func TestJobMaxAttemptsAppliesToNewJobsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	failing := Subscriber{Name: "failing", Handle: func(context.Context, *sql.Tx, Event) error {
		return errors.New("always fails")
	}}
	subs := newSubscriberRegistry()
	subs.Register(failing)
	fanOut := func(maxAttempts int) int64 {
		t.Helper()
		eventID := record(t, db, "order.paid", "42")
		if _, err := newRelay(db, defaultConfig().Relay, maxAttempts, fanOutTargets(subs), testLogger(t)).relayOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return int64(queryInt(t, db, `SELECT id FROM outbox.jobs WHERE event_id = $1`, eventID))
	}
	queued := fanOut(18) // under -job-max-attempts 18
	cfg := defaultConfig().Workers
	cfg.MaxAttempts = 3 // restarted with -job-max-attempts 3
	made := fanOut(cfg.MaxAttempts)
	workers := newWorkerPool(db, cfg, time.Minute, subs, nil, testLogger(t))
	for range cfg.MaxAttempts + 1 {
		mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state = 'retryable'`)
		if _, err := workers.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	type job struct {
		State                string
		Attempt, MaxAttempts int
	}
	read := func(id int64) job {
		var j job
		if err := db.QueryRow(`SELECT state, attempt, max_attempts FROM outbox.jobs WHERE id = $1`, id).Scan(&j.State, &j.Attempt, &j.MaxAttempts); err != nil {
			t.Fatal(err)
		}
		return j
	}
	if diff := cmp.Diff(map[string]job{
		"queued before the restart": {"retryable", 4, 18},
		"made after it":             {"discarded", 3, 3},
	}, map[string]job{
		"queued before the restart": read(queued),
		"made after it":             read(made),
	}); diff != "" {
		t.Errorf("jobs after four rounds of failures under -job-max-attempts 3 (-want +got):\n%s", diff)
	}

	flags := configFlags(new(Config), io.Discard)
	if usage := flags.Lookup("job-max-attempts").Usage; !strings.Contains(usage, "a change applies to new jobs only") {
		t.Errorf("-job-max-attempts's help does not say a change applies to new jobs only: %q", usage)
	}
	if row := documentedFlagRow(t, "docs/configuration.md", "job-max-attempts"); !strings.Contains(row, "a change applies to new jobs only") {
		t.Errorf("docs/configuration.md's -job-max-attempts does not say a change applies to new jobs only: %q", row)
	}
}

func TestWorkerSurvivesPanickingHandler(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	panicky := Subscriber{Name: "panicky", Handle: func(context.Context, *sql.Tx, Event) error { panic("bug") }}
	cfg := defaultConfig().Workers
	cfg.PollInterval = 20 * time.Millisecond
	runPool(t, db, cfg, panicky)
	id := enqueueJob(t, db, panicky.jobKind(), 1)
	waitFor(t, "the panicking job to be discarded", 10*time.Second, func() bool {
		return readJob(t, db, id).State == "discarded"
	})
	var msg string
	db.QueryRow(`SELECT errors->0->>'error' FROM outbox.jobs WHERE id = $1`, id).Scan(&msg)
	if msg != "subscriber panicky: panic: bug" && msg != "panic: bug" {
		t.Errorf("error kept = %q, want the panic", msg)
	}
}

// A job left running by a dead worker is rescued and run again; the dead
// worker's late outcome is fenced out.
func TestRescuerRetriesJobOfDeadWorker(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	cfg := defaultConfig().Workers // 30 s timeout + 1 min margin
	sub := noopSubscriber("noop")

	stuck := enqueueJob(t, db, sub.jobKind(), 18)
	lastTry := enqueueJob(t, db, sub.jobKind(), 1)
	alive := enqueueJob(t, db, sub.jobKind(), 18)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'running', attempt = 1, attempted_at = now() - interval '91 seconds' WHERE id IN ($1, $2)`, stuck, lastTry)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'running', attempt = 1, attempted_at = now() - interval '89 seconds' WHERE id = $1`, alive)

	n, err := newRescuer(db, cfg, defaultConfig().Replicas, testLogger(t)).rescueOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("rescued %d jobs, want 2", n)
	}
	got := []string{readJob(t, db, stuck).State, readJob(t, db, lastTry).State, readJob(t, db, alive).State}
	if diff := cmp.Diff([]string{"retryable", "discarded", "running"}, got); diff != "" {
		t.Errorf("states of stuck, last-attempt and live jobs (-want +got):\n%s", diff)
	}

	// The dead worker wakes up and reports success for attempt 1: fenced.
	wp := newWorkerPool(db, cfg, time.Minute, newSubscriberRegistry(), nil, testLogger(t))
	if err := wp.recordOutcomes(context.Background(), []jobResult{{ID: stuck, Attempt: 1, jobOutcome: jobOutcome{State: jobCompleted}}}); err != nil {
		t.Fatal(err)
	}
	if s := readJob(t, db, stuck).State; s != "retryable" {
		t.Fatalf("late outcome of a rescued attempt changed the job to %s", s)
	}

	cfg.PollInterval = 20 * time.Millisecond
	runPool(t, db, cfg, sub)
	waitFor(t, "the rescued job to complete", 10*time.Second, func() bool {
		return readJob(t, db, stuck).State == "completed"
	})
	if r := readJob(t, db, stuck); r.Attempt != 2 {
		t.Errorf("rescued job completed on attempt %d, want 2", r.Attempt)
	}
}

// Shutdown lets a running job finish and records its outcome.
func TestWorkerShutdownFinishesInFlightJob(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	started := make(chan struct{})
	release := make(chan struct{})
	slow := Subscriber{Name: "slow", Handle: func(context.Context, *sql.Tx, Event) error {
		close(started)
		<-release
		return nil
	}}
	reg := newSubscriberRegistry()
	reg.Register(slow)
	cfg := defaultConfig().Workers
	cfg.PollInterval = 20 * time.Millisecond
	wp := newWorkerPool(db, cfg, time.Minute, reg, nil, testLogger(t))
	id := enqueueJob(t, db, slow.jobKind(), 18)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wp.Run(ctx, nil) }()
	<-started
	cancel() // SIGTERM while the job runs
	select {
	case <-done:
		t.Fatal("pool stopped before its running job finished")
	default:
	}
	close(release)
	<-done
	if s := readJob(t, db, id).State; s != "completed" {
		t.Errorf("job state after shutdown = %s, want completed", s)
	}
}

// A claim in flight when shutdown begins runs to its end, and the jobs it
// claimed run before the pool stops, rather than being left running with
// no worker until a rescue. The claim is held behind a table lock until
// after the cancel.
func TestWorkerShutdownFinishesAClaimInFlight(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var ran atomic.Int64
	quick := Subscriber{Name: "quick", Handle: func(context.Context, *sql.Tx, Event) error {
		ran.Add(1)
		return nil
	}}
	reg := newSubscriberRegistry()
	reg.Register(quick)
	id := enqueueJob(t, db, quick.jobKind(), 18)

	lock, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	if _, err := lock.Exec(`LOCK TABLE outbox.jobs IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	cfg := defaultConfig().Workers
	cfg.PollInterval = 20 * time.Millisecond
	wp := newWorkerPool(db, cfg, time.Minute, reg, nil, testLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wp.Run(ctx, nil) }()
	waitFor(t, "the claim waiting for the table lock", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%claim_lane_jobs%'`) == 1
	})
	cancel() // SIGTERM while the claim waits
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	<-done
	if r := readJob(t, db, id); r.State != "completed" || r.Attempt != 1 || ran.Load() != 1 {
		t.Errorf("after shutdown: job %s on attempt %d, run %d times; want completed on attempt 1, run once", r.State, r.Attempt, ran.Load())
	}
}

// The completer gathers successful deliveries whose places are free into
// one statement, and writes any other outcome at once, with whatever
// waits beside it.
func TestCompleterGathersSuccessesAndWritesOtherOutcomesAtOnce(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	p := newWorkerPool(db, defaultConfig().Workers, time.Second, newSubscriberRegistry(), nil, testLogger(t))
	if p.outcomeLinger != 10*time.Millisecond {
		t.Errorf("outcome linger %s, want 10ms", p.outcomeLinger)
	}
	p.outcomeLinger = time.Hour // a success waits for a reason to write, never for the clock
	done := make(chan struct{})
	go func() { defer close(done); p.completeLoop() }()
	defer func() { close(p.results); <-done }()

	// No job of these exists: each batch writes nothing, and what counts
	// is how the completer groups them.
	success := func(id int64) jobResult {
		return jobResult{ID: id, Attempt: 1, jobOutcome: jobOutcome{State: jobCompleted},
			record: &attemptRecord{EndpointID: 1, Change: endpointSucceeded, set: true}}
	}
	failure := jobResult{ID: -1, Attempt: 1, jobOutcome: jobOutcome{State: jobRetryable, Delay: time.Second},
		record: &attemptRecord{EndpointID: 1, Change: endpointFailed, set: true}}
	if !success(-2).mayWaitForBatch() || failure.mayWaitForBatch() {
		t.Fatal("mayWaitForBatch: a success must wait and a failure must not")
	}

	p.results <- failure
	waitFor(t, "the failure written alone", 10*time.Second, func() bool { return p.outcomeJobs.Load() == 1 })

	p.results <- success(-2)
	waitFor(t, "the first success taken", 10*time.Second, func() bool { return len(p.results) == 0 })
	p.results <- success(-3)
	waitFor(t, "the second success taken", 10*time.Second, func() bool { return len(p.results) == 0 })
	if n := p.outcomeJobs.Load(); n != 1 {
		t.Fatalf("%d outcomes written before anything needed them, want only the failure", n)
	}
	p.results <- jobResult{ID: -4, Attempt: 1} // a job with no place to free (an in-process subscriber's): written at once
	waitFor(t, "the successes written with the job behind them", 10*time.Second, func() bool { return p.outcomeJobs.Load() == 4 })
	if n := p.outcomeBatches.count.Load(); n != 2 {
		t.Errorf("%d outcome statements, want 2: the failure, then the two successes with the last job", n)
	}
}
