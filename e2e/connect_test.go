package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// TestConnectLinkEndToEnd: a person whose account at a per_user upstream
// is not connected gets, from the call itself, a connect link; in a
// browser signed in as another person the link is refused (and audited)
// and stays usable; in their own it runs the upstream's authorization,
// as them, and their next call acts as them; the link works once.
func TestConnectLinkEndToEnd(t *testing.T) {
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
	t.Cleanup(up.Close)
	secret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", secret, nil)
	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
			registration dynamic
		}
		upstream remote %[2]s {
			oauth {
				client_id zidane-gateway
				client_secret ${REMOTE_SECRET}
				redirect_url %[1]s/zidane/oauth/callback/remote
				credentials per_user
			}
		}
	}
}

%[1]s {
	zidane_mcp {
		broker remote
		resource %[1]s/mcp
	}
}
`, base, up.URL), "REMOTE_SECRET="+secret, "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))
	g := &perUserGateway{c: c, as: as, up: up, brokerURL: base + "/mcp", callback: base + "/zidane/oauth/callback/remote"}
	carol := createToken(t, c, "carol-laptop", "--scope", "upstream:remote", "--owner", "carol")

	before, _ := up.Stats()
	text, isErr := g.whoami(t, carol)
	link := regexp.MustCompile(regexp.QuoteMeta(base) + `/zidane/connect/zcl_[A-Za-z0-9_-]{43}`).FindString(text)
	if !isErr || link == "" || !strings.Contains(text, "connect your account") {
		t.Fatalf("carol's first call: %q (error %v), want a tool error with a connect link", text, isErr)
	}
	if after, _ := up.Stats(); after != before {
		t.Fatal("carol's call reached the upstream")
	}

	// A browser that follows no redirect on its own, signed in as who.
	browser := func(who string) *formBrowser {
		b := newFormBrowser(t, base)
		b.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		if resp, body := b.post("/zidane/signin/link", url.Values{"secret": {signInLink(t, c, who, "upstream:remote")}}); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s's sign-in: %d %s", who, resp.StatusCode, body)
		}
		return b
	}
	path := strings.TrimPrefix(link, base)

	dave := browser("dave")
	if resp, body := dave.get(link); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "another person") {
		t.Fatalf("carol's link in dave's browser: %d %s", resp.StatusCode, body)
	}
	if resp, body := dave.post(path, url.Values{"connect": {"1"}}); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "another person") {
		t.Fatalf("carol's link pressed in dave's browser: %d %s", resp.StatusCode, body)
	}
	if !hasAudit(c, map[string]any{"event": "connect_refused", "reason": "owner", "owner": "carol", "browser": "dave"}) {
		t.Error("no audit line for carol's link in dave's browser")
	}

	b := browser("carol")
	if resp, body := b.get(link); resp.StatusCode != http.StatusOK || !strings.Contains(body, "If you are not carol, stop here") {
		t.Fatalf("carol's link: %d %s", resp.StatusCode, body)
	}
	b.origin = "http://127.0.0.1:1"
	if resp, _ := b.post(path, url.Values{"connect": {"1"}}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a press from another origin: %d", resp.StatusCode)
	}
	b.origin = base
	resp, _ := b.post(path, url.Values{"connect": {"1"}})
	authURL := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(authURL, as.URL+"/authorize?") {
		t.Fatalf("the press: %d to %q", resp.StatusCode, authURL)
	}
	q := g.signIn(t, authURL, "carol")
	// The upstream's answer in dave's browser finishes nothing.
	if resp, body := dave.get(g.callback + "?" + q.Encode()); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "another person") {
		t.Fatalf("carol's callback in dave's browser: %d %s", resp.StatusCode, body)
	}
	if resp, body := b.get(g.callback + "?" + q.Encode()); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Go back to your MCP client") {
		t.Fatalf("carol's callback: %d %s", resp.StatusCode, body)
	}
	if got, isErr := g.whoami(t, carol); isErr || got != "whoami: carol" {
		t.Fatalf("carol once connected: %q (error %v)", got, isErr)
	}
	if resp, body := b.post(path, url.Values{"connect": {"1"}}); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "used already") {
		t.Fatalf("the link used twice: %d %s", resp.StatusCode, body)
	}
	if !hasAudit(c, map[string]any{"event": "upstream_connect", "owner": "carol", "upstream": "remote"}) {
		t.Error("no audit line for carol's connection")
	}
	for _, s := range as.Secrets() {
		if strings.Contains(c.Logs(), s) {
			t.Errorf("a token of the authorization server (%.8s…) is in the log", s)
		}
	}
	if strings.Contains(c.Logs(), strings.TrimPrefix(path, "/zidane/connect/")) {
		t.Error("the link's secret is in the log")
	}
}

// TestConnectLinkGoSDKHandshake: go-sdk's client at 2025-11-25, declaring
// URL elicitation, connects to a per_user upstream through the built
// gateway before its person has connected their account: the handshake is
// the gateway's, and the first call fails with -32042 whose
// data.elicitations carries the connect link, as go-sdk reads it. Then the
// 2026-07-28 retries of others are refused: dave's with erin's
// requestState, and a made-up one (403, -32602, audited), neither
// reaching the upstream. Once erin connects in her browser, the same
// session's call acts as erin, and her own 2026-07-28 retry goes on.
func TestConnectLinkGoSDKHandshake(t *testing.T) {
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
	t.Cleanup(up.Close)
	secret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", secret, nil)
	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
		}
		upstream remote %[2]s {
			oauth {
				client_id zidane-gateway
				client_secret ${REMOTE_SECRET}
				redirect_url %[1]s/zidane/oauth/callback/remote
				credentials per_user
			}
		}
	}
}

%[1]s {
	zidane_mcp {
		broker remote
		resource %[1]s/mcp
	}
}
`, base, up.URL), "REMOTE_SECRET="+secret, "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))
	g := &perUserGateway{c: c, as: as, up: up, brokerURL: base + "/mcp", callback: base + "/zidane/oauth/callback/remote"}
	erin := createToken(t, c, "erin-laptop", "--scope", "upstream:remote", "--owner", "erin")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	connect := func() (*mcp.ClientSession, error) {
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, &mcp.ClientOptions{
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "accept"}, nil
			},
			Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}})
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: g.brokerURL, MaxRetries: -1, DisableStandaloneSSE: true,
			HTTPClient: bearerClient(erin, nil)}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	}
	before, _ := up.Stats()
	cs, err := connect()
	if err != nil {
		t.Fatalf("the handshake before connecting: %v", err)
	}
	defer cs.Close()
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired {
		t.Fatalf("the call before connecting: %v, want -32042", err)
	}
	var data struct {
		Elicitations []*mcp.ElicitParams `json:"elicitations"`
	}
	if err := json.Unmarshal(rpcErr.Data, &data); err != nil || len(data.Elicitations) != 1 || data.Elicitations[0].Mode != "url" ||
		!strings.HasPrefix(data.Elicitations[0].URL, base+"/zidane/connect/zcl_") || data.Elicitations[0].ElicitationID == "" {
		t.Fatalf("the elicitation: %s (%v)", rpcErr.Data, err)
	}

	// erin's 2026-07-28 call gets input_required and a requestState.
	dave := createToken(t, c, "dave-laptop", "--scope", "upstream:remote", "--owner", "dave")
	modern := func(token, extra string) rawAnswer {
		return post(t, g.brokerURL, token, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"whoami","arguments":{}`+extra+
			`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}}}`,
			"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/call", "Mcp-Name", "whoami")
	}
	a := modern(erin, "")
	var ir struct {
		Result struct {
			ResultType   string `json:"resultType"`
			RequestState string `json:"requestState"`
		} `json:"result"`
	}
	if json.Unmarshal([]byte(a.body), &ir) != nil || ir.Result.ResultType != "input_required" || !strings.HasPrefix(ir.Result.RequestState, "zidane-connect.") {
		t.Fatalf("erin's 2026-07-28 call: %d %s", a.status, a.body)
	}
	id := strings.TrimPrefix(ir.Result.RequestState, "zidane-connect.")
	retry := func(state string) string {
		s, _ := json.Marshal(state)
		k, _ := json.Marshal(strings.TrimPrefix(state, "zidane-connect."))
		return `,"requestState":` + string(s) + `,"inputResponses":{` + string(k) + `:{"action":"accept"}}`
	}
	for _, atk := range []struct{ name, token, state string }{
		{"dave's retry with erin's requestState", dave, ir.Result.RequestState},
		{"a made-up requestState", erin, "zidane-connect.made-up"},
	} {
		if a := modern(atk.token, retry(atk.state)); a.status != http.StatusForbidden || !strings.Contains(a.body, `"code":-32602`) || !strings.Contains(a.body, "not issued to you") {
			t.Errorf("%s: %d %s", atk.name, a.status, a.body)
		}
	}
	if !hasAudit(c, map[string]any{"event": "refused", "reason": "request_state", "token_name": "dave-laptop"}) {
		t.Error("no audit line for dave's retry with erin's requestState")
	}
	if after, _ := up.Stats(); after != before {
		t.Fatalf("the upstream got %d requests before erin connected", after-before)
	}

	b := newFormBrowser(t, base)
	b.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if resp, body := b.post("/zidane/signin/link", url.Values{"secret": {signInLink(t, c, "erin", "upstream:remote")}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("erin's sign-in: %d %s", resp.StatusCode, body)
	}
	resp, _ := b.post(strings.TrimPrefix(data.Elicitations[0].URL, base), url.Values{"connect": {"1"}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the press: %d", resp.StatusCode)
	}
	q := g.signIn(t, resp.Header.Get("Location"), "erin")
	if resp, body := b.get(g.callback + "?" + q.Encode()); resp.StatusCode != http.StatusOK {
		t.Fatalf("the callback: %d %s", resp.StatusCode, body)
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil || res.IsError || len(res.Content) != 1 {
		t.Fatalf("erin's call: %v %+v", err, res)
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || tc.Text != "whoami: erin" {
		t.Fatalf("erin's call said %+v", res.Content[0])
	}
	if a := modern(erin, retry(ir.Result.RequestState)); a.status != http.StatusOK || !strings.Contains(a.body, "whoami: erin") {
		t.Fatalf("erin's own retry (%s): %d %s", id, a.status, a.body)
	}
	if a := modern(dave, retry(ir.Result.RequestState)); a.status != http.StatusForbidden {
		t.Fatalf("dave's retry with erin's requestState once she connected: %d %s", a.status, a.body)
	}
}
