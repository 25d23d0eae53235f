// version_test.go: a release names one schema.

package main

import "testing"

// releaseSchemas is the checksum of the schema files (schemaChecksum) each
// release shipped with. A change to schema.sql fails
// TestReleaseChangesWithTheSchema until version is raised and the new
// release recorded here.
var releaseSchemas = map[string]string{
	"0.2.0": "5ed975c4a51e03735e0097fd9436c19e5b2dd37a26afc21e0a5ea1248906094b",
	"0.3.0": "6e9c2e175957d1587271ecdd9c8fb8ebe450817aa2f69c36598fb4ab3d3599e1",
	"0.4.0": "9429820bbc8762022040b6ec993748040e8beff6b2ec2e65fe884b3a245ecbbe",
	"0.5.0": "2f7512c244aed162767a76b6696fcfcb30b17b0b6b1248bb3343db69ecb090f2",
	"0.6.0": "3f0cff670cb20bbf927b1adea4d45df36a77fdd10e88d60069ff5bca9a8f3889",
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
