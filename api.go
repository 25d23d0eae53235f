// api.go: the JSON API under /api/ and the open routes beside it (health,
// metrics, the inbox), one handler a route, in the order routes lists them.

package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// byID is the handler of a route on one row: it parses {id} and answers
// 200 with do's result.
func byID[T any](do func(ctx context.Context, id int64) (T, error)) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		v, err := do(r.Context(), id)
		return http.StatusOK, v, err
	}
}

// byIDWithBody is byID for a route that takes a JSON body, which decode
// (decodeJSON, or decodeOptionalJSON where it may be left out) reads into
// an In for do once {id} parsed.
func byIDWithBody[In, Out any](decode func(*http.Request, any) error, do func(ctx context.Context, id int64, in In) (Out, error)) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		var in In
		if err := decode(r, &in); err != nil {
			return 0, nil, err
		}
		v, err := do(r.Context(), id, in)
		return http.StatusOK, v, err
	}
}

// handleOverview is GET /api/overview: backlog, jobs by state, table
// health and the alerts firing.
func handleOverview(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		o, err := a.overview(r.Context())
		return http.StatusOK, o, err
	}
}

// handleAcknowledgeAlert is POST /api/alerts/{name}/acknowledge: the
// alert, firing now, is acknowledged at its level and answered; 404 when
// it is not firing.
func handleAcknowledgeAlert(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		name, err := pathText(r, "name")
		if err != nil {
			return 0, nil, err
		}
		alert, err := acknowledgeAlert(r.Context(), a.db, a.alerts, name)
		return http.StatusOK, alert, err
	}
}

// handleListEvents is GET /api/events: a page of the stream, newest first,
// with next_before and next_after to ask for the older and the newer page
// when the filter selects more events that way; for an owner, of the
// events its endpoints were sent (readEventPage).
func handleListEvents(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		pg, err := readEventPage(r, a.db)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, pg.answer("events"), nil
	}
}

// answer is a page as the API gives it, {name: [...], "next_before": id,
// "next_after": id}, each cursor when the page has one.
func (pg idPage[F, T]) answer(name string) map[string]any {
	resp := map[string]any{name: pg.rows}
	if pg.before != 0 {
		resp["next_before"] = pg.before
	}
	if pg.after != 0 {
		resp["next_after"] = pg.after
	}
	return resp
}

// handleRecordEvent is POST /api/events: one event, recorded in its own
// transaction, answered 201 with its id. With an Idempotency-Key, a
// retry of a request already recorded records nothing and answers 200
// with the first event's id and Idempotent-Replayed: true; the key with
// another request answers 422.
func handleRecordEvent(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		key, err := idempotencyKey(r.Header)
		if err != nil {
			return 0, nil, err
		}
		var req eventInput
		if err := decodeJSON(r, &req); err != nil {
			return 0, nil, err
		}
		// A caller inside a trace passes it on, as its request's headers.
		tc := traceContextOf(r.Header)
		if key == "" {
			id, err := recordEventTraced(r.Context(), a.db, tc, req)
			return http.StatusCreated, map[string]int64{"id": id}, err
		}
		id, replayed, err := recordEventOnce(r.Context(), a.db, key, tc, req)
		if replayed {
			return http.StatusOK, withHeader{header: http.Header{headerIdempotentReplayed: {"true"}},
				body: map[string]int64{"id": id}}, err
		}
		return http.StatusCreated, map[string]int64{"id": id}, err
	}
}

// handleGetEvent is GET /api/events/{id}: the event and every job it
// made; for an owner, an event its endpoints were sent and their jobs,
// another's the 404 of an event that does not exist.
func handleGetEvent(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (eventWithJobs, error) {
		if owner := principalIn(ctx).ownerID(); owner != nil {
			return readOwnerEvent(ctx, a.db, *owner, id)
		}
		return readEventWithJobs(ctx, a.db, id)
	})
}

// handleRequeueEvent is POST /api/events/{id}/requeue: a poisoned event
// back in the backlog, answered as it is now.
func handleRequeueEvent(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (Event, error) {
		if err := requeueEvent(ctx, a.db, id); err != nil {
			return Event{}, err
		}
		return getEvent(ctx, a.db, id)
	})
}

// handleListJobs is GET /api/jobs: a page of jobs, newest first, with
// next_before to ask for the page after it.
func handleListJobs(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		pg, err := readJobPage(r, a.db)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, pg.answer("jobs"), nil
	}
}

// handleRetryJob is POST /api/jobs/{id}/retry: the job runs now, and is
// answered as it is after the retry.
func handleRetryJob(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (JobView, error) {
		if err := retryJob(ctx, a.db, id, a.eventsRetention, a.maxAttempts); err != nil {
			return JobView{}, err
		}
		jobs, err := listJobs(ctx, a.db, JobFilter{Before: id + 1, Limit: 1})
		if err != nil {
			return JobView{}, err
		}
		if len(jobs) == 0 || jobs[0].ID != id {
			return JobView{}, fmt.Errorf("job %d: %w after retry", id, errNotFound)
		}
		return jobs[0], nil
	})
}

// handleRetryEveryDiscarded is POST /api/jobs/retry-discarded: every
// discarded job runs again, each endpoint's deliveries as
// POST /api/endpoints/{id}/retry-discarded runs them; answered with what
// was retried and skipped, in all and per endpoint. An optional body,
// a DiscardedFilter, narrows it to one group of GET /api/jobs/discarded.
func handleRetryEveryDiscarded(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		var f DiscardedFilter
		if r.ContentLength != 0 {
			if err := decodeJSON(r, &f); err != nil {
				return 0, nil, err
			}
		}
		res, err := retryEveryDiscarded(r.Context(), a.db, f, a.eventsRetention, a.maxAttempts)
		return http.StatusOK, res, err
	}
}

// handleDiscardedGroups is GET /api/jobs/discarded?endpoint_id=:
// {"groups": [...], "partial"}, the discarded jobs grouped by endpoint
// and last error, the most recent first.
func handleDiscardedGroups(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		q := queryOf(r)
		endpointID := q.natural("endpoint_id")
		if q.err != nil {
			return 0, nil, q.err
		}
		groups, err := listDiscardedGroups(r.Context(), a.db, endpointID)
		return http.StatusOK, groups, err
	}
}

// handleListEndpoints is GET /api/endpoints: {"endpoints": [...]}, a page
// of at most ?limit= (default and maximum 500) endpoints with ids above
// ?after=.
func handleListEndpoints(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		q := queryOf(r)
		afterID := q.integer("after", 0, 0, math.MaxInt64, "after %q is not an endpoint id")
		limit := q.limit(maxEndpointPage, maxEndpointPage)
		if q.err != nil {
			return 0, nil, q.err
		}
		endpoints, err := listEndpointsFor(r.Context(), a.db, afterID, limit)
		if err == nil {
			err = withHealth(r.Context(), a.db, a.alerts, endpoints)
		}
		return http.StatusOK, map[string][]Endpoint{"endpoints": endpoints}, err
	}
}

// handleCreateEndpoint is POST /api/endpoints: the endpoint registered,
// answered 201 with its secret, which is shown this once.
func handleCreateEndpoint(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		var in endpointInput
		if err := decodeJSON(r, &in); err != nil {
			return 0, nil, err
		}
		if err := in.validate(a.endpoints.AllowPrivate); err != nil {
			return 0, nil, err
		}
		if err := claimInput(r.Context(), a.db, &in, true); err != nil {
			return 0, nil, err
		}
		secret := newEndpointSecret(in.scheme())
		e, err := createEndpoint(r.Context(), a.db, a.box, in, secret)
		return http.StatusCreated, endpointWithSecret{Endpoint: e, Secret: e.shownSecret(secret)}, err
	}
}

// handleGetEndpoint is GET /api/endpoints/{id}, without its secret.
func handleGetEndpoint(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (Endpoint, error) {
		ep, err := getEndpoint(ctx, a.db, id)
		if err != nil {
			return ep, err
		}
		eps := []Endpoint{ep}
		return eps[0], withHealth(ctx, a.db, a.alerts, eps)
	})
}

// handleUpdateEndpoint is PATCH /api/endpoints/{id}: the fields the body
// gives change, the others stay. A switch to signature v1 answers the new
// secret, as rotate-secret does.
func handleUpdateEndpoint(a *admin) apiFunc {
	return byIDWithBody(decodeJSON, func(ctx context.Context, id int64, in endpointInput) (endpointWithSecret, error) {
		return a.changeEndpoint(ctx, id, in)
	})
}

// changeEndpoint is a change of endpoint id as its sender (principalIn)
// may make it: validated, held to the owner's grants and limits
// (claimInput), then written. The panel's forms that change an
// endpoint's owner go through it too, so that they hold what the API
// holds.
func (a *admin) changeEndpoint(ctx context.Context, id int64, in endpointInput) (endpointWithSecret, error) {
	if err := in.validate(a.endpoints.AllowPrivate); err != nil {
		return endpointWithSecret{}, err
	}
	if err := claimInput(ctx, a.db, &in, false); err != nil {
		return endpointWithSecret{}, err
	}
	return updateEndpoint(ctx, a.db, a.box, id, in, a.endpoints.RotationWindow)
}

// handleDeleteEndpoint is DELETE /api/endpoints/{id}, answered 204; the
// endpoint's queued deliveries end without a request.
func handleDeleteEndpoint(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusNoContent, nil, deleteEndpoint(r.Context(), a.db, id, a.logger)
	}
}

// handleEnableEndpoint is POST /api/endpoints/{id}/enable.
func handleEnableEndpoint(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (Endpoint, error) {
		return enableEndpoint(ctx, a.db, id)
	})
}

// handlePauseEndpoint is POST /api/endpoints/{id}/pause: its deliveries
// are held, none discarded, and new events still queue for it.
func handlePauseEndpoint(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (Endpoint, error) {
		return pauseEndpoint(ctx, a.db, id)
	})
}

// handleResumeEndpoint is POST /api/endpoints/{id}/resume: its deliveries
// flow again.
func handleResumeEndpoint(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (Endpoint, error) {
		return resumeEndpoint(ctx, a.db, id)
	})
}

// handleDisableEndpoint is POST /api/endpoints/{id}/disable, with an
// optional body {"reason": "..."}.
func handleDisableEndpoint(a *admin) apiFunc {
	type request struct {
		Reason string `json:"reason"`
	}
	return byIDWithBody(decodeOptionalJSON, func(ctx context.Context, id int64, req request) (Endpoint, error) {
		reason, err := disableReason(req.Reason)
		if err != nil {
			return Endpoint{}, err
		}
		return disableEndpoint(ctx, a.db, id, reason)
	})
}

// handleRotateEndpointSecret is POST /api/endpoints/{id}/rotate-secret:
// the endpoint with its new secret (v1), or its new public key (v1a); the
// old one keeps signing for the rotation window.
func handleRotateEndpointSecret(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (endpointWithSecret, error) {
		e, secret, err := rotateEndpointSecret(ctx, a.db, a.box, id, a.endpoints.RotationWindow)
		if err != nil {
			return endpointWithSecret{}, err
		}
		return endpointWithSecret{Endpoint: e, Secret: e.shownSecret(secret)}, nil
	})
}

// handleReplayEndpoint is POST /api/endpoints/{id}/replay {"since",
// "until", "topics", "dry_run"}: the endpoint's events in that window, of
// those topics, sent again, answered with the replay's id; or, with
// "dry_run": true, what would be sent, enqueuing nothing, so that an
// operator sees how many events and how long before committing to it.
func handleReplayEndpoint(a *admin) apiFunc {
	type request struct {
		Since  *string  `json:"since"`
		Until  *string  `json:"until"`
		Topics []string `json:"topics"`
		DryRun bool     `json:"dry_run"`
	}
	return byIDWithBody(decodeJSON, func(ctx context.Context, id int64, in request) (any, error) {
		var req ReplayRequest
		var err error
		if in.Since == nil {
			return nil, fmt.Errorf(`%w: "since" (an RFC 3339 time) is required`, errInvalid)
		}
		if req.Since, err = parseReplayTime("since", *in.Since); err != nil {
			return nil, err
		}
		if in.Until != nil {
			if req.Until, err = parseReplayTime("until", *in.Until); err != nil {
				return nil, err
			}
		}
		req.Topics = in.Topics
		if in.DryRun {
			return previewReplay(ctx, a.db, id, req, a.eventsRetention, a.maxAttempts)
		}
		return replayEndpoint(ctx, a.db, id, req, a.eventsRetention, a.maxAttempts)
	})
}

// handleFilterPreview is POST /api/endpoints/filter-preview {"topics",
// "filter", "limit"}: what an endpoint of those topics with that filter
// (not yet saved; null or left out: none) would have received of the
// newest limit events (default 500, at most 10,000) of its topics.
func handleFilterPreview(a *admin) apiFunc {
	type request struct {
		Topics  []string `json:"topics"`
		Filter  *string  `json:"filter"`
		Limit   *int     `json:"limit"`
		OwnerID *int64   `json:"owner_id"`
	}
	return func(r *http.Request) (int, any, error) {
		var in request
		if err := decodeJSON(r, &in); err != nil {
			return 0, nil, err
		}
		if in.OwnerID != nil {
			if _, err := getOwner(r.Context(), a.db, *in.OwnerID); errors.Is(err, errNotFound) {
				return 0, nil, fmt.Errorf("%w: owner_id %d: no such owner", errInvalid, *in.OwnerID)
			} else if err != nil {
				return 0, nil, err
			}
		}
		pv, err := previewFilter(r.Context(), a.db, FilterPreviewRequest{Topics: in.Topics, Filter: in.Filter,
			Limit: filterPreviewLimit(in.Limit), OwnerID: in.OwnerID, Timeout: a.previewTimeout})
		return http.StatusOK, pv, err
	}
}

// handleEndpointFilterPreview is POST /api/endpoints/{id}/filter-preview
// {"filter", "limit"}, with an optional body: the preview over the
// endpoint's topics, of "filter" if given (null: none), else of its own.
func handleEndpointFilterPreview(a *admin) apiFunc {
	type request struct {
		Filter nullable[string] `json:"filter"`
		Limit  *int             `json:"limit"`
	}
	return byIDWithBody(decodeOptionalJSON, func(ctx context.Context, id int64, in request) (FilterPreview, error) {
		return previewEndpointFilter(ctx, a.db, id, in.Filter.Value, !in.Filter.Set, filterPreviewLimit(in.Limit), a.previewTimeout)
	})
}

// handleRetryDiscarded is POST /api/endpoints/{id}/retry-discarded:
// {"jobs": n, "skipped": m, "message", "replay_id"}, the discarded
// deliveries that run again and those too old to, and the replay they
// run in.
func handleRetryDiscarded(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (RetryResult, error) {
		return retryDiscarded(ctx, a.db, id, a.eventsRetention, a.maxAttempts)
	})
}

// handleListReplays is GET /api/endpoints/{id}/replays: the endpoint's
// replays and retries of its discarded deliveries, newest first, each
// with its progress.
func handleListReplays(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (map[string][]ReplayView, error) {
		replays, err := listReplays(ctx, a.db, id)
		return map[string][]ReplayView{"replays": replays}, err
	})
}

// handleCancelReplay is POST /api/endpoints/{id}/replays/{replay_id}/cancel:
// the replay's waiting jobs end discarded without a request, and the
// replay is answered; 404 when the endpoint has no such replay.
func handleCancelReplay(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		replayID, err := strconv.ParseInt(r.PathValue("replay_id"), 10, 64)
		if err != nil || replayID <= 0 {
			return 0, nil, fmt.Errorf("%w: replay_id %q is not a positive integer", errInvalid, r.PathValue("replay_id"))
		}
		v, err := cancelReplay(r.Context(), a.db, id, replayID)
		return http.StatusOK, v, err
	}
}

// handleEndpointDeliveries is GET /api/endpoints/{id}/deliveries: the
// endpoint's last attempts and its success rate.
func handleEndpointDeliveries(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (EndpointStats, error) {
		if _, err := getEndpoint(ctx, a.db, id); err != nil {
			return EndpointStats{}, err
		}
		return readEndpointStats(ctx, a.db, id, defaultPageSize)
	})
}

// handleEndpointStatsWindow is GET /api/endpoints/{id}/stats?window=1h|24h:
// the endpoint's delivery statistics over the window (stats.go).
func handleEndpointStatsWindow(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		window, err := parseStatsWindow(r.URL.Query().Get("window"))
		if err != nil {
			return 0, nil, err
		}
		if _, err := getEndpoint(r.Context(), a.db, id); err != nil {
			return 0, nil, err
		}
		st, err := readDeliveryStats(r.Context(), a.db, id, window)
		return http.StatusOK, st, err
	}
}

// handleStats is GET /api/stats?window=1h|24h: every endpoint's delivery
// statistics over the window, summed (stats.go).
func handleStats(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		window, err := parseStatsWindow(r.URL.Query().Get("window"))
		if err != nil {
			return 0, nil, err
		}
		st, err := readDeliveryStats(r.Context(), a.db, 0, window)
		return http.StatusOK, st, err
	}
}

// handleListSources is GET /api/sources: every inbox source, without its
// secret.
func handleListSources(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		sources, err := listSources(r.Context(), a.db)
		return http.StatusOK, map[string][]InboxSource{"sources": sources}, err
	}
}

// handleCreateSource is POST /api/sources: the source, answered 201 with
// its secret.
func handleCreateSource(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		var in sourceInput
		if err := decodeJSON(r, &in); err != nil {
			return 0, nil, err
		}
		s, err := createSource(r.Context(), a.db, a.box, in)
		return http.StatusCreated, s, err
	}
}

// handleDeleteSource is DELETE /api/sources/{name}, answered 204.
func handleDeleteSource(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		name, err := pathText(r, "name")
		if err != nil {
			return 0, nil, err
		}
		return http.StatusNoContent, nil, deleteSource(r.Context(), a.db, name)
	}
}

// handleRotateSourceSecret is POST /api/sources/{name}/rotate-secret, with
// an optional body {"secret": "whsec_..."} (the sender's new secret; none
// generates one): the source and the new secret. The old one verifies for
// the rotation window.
func handleRotateSourceSecret(a *admin) apiFunc {
	type request struct {
		Secret string `json:"secret"`
	}
	return func(r *http.Request) (int, any, error) {
		name, err := pathText(r, "name")
		if err != nil {
			return 0, nil, err
		}
		var req request
		if err := decodeOptionalJSON(r, &req); err != nil {
			return 0, nil, err
		}
		secret, err := parseSourceSecret(req.Secret)
		if err != nil {
			return 0, nil, err
		}
		s, err := rotateSourceSecret(r.Context(), a.db, a.box, name, secret, a.endpoints.RotationWindow)
		return http.StatusOK, inboxSourceWithSecret{InboxSource: s, Secret: secret.Encode()}, err
	}
}

// handleListSubjects is GET /api/subjects?prefix=&after=&after_topic=&limit=:
// the subject index by prefix, {"subjects": [...], "next_after",
// "next_after_topic"}, in natural order (subjects.go), outboxd's own topics
// left out.
func handleListSubjects(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		q := queryOf(r)
		prefix, limit := q.text("prefix"), q.limit(maxSubjectPage, maxSubjectPage)
		after := subjectCursor{Subject: q.text("after"), Topic: q.text("after_topic")}
		if q.err != nil {
			return 0, nil, q.err
		}
		entries, err := listSubjects(r.Context(), a.db, prefix, after, limit)
		if err != nil {
			return 0, nil, err
		}
		resp := map[string]any{"subjects": entries}
		if len(entries) == limit {
			next := cursorAfter(entries)
			resp["next_after"], resp["next_after_topic"] = next.Subject, next.Topic
		}
		return http.StatusOK, resp, nil
	}
}

// handleNoRoute is every other path under /api/: a JSON 404 like every
// other answer there, not the mux's text one.
func handleNoRoute() apiFunc {
	return func(r *http.Request) (int, any, error) {
		return 0, nil, &httpError{status: http.StatusNotFound, text: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)}
	}
}

// handleHealthz is GET /healthz: the process is up.
func handleHealthz() apiFunc {
	return func(r *http.Request) (int, any, error) {
		return http.StatusOK, map[string]string{"status": "ok"}, nil
	}
}

// handleReadyz is GET /readyz: 200 when the database answers and the
// schema is there, so a load balancer sends no traffic to a replica that
// cannot record.
func handleReadyz(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var ok bool
		err := a.db.QueryRowContext(ctx, `SELECT to_regprocedure('outbox.record(text, text, jsonb, text)') IS NOT NULL`).Scan(&ok)
		switch {
		case err != nil:
			return 0, nil, &httpError{status: http.StatusServiceUnavailable, err: fmt.Errorf("database: %w", err)}
		case !ok:
			return 0, nil, &httpError{status: http.StatusServiceUnavailable, text: "schema not applied"}
		}
		return http.StatusOK, map[string]string{"status": "ready"}, nil
	}
}

// handleMetrics is GET /metrics, in Prometheus's text format: the one
// handler that does not answer JSON.
func handleMetrics(a *admin) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, err := readOverview(r.Context(), a.db, a.alerts)
		if err != nil {
			status, _ := a.failed(r, fmt.Errorf("metrics: read overview: %w", err))
			http.Error(w, "read overview failed", status)
			return
		}
		st, err := readDeliveryStats(r.Context(), a.db, 0, "1h")
		if err != nil {
			status, _ := a.failed(r, fmt.Errorf("metrics: %w", err))
			http.Error(w, "read delivery stats failed", status)
			return
		}
		repairs, err := readTraceRepairs(r.Context(), a.db)
		if err != nil {
			status, _ := a.failed(r, fmt.Errorf("metrics: %w", err))
			http.Error(w, "read trace repairs failed", status)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if err := writeMetrics(w, o, a.counters); err != nil {
			a.logger.Warn("metrics: write", "err", err)
			return
		}
		if err := writeDeliveryStatsMetrics(w, st); err != nil {
			a.logger.Warn("metrics: write", "err", err)
			return
		}
		if err := writeTraceRepairMetrics(w, repairs); err != nil {
			a.logger.Warn("metrics: write", "err", err)
		}
	})
}

// maxInboxBody bounds a received webhook: an event payload may be up to
// 1 MiB (schema.sql) plus its envelope, the same bound as POST /api/events,
// which serveJSON puts on every body.
const maxInboxBody = maxRequestBody

// handleInbox is POST /webhooks/{source}: a signed webhook from a sender,
// recorded as a local event once per webhook-id (inbox.go). It answers 200
// once the event, or the knowledge that it was recorded before, is
// committed; the sender retries every other answer, so each says why.
func handleInbox(a *admin) apiFunc {
	logger := a.logger.With("loop", "inbox")
	return func(r *http.Request) (int, any, error) {
		name := r.PathValue("source")
		eventID, duplicate, err := receiveWebhook(r.Context(), a.db, a.box, name, r.Header, r.Body, time.Now())
		if err != nil {
			if _, ok := errors.AsType[*unverifiedError](err); ok {
				logger.Warn("inbox: webhook refused", "source", name, "err", err)
			}
			return 0, nil, inboxError(err)
		}
		if duplicate {
			logger.Debug("inbox: duplicate webhook ignored", "source", name, "webhook_id", r.Header.Get(headerWebhookID))
			return http.StatusOK, map[string]any{"duplicate": true}, nil
		}
		return http.StatusOK, map[string]any{"event_id": eventID}, nil
	}
}

// advertiseDedupWindow puts the inbox's dedup window on its answers, in
// webhook-dedup-window (whole seconds; none for 0). It is set on every
// answer, before the handler writes one: a sender reads it from 2xx
// answers only (webhook.go), and wrapping the ResponseWriter to set it on
// those alone would hide the writer's own methods (the 413's connection
// close) from http.MaxBytesReader.
func advertiseDedupWindow(window time.Duration, next http.Handler) http.Handler {
	if window <= 0 {
		return next
	}
	value := strconv.FormatInt(int64(window/time.Second), 10)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(headerDedupWindow, value)
		next.ServeHTTP(w, r)
	})
}

// inboxError is the answer the inbox gives a delivery it did not record,
// where answerOf's is not that answer: 404 for an unknown source, 413 past
// the body bound, 400 for a request that is malformed, 401 for one that is
// well formed but not authentic (or too old or new to tell), and 503 when
// the source could not be read, without telling the sender why.
func inboxError(err error) error {
	_, tooBig := errors.AsType[*http.MaxBytesError](err)
	_, unverified := errors.AsType[*unverifiedError](err)
	malformed := errors.Is(err, errWebhookMissingHeader) || errors.Is(err, errWebhookBadTimestamp)
	switch {
	case errors.Is(err, errUnknownSource):
		return &httpError{status: http.StatusNotFound, err: err}
	case errors.Is(err, errSourceUnreadable):
		return &httpError{status: http.StatusServiceUnavailable, text: "read source failed", err: err}
	case tooBig:
		return &httpError{status: http.StatusRequestEntityTooLarge, text: fmt.Sprintf("body larger than %d bytes", maxInboxBody), err: err}
	case unverified && malformed:
		return &httpError{status: http.StatusBadRequest, err: err}
	case unverified:
		return &httpError{status: http.StatusUnauthorized, err: err}
	}
	return err
}
