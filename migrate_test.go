// migrate_test.go: migrations applied online: what a file may hold, the
// bounded and retried lock waits, the rebuild of an invalid index, a
// migration stopped half way finished at the next start, one replica at a
// time, and producers kept writing while an index builds.

package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// The bounds migrate runs under, as migrate.go's comments and
// docs/upgrades.md state them.
func TestMigrationBoundsAreTheDocumentedOnes(t *testing.T) {
	t.Parallel()
	m := newMigration(nil)
	got := []any{m.lockWait, m.indexLockWait, m.attempts, m.backoff, m.backoffMax}
	want := []any{500 * time.Millisecond, time.Minute, 10, 250 * time.Millisecond, 5 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lock wait, index lock wait, attempts, first pause, longest pause (-want +got):\n%s", diff)
	}
	// The pauses between the 10 tries, as retry takes them: 27.75 s in
	// all, so a lock held for about half a minute is waited out.
	var pauses []time.Duration
	var total time.Duration
	for attempt := 1; attempt < 10; attempt++ {
		pauses = append(pauses, m.pauseAfter(attempt))
		total += m.pauseAfter(attempt)
	}
	wantPauses := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		4 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second}
	if diff := cmp.Diff(wantPauses, pauses); diff != "" || total != 27750*time.Millisecond {
		t.Errorf("pauses add up to %s, want 27.75s (-want +got):\n%s", total, diff)
	}
}

// The order the migration locks the tables in (schemaTablesQuery), held
// against the order the pipeline's statements lock them in, measured: each
// statement runs while one table is locked, table by table, and what it
// holds when it waits is what it locked before that table. A statement
// that waits for one table holding others, none of which the migration
// locks before that one, deadlocks a migration that took the table while
// it ran: the migration waits for what the statement holds. None of the
// pipeline's statements may. With events locked last, a relay pass
// waiting for replicas held events; with the claim's replica row locked
// before events, a claim waiting for events held replicas, jobs and
// endpoints; a replay's batch, its own row and the endpoint; a rescue,
// jobs while it waited for replicas.
func TestMigrationLocksTablesInThePipelineOrder(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	order, err := queryAll(ctx, db, scanString, schemaTablesQuery)
	if err != nil {
		t.Fatal(err)
	}
	if len(order) < 8 || !slices.Equal(order[:6], []string{"events", "replicas", "jobs", "deliveries", "delivery_stats", "endpoints"}) ||
		order[len(order)-1] != "relay_state" {
		t.Fatalf("lock order %v: want events, replicas, jobs, deliveries, delivery_stats, endpoints, ..., relay_state", order)
	}

	// A delivery running in an ordered lane, whose completion moves the
	// lane on (advance_lanes reads events), and an event to fan out.
	replica := registeredReplica(t, db, 502).ID()
	insertEndpoint(t, db, "order.lane", 100, `ordering = 'subject'`)
	mustExec(t, db, `SELECT outbox.record('order.lane', 'lane', '{}') FROM generate_series(1, 2)`)
	mustExec(t, db, fanOutSQL, 200, nil, `[]`, 18, 300.0, "", 0)
	running := queryInt(t, db, `SELECT count(*) FROM (`+claimJobsSQL+`) AS c`, 10, replica, "{}", "{}", defaultShare, nil)
	var job jobResult
	if err := db.QueryRow(`SELECT id, attempt FROM outbox.jobs WHERE state = 'running'`).Scan(&job.ID, &job.Attempt); err != nil || running != 1 {
		t.Fatalf("claimed %d deliveries of the ordered lane, want its first (%v)", running, err)
	}
	job.State = jobCompleted
	completion, err := newOutcomeRows([]jobResult{job}).args(5)
	if err != nil {
		t.Fatal(err)
	}
	insertEndpoint(t, db, "order", 100, "")
	mustExec(t, db, `SELECT outbox.record('order', 's', '{}')`)
	// A replay of the ordered lane's endpoint being fed, one batch a call.
	replay := queryInt(t, db, `INSERT INTO outbox.replays (endpoint_id, kind, window_from, window_to, enqueue_after, last_event_id)
		SELECT id, 'replay', now() - interval '1 hour', now() + interval '1 hour', 0, NULL FROM outbox.endpoints WHERE topics = '{order.lane}' RETURNING id`)
	statements := []struct {
		name string
		run  func(tx *sql.Tx) error
	}{
		{"a producer's record", execIn(`SELECT outbox.record('order', 's', '{}')`)},
		{"a relay pass", execIn(fanOutSQL, 200, nil, `[]`, 18, 300.0, "", 0)},
		{"a worker's claim", execIn(claimJobsSQL, 10, replica, "{}", "{}", defaultShare, nil)},
		{"a completer's outcomes", execIn(recordOutcomesSQL, completion...)},
		{"a replay's batch", func(tx *sql.Tx) error { return feedReplayTx(ctx, tx, int64(replay), 18) }},
		{"an erasure", execIn(eraseSubjectSQL, "s", errEventErased.Error())},
		{"a rescue of a dead replica's jobs", func(tx *sql.Tx) error {
			_, err := rescueBatchTx(ctx, tx, rescueOrphanedJobsSQL, rescueBatch)
			return err
		}},
	}
	for _, st := range statements {
		var waitedFor, inversions []string
		for i, table := range order {
			held, waited := tablesHeldWaitingFor(t, db, table, st.run)
			if !waited {
				continue
			}
			waitedFor = append(waitedFor, table)
			// Holding a table the migration locks before this one, the
			// statement waits for another session: the migration would
			// still be waiting for the table it holds.
			if slices.ContainsFunc(held, func(h string) bool { return slices.Index(order, h) < i }) {
				continue
			}
			for _, h := range held {
				inversions = append(inversions, fmt.Sprintf("holds %s waiting for %s", h, table))
			}
		}
		// Each of them locks two tables at least: a probe that saw fewer
		// measured nothing.
		if len(waitedFor) < 2 {
			t.Errorf("%s waited for %v, want two tables at least", st.name, waitedFor)
		}
		if len(inversions) > 0 {
			t.Errorf("%s against the migration's order %v: %s", st.name, order, strings.Join(inversions, "; "))
		}
	}
}

// execIn is a statement to run in a transaction, its rows read and
// dropped.
func execIn(query string, args ...any) func(tx *sql.Tx) error {
	return func(tx *sql.Tx) error {
		rows, err := tx.Query(query, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
		}
		return rows.Close()
	}
}

// tablesHeldWaitingFor calls run in a transaction rolled back after it,
// while another holds an ACCESS EXCLUSIVE lock of outbox.table, and returns
// the tables of schema outbox the transaction held while it waited for
// that lock, and whether it waited for it at all.
func tablesHeldWaitingFor(t *testing.T, db *sql.DB, table string, run func(tx *sql.Tx) error) (held []string, waited bool) {
	t.Helper()
	ctx := context.Background()
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.Exec(`LOCK TABLE outbox.` + pq.QuoteIdentifier(table) + ` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	probe, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Rollback()
	var pid int
	if err := probe.QueryRow(`SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run(probe) }()
	for {
		var waiting bool
		if err := db.QueryRow(`SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE pid = $1 AND NOT granted AND locktype = 'relation' AND relation = ('outbox.' || $2)::regclass)`, pid, table).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("with outbox.%s locked: %v", table, err)
			}
			return nil, false
		case <-time.After(time.Millisecond):
		}
	}
	held = queryStrings(t, db, `SELECT DISTINCT c.relname::text FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
		WHERE l.pid = $1 AND l.granted AND l.locktype = 'relation'
		  AND c.relnamespace = to_regnamespace('outbox') AND c.relkind IN ('r', 'p')`, pid)
	holder.Rollback()
	if err := <-done; err != nil {
		t.Fatalf("once outbox.%s was unlocked: %v", table, err)
	}
	return held, true
}

func TestSplitSQL(t *testing.T) {
	t.Parallel()
	src := "-- a comment; not a statement\n" +
		"CREATE TABLE a (x text DEFAULT 'semi;colon''s');\n" +
		"\n" +
		"/* block; comment */ SELECT \"odd;name\" FROM a;\n" +
		"DO $$ BEGIN PERFORM 1; END $$;\n" +
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$;\n" +
		"SELECT $1::int -- trailing; comment\n" +
		"  + 2;\n" +
		"SELECT 'no semicolon at the end'"
	var got []string
	for _, s := range splitSQL(src) {
		got = append(got, fmt.Sprintf("%d: %s", s.line, s.text))
	}
	want := []string{
		"2: CREATE TABLE a (x text DEFAULT 'semi;colon''s')",
		"4: SELECT \"odd;name\" FROM a",
		"5: DO $$ BEGIN PERFORM 1; END $$",
		"6: CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$",
		"7: SELECT $1::int -- trailing; comment\n  + 2",
		"9: SELECT 'no semicolon at the end'",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statements (-want +got):\n%s", diff)
	}
}

// queueTables are the tables that grow with the traffic: an index built on
// one of them inside a migration's transaction blocks its writers for the
// whole build.
var queueTables = []string{"events", "jobs", "deliveries", "inbox", "subjects"}

// No migration builds or drops an index of a queue table in its
// transaction: each does it online, CONCURRENTLY. A new index written
// into a migration out of habit fails here, named. (The first file is the
// first release's whole schema, into an empty database.)
func TestMigrationsBuildNoQueueTableIndexInTheirTransaction(t *testing.T) {
	t.Parallel()
	onQueueTable := regexp.MustCompile(`(?is)^(CREATE\s+(UNIQUE\s+)?INDEX\b.*\bON\s+(ONLY\s+)?outbox\.(` + strings.Join(queueTables, "|") + `)\b|DROP\s+INDEX\b.*\boutbox\.(` + strings.Join(queueTables, "|") + `)_|REINDEX\b)`)
	var online int
	for _, f := range newMigration(nil).files {
		inTx, on, err := f.statements()
		if err != nil {
			t.Fatal(err)
		}
		online += len(on)
		for _, s := range inTx {
			if f.version > 1 && onQueueTable.MatchString(s.text) {
				t.Errorf("%s: an index of a queue table is built CONCURRENTLY, after the transaction", s.label("migrations/"+f.name))
			}
		}
	}
	// 0.1.0's 19 builds and 5 drops, 0.3.0's 3 builds, 0.6.0's 4
	// validations and 1 build, 0.8.0's 2 validations.
	if online != 41 {
		t.Errorf("%d online statements in the migrations, want 41", online)
	}
}

// A CONCURRENTLY statement of a form the runner cannot tell done, or that
// would fail in a transaction, is refused, named by file and line; other
// statements go in the transaction.
func TestOnlineStatementsRefuseOtherForms(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"CREATE INDEX CONCURRENTLY jobs_x ON outbox.jobs (id)",               // not re-runnable
		"CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_x ON public.jobs (id)", // not outbox's
		"DROP INDEX CONCURRENTLY outbox.jobs_x",                              // not re-runnable
		"REINDEX INDEX CONCURRENTLY outbox.jobs_x",                           // no way to tell it done
	} {
		f := migrationFile{name: "007_0.7.0.sql", text: "-- header\n\n" + bad + ";\n"}
		_, _, err := f.statements()
		if err == nil || !strings.Contains(err.Error(), "migrations/007_0.7.0.sql:3 "+bad[:20]) {
			t.Errorf("%q: error %v, want one naming migrations/007_0.7.0.sql:3 and the statement", bad, err)
		}
	}
	f := migrationFile{name: "007_0.7.0.sql", text: `
CREATE INDEX IF NOT EXISTS endpoints_x ON outbox.endpoints (id);
ALTER TABLE outbox.events VALIDATE CONSTRAINT events_x;
DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_y;
`}
	inTx, online, err := f.statements()
	if err != nil || len(inTx) != 1 || len(online) != 2 || online[0].kind != validateConstraint || online[1].kind != dropIndex {
		t.Errorf("statements: %d in the transaction, %v online, %v; want the index in it, the validation and the drop after", len(inTx), online, err)
	}
}

// shortMigration is this binary's migration with bounds a test can wait
// out, logging into logs.
func shortMigration(logs *syncBuffer, attempts int) migration {
	m := newMigration(slog.New(slog.NewTextHandler(logs, nil)))
	m.lockWait = 100 * time.Millisecond
	m.indexLockWait = 200 * time.Millisecond
	m.attempts = attempts
	m.backoff = 20 * time.Millisecond
	m.backoffMax = 40 * time.Millisecond
	return m
}

// nextRelease is the test's release after this one.
const nextRelease = "0.99.0"

// withNext is m with one more migration, the next release's, holding sql.
func (m migration) withNext(sql string) migration {
	v := len(m.files) + 1
	sum := sha256.Sum256([]byte(sql))
	m.files = append(slices.Clip(m.files), migrationFile{
		version: v, name: fmt.Sprintf("%03d_%s.sql", v, nextRelease), release: nextRelease,
		text: sql, checksum: hex.EncodeToString(sum[:]),
	})
	return m
}

// nextName is the file name withNext gives the next release's migration.
func nextName() string { return fmt.Sprintf("%03d_%s.sql", len(embeddedMigrations())+1, nextRelease) }

// migrationFinished is whether db records migration version, and its
// online statements run: "finished", "unfinished" or "absent".
func migrationFinished(t *testing.T, db *sql.DB, version int) string {
	t.Helper()
	var finished bool
	err := db.QueryRow(`SELECT finished_at IS NOT NULL FROM outbox.migrations WHERE version = $1`, version).Scan(&finished)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "absent"
	case err != nil:
		t.Fatal(err)
	case finished:
		return "finished"
	}
	return "unfinished"
}

// concurrently is an index's definition (pg_get_indexdef) as a migration
// builds it.
func concurrently(def string) string {
	return strings.Replace(def, " INDEX ", " INDEX CONCURRENTLY IF NOT EXISTS ", 1)
}

// holdTableLock begins a transaction that reads table, which holds a lock
// every ALTER TABLE of it waits for, until the returned rollback.
func holdTableLock(t *testing.T, db *sql.DB, table string) (rollback func()) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`SELECT count(*) FROM ` + table); err != nil {
		t.Fatal(err)
	}
	return func() { tx.Rollback() }
}

// A session holding a lock that a migration's statement needs makes the
// migration give up that try after its lock wait and try again, logging
// the statement, and the migration succeeds once the lock is released.
func TestMigrationWaitsOutAHeldLockInTries(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	release := holdTableLock(t, db, "outbox.jobs")
	defer release()

	var logs syncBuffer
	m := shortMigration(&logs, 1000).withNext(`ALTER TABLE outbox.jobs ADD COLUMN IF NOT EXISTS upgrade_note text`)
	done := make(chan error, 1)
	go func() { done <- m.run(ctx, db) }()
	waitFor(t, "a second try", 20*time.Second, func() bool {
		return strings.Contains(logs.String(), "attempt=2 ")
	})
	select {
	case err := <-done:
		t.Fatalf("migration ended while the lock was held: %v", err)
	default:
	}
	if !strings.Contains(logs.String(), "outbox.jobs") {
		t.Errorf("the retry's log does not name the statement on outbox.jobs:\n%s", logs.String())
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("migration after the lock was released: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("migration still running 20 s after the lock was released")
	}
	if got := migrationFinished(t, db, len(m.files)); got != "finished" {
		t.Errorf("the next release's migration is %s in outbox.migrations, want finished", got)
	}
}

// A lock never released: the migration gives up after its attempts,
// with an error that names the statement (here the LOCK TABLE of
// outbox.jobs its transaction begins with; a statement of the file is
// named by its line, as TestIndexBuildWaitingOnAnOldTransactionFailsNamedThenRecovers
// shows for an online one), and keeps the lock timeout's code for a
// caller to test.
func TestMigrationNamesTheStatementWhenALockIsNeverReleased(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	release := holdTableLock(t, db, "outbox.jobs")
	defer release()

	var logs syncBuffer
	began := time.Now()
	m := shortMigration(&logs, 3).withNext(`ALTER TABLE outbox.jobs ADD COLUMN IF NOT EXISTS upgrade_note text`)
	err := m.run(context.Background(), db)
	took := time.Since(began)
	if err == nil {
		t.Fatal("migration succeeded while a lock it needs was held")
	}
	if pq.As(err, pqerror.LockNotAvailable) == nil {
		t.Errorf("error %v is not the lock timeout", err)
	}
	for _, want := range []string{"migrate: migrations/" + nextName() + ": lock table outbox.jobs: gave up after 3 attempts, each waiting at most 100ms for locks"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Three tries: two retries logged, two pauses (20 ms, 40 ms) and at
	// most three lock waits of 100 ms.
	if n := strings.Count(logs.String(), "trying again"); n != 2 {
		t.Errorf("%d retries logged, want 2:\n%s", n, logs.String())
	}
	if took < 60*time.Millisecond || took > 10*time.Second {
		t.Errorf("gave up after %s, want between the pauses' 60ms and 10s", took)
	}
	if got := migrationFinished(t, db, len(m.files)); got != "absent" {
		t.Errorf("a migration that failed is %s in outbox.migrations, want absent", got)
	}
}

// indexState is what pg_index says of outbox.name: "valid", "invalid" or
// "absent"; and its definition.
func indexState(t *testing.T, db *sql.DB, name string) (state, def string) {
	t.Helper()
	var valid bool
	err := db.QueryRow(`SELECT indisvalid, pg_get_indexdef(indexrelid) FROM pg_index WHERE indexrelid = to_regclass('outbox.' || $1)`, name).Scan(&valid, &def)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "absent", ""
	case err != nil:
		t.Fatal(err)
	case valid:
		return "valid", def
	}
	return "invalid", def
}

// An index a concurrent build left INVALID (here: a unique build refused
// by duplicates, as a crash or a cancel would leave it) exists by name, so
// IF NOT EXISTS alone would keep it: unusable by every query, maintained
// by every write. A migration that builds it drops it and builds it as
// written.
func TestMigrationRebuildsAnIndexLeftInvalid(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	_, wantDef := indexState(t, db, "jobs_by_event_id")
	mustExec(t, db, `SELECT outbox.record('t', 's', '{}')`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts)
		SELECT 'test', id, 1 FROM outbox.events CROSS JOIN generate_series(1, 2)`)
	mustExec(t, db, `DROP INDEX outbox.jobs_by_event_id`)
	if _, err := db.Exec(`CREATE UNIQUE INDEX CONCURRENTLY jobs_by_event_id ON outbox.jobs (event_id)`); pq.As(err, pqerror.UniqueViolation) == nil {
		t.Fatalf("the unique build over duplicates: %v, want a unique violation", err)
	}
	if state, _ := indexState(t, db, "jobs_by_event_id"); state != "invalid" {
		t.Fatalf("after the failed build the index is %s, want invalid", state)
	}
	var logs syncBuffer
	if err := shortMigration(&logs, 3).withNext(concurrently(wantDef)).run(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	state, def := indexState(t, db, "jobs_by_event_id")
	if state != "valid" || def != wantDef {
		t.Errorf("after migrating: %s %q, want valid %q", state, def, wantDef)
	}
	if !strings.Contains(logs.String(), `msg="index left invalid by a build that did not finish; building it again" index=jobs_by_event_id`) {
		t.Errorf("the rebuild is not logged:\n%s", logs.String())
	}
}

// A build that cannot finish within its lock wait (it waits for every
// older transaction, and one is left open) is retried, then fails naming
// the index statement, the migration recorded but unfinished; the next
// start, once that transaction has ended, runs its online statements
// again and rebuilds what the build left invalid.
func TestIndexBuildWaitingOnAnOldTransactionFailsNamedThenRecovers(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	_, def := indexState(t, db, "jobs_by_event_id")
	mustExec(t, db, `DROP INDEX outbox.jobs_by_event_id`)
	// An old snapshot on a table the migration never locks: the
	// migration's transaction goes through, the concurrent build waits.
	mustExec(t, db, `CREATE TABLE elsewhere (x int)`)
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`SELECT count(*) FROM elsewhere`); err != nil {
		t.Fatal(err)
	}

	var logs syncBuffer
	m := shortMigration(&logs, 2).withNext("ALTER TABLE outbox.jobs ADD COLUMN IF NOT EXISTS upgrade_note text;\n" + concurrently(def))
	err = m.run(context.Background(), db)
	if err == nil || !regexp.MustCompile(`migrate: migrations/`+regexp.QuoteMeta(nextName())+`:2 CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_by_event_id .*gave up after 2 attempts, each waiting at most 200ms`).MatchString(err.Error()) {
		t.Fatalf("migration with an old transaction open: %v; want the build of jobs_by_event_id named", err)
	}
	if state, _ := indexState(t, db, "jobs_by_event_id"); state != "invalid" {
		t.Fatalf("the interrupted build left the index %s, want invalid (what this test recovers from)", state)
	}
	if got := migrationFinished(t, db, len(m.files)); got != "unfinished" {
		t.Fatalf("the migration whose build failed is %s, want unfinished: its transaction committed", got)
	}
	tx.Rollback()
	logs = syncBuffer{}
	if err := m.run(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "applying a migration") {
		t.Errorf("the next start applied the migration's transaction again:\n%s", logs.String())
	}
	if got := migrationFinished(t, db, len(m.files)); got != "finished" {
		t.Errorf("after the next start the migration is %s, want finished", got)
	}
	if state, _ := indexState(t, db, "jobs_by_event_id"); state != "valid" {
		t.Errorf("after the next migration the index is %s, want valid", state)
	}
}

// Two replicas starting at once with a pending index change: one builds
// it, the other waits for it and then finds nothing to do.
func TestTwoReplicasMigratingAtOnceBuildOnce(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	_, def := indexState(t, db, "jobs_by_event_id")
	mustExec(t, db, `DROP INDEX outbox.jobs_by_event_id`)
	var logs [2]syncBuffer
	var wg sync.WaitGroup
	var errs [2]error
	for i := range 2 {
		wg.Go(func() {
			errs[i] = shortMigration(&logs[i], 10).withNext(concurrently(def)).run(context.Background(), db)
		})
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("migrations: %v, %v", errs[0], errs[1])
	}
	all := logs[0].String() + logs[1].String()
	if n := strings.Count(all, "index built concurrently"); n != 1 {
		t.Errorf("%d builds logged, want 1:\n%s", n, all)
	}
	if state, _ := indexState(t, db, "jobs_by_event_id"); state != "valid" {
		t.Errorf("the index is %s, want valid", state)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		schemaLockKey>>32, schemaLockKey&0xffffffff); n != 0 {
		t.Errorf("%d advisory locks of the schema left after both migrations", n)
	}
}

// stallProbe runs producers, each writing in a loop, and keeps how long
// every write took.
type stallProbe struct {
	stop   atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex // protects writes
	writes []stallWrite
}

type stallWrite struct {
	began time.Time
	took  time.Duration
}

// startStallProbe starts n producers, the i-th calling write(i) until
// stopped.
func startStallProbe(t *testing.T, n int, write func(i int) error) *stallProbe {
	p := &stallProbe{}
	for i := range n {
		p.wg.Go(func() {
			for !p.stop.Load() {
				began := time.Now()
				if err := write(i); err != nil {
					t.Errorf("producer: %v", err)
					return
				}
				p.mu.Lock()
				p.writes = append(p.writes, stallWrite{began, time.Since(began)})
				p.mu.Unlock()
			}
		})
	}
	t.Cleanup(p.stopAndWait)
	return p
}

// stopAndWait lets every producer finish the write it is in, so a write
// held up by a lock is measured once the lock goes, and waits for them.
func (p *stallProbe) stopAndWait() {
	p.stop.Store(true)
	p.wg.Wait()
}

// longestDuring is the longest write, among those that ran at some point
// between from and to, and how many there were. Call it after stopAndWait.
func (p *stallProbe) longestDuring(from, to time.Time) (longest time.Duration, writes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.writes {
		if w.began.Before(to) && w.began.Add(w.took).After(from) {
			longest = max(longest, w.took)
			writes++
		}
	}
	return longest, writes
}

// A migration under write load stalls producers for at most
// 1 s. Producers, relay passes and claims write while a migration with a
// pending index on outbox.jobs runs; the longest single write stays under
// 1 s, and no try of the migration is lost to them. The same
// build as the migration used to run it, inside a transaction, is the
// control: it stalls them for longer, so the bound means something here.
//
// The build is made slow by its key (1 ms a row, PARALLEL UNSAFE, so one
// process builds it: the 1,000 'old' rows take about 2 s) rather than by
// millions of rows, which would take this test minutes to insert; what is
// measured is who waits for the build, not how fast it is. The producers'
// rows stay out of the partial index, so the build takes as long however
// fast they write.
func TestMigrationUnderWriteLoadStallsProducersBriefly(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	db.SetMaxOpenConns(10)
	ctx := context.Background()
	mustExec(t, db, `CREATE FUNCTION public.slow_key(id bigint) RETURNS bigint
		LANGUAGE plpgsql IMMUTABLE PARALLEL UNSAFE AS $$
		BEGIN
		  PERFORM pg_sleep(0.001);
		  RETURN id;
		END $$`)
	var eventID int64
	if err := db.QueryRow(`SELECT outbox.record('t', 's', '{}')`).Scan(&eventID); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, finalized_at)
		SELECT 'old', $1, 1, 'completed', now() FROM generate_series(1, 1000)`, eventID)
	mustExec(t, db, `ANALYZE outbox.jobs`)
	const pending = `CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_by_slow_key ON outbox.jobs (public.slow_key(id)) WHERE kind = 'old'`

	// Two producers record events, one row a transaction each, as an
	// application's INSERTs; two relay passes run back to back, as a busy
	// relay's do, and fan them out into jobs; and two workers' claims run
	// back to back.
	endpoint := insertEndpoint(t, db, "load", 1000, "")
	replica := registeredReplica(t, db, 503).ID()
	produce := func(i int) error {
		var err error
		switch i % 3 {
		case 0:
			_, err = db.ExecContext(ctx, `SELECT outbox.record('load', 's', '{}')`)
		case 1:
			_, err = db.ExecContext(ctx, fanOutSQL, 200, nil, `[]`, 18, 300.0, "", 0)
		case 2:
			_, err = db.ExecContext(ctx, claimJobsSQL, 10, replica, "{}", "{}", defaultShare, nil)
		}
		return err
	}
	probe := startStallProbe(t, 6, produce)
	waitFor(t, "producers and passes writing", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1`, endpoint) > 10
	})

	// The migration a new release brings: a column and an index to build.
	var logs syncBuffer
	m := newMigration(slog.New(slog.NewTextHandler(&logs, nil))).
		withNext("ALTER TABLE outbox.jobs ADD COLUMN IF NOT EXISTS upgrade_note text;\n" + pending + ";\n")
	from := time.Now()
	err := m.run(ctx, db)
	to := time.Now()
	probe.stopAndWait()
	if err != nil {
		t.Fatal(err)
	}
	stall, writes := probe.longestDuring(from, to)
	t.Logf("migration took %s: longest producer write %s, %d writes meanwhile; its log:\n%s", to.Sub(from), stall, writes, logs.String())
	built := regexp.MustCompile(`msg="index built concurrently" index=jobs_by_slow_key took=(\S+)`).FindStringSubmatch(logs.String())
	if built == nil {
		t.Fatalf("the pending index was not built:\n%s", logs.String())
	}
	if took, _ := time.ParseDuration(built[1]); took < time.Second {
		t.Errorf("the build took %s; the test needs one longer than the bound to mean anything", took)
	}
	if stall > time.Second {
		t.Errorf("a producer's write took %s during the migration, want at most 1s", stall)
	}
	if writes < 100 {
		t.Errorf("%d writes during the migration: the producers were not writing through it", writes)
	}
	// Passes and claims lock the migration's tables in its order
	// (schemaTablesQuery): none begun during the lock phase costs a try.
	// With outbox.events locked last, nearly every try was lost to the
	// passes.
	if n := strings.Count(logs.String(), "migration waited too long for a lock"); n > 0 {
		t.Errorf("the migration lost %d tries to its locks under load, want none", n)
	}
	if state, _ := indexState(t, db, "jobs_by_slow_key"); state != "valid" {
		t.Errorf("the index built under load is %s, want valid", state)
	}

	// The control: the same build in a transaction, as schema.sql's
	// CREATE INDEX IF NOT EXISTS used to run it.
	mustExec(t, db, `DROP INDEX outbox.jobs_by_slow_key`)
	probe = startStallProbe(t, 6, produce)
	waitFor(t, "producers writing again", 10*time.Second, func() bool {
		_, n := probe.longestDuring(time.Now().Add(-time.Hour), time.Now())
		return n > 10
	})
	from = time.Now()
	_, err = db.Exec(`BEGIN; CREATE INDEX IF NOT EXISTS jobs_by_slow_key ON outbox.jobs (public.slow_key(id)) WHERE kind = 'old'; COMMIT`)
	to = time.Now()
	probe.stopAndWait()
	if err != nil {
		t.Fatal(err)
	}
	controlStall, controlWrites := probe.longestDuring(from, to)
	t.Logf("control, the build in a transaction, took %s: longest producer write %s, %d writes meanwhile", to.Sub(from), controlStall, controlWrites)
	if controlStall <= time.Second {
		t.Errorf("the build in a transaction stalled producers %s, not more than the 1s bound: the table is too small for the test to tell", controlStall)
	}
}

// The next release, as far as the schema goes: a column and an index on
// outbox.jobs that this release knows nothing of.
func nextReleaseMigration(logger *slog.Logger) migration {
	return newMigration(logger).withNext(`
ALTER TABLE outbox.jobs ADD COLUMN IF NOT EXISTS upgrade_note text;
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_by_upgrade_note ON outbox.jobs (upgrade_note) WHERE upgrade_note IS NOT NULL;
`)
}

// rollingReplica is one replica's pipeline in this process: its own pool, a
// relay and a worker pool, whose subscriber writes down which replica ran
// each event.
type rollingReplica struct {
	t        *testing.T
	name     string
	db       *sql.DB
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	registry *replicaRegistry
}

// startRollingReplica starts a replica that says of itself what a build
// whose schema is m's would: this binary's release and revision, m's
// schema.
func startRollingReplica(t *testing.T, dsn, name string, m migration) *rollingReplica {
	t.Helper()
	db, err := openDB(context.Background(), dsn, 10)
	if err != nil {
		t.Fatal(err)
	}
	reg := newSubscriberRegistry()
	reg.Register(Subscriber{Name: "effects", Handle: func(ctx context.Context, tx *sql.Tx, ev Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ($1, $2)`, ev.ID, name)
		return err
	}})
	relayCfg := defaultConfig().Relay
	relayCfg.SweepInterval = 20 * time.Millisecond
	workerCfg := defaultConfig().Workers
	workerCfg.PollInterval = 20 * time.Millisecond
	workerCfg.Concurrency = 4
	ctx, cancel := context.WithCancel(context.Background())
	registry := newReplicaRegistry(db, defaultConfig().Replicas,
		replicaSelf{Host: "rolling-test", PID: os.Getpid(), Version: version, Revision: readBuildInfo().Revision,
			SchemaVersion: schemaVersionOf(m.checksum()), Workers: workerCfg.Concurrency}, testLogger(t))
	if err := registry.register(ctx); err != nil {
		t.Fatal(err)
	}
	r := &rollingReplica{t: t, name: name, db: db, cancel: cancel, registry: registry}
	rl := newRelay(db, relayCfg, 18, fanOutTargets(reg), testLogger(t).With("replica", name))
	wp := newWorkerPool(db, workerCfg, 10*time.Second, reg, nil, testLogger(t).With("replica", name))
	wp.replica = registry
	r.wg.Go(func() { rl.Run(ctx, nil, nil) })
	r.wg.Go(func() { wp.Run(ctx, nil) })
	r.wg.Go(func() { registry.Run(ctx) })
	t.Cleanup(r.stop)
	return r
}

// stop shuts the replica down as SIGTERM does: its loops end, running
// jobs finish, it leaves the registry, then its pool closes.
func (r *rollingReplica) stop() {
	r.cancel()
	r.wg.Wait()
	if err := r.registry.deregister(context.Background()); err != nil {
		r.t.Errorf("%s: %v", r.name, err)
	}
	r.db.Close()
}

// schemasListed is the schema versions the overview lists, and whether
// it flags the replicas' builds mixed.
func schemasListed(t *testing.T, db *sql.DB) ([]string, bool) {
	t.Helper()
	o, err := readOverview(context.Background(), db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	var versions []string
	for _, r := range o.Replicas {
		versions = append(versions, r.SchemaVersion)
	}
	slices.Sort(versions)
	return versions, o.MixedVersions
}

// A rolling upgrade: two replicas of this release deliver while
// producers record; one is replaced by the next release, which migrates
// (a column and an index on outbox.jobs) under that load, then the other.
// The replica still on this release delivers after the schema change it
// does not know, the next release delivers, and no event is lost.
// (The next release is this code plus a schema change: what the test
// exercises is the migration's effect on a running pipeline, and that the
// overview tells the two builds apart by the schema each records, their
// release and revision being the same. The previous release's own binary
// rolls in TestRollingUpgradeFromThePreviousReleaseLosesNothing.)
func TestRollingUpgradeWithASchemaChangeLosesNothing(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	mustExec(t, db, `CREATE TABLE effects (event_id bigint NOT NULL, replica text NOT NULL)`) // no unique key: duplicates must show
	effectsBy := func(replica string, afterEvent int64) int {
		return queryInt(t, db, `SELECT count(*) FROM effects WHERE replica = $1 AND event_id > $2`, replica, afterEvent)
	}

	// Producers at a steady 200 events/s in all, below what the replicas
	// deliver even on a loaded machine. Unpaced, they can outrun delivery
	// on a loaded machine while one replica is down, and the events
	// recorded after the schema change then wait behind a backlog for
	// longer than the wait below (the likely cause of one CI failure).
	var stop atomic.Bool
	var producers sync.WaitGroup
	for p := range 4 {
		producers.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for i := 0; !stop.Load(); i++ {
				if _, err := recordEvent(context.Background(), db, "t", fmt.Sprintf("%d-%d", p, i), nil); err != nil {
					t.Errorf("producer: %v", err)
					return
				}
				<-tick.C
			}
		})
	}
	defer func() { stop.Store(true); producers.Wait() }()

	this := newMigration(nil)
	a := startRollingReplica(t, dsn, "a (this release)", this)
	b := startRollingReplica(t, dsn, "b (this release)", this)
	waitFor(t, "both replicas delivering", 30*time.Second, func() bool {
		return effectsBy(a.name, 0) > 0 && effectsBy(b.name, 0) > 0
	})

	// a is replaced: stopped, then the next release starts and migrates
	// while b delivers and the producers record.
	a.stop()
	var logs syncBuffer
	next := nextReleaseMigration(slog.New(slog.NewTextHandler(&logs, nil)))
	if err := next.run(context.Background(), db); err != nil {
		t.Fatalf("the next release's migration under load: %v", err)
	}
	if !strings.Contains(logs.String(), `msg="index built concurrently" index=jobs_by_upgrade_note`) {
		t.Fatalf("the next release's index was not built:\n%s", logs.String())
	}
	var migrated int64
	if err := db.QueryRow(`SELECT max(id) FROM outbox.events`).Scan(&migrated); err != nil {
		t.Fatal(err)
	}
	a2 := startRollingReplica(t, dsn, "a (next release)", next)
	// If the wait below fails, what each replica did and what was left.
	defer func() {
		if t.Failed() {
			t.Logf("effects after event %d: %s %d, %s %d; unfinished jobs %d, of them after it %d", migrated,
				a2.name, effectsBy(a2.name, migrated), b.name, effectsBy(b.name, migrated),
				queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state NOT IN ('completed', 'discarded')`),
				queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state NOT IN ('completed', 'discarded') AND event_id > $1`, migrated))
		}
	}()
	waitFor(t, "both releases delivering events recorded after the schema change", 30*time.Second, func() bool {
		return effectsBy(a2.name, migrated) >= 20 && effectsBy(b.name, migrated) >= 20
	})

	// Halfway, the overview lists both schemas and flags the mix: the two
	// builds share release and revision, and differ in their schema alone.
	halfway := []string{schemaVersionOf(this.checksum()), schemaVersionOf(next.checksum())}
	slices.Sort(halfway)
	if schemas, mixed := schemasListed(t, db); !slices.Equal(schemas, halfway) || !mixed {
		t.Errorf("halfway through the roll the overview lists schemas %v, mixed %t; want %v, mixed", schemas, mixed, halfway)
	}

	// Then b: the schema is in place, so its migration changes nothing.
	b.stop()
	logs = syncBuffer{}
	if err := nextReleaseMigration(slog.New(slog.NewTextHandler(&logs, nil))).run(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if logs.String() != "" {
		t.Errorf("the second replica of the next release migrated again:\n%s", logs.String())
	}
	b2 := startRollingReplica(t, dsn, "b (next release)", next)
	waitFor(t, "the second replica of the next release delivering", 30*time.Second, func() bool {
		return effectsBy(b2.name, migrated) >= 20
	})

	after := []string{schemaVersionOf(next.checksum()), schemaVersionOf(next.checksum())}
	if schemas, mixed := schemasListed(t, db); !slices.Equal(schemas, after) || mixed {
		t.Errorf("after the roll the overview lists schemas %v, mixed %t; want %v, not mixed", schemas, mixed, after)
	}

	stop.Store(true)
	producers.Wait()
	total := queryInt(t, db, `SELECT count(*) FROM outbox.events`)
	// A replica stopped as SIGTERM stops one finishes the claim it has in
	// flight and the jobs it claimed (TestWorkerShutdownFinishesAClaimInFlight),
	// so nothing should be left running for a rescuer. One with a 2 s
	// horizon, which no job of this test's subscriber runs for, looks: a
	// job it returns to the queue was abandoned by a stopped replica.
	rescueCfg := defaultConfig().Workers
	rescueCfg.AttemptTimeout, rescueCfg.RescueMargin = time.Second, time.Second
	rescuer := newRescuer(db, rescueCfg, defaultConfig().Replicas, testLogger(t))
	var rescued int64
	defer func() {
		if t.Failed() {
			ids, err := queryAll(context.Background(), db, scanID, `SELECT id FROM outbox.events ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			ran := func(id int64) bool {
				return queryInt(t, db, `SELECT count(*) FROM effects WHERE event_id = $1`, id) > 0
			}
			view := func(id int64) string {
				return fmt.Sprintf("the subscriber ran it %d times; the rescuer returned %d jobs to the queue",
					queryInt(t, db, `SELECT count(*) FROM effects WHERE event_id = $1`, id), rescued)
			}
			describeUndelivered(t, db, ids, ran, view, 10)
		}
	}()
	stopped := time.Now()
	waitFor(t, "every recorded event delivered", 60*time.Second, func() bool {
		n, err := rescuer.rescueOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		rescued += n
		return queryInt(t, db, `SELECT count(DISTINCT event_id) FROM effects`) == total
	})
	lost := queryInt(t, db, `SELECT count(*) FROM outbox.events AS e WHERE NOT EXISTS (SELECT 1 FROM effects AS f WHERE f.event_id = e.id)`)
	dups := queryInt(t, db, `SELECT count(*) - count(DISTINCT event_id) FROM effects`)
	t.Logf("%d events recorded through the roll: %d lost, %d delivered twice, %d jobs rescued; all delivered %s after the producers stopped",
		total, lost, dups, rescued, time.Since(stopped).Round(time.Millisecond))
	if lost != 0 {
		t.Errorf("%d events lost in the rolling upgrade", lost)
	}
	if rescued != 0 {
		t.Errorf("%d jobs left running by a stopped replica, returned by the rescuer", rescued)
	}
	// Every replica stopped as SIGTERM stops one, finishing what it ran:
	// nothing runs twice.
	if dups != 0 {
		t.Errorf("%d events delivered twice", dups)
	}
}

// The statements that find running jobs through the partial indexes of
// running jobs (the claim's counts, the completer's outcomes) plan no
// bitmap scan: a bitmap scan reads every entry of those indexes, dead
// ones included, and never marks them dead (schema.sql, claim_lane_jobs
// and record_outcomes say what it cost).
func TestRunningJobsAreNeverReadByBitmapScan(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	got := queryStrings(t, db, `
		SELECT p.proname::text
		FROM pg_proc AS p
		WHERE p.pronamespace = 'outbox'::regnamespace
		  AND 'enable_bitmapscan=off' = ANY (p.proconfig)
		ORDER BY 1`)
	if diff := cmp.Diff([]string{"claim_lane_jobs", "record_outcomes"}, got); diff != "" {
		t.Errorf("functions planned without bitmap scans (-want +got):\n%s", diff)
	}
}
