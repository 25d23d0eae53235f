// owners.go: owners, the people endpoints belong to (docs/owners.md):
// their tokens, stored hashed; who a request comes from, the admin or an
// owner; what each route lets an owner do (its audience, which admin.go's
// route list declares for every route); and the sign-in links the admin
// hands to an owner.

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// Owner is one row of outbox.owners as the API shows it, without its
// token, which is shown only by create and rotate-token.
type Owner struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	// Key is the address of the events its endpoints receive
	// (outbox.record's fourth argument, events.owner).
	Key string `json:"key"`
	ownerGrants
	CreatedAt      time.Time `json:"created_at"`
	TokenRotatedAt time.Time `json:"token_rotated_at"`
}

// ownerGrants are what an owner's endpoints may receive and ask for, as
// the admin set them (schema.sql, outbox.owners, says what each means).
type ownerGrants struct {
	// AllowedTopics: nil, every topic of the events addressed to it.
	AllowedTopics []string `json:"allowed_topics"`
	SharedTopics  []string `json:"shared_topics"`
	MaxEndpoints  int      `json:"max_endpoints"`
	MaxInFlight   int      `json:"max_in_flight"`
	// MaxRateLimitPerSecond: nil, any rate limit, and none.
	MaxRateLimitPerSecond *float64 `json:"max_rate_limit_per_second"`
	// MaxReplayWindowSeconds: nil, as far back as events are kept.
	MaxReplayWindowSeconds *int64 `json:"max_replay_window_seconds"`
}

// ownerWithToken is the answer to create and rotate-token.
type ownerWithToken struct {
	Owner
	Token string `json:"token"` // obo_...
}

// An owner's token is ownerTokenPrefix, then a selector and a verifier in
// hex: the prefix tells it at a glance (in a log, a secret scanner's
// rules) from the admin token and a whsec_ secret; the selector finds the
// owner's row without comparing secrets in a B-tree, and the verifier is
// compared, as its SHA-256, in constant time. 32 random bytes of verifier
// leave nothing to guess, so a plain SHA-256 (no salt, no stretching) is
// all the table needs to hold nothing that signs in.
const (
	ownerTokenPrefix   = "obo_"
	ownerSelectorBytes = 12
	ownerVerifierBytes = 32
	ownerTokenLen      = len(ownerTokenPrefix) + 2*(ownerSelectorBytes+ownerVerifierBytes)
	maxOwnerNameLen    = 200 // schema.sql's owners_name_length repeats it
)

// newOwnerToken draws a token, answering it, its selector and the hash the
// table keeps of its verifier.
func newOwnerToken() (token, selector string, hash []byte) {
	b := make([]byte, ownerSelectorBytes+ownerVerifierBytes)
	rand.Read(b)
	selector = hex.EncodeToString(b[:ownerSelectorBytes])
	sum := sha256.Sum256(b[ownerSelectorBytes:])
	return ownerTokenPrefix + hex.EncodeToString(b), selector, sum[:]
}

// parseOwnerToken splits a token into its selector and its verifier's
// hash; ok is false for anything not shaped as an owner's token.
func parseOwnerToken(token string) (selector string, hash []byte, ok bool) {
	rest, found := strings.CutPrefix(token, ownerTokenPrefix)
	if !found || len(token) != ownerTokenLen {
		return "", nil, false
	}
	b, err := hex.DecodeString(rest)
	if err != nil || hex.EncodeToString(b) != rest { // lower-case hex only, as drawn
		return "", nil, false
	}
	sum := sha256.Sum256(b[ownerSelectorBytes:])
	return rest[:2*ownerSelectorBytes], sum[:], true
}

const ownerColumns = `
  id, name, key, allowed_topics, shared_topics,
  max_endpoints, max_in_flight, max_rate_limit_per_second, max_replay_window_seconds,
  created_at, token_rotated_at`

func scanOwner(row rowScanner) (Owner, error) {
	var o Owner
	// pq reads NULL as a nil list and '{}' as an empty one: allowed_topics
	// keeps "every topic" apart from "none".
	err := row.Scan(&o.ID, &o.Name, &o.Key, pq.Array(&o.AllowedTopics), pq.Array(&o.SharedTopics),
		&o.MaxEndpoints, &o.MaxInFlight, &o.MaxRateLimitPerSecond, &o.MaxReplayWindowSeconds,
		&o.CreatedAt, &o.TokenRotatedAt)
	return o, err
}

// ownerInput is what POST and PATCH /api/owners take: a field left out
// keeps its value (on create, its default: schema.sql).
type ownerInput struct {
	Name                   *string            `json:"name"`
	Key                    *string            `json:"key"`
	AllowedTopics          nullable[[]string] `json:"allowed_topics"`
	SharedTopics           *[]string          `json:"shared_topics"`
	MaxEndpoints           *int               `json:"max_endpoints"`
	MaxInFlight            *int               `json:"max_in_flight"`
	MaxRateLimitPerSecond  nullable[float64]  `json:"max_rate_limit_per_second"`
	MaxReplayWindowSeconds nullable[int64]    `json:"max_replay_window_seconds"`
}

// The ranges of an owner's limits, as schema.sql's owners_*_range
// constraints hold them.
const (
	maxOwnerEndpoints = 10_000
	maxOwnerTopics    = 100
)

// validate checks the fields given; creating, a name is required. It
// answers the first problem, as every other route does.
func (in ownerInput) validate(creating bool) error {
	if in.Name != nil || creating {
		if err := validOwnerName(deref(in.Name)); err != nil {
			return err
		}
	}
	if in.Key != nil {
		if err := validOwnerKey("key", *in.Key); err != nil {
			return err
		}
	}
	for _, list := range []struct {
		field    string
		patterns []string
	}{{"allowed_topics", deref(in.AllowedTopics.Value)}, {"shared_topics", deref(in.SharedTopics)}} {
		if len(list.patterns) > maxOwnerTopics {
			return fmt.Errorf("%w: %s: %d topic patterns, at most %d", errInvalid, list.field, len(list.patterns), maxOwnerTopics)
		}
		for _, p := range list.patterns {
			if err := topicPatternValid(p); err != nil {
				return fmt.Errorf("%s: %w", list.field, err)
			}
		}
	}
	switch n, r, w := in.MaxEndpoints, in.MaxRateLimitPerSecond.Value, in.MaxReplayWindowSeconds.Value; {
	case n != nil && (*n < 0 || *n > maxOwnerEndpoints):
		return fmt.Errorf("%w: max_endpoints must be between 0 and %d, got %d", errInvalid, maxOwnerEndpoints, *n)
	case in.MaxInFlight != nil && (*in.MaxInFlight < 1 || *in.MaxInFlight > maxMaxInFlight):
		return fmt.Errorf("%w: max_in_flight must be between 1 and %d, got %d", errInvalid, maxMaxInFlight, *in.MaxInFlight)
	case r != nil && (*r < minRateLimit || *r > maxRateLimit):
		return fmt.Errorf("%w: max_rate_limit_per_second must be between %g and %g, or null for none, got %g", errInvalid, minRateLimit, float64(maxRateLimit), *r)
	case w != nil && *w < 0:
		return fmt.Errorf("%w: max_replay_window_seconds must be 0 or more, or null for events retention, got %d", errInvalid, *w)
	}
	return nil
}

// prefixScanner reads a row whose first column goes to first, and the
// rest where its caller's Scan says.
type prefixScanner struct {
	row   rowScanner
	first any
}

func (p prefixScanner) Scan(dest ...any) error { return p.row.Scan(append([]any{p.first}, dest...)...) }

// ptr is a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }

// deref is *p, or T's zero value for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// validOwnerName refuses a name the panel could not show on one line.
func validOwnerName(name string) error {
	switch {
	case strings.TrimSpace(name) == "":
		return fmt.Errorf(`%w: "name" is required`, errInvalid)
	case !isText(name) || strings.ContainsAny(name, "\r\n"):
		return fmt.Errorf("%w: name must be one line of UTF-8 text without NUL", errInvalid)
	case utf8.RuneCountInString(name) > maxOwnerNameLen:
		return fmt.Errorf("%w: name is %d characters, at most %d", errInvalid, utf8.RuneCountInString(name), maxOwnerNameLen)
	}
	return nil
}

// createOwnerSQL stores an owner with its columns' defaults (schema.sql);
// a NULL key gets 'owner-' and its id (owners_default_key).
const createOwnerSQL = `
INSERT INTO outbox.owners (name, token_selector, token_hash, key)
VALUES ($1, $2, $3, $4)
RETURNING id`

// createOwner stores a new owner, with the settings in gives on top of
// the defaults, and answers it with its token, which exists nowhere else
// from then on.
func createOwner(ctx context.Context, db *sql.DB, in ownerInput) (ownerWithToken, error) {
	if err := in.validate(true); err != nil {
		return ownerWithToken{}, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return ownerWithToken{}, fmt.Errorf("create owner: %w", err)
	}
	defer tx.Rollback()
	token, selector, hash := newOwnerToken()
	var id int64
	if err := tx.QueryRowContext(ctx, createOwnerSQL, *in.Name, selector, hash, in.Key).Scan(&id); err != nil {
		return ownerWithToken{}, ownerWriteError("create owner", in, err)
	}
	settings := in
	settings.Name, settings.Key = nil, nil // written
	o, err := writeOwner(ctx, tx, id, settings)
	if err != nil {
		return ownerWithToken{}, ownerWriteError("create owner", in, err)
	}
	if err := tx.Commit(); err != nil {
		return ownerWithToken{}, fmt.Errorf("create owner: %w", err)
	}
	return ownerWithToken{Owner: o, Token: token}, nil
}

// nullableArray is a text[] parameter: NULL for nil.
func nullableArray(list *[]string) any {
	if list == nil {
		return nil
	}
	return pq.Array(append([]string{}, *list...))
}

// ownerWriteError is a refused write of an owner: a key another owner
// has is the caller's mistake (400), anything else the database's.
func ownerWriteError(op string, in ownerInput, err error) error {
	if pqErr := pq.As(err); pqErr != nil && pqErr.Code == pqerror.UniqueViolation && pqErr.Constraint == "owners_key_unique" {
		return fmt.Errorf("%w: key %q: another owner has it", errInvalid, deref(in.Key))
	}
	return fmt.Errorf("%s: %w", op, err)
}

// updateOwnerSQL changes owner $1's given fields (a NULL parameter keeps
// the column), and brings its endpoints within limits that went down:
// the admin's change is the owner's new bound, on the endpoints it has
// as on those it makes.
const updateOwnerSQL = `
WITH updated AS (
  UPDATE outbox.owners
  SET name = coalesce($2, name),
      key = coalesce($3, key),
      allowed_topics = CASE WHEN $4 THEN $5::text[] ELSE allowed_topics END,
      shared_topics = coalesce($6::text[], shared_topics),
      max_endpoints = coalesce($7, max_endpoints),
      max_in_flight = coalesce($8, max_in_flight),
      max_rate_limit_per_second = CASE WHEN $9 THEN $10 ELSE max_rate_limit_per_second END,
      max_replay_window_seconds = CASE WHEN $11 THEN $12 ELSE max_replay_window_seconds END
  WHERE id = $1
  RETURNING` + ownerColumns + `
),
clamped AS (
  UPDATE outbox.endpoints AS ep
  SET max_in_flight = least(ep.max_in_flight, u.max_in_flight),
      rate_limit_per_second = CASE WHEN u.max_rate_limit_per_second IS NULL THEN ep.rate_limit_per_second
                                   ELSE least(coalesce(ep.rate_limit_per_second, u.max_rate_limit_per_second),
                                              u.max_rate_limit_per_second) END,
      updated_at = now()
  FROM updated AS u
  WHERE ep.owner_id = u.id
    AND (ep.max_in_flight > u.max_in_flight
         OR (u.max_rate_limit_per_second IS NOT NULL
             AND (ep.rate_limit_per_second IS NULL OR ep.rate_limit_per_second > u.max_rate_limit_per_second)))
)
SELECT` + ownerColumns + `
FROM updated`

// writeOwner writes the fields in gives to owner id (updateOwnerSQL).
func writeOwner(ctx context.Context, q queryer, id int64, in ownerInput) (Owner, error) {
	return scanOwner(q.QueryRowContext(ctx, updateOwnerSQL, id, in.Name, in.Key,
		in.AllowedTopics.Set, nullableArray(in.AllowedTopics.Value), nullableArray(in.SharedTopics),
		in.MaxEndpoints, in.MaxInFlight,
		in.MaxRateLimitPerSecond.Set, in.MaxRateLimitPerSecond.Value,
		in.MaxReplayWindowSeconds.Set, in.MaxReplayWindowSeconds.Value))
}

// updateOwner changes owner id as in says.
func updateOwner(ctx context.Context, db *sql.DB, id int64, in ownerInput) (Owner, error) {
	if err := in.validate(false); err != nil {
		return Owner{}, err
	}
	o, err := writeOwner(ctx, db, id, in)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return o, fmt.Errorf("owner %d: %w", id, errNotFound)
	case err != nil:
		return o, ownerWriteError(fmt.Sprintf("update owner %d", id), in, err)
	}
	return o, nil
}

// listOwnersSQL is every owner: the admin creates each one, and a page
// of them all is what the endpoint page's owner list needs.
const listOwnersSQL = `
SELECT` + ownerColumns + `
FROM outbox.owners
ORDER BY id
LIMIT $1`

// maxOwners bounds one answer of GET /api/owners.
const maxOwners = 1000

func listOwners(ctx context.Context, db *sql.DB) ([]Owner, error) {
	owners, err := queryAll(ctx, db, scanOwner, listOwnersSQL, maxOwners)
	if err != nil {
		return nil, fmt.Errorf("list owners: %w", err)
	}
	return owners, nil
}

// ownerNamesSQL is the name of each owner of ids $1.
const ownerNamesSQL = `
SELECT id, name
FROM outbox.owners
WHERE id = ANY($1)`

// ownerNames is the name of each owner of ids that exists, by id: what
// a page shows a person for an owner's id.
func ownerNames(ctx context.Context, db *sql.DB, ids []int64) (map[int64]string, error) {
	names := make(map[int64]string, len(ids))
	if len(ids) == 0 {
		return names, nil
	}
	type owner struct {
		id   int64
		name string
	}
	owners, err := queryAll(ctx, db, func(row rowScanner) (owner, error) {
		var o owner
		err := row.Scan(&o.id, &o.name)
		return o, err
	}, ownerNamesSQL, pq.Array(ids))
	if err != nil {
		return nil, fmt.Errorf("read owner names: %w", err)
	}
	for _, o := range owners {
		names[o.id] = o.name
	}
	return names, nil
}

// ownerEndpointsShown is how many of each owner's endpoints the Owners
// page lists, the first by id, beside how many it has: five times the
// default max_endpoints, so that only an owner the admin let grow has
// more than its row shows.
const ownerEndpointsShown = 50

// ownedEndpointsSQL is the first $1 endpoints, by id, of each owner
// listOwnersSQL lists ($2 of them), each with how many its owner has:
// one range of endpoints_by_owner_id an owner.
const ownedEndpointsSQL = `
WITH listed AS (
  SELECT id
  FROM outbox.owners
  ORDER BY id
  LIMIT $2
),
shown AS (
  SELECT e.id, e.total
  FROM listed AS o
  CROSS JOIN LATERAL (
    SELECT id, count(*) OVER () AS total
    FROM outbox.endpoints
    WHERE owner_id = o.id
    ORDER BY id
    LIMIT $1
  ) AS e
)
SELECT shown.total,` + endpointColumns + `
FROM outbox.endpoints
JOIN shown USING (id)
ORDER BY owner_id, id`

// readOwnedEndpoints is what the Owners page lists of the owners'
// endpoints (ownedEndpointsSQL), and how many each owner has, by its id.
func readOwnedEndpoints(ctx context.Context, db *sql.DB) ([]Endpoint, map[int64]int, error) {
	counts := map[int64]int{}
	eps, err := queryAll(ctx, db, func(row rowScanner) (Endpoint, error) {
		var total int
		e, err := scanEndpoint(prefixScanner{row, &total})
		if err == nil && e.OwnerID != nil {
			counts[*e.OwnerID] = total
		}
		return e, err
	}, ownedEndpointsSQL, ownerEndpointsShown, maxOwners)
	if err != nil {
		return nil, nil, fmt.Errorf("list owners' endpoints: %w", err)
	}
	return eps, counts, nil
}

// adminsEndpointsSQL is the first $1 of the endpoints of no owner, by id:
// those the Owners page offers to give an owner.
const adminsEndpointsSQL = `
SELECT id, description, url
FROM outbox.endpoints
WHERE owner_id IS NULL
ORDER BY id
LIMIT $1`

// listAdminsEndpoints is the endpoints of no owner (adminsEndpointsSQL),
// each with what names it (Endpoint.Name) and nothing more.
func listAdminsEndpoints(ctx context.Context, db *sql.DB) ([]Endpoint, error) {
	eps, err := queryAll(ctx, db, func(row rowScanner) (Endpoint, error) {
		var e Endpoint
		err := row.Scan(&e.ID, &e.Description, &e.URL)
		return e, err
	}, adminsEndpointsSQL, maxEndpointPage)
	if err != nil {
		return nil, fmt.Errorf("list the admin's endpoints: %w", err)
	}
	return eps, nil
}

const getOwnerSQL = `
SELECT` + ownerColumns + `
FROM outbox.owners
WHERE id = $1`

func getOwner(ctx context.Context, db *sql.DB, id int64) (Owner, error) {
	o, err := scanOwner(db.QueryRowContext(ctx, getOwnerSQL, id))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return o, fmt.Errorf("owner %d: %w", id, errNotFound)
	case err != nil:
		return o, fmt.Errorf("get owner %d: %w", id, err)
	}
	return o, nil
}

// deleteOwnerSQL deletes an owner; its sessions and sign-in links go with
// it, and its endpoints stay, the admin's alone (schema.sql).
const deleteOwnerSQL = `
DELETE FROM outbox.owners
WHERE id = $1`

func deleteOwner(ctx context.Context, db *sql.DB, id int64) error {
	res, err := db.ExecContext(ctx, deleteOwnerSQL, id)
	if err != nil {
		return fmt.Errorf("delete owner %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("owner %d: %w", id, errNotFound)
	}
	return nil
}

// rotateOwnerTokenSQL gives owner $1 a new token, signs its browsers out
// and voids its unused sign-in links, in one statement: neither a session
// begun with the old token nor a link handed out before the rotation
// (which the admin may be rotating because it leaked) outlives it. The
// links table has no index on owner_id: maxSigninLinks bounds it.
const rotateOwnerTokenSQL = `
WITH ended AS (
  DELETE FROM outbox.owner_sessions
  WHERE owner_id = $1
),
voided AS (
  DELETE FROM outbox.owner_signin_links
  WHERE owner_id = $1
)
UPDATE outbox.owners
SET token_selector = $2,
    token_hash = $3,
    token_rotated_at = now()
WHERE id = $1
RETURNING` + ownerColumns

// rotateOwnerToken replaces owner id's token: the old one, its sessions
// and the owner's sign-in links are refused from the commit on.
func rotateOwnerToken(ctx context.Context, db *sql.DB, id int64) (ownerWithToken, error) {
	token, selector, hash := newOwnerToken()
	o, err := scanOwner(db.QueryRowContext(ctx, rotateOwnerTokenSQL, id, selector, hash))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ownerWithToken{}, fmt.Errorf("owner %d: %w", id, errNotFound)
	case err != nil:
		return ownerWithToken{}, fmt.Errorf("rotate owner %d's token: %w", id, err)
	}
	return ownerWithToken{Owner: o, Token: token}, nil
}

const ownerByTokenSQL = `
SELECT token_hash,` + ownerColumns + `
FROM outbox.owners
WHERE token_selector = $1`

// ownerOfToken is the owner whose token token is, or nil if it is no
// owner's. Only the selector is looked up; the verifier's hash is
// compared in constant time.
func ownerOfToken(ctx context.Context, db *sql.DB, token string) (*Owner, error) {
	selector, hash, ok := parseOwnerToken(token)
	if !ok {
		return nil, nil
	}
	var stored []byte
	o, err := scanOwner(prefixScanner{db.QueryRowContext(ctx, ownerByTokenSQL, selector), &stored})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read owner token: %w", err)
	case subtle.ConstantTimeCompare(stored, hash) != 1:
		return nil, nil
	}
	return &o, nil
}

// principal is who a request comes from: the admin, an owner, or (the
// zero value) nobody, which every audience refuses and every scoped read
// answers empty: a route served without authentication fails closed.
type principal struct {
	admin bool
	owner *Owner
}

// principalKey keys the principal in a request's context.
type principalKey struct{}

// withPrincipal is r as who sent it.
func withPrincipal(r *http.Request, who principal) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, who))
}

// principalOf is who sent r, as requireToken or requireSession found.
func principalOf(r *http.Request) principal { return principalIn(r.Context()) }

// principalIn is principalOf for a handler that has only the context.
func principalIn(ctx context.Context) principal {
	who, _ := ctx.Value(principalKey{}).(principal)
	return who
}

// ownerID is the owner's id, or nil for the admin (and nobody).
func (p principal) ownerID() *int64 {
	if p.owner == nil {
		return nil
	}
	return &p.owner.ID
}

// audience is who may use a route: every route in admin.go's list
// declares one, and a route without one (audienceUndeclared) is the
// admin's alone, which TestEveryRouteDeclaresItsAudience refuses.
type audience int

const (
	audienceUndeclared audience = iota
	// forAdmin: the admin alone; an owner is answered 403.
	forAdmin
	// forOwnedEndpoint: a route under an endpoint's {id}: the admin, and
	// the endpoint's owner; another owner is answered 404, as for an
	// endpoint that does not exist.
	forOwnedEndpoint
	// forEveryone: the admin and every owner, the handler reading only
	// what principalOf may see (an owner's endpoints, its audit entries).
	forEveryone
)

func (who audience) String() string {
	return [...]string{"undeclared", "admin", "owned endpoint", "everyone"}[who]
}

// errAdminsOnly is an owner's answer on a route of the admin's.
var errAdminsOnly = &httpError{status: http.StatusForbidden,
	text: "an owner's token may use /api/endpoints, its endpoints' routes, GET /api/events, GET /api/topics and /api/audit; this route is the admin's"}

// allowed reports whether r's principal may use a route for who; a false
// answer comes with the error to answer, a 403 or, for an endpoint it
// does not own, the 404 of an endpoint that does not exist.
func (a *admin) allowed(r *http.Request, who audience) error {
	p := principalOf(r)
	switch {
	case p.admin:
		return nil
	case p.owner == nil:
		return &httpError{status: http.StatusUnauthorized, text: "missing or wrong token"}
	case who == forEveryone:
		return nil
	case who != forOwnedEndpoint:
		return errAdminsOnly
	}
	id, err := pathID(r)
	if err != nil {
		return err
	}
	owns, err := ownsEndpoint(r.Context(), a.db, p.owner.ID, id)
	if err != nil {
		return err
	}
	if !owns {
		return fmt.Errorf("endpoint %d: %w", id, errNotFound) // the text getEndpoint's 404 has
	}
	return nil
}

const ownsEndpointSQL = `
SELECT EXISTS (
  SELECT 1
  FROM outbox.endpoints
  WHERE id = $1
    AND owner_id = $2
)`

func ownsEndpoint(ctx context.Context, db *sql.DB, ownerID, endpointID int64) (bool, error) {
	var owns bool
	if err := db.QueryRowContext(ctx, ownsEndpointSQL, endpointID, ownerID).Scan(&owns); err != nil {
		return false, fmt.Errorf("check endpoint %d's owner: %w", endpointID, err)
	}
	return owns, nil
}

// allowAPI serves h to the principals who may use it.
func (a *admin) allowAPI(who audience, h apiFunc) apiFunc {
	return func(r *http.Request) (int, any, error) {
		if err := a.allowed(r, who); err != nil {
			return 0, nil, err
		}
		return h(r)
	}
}

// allowPage is allowAPI for a panel page.
func (a *admin) allowPage(who audience, h pageFunc) pageFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := a.allowed(r, who); err != nil {
			return err
		}
		return h(w, r)
	}
}

// listOwnerEndpointsSQL is listEndpointsSQL for one owner's endpoints.
const listOwnerEndpointsSQL = `
SELECT` + endpointColumns + `
FROM outbox.endpoints
WHERE id > $1
  AND owner_id = $3
ORDER BY id
LIMIT $2`

// listEndpointsFor is the page of endpoints the request's sender
// (principalIn) may see: all of them for the admin, its own for an owner,
// none for nobody.
func listEndpointsFor(ctx context.Context, db *sql.DB, afterID int64, limit int) ([]Endpoint, error) {
	who := principalIn(ctx)
	switch {
	case who.admin:
		return listEndpoints(ctx, db, afterID, limit)
	case who.owner == nil:
		return []Endpoint{}, nil
	}
	endpoints, err := queryAll(ctx, db, scanEndpoint, listOwnerEndpointsSQL, afterID, limit, who.owner.ID)
	if err != nil {
		return nil, fmt.Errorf("list owner %d's endpoints: %w", who.owner.ID, err)
	}
	return endpoints, nil
}

// claimInput makes a new endpoint's or a change's owner_id what its
// sender (principalIn) may give:
// the admin's as given (an owner that exists, or null for none); an
// owner's endpoint is its own, and an owner_id it gives is refused rather
// than ignored, so that a client that meant another owner learns it
// cannot. creating gives an owner's new endpoint its owner. Either way
// the endpoint counts against its owner's max_endpoints (countedFor):
// the admin's settings of an endpoint are not limited, but the number of
// endpoints an owner has is, whoever gives them to it.
func claimInput(ctx context.Context, db *sql.DB, in *endpointInput, creating bool) error {
	who := principalIn(ctx)
	if !who.admin {
		if in.OwnerID.Set {
			return fmt.Errorf("%w: owner_id: an owner's token cannot set it; the endpoints it creates are its own", errInvalid)
		}
		if who.owner == nil {
			return nil
		}
		if creating {
			in.OwnerID = nullable[int64]{Set: true, Value: &who.owner.ID}
			in.countedFor = &who.owner.ID
		}
		return who.owner.ownerGrants.limit(in, creating)
	}
	if in.OwnerID.Value != nil {
		if _, err := getOwner(ctx, db, *in.OwnerID.Value); errors.Is(err, errNotFound) {
			return fmt.Errorf("%w: owner_id %d: no such owner", errInvalid, *in.OwnerID.Value)
		} else if err != nil {
			return err
		}
		in.countedFor = in.OwnerID.Value
	}
	return nil
}

// limit holds an owner's write of its endpoint (in) to what the admin
// granted it: topics it may receive, and settings no higher than its
// limits. Creating, the settings it leaves out become the highest it may
// have where the endpoint's own default is higher. Only what in gives is
// checked: an endpoint the admin set beyond the limits keeps that until
// the owner changes the field. The admin's own writes are not limited.
func (g ownerGrants) limit(in *endpointInput, creating bool) error {
	if in.Topics != nil || creating {
		if err := g.coverTopics(deref(in.Topics)); err != nil {
			return err
		}
	}
	switch {
	case in.MaxInFlight != nil && *in.MaxInFlight > g.MaxInFlight:
		return fmt.Errorf("%w: max_in_flight %d: this owner's endpoints may ask for %d at most", errInvalid, *in.MaxInFlight, g.MaxInFlight)
	case in.MaxInFlight == nil && creating && defaultMaxInFlight > g.MaxInFlight:
		in.MaxInFlight = ptr(g.MaxInFlight)
	}
	if most := g.MaxRateLimitPerSecond; most != nil {
		rate := in.RateLimitPerSecond
		switch {
		case rate.Set && rate.Value == nil:
			return fmt.Errorf("%w: rate_limit_per_second: this owner's endpoints need one, at most %g a second", errInvalid, *most)
		case rate.Value != nil && *rate.Value > *most:
			return fmt.Errorf("%w: rate_limit_per_second %g: this owner's endpoints may ask for %g a second at most", errInvalid, *rate.Value, *most)
		case !rate.Set && creating:
			in.RateLimitPerSecond = nullable[float64]{Set: true, Value: ptr(*most)}
		}
	}
	return nil
}

// coverTopics refuses an endpoint's topic pattern that selects more than
// the owner may receive: the topics of its own events it is allowed (all
// when AllowedTopics is nil) and those it is shared. An endpoint's empty
// list selects every topic, as "*" does. The fan-out keeps to the same
// grants whatever an endpoint's topics (outbox.owner_admits): this check
// is there to tell the owner, not to hold the boundary.
func (g ownerGrants) coverTopics(patterns []string) error {
	if g.AllowedTopics == nil {
		return nil
	}
	if len(patterns) == 0 {
		patterns = []string{"*"}
	}
	granted := append(append([]string{}, g.AllowedTopics...), g.SharedTopics...)
	for _, p := range patterns {
		if !slices.ContainsFunc(granted, func(grant string) bool { return patternCovers(grant, p) }) {
			may := "no topic"
			if len(granted) > 0 {
				may = strings.Join(granted, ", ")
			}
			return fmt.Errorf("%w: topics: %q selects topics this owner may not receive; it may receive %s", errInvalid, p, may)
		}
	}
	return nil
}

// patternCovers reports whether every topic that pattern p selects is
// selected by grant (outbox.topic_matches' rules: "*" every topic but
// outboxd's own, "order.*" every topic under "order.", else the name).
func patternCovers(grant, p string) bool {
	switch {
	case grant == p:
		return true
	case grant == "*":
		return !strings.HasPrefix(p, internalTopicPrefix)
	case strings.HasSuffix(grant, ".*"):
		return strings.HasPrefix(p, strings.TrimSuffix(grant, "*"))
	}
	return false
}
