package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"
)

// An endpoint's cap (max_in_flight) holds over every replica and
// whatever its receiver does (schema.sql, outbox.lane_room).

// registeredReplica registers a replica row for a test and returns it.
func registeredReplica(t *testing.T, db *sql.DB, pid int) *replicaRegistry {
	t.Helper()
	r := newReplicaRegistry(db, defaultConfig().Replicas, testReplica("0.1.0", pid), testLogger(t))
	if err := r.register(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// insertEndpointWithJobs inserts an endpoint of cap maxInFlight and n due
// deliveries to it, and returns its id.
func insertEndpointWithJobs(t *testing.T, db *sql.DB, url string, maxInFlight, n int) int64 {
	t.Helper()
	var endpoint int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, max_in_flight)
		VALUES ($1, decode(repeat('ab', 32), 'hex'), $2) RETURNING id`, url, maxInFlight).Scan(&endpoint); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at)
		SELECT 'webhook', outbox.record('t', i::text, '{}'), $1, 18, now() - interval '1 minute'
		FROM generate_series(1, $2) AS i`, endpoint, n)
	return endpoint
}

// The release before sends an outcome "released" for a job it claimed
// and never sent (its claims ahead), and outbox.record_outcomes keeps
// taking it while that release's replicas roll: the job goes back as it
// was before its claim, its attempt not counted, available or retryable
// as before, due where it was.
func TestThePreviousReleasesReleasedOutcomePutsTheJobBack(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ep := insertEndpointWithJobs(t, db, "https://released.example.com/", 4, 2)
	mustExec(t, db, `UPDATE outbox.jobs SET attempt = 1, state = 'retryable' WHERE id = (SELECT max(id) FROM outbox.jobs)`)
	jobs, err := webhookWorkers(t, db, defaultConfig().Workers, time.Second).claim(context.Background(), 10)
	if err != nil || len(jobs) != 2 {
		t.Fatalf("claimed %d: %v", len(jobs), err)
	}
	var results []jobResult
	for _, j := range jobs {
		results = append(results, jobResult{ID: j.ID, Attempt: j.Attempt, jobOutcome: jobOutcome{State: "released"}})
	}
	if err := writeOutcomes(context.Background(), db, results, 5); err != nil {
		t.Fatal(err)
	}
	got := queryStrings(t, db, fmt.Sprintf(`SELECT state || ' ' || attempt || ' ' || (scheduled_at < now() - interval '30 seconds')
		FROM outbox.jobs WHERE endpoint_id = %d ORDER BY id`, ep))
	if want := []string{"available 0 true", "retryable 1 true"}; !slices.Equal(got, want) {
		t.Errorf("released jobs %q, want %q", got, want)
	}
}

// insertEndpoint inserts an endpoint of cap maxInFlight subscribed to
// topic, with the settings set (an UPDATE's SET list, or ""), and returns
// its id.
func insertEndpoint(t *testing.T, db *sql.DB, topic string, maxInFlight int, set string) int64 {
	t.Helper()
	var id int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, topics, secret, max_in_flight)
		VALUES ('https://receiver.example.com/' || $1, ARRAY[$1], decode(repeat('ab', 32), 'hex'), $2)
		RETURNING id`, topic, maxInFlight).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if set != "" {
		mustExec(t, db, `UPDATE outbox.endpoints SET `+set+` WHERE id = $1`, id)
	}
	return id
}

// Two registered replicas, each with 8 workers and its share of them,
// respect one endpoint's cap of 3 together.
func TestTwoRegisteredReplicasRespectOneCap(t *testing.T) {
	t.Parallel()
	twoReplicasAgainstACapOf3(t, func(t *testing.T, replica *sql.DB, i int) {
		runRegisteredWebhookWorkers(t, replica, 601+i)
	})
}

// runRegisteredWebhookWorkers is runWebhookWorkers as a registered
// replica: its claims record it (held_by) and its share of workers.
func runRegisteredWebhookWorkers(t *testing.T, db *sql.DB, pid int) {
	t.Helper()
	cfg := defaultConfig().Workers
	cfg.PollInterval = 20 * time.Millisecond
	cfg.Concurrency = 8
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 30 * time.Second})
	wp := newWorkerPool(db, cfg, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, client, nil, nil, testLogger(t)).deliver}, testLogger(t))
	wp.replica = registeredReplica(t, db, pid)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wp.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
}
