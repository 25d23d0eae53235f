// relay.go: the relay, which claims un-fanned events by row and fans each
// out into one job per subscriber and per subscribing endpoint, in the
// transaction that marks it fanned.
//
// Guarantees (README, "Guarantees, hop by hop", hops 2 and 3):
//   - Claim, enqueue and mark share one transaction. A crash anywhere rolls
//     all three back, and the next pass claims the rows again.
//   - Rows are claimed by their state (fanned_out_at IS NULL) with FOR UPDATE
//     SKIP LOCKED, never by advancing a cursor: ids are taken at insert and
//     commit out of order, so a cursor can pass a row that commits later and
//     lose it forever. Any number of relays share the backlog this way.
//   - A batch that fails is retried row by row, so one bad row holds up no
//     other; a row that fails MaxFailures times is poisoned: set aside with
//     its error, counted on the overview, never deleted, until requeued.
//   - Passes run on a NOTIFY and on a sweep every SweepInterval, so a lost
//     notification delays events by at most one interval.

package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// RelayConfig holds the relay's numbers.
type RelayConfig struct {
	// BatchSize bounds the events one relay transaction claims, so a bulk
	// write of thousands of events drains in short transactions that hold
	// few locks and produce bounded job inserts.
	BatchSize int
	// MaxFailures is how many failed relay attempts poison a row. Five tells
	// a bad row from a passing fault without letting one row stall the rest.
	MaxFailures int
	// SweepInterval is how often the relay runs without a notification. A
	// lost NOTIFY costs at most this much latency, never an event.
	SweepInterval time.Duration
	// FailingEndpointDelay is how far out new deliveries are scheduled to
	// an endpoint whose circuit breaker is open (WorkerConfig's
	// BreakerThreshold): a receiver that is down gets one attempt per
	// event every few minutes instead of a burst of doomed ones, and
	// recovers at its own pace.
	FailingEndpointDelay time.Duration
}

// relay moves events into jobs. Run drives it; relayOnce is one pass.
type relay struct {
	db             *sql.DB
	cfg            RelayConfig
	jobMaxAttempts int
	targets        string // the subscribers as the fan-out statement reads them
	logger         *slog.Logger

	// Counters for /metrics, only ever incremented.
	passes       atomic.Int64
	eventsFanned atomic.Int64
	jobsEnqueued atomic.Int64
	rowFailures  atomic.Int64
	jobsClaimed  atomic.Int64 // by passes, for this process's workers (fan_out_and_claim)
	passTime     *histogram   // one pass's statement (with its claim for the workers, if any), seconds
	// notifyOrigin, when this process listens, names its relay's
	// transactions in their NOTIFY to the workers, so that the listener
	// does not wake them a second time for a pass the relay pokes them
	// for itself (notify.go, wakeups.origin); "" otherwise.
	notifyOrigin string
	// workers, if set, are this process's workers, for which a pass that
	// is not full claims the jobs it makes (fan_out_and_claim).
	workers *workerPool
	// backlog says the last pass was full: the next one reserves no
	// slots of the workers, which would sit idle through a pass that
	// claims nothing for them.
	backlog bool
}

// newRelay builds the relay that fans events out to targets (the
// subscribers' and outboxd's own job kinds) and to every endpoint.
func newRelay(db *sql.DB, cfg RelayConfig, jobMaxAttempts int, targets []jobTarget, logger *slog.Logger) *relay {
	// As text: JSON parameters go as text (newDBPool). Strings and slices
	// only: Marshal cannot fail.
	encoded, _ := json.Marshal(targets)
	return &relay{
		passTime:       newHistogram(latencyBuckets),
		db:             db,
		cfg:            cfg,
		jobMaxAttempts: jobMaxAttempts,
		targets:        string(encoded),
		logger:         logger.With("loop", "relay"),
	}
}

// Run relays until ctx ends: once at start, then whenever wake or the sweep
// ticker fires. Each wake-up drains the backlog in passes of at most
// BatchSize rows. After a pass that enqueued jobs it pokes jobsWake (if not
// nil), this process's own workers: they start on the jobs at once instead
// of when the NOTIFY comes back through the listener, which under load is
// milliseconds later. Other replicas still hear the NOTIFY.
//
// With wake-ups (wake not nil) it also tells producers whether to notify
// (outbox.relay_state). When notifications came in while it drained events,
// producers are committing faster than it sleeps: it publishes busy, so
// their commits skip the NOTIFY and its serializing lock, and keeps
// claiming pass after pass without waiting for one. A pass that finds
// nothing ends that: it publishes idle, waits for every transaction that
// may have read busy to end (recorderBarrier), and passes once more before
// it sleeps. It publishes idle before every sleep, which writes nothing
// when the flag already says so and resets a flag left busy by a relay
// that died.
func (r *relay) Run(ctx context.Context, wake <-chan struct{}, jobsWake chan struct{}) error {
	sweep := time.NewTicker(r.cfg.SweepInterval)
	defer sweep.Stop()
	barrier := newRecorderBarrier(r.db, r.logger)
	defer barrier.stop()
	busy := false // the flag says busy, and this relay claims without waiting
	for {
		claimed, clean := r.drain(ctx, jobsWake)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if wake != nil && clean && claimed > 0 && (busy || woken(wake)) {
			if !busy {
				busy = r.publishBusy(ctx)
			}
			continue
		}
		busy = false
		if wake != nil && r.publishIdle(ctx) {
			barrier.start(ctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		case <-sweep.C:
		case <-barrier.passed:
		}
	}
}

// woken takes a pending wake-up, if there is one.
func woken(wake <-chan struct{}) bool {
	select {
	case <-wake:
		return true
	default:
		return false
	}
}

// publishBusy sets outbox.relay_state busy and reports whether it says so
// now, set by this relay or another. A failure is logged, and the relay
// goes on being notified.
func (r *relay) publishBusy(ctx context.Context) bool {
	if _, err := publishRelayState(ctx, r.db, false); err != nil {
		if ctx.Err() == nil {
			r.logger.Error("relay state busy not published", "err", err)
		}
		return false
	}
	return true
}

// publishIdle sets outbox.relay_state idle and reports whether this call
// changed it, which obliges this relay to wait out the producers that read
// busy and look again. A failure is logged: a flag left busy is set idle
// before a later sleep, and its sweep wakes the relay meanwhile.
func (r *relay) publishIdle(ctx context.Context) bool {
	changed, err := publishRelayState(ctx, r.db, true)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Error("relay state idle not published", "err", err)
		}
		return false
	}
	return changed
}

// drain runs passes while they come back full, and reports how many events
// they claimed and whether every pass succeeded. It stops after a pass in
// which a row failed, so a failing row is tried once per wake-up, not five
// times in a burst that would poison it for a passing fault.
func (r *relay) drain(ctx context.Context, jobsWake chan struct{}) (claimed int, clean bool) {
	for ctx.Err() == nil {
		res, err := r.relayOnce(ctx)
		claimed += res.Claimed
		// The workers claim what the pass left: jobs it did not claim for
		// them, or more due ones than the slots it claimed into.
		if res.Jobs > 0 && (res.HandedOff < res.Jobs || res.HandOffFull) && jobsWake != nil {
			poke(jobsWake)
		}
		if err != nil {
			if ctx.Err() == nil {
				r.logger.Error("relay pass failed", "err", err)
			}
			return claimed, false
		}
		if res.Failed > 0 {
			return claimed, false
		}
		if res.Claimed < r.cfg.BatchSize {
			return claimed, true
		}
	}
	return claimed, false
}

// passResult is what one relay pass did.
type passResult struct {
	Claimed  int // events claimed
	Fanned   int // events marked fanned out
	Jobs     int // jobs enqueued
	Failed   int // events whose relay failed this pass
	Poisoned int // events poisoned this pass
	// HandedOff is the due jobs the pass claimed for this process's
	// workers (fan_out_and_claim), and HandOffFull whether they filled
	// the slots reserved for them, so that more may be due.
	HandedOff   int
	HandOffFull bool
}

// relayOnce runs one pass: claim up to BatchSize events and fan them out
// in one statement; if that fails because of the rows (not the
// connection), retry each candidate row in a statement of its own and
// count a failure against each row that fails alone.
func (r *relay) relayOnce(ctx context.Context) (passResult, error) {
	r.passes.Add(1)
	began := time.Now()
	var res passResult
	var err error
	if reserved := r.reserveWorkers(); reserved > 0 {
		res, err = r.fanOutAndClaim(ctx, reserved)
	} else {
		res.Fanned, res.Jobs, err = r.fanOut(ctx, relayBatchSQL, r.cfg.BatchSize)
	}
	r.passTime.Observe(time.Since(began).Seconds())
	res.Claimed = res.Fanned
	r.backlog = res.Claimed >= r.cfg.BatchSize
	if err == nil || !isRowFault(err) {
		r.count(res)
		return res, err
	}
	ids, listErr := r.unfanned(ctx)
	if listErr != nil {
		return res, listErr
	}
	r.logger.Warn("relay batch failed; retrying its rows one by one", "rows", len(ids), "err", err)
	res.Claimed = len(ids)
	for _, id := range ids {
		fanned, jobs, err := r.fanOut(ctx, relayRowSQL, id)
		res.Fanned += fanned
		res.Jobs += jobs
		if err == nil {
			continue
		}
		if !isRowFault(err) {
			r.count(res)
			return res, err
		}
		res.Failed++
		poisoned, recErr := r.recordFailure(ctx, id, err)
		if recErr != nil {
			r.count(res)
			return res, recErr
		}
		if poisoned {
			res.Poisoned++
			r.logger.Error("event poisoned: the relay failed on it repeatedly; fix the cause and requeue it",
				"event_id", id, "attempts", r.cfg.MaxFailures, "err", err)
		}
	}
	r.count(res)
	return res, nil
}

func (r *relay) count(res passResult) {
	r.eventsFanned.Add(int64(res.Fanned))
	r.jobsEnqueued.Add(int64(res.Jobs))
	r.rowFailures.Add(int64(res.Failed))
}

// The relay's two statements differ only in what they claim: a batch
// (outbox.fan_out, $1 the batch size, claimed by schema.sql's
// outbox.mark_fanned_out, which pins its plan) or one row for the
// row-by-row retry (outbox.fan_out_event, $1 its id; another relay may
// have relayed it in between, and then it claims nothing). Each is a
// PL/pgSQL function (fanOutFunctionSQL): one statement, one round trip and
// its own transaction, planned once per session.
const (
	relayBatchSQL = `SELECT out_fanned, out_jobs FROM outbox.fan_out($1, $2, $3, $4, $5)`
	relayRowSQL   = `SELECT out_fanned, out_jobs FROM outbox.fan_out_event($1, $2, $3, $4, $5)`
)

// fanOutFunctionSQL defines the relay's two functions, outbox.fan_out and
// outbox.fan_out_event, from one statement (fanOutSQL). The migration
// applies it after schema.sql, in the same transaction (newMigration), so
// the statement is written once, here.
//
// A function runs the relay's whole transaction: it sets the commit not
// to wait for the WAL to reach the disk (beginPipelineTx says why that
// loses nothing), names the process whose relay it is (origin, $5) for
// the workers' NOTIFY (schema.sql, outbox.notify_jobs; empty for none), fans
// the claimed events out, and lets the ordered lanes that got deliveries
// advance (outbox.advance_lanes), so a delivery is never held behind
// nothing. Sent as a transaction of statements it took four or five round
// trips a pass, and its statement was planned at every pass, about 1 ms of
// the 2.6 ms a pass of 3 events took in the database (README, "Endpoint
// isolation under load").
//
// The parameters are unnamed, and the columns prefixed, so that no name in
// the statement can be taken for one of them. out_lane_endpoints,
// out_lane_keys and out_pid, which the relay no longer reads, are kept for
// a previous release's relays during a rolling upgrade (README,
// "Upgrading"): they call fan_out with four arguments (previousFanOutSQL)
// and advance the lanes again, which changes nothing.
var fanOutFunctionSQL = fanOutFunction("fan_out", "integer", `
marked AS (
  SELECT id, topic, subject, payload
  FROM outbox.mark_fanned_out($1)
)`) + previousFanOutSQL + fanOutAndClaimSQL + fanOutFunction("fan_out_event", "bigint", `
claimed AS (
  SELECT id
  FROM outbox.events
  WHERE id = $1
    AND fanned_out_at IS NULL
    AND poisoned_at IS NULL
  FOR UPDATE SKIP LOCKED
),
marked AS (
  UPDATE outbox.events
  SET fanned_out_at = now()
  WHERE id IN (SELECT id FROM claimed)
  RETURNING id, topic, subject, payload
)`)

// fanOutAndClaimSQL defines outbox.fan_out_and_claim: a pass of
// outbox.fan_out ($1 to $5) and, in the same transaction, a claim of up to
// $6 due jobs for the relay's own workers (outbox.claim_jobs, $6 to $8:
// batch, replica, answered), when the pass enqueued jobs and was not full.
// A pass that is not full is the relay keeping up, one to a few events a
// pass: its deliveries are claimed as they are made, where otherwise the
// workers, woken after its commit, would claim them in a statement and a
// commit of their own, a few milliseconds on every event's way to its
// receiver (README, "Performance"). A full pass is a backlog, which the
// workers claim at their own pace, as before.
//
// Each row is a claimed job with the pass's counts; a pass that claims no
// job is one row of counts and NULLs. The claim's statements see the
// pass's jobs: they run after it, in the same transaction.
const fanOutAndClaimSQL = `
DROP FUNCTION IF EXISTS outbox.fan_out_and_claim(integer, jsonb, integer, double precision, text, integer, bigint, bigint[]);
CREATE FUNCTION outbox.fan_out_and_claim(integer, jsonb, integer, double precision, text, integer, bigint, bigint[])
RETURNS TABLE (out_fanned bigint, out_jobs bigint,
               id bigint, kind text, attempt integer, max_attempts integer,
               endpoint_id bigint,
               event_id bigint, topic text, subject text, payload jsonb, created_at timestamptz,
               traceparent text, tracestate text,
               url text, secret bytea, previous_secret bytea, disabled_reason text,
               start_in_ms integer, wake_on_outcome boolean, replay_yields boolean)
LANGUAGE plpgsql VOLATILE
AS $fan_out_and_claim$
DECLARE
  pass_fanned bigint;
  pass_jobs bigint;
BEGIN
  SELECT f.out_fanned, f.out_jobs INTO pass_fanned, pass_jobs
  FROM outbox.fan_out($1, $2, $3, $4, $5) AS f;
  RETURN QUERY
  SELECT pass_fanned, pass_jobs, c.*
  FROM (SELECT) AS pass
  LEFT JOIN LATERAL (
    SELECT *
    FROM outbox.claim_jobs($6, $7, $8)
    WHERE pass_jobs > 0 AND pass_fanned < $1 AND $6 > 0
  ) AS c ON true;
END
$fan_out_and_claim$;
`

// previousFanOutSQL is the previous release's call, fan_out with four
// arguments, as a function of its own that names no process. Not a
// default of the fifth: a previous release applying its own schema.sql
// replaces this one, and would otherwise leave two functions that a call
// with four arguments matches alike.
const previousFanOutSQL = `
DROP FUNCTION IF EXISTS outbox.fan_out(integer, jsonb, integer, double precision);
CREATE FUNCTION outbox.fan_out(integer, jsonb, integer, double precision)
RETURNS TABLE (out_fanned bigint, out_jobs bigint, out_lane_endpoints bigint[], out_lane_keys text[], out_pid integer)
LANGUAGE sql VOLATILE
AS $previous_fan_out$
  SELECT * FROM outbox.fan_out($1, $2, $3, $4, '')
$previous_fan_out$;
`

// fanOutFunction is one of fanOutFunctionSQL's functions: name, whose
// claim ($1, of claimType) is markSQL.
func fanOutFunction(name, claimType, markSQL string) string {
	return `
DROP FUNCTION IF EXISTS outbox.` + name + `(` + claimType + `, jsonb, integer, double precision, text);
CREATE FUNCTION outbox.` + name + `(` + claimType + `, jsonb, integer, double precision, text)
RETURNS TABLE (out_fanned bigint, out_jobs bigint, out_lane_endpoints bigint[], out_lane_keys text[], out_pid integer)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $fan_out$
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  IF $5 <> '' THEN
    PERFORM set_config('outbox.relay_origin', $5, true);
  END IF;
` + fanOutSQL(markSQL) + `
  INTO out_fanned, out_jobs, out_lane_endpoints, out_lane_keys, out_pid;
  IF cardinality(out_lane_endpoints) > 0 THEN
    PERFORM outbox.advance_lanes(out_lane_endpoints, out_lane_keys, true);
  END IF;
  RETURN NEXT;
END
$fan_out$;
`
}

// fanOutSQL is one relay transaction as one statement: claim and mark
// events with markSQL, then enqueue one job per (event, matching
// subscriber) and one webhook job per (event, enabled endpoint whose
// topics match). $2 is the subscribers as JSON ([{"kind", "topics",
// "per_subject"}]), $3 the jobs' max attempts, $4 how far out (seconds) an
// endpoint's new jobs are scheduled while its circuit breaker is open.
//
// One statement is one transaction and one round trip, and every part
// reads the claimed rows once, from what the UPDATE returned. Topics are
// matched once per distinct topic of the batch, not once per event: a
// batch holds a handful of topics, and outbox.topic_matches is not cheap.
//
// A coalescing subscriber gets one job per topic and subject of the batch,
// for its highest event id (DISTINCT ON keeps the first row of each (kind,
// topic, subject) in the ORDER BY, id descending). Webhooks are never coalesced:
// each event is a fact. Inserts go in id order, so the job table's indexes
// grow at their right edge.
//
// Each endpoint's deliveries are counted for its statistics
// (outbox.fanout_stats, stats.go) in endpoint order: relays adding to the
// same minute's rows lock them in one order. The row also keeps when the
// last of them was fanned out, which narrows the endpoint's replay lane
// while live deliveries flow (schema.sql, outbox.replay_width).
//
// The subject index (outbox.subjects, upsertSubjectsSQL) is kept here, in
// the transaction that marks the events fanned out, not by a job per
// subject: that job cost an insert, a claim and a completion, each a new
// row version in every index of the job table (README, "Performance").
func fanOutSQL(markSQL string) string {
	return `
WITH ` + markSQL + `,
topics AS (
  SELECT DISTINCT topic FROM marked
),
subscriptions AS (
  SELECT s.kind, s.per_subject, t.topic
  FROM jsonb_to_recordset($2::jsonb) AS s(kind text, topics text[], per_subject boolean)
  JOIN topics AS t ON outbox.topic_matches(s.topics, t.topic)
),
endpoint_subscriptions AS (
  SELECT ep.id AS endpoint_id, ep.breaker_opened_at, ep.ordering, t.topic
  FROM outbox.endpoints AS ep
  JOIN topics AS t ON outbox.topic_matches(ep.topics, t.topic)
  WHERE ep.disabled_at IS NULL
),
enqueued AS (
  INSERT INTO outbox.jobs (kind, event_id, max_attempts)
  SELECT s.kind, m.id, $3
  FROM marked AS m
  JOIN subscriptions AS s ON s.topic = m.topic AND NOT s.per_subject
  ORDER BY m.id
  RETURNING 1
),
coalesced AS (
  INSERT INTO outbox.jobs (kind, event_id, max_attempts)
  SELECT latest.kind, latest.id, $3
  FROM (
    SELECT DISTINCT ON (s.kind, m.topic, m.subject) s.kind, m.id
    FROM marked AS m
    JOIN subscriptions AS s ON s.topic = m.topic AND s.per_subject
    ORDER BY s.kind, m.topic, m.subject, m.id DESC
  ) AS latest
  ORDER BY latest.id
  RETURNING 1
),
webhooks AS (
  INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at, lane_key)
  SELECT 'webhook', m.id, es.endpoint_id, $3,
         CASE WHEN es.ordering = 'subject' THEN 'infinity'
              WHEN es.breaker_opened_at IS NULL THEN now()
              ELSE now() + make_interval(secs => $4) END,
         CASE WHEN es.ordering = 'subject' THEN m.subject END
  FROM marked AS m
  JOIN endpoint_subscriptions AS es ON es.topic = m.topic
  ORDER BY m.id, es.endpoint_id
  RETURNING endpoint_id, lane_key
),
lanes AS (
  SELECT DISTINCT endpoint_id, lane_key FROM webhooks WHERE lane_key IS NOT NULL
),
produced AS (
  INSERT INTO outbox.fanout_stats AS f (endpoint_id, minute, deliveries, last_fanned_at)
  SELECT endpoint_id, date_trunc('minute', now()), count(*), now()
  FROM webhooks
  GROUP BY endpoint_id
  ORDER BY endpoint_id
  ON CONFLICT (endpoint_id, minute) DO UPDATE
  SET deliveries = f.deliveries + EXCLUDED.deliveries,
      last_fanned_at = EXCLUDED.last_fanned_at
),
indexed AS (` + upsertSubjectsSQL(`SELECT id, topic, subject, payload FROM marked`) + `
)
SELECT (SELECT count(*) FROM marked),
       (SELECT count(*) FROM enqueued) + (SELECT count(*) FROM coalesced) + (SELECT count(*) FROM webhooks),
       (SELECT coalesce(array_agg(endpoint_id ORDER BY endpoint_id, lane_key), '{}') FROM lanes),
       (SELECT coalesce(array_agg(lane_key ORDER BY endpoint_id, lane_key), '{}') FROM lanes),
       pg_backend_pid()`
}

// fanOut runs one relay statement (relayBatchSQL or relayRowSQL, with its
// claim argument) and reports how many events it fanned out into how many
// jobs.
func (r *relay) fanOut(ctx context.Context, relaySQL string, claimArg any) (fanned, jobs int, err error) {
	err = r.db.QueryRowContext(ctx, relaySQL, claimArg, r.targets, r.jobMaxAttempts,
		r.cfg.FailingEndpointDelay.Seconds(), r.notifyOrigin).Scan(&fanned, &jobs)
	if err != nil {
		return 0, 0, fmt.Errorf("relay: fan out: %w", err)
	}
	return fanned, jobs, nil
}

// reserveWorkers reserves free slots of this process's workers for the
// pass to claim into: none without workers here, or while the relay works
// through a backlog.
func (r *relay) reserveWorkers() int {
	if r.workers == nil || r.backlog {
		return 0
	}
	return r.workers.reserve(claimBatchMax)
}

// relayClaimSQL is a pass that also claims for this process's workers:
// outbox.fan_out_and_claim, $6 the slots reserved, $7 the replica, $8 the
// workers' answered deliveries (deliver.go, claimJobsSQL).
const relayClaimSQL = `SELECT out_fanned, out_jobs, ` + claimedColumns + `
FROM outbox.fan_out_and_claim($1, $2, $3, $4, $5, $6, $7, $8)`

// fanOutAndClaim runs a pass (relayClaimSQL) that claims into reserved
// slots of the workers, and hands them the jobs it claimed, or frees the
// slots if it failed. Only a pass that commits hands jobs over: its rows
// are read to the end, and any error, the commit's included, comes first.
func (r *relay) fanOutAndClaim(ctx context.Context, reserved int) (res passResult, err error) {
	var jobs []Job
	defer func() { r.workers.handOff(jobs, reserved) }()
	replica, ok := r.workers.claimReplica()
	if !ok { // no claims until this process is registered again
		res.Fanned, res.Jobs, err = r.fanOut(ctx, relayBatchSQL, r.cfg.BatchSize)
		return res, err
	}
	sent := time.Now()
	scan := func(row rowScanner) (Job, error) {
		var c claimedRow
		var fanned, enqueued int
		if err := row.Scan(append([]any{&fanned, &enqueued}, c.dest()...)...); err != nil {
			return Job{}, err
		}
		res.Fanned, res.Jobs = fanned, enqueued
		j, _ := c.job(sent)
		return j, nil
	}
	rows, err := queryAll(ctx, r.db, scan, relayClaimSQL, r.cfg.BatchSize, r.targets, r.jobMaxAttempts,
		r.cfg.FailingEndpointDelay.Seconds(), r.notifyOrigin, reserved, replica, pq.Array(r.workers.answered.list()))
	if err != nil {
		r.workers.claimFailed(replica, err)
		return passResult{}, fmt.Errorf("relay: fan out and claim: %w", err)
	}
	for _, j := range rows {
		if j.ID != 0 {
			jobs = append(jobs, j)
		}
	}
	res.HandedOff = len(jobs)
	res.HandOffFull = len(jobs) == reserved
	r.jobsClaimed.Add(int64(len(jobs)))
	return res, nil
}

// laneKeys names ordered lanes: endpointIDs[i] with keys[i].
type laneKeys struct {
	endpointIDs []int64
	keys        []string
}

// finishedLane is the lane of a job that left it, put back, rescued or
// cancelled: a row of the statements putBack, the rescues and a replay's
// cancel run (the completer's finished lanes stay in its statement,
// jobOutcomesSQL). Both are NULL for a job of no ordered lane.
type finishedLane struct {
	endpointID sql.NullInt64
	key        sql.NullString
}

func scanFinishedLane(row rowScanner) (finishedLane, error) {
	var l finishedLane
	err := row.Scan(&l.endpointID, &l.key)
	return l, err
}

// finishedLanes are the ordered lanes of the rows, each once, in endpoint
// id order.
func finishedLanes(rows []finishedLane) laneKeys {
	type lane struct {
		endpointID int64
		key        string
	}
	seen := map[lane]bool{}
	var lanes []lane
	for _, r := range rows {
		l := lane{r.endpointID.Int64, r.key.String}
		if !r.endpointID.Valid || !r.key.Valid || seen[l] {
			continue
		}
		seen[l] = true
		lanes = append(lanes, l)
	}
	slices.SortFunc(lanes, func(a, b lane) int {
		return cmp.Or(cmp.Compare(a.endpointID, b.endpointID), strings.Compare(a.key, b.key))
	})
	var out laneKeys
	for _, l := range lanes {
		out.endpointIDs = append(out.endpointIDs, l.endpointID)
		out.keys = append(out.keys, l.key)
	}
	return out
}

// advanceLanes makes the next held delivery of each lane due where the
// lane has none active (schema.sql, outbox.advance_lanes), for a
// transaction that may have held deliveries: a replay, a retry by hand, a
// rescue. Such deliveries wait for a release of their endpoint's lanes in
// flight (hold true). The relay's and the completer's functions advance
// their lanes in SQL (outbox.fan_out, outbox.record_outcomes).
func advanceLanes(ctx context.Context, tx *sql.Tx, lanes laneKeys) error {
	if len(lanes.endpointIDs) == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `SELECT outbox.advance_lanes($1, $2, true)`,
		pq.Array(lanes.endpointIDs), pq.Array(lanes.keys)); err != nil {
		return fmt.Errorf("advance ordered lanes: %w", err)
	}
	return nil
}

// unfanned lists the events a batch would claim now, for the row-by-row
// retry after the batch failed. It claims without marking (the marking may
// be what fails), and its locks end with the statement.
func (r *relay) unfanned(ctx context.Context) ([]int64, error) {
	ids, err := queryAll(ctx, r.db, scanID, `SELECT id FROM outbox.claim_unfanned($1) AS claimed(id)`, r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("relay: list un-fanned events: %w", err)
	}
	return ids, nil
}

// recordFailureSQL counts a failed relay of one row and poisons it at the
// limit. The row is locked by nobody now: its own transaction rolled back.
const recordFailureSQL = `
UPDATE outbox.events
SET relay_attempts = relay_attempts + 1,
    relay_error = $2,
    poisoned_at = CASE WHEN relay_attempts + 1 >= $3 THEN now() END
WHERE id = $1
  AND fanned_out_at IS NULL
  AND poisoned_at IS NULL
RETURNING poisoned_at IS NOT NULL`

// recordFailure notes err against event id; it reports whether the event
// is now poisoned.
func (r *relay) recordFailure(ctx context.Context, id int64, cause error) (poisoned bool, err error) {
	err = r.db.QueryRowContext(ctx, recordFailureSQL, id, truncate(cause.Error(), maxErrorLen), r.cfg.MaxFailures).Scan(&poisoned)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil // relayed or requeued by someone else meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("relay: record failure of event %d: %w", id, err)
	}
	if poisoned {
		// Its subject's later events may be held behind it in ordered
		// lanes (outbox.advance_lanes waits for an earlier event still to
		// be fanned out); set aside, it holds them up no longer.
		if _, err := r.db.ExecContext(ctx, advanceLanesOfEventSQL, id); err != nil {
			return true, fmt.Errorf("relay: event %d poisoned; advance its subject's ordered lanes: %w", id, err)
		}
	}
	return poisoned, nil
}

// advanceLanesOfEventSQL advances the ordered lanes event $1's subject has
// at every endpoint that orders by subject and selects its topic.
const advanceLanesOfEventSQL = `
SELECT outbox.advance_lanes(coalesce(array_agg(ep.id ORDER BY ep.id), '{}'),
                            coalesce(array_agg(e.subject ORDER BY ep.id), '{}'))
FROM outbox.events AS e
JOIN outbox.endpoints AS ep ON ep.ordering = 'subject' AND outbox.topic_matches(ep.topics, e.topic)
WHERE e.id = $1`
