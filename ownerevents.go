// ownerevents.go: an owner's view of the event stream (docs/owners.md):
// the search, which is the admin's stream with EventFilter.Owner set, one
// event by id, and where on the portal each event of its search links to.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"

	"github.com/lib/pq"
)

// scopeEventFilter makes f the search of r's sender (principalOf): the
// admin's as given; an owner's the events its endpoints were sent
// (EventFilter.Owner), without the state and outcome filters, which read
// every endpoint's jobs; nobody's refused, so that a route served
// without a principal fails closed.
func scopeEventFilter(r *http.Request, f *EventFilter) error {
	who := principalOf(r)
	switch {
	case who.admin:
		return nil
	case who.owner == nil:
		return &httpError{status: http.StatusUnauthorized, text: "missing or wrong token"}
	case f.State != "":
		return fmt.Errorf("%w: state: an owner's search takes topic, subject, payload, since and until", errInvalid)
	case f.Outcome != "":
		return fmt.Errorf("%w: outcome: an owner's search takes topic, subject, payload, since and until", errInvalid)
	}
	f.Owner = who.owner.ID
	return nil
}

// readOwnerEvent is event id as owner ownerID may see it: one its
// endpoints were sent, found by the stream's own owner condition, and
// the jobs it made for its endpoints alone; not found, word for word as
// for an event that does not exist, when its endpoints were sent none.
func readOwnerEvent(ctx context.Context, db *sql.DB, ownerID, id int64) (eventWithJobs, error) {
	// Between id-1 and id+1: the one id, read by listEvents' query.
	found, err := listEvents(ctx, db, EventFilter{Owner: ownerID, Before: id + 1, After: id - 1}, 1)
	if err != nil {
		return eventWithJobs{}, err
	}
	if len(found) == 0 {
		return eventWithJobs{}, fmt.Errorf("event %d: %w", id, errNotFound) // the text getEvent's 404 has
	}
	jobs, err := listJobs(ctx, db, JobFilter{EventID: id, Limit: maxEventPage})
	if err != nil {
		return eventWithJobs{}, err
	}
	owned, err := queryAll(ctx, db, func(row rowScanner) (int64, error) {
		var id int64
		return id, row.Scan(&id)
	}, `SELECT id FROM outbox.endpoints WHERE owner_id = $1`, ownerID)
	if err != nil {
		return eventWithJobs{}, fmt.Errorf("list owner %d's endpoints: %w", ownerID, err)
	}
	mine := map[int64]bool{}
	for _, id := range owned {
		mine[id] = true
	}
	kept := []JobView{}
	for _, j := range jobs {
		if j.EndpointID != nil && mine[*j.EndpointID] {
			kept = append(kept, j)
		}
	}
	return eventWithJobs{Event: found[0], Jobs: kept}, nil
}

// ownerEventLinksSQL is, for each event of $2, one of owner $1's
// endpoints it was sent: one with a job in the queue first, the one
// whose event page (readDeliveredEvent) reads the event.
const ownerEventLinksSQL = `
SELECT DISTINCT ON (sent.event_id) sent.event_id, sent.endpoint_id
FROM (SELECT event_id, endpoint_id, true AS queued FROM outbox.jobs WHERE event_id = ANY($2::bigint[])
      UNION ALL
      SELECT event_id, endpoint_id, false FROM outbox.deliveries WHERE event_id = ANY($2::bigint[])) AS sent
JOIN outbox.endpoints ep ON ep.id = sent.endpoint_id AND ep.owner_id = $1
ORDER BY sent.event_id, sent.queued DESC, sent.endpoint_id`

// ownerEventLinks maps each of events to the endpoint of owner ownerID
// whose event page the portal's search links it to.
func ownerEventLinks(ctx context.Context, db *sql.DB, ownerID int64, events []Event) (map[int64]int64, error) {
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	type link struct{ event, endpoint int64 }
	rows, err := queryAll(ctx, db, func(row rowScanner) (link, error) {
		var l link
		return l, row.Scan(&l.event, &l.endpoint)
	}, ownerEventLinksSQL, ownerID, pq.Array(ids))
	if err != nil {
		return nil, fmt.Errorf("link owner %d's events: %w", ownerID, err)
	}
	links := make(map[int64]int64, len(rows))
	for _, l := range rows {
		links[l.event] = l.endpoint
	}
	return links, nil
}
