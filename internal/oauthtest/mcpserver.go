package oauthtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	// DPoPNonce makes the server require a nonce of its own in the DPoP
	// proofs of DPoP-bound tokens (RFC 9449 §9): a proof without it gets
	// 401 with `WWW-Authenticate: DPoP error="use_dpop_nonce"` and the
	// nonce in a DPoP-Nonce header.
	DPoPNonce bool
	// Stateful makes the server keep sessions (2025-11-25 only: it gives
	// an Mcp-Session-Id at initialize and serves a GET stream), where by
	// default it is stateless and speaks both versions.
	Stateful bool
}

// MCPServer is an MCP server on 127.0.0.1 whose every request needs an
// access token that its [AuthServer] issued and still considers valid. Its
// tools:
//
//   - echo {text}: answers "echo: <text>"; needs MCPOptions.EchoScope.
//   - admin_op: answers "admin_op: done"; needs MCPOptions.EchoScope and
//     MCPOptions.AdminScope.
//   - whoami: answers "whoami: <user>", the user who authorized the call's
//     token (the login_hint of its authorization request: the person who
//     signed in); needs MCPOptions.EchoScope.
//
// Other methods (initialize, tools/list, …) need only a valid token. A
// request without a valid token gets 401 with `WWW-Authenticate: Bearer
// error="invalid_token", resource_metadata="…"` (scheme DPoP when the
// AuthServer speaks DPoP); a tool call with a token that lacks a scope gets
// 403 with `error="insufficient_scope", scope="<ScopesSupported, EchoScope
// and the tool's scope>"`. A token bound to a DPoP key is valid only with
// the DPoP scheme and one fresh proof of that key for the request (RFC 9449
// §7); a proof whose jti was seen before is refused. It is safe for
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
	// credentialed counts the requests that carried any Authorization.
	credentialed int
	bearers      []string
	schemes      []string // the Authorization scheme of each authorized request
	proofs       []DPoPProof
	jtis         map[string]bool
	nonce        string
}

// NewMCPServer starts an MCP server protected by as. Close it when done.
func NewMCPServer(as *AuthServer, opts MCPOptions) *MCPServer {
	if opts.AdminScope == "" {
		opts.AdminScope = DefaultAdminScope
	}
	m := &MCPServer{as: as, opts: opts, jtis: map[string]bool{}}
	if opts.DPoPNonce {
		m.nonce = NewSecret("rs-nonce")
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "oauthtest-mcp", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "Echoes its text."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + in.Text}}}, nil, nil
	})
	mcp.AddTool(server, &mcp.Tool{Name: "whoami", Description: "Says which user of the authorization server the call's token acts for."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		_, token, _ := strings.Cut(req.Extra.Header.Get("Authorization"), " ")
		user, ok := as.UserOf(token)
		switch {
		case !ok:
			user = "(no valid token)"
		case user == "":
			user = "(no user)"
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "whoami: " + user}}}, nil, nil
	})
	mcp.AddTool(server, &mcp.Tool{Name: "admin_op", Description: "An operation that needs the admin scope."}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "admin_op: done"}}}, nil, nil
	})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: !opts.Stateful, JSONResponse: true})

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
		if len(r.Header.Values("Authorization")) > 0 {
			m.credentialed++
		}
		m.mu.Unlock()
		scheme, bearer, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		scopes, jkt, valid := as.bound(bearer)
		if valid {
			valid = m.presented(w, r, scheme, bearer, jkt)
			if w.Header().Get("WWW-Authenticate") != "" {
				return
			}
		}
		if !valid {
			challenge := "Bearer"
			if as.opts.DPoP {
				challenge = `DPoP algs="ES256",`
			}
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`%s error="invalid_token", resource_metadata=%q`, challenge, m.ResourceMetadataURL()))
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
		m.schemes = append(m.schemes, scheme)
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

// presented reports whether a valid token was presented as its binding
// requires: a Bearer token with the Bearer scheme; a DPoP-bound one with
// the DPoP scheme and one valid proof of its key, fresh (jti never seen)
// and, with MCPOptions.DPoPNonce, carrying the server's nonce. A proof
// without the nonce is answered here (401 use_dpop_nonce), with
// WWW-Authenticate set.
func (m *MCPServer) presented(w http.ResponseWriter, r *http.Request, scheme, token, jkt string) bool {
	if jkt == "" {
		return scheme == "Bearer"
	}
	if scheme != "DPoP" {
		return false
	}
	proofs := r.Header.Values("DPoP")
	var p DPoPProof
	var err error
	if len(proofs) != 1 {
		err = fmt.Errorf("%d DPoP headers", len(proofs))
	} else {
		p, err = checkProof(proofs[0], r.Method, m.URL, token, m.as.now())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err != nil:
	case p.JKT != jkt:
		err = errors.New("the proof's key is not the one the token is bound to")
	case m.jtis[p.JTI]:
		err = errors.New("the proof's jti was seen before")
	}
	if err == nil {
		m.jtis[p.JTI] = true
		if m.nonce != "" && p.Nonce != m.nonce {
			p.Err = errUseNonce.Error()
			m.proofs = append(m.proofs, p)
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`DPoP error="use_dpop_nonce", algs="ES256", resource_metadata=%q`, m.ResourceMetadataURL()))
			w.Header().Set("DPoP-Nonce", m.nonce)
			http.Error(w, "use_dpop_nonce", http.StatusUnauthorized)
			return false
		}
	} else {
		p.Err = err.Error()
	}
	m.proofs = append(m.proofs, p)
	return err == nil
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

// Credentialed returns how many requests reached the MCP endpoint with an
// Authorization header, valid or not.
func (m *MCPServer) Credentialed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.credentialed
}

// Schemes returns the Authorization scheme (Bearer or DPoP) of each
// authorized request, in order.
func (m *MCPServer) Schemes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.schemes)
}

// DPoPProofs returns every DPoP proof presented with a DPoP-bound token,
// in order, with Err set for those refused (a nonce challenge included).
func (m *MCPServer) DPoPProofs() []DPoPProof {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.proofs)
}

// DPoPNonce returns the nonce the server requires ("" when
// MCPOptions.DPoPNonce is not set).
func (m *MCPServer) DPoPNonce() string { return m.nonce }

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
