// stats.go: the delivery statistics read back: an endpoint's, or every
// endpoint's, attempts, outcomes and commit→first-2xx latency over the last
// hour or day, from outbox.delivery_stats, which the completers write
// (outcome.go, attemptsAndStatsSQL) and every replica shares.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
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
// endpoint $2, or of every endpoint with $2 = 0.
const producedByMinuteSQL = `
SELECT minute, sum(deliveries)::bigint
FROM outbox.fanout_stats
WHERE minute >= $1
  AND ($2 = 0 OR endpoint_id = $2)
GROUP BY minute`

type producedMinute struct {
	minute time.Time
	n      int64
}

func scanProducedMinute(row rowScanner) (producedMinute, error) {
	var p producedMinute
	err := row.Scan(&p.minute, &p.n)
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
	return m.window(window), nil
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
	producedAt := make(map[int64]int64, len(m.produced))
	for _, p := range m.produced {
		if p.minute.Before(st.From) {
			continue
		}
		producedAt[p.minute.Unix()] = p.n
		st.Produced += p.n
	}
	st.Series = make([]statsMinute, minutes)
	for i := range st.Series {
		t := st.From.Add(time.Duration(i) * time.Minute)
		r := byMinute[t.Unix()]
		st.Series[i] = statsMinute{Minute: t, Produced: producedAt[t.Unix()], Delivered: r.Successes, Failed: r.Failures,
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
