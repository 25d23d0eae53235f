// load_test.go: the load generator's pacing.

package main

import (
	"context"
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
