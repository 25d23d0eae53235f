// migrations_test.go: what a database has of the migrations, and the two
// ways outboxd serves teams that apply DDL with their own tools: the SQL
// it prints, and a start that refuses a schema not at its release.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// applyPrinted runs printed SQL as a migration tool would: statement by
// statement, each on its own (the online ones cannot run in a
// transaction), on one connection (BEGIN and COMMIT hold across them).
func applyPrinted(t *testing.T, db *sql.DB, printed string) {
	t.Helper()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, s := range splitSQL(printed) {
		if _, err := conn.ExecContext(context.Background(), s.text); err != nil {
			t.Fatalf("%s: %v", s.label("the printed SQL"), err)
		}
	}
}

// The SQL printed for a release brings a database of that release to
// this one, recorded as outboxd records it: the same catalog as a fresh
// install, every migration recorded finished, and a start with
// migrations off accepts it.
func TestPrintedSQLBringsADatabaseOfAReleaseToThisOne(t *testing.T) {
	t.Parallel()
	m := newMigration(nil)
	first := m
	first.files = m.files[:1]
	old := migratedFromTheFirstFile(t, first) // a database of 0.1.0, as 0.1.0 left it

	var printed bytes.Buffer
	if err := printMigrationSQL(&printed, m, "0.1.0"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-- migrations/002_0.2.0.sql\nBEGIN;", "-- migrations/003_0.3.0.sql, outside any transaction\nCREATE INDEX CONCURRENTLY"} {
		if !strings.Contains(printed.String(), want) {
			t.Errorf("the printed SQL lacks %q", want)
		}
	}
	if strings.Contains(printed.String(), "001_0.1.0.sql\nBEGIN") {
		t.Error("the SQL printed from 0.1.0 applies 0.1.0's own file again")
	}
	applyPrinted(t, old, printed.String())

	if keys, diff := catalogDrift(t, installedFresh(t, m), old); len(keys) > 0 {
		t.Errorf("after the printed SQL the catalog differs in %s (-fresh +printed):\n%s", strings.Join(keys, ", "), diff)
	}
	for _, f := range m.files {
		if got := migrationFinished(t, old, f.version); got != "finished" {
			t.Errorf("after the printed SQL, %s is %s, want finished", f.name, got)
		}
	}
	if err := requireMigrated(context.Background(), old, errMigrationsOff); err != nil {
		t.Errorf("a start with migrations off, after the printed SQL: %v", err)
	}
}

// A database that has every migration prints nothing to apply; an empty
// one prints schema.sql.
func TestPrintedSQLOfADatabaseSaysWhatItLacks(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var printed bytes.Buffer
	if err := printDatabaseMigrationSQL(context.Background(), &printed, db); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(printed.String(), "-- Nothing: it is at release "+version) || strings.Contains(printed.String(), "\nBEGIN;") {
		t.Errorf("a database at this release prints:\n%s", printed.String())
	}

	empty, _ := newEmptyTestDB(t)
	printed.Reset()
	if err := printDatabaseMigrationSQL(context.Background(), &printed, empty); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(printed.String(), "-- schema.sql\nBEGIN;") {
		t.Errorf("an empty database prints no schema.sql:\n%.300s", printed.String())
	}
	if n := queryInt(t, empty, `SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'`); n != 0 {
		t.Error("printing the SQL created schema outbox: it must change nothing")
	}
	applyPrinted(t, empty, printed.String())
	if diff := cmp.Diff(schemaCatalog(t, db), schemaCatalog(t, empty)); diff != "" {
		t.Errorf("schema.sql as printed and applied, against a fresh install (-fresh +printed):\n%s", diff)
	}
}

// With migrations off, a start on a database that lacks a migration
// fails before it serves, naming what is missing and what to run; it
// applies nothing. Through the command line, as an operator starts it.
func TestMigrationsOffRefusesASchemaNotAtThisRelease(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	last := embeddedMigrations()[len(embeddedMigrations())-1]
	mustExec(t, db, `DELETE FROM outbox.migrations WHERE version = $1`, last.version)

	err := run(context.Background(), []string{"-database-url", dsn, "-migrate=false", "-database-wait", "0", "-addr", "127.0.0.1:0"},
		envFrom(nil), io.Discard, testWriter{t})
	for _, want := range []string{"lacks " + last.name + " of release " + version, "-migrate=false", "outboxd migrate -print-sql"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a start with migrations off on a database without %s: %v; want an error saying %q", last.name, err, want)
		}
	}
	if got := migrationFinished(t, db, last.version); got != "absent" {
		t.Errorf("the refused start recorded %s: %s", last.name, got)
	}

	var printed bytes.Buffer
	if err := run(context.Background(), []string{"migrate", "-print-sql", "-database-url", dsn, "-database-wait", "0"},
		envFrom(nil), &printed, testWriter{t}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(printed.String(), "-- migrations/"+last.name+"\nBEGIN;") || strings.Contains(printed.String(), "-- migrations/005_") {
		t.Errorf("outboxd migrate -print-sql prints, for a database without %s alone:\n%.400s", last.name, printed.String())
	}
	if got := migrationFinished(t, db, last.version); got != "absent" {
		t.Errorf("printing the SQL recorded %s: %s", last.name, got)
	}
}

// A database that records a migration this binary does not have (a
// newer release's), or has otherwise (a shipped file changed), is refused
// by name rather than migrated.
func TestMigrationRefusesAHistoryItDoesNotShare(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	m := newMigration(nil)
	next := m.withNext(`SELECT 1`)
	if err := next.run(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	err := m.run(context.Background(), db)
	if err == nil || !strings.Contains(err.Error(), "the database has migration "+nextName()+", newer than this binary's release "+version) {
		t.Errorf("this release on a database of the next: %v, want a refusal naming %s", err, nextName())
	}

	changed := next
	changed.files = append([]migrationFile(nil), next.files...)
	changed.files[1].checksum = strings.Repeat("0", 64)
	err = changed.run(context.Background(), db)
	if err == nil || !strings.Contains(err.Error(), "migrations/"+changed.files[1].name+" was applied here with checksum") {
		t.Errorf("a binary whose %s differs from the one applied: %v, want a refusal naming it", changed.files[1].name, err)
	}
}
