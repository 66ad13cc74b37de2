//lint:file-ignore SA1019 the pass-through must relay logging and sampling, deprecated only from protocol 2026-07-28 (SEP-2577), so the tests drive them with a real client and server.

package passthrough

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The fixture: a real go-sdk MCP server upstream that wants an API key, the
// PassThrough mounted behind a stand-in for the edge that maps a bearer
// token to a principal (and, unlike the real edge, leaves Authorization on
// the request, so the route is shown to drop it itself), and real go-sdk
// clients.

const (
	testAPIKey   = "k-123"
	aliceBearer  = "Bearer alice-secret"
	bobBearer    = "Bearer bob-secret"
	clientCookie = "edge_session=c00kie"
	legacyMCP    = "2025-11-25"
	waitLong     = 5 * time.Second
)

var (
	testSessionKey = bytes.Repeat([]byte{42}, sessionid.KeySize)
	principals     = map[string]policy.Principal{
		aliceBearer: {TokenID: "tok_alice", Name: "alice", Kind: policy.KindUser, Source: "token"},
		bobBearer:   {TokenID: "tok_bob", Name: "bob", Kind: policy.KindUser, Source: "token"},
	}
)

// seenRequest is what an upstream received.
type seenRequest struct {
	method, path, query string
	header              http.Header
}

// recordingUpstream is a go-sdk MCP server on 127.0.0.1 that records every request.
type recordingUpstream struct {
	server *mcp.Server
	srv    *httptest.Server
	gets   chan struct{}

	mu   sync.Mutex
	seen []seenRequest
}

type upstreamConfig struct {
	wantKey    string // "" accepts any request
	stateless  bool
	eventStore bool // keep events, so streams can resume with Last-Event-ID
}

func newUpstream(t testing.TB, cfg upstreamConfig) *recordingUpstream {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "v1.0.0"}, nil)
	addTestTools(server)
	handlerOpts := &mcp.StreamableHTTPOptions{Stateless: cfg.stateless}
	if cfg.eventStore {
		handlerOpts.EventStore = mcp.NewMemoryEventStore(nil)
	}
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, handlerOpts)
	u := &recordingUpstream{server: server, gets: make(chan struct{}, 64)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, seenRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone()})
		u.mu.Unlock()
		// Headers a client must never see.
		w.Header().Set("Set-Cookie", "upstream_affinity=node-7")
		w.Header().Set("X-Upstream-Internal", "node-7")
		if cfg.wantKey != "" && r.Header.Get("X-Api-Key") != cfg.wantKey {
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="https://upstream.example/.well-known/oauth-protected-resource"`)
			http.Error(w, "missing or wrong API key", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodGet {
			select {
			case u.gets <- struct{}{}:
			default:
			}
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	closeServer(t, u.srv)
	return u
}

// closeServer closes srv when the test ends, cutting open streams first:
// httptest's Close waits for every request to finish.
func closeServer(t testing.TB, srv *httptest.Server) {
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
}

func (u *recordingUpstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

// sessionIDs returns the distinct Mcp-Session-Id values the upstream saw.
func (u *recordingUpstream) sessionIDs() []string {
	var ids []string
	for _, r := range u.requests() {
		if id := r.header.Get("Mcp-Session-Id"); id != "" && !contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type textIn struct {
	Text string `json:"text"`
}

func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// addTestTools gives the upstream tools that exercise the protocol: a plain
// call, a log message and progress, and server-to-client sampling and
// elicitation.
func addTestTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo the text."},
		func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
			return textResult(in.Text), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "work", Description: "Log, report progress, finish."},
		func(ctx context.Context, req *mcp.CallToolRequest, _ textIn) (*mcp.CallToolResult, any, error) {
			if err := req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Logger: "work", Data: "working"}); err != nil {
				return nil, nil, err
			}
			if tok := req.Params.GetProgressToken(); tok != nil {
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: "half way"}); err != nil {
					return nil, nil, err
				}
			}
			return textResult("done"), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "pause", Description: "Close the answer's stream; answer on the resumed one."},
		func(_ context.Context, req *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
			req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: 10 * time.Millisecond})
			time.Sleep(30 * time.Millisecond)
			return textResult("resumed " + in.Text), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "ask", Description: "Ask the client's model."},
		func(ctx context.Context, req *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{
				MaxTokens: 16,
				Messages:  []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: in.Text}}},
			})
			if err != nil {
				return nil, nil, err
			}
			return textResult("model said: " + res.Content.(*mcp.TextContent).Text), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "confirm", Description: "Ask the user."},
		func(ctx context.Context, req *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
			res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{
				Message: in.Text,
				RequestedSchema: map[string]any{
					"type":       "object",
					"properties": map[string]any{"answer": map[string]any{"type": "string"}},
				},
			})
			if err != nil {
				return nil, nil, err
			}
			return textResult(res.Action + ": " + fmt.Sprint(res.Content["answer"])), nil, nil
		})
}

// auditLog collects what the route reports.
type auditLog struct {
	mu        sync.Mutex
	calls     []upstream.CallRecord
	refusals  []upstream.Refusal
	decisions []pinnedfetch.Decision
}

func (a *auditLog) options(o *Options) {
	o.OnCall = func(r upstream.CallRecord) { a.mu.Lock(); a.calls = append(a.calls, r); a.mu.Unlock() }
	o.OnRefusal = func(r upstream.Refusal) { a.mu.Lock(); a.refusals = append(a.refusals, r); a.mu.Unlock() }
	o.OnDecision = func(d pinnedfetch.Decision) { a.mu.Lock(); a.decisions = append(a.decisions, d); a.mu.Unlock() }
}

func (a *auditLog) snapshot() ([]upstream.CallRecord, []upstream.Refusal, []pinnedfetch.Decision) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]upstream.CallRecord(nil), a.calls...), append([]upstream.Refusal(nil), a.refusals...), append([]pinnedfetch.Decision(nil), a.decisions...)
}

// waitCall waits for a call record that match accepts; records are
// reported when an exchange ends, which may be after the client has read
// the answer.
func (a *auditLog) waitCall(t *testing.T, what string, match func(upstream.CallRecord) bool) upstream.CallRecord {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		calls, _, _ := a.snapshot()
		for _, c := range calls {
			if match(c) {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no call record for %s; have %+v", what, calls)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// route is a PassThrough behind the stand-in edge.
type route struct {
	pt    *PassThrough
	edge  *httptest.Server
	audit *auditLog
}

// endpoint is where clients connect: a path under the route that the
// upstream must never see, with a query it must not see either.
func (r *route) endpoint() string { return r.edge.URL + "/mcp/github/some/tail?client=1" }

func newRoute(t testing.TB, upstreamURL string, edit func(*upstream.Config, *Options)) *route {
	t.Helper()
	u := upstream.Config{
		Name:    "github",
		URL:     upstreamURL,
		Headers: map[string]string{"X-Api-Key": "${TEST_KEY}"},
	}
	a := &auditLog{}
	opts := Options{
		Lookup: func(name string) (string, bool) {
			return map[string]string{"TEST_KEY": testAPIKey}[name], name == "TEST_KEY"
		},
		SessionKey: testSessionKey,
		Route:      "broker:github",
	}
	a.options(&opts)
	if edit != nil {
		edit(&u, &opts)
	}
	pt, err := New(u, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pt.Close)
	return &route{pt: pt, edge: newEdge(t, pt), audit: a}
}

// newEdge stands in for the zidane_mcp edge: it authenticates the bearer
// token and puts the principal in the request context.
func newEdge(t testing.TB, next http.Handler) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := principals[r.Header.Get("Authorization")]
		if !ok {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(policy.WithPrincipal(r.Context(), p)))
	}))
	closeServer(t, srv)
	return srv
}

// clientCredentials adds the client's own credentials, which must stay at
// the edge.
type clientCredentials struct {
	bearer string
	next   http.RoundTripper
}

func (c clientCredentials) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Set("Authorization", c.bearer)
	r.Header.Set("Cookie", clientCookie)
	r.Header.Set("Proxy-Authorization", "Basic cHJveHk6c2VjcmV0")
	return c.next.RoundTrip(r)
}

func httpClient(t testing.TB, bearer string) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: clientCredentials{bearer: bearer, next: tr}}
}

// connect opens a go-sdk client session through the route, on the
// session-based protocol unless version says otherwise.
func connect(t testing.TB, endpoint, bearer string, opts *mcp.ClientOptions, version string) (*mcp.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	transport := &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: httpClient(t, bearer), MaxRetries: 1}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v1.0.0"}, opts).
		Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { cs.Close() })
	return cs, nil
}

func mustConnect(t testing.TB, endpoint, bearer string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs, err := connect(t, endpoint, bearer, opts, legacyMCP)
	if err != nil {
		t.Fatalf("connect through the route: %v", err)
	}
	return cs
}

func callText(t testing.TB, cs *mcp.ClientSession, tool, text string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"text": text}})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("call %s: tool error %+v", tool, res.Content)
	}
	return res.Content[0].(*mcp.TextContent).Text
}

// post sends one raw JSON-RPC POST through the edge.
func post(t *testing.T, endpoint, bearer, sessionID, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", bearer)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", legacyMCP)
	if sessionID != "" {
		req.Header.Set("Mcp-Session-Id", sessionID)
	}
	resp, err := httpClient(t, bearer).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

const (
	initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	toolsListBody  = `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`
)

// decodeRPCError decodes the JSON-RPC error of a refusal.
func decodeRPCError(t *testing.T, body string) (id json.RawMessage, code int, message string) {
	t.Helper()
	var m struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &m); err != nil || m.JSONRPC != "2.0" || m.Error.Message == "" {
		t.Fatalf("body is not a JSON-RPC error (%v): %s", err, body)
	}
	return m.ID, m.Error.Code, m.Error.Message
}

// assertNoUpstreamLeak checks that nothing of the upstream's own headers
// reached the client.
func assertNoUpstreamLeak(t *testing.T, h http.Header) {
	t.Helper()
	for _, name := range []string{"Set-Cookie", "Www-Authenticate", "X-Upstream-Internal"} {
		if v := h.Values(name); len(v) > 0 {
			t.Errorf("the client got the upstream's %s: %q", name, v)
		}
	}
}

func TestPassThroughToolsAndAudit(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	cs := mustConnect(t, rt.endpoint(), aliceBearer, nil)

	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if strings.Join(names, ",") != "ask,confirm,echo,pause,work" {
		t.Errorf("tools/list through the route = %v", names)
	}
	if got := callText(t, cs, "echo", "hello"); got != "hello" {
		t.Errorf("echo = %q", got)
	}

	rec := rt.audit.waitCall(t, "tools/call echo", func(c upstream.CallRecord) bool { return c.Method == "tools/call" })
	want := upstream.CallRecord{Upstream: "github", Route: "broker:github", HTTPMethod: "POST", Method: "tools/call", Tool: "echo",
		TokenID: "tok_alice", TokenName: "alice", Outcome: upstream.OutcomeOK, Status: http.StatusOK}
	rec.Duration = 0
	if rec != want {
		t.Errorf("call record = %+v\nwant %+v", rec, want)
	}
	rt.audit.waitCall(t, "initialize", func(c upstream.CallRecord) bool { return c.Method == "initialize" && c.Outcome == upstream.OutcomeOK })

	calls, refusals, decisions := rt.audit.snapshot()
	if len(refusals) != 0 {
		t.Errorf("refusals: %+v", refusals)
	}
	if len(decisions) == 0 || decisions[0].Action != pinnedfetch.ActionSend || !decisions[0].Credentials {
		t.Errorf("decisions = %+v; want hop 0 sent with credentials", decisions)
	}
	dump := fmt.Sprintf("%+v %+v", calls, decisions)
	for _, secret := range []string{testAPIKey, "alice-secret", "c00kie", cs.ID()} {
		if strings.Contains(dump, secret) {
			t.Errorf("audit records hold %q: %s", secret, dump)
		}
	}
}

func TestPassThroughLoggingAndProgress(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	logs := make(chan *mcp.LoggingMessageParams, 4)
	progress := make(chan *mcp.ProgressNotificationParams, 4)
	cs := mustConnect(t, rt.endpoint(), aliceBearer, &mcp.ClientOptions{
		LoggingMessageHandler:       func(_ context.Context, r *mcp.LoggingMessageRequest) { logs <- r.Params },
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) { progress <- r.Params },
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	params := &mcp.CallToolParams{Name: "work", Arguments: map[string]any{"text": "go"}}
	params.SetProgressToken("p-1")
	if res, err := cs.CallTool(ctx, params); err != nil || res.IsError {
		t.Fatalf("call work: %v %+v", err, res)
	}
	select {
	case l := <-logs:
		if l.Data != "working" || l.Logger != "work" {
			t.Errorf("log message = %+v", l)
		}
	case <-ctx.Done():
		t.Fatal("the upstream's log message never reached the client")
	}
	select {
	case p := <-progress:
		if p.ProgressToken != "p-1" || p.Progress != 1 || p.Message != "half way" {
			t.Errorf("progress = %+v", p)
		}
	case <-ctx.Done():
		t.Fatal("the upstream's progress notification never reached the client")
	}
}

func TestPassThroughSamplingAndElicitation(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	cs := mustConnect(t, rt.endpoint(), aliceBearer, &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, r *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			prompt := r.Params.Messages[0].Content.(*mcp.TextContent).Text
			return &mcp.CreateMessageResult{Model: "test-model", Role: "assistant", Content: &mcp.TextContent{Text: "echo of " + prompt}}, nil
		},
		ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"answer": "yes to " + r.Params.Message}}, nil
		},
	})
	if got := callText(t, cs, "ask", "hi"); got != "model said: echo of hi" {
		t.Errorf("sampling round trip = %q", got)
	}
	if got := callText(t, cs, "confirm", "deploy?"); got != "accept: yes to deploy?" {
		t.Errorf("elicitation round trip = %q", got)
	}
	// The client's answers went upstream as POSTs of JSON-RPC responses.
	rt.audit.waitCall(t, "the client's answer", func(c upstream.CallRecord) bool {
		return c.HTTPMethod == "POST" && c.Method == "" && c.Status == http.StatusAccepted && c.Outcome == upstream.OutcomeOK
	})
}

func TestPassThroughNoTokenPassthrough(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	cs := mustConnect(t, rt.endpoint(), aliceBearer, nil)
	callText(t, cs, "echo", "x")

	reqs := up.requests()
	if len(reqs) < 3 {
		t.Fatalf("upstream saw %d requests; want initialize, initialized, tools/call at least", len(reqs))
	}
	for _, r := range reqs {
		for _, name := range []string{"Authorization", "Cookie", "Proxy-Authorization", "Origin", "X-Forwarded-For"} {
			if v := r.header.Values(name); len(v) > 0 {
				t.Errorf("%s %s reached the upstream with the client's %s: %q", r.method, r.path, name, v)
			}
		}
		if got := r.header.Get("X-Api-Key"); got != testAPIKey {
			t.Errorf("%s reached the upstream with X-Api-Key %q; want the value of ${TEST_KEY}", r.method, got)
		}
		if r.path != "/mcp" || r.query != "" {
			t.Errorf("%s reached the upstream at %q?%s; want the configured /mcp whatever the client's path and query", r.method, r.path, r.query)
		}
	}
}

func TestPassThroughSessionBinding(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	cs := mustConnect(t, rt.endpoint(), aliceBearer, nil)
	callText(t, cs, "echo", "x")

	clientID := cs.ID()
	upstreamIDs := up.sessionIDs()
	if clientID == "" || len(upstreamIDs) != 1 {
		t.Fatalf("client session id %q, upstream session ids %q; want one of each", clientID, upstreamIDs)
	}
	if clientID == upstreamIDs[0] || strings.Contains(clientID, upstreamIDs[0]) {
		t.Fatalf("the client holds the upstream's session id %q", upstreamIDs[0])
	}
	if got, err := rt.pt.ids.Open(clientID, "tok_alice", "broker:github"); err != nil || got != upstreamIDs[0] {
		t.Fatalf("the client's session id opens to %q, %v; want the upstream's %q", got, err, upstreamIDs[0])
	}

	// The same id, token and route: the session goes on.
	resp, body := post(t, rt.endpoint(), aliceBearer, clientID, toolsListBody)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"echo"`) {
		t.Fatalf("alice replaying her own session: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("Mcp-Session-Id"); got != "" && got != clientID {
		t.Errorf("the session id changed under the client: %q → %q", clientID, got)
	}

	// Another route under the same key: a second pass-through to the same
	// upstream.
	other := newRoute(t, up.srv.URL+"/mcp", func(_ *upstream.Config, o *Options) { o.Route = "broker:other" })

	raw := []byte(clientID)
	raw[len(raw)/2] ^= 'A' ^ 'B'
	seenBefore := len(up.requests())
	for _, tc := range []struct {
		name, endpoint, bearer, id, wantToken string
		audit                                 *auditLog
	}{
		{"another token", rt.endpoint(), bobBearer, clientID, "tok_bob", rt.audit},
		{"another route", other.endpoint(), aliceBearer, clientID, "tok_alice", other.audit},
		{"forged", rt.endpoint(), aliceBearer, "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywt", "tok_alice", rt.audit},
		{"garbled", rt.endpoint(), aliceBearer, string(raw), "tok_alice", rt.audit},
		{"the upstream's own id", rt.endpoint(), aliceBearer, upstreamIDs[0], "tok_alice", rt.audit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, tc.endpoint, tc.bearer, tc.id, toolsListBody)
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("status %d, want 404 (unknown session): %s", resp.StatusCode, body)
			}
			id, code, msg := decodeRPCError(t, body)
			if string(id) != "7" || code != message.CodeUnknownSession || !strings.Contains(msg, "initializ") {
				t.Errorf("error id %s code %d message %q; want the request's id and a message that says to initialize again", id, code, msg)
			}
			_, refusals, _ := tc.audit.snapshot()
			last := refusals[len(refusals)-1]
			if last.Reason != "session_unknown" || last.TokenID != tc.wantToken || last.Status != http.StatusNotFound || last.Method != "tools/list" {
				t.Errorf("refusal = %+v", last)
			}
			if strings.Contains(fmt.Sprintf("%+v", last), tc.id) {
				t.Errorf("the refusal record quotes the session id: %+v", last)
			}
		})
	}
	if n := len(up.requests()); n != seenBefore {
		t.Errorf("refused requests reached the upstream: %d more requests", n-seenBefore)
	}
}

func TestPassThroughRedirectDropsCredentials(t *testing.T) {
	// The pinned origin answers every request with a 307 to another
	// loopback origin, which serves MCP.
	final := newUpstream(t, upstreamConfig{})
	var pinnedMu sync.Mutex
	var pinnedSeen []http.Header
	pinned := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pinnedMu.Lock()
		pinnedSeen = append(pinnedSeen, r.Header.Clone())
		pinnedMu.Unlock()
		http.Redirect(w, r, final.srv.URL+"/mcp", http.StatusTemporaryRedirect)
	}))
	closeServer(t, pinned)
	rt := newRoute(t, pinned.URL+"/mcp", nil)

	cs := mustConnect(t, rt.endpoint(), aliceBearer, nil)
	if got := callText(t, cs, "echo", "over there"); got != "over there" {
		t.Errorf("echo after the redirect = %q", got)
	}

	pinnedMu.Lock()
	if len(pinnedSeen) == 0 || pinnedSeen[0].Get("X-Api-Key") != testAPIKey {
		t.Errorf("the pinned origin did not get the credential: %v", pinnedSeen)
	}
	pinnedMu.Unlock()
	for _, r := range final.requests() {
		for _, name := range []string{"X-Api-Key", "Authorization", "Cookie"} {
			if v := r.header.Values(name); len(v) > 0 {
				t.Errorf("%s on the other origin carried %s %q", r.method, name, v)
			}
		}
	}
	_, _, decisions := rt.audit.snapshot()
	var followed bool
	for _, d := range decisions {
		if d.Action == pinnedfetch.ActionFollow {
			followed = true
			if d.Credentials || d.Status != http.StatusTemporaryRedirect {
				t.Errorf("follow decision = %+v; want a 307 hop without credentials", d)
			}
		}
	}
	if !followed {
		t.Errorf("no follow decision reported: %+v", decisions)
	}
}

func TestPassThroughUpstreamRefusesCredentials(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", func(_ *upstream.Config, o *Options) {
		o.Lookup = func(string) (string, bool) { return "stale-key", true }
	})
	if _, err := connect(t, rt.endpoint(), aliceBearer, nil, legacyMCP); err == nil {
		t.Fatal("connect succeeded with the wrong upstream key")
	}

	resp, body := post(t, rt.endpoint(), aliceBearer, "", initializeBody)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: an upstream 401 is about the gateway's credential, not the client's", resp.StatusCode)
	}
	assertNoUpstreamLeak(t, resp.Header)
	id, code, msg := decodeRPCError(t, body)
	if string(id) != "1" || code != message.CodeUpstream || !strings.Contains(msg, "refused the gateway's credentials") || !strings.Contains(msg, "operator") {
		t.Errorf("error id %s code %d message %q", id, code, msg)
	}
	if strings.Contains(body, "resource_metadata") || strings.Contains(body, "upstream.example") || strings.Contains(body, "stale-key") {
		t.Errorf("the answer leaks upstream auth details: %s", body)
	}
	rec := rt.audit.waitCall(t, "the refused initialize", func(c upstream.CallRecord) bool { return c.Status == http.StatusUnauthorized })
	if rec.Outcome != "Unauthorized" || rec.Method != "initialize" {
		t.Errorf("call record = %+v", rec)
	}
}

func TestPassThroughResponseHeaders(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	resp, body := post(t, rt.endpoint(), aliceBearer, "", initializeBody)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"serverInfo"`) {
		t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	assertNoUpstreamLeak(t, resp.Header)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	if id := resp.Header.Get("Mcp-Session-Id"); id == "" || contains(up.sessionIDs(), id) {
		t.Errorf("Mcp-Session-Id = %q; want a sealed id", id)
	}
}

func TestPassThroughStandaloneStream(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	changed := make(chan struct{}, 16)
	mustConnect(t, rt.endpoint(), aliceBearer, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	})
	select {
	case <-up.gets:
	case <-time.After(waitLong):
		t.Fatal("the client's GET stream never reached the upstream")
	}
	// A notification sent outside any request goes on the GET stream. The
	// stream registers just after the upstream sees the GET, so add tools
	// until one notification arrives.
	deadline := time.After(waitLong)
	for i := 0; ; i++ {
		up.server.AddTool(&mcp.Tool{Name: fmt.Sprintf("late_%d", i), InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return textResult("late"), nil
			})
		select {
		case <-changed:
			return
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("tools/list_changed never arrived over the GET stream")
		}
	}
}

func TestPassThroughDelete(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	cs := mustConnect(t, rt.endpoint(), aliceBearer, &mcp.ClientOptions{})
	callText(t, cs, "echo", "x")
	clientID, upstreamID := cs.ID(), up.sessionIDs()[0]
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}

	var deleted bool
	for _, r := range up.requests() {
		if r.method == http.MethodDelete {
			deleted = true
			if got := r.header.Get("Mcp-Session-Id"); got != upstreamID {
				t.Errorf("DELETE reached the upstream with session %q; want its own %q", got, upstreamID)
			}
		}
	}
	if !deleted {
		t.Fatal("the client's DELETE never reached the upstream")
	}
	rt.audit.waitCall(t, "DELETE", func(c upstream.CallRecord) bool { return c.HTTPMethod == "DELETE" && c.Outcome == upstream.OutcomeOK })

	// The upstream has ended the session: its 404 reaches the client as
	// is, and the client knows to initialize again.
	resp, body := post(t, rt.endpoint(), aliceBearer, clientID, toolsListBody)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a request on the deleted session got %d, want the upstream's 404: %s", resp.StatusCode, body)
	}
	rt.audit.waitCall(t, "the upstream's 404", func(c upstream.CallRecord) bool { return c.Status == http.StatusNotFound && c.Outcome == "Not Found" })
}

func TestPassThroughResumption(t *testing.T) {
	// The upstream closes the answer's stream mid-call; the client resumes
	// it with a GET carrying Last-Event-ID, through the route.
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey, eventStore: true})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	cs := mustConnect(t, rt.endpoint(), aliceBearer, nil)
	if got := callText(t, cs, "pause", "later"); got != "resumed later" {
		t.Errorf("pause = %q", got)
	}
	upstreamID := up.sessionIDs()[0]
	var resumed bool
	for _, r := range up.requests() {
		if r.method == http.MethodGet && r.header.Get("Last-Event-Id") != "" {
			resumed = true
			if got := r.header.Get("Mcp-Session-Id"); got != upstreamID {
				t.Errorf("the resuming GET carried session %q; want the upstream's %q", got, upstreamID)
			}
		}
	}
	if !resumed {
		t.Error("no GET with Last-Event-ID reached the upstream")
	}
}

func TestPassThroughNewProtocol(t *testing.T) {
	// Protocol 2026-07-28 is stateless: no session id, and the method and
	// tool name travel in Mcp-Method and Mcp-Name, which the upstream
	// checks against the body.
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey, stateless: true})
	rt := newRoute(t, up.srv.URL+"/mcp", nil)
	cs, err := connect(t, rt.endpoint(), aliceBearer, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if v := cs.InitializeResult().ProtocolVersion; v < "2026" {
		t.Fatalf("negotiated %q; want the stateless protocol", v)
	}
	if got := callText(t, cs, "echo", "stateless"); got != "stateless" {
		t.Errorf("echo = %q", got)
	}
	var named bool
	for _, r := range up.requests() {
		if r.header.Get("Mcp-Method") == "tools/call" && r.header.Get("Mcp-Name") == "echo" {
			named = true
		}
	}
	if !named {
		t.Error("Mcp-Method and Mcp-Name did not reach the upstream")
	}
}

// hangingUpstream answers a POST with SSE headers (or none, when
// beforeHeaders) and then waits for the request to end, reporting it.
func hangingUpstream(t *testing.T, beforeHeaders bool) (*httptest.Server, chan struct{}) {
	ended := make(chan struct{}, 1)
	testDone := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Go's HTTP/1 server notices a closed connection only once the
		// body has been read, as every MCP server does first.
		io.Copy(io.Discard, r.Body)
		if !beforeHeaders {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, ": waiting\n\n")
			http.NewResponseController(w).Flush()
		}
		select {
		case <-r.Context().Done():
			ended <- struct{}{}
		case <-testDone:
		}
	}))
	closeServer(t, srv)
	t.Cleanup(func() { close(testDone) })
	return srv, ended
}

func TestPassThroughClientDisconnect(t *testing.T) {
	for _, tc := range []struct {
		name          string
		beforeHeaders bool
		outcome       string
	}{
		// Leaving a stream is how a client ends it; leaving before any
		// answer cancels the call.
		{"while streaming", false, upstream.OutcomeOK},
		{"before the upstream answers", true, upstream.OutcomeCanceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, ended := hangingUpstream(t, tc.beforeHeaders)
			rt := newRoute(t, srv.URL+"/mcp", nil)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rt.endpoint(), strings.NewReader(toolsListBody))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			client := httpClient(t, aliceBearer)
			if tc.beforeHeaders {
				go func() {
					// Give the request time to reach the upstream, then leave.
					time.Sleep(100 * time.Millisecond)
					cancel()
				}()
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
					t.Fatalf("got an answer (%d) from an upstream that never answers", resp.StatusCode)
				}
			} else {
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				line := make([]byte, len(": waiting"))
				if _, err := io.ReadFull(resp.Body, line); err != nil || string(line) != ": waiting" {
					t.Fatalf("first bytes of the stream %q, %v; want the upstream's comment, flushed", line, err)
				}
				cancel()
				resp.Body.Close()
			}
			select {
			case <-ended:
			case <-time.After(waitLong):
				t.Fatal("the upstream request went on after the client left")
			}
			rec := rt.audit.waitCall(t, "the abandoned call", func(upstream.CallRecord) bool { return true })
			if rec.Outcome != tc.outcome {
				t.Errorf("outcome %q, want %q", rec.Outcome, tc.outcome)
			}
		})
	}
}

func TestPassThroughHeaderTimeout(t *testing.T) {
	srv, _ := hangingUpstream(t, true)
	rt := newRoute(t, srv.URL+"/mcp", func(u *upstream.Config, _ *Options) { u.Timeout = 100 * time.Millisecond })
	resp, body := post(t, rt.endpoint(), aliceBearer, "", toolsListBody)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504: %s", resp.StatusCode, body)
	}
	if _, code, msg := decodeRPCError(t, body); code != message.CodeUpstream || !strings.Contains(msg, "did not answer within 100ms") {
		t.Errorf("error %d %q", code, msg)
	}
	rec := rt.audit.waitCall(t, "the timed-out call", func(c upstream.CallRecord) bool { return c.Outcome == upstream.OutcomeError })
	if !strings.Contains(rec.Detail, "no response headers within 100ms") {
		t.Errorf("detail = %q", rec.Detail)
	}
}

func TestPassThroughUnreachableUpstream(t *testing.T) {
	// An upstream that hangs up on every connection. (A closed server's
	// port, as before, could be taken by another test's server meanwhile,
	// which then answered.)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := "http://" + ln.Addr().String()
	rt := newRoute(t, addr+"/mcp?key=query-secret", nil)
	resp, body := post(t, rt.endpoint(), aliceBearer, "", toolsListBody)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: %s", resp.StatusCode, body)
	}
	rec := rt.audit.waitCall(t, "the failed call", func(c upstream.CallRecord) bool { return c.Outcome == upstream.OutcomeError })
	if strings.Contains(body+rec.Detail, "query-secret") {
		t.Errorf("the URL's query leaked: body %s, detail %q", body, rec.Detail)
	}
}

func TestPassThroughRefusals(t *testing.T) {
	up := newUpstream(t, upstreamConfig{wantKey: testAPIKey})
	rt := newRoute(t, up.srv.URL+"/mcp", func(_ *upstream.Config, o *Options) { o.MaxBodyBytes = 64 })

	t.Run("no principal", func(t *testing.T) {
		rec := httptest.NewRecorder()
		rt.pt.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(toolsListBody)))
		if rec.Code != http.StatusInternalServerError {
			t.Errorf("status %d, want 500", rec.Code)
		}
	})
	t.Run("method", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPut, rt.endpoint(), strings.NewReader(toolsListBody))
		req.Header.Set("Authorization", aliceBearer)
		resp, err := httpClient(t, aliceBearer).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, POST, DELETE" {
			t.Errorf("status %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
		}
	})
	t.Run("body too large", func(t *testing.T) {
		resp, body := post(t, rt.endpoint(), aliceBearer, "", initializeBody)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("status %d, want 413: %s", resp.StatusCode, body)
		}
	})
	t.Run("two session ids", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, rt.endpoint(), nil)
		req.Header.Add("Mcp-Session-Id", "a")
		req.Header.Add("Mcp-Session-Id", "b")
		resp, err := httpClient(t, aliceBearer).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("status %d, want 400", resp.StatusCode)
		}
	})
	_, refusals, _ := rt.audit.snapshot()
	var reasons []string
	for _, r := range refusals {
		reasons = append(reasons, r.Reason)
	}
	if got := strings.Join(reasons, ","); got != "no_principal,method_not_allowed,body_too_large,session_repeated" {
		t.Errorf("refusal reasons %s", got)
	}
	if len(up.requests()) != 0 {
		t.Errorf("refused requests reached the upstream: %d", len(up.requests()))
	}
}

func TestNewPassThroughRefuses(t *testing.T) {
	lookup := func(name string) (string, bool) {
		v, ok := map[string]string{"TEST_KEY": testAPIKey, "BROKEN": "line\nbreak-secret"}[name]
		return v, ok
	}
	opts := Options{Lookup: lookup, SessionKey: testSessionKey}
	for _, tc := range []struct {
		name   string
		u      upstream.Config
		opts   *Options
		want   string
		secret string
	}{
		{"sse", upstream.Config{Name: "old", URL: "https://mcp.example.com/sse"}, nil, "aggregated route", ""},
		{"stdio", upstream.Config{Name: "local", Command: "mcp-server"}, nil, "aggregated route", ""},
		{"unset header variable", upstream.Config{Name: "gh", URL: "https://mcp.example.com/mcp", Headers: map[string]string{"X-Api-Key": "${MISSING}"}}, nil, "set MISSING", ""},
		{"line break after expansion", upstream.Config{Name: "gh", URL: "https://mcp.example.com/mcp", Headers: map[string]string{"X-Api-Key": "${BROKEN}"}}, nil, "line break", "break-secret"},
		{"reserved header", upstream.Config{Name: "gh", URL: "https://mcp.example.com/mcp", Headers: map[string]string{"mcp-session-id": "fixed"}}, nil, "Mcp-Session-Id is set by the pass-through route", ""},
		{"reserved Accept", upstream.Config{Name: "gh", URL: "https://mcp.example.com/mcp", Headers: map[string]string{"Accept": "*/*"}}, nil, "Accept is set by the pass-through route", ""},
		{"unset url variable", upstream.Config{Name: "gh", URL: "https://${HOST}/mcp"}, nil, "set HOST", ""},
		{"plain http off loopback", upstream.Config{Name: "gh", URL: "http://mcp.example.com/mcp"}, nil, "", ""},
		{"short session key", upstream.Config{Name: "gh", URL: "https://mcp.example.com/mcp"}, &Options{SessionKey: []byte("short")}, "32 random bytes", ""},
		{"no session key", upstream.Config{Name: "gh", URL: "https://mcp.example.com/mcp"}, &Options{}, "32 random bytes", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts
			if tc.opts != nil {
				o = *tc.opts
			}
			pt, err := New(tc.u, o)
			if err == nil {
				pt.Close()
				t.Fatal("NewPassThrough accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
				t.Errorf("error %q quotes the header value", err)
			}
		})
	}
}

func TestCopyRequestHeaders(t *testing.T) {
	in := http.Header{}
	for k, v := range map[string]string{
		"Authorization":        "Bearer client",
		"Proxy-Authorization":  "Basic x",
		"Cookie":               "a=b",
		"Origin":               "https://evil.example",
		"Referer":              "https://app.example/page",
		"User-Agent":           "client/1",
		"X-Forwarded-For":      "10.0.0.1",
		"X-Api-Key":            "client-supplied",
		"Mcp-Session-Id":       "sealed",
		"Keep-Alive":           "timeout=5",
		"Content-Type":         "application/json",
		"Accept":               "application/json, text/event-stream",
		"Mcp-Protocol-Version": "2025-11-25",
		"Last-Event-Id":        "e-1",
		"Mcp-Method":           "tools/call",
		"Mcp-Name":             "echo",
		"Mcp-Param-Region":     "eu",
		"Traceparent":          "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"Tracestate":           "v=1",
	} {
		in.Set(k, v)
	}
	in.Set("Connection", "keep-alive, Tracestate")
	out := http.Header{}
	copyRequestHeaders(out, in)
	want := "Accept,Content-Type,Last-Event-Id,Mcp-Method,Mcp-Name,Mcp-Param-Region,Mcp-Protocol-Version,Traceparent"
	if s := strings.Join(sortedHeaderNames(out), ","); s != want {
		t.Errorf("forwarded %s\nwant      %s", s, want)
	}
}

func sortedHeaderNames(h http.Header) []string {
	m := map[string]string{}
	for k := range h {
		m[k] = ""
	}
	return slices.Sorted(maps.Keys(m))
}

// BenchmarkPassThrough compares one tools/call through the pass-through
// route with the same call direct to the upstream and through a plain
// httputil.ReverseProxy (with the same stand-in edge and API key), all
// in-process on loopback with a go-sdk client. Allocations count the
// client, the proxy and the upstream together.
func BenchmarkPassThrough(b *testing.B) {
	up := newUpstream(b, upstreamConfig{wantKey: testAPIKey})
	target, _ := url.Parse(up.srv.URL + "/mcp")
	proxyTransport := &http.Transport{}
	b.Cleanup(proxyTransport.CloseIdleConnections)
	reverseProxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = target
			pr.Out.Host = ""
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Set("X-Api-Key", testAPIKey)
		},
		FlushInterval: -1,
		Transport:     proxyTransport,
	}
	direct := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("X-Api-Key", testAPIKey)
		up.srv.Config.Handler.ServeHTTP(w, r)
	}))
	closeServer(b, direct)

	for _, bc := range []struct {
		name     string
		endpoint func() string
	}{
		{"direct", func() string { return direct.URL + "/mcp" }},
		{"reverse_proxy", func() string { return newEdge(b, reverseProxy).URL + "/mcp" }},
		{"passthrough", func() string { return newRoute(b, up.srv.URL+"/mcp", nil).endpoint() }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cs := mustConnect(b, bc.endpoint(), aliceBearer, &mcp.ClientOptions{})
			ctx := context.Background()
			params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hello"}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := cs.CallTool(ctx, params); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
