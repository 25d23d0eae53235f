// readme_test.go: the README cites tests as proof of what it states; each
// one it names must exist.

package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
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
