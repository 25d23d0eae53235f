// clientcert.go: an endpoint's TLS material (docs/endpoints.md, "Mutual
// TLS"): the client certificate and key it presents to a receiver that
// asks for one, and the private CA it trusts instead of the system's
// roots. The API checks them here; the workers build one client per
// endpoint that has any, and keep it until the material changes.

package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// maxPEMLen bounds each PEM field: a chain of a few certificates, or an
// RSA key of 8192 bits (about 6.5 kB), fits several times over; more is a
// mistake, or an attack on storage. schema.sql's CHECKs repeat it.
const maxPEMLen = 32 << 10

// certificateInfo is a certificate as answers show it: enough to tell
// which one is set and when it runs out, never the key.
type certificateInfo struct {
	Subject  string    `json:"subject"`
	Issuer   string    `json:"issuer"`
	NotAfter time.Time `json:"not_after"`
	// SHA256 is the fingerprint of the certificate's DER, in hex, as
	// `openssl x509 -fingerprint -sha256` shows it without the colons.
	SHA256 string `json:"sha256"`
}

// describeCertificate is the first certificate of text, or nil if text is
// nil (none set) or holds none.
func describeCertificate(text *string) *certificateInfo {
	if text == nil {
		return nil
	}
	certs, err := parsePEMCertificates("certificate", *text)
	if err != nil {
		return nil
	}
	sum := sha256.Sum256(certs[0].Raw)
	return &certificateInfo{
		Subject:  certs[0].Subject.String(),
		Issuer:   certs[0].Issuer.String(),
		NotAfter: certs[0].NotAfter.UTC(),
		SHA256:   hex.EncodeToString(sum[:]),
	}
}

// parsePEMCertificates reads text as one or more PEM CERTIFICATE blocks
// and nothing else; field names it in errors.
func parsePEMCertificates(field, text string) ([]*x509.Certificate, error) {
	if len(text) > maxPEMLen {
		return nil, fmt.Errorf("%s is %d bytes, at most %d", field, len(text), maxPEMLen)
	}
	var certs []*x509.Certificate
	rest := []byte(text)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s holds a PEM block of type %q; want CERTIFICATE blocks only", field, block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: certificate %d: %w", field, len(certs)+1, err)
		}
		certs = append(certs, cert)
	}
	switch {
	case len(certs) == 0:
		return nil, fmt.Errorf("%s is not PEM: want -----BEGIN CERTIFICATE-----", field)
	case len(bytes.TrimSpace(rest)) > 0:
		return nil, fmt.Errorf("%s has text after its last PEM block", field)
	}
	return certs, nil
}

// parseClientPair reads a client certificate (its chain, leaf first) and
// its private key, and checks that they belong together. It does not
// judge dates: checkClientCertificateUsable does, at the API.
func parseClientPair(certPEM, keyPEM string) (tls.Certificate, error) {
	certs, err := parsePEMCertificates("client_certificate", certPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := parsePrivateKey(keyPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	pub, ok := certs[0].PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(key.Public()) {
		return tls.Certificate{}, errors.New("client_key does not match client_certificate (the first certificate's public key)")
	}
	pair := tls.Certificate{PrivateKey: key, Leaf: certs[0]}
	for _, c := range certs {
		pair.Certificate = append(pair.Certificate, c.Raw)
	}
	return pair, nil
}

// parsePrivateKey reads one unencrypted PEM private key: PKCS8, PKCS1
// (RSA) or SEC 1 (EC), the forms openssl writes.
func parsePrivateKey(text string) (crypto.Signer, error) {
	if len(text) > maxPEMLen {
		return nil, fmt.Errorf("client_key is %d bytes, at most %d", len(text), maxPEMLen)
	}
	block, rest := pem.Decode([]byte(text))
	switch {
	case block == nil:
		return nil, errors.New("client_key is not PEM: want -----BEGIN PRIVATE KEY-----")
	case len(bytes.TrimSpace(rest)) > 0:
		return nil, errors.New("client_key holds more than one PEM block")
	case block.Headers["Proc-Type"] != "" || block.Type == "ENCRYPTED PRIVATE KEY":
		return nil, errors.New("client_key is encrypted; give it unencrypted (openssl pkcs8 -topk8 -nocrypt): it is sealed at rest with -secrets-key")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("client_key is a PEM block of type %q; want PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("client_key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("client_key: a %T cannot sign a TLS handshake", key)
	}
	return signer, nil
}

// checkClientCertificateUsable refuses a client certificate that no
// receiver would accept at now: expired, not valid yet, or issued for
// other uses than a TLS client's.
func checkClientCertificateUsable(leaf *x509.Certificate, now time.Time) error {
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Errorf("client_certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("client_certificate is not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if len(leaf.ExtKeyUsage) == 0 {
		return nil
	}
	for _, u := range leaf.ExtKeyUsage {
		if u == x509.ExtKeyUsageClientAuth || u == x509.ExtKeyUsageAny {
			return nil
		}
	}
	return errors.New("client_certificate's extended key usage does not include TLS client authentication (clientAuth)")
}

// parseCAPool reads ca_certificate: the authorities, and only those, that
// an endpoint's receiver certificate may chain to.
func parseCAPool(text string) (*x509.CertPool, error) {
	certs, err := parsePEMCertificates("ca_certificate", text)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// endpointTLSRecheck is how long a worker uses the TLS material it read
// for an endpoint before reading it again: a PATCH reaches deliveries
// within it, on every replica. Reading it for every delivery would add a
// query to each; this is one query per busy endpoint per 10 s.
const endpointTLSRecheck = 10 * time.Second

// endpointClients are the workers' clients for endpoints with TLS
// material, one each, built from the shared client's options. An endpoint
// without any gets the shared client.
type endpointClients struct {
	db      *sql.DB
	box     *secretBox
	base    safeHTTPOptions
	shared  *http.Client
	recheck time.Duration

	mu      sync.Mutex // protects entries
	entries map[int64]*endpointClient
}

// endpointClient is an endpoint's material as last read, and the client
// built from it (nil: the shared one).
type endpointClient struct {
	material storedTLS
	client   *http.Client
	readAt   time.Time
}

// storedTLS is an endpoint's TLS material as stored: the key sealed if
// -secrets-key is set (secrets.go, sealBlob).
type storedTLS struct {
	cert, ca sql.NullString
	key      []byte
}

func (m storedTLS) equal(o storedTLS) bool {
	return m.cert == o.cert && m.ca == o.ca && bytes.Equal(m.key, o.key)
}

func newEndpointClients(db *sql.DB, box *secretBox, base safeHTTPOptions, shared *http.Client) *endpointClients {
	return &endpointClients{db: db, box: box, base: base, shared: shared, recheck: endpointTLSRecheck, entries: map[int64]*endpointClient{}}
}

const endpointTLSSQL = `
SELECT client_certificate, client_key, ca_certificate
FROM outbox.endpoints
WHERE id = $1`

// client is the client for a delivery to endpoint id. A failed read
// keeps the client built from the last one, if any: the database
// failing for a moment stops no delivery that would have gone out
// before. Otherwise an error (the database, or a key this process cannot
// open) sends nothing: sent without its certificate, the delivery would
// only be refused.
func (c *endpointClients) client(ctx context.Context, id int64) (*http.Client, error) {
	now := time.Now()
	c.mu.Lock()
	if e := c.entries[id]; e != nil && now.Sub(e.readAt) < c.recheck {
		c.mu.Unlock()
		return c.or(e.client), nil
	}
	c.mu.Unlock()

	var m storedTLS
	err := c.db.QueryRowContext(ctx, endpointTLSSQL, id).Scan(&m.cert, &m.key, &m.ca)
	if errors.Is(err, sql.ErrNoRows) {
		c.mu.Lock()
		c.drop(id)
		c.mu.Unlock()
		return c.shared, nil // deleted meanwhile: the next claim ends its jobs
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if e := c.entries[id]; e != nil {
			return c.or(e.client), nil
		}
		return nil, fmt.Errorf("read tls material of endpoint %d: %w", id, err)
	}
	if e := c.entries[id]; e != nil && e.material.equal(m) {
		e.readAt = now
		return c.or(e.client), nil
	}
	client, err := c.build(id, m)
	if err != nil {
		return nil, err
	}
	c.drop(id)
	c.entries[id] = &endpointClient{material: m, client: client, readAt: now}
	return c.or(client), nil
}

func (c *endpointClients) or(client *http.Client) *http.Client {
	if client == nil {
		return c.shared
	}
	return client
}

// drop forgets endpoint id's client, closing its idle connections: they
// carry the old certificate. The caller holds c.mu.
func (c *endpointClients) drop(id int64) {
	if e := c.entries[id]; e != nil && e.client != nil {
		e.client.CloseIdleConnections()
	}
	delete(c.entries, id)
}

// build is the client for material m of endpoint id; nil when m holds
// none, for the shared client.
func (c *endpointClients) build(id int64, m storedTLS) (*http.Client, error) {
	if !m.cert.Valid && !m.ca.Valid {
		return nil, nil
	}
	opts := c.base
	if m.cert.Valid {
		keyPEM, err := c.box.openBlob(endpointKeyRow(id), m.key)
		if err != nil {
			return nil, fmt.Errorf("client key: %w", err)
		}
		pair, err := parseClientPair(m.cert.String, string(keyPEM))
		if err != nil {
			return nil, fmt.Errorf("endpoint %d: %w", id, err)
		}
		opts.ClientCertificate = &pair
	}
	if m.ca.Valid {
		pool, err := parseCAPool(m.ca.String)
		if err != nil {
			return nil, fmt.Errorf("endpoint %d: %w", id, err)
		}
		opts.RootCAs = pool
	}
	return newSafeHTTPClient(opts), nil
}
