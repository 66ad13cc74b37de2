package demoagent

import (
	"fmt"
	"strings"

	acp "github.com/coder/acp-go-sdk"
)

// The demo agent records the MCP servers of session/new and session/load but
// never connects to them: the "mcp" prompt only lists them. Listing and
// calling their tools belongs here when it comes.

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
