// replicakinds_test.go: replicas that run different job kinds, each
// claiming only its own, and the alert when a kind has no live runner.

package main

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// startKindsReplica starts a replica whose workers (returned with it) run
// one in-process subscriber, sub, and no other kind, and whose row names
// it: each event it handles leaves a row in effects, naming the
// subscriber and the replica. It runs no relay: the test fans out. Its
// workers look for due jobs every poll, and when a claim is worth making
// again.
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
		replicaSelf{Host: "kinds-test", PID: os.Getpid(), Version: version, Workers: cfg.Concurrency, Kinds: wp.kinds()},
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

// A replica's claim takes only the kinds its workers run. Replica A's
// workers run subscriber a alone: b's job, older than a's, and a
// delivery to an endpoint, are not theirs.
func TestTheClaimTakesOnlyTheKindsItsWorkersRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, dsn := newTestDB(t)
	mustExec(t, db, `CREATE TABLE effects (event_id bigint NOT NULL, subscriber text NOT NULL, replica text NOT NULL)`)
	mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret, topics)
		VALUES ('https://hooks.example.com/kinds', decode(repeat('ab', 32), 'hex'), '{kinds.hook}')`)
	a, b := noopSubscriber("a"), noopSubscriber("b")
	a.Topics, b.Topics = []string{"kinds.a"}, []string{"kinds.b"}
	relay := newTestRelay(t, db, defaultConfig().Relay, a, b)
	record(t, db, "kinds.b", "0")
	record(t, db, "kinds.a", "1")
	hook := record(t, db, "kinds.hook", "2")
	if res, err := relay.relayOnce(ctx); err != nil || res.Jobs != 3 {
		t.Fatalf("relay pass: %+v, %v; want b's job, a's and a delivery", res, err)
	}
	_, wp := startKindsReplica(t, dsn, "A", "a", 20*time.Millisecond)
	waitFor(t, "a's job", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE kind = 'sub:a' AND outcome = 'completed'`) == 1
	})
	if jobs, err := wp.claim(ctx, claimBatchMax); err != nil || len(jobs) != 0 {
		t.Errorf("A's claim took %d jobs (%v), want none: b's job and the delivery are not its kinds", len(jobs), err)
	}
	got := queryStrings(t, db, `SELECT format('%s %s at attempt %s', kind, state, attempt) FROM outbox.jobs
		WHERE kind = 'sub:b' OR event_id = $1 AND kind = 'webhook' ORDER BY id`, hook)
	if diff := cmp.Diff([]string{"sub:b available at attempt 0", "webhook available at attempt 0"}, got); diff != "" {
		t.Errorf("the jobs that are not A's (-want +got):\n%s", diff)
	}
}

// Two replicas of different subscribers share the job table: replica A
// runs subscriber a, B runs b. Every event gets a job of each (fanned out
// by a relay that knows both), and each job is run by the replica that
// runs its kind, once: none is claimed by the other, to fail there with
// no handler. With B stopped, its jobs wait, unattempted, and the
// overview names their kind (jobs_no_runner), as the jobs page marks
// them; with B back, they run and the alert clears.
func TestReplicasOfDifferentSubscribersRunOnlyTheirOwnJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, dsn := newTestDB(t)
	mustExec(t, db, `CREATE TABLE effects (event_id bigint NOT NULL, subscriber text NOT NULL, replica text NOT NULL)`)
	relay := newTestRelay(t, db, defaultConfig().Relay, noopSubscriber("a"), noopSubscriber("b"))
	fanOut := func(n int) {
		t.Helper()
		recordN(t, db, "kinds.test", n)
		if res, err := relay.relayOnce(ctx); err != nil || res.Fanned != n {
			t.Fatalf("relay pass: %+v, %v; want %d events fanned out", res, err, n)
		}
	}
	// settled says that every job of kind (any kind: "") has been
	// attempted and none is running.
	settled := func(kind string) func() bool {
		return func() bool {
			return queryInt(t, db, `SELECT count(*) FROM outbox.jobs
				WHERE ($1 = '' OR kind = $1) AND (attempt = 0 OR state = 'running')`, kind) == 0
		}
	}
	// misrun lists the jobs attempted and not completed at their first
	// attempt without an error: a job claimed by a replica that does not
	// run its kind fails there, with no handler.
	misrun := func() []string {
		t.Helper()
		return queryStrings(t, db, `
			SELECT format('job %s (%s) %s at attempt %s: %s', id, kind, state, attempt, errors -> 0 ->> 'error')
			FROM outbox.jobs
			WHERE attempt > 0 AND (state <> 'completed' OR attempt <> 1 OR errors <> '[]')
			ORDER BY id
			LIMIT 5`)
	}
	// noRunner is the kinds the overview says no live replica runs
	// (without their times), and jobs_no_runner's message ("" if it does
	// not fire).
	noRunner := func() ([]KindWithoutRunner, string) {
		t.Helper()
		o, err := readOverview(ctx, db, defaultConfig().Alerts)
		if err != nil {
			t.Fatal(err)
		}
		for i := range o.KindsWithoutRunner {
			o.KindsWithoutRunner[i].Since = time.Time{}
		}
		for _, a := range o.Alerts {
			if a.Name == "jobs_no_runner" {
				return o.KindsWithoutRunner, a.Message
			}
		}
		return o.KindsWithoutRunner, ""
	}

	startKindsReplica(t, dsn, "A", "a", 20*time.Millisecond)
	b, _ := startKindsReplica(t, dsn, "B", "b", 20*time.Millisecond)
	fanOut(20)
	waitFor(t, "both replicas' jobs", 30*time.Second, settled(""))
	if got := misrun(); len(got) > 0 {
		t.Fatalf("with both replicas up, jobs run by a replica that does not run their kind:\n%s", strings.Join(got, "\n"))
	}
	if kinds, alert := noRunner(); len(kinds) != 0 || alert != "" {
		t.Errorf("with both replicas up, the overview names kinds without a runner: %+v, %q", kinds, alert)
	}

	b.stop()
	fanOut(10)
	waitFor(t, "A's jobs while B is stopped", 30*time.Second, settled("sub:a"))
	// A has claimed since the events were fanned out: had it taken b's
	// jobs, it would have failed them.
	if got := misrun(); len(got) > 0 {
		t.Fatalf("with B stopped, A ran jobs of a kind it does not run:\n%s", strings.Join(got, "\n"))
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE kind = 'sub:b' AND state = 'available' AND attempt = 0`); n != 10 {
		t.Errorf("%d of b's 10 jobs wait unattempted while B is stopped, want all", n)
	}
	kinds, alert := noRunner()
	if diff := cmp.Diff([]KindWithoutRunner{{Kind: "sub:b", Jobs: 10}}, kinds); diff != "" {
		t.Errorf("kinds without a runner while B is stopped (-want +got):\n%s", diff)
	}
	if !strings.Contains(alert, "10 due jobs") || !strings.Contains(alert, "sub:b (10)") {
		t.Errorf("jobs_no_runner while B is stopped: %q, want it to name sub:b and its 10 jobs", alert)
	}
	if _, page := panelPage(t, newTestAdmin(t, db), "/jobs?state=available"); strings.Count(page, `class="no-runner"`) != 10 {
		t.Errorf("the jobs page marks %d jobs as of a kind no live replica runs, want b's 10", strings.Count(page, `class="no-runner"`))
	}

	startKindsReplica(t, dsn, "B", "b", 20*time.Millisecond)
	waitFor(t, "b's jobs once B is back", 30*time.Second, settled(""))
	if kinds, alert := noRunner(); len(kinds) != 0 || alert != "" {
		t.Errorf("with B back, the overview names kinds without a runner: %+v, %q", kinds, alert)
	}

	// Every job ran once, on its first attempt, with no error, by the
	// replica that runs its kind.
	if got := misrun(); len(got) > 0 {
		t.Errorf("jobs not completed at their first attempt without an error:\n%s", strings.Join(got, "\n"))
	}
	got := queryStrings(t, db, `SELECT subscriber || ' by ' || replica || ': ' || count(*) FROM effects GROUP BY subscriber, replica ORDER BY 1`)
	if diff := cmp.Diff([]string{"a by A: 30", "b by B: 30"}, got); diff != "" {
		t.Errorf("effects by subscriber and replica (-want +got):\n%s", diff)
	}
}
