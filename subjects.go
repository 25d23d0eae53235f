// subjects.go: the subject index, the one built-in in-process subscriber,
// which keeps the latest event of every subject, and its search.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/lib/pq"
)

// upsertSubjectsSQL keeps the latest event of each topic and subject of a
// batch of events ($1, their ids), read from the events table. The WHERE
// on the conflict makes it monotonic: an event with a lower id than the
// one kept (delivered late, or the same event delivered again) changes
// nothing. Of several events of one topic and subject in the batch, the
// highest id is the one written, as if each had been upserted in turn.
const upsertSubjectsSQL = `
INSERT INTO outbox.subjects (subject, topic, last_event_id, payload, updated_at)
SELECT DISTINCT ON (e.subject, e.topic) e.subject, e.topic, e.id, e.payload, now()
FROM outbox.events AS e
WHERE e.id = ANY($1::bigint[])
  AND e.subject <> ''
ORDER BY e.subject, e.topic, e.id DESC
ON CONFLICT (subject, topic) DO UPDATE
SET last_event_id = EXCLUDED.last_event_id,
    payload = EXCLUDED.payload,
    updated_at = EXCLUDED.updated_at
WHERE subjects.last_event_id < EXCLUDED.last_event_id`

// indexSubjects upserts the subjects of evs; events without a subject are
// not indexed.
func indexSubjects(ctx context.Context, tx *sql.Tx, evs []Event) error {
	ids := make([]int64, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	if _, err := tx.ExecContext(ctx, upsertSubjectsSQL, pq.Array(ids)); err != nil {
		return fmt.Errorf("index subjects: %w", err)
	}
	return nil
}

// subjectIndexSubscriber indexes every event with a subject. It coalesces:
// of the events one relay pass claims for a subject, only the latest is
// delivered, since it would overwrite the others anyway.
func subjectIndexSubscriber() Subscriber {
	return Subscriber{
		Name:     "subjects",
		Coalesce: true,
		Handle: func(ctx context.Context, tx *sql.Tx, ev Event) error {
			return indexSubjects(ctx, tx, []Event{ev})
		},
		HandleBatch: indexSubjects,
	}
}

// SubjectEntry is one row of the subject index.
type SubjectEntry struct {
	Subject     string          `json:"subject"`
	Topic       string          `json:"topic"`
	LastEventID int64           `json:"last_event_id"`
	Payload     json.RawMessage `json:"payload"`
	UpdatedAt   time.Time       `json:"updated_at"`
}

// maxSubjectPage bounds one page of the subject search.
const maxSubjectPage = 200

// listSubjectsSQL is a page of subjects starting with a prefix, in
// (subject, topic) order, after ($2, $3). The prefix arrives with LIKE's
// wildcards escaped.
const listSubjectsSQL = `
SELECT subject, topic, last_event_id, payload, updated_at
FROM outbox.subjects
WHERE subject LIKE $1
  AND (subject, topic) > ($2, $3)
ORDER BY subject, topic
LIMIT $4`

// subjectCursor is where a page of the subject index starts: after this
// subject of this topic. The zero cursor is the first page.
type subjectCursor struct {
	Subject, Topic string
}

// cursorAfter is the cursor of the page after entries.
func cursorAfter(entries []SubjectEntry) subjectCursor {
	last := entries[len(entries)-1]
	return subjectCursor{Subject: last.Subject, Topic: last.Topic}
}

// likePrefix is a LIKE pattern matching every text that starts with p.
func likePrefix(p string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(p) + "%"
}

// listSubjects reads up to limit subjects starting with prefix, after the
// cursor after (the zero cursor from the first).
func listSubjects(ctx context.Context, db *sql.DB, prefix string, after subjectCursor, limit int) ([]SubjectEntry, error) {
	if len(prefix) > maxSubjectLen {
		return nil, fmt.Errorf("%w: prefix is %d bytes, at most %d", errInvalid, len(prefix), maxSubjectLen)
	}
	if limit <= 0 || limit > maxSubjectPage {
		limit = maxSubjectPage
	}
	entries, err := queryAll(ctx, db, scanSubjectEntry, listSubjectsSQL, likePrefix(prefix), after.Subject, after.Topic, limit)
	if err != nil {
		return nil, fmt.Errorf("list subjects: %w", err)
	}
	return entries, nil
}

func scanSubjectEntry(row rowScanner) (SubjectEntry, error) {
	var e SubjectEntry
	var payload []byte
	err := row.Scan(&e.Subject, &e.Topic, &e.LastEventID, &payload, &e.UpdatedAt)
	e.Payload = payload
	return e, err
}
