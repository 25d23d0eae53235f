// browser_portal_test.go: an owner's portal in a browser, from the admin's
// sign-in link to the owner's own endpoint and its attempts.

package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestOwnerPortalInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := serveAdmin(t, testAdmin(t, db, testPolicy, testLogger(t), nil))
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"received": true}`)
	})
	o := newOwner(t, srv, "Payments team")
	var ep, other Endpoint
	decodeAs(t, srv, testToken, "POST", "/api/endpoints",
		fmt.Sprintf(`{"url": %q, "description": "Payments hook", "owner_id": %d}`, rc.srv.URL+"/hook", o.ID), 201, &ep)
	decodeAs(t, srv, testToken, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/other", "description": "Not theirs"}`, 201, &other)
	for i := range 3 {
		recordAddressed(t, db, o.Key, "payment.settled", fmt.Sprint(i))
	}
	relayAll(t, db)
	runWebhookWorkers(t, db, 5*time.Second)
	waitFor(t, "three deliveries to the owner's endpoint", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, ep.ID) == 3
	})

	br := startBrowser(t)
	// The admin makes a sign-in link on the endpoint's page, and signs out.
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("h1")
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, ep.ID))
	if got := br.text("#owner-name"); got != "Payments team" {
		t.Errorf("the endpoint page's owner reads %q, want its name", got)
	}
	br.click("#make-signin-link")
	link := br.text("#signin-link")
	if !strings.Contains(link, "/signin?code=obl_") {
		t.Fatalf("the link reads %q", link)
	}
	br.click("form.logout button")
	br.find("form.login")

	// The owner opens it, signs in, and sees its endpoint alone.
	br.open(link)
	br.click("#signin-with-link")
	br.find("#portal-owner")
	if got := br.text("#portal-owner"); got != "Payments team" {
		t.Errorf("the header names %q, want the owner", got)
	}
	// The panel's address, the admin's overview, takes the owner to its
	// endpoints.
	br.open(srv.URL + "/")
	br.find(fmt.Sprintf("#endpoint-%d", ep.ID))
	if n := br.count(fmt.Sprintf("#endpoint-%d", ep.ID)); n != 1 {
		t.Errorf("the owner's list shows its endpoint %d times, want once", n)
	}
	if n := br.count(fmt.Sprintf("#endpoint-%d", other.ID)); n != 0 {
		t.Errorf("the owner's list shows another's endpoint")
	}
	if n := br.count(`header nav a[href="/jobs"], header nav a[href="/sources"], header nav a[href="/subjects"]`); n != 0 {
		t.Errorf("the owner's navigation has %d global pages", n)
	}
	br.click(fmt.Sprintf("#endpoint-%d .endpoint-name a", ep.ID))
	br.find("#replay")
	if got := br.text("h1"); !strings.Contains(got, "Payments hook") {
		t.Errorf("the endpoint page's title reads %q", got)
	}
	var attempts int
	br.execute(`return [...document.querySelectorAll('h2')].find(h => h.textContent === 'Recent attempts').nextElementSibling.querySelectorAll('tbody tr').length`, &attempts)
	if attempts != 3 {
		t.Errorf("the owner's endpoint page shows %d recent attempts, want 3", attempts)
	}
	if n := br.count("figure"); n == 0 {
		t.Error("the owner's endpoint page has no chart")
	}
	if n := br.count("#make-signin-link"); n != 0 {
		t.Error("the owner is offered to make sign-in links")
	}
	// An attempt's event shows the owner what its receiver was sent.
	br.execute(`[...document.querySelectorAll('h2')].find(h => h.textContent === 'Recent attempts').nextElementSibling.querySelector('tbody a').click(); return true`, new(bool))
	br.find("#payload")
	if got := br.text("#payload"); !strings.Contains(got, `"subject"`) {
		t.Errorf("the attempt's event shows the payload %q", got)
	}
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, ep.ID))
	br.click("#pause")
	br.find("#resume")
	br.screenshot(filepath.Join(artifactDir, "portal-endpoint.png"))

	// Its audit page shows its pause; a global page is refused.
	br.open(srv.URL + "/audit")
	if got := br.text("#audit tbody tr"); !strings.Contains(got, "POST /endpoints/{id}/pause") || !strings.Contains(got, "Payments team") {
		t.Errorf("the owner's newest audit entry reads %q, want its pause", got)
	}
	br.open(srv.URL + "/jobs")
	if got := br.text("p.error"); !strings.Contains(got, "the admin's") {
		t.Errorf("the job list shows an owner %q, want it refused", got)
	}
}
