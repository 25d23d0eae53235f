// overview_horizon_test.go: the alerts that watch the whole of vacuum's
// horizon (prepared transactions and replication slots beside open
// sessions) and the retention sweep that stops completing cycles.

package main

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// horizonCluster starts a private cluster that allows what the shared
// test server may not: prepared transactions and logical replication
// slots. It returns the migrated outboxd database.
func horizonCluster(t *testing.T) *sql.DB {
	t.Helper()
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		// The server runs as postgres and must reach the folder.
		os.Chmod(filepath.Dir(dir), 0o755)
		os.Chmod(dir, 0o755)
	}
	c, err := startCluster(context.Background(), dir, slog.New(slog.NewTextHandler(io.Discard, nil)),
		"max_prepared_transactions=5", "wal_level=logical", "fsync=off")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	db, err := newDBPool(c.DSN("outboxd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// oldTransactionMessages are the messages of the old_transaction alerts
// the overview raises now.
func oldTransactionMessages(t *testing.T, db *sql.DB, cfg AlertConfig) []string {
	t.Helper()
	o, err := readOverview(context.Background(), db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, a := range o.Alerts {
		if a.Name == "old_transaction" {
			msgs = append(msgs, a.Message)
		}
	}
	return msgs
}

func mentioning(msgs []string, s string) bool {
	for _, m := range msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// A prepared transaction and a replication slot hold back vacuum as an
// open session does, and no session shows either: old_transaction names
// each, and stops when it is gone.
func TestOldTransactionSeesPreparedTransactionsAndSlots(t *testing.T) {
	t.Parallel()
	db := horizonCluster(t)
	cfg := defaultConfig().Alerts
	cfg.XactAge = time.Millisecond

	// A transaction with an id, prepared for two-phase commit: its
	// session may end, the transaction stays.
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{`BEGIN`, `SELECT txid_current()`, `PREPARE TRANSACTION 'outboxd-test-gid'`} {
		if _, err := conn.ExecContext(context.Background(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	conn.Close()
	waitFor(t, "old_transaction to name the prepared transaction", 10*time.Second, func() bool {
		return mentioning(oldTransactionMessages(t, db, cfg), "outboxd-test-gid")
	})
	if o, err := readOverview(context.Background(), db, cfg); err != nil || o.OldestPreparedXact == nil || o.OldestPreparedXact.GID != "outboxd-test-gid" {
		t.Errorf("overview's oldest prepared transaction %+v (%v), want outboxd-test-gid", o.OldestPreparedXact, err)
	}
	mustExec(t, db, `ROLLBACK PREPARED 'outboxd-test-gid'`)
	if msgs := oldTransactionMessages(t, db, cfg); mentioning(msgs, "outboxd-test-gid") {
		t.Errorf("after ROLLBACK PREPARED, old_transaction still names it: %q", msgs)
	}

	// A logical slot keeps a catalog_xmin from its creation; with no
	// consumer connected nothing will ever advance it.
	mustExec(t, db, `SELECT pg_create_logical_replication_slot('outboxd_test_slot', 'pgoutput')`)
	if msgs := oldTransactionMessages(t, db, cfg); !mentioning(msgs, "outboxd_test_slot") {
		t.Errorf("old_transaction with an unconsumed logical slot: %q, want it named", msgs)
	}
	o, err := readOverview(context.Background(), db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.ReplicationSlots) != 1 || o.ReplicationSlots[0].Name != "outboxd_test_slot" || o.ReplicationSlots[0].Type != "logical" ||
		o.ReplicationSlots[0].Active || o.ReplicationSlots[0].XminAge != nil || o.ReplicationSlots[0].CatalogXminAge == nil {
		t.Errorf("overview's replication slots %+v, want the inactive logical slot with a catalog_xmin", o.ReplicationSlots)
	}
	mustExec(t, db, `SELECT pg_drop_replication_slot('outboxd_test_slot')`)
	if msgs := oldTransactionMessages(t, db, cfg); mentioning(msgs, "outboxd_test_slot") {
		t.Errorf("after the slot was dropped, old_transaction still names it: %q", msgs)
	}
}

// A retention sweep that hangs, or never runs, records no failure: it
// records nothing. retention_failed fires too when no cycle has completed
// within 3 intervals of the last one, or of the oldest live replica's
// start when none ever has.
func TestRetentionFailedWhenNoCycleCompletesWithinThreeIntervals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	cfg := defaultConfig()
	if cfg.Retention.Interval != time.Hour {
		t.Fatalf("default retention interval %s, want 1h", cfg.Retention.Interval)
	}
	names := func() []string {
		t.Helper()
		o, err := readOverview(ctx, db, cfg.Alerts)
		if err != nil {
			t.Fatal(err)
		}
		return alertNamesOf(o.Alerts)
	}
	mustExec(t, db, `INSERT INTO outbox.replicas (host, pid, version, workers, listens, dead_after, started_at)
		VALUES ('host-a', 1, '0.0.0', 64, true, interval '15 seconds', now() - 3 * interval '1 hour' + interval '1 minute')`)
	if diff := cmp.Diff([]string{}, names()); diff != "" {
		t.Errorf("a replica up for less than 3 intervals, no cycle yet (-want +got):\n%s", diff)
	}
	mustExec(t, db, `UPDATE outbox.replicas SET started_at = now() - 3 * interval '1 hour' - interval '1 minute'`)
	if diff := cmp.Diff([]string{"retention_failed"}, names()); diff != "" {
		t.Errorf("a replica up for 3 intervals, no cycle ever (-want +got):\n%s", diff)
	}

	newSweeper(db, cfg.Retention, "host-a:1", testLogger(t)).cycle(ctx)
	if diff := cmp.Diff([]string{}, names()); diff != "" {
		t.Errorf("after a cycle (-want +got):\n%s", diff)
	}
	mustExec(t, db, `UPDATE outbox.retention_last_cycle SET finished_at = now() - 3 * interval '1 hour' - interval '1 minute'`)
	if diff := cmp.Diff([]string{"retention_failed"}, names()); diff != "" {
		t.Errorf("the last cycle 3 intervals ago (-want +got):\n%s", diff)
	}
	mustExec(t, db, `UPDATE outbox.replicas SET swept_at = now() - interval '1 minute'`)
	if diff := cmp.Diff([]string{}, names()); diff != "" {
		t.Errorf("a replica's sweeper ran a cycle a minute ago (-want +got):\n%s", diff)
	}
}

// The new causes of old_transaction and retention_failed at their edges:
// a prepared transaction is held to -alert-xact-age as a session's is; a
// slot fires while no consumer is connected, whatever its age; a sweep is
// awaited for 3 intervals, and never with sweeps off (interval 0) or
// nothing known of any.
func TestHorizonAndRetentionAlertEdges(t *testing.T) {
	t.Parallel()
	cfg := AlertConfig{XactAge: time.Hour, RetentionInterval: time.Hour}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	awaited := func(ago time.Duration) alertStarts {
		return alertStarts{Now: now, SweepAwaited: sql.NullTime{Time: now.Add(-ago), Valid: true}}
	}
	slot := func(active bool) Overview {
		return Overview{ReplicationSlots: []SlotHold{{Name: "s", Type: "physical", Active: active, XminAge: new(int64(1_000_000))}}}
	}
	for _, tc := range []struct {
		name string
		cfg  AlertConfig
		o    Overview
		at   alertStarts
		want []string
	}{
		{"a prepared transaction past the threshold", cfg, Overview{OldestPreparedXact: &PreparedXact{GID: "g", AgeSeconds: 3601}}, awaited(0), []string{"old_transaction"}},
		{"a prepared transaction at the threshold", cfg, Overview{OldestPreparedXact: &PreparedXact{GID: "g", AgeSeconds: 3600}}, awaited(0), []string{}},
		{"a slot without a consumer", cfg, slot(false), awaited(0), []string{"old_transaction"}},
		{"a slot with its consumer connected", cfg, slot(true), awaited(0), []string{}},
		{"a cycle 3 intervals ago", cfg, Overview{}, awaited(3 * time.Hour), []string{}},
		{"a cycle 3 intervals and a second ago", cfg, Overview{}, awaited(3*time.Hour + time.Second), []string{"retention_failed"}},
		{"sweeps off", AlertConfig{XactAge: time.Hour}, Overview{}, awaited(100 * time.Hour), []string{}},
		{"nothing known of any cycle or replica", cfg, Overview{}, alertStarts{Now: now}, []string{}},
	} {
		got := alertNamesOf(evaluateAlerts(tc.cfg, tc.o, tc.at))
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}
