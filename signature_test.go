// Tests for signing and verifying webhooks (Standard Webhooks).

package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// The test vector published with the Standard Webhooks reference libraries
// (libraries/go/webhook_test.go, TestWebhookSign, and its siblings in the
// other languages). Reproducing it is what proves a receiver's stock
// library accepts what we send; a round trip through our own verifier
// would pass with the delimiter or the key decoding wrong.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorMsgID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

	// A well-formed v1 signature that matches nothing, from the same
	// reference tests.
	foreignSignature = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
)

func mustParseSecret(t testing.TB, text string) webhookSecret {
	t.Helper()
	s, err := parseWebhookSecret(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSignWebhookMatchesSpecVector(t *testing.T) {
	t.Parallel()
	// The bare base64 form must give the same key: senders show either.
	for _, text := range []string{vectorSecret, strings.TrimPrefix(vectorSecret, webhookSecretPrefix)} {
		secret := mustParseSecret(t, text)
		got := signWebhook(secret, vectorMsgID, time.Unix(vectorTimestamp, 0), []byte(vectorBody))
		if got != vectorSignature {
			t.Errorf("signWebhook with secret %q = %q, want %q", text, got, vectorSignature)
		}
	}
}

func vectorHeader() http.Header {
	h := http.Header{}
	h.Set(headerWebhookID, vectorMsgID)
	h.Set(headerWebhookTimestamp, strconv.Itoa(vectorTimestamp))
	h.Set(headerWebhookSignature, vectorSignature)
	return h
}

func TestVerifyWebhook(t *testing.T) {
	t.Parallel()
	vector := []byte(mustParseSecret(t, vectorSecret))
	other := []byte(newWebhookSecret())
	signedAt := time.Unix(vectorTimestamp, 0)

	type verifyCase struct {
		name    string
		secrets [][]byte
		header  func(h http.Header) // edits the vector's header
		body    string              // empty means the vector's body
		now     time.Time           // zero means the vector's timestamp
		want    error
	}
	tests := []verifyCase{
		{name: "spec vector", secrets: [][]byte{vector}},
		{
			name:    "tampered body",
			secrets: [][]byte{vector},
			body:    `{"test": 2432232315}`,
			want:    errWebhookNoSignature,
		},
		{
			// The same JSON re-serialised: verification is over bytes.
			name:    "re-encoded body",
			secrets: [][]byte{vector},
			body:    `{"test":2432232314}`,
			want:    errWebhookNoSignature,
		},
		{name: "wrong secret", secrets: [][]byte{other}, want: errWebhookNoSignature},
		{name: "no secrets", want: errWebhookNoSignature},
		{
			name:    "empty secret never verifies",
			secrets: [][]byte{{}},
			header: func(h http.Header) {
				h.Set(headerWebhookSignature, signWebhook(nil, vectorMsgID, signedAt, []byte(vectorBody)))
			},
			want: errWebhookNoSignature,
		},
		{
			name:    "other message id",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Set(headerWebhookID, "msg_other") },
			want:    errWebhookNoSignature,
		},
		{
			// The timestamp is signed: moving it into the window breaks
			// the signature rather than reviving an old request.
			name:    "timestamp moved",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Set(headerWebhookTimestamp, strconv.Itoa(vectorTimestamp+1)) },
			now:     signedAt.Add(time.Second),
			want:    errWebhookNoSignature,
		},
		{
			name:    "exactly tolerance old",
			secrets: [][]byte{vector},
			now:     signedAt.Add(webhookTimestampTolerance),
		},
		{
			name:    "one second too old",
			secrets: [][]byte{vector},
			now:     signedAt.Add(webhookTimestampTolerance + time.Second),
			want:    errWebhookTooOld,
		},
		{
			name:    "exactly tolerance ahead",
			secrets: [][]byte{vector},
			now:     signedAt.Add(-webhookTimestampTolerance),
		},
		{
			name:    "one second too far ahead",
			secrets: [][]byte{vector},
			now:     signedAt.Add(-webhookTimestampTolerance - time.Second),
			want:    errWebhookTooNew,
		},
		{
			// Milliseconds sent as seconds: 50,000 years ahead, past
			// what a time.Duration holds.
			name:    "milliseconds as seconds is too far ahead",
			secrets: [][]byte{vector},
			header: func(h http.Header) {
				ms := strconv.Itoa(vectorTimestamp * 1000)
				h.Set(headerWebhookTimestamp, ms)
				h.Set(headerWebhookSignature, signWebhook(vector, vectorMsgID, time.Unix(int64(vectorTimestamp)*1000, 0), []byte(vectorBody)))
			},
			want: errWebhookTooNew,
		},
		{
			// The largest timestamp there is, signed: its distance from now
			// overflows any arithmetic in time.Duration.
			name:    "the largest timestamp is too far ahead",
			secrets: [][]byte{vector},
			header: func(h http.Header) {
				h.Set(headerWebhookTimestamp, strconv.FormatInt(math.MaxInt64, 10))
				h.Set(headerWebhookSignature, signWebhook(vector, vectorMsgID, time.Unix(math.MaxInt64, 0), []byte(vectorBody)))
			},
			want: errWebhookTooNew,
		},
		{
			name:    "wrong secret and too old reports the age",
			secrets: [][]byte{other},
			now:     signedAt.Add(time.Hour),
			want:    errWebhookTooOld,
		},
		{
			// The reference tests' list: other versions are skipped.
			name:    "several signatures one valid",
			secrets: [][]byte{vector},
			header: func(h http.Header) {
				h.Set(headerWebhookSignature, strings.Join([]string{
					foreignSignature,
					"v2," + strings.TrimPrefix(foreignSignature, "v1,"),
					vectorSignature,
					foreignSignature,
				}, " "))
			},
		},
		{
			name:    "valid MAC under another version",
			secrets: [][]byte{vector},
			header: func(h http.Header) {
				h.Set(headerWebhookSignature, "v1a,"+strings.TrimPrefix(vectorSignature, "v1,"))
			},
			want: errWebhookNoSignature,
		},
		{
			name:    "signature on a second header line",
			secrets: [][]byte{vector},
			header: func(h http.Header) {
				h.Set(headerWebhookSignature, foreignSignature)
				h.Add(headerWebhookSignature, vectorSignature)
			},
		},
		{
			name:    "rotation: receiver knows old and new",
			secrets: [][]byte{other, vector},
		},
		{
			name:    "rotation: sender signs with old and new",
			secrets: [][]byte{vector},
			header: func(h http.Header) {
				h.Set(headerWebhookSignature, webhookSignatures(hmacKeys([][]byte{other, vector}), vectorMsgID, signedAt, []byte(vectorBody)))
			},
		},
		{
			name:    "reference foreign signature",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Set(headerWebhookSignature, foreignSignature) },
			want:    errWebhookNoSignature,
		},
		{
			name:    "signature case changed",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Set(headerWebhookSignature, strings.ToUpper(vectorSignature)) },
			want:    errWebhookNoSignature,
		},
		{
			name:    "missing id",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Del(headerWebhookID) },
			want:    errWebhookMissingHeader,
		},
		{
			name:    "missing timestamp",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Del(headerWebhookTimestamp) },
			want:    errWebhookMissingHeader,
		},
		{
			name:    "missing signature",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Del(headerWebhookSignature) },
			want:    errWebhookMissingHeader,
		},
		{
			name:    "empty signature",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Set(headerWebhookSignature, "") },
			want:    errWebhookMissingHeader,
		},
		{
			name:    "signature of spaces",
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Set(headerWebhookSignature, "   ") },
			want:    errWebhookNoSignature,
		},
	}
	for _, bad := range []string{"abc", "+1614265330", "01614265330", "1614265330.0", "-1", "1614265330 ", "99999999999999999999"} {
		tests = append(tests, verifyCase{
			name:    fmt.Sprintf("timestamp %q", bad),
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Set(headerWebhookTimestamp, bad) },
			want:    errWebhookBadTimestamp,
		})
	}
	for _, bad := range []string{"v1", "v1,", ",", "garbage", "v1,not base64!", "v1," + strings.TrimPrefix(vectorSignature, "v1,")[:10]} {
		tests = append(tests, verifyCase{
			name:    fmt.Sprintf("signature %q", bad),
			secrets: [][]byte{vector},
			header:  func(h http.Header) { h.Set(headerWebhookSignature, bad) },
			want:    errWebhookNoSignature,
		})
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := vectorHeader()
			if tc.header != nil {
				tc.header(h)
			}
			body := vectorBody
			if tc.body != "" {
				body = tc.body
			}
			now := tc.now
			if now.IsZero() {
				now = signedAt
			}
			err := verifyWebhook(tc.secrets, h, []byte(body), now)
			if diff := cmp.Diff(tc.want, err, cmpopts.EquateErrors()); diff != "" {
				t.Errorf("verifyWebhook error mismatch (-want +got):\n%s\ngot: %v", diff, err)
			}
		})
	}
}

func TestVerifyWebhookErrorNamesTheProblem(t *testing.T) {
	t.Parallel()
	secret := []byte(mustParseSecret(t, vectorSecret))
	h := vectorHeader()
	h.Del(headerWebhookTimestamp)
	err := verifyWebhook([][]byte{secret}, h, []byte(vectorBody), time.Unix(vectorTimestamp, 0))
	if err == nil || !strings.Contains(err.Error(), headerWebhookTimestamp) {
		t.Errorf("missing timestamp: error %v does not name %s", err, headerWebhookTimestamp)
	}
	err = verifyWebhook([][]byte{secret}, vectorHeader(), []byte(vectorBody), time.Unix(vectorTimestamp, 0).Add(time.Hour))
	if err == nil || !strings.Contains(err.Error(), "is 1h0m0s old") {
		t.Errorf("old timestamp: error %v does not say how old it is", err)
	}
}

func TestSetWebhookHeaders(t *testing.T) {
	t.Parallel()
	oldKey := []byte(mustParseSecret(t, vectorSecret))
	newKey := []byte(newWebhookSecret())
	at := time.Unix(vectorTimestamp, 999_000_000) // sub-second part is dropped, not rounded
	body := []byte(vectorBody)

	h := http.Header{}
	setWebhookHeaders(h, [][]byte{oldKey, newKey}, vectorMsgID, at, body)
	want := http.Header{
		"Webhook-Id":        {vectorMsgID},
		"Webhook-Timestamp": {"1614265330"},
		"Webhook-Signature": {vectorSignature + " " + signWebhook(newKey, vectorMsgID, at, body)},
	}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("headers mismatch (-want +got):\n%s", diff)
	}
	// Each side of a rotation verifies on its own: a receiver that has
	// only the old secret and one that has only the new both accept.
	for _, key := range [][]byte{oldKey, newKey} {
		if err := verifyWebhook([][]byte{key}, h, body, at); err != nil {
			t.Errorf("verify with one of the rotated secrets: %v", err)
		}
	}
}

func TestWebhookSecret(t *testing.T) {
	t.Parallel()
	a, b := newWebhookSecret(), newWebhookSecret()
	if len(a) != webhookSecretBytes {
		t.Errorf("len(newWebhookSecret()) = %d, want %d", len(a), webhookSecretBytes)
	}
	if bytes.Equal(a, b) {
		t.Error("two new secrets are equal")
	}

	encoded := a.Encode()
	if !strings.HasPrefix(encoded, webhookSecretPrefix) {
		t.Errorf("Encode() = %q, want prefix %q", encoded, webhookSecretPrefix)
	}
	if got := mustParseSecret(t, encoded); !bytes.Equal(got, a) {
		t.Errorf("parseWebhookSecret(Encode()) = %x, want %x", got, a)
	}

	// A secret reaching a log line or an error by accident shows nothing.
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "secret", a)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "secret", a)
	for name, shown := range map[string]string{
		"%v":     fmt.Sprintf("%v", a),
		"%s":     fmt.Sprintf("%s", a),
		"%+v":    fmt.Sprintf("%+v", struct{ S webhookSecret }{a}),
		"errorf": fmt.Errorf("x: %v", a).Error(),
		"slog":   logged.String(),
	} {
		if strings.Contains(shown, strings.TrimPrefix(encoded, webhookSecretPrefix)) || !strings.Contains(shown, "redacted") {
			t.Errorf("%s shows the secret unredacted: %s", name, shown)
		}
	}
}

func TestParseWebhookSecretRejects(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"", webhookSecretPrefix, "whsec_not base64!", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS"} {
		if s, err := parseWebhookSecret(text); err == nil {
			t.Errorf("parseWebhookSecret(%q) = %x, want an error", text, []byte(s))
		}
	}
}

// FuzzVerifyWebhook checks two properties. Whatever arrives, verification
// returns one of its sentinels without panicking, and it succeeds only when
// the header really carries the MAC of what was received. And whatever we
// send, for any id and body, verifies with the secret it was signed with.
func FuzzVerifyWebhook(f *testing.F) {
	vector := []byte(mustParseSecret(f, vectorSecret))
	f.Add(vector, vectorMsgID, int64(vectorTimestamp), []byte(vectorBody), strconv.Itoa(vectorTimestamp), vectorSignature)
	f.Add(vector, vectorMsgID, int64(vectorTimestamp), []byte(vectorBody), strconv.Itoa(vectorTimestamp), foreignSignature+" v2,x "+vectorSignature)
	f.Add(vector, vectorMsgID, int64(vectorTimestamp), []byte(vectorBody), "+1614265330", vectorSignature)
	f.Add([]byte{}, "", int64(0), []byte{}, "", "")
	f.Add([]byte("k"), "a.b", int64(1<<62), []byte("\x00.\xff"), "0", "v1, ,v1 v1,,")

	sentinels := []error{errWebhookMissingHeader, errWebhookBadTimestamp, errWebhookTooOld, errWebhookTooNew, errWebhookNoSignature}
	f.Fuzz(func(t *testing.T, secret []byte, msgID string, now int64, body []byte, timestamp, signature string) {
		h := http.Header{}
		h.Set(headerWebhookID, msgID)
		h.Set(headerWebhookTimestamp, timestamp)
		h.Set(headerWebhookSignature, signature)
		err := verifyWebhook([][]byte{secret}, h, body, time.Unix(now, 0))
		if err != nil && !slices.ContainsFunc(sentinels, func(s error) bool { return errors.Is(err, s) }) {
			t.Fatalf("verifyWebhook returned %v, which wraps no sentinel", err)
		}
		if err == nil {
			mac := "v1," + base64.StdEncoding.EncodeToString(webhookMAC(secret, msgID, timestamp, body))
			if len(secret) == 0 || !slices.Contains(strings.Fields(signature), mac) {
				t.Fatalf("verified without a matching MAC: secret %x, header %q", secret, signature)
			}
		}

		if len(secret) == 0 || msgID == "" || now < 0 {
			return // not something we send: no key, no id, or before 1970
		}
		sent := http.Header{}
		setWebhookHeaders(sent, [][]byte{secret}, msgID, time.Unix(now, 0), body)
		if err := verifyWebhook([][]byte{secret}, sent, body, time.Unix(now, 0)); err != nil {
			t.Fatalf("our own signature does not verify: %v (headers %q)", err, sent)
		}
	})
}
