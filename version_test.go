// version_test.go: a release names one schema.

package main

import "testing"

// releaseSchemas is the checksum of the schema files (schemaChecksum) each
// release shipped with. A change to schema.sql or schema_indexes.sql fails
// TestReleaseChangesWithTheSchema until version is raised and the new
// release recorded here.
var releaseSchemas = map[string]string{
	"0.2.0": "213badafdbcca2eba9c31a3b97efeb221f73378ee857d206cb901bfa001ab5ba",
}

// Two builds whose schemas differ report different releases: the replica
// registry and receivers (the User-Agent) tell them apart by it.
func TestReleaseChangesWithTheSchema(t *testing.T) {
	got := schemaChecksum()
	want, ok := releaseSchemas[version]
	if !ok {
		t.Fatalf("release %s is not in releaseSchemas: record it with its schema checksum %s", version, got)
	}
	if got != want {
		t.Errorf("the schema files changed under release %s (checksum %s, recorded %s): raise version in version.go and record the new release in releaseSchemas",
			version, got, want)
	}
	seen := map[string]string{}
	for release, sum := range releaseSchemas {
		if other, dup := seen[sum]; dup {
			t.Errorf("releases %s and %s record the same schema: a release is raised only for a new schema", release, other)
		}
		seen[sum] = release
	}
}
