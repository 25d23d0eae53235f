package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// The events list says where an event went in coloured badges, each with
// why and the endpoints it names: "delivered 3", "2 retrying, breaker
// open", "1 endpoint disabled"; and the jobs list names endpoints, not
// ids, each a link to its page.
func TestEventBadgesSayWhyAndNameEndpoints(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	api := newTestAPI(t, db, testPolicy)
	var eps []int64
	for _, host := range []string{"a", "b", "c", "d", "e", "f"} {
		eps = append(eps, api.createEndpoint("https://"+host+".example/hook").ID)
	}
	mustExec(t, db, `UPDATE outbox.endpoints SET description = 'Orders service' WHERE id = $1`, eps[0])
	ev := record(t, db, "order.paid", "o-1")
	relayAll(t, db)
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'completed', attempt = 1, attempted_at = now(), finalized_at = now()
WHERE endpoint_id = ANY($1::bigint[])`, fmt.Sprintf("{%d,%d,%d}", eps[0], eps[1], eps[2]))
	mustExec(t, db, `UPDATE outbox.jobs SET state = 'retryable', attempt = 5, attempted_at = now(), scheduled_at = now() + interval '5 minutes'
WHERE endpoint_id = ANY($1::bigint[])`, fmt.Sprintf("{%d,%d}", eps[3], eps[4]))
	mustExec(t, db, `UPDATE outbox.endpoints SET consecutive_failures = 5, breaker_opened_at = now(), failing_since = now()
WHERE id = ANY($1::bigint[])`, fmt.Sprintf("{%d,%d}", eps[3], eps[4]))
	mustExec(t, db, `UPDATE outbox.endpoints SET disabled_at = now(), disabled_reason = 'by hand' WHERE id = $1`, eps[5])

	_, page := panelPage(t, api.srv, "/events")
	row := regexp.MustCompile(fmt.Sprintf(`(?s)<a href="/events/%d">.*?</tr>`, ev)).FindString(page)
	outcome := regexp.MustCompile(`(?s)<td class="outcome">.*?</td>`).FindString(row)
	want := fmt.Sprintf(`<td class="outcome"><div><span class="badge badge-ok">delivered 3</span> `+
		`<a href="/endpoints/%d">Orders service</a>, <a href="/endpoints/%d">https://b.example/hook</a>, <a href="/endpoints/%d">https://c.example/hook</a></div>`+
		`<div><span class="badge badge-bad">1 endpoint disabled</span> <a href="/endpoints/%d">https://f.example/hook</a></div>`+
		`<div><span class="badge badge-warn">2 retrying, breaker open</span> <a href="/endpoints/%d">https://d.example/hook</a>, <a href="/endpoints/%d">https://e.example/hook</a></div></td>`,
		eps[0], eps[1], eps[2], eps[5], eps[3], eps[4])
	if outcome != want {
		t.Errorf("the event's outcome reads\n%s\nwant\n%s", outcome, want)
	}

	_, jobs := panelPage(t, api.srv, "/jobs")
	if cell := fmt.Sprintf(`<td><a href="/endpoints/%d">Orders service</a></td>`, eps[0]); !strings.Contains(jobs, cell) {
		t.Errorf("the jobs list does not name endpoint %d by its description in a link to its page (%s):\n%s", eps[0], cell, jobs)
	}
	if cell := fmt.Sprintf(`<td><a href="/endpoints/%d">https://b.example/hook</a></td>`, eps[1]); !strings.Contains(jobs, cell) {
		t.Errorf("the jobs list does not name an endpoint without a description by its URL (%s)", cell)
	}
	_, filtered := panelPage(t, api.srv, fmt.Sprintf("/jobs?endpoint_id=%d", eps[0]))
	if h1 := regexp.MustCompile(`<h1>.*?</h1>`).FindString(filtered); !strings.Contains(h1, ">Orders service</a>") {
		t.Errorf("the filtered jobs list's heading %s does not name the endpoint", h1)
	}
}
