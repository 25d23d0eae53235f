// deploy_test.go: the deployment files are checked where no Docker engine
// or systemd runs: the Dockerfile's shape, and the unit's sandboxing.

package main

import (
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The Dockerfile builds in one stage and ships a static binary alone, as a
// user that is not root, from bases pinned to a version.
func TestDockerfileBuildsAStaticNonRootImage(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var froms, users []string
	var lines []string
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lines = append(lines, line)
		switch {
		case strings.HasPrefix(line, "FROM "):
			froms = append(froms, line)
			users = nil // USER applies to its own stage
		case strings.HasPrefix(line, "USER "):
			users = append(users, strings.TrimPrefix(line, "USER "))
		}
	}
	if len(froms) < 2 {
		t.Errorf("%d FROM lines, want a build stage and a runtime stage", len(froms))
	}
	pinned := regexp.MustCompile(`^FROM \S+(:[\w.-]+|@sha256:[0-9a-f]{64})( AS \w+)?$`)
	for _, f := range froms {
		if !pinned.MatchString(f) || strings.Contains(f, ":latest") {
			t.Errorf("%q: a base must be pinned to a version (not latest)", f)
		}
	}
	body := strings.Join(lines, "\n")
	if !strings.Contains(body, "CGO_ENABLED=0 go build") {
		t.Error("the binary is not built with CGO_ENABLED=0: it would need a libc the runtime image lacks")
	}
	if !strings.Contains(body, "COPY --from=build ") {
		t.Error("the runtime stage does not copy the binary from the build stage")
	}
	if len(users) != 1 || users[0] == "root" || strings.HasPrefix(users[0], "0") {
		t.Errorf("the runtime stage's USER lines %q, want one non-root user", users)
	}
	if !regexp.MustCompile(`(?m)^ENTRYPOINT \["[^"]+"\]$`).MatchString(body) {
		t.Error("ENTRYPOINT must be the exec form, so SIGTERM reaches outboxd, not a shell")
	}
}

// The unit restarts outboxd on failure, reads its settings from a file,
// gives it time to finish deliveries on stop, and sandboxes it.
func TestSystemdUnitSandboxesTheService(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("deploy/outboxd.service")
	if err != nil {
		t.Fatal(err)
	}
	directives := map[string][]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(line, "#") {
			directives[k] = append(directives[k], v)
		}
	}
	for key, want := range map[string]string{
		"Type":            "notify",
		"Restart":         "on-failure",
		"DynamicUser":     "yes",
		"NoNewPrivileges": "yes",
		"ProtectSystem":   "strict",
		"ProtectHome":     "yes",
		"PrivateTmp":      "yes",
		"EnvironmentFile": "/etc/outboxd/outboxd.env",
		"TimeoutStopSec":  "45s", // more than -shutdown-grace's 30 s
	} {
		if got := directives[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s=%q, want %q", key, got, want)
		}
	}
}

// The example settings file parses as outboxd reads it, and is refused as
// it stands: its admin token is a placeholder. With a generated token it
// starts, served for a proxy on the host with the public URL set.
func TestEnvExampleRefusesItsPlaceholderToken(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("deploy/outboxd.env.example")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			env[k] = v
		}
	}
	_, err = parseConfig(nil, envFrom(env), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-admin-token (OUTBOXD_ADMIN_TOKEN) is a placeholder") {
		t.Errorf("the example as it stands: %v, want its placeholder token refused", err)
	}
	env["OUTBOXD_ADMIN_TOKEN"] = randomToken()
	cfg, err := parseConfig(nil, envFrom(env), io.Discard)
	if err != nil {
		t.Fatalf("the example with a generated token: %v", err)
	}
	if u, _ := parsePublicURL(cfg.PublicURL); u == nil || u.Scheme != "https" || len(cfg.TrustedProxies) == 0 {
		t.Errorf("the example sets public URL %q and trusted proxies %q; want an https URL and the proxy", cfg.PublicURL, cfg.TrustedProxies.String())
	}
}
