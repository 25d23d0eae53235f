// pages.go: how the panel's pages are rendered: the templates and the
// stylesheet, embedded in the binary, the functions the templates call,
// and render, below the handlers that fill the pages (panel.go).

package main

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// panel renders the pages. Templates are parsed once, at start; a page is
// executed into a buffer and written only when it rendered completely.
type panel struct {
	pages  map[string]*template.Template
	logger *slog.Logger
}

// pageNames are the templates that are pages; each is parsed with the
// layout and the shared job table.
var pageNames = []string{"login", "error", "overview", "events", "event", "jobs", "endpoints", "endpoint", "subjects", "sources",
	"signin", "signin-link", "audit", "delivery", "owners", "confirm",
	"topics", "owner-events"}

// newPanel parses every page's templates: one that does not parse stops
// the start rather than the first request for it.
// An answer longer than answerShownLen bytes or answerShownLines lines
// is shown cut, on one line, with the whole of it one click away: a
// receiver's error page must not push the next row off the screen.
const (
	answerShownLen   = 160
	answerShownLines = 6
)

// attemptAnswer is what a failed attempt's answer column shows: the
// answer's start as stored, else the one its error quotes, unquoted and
// indented when it is JSON; shown once, not in the error beside it too.
func attemptAnswer(errText, excerpt string) string {
	if excerpt == "" {
		_, excerpt = splitAttemptError(errText)
	}
	return prettyBody(excerpt)
}

func newPanel(logger *slog.Logger) (*panel, error) {
	funcs := template.FuncMap{
		"rfc3339": func(t any) string {
			if tt := asTime(t); !tt.IsZero() {
				return tt.UTC().Format(time.RFC3339)
			}
			return ""
		},
		"ago":       func(t any) string { return ago(asTime(t), time.Now()) },
		"clock":     func(t any) string { return asTime(t).UTC().Format("2006-01-02 15:04:05 UTC") },
		"minute":    func(t any) string { return asTime(t).UTC().Format("15:04") },
		"seconds":   seconds,
		"bytes":     formatBytes,
		"percent":   func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" },
		"rate":      func(part, whole int64) float64 { return float64(part) / float64(whole) },
		"latency":   formatLatencyMS,
		"jobErrors": viewJobErrors,
		"payload":   func(raw []byte) string { return prettyBody(string(raw)) },
		"cause":     attemptCause,
		"brief":     briefCause,
		"answer":    attemptAnswer,
		"long":      func(s string) bool { return len(s) > answerShownLen || strings.Count(s, "\n") > answerShownLines },
		"short":     func(s string) string { return truncate(strings.Join(strings.Fields(s), " "), answerShownLen) },
		"join":      strings.Join,
		"timeInput": func(name, label, value string, required bool) timeField {
			return timeField{Name: name, Label: label, Value: value, Required: required, Pattern: timeInputPattern}
		},
		"build": readBuildInfo().String, // the same line as outboxd version
	}
	p := &panel{pages: map[string]*template.Template{}, logger: logger}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS,
			"templates/layout.html", "templates/jobs.html", "templates/stats.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("parse panel template %s: %w", name, err)
		}
		p.pages[name] = t
	}
	return p, nil
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	SignedIn bool
	Flash    string
	Data     any
	// Portal is the name of the owner signed in (docs/owners.md), whose
	// pages show only the owner's own; "" for the admin. render sets it.
	Portal string
}

// portalWriter is the ResponseWriter of a request signed in as an owner,
// which tells render whose portal the page is: the layout's navigation
// shows that owner only the pages it may see.
type portalWriter struct {
	http.ResponseWriter
	owner string
}

func (w portalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// portalOf is the owner w's page is for, found through the writers
// wrapping it; "" for the admin's.
func portalOf(w http.ResponseWriter) string {
	for {
		switch v := w.(type) {
		case portalWriter:
			return v.owner
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return ""
		}
	}
}

// render executes page name with pg and answers it with status.
func (p *panel) render(w http.ResponseWriter, status int, name string, pg page) {
	pg.Portal = portalOf(w)
	var buf bytes.Buffer
	if err := p.pages[name].ExecuteTemplate(&buf, "layout", pg); err != nil {
		p.logger.Error("render panel page", "page", name, "err", err)
		http.Error(w, "render page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	buf.WriteTo(w)
}

// renderError shows an error on a page of its own, keeping the layout.
func (p *panel) renderError(w http.ResponseWriter, status int, err error) {
	p.render(w, status, "error", page{Title: "Error", SignedIn: true, Data: err.Error()})
}

// jobError is one entry of a job's errors column.
type jobError struct {
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	Error   string    `json:"error"`
}

func decodeJobErrors(raw json.RawMessage) []jobError {
	var errs []jobError
	json.Unmarshal(raw, &errs) // written by outboxd's own SQL; a bad value shows as none
	return errs
}

// jobErrorRun is attempts First to Last of a job, in a row, that failed
// with one cause (the error without the answer it quotes), the last of
// them at At: eighteen attempts against a dead receiver are one line.
type jobErrorRun struct {
	First, Last int
	At          time.Time
	Cause       string
}

// jobErrorsView is a job's errors as its row shows them: the runs of one
// cause, and the last attempt's answer once, unescaped (attemptAnswer).
type jobErrorsView struct {
	Runs   []jobErrorRun
	Answer string
}

func viewJobErrors(raw json.RawMessage) jobErrorsView {
	var v jobErrorsView
	errs := decodeJobErrors(raw)
	for _, e := range errs {
		cause := attemptCause(e.Error)
		if n := len(v.Runs); n > 0 && v.Runs[n-1].Cause == cause {
			v.Runs[n-1].Last, v.Runs[n-1].At = e.Attempt, e.At
			continue
		}
		v.Runs = append(v.Runs, jobErrorRun{First: e.Attempt, Last: e.Attempt, At: e.At, Cause: cause})
	}
	if len(errs) > 0 {
		v.Answer = attemptAnswer(errs[len(errs)-1].Error, "")
	}
	return v
}

func asTime(v any) time.Time {
	switch t := v.(type) {
	case time.Time:
		return t
	case *time.Time:
		if t != nil {
			return *t
		}
	}
	return time.Time{}
}

// ago is a relative time for people: "3m ago", "in 5m".
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "—"
	}
	if d := now.Sub(t); d >= 0 {
		return roughDuration(d) + " ago"
	} else {
		return "in " + roughDuration(-d)
	}
}

// roughDuration is a duration for people, in its two largest units with
// a zero second unit left out: "45s", "1m 30s", "3h 5m", "7d 23h" (a
// dedup window of 687600 s). Every duration the panel shows goes through
// it, so one page never says "191h0m0s" while another says "7d".
func roughDuration(d time.Duration) string {
	const day = 24 * time.Hour
	two := func(big int64, bigUnit string, small int64, smallUnit string) string {
		if small == 0 {
			return fmt.Sprintf("%d%s", big, bigUnit)
		}
		return fmt.Sprintf("%d%s %d%s", big, bigUnit, small, smallUnit)
	}
	switch {
	case d < time.Second:
		return "<1s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int64(d/time.Second))
	case d < time.Hour:
		return two(int64(d/time.Minute), "m", int64(d%time.Minute/time.Second), "s")
	case d < day:
		return two(int64(d/time.Hour), "h", int64(d%time.Hour/time.Minute), "m")
	default:
		return two(int64(d/day), "d", int64(d%day/time.Hour), "h")
	}
}

// seconds is roughDuration of a count of seconds, as the overview and
// the endpoints keep them (a nil pointer: none, "—").
func seconds(v any) string {
	switch s := v.(type) {
	case float64:
		return roughDuration(time.Duration(s * float64(time.Second)))
	case int64:
		return roughDuration(time.Duration(s) * time.Second)
	case *int64:
		if s != nil {
			return roughDuration(time.Duration(*s) * time.Second)
		}
	}
	return "—"
}

func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// The panel's one way to type a time: UTC, 24-hour, "2026-05-01 14:30"
// (seconds optional), in a plain text field every page draws with the
// "timeinput" template: a browser's own date picker shows 12-hour times in
// its local zone, and RFC 3339 is not for typing at night.
const (
	timeInputLayout  = "2006-01-02 15:04"
	timeInputPattern = `\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2})?`
)

// timeInputLayouts are what parseTimeInput reads: the field as typed,
// with or without seconds, with a T as a datetime-local field sends it,
// and RFC 3339 as the panel's own hidden fields and links carry it.
var timeInputLayouts = []string{"2006-01-02 15:04:05", timeInputLayout, "2006-01-02T15:04:05", "2006-01-02T15:04", time.RFC3339Nano}

// parseTimeInput reads the time field name, in UTC unless it says
// otherwise; a refusal (errInvalid: a 400 page) names the field.
func parseTimeInput(name, s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	for _, layout := range timeInputLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: %s %q is not a UTC time such as 2026-05-01 14:30", errInvalid, name, s)
}

// timeInputValue is t as a time field shows it back: UTC, to the minute
// unless it has seconds; "" when zero.
func timeInputValue(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	t = t.UTC()
	if t.Second() != 0 || t.Nanosecond() != 0 {
		return t.Format("2006-01-02 15:04:05")
	}
	return t.Format(timeInputLayout)
}

// timeField is one time input as the "timeinput" template draws it.
type timeField struct {
	Name, Label, Value string
	Required           bool
	Pattern            string
}
