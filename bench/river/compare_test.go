package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// outboxdCPULine is what bench/load's keepup prints with -warmup; its
// TestCPUWindowLine checks that it prints exactly this.
const outboxdCPULine = "CPU window 40s after a 10s warm-up: delivered 40000 events, 1000 events/s; CPU time outboxd 12.36 s, PostgreSQL backends 23.44 s: 0.895 ms per delivered event (PostgreSQL backends 0.586 ms, outboxd 0.309 ms)"

func TestParseCompareConfigCPU(t *testing.T) {
	t.Parallel()
	noEnv := func(string) string { return "" }
	base := []string{"-outboxd", "/bin/outboxd", "-load", "/bin/load", "-pgbench", "/bin/pgbench"}
	cfg, err := parseCompareConfig(base, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CPURate != 1000 || cfg.CPUWarmup != 10*time.Second || cfg.CPUWindow != 40*time.Second || !slices.Contains(cfg.Works, "cpu") {
		t.Errorf("defaults: -cpu-rate %g, -cpu-warmup %s, -cpu-window %s, works %v; want 1000, 10s, 40s and cpu among the works",
			cfg.CPURate, cfg.CPUWarmup, cfg.CPUWindow, cfg.Works)
	}
	cfg, err = parseCompareConfig(append(base, "-works", "cpu", "-cpu-rate", "500", "-cpu-window", "15s", "-cpu-warmup", "5s", "-producers", "8"), noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Both systems: keep-up at the rate, paced over the producers, the
	// window after the warm-up; River with its sender's workers.
	want := map[string]string{
		"outboxd": "/bin/load -outboxd /bin/outboxd -database-url postgres://x/cmp_outboxd -database  -mode keepup -producers 8 -rate 500 -warmup 5s -duration 15s",
		"river":   "load -database-url postgres://x/cmp_river -mode keepup -producers 8 -rate 500 -warmup 5s -duration 15s -workers 1000",
	}
	for system, db := range map[string]string{"outboxd": "postgres://x/cmp_outboxd", "river": "postgres://x/cmp_river"} {
		argv := cfg.commands("cpu", system, db)
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
	for _, args := range [][]string{{"-cpu-rate", "0"}, {"-cpu-window", "0s"}, {"-cpu-warmup", "0s"}, {"-works", "cpu,nap"}} {
		if _, err := parseCompareConfig(append(slices.Clone(base), args...), noEnv, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// The cpu rows read outboxd's line (bench/load's) and River's
// (riverbench's) alike.
func TestCompareReadsTheCPULines(t *testing.T) {
	t.Parallel()
	river := cpuWindow{Warmup: 10 * time.Second, Window: 40 * time.Second, Elapsed: 40 * time.Second, Metered: true,
		Process: 8 * time.Second, Backends: 32 * time.Second, Delivered: 39_990}.line("river")
	want := map[string][4]float64{
		"outboxd": {1000, 0.895, 0.586, 0.309},
		"river":   {1000, 1.000, 0.800, 0.200},
	}
	var rows []metric
	for _, m := range metrics(compareConfig{CPURate: 1000, CPUWindow: 40 * time.Second, CPUWarmup: 10 * time.Second}) {
		if m.work == "cpu" {
			rows = append(rows, m)
		}
	}
	if len(rows) != 4 {
		t.Fatalf("%d cpu rows, want 4: delivered/s, ms per event, the backends' and the process's", len(rows))
	}
	for system, line := range map[string]string{"outboxd": "loadavg 0.5\n" + outboxdCPULine + "\n", "river": river} {
		for i, m := range rows {
			v, err := m.read(line)
			if err != nil {
				t.Errorf("%s, %s: %v", system, m.label, err)
				continue
			}
			if got := m.format(v); got != m.format(want[system][i]) {
				t.Errorf("%s, %s: %s, want %s (line %q)", system, m.label, got, m.format(want[system][i]), line)
			}
		}
	}
	if got := rows[1].format(0.8951); got != "0.895" {
		t.Errorf("ms per event shown as %q, want 3 decimals", got)
	}
	// A window with nothing delivered has no figures to read.
	none := cpuWindow{Warmup: time.Second, Window: time.Second, Elapsed: time.Second, Metered: true, Process: time.Second, Backends: time.Second}.line("river")
	if _, err := rows[1].read(none); err == nil {
		t.Errorf("read %q: no error", none)
	}
}
