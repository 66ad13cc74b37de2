// Package broker is the outbound side of the edge for MCP: the Go
// counterpart of the zidane/mcp client library. It connects to upstream MCP
// servers (GitHub, Linear, a company's own), attaches their credentials
// itself, sends every byte through pinnedfetch, and offers the upstreams to
// the clients behind the edge, one by one (pass-through) or together
// (aggregated, with namespaced tools).
//
// It owns:
//
//   - upstream configuration ([Upstream], [Normalize], [MergeUpstreams]) and
//     reading the mcp.json files people already have ([LoadMCPJSON]);
//   - environment placeholders ([Expand], [Upstream.Expanded]), expanded
//     only where a transport is built, and the redacted view of a config
//     for listings ([Upstream.Redacted]);
//   - tool and prompt namespacing ([NamespaceTool], [Namespace]);
//   - content normalization ([NormalizeContent], [DecodeContent],
//     [MediaType]) and the flattened text form used in logs
//     ([FlattenText]);
//   - the pass-through route ([PassThrough]): one streamable-HTTP upstream
//     offered unchanged at the HTTP level, with the upstream's session ids
//     sealed to the principal and the route ([SessionIDs]);
//   - the sealing of an upstream's task ids (MCP 2026-07-28's Tasks
//     extension) into handles bound to the principal and the route
//     ([TaskIDs]), which package edge applies on every route;
//   - the aggregated route ([Aggregate]): several upstreams (streamable
//     HTTP, SSE, pooled stdio) on one endpoint, namespaced, with the owner
//     of each tool, prompt, resource and completion for the edge to
//     authorize on ([Aggregate.ToolServer], [Aggregate.ResourceOwners]),
//     and byte-level tools/call fast paths (one per protocol generation,
//     when both sides speak it); it serves MCP 2026-07-28 and
//     2025-11-25 clients on one URL and speaks to each upstream the newest
//     of the two it answers, multi-round-trip calls included in every
//     combination, and tasks for a 2026-07-28 client of a streamable-HTTP
//     upstream ([AggregateOptions.Tasks]);
//   - each upstream's OAuth client (package upstreamauth);
//   - the trace of each upstream request: a client span of the edge's
//     route span, when it records, whose W3C trace context goes in the
//     request's headers and, for MCP 2026-07-28, in params._meta (SEP-414);
//     never a client's baggage.
//
// The routes take the edge's one reading of a client's message from the
// request context (package message) and forward exactly those bytes, but
// for that trace context in _meta when tracing is on (the values of every
// other key unchanged).
//
// What it never does: it never passes a client's credential upstream, and
// never lets an upstream credential reach a client, an agent, a log line, an
// error or a listing; it never expands a placeholder outside a transport,
// and never reads this process's environment for a config from an untrusted
// source; it never fetches a URL that breaks pinnedfetch's remote-URL rule
// ([pinnedfetch.CheckRemoteURL] is the only encoding of that rule). It does
// not import Caddy: package caddymodule parses the Caddy config and hands the
// upstreams here.
package upstream
