// topics_test.go: the event catalog's API, and test sends delivered
// through the workers, signed and kept in the history, out of the
// statistics and of replays, and only to an owner's own endpoints.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// registerTopic registers a topic through the API with token.
func registerTopic(t *testing.T, api *testAPI, name, example string) Topic {
	t.Helper()
	status, b := api.do("POST", "/api/topics", fmt.Sprintf(`{"name": %q, "description": "about %s", "example": %s}`, name, name, example))
	var tp Topic
	if status != http.StatusCreated || json.Unmarshal(b, &tp) != nil {
		t.Fatalf("register topic %s: %d %s", name, status, b)
	}
	return tp
}

// errorText is the message of an error answer's {"error"}.
func errorText(b []byte) string {
	var e struct{ Error string }
	json.Unmarshal(b, &e)
	return e.Error
}

// The catalog's routes: register, list, read, change and delete a topic;
// bad input answers 400 naming the field, a name registered twice 409.
func TestTopicsAPIRegistersListsAndRefuses(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	paid := registerTopic(t, api, "order.paid", `{"order_id": 42,  "amount_cents": 1200}`)
	registerTopic(t, api, "customer/created", `"just a string"`)
	if got := string(paid.Example); got != `{"order_id":42,"amount_cents":1200}` {
		t.Errorf("the example answered reads %s", got)
	}

	var listed struct{ Topics []Topic }
	if status, b := api.do("GET", "/api/topics", ""); status != 200 || json.Unmarshal(b, &listed) != nil {
		t.Fatalf("list: %d %s", status, b)
	}
	var names []string
	for _, tp := range listed.Topics {
		names = append(names, tp.Name)
	}
	if diff := cmp.Diff([]string{"customer/created", "order.paid"}, names); diff != "" {
		t.Errorf("listed topics (-want +got):\n%s", diff)
	}

	status, b := api.do("PATCH", "/api/topics/order.paid", `{"description": "An order was paid.", "example": null}`)
	var changed Topic
	if status != 200 || json.Unmarshal(b, &changed) != nil {
		t.Fatalf("patch: %d %s", status, b)
	}
	want := Topic{Name: "order.paid", Description: "An order was paid.", Example: json.RawMessage("null")}
	if diff := cmp.Diff(want, changed, cmpopts.IgnoreFields(Topic{}, "CreatedAt", "UpdatedAt")); diff != "" {
		t.Errorf("the changed topic (-want +got):\n%s", diff)
	}
	if status, b := api.do("GET", "/api/topics/customer/created", ""); status != 200 || !strings.Contains(string(b), `"example":"just a string"`) {
		t.Errorf("get a topic with a slash in its name: %d %s", status, b)
	}

	for _, tc := range []struct{ method, path, body, want string }{
		{"POST", "/api/topics", `{"description": "x", "example": {}}`, `"name" is required`},
		{"POST", "/api/topics", `{"name": ".bad", "example": {}}`, `name ".bad" must be`},
		{"POST", "/api/topics", `{"name": "order.shipped"}`, `"example" is required`},
		{"POST", "/api/topics", `{"name": "order.shipped", "example": {}, "description": "` + strings.Repeat("d", 2001) + `"}`, "description is 2001 bytes"},
		{"POST", "/api/topics", `{"name": "order.shipped", "example": "` + strings.Repeat("e", 64<<10) + `"}`, "example is 65538 bytes"},
		{"POST", "/api/topics", `{"name": "order.shipped", "example": {}, "rule": "x"}`, `unknown field "rule"`},
		{"PATCH", "/api/topics/order.paid", `{"name": "order.renamed"}`, `unknown field "name"`},
	} {
		status, b := api.do(tc.method, tc.path, tc.body)
		if status != http.StatusBadRequest || !strings.Contains(errorText(b), tc.want) {
			t.Errorf("%s %s %.60s = %d %s, want 400 saying %s", tc.method, tc.path, tc.body, status, b, tc.want)
		}
	}
	if status, b := api.do("POST", "/api/topics", `{"name": "order.paid", "example": {}}`); status != http.StatusConflict || !strings.Contains(string(b), "name: topic") {
		t.Errorf("a name registered twice = %d %s, want 409 naming it", status, b)
	}
	if status, _ := api.do("DELETE", "/api/topics/order.paid", ""); status != http.StatusNoContent {
		t.Errorf("delete = %d, want 204", status)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if status, _ := api.do(m, "/api/topics/order.paid", ""); status != http.StatusNotFound {
			t.Errorf("%s of a deleted topic = %d, want 404", m, status)
		}
	}
}

// testSendScene is an endpoint whose receiver refuses the first request
// and takes the rest, a registered topic, and the workers.
type testSendScene struct {
	api     *testAPI
	rc      *receiver
	ep      endpointWithSecret
	workers *workerPool
}

func newTestSendScene(t *testing.T) (*testSendScene, *sql.DB) {
	t.Helper()
	db, _ := newTestDB(t)
	s := &testSendScene{api: newTestAPI(t, db, testPolicy)}
	s.rc = newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	s.ep = s.api.createEndpoint(s.rc.srv.URL+"/hook", "order.*")
	s.workers = chainWorkers(t, db, defaultConfig().Workers)
	registerTopic(t, s.api, "order.paid", `{"order_id": 42, "amount_cents": 1200}`)
	return s, db
}

// A test send goes through the workers as any delivery: a failed
// attempt is retried, each attempt is in the history, the request is
// signed with the endpoint's secret, its type the topic and its data the
// example. The statistics count none of it, and a replay of the window
// sends the endpoint's real event alone.
func TestTestSendIsDeliveredThroughThePipeline(t *testing.T) {
	t.Parallel()
	s, db := newTestSendScene(t)
	status, b := s.api.do("POST", fmt.Sprintf("/api/endpoints/%d/test", s.ep.ID), `{"topic": "order.paid"}`)
	var send TestSend
	if status != http.StatusAccepted || json.Unmarshal(b, &send) != nil {
		t.Fatalf("test send = %d %s, want 202", status, b)
	}
	ctx := context.Background()
	if _, err := s.workers.workOnce(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if st := readJob(t, db, send.JobID).State; st != "retryable" {
		t.Fatalf("after a 500 the test job is %s, want retryable", st)
	}
	mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE id = $1`, send.JobID)
	if _, err := s.workers.workOnce(ctx, 10); err != nil {
		t.Fatal(err)
	}
	reqs := s.rc.requests()
	if len(reqs) != 2 {
		t.Fatalf("the receiver got %d requests, want 2", len(reqs))
	}
	last := reqs[1]
	if err := verifyWebhook([][]byte{secretOf(t, s.ep)}, last.Header, last.Body, time.Now()); err != nil {
		t.Errorf("the test request's signature: %v", err)
	}
	var body struct {
		ID   string          `json:"id"`
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(last.Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.Type != "order.paid" || string(body.Data) != `{"order_id":42,"amount_cents":1200}` || body.ID != fmt.Sprint(send.EventID) {
		t.Errorf("the test request's body is %s, want type order.paid, the example, id %d", last.Body, send.EventID)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE job_id = $1 AND endpoint_id = $2`, send.JobID, s.ep.ID); n != 2 {
		t.Errorf("the history holds %d attempts of the test send, want 2", n)
	}
	if n := queryInt(t, db, `SELECT coalesce(sum(attempts), 0) FROM outbox.delivery_stats WHERE endpoint_id = $1`, s.ep.ID); n != 0 {
		t.Errorf("the statistics count %d attempts of the test send, want 0", n)
	}

	// A real event is counted, and a replay from before both sends it
	// again, and not the test.
	real := recordPayload(t, db, "order.paid", "o-1", `{"order_id": 1}`)
	relayAll(t, db)
	if _, err := s.workers.workOnce(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, db, `SELECT coalesce(sum(attempts), 0) FROM outbox.delivery_stats WHERE endpoint_id = $1`, s.ep.ID); n != 1 {
		t.Errorf("the statistics count %d attempts after a real delivery, want 1", n)
	}
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	status, b = s.api.do("POST", fmt.Sprintf("/api/endpoints/%d/replay", s.ep.ID), fmt.Sprintf(`{"since": %q}`, since))
	if status != http.StatusOK {
		t.Fatalf("replay: %d %s", status, b)
	}
	var replayed []int64
	rows, err := db.Query(`SELECT event_id FROM outbox.jobs WHERE endpoint_id = $1 AND replay_id IS NOT NULL ORDER BY event_id`, s.ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		replayed = append(replayed, id)
	}
	if diff := cmp.Diff([]int64{real}, replayed); diff != "" {
		t.Errorf("the replay's events (-want +got):\n%s", diff)
	}
}

// A test of a topic nobody registered is refused, naming the field, and
// enqueues nothing; so is one without a topic, and one to a disabled
// endpoint (409).
func TestTestSendRefusesWhatItCannotSend(t *testing.T) {
	t.Parallel()
	s, db := newTestSendScene(t)
	path := fmt.Sprintf("/api/endpoints/%d/test", s.ep.ID)
	for _, tc := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"topic": "order.refunded"}`, 400, `topic "order.refunded" is not a registered topic`},
		{`{}`, 400, `"topic" is required`},
		{`{"topic": 7}`, 400, "topic: want a string"},
	} {
		if status, b := s.api.do("POST", path, tc.body); status != tc.status || !strings.Contains(errorText(b), tc.want) {
			t.Errorf("test %s = %d %s, want %d saying %s", tc.body, status, b, tc.status, tc.want)
		}
	}
	s.api.do("POST", fmt.Sprintf("/api/endpoints/%d/disable", s.ep.ID), `{"reason": "moving"}`)
	if status, b := s.api.do("POST", path, `{"topic": "order.paid"}`); status != http.StatusConflict {
		t.Errorf("test of a disabled endpoint = %d %s, want 409", status, b)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE test`); n != 0 {
		t.Errorf("the refused tests recorded %d events", n)
	}
}

// An owner sees the registered topics its endpoints may receive, tests
// its own endpoint with one of them, and another owner's endpoint answers
// the 404 of one that does not exist; a topic outside its grants is
// refused as one not registered.
func TestOwnerTestsOnlyItsOwnEndpoints(t *testing.T) {
	t.Parallel()
	w := newIsolationWorld(t)
	decodeAs(t, w.srv, testToken, "PATCH", fmt.Sprintf("/api/owners/%d", w.mine.ID), `{"allowed_topics": ["invoice.*"]}`, 200, nil)
	for _, name := range []string{"invoice.paid", "order.paid", "outboxd.endpoint.failing"} {
		decodeAs(t, w.srv, testToken, "POST", "/api/topics", fmt.Sprintf(`{"name": %q, "example": {"n": 1}}`, name), 201, nil)
	}
	var listed struct{ Topics []Topic }
	decodeAs(t, w.srv, w.mine.Token, "GET", "/api/topics", "", 200, &listed)
	if len(listed.Topics) != 1 || listed.Topics[0].Name != "invoice.paid" {
		t.Errorf("the owner's topics = %+v, want invoice.paid alone", listed.Topics)
	}
	if status, _ := callAs(t, w.srv, w.mine.Token, "POST", "/api/topics", `{"name": "x.y", "example": 1}`); status != http.StatusForbidden {
		t.Errorf("an owner's POST /api/topics = %d, want 403", status)
	}

	var mine Endpoint
	decodeAs(t, w.srv, w.mine.Token, "POST", "/api/endpoints", `{"url": "http://127.0.0.1:9/hook", "topics": ["invoice.*"]}`, 201, &mine)
	var send TestSend
	decodeAs(t, w.srv, w.mine.Token, "POST", fmt.Sprintf("/api/endpoints/%d/test", mine.ID), `{"topic": "invoice.paid"}`, 202, &send)
	if send.EndpointID != mine.ID || send.JobID == 0 {
		t.Errorf("the owner's test send answered %+v", send)
	}
	status, b := callAs(t, w.srv, w.mine.Token, "POST", fmt.Sprintf("/api/endpoints/%d/test", mine.ID), `{"topic": "order.paid"}`)
	if status != http.StatusBadRequest || !strings.Contains(string(b), "is not a registered topic") {
		t.Errorf("an owner's test of a topic outside its grants = %d %s, want 400", status, b)
	}
	theirs, missing := fmt.Sprintf("/api/endpoints/%d/test", w.theirsEp.ID), fmt.Sprintf("/api/endpoints/%d/test", w.missing)
	status, b = callAs(t, w.srv, w.mine.Token, "POST", theirs, `{"topic": "invoice.paid"}`)
	missingStatus, missingBody := callAs(t, w.srv, w.mine.Token, "POST", missing, `{"topic": "invoice.paid"}`)
	if status != 404 || missingStatus != 404 || !sameAnswer(string(b), string(missingBody), w.theirsEp.ID, w.missing) {
		t.Errorf("another owner's endpoint = %d %s; a missing one = %d %s; want the same 404", status, b, missingStatus, missingBody)
	}
	// The owner's event page shows it the test event its endpoint was sent.
	decodeAs(t, w.srv, w.mine.Token, "GET", fmt.Sprintf("/api/endpoints/%d/events/%d", mine.ID, send.EventID), "", 200, nil)
}

// postTestSend sends endpoint id a test of topic through api, which
// must answer 202.
func postTestSend(t *testing.T, api *testAPI, id int64, topic string) TestSend {
	t.Helper()
	status, b := api.do("POST", fmt.Sprintf("/api/endpoints/%d/test", id), fmt.Sprintf(`{"topic": %q}`, topic))
	var send TestSend
	if status != http.StatusAccepted || json.Unmarshal(b, &send) != nil {
		t.Fatalf("test send = %d %s, want 202", status, b)
	}
	return send
}

// apiObject answers path through s's API, 200, as a JSON object.
func apiObject(t *testing.T, s *testSendScene, path string) map[string]any {
	t.Helper()
	status, b := s.api.do("GET", path, "")
	var got map[string]any
	if status != http.StatusOK || json.Unmarshal(b, &got) != nil {
		t.Fatalf("GET %s = %d %s", path, status, b)
	}
	return got
}

// testMarks is, for each object of list that has an "id" (or key), its
// "test" member: true, false, or nil when absent.
func testMarks(list any, key string) map[int64]any {
	marks := map[int64]any{}
	items, _ := list.([]any)
	for _, item := range items {
		obj, _ := item.(map[string]any)
		id, _ := obj[key].(float64)
		marks[int64(id)] = obj["test"]
	}
	return marks
}

// A test send is marked where people look: "test": true on its event and
// its job in the API (absent on every other), and a test badge on the
// panel's events list, event page, jobs list and the endpoint's
// attempts, queued and once delivered.
func TestTestSendIsMarkedWhereItIsShown(t *testing.T) {
	t.Parallel()
	s, db := newTestSendScene(t)
	send := postTestSend(t, s.api, s.ep.ID, "order.paid")
	real := recordPayload(t, db, "order.paid", "o-1", `{"order_id": 1}`)
	relayAll(t, db)
	realJob := int64(queryInt(t, db, `SELECT id FROM outbox.jobs WHERE event_id = $1`, real))
	want := map[int64]any{send.EventID: true, real: nil}
	if diff := cmp.Diff(want, testMarks(apiObject(t, s, "/api/events")["events"], "id")); diff != "" {
		t.Errorf("GET /api/events test marks by event (-want +got):\n%s", diff)
	}
	jobOf := map[int64]int64{send.EventID: send.JobID, real: realJob}
	for _, id := range []int64{send.EventID, real} {
		ev := apiObject(t, s, fmt.Sprintf("/api/events/%d", id))
		if ev["test"] != want[id] {
			t.Errorf("GET /api/events/%d test mark %v, want %v", id, ev["test"], want[id])
		}
		if diff := cmp.Diff(map[int64]any{jobOf[id]: want[id]}, testMarks(ev["jobs"], "id")); diff != "" {
			t.Errorf("GET /api/events/%d test marks of its jobs (-want +got):\n%s", id, diff)
		}
	}
	ctx := context.Background()
	for range 2 { // the receiver fails its first request: a retry, then both delivered
		if _, err := s.workers.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
		mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state = 'retryable'`)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs`); n != 0 {
		t.Fatalf("%d jobs still queued, want both delivered", n)
	}
	jobMarks := map[int64]any{send.JobID: true, realJob: nil}
	if diff := cmp.Diff(jobMarks, testMarks(apiObject(t, s, "/api/jobs")["jobs"], "id")); diff != "" {
		t.Errorf("GET /api/jobs test marks once delivered (-want +got):\n%s", diff)
	}
	attempts := testMarks(apiObject(t, s, fmt.Sprintf("/api/endpoints/%d/deliveries", s.ep.ID))["recent"], "job_id")
	if diff := cmp.Diff(jobMarks, attempts); diff != "" {
		t.Errorf("the endpoint's attempts' test marks by job (-want +got):\n%s", diff)
	}

	const badge = `<span class="badge badge-wait test"`
	rowOf := func(page, start string) string {
		return regexp.MustCompile(`(?s)` + regexp.QuoteMeta(start) + `.*?</tr>`).FindString(page)
	}
	_, events := panelPage(t, s.api.srv, "/events")
	_, jobs := panelPage(t, s.api.srv, "/jobs")
	_, endpoint := panelPage(t, s.api.srv, fmt.Sprintf("/endpoints/%d", s.ep.ID))
	_, endpoint, _ = strings.Cut(endpoint, "<h2>Recent attempts</h2>") // past the failures, which link events too
	for _, c := range []struct {
		where, text string
		test        bool
	}{
		{"the events list's row of the test", rowOf(events, fmt.Sprintf(`<a href="/events/%d">`, send.EventID)), true},
		{"the events list's row of the real event", rowOf(events, fmt.Sprintf(`<a href="/events/%d">`, real)), false},
		{"the jobs list's row of the test job", rowOf(jobs, fmt.Sprintf("<tr>\n  <td>%d</td>", send.JobID)), true},
		{"the jobs list's row of the real job", rowOf(jobs, fmt.Sprintf("<tr>\n  <td>%d</td>", realJob)), false},
		{"the endpoint's attempt of the test", rowOf(endpoint, fmt.Sprintf(`<a href="/events/%d">`, send.EventID)), true},
		{"the endpoint's attempt of the real event", rowOf(endpoint, fmt.Sprintf(`<a href="/events/%d">`, real)), false},
		{"the test's event page", regexp.MustCompile(`(?s)<h1>.*?</h1>`).FindString(second(panelPage(t, s.api.srv, fmt.Sprintf("/events/%d", send.EventID)))), true},
		{"the real event's page", regexp.MustCompile(`(?s)<h1>.*?</h1>`).FindString(second(panelPage(t, s.api.srv, fmt.Sprintf("/events/%d", real)))), false},
	} {
		if c.text == "" {
			t.Errorf("%s: not found", c.where)
		} else if strings.Contains(c.text, badge) != c.test {
			t.Errorf("%s: test badge shown %v, want %v:\n%s", c.where, !c.test, c.test, c.text)
		}
	}
	if jobPage := rowOf(second(panelPage(t, s.api.srv, fmt.Sprintf("/events/%d", send.EventID))), fmt.Sprintf("<tr>\n  <td>%d</td>", send.JobID)); !strings.Contains(jobPage, badge) {
		t.Errorf("the test's event page shows its job without the test badge:\n%s", jobPage)
	}
}

// second is the second of two values.
func second[A, B any](_ A, b B) B { return b }

// /metrics' delivery counters count real deliveries alone, as the
// statistics do: a test send's attempts are left out.
func TestTestSendIsNotCountedInDeliveryMetrics(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL+"/hook", "order.*")
	registerTopic(t, api, "order.paid", `{"order_id": 42}`)
	metrics := newDeliveryMetrics()
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	workers := newWorkerPool(db, defaultConfig().Workers, time.Minute, newSubscriberRegistry(),
		map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, client, metrics, nil, testLogger(t)).deliver}, testLogger(t))
	postTestSend(t, api, ep.ID, "order.paid")
	recordPayload(t, db, "order.paid", "o-1", `{"order_id": 1}`)
	relayAll(t, db)
	if _, err := workers.workOnce(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	if n := len(rc.requests()); n != 2 {
		t.Fatalf("the receiver got %d requests, want the test's and the event's", n)
	}
	if diff := cmp.Diff(map[string]int64{"success": 1}, metrics.outcomes.Snapshot()); diff != "" {
		t.Errorf("outboxd_deliveries_total by outcome (-want +got):\n%s", diff)
	}
	if got := metrics.commitTo2xx.labels(); !cmp.Equal(got, []string{itoa(ep.ID)}) {
		t.Errorf("commit to first 2xx labels %v", got)
	}
}
