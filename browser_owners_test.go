// browser_owners_test.go: the admin's Owners page in a browser: each
// owner's endpoints with their health.

package main

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
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
