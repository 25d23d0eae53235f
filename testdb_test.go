// testdb_test.go: the test harness, a real PostgreSQL for every test.
//
// With OUTBOXD_TEST_DATABASE_URL set (a superuser URL, e.g.
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable) the tests
// use that server; otherwise TestMain starts a throwaway cluster from the
// machine's PostgreSQL binaries (devdb.go) for the whole run. Either way
// each test gets a fresh database cloned from a migrated template, so tests
// run in parallel and never see each other's rows.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// harness is the server the tests run against; set once by TestMain.
var harness struct {
	adminDSN string // a superuser connection to a maintenance database
	template string // the migrated template database
	seq      atomic.Int64
}

func TestMain(m *testing.M) {
	// The startup tests re-run this binary as outboxd itself.
	if os.Getenv("OUTBOXD_TEST_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	ctx := context.Background()
	harness.adminDSN = os.Getenv("OUTBOXD_TEST_DATABASE_URL")
	if harness.adminDSN == "" {
		dir, err := os.MkdirTemp("", "outboxd-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "test harness:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		// A throwaway cluster need not survive a crash; fsync off makes
		// CREATE DATABASE per test cheap.
		c, err := startCluster(ctx, dir, slog.New(slog.NewTextHandler(io.Discard, nil)),
			"fsync=off", "full_page_writes=off", "synchronous_commit=off", "max_connections=300")
		if err != nil {
			fmt.Fprintln(os.Stderr, "test harness: no OUTBOXD_TEST_DATABASE_URL, and starting a throwaway cluster failed:", err)
			return 1
		}
		defer c.Stop()
		harness.adminDSN = c.DSN("postgres")
	}

	harness.template = fmt.Sprintf("outboxd_tmpl_%d", os.Getpid())
	admin, err := sql.Open("postgres", harness.adminDSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test harness:", err)
		return 1
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+harness.template); err != nil {
		fmt.Fprintln(os.Stderr, "test harness: create template:", err)
		return 1
	}
	defer admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+harness.template+" WITH (FORCE)")
	tmpl, err := sql.Open("postgres", dsnWithDB(harness.adminDSN, harness.template))
	if err != nil {
		fmt.Fprintln(os.Stderr, "test harness:", err)
		return 1
	}
	err = migrate(ctx, tmpl)
	tmpl.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test harness:", err)
		return 1
	}
	return m.Run()
}

// dsnWithDB is dsn pointing at database name instead, in either of lib/pq's
// two connection string forms.
func dsnWithDB(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			panic(err)
		}
		u.Path = "/" + name
		return u.String()
	}
	return dsn + " dbname=" + name // a later keyword wins in lib/pq
}

// newTestDB creates a fresh, migrated database for t and drops it when t
// ends. It returns the pool and its DSN (for listeners and subprocesses).
func newTestDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("outboxd_test_%d_%d", os.Getpid(), harness.seq.Add(1))
	admin, err := sql.Open("postgres", harness.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// Copying the template is refused while anyone is connected to it;
	// migrate's connection is closed, but retry briefly on a busy server.
	for attempt := 0; ; attempt++ {
		_, err = admin.ExecContext(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, harness.template))
		if err == nil || attempt == 20 || !strings.Contains(err.Error(), "being accessed by other users") {
			break
		}
		time.Sleep(50 * time.Millisecond) // not synchronisation: backing off a refused CREATE DATABASE
	}
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	dsn := dsnWithDB(harness.adminDSN, name)
	db, err := newDBPool(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(20)
	dropOnCleanup(t, db, name)
	return db, dsn
}

// testLogger writes to the test's log, so a failing test shows what the
// loops said and a passing one stays quiet.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitFor polls cond until it holds or the deadline passes. Polling a
// condition is the synchronisation; the interval only sets how often.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// queryInt runs a query that returns one integer.
func queryInt(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// mustExec runs statements that must succeed.
func mustExec(t testing.TB, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// refuseDeletes makes every DELETE from table fail with message, the way a
// trigger of the application's could: a fault for the sweeps to meet.
func refuseDeletes(t testing.TB, db *sql.DB, table, message string) {
	t.Helper()
	mustExec(t, db, `CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  RAISE EXCEPTION '%', TG_ARGV[0];
		END $$`)
	mustExec(t, db, `CREATE TRIGGER refuse_delete BEFORE DELETE ON `+table+
		` FOR EACH STATEMENT EXECUTE FUNCTION refuse_delete('`+strings.ReplaceAll(message, "'", "''")+`')`)
}

// dropOnCleanup closes db and drops its database, name, when t ends.
func dropOnCleanup(t testing.TB, db *sql.DB, name string) {
	t.Cleanup(func() {
		db.Close()
		admin, err := sql.Open("postgres", harness.adminDSN)
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})
}
