// load.go: `riverbench load`, River through bench/load's drain and keepup
// modes, and a burn-down of no-op jobs: the same counts, the same
// receiver, the same clock (from the child's start to the last job done
// or event received), and output lines in bench/load's words.

package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// loadTopic is the topic bench/load records.
const loadTopic = "load.event"

func runLoad(ctx context.Context, cfg loadConfig, stdout, stderr io.Writer) error {
	pool, err := openPool(ctx, cfg.DatabaseURL, cfg.Producers+4)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := prepareRiver(ctx, pool); err != nil {
		return err
	}
	switch cfg.Mode {
	case "jobs":
		return loadJobs(ctx, cfg, pool, stdout, stderr)
	case "drain":
		return loadDrain(ctx, cfg, pool, stdout, stderr)
	}
	return loadKeepUp(ctx, cfg, pool, stdout, stderr)
}

// untilExit is ctx, also cancelled when the child exits: a child that
// fails must end the wait for its work.
func untilExit(ctx context.Context, c *child) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-c.done:
			cancel(fmt.Errorf("river child exited"))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// unfinishedJobsSQL is whether any job is still to run, polled every 50 ms:
// an index walk to the first unfinished job (River's fetch index leads
// with the state), so the poll costs little however many jobs are done,
// where a count of the completed jobs would read a row per completed job
// each time.
const unfinishedJobsSQL = `
SELECT EXISTS (SELECT 1 FROM river_job WHERE state IN ('available', 'running', 'retryable', 'scheduled'))`

// jobsUnfinished runs unfinishedJobsSQL in a read-only transaction that
// first turns off bitmap and sequential scans: with no statistics on the
// new rows the planner reads an index whole in a bitmap scan, or the
// table in a sequential one (40 ms a poll at the end of a run), rather
// than walk the fetch index to its first entry.
func jobsUnfinished(ctx context.Context, pool *pgxpool.Pool) (unfinished bool, err error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) // read only: nothing to commit
	if _, err := tx.Exec(ctx, `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`); err != nil {
		return false, err
	}
	err = tx.QueryRow(ctx, unfinishedJobsSQL).Scan(&unfinished)
	return unfinished, err
}

// loadJobs is the burn-down: -events no-op jobs inserted, then worked to
// empty. The clock runs from the child's start until no job is left to
// run, polled every 50 ms.
func loadJobs(ctx context.Context, cfg loadConfig, pool *pgxpool.Pool, stdout, stderr io.Writer) error {
	if err := insertBulk(ctx, pool, cfg.Events, func(i int) river.JobArgs { return noopArgs{Num: i + 1} }); err != nil {
		return err
	}
	start := time.Now()
	c, err := startChild(cfg, "noop", "", nil, stderr)
	if err != nil {
		return err
	}
	waitCtx, cancel := untilExit(ctx, c)
	defer cancel()
	for {
		unfinished, err := jobsUnfinished(waitCtx, pool)
		if err != nil {
			c.Stop()
			return fmt.Errorf("look for unfinished jobs: %w (%v)", err, context.Cause(waitCtx))
		}
		if !unfinished {
			break
		}
		select {
		case <-waitCtx.Done():
			c.Stop()
			return context.Cause(waitCtx)
		case <-time.After(50 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	peak, lines := c.Stop()
	var completed int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&completed); err != nil {
		return fmt.Errorf("count completed jobs: %w", err)
	}
	if completed != int64(cfg.Events) {
		return fmt.Errorf("%d of %d jobs completed, none left to run", completed, cfg.Events)
	}
	fmt.Fprintf(stdout, "mode jobs: %d no-op jobs completed in %s: %.0f jobs/s\n", cfg.Events, elapsed.Round(time.Millisecond), float64(cfg.Events)/elapsed.Seconds())
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	fmt.Fprintf(stdout, "river workers %d, peak RSS %s\n", cfg.Workers, rssText(peak))
	return nil
}

// newSecret is a fresh endpoint secret, 32 random bytes as outboxd makes
// them, and its whsec_ form for the child.
func newSecret() ([]byte, string) {
	s := make([]byte, 32)
	rand.Read(s)
	return s, "whsec_" + base64.StdEncoding.EncodeToString(s)
}

// loadDrain queues -events webhook jobs, one per event for the one
// endpoint, then starts the sender and times their delivery to the
// receiver, from the child's start to the last distinct webhook-id
// received, as bench/load's drain mode does.
func loadDrain(ctx context.Context, cfg loadConfig, pool *pgxpool.Pool, stdout, stderr io.Writer) error {
	secret, encoded := newSecret()
	recv, err := startReceiver(secret)
	if err != nil {
		return err
	}
	defer recv.Close()
	err = insertBulk(ctx, pool, cfg.Events, func(i int) river.JobArgs {
		return webhookArgs{EventID: strconv.Itoa(i + 1), Topic: loadTopic, Subject: "bulk-" + strconv.Itoa(i), Data: loadPayload}
	})
	if err != nil {
		return err
	}
	start := time.Now()
	c, err := startChild(cfg, "webhook", recv.url, []string{secretEnv + "=" + encoded}, stderr)
	if err != nil {
		return err
	}
	waitCtx, cancel := untilExit(ctx, c)
	defer cancel()
	if err := recv.AwaitUnique(waitCtx, int64(cfg.Events), 30*time.Minute); err != nil {
		c.Stop()
		return fmt.Errorf("%w (%v)", err, context.Cause(waitCtx))
	}
	elapsed := time.Since(start)
	peak, _ := c.Stop()
	fmt.Fprintf(stdout, "mode drain: %d events delivered in %s: %.0f events/s; duplicates %d\n",
		cfg.Events, elapsed.Round(time.Millisecond), float64(cfg.Events)/elapsed.Seconds(), recv.Duplicates())
	fmt.Fprintf(stdout, "river workers %d, peak RSS %s\n", cfg.Workers, rssText(peak))
	return nil
}

// loadKeepUp starts the sender, runs the producers for -duration, then
// waits for the backlog to drain, as bench/load's keepup mode does. With
// -warmup they run that long first, and the CPU time is metered over
// -duration alone (meterWindow).
func loadKeepUp(ctx context.Context, cfg loadConfig, pool *pgxpool.Pool, stdout, stderr io.Writer) error {
	if cfg.BusinessRow {
		if _, err := pool.Exec(ctx, businessTable); err != nil {
			return fmt.Errorf("create business table: %w", err)
		}
	}
	secret, encoded := newSecret()
	recv, err := startReceiver(secret)
	if err != nil {
		return err
	}
	defer recv.Close()
	c, err := startChild(cfg, "webhook", recv.url, []string{secretEnv + "=" + encoded}, stderr)
	if err != nil {
		return err
	}
	waitCtx, cancel := untilExit(ctx, c)
	defer cancel()
	if err := c.AwaitReady(waitCtx, 60*time.Second); err != nil {
		c.Stop()
		return err
	}
	window := make(chan string, 1)
	if cfg.Warmup > 0 {
		go func() { window <- meterWindow(waitCtx, pool, c, recv, cfg.Warmup, cfg.Duration) }()
	}
	run := cfg
	run.Duration = cfg.Warmup + cfg.Duration
	committed, elapsed, err := produce(waitCtx, run, pool)
	if err != nil {
		c.Stop()
		return err
	}
	deliveredDuring := recv.Unique()
	var cpuReport string
	if cfg.Warmup > 0 {
		cpuReport = <-window
	}
	backlog, err := jobsBacklog(waitCtx, pool)
	if err != nil {
		c.Stop()
		return err
	}
	drainStart := time.Now()
	if err := recv.AwaitUnique(waitCtx, committed, 10*time.Minute); err != nil {
		c.Stop()
		return fmt.Errorf("%w (%v)", err, context.Cause(waitCtx))
	}
	drain := time.Since(drainStart)
	peak, _ := c.Stop()
	p := recv.Percentiles()
	row := "the job alone"
	if cfg.BusinessRow {
		row = "a business row and the job"
	}
	fmt.Fprintf(stdout, "mode keepup: producers %d, duration %s, %s a transaction (InsertTx)\n", cfg.Producers, elapsed.Round(time.Millisecond), row)
	fmt.Fprintf(stdout, "committed %.0f events/s, delivered %.0f events/s during the run\n",
		float64(committed)/elapsed.Seconds(), float64(deliveredDuring)/elapsed.Seconds())
	fmt.Fprintf(stdout, "commit->2xx latency p50 %s p95 %s p99 %s max %s\n", p[0], p[1], p[2], p[3])
	if cpuReport != "" {
		fmt.Fprintln(stdout, cpuReport)
	}
	fmt.Fprintf(stdout, "backlog at end %d (jobs), drained in %s; duplicates %d\n", backlog, drain.Round(time.Millisecond), recv.Duplicates())
	fmt.Fprintf(stdout, "river workers %d, peak RSS %s\n", cfg.Workers, rssText(peak))
	return nil
}

// meterWindow waits warmup, then meters the CPU time of the River child
// and of the database's backends (the producers' included) for d, and
// answers the window's line: its CPU time per event the receiver first
// saw in it. The producers run warmup+d from about when it starts, so the
// window ends about when they stop. bench/load's keepup meters outboxd's
// window the same way.
func meterWindow(ctx context.Context, pool *pgxpool.Pool, c *child, recv *receiver, warmup, d time.Duration) string {
	w := cpuWindow{Warmup: warmup, Window: d}
	if sleepCtx(ctx, warmup) != nil {
		return w.line("river")
	}
	cpu := startCPUMeter(ctx, pool)
	cpu.addProcess(c.cmd.Process.Pid)
	start, first := time.Now(), recv.Unique()
	sleepCtx(ctx, d)
	w.Delivered, w.Elapsed = recv.Unique()-first, time.Since(start)
	w.Process, w.Backends, w.Metered = cpu.Stop(ctx)
	return w.line("river")
}

// sleepCtx sleeps for d, or until ctx ends (its error then).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// businessTable is the row -business-row adds to each producer
// transaction: outbox.events' shape without its constraints.
const businessTable = `
CREATE TABLE IF NOT EXISTS riverbench_business (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  topic      text        NOT NULL,
  subject    text        NOT NULL,
  payload    jsonb       NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
)`

const insertBusinessRow = `
INSERT INTO riverbench_business (topic, subject, payload)
VALUES ($1, $2, $3)`

// produce commits one job a transaction on cfg.Producers connections for
// cfg.Duration, at cfg.Rate jobs/s over all of them (0: as fast as the
// database commits), each through InsertTx, and returns how many committed
// and how long it took. It paces as bench/load does: a ticker per
// producer, the producers' ticks spread evenly over one interval.
func produce(ctx context.Context, cfg loadConfig, pool *pgxpool.Pool) (int64, time.Duration, error) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger(io.Discard)})
	if err != nil {
		return 0, 0, fmt.Errorf("insert client: %w", err)
	}
	var committed atomic.Int64
	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(cfg.Producers) / cfg.Rate * float64(time.Second))
	}
	start := time.Now()
	var wg sync.WaitGroup
	for p := range cfg.Producers {
		wg.Go(func() {
			var tick <-chan time.Time
			if interval > 0 {
				select {
				case <-runCtx.Done():
					return
				case <-time.After(interval * time.Duration(p) / time.Duration(cfg.Producers)):
				}
				t := time.NewTicker(interval)
				defer t.Stop()
				tick = t.C
			}
			for i := 0; runCtx.Err() == nil; i++ {
				if tick != nil {
					select {
					case <-runCtx.Done():
						return
					case <-tick:
					}
				}
				subject := fmt.Sprintf("p%d-%d", p, i)
				err := pgx.BeginFunc(runCtx, pool, func(tx pgx.Tx) error {
					if cfg.BusinessRow {
						if _, err := tx.Exec(runCtx, insertBusinessRow, loadTopic, subject, loadPayload); err != nil {
							return err
						}
					}
					_, err := client.InsertTx(runCtx, tx, webhookArgs{EventID: subject, Topic: loadTopic, Subject: subject, Data: loadPayload}, nil)
					return err
				})
				if err == nil {
					committed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return 0, 0, context.Cause(ctx)
	}
	return committed.Load(), time.Since(start), nil
}
