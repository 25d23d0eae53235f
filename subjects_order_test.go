package main

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The subject index lists a trailing number by its value (1, 2, 10, 100,
// not 1, 10, 100, 2), across pages too, and keeps outboxd's own events
// (an alert about endpoint 1 has subject "1") apart from the user's.
func TestSubjectsNaturalOrderAndInternalApart(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	ctx := context.Background()
	mustExec(t, db, `
INSERT INTO outbox.subjects (subject, topic, last_event_id, payload, updated_at)
VALUES ('100', 'order.updated', 1, '{}', now()), ('10', 'order.updated', 2, '{}', now()),
       ('2', 'order.updated', 3, '{}', now()), ('1', 'order.updated', 4, '{}', now()),
       ('order-10', 'order.updated', 5, '{}', now()), ('order-2', 'order.updated', 6, '{}', now()),
       ('1', 'outboxd.endpoint.failing', 7, '{}', now())`)

	names := func(entries []SubjectEntry) []string {
		var out []string
		for _, e := range entries {
			out = append(out, e.Subject+" "+e.Topic)
		}
		return out
	}
	want := []string{"1 order.updated", "2 order.updated", "10 order.updated", "100 order.updated",
		"order-2 order.updated", "order-10 order.updated"}
	all, err := listSubjects(ctx, db, "", subjectCursor{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, names(all)); diff != "" {
		t.Errorf("subjects (-want +got):\n%s", diff)
	}
	var paged []SubjectEntry
	for after := (subjectCursor{}); ; {
		page, err := listSubjects(ctx, db, "", after, 4)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, page...)
		if len(page) < 4 {
			break
		}
		after = cursorAfter(page)
	}
	if diff := cmp.Diff(want, names(paged)); diff != "" {
		t.Errorf("subjects by pages of 4 (-want +got):\n%s", diff)
	}
	internal, err := listInternalSubjects(ctx, db, "", subjectCursor{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"1 outboxd.endpoint.failing"}, names(internal)); diff != "" {
		t.Errorf("outboxd's own subjects (-want +got):\n%s", diff)
	}

	api := newTestAPI(t, db, testPolicy)
	var answer struct{ Subjects []SubjectEntry }
	if status := apiCall(t, api.srv, "GET", "/api/subjects", "", &answer); status != http.StatusOK {
		t.Fatalf("GET /api/subjects: %d", status)
	}
	if diff := cmp.Diff(want, names(answer.Subjects)); diff != "" {
		t.Errorf("GET /api/subjects (-want +got):\n%s", diff)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	resp, err := browser.PostForm(api.srv.URL+"/login", url.Values{"token": {testToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for path, wantTopic := range map[string]string{"/subjects": "order.updated", "/subjects?internal=1": "outboxd.endpoint.failing"} {
		resp, err := browser.Get(api.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		html, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		other := "outboxd.endpoint.failing"
		if wantTopic == other {
			other = "order.updated"
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(html), "<td>"+wantTopic+"</td>") || strings.Contains(string(html), "<td>"+other+"</td>") {
			t.Errorf("panel %s: %d, want %s listed and not %s\n%s", path, resp.StatusCode, wantTopic, other, html)
		}
	}
}
