// bench_test.go: the hot paths against a real PostgreSQL, each reporting
// its natural unit. Run: go test -run '^$' -bench . -benchmem
//
// Figures depend on the machine and its load; compare them as ratios taken
// in one run (BenchmarkBaselineSkipLockedClaim is the yardstick: the bare
// claim-and-mark that any SKIP LOCKED queue on this database pays).

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkRecord commits one single-event transaction per op, as an
// application does.
func BenchmarkRecord(b *testing.B) {
	db, _ := newTestDB(b)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := recordEvent(ctx, tx, "bench.record", "s", []byte(`{"n":1}`)); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRelayPass times one relay pass: a full batch of 200 events
// fanned out to 1 and to 4 subscribers, and to 4 endpoints (none with a
// filter: what every endpoint's share of a pass costs), and the pass of a
// relay keeping up with a steady rate, one event to one endpoint, where
// what a statement costs whatever it carries weighs most. The filtered
// case gives the 4 endpoints a filter every event passes, so that it
// enqueues as many jobs: the cost of evaluating it (docs/filters.md).
func BenchmarkRelayPass(b *testing.B) {
	for _, tc := range []struct {
		name                           string
		events, subscribers, endpoints int
		filter                         *string
	}{
		{"subscribers=1", 200, 1, 0, nil},
		{"subscribers=4", 200, 4, 0, nil},
		{"events=1/endpoints=1", 1, 0, 1, nil},
		{"events=200/endpoints=4", 200, 0, 4, nil},
		{"events=200/endpoints=4/filtered", 200, 0, 4, new("$.i > 0 && $.i < 1000000")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			db, _ := newTestDB(b)
			ctx := context.Background()
			var subs []Subscriber
			for i := range tc.subscribers {
				subs = append(subs, noopSubscriber(fmt.Sprintf("s%d", i)))
			}
			for range tc.endpoints {
				mustExec(b, db, `INSERT INTO outbox.endpoints (url, secret, topics) VALUES ('https://hooks.example/bench', decode(repeat('ab', 32), 'hex'), '{bench.*}')`)
				if tc.filter != nil {
					mustExec(b, db, `UPDATE outbox.endpoints SET filter = $1`, *tc.filter)
				}
			}
			r := newTestRelay(b, db, defaultConfig().Relay, subs...)
			var events int
			for b.Loop() {
				b.StopTimer()
				recordN(b, db, "bench.relay", tc.events)
				b.StartTimer()
				res, err := r.relayOnce(ctx)
				if err != nil || res.Fanned != tc.events || res.Jobs != tc.events*(tc.subscribers+tc.endpoints) {
					b.Fatalf("pass: %+v, %v", res, err)
				}
				events += res.Fanned
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkClaimAndComplete times the job table alone: claim a batch of
// 100 due jobs and record their completion, one statement each. The jobs
// are in-process subscribers' (one lane, no endpoint), one endpoint's, or
// spread over ten endpoints (ten lanes the claim shares the batch among),
// with caps that leave the batch whole.
func BenchmarkClaimAndComplete(b *testing.B) {
	for _, lanes := range []struct {
		name      string
		endpoints int
	}{{"subscribers", 0}, {"one endpoint", 1}, {"ten endpoints", 10}} {
		b.Run(lanes.name, func(b *testing.B) {
			db, _ := newTestDB(b)
			// Its claims take deliveries and sub:noop's jobs, which the
			// benchmark completes without running them. 200 workers, so
			// that one endpoint's share of them (half: claimer.workerShare)
			// holds the 100 a claim takes.
			cfg := defaultConfig().Workers
			cfg.Concurrency = 200
			wp := webhookWorkers(b, db, cfg, time.Second, noopSubscriber("noop"))
			ctx := context.Background()
			mustExec(b, db, `INSERT INTO outbox.endpoints (url, secret, max_in_flight)
				SELECT 'https://hooks.example.com/' || i, decode(repeat('ab', 32), 'hex'), 1000
				FROM generate_series(1, $1) AS i`, lanes.endpoints)
			enqueue := `INSERT INTO outbox.jobs (kind, event_id, max_attempts)
				SELECT 'sub:noop', e.id, 18
				FROM generate_series(1, 100), LATERAL (SELECT outbox.record('bench.jobs', '', '{}')) AS e(id)`
			if lanes.endpoints > 0 {
				enqueue = `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts)
					SELECT 'webhook', e.id, (SELECT min(id) FROM outbox.endpoints) + i % $1, 18
					FROM generate_series(1, 100) AS i, LATERAL (SELECT outbox.record('bench.jobs', i::text, '{}')) AS e(id)`
			}
			var jobs int
			for b.Loop() {
				b.StopTimer()
				if lanes.endpoints > 0 {
					mustExec(b, db, enqueue, lanes.endpoints)
				} else {
					mustExec(b, db, enqueue)
				}
				b.StartTimer()
				claimed, err := wp.claim(ctx, 100)
				if err != nil || len(claimed) != 100 {
					b.Fatalf("claimed %d: %v", len(claimed), err)
				}
				results := make([]jobResult, len(claimed))
				for i, j := range claimed {
					results[i] = jobResult{ID: j.ID, Attempt: j.Attempt, jobOutcome: jobOutcome{State: jobCompleted}}
				}
				if err := wp.recordOutcomes(ctx, results); err != nil {
					b.Fatal(err)
				}
				jobs += len(claimed)
			}
			b.ReportMetric(float64(jobs)/b.Elapsed().Seconds(), "jobs/s")
		})
	}
}

// BenchmarkPipelineFloor runs the pipeline's statements alone, with no
// HTTP and no waiting between them, at the batch sizes the pipeline uses:
// per op, 200 recorded events (untimed) fanned out to one endpoint by one
// relay pass (outbox.fan_out, -relay-batch 200), their 200 deliveries
// claimed by two workers' claims of claimBatchMax (100), and completed by
// one outcome statement per claim, every attempt a 2xx counted in the
// statistics. Its events/s is the most that PostgreSQL lets one
// endpoint's deliveries through the pipeline on this machine: the floor
// that docs/performance.md sets beside the drain.
func BenchmarkPipelineFloor(b *testing.B) {
	db, _ := newTestDB(b)
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	endpoint := int64(queryInt(b, db, `INSERT INTO outbox.endpoints (url, secret, topics, max_in_flight)
		VALUES ('https://hooks.example.com/floor', decode(repeat('ab', 32), 'hex'), '{bench.*}', 1000) RETURNING id`))
	relay := newRelay(db, defaultConfig().Relay, 18, []jobTarget{}, quiet)
	// Its claims take deliveries, which the benchmark completes unsent.
	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(),
		map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, nil, nil, nil, quiet).deliver}, quiet)
	const perOp = 200
	var delivered int
	var fanOut, claims, outcomes time.Duration // each statement kind's share of the op
	for b.Loop() {
		b.StopTimer()
		recordN(b, db, "bench.floor", perOp)
		b.StartTimer()
		began := time.Now()
		if res, err := relay.relayOnce(ctx); err != nil || res.Fanned != perOp || res.Jobs != perOp {
			b.Fatalf("relay pass: %+v, %v", res, err)
		}
		fanOut += time.Since(began)
		for claimed := 0; claimed < perOp; {
			began = time.Now()
			jobs, err := wp.claim(ctx, claimBatchMax)
			claims += time.Since(began)
			if err != nil || len(jobs) == 0 {
				b.Fatalf("claimed %d of %d: %v", len(jobs), perOp-claimed, err)
			}
			results := make([]jobResult, len(jobs))
			for i, j := range jobs {
				results[i] = jobResult{ID: j.ID, Attempt: j.Attempt, jobOutcome: jobOutcome{State: jobCompleted},
					record: &attemptRecord{
						deliveryAttempt: deliveryAttempt{Duration: time.Millisecond, StatusCode: http.StatusNoContent,
							Class: classSuccess, CommitTo2xx: 5 * time.Millisecond},
						EndpointID: endpoint, Change: endpointSucceeded, At: time.Now(), set: true,
					}}
			}
			began = time.Now()
			if err := wp.recordOutcomes(ctx, results); err != nil {
				b.Fatal(err)
			}
			outcomes += time.Since(began)
			claimed += len(jobs)
		}
		delivered += perOp
	}
	b.ReportMetric(float64(delivered)/b.Elapsed().Seconds(), "events/s")
	for _, part := range []struct {
		unit string
		d    time.Duration
	}{{"fan-out-ms/op", fanOut}, {"claims-ms/op", claims}, {"outcomes-ms/op", outcomes}} {
		b.ReportMetric(float64(part.d.Milliseconds())/float64(b.N), part.unit)
	}
}

// BenchmarkWebhookDelivery times one webhook attempt as a worker runs it:
// encode the body, sign it, POST it to an httptest receiver over a kept
// connection, classify the answer. The attempt's record is written later,
// in the completer's batch (BenchmarkClaimAndComplete).
func BenchmarkWebhookDelivery(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	quiet := slog.New(slog.DiscardHandler) // a test log line per attempt would cost more than the attempt
	sender := newWebhookSender(nil, nil, client, nil, nil, quiet)
	wp := newWorkerPool(nil, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: sender.deliver}, quiet)
	job := Job{
		ID: 1, Kind: webhookJobKind, Attempt: 1, MaxAttempts: 18, EndpointID: 1,
		endpoint: &deliveryEndpoint{URL: srv.URL, Secrets: [][]byte{[]byte("0123456789abcdef0123456789abcdef")}},
		Event: Event{ID: 42, Topic: "order.paid", Subject: "42", CreatedAt: time.Now(),
			Payload: json.RawMessage(`{"order": 42, "amount": 1200, "currency": "EUR"}`)},
	}
	ctx := context.Background()
	for b.Loop() {
		if res := wp.runJob(ctx, job); res.State != jobCompleted {
			b.Fatalf("delivery: %+v", res)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
}

// BenchmarkRetentionPrune times one batch of events retention: 5,000
// events fanned out 8 days ago, each with two completed jobs, deleted by
// one statement (the jobs go with them, ON DELETE CASCADE).
func BenchmarkRetentionPrune(b *testing.B) {
	db, _ := newTestDB(b)
	cfg := defaultConfig().Retention
	var pruned int64
	for b.Loop() {
		b.StopTimer()
		mustExec(b, db, `
			WITH aged AS (
			  INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at)
			  SELECT 'bench.aged', 'a' || i, now() - interval '8 days', now() - interval '8 days'
			  FROM generate_series(1, $1) AS i
			  RETURNING id
			)
			INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at)
			SELECT kind, aged.id, 18, 'completed', 1, now(), now()
			FROM aged, (VALUES ('sub:a'), ('sub:b')) AS k(kind)`, cfg.BatchSize)
		b.StartTimer()
		res, err := db.Exec(deleteEventsSQL, cfg.Events.Seconds(), cfg.BatchSize)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := res.RowsAffected()
		if n != int64(cfg.BatchSize) {
			b.Fatalf("pruned %d events, want %d", n, cfg.BatchSize)
		}
		pruned += n
	}
	b.ReportMetric(float64(pruned)/b.Elapsed().Seconds(), "events/s")
}

// baselineClaimSQL is the yardstick: the least any SKIP LOCKED outbox must
// do per batch, claim 200 rows and mark them, in one statement.
const baselineClaimSQL = `
WITH claimed AS (
  SELECT id FROM outbox.events
  WHERE fanned_out_at IS NULL AND poisoned_at IS NULL
  ORDER BY id
  LIMIT 200
  FOR UPDATE SKIP LOCKED
)
UPDATE outbox.events AS e SET fanned_out_at = now()
FROM claimed WHERE e.id = claimed.id`

func BenchmarkBaselineSkipLockedClaim(b *testing.B) {
	db, _ := newTestDB(b)
	var rows int64
	for b.Loop() {
		b.StopTimer()
		recordN(b, db, "bench.baseline", 200)
		b.StartTimer()
		res, err := db.Exec(baselineClaimSQL)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := res.RowsAffected()
		rows += n
	}
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkOrderedDrain delivers 2,000 events of 1,000 subjects to one
// endpoint, fan-out included, with ordering "none" and "subject": the
// ordered endpoint's share of the unordered one's rate is what one subject
// at a time costs (docs/endpoints.md, ordered delivery).
func BenchmarkOrderedDrain(b *testing.B) {
	for _, ordering := range []string{"none", "subject"} {
		b.Run(ordering, func(b *testing.B) {
			db, _ := newTestDB(b)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusNoContent)
			}))
			defer srv.Close()
			endpointID := queryInt(b, db, `INSERT INTO outbox.endpoints (url, secret, ordering)
				VALUES ($1, decode(repeat('ab', 32), 'hex'), $2) RETURNING id`, srv.URL, ordering)
			quiet := slog.New(slog.DiscardHandler) // a log line per delivery would cost more than the delivery
			client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
			cfg := defaultConfig().Workers
			cfg.PollInterval = 10 * time.Millisecond
			wp := newWorkerPool(db, cfg, time.Minute, newSubscriberRegistry(),
				map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, client, nil, nil, quiet).deliver}, quiet)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- wp.Run(ctx, nil) }()
			defer func() { cancel(); <-done }()
			relay := newRelay(db, defaultConfig().Relay, 18, []jobTarget{}, quiet)

			const perOp = 2000
			var delivered int
			for b.Loop() {
				b.StopTimer()
				mustExec(b, db, `SELECT outbox.record('bench.ordered', 's' || (i % 1000), '{}') FROM generate_series(1, $1) AS i`, perOp)
				b.StartTimer()
				for {
					res, err := relay.relayOnce(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if res.Claimed == 0 {
						break
					}
				}
				delivered += perOp
				// Polled through the claim's own indexes: a count of the
				// completed jobs would read all of them, every time.
				for queryInt(b, db, `
					SELECT (SELECT count(*) FROM outbox.jobs
					        WHERE endpoint_id = $1 AND state IN ('available', 'retryable') AND replay_id IS NULL)
					     + (SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'running')`, endpointID) > 0 {
					time.Sleep(5 * time.Millisecond)
				}
			}
			b.ReportMetric(float64(delivered)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
