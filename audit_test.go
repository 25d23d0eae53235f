// audit_test.go: the audit trail (audit.go): who changed an endpoint, an
// owner or a source, through what, when; what an owner may read of it;
// and its retention.

package main

import (
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// auditLine is an entry as the tests compare it: who, via what, what, of
// what, with which fields.
type auditLine struct {
	Actor, Via, Action, Kind, Subject string
	OwnerID                           int64
	Fields                            string
}

func linesOf(entries []AuditEntry) []auditLine {
	lines := make([]auditLine, len(entries))
	for i, e := range entries {
		lines[i] = auditLine{Actor: e.Actor, Via: e.Via, Action: e.Action, Kind: e.SubjectKind, Subject: e.Subject,
			Fields: strings.Join(e.Fields, ",")}
		if e.OwnerID != nil {
			lines[i].OwnerID = *e.OwnerID
		}
		if e.SubjectKind == "endpoint" && (e.EndpointID == nil || fmt.Sprint(*e.EndpointID) != e.Subject) {
			lines[i].Subject += " (endpoint_id missing)"
		}
	}
	return lines
}

func TestAuditTrailRecordsWhoChangedWhat(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	mine, theirs := newOwner(t, srv, "mine"), newOwner(t, srv, "theirs")
	ep := endpointAs(t, srv, testToken, mine.ID)
	id := fmt.Sprint(ep.ID)
	decodeAs(t, srv, mine.Token, "POST", "/api/endpoints/"+id+"/pause", "", 200, nil)
	decodeAs(t, srv, mine.Token, "PATCH", "/api/endpoints/"+id, `{"description": "orders", "topics": ["order.*"]}`, 200, nil)
	decodeAs(t, srv, mine.Token, "GET", "/api/endpoints/"+id, "", 200, nil) // a read: no entry
	if status, _ := callAs(t, srv, mine.Token, "PATCH", "/api/endpoints/"+id, `{"url": "ftp://nope"}`); status != 400 {
		t.Fatalf("a refused PATCH = %d, want 400", status)
	}
	theirsEp := endpointAs(t, srv, theirs.Token, 0)
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	decodeAs(t, srv, testToken, "POST", "/api/sources", `{"name": "stripe", "secret": "`+secret+`"}`, 201, nil)
	decodeAs(t, srv, testToken, "POST", fmt.Sprintf("/api/owners/%d/rotate-token", theirs.ID), "", 200, nil)
	admin := signIn(t, srv)
	if status, _ := browse(t, admin, srv, "POST", "/endpoints/"+id+"/resume", url.Values{}); status != 303 {
		t.Fatalf("the panel's resume = %d, want 303", status)
	}

	var all struct {
		Entries []AuditEntry
	}
	decodeAs(t, srv, testToken, "GET", "/api/audit", "", 200, &all)
	want := []auditLine{
		{Actor: "admin", Via: "panel", Action: "POST /endpoints/{id}/resume", Kind: "endpoint", Subject: id},
		{Actor: "admin", Via: "api", Action: "POST /api/owners/{id}/rotate-token", Kind: "owner", Subject: fmt.Sprint(theirs.ID)},
		{Actor: "admin", Via: "api", Action: "POST /api/sources", Kind: "source", Subject: "stripe", Fields: "name,secret"},
		{Actor: "owner", OwnerID: theirs.ID, Via: "api", Action: "POST /api/endpoints", Kind: "endpoint", Subject: fmt.Sprint(theirsEp.ID), Fields: "url"},
		{Actor: "owner", OwnerID: mine.ID, Via: "api", Action: "PATCH /api/endpoints/{id}", Kind: "endpoint", Subject: id, Fields: "description,topics"},
		{Actor: "owner", OwnerID: mine.ID, Via: "api", Action: "POST /api/endpoints/{id}/pause", Kind: "endpoint", Subject: id},
		{Actor: "admin", Via: "api", Action: "POST /api/endpoints", Kind: "endpoint", Subject: id, Fields: "owner_id,url"},
		{Actor: "admin", Via: "api", Action: "POST /api/owners", Kind: "owner", Subject: fmt.Sprint(theirs.ID), Fields: "name"},
		{Actor: "admin", Via: "api", Action: "POST /api/owners", Kind: "owner", Subject: fmt.Sprint(mine.ID), Fields: "name"},
	}
	if diff := cmp.Diff(want, linesOf(all.Entries)); diff != "" {
		t.Errorf("the admin's trail, newest first (-want +got):\n%s", diff)
	}
	if len(all.Entries) > 0 && time.Since(all.Entries[0].At) > time.Minute {
		t.Errorf("the newest entry is at %s", all.Entries[0].At)
	}
	if name := all.Entries[5].OwnerName; name == nil || *name != "mine" {
		t.Errorf("an owner's entry names it %v, want mine", name)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.audit_log AS a WHERE strpos(row_to_json(a)::text, $1) > 0`, secret); n != 0 {
		t.Errorf("%d entries hold the source's secret", n)
	}

	// An owner reads its endpoint's entries, the admin's among them, and
	// nothing of the other owner's, or of sources and owners.
	var own struct{ Entries []AuditEntry }
	decodeAs(t, srv, mine.Token, "GET", "/api/audit", "", 200, &own)
	if diff := cmp.Diff([]auditLine{want[0], want[4], want[5], want[6]}, linesOf(own.Entries)); diff != "" {
		t.Errorf("the owner's trail (-want +got):\n%s", diff)
	}
	// A page, and the next.
	var page struct {
		Entries    []AuditEntry
		NextBefore int64 `json:"next_before"`
	}
	decodeAs(t, srv, testToken, "GET", "/api/audit?endpoint_id="+id+"&limit=2", "", 200, &page)
	if diff := cmp.Diff([]auditLine{want[0], want[4]}, linesOf(page.Entries)); diff != "" || page.NextBefore != page.Entries[1].ID {
		t.Errorf("endpoint %s's first page (-want +got):\n%s; next_before %d", id, diff, page.NextBefore)
	}
	decodeAs(t, srv, testToken, "GET", fmt.Sprintf("/api/audit?endpoint_id=%s&limit=2&before=%d", id, page.NextBefore), "", 200, &page)
	if diff := cmp.Diff([]auditLine{want[5], want[6]}, linesOf(page.Entries)); diff != "" {
		t.Errorf("endpoint %s's second page (-want +got):\n%s", id, diff)
	}
	for _, bad := range []string{"?limit=0", "?limit=501", "?before=x", "?endpoint_id=-1"} {
		if status, b := callAs(t, srv, testToken, "GET", "/api/audit"+bad, ""); status != 400 {
			t.Errorf("GET /api/audit%s = %d %s, want 400", bad, status, b)
		}
	}

	// The panel shows the same to each.
	_, html := browse(t, signInAs(t, srv, mine.Token), srv, "GET", "/audit", nil)
	if n := strings.Count(html, `class="audit-entry"`); n != 4 || !strings.Contains(html, "PATCH /api/endpoints/{id}") {
		t.Errorf("the owner's audit page shows %d entries, want 4:\n%s", n, html)
	}
	_, html = browse(t, admin, srv, "GET", "/audit", nil)
	if n := strings.Count(html, `class="audit-entry"`); n != len(want) {
		t.Errorf("the admin's audit page shows %d entries, want %d", n, len(want))
	}
}

// An entry that cannot be written is logged, naming what it would have
// held; the change it tells of stays done and answered.
func TestAuditEntryNotWrittenIsLogged(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv, logs := newLoggingTestServer(t, db)
	ep := endpointAs(t, srv, testToken, 0)
	mustExec(t, db, `CREATE FUNCTION outbox.refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'audit refused'; END$$`)
	mustExec(t, db, `CREATE TRIGGER refuse_audit BEFORE INSERT ON outbox.audit_log FOR EACH ROW EXECUTE FUNCTION outbox.refuse_audit()`)
	decodeAs(t, srv, testToken, "POST", fmt.Sprintf("/api/endpoints/%d/pause", ep.ID), "", 200, nil)
	// record runs before the answer is written: the log has it by now.
	if s := logs.String(); !strings.Contains(s, "audit entry not recorded") || !strings.Contains(s, "POST /api/endpoints/{id}/pause") {
		t.Errorf("the lost entry is not logged:\n%s", s)
	}
	var paused Endpoint
	decodeAs(t, srv, testToken, "GET", fmt.Sprintf("/api/endpoints/%d", ep.ID), "", 200, &paused)
	if paused.PausedAt == nil {
		t.Error("the endpoint is not paused")
	}
}

func TestAuditRetentionDeletesOldEntries(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	if got := defaultConfig().Retention.Audit; got != 90*24*time.Hour {
		t.Errorf("default audit retention = %s, want 90 days", got)
	}
	for _, age := range []string{"91 days", "100 days", "89 days", "1 minute"} {
		mustExec(t, db, `INSERT INTO outbox.audit_log (at, actor, via, action, subject_kind, subject)
			VALUES (now() - $1::interval, 'admin', 'api', 'DELETE /api/sources/{name}', 'source', 'old')`, age)
	}
	cfg := defaultConfig().Retention
	cfg.Audit = 0
	if res := sweepOnce(t, newTestSweeper(t, db, cfg)); res.Deleted["audit_log"] != 0 {
		t.Errorf("audit retention 0 deleted %d entries, want none", res.Deleted["audit_log"])
	}
	cfg.Audit = 90 * 24 * time.Hour
	cfg.BatchSize = 1 // the two old entries go in two batches
	res := sweepOnce(t, newTestSweeper(t, db, cfg))
	if res.Deleted["audit_log"] != 2 {
		t.Errorf("audit retention deleted %d entries, want the 2 older than 90 days", res.Deleted["audit_log"])
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.audit_log WHERE at > now() - interval '90 days'`); n != 2 {
		t.Errorf("%d recent entries left, want 2", n)
	}
}

// The settings of this file and owners.go: defaults, and a bad value
// refused naming the setting.
func TestOwnerSettingsRefuseBadValues(t *testing.T) {
	t.Parallel()
	if got := defaultConfig().SigninLinkLifetime; got != time.Hour {
		t.Errorf("default sign-in link lifetime = %s, want 1h", got)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OUTBOXD_SIGNIN_LINK_LIFETIME": "30s"}, "-signin-link-lifetime (OUTBOXD_SIGNIN_LINK_LIFETIME) must be between 1m0s and 168h0m0s, got 30s"},
		{map[string]string{"OUTBOXD_SIGNIN_LINK_LIFETIME": "200h"}, "-signin-link-lifetime (OUTBOXD_SIGNIN_LINK_LIFETIME)"},
		{map[string]string{"OUTBOXD_AUDIT_RETENTION": "-1h"}, "-audit-retention (OUTBOXD_AUDIT_RETENTION)"},
	} {
		_, err := parseConfig(nil, envFrom(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseConfig(%v) = %v, want an error containing %q", tc.env, err, tc.want)
		}
	}
	cfg, err := parseConfig([]string{"-signin-link-lifetime", "15m", "-audit-retention", "720h"}, envFrom(nil), io.Discard)
	if err != nil || cfg.SigninLinkLifetime != 15*time.Minute || cfg.Retention.Audit != 720*time.Hour {
		t.Errorf("parseConfig = %v, %v; want the settings given", cfg.SigninLinkLifetime, err)
	}
}
