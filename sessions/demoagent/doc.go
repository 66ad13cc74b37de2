// Package demoagent is the built-in demo agent: a real Agent Client Protocol
// (ACP) agent, JSON-RPC 2.0 over stdio, that needs no model and no API key.
// It exists for demos and tests only. `caddy zidane demo-agent` serves it on
// the process's stdio (see Main), and tests can serve it in-process over pipes
// (see Run).
//
// It never runs a command or edits a file, and reaches the network only for
// the "mcp:" prompts, at the HTTP MCP servers a session was given: every turn
// is scripted by the text of the prompt.
//
//	anything else     echoes it back: "You said: <prompt>", streamed in chunks, end_turn
//	ask: <question>   elicitation/create (form mode, one string field "answer"), then
//	                  echoes the answer, or says it was declined or cancelled
//	approve: <cmd>    session/request_permission for an execute tool call titled <cmd>,
//	                  rawInput {"command": <cmd>}, options allow_always, allow
//	                  (allow_once) and reject (reject_once); reports the outcome as a
//	                  tool_call_update and a message; a cancelled outcome ends the turn
//	                  with stopReason cancelled
//	plan: <plan>      plan approval: session/request_permission for a switch_mode tool
//	                  call (as Claude's ExitPlanMode) with the plan as its content and
//	                  options acceptEdits, default and plan (keep planning)
//	sleep: <dur>      holds the turn for a time.ParseDuration duration (capped, 10
//	                  minutes by default) after streaming one chunk; session/cancel
//	                  ends it with stopReason cancelled, steering ends it at once
//	fail              the prompt fails with a JSON-RPC internal error (-32603)
//	crash             streams one chunk, then exits with status 3 mid-turn
//	garbage           writes a line that is not JSON to stdout, then exits with status 4
//	pwd               says the session's working directory
//	mcp               lists the MCP servers given in session/new or session/load
//	mcp: tools <server>
//	                  connects to that streamable HTTP server (go-sdk's client, through
//	                  the origin-pinned egress client) and lists its tools
//	mcp: call <server> <tool> [<json>]
//	                  connects likewise and calls one of its tools
//	mcp: version <v> tools|call …
//	                  the same at MCP protocol version <v> (one go-sdk speaks, such as
//	                  2025-11-25; its newest, 2026-07-28, otherwise); the answer names
//	                  the version the server agreed: "Result of <tool> on <server>
//	                  (MCP <v>): …"
//	help              lists these prompts
//
// Steering is the extension method `_session/steering`, advertised in
// InitializeResponse._meta.steering.supported. Its params are {sessionId,
// text} or {sessionId, prompt: [content blocks]}, as a request (answered
// {"accepted": true}) or a notification. The guidance is kept until a turn ends
// normally; that turn's last message is "Steered: <guidance>", and a running
// sleep ends at once. ZIDANE_DEMO_AGENT_STEERING=0 (or Options.DisableSteering)
// switches steering off: nothing is advertised and the method is not found.
//
// State lives in memory only. session/load (advertised as loadSession) accepts
// any session id, so a client restarted with a fresh agent process can resume;
// it replays the exchanges the process remembers, which after a restart is
// none. One process serves any number of sessions, though the product runs one
// per session: elicitation/create carries no sessionId in ACP v0.13, so the
// demo agent puts it in the request's _meta.sessionId instead.
package demoagent
