// outbox.go: the producer side, recording events and reading them back.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// Event is one row of outbox.events: a fact recorded by the application in
// the transaction that made it true.
type Event struct {
	ID            int64           `json:"id"`
	Topic         string          `json:"topic"`
	Subject       string          `json:"subject"`
	Payload       json.RawMessage `json:"payload"`
	CreatedAt     time.Time       `json:"created_at"`
	FannedOutAt   *time.Time      `json:"fanned_out_at"`
	RelayAttempts int             `json:"relay_attempts"`
	RelayError    *string         `json:"relay_error"`
	PoisonedAt    *time.Time      `json:"poisoned_at"`
	// Traceparent and Tracestate are the W3C trace context the producer's
	// transaction set (outbox.traceparent), sent on every delivery.
	Traceparent *string `json:"traceparent,omitempty"`
	Tracestate  *string `json:"tracestate,omitempty"`
	// Outcome is where the event's jobs stand, in lists that show it
	// (the stream); nil elsewhere.
	Outcome *EventOutcome `json:"outcome,omitempty"`
}

// topicPattern is the topic format that schema.sql's events_topic_format
// constraint enforces; checked here too so an API caller gets a 400 that
// says so instead of a constraint name.
var topicPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,199}$`)

// namePattern is the form of the names outboxd gives things (subscribers,
// inbox sources): they become job kinds and URL paths, so they are short
// and need no escaping.
var namePattern = regexp.MustCompile(`^[a-z0-9_-]{1,50}$`)

// maxSubjectLen matches the events_subject_length constraint.
const maxSubjectLen = 500

// errInvalid marks errors caused by the caller's input; the HTTP layer maps
// it to 400.
var errInvalid = errors.New("invalid input")

// validateEvent checks an event before it is recorded.
func validateEvent(topic, subject string, payload json.RawMessage) error {
	if !topicPattern.MatchString(topic) {
		return fmt.Errorf("%w: topic %q must be 1-200 characters of letters, digits and _ . : / - (not starting with a symbol)", errInvalid, topic)
	}
	if len(subject) > maxSubjectLen {
		return fmt.Errorf("%w: subject is %d bytes, at most %d", errInvalid, len(subject), maxSubjectLen)
	}
	if len(payload) > 0 && !json.Valid(payload) {
		return fmt.Errorf("%w: payload is not valid JSON", errInvalid)
	}
	return nil
}

// recordEvent records an event through outbox.record, inside q's transaction
// when q is a *sql.Tx: the event commits or rolls back with it.
func recordEvent(ctx context.Context, q queryer, topic, subject string, payload json.RawMessage) (int64, error) {
	if err := validateEvent(topic, subject, payload); err != nil {
		return 0, err
	}
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	var id int64
	err := q.QueryRowContext(ctx, `SELECT outbox.record($1, $2, $3)`, topic, subject, string(payload)).Scan(&id)
	if pqErr := pq.As(err); pqErr != nil && (pqErr.Code.Class() == "22" || pqErr.Code == pqerror.CheckViolation) {
		// JSON that Go accepts and jsonb does not (invalid UTF-8, an
		// escaped NUL, a lone surrogate), or a payload over the size
		// check: the caller's input, not a server fault.
		return 0, fmt.Errorf("%w: record event: %w", errInvalid, err)
	}
	if err != nil {
		return 0, fmt.Errorf("record event: %w", err)
	}
	return id, nil
}

// traceContext is a W3C trace context to record an event under; empty
// values record none.
type traceContext struct {
	Traceparent, Tracestate string
}

// recordEventTraced is recordEvent in a transaction of its own that
// carries tc the way a producer's transaction does: in the settings
// outbox.traceparent and outbox.tracestate, which outbox.record stores. A
// malformed value is the caller's input: schema.sql refuses it.
func recordEventTraced(ctx context.Context, db *sql.DB, tc traceContext, topic, subject string, payload json.RawMessage) (int64, error) {
	if tc.Traceparent == "" {
		return recordEvent(ctx, db, topic, subject, payload)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("record event: %w", err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `SELECT set_config('outbox.traceparent', $1, true), set_config('outbox.tracestate', $2, true)`,
		tc.Traceparent, tc.Tracestate)
	if pqErr := pq.As(err); pqErr != nil && pqErr.Code.Class() == "22" {
		return 0, fmt.Errorf("%w: trace context: %w", errInvalid, err) // not text PostgreSQL can hold
	}
	if err != nil {
		return 0, fmt.Errorf("record event: trace context: %w", err)
	}
	id, err := recordEvent(ctx, tx, topic, subject, payload)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("record event: %w", err)
	}
	return id, nil
}

const requeueEventSQL = `
UPDATE outbox.events
SET poisoned_at = NULL,
    relay_attempts = 0,
    relay_error = NULL
WHERE id = $1
  AND fanned_out_at IS NULL
RETURNING id`

// errNotFound marks a lookup of a row that does not exist (404).
var errNotFound = errors.New("not found")

// requeueEvent puts a poisoned (or failing) event back into the backlog with
// a fresh count of relay attempts, and wakes the relays.
func requeueEvent(ctx context.Context, db *sql.DB, id int64) error {
	found, err := updateOneAndNotify(ctx, db, eventsChannel, requeueEventSQL, id)
	if err != nil {
		return fmt.Errorf("requeue event %d: %w", id, err)
	}
	if !found {
		return fmt.Errorf("requeue event %d: %w (or already fanned out)", id, errNotFound)
	}
	return nil
}

const getEventSQL = `
SELECT id, topic, subject, payload, created_at,
       fanned_out_at, relay_attempts, relay_error, poisoned_at,
       traceparent, tracestate
FROM outbox.events
WHERE id = $1`

// getEvent reads one event.
func getEvent(ctx context.Context, db *sql.DB, id int64) (Event, error) {
	e, err := scanEvent(db.QueryRowContext(ctx, getEventSQL, id))
	if errors.Is(err, sql.ErrNoRows) {
		return e, fmt.Errorf("event %d: %w", id, errNotFound)
	}
	if err != nil {
		return e, fmt.Errorf("get event %d: %w", id, err)
	}
	return e, nil
}

// scanEvent reads one event in getEventSQL's column order, which every
// query of events shares.
func scanEvent(row rowScanner) (Event, error) {
	var e Event
	var payload []byte
	err := row.Scan(&e.ID, &e.Topic, &e.Subject, &payload, &e.CreatedAt,
		&e.FannedOutAt, &e.RelayAttempts, &e.RelayError, &e.PoisonedAt,
		&e.Traceparent, &e.Tracestate)
	e.Payload = payload
	return e, err
}

// EventFilter selects events for the stream: newest first, paged by id.
type EventFilter struct {
	Topic   string // exact topic, or a pattern ending in ".*"
	Subject string // exact
	State   string // "", "unfanned", "fanned" or "poisoned"
	Before  int64  // only ids below this; 0: from the newest
	Limit   int
}

// maxEventPage bounds one page of the stream.
const maxEventPage = 500

// defaultPageSize is a page whose reader names no size: of the stream, of
// the job list, of the panel's subject search, of an endpoint's last
// deliveries on the API.
const defaultPageSize = 50

func (f *EventFilter) validate() error {
	switch f.State {
	case "", "unfanned", "fanned", "poisoned":
	default:
		return fmt.Errorf("%w: state %q must be unfanned, fanned or poisoned", errInvalid, f.State)
	}
	if f.Topic != "" {
		if err := topicPatternValid(f.Topic); err != nil {
			return err
		}
	}
	if f.Limit <= 0 {
		f.Limit = defaultPageSize
	}
	f.Limit = min(f.Limit, maxEventPage)
	return nil
}

// listEventsSQL pages the stream by id. Each filter is off when its
// parameter is empty; the primary key serves the order and the page bound.
const listEventsSQL = `
SELECT id, topic, subject, payload, created_at,
       fanned_out_at, relay_attempts, relay_error, poisoned_at,
       traceparent, tracestate
FROM outbox.events
WHERE ($1::bigint = 0 OR id < $1::bigint)
  AND ($2 = '' OR topic = $2 OR (right($2, 2) = '.*' AND starts_with(topic, left($2, -1))))
  AND ($3 = '' OR subject = $3)
  AND ($4 = ''
       OR ($4 = 'unfanned' AND fanned_out_at IS NULL AND poisoned_at IS NULL)
       OR ($4 = 'fanned' AND fanned_out_at IS NOT NULL)
       OR ($4 = 'poisoned' AND poisoned_at IS NOT NULL))
ORDER BY id DESC
LIMIT $5`

// listEvents reads one page of the stream, newest first.
func listEvents(ctx context.Context, db *sql.DB, f EventFilter) ([]Event, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	events, err := queryAll(ctx, db, scanEvent, listEventsSQL, f.Before, f.Topic, f.Subject, f.State, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return events, nil
}

// topicPatternValid checks a subscription pattern: an exact topic, "*", or
// a prefix ending in ".*" ("order.*"). outbox.topic_matches evaluates them.
func topicPatternValid(p string) error {
	if p == "*" {
		return nil
	}
	topic, _ := strings.CutSuffix(p, ".*")
	if !topicPattern.MatchString(topic) {
		return fmt.Errorf("%w: topic pattern %q must be a topic, \"*\", or a topic prefix followed by \".*\"", errInvalid, p)
	}
	return nil
}

// internalTopicPrefix marks outboxd's own topics, which only a pattern
// naming them selects (see outbox.topic_matches).
const internalTopicPrefix = "outboxd."
