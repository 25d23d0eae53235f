// loadlanes.go: `outboxd load`'s delivery lane scenarios, issue 17's
// targets, each measured side by side in one run against a real child
// outboxd (README, "Endpoint isolation under load"):
//
//   - stuck: an ordered endpoint fed 50 events/s over 100 subjects, in
//     phases alternating between none failing and one subject's requests
//     answered 500 for 10 s: the other subjects' p99 in both;
//   - replay: an endpoint receiving live events (issue 17: at half the
//     keep-up rate; replayLiveRate by default), alone and during a
//     100,000-event replay started through the API:
//     the live p99 in both, and the replay's own rate;
//   - ordered: drains of 20,000 events of 1,000 subjects to one endpoint,
//     its ordering "none" and "subject" in turn: the two rates.
//
// Each prints a report and, last, one line "summary {...}" in JSON.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// The targets of issue 17 that these scenarios judge.
const (
	// lanesP99Bound bounds the p99 ratio of stuck and replay: a stuck
	// subject or a replay may make the other deliveries' p99 at most 1.5
	// times what it is without them.
	lanesP99Bound = 1.5
	// orderedDrainShare is the least share of the unordered drain rate an
	// ordered endpoint with 1,000 subjects must reach.
	orderedDrainShare = 0.8
	// replayLiveRate is replay's default live rate, events/s, kept so
	// that runs compare across builds. It was half the keep-up rate of
	// `outboxd load -mode keepup` when the scenario was written; the
	// pipeline has grown faster since, and the target's rate, half of
	// today's keep-up, is -rate (README, "Delivery lanes under load").
	replayLiveRate = 320
)

// p99Ratio is the p99 of with over the p99 of without (both sorted), and
// whether it is within lanesP99Bound. Without events on either side
// nothing is met.
func p99Ratio(without, with []time.Duration) (float64, bool) {
	base, other := quantile(without, 0.99), quantile(with, 0.99)
	if base <= 0 || len(with) == 0 {
		return 0, false
	}
	r := float64(other) / float64(base)
	return r, r <= lanesP99Bound
}

// drainShare is the ordered drain rate over the unordered one, and
// whether it reaches orderedDrainShare.
func drainShare(unordered, ordered float64) (float64, bool) {
	if unordered <= 0 || ordered <= 0 {
		return 0, false
	}
	r := ordered / unordered
	return r, r >= orderedDrainShare
}

// laneEvent is one event a lanes scenario committed, of subject
// laneSubject(Subject).
type laneEvent struct {
	ID      int64
	Subject int
}

func laneSubject(n int) string { return "lane-" + strconv.Itoa(n) }

// laneProducer commits single-event transactions of topic, like produce:
// at rate events/s over producers connections (0: as fast as the database
// commits), the run's k-th event of subject k mod subjects (subjects 0:
// each its own). With mark set, an event of subject 0 is recorded in an
// explicit transaction and mark gets its id before the commit: the
// receiver knows it as subject 0's when its first request arrives.
type laneProducer struct {
	db        *sql.DB
	topic     string
	producers int
	rate      float64
	subjects  int
	mark      func(id int64)
}

// laneRecordSQL records one event and answers its id.
const laneRecordSQL = `SELECT outbox.record($1, $2, '{"load": true}')`

// run produces until runCtx ends. Statements run under ctx, so that the
// last ones finish and each event committed is counted.
func (p laneProducer) run(ctx, runCtx context.Context) ([]laneEvent, time.Duration) {
	var interval time.Duration
	if p.rate > 0 {
		interval = time.Duration(float64(p.producers) / p.rate * float64(time.Second))
	}
	var seq atomic.Int64
	committed := make([][]laneEvent, p.producers)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range p.producers {
		wg.Go(func() {
			var tick <-chan time.Time
			if interval > 0 {
				select {
				case <-runCtx.Done():
					return
				case <-time.After(producerPhase(i, p.producers, interval)):
				}
				t := time.NewTicker(interval)
				defer t.Stop()
				tick = t.C
			}
			for runCtx.Err() == nil {
				if tick != nil {
					select {
					case <-runCtx.Done():
						return
					case <-tick:
					}
				}
				subject := int(seq.Add(1) - 1)
				if p.subjects > 0 {
					subject %= p.subjects
				}
				if id, err := p.record(ctx, subject); err == nil {
					committed[i] = append(committed[i], laneEvent{ID: id, Subject: subject})
				}
			}
		})
	}
	wg.Wait()
	return slices.Concat(committed...), time.Since(start)
}

func (p laneProducer) record(ctx context.Context, subject int) (int64, error) {
	var id int64
	if subject != 0 || p.mark == nil {
		err := p.db.QueryRowContext(ctx, laneRecordSQL, p.topic, laneSubject(subject)).Scan(&id)
		return id, err
	}
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := tx.QueryRowContext(ctx, laneRecordSQL, p.topic, laneSubject(subject)).Scan(&id); err != nil {
		return 0, err
	}
	p.mark(id)
	return id, tx.Commit()
}

// acceptance is an event's first 2xx: when the receiver answered it, and
// its place among every event's first 2xx (1 for the first).
type acceptance struct {
	At  time.Time
	Seq int64
}

// acceptLog is what a lanes scenario's receiver accepted, by event id.
// The load receiver keeps latencies without ids; a scenario that tells
// subjects, or live events from replayed ones, apart needs them.
type acceptLog struct {
	mu           sync.Mutex // protects the fields below
	accepted     map[int64]acceptance
	seq          int64
	replayedUpTo int64 // events with ids up to it are a replay's
	replayed     int   // those accepted since startReplay
	lastReplayed time.Time
}

func newAcceptLog() *acceptLog { return &acceptLog{accepted: map[int64]acceptance{}} }

// accept notes a 2xx answered now to the request of webhookID; only the
// first for an event counts.
func (l *acceptLog) accept(webhookID string) {
	id, err := strconv.ParseInt(webhookID, 10, 64)
	if err != nil {
		return // a recovery probe's: no event
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.accepted[id]; ok {
		return
	}
	l.seq++
	l.accepted[id] = acceptance{At: now, Seq: l.seq}
	if id <= l.replayedUpTo {
		l.replayed++
		l.lastReplayed = now
	}
}

// startReplay counts the events with ids up to upTo as a replay's from
// now on, forgetting their earlier acceptances: a replay sends them again.
func (l *acceptLog) startReplay(upTo int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.accepted {
		if id <= upTo {
			delete(l.accepted, id)
		}
	}
	l.replayedUpTo, l.replayed, l.lastReplayed = upTo, 0, time.Time{}
}

// awaitReplayed waits until n of the replay's events were accepted and
// returns when the last of them was.
func (l *acceptLog) awaitReplayed(ctx context.Context, n int, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		l.mu.Lock()
		got, last := l.replayed, l.lastReplayed
		l.mu.Unlock()
		if got >= n {
			return last, nil
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("load: %d of %d replayed events accepted after %s", got, n, timeout)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return last, err
		}
	}
}

// await waits until every one of events was accepted. It polls: a wake-up
// on every acceptance would scan the missing ones a thousand times a
// second.
func (l *acceptLog) await(ctx context.Context, events []laneEvent, timeout time.Duration) error {
	missing := make([]int64, len(events))
	for i, e := range events {
		missing[i] = e.ID
	}
	deadline := time.Now().Add(timeout)
	for {
		l.mu.Lock()
		missing = slices.DeleteFunc(missing, func(id int64) bool {
			_, ok := l.accepted[id]
			return ok
		})
		l.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("load: %d of %d events not accepted after %s", len(missing), len(events), timeout)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// of is the acceptances of events, those not accepted left out.
func (l *acceptLog) of(events []laneEvent) map[int64]acceptance {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[int64]acceptance, len(events))
	for _, e := range events {
		if a, ok := l.accepted[e.ID]; ok {
			out[e.ID] = a
		}
	}
	return out
}

// createdAtSQL reads events' created_at: now() of the statement that
// recorded each, where the load receiver's commit->2xx latency starts.
const createdAtSQL = `
SELECT id, created_at
FROM outbox.events
WHERE id = ANY($1)`

// laneTiming is an accepted event's latency and when it was recorded.
type laneTiming struct {
	Created time.Time
	Latency time.Duration
}

// timings reads when events were recorded and gives each accepted one's
// commit->2xx latency, from created_at to its first 2xx.
func timings(ctx context.Context, db *sql.DB, events []laneEvent, accepted map[int64]acceptance) (map[int64]laneTiming, error) {
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	rows, err := db.QueryContext(ctx, createdAtSQL, pq.Array(ids))
	if err != nil {
		return nil, fmt.Errorf("load: read events' created_at: %w", err)
	}
	defer rows.Close()
	out := make(map[int64]laneTiming, len(events))
	for rows.Next() {
		var id int64
		var created time.Time
		if err := rows.Scan(&id, &created); err != nil {
			return nil, fmt.Errorf("load: read events' created_at: %w", err)
		}
		if a, ok := accepted[id]; ok {
			out[id] = laneTiming{Created: created, Latency: a.At.Sub(created)}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load: read events' created_at: %w", err)
	}
	return out, nil
}

// sortedLatencies is the latencies of the events keep selects, sorted.
func sortedLatencies(events []laneEvent, t map[int64]laneTiming, keep func(laneEvent, laneTiming) bool) []time.Duration {
	var out []time.Duration
	for _, e := range events {
		if lt, ok := t[e.ID]; ok && (keep == nil || keep(e, lt)) {
			out = append(out, lt.Latency)
		}
	}
	slices.Sort(out)
	return out
}

// stageSQL reads, for events' deliveries, when the relay inserted each
// job (its created_at) and when its last attempt was claimed
// (attempted_at): with the event's created_at and first 2xx (timings),
// the bounds of each stage of the way.
const stageSQL = `
SELECT j.event_id, j.created_at, j.attempted_at
FROM outbox.jobs AS j
WHERE j.event_id = ANY($1) AND j.attempted_at IS NOT NULL`

// laneStages is where accepted events' commit->2xx went, stage by stage:
// fan-out (event to job), the wait for a claim (job to claim) and the
// claim to the receiver's 2xx (the worker's start, the request, the
// answer). Each is sorted once filled.
type laneStages struct {
	FanOut, ClaimWait, ClaimTo2xx []time.Duration
}

// add reads the stages of the deliveries of the events timed in t.
func (st *laneStages) add(ctx context.Context, db *sql.DB, t map[int64]laneTiming) error {
	ids := make([]int64, 0, len(t))
	for id := range t {
		ids = append(ids, id)
	}
	rows, err := db.QueryContext(ctx, stageSQL, pq.Array(ids))
	if err != nil {
		return fmt.Errorf("load: read the deliveries' stages: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var enqueued, claimed time.Time
		if err := rows.Scan(&id, &enqueued, &claimed); err != nil {
			return fmt.Errorf("load: read the deliveries' stages: %w", err)
		}
		lt := t[id]
		st.FanOut = append(st.FanOut, enqueued.Sub(lt.Created))
		st.ClaimWait = append(st.ClaimWait, claimed.Sub(enqueued))
		st.ClaimTo2xx = append(st.ClaimTo2xx, lt.Created.Add(lt.Latency).Sub(claimed))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load: read the deliveries' stages: %w", err)
	}
	return nil
}

// workerCost is what the child's claims and outcome writes did over some
// phases, from its /metrics: added up phase by phase with add.
type workerCost struct {
	seconds float64
	delta   map[string]float64
}

// machineBusy and machineTotal are pseudo-metrics workerCost adds to the
// child's: the machine's busy and elapsed CPU ticks (machineCPU).
const (
	machineBusy  = "machine_cpu_busy_ticks"
	machineTotal = "machine_cpu_ticks"
)

// costReading is the child's metrics with the machine's CPU ticks.
func (c *loadChild) costReading(ctx context.Context) (map[string]float64, error) {
	sums, err := c.metricSums(ctx)
	if err != nil {
		return nil, err
	}
	if busy, total, ok := machineCPU(); ok {
		sums[machineBusy], sums[machineTotal] = float64(busy), float64(total)
	}
	return sums, nil
}

// workerCostMetrics are the child's counters workerCost reads.
var workerCostMetrics = []string{
	"outboxd_job_claim_seconds_count", "outboxd_job_claim_seconds_sum", "outboxd_jobs_claimed_total",
	"outboxd_job_outcome_batch_seconds_count", "outboxd_job_outcome_batch_seconds_sum", "outboxd_job_outcomes_written_total",
	"outboxd_relay_passes_total", "outboxd_relay_pass_seconds_sum",
	machineBusy, machineTotal,
}

// add counts the phase between two readings of the child's metrics.
func (w *workerCost) add(before, after map[string]float64, took time.Duration) {
	if w.delta == nil {
		w.delta = map[string]float64{}
	}
	w.seconds += took.Seconds()
	for _, name := range workerCostMetrics {
		w.delta[name] += after[name] - before[name]
	}
}

// workerFigures is workerCost per second and per call.
type workerFigures struct {
	ClaimsPerSecond   float64 `json:"claims_per_second"`
	ClaimMS           float64 `json:"claim_ms"` // mean
	JobsPerClaim      float64 `json:"jobs_per_claim"`
	OutcomeBatchesPS  float64 `json:"outcome_batches_per_second"`
	OutcomeBatchMS    float64 `json:"outcome_batch_ms"` // mean
	JobsPerBatch      float64 `json:"jobs_per_outcome_batch"`
	RelayPassesPerSec float64 `json:"relay_passes_per_second"`
	RelayPassMS       float64 `json:"relay_pass_ms"` // mean
	MachineBusy       float64 `json:"machine_busy"`  // the share of every CPU's time spent busy
}

func (w workerCost) figures() workerFigures {
	d := w.delta
	per := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	return workerFigures{
		ClaimsPerSecond:   per(d["outboxd_job_claim_seconds_count"], w.seconds),
		ClaimMS:           1000 * per(d["outboxd_job_claim_seconds_sum"], d["outboxd_job_claim_seconds_count"]),
		JobsPerClaim:      per(d["outboxd_jobs_claimed_total"], d["outboxd_job_claim_seconds_count"]),
		OutcomeBatchesPS:  per(d["outboxd_job_outcome_batch_seconds_count"], w.seconds),
		OutcomeBatchMS:    1000 * per(d["outboxd_job_outcome_batch_seconds_sum"], d["outboxd_job_outcome_batch_seconds_count"]),
		JobsPerBatch:      per(d["outboxd_job_outcomes_written_total"], d["outboxd_job_outcome_batch_seconds_count"]),
		RelayPassesPerSec: per(d["outboxd_relay_passes_total"], w.seconds),
		RelayPassMS:       1000 * per(d["outboxd_relay_pass_seconds_sum"], d["outboxd_relay_passes_total"]),
		MachineBusy:       per(d[machineBusy], d[machineTotal]),
	}
}

func (f workerFigures) String() string {
	return fmt.Sprintf("%.0f claims/s of %.1f ms and %.1f jobs, %.0f outcome batches/s of %.1f ms and %.1f jobs, %.0f relay passes/s of %.1f ms; the machine's CPUs %.0f%% busy",
		f.ClaimsPerSecond, f.ClaimMS, f.JobsPerClaim, f.OutcomeBatchesPS, f.OutcomeBatchMS, f.JobsPerBatch, f.RelayPassesPerSec, f.RelayPassMS, 100*f.MachineBusy)
}

// stageFigures is laneStages' p50 and p99 of each stage, in ms.
type stageFigures struct {
	FanOutP50MS     float64 `json:"fan_out_p50_ms"`
	FanOutP99MS     float64 `json:"fan_out_p99_ms"`
	ClaimWaitP50MS  float64 `json:"claim_wait_p50_ms"`
	ClaimWaitP99MS  float64 `json:"claim_wait_p99_ms"`
	ClaimTo2xxP50MS float64 `json:"claim_to_2xx_p50_ms"`
	ClaimTo2xxP99MS float64 `json:"claim_to_2xx_p99_ms"`
}

func (st *laneStages) figures() stageFigures {
	for _, d := range [][]time.Duration{st.FanOut, st.ClaimWait, st.ClaimTo2xx} {
		slices.Sort(d)
	}
	return stageFigures{
		FanOutP50MS: ms(quantile(st.FanOut, 0.5)), FanOutP99MS: ms(quantile(st.FanOut, 0.99)),
		ClaimWaitP50MS: ms(quantile(st.ClaimWait, 0.5)), ClaimWaitP99MS: ms(quantile(st.ClaimWait, 0.99)),
		ClaimTo2xxP50MS: ms(quantile(st.ClaimTo2xx, 0.5)), ClaimTo2xxP99MS: ms(quantile(st.ClaimTo2xx, 0.99)),
	}
}

func (f stageFigures) String() string {
	return fmt.Sprintf("fan-out p50 %.1f p99 %.1f ms, wait for a claim p50 %.1f p99 %.1f ms, claim->2xx p50 %.1f p99 %.1f ms",
		f.FanOutP50MS, f.FanOutP99MS, f.ClaimWaitP50MS, f.ClaimWaitP99MS, f.ClaimTo2xxP50MS, f.ClaimTo2xxP99MS)
}

// orderViolations counts, over every subject, the events accepted before
// the event of their subject just before them (by id), or accepted while
// it never was.
func orderViolations(events []laneEvent, accepted map[int64]acceptance) int {
	bySubject := map[int][]int64{}
	for _, e := range events {
		bySubject[e.Subject] = append(bySubject[e.Subject], e.ID)
	}
	n := 0
	for _, ids := range bySubject {
		slices.Sort(ids)
		for i := 1; i < len(ids); i++ {
			prev, okPrev := accepted[ids[i-1]]
			cur, okCur := accepted[ids[i]]
			if okCur && (!okPrev || cur.Seq < prev.Seq) {
				n++
			}
		}
	}
	return n
}

// idSet is a set of event ids that the receiver reads while producers add.
type idSet struct {
	mu  sync.Mutex // protects ids
	ids map[int64]bool
}

func (s *idSet) add(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[int64]bool{}
	}
	s.ids[id] = true
}

func (s *idSet) has(webhookID string) bool {
	id, err := strconv.ParseInt(webhookID, 10, 64)
	s.mu.Lock()
	defer s.mu.Unlock()
	return err == nil && s.ids[id]
}

// latencyFigures are a sorted set of latencies as a summary shows them.
type latencyFigures struct {
	Events int     `json:"events"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
}

func figures(sorted []time.Duration) latencyFigures {
	return latencyFigures{Events: len(sorted), P50MS: ms(quantile(sorted, 0.5)), P99MS: ms(quantile(sorted, 0.99)), MaxMS: ms(quantile(sorted, 1))}
}

func (f latencyFigures) String() string {
	return fmt.Sprintf("%5d events, commit->2xx p50 %.1f ms p99 %.1f ms max %.1f ms", f.Events, f.P50MS, f.P99MS, f.MaxMS)
}

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

// loadStuck runs an ordered endpoint at a steady rate over many subjects,
// in rounds of a phase where every subject is served and one where the
// first subject's requests are answered 500 for -fail-for, and compares
// the other subjects' latency in the two. Rounds alternate which phase
// goes first (none failing, failing, failing, none failing, ...), so that
// whatever weighs on one place in a round weighs on both phases alike:
// with the same order in every round, one phase was the slower in every
// round of a run in two runs of three, the baseline in one and the
// failing phase in the other.
func loadStuck(ctx context.Context, cfg loadConfig, run loadRun) error {
	if cfg.Subjects < 2 {
		return fmt.Errorf("-subjects must be at least 2 for -mode stuck (one fails, the others are measured), got %d", cfg.Subjects)
	}
	g := newScenarioRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	log := newAcceptLog()
	var stuck idSet
	var failing atomic.Bool
	var mu sync.Mutex // protects refusals
	var refusals []time.Time
	recv, err := g.receiver(func(webhookID string) requestAnswer {
		if failing.Load() && stuck.has(webhookID) {
			mu.Lock()
			refusals = append(refusals, time.Now())
			mu.Unlock()
			return requestAnswer{Wait: cfg.FailAfter, Status: http.StatusInternalServerError}
		}
		log.accept(webhookID)
		return requestAnswer{}
	})
	if err != nil {
		return err
	}
	ep, err := g.endpoint(ctx, recv, loadEndpoint{Topics: []string{"load.*"}, MaxInFlight: cfg.MaxInFlight, Ordering: orderingSubject})
	if err != nil {
		return err
	}
	producer := laneProducer{db: run.db, topic: "load.lanes", producers: cfg.Producers, rate: cfg.Rate, subjects: cfg.Subjects, mark: stuck.add}
	failStart := min(stuckFailStart, cfg.Duration/4)

	// phase runs the producers for d, refusing the first subject's
	// requests from failStart for -fail-for if fail says so, and waits
	// until every event committed was accepted. It returns them, and when
	// the refusals began and ended (without: when they would have).
	type phaseRun struct {
		events        []laneEvent
		failFrom, end time.Time
	}
	phase := func(d time.Duration, fail bool) (phaseRun, error) {
		runCtx, stop := context.WithTimeout(ctx, d)
		defer stop()
		start := time.Now()
		failFrom, end := start.Add(failStart), start.Add(failStart+cfg.FailFor)
		var wg sync.WaitGroup
		if fail {
			wg.Go(func() {
				if sleepCtx(ctx, failStart) != nil {
					return
				}
				failFrom = time.Now()
				failing.Store(true)
				sleepCtx(ctx, cfg.FailFor)
				failing.Store(false)
				end = time.Now()
			})
		}
		events, _ := producer.run(ctx, runCtx)
		wg.Wait()
		return phaseRun{events: events, failFrom: failFrom, end: end}, log.await(ctx, events, 10*time.Minute)
	}
	if _, err := phase(min(isolationWarmUp, cfg.Duration), false); err != nil { // the warm-up, as in isolation
		return err
	}
	s := stuckSummary{Mode: "stuck", Rate: cfg.Rate, Subjects: cfg.Subjects, MaxInFlight: ep.MaxInFlight,
		PhaseSeconds: cfg.Duration.Seconds(), Rounds: cfg.Rounds, FailStartSeconds: failStart.Seconds(), FailForSeconds: cfg.FailFor.Seconds()}
	var all []laneEvent
	var base, fail, windowBase, windowFail []time.Duration
	others := func(e laneEvent, _ laneTiming) bool { return e.Subject != 0 }
	inWindow := func(p phaseRun) func(laneEvent, laneTiming) bool {
		return func(e laneEvent, t laneTiming) bool {
			return e.Subject != 0 && !t.Created.Before(p.failFrom) && t.Created.Before(p.end)
		}
	}
	for round := range cfg.Rounds {
		order := []bool{false, true}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, failPhase := range order {
			p, err := phase(cfg.Duration, failPhase)
			if err != nil {
				return err
			}
			all = append(all, p.events...)
			t, err := timings(ctx, run.db, p.events, log.of(p.events))
			if err != nil {
				return err
			}
			lat, window := sortedLatencies(p.events, t, others), sortedLatencies(p.events, t, inWindow(p))
			if !failPhase {
				base, windowBase = append(base, lat...), append(windowBase, window...)
				s.BaselineP99ByRound = append(s.BaselineP99ByRound, ms(quantile(lat, 0.99)))
				continue
			}
			fail, windowFail = append(fail, lat...), append(windowFail, window...)
			s.FailingP99ByRound = append(s.FailingP99ByRound, ms(quantile(lat, 0.99)))
			stuckLat := sortedLatencies(p.events, t, func(e laneEvent, _ laneTiming) bool { return e.Subject == 0 })
			s.StuckEvents += len(stuckLat)
			s.StuckMaxMS = max(s.StuckMaxMS, ms(quantile(stuckLat, 1)))
			// After its refusals the subject's head waits for its retry:
			// the schedule's, not the receiver's, time.
			accepted := log.of(p.events)
			var next time.Time
			for _, e := range p.events {
				if a, ok := accepted[e.ID]; ok && e.Subject == 0 && a.At.After(p.end) && (next.IsZero() || a.At.Before(next)) {
					next = a.At
				}
			}
			if !next.IsZero() {
				s.HeldAfterSeconds = max(s.HeldAfterSeconds, next.Sub(p.end).Seconds())
			}
		}
	}
	mu.Lock()
	s.StuckRefused = len(refusals)
	mu.Unlock()
	accepted := log.of(all)
	s.OrderViolations, s.Unaccepted = orderViolations(all, accepted), len(all)-len(accepted)
	slices.Sort(base)
	slices.Sort(fail)
	slices.Sort(windowBase)
	slices.Sort(windowFail)
	s.Baseline, s.Failing, s.WindowBaseline, s.WindowFailing = figures(base), figures(fail), figures(windowBase), figures(windowFail)
	s.P99Ratio, s.P99RatioMet = p99Ratio(base, fail)
	s.WindowP99Ratio, _ = p99Ratio(windowBase, windowFail)

	out := run.stdout
	fmt.Fprintf(out, "mode stuck: an ordered endpoint (max_in_flight %d), %g events/s over %d subjects, warmed up %s, then %d round(s) of %s with none failing and %s with lane-0's requests answered 500 (after %s) from %s in for %s\n",
		ep.MaxInFlight, cfg.Rate, cfg.Subjects, min(isolationWarmUp, cfg.Duration), cfg.Rounds, cfg.Duration, cfg.Duration, cfg.FailAfter, failStart, cfg.FailFor)
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
	fmt.Fprintf(out, "order: %d events accepted before their subject's previous one, %d never accepted, of %d\n", s.OrderViolations, s.Unaccepted, len(all))
	return writeSummary(out, s)
}

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

// loadReplay records -events events before the endpoint exists, then runs
// live producers to it at -rate, in rounds of a phase alone (-duration)
// and one during a replay of those events, started through the API and
// lasting until the receiver has accepted all of them; and a last phase
// alone.
func loadReplay(ctx context.Context, cfg loadConfig, run loadRun) error {
	g := newScenarioRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	child := g.children[0]
	// Recorded with no endpoint to send them to, they are fanned out into
	// no job at all (the relay keeps the subject index itself): the
	// replay enqueues a new job for each.
	if err := recordBulk(ctx, run.db, replayTopic, cfg.Events); err != nil {
		return err
	}
	if err := awaitFannedOut(ctx, run.db, replayTopic); err != nil {
		return err
	}
	if err := awaitNoBacklog(ctx, run.db); err != nil {
		return err
	}
	var upTo int64
	var since time.Time
	if err := run.db.QueryRowContext(ctx, `SELECT max(id), min(created_at) FROM outbox.events WHERE topic = $1`, replayTopic).Scan(&upTo, &since); err != nil {
		return fmt.Errorf("load: the replayed events: %w", err)
	}
	log := newAcceptLog()
	recv, err := g.receiver(func(webhookID string) requestAnswer {
		log.accept(webhookID)
		return requestAnswer{Wait: cfg.AnswerAfter}
	})
	if err != nil {
		return err
	}
	ep, err := g.endpoint(ctx, recv, loadEndpoint{Topics: []string{"load.*"}, MaxInFlight: cfg.MaxInFlight})
	if err != nil {
		return err
	}
	producer := laneProducer{db: run.db, topic: liveTopic, producers: cfg.Producers, rate: cfg.Rate}
	live := func(events []laneEvent) (map[int64]laneTiming, error) {
		if err := log.await(ctx, events, 10*time.Minute); err != nil {
			return nil, err
		}
		return timings(ctx, run.db, events, log.of(events))
	}
	var base, during []time.Duration
	var baseStages, duringStages laneStages
	var baseCost, duringCost workerCost
	s := replaySummary{Mode: "replay", Rate: cfg.Rate, MaxInFlight: ep.MaxInFlight, ReplayShare: replayShare(ep.MaxInFlight),
		BaselineSeconds: cfg.Duration.Seconds(), Rounds: cfg.Rounds, ReplayEvents: cfg.Events, VacuumEverySeconds: cfg.VacuumEvery.Seconds(), AnswerAfterSeconds: cfg.AnswerAfter.Seconds()}
	// baseline runs the live producers alone for d; counted, unless it is
	// the warm-up, with the baselines.
	baseline := func(d time.Duration, counted bool) error {
		if err := vacuumQueues(ctx, run.db); err != nil {
			return err
		}
		before, err := child.costReading(ctx)
		if err != nil {
			return err
		}
		runCtx, stop := context.WithTimeout(ctx, d)
		defer stop()
		started := time.Now()
		events, took := producer.run(ctx, runCtx)
		after, err := child.costReading(ctx)
		if err != nil {
			return err
		}
		t, err := live(events)
		if err != nil || !counted {
			return err
		}
		s.BaselineP99ByMinute = append(s.BaselineP99ByMinute, p99ByMinute(events, t, started, started.Add(took))...)
		baseCost.add(before, after, took)
		if err := baseStages.add(ctx, run.db, t); err != nil {
			return err
		}
		lat := sortedLatencies(events, t, nil)
		base = append(base, lat...)
		s.BaselineEventsPerSecond = append(s.BaselineEventsPerSecond, float64(len(events))/took.Seconds())
		s.BaselineP99ByPhase = append(s.BaselineP99ByPhase, ms(quantile(lat, 0.99)))
		return nil
	}
	stopVacuums := vacuumEvery(ctx, run.db, cfg.VacuumEvery, run.logger)
	defer stopVacuums()
	if err := baseline(min(isolationWarmUp, cfg.Duration), false); err != nil { // the warm-up, as in isolation
		return err
	}
	req := map[string]any{"since": since.Format(time.RFC3339Nano), "topics": []string{replayTopic}}
	for range cfg.Rounds {
		// Every replay phase has a baseline before and after it: a
		// replay runs for many minutes, and what drifts over them weighs
		// on both sides.
		if err := baseline(cfg.Duration, true); err != nil {
			return err
		}
		if err := vacuumQueues(ctx, run.db); err != nil {
			return err
		}
		var preview ReplayPreview
		if err := child.replay(ctx, ep.ID, map[string]any{"since": req["since"], "topics": req["topics"], "dry_run": true}, &preview); err != nil {
			return err
		}
		s.EstimatedSeconds = append(s.EstimatedSeconds, preview.EstimatedSeconds)
		before, err := child.costReading(ctx)
		if err != nil {
			return err
		}
		log.startReplay(upTo)
		runCtx, stop := context.WithCancel(ctx)
		var events []laneEvent
		var liveFor time.Duration
		var wg sync.WaitGroup
		wg.Go(func() { events, liveFor = producer.run(ctx, runCtx) })
		started := time.Now()
		var res ReplayResult
		err = child.replay(ctx, ep.ID, req, &res)
		enqueued := time.Since(started)
		var last time.Time
		if err == nil && res.Jobs == 0 {
			err = errors.New("load: the replay enqueued nothing")
		}
		if err == nil {
			last, err = log.awaitReplayed(ctx, int(res.Jobs), 2*time.Hour)
		}
		stop()
		wg.Wait()
		if err != nil {
			return err
		}
		after, err := child.costReading(ctx)
		if err != nil {
			return err
		}
		duringCost.add(before, after, time.Since(started))
		t, err := live(events)
		if err != nil {
			return err
		}
		if err := duringStages.add(ctx, run.db, t); err != nil {
			return err
		}
		lat := sortedLatencies(events, t, nil)
		during = append(during, lat...)
		s.DuringP99ByRound = append(s.DuringP99ByRound, ms(quantile(lat, 0.99)))
		s.DuringP99ByMinute = append(s.DuringP99ByMinute, p99ByMinute(events, t, started, last)...)
		took := last.Sub(started)
		s.ReplayJobs = append(s.ReplayJobs, res.Jobs)
		s.EnqueueSeconds = append(s.EnqueueSeconds, enqueued.Seconds())
		s.ReplaySeconds = append(s.ReplaySeconds, took.Seconds())
		s.ReplayRate = append(s.ReplayRate, float64(res.Jobs)/took.Seconds())
		s.LiveCommittedByRound = append(s.LiveCommittedByRound, len(events))
		s.LiveEventsPerSecond = append(s.LiveEventsPerSecond, float64(len(events))/liveFor.Seconds())
		view, err := child.settledReplayView(ctx, ep.ID, res.ReplayID)
		if err != nil {
			return err
		}
		s.ReplayAPIRate, s.ReplayState = append(s.ReplayAPIRate, view.Rate), append(s.ReplayState, view.State)
	}
	if err := baseline(cfg.Duration, true); err != nil {
		return err
	}
	s.Vacuums = stopVacuums()
	slices.Sort(base)
	slices.Sort(during)
	s.Baseline, s.During = figures(base), figures(during)
	s.P99Ratio, s.P99RatioMet = p99Ratio(base, during)
	s.BaselineStages, s.DuringStages = baseStages.figures(), duringStages.figures()
	s.BaselineWorkers, s.DuringWorkers = baseCost.figures(), duringCost.figures()

	out := run.stdout
	fmt.Fprintf(out, "mode replay: live events at %g events/s to an endpoint (max_in_flight %d, replay share %d, its receiver answering after %s), warmed up %s, then %d round(s) of %s alone and the length of a %d-event replay beside it, and %s alone\n",
		cfg.Rate, ep.MaxInFlight, s.ReplayShare, cfg.AnswerAfter, min(isolationWarmUp, cfg.Duration), cfg.Rounds, cfg.Duration, cfg.Events, cfg.Duration)
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

// vacuumQueues vacuums the queue tables. A phase that starts after it
// does not claim past the dead rows of the phases before, nor of the
// setup's fan-out, where autovacuum is off (README,
// "Performance"): in one run without it, the baseline after a replay was
// as slow as the replay phase (p99 442 and 443 ms, 209 ms before).
func vacuumQueues(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `VACUUM outbox.jobs, outbox.events`); err != nil {
		return fmt.Errorf("load: vacuum: %w", err)
	}
	return nil
}

// vacuumEvery vacuums the queue tables every interval (0: never) until
// the returned stop is called, which returns how many times it did: a
// stand-in for autovacuum where it is off.
func vacuumEvery(ctx context.Context, db *sql.DB, every time.Duration, logger *slog.Logger) (stop func() int) {
	if every <= 0 {
		return func() int { return 0 }
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	n := 0
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := vacuumQueues(ctx, db); err != nil {
				if ctx.Err() == nil {
					logger.Warn("load: periodic vacuum", "err", err)
				}
				continue
			}
			n++
		}
	}()
	var once sync.Once
	return func() int {
		once.Do(func() { cancel(); <-done })
		return n
	}
}

// awaitNoBacklog waits until no event waits for the relay and no job for
// a worker.
func awaitNoBacklog(ctx context.Context, db *sql.DB) error {
	for {
		n, err := loadBacklog(ctx, db)
		if err != nil || n == 0 {
			return err
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// replay posts a replay request (or its dry run) for endpoint id and
// decodes the answer into out.
func (c *loadChild) replay(ctx context.Context, id int64, req map[string]any, out any) error {
	var answer json.RawMessage
	status, err := c.call(ctx, "POST", fmt.Sprintf("/api/endpoints/%d/replay", id), req, &answer)
	switch {
	case err != nil:
	case status == http.StatusOK:
		err = json.Unmarshal(answer, out)
	default:
		var refusal struct {
			Error string `json:"error"`
		}
		json.Unmarshal(answer, &refusal)
		err = fmt.Errorf("status %d %s", status, refusal.Error)
	}
	if err != nil {
		return fmt.Errorf("load: replay to endpoint %d: %w", id, err)
	}
	return nil
}

// replayView reads replay replayID of endpoint id through the API.
func (c *loadChild) replayView(ctx context.Context, id, replayID int64) (ReplayView, error) {
	var list struct {
		Replays []ReplayView `json:"replays"`
	}
	status, err := c.call(ctx, "GET", fmt.Sprintf("/api/endpoints/%d/replays", id), nil, &list)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("status %d", status)
	}
	if err != nil {
		return ReplayView{}, fmt.Errorf("load: replays of endpoint %d: %w", id, err)
	}
	for _, v := range list.Replays {
		if v.ID == replayID {
			return v, nil
		}
	}
	return ReplayView{}, fmt.Errorf("load: replay %d of endpoint %d not listed", replayID, id)
}

// replaySettleWait bounds how long settledReplayView waits for the last
// outcomes to be written: the completer's batches, not the network.
const replaySettleWait = 30 * time.Second

// settledReplayView is the replay as the API shows it once it has
// finished. The receiver accepting every replayed event comes first; the
// replay finishes when the completer has recorded their outcomes, a
// moment later, so a single read could still find it running. After
// replaySettleWait it is returned as it is.
func (c *loadChild) settledReplayView(ctx context.Context, id, replayID int64) (ReplayView, error) {
	deadline := time.Now().Add(replaySettleWait)
	for {
		view, err := c.replayView(ctx, id, replayID)
		if err != nil || view.State == replayFinished || time.Now().After(deadline) {
			return view, err
		}
		select {
		case <-ctx.Done():
			return view, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// patchEndpoint changes endpoint id's settings through the API.
func (c *loadChild) patchEndpoint(ctx context.Context, id int64, patch map[string]any) error {
	var answer struct {
		Error string `json:"error"`
	}
	status, err := c.call(ctx, "PATCH", fmt.Sprintf("/api/endpoints/%d", id), patch, &answer)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("status %d %s", status, answer.Error)
	}
	if err != nil {
		return fmt.Errorf("load: patch endpoint %d: %w", id, err)
	}
	return nil
}

// orderedSummary is -mode ordered's result: each drain's seconds, by
// ordering, and the rates over all of them.
type orderedSummary struct {
	Mode             string    `json:"mode"`
	Events           int       `json:"events"`
	Subjects         int       `json:"subjects"`
	MaxInFlight      int       `json:"max_in_flight"`
	Rounds           int       `json:"rounds"`
	UnorderedSeconds []float64 `json:"unordered_seconds"`
	OrderedSeconds   []float64 `json:"ordered_seconds"`
	UnorderedRate    float64   `json:"unordered_rate"` // events/s over every unordered drain
	OrderedRate      float64   `json:"ordered_rate"`
	Ratio            float64   `json:"ratio"`
	Met              bool      `json:"met"`              // ≥ 0.8
	OrderViolations  int       `json:"order_violations"` // in the ordered drains
}

// recordLanesSQL records events $1 to $2 of topic $3, event i of subject
// i mod $4, in one statement.
const recordLanesSQL = `
SELECT outbox.record($3, 'lane-' || (i % $4), '{"load": true}')
FROM generate_series($1::int, $2::int) AS i`

// laneEventsSQL reads the events of a topic with their subjects'
// numbers (recordLanesSQL's lane-<n>).
const laneEventsSQL = `
SELECT id, split_part(subject, '-', 2)::int
FROM outbox.events
WHERE topic = $1`

// loadOrdered drains -events events of -subjects subjects to one endpoint
// with ordering "none" and "subject" in turn, as drain does: outboxd
// stopped, the events recorded, outboxd started and timed until the last
// is accepted. Rounds alternate which goes first (none, subject, subject,
// none, ...), so that a trend over the run weighs on both alike.
func loadOrdered(ctx context.Context, cfg loadConfig, run loadRun) error {
	if cfg.Subjects < 1 {
		return fmt.Errorf("-subjects must be at least 1 for -mode ordered, got %d", cfg.Subjects)
	}
	g := newScenarioRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	log := newAcceptLog()
	recv, err := g.receiver(func(webhookID string) requestAnswer {
		log.accept(webhookID)
		return requestAnswer{}
	})
	if err != nil {
		return err
	}
	// As drain: the cap is the child's workers unless -max-in-flight says
	// otherwise, so that the pipeline is measured, not the cap.
	maxInFlight := cfg.MaxInFlight
	if maxInFlight == 0 {
		maxInFlight = childWorkers(g.extra, os.Getenv)
	}
	ep, err := g.endpoint(ctx, recv, loadEndpoint{Topics: []string{"load.*"}, MaxInFlight: maxInFlight})
	if err != nil {
		return err
	}
	drains := 0
	drain := func(ordering string) (time.Duration, []laneEvent, error) {
		drains++
		topic := fmt.Sprintf("load.drain%d", drains)
		if err := g.children[0].patchEndpoint(ctx, ep.ID, map[string]any{"ordering": ordering}); err != nil {
			return 0, nil, err
		}
		g.stopChildren()
		// autovacuum may be off (README, "Performance"): without this the
		// later drains would claim past the earlier ones' dead rows.
		if _, err := run.db.ExecContext(ctx, `VACUUM outbox.jobs, outbox.events`); err != nil {
			return 0, nil, fmt.Errorf("load: vacuum: %w", err)
		}
		for done := 0; done < cfg.Events; done += 10_000 {
			if _, err := run.db.ExecContext(ctx, recordLanesSQL, done, min(done+10_000, cfg.Events)-1, topic, cfg.Subjects); err != nil {
				return 0, nil, fmt.Errorf("load: record events: %w", err)
			}
		}
		events, err := queryAll(ctx, run.db, func(r rowScanner) (laneEvent, error) {
			var e laneEvent
			return e, r.Scan(&e.ID, &e.Subject)
		}, laneEventsSQL, topic)
		if err != nil {
			return 0, nil, fmt.Errorf("load: read the drain's events: %w", err)
		}
		start := time.Now()
		if err := g.start(ctx, 1); err != nil {
			return 0, nil, err
		}
		if err := log.await(ctx, events, 30*time.Minute); err != nil {
			return 0, nil, err
		}
		return time.Since(start), events, nil
	}
	s := orderedSummary{Mode: "ordered", Events: cfg.Events, Subjects: cfg.Subjects, MaxInFlight: maxInFlight, Rounds: cfg.Rounds}
	var unordered, ordered time.Duration
	for round := range cfg.Rounds {
		order := []string{orderingNone, orderingSubject}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, ordering := range order {
			took, events, err := drain(ordering)
			if err != nil {
				return err
			}
			if ordering == orderingNone {
				unordered += took
				s.UnorderedSeconds = append(s.UnorderedSeconds, took.Seconds())
				continue
			}
			ordered += took
			s.OrderedSeconds = append(s.OrderedSeconds, took.Seconds())
			s.OrderViolations += orderViolations(events, log.of(events))
		}
	}
	n := float64(cfg.Events * cfg.Rounds)
	s.UnorderedRate, s.OrderedRate = n/unordered.Seconds(), n/ordered.Seconds()
	s.Ratio, s.Met = drainShare(s.UnorderedRate, s.OrderedRate)

	out := run.stdout
	fmt.Fprintf(out, "mode ordered: %d round(s) of two drains of %d events over %d subjects to one endpoint (max_in_flight %d), ordering none and subject, alternating which goes first\n",
		cfg.Rounds, cfg.Events, cfg.Subjects, maxInFlight)
	for i := range s.UnorderedSeconds {
		fmt.Fprintf(out, "round %d: none %.2f s (%.0f events/s), subject %.2f s (%.0f events/s)\n", i+1,
			s.UnorderedSeconds[i], float64(cfg.Events)/s.UnorderedSeconds[i], s.OrderedSeconds[i], float64(cfg.Events)/s.OrderedSeconds[i])
	}
	fmt.Fprintf(out, "ordered %.0f events/s / unordered %.0f events/s: %.2f (target >= %g): %s\n",
		s.OrderedRate, s.UnorderedRate, s.Ratio, orderedDrainShare, verdict(s.Met))
	fmt.Fprintf(out, "order: %d events of the ordered drains accepted before their subject's previous one\n", s.OrderViolations)
	return writeSummary(out, s)
}
