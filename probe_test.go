// probe_test.go: recovery probes (probe.go) against real receivers: the
// schedule, the re-enable and its replay of exactly the gap, the owner's
// notification, the signature, and the endpoints that are never probed.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/mail"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// newTestProber is a prober with the deliveries' client (loopback
// allowed), the default events retention and attempts, and box.
func newTestProber(t *testing.T, db *sql.DB, box *secretBox) *prober {
	t.Helper()
	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 5 * time.Second})
	cfg := defaultConfig()
	return newProber(db, box, client, cfg.Retention.Events, cfg.Workers.MaxAttempts, testLogger(t))
}

// probeRoundOf runs one round of p and fails the test on its error.
func probeRoundOf(t *testing.T, p *prober) probeRound {
	t.Helper()
	round, err := p.probeOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return round
}

// disableForFailure has the retention cycle disable the endpoints ids, as
// it does after 5 days of failure, then moves their disable ago into the
// past, so that their probes are due as they would be by then.
func disableForFailure(t *testing.T, db *sql.DB, ago time.Duration, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		mustExec(t, db, `UPDATE outbox.endpoints SET failing_since = now() - interval '5 days 1 minute' WHERE id = $1`, id)
	}
	res := sweepOnce(t, newTestSweeper(t, db, defaultConfig().Retention))
	for _, id := range ids {
		found := false
		for _, d := range res.Disabled {
			found = found || d == id
		}
		if !found {
			t.Fatalf("the retention cycle disabled %v, not endpoint %d", res.Disabled, id)
		}
		mustExec(t, db, `UPDATE outbox.endpoints SET disabled_at = disabled_at - make_interval(secs => $2) WHERE id = $1`, id, ago.Seconds())
	}
}

// probesTo is the probe requests among rc's requests.
func probesTo(rc *receiver) []received {
	var probes []received
	for _, r := range rc.requests() {
		if strings.HasPrefix(r.Header.Get("webhook-id"), "probe-") {
			probes = append(probes, r)
		}
	}
	return probes
}

// deliveriesTo counts rc's requests by webhook-id, probes left out.
func deliveriesTo(rc *receiver) map[string]int {
	n := map[string]int{}
	for _, r := range rc.requests() {
		if id := r.Header.Get("webhook-id"); !strings.HasPrefix(id, "probe-") {
			n[id]++
		}
	}
	return n
}

// The schedule and the prober's numbers, as literals (docs/endpoints.md,
// recovery probes).
func TestProbeScheduleNumbers(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	for _, c := range []struct {
		age, want time.Duration // since the disable; until the next probe
	}{
		{0, time.Hour},
		{59 * time.Minute, time.Hour},
		{23*time.Hour + 59*time.Minute, time.Hour},
		{24 * time.Hour, 6 * time.Hour},
		{3 * 24 * time.Hour, 6 * time.Hour},
		{365 * 24 * time.Hour, 6 * time.Hour},
	} {
		got := queryInt(t, db, `SELECT extract(epoch FROM outbox.probe_interval(now() - make_interval(secs => $1), now()))::int`, c.age.Seconds())
		if time.Duration(got)*time.Second != c.want {
			t.Errorf("probe interval %s after the disable = %d s, want %s", c.age, got, c.want)
		}
	}
	for _, n := range []struct {
		name      string
		got, want any
	}{
		{"prober interval", probeInterval, time.Minute},
		{"probes a claim", probeBatch, 32},
		{"replay's last pass after", recoveryReplayMargin, 5 * time.Minute},
		{"recovered reason bound", maxRecoveredReasonLen, 1000},
	} {
		if n.got != n.want {
			t.Errorf("%s = %v, want %v", n.name, n.got, n.want)
		}
	}
}

// An endpoint disabled for failure is first probed an hour after the
// disable; a failed probe is recorded and the next one is scheduled an
// hour later through the first day, 6 hours after; a 410 ends the probes.
func TestFailedProbesFollowTheSchedule(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var gone atomic.Bool
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if gone.Load() {
			w.WriteHeader(http.StatusGone)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "upstream down")
	})
	ep := api.createEndpoint(rc.srv.URL + "/hook")
	p := newTestProber(t, db, nil)

	disableForFailure(t, db, 59*time.Minute, ep.ID)
	if round := probeRoundOf(t, p); round.Probed != 0 {
		t.Errorf("probed %d endpoints 59 minutes after the disable, want none", round.Probed)
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET disabled_at = disabled_at - interval '2 minutes' WHERE id = $1`, ep.ID)
	if round := probeRoundOf(t, p); round.Probed != 1 || len(round.Recovered) != 0 {
		t.Errorf("61 minutes after the disable: probed %d, recovered %v; want 1 probe, no recovery", round.Probed, round.Recovered)
	}
	got := api.endpoint(ep.ID)
	if got.State != endpointDisabled || got.Recovery.LastProbeAt == nil || got.Recovery.NextProbeAt == nil {
		t.Fatalf("after a failed probe: state %s, recovery %+v", got.State, got.Recovery)
	}
	if e := got.Recovery.LastProbeError; e == nil || !strings.Contains(*e, "answered 503 Service Unavailable") || !strings.Contains(*e, "upstream down") {
		t.Errorf("last_probe_error %v, want the 503 and its answer", e)
	}
	if d := got.Recovery.NextProbeAt.Sub(*got.Recovery.LastProbeAt); d != time.Hour {
		t.Errorf("next probe %s after the last, want 1h in the first day", d)
	}
	if round := probeRoundOf(t, p); round.Probed != 0 {
		t.Errorf("probed again at once: %d", round.Probed)
	}

	// Two days in: every 6 hours.
	mustExec(t, db, `UPDATE outbox.endpoints SET disabled_at = now() - interval '2 days', next_probe_at = now() WHERE id = $1`, ep.ID)
	if round := probeRoundOf(t, p); round.Probed != 1 {
		t.Fatalf("probed %d when due, want 1", round.Probed)
	}
	got = api.endpoint(ep.ID)
	if d := got.Recovery.NextProbeAt.Sub(*got.Recovery.LastProbeAt); d != 6*time.Hour {
		t.Errorf("next probe %s after the last, two days in; want 6h", d)
	}
	if n := len(probesTo(rc)); n != 2 {
		t.Errorf("receiver got %d probes, want 2", n)
	}

	// A 410 to a probe: the receiver is gone for good.
	gone.Store(true)
	mustExec(t, db, `UPDATE outbox.endpoints SET next_probe_at = now() WHERE id = $1`, ep.ID)
	probeRoundOf(t, p)
	got = api.endpoint(ep.ID)
	if got.State != endpointDisabled || got.DisabledCause == nil || *got.DisabledCause != "gone" ||
		*got.DisabledReason != endpointGoneReason || got.Recovery.NextProbeAt != nil {
		t.Errorf("after a 410 to a probe: state %s, cause %v, reason %v, next probe %v; want disabled, gone, no next probe",
			got.State, got.DisabledCause, got.DisabledReason, got.Recovery.NextProbeAt)
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET next_probe_at = now() - interval '1 day' WHERE id = $1`, ep.ID)
	if round := probeRoundOf(t, p); round.Probed != 0 || len(probesTo(rc)) != 3 {
		t.Errorf("after the 410: probed %d, receiver got %d probes; want none more than 3", round.Probed, len(probesTo(rc)))
	}
}

// The first 2xx to a probe re-enables the endpoint with a clean slate,
// says why, notifies its owner, and replays exactly the events recorded
// since the disable: not an earlier one, none twice, and one that a relay
// marked fanned out behind the first pass's back is found by the last.
func TestProbeReenablesAndReplaysExactlyTheGap(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var healthy atomic.Bool
	healthy.Store(true)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	ep := api.createEndpoint(rc.srv.URL+"/hook", "order.*")
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(ep.ID), `{"owner_email": "owner@example.com"}`); status != http.StatusOK {
		t.Fatalf("set owner: %d %s", status, body)
	}
	peer := newSMTPPeer(t, 0)
	runMailWorkers(t, db, testMailer(t, peer), 5, nil)
	p := newTestProber(t, db, nil)

	before := record(t, db, "order.paid", "before")
	relayAll(t, db)
	waitFor(t, "the event before the outage to be delivered", 10*time.Second, func() bool {
		return readJob(t, db, webhookJob(t, db, before, ep.ID)).State == "completed"
	})

	healthy.Store(false)
	disableForFailure(t, db, 2*time.Hour, ep.ID)
	mustExec(t, db, `UPDATE outbox.events SET created_at = created_at - interval '3 hours' WHERE id = $1`, before)
	missed := []int64{record(t, db, "order.paid", "m1"), record(t, db, "order.shipped", "m2")}
	other := record(t, db, "user.created", "not-selected")
	relayAll(t, db)
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1`, ep.ID) +
		queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, ep.ID); n != 1 {
		t.Fatalf("%d jobs for the disabled endpoint, want only the one before the outage", n)
	}
	disabled := api.endpoint(ep.ID)
	if disabled.DisabledCause == nil || *disabled.DisabledCause != "failure" {
		t.Fatalf("disabled_cause %v, want failure", disabled.DisabledCause)
	}

	if round := probeRoundOf(t, p); round.Probed != 1 || len(round.Recovered) != 0 {
		t.Fatalf("receiver down: probed %d, recovered %v", round.Probed, round.Recovered)
	}
	healthy.Store(true)
	mustExec(t, db, `UPDATE outbox.endpoints SET next_probe_at = now() WHERE id = $1`, ep.ID)
	if round := probeRoundOf(t, p); len(round.Recovered) != 1 || round.Recovered[0] != ep.ID {
		t.Fatalf("receiver back: recovered %v, want [%d]", round.Recovered, ep.ID)
	}

	got := api.endpoint(ep.ID)
	if got.State != endpointEnabled || got.DisabledAt != nil || got.DisabledReason != nil || got.DisabledCause != nil ||
		got.FailingSince != nil || got.Breaker.State != breakerClosed || got.Breaker.ConsecutiveFailures != 0 {
		t.Errorf("after the recovery: %+v, want enabled with a clean slate", got)
	}
	r := got.Recovery
	wantReason := "answered 200 OK after 2h0m0s disabled; replaying the events recorded since " + disabled.DisabledAt.UTC().Format(time.RFC3339)
	if r.RecoveredAt == nil || r.RecoveredReason == nil || !strings.Contains(*r.RecoveredReason, wantReason) ||
		r.LastProbeError != nil || r.NextProbeAt != nil {
		t.Errorf("recovery %+v, want recovered_at and a reason containing %q, no error, no next probe", r, wantReason)
	}

	// The gap, and only the gap, is enqueued; the delivered event is not
	// reset.
	jobs := ids(t, db, fmt.Sprintf(`SELECT event_id FROM outbox.jobs WHERE endpoint_id = %[1]d
		UNION ALL SELECT event_id FROM outbox.deliveries WHERE endpoint_id = %[1]d AND outcome = 'completed'
		ORDER BY 1`, ep.ID))
	if diff := cmp.Diff([]int64{before, missed[0], missed[1]}, jobs); diff != "" {
		t.Errorf("jobs of the endpoint by event (-want +got):\n%s", diff)
	}
	if j := readJob(t, db, webhookJob(t, db, before, ep.ID)); j.State != "completed" || j.Attempt != 1 {
		t.Errorf("the delivered event's job: %s on attempt %d, want completed on 1", j.State, j.Attempt)
	}

	waitFor(t, "the first pass's deliveries to complete", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.deliveries WHERE endpoint_id = $1 AND outcome = 'completed'`, ep.ID) == 3
	})

	// A relay that read the endpoint as disabled marks an event fanned out
	// after the first pass: the last pass, due 5 minutes on, finds it, and
	// sends none of the delivered ones again.
	late := record(t, db, "order.paid", "late")
	mustExec(t, db, `UPDATE outbox.events SET fanned_out_at = now() WHERE id = $1`, late)
	if round := probeRoundOf(t, p); round.Replayed != 0 {
		t.Errorf("the last pass ran before its margin: %d jobs", round.Replayed)
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET recovered_at = recovered_at - interval '5 minutes' WHERE id = $1`, ep.ID)
	if round := probeRoundOf(t, p); round.Replayed != 1 {
		t.Errorf("the last pass enqueued %d jobs, want 1 (the late event)", round.Replayed)
	}
	if round := probeRoundOf(t, p); round.Replayed != 0 {
		t.Errorf("a second last pass enqueued %d jobs, want none", round.Replayed)
	}

	want := map[string]int{itoa(before): 1, itoa(missed[0]): 1, itoa(missed[1]): 1, itoa(late): 1}
	waitFor(t, "the gap to be delivered", 10*time.Second, func() bool {
		return cmp.Equal(want, deliveriesTo(rc))
	})
	waitFor(t, "every delivery to end", 10*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE endpoint_id = $1 AND state <> 'completed'`, ep.ID) == 0
	})
	if diff := cmp.Diff(want, deliveriesTo(rc)); diff != "" {
		t.Errorf("deliveries by webhook-id (-want +got):\n%s", diff)
	}
	if n := deliveriesTo(rc)[itoa(other)]; n != 0 {
		t.Errorf("an event the endpoint does not select was delivered %d times", n)
	}

	// The owner hears of it, through the recovered event.
	var payload endpointStatePayload
	var raw []byte
	if err := db.QueryRow(`SELECT payload FROM outbox.events WHERE topic = 'outboxd.endpoint.recovered' AND subject = $1`, itoa(ep.ID)).Scan(&raw); err != nil {
		t.Fatalf("no recovered event: %v", err)
	}
	if err := json.Unmarshal(raw, &payload); err != nil {
		t.Fatal(err)
	}
	if payload.State != "recovered" || payload.OwnerEmail != "owner@example.com" || payload.RecoveredReason == nil || *payload.RecoveredReason != *r.RecoveredReason {
		t.Errorf("recovered event payload %s", raw)
	}
	relayAll(t, db)
	subject := fmt.Sprintf("[outboxd] endpoint %d is enabled again", ep.ID)
	waitFor(t, "the owner's mail about the recovery", 10*time.Second, func() bool {
		for _, m := range peer.messages() {
			msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
			if err == nil && m.To == "owner@example.com" && msg.Header.Get("Subject") == subject {
				return true
			}
		}
		return false
	})
}

// A probe is a Standard Webhooks request of type outboxd.probe, signed
// with the endpoint's secrets opened by the box (both, in a rotation
// window). Its claim commits the next probe's time before it is sent, so
// a second replica finds nothing due meanwhile, and a process without the
// key sends nothing and says why.
func TestProbeIsSignedAndClaimedBeforeItIsSent(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	box := testBox(t, testSecretsKey(1), "")
	api := newSealingTestAPI(t, db, box)
	release := make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			<-release
			w.WriteHeader(http.StatusBadGateway)
		}
	})
	ep := api.createEndpoint(rc.srv.URL + "/hook")
	status, body := api.do("POST", "/api/endpoints/"+itoa(ep.ID)+"/rotate-secret", "")
	var rotated endpointWithSecret
	if err := json.Unmarshal(body, &rotated); status != http.StatusOK || err != nil {
		t.Fatalf("rotate: %d %s", status, body)
	}
	disableForFailure(t, db, 2*time.Hour, ep.ID)

	first := make(chan probeRound, 1)
	go func() {
		round, err := newTestProber(t, db, box).probeOnce(context.Background())
		if err != nil {
			t.Error(err)
		}
		first <- round
	}()
	waitFor(t, "the probe to reach the receiver", 10*time.Second, func() bool { return len(rc.requests()) == 1 })
	if round := probeRoundOf(t, newTestProber(t, db, box)); round.Probed != 0 {
		t.Errorf("a second replica probed %d endpoints while the first probe was in flight, want none", round.Probed)
	}
	if e := api.endpoint(ep.ID).Recovery.LastProbeError; e == nil || *e != probeInFlightNote {
		t.Errorf("last_probe_error while in flight: %v, want %q", e, probeInFlightNote)
	}
	close(release)
	if round := <-first; round.Probed != 1 {
		t.Errorf("the first replica probed %d, want 1", round.Probed)
	}

	req := rc.requests()[0]
	id := req.Header.Get("webhook-id")
	if !regexp.MustCompile(fmt.Sprintf(`^probe-%d-[0-9]+$`, ep.ID)).MatchString(id) {
		t.Errorf("webhook-id %q, want probe-%d-<unix time>", id, ep.ID)
	}
	for _, secret := range [][]byte{secretOf(t, ep), secretOf(t, rotated)} {
		if err := verifyWebhook([][]byte{secret}, req.Header, req.Body, time.Now()); err != nil {
			t.Errorf("a secret of the rotation does not verify the probe: %v", err)
		}
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var got map[string]any
	if err := json.Unmarshal(req.Body, &got); err != nil {
		t.Fatalf("probe body %s: %v", req.Body, err)
	}
	ts, _ := got["timestamp"].(string)
	if at, err := time.Parse(time.RFC3339Nano, ts); err != nil || time.Since(at) > time.Minute {
		t.Errorf("timestamp %q: %v", ts, err)
	}
	want := map[string]any{"id": id, "type": "outboxd.probe", "subject": itoa(ep.ID), "timestamp": ts, "data": map[string]any{}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("probe body (-want +got):\n%s", diff)
	}
	if e := api.endpoint(ep.ID).Recovery.LastProbeError; e == nil || !strings.Contains(*e, "answered 502") {
		t.Errorf("last_probe_error after the 502: %v", e)
	}

	// Without the key: nothing sent, and the reason kept.
	mustExec(t, db, `UPDATE outbox.endpoints SET next_probe_at = now() WHERE id = $1`, ep.ID)
	if round := probeRoundOf(t, newTestProber(t, db, nil)); round.Probed != 1 {
		t.Errorf("probed %d, want 1 (tried)", round.Probed)
	}
	if n := len(rc.requests()); n != 1 {
		t.Errorf("receiver got %d requests, want only the first", n)
	}
	wantErr := fmt.Sprintf("secret of endpoint %d is sealed under key fca31f12, and -secrets-key (OUTBOXD_SECRETS_KEY) is not set; not sent", ep.ID)
	if e := api.endpoint(ep.ID).Recovery.LastProbeError; e == nil || *e != wantErr {
		t.Errorf("last_probe_error without the key: %v, want %q", e, wantErr)
	}
}

// Only an endpoint disabled for failure, with probes on and an http(s)
// URL, is probed: never one disabled by its operator (also over a failure),
// by a 410, one that opted out through POST or PATCH, a mailto: one, or
// one disabled before causes were recorded.
func TestProbeNeverFiresForOperatorOr410DisabledOrOptedOut(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	receivers := map[string]*receiver{}
	endpoints := map[string]int64{}
	for _, name := range []string{"failure", "operator", "operator-over-failure", "gone", "opted-out-post", "opted-out-patch", "unknown-cause"} {
		answer := func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) }
		if name == "gone" {
			answer = func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusGone) }
		}
		receivers[name] = newReceiver(t, answer)
		in := map[string]any{"url": receivers[name].srv.URL + "/" + name, "topics": []string{"gone.*"}}
		if name == "opted-out-post" {
			in["recovery_probes"] = false
		}
		b, _ := json.Marshal(in)
		status, body := api.do("POST", "/api/endpoints", string(b))
		var created Endpoint
		if err := json.Unmarshal(body, &created); status != http.StatusCreated || err != nil || created.RecoveryProbes != (name != "opted-out-post") {
			t.Fatalf("create %s: %d %s", name, status, body)
		}
		endpoints[name] = created.ID
	}
	endpoints["mailto"] = api.createEndpoint("mailto:ops@example.com").ID

	status, body := api.do("PATCH", "/api/endpoints/"+itoa(endpoints["opted-out-patch"]), `{"recovery_probes": false}`)
	var patched Endpoint
	if err := json.Unmarshal(body, &patched); status != http.StatusOK || err != nil || patched.RecoveryProbes {
		t.Errorf("patch recovery_probes false: %d %s", status, body)
	}
	if status, body := api.do("PATCH", "/api/endpoints/"+itoa(endpoints["failure"]), `{"recovery_probes": "no"}`); status != http.StatusBadRequest || !strings.Contains(string(body), `"error"`) {
		t.Errorf("recovery_probes \"no\": %d %s, want 400 with an error", status, body)
	}

	// A 410 to a delivery.
	record(t, db, "gone.soon", "g")
	relayAll(t, db)
	runWebhookWorkers(t, db, 5*time.Second)
	waitFor(t, "the 410 to disable its endpoint", 10*time.Second, func() bool {
		return api.endpoint(endpoints["gone"]).State == endpointDisabled
	})
	disableForFailure(t, db, 2*24*time.Hour, endpoints["failure"], endpoints["operator-over-failure"],
		endpoints["opted-out-post"], endpoints["opted-out-patch"], endpoints["mailto"], endpoints["unknown-cause"])
	for _, name := range []string{"operator", "operator-over-failure"} {
		if status, body := api.do("POST", "/api/endpoints/"+itoa(endpoints[name])+"/disable", `{"reason": "receiver migration"}`); status != http.StatusOK {
			t.Fatalf("disable %s: %d %s", name, status, body)
		}
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET disabled_cause = NULL WHERE id = $1`, endpoints["unknown-cause"])
	mustExec(t, db, `UPDATE outbox.endpoints SET disabled_at = now() - interval '2 days' WHERE disabled_at IS NOT NULL`)

	wantCause := map[string]string{"failure": "failure", "operator": "operator", "operator-over-failure": "operator", "gone": "gone",
		"opted-out-post": "failure", "opted-out-patch": "failure", "mailto": "failure", "unknown-cause": ""}
	for name, id := range endpoints {
		e := api.endpoint(id)
		var cause string
		if e.DisabledCause != nil {
			cause = *e.DisabledCause
		}
		if e.State != endpointDisabled || cause != wantCause[name] {
			t.Errorf("%s: state %s, cause %q; want disabled, %q", name, e.State, cause, wantCause[name])
		}
		if (e.Recovery.NextProbeAt != nil) != (name == "failure") {
			t.Errorf("%s: next_probe_at %v", name, e.Recovery.NextProbeAt)
		}
	}
	if r := api.endpoint(endpoints["operator-over-failure"]); *r.DisabledReason == "receiver migration" {
		t.Errorf("an operator's disable over a failure replaced the first reason: %q", *r.DisabledReason)
	}

	p := newTestProber(t, db, nil)
	if round := probeRoundOf(t, p); round.Probed != 1 {
		t.Errorf("probed %d endpoints, want 1", round.Probed)
	}
	for name, rc := range receivers {
		if n, want := len(probesTo(rc)), map[bool]int{true: 1}[name == "failure"]; n != want {
			t.Errorf("%s: %d probes, want %d", name, n, want)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE last_probe_at IS NOT NULL`); n != 1 {
		t.Errorf("%d endpoints were probed, want 1", n)
	}

	// An operator's enable clears the cause.
	if status, body := api.do("POST", "/api/endpoints/"+itoa(endpoints["operator"])+"/enable", ""); status != http.StatusOK || api.endpoint(endpoints["operator"]).DisabledCause != nil {
		t.Errorf("enable: %d %s, cause %v", status, body, api.endpoint(endpoints["operator"]).DisabledCause)
	}
}

// createEndpointWith creates an endpoint through api from the JSON
// fields given, and fails the test unless it is created.
func createEndpointWith(t *testing.T, api *testAPI, fields map[string]any) endpointWithSecret {
	t.Helper()
	body, _ := json.Marshal(fields)
	status, resp := api.do("POST", "/api/endpoints", string(body))
	var ep endpointWithSecret
	if err := json.Unmarshal(resp, &ep); status != http.StatusCreated || err != nil {
		t.Fatalf("create endpoint: %d %s", status, resp)
	}
	return ep
}

// A receiver that wants its API key refuses every request without it:
// the probe carries the endpoint's custom headers, the secret one opened
// as a delivery opens it, so the endpoint recovers by probe.
func TestProbeCarriesTheEndpointsHeaders(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	box := testBox(t, testSecretsKey(1), "")
	api := newSealingTestAPI(t, db, box)
	const apiKey = "sk_live_probe_key_7"
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != apiKey || r.Header.Get("X-Tenant") != "acme" {
			http.Error(w, "missing API key", http.StatusUnauthorized)
		}
	})
	ep := createEndpointWith(t, api, map[string]any{"url": rc.srv.URL + "/hook", "headers": map[string]any{
		"X-Tenant": "acme", "X-Api-Key": map[string]any{"value": apiKey, "secret": true}}})
	disableForFailure(t, db, 2*time.Hour, ep.ID)

	round := probeRoundOf(t, newTestProber(t, db, box))
	if diff := cmp.Diff([]int64{ep.ID}, round.Recovered); diff != "" {
		t.Errorf("recovered (-want +got):\n%s\nlast probe error: %v", diff, api.endpoint(ep.ID).Recovery.LastProbeError)
	}
	probes := probesTo(rc)
	if len(probes) != 1 {
		t.Fatalf("%d probes, want 1", len(probes))
	}
	if got := [2]string{probes[0].Header.Get("X-Tenant"), probes[0].Header.Get("X-Api-Key")}; got != [2]string{"acme", apiKey} {
		t.Errorf("the probe carried X-Tenant %q and X-Api-Key %q, want acme and the secret", got[0], got[1])
	}
	if err := verifyWebhook([][]byte{secretOf(t, ep)}, probes[0].Header, probes[0].Body, time.Now()); err != nil {
		t.Errorf("the probe's signature: %v", err)
	}
	if e := api.endpoint(ep.ID); e.DisabledAt != nil {
		t.Errorf("endpoint still disabled after its probe was answered: %+v", e.Recovery)
	}
}

// A probe ends at the endpoint's own timeout_seconds, not at the
// service's -webhook-timeout (20 s here): against a receiver that never
// answers, a 1 s endpoint's probe gives up after about a second.
func TestProbeEndsAtTheEndpointsTimeout(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	box := testBox(t, testSecretsKey(1), "")
	api := newSealingTestAPI(t, db, box)
	hang := make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-hang:
		}
	})
	t.Cleanup(func() { close(hang) }) // before the receiver closes
	ep := createEndpointWith(t, api, map[string]any{"url": rc.srv.URL + "/hook", "timeout_seconds": 1})
	disableForFailure(t, db, 2*time.Hour, ep.ID)

	client := newSafeHTTPClient(safeHTTPOptions{AllowPrivate: true, Timeout: 20 * time.Second})
	cfg := defaultConfig()
	p := newProber(db, box, client, cfg.Retention.Events, cfg.Workers.MaxAttempts, testLogger(t))
	start := time.Now()
	round := probeRoundOf(t, p)
	took := time.Since(start)
	if round.Probed != 1 || len(round.Recovered) != 0 {
		t.Errorf("round %+v, want one probe and no recovery", round)
	}
	if took < time.Second || took > 5*time.Second {
		t.Errorf("the probe round took %s, want about the endpoint's 1 s, far below the service's 20 s", took)
	}
	if e := api.endpoint(ep.ID).Recovery.LastProbeError; e == nil || !strings.Contains(*e, "Client.Timeout exceeded") {
		t.Errorf("last_probe_error %v, want the client's timeout", e)
	}
}
