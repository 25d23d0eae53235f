// secrets_test.go: secrets sealed at rest: the format, the keys and their
// settings, the schema's bounds, and the commands that seal the rows
// already stored.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"

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
	resealed, changed, err := rotating.reseal("endpoint 7", sealed)
	if err != nil || !changed || sealedKeyID(resealed) != rotating.current.id {
		t.Fatalf("reseal under the new key: %x, %v, %v", resealed, changed, err)
	}
	if again, changed, err := rotating.reseal("endpoint 7", resealed); err != nil || changed || !bytes.Equal(again, resealed) {
		t.Errorf("reseal of a value already under the current key: changed %v, %v", changed, err)
	}
}

// The key is 32 bytes in standard base64 and nothing else; every refusal
// names the setting and none quotes the key; the commands want the keys
// they use; -help shows no key.
func TestSecretsKeySettings(t *testing.T) {
	t.Parallel()
	key1, key2 := testSecretsKey(1), testSecretsKey(2)
	cfg, err := parseConfig([]string{"secrets", "rotate-key", "-secrets-key", key2},
		envFrom(map[string]string{"OUTBOXD_SECRETS_OLD_KEY": key1}), new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	want := defaultConfig()
	want.Command, want.SecretsKey, want.SecretsOldKey = "secrets rotate-key", key2, key1
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("secrets rotate-key (-want +got):\n%s", diff)
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
		{[]string{"secrets", "encrypt"}, nil, "outboxd secrets encrypt seals under -secrets-key (OUTBOXD_SECRETS_KEY), which is not set"},
		{[]string{"secrets", "rotate-key", "-secrets-key", key2}, nil, "outboxd secrets rotate-key needs the key it rotates out in -secrets-old-key (OUTBOXD_SECRETS_OLD_KEY)"},
		{[]string{"secrets", "decrypt", "-secrets-key", key1}, nil, `unknown command "secrets decrypt"`},
		{[]string{"secrets", "-secrets-key", key1}, nil, `unknown command "secrets"`},
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

// storedSecret is one stored secret or previous secret and its row.
type storedSecret struct {
	row    string // as sealed to: "endpoint 7", "source shop"
	stored []byte
}

// allStoredSecrets reads every stored secret, a row's current one before
// its previous one.
func allStoredSecrets(t *testing.T, db *sql.DB) []storedSecret {
	t.Helper()
	all, err := queryAll(context.Background(), db, func(r rowScanner) (s storedSecret, err error) {
		return s, r.Scan(&s.row, &s.stored)
	}, `
		SELECT row, s
		FROM (
		  SELECT 'endpoint ' || id AS row, v.n, v.s
		  FROM outbox.endpoints, LATERAL (VALUES (1, secret), (2, previous_secret)) AS v(n, s)
		  UNION ALL
		  SELECT 'source ' || name, v.n, v.s
		  FROM outbox.inbox_sources, LATERAL (VALUES (1, secret), (2, previous_secret)) AS v(n, s)
		) AS stored
		WHERE s IS NOT NULL
		ORDER BY row, n`)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// plaintextRows is every stored secret, opened by box, by row:
// what the seal commands must keep while they rewrite how it is stored.
func plaintextRows(t *testing.T, db *sql.DB, box *secretBox) map[string][]string {
	t.Helper()
	plain := map[string][]string{}
	for _, s := range allStoredSecrets(t, db) {
		p, err := box.open(s.row, s.stored)
		if err != nil {
			t.Fatal(err)
		}
		plain[s.row] = append(plain[s.row], hex.EncodeToString(p))
	}
	return plain
}

// keysOfStoredSecrets counts the stored secrets by the key that sealed
// them ("plaintext" for none).
func keysOfStoredSecrets(t *testing.T, db *sql.DB) map[string]int {
	t.Helper()
	keys := map[string]int{}
	for _, s := range allStoredSecrets(t, db) {
		if isSealed(s.stored) {
			keys[sealedKeyID(s.stored).String()]++
		} else {
			keys["plaintext"]++
		}
	}
	return keys
}

// `outboxd secrets encrypt` seals every plaintext secret, in batches, and
// a second run writes nothing; `secrets rotate-key` moves every one to the
// new key. The secrets stay what they were, and the logs show no key.
func TestSecretsCommandsSealAndRotateEveryRow(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	api := newTestAPI(t, db, testPolicy) // no key: plaintext, as before the key was set
	ep := api.createEndpoint("https://hooks.example.com/a")
	if status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/rotate-secret", ""); status != 200 {
		t.Fatalf("rotate: %d %s", status, body)
	}
	api.createSource("shop", "")
	// More endpoints than one batch holds.
	mustExec(t, db, `
		INSERT INTO outbox.endpoints (url, secret)
		SELECT 'https://hooks.example.com/' || i, decode(md5(i::text) || md5(i::text), 'hex')
		FROM generate_series(1, 150) AS i`)
	before := plaintextRows(t, db, nil)
	if diff := cmp.Diff(map[string]int{"plaintext": 153}, keysOfStoredSecrets(t, db)); diff != "" {
		t.Fatalf("before (-want +got):\n%s", diff)
	}

	key1, key2 := testSecretsKey(1), testSecretsKey(2)
	var logs bytes.Buffer
	env := map[string]string{"DATABASE_URL": dsn, "OUTBOXD_SECRETS_KEY": key1}
	if err := run(context.Background(), []string{"secrets", "encrypt"}, envFrom(env), &logs, &logs); err != nil {
		t.Fatalf("secrets encrypt: %v\n%s", err, logs.String())
	}
	if diff := cmp.Diff(map[string]int{"fca31f12": 153}, keysOfStoredSecrets(t, db)); diff != "" {
		t.Errorf("after secrets encrypt (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, plaintextRows(t, db, testBox(t, key1, ""))); diff != "" {
		t.Errorf("secrets changed by secrets encrypt (-want +got):\n%s", diff)
	}
	again, err := sealStoredSecrets(context.Background(), db, testBox(t, key1, ""), testLogger(t))
	if diff := cmp.Diff(map[string]int{"outbox.endpoints": 0, "outbox.inbox_sources": 0, clientKeysColumn: 0, secretHeadersColumn: 0}, again); diff != "" || err != nil {
		t.Errorf("a second run rewrote rows (-want +got), err %v:\n%s", err, diff)
	}

	env["OUTBOXD_SECRETS_KEY"], env["OUTBOXD_SECRETS_OLD_KEY"] = key2, key1
	if err := run(context.Background(), []string{"secrets", "rotate-key"}, envFrom(env), &logs, &logs); err != nil {
		t.Fatalf("secrets rotate-key: %v\n%s", err, logs.String())
	}
	newID := testBox(t, key2, "").current.id.String()
	if diff := cmp.Diff(map[string]int{newID: 153}, keysOfStoredSecrets(t, db)); diff != "" {
		t.Errorf("after secrets rotate-key (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, plaintextRows(t, db, testBox(t, key2, ""))); diff != "" {
		t.Errorf("secrets changed by secrets rotate-key (-want +got):\n%s", diff)
	}
	if !strings.Contains(logs.String(), "rows_rewritten=151") || strings.Contains(logs.String(), key1) || strings.Contains(logs.String(), key2) {
		t.Errorf("logs do not count the endpoints rewritten, or show a key:\n%s", logs.String())
	}
}

// A secret rotated through the API while `secrets encrypt` runs is not
// lost: the command waits for the rotation's row, then seals what the
// rotation wrote.
func TestSecretsEncryptKeepsAConcurrentRotation(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	box := testBox(t, testSecretsKey(1), "")
	first, rotated := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	var id int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret) VALUES ('https://hooks.example/', $1) RETURNING id`, first).Scan(&id); err != nil {
		t.Fatal(err)
	}

	// A replica rotates the secret (rotateEndpointSecretSQL) and has not
	// committed yet.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(rotateEndpointSecretSQL, id, box.seal(endpointSecretRow(id), rotated), time.Hour.Seconds(), nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sealStoredSecrets(ctx, db, box, testLogger(t))
		done <- err
	}()
	waitFor(t, "secrets encrypt to wait for the rotating row", 10*time.Second, func() bool {
		return queryInt(t, db, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database()
			  AND wait_event_type = 'Lock'`) == 1
	})
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	secret, previous := storedSecrets(t, db, endpointSecretsQuery, id)
	got, err := box.openAll(endpointSecretRow(id), [][]byte{secret, previous})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]byte{rotated, first}, got); diff != "" || !isSealed(previous) {
		t.Errorf("secret and previous secret after the rotation and the command (-want +got), previous sealed %v:\n%s", isSealed(previous), diff)
	}
}

// A process started without the key that sealed its secrets says so at
// start, naming how many rows it cannot open; with none sealed it is quiet.
func TestStartWarnsOfSealedSecretsWithoutAKey(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	warned := func() bool {
		var logs syncBuffer
		warnSealedWithoutKey(context.Background(), db, slog.New(slog.NewTextHandler(&logs, nil)))
		return strings.Contains(logs.String(), "sealed_rows=1")
	}
	if warned() {
		t.Error("warned with no sealed secret")
	}
	newSealingTestAPI(t, db, testBox(t, testSecretsKey(1), "")).createSource("shop", "")
	if !warned() {
		t.Error("no warning with one sealed secret and no key")
	}
}
