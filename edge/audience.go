package edge

import (
	"net/http"
	"net/url"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// CheckAudience refuses a credential issued for another resource than the
// site's (RFC 8707, and the MCP rule that a server takes only tokens
// issued for it): a grant of the gateway's authorization server names its
// one resource, and is good at that URL alone, compared exactly as it was
// issued. A credential that names none (an operator's token; a JWT, whose
// audience its verifier checked) is not this check's. A site whose
// resource is a path alone takes no grant: the host of its URL would be
// the client's Host header.
func CheckAudience(p policy.Principal, resource *url.URL) Verdict {
	if p.Resource == "" {
		return Verdict{}
	}
	if !resource.IsAbs() || p.Resource != resource.String() {
		return Refuse(http.StatusUnauthorized, ReasonInvalidToken,
			"the token was issued for another resource ("+p.Resource+"); sign in again for this server's resource")
	}
	return Verdict{}
}
