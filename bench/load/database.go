// database.go: the run's database, created afresh and migrated by
// `outboxd migrate`, and what the generator reads and writes there as any
// application could: events recorded with outbox.record, counts of
// outbox.events and outbox.jobs, and VACUUM.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os/exec"
	"sync"
	"time"

	_ "github.com/lib/pq"
)

// openRunDatabase prepares the database the run uses: with cfg.Database
// set, a fresh one of that name on cfg.DatabaseURL's server (dropped
// first if it exists; drop removes it at the end), else cfg.DatabaseURL's
// own. outboxd's schema is applied by the binary under test, and the
// pool has room for every producer.
func openRunDatabase(ctx context.Context, cfg config, stderr io.Writer) (db *sql.DB, dsn string, drop func(), err error) {
	dsn, drop = cfg.DatabaseURL, func() {}
	if cfg.Database != "" {
		if dsn, err = withDatabase(cfg.DatabaseURL, cfg.Database); err != nil {
			return nil, "", nil, err
		}
		if err := recreateDatabase(ctx, cfg.DatabaseURL, cfg.Database); err != nil {
			return nil, "", nil, err
		}
		drop = func() {
			if err := dropDatabase(context.WithoutCancel(ctx), cfg.DatabaseURL, cfg.Database); err != nil {
				fmt.Fprintf(stderr, "load: %v\n", err)
			}
		}
	}
	migrate := exec.CommandContext(ctx, cfg.Outboxd, "migrate", "-database-url", dsn, "-log-level", "warn")
	migrate.Stdout, migrate.Stderr = stderr, stderr
	if err := migrate.Run(); err != nil {
		drop()
		return nil, "", nil, fmt.Errorf("outboxd migrate: %w", err)
	}
	db, err = sql.Open("postgres", dsn)
	if err == nil {
		// Every producer's connection stays open between its commits:
		// database/sql keeps 2 idle by default, and paced producers,
		// idle between ticks, would otherwise connect anew for most
		// commits, a backend started each time, and measure that.
		db.SetMaxOpenConns(cfg.Producers + 4)
		db.SetMaxIdleConns(cfg.Producers + 4)
		err = db.PingContext(ctx)
	}
	if err != nil {
		drop()
		return nil, "", nil, fmt.Errorf("open the run's database: %w", err)
	}
	return db, dsn, drop, nil
}

// withDatabase is the URL base with its database replaced by name.
func withDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parse -database-url: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// recreateDatabase drops name on base's server if it exists, then
// creates it. config.validate allows only plain lowercase names, so name
// is safe in the statements' text.
func recreateDatabase(ctx context.Context, base, name string) error {
	if err := dropDatabase(ctx, base, name); err != nil {
		return err
	}
	if err := adminExec(ctx, base, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// dropDatabase drops name, closing the connections still open to it.
func dropDatabase(ctx context.Context, base, name string) error {
	if err := adminExec(ctx, base, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// adminExec runs one statement on base's database, on a pool of its own.
func adminExec(ctx context.Context, base, statement string) error {
	db, err := sql.Open("postgres", base)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, statement)
	return err
}

// recordBulkSQL records events $1 to $2 of topic $3 in one statement.
const recordBulkSQL = `
SELECT outbox.record($3, 'bulk-' || i, '{"load": true}')
FROM generate_series($1::int, $2::int) AS i`

// recordBulk records n events of topic in transactions of 10,000.
func recordBulk(ctx context.Context, db *sql.DB, topic string, n int) error {
	for done := 0; done < n; done += 10_000 {
		if _, err := db.ExecContext(ctx, recordBulkSQL, done, min(done+10_000, n)-1, topic); err != nil {
			return fmt.Errorf("record events: %w", err)
		}
	}
	return nil
}

// backlogSQL counts what is not delivered yet: events the relay has not
// fanned out (poisoned ones aside) and jobs not finished.
const backlogSQL = `
SELECT (SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL)
     + (SELECT count(*) FROM outbox.jobs WHERE state IN ('available', 'running', 'retryable'))`

// backlog is what is not delivered yet: un-fanned events and unfinished jobs.
func backlog(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	if err := db.QueryRowContext(ctx, backlogSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("count the backlog: %w", err)
	}
	return n, nil
}

// awaitNoBacklog waits until no event waits for the relay and no job for
// a worker.
func awaitNoBacklog(ctx context.Context, db *sql.DB) error {
	for {
		n, err := backlog(ctx, db)
		if err != nil || n == 0 {
			return err
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// unfannedSQL counts topic $1's events the relay has not fanned out.
const unfannedSQL = `
SELECT count(*) FROM outbox.events
WHERE topic = $1 AND fanned_out_at IS NULL AND poisoned_at IS NULL`

// awaitFannedOut waits until the relay has fanned out every event of topic.
func awaitFannedOut(ctx context.Context, db *sql.DB, topic string) error {
	for {
		var left int
		if err := db.QueryRowContext(ctx, unfannedSQL, topic).Scan(&left); err != nil {
			return fmt.Errorf("count un-fanned events: %w", err)
		}
		if left == 0 {
			return nil
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// vacuumQueues vacuums the queue tables, so that a phase started after it
// does not claim past the dead rows of the phases before, nor of the
// setup's fan-out, where autovacuum is off or has not come round yet.
func vacuumQueues(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `VACUUM outbox.jobs, outbox.events`); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}

// vacuumEvery vacuums the queue tables every interval (0: never) until
// the returned stop is called, which returns how many times it did: a
// stand-in for autovacuum where it is off.
func vacuumEvery(ctx context.Context, db *sql.DB, every time.Duration, logger *slog.Logger) (stop func() int) {
	if every <= 0 {
		return func() int { return 0 }
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	n := 0
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := vacuumQueues(ctx, db); err != nil {
				if ctx.Err() == nil {
					logger.Warn("periodic vacuum", "err", err)
				}
				continue
			}
			n++
		}
	}()
	var once sync.Once
	return func() int {
		once.Do(func() { cancel(); <-done })
		return n
	}
}

// sleepCtx waits d or until ctx ends.
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
