// secrets_test.go: secrets sealed at rest: the format, the keys and their
// settings, and the schema's bounds.

package main

import (
	"bytes"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testSecretsKey is a key as -secrets-key takes it: 32 bytes of fill in
// standard base64.
func testSecretsKey(fill byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, secretsKeyLen))
}

// testBox is the box the two keys configure, as parseConfig reads them.
func testBox(t testing.TB, current, old string) *secretBox {
	t.Helper()
	box, err := Config{SecretsKey: current, SecretsOldKey: old}.secretBox()
	if err != nil {
		t.Fatal(err)
	}
	return box
}

// newSealingTestAPI is newTestAPI with secrets sealed by box.
func newSealingTestAPI(t *testing.T, db *sql.DB, box *secretBox) *testAPI {
	t.Helper()
	return &testAPI{t: t, srv: newSealingTestServer(t, db, testPolicy, box)}
}

// storedSecrets reads a row's secret and previous secret as stored.
func storedSecrets(t testing.TB, db *sql.DB, query string, key any) (secret, previous []byte) {
	t.Helper()
	if err := db.QueryRow(query, key).Scan(&secret, &previous); err != nil {
		t.Fatal(err)
	}
	return secret, previous
}

const (
	endpointSecretsQuery = `SELECT secret, previous_secret FROM outbox.endpoints WHERE id = $1`
	sourceSecretsQuery   = `SELECT secret, previous_secret FROM outbox.inbox_sources WHERE name = $1`
)

// A sealed secret is 98 bytes whatever the secret's length, starts with
// the version and the key id, never repeats (a fresh nonce each time) and
// opens to the secret; plaintext passes through both ways.
func TestSealedSecretFormat(t *testing.T) {
	t.Parallel()
	box := testBox(t, testSecretsKey(1), "")
	for _, n := range []int{1, 24, 32, 64} {
		secret := bytes.Repeat([]byte{0xab}, n)
		sealed := box.seal("endpoint 7", secret)
		if len(sealed) != 98 || sealed[0] != 1 || !bytes.Equal(sealed[1:5], box.current.id[:]) {
			t.Errorf("%d-byte secret sealed as %d bytes starting %x, want 98 starting 01%s", n, len(sealed), sealed[:5], box.current.id)
		}
		if n >= 24 && bytes.Contains(sealed, secret) {
			t.Errorf("%d-byte secret: the sealed value contains it", n)
		}
		if bytes.Equal(sealed, box.seal("endpoint 7", secret)) {
			t.Errorf("%d-byte secret sealed twice to the same bytes", n)
		}
		got, err := box.open("endpoint 7", sealed)
		if err != nil || !bytes.Equal(got, secret) {
			t.Errorf("%d-byte secret opened to %x, %v", n, got, err)
		}
		if got, err := box.open("endpoint 7", secret); err != nil || !bytes.Equal(got, secret) {
			t.Errorf("%d-byte plaintext read as %x, %v; want it as it is", n, got, err)
		}
	}
	var none *secretBox
	plain := []byte("a plaintext secret of 32 bytes!!")
	if got := none.seal("endpoint 7", plain); !bytes.Equal(got, plain) {
		t.Errorf("without a key: sealed to %x, want the secret as it is", got)
	}
	if id := box.current.id.String(); id != "fca31f12" {
		t.Errorf("key id of testSecretsKey(1) = %s, want fca31f12", id) // pinned: a stored value names its key by it
	}
}

// A sealed value that cannot be opened is an error naming the reason:
// no key, another key, another row, a changed byte, an unknown layout.
// The old key of a rotation opens what it sealed.
func TestSealedSecretRefusesWhatItCannotOpen(t *testing.T) {
	t.Parallel()
	key1, key2 := testSecretsKey(1), testSecretsKey(2)
	box1 := testBox(t, key1, "")
	secret := bytes.Repeat([]byte{0xcd}, 32)
	sealed := box1.seal("endpoint 7", secret)
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-1] ^= 1
	version2 := bytes.Clone(sealed)
	version2[0] = 2

	for _, tc := range []struct {
		name   string
		box    *secretBox
		row    string
		stored []byte
		want   string
	}{
		{"no key", nil, "endpoint 7", sealed, "secret of endpoint 7 is sealed under key fca31f12, and -secrets-key (OUTBOXD_SECRETS_KEY) is not set"},
		{"another key", testBox(t, key2, ""), "endpoint 7", sealed, "secret of endpoint 7 is sealed under key fca31f12, which is neither -secrets-key (OUTBOXD_SECRETS_KEY) (key "},
		{"copied to another row", box1, "endpoint 8", sealed, "secret of endpoint 8 does not open under key fca31f12: it was changed, or copied from another row"},
		{"copied to a source", box1, "source 7", sealed, "does not open"},
		{"a byte changed", box1, "endpoint 7", flipped, "does not open"},
		{"another layout", box1, "endpoint 7", version2, "secret of endpoint 7: 98 bytes with version 2, not a sealed secret this outboxd reads"},
		{"too short to be sealed", box1, "endpoint 7", sealed[:97], "97 bytes with version 1, not a sealed secret"},
	} {
		got, err := tc.box.open(tc.row, tc.stored)
		if err == nil || !strings.Contains(err.Error(), tc.want) || got != nil {
			t.Errorf("%s: open = %x, %v; want an error containing %q", tc.name, got, err, tc.want)
		}
	}

	rotating := testBox(t, key2, key1)
	if got, err := rotating.open("endpoint 7", sealed); err != nil || !bytes.Equal(got, secret) {
		t.Errorf("the old key of a rotation: opened to %x, %v", got, err)
	}
}

// The key is 32 bytes in standard base64 and nothing else; every refusal
// names the setting and none quotes the key; -help shows no key.
func TestSecretsKeySettings(t *testing.T) {
	t.Parallel()
	key1, key2 := testSecretsKey(1), testSecretsKey(2)
	cfg, err := parseConfig([]string{"-secrets-key", key2},
		envFrom(map[string]string{"OUTBOXD_SECRETS_OLD_KEY": key1}), new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	want := defaultConfig()
	want.SecretsKey, want.SecretsOldKey = key2, key1
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("both keys (-want +got):\n%s", diff)
	}

	raw := bytes.Repeat([]byte{0xfb}, 32)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"OUTBOXD_SECRETS_KEY": hex.EncodeToString(raw)}, "-secrets-key (OUTBOXD_SECRETS_KEY) must be 32 bytes in standard base64, 44 characters ending in = (openssl rand -base64 32); got 64 characters"},
		{nil, map[string]string{"OUTBOXD_SECRETS_KEY": base64.URLEncoding.EncodeToString(raw)}, "-secrets-key (OUTBOXD_SECRETS_KEY) must be 32 bytes"},
		{nil, map[string]string{"OUTBOXD_SECRETS_KEY": base64.RawStdEncoding.EncodeToString(raw)}, "got 43 characters"},
		{nil, map[string]string{"OUTBOXD_SECRETS_KEY": key1 + "\n"}, "got 45 characters"},
		{[]string{"-secrets-key", base64.StdEncoding.EncodeToString(raw[:16])}, nil, "-secrets-key (OUTBOXD_SECRETS_KEY) must be 32 bytes"},
		{[]string{"-secrets-key", "0123456789abcdef0123456789abcdef"}, nil, "-secrets-key (OUTBOXD_SECRETS_KEY) must be 32 bytes"},
		{[]string{"-secrets-key", key1, "-secrets-old-key", "secret"}, nil, "-secrets-old-key (OUTBOXD_SECRETS_OLD_KEY) must be 32 bytes"},
		{[]string{"-secrets-old-key", key1}, nil, "-secrets-old-key (OUTBOXD_SECRETS_OLD_KEY) is set without -secrets-key (OUTBOXD_SECRETS_KEY)"},
		{[]string{"-secrets-key", key1, "-secrets-old-key", key1}, nil, "-secrets-old-key (OUTBOXD_SECRETS_OLD_KEY): the old key has the current key's id fca31f12: it is the same key"},
	} {
		_, err := parseConfig(tc.args, envFrom(tc.env), new(bytes.Buffer))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseConfig(%q, %q) = %v, want an error containing %q", tc.args, tc.env, err, tc.want)
			continue
		}
		for _, text := range append(append([]string{}, tc.args...), tc.env["OUTBOXD_SECRETS_KEY"]) {
			if len(text) >= 32 && strings.Contains(err.Error(), strings.TrimSpace(text)) {
				t.Errorf("parseConfig(%q, %q): the error %q quotes the key", tc.args, tc.env, err)
			}
		}
	}

	var help bytes.Buffer
	_, err = parseConfig([]string{"-secrets-key", key1, "-help"}, envFrom(map[string]string{"OUTBOXD_SECRETS_OLD_KEY": key2}), &help)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-help: %v", err)
	}
	if !strings.Contains(help.String(), "-secrets-key  (OUTBOXD_SECRETS_KEY, default \"\")") || strings.Contains(help.String(), key1) || strings.Contains(help.String(), key2) {
		t.Errorf("-help lists -secrets-key without a default, and no key:\n%s", help.String())
	}
}

// schema.sql bounds a stored secret to plaintext (24 to 64 bytes for an
// endpoint, 1 to 64 for a source) or a sealed value: 98 bytes starting
// with the version byte.
func TestSchemaBoundsSecretsToPlaintextOrSealed(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	sealed := testBox(t, testSecretsKey(1), "").seal("endpoint 1", bytes.Repeat([]byte{1}, 32))
	version2 := append([]byte{2}, sealed[1:]...)
	for _, tc := range []struct {
		secret           []byte
		endpoint, source bool // accepted
	}{
		{secret: bytes.Repeat([]byte{1}, 1), endpoint: false, source: true},
		{secret: bytes.Repeat([]byte{1}, 24), endpoint: true, source: true},
		{secret: bytes.Repeat([]byte{1}, 64), endpoint: true, source: true},
		{secret: bytes.Repeat([]byte{1}, 65), endpoint: false, source: false},
		{secret: sealed, endpoint: true, source: true},
		{secret: sealed[:97], endpoint: false, source: false},
		{secret: version2, endpoint: false, source: false},
	} {
		_, err := db.Exec(`INSERT INTO outbox.endpoints (url, secret) VALUES ('https://hooks.example/', $1)`, tc.secret)
		if (err == nil) != tc.endpoint {
			t.Errorf("endpoint secret of %d bytes starting %d: accepted %v, want %v (%v)", len(tc.secret), tc.secret[0], err == nil, tc.endpoint, err)
		}
		_, err = db.Exec(`INSERT INTO outbox.inbox_sources (name, secret, topic_prefix) VALUES ('s' || md5(random()::text), $1, '')`, tc.secret)
		if (err == nil) != tc.source {
			t.Errorf("source secret of %d bytes starting %d: accepted %v, want %v (%v)", len(tc.secret), tc.secret[0], err == nil, tc.source, err)
		}
	}
}
