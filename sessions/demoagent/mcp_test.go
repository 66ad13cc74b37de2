package demoagent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpServer is a real go-sdk streamable HTTP server with one tool, that
// answers 401 without the X-Api-Key it expects.
func mcpServer(t *testing.T) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, nil)
	type in struct {
		Word string `json:"word"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "shout"}, func(_ context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.ToUpper(a.Word) + "!"}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != "k-123" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

func TestMCPPromptsUseTheGivenServer(t *testing.T) {
	url := mcpServer(t)
	p := startInProcess(t, Options{}, newClient())
	p.initialize(t, true)
	id := p.newSession(t, t.TempDir(),
		acp.McpServer{Http: &acp.McpServerHttpInline{Name: "up", Type: "http", Url: url, Headers: []acp.HttpHeader{{Name: "X-Api-Key", Value: "k-123"}}}},
		acp.McpServer{Http: &acp.McpServerHttpInline{Name: "nokey", Type: "http", Url: url, Headers: []acp.HttpHeader{}}})
	for _, c := range []struct{ prompt, want string }{
		{"mcp: tools up", "Tools of up: shout"},
		{`mcp: call up shout {"word":"hello"}`, "Result of shout on up: HELLO!"},
		{"mcp: call up shout not-json", "must be a JSON object"},
		{"mcp: tools nokey", `Connecting to MCP server "nokey" failed`},
		{"mcp: tools missing", `no HTTP MCP server named "missing"`},
		{"mcp: what", "Use: mcp: tools <server>"},
	} {
		before := len(message(p.client.snapshot(id)))
		if _, err := p.prompt(testCtx(t), id, c.prompt); err != nil {
			t.Fatalf("%s: %v", c.prompt, err)
		}
		got := message(p.client.snapshot(id))[before:]
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: answered %q, want %q in it", c.prompt, got, c.want)
		}
		if strings.Contains(got, "k-123") {
			t.Errorf("%s: the answer holds a header value: %q", c.prompt, got)
		}
	}
}
