package edge

import (
	"net/http"
	"strings"
)

// EgressPrefix is where the sessions endpoint offers the upstreams that
// sessions may use: <EgressPrefix><name>/mcp.
const EgressPrefix = "/zidane/upstream/"

// EgressURL is the URL at which a session's agent reaches upstream name
// through the gateway at base.
func EgressURL(base, name string) string { return base + EgressPrefix + name + "/mcp" }

// EgressRoute is the route of a request path on a site whose own route is
// own: under EgressPrefix<name>/, the egress route of upstream name that
// egress offers to sessions (a 404 for one it does not offer); elsewhere,
// and on a site that offers none (nil egress), own.
func EgressRoute(path string, own Route, egress map[string]Route) (Route, Verdict) {
	if egress == nil {
		return own, Verdict{}
	}
	rest, ok := strings.CutPrefix(path, EgressPrefix)
	if !ok {
		return own, Verdict{}
	}
	name, _, _ := strings.Cut(rest, "/")
	if r, ok := egress[name]; ok {
		return r, Verdict{}
	}
	return nil, Refuse(http.StatusNotFound, "no_upstream",
		"no upstream is offered to sessions at this path; see session_upstreams in the zidane global option")
}
