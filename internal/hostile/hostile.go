// Package hostile is test data: the request bodies of the edge's threat
// model. Each case is what a token holder sends to get a call run that its
// token may not make, while the edge reads a call it allows, or reads
// nothing it can decide; with it comes the answer a security reviewer
// expects from the edge. The rules the expectations follow:
//
//   - A body two JSON readers could read differently is refused before any
//     decision: 400, reason ambiguous_body. That is any object, at any depth,
//     with two keys that are equal, equal after Unicode case folding, or equal
//     once escapes are decoded; a key that is a case, fold or escape variant
//     of a field the edge reads (Method, paramſ, n\u0061me) even alone; a
//     key __proto__; invalid UTF-8 (overlong forms and encoded surrogates
//     included); lone surrogate escapes; a byte order mark; anything but
//     whitespace after the top-level value; a numeric id that is not a
//     canonical integer within ±(2^53-1), and a null id; two requests of
//     one batch with the same id; nesting deeper than 128.
//   - Bytes that are not JSON get 400 malformed (-32700); JSON that is no
//     JSON-RPC request, notification or response gets 400 malformed
//     (-32600). Syntax comes first, then ambiguity, then the shape.
//   - Headers Mcp-Method and Mcp-Name that disagree with the body get 400
//     header_mismatch (-32020), and so does a 2026-07-28 request on its own
//     that lacks them.
//   - A Content-Encoding other than identity, or a Content-Type that is not
//     JSON in UTF-8 (one header), gets 415 unsupported_media_type; an HTTP
//     method other than GET, POST and DELETE gets 405 method_not_allowed
//     (OPTIONS too, but for a browser's preflight, which the edge answers).
//   - Origin or Authorization sent twice, or as a list in one header, gets
//     400 duplicate_header.
//   - A body read one way that holds a call the token may not make, alone or
//     in a batch, gets 403 insufficient_scope.
//   - What every reader reads alike is passed on: escapes inside strings, a
//     valid surrogate pair, whitespace around the value.
//
// The package sends nothing. Unit tests of the edge's reader and the
// end-to-end attack test (e2e/attack_test.go) both run Cases.
package hostile

import "net/http"

// The refusal reasons (the audit line's reason, and the JSON-RPC error's
// data.reason) that the cases expect.
const (
	ReasonAmbiguous        = "ambiguous_body"
	ReasonMalformed        = "malformed"
	ReasonScope            = "insufficient_scope"
	ReasonRule             = "denied_by_rule"
	ReasonHeaderMismatch   = "header_mismatch"
	ReasonUnsupportedMedia = "unsupported_media_type"
	ReasonMethodNotAllowed = "method_not_allowed"
	ReasonDuplicateHeader  = "duplicate_header"
)

// The JSON-RPC error codes that the rules fix.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeHeaderMismatch = -32020 // go-sdk's CodeHeaderMismatch
)

// The headers of the 2026-07-28 cases.
const (
	ProtocolVersionHeader = "Mcp-Protocol-Version"
	MethodHeader          = "Mcp-Method"
	NameHeader            = "Mcp-Name"
	// StatelessProtocol is the version whose requests carry Mcp-Method and
	// Mcp-Name, and no session.
	StatelessProtocol = "2026-07-28"
)

// Call is one JSON-RPC request as a client means it.
type Call struct {
	Method string
	// Params is the params object as JSON text, "" for a call without
	// params.
	Params string
}

// Subject is what the 2026-07-28 header Mcp-Name carries for c: params.name
// of tools/call and prompts/get, params.uri of resources/read; "" for other
// methods.
func (c Call) Subject() string {
	switch c.Method {
	case "tools/call", "prompts/get":
		return stringAt(c.Params, "name")
	case "resources/read":
		return stringAt(c.Params, "uri")
	}
	return ""
}

// Target is what an attacker's token may and may not do on one route.
type Target struct {
	// Allowed is a call the token may make.
	Allowed Call
	// AlsoAllowed are more calls it may make. A forbidden call is hidden
	// behind the allowed call of the same method, when there is one: a
	// resources/read of another upstream's resource behind one of the
	// token's own.
	AlsoAllowed []Call
	// Forbidden are calls the token may not make. None may ever run.
	Forbidden []Call
	// ForbiddenReason is the reason of their refusal: "" is
	// insufficient_scope; ReasonRule where an operator's rule over the
	// call's arguments forbids them (the allowed call then is the same
	// tool with other arguments, so that every case smuggles arguments).
	ForbiddenReason string
}

func (t Target) refusal() string {
	if t.ForbiddenReason != "" {
		return t.ForbiddenReason
	}
	return ReasonScope
}

// Case is one hostile request and the answer the edge must give.
type Case struct {
	// Name is unique within one Target's cases: "<where>: <what>".
	Name string
	Body []byte
	// Header holds request headers to set over the usual ones
	// (Content-Type: application/json, Accept, Authorization, and the
	// session's headers).
	Header http.Header
	// Method is the HTTP method; "" is POST.
	Method string
	// Status is the status the edge must answer. A 2xx case must be passed
	// on: the edge refuses nothing, the route answers as it would (its
	// server may refuse the body on its own), and nothing forbidden runs.
	Status int
	// Reason is the refusal's reason, "" for a 2xx case.
	Reason string
	// Code is the JSON-RPC error code the rules fix, 0 where they leave it
	// to the edge.
	Code int
	// Standalone cases are sent without an MCP session: they are
	// 2026-07-28 requests, which have none. The others are sent inside an
	// initialized 2025-11-25 session on a stateful route.
	Standalone bool
}

// HTTPMethod is c.Method, or POST.
func (c Case) HTTPMethod() string {
	if c.Method == "" {
		return http.MethodPost
	}
	return c.Method
}

// Request is the plain body of call c with id (JSON text: `1`, `"a"`).
func Request(id string, c Call) []byte {
	return []byte(request(id, c).String())
}
