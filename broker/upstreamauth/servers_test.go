package upstreamauth

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// env is one upstream (an oauthtest.MCPServer) with its authorization
// server, and what a test needs to build clients for it.
type env struct {
	onState func(Status) // given to the clients built
	// subjects is given to the clients built as Options.SubjectToken.
	subjects func(ctx context.Context, owner string) (string, error)
	t        *testing.T
	clock    *oauthtest.Clock
	as       *oauthtest.AuthServer
	mcp      *oauthtest.MCPServer
	store    storage.Storage
	key      []byte
	logs     *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newEnv starts an authorization server with asOpts (on a test clock) and
// an MCP server whose protected resource metadata lists prmScopes and
// whose echo tool needs toolScope ("" for none).
func newEnv(t *testing.T, asOpts oauthtest.AuthServerOptions, prmScopes []string, toolScope string) *env {
	t.Helper()
	return newEnvWith(t, asOpts, oauthtest.MCPOptions{ScopesSupported: prmScopes, EchoScope: toolScope})
}

// newEnvWith is newEnv with the MCP server's options in full.
func newEnvWith(t *testing.T, asOpts oauthtest.AuthServerOptions, mcpOpts oauthtest.MCPOptions) *env {
	t.Helper()
	clk := oauthtest.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	asOpts.Now = clk.Now
	as := oauthtest.NewAuthServer(asOpts)
	t.Cleanup(as.Close)
	m := oauthtest.NewMCPServer(as, mcpOpts)
	t.Cleanup(m.Close)
	key := make([]byte, 32)
	rand.Read(key)
	return &env{
		t: t, clock: clk, as: as, mcp: m,
		store: &certmagic.FileStorage{Path: t.TempDir()},
		key:   key,
		logs:  &syncBuffer{},
	}
}

const testUpstream = "up"

// client builds an upstreamauth client (a gateway replica) for the env.
func (e *env) client(cfg Config) *Client {
	e.t.Helper()
	c, err := New(context.Background(), testUpstream, e.mcp.URL, cfg, Options{
		Storage: e.store,
		Key:     e.key,
		Logger:  slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:     e.clock.Now,
		OnState: e.onState,

		SubjectToken: e.subjects,
	})
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(c.Close)
	return c
}

// counts returns the grant type and the client authentication method of
// each token request the authorization server received.
func (e *env) counts() (grants, authSeen []string) {
	for _, r := range e.as.TokenRequests() {
		grants = append(grants, r.GrantType)
		authSeen = append(authSeen, r.AuthMethod)
	}
	return grants, authSeen
}

// scopeReqs returns the scope of each token request.
func (e *env) scopeReqs() []string {
	var out []string
	for _, r := range e.as.TokenRequests() {
		out = append(out, r.Scope)
	}
	return out
}

// resources returns the resource of each token request.
func (e *env) resources() []string {
	var out []string
	for _, r := range e.as.TokenRequests() {
		out = append(out, r.Resource)
	}
	return out
}

// httpClient is the broker's egress for the upstream: pinned to its
// origin, with c's Transport as the credential layer.
func (e *env) httpClient(c *Client) *http.Client {
	e.t.Helper()
	hc, err := pinnedfetch.New(e.mcp.URL, nil, pinnedfetch.WithCredentials(c.Transport))
	if err != nil {
		e.t.Fatal(err)
	}
	return hc
}

// callEcho connects a go-sdk client through c and calls the echo tool.
func (e *env) callEcho(c *Client, text string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "gateway", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.mcp.URL, HTTPClient: e.httpClient(c), DisableStandaloneSSE: true}, nil)
	if err != nil {
		return err
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}})
	if err != nil {
		return err
	}
	if res.IsError || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != "echo: "+text {
		return fmt.Errorf("unexpected result %+v", res)
	}
	return nil
}

// post sends one raw JSON-RPC request through c and returns the answer's
// status.
func (e *env) post(c *Client, replayable bool) (int, error) {
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	req, err := http.NewRequest(http.MethodPost, e.mcp.URL, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	if !replayable {
		req.GetBody = nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := e.httpClient(c).Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// authorize runs BeginLogin, plays the browser (the redirect is not
// followed) and returns the query of the redirect to the callback, and the
// authorization URL.
func (e *env) authorize(c *Client) (url.Values, string) {
	e.t.Helper()
	authURL, err := c.BeginLogin(context.Background())
	if err != nil {
		e.t.Fatalf("BeginLogin: %v", err)
	}
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := browser.Get(authURL)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		e.t.Fatalf("authorization endpoint answered %d", resp.StatusCode)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		e.t.Fatal(err)
	}
	return loc.Query(), authURL
}

// login runs a whole login: authorize and the callback.
func (e *env) login(c *Client) {
	e.t.Helper()
	q, _ := e.authorize(c)
	if err := c.Callback(context.Background(), q); err != nil {
		e.t.Fatalf("Callback: %v", err)
	}
}

// stored returns the raw bytes stored for the upstream.
func (e *env) stored() []byte {
	b, err := e.store.Load(context.Background(), StorageKey(testUpstream))
	if err != nil {
		e.t.Fatalf("load: %v", err)
	}
	return b
}
