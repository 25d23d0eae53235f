package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// The jobs page's state links carry their counts and mark the current
// one; a job's timestamps are one short line, the absolute time on hover,
// so that a screen holds more than a dozen rows.
func TestJobsPageStateLinksCountAndTimesDoNotWrap(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	ep := api.createEndpoint("https://a.example/hook", "order.*")
	mustExec(t, db, `SELECT outbox.record('order.paid', 'order-' || i, '{}') FROM generate_series(1, 3) AS i`)
	relay := newTestRelay(t, db, defaultConfig().Relay)
	if res, err := relay.relayOnce(context.Background()); err != nil || res.Jobs != 3 {
		t.Fatalf("relay pass: %+v, %v; want 3 jobs", res, err)
	}
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'discarded', attempt = 1, attempted_at = now(), finalized_at = now(),
  errors = jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', 'webhook: answered 500 Internal Server Error'))
WHERE id = (SELECT min(id) FROM outbox.jobs WHERE endpoint_id = $1)`, ep.ID)

	status, page := panelPage(t, api.srv, "/jobs?state=discarded")
	if status != http.StatusOK {
		t.Fatalf("GET /jobs?state=discarded: %d\n%s", status, page)
	}
	links := regexp.MustCompile(`(?s)<p class="states">.*?</p>`).FindString(page)
	for _, want := range []string{
		`<a href="/jobs?state=">all <span class="count">3</span></a>`,
		`<a href="/jobs?state=available">available <span class="count">2</span></a>`,
		`<a href="/jobs?state=running">running <span class="count">0</span></a>`,
		`<a href="/jobs?state=discarded" class="current" aria-current="page">discarded <span class="count">1</span></a>`,
	} {
		if !strings.Contains(links, want) {
			t.Errorf("state links lack %s:\n%s", want, links)
		}
	}
	if strings.Count(links, `class="current"`) != 1 {
		t.Errorf("state links mark %d as current, want 1:\n%s", strings.Count(links, `class="current"`), links)
	}
	// The error's time: relative, with the absolute time only in its title.
	errTime := regexp.MustCompile(`<div class="err">#1 <time datetime="[^"]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">[^<]+</time>: webhook: answered 500`)
	if !errTime.MatchString(page) {
		t.Errorf("the discarded job's error time is not a short time with the absolute one in its title:\n%s", page)
	}
	resp, err := http.Get(api.srv.URL + "/static/style.css")
	if err != nil {
		t.Fatal(err)
	}
	css, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^[^{]*\btime\b[^{]*\{[^}]*white-space: nowrap`).Match(css) {
		t.Errorf("style.css does not keep a time on one line:\n%s", css)
	}
}
