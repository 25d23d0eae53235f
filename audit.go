// audit.go: the audit trail (docs/owners.md): every change to an
// endpoint, an owner or a source, and every erasure (docs/erasure.md),
// made through the API or the panel, who
// made it (the admin or which owner), what, and when; kept for
// -audit-retention (retention.go sweeps it), and read by GET /api/audit
// and the panel's audit page, an owner seeing its own endpoints' entries.
//
// The entry is written by the route's wrapper (audited, auditedPage),
// which every route of admin.go's lists passes through, after the change
// committed and answered success: no handler can forget it. The change and
// its entry are two statements, so a crash between them loses the entry;
// an entry that cannot be written is logged, naming all it would have
// held.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
)

// AuditEntry is one row of outbox.audit_log as the API shows it.
type AuditEntry struct {
	ID int64     `json:"id"`
	At time.Time `json:"at"`
	// Actor is "admin" or "owner"; an owner's id and its name then.
	Actor     string  `json:"actor"`
	OwnerID   *int64  `json:"owner_id"`
	OwnerName *string `json:"owner_name"`
	// Via is "api" or "panel"; Action the route, as admin.go lists it
	// (a panel action's name written in).
	Via    string `json:"via"`
	Action string `json:"action"`
	// SubjectKind is "endpoint", "owner", "source" or "erasure"; Subject
	// its id or name, or for an erasure the SHA-256 of the erased subject
	// ("sha256:" and hex), never the subject; EndpointID the endpoint's
	// id, for an endpoint's entry.
	SubjectKind string `json:"subject_kind"`
	Subject     string `json:"subject"`
	EndpointID  *int64 `json:"endpoint_id"`
	// Fields are the names the request's body gave, never their values.
	Fields []string `json:"fields"`
	// Events is, for an erasure, how many events it erased; nil for any
	// other entry.
	Events *int64 `json:"events"`
}

// defaultAuditRetention is how long entries are kept unless
// -audit-retention says otherwise: a quarter, to answer "who changed this
// endpoint" about the last change or two of a quiet one.
const defaultAuditRetention = 90 * 24 * time.Hour

// Bounds on what one entry holds: schema.sql's audit_log_lengths repeats
// them. A body of more fields than maxAuditFields is told by its first.
const (
	maxAuditFields  = 50
	maxAuditText    = 200
	auditBodyPrefix = 64 << 10 // the bytes of a body read for its field names
)

// auditKindOf is the kind of subject a route under path changes, or ""
// for a route the trail does not record (events, jobs, alerts).
func auditKindOf(path string) string {
	path = strings.TrimPrefix(path, "/api")
	for _, kind := range []string{"endpoint", "owner", "source", "erasure"} {
		if path == "/"+kind+"s" || strings.HasPrefix(path, "/"+kind+"s/") {
			return kind
		}
	}
	return ""
}

// isPreview says whether route only answers what a change would do (a
// filter's preview), changing nothing: a POST the trail leaves out.
func isPreview(route string) bool { return strings.HasSuffix(route, "/filter-preview") }

// auditNote is what a handler tells the trail that its route does not:
// the id of what a create made, the endpoint a change on a page of
// another kind's was to (kind), what an erasure erased (kind, subject,
// events), or that the POST changed nothing (unchanged: it asked for a
// confirmation).
type auditNote struct {
	kind, subject string
	events        *int64
	unchanged     bool
}

type auditNoteKey struct{}

// noteAuditSubject tells the trail what r's change made, for a create,
// whose path names nothing yet.
func noteAuditSubject(r *http.Request, subject string) {
	if n, ok := r.Context().Value(auditNoteKey{}).(*auditNote); ok {
		n.subject = subject
	}
}

// noteAuditUnchanged tells the trail that r, a POST, changed nothing: it
// answered a page that asks to confirm the change, which a second POST
// makes.
func noteAuditUnchanged(r *http.Request) {
	if n, ok := r.Context().Value(auditNoteKey{}).(*auditNote); ok {
		n.unchanged = true
	}
}

// noteAuditEndpoint tells the trail that r's change was to endpoint id,
// though its route is under another kind's path (the Owners page's
// buttons that give and take back an endpoint): the entry is the
// endpoint's, as the API's PATCH of its owner_id writes it, so that the
// endpoint's trail, and its owner's, show it.
func noteAuditEndpoint(r *http.Request, id int64) {
	if n, ok := r.Context().Value(auditNoteKey{}).(*auditNote); ok {
		n.kind, n.subject = "endpoint", strconv.FormatInt(id, 10)
	}
}

// noteAuditErasure tells the trail that r erased events events of the
// subject whose digest is digest (erasure.go, subjectDigest): the entry
// keeps the digest, never the subject, which its request's path does not
// name either.
func noteAuditErasure(r *http.Request, digest string, events int64) {
	if n, ok := r.Context().Value(auditNoteKey{}).(*auditNote); ok {
		n.kind, n.subject, n.events = "erasure", digest, &events
	}
}

// prefixBody keeps the first bytes read through it, for the trail to
// read the body's field names after the handler read the body.
type prefixBody struct {
	io.ReadCloser
	kept bytes.Buffer
}

func (b *prefixBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if room := auditBodyPrefix - b.kept.Len(); room > 0 {
		b.kept.Write(p[:min(n, room)])
	}
	return n, err
}

// jsonFields is the names of a JSON object's members, sorted; none for
// anything else (no body, a body cut at auditBodyPrefix).
func jsonFields(body []byte) []string {
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return []string{}
	}
	return fieldNames(members)
}

func fieldNames[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[:min(len(keys), maxAuditFields)]
}

// createdSubject is the id or name of what a create answered.
func createdSubject(body any) string {
	switch v := body.(type) {
	case endpointWithSecret:
		return strconv.FormatInt(v.ID, 10)
	case ownerWithToken:
		return strconv.FormatInt(v.ID, 10)
	case inboxSourceWithSecret:
		return v.Name
	}
	return ""
}

// audited records, for a route that changes an endpoint, an owner or a
// source, each request that succeeded.
func (a *admin) audited(pattern string, h apiFunc) apiFunc {
	method, path, _ := strings.Cut(pattern, " ")
	kind := auditKindOf(path)
	if kind == "" || method == http.MethodGet || method == "" || isPreview(path) {
		return h
	}
	return func(r *http.Request) (int, any, error) {
		body := &prefixBody{ReadCloser: r.Body}
		r.Body = body
		note := &auditNote{}
		r = r.WithContext(context.WithValue(r.Context(), auditNoteKey{}, note))
		status, answer, err := h(r)
		if err != nil || status >= 400 {
			return status, answer, err
		}
		kind, subject := kind, r.PathValue("id")+r.PathValue("name")
		switch {
		case note.kind != "":
			kind, subject = note.kind, note.subject
		case subject == "":
			subject = createdSubject(answer)
		}
		a.record(r, "api", pattern, kind, subject, jsonFields(body.kept.Bytes()), note.events)
		return status, answer, err
	}
}

// statusWriter notes the status a page answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// auditedPage is audited for the panel: a POST that changes an endpoint,
// an owner or a source and answers a page or a redirect, not a refusal
// nor a question (noteAuditUnchanged), is recorded with the names of the
// form's fields.
func (a *admin) auditedPage(h pageFunc) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		_, path, _ := strings.Cut(r.Pattern, " ")
		kind := auditKindOf(path)
		if r.Method != http.MethodPost || kind == "" {
			return h(w, r)
		}
		note := &auditNote{}
		r = r.WithContext(context.WithValue(r.Context(), auditNoteKey{}, note))
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		if err := h(sw, r); err != nil || sw.status >= 400 || note.unchanged {
			return err
		}
		subject := r.PathValue("id") + r.PathValue("name")
		switch {
		case note.kind != "":
			kind, subject = note.kind, note.subject
		case subject == "":
			subject = note.subject
		}
		if subject == "" && kind == "source" {
			subject = r.PostForm.Get("name")
		}
		action := strings.Replace(r.Pattern, "{action}", r.PathValue("action"), 1)
		if isPreview(action) {
			return nil
		}
		a.record(r, "panel", action, kind, subject, fieldNames(r.PostForm), note.events)
		return nil
	}
}

const recordAuditSQL = `
INSERT INTO outbox.audit_log (actor, owner_id, owner_name, via, action, subject_kind, subject, endpoint_id, fields, events)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`

// record writes one entry for r's principal. The change it tells of has
// committed and is answered as done whatever happens here: an entry that
// cannot be written is logged as an error, with all it would have held.
func (a *admin) record(r *http.Request, via, action, kind, subject string, fields []string, events *int64) {
	who := principalOf(r)
	actor := "admin"
	var ownerName *string
	if who.owner != nil {
		actor, ownerName = "owner", &who.owner.Name
	}
	var endpointID *int64
	if id, err := strconv.ParseInt(subject, 10, 64); err == nil && kind == "endpoint" {
		endpointID = &id
	}
	subject = truncate(subject, maxAuditText)
	// The request's own context: a client gone after its change committed
	// must not take the entry with it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if _, err := a.db.ExecContext(ctx, recordAuditSQL, actor, who.ownerID(), ownerName, via,
		truncate(action, maxAuditText), kind, subject, endpointID, pq.Array(fields), events); err != nil {
		a.logger.Error("audit entry not recorded", "actor", actor, "owner_id", who.ownerID(), "via", via,
			"action", action, "subject_kind", kind, "subject", subject, "fields", fields, "events", events,
			"request_id", requestID(r), "err", err)
	}
}

// listAuditSQL is a page of entries, newest first, with ids below $1; of
// endpoint $2 only, unless NULL; and of what owner $3 may see, unless
// NULL (the admin): its endpoints' entries, and every change it made.
const listAuditSQL = `
SELECT id, at, actor, owner_id, owner_name, via, action, subject_kind, subject, endpoint_id, fields, events
FROM outbox.audit_log
WHERE id < $1
  AND ($2::bigint IS NULL OR endpoint_id = $2)
  AND ($3::bigint IS NULL
       OR endpoint_id IN (SELECT id FROM outbox.endpoints WHERE owner_id = $3)
       OR owner_id = $3)
ORDER BY id DESC
LIMIT $4`

// maxAuditPage bounds one page of the trail.
const maxAuditPage = 500

func scanAuditEntry(row rowScanner) (AuditEntry, error) {
	var e AuditEntry
	err := row.Scan(&e.ID, &e.At, &e.Actor, &e.OwnerID, &e.OwnerName, &e.Via, &e.Action,
		&e.SubjectKind, &e.Subject, &e.EndpointID, pq.Array(&e.Fields), &e.Events)
	if e.Fields == nil {
		e.Fields = []string{}
	}
	return e, err
}

// auditQuery is what a page of the trail asks for.
type auditQuery struct {
	before, endpointID int64 // 0: none
	limit              int
}

// readAuditQuery reads ?before=, ?endpoint_id= and ?limit=.
func readAuditQuery(r *http.Request) (auditQuery, error) {
	q := queryOf(r)
	aq := auditQuery{
		before:     q.integer("before", 0, 1, math.MaxInt64, "before %q is not an audit entry id"),
		endpointID: q.integer("endpoint_id", 0, 1, math.MaxInt64, "endpoint_id %q is not an endpoint id"),
		limit:      q.limit(defaultPageSize, maxAuditPage),
	}
	return aq, q.err
}

// listAudit is the page of the trail who may see.
func listAudit(ctx context.Context, db *sql.DB, who principal, aq auditQuery) ([]AuditEntry, error) {
	if !who.admin && who.owner == nil {
		return []AuditEntry{}, nil
	}
	before := int64(math.MaxInt64)
	if aq.before > 0 {
		before = aq.before
	}
	var endpointID *int64
	if aq.endpointID > 0 {
		endpointID = &aq.endpointID
	}
	entries, err := queryAll(ctx, db, scanAuditEntry, listAuditSQL, before, endpointID, who.ownerID(), aq.limit)
	if err != nil {
		return nil, fmt.Errorf("list audit entries: %w", err)
	}
	return entries, nil
}

// handleListAudit is GET /api/audit?before=&endpoint_id=&limit=:
// {"entries": [...], "next_before"}, newest first; an owner's token sees
// its endpoints' entries and its own changes.
func handleListAudit(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		aq, err := readAuditQuery(r)
		if err != nil {
			return 0, nil, err
		}
		entries, err := listAudit(r.Context(), a.db, principalOf(r), aq)
		if err != nil {
			return 0, nil, err
		}
		resp := map[string]any{"entries": entries}
		if len(entries) == aq.limit {
			resp["next_before"] = entries[len(entries)-1].ID
		}
		return http.StatusOK, resp, nil
	}
}

// auditRow is an entry as the audit page shows it: with the name of what
// it changed, an endpoint or an owner, as it is now; Gone when there is
// none to show (deleted since, or, in an owner's view, an endpoint no
// longer its own, whose name is not its to read).
type auditRow struct {
	AuditEntry
	SubjectName string
	Gone        bool
}

// auditView is the audit page: its rows, and the name of the endpoint
// it is filtered to ("" for none, or none to show).
type auditView struct {
	Rows         []auditRow
	EndpointID   int64
	EndpointName string
	Older        string
}

// nameAuditRows names what each entry changed, for who: an owner is
// shown the names of its own endpoints only, and no owner's.
func nameAuditRows(ctx context.Context, db *sql.DB, who principal, entries []AuditEntry, filtered int64) (auditView, error) {
	var endpointIDs, ownerIDs []int64
	if filtered > 0 {
		endpointIDs = append(endpointIDs, filtered)
	}
	for _, e := range entries {
		id, err := strconv.ParseInt(e.Subject, 10, 64)
		if err != nil {
			continue // a source's name
		}
		switch e.SubjectKind {
		case "endpoint":
			endpointIDs = append(endpointIDs, id)
		case "owner":
			ownerIDs = append(ownerIDs, id)
		}
	}
	if !who.admin {
		ownerIDs = nil // an owner's changes are to endpoints alone
	}
	endpoints, err := endpointNames(ctx, db, endpointIDs, who.ownerID())
	if err != nil {
		return auditView{}, err
	}
	owners, err := ownerNames(ctx, db, ownerIDs)
	if err != nil {
		return auditView{}, err
	}
	v := auditView{Rows: make([]auditRow, len(entries)), EndpointID: filtered, EndpointName: endpoints[filtered]}
	for i, e := range entries {
		v.Rows[i] = auditRow{AuditEntry: e}
		names := endpoints
		switch e.SubjectKind {
		case "owner":
			names = owners
		case "source", "erasure":
			continue // named by its name, or by its digest
		}
		id, _ := strconv.ParseInt(e.Subject, 10, 64)
		name, found := names[id]
		v.Rows[i].SubjectName, v.Rows[i].Gone = name, !found
	}
	return v, nil
}

// handleAuditPage is GET /audit: the trail on the panel, as the API
// gives it to whoever is signed in, naming what each entry changed.
func handleAuditPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		aq, err := readAuditQuery(r)
		if err != nil {
			return err
		}
		who := principalOf(r)
		entries, err := listAudit(r.Context(), a.db, who, aq)
		if err != nil {
			return err
		}
		view, err := nameAuditRows(r.Context(), a.db, who, entries, aq.endpointID)
		if err != nil {
			return err
		}
		if len(entries) == aq.limit {
			q := r.URL.Query()
			q.Set("before", strconv.FormatInt(entries[len(entries)-1].ID, 10))
			view.Older = "/audit?" + q.Encode()
		}
		a.panel.render(w, http.StatusOK, "audit", page{Title: "Audit trail", Nav: "audit", SignedIn: true, Data: view})
		return nil
	}
}
