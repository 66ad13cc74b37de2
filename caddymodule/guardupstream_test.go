package caddymodule

// Tests of `guard { upstream URL }` against a recording server, through
// Handler.ServeHTTP: the attacks of a review of it, and what it found.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

const guSecret = "gu-upstream-secret-7f3a"

// guServer is the guarded MCP server: it records every request and
// answers initialize with a session id, tools/list with tools a and b.
type guServer struct {
	*httptest.Server
	mu   sync.Mutex
	seen []*http.Request
	sid  string
}

func (s *guServer) last() *http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) == 0 {
		return nil
	}
	return s.seen[len(s.seen)-1]
}

func (s *guServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

func startGUServer(t *testing.T, sid string, extra func(w http.ResponseWriter, r *http.Request, body []byte) bool) *guServer {
	s := &guServer{sid: sid}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc := r.Clone(context.Background())
		rc.Body = io.NopCloser(bytes.NewReader(body))
		s.mu.Lock()
		s.seen = append(s.seen, rc)
		s.mu.Unlock()
		if extra != nil && extra(w, r, body) {
			return
		}
		serveGUMCP(w, body, s.sid)
	}))
	t.Cleanup(s.Close)
	return s
}

func serveGUMCP(w http.ResponseWriter, body []byte, sid string) {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	_ = json.Unmarshal(body, &m)
	w.Header().Set("Content-Type", "application/json")
	switch m.Method {
	case "initialize":
		w.Header().Set("Mcp-Session-Id", sid)
		io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(m.ID)+`,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}}`)
	case "tools/list":
		io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(m.ID)+`,"result":{"tools":[{"name":"a","inputSchema":{"type":"object"}},{"name":"b","inputSchema":{"type":"object"}}]}}`)
	default:
		io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(m.ID)+`,"result":{}}`)
	}
}

// guCaddy loads the zidane app alone, as newGuardEdge does.
func guCaddy(t *testing.T) caddy.Context {
	t.Helper()
	dir := t.TempDir()
	cfg, _ := json.Marshal(map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"storage": map[string]any{"module": "file_system", "root": filepath.Join(dir, "storage")},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"writer": map[string]any{"output": "discard"}, "level": "DEBUG"}}},
		"apps": map[string]any{"zidane": map[string]any{}},
	})
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading the zidane app: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	return caddy.ActiveContext()
}

func guHandler(t *testing.T, ctx caddy.Context, g *Guard, resource string) (*Handler, error) {
	t.Helper()
	lots := &policy.Limit{Rate: 1e9, Burst: 1 << 30}
	h := &Handler{
		RouteRaw:  routeJSON(g),
		Resource:  resource,
		Scopes:    []policy.Rule{{Scope: "tool-a", Tools: []string{"a"}}},
		RateLimit: &RateLimit{PerToken: lots, PerIP: lots},
	}
	if err := h.Provision(ctx); err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	return h, nil
}

func guToken(t *testing.T, h *Handler, name string, scopes ...string) string {
	t.Helper()
	tok, _, err := h.tokens.Create(context.Background(), policy.TokenSpec{Name: name, Scopes: scopes})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func guPost(t *testing.T, h *Handler, next caddyhttp.Handler, token, sid string, hdr map[string]string, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8080/mcp", strings.NewReader(body))
	r.RemoteAddr = "127.0.0.1:50123"
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Authorization", "Bearer "+token)
	if sid != "" {
		r.Header.Set("Mcp-Session-Id", sid)
	}
	for k, v := range hdr {
		r.Header[k] = []string{v}
	}
	ctx := context.WithValue(r.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080})
	ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer())
	w := httptest.NewRecorder()
	if next == nil {
		next = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			t.Error("guard upstream called the next handler")
			return nil
		})
	}
	if err := h.ServeHTTP(w, r.WithContext(ctx), next); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	return w
}

const guInit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`

// Mcp_Session_Id, a client's Cookie, X-Forwarded-For and the
// client's token never reach the server; another token's session id gets
// 404 and reaches nothing; a scope-hidden tool is filtered and refused.
func TestGuardUpstreamHeadersAndSessions(t *testing.T) {
	t.Setenv("GU_TEST_SECRET", guSecret)
	srv := startGUServer(t, "server-sid-42", nil)
	ctx := guCaddy(t)
	h, err := guHandler(t, ctx, &Guard{
		Upstream:        srv.URL + "/mcp",
		UpstreamHeaders: map[string]string{"X-Api-Key": "{env.GU_TEST_SECRET}"},
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	a := guToken(t, h, "a", "tool-a")
	other := guToken(t, h, "other", "mcp")
	w := guPost(t, h, nil, a, "", map[string]string{"Mcp_Session_Id": "server-sid-42", "Cookie": "c=1", "X-Forwarded-For": "1.2.3.4"}, guInit)
	sid := w.Header().Get("Mcp-Session-Id")
	if sid == "" || sid == "server-sid-42" {
		t.Fatalf("session id %q", sid)
	}
	got := srv.last()
	for _, k := range []string{"Mcp_session_id", "Mcp_Session_Id", "Cookie", "X-Forwarded-For", "Authorization", "Zidane-Client-Ip"} {
		if v := got.Header.Values(k); len(v) > 0 {
			t.Errorf("%s reached the server: %q", k, v)
		}
	}
	if got.Header.Get("X-Api-Key") != guSecret {
		t.Errorf("X-Api-Key = %q", got.Header.Get("X-Api-Key"))
	}
	n := srv.count()
	w = guPost(t, h, nil, other, sid, nil, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if w.Code != http.StatusNotFound || srv.count() != n {
		t.Errorf("another token's session id: %d, server calls %d -> %d", w.Code, n, srv.count())
	}
	w = guPost(t, h, nil, a, sid, nil, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	if strings.Contains(w.Body.String(), `"b"`) || !strings.Contains(w.Body.String(), `"a"`) {
		t.Errorf("tools/list for tool-a: %s", w.Body)
	}
	w = guPost(t, h, nil, a, sid, nil, `[{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"a","arguments":{}}},{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"b","arguments":{}}}]`)
	if w.Code != http.StatusForbidden {
		t.Errorf("batch with tool b: %d %s", w.Code, w.Body)
	}
}

// a 307 to another server is not followed (NoRedirects), and the
// credential goes nowhere else.
func TestGuardUpstreamFollowsNoRedirect(t *testing.T) {
	t.Setenv("GU_TEST_SECRET", guSecret)
	elsewhere := startGUServer(t, "x", nil)
	srv := startGUServer(t, "sid", func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		w.Header().Set("Location", elsewhere.URL+"/mcp")
		w.WriteHeader(http.StatusTemporaryRedirect)
		return true
	})
	ctx := guCaddy(t)
	h, err := guHandler(t, ctx, &Guard{
		Upstream:        srv.URL + "/mcp",
		UpstreamHeaders: map[string]string{"X-Api-Key": "{env.GU_TEST_SECRET}"},
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	tok := guToken(t, h, "all", "mcp")
	w := guPost(t, h, nil, tok, "", nil, guInit)
	if w.Code != http.StatusBadGateway || elsewhere.count() != 0 {
		t.Errorf("redirect: %d, elsewhere reached %d times", w.Code, elsewhere.count())
	}
	if strings.Contains(w.Body.String(), elsewhere.URL) {
		t.Errorf("the Location reached the client: %s", w.Body)
	}
}

// a tools/list answer the server compresses unasked (br), as JSON or
// as an event stream, is withheld, not passed for the client to decode.
func TestGuardUpstreamWithholdsAnEncodedListing(t *testing.T) {
	for _, ct := range []string{"application/json", "text/event-stream"} {
		srv := startGUServer(t, "sid", func(w http.ResponseWriter, r *http.Request, body []byte) bool {
			if !strings.Contains(string(body), "tools/list") {
				return false
			}
			w.Header().Set("Content-Type", ct)
			w.Header().Set("Content-Encoding", "br")
			msg := `{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"a"},{"name":"b"}]}}`
			if ct == "text/event-stream" {
				msg = "event: message\ndata: " + msg + "\n\n"
			}
			io.WriteString(w, msg)
			return true
		})
		ctx := guCaddy(t)
		h, err := guHandler(t, ctx, &Guard{Upstream: srv.URL + "/mcp"}, "")
		if err != nil {
			t.Fatal(err)
		}
		a := guToken(t, h, "a", "tool-a")
		w := guPost(t, h, nil, a, "", nil, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
		if strings.Contains(w.Body.String(), `"b"`) || w.Header().Get("Content-Encoding") != "" {
			t.Errorf("%s: %s %q", ct, w.Header(), w.Body)
		}
		_ = caddy.Stop()
	}
}

// What the guard's own upstream refuses at Provision, each with a message
// that names the field and never a value: a placeholder in the URL (the
// broker's ${H0} would have become the first upstream_header's value in
// the request's path), an upstream_header given twice in two cases, one
// that resolves empty, one the pass-through sets itself.
func TestGuardUpstreamRefuses(t *testing.T) {
	t.Setenv("GU_TEST_SECRET", guSecret)
	t.Setenv("GU_TEST_EMPTY", "")
	srv := startGUServer(t, "sid", nil)
	for _, c := range []struct {
		name string
		g    *Guard
		want string
	}{
		{"the broker's placeholder in the URL", &Guard{Upstream: srv.URL + "/mcp/${H0}",
			UpstreamHeaders: map[string]string{"X-Api-Key": "{env.GU_TEST_SECRET}"}}, "the URL takes no placeholder"},
		{"an environment placeholder in the URL", &Guard{Upstream: srv.URL + "/${HOME}"}, "the URL takes no placeholder"},
		{"Caddy's placeholder in the URL", &Guard{Upstream: srv.URL + "/{env.HOME}"}, "the URL takes no placeholder"},
		{"one header in two cases", &Guard{Upstream: srv.URL + "/mcp",
			UpstreamHeaders: map[string]string{"X-Api-Key": "{env.GU_TEST_SECRET}", "x-api-key": "{env.GU_TEST_SECRET}"}}, "are one header"},
		{"a placeholder that resolves empty", &Guard{Upstream: srv.URL + "/mcp",
			UpstreamHeaders: map[string]string{"Authorization": "Bearer {env.GU_TEST_EMPTY}"}}, "not empty"},
		{"a request's placeholder", &Guard{Upstream: srv.URL + "/mcp",
			UpstreamHeaders: map[string]string{"X-Api-Key": "{http.request.header.X-Key}"}}, "read once, when Caddy starts"},
		{"a header the pass-through sets", &Guard{Upstream: srv.URL + "/mcp",
			UpstreamHeaders: map[string]string{"Mcp-Session-Id": "{env.GU_TEST_SECRET}"}}, "sets or passes this header itself"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := guCaddy(t)
			_, err := guHandler(t, ctx, c.g, "")
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q, want it to say %q", err, c.want)
			}
			if strings.Contains(err.Error(), guSecret) {
				t.Errorf("the error shows the header's value: %v", err)
			}
			if srv.count() != 0 {
				t.Errorf("the server was sent %d requests", srv.count())
			}
		})
	}
}

// A resolved upstream_header value is sent as it is: one that holds "${"
// is never expanded again, nor refused.
func TestGuardUpstreamSendsAValueAsItIs(t *testing.T) {
	const value = "tok-${PARTOFSECRET}-xyz"
	t.Setenv("GU_TEST_SECRET", value)
	srv := startGUServer(t, "sid-1", nil)
	ctx := guCaddy(t)
	h, err := guHandler(t, ctx, &Guard{
		Upstream:        srv.URL + "/mcp",
		UpstreamHeaders: map[string]string{"X-Api-Key": "{env.GU_TEST_SECRET}"},
	}, "")
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	if w := guPost(t, h, nil, guToken(t, h, "all", "mcp"), "", nil, guInit); w.Code != http.StatusOK {
		t.Fatalf("initialize: %d %s", w.Code, w.Body)
	}
	if got := srv.last().Header.Values("X-Api-Key"); len(got) != 1 || got[0] != value {
		t.Errorf("the server got X-Api-Key %q, want %q", got, value)
	}
}

// Two guard sites of one resource share what a guard keeps of its server.
// Two that send to different upstreams are refused; a pair that may be one
// server reached twice is warned of in the log; two with the same upstream
// are one server and are neither.
func TestGuardSitesOfOneResource(t *testing.T) {
	site := func(port int, inner string) string {
		return fmt.Sprintf("http://127.0.0.1:%d {\n\tzidane_mcp {\n%s\n\t}\n\treverse_proxy 127.0.0.1:9\n}\n", port, inner)
	}
	upstream := func(url string) string { return "\t\tguard {\n\t\t\tupstream " + url + "\n\t\t}" }
	const warning = "another guard site of this config has the same resource"
	for _, c := range []struct {
		name, sites, refusal string
		warns                bool
	}{
		{"two upstreams, one resource",
			site(8081, upstream("http://127.0.0.1:9001/mcp")) + site(8082, upstream("http://127.0.0.1:9002/mcp")),
			"give each guard site its own absolute resource", false},
		{"two upstreams, one resource given",
			site(8081, upstream("http://127.0.0.1:9001/mcp")+"\n\t\tresource https://tools.example.com/mcp") +
				site(8082, upstream("http://127.0.0.1:9002/mcp")+"\n\t\tresource https://tools.example.com/mcp"),
			"resource https://tools.example.com/mcp is also the resource of another guard site", false},
		{"two upstreams, two resources",
			site(8081, upstream("http://127.0.0.1:9001/mcp")+"\n\t\tresource http://127.0.0.1:8081/mcp") +
				site(8082, upstream("http://127.0.0.1:9002/mcp")+"\n\t\tresource http://127.0.0.1:8082/mcp"),
			"", false},
		{"one upstream, two sites",
			site(8081, upstream("http://127.0.0.1:9001/mcp")) + site(8082, upstream("http://127.0.0.1:9001/mcp")),
			"", false},
		{"the next handler and an upstream",
			site(8081, "\t\tguard") + site(8082, upstream("http://127.0.0.1:9001/mcp")),
			"", true},
		{"the next handler twice",
			site(8081, "\t\tguard") + site(8082, "\t\tguard"),
			"", true},
		{"the next handler, two resources",
			site(8081, "\t\tguard\n\t\tresource http://127.0.0.1:8081/mcp") + site(8082, "\t\tguard\n\t\tresource http://127.0.0.1:8082/mcp"),
			"", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			err := validate(t, "\tlog {\n\t\toutput file "+logFile+"\n\t\tformat json\n\t}", c.sites)
			if c.refusal != "" {
				if err == nil || !strings.Contains(err.Error(), c.refusal) {
					t.Fatalf("validate = %v; want an error saying %q", err, c.refusal)
				}
				return
			}
			if err != nil {
				t.Fatalf("validate: %v", err)
			}
			logged, rerr := os.ReadFile(logFile)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if got := strings.Contains(string(logged), warning); got != c.warns {
				t.Errorf("warned = %v, want %v; the log:\n%s", got, c.warns, logged)
			}
		})
	}
}
