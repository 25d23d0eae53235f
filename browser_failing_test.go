// browser_failing_test.go: the on-call path in a browser: an endpoint
// answering 500 raises endpoint_failing on the overview, whose link leads
// to the endpoint's page, where the last error comes before any chart.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// execute runs script in the page and returns what it returns, decoded.
func (d *webDriver) execute(script string, out any) {
	d.t.Helper()
	if err := json.Unmarshal(d.call("POST", "/execute/sync", map[string]any{"script": script, "args": []any{}}), out); err != nil {
		d.t.Fatalf("execute %q: %v", script, err)
	}
}

func TestFailingEndpointPathInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	a := testAdmin(t, db, testPolicy, testLogger(t), nil)
	// A short threshold, so that the first minute of failures is enough;
	// the rule's edges at the defaults are TestEndpointFailingAlertEdges'.
	a.alerts.EndpointFailingFor = time.Second
	srv := httptest.NewServer(routes(a))
	t.Cleanup(srv.Close)

	var healthy atomic.Bool // the receiver answers 500 until the fix is in
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if healthy.Load() {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":"upstream database unavailable"}`)
	})
	var ep int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, description, secret) VALUES ($1, 'Orders service', decode(repeat('ab', 32), 'hex')) RETURNING id`,
		rc.srv.URL+"/hook").Scan(&ep); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		record(t, db, "order.paid", fmt.Sprint(i))
	}
	relayAll(t, db)
	runWebhookWorkers(t, db, 5*time.Second)

	waitFor(t, "endpoint_failing on the overview", 30*time.Second, func() bool {
		o, err := readOverview(context.Background(), db, a.alerts)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(o.Alerts, func(al Alert) bool { return al.Name == "endpoint_failing" })
	})

	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("#alert-endpoint_failing")
	msg := br.text("#alert-endpoint_failing")
	for _, want := range []string{`"Orders service"`, "last error: webhook: answered 500 Internal Server Error"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the alert reads %q, want it to say %s", msg, want)
		}
	}
	var tile string
	br.execute(`return document.getElementById('tile-failing').className`, &tile)
	if tile != "tile-bad" {
		t.Errorf("the failing tile's class is %q, want tile-bad", tile)
	}
	screenshot(t, br, "panel-failing-endpoint.png")

	br.click("#alert-endpoint_failing strong a")
	br.find("#last-error")
	if got := br.text("h1"); !strings.Contains(got, "Orders service") {
		t.Errorf("the alert's link leads to %q, want the endpoint's page", got)
	}
	if got := br.text("#last-error"); !strings.HasPrefix(got, "webhook: answered 500") {
		t.Errorf("the endpoint page's last error reads %q", got)
	}
	if got := br.text("#last-answer"); !strings.Contains(got, `"error": "upstream database unavailable"`) {
		t.Errorf("the last answer reads %q, want it unescaped and indented", got)
	}
	// The last error precedes the first chart in the page, and is on the
	// first screen (the window is 1280 × 1000).
	var first struct {
		BeforeChart bool `json:"before_chart"`
		OnScreen    bool `json:"on_screen"`
	}
	br.execute(`const e = document.getElementById('last-error'), f = document.querySelector('figure');
		return {before_chart: !!(e.compareDocumentPosition(f) & Node.DOCUMENT_POSITION_FOLLOWING),
		        on_screen: e.getBoundingClientRect().bottom <= window.innerHeight};`, &first)
	if !first.BeforeChart || !first.OnScreen {
		t.Errorf("the last error: before the first chart %v, on the first screen %v; want both", first.BeforeChart, first.OnScreen)
	}
	if got := br.text("#state"); got != "failing" {
		t.Errorf("the endpoint's state reads %q, want failing", got)
	}
	screenshot(t, br, "panel-failing-endpoint-page.png")

	retryDiscardedGroupInBrowser(t, br, srv.URL, db, ep, rc, &healthy)
}

// retryDiscardedGroupInBrowser is the end of the night: the 3 deliveries
// have used up their attempts, the receiver is fixed, and one button of
// the discarded list, the group of its endpoint and its error, sends all
// 3 again.
func retryDiscardedGroupInBrowser(t *testing.T, br *webDriver, base string, db *sql.DB, ep int64, rc *receiver, healthy *atomic.Bool) {
	t.Helper()
	waitFor(t, "the 3 deliveries to fail", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'retryable'`, ep) == 3
	})
	// Out of attempts: discarded as the workers would leave them, with
	// their errors.
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'discarded', finalized_at = now() WHERE endpoint_id = $1 AND state = 'retryable'`, ep)
	healthy.Store(true)
	failed := len(rc.requests())

	br.open(base + "/jobs?state=discarded")
	br.find("#discarded-groups")
	if n := br.count("#discarded-groups tr.discarded-group"); n != 1 {
		t.Fatalf("%d groups of discarded deliveries, want 1: one endpoint, one error", n)
	}
	row := br.text("#discarded-groups tr.discarded-group")
	for _, want := range []string{"Orders service", "webhook: answered 500 Internal Server Error", "Send these 3 again"} {
		if !strings.Contains(row, want) {
			t.Errorf("the discarded group reads %q, want it to say %q", row, want)
		}
	}
	br.screenshot(filepath.Join(artifactDir, "panel-jobs-discarded.png")) // docs/panel.md shows the demo's
	br.click("#discarded-groups tr.discarded-group button")
	br.find(".flash")
	if got := br.text(".flash"); !strings.HasPrefix(got, "3 discarded jobs will be sent again") {
		t.Errorf("after the group's retry the list says %q", got)
	}
	waitFor(t, "the receiver to get the 3 deliveries again", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, ep) == 3
	})
	got := map[string]bool{}
	for _, req := range rc.requests()[failed:] {
		got[req.Header.Get("webhook-id")] = true
	}
	if len(got) != 3 {
		t.Errorf("the receiver got %d distinct events after the retry, want the 3 discarded ones", len(got))
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'discarded'`); n != 0 {
		t.Errorf("%d jobs still discarded after the group's retry", n)
	}
}

// screenshot saves the page as name under artifactDir, and under the
// folder OUTBOXD_SCREENSHOTS names when it is set: `OUTBOXD_SCREENSHOTS=docs
// go test -run InBrowser .` renews the pictures docs/panel.md shows, which
// a plain run leaves alone.
func screenshot(t *testing.T, br *webDriver, name string) {
	t.Helper()
	br.screenshot(filepath.Join(artifactDir, name))
	if dir := os.Getenv("OUTBOXD_SCREENSHOTS"); dir != "" {
		br.screenshot(filepath.Join(dir, name))
	}
}
