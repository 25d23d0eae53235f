// lanes.go: ordered lanes, one delivery at a time per endpoint and
// subject. The relay and the completer advance their lanes inside their
// own statements (schema.sql, outbox.fan_out and outbox.record_outcomes);
// the other transactions that take a delivery out of its lane (a retry by
// hand, a replay's cancel, a rescue) advance theirs through advanceLanes.

package main

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/lib/pq"
)

// laneKeys names ordered lanes: endpointIDs[i] with keys[i].
type laneKeys struct {
	endpointIDs []int64
	keys        []string
}

// finishedLane is the lane of a job that left it, put back, rescued or
// cancelled: a row of the statements putBack, the rescues and a replay's
// cancel run (the completer's finished lanes stay in its statement,
// outbox.record_outcomes). Both are NULL for a job of no ordered lane.
type finishedLane struct {
	endpointID sql.NullInt64
	key        sql.NullString
}

func scanFinishedLane(row rowScanner) (finishedLane, error) {
	var l finishedLane
	err := row.Scan(&l.endpointID, &l.key)
	return l, err
}

// finishedLanes are the ordered lanes of the rows, each once, in endpoint
// id order.
func finishedLanes(rows []finishedLane) laneKeys {
	type lane struct {
		endpointID int64
		key        string
	}
	seen := map[lane]bool{}
	var lanes []lane
	for _, r := range rows {
		l := lane{r.endpointID.Int64, r.key.String}
		if !r.endpointID.Valid || !r.key.Valid || seen[l] {
			continue
		}
		seen[l] = true
		lanes = append(lanes, l)
	}
	slices.SortFunc(lanes, func(a, b lane) int {
		return cmp.Or(cmp.Compare(a.endpointID, b.endpointID), strings.Compare(a.key, b.key))
	})
	var out laneKeys
	for _, l := range lanes {
		out.endpointIDs = append(out.endpointIDs, l.endpointID)
		out.keys = append(out.keys, l.key)
	}
	return out
}

// advanceLanes makes the next held delivery of each lane due where the
// lane has none active (schema.sql, outbox.advance_lanes), for a
// transaction that may have held deliveries: a replay, a retry by hand, a
// rescue. Such deliveries wait for a release of their endpoint's lanes in
// flight (hold true). The relay's and the completer's functions advance
// their lanes in SQL (outbox.fan_out, outbox.record_outcomes).
func advanceLanes(ctx context.Context, tx *sql.Tx, lanes laneKeys) error {
	if len(lanes.endpointIDs) == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `SELECT outbox.advance_lanes($1, $2, true)`,
		pq.Array(lanes.endpointIDs), pq.Array(lanes.keys)); err != nil {
		return fmt.Errorf("advance ordered lanes: %w", err)
	}
	return nil
}
