package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSessionsBelongToTheirOwner is the second attack: bob, who
// holds chat like alice, approved `rm -rf /srv/prod` in alice's session and
// took her events with a send. Through the built binary and both SDK
// clients, every verb bob tries on her session is refused with a message
// that says whose it is not and which scope would reach it; a token with
// that scope acts on it, and alice keeps getting its events.
func TestSessionsBelongToTheirOwner(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	alice := createToken(t, gw.c, "alice", "--scope", "chat")
	bob := createToken(t, gw.c, "bob", "--scope", "chat")
	ops := createToken(t, gw.c, "ops", "--scope", "chat", "--scope", "sessions:any", "--scope", "interactions:any")
	a := connectGoSessions(t, gw.url, alice, "alice")
	dir := t.TempDir()
	id := createSession(t, a, dir, "approve: rm -rf /srv/prod").SessionID
	settleIn(t, a, id, "blocked")
	it := onlyPending(t, a, id)
	a.pushes().await(t, "alice's needs-attention", func(p pushedEvent) bool {
		return p.Event.SessionID == id && p.Event.Status == "needs-attention"
	})

	t.Run("bob can neither act on nor see alice's session", func(t *testing.T) {
		for _, b := range []sessionsClient{connectGoSessions(t, gw.url, bob, "go-sdk bob"), connectTSSessions(t, gw.url, bob, "typescript bob")} {
			for _, tc := range []struct {
				tool  string
				args  map[string]any
				scope string
			}{
				{"sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": "approve: rm -rf /home"}, "sessions:any"},
				{"sessions", map[string]any{"verb": "steer", "sessionId": id, "text": "hurry"}, "sessions:any"},
				{"sessions", map[string]any{"verb": "cancel", "sessionId": id}, "sessions:any"},
				{"sessions", map[string]any{"verb": "read", "sessionId": id}, "sessions:any"},
				{"sessions", map[string]any{"verb": "transcript", "sessionId": id}, "sessions:any"},
				{"sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 1}, "sessions:any"},
				{"sessions", map[string]any{"verb": "events", "sessionId": id}, "sessions:any"},
				{"interactions", map[string]any{"verb": "pending", "sessionId": id}, "interactions:any"},
				{"interactions", map[string]any{"verb": "answer", "requestId": it.RequestID, "decision": "allow"}, "interactions:any"},
			} {
				msg := callRefused(t, b, tc.tool, tc.args, "not_owner")
				if !strings.Contains(msg, "belongs to another owner") || !strings.Contains(msg, tc.scope) || strings.Contains(msg, "alice") {
					t.Errorf("%s: %s %s refused with %q; want whose it is not, the scope %s, and no name of alice's", b.name(), tc.tool, tc.args["verb"], msg, tc.scope)
				}
			}
			var l listView
			sessionsCall(t, b, "list", nil).decode(t, &l)
			if n := len(l.Sessions) + len(eventsOf(t, b, nil).Events) + len(pendingOf(t, b, "")); n != 0 {
				t.Errorf("%s sees %d of alice's sessions, events and interactions", b.name(), n)
			}
		}
		// Nothing of alice's moved.
		if v := readSession(t, a, id, false); v.State != "blocked" || onlyPending(t, a, id).RequestID != it.RequestID {
			t.Fatalf("alice's session after bob's attempts: %+v", v)
		}
		refused := 0
		for _, l := range auditLines(gw.c) {
			if l["event"] == "tool_refused" && l["reason"] == "not_owner" && l["token_name"] == "bob" {
				refused++
			}
		}
		if refused != 18 {
			t.Fatalf("%d audit lines of bob's refusals, want 18", refused)
		}
	})

	t.Run("sessions:any acts on it, and alice keeps its events", func(t *testing.T) {
		o := connectGoSessions(t, gw.url, ops, "ops")
		if ans := answerInteraction(t, o, it.RequestID, map[string]any{"decision": "reject"}); ans.IsError {
			t.Fatalf("ops's answer: %s", ans.Text)
		}
		settleIn(t, a, id, "idle")
		sendPrompt(t, o, id, "checked by ops")
		settleIn(t, o, id, "idle")
		// The turn ops started still reports to alice.
		a.pushes().await(t, "alice's event of the turn ops started", func(p pushedEvent) bool {
			return p.Event.SessionID == id && p.Event.Status == "done" && strings.Contains(p.Event.Summary, "checked by ops")
		})
		if last := lastTurn(t, transcriptOf(t, a, id, nil)); last.Answer != "You said: checked by ops" {
			t.Fatalf("alice's transcript ends with %+v", last)
		}
	})

	t.Run("share_sessions lets every token read, not act", func(t *testing.T) {
		shared := startSessionsGateway(t, "\t\tshare_sessions", "")
		owner := connectGoSessions(t, shared.url, createToken(t, shared.c, "alice", "--scope", "chat"), "alice")
		other := connectGoSessions(t, shared.url, createToken(t, shared.c, "bob", "--scope", "chat"), "bob")
		sid := createSession(t, owner, t.TempDir(), "hello").SessionID
		settleIn(t, owner, sid, "idle")
		var l struct {
			Sessions []struct {
				SessionID string `json:"sessionId"`
				Foreign   bool   `json:"foreign"`
			} `json:"sessions"`
		}
		sessionsCall(t, other, "list", nil).decode(t, &l)
		if len(l.Sessions) != 1 || l.Sessions[0].SessionID != sid || !l.Sessions[0].Foreign {
			t.Fatalf("bob's list with share_sessions: %+v", l.Sessions)
		}
		if v := readSession(t, other, sid, true); v.LastMessage != "You said: hello" {
			t.Fatalf("bob's read with share_sessions: %+v", v)
		}
		if msg := callRefused(t, other, "sessions", map[string]any{"verb": "send", "sessionId": sid, "prompt": "mine now"}, "not_owner"); !strings.Contains(msg, "sessions:any") {
			t.Fatalf("bob's send with share_sessions: %s", msg)
		}
	})
}

// tokenRecord is an entry of `token list --json`.
type tokenRecord struct {
	ID      string     `json:"id"`
	Name    string     `json:"name"`
	Owner   string     `json:"owner"`
	Parent  string     `json:"parent"`
	Session string     `json:"session"`
	Purpose string     `json:"purpose"`
	Scopes  []string   `json:"scopes"`
	Expires *time.Time `json:"expires"`
	Revoked *time.Time `json:"revoked"`
}

func tokenList(t *testing.T, c *Caddy) []tokenRecord {
	t.Helper()
	out, stderr, err := c.Run(t, "zidane", "token", "list", "--json")
	if err != nil {
		t.Fatalf("token list: %v %s", err, stderr)
	}
	var list []tokenRecord
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("token list: %v\n%s", err, out)
	}
	return list
}

// sessionTokens are the tokens minted for session's agent.
func sessionTokens(list []tokenRecord, session string) []tokenRecord {
	var out []tokenRecord
	for _, tok := range list {
		if tok.Session == session {
			out = append(out, tok)
		}
	}
	return out
}

// eventuallyTokens polls `token list` until cond holds, up to 30s.
func eventuallyTokens(t *testing.T, c *Caddy, what string, cond func([]tokenRecord) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		list := tokenList(t, c)
		if cond(list) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never within 30s; tokens: %+v", what, list)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// agentAnswer runs prompt in session id (through c, a token of its owner)
// and returns what the agent answered.
func agentAnswer(t *testing.T, c sessionsClient, id, prompt string) string {
	t.Helper()
	sendPrompt(t, c, id, prompt)
	settle(t, c, id)
	last := lastTurn(t, transcriptOf(t, c, id, map[string]any{"full": true}))
	if last.Prompt != prompt {
		t.Fatalf("the last turn of %s is %+v, want the one of %q", id, last, prompt)
	}
	return last.Answer
}

// TestOrchestratorTokensAreBounded is the first attack: an
// orchestrator given `tools: ["create"]` made a worker with every verb,
// which cancelled another user's session; its tokens outlived their parent
// and their session. Here a child's verbs only narrow its parent's, it
// drives its owner's sessions and nobody else's, it expires with its parent
// and is refused once the parent is revoked, and it is gone when its
// session ends.
func TestOrchestratorTokensAreBounded(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	human := createToken(t, gw.c, "human", "--scope", "chat", "--owner", "hana", "--expires", "1h")
	phone := createToken(t, gw.c, "hana-phone", "--scope", "chat", "--owner", "hana")
	h := connectGoSessions(t, gw.url, human, "hana")
	p := connectGoSessions(t, gw.url, phone, "hana's phone")
	b := connectGoSessions(t, gw.url, createToken(t, gw.c, "bob", "--scope", "chat"), "bob")
	dir := t.TempDir()
	victim := createSession(t, b, dir, "sleep: 5m").SessionID
	awaitMessage(t, b, victim, "Sleeping")
	call := func(args string) string { return "mcp: call zidane sessions " + args }

	t.Run("a worker gets no verb its orchestrator lacks", func(t *testing.T) {
		orch := createSession(t, h, dir, "ready", "tools", []string{"create"}).SessionID
		settleIn(t, h, orch, "idle")
		got := agentAnswer(t, h, orch, call(fmt.Sprintf(`{"verb":"create","cwd":%q,"prompt":"hi","tools":["create","cancel"]}`, dir)))
		if !strings.Contains(got, "Tool error from sessions on zidane") || !strings.Contains(got, "can only narrow") || !strings.Contains(got, "sessions cancel") {
			t.Fatalf("the orchestrator asked for a worker with cancel and got: %s", got)
		}
		// What it may give, it gives.
		got = agentAnswer(t, h, orch, call(fmt.Sprintf(`{"verb":"create","cwd":%q,"prompt":"ready","tools":["create"]}`, dir)))
		if !strings.Contains(got, "Result of sessions on zidane: Started session") {
			t.Fatalf("a worker with create: %s", got)
		}
	})

	var killer string
	t.Run("an orchestrator drives its owner's sessions and nobody else's", func(t *testing.T) {
		killer = createSession(t, h, dir, "ready", "tools", []string{"cancel", "list"}).SessionID
		settleIn(t, h, killer, "idle")
		got := agentAnswer(t, h, killer, call(fmt.Sprintf(`{"verb":"cancel","sessionId":%q}`, victim)))
		if !strings.Contains(got, "Tool error from sessions on zidane") || !strings.Contains(got, "belongs to another owner") {
			t.Fatalf("the orchestrator cancelling bob's session got: %s", got)
		}
		if v := readSession(t, b, victim, false); v.State != "running" {
			t.Fatalf("bob's session after the attempt: %+v", v)
		}
		// hana's phone started this one: same owner, so the orchestrator
		// (hana's laptop's child) may cancel it.
		mine := createSession(t, p, dir, "sleep: 5m").SessionID
		awaitMessage(t, p, mine, "Sleeping")
		if got := agentAnswer(t, h, killer, call(fmt.Sprintf(`{"verb":"cancel","sessionId":%q}`, mine))); !strings.Contains(got, "Result of sessions on zidane: Cancelled") {
			t.Fatalf("the orchestrator cancelling its owner's session got: %s", got)
		}
		settleIn(t, p, mine, "idle")
	})

	t.Run("token list shows children under their parent, expiring with it", func(t *testing.T) {
		list := tokenList(t, gw.c)
		var parent tokenRecord
		for _, tok := range list {
			if tok.Name == "human" {
				parent = tok
			}
		}
		mine := sessionTokens(list, killer)
		if len(mine) != 1 || mine[0].Parent != parent.ID || mine[0].Owner != "hana" || mine[0].Expires == nil || !mine[0].Expires.Equal(*parent.Expires) ||
			strings.Join(mine[0].Scopes, ",") != "sessions:cancel,sessions:list" {
			t.Fatalf("the orchestrator's tokens: %+v (parent %+v)", mine, parent)
		}
		out, _, err := gw.c.Run(t, "zidane", "token", "list")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(out, "\n")
		for i, l := range lines {
			if strings.Contains(l, "  orchestrator-"+killer) {
				for j := i - 1; j >= 0; j-- {
					if !strings.Contains(lines[j], "  orchestrator-") && !strings.Contains(lines[j], "  egress-") {
						if !strings.Contains(lines[j], " human ") {
							t.Fatalf("the child is listed under %q, not its parent:\n%s", lines[j], out)
						}
						return
					}
				}
			}
		}
		t.Fatalf("the child is not listed indented under its parent:\n%s", out)
	})

	t.Run("its token goes when its session ends", func(t *testing.T) {
		ender := createSession(t, h, dir, "ready", "tools", []string{"list"}).SessionID
		settleIn(t, h, ender, "idle")
		if n := len(sessionTokens(tokenList(t, gw.c), ender)); n != 1 {
			t.Fatalf("%d tokens for the orchestrator before its end", n)
		}
		sendPrompt(t, h, ender, "crash")
		settleIn(t, h, ender, "error")
		eventuallyTokens(t, gw.c, "the ended session's token to be deleted", func(list []tokenRecord) bool {
			return len(sessionTokens(list, ender)) == 0
		})
	})

	t.Run("it is refused once its parent expires", func(t *testing.T) {
		short := createToken(t, gw.c, "hana-short", "--scope", "chat", "--owner", "hana", "--expires", "8s")
		s := connectGoSessions(t, gw.url, short, "hana-short")
		orch := createSession(t, s, dir, "mcp", "tools", []string{"list"}).SessionID
		if v := settleIn(t, s, orch, "idle"); !strings.Contains(v.LastMessage, "zidane") {
			t.Fatalf("the orchestrator was not given the endpoint: %+v", v)
		}
		eventuallyTokens(t, gw.c, "the parent to expire", func(list []tokenRecord) bool {
			for _, tok := range list {
				if tok.Name == "hana-short" {
					return tok.Expires != nil && time.Now().After(*tok.Expires)
				}
			}
			return false
		})
		// hana's phone asks it to call the endpoint: its token is refused.
		if got := agentAnswer(t, p, orch, call(`{"verb":"list"}`)); !strings.Contains(got, "failed") || strings.Contains(got, "Result of") {
			t.Fatalf("an orchestrator whose parent expired called the endpoint: %s", got)
		}
	})

	t.Run("it is refused once its parent is revoked", func(t *testing.T) {
		if got := agentAnswer(t, p, killer, call(`{"verb":"list"}`)); !strings.Contains(got, "Result of sessions on zidane") {
			t.Fatalf("before the revocation: %s", got)
		}
		if _, stderr, err := gw.c.Run(t, "zidane", "token", "revoke", "human"); err != nil {
			t.Fatalf("revoke: %v %s", err, stderr)
		}
		if got := agentAnswer(t, p, killer, call(`{"verb":"list"}`)); !strings.Contains(got, "failed") || strings.Contains(got, "Result of") {
			t.Fatalf("an orchestrator whose parent was revoked called the endpoint: %s", got)
		}
		for _, tok := range sessionTokens(tokenList(t, gw.c), killer) {
			if tok.Revoked == nil {
				t.Fatalf("the child outlived its parent: %+v", tok)
			}
		}
	})
}
