// version_test.go: a release names one schema, its last migration's.

package main

import (
	"fmt"
	"testing"
	"testing/fstest"
)

// releaseMigrations is the checksum of each migration file as its release
// shipped it. A shipped migration never changes: a database that applied
// it records its checksum, and a binary whose file differs refuses to
// start on it (schemaState.plan). A schema change is a new file, and a
// new release.
var releaseMigrations = map[string]string{
	"001_0.1.0.sql": "89b809db261e2dd3e96c76ea9f01b89623e1a91486bbf29756e467faae6a4c48",
	"002_0.2.0.sql": "70a08d87b488da1208ad98de2ae1554b5c49568690c634215a1bdd2b46a61fef",
	"003_0.3.0.sql": "03b1aca60c7224a75fbe41b4f0cc53033890cb34fa974a1d32982e6e7342d0c7",
	"004_0.4.0.sql": "1b9bb35af49ac7ecddcc2da5af0cf1b39a784bc840865142c207c68014457c61",
	"005_0.5.0.sql": "1a73f270402cee233884a516dbbe1786c894239f716bded172be4fb43b465ec4",
	"006_0.6.0.sql": "ed357c348c7624cc1e0f6ce5f792c5f5a67e0e0d2138fc8c2c4713c68300d794",
	"007_0.7.0.sql": "1af9dba82d6eeb944ad77b8cdb89780f07e3d5a719a28de36ee70667b683a39c",
	"008_0.8.0.sql": "da77b719078a00a1b1ea63595ec016283a54e35b15a6c4d29bbaafffb80b0e42",
}

// The release is the last migration's, and every migration is as its
// release shipped it: the replica registry and receivers (the User-Agent)
// tell two schemas apart by the release.
func TestReleaseIsItsLastMigration(t *testing.T) {
	files := embeddedMigrations()
	if last := files[len(files)-1]; last.release != version {
		t.Errorf("version is %s, and the last migration is %s: a new migration is a new release", version, last.name)
	}
	for _, f := range files {
		want, ok := releaseMigrations[f.name]
		switch {
		case !ok:
			t.Errorf("migrations/%s is not in releaseMigrations: record it with its checksum %s", f.name, f.checksum)
		case f.checksum != want:
			t.Errorf("migrations/%s changed (checksum %s, shipped %s): a shipped migration never changes; the change goes in a new one", f.name, f.checksum, want)
		}
	}
	if len(releaseMigrations) != len(files) {
		t.Errorf("releaseMigrations records %d files, migrations/ holds %d", len(releaseMigrations), len(files))
	}
}

// The numbered files are read in order, and a name of another form or a
// gap in the numbers is refused.
func TestMigrationFilesAreNumbered(t *testing.T) {
	files := embeddedMigrations()
	for i, f := range files {
		if want := fmt.Sprintf("%03d_%s.sql", i+1, f.release); f.version != i+1 || f.name != want {
			t.Errorf("file %d: version %d, name %s; want %d, %s", i, f.version, f.name, i+1, want)
		}
	}
	for _, bad := range []map[string]string{
		{"001_0.1.0.sql": "", "003_0.3.0.sql": ""}, // a gap
		{"001_0.1.0.sql": "", "2_0.2.0.sql": ""},   // not three digits
		{"001_0.1.0.sql": "", "002-0.2.0.sql": ""}, // not NNN_release
	} {
		fsys := fstest.MapFS{}
		for name, text := range bad {
			fsys["migrations/"+name] = &fstest.MapFile{Data: []byte(text)}
		}
		if _, err := readMigrationFiles(fsys); err == nil {
			t.Errorf("%v: read without an error", bad)
		}
	}
}
