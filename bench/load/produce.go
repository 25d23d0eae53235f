// produce.go: the producers, connections each committing single-event
// transactions through outbox.record, at a steady rate or as fast as the
// database commits.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// recordSQL records one event and answers its id.
const recordSQL = `SELECT outbox.record($1, $2, '{"load": true}')`

// produce commits single-event transactions of topic on producers
// connections for d, at rate events/s over all of them (0: as fast as the
// database commits), and returns how many committed and how long it took.
// Subjects are prefix, the producer's number, a dash and a sequence.
func produce(ctx context.Context, db *sql.DB, topic, prefix string, producers int, rate float64, d time.Duration) (int64, time.Duration) {
	return produceWith(ctx, db, recordSQL, topic, prefix, producers, rate, d)
}

// produceWith is produce with query, which takes the topic and the
// subject, as each transaction.
func produceWith(ctx context.Context, db *sql.DB, query, topic, prefix string, producers int, rate float64, d time.Duration) (int64, time.Duration) {
	var committed atomic.Int64
	runCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	seq := make([]int, producers)
	start := time.Now()
	paced(runCtx, producers, rate, func(p int) {
		subject := fmt.Sprintf("%s%d-%d", prefix, p, seq[p])
		seq[p]++
		if _, err := db.ExecContext(runCtx, query, topic, subject); err == nil {
			committed.Add(1)
		}
	})
	return committed.Load(), time.Since(start)
}

// paced calls step(p) on producers goroutines, p their number, until
// runCtx ends: back to back with rate 0, else at rate calls a second
// over all of them.
func paced(runCtx context.Context, producers int, rate float64, step func(p int)) {
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(producers) / rate * float64(time.Second))
	}
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() { pacedLoop(runCtx, p, producers, interval, step) })
	}
	wg.Wait()
}

// pacedLoop is producer p of n: step back to back (interval 0), or once
// an interval from its phase on.
func pacedLoop(runCtx context.Context, p, n int, interval time.Duration, step func(p int)) {
	if interval <= 0 {
		for runCtx.Err() == nil {
			step(p)
		}
		return
	}
	if sleepCtx(runCtx, producerPhase(p, n, interval)) != nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-runCtx.Done():
			return
		case <-t.C:
			step(p)
		}
	}
}

// producerPhase is how long producer p of n waits before its first tick
// at a fixed rate: the producers' ticks spread evenly over one interval,
// so the rate arrives as a steady stream. Started together, 16 producers
// at 20 events/s would send bursts of 16 commits every 800 ms, and the
// latency measured would be that of the burst's queue, not of the
// pipeline.
func producerPhase(p, n int, interval time.Duration) time.Duration {
	return interval * time.Duration(p) / time.Duration(n)
}

// laneEvent is one event a lanes scenario committed, of subject
// laneSubject(Subject).
type laneEvent struct {
	ID      int64
	Subject int
}

func laneSubject(n int) string { return "lane-" + strconv.Itoa(n) }

// laneProducer commits single-event transactions of topic, like produce,
// and keeps each event's id and subject: the run's k-th event is of
// subject k mod subjects (subjects 0: each its own). With mark set, an
// event of subject 0 is recorded in an explicit transaction and mark gets
// its id before the commit: the receiver knows it as subject 0's when its
// first request arrives.
type laneProducer struct {
	db        *sql.DB
	topic     string
	producers int
	rate      float64
	subjects  int
	mark      func(id int64)
}

// run produces until runCtx ends. Statements run under ctx, so that the
// last ones finish and each event committed is counted.
func (p laneProducer) run(ctx, runCtx context.Context) ([]laneEvent, time.Duration) {
	var seq atomic.Int64
	committed := make([][]laneEvent, p.producers)
	start := time.Now()
	paced(runCtx, p.producers, p.rate, func(i int) {
		subject := int(seq.Add(1) - 1)
		if p.subjects > 0 {
			subject %= p.subjects
		}
		if id, err := p.record(ctx, subject); err == nil {
			committed[i] = append(committed[i], laneEvent{ID: id, Subject: subject})
		}
	})
	return slices.Concat(committed...), time.Since(start)
}

func (p laneProducer) record(ctx context.Context, subject int) (int64, error) {
	var id int64
	if subject != 0 || p.mark == nil {
		err := p.db.QueryRowContext(ctx, recordSQL, p.topic, laneSubject(subject)).Scan(&id)
		return id, err
	}
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := tx.QueryRowContext(ctx, recordSQL, p.topic, laneSubject(subject)).Scan(&id); err != nil {
		return 0, err
	}
	p.mark(id)
	return id, tx.Commit()
}
