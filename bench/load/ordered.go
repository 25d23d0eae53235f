// ordered.go: -mode ordered, drains of many subjects' events to one
// endpoint with its ordering "none" and "subject" in turn. Its target: the
// ordered drain at least orderedDrainShare of the unordered one's rate.

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// orderedSummary is -mode ordered's result: each drain's seconds, by
// ordering, and the rates over all of them.
type orderedSummary struct {
	Mode             string    `json:"mode"`
	Events           int       `json:"events"`
	Subjects         int       `json:"subjects"`
	MaxInFlight      int       `json:"max_in_flight"`
	Rounds           int       `json:"rounds"`
	UnorderedSeconds []float64 `json:"unordered_seconds"`
	OrderedSeconds   []float64 `json:"ordered_seconds"`
	UnorderedRate    float64   `json:"unordered_rate"` // events/s over every unordered drain
	OrderedRate      float64   `json:"ordered_rate"`
	Ratio            float64   `json:"ratio"`
	Met              bool      `json:"met"`              // ≥ 0.8
	OrderViolations  int       `json:"order_violations"` // in the ordered drains
}

// recordLanesSQL records events $1 to $2 of topic $3, event i of subject
// i mod $4, in one statement.
const recordLanesSQL = `
SELECT outbox.record($3, 'lane-' || (i % $4), '{"load": true}')
FROM generate_series($1::int, $2::int) AS i`

// laneEventsSQL reads the events of a topic with their subjects'
// numbers (recordLanesSQL's lane-<n>).
const laneEventsSQL = `
SELECT id, split_part(subject, '-', 2)::int
FROM outbox.events
WHERE topic = $1`

// ordered is one run of the scenario.
type ordered struct {
	cfg    config
	run    loadRun
	g      *rig
	log    *acceptLog
	ep     endpoint
	drains int // so far: each drain's events have a topic of their own
}

// runOrdered drains -events events of -subjects subjects to one endpoint
// with ordering "none" and "subject" in turn, as drain does: outboxd
// stopped, the events recorded, outboxd started and timed until the last
// is accepted. Rounds alternate which goes first (none, subject, subject,
// none, ...), so that a trend over the run weighs on both alike.
func runOrdered(ctx context.Context, cfg config, run loadRun) error {
	if cfg.Subjects < 1 {
		return fmt.Errorf("-subjects must be at least 1 for -mode ordered, got %d", cfg.Subjects)
	}
	g := newRig(cfg, run)
	defer g.Close(ctx)
	if err := g.start(ctx, 1); err != nil {
		return err
	}
	o := &ordered{cfg: cfg, run: run, g: g, log: newAcceptLog()}
	recv, err := g.receiver(func(webhookID string) requestAnswer {
		o.log.accept(webhookID)
		return requestAnswer{}
	}, true)
	if err != nil {
		return err
	}
	// As drain: the cap is the child's workers unless -max-in-flight says
	// otherwise, so that the pipeline is measured, not the cap.
	maxInFlight := cfg.MaxInFlight
	if maxInFlight == 0 {
		maxInFlight = childWorkers(g.extra, os.Getenv)
	}
	if o.ep, err = g.endpoint(ctx, recv, endpointSettings{Topics: []string{"load.*"}, MaxInFlight: maxInFlight}); err != nil {
		return err
	}
	s := orderedSummary{Mode: "ordered", Events: cfg.Events, Subjects: cfg.Subjects, MaxInFlight: maxInFlight, Rounds: cfg.Rounds}
	if err := o.rounds(ctx, &s); err != nil {
		return err
	}
	return s.report(run.stdout)
}

// rounds runs every round's two drains into s.
func (o *ordered) rounds(ctx context.Context, s *orderedSummary) error {
	var unordered, ordered time.Duration
	for round := range o.cfg.Rounds {
		order := []string{orderingNone, orderingSubject}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, ordering := range order {
			took, events, err := o.drain(ctx, ordering)
			if err != nil {
				return err
			}
			if ordering == orderingNone {
				unordered += took
				s.UnorderedSeconds = append(s.UnorderedSeconds, took.Seconds())
				continue
			}
			ordered += took
			s.OrderedSeconds = append(s.OrderedSeconds, took.Seconds())
			s.OrderViolations += orderViolations(events, o.log.of(events))
		}
	}
	n := float64(o.cfg.Events * o.cfg.Rounds)
	s.UnorderedRate, s.OrderedRate = n/unordered.Seconds(), n/ordered.Seconds()
	s.Ratio, s.Met = drainShare(s.UnorderedRate, s.OrderedRate)
	return nil
}

// drain sets the endpoint's ordering, stops outboxd, records the drain's
// events, starts outboxd and times it until every event was accepted.
func (o *ordered) drain(ctx context.Context, ordering string) (time.Duration, []laneEvent, error) {
	o.drains++
	topic := fmt.Sprintf("load.drain%d", o.drains)
	if err := o.g.children[0].PatchEndpoint(ctx, o.ep.ID, map[string]any{"ordering": ordering}); err != nil {
		return 0, nil, err
	}
	o.g.stopChildren()
	// Without this the later drains would claim past the earlier ones'
	// dead rows where autovacuum is off or has not come round yet.
	if err := vacuumQueues(ctx, o.run.db); err != nil {
		return 0, nil, err
	}
	events, err := o.record(ctx, topic)
	if err != nil {
		return 0, nil, err
	}
	start := time.Now()
	if err := o.g.start(ctx, 1); err != nil {
		return 0, nil, err
	}
	if err := o.log.await(ctx, events, 30*time.Minute); err != nil {
		return 0, nil, err
	}
	return time.Since(start), events, nil
}

// record records -events of topic over -subjects and reads them back.
func (o *ordered) record(ctx context.Context, topic string) ([]laneEvent, error) {
	for done := 0; done < o.cfg.Events; done += 10_000 {
		if _, err := o.run.db.ExecContext(ctx, recordLanesSQL, done, min(done+10_000, o.cfg.Events)-1, topic, o.cfg.Subjects); err != nil {
			return nil, fmt.Errorf("record events: %w", err)
		}
	}
	rows, err := o.run.db.QueryContext(ctx, laneEventsSQL, topic)
	if err != nil {
		return nil, fmt.Errorf("read the drain's events: %w", err)
	}
	defer rows.Close()
	var events []laneEvent
	for rows.Next() {
		var e laneEvent
		if err := rows.Scan(&e.ID, &e.Subject); err != nil {
			return nil, fmt.Errorf("read the drain's events: %w", err)
		}
		events = append(events, e)
	}
	return events, rows.Err()
}

func (s orderedSummary) report(out io.Writer) error {
	fmt.Fprintf(out, "mode ordered: %d round(s) of two drains of %d events over %d subjects to one endpoint (max_in_flight %d), ordering none and subject, alternating which goes first\n",
		s.Rounds, s.Events, s.Subjects, s.MaxInFlight)
	for i := range s.UnorderedSeconds {
		fmt.Fprintf(out, "round %d: none %.2f s (%.0f events/s), subject %.2f s (%.0f events/s)\n", i+1,
			s.UnorderedSeconds[i], float64(s.Events)/s.UnorderedSeconds[i], s.OrderedSeconds[i], float64(s.Events)/s.OrderedSeconds[i])
	}
	fmt.Fprintf(out, "ordered %.0f events/s / unordered %.0f events/s: %.2f (target >= %g): %s\n",
		s.OrderedRate, s.UnorderedRate, s.Ratio, orderedDrainShare, verdict(s.Met))
	fmt.Fprintf(out, "order: %d events of the ordered drains accepted before their subject's previous one\n", s.OrderViolations)
	return writeSummary(out, s)
}
