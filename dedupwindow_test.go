// dedupwindow_test.go: the receiver's dedup window as a sender keeps it
// (cleared when the receiver stops advertising one), and the bound it
// puts on a delivery held past it by a pause.

package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// A receiver that stops advertising a window no longer has one: the 2xx
// without webhook-dedup-window clears what an earlier 2xx stored, while
// an answer that is not a 2xx, which may come from a proxy, leaves it.
func TestA2xxWithoutTheHeaderClearsTheWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var header atomic.Value // the webhook-dedup-window to answer with; "" for none
	var status atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := header.Load().(string); v != "" {
			w.Header().Set(headerDedupWindow, v)
		}
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(receiver.Close)
	ep := api.createEndpoint(receiver.URL)
	workers := chainWorkers(t, db, defaultConfig().Workers)
	deliver := func(subject string) {
		t.Helper()
		record(t, db, "order.paid", subject)
		relayAll(t, db)
		if _, err := workers.workOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}

	header.Store("3600")
	status.Store(http.StatusOK)
	deliver("advertised")
	if got := endpointWindow(t, api, ep.ID); got != 3600 {
		t.Fatalf("after a 2xx advertising 3600 s: window %d s, want 3600", got)
	}
	header.Store("")
	status.Store(http.StatusInternalServerError)
	deliver("failed")
	if got := endpointWindow(t, api, ep.ID); got != 3600 {
		t.Errorf("after a 500 without the header: window %d s, want 3600 kept", got)
	}
	status.Store(http.StatusOK)
	deliver("not advertised")
	if got := endpointWindow(t, api, ep.ID); got != 0 {
		t.Errorf("after a 2xx without the header: window %d s, want none", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE id = $1 AND dedup_window_seen_at IS NULL`, ep.ID); n != 1 {
		t.Errorf("dedup_window_seen_at kept without a window")
	}
}
