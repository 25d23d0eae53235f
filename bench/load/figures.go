// figures.go: the arithmetic of the reports: percentiles, windows,
// overlaps, the verdicts on each scenario's target, and the summary line.

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// The targets the lanes scenarios judge.
const (
	// lanesP99Bound bounds the p99 ratio of stuck and replay: a stuck
	// subject or a replay may make the other deliveries' p99 at most 1.5
	// times what it is without them.
	lanesP99Bound = 1.5
	// orderedDrainShare is the least share of the unordered drain rate an
	// ordered endpoint with 1,000 subjects must reach.
	orderedDrainShare = 0.8
)

// quantile is the q-quantile (0 < q <= 1) of sorted by the nearest-rank
// method: the smallest value that at least q of the values do not exceed.
// It is 0 for no values.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, max(0, int(math.Ceil(q*float64(len(sorted))))-1))]
}

// ms is d in milliseconds, for the summaries.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// verdict says whether a target was met.
func verdict(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}

// writeSummary prints the machine-readable last line of a scenario.
func writeSummary(w io.Writer, summary any) error {
	b, err := json.Marshal(summary)
	if err != nil {
		return fmt.Errorf("summary: %w", err)
	}
	_, err = fmt.Fprintf(w, "summary %s\n", b)
	return err
}

// maxInWindow is the most times inside any window [t, t+w), the window
// sliding over every t.
func maxInWindow(times []time.Time, w time.Duration) int {
	sorted := slices.Clone(times)
	slices.SortFunc(sorted, time.Time.Compare)
	most, first := 0, 0
	for last := range sorted {
		for sorted[last].Sub(sorted[first]) >= w {
			first++
		}
		most = max(most, last-first+1)
	}
	return most
}

// sortedCountAtMost is how many of sorted are at most d.
func sortedCountAtMost(sorted []time.Duration, d time.Duration) int {
	n, _ := slices.BinarySearchFunc(sorted, d, func(a, b time.Duration) int {
		if a <= b {
			return -1
		}
		return 1
	})
	return n
}

// padded is sorted with values at bound added up to n: events never
// accepted, counted at the bound they missed.
func padded(sorted []time.Duration, n int, bound time.Duration) []time.Duration {
	out := slices.Clone(sorted)
	for len(out) < n {
		out = append(out, bound)
	}
	slices.Sort(out)
	return out
}

// p99Ratio is the p99 of with over the p99 of without (both sorted), and
// whether it is within lanesP99Bound. Without events on either side
// nothing is met.
func p99Ratio(without, with []time.Duration) (float64, bool) {
	base, other := quantile(without, 0.99), quantile(with, 0.99)
	if base <= 0 || len(with) == 0 {
		return 0, false
	}
	r := float64(other) / float64(base)
	return r, r <= lanesP99Bound
}

// drainShare is the ordered drain rate over the unordered one, and
// whether it reaches orderedDrainShare.
func drainShare(unordered, ordered float64) (float64, bool) {
	if unordered <= 0 || ordered <= 0 {
		return 0, false
	}
	r := ordered / unordered
	return r, r >= orderedDrainShare
}

// latencyFigures are a sorted set of latencies as a summary shows them.
type latencyFigures struct {
	Events int     `json:"events"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
}

func figures(sorted []time.Duration) latencyFigures {
	return latencyFigures{Events: len(sorted), P50MS: ms(quantile(sorted, 0.5)), P99MS: ms(quantile(sorted, 0.99)), MaxMS: ms(quantile(sorted, 1))}
}

func (f latencyFigures) String() string {
	return fmt.Sprintf("%5d events, commit->2xx p50 %.1f ms p99 %.1f ms max %.1f ms", f.Events, f.P50MS, f.P99MS, f.MaxMS)
}
