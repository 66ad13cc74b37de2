package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// guardCaddyfile puts zidane_mcp guard in front of upstream on two sites:
// `main` with generous limits and `tight` with small buckets.
func guardCaddyfile(mainSite, tightSite, upstream, extra string) string {
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	return fmt.Sprintf(`{
	admin %s
}

http://%s {
	zidane_mcp {
		guard
		allowed_origins http://localhost:6274
		max_body 64KiB
		scope simple tools test_simple_text
		rate_limit {
			per_token 100/s 200
			per_ip 100/s 100
		}
	}
	reverse_proxy %s
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_token 1/m 3
			per_ip 1/m 3
		}
	}
	reverse_proxy %s
}
%s`, AdminPlaceholder, mainSite, up, tightSite, up, extra)
}

// createToken runs `caddy zidane token create` and returns the secret.
func createToken(t *testing.T, c *Caddy, name string, extra ...string) string {
	t.Helper()
	stdout, stderr, err := c.Run(t, append([]string{"zidane", "token", "create", "--name", name}, extra...)...)
	if err != nil {
		t.Fatalf("token create %s: %v\n%s", name, err, stderr)
	}
	secret := strings.TrimSpace(stdout)
	if !strings.HasPrefix(secret, "zds_") || strings.Contains(secret, "\n") {
		t.Fatalf("token create printed %q, want one zds_ token", stdout)
	}
	return secret
}

type rawAnswer struct {
	status int
	header http.Header
	body   string
	rpc    struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Reason string `json:"reason"`
			} `json:"data"`
		} `json:"error"`
	}
}

// post sends one raw JSON-RPC body, as a client that is not an SDK would.
func post(t *testing.T, url, token, body string, headers ...string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := shortClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := rawAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		json.Unmarshal(b, &a.rpc)
	}
	return a
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

func toolCallBody(tool string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":%q,"arguments":{}}}`, tool)
}

// bearerClient is an HTTP client for go-sdk transports that adds a token.
func bearerClient(token string, base http.RoundTripper) *http.Client {
	if base == nil {
		base = http.DefaultTransport
	}
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+token)
		return base.RoundTrip(r)
	})}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func connectGo(t *testing.T, url string, hc *http.Client) (*mcp.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-go", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func toolNamesOf(res *mcp.ListToolsResult) []string {
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	return names
}

// auditLines returns the audit log entries in caddy's log.
func auditLines(c *Caddy) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(c.Logs()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["logger"] == "http.handlers.zidane_mcp.audit" {
			out = append(out, m)
		}
	}
	return out
}

func TestGuard(t *testing.T) {
	upstream := startEverythingServer(t)
	mainSite := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	tightSite := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startCaddy(t, guardCaddyfile(mainSite, tightSite, upstream, ""))
	mainURL := "http://" + mainSite + "/mcp"
	tightURL := "http://" + tightSite + "/mcp"

	full := createToken(t, c, "full", "--scope", "mcp")
	simple := createToken(t, c, "simple", "--scope", "simple")
	machine := createToken(t, c, "robot", "--scope", "chat", "--scope", "mcp", "--machine")
	secrets := []string{full, simple, machine}

	t.Run("no token gets 401 with the challenge", func(t *testing.T) {
		a := post(t, mainURL, "", initializeBody)
		if a.status != http.StatusUnauthorized || a.rpc.Error.Data.Reason != "no_token" {
			t.Fatalf("status %d body %s", a.status, a.body)
		}
		metaURL := "http://" + mainSite + "/.well-known/oauth-protected-resource/mcp"
		if got := a.header.Get("WWW-Authenticate"); got != `Bearer resource_metadata="`+metaURL+`"` {
			t.Fatalf("WWW-Authenticate = %q", got)
		}
		resp, err := shortClient.Get(metaURL)
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Resource string   `json:"resource"`
			Scopes   []string `json:"scopes_supported"`
		}
		json.NewDecoder(resp.Body).Decode(&meta)
		resp.Body.Close()
		if meta.Resource != mainURL || !slices.Contains(meta.Scopes, "simple") {
			t.Fatalf("metadata = %+v", meta)
		}
		if _, err := connectGo(t, mainURL, nil); err == nil {
			t.Fatal("go-sdk client connected without a token")
		}
		out, err := tsClient(t, mainURL, "", "list-tools")
		if err == nil || parseTSFailure(t, out).Status != http.StatusUnauthorized {
			t.Fatalf("TS client without token: %v %s", err, out)
		}
	})

	t.Run("wrong token gets 401 invalid_token", func(t *testing.T) {
		a := post(t, mainURL, "zds_"+strings.Repeat("A", 43), initializeBody)
		if a.status != http.StatusUnauthorized || !strings.Contains(a.header.Get("WWW-Authenticate"), `error="invalid_token"`) {
			t.Fatalf("status %d, WWW-Authenticate %q", a.status, a.header.Get("WWW-Authenticate"))
		}
		out, err := tsClient(t, mainURL, "not-a-token", "list-tools")
		if err == nil || parseTSFailure(t, out).Status != http.StatusUnauthorized {
			t.Fatalf("TS client with a wrong token: %v %s", err, out)
		}
	})

	t.Run("a session id opens for its own token only", func(t *testing.T) {
		init := post(t, mainURL, full, initializeBody)
		sid := init.header.Get("Mcp-Session-Id")
		if init.status != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %d, session id %q", init.status, sid)
		}
		get := func(token string) (int, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, mainURL, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var reason struct {
				Error struct {
					Data struct {
						Reason string `json:"reason"`
					} `json:"data"`
				} `json:"error"`
			}
			if resp.StatusCode != http.StatusOK {
				json.NewDecoder(resp.Body).Decode(&reason)
			}
			return resp.StatusCode, reason.Error.Data.Reason
		}
		// Another token that learned the id: 404, and the server never
		// sees it.
		if status, reason := get(simple); status != http.StatusNotFound || reason != "session_unknown" {
			t.Fatalf("another token's GET with the stolen session id: %d %q; want 404 session_unknown", status, reason)
		}
		// The owner opens the session's GET stream.
		if status, _ := get(full); status != http.StatusOK {
			t.Fatalf("the owner's GET on its session: %d", status)
		}
		if !strings.Contains(c.Logs(), `"reason":"session_unknown"`) {
			t.Error("the refused GET was not audited")
		}
	})

	t.Run("go-sdk client through the guard", func(t *testing.T) {
		cs, err := connectGo(t, mainURL, bearerClient(full, nil))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		tools, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(tools.Tools) < 10 {
			t.Fatalf("mcp scope sees %d tools, want them all", len(tools.Tools))
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"})
		if err != nil || res.IsError || len(res.Content) == 0 {
			t.Fatalf("call: %+v %v", res, err)
		}
		// Progress notifications stream back through the guard (SSE).
		var progress int
		cs2, err := connectGoWithProgress(t, mainURL, full, &progress)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs2.CallTool(ctx, &mcp.CallToolParams{Name: "test_tool_with_progress", Meta: mcp.Meta{"progressToken": "p1"}}); err != nil {
			t.Fatal(err)
		}
		if progress == 0 {
			t.Fatal("no progress notification came through the guard")
		}
	})

	t.Run("tools/list shows only what the token may call", func(t *testing.T) {
		cs, err := connectGo(t, mainURL, bearerClient(simple, nil))
		if err != nil {
			t.Fatal(err)
		}
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := toolNamesOf(tools); !slices.Equal(got, []string{"test_simple_text"}) {
			t.Fatalf("simple scope lists %v", got)
		}
		out, err := tsClient(t, mainURL, simple, "list-tools")
		if err != nil || !strings.Contains(out, "test_simple_text") || strings.Contains(out, "test_image_content") {
			t.Fatalf("TS client list: %v %s", err, out)
		}
	})

	t.Run("missing scope gets 403 insufficient_scope", func(t *testing.T) {
		a := post(t, mainURL, simple, toolCallBody("test_image_content"))
		h := a.header.Get("WWW-Authenticate")
		if a.status != http.StatusForbidden || !strings.Contains(h, `error="insufficient_scope"`) || !strings.Contains(h, `scope="mcp"`) {
			t.Fatalf("status %d, WWW-Authenticate %q", a.status, h)
		}
		if a.rpc.Error.Data.Reason != "insufficient_scope" || !strings.Contains(a.rpc.Error.Message, "test_image_content") {
			t.Fatalf("body %s", a.body)
		}
		out, err := tsClient(t, mainURL, simple, "call", "test_image_content", "{}")
		if err == nil || parseTSFailure(t, out).Status != http.StatusForbidden {
			t.Fatalf("TS client call without scope: %v %s", err, out)
		}
	})

	t.Run("machine token gets 403 on the sessions tools", func(t *testing.T) {
		a := post(t, mainURL, machine, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"list"}}}`)
		if a.status != http.StatusForbidden || a.rpc.Error.Data.Reason != "machine_token" {
			t.Fatalf("status %d body %s", a.status, a.body)
		}
	})

	t.Run("bad Origin gets 403, allowed Origin gets CORS", func(t *testing.T) {
		a := post(t, mainURL, full, initializeBody, "Origin", "http://evil.example")
		if a.status != http.StatusForbidden || a.rpc.Error.Data.Reason != "origin" {
			t.Fatalf("status %d body %s", a.status, a.body)
		}
		for _, method := range []string{http.MethodGet, http.MethodDelete, http.MethodOptions} {
			req, _ := http.NewRequest(method, mainURL, nil)
			req.Header.Set("Origin", "http://evil.example")
			req.Header.Set("Authorization", "Bearer "+full)
			resp, err := shortClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s with a bad Origin: %d", method, resp.StatusCode)
			}
		}
		req, _ := http.NewRequest(http.MethodOptions, mainURL, nil)
		req.Header.Set("Origin", "http://localhost:6274")
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "http://localhost:6274" ||
			!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
			t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
		}
		ok := post(t, mainURL, full, initializeBody, "Origin", "http://localhost:6274")
		if ok.status != http.StatusOK || ok.header.Get("Access-Control-Allow-Origin") != "http://localhost:6274" {
			t.Fatalf("allowed origin: %d %v", ok.status, ok.header)
		}
	})

	t.Run("Origin or Authorization sent twice gets 400 before either is judged", func(t *testing.T) {
		for name, h := range map[string]http.Header{
			"two Origins, the allowed one first":         {"Origin": {"http://localhost:6274", "http://evil.example"}},
			"Origin in two spellings":                    {"origin": {"http://localhost:6274"}, "Origin": {"http://evil.example"}},
			"an Origin list":                             {"Origin": {"http://localhost:6274, http://evil.example"}},
			"two Authorizations, the valid one first":    {"Authorization": {"Bearer " + full, "Bearer zds_other"}},
			"Authorization in two spellings":             {"authorization": {"Bearer " + full}, "AUTHORIZATION": {"Bearer zds_other"}},
			"an Authorization list, the valid one first": {"Authorization": {"Bearer " + full + ", Bearer zds_other"}},
		} {
			req, err := http.NewRequest(http.MethodPost, mainURL, strings.NewReader(initializeBody))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Authorization", "Bearer "+full)
			for k := range h {
				if strings.EqualFold(k, "Authorization") {
					req.Header.Del("Authorization")
				}
			}
			for k, v := range h {
				req.Header[k] = v // sent under this spelling
			}
			resp, err := shortClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var a rawAnswer
			json.Unmarshal(b, &a.rpc)
			if resp.StatusCode != http.StatusBadRequest || a.rpc.Error.Data.Reason != "duplicate_header" || !strings.Contains(a.rpc.Error.Message, "send one") {
				t.Errorf("%s: %d %s, want 400 duplicate_header saying what to send", name, resp.StatusCode, b)
			}
			if strings.Contains(string(b), full) {
				t.Errorf("%s: the refusal repeats the token", name)
			}
		}
	})

	t.Run("oversized body gets 413, malformed JSON 400", func(t *testing.T) {
		big := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text","arguments":{"x":"` + strings.Repeat("a", 70<<10) + `"}}}`
		if a := post(t, mainURL, full, big); a.status != http.StatusRequestEntityTooLarge || a.rpc.Error.Data.Reason != "too_large" {
			t.Fatalf("oversized: %d %s", a.status, a.body)
		}
		a := post(t, mainURL, full, `{"jsonrpc":"2.0","id":1,"method":`)
		if a.status != http.StatusBadRequest || a.rpc.Error.Code != -32700 {
			t.Fatalf("malformed: %d %s", a.status, a.body)
		}
		if a := post(t, mainURL, full, `[]`); a.status != http.StatusBadRequest {
			t.Fatalf("empty batch: %d %s", a.status, a.body)
		}
	})

	t.Run("burst over the limit gets 429", func(t *testing.T) {
		tight := createToken(t, c, "tight", "--scope", "mcp")
		secrets = append(secrets, tight)
		for i := 0; i < 3; i++ {
			if a := post(t, tightURL, tight, initializeBody); a.status != http.StatusOK {
				t.Fatalf("request %d within burst: %d %s", i, a.status, a.body)
			}
		}
		a := post(t, tightURL, tight, initializeBody)
		if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") == "" || a.rpc.Error.Code != -32029 {
			t.Fatalf("over burst: %d Retry-After %q body %s", a.status, a.header.Get("Retry-After"), a.body)
		}
		// Failed attempts from one address are limited too, so guessing is slow.
		statuses := []int{}
		for i := 0; i < 4; i++ {
			statuses = append(statuses, post(t, tightURL, "zds_guess"+fmt.Sprint(i), initializeBody).status)
		}
		if !slices.Equal(statuses, []int{401, 401, 401, 429}) {
			t.Fatalf("guesses got %v, want three 401 and then 429", statuses)
		}
	})

	t.Run("revoking a connected client's token closes it out", func(t *testing.T) {
		rev := createToken(t, c, "revoked-later", "--scope", "mcp")
		secrets = append(secrets, rev)
		cs, err := connectGo(t, mainURL, bearerClient(rev, nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"}); err != nil {
			t.Fatal(err)
		}
		// A raw GET stream held open with the same token.
		init := post(t, mainURL, rev, initializeBody)
		sid := init.header.Get("Mcp-Session-Id")
		if sid == "" {
			t.Fatalf("no session id: %d %s", init.status, init.body)
		}
		post(t, mainURL, rev, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid)
		streamCtx, cancelStream := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancelStream()
		req, _ := http.NewRequestWithContext(streamCtx, http.MethodGet, mainURL, nil)
		req.Header.Set("Authorization", "Bearer "+rev)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		stream, err := http.DefaultClient.Do(req)
		if err != nil || stream.StatusCode != http.StatusOK {
			t.Fatalf("GET stream: %v %v", err, stream)
		}
		ended := make(chan error, 1)
		go func() {
			_, err := io.Copy(io.Discard, stream.Body)
			ended <- err
		}()

		if _, stderr, err := c.Run(t, "zidane", "token", "revoke", "revoked-later"); err != nil {
			t.Fatalf("revoke: %v %s", err, stderr)
		}
		select {
		case <-ended:
		case <-streamCtx.Done():
			t.Fatal("the open stream of a revoked token was not closed")
		}
		if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"}); err == nil {
			t.Fatal("call with a revoked token succeeded")
		}
		if a := post(t, mainURL, rev, toolCallBody("test_simple_text"), "Mcp-Session-Id", sid); a.status != http.StatusUnauthorized ||
			!strings.Contains(a.rpc.Error.Message, "revoked") {
			t.Fatalf("after revoke: %d %s", a.status, a.body)
		}
	})

	t.Run("token list never prints a secret", func(t *testing.T) {
		for _, args := range [][]string{{"zidane", "token", "list"}, {"zidane", "token", "list", "--json"}} {
			stdout, _, err := c.Run(t, args...)
			if err != nil || !strings.Contains(stdout, "simple") {
				t.Fatalf("%v: %v %s", args, err, stdout)
			}
			for _, s := range secrets {
				if strings.Contains(stdout, s) || strings.Contains(stdout, s[4:]) {
					t.Fatalf("%v printed a secret", args)
				}
			}
		}
	})

	t.Run("reload keeps tokens, limits and open streams", func(t *testing.T) {
		// A GET stream opened before the reload.
		init := post(t, mainURL, full, initializeBody)
		sid := init.header.Get("Mcp-Session-Id")
		post(t, mainURL, full, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid)
		streamCtx, cancelStream := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancelStream()
		req, _ := http.NewRequestWithContext(streamCtx, http.MethodGet, mainURL, nil)
		req.Header.Set("Authorization", "Bearer "+full)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		stream, err := http.DefaultClient.Do(req)
		if err != nil || stream.StatusCode != http.StatusOK {
			t.Fatalf("GET stream: %v %v", err, stream)
		}
		defer stream.Body.Close()

		extra := fmt.Sprintf("\nhttp://127.0.0.1:%d {\n\trespond \"added by reload\"\n}\n", freePort(t))
		c.Reload(t, guardCaddyfile(mainSite, tightSite, upstream, extra))

		// The upstream announces a tool change on the stream that predates the reload.
		if a := post(t, mainURL, full, toolCallBody("test_trigger_tool_change"), "Mcp-Session-Id", sid); a.status != http.StatusOK {
			t.Fatalf("trigger: %d %s", a.status, a.body)
		}
		sc := bufio.NewScanner(stream.Body)
		seen := false
		for !seen && sc.Scan() {
			seen = strings.Contains(sc.Text(), "notifications/tools/list_changed")
		}
		if !seen {
			t.Fatalf("the stream opened before the reload ended without the notification: %v", sc.Err())
		}

		if a := post(t, mainURL, full, initializeBody); a.status != http.StatusOK {
			t.Fatalf("token lost across reload: %d %s", a.status, a.body)
		}
		tight := secrets[len(secrets)-2]
		if a := post(t, tightURL, tight, initializeBody); a.status != http.StatusTooManyRequests {
			t.Fatalf("an exhausted bucket was refilled by the reload: %d", a.status)
		}
	})

	t.Run("audit has a line for each refusal and tool call", func(t *testing.T) {
		reasons := map[string]bool{}
		events := map[string]bool{}
		for _, l := range auditLines(c) {
			events[fmt.Sprint(l["event"])] = true
			if r, ok := l["reason"].(string); ok {
				reasons[r] = true
			}
			raw, _ := json.Marshal(l)
			for _, s := range secrets {
				if strings.Contains(string(raw), s) {
					t.Fatalf("an audit line holds a token secret: %s", raw)
				}
			}
		}
		for _, want := range []string{"no_token", "invalid_token", "insufficient_scope", "machine_token", "origin", "too_large", "malformed", "rate_limited", "rate_limited_ip", "duplicate_header"} {
			if !reasons[want] {
				t.Errorf("no audit line with reason %q", want)
			}
		}
		for _, want := range []string{"tool_call", "token_created", "token_revoked"} {
			if !events[want] {
				t.Errorf("no audit line for event %q", want)
			}
		}
	})

	t.Run("metrics count decisions", func(t *testing.T) {
		resp, err := shortClient.Get(c.AdminURL("/metrics"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`caddy_zidane_refusals_total{reason="no_token"}`, `caddy_zidane_requests_total{decision="allowed"}`,
			`caddy_zidane_rate_limited_total{bucket="token"}`, `caddy_zidane_credential_requests_total{credential="token",kind="user"}`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})

	t.Run("storage holds no plaintext token", func(t *testing.T) {
		assertNoSecretsUnder(t, c.Dir, secrets)
	})
}

func connectGoWithProgress(t *testing.T, url, token string, progress *int) (*mcp.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-go", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { *progress++ },
	})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bearerClient(token, nil), MaxRetries: -1}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

// assertNoSecretsUnder fails if any file under root (storage, config,
// logs) holds a token secret or its random part.
func assertNoSecretsUnder(t *testing.T, root string, secrets []string) {
	t.Helper()
	files := 0
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		files++
		for _, s := range secrets {
			if strings.Contains(string(b), s) || strings.Contains(string(b), strings.TrimPrefix(s, "zds_")) {
				t.Errorf("%s holds a token secret", path)
			}
		}
		return nil
	})
	if files == 0 {
		t.Fatal("no files to search")
	}
}

func TestGuardOverHTTPSWithTLSInternal(t *testing.T) {
	upstream := startEverythingServer(t)
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	skip_install_trust
	http_port %d
}

https://localhost:%d {
	tls internal
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, freePort(t), port, up))
	token := createToken(t, c, "tls", "--scope", "mcp")
	// The tls internal certificate is issued in the background after start.
	c.WaitForLog(t, "certificate obtained successfully", 30*time.Second)

	root, err := os.ReadFile(filepath.Join(c.DataDir, "pki", "authorities", "local", "root.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(root) {
		t.Fatal("Caddy's local root is not PEM")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	url := fmt.Sprintf("https://localhost:%d/mcp", port)
	cs, err := connectGo(t, url, bearerClient(token, tr))
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"})
	if err != nil || res.IsError {
		t.Fatalf("call over HTTPS: %+v %v", res, err)
	}
	// And the refusal path over TLS.
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Post(url, "application/json", strings.NewReader(initializeBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "https://localhost:") {
		t.Fatalf("no token over HTTPS: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
}

func TestGuardPassesConformanceDNSRebindingScenario(t *testing.T) {
	upstream := startEverythingServer(t)
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	port := freePort(t)
	// A site for any Host, bound to loopback: the edge, not Caddy's host
	// matching, must be what refuses a rebinding Host.
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, up))
	token := createToken(t, c, "conformance", "--scope", "mcp")
	url := authProxy(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), http.Header{"Authorization": {"Bearer " + token}})
	for _, scenario := range []string{"dns-rebinding-protection", "server-initialize", "tools-list", "ping"} {
		passed, failed, out := runConformanceServer(t, url, scenario)
		if failed != 0 || passed == 0 {
			t.Errorf("%s through the guard: %d passed, %d failed\n%s", scenario, passed, failed, tail(out, 4000))
		}
	}
	// Without a token the rebinding request is refused too, before auth.
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), strings.NewReader(initializeBody))
	req.Host = "evil.example.com"
	resp, err := shortClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("rebinding Host without Origin or token: %d, want 403", resp.StatusCode)
	}
}

// TestGuardRefusesUpgrade: a request that asks to switch protocols never
// reaches the guarded server. Once the server answered 101, reverse_proxy
// would join the client's connection to the server's, and every byte after
// it (HTTP/2 over h2c, WebSocket frames, anything) would pass without the
// edge reading, authorizing or filtering it.
func TestGuardRefusesUpgrade(t *testing.T) {
	reached := make(chan string, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			http.Error(w, "no upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", r.Header.Get("Upgrade"))
		brw.Flush()
		line, _ := brw.ReadString('\n')
		reached <- line
		io.WriteString(conn, "tunnel: "+line)
	}))
	t.Cleanup(up.Close)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard
		scope simple tools nothing_at_all
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, strings.TrimPrefix(up.URL, "http://")))
	token := createToken(t, c, "upgrader", "--scope", "simple")
	for _, proto := range []string{"websocket", "h2c"} {
		t.Run(proto, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(conn, "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\nConnection: Upgrade\r\nUpgrade: %s\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", port, token, proto)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode == http.StatusSwitchingProtocols {
				// Show what passes now: a tools/call nobody authorized.
				io.WriteString(conn, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"unauthorized"}}`+"\n")
				echo, _ := br.ReadString('\n')
				t.Fatalf("the guard let a %s upgrade through (101): the client's bytes reach the server unread; the server got %q", proto, strings.TrimSpace(echo))
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("an upgrade request got %d; want 400", resp.StatusCode)
			}
		})
	}
}

// TestGuardJSONAnswersReachRealClients: a guarded server that answers in
// JSON (go-sdk's JSONResponse mode), whose status the listing filter now
// sends with the filtered body and its length, serves the TypeScript SDK
// and go-sdk clients: they list tools and call one, through the built
// binary.
func TestGuardJSONAnswersReachRealClients(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "json", Version: "1"}, nil)
	type args struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes"}, func(_ context.Context, _ *mcp.CallToolRequest, a args) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
	})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{JSONResponse: true}))
	t.Cleanup(up.Close)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, strings.TrimPrefix(up.URL, "http://")))
	token := createToken(t, c, "json", "--scope", "mcp")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)

	out, err := tsClient(t, url, token, "list-tools")
	if err != nil || !strings.Contains(out, `"echo"`) {
		t.Fatalf("TypeScript SDK list-tools: %v %q", err, out)
	}
	out, err = tsClient(t, url, token, "call", "echo", `{"text":"through the guard"}`)
	if err != nil || !strings.Contains(out, "through the guard") {
		t.Fatalf("TypeScript SDK call: %v %q", err, out)
	}
	cs, err := connectGo(t, url, bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "go-sdk"}})
	if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "go-sdk" {
		t.Fatalf("go-sdk call: %v %+v", err, res)
	}
}
