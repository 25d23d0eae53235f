// browser_endpointrequest_test.go: an endpoint's retries, timeout and
// headers set in the panel's forms, by the admin and by the owner in its
// portal, a secret header shown masked and kept through an edit.

package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestEndpointRequestSettingsInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := serveAdmin(t, testAdmin(t, db, testPolicy, testLogger(t), nil))
	rc := newReceiver(t, nil)
	o := newOwner(t, srv, "Billing team")
	const secret = "sk_live_browser_secret_7"
	page := func(br *webDriver) string {
		t.Helper()
		var html string
		br.execute(`return document.documentElement.outerHTML`, &html)
		if strings.Contains(html, secret) {
			t.Errorf("the page shows the secret header's value")
		}
		return html
	}

	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("h1")
	br.open(srv.URL + "/endpoints")
	form := `form[action="/endpoints"] `
	br.typeInto(form+"input[name=url]", rc.srv.URL+"/hook")
	br.typeInto(form+"input[name=max_attempts]", "5")
	br.typeInto(form+"input[name=retry_window_seconds]", "3600")
	br.typeInto(form+"input[name=timeout_seconds]", "12")
	br.typeInto(form+"textarea[name=headers]", "X-Tenant: acme")
	br.typeInto(form+"textarea[name=secret_headers]", "X-Api-Key: "+secret)
	br.click(form + "button")
	br.find("#secret")
	page(br)
	if got := br.text("#custom-headers"); got != "X-Api-Key: "+maskedHeaderValue+" X-Tenant: acme" {
		t.Errorf("the page's headers read %q, want the secret one masked", got)
	}
	if got := br.text("#request-timeout") + "; " + br.text("#retries"); got != "12s; 5 attempts, none later than 1h after the first failure" {
		t.Errorf("the page's settings read %q", got)
	}
	var list struct{ Endpoints []Endpoint }
	decodeAs(t, srv, testToken, "GET", "/api/endpoints", "", 200, &list)
	eps := list.Endpoints
	if len(eps) != 1 || eps[0].TimeoutSeconds == nil || *eps[0].TimeoutSeconds != 12 || *eps[0].MaxAttempts != 5 || *eps[0].RetryWindowSeconds != 3600 {
		t.Fatalf("the endpoint created in the panel: %+v", eps)
	}
	ep := eps[0]
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", ep.ID), fmt.Sprintf(`{"owner_id": %d}`, o.ID), 200, nil)
	br.click("form.logout button")
	br.find("form.login")

	// The owner, in its portal, changes the timeout and a plain header;
	// the secret one's masked line keeps it.
	br.typeInto("input[name=token]", o.Token)
	br.click("form.login button")
	br.find("#portal-owner")
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, ep.ID))
	edit := fmt.Sprintf(`form[action="/endpoints/%d/edit"] `, ep.ID)
	if got := br.find(edit + "textarea[name=secret_headers]"); got == "" {
		t.Fatal("no secret headers field")
	}
	page(br)
	br.execute(fmt.Sprintf(`document.querySelector('%sinput[name=timeout_seconds]').value = '';
		document.querySelector('%stextarea[name=headers]').value = 'X-Tenant: globex\nX-Region: eu'; return true`, edit, edit), new(bool))
	br.click(edit + "button")
	br.find("p.flash")
	page(br)
	if got := br.text("#custom-headers"); got != "X-Api-Key: "+maskedHeaderValue+" X-Region: eu X-Tenant: globex" {
		t.Errorf("after the owner's edit the headers read %q", got)
	}
	if got := br.text("#request-timeout"); got != "the service's" {
		t.Errorf("after the owner emptied the timeout it reads %q, want the service's", got)
	}

	// The next delivery carries them all, the secret one as typed.
	recordAddressed(t, db, o.Key, "t", "s")
	relayAll(t, db)
	runWebhookWorkers(t, db, 5*time.Second)
	waitFor(t, "the delivery", 30*time.Second, func() bool { return len(rc.requests()) == 1 })
	h := rc.requests()[0].Header
	if got := []string{h.Get("X-Api-Key"), h.Get("X-Tenant"), h.Get("X-Region")}; strings.Join(got, " ") != secret+" globex eu" {
		t.Errorf("the delivery carried %q, want the secret, globex and eu", got)
	}
	if status, body := callAs(t, srv, o.Token, "GET", fmt.Sprintf("/api/endpoints/%d", ep.ID), ""); status != http.StatusOK || strings.Contains(string(body), secret) {
		t.Errorf("the owner's API answer: %d %s", status, body)
	}
}
