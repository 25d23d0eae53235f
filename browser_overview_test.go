// browser_overview_test.go: the overview in a browser, as a newcomer
// reads it: the page's margin kept to its foot.

package main

import (
	"strconv"
	"strings"
	"testing"
)

func TestOverviewInBrowser(t *testing.T) {
	t.Parallel()
	db, _ := newTestDB(t)
	srv := newTestAdmin(t, db)
	br := startBrowser(t)
	br.open(srv.URL + "/login")
	br.typeInto("input[name=token]", testToken)
	br.click("form.login button")
	br.find("#backlog")

	// The version footer starts where the page's content does.
	t.Run("footer margin", func(t *testing.T) {
		br := br.in(t)
		var left struct {
			Main   float64 `json:"main"`
			Footer float64 `json:"footer"`
		}
		br.execute(`return {main: document.querySelector('main h1').getBoundingClientRect().left,
			footer: document.querySelector('footer small').getBoundingClientRect().left};`, &left)
		if left.Main == 0 || left.Footer != left.Main {
			t.Errorf("the footer starts at %.0f px, the page's content at %.0f px; want the same", left.Footer, left.Main)
		}
	})
}

// in is d reporting to t, a subtest's.
func (d *webDriver) in(t *testing.T) *webDriver {
	c := *d
	c.t = t
	return &c
}

// figure reads the whole number an element of the page shows.
func figure(t *testing.T, br *webDriver, css string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(br.text(css)))
	if err != nil {
		t.Fatalf("%s shows %q, not a number", css, br.text(css))
	}
	return n
}
