package main

import (
	"math"
	"testing"
	"time"
)

// The same cases as bench/load's TestParseCPUTime: this is its copy.
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
// backends' share and the process's, and its rate over the clock's
// window; bench/load's TestCPUWindowLine checks the same with "outboxd".
func TestCPUWindowLine(t *testing.T) {
	t.Parallel()
	w := cpuWindow{Warmup: 10 * time.Second, Window: 40 * time.Second, Elapsed: 40 * time.Second, Metered: true,
		Process: 12360 * time.Millisecond, Backends: 23440 * time.Millisecond, Delivered: 40_000}
	for _, tc := range []struct {
		w    cpuWindow
		want string
	}{
		{w, "CPU window 40s after a 10s warm-up: delivered 40000 events, 1000 events/s; CPU time river 12.36 s, PostgreSQL backends 23.44 s: 0.895 ms per delivered event (PostgreSQL backends 0.586 ms, river 0.309 ms)"},
		{cpuWindow{Warmup: time.Second, Window: 2 * time.Second, Elapsed: 2500 * time.Millisecond, Metered: true,
			Process: 100 * time.Millisecond, Backends: 300 * time.Millisecond, Delivered: 50},
			"CPU window 2s after a 1s warm-up: delivered 50 events, 20 events/s; CPU time river 0.10 s, PostgreSQL backends 0.30 s: 8.000 ms per delivered event (PostgreSQL backends 6.000 ms, river 2.000 ms)"},
		{cpuWindow{Warmup: time.Second, Window: 2 * time.Second, Elapsed: 2 * time.Second, Metered: true, Process: time.Second},
			"CPU window 2s after a 1s warm-up: delivered 0 events, 0 events/s; CPU per delivered event unknown (none delivered)"},
		{cpuWindow{Warmup: time.Second, Window: 2 * time.Second, Elapsed: 2 * time.Second, Delivered: 40},
			"CPU window 2s after a 1s warm-up: delivered 40 events, 20 events/s; CPU time unknown (no /proc for river or the server's backends)"},
	} {
		if got := tc.w.line("river"); got != tc.want {
			t.Errorf("line of %+v:\n got %s\nwant %s", tc.w, got, tc.want)
		}
	}
	total, backends, process, ok := w.perEvent()
	if !ok || math.Abs(total-(backends+process)) > 1e-12 || math.Abs(total-0.895) > 1e-12 {
		t.Errorf("perEvent = %g, %g, %g, %t; want 0.895 = the backends' and the process's", total, backends, process, ok)
	}
}
