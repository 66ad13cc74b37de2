package broker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/caddyserver/certmagic"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// toolAnswer decodes a tools/call answer of the route: its result, or fails.
func toolAnswer(t *testing.T, status int, body string) *mcp.CallToolResult {
	t.Helper()
	var m struct {
		Result *mcp.CallToolResult `json:"result"`
	}
	if err := json.Unmarshal([]byte(body), &m); err != nil || status != http.StatusOK || m.Result == nil {
		t.Fatalf("HTTP %d, not a tools/call result (%v): %s", status, err, body)
	}
	return m.Result
}

// An upstream behind OAuth (authorization code): before the login, and
// after a 403 insufficient_scope, a tool call gets a tool error that says
// how to log in, with the scopes the next login must grant; in between,
// the calls carry the gateway's token.
func TestPassThroughUpstreamOAuthLogin(t *testing.T) {
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{ScopesSupported: []string{"mcp:read"}, EchoScope: "mcp:read"})
	t.Cleanup(up.Close)
	as.AddClient("gw", "", nil)
	key := make([]byte, 32)
	rand.Read(key)
	oc, err := upstreamauth.New(context.Background(), "github", up.URL,
		upstreamauth.Config{ClientID: "gw", RedirectURL: "http://127.0.0.1:9/callback"},
		upstreamauth.Options{Storage: &certmagic.FileStorage{Path: t.TempDir()}, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(oc.Close)
	rt := newRoute(t, up.URL, func(u *Upstream, o *PassThroughOptions) {
		u.Headers = nil
		o.Credentials = oc.Transport
	})
	call := func(tool string) *mcp.CallToolResult {
		t.Helper()
		args := `{}`
		if tool == "echo" {
			args = `{"text":"hi"}`
		}
		resp, body := post(t, rt.endpoint(), aliceBearer, "", `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"`+tool+`","arguments":`+args+`}}`)
		return toolAnswer(t, resp.StatusCode, body)
	}

	res := call("echo")
	if text := upstreamtest.ResultText(res); !res.IsError || !strings.Contains(text, "`caddy zidane login github`") || strings.Contains(text, "scopes") {
		t.Fatalf("before the login: %+v", res)
	}
	if req, _ := up.Stats(); req != 0 {
		t.Errorf("the upstream got %d requests before the login", req)
	}
	rt.audit.waitCall(t, "the call refused for want of a login", func(c CallRecord) bool {
		return c.Outcome == OutcomeAuthRequired && c.Tool == "echo"
	})

	login := func() {
		t.Helper()
		authURL, err := oc.BeginLogin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := browser.Get(authURL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc, err := url.Parse(resp.Header.Get("Location"))
		if err != nil || resp.StatusCode != http.StatusFound {
			t.Fatalf("authorization endpoint: %d %v", resp.StatusCode, err)
		}
		if err := oc.Callback(context.Background(), loc.Query()); err != nil {
			t.Fatal(err)
		}
	}
	login()
	if res := call("echo"); res.IsError || upstreamtest.ResultText(res) != "echo: hi" {
		t.Fatalf("after the login: %+v", res)
	}

	// admin_op needs mcp:admin too: a step-up.
	res = call("admin_op")
	if text := upstreamtest.ResultText(res); !res.IsError || !strings.Contains(text, "`caddy zidane login github`") || !strings.Contains(text, `"mcp:read mcp:admin"`) {
		t.Fatalf("admin_op without its scope: %+v", res)
	}
	login()
	if res := call("admin_op"); res.IsError || upstreamtest.ResultText(res) != "admin_op: done" {
		t.Fatalf("admin_op after the step-up login: %q", upstreamtest.ResultText(res))
	}
	for _, b := range up.Bearers() {
		if strings.Contains(aliceBearer, b) {
			t.Error("the client's token reached the upstream")
		}
	}
}
