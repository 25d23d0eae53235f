// resend.go: the dedup rule that bounds every resend of an event, by a
// replay (replay.go), by hand (jobs.go) or after a hold (the claim's
// resendTooLate, which webhook.go applies), against the receiver's dedup
// window, and the inbox's own retention (main.go) by the same rule.

package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// The dedup rule (docs/inbox.md; its boundary is
// TestChainReplayAtTheEdgeOfTheWindowReachesBOnce). A receiver recognises
// a second delivery of a webhook only while it keeps the record of the
// first, which it made no earlier than the event was recorded. So every
// delivery of an event must reach the receiver within the receiver's
// dedup window, counted from the event's recording. The deliveries of an
// event, and how late each can be:
//
//   - The first delivery and its retries run from fan-out for at most the
//     retry horizon (retryHorizon: every delay at its longest, every
//     Retry-After at its hour). A record, if the receiver made one, dates
//     from the first of these attempts, so they all end within a horizon
//     of it.
//   - A replay resends events recorded within events retention
//     (replayEndpoint clamps to it by created_at), so it starts at most
//     events retention after the event.
//   - A retry by hand of a discarded job: retention.go keeps an event while
//     any job of it is not completed, so a discarded job keeps its event
//     for -discarded-jobs-retention after the discard, which comes up to a
//     horizon after fan-out, and the job cleaner may run an interval late.
//     Unclamped, such a retry could start 4.3 + 7 days and an hour after
//     the event at the defaults, and retry for 4.3 days more. So retries
//     by hand are clamped to events retention too (retryJob,
//     retryDiscarded).
//   - A resend, once started, retries for a whole horizon: a replayed
//     event whose completed job the job cleaner removed (a day after it
//     finished) gets a new job, at attempt 0.
//   - Any of these may be held past its schedule, for as long as the hold
//     lasts: a paused endpoint has no room in the claim until it is
//     resumed, and an open breaker lets one attempt through at a time, so
//     a backlog behind it waits its turn. The claim is the bound that
//     holds whatever the hold: a delivery that may have reached the
//     receiver before (an earlier attempt of its job, or a replay's) is
//     not attempted once its event is older than the window the receiver
//     advertised, or than the retry horizon if that is longer (a run of
//     retries is never cut shorter than it would run unheld; such a
//     window is what receiver_window_short warns of). It ends discarded
//     without a request, saying why (resendTooLate). A first delivery
//     goes whenever it is claimed: the receiver has no record of it to
//     have lost, and its retries follow within a horizon of the record
//     it makes. Toward a receiver that advertised no window the hold is
//     not bounded: nothing is known of how long it dedupes.
//
// A sender's resend horizon is therefore its events retention plus the
// retry horizon of its attempts (resendHorizon), and a receiver's window
// must be longer. Nothing in it waits for a sweep: the clamps count from
// created_at, and a late sweep only keeps rows longer. What the horizon
// does not count is the time an attempt starts after its schedule (a busy
// pool, the rescuer) and a difference between the two databases' clocks;
// an outboxd inbox keeps one retention interval for them, advertising its
// retention less the interval (advertisedWindow). Together, the rule an
// outboxd checks for itself at start is
//
//	inbox retention > events retention + retry horizon + retention interval
//
// (11.4 days at the defaults), as if its senders were configured like it.

// resendHorizon is how long after an event was recorded a sender with this
// events retention and these attempts may still deliver it. 0 means
// unbounded: with events kept forever a replay may resend any of them.
func resendHorizon(eventsRetention time.Duration, maxAttempts int) time.Duration {
	if eventsRetention <= 0 {
		return 0
	}
	return eventsRetention + retryHorizon(maxAttempts)
}

// advertisedWindow is the dedup window an outboxd inbox promises: its
// retention less one retention interval of margin. 0 (retention off,
// records kept forever) promises no bound, and nothing is advertised.
func advertisedWindow(inboxRetention, interval time.Duration) time.Duration {
	if inboxRetention <= 0 {
		return 0
	}
	return max(inboxRetention-interval, 0)
}

// windowCovers is the rule: a receiver's dedup window covers a sender when
// it is longer than the sender's resend horizon (0: unbounded, which no
// window covers).
func windowCovers(window, horizon time.Duration) bool {
	return horizon > 0 && window > horizon
}

// resendCutoff bounds a resend an operator starts (a replay, a retry by
// hand) at now: only events recorded at or after from may be resent. It
// is the dedup rule turned around. An event may be at most events
// retention old, which is what this sender promises receivers configured
// like it; and, toward a receiver that advertised its window (0: none),
// at most that window less the retry horizon old, so the resend's last
// attempt still finds the record. A window shorter than the horizon
// leaves nothing to resend (from is now). bounded is false when neither
// applies; why says what bounds it, for the operator.
func resendCutoff(now time.Time, eventsRetention time.Duration, maxAttempts int, window time.Duration) (from time.Time, why string, bounded bool) {
	if eventsRetention > 0 {
		from, bounded = now.Add(-eventsRetention), true
		why = fmt.Sprintf("events older than the retention window (%s) may already be deleted, and a receiver's dedup record with them", eventsRetention)
	}
	if window > 0 {
		h := retryHorizon(maxAttempts)
		if oldest := now.Add(-max(window-h, 0)); !bounded || oldest.After(from) {
			from, bounded = oldest, true
			why = fmt.Sprintf("the receiver recognises a redelivery for %s (its %s), and a resend may retry for %s, so an older event could be recorded twice",
				window, headerDedupWindow, h.Round(time.Second))
		}
	}
	return from, why, bounded
}

// resendDeadline is how old an event may be when a delivery of it that
// may have reached its receiver is attempted again, toward a receiver
// that advertised window (0: none, and no bound, which 0 returns too):
// the window, within which the receiver still holds its record of the
// earlier attempt (a record made no earlier than the event), or the
// retry horizon of maxAttempts if that is longer.
func resendDeadline(window time.Duration, maxAttempts int) time.Duration {
	if window <= 0 {
		return 0
	}
	return max(window, retryHorizon(maxAttempts))
}

// resendTooLate says why job, a claimed delivery, must not be sent (nil:
// send it): it may have reached its receiver before, and its event is
// older than resendDeadline allows, by the claim's clock.
func resendTooLate(job Job) error {
	deadline := resendDeadline(job.resendWindow, job.MaxAttempts)
	age := job.claimedAt.Sub(job.Event.CreatedAt)
	if deadline == 0 || age < deadline {
		return nil
	}
	past := "that window"
	if deadline > job.resendWindow {
		past = fmt.Sprintf("the retry horizon (%s), which is longer", deadline.Round(time.Second))
	}
	return fmt.Errorf("not sent: an earlier attempt may have reached the receiver, which recognises a redelivery for %s (its %s), "+
		"and event %d was recorded %s ago, past %s, so this attempt could be recorded twice",
		job.resendWindow, headerDedupWindow, job.Event.ID, age.Round(time.Second), past)
}

// databaseNow is the database's clock, the one that stamps created_at,
// which every resend cutoff is compared with.
func databaseNow(ctx context.Context, db *sql.DB) (time.Time, error) {
	var now time.Time
	err := db.QueryRowContext(ctx, `SELECT now()`).Scan(&now)
	return now, err
}
