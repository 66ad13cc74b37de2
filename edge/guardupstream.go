package edge

import "net/http"

// GuardUpstream is guard mode with an upstream of its own (`guard {
// upstream URL }`): the guard's scopes, listing filter, Mcp-Param-*
// bindings and pins, as [Guard] has them, and the broker's pass-through
// ([passthrough.PassThrough]) in place of the next handler. The pass-through
// translates the session ids (sealed to the token and the guard's route, as
// Guard's are), sends only the MCP transport's headers and the operator's
// upstream headers, on the pinned origin only, answers a 401, 403 or 407
// with 502, passes only an allow-list of the server's answer headers, and
// audits every call. It costs less than Caddy's reverse_proxy, which the
// guard otherwise runs on top of its own work.
type GuardUpstream struct {
	*Guard
	// Handler is the pass-through to the guarded server.
	Handler http.Handler
}

// ClientAddressed marks the route as one whose upstream calls are audited
// with the client's address. The pass-through never sends the address to
// the server.
func (*GuardUpstream) ClientAddressed() {}

// Serve opens r's task handles, as Guard does, and hands r to the
// pass-through, which translates the session id.
func (g *GuardUpstream) Serve(w http.ResponseWriter, r *http.Request, _ Next) error {
	if g.Tasks != nil {
		var err error
		if r, err = openTasks(w, r, g.Tasks, g.Route, nil); err != nil {
			return err
		}
	}
	g.Handler.ServeHTTP(w, r)
	return nil
}

var _ ClientAddressed = (*GuardUpstream)(nil)
