// load_test.go: the load generator's pacing.

package main

import (
	"context"
	"database/sql"
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

// A load run removes the endpoint it registered, so the next run's outboxd
// does not retry deliveries into the closed port of this run's receiver.
func TestLoadRunRemovesItsEndpoint(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	var out, errs syncBuffer
	err := run(context.Background(), []string{"load", "-mode", "drain", "-events", "50", "-database-url", dsn},
		func(string) string { return "" }, &out, &errs)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, errs.String())
	}
	if !strings.Contains(out.String(), "mode drain") {
		t.Errorf("load printed no drain report:\n%s", out.String())
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints left after the run, want 0; stderr:\n%s", n, errs.String())
	}
}

// An outboxd that refuses its settings ends the run at once, with the
// setting named in its output; the run waited a minute for it before.
func TestLoadEndsWhenOutboxdExitsBeforeReady(t *testing.T) {
	t.Parallel()
	_, dsn := newTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errs syncBuffer
	err := run(ctx, []string{"load", "-mode", "jobs", "-events", "10", "-serve-flags", "-workers 1001", "-database-url", dsn},
		func(string) string { return "" }, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("load with a refused -workers: %v, want outboxd's early exit", err)
	}
	if !strings.Contains(errs.String(), "-workers") {
		t.Errorf("outboxd's refusal naming -workers is not in the output:\n%s", errs.String())
	}
}

// The jobs mode works every job it enqueued, and says so only when all
// are completed.
func TestLoadJobsCompletesEveryJob(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	var out, errs syncBuffer
	err := run(context.Background(), []string{"load", "-mode", "jobs", "-events", "300", "-database-url", dsn},
		func(string) string { return "" }, &out, &errs)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, errs.String())
	}
	if !strings.Contains(out.String(), "mode jobs: 300 no-op jobs completed") {
		t.Errorf("jobs report:\n%s", out.String())
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'noop' AND state = 'completed'`); n != 300 {
		t.Errorf("%d no-op jobs completed, want 300", n)
	}
}

// The jobs mode's poll, every 50 ms through the run, reads one index entry
// to learn that work is left, however many jobs wait, and sees when none
// does. (A count of completed jobs read a row per completed job.)
func TestLoadJobsPollReadsOneEntry(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	mustExec(t, db, `SELECT outbox.record('load.event', '', '{}')`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts)
		SELECT 'noop', (SELECT max(id) FROM outbox.events), 18 FROM generate_series(1, 5000)`)
	poll := func(tx *sql.Tx) bool {
		t.Helper()
		unfinished, err := noopJobsUnfinished(context.Background(), tx)
		if err != nil {
			t.Fatal(err)
		}
		return unfinished
	}
	var unfinished bool
	scanned, entries := statementReads(t, db, "outbox.jobs", "outbox.jobs_waiting_without_endpoint", func(tx *sql.Tx) error {
		unfinished = poll(tx)
		return nil
	})
	if !unfinished || scanned != 0 || entries != 1 {
		t.Errorf("poll with 5,000 jobs waiting: unfinished %t, %d rows scanned, %d index entries read; want true, 0, 1",
			unfinished, scanned, entries)
	}
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', finalized_at = now()`)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if poll(tx) {
		t.Error("poll with every job completed: unfinished, want none")
	}
}

// -replicas 2 drains with two outboxd processes on one database: both
// claim deliveries (each job records its replica), every event arrives
// once, and each is fanned out once.
func TestLoadDrainWithTwoReplicasSharesTheWork(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	var out, errs syncBuffer
	// 4 workers each and 10,000 events: the drain outlasts the gap between
	// the two processes' starts, even under the race detector.
	err := run(context.Background(), []string{"load", "-mode", "drain", "-events", "10000", "-replicas", "2", "-serve-flags", "-workers 4", "-database-url", dsn},
		func(string) string { return "" }, &out, &errs)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, errs.String())
	}
	if !strings.Contains(out.String(), "duplicates 0, by 2 outboxd processes") {
		t.Errorf("drain report does not say 0 duplicates by 2 processes:\n%s", out.String())
	}
	// The CPU time the drain cost, of both processes and their backends
	// (the server is on this machine in every run of the tests).
	cpu := regexp.MustCompile(`CPU time: outboxd (\d+\.\d+) s, PostgreSQL backends (\d+\.\d+) s: (\d+\.\d+) ms per event`).FindStringSubmatch(out.String())
	if cpu == nil || cpu[1] == "0.00" || cpu[2] == "0.00" || cpu[3] == "0.000" {
		t.Errorf("drain report has no CPU time of outboxd and its backends:\n%s", out.String())
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

// A keep-up run reports what its events cost in CPU: outboxd's and the
// backends' (the producers' included) while the producers ran.
func TestLoadKeepUpReportsCPUTime(t *testing.T) {
	t.Parallel()
	_, dsn := newTestDB(t)
	var out, errs syncBuffer
	err := run(context.Background(), []string{"load", "-mode", "keepup", "-rate", "50", "-duration", "2s", "-database-url", dsn},
		func(string) string { return "" }, &out, &errs)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, errs.String())
	}
	m := regexp.MustCompile(`CPU time: outboxd (\d+\.\d+) s, PostgreSQL backends (\d+\.\d+) s: (\d+\.\d+) ms per event`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("keep-up report has no CPU time:\n%s", out.String())
	}
	for i, what := range []string{"outboxd", "backends", "per event"} {
		if v, _ := strconv.ParseFloat(m[i+1], 64); v <= 0 {
			t.Errorf("keep-up CPU time of %s is %s, want more than 0:\n%s", what, m[i+1], out.String())
		}
	}
}
