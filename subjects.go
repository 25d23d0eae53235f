// subjects.go: the subject index, the latest event of every subject and
// topic, which the relay keeps in its fan-out, and its search.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

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
// natural order, after ($2, $3): a subject's trailing number sorts by its
// value (1, 2, 10, 100; order-2 before order-10), which is the text before
// it, then the subject's length, then the text. $5 picks outboxd's own
// topics (true) or the user's (false), so that an internal event about
// endpoint 1 is never listed beside order 1. The prefix arrives with
// LIKE's wildcards escaped, the internal prefix with them too.
const listSubjectsSQL = `
SELECT subject, topic, last_event_id, payload, updated_at
FROM outbox.subjects
WHERE subject LIKE $1
  AND (topic LIKE $6) = $5
  AND (regexp_replace(subject, '[0-9]+$', ''), length(subject), subject, topic)
    > (regexp_replace($2, '[0-9]+$', ''), length($2), $2, $3)
ORDER BY regexp_replace(subject, '[0-9]+$', ''), length(subject), subject, topic
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

// listSubjects reads up to limit of the user's subjects starting with
// prefix, after the cursor after (the zero cursor from the first).
func listSubjects(ctx context.Context, db *sql.DB, prefix string, after subjectCursor, limit int) ([]SubjectEntry, error) {
	return querySubjects(ctx, db, prefix, false, after, limit)
}

// listInternalSubjects is listSubjects over outboxd's own topics.
func listInternalSubjects(ctx context.Context, db *sql.DB, prefix string, after subjectCursor, limit int) ([]SubjectEntry, error) {
	return querySubjects(ctx, db, prefix, true, after, limit)
}

func querySubjects(ctx context.Context, db *sql.DB, prefix string, internal bool, after subjectCursor, limit int) ([]SubjectEntry, error) {
	if len(prefix) > maxSubjectLen {
		return nil, fmt.Errorf("%w: prefix is %d bytes, at most %d", errInvalid, len(prefix), maxSubjectLen)
	}
	if limit <= 0 || limit > maxSubjectPage {
		limit = maxSubjectPage
	}
	entries, err := queryAll(ctx, db, scanSubjectEntry, listSubjectsSQL,
		likePrefix(prefix), after.Subject, after.Topic, limit, internal, likePrefix(internalTopicPrefix))
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
