// owners_page_test.go: the panel's forms that give an owner endpoints,
// take them back and make its sign-in links, over HTTP: what they refuse
// (browser_owners_test.go clicks them).

package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// The forms are the admin's, refused across sites as every panel form
// is, and refused when the page they were on is stale: another owner's
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
	before := entries()
	unchanged := func(when string) {
		t.Helper()
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
