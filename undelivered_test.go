// undelivered_test.go: what the rolling-upgrade tests log when an event
// they recorded was not delivered in time, so that a failure tells a slow
// delivery from a lost one.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"
)

// undeliveredEventSQL is the relay's side of one event: fanned out or
// poisoned, and after how many relay attempts.
const undeliveredEventSQL = `
SELECT topic, subject, created_at, fanned_out_at, poisoned_at, relay_attempts, coalesce(relay_error, ''),
       round(extract(epoch FROM clock_timestamp() - created_at)::numeric, 3)
FROM outbox.events WHERE id = $1`

// undeliveredJobsSQL is the workers' side: each job of the event, with the
// replica that last claimed it and whether that replica is still listed.
const undeliveredJobsSQL = `
SELECT j.id, j.kind, j.state::text, j.attempt, j.max_attempts, j.scheduled_at, j.attempted_at, j.finalized_at,
       j.held_by, coalesce(r.version || ' on ' || r.host || ' pid ' || r.pid || ', last seen ' || r.last_seen::text, 'not listed'),
       j.errors::text, j.endpoint_id
FROM outbox.jobs AS j LEFT JOIN outbox.replicas AS r ON r.id = j.held_by
WHERE j.event_id = $1 ORDER BY j.id`

// describeUndelivered writes, for each event of ids the receiver did not
// get (received says whether it did, view what it saw of the event), the
// event's row, its jobs and the receiver's view. At most limit events are
// described; the rest are counted.
func describeUndelivered(t *testing.T, db *sql.DB, ids []int64, received func(int64) bool, view func(int64) string, limit int) {
	t.Helper()
	var missing []int64
	for _, id := range ids {
		if !received(id) {
			missing = append(missing, id)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d events undelivered at %s", len(missing), len(ids), time.Now().UTC().Format(time.RFC3339Nano))
	for i, id := range missing {
		if i == limit {
			fmt.Fprintf(&b, "\n(%d more not described)", len(missing)-limit)
			break
		}
		fmt.Fprintf(&b, "\nevent %d: %s", id, describeEvent(db, id))
		for _, j := range describeJobs(db, id) {
			fmt.Fprintf(&b, "\n  job %s", j)
		}
		fmt.Fprintf(&b, "\n  receiver: %s", view(id))
	}
	fmt.Fprintf(&b, "\nreplicas listed: %s", describeRows(db, "replicas",
		`SELECT id || ' ' || version || ' pid ' || pid || ' last seen ' || last_seen::text FROM outbox.replicas ORDER BY id`))
	// An event fanned out before an endpoint's creation, by the relay's
	// clock, goes to no endpoint: the endpoints' times tell.
	fmt.Fprintf(&b, "\nendpoints: %s", describeRows(db, "endpoints",
		`SELECT id || ' topics ' || topics::text || ' created ' || created_at::text || ' disabled ' || coalesce(disabled_at::text, 'no')
FROM outbox.endpoints ORDER BY id LIMIT 10`))
	t.Log(b.String())
}

func describeEvent(db *sql.DB, id int64) string {
	var topic, subject, relayError string
	var created time.Time
	var fanned, poisoned sql.NullTime
	var attempts int
	var age string
	err := db.QueryRowContext(context.Background(), undeliveredEventSQL, id).
		Scan(&topic, &subject, &created, &fanned, &poisoned, &attempts, &relayError, &age)
	if err != nil {
		return fmt.Sprintf("reading the event: %v", err)
	}
	return fmt.Sprintf("topic %s subject %s created %s (%ss ago) fanned_out_at %s poisoned_at %s relay_attempts %d relay_error %q",
		topic, subject, created.UTC().Format(time.RFC3339Nano), age, shownTime(fanned), shownTime(poisoned), attempts, relayError)
}

func describeJobs(db *sql.DB, eventID int64) []string {
	rows, err := db.QueryContext(context.Background(), undeliveredJobsSQL, eventID)
	if err != nil {
		return []string{fmt.Sprintf("reading the jobs: %v", err)}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id int64
		var kind, state, holder, errs string
		var attempt, maxAttempts int
		var scheduled time.Time
		var attempted, finalized sql.NullTime
		var heldBy, endpoint sql.NullInt64
		if err := rows.Scan(&id, &kind, &state, &attempt, &maxAttempts, &scheduled, &attempted, &finalized,
			&heldBy, &holder, &errs, &endpoint); err != nil {
			return append(out, fmt.Sprintf("reading a job: %v", err))
		}
		out = append(out, fmt.Sprintf("%d kind %s endpoint %v state %s attempt %d/%d scheduled_at %s attempted_at %s finalized_at %s held_by %v (%s) errors %s",
			id, kind, shownInt(endpoint), state, attempt, maxAttempts, scheduled.UTC().Format(time.RFC3339Nano),
			shownTime(attempted), shownTime(finalized), shownInt(heldBy), holder, errs))
	}
	if err := rows.Err(); err != nil {
		out = append(out, fmt.Sprintf("reading the jobs: %v", err))
	}
	if len(out) == 0 {
		out = append(out, "none")
	}
	return out
}

// describeRows joins the one text column query returns, or says why it
// could not read what.
func describeRows(db *sql.DB, what, query string) string {
	rows, err := db.QueryContext(context.Background(), query)
	if err != nil {
		return fmt.Sprintf("reading the %s: %v", what, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return fmt.Sprintf("reading the %s: %v", what, err)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

func shownTime(t sql.NullTime) string {
	if !t.Valid {
		return "null"
	}
	return t.Time.UTC().Format(time.RFC3339Nano)
}

func shownInt(n sql.NullInt64) string {
	if !n.Valid {
		return "null"
	}
	return fmt.Sprint(n.Int64)
}
