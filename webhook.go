// webhook.go: the job handler for kind "webhook", one signed POST of one
// event to one endpoint, and the rules that turn its answer into the job's
// outcome and the endpoint's state.
//
// Guarantees (DESIGN.md, hops 4 to 6):
//   - webhook-id is the event id, the same on every attempt and replay, so a
//     receiver dedupes at-least-once delivery on it.
//   - No transaction is open across the request: the endpoint is read, the
//     request sent, then the attempt and the endpoint's new state are
//     written in one short transaction, and the job's outcome by the
//     worker pool's completer as for every job.
//   - A delivery to an endpoint that is disabled or was deleted ends
//     discarded without a request, with the reason kept.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
)

// webhookJobKind is the job kind of a delivery to an endpoint.
const webhookJobKind = "webhook"

const (
	// webhookMaxRetryAfter bounds how far a receiver's Retry-After may push
	// one retry: an hour rides out a deploy or a rate-limit window, and
	// retryHorizon counts it, so the schedule still ends inside events
	// retention whatever receivers answer.
	webhookMaxRetryAfter = time.Hour
	// webhookMaxResponseRead is how much of an answer is read: enough that
	// an ordinary small answer is read to its end and the connection goes
	// back to the pool for the next delivery; a longer one is cut and its
	// connection closed rather than drained.
	webhookMaxResponseRead = 64 << 10
	// webhookExcerptLen is how much of an answer is kept per attempt for
	// the panel: enough to read an error message, too little to store a
	// page (or turn a blind SSRF into a readable one).
	webhookExcerptLen = 1024
	// webhookErrorExcerptLen is how much of an answer goes into the job's
	// error text, which is read in lists.
	webhookErrorExcerptLen = 200
)

// WebhookConfig holds the webhook sender's numbers.
type WebhookConfig struct {
	// Timeout bounds one delivery request, reading the answer included. A
	// receiver should answer fast and do its work later; one that takes
	// longer is counted as failed and retried.
	Timeout time.Duration
	// SecretRotationWindow is how long a rotated-out secret still signs
	// deliveries beside the new one, so receivers can switch without
	// refusing a single delivery. A day covers a deploy on the receiver's
	// side.
	SecretRotationWindow time.Duration
}

// webhookSender delivers webhook jobs with the one safe HTTP client.
type webhookSender struct {
	db        *sql.DB
	client    *http.Client
	userAgent string
	metrics   *deliveryMetrics
	// mail sends to mailto: endpoints; nil: no SMTP configured, and such
	// deliveries complete with a log line (mail.go).
	mail   *mailer
	logger *slog.Logger
}

// mail is nil when no SMTP server is configured: mailto: jobs then
// complete and log.
func newWebhookSender(db *sql.DB, client *http.Client, metrics *deliveryMetrics, mail *mailer, logger *slog.Logger) *webhookSender {
	if metrics == nil {
		metrics = newDeliveryMetrics()
	}
	return &webhookSender{
		db:        db,
		client:    client,
		userAgent: "outboxd/" + version,
		metrics:   metrics,
		mail:      mail,
		logger:    logger.With("loop", "webhooks"),
	}
}

// webhookBody is the JSON body of a delivery, in the order the fields are
// documented. id is a string, as webhook-id is.
type webhookBody struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Subject   string          `json:"subject"`
	Timestamp string          `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// encodeWebhookBody is the body for ev: the same bytes on every attempt.
func encodeWebhookBody(ev Event) ([]byte, error) {
	data := ev.Payload
	if len(data) == 0 {
		data = json.RawMessage(`{}`)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// The payload is the application's JSON; "<" stays "<".
	enc.SetEscapeHTML(false)
	err := enc.Encode(webhookBody{
		ID:        strconv.FormatInt(ev.ID, 10),
		Type:      ev.Topic,
		Subject:   ev.Subject,
		Timestamp: ev.CreatedAt.UTC().Format(time.RFC3339Nano),
		Data:      data,
	})
	if err != nil {
		return nil, fmt.Errorf("encode webhook body: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// endpointChange is what an attempt's answer does to its endpoint.
type endpointChange int

const (
	endpointUnchanged endpointChange = iota // no request was made
	endpointSucceeded                       // clears failing_since
	endpointFailed                          // sets failing_since if unset
	endpointGone                            // 410: disables the endpoint
)

// classifyWebhookResponse is the one place that decides what an answer
// means; decideOutcome then turns the error into the job's next state.
// err is the transport's error (no answer); status and retryAfter are the
// answer's. The rules:
//
//	2xx                      success; clears failing_since
//	410 Gone                 discarded; disables the endpoint
//	408, 429, 5xx            retried; Retry-After honoured up to an hour
//	no answer (timeout, refused connection or address)
//	                         retried
//	any other status (3xx: redirects are not followed; other 4xx: a
//	receiver misconfigured today is fixed tomorrow)
//	                         retried
//
// Every failure sets failing_since if it is unset.
func classifyWebhookResponse(status int, retryAfter string, err error, now time.Time) (endpointChange, error) {
	switch {
	case err != nil:
		return endpointFailed, fmt.Errorf("webhook: %w", err)
	case status >= 200 && status <= 299:
		return endpointSucceeded, nil
	case status == http.StatusGone:
		return endpointGone, permanentError{fmt.Errorf("webhook: answered %d %s: endpoint disabled", status, http.StatusText(status))}
	}
	failure := fmt.Errorf("webhook: answered %d %s", status, http.StatusText(status))
	if status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500 {
		if delay, ok := parseRetryAfter(retryAfter, now); ok {
			return endpointFailed, retryAfterError{failure, delay}
		}
	}
	return endpointFailed, failure
}

// parseRetryAfter reads a Retry-After value, delay-seconds or an HTTP date,
// as a delay from now, capped at webhookMaxRetryAfter.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		d = time.Duration(min(secs, int64(webhookMaxRetryAfter/time.Second))) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = max(at.Sub(now), 0)
	} else {
		return 0, false
	}
	return min(d, webhookMaxRetryAfter), true
}

// webhookGoneReason is disabled_reason after a 410.
const webhookGoneReason = "the receiver answered 410 Gone"

// deliveryEndpoint is an endpoint as one attempt sees it.
type deliveryEndpoint struct {
	URL            string
	Secrets        [][]byte // current first; the previous one during a rotation
	DisabledReason *string
}

// deliveryAttempt is what one attempt leaves for the panel.
type deliveryAttempt struct {
	Duration        time.Duration
	StatusCode      int // 0: no answer
	Error           string
	ResponseExcerpt string
}

// deliver runs one attempt of a webhook job. Its error, if any, is the
// classified outcome that decideOutcome reads.
func (s *webhookSender) deliver(ctx context.Context, job Job) error {
	if job.EndpointID == 0 {
		return s.notSent(job, errors.New("endpoint deleted; not sent"))
	}
	ep := job.endpoint
	if ep == nil {
		return s.notSent(job, fmt.Errorf("endpoint %d deleted; not sent", job.EndpointID))
	}
	if ep.DisabledReason != nil {
		return s.notSent(job, fmt.Errorf("endpoint %d is disabled (%s); not sent", job.EndpointID, *ep.DisabledReason))
	}
	// The transport follows the endpoint's URL as it is now, so a queued
	// delivery follows a PATCH from https: to mailto: or back.
	if strings.HasPrefix(ep.URL, mailtoPrefix) {
		return s.deliverMail(ctx, job, *ep)
	}
	body, err := encodeWebhookBody(job.Event)
	if err != nil {
		return permanentError{err}
	}

	start := time.Now()
	status, retryAfter, excerpt, sendErr := s.post(ctx, *ep, job.Event.ID, body)
	attempt := deliveryAttempt{Duration: time.Since(start), StatusCode: status, ResponseExcerpt: excerpt}
	change, outcome := classifyWebhookResponse(status, retryAfter, sendErr, time.Now())
	if outcome != nil && excerpt != "" {
		outcome = fmt.Errorf("%w: %q", outcome, truncate(excerpt, webhookErrorExcerptLen))
	}
	if outcome != nil {
		attempt.Error = truncate(outcome.Error(), maxErrorLen)
	}
	s.observe(job, attempt, change, sendErr)
	s.record(job, attempt, change)
	return outcome
}

// observe counts an attempt for /metrics: its outcome, its duration and,
// for a success, the time from the event's commit to this first 2xx (a job
// succeeds once, so its success is the pair's first).
func (s *webhookSender) observe(job Job, a deliveryAttempt, change endpointChange, sendErr error) {
	outcome := "failed_status"
	switch {
	case sendErr != nil:
		outcome = "no_answer"
	case change == endpointSucceeded:
		outcome = "success"
		s.metrics.commitTo2xx.With(strconv.FormatInt(job.EndpointID, 10)).Observe(time.Since(job.Event.CreatedAt).Seconds())
	case change == endpointGone:
		outcome = "gone"
	}
	s.metrics.outcomes.Add(outcome, 1)
	s.metrics.latency.Observe(a.Duration.Seconds())
}

// post sends one signed request and reads a bounded part of the answer.
func (s *webhookSender) post(ctx context.Context, ep deliveryEndpoint, eventID int64, body []byte) (status int, retryAfter, excerpt string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	setWebhookHeaders(req.Header, ep.Secrets, strconv.FormatInt(eventID, 10), time.Now(), body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", s.userAgent)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	// A read error after the status line changes nothing: the receiver
	// has answered, and its status is the outcome.
	answer, _, _ := readLimited(resp.Body, webhookMaxResponseRead)
	return resp.StatusCode, resp.Header.Get("Retry-After"), textExcerpt(answer, webhookExcerptLen), nil
}

// textExcerpt is the start of b as text PostgreSQL will store: valid UTF-8,
// no NUL bytes, at most n bytes and an ellipsis.
func textExcerpt(b []byte, n int) string {
	if len(b) > n+4 {
		b = b[:n+4] // room for the rune the cut splits
	}
	s := strings.ToValidUTF8(strings.ReplaceAll(string(b), "\x00", ""), "\uFFFD")
	return truncate(s, n)
}

// notSent records an attempt that made no request, and discards the job.
func (s *webhookSender) notSent(job Job, reason error) error {
	s.record(job, deliveryAttempt{Error: reason.Error()}, endpointUnchanged)
	return permanentError{reason}
}

// The endpoint's state after an attempt; each skips the write when there
// is nothing to change, so a healthy endpoint's row is not rewritten on
// every delivery.
const (
	endpointSucceededSQL = `
UPDATE outbox.endpoints
SET failing_since = NULL
WHERE id = ANY($1::bigint[])
  AND failing_since IS NOT NULL`

	endpointFailedSQL = `
UPDATE outbox.endpoints
SET failing_since = now()
WHERE id = ANY($1::bigint[])
  AND failing_since IS NULL`

	endpointGoneSQL = `
UPDATE outbox.endpoints
SET disabled_at = now(),
    disabled_reason = '` + webhookGoneReason + `',
    failing_since = coalesce(failing_since, now())
WHERE id = ANY($1::bigint[])
  AND disabled_at IS NULL`
)

// attemptRecord is what one attempt leaves behind: its row in
// outbox.deliveries and its effect on the endpoint. The handler fills it
// in; the completer writes it in the transaction that records the job's
// outcome (writeAttemptRecords), so a job's state, its attempt and its
// endpoint's state are never seen apart, and a delivery costs no commit
// of its own.
type attemptRecord struct {
	deliveryAttempt
	EndpointID int64
	Change     endpointChange
	set        bool
}

// record leaves what an attempt did on its job for the completer.
func (s *webhookSender) record(job Job, a deliveryAttempt, change endpointChange) {
	if job.attempt == nil {
		return // not run by a worker pool: nobody would write it
	}
	*job.attempt = attemptRecord{deliveryAttempt: a, EndpointID: job.EndpointID, Change: change, set: true}
}

// insertDeliveriesSQL keeps a batch of attempts. An attempt is recorded
// once; a rescued attempt's late worker records under its own number.
const insertDeliveriesSQL = `
INSERT INTO outbox.deliveries (job_id, attempt, endpoint_id, duration_ms, status_code, error, response_excerpt)
SELECT a.job_id, a.attempt, nullif(a.endpoint_id, 0), a.duration_ms, nullif(a.status_code, 0), a.error, a.excerpt
FROM unnest($1::bigint[], $2::integer[], $3::bigint[], $4::integer[], $5::integer[], $6::text[], $7::text[])
     AS a(job_id, attempt, endpoint_id, duration_ms, status_code, error, excerpt)
ON CONFLICT (job_id, attempt) DO NOTHING`

// writeAttemptRecords writes a batch's attempts and moves each endpoint to
// the state its last attempt in the batch left it in.
func writeAttemptRecords(ctx context.Context, tx *sql.Tx, batch []jobResult) error {
	var jobIDs, endpointIDs []int64
	var attempts, durations, statuses []int64
	var errs, excerpts []string
	last := map[int64]endpointChange{} // batch order is completion order
	for _, r := range batch {
		rec := r.record
		if rec == nil {
			continue
		}
		jobIDs = append(jobIDs, r.ID)
		attempts = append(attempts, int64(r.Attempt))
		endpointIDs = append(endpointIDs, rec.EndpointID)
		durations = append(durations, rec.Duration.Milliseconds())
		statuses = append(statuses, int64(rec.StatusCode))
		errs = append(errs, rec.Error)
		excerpts = append(excerpts, rec.ResponseExcerpt)
		if rec.EndpointID != 0 && rec.Change != endpointUnchanged {
			last[rec.EndpointID] = rec.Change
		}
	}
	if len(jobIDs) == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, insertDeliveriesSQL, pq.Array(jobIDs), pq.Array(attempts), pq.Array(endpointIDs),
		pq.Array(durations), pq.Array(statuses), pq.Array(errs), pq.Array(excerpts)); err != nil {
		return fmt.Errorf("record webhook attempts: %w", err)
	}
	byChange := map[endpointChange][]int64{}
	for id, change := range last {
		byChange[change] = append(byChange[change], id)
	}
	for _, step := range []struct {
		change endpointChange
		query  string
	}{{endpointGone, endpointGoneSQL}, {endpointFailed, endpointFailedSQL}, {endpointSucceeded, endpointSucceededSQL}} {
		ids := byChange[step.change]
		if len(ids) == 0 {
			continue
		}
		slices.Sort(ids) // one lock order for every replica's completer
		if _, err := tx.ExecContext(ctx, step.query, pq.Array(ids)); err != nil {
			return fmt.Errorf("record webhook attempts: endpoint state: %w", err)
		}
	}
	return nil
}
