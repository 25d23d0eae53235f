// database_test.go: what database.go does against a real server: the
// warning about settings that break the guarantees, and redaction.

package main

import (
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A database that acknowledges commits before they are durable is named at
// start, with the risk; one that does not is not.
func TestServerSettingsThatBreakTheGuaranteesAreWarnedAbout(t *testing.T) {
	t.Parallel()
	for _, commit := range []string{"on", "off"} {
		db, dsn := newTestDB(t)
		var name string
		if err := db.QueryRow(`SELECT current_database()`).Scan(&name); err != nil {
			t.Fatal(err)
		}
		mustExec(t, db, `ALTER DATABASE `+name+` SET synchronous_commit = `+commit)
		fresh, err := newDBPool(dsn) // a new session reads the database's setting
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close()
		var logs syncBuffer
		checkServerSettings(context.Background(), fresh, slog.New(slog.NewTextHandler(&logs, nil)))
		warned := strings.Contains(logs.String(), "setting=synchronous_commit")
		if warned != (commit == "off") {
			t.Errorf("synchronous_commit=%s: warned %t; log:\n%s", commit, warned, logs.String())
		}
	}
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, text, want string }{
		{"postgres://app:s3cret@db/app", `parse "postgres://app:s3cret@db/app": bad`, `parse "postgres://app:xxxxx@db/app": bad`},
		{"app:s3cret@db/app", `missing "=" after "app:s3cret@db/app"`, `missing "=" after "app:xxxxx@db/app"`},
		{"host=db password=s3cret", `bad "host=db password=s3cret"`, `bad "host=db password=xxxxx"`},
		{"host=db password='s 3cret'", `bad "host=db password='s 3cret'"`, `bad "host=db password=xxxxx"`},
		{"postgres://app@db/app", `no password here`, `no password here`},
	} {
		if got := redactDSN(tc.text, tc.dsn); got != tc.want {
			t.Errorf("redactDSN(%q, %q) = %q, want %q", tc.text, tc.dsn, got, tc.want)
		}
	}
}

// The pipeline's own transactions, the claim's and the completer's
// statements included, commit without waiting for the disk, and only
// they: the setting ends with the transaction, so the next user of the
// pooled connection, and every write a client is told is durable
// (outbox.record first), commits durably.
func TestOnlyThePipelinesCommitsSkipTheFlush(t *testing.T) {
	t.Parallel()
	admin, dsn := newTestDB(t)
	var name string
	if err := admin.QueryRow(`SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	// Durable by default, whatever the test server runs with (a throwaway
	// cluster may run without the flush).
	mustExec(t, admin, `ALTER DATABASE `+name+` SET synchronous_commit = on`)
	db, err := newDBPool(dsn) // a new session reads the database's setting
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // one session: a setting that leaked would show
	ctx := context.Background()
	commitSetting := func(what string, begin func() (*sql.Tx, error), work string, args ...any) string {
		t.Helper()
		tx, err := begin()
		if err != nil {
			t.Fatalf("%s: begin: %v", what, err)
		}
		defer tx.Rollback()
		if work != "" {
			if _, err := tx.ExecContext(ctx, work, args...); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		var setting string
		if err := tx.QueryRowContext(ctx, `SHOW synchronous_commit`).Scan(&setting); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return setting
	}
	noOutcomes, err := newOutcomeRows(nil).args(5)
	if err != nil {
		t.Fatal(err)
	}
	pipeline := func() (*sql.Tx, error) { return beginPipelineTx(ctx, db) }
	plain := func() (*sql.Tx, error) { return db.BeginTx(ctx, nil) }
	got := []string{
		commitSetting("a pipeline transaction", pipeline, ""),
		commitSetting("the next transaction on its connection", plain, ""),
		commitSetting("a claim", plain, `SELECT * FROM outbox.claim_due_jobs(1)`),
		commitSetting("a batch of outcomes", plain, recordOutcomesSQL, noOutcomes...),
		commitSetting("a record", plain, `SELECT outbox.record('order.paid', 'o-1', '{}')`),
	}
	if diff := cmp.Diff([]string{"off", "on", "off", "off", "on"}, got); diff != "" {
		t.Errorf("synchronous_commit at commit (-want +got):\n%s", diff)
	}
}
