// owners_page_test.go: the panel's forms that give an owner endpoints,
// take them back and make its sign-in links, and the buttons that ask
// before they delete an owner or rotate a secret, over HTTP: what they
// refuse and what they leave undone (browser_owners_test.go clicks
// them).

package main

import (
	"database/sql"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The forms are the admin's, refused across sites as every panel form
// is (the confirmations of a delete and a rotation too), and refused
// when the page they were on is stale: another owner's
// endpoint is not given from an owner's row, nor taken back from a row
// not its owner's. Nothing refused changes a row or makes an entry.
func TestOwnerFormsRefuseCrossSiteAndStalePages(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	admin := signIn(t, srv)
	alpha, bravo := newOwner(t, srv, "Alpha"), newOwner(t, srv, "Bravo")
	adminsOwn, bravos := endpointAs(t, srv, testToken, 0), endpointAs(t, srv, testToken, bravo.ID)
	entries := func() int { return queryInt(t, db, `SELECT count(*) FROM outbox.audit_log`) }
	before, secret := entries(), secretOfEndpoint(t, db, bravos.ID)
	unchanged := func(when string) {
		t.Helper()
		if n := queryInt(t, db, `SELECT count(*) FROM outbox.owners`); n != 2 || secretOfEndpoint(t, db, bravos.ID) != secret {
			t.Errorf("%s: %d owners, the secret changed %t; want both owners and the secret", when, n, secretOfEndpoint(t, db, bravos.ID) != secret)
		}
		if got, want := []int64{ownerOf(t, db, adminsOwn.ID), ownerOf(t, db, bravos.ID)}, []int64{0, bravo.ID}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: the endpoints' owners = %v, want %v", when, got, want)
		}
		if n := queryInt(t, db, `SELECT count(*) FROM outbox.owner_signin_links`); n != 0 {
			t.Errorf("%s: %d sign-in links made", when, n)
		}
		if n := entries(); n != before {
			t.Errorf("%s: %d audit entries, want %d", when, n, before)
		}
	}

	forms := []struct {
		path string
		form url.Values
	}{
		{fmt.Sprintf("/owners/%d/give", alpha.ID), url.Values{"endpoint_id": {fmt.Sprint(adminsOwn.ID)}}},
		{fmt.Sprintf("/owners/%d/take-back", bravo.ID), url.Values{"endpoint_id": {fmt.Sprint(bravos.ID)}}},
		{fmt.Sprintf("/owners/%d/signin-link", alpha.ID), url.Values{}},
		{fmt.Sprintf("/endpoints/%d/owner", adminsOwn.ID), url.Values{"owner_id": {fmt.Sprint(alpha.ID)}}},
		{fmt.Sprintf("/endpoints/%d/owner", bravos.ID), url.Values{"owner_id": {""}}},
		{fmt.Sprintf("/owners/%d/delete", alpha.ID), url.Values{"confirm": {"yes"}}},
		{fmt.Sprintf("/endpoints/%d/rotate-secret", bravos.ID), url.Values{"confirm": {"yes"}}},
	}
	for _, f := range forms {
		req, err := http.NewRequest("POST", srv.URL+f.path, strings.NewReader(f.form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		if status, _ := send(t, admin, req); status != http.StatusForbidden {
			t.Errorf("a cross-site POST %s = %d, want 403", f.path, status)
		}
	}
	unchanged("after the cross-site posts")

	for _, bad := range []struct {
		path   string
		form   url.Values
		saying string
	}{
		{fmt.Sprintf("/owners/%d/give", alpha.ID), url.Values{"endpoint_id": {fmt.Sprint(bravos.ID)}}, "another owner"},
		{fmt.Sprintf("/owners/%d/take-back", alpha.ID), url.Values{"endpoint_id": {fmt.Sprint(adminsOwn.ID)}}, "is not this owner"},
		{fmt.Sprintf("/owners/%d/take-back", alpha.ID), url.Values{"endpoint_id": {fmt.Sprint(bravos.ID)}}, "is not this owner"},
		{fmt.Sprintf("/owners/%d/give", alpha.ID), url.Values{"endpoint_id": {"x"}}, "endpoint_id"},
		{fmt.Sprintf("/owners/%d/give", alpha.ID), url.Values{}, "endpoint_id is required"},
		{fmt.Sprintf("/endpoints/%d/owner", adminsOwn.ID), url.Values{"owner_id": {"999999"}}, "no such owner"},
	} {
		if status, page := browse(t, admin, srv, "POST", bad.path, bad.form); status != 400 || !strings.Contains(page, bad.saying) {
			t.Errorf("POST %s %v = %d, want 400 saying %q:\n%s", bad.path, bad.form, status, bad.saying, page)
		}
	}
	unchanged("after the refused forms")
}

// secretOfEndpoint is endpoint id's secret as stored.
func secretOfEndpoint(t *testing.T, db *sql.DB, id int64) string {
	t.Helper()
	secret, _ := storedSecrets(t, db, endpointSecretsQuery, id)
	return string(secret)
}

// Deleting an owner and rotating an endpoint's secret ask first: the
// button's POST answers a page that asks, changing nothing and making no
// entry in the trail, and only its Confirm (confirm=yes) does the change.
// An owner rotating its own endpoint's secret is asked too.
func TestDeletingAnOwnerAndRotatingASecretAskFirst(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	admin := signIn(t, srv)
	o := newOwner(t, srv, "Ops")
	ep := describedEndpoint(t, srv, o.ID, "Orders hook")
	owner := signInAs(t, srv, o.Token)
	entries := func() int { return queryInt(t, db, `SELECT count(*) FROM outbox.audit_log`) }
	owners := func() int { return queryInt(t, db, `SELECT count(*) FROM outbox.owners WHERE id = $1`, o.ID) }
	secret, before := secretOfEndpoint(t, db, ep.ID), entries()

	deletePath, rotatePath := fmt.Sprintf("/owners/%d/delete", o.ID), fmt.Sprintf("/endpoints/%d/rotate-secret", ep.ID)
	for _, ask := range []struct {
		browser *http.Client
		path    string
		form    url.Values
		asks    string
	}{
		{admin, deletePath, url.Values{}, "Delete the owner Ops?"},
		{admin, deletePath, url.Values{"confirm": {"no"}}, "Delete the owner Ops?"},
		{admin, rotatePath, url.Values{}, "Rotate the signing secret of Orders hook?"},
		{owner, rotatePath, url.Values{}, "Rotate the signing secret of Orders hook?"},
	} {
		status, page := browse(t, ask.browser, srv, "POST", ask.path, ask.form)
		confirm := fmt.Sprintf(`<form method="post" action="%s" class="danger"><input type="hidden" name="confirm" value="yes">`, ask.path)
		if status != 200 || !strings.Contains(page, `<h1 id="question">`+ask.asks+`</h1>`) || !strings.Contains(page, confirm) || strings.Contains(page, `id="secret"`) {
			t.Errorf("POST %s %v = %d, want the question %q and its Confirm:\n%s", ask.path, ask.form, status, ask.asks, page)
		}
	}
	if owners() != 1 || secretOfEndpoint(t, db, ep.ID) != secret || entries() != before {
		t.Fatalf("after the unconfirmed posts: %d owners, secret changed %t, %d new entries; want the owner, the secret and the trail as they were",
			owners(), secretOfEndpoint(t, db, ep.ID) != secret, entries()-before)
	}

	status, page := browse(t, owner, srv, "POST", rotatePath, url.Values{"confirm": {"yes"}})
	if status != 200 || !strings.Contains(page, `id="secret">whsec_`) || secretOfEndpoint(t, db, ep.ID) == secret {
		t.Errorf("the confirmed rotation = %d, secret changed %t:\n%s", status, secretOfEndpoint(t, db, ep.ID) != secret, page)
	}
	if status, _ := browse(t, admin, srv, "POST", deletePath, url.Values{"confirm": {"yes"}}); status != http.StatusSeeOther || owners() != 0 {
		t.Errorf("the confirmed delete = %d, %d owners left; want 303 and none", status, owners())
	}
	var trail struct{ Entries []AuditEntry }
	decodeAs(t, srv, testToken, "GET", "/api/audit?limit=2", "", 200, &trail)
	want := []auditLine{
		{Actor: "admin", Via: "panel", Action: "POST /owners/{id}/delete", Kind: "owner", Subject: fmt.Sprint(o.ID), Fields: "confirm"},
		{Actor: "owner", OwnerID: o.ID, Via: "panel", Action: "POST /endpoints/{id}/rotate-secret", Kind: "endpoint", Subject: fmt.Sprint(ep.ID), Fields: "confirm"},
	}
	if diff := cmp.Diff(want, linesOf(trail.Entries)); diff != "" || entries() != before+2 {
		t.Errorf("the trail after the confirmed changes, %d new entries (-want +got):\n%s", entries()-before, diff)
	}
}
