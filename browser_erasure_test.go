// browser_erasure_test.go: the Subjects page's erase form in headless
// Chromium.

package main

import (
	"fmt"
	"strings"
	"testing"
)

// In a browser: the Subjects page's form asks first, Cancel erases
// nothing, Confirm erases and says how many events; the subject's row
// then reads "erased", the event's page says when, and the audit trail
// has the erasure by digest.
func TestEraseASubjectInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := recordPayload(t, db, "user.updated", erasedSubject, `{"email": "`+erasedEmail+`"}`)
	relayAll(t, db)
	erased := func() int { return queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE erased_at IS NOT NULL`) }
	br := adminBrowser(t, srv)

	br.open(srv.URL + "/subjects")
	br.typeInto(`#erase input[name="subject"]`, erasedSubject)
	br.click("#erase button")
	if got := br.text("#question"); got != fmt.Sprintf("Erase the payloads of subject %q?", erasedSubject) || erased() != 0 {
		t.Errorf("Erase asks %q; %d events erased", got, erased())
	}
	br.click("#cancel")
	br.find("#erase")
	if erased() != 0 {
		t.Error("Cancel erased the subject")
	}
	br.typeInto(`#erase input[name="subject"]`, erasedSubject)
	br.click("#erase button")
	br.click("#confirm")
	if got := br.text(".flash"); got != "Erased the payloads of 1 events." || erased() != 1 {
		t.Errorf("the confirmed erasure says %q; %d events erased", got, erased())
	}
	if got := br.text("table"); !strings.Contains(got, erasedSubject) || !strings.Contains(got, "erased") || strings.Contains(got, erasedEmail) {
		t.Errorf("the Subjects page after the erasure reads %q, want the subject's payload erased", got)
	}
	br.open(fmt.Sprintf("%s/events/%d", srv.URL, id))
	if got := br.text("#erased"); !strings.HasPrefix(got, "Erased at ") || br.count("#payload") != 0 {
		t.Errorf("the event's page says %q with %d payloads shown, want when it was erased and no payload", got, br.count("#payload"))
	}
	br.open(srv.URL + "/audit")
	if got := br.text("#audit"); !strings.Contains(got, subjectDigest(erasedSubject)) || !strings.Contains(got, "1 events erased") ||
		strings.Contains(got, erasedSubject) {
		t.Errorf("the audit trail reads %q, want the erasure by digest with its count, and not the subject", got)
	}
}
