// load_test.go: the generator's pacing, its reading of /proc, and drain
// and keepup run end to end against a real outboxd.

package main

import (
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestProducerPhasesSpreadOverOneInterval(t *testing.T) {
	t.Parallel()
	// 16 producers at 20 events/s: one tick each every 800 ms, 50 ms apart.
	const n = 16
	interval := 800 * time.Millisecond
	var got []time.Duration
	for p := range n {
		got = append(got, producerPhase(p, n, interval))
	}
	var want []time.Duration
	for p := range n {
		want = append(want, time.Duration(p)*50*time.Millisecond)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("producer phases (-want +got):\n%s", diff)
	}
}

// Paced producers keep their connections between ticks: a pool that
// closed them would have most commits connect anew, a backend started
// each time, and the run would measure that instead of the commits.
func TestPacedProducersKeepTheirConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := config{Outboxd: outboxdBinary(t), DatabaseURL: serverURL(), Database: testDatabaseName(), Producers: 16}
	db, _, drop, err := openRunDatabase(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	defer db.Close()
	// 20 ms a statement: at 400 a second, about 8 producers are in a
	// statement at once and the others idle, as in a paced run.
	committed, _ := produceWith(ctx, db, `SELECT pg_sleep(0.02), $1::text, $2::text`, "t", "s", cfg.Producers, 400, time.Second)
	if committed < 100 {
		t.Fatalf("%d statements in a second at 400/s: the test measured nothing", committed)
	}
	if st := db.Stats(); st.MaxIdleClosed > 0 || st.OpenConnections > cfg.Producers {
		t.Errorf("after %d paced statements: %d connections closed for want of idle room, %d open; want 0 closed, at most %d open",
			committed, st.MaxIdleClosed, st.OpenConnections, cfg.Producers)
	}
}

// A run in a database of the user's (-database "") removes the endpoint
// it registered, so the next run's outboxd does not retry deliveries into
// the closed port of this run's receiver.
func TestLoadRunRemovesItsEndpoint(t *testing.T) {
	t.Parallel()
	db, url := newTestDB(t)
	out, stderr := runLoad(t, "-mode", "drain", "-events", "50", "-database-url", url, "-database", "")
	if !strings.Contains(out, "mode drain: 50 events delivered") {
		t.Errorf("load printed no drain report:\n%s", out)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints left after the run, want 0; stderr:\n%s", n, stderr)
	}
}

// With -database, the run creates that database, and drops it at the end.
func TestLoadRunDropsItsFreshDatabase(t *testing.T) {
	t.Parallel()
	admin, _ := newTestDB(t) // any database on the server, to look from
	name := testDatabaseName()
	out, _ := runLoad(t, "-mode", "drain", "-events", "20", "-database-url", serverURL(), "-database", name)
	if !strings.Contains(out, "mode drain: 20 events delivered") {
		t.Errorf("load printed no drain report:\n%s", out)
	}
	if n := queryInt(t, admin, `SELECT count(*) FROM pg_database WHERE datname = $1`, name); n != 0 {
		t.Errorf("database %s still exists after the run", name)
	}
}

// An outboxd that refuses its settings ends the run at once, with the
// setting named in its output, instead of after the minute a start may
// take.
func TestLoadEndsWhenOutboxdExitsBeforeReady(t *testing.T) {
	t.Parallel()
	bin := outboxdBinary(t)
	_, url := newTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errs syncBuffer
	err := run(ctx, []string{"-outboxd", bin, "-mode", "drain", "-events", "10", "-serve-flags", "-workers 1001", "-database-url", url, "-database", ""},
		func(string) string { return "" }, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("load with a refused -workers: %v, want outboxd's early exit", err)
	}
	if !strings.Contains(errs.String(), "-workers") {
		t.Errorf("outboxd's refusal naming -workers is not in the output:\n%s", errs.String())
	}
}

// cpuLine is the CPU report's line of drain and keepup.
var cpuLine = regexp.MustCompile(`CPU time: outboxd (\d+\.\d+) s, PostgreSQL backends (\d+\.\d+) s: (\d+\.\d+) ms per event`)

// -replicas 2 drains with two outboxd processes on one database: both
// claim deliveries (each job records its replica), every event arrives
// once, and each is fanned out once.
func TestLoadDrainWithTwoReplicasSharesTheWork(t *testing.T) {
	t.Parallel()
	db, url := newTestDB(t)
	// 4 workers each and 10,000 events: the drain outlasts the gap between
	// the two processes' starts.
	out, _ := runLoad(t, "-mode", "drain", "-events", "10000", "-replicas", "2", "-serve-flags", "-workers 4", "-database-url", url, "-database", "")
	if !strings.Contains(out, "duplicates 0, by 2 outboxd processes") {
		t.Errorf("drain report does not say 0 duplicates by 2 processes:\n%s", out)
	}
	// The CPU time the drain cost, of both processes and their backends
	// (the server is on this machine in every run of the tests).
	cpu := cpuLine.FindStringSubmatch(out)
	if cpu == nil || cpu[1] == "0.00" || cpu[2] == "0.00" || cpu[3] == "0.000" {
		t.Errorf("drain report has no CPU time of outboxd and its backends:\n%s", out)
	}
	if !regexp.MustCompile(`outboxd peak RSS \d+\.\d MiB`).MatchString(out) {
		t.Errorf("drain report has no peak RSS:\n%s", out)
	}
	if n := queryInt(t, db, `SELECT count(DISTINCT held_by) FROM outbox.jobs WHERE kind = 'webhook' AND state = 'completed'`); n != 2 {
		t.Errorf("deliveries claimed by %d replicas, want 2", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM (SELECT event_id FROM outbox.jobs WHERE kind = 'webhook' GROUP BY event_id HAVING count(*) > 1) AS twice`); n != 0 {
		t.Errorf("%d events fanned out twice", n)
	}
}

// A /proc/PID/stat line's user and system times (fields 14 and 15, in
// clock ticks of 10 ms), after a command name that holds ") " itself.
func TestParseCPUTime(t *testing.T) {
	t.Parallel()
	line := "4242 (post) gres: x) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 130 0 0 20 0 1 0 100 2000000 500 18446744073709551615\n"
	got, ok := parseCPUTime(line)
	if !ok || got != 3800*time.Millisecond {
		t.Errorf("parseCPUTime = %s, %t; want 3.8s (250 + 130 ticks)", got, ok)
	}
	for _, bad := range []string{"", "4242 (cut", "4242 (x) S 1 2 3"} {
		if got, ok := parseCPUTime(bad); ok {
			t.Errorf("parseCPUTime(%q) = %s, ok; want refused", bad, got)
		}
	}
}

// A window's line: its CPU time per delivered event in all, the
// backends' share and the process's, and its rate over the clock's window.
// bench/river's compare_test.go reads the first line as outboxd's: keep
// them alike.
func TestCPUWindowLine(t *testing.T) {
	t.Parallel()
	w := cpuWindow{Warmup: 10 * time.Second, Window: 40 * time.Second, Elapsed: 40 * time.Second, Metered: true,
		Process: 12360 * time.Millisecond, Backends: 23440 * time.Millisecond, Delivered: 40_000}
	for _, tc := range []struct {
		w    cpuWindow
		want string
	}{
		{w, "CPU window 40s after a 10s warm-up: delivered 40000 events, 1000 events/s; CPU time outboxd 12.36 s, PostgreSQL backends 23.44 s: 0.895 ms per delivered event (PostgreSQL backends 0.586 ms, outboxd 0.309 ms)"},
		// The rate is over the window the clock measured, not the one asked.
		{cpuWindow{Warmup: time.Second, Window: 2 * time.Second, Elapsed: 2500 * time.Millisecond, Metered: true,
			Process: 100 * time.Millisecond, Backends: 300 * time.Millisecond, Delivered: 50},
			"CPU window 2s after a 1s warm-up: delivered 50 events, 20 events/s; CPU time outboxd 0.10 s, PostgreSQL backends 0.30 s: 8.000 ms per delivered event (PostgreSQL backends 6.000 ms, outboxd 2.000 ms)"},
		{cpuWindow{Warmup: time.Second, Window: 2 * time.Second, Elapsed: 2 * time.Second, Metered: true, Process: time.Second},
			"CPU window 2s after a 1s warm-up: delivered 0 events, 0 events/s; CPU per delivered event unknown (none delivered)"},
		{cpuWindow{Warmup: time.Second, Window: 2 * time.Second, Elapsed: 2 * time.Second, Delivered: 40},
			"CPU window 2s after a 1s warm-up: delivered 40 events, 20 events/s; CPU time unknown (no /proc for outboxd or the server's backends)"},
	} {
		if got := tc.w.line("outboxd"); got != tc.want {
			t.Errorf("line of %+v:\n got %s\nwant %s", tc.w, got, tc.want)
		}
	}
	total, backends, process, ok := w.perEvent()
	if !ok || !near(total, backends+process, 1e-12) || !near(total, 35.8/40, 1e-12) {
		t.Errorf("perEvent = %g, %g, %g, %t; want 0.895 = the backends' and the process's", total, backends, process, ok)
	}
	if r := (cpuWindow{Delivered: 5}).rate(); r != 0 {
		t.Errorf("rate of a window with no time = %g, want 0", r)
	}
}

// A keep-up run prints the lines comparison scripts parse, and what its
// events cost in CPU: outboxd's and the backends' (the producers'
// included) while the producers ran.
func TestLoadKeepUpReportsRatesLatencyAndCPUTime(t *testing.T) {
	t.Parallel()
	out, _ := runLoad(t, "-mode", "keepup", "-rate", "50", "-duration", "2s", "-database-url", serverURL(), "-database", testDatabaseName())
	for _, re := range []string{
		`committed \d+ events/s, delivered \d+ events/s during the run`,
		`commit->2xx latency p50 \S+ p95 \S+ p99 \S+ max \S+`,
		`backlog at end \d+ \(events \+ jobs\), drained in \S+; duplicates 0`,
		`outboxd peak RSS \d+\.\d MiB`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("keep-up report has no line matching %q:\n%s", re, out)
		}
	}
	m := cpuLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("keep-up report has no CPU time:\n%s", out)
	}
	for i, what := range []string{"outboxd", "backends", "per event"} {
		if v, _ := strconv.ParseFloat(m[i+1], 64); v <= 0 {
			t.Errorf("keep-up CPU time of %s is %s, want more than 0:\n%s", what, m[i+1], out)
		}
	}
}

// cpuWindowLine is keepup's line with -warmup.
var cpuWindowLine = regexp.MustCompile(`CPU window 2s after a 1s warm-up: delivered (\d+) events, (\d+) events/s; CPU time outboxd (\d+\.\d+) s, PostgreSQL backends (\d+\.\d+) s: (\d+\.\d+) ms per delivered event \(PostgreSQL backends (\d+\.\d+) ms, outboxd (\d+\.\d+) ms\)`)

// With -warmup, keep-up meters the window after it: the events delivered
// in it and their CPU time, in place of the whole run's CPU line.
func TestLoadKeepUpMetersTheWindowAfterAWarmUp(t *testing.T) {
	t.Parallel()
	out, _ := runLoad(t, "-mode", "keepup", "-rate", "50", "-warmup", "1s", "-duration", "2s", "-database-url", serverURL(), "-database", testDatabaseName())
	if cpuLine.MatchString(out) {
		t.Errorf("keep-up with -warmup prints the whole run's CPU line too:\n%s", out)
	}
	m := cpuWindowLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("keep-up with -warmup has no CPU window line:\n%s", out)
	}
	// 50 events/s over a 2 s window: about 100 delivered in it, of the
	// about 150 the run commits.
	if n, _ := strconv.Atoi(m[1]); n < 50 || n > 150 {
		t.Errorf("%d events delivered in the 2 s window at 50 events/s, want about 100:\n%s", n, out)
	}
	for i, what := range []string{"outboxd's time", "the backends' time", "ms per event", "the backends' ms", "outboxd's ms"} {
		if v, _ := strconv.ParseFloat(m[i+3], 64); v <= 0 {
			t.Errorf("window's %s is %s, want more than 0:\n%s", what, m[i+3], out)
		}
	}
}
