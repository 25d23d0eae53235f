// privileges_test.go: the database rights outboxd needs and gives
// (docs/security.md, database privileges): outboxd runs as a role that owns only the outbox
// schema, and an application role can record events and do nothing else.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// newRole creates a login role that is not a superuser, dropped when the
// test ends (after its databases: t.Cleanup runs last-in, first-out).
func newRole(t *testing.T, admin *sql.DB, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), harness.seq.Add(1))
	mustExec(t, admin, `CREATE ROLE `+name+` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`)
	t.Cleanup(func() {
		if _, err := admin.Exec(`DROP ROLE IF EXISTS ` + name); err != nil {
			t.Errorf("drop role %s: %v", name, err)
		}
	})
	return name
}

// dsnAs is dsn connecting as user instead, in either of lib/pq's forms.
func dsnAs(dsn, user string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			panic(err)
		}
		u.User = url.User(user)
		return u.String()
	}
	return dsn + " user=" + user
}

// openAs opens a pool on dsn as user, closed when the test ends.
func openAs(t *testing.T, dsn, user string) *sql.DB {
	t.Helper()
	db, err := newDBPool(dsnAs(dsn, user))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func harnessAdmin(t *testing.T) *sql.DB {
	t.Helper()
	admin, err := sql.Open("postgres", harness.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	return admin
}

// What a managed PostgreSQL gives a service: a login role that is no
// superuser and owns one schema. outboxd applies its migrations and runs
// its pipeline with exactly that.
func TestOutboxdRunsAsARoleThatOwnsOnlyItsSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := harnessAdmin(t)
	role := newRole(t, admin, "outboxd_owner")
	name := fmt.Sprintf("outboxd_bare_%d_%d", os.Getpid(), harness.seq.Add(1))
	mustExec(t, admin, `CREATE DATABASE `+name+` TEMPLATE template0`)
	t.Cleanup(func() { admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`) })
	dbAdmin, err := sql.Open("postgres", dsnWithDB(harness.adminDSN, name))
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, dbAdmin, `CREATE SCHEMA outbox AUTHORIZATION `+role)
	dbAdmin.Close()
	dsn := dsnWithDB(harness.adminDSN, name)

	var stderr syncBuffer
	if err := run(ctx, []string{"migrate", "-database-url", dsnAs(dsn, role)}, func(string) string { return "" }, io.Discard, &stderr); err != nil {
		t.Fatalf("migrate as %s: %v\n%s", role, err, stderr.String())
	}

	db := openAs(t, dsn, role)
	var super bool
	if err := db.QueryRow(`SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil || super {
		t.Fatalf("running as a superuser (%v): the test proves nothing", err)
	}
	if _, err := recordEvent(ctx, db, "order.paid", "o-1", nil); err != nil {
		t.Fatal(err)
	}
	logger := testLogger(t)
	subs := defaultSubscribers(true, logger) // -demo's log subscriber: a job for the workers
	if _, err := newRelay(db, defaultConfig().Relay, 18, fanOutTargets(subs), logger).relayOnce(ctx); err != nil {
		t.Fatalf("relay as %s: %v", role, err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.subjects WHERE subject = 'o-1'`); n != 1 {
		t.Fatalf("relay as %s indexed %d entries of subject o-1, want 1", role, n)
	}
	n, err := newWorkerPool(db, defaultConfig().Workers, 0, subs, nil, logger).workOnce(ctx, 10)
	if err != nil || n != 1 {
		t.Fatalf("work as %s: %d jobs, %v; want 1 job", role, n, err)
	}
	if _, err := readOverview(ctx, db, defaultConfig().Alerts); err != nil {
		t.Fatalf("overview as %s: %v", role, err)
	}
	if _, err := newSweeper(db, defaultConfig().Retention, "host-a:1", logger).sweepOnce(ctx); err != nil {
		t.Fatalf("retention as %s: %v", role, err)
	}
}

// An application role granted EXECUTE on outbox.record and on the watch
// triggers' function records events, by call and by trigger, and can read
// or change none of outboxd's tables; a role not granted it cannot record.
func TestApplicationRoleCanRecordAndNothingElse(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	admin := harnessAdmin(t)
	appRole := newRole(t, admin, "outboxd_app")
	otherRole := newRole(t, admin, "outboxd_other")
	for _, q := range []string{
		`CREATE SCHEMA shop AUTHORIZATION ` + appRole,
		`GRANT USAGE ON SCHEMA outbox TO ` + appRole + `, ` + otherRole,
		`GRANT EXECUTE ON FUNCTION outbox.record(text, text, jsonb), outbox.record(text, text, jsonb, text), outbox.watch_row() TO ` + appRole,
	} {
		mustExec(t, db, q)
	}
	// The database's objects must go before its roles can.
	t.Cleanup(func() { db.Exec(`DROP OWNED BY ` + appRole + `, ` + otherRole) })

	app := openAs(t, dsn, appRole)
	for _, q := range []string{
		`CREATE TABLE shop.orders (id bigint PRIMARY KEY, status text NOT NULL, customer text NOT NULL)`,
		`SELECT outbox.watch('shop.orders', 'order.changed', ARRAY['status'], 'customer')`,
		`SELECT outbox.record('order.paid', '1', '{}')`,
		`SELECT outbox.record('order.paid', '1', '{}', 'cust_7')`,
		`INSERT INTO shop.orders VALUES (2, 'new', 'cust_9')`,
	} {
		if _, err := app.Exec(q); err != nil {
			t.Fatalf("as the application role: %s: %v", q, err)
		}
	}
	owners := queryStrings(t, db, `SELECT coalesce(owner, '-') || ' ' || subject FROM outbox.events ORDER BY id`)
	if diff := cmp.Diff([]string{"- 1", "cust_7 1", "cust_9 2"}, owners); diff != "" {
		t.Errorf("events recorded, by call and by trigger, as owner and subject (-want +got):\n%s", diff)
	}

	refused := func(db *sql.DB, q string) {
		t.Helper()
		_, err := db.Exec(q)
		if pq.As(err, pqerror.InsufficientPrivilege) == nil {
			t.Errorf("%s: %v, want permission denied", q, err)
		}
	}
	for _, q := range []string{
		`SELECT count(*) FROM outbox.events`,
		`SELECT secret FROM outbox.endpoints`,
		`SELECT count(*) FROM outbox.jobs`,
		`INSERT INTO outbox.events (topic) VALUES ('forged.event')`,
		`UPDATE outbox.events SET payload = '{}'`,
		`DELETE FROM outbox.inbox`,
	} {
		refused(app, q)
	}
	refused(openAs(t, dsn, otherRole), `SELECT outbox.record('order.paid', '3', '{}')`)
}
