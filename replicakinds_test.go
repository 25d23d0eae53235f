// replicakinds_test.go: replicas that run different job kinds, each
// claiming only its own.

package main

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// startKindsReplica starts a replica whose workers (returned with it) run
// one in-process subscriber, sub, and no other kind: each event it
// handles leaves a row in effects, naming the subscriber and the replica.
// It runs no relay: the test fans out. Its workers look for due jobs
// every poll, and when a claim is worth making again.
func startKindsReplica(t *testing.T, dsn, name, sub string, poll time.Duration) (*rollingReplica, *workerPool) {
	t.Helper()
	db, err := openDB(context.Background(), dsn, 10)
	if err != nil {
		t.Fatal(err)
	}
	reg := newSubscriberRegistry()
	reg.Register(Subscriber{Name: sub, Handle: func(ctx context.Context, tx *sql.Tx, ev Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, ev.ID, sub, name)
		return err
	}})
	cfg := defaultConfig().Workers
	cfg.PollInterval = poll
	cfg.Concurrency = 4
	wp := newWorkerPool(db, cfg, 10*time.Second, reg, nil, testLogger(t).With("replica", name))
	ctx, cancel := context.WithCancel(context.Background())
	registry := newReplicaRegistry(db, defaultConfig().Replicas,
		replicaSelf{Host: "kinds-test", PID: os.Getpid(), Version: version, Workers: cfg.Concurrency},
		testLogger(t))
	if err := registry.register(ctx); err != nil {
		t.Fatal(err)
	}
	wp.replica = registry
	r := &rollingReplica{t: t, name: name, db: db, cancel: cancel, registry: registry}
	r.wg.Go(func() { wp.Run(ctx, nil) })
	r.wg.Go(func() { registry.Run(ctx) })
	t.Cleanup(r.stop)
	return r, wp
}

// Every way by which a job reaches a replica's workers takes only the
// kinds they run: a pass of its relay that claims due jobs for them, one
// that makes deliveries running for them, and their own claim. Replica
// A's workers run subscriber a alone: b's job, and deliveries to an
// endpoint, are not theirs.
func TestEveryClaimTakesOnlyTheKindsItsWorkersRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, dsn := newTestDB(t)
	mustExec(t, db, `CREATE TABLE effects (event_id bigint NOT NULL, subscriber text NOT NULL, replica text NOT NULL)`)
	mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret, topics)
		VALUES ('https://hooks.example.com/kinds', decode(repeat('ab', 32), 'hex'), '{kinds.hook}')`)
	// Due before anything A's relay makes: b's job, which a relay that
	// knows b (B's) made.
	record(t, db, "kinds.b", "0")
	if res, err := newTestRelay(t, db, defaultConfig().Relay, noopSubscriber("b")).relayOnce(ctx); err != nil || res.Jobs != 1 {
		t.Fatalf("B's relay pass: %+v, %v; want b's job", res, err)
	}
	// A's workers claim on their own only as they start (an hour's poll):
	// a pass finding them claiming leaves the claim to them
	// (claimer.reserve), and claims nothing for them.
	_, wp := startKindsReplica(t, dsn, "A", "a", time.Hour)
	waitFor(t, "A's workers' first claim", 5*time.Second, func() bool { return wp.claims.count.Load() > 0 })
	relay := newTestRelay(t, db, defaultConfig().Relay, noopSubscriber("a"))
	relay.workers = wp.claimer

	// A pass whose event only a subscribes to claims due jobs for the
	// workers (outbox.claim_due_jobs): a's, not b's older one.
	record(t, db, "kinds.a", "1")
	if res, err := relay.relayOnce(ctx); err != nil || res.Jobs != 1 || res.HandedOff != 1 {
		t.Errorf("a pass of a's event: %+v, %v; want its 1 job handed to the workers, and no other", res, err)
	}
	// A pass whose event an endpoint subscribes to makes no delivery
	// running for workers that do not send them (outbox.fan_out), and
	// claims a's job alone.
	hook := record(t, db, "kinds.hook", "2")
	if res, err := relay.relayOnce(ctx); err != nil || res.Jobs != 2 || res.HandedOff != 1 {
		t.Errorf("a pass of an endpoint's event: %+v, %v; want its 2 jobs, a's handed to the workers", res, err)
	}
	waitFor(t, "a's jobs", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'sub:a' AND state = 'completed'`) == 2
	})
	// The workers' own claim finds nothing of theirs due.
	if jobs, err := wp.claim(ctx, claimBatchMax); err != nil || len(jobs) != 0 {
		t.Errorf("A's claim took %d jobs (%v), want none: b's job and the delivery are not its kinds", len(jobs), err)
	}
	got := queryStrings(t, db, `SELECT format('%s %s at attempt %s', kind, state, attempt) FROM outbox.jobs
		WHERE kind = 'sub:b' OR event_id = $1 AND kind = 'webhook' ORDER BY id`, hook)
	if diff := cmp.Diff([]string{"sub:b available at attempt 0", "webhook available at attempt 0"}, got); diff != "" {
		t.Errorf("the jobs that are not A's (-want +got):\n%s", diff)
	}
}
