// faults_checker_test.go: the fault suite's judge. It reads only what the
// application and the receiver know, the business table and the receiver's
// own log, never outboxd's bookkeeping, and says what was lost, what arrived
// twice and whether each duplicate has an injected fault to explain it.

package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// faultDelivery is one request as the receiver saw it.
type faultDelivery struct {
	Endpoint  string // the endpoint's name, from the request path
	WebhookID string // the webhook-id header
	BodyID    string // the body's "id"
	Subject   string // the body's "subject": the business row's key
	Topic     string // the body's "type"
	SigOK     bool   // the signature verified with the endpoint's secret
	Arrived   time.Time
	// Accepted: the receiver did the work and answered (or tried to
	// answer) 2xx. Every other outcome is a refusal outboxd must retry.
	Accepted bool
	Outcome  string // accepted, 500, hung, closed, held
}

// injectedFault is one fault and the time it was in force.
type injectedFault struct {
	Kind   string
	Detail string
	Start  time.Time
	End    time.Time
	// Interrupts: the fault can cut an attempt after the receiver
	// accepted it and before outboxd recorded the outcome, the one way a
	// duplicate is legitimate.
	Interrupts bool
}

// checkInput is everything the checker reads.
type checkInput struct {
	Committed    map[string]string   // business key -> topic, from the business table
	NotCommitted []string            // keys whose transaction rolled back (by choice or by error before COMMIT)
	Subscribers  map[string][]string // topic -> the endpoints that subscribe to it
	Log          []faultDelivery
	Faults       []injectedFault
	// Slack widens a fault's window backwards: an attempt accepted this
	// long before the fault can still be waiting for its outcome to be
	// recorded (the attempt timeout).
	Slack time.Duration
}

// checkResult is the verdict. Problems are invariant violations; lost and
// unexplained duplicates are counted apart because the summary shows them.
type checkResult struct {
	Events      int // committed business rows, each with its one event
	Deliveries  int // accepted requests
	Duplicates  int // accepted requests beyond the first per (event, endpoint)
	Lost        int // (event, endpoint) pairs never accepted
	Unexplained []string
	Problems    []string
}

// checkFaultRun judges a run. It is a pure function of its input, so its
// own test feeds it each kind of failure.
func checkFaultRun(in checkInput) checkResult {
	var res checkResult
	problem := func(format string, args ...any) {
		res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
	}
	notCommitted := map[string]bool{}
	for _, k := range in.NotCommitted {
		notCommitted[k] = true
	}

	// Each webhook-id is one event: it names one business key and topic.
	type eventInfo struct{ subject, topic string }
	events := map[string]eventInfo{}
	eventsOfKey := map[string]map[string]bool{}
	type pair struct{ endpoint, id string }
	accepted := map[pair][]time.Time{}
	for _, d := range in.Log {
		if d.WebhookID == "" || d.BodyID != d.WebhookID {
			problem("request to %s: webhook-id %q and body id %q differ", d.Endpoint, d.WebhookID, d.BodyID)
			continue
		}
		if !d.SigOK {
			problem("request to %s for event %s: signature does not verify", d.Endpoint, d.WebhookID)
		}
		if prev, ok := events[d.WebhookID]; ok && prev != (eventInfo{d.Subject, d.Topic}) {
			problem("event %s arrived as %v and as %v", d.WebhookID, prev, eventInfo{d.Subject, d.Topic})
		}
		events[d.WebhookID] = eventInfo{d.Subject, d.Topic}
		if eventsOfKey[d.Subject] == nil {
			eventsOfKey[d.Subject] = map[string]bool{}
		}
		eventsOfKey[d.Subject][d.WebhookID] = true
		if d.Accepted {
			res.Deliveries++
			p := pair{d.Endpoint, d.WebhookID}
			accepted[p] = append(accepted[p], d.Arrived)
		}
	}

	// Every event has a committed business row with its topic, and goes
	// only to the endpoints that subscribe to that topic.
	for id, ev := range events {
		topic, ok := in.Committed[ev.subject]
		switch {
		case notCommitted[ev.subject]:
			problem("event %s belongs to %s, whose transaction did not commit", id, ev.subject)
		case !ok:
			problem("event %s (subject %q) has no business row", id, ev.subject)
		case topic != ev.topic:
			problem("event %s has topic %q, its business row %q", id, ev.topic, topic)
		}
	}
	for p := range accepted {
		if !slices.Contains(in.Subscribers[events[p.id].topic], p.endpoint) {
			problem("event %s (topic %q) delivered to %s, which does not subscribe to it", p.id, events[p.id].topic, p.endpoint)
		}
	}

	// Every committed row has exactly one event, and that event reached
	// every subscribing endpoint at least once.
	keys := make([]string, 0, len(in.Committed))
	for k := range in.Committed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		topic := in.Committed[key]
		ids := eventsOfKey[key]
		if len(ids) > 1 {
			problem("business row %s has %d events: %v", key, len(ids), idList(ids))
		}
		res.Events++
		for _, ep := range in.Subscribers[topic] {
			var times []time.Time
			for id := range ids {
				times = append(times, accepted[pair{ep, id}]...)
			}
			if len(times) == 0 {
				res.Lost++
				if res.Lost <= 20 {
					problem("lost: business row %s (topic %s) never reached %s", key, topic, ep)
				}
				continue
			}
			if len(times) == 1 {
				continue
			}
			res.Duplicates += len(times) - 1
			slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
			if !explained(in.Faults, times[0], in.Slack) {
				res.Unexplained = append(res.Unexplained, fmt.Sprintf("%s to %s: %d deliveries, the first at %s, inside no interrupting fault",
					key, ep, len(times), times[0].Format("15:04:05.000")))
			}
		}
	}
	return res
}

// explained reports whether a fault could have cut the attempt accepted at
// t before its outcome was recorded.
func explained(faults []injectedFault, t time.Time, slack time.Duration) bool {
	for _, f := range faults {
		if f.Interrupts && !t.Before(f.Start.Add(-slack)) && !t.After(f.End) {
			return true
		}
	}
	return false
}

func idList(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// summaryLine is the one line a run prints.
func (r checkResult) summaryLine(faults int, seed uint64) string {
	return fmt.Sprintf("events %d, deliveries %d, duplicates %d, lost %d, faults %d, seed %d",
		r.Events, r.Deliveries, r.Duplicates, r.Lost, faults, seed)
}

// The checker itself, fed each way a run can go wrong: it must say so.
func TestFaultCheckerFindsEachViolation(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	subs := map[string][]string{"order.paid": {"orders", "all"}, "audit.note": {"all"}}
	ok := func(ep, id, key, topic string, s int) faultDelivery {
		return faultDelivery{Endpoint: ep, WebhookID: id, BodyID: id, Subject: key, Topic: topic, SigOK: true, Arrived: at(s), Accepted: true, Outcome: "accepted"}
	}
	refused := func(d faultDelivery) faultDelivery { d.Accepted, d.Outcome = false, "500"; return d }
	kill := injectedFault{Kind: "kill", Start: at(10), End: at(15), Interrupts: true}
	flaky := injectedFault{Kind: "receiver-500", Start: at(30), End: at(35)}
	base := func() checkInput {
		return checkInput{
			Committed:    map[string]string{"k1": "order.paid", "k2": "audit.note"},
			NotCommitted: []string{"k3"},
			Subscribers:  subs,
			Faults:       []injectedFault{kill, flaky},
			Slack:        2 * time.Second,
			Log: []faultDelivery{
				ok("orders", "1", "k1", "order.paid", 1),
				refused(ok("all", "1", "k1", "order.paid", 1)),
				ok("all", "1", "k1", "order.paid", 3),
				ok("all", "2", "k2", "audit.note", 2),
			},
		}
	}
	type want struct {
		Deliveries, Duplicates, Lost int
		Unexplained, Problems        int
	}
	for _, tc := range []struct {
		name   string
		change func(*checkInput)
		want   want
	}{
		{"clean run", func(*checkInput) {}, want{Deliveries: 3}},
		{"a pair never accepted is lost", func(in *checkInput) { in.Log = in.Log[1:] }, want{Deliveries: 2, Lost: 1, Problems: 1}},
		{"a refused request is not a delivery", func(in *checkInput) { in.Log[2] = refused(in.Log[2]) }, want{Deliveries: 2, Lost: 1, Problems: 1}},
		{"a duplicate inside a kill is explained", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 20))
			in.Log[3].Arrived = at(9) // within the slack before the kill
		}, want{Deliveries: 4, Duplicates: 1}},
		{"a duplicate outside every interrupting fault is not", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 40))
			in.Log[3].Arrived = at(31) // a receiver 500 window cannot cut an accepted attempt
		}, want{Deliveries: 4, Duplicates: 1, Unexplained: 1}},
		{"two events for one row", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "9", "k2", "audit.note", 5))
		}, want{Deliveries: 4, Duplicates: 1, Unexplained: 1, Problems: 1}},
		{"an event of a rolled-back row", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "7", "k3", "audit.note", 5))
		}, want{Deliveries: 4, Problems: 1}},
		{"an event with no business row", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "8", "k8", "audit.note", 5))
		}, want{Deliveries: 4, Problems: 1}},
		{"a delivery to a non-subscriber", func(in *checkInput) {
			in.Log = append(in.Log, ok("orders", "2", "k2", "audit.note", 5))
		}, want{Deliveries: 4, Problems: 1}},
		{"a bad signature", func(in *checkInput) { in.Log[0].SigOK = false }, want{Deliveries: 3, Problems: 1}},
		{"webhook-id and body id differ", func(in *checkInput) { in.Log[1].BodyID = "2" }, want{Deliveries: 3, Problems: 1}},
		{"a topic unlike the row's", func(in *checkInput) {
			for i := range in.Log {
				if in.Log[i].WebhookID == "2" {
					in.Log[i].Topic = "order.paid"
				}
			}
		}, want{Deliveries: 3, Problems: 1}},
	} {
		in := base()
		tc.change(&in)
		res := checkFaultRun(in)
		got := want{res.Deliveries, res.Duplicates, res.Lost, len(res.Unexplained), len(res.Problems)}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s\nproblems: %s\nunexplained: %s", tc.name, diff,
				strings.Join(res.Problems, "; "), strings.Join(res.Unexplained, "; "))
		}
	}
}
