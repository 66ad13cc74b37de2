// Package mcpendpoint is the MCP server behind /mcp for the `sessions` and
// `interactions` tools, built on the official go-sdk (v1.8.0).
//
// It owns:
//   - the two tools: their descriptions and input schemas (written for a
//     model), verb dispatch, input validation with messages that say what to
//     do, and the output limits (a last message cut at 600 characters, turns
//     cut at 1200, list/transcript/wait/events bounds), enforced here whatever
//     the engine returns;
//   - the caller: the engine's Owner built from the principal (its owner,
//     its credential's expiry, how far it reaches into other owners'
//     sessions: sessions:any, interactions:any, the route's share_sessions),
//     the refusal of another owner's session worded with the scope that would
//     reach it, and the check that an orchestrator's tools only narrow what
//     its creator may call on the route (its scope map, carried by
//     [WithAccess]). Both refusals go to Options.OnRefusal for the audit log;
//   - the HTTP side: a stateful go-sdk StreamableHTTPHandler with an
//     EventStore, behind go-sdk's bearer-token middleware whose verifier turns
//     the principal the edge put in the request context into the session's
//     owner, so each MCP session is bound to the token that opened it, and
//     a session with no request in flight for Options.SessionTimeout (an
//     open GET stream counts) is closed and forgotten (internal/mcpidle);
//   - `<session-event>` delivery: engine events are pushed to the MCP
//     session of the session's owner that created or last sent to it, as
//     notifications/message (logger "session-event") and, for clients that
//     declared Claude Code's experimental claude/channel capability, as
//     notifications/claude/channel.
//
// It never authenticates a credential (the edge did, and the bearer token
// never goes further than this package's front door), never decides a call's
// scopes (it asks the route's scope map about an orchestrator's tools only),
// never runs an agent and never stores anything: the engine behind
// [sessions.Sessions] does, and an event missed by a disconnected client
// stays in the engine's event log for `events` and `wait`.
//
// # Notes on go-sdk v1.8.0
//
// Logging gate. ServerSession.Log drops every message until the client calls
// logging/setLevel. The spec lets a server choose what to send before that,
// so when a session initializes, the endpoint runs the SDK's own
// logging/setLevel handler with level "info" for it: events arrive without
// any setLevel, and a client that sets a level later still gets its choice.
//
// Custom notifications. The SDK only sends methods it knows, so it cannot
// send notifications/claude/channel. The endpoint instead sends a logging
// message with the reserved logger "claude/channel" whose data is the
// channel's params, and rewrites that one SSE event into a
// notifications/claude/channel message as it leaves on the client's GET
// stream (see channel.go). The SDK keeps its event ids, ordering and
// EventStore replay; a replayed event is rewritten the same way.
package mcpendpoint
