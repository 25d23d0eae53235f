// jobstate_test.go: a job's state changes in named SQL functions only.

package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// setsJobState finds a statement that updates outbox.jobs and sets its
// state: UPDATE outbox.jobs, up to the statement's end, with "state ="
// in its SET list.
var setsJobState = regexp.MustCompile(`(?is)UPDATE\s+outbox\.jobs\b[^;]*?\bSET\b[^;]*?\bstate\s*=`)

// No statement of the Go code writes a job's state, and in schema.sql only
// the functions named here do: the claim, the outcomes, the rescue, a run
// again by hand or by a replay, a discard without a request, and an
// erasure. (The fan-out inserts jobs, waiting.)
func TestJobStateChangesInNamedFunctionsOnly(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := setsJobState.Find(src); m != nil {
			t.Errorf("%s writes a job's state in a statement of its own: %.80q", f, m)
		}
	}
	schema := readDoc(t, "schema.sql")
	var writers []string
	for _, fn := range regexp.MustCompile(`(?s)CREATE FUNCTION outbox\.(\w+)\(.*?\$\$(.*?)\$\$;`).FindAllStringSubmatch(schema, -1) {
		if setsJobState.MatchString(fn[2]) {
			writers = append(writers, fn[1])
		}
	}
	slices.Sort(writers)
	want := []string{"claim_lane_jobs", "discard_jobs", "erase_subject", "finish_jobs", "rescue_jobs", "run_again"}
	if diff := cmp.Diff(want, writers); diff != "" {
		t.Errorf("schema.sql's functions that write a job's state (-want +got):\n%s", diff)
	}
}
