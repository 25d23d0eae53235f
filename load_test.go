// load_test.go: the load generator's pacing.

package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestProducerPhasesSpreadOverOneInterval(t *testing.T) {
	t.Parallel()
	// 16 producers at 20 events/s: one tick each every 800 ms, 50 ms apart.
	const n = 16
	interval := 800 * time.Millisecond
	var got []time.Duration
	for p := range n {
		got = append(got, producerPhase(p, n, interval))
	}
	var want []time.Duration
	for p := range n {
		want = append(want, time.Duration(p)*50*time.Millisecond)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("producer phases (-want +got):\n%s", diff)
	}
}

// A load run removes the endpoint it registered, so the next run's outboxd
// does not retry deliveries into the closed port of this run's receiver.
func TestLoadRunRemovesItsEndpoint(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	var out, errs syncBuffer
	err := run(context.Background(), []string{"load", "-mode", "drain", "-events", "50", "-database-url", dsn},
		func(string) string { return "" }, &out, &errs)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, errs.String())
	}
	if !strings.Contains(out.String(), "mode drain") {
		t.Errorf("load printed no drain report:\n%s", out.String())
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints`); n != 0 {
		t.Errorf("%d endpoints left after the run, want 0; stderr:\n%s", n, errs.String())
	}
}
