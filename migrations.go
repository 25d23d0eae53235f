// migrations.go: the schema's two forms and what a database has of them.
// schema.sql is the schema of a fresh install, read whole; migrations/
// holds one numbered file a release, each the change from the release
// before. A database records the files it has in outbox.migrations;
// TestSchemaIsTheSumOfTheMigrations holds the two forms to one catalog.

package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/lib/pq"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// migrationFile is one numbered file of migrations/: the change that
// brings a database of the release before to release (the first file: the
// whole of the first release).
type migrationFile struct {
	version  int    // its number, from 1, without gaps
	name     string // its file name, as outbox.migrations records it
	release  string
	text     string
	checksum string // SHA-256 of text, hex
}

// migrationFileName is the form of a file's name: number, release.
var migrationFileName = regexp.MustCompile(`^(\d{3})_(\d+\.\d+\.\d+)\.sql$`)

// readMigrationFiles reads the numbered files of fsys's migrations
// folder, in order, refusing a name of another form or a gap in the
// numbers.
func readMigrationFiles(fsys fs.FS) ([]migrationFile, error) {
	entries, err := fs.ReadDir(fsys, "migrations")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	var files []migrationFile
	for _, e := range entries { // sorted by name, so by number
		m := migrationFileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migrations/%s: not NNN_release.sql", e.Name())
		}
		version, _ := strconv.Atoi(m[1])
		if version != len(files)+1 {
			return nil, fmt.Errorf("migrations/%s: numbered %d after %d files", e.Name(), version, len(files))
		}
		text, err := fs.ReadFile(fsys, path.Join("migrations", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("migrations: %w", err)
		}
		sum := sha256.Sum256(text)
		files = append(files, migrationFile{
			version: version, name: e.Name(), release: m[2],
			text: string(text), checksum: hex.EncodeToString(sum[:]),
		})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("migrations: no file")
	}
	return files, nil
}

// embeddedMigrations is this binary's migrations/.
func embeddedMigrations() []migrationFile {
	files, err := readMigrationFiles(migrationsFS)
	if err != nil {
		panic(err) // the files are compiled in; TestMigrationFilesAreNumbered reads them
	}
	return files
}

// statements cuts f into what runs in its transaction and what runs
// after it, one statement at a time: the online statements.
func (f migrationFile) statements() (inTx []sqlStatement, online []onlineStatement, err error) {
	for _, s := range splitSQL(f.text) {
		o, ok, err := parseOnlineStatement(s, "migrations/"+f.name)
		switch {
		case err != nil:
			return nil, nil, err
		case ok:
			online = append(online, o)
		default:
			inTx = append(inTx, s)
		}
	}
	return inTx, online, nil
}

// onlineStatement is a statement a migration runs outside its
// transaction, because in it it would hold a lock that stops producers
// for as long as it reads a table: an index built or dropped
// CONCURRENTLY, or a constraint added NOT VALID being validated.
type onlineStatement struct {
	kind  onlineKind
	name  string // the index, or the constraint
	table string // the constraint's table
	text  string
	label string // file, line and start, for logs and errors
}

type onlineKind int

const (
	buildIndex onlineKind = iota
	dropIndex
	validateConstraint
)

// The forms an online statement may take: each says what it makes, so
// that it is skipped when the catalog says it is made (a migration that
// stopped half way is finished at the next start).
var (
	createIndexConcurrently = regexp.MustCompile(`^CREATE (?:UNIQUE )?INDEX CONCURRENTLY IF NOT EXISTS ([a-z_][a-z0-9_]*)\s+ON outbox\.[a-z_]+\s`)
	dropIndexConcurrently   = regexp.MustCompile(`^DROP INDEX CONCURRENTLY IF EXISTS outbox\.([a-z_][a-z0-9_]*)$`)
	validateConstraintStmt  = regexp.MustCompile(`^ALTER TABLE outbox\.([a-z_]+) VALIDATE CONSTRAINT ([a-z_][a-z0-9_]*)$`)
	mentionsConcurrently    = regexp.MustCompile(`(?i)^\s*(CREATE|DROP|REINDEX)\b[^;]*\bCONCURRENTLY\b`)
)

// parseOnlineStatement says whether s is an online statement, refusing
// a CONCURRENTLY statement of another form: it would fail in the
// transaction, or run outside it without a way to tell it done.
func parseOnlineStatement(s sqlStatement, file string) (onlineStatement, bool, error) {
	o := onlineStatement{text: s.text, label: s.label(file)}
	if m := createIndexConcurrently.FindStringSubmatch(s.text); m != nil {
		o.kind, o.name = buildIndex, m[1]
	} else if m := dropIndexConcurrently.FindStringSubmatch(s.text); m != nil {
		o.kind, o.name = dropIndex, m[1]
	} else if m := validateConstraintStmt.FindStringSubmatch(s.text); m != nil {
		o.kind, o.table, o.name = validateConstraint, m[1], m[2]
	} else if mentionsConcurrently.MatchString(s.text) {
		return o, false, fmt.Errorf("%s: a CONCURRENTLY statement must read CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name ON outbox.table, "+
			"or DROP INDEX CONCURRENTLY IF EXISTS outbox.name", o.label)
	} else {
		return o, false, nil
	}
	return o, true, nil
}

// legacyChecksums are what releases before numbered migrations recorded
// in outbox.schema_applied: the checksum of their schema files, by the
// migration that brings a database to that release. The first of a
// version is its release's own. 0.1.0's also covers two SQL functions its
// Go code held: it is what both its builds record, not the checksum of
// its files alone.
var legacyChecksums = []struct {
	checksum string
	version  int
}{
	{"de3ebbbc0a5fecf3ab386213370e628febe1b51b7323eb47cd0afb77c8b8c141", 1}, // 0.1.0
	{"5ed975c4a51e03735e0097fd9436c19e5b2dd37a26afc21e0a5ea1248906094b", 2}, // 0.2.0
	{"6e9c2e175957d1587271ecdd9c8fb8ebe450817aa2f69c36598fb4ab3d3599e1", 3}, // 0.3.0
	{"9429820bbc8762022040b6ec993748040e8beff6b2ec2e65fe884b3a245ecbbe", 4}, // 0.4.0
	{"2f7512c244aed162767a76b6696fcfcb30b17b0b6b1248bb3343db69ecb090f2", 5}, // 0.5.0
	// A build of 0.6.0 made before its migration was numbered: it has
	// 0.6.0's schema, and 006_0.6.0.sql runs again over it.
	{"3f0cff670cb20bbf927b1adea4d45df36a77fdd10e88d60069ff5bca9a8f3889", 5},
}

// legacyChecksum is the checksum release version recorded, "" if none.
func legacyChecksum(version int) string {
	for _, l := range legacyChecksums {
		if l.version == version {
			return l.checksum
		}
	}
	return ""
}

// schemaState is what a database has of the migrations.
type schemaState struct {
	fresh    bool                      // schema outbox has no table: schema.sql makes it
	recorded map[int]recordedMigration // outbox.migrations, when it exists
	legacy   bool                      // no outbox.migrations: a release before them
	has      int                       // with legacy: the last migration it has (0: none known)
}

// recordedMigration is a row of outbox.migrations.
type recordedMigration struct {
	name, checksum string
	finished       bool // its online statements ran
}

// readSchemaState reads what db has: outbox.migrations, or else the
// checksums outbox.schema_applied kept, or else nothing.
func readSchemaState(ctx context.Context, q querier) (schemaState, error) {
	var hasMigrations, hasLegacy, hasTables bool
	err := q.QueryRowContext(ctx, `
SELECT to_regclass('outbox.migrations') IS NOT NULL,
       to_regclass('outbox.schema_applied') IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = to_regnamespace('outbox') AND relkind IN ('r', 'p'))`).
		Scan(&hasMigrations, &hasLegacy, &hasTables)
	if err != nil {
		return schemaState{}, fmt.Errorf("migrate: read the schema's state: %w", err)
	}
	switch {
	case hasMigrations:
		return readRecordedMigrations(ctx, q)
	case hasLegacy:
		return readLegacyChecksums(ctx, q)
	case hasTables:
		return schemaState{}, fmt.Errorf("migrate: schema outbox has tables but no record of a migration (outbox.migrations): it was not made by outboxd")
	}
	return schemaState{fresh: true}, nil
}

func readRecordedMigrations(ctx context.Context, q querier) (schemaState, error) {
	s := schemaState{recorded: map[int]recordedMigration{}}
	rows, err := q.QueryContext(ctx, `SELECT version, name, checksum, finished_at IS NOT NULL FROM outbox.migrations`)
	if err != nil {
		return s, fmt.Errorf("migrate: read outbox.migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		var r recordedMigration
		if err := rows.Scan(&v, &r.name, &r.checksum, &r.finished); err != nil {
			return s, fmt.Errorf("migrate: read outbox.migrations: %w", err)
		}
		s.recorded[v] = r
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("migrate: read outbox.migrations: %w", err)
	}
	return s, nil
}

// readLegacyChecksums places a database of a release before numbered
// migrations: the newest release whose checksum it recorded. A database
// that recorded none known (made by a build between two releases, before
// releases were tied to their schema) gets every file from the first.
func readLegacyChecksums(ctx context.Context, q querier) (schemaState, error) {
	s := schemaState{legacy: true}
	sums, err := queryAll(ctx, q, scanString, `SELECT checksum FROM outbox.schema_applied`)
	if err != nil {
		return s, fmt.Errorf("migrate: read outbox.schema_applied: %w", err)
	}
	for _, l := range legacyChecksums {
		if slices.Contains(sums, l.checksum) {
			s.has = max(s.has, l.version)
		}
	}
	return s, nil
}

// migrationStep is one file a database lacks, or whose online statements
// it has yet to run.
type migrationStep struct {
	file       migrationFile
	onlineOnly bool // its transaction committed; its online statements did not all run
}

// plan is what files brings s to: the steps in order, or an error naming
// a recorded migration this binary does not have or has otherwise.
func (s schemaState) plan(files []migrationFile) ([]migrationStep, error) {
	if s.fresh {
		return nil, nil
	}
	if s.legacy {
		var steps []migrationStep
		for _, f := range files[s.has:] {
			steps = append(steps, migrationStep{file: f})
		}
		return steps, nil
	}
	last := files[len(files)-1]
	var steps []migrationStep
	for v, r := range s.recorded {
		if v > len(files) {
			return nil, fmt.Errorf("migrate: the database has migration %s, newer than this binary's release %s: run a release at least as new", r.name, last.release)
		}
	}
	for _, f := range files {
		r, ok := s.recorded[f.version]
		switch {
		case !ok:
			steps = append(steps, migrationStep{file: f})
		case r.checksum != f.checksum:
			return nil, fmt.Errorf("migrate: migrations/%s was applied here with checksum %s, and this binary's differs (%s): a released migration never changes; "+
				"a database made by a development build of an unreleased one is made again", f.name, r.checksum, f.checksum)
		case !r.finished:
			steps = append(steps, migrationStep{file: f, onlineOnly: true})
		}
	}
	return steps, nil
}

// describeSteps names what steps lack, for errors and logs.
func describeSteps(steps []migrationStep) string {
	names := make([]string, len(steps))
	for i, st := range steps {
		names[i] = st.file.name
		if st.onlineOnly {
			names[i] += " (its online statements)"
		}
	}
	return strings.Join(names, ", ")
}

// querier is what reads the state: a pool, a pinned connection or a
// transaction.
type querier interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// recordSQL is the statement that records files as applied, the last of
// them finished (its online statements ran) or not, those before it
// finished: in outbox.migrations or, in a database of a release before
// that table, by the checksum that release kept in outbox.schema_applied,
// once finished. The files' own transaction runs it, and what
// `outboxd migrate -print-sql` prints holds it, so that a migration
// applied by other tools is one outboxd knows.
func recordSQL(files []migrationFile, finished bool) string {
	last := files[len(files)-1]
	rows := make([]string, len(files))
	for i, f := range files {
		done := "now()"
		if f.version == last.version && !finished {
			done = "NULL"
		}
		rows[i] = fmt.Sprintf("(%d, %s, %s, %s)", f.version, pq.QuoteLiteral(f.name), pq.QuoteLiteral(f.checksum), done)
	}
	legacy := "NULL"
	if sum := legacyChecksum(last.version); sum != "" && finished {
		legacy = pq.QuoteLiteral(sum)
	}
	return fmt.Sprintf(`DO $record$
BEGIN
  IF to_regclass('outbox.migrations') IS NOT NULL THEN
    INSERT INTO outbox.migrations AS m (version, name, checksum, finished_at)
    VALUES %s
    ON CONFLICT (version) DO UPDATE SET finished_at = coalesce(m.finished_at, EXCLUDED.finished_at);
  ELSIF %s IS NOT NULL THEN
    INSERT INTO outbox.schema_applied (checksum) VALUES (%[2]s) ON CONFLICT DO NOTHING;
  END IF;
END
$record$`, strings.Join(rows, ",\n           "), legacy)
}

// migrationsAfter is the steps that bring a database of release to the
// last of files.
func migrationsAfter(files []migrationFile, release string) ([]migrationStep, error) {
	for _, f := range files {
		if f.release == release {
			return schemaState{legacy: true, has: f.version}.plan(files)
		}
	}
	known := make([]string, len(files))
	for i, f := range files {
		known[i] = f.release
	}
	return nil, fmt.Errorf("no release %q: this binary's are %s, or none for an empty database", release, strings.Join(known, ", "))
}

// sqlStatement is one statement of a schema file, without its semicolon,
// and the line it starts on.
type sqlStatement struct {
	line int
	text string
}

// label names s in errors and logs: file and line, and its start.
func (s sqlStatement) label(file string) string {
	return fmt.Sprintf("%s:%d %s", file, s.line, truncate(strings.Join(strings.Fields(s.text), " "), 80))
}

// dollarQuoteTag matches the opening of a dollar-quoted string, $$ or $tag$.
var dollarQuoteTag = regexp.MustCompile(`^\$[A-Za-z_][A-Za-z_0-9]*\$|^\$\$`)

// splitSQL cuts a schema file into its statements at the semicolons that
// end them: not those in comments, quoted strings and identifiers, or
// dollar-quoted bodies. Comments between statements are dropped. It reads
// what outboxd's own files hold, not every SQL PostgreSQL accepts (no
// E'...' escapes); TestSplitSQL says what it handles.
func splitSQL(src string) []sqlStatement {
	var stmts []sqlStatement
	start := -1 // where the current statement began; -1 between statements
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case strings.HasPrefix(src[i:], "--"):
			i = skipPast(src, i, "\n", 0)
		case strings.HasPrefix(src[i:], "/*"):
			i = skipPast(src, i+2, "*/", len("*/"))
		case c == ';':
			if start >= 0 {
				stmts = append(stmts, sqlStatement{
					line: strings.Count(src[:start], "\n") + 1,
					text: strings.TrimSpace(src[start:i]),
				})
			}
			start = -1
			i++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		default:
			if start < 0 {
				start = i
			}
			i = skipToken(src, i)
		}
	}
	if start >= 0 {
		stmts = append(stmts, sqlStatement{
			line: strings.Count(src[:start], "\n") + 1,
			text: strings.TrimSpace(src[start:]),
		})
	}
	return stmts
}

// skipPast is the index in src past the first end at or after i (keep of
// its bytes kept before it), or len(src) if there is none.
func skipPast(src string, i int, end string, keep int) int {
	j := strings.Index(src[i:], end)
	if j < 0 {
		return len(src)
	}
	return i + j + keep
}

// skipToken is the index past the token of a statement that starts at
// i: a quoted string or identifier (a doubled quote is one quote
// character inside), a dollar-quoted body, or one byte.
func skipToken(src string, i int) int {
	c := src[i]
	if c == '\'' || c == '"' {
		j := i + 1
		for j < len(src) {
			if src[j] == c {
				if j+1 < len(src) && src[j+1] == c {
					j += 2
					continue
				}
				break
			}
			j++
		}
		return j + 1
	}
	if c == '$' {
		if tag := dollarQuoteTag.FindString(src[i:min(i+64, len(src))]); tag != "" {
			return skipPast(src, i+len(tag), tag, len(tag))
		}
	}
	return i + 1
}
