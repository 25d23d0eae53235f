// asymmetric_test.go: endpoints that sign with v1a (ed25519): what their
// receivers verify, rotation and switching, and where the private key
// must never show.

package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// v1aWorld is an API sealing secrets, its logs, a receiver, and workers
// run a pass at a time, over one test database.
type v1aWorld struct {
	t    *testing.T
	db   *sql.DB
	box  *secretBox
	api  *testAPI
	rc   *receiver
	logs *syncBuffer
}

func newV1aWorld(t *testing.T) *v1aWorld {
	t.Helper()
	db, _ := newTestDB(t)
	box := testBox(t, testSecretsKey(1), "")
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	api := &testAPI{t: t, srv: serveAdmin(t, testAdmin(t, db, testPolicy, logger, box))}
	return &v1aWorld{t: t, db: db, box: box, api: api, rc: newReceiver(t, nil), logs: logs}
}

// deliver records an event of topic "t", fans it out and runs the
// workers once (logging to w.logs), and returns the request the receiver
// got for it.
func (w *v1aWorld) deliver(subject string) received {
	w.t.Helper()
	before := len(w.rc.requests())
	record(w.t, w.db, "t", subject)
	relayAll(w.t, w.db)
	logger := slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	sender := newWebhookSender(w.db, w.box, client, nil, nil, logger)
	wp := newWorkerPool(w.db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(),
		map[string]jobHandler{webhookJobKind: sender.deliver}, logger)
	if _, err := wp.workOnce(context.Background(), 10); err != nil {
		w.t.Fatal(err)
	}
	reqs := w.rc.requests()
	if len(reqs) != before+1 {
		w.t.Fatalf("%d requests after delivering %q, want %d", len(reqs), subject, before+1)
	}
	return reqs[before]
}

// call sends an API request that must answer want, and decodes its answer
// into out, returning the raw body.
func (w *v1aWorld) call(method, path, body string, want int, out any) []byte {
	w.t.Helper()
	status, resp := w.api.do(method, path, body)
	if status != want {
		w.t.Fatalf("%s %s: %d %s, want %d", method, path, status, resp, want)
	}
	if out != nil {
		if err := json.Unmarshal(resp, out); err != nil {
			w.t.Fatal(err)
		}
	}
	return resp
}

// seeds are the private keys (ed25519 seeds) endpoint id holds, opened.
func (w *v1aWorld) seeds(id int64) [][]byte {
	w.t.Helper()
	secret, previous := storedSecrets(w.t, w.db, endpointSecretsQuery, id)
	stored := [][]byte{secret}
	if previous != nil {
		stored = append(stored, previous)
	}
	opened, err := w.box.openAll(endpointSecretRow(id), stored)
	if err != nil {
		w.t.Fatal(err)
	}
	return opened
}

// keyForms are the ways a private key could leak into a text: its seed
// and the whole private key, in the encodings an answer, a log or a page
// would use.
func keyForms(seed []byte) []string {
	private := ed25519.NewKeyFromSeed(seed)
	var forms []string
	for _, b := range [][]byte{seed, private} {
		forms = append(forms, base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
			base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b), hex.EncodeToString(b))
	}
	return forms
}

// mustNotShowKey fails if text holds seed in any form keyForms knows.
func mustNotShowKey(t *testing.T, where, text string, seed []byte) {
	t.Helper()
	for _, form := range keyForms(seed) {
		if strings.Contains(text, form) {
			t.Errorf("%s shows the private key (%s...)", where, form[:8])
		}
	}
}

// publicKeyOf decodes a whpk_ key as an answer shows it.
func publicKeyOf(t *testing.T, shown *string) ed25519.PublicKey {
	t.Helper()
	if shown == nil || !strings.HasPrefix(*shown, webhookPublicKeyPrefix) {
		t.Fatalf("public key %v, want whpk_...", shown)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(*shown, webhookPublicKeyPrefix))
	if err != nil || len(key) != ed25519.PublicKeySize {
		t.Fatalf("public key %q: %d bytes, %v; want 32", *shown, len(key), err)
	}
	return key
}

// signaturesOf splits a request's webhook-signature header into its
// versions and their decoded signatures, in order.
func signaturesOf(t *testing.T, req received) (versions []string, sigs [][]byte) {
	t.Helper()
	for _, s := range strings.Fields(req.Header.Get(headerWebhookSignature)) {
		version, value, _ := strings.Cut(s, ",")
		raw, err := base64.StdEncoding.DecodeString(value)
		if err != nil {
			t.Fatalf("signature %q: %v", s, err)
		}
		versions, sigs = append(versions, version), append(sigs, raw)
	}
	return versions, sigs
}

// signedContent is what every scheme signs: id.timestamp.body.
func signedContent(req received, body []byte) []byte {
	return []byte(req.Header.Get(headerWebhookID) + "." + req.Header.Get(headerWebhookTimestamp) + "." + string(body))
}

// An endpoint created with "signature": "v1a" shows its public key and no
// secret; each request carries one v1a signature, which verifies with
// that public key and not with another key, nor over a changed body, id
// or timestamp. The private key is stored sealed, as a secret is, and no
// answer, log line or panel page shows it.
func TestV1aSignaturesVerifyWithThePublicKeyOnly(t *testing.T) {
	t.Parallel()
	w := newV1aWorld(t)
	var created endpointWithSecret
	raw := w.call("POST", "/api/endpoints", fmt.Sprintf(`{"url": %q, "signature": "v1a"}`, w.rc.srv.URL), http.StatusCreated, &created)
	if created.Signature != "v1a" || created.Secret != "" || bytes.Contains(raw, []byte(`"secret"`)) {
		t.Fatalf("created %s: want signature v1a, and no secret", raw)
	}
	public := publicKeyOf(t, created.PublicKey)
	seeds := w.seeds(created.ID)
	if len(seeds) != 1 || !bytes.Equal(ed25519PublicKey(seeds[0]), public) {
		t.Fatalf("stored %d keys, want the one whose public key the answer shows", len(seeds))
	}
	if sealed, _ := storedSecrets(t, w.db, endpointSecretsQuery, created.ID); !isSealed(sealed) {
		t.Error("the private key is stored in the clear under -secrets-key")
	}

	req := w.deliver("signed")
	versions, sigs := signaturesOf(t, req)
	if len(versions) != 1 || versions[0] != "v1a" || len(sigs[0]) != ed25519.SignatureSize {
		t.Fatalf("webhook-signature %q: want one v1a signature", req.Header.Get(headerWebhookSignature))
	}
	if !ed25519.Verify(public, signedContent(req, req.Body), sigs[0]) {
		t.Error("the v1a signature does not verify with the endpoint's public key")
	}
	other, _, _ := ed25519.GenerateKey(nil)
	tampered := bytes.Replace(req.Body, []byte(`"signed"`), []byte(`"forged"`), 1)
	for name, ok := range map[string]bool{
		"another key":       ed25519.Verify(other, signedContent(req, req.Body), sigs[0]),
		"a changed body":    ed25519.Verify(public, signedContent(req, tampered), sigs[0]),
		"another timestamp": ed25519.Verify(public, []byte(req.Header.Get(headerWebhookID)+".1."+string(req.Body)), sigs[0]),
	} {
		if ok {
			t.Errorf("the signature verifies with %s", name)
		}
	}

	_, listed := w.api.do("GET", "/api/endpoints", "")
	_, got := w.api.do("GET", "/api/endpoints/"+itoa(created.ID), "")
	var after endpointWithSecret
	rotated := w.call("POST", "/api/endpoints/"+itoa(created.ID)+"/rotate-secret", "", http.StatusOK, &after)
	status, page := panelPage(t, w.api.srv, fmt.Sprintf("/endpoints/%d", created.ID))
	if status != http.StatusOK {
		t.Fatalf("the endpoint page: %d", status)
	}
	// As a reader sees it: html/template writes + as &#43;.
	page = html.UnescapeString(page)
	if !strings.Contains(page, *after.PublicKey) || !strings.Contains(page, *created.PublicKey) {
		t.Error("the panel's endpoint page does not show the public key and, during the window, the previous one")
	}
	w.deliver("after the rotation")
	for _, seed := range w.seeds(created.ID) {
		for where, text := range map[string]string{"create": string(raw), "list": string(listed), "get": string(got),
			"rotate-secret": string(rotated), "the endpoint page": page, "the log": w.logs.String()} {
			mustNotShowKey(t, where, text, seed)
		}
	}
}

// A rotation of a v1a endpoint makes a new key pair: the answer shows the
// new public key and the old one, and until the window ends each request
// carries a v1a signature of each, the new first, each verifying with its
// own key.
func TestV1aRotationSignsWithBothKeys(t *testing.T) {
	t.Parallel()
	w := newV1aWorld(t)
	var created, rotated endpointWithSecret
	w.call("POST", "/api/endpoints", fmt.Sprintf(`{"url": %q, "signature": "v1a"}`, w.rc.srv.URL), http.StatusCreated, &created)
	raw := w.call("POST", "/api/endpoints/"+itoa(created.ID)+"/rotate-secret", "", http.StatusOK, &rotated)
	if rotated.Secret != "" || rotated.Signature != "v1a" || rotated.PreviousSignature == nil || *rotated.PreviousSignature != "v1a" {
		t.Fatalf("rotated: %s; want v1a, previous v1a, no secret", raw)
	}
	oldKey, newKey := publicKeyOf(t, created.PublicKey), publicKeyOf(t, rotated.PublicKey)
	if bytes.Equal(oldKey, newKey) || *rotated.PreviousPublicKey != *created.PublicKey {
		t.Fatalf("rotated public key %s, previous %v; want a new key, and the old one as previous", *rotated.PublicKey, rotated.PreviousPublicKey)
	}
	if got := w.api.endpoint(created.ID); got.PreviousPublicKey == nil || *got.PreviousPublicKey != *created.PublicKey {
		t.Errorf("GET shows previous_public_key %v during the window, want %s", got.PreviousPublicKey, *created.PublicKey)
	}

	req := w.deliver("rotating")
	versions, sigs := signaturesOf(t, req)
	if strings.Join(versions, " ") != "v1a v1a" {
		t.Fatalf("webhook-signature %q: want two v1a signatures", req.Header.Get(headerWebhookSignature))
	}
	for i, key := range []ed25519.PublicKey{newKey, oldKey} {
		if !ed25519.Verify(key, signedContent(req, req.Body), sigs[i]) {
			t.Errorf("signature %d does not verify with the %s key", i+1, []string{"new", "old"}[i])
		}
	}

	// The window closed: the new key alone signs, and the old one shows
	// no more.
	mustExec(t, w.db, `UPDATE outbox.endpoints SET previous_secret_expires_at = now() - interval '1 second' WHERE id = $1`, created.ID)
	if got := w.api.endpoint(created.ID); got.PreviousPublicKey != nil || got.PreviousSignature != nil {
		t.Errorf("after the window GET shows previous %v %v, want none", got.PreviousSignature, got.PreviousPublicKey)
	}
	req = w.deliver("rotated")
	if versions, sigs = signaturesOf(t, req); len(versions) != 1 || !ed25519.Verify(newKey, signedContent(req, req.Body), sigs[0]) {
		t.Errorf("after the window webhook-signature %q: want one v1a signature of the new key", req.Header.Get(headerWebhookSignature))
	}
}

// A PATCH between v1 and v1a is a rotation into the other scheme: during
// the window each request carries a signature of each scheme, and a
// switch to v1 shows its new secret once, a switch to v1a none.
func TestSwitchingSchemesSignsWithBothDuringTheWindow(t *testing.T) {
	t.Parallel()
	w := newV1aWorld(t)
	var created, toV1a, toV1 endpointWithSecret
	w.call("POST", "/api/endpoints", fmt.Sprintf(`{"url": %q}`, w.rc.srv.URL), http.StatusCreated, &created)
	if created.Signature != "v1" || created.PublicKey != nil || created.Secret == "" {
		t.Fatalf("created %+v: want v1 with a secret and no public key", created)
	}
	raw := w.call("PATCH", "/api/endpoints/"+itoa(created.ID), `{"signature": "v1a"}`, http.StatusOK, &toV1a)
	if toV1a.Signature != "v1a" || toV1a.Secret != "" || toV1a.PreviousSignature == nil || *toV1a.PreviousSignature != "v1" || toV1a.PreviousPublicKey != nil {
		t.Fatalf("switched to v1a: %s; want v1a, previous v1 without a public key, no secret", raw)
	}
	req := w.deliver("to v1a")
	versions, sigs := signaturesOf(t, req)
	if strings.Join(versions, " ") != "v1a v1" || !ed25519.Verify(publicKeyOf(t, toV1a.PublicKey), signedContent(req, req.Body), sigs[0]) {
		t.Errorf("webhook-signature %q: want v1a with the new key, then v1", req.Header.Get(headerWebhookSignature))
	}
	if err := verifyWebhook([][]byte{secretOf(t, created)}, req.Header, req.Body, time.Now()); err != nil {
		t.Errorf("the v1 secret no longer verifies during the window: %v", err)
	}

	// Writing the scheme it has already changes no key.
	var same endpointWithSecret
	w.call("PATCH", "/api/endpoints/"+itoa(created.ID), `{"signature": "v1a", "description": "x"}`, http.StatusOK, &same)
	if *same.PublicKey != *toV1a.PublicKey || same.Secret != "" {
		t.Errorf("a PATCH of the same scheme changed the key to %v", *same.PublicKey)
	}

	raw = w.call("PATCH", "/api/endpoints/"+itoa(created.ID), `{"signature": "v1"}`, http.StatusOK, &toV1)
	if toV1.Signature != "v1" || toV1.PublicKey != nil || !strings.HasPrefix(toV1.Secret, webhookSecretPrefix) ||
		toV1.PreviousPublicKey == nil || *toV1.PreviousPublicKey != *toV1a.PublicKey {
		t.Fatalf("switched back to v1: %s; want v1 with a new whsec_ secret, previous the v1a key", raw)
	}
	req = w.deliver("to v1")
	versions, sigs = signaturesOf(t, req)
	if strings.Join(versions, " ") != "v1 v1a" || !ed25519.Verify(publicKeyOf(t, toV1a.PublicKey), signedContent(req, req.Body), sigs[1]) {
		t.Errorf("webhook-signature %q: want v1, then v1a with the old key", req.Header.Get(headerWebhookSignature))
	}
	if err := verifyWebhook([][]byte{secretOf(t, toV1)}, req.Header, req.Body, time.Now()); err != nil {
		t.Errorf("the new v1 secret does not verify: %v", err)
	}
}

// A scheme outboxd does not sign with is refused, naming the field, on
// create and on change, and changes nothing.
func TestEndpointSignatureRefusesOtherSchemes(t *testing.T) {
	t.Parallel()
	w := newV1aWorld(t)
	for _, body := range []string{`"v2"`, `"V1A"`, `""`, `"v1a "`} {
		status, resp := w.api.do("POST", "/api/endpoints", fmt.Sprintf(`{"url": %q, "signature": %s}`, w.rc.srv.URL, body))
		if status != http.StatusBadRequest || !strings.Contains(string(resp), "signature") {
			t.Errorf("create with signature %s: %d %s, want 400 naming signature", body, status, resp)
		}
	}
	ep := w.api.createEndpoint(w.rc.srv.URL)
	status, resp := w.api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"signature": "v2"}`)
	var answer struct{ Error string }
	if err := json.Unmarshal(resp, &answer); err != nil || status != http.StatusBadRequest ||
		answer.Error != `signature must be "v1" (HMAC-SHA256) or "v1a" (ed25519), got "v2"` {
		t.Errorf("PATCH signature v2: %d %s, want 400 naming signature", status, resp)
	}
	if got := w.api.endpoint(ep.ID); got.Signature != "v1" || got.PreviousSecretExpiresAt != nil {
		t.Errorf("after the refused PATCH: %s, rotation window %v; want v1 as it was", got.Signature, got.PreviousSecretExpiresAt)
	}
}

// A v1a key whose stored public key is not its own (an HMAC secret a
// release without v1a rotated in beside public_key) signs nothing: the
// sender says why instead of sending what no receiver verifies.
func TestSigningKeysOfRefusesAKeyThatIsNotThePublicKeys(t *testing.T) {
	t.Parallel()
	seed := newEndpointSecret(webhookAsymmetricVersion)
	public := ed25519PublicKey(seed)
	if _, err := signingKeysOf([][]byte{seed}, [][]byte{public}); err != nil {
		t.Errorf("a seed with its own public key: %v", err)
	}
	for name, secret := range map[string][]byte{
		"another seed":        newEndpointSecret(webhookAsymmetricVersion),
		"a 40-byte v1 secret": bytes.Repeat([]byte{7}, 40),
	} {
		_, err := signingKeysOf([][]byte{secret}, [][]byte{public})
		if want := "signing key 1 of 1 is not the private key of public key " + encodePublicKey(public); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
}

// docs/webhooks.md's verifyOutboxdV1a, compiled as a receiver would,
// verifies requests outboxd delivered through its pipeline, with the
// endpoint's public key and, during a rotation, with either key; it
// refuses another endpoint's key, a changed body and a stale timestamp.
func TestDocsV1aSnippetVerifiesRealDeliveries(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/webhooks.md")
	if err != nil {
		t.Fatal(err)
	}
	snippet := fencedBlock(t, string(doc), "```go\n// verifyOutboxdV1a")
	w := newV1aWorld(t)
	var ep, other, rotated endpointWithSecret
	w.call("POST", "/api/endpoints", fmt.Sprintf(`{"url": %q, "signature": "v1a"}`, w.rc.srv.URL), http.StatusCreated, &ep)
	w.call("POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/other", "signature": "v1a", "topics": ["none"]}`, http.StatusCreated, &other)
	signed := w.deliver("signed")
	w.call("POST", "/api/endpoints/"+itoa(ep.ID)+"/rotate-secret", "", http.StatusOK, &rotated)
	rotating := w.deliver("rotating")

	in := func(key *string, req received, body string, now time.Time) snippetCase {
		h := map[string]string{}
		for _, name := range []string{headerWebhookID, headerWebhookTimestamp, headerWebhookSignature} {
			h[name] = req.Header.Get(name)
		}
		if body == "" {
			body = string(req.Body)
		}
		return snippetCase{*key, h, body, now.Unix()}
	}
	now := time.Now()
	cases := []struct {
		name string
		in   snippetCase
		want string
	}{
		{"a delivery, with the endpoint's public key", in(ep.PublicKey, signed, "", now), "verified"},
		{"a rotation: the receiver has the new key", in(rotated.PublicKey, rotating, "", now), "verified"},
		{"a rotation: the receiver has the old key", in(ep.PublicKey, rotating, "", now), "verified"},
		{"the new key, before the rotation", in(rotated.PublicKey, signed, "", now), "refused:"},
		{"another endpoint's key", in(other.PublicKey, signed, "", now), "refused:"},
		{"the body changed", in(ep.PublicKey, signed, strings.Replace(string(signed.Body), `"signed"`, `"forged"`, 1), now), "refused:"},
		{"received six minutes later", in(ep.PublicKey, signed, "", now.Add(6*time.Minute)), "refused:"},
	}
	inputs := make([]snippetCase, 0, len(cases))
	for _, c := range cases {
		inputs = append(inputs, c.in)
	}
	got := runSnippet(t, snippetMain([]string{`"crypto/ed25519"`}, "ed25519.Verify", "verifyOutboxdV1a"), snippet, inputs)
	for i, c := range cases {
		if !strings.HasPrefix(got[i], c.want) {
			t.Errorf("%s: docs/webhooks.md's verifyOutboxdV1a said %q, want %q", c.name, got[i], c.want)
		}
	}
}

// In a browser, the endpoint page shows a v1a endpoint's public key to
// the admin on the panel and to its owner in the portal, and neither
// page shows the private key.
func TestPublicKeyOnPanelAndPortalInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := serveAdmin(t, testAdmin(t, db, testPolicy, testLogger(t), nil))
	o := newOwner(t, srv, "Payments team")
	var ep endpointWithSecret
	decodeAs(t, srv, testToken, "POST", "/api/endpoints",
		fmt.Sprintf(`{"url": "http://127.0.0.1:9/hook", "description": "Payments hook", "owner_id": %d, "signature": "v1a"}`, o.ID), 201, &ep)
	secret, _ := storedSecrets(t, db, endpointSecretsQuery, ep.ID)

	br := startBrowser(t)
	for _, signIn := range []struct{ who, token string }{{"the admin", testToken}, {"the owner", o.Token}} {
		br.open(srv.URL + "/login")
		br.typeInto("input[name=token]", signIn.token)
		br.click("form.login button")
		br.find("form.logout")
		br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, ep.ID))
		if got := br.text("#public-key"); got != *ep.PublicKey {
			t.Errorf("%s's endpoint page shows the public key %q, want %q", signIn.who, got, *ep.PublicKey)
		}
		if got := br.text("#signature"); !strings.HasPrefix(got, "v1a (ed25519)") {
			t.Errorf("%s's endpoint page reads the scheme as %q", signIn.who, got)
		}
		var source string
		br.execute(`return document.documentElement.outerHTML`, &source)
		mustNotShowKey(t, signIn.who+"'s endpoint page", html.UnescapeString(source), secret)
		br.click("form.logout button")
		br.find("form.login")
	}
}

// While a replica of a release before 0.8.0 runs, which would sign a v1a
// endpoint's requests with HMAC, no endpoint is put on v1a: created or
// switched, it is refused with a 409 naming signature; a replica of this
// release, or one no longer live, refuses nothing.
func TestV1aRefusedWhileAnOlderReleaseRuns(t *testing.T) {
	t.Parallel()
	w := newV1aWorld(t)
	ep := w.api.createEndpoint(w.rc.srv.URL)
	addReplica := func(version string, lastSeen string) {
		mustExec(t, w.db, `INSERT INTO outbox.replicas (host, pid, version, workers, listens, dead_after, last_seen)
			VALUES ('h', 1, $1, 4, true, make_interval(secs => 15), now() - $2::interval)`, version, lastSeen)
	}
	addReplica("0.8.0", "0s")
	addReplica("0.7.0", "1 minute") // no longer live
	for _, call := range [][2]string{{"POST", "/api/endpoints"}, {"PATCH", "/api/endpoints/" + itoa(ep.ID)}} {
		body := fmt.Sprintf(`{"url": %q, "signature": "v1a"}`, w.rc.srv.URL)
		if status, resp := w.api.do(call[0], call[1], body); status/100 != 2 {
			t.Errorf("%s %s with v1a beside replicas of this release: %d %s", call[0], call[1], status, resp)
		}
	}

	other := w.api.createEndpoint(w.rc.srv.URL)
	addReplica("0.7.0", "0s")
	for _, call := range [][2]string{{"POST", "/api/endpoints"}, {"PATCH", "/api/endpoints/" + itoa(other.ID)}} {
		body := fmt.Sprintf(`{"url": %q, "signature": "v1a"}`, w.rc.srv.URL)
		status, resp := w.api.do(call[0], call[1], body)
		if status != http.StatusConflict || !strings.Contains(string(resp), "signature: 1 replica(s) of a release before 0.8.0") {
			t.Errorf("%s %s with v1a beside a 0.7.0 replica: %d %s, want 409 naming signature", call[0], call[1], status, resp)
		}
	}
	if got := w.api.endpoint(other.ID); got.Signature != "v1" {
		t.Errorf("after the refused switch the endpoint signs %s, want v1 as it was", got.Signature)
	}
	if status, resp := w.api.do("PATCH", "/api/endpoints/"+itoa(other.ID), `{"signature": "v1"}`); status != http.StatusOK {
		t.Errorf("PATCH to the scheme it has, beside a 0.7.0 replica: %d %s", status, resp)
	}
}
