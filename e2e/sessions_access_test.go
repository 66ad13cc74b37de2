package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// sessionsToolCall is a raw tools/call body for the sessions or
// interactions tool.
func sessionsToolCall(tool, verb string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":%q,"arguments":{"verb":%q}}}`, tool, verb)
}

// TestSessionsTokens checks who may use the endpoint: machine tokens never,
// `read` tokens only to look (at their owner's sessions), and a revoked
// token's running work is cancelled.
func TestSessionsTokens(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	owner := createToken(t, gw.c, "owner", "--scope", "chat", "--owner", "team")
	reader := createToken(t, gw.c, "reader", "--scope", "read", "--owner", "team")
	machine := createToken(t, gw.c, "robot", "--scope", "chat", "--machine")
	temp := createToken(t, gw.c, "temp", "--scope", "chat", "--owner", "team")
	secrets := []string{owner, reader, machine, temp}
	o := connectGoSessions(t, gw.url, owner, "owner")
	dir := t.TempDir()

	t.Run("a machine token gets 403", func(t *testing.T) {
		for _, body := range []string{initializeBody, sessionsToolCall("sessions", "list")} {
			a := post(t, gw.url, machine, body)
			if a.status != http.StatusForbidden || a.rpc.Error.Data.Reason != "machine_token" || !strings.Contains(a.rpc.Error.Message, "user token") {
				t.Fatalf("machine token: %d %s", a.status, a.body)
			}
		}
		if _, err := tryConnectGoSessions(t, gw.url, machine, "robot"); err == nil {
			t.Fatal("the go-sdk client connected with a machine token")
		}
		out, err := tsClient(t, gw.url, machine, "list-tools")
		if err == nil || parseTSFailure(t, out).Status != http.StatusForbidden {
			t.Fatalf("TS client with a machine token: %v %s", err, out)
		}
	})

	t.Run("a read token looks but cannot act", func(t *testing.T) {
		id := createSession(t, o, dir, "approve: publish the release").SessionID
		settleIn(t, o, id, "blocked")
		r := connectGoSessions(t, gw.url, reader, "reader")
		tools, err := r.cs.ListTools(context.Background(), nil)
		if err != nil || len(tools.Tools) != 2 {
			t.Fatalf("reader tools/list: %v %v", tools, err)
		}
		for _, args := range []map[string]any{
			{"verb": "read", "sessionId": id},
			{"verb": "list"},
			{"verb": "transcript", "sessionId": id},
			{"verb": "wait", "sessionId": id, "timeout": 1},
			{"verb": "events", "sessionId": id},
		} {
			callOK(t, r, "sessions", args)
		}
		if it := onlyPending(t, r, id); it.Kind != "approval" {
			t.Fatalf("reader pending: %+v", it)
		}
		for _, tc := range []struct{ tool, verb string }{
			{"sessions", "create"}, {"sessions", "send"}, {"sessions", "steer"}, {"sessions", "cancel"}, {"interactions", "answer"},
		} {
			a := post(t, gw.url, reader, sessionsToolCall(tc.tool, tc.verb))
			h := a.header.Get("WWW-Authenticate")
			if a.status != http.StatusForbidden || a.rpc.Error.Data.Reason != "insufficient_scope" ||
				!strings.Contains(h, `error="insufficient_scope"`) || !strings.Contains(h, `scope="chat`) ||
				!strings.Contains(a.rpc.Error.Message, "verb "+tc.verb) {
				t.Errorf("reader %s %s: %d %q %s", tc.tool, tc.verb, a.status, h, a.body)
			}
		}
		// Through the SDK clients the refusal is an error, not a tool result.
		_, err = r.tryCall(t, "sessions", map[string]any{"verb": "create", "cwd": dir, "prompt": "hi"})
		if err == nil || !strings.Contains(err.Error(), "Forbidden") || !strings.Contains(err.Error(), "lacks a scope") {
			t.Errorf("go-sdk reader create: %v", err)
		}
		out, err := tsClient(t, gw.url, reader, "call", "interactions", `{"verb":"answer","requestId":"x","decision":"allow"}`)
		if err == nil || parseTSFailure(t, out).Status != http.StatusForbidden {
			t.Errorf("TS reader answer: %v %s", err, out)
		}
		it := onlyPending(t, o, id)
		if a := answerInteraction(t, o, it.RequestID, map[string]any{"decision": "allow"}); a.IsError {
			t.Fatalf("the owner's answer: %s", a.Text)
		}
		settleIn(t, o, id, "idle")
	})

	t.Run("revoking a token cancels what it started", func(t *testing.T) {
		tc := connectGoSessions(t, gw.url, temp, "temp")
		running := createSession(t, tc, dir, "sleep: 5m").SessionID
		asking := createSession(t, tc, dir, "approve: drop the database").SessionID
		awaitMessage(t, tc, running, "Sleeping for 5m0s")
		settleIn(t, tc, asking, "blocked")
		it := onlyPending(t, tc, asking)
		refusedBefore := 0
		for _, l := range auditLines(gw.c) {
			if l["reason"] == "invalid_token" {
				refusedBefore++
			}
		}

		if _, stderr, err := gw.c.Run(t, "zidane", "token", "revoke", "temp"); err != nil {
			t.Fatalf("revoke: %v %s", err, stderr)
		}

		v := settleIn(t, o, running, "idle")
		if last := lastTurn(t, transcriptOf(t, o, running, nil)); last.Prompt != "sleep: 5m" || last.StopReason != "cancelled" {
			t.Fatalf("the running turn after the revocation = %+v (session %+v)", last, v)
		}
		evs := eventsOf(t, o, map[string]any{"sessionId": running, "status": "cancelled"}).Events
		if len(evs) != 1 || !strings.Contains(evs[0].Summary, "revoked") {
			t.Fatalf("cancelled events of the running session: %+v", evs)
		}
		settleIn(t, o, asking, "idle")
		if got := pendingOf(t, o, asking); len(got) != 0 {
			t.Fatalf("pending after the revocation: %+v", got)
		}
		if last := lastTurn(t, transcriptOf(t, o, asking, nil)); last.StopReason != "cancelled" {
			t.Fatalf("the asking turn after the revocation = %+v", last)
		}
		callRefused(t, o, "interactions", map[string]any{"verb": "answer", "requestId": it.RequestID, "decision": "allow"}, "no_interaction")

		// The revoked token's next call gets 401, with an audit line.
		if _, err := tc.tryCall(t, "sessions", map[string]any{"verb": "list"}); err == nil {
			t.Fatal("the go-sdk client of the revoked token could still call")
		}
		a := post(t, gw.url, temp, sessionsToolCall("sessions", "list"))
		if a.status != http.StatusUnauthorized || a.rpc.Error.Data.Reason != "invalid_token" || !strings.Contains(a.rpc.Error.Message, "revoked") ||
			!strings.Contains(a.header.Get("WWW-Authenticate"), `error="invalid_token"`) {
			t.Fatalf("revoked token: %d %q %s", a.status, a.header.Get("WWW-Authenticate"), a.body)
		}
		refusedAfter, revoked := 0, false
		for _, l := range auditLines(gw.c) {
			if l["reason"] == "invalid_token" && l["status"] == float64(401) && strings.Contains(fmt.Sprint(l["detail"]), "revoked") {
				refusedAfter++
			}
			if l["event"] == "token_revoked" && l["token_name"] == "temp" {
				revoked = true
			}
		}
		if refusedAfter <= refusedBefore || !revoked {
			t.Fatalf("audit: %d refusals of the revoked token (before: %d), token_revoked line %v", refusedAfter, refusedBefore, revoked)
		}
	})

	t.Run("storage and logs hold no token secret", func(t *testing.T) {
		assertNoSecretsUnder(t, gw.c.Dir, secrets)
	})
}

// TestSessionsFirstAnswerWins has two clients of one owner (alice on her
// laptop and on her phone) answer the same interaction at once: exactly one
// answer applies, and the other is told someone answered first.
func TestSessionsFirstAnswerWins(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	alice := createToken(t, gw.c, "alice", "--scope", "chat", "--owner", "alice")
	bob := createToken(t, gw.c, "alice-phone", "--scope", "chat", "--owner", "alice")
	goAlice := connectGoSessions(t, gw.url, alice, "go-sdk alice")
	goBob := connectGoSessions(t, gw.url, bob, "go-sdk alice-phone")
	tsBob := connectTSSessions(t, gw.url, bob, "typescript alice-phone")
	id := createSession(t, goAlice, t.TempDir(), "ready").SessionID
	settleIn(t, goAlice, id, "idle")

	type result struct {
		a   toolAnswer
		err error
	}
	for round, pair := range [][2]sessionsClient{{goAlice, goBob}, {goAlice, tsBob}, {tsBob, goAlice}, {goBob, goAlice}} {
		t.Run(fmt.Sprintf("%s and %s", pair[0].name(), pair[1].name()), func(t *testing.T) {
			command := fmt.Sprintf("ship round %d", round)
			sendPrompt(t, goAlice, id, "approve: "+command)
			settleIn(t, goAlice, id, "blocked")
			it := onlyPending(t, goAlice, id)

			decisions := [2]string{"allow", "reject"}
			results := make(chan struct {
				i int
				result
			}, 2)
			start := make(chan struct{})
			for i, c := range pair {
				go func() {
					<-start
					a, err := c.tryCall(t, "interactions", map[string]any{"verb": "answer", "requestId": it.RequestID, "decision": decisions[i]})
					results <- struct {
						i int
						result
					}{i, result{a, err}}
				}()
			}
			close(start)
			var got [2]result
			for range 2 {
				select {
				case r := <-results:
					got[r.i] = r.result
				case <-time.After(sessionCallTimeout):
					t.Fatal("an answer did not return")
				}
			}
			winner := -1
			for i, r := range got {
				if r.err != nil {
					t.Fatalf("%s: %v", pair[i].name(), r.err)
				}
				if !r.a.IsError {
					if winner >= 0 {
						t.Fatalf("both answers were applied: %q and %q", got[0].a.Text, got[1].a.Text)
					}
					winner = i
				}
			}
			if winner < 0 {
				t.Fatalf("no answer was applied: %q and %q", got[0].a.Text, got[1].a.Text)
			}
			loser := got[1-winner].a
			if loser.errorCode() != "already_answered" || !strings.Contains(loser.Text, "answered") || !strings.Contains(loser.Text, "first") {
				t.Fatalf("%s was told %q (%s), want that someone answered first", pair[1-winner].name(), loser.Text, loser.errorCode())
			}
			want := map[string]string{"allow": "Allowed: ", "reject": "Rejected: "}[decisions[winner]] + command
			if v := settleIn(t, goAlice, id, "idle"); v.LastMessage != want {
				t.Fatalf("%s won with %s, but the session says %q", pair[winner].name(), decisions[winner], v.LastMessage)
			}
			t.Logf("%s answered first", pair[winner].name())
		})
	}
}

// TestSessionsConformance runs MCP conformance scenarios against the
// sessions endpoint through a proxy that adds the bearer token, on a site
// for any Host bound to loopback, so that the edge (not Caddy's host
// matching) is what refuses a rebinding Host.
func TestSessionsConformance(t *testing.T) {
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		sessions
	}
}
`, AdminPlaceholder, port))
	token := createToken(t, c, "conformance", "--scope", "chat")
	direct := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	url := authProxy(t, direct, http.Header{"Authorization": {"Bearer " + token}})
	for _, scenario := range []string{"server-initialize", "ping", "tools-list", "dns-rebinding-protection"} {
		t.Run(scenario, func(t *testing.T) {
			passed, failed, out := runConformanceServer(t, url, scenario)
			if failed != 0 || passed == 0 {
				t.Errorf("%s against the sessions endpoint: %d passed, %d failed\n%s", scenario, passed, failed, tail(out, 4000))
			}
		})
	}
	t.Run("the session tools are listed with their schemas", func(t *testing.T) {
		cs, err := connectGo(t, direct, bearerClient(token, nil))
		if err != nil {
			t.Fatal(err)
		}
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tool := range tools.Tools {
			schema, _ := tool.InputSchema.(map[string]any)
			if tool.Description == "" || schema["type"] != "object" {
				t.Errorf("tool %s: description %q, schema %v", tool.Name, tool.Description, tool.InputSchema)
			}
		}
		if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sessions", Arguments: map[string]any{"verb": "list"}}); err != nil {
			t.Fatalf("list: %v", err)
		}
	})
}
