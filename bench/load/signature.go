// signature.go: the receiver's check of a webhook's Standard Webhooks
// signature, as any receiver of outboxd's would write it (a short copy of
// the rules in outboxd's signature.go).

package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// webhookTimestampTolerance is how far a signed timestamp may lie from
// the receiver's clock, either way: the specification's five minutes.
const webhookTimestampTolerance = 5 * time.Minute

// webhookSecret is an endpoint's raw key.
type webhookSecret []byte

// parseWebhookSecret reads a secret as outboxd shows it, whsec_<base64>.
func parseWebhookSecret(text string) (webhookSecret, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(text, "whsec_"))
	if err != nil {
		return nil, fmt.Errorf("parse webhook secret: %w", err)
	}
	if len(key) == 0 {
		return nil, errors.New("parse webhook secret: empty key")
	}
	return key, nil
}

// verifyWebhook checks that one of the webhook-signature header's v1
// signatures is the HMAC-SHA256 of "id.timestamp.body" under secret, and
// that the timestamp is within webhookTimestampTolerance of now. body is
// the raw bytes received.
func verifyWebhook(secret webhookSecret, header http.Header, body []byte, now time.Time) error {
	id, timestamp := header.Get("webhook-id"), header.Get("webhook-timestamp")
	signatures := strings.Join(header.Values("webhook-signature"), " ")
	if id == "" || timestamp == "" || signatures == "" || len(secret) == 0 {
		return errors.New("verify webhook: a header or the secret is missing")
	}
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("verify webhook: timestamp %q: %w", timestamp, err)
	}
	if off := now.Unix() - ts; off > int64(webhookTimestampTolerance/time.Second) || -off > int64(webhookTimestampTolerance/time.Second) {
		return fmt.Errorf("verify webhook: timestamp %s is %ds off the receiver's clock", timestamp, off)
	}
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%s.%s.", id, timestamp)
	mac.Write(body)
	want := []byte(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	for _, versioned := range strings.Fields(signatures) {
		if version, sig, ok := strings.Cut(versioned, ","); ok && version == "v1" && hmac.Equal([]byte(sig), want) {
			return nil
		}
	}
	return fmt.Errorf("verify webhook: webhook-id %q: no matching signature", id)
}
