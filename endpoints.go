// endpoints.go: webhook endpoints, their validation and their SQL.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// Endpoint is one row of outbox.endpoints as the API shows it. The secret
// is never part of it: it is shown once, by create and rotate-secret.
type Endpoint struct {
	ID          int64    `json:"id"`
	URL         string   `json:"url"`
	Description string   `json:"description"`
	OwnerEmail  string   `json:"owner_email"`
	Topics      []string `json:"topics"`
	// State is derived: "disabled" if DisabledAt is set, else "paused" if
	// PausedAt is, else "failing" if FailingSince is, else "enabled": the
	// four values of the API's contract, which programs switch on.
	State string `json:"state"`
	// Health says how bad a failure is, as the panel does: "ok" while no
	// delivery has failed since the last success, "failing" where
	// endpoint_failing holds for it (its breaker is open, or its success
	// rate stays below the threshold: withHealth, overview.go), and
	// "degraded" after a failure that does not make it fail.
	Health         string     `json:"health"`
	FailingSince   *time.Time `json:"failing_since"`
	DisabledAt     *time.Time `json:"disabled_at"`
	DisabledReason *string    `json:"disabled_reason"`
	PausedAt       *time.Time `json:"paused_at"`
	// MaxInFlight caps the endpoint's deliveries running at once, over
	// every replica; RateLimitPerSecond, if set, spaces its requests.
	MaxInFlight        int      `json:"max_in_flight"`
	RateLimitPerSecond *float64 `json:"rate_limit_per_second"`
	// Ordering is "subject" (each subject's deliveries one at a time, in
	// fan-out order) or "none".
	Ordering string `json:"ordering"`
	// InFlight is how many of its deliveries run now.
	InFlight int64   `json:"in_flight"`
	Breaker  breaker `json:"breaker"`
	// HeldUntil is set while a receiver's Retry-After (on a 429 or 503)
	// holds every delivery to the endpoint.
	HeldUntil *time.Time `json:"held_until"`
	// PreviousSecretExpiresAt is the end of a rotation window, while one
	// is open: until then deliveries carry both signatures.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	// DedupWindowSeconds is the receiver's dedup window as a 2xx answer
	// last advertised it (webhook-dedup-window), and DedupWindowSeenAt
	// when an answer last said so (refreshed hourly); nil: never
	// advertised. Resends to the endpoint are clamped to it (replay.go).
	DedupWindowSeconds *int64     `json:"dedup_window_seconds"`
	DedupWindowSeenAt  *time.Time `json:"dedup_window_seen_at"`
	CreatedAt          time.Time  `json:"created_at"`
	UpdatedAt          time.Time  `json:"updated_at"`
	// DisabledCause is who disabled it: "operator", "gone" (a 410) or
	// "failure" (the 5-day sweep); nil while enabled, and for an endpoint
	// disabled before causes were recorded.
	DisabledCause *string `json:"disabled_cause"`
	// RecoveryProbes lets the prober (probe.go) probe the endpoint once it
	// is disabled for failure, and re-enable it at the first 2xx.
	RecoveryProbes bool     `json:"recovery_probes"`
	Recovery       recovery `json:"recovery"`
	// Filter is a SQL/JSON path predicate over the payload that an event
	// of its topics must pass to be delivered to it (docs/filters.md);
	// nil: every event of its topics.
	Filter *string `json:"filter"`
	// FilterError says why the relay stopped evaluating the filter, and
	// FilterErrorAt since when: it failed a relay pass (an error silent
	// does not cover, or too long a run), and until the filter is written
	// again no event of its topics is delivered to it (docs/filters.md).
	FilterError   *string    `json:"filter_error"`
	FilterErrorAt *time.Time `json:"filter_error_at"`
	// ClientCertificate and CACertificate describe the endpoint's TLS
	// material (clientcert.go); ClientKeySet says that a key is stored,
	// which no answer ever shows.
	ClientCertificate *certificateInfo `json:"client_certificate"`
	ClientKeySet      bool             `json:"client_key_set"`
	CACertificate     *certificateInfo `json:"ca_certificate"`
	// OwnerID is the owner who may see and manage it through the portal
	// (owners.go); nil: the admin's alone.
	OwnerID *int64 `json:"owner_id"`
	// MaxAttempts, RetryWindowSeconds and TimeoutSeconds are its own
	// retry schedule and request timeout, nil for the service's defaults;
	// Headers the static headers its requests carry, a secret one's
	// value shown as {"secret": true} (endpointrequest.go).
	MaxAttempts        *int            `json:"max_attempts"`
	RetryWindowSeconds *int64          `json:"retry_window_seconds"`
	TimeoutSeconds     *int64          `json:"timeout_seconds"`
	Headers            json.RawMessage `json:"headers"`
	// Signature is the scheme its requests are signed with: "v1" (HMAC
	// with its secret) or "v1a" (ed25519: PublicKey, whpk_..., is what
	// its receiver verifies with; the private key is never shown).
	// PreviousSignature and PreviousPublicKey are those of the key rotated
	// out, while it still signs (PreviousSecretExpiresAt).
	Signature         string  `json:"signature"`
	PublicKey         *string `json:"public_key"`
	PreviousSignature *string `json:"previous_signature"`
	PreviousPublicKey *string `json:"previous_public_key"`
}

// HeaderList is the endpoint's headers as a page shows them, secret
// values masked.
func (e Endpoint) HeaderList() []shownHeader { return shownHeaders(e.Headers) }

// recovery is what the prober did to an endpoint, as the API shows it:
// NextProbeAt is set while a probe is scheduled; RecoveredAt and
// RecoveredReason tell the last time a probe re-enabled it, and why.
type recovery struct {
	NextProbeAt     *time.Time `json:"next_probe_at"`
	LastProbeAt     *time.Time `json:"last_probe_at"`
	LastProbeError  *string    `json:"last_probe_error"`
	RecoveredAt     *time.Time `json:"recovered_at"`
	RecoveredReason *string    `json:"recovered_reason"`
}

// breaker is an endpoint's circuit breaker as the API shows it: "open"
// after -breaker-threshold attempts failed in a row (one attempt at a
// time then), "closed" otherwise.
type breaker struct {
	State               string     `json:"state"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	OpenedAt            *time.Time `json:"opened_at"`
}

// defaultMaxInFlight is an endpoint's cap unless it says otherwise: a
// receiver that hangs holds 16 of the 128 default workers, and the other
// 112 serve everyone else (TestHangingReceiverHoldsOnlyItsCap). schema.sql's
// column default repeats it.
const defaultMaxInFlight = 16

// Bounds of the delivery settings; schema.sql's CHECKs repeat them.
const (
	maxMaxInFlight = 1000
	minRateLimit   = 0.01
	maxRateLimit   = 10_000
)

// An endpoint's ordering: none, or one delivery at a time per subject.
const (
	orderingNone    = "none"
	orderingSubject = "subject"
)

// The states of an endpoint's circuit breaker.
const (
	breakerOpen   = "open"
	breakerClosed = "closed"
)

// Name is how a person knows the endpoint: its description, else its
// URL.
func (e Endpoint) Name() string {
	if e.Description != "" {
		return e.Description
	}
	return e.URL
}

// endpointNamesSQL is each endpoint of ids $1, with what names it; of
// owner $2's endpoints only, unless NULL (the admin's view).
const endpointNamesSQL = `
SELECT id, description, url
FROM outbox.endpoints
WHERE id = ANY($1)
  AND ($2::bigint IS NULL OR owner_id = $2)`

// endpointNames is the Name of each endpoint of ids that exists, by id,
// of ownerID's only unless it is nil: what a page shows a person for an
// endpoint's id, never the name of one the person may not see.
func endpointNames(ctx context.Context, db *sql.DB, ids []int64, ownerID *int64) (map[int64]string, error) {
	names := make(map[int64]string, len(ids))
	if len(ids) == 0 {
		return names, nil
	}
	eps, err := queryAll(ctx, db, func(row rowScanner) (Endpoint, error) {
		var e Endpoint
		err := row.Scan(&e.ID, &e.Description, &e.URL)
		return e, err
	}, endpointNamesSQL, pq.Array(ids), ownerID)
	if err != nil {
		return nil, fmt.Errorf("read endpoint names: %w", err)
	}
	for _, e := range eps {
		names[e.ID] = e.Name()
	}
	return names, nil
}

// dedupWindow is the receiver's advertised dedup window; 0: none.
func (e Endpoint) dedupWindow() time.Duration {
	if e.DedupWindowSeconds == nil {
		return 0
	}
	return time.Duration(*e.DedupWindowSeconds) * time.Second
}

// The derived states of an endpoint.
// The health of an endpoint: failing raises endpoint_failing (overview.go);
// degraded (a failed attempt, a blip) does not.
const (
	healthFailing  = "failing"
	healthDegraded = "degraded"
	healthOK       = "ok" // no failure since the last success
)

const (
	endpointEnabled  = "enabled"
	endpointFailing  = "failing"
	endpointPaused   = "paused"
	endpointDisabled = "disabled"
)

// endpointWithSecret is the answer to create and rotate-secret.
type endpointWithSecret struct {
	Endpoint
	// Secret is a v1 secret, whsec_...; empty (and absent) for v1a, whose
	// private key no answer shows.
	Secret string `json:"secret,omitempty"`
}

// endpointPolicy is what the endpoint API, and the inbox beside it, take
// from the configuration.
type endpointPolicy struct {
	AllowPrivate   bool          // -allow-private-endpoints
	RotationWindow time.Duration // -webhook-secret-rotation-window
	// InboxWindow is the dedup window the inbox advertises to senders
	// (advertisedWindow, replay.go); 0 advertises none.
	InboxWindow time.Duration
}

// Bounds on what an endpoint holds; schema.sql's CHECKs repeat them.
const (
	maxEndpointDescriptionLen = 1000
	maxEndpointTopics         = 100
	// maxDisabledReasonLen bounds an operator's reason.
	maxDisabledReasonLen = 500
)

// endpointInput is the body of POST and PATCH /api/endpoints: a nil field
// is not given (PATCH leaves it as it is; POST requires url).
type endpointInput struct {
	URL         *string   `json:"url"`
	Topics      *[]string `json:"topics"`
	Description *string   `json:"description"`
	OwnerEmail  *string   `json:"owner_email"`
	MaxInFlight *int      `json:"max_in_flight"`
	Ordering    *string   `json:"ordering"`
	// RateLimitPerSecond given as null removes the limit.
	RateLimitPerSecond nullable[float64] `json:"rate_limit_per_second"`
	// RecoveryProbes is true unless given false (probe.go).
	RecoveryProbes *bool `json:"recovery_probes"`
	// Filter given as null removes the filter (checkFilter).
	Filter nullable[string] `json:"filter"`
	// ClientCertificate and ClientKey (PEM) are given together, or both
	// null to remove them; CACertificate (PEM) null removes it
	// (clientcert.go).
	ClientCertificate nullable[string] `json:"client_certificate"`
	ClientKey         nullable[string] `json:"client_key"`
	CACertificate     nullable[string] `json:"ca_certificate"`
	// OwnerID given as null leaves the endpoint to the admin alone; only
	// the admin's token sets it (claimInput, owners.go).
	OwnerID nullable[int64] `json:"owner_id"`
	// MaxAttempts, RetryWindowSeconds and TimeoutSeconds given as null go
	// back to the service's defaults; Headers replaces every header, null
	// or {} removing them (endpointrequest.go), and validate parses it
	// into headers.
	MaxAttempts        nullable[int]             `json:"max_attempts"`
	RetryWindowSeconds nullable[int]             `json:"retry_window_seconds"`
	TimeoutSeconds     nullable[int]             `json:"timeout_seconds"`
	Headers            nullable[json.RawMessage] `json:"headers"`
	headers            []customHeader
	// Signature is "v1" (the default) or "v1a"; a change is a rotation
	// into the other scheme (switchSignature).
	Signature *string `json:"signature"`
	// countedFor is the owner whose max_endpoints a create or a change
	// must stay within: set by claimInput for an owner's own create and
	// for an endpoint the admin gives an owner.
	countedFor *int64
}

// validateTLS checks the endpoint's TLS material, if given, as of now.
func (in *endpointInput) validateTLS(now time.Time) error {
	if in.ClientCertificate.Set != in.ClientKey.Set || (in.ClientCertificate.Value == nil) != (in.ClientKey.Value == nil) {
		return fmt.Errorf("%w: client_certificate and client_key go together: give both, or both null to remove them", errInvalid)
	}
	if in.URL != nil && !strings.HasPrefix(*in.URL, "https://") && (in.ClientCertificate.Value != nil || in.CACertificate.Value != nil) {
		return fmt.Errorf("%w: client_certificate and ca_certificate are for an https:// url only", errInvalid)
	}
	if cert, key := in.ClientCertificate.Value, in.ClientKey.Value; cert != nil {
		pair, err := parseClientPair(*cert, *key)
		if err == nil {
			err = checkClientCertificateUsable(pair.Leaf, now)
		}
		if err != nil {
			return fmt.Errorf("%w: %w", errInvalid, err)
		}
	}
	if ca := in.CACertificate.Value; ca != nil {
		if _, err := parseCAPool(*ca); err != nil {
			return fmt.Errorf("%w: %w", errInvalid, err)
		}
	}
	return nil
}

// clientTLSColumns are the input's TLS material as stored for endpoint
// id: the certificate, its key sealed by box, its expiry, and the CA.
func (in endpointInput) clientTLSColumns(box *secretBox, id int64) (cert *string, key []byte, expires *time.Time, ca *string) {
	if cert = in.ClientCertificate.Value; cert != nil {
		key = box.sealBlob(endpointKeyRow(id), []byte(*in.ClientKey.Value))
		if info := describeCertificate(cert); info != nil {
			expires = &info.NotAfter
		}
	}
	return cert, key, expires, in.CACertificate.Value
}

// nullable is a JSON field that tells absent (Set false) from null (Set,
// Value nil) from a value: PATCH {"rate_limit_per_second": null} removes a
// limit, and a PATCH without the field keeps it.
type nullable[T any] struct {
	Set   bool
	Value *T
}

func (n *nullable[T]) UnmarshalJSON(b []byte) error {
	n.Set = true
	if string(b) == "null" {
		n.Value = nil
		return nil
	}
	n.Value = new(T)
	return json.Unmarshal(b, n.Value)
}

// validate checks every given field and normalises the URL. Errors wrap
// errInvalid and say what is wrong.
func (in *endpointInput) validate(allowPrivate bool) error {
	if in.URL != nil && len(*in.URL) >= len(mailtoPrefix) && strings.EqualFold((*in.URL)[:len(mailtoPrefix)], mailtoPrefix) {
		// Mail goes to the configured SMTP server, never to a host the
		// URL names: the SSRF rules are for http(s) only.
		normalised, err := validateMailtoURL(*in.URL)
		if err != nil {
			return fmt.Errorf("%w: %w", errInvalid, err)
		}
		in.URL = &normalised
	} else if in.URL != nil {
		u, err := validateEndpointURL(*in.URL, allowPrivate)
		if err != nil {
			return fmt.Errorf("%w: %w", errInvalid, err)
		}
		normalised := u.String()
		in.URL = &normalised
	}
	if in.Topics != nil {
		if len(*in.Topics) > maxEndpointTopics {
			return fmt.Errorf("%w: %d topic patterns, at most %d", errInvalid, len(*in.Topics), maxEndpointTopics)
		}
		for _, p := range *in.Topics {
			if err := topicPatternValid(p); err != nil {
				return err
			}
		}
	}
	if in.Description != nil {
		if len(*in.Description) > maxEndpointDescriptionLen {
			return fmt.Errorf("%w: description is %d bytes, at most %d", errInvalid, len(*in.Description), maxEndpointDescriptionLen)
		}
		if strings.ContainsRune(*in.Description, 0) {
			return fmt.Errorf("%w: description contains a NUL character", errInvalid)
		}
	}
	if in.OwnerEmail != nil && *in.OwnerEmail != "" {
		if err := validateOwnerEmail(*in.OwnerEmail); err != nil {
			return err
		}
	}
	if in.Ordering != nil && *in.Ordering != orderingNone && *in.Ordering != orderingSubject {
		return fmt.Errorf("%w: ordering must be %q or %q, got %q", errInvalid, orderingNone, orderingSubject, *in.Ordering)
	}
	if in.MaxInFlight != nil && (*in.MaxInFlight < 1 || *in.MaxInFlight > maxMaxInFlight) {
		return fmt.Errorf("%w: max_in_flight must be between 1 and %d, got %d", errInvalid, maxMaxInFlight, *in.MaxInFlight)
	}
	if r := in.RateLimitPerSecond.Value; r != nil && !(*r >= minRateLimit && *r <= maxRateLimit) {
		return fmt.Errorf("%w: rate_limit_per_second must be between %g and %g requests a second, or null for none, got %g",
			errInvalid, minRateLimit, float64(maxRateLimit), *r)
	}
	if err := in.validateRequest(); err != nil {
		return err
	}
	if err := in.validateSignature(); err != nil {
		return err
	}
	return in.validateTLS(time.Now())
}

// validateRequest checks the endpoint's request settings, if given, and
// parses its headers into headers (endpointrequest.go).
func (in *endpointInput) validateRequest() error {
	if err := checkRequestSettings(in.MaxAttempts.Value, in.RetryWindowSeconds.Value, in.TimeoutSeconds.Value); err != nil {
		return err
	}
	if in.Headers.Value == nil {
		return nil
	}
	headers, err := parseCustomHeaders(*in.Headers.Value)
	in.headers = headers
	return err
}

// validateSignature accepts the two schemes of Standard Webhooks that
// outboxd signs with.
func (in *endpointInput) validateSignature() error {
	if in.Signature != nil && *in.Signature != webhookSignatureVersion && *in.Signature != webhookAsymmetricVersion {
		return fmt.Errorf("%w: signature must be %q (HMAC-SHA256) or %q (ed25519), got %q",
			errInvalid, webhookSignatureVersion, webhookAsymmetricVersion, *in.Signature)
	}
	return nil
}

// scheme is the signature scheme a new endpoint takes: the input's, else
// v1.
func (in endpointInput) scheme() string {
	if in.Signature != nil {
		return *in.Signature
	}
	return webhookSignatureVersion
}

// setSignature fills the endpoint's scheme and public keys from the
// stored public keys (outbox.endpoints.public_key: set for v1a), the
// previous one as read inside its window.
func (e *Endpoint) setSignature(public, previousPublic []byte) {
	e.Signature, e.PublicKey = schemeOf(public)
	if e.PreviousSecretExpiresAt != nil {
		scheme, key := schemeOf(previousPublic)
		e.PreviousSignature, e.PreviousPublicKey = &scheme, key
	}
}

// schemeOf is the scheme of a key whose stored public key is public, and
// that key as the API shows it.
func schemeOf(public []byte) (string, *string) {
	if public == nil {
		return webhookSignatureVersion, nil
	}
	shown := encodePublicKey(public)
	return webhookAsymmetricVersion, &shown
}

// shownSecret is secret as the answer that made it shows it: a v1 secret
// once, as whsec_; a v1a endpoint's secret is its private key, shown
// never (its answers carry the public key).
func (e Endpoint) shownSecret(secret webhookSecret) string {
	if e.Signature == webhookAsymmetricVersion {
		return ""
	}
	return secret.Encode()
}

// publicKeyColumn is what outbox.endpoints.public_key holds for secret of
// scheme: its public key for a v1a seed, NULL for a v1 secret.
func publicKeyColumn(scheme string, secret webhookSecret) any {
	if scheme != webhookAsymmetricVersion {
		return nil
	}
	return []byte(ed25519PublicKey(secret))
}

// validateOwnerEmail accepts a bare address (a@example.com), the form a
// notification can be sent to, whose domain has a dot; empty means no
// owner.
func validateOwnerEmail(s string) error {
	if len(s) > maxAddressLen {
		return fmt.Errorf("%w: owner_email is %d bytes, at most %d", errInvalid, len(s), maxAddressLen)
	}
	if validateBareAddress(s) != nil || !strings.Contains(s[strings.LastIndexByte(s, '@')+1:], ".") {
		return fmt.Errorf("%w: owner_email %q is not an e-mail address like owner@example.com", errInvalid, s)
	}
	return nil
}

// endpointColumns is the column list every query below returns, in
// scanEndpoint's order. The previous secret's expiry shows only while the
// window is open.
// A hold that has passed shows as none, and the running count comes from
// the index the claim counts with (schema.sql, jobs_running_by_endpoint).
const endpointColumns = `
  id, url, description, owner_email, topics,
  failing_since, disabled_at, disabled_reason, paused_at,
  CASE WHEN previous_secret_expires_at > now() THEN previous_secret_expires_at END,
  dedup_window_seconds, dedup_window_seen_at,
  max_in_flight, rate_limit_per_second, ordering,
  (SELECT count(*) FROM outbox.jobs AS j
   WHERE j.endpoint_id = endpoints.id AND j.state = 'running'),
  consecutive_failures, breaker_opened_at,
  CASE WHEN held_until > now() THEN held_until END,
  created_at, updated_at,
  disabled_cause, recovery_probes,
  outbox.probe_due_at(disabled_cause, recovery_probes, url, disabled_at, next_probe_at),
  last_probe_at, last_probe_error, recovered_at, recovered_reason,
  filter, client_certificate, client_key IS NOT NULL, ca_certificate,
  owner_id, filter_error, filter_error_at,
  max_attempts, retry_window_seconds, timeout_seconds, headers,
  public_key, CASE WHEN previous_secret_expires_at > now() THEN previous_public_key END`

func scanEndpoint(row rowScanner) (Endpoint, error) {
	var e Endpoint
	var clientCert, caCert *string
	var publicKey, previousPublicKey []byte
	err := row.Scan(&e.ID, &e.URL, &e.Description, &e.OwnerEmail, pq.Array(&e.Topics),
		&e.FailingSince, &e.DisabledAt, &e.DisabledReason, &e.PausedAt, &e.PreviousSecretExpiresAt,
		&e.DedupWindowSeconds, &e.DedupWindowSeenAt,
		&e.MaxInFlight, &e.RateLimitPerSecond, &e.Ordering, &e.InFlight,
		&e.Breaker.ConsecutiveFailures, &e.Breaker.OpenedAt, &e.HeldUntil,
		&e.CreatedAt, &e.UpdatedAt,
		&e.DisabledCause, &e.RecoveryProbes,
		&e.Recovery.NextProbeAt, &e.Recovery.LastProbeAt, &e.Recovery.LastProbeError,
		&e.Recovery.RecoveredAt, &e.Recovery.RecoveredReason,
		&e.Filter, &clientCert, &e.ClientKeySet, &caCert,
		&e.OwnerID, &e.FilterError, &e.FilterErrorAt,
		&e.MaxAttempts, &e.RetryWindowSeconds, &e.TimeoutSeconds, (*[]byte)(&e.Headers),
		&publicKey, &previousPublicKey)
	if err != nil {
		return e, err
	}
	e.setSignature(publicKey, previousPublicKey)
	e.ClientCertificate, e.CACertificate = describeCertificate(clientCert), describeCertificate(caCert)
	if e.Topics == nil {
		e.Topics = []string{}
	}
	switch {
	case e.DisabledAt != nil:
		e.State = endpointDisabled
	case e.PausedAt != nil:
		e.State = endpointPaused
	case e.FailingSince != nil:
		e.State = endpointFailing
	default:
		e.State = endpointEnabled
	}
	switch {
	case e.FailingSince == nil:
		e.Health = healthOK
	case e.Breaker.OpenedAt != nil:
		e.Health = healthFailing
	default:
		// Failed since its last success, its breaker closed: degraded,
		// unless endpoint_failing's success-rate rule holds for it, which
		// withHealth (overview.go) reads.
		e.Health = healthDegraded
	}
	e.Breaker.State = breakerClosed
	if e.Breaker.OpenedAt != nil {
		e.Breaker.State = breakerOpen
	}
	return e, nil
}

// scanOneEndpoint scans a single-row answer, mapping no row to errNotFound.
func scanOneEndpoint(row *sql.Row, op string, id int64) (Endpoint, error) {
	e, err := scanEndpoint(row)
	if errors.Is(err, sql.ErrNoRows) {
		return e, fmt.Errorf("endpoint %d: %w", id, errNotFound)
	}
	if err != nil {
		return e, fmt.Errorf("%s endpoint %d: %w", op, id, err)
	}
	return e, nil
}

// nextEndpointIDSQL draws a new endpoint's id ahead of its insert: its
// secret is sealed to its id (secrets.go), so the id comes first.
const nextEndpointIDSQL = `
SELECT nextval(pg_get_serial_sequence('outbox.endpoints', 'id'))`

// createEndpointSQL inserts endpoint $1, with the id nextEndpointIDSQL drew
// from the column's own sequence.
const createEndpointSQL = `
INSERT INTO outbox.endpoints (id, url, description, owner_email, topics, secret,
                              max_in_flight, rate_limit_per_second, recovery_probes, ordering,
                              filter, client_certificate, client_key, client_certificate_expires_at, ca_certificate,
                              owner_id, max_attempts, retry_window_seconds, timeout_seconds, headers, secret_headers,
                              public_key)
OVERRIDING SYSTEM VALUE
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, coalesce($9, true), coalesce($10, 'none'),
        $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)
RETURNING` + endpointColumns

// createEndpoint stores a validated endpoint with its first secret, sealed
// by box: for the input's scheme (newEndpointSecret).
func createEndpoint(ctx context.Context, db *sql.DB, box *secretBox, in endpointInput, secret webhookSecret) (Endpoint, error) {
	if in.URL == nil {
		return Endpoint{}, fmt.Errorf("%w: url is required", errInvalid)
	}
	topics := []string{}
	if in.Topics != nil {
		topics = *in.Topics
	}
	var description, ownerEmail string
	if in.Description != nil {
		description = *in.Description
	}
	if in.OwnerEmail != nil {
		ownerEmail = *in.OwnerEmail
	}
	maxInFlight := defaultMaxInFlight
	if in.MaxInFlight != nil {
		maxInFlight = *in.MaxInFlight
	}
	if err := checkFilter(ctx, db, in.Filter.Value); err != nil {
		return Endpoint{}, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Endpoint{}, fmt.Errorf("create endpoint: %w", err)
	}
	defer tx.Rollback()
	if in.countedFor != nil {
		if err := checkEndpointCount(ctx, tx, *in.countedFor, 0); err != nil {
			return Endpoint{}, err
		}
	}
	if err := refuseV1aBesideOlderReplicas(ctx, tx, in.scheme()); err != nil {
		return Endpoint{}, err
	}
	var id int64
	if err := tx.QueryRowContext(ctx, nextEndpointIDSQL).Scan(&id); err != nil {
		return Endpoint{}, fmt.Errorf("create endpoint: draw id: %w", err)
	}
	cert, key, expires, ca := in.clientTLSColumns(box, id)
	headers, secretHeaders, err := storedHeaders(box, id, in.headers, nil)
	if err != nil {
		return Endpoint{}, err
	}
	e, err := scanEndpoint(tx.QueryRowContext(ctx, createEndpointSQL,
		id, *in.URL, description, ownerEmail, pq.Array(topics), box.seal(endpointSecretRow(id), secret),
		maxInFlight, in.RateLimitPerSecond.Value, in.RecoveryProbes, in.Ordering,
		in.Filter.Value, cert, key, expires, ca,
		in.OwnerID.Value, in.MaxAttempts.Value, in.RetryWindowSeconds.Value, in.TimeoutSeconds.Value,
		string(headers), secretHeaders, publicKeyColumn(in.scheme(), secret)))
	if err != nil {
		return e, fmt.Errorf("create endpoint: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return e, fmt.Errorf("create endpoint: %w", err)
	}
	return e, nil
}

// lockOwnerSQL takes owner $1's row for the rest of the transaction: two
// endpoints created for one owner, or given to it, at once are counted
// one after the other.
const lockOwnerSQL = `
SELECT max_endpoints
FROM outbox.owners
WHERE id = $1
FOR UPDATE`

// countOwnerEndpointsSQL runs after lockOwnerSQL, in a statement of its
// own, so that its snapshot sees the endpoint the lock's previous holder
// created or was given: owner $1's endpoints other than $2, and whether
// $2 is among them already.
const countOwnerEndpointsSQL = `
SELECT count(*) FILTER (WHERE id <> $2),
       coalesce(bool_or(id = $2), false)
FROM outbox.endpoints
WHERE owner_id = $1`

// checkEndpointCount refuses, in tx, which then writes it, endpoint id
// (0: a new one) as owner ownerID's past its max_endpoints. An endpoint
// the owner has already is no new one: writing it again is not refused
// for a max_endpoints lowered since.
func checkEndpointCount(ctx context.Context, tx *sql.Tx, ownerID, id int64) error {
	var most, have int
	var owned bool
	if err := tx.QueryRowContext(ctx, lockOwnerSQL, ownerID).Scan(&most); err != nil {
		return fmt.Errorf("count owner %d's endpoints: lock it: %w", ownerID, err)
	}
	if err := tx.QueryRowContext(ctx, countOwnerEndpointsSQL, ownerID, id).Scan(&have, &owned); err != nil {
		return fmt.Errorf("count owner %d's endpoints: %w", ownerID, err)
	}
	if !owned && have >= most {
		return fmt.Errorf("%w: this owner has %d endpoints, the most it may have (max_endpoints); delete or take back one first", errInvalid, have)
	}
	return nil
}

const getEndpointSQL = `
SELECT` + endpointColumns + `
FROM outbox.endpoints
WHERE id = $1`

func getEndpoint(ctx context.Context, db *sql.DB, id int64) (Endpoint, error) {
	return scanOneEndpoint(db.QueryRowContext(ctx, getEndpointSQL, id), "get", id)
}

// listEndpointsSQL is one page of endpoints by id, after $1.
const listEndpointsSQL = `
SELECT` + endpointColumns + `
FROM outbox.endpoints
WHERE id > $1
ORDER BY id
LIMIT $2`

// maxEndpointPage bounds one page of the endpoint list.
const maxEndpointPage = 500

func listEndpoints(ctx context.Context, db *sql.DB, afterID int64, limit int) ([]Endpoint, error) {
	endpoints, err := queryAll(ctx, db, scanEndpoint, listEndpointsSQL, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return endpoints, nil
}

// updateEndpointSQL changes the given fields; a NULL parameter keeps the
// column as it is. A filter written, even as it was, is evaluated again:
// the relay's hold on it (filter_error) goes. A new URL may be another receiver: the window the old
// one advertised goes (on the right of SET, url is the old value).
const updateEndpointSQL = `
UPDATE outbox.endpoints
SET url = coalesce($2, url),
    dedup_window_seconds = CASE WHEN coalesce($2, url) = url THEN dedup_window_seconds END,
    dedup_window_seen_at = CASE WHEN coalesce($2, url) = url THEN dedup_window_seen_at END,
    description = coalesce($3, description),
    owner_email = coalesce($4, owner_email),
    topics = coalesce($5::text[], topics),
    max_in_flight = coalesce($6, max_in_flight),
    rate_limit_per_second = CASE WHEN $7 THEN $8 ELSE rate_limit_per_second END,
    recovery_probes = coalesce($9, recovery_probes),
    ordering = coalesce($10, ordering),
    filter = CASE WHEN $11 THEN $12 ELSE filter END,
    filter_error = CASE WHEN $11 THEN NULL ELSE filter_error END,
    filter_error_at = CASE WHEN $11 THEN NULL ELSE filter_error_at END,
    client_certificate = CASE WHEN $13::boolean THEN $14::text ELSE client_certificate END,
    client_key = CASE WHEN $13::boolean THEN $15::bytea ELSE client_key END,
    client_certificate_expires_at = CASE WHEN $13::boolean THEN $16::timestamptz ELSE client_certificate_expires_at END,
    ca_certificate = CASE WHEN $17::boolean THEN $18::text ELSE ca_certificate END,
    owner_id = CASE WHEN $19 THEN $20 ELSE owner_id END,
    max_attempts = CASE WHEN $21 THEN $22 ELSE max_attempts END,
    retry_window_seconds = CASE WHEN $23 THEN $24 ELSE retry_window_seconds END,
    timeout_seconds = CASE WHEN $25 THEN $26 ELSE timeout_seconds END,
    headers = CASE WHEN $27 THEN $28::jsonb ELSE headers END,
    secret_headers = CASE WHEN $27 THEN $29::bytea ELSE secret_headers END,
    updated_at = now()
WHERE id = $1
RETURNING` + endpointColumns

// releaseLanesSQL lets the deliveries of an endpoint's ordered lanes go
// unordered, held ones due now: what an endpoint that no longer orders
// (PATCH ordering "none") or no longer exists (its jobs then end without
// a request) does with them. The caller locks the endpoint first. The
// lanes' held and active deliveries are each an index of their own
// (schema.sql): the last line, always true, lets it read those,
// not every delivery the endpoint ever had.
const releaseLanesSQL = `
UPDATE outbox.jobs
SET lane_key = NULL,
    scheduled_at = CASE WHEN scheduled_at = 'infinity' THEN now() ELSE scheduled_at END
WHERE endpoint_id = $1
  AND lane_key IS NOT NULL
  AND state IN ('available', 'retryable', 'running')
  AND (scheduled_at = 'infinity' OR scheduled_at < 'infinity')`

// updateEndpoint changes endpoint id's settings. A PATCH to ordering
// "none" locks the endpoint, then (releasing them) its ordered lanes'
// jobs; the completer locks a batch's jobs, then their endpoints. The two
// can deadlock, like a delete (deleteEndpoint), and the update is tried
// again the same way: the whole transaction, at most deleteEndpointTries
// times. A change of signature scheme is a rotation into the other one,
// whose old key signs for window more (switchSignature); its answer shows
// a new v1 secret, once.
func updateEndpoint(ctx context.Context, db *sql.DB, box *secretBox, id int64, in endpointInput, window time.Duration) (endpointWithSecret, error) {
	var e endpointWithSecret
	err := retryAfterDeadlock(ctx, func() (err error) {
		e, err = updateEndpointOnce(ctx, db, box, id, in, window)
		return err
	})
	return e, err
}

func updateEndpointOnce(ctx context.Context, db *sql.DB, box *secretBox, id int64, in endpointInput, window time.Duration) (endpointWithSecret, error) {
	var topics any // NULL unless given; an empty list is given and means all
	if in.Topics != nil {
		topics = pq.Array(append([]string{}, *in.Topics...))
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return endpointWithSecret{}, fmt.Errorf("update endpoint %d: %w", id, err)
	}
	defer tx.Rollback()
	if err := checkFilter(ctx, tx, in.Filter.Value); err != nil {
		return endpointWithSecret{}, err
	}
	if in.countedFor != nil {
		if err := checkEndpointCount(ctx, tx, *in.countedFor, id); err != nil {
			return endpointWithSecret{}, err
		}
	}
	cert, key, expires, ca := in.clientTLSColumns(box, id)
	headers, secretHeaders, err := in.headerColumns(ctx, tx, box, id)
	if err != nil {
		return endpointWithSecret{}, err
	}
	e, err := scanOneEndpoint(tx.QueryRowContext(ctx, updateEndpointSQL, id, in.URL, in.Description, in.OwnerEmail, topics,
		in.MaxInFlight, in.RateLimitPerSecond.Set, in.RateLimitPerSecond.Value, in.RecoveryProbes, in.Ordering,
		in.Filter.Set, in.Filter.Value,
		in.ClientCertificate.Set, cert, key, expires, in.CACertificate.Set, ca,
		in.OwnerID.Set, in.OwnerID.Value,
		in.MaxAttempts.Set, in.MaxAttempts.Value, in.RetryWindowSeconds.Set, in.RetryWindowSeconds.Value,
		in.TimeoutSeconds.Set, in.TimeoutSeconds.Value, in.Headers.Set, headers, secretHeaders), "update", id)
	if err != nil {
		return endpointWithSecret{Endpoint: e}, err
	}
	changed, err := switchSignature(ctx, tx, box, e, in.Signature, window)
	if err != nil {
		return changed, err
	}
	if in.Ordering != nil && *in.Ordering == orderingNone {
		// Lanes exist only while an endpoint orders: a PATCH that leaves
		// the ordering as it was has none to release. The row is locked
		// by the update: no lane advances meanwhile.
		if _, err := tx.ExecContext(ctx, releaseLanesSQL, id); err != nil {
			return changed, fmt.Errorf("update endpoint %d: release its ordered lanes: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return changed, fmt.Errorf("update endpoint %d: %w", id, err)
	}
	return changed, nil
}

// switchSignature moves endpoint e, in tx, to scheme if given and not its
// own: a new key of that scheme signs from now on, and the old one, of the
// other scheme, beside it for window more, so that a receiver switches
// at its own pace, as after a rotation.
func switchSignature(ctx context.Context, tx *sql.Tx, box *secretBox, e Endpoint, scheme *string, window time.Duration) (endpointWithSecret, error) {
	if scheme == nil || *scheme == e.Signature {
		return endpointWithSecret{Endpoint: e}, nil
	}
	if err := refuseV1aBesideOlderReplicas(ctx, tx, *scheme); err != nil {
		return endpointWithSecret{Endpoint: e}, err
	}
	switched, secret, err := rekeyEndpoint(ctx, tx, box, e.ID, *scheme, window)
	if err != nil {
		return endpointWithSecret{Endpoint: e}, err
	}
	return endpointWithSecret{Endpoint: switched, Secret: switched.shownSecret(secret)}, nil
}

// olderReplicasSQL counts the live replicas of a release before 0.8.0,
// the first that signs v1a: one of them would sign a v1a endpoint's
// requests with HMAC, which its receiver refuses, and its rotate-secret
// would store an HMAC secret beside the endpoint's public key.
const olderReplicasSQL = `
SELECT count(*)
FROM outbox.replicas
WHERE last_seen >= now() - dead_after
  AND string_to_array(version, '.')::integer[] < '{0,8,0}'`

// refuseV1aBesideOlderReplicas refuses, with a 409, to put an endpoint on
// scheme v1a while a replica of an older release runs: until the roll
// that brings this release ends (docs/upgrades.md).
func refuseV1aBesideOlderReplicas(ctx context.Context, q queryer, scheme string) error {
	if scheme != webhookAsymmetricVersion {
		return nil
	}
	var older int
	if err := q.QueryRowContext(ctx, olderReplicasSQL).Scan(&older); err != nil {
		return fmt.Errorf("count replicas of older releases: %w", err)
	}
	if older > 0 {
		return fmt.Errorf("%w: signature: %d replica(s) of a release before 0.8.0 still run and cannot sign v1a; finish the upgrade first",
			errConflict, older)
	}
	return nil
}

// lockSecretHeadersSQL reads endpoint $1's secret headers as stored, and
// locks its row until the update that writes them.
const lockSecretHeadersSQL = `
SELECT secret_headers
FROM outbox.endpoints
WHERE id = $1
FOR NO KEY UPDATE`

// headerColumns are the headers and secret_headers columns an update of
// endpoint id writes, in tx, when in gives headers (nil, nil otherwise):
// a secret header given without its value keeps the one stored.
func (in endpointInput) headerColumns(ctx context.Context, tx *sql.Tx, box *secretBox, id int64) (shown *string, sealed []byte, err error) {
	if !in.Headers.Set {
		return nil, nil, nil
	}
	var stored []byte
	err = tx.QueryRowContext(ctx, lockSecretHeadersSQL, id).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, fmt.Errorf("endpoint %d: %w", id, errNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("update endpoint %d: read its secret headers: %w", id, err)
	}
	text, sealed, err := storedHeaders(box, id, in.headers, stored)
	if err != nil {
		return nil, nil, err
	}
	return new(string(text)), sealed, nil
}

// deleteEndpointSQL removes an endpoint and answers how many of its
// deliveries were waiting. Its jobs stay, with endpoint_id set to NULL
// (schema.sql), and end without a request when they run. Its ordered
// lanes are released first (releaseLanesSQL): a held delivery of no
// endpoint would never be due.
const deleteEndpointSQL = `
WITH released AS (` + releaseLanesSQL + `),
waiting AS (
  SELECT count(*) AS n
  FROM outbox.jobs
  WHERE endpoint_id = $1
    AND state IN ('available', 'retryable')
)
DELETE FROM outbox.endpoints
WHERE id = $1
RETURNING (SELECT n FROM waiting)`

// deleteEndpointTries bounds deleteEndpoint's and updateEndpoint's tries
// after a deadlock, and deadlockBackoff is the pause before the second
// (doubling after).
const (
	deleteEndpointTries = 3
	deadlockBackoff     = 50 * time.Millisecond
)

// retryAfterDeadlock runs try until it ends other than in a deadlock, at
// most deleteEndpointTries times. It pauses between tries: PostgreSQL
// aborts one transaction of a deadlock and lets the other go on, which
// then needs a moment to take the locks it waited for. Tried again at
// once, the aborted one could take them first and meet the same deadlock
// (it did, three times running, on a busy machine).
func retryAfterDeadlock(ctx context.Context, try func() error) error {
	pause := deadlockBackoff
	for attempt := 1; ; attempt++ {
		err := try()
		if pq.As(err, pqerror.TRDeadlockDetected) == nil || attempt == deleteEndpointTries {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// deleteEndpoint deletes endpoint id. It locks the endpoint, then (setting
// their endpoint_id to NULL) its jobs; the completer locks a batch's jobs,
// then their endpoints. The two can deadlock, and PostgreSQL then aborts
// the one that has waited longer, mostly the delete: it tries again
// (retryAfterDeadlock), and meets the completer's transaction done or
// waits for it. It logs the delete once, with the deliveries it leaves
// to end without a request, each of which the workers then end quietly
// (errEndpointDeleted) rather than as a failure apiece.
func deleteEndpoint(ctx context.Context, db *sql.DB, id int64, logger *slog.Logger) error {
	var waiting int64
	err := retryAfterDeadlock(ctx, func() error {
		return db.QueryRowContext(ctx, deleteEndpointSQL, id).Scan(&waiting)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("endpoint %d: %w", id, errNotFound)
	}
	if err != nil {
		return fmt.Errorf("delete endpoint %d: %w", id, err)
	}
	logger.Info("endpoint deleted; its waiting deliveries end without a request", "endpoint_id", id, "deliveries", waiting)
	return nil
}

// enableEndpointSQL re-enables a disabled endpoint with a clean slate: its
// failing_since is cleared too, or the sweep that disables endpoints failing
// for days would disable it again at once. An enabled endpoint is left as
// it is, failing or not.
const enableEndpointSQL = `
UPDATE outbox.endpoints
SET failing_since = CASE WHEN disabled_at IS NOT NULL THEN NULL ELSE failing_since END,
    consecutive_failures = CASE WHEN disabled_at IS NOT NULL THEN 0 ELSE consecutive_failures END,
    breaker_opened_at = CASE WHEN disabled_at IS NOT NULL THEN NULL ELSE breaker_opened_at END,
    disabled_at = NULL,
    disabled_reason = NULL,
    disabled_cause = NULL,
    updated_at = now()
WHERE id = $1
RETURNING` + endpointColumns

func enableEndpoint(ctx context.Context, db *sql.DB, id int64) (Endpoint, error) {
	return scanOneEndpoint(db.QueryRowContext(ctx, enableEndpointSQL, id), "enable", id)
}

// disableEndpointSQL disables an endpoint with a reason; disabling a
// disabled endpoint keeps its first reason and time, and makes the
// operator its cause, so no recovery probe re-enables it (probe.go).
const disableEndpointSQL = `
UPDATE outbox.endpoints
SET disabled_at = coalesce(disabled_at, now()),
    disabled_reason = coalesce(disabled_reason, $2),
    disabled_cause = 'operator',
    updated_at = now()
WHERE id = $1
RETURNING` + endpointColumns

func disableEndpoint(ctx context.Context, db *sql.DB, id int64, reason string) (Endpoint, error) {
	return scanOneEndpoint(db.QueryRowContext(ctx, disableEndpointSQL, id, reason), "disable", id)
}

// pauseEndpointSQL holds an endpoint's deliveries: the claim takes none of
// them until resumeEndpointSQL, fan-out still queues new ones, and nothing
// is discarded. Pausing a paused endpoint keeps its first pause time.
const pauseEndpointSQL = `
UPDATE outbox.endpoints
SET paused_at = coalesce(paused_at, now()),
    updated_at = now()
WHERE id = $1
RETURNING` + endpointColumns

const resumeEndpointSQL = `
UPDATE outbox.endpoints
SET paused_at = NULL,
    updated_at = now()
WHERE id = $1
RETURNING` + endpointColumns

func pauseEndpoint(ctx context.Context, db *sql.DB, id int64) (Endpoint, error) {
	return scanOneEndpoint(db.QueryRowContext(ctx, pauseEndpointSQL, id), "pause", id)
}

// resumeEndpoint lets a paused endpoint's deliveries flow; the workers are
// woken (the wake-up of new jobs), so they need not wait for the poll.
func resumeEndpoint(ctx context.Context, db *sql.DB, id int64) (Endpoint, error) {
	e, err := scanOneEndpoint(db.QueryRowContext(ctx, resumeEndpointSQL, id), "resume", id)
	if err == nil {
		err = notify(ctx, db, jobsChannel)
	}
	return e, err
}

// rotateEndpointSecretSQL makes $2 the secret, with $4 its public key
// (NULL: v1), and keeps the current one signing for $3 seconds more. A
// previous secret still in its window is dropped: two secrets at most.
// The current one moves as it is stored, sealed or not: it is sealed to
// the row, not to its column.
const rotateEndpointSecretSQL = `
UPDATE outbox.endpoints
SET previous_secret = secret,
    previous_public_key = public_key,
    previous_secret_expires_at = now() + make_interval(secs => $3),
    secret = $2,
    public_key = $4,
    updated_at = now()
WHERE id = $1
RETURNING` + endpointColumns

// lockEndpointSchemeSQL locks endpoint $1 and says whether it signs v1a.
const lockEndpointSchemeSQL = `
SELECT public_key IS NOT NULL
FROM outbox.endpoints
WHERE id = $1
FOR NO KEY UPDATE`

// rotateEndpointSecret gives endpoint id a new key of its own scheme,
// sealed by box, and returns it with the endpoint; the old key signs
// beside it for window.
func rotateEndpointSecret(ctx context.Context, db *sql.DB, box *secretBox, id int64, window time.Duration) (Endpoint, webhookSecret, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Endpoint{}, nil, fmt.Errorf("rotate secret of endpoint %d: %w", id, err)
	}
	defer tx.Rollback()
	var asymmetric bool
	err = tx.QueryRowContext(ctx, lockEndpointSchemeSQL, id).Scan(&asymmetric)
	if errors.Is(err, sql.ErrNoRows) {
		return Endpoint{}, nil, fmt.Errorf("endpoint %d: %w", id, errNotFound)
	} else if err != nil {
		return Endpoint{}, nil, fmt.Errorf("rotate secret of endpoint %d: %w", id, err)
	}
	scheme := webhookSignatureVersion
	if asymmetric {
		scheme = webhookAsymmetricVersion
	}
	e, secret, err := rekeyEndpoint(ctx, tx, box, id, scheme, window)
	if err != nil {
		return e, nil, err
	}
	if err := tx.Commit(); err != nil {
		return e, nil, fmt.Errorf("rotate secret of endpoint %d: %w", id, err)
	}
	return e, secret, nil
}

// rekeyEndpoint gives endpoint id, in tx, a fresh key for scheme: a
// rotation, or a switch to the other scheme, during whose window requests
// carry a signature of each.
func rekeyEndpoint(ctx context.Context, tx *sql.Tx, box *secretBox, id int64, scheme string, window time.Duration) (Endpoint, webhookSecret, error) {
	secret := newEndpointSecret(scheme)
	e, err := scanOneEndpoint(tx.QueryRowContext(ctx, rotateEndpointSecretSQL, id, box.seal(endpointSecretRow(id), secret),
		window.Seconds(), publicKeyColumn(scheme, secret)), "rotate secret of", id)
	return e, secret, err
}

// disableReason is an operator's reason for disabling, or the default one.
func disableReason(raw string) (string, error) {
	reason := strings.TrimSpace(raw)
	switch {
	case reason == "":
		return "disabled by an operator", nil
	case len(reason) > maxDisabledReasonLen || strings.ContainsRune(reason, 0):
		return "", fmt.Errorf("%w: reason must be at most %d bytes of text", errInvalid, maxDisabledReasonLen)
	}
	return reason, nil
}

// maxFilterLen bounds an endpoint's filter, in bytes: a filter is a
// predicate, not a program. schema.sql's endpoints_filter_length repeats it.
const maxFilterLen = 4096

// checkFilterSQL parses $1 as PostgreSQL parses a stored filter and says
// what keeps it from being stored (outbox.filter_problem), NULL if nothing.
const checkFilterSQL = `SELECT outbox.filter_problem($1::jsonpath)`

// checkFilter refuses a filter that could not be stored, saying why:
// PostgreSQL's own parse error, or filter_problem's reason (a variable,
// .datetime(), not a predicate). nil is no filter, and passes.
func checkFilter(ctx context.Context, q queryer, filter *string) error {
	if filter == nil {
		return nil
	}
	f := *filter
	switch {
	case strings.TrimSpace(f) == "":
		return fmt.Errorf("%w: filter is empty: give a predicate such as $.status == \"paid\", or null for every event of the topics", errInvalid)
	case len(f) > maxFilterLen:
		return fmt.Errorf("%w: filter is %d bytes, at most %d", errInvalid, len(f), maxFilterLen)
	case strings.ContainsRune(f, 0):
		return fmt.Errorf("%w: filter contains a NUL character", errInvalid)
	}
	var problem sql.NullString
	err := q.QueryRowContext(ctx, checkFilterSQL, f).Scan(&problem)
	if pqErr := pq.As(err); pqErr != nil && (pqErr.Code == pqerror.SyntaxError || pqErr.Code.Class() == "22") {
		return fmt.Errorf("%w: filter: %s", errInvalid, pqErr.Message)
	}
	if err != nil {
		return fmt.Errorf("check filter: %w", err)
	}
	if problem.Valid {
		return fmt.Errorf("%w: filter: %s", errInvalid, problem.String)
	}
	return nil
}
