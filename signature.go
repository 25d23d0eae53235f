// Signing webhooks we send and verifying webhooks we receive (Standard Webhooks).

package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The header names the Standard Webhooks specification fixes; receivers'
// libraries look for exactly these.
const (
	headerWebhookID        = "webhook-id"
	headerWebhookTimestamp = "webhook-timestamp"
	headerWebhookSignature = "webhook-signature"
)

const (
	// webhookSecretPrefix marks a symmetric secret, so that a secret pasted
	// into the wrong field is recognisable and receivers' libraries accept
	// it as is.
	webhookSecretPrefix = "whsec_"

	// webhookSecretBytes is 32 bytes (256 bits): the size of the
	// HMAC-SHA256 output, so the key is never the weaker half, and inside
	// the 24 to 64 bytes the specification recommends.
	webhookSecretBytes = 32

	// webhookTimestampTolerance is how far a signed timestamp may lie from
	// the receiver's clock, in either direction. Five minutes is the
	// specification's figure: wide enough for ordinary clock skew and a
	// slow network, narrow enough that a captured request cannot be
	// replayed later, because the timestamp is inside the signed content.
	// It is no substitute for dedup on webhook-id: a replay inside the
	// window, and every legitimate retry, carries a valid signature.
	webhookTimestampTolerance = 5 * time.Minute

	// webhookSignatureVersion is HMAC-SHA256, the scheme every endpoint
	// signs with unless it chooses v1a, and the only one the inbox
	// accepts. Other versions in a header it verifies (v1a among them)
	// are skipped, not errors, as the specification asks, so a sender can
	// add schemes without breaking us.
	webhookSignatureVersion = "v1"

	// webhookAsymmetricVersion is ed25519, the specification's asymmetric
	// scheme: an endpoint that chooses it signs with a private key
	// outboxd keeps, and its receiver verifies with the public key, which
	// it may publish: whoever reads the receiver's configuration cannot
	// forge a webhook.
	webhookAsymmetricVersion = "v1a"

	// webhookPublicKeyPrefix marks a v1a public key, as whsec_ does a
	// secret; the specification's libraries read it as is.
	webhookPublicKeyPrefix = "whpk_"
)

// The ways verification fails. A receiver answers 400 to the first two (the
// request is malformed) and 401 to the rest (well formed, not authentic).
var (
	errWebhookMissingHeader = errors.New("missing webhook header")
	errWebhookBadTimestamp  = errors.New("malformed webhook timestamp")
	errWebhookTooOld        = errors.New("webhook timestamp too old")
	errWebhookTooNew        = errors.New("webhook timestamp too new")
	errWebhookNoSignature   = errors.New("no matching webhook signature")
)

// webhookSecret is the raw key of one endpoint or inbox source. Its String
// and LogValue are redacted, so a secret that reaches a log line or an
// error by accident shows nothing; Encode is the one way to display it.
type webhookSecret []byte

// newWebhookSecret returns a fresh random secret.
func newWebhookSecret() webhookSecret {
	s := make(webhookSecret, webhookSecretBytes)
	// Since Go 1.24 crypto/rand.Read never returns an error: it crashes
	// the program rather than hand out a short or predictable key.
	rand.Read(s)
	return s
}

// parseWebhookSecret reads a secret as `whsec_<base64>` or as bare base64,
// the two forms the specification's libraries accept, so a secret issued
// by another sender can be pasted as its owner shows it.
func parseWebhookSecret(text string) (webhookSecret, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(text, webhookSecretPrefix))
	if err != nil {
		// The decoder's message quotes a byte offset, not the secret.
		return nil, fmt.Errorf("parse webhook secret: %w", err)
	}
	if len(key) == 0 {
		// An empty HMAC key is a valid key that everyone knows.
		return nil, errors.New("parse webhook secret: empty key")
	}
	return key, nil
}

// Encode shows the secret as `whsec_<base64>`, the form an endpoint's owner
// is given once and the form parseWebhookSecret reads back.
func (s webhookSecret) Encode() string {
	return webhookSecretPrefix + base64.StdEncoding.EncodeToString(s)
}

func (s webhookSecret) String() string { return webhookSecretPrefix + "[redacted]" }

func (s webhookSecret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// signWebhook returns one signature, `v1,<base64 HMAC-SHA256 of
// "id.timestamp.body">`, with the timestamp in Unix seconds. The body is the
// exact bytes sent: any re-encoding on either side breaks the signature.
// secret must not be empty; verifyWebhook never accepts an empty key.
func signWebhook(secret []byte, msgID string, ts time.Time, body []byte) string {
	return webhookSignatureVersion + "," + base64.StdEncoding.EncodeToString(
		webhookMAC(secret, msgID, strconv.FormatInt(ts.Unix(), 10), body))
}

// webhookMAC computes the HMAC over the signed content. The timestamp is
// taken as the text that travels in the header, so signer and verifier
// hash the very same bytes.
func webhookMAC(secret []byte, msgID, timestamp string, body []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(msgID))
	mac.Write([]byte{'.'})
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}

// signingKey is one key a request is signed with: an HMAC secret (v1),
// or, with public set, the seed of an ed25519 private key whose public key
// is public (v1a).
type signingKey struct {
	secret []byte
	public ed25519.PublicKey
}

// hmacKeys are secrets as v1 keys.
func hmacKeys(secrets [][]byte) []signingKey {
	keys := make([]signingKey, 0, len(secrets))
	for _, secret := range secrets {
		keys = append(keys, signingKey{secret: secret})
	}
	return keys
}

// signingKeysOf pairs an endpoint's opened secrets with their public keys
// (deliveryEndpoint.PublicKeys, in the same places; nil: v1). A v1a seed
// must give the public key stored beside it, the one its receiver
// verifies with: a seed of the wrong size, or another key's (an HMAC
// secret a release without v1a rotated in), would sign what no receiver
// verifies, so it is an error that says so, and nothing is sent.
func signingKeysOf(secrets, publicKeys [][]byte) ([]signingKey, error) {
	keys := make([]signingKey, 0, len(secrets))
	for i, secret := range secrets {
		var public []byte
		if i < len(publicKeys) {
			public = publicKeys[i]
		}
		if public == nil {
			keys = append(keys, signingKey{secret: secret})
			continue
		}
		if len(secret) != ed25519.SeedSize || !bytes.Equal(ed25519PublicKey(secret), public) {
			return nil, fmt.Errorf("signing key %d of %d is not the private key of public key %s",
				i+1, len(secrets), encodePublicKey(public))
		}
		keys = append(keys, signingKey{secret: secret, public: public})
	}
	return keys, nil
}

// sign is one signature, `v1,<base64 HMAC-SHA256>` or `v1a,<base64
// ed25519 signature>`, of the same content: "id.timestamp.body", the
// timestamp as the text that travels in the header.
func (k signingKey) sign(msgID, timestamp string, body []byte) string {
	if k.public == nil {
		return webhookSignatureVersion + "," + base64.StdEncoding.EncodeToString(webhookMAC(k.secret, msgID, timestamp, body))
	}
	content := make([]byte, 0, len(msgID)+len(timestamp)+2+len(body))
	content = append(append(append(append(append(content, msgID...), '.'), timestamp...), '.'), body...)
	return webhookAsymmetricVersion + "," + base64.StdEncoding.EncodeToString(
		ed25519.Sign(ed25519.NewKeyFromSeed(k.secret), content))
}

// newEndpointSecret is a fresh key for an endpoint signing with scheme: a
// random HMAC secret for v1, the seed of a fresh ed25519 key pair for
// v1a (its private key: ed25519PublicKey gives the public one).
func newEndpointSecret(scheme string) webhookSecret {
	if scheme != webhookAsymmetricVersion {
		return newWebhookSecret()
	}
	// Since Go 1.24 crypto/rand never fails: neither does GenerateKey
	// with it.
	_, private, _ := ed25519.GenerateKey(rand.Reader)
	return webhookSecret(private.Seed())
}

// ed25519PublicKey is the public key of the ed25519 private key seed.
func ed25519PublicKey(seed []byte) ed25519.PublicKey {
	return ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
}

// encodePublicKey shows a v1a public key as `whpk_<base64>`.
func encodePublicKey(public []byte) string {
	return webhookPublicKeyPrefix + base64.StdEncoding.EncodeToString(public)
}

// webhookSignatures returns the value of the webhook-signature header: one
// signature a key, space-separated. While a key is being rotated an
// endpoint has two, and a receiver that knows either one verifies.
func webhookSignatures(keys []signingKey, msgID string, ts time.Time, body []byte) string {
	timestamp := strconv.FormatInt(ts.Unix(), 10)
	sigs := make([]string, 0, len(keys))
	for _, key := range keys {
		sigs = append(sigs, key.sign(msgID, timestamp, body))
	}
	return strings.Join(sigs, " ")
}

// setWebhookHeaders sets the three signature headers of one request
// signed with HMAC secrets alone (v1): setSignedHeaders with hmacKeys.
func setWebhookHeaders(h http.Header, secrets [][]byte, msgID string, ts time.Time, body []byte) {
	setSignedHeaders(h, hmacKeys(secrets), msgID, ts, body)
}

// setSignedHeaders sets the three signature headers of one delivery
// attempt. msgID is the same on every attempt (receivers dedupe on it); ts
// is the attempt's own time, so a retry days later is still inside the
// receiver's tolerance.
func setSignedHeaders(h http.Header, keys []signingKey, msgID string, ts time.Time, body []byte) {
	h.Set(headerWebhookID, msgID)
	h.Set(headerWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(headerWebhookSignature, webhookSignatures(keys, msgID, ts, body))
}

// verifyWebhook checks a received webhook against the source's secrets
// (more than one while a secret is being rotated). body must be the raw
// bytes as received, never a re-serialisation. now is the receiver's clock,
// a parameter so tests control it. The error wraps one of the sentinels
// above (errWebhookTooOld and the rest).
func verifyWebhook(secrets [][]byte, header http.Header, body []byte, now time.Time) error {
	msgID := header.Get(headerWebhookID)
	timestamp := header.Get(headerWebhookTimestamp)
	// HTTP lets a field repeat; every signature must still be a valid MAC,
	// so reading all of the lines admits nothing more.
	signatures := strings.Join(header.Values(headerWebhookSignature), " ")
	for _, h := range []struct{ name, value string }{
		{headerWebhookID, msgID},
		{headerWebhookTimestamp, timestamp},
		{headerWebhookSignature, signatures},
	} {
		if h.value == "" {
			return fmt.Errorf("verify webhook: %s: %w", h.name, errWebhookMissingHeader)
		}
	}

	if err := checkWebhookTimestamp(timestamp, now); err != nil {
		return fmt.Errorf("verify webhook: %w", err)
	}

	expected := make([][]byte, 0, len(secrets))
	for _, secret := range secrets {
		if len(secret) == 0 {
			// Fail closed: an unset secret must not verify the
			// signatures anyone can compute with an empty key.
			continue
		}
		mac := webhookMAC(secret, msgID, timestamp, body)
		expected = append(expected, []byte(base64.StdEncoding.EncodeToString(mac)))
	}
	for _, versioned := range strings.Fields(signatures) {
		version, sig, ok := strings.Cut(versioned, ",")
		if !ok || version != webhookSignatureVersion {
			continue
		}
		for _, want := range expected {
			// Compared as the base64 text, as the reference libraries
			// do: no decoder leniency (padding, trailing bits) can make
			// two texts mean one MAC. hmac.Equal takes the same time
			// however many leading bytes match, so the comparison leaks
			// nothing an attacker could use to build a MAC byte by byte.
			if hmac.Equal([]byte(sig), want) {
				return nil
			}
		}
	}
	return fmt.Errorf("verify webhook: %s %q: %w", headerWebhookID, msgID, errWebhookNoSignature)
}

// checkWebhookTimestamp refuses a timestamp that is malformed or lies
// more than webhookTimestampTolerance from now, in either direction.
func checkWebhookTimestamp(timestamp string, now time.Time) error {
	ts, err := parseWebhookTimestamp(timestamp)
	if err != nil {
		return err
	}
	// In whole seconds, not time.Duration: now.Sub saturates at 292 years,
	// and its negation then overflows, which once let a timestamp
	// thousands of years ahead (milliseconds sent as seconds) pass the
	// check for ever. Both are Unix seconds in [0, 2⁶³), so their
	// difference cannot overflow. Inclusive at both ends: exactly five
	// minutes off is still accepted.
	tolerance := int64(webhookTimestampTolerance / time.Second)
	if age := now.Unix() - ts.Unix(); age > tolerance {
		return fmt.Errorf("timestamp %s is %s old: %w", timestamp, secondsText(age), errWebhookTooOld)
	} else if -age > tolerance {
		return fmt.Errorf("timestamp %s is %s ahead: %w", timestamp, secondsText(-age), errWebhookTooNew)
	}
	return nil
}

// secondsText shows n seconds as a duration, or in seconds when that is
// longer than a time.Duration holds.
func secondsText(n int64) string {
	if n > int64(math.MaxInt64/time.Second) {
		return strconv.FormatInt(n, 10) + "s"
	}
	return (time.Duration(n) * time.Second).String()
}

// parseWebhookTimestamp reads Unix seconds written as plain decimal digits.
// Anything else ("+1614265330", "01614265330", "1614265330.5") is refused
// rather than normalised: the MAC is over the text as sent, and a second
// spelling of one instant is a second message.
func parseWebhookTimestamp(text string) (time.Time, error) {
	secs, err := strconv.ParseInt(text, 10, 64)
	if err != nil || secs < 0 || strconv.FormatInt(secs, 10) != text {
		return time.Time{}, fmt.Errorf("%s %q: %w", headerWebhookTimestamp, text, errWebhookBadTimestamp)
	}
	return time.Unix(secs, 0), nil
}
