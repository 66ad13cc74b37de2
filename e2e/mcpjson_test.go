package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Upstreams come from mcp.json files in the shapes clients already use; a
// file whose entry cannot be understood refuses the config and names it.
func TestUpstreamsFromMCPJSONFiles(t *testing.T) {
	upstream := startEverythingServer(t)
	dir := t.TempDir()
	files := map[string]string{
		// Claude Desktop / Cursor: a name-keyed map under mcpServers, with type.
		"claude.json": fmt.Sprintf(`{"mcpServers": {"keyed": {"type": "http", "url": %q, "headers": {"X-Key": "${KEYED_KEY:-none}"}}}}`, upstream),
		// A list of configs, with Gemini's httpUrl.
		"list.json": fmt.Sprintf(`[{"name": "listed", "httpUrl": %q}]`, upstream),
		// One config, with transport spelled as streamable-http.
		"single.json": fmt.Sprintf(`{"name": "single", "url": %q, "transport": "streamable-http"}`, upstream),
	}
	var lines []string
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, "\t\tupstreams_file "+path)
	}
	slices.Sort(lines)
	port := freePort(t)
	caddyfile := func(extra string) string {
		return fmt.Sprintf(`{
	admin %s
	zidane {
%s
%s
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate keyed listed single
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, strings.Join(lines, "\n"), extra, port)
	}
	c := startCaddy(t, caddyfile(""))
	token := createToken(t, c, "agent", "--scope", "mcp")
	cs, err := connectGo(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"keyed", "listed", "single"} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mcp_" + name + "_test_simple_text"})
		if err != nil || res.IsError {
			t.Fatalf("upstream %s from its mcp.json: %+v %v", name, res, err)
		}
	}

	// An entry whose transport cannot be inferred: the reload is refused,
	// the error names the entry, and the running config keeps serving.
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"mcpServers": {"mystery": {"headers": {"A": "b"}}}}`), 0o600)
	out, err := c.TryReload(t, caddyfile("\t\tupstreams_file "+bad))
	if err == nil || !strings.Contains(out, "mystery") {
		t.Fatalf("a config with an unusable mcp.json entry was accepted or the error does not name it: %v\n%s", err, out)
	}
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mcp_keyed_test_simple_text"}); err != nil || res.IsError {
		t.Fatalf("after the refused reload: %+v %v", res, err)
	}
	// Two upstreams with one name are refused at load time, naming both sources.
	dup := filepath.Join(dir, "dup.json")
	os.WriteFile(dup, []byte(fmt.Sprintf(`{"mcpServers": {"keyed": {"url": %q}}}`, upstream)), 0o600)
	out, err = c.TryReload(t, caddyfile("\t\tupstreams_file "+dup))
	if err == nil || !strings.Contains(out, "keyed") {
		t.Fatalf("a duplicate upstream name was accepted: %v\n%s", err, out)
	}
}
