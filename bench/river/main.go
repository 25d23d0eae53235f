// Command riverbench runs River (github.com/riverqueue/river), the Go job
// queue on PostgreSQL, through the work bench/load measures, so that the
// two can be compared side by side on one server:
//
//	riverbench load -mode jobs    N no-op jobs inserted, then worked to empty
//	riverbench load -mode drain   N queued webhooks delivered to a receiver
//	riverbench load -mode keepup  producers commit jobs while they are delivered
//	riverbench compare            both systems, alternating, and a table
//
// Its output lines read like bench/load's, so one parser reads both.
// The River client runs in a child process (`riverbench work`), as outboxd
// runs under bench/load, so its peak memory is its own. README.md says
// what each mode measures and what is the same for both systems.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "riverbench:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: riverbench load|compare [flags]; riverbench load -h lists the flags")
		return errors.New("no command")
	}
	switch args[0] {
	case "load":
		cfg, err := parseLoadConfig("load", args[1:], getenv, stderr)
		if err != nil {
			return err
		}
		return runLoad(ctx, cfg, stdout, stderr)
	case "work":
		cfg, err := parseLoadConfig("work", args[1:], getenv, stderr)
		if err != nil {
			return err
		}
		return runWork(ctx, cfg, getenv, stdout, stderr)
	case "plain-table":
		return runPlainTable(ctx, args[1:], getenv, stderr)
	case "compare":
		cfg, err := parseCompareConfig(args[1:], getenv, stderr)
		if err != nil {
			return err
		}
		return runCompare(ctx, cfg, stdout, stderr)
	}
	return fmt.Errorf("unknown command %q: want load or compare", args[0])
}

// defaultDatabaseURL is the server this project's machines run; the
// database must exist (compare creates its own).
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/riverbench?sslmode=disable"

// loadConfig is the flags of `riverbench load` and of its child,
// `riverbench work`, which the parent starts with its own settings.
type loadConfig struct {
	DatabaseURL string
	Mode        string // load: jobs, drain or keepup
	Kind        string // work: noop or webhook
	URL         string // work: the receiver
	Events      int
	Workers     int
	MaxConns    int
	// FetchCooldown and FetchPollInterval default to the values `river
	// bench` sets "to maximize job throughput" (cmd/river/riverbench):
	// River's defaults are 100 ms and 1 s.
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
	Producers         int
	Duration          time.Duration
	Rate              float64
	// Warmup: keepup runs its producers this long before -duration, and
	// meters the CPU time of -duration alone (compare's cpu pair).
	Warmup      time.Duration
	BusinessRow bool
}

var (
	loadModes = []string{"jobs", "drain", "keepup"}
	workKinds = []string{"noop", "webhook"}
)

func parseLoadConfig(command string, args []string, getenv func(string) string, stderr io.Writer) (loadConfig, error) {
	cfg := loadConfig{DatabaseURL: cmp.Or(getenv("DATABASE_URL"), defaultDatabaseURL), Mode: "keepup", Kind: "noop",
		Events: 100_000, Workers: 2_000, FetchCooldown: 2 * time.Millisecond, FetchPollInterval: 20 * time.Millisecond,
		Producers: 16, Duration: 60 * time.Second}
	fs := flag.NewFlagSet("riverbench "+command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.DatabaseURL, "database-url", cfg.DatabaseURL, "database for River's tables (it must exist; River's migrations are applied, river_job is emptied)")
	fs.StringVar(&cfg.Mode, "mode", cfg.Mode, "jobs: -events no-op jobs inserted, then worked; drain: -events webhook jobs inserted, then delivered; keepup: -producers commit jobs for -duration while they are delivered")
	fs.StringVar(&cfg.Kind, "kind", cfg.Kind, "work (the child): noop or webhook")
	fs.StringVar(&cfg.URL, "url", cfg.URL, "work (the child): the receiver's URL; the secret is in RIVERBENCH_WEBHOOK_SECRET")
	fs.IntVar(&cfg.Events, "events", cfg.Events, "jobs (jobs mode) or events (drain mode) queued before the River client starts")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "River's MaxWorkers for the default queue (river bench: 2000)")
	fs.IntVar(&cfg.MaxConns, "max-conns", cfg.MaxConns, "the River client's pgx pool size; 0: pgxpool's default, as river bench has")
	fs.DurationVar(&cfg.FetchCooldown, "fetch-cooldown", cfg.FetchCooldown, "River's FetchCooldown")
	fs.DurationVar(&cfg.FetchPollInterval, "fetch-poll-interval", cfg.FetchPollInterval, "River's FetchPollInterval")
	fs.IntVar(&cfg.Producers, "producers", cfg.Producers, "keepup: producer connections, each committing one job a transaction")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "keepup: how long the producers run")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "keepup: jobs per second over all producers; 0 is as fast as the database commits")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "keepup: the producers run this long first, then -duration, and the CPU time of the River child and of the database's backends is metered over -duration alone, per event delivered in it (the line `CPU window`, as bench/load's -warmup); 0: no CPU time")
	fs.BoolVar(&cfg.BusinessRow, "business-row", cfg.BusinessRow, "keepup: each producer transaction also inserts a row into a plain table (bench/load's producers insert none)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case command == "load" && !slices.Contains(loadModes, cfg.Mode):
		return cfg, fmt.Errorf("-mode must be one of %s, got %q", strings.Join(loadModes, ", "), cfg.Mode)
	case command == "work" && !slices.Contains(workKinds, cfg.Kind):
		return cfg, fmt.Errorf("-kind must be one of %s, got %q", strings.Join(workKinds, ", "), cfg.Kind)
	case cfg.Events < 1:
		return cfg, fmt.Errorf("-events must be positive, got %d", cfg.Events)
	case cfg.Workers < 1 || cfg.Workers > 10_000:
		return cfg, fmt.Errorf("-workers must be between 1 and 10000 (River's limit), got %d", cfg.Workers)
	case cfg.MaxConns < 0:
		return cfg, fmt.Errorf("-max-conns must not be negative, got %d", cfg.MaxConns)
	case cfg.FetchCooldown < time.Millisecond || cfg.FetchPollInterval < time.Millisecond:
		return cfg, fmt.Errorf("-fetch-cooldown and -fetch-poll-interval must be at least 1ms (River's minimum), got %s and %s", cfg.FetchCooldown, cfg.FetchPollInterval)
	case cfg.Producers < 1 || cfg.Producers > 1000:
		return cfg, fmt.Errorf("-producers must be between 1 and 1000, got %d", cfg.Producers)
	case cfg.Duration <= 0:
		return cfg, fmt.Errorf("-duration must be positive, got %s", cfg.Duration)
	case cfg.Rate < 0:
		return cfg, fmt.Errorf("-rate must not be negative, got %g", cfg.Rate)
	case cfg.Warmup < 0:
		return cfg, fmt.Errorf("-warmup must not be negative, got %s", cfg.Warmup)
	}
	return cfg, nil
}
