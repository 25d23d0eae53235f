// main_test.go: configuration, start-up and shutdown of the whole process.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

func envFrom(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfigDefaultsAndFallbacks(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig(nil, envFrom(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(defaultConfig(), cfg); diff != "" {
		t.Errorf("no flags, no environment (-want +got):\n%s", diff)
	}

	cfg, err = parseConfig(
		[]string{"-relay-batch", "50"},
		envFrom(map[string]string{
			"DATABASE_URL":                    "postgres://u@db.example:5432/app",
			"OUTBOXD_RELAY_BATCH":             "70", // the flag wins
			"OUTBOXD_ADDR":                    "0.0.0.0:9000",
			"OUTBOXD_ADMIN_TOKEN":             "an-admin-token-0123456789",
			"OUTBOXD_INSECURE_HTTP":           "1",
			"OUTBOXD_ALLOW_PRIVATE_ENDPOINTS": "1",
			"OUTBOXD_JOB_TIMEOUT":             "10s",
		}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := defaultConfig()
	want.DatabaseURL = "postgres://u@db.example:5432/app"
	want.Relay.BatchSize = 50
	want.Addr = "0.0.0.0:9000"
	want.AdminToken = "an-admin-token-0123456789"
	want.InsecureHTTP = true
	want.AllowPrivateEndpoints = true
	want.Workers.AttemptTimeout = 10 * time.Second
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("flags over environment (-want +got):\n%s", diff)
	}
}

// The defaults are the project's numbers, written out here as literals so
// that a changed default fails a test instead of agreeing with itself.
// docs/configuration.md and docs/guarantees.md ("Storage bounds") explain
// each.
func TestDefaultsAreTheStatedNumbers(t *testing.T) {
	t.Parallel()
	c := defaultConfig()
	day := 24 * time.Hour
	for _, n := range []struct {
		name      string
		got, want any
	}{
		{"relay batch", c.Relay.BatchSize, 200},
		{"poison after failures", c.Relay.MaxFailures, 5},
		{"relay sweep", c.Relay.SweepInterval, time.Minute},
		{"busy relay linger", c.Relay.BusyLinger, 100 * time.Millisecond},
		{"busy relay re-check", c.Relay.BusyRecheck, 5 * time.Millisecond},
		{"failing endpoint delay", c.Relay.FailingEndpointDelay, 5 * time.Minute},
		{"breaker threshold", c.Workers.BreakerThreshold, 5},
		{"workers", c.Workers.Concurrency, 128},
		{"job attempts", c.Workers.MaxAttempts, 18},
		{"attempt timeout", c.Workers.AttemptTimeout, 30 * time.Second},
		{"rescue margin", c.Workers.RescueMargin, time.Minute},
		{"events retention", c.Retention.Events, 7 * day},
		{"inbox retention", c.Retention.Inbox, 12 * day},
		{"completed jobs retention", c.Retention.CompletedJobs, day},
		{"discarded jobs retention", c.Retention.DiscardedJobs, 7 * day},
		{"retention interval", c.Retention.Interval, time.Hour},
		{"retention batch", c.Retention.BatchSize, 5000},
		{"anomaly cap", c.Retention.AnomalyCap, 1000000},
		{"endpoint disabled after", c.Retention.EndpointDisableAfter, 5 * day},
		{"backlog alert rows", c.Alerts.BacklogRows, 1000},
		{"backlog alert age", c.Alerts.BacklogAge, 5 * time.Minute},
		{"dead-row alert ratio", c.Alerts.DeadRatio, 0.2},
		{"old-transaction alert age", c.Alerts.XactAge, time.Hour},
		{"owner notifications an hour", c.Mail.OwnerNotifyPerHour, 5},
		{"database wait at start", c.DatabaseWait, time.Minute},
	} {
		if n.got != n.want {
			t.Errorf("default %s = %v, want %v", n.name, n.got, n.want)
		}
	}
}

// A bad setting refuses to start, and the message names the setting.
func TestParseConfigRefusesBadSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string // in the error
	}{
		{[]string{"-relay-batch", "0"}, nil, "-relay-batch (OUTBOXD_RELAY_BATCH) must be between 1 and 10000, got 0"},
		{nil, map[string]string{"OUTBOXD_RELAY_BATCH": "many"}, `OUTBOXD_RELAY_BATCH="many"`},
		{nil, map[string]string{"OUTBOXD_JOB_TIMEOUT": "-1s"}, "-job-timeout (OUTBOXD_JOB_TIMEOUT)"},
		{nil, map[string]string{"OUTBOXD_ADDR": "8080"}, "-addr (OUTBOXD_ADDR)"},
		{nil, map[string]string{"DATABASE_URL": "postgres://%zz"}, "-database-url (DATABASE_URL)"},
		{nil, map[string]string{"OUTBOXD_ADMIN_TOKEN": "short"}, "-admin-token (OUTBOXD_ADMIN_TOKEN) is too easy to guess: 5 characters"},
		{nil, map[string]string{"OUTBOXD_LOG_FORMAT": "xml"}, "-log-format (OUTBOXD_LOG_FORMAT)"},
		{nil, map[string]string{"OUTBOXD_LOG_LEVEL": "loud"}, "OUTBOXD_LOG_LEVEL"},
		{[]string{"-no-such-flag"}, nil, "flag provided but not defined: -no-such-flag"},
		{[]string{"frobnicate"}, nil, `unknown command "frobnicate"`},
		{[]string{"-workers", "0", "-relay-max-failures", "0"}, nil, "-relay-max-failures (OUTBOXD_RELAY_MAX_FAILURES)"},
		{nil, map[string]string{"OUTBOXD_POOL_MODE": "statement"}, `-pool-mode (OUTBOXD_POOL_MODE) must be session or transaction, got "statement"`},
	} {
		_, err := parseConfig(tc.args, envFrom(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseConfig(%q, %v) = %v, want an error containing %q", tc.args, tc.env, err, tc.want)
		}
	}
}

// A connection string the driver cannot read is quoted in its error; the
// password in it is not.
func TestParseConfigRedactsDatabasePassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgress://app:hunter2@db.example/app",  // a mistyped scheme
		"app:hunter2@db.example/app",              // no scheme
		"postgres://app:hunter2@db.example:x/app", // a bad port
		"postgres://app:hunter2@[::1/app",         // a bad host
		"host=db.example password=hunter2 sslmode=bogus",
		"host=db.example password='hunter2 too' sslmode=bogus",
	} {
		_, err := parseConfig(nil, envFrom(map[string]string{"DATABASE_URL": dsn}), io.Discard)
		if err == nil {
			t.Errorf("DATABASE_URL=%q accepted, want a refusal", dsn)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "-database-url (DATABASE_URL)") {
			t.Errorf("DATABASE_URL=%q: error %q shows the password or does not name the setting", dsn, err)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func awaitHealthy(t *testing.T, addr string, exited <-chan struct{}) {
	t.Helper()
	waitFor(t, "/healthz", 60*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatal("outboxd exited before it was healthy")
		default:
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// child is this test binary run as outboxd (OUTBOXD_TEST_RUN_MAIN), its
// log kept in stderr; exited closes once it has exited, with its status
// in waitErr.
type child struct {
	cmd     *exec.Cmd
	stderr  syncBuffer
	exited  chan struct{}
	waitErr error
}

// startChild starts outboxd with args and env (beside the test's own),
// and kills it when the test ends, logging its log if the test failed.
func startChild(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], args...), exited: make(chan struct{})}
	c.cmd.Env = append(append(os.Environ(), "OUTBOXD_TEST_RUN_MAIN=1"), env...)
	c.cmd.Stdout, c.cmd.Stderr = io.Discard, &c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.waitErr = c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			t.Logf("outboxd's log:\n%s", c.stderr.String())
		}
	})
	return c
}

// The whole process, as an operator runs it: started as a binary, healthy,
// its row naming the job kinds its workers run (the demo's subscriber's
// among them), events flowing in -demo, and SIGTERM exits 0 after a clean
// shutdown.
func TestProcessStartsRunsDemoAndExitsOnSIGTERM(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	addr := freeAddr(t)
	child := startChild(t, []string{"DATABASE_URL=" + dsn, "OUTBOXD_ADMIN_TOKEN=test-token-0123456789"},
		"-demo", "-addr", addr, "-log-format", "json")
	cmd, stderr, exited := child.cmd, &child.stderr, child.exited

	awaitHealthy(t, addr, exited)
	kinds := queryStrings(t, db, `SELECT coalesce(array_to_string(kinds, ' '), 'NULL') FROM outbox.replicas`)
	if diff := cmp.Diff([]string{"owner-notify sub:log webhook"}, kinds); diff != "" {
		t.Errorf("the kinds its row names (-want +got):\n%s", diff)
	}
	waitFor(t, "the demo's events to reach the log subscriber and its receiver", 30*time.Second, func() bool {
		return strings.Contains(stderr.String(), "event delivered to the log subscriber") &&
			strings.Contains(stderr.String(), "demo receiver: webhook verified")
	})
	// The demo reaches its own receiver on loopback; nothing else may.
	req, _ := http.NewRequest("POST", "http://"+addr+"/api/endpoints", strings.NewReader(`{"url": "http://127.0.0.1:9/hook"}`))
	req.Header.Set("Authorization", "Bearer test-token-0123456789")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("under -demo, registering a loopback endpoint answered %s, want 400", resp.Status)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatal("outboxd did not exit within 60s of SIGTERM")
	}
	if child.waitErr != nil {
		t.Fatalf("exit after SIGTERM: %v, want status 0", child.waitErr)
	}
	if !strings.Contains(stderr.String(), `"msg":"stopped"`) {
		t.Error(`log has no "stopped" line`)
	}
	if strings.Contains(stderr.String(), "test-token-0123456789") {
		t.Error("the admin token appears in the log")
	}
}

// Ctrl-C while a delivery is in flight: the first signal starts a
// graceful stop that says what it waits for (how many jobs, to which
// endpoint); the second stops at once, with the documented message and
// status 1, leaving the job running in the database, held by this
// replica, to be rescued as after a crash.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	t.Parallel()
	db, dsn := newTestDB(t)
	requested, release := make(chan struct{}, 1), make(chan struct{})
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // read to its end, so that a closed connection ends r's context
		select {
		case requested <- struct{}{}:
		default:
		}
		select { // held until outboxd goes away, or the test ends
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); receiver.Close() })

	addr := freeAddr(t)
	const token = "second-signal-token-0123456789abcdef"
	// A graceful stop would wait an hour for the held delivery.
	child := startChild(t, []string{"DATABASE_URL=" + dsn, "OUTBOXD_ADMIN_TOKEN=" + token},
		"-addr", addr, "-log-format", "json", "-allow-private-endpoints",
		"-shutdown-grace", "1h", "-job-timeout", "1h", "-webhook-timeout", "10m")
	cmd, stderr, exited := child.cmd, &child.stderr, child.exited
	awaitHealthy(t, addr, exited)

	post := func(path, body string) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: %s", path, resp.Status)
		}
	}
	post("/api/endpoints", `{"url": "`+receiver.URL+`/hook", "topics": ["order.*"]}`)
	post("/api/events", `{"topic": "order.paid", "subject": "42", "payload": {}}`)
	select {
	case <-requested:
	case <-time.After(60 * time.Second):
		t.Fatal("the receiver got no request")
	}

	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stop to say what it waits for", 60*time.Second, func() bool {
		return strings.Contains(stderr.String(), `"msg":"stopping: waiting for the jobs in flight`)
	})
	var waiting struct {
		Jobs int
		To   []string
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, `"msg":"stopping: waiting for the jobs in flight`) {
			if err := json.Unmarshal([]byte(line), &waiting); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
		}
	}
	endpointID := queryInt(t, db, `SELECT id FROM outbox.endpoints`)
	wantTo := []string{fmt.Sprintf("1 to endpoint %d (%s/hook)", endpointID, receiver.URL)}
	if waiting.Jobs != 1 || !cmp.Equal(waiting.To, wantTo) {
		t.Errorf("the stop waits for %d jobs to %q, want 1 to %q", waiting.Jobs, waiting.To, wantTo)
	}

	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatal("outboxd did not stop at the second signal (the grace is an hour)")
	}
	var exit *exec.ExitError
	if !errors.As(child.waitErr, &exit) || exit.ExitCode() != exitStoppedAtOnce {
		t.Errorf("exit after the second signal: %v, want status %d", child.waitErr, exitStoppedAtOnce)
	}
	if want := "outboxd: interrupt again: stopping at once; the jobs in flight are rescued as after a crash"; !strings.Contains(stderr.String(), want) {
		t.Errorf("no %q in the output", want)
	}
	if strings.Contains(stderr.String(), `"msg":"stopped"`) {
		t.Error(`a stop at once logged "stopped", which a graceful stop logs`)
	}
	// As after a crash: the attempt was never recorded; the job waits,
	// running, for a rescuer.
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'running' AND attempt = 1 AND errors = '[]'`); n != 1 {
		t.Errorf("%d jobs left running with no outcome, want 1", n)
	}
}

// A bad setting makes the binary exit non-zero with the setting named.
func TestProcessRefusesBadSetting(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-relay-batch", "-3")
	cmd.Env = append(os.Environ(), "OUTBOXD_TEST_RUN_MAIN=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit = %v, want status 1", err)
	}
	if !strings.Contains(string(out), "-relay-batch (OUTBOXD_RELAY_BATCH) must be between 1 and 10000, got -3") {
		t.Errorf("output %q does not name the setting", out)
	}
}

// With no DATABASE_URL, run starts a private cluster under -data-dir,
// serves /healthz and /readyz, and stops the cluster on the way out.
// Started as root, it says once that PostgreSQL runs as the postgres OS
// user; otherwise it says nothing of it.
func TestRunStartsEmbeddedCluster(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		// The postgres user must reach the folder: t.TempDir is 0700 root.
		os.Chmod(filepath.Dir(dir), 0o755)
		os.Chmod(dir, 0o755)
	}
	dataDir := filepath.Join(dir, "data")
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	var runErr error
	var logs syncBuffer
	go func() {
		defer close(exited)
		runErr = run(ctx, []string{"-addr", addr, "-data-dir", dataDir}, envFrom(nil), io.Discard, io.MultiWriter(&logs, testWriter{t}))
	}()
	defer func() { cancel(); <-exited }()

	awaitHealthy(t, addr, exited)
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz = %d, want 200", resp.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "pgdata", "PG_VERSION")); err != nil {
		t.Errorf("no cluster under the data folder: %v", err)
	}
	cancel()
	<-exited
	if runErr != nil {
		t.Errorf("run returned %v, want nil after cancel", runErr)
	}
	if pid, alive := runningPostmaster(filepath.Join(dataDir, "pgdata")); alive {
		t.Errorf("the embedded server (pid %d) is still running after run returned", pid)
	}
	want := 0
	if os.Geteuid() == 0 {
		want = 1
	}
	if n := strings.Count(logs.String(), "runs PostgreSQL as the postgres OS user"); n != want {
		t.Errorf("the log says %d times that PostgreSQL runs as the postgres OS user, want %d (euid %d)", n, want, os.Geteuid())
	}
}

// A generated admin token is shown once, in the panel's URL on the ready
// line, and never logged: not at start, not for requests that use it, not
// for requests that get it wrong.
func TestGeneratedTokenIsShownOnce(t *testing.T) {
	t.Parallel()
	_, dsn := newTestDB(t)
	addr := freeAddr(t)
	var stdout, logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		run(ctx, []string{"-addr", addr}, envFrom(map[string]string{"DATABASE_URL": dsn}), &stdout, &logs)
	}()
	defer func() { cancel(); <-exited }()
	generated := regexp.MustCompile(`token=([0-9a-f]{48})`)
	waitFor(t, "the ready line with a generated token", 60*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatalf("outboxd exited before it was ready:\n%s%s", stdout.String(), logs.String())
		default:
		}
		return generated.MatchString(stdout.String())
	})
	token := generated.FindStringSubmatch(stdout.String())[1]
	for _, auth := range []string{"Bearer " + token, "Bearer " + token + "x", ""} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/api/overview", nil)
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := auth == "Bearer "+token; (resp.StatusCode == 200) != want {
			t.Errorf("%q: status %d", auth, resp.StatusCode)
		}
	}
	cancel()
	<-exited
	if n := strings.Count(stdout.String(), token); n != 1 {
		t.Errorf("the token appears %d times on standard output, want once", n)
	}
	if strings.Contains(logs.String(), token) {
		t.Errorf("the token appears in the log:\n%s", logs.String())
	}
}

// readyLinePattern matches the ready line and takes the panel's URL from
// it.
var readyLinePattern = regexp.MustCompile(`(?m)^outboxd ready: open the panel at (http://\S+)(.*)$`)

// The line that says outboxd is ready is the last line of a start, after
// the index builds of a first one (and under -demo, after the demo's
// set-up; its writes then follow), and says where the panel is, at the
// port the listener bound: with a generated token, a URL that signs in
// when opened; with a configured one, the plain URL and the setting that
// holds the token, never the token itself.
func TestReadyLineSaysWhereThePanelIs(t *testing.T) {
	t.Parallel()
	const configured = "ready-line-token-0123456789abcdefghij"
	for _, c := range []struct {
		name  string
		token string // OUTBOXD_ADMIN_TOKEN; empty: generated
		demo  bool
	}{
		{"generated token", "", false},
		{"configured token", configured, false},
		{"generated token, -demo", "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// An empty database: the first start installs the schema.
			admin := harnessAdmin(t)
			name := fmt.Sprintf("outboxd_ready_%d_%d", os.Getpid(), harness.seq.Add(1))
			mustExec(t, admin, `CREATE DATABASE `+name)
			t.Cleanup(func() { admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`) })
			env := map[string]string{"DATABASE_URL": dsnWithDB(harness.adminDSN, name), "OUTBOXD_ADMIN_TOKEN": c.token}
			// Standard output and the log in one stream, in the order written.
			var out syncBuffer
			args := []string{"-addr", "127.0.0.1:0"}
			if c.demo {
				args = append(args, "-demo")
			}
			ctx, cancel := context.WithCancel(context.Background())
			exited := make(chan struct{})
			go func() {
				defer close(exited)
				run(ctx, args, envFrom(env), &out, &out)
			}()
			defer func() { cancel(); <-exited }()
			waitFor(t, "the ready line", 60*time.Second, func() bool {
				select {
				case <-exited:
					t.Fatalf("outboxd exited before it was ready:\n%s", out.String())
				default:
				}
				return readyLinePattern.MatchString(out.String())
			})
			all := out.String()
			m := readyLinePattern.FindStringSubmatch(all)
			start := all[:strings.Index(all, m[0])+len(m[0])] // the start, to its ready line
			before := []string{`msg="installing the schema" release=` + version, "registered as a replica", "outboxd started"}
			if c.demo {
				before = append(before, "demo: writing to outbox_demo.orders")
			}
			for _, line := range before {
				if !strings.Contains(start, line) {
					t.Errorf("%q is not logged before the ready line:\n%s", line, all)
				}
			}
			// Without -demo nothing that runs at start logs: nothing
			// follows it.
			if !c.demo && strings.TrimRight(all, "\n") != start {
				t.Errorf("the ready line is not the last line of the start:\n%s", all)
			}

			panel, err := url.Parse(m[1])
			if err != nil {
				t.Fatalf("the ready line's URL %q: %v", m[1], err)
			}
			if panel.Port() == "0" || panel.Path != "/" {
				t.Errorf("the ready line's URL %s is not the panel's on the bound port", panel)
			}
			jar, _ := cookiejar.New(nil)
			client := &http.Client{Jar: jar}
			resp, err := client.Get(panel.String())
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			signedIn := resp.StatusCode == http.StatusOK && strings.Contains(string(body), `href="/endpoints"`)
			if c.token == "" {
				if panel.Query().Get("token") == "" || !signedIn {
					t.Errorf("opening %s: %s, signed in %t; want a URL with the token that signs in", panel, resp.Status, signedIn)
				}
				return
			}
			if panel.RawQuery != "" || signedIn || !strings.Contains(m[2], "OUTBOXD_ADMIN_TOKEN") || strings.Contains(all, c.token) {
				t.Errorf("ready line %q, opened: %s, signed in %t; want the plain URL, a sign-in page, the setting named and the token not shown",
					m[0], resp.Status, signedIn)
			}
		})
	}
}

// A start with the schema in place takes no lock on the hot tables: it
// finishes while a transaction holds the lock every INSERT takes, which
// the DDL in schema.sql would wait for (and queue the INSERTs behind).
func TestMigrateAgainTakesNoTableLocks(t *testing.T) {
	t.Parallel()
	// Migrated from the first file: the last migration runs again over
	// what it made, which a fresh install (schema.sql) does not all hold.
	db := migratedFromTheFirstFile(t, newMigration(nil))
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`SELECT outbox.record('t', 's', '{}')`); err != nil {
		t.Fatal(err)
	}
	migrateCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := migrate(migrateCtx, db); err != nil {
		t.Fatalf("second migrate while a writer holds outbox.events: %v", err)
	}
	// A database without the last migration's record gets it again: the
	// file runs again over what it made.
	last := len(embeddedMigrations())
	mustExec(t, db, `DELETE FROM outbox.migrations WHERE version = $1`, last)
	tx.Rollback()
	if err := migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got := migrationFinished(t, db, last); got != "finished" {
		t.Errorf("the last migration is %s after it was applied again, want finished", got)
	}
}

// outboxd -h and each command's -h exit 0 and list what they take; -h
// lists every command.
func TestHelpListsEveryCommandAndExitsZero(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"serve", "-h"}, {"migrate", "-h"}, {"secrets", "encrypt", "-h"}, {"version", "-h"}} {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "OUTBOXD_TEST_RUN_MAIN=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("outboxd %s: %v, want exit 0\n%s", strings.Join(args, " "), err, out)
			continue
		}
		if len(args) == 1 {
			for _, c := range []string{"serve", "migrate", "secrets encrypt", "secrets rotate-key", "version"} {
				if !strings.Contains(string(out), "\n  "+c+" ") {
					t.Errorf("outboxd -h does not list %q:\n%s", c, out)
				}
			}
		}
		if args[0] == "migrate" && !strings.Contains(string(out), "-database-url") {
			t.Errorf("outboxd migrate -h lists no -database-url:\n%s", out)
		}
	}
	cmd := exec.Command(os.Args[0], "frobnicate")
	cmd.Env = append(os.Environ(), "OUTBOXD_TEST_RUN_MAIN=1")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), `unknown command "frobnicate"`) {
		t.Errorf("outboxd frobnicate: %v, %s; want exit 1 naming the command", err, out)
	}
}

// outboxd version prints the release and what the build recorded.
func TestVersionPrintsTheBuild(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if err := run(context.Background(), []string{"version"}, func(string) string { return "" }, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := readBuildInfo()
	if !strings.HasPrefix(out.String(), "outboxd 0.8.0") || !strings.Contains(out.String(), want.GoVersion) {
		t.Errorf("outboxd version printed %q, want the release 0.8.0 and %s", out.String(), want.GoVersion)
	}
}

// dsnAt is dsn with its user, and its server at addr (host:port) over
// TCP, in either of lib/pq's connection string forms.
func dsnAt(dsn, user, addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			panic(err)
		}
		u.Host, u.User = addr, url.User(user)
		return u.String()
	}
	return fmt.Sprintf("%s host=%s port=%s user=%s", dsn, host, port, user) // a later keyword wins in lib/pq
}

// forwardToHarness accepts connections on ln until the test ends and
// pipes each to the harness's server, over TCP or its Unix socket: the
// server appearing at ln's address.
func forwardToHarness(t *testing.T, ln net.Listener) {
	t.Helper()
	cfg, err := pq.NewConfig(harness.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	network, address := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, address = "unix", filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return // closed: the test is over
			}
			server, err := net.Dial(network, address)
			if err != nil {
				client.Close()
				continue
			}
			go func() { io.Copy(server, client); server.Close() }()
			go func() { io.Copy(client, server); client.Close() }()
		}
	}()
}

// A start waits for a server that refuses connections, saying so, and
// goes on when it appears; with -database-wait 0 it fails at once.
func TestStartWaitsForARefusingServer(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t) // nothing listens there, for now
	name := fmt.Sprintf("outboxd_late_%d_%d", os.Getpid(), harness.seq.Add(1))
	admin := harnessAdmin(t)
	mustExec(t, admin, `CREATE DATABASE `+name)
	t.Cleanup(func() { admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`) })
	admin.Close()
	cfg, err := pq.NewConfig(harness.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	dsn := dsnAt(dsnWithDB(harness.adminDSN, name), cfg.User, addr)

	var logs syncBuffer
	err = run(context.Background(), []string{"migrate", "-database-url", dsn, "-database-wait", "0"}, envFrom(nil), io.Discard, &logs)
	if err == nil || !strings.Contains(err.Error(), "connection refused") || strings.Contains(logs.String(), "trying again") {
		t.Fatalf("-database-wait 0 with nothing listening: %v, log:\n%s\nwant connection refused at the first try", err, logs.String())
	}

	logs = syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"migrate", "-database-url", dsn, "-database-wait", "1m"}, envFrom(nil), io.Discard, &logs)
	}()
	waitFor(t, "a logged try", 30*time.Second, func() bool { return strings.Contains(logs.String(), "database not reachable; trying again") })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen where outboxd waits: %v", err)
	}
	forwardToHarness(t, ln)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("migrate once the server appeared: %v\n%s", err, logs.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("migrate did not go on once the server appeared")
	}
}

// A start fails at once, naming the setting and the cause, on what no
// wait can fix: a role or a database that does not exist. It neither
// logs a try again nor waits out -database-wait.
func TestStartFailsAtOnceOnWhatWaitingCannotFix(t *testing.T) {
	t.Parallel()
	_, dsn := newTestDB(t)
	cfg, err := pq.NewConfig(harness.adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	server := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") { // the harness's own cluster: reach it over TCP through a forwarder
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		forwardToHarness(t, ln)
		server = ln.Addr().String()
	}
	for _, c := range []struct {
		name, dsn, cause string
	}{
		{"a role that does not exist", dsnAt(dsn, "outboxd_no_such_role", server), `role "outboxd_no_such_role" does not exist (28000)`},
		{"a database that does not exist", dsnAt(dsnWithDB(dsn, "outboxd_no_such_db"), cfg.User, server), `database "outboxd_no_such_db" does not exist (3D000)`},
	} {
		var logs syncBuffer
		err := run(context.Background(), []string{"migrate", "-database-url", c.dsn, "-database-wait", "30s"}, envFrom(nil), io.Discard, &logs)
		if err == nil {
			t.Errorf("%s: migrate succeeded, want a failure", c.name)
			continue
		}
		for _, want := range []string{"-database-url (DATABASE_URL)", "waiting cannot fix this", c.cause} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", c.name, err, want)
			}
		}
		if strings.Contains(logs.String(), "trying again") {
			t.Errorf("%s: tried again, log:\n%s", c.name, logs.String())
		}
	}
}

// waitCanFix sorts connection errors: what a later try may not meet
// (the server absent, starting up, shutting down, full) from what every
// try meets alike.
func TestWaitCanFix(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"no socket yet", &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ENOENT)}, true},
		{"a name not resolved yet", &net.DNSError{Err: "no such host", Name: "db", IsNotFound: true}, true},
		{"closed under the handshake", io.EOF, true},
		{"no answer in time", context.DeadlineExceeded, true},
		{"starting up (57P03)", &pq.Error{Code: pqerror.CannotConnectNow}, true},
		{"shutting down (57P01)", &pq.Error{Code: pqerror.AdminShutdown}, true},
		{"too many connections (53300)", &pq.Error{Code: pqerror.TooManyConnections}, true},
		{"connection failure (08006)", &pq.Error{Code: pqerror.ConnectionFailure}, true},
		{"wrapped, redacted", &connectError{text: "connect to database: ...", err: refused}, true},
		{"no such role (28000)", &pq.Error{Code: pqerror.InvalidAuthorizationSpecification}, false},
		{"wrong password (28P01)", &pq.Error{Code: pqerror.InvalidPassword}, false},
		{"no such database (3D000)", &connectError{text: "connect to database: ...", err: &pq.Error{Code: pqerror.InvalidCatalogName}}, false},
		{"unknown parameter (42704)", &pq.Error{Code: pqerror.UndefinedObject}, false},
		{"bad parameter value (22023)", &pq.Error{Code: pqerror.InvalidParameterValue}, false},
		{"TLS not enabled on the server", pq.ErrSSLNotSupported, false},
	} {
		if got := waitCanFix(c.err); got != c.want {
			t.Errorf("waitCanFix(%s) = %t, want %t", c.name, got, c.want)
		}
	}
}

// The panel shows the build it runs, as outboxd version prints it.
func TestPanelShowsTheBuild(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	_, page := panelPage(t, newTestServer(t, db, testPolicy), "/")
	if want := html.EscapeString(readBuildInfo().String()); !strings.Contains(page, want) {
		t.Errorf("the overview page does not show %q", want)
	}
}

// needTool is the path of the program name, which Debian's packages pkgs
// bring, for a test that cannot run without it: PgBouncer, Chromium and
// chromedriver are not needed to build or run outboxd, so a machine
// without them skips those tests, and the message says what to install.
// Where CI=true the test fails instead: .ci/run installs every such
// package, and a test skipped there would pass unseen.
func needTool(t testing.TB, name, pkgs string) string {
	t.Helper()
	return lookupTool(t, os.Getenv, name, pkgs)
}

// sbinDir is searched after PATH: Debian installs daemons such as
// pgbouncer there, and a non-root PATH leaves it out.
const sbinDir = "/usr/sbin"

// lookupTool is needTool with the environment given, for its own test.
func lookupTool(t testing.TB, getenv func(string) string, name, pkgs string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	if path, err := exec.LookPath(filepath.Join(sbinDir, name)); err == nil {
		return path
	}
	msg := fmt.Sprintf("%s not found on PATH or in %s: apt-get install %s", name, sbinDir, pkgs)
	if ci, _ := strconv.ParseBool(getenv("CI")); ci {
		t.Fatalf("%s (CI=true: .ci/run installs it, and this test must run)", msg)
		return ""
	}
	t.Skip(msg + "; CI=true makes this a failure")
	return ""
}

// toolOutcome records what lookupTool did to a test, where a real test
// would have stopped.
type toolOutcome struct {
	testing.TB
	skipped, failed string
}

func (o *toolOutcome) Helper()                      {}
func (o *toolOutcome) Skip(args ...any)             { o.skipped = fmt.Sprint(args...) }
func (o *toolOutcome) Fatalf(f string, args ...any) { o.failed = fmt.Sprintf(f, args...) }

// A missing tool skips naming its package, or fails where CI=true; a
// present one is found on PATH.
func TestNeedToolSkipsOrFailsInCI(t *testing.T) {
	t.Parallel()
	const missing = "outboxd-test-no-such-tool"
	for _, ci := range []string{"", "false", "true", "1"} {
		o := &toolOutcome{TB: t}
		path := lookupTool(o, envFrom(map[string]string{"CI": ci}), missing, "some-package")
		want, got, other := "skip", o.skipped, o.failed
		if ci == "true" || ci == "1" {
			want, got, other = "failure", o.failed, o.skipped
		}
		if path != "" || other != "" || !strings.Contains(got, "apt-get install some-package") {
			t.Errorf("CI=%q: path %q, skipped %q, failed %q; want only a %s naming the package",
				ci, path, o.skipped, o.failed, want)
		}
	}
	o := &toolOutcome{TB: t}
	if path := lookupTool(o, envFrom(map[string]string{"CI": "true"}), "sh", "dash"); path == "" || o.skipped != "" || o.failed != "" {
		t.Errorf("sh: path %q, skipped %q, failed %q; want its path", path, o.skipped, o.failed)
	}
}
