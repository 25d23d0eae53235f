// stats.go: the delivery statistics read back: an endpoint's, or every
// endpoint's, attempts, outcomes and commit→first-2xx latency over the last
// hour or day, from outbox.delivery_stats, which the completers write with
// each batch of outcomes (outbox.record_outcomes) and every replica shares;
// and, for one endpoint, its queue now and its recent failures grouped by
// error.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
)

// statsLatencyBounds are the upper bounds of outbox.delivery_stats'
// latency buckets, the ones /metrics uses for its in-process histogram
// (latencyBuckets): from a loopback delivery (1 ms) to a retry an hour
// later, fine where the latency goals are (5 and 25 ms) and coarse where
// only the order of magnitude matters. A 19th bucket counts what is above
// the last. Changing them changes what stored rows mean: never reorder,
// only append with a new column.
var statsLatencyBounds = [...]time.Duration{
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
	30 * time.Minute, time.Hour,
}

// statsBuckets is the length of a latency_buckets array (schema.sql's
// CHECK): one per bound and one above the last.
const statsBuckets = len(statsLatencyBounds) + 1

// latencyBucket is the bucket of a latency: the first whose bound it does
// not exceed (as a Prometheus "le"), or the last.
func latencyBucket(d time.Duration) int {
	i, _ := slices.BinarySearch(statsLatencyBounds[:], d)
	return i
}

// latencyCounts is one latency_buckets array.
type latencyCounts [statsBuckets]int64

// quantile is the bound of the bucket that holds the q-th latency (0 < q
// ≤ 1, the nearest rank: ceil(q·n)), false when there is none. The true
// value lies between the bucket's lower bound and this one; above the last
// bound it reads as the last bound: "an hour or more".
func (c *latencyCounts) quantile(q float64) (time.Duration, bool) {
	var n int64
	for _, v := range c {
		n += v
	}
	if n == 0 {
		return 0, false
	}
	rank := int64(q * float64(n))
	if float64(rank) < q*float64(n) {
		rank++
	}
	rank = max(rank, 1)
	var seen int64
	for i, v := range c {
		seen += v
		if seen >= rank {
			return statsLatencyBounds[min(i, len(statsLatencyBounds)-1)], true
		}
	}
	return statsLatencyBounds[len(statsLatencyBounds)-1], true // unreachable: seen reaches n
}

// add adds other's counts.
func (c *latencyCounts) add(other *latencyCounts) {
	for i, v := range other {
		c[i] += v
	}
}

// statsWindows are the windows GET .../stats?window= takes, and their
// length in minutes: the series has one point a minute, the current
// (partial) minute last.
var statsWindows = map[string]int{"1h": 60, "24h": 1440}

// parseStatsWindow reads ?window=; none is 1h.
func parseStatsWindow(v string) (string, error) {
	if v == "" {
		v = "1h"
	}
	if _, ok := statsWindows[v]; !ok {
		return "", fmt.Errorf("%w: window %q: want 1h or 24h", errInvalid, v)
	}
	return v, nil
}

// DeliveryStats is what GET /api/stats and GET /api/endpoints/{id}/stats
// answer, and what the panel shows: one endpoint's deliveries, or every
// endpoint's, over a window of whole minutes ending with the current one.
type DeliveryStats struct {
	EndpointID int64     `json:"endpoint_id,omitempty"` // 0: every endpoint
	Window     string    `json:"window"`
	From       time.Time `json:"from"` // the start of the window's first minute
	To         time.Time `json:"to"`   // the end of its last (the current) minute
	// Produced is the deliveries the relay fanned out in the window
	// (outbox.fanout_stats).
	Produced int64 `json:"produced"`
	// FilteredOut is the events of its topics that the endpoint's filter
	// kept from it in the window (fanout_stats.filtered_out).
	FilteredOut int64 `json:"filtered_out"`
	// FilterErrors is the events of its topics it did not get because its
	// filter was held after an error (fanout_stats.filter_errors).
	FilterErrors int64 `json:"filter_errors"`
	statsCounts
	// SuccessRate is successes / attempts; null without attempts.
	SuccessRate *float64 `json:"success_rate"`
	// LatencyP50MS and LatencyP99MS are the bounds of the buckets that
	// hold the median and the 99th percentile commit→first-2xx latency,
	// in milliseconds; null without a success.
	LatencyP50MS *float64 `json:"latency_p50_ms"`
	LatencyP99MS *float64 `json:"latency_p99_ms"`
	// Latency is the window's bucket counts, each with its bound.
	Latency []latencyBucketView `json:"latency_buckets"`
	// Series has a point for every minute of the window, oldest first.
	Series []statsMinute `json:"series"`
	// Queue and RecentFailures are one endpoint's, as its page shows
	// them; absent from every endpoint's statistics, whose queue the
	// overview counts (Overview.Jobs).
	Queue          *DeliveryQueue `json:"queue,omitempty"`
	RecentFailures []FailureGroup `json:"recent_failures,omitempty"`

	latency latencyCounts
}

// statsCounts are a row's counters, and their sums.
type statsCounts struct {
	Attempts        int64          `json:"attempts"`
	Successes       int64          `json:"successes"`
	Failures        int64          `json:"failures"`
	FailuresByClass failureClasses `json:"failures_by_class"`
}

// failureClasses are the failures by class (schema.sql's
// outbox.delivery_stats).
type failureClasses struct {
	Timeout    int64 `json:"timeout"`
	Status4xx  int64 `json:"4xx"`
	Status5xx  int64 `json:"5xx"`
	Connection int64 `json:"connection"`
	Other      int64 `json:"other"`
}

func (c *statsCounts) add(o statsCounts) {
	c.Attempts += o.Attempts
	c.Successes += o.Successes
	c.Failures += o.Failures
	c.FailuresByClass.Timeout += o.FailuresByClass.Timeout
	c.FailuresByClass.Status4xx += o.FailuresByClass.Status4xx
	c.FailuresByClass.Status5xx += o.FailuresByClass.Status5xx
	c.FailuresByClass.Connection += o.FailuresByClass.Connection
	c.FailuresByClass.Other += o.FailuresByClass.Other
}

// latencyBucketView is one bucket: its bound in milliseconds (null for
// the last, which has none) and its count.
type latencyBucketView struct {
	LeMS  *float64 `json:"le_ms"`
	Count int64    `json:"count"`
}

// statsMinute is one point of the series: the deliveries the relay fanned
// out (produced), what was delivered (a 2xx) and what failed (an attempt
// that did not succeed) in that minute, with the minute's p50 and p99
// commit→first-2xx latency (null without a success).
type statsMinute struct {
	Minute       time.Time `json:"minute"`
	Produced     int64     `json:"produced"`
	FilteredOut  int64     `json:"filtered_out"`
	FilterErrors int64     `json:"filter_errors"`
	Delivered    int64     `json:"delivered"`
	Failed       int64     `json:"failed"`
	LatencyP50MS *float64  `json:"latency_p50_ms"`
	LatencyP99MS *float64  `json:"latency_p99_ms"`
}

// statsNowSQL is the current minute by the database's clock, the one
// that ends every window.
const statsNowSQL = `SELECT date_trunc('minute', now())`

// statsByMinuteSQL sums the rows of each minute from $1 on, of endpoint
// $2, or of every endpoint with $2 = 0 (each a plan of its own: the
// primary key, or delivery_stats_by_minute). Each row is read once: the
// counters are summed by minute, the latency buckets by minute and
// bucket, then gathered back into one array a minute.
const statsByMinuteSQL = `
WITH w AS (
  SELECT minute, attempts, successes, failed_timeout, failed_4xx, failed_5xx,
         failed_connection, failed_other, latency_buckets
  FROM outbox.delivery_stats
  WHERE minute >= $1
    AND ($2 = 0 OR endpoint_id = $2)
),
counts AS (
  SELECT minute,
         sum(attempts)::bigint AS attempts, sum(successes)::bigint AS successes,
         sum(failed_timeout)::bigint AS failed_timeout, sum(failed_4xx)::bigint AS failed_4xx,
         sum(failed_5xx)::bigint AS failed_5xx, sum(failed_connection)::bigint AS failed_connection,
         sum(failed_other)::bigint AS failed_other
  FROM w
  GROUP BY minute
),
buckets AS (
  SELECT w.minute, b.i, sum(b.n)::bigint AS n
  FROM w, unnest(w.latency_buckets) WITH ORDINALITY AS b(n, i)
  GROUP BY w.minute, b.i
),
latency AS (
  SELECT minute, array_agg(n ORDER BY i) AS buckets
  FROM buckets
  GROUP BY minute
)
SELECT c.minute, c.attempts, c.successes,
       c.failed_timeout, c.failed_4xx, c.failed_5xx, c.failed_connection, c.failed_other,
       l.buckets
FROM counts AS c
JOIN latency AS l ON l.minute = c.minute
ORDER BY c.minute`

// producedByMinuteSQL sums outbox.fanout_stats by minute from $1 on, of
// endpoint $2, or of every endpoint with $2 = 0: the deliveries fanned
// out, the events filters kept out, and those held filters kept out.
const producedByMinuteSQL = `
SELECT minute, sum(deliveries)::bigint, sum(filtered_out)::bigint, sum(filter_errors)::bigint
FROM outbox.fanout_stats
WHERE minute >= $1
  AND ($2 = 0 OR endpoint_id = $2)
GROUP BY minute`

type producedMinute struct {
	minute       time.Time
	n            int64
	filtered     int64
	filterErrors int64
}

func scanProducedMinute(row rowScanner) (producedMinute, error) {
	var p producedMinute
	err := row.Scan(&p.minute, &p.n, &p.filtered, &p.filterErrors)
	return p, err
}

// readDeliveryStats reads endpoint id's statistics (0: every endpoint's)
// over the window named by window, which parseStatsWindow accepted.
func readDeliveryStats(ctx context.Context, db *sql.DB, id int64, window string) (DeliveryStats, error) {
	minutes, ok := statsWindows[window]
	if !ok {
		return DeliveryStats{EndpointID: id, Window: window}, fmt.Errorf("%w: window %q: want 1h or 24h", errInvalid, window)
	}
	m, err := readStatsMinutes(ctx, db, id, minutes)
	if err != nil {
		return DeliveryStats{EndpointID: id, Window: window}, err
	}
	st := m.window(window)
	if id == 0 {
		return st, nil
	}
	q, err := readDeliveryQueue(ctx, db, id)
	if err != nil {
		return st, err
	}
	st.Queue = &q
	st.RecentFailures, err = readRecentFailures(ctx, db, id, st.From)
	return st, err
}

// DeliveryQueue is an endpoint's deliveries not yet finished, now.
type DeliveryQueue struct {
	// Due wait with their scheduled time reached: they run as soon as a
	// worker, the endpoint's cap and rate limit allow (and a pause or a
	// receiver's Retry-After hold, which the endpoint shows, has ended).
	Due int64 `json:"due"`
	// Scheduled wait for a later time: a backoff after a failure.
	Scheduled int64 `json:"scheduled"`
	// Held wait for their turn in an ordered lane (scheduled at infinity
	// until the delivery ahead of them finishes).
	Held     int64 `json:"held"`
	InFlight int64 `json:"in_flight"`
	// NextAttemptAt is the soonest scheduled time of a waiting delivery,
	// held ones aside: in the past while some are due; null when none
	// waits.
	NextAttemptAt *time.Time `json:"next_attempt_at"`
}

// deliveryQueueSQL counts endpoint $1's waiting deliveries, live and
// replayed, by jobs_waiting_by_endpoint, and its running ones by
// jobs_running_by_endpoint, as the claim counts them.
const deliveryQueueSQL = `
WITH waiting AS (
  SELECT scheduled_at
  FROM outbox.jobs
  WHERE endpoint_id = $1
    AND state IN ('available', 'retryable')
)
SELECT count(*) FILTER (WHERE scheduled_at <= now()),
       count(*) FILTER (WHERE scheduled_at > now() AND scheduled_at < 'infinity'),
       count(*) FILTER (WHERE scheduled_at = 'infinity'),
       (SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'running'),
       min(scheduled_at) FILTER (WHERE scheduled_at < 'infinity')
FROM waiting`

// readDeliveryQueue reads endpoint id's queue.
func readDeliveryQueue(ctx context.Context, db *sql.DB, id int64) (DeliveryQueue, error) {
	var q DeliveryQueue
	err := db.QueryRowContext(ctx, deliveryQueueSQL, id).Scan(&q.Due, &q.Scheduled, &q.Held, &q.InFlight, &q.NextAttemptAt)
	if err != nil {
		return q, fmt.Errorf("endpoint %d queue: %w", id, err)
	}
	return q, nil
}

// FailureGroup is one error among an endpoint's recent failed attempts:
// an answer's status code (its text, with the answer's start, varies with
// the receiver's body), or, without an answer, the error (a timeout, a
// refused connection, the SSRF guard); with how many attempts gave it,
// when, and the latest of them.
type FailureGroup struct {
	StatusCode  *int      `json:"status_code"`
	Error       string    `json:"error"` // the latest attempt's
	Attempts    int64     `json:"attempts"`
	FirstAt     time.Time `json:"first_at"`
	LastAt      time.Time `json:"last_at"`
	LastEventID int64     `json:"last_event_id"`
}

// Bounds of an endpoint's recent failures: the newest
// recentFailureAttempts failed attempts of the window (minutes of a
// receiver failing at the workers' pace, one range of
// deliveries_failed_by_endpoint_finished_at, newest first), in at most
// maxFailureGroups groups, the most frequent first.
const (
	recentFailureAttempts = 1000
	maxFailureGroups      = 20
)

// recentFailuresSQL groups endpoint $1's newest $3 failed attempts since
// $2 (deliveries_failed_by_endpoint_finished_at), with the event of each
// group's latest. Of the attempts that did not complete their jobs, a 2xx
// is one whose outcome was fenced out, not a failure.
const recentFailuresSQL = `
SELECT g.status_code, g.error, g.attempts, g.first_at, g.last_at, g.last_event_id
FROM (
  SELECT f.status_code,
         (array_agg(f.error ORDER BY f.finished_at DESC))[1] AS error,
         count(*) AS attempts,
         min(f.finished_at) AS first_at,
         max(f.finished_at) AS last_at,
         (array_agg(f.event_id ORDER BY f.finished_at DESC))[1] AS last_event_id
  FROM (
    SELECT event_id, finished_at, status_code, error
    FROM outbox.deliveries
    WHERE endpoint_id = $1
      AND finished_at >= $2
      AND outcome IS DISTINCT FROM 'completed'
      AND (status_code NOT BETWEEN 200 AND 299 OR (status_code IS NULL AND error <> ''))
    ORDER BY finished_at DESC
    LIMIT $3
  ) AS f
  GROUP BY f.status_code, CASE WHEN f.status_code IS NULL THEN f.error END
  ORDER BY count(*) DESC, max(f.finished_at) DESC
  LIMIT $4
) AS g
ORDER BY g.attempts DESC, g.last_at DESC`

func scanFailureGroup(row rowScanner) (FailureGroup, error) {
	var g FailureGroup
	err := row.Scan(&g.StatusCode, &g.Error, &g.Attempts, &g.FirstAt, &g.LastAt, &g.LastEventID)
	return g, err
}

// readRecentFailures reads endpoint id's failed attempts since a time,
// grouped by error.
func readRecentFailures(ctx context.Context, db *sql.DB, id int64, since time.Time) ([]FailureGroup, error) {
	groups, err := queryAll(ctx, db, scanFailureGroup, recentFailuresSQL, id, since, recentFailureAttempts, maxFailureGroups)
	if err != nil {
		return nil, fmt.Errorf("endpoint %d failures: %w", id, err)
	}
	return groups, nil
}

// statsMinutes is endpoint id's per-minute rows (0: every endpoint's)
// from a start on, read once and summed over any window within them.
type statsMinutes struct {
	id       int64
	now      time.Time // the current minute, by the database's clock
	rows     []statsRow
	produced []producedMinute
}

// readStatsMinutes reads the last minutes of endpoint id's statistics,
// the current one included.
func readStatsMinutes(ctx context.Context, db *sql.DB, id int64, minutes int) (statsMinutes, error) {
	m := statsMinutes{id: id}
	if err := db.QueryRowContext(ctx, statsNowSQL).Scan(&m.now); err != nil {
		return m, fmt.Errorf("read delivery stats: %w", err)
	}
	from := m.now.Add(-time.Duration(minutes-1) * time.Minute)
	var err error
	if m.rows, err = queryAll(ctx, db, scanStatsRow, statsByMinuteSQL, from, id); err != nil {
		return m, fmt.Errorf("read delivery stats: %w", err)
	}
	if m.produced, err = queryAll(ctx, db, scanProducedMinute, producedByMinuteSQL, from, id); err != nil {
		return m, fmt.Errorf("read delivery stats: %w", err)
	}
	return m, nil
}

// window sums the rows over the window named by window (a key of
// statsWindows no longer than what was read).
func (m statsMinutes) window(window string) DeliveryStats {
	minutes := statsWindows[window]
	st := DeliveryStats{EndpointID: m.id, Window: window}
	st.From = m.now.Add(-time.Duration(minutes-1) * time.Minute)
	st.To = m.now.Add(time.Minute)
	byMinute := make(map[int64]statsRow, len(m.rows))
	for _, r := range m.rows {
		if r.minute.Before(st.From) {
			continue
		}
		byMinute[r.minute.Unix()] = r
		st.add(r.statsCounts)
		st.latency.add(&r.latency)
	}
	producedAt := make(map[int64]producedMinute, len(m.produced))
	for _, p := range m.produced {
		if p.minute.Before(st.From) {
			continue
		}
		producedAt[p.minute.Unix()] = p
		st.Produced += p.n
		st.FilteredOut += p.filtered
		st.FilterErrors += p.filterErrors
	}
	st.Series = make([]statsMinute, minutes)
	for i := range st.Series {
		t := st.From.Add(time.Duration(i) * time.Minute)
		r := byMinute[t.Unix()]
		p := producedAt[t.Unix()]
		st.Series[i] = statsMinute{Minute: t, Produced: p.n, FilteredOut: p.filtered, FilterErrors: p.filterErrors, Delivered: r.Successes, Failed: r.Failures,
			LatencyP50MS: quantileMS(&r.latency, 0.5), LatencyP99MS: quantileMS(&r.latency, 0.99)}
	}
	if st.Attempts > 0 {
		rate := float64(st.Successes) / float64(st.Attempts)
		st.SuccessRate = &rate
	}
	st.LatencyP50MS = quantileMS(&st.latency, 0.5)
	st.LatencyP99MS = quantileMS(&st.latency, 0.99)
	st.Latency = make([]latencyBucketView, statsBuckets)
	for i, n := range st.latency {
		st.Latency[i].Count = n
		if i < len(statsLatencyBounds) {
			st.Latency[i].LeMS = durationMS(statsLatencyBounds[i])
		}
	}
	return st
}

// statsRow is one minute's sums.
type statsRow struct {
	minute time.Time
	statsCounts
	latency latencyCounts
}

func scanStatsRow(row rowScanner) (statsRow, error) {
	var r statsRow
	var buckets []int64
	c := &r.FailuresByClass
	err := row.Scan(&r.minute, &r.Attempts, &r.Successes,
		&c.Timeout, &c.Status4xx, &c.Status5xx, &c.Connection, &c.Other, pq.Array(&buckets))
	if err != nil {
		return r, err
	}
	if len(buckets) != statsBuckets {
		return r, fmt.Errorf("delivery stats of %s: %d latency buckets, want %d", r.minute, len(buckets), statsBuckets)
	}
	copy(r.latency[:], buckets)
	r.Failures = r.Attempts - r.Successes
	return r, nil
}

// quantileMS is c's q-th latency in milliseconds, nil without one.
func quantileMS(c *latencyCounts, q float64) *float64 {
	d, ok := c.quantile(q)
	if !ok {
		return nil
	}
	return durationMS(d)
}

func durationMS(d time.Duration) *float64 {
	ms := float64(d) / float64(time.Millisecond)
	return &ms
}

// deleteStatsSQL is the retention sweep of a per-minute statistics table
// (outbox.delivery_stats, fanout_stats, inbox_stats; retention.go): at
// most $2 rows whose minute is older than $1 seconds, oldest first, by the
// table's minute index or key. A row being added to is skipped, not waited
// for: a row that old is written only by a batch that ended as its minute
// did, and goes next cycle.
func deleteStatsSQL(table string) string {
	return `
DELETE FROM ` + table + `
WHERE ctid = ANY(ARRAY(
  SELECT ctid
  FROM ` + table + `
  WHERE minute < now() - make_interval(secs => $1)
  ORDER BY minute
  LIMIT $2
  FOR UPDATE SKIP LOCKED
))`
}

// formatLatencyMS writes a percentile read from the buckets as the panel
// shows it: "≤ 50 ms", "≤ 2.5 s", "≤ 60 min"; "—" without one.
func formatLatencyMS(ms *float64) string {
	switch {
	case ms == nil:
		return "—"
	case *ms < 1000:
		return "≤ " + strconv.FormatFloat(*ms, 'g', -1, 64) + " ms"
	case *ms < 60_000:
		return "≤ " + strconv.FormatFloat(*ms/1000, 'g', -1, 64) + " s"
	}
	return "≤ " + strconv.FormatFloat(*ms/60_000, 'g', -1, 64) + " min"
}

// splitAttemptError splits a failed attempt's error into its cause and
// the start of the answer the sender quoted after it (webhook.go: the
// cause, then ": " and the excerpt, Go-quoted), unquoted: "receiver
// answered 500" and {"error":"down"}, not one line of escaped quotes.
// An error that quotes nothing is all cause.
func splitAttemptError(e string) (cause, body string) {
	for i := 0; ; {
		j := strings.Index(e[i:], `: "`)
		if j < 0 {
			return e, ""
		}
		at := i + j
		if unquoted, err := strconv.Unquote(e[at+2:]); err == nil {
			return e[:at], unquoted
		}
		i = at + 1
	}
}

// attemptCause is a failed attempt's error without the answer it quotes.
func attemptCause(e string) string {
	cause, _ := splitAttemptError(e)
	return cause
}

// briefCause is a failed attempt's error as a list's cell shows it, the
// whole of it a hover away: the answer's status and what follows it
// ("500 Internal Server Error"), else the innermost cause of the Go error
// ("connection refused" of `webhook: Post "…": dial tcp …: connect:
// connection refused`), each wrap having put its operation and ": " in
// front of the error it wraps.
func briefCause(e string) string {
	parts := strings.Split(attemptCause(e), ": ")
	for i, p := range parts {
		if status, ok := strings.CutPrefix(p, "answered "); ok { // webhook.go, classifyWebhookResponse
			return strings.Join(append([]string{status}, parts[i+1:]...), ": ")
		}
	}
	return parts[len(parts)-1]
}

// prettyBody is an answer's body as the panel shows it: indented when
// it is JSON, as it came otherwise (an excerpt cut short is no longer
// JSON, and is shown as cut).
func prettyBody(body string) string {
	var b bytes.Buffer
	if json.Valid([]byte(body)) && json.Indent(&b, []byte(body), "", "  ") == nil {
		return b.String()
	}
	return body
}

// EndpointSummary is what the endpoints list shows of one endpoint
// beside its settings: its last hour's attempts, its queue, and its last
// failed attempt.
type EndpointSummary struct {
	// Attempts and Successes are summed over the minutes of the last hour.
	Attempts  int64
	Successes int64
	// Queued are due now, Scheduled wait for a later time (a retry's
	// backoff); each counted up to summaryCountCap.
	Queued    int64
	Scheduled int64
	// LastStatus, LastError and LastErrorAt are its last failed attempt
	// (nil status: no answer came; zero time: none is kept).
	LastStatus  *int
	LastError   string
	LastErrorAt *time.Time
}

// summaryCountCap bounds each queue count of the endpoints list: a list
// of maxEndpointPage endpoints reads at most this many index entries per
// endpoint, and a larger queue shows as "1000+".
const summaryCountCap = 1000

// endpointSummariesSQL reads the summary of endpoints $1 (an id array):
// the last hour by the primary key of delivery_stats, the waiting jobs
// by jobs_waiting_by_endpoint, at most $2, and the last failed
// attempt by deliveries_failed_by_endpoint_finished_at (a 2xx there is
// an outcome fenced out, not a failure).
const endpointSummariesSQL = `
SELECT ep.id, coalesce(s.attempts, 0), coalesce(s.successes, 0),
       q.queued, q.scheduled,
       last.status_code, coalesce(last.error, ''), last.finished_at
FROM unnest($1::bigint[]) AS ep (id)
LEFT JOIN LATERAL (
  SELECT sum(attempts) AS attempts, sum(successes) AS successes
  FROM outbox.delivery_stats
  WHERE endpoint_id = ep.id
    AND minute >= date_trunc('minute', now() - interval '1 hour')
) AS s ON true
CROSS JOIN LATERAL (
  SELECT count(*) FILTER (WHERE w.scheduled_at <= now()) AS queued,
         count(*) FILTER (WHERE w.scheduled_at > now() AND w.scheduled_at < 'infinity') AS scheduled
  FROM (
    SELECT scheduled_at FROM outbox.jobs
    WHERE endpoint_id = ep.id AND state IN ('available', 'retryable')
    LIMIT $2
  ) AS w
) AS q
LEFT JOIN LATERAL (
  SELECT d.status_code, d.error, d.finished_at
  FROM outbox.deliveries AS d
  WHERE d.endpoint_id = ep.id
    AND d.outcome IS DISTINCT FROM 'completed'
    AND NOT coalesce(d.status_code BETWEEN 200 AND 299, false)
  ORDER BY d.finished_at DESC
  LIMIT 1
) AS last ON true`

// readEndpointSummaries reads the summaries of the endpoints ids, by id.
func readEndpointSummaries(ctx context.Context, db *sql.DB, ids []int64) (map[int64]EndpointSummary, error) {
	rows, err := db.QueryContext(ctx, endpointSummariesSQL, pq.Array(ids), summaryCountCap)
	if err != nil {
		return nil, fmt.Errorf("endpoint summaries: %w", err)
	}
	defer rows.Close()
	out := make(map[int64]EndpointSummary, len(ids))
	for rows.Next() {
		var id int64
		var s EndpointSummary
		if err := rows.Scan(&id, &s.Attempts, &s.Successes, &s.Queued, &s.Scheduled, &s.LastStatus, &s.LastError, &s.LastErrorAt); err != nil {
			return nil, fmt.Errorf("endpoint summaries: %w", err)
		}
		out[id] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("endpoint summaries: %w", err)
	}
	return out, nil
}
