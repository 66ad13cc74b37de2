package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestGrantSessionAgentAtItsResource: a session created with a grant's
// access token gives its agent an orchestrator token derived from the
// grant, for the grant's resource alone; the agent reaches the gateway at
// that resource's site (its URL comes from the resource, not the Host),
// and so creates a worker through it, while the grant's own token is
// still refused at the gateway's other site.
func TestGrantSessionAgentAtItsResource(t *testing.T) {
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	other := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
			registration dynamic
		}
	}
}

%[1]s {
	zidane_mcp {
		sessions
		resource %[1]s/mcp
	}
}

%[2]s {
	zidane_mcp {
		sessions
		resource %[2]s/mcp
	}
}
`, base, other))
	secret := signInLink(t, c, "alice", "chat")
	m := registerClient(t, base)
	b := newFormBrowser(t, base)
	code, verifier := m.code(b, secret, base+"/mcp")
	status, tok := m.redeem(code, verifier, base+"/mcp")
	if status != http.StatusOK {
		t.Fatalf("redeem: %d %v", status, tok)
	}
	access := tok["access_token"].(string)
	if got, _ := listToolsStatus(t, other+"/mcp", access); got != http.StatusUnauthorized {
		t.Fatalf("the grant at the other site: %d, want 401", got)
	}

	cs, err := connectGo(t, base+"/mcp", bearerClient(access, nil))
	if err != nil {
		t.Fatal(err)
	}
	cwd := t.TempDir()
	workerPrompt := fmt.Sprintf(`mcp: call zidane sessions {"verb":"create","cwd":%q,"prompt":"worker hello"}`, cwd)
	_, created, err := callSessions(t, cs, "sessions", map[string]any{
		"verb": "create", "cwd": cwd, "prompt": workerPrompt, "tools": []string{"create", "read", "list"},
	})
	if err != nil {
		t.Fatal(err)
	}
	orch := created["sessionId"].(string)
	var tr string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if tr = transcriptText(t, cs, orch); strings.Contains(tr, "sessions on zidane") {
			break
		}
	}
	if !strings.Contains(tr, "Result of sessions on zidane: Started session") {
		t.Fatalf("the agent of a grant's session could not create a worker with its orchestrator token at the grant's resource:\n%s", tr)
	}
	list, _, err := c.Run(t, "zidane", "token", "list", "--json")
	if err != nil || !strings.Contains(list, "orchestrator-"+orch) {
		t.Fatalf("token list: %v\n%s", err, list)
	}
}
