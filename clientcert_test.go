// Tests for endpoints' TLS material: mutual TLS against real TLS servers
// on loopback, a private CA trusted per endpoint, the key sealed and never
// answered, rotation, and the expiry alert.

package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testCA is a private certificate authority for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

var testSerial = struct {
	sync.Mutex
	n int64
}{n: 1}

func nextSerial() *big.Int {
	testSerial.Lock()
	defer testSerial.Unlock()
	testSerial.n++
	return big.NewInt(testSerial.n)
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// issued is a certificate the CA issued, with its key, in PEM and as a
// tls.Certificate.
type issued struct {
	certPEM, keyPEM string
	pair            tls.Certificate
}

// issue signs a certificate for cn valid from notBefore to notAfter, for
// usage (client or server; a server one names 127.0.0.1).
func (ca *testCA) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, notBefore, notAfter time.Time) issued {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	out := issued{
		certPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		keyPEM:  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
	}
	if out.pair, err = tls.X509KeyPair([]byte(out.certPEM), []byte(out.keyPEM)); err != nil {
		t.Fatal(err)
	}
	return out
}

func (ca *testCA) client(t *testing.T, cn string) issued {
	t.Helper()
	return ca.issue(t, cn, x509.ExtKeyUsageClientAuth, time.Now().Add(-time.Hour), time.Now().Add(20*24*time.Hour))
}

// mtlsReceiver is an HTTPS receiver on loopback whose certificate the
// private serverCA issued, and which, if clientCA is not nil, requires a
// client certificate clientCA issued. It records the subject of each
// client certificate it was shown.
func mtlsReceiver(t *testing.T, serverCA, clientCA *testCA) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var subjects []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		subject := "(none)"
		if len(r.TLS.PeerCertificates) > 0 {
			subject = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		mu.Lock()
		subjects = append(subjects, subject)
		mu.Unlock()
	}))
	cert := serverCA.issue(t, "receiver", x509.ExtKeyUsageServerAuth, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.pair}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	if clientCA != nil {
		srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		srv.TLS.ClientCAs = clientCA.pool()
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string{}, subjects...)
	}
}

// endpointBody is a POST /api/endpoints body for url on topic t, with the
// given TLS fields.
func endpointBody(url string, tlsFields map[string]any) string {
	body := map[string]any{"url": url, "topics": []string{"t"}}
	for k, v := range tlsFields {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	return string(b)
}

func (a *testAPI) createTLSEndpoint(url string, tlsFields map[string]any) Endpoint {
	a.t.Helper()
	status, body := a.do("POST", "/api/endpoints", endpointBody(url, tlsFields))
	if status != http.StatusCreated {
		a.t.Fatalf("create endpoint with %v: %d %s", keysOf(tlsFields), status, body)
	}
	var e Endpoint
	if err := json.Unmarshal(body, &e); err != nil {
		a.t.Fatal(err)
	}
	return e
}

func keysOf(m map[string]any) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// tlsWorkers runs one pass of workers whose sender builds endpoints'
// clients as outboxd's does, reading the material at every delivery.
func tlsWorkers(t *testing.T, db *sql.DB, box *secretBox) func() {
	t.Helper()
	opts := safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second}
	client := newSafeHTTPClient(opts)
	sender := newWebhookSender(db, box, client, nil, nil, testLogger(t))
	sender.endpointTLS = newEndpointClients(db, box, opts, client)
	sender.endpointTLS.recheck = 0
	wp := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: sender.deliver}, testLogger(t))
	return func() {
		t.Helper()
		if _, err := wp.workOnce(context.Background(), 10); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEndpointMutualTLS: a receiver that requires a client certificate
// from its own CA, and presents one from another private CA, is reached
// by the endpoint that carries both; without the client certificate, or
// without the CA, the delivery fails at the handshake and is retried.
func TestEndpointMutualTLS(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	serverCA, clientCA := newTestCA(t, "receivers' CA"), newTestCA(t, "senders' CA")
	receiver, subjects := mtlsReceiver(t, serverCA, clientCA)
	client := clientCA.client(t, "outboxd")
	api := newTestAPI(t, db, testPolicy)
	full := api.createTLSEndpoint(receiver.URL+"/full", map[string]any{
		"client_certificate": client.certPEM, "client_key": client.keyPEM, "ca_certificate": serverCA.pem})
	noCert := api.createTLSEndpoint(receiver.URL+"/no-cert", map[string]any{"ca_certificate": serverCA.pem})
	noCA := api.createTLSEndpoint(receiver.URL+"/no-ca", map[string]any{
		"client_certificate": client.certPEM, "client_key": client.keyPEM})

	event := record(t, db, "t", "s")
	relayAll(t, db)
	tlsWorkers(t, db, nil)()

	if diff := cmp.Diff([]string{"outboxd"}, subjects()); diff != "" {
		t.Errorf("client certificates the receiver saw (-want +got):\n%s", diff)
	}
	if s := readJob(t, db, webhookJob(t, db, event, full.ID)).State; s != "completed" {
		t.Errorf("delivery with certificate and CA: %s, want completed", s)
	}
	for _, tc := range []struct {
		ep   Endpoint
		want string
	}{
		{noCert, "certificate required"},
		{noCA, "certificate signed by unknown authority"},
	} {
		job := webhookJob(t, db, event, tc.ep.ID)
		jobErr, _, _ := firstAttemptOf(t, db, job)
		if !strings.Contains(jobErr, tc.want) {
			t.Errorf("delivery to %s: error %q, want it to say %q", tc.ep.URL, jobErr, tc.want)
		}
		if s := readJob(t, db, job).State; s != "retryable" {
			t.Errorf("delivery to %s: %s, want retryable", tc.ep.URL, s)
		}
	}
}

// TestEndpointClientCertificateRotates: a PATCH with a new pair is the
// certificate the next delivery presents, and one with both null removes
// it.
func TestEndpointClientCertificateRotates(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	box := testBox(t, testSecretsKey(3), "")
	serverCA, clientCA := newTestCA(t, "receivers' CA"), newTestCA(t, "senders' CA")
	receiver, subjects := mtlsReceiver(t, serverCA, clientCA)
	api := newSealingTestAPI(t, db, box)
	first, second := clientCA.client(t, "first"), clientCA.client(t, "second")
	ep := api.createTLSEndpoint(receiver.URL, map[string]any{
		"client_certificate": first.certPEM, "client_key": first.keyPEM, "ca_certificate": serverCA.pem})
	work := tlsWorkers(t, db, box)

	record(t, db, "t", "before")
	relayAll(t, db)
	work()
	patch := func(fields map[string]any) Endpoint {
		t.Helper()
		b, _ := json.Marshal(fields)
		status, body := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), string(b))
		var e Endpoint
		if err := json.Unmarshal(body, &e); status != http.StatusOK || err != nil {
			t.Fatalf("PATCH: %d %s", status, body)
		}
		return e
	}
	if got := patch(map[string]any{"client_certificate": second.certPEM, "client_key": second.keyPEM}); got.ClientCertificate == nil || got.ClientCertificate.Subject != "CN=second" {
		t.Errorf("PATCH answered client_certificate %+v, want CN=second", got.ClientCertificate)
	}
	record(t, db, "t", "after")
	relayAll(t, db)
	work()
	if diff := cmp.Diff([]string{"first", "second"}, subjects()); diff != "" {
		t.Errorf("client certificates the receiver saw (-want +got):\n%s", diff)
	}

	removed := patch(map[string]any{"client_certificate": nil, "client_key": nil})
	if removed.ClientCertificate != nil || removed.ClientKeySet || removed.CACertificate == nil {
		t.Errorf("after removing the pair: certificate %+v, key set %t, CA %+v; want none, false, the CA kept",
			removed.ClientCertificate, removed.ClientKeySet, removed.CACertificate)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE client_key IS NULL AND client_certificate_expires_at IS NULL`); n != 1 {
		t.Errorf("%d endpoints without key and expiry, want 1", n)
	}
}

// TestEndpointClientKeyIsNeverAnsweredAndSealedAtRest: the key appears in
// no answer (create, get, list, PATCH) nor on the endpoint's page, and
// with -secrets-key it is stored sealed, opening only as its endpoint's.
func TestEndpointClientKeyIsNeverAnsweredAndSealedAtRest(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	box := testBox(t, testSecretsKey(2), "")
	srv := newSealingTestServer(t, db, testPolicy, box)
	api := &testAPI{t: t, srv: srv}
	client := newTestCA(t, "senders' CA").client(t, "outboxd")
	keyBody := strings.Split(client.keyPEM, "\n")[1] // a line of the key's base64

	status, created := api.do("POST", "/api/endpoints", endpointBody("https://hooks.example.com/a", map[string]any{
		"client_certificate": client.certPEM, "client_key": client.keyPEM}))
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, created)
	}
	var ep Endpoint
	json.Unmarshal(created, &ep)
	_, got := api.do("GET", "/api/endpoints/"+itoa(ep.ID), "")
	_, list := api.do("GET", "/api/endpoints", "")
	_, patched := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"description": "mTLS"}`)
	_, page := panelPage(t, srv, "/endpoints/"+itoa(ep.ID))
	for name, answer := range map[string]string{"create": string(created), "get": string(got), "list": string(list), "patch": string(patched), "page": page} {
		if strings.Contains(answer, "PRIVATE KEY") || strings.Contains(answer, keyBody) {
			t.Errorf("the %s answer shows the client key", name)
		}
	}
	var answered Endpoint
	json.Unmarshal(got, &answered)
	want := &certificateInfo{Subject: "CN=outboxd", Issuer: "CN=senders' CA", NotAfter: client.pair.Leaf.NotAfter.UTC().Truncate(time.Second)}
	if c := answered.ClientCertificate; c == nil || c.Subject != want.Subject || c.Issuer != want.Issuer || !c.NotAfter.Equal(want.NotAfter) || len(c.SHA256) != 64 {
		t.Errorf("client_certificate answered %+v, want %+v with a fingerprint", c, want)
	}
	if !answered.ClientKeySet {
		t.Error("client_key_set false, want true")
	}
	if !strings.Contains(page, want.NotAfter.Format("2006-01-02")) || !strings.Contains(page, "CN=outboxd") {
		t.Error("the endpoint's page shows neither the client certificate's subject nor its expiry")
	}

	var stored []byte
	if err := db.QueryRow(`SELECT client_key FROM outbox.endpoints WHERE id = $1`, ep.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stored, []byte("PRIVATE KEY")) || bytes.Contains(stored, []byte(keyBody)) || stored[0] != sealedBlobVersion {
		t.Fatalf("stored client key is not sealed: %q", stored[:min(len(stored), 40)])
	}
	if opened, err := box.openBlob(endpointKeyRow(ep.ID), stored); err != nil || string(opened) != client.keyPEM {
		t.Errorf("opening the stored key: %v; want the key given", err)
	}
	if _, err := box.openBlob(endpointKeyRow(ep.ID+1), stored); err == nil {
		t.Error("the sealed key opened as another endpoint's")
	}
	if _, err := (*secretBox)(nil).openBlob(endpointKeyRow(ep.ID), stored); err == nil || !strings.Contains(err.Error(), "-secrets-key (OUTBOXD_SECRETS_KEY) is not set") {
		t.Errorf("opening without a key: %v, want the setting named", err)
	}
}

// TestEndpointTLSMaterialIsValidated: each kind of bad material answers
// 400 naming its field and the problem.
func TestEndpointTLSMaterialIsValidated(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ca := newTestCA(t, "senders' CA")
	good, other := ca.client(t, "good"), ca.client(t, "other")
	expired := ca.issue(t, "expired", x509.ExtKeyUsageClientAuth, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	serverOnly := ca.issue(t, "server", x509.ExtKeyUsageServerAuth, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	for _, tc := range []struct {
		name   string
		fields map[string]any
		want   string
	}{
		{"certificate not PEM", map[string]any{"client_certificate": "hello", "client_key": good.keyPEM}, "client_certificate is not PEM"},
		{"certificate corrupt", map[string]any{"client_certificate": strings.Replace(good.certPEM, "M", "A", 5), "client_key": good.keyPEM}, "client_certificate: certificate 1:"},
		{"key not PEM", map[string]any{"client_certificate": good.certPEM, "client_key": "hello"}, "client_key is not PEM"},
		{"key of another certificate", map[string]any{"client_certificate": good.certPEM, "client_key": other.keyPEM}, "client_key does not match client_certificate"},
		{"expired", map[string]any{"client_certificate": expired.certPEM, "client_key": expired.keyPEM}, "client_certificate expired at"},
		{"server certificate", map[string]any{"client_certificate": serverOnly.certPEM, "client_key": serverOnly.keyPEM}, "does not include TLS client authentication"},
		{"certificate alone", map[string]any{"client_certificate": good.certPEM}, "client_certificate and client_key go together"},
		{"key alone", map[string]any{"client_key": good.keyPEM}, "client_certificate and client_key go together"},
		{"key in the certificate field", map[string]any{"client_certificate": good.keyPEM, "client_key": good.keyPEM}, `client_certificate holds a PEM block of type \"PRIVATE KEY\"`},
		{"CA not PEM", map[string]any{"ca_certificate": "hello"}, "ca_certificate is not PEM"},
		{"CA too long", map[string]any{"ca_certificate": strings.Repeat(ca.pem, 80)}, "ca_certificate is"},
	} {
		status, body := api.do("POST", "/api/endpoints", endpointBody("https://hooks.example.com/a", tc.fields))
		if status != http.StatusBadRequest || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: %d %s, want 400 saying %q", tc.name, status, body, tc.want)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints stored, want none", n)
	}
}

// TestClientCertificateExpiryAlert: client_certificate_expiring fires
// -alert-client-cert-expiry (14 days by default) before an endpoint's
// client certificate expires, once for each such endpoint, and for one
// that has expired; not for one further out, nor a disabled endpoint's.
func TestClientCertificateExpiryAlert(t *testing.T) {
	t.Parallel()
	if got := defaultConfig().Alerts.ClientCertExpiry; got != 14*24*time.Hour {
		t.Errorf("-alert-client-cert-expiry defaults to %s, want 336h (14 days)", got)
	}
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ca := newTestCA(t, "senders' CA")
	withCert := func(name string, validFor time.Duration) Endpoint {
		t.Helper()
		c := ca.issue(t, name, x509.ExtKeyUsageClientAuth, time.Now().Add(-time.Hour), time.Now().Add(validFor))
		return api.createTLSEndpoint("https://"+name+".example.com/hook", map[string]any{"client_certificate": c.certPEM, "client_key": c.keyPEM})
	}
	soon := withCert("soon", 13*24*time.Hour)
	withCert("later", 15*24*time.Hour)
	expired := withCert("expired", 30*24*time.Hour)
	// A certificate cannot be registered expired; one registered earlier
	// runs out while it is set.
	mustExec(t, db, `UPDATE outbox.endpoints SET client_certificate_expires_at = now() - interval '1 day' WHERE id = $1`, expired.ID)
	disabled := withCert("disabled", 24*time.Hour)
	if status, body := api.do("POST", "/api/endpoints/"+itoa(disabled.ID)+"/disable", ""); status != http.StatusOK {
		t.Fatalf("disable: %d %s", status, body)
	}

	o, err := readOverview(context.Background(), db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range o.Alerts {
		if a.Name == "client_certificate_expiring" {
			got = append(got, a.Link)
			if a.Level != 2 {
				t.Errorf("alert %q at level %d, want 2 (the endpoints it fires for)", a.Message, a.Level)
			}
		}
	}
	want := []string{"/endpoints/" + itoa(expired.ID), "/endpoints/" + itoa(soon.ID)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("client_certificate_expiring alerts (-want +got):\n%s", diff)
	}

	// A shorter setting leaves only the expired one.
	cfg := defaultConfig().Alerts
	cfg.ClientCertExpiry = 12 * 24 * time.Hour
	if alerts := clientCertificateAlerts(cfg, o, alertStarts{Now: time.Now()}); len(alerts) != 1 || !strings.Contains(alerts[0].Message, "expired at") {
		t.Errorf("with 12 days: %+v, want the expired certificate's alert alone", alerts)
	}
}

// TestSecretsCommandsSealClientKeys: `secrets encrypt` seals client keys
// stored before -secrets-key was set, `secrets rotate-key` moves them to
// the new key, and a second run rewrites none; each still opens as the
// key given.
func TestSecretsCommandsSealClientKeys(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy) // no key: stored as given
	client := newTestCA(t, "senders' CA").client(t, "outboxd")
	ep := api.createTLSEndpoint("https://hooks.example.com/a", map[string]any{"client_certificate": client.certPEM, "client_key": client.keyPEM})
	stored := func() []byte {
		t.Helper()
		var key []byte
		if err := db.QueryRow(`SELECT client_key FROM outbox.endpoints WHERE id = $1`, ep.ID).Scan(&key); err != nil {
			t.Fatal(err)
		}
		return key
	}
	if string(stored()) != client.keyPEM {
		t.Fatal("without -secrets-key, the key is not stored as given")
	}
	ctx := context.Background()
	box1, box2 := testBox(t, testSecretsKey(1), ""), testBox(t, testSecretsKey(2), testSecretsKey(1))
	for _, step := range []struct {
		name string
		box  *secretBox
		want int
	}{
		{"encrypt", box1, 1}, {"encrypt again", box1, 0}, {"rotate-key", box2, 1}, {"rotate-key again", box2, 0},
	} {
		sealed, err := sealStoredSecrets(ctx, db, step.box, testLogger(t))
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := sealed[clientKeysColumn]; got != step.want {
			t.Errorf("%s rewrote %d client keys, want %d", step.name, got, step.want)
		}
		key := stored()
		if !isSealedBlob(key) || sealedKeyID(key) != step.box.current.id {
			t.Errorf("after %s the key is not sealed under the current key", step.name)
		}
		if opened, err := step.box.openBlob(endpointKeyRow(ep.ID), key); err != nil || string(opened) != client.keyPEM {
			t.Errorf("after %s the key does not open as the one given: %v", step.name, err)
		}
	}
	if _, err := testBox(t, testSecretsKey(2), "").openBlob(endpointKeyRow(ep.ID), stored()); err != nil {
		t.Errorf("after rotate-key the old key is still needed: %v", err)
	}
}

// TestRecoveryProbePresentsTheClientCertificate: a probe to a disabled
// mTLS endpoint goes through the endpoint's own client, so a receiver
// that requires the certificate answers it, and the endpoint recovers.
func TestRecoveryProbePresentsTheClientCertificate(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	serverCA, clientCA := newTestCA(t, "receivers' CA"), newTestCA(t, "senders' CA")
	receiver, subjects := mtlsReceiver(t, serverCA, clientCA)
	client := clientCA.client(t, "outboxd")
	api := newTestAPI(t, db, testPolicy)
	ep := api.createTLSEndpoint(receiver.URL+"/hook", map[string]any{
		"client_certificate": client.certPEM, "client_key": client.keyPEM, "ca_certificate": serverCA.pem})
	p := newTestProber(t, db, nil)
	opts := safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second}
	p.endpointTLS = newEndpointClients(db, nil, opts, newSafeHTTPClient(opts))

	disableForFailure(t, db, 61*time.Minute, ep.ID)
	round := probeRoundOf(t, p)
	if round.Probed != 1 || len(round.Recovered) != 1 {
		t.Errorf("probed %d, recovered %v; want the one endpoint probed and recovered", round.Probed, round.Recovered)
	}
	if diff := cmp.Diff([]string{"outboxd"}, subjects()); diff != "" {
		t.Errorf("client certificates the receiver saw (-want +got):\n%s", diff)
	}
}

// TestEndpointTLSMaterialNeedsHTTPS: TLS material on an endpoint TLS does
// not reach is refused, whether the material or the URL comes second.
func TestEndpointTLSMaterialNeedsHTTPS(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ca := newTestCA(t, "receivers' CA")
	for _, url := range []string{"http://hooks.example.com/a", "mailto:ops@example.com"} {
		status, body := api.do("POST", "/api/endpoints", endpointBody(url, map[string]any{"ca_certificate": ca.pem}))
		if status != http.StatusBadRequest || !strings.Contains(string(body), "https:// url only") {
			t.Errorf("CA on %s: %d %s, want 400 saying https only", url, status, body)
		}
	}
	ep := api.createTLSEndpoint("https://hooks.example.com/a", map[string]any{"ca_certificate": ca.pem})
	status, body := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"url": "http://hooks.example.com/a"}`)
	if status != http.StatusBadRequest || !strings.Contains(string(body), "for an https:// url only") {
		t.Errorf("PATCH to http with a CA set: %d %s, want 400 saying https only", status, body)
	}
	status, body = api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"url": "http://hooks.example.com/a", "ca_certificate": null}`)
	if status != http.StatusOK {
		t.Errorf("PATCH to http removing the CA: %d %s, want 200", status, body)
	}
}

// TestEndpointClientsFollowTheStoredMaterial: the workers' client for an
// endpoint is built once and kept while its material is unchanged, built
// again once a PATCH changes it (read at most every endpointTLSRecheck,
// 10 s), the shared one for an endpoint without material or deleted; a
// key sealed under a key this process lacks sends nothing, naming the
// setting.
func TestEndpointClientsFollowTheStoredMaterial(t *testing.T) {
	t.Parallel()
	if endpointTLSRecheck != 10*time.Second {
		t.Errorf("endpointTLSRecheck is %s, want the 10s docs/endpoints.md names", endpointTLSRecheck)
	}
	db, _ := newTestDB(t)
	box := testBox(t, testSecretsKey(4), "")
	api := newSealingTestAPI(t, db, box)
	ca := newTestCA(t, "senders' CA")
	first, second := ca.client(t, "first"), ca.client(t, "second")
	ep := api.createTLSEndpoint("https://hooks.example.com/a", map[string]any{"client_certificate": first.certPEM, "client_key": first.keyPEM})
	plain := api.createEndpoint("https://hooks.example.com/plain")
	opts := safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second}
	shared := newSafeHTTPClient(opts)
	clients := newEndpointClients(db, box, opts, shared)
	ctx := context.Background()
	clientOf := func(id int64) *http.Client {
		t.Helper()
		c, err := clients.client(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	presented := func(c *http.Client) string {
		certs := c.Transport.(*http.Transport).TLSClientConfig.Certificates
		if len(certs) == 0 {
			return "(none)"
		}
		return certs[0].Leaf.Subject.CommonName
	}

	a := clientOf(ep.ID)
	if a == shared || presented(a) != "first" {
		t.Fatalf("endpoint with a certificate: shared %t, presents %s; want its own client presenting first", a == shared, presented(a))
	}
	if clientOf(plain.ID) != shared {
		t.Error("an endpoint without material does not get the shared client")
	}
	b, _ := json.Marshal(map[string]any{"client_certificate": second.certPEM, "client_key": second.keyPEM})
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), string(b)); status != http.StatusOK {
		t.Fatalf("PATCH: %d %s", status, body)
	}
	if clientOf(ep.ID) != a {
		t.Error("the material was read again within endpointTLSRecheck")
	}
	clients.recheck = 0
	rebuilt := clientOf(ep.ID)
	if rebuilt == a || presented(rebuilt) != "second" {
		t.Errorf("after the PATCH: presents %s, want a new client presenting second", presented(rebuilt))
	}
	if clientOf(ep.ID) != rebuilt {
		t.Error("unchanged material built a new client")
	}

	if _, err := newEndpointClients(db, nil, opts, shared).client(ctx, ep.ID); err == nil || !strings.Contains(err.Error(), "-secrets-key (OUTBOXD_SECRETS_KEY) is not set") {
		t.Errorf("without the sealing key: %v, want an error naming the setting", err)
	}
	if status, _ := api.do("DELETE", "/api/endpoints/"+itoa(ep.ID), ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d", status)
	}
	if clientOf(ep.ID) != shared {
		t.Error("a deleted endpoint does not fall back to the shared client")
	}
}

// TestEndpointClientsKeepTheLastClientWhenTheReadFails: a failed read of
// the material keeps the client built from the last one; with none built
// yet, it sends nothing and says why.
func TestEndpointClientsKeepTheLastClientWhenTheReadFails(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	client := newTestCA(t, "senders' CA").client(t, "outboxd")
	ep := api.createTLSEndpoint("https://hooks.example.com/a", map[string]any{"client_certificate": client.certPEM, "client_key": client.keyPEM})
	other := api.createTLSEndpoint("https://hooks.example.com/b", map[string]any{"client_certificate": client.certPEM, "client_key": client.keyPEM})
	failing, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	opts := safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second}
	shared := newSafeHTTPClient(opts)
	clients := newEndpointClients(failing, nil, opts, shared)
	clients.recheck = 0
	ctx := context.Background()
	built, err := clients.client(ctx, ep.ID)
	if err != nil || built == shared {
		t.Fatalf("first read: %v (shared %t), want the endpoint's own client", err, built == shared)
	}
	failing.Close() // every later read fails
	if got, err := clients.client(ctx, ep.ID); err != nil || got != built {
		t.Errorf("a failed read: %v (same client %t), want the client built before", err, got == built)
	}
	if _, err := clients.client(ctx, other.ID); err == nil || !strings.Contains(err.Error(), "read tls material of endpoint") {
		t.Errorf("a failed first read: %v, want the read named", err)
	}
}
