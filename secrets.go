// secrets.go: endpoint and inbox-source secrets sealed at rest, and the
// commands that seal the rows already stored (docs/security.md, "Secrets
// at rest").
//
// Without -secrets-key nothing is sealed and every secret is stored and
// read as the bytes it is. With it, every write seals (AES-256-GCM, a
// random nonce each time) and every read opens. A stored value says what
// it is, so rows of either kind live side by side:
//
//	plaintext  at most maxSecretLen (64) bytes, as schema.sql's CHECKs bound
//	           every secret written without a key
//	sealed     exactly sealedSecretLen (98) bytes:
//	           version (1) | key id (4) | nonce (12) | ciphertext (65) | tag (16)
//
// Sealing pads every secret to maxSecretLen, so a sealed value is always
// longer than any plaintext one: the length alone tells them apart, and a
// random plaintext secret can never be mistaken for a sealed one. The key
// id names the key that sealed a value, so a rotation tells old-key rows
// from new-key rows, and a value met without its key says which key it
// needs. The header and the row's identity ("endpoint 7", "source shop")
// are the additional authenticated data: a sealed secret copied to another
// row, or edited, does not open.

package main

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
)

const (
	// secretsKeyLen is an AES-256 key.
	secretsKeyLen = 32
	// maxSecretLen is the longest secret outboxd stores: schema.sql's
	// secret-length CHECKs and parseSourceSecret bound every one to it.
	maxSecretLen = 64
	// sealedVersion is the first byte of a sealed secret: the layout
	// above. Another layout would take another byte.
	sealedVersion = 1
	keyIDLen      = 4
	// sealedHeaderLen is the version and the key id, in the clear.
	sealedHeaderLen = 1 + keyIDLen
	// sealedSecretLen is every sealed secret's length: the header, the
	// nonce, the padded secret with its length byte, and the GCM tag.
	// schema.sql's CHECKs allow exactly this beside the plaintext range.
	sealedSecretLen = sealedHeaderLen + 12 + 1 + maxSecretLen + 16
)

// keyID names a sealing key without revealing it: the start of an HMAC of
// a fixed label under the key. It is what logs and errors show.
type keyID [keyIDLen]byte

func (id keyID) String() string { return hex.EncodeToString(id[:]) }

// sealKey is one parsed -secrets-key.
type sealKey struct {
	id   keyID
	aead cipher.AEAD // GCM that draws a random nonce for every seal
}

// parseSecretsKey reads a key given as 32 bytes in standard base64, padded
// (what `openssl rand -base64 32` prints), and nothing else: not hex, not
// URL-safe or unpadded base64, not with a line break. Its errors never
// quote the text: it is a key, or close to one.
func parseSecretsKey(text string) (*sealKey, error) {
	key, err := base64.StdEncoding.Strict().DecodeString(text)
	if err != nil || len(key) != secretsKeyLen || base64.StdEncoding.EncodeToString(key) != text {
		return nil, fmt.Errorf("must be %d bytes in standard base64, %d characters ending in = (openssl rand -base64 32); got %d characters that are not",
			secretsKeyLen, base64.StdEncoding.EncodedLen(secretsKeyLen), len(text))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("aes: %w", err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("gcm: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("outboxd secrets key id"))
	k := &sealKey{aead: aead}
	copy(k.id[:], mac.Sum(nil))
	return k, nil
}

// secretBox seals and opens stored secrets. A nil *secretBox is no key:
// it seals nothing, reads plaintext as it is, and refuses a sealed value.
type secretBox struct {
	current sealKey  // seals every write; opens what it sealed
	old     *sealKey // opens only: -secrets-old-key, during a rotation
}

// newSecretBox is the box of current and, if not nil, old.
func newSecretBox(current, old *sealKey) (*secretBox, error) {
	if old != nil && old.id == current.id {
		return nil, fmt.Errorf("the old key has the current key's id %s: it is the same key", current.id)
	}
	return &secretBox{current: *current, old: old}, nil
}

// LogValue names the box's keys by id, never by value.
func (b *secretBox) LogValue() slog.Value {
	if b == nil {
		return slog.StringValue("none")
	}
	attrs := []slog.Attr{slog.String("key_id", b.current.id.String())}
	if b.old != nil {
		attrs = append(attrs, slog.String("old_key_id", b.old.id.String()))
	}
	return slog.GroupValue(attrs...)
}

// A row's secrets are sealed to its identity, the table's prefix and the
// row's key as text ("endpoint 7", "source shop"): a sealed value opens
// only in the row it was written for.
const (
	endpointRowPrefix = "endpoint "
	sourceRowPrefix   = "source "
)

func endpointSecretRow(id int64) string  { return endpointRowPrefix + strconv.FormatInt(id, 10) }
func sourceSecretRow(name string) string { return sourceRowPrefix + name }

// seal is secret as it is stored in row: sealed under the current key, or,
// without a key, secret itself.
func (b *secretBox) seal(row string, secret []byte) []byte {
	if b == nil {
		return secret
	}
	if len(secret) > maxSecretLen {
		// The callers pass a secret the schema's CHECKs accept; a longer
		// one is a bug, not an input.
		panic(fmt.Sprintf("seal: a %d-byte secret, at most %d", len(secret), maxSecretLen))
	}
	padded := make([]byte, 1+maxSecretLen)
	padded[0] = byte(len(secret))
	copy(padded[1:], secret)
	sealed := make([]byte, sealedHeaderLen, sealedSecretLen)
	sealed[0] = sealedVersion
	copy(sealed[1:], b.current.id[:])
	return b.current.aead.Seal(sealed, nil, padded, additionalData(sealed[:sealedHeaderLen], row))
}

// additionalData binds a sealed value to its header and its row.
func additionalData(header []byte, row string) []byte {
	return append(append([]byte{}, header...), row...)
}

// isSealed tells a sealed value from plaintext by its length (see the top
// of this file).
func isSealed(stored []byte) bool { return len(stored) > maxSecretLen }

// sealedKeyID is the id of the key that sealed stored, which isSealed.
func sealedKeyID(stored []byte) keyID { return keyID(stored[1:sealedHeaderLen]) }

// open is the secret stored in row: a plaintext value as it is, a sealed
// one opened with the key that sealed it. A sealed value this box cannot
// open is an error that says why, never a secret.
func (b *secretBox) open(row string, stored []byte) ([]byte, error) {
	if !isSealed(stored) {
		return stored, nil
	}
	if len(stored) != sealedSecretLen || stored[0] != sealedVersion {
		return nil, fmt.Errorf("secret of %s: %d bytes with version %d, not a sealed secret this outboxd reads", row, len(stored), stored[0])
	}
	id := sealedKeyID(stored)
	var key *sealKey
	switch {
	case b == nil:
		return nil, fmt.Errorf("secret of %s is sealed under key %s, and %s is not set", row, id, setting("secrets-key"))
	case id == b.current.id:
		key = &b.current
	case b.old != nil && id == b.old.id:
		key = b.old
	default:
		return nil, fmt.Errorf("secret of %s is sealed under key %s, which is neither %s (key %s) nor %s",
			row, id, setting("secrets-key"), b.current.id, setting("secrets-old-key"))
	}
	padded, err := key.aead.Open(nil, nil, stored[sealedHeaderLen:], additionalData(stored[:sealedHeaderLen], row))
	if err != nil {
		return nil, fmt.Errorf("secret of %s does not open under key %s: it was changed, or copied from another row", row, id)
	}
	n := int(padded[0])
	if n == 0 || n > maxSecretLen {
		return nil, fmt.Errorf("secret of %s: sealed length %d out of range", row, n)
	}
	return padded[1 : 1+n], nil
}

// An endpoint's client key (clientcert.go) is longer than any secret and
// of any length, so it is sealed in a layout of its own, padded to
// nothing:
//
//	sealed     version 2 (1) | key id (4) | nonce (12) | ciphertext | tag (16)
//	plaintext  the key's PEM text, which starts with "-" (-----BEGIN)
//
// Its row identity is endpointKeyRow's, so a sealed key opens only as the
// key of the endpoint it was written for, never as a secret.
const (
	sealedBlobVersion = 2
	sealedBlobMinLen  = sealedHeaderLen + 12 + 16
)

func endpointKeyRow(id int64) string { return endpointSecretRow(id) + " client key" }

// endpointHeadersRow is the row identity of an endpoint's secret headers
// (endpointrequest.go), sealed in the same layout: they open only as that
// endpoint's headers.
func endpointHeadersRow(id int64) string { return endpointSecretRow(id) + " headers" }

// sealBlob is data as it is stored in row: sealed under the current key,
// or, without a key, data itself.
func (b *secretBox) sealBlob(row string, data []byte) []byte {
	if b == nil {
		return data
	}
	sealed := make([]byte, sealedHeaderLen, sealedBlobMinLen+len(data))
	sealed[0] = sealedBlobVersion
	copy(sealed[1:], b.current.id[:])
	return b.current.aead.Seal(sealed, nil, data, additionalData(sealed[:sealedHeaderLen], row))
}

// isSealedBlob tells a sealed blob from plaintext PEM by its first byte.
func isSealedBlob(stored []byte) bool { return len(stored) > 0 && stored[0] == sealedBlobVersion }

// openBlob is the data stored in row: plaintext as it is, a sealed value
// opened with the key that sealed it, or an error that says why not.
func (b *secretBox) openBlob(row string, stored []byte) ([]byte, error) {
	if !isSealedBlob(stored) {
		return stored, nil
	}
	if len(stored) < sealedBlobMinLen {
		return nil, fmt.Errorf("%s: %d bytes, too short to be sealed", row, len(stored))
	}
	key, err := b.keyFor(row, sealedKeyID(stored))
	if err != nil {
		return nil, err
	}
	data, err := key.aead.Open(nil, nil, stored[sealedHeaderLen:], additionalData(stored[:sealedHeaderLen], row))
	if err != nil {
		return nil, fmt.Errorf("%s does not open under key %s: it was changed, or copied from another row", row, key.id)
	}
	return data, nil
}

// keyFor is the key of this box with id, or an error naming the setting
// that lacks it.
func (b *secretBox) keyFor(row string, id keyID) (*sealKey, error) {
	switch {
	case b == nil:
		return nil, fmt.Errorf("%s is sealed under key %s, and %s is not set", row, id, setting("secrets-key"))
	case id == b.current.id:
		return &b.current, nil
	case b.old != nil && id == b.old.id:
		return b.old, nil
	}
	return nil, fmt.Errorf("%s is sealed under key %s, which is neither %s (key %s) nor %s",
		row, id, setting("secrets-key"), b.current.id, setting("secrets-old-key"))
}

// openAll opens every secret of row, in order.
func (b *secretBox) openAll(row string, stored [][]byte) ([][]byte, error) {
	secrets := make([][]byte, 0, len(stored))
	for _, s := range stored {
		secret, err := b.open(row, s)
		if err != nil {
			return nil, err
		}
		secrets = append(secrets, secret)
	}
	return secrets, nil
}

// reseal is stored sealed under the current key, and whether that changed
// it: plaintext is sealed, a value under the old key re-sealed, one under
// the current key left as it is, NULL kept NULL.
func (b *secretBox) reseal(row string, stored []byte) ([]byte, bool, error) {
	if stored == nil || (isSealed(stored) && sealedKeyID(stored) == b.current.id) {
		return stored, false, nil
	}
	secret, err := b.open(row, stored)
	if err != nil {
		return nil, false, err
	}
	return b.seal(row, secret), true, nil
}

// secretTable is a table that holds secrets, as the seal commands walk it.
// Its key is carried as text (database/sql scans a bigint into a string),
// so one loop serves both tables.
type secretTable struct {
	name      string
	firstKey  string // below every key
	rowPrefix string // the row's identity is rowPrefix + key
	// pageSQL locks and reads the secrets of at most $2 rows after key $1,
	// in key order. FOR NO KEY UPDATE holds off a concurrent rotation
	// until the batch commits, and leaves the foreign-key checks of job
	// inserts (FOR KEY SHARE) alone.
	pageSQL string
	// updateSQL stores row $1's resealed secret $2 and previous secret $3.
	updateSQL string
}

func secretTables() []secretTable {
	return []secretTable{
		{
			name:      "outbox.endpoints",
			firstKey:  "0",
			rowPrefix: endpointRowPrefix, // the id scanned as text is endpointSecretRow's decimal
			pageSQL: `
SELECT id, secret, previous_secret
FROM outbox.endpoints
WHERE id > $1::bigint
ORDER BY id
LIMIT $2
FOR NO KEY UPDATE`,
			updateSQL: `
UPDATE outbox.endpoints
SET secret = $2,
    previous_secret = $3
WHERE id = $1::bigint`,
		},
		{
			name:      "outbox.inbox_sources",
			firstKey:  "",
			rowPrefix: sourceRowPrefix,
			pageSQL: `
SELECT name, secret, previous_secret
FROM outbox.inbox_sources
WHERE name > $1
ORDER BY name
LIMIT $2
FOR NO KEY UPDATE`,
			updateSQL: `
UPDATE outbox.inbox_sources
SET secret = $2,
    previous_secret = $3
WHERE name = $1`,
		},
	}
}

// sealBatch is how many rows one transaction of the seal commands locks
// and rewrites: short enough that a rotation through the API waits for it
// no longer than a few milliseconds.
const sealBatch = 100

// sealStoredSecrets is `outboxd secrets encrypt` and `secrets rotate-key`:
// every stored secret not sealed under the current key is sealed under it,
// in batches of sealBatch rows, each its own transaction. A row already
// under the current key is not written, so a second run writes nothing,
// and one stopped halfway is finished by the next. It runs beside live
// replicas: each batch's rows are locked from read to write, so a secret
// rotated through the API meanwhile is either read after the rotation or
// rotated after the batch, never overwritten. It reports the rows it
// rewrote, by table.
func sealStoredSecrets(ctx context.Context, db *sql.DB, box *secretBox, logger *slog.Logger) (map[string]int, error) {
	if box == nil {
		return nil, fmt.Errorf("seal secrets: %s is not set", setting("secrets-key"))
	}
	sealed := map[string]int{}
	for _, t := range secretTables() {
		for after := t.firstKey; ; {
			last, n, more, err := sealSecretsPage(ctx, db, box, t, after)
			sealed[t.name] += n
			if err != nil {
				return sealed, err
			}
			if !more {
				break
			}
			after = last
		}
		logger.Info("secrets sealed under the current key", "table", t.name, "rows_rewritten", sealed[t.name], "key_id", box.current.id)
	}
	for _, c := range blobColumns() {
		for after := int64(0); ; {
			last, n, more, err := sealBlobsPage(ctx, db, box, c, after)
			sealed[c.name] += n
			if err != nil {
				return sealed, err
			}
			if !more {
				break
			}
			after = last
		}
		logger.Info("sealed values of a column under the current key", "column", c.name, "rows_rewritten", sealed[c.name], "key_id", box.current.id)
	}
	return sealed, nil
}

// clientKeysColumn and secretHeadersColumn name the endpoints' client
// keys (clientcert.go) and secret headers (endpointrequest.go) in what
// sealStoredSecrets reports.
const (
	clientKeysColumn    = "outbox.endpoints.client_key"
	secretHeadersColumn = "outbox.endpoints.secret_headers"
)

// blobColumn is a column of outbox.endpoints sealed as a blob, as the
// seal commands walk it: pageSQL locks and reads the values of at most $2
// endpoints after id $1, as secretTable's pageSQL does the secrets, and
// updateSQL stores endpoint $1's $2; row is a value's row identity.
type blobColumn struct {
	name               string
	pageSQL, updateSQL string
	row                func(id int64) string
}

func blobColumns() []blobColumn {
	return []blobColumn{
		{
			name: clientKeysColumn,
			row:  endpointKeyRow,
			pageSQL: `
SELECT id, client_key
FROM outbox.endpoints
WHERE id > $1
  AND client_key IS NOT NULL
ORDER BY id
LIMIT $2
FOR NO KEY UPDATE`,
			updateSQL: `
UPDATE outbox.endpoints
SET client_key = $2
WHERE id = $1`,
		},
		{
			name: secretHeadersColumn,
			row:  endpointHeadersRow,
			pageSQL: `
SELECT id, secret_headers
FROM outbox.endpoints
WHERE id > $1
  AND secret_headers IS NOT NULL
ORDER BY id
LIMIT $2
FOR NO KEY UPDATE`,
			updateSQL: `
UPDATE outbox.endpoints
SET secret_headers = $2
WHERE id = $1`,
		},
	}
}

// sealBlobsPage is sealSecretsPage for a column of blobs: one batch after
// endpoint id after, returning the last id read, the values rewritten and
// whether the page was full.
func sealBlobsPage(ctx context.Context, db *sql.DB, box *secretBox, c blobColumn, after int64) (last int64, rewritten int, more bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, false, fmt.Errorf("seal %s: %w", c.name, err)
	}
	defer tx.Rollback()
	type storedKey struct {
		id  int64
		key []byte
	}
	rows, err := queryAll(ctx, tx, func(row rowScanner) (k storedKey, err error) { return k, row.Scan(&k.id, &k.key) }, c.pageSQL, after, sealBatch)
	if err != nil {
		return 0, 0, false, fmt.Errorf("seal %s: read: %w", c.name, err)
	}
	for _, r := range rows {
		last = r.id
		if isSealedBlob(r.key) && len(r.key) >= sealedBlobMinLen && sealedKeyID(r.key) == box.current.id {
			continue
		}
		row := c.row(r.id)
		key, err := box.openBlob(row, r.key)
		if err != nil {
			return 0, 0, false, fmt.Errorf("seal %s: %w", c.name, err)
		}
		if _, err := tx.ExecContext(ctx, c.updateSQL, r.id, box.sealBlob(row, key)); err != nil {
			return 0, 0, false, fmt.Errorf("seal %s: %w", row, err)
		}
		rewritten++
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, false, fmt.Errorf("seal %s: commit: %w", c.name, err)
	}
	return last, rewritten, len(rows) == sealBatch, nil
}

// sealSecretsPage is one batch of sealStoredSecrets: the rows of t after
// key after. It returns the last key read, the rows rewritten, and whether
// the page was full (more may follow).
func sealSecretsPage(ctx context.Context, db *sql.DB, box *secretBox, t secretTable, after string) (last string, rewritten int, more bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", 0, false, fmt.Errorf("seal secrets of %s: %w", t.name, err)
	}
	defer tx.Rollback()
	type storedSecrets struct {
		key              string
		secret, previous []byte
	}
	rows, err := queryAll(ctx, tx, func(row rowScanner) (storedSecrets, error) {
		var s storedSecrets
		err := row.Scan(&s.key, &s.secret, &s.previous)
		return s, err
	}, t.pageSQL, after, sealBatch)
	if err != nil {
		return "", 0, false, fmt.Errorf("seal secrets of %s: read: %w", t.name, err)
	}
	for _, r := range rows {
		row := t.rowPrefix + r.key
		secret, changed, err := box.reseal(row, r.secret)
		if err != nil {
			return "", 0, false, fmt.Errorf("seal secrets: %w", err)
		}
		previous, previousChanged, err := box.reseal(row, r.previous)
		if err != nil {
			return "", 0, false, fmt.Errorf("seal secrets: previous %w", err)
		}
		if !changed && !previousChanged {
			continue
		}
		if _, err := tx.ExecContext(ctx, t.updateSQL, r.key, secret, previous); err != nil {
			return "", 0, false, fmt.Errorf("seal secrets of %s: %w", row, err)
		}
		rewritten++
	}
	if err := tx.Commit(); err != nil {
		return "", 0, false, fmt.Errorf("seal secrets of %s: commit: %w", t.name, err)
	}
	if len(rows) > 0 {
		last = rows[len(rows)-1].key
	}
	return last, rewritten, len(rows) == sealBatch, nil
}

// countSealedSQL counts the rows whose secret is sealed: longer than $1,
// maxSecretLen, as isSealed tells them; and the client keys sealed
// (isSealedBlob: first byte sealedBlobVersion, 2).
const countSealedSQL = `
SELECT (SELECT count(*) FROM outbox.endpoints WHERE length(secret) > $1)
     + (SELECT count(*) FROM outbox.inbox_sources WHERE length(secret) > $1)
     + (SELECT count(*) FROM outbox.endpoints WHERE get_byte(client_key, 0) = 2)`

// warnSealedWithoutKey says at start, rather than at the first delivery,
// that secrets are sealed and this process has no key to open them: its
// deliveries to those endpoints and its inbox for those sources fail
// until it has one.
func warnSealedWithoutKey(ctx context.Context, db *sql.DB, logger *slog.Logger) {
	var n int64
	if err := db.QueryRowContext(ctx, countSealedSQL, maxSecretLen).Scan(&n); err != nil {
		logger.Warn("count sealed secrets", "err", err)
		return
	}
	if n > 0 {
		logger.Warn("secrets are sealed but -secrets-key is not set: deliveries to their endpoints and webhooks from their sources fail until it is",
			"sealed_rows", n)
	}
}
