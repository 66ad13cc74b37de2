// Package edge is the request path of the zidane_mcp edge as plain Go, with
// no Caddy in it: the route interface every mode implements, the decision
// that turns a principal and a request body into allowed or a refusal, the
// HTTP-level checks on a request, and the filter every answer passes
// through, which cuts listings down to what the principal may use and
// withholds what it cannot read unambiguously.
//
// A request travels six steps: Host and Origin (after [CheckSingleHeaders]
// refuses a second Origin or Authorization), authentication, reading
// the message once ([message.Read], after [CheckRequest] and [ReadBody]), authorization
// ([Decide], which checks the MCP 2026-07-28 headers against the body, Mcp-Param-* by
// the x-mcp-header bindings the route learned from the tools/list answers its filter
// read (see [ParamHeaders]), asks the [Route], and refuses the use of an item whose
// pinned definition changed, or a tool new to its pinned set: a tools/call as a tool
// error, a prompts/get or resources/read with 403; package pins), the rate limit, and
// serving ([Route.Serve], with the filter of [Listing] around every answer: a
// server may answer a listing on another request's stream; it withholds a
// listed item whose definition differs from its pin, answers the pinned
// instructions and serverInfo in place of changed ones, and only the answer
// to a list request of that kind pins or records a change). The Caddy
// adapter (package caddymodule)
// sequences them; every decision belongs to this package, to package
// policy, or to the route.
//
// The routes are [Guard] (the next handler, such as reverse_proxy to an MCP
// server), [GuardUpstream] (guard mode with the broker's pass-through to
// its server in place of the next handler), [Sessions] (the sessions endpoint), [Upstream] (one upstream
// offered through the broker: an operator's pass-through route, or a
// session's egress to an upstream) and [Aggregate] (several upstreams on
// one endpoint, each call authorized against the upstream that owns what it
// names). Every route but Sessions binds the upstreams' task handles (MCP
// 2026-07-28's Tasks extension) to the token and the route that created
// them: a route opens a request's handles before it serves it, and the
// listing filter seals the ids of the answers (see tasks.go).
//
// In a cluster, a request for an aggregated or sessions-endpoint
// 2025-11-25 session that another replica holds is served there
// ([ClusterAggregate], [ClusterSessions]): the replica that got it runs
// the six steps, then [Forward] sends it to the holder's advertised
// address over a hop that [HopKey] signs and the holder's [HopKey.Verify]
// checks (MAC over the request and the identity, the nodes, a time and a
// nonce; see hop.go and forward.go). The holder establishes the principal
// from the identity alone ([HopClaims.Principal]: its own token store, its
// own check of a JWT) and decides the request again ([Decide]) under it;
// a bound principal's hop carries the client's DPoP proof, which the holder
// checks again ([DPoP.CheckForwarded]).
//
// Around the steps it also owns what a client sees of them: the
// authentication verdicts and the charging of failed guesses to their
// address ([Authentication]), DPoP (RFC 9449: a credential bound to a key
// is taken only with a proof of it on every request, checked against the
// configured resource URL; [DPoP]), the refusal as written ([WriteRefusal]: the
// WWW-Authenticate challenge, the JSON-RPC code), the RFC 9728 document
// ([ProtectedResource]), the Host, Origin and CORS rules
// ([CheckHostOrigin], [Preflight]), the rate limit's verdict ([RateLimit]),
// which upstream a session's agent reaches under [EgressPrefix]
// ([EgressRoute]) and at what address ([ProtectedResource.AgentBase]),
// the rule of a replica that is shutting down ([Drain]) and its health
// check ([ServeHealth]), and which hops a node takes ([IsHop], [HopRoute],
// [HeldHere]).
//
// What it never does: it never decodes a client's JSON-RPC message itself
// (package message is the one reader), never builds anything
// security-relevant from Host or X-Forwarded-* headers, and never passes a
// client's credential on: a route serves a request whose Authorization the
// adapter removed. (The one credential that moves is a JWT principal's
// access token, over the hop, to another replica of this same gateway,
// which verifies it: see [HopKey.Sign]; with it, for a DPoP-bound one, the
// client's proof for this same resource.)
package edge
