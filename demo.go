// demo.go: -demo, a watched sample table and a writer, so the first run
// shows events flowing from a business write to a finished job.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
)

// logSubscriber logs every event it is given; logging twice is harmless, so
// it is idempotent as every subscriber must be.
func logSubscriber(logger *slog.Logger) Subscriber {
	return Subscriber{
		Name: "log",
		Handle: func(ctx context.Context, tx *sql.Tx, ev Event) error {
			logger.Info("event delivered to the log subscriber",
				"event_id", ev.ID, "topic", ev.Topic, "subject", ev.Subject,
				"commit_to_run", time.Since(ev.CreatedAt).Round(time.Millisecond))
			return nil
		},
	}
}

// demoSchemaSQL is the sample business table. Its status column is watched;
// touching only note records nothing, which the demo shows too.
const demoSchemaSQL = `
CREATE SCHEMA IF NOT EXISTS outbox_demo;
CREATE TABLE IF NOT EXISTS outbox_demo.orders (
  id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  status     text        NOT NULL DEFAULT 'new',
  note       text        NOT NULL DEFAULT '',
  updated_at timestamptz NOT NULL DEFAULT now()
);
SELECT outbox.watch('outbox_demo.orders', 'demo.order', ARRAY['status']);`

// demoInterval is the pause between the demo's business writes.
const demoInterval = 2 * time.Second

type demo struct {
	db     *sql.DB
	logger *slog.Logger
}

func newDemo(db *sql.DB, logger *slog.Logger) *demo {
	return &demo{db: db, logger: logger.With("loop", "demo")}
}

// Run creates the sample table and writes to it every demoInterval until
// ctx ends.
func (d *demo) Run(ctx context.Context) error {
	if _, err := d.db.ExecContext(ctx, demoSchemaSQL); err != nil {
		return fmt.Errorf("demo: create sample table: %w", err)
	}
	d.logger.Info("demo: writing to outbox_demo.orders, watched by outbox.watch on its status column")
	tick := time.NewTicker(demoInterval)
	defer tick.Stop()
	for {
		if err := d.writeOnce(ctx); err != nil && ctx.Err() == nil {
			d.logger.Error("demo write failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// writeOnce is one business transaction: a new order, a status change of
// an older one, a note-only edit (no event) and now and then a delete.
func (d *demo) writeOnce(ctx context.Context) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("demo: begin: %w", err)
	}
	defer tx.Rollback()
	statements := []string{
		`INSERT INTO outbox_demo.orders DEFAULT VALUES`,
		`UPDATE outbox_demo.orders SET status = 'paid', updated_at = now()
		 WHERE id = (SELECT min(id) FROM outbox_demo.orders WHERE status = 'new')`,
		`UPDATE outbox_demo.orders SET note = 'touched ' || now()::text, updated_at = now()
		 WHERE id = (SELECT max(id) FROM outbox_demo.orders)`,
	}
	if rand.IntN(4) == 0 {
		statements = append(statements,
			`DELETE FROM outbox_demo.orders WHERE id = (SELECT min(id) FROM outbox_demo.orders WHERE status = 'paid')`)
	}
	for _, s := range statements {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("demo: commit: %w", err)
	}
	return nil
}
