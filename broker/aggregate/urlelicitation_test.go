package aggregate

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// URLElicitation reads what a session's initialize declared, for the token
// that opened it only: another token's request naming the session, a
// session without the capability, an unknown session id and a 2026-07-28
// request each read false.
func TestURLElicitationOfASession(t *testing.T) {
	up := newAggUp(t, "a")
	a, url := aggServe(t, []upstream.Config{up.config()}, Options{})
	with := aggConnect(t, url, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}})
	without := aggConnect(t, url, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}}}})
	// A request of each session once initialized: the route knows it then.
	for _, cs := range []*mcp.ClientSession{with, without} {
		aggToolNames(t, t.Context(), cs)
	}
	alice, bob := policy.Principal{TokenID: "tok-1"}, policy.Principal{TokenID: "tok-2"}
	request := func(sid, version string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Header.Set(upstream.HeaderSessionID, sid)
		r.Header.Set("Mcp-Protocol-Version", version)
		return r
	}
	for _, c := range []struct {
		name string
		r    *http.Request
		p    policy.Principal
		want bool
	}{
		{"the session that declared it", request(with.ID(), "2025-11-25"), alice, true},
		{"another token naming that session", request(with.ID(), "2025-11-25"), bob, false},
		{"a session that declared form elicitation only", request(without.ID(), "2025-11-25"), alice, false},
		{"an unknown session id", request("not-a-session", "2025-11-25"), alice, false},
		{"no session id", request("", "2025-11-25"), alice, false},
		{"a 2026-07-28 request", request(with.ID(), "2026-07-28"), alice, false},
	} {
		if got := a.URLElicitation(c.r, c.p); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
