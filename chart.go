// chart.go: the last hour of backlog and delivery rate, sampled by this
// process and drawn as inline SVG on the overview.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"html/template"
	"log/slog"
	"strings"
	"sync"
	"time"
)

const (
	// sampleInterval and sampleCount: one point every 30 s for an hour.
	sampleInterval = 30 * time.Second
	sampleCount    = 120
)

// sample is one point of the chart.
type sample struct {
	At        time.Time
	Backlog   int64
	Completed int64 // jobs completed in the interval before At
}

// sampler keeps the last sampleCount samples.
type sampler struct {
	db       *sql.DB
	interval time.Duration
	logger   *slog.Logger

	mu      sync.Mutex // protects samples
	samples []sample
}

func newSampler(db *sql.DB, interval time.Duration, logger *slog.Logger) *sampler {
	return &sampler{db: db, interval: interval, logger: logger.With("loop", "sampler")}
}

// sampleSQL counts the backlog and the jobs completed in the last interval,
// across all replicas (the database is the one place that sees them all).
const sampleSQL = `
SELECT (SELECT count(*) FROM outbox.events
        WHERE fanned_out_at IS NULL AND poisoned_at IS NULL),
       (SELECT count(*) FROM outbox.jobs
        WHERE state = 'completed' AND finalized_at > now() - make_interval(secs => $1))`

// Run samples once at start, then every interval, until ctx ends.
func (s *sampler) Run(ctx context.Context) error {
	tick := time.NewTicker(s.interval)
	defer tick.Stop()
	for {
		if err := s.sampleOnce(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("sample failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (s *sampler) sampleOnce(ctx context.Context) error {
	p := sample{At: time.Now()}
	if err := s.db.QueryRowContext(ctx, sampleSQL, s.interval.Seconds()).Scan(&p.Backlog, &p.Completed); err != nil {
		return fmt.Errorf("sample: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, p)
	if len(s.samples) > sampleCount {
		s.samples = s.samples[len(s.samples)-sampleCount:]
	}
	return nil
}

func (s *sampler) snapshot() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}

// chartSVG draws two polylines (backlog, deliveries per second) over the
// samples, each scaled to its own maximum, which the legend states.
func chartSVG(samples []sample, interval time.Duration) template.HTML {
	const w, h, pad = 600.0, 120.0, 4.0
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="backlog and delivery rate over the last hour">`, w, h+20)
	if len(samples) < 2 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">collecting samples (one every %s)</text></svg>`, pad, h/2, interval)
		return template.HTML(b.String()) // built from numbers only
	}
	var maxBacklog, maxRate float64 = 1, 1
	for _, p := range samples {
		maxBacklog = max(maxBacklog, float64(p.Backlog))
		maxRate = max(maxRate, float64(p.Completed)/interval.Seconds())
	}
	line := func(class string, value func(sample) float64, top float64) {
		fmt.Fprintf(&b, `<polyline class="%s" points="`, class)
		for i, p := range samples {
			x := pad + (w-2*pad)*float64(i)/float64(sampleCount-1)
			y := h - pad - (h-2*pad)*value(p)/top
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		}
		b.WriteString(`"/>`)
	}
	line("backlog", func(p sample) float64 { return float64(p.Backlog) }, maxBacklog)
	line("rate", func(p sample) float64 { return float64(p.Completed) / interval.Seconds() }, maxRate)
	fmt.Fprintf(&b, `<text class="backlog" x="%.0f" y="%.0f">backlog (max %.0f)</text>`, pad, h+16, maxBacklog)
	fmt.Fprintf(&b, `<text class="rate" x="%.0f" y="%.0f">deliveries/s (max %.1f)</text>`, w/2, h+16, maxRate)
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built from numbers and constant text only
}
