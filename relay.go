// relay.go: the relay, which claims un-fanned events by row and fans each
// out into one job per subscriber and per subscribing endpoint, in the
// transaction that marks it fanned.
//
// Guarantees (docs/guarantees.md, hops 2 and 3):
//   - Claim, enqueue and mark share one transaction. A crash anywhere rolls
//     all three back, and the next pass claims the rows again.
//   - Rows are claimed by their state (fanned_out_at IS NULL) with FOR UPDATE
//     SKIP LOCKED, never by advancing a cursor: ids are taken at insert and
//     commit out of order, so a cursor can pass a row that commits later and
//     lose it forever. Any number of relays share the backlog this way.
//     The claim starts at a bound (relayScan) that moves only once a
//     snapshot proves no row below it can still commit.
//   - A batch that fails is retried row by row, so one bad row holds up no
//     other; a row that fails MaxFailures times is poisoned: set aside with
//     its error, counted on the overview, never deleted, until requeued.
//   - Passes run on a NOTIFY and on a sweep every SweepInterval, so a lost
//     notification delays events by at most one interval.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
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
	// BusyLinger is how long a busy relay keeps re-checking, every
	// BusyRecheck, after a pass that found nothing, before it tells
	// producers it is idle. Producers under steady load leave gaps of a
	// few milliseconds between commits; a relay that went idle in every
	// gap would have them notify again, and a NOTIFY serializes their
	// commits (schema.sql, outbox.notify_events). 100 ms outlasts the
	// gaps of any stream fast enough for that to matter, and costs a
	// relay whose producers stopped 20 empty passes.
	BusyLinger time.Duration
	// BusyRecheck is how often a busy relay passes, whether its last
	// pass found events (and was not full) or none: what an event
	// committed then waits at most before a pass claims it, with no
	// notification to wake the relay. Longer, a pass carries more events
	// and each costs less of its fixed part; the figures are in
	// docs/performance.md.
	BusyRecheck time.Duration
	// FailingEndpointDelay is how far out new deliveries are scheduled to
	// an endpoint whose circuit breaker is open (WorkerConfig's
	// BreakerThreshold): a receiver that is down gets one attempt per
	// event every few minutes instead of a burst of doomed ones, and
	// recovers at its own pace.
	FailingEndpointDelay time.Duration
	// PassTimeout bounds one relay statement. Every endpoint's fan-out
	// shares it, so a filter that runs long (over huge payloads, say)
	// would hold up every endpoint's deliveries: cancelled at the bound,
	// the pass's filters are tried alone, each for half of it, and one
	// that fails is held (holdFailingFilters) before the pass runs
	// again. A healthy pass takes milliseconds (docs/performance.md), a
	// full one with hundreds of endpoints well under a second: the
	// default 5 s is far past any, and it is what the other endpoints
	// wait, once, for a filter that fails. 0: no bound.
	PassTimeout time.Duration
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
	passTimeouts atomic.Int64 // statements cancelled at PassTimeout
	filtersHeld  atomic.Int64 // endpoints' filters held after they failed a pass
	passTime     *histogram   // one pass's statement, seconds
	// scan is where the relay's claim starts (relayScan); only the
	// goroutine that runs Run uses it.
	scan relayScan
	// notifyOrigin, when this process listens, names its relay's
	// transactions in their NOTIFY to the workers, so that the listener
	// does not wake them a second time for a pass the relay pokes them
	// for itself (notify.go, wakeups.origin); "" otherwise.
	notifyOrigin string
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
// their commits skip the NOTIFY and its serializing lock, and claims a
// pass every BusyRecheck without waiting for one. Passes that find
// nothing for BusyLinger end that (a pass that finds nothing while busy is
// followed by another after BusyRecheck): it publishes idle, waits for
// every transaction that may have read busy to end (recorderBarrier), and
// passes once more before it sleeps. It publishes idle before every sleep,
// which writes nothing when the flag already says so and resets a flag
// left busy by a relay that died, and as it returns if it was busy.
func (r *relay) Run(ctx context.Context, wake <-chan struct{}, jobsWake chan struct{}) error {
	sweep := time.NewTicker(r.cfg.SweepInterval)
	defer sweep.Stop()
	barrier := newRecorderBarrier(r.db, r.logger)
	defer barrier.stop()
	busy := false // the flag says busy, and this relay claims without waiting
	defer func() {
		if busy {
			r.publishIdleAtExit()
		}
	}()
	var found time.Time // when a pass last found events while busy
	for {
		claimed, clean := r.drain(ctx, jobsWake)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if wake != nil && clean && claimed > 0 && (busy || woken(wake)) {
			if !busy {
				busy = r.publishBusy(ctx)
			}
			found = time.Now()
			// A busy relay whose pass was not full waits BusyRecheck
			// before the next, so that a pass carries the events of that
			// while, not the one or two committed since the last.
			if err := r.recheck(ctx, nil); err != nil {
				return err
			}
			continue
		}
		if busy && clean && time.Since(found) < r.cfg.BusyLinger {
			if err := r.recheck(ctx, wake); err != nil {
				return err
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

// recheck waits BusyRecheck before a busy relay's next pass, or less if a
// notification comes (from a producer that read the flag before it said
// busy).
func (r *relay) recheck(ctx context.Context, wake <-chan struct{}) error {
	t := time.NewTimer(r.cfg.BusyRecheck)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-wake:
	case <-t.C:
	}
	return nil
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

// publishIdleAtExit sets outbox.relay_state idle as a relay that was busy
// stops: left busy, it would keep producers from notifying the relays of
// other replicas, asleep until their sweep, for as long as no relay ran
// a pass. It cannot wait for the producers that read busy (it is
// stopping): their events, if no other relay is awake, wait for a sweep,
// as when a relay dies.
func (r *relay) publishIdleAtExit() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.publishIdle(ctx)
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
		if err := r.scan.advance(ctx, r.db, time.Now()); err != nil && ctx.Err() == nil {
			r.logger.Warn("relay scan bound not moved; the claims look from the start", "err", err)
		}
		res, err := r.relayOnce(ctx)
		claimed += res.Claimed
		if res.Jobs > 0 && jobsWake != nil {
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
}

// relayOnce runs one pass: claim up to BatchSize events and fan them out
// in one statement. If that fails, it first holds the filters that fail
// on the batch's events alone (holdFailingFilters) and, if it held any,
// runs the pass again without them: one endpoint's filter costs that
// endpoint its deliveries, not every endpoint its pass. If the pass still
// fails because of the rows (not the connection), or ran out of time, it
// retries each candidate row in a statement of its own and counts a
// failure against each row that fails alone for a cause of its own.
func (r *relay) relayOnce(ctx context.Context) (passResult, error) {
	r.passes.Add(1)
	began := time.Now()
	res, err := r.batchPass(ctx)
	r.passTime.Observe(time.Since(began).Seconds())
	if err != nil && ctx.Err() == nil {
		held, holdErr := r.holdFailingFilters(ctx, err)
		if holdErr != nil {
			r.count(res)
			return res, errors.Join(err, holdErr)
		}
		if held > 0 {
			res, err = r.batchPass(ctx)
		}
	}
	if err == nil || !(isRowFault(err) || errors.Is(err, errPassTimedOut)) {
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
		fanned, jobs, err := r.fanOut(ctx, id)
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

// batchPass runs a batch's statement.
func (r *relay) batchPass(ctx context.Context) (res passResult, err error) {
	res.Fanned, res.Jobs, err = r.fanOut(ctx, 0)
	res.Claimed = res.Fanned
	return res, err
}

// holdFailingFilters holds the filters that fail alone on the events the
// failed pass would claim (filters.go, holdFailingFilters), each tried
// for half of PassTimeout, and reports how many it held. passErr is why
// the pass failed, for the log.
func (r *relay) holdFailingFilters(ctx context.Context, passErr error) (int, error) {
	ids, err := r.unfanned(ctx)
	if err != nil {
		return 0, err
	}
	held, err := holdFailingFilters(ctx, r.db, ids, r.cfg.PassTimeout/2)
	for _, h := range held {
		r.logger.Warn("endpoint filter held: it failed the relay's pass alone; its endpoint gets no event of its topics until the filter is written again",
			"endpoint_id", h.EndpointID, "filter_error", h.Error, "pass_err", passErr)
	}
	r.filtersHeld.Add(int64(len(held)))
	return len(held), err
}

func (r *relay) count(res passResult) {
	r.eventsFanned.Add(int64(res.Fanned))
	r.jobsEnqueued.Add(int64(res.Jobs))
	r.rowFailures.Add(int64(res.Failed))
}

// fanOutSQL is one relay transaction in one statement (schema.sql,
// outbox.fan_out): claim and mark a batch of up to $1 events, or with $2
// the one event $2, enqueue their jobs and advance their ordered lanes.
// $3 are the subscribers as JSON, $4 the jobs' max attempts, $5 how far
// out (seconds) an open breaker schedules new deliveries, $6 the process
// whose workers the NOTIFY need not wake (empty for none), $7 the scan
// bound (relayScan).
const fanOutSQL = `SELECT out_fanned, out_jobs FROM outbox.fan_out($1, $2, $3, $4, $5, $6, $7)`

// fanOut runs one relay statement (fanOutSQL) for a batch, or for the one
// event eventID when it is not 0, and reports how many events it fanned
// out into how many jobs.
func (r *relay) fanOut(ctx context.Context, eventID int64) (fanned, jobs int, err error) {
	passCtx, cancel := r.passContext(ctx)
	defer cancel()
	err = r.db.QueryRowContext(passCtx, fanOutSQL, r.cfg.BatchSize, sql.NullInt64{Int64: eventID, Valid: eventID != 0},
		r.targets, r.jobMaxAttempts, r.cfg.FailingEndpointDelay.Seconds(), r.notifyOrigin, r.scan.from).Scan(&fanned, &jobs)
	if err != nil {
		return 0, 0, fmt.Errorf("relay: fan out: %w", r.timedOut(ctx, passCtx, err))
	}
	return fanned, jobs, nil
}

// errPassTimedOut marks a relay statement cancelled at PassTimeout.
var errPassTimedOut = errors.New("relay pass ran past its timeout (-relay-pass-timeout)")

// passContext is ctx bounded by PassTimeout, if one is set. The bound
// costs the statement nothing: lib/pq watches every query's context
// anyway, and cancels the query when it ends (its connection is closed
// then, and the pool opens another).
func (r *relay) passContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.cfg.PassTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, r.cfg.PassTimeout)
}

// timedOut marks err with errPassTimedOut when passCtx, and not ctx,
// ended: the statement ran out of time, the relay is not stopping.
func (r *relay) timedOut(ctx, passCtx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(passCtx.Err(), context.DeadlineExceeded) {
		r.passTimeouts.Add(1)
		return fmt.Errorf("%w: %w", errPassTimedOut, err)
	}
	return err
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
// A first failure may be the row's first change: it keeps the row's commit
// time (schema.sql, outbox.commit_time) before its xmin becomes this one's.
const recordFailureSQL = `
UPDATE outbox.events AS e
SET committed_at = outbox.commit_time(e, e.xmin),
    relay_attempts = relay_attempts + 1,
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

// The relay's scan bound. The relay claims the oldest events still
// waiting (schema.sql, outbox.claim_unfanned) from a bound below which none
// can wait: while a long transaction elsewhere in the database holds back
// the xmin horizon, the claim index keeps an entry for every event fanned
// out since, and a claim from the start would read them all. The bound
// moves only when a snapshot proves that nothing below it can still
// commit (outbox.advance_relay_scan says how).

// relayScanEvery is how often the relay tries to move its scan bound:
// each try is a statement, and between two tries the claims read at most
// the entries the relay left in that time.
const relayScanEvery = time.Second

// relayScan is one relay's scan bound, as outbox.advance_relay_scan takes
// and returns it. The zero value scans from the start.
type relayScan struct {
	from          int64          // no event below it is waiting
	candidate     sql.NullInt64  // where from moves once the proof holds
	candidateXmax sql.NullString // the xmax of the candidate's snapshot (xid8)
	requeued      sql.NullInt64  // outbox.events_requeued when the candidate was named
	tried         time.Time      // the last try
}

const advanceRelayScanSQL = `
SELECT scan_from, candidate, candidate_xmax, requeued
FROM outbox.advance_relay_scan($1, $2, $3::xid8, $4)`

// advance tries to move the bound, at most once per relayScanEvery. A
// try that fails leaves the relay scanning from the start, which is
// always right, until one succeeds.
func (s *relayScan) advance(ctx context.Context, db queryer, now time.Time) error {
	if now.Sub(s.tried) < relayScanEvery {
		return nil
	}
	s.tried = now
	next := relayScan{tried: now}
	err := db.QueryRowContext(ctx, advanceRelayScanSQL, s.from, s.candidate, s.candidateXmax, s.requeued).
		Scan(&next.from, &next.candidate, &next.candidateXmax, &next.requeued)
	if err != nil {
		*s = relayScan{tried: now}
		return fmt.Errorf("relay: advance the scan bound: %w", err)
	}
	*s = next
	return nil
}
