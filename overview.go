// overview.go: what the operator must see, read from the database: backlog,
// poison, job states, the live replicas, table sizes and health, and the
// alerts they raise.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// AlertConfig holds the alert thresholds.
type AlertConfig struct {
	// BacklogRows and BacklogAge: the seed's numbers. A healthy relay keeps
	// the backlog near zero and fans out within a second; 1,000 rows or a
	// five-minute-old event means it is stuck or outpaced.
	BacklogRows int
	BacklogAge  time.Duration
	// DeadRatio: the events and jobs tables are vacuumed after 2% dead
	// rows (schema.sql), PostgreSQL's default is 20%; a queue table past
	// that is one vacuum is not keeping up with, and its claims slow
	// down as they walk dead index entries.
	DeadRatio float64
	// XactAge: every statement of outboxd's takes well under a second. A
	// transaction holding a snapshot for an hour keeps vacuum from
	// removing any row deleted since it began, in every table; the
	// queue tables bloat for as long as it stays open.
	XactAge time.Duration
	// ResendHorizon is this sender's resend horizon (resendHorizon,
	// replay.go; 0: unbounded), derived from events retention and the
	// attempts, not a setting of its own: receiver_window_short fires for
	// an endpoint whose receiver advertises a dedup window it outlasts.
	ResendHorizon time.Duration
	// RetentionInterval is the retention sweep's cadence
	// (-retention-interval), not a setting of its own: retention_failed
	// fires when no cycle has completed for retentionStaleIntervals of
	// it. 0: no sweeps are expected, and none is missed.
	RetentionInterval time.Duration
	// AuthFailures is how many wrong admin tokens this process was sent
	// within authFailureWindow (authMetrics, counters.go), not a setting:
	// the HTTP side sets it, and auth_failures fires on it. Nil: none
	// are counted (a test's overview).
	AuthFailures func() int64
	// EndpointSuccessBelow and EndpointFailingFor: endpoint_failing fires
	// for an endpoint whose attempts succeeded less than this share of
	// the time over the last EndpointFailingFor, with failed attempts at
	// both ends of it (to the minute: delivery_stats counts by minute),
	// or whose circuit breaker is open. Half keeps a receiver that
	// answers most requests off the alert, and three minutes is past a
	// deploy's restart of a receiver and well before the breaker's
	// backoff makes its deliveries hours late.
	EndpointSuccessBelow float64
	EndpointFailingFor   time.Duration
	// ClientCertExpiry: client_certificate_expiring fires this long
	// before an endpoint's client certificate expires. Two weeks are ten
	// working days to have a new one issued, often by another team's CA,
	// before the receiver refuses every delivery.
	ClientCertExpiry time.Duration
}

// bloatMinDeadRows is the least dead rows a table_bloat alert is raised
// for: below it a table is too small for its dead rows to cost anything,
// and a ratio of a few rows would flap.
const bloatMinDeadRows = 10_000

// Overview is GET /api/overview and the top of the panel.
type Overview struct {
	// Backlog is the relay's: events not yet fanned out. DeliveryBacklog
	// is the workers', beside it: jobs not yet finished (due now,
	// scheduled later or running), so that a relay keeping up is not
	// taken for deliveries keeping up.
	Backlog                  int64          `json:"backlog"`
	DeliveryBacklog          int64          `json:"delivery_backlog"`
	Poisoned                 int64          `json:"poisoned"`
	OldestUnfannedAgeSeconds float64        `json:"oldest_unfanned_age_seconds"`
	Jobs                     JobCounts      `json:"jobs"`
	Endpoints                EndpointCounts `json:"endpoints"`
	TableBytes               TableBytes     `json:"table_bytes"`
	Tables                   []TableHealth  `json:"tables"`
	OldestXactAgeSeconds     float64        `json:"oldest_xact_age_seconds"`
	// OldestPreparedXact is the oldest transaction of this database
	// prepared for two-phase commit (nil: none). Until it is committed or
	// rolled back it holds back vacuum as an open one does, and no session
	// shows it: it outlives the session that prepared it, and restarts.
	OldestPreparedXact *PreparedXact `json:"oldest_prepared_xact"`
	// ReplicationSlots are the cluster's slots that keep an xmin or a
	// catalog_xmin, the oldest first, at most maxListedSlots: a slot's
	// xmin holds back vacuum in every database, its catalog_xmin (a
	// logical slot's) the system catalogs', for as long as it stays.
	ReplicationSlots []SlotHold `json:"replication_slots"`
	// NotifyQueueUsage is the share (0..1) of PostgreSQL's 8 GB NOTIFY queue
	// in use. A full queue makes every transaction that notifies fail at
	// COMMIT, and outbox.record notifies: business writes would fail. It
	// fills when a listening session stops reading (idle in transaction).
	NotifyQueueUsage float64 `json:"notify_queue_usage"`
	// RetentionLastCycle is the last retention cycle any replica ran; nil
	// before the first.
	RetentionLastCycle *RetentionCycle `json:"retention_last_cycle"`
	// ReceiverWindows are the dedup windows the receivers of enabled
	// endpoints advertised, shortest first, at most maxReceiverWindows.
	ReceiverWindows []ReceiverWindow `json:"receiver_windows"`
	// ClientCertificates are the client certificates of endpoints not
	// disabled (clientcert.go), the soonest to expire first, at most
	// maxReceiverWindows.
	ClientCertificates []ClientCertificateExpiry `json:"client_certificates"`
	// Replicas are the live replicas (replicas.go), oldest first, with
	// what each runs; MixedVersions says they run more than one build:
	// release, revision or schema (a rolling upgrade in progress, or one
	// left halfway).
	Replicas      []Replica `json:"replicas"`
	MixedVersions bool      `json:"mixed_versions"`
	// KindsWithoutRunner are the kinds of the due jobs of no endpoint that
	// no live replica runs (replicas.go, noRunnerSQL), by kind, at most
	// maxKindsWithoutRunner: no replica claims them, and they wait for one
	// that runs them, which jobs_no_runner asks for.
	KindsWithoutRunner []KindWithoutRunner `json:"kinds_without_runner"`
	// EndpointHealth are the enabled, paused and disabled endpoints in
	// trouble (breaker open, failing, or a failed attempt within
	// EndpointFailingFor), by id, at most maxEndpointHealth, each with
	// Health decided: "failing" (endpoint_failing fires for it) or
	// "degraded".
	EndpointHealth []EndpointHealth `json:"endpoint_health"`
	Alerts         []Alert          `json:"alerts"`
	Pruned         map[string]int64 `json:"pruned"`
}

// KindWithoutRunner is a job kind that no live replica runs, with its
// due jobs, which wait: how many, and when the first of them came due.
type KindWithoutRunner struct {
	Kind  string    `json:"kind"`
	Jobs  int64     `json:"jobs"`
	Since time.Time `json:"since"`
}

func scanKindWithoutRunner(row rowScanner) (KindWithoutRunner, error) {
	var k KindWithoutRunner
	err := row.Scan(&k.Kind, &k.Jobs, &k.Since)
	return k, err
}

// maxKindsWithoutRunner bounds the overview's list of kinds without a
// runner: a process runs a few kinds, and an alert naming more than this
// is read for its first ones.
const maxKindsWithoutRunner = 20

// ReceiverWindow is the dedup window an endpoint's receiver advertised.
type ReceiverWindow struct {
	EndpointID int64 `json:"endpoint_id"`
	Seconds    int64 `json:"seconds"`
}

// ClientCertificateExpiry is when an endpoint's client certificate
// expires.
type ClientCertificateExpiry struct {
	EndpointID int64     `json:"endpoint_id"`
	NotAfter   time.Time `json:"not_after"`
}

func scanClientCertificateExpiry(row rowScanner) (ClientCertificateExpiry, error) {
	var c ClientCertificateExpiry
	err := row.Scan(&c.EndpointID, &c.NotAfter)
	return c, err
}

// maxReceiverWindows bounds the overview's list of receivers' windows;
// read shortest first, it holds every short one unless more endpoints
// than that are short.
const maxReceiverWindows = 100

// JobCounts is the number of jobs in each state. Completed jobs leave
// the queue: Completed is the deliveries that succeeded in the last 24 h
// (outbox.delivery_stats), with any completed job a replica of the
// release before left in the queue.
type JobCounts struct {
	Available int64 `json:"available"`
	Running   int64 `json:"running"`
	Retryable int64 `json:"retryable"`
	Completed int64 `json:"completed"`
	Discarded int64 `json:"discarded"`
	// DueNow, ScheduledLater and HeldByPause split the jobs waiting to
	// run (available and retryable), each in one: those whose time has
	// come, those whose time is later (every backoff, a failing endpoint's
	// new deliveries, an ordered lane's held turn), and those of a paused
	// endpoint, whenever due (EndpointCounts.PausedQueued), which run only
	// once it is resumed. So a large "available" with nothing running is
	// not taken for a stall, nor a pause's deliveries for one.
	DueNow         int64 `json:"due_now"`
	ScheduledLater int64 `json:"scheduled_later"`
	HeldByPause    int64 `json:"held_by_pause"`
}

// EndpointCounts is the number of endpoints in each state.
type EndpointCounts struct {
	Enabled  int64 `json:"enabled"`
	Failing  int64 `json:"failing"`
	Paused   int64 `json:"paused"`
	Disabled int64 `json:"disabled"`
	// PausedQueued is how many deliveries the paused endpoints hold.
	PausedQueued int64 `json:"paused_queued"`
}

// TableBytes is each table's total size on disk: heap, indexes and TOAST.
type TableBytes struct {
	Events int64 `json:"events"`
	Jobs   int64 `json:"jobs"`
	Inbox  int64 `json:"inbox"`
}

// TableHealth is how vacuum keeps up with one of outboxd's tables. Queue
// tables on PostgreSQL degrade through dead tuples and a held-back xmin
// horizon long before they run out of disk.
type TableHealth struct {
	Name           string     `json:"name"`
	LiveRows       int64      `json:"live_rows"`
	DeadRows       int64      `json:"dead_rows"`
	DeadRatio      float64    `json:"dead_ratio"`
	LastAutovacuum *time.Time `json:"last_autovacuum"`
	IndexBytes     int64      `json:"index_bytes"`
	TotalBytes     int64      `json:"total_bytes"`
}

// The panel's table list shows a table once it has tableShownMinRows
// rows (live and dead) or tableShownMinBytes on disk: a table of fifty
// rows that is 98% dead costs nothing, and its ratio only hides the ones
// that matter. The row bound is table_bloat's (bloatMinDeadRows).
const (
	tableShownMinRows  = bloatMinDeadRows
	tableShownMinBytes = 64 << 20
)

// Matters says whether the panel lists h (tableShownMinRows).
func (h TableHealth) Matters() bool {
	return h.LiveRows+h.DeadRows >= tableShownMinRows || h.TotalBytes >= tableShownMinBytes
}

// smallTables is what the panel says of the tables it does not list: how
// many, and their size in all.
type smallTables struct {
	Count int
	Bytes int64
}

// SmallTables sums the tables the panel does not list (Matters).
func (o Overview) SmallTables() smallTables {
	var st smallTables
	for _, h := range o.Tables {
		if !h.Matters() {
			st.Count++
			st.Bytes += h.TotalBytes
		}
	}
	return st
}

// PreparedXact is a transaction prepared for two-phase commit.
type PreparedXact struct {
	GID        string  `json:"gid"`
	AgeSeconds float64 `json:"age_seconds"`
}

// SlotHold is a replication slot that holds back vacuum's horizon. Ages
// are in transactions (PostgreSQL's age()), nil for what the slot does
// not keep: a slot records no time, and until PostgreSQL 17 not even
// since when it is unused.
type SlotHold struct {
	Name           string `json:"name"`
	Type           string `json:"type"` // physical or logical
	Active         bool   `json:"active"`
	XminAge        *int64 `json:"xmin_age"`
	CatalogXminAge *int64 `json:"catalog_xmin_age"`
}

// maxListedSlots bounds the overview's list of slots: a cluster has a
// few, and the oldest come first.
const maxListedSlots = 20

// RetentionCycle is the outcome of one retention cycle.
type RetentionCycle struct {
	FinishedAt time.Time `json:"finished_at"`
	Error      string    `json:"error"` // empty: it succeeded
}

// Alert is a condition that needs a person.
type Alert struct {
	Name    string    `json:"name"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
	// Level is how bad the condition is, in the alert's own unit (events
	// waiting, jobs discarded, dead rows ...): it rises when the
	// condition gets worse. An acknowledgement holds up to the level it
	// was given at.
	Level int64 `json:"level"`
	// Acknowledged says an operator has seen this alert at this level or
	// worse, in this episode of it; it stays listed, and fires again when
	// the level rises or a new episode begins.
	Acknowledged   bool       `json:"acknowledged"`
	AcknowledgedAt *time.Time `json:"acknowledged_at,omitempty"`
	// Link is the panel page that shows what the alert counts: the rows
	// to act on, or the figures it was raised from.
	Link string `json:"link"`
	// startKnown says Since is when the condition began, so an episode
	// that begins after an acknowledgement is a new one; alerts that know
	// no start (their Since is now) are acknowledged by level alone.
	startKnown bool
}

// alertView is an alert as the overview lists it, with an HTML id of its
// own: alert-<name> for the first firing of a name, alert-<name>-2 and on
// for the next (endpoint_failing fires once an endpoint), so that a link
// or a test names one.
type alertView struct {
	Alert
	HTMLID string
}

// AlertViews is the overview's alerts, each with its HTML id.
func (o Overview) AlertViews() []alertView {
	seen := map[string]int{}
	views := make([]alertView, len(o.Alerts))
	for i, a := range o.Alerts {
		seen[a.Name]++
		views[i] = alertView{Alert: a, HTMLID: "alert-" + a.Name}
		if n := seen[a.Name]; n > 1 {
			views[i].HTMLID = fmt.Sprintf("alert-%s-%d", a.Name, n)
		}
	}
	return views
}

// overviewEventsSQL reads the backlog through the claim's partial index and
// the poisoned rows through theirs.
const overviewEventsSQL = `
SELECT (SELECT count(*) FROM outbox.events
        WHERE fanned_out_at IS NULL AND poisoned_at IS NULL),
       (SELECT min(created_at) FROM outbox.events
        WHERE fanned_out_at IS NULL AND poisoned_at IS NULL),
       (SELECT count(*) FROM outbox.events WHERE poisoned_at IS NOT NULL),
       (SELECT min(poisoned_at) FROM outbox.events WHERE poisoned_at IS NOT NULL),
       now()`

// The states are counted as scanEndpoint derives them; the deliveries a
// paused endpoint holds are counted through its lane's index.
const overviewEndpointsSQL = `
SELECT count(*) FILTER (WHERE disabled_at IS NULL AND paused_at IS NULL AND failing_since IS NULL),
       count(*) FILTER (WHERE disabled_at IS NULL AND paused_at IS NULL AND failing_since IS NOT NULL),
       count(*) FILTER (WHERE disabled_at IS NULL AND paused_at IS NOT NULL),
       count(*) FILTER (WHERE disabled_at IS NOT NULL),
       min(disabled_at),
       min(paused_at) FILTER (WHERE disabled_at IS NULL),
       coalesce(sum((SELECT count(*) FROM outbox.jobs AS j
                     WHERE j.endpoint_id = ep.id AND j.state IN ('available', 'retryable')))
                FILTER (WHERE disabled_at IS NULL AND paused_at IS NOT NULL), 0)
FROM outbox.endpoints AS ep`

// overviewReceiverWindowsSQL reads the shortest dedup windows receivers
// advertised, of endpoints that still get deliveries.
const overviewReceiverWindowsSQL = `
SELECT id, dedup_window_seconds
FROM outbox.endpoints
WHERE dedup_window_seconds IS NOT NULL
  AND disabled_at IS NULL
ORDER BY dedup_window_seconds, id
LIMIT $1`

// overviewClientCertificatesSQL reads the client certificates of
// endpoints that still get deliveries, the soonest to expire first.
const overviewClientCertificatesSQL = `
SELECT id, client_certificate_expires_at
FROM outbox.endpoints
WHERE client_certificate_expires_at IS NOT NULL
  AND disabled_at IS NULL
ORDER BY client_certificate_expires_at, id
LIMIT $1`

// overviewJobsSQL counts jobs by state: in all, those scheduled later,
// and those whose endpoint is paused (held, due or not: a paused endpoint
// is claimed from only once resumed), each job in one of the two or
// neither.
const overviewJobsSQL = `
SELECT j.state::text,
       count(*),
       count(*) FILTER (WHERE j.scheduled_at > now() AND paused.id IS NULL),
       count(*) FILTER (WHERE paused.id IS NOT NULL),
       min(j.finalized_at)
FROM outbox.jobs AS j
LEFT JOIN outbox.endpoints AS paused ON paused.id = j.endpoint_id
                                    AND paused.paused_at IS NOT NULL
                                    AND paused.disabled_at IS NULL
GROUP BY j.state`

// overviewNoRunnerSQL counts, by kind, the due jobs of no endpoint whose
// kind no live replica runs, through the claim's own index of them
// (jobs_waiting_without_endpoint). A delivery to an endpoint is of kind
// webhook, which every replica's workers run (main.go, newPipeline).
const overviewNoRunnerSQL = `
SELECT j.kind, count(*), min(j.scheduled_at)
FROM outbox.jobs AS j
WHERE j.state IN ('available', 'retryable')
  AND j.endpoint_id IS NULL
  AND j.scheduled_at <= now()
  AND ` + noRunnerSQL + `
GROUP BY j.kind
ORDER BY j.kind
LIMIT $1`

// overviewTablesSQL reads size and vacuum statistics of outboxd's tables.
const overviewTablesSQL = `
SELECT c.relname,
       coalesce(s.n_live_tup, 0),
       coalesce(s.n_dead_tup, 0),
       greatest(s.last_autovacuum, s.last_vacuum),
       pg_indexes_size(c.oid),
       pg_total_relation_size(c.oid)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE n.nspname = 'outbox'
  AND c.relkind = 'r'
ORDER BY c.relname`

// oldestXactSQL is the age of the oldest transaction in this database that
// holds a snapshot: while it is open, vacuum cannot remove any row deleted
// after it began, in every table.
const oldestXactSQL = `
SELECT coalesce(extract(epoch FROM max(now() - xact_start)), 0)::float8
FROM pg_stat_activity
WHERE datname = current_database()
  AND backend_xmin IS NOT NULL
  AND pid <> pg_backend_pid()`

// oldestPreparedSQL is this database's oldest prepared transaction. One
// of another database holds back only that database's horizon, as a
// session there does.
const oldestPreparedSQL = `
SELECT gid, extract(epoch FROM now() - prepared)::float8
FROM pg_prepared_xacts
WHERE database = current_database()
ORDER BY prepared
LIMIT 1`

// replicationSlotsSQL lists the slots that keep an xmin or a
// catalog_xmin, in every database of the cluster: a slot's xmin holds
// back every database's horizon.
const replicationSlotsSQL = `
SELECT slot_name, slot_type, active, age(xmin), age(catalog_xmin)
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
ORDER BY greatest(age(xmin), age(catalog_xmin)) DESC, slot_name
LIMIT $1`

// retentionSweptSQL reads when a retention cycle last completed, by any
// replica (the last cycle's row, and each replica's swept_at, stamped by
// its heartbeat: one survives the other's write failing), and since when
// the replicas running now have been up, with the clock both are stamped
// by.
const retentionSweptSQL = `
SELECT now(),
       greatest((SELECT finished_at FROM outbox.retention_last_cycle),
                (SELECT max(swept_at) FROM outbox.replicas)),
       (SELECT min(started_at) FROM outbox.replicas)`

// readOverview gathers the overview in a read-only, repeatable-read
// transaction, so all its numbers describe one moment, and decides the
// alerts they raise.
func readOverview(ctx context.Context, db *sql.DB, alerts AlertConfig) (Overview, error) {
	var o Overview
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return o, fmt.Errorf("overview: %w", err)
	}
	defer tx.Rollback()

	starts, err := readPipelineState(ctx, tx, &o)
	if err != nil {
		return o, err
	}
	if err := readDatabaseHealth(ctx, tx, &o, &starts); err != nil {
		return o, err
	}
	if o.EndpointHealth, err = readEndpointHealth(ctx, tx, alerts, 0, starts.Now); err != nil {
		return o, fmt.Errorf("overview: %w", err)
	}
	o.Alerts = evaluateAlerts(alerts, o, starts)
	acks, err := queryAll(ctx, tx, scanAlertAck, alertAcksSQL)
	if err != nil {
		return o, fmt.Errorf("overview: acknowledgements: %w", err)
	}
	applyAcks(o.Alerts, acks)
	return o, nil
}

// readPipelineState reads into o where the events and the jobs stand: the
// backlog and the poisoned events, the endpoints by state and the windows
// their receivers advertised, the live replicas, and the jobs by state;
// with when each condition an alert counts began.
func readPipelineState(ctx context.Context, tx *sql.Tx, o *Overview) (alertStarts, error) {
	var starts alertStarts
	var now time.Time
	if err := tx.QueryRowContext(ctx, overviewEventsSQL).Scan(
		&o.Backlog, &starts.OldestUnfanned, &o.Poisoned, &starts.FirstPoisoned, &now); err != nil {
		return starts, fmt.Errorf("overview: events: %w", err)
	}
	if starts.OldestUnfanned.Valid {
		o.OldestUnfannedAgeSeconds = max(now.Sub(starts.OldestUnfanned.Time).Seconds(), 0)
	}
	if err := tx.QueryRowContext(ctx, overviewEndpointsSQL).Scan(
		&o.Endpoints.Enabled, &o.Endpoints.Failing, &o.Endpoints.Paused, &o.Endpoints.Disabled,
		&starts.FirstDisabled, &starts.FirstPaused, &o.Endpoints.PausedQueued); err != nil {
		return starts, fmt.Errorf("overview: endpoints: %w", err)
	}
	var err error
	if o.ReceiverWindows, err = queryAll(ctx, tx, scanReceiverWindow, overviewReceiverWindowsSQL, maxReceiverWindows); err != nil {
		return starts, fmt.Errorf("overview: receivers' windows: %w", err)
	}
	if o.ClientCertificates, err = queryAll(ctx, tx, scanClientCertificateExpiry, overviewClientCertificatesSQL, maxReceiverWindows); err != nil {
		return starts, fmt.Errorf("overview: client certificates: %w", err)
	}
	if o.Replicas, o.MixedVersions, err = readReplicas(ctx, tx); err != nil {
		return starts, fmt.Errorf("overview: %w", err)
	}
	if o.KindsWithoutRunner, err = queryAll(ctx, tx, scanKindWithoutRunner, overviewNoRunnerSQL, maxKindsWithoutRunner); err != nil {
		return starts, fmt.Errorf("overview: kinds without a runner: %w", err)
	}
	if o.Jobs, starts.FirstDiscarded, err = readJobCounts(ctx, tx); err != nil {
		return starts, err
	}
	o.DeliveryBacklog = o.Jobs.Available + o.Jobs.Retryable + o.Jobs.Running
	return starts, nil
}

// readDatabaseHealth reads into o how the database keeps up: the tables'
// sizes and dead rows, what holds vacuum back, the NOTIFY queue, and the
// last retention cycle, with when a cycle was last seen into starts.
func readDatabaseHealth(ctx context.Context, tx *sql.Tx, o *Overview, starts *alertStarts) error {
	var err error
	if o.Tables, err = readTableHealth(ctx, tx); err != nil {
		return err
	}
	for _, h := range o.Tables {
		switch h.Name {
		case "events":
			o.TableBytes.Events = h.TotalBytes
		case "jobs":
			o.TableBytes.Jobs = h.TotalBytes
		case "inbox":
			o.TableBytes.Inbox = h.TotalBytes
		}
	}
	if err := readHorizonHolders(ctx, tx, o); err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, `SELECT pg_notification_queue_usage()`).Scan(&o.NotifyQueueUsage); err != nil {
		return fmt.Errorf("overview: notification queue: %w", err)
	}
	return readRetention(ctx, tx, o, starts)
}

// readHorizonHolders reads into o what holds back vacuum's horizon: the
// oldest open transaction of a session, the oldest prepared transaction,
// and the replication slots that keep an xmin.
func readHorizonHolders(ctx context.Context, tx *sql.Tx, o *Overview) error {
	if err := tx.QueryRowContext(ctx, oldestXactSQL).Scan(&o.OldestXactAgeSeconds); err != nil {
		return fmt.Errorf("overview: oldest transaction: %w", err)
	}
	var p PreparedXact
	err := tx.QueryRowContext(ctx, oldestPreparedSQL).Scan(&p.GID, &p.AgeSeconds)
	switch {
	case err == nil:
		o.OldestPreparedXact = &p
	case !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("overview: prepared transactions: %w", err)
	}
	if o.ReplicationSlots, err = queryAll(ctx, tx, scanSlotHold, replicationSlotsSQL, maxListedSlots); err != nil {
		return fmt.Errorf("overview: replication slots: %w", err)
	}
	return nil
}

func scanSlotHold(row rowScanner) (SlotHold, error) {
	var h SlotHold
	err := row.Scan(&h.Name, &h.Type, &h.Active, &h.XminAge, &h.CatalogXminAge)
	return h, err
}

// readRetention reads into o the last retention cycle, and into starts
// since when a completed cycle is awaited: the last one's end, or the
// oldest running replica's start if that is later (a fleet back after a
// downtime is given its intervals, and one whose sweeps never ran is
// judged from its start).
func readRetention(ctx context.Context, tx *sql.Tx, o *Overview, starts *alertStarts) error {
	var last RetentionCycle
	err := tx.QueryRowContext(ctx, `SELECT finished_at, error FROM outbox.retention_last_cycle`).Scan(&last.FinishedAt, &last.Error)
	switch {
	case err == nil:
		o.RetentionLastCycle = &last
	case !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("overview: retention: %w", err)
	}
	var swept, up sql.NullTime
	if err := tx.QueryRowContext(ctx, retentionSweptSQL).Scan(&starts.Now, &swept, &up); err != nil {
		return fmt.Errorf("overview: retention: %w", err)
	}
	starts.SweepAwaited = swept
	if up.Valid && (!swept.Valid || up.Time.After(swept.Time)) {
		starts.SweepAwaited = up
	}
	return nil
}

func scanReceiverWindow(row rowScanner) (ReceiverWindow, error) {
	var w ReceiverWindow
	err := row.Scan(&w.EndpointID, &w.Seconds)
	return w, err
}

// readJobCounts counts jobs by state, and finds when the oldest discarded
// job was discarded.
func readJobCounts(ctx context.Context, tx *sql.Tx) (c JobCounts, firstDiscarded sql.NullTime, err error) {
	rows, err := tx.QueryContext(ctx, overviewJobsSQL)
	if err != nil {
		return c, firstDiscarded, fmt.Errorf("overview: jobs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		var n, later, held int64
		var firstFinal sql.NullTime
		if err := rows.Scan(&state, &n, &later, &held, &firstFinal); err != nil {
			return c, firstDiscarded, fmt.Errorf("overview: jobs: %w", err)
		}
		if s := jobState(state); s == jobAvailable || s == jobRetryable {
			c.DueNow += n - later - held
			c.ScheduledLater += later
			c.HeldByPause += held
		}
		switch jobState(state) {
		case jobAvailable:
			c.Available = n
		case jobRunning:
			c.Running = n
		case jobRetryable:
			c.Retryable = n
		case jobCompleted:
			c.Completed = n
		case jobDiscarded:
			c.Discarded, firstDiscarded = n, firstFinal
		}
	}
	if err := rows.Err(); err != nil {
		return c, firstDiscarded, fmt.Errorf("overview: jobs: %w", err)
	}
	var delivered int64
	if err := tx.QueryRowContext(ctx, overviewDeliveredSQL).Scan(&delivered); err != nil {
		return c, firstDiscarded, fmt.Errorf("overview: jobs delivered: %w", err)
	}
	c.Completed += delivered
	return c, firstDiscarded, nil
}

// overviewDeliveredSQL counts the deliveries that succeeded in the last
// 24 hours, by delivery_stats_by_minute: at most a row per endpoint and
// minute, where the history holds a row per attempt.
const overviewDeliveredSQL = `
SELECT coalesce(sum(successes), 0)::bigint
FROM outbox.delivery_stats
WHERE minute >= date_trunc('minute', now() - interval '24 hours')`

// readTableHealth reads the size and vacuum statistics of every table of
// the outbox schema.
func readTableHealth(ctx context.Context, tx *sql.Tx) ([]TableHealth, error) {
	tables, err := queryAll(ctx, tx, scanTableHealth, overviewTablesSQL)
	if err != nil {
		return nil, fmt.Errorf("overview: tables: %w", err)
	}
	return tables, nil
}

func scanTableHealth(row rowScanner) (TableHealth, error) {
	var h TableHealth
	if err := row.Scan(&h.Name, &h.LiveRows, &h.DeadRows, &h.LastAutovacuum, &h.IndexBytes, &h.TotalBytes); err != nil {
		return h, err
	}
	if total := h.LiveRows + h.DeadRows; total > 0 {
		h.DeadRatio = float64(h.DeadRows) / float64(total)
	}
	return h, nil
}

// alertStarts are the moments each condition began, for Alert.Since.
type alertStarts struct {
	OldestUnfanned sql.NullTime
	FirstPoisoned  sql.NullTime
	FirstDiscarded sql.NullTime
	FirstDisabled  sql.NullTime
	FirstPaused    sql.NullTime
	// SweepAwaited is since when a completed retention cycle is awaited
	// (readRetention); Now is the database's clock, which stamped it.
	SweepAwaited sql.NullTime
	Now          time.Time
}

// retentionStaleIntervals is how many retention intervals may pass without
// a completed cycle before retention_failed fires: a replica's first cycle
// comes within one interval of its start (its jitter), and every cycle
// within one of the last; three leave room for a long cycle and a replica
// that took the lock over, not for a sweep that hangs or never runs.
const retentionStaleIntervals = 3

// notifyQueueAlertShare: half full leaves hours to act at any sane rate,
// and a healthy queue is near 0.
const notifyQueueAlertShare = 0.5

// endpointCards are the overview's endpoints by health, a partition:
// each endpoint is in the first card that holds for it of disabled,
// paused, failing and degraded, else in healthy, so that the cards add
// up to Total. Disabled comes first: it gets no deliveries, whatever its
// health; paused next: held by an operator, its failures wait with it;
// then failing before degraded, as failingAt decides (it already leaves
// paused and disabled endpoints out).
type endpointCards struct {
	Total, Healthy, Degraded, Failing, Paused, Disabled int64
}

// EndpointCards sorts the endpoints into the overview's cards: the
// states by the database's count, failing and degraded by the endpoints
// in trouble. Those are read up to maxEndpointHealth: past that many
// in trouble, the rest are counted healthy.
func (o Overview) EndpointCards() endpointCards {
	e := o.Endpoints
	c := endpointCards{Total: e.Enabled + e.Failing + e.Paused + e.Disabled, Paused: e.Paused, Disabled: e.Disabled}
	for _, h := range o.EndpointHealth {
		switch {
		case h.Paused || h.Disabled:
		case h.Health == healthFailing:
			c.Failing++
		default:
			c.Degraded++
		}
	}
	c.Healthy = c.Total - c.Disabled - c.Paused - c.Failing - c.Degraded
	return c
}

// alertRule is one alert: its name, the panel page that shows what it
// counts (the rows to act on, the endpoints it names, or, for the
// database's own health, the overview's table figures), and fire, which
// answers it as it fires now, or none. Name and Link are the rule's;
// table_bloat fires once for each table.
type alertRule struct {
	name string
	link string
	fire func(AlertConfig, Overview, alertStarts) []Alert
}

// alertRules are every alert, in the order the overview lists them.
var alertRules = []alertRule{
	{"endpoint_failing", "/endpoints", endpointFailingAlerts},
	{"events_backlog", "/events?state=unfanned", backlogAlert},
	{"events_poisoned", "/events?state=poisoned", poisonedAlert},
	{"jobs_discarded", "/jobs?state=discarded", discardedAlert},
	{"jobs_no_runner", "/jobs?state=available", noRunnerAlert},
	{"notify_queue", "/#tables", notifyQueueAlert},
	{"table_bloat", "/#tables", tableBloatAlerts},
	{"old_transaction", "/#tables", oldTransactionAlert},
	{"retention_failed", "/#tables", retentionFailedAlert},
	{"receiver_window_short", "/endpoints", receiverWindowAlert},
	{"endpoint_disabled", "/endpoints", endpointDisabledAlert},
	{"endpoint_paused", "/endpoints", endpointPausedAlert},
	{"auth_failures", "/#replicas", authFailuresAlert},
	{"client_certificate_expiring", "/endpoints", clientCertificateAlerts},
}

// clientCertificateAlerts fire for each endpoint whose client certificate
// expires within ClientCertExpiry, or has expired: its receiver will
// refuse every delivery from then on. Each links its endpoint's page,
// where a PATCH with a new pair ends it.
func clientCertificateAlerts(cfg AlertConfig, o Overview, at alertStarts) []Alert {
	var alerts []Alert
	for _, c := range o.ClientCertificates {
		left := c.NotAfter.Sub(at.Now)
		if left >= cfg.ClientCertExpiry {
			continue
		}
		when := fmt.Sprintf("expires in %s, at %s", left.Round(time.Hour), c.NotAfter.UTC().Format(time.RFC3339))
		if left <= 0 {
			when = "expired at " + c.NotAfter.UTC().Format(time.RFC3339) + ": its receiver refuses every delivery"
		}
		alerts = append(alerts, Alert{
			Message: fmt.Sprintf("endpoint %d's client certificate %s; PATCH it a new client_certificate and client_key", c.EndpointID, when),
			Since:   c.NotAfter.Add(-cfg.ClientCertExpiry), startKnown: true,
			Link: fmt.Sprintf("/endpoints/%d", c.EndpointID),
		})
	}
	for i := range alerts {
		alerts[i].Level = int64(len(alerts))
	}
	return alerts
}

// evaluateAlerts decides which alerts fire. It is pure so a table test can
// walk every threshold.
func evaluateAlerts(cfg AlertConfig, o Overview, at alertStarts) []Alert {
	alerts := []Alert{}
	for _, rule := range alertRules {
		for _, a := range rule.fire(cfg, o, at) {
			a.Name = rule.name
			if a.Link == "" { // endpoint_failing links each endpoint's page
				a.Link = rule.link
			}
			alerts = append(alerts, a)
		}
	}
	return alerts
}

func backlogAlert(cfg AlertConfig, o Overview, at alertStarts) []Alert {
	oldestAge := time.Duration(o.OldestUnfannedAgeSeconds * float64(time.Second))
	if fires := o.Backlog > int64(cfg.BacklogRows) || (o.Backlog > 0 && oldestAge > cfg.BacklogAge); !fires {
		return nil
	}
	return []Alert{{
		Message: fmt.Sprintf("%d events wait for the relay (threshold %d), the oldest for %s (threshold %s)",
			o.Backlog, cfg.BacklogRows, roughDuration(oldestAge), roughDuration(cfg.BacklogAge)),
		Since: at.OldestUnfanned.Time, Level: o.Backlog, startKnown: true,
	}}
}

func poisonedAlert(_ AlertConfig, o Overview, at alertStarts) []Alert {
	if o.Poisoned <= 0 {
		return nil
	}
	return []Alert{{
		Message: fmt.Sprintf("%d events are poisoned: the relay failed on them repeatedly; fix the cause, then requeue them", o.Poisoned),
		Since:   at.FirstPoisoned.Time, Level: o.Poisoned, startKnown: true,
	}}
}

func discardedAlert(_ AlertConfig, o Overview, at alertStarts) []Alert {
	if o.Jobs.Discarded <= 0 {
		return nil
	}
	return []Alert{{
		Message: fmt.Sprintf("%d jobs were discarded after failing; inspect their errors and retry them", o.Jobs.Discarded),
		Since:   at.FirstDiscarded.Time, Level: o.Jobs.Discarded, startKnown: true,
	}}
}

// noRunnerAlert fires while due jobs wait whose kind no live replica
// runs: an in-process subscriber's whose replicas have all stopped, say,
// or that the replicas running now were built without. No replica claims
// them (schema.sql, claim_lane_jobs' kinds), so they wait, as do their
// events, which retention keeps while a job needs them.
func noRunnerAlert(_ AlertConfig, o Overview, _ alertStarts) []Alert {
	if len(o.KindsWithoutRunner) == 0 {
		return nil
	}
	var jobs int64
	since := o.KindsWithoutRunner[0].Since
	kinds := make([]string, 0, len(o.KindsWithoutRunner))
	for _, k := range o.KindsWithoutRunner {
		jobs += k.Jobs
		if k.Since.Before(since) {
			since = k.Since
		}
		kinds = append(kinds, fmt.Sprintf("%s (%d)", k.Kind, k.Jobs))
	}
	return []Alert{{
		Message: fmt.Sprintf("%d due jobs are of a kind no live replica runs: %s. No replica claims them, and they wait for one that runs their kind: "+
			"start it (an in-process subscriber runs only in the processes that register it); retention keeps their events meanwhile",
			jobs, strings.Join(kinds, ", ")),
		Since: since, Level: jobs, startKnown: true,
	}}
}

func notifyQueueAlert(_ AlertConfig, o Overview, _ alertStarts) []Alert {
	if o.NotifyQueueUsage < notifyQueueAlertShare {
		return nil
	}
	return []Alert{{
		Message: fmt.Sprintf("PostgreSQL's NOTIFY queue is %.0f%% full; when it is full, every outbox.record fails at COMMIT. "+
			"Find the listening session that stopped reading (idle in transaction) and end it", 100*o.NotifyQueueUsage),
		Since: time.Now(), Level: int64(1000 * o.NotifyQueueUsage),
	}}
}

// tableBloatAlerts fire for each queue table whose dead rows vacuum does
// not keep up with.
func tableBloatAlerts(cfg AlertConfig, o Overview, _ alertStarts) []Alert {
	var alerts []Alert
	for _, h := range o.Tables {
		if (h.Name == "events" || h.Name == "jobs") && h.DeadRows >= bloatMinDeadRows && h.DeadRatio > cfg.DeadRatio {
			alerts = append(alerts, Alert{
				Message: fmt.Sprintf("outbox.%s is %.0f%% dead rows (%d; threshold %.0f%%): vacuum is not keeping up. "+
					"Check that autovacuum is on and that no old transaction holds it back", h.Name, 100*h.DeadRatio, h.DeadRows, 100*cfg.DeadRatio),
				Since: time.Now(), Level: h.DeadRows,
			})
		}
	}
	return alerts
}

// oldTransactionAlert fires for each thing that holds back vacuum's
// horizon: a session's transaction or a prepared one open longer than
// XactAge, and a replication slot that keeps an xmin with no consumer
// connected, which nothing will ever advance. A slot records no time, so
// an active one's hold is its consumer's to watch (a standby's long
// query holds it through hot_standby_feedback); the overview lists it.
func oldTransactionAlert(cfg AlertConfig, o Overview, _ alertStarts) []Alert {
	var alerts []Alert
	if xactAge := time.Duration(o.OldestXactAgeSeconds * float64(time.Second)); xactAge > cfg.XactAge {
		alerts = append(alerts, Alert{
			Message: fmt.Sprintf("a transaction in this database has held its snapshot for %s (threshold %s): vacuum can remove no row deleted since. "+
				"Find it in pg_stat_activity (oldest xact_start) and end it", roughDuration(xactAge), roughDuration(cfg.XactAge)),
			Since: time.Now().Add(-xactAge), startKnown: true,
		})
	}
	if p := o.OldestPreparedXact; p != nil {
		if age := time.Duration(p.AgeSeconds * float64(time.Second)); age > cfg.XactAge {
			alerts = append(alerts, Alert{
				Message: fmt.Sprintf("a transaction prepared for two-phase commit (gid %q) has been open for %s (threshold %s): vacuum can remove no row deleted since, "+
					"and no session shows it. COMMIT PREPARED or ROLLBACK PREPARED it once its coordinator is known to be gone", p.GID, roughDuration(age), roughDuration(cfg.XactAge)),
				Since: time.Now().Add(-age), startKnown: true,
			})
		}
	}
	for _, s := range o.ReplicationSlots {
		if s.Active {
			continue
		}
		alerts = append(alerts, Alert{
			Message: fmt.Sprintf("replication slot %q (%s) has no consumer connected and keeps %s: vacuum can remove no row deleted since, and nothing advances it. "+
				"Reconnect its consumer, or drop it with pg_drop_replication_slot if that consumer is gone", s.Name, s.Type, slotHoldText(s)),
			Since: time.Now(), Level: max(deref(s.XminAge), deref(s.CatalogXminAge)),
		})
	}
	return alerts
}

// slotHoldText says what a slot keeps, and how many transactions old.
func slotHoldText(s SlotHold) string {
	var held []string
	if s.XminAge != nil {
		held = append(held, fmt.Sprintf("an xmin %d transactions old (every table of every database)", *s.XminAge))
	}
	if s.CatalogXminAge != nil {
		held = append(held, fmt.Sprintf("a catalog_xmin %d transactions old (the system catalogs)", *s.CatalogXminAge))
	}
	return strings.Join(held, " and ")
}

// retentionFailedAlert fires while storage bounds are not enforced: the
// last cycle failed, or none has completed for retentionStaleIntervals
// intervals (a sweep that hangs, or never runs, records no failure).
func retentionFailedAlert(cfg AlertConfig, o Overview, at alertStarts) []Alert {
	c := o.RetentionLastCycle
	stale := cfg.RetentionInterval * retentionStaleIntervals
	if idle := at.Now.Sub(at.SweepAwaited.Time); cfg.RetentionInterval > 0 && at.SweepAwaited.Valid && idle > stale {
		msg := fmt.Sprintf("no retention cycle has completed for %s (%d intervals of %s), so storage bounds are not being enforced: "+
			"the sweep hangs or does not run; look for the retention loop in the replicas' logs and for a session holding the retention lock",
			roughDuration(idle), retentionStaleIntervals, roughDuration(cfg.RetentionInterval))
		if c != nil && c.Error != "" {
			msg += "; the last cycle failed: " + c.Error
		}
		return []Alert{{Message: msg, Since: at.SweepAwaited.Time.Add(stale), startKnown: true}}
	}
	if c == nil || c.Error == "" {
		return nil
	}
	return []Alert{{
		Message: "the last retention cycle failed, so storage bounds are not being enforced until one succeeds: " + c.Error,
		Since:   c.FinishedAt, startKnown: true,
	}}
}

// receiverWindowAlert's durations stay exact, unlike the other alerts'
// rough ones: a window and a horizon that differ by minutes would read
// alike in days and hours.
func receiverWindowAlert(cfg AlertConfig, o Overview, _ alertStarts) []Alert {
	short := shortReceiverWindows(o.ReceiverWindows, cfg.ResendHorizon)
	if len(short) == 0 {
		return nil
	}
	horizon := "unbounded (events are kept forever)"
	if cfg.ResendHorizon > 0 {
		horizon = cfg.ResendHorizon.Round(time.Second).String() + " (events retention + retry horizon)"
	}
	return []Alert{{
		Message: fmt.Sprintf("%d endpoints' receivers advertise a dedup window no longer than this sender may resend an event, %s: %s. "+
			"Replays and retries by hand to them are clamped to their windows, and retries that run longer can be recorded twice; "+
			"raise their inbox retention, or lower events retention or -job-max-attempts here", len(short), horizon, strings.Join(short, ", ")),
		Since: time.Now(), Level: int64(len(short)),
	}}
}

// shortReceiverWindows names the endpoints whose receivers' windows do not
// cover a sender's resend horizon (windowCovers, replay.go).
func shortReceiverWindows(windows []ReceiverWindow, horizon time.Duration) []string {
	var short []string
	for _, w := range windows {
		window := time.Duration(w.Seconds) * time.Second
		if !windowCovers(window, horizon) {
			short = append(short, fmt.Sprintf("endpoint %d (%s)", w.EndpointID, window))
		}
	}
	return short
}

func endpointDisabledAlert(_ AlertConfig, o Overview, at alertStarts) []Alert {
	if o.Endpoints.Disabled <= 0 {
		return nil
	}
	return []Alert{{
		Message: fmt.Sprintf("%d endpoints are disabled and receive no new deliveries; fix them, re-enable them and replay what they missed", o.Endpoints.Disabled),
		Since:   at.FirstDisabled.Time, Level: o.Endpoints.Disabled, startKnown: true,
	}}
}

// endpointPausedAlert fires for as long as any endpoint is paused: a pause
// has no end of its own, and the deliveries it holds, and the events
// retention keeps for them, grow until someone resumes. It names the risk
// of a long one: a delivery held past its receiver's dedup window is not
// sent (resendTooLate, resend.go).
func endpointPausedAlert(_ AlertConfig, o Overview, at alertStarts) []Alert {
	if o.Endpoints.Paused <= 0 {
		return nil
	}
	return []Alert{{
		Message: fmt.Sprintf("%d endpoints are paused, holding %d deliveries (and their events, which retention keeps until they are delivered); "+
			"resume them, or disable them to end what they hold. A delivery that may already have reached its receiver "+
			"and is held past the receiver's dedup window is discarded at the resume, not sent twice",
			o.Endpoints.Paused, o.Endpoints.PausedQueued),
		Since: at.FirstPaused.Time, Level: o.Endpoints.Paused, startKnown: true,
	}}
}

// authFailuresAlertCount is the wrong admin tokens within
// authFailureWindow at which auth_failures fires: above an operator's
// typos and a script polling every 10 s with a stale token (30), at the
// pace of one address guessing as fast as its budget lets it (60 in its
// first 5 minutes, 50 in every 5 after), and far below a burst.
const authFailuresAlertCount = 50

// authFailuresAlert fires on a burst of wrong admin tokens sent to this
// replica: someone guessing it, or a client with a stale one. The
// counts are each replica's own, so the alert is too; the replicas
// table it links to says which one this is.
func authFailuresAlert(cfg AlertConfig, _ Overview, _ alertStarts) []Alert {
	if cfg.AuthFailures == nil {
		return nil
	}
	n := cfg.AuthFailures()
	if n < authFailuresAlertCount {
		return nil
	}
	return []Alert{{
		Message: fmt.Sprintf("this replica was sent %d wrong admin tokens in the last %s (threshold %d): someone may be guessing it, or a client has an old one. "+
			"outboxd_auth_failures_total and outboxd_auth_throttled_total count them by way, and the log names each address that ran out of tries",
			n, roughDuration(authFailureWindow), authFailuresAlertCount),
		Since: time.Now(), Level: n,
	}}
}

// alertAck is an operator's acknowledgement of an alert at a level.
type alertAck struct {
	Name           string
	Level          int64
	AcknowledgedAt time.Time
}

const alertAcksSQL = `
SELECT name, level, acknowledged_at
FROM outbox.alert_acks`

func scanAlertAck(row rowScanner) (alertAck, error) {
	var a alertAck
	err := row.Scan(&a.Name, &a.Level, &a.AcknowledgedAt)
	return a, err
}

// applyAcks marks the alerts an acknowledgement still covers: one at a
// level no higher than it was acknowledged at, in the episode that was
// acknowledged (it began before the acknowledgement). A new discard, a
// growing backlog, or a backlog that cleared and came back fires again.
func applyAcks(alerts []Alert, acks []alertAck) {
	for i := range alerts {
		for _, ack := range acks {
			a := &alerts[i]
			if ack.Name != a.Name || a.Level > ack.Level || (a.startKnown && a.Since.After(ack.AcknowledgedAt)) {
				continue
			}
			at := ack.AcknowledgedAt
			a.Acknowledged, a.AcknowledgedAt = true, &at
		}
	}
}

// ackAlertSQL records an acknowledgement, one row per alert: the table
// holds at most one row for every alert name.
const ackAlertSQL = `
INSERT INTO outbox.alert_acks (name, level, acknowledged_at)
VALUES ($1, $2, now())
ON CONFLICT (name) DO UPDATE
SET level = EXCLUDED.level,
    acknowledged_at = EXCLUDED.acknowledged_at
RETURNING acknowledged_at`

// acknowledgeAlert acknowledges the alert name as it fires now, at its
// highest level, and answers it as the overview now shows it.
func acknowledgeAlert(ctx context.Context, db *sql.DB, cfg AlertConfig, name string) (Alert, error) {
	o, err := readOverview(ctx, db, cfg)
	if err != nil {
		return Alert{}, err
	}
	worst := -1 // an alert may fire more than once (table_bloat, per table)
	for i, a := range o.Alerts {
		if a.Name == name && (worst < 0 || a.Level > o.Alerts[worst].Level) {
			worst = i
		}
	}
	if worst < 0 {
		return Alert{}, fmt.Errorf("alert %q: %w (it is not firing)", name, errNotFound)
	}
	ack := alertAck{Name: name, Level: o.Alerts[worst].Level}
	if err := db.QueryRowContext(ctx, ackAlertSQL, name, ack.Level).Scan(&ack.AcknowledgedAt); err != nil {
		return Alert{}, fmt.Errorf("acknowledge alert %q: %w", name, err)
	}
	// The overview just read is the one acknowledged: no second read.
	applyAcks(o.Alerts, []alertAck{ack})
	return o.Alerts[worst], nil
}

// EndpointHealth is an endpoint in trouble as the overview reads it: the
// facts failingAt decides its Health from, and its last error.
type EndpointHealth struct {
	ID int64 `json:"id"`
	// Name is how an operator knows it: its description, else its URL.
	Name     string `json:"name"`
	Paused   bool   `json:"paused"`
	Disabled bool   `json:"disabled"`
	// BreakerOpenedAt is set while its circuit breaker is open, after
	// ConsecutiveFailures reached -breaker-threshold.
	BreakerOpenedAt     *time.Time `json:"breaker_opened_at"`
	ConsecutiveFailures int64      `json:"consecutive_failures"`
	FailingSince        *time.Time `json:"failing_since"`
	// Attempts and Successes are counted over the minutes that overlap
	// the last EndpointFailingFor; FirstFailed and LastFailed are the
	// first and the last of those minutes with a failed attempt.
	Attempts    int64      `json:"attempts"`
	Successes   int64      `json:"successes"`
	FirstFailed *time.Time `json:"first_failed_minute"`
	LastFailed  *time.Time `json:"last_failed_minute"`
	// LastStatus, LastError and LastErrorAt are its last failed attempt
	// (nil status: no answer came).
	LastStatus  *int       `json:"last_status"`
	LastError   string     `json:"last_error"`
	LastErrorAt *time.Time `json:"last_error_at"`
	// LastAnswer is the start of that attempt's answer, as stored.
	LastAnswer string `json:"last_answer"`
	// Health is "failing" or "degraded" (failingAt).
	Health string `json:"health"`
}

// maxEndpointHealth bounds the endpoints in trouble the overview reads.
const maxEndpointHealth = 100

// endpointHealthSQL reads the endpoints in trouble ($2: only that one; 0:
// all): breaker open, failing, or a failed attempt in the minutes that
// overlap the last $1 seconds. The minutes come from
// delivery_stats_by_minute, a few rows an endpoint; the last error from
// deliveries_failed_by_endpoint_finished_at, one row an endpoint in
// trouble (a 2xx among them is an attempt whose outcome was fenced out,
// not a failure).
const endpointHealthSQL = `
WITH recent AS (
  SELECT endpoint_id,
         sum(attempts) AS attempts,
         sum(successes) AS successes,
         min(minute) FILTER (WHERE successes < attempts) AS first_failed,
         max(minute) FILTER (WHERE successes < attempts) AS last_failed
  FROM outbox.delivery_stats
  WHERE minute >= date_trunc('minute', now() - make_interval(secs => $1))
    AND ($2 = 0 OR endpoint_id = $2)
  GROUP BY endpoint_id
)
SELECT ep.id, coalesce(nullif(ep.description, ''), ep.url),
       ep.paused_at IS NOT NULL, ep.disabled_at IS NOT NULL,
       ep.breaker_opened_at, ep.consecutive_failures, ep.failing_since,
       coalesce(r.attempts, 0), coalesce(r.successes, 0), r.first_failed, r.last_failed,
       last.status_code, coalesce(last.error, ''), last.finished_at, coalesce(last.response_excerpt, '')
FROM outbox.endpoints AS ep
LEFT JOIN recent AS r ON r.endpoint_id = ep.id
LEFT JOIN LATERAL (
  SELECT d.status_code, d.error, d.finished_at, d.response_excerpt
  FROM outbox.deliveries AS d
  WHERE d.endpoint_id = ep.id
    AND d.outcome IS DISTINCT FROM 'completed'
    AND NOT coalesce(d.status_code BETWEEN 200 AND 299, false)
  ORDER BY d.finished_at DESC
  LIMIT 1
) AS last ON true
WHERE (ep.breaker_opened_at IS NOT NULL OR ep.failing_since IS NOT NULL OR r.first_failed IS NOT NULL)
  AND ($2 = 0 OR ep.id = $2)
ORDER BY ep.id
LIMIT $3`

func scanEndpointHealth(row rowScanner) (EndpointHealth, error) {
	var h EndpointHealth
	err := row.Scan(&h.ID, &h.Name, &h.Paused, &h.Disabled,
		&h.BreakerOpenedAt, &h.ConsecutiveFailures, &h.FailingSince,
		&h.Attempts, &h.Successes, &h.FirstFailed, &h.LastFailed,
		&h.LastStatus, &h.LastError, &h.LastErrorAt, &h.LastAnswer)
	return h, err
}

// readEndpointHealth reads the endpoints in trouble (id: only that one;
// 0: all) and decides each one's health at now, the database's clock
// (zero: read it).
func readEndpointHealth(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, cfg AlertConfig, id int64, now time.Time) ([]EndpointHealth, error) {
	if now.IsZero() {
		if err := q.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
			return nil, fmt.Errorf("endpoint health: %w", err)
		}
	}
	hs, err := queryAll(ctx, q, scanEndpointHealth, endpointHealthSQL, cfg.EndpointFailingFor.Seconds(), id, maxEndpointHealth)
	if err != nil {
		return nil, fmt.Errorf("endpoint health: %w", err)
	}
	for i := range hs {
		hs[i].Health = healthDegraded
		if _, failing := failingAt(cfg, hs[i], now); failing {
			hs[i].Health = healthFailing
		}
	}
	return hs, nil
}

// withHealth sets the State of eps as the panel reads it: an endpoint
// that failed since its last success is "failing" where endpoint_failing
// holds for it, else "degraded" (as getEndpoint derives it, from its
// breaker alone). The health of one endpoint is read for one, of every
// endpoint in trouble for more.
func withHealth(ctx context.Context, db *sql.DB, cfg AlertConfig, eps []Endpoint) error {
	var id int64
	if len(eps) == 1 {
		id = eps[0].ID
	}
	hs, err := readEndpointHealth(ctx, db, cfg, id, time.Time{})
	if err != nil {
		return err
	}
	byID := make(map[int64]string, len(hs))
	for _, h := range hs {
		byID[h.ID] = h.Health
	}
	for i := range eps {
		if eps[i].Health == healthDegraded && byID[eps[i].ID] == healthFailing {
			eps[i].Health = healthFailing
		}
	}
	return nil
}

// failingAt decides whether endpoint_failing fires for h at now,
// and since when it is known to be failing (zero: not known). Paused and
// disabled endpoints are excluded: an operator or the sweep has already
// acted, and endpoint_paused or endpoint_disabled say so. An open breaker
// is failing; so is a success rate below the threshold with failures
// from the window's start to its last minute, so that one failed
// attempt, however lonely, is a blip and never fails on its own.
func failingAt(cfg AlertConfig, h EndpointHealth, now time.Time) (time.Time, bool) {
	if h.Paused || h.Disabled {
		return time.Time{}, false
	}
	if h.BreakerOpenedAt != nil {
		return *h.BreakerOpenedAt, true
	}
	if h.Attempts == 0 || h.FirstFailed == nil || h.LastFailed == nil {
		return time.Time{}, false
	}
	below := float64(h.Successes) < cfg.EndpointSuccessBelow*float64(h.Attempts)
	spans := !h.FirstFailed.After(now.Add(-cfg.EndpointFailingFor)) &&
		!h.LastFailed.Before(now.Truncate(time.Minute).Add(-time.Minute))
	return time.Time{}, below && spans
}

// endpointFailingAlerts fire once for each failing endpoint, naming it,
// why, and its last error, and linking to its page. Their level is how
// many endpoints fail, so that an acknowledgement holds until another
// one does.
func endpointFailingAlerts(cfg AlertConfig, o Overview, at alertStarts) []Alert {
	var alerts []Alert
	for _, h := range o.EndpointHealth {
		since, failing := failingAt(cfg, h, at.Now)
		if !failing {
			continue
		}
		why := fmt.Sprintf("its circuit breaker is open (%d attempts failed in a row): one attempt at a time, new deliveries 5 minutes late", h.ConsecutiveFailures)
		if since.IsZero() {
			why = fmt.Sprintf("%d of its %d attempts in the last %s succeeded (threshold %.0f%%)",
				h.Successes, h.Attempts, roughDuration(cfg.EndpointFailingFor), 100*cfg.EndpointSuccessBelow)
		}
		last := "no error recorded"
		if h.LastError != "" {
			last = "last error: " + attemptCause(h.LastError)
		}
		alerts = append(alerts, Alert{
			Message:    fmt.Sprintf("endpoint %q is failing: %s; %s", h.Name, why, last),
			Since:      since,
			startKnown: !since.IsZero(),
			Link:       fmt.Sprintf("/endpoints/%d", h.ID),
		})
	}
	for i := range alerts {
		alerts[i].Level = int64(len(alerts))
		if alerts[i].Since.IsZero() {
			alerts[i].Since = at.Now
		}
	}
	return alerts
}
