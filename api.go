// api.go: the JSON API under /api/ and the open routes beside it (health,
// metrics, the inbox), one handler a route, in the order routes lists them.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

func handleOverview(a *admin) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, err := readOverview(r.Context(), a.db, a.alerts)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		if a.counters != nil && a.counters.pruned != nil {
			o.Pruned = a.counters.pruned()
		}
		writeJSON(w, http.StatusOK, o)
	})
}

func handleListEvents(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := eventFilterFrom(r)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		events, err := listEvents(r.Context(), db, f)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		resp := map[string]any{"events": events}
		if len(events) > 0 {
			resp["next_before"] = events[len(events)-1].ID
		}
		writeJSON(w, http.StatusOK, resp)
	})
}

// handleRecordEvent records one event in its own transaction.
func handleRecordEvent(db *sql.DB) http.Handler {
	type request struct {
		Topic   string          `json:"topic"`
		Subject string          `json:"subject"`
		Payload json.RawMessage `json:"payload"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req request
		if err := decodeJSON(w, r, &req); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		id, err := recordEvent(r.Context(), db, req.Topic, req.Subject, req.Payload)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusCreated, map[string]int64{"id": id})
	})
}

// eventWithJobs is GET /api/events/{id}: the event and every job it made.
type eventWithJobs struct {
	Event
	Jobs []JobView `json:"jobs"`
}

func readEventWithJobs(ctx context.Context, db *sql.DB, id int64) (eventWithJobs, error) {
	ev, err := getEvent(ctx, db, id)
	if err != nil {
		return eventWithJobs{}, err
	}
	jobs, err := listJobs(ctx, db, JobFilter{EventID: id, Limit: maxEventPage})
	if err != nil {
		return eventWithJobs{}, err
	}
	return eventWithJobs{Event: ev, Jobs: jobs}, nil
}

func handleGetEvent(db *sql.DB) http.Handler {
	return handleByID(func(ctx context.Context, id int64) (eventWithJobs, error) {
		return readEventWithJobs(ctx, db, id)
	})
}

func handleRequeueEvent(db *sql.DB) http.Handler {
	return handleByID(func(ctx context.Context, id int64) (Event, error) {
		if err := requeueEvent(ctx, db, id); err != nil {
			return Event{}, err
		}
		return getEvent(ctx, db, id)
	})
}

func handleListJobs(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := jobFilterFrom(r)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		jobs, err := listJobs(r.Context(), db, f)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		resp := map[string]any{"jobs": jobs}
		if len(jobs) > 0 {
			resp["next_before"] = jobs[len(jobs)-1].ID
		}
		writeJSON(w, http.StatusOK, resp)
	})
}

func handleRetryJob(db *sql.DB) http.Handler {
	return handleByID(func(ctx context.Context, id int64) (JobView, error) {
		if err := retryJob(ctx, db, id); err != nil {
			return JobView{}, err
		}
		jobs, err := listJobs(ctx, db, JobFilter{Before: id + 1, Limit: 1})
		if err != nil {
			return JobView{}, err
		}
		if len(jobs) == 0 || jobs[0].ID != id {
			return JobView{}, fmt.Errorf("job %d: %w after retry", id, errNotFound)
		}
		return jobs[0], nil
	})
}

// handleListEndpoints answers {"endpoints": [...]}, a page of at most
// ?limit= (default and maximum 500) endpoints with ids above ?after=.
func handleListEndpoints(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		afterID, limit := int64(0), maxEndpointPage
		if v := r.URL.Query().Get("after"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				writeError(w, http.StatusBadRequest, fmt.Errorf("after %q is not an endpoint id", v))
				return
			}
			afterID = n
		}
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxEndpointPage {
				writeError(w, http.StatusBadRequest, fmt.Errorf("limit %q must be between 1 and %d", v, maxEndpointPage))
				return
			}
			limit = n
		}
		endpoints, err := listEndpoints(r.Context(), db, afterID, limit)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, map[string][]Endpoint{"endpoints": endpoints})
	})
}

// handleCreateEndpoint registers an endpoint and answers 201 with it and
// its secret, which is shown this once.
func handleCreateEndpoint(db *sql.DB, policy endpointPolicy) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in endpointInput
		if err := decodeJSON(w, r, &in); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		if err := in.validate(policy.AllowPrivate); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		secret := newWebhookSecret()
		e, err := createEndpoint(r.Context(), db, in, secret)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusCreated, endpointWithSecret{Endpoint: e, Secret: secret.Encode()})
	})
}

func handleGetEndpoint(db *sql.DB) http.Handler {
	return handleByID(func(ctx context.Context, id int64) (Endpoint, error) {
		return getEndpoint(ctx, db, id)
	})
}

// handleUpdateEndpoint changes the fields the body gives.
func handleUpdateEndpoint(db *sql.DB, policy endpointPolicy) http.Handler {
	return handleByIDWithBody(func(ctx context.Context, id int64, in endpointInput) (Endpoint, error) {
		if err := in.validate(policy.AllowPrivate); err != nil {
			return Endpoint{}, err
		}
		return updateEndpoint(ctx, db, id, in)
	})
}

// handleDeleteEndpoint answers 204; the endpoint's queued deliveries end
// without a request.
func handleDeleteEndpoint(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		if err := deleteEndpoint(r.Context(), db, id); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func handleEnableEndpoint(db *sql.DB) http.Handler {
	return handleByID(func(ctx context.Context, id int64) (Endpoint, error) {
		return enableEndpoint(ctx, db, id)
	})
}

// handleDisableEndpoint takes an optional body {"reason": "..."}.
func handleDisableEndpoint(db *sql.DB) http.Handler {
	type request struct {
		Reason string `json:"reason"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		var req request
		if r.ContentLength != 0 {
			if err := decodeJSON(w, r, &req); err != nil {
				writeError(w, statusOf(err), err)
				return
			}
		}
		reason, err := disableReason(req.Reason)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		e, err := disableEndpoint(r.Context(), db, id, reason)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, e)
	})
}

// handleRotateEndpointSecret answers with the endpoint and its new secret;
// the old one keeps signing for the rotation window.
func handleRotateEndpointSecret(db *sql.DB, policy endpointPolicy) http.Handler {
	return handleByID(func(ctx context.Context, id int64) (endpointWithSecret, error) {
		secret := newWebhookSecret()
		e, err := rotateEndpointSecret(ctx, db, id, secret, policy.RotationWindow)
		if err != nil {
			return endpointWithSecret{}, err
		}
		return endpointWithSecret{Endpoint: e, Secret: secret.Encode()}, nil
	})
}

func handleReplayEndpoint(a *admin) http.Handler {
	type request struct {
		Since time.Time `json:"since"`
	}
	return handleByIDWithBody(func(ctx context.Context, id int64, req request) (ReplayResult, error) {
		if req.Since.IsZero() {
			return ReplayResult{}, fmt.Errorf(`%w: "since" (an RFC 3339 time) is required`, errInvalid)
		}
		return replayEndpoint(ctx, a.db, id, req.Since, a.eventsRetention, a.maxAttempts)
	})
}

func handleRetryDiscarded(db *sql.DB) http.Handler {
	return handleByID(func(ctx context.Context, id int64) (map[string]int64, error) {
		n, err := retryDiscarded(ctx, db, id)
		return map[string]int64{"jobs": n}, err
	})
}

func handleEndpointDeliveries(db *sql.DB) http.Handler {
	return handleByID(func(ctx context.Context, id int64) (EndpointStats, error) {
		if _, err := getEndpoint(ctx, db, id); err != nil {
			return EndpointStats{}, err
		}
		return readEndpointStats(ctx, db, id, 50)
	})
}

func handleListSources(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sources, err := listSources(r.Context(), db)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, map[string][]InboxSource{"sources": sources})
	})
}

// handleCreateSource answers 201 with the source and its secret.
func handleCreateSource(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in sourceInput
		if err := decodeJSON(w, r, &in); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		s, err := createSource(r.Context(), db, in)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusCreated, s)
	})
}

func handleDeleteSource(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := deleteSource(r.Context(), db, r.PathValue("name")); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// handleRotateSourceSecret takes an optional body {"secret": "whsec_..."}
// (the sender's new secret; none generates one) and answers with the
// source and the new secret. The old one verifies for the rotation window.
func handleRotateSourceSecret(db *sql.DB, window time.Duration) http.Handler {
	type request struct {
		Secret string `json:"secret"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req request
		if r.ContentLength != 0 {
			if err := decodeJSON(w, r, &req); err != nil {
				writeError(w, statusOf(err), err)
				return
			}
		}
		secret, err := parseSourceSecret(req.Secret)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		s, err := rotateSourceSecret(r.Context(), db, r.PathValue("name"), secret, window)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, inboxSourceWithSecret{InboxSource: s, Secret: secret.Encode()})
	})
}

// handleListSubjects answers GET /api/subjects?prefix=&after=&limit= with
// {"subjects": [...], "next_after"}.
func handleListSubjects(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		limit := maxSubjectPage
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxSubjectPage {
				writeError(w, http.StatusBadRequest, fmt.Errorf("limit %q must be between 1 and %d", v, maxSubjectPage))
				return
			}
			limit = n
		}
		entries, err := listSubjects(r.Context(), db, q.Get("prefix"), q.Get("after"), limit)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		resp := map[string]any{"subjects": entries}
		if len(entries) == limit {
			resp["next_after"] = entries[len(entries)-1].Subject
		}
		writeJSON(w, http.StatusOK, resp)
	})
}

func handleHealthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}

// handleReadyz answers 200 when the database answers and the schema is
// there, so a load balancer sends no traffic to a replica that cannot
// record.
func handleReadyz(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var ok bool
		err := db.QueryRowContext(ctx, `SELECT to_regprocedure('outbox.record(text, text, jsonb)') IS NOT NULL`).Scan(&ok)
		switch {
		case err != nil:
			writeError(w, http.StatusServiceUnavailable, fmt.Errorf("database: %w", err))
		case !ok:
			writeError(w, http.StatusServiceUnavailable, errors.New("schema not applied"))
		default:
			writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		}
	})
}

func handleMetrics(a *admin) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, err := readOverview(r.Context(), a.db, a.alerts)
		if err != nil {
			a.logger.Error("metrics: read overview", "err", err)
			http.Error(w, "read overview failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if err := writeMetrics(w, o, a.counters); err != nil {
			a.logger.Warn("metrics: write", "err", err)
		}
	})
}

// maxInboxBody bounds a received webhook: an event payload may be up to
// 1 MiB (schema.sql) plus its envelope, the same bound as POST /api/events.
const maxInboxBody = maxRequestBody

// inboxStatus maps a verification error to its answer: 400 for a request
// that is malformed, 401 for one that is well formed but not authentic
// (or too old or new to tell).
func inboxStatus(err error) int {
	switch {
	case errors.Is(err, errWebhookMissingHeader), errors.Is(err, errWebhookBadTimestamp):
		return http.StatusBadRequest
	default:
		return http.StatusUnauthorized
	}
}

// handleInbox is POST /webhooks/{source}. It answers 404 for an unknown
// source, 413 past the body bound, 400 or 401 when verification fails,
// 400 for a verified body that is not a webhook outboxd can record, and
// 200 once the event (or the knowledge that it was recorded before) is
// committed. The sender retries every other answer.
func handleInbox(db *sql.DB, logger *slog.Logger, now func() time.Time) http.Handler {
	logger = logger.With("loop", "inbox")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		name := r.PathValue("source")
		var secret, previous []byte
		var prefix string
		err := db.QueryRowContext(ctx, sourceVerifySQL, name).Scan(&secret, &previous, &prefix)
		if errors.Is(err, sql.ErrNoRows) {
			writeError(w, http.StatusNotFound, fmt.Errorf("no inbox source %q", name))
			return
		}
		if err != nil {
			logger.Error("inbox: read source", "source", name, "err", err)
			writeError(w, http.StatusServiceUnavailable, errors.New("read source failed"))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInboxBody))
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", maxInboxBody))
				return
			}
			writeError(w, http.StatusBadRequest, fmt.Errorf("read body: %w", err))
			return
		}
		secrets := [][]byte{secret}
		if previous != nil {
			secrets = append(secrets, previous)
		}
		if err := verifyWebhook(secrets, r.Header, body, now()); err != nil {
			logger.Warn("inbox: webhook refused", "source", name, "err", err)
			writeError(w, inboxStatus(err), err)
			return
		}
		webhookID := r.Header.Get(headerWebhookID)
		if len(webhookID) > 256 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("%s is %d bytes, at most 256", headerWebhookID, len(webhookID)))
			return
		}
		var wh receivedWebhook
		if err := json.Unmarshal(body, &wh); err != nil || wh.Type == "" {
			writeError(w, http.StatusBadRequest, errors.New(`body must be a JSON object with a "type"`))
			return
		}
		topic := prefix + wh.Type
		eventID, duplicate, err := receive(ctx, db, name, webhookID, topic, wh)
		if err != nil {
			if statusOf(err) == http.StatusInternalServerError {
				logger.Error("inbox: record webhook", "source", name, "webhook_id", webhookID, "err", err)
			}
			writeError(w, statusOf(err), err)
			return
		}
		if duplicate {
			logger.Debug("inbox: duplicate webhook ignored", "source", name, "webhook_id", webhookID)
			writeJSON(w, http.StatusOK, map[string]any{"duplicate": true})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"event_id": eventID})
	})
}
