// producers.go: what outbox.record costs a producer. Producers commit one
// row a transaction as fast as the database commits, in phases of
// -duration: a plain insert into a table of the events' shape (the
// baseline), and outbox.record while outboxd runs and relays to one
// endpoint, alternating for -rounds; then both again with outboxd stopped,
// when every record commits a NOTIFY. perf.sh parses the result line.

package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// plainTableSQL makes the baseline's table: the columns, defaults,
// identity and checks of outbox.events, and its primary key; none of
// outboxd's triggers or its index of events not yet fanned out, which are
// what outbox.record costs over it.
const plainTableSQL = `
DROP TABLE IF EXISTS load_plain;
CREATE TABLE load_plain (LIKE outbox.events INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS);
ALTER TABLE load_plain ADD PRIMARY KEY (id)`

// plainInsertSQL is the baseline's transaction: outbox.record's insert,
// without outbox.record.
const plainInsertSQL = `INSERT INTO load_plain (topic, subject, payload) VALUES ($1, $2, '{"load": true}')`

// producerPhases are the medians of each phase's commits a second.
type producerPhases struct {
	plain, record, plainIdle, recordIdle []float64
}

// runProducers measures the phases and prints their medians and ratios.
func runProducers(ctx context.Context, cfg config, run loadRun) error {
	g := newRig(cfg, run)
	defer g.Close(ctx)
	recv, err := g.pipelineEndpoint(ctx, cfg.DefaultEndpoint)
	if err != nil {
		return err
	}
	if _, err := run.db.ExecContext(ctx, plainTableSQL); err != nil {
		return fmt.Errorf("create the baseline's table: %w", err)
	}
	var phases producerPhases
	var recorded int64
	for range max(cfg.Rounds, 1) {
		phases.plain = append(phases.plain, producerRate(ctx, run, cfg, plainInsertSQL))
		n, rate := recordRate(ctx, run, cfg)
		phases.record = append(phases.record, rate)
		// The relay's catch-up must not run into the next baseline.
		recorded += n
		if err := recv.AwaitUnique(ctx, recorded, 10*time.Minute); err != nil {
			return err
		}
	}
	g.stopChildren()
	phases.plainIdle = append(phases.plainIdle, producerRate(ctx, run, cfg, plainInsertSQL))
	_, rate := recordRate(ctx, run, cfg)
	phases.recordIdle = append(phases.recordIdle, rate)
	// Started again, so that the run ends as the others do: its endpoint
	// deleted through it.
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	return phases.report(run, cfg)
}

// producerRate empties the baseline's table, then runs the producers
// with query for -duration and answers their commits a second.
func producerRate(ctx context.Context, run loadRun, cfg config, query string) float64 {
	if _, err := run.db.ExecContext(ctx, `TRUNCATE load_plain`); err != nil {
		run.logger.Warn("empty the baseline's table", "err", err)
	}
	n, took := produceWith(ctx, run.db, query, "load.producer", "p", cfg.Producers, 0, cfg.Duration)
	return float64(n) / took.Seconds()
}

// recordRate runs the producers through outbox.record for -duration and
// answers how many committed and how many a second.
func recordRate(ctx context.Context, run loadRun, cfg config) (int64, float64) {
	n, took := produceWith(ctx, run.db, recordSQL, "load.producer", "r", cfg.Producers, 0, cfg.Duration)
	return n, float64(n) / took.Seconds()
}

// producersSummary is the run's summary line.
type producersSummary struct {
	Plain      []float64 `json:"plain_per_second"`
	Record     []float64 `json:"record_per_second"`
	Ratio      float64   `json:"ratio"`      // the medians' record / plain, outboxd relaying
	IdleRatio  float64   `json:"idle_ratio"` // the same with outboxd stopped
	Met        bool      `json:"met"`        // Ratio >= 0.8
	IdleMet    bool      `json:"idle_met"`   // IdleRatio >= 0.3
	PlainIdle  float64   `json:"plain_idle_per_second"`
	RecordIdle float64   `json:"record_idle_per_second"`
}

// report prints the phases' medians and ratios against the targets:
// outbox.record at least 0.8 of a plain insert while outboxd relays, and
// 0.3 with it stopped, when every record notifies.
func (p producerPhases) report(run loadRun, cfg config) error {
	plain, record := median(p.plain), median(p.record)
	plainIdle, recordIdle := median(p.plainIdle), median(p.recordIdle)
	s := producersSummary{Plain: p.plain, Record: p.record, Ratio: record / plain, IdleRatio: recordIdle / plainIdle,
		PlainIdle: plainIdle, RecordIdle: recordIdle}
	s.Met, s.IdleMet = s.Ratio >= 0.8, s.IdleRatio >= 0.3
	fmt.Fprintf(run.stdout, "mode producers: %d producers, %s a phase, medians of %d rounds\n", cfg.Producers, cfg.Duration, max(cfg.Rounds, 1))
	fmt.Fprintf(run.stdout, "plain insert %.0f/s, outbox.record with outboxd relaying %.0f/s: %.2fx (target 0.8)\n", plain, record, s.Ratio)
	fmt.Fprintf(run.stdout, "with outboxd stopped: plain insert %.0f/s, outbox.record %.0f/s: %.2fx (target 0.3)\n", plainIdle, recordIdle, s.IdleRatio)
	return writeSummary(run.stdout, s)
}

// median is the middle of xs (the mean of the middle two for an even
// count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
