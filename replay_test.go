// replay_test.go: resends an operator starts (a replay, a retry by hand)
// stay inside what a receiver's dedup window covers.

package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A retry by hand resends a discarded delivery only for an event within
// events retention (7 days here): a discarded job keeps its event for
// -discarded-jobs-retention after the discard, and a resend of it could
// outlive a receiver's dedup record. A minute inside the window is
// retried, a minute outside stays discarded, and the answer says so.
func TestRetriesByHandStayWithinEventsRetention(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	id := createTestEndpoint(t, srv, "http://127.0.0.1:1/hook")
	mustExec(t, db, `INSERT INTO outbox.events (topic, subject, created_at, fanned_out_at) VALUES
		('t', 'inside', now() - interval '7 days' + interval '1 minute', now() - interval '6 days'),
		('t', 'outside', now() - interval '7 days' - interval '1 minute', now() - interval '6 days')`)
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'webhook', id, $1, 18, 'discarded', 18, now(), now() FROM outbox.events ORDER BY id`, id)
	// A subscriber's job reaches no receiver: it is not clamped.
	mustExec(t, db, `INSERT INTO outbox.jobs (kind, event_id, max_attempts, state, attempt, attempted_at, finalized_at)
		SELECT 'sub:x', id, 18, 'discarded', 18, now(), now() FROM outbox.events WHERE subject = 'outside'`)
	jobOf := func(kind, subject string) int64 {
		return int64(queryInt(t, db, `SELECT j.id FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id WHERE j.kind = $1 AND e.subject = $2`, kind, subject))
	}
	states := func() []string {
		return queryStrings(t, db, `SELECT j.kind || ' ' || e.subject || ' ' || j.state FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id ORDER BY j.id`)
	}

	var e struct{ Error string }
	if code := apiCall(t, srv, "POST", fmt.Sprintf("/api/jobs/%d/retry", jobOf("webhook", "outside")), "", &e); code != http.StatusBadRequest ||
		!strings.Contains(e.Error, "stays discarded") || !strings.Contains(e.Error, "retention window (168h0m0s)") {
		t.Errorf("retry of the delivery outside the window: %d %q, want 400 saying why", code, e.Error)
	}
	if code := apiCall(t, srv, "POST", fmt.Sprintf("/api/jobs/%d/retry", jobOf("sub:x", "outside")), "", nil); code != http.StatusOK {
		t.Errorf("retry of the subscriber's job outside the window: %d, want 200", code)
	}
	var res RetryResult
	if code := apiCall(t, srv, "POST", fmt.Sprintf("/api/endpoints/%d/retry-discarded", id), "", &res); code != http.StatusOK {
		t.Fatalf("retry-discarded: %d", code)
	}
	if res.Jobs != 1 || res.Skipped != 1 || !strings.Contains(res.Message, "1 discarded deliveries stay discarded") {
		t.Errorf("retry-discarded answered %+v, want 1 job retried, 1 skipped, and a message", res)
	}
	want := []string{"webhook inside available", "webhook outside discarded", "sub:x outside available"}
	if diff := cmp.Diff(want, states()); diff != "" {
		t.Errorf("jobs after the retries (-want +got):\n%s", diff)
	}
}
