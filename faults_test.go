// faults_test.go: the black-box fault suite. Two outboxd processes share a
// PostgreSQL cluster that belongs to this test alone (so the test may
// restart it); producers write business rows with their events, some
// rolling back on purpose; a receiver logs every webhook; and seeded faults
// break things at random points: SIGKILL of a replica mid relay pass and mid
// delivery, pg_terminate_backend of every connection (LISTEN included), a
// restart of the server, a receiver that answers 500, hangs, cuts the
// connection or is down, and notifications suppressed at the source. Then
// faults_checker_test.go judges the run from the business table and the
// receiver's log.
// TestFaultSuiteBehindPgBouncer runs the same suite with the replicas and
// the producers behind PgBouncer in transaction pooling mode.
//
// Default: 600 events and 9 faults, seed 1. Longer:
//
//	OUTBOXD_FAULTS_EVENTS=100000 OUTBOXD_FAULTS=50 OUTBOXD_FAULTS_SEED=7 \
//	  go test -run TestFaultSuiteLosesNothing -v -timeout 60m .

package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// faultRunConfig is the size of a run, from OUTBOXD_FAULTS_* variables.
type faultRunConfig struct {
	Events    int     // committed events to produce (OUTBOXD_FAULTS_EVENTS)
	Faults    int     // faults to inject (OUTBOXD_FAULTS)
	Seed      uint64  // seeds the faults, their points and the producers (OUTBOXD_FAULTS_SEED)
	Rate      float64 // producer transactions per second (OUTBOXD_FAULTS_RATE)
	Producers int
}

func faultRunConfigFromEnv(t *testing.T) faultRunConfig {
	t.Helper()
	cfg := faultRunConfig{Events: 600, Faults: 9, Seed: 1, Producers: 4}
	for name, dst := range map[string]*int{"OUTBOXD_FAULTS_EVENTS": &cfg.Events, "OUTBOXD_FAULTS": &cfg.Faults} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a non-negative integer", name, v)
			}
			*dst = n
		}
	}
	if v := os.Getenv("OUTBOXD_FAULTS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("OUTBOXD_FAULTS_SEED=%q: want an integer", v)
		}
		cfg.Seed = n
	}
	// Spread production over about 20 s at the default size, faster for
	// long runs, so the faults land among live traffic.
	cfg.Rate = min(max(float64(cfg.Events)/20, 30), 1000)
	if v := os.Getenv("OUTBOXD_FAULTS_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 {
			t.Fatalf("OUTBOXD_FAULTS_RATE=%q: want a positive number", v)
		}
		cfg.Rate = r
	}
	if cfg.Events > 10_000 {
		cfg.Producers = 8
	}
	return cfg
}

// The producers' topics, and the endpoints that subscribe to each: the
// checker's expectation, written out by hand rather than computed by
// outboxd's matcher. "all" subscribes to everything, so every event
// reaches the receiver at least there.
var (
	faultTopics      = []string{"order.created", "order.paid", "user.signup", "audit.note"}
	faultSubscribers = map[string][]string{
		"order.created": {"orders", "all"},
		"order.paid":    {"orders", "billing", "all"},
		"user.signup":   {"billing", "all"},
		"audit.note":    {"all"},
	}
	faultEndpointTopics = map[string][]string{
		"orders":  {"order.*"},
		"billing": {"order.paid", "user.signup"},
		"all":     {},
	}
)

// Timings of the replicas under test: short, so every fault heals in
// seconds. A webhook gives up after 1 s, an attempt after 2 s, and a job
// whose worker died is rescued 2 s after that.
const (
	faultWebhookTimeout = time.Second
	faultJobTimeout     = 2 * time.Second
	faultRescueMargin   = 2 * time.Second
	faultAdminToken     = "faults-admin-token-0123456789"
)

func faultReplicaArgs(dsn string) []string {
	return []string{
		"-database-url", dsn,
		"-admin-token", faultAdminToken,
		"-allow-private-endpoints",
		"-relay-sweep", "500ms",
		"-relay-batch", "100",
		"-job-poll", "200ms",
		"-job-timeout", faultJobTimeout.String(),
		"-job-rescue-margin", faultRescueMargin.String(),
		"-job-rescue-interval", "500ms",
		"-webhook-timeout", faultWebhookTimeout.String(),
		"-failing-endpoint-delay", "1s",
		"-workers", "8",
		"-db-max-conns", "8",
		"-shutdown-grace", "5s",
	}
}

// TestFaultSuiteLosesNothing is the suite; see the file comment.
func TestFaultSuiteLosesNothing(t *testing.T) { faultSuite(t, false) }

// TestFaultSuiteBehindPgBouncer is the suite with the replicas (in -pool-mode
// transaction) and the producers behind PgBouncer in transaction pooling
// mode (pgbouncer_test.go); the faults still hit the server directly.
func TestFaultSuiteBehindPgBouncer(t *testing.T) { faultSuite(t, true) }

func faultSuite(t *testing.T, viaPgBouncer bool) {
	if testing.Short() {
		t.Skip("the fault suite takes about a minute; go test -short skips it, .ci/run and go test ./... run it")
	}
	t.Parallel()
	cfg := faultRunConfigFromEnv(t)
	h := newFaultHarness(t, cfg, viaPgBouncer)
	h.registerEndpoints()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { h.produce(ctx) })
	h.injectFaults(ctx)
	wg.Wait()

	h.awaitQuiescence()
	h.stopReplicas()
	h.check()
}

// faultHarness is one run: the cluster, the replicas, the receiver, the
// producers' ledger and the faults.
type faultHarness struct {
	t      *testing.T
	cfg    faultRunConfig
	rng    *rand.Rand
	dir    string // the cluster's data folder
	logger *slog.Logger

	clusterMu sync.Mutex // protects cluster
	cluster   *cluster
	bouncer   *pgBouncer // in front of the cluster for replicas and producers; nil: none

	admin    *sql.DB // the test's own connections: application_name faults-admin
	recv     *faultReceiver
	replicas map[string]*faultReplica

	committed atomic.Int64 // producer transactions committed
	bursts    atomic.Int64 // names each burst's keys

	ledgerMu     sync.Mutex // protects the ledger below
	notCommitted []string
	ambiguous    []string // COMMIT failed: the business table says what happened

	faults []injectedFault
}

func newFaultHarness(t *testing.T, cfg faultRunConfig, viaPgBouncer bool) *faultHarness {
	h := &faultHarness{
		t:      t,
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(cfg.Seed, 0x6661756c7473)),
		dir:    t.TempDir(),
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if os.Geteuid() == 0 {
		// The server runs as postgres and must reach the folder.
		os.Chmod(filepath.Dir(h.dir), 0o755)
		os.Chmod(h.dir, 0o755)
	}
	c, err := startCluster(context.Background(), h.dir, h.logger)
	if err != nil {
		t.Fatal(err)
	}
	h.cluster = c
	t.Cleanup(func() {
		h.clusterMu.Lock()
		defer h.clusterMu.Unlock()
		h.cluster.Stop()
	})

	if viaPgBouncer {
		// 10 server connections for two replicas of 8 and 4 producers.
		h.bouncer = startPgBouncer(t, h.cluster.DSN("outboxd"), 10)
		// Replicas behind a pooler in transaction mode migrate nothing
		// (migrate.go, requireMigrated): migrate over the direct
		// connection first, as docs/replicas.md says an operator does.
		db, err := openDB(context.Background(), h.dsn("faults-migrate"), 2)
		if err != nil {
			t.Fatal(err)
		}
		err = migrate(context.Background(), db)
		db.Close()
		if err != nil {
			t.Fatalf("migrate before the replicas behind the pooler: %v", err)
		}
	}

	h.admin, err = sql.Open("postgres", h.dsn("faults-admin"))
	if err != nil {
		t.Fatal(err)
	}
	h.admin.SetMaxOpenConns(cfg.Producers + 4)
	t.Cleanup(func() { h.admin.Close() })
	mustExec(t, h.admin, `
		CREATE TABLE IF NOT EXISTS fault_orders (
		  key        text        PRIMARY KEY,
		  topic      text        NOT NULL,
		  amount     integer     NOT NULL,
		  created_at timestamptz NOT NULL DEFAULT now()
		)`)

	h.recv = newFaultReceiver(t)
	h.replicas = map[string]*faultReplica{}
	for _, name := range []string{"a", "b"} {
		args := faultReplicaArgs(h.clientDSN("outboxd-" + name))
		if viaPgBouncer {
			args = append(args, "-pool-mode", "transaction")
		}
		r := &faultReplica{t: t, name: name, args: args,
			logPath: filepath.Join(t.TempDir(), "outboxd-"+name+".log")}
		h.replicas[name] = r
		r.start()
		t.Cleanup(r.kill)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"a", "b"} {
				t.Logf("outboxd-%s's log ends:\n%s", name, tail(h.replicas[name].logPath, 40))
			}
		}
	})
	return h
}

// dsn is the cluster's outboxd database, with application_name set so the
// test can tell whose backend is whose in pg_stat_activity.
func (h *faultHarness) dsn(app string) string {
	return h.cluster.DSN("outboxd") + " application_name=" + app
}

// clientDSN is dsn(app) through the bouncer, if there is one: for the
// replicas and the producers. PgBouncer sets each client's
// application_name on the server connection it lends it.
func (h *faultHarness) clientDSN(app string) string {
	if h.bouncer == nil {
		return h.dsn(app)
	}
	return h.bouncer.DSN(h.dsn(app))
}

// api calls a live replica's JSON API.
func (h *faultHarness) api(method, path string, in, out any) int {
	h.t.Helper()
	body, _ := json.Marshal(in)
	req, err := http.NewRequest(method, "http://"+h.replicas["a"].address()+path, strings.NewReader(string(body)))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+faultAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

// registerEndpoints creates the receiver's endpoints through the API.
func (h *faultHarness) registerEndpoints() {
	for name, topics := range faultEndpointTopics {
		var ep endpointWithSecret
		status := h.api("POST", "/api/endpoints", map[string]any{
			"url": "http://" + h.recv.addr + "/hooks/" + name, "topics": topics,
		}, &ep)
		if status != http.StatusCreated {
			h.t.Fatalf("create endpoint %s: status %d", name, status)
		}
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(ep.Secret, "whsec_"))
		if err != nil {
			h.t.Fatalf("endpoint %s: secret %q: %v", name, ep.Secret, err)
		}
		h.recv.setSecret(name, key)
	}
}

// produce runs the producers until cfg.Events transactions committed. Each
// transaction inserts a business row and records its event; one in ten
// rolls back on purpose. The ledger keeps what did not commit, and what
// may or may not have (a COMMIT cut by a fault).
func (h *faultHarness) produce(ctx context.Context) {
	db, err := sql.Open("postgres", h.clientDSN("faults-producer"))
	if err != nil {
		h.t.Error(err)
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(h.cfg.Producers)
	tokens := make(chan struct{})
	go func() {
		tick := time.NewTicker(time.Duration(float64(time.Second) / h.cfg.Rate))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				select {
				case tokens <- struct{}{}:
				default: // producers are behind; the rate is a ceiling
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for p := range h.cfg.Producers {
		rng := rand.New(rand.NewPCG(h.cfg.Seed, uint64(p)))
		wg.Go(func() {
			for seq := 0; h.committed.Load() < int64(h.cfg.Events); seq++ {
				select {
				case <-ctx.Done():
					return
				case <-tokens:
				}
				key := fmt.Sprintf("p%d-%d", p, seq)
				topic := faultTopics[rng.IntN(len(faultTopics))]
				h.produceOne(ctx, db, key, topic, rng.IntN(10_000), rng.IntN(10) == 0)
			}
		})
	}
	wg.Wait()
}

// produceOne is one producer transaction.
func (h *faultHarness) produceOne(ctx context.Context, db *sql.DB, key, topic string, amount int, rollback bool) {
	err := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.Exec(`INSERT INTO fault_orders (key, topic, amount) VALUES ($1, $2, $3)`, key, topic, amount); err != nil {
			return err
		}
		if _, err := tx.Exec(`SELECT outbox.record($1, $2, jsonb_build_object('key', $2::text, 'amount', $3::integer))`, topic, key, amount); err != nil {
			return err
		}
		if rollback {
			return errors.New("rolled back on purpose")
		}
		if err := tx.Commit(); err != nil {
			h.ledgerMu.Lock()
			h.ambiguous = append(h.ambiguous, key)
			h.ledgerMu.Unlock()
			return nil
		}
		h.committed.Add(1)
		return nil
	}()
	if err != nil {
		h.ledgerMu.Lock()
		h.notCommitted = append(h.notCommitted, key)
		h.ledgerMu.Unlock()
	}
}

// burst commits n business rows with their events in one transaction, so
// a relay has several full passes to make. It reports whether they
// committed.
func (h *faultHarness) burst(n int) bool {
	prefix := fmt.Sprintf("burst%d", h.bursts.Add(1))
	err := func() error {
		tx, err := h.admin.Begin()
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.Exec(`
			INSERT INTO fault_orders (key, topic, amount)
			SELECT $1 || '-' || i, 'order.paid', i FROM generate_series(1, $2) AS i`, prefix, n); err != nil {
			return err
		}
		if _, err := tx.Exec(`
			SELECT outbox.record('order.paid', $1 || '-' || i, jsonb_build_object('key', $1 || '-' || i, 'amount', i))
			FROM generate_series(1, $2) AS i`, prefix, n); err != nil {
			return err
		}
		return tx.Commit()
	}()
	if err != nil {
		h.t.Logf("burst %s: %v (the business table decides)", prefix, err)
	}
	return err == nil
}

// faultKinds are the faults, in the order a seeded shuffle deals them.
var faultKinds = []string{
	"kill-mid-relay", "kill-mid-delivery", "terminate-backends", "restart-postgres",
	"receiver-500", "receiver-hang", "receiver-close", "receiver-down", "notify-off",
}

// injectFaults deals cfg.Faults faults (every kind once before any twice)
// at seeded points of the producers' progress, one at a time, each healed
// before the next.
func (h *faultHarness) injectFaults(ctx context.Context) {
	points := make([]int64, h.cfg.Faults)
	for i := range points {
		points[i] = int64(float64(h.cfg.Events) * (0.05 + 0.85*h.rng.Float64()))
	}
	slices.Sort(points)
	var deck []string
	for i, at := range points {
		if len(deck) == 0 {
			deck = slices.Clone(faultKinds)
			h.rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		kind := deck[0]
		deck = deck[1:]
		for h.committed.Load() < at && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond) // polling the producers' progress
		}
		f := injectedFault{Kind: kind, Start: time.Now()}
		var hit bool
		f.Detail, f.Interrupts, hit = h.inject(kind)
		f.End = time.Now()
		if !hit {
			// A fault that missed proves nothing about what it aims at.
			h.t.Errorf("fault %s missed its target: %s", kind, f.Detail)
		}
		h.faults = append(h.faults, f)
		h.t.Logf("fault %d/%d at %d committed: %s: %s (%s)", i+1, len(points), h.committed.Load(), kind, f.Detail, f.End.Sub(f.Start).Round(time.Millisecond))
		time.Sleep(time.Second) // a healthy second between faults
	}
}

// inject runs one fault to its end and says what it did, whether it can
// cut an accepted attempt before its outcome is recorded, and whether it
// hit what it aims at: a fault that found nothing to break must fail the
// suite, not pass it.
func (h *faultHarness) inject(kind string) (detail string, interrupts, hit bool) {
	window := time.Duration(1000+h.rng.IntN(1000)) * time.Millisecond
	victim := h.replicas[[]string{"a", "b"}[h.rng.IntN(2)]]
	switch kind {
	case "kill-mid-relay":
		detail, hit = h.killMidRelay(victim)
		return detail, true, hit
	case "kill-mid-delivery":
		detail, hit = h.killMidDelivery(victim)
		return detail, true, hit
	case "terminate-backends":
		detail, hit = h.terminateBackends()
		return detail, true, hit
	case "restart-postgres":
		detail, hit = h.restartPostgres(window)
		return detail, true, hit
	case "receiver-500", "receiver-hang", "receiver-close":
		mode := map[string]receiverMode{"receiver-500": mode500, "receiver-hang": modeHang, "receiver-close": modeClose}[kind]
		go h.burst(50) // traffic, in case the producers are done
		before := h.recv.served(mode)
		h.recv.setMode(mode, 0)
		time.Sleep(window) // the fault's window
		h.recv.setMode(modeNormal, 0)
		n := h.recv.served(mode) - before
		return fmt.Sprintf("for %s, %d requests", window, n), false, n > 0
	case "receiver-down":
		go h.burst(50)
		start := time.Now()
		h.recv.down()
		time.Sleep(window) // the fault's window
		h.recv.up()
		n := h.unansweredSince(start)
		// Closing the server cuts requests it had accepted and not
		// yet answered.
		return fmt.Sprintf("listener closed for %s, %d attempts unanswered", window, n), true, n > 0
	case "notify-off":
		window *= 2
		h.execRetry(`ALTER TABLE outbox.events DISABLE TRIGGER events_notify_relay`)
		h.execRetry(`ALTER TABLE outbox.jobs DISABLE TRIGGER jobs_notify_workers`)
		silent := h.burst(50) // events no relay hears of
		time.Sleep(window)    // the fault's window
		h.execRetry(`ALTER TABLE outbox.events ENABLE TRIGGER events_notify_relay`)
		h.execRetry(`ALTER TABLE outbox.jobs ENABLE TRIGGER jobs_notify_workers`)
		return fmt.Sprintf("NOTIFY triggers disabled for %s, a burst committed unheard: %t", window, silent), false, silent
	}
	panic("unknown fault " + kind)
}

// unansweredSince counts the webhook attempts since start that got no
// answer (status_code NULL), as outboxd recorded them.
func (h *faultHarness) unansweredSince(start time.Time) int {
	var n int
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		err := h.admin.QueryRow(`
			SELECT count(*)
			FROM outbox.deliveries
			WHERE status_code IS NULL
			  AND error <> ''
			  AND finished_at >= $1`, start).Scan(&n)
		if err == nil && n > 0 {
			return n
		}
		time.Sleep(100 * time.Millisecond) // the attempts' outcomes are written in batches
	}
	return n
}

// execRetry runs an injector statement until it succeeds: a fault must
// heal even if the statement meets another one.
func (h *faultHarness) execRetry(query string) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := h.admin.Exec(query)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: %v", query, err)
		}
		time.Sleep(100 * time.Millisecond) // backing off a failed statement
	}
}

// killMidRelay commits a burst and SIGKILLs the victim while one of its
// relay transactions is open (its backend is in a claim or a fan-out, not
// idle), then restarts it.
//
// A relay pass is one statement of some 20 ms, so the poll runs without a
// pause, and a burst that passes unseen is followed by another.
func (h *faultHarness) killMidRelay(victim *faultReplica) (string, bool) {
	caught := false
	for try := 0; try < 10 && !caught; try++ {
		h.burst(300)
		deadline := time.Now().Add(3 * time.Second)
		for !caught && time.Now().Before(deadline) {
			var n int
			err := h.admin.QueryRow(`
				SELECT count(*)
				FROM pg_stat_activity
				WHERE application_name = $1
				  AND state <> 'idle'
				  AND (query LIKE '%outbox.fan_out(%'
				       OR query LIKE '%outbox.mark_fanned_out(%'
				       OR query LIKE '%outbox.claim_unfanned(%'
				       OR (query LIKE '%FROM outbox.events%' AND query LIKE '%SKIP LOCKED%'))`,
				"outboxd-"+victim.name).Scan(&n)
			caught = err == nil && n > 0
		}
	}
	victim.kill()
	victim.start()
	return fmt.Sprintf("SIGKILL outboxd-%s, relay transaction open: %t; restarted", victim.name, caught), caught
}

// killMidDelivery has the receiver hold a request from the victim, SIGKILLs
// the victim while it waits for the answer, then lets the receiver do the
// work and answer into the dead connection: the receiver has the event,
// outboxd does not know. The victim is restarted.
func (h *faultHarness) killMidDelivery(victim *faultReplica) (string, bool) {
	held := h.recv.hold(victim.pid())
	go h.burst(50) // traffic, in case the producers are done
	caught := false
	select {
	case <-held:
		caught = true
	case <-time.After(10 * time.Second):
	}
	victim.kill()
	n := h.recv.release()
	victim.start()
	return fmt.Sprintf("SIGKILL outboxd-%s with %d of its requests held (caught: %t); restarted", victim.name, n, caught), caught
}

// terminateBackends cuts every connection to the database but the test's
// own: both replicas' pools and LISTEN connections, and the producers'.
func (h *faultHarness) terminateBackends() (string, bool) {
	var total, listeners int
	err := h.admin.QueryRow(`
		SELECT count(*), count(*) FILTER (WHERE query ILIKE 'listen%')
		FROM (
		  SELECT query, pg_terminate_backend(pid)
		  FROM pg_stat_activity
		  WHERE datname = current_database()
		    AND backend_type = 'client backend'
		    AND pid <> pg_backend_pid()
		    AND application_name <> 'faults-admin'
		) AS t`).Scan(&total, &listeners)
	if err != nil {
		return fmt.Sprintf("terminate failed: %v", err), false
	}
	return fmt.Sprintf("pg_terminate_backend of %d connections, %d of them LISTEN", total, listeners), total > 0
}

// restartPostgres stops the server (fast shutdown, or an immediate one
// that leaves crash recovery to the start), keeps it down for window and
// starts it again on the same data folder and socket.
func (h *faultHarness) restartPostgres(window time.Duration) (string, bool) {
	immediate := h.rng.IntN(2) == 0
	h.clusterMu.Lock()
	defer h.clusterMu.Unlock()
	how := "fast"
	if immediate {
		how = "immediate"
		h.cluster.cmd.Process.Signal(syscall.SIGQUIT)
		<-h.cluster.exited
	} else {
		h.cluster.Stop()
	}
	time.Sleep(window) // the server is down for this long
	c, err := startCluster(context.Background(), h.dir, h.logger)
	if err != nil {
		h.t.Fatalf("restart postgres: %v", err)
	}
	h.cluster = c
	// startCluster returned once the new server answered: it went down
	// and came back.
	return fmt.Sprintf("%s shutdown, down for %s, started again", how, window), true
}

// awaitQuiescence waits until every committed row's event reached every
// subscribing endpoint and outboxd has nothing left to do, or gives up
// and lets the checker say what is missing.
func (h *faultHarness) awaitQuiescence() {
	timeout := max(3*time.Minute, time.Duration(h.cfg.Events)*5*time.Millisecond)
	deadline := time.Now().Add(timeout)
	start := time.Now()
	for time.Now().Before(deadline) {
		committed, err := h.businessRows()
		if err == nil && h.missingPairs(committed) == 0 {
			var open int
			err := h.admin.QueryRow(`
				SELECT (SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL)
				     + (SELECT count(*) FROM outbox.jobs WHERE state IN ('available', 'running', 'retryable'))`).Scan(&open)
			if err == nil && open == 0 {
				h.t.Logf("quiescent %s after the last fault", time.Since(start).Round(time.Millisecond))
				return
			}
		}
		time.Sleep(500 * time.Millisecond) // polling for the end state
	}
	h.t.Errorf("not quiescent after %s", timeout)
}

// businessRows is the business table: key -> topic.
func (h *faultHarness) businessRows() (map[string]string, error) {
	rows, err := h.admin.Query(`SELECT key, topic FROM fault_orders`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var k, topic string
		if err := rows.Scan(&k, &topic); err != nil {
			return nil, err
		}
		m[k] = topic
	}
	return m, rows.Err()
}

// missingPairs counts (row, subscribing endpoint) pairs the receiver has
// not accepted yet.
func (h *faultHarness) missingPairs(committed map[string]string) int {
	got := h.recv.acceptedPairs()
	missing := 0
	for key, topic := range committed {
		for _, ep := range faultSubscribers[topic] {
			if !got[[2]string{ep, key}] {
				missing++
			}
		}
	}
	return missing
}

// stopReplicas sends SIGTERM to both replicas: each must exit 0, restarted
// or not.
func (h *faultHarness) stopReplicas() {
	for _, name := range []string{"a", "b"} {
		if err := h.replicas[name].terminate(); err != nil {
			h.t.Errorf("outboxd-%s after SIGTERM: %v, want exit status 0", name, err)
		}
	}
}

// check runs the checker, the database's end state and the summary line.
func (h *faultHarness) check() {
	t := h.t
	committed, err := h.businessRows()
	if err != nil {
		t.Fatal(err)
	}
	h.ledgerMu.Lock()
	notCommitted := slices.Clone(h.notCommitted)
	ambiguous := len(h.ambiguous)
	h.ledgerMu.Unlock()
	res := checkFaultRun(checkInput{
		Committed:    committed,
		NotCommitted: notCommitted,
		Subscribers:  faultSubscribers,
		Log:          h.recv.deliveries(),
		Faults:       h.faults,
		Slack:        faultJobTimeout,
	})
	for _, p := range res.Problems {
		t.Error(p)
	}
	for _, u := range res.Unexplained {
		t.Errorf("unexplained duplicate: %s", u)
	}

	// Hop 1 seen from the outbox itself: one event per committed row,
	// none for a row that did not commit. outboxd's own events (outboxd.*:
	// an endpoint turned failing under a receiver fault) have no business
	// row by design.
	var rowsWithoutOne, eventsWithoutRow int
	err = h.admin.QueryRow(`
		SELECT (SELECT count(*)
		        FROM fault_orders o
		        LEFT JOIN (SELECT subject, topic, count(*) AS n FROM outbox.events GROUP BY subject, topic) e
		          ON e.subject = o.key AND e.topic = o.topic
		        WHERE coalesce(e.n, 0) <> 1),
		       (SELECT count(*) FROM outbox.events e
		        WHERE e.topic NOT LIKE 'outboxd.%'
		          AND NOT EXISTS (SELECT 1 FROM fault_orders o WHERE o.key = e.subject))`).Scan(&rowsWithoutOne, &eventsWithoutRow)
	if err != nil {
		t.Fatal(err)
	}
	if rowsWithoutOne != 0 || eventsWithoutRow != 0 {
		t.Errorf("outbox.events: %d business rows without exactly one event, %d events without a business row", rowsWithoutOne, eventsWithoutRow)
	}
	// The end state: nothing un-fanned, poisoned, waiting, running or
	// discarded (no fault here outlasts the retry schedule).
	var unfanned, poisoned, open, discarded int
	err = h.admin.QueryRow(`
		SELECT (SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL),
		       (SELECT count(*) FROM outbox.events WHERE poisoned_at IS NOT NULL),
		       (SELECT count(*) FROM outbox.jobs WHERE state IN ('available', 'running', 'retryable')),
		       (SELECT count(*) FROM outbox.jobs WHERE state = 'discarded')`).Scan(&unfanned, &poisoned, &open, &discarded)
	if err != nil {
		t.Fatal(err)
	}
	if unfanned+poisoned+open+discarded != 0 {
		t.Errorf("end state: %d un-fanned, %d poisoned, %d jobs not finished, %d discarded; want all 0", unfanned, poisoned, open, discarded)
	}

	t.Logf("%d transactions did not commit (%d on purpose or cut before COMMIT), %d COMMITs cut by a fault (the business table decided)",
		len(notCommitted)+ambiguous, len(notCommitted), ambiguous)
	t.Log(res.summaryLine(len(h.faults), h.cfg.Seed))
	if res.Lost > 0 {
		t.Errorf("lost %d deliveries", res.Lost)
	}
}

// faultReplica is one outboxd process: this test binary run as outboxd.
type faultReplica struct {
	t       *testing.T
	name    string
	args    []string
	logPath string

	mu     sync.Mutex // protects the fields below
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // Wait's result, once exited is closed
	addr   string
}

// start runs the replica on a fresh port and waits until it is healthy.
func (r *faultReplica) start() {
	r.t.Helper()
	logFile, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		r.t.Fatal(err)
	}
	defer logFile.Close()
	addr := freeAddr(r.t)
	cmd := exec.Command(os.Args[0], append(slices.Clone(r.args), "-addr", addr)...)
	env := []string{"OUTBOXD_TEST_RUN_MAIN=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXD_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = io.Discard, logFile
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
		close(exited)
	}()
	r.mu.Lock()
	r.cmd, r.exited, r.addr = cmd, exited, addr
	r.mu.Unlock()
	awaitHealthy(r.t, addr, exited)
}

func (r *faultReplica) address() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}

func (r *faultReplica) pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd.Process.Pid
}

// kill SIGKILLs the replica and waits for it.
func (r *faultReplica) kill() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	cmd.Process.Kill()
	<-exited
}

// terminate sends SIGTERM and returns the exit error (nil: status 0).
func (r *faultReplica) terminate() error {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		return errors.New("still running 60s after SIGTERM")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// receiverMode is how the receiver treats a request.
type receiverMode int

const (
	modeNormal receiverMode = iota // accept: 200
	mode500                        // answer 500
	modeHang                       // answer nothing until the sender gives up
	modeClose                      // close the connection without an answer
	modeHold                       // hold requests from one process until released, then accept
)

// faultReceiver is the webhook receiver: an HTTP server on a fixed port
// that can be taken down and brought back, and that logs every request.
type faultReceiver struct {
	t    *testing.T
	addr string
	port int

	mu       sync.Mutex // protects the fields below
	srv      *http.Server
	secrets  map[string][]byte
	log      []faultDelivery
	accepted map[[2]string]bool // (endpoint, subject)
	mode     receiverMode
	servedBy map[receiverMode]int // requests taken in each mode
	holdPID  int
	held     chan struct{} // closed when the first request is held
	heldN    int
	unheld   chan struct{} // closed to let held requests through
}

func newFaultReceiver(t *testing.T) *faultReceiver {
	rc := &faultReceiver{t: t, secrets: map[string][]byte{}, accepted: map[[2]string]bool{}, servedBy: map[receiverMode]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc.addr = ln.Addr().String()
	rc.port = ln.Addr().(*net.TCPAddr).Port
	rc.serve(ln)
	t.Cleanup(func() {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.srv.Close()
	})
	return rc
}

func (rc *faultReceiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: rc, ErrorLog: nil}
	rc.mu.Lock()
	rc.srv = srv
	rc.mu.Unlock()
	go srv.Serve(ln)
}

// down closes the listener and every connection, answered or not.
func (rc *faultReceiver) down() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.srv.Close()
}

// up listens again on the same port.
func (rc *faultReceiver) up() {
	var ln net.Listener
	var err error
	for range 100 {
		if ln, err = net.Listen("tcp", rc.addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // the port may take a moment to free
	}
	if err != nil {
		rc.t.Fatalf("receiver up again on %s: %v", rc.addr, err)
	}
	rc.serve(ln)
}

func (rc *faultReceiver) setSecret(endpoint string, key []byte) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.secrets[endpoint] = key
}

func (rc *faultReceiver) setMode(m receiverMode, pid int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.mode, rc.holdPID = m, pid
}

// hold makes the receiver hold every request from process pid; the channel
// closes when the first one is held.
func (rc *faultReceiver) hold(pid int) <-chan struct{} {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.mode, rc.holdPID, rc.heldN = modeHold, pid, 0
	rc.held, rc.unheld = make(chan struct{}), make(chan struct{})
	return rc.held
}

// release lets held requests through (accepted) and returns to normal. It
// returns how many were held.
func (rc *faultReceiver) release() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.mode = modeNormal
	close(rc.unheld)
	return rc.heldN
}

// served is how many requests the receiver has taken in mode m.
func (rc *faultReceiver) served(m receiverMode) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.servedBy[m]
}

func (rc *faultReceiver) deliveries() []faultDelivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.log)
}

func (rc *faultReceiver) acceptedPairs() map[[2]string]bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[[2]string]bool, len(rc.accepted))
	for k := range rc.accepted {
		out[k] = true
	}
	return out
}

func (rc *faultReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 2<<20))
	var msg struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Subject string `json:"subject"`
	}
	json.Unmarshal(body, &msg)
	d := faultDelivery{
		Endpoint:  strings.TrimPrefix(r.URL.Path, "/hooks/"),
		WebhookID: r.Header.Get("webhook-id"),
		BodyID:    msg.ID,
		Subject:   msg.Subject,
		Topic:     msg.Type,
		Arrived:   time.Now(),
	}
	rc.mu.Lock()
	d.SigOK = verifyFaultSignature(rc.secrets[d.Endpoint], r.Header, body)
	mode, holdPID, held, unheld := rc.mode, rc.holdPID, rc.held, rc.unheld
	if mode == modeHold {
		if owned, err := connOwnedBy(holdPID, r.RemoteAddr, rc.port); err == nil && !owned {
			mode = modeNormal
		}
		// Where /proc cannot tell (not Linux), every request is held.
	}
	rc.servedBy[mode]++
	if mode == modeHold {
		if rc.heldN == 0 {
			close(held)
		}
		rc.heldN++
	}
	rc.mu.Unlock()

	switch mode {
	case mode500:
		d.Outcome = "500"
		http.Error(w, "injected failure", http.StatusInternalServerError)
	case modeHang:
		d.Outcome = "hung"
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	case modeClose:
		d.Outcome = "closed"
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	case modeHold:
		<-unheld
		d.Outcome, d.Accepted = "held", true
		w.WriteHeader(http.StatusOK)
	default:
		d.Outcome, d.Accepted = "accepted", true
		w.WriteHeader(http.StatusOK)
	}
	rc.mu.Lock()
	rc.log = append(rc.log, d)
	if d.Accepted {
		rc.accepted[[2]string{d.Endpoint, d.Subject}] = true
	}
	rc.mu.Unlock()
}

// verifyFaultSignature checks a Standard Webhooks signature the way a
// receiver would, written here rather than borrowed from signature.go.
func verifyFaultSignature(key []byte, h http.Header, body []byte) bool {
	if len(key) == 0 {
		return false
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.", h.Get("webhook-id"), h.Get("webhook-timestamp"))
	mac.Write(body)
	want := []byte("v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), want) {
			return true
		}
	}
	return false
}

// connOwnedBy reports whether the TCP connection from remote (a request's
// RemoteAddr) to serverPort belongs to process pid: the socket's inode
// from /proc/net/tcp, looked for among pid's open files. Linux only; an
// error elsewhere.
func connOwnedBy(pid int, remote string, serverPort int) (bool, error) {
	_, portText, err := net.SplitHostPort(remote)
	if err != nil {
		return false, err
	}
	clientPort, err := strconv.Atoi(portText)
	if err != nil {
		return false, err
	}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return false, err
	}
	defer f.Close()
	inode := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		local, peer := fields[1], fields[2]
		if strings.HasSuffix(local, fmt.Sprintf(":%04X", clientPort)) && strings.HasSuffix(peer, fmt.Sprintf(":%04X", serverPort)) {
			inode = fields[9]
			break
		}
	}
	if inode == "" {
		return false, nil
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false, err
	}
	want := "socket:[" + inode + "]"
	for _, fd := range fds {
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && link == want {
			return true, nil
		}
	}
	return false, nil
}
