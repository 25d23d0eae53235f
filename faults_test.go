// faults_test.go: the black-box fault suite. Two outboxd processes share a
// PostgreSQL cluster that belongs to this test alone (so the test may
// restart it); producers write business rows with their events, some
// rolling back on purpose, a fifth of them on a few subjects in order; the
// receivers (faults_receiver_test.go) log every webhook, pass one
// endpoint's on to outboxd's own inbox (a chain), and take one endpoint's
// mail over SMTP; one endpoint orders by subject; halfway through, two
// endpoints are replayed the events recorded before the first fault.
// Seeded faults break things at random points: SIGKILL of a replica with
// a relay pass open and mid delivery, pg_terminate_backend of every
// connection (each replica's LISTEN included), a restart of the server,
// receivers that answer 500, hang, cut the connection or are down, and
// notifications suppressed at the source. Each fault confirms that it hit what it aims at, or fails
// the test. Then faults_checker_test.go judges the run from the business
// table and the receivers' log.
// TestFaultSuiteBehindPgBouncer runs the same suite with the replicas and
// the producers behind PgBouncer in transaction pooling mode.
//
// Default: 600 events and 9 faults, seed 1. Longer:
//
//	OUTBOXD_FAULTS_EVENTS=100000 OUTBOXD_FAULTS=50 OUTBOXD_FAULTS_SEED=7 \
//	  go test -run TestFaultSuiteLosesNothing -v -timeout 60m .

package main

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lib/pq"
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

// faultLaneTopic is the topic of the producers' ordered events: each
// bumps its subject's counter (fault_lanes), one of faultLaneSubjects.
const faultLaneTopic = "lane.step"

var faultLaneSubjects = []string{"lane-a", "lane-b", "lane-c", "lane-d", "lane-e", "lane-f"}

// faultEndpoint is one endpoint of the run, as registered.
type faultEndpoint struct {
	name     string
	topics   []string
	ordering string // "" for the default
}

// The producers' topics, the endpoints, and the endpoints that get each
// topic: the checker's expectation, written out by hand rather than
// computed by outboxd's matcher. "all" subscribes to everything, so every
// event reaches the receiver at least there; the chain's events come back
// from the inbox under the source's prefix, as events of their own.
var (
	faultTopics    = []string{"order.created", "order.paid", "user.signup", "audit.note", faultLaneTopic}
	faultEndpoints = []faultEndpoint{
		{name: "orders", topics: []string{"order.*"}},
		{name: "billing", topics: []string{"order.paid", "user.signup"}},
		{name: "all", topics: []string{}},
		{name: "lanes", topics: []string{"lane.*"}, ordering: "subject"},
		{name: faultChainEndpoint, topics: []string{"user.signup"}},
		{name: faultMailEndpoint, topics: []string{"audit.note"}},
	}
	faultSubscribers = map[string][]string{
		"order.created":     {"orders", "all"},
		"order.paid":        {"orders", "billing", "all"},
		"user.signup":       {"billing", "all", faultChainEndpoint},
		"audit.note":        {"all", faultMailEndpoint},
		faultLaneTopic:      {"lanes", "all"},
		"chain.user.signup": {"all"},
	}
	faultDerived = map[string]string{"user.signup": "chain.user.signup"}
	faultOrdered = []string{"lanes"}
	// The replay halfway: of user.signup only, which both endpoints take,
	// recorded before the first fault. A replayed delivery keeps its
	// attempts (schema.sql, outbox.run_again), so a replay of an event that
	// failed under a fault would wait out a longer backoff when it fails
	// again (81 s on its third attempt) than the run has.
	faultReplayed      = []string{"billing", faultChainEndpoint}
	faultReplayedTopic = []string{"user.signup"}
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

func faultReplicaArgs(dsn, smtpURL string) []string {
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
		"-smtp-url", smtpURL,
		"-smtp-from", "outboxd@" + faultMailHost,
	}
}

// faultServerSettings are the cluster's. A backend whose client died
// mid-statement otherwise finishes the statement and commits it (the
// server only notices when it next reads or writes the socket); with the
// check it ends the session and rolls back, as for a client that dies
// between statements, so that kill-mid-relay can see the pass it cut
// rolled back. PostgreSQL has the check on Linux only.
func faultServerSettings() []string {
	if runtime.GOOS != "linux" {
		return nil
	}
	return []string{"client_connection_check_interval=100ms"}
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

// faultHarness is one run: the cluster, the replicas, the receivers, the
// producers' ledger, the faults and the replays.
type faultHarness struct {
	t      *testing.T
	cfg    faultRunConfig
	rng    *rand.Rand
	dir    string // the cluster's data folder
	logger *slog.Logger
	began  time.Time // before the first event: the replays' start

	clusterMu sync.Mutex // protects cluster
	cluster   *cluster
	bouncer   *pgBouncer // in front of the cluster for replicas and producers; nil: none

	admin     *sql.DB // the test's own connections: application_name faults-admin
	recv      *faultReceiver
	mail      *faultMailSink
	replicas  map[string]*faultReplica
	endpoints map[string]int64 // name -> id

	committed atomic.Int64 // producer transactions committed
	bursts    atomic.Int64 // names each burst's keys

	ledgerMu     sync.Mutex // protects the ledger below
	notCommitted []string
	ambiguous    []string // COMMIT failed: the business table says what happened

	faults  []injectedFault
	replays []faultReplay
}

func newFaultHarness(t *testing.T, cfg faultRunConfig, viaPgBouncer bool) *faultHarness {
	h := &faultHarness{
		t:      t,
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(cfg.Seed, 0x6661756c7473)),
		dir:    t.TempDir(),
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		began:  time.Now().Add(-time.Second),
	}
	if os.Geteuid() == 0 {
		// The server runs as postgres and must reach the folder.
		os.Chmod(filepath.Dir(h.dir), 0o755)
		os.Chmod(h.dir, 0o755)
	}
	c, err := startCluster(context.Background(), h.dir, h.logger, faultServerSettings()...)
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
	h.createBusinessTables()
	h.startReplicas(viaPgBouncer)
	h.installRelayGate()
	return h
}

// createBusinessTables makes the producers' tables: the business rows,
// and a counter per ordered subject.
func (h *faultHarness) createBusinessTables() {
	mustExec(h.t, h.admin, `
		CREATE TABLE IF NOT EXISTS fault_orders (
		  key        text        PRIMARY KEY,
		  topic      text        NOT NULL,
		  amount     integer     NOT NULL,
		  created_at timestamptz NOT NULL DEFAULT now()
		)`)
	mustExec(h.t, h.admin, `CREATE TABLE IF NOT EXISTS fault_lanes (subject text PRIMARY KEY, n integer NOT NULL)`)
	mustExec(h.t, h.admin, `INSERT INTO fault_lanes SELECT unnest($1::text[]), 0 ON CONFLICT DO NOTHING`, pq.Array(faultLaneSubjects))
}

// startReplicas starts the receivers and the two replicas.
func (h *faultHarness) startReplicas(viaPgBouncer bool) {
	t := h.t
	h.recv = newFaultReceiver(t, func() []string {
		return []string{h.replicas["a"].address(), h.replicas["b"].address()}
	})
	h.mail = newFaultMailSink(t, h.recv)
	h.replicas = map[string]*faultReplica{}
	for _, name := range []string{"a", "b"} {
		args := faultReplicaArgs(h.clientDSN("outboxd-"+name), h.mail.url())
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
}

// faultRelayGate is the first key of the advisory locks installRelayGate's
// trigger takes; the second is the hash of the session's application_name
// (one replica's gate), then 0 (everyone's).
const faultRelayGate = 0x66617567

// installRelayGate adds the test's own trigger to outbox.jobs (the
// replicas have migrated): every statement that inserts jobs, a relay
// pass's among them once it has claimed and marked its events, takes the
// gate's locks shared at its end, its replica's and then everyone's. Not
// held by the test, they never wait; held (kill-mid-relay), they keep
// such a pass waiting with its work done and its transaction open. One replica's
// gate comes first so that the pass held is that replica's: a pass held
// first holds every later one of any replica back at the rows both write
// (outbox.fanout_stats), before that later one reaches the gate.
func (h *faultHarness) installRelayGate() {
	mustExec(h.t, h.admin, `
		CREATE OR REPLACE FUNCTION public.fault_relay_gate() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  IF EXISTS (SELECT 1 FROM inserted) THEN
		    PERFORM pg_advisory_xact_lock_shared(`+strconv.Itoa(faultRelayGate)+`, hashtext(current_setting('application_name')));
		    PERFORM pg_advisory_xact_lock_shared(`+strconv.Itoa(faultRelayGate)+`, 0);
		  END IF;
		  RETURN NULL;
		END $$`)
	mustExec(h.t, h.admin, `
		CREATE TRIGGER fault_relay_gate AFTER INSERT ON outbox.jobs
		REFERENCING NEW TABLE AS inserted
		FOR EACH STATEMENT EXECUTE FUNCTION public.fault_relay_gate()`)
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

// registerEndpoints creates the endpoints through the API, and the inbox
// source the chain endpoint sends to, with the endpoint's secret.
func (h *faultHarness) registerEndpoints() {
	h.endpoints = map[string]int64{}
	url := map[string]string{faultMailEndpoint: "mailto:faults@example.com"}
	var chainSecret string
	for _, fe := range faultEndpoints {
		in := map[string]any{"url": "http://" + h.recv.addr + "/hooks/" + fe.name, "topics": fe.topics}
		if u, ok := url[fe.name]; ok {
			in["url"] = u
		}
		if fe.ordering != "" {
			in["ordering"] = fe.ordering
		}
		var ep endpointWithSecret
		if status := h.api("POST", "/api/endpoints", in, &ep); status != http.StatusCreated {
			h.t.Fatalf("create endpoint %s: status %d", fe.name, status)
		}
		h.endpoints[fe.name] = ep.ID
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(ep.Secret, "whsec_"))
		if err != nil {
			h.t.Fatalf("endpoint %s: secret %q: %v", fe.name, ep.Secret, err)
		}
		h.recv.setSecret(fe.name, key)
		if fe.name == faultChainEndpoint {
			chainSecret = ep.Secret
		}
	}
	status := h.api("POST", "/api/sources", map[string]any{
		"name": faultChainSource, "secret": chainSecret, "topic_prefix": "chain.",
	}, &struct{}{})
	if status != http.StatusCreated {
		h.t.Fatalf("create inbox source %s: status %d", faultChainSource, status)
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
				topic, subject := faultTopics[rng.IntN(len(faultTopics))], key
				if topic == faultLaneTopic {
					subject = faultLaneSubjects[rng.IntN(len(faultLaneSubjects))]
				}
				h.produceOne(ctx, db, key, topic, subject, rng.IntN(10_000), rng.IntN(10) == 0)
			}
		})
	}
	wg.Wait()
}

// produceOne is one producer transaction. An ordered event first bumps
// its subject's counter: the row lock orders the subject's transactions,
// so its events' n follow their commit order, and a rollback gives its n
// back, so each subject's committed events are 1, 2, 3, ...
func (h *faultHarness) produceOne(ctx context.Context, db *sql.DB, key, topic, subject string, amount int, rollback bool) {
	err := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		payload := map[string]any{"key": key, "amount": amount}
		if topic == faultLaneTopic {
			var n int
			if err := tx.QueryRow(`UPDATE fault_lanes SET n = n + 1 WHERE subject = $1 RETURNING n`, subject).Scan(&n); err != nil {
				return err
			}
			payload["n"] = n
		}
		if _, err := tx.Exec(`INSERT INTO fault_orders (key, topic, amount) VALUES ($1, $2, $3)`, key, topic, amount); err != nil {
			return err
		}
		b, _ := json.Marshal(payload) // strings and numbers: cannot fail
		if _, err := tx.Exec(`SELECT outbox.record($1, $2, $3::jsonb)`, topic, subject, string(b)); err != nil {
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
// before the next. Right before the middle one it replays faultReplayed,
// so the faults after it land among the replay's deliveries.
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
		if i == len(points)/2 {
			h.replay()
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
		h.mail.down()
		time.Sleep(window) // the fault's window
		h.recv.up()
		h.mail.up()
		n := h.unansweredSince(start)
		// Closing the server cuts requests it had accepted and not
		// yet answered.
		return fmt.Sprintf("listeners closed for %s, %d attempts unanswered", window, n), true, n > 0
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

// replay asks for every event of faultReplayedTopic recorded from the
// run's start to its first fault to be sent again to each of
// faultReplayed, through the API, as an operator would. The checker holds
// it to what a replay promises: each event those endpoints had finished
// with arrives again, once more.
func (h *faultHarness) replay() {
	r := faultReplay{Endpoints: faultReplayed, Topics: faultReplayedTopic, Until: time.Now()}
	if len(h.faults) > 0 {
		r.Until = h.faults[0].Start
	}
	r.Finished = h.finishedDeliveries(r)
	r.Start = time.Now()
	var details []string
	for _, name := range faultReplayed {
		var res ReplayResult
		status := h.api("POST", fmt.Sprintf("/api/endpoints/%d/replay", h.endpoints[name]), map[string]any{
			"since": h.began.UTC().Format(time.RFC3339Nano), "until": r.Until.UTC().Format(time.RFC3339Nano),
			"topics": faultReplayedTopic}, &res)
		if status != http.StatusOK || res.Jobs == 0 {
			h.t.Errorf("replay of %s: status %d, %d deliveries; want 200 and some", name, status, res.Jobs)
		}
		details = append(details, fmt.Sprintf("%s %d deliveries", name, res.Jobs))
	}
	r.End = time.Now()
	h.replays = append(h.replays, r)
	h.t.Logf("replay at %d committed: %s; %d deliveries of its topics finished when asked", h.committed.Load(), strings.Join(details, ", "), len(r.Finished))
}

// finishedDeliveries is, at each endpoint r replays, the business keys
// of r's topics whose delivery outboxd has finished (completed or
// discarded): what r, asked next, must send again. They are still
// finished when its statements run, since only a replay or a retry by
// hand sets a finished delivery to run again. The checker narrows them to
// r's window (faultReplay.covers).
func (h *faultHarness) finishedDeliveries(r faultReplay) map[[2]string]bool {
	names := map[int64]string{}
	var ids []int64
	for _, name := range r.Endpoints {
		names[h.endpoints[name]] = name
		ids = append(ids, h.endpoints[name])
	}
	var finished map[[2]string]bool
	h.retry("deliveries finished before the replay", func() error {
		rows, err := h.admin.Query(`
SELECT j.endpoint_id, e.payload->>'key'
FROM (SELECT endpoint_id, event_id FROM outbox.jobs WHERE state = 'discarded'
      UNION ALL
      SELECT endpoint_id, event_id FROM outbox.deliveries WHERE outcome = 'completed') AS j
JOIN outbox.events AS e ON e.id = j.event_id
WHERE j.endpoint_id = ANY($1)
  AND e.topic = ANY($2)`, pq.Array(ids), pq.Array(r.Topics))
		if err != nil {
			return err
		}
		defer rows.Close()
		finished = map[[2]string]bool{}
		for rows.Next() {
			var id int64
			var key string
			if err := rows.Scan(&id, &key); err != nil {
				return err
			}
			finished[[2]string{names[id], key}] = true
		}
		return rows.Err()
	})
	return finished
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
	h.retry(query, func() error {
		_, err := h.admin.Exec(query)
		return err
	})
}

// retry runs the harness's own statements (try) until they succeed, for
// up to 30 s: they may meet a fault still healing. Then it fails the test,
// naming what it tried.
func (h *faultHarness) retry(what string, try func() error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := try()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond) // backing off a failed statement
	}
}

// killMidRelay holds the victim's relay gate (installRelayGate), commits
// a burst, and SIGKILLs the victim while one of its relay passes waits at
// the gate with events claimed and marked. It hits when that pass's
// transaction rolled back with the kill: its backend ended and, with
// everyone's gate held so that no other pass can commit, the pass's
// events are still un-fanned and have no jobs. Then it lets the gates go
// and restarts the victim.
func (h *faultHarness) killMidRelay(victim *faultReplica) (string, bool) {
	gate, err := h.admin.Begin()
	if err != nil {
		return fmt.Sprintf("hold the relay gate: %v", err), false
	}
	defer gate.Rollback()
	if _, err := gate.Exec(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, faultRelayGate, "outboxd-"+victim.name); err != nil {
		return fmt.Sprintf("hold the relay gate: %v", err), false
	}
	pass, open := h.awaitOpenPass(victim)
	if open {
		// Passes that got through the victim's gate before end their
		// transactions; every later one waits.
		if _, err := gate.Exec(`SELECT pg_advisory_xact_lock($1, 0)`, faultRelayGate); err != nil {
			open = false
			pass.detail = fmt.Sprintf("; hold everyone's gate: %v", err)
		}
	}
	victim.kill()
	if !open {
		gate.Rollback()
		victim.start()
		return fmt.Sprintf("SIGKILL outboxd-%s, but no relay pass of it was seen open with events%s; restarted", victim.name, pass.detail), false
	}
	if runtime.GOOS != "linux" {
		// No client_connection_check_interval (faultServerSettings):
		// end the dead client's session as the server would on noticing.
		h.admin.Exec(`SELECT pg_terminate_backend($1)`, pass.pid)
	}
	gone := h.awaitBackendGone(pass.pid)
	var fanned, jobs int
	err = h.admin.QueryRow(`
		SELECT (SELECT count(*) FROM outbox.events WHERE id = ANY($1) AND fanned_out_at IS NOT NULL),
		       (SELECT count(*) FROM outbox.jobs WHERE event_id = ANY($1))`, pq.Array(pass.events)).Scan(&fanned, &jobs)
	gate.Rollback()
	victim.start()
	if err != nil {
		return fmt.Sprintf("SIGKILL outboxd-%s with a relay pass open; read its events: %v", victim.name, err), false
	}
	return fmt.Sprintf("SIGKILL outboxd-%s with a relay pass open over %d events; its backend gone: %t; then %d of them fanned out, %d jobs for them; restarted",
		victim.name, len(pass.events), gone, fanned, jobs), gone && fanned == 0 && jobs == 0
}

// openPass is a relay pass waiting at the gate: its backend, and the
// events its transaction claimed.
type openPass struct {
	pid    int
	events []int64
	detail string // why it is not open after all
}

// awaitOpenPassSQL finds a relay pass of application $1 waiting at the
// gate, and the events it marked: the rows whose current version (un-fanned,
// as every other transaction still sees it) its transaction updated.
const awaitOpenPassSQL = `
SELECT a.pid, array_agg(e.id ORDER BY e.id)
FROM pg_stat_activity AS a
JOIN outbox.events AS e ON e.xmax = a.backend_xid
WHERE a.application_name = $1
  AND a.wait_event_type = 'Lock'
  AND a.wait_event = 'advisory'
  AND a.query LIKE '%outbox.fan_out%'
  AND e.fanned_out_at IS NULL
GROUP BY a.pid
LIMIT 1`

// awaitOpenPass commits bursts until a relay pass of victim waits at the
// gate with events, for at most a few bursts: the first is one.
func (h *faultHarness) awaitOpenPass(victim *faultReplica) (openPass, bool) {
	for range 3 {
		h.burst(300)
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			var p openPass
			err := h.admin.QueryRow(awaitOpenPassSQL, "outboxd-"+victim.name).Scan(&p.pid, pq.Array(&p.events))
			if err == nil {
				return p, true
			}
			time.Sleep(20 * time.Millisecond) // polling pg_stat_activity
		}
	}
	return openPass{}, false
}

// awaitBackendGone waits until backend pid has ended.
func (h *faultHarness) awaitBackendGone(pid int) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := h.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err == nil && n == 0 {
			return true
		}
		time.Sleep(20 * time.Millisecond) // polling pg_stat_activity
	}
	return false
}

// killMidDelivery has the receivers hold a request from the victim,
// SIGKILLs the victim while it waits for the answer, then lets the
// receiver do the work and answer into the dead connection: the receiver
// has the event, outboxd does not know. The victim is restarted.
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

// listenersSQL lists the replicas' LISTEN connections: an idle backend
// whose last statement was a LISTEN, or the listener's ping, an empty
// query (lib/pq's Listener.Ping).
const listenersSQL = `
SELECT application_name, pid
FROM pg_stat_activity
WHERE datname = current_database()
  AND backend_type = 'client backend'
  AND application_name IN ('outboxd-a', 'outboxd-b')
  AND state = 'idle'
  AND (query ILIKE 'listen %' OR query = '')`

// terminateBackends cuts every connection to the database but the test's
// own: both replicas' pools and LISTEN connections, and the producers'.
// It hits when each replica's listener was among the cut and listens
// again on a new connection; behind the pooler the replicas do not
// LISTEN (-pool-mode transaction), and the server connections it lends
// are what there is to cut.
func (h *faultHarness) terminateBackends() (string, bool) {
	before, err := h.listeners()
	if err != nil {
		return fmt.Sprintf("list the listeners: %v", err), false
	}
	var cut []int64
	err = h.admin.QueryRow(`
		SELECT coalesce(array_agg(pid), '{}')
		FROM (
		  SELECT pid, pg_terminate_backend(pid)
		  FROM pg_stat_activity
		  WHERE datname = current_database()
		    AND backend_type = 'client backend'
		    AND pid <> pg_backend_pid()
		    AND application_name <> 'faults-admin'
		) AS t`).Scan(pq.Array(&cut))
	if err != nil {
		return fmt.Sprintf("terminate failed: %v", err), false
	}
	if h.bouncer != nil {
		return fmt.Sprintf("pg_terminate_backend of %d connections (the pooler's), %d LISTEN among them", len(cut), len(before)),
			len(cut) > 0 && len(before) == 0
	}
	var missed []string
	for _, name := range []string{"outboxd-a", "outboxd-b"} {
		pids := before[name]
		if len(pids) == 0 || slices.ContainsFunc(pids, func(pid int64) bool { return !slices.Contains(cut, pid) }) {
			missed = append(missed, fmt.Sprintf("%s's listener %v not among the cut", name, pids))
		}
	}
	again := h.awaitListenersAgain(before)
	return fmt.Sprintf("pg_terminate_backend of %d connections; LISTEN connections before %v; listening again on new ones: %t%s",
		len(cut), before, again, strings.Join(append([]string{""}, missed...), "; ")), len(missed) == 0 && again
}

// listeners is listenersSQL's backends by replica.
func (h *faultHarness) listeners() (map[string][]int64, error) {
	rows, err := h.admin.Query(listenersSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]int64{}
	for rows.Next() {
		var name string
		var pid int64
		if err := rows.Scan(&name, &pid); err != nil {
			return nil, err
		}
		out[name] = append(out[name], pid)
	}
	return out, rows.Err()
}

// awaitListenersAgain waits until none of the backends before lives and
// each replica has a LISTEN connection of a new backend: its listener
// lost its connection and made another.
func (h *faultHarness) awaitListenersAgain(before map[string][]int64) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		now, err := h.listeners()
		renewed := err == nil
		for _, name := range []string{"outboxd-a", "outboxd-b"} {
			renewed = renewed && slices.ContainsFunc(now[name], func(pid int64) bool { return !slices.Contains(before[name], pid) })
			for _, pid := range before[name] {
				renewed = renewed && !slices.Contains(now[name], pid)
			}
		}
		if renewed {
			return true
		}
		time.Sleep(50 * time.Millisecond) // polling pg_stat_activity
	}
	return false
}

// restartPostgres stops the server (fast shutdown, or an immediate one
// that leaves crash recovery to the start), keeps it down for window and
// starts it again on the same data folder and socket. It hits when the
// server answering afterwards is a new postmaster: a later
// pg_postmaster_start_time.
func (h *faultHarness) restartPostgres(window time.Duration) (string, bool) {
	before, err := h.postmasterStart()
	if err != nil {
		return fmt.Sprintf("postmaster start time before: %v", err), false
	}
	immediate := h.rng.IntN(2) == 0
	h.clusterMu.Lock()
	how := "fast"
	if immediate {
		how = "immediate"
		h.cluster.cmd.Process.Signal(syscall.SIGQUIT)
		<-h.cluster.exited
	} else {
		h.cluster.Stop()
	}
	time.Sleep(window) // the server is down for this long
	c, err := startCluster(context.Background(), h.dir, h.logger, faultServerSettings()...)
	if err != nil {
		h.clusterMu.Unlock()
		h.t.Fatalf("restart postgres: %v", err)
	}
	h.cluster = c
	h.clusterMu.Unlock()
	after, err := h.postmasterStart()
	if err != nil {
		return fmt.Sprintf("%s shutdown, down for %s; postmaster start time after: %v", how, window, err), false
	}
	return fmt.Sprintf("%s shutdown, down for %s, postmaster started %s, then %s", how, window,
		before.Format("15:04:05.000"), after.Format("15:04:05.000")), after.After(before)
}

// postmasterStart is the server's pg_postmaster_start_time, asked until
// it answers: the test's own pooled connections die with the server.
func (h *faultHarness) postmasterStart() (time.Time, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var t time.Time
		err := h.admin.QueryRow(`SELECT pg_postmaster_start_time()`).Scan(&t)
		if err == nil || time.Now().After(deadline) {
			return t, err
		}
		time.Sleep(100 * time.Millisecond) // the server is still coming up
	}
}

// faultLongWait is the longest backoff the suite waits out: the second
// attempt's (2⁴ = 16 s) and its ±10%. A delivery cut by faults three times
// (a kill's rescue counts as an attempt, and a replayed delivery keeps
// the attempts of its first life) waits 3⁴ = 81 s, longer than the rest of
// the run; the suite then retries it by hand, as an operator would.
const faultLongWait = 20 * time.Second

// awaitQuiescence waits until every committed row's events reached every
// subscribing endpoint and outboxd has nothing left to do, or gives up
// and lets the checker say what is missing.
func (h *faultHarness) awaitQuiescence() {
	timeout := max(3*time.Minute, time.Duration(h.cfg.Events)*5*time.Millisecond)
	deadline := time.Now().Add(timeout)
	start := time.Now()
	retried := 0
	defer func() {
		if retried > 0 {
			h.t.Logf("retried by hand %d deliveries that waited longer than %s", retried, faultLongWait)
		}
	}()
	for time.Now().Before(deadline) {
		retried += h.retryLongWaits()
		committed, _, err := h.businessRows()
		if err == nil && h.missingPairs(committed) == 0 {
			var open int
			err := h.admin.QueryRow(`
				SELECT (SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL)
				     + (SELECT count(*) FROM outbox.jobs WHERE state IN ('available', 'running', 'retryable'))
				     + (SELECT count(*) FROM outbox.replays WHERE enqueued_at IS NULL AND cancelled_at IS NULL)`).Scan(&open)
			if err == nil && open == 0 {
				h.t.Logf("quiescent %s after the last fault", time.Since(start).Round(time.Millisecond))
				return
			}
		}
		time.Sleep(500 * time.Millisecond) // polling for the end state
	}
	h.t.Errorf("not quiescent after %s", timeout)
}

// retryLongWaits retries by hand (POST /api/jobs/{id}/retry, which only
// brings a waiting job's next attempt forward) every job due more than
// faultLongWait from now, and returns how many.
func (h *faultHarness) retryLongWaits() int {
	rows, err := h.admin.Query(`
		SELECT id
		FROM outbox.jobs
		WHERE state = 'retryable'
		  AND scheduled_at > now() + make_interval(secs => $1)
		ORDER BY id`, faultLongWait.Seconds())
	if err != nil {
		return 0 // the next poll asks again
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if rows.Scan(&id) == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	for _, id := range ids {
		if status := h.api("POST", fmt.Sprintf("/api/jobs/%d/retry", id), nil, nil); status != http.StatusOK {
			h.t.Errorf("retry job %d by hand: status %d", id, status)
		}
	}
	return len(ids)
}

// businessRows is the business table: key -> topic, and key -> when its
// event was recorded, the event's created_at (the clock at its insert, a
// few milliseconds into the row's transaction), which a replay's window
// selects by; the transaction's start for a row whose event is missing.
func (h *faultHarness) businessRows() (topics map[string]string, recorded map[string]time.Time, err error) {
	rows, err := h.admin.Query(`
SELECT o.key, o.topic, coalesce(e.created_at, o.created_at)
FROM fault_orders AS o
LEFT JOIN outbox.events AS e ON e.topic = o.topic AND e.payload->>'key' = o.key`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	topics, recorded = map[string]string{}, map[string]time.Time{}
	for rows.Next() {
		var k, topic string
		var at time.Time
		if err := rows.Scan(&k, &topic, &at); err != nil {
			return nil, nil, err
		}
		topics[k], recorded[k] = topic, at
	}
	return topics, recorded, rows.Err()
}

// missingPairs counts (row, topic, subscribing endpoint) triples the
// receivers have not accepted yet: each row's own event, and the event the
// inbox records for it where its topic is chained.
func (h *faultHarness) missingPairs(committed map[string]string) int {
	got := h.recv.acceptedPairs()
	missing := 0
	for key, topic := range committed {
		topics := []string{topic}
		if d, ok := faultDerived[topic]; ok {
			topics = append(topics, d)
		}
		for _, tp := range topics {
			for _, ep := range faultSubscribers[tp] {
				if !got[faultPair{ep, key, tp}] {
					missing++
				}
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
	committed, recorded, err := h.businessRows()
	if err != nil {
		t.Fatal(err)
	}
	h.ledgerMu.Lock()
	notCommitted := slices.Clone(h.notCommitted)
	ambiguous := len(h.ambiguous)
	h.ledgerMu.Unlock()
	res := checkFaultRun(checkInput{
		Committed:    committed,
		Recorded:     recorded,
		NotCommitted: notCommitted,
		Subscribers:  faultSubscribers,
		Derived:      faultDerived,
		Ordered:      faultOrdered,
		Log:          h.recv.deliveries(),
		Faults:       h.faults,
		Replays:      h.replays,
		Slack:        faultJobTimeout,
	})
	for _, p := range res.Problems {
		t.Error(p)
	}
	for _, u := range res.Unexplained {
		t.Errorf("unexplained duplicate: %s", u)
	}
	h.checkDatabase()
	t.Logf("%d transactions did not commit (%d on purpose or cut before COMMIT), %d COMMITs cut by a fault (the business table decided)",
		len(notCommitted)+ambiguous, len(notCommitted), ambiguous)
	t.Logf("deliveries by endpoint: %v", res.ByEndpoint)
	t.Log(res.summaryLine(len(h.faults), h.cfg.Seed))
	if res.Lost > 0 {
		t.Errorf("lost %d deliveries", res.Lost)
	}
}

// checkDatabaseSQL counts, from the outbox itself (hop 1, and the inbox's
// once), the business rows without exactly one event of their topic, or
// of the topic the inbox derives from theirs ($1, $2: topic and derived
// topic), and the events of no business row. outboxd's own events
// (outboxd.*: an endpoint turned failing under a receiver fault) have no
// business row by design.
const checkDatabaseSQL = `
WITH e AS (
  SELECT payload->>'key' AS key, topic, count(*) AS n
  FROM outbox.events
  WHERE topic NOT LIKE 'outboxd.%'
  GROUP BY 1, 2
),
want AS (
  SELECT key, topic FROM fault_orders
  UNION ALL
  SELECT o.key, d.derived
  FROM fault_orders AS o
  JOIN unnest($1::text[], $2::text[]) AS d(topic, derived) ON d.topic = o.topic
)
SELECT (SELECT count(*) FROM want AS w LEFT JOIN e ON e.key = w.key AND e.topic = w.topic WHERE coalesce(e.n, 0) <> 1),
       (SELECT coalesce(sum(e.n), 0) FROM e WHERE NOT EXISTS (SELECT 1 FROM want AS w WHERE w.key = e.key AND w.topic = e.topic))`

// checkDatabase checks the outbox's own record and its end state.
func (h *faultHarness) checkDatabase() {
	t := h.t
	var topics, derived []string
	for tp, d := range faultDerived {
		topics, derived = append(topics, tp), append(derived, d)
	}
	var rowsWithoutOne, eventsWithoutRow int
	if err := h.admin.QueryRow(checkDatabaseSQL, pq.Array(topics), pq.Array(derived)).Scan(&rowsWithoutOne, &eventsWithoutRow); err != nil {
		t.Fatal(err)
	}
	if rowsWithoutOne != 0 || eventsWithoutRow != 0 {
		t.Errorf("outbox.events: %d business rows without exactly one event of their own or their inbox topic, %d events without a business row",
			rowsWithoutOne, eventsWithoutRow)
	}
	// The end state: nothing un-fanned, poisoned, waiting, running or
	// discarded (no fault here outlasts the retry schedule), and every
	// replay enqueued.
	var unfanned, poisoned, open, discarded, replaying int
	err := h.admin.QueryRow(`
		SELECT (SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL),
		       (SELECT count(*) FROM outbox.events WHERE poisoned_at IS NOT NULL),
		       (SELECT count(*) FROM outbox.jobs WHERE state IN ('available', 'running', 'retryable')),
		       (SELECT count(*) FROM outbox.jobs WHERE state = 'discarded'),
		       (SELECT count(*) FROM outbox.replays WHERE enqueued_at IS NULL AND cancelled_at IS NULL)`).Scan(&unfanned, &poisoned, &open, &discarded, &replaying)
	if err != nil {
		t.Fatal(err)
	}
	if unfanned+poisoned+open+discarded+replaying != 0 {
		t.Errorf("end state: %d un-fanned, %d poisoned, %d jobs not finished, %d discarded, %d replays still enqueuing; want all 0",
			unfanned, poisoned, open, discarded, replaying)
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
