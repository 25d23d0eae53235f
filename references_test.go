// references_test.go: a job's event and endpoint, held by the foreign keys
// of schema.sql (jobs_event_id_fkey, jobs_endpoint_id_fkey), and its
// history, deleted with its event (events_delete_history).

package main

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/lib/pq"
)

// isForeignKeyViolation says whether err is PostgreSQL's 23503.
func isForeignKeyViolation(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && pqErr.Code == "23503"
}

const insertWebhookJobSQL = `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts) VALUES ('webhook', $1, $2, 18)`

// A job that names an event or an endpoint that does not exist is
// refused, inserted or changed, one row among good ones included; a job
// of no endpoint is not.
func TestJobNamingAMissingRowIsRefused(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	event := int64(queryInt(t, db, `SELECT outbox.record('refs', 'a', '{}')`))
	endpoint := insertEndpoint(t, db, "refs", 16, "")
	mustExec(t, db, insertWebhookJobSQL, event, endpoint)

	for name, insert := range map[string]func() error{
		"a missing event": func() error {
			_, err := db.Exec(insertWebhookJobSQL, event+1000, endpoint)
			return err
		},
		"a missing endpoint": func() error {
			_, err := db.Exec(insertWebhookJobSQL, event, endpoint+1000)
			return err
		},
		"one missing event among good rows": func() error {
			_, err := db.Exec(`INSERT INTO outbox.jobs (kind, event_id, max_attempts)
				SELECT 'sub:refs', e, 18 FROM unnest(ARRAY[$1::bigint, $1, $1 + 1000]) AS e`, event)
			return err
		},
		"an endpoint changed to a missing one": func() error {
			_, err := db.Exec(`UPDATE outbox.jobs SET endpoint_id = $1 WHERE endpoint_id = $2`, endpoint+1000, endpoint)
			return err
		},
	} {
		if err := insert(); !isForeignKeyViolation(err) {
			t.Errorf("a job naming %s: %v, want a foreign-key violation (23503)", name, err)
		}
	}
	if _, err := db.Exec(insertWebhookJobSQL, event, nil); err != nil {
		t.Errorf("a job of no endpoint: %v", err)
	}
}

// Deleting an endpoint keeps its jobs, naming no endpoint; deleting an
// event deletes its jobs, and what hangs on them.
func TestDeletionsCarryToTheJobs(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	event := int64(queryInt(t, db, `SELECT outbox.record('refs', 'a', '{}')`))
	other := int64(queryInt(t, db, `SELECT outbox.record('refs', 'b', '{}')`))
	endpoint := insertEndpoint(t, db, "refs", 16, "")
	mustExec(t, db, insertWebhookJobSQL, event, endpoint)
	mustExec(t, db, insertWebhookJobSQL, other, endpoint)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts) VALUES ('sub:refs', $1, 18)`, event)
	mustExec(t, db, `INSERT INTO outbox.deliveries (job_id, event_id, kind, endpoint_id, attempt, outcome, finished_at, duration_ms, status_code, error)
		SELECT id, event_id, kind, $2, 1, 'retryable', now(), 5, 500, 'failed' FROM outbox.jobs WHERE event_id = $1 AND endpoint_id = $2`, event, endpoint)

	mustExec(t, db, `DELETE FROM outbox.endpoints WHERE id = $1`, endpoint)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'webhook' AND endpoint_id IS NULL`); n != 2 {
		t.Errorf("%d webhook jobs left naming no endpoint after its deletion, want 2", n)
	}
	mustExec(t, db, `DELETE FROM outbox.events WHERE id = $1`, event)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1`, event); n != 0 {
		t.Errorf("%d jobs of the deleted event left, want 0", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1`, other); n != 1 {
		t.Errorf("%d jobs of the other event, want its 1", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries`); n != 0 {
		t.Errorf("%d attempts of the deleted event's job left, want 0", n)
	}
}

// Truncating the events alone is refused, the jobs' foreign key naming
// them; truncated with the jobs, they go.
func TestEventsAreNotTruncatedUnderTheirJobs(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	event := int64(queryInt(t, db, `SELECT outbox.record('refs', 'a', '{}')`))
	mustExec(t, db, insertWebhookJobSQL, event, nil)

	var pqErr *pq.Error
	if _, err := db.Exec(`TRUNCATE outbox.events`); !errors.As(err, &pqErr) || pqErr.Code != "0A000" {
		t.Errorf("TRUNCATE outbox.events under a job: %v, want refused (0A000)", err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 1 {
		t.Errorf("%d events after the refused truncation, want 1", n)
	}
	if _, err := db.Exec(`TRUNCATE outbox.events, outbox.jobs`); err != nil {
		t.Errorf("TRUNCATE outbox.events with its jobs: %v", err)
	}
}

// A deletion and a job insert naming the same row wait for each other as
// with a foreign key: an event deleted while a job for it is being
// inserted is deleted after the insert commits, with the job; a job
// inserted while its event is being deleted is refused once the deletion
// commits.
func TestDeletionAndJobInsertWaitForEachOther(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()

	event := int64(queryInt(t, db, `SELECT outbox.record('refs', 'a', '{}')`))
	inserting, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer inserting.Rollback()
	if _, err := inserting.Exec(insertWebhookJobSQL, event, nil); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() {
		_, err := db.Exec(`DELETE FROM outbox.events WHERE id = $1`, event)
		deleted <- err
	}()
	awaitStatementWaiting(t, db, "DELETE FROM outbox.events%")
	if err := inserting.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("the deletion after the insert committed: %v", err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1`, event); n != 0 {
		t.Errorf("%d jobs of the deleted event, want 0: the deletion ran after the insert committed", n)
	}

	event = int64(queryInt(t, db, `SELECT outbox.record('refs', 'b', '{}')`))
	deleting, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer deleting.Rollback()
	if _, err := deleting.Exec(`DELETE FROM outbox.events WHERE id = $1`, event); err != nil {
		t.Fatal(err)
	}
	inserted := make(chan error, 1)
	go func() {
		_, err := db.Exec(insertWebhookJobSQL, event, nil)
		inserted <- err
	}()
	awaitStatementWaiting(t, db, "INSERT INTO outbox.jobs%")
	if err := deleting.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-inserted; !isForeignKeyViolation(err) {
		t.Errorf("a job inserted while its event was being deleted: %v, want a foreign-key violation (23503)", err)
	}
}

// awaitStatementWaiting waits until a statement like pattern waits for a
// lock.
func awaitStatementWaiting(t *testing.T, db *sql.DB, pattern string) {
	t.Helper()
	waitFor(t, "a statement like "+pattern+" waiting for a lock", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, pattern) == 1
	})
}
