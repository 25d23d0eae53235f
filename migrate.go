// migrate.go: the schema brought to this release at start, online: each
// migration a database lacks runs in one short transaction whose lock
// waits are bounded and retried, then its online statements (indexes
// built CONCURRENTLY, constraints validated) outside any transaction; one
// replica at a time migrates. An empty database gets schema.sql whole.

package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

//go:embed schema.sql
var schemaSQL string

// schemaLockKey is the session advisory lock that lets one replica at a
// time migrate: two replicas applying one file at once would each try to
// create the same objects, and two concurrent builds of one index would
// each do the whole work. Session and transaction advisory locks share one
// key space, so a replica of a release that took it per transaction waits
// too.
const schemaLockKey = 0x6f7574626f78 // "outbox"

const (
	// migrateLockWait bounds what one try of a migration's transaction
	// waits for locks, all its statements together (the LOCK TABLE of
	// every outbox table it begins with, then the file's): each runs with
	// a lock_timeout of what is left of it (at least 1 ms). A statement
	// waiting for a hot table's lock queues every producer of that table
	// behind it, and once it holds the lock they wait for the commit: so a
	// producer waits about this long at most, plus the few milliseconds
	// the rest of the transaction takes, well inside the 1 s a rolling
	// upgrade allows a producer (TestMigrationUnderWriteLoadStallsProducersBriefly).
	migrateLockWait = 500 * time.Millisecond
	// migrateIndexLockWait is the lock_timeout of each online statement.
	// Those locks queue no producer (they conflict with other
	// DDL and vacuum, not with writes), but a build also waits for every
	// transaction older than it to end, and a session left idle in a
	// transaction would make it wait for ever: this turns that into a
	// retry, then an error naming the index, rather than a start that
	// hangs without a word.
	migrateIndexLockWait = time.Minute
	// migrateAttempts bounds the tries of a migration's transaction, and
	// of each online statement, that ran out of lock time or were chosen
	// as a deadlock's victim (a replica migrating while others serve
	// traffic meets a transaction that locks the tables in
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

// migration is how this binary brings a database to its release: the
// schema's two forms and the bounds the work runs under. Tests shorten
// the bounds, and a rolling-upgrade test adds the next release's file.
type migration struct {
	schema string          // schema.sql: a fresh database's, in one transaction
	files  []migrationFile // migrations/: the others', each file in a transaction and its online statements after

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
		files:         embeddedMigrations(),
		lockWait:      migrateLockWait,
		indexLockWait: migrateIndexLockWait,
		attempts:      migrateAttempts,
		backoff:       migrateBackoff,
		backoffMax:    migrateBackoffMax,
		logger:        logger,
	}
}

// migrate brings db to this binary's release, saying nothing; the
// server's start logs through migrateLogged.
func migrate(ctx context.Context, db *sql.DB) error {
	return newMigration(nil).run(ctx, db)
}

// migrateLogged brings db to this binary's release, logging what an
// operator should see: a wait for another replica, each migration
// applied, a retry after a lock timeout, every index built.
func migrateLogged(ctx context.Context, db *sql.DB, logger *slog.Logger) error {
	return newMigration(logger).run(ctx, db)
}

// errMigrateThroughPooler is why a replica behind a pooler in transaction
// mode (-pool-mode transaction) does not migrate: the migration's lock is
// a session's, which such a pooler hands to another client between
// transactions, and its index builds run outside any transaction.
var errMigrateThroughPooler = errors.New("a migration cannot run through a pooler in transaction mode " +
	"(it holds a session advisory lock): run `outboxd migrate` once with a -database-url that reaches PostgreSQL directly " +
	"(or through a session-mode pool) and -pool-mode session, then start again")

// errMigrationsOff is what a replica started with -migrate=false says
// when the database is not at its release.
var errMigrationsOff = errors.New("migrations are off (-migrate=false): run `outboxd migrate`, " +
	"or apply the SQL `outboxd migrate -print-sql` prints with your own tools, then start again")

// requireMigrated is migrate's stand-in where this replica applies
// nothing (behind a pooler in transaction mode, or -migrate=false): it
// fails, naming what is missing and why, unless db is at this release.
func requireMigrated(ctx context.Context, db *sql.DB, why error) error {
	m := newMigration(nil)
	state, err := readSchemaState(ctx, db)
	if err != nil {
		return err
	}
	if state.fresh {
		return fmt.Errorf("migrate: the database has no outboxd schema, and %w", why)
	}
	steps, err := state.plan(m.files)
	if err != nil {
		return err
	}
	if len(steps) > 0 {
		return fmt.Errorf("migrate: the database lacks %s of release %s, and %w", describeSteps(steps), version, why)
	}
	return nil
}

// run brings db to m's release: schema.sql into a fresh database, or the
// migrations it lacks, in order. A database that has them all is left
// alone without a lock: a replica restarting under load takes none on the
// hot tables.
func (m migration) run(ctx context.Context, db *sql.DB) (err error) {
	if state, err := readSchemaState(ctx, db); err != nil {
		return err
	} else if !state.fresh {
		if steps, err := state.plan(m.files); err != nil || len(steps) == 0 {
			return err
		}
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
	// Another replica may have migrated while this one waited.
	state, err := readSchemaState(ctx, conn)
	if err != nil {
		return err
	}
	if state.fresh {
		m.logger.Info("installing the schema", "release", m.files[len(m.files)-1].release)
		w := m.install()
		return m.retry(ctx, func() (string, error) { return m.applyInTx(ctx, conn, w.file, w.inTx, w.record) }, m.lockWait)
	}
	steps, err := state.plan(m.files)
	if err != nil {
		return err
	}
	for _, st := range steps {
		if err := m.applyStep(ctx, conn, st); err != nil {
			return err
		}
	}
	return nil
}

// applyStep applies one migration file: its transaction (unless it
// committed before), then its online statements, then records it
// finished. A file stopped between the two (a crash, a lock never
// released) has its online statements run at the next start; each skips
// what the catalog says is done.
func (m migration) applyStep(ctx context.Context, conn *sql.Conn, st migrationStep) error {
	w, err := m.work(st)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if w.inTx != nil {
		m.logger.Info("applying a migration", "migration", st.file.name)
		err := m.retry(ctx, func() (string, error) { return m.applyInTx(ctx, conn, w.file, w.inTx, w.record) }, m.lockWait)
		if err != nil {
			return err
		}
	}
	if len(w.online) == 0 {
		return nil
	}
	if err := m.applyOnline(ctx, conn, w.online); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, w.finish); err != nil {
		return fmt.Errorf("migrate: record %s finished: %w", w.file, err)
	}
	return nil
}

// stepWork is what one step asks of a database, in order: its
// transaction, the file's statements and then record; then its online
// statements, one at a time, and then finish. run applies it, and
// printSQL prints it.
type stepWork struct {
	file   string         // as errors, logs and the printed SQL name it
	inTx   []sqlStatement // nil: its transaction committed before
	record string
	online []onlineStatement
	finish string // "" without online statements
}

// work is st's work: its recording statements mark the file finished in
// its transaction when it has no online statement, else after them.
func (m migration) work(st migrationStep) (stepWork, error) {
	inTx, online, err := st.file.statements()
	if err != nil {
		return stepWork{}, err
	}
	applied := m.files[:st.file.version]
	w := stepWork{file: "migrations/" + st.file.name, online: online}
	if !st.onlineOnly {
		w.inTx, w.record = inTx, recordSQL(applied, len(online) == 0)
	}
	if len(online) > 0 {
		w.finish = recordSQL(applied, true)
	}
	return w, nil
}

// install is the work of a fresh database: schema.sql, and every file
// recorded finished.
func (m migration) install() stepWork {
	return stepWork{file: "schema.sql", inTx: splitSQL(m.schema), record: recordSQL(m.files, true)}
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
// of the panel can.
const schemaTablesQuery = `
SELECT c.relname
FROM pg_class AS c
WHERE c.relnamespace = to_regnamespace('outbox')
  AND c.relkind IN ('r', 'p')
ORDER BY array_position(ARRAY['events', 'replicas', 'jobs',
                              'deliveries', 'delivery_stats', 'endpoints']::name[], c.relname),
         c.relname = 'relay_state', c.relname`

// applyInTx is one try of a migration's transaction, or of schema.sql's:
// it locks every table of schema outbox, runs stmts and then record, and
// commits. Its lock waits together are bounded by m.lockWait. It returns
// the statement that failed, for the error and the log.
func (m migration) applyInTx(ctx context.Context, conn *sql.Conn, file string, stmts []sqlStatement, record string) (string, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return "begin " + file, err
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
			return file + ": lock table outbox." + table, err
		}
	}
	for _, s := range append(stmts, sqlStatement{text: record}) {
		wait := max(m.lockWait-time.Since(began), time.Millisecond)
		// One round trip: the simple query protocol (no parameters) runs
		// both; the setting ends with the transaction.
		q := fmt.Sprintf("SET LOCAL lock_timeout = %d; %s", wait.Milliseconds(), s.text)
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return s.label(file), err
		}
	}
	if err := tx.Commit(); err != nil {
		return "commit " + file, err
	}
	return "", nil
}

// applyOnline runs a migration's online statements one by one, each in a
// transaction of its own, as CONCURRENTLY requires.
func (m migration) applyOnline(ctx context.Context, conn *sql.Conn, online []onlineStatement) error {
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
	for _, o := range online {
		err := m.retry(ctx, func() (string, error) {
			return o.label, m.applyOnlineOnce(ctx, conn, o)
		}, m.indexLockWait)
		if err != nil {
			return err
		}
	}
	return nil
}

// onlineStateQuery is what the catalog says of an online statement's
// object: no row if it is absent, else whether it is valid (an index not
// left by a concurrent build or drop that did not finish; a constraint
// validated).
const onlineStateQuery = `
SELECT i.indisvalid
FROM pg_index AS i
WHERE $1 <> 'constraint' AND i.indexrelid = to_regclass('outbox.' || $2)
UNION ALL
SELECT c.convalidated
FROM pg_constraint AS c
WHERE $1 = 'constraint' AND c.conrelid = to_regclass('outbox.' || $3) AND c.conname = $2`

// applyOnlineOnce runs one online statement, sending nothing when the
// catalog says it is done: a valid index of that name exists (a build),
// none does (a drop), the constraint is validated. An index of that name
// that is invalid is what a concurrent build leaves when it does not
// finish, unusable by any query but still updated by every write; it is
// dropped and built again.
func (m migration) applyOnlineOnce(ctx context.Context, conn *sql.Conn, o onlineStatement) error {
	object := "index"
	if o.kind == validateConstraint {
		object = "constraint"
	}
	var valid bool
	err := conn.QueryRowContext(ctx, onlineStateQuery, object, o.name, o.table).Scan(&valid)
	exists := err == nil
	if err != nil && err != sql.ErrNoRows {
		return err
	}
	switch {
	case o.kind == dropIndex && !exists, o.kind != dropIndex && valid:
		return nil
	case o.kind == validateConstraint && !exists:
		return fmt.Errorf("no constraint %s on outbox.%s to validate", o.name, o.table)
	case o.kind == buildIndex && exists:
		m.logger.Warn("index left invalid by a build that did not finish; building it again", "index", o.name)
		if _, err := conn.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS outbox.`+o.name); err != nil {
			return err
		}
	}
	began := time.Now()
	if _, err := conn.ExecContext(ctx, o.text); err != nil {
		return err
	}
	took := time.Since(began).Round(time.Millisecond)
	switch o.kind {
	case buildIndex:
		m.logger.Info("index built concurrently", "index", o.name, "took", took)
	case dropIndex:
		m.logger.Info("index dropped concurrently", "index", o.name, "took", took)
	case validateConstraint:
		m.logger.Info("constraint validated", "constraint", o.name, "table", "outbox."+o.table, "took", took)
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

// schemaChecksum identifies this binary's schema, both forms: what a
// replica records of itself (outbox.replicas.schema_version), so that two
// builds of one release with different schemas can be told apart.
func schemaChecksum() string {
	return newMigration(nil).checksum()
}

func (m migration) checksum() string {
	h := sha256.New()
	h.Write([]byte(m.schema))
	for _, f := range m.files {
		h.Write([]byte{0})
		h.Write([]byte(f.checksum))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// printMigrationSQL writes the SQL that brings a database of release
// from ("none": an empty one) to m's release.
func printMigrationSQL(w io.Writer, m migration, from string) error {
	if from == "none" {
		return m.printSQL(w, "an empty database", true, nil)
	}
	steps, err := migrationsAfter(m.files, from)
	if err != nil {
		return err
	}
	return m.printSQL(w, "a database of release "+from, false, steps)
}

// printDatabaseMigrationSQL writes the SQL that brings db to this
// binary's release, reading what it has and changing nothing.
func printDatabaseMigrationSQL(ctx context.Context, w io.Writer, db *sql.DB) error {
	m := newMigration(nil)
	state, err := readSchemaState(ctx, db)
	if err != nil {
		return err
	}
	steps, err := state.plan(m.files)
	if err != nil {
		return err
	}
	return m.printSQL(w, "this database", state.fresh, steps)
}

// printSQL writes what run would apply to a database that is fresh or
// lacks steps, in the order it would: each transaction between BEGIN and
// COMMIT, and each online statement on its own after it. The statements
// that record each migration are part of it.
func (m migration) printSQL(w io.Writer, what string, fresh bool, steps []migrationStep) error {
	release := m.files[len(m.files)-1].release
	var b strings.Builder
	fmt.Fprintf(&b, "-- The SQL that brings %s to outboxd release %s, as `outboxd migrate` applies it.\n", what, release)
	b.WriteString("-- Run each BEGIN ... COMMIT as one transaction, with a short lock_timeout and a retry\n" +
		"-- if the database is in use; run the statements after a COMMIT one at a time, outside\n" +
		"-- any transaction (CREATE INDEX CONCURRENTLY refuses to run in one).\n")
	var work []stepWork
	if fresh {
		work = append(work, m.install())
	}
	if !fresh && len(steps) == 0 {
		fmt.Fprintf(&b, "\n-- Nothing: it is at release %s.\n", release)
	}
	for _, st := range steps {
		w, err := m.work(st)
		if err != nil {
			return err
		}
		work = append(work, w)
	}
	for _, w := range work {
		if w.inTx != nil {
			fmt.Fprintf(&b, "\n-- %s\nBEGIN;\n\n", w.file)
			for _, s := range w.inTx {
				b.WriteString(s.text + ";\n\n")
			}
			b.WriteString(w.record + ";\n\nCOMMIT;\n")
		}
		if len(w.online) > 0 {
			fmt.Fprintf(&b, "\n-- %s, outside any transaction\n", w.file)
			for _, o := range w.online {
				b.WriteString(o.text + ";\n")
			}
			b.WriteString(w.finish + ";\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
