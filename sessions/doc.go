// Package sessions is the session engine: coding-agent sessions, each with
// its own agent process driven over the Agent Client Protocol (ACP), its own
// FIFO prompt queue, steering, cancellation, interactions (first answer
// wins), a bounded event log and transcripts, persisted through the
// project's storage interface. It never speaks MCP and never checks a
// credential: the MCP endpoint calls it through the Sessions interface with
// an Owner the edge already authenticated.
package sessions
