// ratelimit.go: -mode ratelimit, a backlog for a rate-limited endpoint
// delivered by several outboxd processes at once. Its target: in no
// window of rateWindow does the receiver see more than 1.10 times the
// limit allows, whichever process sends.

package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"
)

// rateWindow is the window the rate limit's target counts requests in.
const rateWindow = 5 * time.Second

// rateLimitSummary is -mode ratelimit's result.
type rateLimitSummary struct {
	Mode          string  `json:"mode"`
	Replicas      int     `json:"replicas"`
	Limit         float64 `json:"rate_limit_per_second"`
	MaxInFlight   int     `json:"max_in_flight"`
	Queued        int     `json:"queued"`
	Seconds       float64 `json:"seconds"`
	Requests      int     `json:"requests"`
	MeanPerSecond float64 `json:"mean_per_second"` // first to last request
	MaxIn5s       int     `json:"max_in_5s"`
	Allowed5s     float64 `json:"limit_times_5s"`
	Ratio         float64 `json:"ratio"`
	Met           bool    `json:"met"` // ratio ≤ 1.10
	PerReplica    []int64 `json:"per_replica_attempts"`
}

// runRateLimit queues a backlog for a rate-limited endpoint and lets
// -replicas children deliver it for -duration.
func runRateLimit(ctx context.Context, cfg config, run loadRun) error {
	g := newRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	recv, err := g.receiver(nil, true)
	if err != nil {
		return err
	}
	// With the default cap, the replica that claims first keeps the
	// lane: its workers hold the cap's jobs, each waiting its turn under
	// the limit, and claim again as soon as their outcomes commit, before
	// the other replica's poll. A larger -max-in-flight lets both deliver.
	ep, err := g.endpoint(ctx, recv, endpointSettings{Topics: []string{"load.*"}, RateLimitPerSecond: cfg.RateLimit, MaxInFlight: cfg.MaxInFlight})
	if err != nil {
		return err
	}
	// The backlog is recorded with no outboxd running, so that every
	// replica starts with all of it waiting.
	g.stopChildren()
	if err := recordBulk(ctx, run.db, "load.limited", cfg.Events); err != nil {
		return err
	}
	start := time.Now()
	if err := g.start(ctx, cfg.Replicas); err != nil {
		return err
	}
	if err := sleepCtx(ctx, cfg.Duration-time.Since(start)); err != nil {
		return err
	}
	s := rateLimitSummary{Mode: "ratelimit", Replicas: cfg.Replicas, Limit: cfg.RateLimit, MaxInFlight: ep.MaxInFlight, Queued: cfg.Events,
		Seconds: time.Since(start).Seconds(), Allowed5s: cfg.RateLimit * rateWindow.Seconds()}
	for _, c := range g.children {
		n, err := c.DeliveryAttempts(ctx)
		if err != nil {
			return err
		}
		s.PerReplica = append(s.PerReplica, n)
	}
	g.finish(ctx)
	if err := recv.AwaitIdle(ctx, 10*time.Second); err != nil {
		return err
	}
	s.judge(recv.Spans())
	return s.report(run.stdout)
}

// judge counts the requests the receiver saw against the limit.
func (s *rateLimitSummary) judge(spans []requestSpan) {
	arrivals := make([]time.Time, len(spans))
	for i, sp := range spans {
		arrivals[i] = sp.Start
	}
	s.Requests, s.MaxIn5s = len(spans), maxInWindow(arrivals, rateWindow)
	if len(spans) > 1 {
		slices.SortFunc(arrivals, time.Time.Compare)
		s.MeanPerSecond = float64(len(spans)-1) / arrivals[len(arrivals)-1].Sub(arrivals[0]).Seconds()
	}
	s.Ratio = float64(s.MaxIn5s) / s.Allowed5s
	s.Met = s.Ratio <= 1.10
}

func (s rateLimitSummary) report(out io.Writer) error {
	fmt.Fprintf(out, "mode ratelimit: %d replicas, rate_limit_per_second %g, max_in_flight %d, %d deliveries queued, delivering for %s\n",
		s.Replicas, s.Limit, s.MaxInFlight, s.Queued, time.Duration(s.Seconds*float64(time.Second)).Round(time.Millisecond))
	fmt.Fprintf(out, "the receiver saw %d requests, %.2f/s from first to last; webhook attempts by replica %v\n", s.Requests, s.MeanPerSecond, s.PerReplica)
	fmt.Fprintf(out, "busiest %s window: %d requests; limit x %s = %g: %.3f of it (target <= 1.10): %s\n",
		rateWindow, s.MaxIn5s, rateWindow, s.Allowed5s, s.Ratio, verdict(s.Met))
	return writeSummary(out, s)
}
