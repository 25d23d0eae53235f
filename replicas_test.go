// replicas_test.go: the replica registry (replicas.go) and the rescue of a
// dead replica's jobs (rescue.go): the registry's life cycle, the rescue
// by heartbeat and its attempt fence, and outboxd processes paused and
// killed mid-delivery.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// The replica defaults: a replica silent for 15 s is dead, found by a
// heartbeat of 3 s (ReplicaConfig says why).
func TestReplicaDefaults(t *testing.T) {
	got := defaultConfig().Replicas
	if got.DeadAfter != 15*time.Second || got.Heartbeat != 3*time.Second {
		t.Errorf("replica defaults: heartbeat %s, dead after %s; want 3s and 15s", got.Heartbeat, got.DeadAfter)
	}
	// A dead_after a late heartbeat could reach is refused, naming both
	// settings.
	_, err := parseConfig([]string{"-replica-heartbeat", "6s", "-replica-dead-after", "15s"}, func(string) string { return "" }, nil)
	if err == nil || !strings.Contains(err.Error(), "-replica-dead-after") || !strings.Contains(err.Error(), "-replica-heartbeat") {
		t.Errorf("dead after 15s with a 6s heartbeat: %v, want an error naming both settings", err)
	}
}

// testReplica is a replica as a test registers it: no process behind it.
func testReplica(version string, pid int) replicaSelf {
	return replicaSelf{Host: "test-host", PID: pid, Version: version, Revision: "abc123",
		SchemaVersion: schemaVersionOf(schemaChecksum()), Workers: 8, Listens: true}
}

// A replica registers with what it is, heartbeats, shows on the overview
// while it is seen within its dead_after, is pruned by another replica
// once it is not, and removes its own row when it stops cleanly.
func TestReplicaRegistryLifeCycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	cfg := defaultConfig()
	a := newReplicaRegistry(db, cfg.Replicas, testReplica("0.1.0", 101), testLogger(t))
	var sweeps int64
	a.sweeps = func() int64 { return sweeps }
	if err := a.register(ctx); err != nil {
		t.Fatal(err)
	}
	if a.ID() == 0 {
		t.Fatal("registered with id 0")
	}
	var host, version string
	var pid, workers int
	var deadAfter float64
	var fresh bool
	err := db.QueryRow(`
		SELECT host, pid, version, workers, extract(epoch FROM dead_after)::float8, started_at = last_seen
		FROM outbox.replicas WHERE id = $1`, a.ID()).Scan(&host, &pid, &version, &workers, &deadAfter, &fresh)
	if err != nil {
		t.Fatal(err)
	}
	if host != "test-host" || pid != 101 || version != "0.1.0" || workers != 8 || deadAfter != 15 || !fresh {
		t.Errorf("row: host %q pid %d version %q workers %d dead_after %v s, fresh %t; want test-host, 101, 0.1.0, 8, 15 s, true",
			host, pid, version, workers, deadAfter, fresh)
	}

	// A heartbeat stamps last_seen with the database's clock; one after a
	// retention cycle of its sweeper stamps swept_at too.
	mustExec(t, db, `UPDATE outbox.replicas SET last_seen = now() - interval '10 seconds'`)
	sweeps++
	if err := a.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if age := queryInt(t, db, `SELECT extract(epoch FROM now() - last_seen)::int FROM outbox.replicas WHERE id = $1`, a.ID()); age != 0 {
		t.Errorf("last_seen %d s ago after a heartbeat, want 0", age)
	}

	// A second replica of another release: both listed, mixed versions
	// flagged, the sweeper marked.
	b := newReplicaRegistry(db, cfg.Replicas, testReplica("0.2.0", 102), testLogger(t))
	if err := b.register(ctx); err != nil {
		t.Fatal(err)
	}
	o, err := readOverview(ctx, db, cfg.Alerts)
	if err != nil {
		t.Fatal(err)
	}
	type listed struct {
		ID      int64
		Version string
		Sweeper bool
	}
	var got []listed
	for _, r := range o.Replicas {
		got = append(got, listed{r.ID, r.Version, r.Sweeper})
	}
	want := []listed{{a.ID(), "0.1.0", true}, {b.ID(), "0.2.0", false}}
	if diff := cmp.Diff(want, got); diff != "" || !o.MixedVersions {
		t.Errorf("overview replicas (-want +got):\n%s\nmixed versions %t, want true", diff, o.MixedVersions)
	}

	// b goes silent: at 14 s it is still alive, at 16 s it is dead, and a
	// live replica's rescuer prunes its row. 15 s is the default.
	rescuer := newRescuer(db, cfg.Workers, cfg.Replicas, testLogger(t))
	mustExec(t, db, `UPDATE outbox.replicas SET last_seen = now() - interval '14 seconds' WHERE id = $1`, b.ID())
	if _, err := rescuer.rescueDeadReplicas(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.replicas`); n != 2 {
		t.Fatalf("%d rows after a replica was silent for 14 s, want 2", n)
	}
	mustExec(t, db, `UPDATE outbox.replicas SET last_seen = now() - interval '16 seconds' WHERE id = $1`, b.ID())
	o, err = readOverview(ctx, db, cfg.Alerts)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Replicas) != 1 || o.Replicas[0].ID != a.ID() || o.MixedVersions {
		t.Errorf("overview lists %+v (mixed %t) with b silent for 16 s; want a alone, not mixed", o.Replicas, o.MixedVersions)
	}
	if _, err := rescuer.rescueDeadReplicas(ctx); err != nil {
		t.Fatal(err)
	}
	if got := queryStrings(t, db, `SELECT id::text FROM outbox.replicas`); !cmp.Equal(got, []string{fmt.Sprint(a.ID())}) {
		t.Errorf("rows after pruning: %v, want only %d", got, a.ID())
	}
	if n := rescuer.declaredDead.Load(); n != 1 {
		t.Errorf("declared %d replicas dead, want 1", n)
	}
	// b learns it was declared dead at its next heartbeat.
	if err := b.heartbeat(ctx); err != errRegistrationLost || b.ID() != 0 {
		t.Errorf("heartbeat of a pruned replica: %v, id %d; want errRegistrationLost and id 0", err, b.ID())
	}

	// A clean stop removes the row.
	if err := a.deregister(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.replicas`); n != 0 || a.ID() != 0 {
		t.Errorf("%d rows and id %d after a clean stop, want 0 and 0", n, a.ID())
	}
}

// A claim records its replica. When that replica stops heartbeating, its
// running jobs are rescued at once; its claims fail from then on, and a
// late outcome of the attempt it was running changes nothing. It
// registers again under a new id.
func TestDeadReplicaJobsAreRescuedAndItsLateOutcomeFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	cfg := defaultConfig()
	cfg.Replicas.Heartbeat = 20 * time.Millisecond // for a's registering again below
	subs := newSubscriberRegistry()
	sub := noopSubscriber("noop")
	subs.Register(sub)
	pool := func(reg *replicaRegistry) *workerPool {
		p := newWorkerPool(db, cfg.Workers, time.Minute, subs, nil, testLogger(t))
		p.replica = reg
		return p
	}
	a := newReplicaRegistry(db, cfg.Replicas, testReplica("0.1.0", 201), testLogger(t))
	b := newReplicaRegistry(db, cfg.Replicas, testReplica("0.1.0", 202), testLogger(t))
	for _, r := range []*replicaRegistry{a, b} {
		if err := r.register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	poolA, poolB := pool(a), pool(b)
	rescuer := newRescuer(db, cfg.Workers, cfg.Replicas, testLogger(t))

	jobs := []int64{enqueueJob(t, db, sub.jobKind(), 18), enqueueJob(t, db, sub.jobKind(), 18)}
	claimed, err := poolA.claim(ctx, 10)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("a claimed %d jobs (%v), want 2", len(claimed), err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'running' AND held_by = $1`, a.ID()); n != 2 {
		t.Fatalf("%d running jobs held by a, want 2", n)
	}
	// While a heartbeats, nothing of it is rescued.
	if n, err := rescuer.rescueDeadReplicas(ctx); err != nil || n != 0 {
		t.Fatalf("rescued %d jobs of a live replica (%v), want 0", n, err)
	}

	// a's heartbeats stop.
	deadID := a.ID()
	mustExec(t, db, `UPDATE outbox.replicas SET last_seen = now() - interval '16 seconds' WHERE id = $1`, deadID)
	if n, err := rescuer.rescueDeadReplicas(ctx); err != nil || n != 2 {
		t.Fatalf("rescued %d jobs of a dead replica (%v), want 2", n, err)
	}
	for _, id := range jobs {
		var state, lastError string
		var attempt int
		if err := db.QueryRow(`SELECT state, attempt, errors -> -1 ->> 'error' FROM outbox.jobs WHERE id = $1`, id).Scan(&state, &attempt, &lastError); err != nil {
			t.Fatal(err)
		}
		wantError := fmt.Sprintf("rescued: replica %d running it stopped heartbeating", deadID)
		if state != "retryable" || attempt != 1 || lastError != wantError {
			t.Errorf("job %d: %s at attempt %d, error %q; want retryable at 1, %q", id, state, attempt, lastError, wantError)
		}
	}

	// a wakes: its claim fails, and it claims nothing until it has
	// registered again.
	if _, err := poolA.claim(ctx, 10); pq.As(err, errReplicaNotRegistered) == nil {
		t.Errorf("claim by a replica declared dead: %v, want SQLSTATE %s", err, errReplicaNotRegistered)
	}
	if got, err := poolA.claim(ctx, 10); err != nil || len(got) != 0 || a.ID() != 0 {
		t.Errorf("next claim: %d jobs (%v), id %d; want none claimed, id 0", len(got), err, a.ID())
	}

	// b runs the next attempts; a's late outcome of attempt 1 is fenced out.
	again, err := poolB.claim(ctx, 10)
	if err != nil || len(again) != 2 || again[0].Attempt != 2 {
		t.Fatalf("b claimed %+v (%v), want both jobs at attempt 2", again, err)
	}
	var late []jobResult
	for _, j := range claimed {
		late = append(late, jobResult{ID: j.ID, Attempt: j.Attempt, jobOutcome: jobOutcome{State: jobCompleted}})
	}
	if err := poolA.recordOutcomes(ctx, late); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'running' AND attempt = 2 AND held_by = $1`, b.ID()); n != 2 {
		t.Errorf("after a's late outcome: %d jobs running attempt 2 under b, want 2 (unchanged)", n)
	}

	// a registers again under a new id, and claims again.
	ctxA, stopA := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctxA) }()
	t.Cleanup(func() { stopA(); <-done })
	waitFor(t, "a to register again", 10*time.Second, func() bool { return a.ID() != 0 })
	if a.ID() == deadID || a.reregistered.Load() != 1 {
		t.Errorf("registered again as %d (%d times), want a new id, not %d, once", a.ID(), a.reregistered.Load(), deadID)
	}
	enqueueJob(t, db, sub.jobKind(), 18)
	if got, err := poolA.claim(ctx, 10); err != nil || len(got) != 1 {
		t.Errorf("a's claim after registering again: %d jobs (%v), want 1", len(got), err)
	}
}

// holdingReceiver accepts every webhook, except those sent by one process,
// which it holds until released.
type holdingReceiver struct {
	addr string
	port int

	mu       sync.Mutex // protects the fields below
	holdPID  int
	held     int
	heldCh   chan struct{} // closed when the first request is held
	release  chan struct{} // closed to answer the held requests
	accepted map[string]int
}

func newHoldingReceiver(t *testing.T) *holdingReceiver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := &holdingReceiver{addr: ln.Addr().String(), port: ln.Addr().(*net.TCPAddr).Port,
		heldCh: make(chan struct{}), release: make(chan struct{}), accepted: map[string]int{}}
	srv := &http.Server{Handler: rc}
	go srv.Serve(ln)
	t.Cleanup(func() {
		rc.releaseHeld()
		srv.Close()
	})
	return rc
}

func (rc *holdingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.mu.Lock()
	pid, release := rc.holdPID, rc.release
	hold := false
	if pid != 0 {
		hold, _ = connOwnedBy(pid, r.RemoteAddr, rc.port)
	}
	if hold {
		if rc.held == 0 {
			close(rc.heldCh)
		}
		rc.held++
	}
	rc.mu.Unlock()
	if hold {
		<-release
	}
	rc.mu.Lock()
	rc.accepted[r.Header.Get("webhook-id")]++
	rc.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// holdFrom holds every request from process pid from now on.
func (rc *holdingReceiver) holdFrom(pid int) <-chan struct{} {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.holdPID = pid
	return rc.heldCh
}

// releaseHeld answers the held requests and holds no more; it returns how
// many were held.
func (rc *holdingReceiver) releaseHeld() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.holdPID != 0 {
		rc.holdPID = 0
		close(rc.release)
	}
	return rc.held
}

// acceptedTwice counts the webhook ids accepted more than once.
func (rc *holdingReceiver) acceptedTwice() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, c := range rc.accepted {
		if c > 1 {
			n++
		}
	}
	return n
}

// replicaPair is two outboxd processes on one test database delivering
// to a holdingReceiver: the victim, whose requests the receiver holds,
// and the survivor.
type replicaPair struct {
	db               *sql.DB
	recv             *holdingReceiver
	victim, survivor *faultReplica
	events           int
}

// withApplicationName is dsn with application_name set, in either form.
func withApplicationName(dsn, name string) string {
	if u, err := url.Parse(dsn); err == nil && strings.Contains(dsn, "://") {
		q := u.Query()
		q.Set("application_name", name)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " application_name=" + name
}

func startReplicaPair(t *testing.T, extraArgs ...string) *replicaPair {
	t.Helper()
	db, dsn := newTestDB(t)
	p := &replicaPair{db: db, recv: newHoldingReceiver(t)}
	mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret) VALUES ($1, decode(repeat('ab', 32), 'hex'))`,
		"http://"+p.recv.addr+"/hook")
	for _, r := range []**faultReplica{&p.victim, &p.survivor} {
		name := "outboxd-victim"
		if r == &p.survivor {
			name = "outboxd-survivor"
		}
		args := append([]string{
			"-database-url", withApplicationName(dsn, name),
			"-admin-token", faultAdminToken,
			"-allow-private-endpoints",
			"-relay-sweep", "200ms",
			"-job-poll", "200ms",
			"-workers", "4",
			"-db-max-conns", "6",
		}, extraArgs...)
		*r = &faultReplica{t: t, name: name, args: args, logPath: filepath.Join(t.TempDir(), name+".log")}
		(*r).start()
		t.Cleanup((*r).kill)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("victim's log ends:\n%s", tail(p.victim.logPath, 30))
			t.Logf("survivor's log ends:\n%s", tail(p.survivor.logPath, 30))
		}
	})
	return p
}

// record commits n events, each one delivery to the receiver.
func (p *replicaPair) record(t *testing.T, n int) {
	t.Helper()
	mustExec(t, p.db, `SELECT outbox.record('replica.test', g::text, '{}') FROM generate_series($1::int, $2::int) AS g`, p.events+1, p.events+n)
	p.events += n
}

// holdVictim records events until the receiver holds a request from the
// victim: it is then mid-delivery.
func (p *replicaPair) holdVictim(t *testing.T) {
	t.Helper()
	held := p.recv.holdFrom(p.victim.pid())
	for try := 0; ; try++ {
		p.record(t, 20)
		select {
		case <-held:
			return
		case <-time.After(time.Second):
		}
		if try == 10 {
			t.Fatal("the victim never sent a request to hold")
		}
	}
}

// unfinished counts what is left to do: events not fanned out, jobs not
// finished.
func (p *replicaPair) unfinished(t *testing.T) int {
	return queryInt(t, p.db, `
		SELECT (SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL)
		     + (SELECT count(*) FROM outbox.jobs WHERE state IN ('available', 'running', 'retryable'))`)
}

// rescuedBy counts the jobs rescued by heartbeat and by the horizon.
func (p *replicaPair) rescuedBy(t *testing.T) (heartbeat, horizon int) {
	err := p.db.QueryRow(`
		SELECT count(*) FILTER (WHERE d.error LIKE '%stopped heartbeating'),
		       count(*) FILTER (WHERE d.error LIKE 'rescued: still running after%')
		FROM outbox.deliveries AS d`).Scan(&heartbeat, &horizon)
	if err != nil {
		t.Fatal(err)
	}
	return heartbeat, horizon
}

// A replica paused (SIGSTOP) mid-delivery for longer than its dead_after
// is declared dead and its jobs are delivered by the other. When it wakes
// (SIGCONT) and its held requests are answered, nothing changes: its late
// outcomes are fenced out, it claims nothing under its old id, and it
// registers again under a new one. The attempt timeout and the rescue
// margin are the defaults (90 s), so only the heartbeat can rescue.
func TestReplicaPausedPastItsDeadAfterChangesNothingWhenItWakes(t *testing.T) {
	t.Parallel()
	p := startReplicaPair(t, "-replica-heartbeat", "200ms", "-replica-dead-after", "1s")
	victimPID := p.victim.pid()
	var victimID int64
	if err := p.db.QueryRow(`SELECT id FROM outbox.replicas WHERE pid = $1`, victimPID).Scan(&victimID); err != nil {
		t.Fatal(err)
	}
	p.holdVictim(t)

	// Paused with no transaction open, as a process waiting on its
	// requests is: one paused inside a transaction would hold its locks,
	// which is another fault.
	for try := 0; ; try++ {
		if err := syscall.Kill(victimPID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if queryInt(t, p.db, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outboxd-victim' AND state <> 'idle'`) == 0 {
			break
		}
		syscall.Kill(victimPID, syscall.SIGCONT)
		if try == 50 {
			t.Fatal("the victim never paused outside a transaction")
		}
		time.Sleep(20 * time.Millisecond) // letting the victim's transaction end
	}
	paused := true
	t.Cleanup(func() {
		if paused {
			syscall.Kill(victimPID, syscall.SIGCONT)
		}
	})

	waitFor(t, "the survivor to finish everything, the victim's jobs included", 30*time.Second, func() bool {
		return p.unfinished(t) == 0
	})
	if n := queryInt(t, p.db, `SELECT count(*) FROM outbox.replicas WHERE id = $1`, victimID); n != 0 {
		t.Errorf("the paused victim's row is still there")
	}
	heartbeat, horizon := p.rescuedBy(t)
	if heartbeat == 0 || horizon != 0 {
		t.Fatalf("%d jobs rescued by heartbeat and %d by the horizon; want some by heartbeat (the pause hit a delivery), none by the horizon", heartbeat, horizon)
	}
	jobsSQL := `SELECT id, state, attempt, coalesce(held_by, 0), finalized_at::text, errors::text FROM outbox.jobs ORDER BY id`
	before := queryRows(t, p.db, jobsSQL)

	// The victim wakes to its answered requests.
	held := p.recv.releaseHeld()
	if err := syscall.Kill(victimPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	paused = false
	// Its late attempts: the held requests, and any it had seen answered
	// but not yet recorded when it was paused; all of them among the jobs
	// rescued from it.
	lateAttempts := func() int {
		return queryInt(t, p.db, `
			SELECT count(*)
			FROM outbox.deliveries AS d
			WHERE d.error LIKE '%stopped heartbeating' AND d.status_code = 200`)
	}
	waitFor(t, "the victim to record its late attempts and register again", 30*time.Second, func() bool {
		again := queryInt(t, p.db, `SELECT count(*) FROM outbox.replicas WHERE pid = $1 AND id <> $2`, victimPID, victimID)
		return lateAttempts() >= held && again == 1
	})
	if late := lateAttempts(); late > heartbeat {
		t.Errorf("%d late attempts recorded, more than the %d jobs rescued from the victim", late, heartbeat)
	}
	if diff := cmp.Diff(before, queryRows(t, p.db, jobsSQL)); diff != "" {
		t.Errorf("the victim's wake changed jobs (-before +after):\n%s", diff)
	}
	if n := queryInt(t, p.db, `SELECT count(*) FROM outbox.jobs WHERE held_by = $1 AND attempt > 1`, victimID); n != 0 {
		t.Errorf("%d jobs claimed again under the dead id", n)
	}
	t.Logf("%d of the victim's requests held while it was paused; %d jobs rescued by heartbeat", held, heartbeat)
}

// queryRows reads every row of query as text.
func queryRows(t *testing.T, db *sql.DB, query string) [][]string {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var all [][]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			row[i] = v.String
		}
		all = append(all, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return all
}

// After a kill -9 of one of two replicas mid-delivery, with every
// setting at its default, the other delivers every event, the dead one's
// rescued by heartbeat, not by the horizon, and duplicates no more than
// the dead one's jobs in flight. The time from the kill to the last
// delivery is logged, not asserted (a loaded machine stretches it): by
// the heartbeat it is about DeadAfter + Heartbeat, where the horizon
// alone would wait the attempt timeout plus the rescue margin, 90 s.
func TestKilledReplicaJobsAreRescuedByHeartbeat(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the default 15 s dead_after; go test -short skips it, go test ./... runs it")
	}
	t.Parallel()
	p := startReplicaPair(t)
	p.holdVictim(t)
	p.record(t, 200) // more traffic after the victim's requests were taken
	p.victim.kill()
	killed := time.Now()
	held := p.recv.releaseHeld() // answered into dead connections: the receiver has them, outboxd does not know

	waitFor(t, "every event delivered after the kill", 3*time.Minute, func() bool { return p.unfinished(t) == 0 })
	took := time.Since(killed)
	heartbeat, horizon := p.rescuedBy(t)
	if heartbeat == 0 || horizon != 0 {
		t.Errorf("%d jobs rescued by heartbeat and %d by the horizon; want some by heartbeat, none by the horizon", heartbeat, horizon)
	}
	// The victim's in-flight jobs are the ones rescued by heartbeat: its
	// held requests, and any it had sent and seen answered but not yet
	// recorded when it died. Only those can arrive twice.
	if dup := p.recv.acceptedTwice(); dup > heartbeat || held > heartbeat {
		t.Errorf("%d events accepted twice and %d requests held, of the %d jobs the victim had running; want neither above it", dup, held, heartbeat)
	}
	t.Logf("kill -9 of one of two replicas with %d requests in flight: all %d events delivered %s after the kill (dead_after %s, heartbeat %s)",
		held, p.events, took.Round(100*time.Millisecond), defaultConfig().Replicas.DeadAfter, defaultConfig().Replicas.Heartbeat)
}

// Builds are told apart by release, revision and schema, not the release
// alone: two builds of one release from revisions abc123 and def456 are
// mixed versions, and so are two of one revision whose schemas differ (the
// next release's migration under way, before its release string
// changed); two replicas of one build are not. Each replica's row says
// what it recorded.
func TestMixedVersionsCompareReleaseRevisionAndSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	build := func(release, revision, schema string) replicaSelf {
		return replicaSelf{Host: "test-host", PID: 1, Version: release, Revision: revision, SchemaVersion: schema, Workers: 8}
	}
	for _, c := range []struct {
		name  string
		a, b  replicaSelf
		mixed bool
	}{
		{"one build", build("0.2.0", "abc123", "5f0c1e2d3a4b"), build("0.2.0", "abc123", "5f0c1e2d3a4b"), false},
		{"revisions abc123 and def456", build("0.2.0", "abc123", "5f0c1e2d3a4b"), build("0.2.0", "def456", "5f0c1e2d3a4b"), true},
		{"schemas", build("0.2.0", "abc123", "5f0c1e2d3a4b"), build("0.2.0", "abc123", "9e8d7c6b5a41"), true},
		{"releases", build("0.2.0", "abc123", "5f0c1e2d3a4b"), build("0.3.0", "abc123", "5f0c1e2d3a4b"), true},
		{"a release that recorded no schema", build("0.1.0", "", ""), build("0.2.0", "", "5f0c1e2d3a4b"), true},
	} {
		mustExec(t, db, `DELETE FROM outbox.replicas`)
		for _, self := range []replicaSelf{c.a, c.b} {
			if err := newReplicaRegistry(db, defaultConfig().Replicas, self, testLogger(t)).register(ctx); err != nil {
				t.Fatal(err)
			}
		}
		o, err := readOverview(ctx, db, defaultConfig().Alerts)
		if err != nil {
			t.Fatal(err)
		}
		var got [][3]string
		for _, r := range o.Replicas {
			got = append(got, [3]string{r.Version, r.Revision, r.SchemaVersion})
		}
		want := [][3]string{{c.a.Version, c.a.Revision, c.a.SchemaVersion}, {c.b.Version, c.b.Revision, c.b.SchemaVersion}}
		if diff := cmp.Diff(want, got); diff != "" || o.MixedVersions != c.mixed {
			t.Errorf("%s: replicas (-want +got):\n%s\nmixed_versions %t, want %t", c.name, diff, o.MixedVersions, c.mixed)
		}
	}
}

// /api/overview and the panel list the live replicas, mark the one that
// answered and the sweeper, and flag mixed versions; the panel stays
// without JavaScript.
func TestOverviewListsReplicasAndFlagsMixedVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	cfg := defaultConfig().Replicas
	a := newReplicaRegistry(db, cfg, testReplica("0.1.0", 301), testLogger(t))
	b := newReplicaRegistry(db, cfg, testReplica("0.2.0", 302), testLogger(t))
	b.sweeps = func() int64 { return 1 }
	for _, r := range []*replicaRegistry{a, b} {
		if err := r.register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.heartbeat(ctx); err != nil { // after a sweep: swept_at
		t.Fatal(err)
	}
	adm := testAdmin(t, db, testPolicy, testLogger(t), nil)
	adm.counters.registry = a
	srv := httptest.NewServer(routes(adm))
	t.Cleanup(srv.Close)

	var o struct {
		Replicas []struct {
			ID      int64  `json:"id"`
			Version string `json:"version"`
			Workers int    `json:"workers"`
			Self    bool   `json:"self"`
			Sweeper bool   `json:"sweeper"`
		} `json:"replicas"`
		MixedVersions bool `json:"mixed_versions"`
	}
	if status := apiCall(t, srv, "GET", "/api/overview", "", &o); status != http.StatusOK {
		t.Fatalf("GET /api/overview: %d", status)
	}
	type row struct {
		ID            int64
		Version       string
		Workers       int
		Self, Sweeper bool
	}
	var got []row
	for _, r := range o.Replicas {
		got = append(got, row{r.ID, r.Version, r.Workers, r.Self, r.Sweeper})
	}
	want := []row{{a.ID(), "0.1.0", 8, true, false}, {b.ID(), "0.2.0", 8, false, true}}
	if diff := cmp.Diff(want, got); diff != "" || !o.MixedVersions {
		t.Errorf("overview replicas (-want +got):\n%s\nmixed_versions %t, want true", diff, o.MixedVersions)
	}

	status, page := panelPage(t, srv, "/")
	for _, s := range []string{`id="mixed-versions"`, fmt.Sprintf(`id="replica-%d"`, a.ID()), fmt.Sprintf(`id="replica-%d"`, b.ID()), "(this one)", "0.2.0", "sweeper",
		"abc123", "schema " + schemaVersionOf(schemaChecksum())} {
		if !strings.Contains(page, s) {
			t.Errorf("the panel's overview lacks %q", s)
		}
	}
	if status != http.StatusOK || strings.Contains(strings.ToLower(page), "<script") {
		t.Errorf("panel overview: status %d, <script> present: %t; want 200 and none", status, strings.Contains(strings.ToLower(page), "<script"))
	}
}

// A replica starting on a host declares dead at once the registrations of
// that host whose process is gone, and the rescuer's first pass returns
// their running jobs to the queue, though each was seen just now, well
// inside its dead_after of 15 s: a restart after kill -9 rescues its
// predecessor's deliveries as it starts. Gone means no process has the
// pid, or the one that has it started at another time (pid 1 of a
// restarted container). A live process's registration stays, as does one
// of another host, of another pid namespace on this host (another
// container) or of a release that recorded no process: none of those can
// be looked up from here.
func TestRestartDeclaresItsGonePredecessorDeadAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	cfg := defaultConfig()
	self := currentReplica(cfg.Workers.Concurrency, true)
	if self.PIDNamespace == "" {
		needProc(t)
	}
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	live := exec.Command("sleep", "600")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	_, liveStart, err := readProcStat(live.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name        string
		host, ns    string
		pid         int
		started     int64
		wantRescued bool
	}{
		{"ended, on this host", self.Host, self.PIDNamespace, ended.Process.Pid, self.PIDStart, true},
		{"its pid now another process's", self.Host, self.PIDNamespace, live.Process.Pid, liveStart - 1, true},
		{"alive, on this host", self.Host, self.PIDNamespace, live.Process.Pid, liveStart, false},
		{"ended, on another host", "another-host", self.PIDNamespace, ended.Process.Pid, self.PIDStart, false},
		{"ended, in another pid namespace of this host", self.Host, self.PIDNamespace + "0", ended.Process.Pid, self.PIDStart, false},
		{"of a release that recorded no process", self.Host, "", ended.Process.Pid, 0, false},
	} {
		row := replicaSelf{Host: c.host, PID: c.pid, Version: version, PIDNamespace: c.ns, PIDStart: c.started, Workers: 1}
		reg := newReplicaRegistry(db, ReplicaConfig{Heartbeat: 3 * time.Second, DeadAfter: 15 * time.Second}, row, testLogger(t))
		if err := reg.register(ctx); err != nil {
			t.Fatal(err)
		}
		job := enqueueJob(t, db, "restart-test", 18)
		mustExec(t, db, `UPDATE outbox.jobs SET state = 'running', attempt = 1, attempted_at = now(), held_by = $1, errors = jsonb_build_array($2::text) WHERE id = $3`,
			reg.ID(), c.name, job)
	}

	// This process starts as outboxd does, then its rescuer's first pass.
	if _, err := registerReplica(ctx, db, cfg, nil, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := newRescuer(db, cfg.Workers, cfg.Replicas, testLogger(t)).rescueDeadReplicas(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT errors ->> 0, state = 'retryable' FROM outbox.jobs WHERE kind = 'restart-test' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]bool{}
	for rows.Next() {
		var name string
		var rescued bool
		if err := rows.Scan(&name, &rescued); err != nil {
			t.Fatal(err)
		}
		got[name] = rescued
	}
	want := map[string]bool{
		"ended, on this host":                          true,
		"its pid now another process's":                true,
		"alive, on this host":                          false,
		"ended, on another host":                       false,
		"ended, in another pid namespace of this host": false,
		"of a release that recorded no process":        false,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("jobs rescued at once, by their replica (-want +got):\n%s", diff)
	}
}

// needProc skips a test that needs Linux's /proc, and fails it where
// CI=true, which runs on Linux.
func needProc(t *testing.T) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("no /proc/sys/kernel/random/boot_id or /proc/self/ns/pid: this test needs Linux's /proc")
	}
	t.Skip("no /proc/sys/kernel/random/boot_id or /proc/self/ns/pid: this test needs Linux's /proc")
}

// After a kill -9 of a single outboxd mid-delivery, its restart on the
// same host rescues the jobs its predecessor was running as it starts,
// and delivers every event. The predecessor stated a dead_after of 10
// minutes and the horizon is the default 90 s, so within the wait only
// the restart's look at the predecessor's pid can return them. The time
// from the restart to the last delivery is logged, not asserted.
func TestRestartAfterKillRescuesItsPredecessorsJobsAtOnce(t *testing.T) {
	t.Parallel()
	if self := currentReplica(1, true); self.PIDNamespace == "" {
		needProc(t)
	}
	db, dsn := newTestDB(t)
	p := &replicaPair{db: db, recv: newHoldingReceiver(t)}
	mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret) VALUES ($1, decode(repeat('ab', 32), 'hex'))`,
		"http://"+p.recv.addr+"/hook")
	args := []string{
		"-database-url", withApplicationName(dsn, "outboxd-victim"),
		"-admin-token", faultAdminToken,
		"-allow-private-endpoints",
		"-relay-sweep", "200ms",
		"-job-poll", "200ms",
		"-workers", "4",
		"-replica-dead-after", "10m",
	}
	p.victim = &faultReplica{t: t, name: "outboxd-victim", args: args, logPath: filepath.Join(t.TempDir(), "outboxd.log")}
	p.victim.start()
	t.Cleanup(p.victim.kill)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("outboxd's log ends:\n%s", tail(p.victim.logPath, 30))
		}
	})
	p.holdVictim(t)
	p.record(t, 100)
	p.victim.kill()
	held := p.recv.releaseHeld() // answered into dead connections

	restarted := time.Now()
	p.victim.start()
	waitFor(t, "every event delivered after the restart", 60*time.Second, func() bool { return p.unfinished(t) == 0 })
	took := time.Since(restarted)
	rescued, horizon := p.rescuedBy(t)
	if rescued == 0 || horizon != 0 {
		t.Errorf("%d jobs rescued from the killed replica and %d by the horizon; want some from the replica, none by the horizon", rescued, horizon)
	}
	if b, err := os.ReadFile(p.victim.logPath); err != nil || !strings.Contains(string(b), "its process on this host is gone") {
		t.Errorf("the restart did not log declaring its predecessor dead (%v)", err)
	}
	t.Logf("kill -9 with %d requests in flight, then a restart: all %d events delivered %s after the restart (the killed replica's dead_after 10m)",
		held, p.events, took.Round(100*time.Millisecond))
}
