// browser_screenshots_test.go: every page of the panel at 1280 px under
// -demo with a failing endpoint: each one loads, fits the width, and is
// photographed for docs/panel.md (OUTBOXD_SCREENSHOTS=docs renews them).

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// demoPanelPages are the pages TestEveryPanelPageUnderTheDemo photographs,
// each as docs/panel-<name>.png.
var demoPanelPages = []string{"overview", "endpoints", "endpoint", "events", "event", "jobs", "subjects", "inbox"}

func TestEveryPanelPageUnderTheDemo(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	var logs syncBuffer
	go func() {
		defer close(exited)
		args := []string{"-demo", "-addr", addr, "-allow-private-endpoints"}
		if err := run(ctx, args, envFrom(map[string]string{"DATABASE_URL": dsn, "OUTBOXD_ADMIN_TOKEN": testToken}), io.Discard, &logs); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
		if t.Failed() {
			t.Logf("outboxd's log:\n%s", logs.String())
		}
	})
	awaitHealthy(t, addr, exited)
	base := "http://" + addr
	api := &testAPI{t: t, srv: &httptest.Server{URL: base}}

	// The failing endpoint: the orders service answers 500 to every
	// delivery of demo.* and order.* events.
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":"upstream database unavailable"}`)
	})
	status, body := api.do("POST", "/api/endpoints", fmt.Sprintf(`{"url": %q, "topics": ["demo.*", "order.*"], "description": "Orders service"}`, rc.srv.URL+"/hook"))
	if status != http.StatusCreated {
		t.Fatalf("create the failing endpoint: %d %s", status, body)
	}
	var event int64
	for i := range 6 {
		status, body := api.do("POST", "/api/events", fmt.Sprintf(`{"topic": "order.paid", "subject": "order-%d", "payload": {"order_id": %d, "amount_cents": 12900, "currency": "EUR", "lines": [{"sku": "tea-0042", "quantity": 3}], "note": "left at the door"}}`, i, i))
		if status != http.StatusCreated {
			t.Fatalf("record an event: %d %s", status, body)
		}
		fmt.Sscanf(string(body), `{"id":%d}`, &event)
	}
	// An inbox source that was sent a webhook and refused another.
	secret := api.createSource("billing", "")
	webhook := []byte(`{"type":"invoice.paid","subject":"inv-7","data":{"cents":1200}}`)
	postWebhook(t, base+"/webhooks/billing", secret, "inv-7", time.Now(), webhook, nil)
	postWebhook(t, base+"/webhooks/billing", newWebhookSecret(), "inv-8", time.Now(), webhook, nil)

	waitFor(t, "the demo to deliver and the orders service's breaker to open", 60*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries AS d JOIN outbox.endpoints AS ep ON ep.id = d.endpoint_id
WHERE ep.description = $1 AND d.outcome = 'completed'`, demoEndpointDescription) > 0 &&
			queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE description = 'Orders service' AND breaker_opened_at IS NOT NULL`) == 1
	})
	// Two of its deliveries out of attempts, as a night of them leaves
	// them.
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'discarded', finalized_at = now()
WHERE id IN (SELECT j.id FROM outbox.jobs AS j JOIN outbox.endpoints AS ep ON ep.id = j.endpoint_id
             WHERE ep.description = 'Orders service' AND j.state = 'retryable' AND j.errors <> '[]' ORDER BY j.id LIMIT 2)`)
	var failing int64
	if err := db.QueryRow(`SELECT id FROM outbox.endpoints WHERE description = 'Orders service'`).Scan(&failing); err != nil {
		t.Fatal(err)
	}

	br := startBrowser(t)
	br.open(base + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("#backlog")
	pages := map[string]struct{ path, waitFor string }{
		"overview":  {"/", "#alert-endpoint_failing"},
		"endpoints": {"/endpoints", "table"},
		"endpoint":  {fmt.Sprintf("/endpoints/%d", failing), "#last-error"},
		"events":    {"/events", "td.outcome .badge"},
		"event":     {fmt.Sprintf("/events/%d", event), "#payload"},
		"jobs":      {"/jobs?state=discarded", "#discarded-groups tr.discarded-group"},
		"subjects":  {"/subjects", "h1"},
		"inbox":     {"/sources", "table.refusals-by-minute"},
	}
	for _, name := range demoPanelPages {
		pg := pages[name]
		br.open(base + pg.path)
		br.find(pg.waitFor)
		var fit struct {
			Width       int `json:"width"`
			ScrollWidth int `json:"scroll_width"`
		}
		br.execute(`return {width: window.innerWidth, scroll_width: document.documentElement.scrollWidth};`, &fit)
		if fit.Width != 1280 {
			t.Errorf("%s: the window is %d px wide, want 1280", name, fit.Width)
		}
		if fit.ScrollWidth > fit.Width {
			t.Errorf("%s: the page is %d px wide, wider than the 1280-px window", name, fit.ScrollWidth)
		}
		screenshot(t, br, "panel-"+name+".png")
	}
}
