// loadscenarios_test.go: the scenarios' arithmetic (percentiles,
// windows, overlaps), their defaults, and the scenarios run end to end
// against a real outboxd.

package main

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestQuantileIsNearestRank(t *testing.T) {
	t.Parallel()
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		values []time.Duration
		q      float64
		want   time.Duration
	}{
		{nil, 0.5, 0},
		{[]time.Duration{7}, 0.99, 7},
		{ten, 0.5, 5},
		{ten, 0.9, 9},
		{ten, 0.91, 10},
		{ten, 0.99, 10},
		{ten, 1, 10},
		{ten, 0.01, 1},
	} {
		if got := quantile(tc.values, tc.q); got != tc.want {
			t.Errorf("quantile(%v, %g) = %d, want %d", tc.values, tc.q, got, tc.want)
		}
	}
}

func TestMaxInWindowSlidesOverEveryStart(t *testing.T) {
	t.Parallel()
	at := func(ms ...int) []time.Time {
		base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		var out []time.Time
		for _, m := range ms {
			out = append(out, base.Add(time.Duration(m)*time.Millisecond))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		times []time.Time
		want  int
	}{
		{"none", nil, 0},
		{"one", at(0), 1},
		{"evenly spaced, 10/s in 1 s", at(0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100), 10},
		{"the window is half-open: 1000 ms apart is outside", at(0, 1000), 1},
		{"a burst in the middle", at(0, 900, 1500, 1510, 1520, 1530, 2400, 2499, 2500, 3000), 6},
		{"unsorted input", at(1530, 2500, 0, 1510, 2400, 1500, 2499, 900, 1520, 3000), 6},
	} {
		if got := maxInWindow(tc.times, time.Second); got != tc.want {
			t.Errorf("%s: maxInWindow = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestMaxConcurrentCountsOverlaps(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	span := func(from, to int) requestSpan {
		return requestSpan{Start: base.Add(time.Duration(from) * time.Second), End: base.Add(time.Duration(to) * time.Second)}
	}
	for _, tc := range []struct {
		name  string
		spans []requestSpan
		want  int
	}{
		{"none", nil, 0},
		{"one", []requestSpan{span(0, 5)}, 1},
		{"one after another, touching", []requestSpan{span(0, 1), span(1, 2), span(2, 3)}, 1},
		{"three overlapping at 2..3", []requestSpan{span(0, 3), span(1, 4), span(2, 5), span(6, 7)}, 3},
		{"nested", []requestSpan{span(0, 10), span(1, 2), span(3, 4), span(3, 5)}, 3},
	} {
		if got := maxConcurrent(tc.spans); got != tc.want {
			t.Errorf("%s: maxConcurrent = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestMaxConcurrentDuringCountsOnlyWhileOneOfThemIsOpen(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	span := func(from, to int) requestSpan {
		return requestSpan{Start: base.Add(time.Duration(from) * time.Second), End: base.Add(time.Duration(to) * time.Second)}
	}
	// Three overlap at 1..2, before the probes; the probes run alone,
	// except the second, which an earlier request still overlaps.
	early := []requestSpan{span(0, 3), span(1, 4), span(1, 2)}
	probes := []requestSpan{span(5, 6), span(3, 5)}
	all := append(append([]requestSpan{}, early...), probes...)
	if got := maxConcurrentDuring(all, probes[:1]); got != 1 {
		t.Errorf("during a lone probe: %d at once, want 1", got)
	}
	if got := maxConcurrentDuring(all, probes); got != 2 {
		t.Errorf("during both probes: %d at once, want 2", got)
	}
	if got := maxConcurrentDuring(all, nil); got != 0 {
		t.Errorf("during no probe: %d, want 0", got)
	}
}

func TestLongestFailureRunInArrivalOrder(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var spans []requestSpan
	// Answer order differs from arrival order: the run is counted by arrival.
	for i, status := range []int{204, 500, 500, 204, 500, 500, 500, 204, 500} {
		spans = append(spans, requestSpan{Start: base.Add(time.Duration(i) * time.Second), Status: status})
	}
	spans[0], spans[8] = spans[8], spans[0]
	if got := longestFailureRun(spans); got != 3 {
		t.Errorf("longestFailureRun = %d, want 3", got)
	}
	if got := longestFailureRun(nil); got != 0 {
		t.Errorf("longestFailureRun(nil) = %d, want 0", got)
	}
}

func TestSortedCountAtMostAndPadding(t *testing.T) {
	t.Parallel()
	sorted := []time.Duration{1, 2, 2, 3, 5}
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{0, 0}, {1, 1}, {2, 3}, {4, 4}, {5, 5}, {9, 5}} {
		if got := sortedCountAtMost(sorted, tc.d); got != tc.want {
			t.Errorf("sortedCountAtMost(%d) = %d, want %d", tc.d, got, tc.want)
		}
	}
	if diff := cmp.Diff([]time.Duration{1, 2, 2, 3, 4, 4, 5}, padded(sorted, 7, 4)); diff != "" {
		t.Errorf("padded (-want +got):\n%s", diff)
	}
}

func TestChildSettingReadsFlagsLikeTheChild(t *testing.T) {
	t.Parallel()
	noEnv := func(string) string { return "" }
	workersEnv := func(name string) string {
		if name == "OUTBOXD_WORKERS" {
			return "24"
		}
		return ""
	}
	for _, tc := range []struct {
		name   string
		extra  string
		getenv func(string) string
		want   int
	}{
		{"default", "", noEnv, 128},
		{"other flags only", "-disable-listen -relay-sweep 10s", noEnv, 128},
		{"separate value", "-workers 8", noEnv, 8},
		{"with =", "-workers=12", noEnv, 12},
		{"two dashes", "--workers 16", noEnv, 16},
		{"the last one wins", "-workers 8 -workers=32", noEnv, 32},
		{"not a number: the default (the child refuses it)", "-workers x", noEnv, 128},
		{"a longer flag's prefix is not it", "-workers-extra 9", noEnv, 128},
		{"the environment", "", workersEnv, 24},
		{"a flag over the environment", "-workers 4", workersEnv, 4},
	} {
		if got := childWorkers(strings.Fields(tc.extra), tc.getenv); got != tc.want {
			t.Errorf("%s: childWorkers(%q) = %d, want %d", tc.name, tc.extra, got, tc.want)
		}
	}
	if got := childSetting([]string{"-breaker-threshold=1"}, noEnv, "breaker-threshold", 5); got != 1 {
		t.Errorf("breaker-threshold = %d, want 1", got)
	}
}

// Each scenario runs with its own numbers unless a flag says otherwise;
// drain and keepup keep the flags' defaults.
func TestLoadScenarioDefaults(t *testing.T) {
	t.Parallel()
	type numbers struct {
		Duration     time.Duration
		Rate         float64
		Events       int
		FailAfter    time.Duration
		FailRatio    float64
		AcceptWithin time.Duration
		RateLimit    float64
		Replicas     int
		MaxInFlight  int
		Rounds       int
		FailFor      time.Duration
		Subjects     int
	}
	for _, tc := range []struct {
		args []string
		want numbers
	}{
		{[]string{"-mode", "keepup"}, numbers{60 * time.Second, 0, 100_000, 0, 0.1, 2 * time.Minute, 20, 2, 0, 1, 0, 0}},
		// drain: one outboxd unless -replicas says more.
		{[]string{"-mode", "drain"}, numbers{60 * time.Second, 0, 100_000, 0, 0.1, 2 * time.Minute, 20, 1, 0, 1, 0, 0}},
		{[]string{"-mode", "drain", "-replicas", "2"}, numbers{60 * time.Second, 0, 100_000, 0, 0.1, 2 * time.Minute, 20, 2, 0, 1, 0, 0}},
		{[]string{"-mode", "isolation"}, numbers{30 * time.Second, 20, 1000, 5 * time.Second, 0.1, 2 * time.Minute, 20, 2, 0, 1, 0, 0}},
		{[]string{"-mode", "flaky"}, numbers{30 * time.Second, 50, 100_000, 0, 0.1, 2 * time.Minute, 20, 2, 0, 1, 0, 0}},
		{[]string{"-mode", "dead"}, numbers{30 * time.Second, 20, 100_000, time.Second, 0.1, 2 * time.Minute, 20, 2, 0, 1, 0, 0}},
		{[]string{"-mode", "ratelimit"}, numbers{30 * time.Second, 0, 1000, 0, 0.1, 2 * time.Minute, 20, 2, 0, 1, 0, 0}},
		{[]string{"-mode", "isolation", "-duration", "5s", "-rate", "7", "-events", "40", "-fail-after", "1s", "-rounds", "3"},
			numbers{5 * time.Second, 7, 40, time.Second, 0.1, 2 * time.Minute, 20, 2, 0, 3, 0, 0}},
		{[]string{"-mode", "isolation", "-answer-after", "20s", "-max-in-flight", "1000", "-events", "300"},
			numbers{30 * time.Second, 20, 300, 5 * time.Second, 0.1, 2 * time.Minute, 20, 2, 1000, 1, 0, 0}},
		{[]string{"-mode", "ratelimit", "-rate-limit", "5", "-replicas", "3", "-max-in-flight", "100"},
			numbers{30 * time.Second, 0, 1000, 0, 0.1, 2 * time.Minute, 5, 3, 100, 1, 0, 0}},
		// The lanes scenarios: a subject failing for 10 s among 100 at 50
		// events/s, three rounds; a 100,000-event replay beside live
		// events at 320 events/s; drains of 20,000 events over 1,000
		// subjects, two rounds.
		{[]string{"-mode", "stuck"}, numbers{30 * time.Second, 50, 100_000, 0, 0.1, 2 * time.Minute, 20, 2, 0, 3, 10 * time.Second, 100}},
		{[]string{"-mode", "replay"}, numbers{60 * time.Second, 320, 100_000, 0, 0.1, 2 * time.Minute, 20, 2, 0, 1, 0, 0}},
		// producers: 15 s phases, two rounds of a plain insert and outbox.record.
		{[]string{"-mode", "producers"}, numbers{15 * time.Second, 0, 100_000, 0, 0.1, 2 * time.Minute, 20, 2, 0, 2, 0, 0}},
		{[]string{"-mode", "ordered"}, numbers{30 * time.Second, 0, 20_000, 0, 0.1, 2 * time.Minute, 20, 2, 0, 2, 0, 1000}},
		{[]string{"-mode", "stuck", "-fail-for", "2s", "-subjects", "5", "-rounds", "1", "-max-in-flight", "4"},
			numbers{30 * time.Second, 50, 100_000, 0, 0.1, 2 * time.Minute, 20, 2, 4, 1, 2 * time.Second, 5}},
	} {
		cfg, err := parseConfig(append([]string{"-outboxd", "outboxd"}, tc.args...), func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		got := numbers{cfg.Duration, cfg.Rate, cfg.Events, cfg.FailAfter, cfg.FailRatio, cfg.AcceptWithin, cfg.RateLimit, cfg.Replicas, cfg.MaxInFlight, cfg.Rounds,
			cfg.FailFor, cfg.Subjects}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%v (-want +got):\n%s", tc.args, diff)
		}
	}
	for _, args := range [][]string{
		{"-mode", "chaos"},
		{"-mode", "jobs"},
		{"-database", "Outboxd-Load"},
		{"-mode", "flaky", "-fail-ratio", "1.5"},
		{"-mode", "ratelimit", "-rate-limit", "0"},
		{"-mode", "ratelimit", "-replicas", "0"},
		{"-mode", "ratelimit", "-max-in-flight", "1001"},
		{"-mode", "isolation", "-rounds", "0"},
		{"-mode", "dead", "-fail-after", "-1s"},
		{"-mode", "stuck", "-fail-for", "-1s"},
		{"-mode", "ordered", "-subjects", "-1"},
		{"-mode", "replay", "-vacuum-every", "-1s"},
		{"-mode", "replay", "-answer-after", "-1ms"},
		{"-mode", "keepup", "-warmup", "-1s"},
	} {
		if _, err := parseConfig(append([]string{"-outboxd", "outboxd"}, args...), func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	_, err := parseConfig([]string{"-mode", "drain"}, func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-outboxd") {
		t.Errorf("no -outboxd: %v, want an error naming -outboxd", err)
	}
	_, err = parseConfig([]string{"-outboxd", "outboxd", "-mode", "jobs"}, func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-bench") {
		t.Errorf("-mode jobs: %v, want an error naming the benchmark that replaces it", err)
	}
}

// runScenario runs the generator with args on a fresh database and
// returns its summary line, decoded into summary. The run must leave no
// endpoint behind.
func runScenario(t *testing.T, summary any, args ...string) {
	t.Helper()
	db, url := newTestDB(t)
	out, _ := runLoad(t, append([]string{"-database-url", url, "-database", ""}, args...)...)
	t.Logf("load %v:\n%s", args, out)
	var line string
	for l := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(l, "summary "); ok {
			line = rest
		}
	}
	if err := json.Unmarshal([]byte(line), summary); err != nil {
		t.Fatalf("summary line %q: %v", line, err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints left after the run, want 0", n)
	}
}

// A receiver that refuses everything opens the breaker, and from then on
// it receives one request at a time.
func TestLoadDeadScenarioOpensTheBreaker(t *testing.T) {
	t.Parallel()
	var s deadSummary
	// Retries come due 1 s after a first failed attempt: 5 s leaves them
	// time to reach the receiver while the breaker is open.
	runScenario(t, &s, "-mode", "dead", "-duration", "5s", "-producers", "2", "-rate", "10", "-fail-after", "200ms")
	if s.Requests == 0 || s.AnsweredBeforeOpen < s.BreakerThreshold {
		t.Fatalf("the receiver saw %d requests, answered %d before the breaker opened; want at least the threshold %d", s.Requests, s.AnsweredBeforeOpen, s.BreakerThreshold)
	}
	if !s.BreakerOpened || s.BreakerStateAtEnd != breakerOpen {
		t.Errorf("breaker opened %v, at the end %q; want opened and open", s.BreakerOpened, s.BreakerStateAtEnd)
	}
	if s.FailuresAtOpen < s.BreakerThreshold {
		t.Errorf("breaker seen open at %d consecutive failures, under the threshold %d", s.FailuresAtOpen, s.BreakerThreshold)
	}
	if s.ClaimUnknown != 0 {
		t.Errorf("%d requests whose claim the receiver did not find, want 0", s.ClaimUnknown)
	}
	if s.ClaimedAfterOpen == 0 || s.MaxConcurrentAfter != 1 {
		t.Errorf("after the breaker opened: %d requests claimed, at most %d open at once while one was; want some, one at a time", s.ClaimedAfterOpen, s.MaxConcurrentAfter)
	}
}

// A hanging receiver with a backlog gets at most its endpoint's cap of
// requests at once, and the healthy endpoint beside it gets every event.
// The breaker is kept shut (threshold 1000), so the cap alone bounds it.
func TestLoadIsolationScenarioHoldsTheCap(t *testing.T) {
	t.Parallel()
	var s isolationSummary
	runScenario(t, &s, "-mode", "isolation", "-duration", "2s", "-producers", "2", "-rate", "10", "-events", "40", "-fail-after", "1s", "-rounds", "2",
		"-serve-flags", "-breaker-threshold 1000")
	if s.BadCap != defaultMaxInFlight {
		t.Errorf("bad endpoint's cap %d, want the default %d", s.BadCap, defaultMaxInFlight)
	}
	if s.BadMaxInFlight != s.BadCap {
		t.Errorf("bad receiver saw at most %d requests at once, want exactly its cap %d (40 queued)", s.BadMaxInFlight, s.BadCap)
	}
	if s.BaselineEvents == 0 || s.BesideEvents == 0 || len(s.BaselineP99MSByRound) != 2 || len(s.BesideP99MSByRound) != 2 {
		t.Errorf("healthy endpoint got %d events alone and %d beside the bad one, p99s by round %v and %v; want some in both phases of 2 rounds",
			s.BaselineEvents, s.BesideEvents, s.BaselineP99MSByRound, s.BesideP99MSByRound)
	}
	if s.BadBreakerState != breakerClosed {
		t.Errorf("bad endpoint's breaker %q, want closed under -breaker-threshold 1000", s.BadBreakerState)
	}
}

// A slow receiver (-answer-after) whose endpoint's cap is far above the
// child's workers holds only its share of them: half of 8.
func TestLoadIsolationScenarioSlowReceiverHoldsItsShareOfTheWorkers(t *testing.T) {
	t.Parallel()
	var s isolationSummary
	runScenario(t, &s, "-mode", "isolation", "-duration", "2s", "-producers", "2", "-rate", "10", "-events", "40",
		"-answer-after", "1s", "-max-in-flight", "1000", "-serve-flags", "-workers 8")
	if s.BadCap != 1000 {
		t.Errorf("bad endpoint's cap %d, want -max-in-flight's 1000", s.BadCap)
	}
	if s.BadMaxInFlight != 4 {
		t.Errorf("bad receiver saw at most %d requests at once, want half of the 8 workers, 4 (40 queued)", s.BadMaxInFlight)
	}
	if s.BesideEvents == 0 {
		t.Error("the healthy endpoint got no event beside the slow one")
	}
}

// The lanes scenarios' bounds: a p99 at most 1.5 times the one without
// the stuck subject or the replay, an ordered drain at least 80% of the
// unordered.
func TestLaneVerdicts(t *testing.T) {
	t.Parallel()
	ms := func(values ...int) []time.Duration {
		var out []time.Duration
		for _, v := range values {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name          string
		without, with []time.Duration
		ratio         float64
		met           bool
	}{
		{"the same", ms(10, 20), ms(10, 20), 1, true},
		{"exactly 1.5 times", ms(10, 20), ms(10, 30), 1.5, true},
		{"just over", ms(10, 20), ms(10, 31), 1.55, false},
		{"faster", ms(10, 40), ms(10, 20), 0.5, true},
		{"nothing without", nil, ms(10), 0, false},
		{"nothing with", ms(10), nil, 0, false},
	} {
		ratio, met := p99Ratio(tc.without, tc.with)
		if ratio != tc.ratio || met != tc.met {
			t.Errorf("%s: p99Ratio = %g, %v; want %g, %v", tc.name, ratio, met, tc.ratio, tc.met)
		}
	}
	if lanesP99Bound != 1.5 {
		t.Errorf("lanesP99Bound = %g, want 1.5", lanesP99Bound)
	}
	for _, tc := range []struct {
		unordered, ordered float64
		ratio              float64
		met                bool
	}{
		{1000, 800, 0.8, true},
		{1000, 799, 0.799, false},
		{1000, 1200, 1.2, true},
		{0, 800, 0, false},
		{1000, 0, 0, false},
	} {
		ratio, met := drainShare(tc.unordered, tc.ordered)
		if ratio != tc.ratio || met != tc.met {
			t.Errorf("drainShare(%g, %g) = %g, %v; want %g, %v", tc.unordered, tc.ordered, ratio, met, tc.ratio, tc.met)
		}
	}
}

func TestOrderViolationsCountsEachSubjectApart(t *testing.T) {
	t.Parallel()
	// Subject 1's events 1, 3, 5 in order; subject 2's 2, 4, 6 with 6
	// before 4; subject 3's 8 accepted while 7 never was.
	events := []laneEvent{{1, 1}, {2, 2}, {3, 1}, {4, 2}, {5, 1}, {6, 2}, {7, 3}, {8, 3}}
	accepted := map[int64]acceptance{1: {Seq: 1}, 2: {Seq: 2}, 3: {Seq: 3}, 6: {Seq: 4}, 4: {Seq: 5}, 5: {Seq: 6}, 8: {Seq: 7}}
	if got := orderViolations(events, accepted); got != 2 {
		t.Errorf("orderViolations = %d, want 2", got)
	}
	if got := orderViolations(events[:2], accepted); got != 0 {
		t.Errorf("orderViolations of one event a subject = %d, want 0", got)
	}
}

// A phase's latencies by minute of commit: a remainder under half a
// minute joins the minute before it, a longer one is a minute of its own,
// and a minute without events has no figure.
func TestP99ByMinuteFoldsAShortRemainder(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 12, 3, 16, 0, 0, 0, time.UTC)
	timing := map[int64]laneTiming{}
	committed := func(offsets ...time.Duration) []laneEvent {
		var events []laneEvent
		for i, offset := range offsets {
			id := int64(len(timing) + 1)
			events = append(events, laneEvent{ID: id})
			// Latencies 1, 2, 3 ms... in each call's order.
			timing[id] = laneTiming{Created: from.Add(offset), Latency: time.Duration(i+1) * time.Millisecond}
		}
		return events
	}
	unaccepted := laneEvent{ID: 1000} // no timing: not counted
	for _, c := range []struct {
		name   string
		events []laneEvent
		to     time.Duration
		want   []float64
	}{
		{"20 ms past a minute", committed(0, 59*time.Second, 60*time.Second+20*time.Millisecond), 60*time.Second + 20*time.Millisecond, []float64{3}},
		{"40 s past a minute", committed(0, 59*time.Second, 95*time.Second), 100 * time.Second, []float64{2, 3}},
		{"an empty minute, then 20 s past the next", committed(0, 130*time.Second, 200*time.Second), 200 * time.Second, []float64{1, 3}},
	} {
		got := p99ByMinute(append(c.events, unaccepted), timing, from, from.Add(c.to))
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s: p99 by minute, ms (-want +got):\n%s", c.name, diff)
		}
	}
}

// One subject refused for a while on an ordered endpoint: its head is
// retried and its events wait, in order; every event is accepted, and the
// verdict is the bound applied to the figures the run reports.
func TestLoadStuckScenarioHoldsOnlyTheFailingSubject(t *testing.T) {
	t.Parallel()
	var s stuckSummary
	// 5 subjects at 20 events/s: lane-0 gets 4 a second, so one arrives
	// within the 500 ms of refusals that start 0.75 s into each 3 s phase;
	// its retry, 1 s later, finds the receiver answering again.
	runScenario(t, &s, "-mode", "stuck", "-duration", "3s", "-producers", "2", "-rate", "20", "-subjects", "5",
		"-fail-for", "500ms", "-rounds", "2")
	if s.Rounds != 2 || len(s.BaselineP99ByRound) != 2 || len(s.FailingP99ByRound) != 2 {
		t.Fatalf("rounds %d, p99s by round %v and %v; want 2 of each", s.Rounds, s.BaselineP99ByRound, s.FailingP99ByRound)
	}
	if s.FailForSeconds != 0.5 || s.FailStartSeconds != 0.75 {
		t.Errorf("refusals from %gs for %gs, want from 0.75s (a quarter of the phase) for 0.5s", s.FailStartSeconds, s.FailForSeconds)
	}
	if s.Baseline.Events == 0 || s.Failing.Events == 0 || s.StuckEvents == 0 {
		t.Fatalf("other subjects' events %d and %d, lane-0's %d; want some of each", s.Baseline.Events, s.Failing.Events, s.StuckEvents)
	}
	if s.StuckRefused == 0 {
		t.Errorf("no request of lane-0 answered 500")
	}
	if s.OrderViolations != 0 || s.Unaccepted != 0 {
		t.Errorf("%d events accepted before their subject's previous one, %d never accepted; want none", s.OrderViolations, s.Unaccepted)
	}
	// lane-0's refused head waits for its retry, 1 s on the schedule.
	if s.StuckMaxMS < 900 {
		t.Errorf("lane-0's slowest event took %.1f ms, want at least its retry's 1 s less 10%%", s.StuckMaxMS)
	}
	if want := s.Failing.P99MS / s.Baseline.P99MS; !near(s.P99Ratio, want, 1e-3) || s.P99RatioMet != (s.P99Ratio <= 1.5) {
		t.Errorf("p99 ratio %g (met %v) from p99s %g and %g ms, want %g, met iff <= 1.5", s.P99Ratio, s.P99RatioMet, s.Baseline.P99MS, s.Failing.P99MS, want)
	}
	if s.Baseline.P50MS > s.Baseline.P99MS || s.Baseline.P99MS > s.Baseline.MaxMS {
		t.Errorf("baseline p50 %g, p99 %g, max %g ms: not in order", s.Baseline.P50MS, s.Baseline.P99MS, s.Baseline.MaxMS)
	}
}

// A replay of 2,000 events beside live ones: each replay's jobs are the
// events recorded before the endpoint, every one accepted, and live
// events are measured alone and during it.
func TestLoadReplayScenarioMeasuresLiveBesideTheReplay(t *testing.T) {
	t.Parallel()
	var s replaySummary
	runScenario(t, &s, "-mode", "replay", "-duration", "2s", "-producers", "2", "-rate", "20", "-events", "2000", "-rounds", "2", "-vacuum-every", "1s", "-answer-after", "1ms")
	if diff := cmp.Diff([]int64{2000, 2000}, s.ReplayJobs); diff != "" {
		t.Errorf("replays' jobs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{replayFinished, replayFinished}, s.ReplayState); diff != "" {
		t.Errorf("replays' states at the end (-want +got):\n%s", diff)
	}
	// Three phases of 2 s and two replays: at least 6 s of phases.
	if s.VacuumEverySeconds != 1 || s.Vacuums < 4 {
		t.Errorf("vacuumed %d times every %gs during the phases, want at least 4 every 1s", s.Vacuums, s.VacuumEverySeconds)
	}
	if s.AnswerAfterSeconds != 0.001 {
		t.Errorf("the receiver answered after %gs, want -answer-after's 0.001", s.AnswerAfterSeconds)
	}
	if s.MaxInFlight != defaultMaxInFlight || s.ReplayShare != 4 {
		t.Errorf("max_in_flight %d, replay share %d; want the default %d and a quarter of it, 4", s.MaxInFlight, s.ReplayShare, defaultMaxInFlight)
	}
	for i := range 2 {
		if s.ReplaySeconds[i] <= 0 || !near(s.ReplayRate[i], 2000/s.ReplaySeconds[i], 1e-9) || s.ReplayAPIRate[i] <= 0 {
			t.Errorf("round %d: replay took %gs at %g events/s (the API's %g); want a positive time and 2000 over it", i+1, s.ReplaySeconds[i], s.ReplayRate[i], s.ReplayAPIRate[i])
		}
		if s.EnqueueSeconds[i] > s.ReplaySeconds[i] || s.EstimatedSeconds[i] < 1 {
			t.Errorf("round %d: enqueued in %gs of %gs, estimated %d s", i+1, s.EnqueueSeconds[i], s.ReplaySeconds[i], s.EstimatedSeconds[i])
		}
	}
	if s.Baseline.Events == 0 || s.During.Events == 0 {
		t.Fatalf("live events alone %d, during the replays %d; want some in both", s.Baseline.Events, s.During.Events)
	}
	if len(s.BaselineP99ByPhase) != 3 || len(s.DuringP99ByRound) != 2 || len(s.DuringP99ByMinute) < 2 {
		t.Errorf("p99s alone %v, during each replay %v, by minute of the replays %v; want 3 phases alone (before each replay, after the last), 2 replays, a minute or more of each",
			s.BaselineP99ByPhase, s.DuringP99ByRound, s.DuringP99ByMinute)
	}
	// A phase of 2 s is one (short) minute: its minute's p99 is the phase's.
	if diff := cmp.Diff(s.BaselineP99ByPhase, s.BaselineP99ByMinute); diff != "" {
		t.Errorf("p99 by minute of the phases alone (-by phase +by minute):\n%s", diff)
	}
	if want := s.During.P99MS / s.Baseline.P99MS; !near(s.P99Ratio, want, 1e-3) || s.P99RatioMet != (s.P99Ratio <= 1.5) {
		t.Errorf("p99 ratio %g (met %v) from p99s %g and %g ms, want %g, met iff <= 1.5", s.P99Ratio, s.P99RatioMet, s.Baseline.P99MS, s.During.P99MS, want)
	}
}

// Drains of one endpoint unordered and ordered: each delivers every
// event, the ordered ones each subject in order, and the verdict is 80%
// applied to the rates the run reports.
func TestLoadOrderedScenarioComparesDrains(t *testing.T) {
	t.Parallel()
	var s orderedSummary
	runScenario(t, &s, "-mode", "ordered", "-events", "600", "-subjects", "50", "-rounds", "2")
	if len(s.UnorderedSeconds) != 2 || len(s.OrderedSeconds) != 2 {
		t.Fatalf("drains %v unordered and %v ordered, want 2 of each", s.UnorderedSeconds, s.OrderedSeconds)
	}
	if s.MaxInFlight != 128 {
		t.Errorf("max_in_flight %d, want the child's 128 workers", s.MaxInFlight)
	}
	wantUnordered := 1200 / (s.UnorderedSeconds[0] + s.UnorderedSeconds[1])
	wantOrdered := 1200 / (s.OrderedSeconds[0] + s.OrderedSeconds[1])
	if !near(s.UnorderedRate, wantUnordered, 1e-9) || !near(s.OrderedRate, wantOrdered, 1e-9) {
		t.Errorf("rates %g and %g events/s, want %g and %g from the drains' seconds", s.UnorderedRate, s.OrderedRate, wantUnordered, wantOrdered)
	}
	if want := s.OrderedRate / s.UnorderedRate; !near(s.Ratio, want, 1e-9) || s.Met != (s.Ratio >= 0.8) {
		t.Errorf("ratio %g (met %v), want %g, met iff >= 0.8", s.Ratio, s.Met, want)
	}
	if s.OrderViolations != 0 {
		t.Errorf("%d events of the ordered drains accepted before their subject's previous one", s.OrderViolations)
	}
}

// near says whether a and b agree within a share rel of b: a figure
// recomputed from others the summary rounded (milliseconds to the
// microsecond) or summed in another order.
func near(a, b, rel float64) bool { return math.Abs(a-b) <= rel*math.Abs(b) }

// The replay scenario reads the child's /metrics per phase: samples summed
// by name over labels, buckets left out, and turned into rates and means.
func TestWorkerCostFromMetrics(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `# HELP outboxd_job_claim_seconds Duration of one claim statement.
# TYPE outboxd_job_claim_seconds histogram
outboxd_job_claim_seconds_bucket{le="0.001"} 7
outboxd_job_claim_seconds_bucket{le="+Inf"} 40
outboxd_job_claim_seconds_sum 0.12
outboxd_job_claim_seconds_count 40
outboxd_jobs_claimed_total 100
outboxd_deliveries_total{outcome="2xx"} 90
outboxd_deliveries_total{outcome="5xx"} 3
`)
	}))
	defer srv.Close()
	c := &child{addr: strings.TrimPrefix(srv.URL, "http://"), token: "tok"}
	after, err := c.MetricSums(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"outboxd_job_claim_seconds_sum": 0.12, "outboxd_job_claim_seconds_count": 40,
		"outboxd_jobs_claimed_total": 100, "outboxd_deliveries_total": 93,
	}
	if diff := cmp.Diff(want, after); diff != "" {
		t.Errorf("metric sums (-want +got):\n%s", diff)
	}
	if n, err := c.DeliveryAttempts(context.Background()); err != nil || n != 93 {
		t.Errorf("delivery attempts %d, %v; want 93", n, err)
	}

	before := map[string]float64{"outboxd_job_claim_seconds_sum": 0.02, "outboxd_job_claim_seconds_count": 20,
		"outboxd_jobs_claimed_total": 40, machineBusy: 100, machineTotal: 400}
	after[machineBusy], after[machineTotal] = 400, 800
	var cost workerCost
	cost.add(before, after, 4*time.Second)
	got := cost.figures()
	// 20 claims in 4 s, 0.1 s of them: 5 a second of 5 ms, 3 jobs each;
	// the machine busy 300 of 400 ticks.
	if got.ClaimsPerSecond != 5 || math.Abs(got.ClaimMS-5) > 1e-9 || got.JobsPerClaim != 3 || got.MachineBusy != 0.75 {
		t.Errorf("figures %+v: want 5 claims/s of 5 ms and 3 jobs, the machine 75%% busy", got)
	}
}

// The machine's CPU time, as the replay scenario reads it per phase.
func TestMachineCPUReadsProcStat(t *testing.T) {
	t.Parallel()
	busy, total, ok := machineCPU()
	if !ok {
		if _, err := os.Stat("/proc/stat"); err == nil {
			t.Fatal("/proc/stat exists but was not read")
		}
		return // no /proc: nothing to read, and the report says nothing of it
	}
	if busy <= 0 || total <= busy {
		t.Errorf("busy %d of %d ticks: want some busy time, and less than all of it", busy, total)
	}
}

// The producers scenario measures outbox.record against a plain insert in
// alternating phases, then with outboxd stopped, and reports the medians'
// ratios against their targets.
func TestLoadProducersScenarioComparesWithAPlainInsert(t *testing.T) {
	t.Parallel()
	var s producersSummary
	runScenario(t, &s, "-mode", "producers", "-duration", "1s", "-rounds", "3", "-producers", "2")
	if len(s.Plain) != 3 || len(s.Record) != 3 {
		t.Fatalf("%d plain and %d record phases, want 3 of each", len(s.Plain), len(s.Record))
	}
	for i := range s.Plain {
		if s.Plain[i] <= 0 || s.Record[i] <= 0 {
			t.Errorf("round %d: %g plain and %g record commits a second, want both above 0", i, s.Plain[i], s.Record[i])
		}
	}
	if want := median(s.Record) / median(s.Plain); !near(s.Ratio, want, 1e-9) || s.Met != (s.Ratio >= 0.8) {
		t.Errorf("ratio %g (met %v), want %g, met iff >= 0.8", s.Ratio, s.Met, want)
	}
	if want := s.RecordIdle / s.PlainIdle; s.RecordIdle <= 0 || !near(s.IdleRatio, want, 1e-9) || s.IdleMet != (s.IdleRatio >= 0.3) {
		t.Errorf("with outboxd stopped: ratio %g (met %v) of %g and %g, want %g, met iff >= 0.3", s.IdleRatio, s.IdleMet, s.RecordIdle, s.PlainIdle, want)
	}
}

func TestMedianOfOddAndEvenCounts(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %g, want %g", tc.xs, got, tc.want)
		}
	}
}
