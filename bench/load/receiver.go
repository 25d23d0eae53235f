// receiver.go: the webhook receiver on loopback. It verifies every
// signature, dedupes on webhook-id and keeps each event's latency from
// its commit to its first 2xx; a scenario's receiver may answer otherwise
// and keep every request's span.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// receiver is one endpoint's receiver.
type receiver struct {
	srv    *http.Server
	url    string
	secret atomic.Pointer[webhookSecret]
	// answer, if set, says how to answer a request whose signature holds.
	answer    func(webhookID string) requestAnswer
	keepSpans bool
	closed    chan struct{} // closed by Close: waiting answers end

	mu        sync.Mutex // protects the fields below
	seen      map[string]bool
	latencies []time.Duration
	spans     []requestSpan // with keepSpans, in the order answers were written
	open      int           // with keepSpans: requests arrived and not answered yet
	maxOpen   int           // the most open at once
	dups      int64
	bad       int64
	changed   chan struct{} // closed and replaced on every new delivery
}

// requestSpan is one request as the receiver saw it: when it arrived,
// when the answer was written, and the answer's status.
type requestSpan struct {
	Start, End time.Time
	Status     int
	Claimed    time.Time // requestAnswer.Claimed
}

// requestAnswer is how a scenario's receiver answers one request: after
// Wait, with Status (0 or 2xx: accepted; otherwise a refusal, and the event
// stays undelivered). Claimed is when outboxd claimed the attempt, if the
// scenario looked it up (zero if not).
type requestAnswer struct {
	Wait    time.Duration
	Status  int
	Claimed time.Time
}

// startReceiver starts a receiver that answers as answer says (nil: 204
// at once) and, with keepSpans, keeps every request's span.
func startReceiver(answer func(webhookID string) requestAnswer, keepSpans bool) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	r := &receiver{url: "http://" + ln.Addr().String() + "/hook", seen: map[string]bool{}, changed: make(chan struct{}),
		answer: answer, keepSpans: keepSpans, closed: make(chan struct{})}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	arrived := time.Now()
	if r.keepSpans {
		r.mu.Lock()
		r.open++
		r.maxOpen = max(r.maxOpen, r.open)
		r.mu.Unlock()
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 2<<20))
	secret := r.secret.Load()
	if err != nil || secret == nil || verifyWebhook(*secret, req.Header, body, time.Now()) != nil {
		r.mu.Lock()
		r.bad++
		r.keepSpan(requestSpan{Start: arrived, Status: http.StatusUnauthorized})
		r.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	a := r.scenarioAnswer(req)
	if a.Status != 0 && a.Status/100 != 2 {
		r.mu.Lock()
		r.keepSpan(requestSpan{Start: arrived, Status: a.Status, Claimed: a.Claimed})
		r.mu.Unlock()
		w.WriteHeader(a.Status)
		return
	}
	r.accept(req.Header.Get("webhook-id"), body, requestSpan{Start: arrived, Status: http.StatusNoContent, Claimed: a.Claimed})
	w.WriteHeader(http.StatusNoContent)
}

// scenarioAnswer asks the scenario how to answer req, and waits as it says.
func (r *receiver) scenarioAnswer(req *http.Request) requestAnswer {
	if r.answer == nil {
		return requestAnswer{}
	}
	a := r.answer(req.Header.Get("webhook-id"))
	if a.Wait > 0 {
		t := time.NewTimer(a.Wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-req.Context().Done():
		case <-r.closed:
		}
	}
	return a
}

// accept notes a 2xx for webhook id: its latency if it is the event's
// first, a duplicate if not.
func (r *receiver) accept(id string, body []byte, sp requestSpan) {
	var msg struct {
		Timestamp time.Time `json:"timestamp"` // when the event was recorded
	}
	json.Unmarshal(body, &msg)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[id] {
		r.dups++
	} else {
		r.seen[id] = true
		r.latencies = append(r.latencies, time.Since(msg.Timestamp))
		close(r.changed)
		r.changed = make(chan struct{})
	}
	r.keepSpan(sp)
}

// keepSpan notes a request answered now. r.mu must be held.
func (r *receiver) keepSpan(sp requestSpan) {
	if r.keepSpans {
		sp.End = time.Now()
		r.spans = append(r.spans, sp)
		r.open--
	}
}

// MaxOpen is the most requests the receiver had open at once (keepSpans).
func (r *receiver) MaxOpen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxOpen
}

// AwaitIdle waits until no request is open (keepSpans), so that Spans
// holds every request made so far.
func (r *receiver) AwaitIdle(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		r.mu.Lock()
		open := r.open
		r.mu.Unlock()
		if open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d requests still open after %s", open, timeout)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// Spans are the requests answered so far, in answer order.
func (r *receiver) Spans() []requestSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// Latencies are the first-2xx latencies from the n-th delivered event on.
func (r *receiver) Latencies(from int) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.latencies[min(from, len(r.latencies)):])
}

// Unique is how many distinct events were accepted.
func (r *receiver) Unique() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(len(r.seen))
}

// Duplicates is how many 2xx went to an event already accepted.
func (r *receiver) Duplicates() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dups
}

// AwaitUnique waits until n distinct events have arrived.
func (r *receiver) AwaitUnique(ctx context.Context, n int64, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		got, changed, bad := int64(len(r.seen)), r.changed, r.bad
		r.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("%d of %d events delivered after %s (%d refused signatures)", got, n, timeout, bad)
		case <-changed:
		}
	}
}

// Percentiles are p50, p95, p99 and max of commit-to-first-2xx latency.
func (r *receiver) Percentiles() [4]time.Duration {
	l := r.Latencies(0)
	slices.Sort(l)
	return [4]time.Duration{quantile(l, 0.50), quantile(l, 0.95), quantile(l, 0.99), quantile(l, 1)}
}

// Close stops the receiver; answers still waiting end at once.
func (r *receiver) Close() {
	close(r.closed)
	r.srv.Close()
}
