// relay_endpoints_test.go: the fan-out sees every endpoint created before
// an event it relays.

package main

import (
	"context"
	"database/sql"
	"testing"
	"time"
)

// An endpoint created, and then an event recorded, both committed while a
// relay pass was already under way: the pass that relays the event gives
// the endpoint its delivery. The pass is held where it claims events (a
// lock queued on outbox.events ahead of its claim) while the endpoint and
// then the event commit. Before the fix, the pass read the endpoints as
// they were when its statement began, before the endpoint existed, and
// claimed the event later: the event was marked fanned out with no job,
// never to be delivered (a rolling upgrade lost the first event recorded
// after its endpoint was created this way). Both passes: the batch, and
// the row-by-row retry of one event.
func TestFanOutSeesEndpointsCreatedBeforeTheEventsItClaims(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		pass func(ctx context.Context, r *relay, eventID int64) (fanned, jobs int, err error)
	}{
		{"batch", func(ctx context.Context, r *relay, _ int64) (int, int, error) { return r.fanOut(ctx, 0) }},
		{"one event", func(ctx context.Context, r *relay, id int64) (int, int, error) { return r.fanOut(ctx, id) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			ctx := context.Background()
			r := newTestRelay(t, db, defaultConfig().Relay)

			// The event, recorded and not committed yet.
			producer, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer producer.Rollback()
			eventID, err := recordEvent(ctx, producer, "t", "after-endpoint", nil)
			if err != nil {
				t.Fatal(err)
			}
			// A lock on outbox.events that waits for the producer, and
			// that the pass's claim queues behind.
			blocker, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Rollback()
			locked := make(chan error, 1)
			go func() {
				_, err := blocker.ExecContext(ctx, `LOCK TABLE outbox.events IN EXCLUSIVE MODE`)
				locked <- err
			}()
			awaitLockWait(t, db, "ExclusiveLock")

			type passDone struct {
				fanned, jobs int
				err          error
			}
			done := make(chan passDone, 1)
			go func() {
				fanned, jobs, err := c.pass(ctx, r, eventID)
				done <- passDone{fanned, jobs, err}
			}()
			awaitLockWait(t, db, "RowShareLock") // the pass, at its claim

			var endpointID int64
			if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, topics) VALUES ('https://receiver.example/hook', $1, '{t}') RETURNING id`,
				make([]byte, 32)).Scan(&endpointID); err != nil {
				t.Fatal(err)
			}
			if err := producer.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-locked; err != nil {
				t.Fatal(err)
			}
			if err := blocker.Commit(); err != nil {
				t.Fatal(err)
			}
			var got passDone
			select {
			case got = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the pass did not end within 30s of the lock's release")
			}
			if got.err != nil || got.fanned != 1 {
				t.Fatalf("the pass fanned out %d events into %d jobs (%v), want the event recorded after the endpoint", got.fanned, got.jobs, got.err)
			}
			if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1 AND endpoint_id = $2`, eventID, endpointID); n != 1 || got.jobs != 1 {
				t.Errorf("the event recorded after endpoint %d was created got %d deliveries to it (the pass enqueued %d jobs), want 1",
					endpointID, n, got.jobs)
			}
		})
	}
}

// awaitLockWait waits until a session of db waits for a lock of mode on
// outbox.events.
func awaitLockWait(t *testing.T, db *sql.DB, mode string) {
	t.Helper()
	waitFor(t, "a session waiting for "+mode+" on outbox.events", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_locks
WHERE NOT granted AND mode = $1 AND relation = 'outbox.events'::regclass AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, mode) > 0
	})
}
