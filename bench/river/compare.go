// compare.go: `riverbench compare`, outboxd and River through the same
// work, alternating, each run on a fresh database, and a markdown table of
// the medians and their ratios.

package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

type compareConfig struct {
	DatabaseURL  string // a database to connect to for DROP and CREATE DATABASE
	Outboxd      string // the outboxd binary
	Load         string // bench/load's binary, which drives outboxd
	Pgbench      string
	Runs         int
	Events       int
	Producers    int
	Duration     time.Duration
	Rate         float64
	PgbenchTime  time.Duration
	CPURate      float64       // the cpu pair's fixed rate, events/s
	CPUWarmup    time.Duration // the cpu pair's run before its window
	CPUWindow    time.Duration // the cpu pair's metered window
	Workers      int           // River's MaxWorkers as a webhook sender
	HeldRate     float64       // the held pair's fixed rate, events/s
	HeldRun      time.Duration // how long the held pair's producers run
	HeldFrom     time.Duration // the snapshot's hold, from the command's start
	HeldUntil    time.Duration
	HeldEvery    time.Duration // between the held pair's samples of the queue
	OutboxdFlags string
	Works        []string
	Lock         string // a file to flock around each single run; "" none
	LogDir       string
}

// compareWorks are the pairs compare can run, in this order. There is no
// burn-down of no-op jobs: outboxd has no such job kind (its `go test
// -bench` of the claim and the completer measures the job table), and
// riverbench's -mode jobs runs alone.
var compareWorks = []string{"drain", "keepup", "latency", "producer", "cpu", "held"}

// defaultWorks are the pairs compare runs unless -works says otherwise:
// all but held, whose two runs of six minutes each are a benchmark of
// their own (bench/held-snapshot.sh).
var defaultWorks = []string{"drain", "keepup", "latency", "producer", "cpu"}

func parseCompareConfig(args []string, getenv func(string) string, stderr io.Writer) (compareConfig, error) {
	cfg := compareConfig{DatabaseURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		Runs: 3, Events: 100_000, Producers: 16, Duration: 30 * time.Second, Rate: 600,
		PgbenchTime: 10 * time.Second, CPURate: 1000, CPUWarmup: 10 * time.Second, CPUWindow: 40 * time.Second,
		Workers: 1_000, HeldRate: 1000, HeldRun: 6 * time.Minute, HeldFrom: 40 * time.Second, HeldUntil: 280 * time.Second,
		HeldEvery: 15 * time.Second, Lock: getenv("BENCH_LOCK")}
	works := strings.Join(defaultWorks, ",")
	fs := flag.NewFlagSet("riverbench compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.DatabaseURL, "database-url", cfg.DatabaseURL, "a database on the server under test; each run gets a fresh database beside it (cmp_outboxd, cmp_river)")
	fs.StringVar(&cfg.Outboxd, "outboxd", cfg.Outboxd, "the outboxd binary (compare.sh builds it)")
	fs.StringVar(&cfg.Load, "load", cfg.Load, "bench/load's binary, which runs the outboxd binary under load (compare.sh builds it)")
	fs.StringVar(&cfg.Pgbench, "pgbench", cfg.Pgbench, "pgbench; empty: from PATH or /usr/lib/postgresql/*/bin")
	fs.IntVar(&cfg.Runs, "runs", cfg.Runs, "runs of each pair; the table shows medians")
	fs.IntVar(&cfg.Events, "events", cfg.Events, "events in the drain")
	fs.IntVar(&cfg.Producers, "producers", cfg.Producers, "producers in keep-up, clients in pgbench")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long keep-up's producers run")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "events/s over all producers in the latency pair")
	fs.DurationVar(&cfg.PgbenchTime, "pgbench-time", cfg.PgbenchTime, "how long each pgbench run lasts")
	fs.Float64Var(&cfg.CPURate, "cpu-rate", cfg.CPURate, "events/s over all producers in the cpu pair")
	fs.DurationVar(&cfg.CPUWarmup, "cpu-warmup", cfg.CPUWarmup, "how long the cpu pair's producers run before its window")
	fs.DurationVar(&cfg.CPUWindow, "cpu-window", cfg.CPUWindow, "the cpu pair's window, over which its CPU time is metered")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "River's MaxWorkers as a webhook sender (drain, keep-up, latency, cpu)")
	fs.Float64Var(&cfg.HeldRate, "held-rate", cfg.HeldRate, "events/s over all producers in the held pair")
	fs.DurationVar(&cfg.HeldRun, "held-run", cfg.HeldRun, "how long the held pair's producers run")
	fs.DurationVar(&cfg.HeldFrom, "held-from", cfg.HeldFrom, "when the held pair's snapshot is taken, after its command starts")
	fs.DurationVar(&cfg.HeldUntil, "held-until", cfg.HeldUntil, "when the held pair's snapshot is released, after its command starts")
	fs.DurationVar(&cfg.HeldEvery, "held-sample", cfg.HeldEvery, "how often the held pair samples the queue's dead row versions and backlog")
	fs.StringVar(&cfg.OutboxdFlags, "outboxd-flags", cfg.OutboxdFlags, "extra flags for the outboxd under test (bench/load's -serve-flags)")
	fs.StringVar(&works, "works", works, "the pairs to run, comma-separated")
	fs.StringVar(&cfg.Lock, "lock", cfg.Lock, "a file to flock(2) around each single run, so other load waits (default $BENCH_LOCK)")
	fs.StringVar(&cfg.LogDir, "log-dir", cfg.LogDir, "where each run's output is kept; empty: a new temporary folder")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	cfg.Works = strings.Split(works, ",")
	for _, w := range cfg.Works {
		if !slices.Contains(compareWorks, w) {
			return cfg, fmt.Errorf("-works: %q is not one of %s", w, strings.Join(compareWorks, ", "))
		}
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.check(); err != nil {
		return cfg, err
	}
	if cfg.Pgbench == "" && slices.Contains(cfg.Works, "producer") {
		var err error
		if cfg.Pgbench, err = findPgbench(); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// check answers what is wrong with the flags' values, if anything.
func (cfg compareConfig) check() error {
	switch {
	case cfg.Outboxd == "":
		return errors.New("-outboxd: the outboxd binary is required")
	case cfg.Load == "":
		return errors.New("-load: bench/load's binary is required")
	case cfg.Runs < 1:
		return fmt.Errorf("-runs must be positive, got %d", cfg.Runs)
	case cfg.Events < 1:
		return fmt.Errorf("-events must be positive, got %d", cfg.Events)
	case cfg.Producers < 1 || cfg.Rate <= 0 || cfg.Duration <= 0 || cfg.PgbenchTime < time.Second:
		return errors.New("-producers, -rate and -duration must be positive, -pgbench-time at least 1s")
	case cfg.CPURate <= 0 || cfg.CPUWindow <= 0 || cfg.CPUWarmup <= 0:
		return errors.New("-cpu-rate, -cpu-warmup and -cpu-window must be positive")
	case cfg.HeldRate <= 0 || cfg.HeldEvery <= 0:
		return errors.New("-held-rate and -held-sample must be positive")
	case cfg.HeldFrom < 0 || cfg.HeldFrom >= cfg.HeldUntil || cfg.HeldUntil > cfg.HeldRun:
		// The producers run -held-run from a little after the command
		// starts, so a hold that ends by then ends while they run.
		return fmt.Errorf("-held-from %s, -held-until %s, -held-run %s: want 0 <= from < until <= run", cfg.HeldFrom, cfg.HeldUntil, cfg.HeldRun)
	}
	return nil
}

func findPgbench() (string, error) {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	if len(found) == 0 {
		return "", errors.New("pgbench not found: pass -pgbench")
	}
	slices.Sort(found)
	return found[len(found)-1], nil
}

// Each system runs in its own database, dropped and created before every
// run, so no run inherits another's tables, bloat or statistics.
const (
	outboxdDB = "cmp_outboxd"
	riverDB   = "cmp_river"
)

// metric is one row of the table: what a pair's output says, read by re.
type metric struct {
	work, label string
	re          *regexp.Regexp
	group       int
	over        int  // a group the value is divided by; 0: none
	duration    bool // the value is a Go duration, shown in ms
	unit        string
	digits      int // decimals shown; 0: as format chooses
}

var (
	reDrain   = regexp.MustCompile(`events delivered in \S+: (\d+) events/s`)
	reRSS     = regexp.MustCompile(`peak RSS ([\d.]+) MiB`)
	reKeepUp  = regexp.MustCompile(`committed (\d+) events/s, delivered (\d+) events/s during the run`)
	reLatency = regexp.MustCompile(`commit->2xx latency p50 (\S+) p95 (\S+) p99 (\S+) max (\S+)`)
	rePgbench = regexp.MustCompile(`tps = ([\d.]+) \(without initial connection time\)`)
	// reCPU is the cpu pair's line, bench/load's and riverbench's alike:
	// delivered/s, then ms per delivered event in all, the backends' and
	// the process's.
	reCPU = regexp.MustCompile(`CPU window \S+ after a \S+ warm-up: delivered \d+ events, ([\d.]+) events/s; ` +
		`CPU time \S+ [\d.]+ s, PostgreSQL backends [\d.]+ s: ([\d.]+) ms per delivered event \(PostgreSQL backends ([\d.]+) ms, \S+ ([\d.]+) ms\)`)
	// reHeld is the held pair's last line of the hold (held.go), the
	// same for both systems.
	reHeld = regexp.MustCompile(`dead row versions at the end of the hold (\d+)`)
)

func metrics(cfg compareConfig) []metric {
	return []metric{
		{"drain", fmt.Sprintf("drain: %s queued events delivered, signed, to a local receiver (events/s)", thousands(float64(cfg.Events))), reDrain, 1, 0, false, "", 0},
		{"drain", "drain: the sender's peak RSS (lower is better)", reRSS, 1, 0, false, " MiB", 0},
		{"keepup", fmt.Sprintf("keep-up: %d producers committing one event a transaction as fast as they can for %s (commits/s)", cfg.Producers, cfg.Duration), reKeepUp, 1, 0, false, "", 0},
		{"keepup", "keep-up: delivered during the run (events/s)", reKeepUp, 2, 0, false, "", 0},
		{"keepup", "keep-up: commit→first 2xx p99 (lower is better)", reLatency, 3, 0, true, " ms", 0},
		{"latency", fmt.Sprintf("latency at %g events/s: the rate committed (events/s; below %g, the producers could not keep the rate)", cfg.Rate, cfg.Rate), reKeepUp, 1, 0, false, "", 0},
		{"latency", fmt.Sprintf("latency at %g events/s: commit→first 2xx p50 (lower is better)", cfg.Rate), reLatency, 1, 0, true, " ms", 0},
		{"latency", fmt.Sprintf("latency at %g events/s: p95", cfg.Rate), reLatency, 2, 0, true, " ms", 0},
		{"latency", fmt.Sprintf("latency at %g events/s: p99", cfg.Rate), reLatency, 3, 0, true, " ms", 0},
		{"producer", fmt.Sprintf("producer cost: pgbench, %d clients, one row a transaction: `SELECT outbox.record(...)` (outboxd column) against a plain `INSERT` of the same row (River column) (tx/s)", cfg.Producers), rePgbench, 1, 0, false, "", 0},
		{"cpu", fmt.Sprintf("CPU at %g events/s: delivered over the %s window after %s (events/s; below %g, the system did not keep up)", cfg.CPURate, cfg.CPUWindow, cfg.CPUWarmup, cfg.CPURate), reCPU, 1, 0, false, "", 0},
		{"cpu", fmt.Sprintf("CPU at %g events/s: CPU time per delivered event, the system's process and the PostgreSQL backends of its database (lower is better)", cfg.CPURate), reCPU, 2, 0, false, " ms", 3},
		{"cpu", fmt.Sprintf("CPU at %g events/s: the PostgreSQL backends' share, the producers' included (lower is better)", cfg.CPURate), reCPU, 3, 0, false, " ms", 3},
		{"cpu", fmt.Sprintf("CPU at %g events/s: the process's share, outboxd or the River child (lower is better)", cfg.CPURate), reCPU, 4, 0, false, " ms", 3},
		{"held", fmt.Sprintf("held snapshot at %g events/s (a REPEATABLE READ transaction idle from %s to %s of a %s run): the rate committed (events/s; below %g, the producers could not keep the rate)",
			cfg.HeldRate, cfg.HeldFrom, cfg.HeldUntil, cfg.HeldRun, cfg.HeldRate), reKeepUp, 1, 0, false, "", 0},
		{"held", "held snapshot: delivered ÷ committed during the run (below 1, a backlog was left)", reKeepUp, 2, 1, false, "", 3},
		{"held", "held snapshot: commit→first 2xx p50 (lower is better)", reLatency, 1, 0, true, " ms", 0},
		{"held", "held snapshot: p95", reLatency, 2, 0, true, " ms", 0},
		{"held", "held snapshot: p99", reLatency, 3, 0, true, " ms", 0},
		{"held", "held snapshot: max", reLatency, 4, 0, true, " ms", 0},
		{"held", "held snapshot: dead row versions in the queue's tables at the end of the hold (n_dead_tup; lower is better)", reHeld, 1, 0, false, "", 0},
	}
}

func runCompare(ctx context.Context, cfg compareConfig, stdout, stderr io.Writer) error {
	if cfg.LogDir == "" {
		dir, err := os.MkdirTemp("", "riverbench-compare-")
		if err != nil {
			return err
		}
		cfg.LogDir = dir
	} else if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "riverbench compare: each run's output in %s\n", cfg.LogDir)
	if err := writePgbenchScripts(cfg.LogDir); err != nil {
		return err
	}

	outputs := map[string][]string{} // "work system" -> the runs' outputs
	for run := 1; run <= cfg.Runs; run++ {
		for _, work := range cfg.Works {
			// Which system goes first alternates from run to run, so that
			// neither always inherits a server just loaded by the other.
			systems := []string{"outboxd", "river"}
			if run%2 == 0 {
				slices.Reverse(systems)
			}
			for _, system := range systems {
				out, err := cfg.runOne(ctx, work, system, run)
				if err != nil {
					return err
				}
				outputs[work+" "+system] = append(outputs[work+" "+system], out)
			}
		}
	}
	for _, db := range []string{outboxdDB, riverDB} {
		if err := dropDatabase(ctx, cfg.DatabaseURL, db); err != nil {
			fmt.Fprintf(stderr, "riverbench compare: %v\n", err)
		}
	}
	return cfg.printTable(ctx, stdout, outputs)
}

// runOne runs one system through one work once, under the lock, and
// returns its output (also kept in the log folder).
func (cfg compareConfig) runOne(ctx context.Context, work, system string, run int) (string, error) {
	unlock, err := lockFile(cfg.Lock)
	if err != nil {
		return "", err
	}
	defer unlock()

	db := map[string]string{"outboxd": outboxdDB, "river": riverDB}[system]
	if err := dropDatabase(ctx, cfg.DatabaseURL, db); err != nil {
		return "", err
	}
	if err := createDatabase(ctx, cfg.DatabaseURL, db); err != nil {
		return "", err
	}
	dbURL, err := withDatabase(cfg.DatabaseURL, db)
	if err != nil {
		return "", err
	}
	var out syncBuffer
	// Other load on the machine shows in the figures; the log says how
	// much there was when the run began.
	fmt.Fprintf(&out, "loadavg %s", readLoadAvg())
	for _, argv := range cfg.commands(work, system, dbURL) {
		fmt.Fprintf(&out, "$ %s\n", strings.Join(argv, " "))
		var err error
		if work == "held" {
			err = runHeld(ctx, argv, heldPlan{DatabaseURL: dbURL, System: system,
				From: cfg.HeldFrom, Until: cfg.HeldUntil, Every: cfg.HeldEvery}, &out)
		} else {
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Stdout, cmd.Stderr = &out, &out
			err = cmd.Run()
		}
		if err != nil {
			name := filepath.Join(cfg.LogDir, fmt.Sprintf("%s-%s-%d.failed.txt", work, system, run))
			os.WriteFile(name, []byte(out.String()), 0o644)
			return "", fmt.Errorf("%s %s run %d: %s: %w (output in %s)", work, system, run, argv[0], err, name)
		}
	}
	name := filepath.Join(cfg.LogDir, fmt.Sprintf("%s-%s-%d.txt", work, system, run))
	if err := os.WriteFile(name, []byte(out.String()), 0o644); err != nil {
		return "", err
	}
	return out.String(), nil
}

// commands are the command lines of one run of work by system, run in
// order on a fresh database at dbURL.
func (cfg compareConfig) commands(work, system, dbURL string) [][]string {
	self, _ := os.Executable()
	n := strconv.Itoa
	var load []string
	if system == "outboxd" {
		// compare has made the run's database afresh: bench/load runs in
		// it as it is (-database "") rather than beside it.
		load = []string{cfg.Load, "-outboxd", cfg.Outboxd, "-database-url", dbURL, "-database", ""}
		if cfg.OutboxdFlags != "" {
			load = append(load, "-serve-flags", cfg.OutboxdFlags)
		}
	} else {
		load = []string{self, "load", "-database-url", dbURL}
	}
	keepup := []string{"-mode", "keepup", "-producers", n(cfg.Producers), "-duration", cfg.Duration.String()}
	riverWorkers := []string{"-workers", n(cfg.Workers)}
	// cpu: keep-up at a fixed rate, paced as latency's, whose CPU time is
	// metered over the window after the warm-up.
	cpu := []string{"-mode", "keepup", "-producers", n(cfg.Producers), "-rate", fmt.Sprint(cfg.CPURate),
		"-warmup", cfg.CPUWarmup.String(), "-duration", cfg.CPUWindow.String()}
	// held: keep-up at a fixed rate, paced as latency's, while runHeld
	// holds a snapshot in the run's database.
	held := []string{"-mode", "keepup", "-producers", n(cfg.Producers), "-rate", fmt.Sprint(cfg.HeldRate), "-duration", cfg.HeldRun.String()}
	switch {
	case work == "drain" && system == "outboxd":
		return [][]string{append(load, "-mode", "drain", "-events", n(cfg.Events))}
	case work == "drain":
		return [][]string{slices.Concat(load, []string{"-mode", "drain", "-events", n(cfg.Events)}, riverWorkers)}
	case work == "keepup" && system == "outboxd":
		return [][]string{slices.Concat(load, keepup)}
	case work == "keepup":
		return [][]string{slices.Concat(load, keepup, riverWorkers)}
	case work == "latency" && system == "outboxd":
		return [][]string{slices.Concat(load, keepup, []string{"-rate", fmt.Sprint(cfg.Rate)})}
	case work == "latency":
		return [][]string{slices.Concat(load, keepup, []string{"-rate", fmt.Sprint(cfg.Rate)}, riverWorkers)}
	case work == "cpu" && system == "outboxd":
		return [][]string{slices.Concat(load, cpu)}
	case work == "cpu":
		return [][]string{slices.Concat(load, cpu, riverWorkers)}
	case work == "held" && system == "outboxd":
		return [][]string{slices.Concat(load, held)}
	case work == "held":
		return [][]string{slices.Concat(load, held, riverWorkers)}
	}
	// producer: pgbench against outboxd's schema or a plain table.
	pgbench := func(script string) []string {
		return []string{cfg.Pgbench, "-n", "-c", n(cfg.Producers), "-j", n(min(cfg.Producers, runtime.NumCPU())),
			"-T", n(int(cfg.PgbenchTime / time.Second)), "-f", filepath.Join(cfg.LogDir, script), dbURL}
	}
	if system == "outboxd" {
		return [][]string{{cfg.Outboxd, "migrate", "-database-url", dbURL}, pgbench(pgbenchRecord)}
	}
	return [][]string{{self, "plain-table", "-database-url", dbURL}, pgbench(pgbenchPlain)}
}

// The producer pair's pgbench scripts: the same row, recorded as an event
// or inserted into a plain table of outbox.events' shape.
const (
	pgbenchRecord = "pgbench-record.sql"
	pgbenchPlain  = "pgbench-plain.sql"
)

func writePgbenchScripts(dir string) error {
	scripts := map[string]string{
		pgbenchRecord: "\\set n random(1, 1000000000)\nSELECT outbox.record('load.event', 'k' || :n, '{\"load\": true}');\n",
		pgbenchPlain:  "\\set n random(1, 1000000000)\nINSERT INTO plain_events (topic, subject, payload) VALUES ('load.event', 'k' || :n, '{\"load\": true}');\n",
	}
	for name, text := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// plainTable is outbox.events' shape with none of its constraints,
// triggers or indexes beyond the primary key.
const plainTable = `
CREATE TABLE plain_events (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  topic      text        NOT NULL,
  subject    text        NOT NULL DEFAULT '',
  payload    jsonb       NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT now()
)`

// runPlainTable is `riverbench plain-table`: it creates plain_events.
func runPlainTable(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("riverbench plain-table", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", cmp.Or(getenv("DATABASE_URL"), defaultDatabaseURL), "the database")
	if err := fs.Parse(args); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, plainTable); err != nil {
		return fmt.Errorf("create plain_events: %w", err)
	}
	return nil
}

// lockFile takes an exclusive flock(2) on path, the lock flock(1) takes,
// and returns its release; path "" locks nothing.
func lockFile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

func withDatabase(base, db string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parse -database-url: %w", err)
	}
	u.Path = "/" + db
	return u.String(), nil
}

// dbAdmin runs one statement on the database of base.
func dbAdmin(ctx context.Context, base, sql string) error {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// dropDatabase drops db; db is one of the constants above, never input,
// so it is safe in the statement's text.
func dropDatabase(ctx context.Context, base, db string) error {
	if err := dbAdmin(ctx, base, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", db, err)
	}
	return nil
}

func createDatabase(ctx context.Context, base, db string) error {
	if err := dbAdmin(ctx, base, "CREATE DATABASE "+db); err != nil {
		return fmt.Errorf("create database %s: %w", db, err)
	}
	return nil
}

// printTable prints what ran where, then one row a metric: each system's
// median and every run's value, and the ratio of the medians.
func (cfg compareConfig) printTable(ctx context.Context, w io.Writer, outputs map[string][]string) error {
	fmt.Fprintf(w, "Machine: %s, %d CPUs; %s\n", cpuModel(), runtime.NumCPU(), serverVersion(ctx, cfg.DatabaseURL))
	fmt.Fprintf(w, "outboxd: %s; River: %s\n", outboxdVersion(cfg.Outboxd), riverVersion())
	if lo, hi, ok := loadAvgRange(outputs); ok {
		fmt.Fprintf(w, "1-minute load average when a run began: %.2f to %.2f (the previous run counts in it too)\n", lo, hi)
	}
	fmt.Fprintf(w, "Medians of %d alternating runs, each on a fresh database; every run's value in brackets. Ratio: outboxd ÷ River.\n\n", cfg.Runs)
	fmt.Fprintln(w, "| work | outboxd | River | ratio |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, m := range metrics(cfg) {
		if !slices.Contains(cfg.Works, m.work) {
			continue
		}
		var cells [2]string
		var medians [2]float64
		for i, system := range []string{"outboxd", "river"} {
			var values []float64
			for _, out := range outputs[m.work+" "+system] {
				v, err := m.read(out)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", m.label, system, err)
				}
				values = append(values, v)
			}
			medians[i] = median(values)
			shown := make([]string, len(values))
			for j, v := range values {
				shown[j] = m.format(v)
			}
			cells[i] = fmt.Sprintf("%s%s (%s)", m.format(medians[i]), m.unit, strings.Join(shown, " / "))
		}
		ratio := "–"
		if medians[1] > 0 {
			ratio = fmt.Sprintf("%.2f×", medians[0]/medians[1])
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", m.label, cells[0], cells[1], ratio)
	}
	return nil
}

var reLoadAvg = regexp.MustCompile(`(?m)^loadavg ([\d.]+) `)

// loadAvgRange is the least and the most 1-minute load average that
// runs began with.
func loadAvgRange(outputs map[string][]string) (lo, hi float64, ok bool) {
	for _, outs := range outputs {
		for _, out := range outs {
			m := reLoadAvg.FindStringSubmatch(out)
			if m == nil {
				continue
			}
			v, _ := strconv.ParseFloat(m[1], 64)
			if !ok || v < lo {
				lo = v
			}
			if !ok || v > hi {
				hi = v
			}
			ok = true
		}
	}
	return lo, hi, ok
}

// read is the metric's value in out: a number, or a duration in ms.
func (m metric) read(out string) (float64, error) {
	match := m.re.FindStringSubmatch(out)
	if match == nil {
		return 0, fmt.Errorf("no line matches %q", m.re)
	}
	if m.over > 0 {
		v, err := strconv.ParseFloat(match[m.group], 64)
		by, err2 := strconv.ParseFloat(match[m.over], 64)
		if err := cmp.Or(err, err2); err != nil || by == 0 {
			return 0, fmt.Errorf("read %q over %q: %v", match[m.group], match[m.over], err)
		}
		return v / by, nil
	}
	text := match[m.group]
	if m.duration {
		d, err := time.ParseDuration(text)
		if err != nil {
			return 0, fmt.Errorf("read %q: %w", text, err)
		}
		return float64(d) / float64(time.Millisecond), nil
	}
	return strconv.ParseFloat(text, 64)
}

func (m metric) format(v float64) string {
	switch {
	case m.digits > 0:
		return strconv.FormatFloat(v, 'f', m.digits, 64)
	case m.duration && v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case m.duration || m.unit != "":
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return thousands(v)
}

// thousands shows a rate rounded, with thousands separated by commas.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// readLoadAvg is /proc/loadavg: the 1, 5 and 15-minute load averages,
// runnable/total tasks and the last pid.
func readLoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown\n"
	}
	return string(b)
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// serverVersion names the server and its autovacuum setting, on which
// the dead row versions of the held pair depend.
func serverVersion(ctx context.Context, base string) string {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "PostgreSQL (unknown version)"
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, `SELECT 'PostgreSQL ' || current_setting('server_version') || ', autovacuum ' || current_setting('autovacuum')`).Scan(&v); err != nil {
		return "PostgreSQL (unknown version)"
	}
	return v
}

func outboxdVersion(bin string) string {
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		return "unknown version"
	}
	return strings.TrimSpace(string(out))
}

func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == "github.com/riverqueue/river" {
				return dep.Version
			}
		}
	}
	return "unknown version"
}
