// webhook.go: the job handler for kind "webhook": one signed POST of one
// event to one endpoint (or, for a mailto: endpoint, one mail), and the
// rules that turn its answer into the job's outcome and the endpoint's
// state, which the completer writes (completer.go).
//
// Guarantees (docs/guarantees.md, hops 4 to 7):
//   - webhook-id is the event id, the same on every attempt and replay, so a
//     receiver dedupes at-least-once delivery on it.
//   - No transaction is open across the request: the endpoint is read with
//     the claim, the request sent, then the completer writes the job's
//     outcome, the attempt and the endpoint's new state in one short
//     transaction (completer.go).
//   - A delivery to an endpoint that is disabled or was deleted ends
//     discarded without a request, with the reason kept.
//   - Mail: send, then mark. SMTP has no idempotency key, so a crash
//     between the two sends the message again, with the same Message-ID.
//     No SMTP server configured: the job completes and logs, without an
//     alert, since nothing could ever be sent. Failures retry on the
//     schedule of every job.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// webhookJobKind is the job kind of a delivery to an endpoint.
const webhookJobKind = "webhook"

const (
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
	// box opens the endpoint's secrets, which the claim reads as stored
	// (secrets.go).
	box *secretBox
	// exempt, with -demo, is the one delivery the address guard lets
	// reach an internal address; nil otherwise.
	exempt *guardExemption
	// endpointTLS are the clients of endpoints with TLS material
	// (clientcert.go); nil sends every delivery through client.
	endpointTLS *endpointClients
}

// guardExemption is the one endpoint whose deliveries may reach an
// address the guard refuses: -demo's own receiver, on outboxd's listener.
// It is keyed by the endpoint's id and its exact URL, and its client
// reaches the listener's address alone (safeHTTPOptions.AllowAddrs), so
// no other endpoint reaches outboxd through it (not one whose name
// resolves to the listener, nor one at the receiver's very URL), and no
// other path of outboxd is reached from it (redirects are not followed).
type guardExemption struct {
	endpointID func() int64 // 0 until the endpoint exists
	url        string
	client     *http.Client
}

// clientFor is the client a delivery to ep (endpoint id) goes through: the
// exemption's for the exempt endpoint at its exact URL, the endpoint's
// own for one with a client certificate or CA, the guarded one for every
// other.
func (s *webhookSender) clientFor(ctx context.Context, id int64, ep deliveryEndpoint) (*http.Client, error) {
	if e := s.exempt; e != nil && id != 0 && id == e.endpointID() && ep.URL == e.url {
		return e.client, nil
	}
	if s.endpointTLS != nil {
		return s.endpointTLS.client(ctx, id)
	}
	return s.client, nil
}

// mail is nil when no SMTP server is configured: mailto: jobs then
// complete and log.
func newWebhookSender(db *sql.DB, box *secretBox, client *http.Client, metrics *deliveryMetrics, mail *mailer, logger *slog.Logger) *webhookSender {
	if metrics == nil {
		metrics = newDeliveryMetrics()
	}
	return &webhookSender{
		db:        db,
		box:       box,
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

// classifyWebhookResponse is the one place that decides what an answer
// means; decideOutcome then turns the error into the job's next state.
// err is the transport's error (no answer); status and retryAfter are the
// answer's. The rules:
//
//	2xx                      success; clears failing_since
//	410 Gone                 discarded; disables the endpoint
//	408, 429, 5xx            retried; Retry-After honoured up to an hour,
//	                         and on a 429 or 503 by the whole endpoint
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

// endpointHold is how long an answer holds the whole endpoint: a 429 Too
// Many Requests or 503 Service Unavailable with Retry-After speaks for the
// receiver, not for one request, so none of its deliveries is sent before
// then (capped, as the job's own retry is, at maxRetryAfter). Other
// answers hold nothing.
func endpointHold(status int, outcome error) time.Duration {
	var after retryAfterError
	if (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) && errors.As(outcome, &after) {
		return after.delay
	}
	return 0
}

// parseRetryAfter reads a Retry-After value, delay-seconds or an HTTP date,
// as a delay from now, capped at maxRetryAfter.
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
		d = time.Duration(min(secs, int64(maxRetryAfter/time.Second))) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = max(at.Sub(now), 0)
	} else {
		return 0, false
	}
	return min(d, maxRetryAfter), true
}

// errEndpointDeleted ends a delivery whose endpoint was deleted: the
// operator's doing, logged once by the delete (deleteEndpoint), so the
// workers end each such job quietly (deliver.go, outcome).
var errEndpointDeleted = errors.New("endpoint deleted; not sent")

// errEventErased ends a delivery of an event whose payload was erased
// (erasure.go): the erasure discards them with this text, and a worker
// that meets one still, put back by hand in a race with the erasure, ends
// it so rather than send a body without the payload.
var errEventErased = errors.New("event erased; not sent")

// whyNotSent is why an attempt of a webhook job may send nothing, or nil
// when it may send.
func whyNotSent(job Job) error {
	ep := job.endpoint
	switch {
	case job.EndpointID == 0:
		return errEndpointDeleted
	case ep == nil:
		return fmt.Errorf("endpoint %d: %w", job.EndpointID, errEndpointDeleted)
	case ep.DisabledReason != nil:
		return fmt.Errorf("endpoint %d is disabled (%s); not sent", job.EndpointID, *ep.DisabledReason)
	case job.Event.Payload == nil:
		return errEventErased
	}
	return resendTooLate(job)
}

// deliver runs one attempt of a webhook job. Its error, if any, is the
// classified outcome that decideOutcome reads.
func (s *webhookSender) deliver(ctx context.Context, job Job) error {
	if err := whyNotSent(job); err != nil {
		return s.notSent(job, err)
	}
	ep := job.endpoint
	// The transport follows the endpoint's URL as it is now, so a queued
	// delivery follows a PATCH from https: to mailto: or back.
	if strings.HasPrefix(ep.URL, mailtoPrefix) {
		return s.deliverMail(ctx, job, *ep)
	}
	body, err := encodeWebhookBody(job.Event)
	if err != nil {
		return permanentError{err}
	}
	keys, custom, err := openRequest(s.box, job.EndpointID, ep.Secrets, ep.PublicKeys, ep.request)
	var client *http.Client
	if err == nil {
		client, err = s.clientFor(ctx, job.EndpointID, *ep)
	}
	if err != nil {
		// A key this process lacks (a secret's, a secret header's or the
		// client key's), or the endpoint's TLS material unread: retried,
		// so that a replica given the key (or this one, restarted with
		// it) delivers it.
		err = fmt.Errorf("%w; not sent", err)
		job.recordAttempt(deliveryAttempt{Error: err.Error()}, endpointUnchanged)
		return err
	}

	start := time.Now()
	ans, sendErr := signedRequest{url: ep.URL, keys: keys, custom: custom, msgID: strconv.FormatInt(job.Event.ID, 10),
		body: body, userAgent: s.userAgent, traceparent: job.Event.Traceparent, tracestate: job.Event.Tracestate,
	}.send(ctx, ep.request.client(client))
	attempt := deliveryAttempt{Duration: time.Since(start), StatusCode: ans.status, ResponseExcerpt: ans.excerpt,
		Class: classifyAttempt(ans.status, sendErr)}
	change, outcome := classifyWebhookResponse(ans.status, ans.retryAfter, sendErr, time.Now())
	if outcome != nil && ans.excerpt != "" {
		outcome = fmt.Errorf("%w: %q", outcome, truncate(ans.excerpt, webhookErrorExcerptLen))
	}
	if outcome != nil {
		attempt.Error = truncate(outcome.Error(), maxErrorLen)
	}
	if change == endpointSucceeded {
		// Only an answer that accepted the webhook speaks for the
		// receiver's dedup: an error page may come from a proxy.
		attempt.DedupWindow, attempt.DedupWindowRead = parseDedupWindow(ans.dedupWindow), true
		attempt.CommitTo2xx = time.Since(job.committedAt)
	}
	attempt.Hold = endpointHold(ans.status, outcome)
	s.observe(job, attempt, change, sendErr)
	job.recordAttempt(attempt, change)
	return outcome
}

// observe counts an attempt for /metrics: its outcome, its duration and,
// for a success, the time from the event's commit to this first 2xx (a job
// succeeds once, so its success is the pair's first). A test send's
// attempts are not counted, as the statistics count none (record_outcomes
// in schema.sql): the delivery counters are the real deliveries'.
func (s *webhookSender) observe(job Job, a deliveryAttempt, change endpointChange, sendErr error) {
	if job.Event.Test {
		return
	}
	outcome := "failed_status"
	switch {
	case sendErr != nil:
		outcome = "no_answer"
	case change == endpointSucceeded:
		outcome = "success"
		s.metrics.commitTo2xx.With(strconv.FormatInt(job.EndpointID, 10)).Observe(a.CommitTo2xx.Seconds())
	case change == endpointGone:
		outcome = "gone"
	}
	s.metrics.outcomes.Add(outcome, 1)
	s.metrics.latency.Observe(a.Duration.Seconds())
}

// webhookAnswer is what a delivery reads of the receiver's answer.
type webhookAnswer struct {
	status      int
	retryAfter  string // Retry-After
	dedupWindow string // webhook-dedup-window
	excerpt     string // the start of the body, as text
}

// openRequest is what a request to endpoint id needs of its row as
// stored, opened by box: its signing keys (secrets and their publicKeys,
// current first: deliveryEndpoint) and its custom headers, the secret ones
// opened too. An error is a key this process lacks: nothing is sent.
// Deliveries and recovery probes (probe.go) both open their endpoint so.
func openRequest(box *secretBox, id int64, secrets, publicKeys [][]byte, r endpointRequest) ([]signingKey, http.Header, error) {
	opened, err := box.openAll(endpointSecretRow(id), secrets)
	if err != nil {
		return nil, nil, err
	}
	keys, err := signingKeysOf(opened, publicKeys)
	if err != nil {
		return nil, nil, err
	}
	custom := http.Header{}
	if err := r.setHeaders(custom, box, id); err != nil {
		return nil, nil, err
	}
	return keys, custom, nil
}

// signedRequest is one signed POST as deliveries and recovery probes
// send it: msgID is its webhook-id, traceparent and tracestate the
// producer's trace (nil for none).
type signedRequest struct {
	url                     string
	keys                    []signingKey
	custom                  http.Header
	msgID                   string
	body                    []byte
	userAgent               string
	traceparent, tracestate *string
}

// send makes the request through client, with the endpoint's custom
// headers, and reads a bounded part of the answer. outboxd's own headers
// are set after the custom ones, which may take none of their names
// (checkHeaderName).
func (sr signedRequest) send(ctx context.Context, client *http.Client) (webhookAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sr.url, bytes.NewReader(sr.body))
	if err != nil {
		return webhookAnswer{}, err
	}
	maps.Copy(req.Header, sr.custom)
	setSignedHeaders(req.Header, sr.keys, sr.msgID, time.Now(), sr.body)
	// The producer's trace continues at the receiver (W3C Trace Context);
	// schema.sql stored only well-formed values.
	if sr.traceparent != nil {
		req.Header.Set("traceparent", *sr.traceparent)
		if sr.tracestate != nil {
			req.Header.Set("tracestate", *sr.tracestate)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", sr.userAgent)
	resp, err := client.Do(req)
	if err != nil {
		return webhookAnswer{}, err
	}
	defer resp.Body.Close()
	// A read error after the status line changes nothing: the receiver
	// has answered, and its status is the outcome.
	text, _, _ := readLimited(resp.Body, webhookMaxResponseRead)
	return webhookAnswer{
		status:      resp.StatusCode,
		retryAfter:  resp.Header.Get("Retry-After"),
		dedupWindow: resp.Header.Get(headerDedupWindow),
		excerpt:     textExcerpt(text, webhookExcerptLen),
	}, nil
}

// parseDedupWindow reads a webhook-dedup-window value: whole seconds,
// above 0, at most maxRetention (ten years is "kept"). Anything else
// advertises nothing (0): a window the sender cannot read is not one it
// may rely on.
func parseDedupWindow(v string) time.Duration {
	secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || secs <= 0 {
		return 0
	}
	return time.Duration(min(secs, int64(maxRetention/time.Second))) * time.Second
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
	job.recordAttempt(deliveryAttempt{Error: reason.Error()}, endpointUnchanged)
	return permanentError{reason}
}

// eventMail is the message a mailto: endpoint gets for one event.
func eventMail(to string, ev Event) mailMessage {
	var payload bytes.Buffer
	if err := json.Indent(&payload, ev.Payload, "", "  "); err != nil {
		payload.Reset()
		payload.Write(ev.Payload)
	}
	subject := "[outboxd] " + ev.Topic
	if ev.Subject != "" {
		subject += " " + ev.Subject
	}
	body := fmt.Sprintf("Event %d, %s, subject %q, recorded %s.\n\n%s\n",
		ev.ID, ev.Topic, ev.Subject, ev.CreatedAt.UTC().Format(time.RFC3339), payload.String())
	return mailMessage{To: to, Subject: subject, Body: body, EventID: ev.ID}
}

// noSMTPNote is kept with an attempt that sent nothing because no server
// is configured.
const noSMTPNote = "not sent: no SMTP server configured (-smtp-url)"

// deliverMail runs one attempt of a webhook job whose endpoint is mailto:.
// It is the webhook path with another transport: the attempt is recorded
// in outbox.deliveries and moves the endpoint's state the same way, and
// its error goes through decideOutcome.
func (s *webhookSender) deliverMail(ctx context.Context, job Job, ep deliveryEndpoint) error {
	to := strings.TrimPrefix(ep.URL, mailtoPrefix)
	if !s.mail.configured() {
		s.logger.Info("mail not sent: no SMTP server configured", "job_id", job.ID, "endpoint_id", job.EndpointID, "event_id", job.Event.ID)
		job.recordAttempt(deliveryAttempt{Error: noSMTPNote}, endpointUnchanged)
		return nil
	}
	start := time.Now()
	err := s.mail.send(ctx, eventMail(to, job.Event))
	attempt := deliveryAttempt{Duration: time.Since(start), Class: classifyAttempt(0, err)}
	change := endpointSucceeded
	if err == nil {
		attempt.CommitTo2xx = time.Since(job.committedAt)
	} else {
		change = endpointFailed
		err = fmt.Errorf("mail: %w", err)
		attempt.Error = truncate(err.Error(), maxErrorLen)
	}
	s.metrics.outcomes.Add(map[bool]string{true: "mail_sent", false: "mail_failed"}[err == nil], 1)
	job.recordAttempt(attempt, change)
	return err
}
