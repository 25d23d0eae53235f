// migrate.go: the schema applied at start, online. schema.sql runs in one
// short transaction whose lock waits are bounded and retried; then
// schema_indexes.sql builds the queue tables' indexes CONCURRENTLY, outside
// any transaction; one replica at a time does either.

package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

//go:embed schema.sql
var schemaSQL string

//go:embed schema_indexes.sql
var schemaIndexesSQL string

// schemaLockKey is the session advisory lock that lets one replica at a
// time migrate: CREATE ... IF NOT EXISTS is not safe against a concurrent
// CREATE of the same object, and two concurrent builds of one index would
// each do the whole work. Releases before this one took it as a
// transaction-scoped lock; the two kinds share one key space, so a replica
// of either release waits for one of the other.
const schemaLockKey = 0x6f7574626f78 // "outbox"

const (
	// migrateLockWait bounds what one try of schema.sql's transaction
	// waits for locks, all its statements together (the LOCK TABLE of
	// every outbox table it begins with, then the file's): each runs with
	// a lock_timeout of what is left of it (at least 1 ms). A statement
	// waiting for a hot table's lock queues every producer of that table
	// behind it, and once it holds the lock they wait for the commit: so a
	// producer waits about this long at most, plus the few milliseconds
	// the rest of the transaction takes, well inside the 1 s a rolling
	// upgrade allows a producer (TestMigrationUnderWriteLoadStallsProducersBriefly).
	migrateLockWait = 500 * time.Millisecond
	// migrateIndexLockWait is the lock_timeout of each concurrent index
	// statement. Those locks queue no producer (they conflict with other
	// DDL and vacuum, not with writes), but a build also waits for every
	// transaction older than it to end, and a session left idle in a
	// transaction would make it wait for ever: this turns that into a
	// retry, then an error naming the index, rather than a start that
	// hangs without a word.
	migrateIndexLockWait = time.Minute
	// migrateAttempts bounds the tries of schema.sql's transaction, and of
	// each index statement, that ran out of lock time or were chosen as a
	// deadlock's victim (a replica starting with a new schema.sql while
	// others serve traffic meets a transaction that locks the tables in
	// another order than it does: schemaTablesQuery). With the pauses
	// below, a lock held for half a minute by someone else is waited out;
	// one held longer is an error that names the statement, for an
	// operator to look into.
	migrateAttempts = 10
	// migrateBackoff is the first pause between tries; it doubles up to
	// migrateBackoffMax: 0.25, 0.5, 1, 2, 4, 5, 5, 5, 5 s, 27.75 s in all.
	migrateBackoff    = 250 * time.Millisecond
	migrateBackoffMax = 5 * time.Second
	// migrateUnlockTimeout bounds the unlock at the end, which runs even
	// when the migration's context has ended.
	migrateUnlockTimeout = 5 * time.Second
	// migrateLockPoll is how often a replica waiting for another's
	// migration tries the advisory lock again.
	migrateLockPoll = 100 * time.Millisecond
)

// migration is one application of the schema: the two files and the
// bounds it runs under. Tests shorten the bounds, and a rolling-upgrade
// test appends statements to either file as the next release would.
type migration struct {
	schema  string // applied in one transaction (schema.sql)
	indexes string // applied one statement at a time, CONCURRENTLY (schema_indexes.sql)

	lockWait      time.Duration // migrateLockWait
	indexLockWait time.Duration // migrateIndexLockWait
	attempts      int           // migrateAttempts
	backoff       time.Duration // migrateBackoff, doubling to migrateBackoffMax
	backoffMax    time.Duration
	logger        *slog.Logger
}

// newMigration is this binary's schema, with the bounds above.
func newMigration(logger *slog.Logger) migration {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return migration{
		schema:        schemaSQL,
		indexes:       schemaIndexesSQL,
		lockWait:      migrateLockWait,
		indexLockWait: migrateIndexLockWait,
		attempts:      migrateAttempts,
		backoff:       migrateBackoff,
		backoffMax:    migrateBackoffMax,
		logger:        logger,
	}
}

// migrate applies this binary's schema, saying nothing; the server's
// start logs through migrateLogged.
func migrate(ctx context.Context, db *sql.DB) error {
	return newMigration(nil).run(ctx, db)
}

// migrateLogged applies this binary's schema, logging what an operator
// should see: a wait for another replica, a retry after a lock timeout,
// every index built.
func migrateLogged(ctx context.Context, db *sql.DB, logger *slog.Logger) error {
	return newMigration(logger).run(ctx, db)
}

// errMigrateThroughPooler is why a replica behind a pooler in transaction
// mode (-pool-mode transaction) does not migrate: the migration's lock is
// a session's, which such a pooler hands to another client between
// transactions, and its index builds run outside any transaction.
var errMigrateThroughPooler = errors.New("the schema of this release is not applied, and a migration cannot run through a pooler in transaction mode " +
	"(it holds a session advisory lock): run `outboxd migrate` once with a -database-url that reaches PostgreSQL directly " +
	"(or through a session-mode pool) and -pool-mode session, then start again")

// requireMigrated is migrate's stand-in behind a pooler in transaction
// mode: it applies nothing and fails unless this binary's schema was
// applied (docs/replicas.md, behind PgBouncer).
func requireMigrated(ctx context.Context, db *sql.DB) error {
	applied, err := schemaApplied(ctx, db, schemaChecksum())
	if err != nil {
		return err
	}
	if !applied {
		return fmt.Errorf("migrate: %w", errMigrateThroughPooler)
	}
	return nil
}

// schemaChecksum identifies this binary's schema files.
func schemaChecksum() string {
	return newMigration(nil).checksum()
}

func (m migration) checksum() string {
	h := sha256.New()
	h.Write([]byte(m.schema))
	h.Write([]byte{0})
	h.Write([]byte(m.indexes))
	return hex.EncodeToString(h.Sum(nil))
}

// run applies the schema unless these exact files were applied before.
// The check matters: schema.sql's ALTER TABLE and CREATE OR REPLACE
// TRIGGER take locks on the hot tables, so a replica restarting under load
// must not run them when there is nothing to change.
//
// The checksum is recorded only once the indexes are built too: a
// migration that stopped half way (a crash, a lock never released) is
// done again, whole, at the next start, and every statement of both files
// is idempotent.
func (m migration) run(ctx context.Context, db *sql.DB) (err error) {
	checksum := m.checksum()
	if applied, err := schemaApplied(ctx, db, checksum); err == nil && applied {
		return nil
	}
	indexes, err := parseIndexStatements(m.indexes)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	// One pinned session holds the advisory lock and runs everything, and
	// is closed at the end, not returned to the pool: neither the lock nor
	// the session settings below can outlive the migration on a connection
	// the pipeline then uses.
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer discardConn(conn)
	if err := m.lock(ctx, conn); err != nil {
		return err
	}
	defer func() {
		if uerr := unlockSchema(ctx, conn); uerr != nil && err == nil {
			err = uerr
		}
	}()
	// Another replica may have applied it while this one waited.
	if applied, err := schemaApplied(ctx, conn, checksum); err != nil {
		return err
	} else if applied {
		return nil
	}

	if err := m.applySchema(ctx, conn); err != nil {
		return err
	}
	if err := m.applyIndexes(ctx, conn, indexes); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO outbox.schema_applied (checksum) VALUES ($1) ON CONFLICT DO NOTHING`, checksum); err != nil {
		return fmt.Errorf("migrate: record checksum: %w", err)
	}
	return nil
}

// lock takes schemaLockKey for conn's session, waiting for whichever
// replica holds it. It polls pg_try_advisory_lock rather than waiting in
// pg_advisory_lock: a session waiting for a lock sits in a statement with
// a snapshot, and CREATE INDEX CONCURRENTLY waits for every older snapshot
// to go, so the holder's index build would wait for the replica that
// waits for it, a deadlock the server ends by cancelling one of them.
func (m migration) lock(ctx context.Context, conn *sql.Conn) error {
	for waiting := false; ; waiting = true {
		var got bool
		if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, schemaLockKey).Scan(&got); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		if got {
			return nil
		}
		if !waiting {
			m.logger.Info("another replica is migrating the schema; waiting for it")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: wait for another replica's migration: %w", ctx.Err())
		case <-time.After(migrateLockPoll):
		}
	}
}

// unlockSchema releases schemaLockKey, even when ctx has ended, and says
// so if the session no longer held it: then another replica may have
// migrated at the same time.
func unlockSchema(ctx context.Context, conn *sql.Conn) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), migrateUnlockTimeout)
	defer cancel()
	var held bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, schemaLockKey).Scan(&held); err != nil {
		return fmt.Errorf("migrate: unlock: %w", err)
	}
	if !held {
		return fmt.Errorf("migrate: unlock: the session had lost its advisory lock")
	}
	return nil
}

// applySchema runs schema.sql in one transaction that first locks every
// table of schema outbox, tried again while its lock waits run out (or it
// is a deadlock's victim), at most m.attempts times.
func (m migration) applySchema(ctx context.Context, conn *sql.Conn) error {
	stmts := splitSQL(m.schema)
	return m.retry(ctx, func() (string, error) {
		return m.applySchemaOnce(ctx, conn, stmts)
	}, m.lockWait)
}

// schemaTablesQuery lists the tables of schema outbox in the order a
// migration locks them, before its first statement: a statement that
// waits for one table's lock while the transaction holds another can meet
// a pipeline transaction that holds the one and waits for the other, a
// deadlock that costs the try its whole lock wait. Locking every table
// first makes that window the lock phase instead of the whole file, and
// the order is the one the pipeline's transactions lock them in:
//   - a producer locks outbox.events, then reads relay_state in its
//     trigger;
//   - a relay pass locks outbox.events, then its replica's row in
//     outbox.replicas, then endpoints and jobs; a busy relay starts one
//     every few milliseconds, so an order with events after another of
//     its tables loses nearly every try to it;
//   - a claim and a completer lock outbox.events first, explicitly, then
//     the claim its replica's row, jobs and endpoints, the completer
//     jobs, deliveries, delivery_stats and endpoints (schema.sql,
//     claim_lane_jobs and record_outcomes); so do a replay's batch, a
//     rescue and an in-process subscriber's batch (lockEventsFirst).
//
// So the migration waits for events holding nothing, and a transaction
// that queues behind it holds none of its tables. What still runs against
// the order is rarer, and a try it costs is tried again: a read that
// names another outbox table before events in one statement, as a page
// of the panel can; and a claim of a release before 0.5.0, which locks
// its replica's row before events.
const schemaTablesQuery = `
SELECT c.relname
FROM pg_class AS c
WHERE c.relnamespace = to_regnamespace('outbox')
  AND c.relkind IN ('r', 'p')
ORDER BY array_position(ARRAY['events', 'replicas', 'jobs',
                              'deliveries', 'delivery_stats', 'endpoints']::name[], c.relname),
         c.relname = 'relay_state', c.relname`

// scanString reads a row of one text, for queryAll.
func scanString(row rowScanner) (string, error) {
	var s string
	err := row.Scan(&s)
	return s, err
}

// applySchemaOnce is one try of applySchema. It returns the statement that
// failed, for the error and the log.
func (m migration) applySchemaOnce(ctx context.Context, conn *sql.Conn, stmts []sqlStatement) (string, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return "begin schema.sql", err
	}
	defer tx.Rollback()
	began := time.Now()
	tables, err := queryAll(ctx, tx, scanString, schemaTablesQuery)
	if err != nil {
		return "list the tables of schema outbox", err
	}
	for _, table := range tables {
		wait := max(m.lockWait-time.Since(began), time.Millisecond)
		q := fmt.Sprintf("SET LOCAL lock_timeout = %d; LOCK TABLE outbox.%s IN ACCESS EXCLUSIVE MODE", wait.Milliseconds(), pq.QuoteIdentifier(table))
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return "schema.sql: lock table outbox." + table, err
		}
	}
	for _, s := range stmts {
		wait := max(m.lockWait-time.Since(began), time.Millisecond)
		// One round trip: the simple query protocol (no parameters) runs
		// both; the setting ends with the transaction.
		q := fmt.Sprintf("SET LOCAL lock_timeout = %d; %s", wait.Milliseconds(), s.text)
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return s.label("schema.sql"), err
		}
	}
	if err := tx.Commit(); err != nil {
		return "commit schema.sql", err
	}
	return "", nil
}

// applyIndexes runs schema_indexes.sql's statements one by one, each in a
// transaction of its own, as CONCURRENTLY requires.
func (m migration) applyIndexes(ctx context.Context, conn *sql.Conn, indexes []indexStatement) error {
	// Session settings, gone with the session (run closes it). No
	// statement_timeout: a build takes as long as the table needs, and
	// blocks no writer meanwhile; a timeout would cancel it at the same
	// point on every start.
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET lock_timeout = %d", m.indexLockWait.Milliseconds())); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := conn.ExecContext(ctx, `SET statement_timeout = 0`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, ix := range indexes {
		err := m.retry(ctx, func() (string, error) {
			return ix.label, m.applyIndex(ctx, conn, ix)
		}, m.indexLockWait)
		if err != nil {
			return err
		}
	}
	return nil
}

// indexValidityQuery is what the catalog says of an index: no row if it is
// absent, else whether it is valid (not left by a concurrent build or drop
// that did not finish).
const indexValidityQuery = `
SELECT i.indisvalid
FROM pg_index AS i
WHERE i.indexrelid = to_regclass('outbox.' || $1)`

// applyIndex runs one statement of schema_indexes.sql, sending nothing
// when the catalog says it is done: a valid index of that name exists (a
// CREATE), or none does (a DROP). An index of that name that is invalid is
// what a concurrent build leaves when it does not finish, unusable by any
// query but still updated by every write; it is dropped and built again.
func (m migration) applyIndex(ctx context.Context, conn *sql.Conn, ix indexStatement) error {
	var valid bool
	err := conn.QueryRowContext(ctx, indexValidityQuery, ix.name).Scan(&valid)
	exists := err == nil
	if err != nil && err != sql.ErrNoRows {
		return err
	}
	if ix.drop && !exists || !ix.drop && valid {
		return nil
	}
	if !ix.drop && exists {
		m.logger.Warn("index left invalid by a build that did not finish; building it again", "index", ix.name)
		if _, err := conn.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS outbox.`+ix.name); err != nil {
			return err
		}
	}
	began := time.Now()
	if _, err := conn.ExecContext(ctx, ix.text); err != nil {
		return err
	}
	if ix.drop {
		m.logger.Info("index dropped concurrently", "index", ix.name, "took", time.Since(began).Round(time.Millisecond))
	} else {
		m.logger.Info("index built concurrently", "index", ix.name, "took", time.Since(began).Round(time.Millisecond))
	}
	return nil
}

// retry runs try until it succeeds, fails for a reason other than a lock
// (lock_timeout, deadlock, serialization), or has run m.attempts times,
// pausing between tries. try returns the statement it was at, which the
// log and the error name.
func (m migration) retry(ctx context.Context, try func() (string, error), lockWait time.Duration) error {
	for attempt := 1; ; attempt++ {
		stmt, err := try()
		if err == nil {
			return nil
		}
		if pq.As(err, pqerror.LockNotAvailable, pqerror.TRDeadlockDetected, pqerror.TRSerializationFailure) == nil {
			return fmt.Errorf("migrate: %s: %w", stmt, err)
		}
		if attempt == m.attempts {
			return fmt.Errorf("migrate: %s: gave up after %d attempts, each waiting at most %s for locks; look in pg_locks and pg_stat_activity for the session holding the lock: %w",
				stmt, attempt, lockWait, err)
		}
		pause := m.pauseAfter(attempt)
		m.logger.Warn("migration waited too long for a lock; trying again",
			"statement", stmt, "attempt", attempt, "of", m.attempts, "in", pause, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: %s: %w", stmt, err)
		case <-time.After(pause):
		}
	}
}

// pauseAfter is retry's pause after its try number attempt (from 1):
// m.backoff, doubling each time, never more than m.backoffMax.
func (m migration) pauseAfter(attempt int) time.Duration {
	pause := m.backoff
	for range attempt - 1 {
		if pause >= m.backoffMax {
			break
		}
		pause *= 2
	}
	return min(pause, m.backoffMax)
}

// schemaApplied reports whether the schema with this checksum was applied.
func schemaApplied(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, checksum string) (bool, error) {
	var exists bool
	if err := q.QueryRowContext(ctx, `SELECT to_regclass('outbox.schema_applied') IS NOT NULL`).Scan(&exists); err != nil {
		return false, fmt.Errorf("migrate: %w", err)
	}
	if !exists {
		return false, nil
	}
	var applied bool
	err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM outbox.schema_applied WHERE checksum = $1)`, checksum).Scan(&applied)
	if err != nil {
		return false, fmt.Errorf("migrate: %w", err)
	}
	return applied, nil
}

// sqlStatement is one statement of a schema file, without its semicolon,
// and the line it starts on.
type sqlStatement struct {
	line int
	text string
}

// label names s in errors and logs: file and line, and its start.
func (s sqlStatement) label(file string) string {
	return fmt.Sprintf("%s:%d %s", file, s.line, truncate(strings.Join(strings.Fields(s.text), " "), 80))
}

// dollarQuoteTag matches the opening of a dollar-quoted string, $$ or $tag$.
var dollarQuoteTag = regexp.MustCompile(`^\$[A-Za-z_][A-Za-z_0-9]*\$|^\$\$`)

// splitSQL cuts a schema file into its statements at the semicolons that
// end them: not those in comments, quoted strings and identifiers, or
// dollar-quoted bodies. Comments between statements are dropped. It reads
// what outboxd's own files hold, not every SQL PostgreSQL accepts (no
// E'...' escapes); TestSplitSQL says what it handles.
func splitSQL(src string) []sqlStatement {
	var stmts []sqlStatement
	start := -1 // where the current statement began; -1 between statements
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case strings.HasPrefix(src[i:], "--"):
			i = skipPast(src, i, "\n", 0)
		case strings.HasPrefix(src[i:], "/*"):
			i = skipPast(src, i+2, "*/", len("*/"))
		case c == ';':
			if start >= 0 {
				stmts = append(stmts, sqlStatement{
					line: strings.Count(src[:start], "\n") + 1,
					text: strings.TrimSpace(src[start:i]),
				})
			}
			start = -1
			i++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		default:
			if start < 0 {
				start = i
			}
			i = skipToken(src, i)
		}
	}
	if start >= 0 {
		stmts = append(stmts, sqlStatement{
			line: strings.Count(src[:start], "\n") + 1,
			text: strings.TrimSpace(src[start:]),
		})
	}
	return stmts
}

// skipPast is the index in src past the first end at or after i (keep of
// its bytes kept before it), or len(src) if there is none.
func skipPast(src string, i int, end string, keep int) int {
	j := strings.Index(src[i:], end)
	if j < 0 {
		return len(src)
	}
	return i + j + keep
}

// skipToken is the index past the token of a statement that starts at
// i: a quoted string or identifier (a doubled quote is one quote
// character inside), a dollar-quoted body, or one byte.
func skipToken(src string, i int) int {
	c := src[i]
	if c == '\'' || c == '"' {
		j := i + 1
		for j < len(src) {
			if src[j] == c {
				if j+1 < len(src) && src[j+1] == c {
					j += 2
					continue
				}
				break
			}
			j++
		}
		return j + 1
	}
	if c == '$' {
		if tag := dollarQuoteTag.FindString(src[i:min(i+64, len(src))]); tag != "" {
			return skipPast(src, i+len(tag), tag, len(tag))
		}
	}
	return i + 1
}

// indexStatement is one statement of schema_indexes.sql.
type indexStatement struct {
	name  string // the index, in schema outbox
	drop  bool   // DROP INDEX; otherwise CREATE INDEX
	text  string
	label string
}

// The two forms schema_indexes.sql may hold.
var (
	createIndexConcurrently = regexp.MustCompile(`^CREATE (?:UNIQUE )?INDEX CONCURRENTLY IF NOT EXISTS ([a-z_][a-z0-9_]*)\s+ON outbox\.[a-z_]+\s`)
	dropIndexConcurrently   = regexp.MustCompile(`^DROP INDEX CONCURRENTLY IF EXISTS outbox\.([a-z_][a-z0-9_]*)$`)
)

// parseIndexStatements reads schema_indexes.sql, refusing any statement
// that is not one of its two forms: anything else would either fail
// outside a transaction or, worse, run there without the lock_timeout
// and retries that schema.sql's statements get.
func parseIndexStatements(src string) ([]indexStatement, error) {
	var out []indexStatement
	for _, s := range splitSQL(src) {
		ix := indexStatement{text: s.text, label: s.label("schema_indexes.sql")}
		if m := createIndexConcurrently.FindStringSubmatch(s.text); m != nil {
			ix.name = m[1]
		} else if m := dropIndexConcurrently.FindStringSubmatch(s.text); m != nil {
			ix.name, ix.drop = m[1], true
		} else {
			return nil, fmt.Errorf("%s: not CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name ON outbox.table, nor DROP INDEX CONCURRENTLY IF EXISTS outbox.name", ix.label)
		}
		out = append(out, ix)
	}
	return out, nil
}
