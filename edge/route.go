package edge

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Route is one mode of the edge: what a principal may do on it, what of a
// listing it may see, and how an allowed request is served.
type Route interface {
	// Admit decides whether p may use the route at all, whatever the
	// request: a GET stream, a DELETE or a POST.
	Admit(p policy.Principal) Verdict
	// Authorize decides one message of a POST body, as package message
	// read it.
	Authorize(p policy.Principal, c message.Call) Verdict
	// Visible reports whether a listed item is shown to p. It must agree
	// with Authorize: an item is visible when p may use it.
	Visible(p policy.Principal, it Item) bool
	// Serve serves a request that every step allowed. r carries the
	// principal (policy.PrincipalFrom) and the body the edge read
	// (message.FromContext), which is also r.Body; its Authorization
	// header is gone. next is the handler after the edge, for the routes
	// that pass requests on.
	Serve(w http.ResponseWriter, r *http.Request, next Next) error
}

// ClientAddressed is a Route that audits its upstream calls with the
// client's address: the edge hands the address to its Serve in the
// upstream.ClientIPHeader header, after it removed every copy a client sent.
// Other routes get no such header.
type ClientAddressed interface {
	Route
	ClientAddressed()
}

// Next is the handler after the edge: in Caddy, the next middleware, which
// is one as it is (an interface, so that passing it on allocates nothing).
type Next interface {
	ServeHTTP(http.ResponseWriter, *http.Request) error
}

// NextFunc is a function as a [Next].
type NextFunc func(http.ResponseWriter, *http.Request) error

// ServeHTTP calls f.
func (f NextFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) error { return f(w, r) }

// Kind is the kind of item a listing holds.
type Kind int

// The kinds of listed items, with the methods that list and use them.
const (
	KindTool             Kind = iota + 1 // tools/list; tools/call by name
	KindPrompt                           // prompts/list; prompts/get by name
	KindResource                         // resources/list; resources/read by uri
	KindResourceTemplate                 // resources/templates/list; resources/read of a matching uri
)

// Item is one entry of a listing answer: a tool or prompt by its name, a
// resource by its uri, a resource template by its uriTemplate.
type Item struct {
	Kind Kind
	Name string
}

// Use is the call that would use the item, for routes whose visibility is
// their authorization. A template has no single call; Use gives
// resources/read of the template text itself.
func (it Item) Use() message.Call {
	switch it.Kind {
	case KindTool:
		return message.Call{Method: "tools/call", Tool: it.Name}
	case KindPrompt:
		return message.Call{Method: "prompts/get", Prompt: it.Name}
	default:
		return message.Call{Method: "resources/read", URI: it.Name}
	}
}

// Verdict is a decision: allowed (the zero Verdict), or a refusal with the
// status, the audit reason and a message that says what to do.
type Verdict struct {
	// Status is the HTTP status of a refusal; 0 when allowed.
	Status int
	// Reason is the audit and metrics word: insufficient_scope,
	// ambiguous_body, malformed, tool_not_offered, machine_token, ...
	Reason string
	// Message is what the client is told.
	Message string
	// Need lists the scopes that would grant a refused call, for the
	// WWW-Authenticate scope parameter (insufficient_scope).
	Need []string
	// Code is the JSON-RPC error code of the refusal; 0 lets the writer
	// choose one from the status.
	Code int
	// Allow is the Allow header of a 405.
	Allow string
	// RetryAfter, when set, is the Retry-After of a 429 or 503.
	RetryAfter time.Duration
	// ToolError answers a tools/call with a tool error (a result with
	// isError, status 200) that carries Message, instead of a JSON-RPC
	// error: what the model should read.
	ToolError bool
	// Data, when set, goes in the JSON-RPC error's data beside the
	// reason: what the refusal's code has there (-32021's
	// requiredCapabilities).
	Data map[string]any
	// DPoPError, on a 401, is the error code of the DPoP challenge
	// (RFC 9449 §7.1, §12): invalid_token, invalid_dpop_proof or
	// use_dpop_nonce. The Bearer challenge then carries none.
	DPoPError string
	// DPoPNonce, on a use_dpop_nonce refusal, is the nonce the client
	// signs its next proof with: the DPoP-Nonce header.
	DPoPNonce string
	// Rule, when an operator's rule decided (see ruleVerdict), is its
	// place, such as "global policy, rule 2", and RuleEffect what it did:
	// deny (a refusal) or allow (an allowed verdict). RuleError is why
	// the rule failed closed, when it did: for the audit line, never the
	// client.
	Rule, RuleEffect, RuleError string
	// Held, on a ReasonApproval refusal, is the call an approve rule
	// holds, for [Approvals.Settle] (its Site is Settle's to fill).
	Held *approvals.Call
	// Result, when set, answers the refused call with this JSON-RPC
	// result (status 200) instead of an error: the input_required result
	// of a 2026-07-28 call held for approval.
	Result map[string]any
	// StripState, on an allowed verdict, says that the call is the retry
	// of an approval's input_required answer: its requestState and
	// inputResponses are the gateway's, removed before the backend reads
	// the call (see [WithoutRequestState]).
	StripState bool
	// Grant, on an allowed verdict of a call an approval let run (or a
	// round of one), is what the call's next round binds to: see
	// [Approvals.Continuation].
	Grant *approvals.Grant
	// Round, with StripState, is the round the retry consumed: the
	// backend's requestState goes back in the call (see
	// [RestoreRequestState]).
	Round *approvals.Round
}

// Allowed reports whether v allows.
func (v Verdict) Allowed() bool { return v.Status == 0 }

// Refuse returns a refusal.
func Refuse(status int, reason, msg string) Verdict {
	return Verdict{Status: status, Reason: reason, Message: msg}
}

// NeedScope returns the 403 insufficient_scope refusal of a call.
func NeedScope(p policy.Principal, c message.Call, need []string) Verdict {
	what := c.Method
	switch {
	case c.Tool != "":
		what = "tool " + c.Tool
		if c.Verb != "" {
			what += " verb " + c.Verb
		}
	case c.Prompt != "":
		what = c.Method + " of prompt " + c.Prompt
	case c.URI != "":
		// A URI may carry a secret of the client's: not repeated.
		what = c.Method + " of that resource"
	}
	v := Verdict{Status: http.StatusForbidden, Reason: ReasonScope, Need: need}
	if len(need) > 0 {
		v.Message = fmt.Sprintf("token %q lacks a scope for %s: it needs one of %s", p.Name, what, strings.Join(need, ", "))
	} else {
		v.Message = fmt.Sprintf("no scope grants %s on this endpoint", what)
	}
	return v
}

// Reasons of refusals that more than one place gives.
const (
	ReasonScope     = "insufficient_scope"
	ReasonAmbiguous = "ambiguous_body"
	ReasonMalformed = "malformed"
	// ReasonUnexpectedBody refuses a GET, DELETE or OPTIONS with a body.
	ReasonUnexpectedBody = "unexpected_body"
	ReasonMachine        = "machine_token"
	// ReasonUnsupportedMedia is a 415: a body that is not plain JSON.
	ReasonUnsupportedMedia = "unsupported_media_type"
	// ReasonUpgrade is a 400: a request to switch protocols (Upgrade).
	ReasonUpgrade = "upgrade_refused"
	// ReasonDuplicateHeader refuses Origin or Authorization sent twice.
	ReasonDuplicateHeader = "duplicate_header"
	// ReasonMethodNotFound is a 404: a method that the request's protocol
	// version does not have (see message.Call.Removed).
	ReasonMethodNotFound = "method_not_found"
)
