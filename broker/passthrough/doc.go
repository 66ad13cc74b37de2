// Package passthrough is the pass-through route of the broker
// ([PassThrough]): one streamable-HTTP upstream offered unchanged, at the
// HTTP level, to the clients behind the edge, with the upstream's session
// ids sealed to the principal and the route (package sessionid).
//
// It owns what the route changes on the way (the request and response
// header allow-lists, the session id translation, an upstream's refusal of
// the gateway's credentials becoming 502, event streams relayed event by
// event) and what it answers itself (an answer over a limit, an upstream
// that waits for a login, and the handshake, listings and GET stream of a
// person who has not connected their own account at a per_user upstream,
// with a pending session that goes on once they have: unconnected.go).
//
// It takes the edge's one reading of a client's message from the request
// context (package message) and forwards exactly those bytes, but for the
// trace context in _meta when tracing is on, and for the requestState and
// inputResponses of a retry that answer the gateway's own connect
// elicitation, which the upstream never made. What it never does: it never
// authenticates or authorizes a client (the edge did, before), never sends
// a client's credential or identifying headers upstream, never lets the
// upstream's session id, cookies or authorization metadata reach a client,
// and never follows a redirect off the upstream's origin (package
// upstream's egress client).
package passthrough
