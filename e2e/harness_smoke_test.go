package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// These tests prove the harness itself against real peers, with no code of
// this module in the path except cmd/caddy.

func TestHarnessTSClientListsEverythingServerTools(t *testing.T) {
	url := startEverythingServer(t)

	out, err := tsClient(t, url, "", "list-tools")
	if err != nil {
		t.Fatalf("list-tools: %v\n%s", err, out)
	}
	var names []string
	if err := json.Unmarshal([]byte(out), &names); err != nil {
		t.Fatalf("list-tools printed %q: %v", out, err)
	}
	if !slices.Contains(names, "test_simple_text") {
		t.Errorf("tools = %v, want test_simple_text among them", names)
	}

	out, err = tsClient(t, url, "", "call", "test_simple_text", "{}")
	if err != nil {
		t.Fatalf("call: %v\n%s", err, out)
	}
	var result mcp.CallToolResult
	if err := json.Unmarshal([]byte(out), &result); err != nil {
		t.Fatalf("call printed %q: %v", out, err)
	}
	if len(result.Content) != 1 || result.IsError {
		t.Fatalf("call result = %s, want one text content", out)
	}
	if text, ok := result.Content[0].(*mcp.TextContent); !ok || !strings.Contains(text.Text, "simple text") {
		t.Errorf("call result = %s, want the simple text", out)
	}

	out, err = tsClient(t, url, "", "call", "no_such_tool", "{}")
	if err == nil {
		t.Fatalf("call of an unknown tool succeeded: %s", out)
	}
	if f := parseTSFailure(t, out); f.RPCCode != -32602 {
		t.Errorf("unknown tool: failure = %+v, want JSON-RPC code -32602", f)
	}
}

func TestHarnessTSClientReportsHTTPStatusAndSendsHeaders(t *testing.T) {
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Header.Clone():
		default:
		}
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		http.Error(w, `{"error":"invalid_token"}`, http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)

	out, err := tsClient(t, srv.URL+"/mcp", "secret-token", "--origin", "https://app.example", "list-tools")
	if err == nil {
		t.Fatalf("list-tools against a 401 succeeded: %s", out)
	}
	if f := parseTSFailure(t, out); f.Status != http.StatusUnauthorized {
		t.Errorf("failure = %+v, want status 401", f)
	}
	h := <-got
	if h.Get("Authorization") != "Bearer secret-token" || h.Get("Origin") != "https://app.example" {
		t.Errorf("request headers = %v, want the bearer token and the origin", h)
	}
}

func TestHarnessTSSessionKeepsSessionAndDeliversNotifications(t *testing.T) {
	url := startEverythingServer(t)
	s := startTSSession(t, url, "")
	if s.SessionID == "" {
		t.Fatal("stateful everything-server assigned no session id")
	}
	if _, f := s.Do(t, map[string]any{"op": "set-level", "level": "debug"}); f != nil {
		t.Fatalf("set-level: %+v", f)
	}
	res, f := s.Do(t, map[string]any{"op": "call", "name": "test_tool_with_logging"})
	if f != nil {
		t.Fatalf("call: %+v", f)
	}
	if !strings.Contains(string(res), "executed successfully") {
		t.Errorf("call result = %s", res)
	}
	for i := range 3 {
		select {
		case n := <-s.Notifications():
			if !strings.Contains(string(n), "notifications/message") {
				t.Errorf("notification %d = %s, want a log message", i, n)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d of 3 log notifications", i)
		}
	}
	res, f = s.Do(t, map[string]any{"op": "session-id"})
	if f != nil || string(res) != fmt.Sprintf("%q", s.SessionID) {
		t.Errorf("session-id = %s, %+v; want the same session %q", res, f, s.SessionID)
	}
}

func TestHarnessGoClientCallsEverythingServer(t *testing.T) {
	url := startEverythingServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	client := mcp.NewClient(&mcp.Implementation{Name: "zidane-e2e", Version: "1.0.0"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer session.Close()
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"})
	if err != nil {
		t.Fatalf("call test_simple_text: %v", err)
	}
	if len(res.Content) != 1 || res.IsError {
		t.Fatalf("result = %+v, want one text content", res)
	}
	if text, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(text.Text, "simple text") {
		t.Errorf("content = %#v, want the simple text", res.Content[0])
	}
}

func TestHarnessNodeEverythingServer(t *testing.T) {
	url := startNodeEverythingServer(t)
	out, err := tsClient(t, url, "", "call", "echo", `{"message":"hello from go"}`)
	if err != nil {
		t.Fatalf("call echo: %v\n%s", err, out)
	}
	if !strings.Contains(out, "hello from go") {
		t.Errorf("echo result = %s", out)
	}
}

func TestHarnessCaddyServesReloadsAndRestarts(t *testing.T) {
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	caddyfile := func(body string) string {
		return fmt.Sprintf("{\n\tadmin %s\n}\n\nhttp://%s {\n\trespond %q\n}\n", AdminPlaceholder, site, body)
	}
	c := startCaddy(t, caddyfile("first"))
	get := func() string {
		t.Helper()
		resp, err := shortClient.Get("http://" + site + "/")
		if err != nil {
			t.Fatalf("GET %s: %v", site, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %q %v", site, resp.Status, b, err)
		}
		return string(b)
	}

	if got := get(); got != "first" {
		t.Fatalf("before reload: body %q, want %q", got, "first")
	}
	c.Reload(t, caddyfile("second"))
	if got := get(); got != "second" {
		t.Fatalf("after reload: body %q, want %q", got, "second")
	}
	if out, err := c.TryReload(t, "{\n\tadmin "+AdminPlaceholder+"\n}\nhttp://"+site+" {\n\tno_such_directive\n}\n"); err == nil {
		t.Fatalf("a reload with an unknown directive succeeded: %s", out)
	}
	if got := get(); got != "second" {
		t.Fatalf("after a refused reload: body %q, want %q", got, "second")
	}

	stdout, stderr, err := c.Run(t, "version")
	if err != nil || !strings.Contains(stdout, "v2.11.9") {
		t.Errorf("caddy version = %q, %q, %v; want v2.11.9", stdout, stderr, err)
	}

	c.Restart(t)
	if got := get(); got != "second" {
		t.Fatalf("after restart: body %q, want %q (the last config accepted)", got, "second")
	}
	c.Reload(t, caddyfile("third"))
	if got := get(); got != "third" {
		t.Fatalf("after restart and reload: body %q, want %q", got, "third")
	}
	if !strings.Contains(c.Logs(), "serving initial configuration") {
		t.Errorf("caddy logs lack the start line:\n%s", c.Logs())
	}
}

func TestHarnessAuthProxyAddsHeaders(t *testing.T) {
	got := make(chan *http.Request, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		io.WriteString(w, "ok")
	}))
	t.Cleanup(upstream.Close)

	url := authProxy(t, upstream.URL+"/mcp", http.Header{"Authorization": {"Bearer proxied"}})
	if !strings.HasSuffix(url, "/mcp") || strings.HasPrefix(url, upstream.URL) {
		t.Fatalf("authProxy URL = %q, want the proxy's origin with path /mcp", url)
	}
	proxyOrigin := url[:strings.Index(url, "/mcp")]
	send := func(host, origin string) *http.Request {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url+"?x=1", nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		req.Header.Set("Origin", origin)
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-got
	}

	r := send("", proxyOrigin)
	if r.Header.Get("Authorization") != "Bearer proxied" || r.URL.Path != "/mcp" || r.URL.RawQuery != "x=1" {
		t.Errorf("upstream saw %s %s with Authorization %q", r.Method, r.URL, r.Header.Get("Authorization"))
	}
	if r.Host != strings.TrimPrefix(upstream.URL, "http://") || r.Header.Get("Origin") != upstream.URL {
		t.Errorf("upstream saw Host %q, Origin %q; want its own address and origin", r.Host, r.Header.Get("Origin"))
	}

	r = send("evil.example.com", "http://evil.example.com")
	if r.Host != "evil.example.com" || r.Header.Get("Origin") != "http://evil.example.com" {
		t.Errorf("upstream saw Host %q, Origin %q; want the foreign ones unchanged", r.Host, r.Header.Get("Origin"))
	}
}

// The suite's result lines are read for a whole run and for one scenario,
// directly and through authProxy. (TestConformanceServerRoutes compares
// whole runs through authProxy alone against direct, scenario by
// scenario.)
func TestHarnessConformanceSuiteAgainstEverythingServer(t *testing.T) {
	url := startEverythingServer(t)
	for _, tc := range []struct{ name, url string }{
		{"direct", url},
		{"through authProxy", authProxy(t, url, http.Header{"Authorization": {"Bearer unused"}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// tools-list checks the listing, its names and every message's
			// schema: three checks at 0.2.0-alpha.12.
			passed, failed, output := runConformanceServer(t, tc.url, "tools-list")
			if passed != 3 || failed != 0 {
				t.Errorf("conformance --scenario tools-list: %d passed, %d failed; want 3 and 0\n%s", passed, failed, output)
			}
		})
	}
	r := runConformance(t, url, "--spec-version", "2025-11-25")
	if r.failed != 0 || r.passed == 0 || len(r.scenarios) == 0 || !r.scenarios["tools-list"] {
		t.Errorf("conformance --spec-version 2025-11-25: %d passed, %d failed, scenarios %v; want all passed\n%s", r.passed, r.failed, r.scenarios, tail(r.output, logDumpLimit))
	}
}
