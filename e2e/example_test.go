package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCaddyfileExampleQuickStart runs the README's quick start on the
// shipped Caddyfile.example, with its fixed ports swapped for free ones: no
// other service, a chat token, and a session of the built-in demo agent.
func TestCaddyfileExampleQuickStart(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cfg := string(raw)
	for old, new := range map[string]string{
		"admin localhost:2019": "admin " + AdminPlaceholder,
		"http://:8080":         fmt.Sprintf("http://:%d", port),
		"bind 127.0.0.1 [::1]": "bind 127.0.0.1",
	} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("Caddyfile.example no longer contains %q; update this test with the example", old)
		}
		cfg = strings.ReplaceAll(cfg, old, new)
	}
	c := startCaddy(t, cfg)
	token := createToken(t, c, "laptop", "--scope", "chat")
	cwd := t.TempDir()
	for _, host := range []string{"localhost", "127.0.0.1"} {
		url := fmt.Sprintf("http://%s:%d/mcp", host, port)
		cs, err := connectGo(t, url, bearerClient(token, nil))
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		ctx := context.Background()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions", Arguments: map[string]any{
			"verb": "create", "cwd": cwd, "prompt": "hello from " + host}})
		if err != nil || res.IsError {
			t.Fatalf("%s: create: %+v %v", url, res, err)
		}
		id := structured(t, res)["sessionId"].(string)
		res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions", Arguments: map[string]any{
			"verb": "wait", "sessionId": id, "timeout": 20}})
		if err != nil || res.IsError {
			t.Fatalf("%s: wait: %+v %v", url, res, err)
		}
		res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "sessions", Arguments: map[string]any{"verb": "read", "sessionId": id}})
		if err != nil || res.IsError {
			t.Fatalf("%s: read: %+v %v", url, res, err)
		}
		if got := fmt.Sprint(structured(t, res)["lastMessage"]); !strings.Contains(got, "hello from "+host) {
			t.Fatalf("%s: the demo agent answered %q", url, got)
		}
		if out, err := tsClient(t, url, token, "list-tools"); err != nil || !strings.Contains(out, "sessions") || !strings.Contains(out, "interactions") {
			t.Fatalf("TS client at %s: %v %s", url, err, out)
		}
	}
	if a := post(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), "", initializeBody); a.status != 401 {
		t.Fatalf("no token: %d", a.status)
	}
}

// structured decodes a tool result's structuredContent.
func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("structuredContent %s: %v", raw, err)
	}
	return m
}
