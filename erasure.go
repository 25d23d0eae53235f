// erasure.go: erasure by subject (docs/erasure.md): the admin's request,
// through the API or the Subjects page, to erase the payloads of every
// event of one subject and what outboxd kept of them, done by one SQL
// function (schema.sql, outbox.erase_subject) and recorded in the audit
// trail by the subject's digest, never the subject.

package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
)

// erasureInput is the body of POST /api/erasures.
type erasureInput struct {
	Subject *string `json:"subject"`
}

// erasureResult is what an erasure answers: how many events it erased, 0
// when they were all erased before.
type erasureResult struct {
	Events int64 `json:"events"`
}

// checkErasureSubject refuses a subject no event can have, or the empty
// one: events recorded without a subject are not one person's, and an
// erasure of them all is not what the call is for.
func checkErasureSubject(subject string) error {
	switch {
	case subject == "":
		return fmt.Errorf(`%w: "subject" is required, and not empty`, errInvalid)
	case !isText(subject):
		return fmt.Errorf(`%w: "subject" must be UTF-8 text without NUL`, errInvalid)
	case len(subject) > maxSubjectLen:
		return fmt.Errorf(`%w: "subject" is %d bytes, at most %d`, errInvalid, len(subject), maxSubjectLen)
	}
	return nil
}

// subjectDigest is what the audit trail keeps of an erased subject: its
// SHA-256, in hex, by which a second request for the same subject is
// recognised without the subject being kept.
func subjectDigest(subject string) string {
	sum := sha256.Sum256([]byte(subject))
	return "sha256:" + hex.EncodeToString(sum[:])
}

const eraseSubjectSQL = `SELECT outbox.erase_subject($1, $2)`

// eraseSubject erases the payloads of subject's events, in one statement
// and so one transaction, and returns how many events it erased. Their
// deliveries not yet made end discarded with errEventErased's text.
func eraseSubject(ctx context.Context, db *sql.DB, subject string) (int64, error) {
	var n int64
	if err := db.QueryRowContext(ctx, eraseSubjectSQL, subject, errEventErased.Error()).Scan(&n); err != nil {
		return 0, fmt.Errorf("erase subject: %w", err)
	}
	return n, nil
}

// handleErase is POST /api/erasures {"subject"}: {"events": n}.
func handleErase(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		var in erasureInput
		if err := decodeJSON(r, &in); err != nil {
			return 0, nil, err
		}
		if in.Subject == nil {
			return 0, nil, fmt.Errorf(`%w: "subject" is required`, errInvalid)
		}
		if err := checkErasureSubject(*in.Subject); err != nil {
			return 0, nil, err
		}
		n, err := eraseSubject(r.Context(), a.db, *in.Subject)
		if err != nil {
			return 0, nil, err
		}
		noteAuditErasure(r, subjectDigest(*in.Subject), n)
		return http.StatusOK, erasureResult{Events: n}, nil
	}
}

// maxErasureForm bounds the Subjects page's erase form: a subject and a
// confirmation.
const maxErasureForm = 8 << 10

// handleErasurePage is POST /erasures, the Subjects page's erase form: it
// asks first (an erasure cannot be undone), then erases and goes back to
// the Subjects page, saying how many events it erased.
func handleErasurePage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		form := formOf(w, r, maxErasureForm)
		subject := form.text("subject")
		if form.err != nil {
			return form.err
		}
		if err := checkErasureSubject(subject); err != nil {
			return err
		}
		if !confirmed(form) {
			return a.panel.ask(w, r, confirmation{
				Question: fmt.Sprintf("Erase the payloads of subject %q?", subject),
				Consequence: "Every event of this subject loses its payload, and its deliveries not yet made are discarded. " +
					"Topics, subjects, times and outcomes stay. This cannot be undone.",
				Action: "/erasures", Button: "Erase", Cancel: "/subjects",
				Hidden: map[string]string{"subject": subject}})
		}
		n, err := eraseSubject(r.Context(), a.db, subject)
		if err != nil {
			return err
		}
		noteAuditErasure(r, subjectDigest(subject), n)
		done := fmt.Sprintf("Erased the payloads of %d events.", n)
		http.Redirect(w, r, "/subjects?done="+url.QueryEscape(done), http.StatusSeeOther)
		return nil
	}
}
