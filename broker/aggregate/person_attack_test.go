package aggregate

import (
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
)

// TestAggregatePerUserToolsDenyHolds: an operator's tools allow/deny of a
// per_user upstream holds for calls as for listings: a person who is
// connected calls a tool the lists keep back, by its name or a case
// variant the upstream might resolve to it, and it never reaches the
// upstream (it is not offered, as a shared upstream's is not).
func TestAggregatePerUserToolsDenyHolds(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*upstream.Config)
		tool string
	}{
		{"denied", func(c *upstream.Config) { c.ToolsDeny = []string{"progress"} }, "mcp_people_progress"},
		{"denied, another case", func(c *upstream.Config) { c.ToolsDeny = []string{"progress"} }, "mcp_people_PROGRESS"},
		{"not allowed", func(c *upstream.Config) { c.ToolsAllow = []string{"whoami"} }, "mcp_people_progress"},
	} {
		for _, version := range []string{"2025-11-25", ""} {
			t.Run(tc.name+"/"+version, func(t *testing.T) {
				pu := newPersonUp(t)
				ppl := &people{connected: map[string]bool{"alice": true}}
				cfg := upstream.Config{Name: "people", URL: pu.http.URL}
				tc.cfg(&cfg)
				_, url := personServeCfg(t, newAggUp(t, "shared").config(), cfg, ppl, Options{})
				alice := personClient(t, url, version, "alice")
				if got, isErr := callText(t, alice, "mcp_people_whoami"); isErr || got != "whoami: alice" {
					t.Fatalf("alice's allowed call: %q (error %v)", got, isErr)
				}
				got, isErr := callText(t, alice, tc.tool)
				// The route's refusal names the tool as the route offers
				// it; the upstream's would name its own.
				if !isErr || !strings.Contains(got, `unknown tool "`+tc.tool+`"`) {
					t.Errorf("alice's call of %s, kept back by the upstream's lists: %q (error %v), want it refused as an unknown tool", tc.tool, got, isErr)
				}
				if strings.Contains(got, "done") || strings.Contains(got, "answered") {
					t.Errorf("the kept-back tool %s ran upstream: %q", tc.tool, got)
				}
			})
		}
	}
}
