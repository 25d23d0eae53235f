// latency_test.go: the time from an event's commit to its first 2xx
// starts at the commit (or, where PostgreSQL does not tell when that was,
// at the insert), never at the start of the producer's transaction.

package main

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"testing"
	"time"
)

// commitTimestampDB is a migrated database on a private cluster, which
// devdb.go starts with track_commit_timestamp on: the shared test server
// may have it off, and the setting takes a restart.
func commitTimestampDB(t *testing.T) *sql.DB {
	t.Helper()
	ctx := context.Background()
	// Not t.TempDir: its path, with the test's name, can be too long for
	// the cluster's Unix socket.
	dir, err := os.MkdirTemp("", "oxd-ct-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c, err := startCluster(ctx, dir, slog.New(slog.NewTextHandler(io.Discard, nil)), "fsync=off", "full_page_writes=off")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	db, err := openDB(ctx, c.DSN("outboxd"), 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	var tracked string
	if err := db.QueryRow(`SHOW track_commit_timestamp`).Scan(&tracked); err != nil || tracked != "on" {
		t.Fatalf("track_commit_timestamp is %q (%v) on the private cluster, want on", tracked, err)
	}
	return db
}

// deliverTheEvent relays and delivers the one event recorded for
// endpoint ep and returns its time from commit to first 2xx, as /metrics
// observed it, and the lower bound of the delivery statistics' bucket it
// was counted in.
func deliverTheEvent(t *testing.T, db *sql.DB, ep int64) (observed, bucketFloor time.Duration) {
	t.Helper()
	relayAll(t, db)
	metrics := newDeliveryMetrics()
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	sender := newWebhookSender(db, nil, client, metrics, nil, testLogger(t))
	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: sender.deliver}, testLogger(t))
	if n, err := wp.workOnce(context.Background(), 10); err != nil || n != 1 {
		t.Fatalf("workOnce: %d jobs, %v; want the one delivery", n, err)
	}
	h := metrics.commitTo2xx.With(itoa(ep))
	if n := h.count.Load(); n != 1 {
		t.Fatalf("%d observations of commit to first 2xx, want 1", n)
	}
	observed = time.Duration(math.Float64frombits(h.sumBits.Load()) * float64(time.Second))
	bucket := queryInt(t, db, `
		SELECT b.i
		FROM outbox.delivery_stats AS d, unnest(d.latency_buckets) WITH ORDINALITY AS b(n, i)
		WHERE d.endpoint_id = $1 AND b.n > 0`, ep)
	if bucket > 1 {
		bucketFloor = statsLatencyBounds[bucket-2]
	}
	return observed, bucketFloor
}

// The case: an event recorded, then 3 s of other work in the
// same transaction, then COMMIT. Measured from the commit (the relay keeps
// the commit timestamp of the event's transaction), its latency is at most
// the time since the COMMIT was sent; measured from the transaction's
// start it was 3 s more, in the "<= 5 s" bucket. And a relay failure or a
// requeue, which change the row before its fan-out, do not move its commit
// time to theirs.
func TestCommitToFirst2xxStartsAtTheCommit(t *testing.T) {
	t.Parallel()
	db := commitTimestampDB(t)
	ctx := context.Background()
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL+"/hook", "order.*")

	t.Run("recorded, then 3 s of work", func(t *testing.T) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := recordEvent(ctx, tx, "order.paid", "o-1", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `SELECT pg_sleep(3)`); err != nil {
			t.Fatal(err)
		}
		committing := time.Now()
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		observed, floor := deliverTheEvent(t, db, ep.ID)
		since := time.Since(committing)
		if observed > since {
			t.Errorf("commit to first 2xx observed as %v, more than the %v since the COMMIT was sent: counted from before the commit", observed, since)
		}
		if floor >= since {
			t.Errorf("counted in the delivery statistics' bucket above %v, more than the %v since the COMMIT was sent", floor, since)
		}
	})

	// Changes to the row before its fan-out, each as the row's first:
	// the commit time they keep is the recording's, between the moment
	// its COMMIT was sent and the moment it returned; a change by a
	// release that did not keep it leaves created_at, the insert's clock,
	// never the change's own commit.
	failure := func(t *testing.T, id int64) {
		if _, err := newTestRelay(t, db, defaultConfig().Relay).recordFailure(ctx, id, errors.New("injected")); err != nil {
			t.Fatal(err)
		}
	}
	requeue := func(t *testing.T, id int64) {
		if err := requeueEvent(ctx, db, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, id int64)
		exact  bool // the commit's time, not the insert's
	}{
		{"a relay failure, then a requeue", func(t *testing.T, id int64) { failure(t, id); requeue(t, id) }, true},
		{"a requeue", requeue, true},
		{"a relay failure recorded without committed_at", func(t *testing.T, id int64) {
			mustExec(t, db, `UPDATE outbox.events SET relay_attempts = 1, relay_error = 'injected' WHERE id = $1`, id)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			id, err := recordEvent(ctx, tx, "other.topic", "o-2", nil)
			if err != nil {
				t.Fatal(err)
			}
			committing := time.Now() // after the insert: the commit, not the insert
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			committed := time.Now()
			tc.change(t, id)
			relayAll(t, db)
			var kept, created time.Time
			if err := db.QueryRow(`SELECT committed_at, created_at FROM outbox.events WHERE id = $1`, id).Scan(&kept, &created); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.exact && (kept.Before(committing.Truncate(time.Microsecond)) || kept.After(committed)):
				t.Errorf("committed_at %v, want the recording's commit, between %v and %v", kept, committing, committed)
			case !tc.exact && !kept.Equal(created):
				t.Errorf("committed_at %v, want created_at %v", kept, created)
			}
		})
	}
}

// On any server, with track_commit_timestamp on or off: an event recorded
// after 3 s of other work in its transaction is measured from no earlier
// than its insert, where now(), the transaction's start, was 3 s before.
func TestCommitToFirst2xxStartsNoEarlierThanTheInsert(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL+"/hook", "order.*")

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_sleep(3)`); err != nil {
		t.Fatal(err)
	}
	recording := time.Now()
	if _, err := recordEvent(ctx, tx, "order.paid", "o-1", nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	observed, _ := deliverTheEvent(t, db, ep.ID)
	if since := time.Since(recording); observed > since {
		t.Errorf("commit to first 2xx observed as %v, more than the %v since the event was recorded: counted from the transaction's start", observed, since)
	}
}
