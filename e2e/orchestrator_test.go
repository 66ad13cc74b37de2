package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// sessionsSite is a Caddyfile serving the sessions endpoint on port.
func sessionsSite(port int) string {
	return fmt.Sprintf(`{
	admin %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		sessions
	}
}
`, AdminPlaceholder, port)
}

// callSessions calls a tool of the sessions endpoint and returns its text
// and structured content; tool errors are returned as err.
func callSessions(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (string, map[string]any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return "", nil, err
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	if res.IsError {
		return strings.Join(text, "\n"), nil, fmt.Errorf("tool error: %s", strings.Join(text, "\n"))
	}
	return strings.Join(text, "\n"), structured(t, res), nil
}

// transcriptText waits until session id is idle and returns its transcript.
func transcriptText(t *testing.T, cs *mcp.ClientSession, id string) string {
	t.Helper()
	if _, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 30}); err != nil {
		t.Fatal(err)
	}
	text, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id, "full": true})
	if err != nil {
		t.Fatal(err)
	}
	return text
}

func TestOrchestratorDrivesWorkersWithAChildToken(t *testing.T) {
	port := freePort(t)
	c := startCaddy(t, sessionsSite(port))
	token := createToken(t, c, "human", "--scope", "chat")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	cs, err := connectGo(t, url, bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	cwd := t.TempDir()
	workerPrompt := fmt.Sprintf(`mcp: call zidane sessions {"verb":"create","cwd":%q,"prompt":"worker hello"}`, cwd)
	_, created, err := callSessions(t, cs, "sessions", map[string]any{
		"verb": "create", "cwd": cwd, "prompt": workerPrompt,
		"tools": []string{"create", "read", "list"}, "subscribe": true,
	})
	if err != nil {
		t.Fatal(err)
	}
	orch := created["sessionId"].(string)

	// The orchestrator's agent created a worker through the endpoint, and
	// the worker's finished event came back to it as its next prompt.
	deadline := time.Now().Add(60 * time.Second)
	var tr string
	for time.Now().Before(deadline) {
		tr = transcriptText(t, cs, orch)
		if strings.Contains(tr, "--- turn 2") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(tr, "Result of sessions on zidane: Started session") {
		t.Fatalf("the orchestrator could not create a worker through its child token:\n%s", tr)
	}
	if !strings.Contains(tr, `status=&#34;done&#34;`) && !strings.Contains(tr, `status="done"`) {
		t.Fatalf("the worker's finished event never reached the orchestrator:\n%s", tr)
	}
	if !strings.Contains(tr, "worker hello") {
		t.Fatalf("the relayed event lacks the worker's answer:\n%s", tr)
	}

	// The child token grants only the listed verbs.
	if _, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "send", "sessionId": orch,
		"prompt": `mcp: call zidane sessions {"verb":"cancel","sessionId":"x"}`}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(tr, "failed") {
		tr = transcriptText(t, cs, orch)
	}
	if !strings.Contains(tr, "Calling sessions on zidane failed") {
		t.Fatalf("a verb outside the child's tools was allowed:\n%s", tr)
	}

	// Child tokens are listed with their parent, and revoking the parent revokes them.
	list, _, err := c.Run(t, "zidane", "token", "list", "--json")
	if err != nil || !strings.Contains(list, `"parent"`) || !strings.Contains(list, "orchestrator-"+orch) {
		t.Fatalf("token list: %v\n%s", err, list)
	}
	if _, stderr, err := c.Run(t, "zidane", "token", "revoke", "human"); err != nil {
		t.Fatalf("revoke: %v %s", err, stderr)
	}
	list, _, _ = c.Run(t, "zidane", "token", "list")
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "orchestrator-"+orch) && !strings.Contains(line, "revoked") {
			t.Fatalf("the child token outlived its parent: %s", line)
		}
	}
}
