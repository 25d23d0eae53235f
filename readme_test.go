// readme_test.go: the README cites tests as proof of what it states; each
// one it names must exist.

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestREADMENamesOnlyTestsThatExist(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	funcs := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w+)\(`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range funcs.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
	}
	var missing []string
	for _, m := range regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z]\\w*)").FindAllSubmatch(readme, -1) {
		if name := string(m[1]); !defined[name] && !slices.Contains(missing, name) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("README.md cites tests that do not exist: %v", missing)
	}
}

// The README's build-and-run commands work as written: the build, -h,
// version, and migrate against a fresh database.
func TestREADMECommandsRun(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, dsn := newTestDB(t)
	bin := filepath.Join(t.TempDir(), "outboxd")
	for _, c := range []struct {
		shown string   // as the README writes it
		run   []string // as the test runs it
		want  string   // in its output
	}{
		{"go build -o outboxd .", []string{"go", "build", "-o", bin, "."}, ""},
		{"./outboxd -h", []string{bin, "-h"}, "Commands:"},
		{"./outboxd version", []string{bin, "version"}, "outboxd 0.1.0"},
		{"./outboxd migrate -database-url postgres://...", []string{bin, "migrate", "-database-url", dsn}, "schema applied"},
	} {
		if !strings.Contains(string(readme), c.shown) {
			t.Errorf("README.md no longer shows %q", c.shown)
		}
		out, err := exec.Command(c.run[0], c.run[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: %v, output:\n%s\nwant %q in it", c.shown, err, out, c.want)
		}
	}
}
