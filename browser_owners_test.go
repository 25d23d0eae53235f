// browser_owners_test.go: the admin's Owners page and an endpoint's
// owner in a browser: each owner's endpoints with their health, giving an
// owner endpoints and taking them back, its sign-in links.

package main

import (
	"database/sql"
	"fmt"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// adminBrowser is a browser signed in as the admin on srv.
func adminBrowser(t *testing.T, srv *httptest.Server) *webDriver {
	t.Helper()
	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("h1")
	return br
}

// describedEndpoint creates, as the admin, an endpoint with a
// description, of owner ownerID (0: none).
func describedEndpoint(t *testing.T, srv *httptest.Server, ownerID int64, description string) Endpoint {
	t.Helper()
	owner := "null"
	if ownerID != 0 {
		owner = fmt.Sprint(ownerID)
	}
	var e Endpoint
	decodeAs(t, srv, testToken, "POST", "/api/endpoints",
		fmt.Sprintf(`{"url": "http://127.0.0.1:9/hook", "description": %q, "owner_id": %s}`, description, owner), 201, &e)
	return e
}

// The Owners page lists each owner's endpoints, by name, with the word
// the endpoints list gives each one's health; an owner without any says
// so, and the admin's own endpoints are on no owner's row.
func TestOwnersPageShowsEndpointsAndHealthInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o, idle := newOwner(t, srv, "Payments team"), newOwner(t, srv, "Idle team")
	words := []string{"enabled", "failing", "degraded", "paused", "disabled"}
	eps := map[string]Endpoint{}
	for _, word := range words {
		eps[word] = describedEndpoint(t, srv, o.ID, "The "+word+" hook")
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET failing_since = now(), breaker_opened_at = now(), consecutive_failures = 5 WHERE id = $1`, eps["failing"].ID)
	mustExec(t, db, `UPDATE outbox.endpoints SET failing_since = now() WHERE id = $1`, eps["degraded"].ID)
	mustExec(t, db, `UPDATE outbox.endpoints SET paused_at = now() WHERE id = $1`, eps["paused"].ID)
	mustExec(t, db, `UPDATE outbox.endpoints SET disabled_at = now(), disabled_reason = 'by hand' WHERE id = $1`, eps["disabled"].ID)
	adminsOwn := describedEndpoint(t, srv, 0, "The admin's hook")

	br := adminBrowser(t, srv)
	br.open(srv.URL + "/endpoints")
	listed := map[string]string{}
	for _, word := range words {
		var state string
		br.execute(fmt.Sprintf(`return document.querySelector('#endpoint-%d td:nth-child(3)').className`, eps[word].ID), &state)
		listed[word] = strings.TrimPrefix(state, "endpoint-")
		if listed[word] != word {
			t.Errorf("the endpoints list tells the %s endpoint %q", word, listed[word])
		}
	}

	br.open(srv.URL + "/owners")
	for _, word := range words {
		row := fmt.Sprintf("#owner-%d #owned-%d", o.ID, eps[word].ID)
		if got, want := br.text(row), fmt.Sprintf("The %s hook %s", word, listed[word]); !strings.HasPrefix(got, want) {
			t.Errorf("the Owners page lists %q, want %q: the endpoints list's word", got, want)
		}
		if got := br.text(row + " .endpoint-" + listed[word]); got != listed[word] {
			t.Errorf("the %s endpoint's health on the Owners page reads %q", word, got)
		}
	}
	if got := br.text(fmt.Sprintf("#owner-%d .endpoint-count", o.ID)); got != "5 of 10" {
		t.Errorf("the owner's count reads %q, want 5 of 10", got)
	}
	if got := br.text(fmt.Sprintf("#owner-%d .endpoint-count", idle.ID)); got != "0 of 10" {
		t.Errorf("the idle owner's count reads %q, want 0 of 10", got)
	}
	var misplaced int
	br.execute(fmt.Sprintf(`return document.querySelectorAll('#owner-%d ul.owned li, #owned-%d').length`, idle.ID, adminsOwn.ID), &misplaced)
	if misplaced != 0 {
		t.Errorf("%d endpoints listed on the idle owner's row or the admin's own endpoint listed", misplaced)
	}
	br.screenshot(artifactDir + "/owners.png")
}

// ownerOf is endpoint id's owner_id, 0 for none.
func ownerOf(t *testing.T, db *sql.DB, id int64) int64 {
	t.Helper()
	var owner sql.NullInt64
	if err := db.QueryRow(`SELECT owner_id FROM outbox.endpoints WHERE id = $1`, id).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	return owner.Int64
}

// The admin gives an owner endpoints and takes them back, and makes it a
// sign-in link, from the Owners page and from an endpoint's page; the
// owner's max_endpoints holds on both, and each change is in the trail
// as the API's change of an endpoint's owner is.
func TestAdminGivesEndpointsAndSigninLinksInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	payments, billing := newOwner(t, srv, "Payments team"), newOwner(t, srv, "Billing team")
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", payments.ID), `{"max_endpoints": 2}`, 200, nil)
	orders, refunds, third := describedEndpoint(t, srv, 0, "Orders hook"), describedEndpoint(t, srv, 0, "Refunds hook"), describedEndpoint(t, srv, 0, "Third hook")
	row := fmt.Sprintf("#owner-%d", payments.ID)
	br := adminBrowser(t, srv)

	// The Owners page gives two of the admin's endpoints; the third is
	// past max_endpoints, and refused.
	give := func(ep Endpoint) {
		br.open(srv.URL + "/owners")
		br.typeInto(row+" form.give input[name=endpoint_id]", fmt.Sprint(ep.ID))
		br.click(row + " form.give button")
		br.find("h1")
	}
	give(orders)
	if got := br.text(".flash"); !strings.Contains(got, `"Orders hook" given to Payments team`) {
		t.Errorf("after Give the page says %q", got)
	}
	give(refunds)
	if got := br.text(fmt.Sprintf("%s #owned-%d a", row, refunds.ID)); got != "Refunds hook" {
		t.Errorf("the owner's row lists %q, want the endpoint given", got)
	}
	give(third)
	if got := br.text("p.error"); !strings.Contains(got, "max_endpoints") {
		t.Errorf("a third endpoint for an owner of max_endpoints 2 says %q, want max_endpoints", got)
	}
	if got := []int64{ownerOf(t, db, orders.ID), ownerOf(t, db, refunds.ID), ownerOf(t, db, third.ID)}; fmt.Sprint(got) != fmt.Sprint([]int64{payments.ID, payments.ID, 0}) {
		t.Errorf("the endpoints' owners after three gives = %v, want the first two the owner's", got)
	}

	// Take back one; make a sign-in link.
	br.open(srv.URL + "/owners")
	br.screenshot(artifactDir + "/owners-given.png")
	br.click(fmt.Sprintf("#owned-%d button.take-back", refunds.ID))
	br.find(".flash")
	if ownerOf(t, db, refunds.ID) != 0 {
		t.Error("Take back left the endpoint its owner's")
	}
	br.click(row + " button.make-signin-link")
	if got, link := br.text("#link-owner"), br.text("#signin-link"); got != "Payments team" || !strings.Contains(link, "/signin?code=obl_") {
		t.Errorf("the Owners page's sign-in link is for %q: %q", got, link)
	}

	// The endpoint's page gives it to the owner chosen, takes it back, and
	// holds max_endpoints as the Owners page does.
	page := fmt.Sprintf("%s/endpoints/%d", srv.URL, third.ID)
	br.open(page)
	br.click(fmt.Sprintf("#owner-select option[value='%d']", billing.ID))
	br.click("#give")
	br.find(".flash")
	if got := ownerOf(t, db, third.ID); got != billing.ID {
		t.Errorf("after the endpoint page's Give the owner is %d, want %d", got, billing.ID)
	}
	br.click("#make-signin-link")
	if got := br.text("#link-owner"); got != "Billing team" {
		t.Errorf("the endpoint page's sign-in link is for %q", got)
	}
	br.open(page)
	br.click("#take-back")
	br.find(".flash")
	if got := ownerOf(t, db, third.ID); got != 0 {
		t.Errorf("after Take it back the owner is %d", got)
	}
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, refunds.ID))
	br.click(fmt.Sprintf("#owner-select option[value='%d']", payments.ID))
	br.click("#give")
	br.find(".flash")
	br.open(page)
	br.click(fmt.Sprintf("#owner-select option[value='%d']", payments.ID))
	br.click("#give")
	if got := br.text("p.error"); !strings.Contains(got, "max_endpoints") || ownerOf(t, db, third.ID) != 0 {
		t.Errorf("the endpoint page giving a third endpoint says %q, owner %d; want max_endpoints, and none", got, ownerOf(t, db, third.ID))
	}

	var trail struct{ Entries []AuditEntry }
	decodeAs(t, srv, testToken, "GET", "/api/audit?limit=8", "", 200, &trail)
	id := func(e Endpoint) string { return fmt.Sprint(e.ID) }
	want := []auditLine{
		{Actor: "admin", Via: "panel", Action: "POST /endpoints/{id}/owner", Kind: "endpoint", Subject: id(refunds), Fields: "owner_id"},
		{Actor: "admin", Via: "panel", Action: "POST /endpoints/{id}/owner", Kind: "endpoint", Subject: id(third), Fields: "owner_id"},
		{Actor: "admin", Via: "panel", Action: "POST /endpoints/{id}/signin-link", Kind: "endpoint", Subject: id(third)},
		{Actor: "admin", Via: "panel", Action: "POST /endpoints/{id}/owner", Kind: "endpoint", Subject: id(third), Fields: "owner_id"},
		{Actor: "admin", Via: "panel", Action: "POST /owners/{id}/signin-link", Kind: "owner", Subject: fmt.Sprint(payments.ID)},
		{Actor: "admin", Via: "panel", Action: "POST /owners/{id}/take-back", Kind: "endpoint", Subject: id(refunds), Fields: "endpoint_id"},
		{Actor: "admin", Via: "panel", Action: "POST /owners/{id}/give", Kind: "endpoint", Subject: id(refunds), Fields: "endpoint_id"},
		{Actor: "admin", Via: "panel", Action: "POST /owners/{id}/give", Kind: "endpoint", Subject: id(orders), Fields: "endpoint_id"},
	}
	if diff := cmp.Diff(want, linesOf(trail.Entries)); diff != "" {
		t.Errorf("the trail of the panel's gives, take-backs and links, newest first (-want +got):\n%s", diff)
	}
	// The owner's own trail shows the endpoint it was given.
	decodeAs(t, srv, payments.Token, "GET", "/api/audit", "", 200, &trail)
	if len(trail.Entries) == 0 || trail.Entries[0].Action != "POST /endpoints/{id}/owner" || trail.Entries[0].Subject != id(refunds) {
		t.Errorf("the owner's trail = %+v, want the give of its endpoint first", linesOf(trail.Entries))
	}
}

// In a browser: Delete asks, Cancel leaves the owner, Confirm deletes it;
// Rotate secret asks, and the secret changes only on Confirm, which
// shows the new one.
func TestDeleteOwnerAndRotateSecretAskFirstInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o := newOwner(t, srv, "Ops")
	ep := describedEndpoint(t, srv, o.ID, "Orders hook")
	owners := func() int { return queryInt(t, db, `SELECT count(*) FROM outbox.owners WHERE id = $1`, o.ID) }
	secret := secretOfEndpoint(t, db, ep.ID)
	br := adminBrowser(t, srv)

	br.open(srv.URL + "/endpoints/" + fmt.Sprint(ep.ID))
	br.click(fmt.Sprintf(`form[action="/endpoints/%d/rotate-secret"] button`, ep.ID))
	if got := br.text("#question"); got != "Rotate the signing secret of Orders hook?" || secretOfEndpoint(t, db, ep.ID) != secret {
		t.Errorf("Rotate secret asks %q; the secret changed %t", got, secretOfEndpoint(t, db, ep.ID) != secret)
	}
	br.screenshot(artifactDir + "/confirm-rotate-secret.png")
	br.click("#confirm")
	if got := br.text("#secret"); !strings.HasPrefix(got, "whsec_") || secretOfEndpoint(t, db, ep.ID) == secret {
		t.Errorf("the confirmed rotation shows %q; the secret changed %t", got, secretOfEndpoint(t, db, ep.ID) != secret)
	}

	row := fmt.Sprintf("#owner-%d", o.ID)
	br.open(srv.URL + "/owners")
	br.click(row + " form.danger button")
	if got := br.text("#question"); got != "Delete the owner Ops?" || owners() != 1 {
		t.Errorf("Delete asks %q; %d owners left", got, owners())
	}
	br.click("#cancel")
	br.find(row)
	if owners() != 1 {
		t.Error("Cancel deleted the owner")
	}
	br.click(row + " form.danger button")
	br.click("#confirm")
	if got := br.text(".flash"); !strings.Contains(got, "deleted") || owners() != 0 {
		t.Errorf("the confirmed delete says %q; %d owners left", got, owners())
	}
	if got := ownerOf(t, db, ep.ID); got != 0 {
		t.Errorf("the deleted owner's endpoint has owner %d, want none", got)
	}
}

// Owners and endpoints read as names, not ids, wherever the panel shows
// them: an endpoint's owner, the audit trail's actors and what each entry
// changed (an owner seeing only its own endpoints' names), the trail's
// endpoint filter, and the portal's page of what an endpoint was sent.
func TestOwnersAndEndpointsReadAsNamesInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	o, gone := newOwner(t, srv, "Payments team"), newOwner(t, srv, "Gone team")
	hook := describedEndpoint(t, srv, o.ID, "Payments hook")
	takenBack := describedEndpoint(t, srv, o.ID, "Taken back hook")
	decodeAs(t, srv, o.Token, "POST", fmt.Sprintf("/api/endpoints/%d/pause", hook.ID), "", 200, nil)
	decodeAs(t, srv, o.Token, "PATCH", fmt.Sprintf("/api/endpoints/%d", takenBack.ID), `{"description": "Renamed by the admin later"}`, 200, nil)
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/endpoints/%d", takenBack.ID), `{"owner_id": null, "description": "The admin's secret name"}`, 200, nil)
	decodeAs(t, srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", gone.ID), `{"max_in_flight": 4}`, 200, nil)
	decodeAs(t, srv, testToken, "DELETE", fmt.Sprintf("/api/owners/%d", gone.ID), "", 204, nil)
	sent := recordAddressed(t, db, o.Key, "order.paid", "o-1")
	relayAll(t, db)

	br := adminBrowser(t, srv)
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, hook.ID))
	if got := br.text("#owner-name"); got != "Payments team" {
		t.Errorf("the endpoint page names its owner %q", got)
	}
	br.open(srv.URL + "/audit")
	var who, of []string
	br.execute(`return [...document.querySelectorAll('#audit .audit-who')].map(td => td.textContent)`, &who)
	br.execute(`return [...document.querySelectorAll('#audit .audit-of')].map(td => td.textContent)`, &of)
	wantOf := []string{
		fmt.Sprintf("owner %d deleted", gone.ID), fmt.Sprintf("owner %d deleted", gone.ID),
		"endpoint The admin's secret name", "endpoint The admin's secret name", "endpoint Payments hook",
		"endpoint The admin's secret name", "endpoint Payments hook", fmt.Sprintf("owner %d deleted", gone.ID), "owner Payments team"}
	if diff := cmp.Diff(wantOf, of); diff != "" {
		t.Errorf("the admin's trail names what each entry changed (-want +got):\n%s", diff)
	}
	if len(who) < 5 || who[3] != "Payments team" || who[4] != "Payments team" || who[0] != "admin" {
		t.Errorf("the admin's trail names who changed it %q, want the owner's name on its changes", who)
	}
	br.open(fmt.Sprintf("%s/audit?endpoint_id=%d", srv.URL, hook.ID))
	if got := br.text("#audit-endpoint"); got != "Payments hook" {
		t.Errorf("the trail filtered to an endpoint names it %q", got)
	}
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, hook.ID))
	br.click("#make-signin-link")
	br.find("#signin-link")
	if got := br.text("main p"); regexp.MustCompile(`(owner|endpoint) \d`).MatchString(got) || !strings.Contains(got, "Payments hook") {
		t.Errorf("the sign-in link's page reads %q, want the owner and its endpoint by name", got)
	}
	br.click("form.logout button")

	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", o.Token)
	br.click("form.login button")
	br.find("#portal-owner")
	br.open(srv.URL + "/audit")
	br.execute(`return [...document.querySelectorAll('#audit .audit-of')].map(td => td.textContent)`, &of)
	wantOf = []string{"endpoint Payments hook", // the admin's sign-in link
		fmt.Sprintf("endpoint %d no longer yours", takenBack.ID), "endpoint Payments hook", "endpoint Payments hook"}
	if diff := cmp.Diff(wantOf, of); diff != "" {
		t.Errorf("the owner's trail names its own endpoints only (-want +got):\n%s", diff)
	}
	br.open(fmt.Sprintf("%s/endpoints/%d/events/%d", srv.URL, hook.ID, sent))
	if got := br.text("h1"); got != fmt.Sprintf("Event %d to Payments hook", sent) {
		t.Errorf("the portal's event page reads %q, want the endpoint by its name", got)
	}
}
