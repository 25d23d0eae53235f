// Command load is outboxd's load generator. It drives a built outboxd
// binary from outside, as a user would: it starts it as a child process on
// a fresh database, records events with outbox.record in its producers'
// own transactions, registers webhook endpoints and replays through the
// HTTP API, receives and verifies the signed webhooks on loopback, and
// reads /metrics and counts of the outbox tables. It imports nothing of
// outboxd: the few types and helpers it needs (the endpoint JSON, the
// signature check) are copied here.
//
//	go build -o /tmp/outboxd .            # at the repository root
//	cd bench/load && go run . -outboxd /tmp/outboxd -mode drain -events 20000
//
// main.go runs one mode; config.go reads the flags; database.go prepares
// the run's database; outboxd.go starts the child and api.go talks to it;
// receiver.go and signature.go take its webhooks; produce.go commits the
// events; cpu.go and figures.go measure; the rest is one mode a file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

// run reads the flags, prepares the run's database and runs the mode.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	db, dsn, drop, err := openRunDatabase(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer drop()
	defer db.Close()
	r := loadRun{db: db, dsn: dsn, stdout: stdout, stderr: stderr,
		logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	return modeRunners[cfg.Mode](ctx, cfg, r)
}

// modeRunners run each of modes.
var modeRunners = map[string]func(context.Context, config, loadRun) error{
	"drain":     runDrain,
	"keepup":    runKeepUp,
	"isolation": runIsolation,
	"flaky":     runFlaky,
	"dead":      runDead,
	"ratelimit": runRateLimit,
	"stuck":     runStuck,
	"replay":    runReplay,
	"ordered":   runOrdered,
	"producers": runProducers,
}
