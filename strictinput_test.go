// strictinput_test.go: what the API reads is read one way: JSON names as
// the docs spell them, once each; one page-size rule for every list; the
// inbox's body bound where the docs put it; and an endpoint's delete told
// once in the log, not once per delivery it leaves.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A JSON body is read strictly: a field name in another case, a name given
// twice (at the top or inside the payload) and an unknown name are each a
// 400 that names the problem, and record nothing.
func TestJSONBodiesAreDecodedStrictly(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	for _, tc := range []struct {
		name, path, body, want string
	}{
		{"a field in upper case", "/api/events", `{"TOPIC": "order.paid", "payload": {}}`, `unknown field "TOPIC" (names are case-sensitive)`},
		{"a field in mixed case", "/api/events", `{"topic": "order.paid", "Payload": {}}`, `unknown field "Payload"`},
		{"a field given twice", "/api/events", `{"topic": "order.paid", "topic": "order.refunded", "payload": {}}`, `"topic" given twice in one object`},
		{"a field given twice, once escaped", "/api/events", `{"topic": "order.paid", "\u0074opic": "order.refunded"}`, `"topic" given twice in one object`},
		{"a payload member given twice", "/api/events", `{"topic": "order.paid", "payload": {"a": {"cents": 1, "cents": 2}}}`, `"cents" given twice in one object`},
		{"an unknown field", "/api/events", `{"topic": "order.paid", "payload": {}, "id": 7}`, `unknown field "id"`},
		{"an endpoint field in another case", "/api/endpoints", `{"URL": "https://hooks.example.com/"}`, `unknown field "URL"`},
		{"a source field given twice", "/api/sources", `{"name": "a", "name": "b"}`, `"name" given twice`},
	} {
		status, body := api.do("POST", tc.path, tc.body)
		if status != http.StatusBadRequest || !strings.Contains(errorOf(t, body), tc.want) {
			t.Errorf("%s: %d %s, want 400 naming %s", tc.name, status, body, tc.want)
		}
	}
	if n := queryInt(t, db, `SELECT (SELECT count(*) FROM outbox.events) + (SELECT count(*) FROM outbox.endpoints) + (SELECT count(*) FROM outbox.inbox_sources)`); n != 0 {
		t.Errorf("%d rows written from refused bodies, want 0", n)
	}
	// The same names spelled right, once each, are taken: arrays of
	// objects repeat names across objects, not within one.
	// Strings that hold JSON's punctuation are values, not structure.
	for _, body := range []string{
		`{"topic": "order.paid", "payload": {"lines": [{"sku": 1}, {"sku": 2}]}}`,
		`{"topic": "order.paid", "payload": {"a": "x,\"a\": {[", "b": ["a", "a", {"a": 1}], "c": {"a": 2}}}`,
	} {
		if status, resp := api.do("POST", "/api/events", body); status != http.StatusCreated {
			t.Errorf("%s: %d %s, want 201", body, status, resp)
		}
	}
}

// Every string of a JSON body, name or value, at any depth, is text:
// bytes that are not UTF-8 and a UTF-16 surrogate escape without its other
// half are each a 400 naming where they are, and record nothing, rather
// than being stored as U+FFFD. Pairs, escaped or not, and every other
// escape are taken as sent.
func TestJSONStringsMustBeText(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	event := func(field string) string {
		return `{"topic": "order.paid", ` + field + `}`
	}
	endpoint := func(description string) string {
		return `{"url": "https://hooks.example.com/", "description": "` + description + `"}`
	}
	for _, tc := range []struct {
		name, path, body, want string
	}{
		{"a byte that is not UTF-8", "/api/events", event("\"subject\": \"order-\xff\""), "subject: byte 0xff is not UTF-8 text"},
		{"a multi-byte character cut short", "/api/events", event("\"subject\": \"\xe6\x9d\""), "subject: byte 0xe6 is not UTF-8 text"},
		{"an overlong encoding", "/api/events", event("\"subject\": \"\xc0\xaf\""), "subject: byte 0xc0 is not UTF-8 text"},
		{"a surrogate encoded as UTF-8", "/api/events", event("\"subject\": \"\xed\xa0\x80\""), "subject: byte 0xed is not UTF-8 text"},
		{"a lone high surrogate", "/api/endpoints", endpoint(`a\ud800b`), `description: \ud800 is a lone UTF-16 surrogate; a character past U+FFFF is escaped as a high-low pair`},
		{"a high surrogate at the end", "/api/endpoints", endpoint(`a\uDBFF`), `description: \udbff is a lone UTF-16 surrogate; a character past U+FFFF is escaped as a high-low pair`},
		{"a high surrogate before another escape", "/api/endpoints", endpoint(`\ud800\u0041`), `description: \ud800 is a lone UTF-16 surrogate`},
		{"two high surrogates", "/api/endpoints", endpoint(`\ud800\ud800`), `description: \ud800 is a lone UTF-16 surrogate`},
		{"a lone low surrogate", "/api/endpoints", endpoint(`\udc00`), `description: \udc00 is a lone UTF-16 surrogate; a character past U+FFFF is escaped as a high-low pair`},
		{"a pair the wrong way round", "/api/endpoints", endpoint(`\udc00\ud800`), `description: \udc00 is a lone UTF-16 surrogate`},
		{"in an array", "/api/endpoints", `{"url": "https://hooks.example.com/", "topics": ["a", "b\udfff"]}`, `topics[1]: \udfff is a lone UTF-16 surrogate`},
		{"deep in the payload", "/api/events", event(`"payload": {"lines": [{"sku": "A"}, {"sku": "B", "note": "\ud800"}]}`), `payload.lines[1].note: \ud800 is a lone UTF-16 surrogate`},
		{"in a name in the payload", "/api/events", event(`"payload": {"a": {"k\ud800": 1}}`), `a name in payload.a: \ud800 is a lone UTF-16 surrogate`},
		{"bytes in a name in the payload", "/api/events", event("\"payload\": {\"\xff\": 1}"), "a name in payload: byte 0xff is not UTF-8 text"},
		{"in an owner's name", "/api/owners", `{"name": "Ops \ud800"}`, `name: \ud800 is a lone UTF-16 surrogate`},
	} {
		status, body := api.do("POST", tc.path, tc.body)
		if status != http.StatusBadRequest || !strings.Contains(errorOf(t, body), tc.want) {
			t.Errorf("%s: %d %s, want 400 naming %s", tc.name, status, body, tc.want)
		}
	}
	if n := queryInt(t, db, `SELECT (SELECT count(*) FROM outbox.events) + (SELECT count(*) FROM outbox.endpoints) + (SELECT count(*) FROM outbox.owners)`); n != 0 {
		t.Errorf("%d rows written from bodies that are not text, want 0", n)
	}

	// Text arrives as sent: a pair escaped in either case, the same
	// characters raw, and escapes that are not surrogates.
	const want = "😀😀😀é\t\"/"
	status, body := api.do("POST", "/api/events", event(`"subject": "\ud83d\ude00\uD83D\uDE00😀\u00e9\t\"\/", "payload": {"s": "\ud83d\ude00"}`))
	if status != http.StatusCreated {
		t.Fatalf("a body of text: %d %s, want 201", status, body)
	}
	var subject, payload string
	if err := db.QueryRow(`SELECT subject, payload->>'s' FROM outbox.events`).Scan(&subject, &payload); err != nil {
		t.Fatal(err)
	}
	if subject != want || payload != "😀" {
		t.Errorf("stored subject %q and payload %q, want %q and %q", subject, payload, want, "😀")
	}
}

// A body's field of the wrong JSON type is a 400 in JSON's words: the
// field's JSON path and the JSON type it takes, never a Go type or struct.
func TestWronglyTypedFieldsAreNamedInJSONTerms(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	for _, tc := range []struct {
		path, body, want string
	}{
		{"/api/endpoints", `{"url": "https://hooks.example.com/", "client_certificate": 5}`, "client_certificate: want a string, got a number"},
		{"/api/endpoints", `{"url": 5}`, "url: want a string, got a number"},
		{"/api/endpoints", `{"topics": "order.*"}`, "topics: want an array of strings, got a string"},
		{"/api/endpoints", `{"topics": ["a", 7]}`, "topics: want an array of strings, got a number in it"},
		{"/api/endpoints", `{"max_in_flight": 1.5}`, "max_in_flight: want an integer, got the number 1.5"},
		{"/api/endpoints", `{"max_in_flight": 1e400}`, "max_in_flight: want an integer, got the number 1e400"},
		{"/api/endpoints", `{"rate_limit_per_second": "fast"}`, "rate_limit_per_second: want a number, got a string"},
		{"/api/endpoints", `{"recovery_probes": "yes"}`, "recovery_probes: want true or false, got a string"},
		{"/api/endpoints", `{"owner_id": {"id": 1}}`, "owner_id: want an integer, got an object"},
		{"/api/endpoints", `[{"url": "https://hooks.example.com/"}]`, "request body: want an object, got an array"},
		{"/api/events", `"order.paid"`, "request body: want an object, got a string"},
		{"/api/events", `{"topic": ["order.paid"]}`, "topic: want a string, got an array"},
		{"/api/events", ``, "request body: empty; want a JSON object"},
		{"/api/events", `{"topic": "order.paid"`, "request body: ends before its JSON does"},
		{"/api/events", `{"topic": order}`, "request body: not JSON: invalid character 'o' looking for beginning of value (at byte 11)"},
	} {
		status, body := api.do("POST", tc.path, tc.body)
		if got := errorOf(t, body); status != http.StatusBadRequest || got != tc.want {
			t.Errorf("POST %s %s: %d %q, want 400 %q", tc.path, tc.body, status, got, tc.want)
		}
	}
}

// No answer of any route that takes a body names a Go type or a Go field
// path, whatever wrongly typed field it is sent: every POST and PATCH of
// admin.go's list is sent bodies that are not objects and, if it reads
// its body (an unknown field is refused), each field name the API takes
// with a value of each JSON type.
func TestNoAnswerNamesGoTypes(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	fields := []string{"topic", "subject", "payload", "url", "topics", "description", "owner_email", "max_in_flight",
		"ordering", "rate_limit_per_second", "recovery_probes", "filter", "client_certificate", "client_key",
		"ca_certificate", "owner_id", "reason", "since", "until", "dry_run", "limit", "endpoint_id",
		"without_endpoint", "error", "name", "secret", "topic_prefix", "lifetime"}
	values := []string{`1.5`, `"x"`, `[1]`, `{"a": 1}`, `true`}
	goWords := regexp.MustCompile(`Go |main\.|struct`)
	typed := 0 // answers that name a field's JSON type
	for _, rt := range apiRoutes(testAdmin(t, db, testPolicy, testLogger(t), nil)) {
		method, path := concrete(rt.pattern, 1)
		if method != "POST" && method != "PATCH" {
			continue
		}
		bodies, names := []string{`[]`, `"x"`, `7`, `null`, `{"a": [}`}, fields
		if _, answer := callAs(t, srv, testToken, method, path, `{"not_a_field": 1}`); !strings.Contains(string(answer), `unknown field \"not_a_field\"`) {
			names = nil // the route reads no body
		}
		for _, name := range names {
			for _, v := range values {
				bodies = append(bodies, fmt.Sprintf(`{%q: %s}`, name, v))
			}
		}
		for _, body := range bodies {
			status, answer := callAs(t, srv, testToken, method, path, body)
			if goWords.Match(answer) {
				t.Errorf("%s %s %s = %d %s: names Go", method, path, body, status, answer)
			}
			if strings.Contains(string(answer), ": want ") {
				typed++
			}
		}
	}
	if typed < 100 {
		t.Errorf("%d answers named a field's JSON type, want the walk to reach the routes' fields (100 at least)", typed)
	}
}

// One rule for ?limit= on every list: 1 up to the list's maximum; 0, a
// negative number or more than the maximum is a 400 that says the range.
func TestEveryListTakesOneLimitRule(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	for _, list := range []struct {
		path string
		most int
	}{
		{"/api/events", 500},
		{"/api/jobs", 500},
		{"/api/endpoints", 500},
		{"/api/subjects", 200},
		{"/api/audit", 500},
	} {
		for _, limit := range []string{"0", "-1", strconv.Itoa(list.most + 1), "ten"} {
			status, body := api.do("GET", list.path+"?limit="+limit, "")
			want := fmt.Sprintf("must be between 1 and %d", list.most)
			if status != http.StatusBadRequest || !strings.Contains(errorOf(t, body), want) {
				t.Errorf("%s?limit=%s: %d %s, want 400 saying %q", list.path, limit, status, body, want)
			}
		}
		for _, limit := range []string{"1", strconv.Itoa(list.most)} {
			if status, body := api.do("GET", list.path+"?limit="+limit, ""); status != http.StatusOK {
				t.Errorf("%s?limit=%s: %d %s, want 200", list.path, limit, status, body)
			}
		}
	}
}

// The inbox takes a body of exactly its bound, 1 MiB for a payload and
// 4 KiB for the webhook around it, and answers 413 to one byte more.
func TestInboxBodyBoundIsExact(t *testing.T) {
	t.Parallel()
	const bound = 1<<20 + 4<<10 // docs/inbox.md: 1,052,672 bytes
	if maxInboxBody != bound {
		t.Fatalf("maxInboxBody = %d, want %d", maxInboxBody, bound)
	}
	for _, doc := range []string{"docs/inbox.md", "docs/guarantees.md"} {
		if text := strings.Join(strings.Fields(readDoc(t, doc)), " "); !strings.Contains(text, "413 for a body over 1,052,672 bytes") && !strings.Contains(text, "413 over 1,052,672 bytes") ||
			strings.Contains(text, "413 over 1 MiB,") {
			t.Errorf("%s does not give the inbox's bound as 1,052,672 bytes", doc)
		}
	}
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	secret := api.createSource("billing", "")
	url := api.srv.URL + "/webhooks/billing"
	webhook := []byte(`{"type":"invoice.paid","data":{"cents":1200}}`)
	// JSON allows trailing white space: the body is a valid webhook of
	// exactly the size wanted, signed as sent.
	sized := func(n int) []byte { return append(bytes.Clone(webhook), bytes.Repeat([]byte(" "), n-len(webhook))...) }
	if status := postWebhook(t, url, secret, "at-bound", time.Now(), sized(bound), nil); status != http.StatusOK {
		t.Errorf("a body of exactly %d bytes: %d, want 200", bound, status)
	}
	if status := postWebhook(t, url, secret, "past-bound", time.Now(), sized(bound+1), nil); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a body of %d bytes: %d, want 413", bound+1, status)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.inbox`); n != 1 {
		t.Errorf("%d webhooks recorded, want the one at the bound", n)
	}
}

// Deleting an endpoint with deliveries waiting logs one line at info that
// counts them; the workers then end each without a request and without an
// error line apiece.
func TestDeletingAnEndpointLogsOnceNotPerDelivery(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	api := &testAPI{t: t, srv: newTestServerLogging(t, db, testPolicy, logger)}
	rc := newReceiver(t, nil)
	ep := api.createEndpoint(rc.srv.URL + "/gone")
	const waiting = 20
	for i := range waiting {
		record(t, db, "t", strconv.Itoa(i))
	}
	relayAll(t, db)
	if status, body := api.do("DELETE", "/api/endpoints/"+itoa(ep.ID), ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", status, body)
	}

	cfg := defaultConfig().Workers
	cfg.PollInterval, cfg.Concurrency = 20*time.Millisecond, 8
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	wp := newWorkerPool(db, cfg, time.Minute, newSubscriberRegistry(),
		map[string]jobHandler{webhookJobKind: newWebhookSender(db, nil, client, nil, nil, logger).deliver}, logger)
	runUntilTestEnds(t, wp)
	waitFor(t, "every delivery of the deleted endpoint to end", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'discarded'`) == waiting
	})

	log := logs.String()
	deleted := regexp.MustCompile(`(?m)^.*level=INFO msg="endpoint deleted.*$`).FindAllString(log, -1)
	if len(deleted) != 1 || !strings.Contains(deleted[0], "endpoint_id="+itoa(ep.ID)) || !strings.Contains(deleted[0], "deliveries="+strconv.Itoa(waiting)) {
		t.Errorf("delete log lines %q, want one at INFO with endpoint_id=%d deliveries=%d", deleted, ep.ID, waiting)
	}
	if n := strings.Count(log, "level=ERROR"); n != 0 {
		t.Errorf("%d ERROR lines for the deleted endpoint's deliveries, want none:\n%s", n, log)
	}
	if n := len(rc.requests()); n != 0 {
		t.Errorf("the deleted endpoint's receiver got %d requests, want none", n)
	}
}

// runUntilTestEnds runs wp until the test ends.
func runUntilTestEnds(t *testing.T, wp *workerPool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wp.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
}

// BenchmarkDecodeEventBody is decodeJSON on bodies of POST /api/events, the
// hot path every check of a body's text runs on: a small event, 1 MiB of
// small objects, and 1 MiB of text that is not ASCII.
//
//	go test -run '^$' -bench DecodeEventBody -count 10 .
func BenchmarkDecodeEventBody(b *testing.B) {
	objects := `{"topic": "order.paid", "subject": "order-1", "payload": [` +
		strings.TrimSuffix(strings.Repeat(`{"sku": "A-100", "qty": 2, "ok": true},`, 1<<20/40), ",") + `]}`
	text := `{"topic": "order.paid", "subject": "order-1", "payload": {"notes": [` +
		strings.TrimSuffix(strings.Repeat(`"Grüße aus Köln, 東京の注文 🚀 \u00e9\ud83d\ude00",`, 1<<20/64), ",") + `]}}`
	for _, tc := range []struct{ name, body string }{
		{"small", `{"topic": "order.paid", "subject": "order-1234", "payload": {"order_id": 1234, "customer": "c-88", "amount_cents": 4200, "currency": "EUR", "lines": [{"sku": "A-100", "qty": 2}, {"sku": "B-7", "qty": 1}], "note": "leave at the door"}}`},
		{"objects_1MiB", objects},
		{"text_1MiB", text},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var req struct {
				Topic   string          `json:"topic"`
				Subject string          `json:"subject"`
				Payload json.RawMessage `json:"payload"`
			}
			b.SetBytes(int64(len(tc.body)))
			for b.Loop() {
				r, _ := http.NewRequest("POST", "/api/events", strings.NewReader(tc.body))
				if err := decodeJSON(r, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
