// upgrade_test.go: a rolling upgrade from the previous release's own code:
// its binary, built from its commit, beside this one on one database, and
// its SQL calls, sent as it sends them, against this release's schema.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// previousRelease is the commit of the release before this one (0.7.0),
// whose replicas this release's migration must keep working until they
// stop (docs/upgrades.md).
const (
	previousRelease        = "932bc98"
	previousReleaseVersion = "0.7.0"
)

// The previous release's calls of the pipeline's functions, word for word
// as its Go code sends them (relay.go, claim.go and completer.go at
// previousRelease): a change to one of these functions' arguments or
// result columns breaks its replicas while they roll.
const (
	previousClaimedColumns = `
       id, kind, attempt, max_attempts, endpoint_id,
       event_id, topic, subject, payload, created_at,
       traceparent, tracestate,
       url, secret, previous_secret, disabled_reason,
       start_in_ms, wake_on_outcome, replay_yields,
       resend_window_seconds, claimed_at,
       committed_at`
	previousFanOutSQL    = `SELECT out_fanned, out_jobs FROM outbox.fan_out($1, $2, $3, $4, $5, $6)`
	previousClaimJobsSQL = `
SELECT ` + previousClaimedColumns + `, claim.lane_limit
FROM outbox.claim_lane_jobs($1, $2, $3, true, $4, $5, $6) AS claim, LATERAL (SELECT (claim.job).*) AS job`
	previousRecordOutcomesSQL = `SELECT outbox.record_outcomes($1, $2, $3, $4, $5, $6, $7)`
)

// previousReleaseWrappers are the functions the last migration keeps only
// for the previous release's replicas, and schema.sql does not have (the
// catalog comparison expects them in a migrated database alone), as
// regprocedure names: the rolling upgrade checks that the old replica
// really called each.
var previousReleaseWrappers = []string{}

// previousClaimedJob is a row of the previous release's claims: the ids it
// reads (the rest it scans as they come).
type previousClaimedJob struct {
	id, eventID sql.NullInt64
}

// previousClaim runs the previous release's claim and keeps, of each row,
// the job and its event.
func previousClaim(t *testing.T, db *sql.DB, args ...any) []previousClaimedJob {
	t.Helper()
	rows, err := db.Query(previousClaimJobsSQL, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []previousClaimedJob
	for rows.Next() {
		var j previousClaimedJob
		var rest [21]any
		dest := []any{&j.id, &rest[0], &rest[1], &rest[2], &rest[3], &j.eventID}
		for i := 4; i < len(rest); i++ {
			dest = append(dest, &rest[i])
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Every call the previous release's pipeline makes still works on this
// release's schema, with the previous release's arguments and result
// columns, and does what it did: the relay's batch, its row-by-row retry
// and its pass that claims, the workers' claim, and the completer's rows.
func TestPreviousReleaseCallsKeepWorking(t *testing.T) {
	t.Parallel()
	// Migrated, as the previous release's database is: a fresh install
	// has none of what the last migration keeps for that release.
	db := migratedFromTheFirstFile(t, newMigration(nil))
	var endpointID, replicaID int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret) VALUES ('https://receiver.example/hook', $1) RETURNING id`,
		make([]byte, 32)).Scan(&endpointID); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`INSERT INTO outbox.replicas (host, pid, version, workers, listens, dead_after)
VALUES ('previous-host', 1, $1, 4, true, make_interval(secs => 15)) RETURNING id`, previousReleaseVersion).Scan(&replicaID); err != nil {
		t.Fatal(err)
	}
	var events [3]int64
	for i := range events {
		events[i] = recordEventOrFatal(t, db, fmt.Sprintf("s%d", i))
	}
	noSubscribers, answered, cooling := "[]", pq.Array([]int64{}), pq.Array([]int64{})
	const share = 4 // the previous release's workerShare of 8 workers
	kinds := pq.Array([]string{"owner-notify", "webhook"})

	var fanned, jobs int64
	if err := db.QueryRow(previousFanOutSQL, 1, nil, noSubscribers, 18, 300.0, "").Scan(&fanned, &jobs); err != nil {
		t.Fatalf("the previous release's relay pass: %v", err)
	}
	if fanned != 1 || jobs != 1 {
		t.Errorf("the previous release's relay pass of 1 fanned %d events into %d jobs, want 1 into 1", fanned, jobs)
	}
	claimed := previousClaim(t, db, 10, replicaID, answered, cooling, share, kinds)
	if len(claimed) != 1 || claimed[0].eventID.Int64 != events[0] {
		t.Fatalf("the previous release's claim took %+v, want the job of event %d", claimed, events[0])
	}
	completed := claimed[0].id.Int64

	if err := db.QueryRow(previousFanOutSQL, 1, events[2], noSubscribers, 18, 300.0, "").Scan(&fanned, &jobs); err != nil {
		t.Fatalf("the previous release's row-by-row relay: %v", err)
	}
	if fanned != 1 || jobs != 1 {
		t.Errorf("the previous release's row-by-row relay of event %d fanned %d events into %d jobs, want 1 into 1", events[2], fanned, jobs)
	}
	if err := db.QueryRow(previousFanOutSQL, 1, nil, noSubscribers, 18, 300.0, "").Scan(&fanned, &jobs); err != nil {
		t.Fatalf("the previous release's relay pass: %v", err)
	}
	if fanned != 1 || jobs != 1 {
		t.Errorf("the previous release's second relay pass fanned %d events into %d jobs, want 1 into 1", fanned, jobs)
	}
	claimed = previousClaim(t, db, 10, replicaID, answered, cooling, share, kinds)
	slices.SortFunc(claimed, func(a, b previousClaimedJob) int { return int(a.id.Int64 - b.id.Int64) })
	if len(claimed) != 2 {
		t.Fatalf("the previous release's claim took %+v, want the 2 jobs the relay made", claimed)
	}
	retried, discarded := claimed[0].id.Int64, claimed[1].id.Int64

	recordPreviousOutcomes(t, db, endpointID, completed, retried, discarded)
	checkPreviousOutcomes(t, db, endpointID, completed, retried, discarded)
}

func recordEventOrFatal(t *testing.T, db *sql.DB, subject string) int64 {
	t.Helper()
	id, err := recordEvent(context.Background(), db, "upgrade.test", subject, json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// recordPreviousOutcomes writes three outcomes as the previous release's
// completer does, its rows as JSON written out here (a change to this
// release's outcomeRows must not change what is tested): completed after
// a 200; retryable after a 500; discarded after a 400. The endpoint: a
// success and one failure after it, and a dedup window of a day.
func recordPreviousOutcomes(t *testing.T, db *sql.DB, endpointID, completed, retried, discarded int64) {
	t.Helper()
	minute := time.Now().Truncate(time.Minute).Unix()
	outcomes := fmt.Sprintf(`[
{"id": %d, "attempt": 1, "state": "completed", "delay_ms": 0, "error": ""},
{"id": %d, "attempt": 1, "state": "retryable", "delay_ms": 60000, "error": "HTTP 500"},
{"id": %d, "attempt": 1, "state": "discarded", "delay_ms": 0, "error": "HTTP 400"}]`,
		completed, retried, discarded)
	attempt := `{"job_id": %d, "attempt": 1, "endpoint_id": %d, "duration_ms": %d, "status_code": %d, "error": %q, ` +
		`"excerpt": %q, "class": %q, "minute": %d, "bucket": %d}`
	attempts := "[" + strings.Join([]string{
		fmt.Sprintf(attempt, completed, endpointID, 12, 200, "", "", "success", minute, 0),
		fmt.Sprintf(attempt, retried, endpointID, 30, 500, "HTTP 500", "oops", "5xx", minute, 0),
		fmt.Sprintf(attempt, discarded, endpointID, 40, 400, "HTTP 400", "bad", "4xx", minute, 0),
	}, ",") + "]"
	health := fmt.Sprintf(`[{"id": %d, "succeeded": true, "failures": 1, "hold_ms": 0}]`, endpointID)
	windows := fmt.Sprintf(`[{"id": %d, "seconds": 86400}]`, endpointID)
	if _, err := db.Exec(previousRecordOutcomesSQL, outcomes, attempts, health, pq.Array([]int64{}), windows, 5, statsBuckets); err != nil {
		t.Fatalf("the previous release's record_outcomes: %v", err)
	}
}

// checkPreviousOutcomes checks what recordPreviousOutcomes wrote: the
// completed job left the queue, the others stay in it, and every attempt
// is in the history with what it left its job.
func checkPreviousOutcomes(t *testing.T, db *sql.DB, endpointID, completed, retried, discarded int64) {
	t.Helper()
	got := queryStrings(t, db, `
		SELECT d.job_id || ' ' || d.outcome || ' ' || coalesce(d.status_code, 0) || ' ' || d.duration_ms || ' '
		       || coalesce((SELECT j.state || ' ' || jsonb_array_length(j.errors) FROM outbox.jobs AS j WHERE j.id = d.job_id), 'gone')
		FROM outbox.deliveries AS d
		WHERE d.job_id IN ($1, $2, $3)
		ORDER BY d.job_id`, completed, retried, discarded)
	want := []string{
		fmt.Sprintf("%d completed 200 12 gone", completed),
		fmt.Sprintf("%d retryable 500 30 retryable 1", retried),
		fmt.Sprintf("%d discarded 400 40 discarded 1", discarded),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the jobs and their history after the previous release's outcomes (-want +got):\n%s", diff)
	}
	var attempts, successes, failed5xx, failed4xx int
	if err := db.QueryRow(`SELECT attempts, successes, failed_5xx, failed_4xx FROM outbox.delivery_stats WHERE endpoint_id = $1`, endpointID).
		Scan(&attempts, &successes, &failed5xx, &failed4xx); err != nil {
		t.Fatal(err)
	}
	if attempts != 3 || successes != 1 || failed5xx != 1 || failed4xx != 1 {
		t.Errorf("statistics: %d attempts, %d successes, %d 5xx, %d 4xx; want 3, 1, 1, 1", attempts, successes, failed5xx, failed4xx)
	}
	var failures int
	var failing bool
	var window sql.NullInt64
	if err := db.QueryRow(`SELECT consecutive_failures, failing_since IS NOT NULL, dedup_window_seconds FROM outbox.endpoints WHERE id = $1`, endpointID).
		Scan(&failures, &failing, &window); err != nil {
		t.Fatal(err)
	}
	if failures != 1 || !failing || window.Int64 != 86_400 {
		t.Errorf("endpoint: %d consecutive failures, failing %t, window %v; want 1, true, 86400", failures, failing, window)
	}
}

// previousReleaseSchemaChecksum is the schema checksum the previous
// release's replicas record (migration.checksum): its schema.sql, then
// the checksum of each migration it shipped, which are this release's
// files but the last.
func previousReleaseSchemaChecksum(t *testing.T) string {
	t.Helper()
	schema, err := exec.Command("git", "show", previousRelease+":schema.sql").Output()
	if err != nil {
		needGitHistory(t, previousRelease, previousReleaseVersion, fmt.Sprintf("git show of its schema.sql: %v", err))
	}
	files := embeddedMigrations()
	return migration{schema: string(schema), files: files[:len(files)-1]}.checksum()
}

// needGitHistory fails the test where CI=true, and skips it elsewhere:
// an upgrade test needs an earlier release's commit, which a shallow
// clone lacks.
func needGitHistory(t *testing.T, commit, release, why string) {
	t.Helper()
	msg := fmt.Sprintf("the upgrade from release %s needs commit %s of this repository, git and the go tool: %s "+
		"(a shallow clone lacks the commit: git fetch --unshallow)", release, commit, why)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// buildRelease checks out commit, a build of release, in a git worktree
// under a temporary folder and builds it, returning the binary.
func buildRelease(t *testing.T, commit, release string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		needGitHistory(t, commit, release, "git is not installed")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		needGitHistory(t, commit, release, "go is not installed")
	}
	if out, err := exec.Command("git", "rev-parse", "--verify", "--quiet", commit+"^{commit}").CombinedOutput(); err != nil {
		needGitHistory(t, commit, release, fmt.Sprintf("the commit is not in this clone (git rev-parse: %v%s)", err, strings.TrimRight("; "+string(out), "; \n")))
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if out, err := exec.Command("git", "worktree", "add", "--detach", src, commit).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add %s: %v\n%s", commit, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("git", "worktree", "remove", "--force", src).CombinedOutput(); err != nil {
			t.Errorf("git worktree remove: %v\n%s", err, out)
		}
	})
	bin := filepath.Join(dir, "outboxd-"+release)
	build := exec.Command(goTool, "build", "-o", bin, ".")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of release %s (commit %s): %v\n%s", release, commit, err, out)
	}
	return bin
}

// newEmptyTestDB is a fresh database with nothing in it, dropped when t
// ends: the previous release migrates it as it would a new installation.
func newEmptyTestDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	name := fmt.Sprintf("outboxd_test_%d_%d", os.Getpid(), harness.seq.Add(1))
	admin, err := sql.Open("postgres", harness.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	dsn := dsnWithDB(harness.adminDSN, name)
	db, err := newDBPool(dsn)
	if err != nil {
		t.Fatal(err)
	}
	dropOnCleanup(t, db, name)
	return db, dsn
}

// upgradeReplica is one outboxd process of either release.
type upgradeReplica struct {
	name   string
	addr   string
	cmd    *exec.Cmd
	log    syncBuffer
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

const upgradeAdminToken = "upgrade-token-0123456789"

// startUpgradeReplica runs bin (with env added) as outboxd on dsn and
// waits until it is healthy: it has applied its schema.
func startUpgradeReplica(t *testing.T, name, bin, dsn string, env ...string) *upgradeReplica {
	t.Helper()
	r := &upgradeReplica{name: name, addr: freeAddr(t), exited: make(chan struct{})}
	r.cmd = exec.Command(bin, "-addr", r.addr, "-allow-private-endpoints")
	r.cmd.Env = append(os.Environ(), append(env, "DATABASE_URL="+dsn, "OUTBOXD_ADMIN_TOKEN="+upgradeAdminToken)...)
	r.cmd.Stdout, r.cmd.Stderr = io.Discard, &r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		<-r.exited
		if t.Failed() {
			t.Logf("%s's log:\n%s", r.name, r.log.String())
		}
	})
	awaitHealthy(t, r.addr, r.exited)
	return r
}

// stop sends SIGTERM and waits for a clean exit.
func (r *upgradeReplica) stop(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s still running 60s after SIGTERM", r.name)
	}
	if r.err != nil {
		t.Errorf("%s exited after SIGTERM with %v, want status 0", r.name, r.err)
	}
}

// api calls r's JSON API as the admin and decodes the answer into out.
func (r *upgradeReplica) api(t *testing.T, method, path, body string, out any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+r.addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+upgradeAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s on %s: %s %s", method, path, r.name, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// upgradeReceiver accepts every webhook and keeps, per event id, the
// releases that delivered it (from the User-Agent, outboxd/<release>).
type upgradeReceiver struct {
	mu sync.Mutex // protects byEvent and refused
	// byEvent maps an event id to the releases that delivered it.
	byEvent map[int64]map[string]bool
	// refused counts the requests answered 400 for want of a webhook-id.
	refused int
}

func (rc *upgradeReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	var id int64
	if _, err := fmt.Sscan(r.Header.Get("webhook-id"), &id); err != nil {
		rc.mu.Lock()
		rc.refused++
		rc.mu.Unlock()
		http.Error(w, "no webhook-id", http.StatusBadRequest)
		return
	}
	release := strings.TrimPrefix(r.Header.Get("User-Agent"), "outboxd/")
	rc.mu.Lock()
	if rc.byEvent[id] == nil {
		rc.byEvent[id] = map[string]bool{}
	}
	rc.byEvent[id][release] = true
	rc.mu.Unlock()
}

// deliveredBy counts the events with an id above after that release
// delivered.
func (rc *upgradeReceiver) deliveredBy(release string, after int64) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for id, releases := range rc.byEvent {
		if id > after && releases[release] {
			n++
		}
	}
	return n
}

// missing counts the events of ids that no release delivered.
func (rc *upgradeReceiver) missing(ids []int64) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, id := range ids {
		if len(rc.byEvent[id]) == 0 {
			n++
		}
	}
	return n
}

// received says whether any release delivered the event.
func (rc *upgradeReceiver) received(id int64) bool { return rc.missing([]int64{id}) == 0 }

// view is what the receiver saw of the event, and of requests it refused.
func (rc *upgradeReceiver) view(id int64) string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return fmt.Sprintf("delivered by releases %v; %d events received in all, %d requests refused for want of a webhook-id",
		slices.Sorted(maps.Keys(rc.byEvent[id])), len(rc.byEvent), rc.refused)
}

// upgradeProducers record events, each in a transaction of its own, at a
// steady pace, and keep the longest transaction.
type upgradeProducers struct {
	stop atomic.Bool
	wg   sync.WaitGroup

	mu      sync.Mutex // protects the fields below
	longest time.Duration
	err     error // the first a producer met; it stopped there
}

// startUpgradeProducers starts n producers, each recording an event every
// interval.
func startUpgradeProducers(db *sql.DB, n int, interval time.Duration) *upgradeProducers {
	return startProducers(db, n, interval, recordUpgradeEvent)
}

// startProducers starts n producers, each running write every interval in
// a transaction of its own; write is given the producer's number and how
// many transactions it ran before.
func startProducers(db *sql.DB, n int, interval time.Duration, write func(tx *sql.Tx, producer, seq int) error) *upgradeProducers {
	p := &upgradeProducers{}
	for i := range n {
		p.wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for seq := 0; !p.stop.Load(); seq++ {
				took, err := p.produce(db, func(tx *sql.Tx) error { return write(tx, i, seq) })
				p.mu.Lock()
				p.longest = max(p.longest, took)
				if err != nil && p.err == nil {
					p.err = err
				}
				p.mu.Unlock()
				if err != nil {
					return
				}
				<-tick.C
			}
		})
	}
	return p
}

// produce runs write in a transaction of its own, as an application does
// its business write, and says how long the transaction took, BEGIN to
// COMMIT.
func (p *upgradeProducers) produce(db *sql.DB, write func(tx *sql.Tx) error) (time.Duration, error) {
	began := time.Now()
	tx, err := db.Begin()
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := write(tx); err != nil {
		return time.Since(began), err
	}
	err = tx.Commit()
	return time.Since(began), err
}

// recordUpgradeEvent records one event with the three-argument call an
// application of any release makes: the previous release's schema has no
// other, and this one's keeps it.
func recordUpgradeEvent(tx *sql.Tx, producer, seq int) error {
	_, err := tx.Exec(`SELECT outbox.record('upgrade.test', $1, '{}')`, fmt.Sprintf("%d-%d", producer, seq))
	return err
}

// stopAndWait stops the producers, and returns the longest transaction and
// the first error any met.
func (p *upgradeProducers) stopAndWait() (time.Duration, error) {
	p.stop.Store(true)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.longest, p.err
}

// upgradeOverview is what the test reads of GET /api/overview.
type upgradeOverview struct {
	Replicas []struct {
		Version       string `json:"version"`
		SchemaVersion string `json:"schema_version"`
	} `json:"replicas"`
	MixedVersions bool `json:"mixed_versions"`
}

// The rolling upgrade DESIGN.md promises, from the previous release's own
// code: a replica of the previous release (built from its commit) delivers while
// producers record; a replica of this release starts beside it, migrates
// under that load and delivers too, with the overview flagging mixed
// versions (told apart by what each replica records, not by labels this
// test sets); then the old replica stops. Every event recorded is
// delivered (lost 0), the old replica's calls keep working after the
// migration (it delivers events recorded after it, and logs no error), and
// no producer transaction takes over 1 s.
func TestRollingUpgradeFromThePreviousReleaseLosesNothing(t *testing.T) {
	t.Parallel()
	previous := buildRelease(t, previousRelease, previousReleaseVersion)
	db, dsn := newEmptyTestDB(t)
	// Counts the calls of each SQL function, for the check that the old
	// replica called this release's wrappers.
	mustExec(t, db, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''all''', current_database()); END $$`)
	receiver := &upgradeReceiver{byEvent: map[int64]map[string]bool{}}
	hooks := httptest.NewServer(receiver)
	defer hooks.Close()

	old := startUpgradeReplica(t, "release "+previousReleaseVersion, previous, dsn)
	var endpoint Endpoint
	old.api(t, "POST", "/api/endpoints", fmt.Sprintf(`{"url": %q, "topics": ["upgrade.*"]}`, hooks.URL+"/hook"), &endpoint)

	// 4 producers at 25 events/s each: below what one replica delivers on
	// a loaded machine, so the backlog stays short while one migrates.
	// They start at once: the previous release's fan-out claims its events
	// before it reads the endpoints, so a pass under way when the endpoint
	// was created misses none of the events recorded after it
	// (TestFanOutSeesEndpointsCreatedBeforeTheEventsItClaims).
	producers := startUpgradeProducers(db, 4, 40*time.Millisecond)
	defer producers.stopAndWait()
	waitFor(t, "the previous release delivering", 30*time.Second, func() bool {
		return receiver.deliveredBy(previousReleaseVersion, 0) >= 100
	})

	// This release starts beside it and migrates under the load, with one
	// worker, so that the previous release's workers keep a share of the
	// deliveries whichever relay fans them out.
	current := startUpgradeReplica(t, "release "+version, os.Args[0], dsn, "OUTBOXD_TEST_RUN_MAIN=1", "OUTBOXD_WORKERS=1")
	var migrated int64
	if err := db.QueryRow(`SELECT max(id) FROM outbox.events`).Scan(&migrated); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both releases delivering events recorded after the migration", 60*time.Second, func() bool {
		return receiver.deliveredBy(previousReleaseVersion, migrated) >= 100 && receiver.deliveredBy(version, migrated) >= 100
	})
	// Each replica lists what it recorded of itself: its release and the
	// schema it was built with.
	var o upgradeOverview
	current.api(t, "GET", "/api/overview", "", &o)
	var builds []string
	for _, r := range o.Replicas {
		builds = append(builds, r.Version+" schema "+r.SchemaVersion)
	}
	slices.Sort(builds)
	want := []string{
		previousReleaseVersion + " schema " + schemaVersionOf(previousReleaseSchemaChecksum(t)),
		version + " schema " + schemaVersionOf(schemaChecksum()),
	}
	if diff := cmp.Diff(want, builds); diff != "" || !o.MixedVersions {
		t.Errorf("with both releases running the overview lists (-want +got):\n%s\nmixed_versions %t, want true", diff, o.MixedVersions)
	}

	old.stop(t)
	if errs := loggedErrors(old.log.String()); len(errs) > 0 {
		t.Errorf("the previous release logged errors while this release's schema was in place:\n%s", strings.Join(errs, "\n"))
	}
	// It called what this release keeps for it alone (counted once the old
	// replica's sessions ended).
	for _, f := range previousReleaseWrappers {
		if n := queryInt(t, db, `SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcid = $1::regprocedure`, f); n == 0 {
			t.Errorf("the previous release never called %s after the migration", f)
		}
	}
	current.api(t, "GET", "/api/overview", "", &o)
	if len(o.Replicas) != 1 || o.Replicas[0].Version != version || o.MixedVersions {
		t.Errorf("after the roll the overview lists %+v, mixed %t; want this release alone, not mixed", o.Replicas, o.MixedVersions)
	}

	longest, err := producers.stopAndWait()
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	ids, err := queryAll(context.Background(), db, scanID, `SELECT id FROM outbox.events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("%d of the %d events recorded through the roll were never delivered", receiver.missing(ids), len(ids))
			describeUndelivered(t, db, ids, receiver.received, receiver.view, 10)
		}
	}()
	stopped := time.Now()
	waitFor(t, "every recorded event delivered", 60*time.Second, func() bool { return receiver.missing(ids) == 0 })
	t.Logf("%d events recorded through the roll, all delivered %s after the producers stopped; longest producer transaction %s",
		len(ids), time.Since(stopped).Round(time.Millisecond), longest)
	if longest > time.Second {
		t.Errorf("a producer transaction took %s during the roll, want at most 1s", longest)
	}
	current.stop(t)
}

// loggedErrors are the lines of an outboxd text log that report an
// error, at any level: a relay batch that failed is a warning.
func loggedErrors(log string) []string {
	var out []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, " err=") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// A job 0.6.0 completed, kept in the queue with its answer on the job,
// goes to the history as the attempt that completed it when 0.8.0's
// migration runs, and leaves the queue; one completed without its effect
// keeps its note as the attempt's error; one whose attempt the history
// has already keeps that row.
func TestMigrationMovesCompletedJobsToTheHistory(t *testing.T) {
	t.Parallel()
	db := migratedThrough(t, newMigration(nil), 6) // a database of 0.6.0
	event := recordEventOrFatal(t, db, "done")
	var endpoint, answered, kept int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret) VALUES ('https://receiver.example/hook', $1) RETURNING id`,
		make([]byte, 32)).Scan(&endpoint); err != nil {
		t.Fatal(err)
	}
	insertCompleted := `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at,
		finalized_at, status_code, duration_ms)
		VALUES ('webhook', $1, $2, 18, 'completed', 2, now() - interval '1 minute', now() - interval '59 seconds', $3, $4) RETURNING id`
	if err := db.QueryRow(insertCompleted, event, endpoint, 200, 12).Scan(&answered); err != nil {
		t.Fatal(err)
	}
	notSent := recordEventOrFatal(t, db, "not sent")
	var skipped int64
	if err := db.QueryRow(insertCompleted, notSent, endpoint, nil, nil).Scan(&skipped); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `UPDATE outbox.jobs SET errors = '[{"attempt": 1, "error": "HTTP 500"}, {"attempt": 2, "error": "not sent: gone"}]' WHERE id = $1`, skipped)
	other := recordEventOrFatal(t, db, "kept")
	if err := db.QueryRow(insertCompleted, other, endpoint, nil, nil).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO outbox.deliveries (job_id, attempt, duration_ms, status_code) VALUES ($1, 2, 40, 204)`, kept)

	if err := migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	got := queryStrings(t, db, `
		SELECT job_id || ' ' || attempt || ' ' || outcome || ' ' || coalesce(status_code, 0) || ' ' || duration_ms || ' ' || error
		FROM outbox.deliveries ORDER BY job_id`)
	want := []string{
		fmt.Sprintf("%d 2 completed 200 12 ", answered),
		fmt.Sprintf("%d 2 completed 0 0 not sent: gone", skipped),
		fmt.Sprintf("%d 2 completed 204 40 ", kept),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the history after the migration (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Errorf("%d jobs left in the queue, want none: completed jobs leave it", n)
	}
}
