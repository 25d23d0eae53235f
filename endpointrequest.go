// endpointrequest.go: an endpoint's own request settings: how many
// attempts its deliveries make and for how long they are retried, how
// long one request may take, and the static headers every request
// carries, secret ones sealed at rest like its signing secret
// (docs/endpoints.md#retries-timeout-and-headers). The claim reads them
// with every job (claim.go), so a change reaches the next attempt of
// every queued delivery.

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds of the request settings; schema.sql's CHECKs repeat them.
const (
	// maxEndpointAttempts is the default schedule's attempts: an endpoint
	// may ask for fewer, never more, so the storage bounds that the 18
	// attempts keep (docs/guarantees.md) hold whatever it asks.
	maxEndpointAttempts = 18
	// maxRetryWindowSeconds is what the 18 attempts span, the sum of
	// attempt⁴ s for attempts 1 to 17 (backoff without its jitter): a
	// longer window would never be reached.
	maxRetryWindowSeconds = 327369
	// maxEndpointTimeoutSeconds bounds one request: a receiver that needs
	// more than a minute to answer should answer first and work after.
	// The attempt's own limit and the rescue horizon grow with it
	// (attemptTimeout, rescue.go).
	maxEndpointTimeoutSeconds = 60
)

// Bounds of an endpoint's custom headers: enough for an API key, a
// tenant and a few routing headers; together far below the 64 KiB of
// headers a receiver reads in most servers.
const (
	maxCustomHeaders  = 20
	maxHeaderNameLen  = 100
	maxHeaderValueLen = 4096
	maxHeadersBytes   = 8192 // names and values together
	// maskedHeaderValue stands for a secret header's value on a page.
	maskedHeaderValue = "••••••••"
)

// ownedHeaderPrefixes and ownedHeaders are the header names outboxd sets
// itself, or that belong to the connection rather than the request: a
// custom header may not take one (lower case; compared case-blind).
var (
	ownedHeaderPrefixes = []string{"webhook-", "proxy-"}
	ownedHeaders        = []string{"content-type", "content-length", "user-agent", "traceparent", "tracestate", "host",
		"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "expect"}
)

// checkRequestSettings checks the numbers an endpoint may set; nil is
// not given or null (the service's default).
func checkRequestSettings(maxAttempts, retryWindow, timeout *int) error {
	switch {
	case maxAttempts != nil && (*maxAttempts < 1 || *maxAttempts > maxEndpointAttempts):
		return fmt.Errorf("%w: max_attempts must be between 1 and %d, or null for the service's default, got %d",
			errInvalid, maxEndpointAttempts, *maxAttempts)
	case retryWindow != nil && (*retryWindow < 1 || *retryWindow > maxRetryWindowSeconds):
		return fmt.Errorf("%w: retry_window_seconds must be between 1 and %d (what 18 attempts span), or null for none, got %d",
			errInvalid, maxRetryWindowSeconds, *retryWindow)
	case timeout != nil && (*timeout < 1 || *timeout > maxEndpointTimeoutSeconds):
		return fmt.Errorf("%w: timeout_seconds must be between 1 and %d, or null for the service's default, got %d",
			errInvalid, maxEndpointTimeoutSeconds, *timeout)
	}
	return nil
}

// customHeader is one header of an endpoint as given: keep is a secret
// one given without its value, which keeps the value stored.
type customHeader struct {
	name, value  string
	secret, keep bool
}

// parseCustomHeaders reads the "headers" object: each name to a value,
// or to {"value": ..., "secret": true} for a secret one; {"secret": true}
// without a value keeps the one stored. null is no headers. Errors name
// the header, never its value.
func parseCustomHeaders(raw []byte) ([]customHeader, error) {
	var given map[string]json.RawMessage
	if err := json.Unmarshal(raw, &given); err != nil {
		return nil, fmt.Errorf("%w: headers must be an object of header names to values", errInvalid)
	}
	if len(given) > maxCustomHeaders {
		return nil, fmt.Errorf("%w: headers: %d headers, at most %d", errInvalid, len(given), maxCustomHeaders)
	}
	headers := make([]customHeader, 0, len(given))
	seen := map[string]string{}
	total := 0
	for _, name := range slices.Sorted(maps.Keys(given)) {
		h, err := parseCustomHeader(name, given[name])
		if err != nil {
			return nil, err
		}
		if other, ok := seen[strings.ToLower(name)]; ok {
			return nil, fmt.Errorf("%w: headers: %q and %q name one header (names are case-blind)", errInvalid, other, name)
		}
		seen[strings.ToLower(name)] = name
		total += len(name) + len(h.value)
		headers = append(headers, h)
	}
	if total > maxHeadersBytes {
		return nil, fmt.Errorf("%w: headers: %d bytes of names and values, at most %d", errInvalid, total, maxHeadersBytes)
	}
	return headers, nil
}

// parseCustomHeader reads one member of the "headers" object.
func parseCustomHeader(name string, raw json.RawMessage) (customHeader, error) {
	if err := checkHeaderName(name); err != nil {
		return customHeader{}, err
	}
	h := customHeader{name: name}
	var plain string
	if json.Unmarshal(raw, &plain) == nil {
		h.value = plain
		return h, checkHeaderValue(name, plain)
	}
	var obj struct {
		Value  *string `json:"value"`
		Secret bool    `json:"secret"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil || !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
		return h, fmt.Errorf(`%w: headers.%s: want a string, or an object {"value": "...", "secret": true}`, errInvalid, name)
	}
	h.secret = obj.Secret
	if obj.Value == nil {
		if !obj.Secret {
			return h, fmt.Errorf("%w: headers.%s: value is missing", errInvalid, name)
		}
		h.keep = true
		return h, nil
	}
	h.value = *obj.Value
	return h, checkHeaderValue(name, h.value)
}

// checkHeaderName refuses a name that is not an HTTP token (RFC 9110,
// 5.6.2) or that outboxd owns.
func checkHeaderName(name string) error {
	if name == "" || len(name) > maxHeaderNameLen || strings.ContainsFunc(name, func(r rune) bool { return !isTokenChar(r) }) {
		return fmt.Errorf("%w: headers: %q is not a header name: 1 to %d letters, digits and !#$%%&'*+-.^_`|~",
			errInvalid, name, maxHeaderNameLen)
	}
	lower := strings.ToLower(name)
	if slices.Contains(ownedHeaders, lower) || slices.ContainsFunc(ownedHeaderPrefixes, func(p string) bool { return strings.HasPrefix(lower, p) }) {
		return fmt.Errorf("%w: headers: %s is set by outboxd or by the connection, not by an endpoint (docs/endpoints.md#retries-timeout-and-headers)",
			errInvalid, name)
	}
	return nil
}

// isTokenChar says whether r may be in an HTTP token.
func isTokenChar(r rune) bool {
	return r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		strings.ContainsRune("!#$%&'*+-.^_`|~", r))
}

// checkHeaderValue refuses a value a request could not carry as it is:
// a control character (a line break would start another header), or
// white space at either end, which receivers strip. It never quotes the
// value: it may be a secret.
func checkHeaderValue(name, value string) error {
	switch {
	case value == "" || len(value) > maxHeaderValueLen:
		return fmt.Errorf("%w: headers.%s: value must be 1 to %d bytes", errInvalid, name, maxHeaderValueLen)
	case strings.ContainsFunc(value, func(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f }):
		return fmt.Errorf("%w: headers.%s: value holds a control character (a line break, say)", errInvalid, name)
	case strings.TrimSpace(value) != value:
		return fmt.Errorf("%w: headers.%s: value starts or ends with white space", errInvalid, name)
	}
	return nil
}

// storedHeaders are headers as endpoint id stores them, box sealing the
// secret ones: the headers column (secret values shown as
// {"secret": true}) and the secret_headers column (nil: none). A secret
// header kept without its value takes it from stored, the column as it
// is.
func storedHeaders(box *secretBox, id int64, headers []customHeader, stored []byte) (shown, sealed []byte, err error) {
	var kept map[string]string
	shownMap := map[string]any{}
	secrets := map[string]string{}
	for _, h := range headers {
		switch {
		case !h.secret:
			shownMap[h.name] = h.value
			continue
		case h.keep && kept == nil:
			if kept, err = openSecretHeaders(box, id, stored); err != nil {
				return nil, nil, err
			}
		}
		value, ok := h.value, true
		if h.keep {
			value, ok = kept[h.name]
		}
		if !ok {
			return nil, nil, fmt.Errorf("%w: headers.%s: a new secret header needs its value", errInvalid, h.name)
		}
		shownMap[h.name] = map[string]bool{"secret": true}
		secrets[h.name] = value
	}
	if shown, err = json.Marshal(shownMap); err != nil {
		return nil, nil, fmt.Errorf("encode headers: %w", err)
	}
	if len(secrets) == 0 {
		return shown, nil, nil
	}
	text, err := json.Marshal(secrets)
	if err != nil {
		return nil, nil, fmt.Errorf("encode secret headers: %w", err)
	}
	return shown, box.sealBlob(endpointHeadersRow(id), text), nil
}

// openSecretHeaders is the secret headers endpoint id stores, name to
// value; none for NULL.
func openSecretHeaders(box *secretBox, id int64, stored []byte) (map[string]string, error) {
	values := map[string]string{}
	if stored == nil {
		return values, nil
	}
	text, err := box.openBlob(endpointHeadersRow(id), stored)
	if err != nil {
		return nil, fmt.Errorf("secret headers: %w", err)
	}
	if err := json.Unmarshal(text, &values); err != nil {
		return nil, fmt.Errorf("secret headers of endpoint %d: %w", id, err)
	}
	return values, nil
}

// shownHeader is one header as a page shows it: a secret one's value
// masked.
type shownHeader struct {
	Name, Value string
	Secret      bool
}

// shownHeaders is the headers column as a page shows it, by name.
func shownHeaders(column []byte) []shownHeader {
	var given map[string]json.RawMessage
	if json.Unmarshal(column, &given) != nil {
		return nil
	}
	shown := make([]shownHeader, 0, len(given))
	for _, name := range slices.Sorted(maps.Keys(given)) {
		var value string
		if json.Unmarshal(given[name], &value) != nil {
			shown = append(shown, shownHeader{Name: name, Value: maskedHeaderValue, Secret: true})
			continue
		}
		shown = append(shown, shownHeader{Name: name, Value: value})
	}
	return shown
}

// endpointRequest is an endpoint's request settings as a claim read them
// for one job (endpointRequestColumns).
type endpointRequest struct {
	maxAttempts int           // 0: the job's own (its max_attempts)
	retryWindow time.Duration // 0: none
	// firstFailure is when the job's first failed attempt ended, as its
	// errors keep it; zero before one, or without a retry window.
	firstFailure  time.Time
	timeout       time.Duration // 0: -webhook-timeout
	headers       []byte        // the headers column
	secretHeaders []byte        // the secret_headers column, as stored
}

// endpointRequestColumns are an endpoint's request settings, read after
// the claim (claimJobsSQL) from the endpoint ep of the claimed job
// claimed, in endpointRequest's order: the endpoint as it is when the
// claim begins. A job's first failure, for a window, is read from its
// row as it was before the claim, whose errors the claim leaves alone.
const endpointRequestColumns = `
       ep.max_attempts, ep.retry_window_seconds,
       CASE WHEN ep.retry_window_seconds IS NOT NULL AND claimed.attempt > 1 THEN
         (SELECT (fj.errors -> 0 ->> 'at')::timestamptz FROM outbox.jobs AS fj WHERE fj.id = claimed.id)
       END,
       ep.timeout_seconds, ep.headers, ep.secret_headers`

// attemptsAllowed is how many attempts a job stamped with stamped may
// make: the endpoint's max_attempts lowers it, never raises it.
func (r endpointRequest) attemptsAllowed(stamped int) int {
	if r.maxAttempts > 0 {
		return min(stamped, r.maxAttempts)
	}
	return stamped
}

// retryUntil is the end of the endpoint's retry window for an attempt
// that failed at now: its first failure, or now for a first, plus the
// window; zero for none.
func (r endpointRequest) retryUntil(now time.Time) time.Time {
	if r.retryWindow <= 0 {
		return time.Time{}
	}
	first := r.firstFailure
	if first.IsZero() {
		first = now
	}
	return first.Add(r.retryWindow)
}

// attemptTimeout is the time limit of an attempt whose workers give
// attempts def: an endpoint's longer request timeout raises it, so that
// its request ends at its own timeout.
func (r endpointRequest) attemptTimeout(def time.Duration) time.Duration {
	return max(def, r.timeout)
}

// client is c, or, for an endpoint with a timeout of its own, a copy of c
// that ends its requests then: the copy shares c's transport and its
// pooled connections.
func (r endpointRequest) client(c *http.Client) *http.Client {
	if r.timeout <= 0 {
		return c
	}
	own := *c
	own.Timeout = r.timeout
	return &own
}

// setHeaders adds endpoint id's custom headers to h, the secret ones
// opened by box. Set before outboxd's own: none of these may take one of
// their names (checkHeaderName), and were one stored by hand, outboxd's
// would win.
func (r endpointRequest) setHeaders(h http.Header, box *secretBox, id int64) error {
	if len(r.headers) > 2 { // "{}": none
		var plain map[string]json.RawMessage
		if err := json.Unmarshal(r.headers, &plain); err != nil {
			return fmt.Errorf("headers of endpoint %d: %w", id, err)
		}
		for name, raw := range plain {
			var value string
			if json.Unmarshal(raw, &value) == nil { // a secret one is {"secret": true}
				h.Set(name, value)
			}
		}
	}
	secrets, err := openSecretHeaders(box, id, r.secretHeaders)
	if err != nil {
		return err
	}
	for name, value := range secrets {
		h.Set(name, value)
	}
	return nil
}

// formHeaders is the panel's two header fields as the API's "headers":
// plain and secret each hold one "Name: value" a line; a secret line
// whose value is maskedHeaderValue keeps the value stored. Empty lines
// are skipped.
func formHeaders(plain, secret string) ([]byte, error) {
	headers := map[string]any{}
	for i, text := range []string{plain, secret} {
		field := []string{"headers", "secret_headers"}[i]
		for n, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			name, value, ok := strings.Cut(line, ":")
			name, value = strings.TrimSpace(name), strings.TrimSpace(value)
			if !ok || name == "" {
				return nil, fmt.Errorf("%w: %s: line %d is not \"Name: value\"", errInvalid, field, n+1)
			}
			if _, twice := headers[name]; twice {
				return nil, fmt.Errorf("%w: %s: %s is given twice", errInvalid, field, name)
			}
			switch {
			case i == 0:
				headers[name] = value
			case value == maskedHeaderValue:
				headers[name] = map[string]bool{"secret": true}
			default:
				headers[name] = map[string]any{"value": value, "secret": true}
			}
		}
	}
	raw, err := json.Marshal(headers)
	if err != nil {
		return nil, fmt.Errorf("encode headers: %w", err)
	}
	return raw, nil
}

// headerFormLines is the headers column as the panel's two header fields
// show it, a secret value masked.
func headerFormLines(column []byte) (plain, secret string) {
	var p, s []string
	for _, h := range shownHeaders(column) {
		if h.Secret {
			s = append(s, h.Name+": "+h.Value)
		} else {
			p = append(p, h.Name+": "+h.Value)
		}
	}
	return strings.Join(p, "\n"), strings.Join(s, "\n")
}

// formSetting reads one of the request settings' form fields: empty is
// null, the service's default.
func formSetting(name, text string) (*int, error) {
	if text == "" {
		return nil, nil
	}
	n, err := strconv.Atoi(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %s must be a whole number, or empty for the service's default, got %q", errInvalid, name, text)
	}
	return &n, nil
}
