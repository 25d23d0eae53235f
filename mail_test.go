// mail_test.go: mail delivery against a real SMTP peer on loopback, mail
// without a server, and owner notifications with their hourly cap.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/mail"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"
)

// smtpMessage is one message the peer was given after DATA.
type smtpMessage struct {
	From, To string
	Data     []byte
	Accepted bool // false: the peer answered 451 to it
}

// smtpPeer is a small SMTP server on loopback: it speaks EHLO/HELO, MAIL,
// RCPT, DATA, RSET, NOOP and QUIT, keeps every message, and answers 451
// after DATA to the first rejectFirst messages.
type smtpPeer struct {
	ln          net.Listener
	rejectFirst int
	mu          sync.Mutex // protects msgs
	msgs        []smtpMessage
	wg          sync.WaitGroup
}

func newSMTPPeer(t *testing.T, rejectFirst int) *smtpPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &smtpPeer{ln: ln, rejectFirst: rejectFirst}
	p.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serve(conn) })
		}
	})
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *smtpPeer) url() string { return "smtp://" + p.ln.Addr().String() }

func (p *smtpPeer) serve(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	tp := textproto.NewConn(conn)
	reply := func(format string, args ...any) bool { return tp.PrintfLine(format, args...) == nil }
	if !reply("220 peer.test ESMTP") {
		return
	}
	var from, to string
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			tp.PrintfLine("250-peer.test")
			reply("250 8BITMIME")
		case "HELO", "NOOP":
			reply("250 ok")
		case "RSET":
			from, to = "", ""
			reply("250 ok")
		case "MAIL":
			from = angleAddr(arg)
			reply("250 ok")
		case "RCPT":
			to = angleAddr(arg)
			reply("250 ok")
		case "DATA":
			reply("354 go ahead")
			data, err := tp.ReadDotBytes()
			if err != nil {
				return
			}
			p.mu.Lock()
			accepted := len(p.msgs) >= p.rejectFirst
			p.msgs = append(p.msgs, smtpMessage{From: from, To: to, Data: data, Accepted: accepted})
			p.mu.Unlock()
			if accepted {
				reply("250 queued")
			} else {
				reply("451 try again later")
			}
		case "QUIT":
			reply("221 bye")
			return
		default:
			reply("502 unknown command")
		}
	}
}

// angleAddr is the address in "FROM:<a@b.c> BODY=8BITMIME".
func angleAddr(arg string) string {
	_, rest, _ := strings.Cut(arg, "<")
	addr, _, _ := strings.Cut(rest, ">")
	return addr
}

func (p *smtpPeer) messages() []smtpMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]smtpMessage(nil), p.msgs...)
}

func (p *smtpPeer) accepted() int {
	n := 0
	for _, m := range p.messages() {
		if m.Accepted {
			n++
		}
	}
	return n
}

// runMailWorkers runs a worker pool that delivers webhooks and mail and
// owner notifications, until the test ends; mail nil means no SMTP.
func runMailWorkers(t *testing.T, db *sql.DB, m *mailer, perHour int, logger io.Writer) *ownerNotifier {
	t.Helper()
	log := testLogger(t)
	if logger != nil {
		log = newLogger(Config{LogFormat: "text"}, io.MultiWriter(logger, testWriter{t}))
	}
	cfg := defaultConfig().Workers
	cfg.PollInterval = 20 * time.Millisecond
	cfg.Concurrency = 4
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 10 * time.Second})
	sender := newWebhookSender(db, nil, client, nil, m, log)
	notifier := newOwnerNotifier(db, m, perHour, log)
	wp := newWorkerPool(db, cfg, time.Minute, newSubscriberRegistry(), map[string]jobHandler{webhookJobKind: sender.deliver, ownerNotifyJobKind: notifier.notify}, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wp.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	return notifier
}

func testMailer(t *testing.T, peer *smtpPeer) *mailer {
	t.Helper()
	cfg := MailConfig{SMTPURL: peer.url(), From: "outboxd@mail.example.org", OwnerNotifyPerHour: 5}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return newMailer(cfg)
}

// kickRetries makes every waiting retry due now, so tests skip backoffs
// rather than wait them out.
func kickRetries(t *testing.T, db *sql.DB) {
	t.Helper()
	mustExec(t, db, `UPDATE outbox.jobs SET scheduled_at = now() WHERE state = 'retryable'`)
}

// A mailto: endpoint gets its event by mail with Message-ID <event id@host>;
// a refused first attempt is retried (send, then mark) with the very same
// Message-ID, so the mailbox can merge the two.
func TestMailEndpointSendsWithEventMessageID(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	peer := newSMTPPeer(t, 1)
	ep := api.createEndpoint("mailto:ops@example.com", "order.*")
	if ep.URL != "mailto:ops@example.com" {
		t.Fatalf("endpoint url %q", ep.URL)
	}
	eventID := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	job := webhookJob(t, db, eventID, ep.ID)
	runMailWorkers(t, db, testMailer(t, peer), 5, nil)

	waitFor(t, "the mail to be sent", 10*time.Second, func() bool {
		kickRetries(t, db)
		return readJob(t, db, job).State == "completed"
	})
	if r := readJob(t, db, job); r.Attempt != 2 || r.Errors != 1 {
		t.Errorf("completed on attempt %d with %d errors, want 2 and 1 (the 451)", r.Attempt, r.Errors)
	}
	msgs := peer.messages()
	if len(msgs) != 2 || msgs[0].Accepted || !msgs[1].Accepted {
		t.Fatalf("peer got %d messages (%+v), want a refused one and an accepted one", len(msgs), msgs)
	}
	wantID := fmt.Sprintf("<%d@mail.example.org>", eventID)
	for i, m := range msgs {
		msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if got := msg.Header.Get("Message-ID"); got != wantID {
			t.Errorf("message %d: Message-ID %q, want %q", i, got, wantID)
		}
		if m.From != "outboxd@mail.example.org" || m.To != "ops@example.com" || msg.Header.Get("To") != "<ops@example.com>" {
			t.Errorf("message %d: envelope %s → %s, To %q", i, m.From, m.To, msg.Header.Get("To"))
		}
		body, _ := io.ReadAll(msg.Body)
		if subject := msg.Header.Get("Subject"); !strings.Contains(subject, "order.paid") || !strings.Contains(string(body), `"subject": "o-1"`) {
			t.Errorf("message %d: subject %q, body %q", i, subject, body)
		}
	}
	if s := api.endpoint(ep.ID).State; s != "enabled" {
		t.Errorf("endpoint %s after the mail went through, want enabled", s)
	}
}

// Without an SMTP server a mail job completes at once, says so in the log
// and in its delivery record, and raises no alert; an owner notification
// the same.
func TestMailWithoutSMTPCompletesAndLogs(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := api.createEndpoint("mailto:ops@example.com")
	var logs syncBuffer
	runMailWorkers(t, db, nil, 5, &logs)
	eventID := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	job := webhookJob(t, db, eventID, ep.ID)
	mustExec(t, db, `UPDATE outbox.endpoints SET owner_email = 'owner@example.com', failing_since = now() WHERE id = $1`, ep.ID)
	relayAll(t, db)
	notify := queryInt(t, db, `SELECT id FROM outbox.jobs WHERE kind = 'owner-notify'`)

	waitFor(t, "both jobs to complete", 10*time.Second, func() bool {
		return readJob(t, db, job).State == "completed" && readJob(t, db, int64(notify)).State == "completed"
	})
	var note string
	if err := db.QueryRow(`SELECT error FROM outbox.deliveries WHERE job_id = $1`, job).Scan(&note); err != nil || note != noSMTPNote {
		t.Errorf("delivery note %q (%v), want %q", note, err, noSMTPNote)
	}
	for _, want := range []string{"mail not sent: no SMTP server configured", "owner not notified: no SMTP server configured"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log does not say %q", want)
		}
	}
	o, err := readOverview(context.Background(), db, defaultConfig().Alerts)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Alerts) != 0 {
		t.Errorf("alerts %v, want none", alertNamesOf(o.Alerts))
	}
}

// An endpoint's owner notification with nothing to send it through (no
// SMTP server) or no one to send it to (no owner address) completes, is
// logged at Info saying why, and is never called delivered: the events
// list badges it "not sent", the event's page shows why, and the jobs
// API answers it in not_sent.
func TestOwnerNotificationNotSentShowsWhy(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestServer(t, db, testPolicy)
	api := &testAPI{t: t, srv: srv}
	owned := api.createEndpoint("http://127.0.0.1:9/owned")
	ownerless := api.createEndpoint("http://127.0.0.1:9/ownerless")
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(owned.ID), `{"owner_email": "owner@example.com"}`); status != http.StatusOK {
		t.Fatalf("set owner: %d %s", status, body)
	}
	var logs syncBuffer
	runMailWorkers(t, db, nil, 5, &logs) // no SMTP server
	mustExec(t, db, `UPDATE outbox.endpoints SET failing_since = now() WHERE id IN ($1, $2)`, owned.ID, ownerless.ID)
	relayAll(t, db)
	waitFor(t, "both notifications to end", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE kind = 'owner-notify' AND outcome = 'completed'`) == 2
	})
	for _, want := range []string{
		`level=INFO msg="owner not notified: no SMTP server configured"`,
		`level=INFO msg="owner not notified: the endpoint has no owner address"`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %s", want)
		}
	}

	_, events := panelPage(t, srv, "/events?topic=outboxd.endpoint.failing")
	if strings.Contains(events, `badge-ok">delivered`) {
		t.Errorf("the events list calls a notification that was not sent delivered:\n%s", events)
	}
	if n := strings.Count(events, `<span class="badge badge-warn">1 not sent</span> <code>owner-notify</code>`); n != 2 {
		t.Errorf("the events list badges %d notifications not sent, want 2:\n%s", n, events)
	}
	for ep, note := range map[int64]string{owned.ID: noSMTPNote, ownerless.ID: noOwnerAddressNote} {
		eventID := queryInt(t, db, `SELECT id FROM outbox.events WHERE topic = 'outboxd.endpoint.failing' AND subject = $1`, itoa(ep))
		_, page := panelPage(t, srv, fmt.Sprintf("/events/%d", eventID))
		if want := `<td class="state-not-sent">` + html.EscapeString(note) + `</td>`; !strings.Contains(page, want) {
			t.Errorf("event %d's page does not show its notification as %s:\n%s", eventID, want, page)
		}
		status, body := api.do("GET", fmt.Sprintf("/api/jobs?event_id=%d", eventID), "")
		var answer struct{ Jobs []JobView }
		jobs := &answer.Jobs
		if err := json.Unmarshal(body, &answer); status != http.StatusOK || err != nil || len(*jobs) != 1 || (*jobs)[0].NotSent != note {
			t.Errorf("GET /api/jobs?event_id=%d: %d %s, want one job with not_sent %q", eventID, status, body, note)
		}
	}
}

// toggleFailing makes endpoint id go from enabled to failing n times; each
// transition records one outboxd.endpoint.failing event.
func toggleFailing(t *testing.T, db *sql.DB, id int64, n int) {
	t.Helper()
	for range n {
		mustExec(t, db, `UPDATE outbox.endpoints SET failing_since = now() WHERE id = $1`, id)
		mustExec(t, db, `UPDATE outbox.endpoints SET failing_since = NULL WHERE id = $1`, id)
	}
}

// An endpoint's first failure, through a real delivery, notifies its
// owner; with five more transitions in the hour, the sixth mail is
// dropped: logged, counted for /metrics, its job completed with the
// reason, its event still in the stream. No notification is delivered as
// a webhook, to this endpoint or any.
func TestOwnerNotificationsCappedPerHour(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	peer := newSMTPPeer(t, 0)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
	})
	ep := api.createEndpoint(rc.srv.URL) // every topic
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"owner_email": "owner@example.com"}`); status != http.StatusOK {
		t.Fatalf("set owner: %d %s", status, body)
	}
	var logs syncBuffer
	notifier := runMailWorkers(t, db, testMailer(t, peer), 5, &logs)

	first := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	firstJob := webhookJob(t, db, first, ep.ID)
	waitFor(t, "the delivery to fail, then succeed", 10*time.Second, func() bool {
		kickRetries(t, db)
		return readJob(t, db, firstJob).State == "completed"
	})
	toggleFailing(t, db, ep.ID, 5)
	relayAll(t, db)

	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE topic = 'outboxd.endpoint.failing' AND subject = $1`, itoa(ep.ID)); n != 6 {
		t.Fatalf("%d failing events, want 6", n)
	}
	// The drop is counted just after its job completes: wait for both.
	waitFor(t, "six notifications to end", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE kind = 'owner-notify' AND outcome = 'completed'`) == 6 &&
			int(notifier.dropped.Load())+peer.accepted() >= 6
	})
	if n := peer.accepted(); n != 5 {
		t.Errorf("owner got %d mails, want 5", n)
	}
	if n := notifier.dropped.Load(); n != 1 {
		t.Errorf("%d notifications counted dropped, want 1", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE kind = 'owner-notify' AND outcome = 'completed'
		AND error LIKE 'not sent: owner@example.com already got 5 notifications%'`); n != 1 {
		t.Errorf("%d deliveries carry the drop's note, want 1", n)
	}
	if !strings.Contains(logs.String(), "owner notification dropped: over the hourly cap") {
		t.Error("the drop is not logged")
	}
	var metrics strings.Builder
	if err := writeMetrics(&metrics, Overview{}, &processCounters{notifier: notifier}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics.String(), "outboxd_owner_notifications_dropped_total 1\n") {
		t.Errorf("metrics do not count the drop:\n%s", metrics.String())
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs j JOIN outbox.events e ON e.id = j.event_id WHERE j.kind = 'webhook' AND e.topic LIKE 'outboxd.%'`); n != 0 {
		t.Errorf("%d notifications fanned out as webhooks, want 0", n)
	}
	for _, m := range peer.messages() {
		msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
		if err != nil {
			t.Fatal(err)
		}
		if m.To != "owner@example.com" || !strings.Contains(msg.Header.Get("Subject"), fmt.Sprintf("endpoint %d is failing", ep.ID)) {
			t.Errorf("mail to %s, subject %q", m.To, msg.Header.Get("Subject"))
		}
	}
}

// A notification whose mail is refused is retried in the slot it took:
// with a cap of 2, two notifications are both sent although one needed two
// attempts, and only a third is dropped.
func TestOwnerNotificationRetryKeepsItsSlot(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	peer := newSMTPPeer(t, 1)
	ep := api.createEndpoint("http://127.0.0.1:9/unused")
	mustExec(t, db, `UPDATE outbox.endpoints SET owner_email = 'owner@example.com' WHERE id = $1`, ep.ID)
	notifier := runMailWorkers(t, db, testMailer(t, peer), 2, nil)

	toggleFailing(t, db, ep.ID, 2)
	relayAll(t, db)
	waitFor(t, "two notifications to be sent", 10*time.Second, func() bool {
		kickRetries(t, db)
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE kind = 'owner-notify' AND outcome = 'completed'`) == 2
	})
	if n := queryInt(t, db, `SELECT max(attempt) FROM outbox.deliveries WHERE kind = 'owner-notify'`); n != 2 {
		t.Errorf("the most attempts of a notification is %d, want 2 (one retry)", n)
	}
	if got, want := []int{peer.accepted(), len(peer.messages()), int(notifier.dropped.Load())}, []int{2, 3, 0}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("accepted, offered, dropped = %v, want %v", got, want)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.owner_notify_slots`); n != 2 {
		t.Errorf("%d slots taken, want 2: a retry keeps its slot", n)
	}

	toggleFailing(t, db, ep.ID, 1)
	relayAll(t, db)
	waitFor(t, "the third notification to end", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE kind = 'owner-notify' AND outcome = 'completed'`) == 3 &&
			int(notifier.dropped.Load())+peer.accepted() >= 3
	})
	if n := notifier.dropped.Load(); n != 1 || peer.accepted() != 2 {
		t.Errorf("after a third: %d dropped, %d sent; want 1 and 2", n, peer.accepted())
	}
}

// Mail endpoints take exactly one bare address; the http(s) rules stay.
func TestMailtoEndpointValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url  string
		want string // normalised; "" means refused
	}{
		{"mailto:ops@example.com", "mailto:ops@example.com"},
		{"MAILTO:ops@example.com", "mailto:ops@example.com"},
		{"mailto:", ""},
		{"mailto:ops@example.com,cfo@example.com", ""},
		{"mailto:ops@example.com?cc=cfo@example.com", ""},
		{"mailto:ops@example.com?", ""},
		{"mailto:ops@example.com#x", ""},
		{"mailto:Ops <ops@example.com>", ""},
		{"mailto:not-an-address", ""},
		{"mailto:ops@example.com%0d%0aBcc:x@example.com", ""},
	} {
		url := tc.url
		in := endpointInput{URL: &url}
		err := in.validate(false)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("%q accepted as %q, want refused", tc.url, *in.URL)
		case tc.want != "" && (err != nil || *in.URL != tc.want):
			t.Errorf("%q: %v, %q; want %q", tc.url, err, *in.URL, tc.want)
		}
	}
}

// The mail settings parse, default the Message-ID host to the sender's
// domain, and refuse bad values by name without echoing a password.
func TestMailSettings(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig(nil, envFrom(map[string]string{
		"OUTBOXD_SMTP_URL":  "smtps://user:s3cret@smtp.example.com",
		"OUTBOXD_SMTP_FROM": "outboxd@example.com",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m := newMailer(cfg.Mail)
	if got := m.messageID(42); got != "<42@example.com>" {
		t.Errorf("Message-ID %q, want <42@example.com>", got)
	}
	if cfg.Mail.OwnerNotifyPerHour != 5 {
		t.Errorf("owner-notify-per-hour %d, want 5", cfg.Mail.OwnerNotifyPerHour)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OUTBOXD_SMTP_URL": "smtp://u:s3cret@h"}, "-smtp-from (OUTBOXD_SMTP_FROM) is required"},
		{map[string]string{"OUTBOXD_SMTP_URL": "http://u:s3cret@h", "OUTBOXD_SMTP_FROM": "a@b.c"}, "-smtp-url (OUTBOXD_SMTP_URL) must start with smtp://"},
		{map[string]string{"OUTBOXD_SMTP_FROM": "Name <a@b.c>"}, "-smtp-from (OUTBOXD_SMTP_FROM)"},
		{map[string]string{"OUTBOXD_OWNER_NOTIFY_PER_HOUR": "0"}, "-owner-notify-per-hour (OUTBOXD_OWNER_NOTIFY_PER_HOUR)"},
	} {
		_, err := parseConfig(nil, envFrom(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v: %v, want an error naming %q without the password", tc.env, err, tc.want)
		}
	}
}
