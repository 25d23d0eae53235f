// lanes.go: what the delivery lane scenarios (stuck, replay, ordered)
// share: the log of which event was accepted when, each event's latency
// from the created_at outbox.events holds, where that latency went stage
// by stage (outbox.jobs' created_at and attempted_at), and what outboxd's
// claims and outcome writes cost, from its /metrics.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/lib/pq"
)

// acceptance is an event's first 2xx: when the receiver answered it, and
// its place among every event's first 2xx (1 for the first).
type acceptance struct {
	At  time.Time
	Seq int64
}

// acceptLog is what a lanes scenario's receiver accepted, by event id.
// The receiver keeps latencies without ids; a scenario that tells
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
			return last, fmt.Errorf("%d of %d replayed events accepted after %s", got, n, timeout)
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
			return fmt.Errorf("%d of %d events not accepted after %s", len(missing), len(events), timeout)
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

// createdAtSQL reads events' created_at: now() of the statement that
// recorded each, where the receiver's commit->2xx latency starts.
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
		return nil, fmt.Errorf("read events' created_at: %w", err)
	}
	defer rows.Close()
	out := make(map[int64]laneTiming, len(events))
	for rows.Next() {
		var id int64
		var created time.Time
		if err := rows.Scan(&id, &created); err != nil {
			return nil, fmt.Errorf("read events' created_at: %w", err)
		}
		if a, ok := accepted[id]; ok {
			out[id] = laneTiming{Created: created, Latency: a.At.Sub(created)}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read events' created_at: %w", err)
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
		return fmt.Errorf("read the deliveries' stages: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var enqueued, claimed time.Time
		if err := rows.Scan(&id, &enqueued, &claimed); err != nil {
			return fmt.Errorf("read the deliveries' stages: %w", err)
		}
		lt := t[id]
		st.FanOut = append(st.FanOut, enqueued.Sub(lt.Created))
		st.ClaimWait = append(st.ClaimWait, claimed.Sub(enqueued))
		st.ClaimTo2xx = append(st.ClaimTo2xx, lt.Created.Add(lt.Latency).Sub(claimed))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the deliveries' stages: %w", err)
	}
	return nil
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
func costReading(ctx context.Context, c *child) (map[string]float64, error) {
	sums, err := c.MetricSums(ctx)
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
	"outboxd_relay_passes_total", "outboxd_relay_pass_seconds_sum", "outboxd_relay_jobs_claimed_total",
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
	RelayJobsPerPass  float64 `json:"relay_jobs_claimed_per_pass"`
	MachineBusy       float64 `json:"machine_busy"` // the share of every CPU's time spent busy
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
		RelayJobsPerPass:  per(d["outboxd_relay_jobs_claimed_total"], d["outboxd_relay_passes_total"]),
		MachineBusy:       per(d[machineBusy], d[machineTotal]),
	}
}

func (f workerFigures) String() string {
	return fmt.Sprintf("%.0f claims/s of %.1f ms and %.1f jobs, %.0f outcome batches/s of %.1f ms and %.1f jobs, %.0f relay passes/s of %.1f ms claiming %.1f jobs; the machine's CPUs %.0f%% busy",
		f.ClaimsPerSecond, f.ClaimMS, f.JobsPerClaim, f.OutcomeBatchesPS, f.OutcomeBatchMS, f.JobsPerBatch, f.RelayPassesPerSec, f.RelayPassMS, f.RelayJobsPerPass, 100*f.MachineBusy)
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
