package main

import (
	"net/http"
	"testing"
	"time"
)

// The Standard Webhooks reference vector, the one outboxd's
// signature_test.go checks its signer against: both systems must send
// signatures that the reference libraries accept.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorMsgID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func TestSignatureMatchesReferenceVector(t *testing.T) {
	secret, err := parseSecret(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	setWebhookHeaders(h, secret, vectorMsgID, time.Unix(vectorTimestamp, 0), []byte(vectorBody))
	if got := h.Get("webhook-signature"); got != vectorSignature {
		t.Errorf("webhook-signature = %q, want %q", got, vectorSignature)
	}
	if got := h.Get("webhook-timestamp"); got != "1614265330" {
		t.Errorf("webhook-timestamp = %q, want 1614265330", got)
	}
	if err := verifyWebhook(secret, h, []byte(vectorBody), time.Unix(vectorTimestamp, 0)); err != nil {
		t.Errorf("verify the reference vector: %v", err)
	}
	if err := verifyWebhook(secret, h, []byte(vectorBody+" "), time.Unix(vectorTimestamp, 0)); err == nil {
		t.Error("verify accepted a changed body")
	}
	if err := verifyWebhook(secret, h, []byte(vectorBody), time.Unix(vectorTimestamp, 0).Add(webhookTimestampTolerance+time.Second)); err == nil {
		t.Error("verify accepted a timestamp past the tolerance")
	}
}

// The body outboxd's encodeWebhookBody writes for bench/load's event:
// the same field order, no HTML escaping, no trailing newline.
func TestBodyIsOutboxdsBody(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.FixedZone("x", 3600))
	got, err := encodeWebhookBody("7", loadTopic, "bulk-0", created, loadPayload)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"7","type":"load.event","subject":"bulk-0","timestamp":"2026-01-02T02:04:05.123456Z","data":{"load":true}}`
	if string(got) != want {
		t.Errorf("body:\n got %s\nwant %s", got, want)
	}
}
