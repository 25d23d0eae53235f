// receiver.go: the webhook receiver on loopback, the same as outboxd
// load's: it verifies every signature, dedupes on webhook-id, keeps each
// first delivery's commit-to-2xx latency and answers 204 at once.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

type receiver struct {
	srv    *http.Server
	url    string
	secret []byte

	mu        sync.Mutex // protects the fields below
	seen      map[string]bool
	latencies []time.Duration
	dups      int64
	bad       int64
	changed   chan struct{} // closed and replaced on every new delivery
}

func startReceiver(secret []byte) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	r := &receiver{url: "http://" + ln.Addr().String() + "/hook", secret: secret,
		seen: map[string]bool{}, changed: make(chan struct{})}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go r.srv.Serve(ln)
	return r, nil
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 2<<20))
	if err != nil || verifyWebhook(r.secret, req.Header, body, time.Now()) != nil {
		r.mu.Lock()
		r.bad++
		r.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	// The body's timestamp is the event's (or job's) created_at: the
	// producing transaction's now(), so this is commit to first 2xx plus
	// the transaction's own length, as bench/load measures it.
	var msg struct {
		Timestamp time.Time `json:"timestamp"`
	}
	json.Unmarshal(body, &msg)
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	if r.seen[id] {
		r.dups++
	} else {
		r.seen[id] = true
		r.latencies = append(r.latencies, time.Since(msg.Timestamp))
		close(r.changed)
		r.changed = make(chan struct{})
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) Unique() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(len(r.seen))
}

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
			return fmt.Errorf("receiver: %d of %d events delivered after %s (%d refused signatures)", got, n, timeout, bad)
		case <-changed:
		}
	}
}

// Percentiles are p50, p95, p99 and max of commit-to-first-2xx latency,
// by the nearest-rank method as bench/load computes them.
func (r *receiver) Percentiles() [4]time.Duration {
	r.mu.Lock()
	l := slices.Clone(r.latencies)
	r.mu.Unlock()
	slices.Sort(l)
	q := func(p float64) time.Duration {
		if len(l) == 0 {
			return 0
		}
		return l[min(len(l)-1, max(0, int(math.Ceil(p*float64(len(l))))-1))]
	}
	return [4]time.Duration{q(0.50), q(0.95), q(0.99), q(1)}
}

func (r *receiver) Close() { r.srv.Close() }
