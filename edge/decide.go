package edge

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The 2026-07-28 headers that name what a request does. A server may route
// on them, so they must say what the body says.
const (
	methodHeader  = "Mcp-Method"
	nameHeader    = "Mcp-Name"
	versionHeader = "Mcp-Protocol-Version"
	// modernVersion is the first version whose requests carry these
	// headers and their version in _meta.
	modernVersion = message.ModernVersion
)

// Decision is the outcome of [Decide].
type Decision struct {
	// Body is the body as read; nil for a request without one, or when the
	// body was refused before it could be read.
	Body *message.Body
	// Verdict allows, or refuses the request as a whole.
	Verdict
	// Call is the message refused, when one was.
	Call message.Call
	// Ruled are the calls of an allowed body that an operator's allow
	// rule let through, each to be audited with its rule.
	Ruled []RuleDecision
	// URLElicitation is the caller's to set before [Approvals.Settle]: the
	// request's session declared URL elicitation at its initialize (a
	// 2025-11-25 client; a 2026-07-28 request says so in its own _meta).
	URLElicitation bool
}

// Decide is steps 3 and 4 of the request path for an authenticated
// principal: it reads a POST body once and authorizes every message of it
// on route. A body is refused whole when any message of it is: a batch is
// allowed only when each of its messages would be on its own. httpMethod
// and header are the request's; body is a POST's (nil otherwise).
//
// Refusals: 400 ambiguous_body for a body that two readers could read
// differently (see package message), 400 malformed for one that is not a
// JSON-RPC message, 404 method_not_found (-32601) for a method that the
// request's protocol version removed (see message.Call.Removed), 400 header_mismatch when the 2026-07-28 Mcp-Method,
// Mcp-Name or Mcp-Param-* header says something else than the body (or a
// 2026-07-28 request lacks them, or its _meta version is not the
// header's, or the route cannot check a Mcp-Param-* header: see
// [ParamHeaders]), on a route that binds task handles the Tasks
// extension's removed methods (-32601) and its methods undeclared (-32021,
// see tasks.go), a tool error (tool_changed) for a call of a tool whose
// pinned definition changed or that is new to its pinned set, 403
// prompt_changed or resource_changed for the use of a changed prompt or
// resource (see package pins), and whatever the route refuses (403
// insufficient_scope, mostly, and 403 denied_by_rule: see ruleVerdict).
func Decide(route Route, p policy.Principal, httpMethod string, header http.Header, body []byte) Decision {
	if v := route.Admit(p); !v.Allowed() {
		return Decision{Verdict: v}
	}
	if httpMethod != http.MethodPost {
		return Decision{}
	}
	b, err := message.Read(body)
	if err != nil {
		return Decision{Verdict: readRefusal(err)}
	}
	if v, c := checkHeaders(header, b); !v.Allowed() {
		return Decision{Body: b, Verdict: v, Call: c}
	}
	// After checkHeaders, which bound the _meta version that makes a method
	// removed to the header's.
	for _, c := range b.Calls {
		if c.Removed() {
			return Decision{Body: b, Verdict: removedMethod(c), Call: c}
		}
	}
	if v, c := checkParamHeaders(header, b, paramsOf(route), header.Get(versionHeader)); !v.Allowed() {
		return Decision{Body: b, Verdict: v, Call: c}
	}
	tasks := routeOffersTasks(route)
	var ruled []RuleDecision
	for _, c := range b.Calls {
		if tasks {
			if v := taskVerdict(c, header.Get(versionHeader)); !v.Allowed() {
				return Decision{Body: b, Verdict: v, Call: c}
			}
		}
		v := route.Authorize(p, c)
		if v.Held != nil {
			return Decision{Body: b, Verdict: heldVerdict(route, c, b.Batch, v), Call: c}
		}
		if !v.Allowed() {
			return Decision{Body: b, Verdict: v, Call: c}
		}
		if v.Rule != "" {
			ruled = append(ruled, RuleDecision{Call: c, Rule: v.Rule, Effect: v.RuleEffect})
		}
		if v := pinVerdict(route, c, b.Batch); !v.Allowed() {
			return Decision{Body: b, Verdict: v, Call: c}
		}
	}
	return Decision{Body: b, Ruled: ruled}
}

// removedMethod is the refusal of c, a message of a method its protocol
// version removed: 404 with -32601, as go-sdk's server answers it. Nothing
// is passed on: the edge read nothing of what the method took (see
// message.Call.Removed), so a route would authorize a call it cannot see.
func removedMethod(c message.Call) Verdict {
	return Verdict{Status: http.StatusNotFound, Reason: ReasonMethodNotFound, Code: message.CodeMethodNotFound,
		Message: fmt.Sprintf("method %q is not part of MCP %s, which this request names: %s", clip(c.Method), c.MetaVersion, removedHint(c.Method))}
}

// removedHint says what a client of the stateless protocol does instead.
func removedHint(method string) string {
	switch method {
	case "resources/subscribe", "resources/unsubscribe":
		return "listen for notifications/resources/updated with subscriptions/listen"
	case "logging/setLevel":
		return "ask for log messages per request with _meta io.modelcontextprotocol/logLevel"
	case "initialize":
		return "send each request with its _meta (protocol version, client info and capabilities), and ask server/discover what the server speaks"
	}
	return "send the requests themselves, each with its _meta"
}

// readRefusal turns a reading error into its refusal. The error's message
// never quotes the body.
func readRefusal(err error) Verdict {
	v := Verdict{Status: http.StatusBadRequest, Reason: ReasonMalformed, Code: message.CodeInvalidRequest}
	switch {
	case errors.Is(err, message.ErrAmbiguous):
		v.Reason = ReasonAmbiguous
		v.Message = err.Error() + "; the edge refuses a message that two JSON readers could read differently: send each key once, spelled exactly as the protocol spells it"
	case errors.Is(err, message.ErrSyntax):
		v.Code = message.CodeParseError
		v.Message = err.Error() + "; send a JSON-RPC 2.0 message or batch"
	default:
		v.Message = err.Error() + "; send a JSON-RPC 2.0 message or batch"
	}
	return v
}

// checkHeaders refuses a body whose Mcp-Method or Mcp-Name header (MCP
// 2026-07-28) says something else than the body does, whose _meta protocol
// version is not the Mcp-Protocol-Version header's, or that is a 2026-07-28
// request on its own without those headers.
func checkHeaders(header http.Header, b *message.Body) (Verdict, message.Call) {
	// A server behind may read a header named with _ for - as the same
	// one (CGI and WSGI map both to HTTP_MCP_METHOD), which the check below
	// would not see: such a spelling is refused.
	for k := range header {
		if strings.IndexByte(k, '_') < 0 {
			continue
		}
		if n := strings.ReplaceAll(k, "_", "-"); strings.EqualFold(n, methodHeader) || strings.EqualFold(n, nameHeader) || strings.EqualFold(n, versionHeader) {
			return Verdict{Status: http.StatusBadRequest, Reason: "header_mismatch", Code: message.CodeHeaderMismatch,
				Message: fmt.Sprintf("header %q is spelled with _ where Mcp-Method, Mcp-Name and Mcp-Protocol-Version have -: send them spelled so", k)}, message.Call{}
		}
	}
	methods, names := header.Values(methodHeader), header.Values(nameHeader)
	mismatch := func(c message.Call, msg string) (Verdict, message.Call) {
		return Verdict{Status: http.StatusBadRequest, Reason: "header_mismatch", Code: message.CodeHeaderMismatch, Message: msg}, c
	}
	// The protocol version, which decides how a server reads the request,
	// is said twice in 2026-07-28: in the header and in each request's
	// _meta. They must agree (go-sdk refuses a mismatch too, but a server
	// that reads one of them only would act on what the edge did not
	// check). A 2026-07-28 request on its own must name its method, and
	// what it calls, in the headers: go-sdk's server requires them, and a
	// server that routes on them must not see them absent.
	version := header.Get(versionHeader)
	for _, c := range b.Calls {
		if c.IsResponse() {
			continue
		}
		meta, present, ok := c.MetaVersion, c.HasMetaVersion, !c.HasMetaVersion || c.MetaVersion != ""
		switch {
		case !ok:
			return mismatch(c, fmt.Sprintf("_meta %q must be a protocol version string, such as %q", message.MetaVersionKey, modernVersion))
		case present && version == "":
			return mismatch(c, fmt.Sprintf("a request whose _meta carries %q needs the Mcp-Protocol-Version header with the same version", message.MetaVersionKey))
		case present && meta != version:
			return mismatch(c, fmt.Sprintf("the Mcp-Protocol-Version header does not match the request's _meta %q: send the same version in both", message.MetaVersionKey))
		}
		if version < modernVersion || b.Batch {
			continue
		}
		if len(methods) == 0 {
			return mismatch(c, fmt.Sprintf("a %s request needs the Mcp-Method header: send Mcp-Method: %s", version, c.Method))
		}
		if len(names) == 0 && (c.Method == "tools/call" || c.Method == "prompts/get" || c.Method == "resources/read") {
			return mismatch(c, fmt.Sprintf("a %s %s request needs the Mcp-Name header, with the name (or, for resources/read, the URI) the body gives", version, c.Method))
		}
	}
	if len(methods) == 0 && len(names) == 0 {
		return Verdict{}, message.Call{}
	}
	if len(methods) > 1 || len(names) > 1 {
		return mismatch(message.Call{}, "send the Mcp-Method and Mcp-Name headers at most once each")
	}
	for _, c := range b.Calls {
		if c.IsResponse() {
			continue
		}
		if len(methods) == 1 && methods[0] != c.Method {
			return mismatch(c, fmt.Sprintf("the Mcp-Method header does not match the body's method %q: send the method the body names", c.Method))
		}
		if len(names) == 1 && names[0] != c.Name() {
			if c.Name() == "" {
				return mismatch(c, fmt.Sprintf("the Mcp-Name header was sent with method %q, which names nothing: leave it out", c.Method))
			}
			return mismatch(c, fmt.Sprintf("the Mcp-Name header does not match what the body's %s names: send the name the body gives", c.Method))
		}
	}
	return Verdict{}, message.Call{}
}
