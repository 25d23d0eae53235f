// subscribe.go: in-process subscribers, Go code that consumes events
// through the job table with the same guarantees as a webhook.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
)

// Subscriber is an in-process consumer of events. The relay enqueues one job
// of kind "sub:"+Name for every event whose topic matches Topics; a worker
// runs Handle inside a transaction that also completes the job, so the
// effect and the completion commit together or not at all.
//
// Delivery is at least once: a job whose worker died is run again, so Handle
// must be idempotent (the same event twice has one effect). The registry
// test in subscribe_test.go checks that for every registered subscriber.
type Subscriber struct {
	Name   string   // unique; letters, digits, _ and -
	Topics []string // topic patterns (see topicPatternValid); empty: all
	// Coalesce makes the relay enqueue one job per topic and subject
	// within one pass, for the pass's latest (highest id) event of them,
	// and none for the others. Only for a subscriber whose effect is "the
	// latest state of the subject in its topic", which a later event
	// replaces whole. (A subject is the producer's key within a topic:
	// outbox.watch makes it a row's primary key, which two tables share.)
	Coalesce bool
	Handle   func(ctx context.Context, tx *sql.Tx, ev Event) error
	// HandleBatch, if set, handles the events of one claimed batch in one
	// call (one statement instead of one per event), with the same effect
	// as Handle on each in turn. Workers try it first; if it fails, the
	// batch runs again with Handle, event by event, so that only the
	// failing event is held back.
	HandleBatch func(ctx context.Context, tx *sql.Tx, evs []Event) error
}

// subscriberJobPrefix makes subscriber job kinds distinct from "webhook".
const subscriberJobPrefix = "sub:"

func (s Subscriber) jobKind() string { return subscriberJobPrefix + s.Name }

// subscriberRegistry is the set of subscribers of this process, fixed before
// the loops start and only read after.
type subscriberRegistry struct {
	byKind map[string]Subscriber
}

func newSubscriberRegistry() *subscriberRegistry {
	return &subscriberRegistry{byKind: map[string]Subscriber{}}
}

// Register adds s; it panics on a programming error (a bad or duplicate
// name, a bad pattern), which the tests catch before anyone runs it.
func (r *subscriberRegistry) Register(s Subscriber) {
	if !namePattern.MatchString(s.Name) {
		panic(fmt.Sprintf("subscriber name %q must match %s", s.Name, namePattern))
	}
	if _, dup := r.byKind[s.jobKind()]; dup {
		panic(fmt.Sprintf("subscriber %q registered twice", s.Name))
	}
	for _, p := range s.Topics {
		if err := topicPatternValid(p); err != nil {
			panic(fmt.Sprintf("subscriber %q: %v", s.Name, err))
		}
	}
	r.byKind[s.jobKind()] = s
}

// lookup finds the subscriber that runs jobs of kind.
func (r *subscriberRegistry) lookup(kind string) (Subscriber, bool) {
	s, ok := r.byKind[kind]
	return s, ok
}

// all lists the subscribers sorted by name.
func (r *subscriberRegistry) all() []Subscriber {
	subs := make([]Subscriber, 0, len(r.byKind))
	for _, s := range r.byKind {
		subs = append(subs, s)
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].Name < subs[j].Name })
	return subs
}

// jobTarget is a job kind the relay fans events out to: one job for every
// event whose topic matches Topics (see topicPatternValid; empty: all), or
// with Coalesce one per subject of a relay pass, for its latest event. The
// JSON names are what the relay's fan-out statement reads.
type jobTarget struct {
	Kind     string   `json:"kind"`
	Topics   []string `json:"topics"`
	Coalesce bool     `json:"per_subject"`
}

// targets is every subscriber as a job target, sorted by name.
func (r *subscriberRegistry) targets() []jobTarget {
	targets := []jobTarget{}
	for _, s := range r.all() {
		topics := s.Topics
		if topics == nil {
			topics = []string{}
		}
		targets = append(targets, jobTarget{Kind: s.jobKind(), Topics: topics, Coalesce: s.Coalesce})
	}
	return targets
}
