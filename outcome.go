// outcome.go: what an attempt's result means for its job and its
// endpoint, decided by pure functions (decideOutcome over the backoff
// schedule, classifyAttempt, endpointHealth); the completer (completer.go)
// writes what they decide.
//
// Guarantees (docs/guarantees.md, hop 5):
//   - A failure is retried with a backoff of attempt⁴ seconds (±10%) until
//     MaxAttempts, then discarded with every attempt's error kept: nothing
//     ends silently, and a discarded job can be retried by hand.

package main

import (
	"context"
	"errors"
	"math"
	"time"
)

// jobState is outbox.job_state.
type jobState string

const (
	jobAvailable jobState = "available"
	jobRunning   jobState = "running"
	jobRetryable jobState = "retryable"
	jobCompleted jobState = "completed"
	jobDiscarded jobState = "discarded"
)

// Errors a handler returns to steer its outcome; any other error is a
// retryable failure.
type (
	// permanentError discards the job at once: retrying cannot help.
	permanentError struct{ err error }
	// retryAfterError retries after the given delay or the backoff,
	// whichever is longer (a receiver's Retry-After): a receiver may slow
	// its retries down, never speed them up past the schedule.
	retryAfterError struct {
		err   error
		delay time.Duration
	}
	// notSentError completes the job without its effect, which cannot
	// and need not happen (no mail server, no one to mail): nothing is
	// retried, and note, kept with the attempt, says why nothing was
	// sent (JobView.NotSent, jobs.go).
	notSentError struct{ note string }
)

// maxRetryAfter bounds how far a handler's retryAfterError (a receiver's
// Retry-After) may push one retry: an hour rides out a deploy or a
// rate-limit window, and retryHorizon counts it, so the schedule still ends
// inside events retention whatever receivers answer.
const maxRetryAfter = time.Hour

func (e permanentError) Error() string  { return e.err.Error() }
func (e permanentError) Unwrap() error  { return e.err }
func (e retryAfterError) Error() string { return e.err.Error() }
func (e retryAfterError) Unwrap() error { return e.err }
func (e notSentError) Error() string    { return e.note }

// maxBackoff caps one retry delay; attempt⁴ passes it only beyond the 17th
// attempt, so with the default 18 attempts it is a guard for larger limits.
const maxBackoff = 24 * time.Hour

// backoff is the delay before attempt+1 after attempt failed: attempt⁴
// seconds, ±10% jitter (jitter in [0, 1)) so jobs that failed together do not
// retry together. Attempts 1..17 wait:
//
//	1s 16s 81s 4m16s 10m25s 21m36s 40m1s 1h8m 1h49m 2h47m 4h4m 5h46m
//	7h56m 10h40m 14h3m 18h12m 23h12m  (sum ≈ 3.8 days)
func backoff(attempt int, jitter float64) time.Duration {
	d := time.Duration(math.Pow(float64(attempt), 4) * float64(time.Second))
	d = time.Duration(float64(d) * (0.9 + 0.2*jitter))
	return min(max(d, time.Second), maxBackoff)
}

// retryHorizon is the longest time from a job's first attempt to its
// discard with n attempts, counting the jitter's upper bound and a
// receiver's Retry-After, which may stretch any delay to
// maxRetryAfter.
func retryHorizon(n int) time.Duration {
	var total time.Duration
	for attempt := 1; attempt < n; attempt++ {
		total += max(backoff(attempt, 1), maxRetryAfter)
	}
	return total
}

// jobOutcome is the decision after an attempt.
type jobOutcome struct {
	State jobState      // completed, retryable or discarded
	Delay time.Duration // with retryable: wait before the next attempt
	// Error is, with retryable and discarded, what went wrong; with
	// completed, why nothing was sent (notSentError), or empty.
	Error string
}

// decideOutcome classifies one attempt's result. It is the only place that
// turns an error into a next state.
func decideOutcome(attempt, maxAttempts int, err error, jitter float64) jobOutcome {
	if err == nil {
		return jobOutcome{State: jobCompleted}
	}
	msg := truncate(err.Error(), maxErrorLen)
	if notSent := (notSentError{}); errors.As(err, &notSent) {
		return jobOutcome{State: jobCompleted, Error: msg}
	}
	var perm permanentError
	if errors.As(err, &perm) || attempt >= maxAttempts {
		return jobOutcome{State: jobDiscarded, Error: msg}
	}
	var after retryAfterError
	if errors.As(err, &after) {
		return jobOutcome{State: jobRetryable, Delay: min(max(after.delay, backoff(attempt, jitter)), maxBackoff), Error: msg}
	}
	return jobOutcome{State: jobRetryable, Delay: backoff(attempt, jitter), Error: msg}
}

// endRetriesAt discards, rather than retries, a job whose next attempt
// would start after until (an endpoint's retry window; zero: none),
// saying so: the job ends as after its last attempt.
func endRetriesAt(o jobOutcome, until, now time.Time) jobOutcome {
	if o.State != jobRetryable || until.IsZero() || !now.Add(o.Delay).After(until) {
		return o
	}
	return jobOutcome{State: jobDiscarded, Error: truncate("not retried, the endpoint's retry window ends first: "+o.Error, maxErrorLen)}
}

// jobResult is an outcome on its way to the database.
type jobResult struct {
	ID      int64
	Attempt int
	jobOutcome
	record *attemptRecord // nil, or the attempt as the panel shows it
	// wakeOnOutcome is the job's (Job.wakeOnOutcome): once this outcome
	// is recorded, the workers claim again.
	wakeOnOutcome bool
}

// deliveryAttempt is what one attempt leaves for the panel, and what its
// answer said of the receiver.
type deliveryAttempt struct {
	Duration        time.Duration
	StatusCode      int // 0: no answer
	Error           string
	ResponseExcerpt string
	// DedupWindow is the receiver's dedup window a 2xx answer advertised
	// (webhook-dedup-window), and DedupWindowRead says the attempt had
	// such an answer: then a DedupWindow of 0 says the receiver advertises
	// none, and the endpoint's is cleared. Without one (no 2xx: an error
	// page may come from a proxy) the endpoint's stays as it is.
	DedupWindow     time.Duration
	DedupWindowRead bool
	// Hold is how long the answer asked the whole endpoint to wait (a 429
	// or 503 with Retry-After); 0: no hold.
	Hold time.Duration
	// Class is what the attempt counts as in outbox.delivery_stats;
	// classNone (no request was made) counts nothing.
	Class attemptClass
	// CommitTo2xx is, for a success, the time from the event's commit to
	// this answer: its first 2xx, as a job succeeds once.
	CommitTo2xx time.Duration
}

// attemptClass is what one attempt counts as in outbox.delivery_stats
// (schema.sql lists the classes).
type attemptClass uint8

const (
	classNone       attemptClass = iota // no request was made: not counted
	classSuccess                        // a 2xx, or a mail sent
	classTimeout                        // no answer in time
	class4xx                            // a 4xx answer
	class5xx                            // a 5xx answer
	classConnection                     // refused, reset, DNS, TLS, the SSRF guard: no answer
	classOther                          // a 1xx or 3xx answer
)

// attemptClassNames are the classes as outbox.record_outcomes counts them
// (its statistics, schema.sql).
var attemptClassNames = [...]string{
	classNone: "none", classSuccess: "success", classTimeout: "timeout", class4xx: "4xx",
	class5xx: "5xx", classConnection: "connection", classOther: "other",
}

func (c attemptClass) String() string { return attemptClassNames[c] }

// classifyAttempt is the class of an attempt that was made: status is
// the answer's status code (0: none came), err the transport's error.
func classifyAttempt(status int, err error) attemptClass {
	switch {
	case status >= 200 && status <= 299:
		return classSuccess
	case status >= 400 && status <= 499:
		return class4xx
	case status >= 500 && status <= 599:
		return class5xx
	case status != 0:
		return classOther
	case err == nil:
		return classSuccess // no status and no error: a mail sent
	}
	var netErr interface{ Timeout() bool }
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) {
		return classTimeout
	}
	return classConnection
}

// mayWaitForBatch says that nothing waits for this outcome's write: a
// delivery that succeeded, freed its place when it ended, and wakes no
// claim when written.
func (r jobResult) mayWaitForBatch() bool {
	return r.freesItsPlace() && !r.wakeOnOutcome
}

// endpointChange is what an attempt's answer does to its endpoint.
type endpointChange int

const (
	endpointUnchanged endpointChange = iota // no request was made
	endpointSucceeded                       // clears failing_since and the failure count
	endpointFailed                          // sets failing_since if unset, counts a failure
	endpointGone                            // 410: disables the endpoint
)

// endpointGoneReason is disabled_reason after a receiver answered 410 Gone.
const endpointGoneReason = "the receiver answered 410 Gone"

// endpointHealth is what a batch's attempts did to one endpoint, in
// completion order: endpointHealthSQL's row.
type endpointHealth struct {
	succeeded bool          // an attempt succeeded
	failures  int           // attempts failed after the last success (or at all)
	hold      time.Duration // the longest hold asked for
}

// add counts one attempt's change.
func (h *endpointHealth) add(change endpointChange, hold time.Duration) {
	switch change {
	case endpointSucceeded:
		h.succeeded, h.failures = true, 0
	case endpointFailed, endpointGone:
		h.failures++
	}
	h.hold = max(h.hold, hold)
}

// attemptRecord is what one attempt leaves behind: its row in
// outbox.deliveries and its effect on the endpoint. The handler fills it
// in; the completer writes it in the transaction that records the job's
// outcome (outbox.record_outcomes), so a job's state, its attempt and its
// endpoint's state are never seen apart, and a delivery costs no commit
// of its own.
type attemptRecord struct {
	deliveryAttempt
	EndpointID int64
	Change     endpointChange
	// At is when the attempt ended: its minute in outbox.delivery_stats.
	// It is this process's clock, as CommitTo2xx is; outboxd reads
	// minutes, so replicas' clocks need agree only to seconds.
	At  time.Time
	set bool
}

// freesItsPlace says that a delivery's attempt frees its place under its
// endpoint's cap when it ends, not when its outcome is written: it
// succeeded and asked nothing of the endpoint. Any other answer may move
// the endpoint (a failure counts towards the breaker, a Retry-After holds
// it, a 410 disables it), which the completer writes with the outcome:
// until then the place stays taken, so the next claim sees the endpoint as
// the answer left it, not a request later.
func (r jobResult) freesItsPlace() bool {
	rec := r.record
	return r.State == jobCompleted && rec != nil && rec.EndpointID != 0 &&
		rec.Hold == 0 && (rec.Change == endpointSucceeded || rec.Change == endpointUnchanged)
}

// errCompletedInTx is what a handler's attempt reports when it already
// completed its job in its own transaction, so the completer has nothing
// to write.
var errCompletedInTx = errors.New("completed in the handler's transaction")
