package edge

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// Guard is guard mode: what the scope map allows goes to the next handler,
// such as reverse_proxy to an MCP server. The guarded server chooses every
// byte of its answers, so the guard binds what it hands out and keeps back
// what would speak for the gateway:
//
//   - Mcp-Session-Id is translated both ways, as on the broker's
//     pass-through route: the client gets the server's id sealed to its
//     token and this route ([sessionid.Sealer]), and a request's id is
//     opened before it goes on. An id given to another token, or to
//     another guarded site, gets 404, which tells a client to initialize
//     again; the server never sees it.
//   - WWW-Authenticate, Proxy-Authenticate, Set-Cookie, the server's CORS
//     headers and its Clear-Site-Data, Alt-Svc and
//     Strict-Transport-Security never reach the client: a challenge would
//     send the client to the server's authorization server, a cookie would
//     be set for the gateway's origin, and CORS and the origin-wide headers
//     are the gateway's to answer. The edge's own stay.
//   - Trailers pass neither way: the client's were not read by the edge,
//     and the server's would carry what its headers may not (and, on a
//     JSON answer, whose status the listing filter sends last, would
//     become headers).
//   - A 401, 403 or 407 from the server refused the gateway's request (the
//     client's token passed the edge, and the server sees the operator's
//     upstream_header, if any): it becomes 502 with a message for the
//     operator, and the server's body is dropped.
type Guard struct {
	Scopes *policy.ScopeMap
	// Rules are the operator's rules over calls (see ruleVerdict).
	Rules *rules.Set
	// Prepare, when set, runs on each request passed on: it sets the
	// operator's upstream headers.
	Prepare func(*http.Request)
	// IDs seals the server's session ids; required.
	IDs *sessionid.Sealer
	// Route names this guarded site in its sealed ids, so that an id
	// opens on no other: such as "guard:" and the site's resource URL.
	Route string
	// Params is what the guard learned of the server's x-mcp-header
	// bindings, to check Mcp-Param-* headers against; the zero value
	// starts empty.
	Params ParamHeaders
	// SharedParams, when set, is used instead of Params: a store kept
	// across config reloads, so that a reload does not forget what the
	// route learned and refuse its clients' Mcp-Param-* headers until they
	// list tools again.
	SharedParams *ParamHeaders
	// Pins, when set, pins what the server gives a model to read (its
	// tools, prompts, resources, resource templates, instructions and
	// serverInfo) under the namespace PinNS (see package pins).
	Pins  *pins.Store
	PinNS string
	// Tasks, when set, binds the server's task ids (MCP 2026-07-28's
	// Tasks extension) to the token and Route: clients get handles, and
	// the server sees only its ids of the token's own tasks (see
	// tasks.go).
	Tasks *taskid.Sealer
}

func (g *Guard) bindsTasks() bool { return g.Tasks != nil }

func (g *Guard) pin(_ Kind, name string) (*pins.Store, string, string) { return g.Pins, g.PinNS, name }

func (g *Guard) pinServer() (*pins.Store, string) { return g.Pins, g.PinNS }

func (g *Guard) pinSets() (*pins.Store, []string) { return g.Pins, []string{g.PinNS} }

func (g *Guard) paramHeaders() *ParamHeaders {
	if g.SharedParams != nil {
		return g.SharedParams
	}
	return &g.Params
}

// Admit admits every authenticated principal.
func (*Guard) Admit(policy.Principal) Verdict { return Verdict{} }

// Authorize decides c by the rules and the scope map.
func (g *Guard) Authorize(p policy.Principal, c message.Call) Verdict {
	return ruleVerdict(g.Rules, RuleRouteGuard, p, c, "", true, scopeVerdict(g.Scopes, p, c))
}

// Visible shows what the rules and the scope map let p use.
func (g *Guard) Visible(p policy.Principal, it Item) bool {
	return ruleVisible(g.Rules, RuleRouteGuard, p, it, "", true, scopeVisible(g.Scopes, p, it))
}

// Serve opens the request's session id and task handles and passes r on,
// with the answer's headers bound and stripped as the type's doc says.
func (g *Guard) Serve(w http.ResponseWriter, r *http.Request, next Next) error {
	p, _ := policy.PrincipalFrom(r.Context())
	if g.Tasks != nil {
		var err error
		if r, err = openTasks(w, r, g.Tasks, g.Route, nil); err != nil {
			return err
		}
	}
	gw := &guardWriter{ResponseWriter: w, g: g, p: p}
	for k := range r.Header {
		// A server behind may read a name with _ for - as the session id
		// (CGI and WSGI map both to HTTP_MCP_SESSION_ID): one the guard
		// never opened.
		if strings.IndexByte(k, '_') >= 0 && strings.EqualFold(strings.ReplaceAll(k, "_", "-"), headerSessionID) {
			return &RefusalError{Refuse(http.StatusBadRequest, "session_repeated",
				fmt.Sprintf("header %q is spelled with _ where Mcp-Session-Id has -: send one Mcp-Session-Id header", k))}
		}
	}
	switch values := r.Header.Values(headerSessionID); {
	case len(values) > 1:
		return &RefusalError{Refuse(http.StatusBadRequest, "session_repeated",
			"the request carried more than one Mcp-Session-Id; send one")}
	case len(values) == 1:
		upstream, err := g.IDs.Open(values[0], p.TokenID, g.Route)
		if err != nil {
			v := Refuse(http.StatusNotFound, "session_unknown",
				"unknown session: this Mcp-Session-Id was not issued to this token on this endpoint, or is no longer valid; start a new session by initializing again without Mcp-Session-Id")
			v.Code = message.CodeUnknownSession
			return &RefusalError{v}
		}
		gw.clientSID, gw.upstreamSID = values[0], upstream
		// A new slice: the one the request came with may be shared by
		// whatever set it (a handler before this one).
		r.Header[headerSessionID] = []string{upstream}
	}
	// The edge's own CORS and origin-wide headers, set before the route
	// runs: the only ones the client gets.
	for k, v := range w.Header() {
		if isEdgeHeader(k) {
			gw.own = append(gw.own, ownHeader{k, v})
		}
	}
	if g.Prepare != nil {
		g.Prepare(r)
	}
	// The client's trailers are no part of what the edge read and decided
	// on; reverse_proxy would forward them to the server.
	r.Trailer = nil
	defer gw.restore()
	return next.ServeHTTP(gw, r)
}

const headerSessionID = "Mcp-Session-Id"

// RefusalError is what a route's Serve returns when it refuses a request
// before writing anything: the edge answers and audits the verdict as it
// does its own refusals.
type RefusalError struct{ Verdict Verdict }

func (e *RefusalError) Error() string { return e.Verdict.Reason + ": " + e.Verdict.Message }

type ownHeader struct {
	name   string
	values []string
}

// isEdgeHeader reports whether a header is the edge's to send, never the
// server's: CORS, and what speaks for the gateway's whole origin in a
// browser (Clear-Site-Data would wipe its cookies and storage, Alt-Svc send
// its later requests elsewhere, Strict-Transport-Security pin its
// subdomains).
func isEdgeHeader(name string) bool {
	if len(name) > len("Access-Control-") && strings.EqualFold(name[:len("Access-Control-")], "Access-Control-") {
		return true
	}
	for _, n := range [...]string{"Clear-Site-Data", "Alt-Svc", "Strict-Transport-Security"} {
		if strings.EqualFold(name, n) {
			return true
		}
	}
	return false
}

// guardWriter rewrites the guarded server's answer headers (see [Guard]).
type guardWriter struct {
	http.ResponseWriter
	g                      *Guard
	p                      policy.Principal
	clientSID, upstreamSID string
	own                    []ownHeader // the edge's own headers (isEdgeHeader)
	wrote                  bool
	refused                bool // a 401/403/407 was replaced: its body is dropped
	// sent is the header as it went on with the final status (sentBuf
	// holds it for most answers). What the route sets after it
	// (reverse_proxy copies the server's trailers into the header map with
	// Header.Add) is put back to it before the handler returns: the listing
	// filter sends a JSON answer's status only then, and net/http sends
	// trailers only then. It shares the value slices: Add and Set after the
	// status give a key another slice, or grow one past the length kept.
	sent     []ownHeader
	snapshot bool
	sentBuf  [10]ownHeader
}

// keep records h as it goes on with the final status.
func (w *guardWriter) keep(h http.Header) {
	w.sent, w.snapshot = w.sentBuf[:0], true
	for k, v := range h {
		w.sent = append(w.sent, ownHeader{k, v[:len(v):len(v)]})
	}
}

// restore undoes what was set on the header after the final status.
func (w *guardWriter) restore() {
	if !w.snapshot {
		return
	}
	h := w.Header()
	if w.unchanged(h) {
		return // most answers: nothing to undo, and no map to rebuild
	}
	clear(h)
	for _, c := range w.sent {
		h[c.name] = c.values
	}
}

// unchanged reports whether h holds what keep recorded, as it was: the
// same keys, each with the same values in the same slice (a value set or
// added after the status has another slice, or a longer one). A
// Content-Length that was not there is no change: the listing filter
// around this writer sets the length of the JSON answer it holds when it
// sends it, after the route's status went through here. One the route adds
// after the status (reverse_proxy copies an HTTP/2 server's Content-Length
// trailer so) goes nowhere either: a held answer's length is the filter's,
// which overwrites it, and any other answer's headers have gone.
func (w *guardWriter) unchanged(h http.Header) bool {
	n := len(h)
	if _, ok := h["Content-Length"]; ok {
		n--
		for _, c := range w.sent {
			if c.name == "Content-Length" {
				n++
				break
			}
		}
	}
	if n != len(w.sent) {
		return false
	}
	for _, c := range w.sent {
		v, ok := h[c.name]
		if !ok || len(v) != len(c.values) || (len(v) > 0 && &v[0] != &c.values[0]) {
			return false
		}
	}
	return true
}

// dropTrailers removes what would declare trailers: the guarded server's
// trailers are never passed on.
func dropTrailers(h http.Header) {
	delete(h, "Trailer")
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			delete(h, k)
		}
	}
}

// strippedHeaders are the server's answer headers the client never gets.
var strippedHeaders = []string{"Www-Authenticate", "Proxy-Authenticate", "Set-Cookie", "Set-Cookie2"}

func (w *guardWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	h := w.Header()
	for _, name := range strippedHeaders {
		delete(h, name)
	}
	for k := range h {
		if isEdgeHeader(k) {
			delete(h, k)
		}
	}
	for _, c := range w.own {
		h[c.name] = c.values
	}
	dropTrailers(h)
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		// Early hints pass, without what the final answer may not carry.
		delete(h, headerSessionID)
		w.ResponseWriter.WriteHeader(status)
		return
	}
	w.wrote = true
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired:
		w.refused = true
		w.replace(http.StatusBadGateway, fmt.Sprintf("the MCP server behind this gateway refused the gateway's request (HTTP %d); your own token is fine: ask the operator to check the credentials the gateway sends it (guard upstream_header)", status))
		return
	}
	switch sids := h.Values(headerSessionID); {
	case len(sids) == 0:
	case len(sids) > 1 || !sessionid.Valid(sids[0]):
		w.refused = true
		w.replace(http.StatusBadGateway, "the MCP server behind this gateway gave an invalid session id; ask the operator to check the server")
		return
	case sids[0] == w.upstreamSID:
		// The client's own id again: clients take a changed id for an
		// error, and servers repeat theirs on every answer.
		h[headerSessionID] = []string{w.clientSID}
	default:
		h[headerSessionID] = []string{w.g.IDs.Seal(sids[0], w.p.TokenID, w.g.Route)}
	}
	w.ResponseWriter.WriteHeader(status)
	w.keep(h)
}

// replace answers with a JSON-RPC error of the gateway's own instead of
// the server's answer.
func (w *guardWriter) replace(status int, msg string) {
	h := w.Header()
	for k := range h {
		if !isEdgeHeader(k) && k != "Vary" {
			delete(h, k)
		}
	}
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.ResponseWriter.WriteHeader(status)
	w.keep(h)
	body := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":%q}}`, message.CodeUpstream, msg)
	w.ResponseWriter.Write(body)
}

func (w *guardWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.refused {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes a flush on, once the headers have gone.
func (w *guardWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.refused {
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *guardWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
