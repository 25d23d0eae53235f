// demo.go: -demo, a watched sample table and a writer, so the first run
// shows events flowing from a business write to a finished job.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"sync/atomic"
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

// demoEndpointDescription finds the demo's endpoint again on the next run.
const demoEndpointDescription = "outboxd -demo receiver"

// demo writes business rows and receives their webhooks itself, on
// /demo/hook of outboxd's own listener, so a first run shows every hop.
type demo struct {
	db      *sql.DB
	box     *secretBox     // seals the endpoint's secret, as the API would
	addr    netip.AddrPort // outboxd's listener, where the receiver is
	hookURL string
	logger  *slog.Logger
	secret  atomic.Pointer[webhookSecret]
	// endpointID is the demo's endpoint, once ensureEndpoint has it: the
	// one endpoint the guard's exemption is for (exemption).
	endpointID atomic.Int64
	// failEvery makes the receiver answer 503 to one request in so many,
	// so the retries and the failing state show too.
	failEvery int64
	requests  atomic.Int64
}

// newDemo is the demo for outboxd listening on addr.
func newDemo(db *sql.DB, box *secretBox, addr netip.AddrPort, logger *slog.Logger) *demo {
	return &demo{db: db, box: box, addr: addr, hookURL: "http://" + addr.String() + "/demo/hook",
		failEvery: 25, logger: logger.With("loop", "demo")}
}

// exemption lets the demo's endpoint, and it alone, reach its receiver on
// outboxd's listener, with the address guard kept for every other
// endpoint: a client of its own that reaches that one address, used for
// that endpoint's id at that exact URL (webhook.go, guardExemption).
func (d *demo) exemption(timeout time.Duration) *guardExemption {
	return &guardExemption{
		endpointID: d.endpointID.Load,
		url:        d.hookURL,
		client:     newSafeHTTPClient(safeHTTPOptions{Timeout: timeout, Concurrency: 1, AllowAddrs: []netip.AddrPort{d.addr}}),
	}
}

// setup creates the sample table and the demo's endpoint, at start,
// before outboxd says it is ready: what it logs comes before the ready
// line, not under it.
func (d *demo) setup(ctx context.Context) error {
	if _, err := d.db.ExecContext(ctx, demoSchemaSQL); err != nil {
		return fmt.Errorf("demo: create sample table: %w", err)
	}
	if err := d.ensureEndpoint(ctx); err != nil {
		return err
	}
	d.logger.Info("demo: writing to outbox_demo.orders, watched by outbox.watch on its status column",
		"webhooks_to", d.hookURL)
	return nil
}

// Run writes to the sample table, which setup created, every
// demoInterval until ctx ends.
func (d *demo) Run(ctx context.Context) error {
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

// ensureEndpoint subscribes the demo receiver to demo.* events: the same
// endpoint as last run if there is one (with a fresh secret and this run's
// address), so its history stays.
func (d *demo) ensureEndpoint(ctx context.Context) error {
	var id int64
	err := d.db.QueryRowContext(ctx, `SELECT id FROM outbox.endpoints WHERE description = $1 ORDER BY id LIMIT 1`,
		demoEndpointDescription).Scan(&id)
	// The demo's receiver verifies v1: an endpoint left switched to v1a
	// switches back.
	scheme := webhookSignatureVersion
	secret := newEndpointSecret(scheme)
	url, topics, desc := d.hookURL, []string{"demo.*"}, demoEndpointDescription
	in := endpointInput{URL: &url, Topics: &topics, Description: &desc, Signature: &scheme}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		var e Endpoint
		e, err = createEndpoint(ctx, d.db, d.box, in, secret)
		id = e.ID
	case err == nil:
		if _, err = updateEndpoint(ctx, d.db, d.box, id, in, 0); err == nil {
			_, secret, err = rotateEndpointSecret(ctx, d.db, d.box, id, 0)
		}
		if err == nil {
			_, err = enableEndpoint(ctx, d.db, id)
		}
	}
	if err != nil {
		return fmt.Errorf("demo: endpoint: %w", err)
	}
	d.secret.Store(&secret)
	d.endpointID.Store(id)
	return nil
}

// receiver is the demo's webhook receiver: it verifies the signature as any
// receiver should, and now and then fails on purpose.
func (d *demo) receiver() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		secret := d.secret.Load()
		if err != nil || secret == nil || verifyWebhook([][]byte{*secret}, r.Header, body, time.Now()) != nil {
			http.Error(w, "signature does not verify", http.StatusUnauthorized)
			return
		}
		if d.requests.Add(1)%d.failEvery == 0 {
			d.logger.Info("demo receiver: failing this one on purpose; outboxd will retry it",
				"webhook_id", r.Header.Get("webhook-id"))
			http.Error(w, "failing on purpose", http.StatusServiceUnavailable)
			return
		}
		d.logger.Info("demo receiver: webhook verified", "webhook_id", r.Header.Get("webhook-id"))
		w.WriteHeader(http.StatusNoContent)
	})
}
