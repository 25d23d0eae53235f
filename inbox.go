// inbox.go: the receiving side, signed webhooks from other senders turned
// into local events once per webhook-id, and the sources API.
//
// Guarantees (README, "Guarantees, hop by hop", hop 6):
//   - The signature is checked on the raw bytes received (Standard
//     Webhooks, signature.go), with the ±5 minute timestamp tolerance.
//   - The dedup row (source, webhook-id) and the local event commit in one
//     transaction; the sender gets its 2xx only after that commit. A second
//     delivery of the same webhook-id answers 2xx and changes nothing, for
//     as long as inbox retention keeps the row (longer than any retry).

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
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// InboxSource is one row of outbox.inbox_sources as the API shows it; the
// secret only in the answers to create and rotate-secret.
type InboxSource struct {
	Name                    string     `json:"name"`
	TopicPrefix             string     `json:"topic_prefix"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	CreatedAt               time.Time  `json:"created_at"`
	URLPath                 string     `json:"url_path"` // where the sender posts
}

type inboxSourceWithSecret struct {
	InboxSource
	Secret string `json:"secret"`
}

// maxTopicPrefixLen matches schema.sql's inbox_sources_topic_prefix_format:
// a prefix leaves room for the sender's type within a topic's 200.
const maxTopicPrefixLen = 100

// topicPrefixValid reports whether p may start a topic: empty, or up to
// maxTopicPrefixLen characters of a topic.
func topicPrefixValid(p string) bool {
	return p == "" || (len(p) <= maxTopicPrefixLen && topicPattern.MatchString(p))
}

// maxInboxBody bounds a received webhook: an event payload may be up to
// 1 MiB (schema.sql) plus its envelope, the same bound as POST /api/events.
const maxInboxBody = maxRequestBody

const sourceColumns = `
  name, topic_prefix,
  CASE WHEN previous_secret_expires_at > now() THEN previous_secret_expires_at END,
  created_at`

func scanSource(row rowScanner) (InboxSource, error) {
	var s InboxSource
	err := row.Scan(&s.Name, &s.TopicPrefix, &s.PreviousSecretExpiresAt, &s.CreatedAt)
	s.URLPath = "/webhooks/" + s.Name
	return s, err
}

// sourceInput is the body of POST /api/sources. Secret is the sender's
// (whsec_... or bare base64); empty generates one to give the sender.
// TopicPrefix nil means name + ".".
type sourceInput struct {
	Name        string  `json:"name"`
	Secret      string  `json:"secret"`
	TopicPrefix *string `json:"topic_prefix"`
}

// parseSourceSecret reads a given secret, or makes one when none is given.
func parseSourceSecret(text string) (webhookSecret, error) {
	if text == "" {
		return newWebhookSecret(), nil
	}
	s, err := parseWebhookSecret(text)
	if err != nil {
		return nil, fmt.Errorf("%w: secret: %v", errInvalid, err)
	}
	if len(s) > 64 {
		return nil, fmt.Errorf("%w: secret is %d bytes, at most 64", errInvalid, len(s))
	}
	return s, nil
}

const createSourceSQL = `
INSERT INTO outbox.inbox_sources (name, secret, topic_prefix)
VALUES ($1, $2, $3)
RETURNING` + sourceColumns

func createSource(ctx context.Context, db *sql.DB, in sourceInput) (inboxSourceWithSecret, error) {
	if !namePattern.MatchString(in.Name) {
		return inboxSourceWithSecret{}, fmt.Errorf("%w: name %q must be 1-50 of a-z 0-9 _ -", errInvalid, in.Name)
	}
	prefix := in.Name + "."
	if in.TopicPrefix != nil {
		prefix = *in.TopicPrefix
	}
	if !topicPrefixValid(prefix) {
		return inboxSourceWithSecret{}, fmt.Errorf("%w: topic_prefix %q must be empty or up to 100 topic characters", errInvalid, prefix)
	}
	secret, err := parseSourceSecret(in.Secret)
	if err != nil {
		return inboxSourceWithSecret{}, err
	}
	s, err := scanSource(db.QueryRowContext(ctx, createSourceSQL, in.Name, []byte(secret), prefix))
	if pq.As(err, pqerror.UniqueViolation) != nil {
		return inboxSourceWithSecret{}, fmt.Errorf("%w: source %q exists", errInvalid, in.Name)
	}
	if err != nil {
		return inboxSourceWithSecret{}, fmt.Errorf("create source: %w", err)
	}
	return inboxSourceWithSecret{InboxSource: s, Secret: secret.Encode()}, nil
}

const listSourcesSQL = `
SELECT` + sourceColumns + `
FROM outbox.inbox_sources
ORDER BY name
LIMIT 1000`

func listSources(ctx context.Context, db *sql.DB) ([]InboxSource, error) {
	sources, err := queryAll(ctx, db, scanSource, listSourcesSQL)
	if err != nil {
		return nil, fmt.Errorf("list sources: %w", err)
	}
	return sources, nil
}

// deleteSourceSQL removes a source; its inbox rows stay until retention,
// so a source deleted and added again still dedupes what it received.
const deleteSourceSQL = `
DELETE FROM outbox.inbox_sources
WHERE name = $1`

func deleteSource(ctx context.Context, db *sql.DB, name string) error {
	res, err := db.ExecContext(ctx, deleteSourceSQL, name)
	if err != nil {
		return fmt.Errorf("delete source %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("source %q: %w", name, errNotFound)
	}
	return nil
}

// rotateSourceSecretSQL makes $2 the secret and keeps the current one
// verifying for $3 seconds more, as endpoints do.
const rotateSourceSecretSQL = `
UPDATE outbox.inbox_sources
SET previous_secret = secret,
    previous_secret_expires_at = now() + make_interval(secs => $3),
    secret = $2
WHERE name = $1
RETURNING` + sourceColumns

func rotateSourceSecret(ctx context.Context, db *sql.DB, name string, secret webhookSecret, window time.Duration) (InboxSource, error) {
	s, err := scanSource(db.QueryRowContext(ctx, rotateSourceSecretSQL, name, []byte(secret), window.Seconds()))
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("source %q: %w", name, errNotFound)
	}
	if err != nil {
		return s, fmt.Errorf("rotate secret of source %q: %w", name, err)
	}
	return s, nil
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

// sourceVerifySQL reads what verification needs: the secret and, inside
// its rotation window, the previous one.
const sourceVerifySQL = `
SELECT secret,
       CASE WHEN previous_secret_expires_at > now() THEN previous_secret END,
       topic_prefix
FROM outbox.inbox_sources
WHERE name = $1`

// receivedWebhook is the body of a Standard Webhooks delivery as outboxd
// sends it; only type is required.
type receivedWebhook struct {
	Type    string          `json:"type"`
	Subject string          `json:"subject"`
	Data    json.RawMessage `json:"data"`
}

// claimInboxSQL takes the dedup row; no row back means this webhook-id
// of this source was recorded before.
const claimInboxSQL = `
INSERT INTO outbox.inbox (source, webhook_id)
VALUES ($1, $2)
ON CONFLICT (source, webhook_id) DO NOTHING
RETURNING 1`

const setInboxEventSQL = `
UPDATE outbox.inbox
SET event_id = $3
WHERE source = $1
  AND webhook_id = $2`

// receive records a verified webhook as a local event, once per webhook-id.
// It returns the new event's id, or duplicate.
func receive(ctx context.Context, db *sql.DB, source, webhookID, topic string, wh receivedWebhook) (eventID int64, duplicate bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, false, fmt.Errorf("receive webhook: %w", err)
	}
	defer tx.Rollback()
	var one int
	err = tx.QueryRowContext(ctx, claimInboxSQL, source, webhookID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("receive webhook: dedup: %w", err)
	}
	if eventID, err = recordEvent(ctx, tx, topic, wh.Subject, wh.Data); err != nil {
		return 0, false, err
	}
	if _, err := tx.ExecContext(ctx, setInboxEventSQL, source, webhookID, eventID); err != nil {
		return 0, false, fmt.Errorf("receive webhook: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, false, fmt.Errorf("receive webhook: commit: %w", err)
	}
	return eventID, false, nil
}

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
