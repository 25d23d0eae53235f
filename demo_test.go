// demo_test.go: -demo's exemption from the address guard is its own
// endpoint's, at its own URL, and nothing else's.

package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"io"
	"strings"
	"testing"
	"time"
)

// Under -demo, the demo's endpoint delivers to its receiver on outboxd's
// own listener, while every other endpoint that points there is refused
// by the guard before a connection: by the listener's IP and port, by a
// name that resolves to it (localhost, from the hosts file), and at the
// demo receiver's very URL under another endpoint's id.
func TestDemoExemptionIsItsOwnEndpointsAlone(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	addr := freeAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	var logs syncBuffer
	go func() {
		defer close(exited)
		if err := run(ctx, []string{"-demo", "-addr", addr}, envFrom(map[string]string{"DATABASE_URL": dsn, "OUTBOXD_ADMIN_TOKEN": rand.Text()}), io.Discard, &logs); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	defer func() {
		cancel()
		<-exited
		if t.Failed() {
			t.Logf("outboxd's log:\n%s", logs.String())
		}
	}()
	awaitHealthy(t, addr, exited)
	var demoID int64
	waitFor(t, "the demo's endpoint", 30*time.Second, func() bool {
		return db.QueryRow(`SELECT id FROM outbox.endpoints WHERE description = $1`, demoEndpointDescription).Scan(&demoID) == nil
	})

	// Registration refuses these URLs; stored as the demo stores its
	// own, past validation, they meet the guard at delivery.
	others := map[string]int64{}
	for _, url := range []string{
		"http://" + addr + "/webhooks/shop",
		"http://localhost:" + port + "/logout",
		"http://" + addr + "/demo/hook",
	} {
		topics := []string{"probe.*"}
		ep, err := createEndpoint(ctx, db, nil, endpointInput{URL: &url, Topics: &topics}, newWebhookSecret())
		if err != nil {
			t.Fatal(err)
		}
		others[url] = ep.ID
	}
	mustExec(t, db, `SELECT outbox.record('probe.reach', 's', '{}')`)

	for url, id := range others {
		var status sql.NullInt64
		var errText string
		waitFor(t, "the first attempt to "+url, 30*time.Second, func() bool {
			return db.QueryRow(`SELECT status_code, error FROM outbox.deliveries WHERE endpoint_id = $1 AND attempt = 1`, id).Scan(&status, &errText) == nil
		})
		if status.Valid || !strings.Contains(errText, "is loopback; set -allow-private-endpoints to allow") {
			t.Errorf("endpoint %d at %s: status %v, error %q; want the guard's refusal and no answer", id, url, status, errText)
		}
	}
	waitFor(t, "the demo's endpoint to deliver", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, demoID) > 0
	})
}
