// pipeline.go: the two modes that measure the whole pipeline, from
// outbox.record to a verified 2xx: drain (a backlog delivered from a cold
// start) and keepup (producers and delivery at once). Comparison scripts
// (bench/river, bench/perf.sh) parse their lines: keep the formats.

package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

// pipelineEndpoint starts one child and registers one plain receiver for
// every load.* event. The endpoint may run as many deliveries at once as
// the child has workers: drain and keepup measure the pipeline, not the
// per-endpoint cap (max_in_flight, 16 by default), which would otherwise
// hold one endpoint to an eighth of the default 128 workers. The child
// inherits this process's environment, so OUTBOXD_WORKERS counts as it
// does for the child. With defaults (-default-endpoint) the endpoint has
// outboxd's own settings instead: what a new user's endpoint gets.
func (g *rig) pipelineEndpoint(ctx context.Context, defaults bool) (*receiver, error) {
	if err := g.start(ctx, 1); err != nil {
		return nil, err
	}
	recv, err := g.receiver(nil, false)
	if err != nil {
		return nil, err
	}
	settings := endpointSettings{Topics: []string{"load.*"}, MaxInFlight: childWorkers(g.extra, os.Getenv)}
	if defaults {
		settings.MaxInFlight = 0
	}
	ep, err := g.endpoint(ctx, recv, settings)
	if err == nil {
		fmt.Fprintf(g.stdout, "endpoint max_in_flight %d\n", ep.MaxInFlight)
	}
	return recv, err
}

// runDrain stops outboxd, records -events, starts -replicas outboxd
// processes and times the delivery of every event.
func runDrain(ctx context.Context, cfg config, run loadRun) error {
	g := newRig(cfg, run)
	defer g.Close(ctx)
	recv, err := g.pipelineEndpoint(ctx, cfg.DefaultEndpoint)
	if err != nil {
		return err
	}
	g.stopChildren()
	if err := recordBulk(ctx, run.db, "load.event", cfg.Events); err != nil {
		return err
	}
	start := time.Now()
	cpu := startCPUMeter(ctx, run.db)
	if err := g.start(ctx, cfg.Replicas); err != nil {
		return err
	}
	g.measure(cpu)
	if err := recv.AwaitUnique(ctx, int64(cfg.Events), 30*time.Minute); err != nil {
		return err
	}
	elapsed := time.Since(start)
	fmt.Fprintf(run.stdout, "mode drain: %d events delivered in %s: %.0f events/s; duplicates %d%s\n",
		cfg.Events, elapsed.Round(time.Millisecond), float64(cfg.Events)/elapsed.Seconds(), recv.Duplicates(), replicasNote(cfg.Replicas))
	fmt.Fprintln(run.stdout, cpu.Report(ctx, cfg.Events, "event"))
	fmt.Fprintf(run.stdout, "outboxd peak RSS %s\n", g.children[0].PeakRSS())
	return nil
}

// replicasNote names how many outboxd processes did the work, if more
// than one; the peak RSS printed after it is the first one's.
func replicasNote(n int) string {
	if n == 1 {
		return ""
	}
	return fmt.Sprintf(", by %d outboxd processes (peak RSS: the first's)", n)
}

// runKeepUp runs the producers for -duration while outboxd delivers, then
// waits for the backlog to drain. With -warmup they run that long first,
// and the CPU time is metered over -duration alone (meterWindow).
func runKeepUp(ctx context.Context, cfg config, run loadRun) error {
	g := newRig(cfg, run)
	defer g.Close(ctx)
	recv, err := g.pipelineEndpoint(ctx, cfg.DefaultEndpoint)
	if err != nil {
		return err
	}
	var cpu *cpuMeter
	window := make(chan string, 1)
	if cfg.Warmup > 0 {
		go func() { window <- g.meterWindow(ctx, recv, cfg.Warmup, cfg.Duration) }()
	} else {
		cpu = startCPUMeter(ctx, run.db)
		g.measure(cpu)
	}
	before, err := costReading(ctx, g.children[0])
	if err != nil {
		return err
	}
	committed, elapsed := produce(ctx, run.db, "load.event", "p", cfg.Producers, cfg.Rate, cfg.Warmup+cfg.Duration)
	deliveredDuring := recv.Unique()
	after, err := costReading(ctx, g.children[0])
	if err != nil {
		return err
	}
	var cost workerCost
	cost.add(before, after, elapsed)
	// The producers' backends count too: at a steady rate an event's
	// statements (its insert, a relay pass, an outcome) cost more than the
	// rows they carry, and a change to any of them shows here.
	var cpuReport string
	if cpu != nil {
		cpuReport = cpu.Report(ctx, int(committed), "event")
	} else {
		cpuReport = <-window
	}
	left, err := backlog(ctx, run.db)
	if err != nil {
		return err
	}
	drainStart := time.Now()
	if err := recv.AwaitUnique(ctx, committed, 10*time.Minute); err != nil {
		return err
	}
	drain := time.Since(drainStart)
	p := recv.Percentiles()
	out := run.stdout
	fmt.Fprintf(out, "mode keepup: producers %d, duration %s\n", cfg.Producers, elapsed.Round(time.Millisecond))
	fmt.Fprintf(out, "committed %.0f events/s, delivered %.0f events/s during the run\n",
		float64(committed)/elapsed.Seconds(), float64(deliveredDuring)/elapsed.Seconds())
	fmt.Fprintf(out, "commit->2xx latency p50 %s p95 %s p99 %s max %s\n", p[0], p[1], p[2], p[3])
	fmt.Fprintln(out, cpuReport)
	fmt.Fprintf(out, "backlog at end %d (events + jobs), drained in %s; duplicates %d\n", left, drain.Round(time.Millisecond), recv.Duplicates())
	fmt.Fprintf(out, "workers during the run: %s\n", cost.figures())
	fmt.Fprintf(out, "outboxd peak RSS %s\n", g.children[0].PeakRSS())
	return nil
}

// meterWindow waits warmup, then meters the CPU time of the running
// children and of the database's backends (the producers' included) for
// d, and answers the window's line: its CPU time per event the receiver
// first saw in it. The producers run warmup+d from about when it starts,
// so the window ends about when they stop.
func (g *rig) meterWindow(ctx context.Context, recv *receiver, warmup, d time.Duration) string {
	w := cpuWindow{Warmup: warmup, Window: d}
	if sleepCtx(ctx, warmup) != nil {
		return w.line("outboxd")
	}
	cpu := startCPUMeter(ctx, g.db)
	g.measure(cpu)
	start, first := time.Now(), recv.Unique()
	sleepCtx(ctx, d)
	w.Delivered, w.Elapsed = recv.Unique()-first, time.Since(start)
	w.Process, w.Backends, w.Metered = cpu.Stop(ctx)
	return w.line("outboxd")
}
