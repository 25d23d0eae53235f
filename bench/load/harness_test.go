// harness_test.go: what the end-to-end tests need: outboxd built from the
// repository root once per test binary, a PostgreSQL server (the one
// OUTBOXD_TEST_DATABASE_URL names, else the local one), a database per
// test, and a run of the generator.

package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// harness is the test binary's outboxd and server; set up once.
var harness struct {
	dir      string // holds the built outboxd; removed by TestMain
	build    sync.Once
	outboxd  string // the built binary, once built
	buildErr error
	seq      atomic.Int64
}

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "bench-load-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "test harness:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	harness.dir = dir
	return m.Run()
}

// outboxdBinary is outboxd built from the repository root, once for the
// whole test binary. A test that needs it skips when Go cannot build it
// (this folder copied out of the repository, or no toolchain for it).
func outboxdBinary(t *testing.T) string {
	t.Helper()
	harness.build.Do(func() {
		bin := filepath.Join(harness.dir, "outboxd")
		cmd := exec.Command("go", "build", "-o", bin, ".")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			harness.buildErr = fmt.Errorf("go build of the repository root: %v\n%s", err, out)
			return
		}
		harness.outboxd = bin
	})
	if harness.buildErr != nil {
		t.Skipf("this test runs a real outboxd, and Go could not build one: %v", harness.buildErr)
	}
	return harness.outboxd
}

// serverURL is the PostgreSQL server the tests use: a superuser URL.
func serverURL() string {
	return cmp.Or(os.Getenv("OUTBOXD_TEST_DATABASE_URL"), defaultDatabaseURL)
}

// testDatabaseName is a database name of this test binary's own.
func testDatabaseName() string {
	return fmt.Sprintf("bench_load_test_%d_%d", os.Getpid(), harness.seq.Add(1))
}

// newTestDB creates an empty database for one test, dropped at its end,
// and returns a pool on it and its URL.
func newTestDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	name := testDatabaseName()
	if err := recreateDatabase(context.Background(), serverURL(), name); err != nil {
		t.Fatalf("PostgreSQL at %s (set OUTBOXD_TEST_DATABASE_URL to use another): %v", serverURL(), err)
	}
	t.Cleanup(func() {
		if err := dropDatabase(context.Background(), serverURL(), name); err != nil {
			t.Errorf("drop the test's database: %v", err)
		}
	})
	url, err := withDatabase(serverURL(), name)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, url
}

// runLoad runs the generator with args after -outboxd, returning its
// stdout and stderr; a failed run fails the test.
func runLoad(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	var out, errs syncBuffer
	args = append([]string{"-outboxd", outboxdBinary(t)}, args...)
	if err := run(context.Background(), args, func(string) string { return "" }, &out, &errs); err != nil {
		t.Fatalf("load %v: %v\n%s", args, err, errs.String())
	}
	return out.String(), errs.String()
}

func queryInt(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// syncBuffer is an io.Writer that the run's goroutines may share.
type syncBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
