package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// TestSessionsThirdPartyClaudeAgentACP launches a real third-party ACP
// agent, claude-agent-acp from npm (pinned in e2e/package.json), through
// the gateway, with no credentials and no model. Version 0.101.0 answers
// initialize and session/new, and fails the first prompt with the JSON-RPC
// error -32000 "Authentication required" (earlier versions failed
// session/new instead, "Claude Code process exited with code 1"). The
// failure must reach the user as the session's error and an error event,
// and the gateway must go on serving.
func TestSessionsThirdPartyClaudeAgentACP(t *testing.T) {
	nodeBin := node(t)
	script := packageBin(t, "@agentclientprotocol/claude-agent-acp", "claude-agent-acp")
	// No HOME of its own: the gateway gives each session's agent a private
	// one, and the agent runs confined (its sandbox's defaults).
	agent := fmt.Sprintf(`		agent claude {
			command %s %s
			env IS_SANDBOX 1
			env DISABLE_TELEMETRY 1
			env CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC 1
		}`, nodeBin, script)
	gw := startSessionsGateway(t, agent, "")
	token := createToken(t, gw.c, "claude", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")
	dir := t.TempDir()

	const failure = "Authentication required"
	id := createSession(t, g, dir, "say hello", "agent", "claude").SessionID
	v := settle(t, g, id)

	t.Run("initialize and session/new succeed", func(t *testing.T) {
		launched := false
		for _, l := range logLines(gw.c, "agent running") {
			if l["session"] == id && l["agent"] == "claude" && l["loadSession"] == true {
				launched = true
			}
		}
		if !launched {
			t.Fatalf("no \"agent running\" log line for %s: claude-agent-acp did not get through initialize and session/new (session %+v)", id, v)
		}
	})

	t.Run("the failed turn is the session's error", func(t *testing.T) {
		if v.State != "idle" || v.Agent != "claude" || v.Turns != 1 || !strings.Contains(v.Error, failure) || !strings.Contains(v.Error, "-32000") {
			t.Fatalf("the session of claude-agent-acp without credentials = %+v; want idle with the error %q", v, failure)
		}
		if last := lastTurn(t, transcriptOf(t, g, id, nil)); last.Prompt != "say hello" || last.StopReason != "error" {
			t.Fatalf("the failed turn = %+v", last)
		}
	})

	t.Run("an error event is pushed and listed", func(t *testing.T) {
		p := g.pushes().await(t, "error for "+id, eventFor(id, "error"))
		if !strings.Contains(p.Event.Summary, failure) || p.Level != "warning" || p.Event.Kind != "failed" {
			t.Fatalf("pushed error event = %s", p.Raw)
		}
		if evs := eventsOf(t, g, map[string]any{"sessionId": id, "status": "error"}).Events; len(evs) != 1 || !strings.Contains(evs[0].Summary, failure) {
			t.Fatalf("error events: %+v", evs)
		}
	})

	t.Run("the gateway goes on serving", func(t *testing.T) {
		next := createSession(t, g, dir, "still serving after claude").SessionID
		if v := settleIn(t, g, next, "idle"); v.Agent != "demo" || v.LastMessage != "You said: still serving after claude" {
			t.Fatalf("a demo session after the failed claude session: %+v", v)
		}
	})
}
