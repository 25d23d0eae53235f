// answers_test.go: what a failed request is told. A body that stalls gets
// a 408, not a 499 with the socket's addresses; the database's refusal of
// a value names the field and its rule, never the driver's text; a server
// error names the operation, not its cause.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// A client that sends its headers and part of its body, then waits past
// the server's read timeout, is still there: it reads a 408 with a plain
// message, without the socket's addresses or error, on the API and on
// the inbox alike.
func TestStalledBodyAnswers408WithoutAddresses(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	addr := serveShortLimitsForTest(t, testRoutes(t, db, testPolicy, testLogger(t), nil))
	mustExec(t, db, `INSERT INTO outbox.inbox_sources (name, secret, topic_prefix) VALUES ('shop', decode(repeat('ab', 32), 'hex'), 'shop.')`)
	for _, head := range []string{
		"POST /api/events HTTP/1.1\r\nHost: outboxd\r\nAuthorization: Bearer " + testToken + "\r\n",
		"POST /webhooks/shop HTTP/1.1\r\nHost: outboxd\r\n",
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// 100 bytes announced, 12 sent; the rest never comes.
		if _, err := io.WriteString(conn, head+"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"topic\": \"o"); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // far above the server's 600 ms
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: read the answer: %v", strings.Fields(head)[1], err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		msg := errorOf(t, body)
		if resp.StatusCode != http.StatusRequestTimeout || msg != "request body not received within the server's read timeout" {
			t.Errorf("%s: %d %s, want 408 saying the body was not received in time", strings.Fields(head)[1], resp.StatusCode, body)
		}
		local, remote := conn.LocalAddr().String(), conn.RemoteAddr().String()
		for _, leak := range []string{local, remote, "127.0.0.1", "i/o timeout", "read tcp"} {
			if strings.Contains(string(body), leak) {
				t.Errorf("%s: the answer %s tells %q", strings.Fields(head)[1], body, leak)
			}
		}
	}
}

// The database's refusal of a value the client gave maps to a message
// naming the field and its rule, whatever the driver said: a table of
// real refusals, each made by PostgreSQL through the code that writes the
// value.
func TestDriverRefusalsNameTheField(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	record := func(payload string) error {
		_, err := recordEvent(ctx, db, "order.paid", "s", json.RawMessage(payload))
		return err
	}
	endpoint := func(edit func(*endpointInput)) error {
		url := "https://hooks.example.com/"
		in := endpointInput{URL: &url}
		edit(&in)
		_, err := createEndpoint(ctx, db, nil, in, newWebhookSecret())
		return err
	}
	text := func(s string) *string { return &s }
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"a lone surrogate in the payload", record(`{"s": "\ud800"}`),
			"payload: not valid for its type (for JSON: a lone UTF-16 surrogate escape)"},
		{"an escaped NUL in the payload", record(`{"s": "a\u0000b"}`),
			`payload: \u0000 is not allowed (PostgreSQL's text and jsonb hold no NUL)`},
		{"a payload over 1 MiB as stored", record(`{"s": "` + incompressible(1<<20+100) + `"}`),
			"payload: at most 1 MiB (1,048,576 bytes) as PostgreSQL stores it"},
		{"a description over 1000 characters", endpoint(func(in *endpointInput) { in.Description = text(strings.Repeat("d", 1001)) }),
			"description: at most 1000 characters"},
		{"a max_in_flight out of range", endpoint(func(in *endpointInput) { n := 5000; in.MaxInFlight = &n }),
			"max_in_flight: 1 to 1000"},
		{"an unknown ordering", endpoint(func(in *endpointInput) { in.Ordering = text("random") }),
			`ordering: "none" or "subject"`},
		{"a NUL in a text field", endpoint(func(in *endpointInput) { in.OwnerEmail = text("a\x00@example.com") }),
			"request: must be UTF-8 text without NUL"},
		{"a NOT NULL column", func() error {
			_, err := db.Exec(`INSERT INTO outbox.events (topic) VALUES (NULL)`)
			return err
		}(), "topic: required"},
	} {
		if pq.As(tc.err) == nil {
			t.Errorf("%s: %v, want the database's refusal", tc.name, tc.err)
			continue
		}
		status, msg := answerOf(fmt.Errorf("operation: %w", tc.err))
		if diff := cmp.Diff(fmt.Sprint(http.StatusBadRequest, " ", tc.want), fmt.Sprint(status, " ", msg)); diff != "" {
			t.Errorf("%s (%v): answer (-want +got):\n%s", tc.name, tc.err, diff)
		}
		if strings.Contains(msg, "pq:") || strings.Contains(msg, pq.As(tc.err).Constraint+" ") && pq.As(tc.err).Constraint != "" {
			t.Errorf("%s: the answer %q tells the driver's text", tc.name, msg)
		}
	}
}

// Every constraint constraintRules names is one schema.sql makes, so no
// rule outlives a renamed constraint unnoticed.
func TestConstraintRulesNameSchemaConstraints(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	for name := range constraintRules {
		if n := queryInt(t, db, `SELECT count(*) FROM pg_constraint WHERE conname = $1 AND contype = 'c' AND connamespace = 'outbox'::regnamespace`, name); n != 1 {
			t.Errorf("constraintRules names %s, which schema.sql does not make (%d CHECKs by that name)", name, n)
		}
	}
}

// Through the API, the refusals of an event's payload, the database's and
// the one decodeJSON makes first (a lone surrogate), answer 400 naming the
// payload and the rule, and a failed query answers 500 naming the
// operation: never the driver's text.
func TestAPIAnswersTellNoDriverText(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	for _, tc := range []struct {
		payload, want string
	}{
		{`{"s": "\ud800"}`, `payload.s: \ud800 is a lone UTF-16 surrogate; a character past U+FFFF is escaped as a high-low pair`},
		{`{"s": "a\u0000b"}`, `payload: \u0000 is not allowed (PostgreSQL's text and jsonb hold no NUL)`},
		{`{"s": "` + incompressible(1<<20+100) + `"}`, "payload: at most 1 MiB (1,048,576 bytes) as PostgreSQL stores it"},
	} {
		status, body := api.do("POST", "/api/events", `{"topic": "order.paid", "payload": `+tc.payload+`}`)
		if msg := errorOf(t, body); status != http.StatusBadRequest || msg != tc.want {
			t.Errorf("payload %s: %d %q, want 400 %q", truncate(tc.payload, 40), status, truncate(msg, 200), tc.want)
		}
	}
	mustExec(t, db, `ALTER TABLE outbox.inbox_sources RENAME TO inbox_sources_gone`)
	status, body := api.do("GET", "/api/sources", "")
	if msg := errorOf(t, body); status != http.StatusInternalServerError || msg != "list sources: database error" {
		t.Errorf("GET /api/sources without its table: %d %s, want 500 saying list sources: database error", status, body)
	}
}

// A server error tells the operation that failed and what kind of cause,
// never the cause's text: no SQLSTATE message, no address.
func TestServerErrorsTellTheOperationNotTheCause(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5432}, Err: errors.New("connection refused")}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("read overview: %w", dial), "read overview: network error"},
		{fmt.Errorf("count: %w", &pq.Error{Code: "57P01", Message: "terminating connection due to administrator command"}), "count: database error"},
		{fmt.Errorf("connect: %w; gave up", dial), "internal error: network error"},
		{errors.New("replay: no workers"), "replay: no workers"},
	} {
		status, msg := answerOf(tc.err)
		if status != http.StatusInternalServerError || msg != tc.want {
			t.Errorf("answerOf(%q) = %d %q, want 500 %q", tc.err, status, msg, tc.want)
		}
	}
}

// errorOf is the message of an {"error": "..."} answer.
func errorOf(t *testing.T, body []byte) string {
	t.Helper()
	var answer struct{ Error string }
	if err := json.Unmarshal(body, &answer); err != nil {
		t.Fatalf("answer %q is not {\"error\": ...}: %v", body, err)
	}
	return answer.Error
}
