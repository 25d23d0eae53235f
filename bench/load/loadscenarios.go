// loadscenarios.go: `outboxd load`'s endpoint scenarios, issue 16's
// targets, each measured side by side in one run against a real child
// outboxd (README, "Endpoint isolation"):
//
//   - isolation: a healthy endpoint at 20 events/s alone, then beside an
//     endpoint whose receiver answers 500 after 5 s with 1,000 deliveries
//     queued for it;
//   - flaky: a receiver that answers 500 to one request in ten, 50
//     events/s for 30 s;
//   - dead: a receiver that answers 500 to everything;
//   - ratelimit: an endpoint limited to 20 requests/s with a larger
//     backlog, delivered by two replicas.
//
// Each prints a report and, last, one line "summary {...}" in JSON. Issue
// 17's lane scenarios (stuck, replay, ordered) are in loadlanes.go.

package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// scenarioConfig is the scenarios' own flags.
type scenarioConfig struct {
	FailAfter    time.Duration // isolation, dead and stuck: the bad receiver's wait before its 500
	FailFor      time.Duration // stuck: how long the failing subject's requests are refused
	Subjects     int           // stuck and ordered: the subjects the events take in turn
	FailRatio    float64       // flaky: share of requests answered 500
	AcceptWithin time.Duration // flaky: every event's bound from commit to first 2xx
	RateLimit    float64       // ratelimit: the endpoint's rate_limit_per_second
	MaxInFlight  int           // ratelimit, stuck, replay, ordered: the endpoint's max_in_flight; 0: the server's default (ordered: the child's workers)
	Rounds       int           // isolation, stuck, replay, ordered: baseline and scenario phases, alternating
	Replicas     int           // ratelimit, drain, jobs: outboxd processes against the database
	VacuumEvery  time.Duration // replay: how often the queue tables are vacuumed during the phases; 0: only before each
	AnswerAfter  time.Duration // replay: the receiver's wait before each 2xx; 0: at once
}

func (c *scenarioConfig) flags(fs *flag.FlagSet) {
	c.FailRatio, c.AcceptWithin, c.RateLimit, c.Replicas, c.Rounds = 0.1, 2*time.Minute, 20, 2, 1
	fs.DurationVar(&c.FailAfter, "fail-after", c.FailAfter, "how long the bad receiver waits before answering 500 (isolation: 5s, dead: 1s)")
	fs.Float64Var(&c.FailRatio, "fail-ratio", c.FailRatio, "share of requests the flaky receiver answers 500, at random")
	fs.DurationVar(&c.AcceptWithin, "accept-within", c.AcceptWithin, "flaky: the bound on every event's commit to first 2xx")
	fs.Float64Var(&c.RateLimit, "rate-limit", c.RateLimit, "ratelimit: the endpoint's rate_limit_per_second")
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "ratelimit, drain, jobs: outboxd processes delivering from the one database (ratelimit: 2, drain and jobs: 1)")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "isolation: rounds of a baseline phase and a phase beside the bad endpoint (paused for the later baselines)")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", c.MaxInFlight, "ratelimit, stuck, replay, ordered: the endpoint's max_in_flight; 0 leaves the server's default (ordered: the child's workers, as drain)")
	fs.DurationVar(&c.FailFor, "fail-for", c.FailFor, "stuck: how long the failing subject's requests are answered 500 (10s)")
	fs.IntVar(&c.Subjects, "subjects", c.Subjects, "stuck and ordered: distinct subjects the events take in turn (stuck: 100, ordered: 1000)")
	fs.DurationVar(&c.AnswerAfter, "answer-after", c.AnswerAfter, "replay: how long the receiver takes to answer each request 200, a stand-in for a receiver farther than loopback; 0: at once")
	fs.DurationVar(&c.VacuumEvery, "vacuum-every", c.VacuumEvery, "replay: vacuum the queue tables this often during the phases, a stand-in for autovacuum where it is off; 0: only before each phase")
}

func (c scenarioConfig) validate() error {
	switch {
	case c.FailAfter < 0:
		return fmt.Errorf("-fail-after must not be negative, got %s", c.FailAfter)
	case c.AnswerAfter < 0:
		return fmt.Errorf("-answer-after must not be negative, got %s", c.AnswerAfter)
	case !(c.FailRatio >= 0 && c.FailRatio <= 1):
		return fmt.Errorf("-fail-ratio must be between 0 and 1, got %g", c.FailRatio)
	case c.AcceptWithin <= 0:
		return fmt.Errorf("-accept-within must be positive, got %s", c.AcceptWithin)
	case !(c.RateLimit >= minRateLimit && c.RateLimit <= maxRateLimit):
		return fmt.Errorf("-rate-limit must be between %v and %v, got %g", minRateLimit, maxRateLimit, c.RateLimit)
	case c.Replicas < 1 || c.Replicas > 16:
		return fmt.Errorf("-replicas must be between 1 and 16, got %d", c.Replicas)
	case c.Rounds < 1 || c.Rounds > 100:
		return fmt.Errorf("-rounds must be between 1 and 100, got %d", c.Rounds)
	case c.MaxInFlight < 0 || c.MaxInFlight > maxMaxInFlight:
		return fmt.Errorf("-max-in-flight must be between 0 (the server's default) and %d, got %d", maxMaxInFlight, c.MaxInFlight)
	case c.VacuumEvery < 0:
		return fmt.Errorf("-vacuum-every must not be negative, got %s", c.VacuumEvery)
	case c.FailFor < 0:
		return fmt.Errorf("-fail-for must not be negative, got %s", c.FailFor)
	case c.Subjects < 0 || c.Subjects > 1_000_000:
		return fmt.Errorf("-subjects must be between 0 (each event a subject of its own) and 1000000, got %d", c.Subjects)
	}
	return nil
}

// scenarioDefault is a scenario's number for each flag it reads that the
// command line leaves unset: issue 16's and issue 17's figures.
type scenarioDefault struct {
	duration  time.Duration
	rate      float64
	events    int
	failAfter time.Duration
	failFor   time.Duration
	subjects  int
	rounds    int
}

func scenarioDefaults(mode string) (scenarioDefault, bool) {
	switch mode {
	case "isolation":
		return scenarioDefault{duration: 30 * time.Second, rate: 20, events: 1000, failAfter: 5 * time.Second}, true
	case "flaky":
		return scenarioDefault{duration: 30 * time.Second, rate: 50}, true
	case "dead":
		return scenarioDefault{duration: 30 * time.Second, rate: 20, failAfter: time.Second}, true
	case "ratelimit":
		return scenarioDefault{duration: 30 * time.Second, events: 1000}, true
	case "stuck":
		return scenarioDefault{duration: 30 * time.Second, rate: 50, failFor: 10 * time.Second, subjects: 100, rounds: 3}, true
	case "replay":
		return scenarioDefault{duration: 60 * time.Second, rate: replayLiveRate, events: 100_000}, true
	case "ordered":
		return scenarioDefault{duration: 30 * time.Second, events: 20_000, subjects: 1000, rounds: 2}, true
	}
	return scenarioDefault{}, false
}

// applyScenarioDefaults gives a scenario its own numbers for the flags
// the command line did not set (set holds the names it did).
func (cfg *loadConfig) applyScenarioDefaults(set map[string]bool) {
	d, ok := scenarioDefaults(cfg.Mode)
	if !ok {
		return
	}
	if !set["duration"] {
		cfg.Duration = d.duration
	}
	if !set["rate"] && d.rate > 0 {
		cfg.Rate = d.rate
	}
	if !set["events"] && d.events > 0 {
		cfg.Events = d.events
	}
	if !set["fail-after"] {
		cfg.FailAfter = d.failAfter
	}
	if !set["fail-for"] {
		cfg.FailFor = d.failFor
	}
	if !set["subjects"] {
		cfg.Subjects = d.subjects
	}
	if !set["rounds"] && d.rounds > 0 {
		cfg.Rounds = d.rounds
	}
}

// loadRun is what runLoad hands a scenario: the database it migrated.
type loadRun struct {
	db             *sql.DB
	dsn            string
	stdout, stderr io.Writer
	logger         *slog.Logger
}

// loadScenario is the scenario that runs -mode, or nil for the other modes.
func loadScenario(mode string) func(context.Context, loadConfig, loadRun) error {
	switch mode {
	case "isolation":
		return loadIsolation
	case "flaky":
		return loadFlaky
	case "dead":
		return loadDead
	case "ratelimit":
		return loadRateLimit
	case "stuck":
		return loadStuck
	case "replay":
		return loadReplay
	case "ordered":
		return loadOrdered
	}
	return nil
}

// scenarioRig is a scenario's children, receivers and endpoints, undone by
// Close: children stopped first, so their last outcome writes cannot
// deadlock with the endpoints' deletion (as in runLoad).
type scenarioRig struct {
	loadRun
	token     string
	extra     []string
	children  []*loadChild
	receivers []*loadReceiver
	endpoints []int64
}

func newScenarioRig(cfg loadConfig, run loadRun) *scenarioRig {
	return &scenarioRig{loadRun: run, token: randomToken(), extra: strings.Fields(cfg.ServeFlags)}
}

// start starts n children (replicas), all at once.
func (g *scenarioRig) start(ctx context.Context, n int) error {
	for len(g.children) < n {
		g.children = append(g.children, &loadChild{dsn: g.dsn, token: g.token, extra: g.extra, stderr: g.stderr})
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range g.children[:n] {
		wg.Go(func() { errs[i] = c.Start(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (g *scenarioRig) stopChildren() {
	var wg sync.WaitGroup
	for _, c := range g.children {
		wg.Go(c.Stop)
	}
	wg.Wait()
}

// receiver starts a receiver that answers as answer says and keeps spans.
func (g *scenarioRig) receiver(answer func(webhookID string) requestAnswer) (*loadReceiver, error) {
	r, err := startAnsweringReceiver(answer, true)
	if err != nil {
		return nil, err
	}
	g.receivers = append(g.receivers, r)
	return r, nil
}

// endpoint registers r through the first child and returns the endpoint
// as the API shows it.
func (g *scenarioRig) endpoint(ctx context.Context, r *loadReceiver, settings loadEndpoint) (Endpoint, error) {
	id, err := g.children[0].CreateEndpoint(ctx, r, settings)
	if err != nil {
		return Endpoint{}, err
	}
	g.endpoints = append(g.endpoints, id)
	return g.children[0].Endpoint(ctx, id)
}

func (g *scenarioRig) Close(ctx context.Context) {
	g.stopChildren()
	for _, id := range g.endpoints {
		if err := deleteEndpoint(context.WithoutCancel(ctx), g.db, id); err != nil {
			g.logger.Warn("load: remove the run's endpoint", "endpoint_id", id, "err", err)
		}
	}
	for _, r := range g.receivers {
		r.Close()
	}
}

// Endpoint reads endpoint id through the child's API.
func (c *loadChild) Endpoint(ctx context.Context, id int64) (Endpoint, error) {
	var ep Endpoint
	status, err := c.call(ctx, "GET", fmt.Sprintf("/api/endpoints/%d", id), nil, &ep)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("status %d", status)
	}
	if err != nil {
		return ep, fmt.Errorf("load: get endpoint %d: %w", id, err)
	}
	return ep, nil
}

// DeliveryAttempts is the child's outboxd_deliveries_total, every outcome
// summed: the webhook requests this process made.
func (c *loadChild) DeliveryAttempts(ctx context.Context) (int64, error) {
	sums, err := c.metricSums(ctx)
	return int64(sums["outboxd_deliveries_total"]), err
}

// metricSums reads the child's /metrics: each sample's value by its name
// (a histogram's _count and _sum are names of their own), summed over
// labels. Bucket samples are left out.
func (c *loadChild) metricSums(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+c.addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("load: read metrics: %w", err)
	}
	defer resp.Body.Close()
	sums := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		name, _, _ := strings.Cut(series, "{")
		if !ok || strings.HasSuffix(name, "_bucket") {
			continue
		}
		if n, err := strconv.ParseFloat(value, 64); err == nil {
			sums[name] += n
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("load: read metrics: %w", err)
	}
	return sums, nil
}

// awaitFannedOut waits until the relay has fanned out every event of topic.
func awaitFannedOut(ctx context.Context, db *sql.DB, topic string) error {
	for {
		var left int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox.events WHERE topic = $1 AND fanned_out_at IS NULL AND poisoned_at IS NULL`,
			topic).Scan(&left); err != nil {
			return fmt.Errorf("load: count un-fanned events: %w", err)
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// breakerWatch is what polling an endpoint's breaker through the API saw.
type breakerWatch struct {
	Polls          int
	Errors         int
	EverOpen       bool
	OpenedAt       time.Time // breaker.opened_at as first seen open
	SeenOpenAt     time.Time // when the poll that first saw it open returned
	FailuresAtOpen int       // consecutive_failures in that first poll
	MaxFailures    int       // the most consecutive_failures seen
}

// watchBreaker polls endpoint id every interval until the returned stop
// is called, which returns what the polls saw.
func watchBreaker(ctx context.Context, c *loadChild, id int64, every time.Duration) (stop func() breakerWatch) {
	ctx, cancel := context.WithCancel(ctx)
	var w breakerWatch
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			ep, err := c.Endpoint(ctx, id)
			polled := time.Now()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				w.Errors++
			default:
				w.Polls++
				w.MaxFailures = max(w.MaxFailures, ep.Breaker.ConsecutiveFailures)
				if ep.Breaker.State == breakerOpen && !w.EverOpen {
					w.EverOpen, w.FailuresAtOpen, w.SeenOpenAt = true, ep.Breaker.ConsecutiveFailures, polled
					if ep.Breaker.OpenedAt != nil {
						w.OpenedAt = *ep.Breaker.OpenedAt
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() breakerWatch {
		cancel()
		<-done
		return w
	}
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// maxConcurrent is the most spans open at one instant. A span that ends
// when another starts does not overlap it.
func maxConcurrent(spans []requestSpan) int {
	type edge struct {
		at    time.Time
		delta int
	}
	edges := make([]edge, 0, 2*len(spans))
	for _, s := range spans {
		edges = append(edges, edge{s.Start, +1}, edge{s.End, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends first
	})
	open, most := 0, 0
	for _, e := range edges {
		open += e.delta
		most = max(most, open)
	}
	return most
}

// maxInWindow is the most times inside any window [t, t+w), the window
// sliding over every t.
func maxInWindow(times []time.Time, w time.Duration) int {
	sorted := slices.Clone(times)
	slices.SortFunc(sorted, time.Time.Compare)
	most, first := 0, 0
	for last := range sorted {
		for sorted[last].Sub(sorted[first]) >= w {
			first++
		}
		most = max(most, last-first+1)
	}
	return most
}

// longestFailureRun is the most answers other than 2xx in a row, in the
// order the requests arrived: the receiver's view of what the breaker
// counts.
func longestFailureRun(spans []requestSpan) int {
	sorted := slices.Clone(spans)
	slices.SortFunc(sorted, func(a, b requestSpan) int { return a.Start.Compare(b.Start) })
	run, most := 0, 0
	for _, s := range sorted {
		if s.Status/100 == 2 {
			run = 0
			continue
		}
		run++
		most = max(most, run)
	}
	return most
}

// ms is d in milliseconds, for the summaries.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// verdict says whether a target was met.
func verdict(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}

// writeSummary prints the machine-readable last line of a scenario.
func writeSummary(w io.Writer, summary any) error {
	b, err := json.Marshal(summary)
	if err != nil {
		return fmt.Errorf("load: summary: %w", err)
	}
	_, err = fmt.Fprintf(w, "summary %s\n", b)
	return err
}

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

// loadIsolation measures the healthy endpoint's latency alone (the
// baseline), then beside a hanging endpoint with a backlog, in one run.
// Later rounds (-rounds) pause the bad endpoint for their baseline, once
// its receiver has no request open, and resume it for the phase beside
// it: background load that drifts over minutes then weighs on both sides.
func loadIsolation(ctx context.Context, cfg loadConfig, run loadRun) error {
	g := newScenarioRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	child := g.children[0]
	healthy, err := g.receiver(nil)
	if err != nil {
		return err
	}
	if _, err := g.endpoint(ctx, healthy, loadEndpoint{Topics: []string{"load.healthy"}}); err != nil {
		return err
	}
	// phase runs the healthy producers for d and returns the latencies of
	// what they committed.
	var delivered int64
	phase := func(name string, d time.Duration) ([]time.Duration, error) {
		committed, _ := produce(ctx, run.db, "load.healthy", name, cfg.Producers, cfg.Rate, d)
		if err := healthy.AwaitUnique(ctx, delivered+committed, 10*time.Minute); err != nil {
			return nil, err
		}
		lat := healthy.Latencies(int(delivered))
		delivered += committed
		slices.Sort(lat)
		return lat, nil
	}
	// The first seconds after the child's start are not its steady state:
	// its pool opens connections, and each new session plans the claim
	// functions anew (README, "Performance"). A warm-up, not counted,
	// keeps them out of the baseline.
	if _, err := phase("warm-", min(isolationWarmUp, cfg.Duration)); err != nil {
		return err
	}
	var bad *loadReceiver
	var badEP Endpoint
	var base, beside, baseP99, besideP99 []time.Duration
	for round := 1; round <= cfg.Rounds; round++ {
		if round > 1 {
			if err := child.pause(ctx, badEP.ID, "pause"); err != nil {
				return err
			}
			if err := bad.AwaitIdle(ctx, cfg.FailAfter+10*time.Second); err != nil {
				return err
			}
		}
		lat, err := phase(fmt.Sprintf("base%d-", round), cfg.Duration)
		if err != nil {
			return err
		}
		base, baseP99 = append(base, lat...), append(baseP99, quantile(lat, 0.99))
		if round == 1 {
			// The bad endpoint's backlog is queued, fanned out into its
			// jobs, before the phase beside it starts: what is measured is
			// the workers' isolation, not the relay's pass over 1,000
			// events.
			bad, err = g.receiver(func(string) requestAnswer {
				return requestAnswer{Wait: cfg.FailAfter, Status: http.StatusInternalServerError}
			})
			if err != nil {
				return err
			}
			if badEP, err = g.endpoint(ctx, bad, loadEndpoint{Topics: []string{"load.bad"}}); err != nil {
				return err
			}
			if err := recordBulk(ctx, run.db, "load.bad", cfg.Events); err != nil {
				return err
			}
			if err := awaitFannedOut(ctx, run.db, "load.bad"); err != nil {
				return err
			}
		} else if err := child.pause(ctx, badEP.ID, "resume"); err != nil {
			return err
		}
		if lat, err = phase(fmt.Sprintf("beside%d-", round), cfg.Duration); err != nil {
			return err
		}
		beside, besideP99 = append(beside, lat...), append(besideP99, quantile(lat, 0.99))
	}
	badState, err := child.Endpoint(ctx, badEP.ID)
	if err != nil {
		return err
	}
	g.stopChildren() // the bad receiver's open requests end with the child's
	if err := bad.AwaitIdle(ctx, cfg.FailAfter+10*time.Second); err != nil {
		return err
	}

	slices.Sort(base)
	slices.Sort(beside)
	s := isolationSummary{Mode: "isolation", Rate: cfg.Rate, PhaseSeconds: cfg.Duration.Seconds(), Rounds: cfg.Rounds,
		BaselineEvents: len(base), BaselineP50MS: ms(quantile(base, 0.5)), BaselineP99MS: ms(quantile(base, 0.99)),
		BesideEvents: len(beside), BesideP50MS: ms(quantile(beside, 0.5)), BesideP99MS: ms(quantile(beside, 0.99)),
		BadQueued: cfg.Events, BadRequests: len(bad.Spans()), BadMaxInFlight: bad.MaxOpen(), BadCap: badEP.MaxInFlight,
		BadBreakerState: badState.Breaker.State}
	for i := range baseP99 {
		s.BaselineP99MSByRound = append(s.BaselineP99MSByRound, ms(baseP99[i]))
		s.BesideP99MSByRound = append(s.BesideP99MSByRound, ms(besideP99[i]))
	}
	if s.BaselineP99MS > 0 {
		s.P99Ratio = s.BesideP99MS / s.BaselineP99MS
	}
	s.P99RatioMet = s.P99Ratio > 0 && s.P99Ratio <= 2
	s.BadCapMet = s.BadMaxInFlight <= s.BadCap
	out := run.stdout
	fmt.Fprintf(out, "mode isolation: a healthy endpoint at %g events/s, warmed up %s, then %d round(s) of %s alone and %s beside a bad endpoint\n",
		cfg.Rate, min(isolationWarmUp, cfg.Duration), cfg.Rounds, cfg.Duration, cfg.Duration)
	fmt.Fprintf(out, "  (%d deliveries queued, its receiver answering 500 after %s, max_in_flight %d; paused for the baselines after the first)\n",
		cfg.Events, cfg.FailAfter, badEP.MaxInFlight)
	for i := range baseP99 {
		fmt.Fprintf(out, "round %d: healthy p99 alone %s, beside the bad %s\n", i+1, baseP99[i], besideP99[i])
	}
	fmt.Fprintf(out, "healthy alone:           %4d events, commit->2xx p50 %s p99 %s max %s\n",
		len(base), quantile(base, 0.5), quantile(base, 0.99), quantile(base, 1))
	fmt.Fprintf(out, "healthy beside the bad:  %4d events, commit->2xx p50 %s p99 %s max %s\n",
		len(beside), quantile(beside, 0.5), quantile(beside, 0.99), quantile(beside, 1))
	fmt.Fprintf(out, "p99 beside / p99 alone: %.2f (target <= 2): %s\n", s.P99Ratio, verdict(s.P99RatioMet))
	fmt.Fprintf(out, "bad endpoint: %d requests, at most %d in flight at once as its receiver saw them (cap %d): %s; breaker at the end %s\n",
		s.BadRequests, s.BadMaxInFlight, s.BadCap, verdict(s.BadCapMet), s.BadBreakerState)
	return writeSummary(out, s)
}

// isolationWarmUp is how long the healthy endpoint runs, not measured,
// before the first baseline.
const isolationWarmUp = 5 * time.Second

// pause pauses (action "pause") or resumes ("resume") endpoint id.
func (c *loadChild) pause(ctx context.Context, id int64, action string) error {
	var answer struct {
		Error string `json:"error"`
	}
	status, err := c.call(ctx, "POST", fmt.Sprintf("/api/endpoints/%d/%s", id, action), nil, &answer)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("status %d %s", status, answer.Error)
	}
	if err != nil {
		return fmt.Errorf("load: %s endpoint %d: %w", action, id, err)
	}
	return nil
}

// flakySummary is -mode flaky's result.
type flakySummary struct {
	Mode                string  `json:"mode"`
	Rate                float64 `json:"rate"`
	Seconds             float64 `json:"seconds"`
	Events              int64   `json:"events"`
	Requests            int     `json:"requests"`
	Refused             int     `json:"refused"` // answered 500
	AcceptedWithin      int64   `json:"accepted_within"`
	AcceptWithinSeconds float64 `json:"accept_within_seconds"`
	AllAccepted         bool    `json:"all_accepted"`
	P50MS               float64 `json:"p50_ms"`
	P90MS               float64 `json:"p90_ms"`
	P90Met              bool    `json:"p90_met"` // ≤ 20 s
	MaxMS               float64 `json:"max_ms"`
	BreakerPolls        int     `json:"breaker_polls"`
	BreakerEverOpen     bool    `json:"breaker_ever_open"`
	MaxConsecutive      int     `json:"max_consecutive_failures"`
	LongestRefusedRun   int     `json:"longest_refused_run"`
	BreakerThreshold    int     `json:"breaker_threshold"`
}

// flakyP90Target is issue 16's bound on a flaky receiver's p90.
const flakyP90Target = 20 * time.Second

// loadFlaky runs producers against a receiver that refuses a share of
// requests at random, and waits for every event's first 2xx.
func loadFlaky(ctx context.Context, cfg loadConfig, run loadRun) error {
	g := newScenarioRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	child := g.children[0]
	recv, err := g.receiver(func(string) requestAnswer {
		if rand.Float64() < cfg.FailRatio {
			return requestAnswer{Status: http.StatusInternalServerError}
		}
		return requestAnswer{}
	})
	if err != nil {
		return err
	}
	ep, err := g.endpoint(ctx, recv, loadEndpoint{Topics: []string{"load.*"}})
	if err != nil {
		return err
	}
	stopWatch := watchBreaker(ctx, child, ep.ID, 50*time.Millisecond)
	committed, elapsed := produce(ctx, run.db, "load.flaky", "f", cfg.Producers, cfg.Rate, cfg.Duration)
	// The last event committed now; one not accepted AcceptWithin later
	// missed the bound, whenever it was committed.
	if err := recv.AwaitUnique(ctx, committed, cfg.AcceptWithin); err != nil && ctx.Err() != nil {
		return err
	}
	watch := stopWatch()
	g.stopChildren()
	if err := recv.AwaitIdle(ctx, 10*time.Second); err != nil {
		return err
	}
	lat := recv.Latencies(0)
	slices.Sort(lat)
	spans := recv.Spans()
	refused := 0
	for _, sp := range spans {
		if sp.Status/100 != 2 {
			refused++
		}
	}
	within := int64(sortedCountAtMost(lat, cfg.AcceptWithin))
	// An event never accepted counts at the bound it missed: the p90 is
	// over every event committed.
	all := padded(lat, int(committed), cfg.AcceptWithin)
	s := flakySummary{Mode: "flaky", Rate: cfg.Rate, Seconds: elapsed.Seconds(), Events: committed,
		Requests: len(spans), Refused: refused, AcceptedWithin: within, AcceptWithinSeconds: cfg.AcceptWithin.Seconds(),
		AllAccepted: within == committed,
		P50MS:       ms(quantile(all, 0.5)), P90MS: ms(quantile(all, 0.9)), MaxMS: ms(quantile(all, 1)),
		BreakerPolls: watch.Polls, BreakerEverOpen: watch.EverOpen, MaxConsecutive: watch.MaxFailures,
		LongestRefusedRun: longestFailureRun(spans),
		BreakerThreshold:  childSetting(g.extra, os.Getenv, "breaker-threshold", defaultConfig().Workers.BreakerThreshold)}
	s.P90Met = len(all) > 0 && quantile(all, 0.9) <= flakyP90Target
	out := run.stdout
	fmt.Fprintf(out, "mode flaky: %d events at %g events/s for %s; the receiver answered 500 to %d of %d requests (%.1f%%, -fail-ratio %g)\n",
		committed, cfg.Rate, elapsed.Round(time.Millisecond), refused, len(spans), 100*float64(refused)/float64(max(1, len(spans))), cfg.FailRatio)
	fmt.Fprintf(out, "accepted (2xx) within %s of commit: %d of %d: %s\n", cfg.AcceptWithin, within, committed, verdict(s.AllAccepted))
	fmt.Fprintf(out, "commit->first 2xx p50 %s p90 %s (target <= %s: %s) p99 %s max %s\n",
		quantile(all, 0.5), quantile(all, 0.9), flakyP90Target, verdict(s.P90Met), quantile(all, 0.99), quantile(all, 1))
	fmt.Fprintf(out, "breaker: %s in %d polls of the API (%d failed); most consecutive_failures seen %d; longest run of 500s the receiver gave %d (threshold %d): %s\n",
		map[bool]string{true: "seen open", false: "never seen open"}[watch.EverOpen], watch.Polls, watch.Errors,
		watch.MaxFailures, s.LongestRefusedRun, s.BreakerThreshold, verdict(!watch.EverOpen))
	return writeSummary(out, s)
}

// sortedCountAtMost is how many of sorted are at most d.
func sortedCountAtMost(sorted []time.Duration, d time.Duration) int {
	n, _ := slices.BinarySearchFunc(sorted, d, func(a, b time.Duration) int {
		if a <= b {
			return -1
		}
		return 1
	})
	return n
}

// padded is sorted with values at bound added up to n: events never
// accepted, counted at the bound they missed.
func padded(sorted []time.Duration, n int, bound time.Duration) []time.Duration {
	out := slices.Clone(sorted)
	for len(out) < n {
		out = append(out, bound)
	}
	slices.Sort(out)
	return out
}

// deadSummary is -mode dead's result.
type deadSummary struct {
	Mode               string  `json:"mode"`
	Rate               float64 `json:"rate"`
	Seconds            float64 `json:"seconds"`
	Events             int64   `json:"events"`
	Requests           int     `json:"requests"`
	BreakerThreshold   int     `json:"breaker_threshold"`
	BreakerOpened      bool    `json:"breaker_opened"`
	OpenedAfterSeconds float64 `json:"opened_after_seconds"` // from the first request
	FailuresAtOpen     int     `json:"failures_at_open"`     // consecutive_failures when first seen open
	AnsweredBeforeOpen int     `json:"answered_before_open"` // requests the receiver had answered by opened_at
	ArrivedBeforeOpen  int     `json:"arrived_before_open"`  // requests that had arrived by opened_at
	MaxConcurrent      int     `json:"max_concurrent"`       // over the whole run
	// ClaimedAfterOpen are the requests outboxd claimed once the open
	// breaker was visible; MaxConcurrentAfter is the most requests open at
	// once (any, those claimed before included) while one of them was.
	ClaimedAfterOpen   int    `json:"claimed_after_open"`
	MaxConcurrentAfter int    `json:"max_concurrent_after"`
	ClaimUnknown       int    `json:"claim_unknown"` // requests whose claim was not found
	OneAtATimeMet      bool   `json:"one_at_a_time_met"`
	BreakerStateAtEnd  string `json:"breaker_state_at_end"`
	FailuresAtEnd      int    `json:"failures_at_end"`
}

// claimedAtSQL is when outboxd claimed the running attempt of an event's
// delivery to an endpoint (the claim's now()).
const claimedAtSQL = `
SELECT attempted_at FROM outbox.jobs
WHERE event_id = $1 AND endpoint_id = $2 AND kind = 'webhook' AND state = 'running'`

// loadDead runs producers against a receiver that answers 500 to every
// request, and watches the breaker open and what reaches the receiver
// after.
func loadDead(ctx context.Context, cfg loadConfig, run loadRun) error {
	g := newScenarioRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	child := g.children[0]
	// The receiver takes -fail-after to refuse: answered at once, no two
	// requests would overlap whatever the breaker did, and the count of
	// requests open at once would prove nothing. It looks up when each
	// attempt was claimed: a request claimed just before the breaker
	// opened may arrive just after, and is no probe.
	var endpointID atomic.Int64
	recv, err := g.receiver(func(webhookID string) requestAnswer {
		a := requestAnswer{Wait: cfg.FailAfter, Status: http.StatusInternalServerError}
		eventID, _ := strconv.ParseInt(webhookID, 10, 64)
		if err := run.db.QueryRowContext(ctx, claimedAtSQL, eventID, endpointID.Load()).Scan(&a.Claimed); err != nil {
			a.Claimed = time.Time{}
		}
		return a
	})
	if err != nil {
		return err
	}
	ep, err := g.endpoint(ctx, recv, loadEndpoint{Topics: []string{"load.*"}})
	if err != nil {
		return err
	}
	endpointID.Store(ep.ID)
	stopWatch := watchBreaker(ctx, child, ep.ID, 20*time.Millisecond)
	committed, elapsed := produce(ctx, run.db, "load.dead", "d", cfg.Producers, cfg.Rate, cfg.Duration)
	watch := stopWatch()
	end, err := child.Endpoint(ctx, ep.ID)
	if err != nil {
		return err
	}
	g.stopChildren()
	if err := recv.AwaitIdle(ctx, cfg.FailAfter+10*time.Second); err != nil {
		return err
	}
	spans := recv.Spans()
	s := deadSummary{Mode: "dead", Rate: cfg.Rate, Seconds: elapsed.Seconds(), Events: committed, Requests: len(spans),
		BreakerThreshold: childSetting(g.extra, os.Getenv, "breaker-threshold", defaultConfig().Workers.BreakerThreshold),
		BreakerOpened:    watch.EverOpen, FailuresAtOpen: watch.FailuresAtOpen, MaxConcurrent: maxConcurrent(spans),
		BreakerStateAtEnd: end.Breaker.State, FailuresAtEnd: end.Breaker.ConsecutiveFailures}
	// The breaker opened at opened_at (the completer's now()) and was
	// visible by SeenOpenAt at the latest: a claim begun after that saw it.
	var after []requestSpan
	for _, sp := range spans {
		switch {
		case sp.Claimed.IsZero():
			s.ClaimUnknown++
		case watch.EverOpen && sp.Claimed.After(watch.SeenOpenAt):
			after = append(after, sp)
		}
		if watch.EverOpen && !sp.Start.After(watch.OpenedAt) {
			s.ArrivedBeforeOpen++
		}
		if watch.EverOpen && !sp.End.After(watch.OpenedAt) {
			s.AnsweredBeforeOpen++
		}
	}
	s.ClaimedAfterOpen, s.MaxConcurrentAfter = len(after), maxConcurrentDuring(spans, after)
	s.OneAtATimeMet = watch.EverOpen && s.MaxConcurrentAfter <= 1
	if first := firstStart(spans); watch.EverOpen && !first.IsZero() {
		s.OpenedAfterSeconds = watch.OpenedAt.Sub(first).Seconds()
	}
	out := run.stdout
	fmt.Fprintf(out, "mode dead: %d events at %g events/s for %s; the receiver answered 500 after %s to all %d requests, at most %d at once\n",
		committed, cfg.Rate, elapsed.Round(time.Millisecond), cfg.FailAfter, len(spans), s.MaxConcurrent)
	if !watch.EverOpen {
		fmt.Fprintf(out, "breaker: never seen open in %d polls of the API (most consecutive_failures seen %d, threshold %d): MISSED\n",
			watch.Polls, watch.MaxFailures, s.BreakerThreshold)
	} else {
		fmt.Fprintf(out, "breaker: opened %.2fs after the first request, consecutive_failures %d when first seen open (threshold %d); "+
			"by then the receiver had answered %d requests, and %d had arrived\n",
			s.OpenedAfterSeconds, s.FailuresAtOpen, s.BreakerThreshold, s.AnsweredBeforeOpen, s.ArrivedBeforeOpen)
		fmt.Fprintf(out, "claimed after it opened: %d requests (%.2f/s), and while one was open at most %d requests were open at once (target 1): %s\n",
			s.ClaimedAfterOpen, float64(s.ClaimedAfterOpen)/max(1e-9, lastEnd(spans).Sub(watch.OpenedAt).Seconds()),
			s.MaxConcurrentAfter, verdict(s.OneAtATimeMet))
	}
	if s.ClaimUnknown > 0 {
		fmt.Fprintf(out, "%d requests whose claim was not found (left out of the count above)\n", s.ClaimUnknown)
	}
	fmt.Fprintf(out, "breaker at the end: %s, consecutive_failures %d\n", s.BreakerStateAtEnd, s.FailuresAtEnd)
	return writeSummary(out, s)
}

// maxConcurrentDuring is the most spans open at one instant while one of
// within was open.
func maxConcurrentDuring(spans, within []requestSpan) int {
	most := 0
	for _, w := range within {
		var clipped []requestSpan
		for _, sp := range spans {
			from, to := latest(sp.Start, w.Start), earliest(sp.End, w.End)
			if from.Before(to) {
				clipped = append(clipped, requestSpan{Start: from, End: to})
			}
		}
		most = max(most, maxConcurrent(clipped))
	}
	return most
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// firstStart is the earliest span's start; zero for none.
func firstStart(spans []requestSpan) time.Time {
	var first time.Time
	for _, s := range spans {
		if first.IsZero() || s.Start.Before(first) {
			first = s.Start
		}
	}
	return first
}

// lastEnd is the latest span's end; zero for none.
func lastEnd(spans []requestSpan) time.Time {
	var last time.Time
	for _, s := range spans {
		if s.End.After(last) {
			last = s.End
		}
	}
	return last
}

// rateWindow is the window issue 16's rate limit target counts requests in.
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

// loadRateLimit queues a backlog for a rate-limited endpoint and lets
// -replicas children deliver it for -duration.
func loadRateLimit(ctx context.Context, cfg loadConfig, run loadRun) error {
	g := newScenarioRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	recv, err := g.receiver(nil)
	if err != nil {
		return err
	}
	// With the default cap, the replica that claims first keeps the
	// lane: its workers hold the cap's jobs, each waiting its turn under
	// the limit, and claim again as soon as their outcomes commit, before
	// the other replica's poll. A larger -max-in-flight lets both deliver.
	ep, err := g.endpoint(ctx, recv, loadEndpoint{Topics: []string{"load.*"}, RateLimitPerSecond: cfg.RateLimit, MaxInFlight: cfg.MaxInFlight})
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
	g.stopChildren()
	if err := recv.AwaitIdle(ctx, 10*time.Second); err != nil {
		return err
	}
	spans := recv.Spans()
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
	out := run.stdout
	fmt.Fprintf(out, "mode ratelimit: %d replicas, rate_limit_per_second %g, max_in_flight %d, %d deliveries queued, delivering for %s\n",
		cfg.Replicas, cfg.RateLimit, ep.MaxInFlight, cfg.Events, time.Duration(s.Seconds*float64(time.Second)).Round(time.Millisecond))
	fmt.Fprintf(out, "the receiver saw %d requests, %.2f/s from first to last; webhook attempts by replica %v\n", s.Requests, s.MeanPerSecond, s.PerReplica)
	fmt.Fprintf(out, "busiest %s window: %d requests; limit x %s = %g: %.3f of it (target <= 1.10): %s\n",
		rateWindow, s.MaxIn5s, rateWindow, s.Allowed5s, s.Ratio, verdict(s.Met))
	return writeSummary(out, s)
}
