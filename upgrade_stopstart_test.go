// upgrade_stopstart_test.go: the upgrade that stops the first release and
// starts this one on its database, from the first release's own binary and
// the state it leaves when it dies mid-work.

package main

import (
	"bytes"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// firstRelease is the release before numbered migrations that every later
// one must still upgrade from: its database is placed by the checksum it
// recorded in outbox.schema_applied and gets every migration after it.
const firstRelease = "0.1.0"

// firstReleaseBuilds are the commits 0.1.0 was built from, with one
// schema: main as it stood on 2026-12-04, and 0.1.0 as last built.
var firstReleaseBuilds = []string{"2af1956", "e5d1140"}

// The settings both releases run with: short waits, so that the test
// reaches each state in seconds, and one sealing key, so that the secrets
// the first release sealed are opened by this one. Given as environment
// variables, the fallback of the flags of the same names (-job-poll ...)
// in both releases.
var stopStartSettings = []string{
	"OUTBOXD_RELAY_SWEEP=200ms",
	"OUTBOXD_JOB_POLL=100ms",
	// The slow receiver holds its requests until the process is killed,
	// a few seconds: well inside an attempt's time.
	"OUTBOXD_JOB_TIMEOUT=20s",
	"OUTBOXD_JOB_RESCUE_MARGIN=1s",
	"OUTBOXD_JOB_RESCUE_INTERVAL=500ms",
	// The killed replica is declared dead, and its running jobs rescued,
	// 2 s after its last heartbeat: 4 heartbeats (at least 3 must fit).
	"OUTBOXD_REPLICA_HEARTBEAT=500ms",
	"OUTBOXD_REPLICA_DEAD_AFTER=2s",
}

// What the first release leaves behind when it is killed, per endpoint.
const (
	// laneSubjects each record laneEvents events to the ordered endpoint,
	// whose receiver acknowledges the first laneAnswered of each and holds
	// the next open: the killed process is running it, and the rest wait
	// behind it in its lane.
	laneSubjects = 2
	laneEvents   = 6
	laneAnswered = 3
	// failingEvents go to a receiver answering 500: retrying at the kill.
	failingEvents = 3
	// goneEvents go to a receiver answering 410 Gone, which 0.1.0 treats
	// as final: discarded, and the endpoint disabled.
	goneEvents = 3
)

// An upgrade by stop and start: release 0.1.0 (each of its builds, from
// its commit) runs on an empty database under producers that record with
// outbox.record and write a table outbox.watch watches; through its own
// API it gets endpoints (healthy, ordered by subject, failing, gone) and
// an inbox source, all with secrets sealed under -secrets-key. It is
// killed while a slow receiver holds requests open, with retrying and
// discarded jobs and an ordered lane half way; the producers go on while
// no outboxd runs, leaving events not fanned out. This release starts on
// the database with the same key, applies every migration since 0.1.0 and
// takes over: every event reaches each endpoint it should (lost 0), the
// killed process's jobs are rescued and delivered, each subject reaches
// the ordered endpoint in order, the discarded jobs stay discarded, every
// request is signed with its endpoint's secret, and no producer
// transaction takes over 1 s.
func TestStopAndStartUpgradeFromTheFirstReleaseLosesNothing(t *testing.T) {
	t.Parallel()
	// The builds one after the other: each runs two outboxd processes,
	// producers and a receiver, already as much as the two CPUs of a
	// small CI machine take.
	for _, commit := range firstReleaseBuilds {
		t.Run(commit, func(t *testing.T) { testStopAndStartUpgrade(t, commit) })
	}
}

func testStopAndStartUpgrade(t *testing.T, commit string) {
	began := time.Now()
	first := buildRelease(t, commit, firstRelease)
	db, dsn := newEmptyTestDB(t)
	hooks := newHookReceiver()
	server := httptest.NewServer(hooks)
	defer server.Close()
	settings := append([]string{"OUTBOXD_SECRETS_KEY=" + newSecretsKey(t)}, stopStartSettings...)

	old := startUpgradeReplica(t, "release "+firstRelease+" ("+commit+")", first, dsn, settings...)
	checkPlacedAsFirstRelease(t, db)
	shop := old.createEndpoint(t, hooks, server.URL, "/shop", `"topics": ["shop.*", "partner.*"]`)
	lanes := old.createEndpoint(t, hooks, server.URL, "/lanes", `"topics": ["lane.*"], "ordering": "subject"`)
	failing := old.createEndpoint(t, hooks, server.URL, "/failing", `"topics": ["failing.*"]`)
	gone := old.createEndpoint(t, hooks, server.URL, "/gone", `"topics": ["gone.*"]`)
	partner := old.createInboxSource(t, "partner")
	hooks.answer("/failing", http.StatusInternalServerError)
	hooks.answer("/gone", http.StatusGone)
	hooks.holdFrom("/lanes", laneAnswered)

	// The application's table, watched as a 0.1.0 application watches it:
	// outbox.watch(tbl, topic, columns), the only form 0.1.0 has.
	mustExec(t, db, `CREATE TABLE shop_orders (id text PRIMARY KEY, status text NOT NULL)`)
	mustExec(t, db, `SELECT outbox.watch('shop_orders', 'shop.order', ARRAY['status'])`)
	// 4 producers, a transaction each every 50 ms: 80 events a second,
	// half recorded, half by the watch's triggers.
	producers := startProducers(db, 4, 50*time.Millisecond, writeShop)
	defer producers.stopAndWait()

	for range goneEvents {
		mustExec(t, db, `SELECT outbox.record('gone.ping', '', '{}')`)
	}
	for i := range 3 {
		old.postInbox(t, partner, fmt.Sprintf("partner-%d", i), fmt.Sprintf("inv-%d", i), false)
	}
	waitFor(t, "release 0.1.0 delivering the shop's events", 30*time.Second, func() bool { return hooks.acked("/shop") >= 300 })
	// Recorded last, so that the killed process holds a lane's request
	// for seconds, well inside an attempt's time; and so that a failing
	// delivery's third attempt, 16 s after its second (0.1.0's backoff,
	// attempt⁴ seconds), comes after the upgrade, once its receiver has
	// recovered.
	for s := range laneSubjects {
		for seq := range laneEvents {
			mustExec(t, db, `SELECT outbox.record('lane.step', $1, $2)`, fmt.Sprintf("lane-%d", s), fmt.Sprintf(`{"seq": %d}`, seq))
		}
	}
	for range failingEvents {
		mustExec(t, db, `SELECT outbox.record('failing.ping', '', '{}')`)
	}
	waitFor(t, "the ordered lanes half way, the failing deliveries retrying after 2 attempts, the gone ones discarded", 30*time.Second, func() bool {
		jobs := jobsByState(t, db)
		return jobs[lanes][jobCompleted] == laneSubjects*laneAnswered && hooks.heldNow("/lanes") == laneSubjects &&
			hooks.requests("/failing") == 2*failingEvents && jobs[failing][jobRetryable] == failingEvents &&
			jobs[gone][jobDiscarded] == goneEvents
	})

	// The slow receiver: the shop's requests are held open from here, and
	// the process is killed while it waits for them.
	hooks.holdFrom("/shop", 0)
	waitFor(t, "requests held open by the slow receiver", 30*time.Second, func() bool { return hooks.heldNow("/shop") >= 4 })
	old.kill(t)
	killed := time.Now()
	goneRequests := hooks.requests("/gone")
	hooks.holdFrom("/shop", math.MaxInt)
	hooks.holdFrom("/lanes", math.MaxInt)
	// The producers go on with no outboxd running: 2 s of their events.
	waitFor(t, "events recorded while no outboxd runs", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL`) >= 160
	})
	stopped := checkStoppedState(t, db, shop, lanes, failing, gone)

	current := startUpgradeReplica(t, "release "+version, os.Args[0], dsn, append(settings, "OUTBOXD_TEST_RUN_MAIN=1")...)
	started := time.Now()
	checkMigratedFromFirstRelease(t, db, current.log.String())
	hooks.answer("/failing", http.StatusOK)
	// The inbox opens the secret 0.1.0 sealed, and remembers what 0.1.0
	// recorded: a webhook it took is a duplicate here.
	current.postInbox(t, partner, "partner-1", "inv-1", true)
	current.postInbox(t, partner, "partner-3", "inv-3", false)
	waitFor(t, "this release delivering the shop's events and the failing endpoint's, once it recovered", 90*time.Second, func() bool {
		return hooks.ackedBy("/shop", version) >= 300 && hooks.ackedBy("/failing", version) == failingEvents
	})

	longest, err := producers.stopAndWait()
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	producersStopped := time.Now()
	want := expectedDeliveries(t, db)
	defer func() {
		if t.Failed() {
			describeUndelivered(t, db, want["/shop"], func(id int64) bool { return hooks.ackedEvent("/shop", id) },
				func(id int64) string { return hooks.view("/shop", id) }, 10)
		}
	}()
	waitFor(t, "every event delivered to each endpoint it should reach", 2*time.Minute, func() bool {
		for path, ids := range want {
			if len(hooks.missing(path, ids)) > 0 {
				return false
			}
		}
		return true
	})
	drained := time.Since(producersStopped)

	checkRescued(t, db, hooks, stopped.running)
	checkLanesInOrder(t, hooks, "/lanes")
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'discarded'`, gone); n != goneEvents {
		t.Errorf("the gone endpoint has %d discarded jobs after the upgrade, want the %d discarded before it", n, goneEvents)
	}
	if n := hooks.requests("/gone"); n != goneRequests {
		t.Errorf("the gone endpoint got %d requests after the kill, want none", n-goneRequests)
	}
	hooks.checkSignatures(t)
	if errs := loggedErrors(current.log.String()); len(errs) > 0 {
		t.Errorf("this release logged errors:\n%s", strings.Join(errs, "\n"))
	}
	if longest > time.Second {
		t.Errorf("a producer transaction took %s through the upgrade, want at most 1s", longest)
	}
	due := 0
	for _, ids := range want {
		due += len(ids)
	}
	t.Logf("%d events recorded; %d deliveries due to the endpoints, lost 0 (and %d discarded by release %s, still discarded); "+
		"longest producer transaction %s; this release started %s after the kill and drained %s after the producers stopped; %s in all",
		queryInt(t, db, `SELECT count(*) FROM outbox.events`), due, goneEvents, firstRelease, longest,
		started.Sub(killed).Round(time.Millisecond), drained.Round(time.Millisecond), time.Since(began).Round(time.Second))
	current.stop(t)
}

// checkPlacedAsFirstRelease checks that release 0.1.0 recorded the
// schema checksum that places its database as 0.1.0's.
func checkPlacedAsFirstRelease(t *testing.T, db *sql.DB) {
	t.Helper()
	var checksums string
	if err := db.QueryRow(`SELECT string_agg(checksum, ', ') FROM outbox.schema_applied`).Scan(&checksums); err != nil {
		t.Fatal(err)
	}
	if want := legacyChecksum(1); checksums != want {
		t.Fatalf("release %s recorded the schema checksum %s, and legacyChecksums has %s for it", firstRelease, checksums, want)
	}
}

// newSecretsKey is a -secrets-key: 32 random bytes in standard base64.
func newSecretsKey(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	return base64.StdEncoding.EncodeToString(key)
}

// writeShop is a 0.1.0 application's business write: even producers
// record a payment with outbox.record's three-argument call, the only one
// 0.1.0 has; odd ones place an order in the watched table and then pay it,
// and its triggers record each change.
func writeShop(tx *sql.Tx, producer, seq int) error {
	order := fmt.Sprintf("%d-%d", producer, seq/2)
	var err error
	switch {
	case producer%2 == 0:
		_, err = tx.Exec(`SELECT outbox.record('shop.paid', $1, '{"amount": 1200}')`, fmt.Sprintf("%d-%d", producer, seq))
	case seq%2 == 0:
		_, err = tx.Exec(`INSERT INTO shop_orders (id, status) VALUES ($1, 'placed')`, order)
	default:
		_, err = tx.Exec(`UPDATE shop_orders SET status = 'paid' WHERE id = $1`, order)
	}
	return err
}

// createEndpoint registers the endpoint of hooks at path through r's API,
// with the settings of fields, gives hooks its secret, and returns its id.
func (r *upgradeReplica) createEndpoint(t *testing.T, hooks *hookReceiver, hooksURL, path, fields string) int64 {
	t.Helper()
	var e struct {
		ID     int64  `json:"id"`
		Secret string `json:"secret"`
	}
	r.api(t, "POST", "/api/endpoints", fmt.Sprintf(`{"url": %q, %s}`, hooksURL+path, fields), &e)
	secret, err := parseWebhookSecret(e.Secret)
	if err != nil {
		t.Fatalf("the secret of endpoint %d: %v", e.ID, err)
	}
	hooks.addEndpoint(e.ID, path, secret)
	return e.ID
}

// inboxSource is a source of the inbox, as its sender knows it.
type inboxSource struct {
	name   string
	secret webhookSecret
}

// createInboxSource makes the inbox source name through r's API.
func (r *upgradeReplica) createInboxSource(t *testing.T, name string) inboxSource {
	t.Helper()
	var created struct {
		Secret string `json:"secret"`
	}
	r.api(t, "POST", "/api/sources", fmt.Sprintf(`{"name": %q}`, name), &created)
	secret, err := parseWebhookSecret(created.Secret)
	if err != nil {
		t.Fatalf("the secret of source %s: %v", name, err)
	}
	return inboxSource{name, secret}
}

// postInbox sends r's inbox one webhook of source, signed with its
// secret, and checks the answer: recorded, or a duplicate.
func (r *upgradeReplica) postInbox(t *testing.T, source inboxSource, webhookID, subject string, duplicate bool) {
	t.Helper()
	body := fmt.Appendf(nil, `{"type": "invoice.paid", "subject": %q, "data": {"amount": 1200}}`, subject)
	req, err := http.NewRequest("POST", "http://"+r.addr+"/webhooks/"+source.name, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	setWebhookHeaders(req.Header, [][]byte{source.secret}, webhookID, time.Now(), body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	var got struct {
		EventID   int64 `json:"event_id"`
		Duplicate bool  `json:"duplicate"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(answer, &got) != nil || got.Duplicate != duplicate || (!duplicate && got.EventID == 0) {
		t.Fatalf("webhook %s to %s's inbox: %s %s, want 200 with duplicate %t", webhookID, r.name, resp.Status, answer, duplicate)
	}
}

// kill ends r with SIGKILL, as a crash or an OOM kill does: nothing it
// holds is released but by the database and the kernel.
func (r *upgradeReplica) kill(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.exited
}

// jobsByState counts the jobs of each endpoint by state, an ordered
// lane's waiting delivery (0.1.0 holds it 'available' until infinity) as
// "held".
func jobsByState(t *testing.T, db *sql.DB) map[int64]map[jobState]int {
	t.Helper()
	rows, err := db.Query(`
SELECT endpoint_id,
       CASE WHEN state = 'available' AND scheduled_at = 'infinity' THEN 'held' ELSE state::text END,
       count(*)
FROM outbox.jobs
WHERE endpoint_id IS NOT NULL
GROUP BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]map[jobState]int{}
	for rows.Next() {
		var endpoint int64
		var state jobState
		var n int
		if err := rows.Scan(&endpoint, &state, &n); err != nil {
			t.Fatal(err)
		}
		if out[endpoint] == nil {
			out[endpoint] = map[jobState]int{}
		}
		out[endpoint][state] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// jobHeld is jobsByState's name for an ordered lane's waiting delivery.
const jobHeld jobState = "held"

// stoppedState is what the killed release left for this one.
type stoppedState struct {
	unfanned int
	running  []runningJob // the killed process's jobs
}

// runningJob is a job the killed process was running.
type runningJob struct {
	id, eventID, endpointID int64
}

// checkStoppedState reads and checks the state the first release left,
// with no outboxd running: each fault the test aims at is there.
func checkStoppedState(t *testing.T, db *sql.DB, shop, lanes, failing, gone int64) stoppedState {
	t.Helper()
	s := stoppedState{unfanned: queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL`)}
	rows, err := db.Query(`SELECT id, event_id, endpoint_id FROM outbox.jobs WHERE state = 'running' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var j runningJob
		if err := rows.Scan(&j.id, &j.eventID, &j.endpointID); err != nil {
			t.Fatal(err)
		}
		s.running = append(s.running, j)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	jobs := jobsByState(t, db)
	t.Logf("left by the killed release: %d events not fanned out; jobs of the shop %v, of the ordered lanes %v, "+
		"of the failing endpoint %v, of the gone one %v", s.unfanned, jobs[shop], jobs[lanes], jobs[failing], jobs[gone])
	if s.unfanned == 0 {
		t.Error("no event waits to be fanned out")
	}
	if jobs[shop][jobRunning] == 0 {
		t.Error("the killed process was running none of the shop's deliveries")
	}
	wantLanes := map[jobState]int{
		jobCompleted: laneSubjects * laneAnswered,
		jobRunning:   laneSubjects,
		jobHeld:      laneSubjects * (laneEvents - laneAnswered - 1),
	}
	if diff := cmp.Diff(wantLanes, jobs[lanes]); diff != "" {
		t.Errorf("the ordered lanes are not half way (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[jobState]int{jobRetryable: failingEvents}, jobs[failing]); diff != "" {
		t.Errorf("the failing endpoint's jobs are not all retrying (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[jobState]int{jobDiscarded: goneEvents}, jobs[gone]); diff != "" {
		t.Errorf("the gone endpoint's jobs are not all discarded (-want +got):\n%s", diff)
	}
	if t.Failed() {
		t.FailNow()
	}
	return s
}

// checkMigratedFromFirstRelease checks that this release brought the
// database from 0.1.0 through every migration after it: its log names
// each, and outbox.migrations records them all finished.
func checkMigratedFromFirstRelease(t *testing.T, db *sql.DB, log string) {
	t.Helper()
	var want []int64
	for _, f := range embeddedMigrations() {
		want = append(want, int64(f.version))
		line := `msg="applying a migration" migration=` + f.name
		switch applied := strings.Contains(log, line); {
		case f.release == firstRelease && applied:
			t.Errorf("this release applied %s, the first release's own, again: it did not place the database as %s's", f.name, firstRelease)
		case f.release != firstRelease && !applied:
			t.Errorf("this release's log lacks %s", line)
		}
	}
	got, err := queryAll(t.Context(), db, scanID, `SELECT version FROM outbox.migrations WHERE finished_at IS NOT NULL ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("migrations recorded finished (-want +got):\n%s", diff)
	}
}

// expectedDeliveries are the events each endpoint must get, by its
// receiver's path: those of the topics it subscribes to. The gone
// endpoint gets none: 0.1.0 discarded its deliveries and disabled it.
func expectedDeliveries(t *testing.T, db *sql.DB) map[string][]int64 {
	t.Helper()
	rows, err := db.Query(`SELECT id, topic FROM outbox.events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[string][]int64{}
	for rows.Next() {
		var id int64
		var topic string
		if err := rows.Scan(&id, &topic); err != nil {
			t.Fatal(err)
		}
		switch prefix, _, _ := strings.Cut(topic, "."); prefix {
		case "shop", "partner":
			want["/shop"] = append(want["/shop"], id)
		case "lane":
			want["/lanes"] = append(want["/lanes"], id)
		case "failing":
			want["/failing"] = append(want["/failing"], id)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return want
}

// checkRescued checks that every job the killed process was running was
// rescued and delivered by this release.
func checkRescued(t *testing.T, db *sql.DB, hooks *hookReceiver, running []runningJob) {
	t.Helper()
	for _, j := range running {
		path := hooks.path(j.endpointID)
		// Delivered, the job has left the queue: its completing attempt
		// stands in the history.
		var state string
		if err := db.QueryRow(`SELECT state::text FROM outbox.jobs WHERE id = $1
			UNION ALL SELECT 'completed' FROM outbox.deliveries WHERE job_id = $1 AND outcome = 'completed'`, j.id).Scan(&state); err != nil {
			t.Fatal(err)
		}
		if state != string(jobCompleted) || !hooks.ackedEventBy(path, j.eventID, version) {
			t.Errorf("job %d of the killed process (event %d to %s): %s, %s; want completed, delivered by release %s",
				j.id, j.eventID, path, state, hooks.view(path, j.eventID), version)
		}
	}
}

// checkLanesInOrder checks that path's receiver acknowledged each
// subject's events in the order of their ids: a delivery sent again (its
// acknowledgement lost with the killed process) may repeat the last one,
// never go back further.
func checkLanesInOrder(t *testing.T, hooks *hookReceiver, path string) {
	t.Helper()
	bySubject := map[string][]int64{}
	for _, r := range hooks.all(path) {
		if r.status/100 == 2 {
			bySubject[r.subject] = append(bySubject[r.subject], r.eventID)
		}
	}
	if len(bySubject) != laneSubjects {
		t.Errorf("%s got %d subjects, want %d", path, len(bySubject), laneSubjects)
	}
	for subject, ids := range bySubject {
		if !slices.IsSorted(ids) {
			t.Errorf("%s got subject %s's events in the order %v", path, subject, ids)
		}
	}
}

// hookReceiver is the receiving side of every endpoint: one path an
// endpoint, each with its answer, and every request kept.
type hookReceiver struct {
	mu      sync.Mutex // protects the fields below
	routes  map[string]hookRoute
	secrets map[string]webhookSecret // by path
	paths   map[int64]string         // by endpoint id
	got     []hookRequest
	held    map[string]int // requests held open now, by path
}

// hookRoute is how one path answers.
type hookRoute struct {
	status int
	// holdFrom holds open every request whose payload's seq (0 if none)
	// is at least this, until its sender goes away; math.MaxInt holds none.
	holdFrom int
}

// hookRequest is one request received, as it came, and what it was
// answered (0: held open until its sender went away).
type hookRequest struct {
	path     string
	header   http.Header
	body     []byte
	at       time.Time
	release  string // from the User-Agent, outboxd/<release>
	eventID  int64
	subject  string
	status   int
	parseErr error
}

func newHookReceiver() *hookReceiver {
	return &hookReceiver{routes: map[string]hookRoute{}, secrets: map[string]webhookSecret{}, paths: map[int64]string{}, held: map[string]int{}}
}

func (h *hookReceiver) route(path string) hookRoute {
	if r, ok := h.routes[path]; ok {
		return r
	}
	return hookRoute{status: http.StatusOK, holdFrom: math.MaxInt}
}

// answer makes path answer status.
func (h *hookReceiver) answer(path string, status int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.route(path)
	r.status = status
	h.routes[path] = r
}

// holdFrom makes path hold open the requests of seq from on.
func (h *hookReceiver) holdFrom(path string, from int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.route(path)
	r.holdFrom = from
	h.routes[path] = r
}

// addEndpoint tells h that endpoint id delivers to path, signed with
// secret.
func (h *hookReceiver) addEndpoint(id int64, path string, secret webhookSecret) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.secrets[path] = secret
	h.paths[id] = path
}

// path is endpoint id's path.
func (h *hookReceiver) path(id int64) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.paths[id]
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := hookRequest{path: r.URL.Path, header: r.Header.Clone(), body: body, at: time.Now(),
		release: strings.TrimPrefix(r.Header.Get("User-Agent"), "outboxd/")}
	var b struct {
		ID      string `json:"id"`
		Subject string `json:"subject"`
		Data    struct {
			Seq int `json:"seq"`
		} `json:"data"`
	}
	if req.parseErr = json.Unmarshal(body, &b); req.parseErr == nil {
		req.eventID, req.parseErr = strconv.ParseInt(b.ID, 10, 64)
		req.subject = b.Subject
	}
	h.mu.Lock()
	route := h.route(req.path)
	hold := b.Data.Seq >= route.holdFrom
	if hold {
		h.held[req.path]++
	} else {
		req.status = route.status
	}
	h.mu.Unlock()
	if hold {
		// Until the sender goes away: a request held open is never
		// answered, so it never counts as delivered.
		<-r.Context().Done()
	}
	h.mu.Lock()
	if hold {
		h.held[req.path]--
	}
	h.got = append(h.got, req)
	h.mu.Unlock()
	if !hold {
		w.WriteHeader(req.status)
	}
}

// all is every request path got that has ended, answered or abandoned.
func (h *hookReceiver) all(path string) []hookRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []hookRequest
	for _, r := range h.got {
		if r.path == path {
			out = append(out, r)
		}
	}
	return out
}

// requests counts the requests path got that have ended.
func (h *hookReceiver) requests(path string) int { return len(h.all(path)) }

// heldNow counts the requests path holds open now.
func (h *hookReceiver) heldNow(path string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[path]
}

// acked counts the distinct events path acknowledged with a 2xx.
func (h *hookReceiver) acked(path string) int { return h.ackedBy(path, "") }

// ackedBy counts the distinct events path acknowledged from release
// ("": any).
func (h *hookReceiver) ackedBy(path, release string) int {
	seen := map[int64]bool{}
	for _, r := range h.all(path) {
		if r.status/100 == 2 && (release == "" || r.release == release) {
			seen[r.eventID] = true
		}
	}
	return len(seen)
}

// ackedEvent says whether path acknowledged the event.
func (h *hookReceiver) ackedEvent(path string, id int64) bool { return h.ackedEventBy(path, id, "") }

// ackedEventBy says whether path acknowledged the event from release ("":
// any).
func (h *hookReceiver) ackedEventBy(path string, id int64, release string) bool {
	for _, r := range h.all(path) {
		if r.eventID == id && r.status/100 == 2 && (release == "" || r.release == release) {
			return true
		}
	}
	return false
}

// missing is the events of ids that path never acknowledged.
func (h *hookReceiver) missing(path string, ids []int64) []int64 {
	got := map[int64]bool{}
	for _, r := range h.all(path) {
		if r.status/100 == 2 {
			got[r.eventID] = true
		}
	}
	var out []int64
	for _, id := range ids {
		if !got[id] {
			out = append(out, id)
		}
	}
	return out
}

// view is what path got of the event: each request's release and answer.
func (h *hookReceiver) view(path string, id int64) string {
	var seen []string
	for _, r := range h.all(path) {
		if r.eventID == id {
			seen = append(seen, fmt.Sprintf("%s answered %d at %s", r.release, r.status, r.at.UTC().Format(time.RFC3339Nano)))
		}
	}
	if len(seen) == 0 {
		return path + " got no request for it"
	}
	return path + " got: " + strings.Join(seen, "; ")
}

// checkSignatures checks every request received against its endpoint's
// secret, with the receiver's clock as it was when the request came.
func (h *hookReceiver) checkSignatures(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	bad := 0
	for _, r := range h.got {
		secret, ok := h.secrets[r.path]
		err := r.parseErr
		if err == nil && !ok {
			err = fmt.Errorf("no endpoint has path %s", r.path)
		}
		if err == nil {
			err = verifyWebhook([][]byte{secret}, r.header, r.body, r.at)
		}
		if err != nil {
			if bad++; bad <= 10 {
				t.Errorf("a request to %s from release %s at %s: %v", r.path, r.release, r.at.UTC().Format(time.RFC3339Nano), err)
			}
		}
	}
	if bad > 10 {
		t.Errorf("%d more requests not signed with their endpoint's secret", bad-10)
	}
	t.Logf("%d requests received, %d not signed with their endpoint's secret", len(h.got), bad)
}
