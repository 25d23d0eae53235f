// browser_test.go: the panel end to end in headless Chromium, driven over
// the WebDriver protocol (plain HTTP and JSON) by chromedriver.

package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// webDriver is a minimal W3C WebDriver client: just the calls the panel
// test needs.
type webDriver struct {
	t       *testing.T
	base    string // http://127.0.0.1:port/session/<id>
	session string
}

func (d *webDriver) call(method, path string, body any) json.RawMessage {
	d.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, d.base+path, r)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("webdriver %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out struct {
		Value json.RawMessage `json:"value"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 {
		d.t.Fatalf("webdriver %s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return out.Value
}

func (d *webDriver) open(url string) { d.call("POST", "/url", map[string]string{"url": url}) }

// find returns the element matching a CSS selector; it fails the test if
// there is none.
func (d *webDriver) find(css string) string {
	d.t.Helper()
	var el map[string]string
	json.Unmarshal(d.call("POST", "/element", map[string]string{"using": "css selector", "value": css}), &el)
	for _, id := range el {
		return id
	}
	d.t.Fatalf("no element %q", css)
	return ""
}

func (d *webDriver) count(css string) int {
	var els []map[string]string
	json.Unmarshal(d.call("POST", "/elements", map[string]string{"using": "css selector", "value": css}), &els)
	return len(els)
}

func (d *webDriver) typeInto(css, text string) {
	d.call("POST", "/element/"+d.find(css)+"/value", map[string]string{"text": text})
}

func (d *webDriver) click(css string) {
	d.call("POST", "/element/"+d.find(css)+"/click", map[string]any{})
}

func (d *webDriver) text(css string) string {
	var s string
	json.Unmarshal(d.call("GET", "/element/"+d.find(css)+"/text", nil), &s)
	return s
}

func (d *webDriver) screenshot(path string) {
	var b64 string
	json.Unmarshal(d.call("GET", "/screenshot", nil), &b64)
	png, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		d.t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// startBrowser starts chromedriver and a headless Chromium session. Where
// either is missing the test skips, except where CI=true (needTool).
func startBrowser(t *testing.T) *webDriver {
	t.Helper()
	const pkgs = "chromium chromium-driver"
	driver := needTool(t, "chromedriver", pkgs)
	browser := needTool(t, "chromium", pkgs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(driver, fmt.Sprintf("--port=%d", port))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	root := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitFor(t, "chromedriver", 20*time.Second, func() bool {
		resp, err := http.Get(root + "/status")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	d := &webDriver{t: t, base: root}
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{
			"binary": browser,
			"args": []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
				"--disable-background-networking", "--disable-component-update", "--disable-sync",
				"--window-size=1280,1000", "--user-data-dir=" + t.TempDir()},
		},
	}}}
	var created struct {
		SessionID string `json:"sessionId"`
	}
	json.Unmarshal(d.call("POST", "/session", caps), &created)
	if created.SessionID == "" {
		t.Fatal("chromedriver created no session")
	}
	d.base = root + "/session/" + created.SessionID
	// A click that submits a form returns before the next page has loaded:
	// let element look-ups wait for their element (the condition) instead.
	d.call("POST", "/timeouts", map[string]int{"implicit": 10_000})
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", d.base, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return d
}

// artifactDir is where test artifacts (screenshots) go; ignored by git.
const artifactDir = "testdata/artifacts"

func TestPanelInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	seedOverviewState(t, db)
	poisoned := queryInt(t, db, `SELECT min(id) FROM outbox.events WHERE poisoned_at IS NOT NULL`)
	srv := newTestAdmin(t, db)
	b := startBrowser(t)

	b.open(srv.URL + "/")
	if b.count("input[name=token]") != 1 {
		t.Fatal("a stranger is not shown the sign-in form")
	}
	b.typeInto("input[name=token]", testToken)
	b.click("form.login button")
	b.find("#backlog") // waits for the overview to load

	if got := b.text("h1"); got != "Overview" {
		t.Fatalf("after sign-in the page says %q, want Overview", got)
	}
	if msg := b.text("#alert-events_poisoned"); !strings.Contains(msg, "2 events are poisoned") {
		t.Errorf("poisoned alert reads %q", msg)
	}
	if b.count("#alert-events_backlog") != 1 || b.count("#alert-jobs_discarded") != 1 {
		t.Error("backlog and discarded alerts are not shown")
	}
	screenshot(t, b, "overview.png")

	b.open(srv.URL + "/events?state=poisoned")
	b.click(fmt.Sprintf(`form[action="/events/%d/requeue"] button`, poisoned))
	if got := b.text(".flash"); !strings.Contains(got, "Requeued") {
		t.Errorf("after requeue the page says %q", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE id = $1 AND poisoned_at IS NULL AND relay_attempts = 0`, poisoned); n != 1 {
		t.Error("clicking Requeue did not requeue the event")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.events WHERE poisoned_at IS NOT NULL`); n != 1 {
		t.Errorf("%d events poisoned after requeueing one of two, want 1", n)
	}

	// Re-enable a disabled endpoint.
	mustExec(t, db, `INSERT INTO outbox.endpoints (url, secret, disabled_at, disabled_reason)
		VALUES ('https://hooks.example/x', decode(repeat('ab', 32), 'hex'), now(), 'the receiver answered 410 Gone')`)
	epID := queryInt(t, db, `SELECT max(id) FROM outbox.endpoints`)
	b.open(srv.URL + "/")
	if b.count("#alert-endpoint_disabled") != 1 {
		t.Error("no endpoint_disabled alert on the overview")
	}
	b.open(fmt.Sprintf("%s/endpoints/%d", srv.URL, epID))
	b.click("#enable")
	if got := b.text(".flash"); !strings.Contains(got, "Enabled") {
		t.Errorf("after enable the page says %q", got)
	}
	if got := b.text("#state"); got != "enabled" {
		t.Errorf("endpoint state on the page after enable: %q", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE id = $1 AND disabled_at IS NULL AND disabled_reason IS NULL`, epID); n != 1 {
		t.Error("clicking Enable did not enable the endpoint")
	}

	// Pause it, and resume it.
	b.click("#pause")
	b.find("#resume") // waits for the page after pause
	if got := b.text("#state"); got != "paused" {
		t.Errorf("endpoint state on the page after pause: %q", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE id = $1 AND paused_at IS NOT NULL`, epID); n != 1 {
		t.Error("clicking Pause did not pause the endpoint")
	}
	b.click("#resume")
	b.find("#pause") // waits for the page after resume
	if got := b.text("#state"); got != "enabled" {
		t.Errorf("endpoint state on the page after resume: %q", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.endpoints WHERE id = $1 AND paused_at IS NULL`, epID); n != 1 {
		t.Error("clicking Resume did not resume the endpoint")
	}

	// Configure an inbox source on the panel; its secret is shown once.
	b.open(srv.URL + "/sources")
	b.typeInto("input[name=name]", "billing")
	b.click("form.stacked button")
	if got := b.text("#secret"); !strings.HasPrefix(got, "whsec_") {
		t.Errorf("new source's secret on the page: %q", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.inbox_sources WHERE name = 'billing'`); n != 1 {
		t.Error("creating a source on the panel did not create it")
	}

	b.open(srv.URL + "/jobs?state=discarded")
	b.click(`table.jobs td form button`)
	if got := b.text(".flash"); !strings.Contains(got, "will run now") {
		t.Errorf("after retry the page says %q", got)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE state = 'discarded'`); n != 0 {
		t.Error("clicking Retry now left the job discarded")
	}
}
