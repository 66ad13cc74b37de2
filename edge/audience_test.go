package edge

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// TestAudience: a credential issued for one resource (a grant of the
// gateway's authorization server, RFC 8707) is refused at any other, 401
// invalid_token; a credential that names no resource (an operator's token,
// a JWT, whose audience its verifier checked) passes.
func TestAudience(t *testing.T) {
	site, _ := url.Parse("https://mcp.example.com/mcp")
	relative, _ := url.Parse("/mcp")
	for _, tc := range []struct {
		name     string
		resource string
		site     *url.URL
		ok       bool
	}{
		{"a grant for this resource", "https://mcp.example.com/mcp", site, true},
		{"no resource (an operator's token)", "", site, true},
		{"a grant for another resource on the same host", "https://mcp.example.com/other", site, false},
		{"a grant for another host", "https://evil.example/mcp", site, false},
		{"a grant for the resource with a trailing slash", "https://mcp.example.com/mcp/", site, false},
		{"a grant at a site whose resource is a path alone", "https://mcp.example.com/mcp", relative, false},
	} {
		v := CheckAudience(policy.Principal{TokenID: "grt_1", Resource: tc.resource}, tc.site)
		if v.Allowed() != tc.ok {
			t.Errorf("%s: allowed %v, want %v", tc.name, v.Allowed(), tc.ok)
		}
		if !tc.ok && (v.Status != http.StatusUnauthorized || v.Reason != ReasonInvalidToken || !strings.Contains(v.Message, "another resource")) {
			t.Errorf("%s: %+v, want 401 invalid_token saying the token is for another resource", tc.name, v)
		}
	}
}
