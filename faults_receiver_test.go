// faults_receiver_test.go: the fault suite's receivers. One HTTP server
// takes every webhook endpoint's requests and verifies each signature; it
// passes the chain endpoint's on, as received, to outboxd's own inbox. An
// SMTP sink takes the mail endpoint's messages. Both log what they got as
// the checker reads it (faults_checker_test.go), and both obey the
// receiver faults: answer 500 (451 to a mail), hang, close the
// connection, hold one process's requests, or be down.

package main

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/quotedprintable"
	"net"
	"net/http"
	"net/mail"
	"net/textproto"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// faultChainEndpoint's requests go on to the inbox source
	// faultChainSource of a live replica: outboxd sending to itself, as
	// two chained outboxd do.
	faultChainEndpoint = "chain"
	faultChainSource   = "faults"
	// faultMailEndpoint is the mailto: endpoint, whose messages the SMTP
	// sink takes. Its Message-IDs are <event id@faultMailHost>, the
	// domain of the replicas' -smtp-from.
	faultMailEndpoint = "mail"
	faultMailHost     = "mail.faults.test"
)

// receiverMode is how the receivers treat a request.
type receiverMode int

const (
	modeNormal receiverMode = iota // accept: 200 (250 to a mail)
	mode500                        // answer 500 (451 to a mail)
	modeHang                       // answer nothing until the sender gives up
	modeClose                      // close the connection without an answer
	modeHold                       // hold requests from one process until released, then accept
)

// faultPair is one business row's event of one topic at one endpoint.
type faultPair struct{ endpoint, key, topic string }

// faultReceiver is the webhook receiver: an HTTP server on a fixed port
// that can be taken down and brought back, and that logs every request,
// the SMTP sink's included.
type faultReceiver struct {
	t    *testing.T
	addr string
	port int
	// forwardTo lists the replicas' addresses, for the chain: they
	// change as replicas restart.
	forwardTo func() []string
	client    *http.Client

	mu       sync.Mutex // protects the fields below
	srv      *http.Server
	secrets  map[string][]byte
	log      []faultDelivery
	accepted map[faultPair]bool
	mode     receiverMode
	servedBy map[receiverMode]int // requests taken in each mode
	holdPID  int
	held     chan struct{} // closed when the first request is held
	heldN    int
	unheld   chan struct{} // closed to let held requests through
}

func newFaultReceiver(t *testing.T, forwardTo func() []string) *faultReceiver {
	rc := &faultReceiver{t: t, forwardTo: forwardTo, client: &http.Client{Timeout: 5 * time.Second},
		secrets: map[string][]byte{}, accepted: map[faultPair]bool{}, servedBy: map[receiverMode]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc.addr = ln.Addr().String()
	rc.port = ln.Addr().(*net.TCPAddr).Port
	rc.serve(ln)
	t.Cleanup(func() {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.srv.Close()
	})
	return rc
}

func (rc *faultReceiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: rc, ErrorLog: nil}
	rc.mu.Lock()
	rc.srv = srv
	rc.mu.Unlock()
	go srv.Serve(ln)
}

// down closes the listener and every connection, answered or not.
func (rc *faultReceiver) down() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.srv.Close()
}

// up listens again on the same port.
func (rc *faultReceiver) up() {
	rc.serve(relisten(rc.t, rc.addr))
}

// relisten listens on addr again, once the port is free.
func relisten(t *testing.T, addr string) net.Listener {
	var ln net.Listener
	var err error
	for range 100 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln
		}
		time.Sleep(50 * time.Millisecond) // the port may take a moment to free
	}
	t.Fatalf("receiver up again on %s: %v", addr, err)
	return nil
}

func (rc *faultReceiver) setSecret(endpoint string, key []byte) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.secrets[endpoint] = key
}

func (rc *faultReceiver) setMode(m receiverMode, pid int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.mode, rc.holdPID = m, pid
}

// hold makes the receivers hold every request from process pid; the
// channel closes when the first one is held.
func (rc *faultReceiver) hold(pid int) <-chan struct{} {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.mode, rc.holdPID, rc.heldN = modeHold, pid, 0
	rc.held, rc.unheld = make(chan struct{}), make(chan struct{})
	return rc.held
}

// release lets held requests through (accepted) and returns to normal. It
// returns how many were held.
func (rc *faultReceiver) release() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.mode = modeNormal
	close(rc.unheld)
	return rc.heldN
}

// served is how many requests the receivers have taken in mode m.
func (rc *faultReceiver) served(m receiverMode) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.servedBy[m]
}

func (rc *faultReceiver) deliveries() []faultDelivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.log)
}

func (rc *faultReceiver) acceptedPairs() map[faultPair]bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[faultPair]bool, len(rc.accepted))
	for k := range rc.accepted {
		out[k] = true
	}
	return out
}

// take decides how to treat a request that came from remote to the
// receiver listening on port, and counts it: the mode in force, except
// that a hold holds only the held process's requests. For a hold it also
// returns the channel that releases them.
func (rc *faultReceiver) take(remote string, port int) (receiverMode, <-chan struct{}) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	mode := rc.mode
	if mode == modeHold {
		if owned, err := connOwnedBy(rc.holdPID, remote, port); err == nil && !owned {
			mode = modeNormal
		}
		// Where /proc cannot tell (not Linux), every request is held.
	}
	rc.servedBy[mode]++
	if mode == modeHold {
		if rc.heldN == 0 {
			close(rc.held)
		}
		rc.heldN++
	}
	return mode, rc.unheld
}

// record logs a request the receivers are done with.
func (rc *faultReceiver) record(d faultDelivery) {
	d.Finished = time.Now()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.log = append(rc.log, d)
	if d.Accepted {
		rc.accepted[faultPair{d.Endpoint, d.Key, d.Topic}] = true
	}
}

func (rc *faultReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 2<<20))
	d := readFaultWebhook(strings.TrimPrefix(r.URL.Path, "/hooks/"), r.Header, body)
	rc.mu.Lock()
	d.SigOK = verifyFaultSignature(rc.secrets[d.Endpoint], r.Header, body)
	rc.mu.Unlock()
	mode, unheld := rc.take(r.RemoteAddr, rc.port)
	switch mode {
	case mode500:
		d.Outcome = "500"
		http.Error(w, "injected failure", http.StatusInternalServerError)
	case modeHang:
		d.Outcome = "hung"
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	case modeClose:
		d.Outcome = "closed"
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	default:
		d.Outcome = "accepted"
		if mode == modeHold {
			<-unheld
			d.Outcome = "held"
		}
		status := http.StatusOK
		if d.Endpoint == faultChainEndpoint {
			status = rc.forward(r.Header, body)
			d.Outcome += fmt.Sprintf(", inbox %d", status)
		}
		d.Accepted = status/100 == 2
		w.WriteHeader(status)
	}
	rc.record(d)
}

// readFaultWebhook is a request to endpoint as the checker reads it.
func readFaultWebhook(endpoint string, h http.Header, body []byte) faultDelivery {
	var msg struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Subject string `json:"subject"`
		Data    struct {
			Key string `json:"key"`
			N   int    `json:"n"`
		} `json:"data"`
	}
	json.Unmarshal(body, &msg)
	return faultDelivery{
		Endpoint:  endpoint,
		WebhookID: h.Get("webhook-id"),
		BodyID:    msg.ID,
		Key:       msg.Data.Key,
		Subject:   msg.Subject,
		Topic:     msg.Type,
		N:         msg.Data.N,
		Arrived:   time.Now(),
	}
}

// forward passes a chain request, as received, to the inbox of the first
// replica that answers, and returns the inbox's status (502: none did).
// It runs to its end whatever the sender does meanwhile, as a receiver
// that has begun its work does: an answer the sender no longer waits
// for is the lost answer whose resend the inbox must absorb.
func (rc *faultReceiver) forward(h http.Header, body []byte) int {
	for _, addr := range rc.forwardTo() {
		req, err := http.NewRequest("POST", "http://"+addr+"/webhooks/"+faultChainSource, bytes.NewReader(body))
		if err != nil {
			continue
		}
		for _, k := range []string{"content-type", "webhook-id", "webhook-timestamp", "webhook-signature", "traceparent", "tracestate"} {
			if v := h.Get(k); v != "" {
				req.Header.Set(k, v)
			}
		}
		resp, err := rc.client.Do(req)
		if err != nil {
			continue // that replica is down, or was killed: the other one
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	return http.StatusBadGateway
}

// verifyFaultSignature checks a Standard Webhooks signature the way a
// receiver would, written here rather than borrowed from signature.go.
func verifyFaultSignature(key []byte, h http.Header, body []byte) bool {
	if len(key) == 0 {
		return false
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.", h.Get("webhook-id"), h.Get("webhook-timestamp"))
	mac.Write(body)
	want := []byte("v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), want) {
			return true
		}
	}
	return false
}

// faultMailSink is the mail endpoint's SMTP server. It speaks as
// smtpPeer does (mail_test.go), and after each DATA treats the message as
// the receiver treats a request (faultReceiver.take) and logs it there.
type faultMailSink struct {
	rc   *faultReceiver
	addr string
	port int

	mu    sync.Mutex // protects the fields below
	ln    net.Listener
	conns map[net.Conn]bool
}

func newFaultMailSink(t *testing.T, rc *faultReceiver) *faultMailSink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &faultMailSink{rc: rc, addr: ln.Addr().String(), port: ln.Addr().(*net.TCPAddr).Port, conns: map[net.Conn]bool{}}
	s.serve(ln)
	t.Cleanup(s.down)
	return s
}

func (s *faultMailSink) url() string { return "smtp://" + s.addr }

func (s *faultMailSink) serve(ln net.Listener) {
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[conn] = true
			s.mu.Unlock()
			go func() {
				s.session(conn)
				s.mu.Lock()
				delete(s.conns, conn)
				s.mu.Unlock()
				conn.Close()
			}()
		}
	}()
}

// down closes the listener and every connection, as the receiver's does.
func (s *faultMailSink) down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
}

// up listens again on the same port.
func (s *faultMailSink) up() {
	s.serve(relisten(s.rc.t, s.addr))
}

// session is one SMTP connection: EHLO/HELO, MAIL, RCPT, DATA, RSET,
// NOOP and QUIT.
func (s *faultMailSink) session(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(time.Minute))
	tp := textproto.NewConn(conn)
	if tp.PrintfLine("220 sink.faults.test ESMTP") != nil {
		return
	}
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb, _, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			tp.PrintfLine("250-sink.faults.test")
			tp.PrintfLine("250 8BITMIME")
		case "HELO", "NOOP", "RSET", "MAIL", "RCPT":
			tp.PrintfLine("250 ok")
		case "DATA":
			tp.PrintfLine("354 go ahead")
			data, err := tp.ReadDotBytes()
			if err != nil || !s.answer(conn, tp, data) {
				return
			}
		case "QUIT":
			tp.PrintfLine("221 bye")
			return
		default:
			tp.PrintfLine("502 unknown command")
		}
	}
}

// answer treats one message as the receiver treats a request, and logs
// it. It reports whether the connection goes on.
func (s *faultMailSink) answer(conn net.Conn, tp *textproto.Conn, data []byte) bool {
	d := readFaultMail(data)
	defer func() { s.rc.record(d) }()
	mode, unheld := s.rc.take(conn.RemoteAddr().String(), s.port)
	switch mode {
	case mode500:
		d.Outcome = "451"
		tp.PrintfLine("451 injected failure")
		return true
	case modeHang:
		d.Outcome = "hung"
		tp.ReadLine() // until the sender gives up and closes
		return false
	case modeClose:
		d.Outcome = "closed"
		return false
	}
	d.Outcome = "accepted"
	if mode == modeHold {
		<-unheld
		d.Outcome = "held"
	}
	d.Accepted = true
	tp.PrintfLine("250 queued")
	return true
}

// faultMailEvent is the first line of a mail's body (webhook.go,
// eventMail): its event's id, topic and subject.
var faultMailEvent = regexp.MustCompile(`^Event (\d+), (\S+), subject ("(?:[^"\\]|\\.)*"), recorded `)

// readFaultMail is a message as the checker reads it: its Message-ID's
// event id as the webhook-id, the body's "Event N" as the body's id, and
// the payload below it. A mail has no signature to verify.
func readFaultMail(data []byte) faultDelivery {
	d := faultDelivery{Endpoint: faultMailEndpoint, Arrived: time.Now(), SigOK: true}
	msg, err := mail.ReadMessage(bytes.NewReader(data))
	if err != nil {
		return d
	}
	d.WebhookID = strings.TrimSuffix(strings.TrimPrefix(msg.Header.Get("Message-ID"), "<"), "@"+faultMailHost+">")
	body, _ := io.ReadAll(quotedprintable.NewReader(msg.Body))
	head, payload, _ := strings.Cut(strings.ReplaceAll(string(body), "\r\n", "\n"), "\n\n")
	if m := faultMailEvent.FindStringSubmatch(head); m != nil {
		d.BodyID, d.Topic = m[1], m[2]
		d.Subject, _ = strconv.Unquote(m[3])
	}
	var p struct {
		Key string `json:"key"`
		N   int    `json:"n"`
	}
	json.Unmarshal([]byte(payload), &p)
	d.Key, d.N = p.Key, p.N
	return d
}

// connOwnedBy reports whether the TCP connection from remote (a request's
// RemoteAddr) to serverPort belongs to process pid: the socket's inode
// from /proc/net/tcp, looked for among pid's open files. Linux only; an
// error elsewhere.
func connOwnedBy(pid int, remote string, serverPort int) (bool, error) {
	_, portText, err := net.SplitHostPort(remote)
	if err != nil {
		return false, err
	}
	clientPort, err := strconv.Atoi(portText)
	if err != nil {
		return false, err
	}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return false, err
	}
	defer f.Close()
	inode := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		local, peer := fields[1], fields[2]
		if strings.HasSuffix(local, fmt.Sprintf(":%04X", clientPort)) && strings.HasSuffix(peer, fmt.Sprintf(":%04X", serverPort)) {
			inode = fields[9]
			break
		}
	}
	if inode == "" {
		return false, nil
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false, err
	}
	want := "socket:[" + inode + "]"
	for _, fd := range fds {
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && link == want {
			return true, nil
		}
	}
	return false, nil
}
