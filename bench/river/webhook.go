// webhook.go: the webhook both systems send, byte for byte: the body and
// the Standard Webhooks signature of outboxd's webhook.go and signature.go
// (this module cannot import outboxd's package main, so the few lines are
// repeated here), and the receiver's check of them.

package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// webhookTimestampTolerance is the Standard Webhooks figure outboxd's
// receiver applies too: a signed timestamp more than five minutes from the
// receiver's clock is refused.
const webhookTimestampTolerance = 5 * time.Minute

// webhookBody is outboxd's delivery body, fields in its order.
type webhookBody struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Subject   string          `json:"subject"`
	Timestamp string          `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// encodeWebhookBody encodes the body as outboxd does: no HTML escaping,
// no trailing newline, the time in UTC with nanoseconds.
func encodeWebhookBody(id, topic, subject string, created time.Time, data json.RawMessage) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(webhookBody{
		ID:        id,
		Type:      topic,
		Subject:   subject,
		Timestamp: created.UTC().Format(time.RFC3339Nano),
		Data:      data,
	})
	if err != nil {
		return nil, fmt.Errorf("encode webhook body: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// webhookMAC is HMAC-SHA256 over "id.timestamp.body", the timestamp as
// the decimal text that travels in the header.
func webhookMAC(secret []byte, msgID, timestamp string, body []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(msgID))
	mac.Write([]byte{'.'})
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}

// setWebhookHeaders sets webhook-id, webhook-timestamp (Unix seconds) and
// webhook-signature ("v1," and the base64 MAC), as outboxd does for an
// endpoint with one secret.
func setWebhookHeaders(h http.Header, secret []byte, msgID string, now time.Time, body []byte) {
	ts := strconv.FormatInt(now.Unix(), 10)
	h.Set("webhook-id", msgID)
	h.Set("webhook-timestamp", ts)
	h.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(webhookMAC(secret, msgID, ts, body)))
}

// verifyWebhook checks the three headers against body, the raw bytes as
// received, the way outboxd's receiver does: the timestamp within the
// tolerance, one v1 signature equal to the expected one, compared in
// constant time.
func verifyWebhook(secret []byte, h http.Header, body []byte, now time.Time) error {
	msgID, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if msgID == "" || ts == "" || sigs == "" {
		return errors.New("verify webhook: missing header")
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || strconv.FormatInt(secs, 10) != ts {
		return fmt.Errorf("verify webhook: malformed timestamp %q", ts)
	}
	if age := now.Unix() - secs; age > int64(webhookTimestampTolerance/time.Second) || -age > int64(webhookTimestampTolerance/time.Second) {
		return fmt.Errorf("verify webhook: timestamp %s is %ds from now", ts, age)
	}
	want := []byte(base64.StdEncoding.EncodeToString(webhookMAC(secret, msgID, ts, body)))
	for _, versioned := range strings.Fields(sigs) {
		if version, sig, ok := strings.Cut(versioned, ","); ok && version == "v1" && hmac.Equal([]byte(sig), want) {
			return nil
		}
	}
	return fmt.Errorf("verify webhook: webhook-id %q: no matching signature", msgID)
}
