// load.go: `outboxd load`, a load generator that runs a real outboxd as a
// child process, drives producer transactions into its database, receives
// and verifies its webhooks on loopback, and reports rates, latency, the
// backlog and outboxd's memory. The endpoint isolation scenarios (issue
// 16's targets) are in loadscenarios.go, the delivery lane scenarios
// (issue 17's) in loadlanes.go.

package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// loadConfig is `outboxd load`'s flags.
type loadConfig struct {
	DatabaseURL string
	DataDir     string
	Mode        string // keepup, drain, jobs, or a scenario of loadscenarios.go
	Producers   int
	Duration    time.Duration
	Rate        float64 // events/s over all producers; 0: as fast as the database commits
	Events      int     // drain and jobs modes; the queued deliveries of isolation and ratelimit
	ServeFlags  string  // extra flags for the outboxd under test
	scenarioConfig
}

// loadModes are -mode's values.
var loadModes = []string{"keepup", "drain", "jobs", "isolation", "flaky", "dead", "ratelimit", "stuck", "replay", "ordered"}

func parseLoadConfig(args []string, getenv func(string) string, stderr io.Writer) (loadConfig, error) {
	cfg := loadConfig{DatabaseURL: getenv("DATABASE_URL"), DataDir: "outboxd-data", Mode: "keepup",
		Producers: 16, Duration: 60 * time.Second, Events: 100_000}
	fs := flag.NewFlagSet("outboxd load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.DatabaseURL, "database-url", cfg.DatabaseURL, "database of the outboxd under test; empty starts the private cluster")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "folder of the private cluster")
	fs.StringVar(&cfg.Mode, "mode", cfg.Mode, "keepup: producers for -duration; drain: record -events, then deliver; jobs: -events no-op jobs, no HTTP; "+
		"isolation, flaky, dead, ratelimit: issue 16's endpoint scenarios; stuck, replay, ordered: issue 17's lane scenarios; each with its own defaults (README, \"Endpoint isolation under load\")")
	fs.IntVar(&cfg.Producers, "producers", cfg.Producers, "producer connections, each committing single-event transactions")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the producers run (keepup; a scenario's phase: 30s; replay's phase without the replay: 60s)")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "events per second over all producers; 0 is as fast as possible (isolation and dead: 20, flaky and stuck: 50, replay's live events: 320)")
	fs.IntVar(&cfg.Events, "events", cfg.Events, "events recorded before delivery starts (drain), or no-op jobs (jobs); deliveries queued for the hanging endpoint (isolation) or the limited one (ratelimit): 1000; events replayed (replay): 100000; events of each drain (ordered): 20000")
	fs.StringVar(&cfg.ServeFlags, "serve-flags", cfg.ServeFlags, "extra flags for the outboxd under test, space-separated")
	cfg.scenarioConfig.flags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg.applyScenarioDefaults(set)
	if (cfg.Mode == "drain" || cfg.Mode == "jobs") && !set["replicas"] {
		cfg.Replicas = 1
	}
	switch {
	case !slices.Contains(loadModes, cfg.Mode):
		return cfg, fmt.Errorf("-mode must be one of %s, got %q", strings.Join(loadModes, ", "), cfg.Mode)
	case cfg.Producers < 1 || cfg.Producers > 1000:
		return cfg, fmt.Errorf("-producers must be between 1 and 1000, got %d", cfg.Producers)
	case cfg.Events < 1:
		return cfg, fmt.Errorf("-events must be positive, got %d", cfg.Events)
	case cfg.Duration <= 0:
		return cfg, fmt.Errorf("-duration must be positive, got %s", cfg.Duration)
	}
	return cfg, cfg.scenarioConfig.validate()
}

// runLoad is `outboxd load`.
func runLoad(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseLoadConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dsn := cfg.DatabaseURL
	if dsn == "" {
		cluster, err := startCluster(ctx, cfg.DataDir, logger)
		if err != nil {
			return err
		}
		defer cluster.Stop()
		dsn = cluster.DSN("outboxd")
	}
	db, err := openDB(ctx, dsn, cfg.Producers+4)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := migrate(ctx, db); err != nil {
		return err
	}
	if run := loadScenario(cfg.Mode); run != nil {
		return run(ctx, cfg, loadRun{db: db, dsn: dsn, stdout: stdout, stderr: stderr, logger: logger})
	}

	recv, err := startLoadReceiver()
	if err != nil {
		return err
	}
	defer recv.Close()

	child := &loadChild{dsn: dsn, token: randomToken(), extra: strings.Fields(cfg.ServeFlags), stderr: stderr}
	if err := child.Start(ctx); err != nil {
		return err
	}
	defer child.Stop()

	if cfg.Mode == "jobs" {
		return loadJobs(ctx, cfg, db, child, stdout)
	}
	// The endpoint may run as many deliveries at once as the child has
	// workers: drain and keep-up measure the pipeline, not the
	// per-endpoint cap (max_in_flight, 16 by default), which would
	// otherwise hold one endpoint to a quarter of the default 64 workers.
	// The child inherits this process's environment, so OUTBOXD_WORKERS
	// counts as it does for the child.
	id, err := child.CreateEndpoint(ctx, recv, loadEndpoint{Topics: []string{"load.*"},
		MaxInFlight: childWorkers(child.extra, os.Getenv)})
	if err != nil {
		return err
	}
	// The receiver ends with this run: an endpoint left behind would have
	// the next run's outboxd retry its deliveries into a closed port. The
	// child stops first, so its last outcome writes (which lock the
	// endpoint's jobs, then the endpoint) cannot deadlock with the delete
	// (the endpoint, then its jobs).
	defer func() {
		child.Stop()
		if err := deleteEndpoint(context.WithoutCancel(ctx), db, id); err != nil {
			logger.Warn("load: remove the run's endpoint", "endpoint_id", id, "err", err)
		}
	}()
	if cfg.Mode == "keepup" {
		return loadKeepUp(ctx, cfg, db, recv, child, stdout)
	}
	return loadDrain(ctx, cfg, db, recv, child, stdout)
}

// loadKeepUp runs the producers for the duration, then waits for the
// backlog to drain.
func loadKeepUp(ctx context.Context, cfg loadConfig, db *sql.DB, recv *loadReceiver, child *loadChild, stdout io.Writer) error {
	cpu := startCPUMeter(ctx, db)
	measureProcesses(cpu, child, nil)
	committed, elapsed := produce(ctx, db, "load.event", "p", cfg.Producers, cfg.Rate, cfg.Duration)
	deliveredDuring := recv.Unique()
	// The producers' backends count too: at a steady rate an event's
	// statements (its insert, a relay pass, an outcome) cost more than the
	// rows they carry, and a change to any of them shows here.
	cpuReport := cpu.Report(ctx, int(committed), "event")
	backlog, err := loadBacklog(ctx, db)
	if err != nil {
		return err
	}
	drainStart := time.Now()
	if err := recv.AwaitUnique(ctx, committed, 10*time.Minute); err != nil {
		return err
	}
	drain := time.Since(drainStart)
	p := recv.Percentiles()
	fmt.Fprintf(stdout, "mode keepup: producers %d, duration %s\n", cfg.Producers, elapsed.Round(time.Millisecond))
	fmt.Fprintf(stdout, "committed %.0f events/s, delivered %.0f events/s during the run\n",
		float64(committed)/elapsed.Seconds(), float64(deliveredDuring)/elapsed.Seconds())
	fmt.Fprintf(stdout, "commit->2xx latency p50 %s p95 %s p99 %s max %s\n", p[0], p[1], p[2], p[3])
	fmt.Fprintln(stdout, cpuReport)
	fmt.Fprintf(stdout, "backlog at end %d (events + jobs), drained in %s; duplicates %d\n", backlog, drain.Round(time.Millisecond), recv.Duplicates())
	fmt.Fprintf(stdout, "outboxd peak RSS %s\n", child.PeakRSS())
	return nil
}

// produce commits single-event transactions of topic on producers
// connections for d, at rate events/s over all of them (0: as fast as the
// database commits), and returns how many committed and how long it took.
// Subjects are prefix, the producer's number, a dash and a sequence.
func produce(ctx context.Context, db *sql.DB, topic, prefix string, producers int, rate float64, d time.Duration) (int64, time.Duration) {
	var committed atomic.Int64
	runCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(producers) / rate * float64(time.Second))
	}
	start := time.Now()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			var tick <-chan time.Time
			if interval > 0 {
				select {
				case <-runCtx.Done():
					return
				case <-time.After(producerPhase(p, producers, interval)):
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
				_, err := db.ExecContext(runCtx, `SELECT outbox.record($1, $2, '{"load": true}')`, topic, fmt.Sprintf("%s%d-%d", prefix, p, i))
				if err == nil {
					committed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return committed.Load(), time.Since(start)
}

// producerPhase is how long producer p of n waits before its first tick
// at a fixed rate: the producers' ticks spread evenly over one interval, so
// the rate arrives as a steady stream. Started together, 16 producers at 20
// events/s sent bursts of 16 commits every 800 ms, and the latency measured
// was that of the burst's queue, not of the pipeline.
func producerPhase(p, n int, interval time.Duration) time.Duration {
	return interval * time.Duration(p) / time.Duration(n)
}

// loadDrain stops outboxd, records the events, starts it again and times
// their delivery.
func loadDrain(ctx context.Context, cfg loadConfig, db *sql.DB, recv *loadReceiver, child *loadChild, stdout io.Writer) error {
	child.Stop()
	if err := recordBulk(ctx, db, "load.event", cfg.Events); err != nil {
		return err
	}
	start := time.Now()
	cpu := startCPUMeter(ctx, db)
	replicas, err := startReplicas(ctx, child, cfg.Replicas)
	defer stopReplicas(replicas)
	if err != nil {
		return err
	}
	measureProcesses(cpu, child, replicas)
	if err := recv.AwaitUnique(ctx, int64(cfg.Events), 30*time.Minute); err != nil {
		return err
	}
	elapsed := time.Since(start)
	fmt.Fprintf(stdout, "mode drain: %d events delivered in %s: %.0f events/s; duplicates %d%s\n",
		cfg.Events, elapsed.Round(time.Millisecond), float64(cfg.Events)/elapsed.Seconds(), recv.Duplicates(), replicasNote(cfg.Replicas))
	fmt.Fprintln(stdout, cpu.Report(ctx, cfg.Events, "event"))
	fmt.Fprintf(stdout, "outboxd peak RSS %s\n", child.PeakRSS())
	return nil
}

// startReplicas starts child and n-1 more outboxd processes like it on the
// same database (-replicas), at once, so that they share the work from
// its start. The extra ones are returned to be stopped; on an error, those
// started so far.
func startReplicas(ctx context.Context, child *loadChild, n int) ([]*loadChild, error) {
	all := []*loadChild{child}
	for range n - 1 {
		all = append(all, &loadChild{dsn: child.dsn, token: child.token, extra: child.extra, stderr: child.stderr})
	}
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, c := range all {
		wg.Go(func() { errs[i] = c.Start(ctx) })
	}
	wg.Wait()
	return all[1:], errors.Join(errs...)
}

// measureProcesses has cpu count the outboxd processes of a phase.
func measureProcesses(cpu *cpuMeter, child *loadChild, replicas []*loadChild) {
	for _, c := range append([]*loadChild{child}, replicas...) {
		if c.cmd != nil && c.cmd.Process != nil {
			cpu.addProcess(c.cmd.Process.Pid)
		}
	}
}

// stopReplicas stops the processes startReplicas added.
func stopReplicas(extra []*loadChild) {
	for _, c := range extra {
		c.Stop()
	}
}

// replicasNote names how many outboxd processes did the work, if more
// than one; the peak RSS printed after it is the first one's.
func replicasNote(n int) string {
	if n == 1 {
		return ""
	}
	return fmt.Sprintf(", by %d outboxd processes (peak RSS: the first's)", n)
}

// unfinishedNoopJobsSQL is whether any no-op job is still to run. The
// jobs mode polls it every 50 ms, so it must cost little however many jobs
// are done: it walks the claim's and the rescuer's partial indexes, which
// hold unfinished jobs only, in their order, up to the first job. A count
// of the completed jobs, polled before, read one row per completed job
// each time: a load on the server that grew with the run and took its
// share of the CPU the run measures.
const unfinishedNoopJobsSQL = `
SELECT EXISTS (SELECT 1 FROM outbox.jobs
               WHERE state IN ('available', 'retryable') AND endpoint_id IS NULL AND kind = 'noop'
               ORDER BY scheduled_at, id LIMIT 1)
    OR EXISTS (SELECT 1 FROM outbox.jobs WHERE state = 'running' AND kind = 'noop'
               ORDER BY attempted_at LIMIT 1)`

// jobsPollPlanSQL is set in the poll's transaction: the table has no
// statistics (the jobs were just inserted, autovacuum may be off), and
// with none the planner reads each index whole in a bitmap scan, or the
// table in a sequential one, rather than walk an index to its first entry.
const jobsPollPlanSQL = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`

// noopJobsUnfinished runs unfinishedNoopJobsSQL under jobsPollPlanSQL in tx.
func noopJobsUnfinished(ctx context.Context, tx *sql.Tx) (unfinished bool, err error) {
	if _, err := tx.ExecContext(ctx, jobsPollPlanSQL); err != nil {
		return false, err
	}
	err = tx.QueryRowContext(ctx, unfinishedNoopJobsSQL).Scan(&unfinished)
	return unfinished, err
}

// completedNoopJobsSQL counts the no-op jobs completed, before and after a
// run of the jobs mode.
const completedNoopJobsSQL = `SELECT count(*) FROM outbox.jobs WHERE kind = 'noop' AND state = 'completed'`

// loadJobs times the job table alone: no-op jobs, no HTTP.
func loadJobs(ctx context.Context, cfg loadConfig, db *sql.DB, child *loadChild, stdout io.Writer) error {
	child.Stop()
	if err := recordBulk(ctx, db, "load.event", 1); err != nil {
		return err
	}
	var before int64
	if err := db.QueryRowContext(ctx, completedNoopJobsSQL).Scan(&before); err != nil {
		return fmt.Errorf("load: count completed jobs: %w", err)
	}
	for done := 0; done < cfg.Events; done += 10_000 {
		n := min(10_000, cfg.Events-done)
		if _, err := db.ExecContext(ctx, `
			INSERT INTO outbox.jobs (kind, event_id, max_attempts)
			SELECT 'noop', (SELECT max(id) FROM outbox.events), 18 FROM generate_series(1, $1)`, n); err != nil {
			return fmt.Errorf("load: enqueue jobs: %w", err)
		}
	}
	start := time.Now()
	cpu := startCPUMeter(ctx, db)
	replicas, err := startReplicas(ctx, child, cfg.Replicas)
	defer stopReplicas(replicas)
	if err != nil {
		return err
	}
	measureProcesses(cpu, child, replicas)
	for {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			return fmt.Errorf("load: look for unfinished jobs: %w", err)
		}
		unfinished, err := noopJobsUnfinished(ctx, tx)
		tx.Rollback() // read only: nothing to commit
		if err != nil {
			return fmt.Errorf("load: look for unfinished jobs: %w", err)
		}
		if !unfinished {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	var after int64
	if err := db.QueryRowContext(ctx, completedNoopJobsSQL).Scan(&after); err != nil {
		return fmt.Errorf("load: count completed jobs: %w", err)
	}
	if after-before != int64(cfg.Events) {
		return fmt.Errorf("load: %d of %d no-op jobs completed, none left to run", after-before, cfg.Events)
	}
	fmt.Fprintf(stdout, "mode jobs: %d no-op jobs completed in %s: %.0f jobs/s%s\n", cfg.Events, elapsed.Round(time.Millisecond), float64(cfg.Events)/elapsed.Seconds(), replicasNote(cfg.Replicas))
	fmt.Fprintln(stdout, cpu.Report(ctx, cfg.Events, "job"))
	fmt.Fprintf(stdout, "outboxd peak RSS %s\n", child.PeakRSS())
	return nil
}

// recordBulk records n events of topic in transactions of 10,000.
func recordBulk(ctx context.Context, db *sql.DB, topic string, n int) error {
	for done := 0; done < n; done += 10_000 {
		if _, err := db.ExecContext(ctx, `SELECT outbox.record($3, 'bulk-' || i, '{"load": true}') FROM generate_series($1::int, $2::int) AS i`,
			done, min(done+10_000, n)-1, topic); err != nil {
			return fmt.Errorf("load: record events: %w", err)
		}
	}
	return nil
}

// loadBacklog is what is not delivered yet: un-fanned events and unfinished jobs.
func loadBacklog(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, `
		SELECT (SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL)
		     + (SELECT count(*) FROM outbox.jobs WHERE state IN ('available', 'running', 'retryable'))`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("load: backlog: %w", err)
	}
	return n, nil
}

// loadReceiver is the webhook receiver on loopback: it verifies every
// signature, dedupes on webhook-id and keeps each first delivery's latency.
// A scenario's receiver may answer otherwise (answer) and keep every
// request's span (keepSpans).
type loadReceiver struct {
	srv    *http.Server
	url    string
	secret atomic.Pointer[webhookSecret]
	// answer, if set, says how to answer a request whose signature holds.
	answer    func(webhookID string) requestAnswer
	keepSpans bool
	closed    chan struct{} // closed by Close: waiting answers end

	mu        sync.Mutex // protects the fields below
	seen      map[string]bool
	latencies []time.Duration
	spans     []requestSpan // with keepSpans, in the order answers were written
	open      int           // with keepSpans: requests arrived and not answered yet
	maxOpen   int           // the most open at once
	dups      int64
	bad       int64
	changed   chan struct{} // closed and replaced on every new delivery
}

// requestSpan is one request as the receiver saw it: when it arrived,
// when the answer was written, and the answer's status.
type requestSpan struct {
	Start, End time.Time
	Status     int
	Claimed    time.Time // requestAnswer.Claimed
}

// requestAnswer is how a scenario's receiver answers one request: after
// Wait, with Status (0 or 2xx: accepted; otherwise a refusal, and the event
// stays undelivered). Claimed is when outboxd claimed the attempt, if the
// scenario looked it up (zero if not).
type requestAnswer struct {
	Wait    time.Duration
	Status  int
	Claimed time.Time
}

func startLoadReceiver() (*loadReceiver, error) {
	return startAnsweringReceiver(nil, false)
}

// startAnsweringReceiver starts a receiver that answers as answer says
// (nil: 204 at once) and, with keepSpans, keeps every request's span.
func startAnsweringReceiver(answer func(webhookID string) requestAnswer, keepSpans bool) (*loadReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("load: receiver: %w", err)
	}
	r := &loadReceiver{url: "http://" + ln.Addr().String() + "/hook", seen: map[string]bool{}, changed: make(chan struct{}),
		answer: answer, keepSpans: keepSpans, closed: make(chan struct{})}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

func (r *loadReceiver) serve(w http.ResponseWriter, req *http.Request) {
	arrived := time.Now()
	if r.keepSpans {
		r.mu.Lock()
		r.open++
		r.maxOpen = max(r.maxOpen, r.open)
		r.mu.Unlock()
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 2<<20))
	secret := r.secret.Load()
	if err != nil || secret == nil || verifyWebhook([][]byte{*secret}, req.Header, body, time.Now()) != nil {
		r.mu.Lock()
		r.bad++
		r.keepSpan(requestSpan{Start: arrived, Status: http.StatusUnauthorized})
		r.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var claimed time.Time
	if r.answer != nil {
		a := r.answer(req.Header.Get("webhook-id"))
		claimed = a.Claimed
		if a.Wait > 0 {
			t := time.NewTimer(a.Wait)
			select {
			case <-t.C:
			case <-req.Context().Done():
				t.Stop()
			case <-r.closed:
				t.Stop()
			}
		}
		if a.Status != 0 && a.Status/100 != 2 {
			r.mu.Lock()
			r.keepSpan(requestSpan{Start: arrived, Status: a.Status, Claimed: claimed})
			r.mu.Unlock()
			w.WriteHeader(a.Status)
			return
		}
	}
	var msg struct {
		Timestamp time.Time `json:"timestamp"`
	}
	json.Unmarshal(body, &msg)
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	if r.seen[id] {
		r.dups++
	} else {
		r.seen[id] = true
		r.latencies = append(r.latencies, time.Since(msg.Timestamp))
		close(r.changed)
		r.changed = make(chan struct{})
	}
	r.keepSpan(requestSpan{Start: arrived, Status: http.StatusNoContent, Claimed: claimed})
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// keepSpan notes a request answered now. r.mu must be held.
func (r *loadReceiver) keepSpan(sp requestSpan) {
	if r.keepSpans {
		sp.End = time.Now()
		r.spans = append(r.spans, sp)
		r.open--
	}
}

// MaxOpen is the most requests the receiver had open at once (keepSpans).
func (r *loadReceiver) MaxOpen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxOpen
}

// AwaitIdle waits until no request is open (keepSpans), so that Spans
// holds every request made so far.
func (r *loadReceiver) AwaitIdle(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		r.mu.Lock()
		open := r.open
		r.mu.Unlock()
		if open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("load: %d requests still open after %s", open, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Spans are the requests answered so far, in answer order.
func (r *loadReceiver) Spans() []requestSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// Latencies are the first-2xx latencies from the n-th delivered event on.
func (r *loadReceiver) Latencies(from int) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.latencies[min(from, len(r.latencies)):])
}

func (r *loadReceiver) Unique() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(len(r.seen))
}

func (r *loadReceiver) Duplicates() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dups
}

// AwaitUnique waits until n distinct events have arrived.
func (r *loadReceiver) AwaitUnique(ctx context.Context, n int64, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		got, changed, bad := int64(len(r.seen)), r.changed, r.bad
		r.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("load: %d of %d events delivered after %s (%d refused signatures)", got, n, timeout, bad)
		case <-changed:
		}
	}
}

// Percentiles are p50, p95, p99 and max of commit-to-first-2xx latency.
func (r *loadReceiver) Percentiles() [4]time.Duration {
	l := r.Latencies(0)
	slices.Sort(l)
	return [4]time.Duration{quantile(l, 0.50), quantile(l, 0.95), quantile(l, 0.99), quantile(l, 1)}
}

// quantile is the q-quantile (0 < q <= 1) of sorted by the nearest-rank
// method: the smallest value that at least q of the values do not exceed.
// It is 0 for no values.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, max(0, int(math.Ceil(q*float64(len(sorted))))-1))]
}

func (r *loadReceiver) Close() {
	close(r.closed)
	r.srv.Close()
}

// loadChild is the outboxd under test, this same binary in serve mode.
type loadChild struct {
	dsn, token string
	extra      []string
	stderr     io.Writer
	addr       string
	cmd        *exec.Cmd
	exited     chan struct{} // closed when cmd has exited; exitErr is then set
	exitErr    error
	peakRSS    int64 // kB, the largest VmHWM seen across restarts
}

func (c *loadChild) Start(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("load: find own binary: %w", err)
	}
	if c.addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("load: %w", err)
		}
		c.addr = ln.Addr().String()
		ln.Close()
	}
	args := append([]string{"-database-url", c.dsn, "-addr", c.addr, "-admin-token", c.token,
		"-allow-private-endpoints", "-log-level", "warn"}, c.extra...)
	c.cmd = exec.Command(exe, args...)
	c.cmd.Env = append(os.Environ(), "OUTBOXD_TEST_RUN_MAIN=1") // honoured by the test binary only
	c.cmd.Stdout, c.cmd.Stderr = io.Discard, c.stderr
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("load: start outboxd: %w", err)
	}
	// One Wait, here, so the readiness loop below learns of an early exit
	// (a refused setting) at once instead of after its minute.
	cmd, exited := c.cmd, make(chan struct{})
	c.exited = exited
	go func() {
		c.exitErr = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + c.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("load: outboxd not ready after 60s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			c.cmd = nil
			return fmt.Errorf("load: outboxd exited before it was ready (%v); its output is above", c.exitErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop ends the child with SIGTERM, noting its peak memory first.
func (c *loadChild) Stop() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	c.peakRSS = max(c.peakRSS, readVmHWM(c.cmd.Process.Pid))
	c.cmd.Process.Signal(syscall.SIGTERM)
	<-c.exited
	c.cmd = nil
}

// PeakRSS is outboxd's high-water resident memory, from /proc (Linux).
func (c *loadChild) PeakRSS() string {
	if c.cmd != nil && c.cmd.Process != nil {
		c.peakRSS = max(c.peakRSS, readVmHWM(c.cmd.Process.Pid))
	}
	if c.peakRSS == 0 {
		return "unknown (no /proc)"
	}
	return fmt.Sprintf("%.1f MiB", float64(c.peakRSS)/1024)
}

func readVmHWM(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

// loadEndpoint is what a run registers for a receiver: its topic
// patterns and delivery settings (zero: the server's default).
type loadEndpoint struct {
	Topics             []string `json:"topics"`
	MaxInFlight        int      `json:"max_in_flight,omitempty"`
	RateLimitPerSecond float64  `json:"rate_limit_per_second,omitempty"`
	Ordering           string   `json:"ordering,omitempty"`
}

// CreateEndpoint registers the receiver through the API, hands it the
// endpoint's secret and returns the endpoint's id.
func (c *loadChild) CreateEndpoint(ctx context.Context, r *loadReceiver, settings loadEndpoint) (int64, error) {
	body := struct {
		URL         string `json:"url"`
		Description string `json:"description"`
		loadEndpoint
	}{r.url, "outboxd load", settings}
	var ep struct {
		ID     int64  `json:"id"`
		Secret string `json:"secret"`
		Error  string `json:"error"`
	}
	status, err := c.call(ctx, "POST", "/api/endpoints", body, &ep)
	if err != nil {
		return 0, fmt.Errorf("load: create endpoint: %w", err)
	}
	if status != http.StatusCreated {
		return 0, fmt.Errorf("load: create endpoint: %d %s", status, ep.Error)
	}
	secret, err := parseWebhookSecret(ep.Secret)
	if err != nil {
		return 0, fmt.Errorf("load: endpoint secret: %w", err)
	}
	r.secret.Store(&secret)
	return ep.ID, nil
}

// call makes one API request to the child, with body as JSON (nil: none),
// decodes the answer into out and returns its status.
func (c *loadChild) call(ctx context.Context, method, path string, body, out any) (int, error) {
	var in io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		in = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr+path, in)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil && resp.StatusCode/100 == 2 {
			return resp.StatusCode, fmt.Errorf("decode the answer: %w", err)
		}
	}
	return resp.StatusCode, nil
}

// childSetting is the integer setting name of a child started with the
// flags extra, as the child reads it: the flag (-name or --name, with = or
// a separate value) if given, else its environment fallback (the child
// inherits this process's environment), else def. A value that is not a
// positive number gives def here; the child then refuses to start and
// names the setting.
func childSetting(extra []string, getenv func(string) string, name string, def int) int {
	if n, err := strconv.Atoi(getenv(envName(name))); err == nil && n >= 1 {
		def = n
	}
	return serveFlagInt(extra, name, def)
}

// childWorkers is a child's -workers, 64 by default.
func childWorkers(extra []string, getenv func(string) string) int {
	return childSetting(extra, getenv, "workers", defaultConfig().Workers.Concurrency)
}

// serveFlagInt is the integer flag name among a child's flags, the last
// one given winning as in package flag; def if absent or not a number.
func serveFlagInt(extra []string, name string, def int) int {
	v := def
	for i, a := range extra {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		var val string
		switch {
		case a == name && i+1 < len(extra):
			val = extra[i+1]
		case strings.HasPrefix(a, name+"="):
			val = strings.TrimPrefix(a, name+"=")
		default:
			continue
		}
		if n, err := strconv.Atoi(val); err == nil && n >= 1 {
			v = n
		}
	}
	return v
}

// cpuMeter adds up the CPU time one phase of a run costs: that of the
// outboxd processes under test and of the PostgreSQL backends serving the
// run's database, read from /proc. On a shared machine a rate moves with
// whatever else runs; the CPU time a phase costs moves far less, so two
// builds compare by it as well as by their rates (README, "Against
// River"). It needs Linux and the server on this machine; elsewhere it
// reports nothing.
//
// A backend's time counts from the phase's start (its time then is the
// baseline) to its last sample: the meter samples every cpuSampleEvery,
// so a connection the pool closes mid-phase keeps nearly all it spent.
// The server's own processes (WAL writer, checkpointer) are not counted,
// nor this process's: the load tool's queries during a phase are a few
// counts.
type cpuMeter struct {
	db        *sql.DB
	stop      chan struct{}
	done      chan struct{}
	mu        sync.Mutex
	processes []int                 // outboxd's pids, added once started
	base      map[int]time.Duration // backends' CPU time at the start
	last      map[int]time.Duration // every pid's CPU time at its last sample
}

// cpuSampleEvery is how often the meter reads /proc.
const cpuSampleEvery = 250 * time.Millisecond

// backendPIDsSQL lists the client backends of the run's database.
const backendPIDsSQL = `
SELECT pid FROM pg_stat_activity
WHERE datname = current_database()
  AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()`

// startCPUMeter takes the baseline and starts sampling.
func startCPUMeter(ctx context.Context, db *sql.DB) *cpuMeter {
	m := &cpuMeter{db: db, stop: make(chan struct{}), done: make(chan struct{}),
		base: map[int]time.Duration{}, last: map[int]time.Duration{}}
	pids, _ := queryAll(ctx, db, scanPID, backendPIDsSQL)
	for _, pid := range pids {
		if t, ok := readCPUTime(pid); ok {
			m.base[pid] = t
		}
	}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(cpuSampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-m.stop:
				return
			case <-tick.C:
				m.sample(ctx)
			}
		}
	}()
	return m
}

func scanPID(row rowScanner) (int, error) {
	var pid int
	err := row.Scan(&pid)
	return pid, err
}

// addProcess counts an outboxd process from now on: what it spent
// before (its start, or a phase before this one) is its baseline.
func (m *cpuMeter) addProcess(pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.processes = append(m.processes, pid)
	if t, ok := readCPUTime(pid); ok {
		m.base[pid] = t
	}
}

func (m *cpuMeter) sample(ctx context.Context) {
	pids, err := queryAll(ctx, m.db, scanPID, backendPIDsSQL)
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, pid := range append(pids, m.processes...) {
		if t, ok := readCPUTime(pid); ok {
			m.last[pid] = t
		}
	}
}

// Stop takes a last sample and reports the phase's CPU time: outboxd's
// and the backends'; ok is false where /proc had neither (a server on
// another machine leaves the backends' at zero).
func (m *cpuMeter) Stop(ctx context.Context) (outboxd, backends time.Duration, ok bool) {
	close(m.stop)
	<-m.done
	m.sample(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	for pid, t := range m.last {
		if slices.Contains(m.processes, pid) {
			outboxd += t - m.base[pid]
		} else {
			backends += t - m.base[pid]
		}
	}
	return outboxd, backends, outboxd > 0 && backends > 0
}

// Report is the line a mode prints after its rate: the phase's CPU time
// in all and per unit of work (an event, a job).
func (m *cpuMeter) Report(ctx context.Context, units int, unit string) string {
	outboxd, backends, ok := m.Stop(ctx)
	if !ok {
		return "CPU time: unknown (no /proc for outboxd or the server's backends)"
	}
	total := outboxd + backends
	return fmt.Sprintf("CPU time: outboxd %.2f s, PostgreSQL backends %.2f s: %.3f ms per %s",
		outboxd.Seconds(), backends.Seconds(), float64(total.Microseconds())/1000/float64(units), unit)
}

// clockTicksPerSecond is Linux's USER_HZ, the unit of /proc/PID/stat's
// times: 100 on every architecture Go supports there.
const clockTicksPerSecond = 100

// readCPUTime is a process's user and system time so far, from
// /proc/PID/stat; its fields 14 and 15, counted after the command name,
// which is in parentheses and may hold spaces.
func readCPUTime(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	return parseCPUTime(string(b))
}

// parseCPUTime reads the user and system time of a /proc/PID/stat line.
func parseCPUTime(stat string) (time.Duration, bool) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, false
	}
	fields := strings.Fields(stat[end+1:]) // from field 3, the state
	if len(fields) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicksPerSecond, true
}

// machineCPU reads the machine's CPU time from /proc/stat: the time every
// CPU was busy and the time that passed on all of them together, in clock
// ticks; ok false where there is no /proc. Two readings give the share of
// the machine a phase kept busy, whoever kept it so.
func machineCPU() (busy, total int64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += n
		if i != 3 && i != 4 { // idle and iowait
			busy += n
		}
	}
	return busy, total, true
}
