// Package upstream is the broker's upstream side: what the gateway knows of
// the MCP servers it reaches (GitHub, Linear, a company's own) and how it
// reaches them. The Go counterpart of the zidane/mcp client library. The
// routes that offer the upstreams to clients are packages passthrough and
// aggregate, which build on this one.
//
// It owns:
//
//   - upstream configuration ([Config], [Normalize], [MergeUpstreams]) and
//     reading the mcp.json files people already have ([LoadMCPJSON]);
//   - environment placeholders ([Expand], [Config.Expanded]), expanded
//     only where a transport is built, and the redacted view of a config
//     for listings ([Config.Redacted]);
//   - tool and prompt namespacing ([NamespaceTool], [Namespace]);
//   - content normalization ([NormalizeContent], [DecodeContent],
//     [MediaType]) and the flattened text form used in logs
//     ([FlattenText]);
//   - the egress client of an upstream ([PinnedClient],
//     [ConfiguredHeaders]): pinned by pinnedfetch, with the configured
//     headers on hops to the upstream's origin only, the allow-list of a
//     client's headers that may go upstream ([ForwardRequestHeader]) and
//     the headers a config may not set ([ReservedUpstreamHeader]);
//   - the go-sdk transports of one upstream ([Transports]: streamable HTTP
//     and SSE over the origin-guarded egress client, stdio processes with
//     their pid files and [CleanOrphans]), every answer bounded by package
//     answerlimit, and a supervised connection over them ([Dial], [Conn])
//     that reconnects with the one [Backoff];
//   - the trace of each upstream request ([TraceTransport]): a client span
//     of the edge's route span, when it records, whose W3C trace context
//     goes in the request's headers and, for MCP 2026-07-28, in
//     params._meta (SEP-414); never a client's baggage;
//   - the record of each upstream call and refusal for the audit log
//     ([CallRecord], [Refusal]) and the error text fit for it
//     ([SafeError]).
//
// What it never does: it never passes a client's credential upstream, and
// never lets an upstream credential reach a client, an agent, a log line, an
// error or a listing; it never expands a placeholder outside a transport,
// and never reads this process's environment for a config from an untrusted
// source; it never fetches a URL that breaks pinnedfetch's remote-URL rule
// ([pinnedfetch.CheckRemoteURL] is the only encoding of that rule). It is
// no route itself, holds no upstream's OAuth tokens (package
// upstreamauth does) and does not import Caddy: package caddymodule parses
// the Caddy config and hands the upstreams here.
package upstream
