// browser_topics_test.go: the event catalog in a browser: the admin
// registers a topic on the Topics page and sends a test from an
// endpoint's page; an owner reads its topics in its portal and tests its
// own endpoint.

package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// testTypeOf is the "type" of a request's webhook body.
func testTypeOf(body []byte) string {
	var b struct{ Type string }
	json.Unmarshal(body, &b)
	return b.Type
}

func TestAdminRegistersATopicAndSendsATestInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := serveAdmin(t, testAdmin(t, db, testPolicy, testLogger(t), nil))
	rc := newReceiver(t, nil)
	var ep Endpoint
	decodeAs(t, srv, testToken, "POST", "/api/endpoints",
		fmt.Sprintf(`{"url": %q, "topics": ["order.*"], "description": "Orders hook"}`, rc.srv.URL+"/hook"), 201, &ep)
	runWebhookWorkers(t, db, 5*time.Second)

	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("h1")
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, ep.ID))
	if n := br.count("#send-test"); n != 0 {
		t.Errorf("with no topic registered the endpoint page offers a test")
	}
	br.click(`header nav a[href="/topics"]`)
	br.typeInto("#topic-form input[name=name]", "order.paid")
	br.typeInto("#topic-form textarea[name=description]", "An order was paid in full.")
	br.typeInto("#topic-form textarea[name=example]", `{"order_id": 42}`)
	br.click("#register-topic")
	br.find(".flash")
	if got := br.text("#topics tbody .topic-name"); got != "order.paid" {
		t.Errorf("the Topics page lists %q, want order.paid", got)
	}

	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, ep.ID))
	if got := br.text("#test-topic"); got != "order.paid" {
		t.Errorf("the test form offers %q, want order.paid", got)
	}
	br.click("#send-test")
	if got := br.text(".flash"); !strings.Contains(got, "Test event") {
		t.Errorf("after the test the page says %q", got)
	}
	waitFor(t, "the test request", 20*time.Second, func() bool {
		reqs := rc.requests()
		return len(reqs) == 1 && testTypeOf(reqs[0].Body) == "order.paid"
	})
	waitFor(t, "the test attempt in the history", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, ep.ID) == 1
	})
}

func TestOwnerSendsATestFromItsPortalInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := serveAdmin(t, testAdmin(t, db, testPolicy, testLogger(t), nil))
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {})
	o := newOwner(t, srv, "Billing team")
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", o.ID), `{"allowed_topics": ["invoice.*"]}`, 200, nil)
	for _, name := range []string{"invoice.paid", "order.paid"} {
		decodeAs(t, srv, testToken, "POST", "/api/topics", fmt.Sprintf(`{"name": %q, "description": "about %s", "example": {"n": 7}}`, name, name), 201, nil)
	}
	var ep Endpoint
	decodeAs(t, srv, o.Token, "POST", "/api/endpoints",
		fmt.Sprintf(`{"url": %q, "topics": ["invoice.*"], "description": "Billing hook"}`, rc.srv.URL+"/hook"), 201, &ep)
	runWebhookWorkers(t, db, 5*time.Second)

	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", o.Token)
	br.click("form.login button")
	br.find("#portal-owner")
	br.click(`header nav a[href="/topics"]`)
	br.find("#topics")
	if got := br.text("#topics tbody"); !strings.Contains(got, "invoice.paid") || strings.Contains(got, "order.paid") {
		t.Errorf("the owner's Topics page reads %q, want invoice.paid alone", got)
	}
	if n := br.count("#topic-form"); n != 0 {
		t.Error("the owner is offered to register topics")
	}

	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, ep.ID))
	br.click("#send-test")
	if got := br.text(".flash"); !strings.Contains(got, "Test event") {
		t.Errorf("after the owner's test the page says %q", got)
	}
	waitFor(t, "the owner's test request", 20*time.Second, func() bool {
		reqs := rc.requests()
		return len(reqs) == 1 && testTypeOf(reqs[0].Body) == "invoice.paid"
	})
}
