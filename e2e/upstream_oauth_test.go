package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// upstreamOAuthCaddyfile offers upstream remote, whose tokens the gateway
// obtains with an authorization-code login (a pre-registered client, its
// secret from caddy's environment, the callback on the aggregated site), as an
// aggregated route on aggPort and a pass-through route on brokerPort.
func upstreamOAuthCaddyfile(upstreamURL string, aggPort, brokerPort int) string {
	return fmt.Sprintf(`{
	admin %[1]s
	zidane {
		upstream remote %[2]s {
			oauth {
				grant authorization_code
				client_id zidane-gateway
				client_secret ${REMOTE_SECRET}
				redirect_url http://127.0.0.1:%[3]d/zidane/oauth/callback/remote
			}
		}
	}
}

http://:%[3]d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate remote
		rate_limit {
			per_token 1000/s 1000
		}
	}
}

http://:%[4]d {
	bind 127.0.0.1
	zidane_mcp {
		broker remote
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, upstreamURL, aggPort, brokerPort)
}

// oauthGateway is the gateway of TestUpstreamOAuth with the upstream's
// authorization server and MCP server, and every body a downstream client
// or the operator got from it.
type oauthGateway struct {
	c         *Caddy
	as        *oauthtest.AuthServer
	up        *oauthtest.MCPServer
	token     string // the downstream client's token (upstream:remote)
	aggURL    string
	brokerURL string
	// callbackURL is the upstream's redirect_url: the login callback on
	// the aggregated route's site.
	callbackURL string

	mu   sync.Mutex
	seen []string
}

// saw records what a client or the operator was shown.
func (g *oauthGateway) saw(s string) {
	g.mu.Lock()
	g.seen = append(g.seen, s)
	g.mu.Unlock()
}

const loginHint = "caddy zidane login remote"

// upstreamRow returns the row of remote in `caddy zidane upstream list`.
func (g *oauthGateway) upstreamRow(t *testing.T) string {
	t.Helper()
	stdout, stderr, err := g.c.Run(t, "zidane", "upstream", "list")
	g.saw(stdout + stderr)
	if err != nil {
		t.Fatalf("upstream list: %v\n%s", err, stderr)
	}
	for _, line := range strings.Split(stdout, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "remote" {
			return line
		}
	}
	t.Fatalf("upstream list has no row for remote:\n%s", stdout)
	return ""
}

// authStatus is the "auth" object of remote in `upstream list --json`.
type authStatus struct {
	State  string   `json:"state"`
	Scopes []string `json:"scopes"`
	Err    string   `json:"error"`
}

func (g *oauthGateway) auth(t *testing.T) authStatus {
	t.Helper()
	stdout, stderr, err := g.c.Run(t, "zidane", "upstream", "list", "--json")
	g.saw(stdout + stderr)
	if err != nil {
		t.Fatalf("upstream list --json: %v\n%s", err, stderr)
	}
	var list []struct {
		Name string      `json:"name"`
		Auth *authStatus `json:"auth"`
	}
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatalf("upstream list --json: %v\n%s", err, stdout)
	}
	for _, u := range list {
		if u.Name == "remote" && u.Auth != nil {
			return *u.Auth
		}
	}
	t.Fatalf("upstream list --json has no auth for remote:\n%s", stdout)
	return authStatus{}
}

// login runs `caddy zidane login remote --wait 0` and plays the operator's
// browser with the authorization URL it printed (see browse). It returns
// the authorization request.
func (g *oauthGateway) login(t *testing.T) url.Values {
	t.Helper()
	stdout, stderr, err := g.c.Run(t, "zidane", "login", "remote", "--wait", "0")
	g.saw(stdout + stderr)
	if err != nil {
		t.Fatalf("zidane login: %v\n%s%s", err, stdout, stderr)
	}
	authURL := g.authorizationURL(stdout)
	if authURL == "" {
		t.Fatalf("zidane login printed no authorization URL of %s:\n%s", g.as.URL, stdout)
	}
	return g.browse(t, authURL)
}

// loginWaiting runs `caddy zidane login remote` as an operator does, waiting
// for the callback: it plays the browser with the URL the command prints
// while it runs, and returns what the command printed once it ends.
func (g *oauthGateway) loginWaiting(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := boundedCommand(ctx, g.c.Bin, "zidane", "login", "remote", "--wait", "90s")
	cmd.Dir = g.c.Dir
	cmd.Env = g.c.environ()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var printed strings.Builder
	sc := bufio.NewScanner(out)
	authURL := ""
	for authURL == "" && sc.Scan() {
		printed.WriteString(sc.Text() + "\n")
		authURL = g.authorizationURL(sc.Text())
	}
	if authURL == "" {
		cmd.Wait()
		t.Fatalf("zidane login printed no authorization URL of %s:\n%s%s", g.as.URL, printed.String(), stderr.String())
	}
	g.browse(t, authURL)
	rest, _ := io.ReadAll(out)
	printed.Write(rest)
	err = cmd.Wait()
	g.saw(printed.String() + stderr.String())
	if err != nil {
		t.Fatalf("zidane login: %v\n%s%s", err, printed.String(), stderr.String())
	}
	return printed.String()
}

// authorizationURL returns the authorization server's URL in what the login
// command printed, or "".
func (g *oauthGateway) authorizationURL(printed string) string {
	for _, f := range strings.Fields(printed) {
		if strings.HasPrefix(f, g.as.URL+"/authorize?") {
			return f
		}
	}
	return ""
}

// browse plays the operator's browser: it opens the authorization URL
// (the authorization server approves at once and redirects), and follows
// the redirect to the gateway's callback on its site, which must answer
// with its success page. It returns the authorization request. (Go's client
// sends no Sec-Fetch-* headers, which a real browser's navigation carries.)
func (g *oauthGateway) browse(t *testing.T, authURL string) url.Values {
	t.Helper()
	u, err := url.Parse(authURL)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := browser.Get(authURL)
	if err != nil {
		t.Fatalf("opening the authorization URL: %v", err)
	}
	resp.Body.Close()
	callback := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || !strings.HasPrefix(callback, g.callbackURL+"?") {
		t.Fatalf("authorization endpoint answered %d, Location %q; want a redirect to the gateway's callback", resp.StatusCode, callback)
	}
	resp, err = browser.Get(callback)
	if err != nil {
		t.Fatalf("following the redirect to the callback: %v", err)
	}
	page, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	g.saw(string(page))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "Logged in to remote") {
		t.Fatalf("callback answered %d:\n%s", resp.StatusCode, page)
	}
	return u.Query()
}

// aggSession connects a go-sdk client to the aggregated route.
func (g *oauthGateway) aggSession(t *testing.T) *mcp.ClientSession {
	t.Helper()
	cs, err := connectGo(t, g.aggURL, bearerClient(g.token, nil))
	if err != nil {
		t.Fatalf("connecting to the aggregated route: %v", err)
	}
	return cs
}

// listAgg returns the names of the aggregated route's tools.
func (g *oauthGateway) listAgg(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list on the aggregated route: %v", err)
	}
	b, _ := json.Marshal(res)
	g.saw(string(b))
	return toolNamesOf(res)
}

// awaitAggTool polls tools/list until the aggregated route lists tool: the
// catalog reconnects in the background.
func (g *oauthGateway) awaitAggTool(t *testing.T, cs *mcp.ClientSession, tool string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		names := g.listAgg(t, cs)
		if slices.Contains(names, tool) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the aggregated route does not list %s after 60s; it lists %v", tool, names)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// oauthToolAnswer is a tools/call answer as a client reads it.
type oauthToolAnswer struct {
	isError bool
	text    string
	rpcErr  string // a JSON-RPC error instead of a result
}

// callGo calls tool through a go-sdk client session (on either route).
func (g *oauthGateway) callGo(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) oauthToolAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		g.saw(err.Error())
		return oauthToolAnswer{rpcErr: err.Error()}
	}
	b, _ := json.Marshal(res)
	g.saw(string(b))
	return oauthToolAnswer{isError: res.IsError, text: contentText(res.Content)}
}

// callPT calls tool on the pass-through route with one raw JSON-RPC
// request (the upstream is stateless: no session needed).
func (g *oauthGateway) callPT(t *testing.T, tool string, args map[string]any) oauthToolAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": map[string]any{"name": tool, "arguments": args}})
	a := post(t, g.brokerURL, g.token, string(body), "Mcp-Protocol-Version", "2025-11-25")
	g.saw(a.body)
	var msg struct {
		Result *mcp.CallToolResult `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(a.body), &msg); err != nil {
		t.Fatalf("pass-through tools/call %s: HTTP %d, body not JSON-RPC: %s", tool, a.status, a.body)
	}
	switch {
	case msg.Error != nil:
		return oauthToolAnswer{rpcErr: fmt.Sprintf("HTTP %d: %s", a.status, msg.Error.Message)}
	case msg.Result == nil:
		t.Fatalf("pass-through tools/call %s: HTTP %d, neither result nor error: %s", tool, a.status, a.body)
	}
	return oauthToolAnswer{isError: msg.Result.IsError, text: contentText(msg.Result.Content)}
}

func contentText(content []mcp.Content) string {
	var b strings.Builder
	for _, c := range content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// wantOK fails unless a is the successful result want.
func wantOK(t *testing.T, route string, a oauthToolAnswer, want string) {
	t.Helper()
	if a.rpcErr != "" || a.isError || a.text != want {
		t.Fatalf("%s: got %+v, want the result %q", route, a, want)
	}
}

// wantLoginError fails unless a is a tool error telling to log in.
func wantLoginError(t *testing.T, route string, a oauthToolAnswer) {
	t.Helper()
	if a.rpcErr != "" || !a.isError || !strings.Contains(a.text, loginHint) {
		t.Fatalf("%s: got %+v, want a tool error saying `%s`", route, a, loginHint)
	}
}

// refreshes counts the refresh_token grants the authorization server
// honoured.
func refreshes(as *oauthtest.AuthServer) int {
	n := 0
	for _, r := range as.TokenRequests() {
		if r.GrantType == oauthtest.GrantRefreshToken && r.Error == "" {
			n++
		}
	}
	return n
}

// hasAudit reports whether an audit line has every field of want.
func hasAudit(c *Caddy, want map[string]any) bool {
	for _, l := range auditLines(c) {
		match := true
		for k, v := range want {
			if l[k] != v {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// TestUpstreamOAuth logs the gateway in to an OAuth-protected upstream MCP
// server and uses it through the aggregated and the pass-through routes,
// across token expiry, a step-up, a restart, a revoked grant and a logout.
// The authorization server and the MCP server run in the test process
// (internal/oauthtest); the gateway is the built caddy binary, driven by
// its CLI and admin API as an operator would.
func TestUpstreamOAuth(t *testing.T) {
	// Access tokens live 3s: shorter than twice the client's refresh
	// skew, so the gateway refreshes them at half-life.
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{
		AccessTokenTTL: 3 * time.Second,
		AuthMethods:    []string{oauthtest.ClientSecretBasic, oauthtest.ClientSecretPost},
	})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{ScopesSupported: []string{"mcp:read"}, EchoScope: "mcp:read", AdminScope: "mcp:admin"})
	t.Cleanup(up.Close)
	clientSecret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", clientSecret, nil)

	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	tokenKey := base64.StdEncoding.EncodeToString(rawKey)
	aggPort, brokerPort := freePort(t), freePort(t)
	c := startCaddy(t, upstreamOAuthCaddyfile(up.URL, aggPort, brokerPort),
		"REMOTE_SECRET="+clientSecret, "ZIDANE_UPSTREAM_TOKEN_KEY="+tokenKey)
	g := &oauthGateway{
		c: c, as: as, up: up,
		token:     createToken(t, c, "agent", "--scope", "upstream:remote"),
		aggURL:    fmt.Sprintf("http://127.0.0.1:%d/mcp", aggPort),
		brokerURL: fmt.Sprintf("http://127.0.0.1:%d/mcp", brokerPort),

		callbackURL: fmt.Sprintf("http://127.0.0.1:%d/zidane/oauth/callback/remote", aggPort),
	}
	echo := func(text string) map[string]any { return map[string]any{"text": text} }

	// Each step builds on the ones before it: one that stops (t.Fatal)
	// stops the test; one that only reports errors lets the next ones run.
	step := func(name string, f func(t *testing.T)) {
		completed := false
		t.Run(name, func(t *testing.T) {
			f(t)
			completed = true
		})
		if !completed {
			t.Fatalf("step %q stopped; the steps after it depend on it", name)
		}
	}

	step("a before login", func(t *testing.T) {
		if row := g.upstreamRow(t); !strings.Contains(row, "auth-required") {
			t.Errorf("upstream list: %q, want remote auth-required", row)
		}
		cs := g.aggSession(t)
		for _, n := range g.listAgg(t, cs) {
			if strings.HasPrefix(n, "mcp_remote_") {
				t.Errorf("the aggregated route lists %s before the login", n)
			}
		}
		wantLoginError(t, "aggregated mcp_remote_echo", g.callGo(t, cs, "mcp_remote_echo", echo("x")))
		wantLoginError(t, "pass-through echo", g.callPT(t, "echo", echo("x")))
		if req, _ := up.Stats(); req != 0 {
			t.Errorf("the upstream got %d requests before the login; the gateway has no token to send", req)
		}
		if !hasAudit(c, map[string]any{"event": "upstream_call", "upstream": "remote", "outcome": "auth_required"}) {
			t.Error("no audit line for the call refused for want of a login (upstream_call, outcome auth_required)")
		}
	})

	step("b login", func(t *testing.T) {
		q := g.login(t)
		if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("client_id") != "zidane-gateway" ||
			q.Get("resource") != up.URL || q.Get("redirect_uri") != g.callbackURL || q.Get("scope") != "mcp:read" {
			t.Errorf("authorization request %v", q)
		}
		if n := as.PKCEVerified(); n != 1 {
			t.Errorf("the authorization server verified PKCE for %d codes, want 1", n)
		}
		// The first token request redeemed the code (refreshes may follow:
		// the tokens live 3s).
		if reqs := as.TokenRequests(); len(reqs) == 0 || reqs[0].GrantType != oauthtest.GrantAuthorizationCode || reqs[0].Error != "" ||
			reqs[0].AuthMethod != oauthtest.ClientSecretBasic || reqs[0].Resource != up.URL {
			t.Errorf("token requests %+v, want first an authorization_code grant with the client secret and the resource", reqs)
		}
		if row := g.upstreamRow(t); !strings.Contains(row, "ready (mcp:read)") {
			t.Errorf("upstream list: %q, want remote ready with scope mcp:read", row)
		}
		if !hasAudit(c, map[string]any{"event": "upstream_login", "upstream": "remote", "outcome": "ok"}) ||
			!hasAudit(c, map[string]any{"event": "upstream_auth", "upstream": "remote", "state": "ready"}) {
			t.Error("no audit lines for the completed login and the state ready")
		}
	})

	step("c calls succeed on both routes", func(t *testing.T) {
		cs := g.aggSession(t)
		g.awaitAggTool(t, cs, "mcp_remote_echo")
		wantOK(t, "aggregated", g.callGo(t, cs, "mcp_remote_echo", echo("via aggregate")), "echo: via aggregate")
		pt, err := connectGo(t, g.brokerURL, bearerClient(g.token, nil))
		if err != nil {
			t.Fatalf("connecting to the pass-through route: %v", err)
		}
		wantOK(t, "pass-through (go-sdk)", g.callGo(t, pt, "echo", echo("via broker")), "echo: via broker")
		wantOK(t, "pass-through (raw)", g.callPT(t, "echo", echo("raw")), "echo: raw")
		bearers, issued := up.Bearers(), as.AccessTokens()
		if len(bearers) == 0 {
			t.Fatal("the upstream saw no authorized request")
		}
		for _, b := range bearers {
			if !slices.Contains(issued, b) {
				t.Errorf("the upstream saw a bearer token (%.8s…) its authorization server did not issue", b)
			}
			if b == g.token {
				t.Error("the downstream client's token reached the upstream")
			}
		}
	})

	step("d expiry and refresh", func(t *testing.T) {
		cs := g.aggSession(t)
		g.awaitAggTool(t, cs, "mcp_remote_echo")
		before := refreshes(as)
		deadline := time.Now().Add(60 * time.Second)
		calls := 0
		for refreshes(as) < before+2 {
			if time.Now().After(deadline) {
				t.Fatalf("%d refresh_token grants in 60s of calls (%d calls), want 2; token requests %+v", refreshes(as)-before, calls, as.TokenRequests())
			}
			calls++
			text := fmt.Sprintf("call %d", calls)
			wantOK(t, "aggregated", g.callGo(t, cs, "mcp_remote_echo", echo(text)), "echo: "+text)
			wantOK(t, "pass-through", g.callPT(t, "echo", echo(text)), "echo: "+text)
			time.Sleep(300 * time.Millisecond)
		}
		for _, rt := range as.RefreshTokens() {
			if rt.Redeemed > 1 {
				t.Errorf("refresh token %.8s… redeemed %d times", rt.Token, rt.Redeemed)
			}
		}
		for _, r := range as.TokenRequests() {
			if r.Error != "" {
				t.Errorf("token request %+v refused", r)
			}
		}
		if _, authorized := up.Stats(); authorized == 0 {
			t.Error("no authorized upstream request")
		}
		t.Logf("%d calls on each route, %d refreshes", calls, refreshes(as)-before)
	})

	step("e step-up", func(t *testing.T) {
		cs := g.aggSession(t)
		g.awaitAggTool(t, cs, "mcp_remote_admin_op")
		// The gateway learns of the step-up from the upstream's 403 to
		// this call, while it holds a token.
		if a := g.callGo(t, cs, "mcp_remote_admin_op", nil); a.rpcErr != "" || !a.isError || !strings.Contains(a.text, loginHint) {
			t.Errorf("aggregated mcp_remote_admin_op: got %+v, want a tool error saying `%s`", a, loginHint)
		}
		wantLoginError(t, "aggregated mcp_remote_admin_op, again", g.callGo(t, cs, "mcp_remote_admin_op", nil))
		st := g.auth(t)
		if st.State != "auth-required" || !strings.Contains(st.Err, "mcp:admin") {
			t.Errorf("auth status %+v, want auth-required for the scope mcp:admin", st)
		}
		pt := g.callPT(t, "admin_op", nil)
		wantLoginError(t, "pass-through admin_op", pt)
		if !strings.Contains(pt.text, "mcp:admin") {
			t.Errorf("pass-through admin_op: %q does not name the scope to log in with (mcp:admin)", pt.text)
		}
		authorizations := len(as.AuthorizationRequests())
		q := g.login(t)
		if got := strings.Fields(q.Get("scope")); !slices.Contains(got, "mcp:read") || !slices.Contains(got, "mcp:admin") {
			t.Errorf("the step-up login asks for %q, want mcp:read and mcp:admin", q.Get("scope"))
		}
		if n := len(as.AuthorizationRequests()); n != authorizations+1 {
			t.Errorf("%d authorization requests for one login", n-authorizations)
		}
		if st := g.auth(t); st.State != "ready" || !slices.Contains(st.Scopes, "mcp:admin") {
			t.Errorf("auth status after the step-up login %+v", st)
		}
		wantOK(t, "aggregated", g.callGo(t, cs, "mcp_remote_admin_op", nil), "admin_op: done")
		wantOK(t, "pass-through", g.callPT(t, "admin_op", nil), "admin_op: done")
		wantOK(t, "aggregated echo", g.callGo(t, cs, "mcp_remote_echo", echo("after step-up")), "echo: after step-up")
	})

	step("f restart", func(t *testing.T) {
		authorizations := len(as.AuthorizationRequests())
		codes := as.PKCEVerified()
		c.Restart(t)
		cs := g.aggSession(t)
		g.awaitAggTool(t, cs, "mcp_remote_admin_op")
		wantOK(t, "aggregated", g.callGo(t, cs, "mcp_remote_echo", echo("after restart")), "echo: after restart")
		wantOK(t, "aggregated", g.callGo(t, cs, "mcp_remote_admin_op", nil), "admin_op: done")
		wantOK(t, "pass-through", g.callPT(t, "echo", echo("after restart")), "echo: after restart")
		if len(as.AuthorizationRequests()) != authorizations || as.PKCEVerified() != codes {
			t.Error("the restarted gateway needed a new login")
		}
		if st := g.auth(t); st.State != "ready" || !slices.Contains(st.Scopes, "mcp:admin") {
			t.Errorf("auth status after the restart %+v", st)
		}
	})

	step("g revoked refresh token", func(t *testing.T) {
		as.RevokeRefreshTokens()
		// The access token works until it expires; then the refresh is
		// refused, and the calls say to log in.
		deadline := time.Now().Add(60 * time.Second)
		for {
			a := g.callPT(t, "echo", echo("until expiry"))
			if a.rpcErr == "" && a.isError {
				wantLoginError(t, "pass-through after the refresh token was revoked", a)
				break
			}
			wantOK(t, "pass-through before the access token expired", a, "echo: until expiry")
			if time.Now().After(deadline) {
				t.Fatal("calls still succeed 60s after the refresh tokens were revoked")
			}
			time.Sleep(250 * time.Millisecond)
		}
		reqs := as.TokenRequests()
		if last := reqs[len(reqs)-1]; last.GrantType != oauthtest.GrantRefreshToken || last.Error != "invalid_grant" {
			t.Errorf("last token request %+v, want the refused refresh", last)
		}
		if row := g.upstreamRow(t); !strings.Contains(row, "auth-required") {
			t.Errorf("upstream list: %q, want remote auth-required", row)
		}
		cs := g.aggSession(t)
		wantLoginError(t, "aggregated", g.callGo(t, cs, "mcp_remote_echo", echo("x")))
		if !hasAudit(c, map[string]any{"event": "upstream_auth", "upstream": "remote", "state": "auth-required"}) {
			t.Error("no audit line for the state auth-required")
		}
	})

	step("h logout", func(t *testing.T) {
		// This time the login command waits for the callback, as by
		// default.
		if out := g.loginWaiting(t); !strings.Contains(out, `Logged in to upstream "remote"; scopes granted: mcp:read.`) {
			t.Errorf("zidane login printed:\n%s", out)
		}
		wantOK(t, "pass-through after the new login", g.callPT(t, "echo", echo("again")), "echo: again")
		stdout, stderr, err := c.Run(t, "zidane", "logout", "remote")
		g.saw(stdout + stderr)
		if err != nil {
			t.Fatalf("zidane logout: %v\n%s", err, stderr)
		}
		if !strings.Contains(stdout, "auth-required") {
			t.Errorf("zidane logout printed %q", stdout)
		}
		// The gateway holds no token after the logout, so the last
		// refresh token issued is the one it held.
		rts := as.RefreshTokens()
		if current := rts[len(rts)-1].Token; !slices.Contains(as.Revocations(), current) {
			t.Errorf("the authorization server saw %d revocations, none of the current refresh token", len(as.Revocations()))
		}
		if row := g.upstreamRow(t); !strings.Contains(row, "auth-required") {
			t.Errorf("upstream list: %q, want remote auth-required", row)
		}
		wantLoginError(t, "pass-through after logout", g.callPT(t, "echo", echo("x")))
		if !hasAudit(c, map[string]any{"event": "upstream_logout", "upstream": "remote"}) {
			t.Error("no audit line for the logout")
		}
	})

	step("i no leaks", func(t *testing.T) {
		codes := as.AuthorizationCodes()
		var tokens []string // every other secret
		for _, s := range append(as.Secrets(), clientSecret, tokenKey) {
			if !slices.Contains(codes, s) {
				tokens = append(tokens, s)
			}
		}
		if len(tokens) < 10 || len(codes) < 3 {
			t.Fatalf("only %d tokens and %d codes issued: the steps before did not run", len(tokens), len(codes))
		}
		// Everything the gateway wrote: storage, autosave, the Caddyfile
		// and its log (step j searches the log for the codes).
		assertNoSecretsUnder(t, c.Dir, tokens)
		for _, f := range filesHolding(t, c.Dir, codes) {
			if f != c.logPath {
				t.Errorf("%s holds an authorization code", f)
			}
		}
		for _, l := range logLinesHolding(c, tokens) {
			t.Errorf("caddy's log holds a token or secret, in a line of %s", l)
		}
		g.mu.Lock()
		seen := slices.Clone(g.seen)
		g.mu.Unlock()
		if len(seen) < 20 {
			t.Errorf("only %d answers recorded", len(seen))
		}
		for _, s := range append(tokens, codes...) {
			for _, body := range seen {
				if strings.Contains(body, s) {
					t.Errorf("a client or the operator was shown a secret (%.12s…) in %.200q", s, body)
					break
				}
			}
		}
	})

	step("j authorization codes stay out of caddy's log", func(t *testing.T) {
		for _, l := range logLinesHolding(c, as.AuthorizationCodes()) {
			t.Errorf("caddy's log holds an authorization code, in a line of %s", l)
		}
	})

	step("k a browser's navigation reaches the callback", func(t *testing.T) {
		// What a browser sends when the authorization server redirects it
		// to redirect_url: a navigation, with Sec-Fetch-* headers and no
		// Origin. The state is unknown, so the gateway's own page says
		// the login failed.
		req, err := http.NewRequest(http.MethodGet, g.callbackURL+"?code=not-a-code&state=not-a-state", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range map[string]string{
			"User-Agent":                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/156.0.0.0 Safari/537.36",
			"Accept":                    "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
			"Upgrade-Insecure-Requests": "1",
			"Sec-Fetch-Site":            "cross-site",
			"Sec-Fetch-Mode":            "navigate",
			"Sec-Fetch-User":            "?1",
			"Sec-Fetch-Dest":            "document",
		} {
			req.Header.Set(k, v)
		}
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(page), "Login to remote failed") {
			t.Errorf("a browser's navigation to the callback got %d %s; want the gateway's page (400, login failed: unknown state)", resp.StatusCode, page)
		}
	})
}

// filesHolding returns the files under root that hold any of secrets.
func filesHolding(t *testing.T, root string, secrets []string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for _, s := range secrets {
			if strings.Contains(string(b), s) {
				out = append(out, path)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// logLinesHolding describes caddy's log lines that hold any of secrets:
// their logger and message.
func logLinesHolding(c *Caddy, secrets []string) []string {
	var out []string
	for _, line := range strings.Split(c.Logs(), "\n") {
		for _, s := range secrets {
			if strings.Contains(line, s) {
				var l struct{ Logger, Msg string }
				json.Unmarshal([]byte(line), &l)
				out = append(out, fmt.Sprintf("logger %q, msg %q", l.Logger, l.Msg))
				break
			}
		}
	}
	return out
}

// The gateway serves its Client ID Metadata Document at an upstream's
// client_metadata_url, on its own sites, for the upstream's authorization
// server to fetch; other paths are the MCP endpoint's as before.
func TestClientIDMetadataDocumentServed(t *testing.T) {
	port := freePort(t)
	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream linear https://mcp.linear.example/mcp {
			oauth {
				client_metadata_url https://localhost/oauth/client.json
				redirect_url http://localhost:%d/zidane/oauth/callback/linear
			}
		}
		upstream machine https://mcp.internal.example/mcp {
			oauth {
				grant client_credentials
				client_id gateway
				client_secret ${MACHINE_SECRET}
			}
		}
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate linear
	}
}
`, AdminPlaceholder, port, port), "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey), "MACHINE_SECRET=machine-secret-5c1")
	get := func(path string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
		req.Host = "localhost"
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	status, ctype, body := get("/oauth/client.json")
	var doc struct {
		ClientID     string   `json:"client_id"`
		RedirectURIs []string `json:"redirect_uris"`
		AuthMethod   string   `json:"token_endpoint_auth_method"`
	}
	if status != http.StatusOK || ctype != "application/json" || json.Unmarshal([]byte(body), &doc) != nil ||
		doc.ClientID != "https://localhost/oauth/client.json" || len(doc.RedirectURIs) != 1 ||
		doc.RedirectURIs[0] != fmt.Sprintf("http://localhost:%d/zidane/oauth/callback/linear", port) || doc.AuthMethod != "none" {
		t.Fatalf("GET /oauth/client.json: %d %s %s", status, ctype, body)
	}
	if status, _, _ := get("/oauth/other.json"); status != http.StatusUnauthorized {
		t.Fatalf("another path got %d, want the MCP endpoint's 401 without a token", status)
	}
	// The login command refuses, saying why, an upstream that needs no
	// login and one that does not exist.
	if _, stderr, err := c.Run(t, "zidane", "login", "machine", "--wait", "0"); err == nil || !strings.Contains(stderr, "needs no login") {
		t.Fatalf("login of a client-credentials upstream: %v\n%s", err, stderr)
	}
	if _, stderr, err := c.Run(t, "zidane", "login", "nosuch", "--wait", "0"); err == nil || !strings.Contains(stderr, `no upstream`) || !strings.Contains(stderr, "nosuch") {
		t.Fatalf("login of an unknown upstream: %v\n%s", err, stderr)
	}
}
