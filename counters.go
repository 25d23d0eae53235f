// counters.go: what this process's loops count as they run, in memory and
// safe for concurrent use: counters and histograms with fixed buckets,
// incremented by the relay, the workers and the webhook sender, and read
// only by GET /metrics (metrics.go).

package main

import (
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// histogram is a Prometheus histogram with fixed buckets, safe for
// concurrent Observe.
type histogram struct {
	bounds  []float64 // upper bounds, ascending; +Inf is implicit
	counts  []atomic.Uint64
	count   atomic.Uint64
	sumBits atomic.Uint64 // float64 bits of the sum
}

// latencyBuckets (seconds) span a loopback delivery (1 ms) to a retry after
// the attempt timeout: the two ends an operator needs to tell apart. They
// are the delivery statistics' bounds (stats.go), so the in-process
// histogram and the database's buckets read alike.
var latencyBuckets = secondsOf(statsLatencyBounds[:])

// secondsOf is ds in seconds, as Prometheus writes a histogram's bounds.
func secondsOf(ds []time.Duration) []float64 {
	s := make([]float64, len(ds))
	for i, d := range ds {
		s[i] = d.Seconds()
	}
	return s
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds))}
}

// Observe records one value.
func (h *histogram) Observe(v float64) {
	if i := sort.SearchFloat64s(h.bounds, v); i < len(h.bounds) {
		h.counts[i].Add(1)
	}
	h.count.Add(1)
	for {
		old := h.sumBits.Load()
		if h.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// histogramVec is a histogram per label value (an endpoint id).
type histogramVec struct {
	bounds  []float64
	mu      sync.Mutex // protects byLabel
	byLabel map[string]*histogram
}

func newHistogramVec(bounds []float64) *histogramVec {
	return &histogramVec{bounds: bounds, byLabel: map[string]*histogram{}}
}

// With is the histogram for one label value, created on first use.
func (v *histogramVec) With(label string) *histogram {
	v.mu.Lock()
	defer v.mu.Unlock()
	h, ok := v.byLabel[label]
	if !ok {
		h = newHistogram(v.bounds)
		v.byLabel[label] = h
	}
	return h
}

func (v *histogramVec) labels() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	labels := make([]string, 0, len(v.byLabel))
	for l := range v.byLabel {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	return labels
}

// counterVec is a counter per label value (an outcome, a table).
type counterVec struct {
	mu      sync.Mutex // protects byLabel
	byLabel map[string]*atomic.Int64
}

func newCounterVec() *counterVec { return &counterVec{byLabel: map[string]*atomic.Int64{}} }

// Add adds n to the counter of label.
func (v *counterVec) Add(label string, n int64) {
	v.mu.Lock()
	c, ok := v.byLabel[label]
	if !ok {
		c = new(atomic.Int64)
		v.byLabel[label] = c
	}
	v.mu.Unlock()
	c.Add(n)
}

// Snapshot is every label's value.
func (v *counterVec) Snapshot() map[string]int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := make(map[string]int64, len(v.byLabel))
	for l, c := range v.byLabel {
		m[l] = c.Load()
	}
	return m
}

// deliveryMetrics are observed by the webhook sender.
type deliveryMetrics struct {
	outcomes    *counterVec   // attempts by outcome
	latency     *histogram    // one HTTP attempt, seconds
	commitTo2xx *histogramVec // event commit to its first 2xx, by endpoint id
}

func newDeliveryMetrics() *deliveryMetrics {
	return &deliveryMetrics{
		outcomes:    newCounterVec(),
		latency:     newHistogram(latencyBuckets),
		commitTo2xx: newHistogramVec(latencyBuckets),
	}
}

// authFailureWindow is how far back authMetrics.recent counts wrong
// admin tokens, in whole minutes, the current one included: the window
// the auth_failures alert (overview.go) judges a burst in.
const authFailureWindow = 5 * time.Minute

const authWindowMinutes = int64(authFailureWindow / time.Minute)

// The ways an admin token comes: as a bearer token, on /api/ and
// /metrics, or typed into the panel's sign-in (or in its URL).
const (
	authViaBearer = "bearer"
	authViaSignIn = "sign_in"
)

// authMetrics count the wrong admin tokens this process was sent, by the
// way they came (authViaBearer, authViaSignIn): those checked and
// found wrong, and those refused unchecked, their address over its
// budget; and both within the last authFailureWindow.
type authMetrics struct {
	wrong     *counterVec
	throttled *counterVec
	mu        sync.Mutex // protects minutes
	// minutes[m % len] counts minute m's wrong and refused tokens, m
	// being minutes since the Unix epoch.
	minutes [authWindowMinutes]struct{ minute, n int64 }
}

func newAuthMetrics() *authMetrics {
	return &authMetrics{wrong: newCounterVec(), throttled: newCounterVec()}
}

// failed counts a token sent via at, wrong or refused unchecked.
func (m *authMetrics) failed(via string, throttled bool, at time.Time) {
	if throttled {
		m.throttled.Add(via, 1)
	} else {
		m.wrong.Add(via, 1)
	}
	minute := at.Unix() / 60
	m.mu.Lock()
	defer m.mu.Unlock()
	slot := &m.minutes[minute%authWindowMinutes]
	if slot.minute != minute {
		slot.minute, slot.n = minute, 0
	}
	slot.n++
}

// recent is how many tokens failed within authFailureWindow of at.
func (m *authMetrics) recent(at time.Time) int64 {
	minute := at.Unix() / 60
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, slot := range m.minutes {
		if minute-slot.minute < authWindowMinutes && slot.minute <= minute {
			n += slot.n
		}
	}
	return n
}
