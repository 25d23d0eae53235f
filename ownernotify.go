// ownernotify.go: the job kind "owner-notify", which mails an endpoint's
// owner when the endpoint becomes failing, is disabled, or is re-enabled
// by a recovery probe, at most OwnerNotifyPerHour mails per owner per hour.
//
// The state change records an event in its own transaction (schema.sql's
// endpoints_state_event trigger; the prober, probe.go, for a recovery);
// the relay fans it out to one job of this kind. Over the cap the mail is a deliberate drop: logged, counted in
// outboxd_owner_notifications_dropped_total, and the job completes with
// the reason as a note, so the panel shows it beside its event, as "not
// sent", as it does a notification with no SMTP server or no owner
// address to send to. A slot is keyed by the job, so a retried
// notification keeps the slot it took.

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
)

const (
	ownerNotifyJobKind    = "owner-notify"
	endpointFailingTopic  = internalTopicPrefix + "endpoint.failing"
	endpointDisabledTopic = internalTopicPrefix + "endpoint.disabled"
	// endpointRecoveredTopic: a recovery probe's 2xx re-enabled it.
	endpointRecoveredTopic = internalTopicPrefix + "endpoint.recovered"
	// endpointRecovered is the state in a recovery event's payload.
	endpointRecovered = "recovered"
)

// ownerNotifyTarget is how the relay fans out to owner-notify jobs: one
// for every state-change event of an endpoint.
var ownerNotifyTarget = jobTarget{Kind: ownerNotifyJobKind, Topics: []string{endpointFailingTopic, endpointDisabledTopic, endpointRecoveredTopic}}

// ownerNotifier runs owner-notify jobs.
type ownerNotifier struct {
	db      *sql.DB
	mail    *mailer // nil: no SMTP configured
	perHour int
	logger  *slog.Logger

	// Counters for /metrics, only ever incremented.
	sent    atomic.Int64
	dropped atomic.Int64
}

func newOwnerNotifier(db *sql.DB, mail *mailer, perHour int, logger *slog.Logger) *ownerNotifier {
	return &ownerNotifier{db: db, mail: mail, perHour: perHour, logger: logger.With("loop", "owner-notify")}
}

// endpointStatePayload is the payload endpoints_state_event records, and
// the prober's recovery event (with State "recovered" and the recovery's
// fields).
type endpointStatePayload struct {
	EndpointID     int64      `json:"endpoint_id"`
	URL            string     `json:"url"`
	OwnerEmail     string     `json:"owner_email"`
	State          string     `json:"state"`
	FailingSince   *time.Time `json:"failing_since"`
	DisabledReason *string    `json:"disabled_reason"`
	LastError      *string    `json:"last_error"`

	DisabledAt      *time.Time `json:"disabled_at,omitempty"`
	RecoveredAt     *time.Time `json:"recovered_at,omitempty"`
	RecoveredReason *string    `json:"recovered_reason,omitempty"`
}

// noOwnerAddressNote is kept with a notification that had no one to go
// to: the endpoint has no owner_email.
const noOwnerAddressNote = "not sent: no owner address (the endpoint's owner_email)"

// notify runs one attempt: no owner address or no SMTP completes at once,
// logged and noted on the job as not sent; else it takes (or finds) the
// job's slot, or drops over the cap; then it sends.
func (n *ownerNotifier) notify(ctx context.Context, job Job) error {
	var p endpointStatePayload
	if err := json.Unmarshal(job.Event.Payload, &p); err != nil {
		return permanentError{fmt.Errorf("owner-notify: payload: %w", err)}
	}
	log := n.logger.With("job_id", job.ID, "event_id", job.Event.ID, "endpoint_id", p.EndpointID, "state", p.State)
	if p.OwnerEmail == "" {
		log.Info("owner not notified: the endpoint has no owner address")
		return notSentError{noOwnerAddressNote}
	}
	if !n.mail.configured() {
		log.Info("owner not notified: no SMTP server configured", "owner_email", p.OwnerEmail)
		return notSentError{noSMTPNote}
	}
	overCap, err := n.takeSlot(ctx, job, p.OwnerEmail)
	if err != nil {
		return err
	}
	if overCap != "" {
		log.Warn("owner notification dropped: over the hourly cap", "owner_email", p.OwnerEmail, "per_hour", n.perHour)
		n.dropped.Add(1)
		return notSentError{overCap}
	}
	if err := n.mail.send(ctx, ownerMail(p, job.Event.ID)); err != nil {
		return fmt.Errorf("owner-notify: %w", err)
	}
	n.sent.Add(1)
	log.Info("owner notified", "owner_email", p.OwnerEmail)
	return nil
}

const (
	// ownerNotifyLockSQL serialises the cap's count-then-take per owner,
	// so two workers cannot both see four slots and take the fifth.
	ownerNotifyLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended('outboxd owner-notify ' || $1, 0))`

	ownerNotifySlotHeldSQL = `
SELECT EXISTS (
  SELECT 1
  FROM outbox.owner_notify_slots
  WHERE job_id = $1
)`

	ownerNotifySlotsTakenSQL = `
SELECT count(*)
FROM outbox.owner_notify_slots
WHERE owner_email = $1
  AND taken_at > now() - interval '1 hour'`

	// ownerNotifyStaleSlotsSQL deletes an owner's slots of earlier hours,
	// which count no more: a slot outlives its job, which leaves the
	// queue once sent.
	ownerNotifyStaleSlotsSQL = `
DELETE FROM outbox.owner_notify_slots
WHERE owner_email = $1
  AND taken_at <= now() - interval '1 hour'`

	ownerNotifyTakeSlotSQL = `
INSERT INTO outbox.owner_notify_slots (job_id, owner_email)
VALUES ($1, $2)`
)

// takeSlot finds the job's slot or takes a new one under the cap. Over
// the cap it takes none, and answers why the notification is not sent.
func (n *ownerNotifier) takeSlot(ctx context.Context, job Job, owner string) (overCap string, err error) {
	owner = strings.ToLower(owner)
	tx, err := n.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("owner-notify: slot: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, ownerNotifyLockSQL, owner); err != nil {
		return "", fmt.Errorf("owner-notify: slot: lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, ownerNotifyStaleSlotsSQL, owner); err != nil {
		return "", fmt.Errorf("owner-notify: slot: %w", err)
	}
	var held bool
	if err := tx.QueryRowContext(ctx, ownerNotifySlotHeldSQL, job.ID).Scan(&held); err != nil {
		return "", fmt.Errorf("owner-notify: slot: %w", err)
	}
	if held {
		return "", nil // a retry: the slot is this job's already
	}
	var taken int
	if err := tx.QueryRowContext(ctx, ownerNotifySlotsTakenSQL, owner).Scan(&taken); err != nil {
		return "", fmt.Errorf("owner-notify: slot: %w", err)
	}
	if taken >= n.perHour {
		return fmt.Sprintf("not sent: %s already got %d notifications in the last hour (cap -owner-notify-per-hour %d)",
			owner, taken, n.perHour), nil
	}
	if _, err := tx.ExecContext(ctx, ownerNotifyTakeSlotSQL, job.ID, owner); err != nil {
		return "", fmt.Errorf("owner-notify: slot: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("owner-notify: slot: %w", err)
	}
	return "", nil
}

// ownerMail is the message about one state change.
func ownerMail(p endpointStatePayload, eventID int64) mailMessage {
	var b strings.Builder
	var subject string
	switch p.State {
	case endpointRecovered:
		subject = fmt.Sprintf("[outboxd] endpoint %d is enabled again", p.EndpointID)
		fmt.Fprintf(&b, "Your endpoint %d (%s) answered a recovery probe and is enabled again", p.EndpointID, p.URL)
		if p.RecoveredReason != nil {
			fmt.Fprintf(&b, ": %s", *p.RecoveredReason)
		}
		b.WriteString(".\n")
		if p.DisabledReason != nil {
			fmt.Fprintf(&b, "\nIt had been disabled: %s.\n", *p.DisabledReason)
		}
	case "disabled":
		subject = fmt.Sprintf("[outboxd] endpoint %d is disabled", p.EndpointID)
		fmt.Fprintf(&b, "Your endpoint %d (%s) is disabled", p.EndpointID, p.URL)
		if p.DisabledReason != nil {
			fmt.Fprintf(&b, ": %s", *p.DisabledReason)
		}
		fmt.Fprintf(&b, ".\n\nIt gets no deliveries until it is enabled again (POST /api/endpoints/%d/enable); a replay sends what it missed.\n", p.EndpointID)
	default:
		subject = fmt.Sprintf("[outboxd] endpoint %d is failing", p.EndpointID)
		fmt.Fprintf(&b, "Deliveries to your endpoint %d (%s) are failing", p.EndpointID, p.URL)
		if p.FailingSince != nil {
			fmt.Fprintf(&b, " since %s", p.FailingSince.UTC().Format(time.RFC3339))
		}
		b.WriteString(".\n\noutboxd keeps retrying; after 5 days of failure the endpoint is disabled.\n")
	}
	if p.LastError != nil && *p.LastError != "" {
		fmt.Fprintf(&b, "\nLast error: %s\n", *p.LastError)
	}
	return mailMessage{To: p.OwnerEmail, Subject: subject, Body: b.String(), EventID: eventID}
}
