// catalog_test.go: what PostgreSQL's catalog says of schema outbox, as one
// line an object, so that two databases built two ways can be compared and
// every difference named.

package main

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// catalogQueries each list one kind of object of schema outbox as (key,
// description) rows. The key names the object; the description is
// everything a difference in which would change what outboxd or an
// operator sees: a column's type, default, nullability, place among its
// table's columns; a function's whole definition (body, volatility,
// security, settings) and its grants; a table's storage options.
var catalogQueries = []string{
	// Tables, views, sequences and composite types' relations: kind,
	// persistence, storage options (the table's and its TOAST table's),
	// replica identity, row security, owner and grants.
	`SELECT format('relation %s', c.relname),
	        format('kind=%s persistence=%s options=%s toast=%s replident=%s rls=%s/%s owner=%s acl=%s',
	               c.relkind, c.relpersistence, c.reloptions, t.reloptions, c.relreplident,
	               c.relrowsecurity, c.relforcerowsecurity, pg_get_userbyid(c.relowner), c.relacl)
	 FROM pg_class AS c
	 LEFT JOIN pg_class AS t ON t.oid = c.reltoastrelid
	 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')`,

	// Columns of tables, views and composite types. Not their order: a
	// column added by a later release comes last in an upgraded table and
	// where it belongs in a fresh one, so nothing may read a row by
	// position. A composite type's fields keep theirs: a row constructor
	// fills them in order.
	`SELECT format('column %s.%s', c.relname, a.attname),
	        format('field=%s type=%s notnull=%s default=%s generated=%s identity=%s collation=%s storage=%s statistics=%s acl=%s',
	               CASE WHEN c.relkind = 'c' THEN rank() OVER (PARTITION BY c.oid ORDER BY a.attnum) END,
	               format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
	               a.attgenerated, a.attidentity, a.attcollation::regcollation, a.attstorage, a.attstattarget, a.attacl)
	 FROM pg_attribute AS a
	 JOIN pg_class AS c ON c.oid = a.attrelid
	 LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
	 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'c', 'f')
	   AND a.attnum > 0 AND NOT a.attisdropped`,

	// Views' queries.
	`SELECT format('view %s', c.relname), pg_get_viewdef(c.oid)
	 FROM pg_class AS c
	 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('v', 'm')`,

	// Constraints of tables and domains.
	`SELECT format('constraint %s.%s', coalesce(c.relname, ty.typname), k.conname),
	        format('%s deferrable=%s deferred=%s validated=%s', pg_get_constraintdef(k.oid), k.condeferrable, k.condeferred, k.convalidated)
	 FROM pg_constraint AS k
	 LEFT JOIN pg_class AS c ON c.oid = k.conrelid
	 LEFT JOIN pg_type AS ty ON ty.oid = k.contypid
	 WHERE k.connamespace = 'outbox'::regnamespace`,

	// Indexes: definition (with its storage options) and whether it is
	// valid and ready.
	`SELECT format('index %s', c.relname),
	        format('%s valid=%s ready=%s', pg_get_indexdef(c.oid), i.indisvalid, i.indisready)
	 FROM pg_index AS i
	 JOIN pg_class AS c ON c.oid = i.indexrelid
	 WHERE c.relnamespace = 'outbox'::regnamespace`,

	// Functions and procedures: the whole definition, owner and grants.
	`SELECT format('function %s', p.oid::regprocedure),
	        format('%s owner=%s acl=%s', pg_get_functiondef(p.oid), pg_get_userbyid(p.proowner), p.proacl)
	 FROM pg_proc AS p
	 WHERE p.pronamespace = 'outbox'::regnamespace AND p.prokind IN ('f', 'p', 'w')`,

	// Triggers written by hand, with whether they fire.
	`SELECT format('trigger %s.%s', c.relname, g.tgname),
	        format('%s enabled=%s', pg_get_triggerdef(g.oid), g.tgenabled)
	 FROM pg_trigger AS g
	 JOIN pg_class AS c ON c.oid = g.tgrelid
	 WHERE c.relnamespace = 'outbox'::regnamespace AND NOT g.tgisinternal`,

	// Types of their own (enums, domains, composites, ranges) with what
	// makes them up; a table's row type goes with its table.
	`SELECT format('type %s', ty.typname),
	        format('typtype=%s base=%s notnull=%s default=%s labels=%s owner=%s acl=%s',
	               ty.typtype, format_type(ty.typbasetype, ty.typtypmod), ty.typnotnull, ty.typdefault,
	               (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum AS e WHERE e.enumtypid = ty.oid),
	               pg_get_userbyid(ty.typowner), ty.typacl)
	 FROM pg_type AS ty
	 LEFT JOIN pg_class AS c ON c.oid = ty.typrelid
	 WHERE ty.typnamespace = 'outbox'::regnamespace AND ty.typtype IN ('e', 'd', 'c', 'r', 'm')
	   AND (c.relkind IS NULL OR c.relkind = 'c')`,

	// Sequences' parameters and the column that owns each.
	`SELECT format('sequence %s', c.relname),
	        format('type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s owned_by=%s',
	               format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
	               (SELECT format('%s.%s', oc.relname, oa.attname)
	                FROM pg_depend AS d
	                JOIN pg_class AS oc ON oc.oid = d.refobjid
	                JOIN pg_attribute AS oa ON oa.attrelid = d.refobjid AND oa.attnum = d.refobjsubid
	                WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')))
	 FROM pg_sequence AS s
	 JOIN pg_class AS c ON c.oid = s.seqrelid
	 WHERE c.relnamespace = 'outbox'::regnamespace`,

	// Rules other than views' own, and row security policies.
	`SELECT format('rule %s.%s', r.tablename, r.rulename), r.definition
	 FROM pg_rules AS r WHERE r.schemaname = 'outbox'`,
	`SELECT format('policy %s.%s', p.tablename, p.policyname),
	        format('%s %s roles=%s using=%s check=%s', p.permissive, p.cmd, p.roles, p.qual, p.with_check)
	 FROM pg_policies AS p WHERE p.schemaname = 'outbox'`,

	// The schema itself: owner, grants, comment; and the comments on
	// what is in it.
	`SELECT 'schema outbox',
	        format('owner=%s acl=%s comment=%s', pg_get_userbyid(n.nspowner), n.nspacl, obj_description(n.oid, 'pg_namespace'))
	 FROM pg_namespace AS n WHERE n.nspname = 'outbox'`,
	`SELECT format('comment %s %s', d.classoid::regclass, pg_describe_object(d.classoid, d.objoid, d.objsubid)), d.description
	 FROM pg_description AS d
	 WHERE d.classoid <> 'pg_namespace'::regclass
	   AND (pg_identify_object(d.classoid, d.objoid, d.objsubid)).schema = 'outbox'`,

	// Default privileges set for what is created in the schema later.
	`SELECT format('default privileges %s %s', pg_get_userbyid(a.defaclrole), a.defaclobjtype), a.defaclacl::text
	 FROM pg_default_acl AS a WHERE a.defaclnamespace = 'outbox'::regnamespace`,
}

// schemaCatalog is what the catalog of db says of schema outbox: one
// description a named object.
func schemaCatalog(t testing.TB, db *sql.DB) map[string]string {
	t.Helper()
	catalog := map[string]string{}
	for _, q := range catalogQueries {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatalf("read the catalog: %v\n%s", err, q)
		}
		for rows.Next() {
			var key string
			var desc sql.NullString
			if err := rows.Scan(&key, &desc); err != nil {
				t.Fatal(err)
			}
			if _, dup := catalog[key]; dup {
				t.Fatalf("the catalog names %q twice", key)
			}
			catalog[key] = desc.String
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return catalog
}

// keptForThePreviousRelease are the objects the last migration keeps for
// the replicas of the release before while they roll, which a fresh
// install, with no such replica, does not have: catalog keys (and the
// functions of previousReleaseWrappers).
var keptForThePreviousRelease = []string{}

// migratedFromTheFirstFile is an empty database brought to m's release by
// every one of m's migrations, in order, as run applies each to a
// database that lacks it.
func migratedFromTheFirstFile(t *testing.T, m migration) *sql.DB {
	t.Helper()
	return migratedThrough(t, m, len(m.files))
}

// migratedThrough is an empty database given m's first n migrations, in
// order: a database of the release of the n-th.
func migratedThrough(t *testing.T, m migration, n int) *sql.DB {
	t.Helper()
	m.files = m.files[:n]
	db, _ := newEmptyTestDB(t)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, f := range m.files {
		if err := m.applyStep(ctx, conn, migrationStep{file: f}); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// installedFresh is an empty database given m's schema.sql.
func installedFresh(t *testing.T, m migration) *sql.DB {
	t.Helper()
	db, _ := newEmptyTestDB(t)
	if err := m.run(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// catalogDrift is what differs between a fresh install and a database
// migrated from the first file, beyond keptForThePreviousRelease: the
// keys of the objects, and the diff.
func catalogDrift(t *testing.T, fresh, migrated *sql.DB) ([]string, string) {
	t.Helper()
	want, got := schemaCatalog(t, fresh), schemaCatalog(t, migrated)
	kept := slices.Clone(keptForThePreviousRelease)
	for _, f := range previousReleaseWrappers {
		kept = append(kept, "function outbox."+strings.TrimPrefix(f, "outbox."))
	}
	for _, key := range kept {
		if _, ok := got[key]; !ok {
			t.Errorf("the migrated database lacks %s, which the last migration keeps for the release before", key)
		}
		delete(got, key)
	}
	var keys []string
	for key := range want {
		if got[key] != want[key] {
			keys = append(keys, key)
		}
	}
	for key := range got {
		if _, ok := want[key]; !ok {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	return keys, cmp.Diff(want, got)
}

// schema.sql and the migrations are one schema: a fresh install and a
// database migrated from the first release have the same catalog, and
// record the same migrations. A change made in one form alone fails here,
// naming what differs; so do the two drifts below.
func TestSchemaIsTheSumOfTheMigrations(t *testing.T) {
	t.Parallel()
	m := newMigration(nil)
	fresh, migrated := installedFresh(t, m), migratedFromTheFirstFile(t, m)
	if keys, diff := catalogDrift(t, fresh, migrated); len(keys) > 0 {
		t.Errorf("schema.sql and migrations/ differ in %s (-schema.sql +migrations):\n%s", strings.Join(keys, ", "), diff)
	}
	const recorded = `SELECT version, name, checksum, finished_at IS NOT NULL FROM outbox.migrations ORDER BY version`
	if diff := cmp.Diff(queryRows(t, fresh, recorded), queryRows(t, migrated, recorded)); diff != "" {
		t.Errorf("outbox.migrations after a fresh install and after every migration (-fresh +migrated):\n%s", diff)
	}
	if n := len(queryRows(t, fresh, recorded)); n != len(m.files) {
		t.Errorf("a fresh install records %d migrations, want all %d", n, len(m.files))
	}
}

// The comparison sees the two drifts a schema change made in one form
// alone brings: a column added to schema.sql only, a function's body
// changed in a migration only.
func TestSchemaComparisonNamesADrift(t *testing.T) {
	t.Parallel()
	m := newMigration(nil)
	fresh, migrated := installedFresh(t, m), migratedFromTheFirstFile(t, m)

	withColumn := m
	withColumn.schema = strings.Replace(m.schema, "CREATE TABLE outbox.owners (", "CREATE TABLE outbox.owners (\n  drift text,", 1)
	if withColumn.schema == m.schema {
		t.Fatal("schema.sql has no CREATE TABLE outbox.owners ( to add a column to")
	}
	keys, _ := catalogDrift(t, installedFresh(t, withColumn), migrated)
	if !slices.Equal(keys, []string{"column owners.drift"}) {
		t.Errorf("a column in schema.sql alone: the comparison names %v, want column owners.drift alone", keys)
	}

	var def string
	if err := fresh.QueryRow(`SELECT pg_get_functiondef('outbox.owners_default_key()'::regprocedure)`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(def, "BEGIN", "BEGIN\n  -- a body changed in a migration alone", 1)
	if changed == def {
		t.Fatalf("no BEGIN in owners_default_key's body to change:\n%s", def)
	}
	keys, _ = catalogDrift(t, fresh, migratedFromTheFirstFile(t, m.withNext(changed)))
	if !slices.Equal(keys, []string{"function outbox.owners_default_key()"}) {
		t.Errorf("a function body changed in a migration alone: the comparison names %v, want function outbox.owners_default_key() alone", keys)
	}
}
