// chart.go: the panel's charts, drawn as inline SVG: the delivery
// statistics' and the inbox's series, read from the database, so that
// every replica draws the same chart and a restart loses nothing.

package main

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// The charts: outbox.delivery_stats' series (stats.go) and
// outbox.inbox_stats' (inbox.go), drawn as inline SVG with axes, units and
// a legend, the same on every replica and after a restart. The numbers
// come from the database as integers and the labels are constant text or
// formatted numbers and times: only the aria-label needs escaping.

// Geometry of the charts, in SVG units: the viewBox scales it to
// the page's width (at most the 1,200-px main column, so 1 unit ≈ 1 px at
// 1,280 px), leaving 64 units on the left for the y labels, room under the
// plot for the time labels and above it for the legend.
const (
	dchartW, dchartH               = 1120.0, 280.0
	dchartLeft, dchartRight        = 64.0, 16.0
	dchartTop, dchartBottom        = 34.0, 44.0
	dchartPlotW                    = dchartW - dchartLeft - dchartRight
	dchartPlotH                    = dchartH - dchartTop - dchartBottom
	dchartLegendY, dchartLegendGap = 16.0, 200.0
	// dchartUnitX is the baseline of the turned y unit: its 12-px glyphs
	// end left of x = 17, the y labels (at most "10000", about 35 units,
	// right-aligned at 58) start right of x = 23.
	dchartUnitX = 14.0
)

// niceAxis is the top of a y axis for values up to v: the smallest of 1,
// 2 or 5 × 10ⁿ at or above it, and at least 5 (counts are whole), with
// the number of steps that divides it into round numbers: 1 and 5 × 10ⁿ
// into 5, 2 × 10ⁿ into 4.
func niceAxis(v float64) (top float64, steps int) {
	v = max(v, 5)
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			if m == 2 {
				return m * p, 4
			}
			return m * p, 5
		}
	}
	return 10 * p, 5 // unreachable: 10 × p > v
}

// timeTickSpacings are the time axis' round spacings, the shortest first:
// each ends on the clock's round minutes and hours.
var timeTickSpacings = []time.Duration{
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 4 * time.Hour, 6 * time.Hour, 12 * time.Hour,
}

// maxTimeTicks is the most labels a time axis gets: about six, like an
// hour in 10 minutes and a day in 4 hours, at least 130 units apart on
// the plot's 1,040 (a label, "15:04", is about 32 wide).
const maxTimeTicks = 7

// timeTicks are the times a time axis labels for points from first to
// last, step apart: every multiple of the shortest round spacing (a whole
// number of steps) that puts no more than maxTimeTicks in the span. An
// axis needs two labels to read as a scale; where fewer round times fall
// in the span (a few minutes, or buckets that start on no round time),
// its ends are labelled instead.
func timeTicks(first, last time.Time, step time.Duration) []time.Time {
	for _, every := range timeTickSpacings {
		if every < step || every%step != 0 {
			continue
		}
		var ticks []time.Time
		for t := first.Truncate(every); !t.After(last); t = t.Add(every) {
			if !t.Before(first) {
				ticks = append(ticks, t)
			}
		}
		if len(ticks) > maxTimeTicks {
			continue
		}
		if len(ticks) < 2 {
			break
		}
		return ticks
	}
	return []time.Time{first, last}
}

// countChart is a chart of counts over time: a line for each series of
// counts, the points evenly spaced, oldest first, the last holding the
// current minute (still filling).
type countChart struct {
	label string        // what it shows, for a screen reader
	times []time.Time   // the start of each point's span
	step  time.Duration // the span of a point: a minute, or a bucket of minutes
	lines []countLine
}

// countLine is one line of a countChart: its class (its colour), its
// name in the legend, and a value for each point.
type countLine struct {
	class, name string
	values      []int64
}

// countChartSVG draws a countChart: one line a series over a time axis
// (UTC) and a y axis in counts per point's span, with gridlines at round
// numbers and a legend that gives each line's total over the chart.
func countChartSVG(c countChart) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="dchart" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">`, dchartW, dchartH, template.HTMLEscapeString(c.label))
	if len(c.times) < 2 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">no minutes to draw</text></svg>`, dchartLeft, dchartH/2)
		return template.HTML(b.String()) // constant text and numbers only
	}
	first := firstWithData(len(c.times), func(i int) bool {
		for _, l := range c.lines {
			if l.values[i] != 0 {
				return true
			}
		}
		return false
	})
	if first == len(c.times) {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">nothing recorded in this window</text></svg>`, dchartLeft, dchartH/2)
		return template.HTML(b.String()) // constant text and numbers only
	}
	first = min(first, len(c.times)-2)
	c.times = c.times[first:]
	lines := make([]countLine, len(c.lines))
	for i, l := range c.lines {
		lines[i] = countLine{class: l.class, name: l.name, values: l.values[first:]}
	}
	c.lines = lines
	drawCounts(&b, c, first > 0)
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers, times, constant text and the escaped label only
}

// drawCounts draws c's axes, lines and legend; trimmed, c starts at its
// window's first point with data.
//
// The last point is the current minute (or the bucket that holds it),
// still filling: drawn, its count would plunge every line as if delivery
// had stopped. As Grafana leaves out a partial bucket, the lines leave it
// out and end a step short of the axis, which runs to now; the y axis is
// scaled to what is drawn, the legend's totals count it (they match the
// statistics' table beside the chart), and the axis' unit says so.
func drawCounts(b *strings.Builder, c countChart, trimmed bool) {
	drawn := len(c.times) - 1
	var top float64 = 1
	totals := make([]int64, len(c.lines))
	for i, l := range c.lines {
		for j, v := range l.values {
			if j < drawn {
				top = max(top, float64(v))
			}
			totals[i] += v
		}
	}
	top, steps := niceAxis(top)
	x := func(i float64) float64 { return dchartLeft + dchartPlotW*i/float64(len(c.times)-1) }
	y := func(v float64) float64 { return dchartTop + dchartPlotH*(1-v/top) }

	// The y axis: gridlines and labels at round numbers, and its unit.
	for i := 0; i <= steps; i++ {
		v := top * float64(i) / float64(steps)
		fmt.Fprintf(b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, dchartLeft, y(v), dchartW-dchartRight, y(v))
		fmt.Fprintf(b, `<text class="ylabel" x="%.1f" y="%.1f" text-anchor="end">%s</text>`, dchartLeft-6, y(v)+4, formatCount(v))
	}
	yUnit(b, "per "+spanName(c.step))
	timeAxis(b, c.times, c.step, trimmed, false, x, y(0))

	var legendEntries []legendEntry
	for i, l := range c.lines {
		fmt.Fprintf(b, `<polyline class="%s" points="`, l.class)
		for j, v := range l.values[:drawn] {
			fmt.Fprintf(b, "%.1f,%.1f ", x(float64(j)), y(float64(v)))
		}
		if drawn == 1 {
			// One whole point: a segment of length zero, which the
			// line's round cap draws as a dot.
			fmt.Fprintf(b, "%.1f,%.1f ", x(0), y(float64(l.values[0])))
		}
		b.WriteString(`"/>`)
		legendEntries = append(legendEntries, legendEntry{l.class, fmt.Sprintf("%s: %d", l.name, totals[i])})
	}
	legend(b, legendEntries)
}

// spanName names a point's span for the axes' units: "minute",
// "15 minutes".
func spanName(step time.Duration) string {
	if step == time.Minute {
		return "minute"
	}
	return fmt.Sprintf("%d minutes", int(step/time.Minute))
}

// deliveryChartSVG draws a series of per-minute produced, delivered and
// failed counts: deliveries per minute, one line each.
func deliveryChartSVG(series []statsMinute, label string) template.HTML {
	c := countChart{label: label, times: seriesTimes(series), step: time.Minute, lines: []countLine{
		{class: "produced", name: "produced"},
		{class: "delivered", name: "delivered (2xx)"},
		{class: "failed", name: "failed attempts"},
	}}
	for _, m := range series {
		c.lines[0].values = append(c.lines[0].values, m.Produced)
		c.lines[1].values = append(c.lines[1].values, m.Delivered)
		c.lines[2].values = append(c.lines[2].values, m.Failed)
	}
	return countChartSVG(c)
}

// inboxChartSVG draws a source's series (inbox.go): the webhooks it
// received new, its duplicates and its refusals, per point's span.
func inboxChartSVG(st InboxStats, label string) template.HTML {
	c := countChart{label: label, step: time.Duration(st.SeriesStepMinutes) * time.Minute, lines: []countLine{
		{class: "received", name: "received (new)"},
		{class: "duplicates", name: "duplicates"},
		{class: "refused", name: "refused"},
	}}
	for _, p := range st.Series {
		c.times = append(c.times, p.From)
		c.lines[0].values = append(c.lines[0].values, p.Received)
		c.lines[1].values = append(c.lines[1].values, p.Duplicates)
		c.lines[2].values = append(c.lines[2].values, p.Refused)
	}
	return countChartSVG(c)
}

// seriesTimes is the minute of each point of a delivery series.
func seriesTimes(series []statsMinute) []time.Time {
	times := make([]time.Time, len(series))
	for i, m := range series {
		times[i] = m.Minute
	}
	return times
}

// formatCount writes an axis value: whole numbers as such, others with
// one decimal.
func formatCount(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// firstWithData is the first of n points that has data (has), n when
// none has: a chart starts there, so that the minutes before a service
// started, or before anything happened in the window, are not drawn as
// zeros, nor a young service's first hour squeezed into a day's last
// pixels.
func firstWithData(n int, has func(int) bool) int {
	for i := range n {
		if has(i) {
			return i
		}
	}
	return n
}

// yUnit writes the y axis' unit along the axis, turned, in the left
// margin: clear of the top tick's label and of the legend above the plot.
func yUnit(b *strings.Builder, unit string) {
	fmt.Fprintf(b, `<text class="unit" transform="translate(%.1f %.1f) rotate(-90)" text-anchor="middle">%s</text>`,
		dchartUnitX, dchartTop+dchartPlotH/2, unit)
}

// timeAxis draws the x axis of a series of points step apart at height
// y0: a labelled tick at each of timeTicks' UTC times (between two points
// when the points are buckets that do not start on it), and its unit; trimmed,
// the window's start was cut to its first point with data, and the unit
// says so. lastDrawn says whether the chart draws its last point, the
// current minute, still filling (drawCounts does not).
func timeAxis(b *strings.Builder, times []time.Time, step time.Duration, trimmed, lastDrawn bool, x func(float64) float64, y0 float64) {
	first := times[0]
	fmt.Fprintf(b, `<line class="axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, dchartLeft, y0, dchartW-dchartRight, y0)
	for _, t := range timeTicks(first, times[len(times)-1], step) {
		i := float64(t.Sub(first)) / float64(step)
		fmt.Fprintf(b, `<line class="tick" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, x(i), y0, x(i), y0+5)
		fmt.Fprintf(b, `<text class="xlabel" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x(i), y0+18, t.UTC().Format("15:04"))
	}
	points := "one point a minute; the current minute, still filling, is not drawn"
	switch {
	case lastDrawn: // the latency chart's, a point a minute
		points = "one point a minute; the last is the current minute"
	case step != time.Minute:
		points = "one point per " + spanName(step) + "; the current one, still filling, is not drawn"
	}
	from := ""
	if trimmed {
		from = " from " + first.UTC().Format("15:04") + ", the first minute with data"
	}
	fmt.Fprintf(b, `<text class="unit" x="%.1f" y="%.1f" text-anchor="end">time (UTC)%s, %s</text>`,
		dchartW-dchartRight, dchartH-6, from, points)
}

// legendEntry is one line of a chart's legend: its class (the line's
// colour) and its text.
type legendEntry struct{ class, text string }

// legend draws a swatch and a text for each entry, in a row above the plot.
func legend(b *strings.Builder, entries []legendEntry) {
	for i, l := range entries {
		lx := dchartLeft + float64(i)*dchartLegendGap
		fmt.Fprintf(b, `<line class="%s" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, l.class, lx, dchartLegendY-4, lx+18, dchartLegendY-4)
		fmt.Fprintf(b, `<text class="legend" x="%.1f" y="%.1f">%s</text>`, lx+24, dchartLegendY, l.text)
	}
}

// latencyTicks label the latency chart's logarithmic axis.
var latencyTicks = []struct {
	ms    float64
	label string
}{{1, "1 ms"}, {10, "10 ms"}, {100, "100 ms"}, {1000, "1 s"}, {10_000, "10 s"}, {60_000, "1 min"}, {600_000, "10 min"}, {3_600_000, "1 h"}}

// latencyChartSVG draws the per-minute p50 and p99 commit→first-2xx
// latency of a series on a logarithmic axis from 1 ms to 1 h. A value is
// the bound of the bucket the percentile fell in (stats.go), so the lines
// step between bounds; a minute without a success has no point, and the
// line breaks there.
func latencyChartSVG(series []statsMinute, label string) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="dchart" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">`, dchartW, dchartH, template.HTMLEscapeString(label))
	if len(series) < 2 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">no minutes to draw</text></svg>`, dchartLeft, dchartH/2)
		return template.HTML(b.String()) // constant text and numbers only
	}
	first := firstWithData(len(series), func(i int) bool { return series[i].LatencyP50MS != nil || series[i].LatencyP99MS != nil })
	if first == len(series) {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">no delivery succeeded in this window</text></svg>`, dchartLeft, dchartH/2)
		return template.HTML(b.String()) // constant text and numbers only
	}
	first = min(first, len(series)-2)
	series = series[first:]
	lo, hi := math.Log10(1), math.Log10(3_600_000)
	x := func(i float64) float64 { return dchartLeft + dchartPlotW*i/float64(len(series)-1) }
	y := func(ms float64) float64 {
		v := math.Log10(min(max(ms, 1), 3_600_000))
		return dchartTop + dchartPlotH*(1-(v-lo)/(hi-lo))
	}
	for _, t := range latencyTicks {
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, dchartLeft, y(t.ms), dchartW-dchartRight, y(t.ms))
		fmt.Fprintf(&b, `<text class="ylabel" x="%.1f" y="%.1f" text-anchor="end">%s</text>`, dchartLeft-6, y(t.ms)+4, t.label)
	}
	yUnit(&b, "commit → first 2xx (log)")
	// The current minute is drawn: a percentile of its deliveries so far
	// is of fewer of them, not smaller, and does not plunge as a count does.
	timeAxis(&b, seriesTimes(series), time.Minute, first > 0, true, x, y(1))
	path := func(class string, value func(statsMinute) *float64) {
		fmt.Fprintf(&b, `<path class="%s" d="`, class)
		move := true
		for i, m := range series {
			v := value(m)
			if v == nil {
				move = true
				continue
			}
			if move {
				// A point with no neighbour still shows: a round cap
				// draws the zero-length segment as a dot.
				fmt.Fprintf(&b, "M%.1f,%.1f l0,0 ", x(float64(i)), y(*v))
				move = false
				continue
			}
			fmt.Fprintf(&b, "L%.1f,%.1f ", x(float64(i)), y(*v))
		}
		b.WriteString(`"/>`)
	}
	path("p99", func(m statsMinute) *float64 { return m.LatencyP99MS })
	path("p50", func(m statsMinute) *float64 { return m.LatencyP50MS })
	legend(&b, []legendEntry{{"p50", "p50 (median)"}, {"p99", "p99"}})
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers, times, constant text and the escaped label only
}
