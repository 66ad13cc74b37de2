package edge

import (
	"net/http"
	"testing"
)

// On the sessions endpoint, a path under the egress prefix reaches the
// upstream it names when sessions are offered it, and is refused 404 when
// not: it never falls back to the endpoint's own route. Everywhere else,
// and on a site that offers sessions no upstream, the site's own route
// serves.
func TestEgressRoute(t *testing.T) {
	own, gh := &Guard{Route: "own"}, &Guard{Route: "gh"}
	egress := map[string]Route{"gh": gh}
	for _, c := range []struct {
		path   string
		egress map[string]Route
		want   Route
		status int
	}{
		{"/mcp", egress, own, 0},
		{EgressPrefix + "gh/mcp", egress, gh, 0},
		{EgressPrefix + "gh", egress, gh, 0},
		{EgressPrefix + "linear/mcp", egress, nil, http.StatusNotFound},
		{EgressPrefix + "/mcp", egress, nil, http.StatusNotFound},
		{EgressPrefix + "gh/mcp", nil, own, 0},
	} {
		got, v := EgressRoute(c.path, own, c.egress)
		if got != c.want || v.Status != c.status || (c.status != 0 && v.Reason != "no_upstream") {
			t.Errorf("%s (egress %v): %v %+v, want %v %d", c.path, c.egress != nil, got, v, c.want, c.status)
		}
	}
	if got := EgressURL("https://gw.example", "gh"); got != "https://gw.example/zidane/upstream/gh/mcp" {
		t.Errorf("EgressURL: %s", got)
	}
}
