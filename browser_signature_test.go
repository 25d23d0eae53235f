// browser_signature_test.go: the signature scheme chosen in the panel's
// forms: the admin creates a v1a endpoint, its owner switches one in its
// portal, and while a replica of an older release runs both are refused
// with the API's 409, shown as the page's message.

package main

import (
	"fmt"
	"strings"
	"testing"
)

func TestSignatureSchemeChosenInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := serveAdmin(t, testAdmin(t, db, testPolicy, testLogger(t), nil))
	o := newOwner(t, srv, "Ledger team")
	choose := func(br *webDriver, form, scheme string) {
		t.Helper()
		br.execute(fmt.Sprintf(`document.querySelector('%s select[name=signature]').value = %q; return true`, form, scheme), new(bool))
	}
	olderReplica := func(running bool) {
		if running {
			mustExec(t, db, `INSERT INTO outbox.replicas (host, pid, version, workers, listens, dead_after, last_seen)
				VALUES ('old', 1, '0.7.0', 4, true, make_interval(secs => 600), now())`)
		} else {
			mustExec(t, db, `DELETE FROM outbox.replicas WHERE host = 'old'`)
		}
	}
	const refused = "signature: 1 replica(s) of a release before 0.8.0 still run and cannot sign v1a; finish the upgrade first"

	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("form.logout")
	create := `form[action="/endpoints"]`
	olderReplica(true)
	br.open(srv.URL + "/endpoints")
	br.typeInto(create+" input[name=url]", "http://127.0.0.1:9/refused")
	choose(br, create, "v1a")
	br.click(create + " button")
	if got := br.text("p.flash"); got != refused {
		t.Errorf("creating v1a beside a 0.7.0 replica flashes %q, want %q", got, refused)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints after the refused create, want none", n)
	}
	olderReplica(false)
	br.click(create + " button") // the form as typed, v1a still chosen
	if got := br.text("#public-key"); !strings.HasPrefix(got, "whpk_") {
		t.Errorf("the new endpoint's page shows public key %q, want whpk_...", got)
	}
	var list struct{ Endpoints []Endpoint }
	decodeAs(t, srv, testToken, "GET", "/api/endpoints", "", 200, &list)
	if len(list.Endpoints) != 1 || list.Endpoints[0].Signature != "v1a" || list.Endpoints[0].PublicKey == nil ||
		*list.Endpoints[0].PublicKey != br.text("#public-key") {
		t.Fatalf("the endpoint created in the panel: %+v", list.Endpoints)
	}
	br.click("form.logout button")
	br.find("form.login")

	// The owner switches its v1 endpoint to v1a in its portal.
	var ep endpointWithSecret
	decodeAs(t, srv, testToken, "POST", "/api/endpoints",
		fmt.Sprintf(`{"url": "http://127.0.0.1:9/ledger", "owner_id": %d}`, o.ID), 201, &ep)
	br.typeInto("input[name=token]", o.Token)
	br.click("form.login button")
	br.find("#portal-owner")
	edit := fmt.Sprintf(`form[action="/endpoints/%d/edit"]`, ep.ID)
	olderReplica(true)
	br.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, ep.ID))
	choose(br, edit, "v1a")
	br.click(edit + " button")
	if got := br.text("p.flash"); got != refused {
		t.Errorf("switching to v1a beside a 0.7.0 replica flashes %q, want %q", got, refused)
	}
	var got Endpoint
	if decodeAs(t, srv, testToken, "GET", fmt.Sprintf("/api/endpoints/%d", ep.ID), "", 200, &got); got.Signature != "v1" {
		t.Errorf("after the refused switch the endpoint signs %s, want v1", got.Signature)
	}
	olderReplica(false)
	br.click(edit + " button") // the form as typed, v1a still chosen
	key := br.text("#public-key")
	if !strings.HasPrefix(key, "whpk_") {
		t.Errorf("after the switch the owner's page shows public key %q, want whpk_...", key)
	}
	decodeAs(t, srv, testToken, "GET", fmt.Sprintf("/api/endpoints/%d", ep.ID), "", 200, &got)
	if got.Signature != "v1a" || got.PublicKey == nil || *got.PublicKey != key || got.PreviousSignature == nil || *got.PreviousSignature != "v1" {
		t.Errorf("after the owner's switch the endpoint signs %s with %v, previous %v; want v1a with the key shown, v1 beside it",
			got.Signature, got.PublicKey, got.PreviousSignature)
	}
}
