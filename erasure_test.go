// erasure_test.go: an erasure by subject erases what outboxd kept of the
// subject's payloads, whatever state its events are in, keeps the rest,
// and nothing sends an erased event afterwards.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// erasedSubject and its payload's personal data, which nothing may keep
// or send once erased.
const (
	erasedSubject = "user-7"
	erasedEmail   = "ada@example.com"
)

// erasureScene is a subject's events in every state an erasure meets,
// beside another subject's event.
type erasureScene struct {
	db                  *sql.DB
	api                 *testAPI
	rc                  *receiver
	workers             *workerPool
	endpointID          int64
	delivered, queued   int64 // fanned out: delivered after a failed attempt, waiting
	unfanned, poisoned  int64
	inboxEvent, other   int64
	queuedJob, doneJob  int64
	sentOfSubject       atomic.Int64 // requests whose body names the erased subject
	inboxURL, webhookID string
	inboxSecret         []byte
	inboxBody           []byte
}

// newErasureScene builds it: a receiver that answers the erased subject's
// first request 500, echoing the body, and every other 200.
func newErasureScene(t *testing.T) *erasureScene {
	t.Helper()
	db, _ := newTestDB(t)
	s := &erasureScene{db: db, api: newTestAPI(t, db, testPolicy)}
	s.rc = newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		body := s.rc.requests()[n-1].Body
		if strings.Contains(string(body), erasedSubject) && s.sentOfSubject.Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			w.Write(body) // a receiver that echoes what it got
		}
	})
	s.endpointID = s.api.createEndpoint(s.rc.srv.URL + "/hook").ID
	s.workers = chainWorkers(t, db, defaultConfig().Workers)

	s.delivered = recordPayload(t, db, "user.updated", erasedSubject, `{"email": "`+erasedEmail+`"}`)
	s.other = recordPayload(t, db, "user.updated", "user-8", `{"email": "bob@example.com"}`)
	relayAll(t, db)
	s.work(t)
	s.doneJob = webhookJob(t, db, s.delivered, s.endpointID)
	mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE id = $1 AND state = 'retryable'`, s.doneJob)
	s.work(t)
	if st := readJob(t, db, s.doneJob).State; st != "completed" || s.sentOfSubject.Load() != 2 {
		t.Fatalf("the delivered event's job is %s after %d requests, want completed after 2", st, s.sentOfSubject.Load())
	}

	s.queued = recordPayload(t, db, "user.updated", erasedSubject, `{"email": "`+erasedEmail+`", "v": 2}`)
	relayAll(t, db)
	s.queuedJob = webhookJob(t, db, s.queued, s.endpointID)
	s.unfanned = recordPayload(t, db, "user.updated", erasedSubject, `{"email": "`+erasedEmail+`", "v": 3}`)
	s.poisoned = int64(queryInt(t, db, `INSERT INTO outbox.events (topic, subject, payload, relay_attempts, relay_error, poisoned_at)
		VALUES ('user.updated', $1, jsonb_build_object('email', $2::text), 5, 'boom', now()) RETURNING id`, erasedSubject, erasedEmail))

	s.inboxSecret = s.api.createSource("crm", "")
	s.inboxURL, s.webhookID = s.api.srv.URL+"/webhooks/crm", "wh-1"
	s.inboxBody = []byte(`{"id":"wh-1","type":"user.signed_up","subject":"` + erasedSubject +
		`","timestamp":"2026-01-02T03:04:05Z","data":{"email":"` + erasedEmail + `"}}`)
	if status := postWebhook(t, s.inboxURL, s.inboxSecret, s.webhookID, time.Now(), s.inboxBody, nil); status != http.StatusOK {
		t.Fatalf("inbox webhook: %d", status)
	}
	s.inboxEvent = int64(queryInt(t, db, `SELECT event_id FROM outbox.inbox WHERE webhook_id = $1`, s.webhookID))
	return s
}

// work runs one turn of the workers.
func (s *erasureScene) work(t *testing.T) {
	t.Helper()
	if _, err := s.workers.workOnce(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
}

// erase asks for the erasure of subject and returns how many events it
// answered.
func (s *erasureScene) erase(t *testing.T, subject string) int64 {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"subject": subject})
	status, resp := s.api.do("POST", "/api/erasures", string(body))
	var res erasureResult
	if status != http.StatusOK || json.Unmarshal(resp, &res) != nil {
		t.Fatalf("erase %q: %d %s", subject, status, resp)
	}
	return res.Events
}

// Everything outboxd kept of the subject's payloads goes, in every state
// its events were in; ids, topics, subjects, times and outcomes stay; the
// deliveries not yet made end discarded and are never sent; and the
// other subject's event is as it was.
func TestErasureErasesASubjectInEveryState(t *testing.T) {
	t.Parallel()
	s := newErasureScene(t)
	db := s.db
	if n := s.erase(t, erasedSubject); n != 5 {
		t.Errorf("erasure answered %d events, want 5 (delivered, queued, not fanned out, poisoned, from the inbox)", n)
	}

	var ev eventWithJobs
	status, resp := s.api.do("GET", fmt.Sprintf("/api/events/%d", s.delivered), "")
	if err := json.Unmarshal(resp, &ev); status != http.StatusOK || err != nil {
		t.Fatalf("GET the erased event: %d %s", status, resp)
	}
	var raw map[string]json.RawMessage
	json.Unmarshal(resp, &raw)
	if string(raw["payload"]) != "null" || ev.ErasedAt == nil || ev.Topic != "user.updated" || ev.Subject != erasedSubject {
		t.Errorf("GET the erased event: payload %s, erased_at %v, topic %q, subject %q; want null, a time, and the topic and subject kept",
			raw["payload"], ev.ErasedAt, ev.Topic, ev.Subject)
	}

	want := []string{
		fmt.Sprintf("%d erased fanned", s.delivered), fmt.Sprintf("%d kept fanned", s.other),
		fmt.Sprintf("%d erased fanned", s.queued), fmt.Sprintf("%d erased fanned", s.unfanned),
		fmt.Sprintf("%d erased fanned", s.poisoned), fmt.Sprintf("%d erased fanned", s.inboxEvent),
	}
	got := queryStrings(t, db, `SELECT id || CASE WHEN payload IS NULL AND erased_at IS NOT NULL THEN ' erased' ELSE ' kept' END
		|| CASE WHEN fanned_out_at IS NOT NULL AND poisoned_at IS NULL THEN ' fanned' ELSE ' waiting' END
		FROM outbox.events ORDER BY id`)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events after the erasure (-want +got):\n%s", diff)
	}
	s.checkJobs(t, "after the erasure")
	s.checkNothingKeepsThePayload(t)

	// Keep: the inbox's dedup record, whose resend by the sender stays a
	// duplicate and brings nothing back; the other subject's index row.
	if status := postWebhook(t, s.inboxURL, s.inboxSecret, s.webhookID, time.Now(), s.inboxBody, nil); status != http.StatusOK {
		t.Errorf("the sender's resend after the erasure: %d, want 200", status)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.inbox WHERE webhook_id = $1 AND event_id = $2`, s.webhookID, s.inboxEvent); n != 1 {
		t.Errorf("inbox records of the webhook after the erasure: %d, want the one, kept", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE payload::text LIKE '%' || $1 || '%'`, erasedEmail); n != 0 {
		t.Errorf("%d events hold the erased payload after the sender's resend, want 0", n)
	}
	if p := queryStrings(t, db, `SELECT payload::text FROM outbox.subjects WHERE subject = 'user-8'`); len(p) != 1 || !strings.Contains(p[0], "bob@") {
		t.Errorf("the other subject's index row: %q, want its payload kept", p)
	}

	s.checkNeverSent(t)
	s.checkJobs(t, "after the retries, the replay and the passes")
	if n := s.erase(t, erasedSubject); n != 0 {
		t.Errorf("the second erasure answered %d events, want 0", n)
	}
	s.checkAudit(t)
}

// checkJobs compares the jobs with what the erasure leaves: the events
// that were not fanned out have none, the queued one is discarded, and
// the delivered ones stay completed.
func (s *erasureScene) checkJobs(t *testing.T, when string) {
	t.Helper()
	want := []string{
		fmt.Sprintf("%d completed", s.delivered), fmt.Sprintf("%d completed", s.other),
		fmt.Sprintf("%d discarded %s", s.queued, errEventErased),
	}
	got := queryStrings(t, s.db, `SELECT event_id || ' ' || state
		|| CASE WHEN state = 'discarded' THEN ' ' || (errors -> -1 ->> 'error') ELSE '' END
		FROM outbox.jobs
		UNION ALL
		SELECT DISTINCT event_id || ' completed' FROM outbox.deliveries WHERE outcome = 'completed'
		ORDER BY 1`)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("jobs %s (-want +got):\n%s", when, diff)
	}
}

// checkNothingKeepsThePayload looks for the erased data in every table
// that kept something of it: the events, the attempts, the subject index.
func (s *erasureScene) checkNothingKeepsThePayload(t *testing.T) {
	t.Helper()
	for _, q := range []string{
		`SELECT count(*) FROM outbox.events AS e WHERE e::text LIKE '%' || $1 || '%'`,
		`SELECT count(*) FROM outbox.jobs AS j WHERE j::text LIKE '%' || $1 || '%'`,
		`SELECT count(*) FROM outbox.deliveries AS d WHERE d::text LIKE '%' || $1 || '%'`,
		`SELECT count(*) FROM outbox.subjects AS s WHERE s::text LIKE '%' || $1 || '%'`,
	} {
		if n := queryInt(t, s.db, q, erasedEmail); n != 0 {
			t.Errorf("%s: %d rows still hold the erased payload", q, n)
		}
	}
	if n := queryInt(t, s.db, `SELECT count(*) FROM outbox.deliveries AS d
		WHERE d.event_id = $1 AND d.status_code = 500 AND d.response_excerpt = '' AND d.error = '(erased)'`, s.delivered); n != 1 {
		t.Errorf("the delivered event's failed attempt: %d rows with its status kept and its texts erased, want 1", n)
	}
	if n := queryInt(t, s.db, `SELECT count(*) FROM outbox.subjects WHERE subject = $1 AND payload IS NULL`, erasedSubject); n != 1 {
		t.Errorf("the subject's index rows without payload: %d, want 1", n)
	}
}

// checkNeverSent has the relay and the workers run, and an operator retry
// and replay the subject's deliveries: nothing of the subject is sent.
func (s *erasureScene) checkNeverSent(t *testing.T) {
	t.Helper()
	before := s.sentOfSubject.Load()
	var e struct{ Error string }
	if code := apiCall(t, s.api.srv, "POST", fmt.Sprintf("/api/jobs/%d/retry", s.queuedJob), "", &e); code != http.StatusBadRequest ||
		!strings.Contains(e.Error, "erased") {
		t.Errorf("retry of the erased event's job: %d %q, want 400 saying it was erased", code, e.Error)
	}
	var res RetryResult
	if code := apiCall(t, s.api.srv, "POST", fmt.Sprintf("/api/endpoints/%d/retry-discarded", s.endpointID), "", &res); code != http.StatusOK || res.Jobs != 0 {
		t.Errorf("retry-discarded: %d, %d jobs; want 200 and none", code, res.Jobs)
	}
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if status, resp := s.api.do("POST", fmt.Sprintf("/api/endpoints/%d/replay", s.endpointID), `{"since": "`+since+`"}`); status != http.StatusOK {
		t.Errorf("replay: %d %s", status, resp)
	}
	if status, _ := s.api.do("POST", fmt.Sprintf("/api/events/%d/requeue", s.poisoned), ""); status != http.StatusNotFound {
		t.Errorf("requeue of the erased poisoned event: %d, want 404 (fanned out)", status)
	}
	relayAll(t, s.db)
	for range 5 {
		s.work(t)
	}
	if n := queryInt(t, s.db, `SELECT count(*) FROM outbox.jobs AS j JOIN outbox.events AS e ON e.id = j.event_id
		WHERE e.erased_at IS NOT NULL AND j.state NOT IN ('completed', 'discarded')`); n != 0 {
		t.Errorf("%d jobs of erased events wait or run after the retries and the replay, want none", n)
	}
	if sent := s.sentOfSubject.Load() - before; sent != 0 {
		t.Errorf("the receiver got %d requests of the erased subject after the erasure, want none", sent)
	}
}

// checkAudit reads the trail: an entry per call, the subject by its
// digest, the events counted, and nothing of the subject or its payload.
func (s *erasureScene) checkAudit(t *testing.T) {
	t.Helper()
	var page struct{ Entries []AuditEntry }
	if code := apiCall(t, s.api.srv, "GET", "/api/audit", "", &page); code != http.StatusOK {
		t.Fatalf("GET /api/audit: %d", code)
	}
	var got []string
	for _, e := range page.Entries {
		if e.SubjectKind == "erasure" {
			got = append(got, fmt.Sprintf("%s %s %s %s %d %v", e.Actor, e.Via, e.Action, e.Subject, *e.Events, e.Fields))
		}
	}
	digest := subjectDigest(erasedSubject)
	want := []string{
		"admin api POST /api/erasures " + digest + " 0 [subject]",
		"admin api POST /api/erasures " + digest + " 5 [subject]",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the erasures' audit entries (-want +got):\n%s", diff)
	}
	for _, text := range []string{erasedSubject, erasedEmail} {
		if n := queryInt(t, s.db, `SELECT count(*) FROM outbox.audit_log AS a WHERE a::text LIKE '%' || $1 || '%'`, text); n != 0 {
			t.Errorf("%d audit entries hold %q, want none", n, text)
		}
	}
}

// An erasure asks for a subject, as text, and nothing else; an owner's
// token may not erase.
func TestErasureRefusesBadInputAndOwners(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	for _, tc := range []struct{ body, field string }{
		{`{}`, `subject`},
		{`{"subject": ""}`, `subject`},
		{`{"subject": 7}`, `subject`},
		{`{"subject": null}`, `subject`},
		{`{"subject": "a\u0000b"}`, `subject`},
		{`{"subject": "` + strings.Repeat("x", 501) + `"}`, `subject`},
		{`{"subject": "a", "payload": {}}`, `payload`},
		{`[]`, ``},
	} {
		status, resp := api.do("POST", "/api/erasures", tc.body)
		if status != http.StatusBadRequest || !strings.Contains(string(resp), tc.field) {
			t.Errorf("POST /api/erasures %.40s: %d %s, want 400 naming %s", tc.body, status, resp, tc.field)
		}
	}
	owner := newOwner(t, api.srv, "acme")
	req, _ := http.NewRequest("POST", api.srv.URL+"/api/erasures", strings.NewReader(`{"subject": "user-7"}`))
	req.Header.Set("Authorization", "Bearer "+owner.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("an owner's erasure: %d, want 403", resp.StatusCode)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.audit_log WHERE subject_kind = 'erasure'`); n != 0 {
		t.Errorf("%d erasure entries after refusals only, want none", n)
	}
}

// A delivery of an erased event that reaches a worker, put back in a race
// with the erasure, ends discarded without a request: a body without its
// payload is never sent.
func TestDeliveryOfAnErasedEventSendsNothing(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL + "/hook")
	eventID := recordPayload(t, db, "user.updated", erasedSubject, `{"email": "`+erasedEmail+`"}`)
	relayAll(t, db)
	job := webhookJob(t, db, eventID, ep.ID)
	mustExec(t, db, `SELECT outbox.erase_subject($1, 'erased')`, erasedSubject)
	// As a retry that raced the erasure would leave it.
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'available', finalized_at = NULL WHERE id = $1`, job)
	if _, err := chainWorkers(t, db, defaultConfig().Workers).workOnce(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	if n := len(rc.requests()); n != 0 {
		t.Errorf("the receiver got %d requests, want none", n)
	}
	if got := queryStrings(t, db, `SELECT state || ' ' || (errors -> -1 ->> 'error') FROM outbox.jobs WHERE id = $1`, job); len(got) != 1 || got[0] != "discarded "+errEventErased.Error() {
		t.Errorf("the job: %q, want discarded with %q", got, errEventErased)
	}
}
