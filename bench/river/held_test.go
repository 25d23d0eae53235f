package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestParseCompareConfigHeld(t *testing.T) {
	t.Parallel()
	noEnv := func(string) string { return "" }
	base := []string{"-outboxd", "/bin/outboxd", "-load", "/bin/load", "-pgbench", "/bin/pgbench"}
	cfg, err := parseCompareConfig(base, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HeldRate != 1000 || cfg.HeldRun != 6*time.Minute || cfg.HeldFrom != 40*time.Second ||
		cfg.HeldUntil != 280*time.Second || cfg.HeldEvery != 15*time.Second {
		t.Errorf("defaults: -held-rate %g, -held-run %s, -held-from %s, -held-until %s, -held-sample %s; want 1000, 6m, 40s, 280s, 15s",
			cfg.HeldRate, cfg.HeldRun, cfg.HeldFrom, cfg.HeldUntil, cfg.HeldEvery)
	}
	// Two runs of six minutes are a benchmark of their own: held runs
	// when -works names it, not by default.
	if slices.Contains(cfg.Works, "held") || !slices.Contains(cfg.Works, "cpu") {
		t.Errorf("default works %v: want cpu and not held", cfg.Works)
	}
	cfg, err = parseCompareConfig(append(slices.Clone(base), "-works", "held"), noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"outboxd": "/bin/load -outboxd /bin/outboxd -database-url postgres://x/cmp_outboxd -database  -mode keepup -producers 16 -rate 1000 -duration 6m0s",
		"river":   "load -database-url postgres://x/cmp_river -mode keepup -producers 16 -rate 1000 -duration 6m0s -workers 1000",
	}
	for system, db := range map[string]string{"outboxd": "postgres://x/cmp_outboxd", "river": "postgres://x/cmp_river"} {
		argv := cfg.commands("held", system, db)
		if len(argv) != 1 {
			t.Fatalf("%s: %d commands, want 1", system, len(argv))
		}
		got := strings.Join(argv[0], " ")
		if system == "river" {
			got = strings.Join(argv[0][1:], " ") // argv[0] is this test binary
		}
		if got != want[system] {
			t.Errorf("%s's command:\n got %s\nwant %s", system, got, want[system])
		}
	}
	for _, args := range [][]string{
		{"-held-rate", "0"}, {"-held-sample", "0s"}, {"-held-from", "-1s"},
		{"-held-from", "280s"}, {"-held-until", "7m"}, {"-held-run", "4m"},
	} {
		if _, err := parseCompareConfig(append(slices.Clone(base), args...), noEnv, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	// The 20-minute variant the script's header names.
	if _, err := parseCompareConfig(append(slices.Clone(base), "-works", "held", "-held-run", "26m", "-held-until", "1240s"), noEnv, io.Discard); err != nil {
		t.Errorf("the 20-minute hold: %v", err)
	}
}

// The held rows read a keep-up run's lines (bench/load's and riverbench's
// are the same) and the line of the sample at the hold's end.
func TestCompareReadsTheHeldRows(t *testing.T) {
	t.Parallel()
	end := queueSample{system: "outboxd", deadTables: "outbox.* tables", deadRows: 912_345, waiting: 40, notFanned: 2}
	outboxd := "loadavg 0.50 0.40 0.30 2/300 1234\n$ /bin/load -mode keepup\n" +
		"held 40s: snapshot held, backend_xmin 1234 (REPEATABLE READ, idle in transaction until 280s); autovacuum on\n" +
		"held 45s: dead row versions 1200 (outbox.* tables), jobs waiting 3, events not fanned out 1\n" +
		end.endOfHold(280*time.Second) + "\n" +
		"committed 1000 events/s, delivered 980 events/s during the run\n" +
		"commit->2xx latency p50 12.5ms p95 45ms p99 1.2s max 3.4s\n"
	river := "committed 998 events/s, delivered 499 events/s during the run\n" +
		"commit->2xx latency p50 2ms p95 8ms p99 20ms max 100ms\n" +
		queueSample{system: "river", deadTables: "river_job", deadRows: 1_500_000, waiting: 7}.endOfHold(281*time.Second) + "\n"
	want := map[string][7]string{
		"outboxd": {"1,000", "0.980", "12.5", "45.0", "1200.0", "3400.0", "912,345"},
		"river":   {"998", "0.500", "2.00", "8.00", "20.0", "100.0", "1,500,000"},
	}
	var rows []metric
	for _, m := range metrics(compareConfig{HeldRate: 1000, HeldRun: 6 * time.Minute, HeldFrom: 40 * time.Second, HeldUntil: 280 * time.Second}) {
		if m.work == "held" {
			rows = append(rows, m)
		}
	}
	if len(rows) != 7 {
		t.Fatalf("%d held rows, want 7: the rate committed, delivered÷committed, p50, p95, p99, max, dead row versions", len(rows))
	}
	for system, out := range map[string]string{"outboxd": outboxd, "river": river} {
		for i, m := range rows {
			v, err := m.read(out)
			if err != nil {
				t.Errorf("%s, %s: %v", system, m.label, err)
				continue
			}
			if got := m.format(v); got != want[system][i] {
				t.Errorf("%s, %s: %s, want %s", system, m.label, got, want[system][i])
			}
		}
	}
	// A run whose hold never ended has no figure for it.
	if _, err := rows[6].read("committed 1000 events/s, delivered 980 events/s during the run\n"); err == nil {
		t.Error("a log without the hold's end: no error")
	}
}

// The hold holds: while it is open, another backend sees it idle in its
// transaction with the backend_xmin it reported, and a VACUUM can remove
// none of the rows deleted meanwhile (it cannot truncate the emptied
// table); once it is committed, the same VACUUM removes them all.
func TestHoldSnapshotKeepsVacuumFromRemovingRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := newTestDatabase(t)
	conn := connectTest(t, url)
	for _, sql := range []string{
		"CREATE TABLE held_rows (id int) WITH (autovacuum_enabled = off)",
		"INSERT INTO held_rows SELECT generate_series(1, 1000)",
	} {
		execTest(t, conn, sql)
	}
	hold, err := holdSnapshot(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.close()
	var state, xmin string
	if err := conn.QueryRow(ctx, "SELECT state, coalesce(backend_xmin::text, 'NULL') FROM pg_stat_activity WHERE pid = $1",
		hold.conn.PgConn().PID()).Scan(&state, &xmin); err != nil {
		t.Fatal(err)
	}
	if state != "idle in transaction" || xmin != hold.xmin || xmin == "" {
		t.Errorf("the hold's backend: state %q, backend_xmin %s; want idle in transaction, backend_xmin %q", state, xmin, hold.xmin)
	}
	execTest(t, conn, "DELETE FROM held_rows")
	execTest(t, conn, "VACUUM held_rows")
	if pages := tablePages(t, conn, "held_rows"); pages == 0 {
		t.Error("VACUUM during the hold emptied the table: the deleted rows were removable, no snapshot held them")
	}
	if _, err := hold.conn.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	execTest(t, conn, "VACUUM held_rows")
	if pages := tablePages(t, conn, "held_rows"); pages != 0 {
		t.Errorf("VACUUM after the hold left %d pages, want 0: something else held the horizon, so the test shows nothing", pages)
	}
}

// runHeld takes the snapshot at From, logs a sample every Every, and at
// Until logs the sample at the hold's end and releases it.
func TestRunHeldHoldsAndSamples(t *testing.T) {
	t.Parallel()
	url := newTestDatabase(t)
	conn := connectTest(t, url)
	// River's table as far as the samples read it.
	execTest(t, conn, "CREATE TABLE river_job (state text)")
	execTest(t, conn, "INSERT INTO river_job VALUES ('available'), ('available'), ('completed')")
	var log syncBuffer
	plan := heldPlan{DatabaseURL: url, System: "river", From: time.Second, Until: 2 * time.Second, Every: time.Second}
	if err := runHeld(t.Context(), []string{"sleep", "4"}, plan, &log); err != nil {
		t.Fatalf("runHeld: %v\n%s", err, log.String())
	}
	out := log.String()
	for _, re := range []string{
		`(?m)^held \d+s: snapshot held, backend_xmin \d+ \(REPEATABLE READ, idle in transaction until 2s\); autovacuum (on|off)$`,
		`(?m)^held \d+s: dead row versions \d+ \(river_job\), jobs waiting 2$`,
		`(?m)^held \d+s: snapshot released \(COMMIT\); dead row versions \d+ \(river_job\), jobs waiting 2; dead row versions at the end of the hold \d+$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no line matches %s in:\n%s", re, out)
		}
	}
	// Samples every second over a 4 s command: at least 3.
	if n := len(regexp.MustCompile(`(?m)^held \d+s: dead row versions`).FindAllString(out, -1)); n < 3 {
		t.Errorf("%d samples, want at least 3:\n%s", n, out)
	}
	// A closed connection's backend leaves pg_stat_activity a moment
	// after the client has gone.
	others := "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
	var open int
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := conn.QueryRow(t.Context(), others).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if open != 0 {
		t.Errorf("%d other backends left in the run's database, want 0: the hold's or a sample's connection outlived the run", open)
	}
}

// A hold that does not hit fails the run: the command ended before the
// hold's end, or the hold could not be taken (and then the command is
// stopped rather than run to its end).
func TestRunHeldFailsAMissedHold(t *testing.T) {
	t.Parallel()
	url := newTestDatabase(t)
	plan := heldPlan{DatabaseURL: url, System: "river", From: 0, Until: 10 * time.Second, Every: time.Second}
	err := runHeld(t.Context(), []string{"true"}, plan, io.Discard)
	if !errors.Is(err, errRunEnded) {
		t.Errorf("a command that ends before the hold's end: %v, want %v", err, errRunEnded)
	}
	plan.DatabaseURL = strings.TrimSuffix(url, "?sslmode=disable") + "_missing?sslmode=disable"
	start := time.Now()
	err = runHeld(t.Context(), []string{"sleep", "120"}, plan, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "held snapshot: connect") {
		t.Errorf("a hold on a missing database: %v, want the connect's error", err)
	}
	if elapsed := time.Since(start); elapsed > 100*time.Second {
		t.Errorf("the failed hold's command ran %s: it was not stopped", elapsed)
	}
}

// The outboxd sample reads outboxd's schema as the fresh install has it:
// an event recorded and not yet fanned out counts.
func TestOutboxdSampleReadsTheSchema(t *testing.T) {
	t.Parallel()
	url := newTestDatabase(t)
	conn := connectTest(t, url)
	schema, err := os.ReadFile("../../schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	execTest(t, conn, string(schema))
	execTest(t, conn, `SELECT outbox.record('load.event', 'k1', '{"load": true}')`)
	s, err := sampleQueue(t.Context(), url, "outboxd")
	if err != nil {
		t.Fatal(err)
	}
	if s.notFanned != 1 || s.waiting != 0 || s.deadRows < 0 {
		t.Errorf("sample %s: want events not fanned out 1, jobs waiting 0", s)
	}
}

var testDatabases atomic.Int64

// newTestDatabase creates an empty database on the test server
// (OUTBOXD_TEST_DATABASE_URL, else the local one), dropped at the test's
// end, and returns its URL. No server fails the test.
func newTestDatabase(t *testing.T) string {
	t.Helper()
	server := cmp.Or(os.Getenv("OUTBOXD_TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	name := fmt.Sprintf("riverbench_test_%d_%d", os.Getpid(), testDatabases.Add(1))
	ctx := context.Background()
	if err := dropDatabase(ctx, server, name); err != nil {
		t.Fatalf("PostgreSQL at %s (set OUTBOXD_TEST_DATABASE_URL to use another): %v", server, err)
	}
	if err := createDatabase(ctx, server, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dropDatabase(context.Background(), server, name); err != nil {
			t.Errorf("drop the test's database: %v", err)
		}
	})
	url, err := withDatabase(server, name)
	if err != nil {
		t.Fatal(err)
	}
	return url
}

func connectTest(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func execTest(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), sql); err != nil {
		t.Fatalf("%.60s: %v", sql, err)
	}
}

func tablePages(t *testing.T, conn *pgx.Conn, table string) int64 {
	t.Helper()
	var size int64
	if err := conn.QueryRow(t.Context(), "SELECT pg_relation_size($1::regclass)", table).Scan(&size); err != nil {
		t.Fatal(err)
	}
	return size / 8192
}
