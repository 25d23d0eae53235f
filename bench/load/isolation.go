// isolation.go: -mode isolation, a healthy endpoint's latency alone and
// beside an endpoint whose receiver hangs with a backlog queued for it:
// it answers 500 after -fail-after or, with -answer-after, 200 after that.
// Its target: the healthy p99 beside the bad endpoint at most twice the
// p99 alone, and the bad receiver never holding more requests than its
// cap.

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"
)

// isolationWarmUp is how long a scenario's producers run, not measured,
// before its first baseline: the first seconds after a child's start are
// not its steady state (its pool opens connections, each new session
// plans the claim anew).
const isolationWarmUp = 5 * time.Second

// isolationSummary is -mode isolation's result; the latencies are over
// every round, and the ...ByRound lists give each round's.
type isolationSummary struct {
	Mode                 string    `json:"mode"`
	Rate                 float64   `json:"rate"`
	PhaseSeconds         float64   `json:"phase_seconds"`
	Rounds               int       `json:"rounds"`
	BaselineEvents       int       `json:"baseline_events"`
	BaselineP50MS        float64   `json:"baseline_p50_ms"`
	BaselineP99MS        float64   `json:"baseline_p99_ms"`
	BesideEvents         int       `json:"beside_events"`
	BesideP50MS          float64   `json:"beside_p50_ms"`
	BesideP99MS          float64   `json:"beside_p99_ms"`
	P99Ratio             float64   `json:"p99_ratio"`
	P99RatioMet          bool      `json:"p99_ratio_met"` // ≤ 2
	BaselineP99MSByRound []float64 `json:"baseline_p99_ms_by_round"`
	BesideP99MSByRound   []float64 `json:"beside_p99_ms_by_round"`
	BadQueued            int       `json:"bad_queued"`
	BadRequests          int       `json:"bad_requests"`
	BadMaxInFlight       int       `json:"bad_max_in_flight"`
	BadCap               int       `json:"bad_cap"`
	BadCapMet            bool      `json:"bad_cap_met"`
	BadBreakerState      string    `json:"bad_breaker_state"`
}

// isolation is one run of the scenario: its rig, the two receivers and
// the latencies measured so far.
type isolation struct {
	cfg       config
	run       loadRun
	g         *rig
	healthy   *receiver
	bad       *receiver
	badEP     endpoint
	delivered int64 // healthy events accepted so far
	base      []time.Duration
	beside    []time.Duration
	baseP99   []time.Duration
	besideP99 []time.Duration
}

// runIsolation measures the healthy endpoint's latency alone (the
// baseline), then beside a hanging endpoint with a backlog, in one run.
// Later rounds (-rounds) pause the bad endpoint for their baseline, once
// its receiver has no request open, and resume it for the phase beside
// it: background load that drifts over minutes then weighs on both sides.
func runIsolation(ctx context.Context, cfg config, run loadRun) error {
	g := newRig(cfg, run)
	defer g.Close(ctx)
	s := &isolation{cfg: cfg, run: run, g: g}
	if err := s.setUp(ctx); err != nil {
		return err
	}
	for round := 1; round <= cfg.Rounds; round++ {
		if err := s.round(ctx, round); err != nil {
			return err
		}
	}
	badState, err := g.children[0].Endpoint(ctx, s.badEP.ID)
	if err != nil {
		return err
	}
	g.finish(ctx)
	if err := s.bad.AwaitIdle(ctx, s.badAnswer().Wait+10*time.Second); err != nil {
		return err
	}
	return s.report(run.stdout, badState.Breaker.State)
}

// setUp starts the child and the healthy endpoint, and warms it up.
func (s *isolation) setUp(ctx context.Context) error {
	if err := s.g.start(ctx, 1); err != nil {
		return err
	}
	var err error
	if s.healthy, err = s.g.receiver(nil, false); err != nil {
		return err
	}
	if _, err := s.g.endpoint(ctx, s.healthy, endpointSettings{Topics: []string{"load.healthy"}}); err != nil {
		return err
	}
	_, err = s.phase(ctx, "warm-", min(isolationWarmUp, s.cfg.Duration))
	return err
}

// phase runs the healthy producers for d and returns the latencies of
// what they committed, sorted.
func (s *isolation) phase(ctx context.Context, name string, d time.Duration) ([]time.Duration, error) {
	committed, _ := produce(ctx, s.run.db, "load.healthy", name, s.cfg.Producers, s.cfg.Rate, d)
	if err := s.healthy.AwaitUnique(ctx, s.delivered+committed, 10*time.Minute); err != nil {
		return nil, err
	}
	lat := s.healthy.Latencies(int(s.delivered))
	s.delivered += committed
	slices.Sort(lat)
	return lat, nil
}

// round runs a baseline phase and a phase beside the bad endpoint: the
// first round creates it, the later ones pause it for the baseline.
func (s *isolation) round(ctx context.Context, round int) error {
	child := s.g.children[0]
	if round > 1 {
		if err := child.EndpointAction(ctx, s.badEP.ID, "pause"); err != nil {
			return err
		}
		if err := s.bad.AwaitIdle(ctx, s.badAnswer().Wait+10*time.Second); err != nil {
			return err
		}
	}
	lat, err := s.phase(ctx, fmt.Sprintf("base%d-", round), s.cfg.Duration)
	if err != nil {
		return err
	}
	s.base, s.baseP99 = append(s.base, lat...), append(s.baseP99, quantile(lat, 0.99))
	if round == 1 {
		err = s.queueBad(ctx)
	} else {
		err = child.EndpointAction(ctx, s.badEP.ID, "resume")
	}
	if err != nil {
		return err
	}
	if lat, err = s.phase(ctx, fmt.Sprintf("beside%d-", round), s.cfg.Duration); err != nil {
		return err
	}
	s.beside, s.besideP99 = append(s.beside, lat...), append(s.besideP99, quantile(lat, 0.99))
	return nil
}

// queueBad creates the bad endpoint and its backlog, fanned out into its
// jobs before the phase beside it starts: what is measured is the
// workers' isolation, not the relay's pass over the backlog.
func (s *isolation) queueBad(ctx context.Context) error {
	var err error
	s.bad, err = s.g.receiver(func(string) requestAnswer { return s.badAnswer() }, true)
	if err != nil {
		return err
	}
	if s.badEP, err = s.g.endpoint(ctx, s.bad, endpointSettings{Topics: []string{"load.bad"}, MaxInFlight: s.cfg.MaxInFlight}); err != nil {
		return err
	}
	if err := recordBulk(ctx, s.run.db, "load.bad", s.cfg.Events); err != nil {
		return err
	}
	return awaitFannedOut(ctx, s.run.db, "load.bad")
}

// badAnswer is how the bad receiver answers every request: 204 after
// -answer-after if it is set (a slow receiver), else 500 after -fail-after.
func (s *isolation) badAnswer() requestAnswer {
	if s.cfg.AnswerAfter > 0 {
		return requestAnswer{Wait: s.cfg.AnswerAfter, Status: http.StatusNoContent}
	}
	return requestAnswer{Wait: s.cfg.FailAfter, Status: http.StatusInternalServerError}
}

// summary is the run's result, with the verdicts.
func (s *isolation) summary(badState string) isolationSummary {
	slices.Sort(s.base)
	slices.Sort(s.beside)
	sum := isolationSummary{Mode: "isolation", Rate: s.cfg.Rate, PhaseSeconds: s.cfg.Duration.Seconds(), Rounds: s.cfg.Rounds,
		BaselineEvents: len(s.base), BaselineP50MS: ms(quantile(s.base, 0.5)), BaselineP99MS: ms(quantile(s.base, 0.99)),
		BesideEvents: len(s.beside), BesideP50MS: ms(quantile(s.beside, 0.5)), BesideP99MS: ms(quantile(s.beside, 0.99)),
		BadQueued: s.cfg.Events, BadRequests: len(s.bad.Spans()), BadMaxInFlight: s.bad.MaxOpen(), BadCap: s.badEP.MaxInFlight,
		BadBreakerState: badState}
	for i := range s.baseP99 {
		sum.BaselineP99MSByRound = append(sum.BaselineP99MSByRound, ms(s.baseP99[i]))
		sum.BesideP99MSByRound = append(sum.BesideP99MSByRound, ms(s.besideP99[i]))
	}
	if sum.BaselineP99MS > 0 {
		sum.P99Ratio = sum.BesideP99MS / sum.BaselineP99MS
	}
	sum.P99RatioMet = sum.P99Ratio > 0 && sum.P99Ratio <= 2
	sum.BadCapMet = sum.BadMaxInFlight <= sum.BadCap
	return sum
}

func (s *isolation) report(out io.Writer, badState string) error {
	sum, cfg := s.summary(badState), s.cfg
	fmt.Fprintf(out, "mode isolation: a healthy endpoint at %g events/s, warmed up %s, then %d round(s) of %s alone and %s beside a bad endpoint\n",
		cfg.Rate, min(isolationWarmUp, cfg.Duration), cfg.Rounds, cfg.Duration, cfg.Duration)
	bad := s.badAnswer()
	fmt.Fprintf(out, "  (%d deliveries queued, its receiver answering %d after %s, max_in_flight %d; paused for the baselines after the first)\n",
		cfg.Events, bad.Status, bad.Wait, s.badEP.MaxInFlight)
	for i := range s.baseP99 {
		fmt.Fprintf(out, "round %d: healthy p99 alone %s, beside the bad %s\n", i+1, s.baseP99[i], s.besideP99[i])
	}
	fmt.Fprintf(out, "healthy alone:           %4d events, commit->2xx p50 %s p99 %s max %s\n",
		len(s.base), quantile(s.base, 0.5), quantile(s.base, 0.99), quantile(s.base, 1))
	fmt.Fprintf(out, "healthy beside the bad:  %4d events, commit->2xx p50 %s p99 %s max %s\n",
		len(s.beside), quantile(s.beside, 0.5), quantile(s.beside, 0.99), quantile(s.beside, 1))
	fmt.Fprintf(out, "p99 beside / p99 alone: %.2f (target <= 2): %s\n", sum.P99Ratio, verdict(sum.P99RatioMet))
	fmt.Fprintf(out, "bad endpoint: %d requests, at most %d in flight at once as its receiver saw them (cap %d): %s; breaker at the end %s\n",
		sum.BadRequests, sum.BadMaxInFlight, sum.BadCap, verdict(sum.BadCapMet), sum.BadBreakerState)
	return writeSummary(out, sum)
}
