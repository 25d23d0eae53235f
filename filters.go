// filters.go: the preview of an endpoint's content filter: what a filter,
// saved or not, would have let through of the latest events of a set of
// topics. The filter itself is a column of the endpoint (endpoints.go,
// checkFilter), which PostgreSQL evaluates in the fan-out (schema.sql,
// outbox.fan_out) and in every replay (replay.go); docs/filters.md says
// what it takes.

package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/lib/pq"
)

// The number of events a preview runs a filter over: limit events by
// default, at most maxFilterPreviewLimit (each is a payload read and a
// path evaluated, a few milliseconds a thousand).
const (
	defaultFilterPreviewLimit = 500
	maxFilterPreviewLimit     = 10_000
)

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
	err := db.QueryRowContext(ctx, filterPreviewSQL, pq.Array(req.Topics), req.Filter, req.Limit, filterPreviewWalk, req.OwnerID).Scan(
		&pv.Events, &pv.Matched, &pv.Unknown, &pv.FirstEventID, &pv.LastEventID)
	if err != nil {
		return pv, fmt.Errorf("preview filter: %w", err)
	}
	return pv, nil
}

// previewEndpointFilter is previewFilter over endpoint id's topics, with
// its own filter unless keepOwn is false, when filter (nil: none) is
// tried instead: what it would have received had it had that filter.
func previewEndpointFilter(ctx context.Context, db *sql.DB, id int64, filter *string, keepOwn bool, limit int) (FilterPreview, error) {
	ep, err := getEndpoint(ctx, db, id)
	if err != nil {
		return FilterPreview{}, err
	}
	if keepOwn {
		filter = ep.Filter
	}
	return previewFilter(ctx, db, FilterPreviewRequest{Topics: ep.Topics, Filter: filter, Limit: limit, OwnerID: ep.OwnerID})
}
