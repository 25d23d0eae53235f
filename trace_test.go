// trace_test.go: W3C trace context from the producing transaction to the
// receiver, kept where valid and never at the cost of the recording.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	testTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testTracestate  = "rojo=00f067aa0ba902b7"
	// testTraceIDs are testTraceparent's trace id and parent id.
	testTraceIDs = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
)

// traceMembers is n tracestate members k<i>=vvv..., numbered from from,
// each size characters long.
func traceMembers(from, n, size int) []string {
	var members []string
	for i := from; i < from+n; i++ {
		key := "k" + itoa(int64(i)) + "="
		members = append(members, key+strings.Repeat("v", size-len(key)))
	}
	return members
}

// outbox.trace_context keeps what is valid of a trace context and drops or
// cuts the rest, as W3C Trace Context has a receiver do, and names each
// repair.
func TestTraceContextKeepsWhatIsValid(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	type result struct {
		Traceparent, Tracestate *string
		Repairs                 string
	}
	str := func(s string) *string { return &s }
	none := result{}
	tpOnly := func(tp string, repairs string) result { return result{Traceparent: str(tp), Repairs: repairs} }
	over512 := traceMembers(0, 5, 120) // 604 characters with the commas
	long := "big=" + strings.Repeat("x", 196)
	short := traceMembers(0, 4, 80) // with long, 524 characters
	at512 := traceMembers(0, 1, 256)[0] + "," + traceMembers(1, 1, 255)[0]
	for _, tc := range []struct {
		name                    string
		traceparent, tracestate string
		want                    result
	}{
		{"version 00", testTraceparent, testTracestate, result{str(testTraceparent), str(testTracestate), ""}},
		{"none", "", "", none},
		{"blanks around", " " + testTraceparent + "\t", "", tpOnly(testTraceparent, "")},

		// A later version: its first 55 characters, if a dash or nothing
		// follows them, as version 00 with the sampled flag alone.
		{"a later version with more fields", "01-" + testTraceIDs + "-01-extra", "", tpOnly(testTraceparent, "traceparent_downgraded")},
		{"a later version of 55 characters", "cc-" + testTraceIDs + "-01", "", tpOnly(testTraceparent, "traceparent_downgraded")},
		{"a later version's flags", "cc-" + testTraceIDs + "-0b", "", tpOnly("00-"+testTraceIDs+"-01", "traceparent_downgraded")},
		{"a later version's flags, not sampled", "cc-" + testTraceIDs + "-fe", "", tpOnly("00-"+testTraceIDs+"-00", "traceparent_downgraded")},
		{"a later version without a dash after 55", "cc-" + testTraceIDs + "-01.what", "", result{Repairs: "traceparent_dropped"}},
		{"a later version shorter than 55", "cc-" + testTraceIDs, "", result{Repairs: "traceparent_dropped"}},
		{"a later version with no trace id", "cc-00000000000000000000000000000000-00f067aa0ba902b7-01", "", result{Repairs: "traceparent_dropped"}},

		// Not a traceparent: the trace restarts, and its tracestate goes.
		{"version ff", "ff-" + testTraceIDs + "-01", "", result{Repairs: "traceparent_dropped"}},
		{"version 00 with more fields", testTraceparent + "-extra", "", result{Repairs: "traceparent_dropped"}},
		{"no trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", result{Repairs: "traceparent_dropped"}},
		{"no parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "", result{Repairs: "traceparent_dropped"}},
		{"upper case", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "", result{Repairs: "traceparent_dropped"}},
		{"two joined", testTraceparent + "," + testTraceparent, "", result{Repairs: "traceparent_dropped"}},
		{"with its tracestate", "not a traceparent", testTracestate, result{Repairs: "traceparent_dropped tracestate_dropped"}},
		{"a tracestate alone", "", testTracestate, result{Repairs: "tracestate_dropped"}},

		// A tracestate: members kept whole, white space and empty members
		// dropped, an invalid list dropped whole.
		{"white space and empty members", testTraceparent, " rojo=1 ,,\tcongo=t61rcWkgMzE , ", result{str(testTraceparent), str("rojo=1,congo=t61rcWkgMzE"), ""}},
		{"a value's leading space, a tenant key", testTraceparent, "rojo= x,tenant@sys=1", result{str(testTraceparent), str("rojo= x,tenant@sys=1"), ""}},
		{"blank", testTraceparent, " , ", tpOnly(testTraceparent, "")},
		{"an upper-case key", testTraceparent, "rojo=1,Congo=2", tpOnly(testTraceparent, "tracestate_dropped")},
		{"a key twice", testTraceparent, "rojo=1,congo=2,rojo=3", tpOnly(testTraceparent, "tracestate_dropped")},
		{"a member without =", testTraceparent, "rojo=1,congo", tpOnly(testTraceparent, "tracestate_dropped")},
		{"a value with =", testTraceparent, "rojo=a=b", tpOnly(testTraceparent, "tracestate_dropped")},

		// Over 32 members or 512 characters: whole members from the end,
		// those over 128 characters first.
		{"33 members", testTraceparent, strings.Join(traceMembers(0, 33, 8), ","),
			result{str(testTraceparent), str(strings.Join(traceMembers(0, 32, 8), ",")), "tracestate_truncated"}},
		{"32 members", testTraceparent, strings.Join(traceMembers(0, 32, 8), ","),
			result{str(testTraceparent), str(strings.Join(traceMembers(0, 32, 8), ",")), ""}},
		{"over 512 characters", testTraceparent, strings.Join(over512, ","),
			result{str(testTraceparent), str(strings.Join(over512[:4], ",")), "tracestate_truncated"}},
		{"over 512 with a member over 128", testTraceparent, strings.Join(append([]string{long}, short...), ","),
			result{str(testTraceparent), str(strings.Join(short, ",")), "tracestate_truncated"}},
		{"512 characters", testTraceparent, at512, result{str(testTraceparent), str(at512), ""}},
		{"513 characters", testTraceparent, at512 + "v", result{str(testTraceparent), str(at512[:256]), "tracestate_truncated"}},
	} {
		var got result
		err := db.QueryRow(`SELECT traceparent, tracestate, array_to_string(repairs, ' ') FROM outbox.trace_context($1, $2)`,
			tc.traceparent, tc.tracestate).Scan(&got.Traceparent, &got.Tracestate, &got.Repairs)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", tc.name, diff)
		}
	}
}

// A producer's transaction that sets outbox.traceparent records it with
// its events, by call and by watch trigger, and a transaction without one
// records none. A trace context that is not valid never costs the business
// write: a later version is read as version 00, an over-long tracestate
// is cut, a malformed traceparent is dropped, and each repair is counted.
func TestRecordKeepsTheTransactionsTraceContext(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)`)
	mustExec(t, db, `SELECT outbox.watch('orders', 'order.changed', NULL)`)

	produce := func(id int, traceparent, tracestate string) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `SELECT set_config('outbox.traceparent', $1, true), set_config('outbox.tracestate', $2, true)`,
			traceparent, tracestate); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `SELECT outbox.record('order.paid', $1, '{}')`, itoa(int64(id))); err != nil {
			t.Fatalf("traceparent %q, tracestate of %d characters: record: %v", traceparent, len(tracestate), err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ($1, 'paid')`, id); err != nil {
			t.Fatalf("traceparent %q, tracestate of %d characters: the business write: %v", traceparent, len(tracestate), err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	over512 := strings.Join(traceMembers(0, 6, 100), ",") // 605 characters
	produce(1, testTraceparent, testTracestate)
	produce(2, "01-"+testTraceIDs+"-01-extra", over512) // the two
	for i, bad := range []string{
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // no trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // no parent id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
		"not a traceparent",
	} {
		produce(3+i, bad, "")
	}
	mustExec(t, db, `SELECT outbox.record('order.paid', '9', '{}')`) // a transaction without one

	truncated := strings.Join(traceMembers(0, 5, 100), ",")
	want := []string{
		"1 " + testTraceparent + " " + testTracestate, "1 " + testTraceparent + " " + testTracestate,
		"2 " + testTraceparent + " " + truncated, "2 " + testTraceparent + " " + truncated,
	}
	for i := 3; i <= 6; i++ {
		want = append(want, itoa(int64(i))+" - -", itoa(int64(i))+" - -")
	}
	want = append(want, "9 - -")
	got := queryStrings(t, db, `
		SELECT coalesce(payload->'new'->>'id', subject) || ' ' || coalesce(traceparent, '-') || ' ' || coalesce(tracestate, '-')
		FROM outbox.events ORDER BY id`)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events recorded, by order (-want +got):\n%s", diff)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM orders`); n != 6 {
		t.Errorf("%d orders, want all 6 business writes committed", n)
	}

	// Counted per recording: the watch trigger's and the call's.
	repairs, err := readTraceRepairs(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	wantRepairs := traceRepairs{"traceparent_dropped": 8, "traceparent_downgraded": 2, "tracestate_dropped": 0, "tracestate_truncated": 2}
	if diff := cmp.Diff(wantRepairs, repairs); diff != "" {
		t.Errorf("repairs counted (-want +got):\n%s", diff)
	}
}

// POST /api/events records the request's trace context, keeping what is
// valid and answering 201 whatever it carries; every delivery of the event
// carries what was kept to the receiver, and /metrics counts the repairs.
func TestDeliveriesCarryTheTraceContext(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	rc := newReceiver(t, nil)
	api.createEndpoint(rc.srv.URL+"/hook", "order.*")

	send := func(subject string, traceparents, tracestates []string) {
		t.Helper()
		req, _ := http.NewRequest("POST", api.srv.URL+"/api/events", strings.NewReader(`{"topic": "order.paid", "subject": "`+subject+`"}`))
		req.Header.Set("Authorization", "Bearer "+testToken)
		for _, v := range traceparents {
			req.Header.Add("traceparent", v)
		}
		for _, v := range tracestates {
			req.Header.Add("tracestate", v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("%s: POST /api/events: %d %s, want 201", subject, resp.StatusCode, body)
		}
	}
	send("valid", []string{testTraceparent}, []string{testTracestate, "congo=t61rcWkgMzE"}) // two fields, one list
	send("later", []string{"01-" + testTraceIDs + "-01-extra"}, []string{testTracestate})
	send("bad", []string{"00-bad"}, []string{testTracestate})
	send("twice", []string{testTraceparent, testTraceparent}, nil)
	send("not-utf8", []string{"00-\xff"}, nil)
	got := queryStrings(t, db, `SELECT subject || ' ' || coalesce(traceparent, '-') || ' ' || coalesce(tracestate, '-') FROM outbox.events ORDER BY id`)
	want := []string{
		"valid " + testTraceparent + " " + testTracestate + ",congo=t61rcWkgMzE",
		"later " + testTraceparent + " " + testTracestate,
		"bad - -", "twice - -", "not-utf8 - -",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events recorded (-want +got):\n%s", diff)
	}

	relayAll(t, db)
	runWebhookWorkers(t, db, 10*time.Second)
	waitFor(t, "the deliveries", 30*time.Second, func() bool { return len(rc.requests()) == len(want) })
	headers := map[string]string{}
	for _, r := range rc.requests() {
		var body struct{ Subject string }
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatal(err)
		}
		headers[body.Subject] = r.Header.Get("traceparent") + " " + r.Header.Get("tracestate")
	}
	wantHeaders := map[string]string{
		"valid": testTraceparent + " " + testTracestate + ",congo=t61rcWkgMzE",
		"later": testTraceparent + " " + testTracestate,
		"bad":   " ", "twice": " ", "not-utf8": " ",
	}
	if diff := cmp.Diff(wantHeaders, headers); diff != "" {
		t.Errorf("delivery headers traceparent and tracestate, by subject (-want +got):\n%s", diff)
	}

	status, metrics := api.do("GET", "/metrics", "")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", status, metrics)
	}
	for _, line := range []string{
		`outboxd_trace_context_repairs_total{header="traceparent",action="dropped"} 3`,
		`outboxd_trace_context_repairs_total{header="traceparent",action="downgraded"} 1`,
		`outboxd_trace_context_repairs_total{header="tracestate",action="dropped"} 1`,
		`outboxd_trace_context_repairs_total{header="tracestate",action="truncated"} 0`,
	} {
		if !strings.Contains(string(metrics), line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// Two outboxd pipelines chained, A's endpoint being B's inbox: the event B
// records keeps the trace context A's delivery carried, and B's own
// deliveries carry it on, so the receiver's trace continues from A's
// business write.
func TestChainCarriesOneTrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbA, _ := newTestDB(t)
	dbB, _ := newTestDB(t)
	apiA := newTestAPI(t, dbA, testPolicy)
	apiB := newTestAPI(t, dbB, testPolicy)
	rc := newReceiver(t, nil)

	ep := apiA.createEndpoint(apiB.srv.URL+"/webhooks/a", "order.*")
	apiB.createSource("a", ep.Secret)
	apiB.createEndpoint(rc.srv.URL+"/hook", "a.order.*")
	if _, err := recordEventTraced(ctx, dbA, traceContext{Traceparent: testTraceparent, Tracestate: testTracestate}, eventInput{Topic: "order.paid", Subject: "o-1"}); err != nil {
		t.Fatal(err)
	}

	relayAll(t, dbA)
	runWebhookWorkers(t, dbA, 10*time.Second)
	waitFor(t, "B to record A's event", 30*time.Second, func() bool {
		return queryInt(t, dbB, `SELECT count(*) FROM outbox.events WHERE topic = 'a.order.paid'`) == 1
	})
	traced := func(db *sql.DB) []string {
		return queryStrings(t, db, `SELECT topic || ' ' || coalesce(traceparent, '-') || ' ' || coalesce(tracestate, '-') FROM outbox.events WHERE topic = 'a.order.paid'`)
	}
	if diff := cmp.Diff([]string{"a.order.paid " + testTraceparent + " " + testTracestate}, traced(dbB)); diff != "" {
		t.Errorf("B's event (-want +got):\n%s", diff)
	}

	relayAll(t, dbB)
	runWebhookWorkers(t, dbB, 10*time.Second)
	waitFor(t, "B's delivery", 30*time.Second, func() bool { return len(rc.requests()) == 1 })
	h := rc.requests()[0].Header
	if h.Get("traceparent") != testTraceparent || h.Get("tracestate") != testTracestate {
		t.Errorf("B's delivery: traceparent %q, tracestate %q; want A's %q, %q", h.Get("traceparent"), h.Get("tracestate"), testTraceparent, testTracestate)
	}
}

// The event page shows the trace context an event was recorded under.
func TestEventPageShowsTheTraceContext(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	id, err := recordEventTraced(context.Background(), db, traceContext{Traceparent: testTraceparent}, eventInput{Topic: "order.paid", Subject: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, html := panelPage(t, newTestServer(t, db, testPolicy), "/events/"+itoa(id)); !strings.Contains(html, testTraceparent) {
		t.Errorf("the event page does not show its traceparent:\n%s", html)
	}
}
