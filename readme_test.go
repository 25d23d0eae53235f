// readme_test.go: the README and docs/ state what the code does, so they
// are held to it: every test they cite exists, every link resolves, the
// commands and the verification code they show work, the configuration page
// lists every flag and the operations page every metric, and neither
// carries run history.

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
)

// docFiles is the README and every page under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{"README.md"}, pages...)
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// proseLines are a markdown file's lines outside fenced code blocks, with
// their line numbers: a `# comment` in a shell block is not a heading.
func proseLines(doc string) map[int]string {
	lines := map[int]string{}
	fenced := false
	for i, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			lines[i+1] = line
		}
	}
	return lines
}

func TestREADMEAndDocsNameOnlyTestsThatExist(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	// The benchmark modules' tests may be cited too.
	bench, err := filepath.Glob("bench/*/*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	funcs := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w+)\(`)
	for _, f := range append(files, bench...) {
		for _, m := range funcs.FindAllStringSubmatch(readDoc(t, f), -1) {
			defined[m[1]] = true
		}
	}
	cited := regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z]\\w*)")
	for _, doc := range docFiles(t) {
		var missing []string
		for _, m := range cited.FindAllStringSubmatch(readDoc(t, doc), -1) {
			if name := m[1]; !defined[name] && !slices.Contains(missing, name) {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s cites tests that do not exist: %v", doc, missing)
		}
	}
}

// The README's build-and-run commands work as written: the build, -h,
// version, and migrate against a fresh database.
func TestREADMECommandsRun(t *testing.T) {
	t.Parallel()
	readme := readDoc(t, "README.md")
	for _, shown := range []string{"go run .", "go test ./..."} {
		if !strings.Contains(readme, "```sh\n"+shown+"\n```") {
			t.Errorf("README.md no longer shows %q as a command of its own", shown)
		}
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
		{"./outboxd version", []string{bin, "version"}, "outboxd " + version},
		{"./outboxd migrate -database-url postgres://...", []string{bin, "migrate", "-database-url", dsn}, "the schema is at this release"},
	} {
		if !strings.Contains(readme, c.shown) {
			t.Errorf("README.md no longer shows %q", c.shown)
		}
		out, err := exec.Command(c.run[0], c.run[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: %v, output:\n%s\nwant %q in it", c.shown, err, out, c.want)
		}
	}
}

// snippetMain is a receiver's program around a verification snippet: it
// runs the snippet's function fn over cases read from stdin (the key the
// receiver holds, the headers, the body, the time it verifies at), one
// line of output a case: "verified" or "refused: <error>". imports are
// the snippet's own; the blank uses keep the program compiling if the
// snippet stops using one of them.
func snippetMain(imports []string, uses, fn string) string {
	return `package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	` + strings.Join(imports, "\n\t") + `
)

var _ = []any{base64.StdEncoding, errors.New, strconv.Itoa, strings.Fields, ` + uses + `}

func main() {
	var cases []snippetCase
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		panic(err)
	}
	for _, c := range cases {
		h := http.Header{}
		for k, v := range c.Header {
			h.Set(k, v)
		}
		if err := ` + fn + `(c.Key, h, []byte(c.Body), time.Unix(c.Now, 0)); err != nil {
			fmt.Println("refused:", err)
		} else {
			fmt.Println("verified")
		}
	}
}

type snippetCase struct {
	Key    string
	Header map[string]string
	Body   string
	Now    int64
}
`
}

// snippetCase is one request a verification snippet is given.
type snippetCase struct {
	Key    string
	Header map[string]string
	Body   string
	Now    int64
}

// runSnippet compiles snippet into a program of its own around main (a
// snippetMain), as a receiver would, and returns its answer to each
// input.
func runSnippet(t *testing.T, main, snippet string, inputs []snippetCase) []string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(main+"\n"+snippet), 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := json.Marshal(inputs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "main.go")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run of a verification snippet: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(inputs) {
		t.Fatalf("got %d lines for %d inputs:\n%s", len(lines), len(inputs), out)
	}
	return lines
}

// The README's verification function, compiled as a receiver would,
// accepts what outboxd signs, with either secret during a rotation, and
// refuses a changed body, another secret and a stale timestamp.
func TestREADMEVerifySnippetAcceptsOutboxdsSignature(t *testing.T) {
	t.Parallel()
	snippet := fencedBlock(t, readDoc(t, "README.md"), "```go\n// verifyOutboxd")

	secret, previous, other := newWebhookSecret(), newWebhookSecret(), newWebhookSecret()
	now := time.Now()
	body := `{"id":"7","type":"order.paid","subject":"42","timestamp":"2026-10-28T09:20:00Z","data":{"amount_cents":1200}}`
	signed := func(secrets [][]byte, sentAt time.Time) map[string]string {
		h := http.Header{}
		setWebhookHeaders(h, secrets, "7", sentAt, []byte(body))
		return map[string]string{"webhook-id": h.Get("webhook-id"),
			"webhook-timestamp": h.Get("webhook-timestamp"), "webhook-signature": h.Get("webhook-signature")}
	}
	cases := []struct {
		name string
		in   snippetCase
		want string
	}{
		{"signed with the endpoint's secret", snippetCase{secret.Encode(), signed([][]byte{secret}, now), body, now.Unix()}, "verified"},
		{"a rotation: the receiver has the new secret", snippetCase{secret.Encode(), signed([][]byte{secret, previous}, now), body, now.Unix()}, "verified"},
		{"a rotation: the receiver has the old secret", snippetCase{previous.Encode(), signed([][]byte{secret, previous}, now), body, now.Unix()}, "verified"},
		{"the body changed", snippetCase{secret.Encode(), signed([][]byte{secret}, now), strings.Replace(body, "1200", "120000", 1), now.Unix()}, "refused:"},
		{"another endpoint's secret", snippetCase{other.Encode(), signed([][]byte{secret}, now), body, now.Unix()}, "refused:"},
		{"sent six minutes ago", snippetCase{secret.Encode(), signed([][]byte{secret}, now.Add(-6*time.Minute)), body, now.Unix()}, "refused:"},
	}
	var inputs []snippetCase
	for _, c := range cases {
		inputs = append(inputs, c.in)
	}
	got := runSnippet(t, snippetMain([]string{`"crypto/hmac"`, `"crypto/sha256"`}, "hmac.New, sha256.New", "verifyOutboxd"), snippet, inputs)
	for i, c := range cases {
		if !strings.HasPrefix(got[i], c.want) {
			t.Errorf("%s: the README's verifyOutboxd said %q, want %q", c.name, got[i], c.want)
		}
	}
}

// fencedBlock is the body of the first fenced block of doc whose opening
// line and first line start as opening does ("```go\n// verifyOutboxd"),
// without its fences.
func fencedBlock(t *testing.T, doc, opening string) string {
	t.Helper()
	fence, _, _ := strings.Cut(opening, "\n")
	start := strings.Index(doc, opening)
	if start < 0 {
		t.Fatalf("no %s block starting %q", fence, opening)
	}
	block := doc[start+len(fence)+1:]
	return block[:strings.Index(block, "```")]
}

// readmeSection is the README's section under heading, to the next
// heading of its level.
func readmeSection(t *testing.T, readme, heading string) string {
	t.Helper()
	start := strings.Index(readme, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("README.md has no %q", heading)
	}
	section := readme[start+1:]
	if end := strings.Index(section[len(heading):], "\n## "); end >= 0 {
		section = section[:len(heading)+end]
	}
	return section
}

// The README's first SQL block, as written, runs on a fresh database
// with the schema, and again, each time recording the event it shows.
func TestREADMEFirstSQLBlockRecordsAnEvent(t *testing.T) {
	t.Parallel()
	block := fencedBlock(t, readDoc(t, "README.md"), "```sql\n")
	db, _ := newTestDB(t)
	for run := 1; run <= 2; run++ {
		if _, err := db.Exec(block); err != nil {
			t.Fatalf("the README's first SQL block, run %d: %v\n%s", run, err, block)
		}
		if n := queryInt(t, db, `SELECT count(*) FROM outbox.events
			WHERE topic = 'order.paid' AND subject = '42' AND payload = '{"amount_cents": 1200}'`); n != run {
			t.Errorf("after run %d: %d order.paid events recorded, want %d", run, n, run)
		}
	}
}

// The README's five-minute path, as written: outboxd with the demo and
// -allow-private-endpoints, the endpoint made with the README's curl body,
// the README's receiver with its verifyOutboxd compiled as a receiver's
// own program, the README's first SQL block, and the delivery where the
// README says the panel shows it. Only the receiver's port differs.
func TestREADMEFiveMinutePath(t *testing.T) {
	t.Parallel()
	readme := readDoc(t, "README.md")
	section := readmeSection(t, readme, "## Five minutes, end to end")
	const endpointBody = `{"url": "http://127.0.0.1:9000/hook", "topics": ["order.*"]}`
	for _, shown := range []string{
		"```sh\ngo run . -demo -allow-private-endpoints\n```",
		"-d '" + endpointBody + "'",
		"WEBHOOK_SECRET=whsec_... go run main.go",
		"**Events** lists the event with a green\n`delivered 2`",
	} {
		if !strings.Contains(section, shown) {
			t.Errorf("the five-minute path no longer shows %q", shown)
		}
	}
	sqlBlock := fencedBlock(t, readme, "```sql\n")
	if !strings.Contains(section, sqlBlock) {
		t.Fatal("the README's first SQL block is not the five-minute path's")
	}
	receiverAddr := freeAddr(t)
	receiverSrc := strings.ReplaceAll(fencedBlock(t, section, "```go\n// main.go")+"\n"+
		fencedBlock(t, readme, "```go\n// verifyOutboxd"), "127.0.0.1:9000", receiverAddr)

	// outboxd, as the path starts it.
	db, dsn := newTestDB(t)
	addr := freeAddr(t)
	var stdout, logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		run(ctx, []string{"-demo", "-allow-private-endpoints", "-addr", addr}, envFrom(map[string]string{"DATABASE_URL": dsn}), &stdout, &logs)
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
		if t.Failed() {
			t.Logf("outboxd's log:\n%s", logs.String())
		}
	})
	waitFor(t, "the ready line", 60*time.Second, func() bool { return readyLinePattern.MatchString(stdout.String()) })
	panelURL, err := url.Parse(readyLinePattern.FindStringSubmatch(stdout.String())[1])
	if err != nil {
		t.Fatal(err)
	}
	token := panelURL.Query().Get("token")

	// The endpoint, with the README's body.
	req, _ := http.NewRequest("POST", "http://"+addr+"/api/endpoints",
		strings.NewReader(strings.ReplaceAll(endpointBody, "127.0.0.1:9000", receiverAddr)))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var ep struct {
		ID     int64
		Secret string
	}
	err = json.NewDecoder(resp.Body).Decode(&ep)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || err != nil || !strings.HasPrefix(ep.Secret, "whsec_") {
		t.Fatalf("create the README's endpoint: %s, %v, %+v", resp.Status, err, ep)
	}

	// The receiver, built as its own program and run with the secret.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(receiverSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", "receiver", "main.go")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the README's receiver: %v\n%s\n%s", err, out, receiverSrc)
	}
	receiver := exec.Command(filepath.Join(dir, "receiver"))
	receiver.Env = append(os.Environ(), "WEBHOOK_SECRET="+ep.Secret)
	var printed syncBuffer
	receiver.Stdout, receiver.Stderr = &printed, &printed
	if err := receiver.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { receiver.Process.Kill(); receiver.Wait() })
	var refused *http.Response
	waitFor(t, "the receiver to listen", 30*time.Second, func() bool {
		refused, err = http.Post("http://"+receiverAddr+"/hook", "application/json", strings.NewReader(`{"id":"1"}`))
		return err == nil
	})
	refused.Body.Close()
	if refused.StatusCode != http.StatusUnauthorized {
		t.Errorf("the receiver answered an unsigned request %s, want 401", refused.Status)
	}

	// The business write, and its delivery.
	mustExec(t, db, sqlBlock)
	eventID := queryInt(t, db, `SELECT id FROM outbox.events WHERE topic = 'order.paid'`)
	waitFor(t, "the receiver to print the verified webhook", 30*time.Second, func() bool {
		return strings.Contains(printed.String(), fmt.Sprintf(`verified webhook %d: {"id":"%d","type":"order.paid"`, eventID, eventID))
	})
	waitFor(t, "the outcomes of the event's two jobs", 30*time.Second, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM outbox.jobs WHERE event_id = $1`, eventID) == 0 &&
			queryInt(t, db, `SELECT count(*) FROM outbox.deliveries
				WHERE event_id = $1 AND outcome = 'completed' AND (kind = 'sub:log' OR endpoint_id = $2)`, eventID, ep.ID) == 2
	})

	// Where the README says the panel shows it, signed in by the ready
	// line's URL.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	get := func(path string) string {
		t.Helper()
		resp, err := browser.Get("http://" + panelURL.Host + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		return string(body)
	}
	get(panelURL.RequestURI())
	var row string
	for _, r := range strings.Split(get("/events"), "<tr>") {
		if strings.Contains(r, fmt.Sprintf(`<a href="/events/%d">`, eventID)) {
			row = r
		}
	}
	if !strings.Contains(row, `<span class="badge badge-ok">delivered 2</span> <code>sub:log</code>, <a href="/endpoints/`+itoa(ep.ID)+`">`) {
		t.Errorf("the Events page's row of event %d does not say delivered 2, to sub:log and endpoint %d:\n%s", eventID, ep.ID, row)
	}
	if page := get(fmt.Sprintf("/events/%d", eventID)); !strings.Contains(page, `<td class="state-completed">completed</td>`) {
		t.Errorf("event %d's page shows no completed job", eventID)
	}
	if page := get("/endpoints/" + itoa(ep.ID)); !strings.Contains(page, fmt.Sprintf(`<a href="/events/%d">%d</a>`, eventID, eventID)) {
		t.Errorf("endpoint %d's page shows no attempt of event %d", ep.ID, eventID)
	}
}

// headingAnchor is the anchor GitHub gives a heading: lower case, spaces
// to hyphens, punctuation other than - and _ dropped.
func headingAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchorsOf is every heading anchor of a markdown file, the second of two
// equal headings suffixed -1 as GitHub does.
func anchorsOf(doc string) map[string]bool {
	anchors, seen := map[string]bool{}, map[string]int{}
	heading := regexp.MustCompile(`^#{1,6} (.+)$`)
	lines := proseLines(doc)
	for n := 1; n <= len(strings.Split(doc, "\n")); n++ {
		m := heading.FindStringSubmatch(lines[n])
		if m == nil {
			continue
		}
		a := headingAnchor(strings.ReplaceAll(m[1], "`", ""))
		if k := seen[a]; k > 0 {
			anchors[fmt.Sprintf("%s-%d", a, k)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// Every relative link of the README and docs/ points at a file that
// exists, and at a heading of it when it names one.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, doc := range docFiles(t) {
		text := readDoc(t, doc)
		for n, line := range proseLines(text) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := doc
				if path != "" {
					file = filepath.Join(filepath.Dir(doc), path)
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s:%d: link %q: %v", doc, n, target, err)
					continue
				}
				if anchor != "" && !anchorsOf(readDoc(t, file))[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", doc, n, target, file, anchor)
				}
			}
		}
	}
}

// Every picture in docs/ is one a test photographs, so that
// OUTBOXD_SCREENSHOTS=docs renews them all from the release at hand, and
// one a page shows; every picture a test photographs for docs/ is there.
func TestDocsPicturesAreRenewedByTheTests(t *testing.T) {
	t.Parallel()
	photographed := map[string]bool{}
	for _, name := range demoPanelPages {
		photographed["panel-"+name+".png"] = true
	}
	call := regexp.MustCompile(`\bscreenshot\(t, \w+, "([^"]+)"\)`)
	tests, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range tests {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			photographed[m[1]] = true
		}
	}
	var pages strings.Builder
	for _, doc := range docFiles(t) {
		pages.WriteString(readDoc(t, doc))
	}
	pictures, err := filepath.Glob("docs/*.png")
	if err != nil {
		t.Fatal(err)
	}
	inDocs := map[string]bool{}
	for _, p := range pictures {
		name := filepath.Base(p)
		inDocs[name] = true
		if !photographed[name] {
			t.Errorf("docs/%s: no test photographs it, so OUTBOXD_SCREENSHOTS=docs never renews it", name)
		}
		if !strings.Contains(pages.String(), "("+name+")") {
			t.Errorf("docs/%s: no page shows it", name)
		}
	}
	for name := range photographed {
		if !inDocs[name] {
			t.Errorf("a test photographs %s for docs/, which does not hold it", name)
		}
	}
}

// The README and docs/ say what the code does now: no issue numbers, no
// commit hashes, no dated runs, and no command that no longer exists.
func TestDocsCarryNoRunHistory(t *testing.T) {
	t.Parallel()
	month := `(?:January|February|March|April|May|June|July|August|September|October|November|December)`
	for _, rule := range []struct {
		what string
		re   *regexp.Regexp
	}{
		{"an issue number", regexp.MustCompile(`(?i)\bissues? \d+|#\d+\b`)},
		{"a commit hash", regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)},
		{"a date", regexp.MustCompile(`\b\d{1,2} ` + month + ` \d{4}\b|\b` + month + ` \d{1,2},? \d{4}\b`)},
		{"the load generator as a subcommand", regexp.MustCompile(`outboxd load\b`)},
	} {
		for _, doc := range docFiles(t) {
			for n, line := range strings.Split(readDoc(t, doc), "\n") {
				for _, m := range rule.re.FindAllString(line, -1) {
					if rule.what == "a commit hash" && (!(strings.ContainsAny(m, "0123456789") && strings.ContainsAny(m, "abcdef")) || m == "ed25519") {
						continue // a number, a word of the letters a to f, or the signature scheme (and Go package) ed25519
					}
					t.Errorf("%s:%d: %s: %q", doc, n+1, rule.what, m)
				}
			}
		}
	}
}

// configRow is a row of a settings table: | `-flag`, ... | `ENV`, ... | default | meaning |.
var configRow = regexp.MustCompile("^\\| (`-[a-z-]+`(?:, `-[a-z-]+`)*) \\| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \\| ([^|]*) \\|")

// documentedFlags reads the settings tables of a page: each flag with its
// environment variable and its default cell.
func documentedFlags(t *testing.T, doc string) map[string][2]string {
	t.Helper()
	flags := map[string][2]string{}
	for _, line := range strings.Split(readDoc(t, doc), "\n") {
		m := configRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		names, envs := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
		if len(names) != len(envs) {
			t.Errorf("%s: %q: %d flags and %d environment variables", doc, line, len(names), len(envs))
			continue
		}
		for i := range names {
			flags[strings.Trim(names[i], "`-")] = [2]string{strings.Trim(envs[i], "`"), strings.TrimSpace(m[3])}
		}
	}
	return flags
}

// documentedFlagRow is the row of a settings table of doc that documents
// flag.
func documentedFlagRow(t *testing.T, doc, flag string) string {
	t.Helper()
	for _, line := range strings.Split(readDoc(t, doc), "\n") {
		if strings.HasPrefix(line, "| `-"+flag+"` |") {
			return line
		}
	}
	t.Fatalf("%s documents no -%s", doc, flag)
	return ""
}

// sameDefault compares a documented default with a flag's: the first
// value in backquotes, or a parenthesis for an empty one.
func sameDefault(doc, flagDefault string) bool {
	if strings.HasPrefix(doc, "(") {
		return flagDefault == ""
	}
	v, _, ok := strings.Cut(strings.TrimPrefix(doc, "`"), "`")
	if !ok || !strings.HasPrefix(doc, "`") {
		return false
	}
	if a, err := time.ParseDuration(v); err == nil {
		b, err := time.ParseDuration(flagDefault)
		return err == nil && a == b
	}
	return strings.EqualFold(v, flagDefault)
}

// docs/configuration.md lists every flag outboxd has, with its environment
// variable and default, and no flag it does not have; the README's table
// of the settings that matter most agrees with it.
func TestDocsConfigurationListsEveryFlag(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	fs := configFlags(&cfg, io.Discard)
	full := documentedFlags(t, "docs/configuration.md")
	for doc, flags := range map[string]map[string][2]string{"docs/configuration.md": full, "README.md": documentedFlags(t, "README.md")} {
		for name, row := range flags {
			f := fs.Lookup(name)
			if f == nil {
				t.Errorf("%s documents -%s, which outboxd does not have", doc, name)
				continue
			}
			if row[0] != envName(name) {
				t.Errorf("%s: -%s falls back to %s, not %s", doc, name, envName(name), row[0])
			}
			if !sameDefault(row[1], f.DefValue) {
				t.Errorf("%s: -%s defaults to %q; the page says %s", doc, name, f.DefValue, row[1])
			}
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := full[f.Name]; !ok {
			t.Errorf("docs/configuration.md does not document -%s (%s)", f.Name, f.Usage)
		}
	})
}

// docs/operations.md lists every metric family /metrics serves.
func TestDocsOperationsListsEveryMetric(t *testing.T) {
	t.Parallel()
	sources, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	family := regexp.MustCompile(`\.family\("(outboxd_\w+)"`)
	page := readDoc(t, "docs/operations.md")
	found := 0
	for _, f := range sources {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		for _, m := range family.FindAllStringSubmatch(readDoc(t, f), -1) {
			found++
			if !strings.Contains(page, "`"+m[1]+"`") {
				t.Errorf("docs/operations.md does not list the metric %s (%s)", m[1], f)
			}
		}
	}
	if found == 0 {
		t.Error("no metric family found in the sources: the pattern is out of date")
	}
}

// The README's file tables name every source file of the product, and
// only files that exist: they are how a reader finds a stage. The core's
// table names at most 12 files, the ones an event passes through; the
// features around it have a table of their own. A platform variant
// (devdb_linux.go) is covered by its base file (devdb.go).
func TestREADMEFileTableNamesEveryFile(t *testing.T) {
	t.Parallel()
	readme := readDoc(t, "README.md")
	named := map[string]bool{}
	for _, header := range []string{"| file | stage |", "| feature | files |"} {
		start := strings.Index(readme, header)
		if start < 0 {
			t.Fatalf("README.md has no %s table", header)
		}
		table := readme[start:]
		if end := strings.Index(table, "\n\n"); end >= 0 {
			table = table[:end]
		}
		files := regexp.MustCompile("`([a-z_]+\\.(?:go|sql))`").FindAllStringSubmatch(table, -1)
		if header == "| file | stage |" && len(files) > 12 {
			t.Errorf("README.md's core table names %d files, want at most 12", len(files))
		}
		for _, m := range files {
			named[m[1]] = true
			if _, err := os.Stat(m[1]); err != nil {
				t.Errorf("README.md's file table names %s: %v", m[1], err)
			}
		}
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	sql, err := filepath.Glob("*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, sql...) {
		base, _, variant := strings.Cut(f, "_")
		if strings.HasSuffix(f, "_test.go") || named[f] || variant && named[base+".go"] {
			continue
		}
		t.Errorf("README.md's file table does not name %s", f)
	}
}

// The request the README and docs/webhooks.md show carries the
// User-Agent of this release, as a receiver sees it.
func TestExampleRequestNamesThisRelease(t *testing.T) {
	for _, doc := range []string{"README.md", "docs/webhooks.md"} {
		if want := "user-agent: outboxd/" + version + "\n"; !strings.Contains(readDoc(t, doc), want) {
			t.Errorf("%s's example request does not carry %q", doc, strings.TrimSpace(want))
		}
	}
}
