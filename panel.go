// panel.go: the operator's panel, server-rendered HTML that works without
// JavaScript: one handler a page or a button, in the order routes
// (admin.go) lists them, rendered by pages.go.

package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// flash is the message an action left for the page it redirected to.
func flash(r *http.Request) string { return queryOf(r).text("done") }

// handleOverview is GET /: the overview, and every endpoint's delivery
// statistics with their charts. It is the admin's; an owner who types
// the panel's address lands on its endpoints, where signing in took it
// (homeOf), rather than on a refusal.
func (p *panel) handleOverview(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if !principalOf(r).admin {
			http.Redirect(w, r, "/endpoints", http.StatusSeeOther)
			return nil
		}
		o, err := a.overview(r.Context())
		if err != nil {
			return err
		}
		deliveries, err := readStatsWindows(r.Context(), a.db, 0)
		if err != nil {
			return err
		}
		p.render(w, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", SignedIn: true,
			Flash: flash(r),
			Data: struct {
				Overview   Overview
				Deliveries []statsWindowView
			}{o, deliveries}})
		return nil
	}
}

// handleEvents is GET /events: the stream, filtered, a page at a time.
func (p *panel) handleEvents(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		rq, err := withTimeInputs(r, "since", "until")
		if err != nil {
			return err
		}
		pg, err := readEventPage(rq, a.db)
		if err != nil {
			return err
		}
		if pg.filter.Owner != 0 {
			return p.renderOwnerEvents(w, r, a, pg)
		}
		badges, err := readOutcomeBadges(r.Context(), a.db, pg.rows)
		if err != nil {
			return err
		}
		p.render(w, http.StatusOK, "events", page{Title: "Events", Nav: "events", SignedIn: true,
			Flash: flash(r),
			Data: struct {
				Filter       EventFilter
				States       []string
				Outcomes     []string
				Events       []Event
				Badges       map[int64][]outcomeBadge
				Newer, Older string
				Since, Until string
			}{pg.filter, []string{"", "unfanned", "fanned", "poisoned"}, []string{"", "delivered", "failed", "pending"},
				pg.rows, badges, pageLink(r, "after", pg.after), pageLink(r, "before", pg.before),
				timeInputValue(pg.filter.Since), timeInputValue(pg.filter.Until)}})
		return nil
	}
}

// renderOwnerEvents is the portal's events page: an owner's search of
// the events its endpoints were sent, each linked to its endpoint's page
// of the event (handleEndpointEventPage), without the admin's state,
// outcome and requeue.
func (p *panel) renderOwnerEvents(w http.ResponseWriter, r *http.Request, a *admin, pg idPage[EventFilter, Event]) error {
	links, err := ownerEventLinks(r.Context(), a.db, pg.filter.Owner, pg.rows)
	if err != nil {
		return err
	}
	p.render(w, http.StatusOK, "owner-events", page{Title: "Events", Nav: "events", SignedIn: true,
		Data: struct {
			Filter       EventFilter
			Events       []Event
			Links        map[int64]int64
			Newer, Older string
			Since, Until string
		}{pg.filter, pg.rows, links, pageLink(r, "after", pg.after), pageLink(r, "before", pg.before),
			timeInputValue(pg.filter.Since), timeInputValue(pg.filter.Until)}})
	return nil
}

// pageLink is the panel's link to a neighbouring page of a list that pages
// both ways: this page's query with cursor (before or after) set to id and
// the other cursor dropped; "" when id is 0 (no such page).
func pageLink(r *http.Request, cursor string, id int64) string {
	if id == 0 {
		return ""
	}
	q := r.URL.Query()
	q.Del("before")
	q.Del("after")
	q.Set(cursor, strconv.FormatInt(id, 10))
	return r.URL.Path + "?" + q.Encode()
}

// withTimeInputs is r with its time parameters (names) as the API reads
// them, RFC 3339: the panel's fields take them as timeinput types them.
// One that does not read as a time is refused naming its field.
func withTimeInputs(r *http.Request, names ...string) (*http.Request, error) {
	q := r.URL.Query()
	for _, name := range names {
		if s := q.Get(name); s != "" {
			t, err := parseTimeInput(name, s)
			if err != nil {
				return nil, err
			}
			q.Set(name, t.Format(time.RFC3339Nano))
		}
	}
	r2 := r.Clone(r.Context())
	r2.URL.RawQuery = q.Encode()
	return r2, nil
}

// olderLink is the panel's link to the page after this one: this page's
// query with ?before=, when the page is full and so may have more behind
// it. Full is max(limit, defaultPageSize) rows: the page size without
// ?limit= (0) or with a larger one. The panel's own links set no ?limit=;
// a smaller one typed into the address gets no link.
func (pg idPage[F, T]) olderLink(r *http.Request, limit int) string {
	if pg.before == 0 || len(pg.rows) != max(limit, defaultPageSize) {
		return ""
	}
	q := r.URL.Query()
	q.Set("before", strconv.FormatInt(pg.before, 10))
	return r.URL.Path + "?" + q.Encode()
}

// handleEvent is GET /events/{id}: one event and every job it made.
func (p *panel) handleEvent(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		ev, err := readEventWithJobs(r.Context(), a.db, id)
		if err != nil {
			return err
		}
		p.render(w, http.StatusOK, "event", page{Title: fmt.Sprintf("Event %d", id), Nav: "events", SignedIn: true,
			Flash: flash(r), Data: ev})
		return nil
	}
}

// handleRequeue is POST /events/{id}/requeue.
func (p *panel) handleRequeue(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err == nil {
			err = requeueEvent(r.Context(), a.db, id)
		}
		if err != nil {
			return err
		}
		http.Redirect(w, r, fmt.Sprintf("/events/%d?done=%s", id, url.QueryEscape("Requeued: the relay will pick it up now.")), http.StatusSeeOther)
		return nil
	}
}

// handleAcknowledgeAlert is POST /alerts/{name}/acknowledge: the button
// beside a firing alert on the overview.
func (p *panel) handleAcknowledgeAlert(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		name, err := pathText(r, "name")
		if err == nil {
			_, err = acknowledgeAlert(r.Context(), a.db, a.alerts, name)
		}
		if err != nil {
			return err
		}
		http.Redirect(w, r, "/?done="+url.QueryEscape(fmt.Sprintf("Alert %s acknowledged: it fires again if it gets worse.", name)), http.StatusSeeOther)
		return nil
	}
}

// handleJobs is GET /jobs: jobs by state, a page at a time.
func (p *panel) handleJobs(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		pg, err := readJobPage(r, a.db)
		if err != nil {
			return err
		}
		counts, err := countJobStates(r.Context(), a.db, pg.filter.EndpointID)
		if err != nil {
			return err
		}
		endpointName, err := filterEndpointName(r.Context(), a.db, pg.filter.EndpointID)
		if err != nil {
			return err
		}
		var groups DiscardedGroups
		if jobState(pg.filter.State) == jobDiscarded {
			if groups, err = listDiscardedGroups(r.Context(), a.db, pg.filter.EndpointID); err != nil {
				return err
			}
		}
		p.render(w, http.StatusOK, "jobs", page{Title: "Jobs", Nav: "jobs", SignedIn: true,
			Flash: flash(r),
			Data: struct {
				Filter       JobFilter
				EndpointName string
				States       []jobStateCount
				Discarded    DiscardedGroups
				Jobs         []JobView
				Next         string
			}{pg.filter, endpointName, counts, groups, pg.rows, pg.olderLink(r, pg.filter.Limit)}})
		return nil
	}
}

// filterEndpointName is the name of the endpoint the jobs list is
// filtered to (id; 0: none, ""): its description, else its URL; one
// deleted since keeps its jobs, and is named by its id.
func filterEndpointName(ctx context.Context, db *sql.DB, id int64) (string, error) {
	if id == 0 {
		return "", nil
	}
	ep, err := getEndpoint(ctx, db, id)
	if errors.Is(err, errNotFound) {
		return fmt.Sprintf("endpoint %d (deleted)", id), nil
	}
	if err != nil {
		return "", err
	}
	return ep.Name(), nil
}

// jobStateCount is one state link of the jobs page: the state ("" for
// all) and how many jobs it holds, up to jobStateCountCap (Capped: more).
type jobStateCount struct {
	State  string
	Count  int64
	Capped bool
}

// jobStateCountCap bounds each state's count on the jobs page: a day of
// completed jobs may be millions, and "10000+" says enough.
const jobStateCountCap = 10000

// jobStateCountsSQL counts the jobs of each state, of endpoint $1 (0:
// any), each count reading at most $2 rows: the completed ones in the
// history, where a delivered job stands (jobRowsSQL), and those of the
// queue.
const jobStateCountsSQL = `
SELECT s.state::text,
       (SELECT count(*)
        FROM (SELECT 1
              FROM outbox.jobs AS j
              WHERE j.state = s.state
                AND ($1::bigint = 0 OR j.endpoint_id = $1::bigint)
              UNION ALL
              SELECT 1
              FROM outbox.deliveries AS d
              WHERE s.state = 'completed' AND d.outcome = 'completed'
                AND ($1::bigint = 0 OR d.endpoint_id = $1::bigint)
              LIMIT $2) AS c)
FROM unnest(ARRAY['available', 'running', 'retryable', 'completed', 'discarded']::outbox.job_state[]) WITH ORDINALITY AS s (state, n)
ORDER BY s.n`

// countJobStates reads the jobs page's state links: all first, then each
// state in the order a job passes through them.
func countJobStates(ctx context.Context, db *sql.DB, endpointID int64) ([]jobStateCount, error) {
	states, err := queryAll(ctx, db, func(row rowScanner) (jobStateCount, error) {
		var c jobStateCount
		err := row.Scan(&c.State, &c.Count)
		c.Capped = c.Count >= jobStateCountCap
		return c, err
	}, jobStateCountsSQL, endpointID, jobStateCountCap)
	if err != nil {
		return nil, fmt.Errorf("count jobs by state: %w", err)
	}
	all := jobStateCount{}
	for _, c := range states {
		all.Count += c.Count
		all.Capped = all.Capped || c.Capped
	}
	return append([]jobStateCount{all}, states...), nil
}

// handleRetry is POST /jobs/{id}/retry.
func (p *panel) handleRetry(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err == nil {
			err = retryJob(r.Context(), a.db, id, a.eventsRetention, a.maxAttempts)
		}
		if err != nil {
			return err
		}
		http.Redirect(w, r, "/jobs?done="+url.QueryEscape(fmt.Sprintf("Job %d will run now.", id)), http.StatusSeeOther)
		return nil
	}
}

// handleRetryEveryDiscarded is POST /jobs/retry-discarded, the buttons of
// the job list filtered to discarded jobs: one a group (its endpoint_id,
// or without_endpoint, and its error as form fields) retries that group;
// the one without fields, every discarded job. The list says what it did.
func (p *panel) handleRetryEveryDiscarded(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		form := formOf(w, r, maxEndpointForm)
		f := DiscardedFilter{EndpointID: form.natural("endpoint_id"), WithoutEndpoint: form.text("without_endpoint") != ""}
		if form.values.Has("error") {
			e := form.text("error")
			f.Error = &e
		}
		if form.err != nil {
			return form.err
		}
		res, err := retryEveryDiscarded(r.Context(), a.db, f, a.eventsRetention, a.maxAttempts)
		if err != nil {
			return err
		}
		var skipped []int64
		for _, e := range res.Endpoints {
			if e.Skipped > 0 {
				skipped = append(skipped, e.EndpointID)
			}
		}
		names, err := endpointNames(r.Context(), a.db, skipped, nil)
		if err != nil {
			return err
		}
		http.Redirect(w, r, "/jobs?state=discarded&done="+url.QueryEscape(res.summary(names)), http.StatusSeeOther)
		return nil
	}
}

// summary is what a retry of every discarded job did, as the panel says
// it, each endpoint by its name (names; one deleted since by its id).
func (res BulkRetryResult) summary(names map[int64]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d discarded jobs will be sent again: %d deliveries to %d endpoints and %d jobs of no endpoint.",
		res.Jobs, res.Jobs-res.WithoutEndpoint, len(res.Endpoints), res.WithoutEndpoint)
	if res.Skipped > 0 {
		fmt.Fprintf(&b, " %d deliveries stay discarded: their events are too old to send again safely:", res.Skipped)
		for _, e := range res.Endpoints {
			if e.Skipped == 0 {
				continue
			}
			if name, found := names[e.EndpointID]; found {
				fmt.Fprintf(&b, " %q, %d;", name, e.Skipped)
			} else {
				fmt.Fprintf(&b, " endpoint %d (deleted), %d;", e.EndpointID, e.Skipped)
			}
		}
		b.WriteString(" each endpoint's page says why.")
	}
	return b.String()
}

// handleEndpoints is GET /endpoints, with the form for a new one.
func (p *panel) handleEndpoints(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		return p.renderEndpoints(w, r, a, http.StatusOK, flash(r), endpointFields{}, "")
	}
}

// renderEndpoints lists the endpoints above the form for a new one, which
// shows form as typed and, after a refusal, why (formError).
func (p *panel) renderEndpoints(w http.ResponseWriter, r *http.Request, a *admin, status int, flash string, form endpointFields, formError string) error {
	rows, err := readEndpointRows(r.Context(), a.db, a.alerts)
	if err != nil {
		return err
	}
	p.render(w, status, "endpoints", page{Title: "Endpoints", Nav: "endpoints", SignedIn: true,
		Flash: flash,
		Data: struct {
			Endpoints []endpointRow
			Form      endpointFields
			FormError string
			Bounds    deliveryBounds
			CountCap  int64
		}{rows, form, formError, endpointBounds(), summaryCountCap}})
	return nil
}

// endpointRow is one line of the endpoints list: the endpoint, how it
// is doing, and its owner's name ("" for none).
type endpointRow struct {
	Endpoint
	Summary   EndpointSummary
	OwnerName string
}

func readEndpointRows(ctx context.Context, db *sql.DB, cfg AlertConfig) ([]endpointRow, error) {
	eps, err := listEndpointsFor(ctx, db, 0, maxEndpointPage)
	if err != nil {
		return nil, err
	}
	if err := withHealth(ctx, db, cfg, eps); err != nil {
		return nil, err
	}
	ids := make([]int64, len(eps))
	for i, e := range eps {
		ids[i] = e.ID
	}
	sums, err := readEndpointSummaries(ctx, db, ids)
	if err != nil {
		return nil, err
	}
	names, err := readOwnerNames(ctx, db, eps)
	if err != nil {
		return nil, err
	}
	rows := make([]endpointRow, len(eps))
	for i, e := range eps {
		rows[i] = endpointRow{Endpoint: e, Summary: sums[e.ID]}
		if e.OwnerID != nil {
			rows[i].OwnerName = names[*e.OwnerID]
		}
	}
	// Triage order: the endpoints in trouble on top, the rest by id.
	slices.SortStableFunc(rows, func(a, b endpointRow) int { return cmp.Compare(a.triageRank(), b.triageRank()) })
	return rows, nil
}

// ListState is the state the endpoints list and the Owners page show:
// State, with a failing endpoint told failing or degraded as its Health
// says (withHealth).
func (e Endpoint) ListState() string {
	if e.State == endpointFailing {
		return e.Health
	}
	return e.State
}

// triageRank orders the endpoints list: failing first, then degraded (as
// the list's state column tells them, withHealth's health of an endpoint
// neither paused nor disabled), then every other.
func (e endpointRow) triageRank() int {
	switch {
	case e.State != endpointFailing:
		return 2
	case e.Health == healthFailing:
		return 0
	}
	return 1
}

// readOwnerNames is the name of each owner of eps, by id.
func readOwnerNames(ctx context.Context, db *sql.DB, eps []Endpoint) (map[int64]string, error) {
	var ids []int64
	for _, e := range eps {
		if e.OwnerID != nil {
			ids = append(ids, *e.OwnerID)
		}
	}
	return ownerNames(ctx, db, ids)
}

// maxEndpointForm bounds the body of every form on the endpoint pages.
const maxEndpointForm = 64 << 10

// endpointFields are the endpoint form's fields as typed: read from the
// form, or an endpoint's own for its edit form. A refused form is shown
// again with them, so nothing typed is lost.
type endpointFields struct {
	URL, Topics, Description, OwnerEmail string
	// MaxInFlight empty is the default on create and no change on edit;
	// RateLimitPerSecond empty is no limit, and on edit removes one.
	MaxInFlight, RateLimitPerSecond string
	// Ordering is "subject" or "none"; empty (a form without it) is none
	// on create and no change on edit.
	Ordering string
	// Signature is "v1" or "v1a"; empty (a form without it) is v1 on
	// create and no change on edit. A change is a switch, as the API's
	// PATCH makes it (switchSignature).
	Signature string
	// Filter empty is none: on edit, it removes the filter.
	Filter string
	// MaxAttempts, RetryWindowSeconds and TimeoutSeconds empty are the
	// service's defaults; Headers and SecretHeaders are one "Name: value"
	// a line, a secret's masked value keeping it (formHeaders).
	MaxAttempts, RetryWindowSeconds, TimeoutSeconds string
	Headers, SecretHeaders                          string
}

// deliveryBounds are the bounds the forms' number fields carry, so that a
// browser refuses what validate would; the server checks them regardless.
type deliveryBounds struct {
	DefaultMaxInFlight, MaxMaxInFlight      int
	MinRate, MaxRate                        float64
	MaxAttempts, MaxRetryWindow, MaxTimeout int
}

func endpointBounds() deliveryBounds {
	return deliveryBounds{defaultMaxInFlight, maxMaxInFlight, minRateLimit, maxRateLimit,
		maxEndpointAttempts, maxRetryWindowSeconds, maxEndpointTimeoutSeconds}
}

// readEndpointFields reads the endpoint form. Its error is the form's
// (too large, not text), which the error page shows; what the fields say
// is checked by input.
func readEndpointFields(f *query) (endpointFields, error) {
	fs := endpointFields{
		URL:                strings.TrimSpace(f.text("url")),
		Topics:             f.text("topics"),
		Description:        strings.TrimSpace(f.text("description")),
		OwnerEmail:         strings.TrimSpace(f.text("owner_email")),
		MaxInFlight:        strings.TrimSpace(f.text("max_in_flight")),
		RateLimitPerSecond: strings.TrimSpace(f.text("rate_limit_per_second")),
		Ordering:           strings.TrimSpace(f.text("ordering")),
		Signature:          strings.TrimSpace(f.text("signature")),
		Filter:             strings.TrimSpace(f.text("filter")),
		MaxAttempts:        strings.TrimSpace(f.text("max_attempts")),
		RetryWindowSeconds: strings.TrimSpace(f.text("retry_window_seconds")),
		TimeoutSeconds:     strings.TrimSpace(f.text("timeout_seconds")),
		Headers:            f.text("headers"),
		SecretHeaders:      f.text("secret_headers"),
	}
	return fs, f.err
}

// fieldsOf is endpoint e as its edit form shows it.
func fieldsOf(e Endpoint) endpointFields {
	fs := endpointFields{URL: e.URL, Topics: strings.Join(e.Topics, " "), Description: e.Description,
		OwnerEmail: e.OwnerEmail, MaxInFlight: strconv.Itoa(e.MaxInFlight), Ordering: e.Ordering, Signature: e.Signature}
	if e.Filter != nil {
		fs.Filter = *e.Filter
	}
	if e.RateLimitPerSecond != nil {
		fs.RateLimitPerSecond = strconv.FormatFloat(*e.RateLimitPerSecond, 'f', -1, 64)
	}
	if e.MaxAttempts != nil {
		fs.MaxAttempts = strconv.Itoa(*e.MaxAttempts)
	}
	for _, s := range []struct {
		field *string
		value *int64
	}{{&fs.RetryWindowSeconds, e.RetryWindowSeconds}, {&fs.TimeoutSeconds, e.TimeoutSeconds}} {
		if s.value != nil {
			*s.field = strconv.FormatInt(*s.value, 10)
		}
	}
	fs.Headers, fs.SecretHeaders = headerFormLines(e.Headers)
	return fs
}

// input is the form as the API's input, validated: topics are separated
// by spaces or commas. An error wraps errInvalid and says what is wrong,
// for the form to show.
func (fs endpointFields) input(allowPrivate bool) (endpointInput, error) {
	topics := strings.FieldsFunc(fs.Topics, func(c rune) bool { return c == ' ' || c == ',' })
	if topics == nil {
		topics = []string{}
	}
	in := endpointInput{URL: &fs.URL, Topics: &topics, Description: &fs.Description, OwnerEmail: &fs.OwnerEmail,
		RateLimitPerSecond: nullable[float64]{Set: true}}
	if fs.MaxInFlight != "" {
		n, err := strconv.Atoi(fs.MaxInFlight)
		if err != nil {
			return in, fmt.Errorf("%w: max_in_flight must be a whole number between 1 and %d, got %q", errInvalid, maxMaxInFlight, fs.MaxInFlight)
		}
		in.MaxInFlight = &n
	}
	if fs.Ordering != "" {
		in.Ordering = &fs.Ordering
	}
	if fs.Signature != "" {
		in.Signature = &fs.Signature
	}
	in.Filter.Set = true
	if fs.Filter != "" {
		in.Filter.Value = &fs.Filter
	}
	if fs.RateLimitPerSecond != "" {
		rate, err := strconv.ParseFloat(fs.RateLimitPerSecond, 64)
		if err != nil {
			return in, fmt.Errorf("%w: rate_limit_per_second must be a number of requests a second, or empty for none, got %q", errInvalid, fs.RateLimitPerSecond)
		}
		in.RateLimitPerSecond.Value = &rate
	}
	if err := fs.requestInput(&in); err != nil {
		return in, err
	}
	return in, in.validate(allowPrivate)
}

// requestInput sets in's request settings and headers from the form:
// every one given, an empty one going back to the default.
func (fs endpointFields) requestInput(in *endpointInput) error {
	var err error
	for _, s := range []struct {
		name, text string
		to         *nullable[int]
	}{{"max_attempts", fs.MaxAttempts, &in.MaxAttempts}, {"retry_window_seconds", fs.RetryWindowSeconds, &in.RetryWindowSeconds},
		{"timeout_seconds", fs.TimeoutSeconds, &in.TimeoutSeconds}} {
		s.to.Set = true
		if s.to.Value, err = formSetting(s.name, s.text); err != nil {
			return err
		}
	}
	headers, err := formHeaders(fs.Headers, fs.SecretHeaders)
	if err != nil {
		return err
	}
	in.Headers = nullable[json.RawMessage]{Set: true, Value: (*json.RawMessage)(&headers)}
	return nil
}

// conflictOf is the text of the 409 the API would answer for err
// (errConflict), which a form shows as its page's message.
func conflictOf(err error) (string, bool) {
	if !errors.Is(err, errConflict) {
		return "", false
	}
	return strings.TrimPrefix(err.Error(), errConflict.Error()+": "), true
}

// refusal is what a refused form shows: err's text without the errInvalid
// prefix, as the API's {"error": ...} says it.
func refusal(err error) string {
	return strings.TrimPrefix(err.Error(), errInvalid.Error()+": ")
}

// handleCreateEndpoint is POST /endpoints: the new endpoint's page, with
// its secret, or the form again with why it was refused.
func (p *panel) handleCreateEndpoint(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		fs, err := readEndpointFields(formOf(w, r, maxEndpointForm))
		if err != nil {
			return err
		}
		in, err := fs.input(a.endpoints.AllowPrivate)
		if errors.Is(err, errInvalid) {
			return p.renderEndpoints(w, r, a, http.StatusBadRequest, "", fs, refusal(err))
		} else if err != nil {
			return err
		}
		if err := claimInput(r.Context(), a.db, &in, true); err != nil {
			return err
		}
		secret := newEndpointSecret(in.scheme())
		ep, err := createEndpoint(r.Context(), a.db, a.box, in, secret)
		if conflict, ok := conflictOf(err); ok { // v1a beside an older release (refuseV1aBesideOlderReplicas)
			return p.renderEndpoints(w, r, a, http.StatusConflict, conflict, fs, "")
		} else if errors.Is(err, errInvalid) { // a filter PostgreSQL refuses (checkFilter)
			return p.renderEndpoints(w, r, a, http.StatusBadRequest, "", fs, refusal(err))
		} else if err != nil {
			return err
		}
		noteAuditSubject(r, strconv.FormatInt(ep.ID, 10))
		flash := "Endpoint created. Copy its secret now: it is not shown again."
		if ep.Signature == webhookAsymmetricVersion {
			flash = "Endpoint created. Its receiver verifies with the public key below."
		}
		return p.renderEndpoint(w, r, a, ep.ID, endpointView{flash: flash, secret: ep.shownSecret(secret)})
	}
}

// handleEndpoint is GET /endpoints/{id}: the endpoint, its last attempts
// and its buttons.
func (p *panel) handleEndpoint(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		return p.renderEndpoint(w, r, a, id, endpointView{flash: flash(r)})
	}
}

// recentDeliveries is how many of an endpoint's last attempts its page
// shows, above its forms; GET /api/endpoints/{id}/deliveries gives
// defaultPageSize.
const recentDeliveries = 20

// endpointView is what one showing of an endpoint's page adds to the
// endpoint: a message, the secret right after create or rotate (never in
// a URL: the page is rendered, not redirected to), or an edit that was
// refused, shown as typed with why (the page then answers 400).
type endpointView struct {
	flash, secret string
	refused       *endpointFields
	refusal       string
	status        int // a refused form's, when not 400
	preview       *replayPreviewView
	filterPreview *filterPreviewView
}

// renderEndpoint shows one endpoint as view says.
func (p *panel) renderEndpoint(w http.ResponseWriter, r *http.Request, a *admin, id int64, view endpointView) error {
	pg, err := readEndpointPage(r.Context(), a, id, principalOf(r).admin)
	if err != nil {
		return err
	}
	pg.Secret, pg.FormError, pg.Preview, pg.FilterPreview = view.secret, view.refusal, view.preview, view.filterPreview
	status := http.StatusOK
	if view.refused != nil {
		status, pg.Form = cmp.Or(view.status, http.StatusBadRequest), *view.refused
	}
	p.render(w, status, "endpoint", page{Title: pg.Endpoint.Name(), Nav: "endpoints", SignedIn: true,
		Flash: view.flash, Data: pg})
	return nil
}

// endpointPage is what an endpoint's page shows: the endpoint and how
// it does, what view adds (Secret to FilterPreview), and, for the admin,
// the owners it may be given to (Owners) and its own (OwnerID, 0: none,
// and OwnerName).
type endpointPage struct {
	Endpoint        Endpoint
	Cause           endpointCause
	Stats           EndpointStats
	Secret          string
	Form            endpointFields
	FormError       string
	Bounds          deliveryBounds
	Preview         *replayPreviewView
	Replays         []ReplayView
	ReplayShare     int
	Windows         []statsWindowView
	Queue           DeliveryQueue
	Failures        []FailureGroup
	FailureAttempts int
	FilterPreview   *filterPreviewView
	Owners          []Owner
	OwnerID         int64
	OwnerName       string
	// TestTopics are the registered topics the endpoint may receive,
	// which its test form offers (topics.go).
	TestTopics []Topic
}

// readEndpointPage reads endpoint id's page, its edit form filled with
// the endpoint's settings; the owners only for the admin, whose form
// gives it to one.
func readEndpointPage(ctx context.Context, a *admin, id int64, admin bool) (endpointPage, error) {
	pg := endpointPage{Bounds: endpointBounds(), FailureAttempts: recentFailureAttempts}
	var err error
	if pg.Endpoint, err = getEndpoint(ctx, a.db, id); err != nil {
		return pg, err
	}
	pg.Form, pg.ReplayShare = fieldsOf(pg.Endpoint), replayShare(pg.Endpoint.MaxInFlight)
	if pg.Stats, err = readEndpointStats(ctx, a.db, id, recentDeliveries); err != nil {
		return pg, err
	}
	if pg.Replays, err = listReplays(ctx, a.db, id); err != nil {
		return pg, err
	}
	if pg.Windows, err = readStatsWindows(ctx, a.db, id); err != nil {
		return pg, err
	}
	if pg.Queue, err = readDeliveryQueue(ctx, a.db, id); err != nil {
		return pg, err
	}
	if pg.Failures, err = readRecentFailures(ctx, a.db, id, pg.Windows[len(pg.Windows)-1].From); err != nil { // the day's
		return pg, err
	}
	health, err := readEndpointHealth(ctx, a.db, a.alerts, id, time.Time{})
	if err != nil {
		return pg, err
	}
	pg.Cause = causeOf(pg.Endpoint, health)
	if pg.TestTopics, err = listTopics(ctx, a.db, pg.Endpoint.OwnerID); err != nil {
		return pg, err
	}
	if admin {
		if pg.Owners, err = listOwners(ctx, a.db); err != nil {
			return pg, err
		}
		pg.OwnerID = deref(pg.Endpoint.OwnerID)
		for _, o := range pg.Owners {
			if o.ID == pg.OwnerID {
				pg.OwnerName = o.Name
			}
		}
	}
	return pg, nil
}

// endpointCause is the top of an endpoint's page, what an operator
// paged at night reads first: its state, with a failing endpoint told
// from a degraded one (endpoint_failing's rule, failingAt), and its last
// failed attempt. Health is nil when it is in no trouble.
type endpointCause struct {
	State  string
	Health *EndpointHealth
}

// causeOf is ep's cause as its page shows it: paused and disabled as
// they are, else failing or degraded as its health says, else enabled.
func causeOf(ep Endpoint, health []EndpointHealth) endpointCause {
	c := endpointCause{State: ep.State}
	if len(health) == 0 {
		if c.State == endpointFailing { // failed since the health's window
			c.State = healthDegraded
		}
		return c
	}
	c.Health = &health[0]
	if c.State == endpointEnabled || c.State == endpointFailing {
		c.State = c.Health.Health
	}
	return c
}

// statsWindowView is one window of an endpoint's delivery statistics as
// its page shows them: the numbers and the chart of its minutes.
type statsWindowView struct {
	Title string
	DeliveryStats
	Chart, LatencyChart template.HTML
}

// readStatsWindows reads endpoint id's statistics over the last hour and
// the last day (0: every endpoint's), with their charts: the day's rows
// once, summed for both.
func readStatsWindows(ctx context.Context, db *sql.DB, id int64) ([]statsWindowView, error) {
	day, err := readStatsMinutes(ctx, db, id, statsWindows["24h"])
	if err != nil {
		return nil, err
	}
	var views []statsWindowView
	for _, w := range []struct{ window, title string }{{"1h", "Last hour"}, {"24h", "Last 24 hours"}} {
		st := day.window(w.window)
		views = append(views, statsWindowView{Title: w.title, DeliveryStats: st,
			Chart:        deliveryChartSVG(st.Series, "deliveries produced, delivered and failed per minute, "+strings.ToLower(w.title)),
			LatencyChart: latencyChartSVG(st.Series, "commit to first 2xx latency, p50 and p99 per minute, "+strings.ToLower(w.title))})
	}
	return views, nil
}

// handleEndpointAction is POST /endpoints/{id}/{action}, one of an
// endpoint's buttons: the action runs, and the endpoint's page shows what
// happened.
func (p *panel) handleEndpointAction(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		action, ok := endpointActions[r.PathValue("action")]
		if !ok {
			return fmt.Errorf("%w: no action %q", errNotFound, r.PathValue("action"))
		}
		done, err := action(endpointClick{p: p, a: a, w: w, r: r, form: formOf(w, r, maxEndpointForm), id: id})
		if err != nil || done == "" {
			return err
		}
		http.Redirect(w, r, fmt.Sprintf("/endpoints/%d?done=%s", id, url.QueryEscape(done)), http.StatusSeeOther)
		return nil
	}
}

// endpointClick is a press of one of endpoint id's buttons, with its
// form's fields.
type endpointClick struct {
	p    *panel
	a    *admin
	w    http.ResponseWriter
	r    *http.Request
	form *query
	id   int64
}

// endpointActions are the endpoint page's buttons by name. Each does its
// work and says what happened, for the page to show after a redirect; the
// ones that answer by themselves say "": rotate-secret shows the new
// secret (never in a URL), edit a refused form, delete leaves for the
// list.
var endpointActions = map[string]func(endpointClick) (done string, err error){
	"enable":          endpointClick.enable,
	"disable":         endpointClick.disable,
	"pause":           endpointClick.pause,
	"resume":          endpointClick.resume,
	"rotate-secret":   endpointClick.rotateSecret,
	"retry-discarded": endpointClick.retryDiscarded,
	"replay":          endpointClick.replay,
	"cancel-replay":   endpointClick.cancelReplay,
	"filter-preview":  endpointClick.filterPreview,
	"edit":            endpointClick.edit,
	"delete":          endpointClick.delete,
}

func (c endpointClick) enable() (string, error) {
	_, err := enableEndpoint(c.r.Context(), c.a.db, c.id)
	return "Enabled: new events are delivered again. Replay to send what it missed.", err
}

func (c endpointClick) disable() (string, error) {
	field := c.form.text("reason")
	if c.form.err != nil {
		return "", c.form.err
	}
	reason, err := disableReason(field)
	if err != nil {
		return "", err
	}
	_, err = disableEndpoint(c.r.Context(), c.a.db, c.id, reason)
	return "Disabled: no new deliveries until it is enabled.", err
}

func (c endpointClick) pause() (string, error) {
	_, err := pauseEndpoint(c.r.Context(), c.a.db, c.id)
	return "Paused: nothing is delivered to it until it is resumed; new events still queue for it.", err
}

func (c endpointClick) resume() (string, error) {
	_, err := resumeEndpoint(c.r.Context(), c.a.db, c.id)
	return "Resumed: its queued deliveries flow again.", err
}

// rotateSecret is the Rotate secret button: it asks first (a receiver
// that is not told the new secret refuses every delivery once the old
// one's window ends), then shows the new secret, once.
func (c endpointClick) rotateSecret() (string, error) {
	window := c.a.endpoints.RotationWindow
	if !confirmed(c.form) {
		if c.form.err != nil {
			return "", c.form.err
		}
		ep, err := getEndpoint(c.r.Context(), c.a.db, c.id)
		if err != nil {
			return "", err
		}
		what, consequence := "secret", "A new secret signs its deliveries from now on, shown once on the next page. The old one signs beside it for %s more: "+
			"give its receiver the new secret within that time, or it refuses every delivery after."
		if ep.Signature == webhookAsymmetricVersion {
			what, consequence = "key", "A new key pair signs its deliveries from now on; its public key is on the next page. The old key signs beside it for %s more: "+
				"give its receiver the new public key within that time, or it refuses every delivery after."
		}
		return "", c.p.ask(c.w, c.r, confirmation{
			Question:    fmt.Sprintf("Rotate the signing %s of %s?", what, ep.Name()),
			Consequence: fmt.Sprintf(consequence, roughDuration(window)),
			Action:      fmt.Sprintf("/endpoints/%d/rotate-secret", c.id), Button: "Rotate the secret",
			Cancel: fmt.Sprintf("/endpoints/%d", c.id)})
	}
	ep, secret, err := rotateEndpointSecret(c.r.Context(), c.a.db, c.a.box, c.id, window)
	if err != nil {
		return "", err
	}
	return "", c.p.renderEndpoint(c.w, c.r, c.a, c.id, endpointView{
		flash:  fmt.Sprintf("Signing key rotated; the old one still signs for %s.", roughDuration(window)),
		secret: ep.shownSecret(secret)})
}

func (c endpointClick) retryDiscarded() (string, error) {
	res, err := retryDiscarded(c.r.Context(), c.a.db, c.id, c.a.eventsRetention, c.a.maxAttempts)
	done := fmt.Sprintf("%d discarded deliveries will run now.", res.Jobs)
	if res.Message != "" {
		done += " " + res.Message
	}
	return done, err
}

// replayPreviewView is a replay's dry run as the endpoint's page shows it,
// with the fields its Confirm button posts: the same request, its end
// fixed at the preview's, so that the replay sends what the preview
// counted and not what was recorded since.
type replayPreviewView struct {
	ReplayPreview
	Since, Until, Topics string
}

// Estimate is EstimatedSeconds as a duration ("2m30s").
func (v replayPreviewView) Estimate() string {
	return (time.Duration(v.EstimatedSeconds) * time.Second).String()
}

// replay is the replay form: with dry_run (the form's first submit) it
// shows on the endpoint's page what the replay would send, with a Confirm
// button; without (Confirm), it enqueues.
func (c endpointClick) replay() (string, error) {
	dryRun := c.form.text("dry_run") != ""
	req, topics, err := readReplayForm(c.form)
	if err != nil {
		return "", err
	}
	if dryRun {
		pv, err := previewReplay(c.r.Context(), c.a.db, c.id, req, c.a.eventsRetention, c.a.maxAttempts)
		if err != nil {
			return "", err
		}
		return "", c.p.renderEndpoint(c.w, c.r, c.a, c.id, endpointView{preview: &replayPreviewView{ReplayPreview: pv,
			Since: req.Since.UTC().Format(time.RFC3339Nano), Until: pv.To.UTC().Format(time.RFC3339Nano), Topics: topics}})
	}
	res, err := replayEndpoint(c.r.Context(), c.a.db, c.id, req, c.a.eventsRetention, c.a.maxAttempts)
	if err != nil {
		return "", err
	}
	done := fmt.Sprintf("Replaying %d events recorded from %s to %s.", res.Jobs, res.From.UTC().Format(time.RFC3339), res.To.UTC().Format(time.RFC3339))
	if res.Clamped {
		done += " " + res.Message
	}
	return done, nil
}

// cancelReplay is a running replay's Cancel button: its waiting jobs end
// discarded, without a request.
func (c endpointClick) cancelReplay() (string, error) {
	replayID := c.form.natural("replay_id")
	if c.form.err != nil {
		return "", c.form.err
	}
	v, err := cancelReplay(c.r.Context(), c.a.db, c.id, replayID)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("Replay %d cancelled: its waiting deliveries were discarded without a request; %d already running will finish.", v.ID, v.Running), nil
}

// readReplayForm reads the replay form: since and until as timeinput
// types them or as the Confirm button posts them (RFC 3339), until
// optional; topics as the
// edit form takes them, separated by spaces or commas, returned as typed
// too.
func readReplayForm(f *query) (ReplayRequest, string, error) {
	sinceField, untilField, topics := f.text("since"), f.text("until"), f.text("topics")
	if f.err != nil {
		return ReplayRequest{}, "", f.err
	}
	var req ReplayRequest
	var err error
	if req.Since, err = parseTimeInput("replay from", sinceField); err != nil {
		return req, "", err
	}
	if untilField != "" {
		if req.Until, err = parseTimeInput("replay until", untilField); err != nil {
			return req, "", err
		}
	}
	req.Topics = strings.FieldsFunc(topics, func(c rune) bool { return c == ' ' || c == ',' })
	return req, strings.Join(req.Topics, " "), nil
}

// edit saves the form; a refused one is shown again as typed, with why.
func (c endpointClick) edit() (string, error) {
	fs, err := readEndpointFields(c.form)
	if err != nil {
		return "", err
	}
	in, err := fs.input(c.a.endpoints.AllowPrivate)
	if errors.Is(err, errInvalid) {
		return "", c.p.renderEndpoint(c.w, c.r, c.a, c.id, endpointView{refused: &fs, refusal: refusal(err)})
	} else if err != nil {
		return "", err
	}
	shown, err := getEndpoint(c.r.Context(), c.a.db, c.id)
	if err != nil {
		return "", err
	}
	in.dropUnchangedLimits(shown)
	// The API's change, so that an owner's form is held to its owner's
	// grants and limits as its token is.
	changed, err := c.a.changeEndpoint(c.r.Context(), c.id, in)
	if conflict, ok := conflictOf(err); ok { // v1a beside an older release (refuseV1aBesideOlderReplicas)
		return "", c.p.renderEndpoint(c.w, c.r, c.a, c.id, endpointView{flash: conflict, refused: &fs, status: http.StatusConflict})
	} else if errors.Is(err, errInvalid) { // beyond the owner's limits, or a filter PostgreSQL refuses (checkFilter)
		return "", c.p.renderEndpoint(c.w, c.r, c.a, c.id, endpointView{refused: &fs, refusal: refusal(err)})
	} else if err != nil || changed.Signature == shown.Signature {
		return "Saved.", err
	}
	// A switch of scheme: its new secret is shown once, on this page,
	// never in a URL.
	return "", c.p.renderEndpoint(c.w, c.r, c.a, c.id, endpointView{secret: changed.Secret,
		flash: fmt.Sprintf("Saved. It signs with %s from now on; its old key signs beside it for %s more.",
			changed.Signature, roughDuration(c.a.endpoints.RotationWindow))})
}

// dropUnchangedLimits leaves out of in the settings an owner's limits
// bound (topics, max_in_flight, rate_limit_per_second) that the edit form
// sends back as they are: the API checks only what a change gives, so an
// endpoint the admin set beyond its owner's limits keeps that until the
// owner changes the field, through either route.
func (in *endpointInput) dropUnchangedLimits(e Endpoint) {
	if in.Topics != nil && slices.Equal(*in.Topics, e.Topics) {
		in.Topics = nil
	}
	if in.MaxInFlight != nil && *in.MaxInFlight == e.MaxInFlight {
		in.MaxInFlight = nil
	}
	if r := in.RateLimitPerSecond; r.Set && (r.Value == nil) == (e.RateLimitPerSecond == nil) &&
		(r.Value == nil || *r.Value == *e.RateLimitPerSecond) {
		in.RateLimitPerSecond = nullable[float64]{}
	}
}

// filterPreviewView is the filter preview form's answer on the endpoint's
// page: the preview, or why its filter was refused, with the filter as
// typed.
type filterPreviewView struct {
	FilterPreview
	Typed, Refusal string
}

// filterPreview is the filter preview form: the filter typed (empty:
// none) over the newest events of the endpoint's topics, shown on its
// page; nothing is saved.
func (c endpointClick) filterPreview() (string, error) {
	typed := strings.TrimSpace(c.form.text("filter"))
	limit := int(c.form.integer("limit", defaultFilterPreviewLimit, 1, maxFilterPreviewLimit, "limit %q is not a number of events"))
	if c.form.err != nil {
		return "", c.form.err
	}
	var filter *string
	if typed != "" {
		filter = &typed
	}
	view := &filterPreviewView{Typed: typed}
	pv, err := previewEndpointFilter(c.r.Context(), c.a.db, c.id, filter, false, limit, c.a.previewTimeout)
	if errors.Is(err, errInvalid) {
		view.Refusal = refusal(err)
	} else if err != nil {
		return "", err
	}
	view.FilterPreview = pv
	return "", c.p.renderEndpoint(c.w, c.r, c.a, c.id, endpointView{filterPreview: view})
}

func (c endpointClick) delete() (string, error) {
	ep, err := getEndpoint(c.r.Context(), c.a.db, c.id)
	if err != nil {
		return "", err
	}
	if err := deleteEndpoint(c.r.Context(), c.a.db, c.id, c.a.logger); err != nil {
		return "", err
	}
	http.Redirect(c.w, c.r, "/endpoints?done="+url.QueryEscape(fmt.Sprintf("Endpoint %q deleted.", ep.Name())), http.StatusSeeOther)
	return "", nil
}

// confirmation is the page a button that cannot be undone answers first:
// what it asks, what the change does, and a form that posts it again
// with confirm=yes (confirmed). The question changes nothing, and the
// trail records nothing of it. Cancel goes back.
type confirmation struct {
	Question, Consequence string
	Action, Button        string
	Cancel                string
	Hidden                map[string]string // fields the second POST sends again
}

// confirmed says whether form is a confirmation's second POST.
func confirmed(form *query) bool { return form.text("confirm") == "yes" }

// ask answers the confirmation page for r, which it leaves undone.
func (p *panel) ask(w http.ResponseWriter, r *http.Request, c confirmation) error {
	noteAuditUnchanged(r)
	p.render(w, http.StatusOK, "confirm", page{Title: c.Question, SignedIn: true, Data: c})
	return nil
}

// handleSubjects is GET /subjects: the subject index by prefix, a page at
// a time; with internal=1, outboxd's own events (alerts about endpoints),
// kept apart so that endpoint 1's alert is not listed beside order 1.
func (p *panel) handleSubjects(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		q := queryOf(r)
		prefix, internal := q.text("prefix"), q.text("internal") == "1"
		after := subjectCursor{Subject: q.text("after"), Topic: q.text("after_topic")}
		if q.err != nil {
			return q.err
		}
		list := listSubjects
		if internal {
			list = listInternalSubjects
		}
		subjects, err := list(r.Context(), a.db, prefix, after, defaultPageSize)
		if err != nil {
			return err
		}
		var next string
		if len(subjects) == defaultPageSize {
			c := cursorAfter(subjects)
			v := url.Values{"prefix": {prefix}, "after": {c.Subject}, "after_topic": {c.Topic}}
			if internal {
				v.Set("internal", "1")
			}
			next = "/subjects?" + v.Encode()
		}
		p.render(w, http.StatusOK, "subjects", page{Title: "Subjects", Nav: "subjects", SignedIn: true, Flash: flash(r),
			Data: struct {
				Prefix   string
				Internal bool
				Subjects []SubjectEntry
				Next     string
			}{prefix, internal, subjects, next}})
		return nil
	}
}

// renderSources lists the inbox sources, with a new secret right after a
// create or a rotation (never in a URL: the page is rendered, not
// redirected to).
func (p *panel) renderSources(w http.ResponseWriter, r *http.Request, a *admin, flash string, created *inboxSourceWithSecret) error {
	sources, unknown, err := listSourcesWithStats(r.Context(), a.db)
	if err != nil {
		return err
	}
	// Webhooks sent to names no source has, counted under one bucket
	// (inbox.go, unknownSourceBucket), last.
	views := make([]inboxStatsView, 0, len(sources)+1)
	for _, s := range sources {
		views = append(views, newInboxStatsView(s.Name, *s.Stats))
	}
	views = append(views, newInboxStatsView("unknown source", unknown))
	p.render(w, http.StatusOK, "sources", page{Title: "Inbox sources", Nav: "sources", SignedIn: true, Flash: flash,
		Data: struct {
			Sources           []InboxSource
			Stats             []inboxStatsView
			Created           *inboxSourceWithSecret
			MaxRecentRefusals int
		}{sources, views, created, maxRecentRefusals}})
	return nil
}

// inboxStatsView is a source's rows on the Inbox page: its last hour and
// its last 24 hours, each with its chart, and its recent refusals; Quiet
// when it sent nothing in the 24 hours, which the page says instead of
// drawing flat lines.
type inboxStatsView struct {
	Name     string
	Windows  []titledInboxStats
	Recent   []InboxRefusal      // the last 24 hours'
	ByMinute []InboxRefusalCount // the last hour's, every reason with its count
	Quiet    bool
}

type titledInboxStats struct {
	Title string
	InboxStats
	Chart template.HTML
}

func newInboxStatsView(name string, st InboxSourceStats) inboxStatsView {
	chart := func(st InboxStats, title string) template.HTML {
		return inboxChartSVG(st, fmt.Sprintf("webhooks to %s received, duplicate and refused, %s", name, title))
	}
	quiet := st.LastDay.Received+st.LastDay.Duplicates+st.LastDay.Refused == 0
	return inboxStatsView{Name: name, Recent: st.LastDay.RecentRefusals, ByMinute: st.LastHour.RefusalsByMinute, Quiet: quiet, Windows: []titledInboxStats{
		{"last hour", st.LastHour, chart(st.LastHour, "per minute over the last hour")},
		{"last 24 h", st.LastDay, chart(st.LastDay, "per 15 minutes over the last 24 hours")},
	}}
}

// handleSources is GET /sources, with the form for a new one.
func (p *panel) handleSources(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		return p.renderSources(w, r, a, flash(r), nil)
	}
}

// handleCreateSource is POST /sources: the list again, with the new
// source's secret.
func (p *panel) handleCreateSource(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		f := formOf(w, r, 16<<10)
		in := sourceInput{Name: strings.TrimSpace(f.text("name")), Secret: strings.TrimSpace(f.text("secret"))}
		if prefix := strings.TrimSpace(f.text("topic_prefix")); prefix != "" {
			in.TopicPrefix = &prefix
		}
		if f.err != nil {
			return f.err
		}
		created, err := createSource(r.Context(), a.db, a.box, in)
		if err != nil {
			return err
		}
		return p.renderSources(w, r, a, fmt.Sprintf("Source %s created. Give its secret to the sender.", created.Name), &created)
	}
}

// handleSourceAction is POST /sources/{name}/{action}, a source's two
// buttons: rotate-secret shows the new secret, delete leaves for the list.
func (p *panel) handleSourceAction(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		name, err := pathText(r, "name")
		if err != nil {
			return err
		}
		switch r.PathValue("action") {
		case "rotate-secret":
			secret := newWebhookSecret()
			s, err := rotateSourceSecret(r.Context(), a.db, a.box, name, secret, a.endpoints.RotationWindow)
			if err != nil {
				return err
			}
			return p.renderSources(w, r, a, fmt.Sprintf("Secret of %s rotated; the old one is still accepted for %s.", name, a.endpoints.RotationWindow),
				&inboxSourceWithSecret{InboxSource: s, Secret: secret.Encode()})
		case "delete":
			if err := deleteSource(r.Context(), a.db, name); err != nil {
				return err
			}
			http.Redirect(w, r, "/sources?done="+url.QueryEscape(fmt.Sprintf("Source %s deleted.", name)), http.StatusSeeOther)
			return nil
		}
		return fmt.Errorf("%w: no action %q", errNotFound, r.PathValue("action"))
	}
}
