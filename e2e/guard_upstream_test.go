package e2e

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Modes of the hostileFront.
const (
	frontPass     = iota // pass to the server, with hostile answer headers
	frontRefuse          // 401 with a challenge of the server's own
	frontRedirect        // 307 to another server
)

// hostileFront is a reverse proxy in front of a real MCP server that keeps
// the headers of every request it is sent and adds to every answer what
// the guard must keep from the client: a cookie, an auth challenge, CORS
// and origin-wide headers, a header of its own and a trailer. Its mode
// makes it refuse the gateway, or redirect it elsewhere, instead.
type hostileFront struct {
	url      string
	mode     atomic.Int32
	redirect string // where frontRedirect sends

	mu   sync.Mutex
	seen []http.Header
	sids []string // the Mcp-Session-Id values the server gave
}

// hostileAnswerHeaders are what the front adds to every answer.
var hostileAnswerHeaders = map[string]string{
	"Set-Cookie":                  "session=server-cookie; Path=/",
	"Www-Authenticate":            `Bearer resource_metadata="https://idp.evil.example/.well-known/oauth-protected-resource"`,
	"Access-Control-Allow-Origin": "https://evil.example",
	"Strict-Transport-Security":   "max-age=63072000; includeSubDomains",
	"Alt-Svc":                     `h3=":443"; ma=86400`,
	"Clear-Site-Data":             `"*"`,
	"X-Server-Internal":           "db=10.0.0.7",
}

func startHostileFront(t *testing.T, server, redirect string) *hostileFront {
	t.Helper()
	target, err := parseHTTPURL(server)
	if err != nil {
		t.Fatal(err)
	}
	f := &hostileFront{redirect: redirect}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = target.Scheme, target.Host, target.Host
		},
		ModifyResponse: func(resp *http.Response) error {
			if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
				f.mu.Lock()
				f.sids = append(f.sids, sid)
				f.mu.Unlock()
			}
			for k, v := range hostileAnswerHeaders {
				resp.Header.Set(k, v)
			}
			resp.Header.Set("Trailer", "X-Server-Trailer")
			resp.Trailer = http.Header{"X-Server-Trailer": {"trailer-value"}}
			return nil
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen = append(f.seen, r.Header.Clone())
		f.mu.Unlock()
		switch f.mode.Load() {
		case frontRefuse:
			w.Header().Set("Www-Authenticate", `Bearer error="invalid_token"`)
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		case frontRedirect:
			http.Redirect(w, r, f.redirect, http.StatusTemporaryRedirect)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		transport.CloseIdleConnections()
	})
	f.url = srv.URL + "/mcp"
	return f
}

func (f *hostileFront) requests() []http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

func (f *hostileFront) serverSessionIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sids)
}

// TestGuardUpstream puts `guard { upstream URL }` in front of the go-sdk
// everything-server, through a hostileFront, and tries what an attacker
// would: on the way in, headers that would smuggle the client's identity,
// address or cookies to the server; on the way out, the server's cookies,
// challenges, CORS and origin-wide headers and trailers; a session id
// replayed by another token; and a server that refuses the gateway or
// redirects it to another host. The scope map holds as in guard mode with
// reverse_proxy (TestAttackOneReading runs the hostile bodies).
func TestGuardUpstream(t *testing.T) {
	decoy := startRecordingUpstream(t)
	front := startHostileFront(t, startEverythingServer(t), decoy.url)
	site, downSite := freePort(t), freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			upstream %s
			upstream_header X-Upstream-Key {env.GUARD_UPSTREAM_KEY}
		}
		scope simple tools test_simple_text
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			upstream http://127.0.0.1:%d/mcp
		}
		resource http://127.0.0.1:%d/mcp
	}
}
`, AdminPlaceholder, site, front.url, downSite, freePort(t), downSite), "GUARD_UPSTREAM_KEY=upstream-key-s3cret")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", site)
	simple := createToken(t, c, "simple", "--scope", "simple")
	other := createToken(t, c, "other", "--scope", "mcp")
	ctx := context.Background()

	t.Run("a scoped token lists and calls its one tool", func(t *testing.T) {
		cs, err := connectGo(t, url, bearerClient(simple, nil))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		tools, err := cs.ListTools(ctx, nil)
		if err != nil || !slices.Equal(toolNamesOf(tools), []string{"test_simple_text"}) {
			t.Fatalf("tools/list: %v %v, want only test_simple_text", toolNamesOf(tools), err)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text", Arguments: map[string]any{}})
		if err != nil || res.IsError || !strings.Contains(textOf(res.Content), "This is a simple text response") {
			t.Fatalf("test_simple_text: %+v %v", res, err)
		}
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_image_content", Arguments: map[string]any{}}); err == nil {
			t.Fatal("BYPASS: the token called test_image_content, which its scope does not grant")
		}
	})

	t.Run("the server gets the MCP headers and the operator's, nothing of the client's", func(t *testing.T) {
		n := len(front.requests())
		a := post(t, url, simple, initializeBody,
			"Cookie", "gateway-session=client-cookie",
			"X-Forwarded-For", "203.0.113.9",
			"X-Real-Ip", "203.0.113.9",
			"Forwarded", "for=203.0.113.9",
			"Proxy-Authorization", "Basic Y2xpZW50OnNlY3JldA==",
			"Zidane-Client-Ip", "203.0.113.9",
			"X-Upstream-Key", "chosen-by-the-client",
			"User-Agent", "client-agent/1")
		if a.status != http.StatusOK {
			t.Fatalf("initialize: %d %s", a.status, clip(a.body))
		}
		seen := front.requests()
		if len(seen) != n+1 {
			t.Fatalf("the server saw %d requests for one initialize", len(seen)-n)
		}
		h := seen[n]
		if got := h.Get("X-Upstream-Key"); got != "upstream-key-s3cret" {
			t.Errorf("X-Upstream-Key at the server = %q, want the operator's value", got)
		}
		for _, name := range []string{"Authorization", "Cookie", "X-Forwarded-For", "X-Real-Ip", "Forwarded", "Proxy-Authorization", "Zidane-Client-Ip"} {
			if v, ok := h[name]; ok {
				t.Errorf("the server got %s: %q", name, v)
			}
		}
		for name, values := range h {
			for _, v := range values {
				for _, leak := range []string{simple, strings.TrimPrefix(simple, "zds_"), "203.0.113.9", "client-cookie", "chosen-by-the-client"} {
					if strings.Contains(v, leak) {
						t.Errorf("the client's %q reached the server in %s", leak, name)
					}
				}
			}
		}
	})

	t.Run("the client gets none of the server's cookies, challenges, CORS, origin-wide headers or trailers", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(initializeBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+simple)
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "serverInfo") {
			t.Fatalf("initialize: %d %s", resp.StatusCode, clip(string(body)))
		}
		for name := range hostileAnswerHeaders {
			if v, ok := resp.Header[name]; ok {
				t.Errorf("the client got the server's %s: %q", name, v)
			}
		}
		if v, ok := resp.Header["Trailer"]; ok {
			t.Errorf("the client got the server's Trailer header: %q", v)
		}
		if len(resp.Trailer) != 0 {
			t.Errorf("the client got the server's trailers: %v", resp.Trailer)
		}
		sid := resp.Header.Get("Mcp-Session-Id")
		if sid == "" {
			t.Fatal("no Mcp-Session-Id in the answer")
		}
		if slices.Contains(front.serverSessionIDs(), sid) {
			t.Fatalf("the client got the server's own session id %q, not a sealed one", sid)
		}
	})

	t.Run("another token's request with a session id gets 404, and the server sees nothing", func(t *testing.T) {
		a := post(t, url, simple, initializeBody)
		sid := a.header.Get("Mcp-Session-Id")
		if a.status != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %d %q", a.status, sid)
		}
		n := len(front.requests())
		b := post(t, url, other, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25")
		if b.status != http.StatusNotFound || b.rpc.Error.Code != -32001 {
			t.Errorf("another token with the session id: %d %s, want 404 with -32001", b.status, clip(b.body))
		}
		if got := len(front.requests()); got != n {
			t.Errorf("the server saw %d requests for the replayed session id", got-n)
		}
		// The token that owns it still lists.
		if a := post(t, url, simple, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25"); a.status != http.StatusOK || !strings.Contains(a.body, "test_simple_text") {
			t.Errorf("the owner, tools/list: %d %s", a.status, clip(a.body))
		}
	})

	t.Run("a server that refuses the gateway is the operator's error: 502, its challenge kept back", func(t *testing.T) {
		front.mode.Store(frontRefuse)
		defer front.mode.Store(frontPass)
		a := post(t, url, simple, initializeBody)
		if a.status != http.StatusBadGateway || !strings.Contains(a.rpc.Error.Message, "refused the gateway") {
			t.Errorf("a 401 from the server: %d %s, want 502 that says the server refused the gateway", a.status, clip(a.body))
		}
		if v := a.header.Get("Www-Authenticate"); v != "" {
			t.Errorf("the client got the server's challenge %q", v)
		}
	})

	t.Run("a redirect is not followed", func(t *testing.T) {
		front.mode.Store(frontRedirect)
		defer front.mode.Store(frontPass)
		a := post(t, url, simple, initializeBody)
		if a.status != http.StatusBadGateway || !strings.Contains(a.rpc.Error.Message, "redirected") {
			t.Errorf("a 307 from the server: %d %s, want 502 that says it redirected", a.status, clip(a.body))
		}
		if a.header.Get("Location") != "" {
			t.Errorf("the client got the server's Location %q", a.header.Get("Location"))
		}
		decoy.mu.Lock()
		hits := len(decoy.seen)
		decoy.mu.Unlock()
		if hits != 0 {
			t.Errorf("BYPASS: the redirect's target got %d requests", hits)
		}
	})

	t.Run("a server that is down gets a JSON-RPC error that says so", func(t *testing.T) {
		a := post(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", downSite), other, initializeBody)
		if a.status != http.StatusBadGateway || !strings.Contains(a.rpc.Error.Message, "could not reach") {
			t.Errorf("the server is down: %d %s, want 502 that says the gateway could not reach it", a.status, clip(a.body))
		}
	})

	t.Run("every call to the server is audited with the client's address", func(t *testing.T) {
		var calls, redirects int
		for _, l := range auditLines(c) {
			switch l["event"] {
			case "upstream_call":
				calls++
				route := l["route"]
				if route != "guard:/mcp" && route != fmt.Sprintf("guard:http://127.0.0.1:%d/mcp", downSite) || l["upstream"] != "guard" || l["client_ip"] != "127.0.0.1" {
					t.Errorf("upstream_call line: %v", l)
				}
			case "redirect":
				redirects++
			}
		}
		if calls < 6 {
			t.Errorf("%d upstream_call audit lines, want one per call to the server", calls)
		}
		if redirects == 0 {
			t.Error("no audit line for the refused redirect")
		}
		if strings.Contains(c.Logs(), "upstream-key-s3cret") {
			t.Error("the upstream key reached caddy's log")
		}
	})
}
