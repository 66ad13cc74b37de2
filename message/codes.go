package message

// The JSON-RPC error codes this module answers with, in one table, each
// with one meaning. Nothing else in the module writes a code as a number.
//
// JSON-RPC 2.0 reserves -32768 to -32000. Its own codes are the first
// five; MCP's are the next five (go-sdk v1.8.0 names them the same); the
// rest are this gateway's, in the implementation-defined server-error
// range -32000 to -32099. An unknown session keeps -32001, the code the
// MCP TypeScript SDK's server gives "Session not found"; a failed
// credential, which had shared it, has -32010 of its own; a failed
// upstream, which had shared -32002 with MCP's resource not found, has
// -32050. Clients act on the HTTP status and WWW-Authenticate, not on
// these codes; the codes let a log or a person tell the cases apart.
const (
	// CodeParseError: the body is not JSON.
	CodeParseError = -32700
	// CodeInvalidRequest: JSON that is not a JSON-RPC 2.0 request the
	// edge accepts, or a request the HTTP transport refuses (a wrong
	// method, media type or header).
	CodeInvalidRequest = -32600
	// CodeMethodNotFound: a method the server does not have.
	CodeMethodNotFound = -32601
	// CodeInvalidParams: params the method cannot take.
	CodeInvalidParams = -32602
	// CodeInternalError: the gateway could not produce the answer (an
	// upstream's answer it withheld, say).
	CodeInternalError = -32603

	// CodeResourceNotFound: ACP's resource not found (MCP's was the same
	// until SEP-2164 made it CodeInvalidParams).
	CodeResourceNotFound = -32002
	// CodeHeaderMismatch: MCP 2026-07-28's Mcp-Method, Mcp-Name or
	// Mcp-Param-* header that says something else than the body.
	CodeHeaderMismatch = -32020
	// CodeMissingClientCapability: MCP 2026-07-28's request that needs a
	// client capability the client did not declare.
	CodeMissingClientCapability = -32021
	// CodeUnsupportedProtocolVersion: MCP 2026-07-28's protocol version the
	// server does not speak.
	CodeUnsupportedProtocolVersion = -32022
	// CodeURLElicitationRequired: MCP's request that needs the person to
	// visit a URL first.
	CodeURLElicitationRequired = -32042

	// CodeUnavailable: 503, the gateway cannot serve this now (the
	// identity provider's keys are unreachable, the replica is draining).
	CodeUnavailable = -32000
	// CodeUnknownSession: 404, an Mcp-Session-Id that was not given to
	// this credential on this route, or is no longer valid: initialize
	// again.
	CodeUnknownSession = -32001
	// CodeForbidden: 403, a credential that may not do this (scope,
	// Origin, Host, owner).
	CodeForbidden = -32003
	// CodeUnauthorized: 401, no credential, or one that is not valid.
	CodeUnauthorized = -32010
	// CodeTransportRejected: an upstream's HTTP transport refused a call
	// of the aggregated route (go-sdk's client reports it with this code,
	// "rejected by transport"; both of the route's paths answer alike).
	CodeTransportRejected = -32005
	// CodeTooLarge: 413, a body over max_body.
	CodeTooLarge = -32013
	// CodeRateLimited: 429, a rate limit or a quota; Retry-After says when.
	CodeRateLimited = -32029
	// CodeUpstream: an upstream MCP server that failed, timed out, refused
	// the gateway's credentials, or answered past max_response.
	CodeUpstream = -32050
)
