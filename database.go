// database.go: the database every stage shares: the pool, the server
// settings outboxd depends on, and the small helpers every stage uses to
// talk to it. The schema is applied at start by migrate.go.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// dsnPassword finds the password in a connection string of either form:
// a URL's user info (postgres://user:password@host, the scheme optional,
// since a mistyped one is what gets quoted in errors) or a keyword's value
// (password=secret or password='a secret').
var dsnPassword = regexp.MustCompile(`(?:^|//)[^/@:\s]*:([^@\s/][^@\s]*)@|password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)`)

// redactDSN removes from text every password that dsn holds, so an error
// or log line that quotes a connection string shows no secret.
func redactDSN(text, dsn string) string {
	for _, m := range dsnPassword.FindAllStringSubmatch(dsn, -1) {
		for _, password := range m[1:] {
			if password != "" {
				text = strings.ReplaceAll(text, password, "xxxxx")
			}
		}
	}
	return text
}

// openDB opens the pool and waits until the database answers, so a wrong
// URL fails at start with the driver's reason rather than on the first pass.
func openDB(ctx context.Context, dsn string, maxConns int) (*sql.DB, error) {
	db, err := newDBPool(dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	// Recycle connections now and then so a server-side setting change or a
	// failover is picked up without a restart.
	db.SetConnMaxLifetime(30 * time.Minute)
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, &connectError{text: "connect to database: " + redactDSN(err.Error(), dsn), err: err}
	}
	return db, nil
}

// connectError is a failed connection. Its text is the driver's with any
// password of the connection string taken out (redactDSN); the driver's
// error stays reachable, for errors.As and pq.As (waitCanFix).
type connectError struct {
	text string
	err  error
}

func (e *connectError) Error() string { return e.text }
func (e *connectError) Unwrap() error { return e.err }

// waitCanFix says whether a failed connection is one that a later try
// may not meet: the server is not there yet (refused, no socket yet, no
// route, a name not yet resolvable, no answer in time, the connection
// closed under the handshake), is starting up or shutting down
// (cannot_connect_now 57P03 and the other shutdowns of class 57, a
// connection exception of class 08), or has no connection slot free
// (53300). Anything else meets every try alike, and is reported at once:
// a login refused (class 28: no such role, a wrong password, pg_hba.conf),
// a database that does not exist (3D000), an option or parameter the
// server refuses, a TLS setting the server or its certificate does not
// meet.
func waitCanFix(err error) bool {
	if e := pq.As(err); e != nil {
		switch {
		case e.Code == pqerror.CannotConnectNow, e.Code == pqerror.AdminShutdown, e.Code == pqerror.CrashShutdown,
			e.Code == pqerror.TooManyConnections, e.Code.Class() == pqerror.ClassConnectionException:
			return true
		}
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded)
}

// connectPauseMax caps the pause between two tries of openDBWaiting: a
// database that comes back is found within seconds, and a log line every
// few seconds says what outboxd waits for.
const connectPauseMax = 5 * time.Second

// openDBWaiting is openDB tried again, with a growing pause, until it
// works or wait has passed: a VM that boots outboxd before its database,
// or a PostgreSQL restarting, should delay the start, not fail it. Each
// failed try is logged; wait 0 tries once. An error that no wait can fix
// (waitCanFix) fails at once: a role that does not exist would otherwise
// hold the start for the whole wait, said to be "not reachable".
func openDBWaiting(ctx context.Context, dsn string, maxConns int, wait time.Duration, logger *slog.Logger) (*sql.DB, error) {
	deadline := time.Now().Add(wait)
	pause := 250 * time.Millisecond
	for try := 1; ; try++ {
		db, err := openDB(ctx, dsn, maxConns)
		switch {
		case err == nil || ctx.Err() != nil:
			return db, err
		case !waitCanFix(err):
			return nil, fmt.Errorf("waiting cannot fix this: %w", err)
		case wait <= 0 || time.Now().Add(pause).After(deadline):
			return nil, err
		}
		logger.Warn("database not reachable; trying again", "try", try, "in", pause, "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, connectPauseMax)
	}
}

// newDBPool opens a pool on dsn whose connections send a statement and its
// parameters in one round trip (lib/pq's binary_parameters), not two: by
// default lib/pq first prepares every statement that has parameters, waits
// for the answer, then binds and executes it. Every hot statement here has
// parameters, so this halves the round trips of the whole pipeline.
//
// The cost is one rule for callers: a []byte parameter travels in
// PostgreSQL's binary format, which suits bytea and text but not jsonb
// (whose binary form starts with a version byte). JSON goes as a string.
func newDBPool(dsn string) (*sql.DB, error) {
	cfg, err := pq.NewConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	cfg.BinaryParameters = true
	connector, err := pq.NewConnectorConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	return sql.OpenDB(connector), nil
}

// beginPipelineTx begins a transaction of the pipeline's own bookkeeping:
// a relay pass, a subscriber's batch (the claim and the completer are
// single statements that set the same for themselves: outbox.claim_lane_jobs,
// outbox.record_outcomes). Its commit does not wait for the WAL to reach
// the disk (synchronous_commit = off, for this transaction only). A crash
// of the database can lose such commits, those of at most about three
// times wal_writer_delay (600 ms at PostgreSQL's default), but never out
// of order (the WAL is a sequence, and every later durable commit flushes
// it), and what a lost one leaves is a state the pipeline already
// recovers from: events not yet fanned out are fanned out again, jobs not
// yet marked running or finished run again. That costs a repeated
// delivery, which the at-least-once contract and webhook-id (the event
// id) already cover, never an event. Writes that anyone was told are
// durable (outbox.record, every API and panel write) keep the durable
// commit (docs/guarantees.md, the row "the database crashes").
func beginPipelineTx(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx, nil
}

// lockEventsFirst takes outbox.events, in tx, before anything else: a
// transaction that goes on to other outbox tables and to events after
// them does so in the order a migration locks the tables (migrate.go,
// schemaTablesQuery), so that a migration, which waits for events first,
// never waits for what the transaction holds while the transaction waits
// for it. ACCESS SHARE conflicts with nothing but the migration's ACCESS
// EXCLUSIVE. schema.sql's claim_lane_jobs and record_outcomes begin the
// same way.
func lockEventsFirst(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, `LOCK TABLE outbox.events IN ACCESS SHARE MODE`); err != nil {
		return fmt.Errorf("lock outbox.events first: %w", err)
	}
	return nil
}

// serverSettingRisks are the server settings that, when off, break what
// outboxd promises: fsync and synchronous_commit let the database
// acknowledge a commit it has not made durable (an event "recorded" there
// can vanish in a crash, and no relay delivers what the database forgot);
// without autovacuum the queue tables, every row of which is updated and
// deleted, bloat until their claims slow down.
var serverSettingRisks = map[string]string{
	"fsync":              "committed events can be lost in a crash",
	"synchronous_commit": "committed events can be lost in a crash",
	"autovacuum":         "the queue tables bloat and their claims slow down",
}

// checkServerSettings warns at start about each setting of
// serverSettingRisks that is off.
func checkServerSettings(ctx context.Context, db *sql.DB, logger *slog.Logger) {
	for _, setting := range []string{"fsync", "synchronous_commit", "autovacuum"} {
		var value string
		if err := db.QueryRowContext(ctx, "SELECT current_setting($1)", setting).Scan(&value); err != nil {
			logger.Warn("server settings check failed", "setting", setting, "err", err)
			continue
		}
		if value == "off" {
			logger.Warn("database setting is off", "setting", setting, "risk", serverSettingRisks[setting])
		}
	}
}

// isRowFault tells an error caused by the rows being relayed (a constraint,
// a trigger that raised, bad data) from one that says nothing about them (a
// lost connection, a shutdown, a deadlock, a read-only or full database).
// Only a row fault counts towards poisoning: a database outage must never
// poison the backlog.
func isRowFault(err error) bool {
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) {
		return false // network, context, driver: not the row's doing
	}
	switch pqErr.Code.Class() {
	case "08", // connection exception
		"25", // invalid transaction state (read-only transaction)
		"40", // transaction rollback (deadlock, serialization)
		"53", // insufficient resources (disk full, too many connections)
		"54", // program limit exceeded
		"57", // operator intervention (shutdown, cancel, terminate)
		"58", // system error (I/O)
		"XX": // internal error
		return false
	}
	return true
}

// maxErrorLen bounds stored error texts; an error is a diagnosis, and a
// receiver's 1 MB error page is not.
const maxErrorLen = 2000

// truncate cuts s to at most n bytes (plus an ellipsis), dropping a rune
// the cut splits.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// The channels schema.sql's statement triggers notify.
const (
	eventsChannel = "outbox_events"
	jobsChannel   = "outbox_jobs"
)

// notify wakes whoever listens on channel (notify.go): the relays on
// eventsChannel, the workers on jobsChannel. Sent inside a transaction, it
// is delivered at commit, never before the change it announces is visible.
func notify(ctx context.Context, x execer, channel string) error {
	if _, err := x.ExecContext(ctx, `SELECT pg_notify($1, '')`, channel); err != nil {
		return fmt.Errorf("notify %s: %w", channel, err)
	}
	return nil
}

// updateOneAndNotify runs query, an UPDATE that returns the id of the one
// row it changed or no row, and notifies channel in the same transaction.
// It reports whether a row changed.
func updateOneAndNotify(ctx context.Context, db *sql.DB, channel, query string, args ...any) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var id int64
	err = tx.QueryRowContext(ctx, query, args...).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := notify(ctx, tx, channel); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// execer is what both *sql.DB and *sql.Tx offer to a statement that
// returns no rows, so that it runs in the caller's transaction or alone.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// queryer is what both *sql.DB and *sql.Tx offer, so recordEvent can join
// the caller's transaction.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// rowScanner is a *sql.Row or *sql.Rows, so one scan function reads a
// row either way.
type rowScanner interface{ Scan(dest ...any) error }

// queryAll runs query and reads every row it returns with scan. The list
// is never nil, so an empty one encodes as [] in JSON.
func queryAll[T any](ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, scan func(rowScanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	all := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		all = append(all, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return all, nil
}

// scanID reads a row of one bigint, for queryAll.
func scanID(row rowScanner) (int64, error) {
	var id int64
	err := row.Scan(&id)
	return id, err
}

// scanString reads a row of one text, for queryAll.
func scanString(row rowScanner) (string, error) {
	var s string
	err := row.Scan(&s)
	return s, err
}
