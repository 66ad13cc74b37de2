package oauthtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// DefaultAdminScope is the scope admin_op needs unless
// [MCPOptions.AdminScope] names another.
const DefaultAdminScope = "mcp:admin"

// MCPOptions configures [NewMCPServer].
type MCPOptions struct {
	// ScopesSupported is the scopes_supported of the protected resource
	// metadata: the scopes a client asks for by default. They also head
	// the scope list of every insufficient_scope challenge.
	ScopesSupported []string
	// EchoScope is the scope a call of the echo tool needs ("": any valid
	// token).
	EchoScope string
	// AdminScope is the scope a call of the admin_op tool needs, in
	// addition to EchoScope. Default: DefaultAdminScope.
	AdminScope string
}

// MCPServer is an MCP server on 127.0.0.1 whose every request needs an
// access token that its [AuthServer] issued and still considers valid. Its
// tools:
//
//   - echo {text}: answers "echo: <text>"; needs MCPOptions.EchoScope.
//   - admin_op: answers "admin_op: done"; needs MCPOptions.EchoScope and
//     MCPOptions.AdminScope.
//
// Other methods (initialize, tools/list, …) need only a valid token. A
// request without a valid token gets 401 with `WWW-Authenticate: Bearer
// error="invalid_token", resource_metadata="…"`; a tool call with a token
// that lacks a scope gets 403 with `error="insufficient_scope",
// scope="<ScopesSupported, EchoScope and the tool's scope>"`. It is safe for
// concurrent use.
type MCPServer struct {
	// URL is the MCP endpoint, <base>/mcp: the resource the tokens are
	// for.
	URL string

	srv  *httptest.Server
	as   *AuthServer
	opts MCPOptions

	mu         sync.Mutex
	override   http.Handler
	requests   int
	authorized int
	bearers    []string
}

// NewMCPServer starts an MCP server protected by as. Close it when done.
func NewMCPServer(as *AuthServer, opts MCPOptions) *MCPServer {
	if opts.AdminScope == "" {
		opts.AdminScope = DefaultAdminScope
	}
	m := &MCPServer{as: as, opts: opts}
	server := mcp.NewServer(&mcp.Implementation{Name: "oauthtest-mcp", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "Echoes its text."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + in.Text}}}, nil, nil
	})
	mcp.AddTool(server, &mcp.Tool{Name: "admin_op", Description: "An operation that needs the admin scope."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "admin_op: done"}}}, nil, nil
	})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})

	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, r *http.Request) {
		doc := map[string]any{"resource": m.URL, "authorization_servers": []string{as.URL}}
		if len(opts.ScopesSupported) > 0 {
			doc["scopes_supported"] = opts.ScopesSupported
		}
		writeJSON(w, http.StatusOK, doc)
	})
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		json.Unmarshal(body, &msg) // a batch or no body: no tool to check
		m.mu.Lock()
		m.requests++
		m.mu.Unlock()
		bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		scopes, valid := as.Valid(bearer)
		if !ok || !valid {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="invalid_token", resource_metadata=%q`, m.ResourceMetadataURL()))
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if msg.Method == "tools/call" {
			if need := m.needs(msg.Params.Name); !covers(scopes, need) {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="insufficient_scope", scope=%q, resource_metadata=%q`,
					strings.Join(union(opts.ScopesSupported, need), " "), m.ResourceMetadataURL()))
				http.Error(w, "forbidden", http.StatusForbidden)
				return
			}
		}
		m.mu.Lock()
		m.authorized++
		m.bearers = append(m.bearers, bearer)
		m.mu.Unlock()
		handler.ServeHTTP(w, r)
	})
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		h := m.override
		m.mu.Unlock()
		if h == nil {
			h = mux
		}
		h.ServeHTTP(w, r)
	}))
	m.URL = m.srv.URL + "/mcp"
	return m
}

// needs returns the scopes a call of tool needs.
func (m *MCPServer) needs(tool string) []string {
	var need []string
	if m.opts.EchoScope != "" {
		need = append(need, m.opts.EchoScope)
	}
	if tool == "admin_op" {
		need = append(need, m.opts.AdminScope)
	}
	return need
}

// Close shuts the server down.
func (m *MCPServer) Close() { m.srv.Close() }

// ResourceMetadataURL returns the URL of the server's RFC 9728 protected
// resource metadata.
func (m *MCPServer) ResourceMetadataURL() string {
	return m.srv.URL + "/.well-known/oauth-protected-resource/mcp"
}

// Override makes h answer every request in the server's place (nil
// restores the server). Requests h answers are not counted.
func (m *MCPServer) Override(h http.Handler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.override = h
}

// Stats returns how many requests reached the MCP endpoint and how many of
// them were authorized (a valid token with the scopes needed).
func (m *MCPServer) Stats() (requests, authorized int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests, m.authorized
}

// Bearers returns the bearer token of each authorized request, in order.
func (m *MCPServer) Bearers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.bearers)
}

// covers reports whether have holds every scope of need.
func covers(have, need []string) bool {
	for _, s := range need {
		if !slices.Contains(have, s) {
			return false
		}
	}
	return true
}

// union returns a followed by the scopes of b that a lacks.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
