package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A young service's day: the chart starts at its first minute with data,
// whose first point sits on the y axis, and says so; none of the 1,430
// minutes before is drawn as a zero (nor the current one, still filling). The y unit stands turned in the left
// margin, clear of the top label and of the legend.
func TestChartStartsAtFirstDataAndUnitClear(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	series := make([]statsMinute, 1440)
	for i := range series {
		series[i].Minute = start.Add(time.Duration(i) * time.Minute)
	}
	p50 := 5.0
	for i := 1430; i < 1440; i++ {
		series[i].Delivered = 3
		series[i].LatencyP50MS = &p50
	}
	svg := string(deliveryChartSVG(series, "deliveries"))
	points := regexp.MustCompile(`<polyline class="delivered" points="([^"]*)"`).FindStringSubmatch(svg)
	if points == nil {
		t.Fatalf("no delivered line:\n%s", svg)
	}
	xy := strings.Fields(points[1])
	if len(xy) != 9 {
		t.Errorf("the delivered line has %d points, want the 9 whole minutes with data", len(xy))
	}
	if len(xy) > 0 && !strings.HasPrefix(xy[0], "64.0,") {
		t.Errorf("the first point is at %s, want on the y axis (x 64)", xy[0])
	}
	if !strings.Contains(svg, "time (UTC) from 23:50, the first minute with data") {
		t.Errorf("the time axis does not say it starts at the first minute with data:\n%s", svg)
	}
	unit := `<text class="unit" transform="translate(14.0 135.0) rotate(-90)" text-anchor="middle">per minute</text>`
	if !strings.Contains(svg, unit) {
		t.Errorf("the y unit is not turned in the left margin (%s):\n%s", unit, svg)
	}
	latency := string(latencyChartSVG(series, "latency"))
	d := regexp.MustCompile(`<path class="p50" d="([^"]*)"`).FindStringSubmatch(latency)
	if d == nil || !strings.HasPrefix(d[1], "M64.0,") || strings.Count(d[1], "L") != 9 {
		t.Errorf("the latency chart's p50 path %q, want it to start on the y axis and join the 10 minutes", d)
	}
	if !strings.Contains(latency, `rotate(-90)" text-anchor="middle">commit → first 2xx (log)</text>`) {
		t.Errorf("the latency chart's unit is not turned in the left margin")
	}

	// A window with nothing in it says so instead of a flat line.
	empty := string(deliveryChartSVG(series[:60], "deliveries"))
	if !strings.Contains(empty, "nothing recorded in this window") || strings.Contains(empty, "<polyline") {
		t.Errorf("an empty hour draws:\n%s", empty)
	}
	// Data from the first minute: nothing cut, nothing said.
	full := string(deliveryChartSVG(series[1430:], "deliveries"))
	if strings.Contains(full, "first minute with data") {
		t.Error("a chart with data from its first minute says it was cut")
	}
}

// Every time axis has at least two labels, so that it reads as a scale:
// an hour, a day, a young service's few minutes, a day of 15-minute
// buckets and two buckets that start on no round time; and at most seven,
// far enough apart not to overlap.
func TestTimeAxisHasSeveralLabels(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 5, 1, 12, 3, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		points int
		step   time.Duration
	}{
		{"an hour", 60, time.Minute},
		{"a day", 1440, time.Minute},
		{"a young service's 12 minutes", 12, time.Minute},
		{"two minutes", 2, time.Minute},
		{"a day's first 90 minutes", 90, time.Minute},
		{"a day of 15-minute buckets", 96, 15 * time.Minute},
		{"two 15-minute buckets", 2, 15 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := countChart{label: tc.name, step: tc.step, lines: []countLine{{class: "delivered", name: "delivered"}}}
			for i := range tc.points {
				c.times = append(c.times, start.Add(time.Duration(i)*tc.step))
				c.lines[0].values = append(c.lines[0].values, 1)
			}
			svg := string(countChartSVG(c))
			labels := regexp.MustCompile(`<text class="xlabel" x="([0-9.]+)"[^>]*>(\d\d:\d\d)</text>`).FindAllStringSubmatch(svg, -1)
			if len(labels) < 2 || len(labels) > 7 {
				t.Fatalf("%d time labels, want 2 to 7: %v", len(labels), labels)
			}
			for i := 1; i < len(labels); i++ {
				prev, _ := strconv.ParseFloat(labels[i-1][1], 64)
				x, _ := strconv.ParseFloat(labels[i][1], 64)
				if x-prev < 48 {
					t.Errorf("labels %s at %.1f and %s at %.1f overlap", labels[i-1][2], prev, labels[i][2], x)
				}
			}
		})
	}
}

// The current minute is still filling: drawn, it would plunge the line
// as if delivery had stopped. A chart of counts leaves it out of its
// lines, keeps it on the time axis (the line ends a step short of now)
// and in its legend's totals, and says so; a day of 15-minute buckets
// does the same with its last bucket.
func TestChartLeavesOutTheCurrentMinute(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	series := make([]statsMinute, 60)
	for i := range series {
		series[i] = statsMinute{Minute: start.Add(time.Duration(i) * time.Minute), Delivered: 10}
	}
	series[59].Delivered = 1 // 6 seconds into the current minute
	svg := string(deliveryChartSVG(series, "deliveries"))
	points := regexp.MustCompile(`<polyline class="delivered" points="([^"]*)"`).FindStringSubmatch(svg)
	if points == nil {
		t.Fatalf("no delivered line:\n%s", svg)
	}
	xy := strings.Fields(points[1])
	if len(xy) != 59 {
		t.Errorf("the delivered line has %d points, want the 59 whole minutes", len(xy))
	}
	for _, p := range xy {
		if y := strings.Split(p, ",")[1]; y != strings.Split(xy[0], ",")[1] {
			t.Errorf("the delivered line dips to %s at %s, want it flat at the whole minutes' 10", y, p)
			break
		}
	}
	if last := xy[len(xy)-1]; strings.HasPrefix(last, "1104.0,") {
		t.Errorf("the line's last point %s is at the plot's right edge, the current minute's place", last)
	}
	for _, want := range []string{"delivered (2xx): 591", "the current minute, still filling, is not drawn"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the chart does not say %q", want)
		}
	}

	st := InboxStats{SeriesStepMinutes: 15}
	for i := range 96 {
		st.Series = append(st.Series, InboxPoint{From: start.Add(time.Duration(i) * 15 * time.Minute), Received: 30})
	}
	st.Series[95].Received = 2
	inbox := string(inboxChartSVG(st, "webhooks"))
	received := regexp.MustCompile(`<polyline class="received" points="([^"]*)"`).FindStringSubmatch(inbox)
	if received == nil || len(strings.Fields(received[1])) != 95 {
		t.Error("the received line does not hold the 95 whole buckets alone")
	}
	if !strings.Contains(inbox, "the current one, still filling, is not drawn") {
		t.Error("the inbox chart does not say its last bucket is not drawn")
	}
}
