// breaker.go: the two modes that watch an endpoint's circuit breaker
// through the API while its receiver fails: flaky (a share of requests
// refused: the breaker should stay shut and every event arrive within a
// bound) and dead (every request refused: the breaker should open, and
// then let one request through at a time).

package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

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
func watchBreaker(ctx context.Context, c *child, id int64, every time.Duration) (stop func() breakerWatch) {
	ctx, cancel := context.WithCancel(ctx)
	var w breakerWatch
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			ep, err := c.Endpoint(ctx, id)
			if ctx.Err() != nil {
				return
			}
			w.note(ep, err, time.Now())
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

// note adds one poll's answer, returned at polled.
func (w *breakerWatch) note(ep endpoint, err error, polled time.Time) {
	if err != nil {
		w.Errors++
		return
	}
	w.Polls++
	w.MaxFailures = max(w.MaxFailures, ep.Breaker.ConsecutiveFailures)
	if ep.Breaker.State == breakerOpen && !w.EverOpen {
		w.EverOpen, w.FailuresAtOpen, w.SeenOpenAt = true, ep.Breaker.ConsecutiveFailures, polled
		if ep.Breaker.OpenedAt != nil {
			w.OpenedAt = *ep.Breaker.OpenedAt
		}
	}
}

// breakerThreshold is the children's -breaker-threshold.
func (g *rig) breakerThreshold() int {
	return childSetting(g.extra, os.Getenv, "breaker-threshold", defaultBreakerThreshold)
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

// flakyP90Target bounds a flaky receiver's p90 from commit to first 2xx.
const flakyP90Target = 20 * time.Second

// runFlaky runs producers against a receiver that refuses a share of
// requests at random, and waits for every event's first 2xx.
func runFlaky(ctx context.Context, cfg config, run loadRun) error {
	g := newRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	recv, err := g.receiver(func(string) requestAnswer {
		if rand.Float64() < cfg.FailRatio {
			return requestAnswer{Status: http.StatusInternalServerError}
		}
		return requestAnswer{}
	}, true)
	if err != nil {
		return err
	}
	ep, err := g.endpoint(ctx, recv, endpointSettings{Topics: []string{"load.*"}})
	if err != nil {
		return err
	}
	stopWatch := watchBreaker(ctx, g.children[0], ep.ID, 50*time.Millisecond)
	committed, elapsed := produce(ctx, run.db, "load.flaky", "f", cfg.Producers, cfg.Rate, cfg.Duration)
	// The last event committed now; one not accepted AcceptWithin later
	// missed the bound, whenever it was committed.
	if err := recv.AwaitUnique(ctx, committed, cfg.AcceptWithin); err != nil && ctx.Err() != nil {
		return err
	}
	watch := stopWatch()
	g.finish(ctx)
	if err := recv.AwaitIdle(ctx, 10*time.Second); err != nil {
		return err
	}
	f := flaky{cfg: cfg, committed: committed, elapsed: elapsed, watch: watch, spans: recv.Spans(), threshold: g.breakerThreshold()}
	f.lat = recv.Latencies(0)
	slices.Sort(f.lat)
	return f.report(run.stdout)
}

// flaky is what a flaky run saw, for its report.
type flaky struct {
	cfg       config
	committed int64
	elapsed   time.Duration
	watch     breakerWatch
	spans     []requestSpan
	lat       []time.Duration // accepted events', sorted
	threshold int
}

func (f flaky) report(out io.Writer) error {
	cfg, watch := f.cfg, f.watch
	refused := 0
	for _, sp := range f.spans {
		if sp.Status/100 != 2 {
			refused++
		}
	}
	within := int64(sortedCountAtMost(f.lat, cfg.AcceptWithin))
	// An event never accepted counts at the bound it missed: the p90 is
	// over every event committed.
	all := padded(f.lat, int(f.committed), cfg.AcceptWithin)
	s := flakySummary{Mode: "flaky", Rate: cfg.Rate, Seconds: f.elapsed.Seconds(), Events: f.committed,
		Requests: len(f.spans), Refused: refused, AcceptedWithin: within, AcceptWithinSeconds: cfg.AcceptWithin.Seconds(),
		AllAccepted: within == f.committed,
		P50MS:       ms(quantile(all, 0.5)), P90MS: ms(quantile(all, 0.9)), MaxMS: ms(quantile(all, 1)),
		BreakerPolls: watch.Polls, BreakerEverOpen: watch.EverOpen, MaxConsecutive: watch.MaxFailures,
		LongestRefusedRun: longestFailureRun(f.spans), BreakerThreshold: f.threshold}
	s.P90Met = len(all) > 0 && quantile(all, 0.9) <= flakyP90Target
	fmt.Fprintf(out, "mode flaky: %d events at %g events/s for %s; the receiver answered 500 to %d of %d requests (%.1f%%, -fail-ratio %g)\n",
		f.committed, cfg.Rate, f.elapsed.Round(time.Millisecond), refused, len(f.spans), 100*float64(refused)/float64(max(1, len(f.spans))), cfg.FailRatio)
	fmt.Fprintf(out, "accepted (2xx) within %s of commit: %d of %d: %s\n", cfg.AcceptWithin, within, f.committed, verdict(s.AllAccepted))
	fmt.Fprintf(out, "commit->first 2xx p50 %s p90 %s (target <= %s: %s) p99 %s max %s\n",
		quantile(all, 0.5), quantile(all, 0.9), flakyP90Target, verdict(s.P90Met), quantile(all, 0.99), quantile(all, 1))
	fmt.Fprintf(out, "breaker: %s in %d polls of the API (%d failed); most consecutive_failures seen %d; longest run of 500s the receiver gave %d (threshold %d): %s\n",
		map[bool]string{true: "seen open", false: "never seen open"}[watch.EverOpen], watch.Polls, watch.Errors,
		watch.MaxFailures, s.LongestRefusedRun, s.BreakerThreshold, verdict(!watch.EverOpen))
	return writeSummary(out, s)
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

// runDead runs producers against a receiver that answers 500 to every
// request, and watches the breaker open and what reaches the receiver
// after.
func runDead(ctx context.Context, cfg config, run loadRun) error {
	g := newRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
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
	}, true)
	if err != nil {
		return err
	}
	ep, err := g.endpoint(ctx, recv, endpointSettings{Topics: []string{"load.*"}})
	if err != nil {
		return err
	}
	endpointID.Store(ep.ID)
	stopWatch := watchBreaker(ctx, g.children[0], ep.ID, 20*time.Millisecond)
	committed, elapsed := produce(ctx, run.db, "load.dead", "d", cfg.Producers, cfg.Rate, cfg.Duration)
	watch := stopWatch()
	end, err := g.children[0].Endpoint(ctx, ep.ID)
	if err != nil {
		return err
	}
	g.finish(ctx)
	if err := recv.AwaitIdle(ctx, cfg.FailAfter+10*time.Second); err != nil {
		return err
	}
	s := deadSummary{Mode: "dead", Rate: cfg.Rate, Seconds: elapsed.Seconds(), Events: committed,
		BreakerThreshold: g.breakerThreshold(), BreakerStateAtEnd: end.Breaker.State, FailuresAtEnd: end.Breaker.ConsecutiveFailures}
	spans := recv.Spans()
	s.judge(spans, watch)
	return s.report(run.stdout, cfg, spans, watch)
}

// judge fills in what the receiver's spans say of the breaker. It opened
// at opened_at (outboxd's now() when it recorded the failure) and was
// visible by SeenOpenAt at the latest: a claim begun after that saw it.
func (s *deadSummary) judge(spans []requestSpan, watch breakerWatch) {
	s.Requests, s.BreakerOpened, s.FailuresAtOpen, s.MaxConcurrent = len(spans), watch.EverOpen, watch.FailuresAtOpen, maxConcurrent(spans)
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
}

func (s deadSummary) report(out io.Writer, cfg config, spans []requestSpan, watch breakerWatch) error {
	fmt.Fprintf(out, "mode dead: %d events at %g events/s for %s; the receiver answered 500 after %s to all %d requests, at most %d at once\n",
		s.Events, cfg.Rate, time.Duration(s.Seconds*float64(time.Second)).Round(time.Millisecond), cfg.FailAfter, len(spans), s.MaxConcurrent)
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
