// pgbouncer_test.go: outboxd behind a real PgBouncer in transaction
// pooling mode (-pool-mode transaction), the way most production
// PostgreSQL is reached. startPgBouncer runs Debian's pgbouncer in front of
// the test server for one test: without it the tests skip (needTool),
// and .ci/run installs it.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lib/pq"
)

// pgBouncer is one PgBouncer process in front of the test server.
type pgBouncer struct {
	port    int
	logPath string
}

// startPgBouncer starts PgBouncer with pool_mode = transaction in front of
// the server upstreamDSN names, at most poolSize server connections per
// database and user, and stops it when t ends. Every database of that
// server is reachable through it under its own name.
//
// server_round_robin hands out idle server connections in turn rather than
// the most recently used first, so that consecutive transactions of one
// client land on different server sessions whenever more than one is idle:
// what a busy pooler does anyway, made the rule so a test that leans on
// session state fails every time rather than now and then.
//
// PgBouncer refuses to run as root; as root it runs as the postgres OS
// user, as devdb.go runs the throwaway cluster (serverCredential).
func startPgBouncer(t testing.TB, upstreamDSN string, poolSize int) *pgBouncer {
	t.Helper()
	bin := needTool(t, "pgbouncer", "pgbouncer")
	up, err := pq.NewConfig(upstreamDSN)
	if err != nil {
		t.Fatal(err)
	}
	user := up.User
	if user == "" {
		user = "postgres"
	}
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		// The postgres user must reach the folder.
		os.Chmod(filepath.Dir(dir), 0o755)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	b := &pgBouncer{port: port, logPath: filepath.Join(dir, "pgbouncer.log")}
	// auth_type = trust checks no password, but the user must be listed.
	userlist := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(userlist, []byte(strconv.Quote(user)+` ""`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ini := filepath.Join(dir, "pgbouncer.ini")
	config := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
logfile = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
server_round_robin = 1
; a restarted server is tried again within a second, not 15
server_login_retry = 1
ignore_startup_parameters = extra_float_digits
`, up.Host, up.Port, port, userlist, b.logPath, poolSize)
	if err := os.WriteFile(ini, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cred, err := serverCredential(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, ini)
	cmd.SysProcAttr = serverProcAttr(cred)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard // it logs to logPath
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("pgbouncer's log ends:\n%s", tail(b.logPath, 20))
		}
	})

	probe, err := sql.Open("postgres", b.DSN(upstreamDSN))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	waitFor(t, "pgbouncer to answer", 30*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatalf("pgbouncer exited at start; its log ends:\n%s", tail(b.logPath, 20))
		default:
		}
		return probe.Ping() == nil
	})
	return b
}

// DSN is dsn (a test database's, from newTestDB) through the bouncer: the
// same database and user, PgBouncer's address.
func (b *pgBouncer) DSN(dsn string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			panic(err)
		}
		u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
		return u.String()
	}
	return fmt.Sprintf("%s host=127.0.0.1 port=%d", dsn, b.port) // a later keyword wins in lib/pq
}

// openThrough opens a pool on dsn's database through b, as outboxd opens
// its own (newDBPool), closed when t ends.
func (b *pgBouncer) openThrough(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := newDBPool(b.DSN(dsn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// fillPool makes the bouncer open n server connections to db's database:
// n transactions open at once each hold one. Round robin needs several
// idle ones to move a client between sessions.
func fillPool(t testing.TB, db *sql.DB, n int) {
	t.Helper()
	var txs []*sql.Tx
	for range n {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(`SELECT 1`); err != nil { // BEGIN alone takes no server connection
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	for _, tx := range txs {
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// The premise of every test here: through the bouncer, one client
// connection's consecutive transactions run on different server sessions,
// so session state does not follow the client.
func TestPgBouncerMovesAClientBetweenSessions(t *testing.T) {
	t.Parallel()
	_, dsn := newTestDB(t)
	b := startPgBouncer(t, dsn, 4)
	db := b.openThrough(t, dsn)
	fillPool(t, db, 4)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pids := map[int]bool{}
	for range 8 {
		var pid int
		if err := conn.QueryRowContext(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids[pid] = true
	}
	if len(pids) < 2 {
		t.Fatalf("8 statements of one client connection ran on %d server session(s), want several: not transaction pooling", len(pids))
	}
}

// outboxd's pool sends a statement with parameters as one Parse, Bind,
// Execute and Sync (newDBPool, binary_parameters), so it runs outside a
// transaction through the bouncer; lib/pq's default syncs between the
// Parse and the Bind, the bouncer lends the Bind another server session,
// and the unnamed statement is not there. The control shows the bouncer
// does move such a client, so the first half proves something.
func TestPgBouncerRunsParameterizedStatementsOutsideTransactions(t *testing.T) {
	t.Parallel()
	_, dsn := newTestDB(t)
	b := startPgBouncer(t, dsn, 4)
	count := func(db *sql.DB) (failed int) {
		fillPool(t, db, 4)
		for i := range 20 {
			var n int
			if err := db.QueryRow(`SELECT $1::integer + 1`, i).Scan(&n); err != nil || n != i+1 {
				failed++
			}
		}
		return failed
	}
	if failed := count(b.openThrough(t, dsn)); failed != 0 {
		t.Errorf("outboxd's pool: %d of 20 statements with a parameter failed through pgbouncer, want 0", failed)
	}
	plain, err := sql.Open("postgres", b.DSN(dsn))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if failed := count(plain); failed == 0 {
		t.Error("lib/pq's default protocol: all 20 statements ran through pgbouncer; the bouncer is not moving the client between Parse and Bind")
	}
}

// -pool-mode transaction sets what it changes, and a bad value refuses to
// start naming the setting.
func TestPoolModeTransactionSettings(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig(nil, envFrom(map[string]string{"OUTBOXD_POOL_MODE": "transaction"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Relay.SweepInterval != time.Second || !cfg.Retention.XactLocks {
		t.Errorf("transaction mode: relay sweep %s, per-batch retention locks %t; want 1s, true", cfg.Relay.SweepInterval, cfg.Retention.XactLocks)
	}
	cfg, err = parseConfig([]string{"-pool-mode", "transaction", "-relay-sweep", "5s"}, envFrom(nil), io.Discard)
	if err != nil || cfg.Relay.SweepInterval != 5*time.Second {
		t.Errorf("transaction mode with -relay-sweep 5s: %s, %v; want the given 5s", cfg.Relay.SweepInterval, err)
	}
	cfg, err = parseConfig(nil, envFrom(nil), io.Discard)
	if err != nil || cfg.PoolMode != "session" || cfg.Relay.SweepInterval != time.Minute || cfg.Retention.XactLocks {
		t.Errorf("default: mode %q, relay sweep %s, per-batch locks %t, %v; want session, 1m0s, false", cfg.PoolMode, cfg.Relay.SweepInterval, cfg.Retention.XactLocks, err)
	}
	_, err = parseConfig([]string{"-pool-mode", "Transaction"}, envFrom(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-pool-mode (OUTBOXD_POOL_MODE)") {
		t.Errorf("-pool-mode Transaction: %v, want an error naming the setting", err)
	}
}

// retentionLockHeldSQL says whether this backend holds the retention lock
// (a one-key advisory lock: its high half in classid, its low half in
// objid, objsubid 1) and how many backends hold it in all.
const retentionLockHeldSQL = `
SELECT coalesce(bool_or(l.pid = pg_backend_pid()), false), count(*)
FROM pg_locks AS l
WHERE l.locktype = 'advisory'
  AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
  AND l.objsubid = 1
  AND l.classid = ($1::bigint >> 32)::oid
  AND l.objid = ($1::bigint & 4294967295)::oid
  AND l.granted`

// auditSweeps records, for every DELETE statement on table, whether the
// backend running it held the retention lock and how many backends held
// it: a statement-level trigger in the deleting transaction itself, so it
// sees the session the pooler gave that statement.
func auditSweeps(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	mustExec(t, db, `CREATE TABLE sweep_audit (pid integer NOT NULL, held boolean NOT NULL, holders integer NOT NULL)`)
	mustExec(t, db, fmt.Sprintf(`
		CREATE FUNCTION audit_sweep() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  -- A delivered job leaves the queue by a DELETE of the completer's
		  -- (outbox.record_outcomes): not a sweep.
		  IF current_query() LIKE '%%outbox.record_outcomes%%' THEN
		    RETURN NULL;
		  END IF;
		  INSERT INTO sweep_audit (pid, held, holders)
		  SELECT pg_backend_pid(), h.held, h.holders
		  FROM (%s) AS h (held, holders);
		  RETURN NULL;
		END $$`, strings.ReplaceAll(retentionLockHeldSQL, "$1", strconv.FormatInt(retentionLockKey, 10))))
	mustExec(t, db, `CREATE TRIGGER audit_sweep BEFORE DELETE ON `+table+` FOR EACH STATEMENT EXECUTE FUNCTION audit_sweep()`)
}

// sweepAudit is what auditSweeps saw: DELETE statements, those run by a
// backend without the lock, and those run while more than one backend held
// it.
type sweepAudit struct{ deletes, unlocked, shared int }

func readSweepAudit(t testing.TB, db *sql.DB) sweepAudit {
	t.Helper()
	var a sweepAudit
	err := db.QueryRow(`
		SELECT count(*), count(*) FILTER (WHERE NOT held), count(*) FILTER (WHERE holders > 1)
		FROM sweep_audit`).Scan(&a.deletes, &a.unlocked, &a.shared)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// addOldEvents inserts n events fanned out 8 days ago, past the default
// 7-day window, in one statement.
func addOldEvents(t testing.TB, db *sql.DB, n int) {
	t.Helper()
	mustExec(t, db, `
		INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at)
		SELECT 't', g::text, now() - interval '8 days', now() - interval '8 days'
		FROM generate_series(1, $1) AS g`, n)
}

// bouncedSweeper is a sweeper of a fresh database through a bouncer in
// transaction mode, its pool's 4 connections open (so that consecutive
// transactions can land on different server sessions), with per-batch
// locks or the session lock, batches of batch rows, and every DELETE of
// outbox.events audited. It returns the direct connection beside it.
func bouncedSweeper(t *testing.T, xactLocks bool, batch int) (*sql.DB, *sweeper) {
	t.Helper()
	direct, dsn := newTestDB(t)
	b := startPgBouncer(t, dsn, 4)
	db := b.openThrough(t, dsn)
	fillPool(t, db, 4)
	auditSweeps(t, direct, "outbox.events")
	cfg := defaultConfig().Retention
	cfg.XactLocks = xactLocks
	cfg.BatchSize = batch
	return direct, newSweeper(db, cfg, t.Name(), testLogger(t))
}

// Behind the pooler with per-batch locks, retention sweeps every cycle:
// never skipped, never failed, every old row deleted, and every DELETE run
// by a session that holds the lock. Batches of 2 make many transactions,
// each free to land on another server session.
func TestPgBouncerSweepsEveryCycle(t *testing.T) {
	t.Parallel()
	direct, s := bouncedSweeper(t, true, 2)

	const cycles, perCycle = 5, 5
	for i := range cycles {
		addOldEvents(t, direct, perCycle)
		res, err := s.sweepOnce(context.Background())
		if err != nil || res.Skipped || res.HandedOver || res.Deleted["events"] != perCycle {
			t.Fatalf("cycle %d through pgbouncer: %+v, %v; want %d events deleted, not skipped", i+1, res, err, perCycle)
		}
		if n := advisoryLocks(t, direct); n != 0 {
			t.Fatalf("cycle %d left %d advisory locks, want 0", i+1, n)
		}
	}
	if s.cycles.Load() != cycles || s.skipped.Load() != 0 || s.failed.Load() != 0 {
		t.Errorf("swept %d, skipped %d, failed %d; want %d, 0, 0", s.cycles.Load(), s.skipped.Load(), s.failed.Load(), cycles)
	}
	// Three batches of 2 a cycle delete 5 rows (the third finds 1).
	if a := readSweepAudit(t, direct); a.deletes != 3*cycles || a.unlocked != 0 || a.shared != 0 {
		t.Errorf("event DELETEs: %+v; want %d, every one by a session holding the lock alone", a, 3*cycles)
	}
}

// The control: with the session lock (the mode off), the pooler runs the
// sweep's statements on sessions that do not hold the lock, which is why
// -pool-mode transaction exists. If this passed with no unlocked DELETE,
// the bouncer would not be pooling by transaction and the tests here
// would prove nothing.
func TestPgBouncerBreaksTheSessionLock(t *testing.T) {
	t.Parallel()
	direct, s := bouncedSweeper(t, false, 2)
	addOldEvents(t, direct, 5)
	res, err := s.sweepOnce(context.Background())
	a := readSweepAudit(t, direct)
	t.Logf("session-lock cycle through pgbouncer: %+v, %v; audit %+v; advisory locks left %d", res, err, a, advisoryLocks(t, direct))
	if a.unlocked == 0 {
		t.Errorf("every DELETE of the session-lock sweep ran on the session holding the lock (%+v): the bouncer is not moving the client", a)
	}
}

// Two replicas' sweepers, each with its own pool through the bouncer,
// cycle at once over a table with many old rows: the rows all go, and no
// two ever sweep at once, as every DELETE's own transaction reads
// pg_locks: its session held the lock and no other session did.
func TestPgBouncerSweepersNeverSweepAtOnce(t *testing.T) {
	t.Parallel()
	direct, dsn := newTestDB(t)
	b := startPgBouncer(t, dsn, 4)
	auditSweeps(t, direct, "outbox.events")
	const rows = 400
	addOldEvents(t, direct, rows)
	cfg := defaultConfig().Retention
	cfg.XactLocks = true
	cfg.BatchSize = 10
	a := newSweeper(b.openThrough(t, dsn), cfg, "replica-a", testLogger(t))
	bb := newSweeper(b.openThrough(t, dsn), cfg, "replica-b", testLogger(t))

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, s := range []*sweeper{a, bb} {
		wg.Go(func() {
			for range 200 {
				if queryInt(t, direct, `SELECT count(*) FROM outbox.events`) == 0 {
					return
				}
				if _, err := s.sweepOnce(context.Background()); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("sweep cycle: %v", err)
	}
	if n := queryInt(t, direct, `SELECT count(*) FROM outbox.events`); n != 0 {
		t.Errorf("%d old events left, want 0", n)
	}
	audit := readSweepAudit(t, direct)
	if audit.deletes < rows/cfg.BatchSize || audit.unlocked != 0 || audit.shared != 0 {
		t.Errorf("event DELETEs: %+v; want at least %d, every one by a session holding the lock alone", audit, rows/cfg.BatchSize)
	}
	if a.failed.Load()+bb.failed.Load() != 0 {
		t.Errorf("failed cycles: a %d, b %d; want 0", a.failed.Load(), bb.failed.Load())
	}
	t.Logf("a swept %d and skipped %d cycles, b swept %d and skipped %d; %d DELETEs", a.cycles.Load(), a.skipped.Load(), bb.cycles.Load(), bb.skipped.Load(), audit.deletes)
}

// metricsOf scrapes a running outboxd's /metrics.
func metricsOf(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return parseMetrics(t, resp.Body)
}

// The whole pipeline through the pooler: two replicas in -pool-mode
// transaction, producers recording through it too. Every event recorded
// is delivered; retention runs every cycle of each replica and prunes the
// completed jobs, never with two replicas' DELETEs at once; and the
// relays, which nothing can wake, tell producers not to notify.
func TestPgBouncerPipelineDeliversAndSweeps(t *testing.T) {
	t.Parallel()
	direct, dsn := newTestDB(t)
	b := startPgBouncer(t, dsn, 4)
	auditSweeps(t, direct, "outbox.jobs")
	rc := newReceiver(t, nil)
	// Completed jobs a replica of the release before left in the queue:
	// the job cleaner's to delete (a delivered job of this release leaves
	// the queue at once).
	mustExec(t, direct, `
		INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'sub:old', outbox.record('old', g::text, '{}'), 18, 'completed', 1, now() - interval '1 minute', now() - interval '1 minute'
		FROM generate_series(1, 100) AS g`)
	mustExec(t, direct, `UPDATE outbox.events SET fanned_out_at = now() WHERE topic = 'old'`)

	ctx, cancel := context.WithCancel(context.Background())
	var replicas []string
	var exits []chan struct{}
	for range 2 {
		addr := freeAddr(t)
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			err := run(ctx, []string{"-addr", addr, "-database-url", b.DSN(dsn), "-admin-token", testToken, "-allow-private-endpoints",
				"-pool-mode", "transaction", "-job-poll", "200ms", "-db-max-conns", "8",
				"-retention-interval", "1s", "-completed-jobs-retention", "1s"}, envFrom(nil), io.Discard, testWriter{t})
			if err != nil && ctx.Err() == nil {
				t.Errorf("outboxd: %v", err)
			}
		}()
		replicas, exits = append(replicas, addr), append(exits, exited)
	}
	defer func() {
		cancel()
		for _, e := range exits {
			<-e
		}
	}()
	for i, addr := range replicas {
		awaitHealthy(t, addr, exits[i])
	}
	api := &testAPI{t: t, srv: &httptest.Server{URL: "http://" + replicas[0]}}
	api.createEndpoint(rc.srv.URL + "/hook")

	// Producers through the bouncer: 4 at once, 50 transactions of 2
	// events each.
	producers := b.openThrough(t, dsn)
	const perProducer, perTx = 50, 2
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := range perProducer {
				tx, err := producers.Begin()
				if err != nil {
					t.Error(err)
					return
				}
				for j := range perTx {
					if _, err := tx.Exec(`SELECT outbox.record('order.paid', $1, '{}')`, fmt.Sprintf("%d-%d-%d", p, i, j)); err != nil {
						tx.Rollback()
						t.Error(err)
						return
					}
				}
				if err := tx.Commit(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	const events = 4 * perProducer * perTx
	if n := queryInt(t, direct, `SELECT count(*) FROM outbox.events WHERE topic <> 'old'`); n != events {
		t.Fatalf("%d events recorded through pgbouncer, want %d", n, events)
	}

	waitFor(t, "every event delivered", 60*time.Second, func() bool {
		got := map[string]bool{}
		for _, r := range rc.requests() {
			got[r.Header.Get("webhook-id")] = true
		}
		return len(got) == events
	})
	waitFor(t, "retention to prune every completed job", 60*time.Second, func() bool {
		return queryInt(t, direct, `SELECT count(*) FROM outbox.jobs`) == 0
	})
	// Three more cycles of each replica after that: still swept, none
	// failed.
	swept := func(addr string) (swept, skipped, failed float64) {
		m := metricsOf(t, addr)
		return m[`outboxd_retention_cycles_total{result="swept"}`], m[`outboxd_retention_cycles_total{result="skipped"}`], m[`outboxd_retention_cycles_total{result="failed"}`]
	}
	var before []float64
	for _, addr := range replicas {
		s, _, _ := swept(addr)
		before = append(before, s)
	}
	mostlySkipping := 0
	for i, addr := range replicas {
		waitFor(t, "three more retention cycles of replica "+addr, 30*time.Second, func() bool {
			s, _, _ := swept(addr)
			return s >= before[i]+3
		})
		s, skipped, failed := swept(addr)
		if failed != 0 {
			t.Errorf("replica %s: %v retention cycles failed, want 0", addr, failed)
		}
		if skipped > s {
			mostlySkipping++
		}
		t.Logf("replica %s: retention swept %v cycles, skipped %v", addr, s, skipped)
	}
	// A cycle skips only when it meets a batch of the other replica's
	// cycle. (Both replicas of this process start their cycles at the same
	// offset, their jitter seeds being one host and pid, so they meet
	// often.) So one replica may skip most of its cycles, on a loaded
	// machine even more than the other sweeps, while the other sweeps
	// more than it skips. With the session lock, the lock a failed unlock
	// leaves behind on some server session makes most cycles of both skip.
	if mostlySkipping == len(replicas) {
		t.Errorf("every replica skipped more retention cycles than it swept: the lock is held by no cycle")
	}
	if a := readSweepAudit(t, direct); a.deletes == 0 || a.unlocked != 0 || a.shared != 0 {
		t.Errorf("job DELETEs: %+v; want some, every one by a session holding the lock alone", a)
	}
	if idle := queryInt(t, direct, `SELECT count(*) FROM outbox.relay_state WHERE idle`); idle != 0 {
		t.Error("relay_state says idle in transaction mode: producers send NOTIFYs nobody hears")
	}
	var discarded int
	if err := direct.QueryRow(`SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL OR poisoned_at IS NOT NULL`).Scan(&discarded); err != nil || discarded != 0 {
		t.Errorf("%d events not fanned or poisoned (%v), want 0", discarded, err)
	}
}

// Behind a pooler in transaction mode a replica does not migrate: the
// migration's session lock would not hold. Where this release's schema is
// not applied, it refuses to start and says how to migrate; after
// `outboxd migrate` over a direct connection it starts.
func TestPoolModeTransactionRefusesToMigrateThroughThePooler(t *testing.T) {
	t.Parallel()
	direct, dsn := newTestDB(t)
	b := startPgBouncer(t, dsn, 2)
	last := len(embeddedMigrations())
	mustExec(t, direct, `DELETE FROM outbox.migrations WHERE version = $1`, last) // a database of the release before
	applied := func() int {
		t.Helper()
		var n int
		if err := direct.QueryRow(`SELECT count(*) FROM outbox.migrations WHERE version = $1`, last).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	migrateVia := func(args ...string) error {
		return run(context.Background(), append([]string{"migrate", "-database-wait", "0"}, args...), envFrom(nil), io.Discard, testWriter{t})
	}

	err := migrateVia("-database-url", b.DSN(dsn), "-pool-mode", "transaction")
	if !errors.Is(err, errMigrateThroughPooler) || !strings.Contains(err.Error(), "outboxd migrate") {
		t.Errorf("through the pooler, unmigrated: %v; want errMigrateThroughPooler, naming `outboxd migrate`", err)
	}
	if n := applied(); n != 0 {
		t.Fatalf("the refused start recorded the schema (%d rows)", n)
	}
	if err := migrateVia("-database-url", dsn); err != nil {
		t.Fatalf("migrate over the direct connection: %v", err)
	}
	if n := applied(); n != 1 {
		t.Fatalf("after the direct migrate, %d rows of this schema recorded, want 1", n)
	}
	if err := migrateVia("-database-url", b.DSN(dsn), "-pool-mode", "transaction"); err != nil {
		t.Errorf("through the pooler, migrated: %v", err)
	}
}
