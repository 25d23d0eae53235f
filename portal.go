// portal.go: the owners' routes of the API, the admin's Owners page and
// an endpoint page's owner forms, and the sign-in links the admin makes
// to hand to an owner (docs/owners.md). Signing in, with a token or a
// link, and the sessions it starts are admin.go's.

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// handleListOwners is GET /api/owners: {"owners": [...]}, without tokens.
func handleListOwners(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		owners, err := listOwners(r.Context(), a.db)
		return http.StatusOK, map[string][]Owner{"owners": owners}, err
	}
}

// handleCreateOwner is POST /api/owners {"name", "key", ...} (ownerInput):
// the owner, answered 201 with its token, which is shown this once.
func handleCreateOwner(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		var in ownerInput
		if err := decodeJSON(r, &in); err != nil {
			return 0, nil, err
		}
		o, err := createOwner(r.Context(), a.db, in)
		return http.StatusCreated, o, err
	}
}

// handleUpdateOwner is PATCH /api/owners/{id}: the fields given changed
// (ownerInput), answered with the owner.
func handleUpdateOwner(a *admin) apiFunc {
	return byIDWithBody(decodeJSON, func(ctx context.Context, id int64, in ownerInput) (Owner, error) {
		return updateOwner(ctx, a.db, id, in)
	})
}

// handleDeleteOwner is DELETE /api/owners/{id}, answered 204: its
// endpoints stay, the admin's alone.
func handleDeleteOwner(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusNoContent, nil, deleteOwner(r.Context(), a.db, id)
	}
}

// handleRotateOwnerToken is POST /api/owners/{id}/rotate-token: the owner
// with a new token; the old one, every session signed in with it and
// every sign-in link not yet used end at once.
func handleRotateOwnerToken(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (ownerWithToken, error) {
		return rotateOwnerToken(ctx, a.db, id)
	})
}

// readDeliveredEvent is event eventID as endpoint endpointID's owner may
// see it: the request its deliveries sent (the event, its payload among
// it) and the jobs it made for that endpoint, with each attempt's error;
// not found, as for an event that does not exist, when it made none.
func readDeliveredEvent(ctx context.Context, db *sql.DB, endpointID, eventID int64) (eventWithJobs, error) {
	jobs, err := listJobs(ctx, db, JobFilter{EventID: eventID, EndpointID: endpointID, Limit: maxEventPage})
	if err != nil {
		return eventWithJobs{}, err
	}
	if len(jobs) == 0 {
		return eventWithJobs{}, fmt.Errorf("event %d: %w", eventID, errNotFound)
	}
	ev, err := scanEvent(db.QueryRowContext(ctx, endpointEventSQL, eventID, endpointID))
	if errors.Is(err, sql.ErrNoRows) {
		return eventWithJobs{}, fmt.Errorf("event %d: %w", eventID, errNotFound)
	}
	if err != nil {
		return eventWithJobs{}, fmt.Errorf("get event %d: %w", eventID, err)
	}
	return eventWithJobs{Event: ev, Jobs: jobs}, nil
}

// endpointEventSQL is event $1 as endpoint $2 may be shown it: only
// within the tenancy boundary (outbox.owner_admits), so that a delivery
// made before the boundary held, or by a path that forgot it, shows
// nothing of another owner's event.
const endpointEventSQL = `
SELECT` + eventColumns + `
FROM outbox.events AS e
JOIN outbox.endpoints AS ep ON ep.id = $2
LEFT JOIN outbox.owners AS o ON o.id = ep.owner_id
WHERE e.id = $1
  AND outbox.owner_admits(e.owner, e.topic, o.key, o.allowed_topics, o.shared_topics)`

// eventIDOf is the path value event_id, as pathID reads id.
func eventIDOf(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("event_id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: event_id %q is not a positive integer", errInvalid, r.PathValue("event_id"))
	}
	return id, nil
}

// handleEndpointEvent is GET /api/endpoints/{id}/events/{event_id}: an
// event the endpoint was sent, with its deliveries to that endpoint; for
// an owner, who may not read the event stream, what its receiver was sent.
func handleEndpointEvent(a *admin) apiFunc {
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		eventID, err := eventIDOf(r)
		if err != nil {
			return 0, nil, err
		}
		ev, err := readDeliveredEvent(r.Context(), a.db, id, eventID)
		return http.StatusOK, ev, err
	}
}

// handleEndpointEventPage is GET /endpoints/{id}/events/{event_id}, the
// same on the panel: the page an owner's attempts link to.
func handleEndpointEventPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		eventID, err := eventIDOf(r)
		if err != nil {
			return err
		}
		ev, err := readDeliveredEvent(r.Context(), a.db, id, eventID)
		if err != nil {
			return err
		}
		ep, err := getEndpoint(r.Context(), a.db, id)
		if err != nil {
			return err
		}
		a.panel.render(w, http.StatusOK, "delivery", page{Title: fmt.Sprintf("Event %d", eventID), Nav: "endpoints", SignedIn: true,
			Data: struct {
				Endpoint Endpoint
				Event    eventWithJobs
			}{ep, ev}})
		return nil
	}
}

// ownerRow is one owner on the Owners page: the owner, the first of its
// endpoints with their health, as the endpoints list tells it
// (ListState), and how many more it has.
type ownerRow struct {
	Owner
	Endpoints     []Endpoint
	EndpointCount int
	More          int
}

// readOwnerRows is every owner with its endpoints, as the Owners page
// lists them.
func readOwnerRows(ctx context.Context, a *admin) ([]ownerRow, error) {
	owners, err := listOwners(ctx, a.db)
	if err != nil {
		return nil, err
	}
	eps, counts, err := readOwnedEndpoints(ctx, a.db)
	if err != nil {
		return nil, err
	}
	if err := withHealth(ctx, a.db, a.alerts, eps); err != nil {
		return nil, err
	}
	byOwner := map[int64][]Endpoint{}
	for _, e := range eps {
		byOwner[*e.OwnerID] = append(byOwner[*e.OwnerID], e)
	}
	rows := make([]ownerRow, len(owners))
	for i, o := range owners {
		shown := byOwner[o.ID]
		rows[i] = ownerRow{Owner: o, Endpoints: shown, EndpointCount: counts[o.ID], More: counts[o.ID] - len(shown)}
	}
	return rows, nil
}

// renderOwners is the admin's page of owners: the list, each owner with
// its endpoints, a form for a new one, and created's token (a new
// owner's, or a rotated one), shown once.
func renderOwners(w http.ResponseWriter, r *http.Request, a *admin, flash string, created *ownerWithToken) error {
	owners, err := readOwnerRows(r.Context(), a)
	if err != nil {
		return err
	}
	unowned, err := listAdminsEndpoints(r.Context(), a.db)
	if err != nil {
		return err
	}
	a.panel.render(w, http.StatusOK, "owners", page{Title: "Owners", Nav: "owners", SignedIn: true, Flash: flash,
		Data: struct {
			Owners  []ownerRow
			Unowned []Endpoint
			Created *ownerWithToken
		}{owners, unowned, created}})
	return nil
}

// handleOwnersPage is GET /owners.
func handleOwnersPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		return renderOwners(w, r, a, flash(r), nil)
	}
}

// handleCreateOwnerPage is POST /owners: the list again, with the new
// owner's token.
func handleCreateOwnerPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		f := formOf(w, r, 4096)
		in := ownerInput{Name: ptr(f.text("name"))}
		if key := f.text("key"); key != "" {
			in.Key = &key
		}
		if f.err != nil {
			return f.err
		}
		o, err := createOwner(r.Context(), a.db, in)
		if err != nil {
			return err
		}
		noteAuditSubject(r, strconv.FormatInt(o.ID, 10))
		return renderOwners(w, r, a, fmt.Sprintf("Owner %s created. Hand over its token now: it is not shown again.", o.Name), &o)
	}
}

// handleOwnerAction is POST /owners/{id}/{action}, one of an owner's
// buttons on the Owners page (ownerActions).
func handleOwnerAction(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		action, ok := ownerActions[r.PathValue("action")]
		if !ok {
			return fmt.Errorf("%w: no action %q", errNotFound, r.PathValue("action"))
		}
		return action(ownerClick{a: a, w: w, r: r, form: formOf(w, r, 4096), id: id})
	}
}

// ownerClick is a press of one of owner id's buttons, with its form's
// fields.
type ownerClick struct {
	a    *admin
	w    http.ResponseWriter
	r    *http.Request
	form *query
	id   int64
}

// ownerActions are an owner's buttons by name. Each answers by itself:
// those that show a secret (a token, a sign-in link) render it, never
// redirect to it; the others go back to the list, saying what they did.
var ownerActions = map[string]func(ownerClick) error{
	"rotate-token": ownerClick.rotateToken,
	"delete":       ownerClick.delete,
	"give":         ownerClick.give,
	"take-back":    ownerClick.takeBack,
	"signin-link":  ownerClick.signinLink,
}

// done goes back to the owner's row of the list, saying what happened.
func (c ownerClick) done(message string) error {
	http.Redirect(c.w, c.r, fmt.Sprintf("/owners?done=%s#owner-%d", url.QueryEscape(message), c.id), http.StatusSeeOther)
	return nil
}

func (c ownerClick) rotateToken() error {
	o, err := rotateOwnerToken(c.r.Context(), c.a.db, c.id)
	if err != nil {
		return err
	}
	return renderOwners(c.w, c.r, c.a, fmt.Sprintf("Token of %s replaced; the old one, its sessions and its sign-in links ended.", o.Name), &o)
}

// delete is an owner's Delete button: it asks first, then deletes.
func (c ownerClick) delete() error {
	yes := confirmed(c.form)
	if c.form.err != nil {
		return c.form.err
	}
	o, err := getOwner(c.r.Context(), c.a.db, c.id)
	if err != nil {
		return err
	}
	if !yes {
		return c.a.panel.ask(c.w, c.r, confirmation{
			Question: fmt.Sprintf("Delete the owner %s?", o.Name),
			Consequence: "Its token, every browser signed in with it and its sign-in links end at once. " +
				"Its endpoints stay, the admin's alone; the events addressed to its key reach none of them.",
			Action: fmt.Sprintf("/owners/%d/delete", c.id), Button: "Delete the owner",
			Cancel: fmt.Sprintf("/owners#owner-%d", c.id)})
	}
	if err := deleteOwner(c.r.Context(), c.a.db, c.id); err != nil {
		return err
	}
	http.Redirect(c.w, c.r, "/owners?done="+url.QueryEscape(fmt.Sprintf("Owner %s deleted; its endpoints are the admin's alone.", o.Name)), http.StatusSeeOther)
	return nil
}

// formEndpoint is the endpoint the form's endpoint_id names.
func (c ownerClick) formEndpoint() (Endpoint, error) {
	id := c.form.integer("endpoint_id", 0, 1, math.MaxInt64, "endpoint_id %q is not an endpoint's id")
	if c.form.err != nil {
		return Endpoint{}, c.form.err
	}
	if id == 0 {
		return Endpoint{}, fmt.Errorf("%w: endpoint_id is required", errInvalid)
	}
	return getEndpoint(c.r.Context(), c.a.db, id)
}

// give is the Give form: an endpoint of the admin's own (endpoint_id)
// becomes the owner's, by the API's own change (changeEndpoint), within
// the owner's max_endpoints. Another owner's endpoint is refused: its
// page moves it, showing whose it is.
func (c ownerClick) give() error {
	ep, err := c.formEndpoint()
	if err != nil {
		return err
	}
	if ep.OwnerID != nil && *ep.OwnerID != c.id {
		return fmt.Errorf("%w: endpoint %q has another owner: its page gives it to another", errInvalid, ep.Name())
	}
	o, err := getOwner(c.r.Context(), c.a.db, c.id)
	if err != nil {
		return err
	}
	if _, err := c.a.changeEndpoint(c.r.Context(), ep.ID, endpointInput{OwnerID: nullable[int64]{Set: true, Value: &c.id}}); err != nil {
		return err
	}
	noteAuditEndpoint(c.r, ep.ID)
	return c.done(fmt.Sprintf("Endpoint %q given to %s, who sees and manages it in its portal.", ep.Name(), o.Name))
}

// takeBack is an owned endpoint's Take back button: the endpoint becomes
// the admin's alone, as PATCH {"owner_id": null} makes it. One given to
// another owner since the page was shown is refused, not taken from it
// (as the endpoint is read just before the change: a change racing this
// one is not seen).
func (c ownerClick) takeBack() error {
	ep, err := c.formEndpoint()
	if err != nil {
		return err
	}
	if ep.OwnerID == nil || *ep.OwnerID != c.id {
		return fmt.Errorf("%w: endpoint %q is not this owner's", errInvalid, ep.Name())
	}
	if _, err := c.a.changeEndpoint(c.r.Context(), ep.ID, endpointInput{OwnerID: nullable[int64]{Set: true}}); err != nil {
		return err
	}
	noteAuditEndpoint(c.r, ep.ID)
	return c.done(fmt.Sprintf("Endpoint %q taken back: only the admin sees it now.", ep.Name()))
}

// signinLink is an owner's Sign-in link button: a link for it, shown as
// the endpoint page's button shows one.
func (c ownerClick) signinLink() error {
	o, err := getOwner(c.r.Context(), c.a.db, c.id)
	if err != nil {
		return err
	}
	return renderSigninLink(c.w, c.r, c.a, o, nil)
}

// handleEndpointAlerts is GET /api/endpoints/{id}/alerts: the alerts
// firing now that name the endpoint (endpoint_failing links its page), as
// the overview has them, acknowledgements and all: what an owner, who may
// not read the overview, may see of its endpoint's alerts.
func handleEndpointAlerts(a *admin) apiFunc {
	return byID(func(ctx context.Context, id int64) (map[string][]Alert, error) {
		if _, err := getEndpoint(ctx, a.db, id); err != nil {
			return nil, err
		}
		o, err := a.overview(ctx)
		if err != nil {
			return nil, err
		}
		link, alerts := fmt.Sprintf("/endpoints/%d", id), []Alert{}
		for _, al := range o.Alerts {
			if al.Link == link {
				// The overview's level counts every endpoint failing,
				// which is not an owner's to know; this one is 1.
				al.Level = 1
				alerts = append(alerts, al)
			}
		}
		return map[string][]Alert{"alerts": alerts}, nil
	})
}

// signinLink is a sign-in link as the API answers it.
type signinLink struct {
	OwnerID   int64     `json:"owner_id"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// handleCreateSigninLink is POST /api/owners/{id}/signin-links, with an
// optional body {"lifetime": "30m"}: a link that signs a browser in as the
// owner, once, within the lifetime given, else -signin-link-lifetime;
// answered 201.
func handleCreateSigninLink(a *admin) apiFunc {
	type request struct {
		Lifetime *string `json:"lifetime"`
	}
	return func(r *http.Request) (int, any, error) {
		id, err := pathID(r)
		if err != nil {
			return 0, nil, err
		}
		var req request
		if err := decodeOptionalJSON(r, &req); err != nil {
			return 0, nil, err
		}
		lifetime := a.signinLinks
		if req.Lifetime != nil {
			if lifetime, err = parseSigninLinkLifetime(*req.Lifetime); err != nil {
				return 0, nil, err
			}
		}
		link, err := makeSigninLink(r, a, id, lifetime)
		return http.StatusCreated, link, err
	}
}

// parseSigninLinkLifetime reads a link's "lifetime", a Go duration
// ("30m", "2h"), held to the range -signin-link-lifetime has.
func parseSigninLinkLifetime(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf(`%w: lifetime: %q is not a duration such as "30m" or "24h"`, errInvalid, s)
	}
	if d < minSigninLinkLifetime || d > maxSigninLinkLifetime {
		return 0, fmt.Errorf("%w: lifetime: %s must be between %s and %s", errInvalid, d, minSigninLinkLifetime, maxSigninLinkLifetime)
	}
	return d, nil
}

// handleSigninLinkPage is POST /endpoints/{id}/signin-link: the admin's
// button on an endpoint's page, which shows a sign-in link for the
// endpoint's owner (renderSigninLink).
func handleSigninLinkPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		ep, err := getEndpoint(r.Context(), a.db, id)
		if err != nil {
			return err
		}
		if ep.OwnerID == nil {
			return fmt.Errorf("%w: endpoint %q has no owner to make a sign-in link for; give it one first", errInvalid, ep.Name())
		}
		o, err := getOwner(r.Context(), a.db, *ep.OwnerID)
		if err != nil {
			return err
		}
		return renderSigninLink(w, r, a, o, &ep)
	}
}

// renderSigninLink makes a sign-in link for owner o and shows it, once,
// on a page rendered, not redirected to: the link signs in, so it stays
// out of URLs and the history. from is the endpoint whose page asked for
// it; nil, the Owners page.
func renderSigninLink(w http.ResponseWriter, r *http.Request, a *admin, o Owner, from *Endpoint) error {
	link, err := makeSigninLink(r, a, o.ID, a.signinLinks)
	if err != nil {
		return err
	}
	nav := "owners"
	if from != nil {
		nav = "endpoints"
	}
	a.panel.render(w, http.StatusOK, "signin-link", page{Title: "Sign-in link", Nav: nav, SignedIn: true,
		Data: struct {
			Owner    Owner
			Endpoint *Endpoint
			Link     signinLink
			Lifetime time.Duration
		}{o, from, link, a.signinLinks}})
	return nil
}

// handleEndpointOwnerPage is POST /endpoints/{id}/owner: the endpoint
// page's owner form, owner_id an owner's id or empty for none, made as
// the API's PATCH {"owner_id"} makes it (changeEndpoint), within the
// owner's max_endpoints.
func handleEndpointOwnerPage(a *admin) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		f := formOf(w, r, 4096)
		in := endpointInput{OwnerID: nullable[int64]{Set: true}}
		if n := f.integer("owner_id", 0, 1, math.MaxInt64, "owner_id %q is not an owner's id"); n != 0 {
			in.OwnerID.Value = &n
		}
		if f.err != nil {
			return f.err
		}
		if _, err := a.changeEndpoint(r.Context(), id, in); err != nil {
			return err
		}
		done := "Taken back: only the admin sees it now."
		if in.OwnerID.Value != nil {
			o, err := getOwner(r.Context(), a.db, *in.OwnerID.Value)
			if err != nil {
				return err
			}
			done = fmt.Sprintf("Given to %s, who sees and manages it in its portal.", o.Name)
		}
		http.Redirect(w, r, fmt.Sprintf("/endpoints/%d?done=%s#owner", id, url.QueryEscape(done)), http.StatusSeeOther)
		return nil
	}
}

// defaultSigninLinkLifetime is how long a sign-in link is good unless
// -signin-link-lifetime says otherwise: an hour to pass it on and open
// it, short enough that one found later in a mailbox has expired.
const defaultSigninLinkLifetime = time.Hour

// A link's lifetime, -signin-link-lifetime's or one the API's body gives,
// is a minute to a week: less could end before the link is passed on and
// opened, and a link signs in whoever holds it, so one forgotten in a
// mailbox for longer should not.
const (
	minSigninLinkLifetime = time.Minute
	maxSigninLinkLifetime = 7 * 24 * time.Hour
)

// signinCodePrefix marks a sign-in link's code, as ownerTokenPrefix does a
// token; signinCodeBytes of randomness leave nothing to guess within a
// link's hour.
const (
	signinCodePrefix = "obl_"
	signinCodeBytes  = 32
)

// makeSigninLink makes a link for owner id, good for lifetime, on
// -public-url, else on the listener's own address: never on r's Host
// header, which whoever sends r writes, and which would make the admin
// hand an owner a link that gives its code to another host.
func makeSigninLink(r *http.Request, a *admin, ownerID int64, lifetime time.Duration) (signinLink, error) {
	if _, err := getOwner(r.Context(), a.db, ownerID); err != nil {
		return signinLink{}, err
	}
	b := make([]byte, signinCodeBytes)
	rand.Read(b)
	code := signinCodePrefix + hex.EncodeToString(b)
	expires, err := storeSigninLink(r.Context(), a.db, signinCodeHash(code), ownerID, lifetime)
	if err != nil {
		return signinLink{}, err
	}
	base := a.panelBase()
	link := base.JoinPath("signin")
	link.RawQuery = url.Values{"code": {code}}.Encode()
	return signinLink{OwnerID: ownerID, URL: link.String(), ExpiresAt: expires}, nil
}

// signinCodeHash is what the table keeps of a link's code.
func signinCodeHash(code string) []byte {
	sum := sha256.Sum256([]byte(code))
	return sum[:]
}

// maxSigninLinks bounds the links table as maxSessions bounds the
// sessions': a link past it revokes the oldest live one. signinLinkSweep
// is the most expired links one new link deletes: more than the one it
// adds, so that expired rows cannot pile up.
const (
	maxSigninLinks  = 1000
	signinLinkSweep = 100
)

// storeSigninLinkSQL records link $1 for owner $2, good for $5 seconds,
// first deleting up to $3 expired links and up to $3 live ones beyond the
// newest $4, as startSessionSQL bounds the sessions.
const storeSigninLinkSQL = `
WITH swept AS (
  DELETE FROM outbox.owner_signin_links
  WHERE code_hash IN (
    (SELECT code_hash
     FROM outbox.owner_signin_links
     WHERE expires_at <= now()
     ORDER BY expires_at
     LIMIT $3)
    UNION ALL
    (SELECT code_hash
     FROM outbox.owner_signin_links
     WHERE expires_at > now()
     ORDER BY expires_at DESC
     OFFSET $4
     LIMIT $3)
  )
)
INSERT INTO outbox.owner_signin_links (code_hash, owner_id, expires_at)
VALUES ($1, $2, now() + make_interval(secs => $5))
RETURNING expires_at`

func storeSigninLink(ctx context.Context, db *sql.DB, hash []byte, ownerID int64, lifetime time.Duration) (time.Time, error) {
	var expires time.Time
	err := db.QueryRowContext(ctx, storeSigninLinkSQL, hash, ownerID, signinLinkSweep, maxSigninLinks-1, lifetime.Seconds()).Scan(&expires)
	if err != nil {
		return expires, fmt.Errorf("make sign-in link: %w", err)
	}
	return expires, nil
}

// useSigninLinkSQL deletes link $1 if it is still good and answers its
// owner: the read and the delete are one statement, so of two uses racing
// one finds the row and the other finds none.
const useSigninLinkSQL = `
WITH used AS (
  DELETE FROM outbox.owner_signin_links
  WHERE code_hash = $1
    AND expires_at > now()
  RETURNING owner_id
)
SELECT` + ownerColumns + `
FROM outbox.owners
WHERE id = (SELECT owner_id FROM used)`

// useSigninLink is the owner link code signs in, using it up; nil if it
// is no link, expired, or used already.
func useSigninLink(ctx context.Context, db *sql.DB, code string) (*Owner, error) {
	o, err := scanOwner(db.QueryRowContext(ctx, useSigninLinkSQL, signinCodeHash(code)))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("use sign-in link: %w", err)
	}
	return &o, nil
}
