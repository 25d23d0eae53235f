// admin.go: the HTTP surface, the JSON API under /api/ and the health checks.

package main

import (
	"context"
	"crypto/subtle"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// routes is every route of outboxd in one place.
func routes(db *sql.DB, token string, logger *slog.Logger, endpoints endpointPolicy) http.Handler {
	api := http.NewServeMux()
	api.Handle("POST /api/events", handleRecordEvent(db))
	api.Handle("GET /api/events/{id}", handleGetEvent(db))
	api.Handle("POST /api/events/{id}/requeue", handleRequeueEvent(db))
	api.Handle("GET /api/endpoints", handleListEndpoints(db))
	api.Handle("POST /api/endpoints", handleCreateEndpoint(db, endpoints))
	api.Handle("GET /api/endpoints/{id}", handleGetEndpoint(db))
	api.Handle("PATCH /api/endpoints/{id}", handleUpdateEndpoint(db, endpoints))
	api.Handle("DELETE /api/endpoints/{id}", handleDeleteEndpoint(db))
	api.Handle("POST /api/endpoints/{id}/enable", handleEnableEndpoint(db))
	api.Handle("POST /api/endpoints/{id}/disable", handleDisableEndpoint(db))
	api.Handle("POST /api/endpoints/{id}/rotate-secret", handleRotateEndpointSecret(db, endpoints))

	mux := http.NewServeMux()
	mux.Handle("GET /healthz", handleHealthz())
	mux.Handle("GET /readyz", handleReadyz(db))
	mux.Handle("/api/", requireToken(token, api))
	return mux
}

// requireToken lets a request through only with "Authorization: Bearer
// <token>", compared in constant time.
func requireToken(token string, next http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
			writeError(w, http.StatusUnauthorized, errors.New("missing or wrong admin token"))
			return
		}
		next.ServeHTTP(w, r)
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

// maxRequestBody bounds every JSON request body: an event payload may be up
// to 1 MiB (schema.sql) plus its envelope.
const maxRequestBody = 1<<20 + 4096

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
			writeError(w, http.StatusBadRequest, err)
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

func handleGetEvent(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		ev, err := getEvent(r.Context(), db, id)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, ev)
	})
}

func handleRequeueEvent(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		if err := requeueEvent(r.Context(), db, id); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		ev, err := getEvent(r.Context(), db, id)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, ev)
	})
}

// statusOf maps an error to its HTTP status: the one place that does.
func statusOf(err error) int {
	switch {
	case errors.Is(err, errInvalid):
		return http.StatusBadRequest
	case errors.Is(err, errNotFound):
		return http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// decodeJSON reads one JSON object from a bounded body, refusing unknown
// fields (a typo in a field name is an error, not a silent default).
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("request body larger than %d bytes", tooBig.Limit)
		}
		return fmt.Errorf("request body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("request body: more than one JSON value")
	}
	return nil
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("id %q is not a positive integer", r.PathValue("id"))
	}
	return id, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encode response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeError answers {"error": "..."}; a server error's text is the
// operation that failed, which is what the operator needs.
func writeError(w http.ResponseWriter, status int, err error) {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, errInvalid.Error()+": ")
	writeJSON(w, status, map[string]string{"error": msg})
}
