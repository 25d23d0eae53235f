// load_test.go: the load generator's pacing.

package main

import (
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
