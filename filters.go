// filters.go: the preview of an endpoint's content filter: what a filter,
// saved or not, would have let through of the latest events of a set of
// topics; and the hold the relay puts on a filter that failed its pass.
// The filter itself is a column of the endpoint (endpoints.go,
// checkFilter), which PostgreSQL evaluates in the fan-out (schema.sql,
// outbox.fan_out) and in every replay (replay.go); docs/filters.md says
// what it takes.

package main

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// The number of events a preview runs a filter over: limit events by
// default, at most maxFilterPreviewLimit (each is a payload read and a
// path evaluated, a few milliseconds a thousand).
const (
	defaultFilterPreviewLimit = 500
	maxFilterPreviewLimit     = 10_000
)

// filterPreviewTimeout bounds a preview's statement (SET LOCAL
// statement_timeout, in the preview's own transaction): 10,000 events
// under a filter within the rules take well under a second, and a
// filter that runs longer over the events at hand (very large payloads,
// say) answers 400 saying it was too costly to preview, rather than hold
// a connection and a CPU until the request's deadline ends it as a 503.
const filterPreviewTimeout = 5 * time.Second

// filterPreviewWalk is how many of the newest events, of every topic, a
// preview looks through for the ones its topics select: the walk is the
// primary key read backwards, bounded, where a topic that is rare among
// them would otherwise have it read the whole table. A preview of a rare
// topic may then count fewer events than its limit.
const filterPreviewWalk = 100_000

// FilterPreviewRequest is a preview as the API and the panel ask for it:
// the filter to try (nil: none, every event passes), over the newest
// Limit events that Topics select (empty: every topic, as an endpoint's
// empty list does).
type FilterPreviewRequest struct {
	Topics []string
	Filter *string
	Limit  int
	// OwnerID is whose endpoint the preview is for (nil: an endpoint of
	// no owner): it counts only the events such an endpoint could
	// receive (outbox.owner_admits).
	OwnerID *int64
	// Timeout bounds its statement; 0: filterPreviewTimeout.
	Timeout time.Duration
}

// filterPreviewLimit is the limit a request gave, or the default when it
// gave none; validate checks its range.
func filterPreviewLimit(given *int) int {
	if given == nil {
		return defaultFilterPreviewLimit
	}
	return *given
}

// FilterPreview is a preview's answer: of the newest Events events of the
// topics (at most Limit, found among the newest filterPreviewWalk),
// Matched would have been delivered; Unknown of the others are those on
// whose payload the filter could not be evaluated (a wrong type, say),
// which the fan-out counts as no match too. FirstEventID and LastEventID
// bound them (0 without any).
type FilterPreview struct {
	Topics       []string `json:"topics"`
	Filter       *string  `json:"filter"`
	Limit        int      `json:"limit"`
	Events       int64    `json:"events"`
	Matched      int64    `json:"matched"`
	Unknown      int64    `json:"unknown"`
	FirstEventID int64    `json:"first_event_id"`
	LastEventID  int64    `json:"last_event_id"`
}

// validate checks the request's topics and limit; checkFilter checks the
// filter, against the database.
func (q *FilterPreviewRequest) validate() error {
	if q.Limit < 1 || q.Limit > maxFilterPreviewLimit {
		return fmt.Errorf("%w: limit must be between 1 and %d events, got %d", errInvalid, maxFilterPreviewLimit, q.Limit)
	}
	if len(q.Topics) > maxEndpointTopics {
		return fmt.Errorf("%w: %d topic patterns, at most %d", errInvalid, len(q.Topics), maxEndpointTopics)
	}
	for _, p := range q.Topics {
		if err := topicPatternValid(p); err != nil {
			return err
		}
	}
	if q.Topics == nil {
		q.Topics = []string{}
	}
	return nil
}

// filterPreviewSQL runs filter $2 (NULL: none) over the newest $3 events
// that topic patterns $1 select among the newest $4, and that an endpoint
// of owner $5 (NULL: of no owner) could receive, as the fan-out does:
// the tenancy boundary (outbox.owner_admits), then jsonb_path_match with
// silent => true, unknown (NULL) no match. The
// patterns are split once (MATERIALIZED: inlined, topic_split ran again
// for every event the walk passed) and tested with topic_selected, as a
// replay's walk does (replay.go). The walk reads the primary key
// backwards and stops at $3 events of the topics or $4 events in all.
const filterPreviewSQL = `
WITH pattern AS MATERIALIZED (
  SELECT t.names, t.prefixes, t.every_topic, o.key AS owner_key, o.allowed_topics, o.shared_topics
  FROM outbox.topic_split($1) AS t
  LEFT JOIN outbox.owners AS o ON o.id = $5
),
latest AS (
  SELECT e.id, e.payload
  FROM (SELECT id, topic, payload, owner
        FROM outbox.events
        ORDER BY id DESC
        LIMIT $4) AS e, pattern
  WHERE outbox.topic_selected(e.topic, pattern.names, pattern.prefixes, pattern.every_topic)
    AND outbox.owner_admits(e.owner, e.topic, pattern.owner_key, pattern.allowed_topics, pattern.shared_topics)
  ORDER BY e.id DESC
  LIMIT $3
),
judged AS (
  SELECT l.id,
         CASE WHEN $2::jsonpath IS NULL THEN true
              ELSE jsonb_path_match(l.payload, $2::jsonpath, silent => true) END AS verdict
  FROM latest AS l
)
SELECT count(*),
       count(*) FILTER (WHERE j.verdict),
       count(*) FILTER (WHERE j.verdict IS NULL),
       coalesce(min(j.id), 0),
       coalesce(max(j.id), 0)
FROM judged AS j`

// previewFilter counts what req's filter would have let through of the
// newest events of its topics. A filter that could not be stored is
// refused, as creating the endpoint would refuse it.
func previewFilter(ctx context.Context, db *sql.DB, req FilterPreviewRequest) (FilterPreview, error) {
	if err := req.validate(); err != nil {
		return FilterPreview{}, err
	}
	if err := checkFilter(ctx, db, req.Filter); err != nil {
		return FilterPreview{}, err
	}
	pv := FilterPreview{Topics: req.Topics, Filter: req.Filter, Limit: req.Limit}
	timeout := cmp.Or(req.Timeout, filterPreviewTimeout)
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return pv, fmt.Errorf("preview filter: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(timeout.Milliseconds(), 1))); err != nil {
		return pv, fmt.Errorf("preview filter: %w", err)
	}
	err = tx.QueryRowContext(ctx, filterPreviewSQL, pq.Array(req.Topics), req.Filter, req.Limit, filterPreviewWalk, req.OwnerID).Scan(
		&pv.Events, &pv.Matched, &pv.Unknown, &pv.FirstEventID, &pv.LastEventID)
	if pq.As(err, pqerror.QueryCanceled) != nil && ctx.Err() == nil {
		return pv, fmt.Errorf("%w: filter: too costly to preview: it ran past %s over the newest %d events of the topics; try a smaller limit or a simpler filter", errInvalid, timeout, req.Limit)
	}
	if err != nil {
		return pv, fmt.Errorf("preview filter: %w", err)
	}
	return pv, nil
}

// previewEndpointFilter is previewFilter over endpoint id's topics, with
// its own filter unless keepOwn is false, when filter (nil: none) is
// tried instead: what it would have received had it had that filter.
// timeout bounds it as FilterPreviewRequest's does.
func previewEndpointFilter(ctx context.Context, db *sql.DB, id int64, filter *string, keepOwn bool, limit int, timeout time.Duration) (FilterPreview, error) {
	ep, err := getEndpoint(ctx, db, id)
	if err != nil {
		return FilterPreview{}, err
	}
	if keepOwn {
		filter = ep.Filter
	}
	return previewFilter(ctx, db, FilterPreviewRequest{Topics: ep.Topics, Filter: filter, Limit: limit, OwnerID: ep.OwnerID, Timeout: timeout})
}

// heldFilter is an endpoint whose filter holdFailingFilters held, and why.
type heldFilter struct {
	EndpointID int64
	Error      string
}

// filtersToTrySQL is the enabled endpoints with a filter not held whose
// topics select one of events $1 that the tenancy boundary lets them
// have (outbox.owner_admits), as the fan-out routes them.
const filtersToTrySQL = `
SELECT ep.id, ep.filter
FROM outbox.endpoints AS ep
LEFT JOIN outbox.owners AS o ON o.id = ep.owner_id
WHERE ep.filter_path IS NOT NULL
  AND ep.filter_error_at IS NULL
  AND ep.disabled_at IS NULL
  AND EXISTS (SELECT 1
              FROM outbox.events AS e
              WHERE e.id = ANY ($1)
                AND outbox.topic_matches(ep.topics, e.topic)
                AND outbox.owner_admits(e.owner, e.topic, o.key, o.allowed_topics, o.shared_topics))
ORDER BY ep.id`

// tryFilterSQL evaluates endpoint $1's filter as the fan-out does
// (outbox.fan_out, routed) on each of events $2 its topics select and the
// tenancy boundary lets it have; it counts the verdicts only so that
// every one is computed.
const tryFilterSQL = `
SELECT count(jsonb_path_match(e.payload, ep.filter_path, silent => true))
FROM outbox.endpoints AS ep
LEFT JOIN outbox.owners AS o ON o.id = ep.owner_id
JOIN outbox.events AS e ON e.id = ANY ($2) AND outbox.topic_matches(ep.topics, e.topic)
WHERE ep.id = $1
  AND outbox.owner_admits(e.owner, e.topic, o.key, o.allowed_topics, o.shared_topics)`

// holdFilterSQL holds endpoint $1's filter, as $2 read it, with error
// $3; a filter written again since is tried afresh by the next pass.
const holdFilterSQL = `
UPDATE outbox.endpoints
SET filter_error = $3,
    filter_error_at = now()
WHERE id = $1
  AND filter = $2
  AND filter_error_at IS NULL`

// holdFailingFilters tries, one endpoint at a time, the filter of every
// endpoint whose topics select one of events (those of a relay pass that
// failed), each in a transaction of its own whose statement_timeout is
// bound, and holds those that fail: an error of the filter's evaluation
// or the bound reached (filterFault), which in the pass's one statement
// failed every endpoint's fan-out. It returns those it held; a failure
// that is not the filter's (the database, the connection) ends it.
//
// Why this design: the fan-out evaluates every endpoint's filter in one
// statement, its cost on the hot path; a guard around each evaluation (a
// subtransaction for errors) would cost every event of every filtered
// endpoint, and still could not bound a slow one, as PostgreSQL's only
// bound on time is per statement. So the pass keeps its one statement
// under a timeout, and only a pass that failed pays for this: one
// statement per filtered endpoint of its events, once. A held filter is
// not evaluated again (its endpoint gets nothing of its topics, counted
// as filter_errors) until it is written again: evaluated each pass, a
// filter that fails would fail each pass, and every endpoint would wait
// for it every time.
func holdFailingFilters(ctx context.Context, db *sql.DB, events []int64, bound time.Duration) ([]heldFilter, error) {
	type candidate struct {
		id     int64
		filter string
	}
	candidates, err := queryAll(ctx, db, func(row rowScanner) (candidate, error) {
		var c candidate
		return c, row.Scan(&c.id, &c.filter)
	}, filtersToTrySQL, pq.Array(events))
	if err != nil {
		return nil, fmt.Errorf("hold failing filters: list them: %w", err)
	}
	var held []heldFilter
	for _, c := range candidates {
		fault, err := tryFilter(ctx, db, c.id, events, bound)
		if err != nil {
			return held, err
		}
		if fault == "" {
			continue
		}
		if first, last := slices.Min(events), slices.Max(events); first == last {
			fault = fmt.Sprintf("on event %d: %s", first, fault)
		} else {
			fault = fmt.Sprintf("on events %d to %d: %s", first, last, fault)
		}
		fault = truncate(fault, maxErrorLen)
		res, err := db.ExecContext(ctx, holdFilterSQL, c.id, c.filter, fault)
		if err != nil {
			return held, fmt.Errorf("hold the filter of endpoint %d: %w", c.id, err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			held = append(held, heldFilter{EndpointID: c.id, Error: fault})
		}
	}
	return held, nil
}

// tryFilter evaluates endpoint id's filter on events (tryFilterSQL) in
// a read-only transaction of its own bounded by bound (0: none, as the
// relay's passes then have none), and says how it failed ("" if it did
// not); err is a failure that is not the filter's.
func tryFilter(ctx context.Context, db *sql.DB, id int64, events []int64, bound time.Duration) (fault string, err error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return "", fmt.Errorf("try the filter of endpoint %d: %w", id, err)
	}
	defer tx.Rollback()
	ms := int64(0)
	if bound > 0 {
		ms = max(bound.Milliseconds(), 1)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", ms)); err != nil {
		return "", fmt.Errorf("try the filter of endpoint %d: %w", id, err)
	}
	var n int64
	err = tx.QueryRowContext(ctx, tryFilterSQL, id, pq.Array(events)).Scan(&n)
	switch pqErr := pq.As(err); {
	case err == nil:
		return "", nil
	case ctx.Err() == nil && pqErr != nil && filterFault(pqErr):
		if pqErr.Code == pqerror.QueryCanceled {
			return fmt.Sprintf("the filter ran longer than %s, half the relay's pass timeout", bound), nil
		}
		return fmt.Sprintf("the filter failed: %s (SQLSTATE %s)", pqErr.Message, pqErr.Code), nil
	default:
		return "", fmt.Errorf("try the filter of endpoint %d: %w", id, err)
	}
}

// filterFault tells an error that evaluating a filter raised (a data
// exception silent does not cover, a missing variable, memory or stack
// exhausted, the statement timeout) from one that says nothing about the
// filter: a lost connection, a shutdown, a conflict, a full disk.
func filterFault(e *pq.Error) bool {
	switch e.Code.Class() {
	case "08", "25", "40", "58":
		return false
	case "53":
		return e.Code == pqerror.OutOfMemory
	case "57":
		return e.Code == pqerror.QueryCanceled
	}
	return true
}
