// chain_test.go: two outboxd setups chained, A's endpoint being B's inbox,
// through a receiver that fails at random: every event of A is recorded in
// B exactly once, through A's retries and a replay.

package main

import (
	"database/sql"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// flakyProxy forwards to target, failing at random (seeded): it drops a
// request before B sees it, or forwards it and loses B's answer, which is
// the case that makes A send a duplicate B has already recorded.
type flakyProxy struct {
	srv       *httptest.Server
	mu        sync.Mutex // protects rng
	rng       *rand.Rand
	forwarded atomic.Int64 // requests B saw
	lost      atomic.Int64 // of those, answers A never got
}

func newFlakyProxy(t *testing.T, target string, seed uint64) *flakyProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(u)
	p := &flakyProxy{rng: rand.New(rand.NewPCG(seed, seed))}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		roll := p.rng.IntN(10)
		p.mu.Unlock()
		switch {
		case roll < 3:
			http.Error(w, "flaky: dropped before the receiver", http.StatusBadGateway)
		case roll < 5:
			p.forwarded.Add(1)
			p.lost.Add(1)
			forward.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "flaky: the receiver's answer was lost", http.StatusGatewayTimeout)
		default:
			p.forwarded.Add(1)
			forward.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func TestChainAToBExactlyOnceThroughFlakyReceiver(t *testing.T) {
	t.Parallel()
	dbA, _ := newTestDB(t)
	dbB, _ := newTestDB(t)
	apiA := newTestAPI(t, dbA, testPolicy)
	apiB := newTestAPI(t, dbB, testPolicy)
	proxy := newFlakyProxy(t, apiB.srv.URL, 6)

	ep := apiA.createEndpoint(proxy.srv.URL + "/webhooks/a")
	body, _ := json.Marshal(map[string]string{"name": "a", "secret": ep.Secret})
	if status, resp := apiB.do("POST", "/api/sources", string(body)); status != http.StatusCreated {
		t.Fatalf("create source in B: %d %s", status, resp)
	}

	const n = 40
	mustExec(t, dbA, `SELECT outbox.record('order.paid', 'o-' || i, jsonb_build_object('i', i)) FROM generate_series(1, $1) AS i`, n)
	relayAll(t, dbA)
	runWebhookWorkers(t, dbA, 10*time.Second)
	allDelivered := func() bool {
		kickRetries(t, dbA)
		return queryInt(t, dbA, `SELECT count(*) FROM outbox.jobs WHERE kind = 'webhook' AND state = 'completed'`) == n
	}
	waitFor(t, "A to deliver every event", 60*time.Second, allDelivered)

	// What A recorded, B has once each, under the source's prefix, keyed
	// in its inbox by A's event id.
	wantEvents := queryStrings(t, dbA, `SELECT 'a.' || topic || ' ' || subject || ' ' || payload::text FROM outbox.events WHERE topic = 'order.paid' ORDER BY 1`)
	wantInbox := queryStrings(t, dbA, `SELECT 'a ' || id FROM outbox.events WHERE topic = 'order.paid' ORDER BY 1`)
	check := func(when string) {
		t.Helper()
		gotEvents := queryStrings(t, dbB, `SELECT topic || ' ' || subject || ' ' || payload::text FROM outbox.events ORDER BY 1`)
		if diff := cmp.Diff(wantEvents, gotEvents); diff != "" {
			t.Errorf("%s: B's events (-A's +B's):\n%s", when, diff)
		}
		gotInbox := queryStrings(t, dbB, `SELECT source || ' ' || webhook_id FROM outbox.inbox WHERE event_id IS NOT NULL ORDER BY 1`)
		if diff := cmp.Diff(wantInbox, gotInbox); diff != "" {
			t.Errorf("%s: B's inbox (-want +got):\n%s", when, diff)
		}
	}
	check("after A's retries")
	if proxy.lost.Load() == 0 || proxy.forwarded.Load() <= n {
		t.Fatalf("B saw %d requests, %d of them answered into the void: the seed made no duplicate, so this test proved nothing",
			proxy.forwarded.Load(), proxy.lost.Load())
	}
	t.Logf("B saw %d requests for %d events (%d answers lost)", proxy.forwarded.Load(), n, proxy.lost.Load())

	// A replay by hand: delivered jobs run again, with the same webhook-id.
	seen := proxy.forwarded.Load()
	mustExec(t, dbA, `
		UPDATE outbox.jobs
		SET state = 'available', scheduled_at = now(), finalized_at = NULL, max_attempts = attempt + 18
		WHERE id IN (SELECT id FROM outbox.jobs WHERE kind = 'webhook' ORDER BY id LIMIT 10)`)
	waitFor(t, "the replay to be delivered", 60*time.Second, allDelivered)
	if proxy.forwarded.Load() < seen+10 {
		t.Errorf("the replay reached B %d times, want at least 10", proxy.forwarded.Load()-seen)
	}
	check("after the replay")
}

// queryStrings runs a query of one text column, on a pool or in a
// transaction.
func queryStrings(t *testing.T, db interface {
	Query(string, ...any) (*sql.Rows, error)
}, query string) []string {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
