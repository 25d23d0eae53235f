// replicas.go: the replica registry. Every outboxd process sharing the
// database has a row in outbox.replicas, registered at start, stamped by a
// heartbeat and deleted on a clean shutdown, so that the replicas know of
// each other: the overview lists them, and the jobs of one that stops
// heartbeating are rescued within seconds (rescue.go) instead of after the
// rescue horizon.
//
// A process that finds its row gone was declared dead (its heartbeats
// stopped for longer than its dead_after: paused, cut off from the
// database, or too slow) and its jobs were rescued. Its claims fail from
// then on (outbox.claim_lane_jobs checks the row), its workers claim nothing
// until it has registered again under a new id, and the outcomes of the
// jobs it was running are fenced out by their attempt numbers.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// ReplicaConfig holds the registry's numbers.
type ReplicaConfig struct {
	// Heartbeat is how often a replica stamps its row, and how often the
	// rescuer looks for replicas that stopped. 3 s: five beats fit in
	// DeadAfter, so a replica is declared dead only after missing five in a
	// row, and its jobs are back in the queue within DeadAfter + Heartbeat.
	Heartbeat time.Duration
	// DeadAfter is how long a replica may go without a heartbeat before
	// any other declares it dead and rescues its running jobs. 15 s:
	// after a kill -9 the dead replica's deliveries resume within about
	// 20 s, not the attempt timeout plus the rescue margin (90 s); a
	// live replica stalls that long only when something else is badly
	// wrong (the database unreachable, the process paused). Every replica
	// states its own in its row, and is judged by it.
	DeadAfter time.Duration
}

// minBeatsPerDeadAfter is the least number of heartbeats DeadAfter must
// span: one late beat, a slow statement or a full pool, must not get a
// live replica declared dead.
const minBeatsPerDeadAfter = 3

// errReplicaNotRegistered is outbox.claim_lane_jobs' SQLSTATE when the claiming
// replica's row is gone: it was declared dead.
const errReplicaNotRegistered pqerror.Code = "OXR01"

// replicaSelf is what a replica says of itself in its row.
type replicaSelf struct {
	Host     string
	PID      int
	Version  string
	Revision string
	// SchemaVersion is the start of the binary's schema checksum
	// (schemaVersionOf).
	SchemaVersion string
	// PIDNamespace and PIDStart say which process PID is: the kernel boot
	// and pid namespace it is a number of, and when it started (clock
	// ticks after boot); "" and 0 when unknown (thisProcess).
	PIDNamespace string
	PIDStart     int64
	Workers      int  // job slots (-workers)
	Listens      bool // LISTENs for wake-ups (not -disable-listen)
	// Kinds are the job kinds its workers run (workerPool.kinds), the
	// only ones they claim; nil records none (NULL), which the overview
	// takes for every kind, as it takes a row of the release before.
	Kinds []string
}

// schemaVersionLength is how much of the schema checksum a replica
// records: 48 bits tell a release's schemas apart as well as 256 do, and
// fit in the panel's list.
const schemaVersionLength = 12

// schemaVersionOf is what a replica records of a schema checksum
// (migrate.go, migration.checksum).
func schemaVersionOf(checksum string) string {
	return checksum[:min(len(checksum), schemaVersionLength)]
}

// currentReplica is this process as its row describes it: workers job
// slots, and whether it listens for wake-ups.
func currentReplica(workers int, listens bool) replicaSelf {
	host, _ := os.Hostname()
	b := readBuildInfo()
	pid := os.Getpid()
	namespace, started := thisProcess(pid)
	return replicaSelf{
		Host:          truncate(host, 255),
		PID:           pid,
		Version:       b.Release,
		Revision:      truncate(b.Revision, 100),
		SchemaVersion: schemaVersionOf(schemaChecksum()),
		PIDNamespace:  namespace,
		PIDStart:      started,
		Workers:       workers,
		Listens:       listens,
	}
}

// thisProcess says which process pid, this one, is, so that a replica
// starting later on the same host can tell whether it still runs
// (rescue.go, processGone): the kernel boot and the pid namespace its
// number belongs to (two containers on one kernel number their processes
// apart, each from 1, and a reboot numbers them again), and when it
// started, in clock ticks after boot (a later process given the same
// number started later). Linux's /proc holds both; elsewhere, or without
// /proc, it returns "" and 0, and no replica judges this one by its pid.
func thisProcess(pid int) (namespace string, started int64) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", 0
	}
	ns, err := os.Readlink("/proc/self/ns/pid") // "pid:[4026531836]"
	if err != nil {
		return "", 0
	}
	_, started, err = readProcStat(pid)
	if err != nil {
		return "", 0
	}
	return strings.TrimSpace(string(boot)) + " " + ns, started
}

// readProcStat reads, from /proc/<pid>/stat, the process's state (R, S,
// Z for a zombie, ...) and its start in clock ticks after boot (fields 3
// and 22; proc(5)). The command name, field 2, is in parentheses and may
// hold anything, parentheses and spaces too: the fields after it follow
// the last ')'.
func readProcStat(pid int) (state byte, started int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name, want at least 20", pid, len(fields))
	}
	started, err = strconv.ParseInt(fields[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return fields[0][0], started, nil
}

// replicaRegistry is this process's row: its id for the claims, and the
// loop that keeps it fresh.
type replicaRegistry struct {
	db     *sql.DB
	cfg    ReplicaConfig
	self   replicaSelf
	logger *slog.Logger
	// sweeps, if set before Run starts, counts the retention cycles this
	// process's sweeper ran (it held the lock); a heartbeat after a new
	// one stamps swept_at.
	sweeps func() int64

	id        atomic.Int64  // this process's row; 0 while it has none
	lostID    atomic.Int64  // the id it last found gone, for the log
	lostRow   chan struct{} // poked when a claim found the row gone
	sweepSeen int64         // sweeps() at the last heartbeat; Run's alone

	// Counters for /metrics, only ever incremented.
	reregistered atomic.Int64 // times this process found itself declared dead
}

func newReplicaRegistry(db *sql.DB, cfg ReplicaConfig, self replicaSelf, logger *slog.Logger) *replicaRegistry {
	return &replicaRegistry{
		db:      db,
		cfg:     cfg,
		self:    self,
		logger:  logger.With("loop", "replicas"),
		lostRow: make(chan struct{}, 1),
	}
}

// ID is this process's replica id, 0 while it is not registered: the
// workers claim nothing then.
func (r *replicaRegistry) ID() int64 { return r.id.Load() }

// lost tells the registry that a claim under id found its row gone. The
// workers stop claiming at once; Run registers again.
func (r *replicaRegistry) lost(id int64) {
	if r.forget(id) {
		poke(r.lostRow)
	}
}

// forget drops id, found gone, unless the registry has moved on from it
// already; it reports whether it did.
func (r *replicaRegistry) forget(id int64) bool {
	if !r.id.CompareAndSwap(id, 0) {
		return false
	}
	r.lostID.Store(id)
	return true
}

// registerReplicaSQL inserts this process's row; the database stamps its
// times.
const registerReplicaSQL = `
INSERT INTO outbox.replicas (host, pid, version, revision, schema_version, pid_namespace, pid_start,
                             workers, listens, dead_after, kinds)
VALUES ($1, $2, $3, $4, $5, $6, nullif($7::bigint, 0), $8, $9, make_interval(secs => $10), $11)
RETURNING id`

// register inserts a new row for this process and makes its id the one
// the workers claim under.
func (r *replicaRegistry) register(ctx context.Context) error {
	var id int64
	s := r.self
	if err := r.db.QueryRowContext(ctx, registerReplicaSQL,
		s.Host, s.PID, s.Version, s.Revision, s.SchemaVersion, s.PIDNamespace, s.PIDStart,
		s.Workers, s.Listens, r.cfg.DeadAfter.Seconds(), pq.Array(s.Kinds)).Scan(&id); err != nil {
		return fmt.Errorf("register replica: %w", err)
	}
	r.id.Store(id)
	return nil
}

// heartbeatSQL stamps the row, and swept_at when the sweeper ran a cycle
// since the last beat ($2). No row: it was declared dead.
const heartbeatSQL = `
UPDATE outbox.replicas
SET last_seen = now(),
    swept_at = CASE WHEN $2 THEN now() ELSE swept_at END
WHERE id = $1`

// errRegistrationLost is heartbeat's answer when the row is gone.
var errRegistrationLost = errors.New("registration gone: this replica was declared dead")

// heartbeat stamps the row. When it is gone it returns
// errRegistrationLost and the workers stop claiming.
func (r *replicaRegistry) heartbeat(ctx context.Context) error {
	id := r.ID()
	var swept bool
	var sweeps int64
	if r.sweeps != nil {
		sweeps = r.sweeps()
		swept = sweeps != r.sweepSeen
	}
	res, err := r.db.ExecContext(ctx, heartbeatSQL, id, swept)
	if err != nil {
		return fmt.Errorf("replica heartbeat: %w", err)
	}
	r.sweepSeen = sweeps
	if n, _ := res.RowsAffected(); n == 0 {
		r.forget(id)
		return errRegistrationLost
	}
	return nil
}

// Run keeps the row fresh every Heartbeat until ctx ends, and registers
// again, under a new id, when the row is found gone. The caller registers
// first, and ends ctx only once the workers have stopped: a replica
// finishing its jobs on shutdown keeps heartbeating.
func (r *replicaRegistry) Run(ctx context.Context) error {
	tick := time.NewTicker(r.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		case <-r.lostRow:
		}
		err := errRegistrationLost
		if r.ID() != 0 {
			err = r.heartbeat(ctx)
		}
		switch {
		case errors.Is(err, errRegistrationLost):
			if err := r.register(ctx); err != nil {
				if ctx.Err() == nil {
					r.logger.Error("register again after being declared dead", "err", err)
				}
				continue
			}
			r.reregistered.Add(1)
			r.logger.Warn("this replica was declared dead (no heartbeat for longer than its dead_after) and its running jobs rescued; "+
				"registered again under a new id: the outcomes of the jobs it was running are fenced out",
				"old_id", r.lostID.Load(), "id", r.ID(), "dead_after", r.cfg.DeadAfter)
		case err != nil && ctx.Err() == nil:
			r.logger.Error("heartbeat failed", "err", err)
		}
	}
}

// deregisterSQL deletes this process's row on a clean shutdown.
const deregisterSQL = `
DELETE FROM outbox.replicas
WHERE id = $1`

// deregister deletes the row. The workers must have stopped: any job
// still running under this id is rescued at once (rescue.go).
func (r *replicaRegistry) deregister(ctx context.Context) error {
	id := r.id.Swap(0)
	if id == 0 {
		return nil
	}
	if _, err := r.db.ExecContext(ctx, deregisterSQL, id); err != nil {
		return fmt.Errorf("deregister replica %d: %w", id, err)
	}
	return nil
}

// Replica is one live replica, as the overview lists it.
type Replica struct {
	ID       int64  `json:"id"`
	Host     string `json:"host"`
	PID      int    `json:"pid"`
	Version  string `json:"version"`
	Revision string `json:"revision"`
	// SchemaVersion is the start of its schema's checksum; "" from a
	// release that did not record it.
	SchemaVersion string `json:"schema_version"`
	Workers       int    `json:"workers"`
	Listens       bool   `json:"listens"`
	// Kinds are the job kinds its workers run, the only ones they claim;
	// null from the release before, which claims every kind.
	Kinds     []string   `json:"kinds"`
	SweptAt   *time.Time `json:"swept_at"` // its sweeper's last retention cycle; nil: none yet
	StartedAt time.Time  `json:"started_at"`
	LastSeen  time.Time  `json:"last_seen"`
	// LastSeenAgeSeconds is how long ago, by the database's clock.
	LastSeenAgeSeconds float64 `json:"last_seen_age_seconds"`
	// Sweeper marks the replica whose sweeper ran the latest retention
	// cycle: the one holding the sweep, as far as anyone knows.
	Sweeper bool `json:"sweeper"`
	// Self marks the replica that answered this request.
	Self bool `json:"self"`
}

// maxListedReplicas bounds the overview's list: more live replicas than
// that is a deployment the list would not help with.
const maxListedReplicas = 100

// listReplicasSQL reads the live replicas, oldest first: those seen
// within their dead_after. Rows past it wait for the rescuer.
const listReplicasSQL = `
SELECT id, host, pid, version, revision, schema_version, workers, listens, kinds, swept_at, started_at, last_seen,
       extract(epoch FROM now() - last_seen)::float8
FROM outbox.replicas
WHERE last_seen >= now() - dead_after
ORDER BY started_at, id
LIMIT $1`

// readReplicas lists the live replicas, marks the sweeper, and says
// whether they run more than one build: release, revision or schema.
func readReplicas(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) (replicas []Replica, mixed bool, err error) {
	replicas, err = queryAll(ctx, q, scanReplica, listReplicasSQL, maxListedReplicas)
	if err != nil {
		return nil, false, fmt.Errorf("list replicas: %w", err)
	}
	sweeper := -1
	for i, r := range replicas {
		if r.SweptAt != nil && (sweeper < 0 || r.SweptAt.After(*replicas[sweeper].SweptAt)) {
			sweeper = i
		}
		mixed = mixed || r.build() != replicas[0].build()
	}
	if sweeper >= 0 {
		replicas[sweeper].Sweeper = true
	}
	return replicas, mixed, nil
}

// build is what tells builds apart, as replicaSelf.build.
func (r Replica) build() [3]string {
	return [3]string{r.Version, r.Revision, r.SchemaVersion}
}

func scanReplica(row rowScanner) (Replica, error) {
	var r Replica
	err := row.Scan(&r.ID, &r.Host, &r.PID, &r.Version, &r.Revision, &r.SchemaVersion, &r.Workers, &r.Listens,
		(*pq.StringArray)(&r.Kinds), &r.SweptAt, &r.StartedAt, &r.LastSeen, &r.LastSeenAgeSeconds)
	return r, err
}

// noRunnerSQL says, of job j, that no live replica runs its kind, while
// some replica is live: one whose row names no kinds (the release
// before's) is taken to run every kind, and with none live nothing runs,
// of any kind, which is not a kind's want of a runner. The overview's
// jobs_no_runner counts the due jobs it holds for, and the jobs page marks
// them.
const noRunnerSQL = `(EXISTS (SELECT FROM outbox.replicas AS r WHERE r.last_seen >= now() - r.dead_after)
 AND NOT EXISTS (SELECT FROM outbox.replicas AS r
                 WHERE r.last_seen >= now() - r.dead_after
                   AND (r.kinds IS NULL OR j.kind = ANY (r.kinds))))`
