// faults_checker_test.go: the fault suite's judge. It reads only what the
// application and the receivers know, the business table and the
// receivers' own log (webhooks, the chain into outboxd's own inbox, mail),
// never outboxd's bookkeeping, and says what was lost, what arrived twice
// and whether each duplicate has an injected fault or a replay to explain
// it, and whether the ordered endpoint got each subject in order.

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

// faultDelivery is one request (or one mail) as its receiver saw it.
type faultDelivery struct {
	Endpoint  string // the endpoint's name, from the request path ("mail" for the SMTP sink)
	WebhookID string // the webhook-id header; a mail's event id, from its Message-ID
	BodyID    string // the body's "id"; a mail's "Event N"
	Key       string // the payload's "key": the business row
	Subject   string // the body's "subject"
	Topic     string // the body's "type"
	N         int    // the payload's "n": a lane event's place in its subject
	SigOK     bool   // the signature verified with the endpoint's secret (a mail has none: true)
	Arrived   time.Time
	Finished  time.Time // when the receiver answered, or stopped waiting for the sender
	// Accepted: the receiver did the work and answered (or tried to
	// answer) 2xx, or 250 to a mail; for the chain, outboxd's own inbox
	// answered 2xx. Every other outcome is a refusal outboxd must retry.
	Accepted bool
	Outcome  string // accepted, 500, hung, closed, held; the chain adds the inbox's status
}

// injectedFault is one fault and the time it was in force.
type injectedFault struct {
	Kind   string
	Detail string
	Start  time.Time
	End    time.Time
	// Interrupts: the fault can cut an attempt after the receiver
	// accepted it and before outboxd recorded the outcome, the one way a
	// duplicate is legitimate besides a replay.
	Interrupts bool
}

// faultReplay is a replay the suite asked for: of every event of Topics
// recorded from the run's start until Until, to each of Endpoints, asked
// at Start and answered at End.
type faultReplay struct {
	Endpoints  []string
	Topics     []string
	Until      time.Time
	Start, End time.Time
	// Finished holds the (endpoint, business key) pairs whose delivery
	// outboxd had finished (completed or discarded) right before the
	// replay was asked: the ones it promises to send again. A delivery
	// still waiting or running then is left as it is (replay.go).
	Finished map[[2]string]bool
}

// covers reports whether the replay sends again an event of topic
// recorded at recorded to ep.
func (r faultReplay) covers(ep, topic string, recorded time.Time) bool {
	return slices.Contains(r.Endpoints, ep) && slices.Contains(r.Topics, topic) && recorded.Before(r.Until)
}

// checkInput is everything the checker reads.
type checkInput struct {
	Committed    map[string]string    // business key -> topic, from the business table
	Recorded     map[string]time.Time // business key -> when its event was recorded (outbox.events.created_at)
	NotCommitted []string             // keys whose transaction rolled back (by choice or by error before COMMIT)
	Subscribers  map[string][]string  // topic -> the endpoints that subscribe to it
	// Derived: topic -> the topic of the event outboxd's inbox records
	// for each event of it that comes back through the chain; each
	// business row of the topic must have exactly one of those too.
	Derived map[string]string
	Ordered []string // endpoints with "ordering": "subject"
	Log     []faultDelivery
	Faults  []injectedFault
	Replays []faultReplay
	// Slack widens a fault's window backwards: an attempt accepted this
	// long before the fault can still be waiting for its outcome to be
	// recorded (the attempt timeout).
	Slack time.Duration
}

// checkResult is the verdict. Problems are invariant violations; lost and
// unexplained duplicates are counted apart because the summary shows them.
type checkResult struct {
	Events      int            // committed business rows, each with its one event (and its derived one)
	Deliveries  int            // accepted requests
	ByEndpoint  map[string]int // accepted requests by endpoint
	Duplicates  int            // accepted requests beyond the first per (event, endpoint)
	Lost        int            // (event, endpoint) pairs never accepted, and replayed pairs the replay never reached
	Unexplained []string
	Problems    []string
}

func (r *checkResult) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// eventInfo is what the deliveries say an event is.
type eventInfo struct{ key, subject, topic string }

// deliveryPair is one event at one endpoint.
type deliveryPair struct{ endpoint, id string }

// checkState is the log read once: each event, the events of each
// business row and topic, and when each pair was accepted.
type checkState struct {
	events   map[string]eventInfo
	ofKey    map[[2]string]map[string]bool // (key, topic) -> event ids
	accepted map[deliveryPair][]time.Time
}

// checkFaultRun judges a run. It is a pure function of its input, so its
// own test feeds it each kind of failure.
func checkFaultRun(in checkInput) checkResult {
	var res checkResult
	st := readLog(in.Log, &res)
	checkEventsBelong(in, st, &res)
	keys := make([]string, 0, len(in.Committed))
	for k := range in.Committed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		res.Events++
		topic := in.Committed[key]
		topics := []string{topic}
		if d, ok := in.Derived[topic]; ok {
			topics = append(topics, d)
		}
		for _, tp := range topics {
			checkPairs(in, st, key, tp, &res)
		}
	}
	checkReplaysReached(in, st, keys, &res)
	for _, ep := range in.Ordered {
		checkLaneOrder(in.Log, ep, &res)
	}
	return res
}

// readLog indexes the log and reports requests that contradict themselves
// or each other.
func readLog(log []faultDelivery, res *checkResult) checkState {
	st := checkState{events: map[string]eventInfo{}, ofKey: map[[2]string]map[string]bool{}, accepted: map[deliveryPair][]time.Time{}}
	for _, d := range log {
		if d.WebhookID == "" || d.BodyID != d.WebhookID {
			res.problem("request to %s: webhook-id %q and body id %q differ", d.Endpoint, d.WebhookID, d.BodyID)
			continue
		}
		if !d.SigOK {
			res.problem("request to %s for event %s: signature does not verify", d.Endpoint, d.WebhookID)
		}
		info := eventInfo{d.Key, d.Subject, d.Topic}
		if prev, ok := st.events[d.WebhookID]; ok && prev != info {
			res.problem("event %s arrived as %v and as %v", d.WebhookID, prev, info)
		}
		st.events[d.WebhookID] = info
		kt := [2]string{d.Key, d.Topic}
		if st.ofKey[kt] == nil {
			st.ofKey[kt] = map[string]bool{}
		}
		st.ofKey[kt][d.WebhookID] = true
		if d.Accepted {
			res.Deliveries++
			if res.ByEndpoint == nil {
				res.ByEndpoint = map[string]int{}
			}
			res.ByEndpoint[d.Endpoint]++
			p := deliveryPair{d.Endpoint, d.WebhookID}
			st.accepted[p] = append(st.accepted[p], d.Arrived)
		}
	}
	for p := range st.accepted {
		slices.SortFunc(st.accepted[p], func(a, b time.Time) int { return a.Compare(b) })
	}
	return st
}

// checkEventsBelong: every event has a committed business row, with the
// row's topic or the topic derived from it, and goes only to the
// endpoints that subscribe to its topic.
func checkEventsBelong(in checkInput, st checkState, res *checkResult) {
	notCommitted := map[string]bool{}
	for _, k := range in.NotCommitted {
		notCommitted[k] = true
	}
	for id, ev := range st.events {
		topic, ok := in.Committed[ev.key]
		switch {
		case notCommitted[ev.key]:
			res.problem("event %s belongs to %s, whose transaction did not commit", id, ev.key)
		case !ok:
			res.problem("event %s (key %q) has no business row", id, ev.key)
		case ev.topic != topic && ev.topic != in.Derived[topic]:
			res.problem("event %s has topic %q, its business row %q", id, ev.topic, topic)
		}
	}
	for p := range st.accepted {
		if !slices.Contains(in.Subscribers[st.events[p.id].topic], p.endpoint) {
			res.problem("event %s (topic %q) delivered to %s, which does not subscribe to it", p.id, st.events[p.id].topic, p.endpoint)
		}
	}
}

// checkPairs: business row key has exactly one event of topic, and that
// event reached every endpoint that subscribes to topic at least once;
// every further delivery is explained.
func checkPairs(in checkInput, st checkState, key, topic string, res *checkResult) {
	ids := st.ofKey[[2]string{key, topic}]
	if len(ids) > 1 {
		res.problem("business row %s has %d events of %s: %v", key, len(ids), topic, idList(ids))
	}
	for _, ep := range in.Subscribers[topic] {
		var times []time.Time
		for id := range ids {
			times = append(times, st.accepted[deliveryPair{ep, id}]...)
		}
		if len(times) == 0 {
			res.Lost++
			if res.Lost <= 20 {
				res.problem("lost: business row %s (%s) never reached %s", key, topic, ep)
			}
			continue
		}
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		res.Duplicates += len(times) - 1
		if !duplicatesExplained(in, ep, in.Recorded[key], topic, times) {
			res.Unexplained = append(res.Unexplained, fmt.Sprintf("%s (%s) to %s: %d deliveries, the first at %s",
				key, topic, ep, len(times), times[0].Format("15:04:05.000")))
		}
	}
}

// duplicatesExplained: every delivery after the first (times, in order)
// follows one that a fault could have cut between the receiver's 2xx and
// outboxd's record of it, or is a replay's: a replay adds one delivery,
// at or after its start, to each event it covers. (A replay enqueues its
// window in batches as its lane drains, so it also sends again an event
// that was first delivered after it was asked for.)
func duplicatesExplained(in checkInput, ep string, recorded time.Time, topic string, times []time.Time) bool {
	var replays []faultReplay
	for _, r := range in.Replays {
		if r.covers(ep, topic, recorded) {
			replays = append(replays, r)
		}
	}
	for j := 1; j < len(times); j++ {
		if explained(in.Faults, times[j-1], in.Slack) {
			continue
		}
		i := slices.IndexFunc(replays, func(r faultReplay) bool { return !times[j].Before(r.Start) })
		if i < 0 {
			return false
		}
		replays = slices.Delete(replays, i, i+1)
	}
	return true
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

// checkReplaysReached: a replay sends again every event it covers that
// its endpoint had finished with when it was asked (faultReplay.Finished):
// each must arrive again at or after the replay's start, or the replay
// lost it. The receiver's log alone cannot tell finished from running: an
// accepted attempt is finished only once outboxd has written its outcome,
// which a loaded machine can delay by seconds.
func checkReplaysReached(in checkInput, st checkState, keys []string, res *checkResult) {
	for _, r := range in.Replays {
		for _, ep := range r.Endpoints {
			for _, key := range keys {
				topic := in.Committed[key]
				if !r.Finished[[2]string{ep, key}] || !slices.Contains(in.Subscribers[topic], ep) || !r.covers(ep, topic, in.Recorded[key]) {
					continue
				}
				again := false
				for id := range st.ofKey[[2]string{key, topic}] {
					again = again || slices.ContainsFunc(st.accepted[deliveryPair{ep, id}], func(t time.Time) bool { return !t.Before(r.Start) })
				}
				if !again {
					res.Lost++
					res.problem("lost: the replay at %s never sent business row %s (%s) to %s again", r.Start.Format("15:04:05.000"), key, topic, ep)
				}
			}
		}
	}
}

// checkLaneOrder: an ordered endpoint gets each subject one request at a
// time (none starts before the one before it ended), in order (no request
// for a subject's event n before its event n-1 was accepted, and none for
// an event after one for a later event).
func checkLaneOrder(log []faultDelivery, ep string, res *checkResult) {
	bySubject := map[string][]faultDelivery{}
	for _, d := range log {
		if d.Endpoint == ep {
			bySubject[d.Subject] = append(bySubject[d.Subject], d)
		}
	}
	subjects := make([]string, 0, len(bySubject))
	for s := range bySubject {
		subjects = append(subjects, s)
	}
	sort.Strings(subjects)
	for _, s := range subjects {
		ds := bySubject[s]
		slices.SortFunc(ds, func(a, b faultDelivery) int { return a.Arrived.Compare(b.Arrived) })
		var ended time.Time
		acceptedUpTo, last := 0, 0
		for _, d := range ds {
			var wrong string
			switch {
			case d.N < 1:
				wrong = "without its place in the subject (no n in its payload)"
			case d.Arrived.Before(ended):
				wrong = "while an earlier request of the subject was still open"
			case d.N > acceptedUpTo+1:
				wrong = fmt.Sprintf("while n=%d was the last accepted", acceptedUpTo)
			case d.N < last:
				wrong = fmt.Sprintf("after n=%d", last)
			}
			if wrong != "" {
				res.problem("order: %s subject %s: n=%d arrived at %s %s", ep, s, d.N, d.Arrived.Format("15:04:05.000"), wrong)
				break
			}
			if d.Finished.After(ended) {
				ended = d.Finished
			}
			if d.Accepted {
				acceptedUpTo = max(acceptedUpTo, d.N)
			}
			last = d.N
		}
	}
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
	subs := map[string][]string{
		"order.paid": {"orders", "all"}, "audit.note": {"all"}, "user.signup": {"chain"},
		"chain.user.signup": {"all"}, "lane.step": {"lanes"},
	}
	ok := func(ep, id, key, topic string, s int) faultDelivery {
		return faultDelivery{Endpoint: ep, WebhookID: id, BodyID: id, Key: key, Subject: key, Topic: topic, SigOK: true,
			Arrived: at(s), Finished: at(s).Add(time.Millisecond), Accepted: true, Outcome: "accepted"}
	}
	lane := func(id string, n, s int) faultDelivery {
		d := ok("lanes", id, "l"+id, "lane.step", s) // ids 50 and up
		d.Subject, d.N = "s", n
		return d
	}
	refused := func(d faultDelivery) faultDelivery { d.Accepted, d.Outcome = false, "500"; return d }
	kill := injectedFault{Kind: "kill", Start: at(10), End: at(15), Interrupts: true}
	flaky := injectedFault{Kind: "receiver-500", Start: at(30), End: at(35)}
	base := func() checkInput {
		return checkInput{
			Committed:    map[string]string{"k1": "order.paid", "k2": "audit.note", "k4": "user.signup", "l50": "lane.step", "l51": "lane.step"},
			Recorded:     map[string]time.Time{"k1": at(0), "k2": at(0), "k4": at(0), "l50": at(0), "l51": at(0)},
			NotCommitted: []string{"k3"},
			Subscribers:  subs,
			Derived:      map[string]string{"user.signup": "chain.user.signup"},
			Ordered:      []string{"lanes"},
			Faults:       []injectedFault{kill, flaky},
			Slack:        2 * time.Second,
			Log: []faultDelivery{
				ok("orders", "1", "k1", "order.paid", 1),
				refused(ok("all", "1", "k1", "order.paid", 1)),
				ok("all", "1", "k1", "order.paid", 3),
				ok("all", "2", "k2", "audit.note", 2),
				ok("chain", "4", "k4", "user.signup", 2),
				ok("all", "40", "k4", "chain.user.signup", 3),
				lane("50", 1, 4),
				lane("51", 2, 5),
			},
		}
	}
	// finished is a replay's Finished from endpoint, key pairs.
	finished := func(pairs ...string) map[[2]string]bool {
		m := map[[2]string]bool{}
		for i := 0; i+1 < len(pairs); i += 2 {
			m[[2]string{pairs[i], pairs[i+1]}] = true
		}
		return m
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
		{"clean run", func(*checkInput) {}, want{Deliveries: 7}},
		{"a pair never accepted is lost", func(in *checkInput) { in.Log = in.Log[1:] }, want{Deliveries: 6, Lost: 1, Problems: 1}},
		{"a refused request is not a delivery", func(in *checkInput) { in.Log[2] = refused(in.Log[2]) }, want{Deliveries: 6, Lost: 1, Problems: 1}},
		{"a duplicate inside a kill is explained", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 20))
			in.Log[3].Arrived = at(9) // within the slack before the kill
		}, want{Deliveries: 8, Duplicates: 1}},
		{"a duplicate outside every interrupting fault is not", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 40))
			in.Log[3].Arrived = at(31) // a receiver 500 window cannot cut an accepted attempt
		}, want{Deliveries: 8, Duplicates: 1, Unexplained: 1}},
		{"a third delivery needs a second cut", func(in *checkInput) {
			in.Log[3].Arrived = at(9)
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 20), ok("all", "2", "k2", "audit.note", 40))
		}, want{Deliveries: 9, Duplicates: 2, Unexplained: 1}},
		{"two events for one row", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "9", "k2", "audit.note", 5))
		}, want{Deliveries: 8, Duplicates: 1, Unexplained: 1, Problems: 1}},
		{"the inbox records a webhook twice", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "41", "k4", "chain.user.signup", 6))
		}, want{Deliveries: 8, Duplicates: 1, Unexplained: 1, Problems: 1}},
		{"the inbox's event never delivered", func(in *checkInput) { in.Log = slices.Delete(in.Log, 5, 6) }, want{Deliveries: 6, Lost: 1, Problems: 1}},
		{"an event of a rolled-back row", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "7", "k3", "audit.note", 5))
		}, want{Deliveries: 8, Problems: 1}},
		{"an event with no business row", func(in *checkInput) {
			in.Log = append(in.Log, ok("all", "8", "k8", "audit.note", 5))
		}, want{Deliveries: 8, Problems: 1}},
		{"a delivery to a non-subscriber", func(in *checkInput) {
			in.Log = append(in.Log, ok("orders", "2", "k2", "audit.note", 5))
		}, want{Deliveries: 8, Problems: 1}},
		{"a bad signature", func(in *checkInput) { in.Log[0].SigOK = false }, want{Deliveries: 7, Problems: 1}},
		{"webhook-id and body id differ", func(in *checkInput) { in.Log[1].BodyID = "2" }, want{Deliveries: 7, Problems: 1}},
		{"a topic unlike the row's", func(in *checkInput) {
			for i := range in.Log {
				if in.Log[i].WebhookID == "2" {
					in.Log[i].Topic = "order.paid"
				}
			}
		}, want{Deliveries: 7, Lost: 1, Problems: 2}}, // and the row's own event never came
		{"a lane's event before the one before it was accepted", func(in *checkInput) {
			in.Log[6] = refused(in.Log[6])
			in.Log = append(in.Log, lane("50", 1, 6))
		}, want{Deliveries: 7, Problems: 1}},
		{"a lane's event without its n", func(in *checkInput) {
			in.Log[7].N = 0
		}, want{Deliveries: 7, Problems: 1}},
		{"a lane's two requests at once", func(in *checkInput) {
			in.Log[6].Finished = at(6)
		}, want{Deliveries: 7, Problems: 1}},
		{"a lane's earlier event after a later one", func(in *checkInput) {
			in.Log = append(in.Log, lane("50", 1, 40))
		}, want{Deliveries: 8, Duplicates: 1, Unexplained: 1, Problems: 1}},
		{"a replay's second delivery is explained", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all", "chain"}, Topics: []string{"order.paid", "audit.note", "user.signup"}, Until: at(19), Start: at(20), End: at(21),
				Finished: finished("all", "k1", "all", "k2", "chain", "k4")}}
			in.Log = append(in.Log, ok("all", "1", "k1", "order.paid", 22), ok("all", "2", "k2", "audit.note", 22), ok("chain", "4", "k4", "user.signup", 22))
		}, want{Deliveries: 10, Duplicates: 3}},
		{"a replay that never reached a finished event lost it", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all"}, Topics: []string{"order.paid", "audit.note"}, Until: at(19), Start: at(20), End: at(21),
				Finished: finished("all", "k1", "all", "k2")}}
			in.Log = append(in.Log, ok("all", "1", "k1", "order.paid", 22))
		}, want{Deliveries: 8, Duplicates: 1, Lost: 1, Problems: 1}},
		{"a replay leaves what was still running when it was asked", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all"}, Topics: []string{"order.paid", "audit.note"}, Until: at(19), Start: at(20), End: at(21),
				Finished: finished("all", "k1")}} // k2 accepted long before, its outcome not yet written
			in.Log = append(in.Log, ok("all", "1", "k1", "order.paid", 22))
		}, want{Deliveries: 8, Duplicates: 1}},
		{"a replay's resend before it was asked is not its own", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all"}, Topics: []string{"audit.note"}, Until: at(19), Start: at(20), End: at(21),
				Finished: finished("all", "k2")}}
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 19))
		}, want{Deliveries: 8, Duplicates: 1, Lost: 1, Unexplained: 1, Problems: 1}},
		{"a replay explains nothing at another endpoint", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all"}, Topics: []string{"order.paid", "audit.note"}, Until: at(19), Start: at(20), End: at(21),
				Finished: finished("all", "k1", "all", "k2", "orders", "k1")}}
			in.Log = append(in.Log, ok("all", "1", "k1", "order.paid", 22), ok("all", "2", "k2", "audit.note", 22), ok("orders", "1", "k1", "order.paid", 22))
		}, want{Deliveries: 10, Duplicates: 3, Unexplained: 1}},
		{"a replay explains nothing of another topic", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all"}, Topics: []string{"audit.note"}, Until: at(19), Start: at(20), End: at(21),
				Finished: finished("all", "k1", "all", "k2")}}
			in.Log = append(in.Log, ok("all", "1", "k1", "order.paid", 22), ok("all", "2", "k2", "audit.note", 22))
		}, want{Deliveries: 9, Duplicates: 2, Unexplained: 1}},
		{"a replay resends an event first delivered after it was asked", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all"}, Topics: []string{"audit.note"}, Until: at(19), Start: at(20), End: at(21)}}
			in.Log[3].Arrived = at(25)
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 30))
		}, want{Deliveries: 8, Duplicates: 1}},
		{"an event recorded after a replay's window is not the replay's", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all"}, Topics: []string{"audit.note"}, Until: at(1), Start: at(20), End: at(21)}}
			in.Recorded["k2"] = at(2)
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 30))
		}, want{Deliveries: 8, Duplicates: 1, Unexplained: 1}},
		{"an event recorded after a replay is not the replay's", func(in *checkInput) {
			in.Replays = []faultReplay{{Endpoints: []string{"all"}, Topics: []string{"audit.note"}, Until: at(19), Start: at(20), End: at(21)}}
			in.Recorded["k2"] = at(22)
			in.Log[3].Arrived = at(25)
			in.Log = append(in.Log, ok("all", "2", "k2", "audit.note", 30))
		}, want{Deliveries: 8, Duplicates: 1, Unexplained: 1}},
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
