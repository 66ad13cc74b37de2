package demoagent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	acp "github.com/coder/acp-go-sdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpServer is a real go-sdk streamable HTTP server with one tool, that
// answers 401 without the X-Api-Key it expects.
func mcpServer(t *testing.T) string {
	url, _ := mcpServerVersions(t)
	return url
}

// mcpServerVersions is mcpServer, and the Mcp-Protocol-Version header of
// the last request it served.
func mcpServerVersions(t *testing.T) (string, func() string) {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, nil)
	type in struct {
		Word string `json:"word"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "shout"}, func(_ context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.ToUpper(a.Word) + "!"}}}, nil, nil
	})
	// Stateless: go-sdk serves 2026-07-28 only so.
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	var mu sync.Mutex
	var last string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != "k-123" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		if v := r.Header.Get("Mcp-Protocol-Version"); v != "" {
			mu.Lock()
			last = v
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp", func() string {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
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
		{"mcp: what", "Use: mcp: [version <YYYY-MM-DD>] tools <server>"},
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

// The "version" option picks the MCP protocol version the demo agent's
// client asks for; the answer says the version the server agreed, and the
// requests went out at it.
func TestMCPPromptsAtAProtocolVersion(t *testing.T) {
	url, wire := mcpServerVersions(t)
	p := startInProcess(t, Options{}, newClient())
	p.initialize(t, true)
	id := p.newSession(t, t.TempDir(),
		acp.McpServer{Http: &acp.McpServerHttpInline{Name: "up", Type: "http", Url: url, Headers: []acp.HttpHeader{{Name: "X-Api-Key", Value: "k-123"}}}})
	for _, c := range []struct{ prompt, want, wire string }{
		{`mcp: version 2025-11-25 call up shout {"word":"hi"}`, "Result of shout on up (MCP 2025-11-25): HI!", "2025-11-25"},
		{"mcp: version 2025-11-25 tools up", "Tools of up (MCP 2025-11-25): shout", "2025-11-25"},
		{`mcp: version 2026-07-28 call up shout {"word":"yo"}`, "Result of shout on up (MCP 2026-07-28): YO!", "2026-07-28"},
		{`mcp: call up shout {"word":"hey"}`, "Result of shout on up: HEY!", "2026-07-28"},
		{"mcp: version 25-11-2025 tools up", `speaks no protocol version "25-11-2025"; it speaks 2026-07-28, 2025-11-25`, ""},
		{"mcp: version", "Use: mcp: [version <YYYY-MM-DD>] tools <server>", ""},
		{"mcp: version 2025-11-25", "Use: mcp: [version <YYYY-MM-DD>] tools <server>", ""},
	} {
		before := len(message(p.client.snapshot(id)))
		was := wire()
		if _, err := p.prompt(testCtx(t), id, c.prompt); err != nil {
			t.Fatalf("%s: %v", c.prompt, err)
		}
		got := message(p.client.snapshot(id))[before:]
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: answered %q, want %q in it", c.prompt, got, c.want)
		}
		if c.wire == "" {
			if wire() != was {
				t.Errorf("%s: a request reached the server", c.prompt)
			}
		} else if wire() != c.wire {
			t.Errorf("%s: the requests went out at %q, want %q", c.prompt, wire(), c.wire)
		}
	}
}
