// relay_born_test.go: deliveries born running. A relay pass that claims
// for its own workers inserts the deliveries they can start at once as
// running (schema.sql, outbox.fan_out), within their endpoint's cap, and
// only where a claim would have started them.

package main

import (
	"context"
	"database/sql"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
)

// bornPass runs one relay pass that claims into reserved slots for
// replica, as the relay of a process with the default workers sends it
// (relay.go, fanOutAndClaimSQL), and returns the jobs it handed over, in
// order.
func bornPass(t *testing.T, db *sql.DB, reserved int, replica int64, answered ...int64) []claimedRow {
	t.Helper()
	return bornPassSharing(t, db, reserved, defaultShare, replica, answered...)
}

// bornPassSharing is bornPass for a process whose workerShare is share.
func bornPassSharing(t *testing.T, db *sql.DB, reserved, share int, replica int64, answered ...int64) []claimedRow {
	t.Helper()
	rows, err := queryAll(context.Background(), db, func(row rowScanner) (claimedRow, error) {
		var c claimedRow
		var fanned, jobs int
		err := row.Scan(append([]any{&fanned, &jobs}, c.dest()...)...)
		return c, err
	}, fanOutAndClaimSQL, 200, `[]`, 18, 300.0, "", reserved, replica, pq.Array(answered), share, nil)
	if err != nil {
		t.Fatal(err)
	}
	var handed []claimedRow
	for _, c := range rows {
		if c.id.Valid {
			handed = append(handed, c)
		}
	}
	return handed
}

// jobIDs are the ids of claimed jobs.
func jobIDs(jobs []claimedRow) []int64 {
	ids := make([]int64, len(jobs))
	for i, j := range jobs {
		ids[i] = j.id.Int64
	}
	return ids
}

// insertEndpoint inserts an endpoint of cap maxInFlight subscribed to
// topic, with the settings set (an UPDATE's SET list, or ""), and returns
// its id.
func insertEndpoint(t *testing.T, db *sql.DB, topic string, maxInFlight int, set string) int64 {
	t.Helper()
	var id int64
	if err := db.QueryRow(`INSERT INTO outbox.endpoints (url, topics, secret, max_in_flight)
		VALUES ('https://receiver.example.com/' || $1, ARRAY[$1], decode(repeat('ab', 32), 'hex'), $2)
		RETURNING id`, topic, maxInFlight).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if set != "" {
		mustExec(t, db, `UPDATE outbox.endpoints SET `+set+` WHERE id = $1`, id)
	}
	return id
}

// jobStates lists the states of the endpoint's jobs in event order.
func jobStates(t *testing.T, db *sql.DB, endpoint int64) []string {
	t.Helper()
	return queryStrings(t, db, `SELECT state::text FROM outbox.jobs WHERE endpoint_id = $1 ORDER BY event_id`, endpoint)
}

// An endpoint of cap 3 with one delivery of another replica's in flight
// has room for 2: of a pass's 5 deliveries to it, the first 2 are born
// running, held by the claiming replica at attempt 1, and the other 3 wait.
// Then those waiting come first: a later pass's delivery is not born while
// an older one is due, and the pass's claim takes the oldest instead.
func TestRelayPassBearsDeliveriesRunningWithinTheCap(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	replica := registeredReplica(t, db, 501).ID()
	other := registeredReplica(t, db, 502).ID()
	ep := insertEndpoint(t, db, "born.cap", 3, "")
	mustExec(t, db, `
		INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, state, attempt, attempted_at, held_by)
		VALUES ('webhook', outbox.record('elsewhere', '', '{}'), $1, 18, 'running', 1, now(), $2)`, ep, other)
	mustExec(t, db, `UPDATE outbox.events SET fanned_out_at = now()`)
	mustExec(t, db, `SELECT outbox.record('born.cap', i::text, '{}') FROM generate_series(1, 5) AS i`)

	handed := jobIDs(bornPass(t, db, 10, replica))
	if len(handed) != 2 {
		t.Fatalf("the pass handed over %v, want 2 jobs: the cap of 3 less the other replica's 1", handed)
	}
	if diff := cmp.Diff([]string{"running", "running", "running", "available", "available", "available"}, jobStates(t, db, ep)); diff != "" {
		t.Errorf("the endpoint's jobs by event (-want +got):\n%s", diff)
	}
	var born, held, attempt1 int
	if err := db.QueryRow(`SELECT count(*), count(*) FILTER (WHERE held_by = $2),
			count(*) FILTER (WHERE attempt = 1 AND attempted_at IS NOT NULL)
		FROM outbox.jobs WHERE id = ANY ($1)`, pq.Array(handed), replica).Scan(&born, &held, &attempt1); err != nil {
		t.Fatal(err)
	}
	if born != 2 || held != 2 || attempt1 != 2 {
		t.Errorf("of the jobs handed over, %d exist, %d held by the claiming replica, %d at attempt 1; want 2 of each", born, held, attempt1)
	}

	mustExec(t, db, `SELECT outbox.record('born.cap', 'later', '{}')`)
	oldest := queryInt(t, db, `SELECT min(id) FROM outbox.jobs WHERE endpoint_id = $1 AND state = 'available'`, ep)
	next := jobIDs(bornPass(t, db, 10, replica, handed[0]))
	if diff := cmp.Diff([]int64{int64(oldest)}, next); diff != "" {
		t.Errorf("with one delivery answered, the pass handed over (-want +got):\n%s", diff)
	}
	if got := jobStates(t, db, ep); got[len(got)-1] != "available" {
		t.Errorf("the later event's delivery is %s, want available: older ones are due", got[len(got)-1])
	}
}

// A delivery is born running only where a claim would start it at once:
// not to an endpoint that is paused, held, behind an open breaker, rate
// limited or ordered by subject. A plain endpoint in the same pass shows
// that the pass did bear deliveries.
func TestRelayPassBearsOnlyWhatAClaimWouldStart(t *testing.T) {
	t.Parallel()
	for name, set := range map[string]string{
		"paused":        `paused_at = now()`,
		"held":          `held_until = now() + interval '1 hour'`,
		"breaker open":  `breaker_opened_at = now(), consecutive_failures = 5`,
		"rate limited":  `rate_limit_per_second = 100`,
		"ordered lanes": `ordering = 'subject'`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db, _ := newTestDB(t)
			replica := registeredReplica(t, db, 503).ID()
			plain := insertEndpoint(t, db, "born.only", 10, "")
			special := insertEndpoint(t, db, "born.only", 10, set)
			mustExec(t, db, `SELECT outbox.record('born.only', 'subject', '{}')`)

			handed := jobIDs(bornPass(t, db, 10, replica))
			if diff := cmp.Diff([]string{"running"}, jobStates(t, db, plain)); diff != "" {
				t.Errorf("the plain endpoint's job (-want +got):\n%s", diff)
			}
			if got := jobStates(t, db, special); len(got) != 1 || got[0] == "running" {
				t.Errorf("the %s endpoint's jobs are %v, want one, not running", name, got)
			}
			if len(handed) != 1 {
				t.Errorf("the pass handed over %v, want the plain endpoint's 1 job", handed)
			}
		})
	}
}

// A lane another claim holds (its advisory lock, outbox.claim_lane_jobs)
// gets no delivery born running: that claim counts the lane's running
// jobs without seeing the pass's.
func TestRelayPassBearsNothingInALaneAClaimHolds(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	replica := registeredReplica(t, db, 504).ID()
	ep := insertEndpoint(t, db, "born.locked", 10, "")
	mustExec(t, db, `SELECT outbox.record('born.locked', i::text, '{}') FROM generate_series(1, 3) AS i`)

	holder, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.Exec(`SELECT pg_advisory_xact_lock(hashtext('outbox.claim_jobs'), ($1 % 2147483647)::integer)`, ep); err != nil {
		t.Fatal(err)
	}
	if handed := jobIDs(bornPass(t, db, 10, replica)); len(handed) != 0 {
		t.Errorf("the pass handed over %v while another claim held the lane, want none", handed)
	}
	if diff := cmp.Diff([]string{"available", "available", "available"}, jobStates(t, db, ep)); diff != "" {
		t.Errorf("the endpoint's jobs (-want +got):\n%s", diff)
	}
}

// A delivery born running reaches the workers as the workers' own claim
// would give it to them: the same claimed job, but for its ids and times.
func TestDeliveryBornRunningIsClaimedAsAClaimWouldClaimIt(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	replica := registeredReplica(t, db, 505).ID()
	insertEndpoint(t, db, "born.same", 10, `dedup_window_seconds = 60, dedup_window_seen_at = now()`)
	mustExec(t, db, `SELECT outbox.record('born.same', 'a', '{"n": 1}')`)
	born := bornPass(t, db, 10, replica)
	if len(born) != 1 {
		t.Fatalf("the first pass handed over %d jobs, want 1", len(born))
	}
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', finalized_at = now() WHERE state = 'running'`)
	mustExec(t, db, `SELECT outbox.record('born.same', 'a', '{"n": 1}')`)
	if handed := bornPass(t, db, 0, replica); len(handed) != 0 {
		t.Fatalf("a pass claiming nothing handed over %d jobs", len(handed))
	}
	claimed := claimedRowsOf(t, db, `SELECT `+claimedColumns+`, NULL::integer FROM outbox.claim_due_jobs(10, $1, '{}')`, replica)
	if len(claimed) != 1 {
		t.Fatalf("the claim took %d jobs, want 1", len(claimed))
	}
	if diff := cmp.Diff(withoutIdentity(born[0]), withoutIdentity(claimed[0]), cmp.AllowUnexported(claimedRow{})); diff != "" {
		t.Errorf("born running against claimed, but for ids and times (-born +claimed):\n%s", diff)
	}
}

// withoutIdentity is c without what tells two jobs of like events apart:
// their ids and times.
func withoutIdentity(c claimedRow) claimedRow {
	c.id, c.eventID = sql.NullInt64{}, sql.NullInt64{}
	c.createdAt, c.claimedAt, c.committedAt = sql.NullTime{}, sql.NullTime{}, sql.NullTime{}
	return c
}

// claimedRowsOf runs a query of claimedColumns and a lane limit and
// returns its rows as the workers read them.
func claimedRowsOf(t *testing.T, db *sql.DB, query string, args ...any) []claimedRow {
	t.Helper()
	rows, err := queryAll(context.Background(), db, func(row rowScanner) (claimedRow, error) {
		var c claimedRow
		err := row.Scan(c.dest()...)
		return c, err
	}, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}
