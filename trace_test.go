// trace_test.go: W3C trace context from the producing transaction to the
// receiver.

package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

const (
	testTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testTracestate  = "rojo=00f067aa0ba902b7"
)

// A producer's transaction that sets outbox.traceparent records it with
// its events, by call and by watch trigger; a malformed one fails the
// transaction, and a transaction without one records none.
func TestRecordKeepsTheTransactionsTraceContext(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)`)
	mustExec(t, db, `SELECT outbox.watch('orders', 'order.changed', NULL)`)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SET LOCAL outbox.traceparent = '` + testTraceparent + `'`,
		`SET LOCAL outbox.tracestate = '` + testTracestate + `'`,
		`SELECT outbox.record('order.paid', '1', '{}')`,
		`INSERT INTO orders VALUES (1, 'paid')`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `SELECT outbox.record('order.paid', '2', '{}')`) // a transaction without one
	got := queryStrings(t, db, `SELECT coalesce(traceparent, '-') || ' ' || coalesce(tracestate, '-') FROM outbox.events ORDER BY id`)
	want := []string{testTraceparent + " " + testTracestate, testTraceparent + " " + testTracestate, "- -"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("trace contexts recorded %q, want %q", got, want)
	}

	for _, bad := range []string{
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // a version this outboxd cannot read
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // no trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // no parent id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
		"not a traceparent",
	} {
		_, err := recordEventTraced(ctx, db, traceContext{Traceparent: bad}, "order.paid", "3", nil)
		if err == nil || !strings.Contains(err.Error(), "events_traceparent_format") {
			t.Errorf("traceparent %q: %v, want the recording refused by events_traceparent_format", bad, err)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 3 {
		t.Errorf("%d events, want the 3 recorded and none of the refused", n)
	}
}

// POST /api/events records the request's trace context, and every delivery
// of the event carries it to the receiver.
func TestDeliveriesCarryTheTraceContext(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	api.createEndpoint(rc.srv.URL+"/hook", "order.*")

	send := func(traceparent string) (int, string) {
		req, _ := http.NewRequest("POST", api.srv.URL+"/api/events", strings.NewReader(`{"topic": "order.paid", "subject": "o-1"}`))
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("tracestate", testTracestate)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	if status, body := send("00-bad"); status != http.StatusBadRequest || !strings.Contains(body, "traceparent is not a W3C trace context") {
		t.Errorf("a malformed traceparent: %d %s, want 400 saying what a traceparent must be", status, body)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events`); n != 0 {
		t.Errorf("%d events stored after a refused traceparent, want none", n)
	}
	if status, body := send(testTraceparent); status != http.StatusCreated {
		t.Fatalf("POST /api/events: %d %s, want 201", status, body)
	}
	relayAll(t, db)
	runWebhookWorkers(t, db, 10*time.Second)
	waitFor(t, "the delivery", 30*time.Second, func() bool { return len(rc.requests()) == 1 })
	h := rc.requests()[0].Header
	if h.Get("traceparent") != testTraceparent || h.Get("tracestate") != testTracestate {
		t.Errorf("delivery headers traceparent %q, tracestate %q; want %q, %q", h.Get("traceparent"), h.Get("tracestate"), testTraceparent, testTracestate)
	}
}

// The event page shows the trace context an event was recorded under.
func TestEventPageShowsTheTraceContext(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	id, err := recordEventTraced(context.Background(), db, traceContext{Traceparent: testTraceparent}, "order.paid", "o-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, html := panelPage(t, newTestServer(t, db, testPolicy), "/events/"+itoa(id)); !strings.Contains(html, testTraceparent) {
		t.Errorf("the event page does not show its traceparent:\n%s", html)
	}
}
