// version.go: what this build is: the release it reports to receivers, and
// what the toolchain recorded of its source, for `outboxd version`, the
// start-up log and the panel.

package main

import (
	"fmt"
	"runtime/debug"
)

// version is the release, reported in the User-Agent of outgoing webhooks
// and recorded by each replica: the release of the last file of
// migrations/ (TestReleaseIsItsLastMigration). A schema change is a new
// migration, and a new release, so two builds with different schemas
// never report the same release.
const version = "0.8.0"

// buildInfo is what go build recorded in the binary.
type buildInfo struct {
	Release   string // version
	Module    string // the main module's version: "(devel)" for a build from a checkout
	Revision  string // the VCS revision, "" when built outside one
	Time      string // the revision's commit time (RFC 3339)
	Modified  bool   // the working tree had changes
	GoVersion string
}

// readBuildInfo reads what the binary carries; a binary built without
// module support reports its release and nothing more.
func readBuildInfo() buildInfo {
	b := buildInfo{Release: version}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.Module, b.GoVersion = info.Main.Version, info.GoVersion
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the one line `outboxd version` prints.
func (b buildInfo) String() string {
	s := "outboxd " + b.Release
	if b.Module != "" {
		s += " (module " + b.Module
		if b.Revision != "" {
			s += fmt.Sprintf(", revision %s of %s", b.Revision, b.Time)
			if b.Modified {
				s += ", modified"
			}
		}
		s += ", " + b.GoVersion + ")"
	}
	return s
}
