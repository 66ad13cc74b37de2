// Package aggregate is the aggregated route of the broker ([Aggregate]):
// several upstreams (streamable HTTP, SSE, pooled stdio) on one endpoint,
// their tools and prompts namespaced, their catalogs kept by supervised
// sessions, with the owner of each tool, prompt, resource and completion
// for the edge to authorize on ([Aggregate.ToolServer],
// [Aggregate.ResourceOwners]).
//
// It serves MCP 2026-07-28 and 2025-11-25 clients on one URL and speaks to
// each upstream the newest of the two it answers, multi-round-trip calls
// included in every combination, and tasks for a 2026-07-28 client of a
// streamable-HTTP upstream ([Options.Tasks]). A tools/call takes a
// byte-level fast path when both sides speak the same protocol generation
// (fast.go for 2025-11-25 sessions, fastmodern.go for 2026-07-28); both
// admit a call by one rule (admit.go), and anything they do not take goes
// through go-sdk with the same answers.
//
// An upstream whose credentials are each person's own ([Options.PerUser])
// has no catalog: each person gets a session of their own to it, every
// request of which carries that person alone, and lists and calls its
// tools there; a person not connected sees its connect tool and gets the
// connect link (person.go).
//
// It takes the edge's one reading of a client's message from the request
// context (package message) and forwards exactly those bytes, but for a
// tool's name upstream and the trace context in _meta when tracing is on.
// What it never does: it never authenticates or authorizes a client (the
// edge did, using the owners this route reports), never sends a client's
// credential upstream, and never lets an upstream's credential or session
// id reach a client.
package aggregate
