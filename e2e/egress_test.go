package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A session's agent calls an upstream's tool through the broker, with a
// machine token of its own; the upstream's secret never reaches the agent:
// not its environment, its arguments, its files or its transcript.
func TestSessionsUseUpstreamsThroughTheBroker(t *testing.T) {
	upstream := startEverythingServer(t)
	port := freePort(t)
	const secret = "upstream-secret-5b9e1"
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream everything %s {
			header X-Upstream-Key ${UPSTREAM_KEY}
			tools deny test_image_*
		}
		session_upstreams everything
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		sessions
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, upstream, port), "UPSTREAM_KEY="+secret)
	token := createToken(t, c, "human", "--scope", "chat")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	cs, err := connectGo(t, url, bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	cwd := t.TempDir()
	_, created, err := callSessions(t, cs, "sessions", map[string]any{"verb": "create", "cwd": cwd, "prompt": "mcp"})
	if err != nil {
		t.Fatal(err)
	}
	id := created["sessionId"].(string)
	tr := transcriptText(t, cs, id)
	if !strings.Contains(tr, "everything (http http://127.0.0.1:") || !strings.Contains(tr, "/zidane/upstream/everything/mcp") {
		t.Fatalf("the session was not given the upstream through the gateway:\n%s", tr)
	}

	send := func(prompt string) string {
		t.Helper()
		if _, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": prompt}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			text, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id, "turns": 1, "full": true})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(text, "prompt: "+prompt) && strings.Contains(text, "(end_turn)") {
				return text
			}
			callSessions(t, cs, "sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 5})
		}
		t.Fatalf("no answer to %q", prompt)
		return ""
	}
	if got := send("mcp: tools everything"); !strings.Contains(got, "test_simple_text") || strings.Contains(got, "test_image_content") {
		t.Fatalf("the agent's tool list through the broker:\n%s", got)
	}
	if got := send("mcp: call everything test_simple_text {}"); !strings.Contains(got, "Result of test_simple_text on everything:") {
		t.Fatalf("the agent could not call the upstream tool:\n%s", got)
	}
	if got := send("mcp: call everything test_image_content {}"); !strings.Contains(got, "failed") {
		t.Fatalf("a denied tool was called:\n%s", got)
	}

	// The egress token is a machine token: the sessions tools refuse it, so
	// an agent cannot start sessions through its egress credential.
	list, _, err := c.Run(t, "zidane", "token", "list", "--json")
	if err != nil || !strings.Contains(list, `"egress-`+id) || !strings.Contains(list, `"upstream:everything"`) {
		t.Fatalf("token list: %v\n%s", err, list)
	}

	// The secret is nowhere the agent can see: not its process's environment
	// or arguments (/proc), not its working directory, not its transcript.
	if strings.Contains(tr, secret) {
		t.Fatal("the transcript holds the upstream secret")
	}
	for _, pid := range childPIDs(t, c) {
		for _, f := range []string{"environ", "cmdline"} {
			raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), f))
			if err == nil && strings.Contains(string(raw), secret) {
				t.Fatalf("agent process %d has the upstream secret in its %s", pid, f)
			}
		}
	}
	assertNoSecretsUnder(t, cwd+"/..", []string{secret})
	assertNoSecretsUnder(t, c.DataDir, []string{secret, token})
}

// childPIDs lists the processes caddy started (its agents).
func childPIDs(t *testing.T, c *Caddy) []int {
	t.Helper()
	parent := c.proc.cmd.Process.Pid
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(parent) {
			out = append(out, pid)
		}
	}
	if len(out) == 0 {
		t.Fatal("caddy has no agent process running")
	}
	return out
}
