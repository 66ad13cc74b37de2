package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCaddyfileExampleQuickStart runs the README's quick start on the
// shipped Caddyfile.example, with its fixed ports swapped for free ones.
func TestCaddyfileExampleQuickStart(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	upstream := startEverythingServer(t)
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	port := freePort(t)
	cfg := string(raw)
	for old, new := range map[string]string{
		"admin localhost:2019":          "admin " + AdminPlaceholder,
		"http://:8080":                  fmt.Sprintf("http://:%d", port),
		"bind 127.0.0.1 [::1]":          "bind 127.0.0.1",
		"reverse_proxy 127.0.0.1:9090 ": "reverse_proxy " + up + " ",
	} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("Caddyfile.example no longer contains %q; update this test with the example", old)
		}
		cfg = strings.ReplaceAll(cfg, old, new)
	}
	c := startCaddy(t, cfg)
	token := createToken(t, c, "laptop", "--scope", "mcp")
	for _, host := range []string{"localhost", "127.0.0.1"} {
		url := fmt.Sprintf("http://%s:%d/mcp", host, port)
		cs, err := connectGo(t, url, bearerClient(token, nil))
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"})
		if err != nil || res.IsError {
			t.Fatalf("%s: call: %+v %v", url, res, err)
		}
		if out, err := tsClient(t, url, token, "list-tools"); err != nil || !strings.Contains(out, "test_simple_text") {
			t.Fatalf("TS client at %s: %v %s", url, err, out)
		}
	}
	if a := post(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), "", initializeBody); a.status != 401 {
		t.Fatalf("no token: %d", a.status)
	}
}
