// topics.go: the event catalog (docs/catalog.md): topics registered with
// a description and an example payload, listed to the admin and to
// owners (the topics their endpoints may receive), and test sends: a
// topic's example delivered to one endpoint by the workers, as any
// delivery is, and left out of the statistics and of replays.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// Topic is one row of outbox.topics: a topic the admin registered, what
// its events mean and what one looks like.
type Topic struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Example     json.RawMessage `json:"example"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
}

// Bounds of the catalog. A catalog documents the topics of one
// application: a thousand is more than any has, and keeps the table and
// the pages that list it whole small. An example shows one event's shape:
// 64 KiB holds any real one (schema.sql, topics_example_size, is the last
// word); a description is a paragraph (topics_description_length).
const (
	maxTopics                 = 1000
	maxTopicExampleLen        = 64 << 10
	maxTopicDescriptionLen    = 2000
	topicNotRegisteredMessage = "is not a registered topic this endpoint may receive (GET /api/topics lists them)"
)

// topicInput is the body of POST /api/topics and PATCH /api/topics/{name}
// (which takes no name: the name is the topic). Example is nil when the
// body left it out and the JSON text null when it gave null, an example
// like any other.
type topicInput struct {
	Name        *string         `json:"name"`
	Description *string         `json:"description"`
	Example     json.RawMessage `json:"example"`
}

// topicPatch is the body of PATCH /api/topics/{name}.
type topicPatch struct {
	Description *string         `json:"description"`
	Example     json.RawMessage `json:"example"`
}

// validate checks every field given; creating, name and example are
// required.
func (in topicInput) validate(creating bool) error {
	switch {
	case creating && in.Name == nil:
		return fmt.Errorf(`%w: "name" is required`, errInvalid)
	case in.Name != nil && !topicPattern.MatchString(*in.Name):
		return fmt.Errorf("%w: name %q must be 1-200 characters of letters, digits and _ . : / - (not starting with a symbol), as an event's topic", errInvalid, *in.Name)
	case creating && in.Example == nil:
		return fmt.Errorf(`%w: "example" is required: any JSON value, the data of a test send`, errInvalid)
	case len(in.Example) > maxTopicExampleLen:
		return fmt.Errorf("%w: example is %d bytes, at most %d", errInvalid, len(in.Example), maxTopicExampleLen)
	}
	if d := in.Description; d != nil {
		if len(*d) > maxTopicDescriptionLen {
			return fmt.Errorf("%w: description is %d bytes, at most %d", errInvalid, len(*d), maxTopicDescriptionLen)
		}
		if !isText(*d) {
			return fmt.Errorf("%w: description must be UTF-8 text without NUL", errInvalid)
		}
	}
	return nil
}

// compactExample is an example as stored: the JSON value without the
// whitespace its sender laid it out with; nil stays nil (not given).
func compactExample(raw json.RawMessage) (json.RawMessage, error) {
	if raw == nil {
		return nil, nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, fmt.Errorf("%w: example is not valid JSON", errInvalid)
	}
	return buf.Bytes(), nil
}

const topicColumns = `t.name, t.description, t.example, t.created_at, t.updated_at`

func scanTopic(row rowScanner) (Topic, error) {
	var t Topic
	var example []byte
	err := row.Scan(&t.Name, &t.Description, &example, &t.CreatedAt, &t.UpdatedAt)
	t.Example = example
	return t, err
}

// topicReceivableSQL says whether the endpoint owner o (a NULL row: an
// endpoint of no owner, which may receive every topic) may receive
// topic t, as the fan-out's boundary decides (outbox.owner_admits): its
// own events of that topic, or those of no owner shared with it.
const topicReceivableSQL = `(o.id IS NULL
       OR outbox.owner_admits(o.key, t.name, o.key, o.allowed_topics, o.shared_topics)
       OR outbox.owner_admits(NULL, t.name, o.key, o.allowed_topics, o.shared_topics))`

// listTopicsSQL lists the catalog by name; with $1 an owner's id, only
// the topics its endpoints may receive.
const listTopicsSQL = `
SELECT ` + topicColumns + `
FROM outbox.topics AS t
LEFT JOIN outbox.owners AS o ON o.id = $1
WHERE ` + topicReceivableSQL + `
ORDER BY t.name
LIMIT $2`

// listTopics lists the catalog, or with ownerID the topics that owner's
// endpoints may receive: what it may subscribe them to and test them
// with.
func listTopics(ctx context.Context, db *sql.DB, ownerID *int64) ([]Topic, error) {
	topics, err := queryAll(ctx, db, scanTopic, listTopicsSQL, ownerID, maxTopics)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	return topics, nil
}

// listTopicsFor is listTopics as the request's principal may see it:
// the whole catalog for the admin, an owner its own topics.
func listTopicsFor(ctx context.Context, db *sql.DB) ([]Topic, error) {
	who := principalIn(ctx)
	if !who.admin && who.owner == nil {
		return []Topic{}, nil
	}
	return listTopics(ctx, db, who.ownerID())
}

const getTopicSQL = `SELECT ` + topicColumns + ` FROM outbox.topics AS t WHERE t.name = $1`

func getTopic(ctx context.Context, db *sql.DB, name string) (Topic, error) {
	t, err := scanTopic(db.QueryRowContext(ctx, getTopicSQL, name))
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("topic %q: %w", name, errNotFound)
	}
	if err != nil {
		return t, fmt.Errorf("get topic %q: %w", name, err)
	}
	return t, nil
}

// createTopicSQL registers a topic while the catalog has room: no row
// when it is full. Two creates racing past the count may make it 1,001;
// the bound is on growth, not exact.
const createTopicSQL = `
INSERT INTO outbox.topics AS t (name, description, example)
SELECT $1, $2, $3::jsonb
WHERE (SELECT count(*) FROM outbox.topics) < $4
RETURNING ` + topicColumns

// createTopic registers in, answered as stored; a name registered before
// is a 409, a full catalog a 400.
func createTopic(ctx context.Context, db *sql.DB, in topicInput) (Topic, error) {
	if err := in.validate(true); err != nil {
		return Topic{}, err
	}
	example, err := compactExample(in.Example)
	if err != nil {
		return Topic{}, err
	}
	t, err := scanTopic(db.QueryRowContext(ctx, createTopicSQL, *in.Name, deref(in.Description), string(example), maxTopics))
	switch {
	case pq.As(err, pqerror.UniqueViolation) != nil:
		return t, &httpError{status: http.StatusConflict,
			text: fmt.Sprintf("name: topic %q is registered already; PATCH /api/topics/%s changes it", *in.Name, *in.Name)}
	case errors.Is(err, sql.ErrNoRows):
		return t, fmt.Errorf("%w: name: the catalog holds %d topics, its most; delete one first", errInvalid, maxTopics)
	case err != nil:
		return t, fmt.Errorf("create topic: %w", &fieldError{field: "example", err: err})
	}
	return t, nil
}

// updateTopicSQL changes the fields given ($2, $3 NULL: unchanged).
const updateTopicSQL = `
UPDATE outbox.topics AS t
SET description = coalesce($2, t.description),
    example = coalesce($3::jsonb, t.example),
    updated_at = now()
WHERE t.name = $1
RETURNING ` + topicColumns

func updateTopic(ctx context.Context, db *sql.DB, name string, in topicPatch) (Topic, error) {
	if err := (topicInput{Description: in.Description, Example: in.Example}).validate(false); err != nil {
		return Topic{}, err
	}
	example, err := compactExample(in.Example)
	if err != nil {
		return Topic{}, err
	}
	var exampleArg sql.NullString
	if example != nil {
		exampleArg = sql.NullString{String: string(example), Valid: true}
	}
	t, err := scanTopic(db.QueryRowContext(ctx, updateTopicSQL, name, in.Description, exampleArg))
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("topic %q: %w", name, errNotFound)
	}
	if err != nil {
		return t, fmt.Errorf("update topic %q: %w", name, &fieldError{field: "example", err: err})
	}
	return t, nil
}

const deleteTopicSQL = `DELETE FROM outbox.topics WHERE name = $1`

// deleteTopic takes a topic out of the catalog. Its events and the
// endpoints that subscribe to it are as they were: the catalog documents
// topics, it does not decide them.
func deleteTopic(ctx context.Context, db *sql.DB, name string) error {
	res, err := db.ExecContext(ctx, deleteTopicSQL, name)
	if err != nil {
		return fmt.Errorf("delete topic %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("topic %q: %w", name, errNotFound)
	}
	return nil
}

// TestSend is what POST /api/endpoints/{id}/test answers: the event a
// test send recorded and the job that delivers it, for the endpoint's
// attempts and GET /api/endpoints/{id}/events/{event_id} to find.
type TestSend struct {
	EndpointID int64  `json:"endpoint_id"`
	Topic      string `json:"topic"`
	EventID    int64  `json:"event_id"`
	JobID      int64  `json:"job_id"`
}

// testTargetSQL reads what a test send of topic $2 to endpoint $1 needs,
// locking the endpoint as a job's reference does: whether it is
// disabled, the topic's example if the endpoint may receive it (NULL:
// not registered, or not the owner's), and the owner the event is
// addressed to: the endpoint's owner when its own events of the topic
// reach it, else none (a topic shared with it), so that the owner's
// pages show it the event its endpoint was sent (owner_admits).
const testTargetSQL = `
SELECT ep.disabled_at IS NOT NULL, t.example,
       CASE WHEN outbox.owner_admits(o.key, $2, o.key, o.allowed_topics, o.shared_topics) THEN o.key END
FROM outbox.endpoints AS ep
LEFT JOIN outbox.owners AS o ON o.id = ep.owner_id
LEFT JOIN outbox.topics AS t ON t.name = $2 AND ` + topicReceivableSQL + `
WHERE ep.id = $1
FOR KEY SHARE OF ep`

// recordTestEventSQL records a test send's event: marked test, fanned
// out already (the relay never claims it: it goes to one endpoint, not to
// every subscriber), with no subject.
const recordTestEventSQL = `
INSERT INTO outbox.events (topic, subject, payload, owner, committed_at, fanned_out_at, test)
VALUES ($1, '', $2::jsonb, $3, now(), now(), true)
RETURNING id`

// enqueueTestSQL is the test send's delivery: a webhook job like any
// other, live (no replay), in no ordered lane, marked test.
const enqueueTestSQL = `
INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, test)
VALUES ('webhook', $1, $2, $3, true)
RETURNING id`

// sendTest records topic's example as a test event for endpoint id and
// enqueues its delivery, in one transaction. The workers deliver it as
// any delivery: signed, its attempts in the history, retried up to
// maxAttempts; record_outcomes (schema.sql) leaves them out of the
// statistics, and replays pass its event by.
func sendTest(ctx context.Context, db *sql.DB, id int64, topic string, maxAttempts int) (TestSend, error) {
	send := TestSend{EndpointID: id, Topic: topic}
	if !topicPattern.MatchString(topic) {
		return send, fmt.Errorf("%w: topic %q %s", errInvalid, topic, topicNotRegisteredMessage)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return send, fmt.Errorf("send test: %w", err)
	}
	defer tx.Rollback()
	var disabled bool
	var example []byte
	var owner sql.NullString
	err = tx.QueryRowContext(ctx, testTargetSQL, id, topic).Scan(&disabled, &example, &owner)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return send, fmt.Errorf("endpoint %d: %w", id, errNotFound)
	case err != nil:
		return send, fmt.Errorf("send test: %w", err)
	case example == nil:
		return send, fmt.Errorf("%w: topic %q %s", errInvalid, topic, topicNotRegisteredMessage)
	case disabled:
		return send, &httpError{status: http.StatusConflict,
			text: fmt.Sprintf("endpoint %d is disabled: enable it to send it a test", id)}
	}
	if err := tx.QueryRowContext(ctx, recordTestEventSQL, topic, string(example), owner).Scan(&send.EventID); err != nil {
		return send, fmt.Errorf("send test: record event: %w", err)
	}
	if err := tx.QueryRowContext(ctx, enqueueTestSQL, send.EventID, id, maxAttempts).Scan(&send.JobID); err != nil {
		return send, fmt.Errorf("send test: enqueue: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return send, fmt.Errorf("send test: %w", err)
	}
	return send, nil
}

// handleListTopics is GET /api/topics: the catalog, or for an owner the
// topics its endpoints may receive.
func handleListTopics(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		topics, err := listTopicsFor(r.Context(), a.db)
		return http.StatusOK, map[string][]Topic{"topics": topics}, err
	}
}

// handleCreateTopic is POST /api/topics {"name", "description",
// "example"}: the topic, answered 201.
func handleCreateTopic(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		var in topicInput
		if err := decodeJSON(r, &in); err != nil {
			return 0, nil, err
		}
		t, err := createTopic(r.Context(), a.db, in)
		return http.StatusCreated, t, err
	}
}

// handleGetTopic is GET /api/topics/{name}.
func handleGetTopic(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		name, err := pathText(r, "name")
		if err != nil {
			return 0, nil, err
		}
		t, err := getTopic(r.Context(), a.db, name)
		return http.StatusOK, t, err
	}
}

// handleUpdateTopic is PATCH /api/topics/{name} {"description",
// "example"}: the topic as changed.
func handleUpdateTopic(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		name, err := pathText(r, "name")
		if err != nil {
			return 0, nil, err
		}
		var in topicPatch
		if err := decodeJSON(r, &in); err != nil {
			return 0, nil, err
		}
		t, err := updateTopic(r.Context(), a.db, name, in)
		return http.StatusOK, t, err
	}
}

// handleDeleteTopic is DELETE /api/topics/{name}, answered 204.
func handleDeleteTopic(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		name, err := pathText(r, "name")
		if err != nil {
			return 0, nil, err
		}
		return http.StatusNoContent, nil, deleteTopic(r.Context(), a.db, name)
	}
}

// handleTestEndpoint is POST /api/endpoints/{id}/test {"topic"}: one
// test send of the topic's example, answered 202 once enqueued.
func handleTestEndpoint(a *admin) apiFunc {
	type request struct {
		Topic *string `json:"topic"`
	}
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		var in request
		if err := decodeJSON(r, &in); err != nil {
			return 0, nil, err
		}
		if in.Topic == nil {
			return 0, nil, fmt.Errorf(`%w: "topic" is required: a registered topic, whose example is sent`, errInvalid)
		}
		send, err := sendTest(r.Context(), a.db, id, *in.Topic, a.maxAttempts)
		return http.StatusAccepted, send, err
	}
}
