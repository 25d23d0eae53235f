package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// Ordered lanes (docs/endpoints.md, ordered delivery): with ordering "subject", an
// endpoint gets each subject's deliveries one at a time, in fan-out order.

// orderedReceiver checks, per subject, that no request for the subject's
// event n+1 arrives before its event n was accepted. Events carry n, the
// subject's business counter, in their data.
type orderedReceiver struct {
	*receiver
	mu       sync.Mutex
	accepted map[string]int   // subject → the highest n answered 2xx
	failed   map[string]bool  // webhook-id → failed once already
	early    []string         // violations
	fail     func(n int) bool // whether to fail this event's first attempt
	stuck    map[string]bool  // subjects whose every request fails
	inFlight map[string]int   // subject → requests being served
}

func newOrderedReceiver(t *testing.T, fail func(n int) bool, stuck ...string) *orderedReceiver {
	or := &orderedReceiver{accepted: map[string]int{}, failed: map[string]bool{}, stuck: map[string]bool{},
		inFlight: map[string]int{}, fail: fail}
	for _, s := range stuck {
		or.stuck[s] = true
	}
	or.receiver = newReceiver(t, func(nth int, w http.ResponseWriter, r *http.Request) {
		var body struct {
			Subject string `json:"subject"`
			Data    struct {
				N int `json:"n"`
			} `json:"data"`
		}
		// This request's body is the nth recorded, not the last: another
		// request may have been recorded since.
		if err := json.Unmarshal(or.requests()[nth-1].Body, &body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		id := r.Header.Get("webhook-id")
		or.mu.Lock()
		subject, n := body.Subject, body.Data.N
		if n > or.accepted[subject]+1 {
			or.early = append(or.early, fmt.Sprintf("subject %s: event n=%d arrived while n=%d was the last accepted", subject, n, or.accepted[subject]))
		}
		or.inFlight[subject]++
		if or.inFlight[subject] > 1 {
			or.early = append(or.early, fmt.Sprintf("subject %s: %d requests at once", subject, or.inFlight[subject]))
		}
		failNow := or.stuck[subject] || (!or.failed[id] && or.fail != nil && or.fail(n))
		if failNow {
			or.failed[id] = true
		} else if n > or.accepted[subject] {
			or.accepted[subject] = n
		}
		or.mu.Unlock()
		time.Sleep(time.Millisecond) // overlapping requests, if the lanes allowed them
		or.mu.Lock()
		or.inFlight[subject]--
		or.mu.Unlock()
		if failNow {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	return or
}

func (or *orderedReceiver) violations() []string {
	or.mu.Lock()
	defer or.mu.Unlock()
	return append([]string(nil), or.early...)
}

func (or *orderedReceiver) acceptedUpTo(subject string) int {
	or.mu.Lock()
	defer or.mu.Unlock()
	return or.accepted[subject]
}

// produceSerialized records events for subjects from several producers at
// once, each transaction bumping its subject's business row and recording
// the new count: transactions on one subject serialize on its row, so
// its events' n follows their commit order.
func produceSerialized(t *testing.T, db *sql.DB, topic string, subjects []string, perSubject, producers int) {
	t.Helper()
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS counters (subject text PRIMARY KEY, n integer NOT NULL)`)
	for _, s := range subjects {
		mustExec(t, db, `INSERT INTO counters VALUES ($1, 0) ON CONFLICT DO NOTHING`, s)
	}
	work := make(chan string)
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for range producers {
		wg.Go(func() {
			for subject := range work {
				err := func() error {
					tx, err := db.Begin()
					if err != nil {
						return err
					}
					defer tx.Rollback()
					var n int
					if err := tx.QueryRow(`UPDATE counters SET n = n + 1 WHERE subject = $1 RETURNING n`, subject).Scan(&n); err != nil {
						return err
					}
					if _, err := tx.Exec(`SELECT outbox.record($1, $2, jsonb_build_object('n', $3::int))`, topic, subject, n); err != nil {
						return err
					}
					return tx.Commit()
				}()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range perSubject * len(subjects) {
		work <- subjects[i%len(subjects)]
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Producers serialize on each subject's row; two relays fan out and two
// replicas deliver, and the receiver fails the first attempt of every 7th
// event. Still no request for a subject's event n+1 arrives before its
// event n was accepted, and no subject ever has two requests at once.
//
// One relay's transaction is kept open over subject a's event 2 (the test
// holds its row, as a relay that claimed it and has not committed does),
// while the relays fan out a's later events: those must wait for it, held,
// even with the lane's event 1 delivered and nothing running in it, until
// event 2 is fanned out. That is advance_lanes' rule that an earlier
// un-fanned event of the subject holds the lane; without it a's event 3
// is delivered before its event 2.
func TestOrderedLaneDeliversEachSubjectInCommitOrder(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newOrderedReceiver(t, func(n int) bool { return n%7 == 0 })
	ep := createTunedEndpoint(t, api, rc.srv.URL, `"max_in_flight": 16, "ordering": "subject"`)
	if ep.Ordering != "subject" {
		t.Fatalf("endpoint ordering %q, want subject", ep.Ordering)
	}
	subjects := []string{"a", "b", "c", "d", "e"}
	const perSubject = 30
	topic := topicFor(rc.srv.URL) + ".e"

	// Each subject's first two events, before any relay runs; then a's
	// event 2 is claimed by a transaction that stays open.
	produceSerialized(t, db, topic, subjects, 2, 4)
	open, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback()
	var held int64
	if err := open.QueryRow(`
		SELECT id FROM outbox.events
		WHERE subject = 'a' AND payload->>'n' = '2'
		FOR UPDATE`).Scan(&held); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var relays sync.WaitGroup
	for i := range 2 {
		replica, err := openDB(context.Background(), dsn, 10)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { replica.Close() })
		cfg := defaultConfig().Relay
		cfg.SweepInterval = 20 * time.Millisecond
		r := newRelay(replica, cfg, 18, []jobTarget{}, testLogger(t).With("relay", i))
		relays.Go(func() { r.Run(ctx, nil, nil) })
		runWebhookWorkers(t, replica, 30*time.Second)
	}
	produceSerialized(t, db, topic, subjects, perSubject-2, 8)
	defer func() {
		if t.Failed() {
			rc.mu.Lock()
			t.Logf("accepted: %v", rc.accepted)
			rc.mu.Unlock()
			rows := queryStrings(t, db, `SELECT lane_key || ' ' || state || ' ' || attempt || ' ' || coalesce(to_char(scheduled_at, 'HH24:MI:SS'), 'inf') || ' ' || event_id FROM outbox.jobs WHERE endpoint_id = `+itoa(ep.ID)+` AND state <> 'completed' ORDER BY lane_key, id`)
			t.Logf("unfinished jobs:\n%s", strings.Join(rows, "\n"))
			t.Logf("unfanned: %d", queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE fanned_out_at IS NULL`))
		}
	}()

	waitFor(t, "every subject but a delivered, a's event 1 finished and its later events fanned out", 60*time.Second, func() bool {
		for _, s := range subjects[1:] {
			if rc.acceptedUpTo(s) != perSubject {
				return false
			}
		}
		return queryInt(t, db, `
			SELECT count(*) FROM outbox.events
			WHERE subject = 'a' AND id <> $1 AND fanned_out_at IS NULL`, held) == 0 &&
			queryInt(t, db, `
			SELECT count(*) FROM outbox.deliveries AS d JOIN outbox.events AS e ON e.id = d.event_id
			WHERE d.endpoint_id = $1 AND e.subject = 'a' AND d.event_id < $2 AND d.outcome = 'completed'`, ep.ID, held) == 1
	})
	if n := queryInt(t, db, `
		SELECT count(*) FROM outbox.jobs
		WHERE endpoint_id = $1 AND lane_key = 'a' AND event_id > $2
		  AND (state <> 'available' OR scheduled_at < 'infinity')`, ep.ID, held); n != 0 || rc.acceptedUpTo("a") != 1 {
		t.Errorf("with a's event 2 still to be fanned out, %d of its later deliveries left their turn and n=%d is accepted; want 0 and n=1",
			n, rc.acceptedUpTo("a"))
	}
	if err := open.Rollback(); err != nil {
		t.Fatal(err)
	}

	waitFor(t, "every subject's events accepted", 60*time.Second, func() bool {
		for _, s := range subjects {
			if rc.acceptedUpTo(s) != perSubject {
				return false
			}
		}
		return true
	})
	cancel()
	relays.Wait()
	for _, v := range rc.violations() {
		t.Error(v)
	}
	retried := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND attempt > 1 AND outcome = 'completed'`, ep.ID)
	if retried < len(subjects) {
		t.Errorf("%d deliveries were retried, want at least one a subject: the forced failures missed", retried)
	}
}

// A subject whose receiver keeps failing holds up only itself: the other
// subjects of the same endpoint are all delivered while its first event
// waits for its retry, and its later events wait behind it, held.
func TestStuckSubjectDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newOrderedReceiver(t, nil, "stuck")
	ep := createTunedEndpoint(t, api, rc.srv.URL, `"max_in_flight": 4, "ordering": "subject"`)
	runWebhookWorkers(t, db, 30*time.Second)
	produceSerialized(t, db, topicFor(rc.srv.URL)+".e", []string{"stuck", "x", "y"}, 10, 4)
	relayAll(t, db)
	waitFor(t, "subjects x and y", 20*time.Second, func() bool {
		return rc.acceptedUpTo("x") == 10 && rc.acceptedUpTo("y") == 10
	})
	for _, v := range rc.violations() {
		t.Error(v)
	}
	var held, active int
	if err := db.QueryRow(`
		SELECT count(*) FILTER (WHERE scheduled_at = 'infinity'), count(*) FILTER (WHERE scheduled_at < 'infinity')
		FROM outbox.jobs WHERE endpoint_id = $1 AND lane_key = 'stuck' AND state IN ('available', 'retryable', 'running')`,
		ep.ID).Scan(&held, &active); err != nil {
		t.Fatal(err)
	}
	if held != 9 || active != 1 {
		t.Errorf("the stuck subject has %d held and %d active deliveries, want 9 and 1", held, active)
	}
	if n := rc.acceptedUpTo("stuck"); n != 0 {
		t.Errorf("the stuck subject has n=%d accepted, want none", n)
	}
}

// Releasing an endpoint's lanes (PATCH ordering "none") lets every held
// delivery go; deleting an ordered endpoint ends them all without a
// request, none left held.
func TestReleasingOrderedLanes(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newOrderedReceiver(t, nil, "stuck")
	ep := createTunedEndpoint(t, api, rc.srv.URL, `"ordering": "subject"`)
	produceSerialized(t, db, topicFor(rc.srv.URL)+".e", []string{"stuck"}, 5, 1)
	relayAll(t, db)
	held := func() int {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND scheduled_at = 'infinity'`, ep.ID)
	}
	if n := held(); n != 4 {
		t.Fatalf("%d deliveries held behind the lane's first, want 4", n)
	}
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"ordering": "none"}`); status != http.StatusOK {
		t.Fatalf("patch ordering none: %d %s", status, body)
	}
	if n := held(); n != 0 {
		t.Errorf("%d deliveries still held after ordering none, want 0", n)
	}

	ordered := createTunedEndpoint(t, api, rc.srv.URL+"/again", `"ordering": "subject"`)
	produceSerialized(t, db, topicFor(rc.srv.URL+"/again")+".e", []string{"gone"}, 3, 1)
	relayAll(t, db)
	if status, body := api.do("DELETE", "/api/endpoints/"+itoa(ordered.ID), ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", status, body)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id IS NULL AND kind = 'webhook' AND scheduled_at = 'infinity'`); n != 0 {
		t.Errorf("%d deliveries of the deleted endpoint held forever, want 0", n)
	}
}

// A replay into an ordered lane takes its turn like fan-out: its
// deliveries are held and go one at a time, by event id.
func TestReplayIntoAnOrderedLaneKeepsOrder(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newOrderedReceiver(t, nil)
	ep := createTunedEndpoint(t, api, rc.srv.URL, `"max_in_flight": 8, "ordering": "subject"`)
	start := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	produceSerialized(t, db, topicFor(rc.srv.URL)+".e", []string{"s"}, 5, 1)
	relayAll(t, db)
	runWebhookWorkers(t, db, 30*time.Second)
	waitFor(t, "the first deliveries", 10*time.Second, func() bool { return rc.acceptedUpTo("s") == 5 })
	waitFor(t, "their outcomes", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, ep.ID) == 5
	})
	if status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/replay", `{"since": "`+start+`"}`); status != http.StatusOK {
		t.Fatalf("replay: %d %s", status, body)
	}
	waitFor(t, "the replay's 5 deliveries", 10*time.Second, func() bool { return len(rc.requests()) == 10 })
	var replayed []int
	for _, r := range rc.requests()[5:] {
		var body struct {
			Data struct {
				N int `json:"n"`
			} `json:"data"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatal(err)
		}
		replayed = append(replayed, body.Data.N)
	}
	if !slices.Equal(replayed, []int{1, 2, 3, 4, 5}) {
		t.Errorf("the replay arrived as %v, want 1 to 5 in order", replayed)
	}
	for _, v := range rc.violations() {
		t.Error(v)
	}
}

// The panel's endpoint forms set the ordering, its page says it, and a
// value the API refuses is refused there too.
func TestPanelSetsOrdering(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	browser := signIn(t, srv)
	ordering := func(id int64) string {
		return queryStrings(t, db, `SELECT ordering FROM outbox.endpoints WHERE id = `+itoa(id))[0]
	}
	status, page, _ := postPanelForm(t, browser, srv, "/endpoints", url.Values{
		"url": {"https://a.example/hook"}, "ordering": {"subject"}})
	id := int64(queryInt(t, db, `SELECT max(id) FROM outbox.endpoints`))
	if status != http.StatusOK || ordering(id) != "subject" {
		t.Fatalf("create with ordering subject: %d, the row holds %q", status, ordering(id))
	}
	mustContain(t, "the ordered endpoint's page", page, `<dd id="ordering">per subject: one delivery at a time, in order</dd>`)
	edit := "/endpoints/" + itoa(id) + "/edit"
	postPanelForm(t, browser, srv, edit, url.Values{"url": {"https://a.example/hook"}, "max_in_flight": {"16"}, "ordering": {"none"}})
	if got := ordering(id); got != "none" {
		t.Errorf("edited to none: the row holds %q", got)
	}
	status, page, _ = postPanelForm(t, browser, srv, edit, url.Values{"url": {"https://a.example/hook"}, "max_in_flight": {"16"}, "ordering": {"random"}})
	if status != http.StatusBadRequest || !strings.Contains(page, `ordering must be &#34;none&#34; or &#34;subject&#34;`) || ordering(id) != "none" {
		t.Errorf("ordering random: %d, the row holds %q; want 400 with the reason and no change\n%s", status, ordering(id), page)
	}
}

// An event the relay cannot fan out holds its subject's later events in
// an ordered lane only until it is poisoned: set aside, it no longer
// does, and the next is made due.
func TestPoisonedEventReleasesItsLane(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	api := newTestAPI(t, db, testPolicy)
	ep := createTunedEndpoint(t, api, "http://192.0.2.1:9", `"ordering": "subject"`)
	topic := topicFor("http://192.0.2.1:9") + ".e"
	bad, err := recordEvent(ctx, db, topic, "s", json.RawMessage(`{"poison": true}`))
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `
		CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  IF (SELECT payload ? 'poison' FROM outbox.events WHERE id = NEW.id) THEN
		    RAISE EXCEPTION 'cannot fan out event %', NEW.id;
		  END IF;
		  RETURN NEW;
		END $$`)
	mustExec(t, db, `CREATE TRIGGER refuse_poison BEFORE UPDATE ON outbox.events FOR EACH ROW
		WHEN (OLD.fanned_out_at IS NULL AND NEW.fanned_out_at IS NOT NULL) EXECUTE FUNCTION refuse_poison()`)
	later := record(t, db, topic, "s")
	cfg := defaultConfig().Relay
	r := newRelay(db, cfg, 18, []jobTarget{}, testLogger(t))
	due := func() int {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1 AND scheduled_at < 'infinity'`, later)
	}
	for pass := 1; pass <= cfg.MaxFailures; pass++ {
		if pass == 2 {
			if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1 AND endpoint_id = $2`, later, ep.ID); n != 1 || due() != 0 {
				t.Fatalf("after the first pass: %d jobs for the later event, %d of them due; want 1, held behind the failing event", n, due())
			}
		}
		if _, err := r.relayOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND poisoned_at IS NOT NULL`, bad); n != 1 {
		t.Fatalf("the failing event is not poisoned after %d passes", cfg.MaxFailures)
	}
	if due() != 1 {
		t.Errorf("the later event's delivery is still held after the earlier event was poisoned")
	}
}

// A delivery waiting for its turn shows as such in the jobs API: no due
// time, waiting_for_turn true.
func TestWaitingDeliveriesShowTheirTurn(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := createTunedEndpoint(t, api, "http://192.0.2.1:9", `"ordering": "subject"`)
	produceSerialized(t, db, topicFor("http://192.0.2.1:9")+".e", []string{"s"}, 2, 1)
	relayAll(t, db)
	status, body := api.do("GET", "/api/jobs?endpoint_id="+itoa(ep.ID), "")
	var page struct {
		Jobs []JobView `json:"jobs"`
	}
	if err := json.Unmarshal(body, &page); status != http.StatusOK || err != nil || len(page.Jobs) != 2 {
		t.Fatalf("jobs of the ordered endpoint: %d %s", status, body)
	}
	newest, oldest := page.Jobs[0], page.Jobs[1]
	if !newest.WaitingForTurn || newest.ScheduledAt != nil || oldest.WaitingForTurn || oldest.ScheduledAt == nil {
		t.Errorf("the second delivery: waiting %v at %v; the first: waiting %v at %v; want the second waiting with no time, the first due",
			newest.WaitingForTurn, newest.ScheduledAt, oldest.WaitingForTurn, oldest.ScheduledAt)
	}
}

// A rescue that discards a delivery on its last attempt (its worker died
// holding it) ends it as the completer would, and lets its subject's next
// delivery go; by the horizon and by heartbeat alike. Without the lane's
// advance the next delivery stayed held for good.
func TestRescueOnTheLastAttemptAdvancesTheLane(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"horizon", "heartbeat"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			var ep int64
			if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, ordering)
				VALUES ('http://127.0.0.1:1/hook', decode(repeat('ab', 32), 'hex'), 'subject') RETURNING id`).Scan(&ep); err != nil {
				t.Fatal(err)
			}
			mustExec(t, db, `INSERT INTO outbox.events (topic, subject, fanned_out_at) VALUES ('t', 's', now()), ('t', 's', now())`)
			// The lane's head ran on its last attempt, an hour ago, by a
			// replica that is gone (id 999 was never registered); the next
			// delivery of its subject is held behind it.
			mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, lane_key, max_attempts, attempt, state, attempted_at, scheduled_at, held_by)
				SELECT 'webhook', min(id), $1, 's', 18, 18, 'running', now() - interval '1 hour', now() - interval '1 hour', 999 FROM outbox.events`, ep)
			mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, lane_key, max_attempts, scheduled_at)
				SELECT 'webhook', max(id), $1, 's', 18, 'infinity' FROM outbox.events`, ep)

			r := newRescuer(db, defaultConfig().Workers, defaultConfig().Replicas, testLogger(t))
			rescue := r.rescueOnce
			if by == "heartbeat" {
				rescue = r.rescueDeadReplicas
			}
			if n, err := rescue(context.Background()); err != nil || n != 1 {
				t.Fatalf("rescued %d jobs, %v; want 1", n, err)
			}
			var head, next string
			if err := db.QueryRow(`
				SELECT (SELECT state::text FROM outbox.jobs ORDER BY event_id LIMIT 1),
				       (SELECT CASE WHEN scheduled_at = 'infinity' THEN 'held' ELSE state::text END
				        FROM outbox.jobs ORDER BY event_id DESC LIMIT 1)`).Scan(&head, &next); err != nil {
				t.Fatal(err)
			}
			if head != "discarded" || next != "available" {
				t.Errorf("after the rescue: head %s, next %s; want discarded, available (due)", head, next)
			}
		})
	}
}

// laneRig is an ordered endpoint with one lane, "s", whose head (event 1)
// is running and whose next event (2) is fanned out with no delivery yet:
// the state in which a relay inserting that delivery and the completer
// finishing the head race (schema.sql, outbox.advance_lanes).
type laneRig struct {
	db         *sql.DB
	endpoint   int64
	head, next int64 // event ids
}

func newLaneRig(t *testing.T) laneRig {
	t.Helper()
	db, _ := newTestDB(t)
	g := laneRig{db: db}
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, secret, ordering)
		VALUES ('http://127.0.0.1:1/hook', decode(repeat('ab', 32), 'hex'), 'subject') RETURNING id`).Scan(&g.endpoint); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`
		WITH e AS (INSERT INTO outbox.events (topic, subject, fanned_out_at) VALUES ('t', 's', now()), ('t', 's', now()) RETURNING id)
		SELECT min(id), max(id) FROM e`).Scan(&g.head, &g.next); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, lane_key, max_attempts, attempt, state, attempted_at, scheduled_at)
		VALUES ('webhook', $1, $2, 's', 18, 1, 'running', now(), now())`, g.head, g.endpoint)
	return g
}

// begin opens a transaction and returns it with its backend's pid.
func (g laneRig) begin(t *testing.T) (*sql.Tx, int) {
	t.Helper()
	tx, err := g.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	var pid int
	if err := tx.QueryRow(`SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return tx, pid
}

// finishHead completes the head as the completer does: its outcome, then
// its lane advanced without hold.
func (g laneRig) finishHead(tx *sql.Tx) (int, error) {
	if _, err := tx.Exec(`UPDATE outbox.jobs SET state = 'completed', finalized_at = now() WHERE event_id = $1`, g.head); err != nil {
		return 0, err
	}
	return g.advance(tx, false, "s")
}

// insertNext inserts the next event's delivery held, as fan-out does.
func (g laneRig) insertNext(tx *sql.Tx) error {
	_, err := tx.Exec(`INSERT INTO outbox.jobs (kind, event_id, endpoint_id, lane_key, max_attempts, scheduled_at)
		VALUES ('webhook', $1, $2, 's', 18, 'infinity')`, g.next, g.endpoint)
	return err
}

// advance runs outbox.advance_lanes for lanes of the rig's endpoint.
func (g laneRig) advance(tx *sql.Tx, hold bool, lanes ...string) (int, error) {
	ids := make([]int64, len(lanes))
	for i := range ids {
		ids[i] = g.endpoint
	}
	var n int
	err := tx.QueryRow(`SELECT outbox.advance_lanes($1, $2, $3)`, pq.Array(ids), pq.Array(lanes), hold).Scan(&n)
	return n, err
}

// awaitLockWait waits until backend pid waits for a lock.
func (g laneRig) awaitLockWait(t *testing.T, pid int, who string) {
	t.Helper()
	waitFor(t, who+" waiting for a lock", 30*time.Second, func() bool {
		return queryInt(t, g.db, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid) == 1
	})
}

// nextIsDue reports whether the next event's delivery is due (not held).
func (g laneRig) nextIsDue(t *testing.T) bool {
	return queryInt(t, g.db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1 AND scheduled_at < 'infinity'`, g.next) == 1
}

// The relay inserting a lane's next delivery held and the completer
// finishing its head, at once: whichever advances the lane second waits
// for the first to commit and then sees its row, so the next delivery is
// made due, never left held behind nothing. Each side unable to see the
// other's row would leave it held.
func TestLaneRaceNeverLeavesALaneHeld(t *testing.T) {
	t.Parallel()
	for _, first := range []string{"completer", "relay"} {
		t.Run(first+" first", func(t *testing.T) {
			t.Parallel()
			g := newLaneRig(t)
			completer, _ := g.begin(t)
			relay, relayPID := g.begin(t)
			if err := g.insertNext(relay); err != nil {
				t.Fatal(err)
			}
			var firstTx, secondTx *sql.Tx
			var secondPID int
			if first == "completer" {
				if n, err := g.finishHead(completer); err != nil || n != 0 {
					t.Fatalf("the completer advanced %d, %v; want 0: the next delivery is not committed", n, err)
				}
				firstTx, secondTx, secondPID = completer, relay, relayPID
			} else {
				if n, err := g.advance(relay, true, "s"); err != nil || n != 0 {
					t.Fatalf("the relay advanced %d, %v; want 0: the head still runs", n, err)
				}
				firstTx, secondTx = relay, completer
				if err := secondTx.QueryRow(`SELECT pg_backend_pid()`).Scan(&secondPID); err != nil {
					t.Fatal(err)
				}
			}
			advanced := make(chan error, 1)
			go func() {
				var n int
				var err error
				if first == "completer" {
					n, err = g.advance(secondTx, true, "s")
				} else {
					n, err = g.finishHead(secondTx)
				}
				if err == nil && n != 1 {
					err = fmt.Errorf("advanced %d, want 1", n)
				}
				advanced <- err
			}()
			g.awaitLockWait(t, secondPID, "the second to advance")
			if err := firstTx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-advanced; err != nil {
				t.Fatalf("the second to advance: %v", err)
			}
			if err := secondTx.Commit(); err != nil {
				t.Fatal(err)
			}
			if !g.nextIsDue(t) {
				t.Error("the lane is held with nothing running")
			}
		})
	}
}

// Lanes lock one another out only within a lane: the completer advancing
// one lane does not wait for a transaction that advanced another lane of
// the same endpoint. A call with more than 64 lanes of one endpoint locks
// the whole endpoint instead (the advisory locks one transaction may hold
// are bounded), and then it does.
func TestAdvancingALaneWaitsOnlyForItsOwn(t *testing.T) {
	t.Parallel()
	lanes := func(n int) []string {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("other-%d", i)
		}
		return keys
	}
	for _, c := range []struct {
		others int
		waits  bool
	}{{1, false}, {64, false}, {65, true}} {
		t.Run(fmt.Sprintf("%d other lanes", c.others), func(t *testing.T) {
			t.Parallel()
			g := newLaneRig(t)
			other, _ := g.begin(t)
			if _, err := g.advance(other, true, lanes(c.others)...); err != nil {
				t.Fatal(err)
			}
			completer, _ := g.begin(t)
			if _, err := completer.Exec(`SET LOCAL lock_timeout = '2s'`); err != nil {
				t.Fatal(err)
			}
			_, err := g.finishHead(completer)
			if waited := pq.As(err, pqerror.LockNotAvailable) != nil; waited != c.waits || (err != nil && !waited) {
				t.Errorf("the completer advancing lane s beside a call with %d other lanes: %v; want waiting %v", c.others, err, c.waits)
			}
		})
	}
}

// A PATCH to ordering "none" releases the endpoint's lanes under its row
// lock, and cannot see a delivery the relay inserted held meanwhile. The
// relay's advance waits for the release and then makes its delivery due:
// the lane's head it was held behind is no longer in the lane.
func TestHeldDeliveryWaitsForAReleaseInFlight(t *testing.T) {
	t.Parallel()
	g := newLaneRig(t)
	patch, _ := g.begin(t)
	relay, relayPID := g.begin(t)
	if err := g.insertNext(relay); err != nil {
		t.Fatal(err)
	}
	if _, err := patch.Exec(`UPDATE outbox.endpoints SET ordering = 'none' WHERE id = $1`, g.endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := patch.Exec(releaseLanesSQL, g.endpoint); err != nil {
		t.Fatal(err)
	}
	advanced := make(chan error, 1)
	go func() {
		n, err := g.advance(relay, true, "s")
		if err == nil && n != 1 {
			err = fmt.Errorf("advanced %d, want 1", n)
		}
		advanced <- err
	}()
	g.awaitLockWait(t, relayPID, "the relay's advance")
	if err := patch.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-advanced; err != nil {
		t.Fatalf("the relay's advance: %v", err)
	}
	if err := relay.Commit(); err != nil {
		t.Fatal(err)
	}
	if !g.nextIsDue(t) {
		t.Error("the relay's delivery is held on an endpoint that no longer orders")
	}
}
