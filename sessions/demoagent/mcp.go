package demoagent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"

	acp "github.com/coder/acp-go-sdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// The demo agent records the MCP servers of session/new and session/load.
// The "mcp" prompt lists them; "mcp: tools <server>" and "mcp: call <server>
// <tool> [<json>]" connect to a streamable HTTP one, as a real agent would,
// through the origin-pinned egress client: the headers the gateway gave
// (a child token, say) never follow a redirect elsewhere. Header values are
// never written into an answer.

func (a *agent) mcpServersOf(s *session) []acp.McpServer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]acp.McpServer(nil), s.mcpServers...)
}

// describeMCPServers says which MCP servers a session was given.
func describeMCPServers(servers []acp.McpServer) string {
	if len(servers) == 0 {
		return "No MCP servers were given to this session."
	}
	lines := make([]string, 0, len(servers))
	for _, s := range servers {
		lines = append(lines, "- "+describeMCPServer(s))
	}
	return fmt.Sprintf("MCP servers (%d, not connected by the demo agent):\n%s", len(servers), strings.Join(lines, "\n"))
}

func describeMCPServer(s acp.McpServer) string {
	switch {
	case s.Http != nil:
		return fmt.Sprintf("%s (http %s)", s.Http.Name, s.Http.Url)
	case s.Sse != nil:
		return fmt.Sprintf("%s (sse %s)", s.Sse.Name, s.Sse.Url)
	case s.Stdio != nil:
		return fmt.Sprintf("%s (stdio %s)", s.Stdio.Name, strings.Join(append([]string{s.Stdio.Command}, s.Stdio.Args...), " "))
	case s.Acp != nil:
		return fmt.Sprintf("%s (acp)", s.Acp.Name)
	}
	return "(unknown transport)"
}

// mcpUsage says how the "mcp:" prompts are written.
const mcpUsage = "Use: mcp: [version <YYYY-MM-DD>] tools <server>, or mcp: [version <YYYY-MM-DD>] call <server> <tool> [<json arguments>]"

// mcp serves "mcp: tools <server>" and "mcp: call <server> <tool> [<json>]",
// each optionally after "version <v>": the MCP protocol version the client
// asks for (go-sdk's default, its newest, otherwise), so that a test can
// drive one agent through an MCP route at each version. With a version, the
// answer names the version the server agreed.
func (t *turn) mcp(arg string) (acp.StopReason, error) {
	version := ""
	if first, rest := cutField(arg); first == "version" {
		version, arg = cutField(rest)
		if version == "" || arg == "" {
			return acp.StopReasonEndTurn, t.say(mcpUsage)
		}
		if !slices.Contains(mcp.SupportedProtocolVersions(), version) {
			return acp.StopReasonEndTurn, t.say(fmt.Sprintf("My MCP client speaks no protocol version %q; it speaks %s.", version, strings.Join(mcp.SupportedProtocolVersions(), ", ")))
		}
	}
	verb, rest := cutField(arg)
	name, rest := cutField(rest)
	tool, rest := cutField(rest)
	if name == "" || (verb != "tools" && verb != "call") || (verb == "call" && tool == "") {
		return acp.StopReasonEndTurn, t.say(mcpUsage)
	}
	var server *acp.McpServerHttpInline
	for _, s := range t.a.mcpServersOf(t.s) {
		if s.Http != nil && s.Http.Name == name {
			server = s.Http
		}
	}
	if server == nil {
		return acp.StopReasonEndTurn, t.say(fmt.Sprintf("I was given no HTTP MCP server named %q.\n%s", name, describeMCPServers(t.a.mcpServersOf(t.s))))
	}
	ctx, cancel := context.WithTimeout(t.ctx, time.Minute)
	defer cancel()
	cs, err := connectMCP(ctx, server, version)
	if err != nil {
		return acp.StopReasonEndTurn, t.say(fmt.Sprintf("Connecting to MCP server %q failed: %v", server.Name, err))
	}
	defer cs.Close()
	on := server.Name
	if version != "" {
		on += fmt.Sprintf(" (MCP %s)", cs.InitializeResult().ProtocolVersion)
	}
	if verb == "tools" {
		res, err := cs.ListTools(ctx, nil)
		if err != nil {
			return acp.StopReasonEndTurn, t.say(fmt.Sprintf("Listing the tools of %q failed: %v", server.Name, err))
		}
		names := make([]string, 0, len(res.Tools))
		for _, tool := range res.Tools {
			names = append(names, tool.Name)
		}
		sort.Strings(names)
		return acp.StopReasonEndTurn, t.say(fmt.Sprintf("Tools of %s: %s", on, strings.Join(names, ", ")))
	}
	// After "call <server> <tool>", the rest of the prompt is the arguments.
	var args map[string]any
	if rest != "" {
		if err := json.Unmarshal([]byte(rest), &args); err != nil {
			return acp.StopReasonEndTurn, t.say(fmt.Sprintf("The arguments must be a JSON object: %v", err))
		}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return acp.StopReasonEndTurn, t.say(fmt.Sprintf("Calling %s on %s failed: %v", tool, on, err))
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	if res.StructuredContent != nil && len(text) == 0 {
		raw, _ := json.Marshal(res.StructuredContent)
		text = append(text, string(raw))
	}
	prefix := "Result of"
	if res.IsError {
		prefix = "Tool error from"
	}
	return acp.StopReasonEndTurn, t.say(fmt.Sprintf("%s %s on %s: %s", prefix, tool, on, strings.Join(text, "\n")))
}

// cutField splits s, trimmed, at its first run of white space.
func cutField(s string) (first, rest string) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, unicode.IsSpace)
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimSpace(s[i:])
}

// connectMCP opens an MCP session to an HTTP server given in session/new,
// at protocol version version (go-sdk's default when empty).
func connectMCP(ctx context.Context, s *acp.McpServerHttpInline, version string) (*mcp.ClientSession, error) {
	names := make([]string, 0, len(s.Headers))
	for _, h := range s.Headers {
		names = append(names, h.Name)
	}
	headers := s.Headers
	hc, err := pinnedfetch.New(s.Url, names, pinnedfetch.WithCredentials(func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			for _, h := range headers {
				r.Header.Set(h.Name, h.Value)
			}
			return next.RoundTrip(r)
		})
	}))
	if err != nil {
		return nil, err
	}
	client := mcp.NewClient(&mcp.Implementation{Name: Name, Version: Version}, nil)
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.Url, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
