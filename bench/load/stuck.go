// stuck.go: -mode stuck, an ordered endpoint fed a steady rate over many
// subjects, in phases alternating between none failing and one subject's
// requests refused for -fail-for. Its target: the other subjects' p99
// with one failing at most lanesP99Bound times their p99 with none.

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// stuckFailStart is how far into a phase with a failing subject its
// requests start to be refused: the phase has run steadily by then. A
// phase shorter than four times it starts the failure a quarter in.
const stuckFailStart = 5 * time.Second

// stuckSummary is -mode stuck's result. The latencies are the other
// subjects' (every subject but the failing one, lane-0), over every round;
// Window... are those of the events committed while the subject's
// requests were refused, and in the phases without, in the same seconds
// of the phase.
type stuckSummary struct {
	Mode               string         `json:"mode"`
	Rate               float64        `json:"rate"`
	Subjects           int            `json:"subjects"`
	MaxInFlight        int            `json:"max_in_flight"`
	PhaseSeconds       float64        `json:"phase_seconds"`
	Rounds             int            `json:"rounds"`
	FailStartSeconds   float64        `json:"fail_start_seconds"`
	FailForSeconds     float64        `json:"fail_for_seconds"`
	Baseline           latencyFigures `json:"baseline"`
	Failing            latencyFigures `json:"failing"`
	P99Ratio           float64        `json:"p99_ratio"`
	P99RatioMet        bool           `json:"p99_ratio_met"` // ≤ 1.5
	BaselineP99ByRound []float64      `json:"baseline_p99_ms_by_round"`
	FailingP99ByRound  []float64      `json:"failing_p99_ms_by_round"`
	WindowBaseline     latencyFigures `json:"window_baseline"`
	WindowFailing      latencyFigures `json:"window_failing"`
	WindowP99Ratio     float64        `json:"window_p99_ratio"`
	StuckEvents        int            `json:"stuck_events"`  // the failing subject's, in the failing phases
	StuckRefused       int            `json:"stuck_refused"` // its requests answered 500
	StuckMaxMS         float64        `json:"stuck_max_ms"`  // its slowest event, commit->2xx
	HeldAfterSeconds   float64        `json:"held_after_s"`  // most, over rounds, from the refusals' end to its next 2xx
	OrderViolations    int            `json:"order_violations"`
	Unaccepted         int            `json:"unaccepted"`
}

// stuck is one run of the scenario. The failing subject is lane-0.
type stuck struct {
	cfg       config
	run       loadRun
	log       *acceptLog
	producer  laneProducer
	failStart time.Duration
	stuckIDs  idSet       // lane-0's events
	failing   atomic.Bool // lane-0's requests are refused
	mu        sync.Mutex  // protects refusals
	refusals  []time.Time
	s         stuckSummary
	all       []laneEvent // every measured phase's
	// The other subjects' latencies in the phases with none failing and
	// with lane-0 failing, and of the events committed in the window of
	// refusals (or the same seconds of a phase without).
	base, fail, windowBase, windowFail []time.Duration
}

// stuckPhase is one phase: its events, and when the refusals began and
// ended (in a phase without: when they would have).
type stuckPhase struct {
	events        []laneEvent
	failFrom, end time.Time
}

// runStuck runs the rounds, each a phase with every subject served and
// one with lane-0 refused. Rounds alternate which phase goes first (none
// failing, failing, failing, none failing, ...), so that whatever weighs
// on one place in a round weighs on both phases alike.
func runStuck(ctx context.Context, cfg config, run loadRun) error {
	if cfg.Subjects < 2 {
		return fmt.Errorf("-subjects must be at least 2 for -mode stuck (one fails, the others are measured), got %d", cfg.Subjects)
	}
	g := newRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	st := &stuck{cfg: cfg, run: run, log: newAcceptLog(), failStart: min(stuckFailStart, cfg.Duration/4)}
	recv, err := g.receiver(st.answer, true)
	if err != nil {
		return err
	}
	ep, err := g.endpoint(ctx, recv, endpointSettings{Topics: []string{"load.*"}, MaxInFlight: cfg.MaxInFlight, Ordering: orderingSubject})
	if err != nil {
		return err
	}
	st.producer = laneProducer{db: run.db, topic: "load.lanes", producers: cfg.Producers, rate: cfg.Rate, subjects: cfg.Subjects, mark: st.stuckIDs.add}
	st.s = stuckSummary{Mode: "stuck", Rate: cfg.Rate, Subjects: cfg.Subjects, MaxInFlight: ep.MaxInFlight,
		PhaseSeconds: cfg.Duration.Seconds(), Rounds: cfg.Rounds, FailStartSeconds: st.failStart.Seconds(), FailForSeconds: cfg.FailFor.Seconds()}
	if _, err := st.phase(ctx, min(isolationWarmUp, cfg.Duration), false); err != nil { // the warm-up, not measured
		return err
	}
	for round := range cfg.Rounds {
		order := []bool{false, true}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, failPhase := range order {
			if err := st.measure(ctx, failPhase); err != nil {
				return err
			}
		}
	}
	st.summarize()
	return st.report(run.stdout)
}

// answer refuses lane-0's requests while it fails, and accepts the rest.
func (st *stuck) answer(webhookID string) requestAnswer {
	if st.failing.Load() && st.stuckIDs.has(webhookID) {
		st.mu.Lock()
		st.refusals = append(st.refusals, time.Now())
		st.mu.Unlock()
		return requestAnswer{Wait: st.cfg.FailAfter, Status: http.StatusInternalServerError}
	}
	st.log.accept(webhookID)
	return requestAnswer{}
}

// phase runs the producers for d, refusing lane-0's requests from
// failStart for -fail-for if fail says so, and waits until every event
// committed was accepted.
func (st *stuck) phase(ctx context.Context, d time.Duration, fail bool) (stuckPhase, error) {
	runCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	start := time.Now()
	p := stuckPhase{failFrom: start.Add(st.failStart), end: start.Add(st.failStart + st.cfg.FailFor)}
	var wg sync.WaitGroup
	if fail {
		wg.Go(func() {
			if sleepCtx(ctx, st.failStart) != nil {
				return
			}
			p.failFrom = time.Now()
			st.failing.Store(true)
			sleepCtx(ctx, st.cfg.FailFor)
			st.failing.Store(false)
			p.end = time.Now()
		})
	}
	p.events, _ = st.producer.run(ctx, runCtx)
	wg.Wait()
	return p, st.log.await(ctx, p.events, 10*time.Minute)
}

// measure runs one counted phase and adds its latencies.
func (st *stuck) measure(ctx context.Context, failPhase bool) error {
	p, err := st.phase(ctx, st.cfg.Duration, failPhase)
	if err != nil {
		return err
	}
	st.all = append(st.all, p.events...)
	t, err := timings(ctx, st.run.db, p.events, st.log.of(p.events))
	if err != nil {
		return err
	}
	others := func(e laneEvent, _ laneTiming) bool { return e.Subject != 0 }
	inWindow := func(e laneEvent, t laneTiming) bool {
		return e.Subject != 0 && !t.Created.Before(p.failFrom) && t.Created.Before(p.end)
	}
	lat, window := sortedLatencies(p.events, t, others), sortedLatencies(p.events, t, inWindow)
	if !failPhase {
		st.base, st.windowBase = append(st.base, lat...), append(st.windowBase, window...)
		st.s.BaselineP99ByRound = append(st.s.BaselineP99ByRound, ms(quantile(lat, 0.99)))
		return nil
	}
	st.fail, st.windowFail = append(st.fail, lat...), append(st.windowFail, window...)
	st.s.FailingP99ByRound = append(st.s.FailingP99ByRound, ms(quantile(lat, 0.99)))
	st.noteStuckSubject(p, t)
	return nil
}

// noteStuckSubject adds what lane-0 went through in a failing phase.
// After its refusals its head waits for its retry: the schedule's, not
// the receiver's, time.
func (st *stuck) noteStuckSubject(p stuckPhase, t map[int64]laneTiming) {
	stuckLat := sortedLatencies(p.events, t, func(e laneEvent, _ laneTiming) bool { return e.Subject == 0 })
	st.s.StuckEvents += len(stuckLat)
	st.s.StuckMaxMS = max(st.s.StuckMaxMS, ms(quantile(stuckLat, 1)))
	accepted := st.log.of(p.events)
	var next time.Time
	for _, e := range p.events {
		if a, ok := accepted[e.ID]; ok && e.Subject == 0 && a.At.After(p.end) && (next.IsZero() || a.At.Before(next)) {
			next = a.At
		}
	}
	if !next.IsZero() {
		st.s.HeldAfterSeconds = max(st.s.HeldAfterSeconds, next.Sub(p.end).Seconds())
	}
}

// summarize fills in the figures over every round, and the verdict.
func (st *stuck) summarize() {
	s := &st.s
	st.mu.Lock()
	s.StuckRefused = len(st.refusals)
	st.mu.Unlock()
	accepted := st.log.of(st.all)
	s.OrderViolations, s.Unaccepted = orderViolations(st.all, accepted), len(st.all)-len(accepted)
	for _, l := range [][]time.Duration{st.base, st.fail, st.windowBase, st.windowFail} {
		slices.Sort(l)
	}
	s.Baseline, s.Failing, s.WindowBaseline, s.WindowFailing = figures(st.base), figures(st.fail), figures(st.windowBase), figures(st.windowFail)
	s.P99Ratio, s.P99RatioMet = p99Ratio(st.base, st.fail)
	s.WindowP99Ratio, _ = p99Ratio(st.windowBase, st.windowFail)
}

func (st *stuck) report(out io.Writer) error {
	s, cfg := st.s, st.cfg
	fmt.Fprintf(out, "mode stuck: an ordered endpoint (max_in_flight %d), %g events/s over %d subjects, warmed up %s, then %d round(s) of %s with none failing and %s with lane-0's requests answered 500 (after %s) from %s in for %s\n",
		s.MaxInFlight, cfg.Rate, cfg.Subjects, min(isolationWarmUp, cfg.Duration), cfg.Rounds, cfg.Duration, cfg.Duration, cfg.FailAfter, st.failStart, cfg.FailFor)
	for i := range s.BaselineP99ByRound {
		fmt.Fprintf(out, "round %d: other subjects' p99 with none failing %.1f ms, with lane-0 failing %.1f ms\n", i+1, s.BaselineP99ByRound[i], s.FailingP99ByRound[i])
	}
	fmt.Fprintf(out, "other subjects, none failing:  %s\n", s.Baseline)
	fmt.Fprintf(out, "other subjects, lane-0 failing: %s\n", s.Failing)
	fmt.Fprintf(out, "p99 failing / p99 none failing: %.2f (target <= %g): %s\n", s.P99Ratio, lanesP99Bound, verdict(s.P99RatioMet))
	fmt.Fprintf(out, "committed during the %s of refusals: %s; in the same seconds with none failing: %s; p99 ratio %.2f\n",
		cfg.FailFor, s.WindowFailing, s.WindowBaseline, s.WindowP99Ratio)
	fmt.Fprintf(out, "lane-0: %d events in the failing phases, %d requests answered 500, its slowest %.1f ms; its next 2xx came at most %.1f s after the refusals ended (the retry schedule)\n",
		s.StuckEvents, s.StuckRefused, s.StuckMaxMS, s.HeldAfterSeconds)
	fmt.Fprintf(out, "order: %d events accepted before their subject's previous one, %d never accepted, of %d\n", s.OrderViolations, s.Unaccepted, len(st.all))
	return writeSummary(out, s)
}
