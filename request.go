// request.go: reading a request, for the API and the panel alike: path
// values, JSON bodies, query parameters and forms, each refusing a bad
// value as the client's mistake (errInvalid, a 400), and the pages of the
// lists that are read newest first and paged by id.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// pathID is the path value id, a row's id: a positive integer, or the
// request is refused.
func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: id %q is not a positive integer", errInvalid, r.PathValue("id"))
	}
	return id, nil
}

// pathText is the path value key, a name of something stored as text. A
// value PostgreSQL cannot hold as text (isText) names nothing that can
// exist: not found, without asking the database, which would refuse it.
func pathText(r *http.Request, key string) (string, error) {
	v := r.PathValue(key)
	if !isText(v) {
		return "", fmt.Errorf("%s %q: %w", key, v, errNotFound)
	}
	return v, nil
}

// isText reports whether PostgreSQL can hold s as text: valid UTF-8
// without NUL. It refuses anything else (SQLSTATE 22021), which would
// answer the client's mistake as the server's 500.
func isText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// errBodyRead marks a failure to read a request's body off its connection:
// the client stalled past the server's read timeout, or went away. It is
// not a body that arrived and is wrong, and its text (the socket's
// addresses) is not the client's business: answerOf (httpserve.go)
// answers it without it.
var errBodyRead = errors.New("read request body")

// markedBody is a request body whose read failures wrap errBodyRead,
// except the bound's own (*http.MaxBytesError, a 413).
type markedBody struct{ io.ReadCloser }

func (b markedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		if _, tooBig := errors.AsType[*http.MaxBytesError](err); !tooBig {
			err = fmt.Errorf("%w: %w", errBodyRead, err)
		}
	}
	return n, err
}

// decodeJSON reads one JSON object from the (bounded) body into v, a
// pointer to a struct, strictly: a name must be a field's name as its tag
// spells it (encoding/json alone takes "TOPIC" for "topic"), no object in
// the body may name a member twice (PostgreSQL's jsonb keeps the last of
// two, other readers the first, so the two would disagree on what was
// sent), an unknown field is an error (a typo in a field name is not a
// silent default), and every string, name or value, must be text
// (checkJSONBody). Every route's body is read here, so these rules hold
// for each.
func decodeJSON(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		if tooBig, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return fmt.Errorf("request body larger than %d bytes: %w", tooBig.Limit, err)
		}
		return fmt.Errorf("request body: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s", errInvalid, decodeProblem(err, v))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: request body: more than one JSON value", errInvalid)
	}
	fields := map[string]bool{}
	if t := reflect.TypeOf(v).Elem(); t.Kind() == reflect.Struct {
		for f := range t.Fields() {
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
				fields[name] = true
			} else if name == "" && f.IsExported() {
				fields[f.Name] = true
			}
		}
	}
	if err := checkJSONBody(body, fields); err != nil {
		return fmt.Errorf("%w: %v", errInvalid, err)
	}
	return nil
}

// decodeProblem is the 400's text for err, the decoder's refusal of a
// body read into v, in JSON's words: encoding/json's errors name Go's
// types and struct fields ("Go struct field endpointInput.url of type
// string"), which are outboxd's insides, not the API's. A type refused
// names the field by its JSON path and the JSON type it takes.
func decodeProblem(err error, v any) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		got := jsonValueNames[te.Value]
		if got == "" { // "number 1.5": a number the field's type cannot hold
			got = "the " + te.Value
		}
		if te.Field == "" {
			return fmt.Sprintf("request body: want %s, got %s", jsonTypeName(te.Type, false), got)
		}
		// te.Type is the Go type refused: an element's, for an array.
		if t, ok := fieldType(reflect.TypeOf(v), te.Field); ok && t.Kind() == reflect.Slice && te.Type.Kind() != reflect.Slice {
			return fmt.Sprintf("%s: want %s, got %s in it", te.Field, jsonTypeName(t, false), got)
		}
		return fmt.Sprintf("%s: want %s, got %s", te.Field, jsonTypeName(te.Type, false), got)
	}
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Sprintf("request body: not JSON: %v (at byte %d)", se, se.Offset)
	}
	switch text := err.Error(); {
	case errors.Is(err, io.EOF):
		return "request body: empty; want a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "request body: ends before its JSON does"
	case strings.HasPrefix(text, "json: unknown field "): // DisallowUnknownFields's, which has no type
		return "request body: " + strings.TrimPrefix(text, "json: ")
	default:
		// No other error of the decoder is the client's to read: a
		// type's own UnmarshalJSON may word it in Go.
		return "request body: not what this route takes"
	}
}

// jsonValueNames says what UnmarshalTypeError.Value names.
var jsonValueNames = map[string]string{
	"string": "a string", "number": "a number", "bool": "true or false",
	"array": "an array", "object": "an object",
}

// jsonTypeName is the JSON a value of Go type t is read from, as a 400
// names it: "a string", "an array of integers"; plural for an array's.
func jsonTypeName(t reflect.Type, plural bool) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	name := func(one, many string) string {
		if plural {
			return many
		}
		return one
	}
	switch t.Kind() {
	case reflect.String:
		return name("a string", "strings")
	case reflect.Bool:
		return name("true or false", "booleans")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return name("an integer", "integers")
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return name("a non-negative integer", "non-negative integers")
	case reflect.Float32, reflect.Float64:
		return name("a number", "numbers")
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // encoding/json's base64
			return name("a base64 string", "base64 strings")
		}
		return name("an array of "+jsonTypeName(t.Elem(), true), "arrays")
	case reflect.Map, reflect.Struct:
		return name("an object", "objects")
	}
	return name("a JSON value", "JSON values")
}

// fieldType is the Go type of the field of struct type t at path, the
// JSON names of the fields down to it, dot-separated, as an
// UnmarshalTypeError's Field gives it; an array's element stands for the
// array on the way down.
func fieldType(t reflect.Type, path string) (reflect.Type, bool) {
	for name := range strings.SplitSeq(path, ".") {
		for t.Kind() == reflect.Pointer || (t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8) {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil, false
		}
		found := false
		for f := range t.Fields() {
			if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == name || (tag == "" && f.Name == name) {
				t, found = f.Type, true
				break
			}
		}
		if !found {
			return nil, false
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t, true
}

// jsonLevel is an object or an array open where checkJSONBody has come to.
type jsonLevel struct {
	names  map[string]bool // the object's names seen so far; nil for an array
	member string          // the object's member being read
	index  int             // the array's element being read
}

// checkJSONBody walks data, JSON the decoder has already found well
// formed, in one pass, and refuses:
//   - a name given twice in one object at any depth, and, in the
//     outermost object, a name that is not exactly one of fields (the
//     decoder took it by its case-insensitive match; nil fields take any);
//   - a string, name or value, that is not text: bytes that are not
//     UTF-8, or a \ud800-\udfff escape that is not half of a high-low
//     pair. encoding/json turns both into U+FFFD without a word, which
//     would store something other than what was sent.
//
// The error names where: the path of names and indexes to the string
// (payload.lines[2].sku), or the object it is a name in. It scans the
// bytes: json.Decoder's tokens cost several times the decode itself on a
// body of many small objects.
func checkJSONBody(data []byte, fields map[string]bool) error {
	var levels []jsonLevel
	atName := false // the next string is a name, not a value
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{':
			levels, atName = append(levels, jsonLevel{names: map[string]bool{}}), true
		case '[':
			levels, atName = append(levels, jsonLevel{}), false
		case '}', ']':
			levels, atName = levels[:len(levels)-1], false
		case ',':
			in := &levels[len(levels)-1]
			atName = in.names != nil
			in.index++
		case '"':
			end, escaped, problem := scanJSONString(data, i+1)
			if problem != "" {
				return fmt.Errorf("%s: %s", jsonPath(levels, atName), problem)
			}
			if atName {
				name := string(data[i+1 : end])
				if escaped {
					if err := json.Unmarshal(data[i:end+1], &name); err != nil {
						return fmt.Errorf("request body: %w", err)
					}
				}
				in := &levels[len(levels)-1]
				switch {
				case in.names[name]:
					return fmt.Errorf("request body: %q given twice in one object", name)
				case len(levels) == 1 && fields != nil && !fields[name]:
					return fmt.Errorf("request body: unknown field %q (names are case-sensitive)", name)
				}
				in.names[name], in.member, atName = true, name, false
			}
			i = end
		}
	}
	return nil
}

// scanJSONString reads the string of well-formed JSON whose contents
// start at data[start], up to its closing quote at end. escaped says it
// holds an escape; problem, when not "", says why it is not text.
func scanJSONString(data []byte, start int) (end int, escaped bool, problem string) {
	for j := start; ; j++ {
		switch c := data[j]; {
		case c == '"':
			return j, escaped, ""
		case c == '\\':
			escaped, j = true, j+1
			if data[j] != 'u' {
				continue
			}
			r := hex4(data[j+1:])
			switch {
			case !utf16.IsSurrogate(r):
				j += 4
			case data[j+5] == '\\' && data[j+6] == 'u' && utf16.DecodeRune(r, hex4(data[j+7:])) != utf8.RuneError:
				j += 10 // a high-low pair
			default:
				return j, escaped, fmt.Sprintf(`\u%04x is a lone UTF-16 surrogate; a character past U+FFFF is escaped as a high-low pair`, r)
			}
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(data[j:])
			if r == utf8.RuneError && size == 1 {
				return j, escaped, fmt.Sprintf("byte 0x%02x is not UTF-8 text", c)
			}
			j += size - 1
		}
	}
}

// hex4 is the value of the 4 hex digits b starts with, which well-formed
// JSON's \u escapes have.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		default:
			r = r<<4 | rune(c-'A'+10)
		}
	}
	return r
}

// jsonPath names where checkJSONBody has come to: the names and indexes
// down to the string being read, or, atName, the object that string is a
// name in.
func jsonPath(levels []jsonLevel, atName bool) string {
	if atName {
		levels = levels[:len(levels)-1]
	}
	var path strings.Builder
	for _, l := range levels {
		switch {
		case l.names == nil:
			fmt.Fprintf(&path, "[%d]", l.index)
		case path.Len() > 0:
			path.WriteString("." + l.member)
		default:
			path.WriteString(l.member)
		}
	}
	switch {
	case atName && path.Len() == 0:
		return "a field's name"
	case atName:
		return "a name in " + path.String()
	}
	return path.String()
}

// The idempotency headers of POST /api/events, as Stripe names them (and
// the IETF draft "The Idempotency-Key HTTP Header Field" the request's).
const (
	headerIdempotencyKey     = "Idempotency-Key"
	headerIdempotentReplayed = "Idempotent-Replayed"
)

// idempotencyKey is the request's Idempotency-Key: "" without one; 1 to
// maxIdempotencyKeyLen printable ASCII characters, given once, or the
// request is refused.
func idempotencyKey(h http.Header) (string, error) {
	values := h.Values(headerIdempotencyKey)
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1:
		return "", fmt.Errorf("%w: %s given %d times, want once", errInvalid, headerIdempotencyKey, len(values))
	}
	key := values[0]
	if len(key) < 1 || len(key) > maxIdempotencyKeyLen || strings.ContainsFunc(key, func(r rune) bool { return r < ' ' || r > '~' }) {
		return "", fmt.Errorf("%w: %s must be 1 to %d printable ASCII characters", errInvalid, headerIdempotencyKey, maxIdempotencyKeyLen)
	}
	return key, nil
}

// decodeOptionalJSON is decodeJSON for a body that may be left out, which
// leaves v as it is.
func decodeOptionalJSON(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decodeJSON(r, v)
}

// query reads a request's query parameters, for the API and the panel
// alike, or a panel form's fields (formOf). A reader that meets a bad
// value keeps the first such error in err and returns the parameter's
// default, so a handler reads every parameter it takes and then checks err
// once.
type query struct {
	values url.Values
	err    error
}

func queryOf(r *http.Request) *query { return &query{values: r.URL.Query()} }

// formOf reads the fields of a panel form, a body of at most limit bytes.
func formOf(w http.ResponseWriter, r *http.Request, limit int64) *query {
	r.Body = markedBody{http.MaxBytesReader(w, r.Body, limit)}
	q := &query{}
	if err := r.ParseForm(); err != nil {
		if _, tooBig := errors.AsType[*http.MaxBytesError](err); tooBig {
			q.err = fmt.Errorf("form larger than %d bytes: %w", limit, err)
		} else if errors.Is(err, errBodyRead) {
			q.err = fmt.Errorf("form: %w", err)
		} else {
			q.err = fmt.Errorf("%w: form: %v", errInvalid, err)
		}
	}
	q.values = r.PostForm
	return q
}

// fail keeps err unless an earlier reader failed first.
func (q *query) fail(err error) {
	if q.err == nil {
		q.err = err
	}
}

// text is a parameter as given; absent, or not text (isText), "".
func (q *query) text(name string) string {
	s := q.values.Get(name)
	if !isText(s) {
		q.fail(fmt.Errorf("%w: %s is not UTF-8 text without NUL", errInvalid, name))
		return ""
	}
	return s
}

// natural is an optional non-negative integer: an id to page from or to
// filter by. Absent, 0.
func (q *query) natural(name string) int64 {
	return q.integer(name, 0, 0, math.MaxInt64, name+`: %q is not a non-negative integer`)
}

// limit is ?limit=, a page size: the one rule of every list is 1 to
// most, absent meaning def; 0, a negative number or more than most is
// refused, never read as "the default" or cut to most.
func (q *query) limit(def, most int) int {
	return int(q.integer("limit", int64(def), 1, int64(most), `limit %q must be between 1 and `+strconv.Itoa(most)))
}

// integer is an optional integer parameter: absent, def; present, one from
// lo to hi, or the request is refused with bad, a format given the value.
func (q *query) integer(name string, def, lo, hi int64, bad string) int64 {
	s := q.values.Get(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		q.fail(fmt.Errorf("%w: "+bad, errInvalid, s))
		return def
	}
	return n
}

// jsonObject reads the value of name as a JSON object, for a search by
// containment: "" when absent. It is held to what a request body is held
// to (checkJSONBody): PostgreSQL refuses a lone surrogate escape that
// Go's decoder would take, and keeps the last of a name given twice.
func (q *query) jsonObject(name string) string {
	s := q.text(name)
	if s == "" || q.err != nil {
		return ""
	}
	if !json.Valid([]byte(s)) {
		q.fail(fmt.Errorf(`%w: %s is not one JSON value: %q`, errInvalid, name, s))
		return ""
	}
	if !strings.HasPrefix(strings.TrimSpace(s), "{") {
		q.fail(fmt.Errorf(`%w: %s must be a JSON object, such as {"status": "paid"}; got %q`, errInvalid, name, s))
		return ""
	}
	if err := checkJSONBody([]byte(s), nil); err != nil {
		q.fail(fmt.Errorf("%w: %s: %s", errInvalid, name, strings.TrimPrefix(err.Error(), "request body: ")))
		return ""
	}
	return s
}

// instant is an optional RFC 3339 time; absent, the zero time.
func (q *query) instant(name string) time.Time {
	s := q.values.Get(name)
	if s == "" {
		return time.Time{}
	}
	t, err := parseReplayTime(name, s)
	if err != nil {
		q.fail(err)
	}
	return t
}

// eventFilterFrom reads the stream's filter from the query.
func eventFilterFrom(q *query) EventFilter {
	return EventFilter{Topic: q.text("topic"), Subject: q.text("subject"), State: q.text("state"),
		Outcome: q.text("outcome"), Payload: q.jsonObject("payload"), Since: q.instant("since"), Until: q.instant("until"),
		Before: q.natural("before"), After: q.natural("after"), Limit: q.limit(defaultPageSize, maxEventPage)}
}

// jobFilterFrom reads the job list's filter from the query.
func jobFilterFrom(q *query) JobFilter {
	return JobFilter{State: q.text("state"), Before: q.natural("before"), EventID: q.natural("event_id"),
		EndpointID: q.natural("endpoint_id"), Limit: q.limit(defaultPageSize, maxEventPage)}
}

// idPage is one page of a list read newest first and paged by id, the
// stream or the job list, as the API and the panel both read it.
type idPage[F, T any] struct {
	filter F
	rows   []T
	// before is where the page after this one starts: below the last
	// row's id, or 0 when this page is empty.
	before int64
	// after is where the page just newer than this one starts, for a list
	// that pages both ways (the stream): above the first row's id, or 0
	// when nothing newer matches.
	after int64
}

// readIDPage reads the filter from the query, lists the page it selects
// and finds where the next page starts.
func readIDPage[F, T any](r *http.Request, db *sql.DB, filterFrom func(*query) F,
	list func(context.Context, *sql.DB, F) ([]T, error), id func(T) int64) (idPage[F, T], error) {
	q := queryOf(r)
	pg := idPage[F, T]{filter: filterFrom(q)}
	if q.err != nil {
		return pg, q.err
	}
	rows, err := list(r.Context(), db, pg.filter)
	if err != nil {
		return pg, err
	}
	pg.rows = rows
	if len(rows) > 0 {
		pg.before = id(rows[len(rows)-1])
	}
	return pg, nil
}

// readEventPage reads a page of the stream, older than ?before= or just
// newer than ?after=, with where the pages either side start when the
// filter selects more events that way (before, after; 0 when none).
func readEventPage(r *http.Request, db *sql.DB) (idPage[EventFilter, Event], error) {
	q := queryOf(r)
	pg := idPage[EventFilter, Event]{filter: eventFilterFrom(q)}
	if q.err != nil {
		return pg, q.err
	}
	if err := scopeEventFilter(r, &pg.filter); err != nil {
		return pg, err
	}
	list, err := listEventPage(r.Context(), db, pg.filter)
	if err != nil {
		return pg, err
	}
	pg.rows = list.events
	// An empty page has no edge rows: its neighbours start at its cursor.
	switch {
	case list.older && len(list.events) > 0:
		pg.before = list.events[len(list.events)-1].ID
	case list.older:
		pg.before = pg.filter.After + 1
	}
	switch {
	case list.newer && len(list.events) > 0:
		pg.after = list.events[0].ID
	case list.newer:
		pg.after = pg.filter.Before - 1
	}
	if pg.filter.Owner != 0 {
		return pg, nil // the outcome counts every endpoint's jobs, not the owner's alone
	}
	return pg, addEventOutcomes(r.Context(), db, pg.rows)
}

// readJobPage reads a page of the job list.
func readJobPage(r *http.Request, db *sql.DB) (idPage[JobFilter, JobView], error) {
	return readIDPage(r, db, jobFilterFrom, listJobs, func(j JobView) int64 { return j.ID })
}
