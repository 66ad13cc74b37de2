//lint:file-ignore SA1019 the tests check the logging capability that session events need.

package mcpendpoint

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// principals stands in for the edge's token store: bearer token → principal.
var principals = map[string]policy.Principal{
	"alice-token": {TokenID: "tok-alice", Name: "alice", Kind: policy.KindUser, Scopes: []string{"chat"}, Source: "token"},
	"bob-token":   {TokenID: "tok-bob", Name: "bob", Kind: policy.KindUser, Scopes: []string{"chat"}, Source: "token"},
	// alice's phone: another token of alice's, who owns what her first
	// token (its own owner, tok-alice) created.
	"phone-token": {TokenID: "tok-phone", Name: "phone", Kind: policy.KindUser, Scopes: []string{"chat"}, Source: "token", Owner: "tok-alice"},
	"robot-token": {TokenID: "tok-robot", Name: "robot", Kind: policy.KindMachine, Scopes: []string{"chat"}, Source: "token"},
}

// edge is the part of the zidane_mcp edge the endpoint relies on: it puts
// the principal of a known bearer token in the request context.
func edge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if p, ok := principals[tok]; ok {
			r = r.WithContext(policy.WithPrincipal(r.Context(), p))
		}
		next.ServeHTTP(w, r)
	})
}

// harnessOwner is how a test drives the fake engine directly, as an agent
// would: it reaches every session.
var harnessOwner = sessions.Owner{OtherSessions: sessions.AccessAll, OtherInteractions: sessions.AccessAll}

type harness struct {
	t      *testing.T
	engine *memSessions
	ep     *Endpoint
	srv    *httptest.Server
}

func newHarness(t *testing.T, edit ...func(*Options)) *harness {
	t.Helper()
	var opts Options
	for _, f := range edit {
		f(&opts)
	}
	return newHarnessWith(t, nil, opts)
}

// newHarnessWith is newHarness behind a route that gives access (nil:
// none, as without the gateway), with opts' OnRefusal.
func newHarnessWith(t *testing.T, access *Access, opts Options) *harness {
	t.Helper()
	engine := newMemSessions()
	opts.Sessions, opts.Agents = engine, []string{"claude", "codex"}
	ep, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	var front http.Handler = ep
	if access != nil {
		front = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ep.ServeHTTP(w, r.WithContext(WithAccess(r.Context(), *access)))
		})
	}
	srv := httptest.NewServer(edge(front)) // listens on 127.0.0.1
	h := &harness{t: t, engine: engine, ep: ep, srv: srv}
	t.Cleanup(func() {
		if err := ep.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		srv.Close()
	})
	return h
}

// bearer adds a token to every request, as an MCP client configured with
// one does.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.base.RoundTrip(r)
}

// legacyVersion is the protocol version of the stateful endpoint, where
// events are pushed as notifications/message.
const legacyVersion = "2025-11-25"

// connect opens an MCP session with the real go-sdk client at 2025-11-25,
// the version whose pushes most tests are about (connectAt chooses).
func (h *harness) connect(token string, opts *mcp.ClientOptions, rt http.RoundTripper) *mcp.ClientSession {
	h.t.Helper()
	return h.connectAt(legacyVersion, token, opts, rt)
}

// connectAt connects the go-sdk client pinned to protocol version (""
// lets it choose: it tries 2026-07-28 first).
func (h *harness) connectAt(version, token string, opts *mcp.ClientOptions, rt http.RoundTripper) *mcp.ClientSession {
	h.t.Helper()
	if rt == nil {
		rt = http.DefaultTransport
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, opts)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:   h.srv.URL,
		HTTPClient: &http.Client{Transport: bearer{token, rt}},
		MaxRetries: -1,
	}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		h.t.Fatalf("connect: %v", err)
	}
	h.t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool; a protocol error fails the test, since every problem
// must come back as a tool result.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: protocol error %v", tool, args, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// ok asserts a successful result and decodes its structured content into v.
func ok(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	if res.IsError {
		t.Fatalf("unexpected tool error: %s", text(res))
	}
	if v == nil {
		return
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("structured content %s: %v", raw, err)
	}
}

// errorCodeOf is the code in a tool error's structured content.
func errorCodeOf(res *mcp.CallToolResult) string {
	m, _ := res.StructuredContent.(map[string]any)
	code, _ := m["error"].(string)
	return code
}

// failed asserts a tool error whose text contains each of want.
func failed(t *testing.T, res *mcp.CallToolResult, want ...string) {
	t.Helper()
	if !res.IsError {
		t.Fatalf("want a tool error, got: %s", text(res))
	}
	for _, w := range want {
		if !strings.Contains(text(res), w) {
			t.Errorf("error %q does not contain %q", text(res), w)
		}
	}
}

func TestToolsListShowsBothToolsWithSchemas(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		tools[tool.Name] = tool
	}
	for name, verbs := range map[string][]string{
		"sessions":     {"create", "send", "steer", "cancel", "read", "list", "transcript", "wait", "events"},
		"interactions": {"pending", "answer"},
	} {
		tool := tools[name]
		if tool == nil {
			t.Fatalf("tools/list lacks %q", name)
		}
		schema, _ := json.Marshal(tool.InputSchema)
		var s struct {
			Type       string   `json:"type"`
			Required   []string `json:"required"`
			Properties map[string]struct {
				Enum []string `json:"enum"`
			} `json:"properties"`
		}
		if err := json.Unmarshal(schema, &s); err != nil {
			t.Fatal(err)
		}
		if s.Type != "object" || !slices.Contains(s.Required, "verb") {
			t.Errorf("%s schema: type %q, required %v", name, s.Type, s.Required)
		}
		if got := s.Properties["verb"].Enum; !slices.Equal(got, verbs) {
			t.Errorf("%s verbs = %v, want %v", name, got, verbs)
		}
		for _, v := range verbs {
			if !strings.Contains(tool.Description, v) {
				t.Errorf("%s description does not explain %s", name, v)
			}
		}
	}
	d := tools["sessions"].Description
	for _, want := range []string{"Do NOT wait", "<session-event>", "finishes, fails or needs a decision"} {
		if !strings.Contains(d, want) {
			t.Errorf("sessions description lacks %q", want)
		}
	}
	schema, _ := json.Marshal(tools["sessions"].InputSchema)
	if !strings.Contains(string(schema), `"enum":["claude","codex"]`) {
		t.Errorf("agent enum missing from schema %s", schema)
	}
}

func TestCapabilitiesDeclareLoggingAndChannel(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	caps := cs.InitializeResult().Capabilities
	if caps.Logging == nil || caps.Tools == nil {
		t.Errorf("capabilities lack logging or tools: %+v", caps)
	}
	if _, ok := caps.Experimental["claude/channel"]; !ok {
		t.Errorf("capabilities lack experimental claude/channel: %+v", caps.Experimental)
	}
}

// post sends one raw JSON-RPC POST, as a client would, and returns the
// status and body.
func post(t *testing.T, url, token, sessionID, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if sessionID != "" {
		req.Header.Set("Mcp-Session-Id", sessionID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

func TestSessionIsBoundToItsToken(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`

	status, body := post(t, h.srv.URL, "bob-token", cs.ID(), list)
	if status != http.StatusForbidden {
		t.Errorf("bob presenting alice's MCP session: status %d (%s), want 403", status, body)
	}
	status, body = post(t, h.srv.URL, "alice-token", cs.ID(), list)
	if status != http.StatusOK || !strings.Contains(body, `"sessions"`) {
		t.Errorf("alice on her own MCP session: status %d, body %s", status, body)
	}
}

func TestRefusesRequestsWithoutPrincipal(t *testing.T) {
	h := newHarness(t)
	status, body := post(t, h.srv.URL, "", "", initializeBody)
	if status != http.StatusUnauthorized || !strings.Contains(body, "no authenticated caller") {
		t.Errorf("no principal: status %d (%s), want 401", status, body)
	}
	status, body = post(t, h.srv.URL, "unknown-token", "", initializeBody)
	if status != http.StatusUnauthorized {
		t.Errorf("unknown token: status %d (%s), want 401", status, body)
	}
}

func TestRefusesMachinePrincipal(t *testing.T) {
	h := newHarness(t)
	status, body := post(t, h.srv.URL, "robot-token", "", initializeBody)
	if status != http.StatusForbidden || !strings.Contains(body, "machine token") {
		t.Errorf("machine principal: status %d (%s), want 403", status, body)
	}
}

func TestCallerIdentityComesFromEachRequest(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "fix it"}), nil)
	h.engine.mu.Lock()
	owner := h.engine.lastOwner
	h.engine.mu.Unlock()
	if owner.TokenID != "tok-alice" || owner.TokenName != "alice" || owner.MCPSession != cs.ID() {
		t.Errorf("owner = %+v, want alice on MCP session %s", owner, cs.ID())
	}
}

func TestCloseEndsSessionsAndRefusesNewRequests(t *testing.T) {
	h := newHarness(t)
	h.connect("alice-token", nil, nil)
	if err := h.ep.Close(); err != nil {
		t.Fatal(err)
	}
	h.ep.mu.Lock()
	n := len(h.ep.peers)
	h.ep.mu.Unlock()
	if n != 0 {
		t.Errorf("%d MCP sessions still tracked after Close", n)
	}
	status, _ := post(t, h.srv.URL, "alice-token", "", initializeBody)
	if status != http.StatusServiceUnavailable {
		t.Errorf("after Close: status %d, want 503", status)
	}
}

func TestDisconnectedSessionIsForgotten(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	id := cs.ID()
	if h.peer(id) == nil {
		t.Fatal("connected MCP session is not tracked")
	}
	cs.Close() // DELETE
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The periodic sweep (every peerSweepEvery) forgets it; run one now.
	for h.ep.forgetClosed(); h.peer(id) != nil; h.ep.forgetClosed() {
		select {
		case <-ctx.Done():
			t.Fatal("closed MCP session is still tracked")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (h *harness) peer(id string) *peer {
	h.ep.mu.Lock()
	defer h.ep.mu.Unlock()
	return h.ep.peers[id]
}
