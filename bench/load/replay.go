// replay.go: -mode replay, live events to an endpoint alone and beside
// a replay of -events earlier ones started through the API. Its target:
// the live p99 during the replay at most lanesP99Bound times the live p99
// alone; it reports the replay's own rate too.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
)

// replaySummary is -mode replay's result: the live events' latency
// without a replay (before each replay and after the last) and while one
// runs, over every round, and the replays'.
type replaySummary struct {
	Mode                    string         `json:"mode"`
	Rate                    float64        `json:"rate"`
	MaxInFlight             int            `json:"max_in_flight"`
	ReplayShare             int            `json:"replay_share"`
	BaselineSeconds         float64        `json:"baseline_seconds"`
	VacuumEverySeconds      float64        `json:"vacuum_every_seconds"` // 0: only before each phase
	AnswerAfterSeconds      float64        `json:"answer_after_seconds"` // the receiver's wait before each 2xx
	Vacuums                 int            `json:"vacuums"`              // -vacuum-every's, during the phases
	Rounds                  int            `json:"rounds"`
	Baseline                latencyFigures `json:"baseline"`
	During                  latencyFigures `json:"during"`
	P99Ratio                float64        `json:"p99_ratio"`
	P99RatioMet             bool           `json:"p99_ratio_met"`            // ≤ 1.5
	BaselineP99ByPhase      []float64      `json:"baseline_p99_ms_by_phase"` // rounds + 1: one before each replay, one after the last
	DuringP99ByRound        []float64      `json:"during_p99_ms_by_round"`
	DuringP99ByMinute       []float64      `json:"during_p99_ms_by_minute"`    // of the live events committed in each minute from a POST, every replay's in turn
	BaselineP99ByMinute     []float64      `json:"baseline_p99_ms_by_minute"`  // the same of the phases alone, each phase's in turn
	ReplayEvents            int            `json:"replay_events"`              // in the window, per replay
	ReplayJobs              []int64        `json:"replay_jobs"`                // what each POST answered
	EstimatedSeconds        []int64        `json:"estimated_seconds"`          // each dry run's
	EnqueueSeconds          []float64      `json:"enqueue_seconds"`            // each POST's answer time
	ReplaySeconds           []float64      `json:"replay_seconds"`             // POST to the last replayed 2xx
	ReplayRate              []float64      `json:"replay_rate"`                // jobs / ReplaySeconds
	ReplayAPIRate           []float64      `json:"replay_api_rate"`            // the API's rate once finished
	ReplayState             []string       `json:"replay_state"`               // the API's, at the end
	BaselineEventsPerSecond []float64      `json:"baseline_events_per_second"` // live, committed in each phase alone
	LiveEventsPerSecond     []float64      `json:"live_events_per_second"`     // committed during each replay
	LiveCommittedByRound    []int          `json:"live_committed_by_round"`    // during each replay
	BaselineStages          stageFigures   `json:"baseline_stages"`            // live, where commit->2xx went
	DuringStages            stageFigures   `json:"during_stages"`
	BaselineWorkers         workerFigures  `json:"baseline_workers"` // the child's claims and outcome writes
	DuringWorkers           workerFigures  `json:"during_workers"`
}

// replayTopic and liveTopic are replay's two kinds of event: those
// recorded before the endpoint exists, sent only by the replays, and the
// live ones.
const (
	replayTopic = "load.replayed"
	liveTopic   = "load.live"
)

// replayRun is one run of the scenario.
type replayRun struct {
	cfg                      config
	run                      loadRun
	child                    *child
	ep                       endpoint
	log                      *acceptLog
	producer                 laneProducer
	upTo                     int64     // the last replayed event's id
	since                    time.Time // the first one's created_at
	base, during             []time.Duration
	baseStages, duringStages laneStages
	baseCost, duringCost     workerCost
	s                        replaySummary
}

// replayedEventsSQL reads the bounds of the events a replay sends.
const replayedEventsSQL = `SELECT max(id), min(created_at) FROM outbox.events WHERE topic = $1`

// runReplay records -events events before the endpoint exists, then runs
// live producers to it at -rate, in rounds of a phase alone (-duration)
// and one during a replay of those events, started through the API and
// lasting until the receiver has accepted all of them; and a last phase
// alone. Every replay has a baseline before and after it: a replay runs
// for many minutes, and what drifts over them weighs on both sides.
func runReplay(ctx context.Context, cfg config, run loadRun) error {
	g := newRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	rr := &replayRun{cfg: cfg, run: run, child: g.children[0], log: newAcceptLog(),
		producer: laneProducer{db: run.db, topic: liveTopic, producers: cfg.Producers, rate: cfg.Rate}}
	if err := rr.recordPast(ctx); err != nil {
		return err
	}
	recv, err := g.receiver(func(webhookID string) requestAnswer {
		rr.log.accept(webhookID)
		return requestAnswer{Wait: cfg.AnswerAfter}
	}, true)
	if err != nil {
		return err
	}
	if rr.ep, err = g.endpoint(ctx, recv, endpointSettings{Topics: []string{"load.*"}, MaxInFlight: cfg.MaxInFlight}); err != nil {
		return err
	}
	rr.s = replaySummary{Mode: "replay", Rate: cfg.Rate, MaxInFlight: rr.ep.MaxInFlight, ReplayShare: replayShare(rr.ep.MaxInFlight),
		BaselineSeconds: cfg.Duration.Seconds(), Rounds: cfg.Rounds, ReplayEvents: cfg.Events,
		VacuumEverySeconds: cfg.VacuumEvery.Seconds(), AnswerAfterSeconds: cfg.AnswerAfter.Seconds()}
	stopVacuums := vacuumEvery(ctx, run.db, cfg.VacuumEvery, run.logger)
	defer stopVacuums()
	if err := rr.baseline(ctx, min(isolationWarmUp, cfg.Duration), false); err != nil { // the warm-up, not measured
		return err
	}
	for range cfg.Rounds {
		if err := rr.baseline(ctx, cfg.Duration, true); err != nil {
			return err
		}
		if err := rr.replayPhase(ctx); err != nil {
			return err
		}
	}
	if err := rr.baseline(ctx, cfg.Duration, true); err != nil {
		return err
	}
	rr.s.Vacuums = stopVacuums()
	rr.summarize()
	return rr.report(run.stdout)
}

// recordPast records the events the replays send. Recorded with no
// endpoint to send them to, they are fanned out into no job at all: each
// replay enqueues a new job for each.
func (rr *replayRun) recordPast(ctx context.Context) error {
	db := rr.run.db
	if err := recordBulk(ctx, db, replayTopic, rr.cfg.Events); err != nil {
		return err
	}
	if err := awaitFannedOut(ctx, db, replayTopic); err != nil {
		return err
	}
	if err := awaitNoBacklog(ctx, db); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, replayedEventsSQL, replayTopic).Scan(&rr.upTo, &rr.since); err != nil {
		return fmt.Errorf("read the replayed events: %w", err)
	}
	return nil
}

// request is the replay's POST body, or its dry run's.
func (rr *replayRun) request(dryRun bool) map[string]any {
	return map[string]any{"since": rr.since.Format(time.RFC3339Nano), "topics": []string{replayTopic}, "dry_run": dryRun}
}

// live waits until every one of events was accepted and returns their
// latencies.
func (rr *replayRun) live(ctx context.Context, events []laneEvent) (map[int64]laneTiming, error) {
	if err := rr.log.await(ctx, events, 10*time.Minute); err != nil {
		return nil, err
	}
	return timings(ctx, rr.run.db, events, rr.log.of(events))
}

// baseline runs the live producers alone for d; counted, unless it is
// the warm-up, with the baselines.
func (rr *replayRun) baseline(ctx context.Context, d time.Duration, counted bool) error {
	if err := vacuumQueues(ctx, rr.run.db); err != nil {
		return err
	}
	before, err := costReading(ctx, rr.child)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	started := time.Now()
	events, took := rr.producer.run(ctx, runCtx)
	after, err := costReading(ctx, rr.child)
	if err != nil {
		return err
	}
	t, err := rr.live(ctx, events)
	if err != nil || !counted {
		return err
	}
	rr.s.BaselineP99ByMinute = append(rr.s.BaselineP99ByMinute, p99ByMinute(events, t, started, started.Add(took))...)
	rr.baseCost.add(before, after, took)
	if err := rr.baseStages.add(ctx, rr.run.db, t); err != nil {
		return err
	}
	lat := sortedLatencies(events, t, nil)
	rr.base = append(rr.base, lat...)
	rr.s.BaselineEventsPerSecond = append(rr.s.BaselineEventsPerSecond, float64(len(events))/took.Seconds())
	rr.s.BaselineP99ByPhase = append(rr.s.BaselineP99ByPhase, ms(quantile(lat, 0.99)))
	return nil
}

// replayRound is what one replay phase saw: the live events committed
// beside it, the POST's answer and when it came, and when the last
// replayed event was accepted.
type replayRound struct {
	events           []laneEvent
	liveFor          time.Duration
	started, last    time.Time
	enqueued         time.Duration
	res              replayResult
	estimatedSeconds int64
}

// replayPhase runs the live producers beside one replay, from its POST
// until the receiver has accepted every replayed event, and notes it.
func (rr *replayRun) replayPhase(ctx context.Context) error {
	if err := vacuumQueues(ctx, rr.run.db); err != nil {
		return err
	}
	var preview replayPreview
	if err := rr.child.Replay(ctx, rr.ep.ID, rr.request(true), &preview); err != nil {
		return err
	}
	before, err := costReading(ctx, rr.child)
	if err != nil {
		return err
	}
	rr.log.startReplay(rr.upTo)
	r, err := rr.liveBesideReplay(ctx)
	if err != nil {
		return err
	}
	after, err := costReading(ctx, rr.child)
	if err != nil {
		return err
	}
	rr.duringCost.add(before, after, time.Since(r.started))
	r.estimatedSeconds = preview.EstimatedSeconds
	return rr.noteRound(ctx, r)
}

// liveBesideReplay posts the replay with the live producers running, and
// stops them once every replayed event was accepted.
func (rr *replayRun) liveBesideReplay(ctx context.Context) (replayRound, error) {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var r replayRound
	var wg sync.WaitGroup
	wg.Go(func() { r.events, r.liveFor = rr.producer.run(ctx, runCtx) })
	r.started = time.Now()
	err := rr.child.Replay(ctx, rr.ep.ID, rr.request(false), &r.res)
	r.enqueued = time.Since(r.started)
	if err == nil && r.res.Jobs == 0 {
		err = errors.New("the replay enqueued nothing")
	}
	if err == nil {
		r.last, err = rr.log.awaitReplayed(ctx, int(r.res.Jobs), 2*time.Hour)
	}
	stop()
	wg.Wait()
	return r, err
}

// noteRound adds a replay phase's live latencies and the replay's figures.
func (rr *replayRun) noteRound(ctx context.Context, r replayRound) error {
	t, err := rr.live(ctx, r.events)
	if err != nil {
		return err
	}
	if err := rr.duringStages.add(ctx, rr.run.db, t); err != nil {
		return err
	}
	view, err := rr.child.SettledReplayView(ctx, rr.ep.ID, r.res.ReplayID)
	if err != nil {
		return err
	}
	s := &rr.s
	lat := sortedLatencies(r.events, t, nil)
	rr.during = append(rr.during, lat...)
	s.DuringP99ByRound = append(s.DuringP99ByRound, ms(quantile(lat, 0.99)))
	s.DuringP99ByMinute = append(s.DuringP99ByMinute, p99ByMinute(r.events, t, r.started, r.last)...)
	took := r.last.Sub(r.started)
	s.EstimatedSeconds = append(s.EstimatedSeconds, r.estimatedSeconds)
	s.ReplayJobs = append(s.ReplayJobs, r.res.Jobs)
	s.EnqueueSeconds = append(s.EnqueueSeconds, r.enqueued.Seconds())
	s.ReplaySeconds = append(s.ReplaySeconds, took.Seconds())
	s.ReplayRate = append(s.ReplayRate, float64(r.res.Jobs)/took.Seconds())
	s.LiveCommittedByRound = append(s.LiveCommittedByRound, len(r.events))
	s.LiveEventsPerSecond = append(s.LiveEventsPerSecond, float64(len(r.events))/r.liveFor.Seconds())
	s.ReplayAPIRate, s.ReplayState = append(s.ReplayAPIRate, view.Rate), append(s.ReplayState, view.State)
	return nil
}

// summarize fills in the figures over every round, and the verdict.
func (rr *replayRun) summarize() {
	slices.Sort(rr.base)
	slices.Sort(rr.during)
	s := &rr.s
	s.Baseline, s.During = figures(rr.base), figures(rr.during)
	s.P99Ratio, s.P99RatioMet = p99Ratio(rr.base, rr.during)
	s.BaselineStages, s.DuringStages = rr.baseStages.figures(), rr.duringStages.figures()
	s.BaselineWorkers, s.DuringWorkers = rr.baseCost.figures(), rr.duringCost.figures()
}

func (rr *replayRun) report(out io.Writer) error {
	s, cfg := rr.s, rr.cfg
	fmt.Fprintf(out, "mode replay: live events at %g events/s to an endpoint (max_in_flight %d, replay share %d, its receiver answering after %s), warmed up %s, then %d round(s) of %s alone and the length of a %d-event replay beside it, and %s alone\n",
		cfg.Rate, s.MaxInFlight, s.ReplayShare, cfg.AnswerAfter, min(isolationWarmUp, cfg.Duration), cfg.Rounds, cfg.Duration, cfg.Events, cfg.Duration)
	for i := range s.ReplaySeconds {
		fmt.Fprintf(out, "round %d: live p99 alone %.1f ms, during the replay %.1f ms, alone %.1f ms; the replay: %d jobs (dry run's estimate %d s), its POST answered in %.1f s, "+
			"all accepted %.1f s after its POST: %.0f events/s (the API's rate %.0f/s, %s); live meanwhile %.0f events/s\n",
			i+1, s.BaselineP99ByPhase[i], s.DuringP99ByRound[i], s.BaselineP99ByPhase[i+1], s.ReplayJobs[i], s.EstimatedSeconds[i], s.EnqueueSeconds[i],
			s.ReplaySeconds[i], s.ReplayRate[i], s.ReplayAPIRate[i], s.ReplayState[i], s.LiveEventsPerSecond[i])
	}
	fmt.Fprintf(out, "live p99 by minute of the replays, ms: %v; of the phases alone: %v; live events/s committed in the phases alone: %.0f\n",
		s.DuringP99ByMinute, s.BaselineP99ByMinute, s.BaselineEventsPerSecond)
	fmt.Fprintf(out, "the queue tables vacuumed before each phase, and %d times during them (-vacuum-every %s)\n", s.Vacuums, cfg.VacuumEvery)
	fmt.Fprintf(out, "live, alone:             %s\n", s.Baseline)
	fmt.Fprintf(out, "live, during the replay: %s\n", s.During)
	fmt.Fprintf(out, "live, alone, by stage:   %s\n", s.BaselineStages)
	fmt.Fprintf(out, "live, during, by stage:  %s\n", s.DuringStages)
	fmt.Fprintf(out, "the workers, alone:      %s\n", s.BaselineWorkers)
	fmt.Fprintf(out, "the workers, during:     %s\n", s.DuringWorkers)
	fmt.Fprintf(out, "p99 during / p99 alone: %.2f (target <= %g): %s\n", s.P99Ratio, lanesP99Bound, verdict(s.P99RatioMet))
	return writeSummary(out, s)
}

// p99ByMinute is the p99 of the events committed in each minute from
// from until to: over a phase of many minutes the tables grow, and a
// figure for the whole phase hides how the latency moved with them. A
// remainder under half a minute joins the minute before it, where a
// figure of its own would be that of a few events (a 60 s phase ends a
// few milliseconds past its minute); a minute without events has none.
func p99ByMinute(events []laneEvent, t map[int64]laneTiming, from, to time.Time) []float64 {
	var p99s []float64
	for start := from; start.Before(to); {
		end := start.Add(time.Minute)
		if to.Sub(end) < time.Minute/2 {
			end = to.Add(time.Nanosecond) // the last event may be created at to
		}
		minute := sortedLatencies(events, t, func(_ laneEvent, lt laneTiming) bool {
			return !lt.Created.Before(start) && lt.Created.Before(end)
		})
		if len(minute) > 0 {
			p99s = append(p99s, ms(quantile(minute, 0.99)))
		}
		start = end
	}
	return p99s
}
