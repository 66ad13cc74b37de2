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
//     [WithAccess]). Both refusals, and the engine's refusal of a session
//     directory of the gateway's own (sessions.ErrDenied), go to
//     Options.OnRefusal for the audit log;
//   - on a cluster, the caller of another replica's request about a session
//     this replica runs ([ForwardedOwner]): whom the request names,
//     established as a sessions site of this replica establishes it
//     (policy.Authenticator.Forwarded: its own token store, its own check
//     of a JWT), allowed one of the request's verbs by that site's scope
//     map, and made into the engine's Owner as the endpoint's own callers
//     are ([OwnerOf]);
//   - the scopes of the token an orchestrator session's agent gets at each
//     launch ([OrchestratorScopes]): the verbs of its tools that its
//     creator, as it stands now, may still call on every running sessions
//     site;
//   - the HTTP side, two go-sdk handlers on one URL, chosen per request by
//     its Mcp-Protocol-Version header (see "Two protocol versions" below),
//     both behind go-sdk's bearer-token middleware whose verifier turns the
//     principal the edge put in the request context into the request's
//     TokenInfo: for 2025-11-25, a stateful StreamableHTTPHandler with an
//     EventStore, where each MCP session is bound to the token that opened
//     it, and a session with no request in flight for
//     Options.SessionTimeout (an open GET stream counts) is closed and
//     forgotten (internal/mcpidle); for 2026-07-28, a stateless one;
//   - `<session-event>` delivery: to a 2025-11-25 client, engine events are
//     pushed to the MCP session of the session's owner that created or last
//     sent to it, as notifications/message (logger "session-event") and, for
//     clients that declared Claude Code's experimental claude/channel
//     capability, as notifications/claude/channel; to a 2026-07-28 client,
//     as notifications/resources/updated of the session's events resource,
//     on the subscriptions/listen streams subscribed to it.
//
// # Two protocol versions
//
// A request whose Mcp-Protocol-Version is 2026-07-28 or later goes to a
// stateless handler (StreamableHTTPOptions.Stateless) over a second go-sdk
// server; anything else, an initialize without the header included, goes
// to the stateful one, as before. Every 2026-07-28 request carries the
// header: the edge refuses one whose _meta names a version without it
// (-32020). A 2025-11-25 client sees exactly what it saw before: the same
// server, capabilities, pushes and GET stream.
//
// The 2026-07-28 server has the same two tools and one resource template,
// zidane://sessions/{sessionId}/events: reading it gives what `sessions
// events {sessionId}` gives (its latest 20 events), each with the
// <session-event> text a push carries. There is no MCP session: go-sdk
// makes a temporary one per POST and closes it when the POST ends, so the
// per-session hooks of the stateful side never run for it (onInitialize,
// track, the idle tracker, the push peers: a 2026-07-28 request has no
// initialize and no Mcp-Session-Id), the caller comes from that POST's
// TokenInfo (callerFrom), and a caller without an MCP session moves no
// session's push target (the engine keeps it where a 2025-11-25 session put
// it). A 2026-07-28 client between its requests costs no session state.
//
// Events reach it through subscriptions/listen: a stream that lists
// zidane://sessions/<id>/events in notifications.resourceSubscriptions gets
// notifications/resources/updated for that URI at each new event of the
// session, and reads the resource (or calls `sessions events`) for it; a
// client should read it once after the stream's acknowledgement, for what
// happened before. The receiving middleware of the 2026-07-28 server
// (modernGate) authorizes every URI of a listen, on the params go-sdk
// decoded and acts on, exactly as a read is authorized, before go-sdk
// subscribes: the route's scope map must grant the caller `sessions
// events`, and the engine must let its owner read the session (its own
// owner's, or any with sessions:any or share_sessions). Only the spelling
// EventsURI gives names a session: a URI with another case, percent
// escapes, dot segments, a query or a trailing slash is no resource, so no
// spelling reaches a session its canonical URI would not. A token holds at
// most MaxListensPerToken streams, each of at most MaxURIsPerListen
// resources; Close ends them all. The legacy resources/subscribe is
// refused (2026-07-28 replaced it by subscriptions/listen), and `wait`
// serves a client that listens to nothing. Updates go out from one
// goroutine through a bounded queue; one that does not fit is dropped, and
// the event stays in the engine's log.
//
// It never authenticates a client's credential (the edge did, and an
// opaque bearer token never goes further than this package's front door; a
// JWT principal's access token goes on, in the caller's Owner, only to the
// replica of the cluster that runs a session it acts on, which verifies it
// itself: sessions.Owner.Credential), never decides a call's
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
