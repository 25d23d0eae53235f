// outbox.go: the producer side, recording events and reading them back.

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

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
	// ErasedAt is when an erasure of its subject erased its payload
	// (erasure.go), which is then null.
	ErasedAt *time.Time `json:"erased_at"`
	// Traceparent and Tracestate are the W3C trace context the producer's
	// transaction set (outbox.traceparent), sent on every delivery.
	Traceparent *string `json:"traceparent,omitempty"`
	Tracestate  *string `json:"tracestate,omitempty"`
	// Owner is the key of the owner the event is addressed to (outbox.record's
	// fourth argument); nil: to no owner (docs/owners.md).
	Owner *string `json:"owner"`
	// Test marks a test send's event (POST /api/endpoints/{id}/test,
	// topics.go); absent for every other.
	Test bool `json:"test,omitempty"`
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

// fieldError is the database's refusal of one field of the caller's
// input where its error cannot say which (a value jsonb cannot hold names
// no column): field names it, for the answer to tell (httpserve.go,
// inputRefusal).
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.field + ": " + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// eventInput is an event to record: what POST /api/events takes, and
// what outbox.record's arguments are.
type eventInput struct {
	Topic   string          `json:"topic"`
	Subject string          `json:"subject"`
	Payload json.RawMessage `json:"payload"`
	// Owner addresses the event to the owner with that key; "": to no
	// owner (docs/owners.md).
	Owner string `json:"owner"`
}

// ownerKeyPattern is the form of an owner's key and of the owner an event
// is addressed to: schema.sql's owners_key_format and events_owner_format
// constraints enforce it; checked here too so an API caller gets a 400
// that says so instead of a constraint name. An application's own ids
// fit it (42, cust_42, 7f3c-..., org:acme, ops@example.com).
var ownerKeyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,199}$`)

// validOwnerKey refuses a key no owner can have, naming field.
func validOwnerKey(field, key string) error {
	if !ownerKeyPattern.MatchString(key) {
		return fmt.Errorf("%w: %s %q must be 1-200 characters of letters, digits and _ . : @ / + = - (starting with a letter or digit)", errInvalid, field, key)
	}
	return nil
}

// validate checks an event before it is recorded.
func (ev eventInput) validate() error {
	if !topicPattern.MatchString(ev.Topic) {
		return fmt.Errorf("%w: topic %q must be 1-200 characters of letters, digits and _ . : / - (not starting with a symbol)", errInvalid, ev.Topic)
	}
	if len(ev.Subject) > maxSubjectLen {
		return fmt.Errorf("%w: subject is %d bytes, at most %d", errInvalid, len(ev.Subject), maxSubjectLen)
	}
	if !utf8.ValidString(ev.Subject) || strings.ContainsRune(ev.Subject, 0) {
		// PostgreSQL's text would refuse it (SQLSTATE 22021); said here,
		// a refusal by outbox.record can only be the payload's.
		return fmt.Errorf("%w: subject must be UTF-8 text without NUL", errInvalid)
	}
	if ev.Owner != "" {
		if err := validOwnerKey("owner", ev.Owner); err != nil {
			return err
		}
	}
	if len(ev.Payload) > 0 && !json.Valid(ev.Payload) {
		return fmt.Errorf("%w: payload is not valid JSON", errInvalid)
	}
	return nil
}

// recordEventSQL passes "" as NULL, the owner of an event addressed to
// none.
const recordEventSQL = `SELECT outbox.record($1, $2, $3, nullif($4, ''))`

// record records ev through outbox.record, inside q's transaction when q
// is a *sql.Tx: the event commits or rolls back with it.
func (ev eventInput) record(ctx context.Context, q queryer) (int64, error) {
	if err := ev.validate(); err != nil {
		return 0, err
	}
	payload := ev.Payload
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	var id int64
	err := q.QueryRowContext(ctx, recordEventSQL, ev.Topic, ev.Subject, string(payload), ev.Owner).Scan(&id)
	if pqErr := pq.As(err); pqErr != nil && (pqErr.Code.Class() == "22" || pqErr.Code == pqerror.CheckViolation) {
		// JSON that Go accepts and jsonb does not (invalid UTF-8, an
		// escaped NUL, a lone surrogate), or a payload over the size
		// check: the caller's input, not a server fault.
		return 0, fmt.Errorf("%w: record event: %w", errInvalid, &fieldError{field: "payload", err: err})
	}
	if err != nil {
		return 0, fmt.Errorf("record event: %w", err)
	}
	return id, nil
}

// recordEvent records an event addressed to no owner, inside q's
// transaction when q is a *sql.Tx.
func recordEvent(ctx context.Context, q queryer, topic, subject string, payload json.RawMessage) (int64, error) {
	return eventInput{Topic: topic, Subject: subject, Payload: payload}.record(ctx, q)
}

// traceContext is a W3C trace context to record an event under; empty
// values record none.
type traceContext struct {
	Traceparent, Tracestate string
}

// traceContextOf is the trace context of an HTTP request's headers, as
// text PostgreSQL can hold, for outbox.record to judge (schema.sql,
// outbox.trace_context). Several tracestate fields are one list, joined
// with commas (RFC 9110 field order); several traceparent fields are
// joined the same way, which makes them the invalid value they are.
// Bytes that are not UTF-8 become U+FFFD, which no trace context holds,
// and NULs go: set_config would refuse either, failing the recording.
func traceContextOf(h http.Header) traceContext {
	text := func(name string) string {
		v := strings.Join(h.Values(name), ",")
		return strings.ReplaceAll(strings.ToValidUTF8(v, "\uFFFD"), "\x00", "")
	}
	return traceContext{Traceparent: text("traceparent"), Tracestate: text("tracestate")}
}

// setTraceContextSQL sets a trace context for the rest of a transaction,
// as a producer's SET LOCAL does.
const setTraceContextSQL = `SELECT set_config('outbox.traceparent', $1, true), set_config('outbox.tracestate', $2, true)`

// setTraceContext makes tc the trace context outbox.record stores in tx.
// Whatever tc holds, the recording goes on: outbox.record keeps what is
// valid of it and drops the rest.
func setTraceContext(ctx context.Context, tx *sql.Tx, tc traceContext) error {
	if _, err := tx.ExecContext(ctx, setTraceContextSQL, tc.Traceparent, tc.Tracestate); err != nil {
		return fmt.Errorf("set trace context: %w", err)
	}
	return nil
}

// recordEventTraced is recordEvent in a transaction of its own that
// carries tc the way a producer's transaction does.
func recordEventTraced(ctx context.Context, db *sql.DB, tc traceContext, ev eventInput) (int64, error) {
	if tc == (traceContext{}) {
		return ev.record(ctx, db)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("record event: %w", err)
	}
	defer tx.Rollback()
	if err := setTraceContext(ctx, tx, tc); err != nil {
		return 0, fmt.Errorf("record event: %w", err)
	}
	id, err := ev.record(ctx, tx)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("record event: %w", err)
	}
	return id, nil
}

// errIdempotencyKeyReused is a request whose Idempotency-Key an earlier,
// different request recorded an event under (the HTTP layer's 422).
var errIdempotencyKeyReused = errors.New("idempotency key reused")

// maxIdempotencyKeyLen bounds an Idempotency-Key, as schema.sql's
// idempotency_keys_key_length does: 255 characters, Stripe's bound, holds
// a UUID or a client's own composite key with room to spare.
const maxIdempotencyKeyLen = 255

// requestDigest is what two requests under one Idempotency-Key must share
// to be the same request: a SHA-256 of the topic, the subject, the owner
// and the payload without insignificant whitespace (a client that
// re-encodes its retry is still retrying). The owner goes in only when
// there is one, after an "o", which no compact JSON payload starts with:
// a request without one digests as it did before events had owners. The
// trace context is not part of it: a retry is a new span.
func requestDigest(ev eventInput) []byte {
	payload := ev.Payload
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`) // what eventInput.record records
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, payload); err != nil {
		compact.Reset()
		compact.Write(payload) // eventInput.validate refuses it before it counts
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s%d:%s", len(ev.Topic), ev.Topic, len(ev.Subject), ev.Subject)
	if ev.Owner != "" {
		fmt.Fprintf(h, "o%d:%s", len(ev.Owner), ev.Owner)
	}
	h.Write(compact.Bytes())
	return h.Sum(nil)
}

const findIdempotencyKeySQL = `
SELECT request_digest, event_id
FROM outbox.idempotency_keys
WHERE key = $1`

// idempotentRounds bounds recordEventOnce: a round that loses its key to
// a concurrent request reads the winner's row in the next; a third is
// needed only if retention pruned that row in between.
const idempotentRounds = 3

// recordEventOnce is recordEventTraced for a request with an
// Idempotency-Key: the first request with key records the event and the
// key in one transaction; a later one records nothing and answers the
// first event's id (replayed), or errIdempotencyKeyReused when it asks
// for another event. Concurrent requests with one key record one event:
// the key's primary key makes the second insert wait for the first's
// transaction, and insert nothing once that commits.
func recordEventOnce(ctx context.Context, db *sql.DB, key string, tc traceContext, ev eventInput) (id int64, replayed bool, err error) {
	if err := ev.validate(); err != nil {
		return 0, false, err
	}
	digest := requestDigest(ev)
	for round := 1; ; round++ {
		var stored []byte
		err := db.QueryRowContext(ctx, findIdempotencyKeySQL, key).Scan(&stored, &id)
		switch {
		case err == nil && bytes.Equal(stored, digest):
			return id, true, nil
		case err == nil:
			return 0, false, fmt.Errorf("%w: Idempotency-Key %q recorded event %d for a different request; a new request takes a new key",
				errIdempotencyKeyReused, key, id)
		case !errors.Is(err, sql.ErrNoRows):
			return 0, false, fmt.Errorf("record event: read idempotency key: %w", err)
		}
		id, won, err := recordEventKeyed(ctx, db, key, digest, tc, ev)
		if err != nil || won {
			return id, false, err
		}
		if round == idempotentRounds {
			return 0, false, fmt.Errorf("record event: idempotency key %q lost to a concurrent request %d times", key, round)
		}
	}
}

// insertIdempotencyKeySQL keeps the key with its event. A concurrent
// transaction that inserted the key waits this one out; once it commits,
// this inserts nothing.
const insertIdempotencyKeySQL = `
INSERT INTO outbox.idempotency_keys (key, request_digest, event_id)
VALUES ($1, $2, $3)
ON CONFLICT (key) DO NOTHING`

// recordEventKeyed records the event and its key in one transaction,
// under tc. won is false, and nothing is recorded, when a concurrent
// request's transaction committed the key first.
func recordEventKeyed(ctx context.Context, db *sql.DB, key string, digest []byte, tc traceContext, ev eventInput) (id int64, won bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, fmt.Errorf("record event: %w", err)
	}
	defer tx.Rollback()
	if tc != (traceContext{}) {
		if err := setTraceContext(ctx, tx, tc); err != nil {
			return 0, false, fmt.Errorf("record event: %w", err)
		}
	}
	if id, err = ev.record(ctx, tx); err != nil {
		return 0, false, err
	}
	res, err := tx.ExecContext(ctx, insertIdempotencyKeySQL, key, digest, id)
	if err != nil {
		return 0, false, fmt.Errorf("record event: keep idempotency key: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return 0, false, err // rolled back: the winner's event is the one
	}
	if err := tx.Commit(); err != nil {
		return 0, false, fmt.Errorf("record event: %w", err)
	}
	return id, true, nil
}

// traceRepairsSQL reads the counts of trace contexts outbox.record
// repaired, one sequence per repair (schema.sql, trace_repairs_*): a
// sequence that was never used has no last_value yet.
const traceRepairsSQL = `
SELECT substr(sequencename, length('trace_repairs_') + 1), coalesce(last_value, 0)
FROM pg_sequences
WHERE schemaname = 'outbox'
  AND starts_with(sequencename, 'trace_repairs_')
ORDER BY 1`

// traceRepairs is how many times outbox.record repaired a trace context,
// by repair (outbox.trace_context names them).
type traceRepairs map[string]int64

// readTraceRepairs reads the counts: every replica's recordings, and
// every producer's.
func readTraceRepairs(ctx context.Context, db *sql.DB) (traceRepairs, error) {
	type count struct {
		repair string
		n      int64
	}
	counts, err := queryAll(ctx, db, func(row rowScanner) (count, error) {
		var c count
		return c, row.Scan(&c.repair, &c.n)
	}, traceRepairsSQL)
	if err != nil {
		return nil, fmt.Errorf("read trace repairs: %w", err)
	}
	repairs := traceRepairs{}
	for _, c := range counts {
		repairs[c.repair] = c.n
	}
	return repairs, nil
}

// requeueEventSQL makes the event look unrelayed, so it keeps the row's
// commit time first (schema.sql, outbox.commit_time): the relay's claim
// could not tell this change from the recording's.
const requeueEventSQL = `
UPDATE outbox.events AS e
SET committed_at = outbox.commit_time(e, e.xmin),
    poisoned_at = NULL,
    relay_attempts = 0,
    relay_error = NULL
WHERE id = $1
  AND fanned_out_at IS NULL
RETURNING id`

// errNotFound marks a lookup of a row that does not exist (404).
var errNotFound = errors.New("not found")

// errConflict marks a request refused for the state things are in, not
// for its input (409).
var errConflict = errors.New("conflict")

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

// eventColumns are the columns every query of events reads, in
// scanEvent's order, of outbox.events as e.
const eventColumns = `
  e.id, e.topic, e.subject, e.payload, e.created_at,
  e.fanned_out_at, e.relay_attempts, e.relay_error, e.poisoned_at,
  e.traceparent, e.tracestate, e.owner, e.erased_at, e.test IS TRUE`

const getEventSQL = `
SELECT` + eventColumns + `
FROM outbox.events AS e
WHERE e.id = $1`

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

// scanEvent reads one event in eventColumns' order.
func scanEvent(row rowScanner) (Event, error) {
	var e Event
	var payload []byte
	err := row.Scan(&e.ID, &e.Topic, &e.Subject, &payload, &e.CreatedAt,
		&e.FannedOutAt, &e.RelayAttempts, &e.RelayError, &e.PoisonedAt,
		&e.Traceparent, &e.Tracestate, &e.Owner, &e.ErasedAt, &e.Test)
	e.Payload = payload
	return e, err
}

// EventFilter selects events for the stream: newest first, paged by id in
// either direction.
type EventFilter struct {
	Topic   string // exact topic, or a pattern ending in ".*"
	Subject string // exact
	State   string // "", "unfanned", "fanned" or "poisoned"
	// Outcome is where the event's deliveries stand: "delivered" (it has
	// jobs and every one completed), "failed" (a job was discarded),
	// "pending" (a job is still to finish, or the event waits to be fanned
	// out), or "" for any. An event can be both failed and pending.
	Outcome string
	// Payload is a JSON object the event's payload contains (jsonb @>),
	// "" for any: {"customer": {"id": 42}} finds every event about that
	// customer, whatever else its payload holds.
	Payload string
	Since   time.Time // recorded at or after; zero: no bound
	Until   time.Time // recorded before; zero: no bound
	Before  int64     // only ids below this; 0: from the newest
	After   int64     // only ids above this, the page just newer; 0: none
	Limit   int
	// Owner is the owner whose search this is (docs/owners.md): only the
	// events its endpoints were sent, a job in the queue or an attempt in
	// the history, within the tenancy boundary; 0: every event, the
	// admin's stream.
	Owner int64
}

// eventOutcomes are the values of EventFilter.Outcome, as a message names them.
const eventOutcomes = "delivered, failed or pending"

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
	switch f.Outcome {
	case "", "delivered", "failed", "pending":
	default:
		return fmt.Errorf("%w: outcome %q must be %s", errInvalid, f.Outcome, eventOutcomes)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return fmt.Errorf("%w: until %s must be after since %s", errInvalid,
			f.Until.Format(time.RFC3339Nano), f.Since.Format(time.RFC3339Nano))
	}
	if f.Before != 0 && f.After != 0 {
		return fmt.Errorf("%w: before and after page in opposite directions: give one", errInvalid)
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

// listEventsSelectSQL is the stream and its filters, each off when its
// parameter is empty (0, an empty string or NULL). An owner's search ($11)
// keeps the events one of its endpoints has a job or an attempt of,
// through jobs_by_event_id and deliveries_by_event_id, and only those
// the tenancy boundary admits (outbox.owner_admits), as endpointEventSQL. The outcome counts an
// event's jobs of the queue through jobs_by_event_id and its delivered
// ones in the history through deliveries_by_event_id, one event at a time
// as the id order reaches it, and only when asked for ($8); a LATERAL
// count rather than EXISTS in the OR, which PostgreSQL may plan as a hash
// of every job.
const listEventsSelectSQL = `
SELECT` + eventColumns + `
FROM outbox.events e
CROSS JOIN LATERAL (
  SELECT count(*) AS jobs,
         count(*) FILTER (WHERE j.state = 'completed') AS completed,
         count(*) FILTER (WHERE j.state = 'discarded') AS discarded
  FROM (SELECT j.state FROM outbox.jobs j WHERE $8 <> '' AND j.event_id = e.id
        UNION ALL
        SELECT 'completed' FROM outbox.deliveries d WHERE $8 <> '' AND d.event_id = e.id AND d.outcome = 'completed') j
) o
WHERE ($1::bigint = 0 OR id < $1::bigint)
  AND ($2::bigint = 0 OR id > $2::bigint)
  AND ($3 = '' OR topic = $3 OR (right($3, 2) = '.*' AND starts_with(topic, left($3, -1))))
  AND ($4 = '' OR subject = $4)
  AND ($5 = ''
       OR ($5 = 'unfanned' AND fanned_out_at IS NULL AND poisoned_at IS NULL)
       OR ($5 = 'fanned' AND fanned_out_at IS NOT NULL)
       OR ($5 = 'poisoned' AND poisoned_at IS NOT NULL))
  AND ($10::jsonb IS NULL OR payload @> $10::jsonb)
  AND ($11::bigint = 0 OR EXISTS (
        SELECT 1
        FROM (SELECT j.endpoint_id FROM outbox.jobs j WHERE j.event_id = e.id
              UNION ALL
              SELECT d.endpoint_id FROM outbox.deliveries d WHERE d.event_id = e.id) AS sent
        JOIN outbox.endpoints ep ON ep.id = sent.endpoint_id AND ep.owner_id = $11::bigint
        JOIN outbox.owners ow ON ow.id = ep.owner_id
        WHERE outbox.owner_admits(e.owner, e.topic, ow.key, ow.allowed_topics, ow.shared_topics)))
  AND ($6::timestamptz IS NULL OR created_at >= $6::timestamptz)
  AND ($7::timestamptz IS NULL OR created_at < $7::timestamptz)
  AND ($8 = ''
       OR ($8 = 'delivered' AND o.jobs > 0 AND o.completed = o.jobs)
       OR ($8 = 'failed' AND o.discarded > 0)
       OR ($8 = 'pending'
           AND ((fanned_out_at IS NULL AND poisoned_at IS NULL) OR o.completed + o.discarded < o.jobs)))`

// listEventsOlderSQL reads the stream newest first from below $1; the
// primary key serves the order and the page bound.
const listEventsOlderSQL = listEventsSelectSQL + `
ORDER BY id DESC
LIMIT $9`

// listEventsNewerSQL reads the stream oldest first from above $2: the page
// just newer than $2, which listEventPage turns newest first.
const listEventsNewerSQL = listEventsSelectSQL + `
ORDER BY id ASC
LIMIT $9`

// eventPage is one page of the stream, newest first, and whether the
// filter selects events older and newer than it.
type eventPage struct {
	events       []Event
	older, newer bool
}

// listEventPage reads the page of the stream f selects: below f.Before
// (or from the newest), or just above f.After. It reads one row past the
// page to know whether more lie that way, and probes one row the other way.
func listEventPage(ctx context.Context, db *sql.DB, f EventFilter) (eventPage, error) {
	var pg eventPage
	if err := f.validate(); err != nil {
		return pg, err
	}
	newer := f.After != 0
	events, err := listEvents(ctx, db, f, f.Limit+1)
	if err != nil {
		return pg, err
	}
	more := len(events) > f.Limit
	events = events[:min(len(events), f.Limit)]
	if newer {
		slices.Reverse(events)
	}
	pg.events = events

	// The other way: beyond the page's far edge, or, on an empty page,
	// beyond the cursor it was asked from.
	probe := f
	probe.Before, probe.After = 0, 0
	switch {
	case newer && len(events) > 0:
		probe.Before = events[len(events)-1].ID
	case newer:
		probe.Before = f.After + 1
	case f.Before == 0:
		pg.older = more // the newest page: nothing is newer
		return pg, nil
	case len(events) > 0:
		probe.After = events[0].ID
	default:
		probe.After = f.Before - 1
	}
	beyond, err := listEvents(ctx, db, probe, 1)
	if err != nil {
		return pg, err
	}
	if newer {
		pg.newer, pg.older = more, len(beyond) > 0
	} else {
		pg.older, pg.newer = more, len(beyond) > 0
	}
	return pg, nil
}

// listEvents reads up to limit events f selects, newest first from
// f.Before, or oldest first from f.After.
func listEvents(ctx context.Context, db *sql.DB, f EventFilter, limit int) ([]Event, error) {
	query := listEventsOlderSQL
	if f.After != 0 {
		query = listEventsNewerSQL
	}
	events, err := queryAll(ctx, db, scanEvent, query, f.args(limit)...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return events, nil
}

// args are the listing queries' parameters for f, reading up to limit
// events.
func (f EventFilter) args(limit int) []any {
	return []any{f.Before, f.After, f.Topic, f.Subject, f.State,
		nullTime(f.Since), nullTime(f.Until), f.Outcome, limit, nullText(f.Payload), f.Owner}
}

// nullText is s as a query parameter: NULL when empty.
func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// nullTime is t as a query parameter: NULL when zero.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
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

// EventOutcome is where an event went: its jobs that completed, that were
// discarded, and that still wait or run. The job cleaner deletes finished
// jobs (completed after a day, discarded after a week), so an old event
// may count none: its jobs finished and are gone.
type EventOutcome struct {
	Jobs      int `json:"jobs"`
	Completed int `json:"completed"`
	Discarded int `json:"discarded"`
	Pending   int `json:"pending"` // available, running or retryable
}
