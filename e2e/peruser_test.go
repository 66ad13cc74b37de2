package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/accounts"
	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// perUserGateway is a gateway whose upstream remote (an OAuth-protected
// MCP server whose whoami tool says which of its users a token acts for)
// has credentials per_user, served on a broker route.
type perUserGateway struct {
	c           *Caddy
	as          *oauthtest.AuthServer
	up          *oauthtest.MCPServer
	brokerURL   string
	sessionsURL string
	callback    string
}

func startPerUserGateway(t *testing.T) *perUserGateway {
	t.Helper()
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
	t.Cleanup(up.Close)
	secret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", secret, nil)
	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	port, sessionsPort := freePort(t), freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %[1]s
	zidane {
		upstream remote %[2]s {
			oauth {
				client_id zidane-gateway
				client_secret ${REMOTE_SECRET}
				redirect_url http://127.0.0.1:%[3]d/zidane/oauth/callback/remote
				credentials per_user
			}
		}
		session_upstreams remote
	}
}

http://:%[3]d {
	bind 127.0.0.1
	zidane_mcp {
		broker remote
		rate_limit {
			per_token 1000/s 1000
		}
	}
}

http://:%[4]d {
	bind 127.0.0.1
	zidane_mcp {
		sessions
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, up.URL, port, sessionsPort), "REMOTE_SECRET="+secret, "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))
	return &perUserGateway{c: c, as: as, up: up, brokerURL: fmt.Sprintf("http://127.0.0.1:%d/mcp", port),
		sessionsURL: fmt.Sprintf("http://127.0.0.1:%d/mcp", sessionsPort),
		callback:    fmt.Sprintf("http://127.0.0.1:%d/zidane/oauth/callback/remote", port)}
}

// signIn plays a browser signed in at the authorization server as user:
// it opens authURL and returns the query of the redirect to the gateway's
// callback, without following it.
func (g *perUserGateway) signIn(t *testing.T, authURL, user string) url.Values {
	t.Helper()
	browser := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := browser.Get(authURL + "&login_hint=" + url.QueryEscape(user))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc, g.callback+"?") {
		t.Fatalf("authorization endpoint answered %d, Location %q", resp.StatusCode, loc)
	}
	u, _ := url.Parse(loc)
	return u.Query()
}

// admin posts body to the admin API path with the host's admin key, as
// the CLI does, and decodes the answer into out.
func (g *perUserGateway) admin(t *testing.T, path string, body any, out any) int {
	t.Helper()
	key, err := os.ReadFile(filepath.Join(g.c.DataDir, "zidane", "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, g.c.AdminURL(path), bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Zidane-Admin-Key "+string(key))
	resp, err := shortClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: %s", path, raw)
		}
	}
	return resp.StatusCode
}

// connect connects owner's account: the person's login, begun and
// completed through the admin API, approved at the authorization server by
// user.
func (g *perUserGateway) connect(t *testing.T, owner, user string) {
	t.Helper()
	var begun struct {
		URL string `json:"authorization_url"`
	}
	if st := g.admin(t, "/zidane/connections/login", map[string]string{"owner": owner, "upstream": "remote"}, &begun); st != http.StatusOK || begun.URL == "" {
		t.Fatalf("connections/login for %s: HTTP %d", owner, st)
	}
	q := g.signIn(t, begun.URL, user)
	if st := g.admin(t, "/zidane/connections/callback", map[string]string{"owner": owner, "upstream": "remote", "query": q.Encode()}, nil); st != http.StatusOK {
		t.Fatalf("connections/callback for %s: HTTP %d", owner, st)
	}
}

// whoami calls the upstream's whoami tool on the broker route with token,
// and returns the tool's text, or why it was refused.
func (g *perUserGateway) whoami(t *testing.T, token string) (text string, isError bool) {
	t.Helper()
	a := post(t, g.brokerURL, token, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`,
		"Mcp-Protocol-Version", "2025-11-25")
	var msg struct {
		Result *struct {
			IsError bool `json:"isError"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(a.body), &msg); err != nil || (msg.Result == nil && msg.Error == nil) {
		t.Fatalf("whoami: HTTP %d %s", a.status, a.body)
	}
	if msg.Error != nil {
		return fmt.Sprintf("HTTP %d: %s", a.status, msg.Error.Message), true
	}
	var b strings.Builder
	for _, c := range msg.Result.Content {
		b.WriteString(c.Text)
	}
	return b.String(), msg.Result.IsError
}

// Two people, each connected with their own upstream account, call one
// per_user upstream through the broker route: each call runs upstream as
// its caller, a person who never connected is refused before the upstream
// with a word on connecting, the operator's shared token never goes out,
// the listing shows owners and no token, and revoking one person's
// connection ends their access at once (revoked at the authorization
// server too) and no one else's.
func TestPerUserUpstreamCredentials(t *testing.T) {
	g := startPerUserGateway(t)
	alice := createToken(t, g.c, "alice-laptop", "--scope", "upstream:remote", "--owner", "alice@example.com")
	bob := createToken(t, g.c, "bob-laptop", "--scope", "upstream:remote", "--owner", "bob@example.com")
	carol := createToken(t, g.c, "carol-laptop", "--scope", "upstream:remote", "--owner", "carol@example.com")

	// The operator's own login of the upstream: a shared token that a
	// per_user upstream must never send.
	stdout, stderr, err := g.c.Run(t, "zidane", "login", "remote", "--wait", "0")
	if err != nil {
		t.Fatalf("zidane login: %v\n%s", err, stderr)
	}
	var authURL string
	for _, f := range strings.Fields(stdout) {
		if strings.HasPrefix(f, g.as.URL+"/authorize?") {
			authURL = f
		}
	}
	q := g.signIn(t, authURL, "operator")
	resp, err := shortClient.Get(g.callback + "?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the operator's callback answered %d", resp.StatusCode)
	}
	shared := g.as.AccessTokens()
	if len(shared) != 1 {
		t.Fatalf("%d access tokens after the operator's login", len(shared))
	}

	g.connect(t, "alice@example.com", "alice")
	g.connect(t, "bob@example.com", "bob")

	for _, tc := range []struct{ who, token, want string }{
		{"alice", alice, "whoami: alice"}, {"bob", bob, "whoami: bob"}, {"alice again", alice, "whoami: alice"},
	} {
		if got, isErr := g.whoami(t, tc.token); isErr || got != tc.want {
			t.Errorf("%s's call: %q (error %v), want %q", tc.who, got, isErr, tc.want)
		}
	}

	before, _ := g.up.Stats()
	got, isErr := g.whoami(t, carol)
	if !isErr || !strings.Contains(got, "connect your account") || !strings.Contains(got, "remote") {
		t.Errorf("carol, never connected: %q (error %v), want a tool error saying to connect her account to remote", got, isErr)
	}
	if after, _ := g.up.Stats(); after != before {
		t.Errorf("carol's call reached the upstream (%d requests, was %d): it has no credential of hers to carry", after, before)
	}
	if !hasAudit(g.c, map[string]any{"event": "upstream_call", "upstream": "remote", "outcome": "connect_required"}) {
		t.Error("no audit line for carol's refused call (upstream_call, outcome connect_required)")
	}
	// Her listing is the gateway's, empty, so that her client connects
	// and meets the link at its first call; any other request that needs
	// the upstream gets 403 with a JSON-RPC error saying to connect. None
	// reaches the upstream.
	if a := post(t, g.brokerURL, carol, `{"jsonrpc":"2.0","id":4,"method":"tools/list"}`, "Mcp-Protocol-Version", "2025-11-25"); a.status != http.StatusOK ||
		!strings.Contains(a.body, `"tools":[]`) {
		t.Errorf("carol's tools/list: HTTP %d %s, want an empty list", a.status, a.body)
	}
	if a := post(t, g.brokerURL, carol, `{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"file:///x"}}`, "Mcp-Protocol-Version", "2025-11-25"); a.status != http.StatusForbidden ||
		!strings.Contains(a.body, "connect your account") || !strings.Contains(a.body, `"error"`) {
		t.Errorf("carol's resources/read: HTTP %d %s, want 403 with a JSON-RPC error to connect", a.status, a.body)
	}
	if after, _ := g.up.Stats(); after != before {
		t.Errorf("carol's requests reached the upstream")
	}
	if slices.Contains(g.up.Bearers(), shared[0]) {
		t.Error("the operator's shared token was sent on the per_user upstream")
	}

	list, stderr, err := g.c.Run(t, "zidane", "connections", "list")
	if err != nil {
		t.Fatalf("connections list: %v\n%s", err, stderr)
	}
	for _, want := range []string{"alice@example.com", "bob@example.com", "ready"} {
		if !strings.Contains(list, want) {
			t.Errorf("connections list lacks %q:\n%s", want, list)
		}
	}
	if strings.Contains(list, "carol") {
		t.Errorf("connections list shows carol, who never connected:\n%s", list)
	}
	for _, s := range g.as.Secrets() {
		if strings.Contains(list, s) || strings.Contains(g.c.Logs(), s) {
			t.Errorf("a token of the authorization server (%.8s…) is in the listing or the log", s)
		}
	}

	for _, tc := range []struct {
		args []string
		word string
	}{
		{[]string{"revoke"}, "name the owner, the upstream, or both"},
		{[]string{"list", "--upstream", "nosuch"}, `no upstream "nosuch"`},
		{[]string{"revoke", "--owner", strings.Repeat("x", 600)}, "at most 512 bytes"},
	} {
		out, stderr, err := g.c.Run(t, append([]string{"zidane", "connections"}, tc.args...)...)
		if err == nil || !strings.Contains(stderr, tc.word) {
			t.Errorf("connections %s: %v\n%s%s\nwant a refusal saying %q", strings.Join(tc.args, " "), err, out, stderr, tc.word)
		}
	}
	if got, _ := g.whoami(t, alice); got != "whoami: alice" {
		t.Errorf("alice after the refused revocations: %q", got)
	}

	revoked := len(g.as.Revocations())
	out, stderr, err := g.c.Run(t, "zidane", "connections", "revoke", "--owner", "alice@example.com")
	if err != nil || !strings.Contains(out, "alice@example.com") {
		t.Fatalf("connections revoke: %v\n%s%s", err, out, stderr)
	}
	if n := len(g.as.Revocations()) - revoked; n != 2 {
		t.Errorf("%d of alice's tokens revoked at the authorization server, want her refresh and access tokens", n)
	}
	before, _ = g.up.Stats()
	if got, isErr := g.whoami(t, alice); !isErr || !strings.Contains(got, "connect your account") {
		t.Errorf("alice after the revocation: %q (error %v), want the connect refusal", got, isErr)
	}
	if after, _ := g.up.Stats(); after != before {
		t.Error("alice's call after the revocation reached the upstream")
	}
	if got, _ := g.whoami(t, bob); got != "whoami: bob" {
		t.Errorf("bob after alice's revocation: %q", got)
	}
	if list, _, _ := g.c.Run(t, "zidane", "connections", "list", "--owner", "alice@example.com"); !strings.Contains(list, "No connections") {
		t.Errorf("alice's connections after the revocation:\n%s", list)
	}
}

// A session's agent acts upstream as the session's owner: its egress token
// is derived from the owner's, so the broker attaches the owner's own
// upstream token, and a session of a person who has not connected gets
// the refusal, with no request upstream. The agent's MCP client (the demo
// agent's go-sdk client) speaks each protocol version, 2025-11-25 and
// 2026-07-28, and the answer names the version the gateway agreed.
func TestPerUserSessionAgentActsAsTheSessionsOwner(t *testing.T) {
	g := startPerUserGateway(t)
	g.connect(t, "alice@example.com", "alice")
	g.connect(t, "bob@example.com", "bob")
	asked := 0
	ask := func(owner, prompt string) string {
		t.Helper()
		asked++
		token := createToken(t, g.c, fmt.Sprintf("chat-%s-%d", strings.Split(owner, "@")[0], asked), "--scope", "chat", "--owner", owner)
		cs, err := connectGo(t, g.sessionsURL, bearerClient(token, nil))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		_, created, err := callSessions(t, cs, "sessions", map[string]any{"verb": "create", "cwd": t.TempDir(), "prompt": prompt})
		if err != nil {
			t.Fatal(err)
		}
		id := created["sessionId"].(string)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			text, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id, "turns": 1, "full": true})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(text, "(end_turn)") {
				return text
			}
			callSessions(t, cs, "sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 5})
		}
		t.Fatalf("%s's session did not end its turn", owner)
		return ""
	}
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		prompt := "mcp: version " + version + " call remote whoami {}"
		for _, tc := range []struct{ owner, want string }{
			{"alice@example.com", "Result of whoami on remote (MCP " + version + "): whoami: alice"},
			{"bob@example.com", "Result of whoami on remote (MCP " + version + "): whoami: bob"},
		} {
			if got := ask(tc.owner, prompt); !strings.Contains(got, tc.want) {
				t.Errorf("%s's agent called whoami at %s:\n%s\nwant %q", tc.owner, version, got, tc.want)
			}
		}
		before, _ := g.up.Stats()
		got := ask("carol@example.com", prompt)
		if strings.Contains(got, "whoami:") || !strings.Contains(got, "Tool error from whoami on remote (MCP "+version+"): ") || !strings.Contains(got, "connect your account") {
			t.Errorf("carol's agent at %s, carol never connected:\n%s\nwant the refusal to connect", version, got)
		}
		if after, _ := g.up.Stats(); after != before {
			t.Errorf("carol's agent at %s reached the upstream (%d requests, was %d)", version, after, before)
		}
	}
}

// accountsField finds the connected accounts page's form fields.
var accountsField = regexp.MustCompile(`name="(upstream|token)" value="([^"]*)"`)

// A person signed in to the gateway sees the upstream accounts they
// connected on the connected accounts page, with no token, and disconnects
// one: it is revoked at the authorization server and their next call is
// refused, while another person's connection stays. A disconnection posted
// from another origin, with no origin, with a token not shown to this
// person, or from a browser not signed in, is refused and changes nothing.
func TestPerUserConnectedAccountsPage(t *testing.T) {
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
	g.connect(t, "alice", "alice")
	g.connect(t, "bob", "bob")
	alice := createToken(t, c, "alice-laptop", "--scope", "upstream:remote", "--owner", "alice")
	bob := createToken(t, c, "bob-laptop", "--scope", "upstream:remote", "--owner", "bob")

	b := newFormBrowser(t, base)
	resp, body := b.get(base + accounts.Path)
	if resp.StatusCode == http.StatusUnauthorized {
		resp, body = b.post(signinidp.LinkPath, url.Values{"secret": {signInLink(t, c, "alice", "upstream:remote")}})
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Connected accounts") || !strings.Contains(body, `class="upstream">remote<`) {
		t.Fatalf("alice's connected accounts page: %d\n%s", resp.StatusCode, body)
	}
	for _, s := range as.Secrets() {
		if strings.Contains(body, s) {
			t.Errorf("the page shows a token of the authorization server (%.8s…)", s)
		}
	}
	form := url.Values{}
	for _, m := range accountsField.FindAllStringSubmatch(body, -1) {
		form.Set(m[1], html.UnescapeString(m[2]))
	}
	if form.Get("token") == "" || form.Get("upstream") != "remote" {
		t.Fatalf("no disconnect form on the page:\n%s", body)
	}

	stranger := newFormBrowser(t, base)
	for _, tc := range []struct {
		name   string
		b      *formBrowser
		origin string
		form   url.Values
		status int
		word   string
	}{
		{"from another origin", b, "http://127.0.0.1:1", form, http.StatusForbidden, "press the button there"},
		{"with no origin", b, "", form, http.StatusForbidden, "press the button there"},
		{"with a token not shown to alice", b, base, url.Values{"upstream": {"remote"}, "token": {strings.Repeat("0", 64)}}, http.StatusForbidden, "not shown to the person"},
		{"a field twice", b, base, url.Values{"upstream": {"remote", "remote"}, "token": {form.Get("token")}}, http.StatusBadRequest, "once each"},
		{"from a browser not signed in", stranger, base, form, http.StatusForbidden, "not signed in"},
	} {
		tc.b.origin = tc.origin
		resp, body := tc.b.post(accounts.Path, tc.form)
		if resp.StatusCode != tc.status || !strings.Contains(body, tc.word) {
			t.Errorf("a disconnection %s: %d, want %d saying %q:\n%s", tc.name, resp.StatusCode, tc.status, tc.word, body)
		}
	}
	b.origin = base
	if got, _ := g.whoami(t, alice); got != "whoami: alice" {
		t.Fatalf("alice after the refused disconnections: %q", got)
	}
	if !hasAudit(c, map[string]any{"event": "refused", "reason": "cross_origin"}) {
		t.Error("no audit line for the disconnection from another origin")
	}

	revoked := len(as.Revocations())
	resp, body = b.post(accounts.Path, form)
	if resp.StatusCode != http.StatusOK || strings.Contains(body, `class="upstream">remote<`) || !strings.Contains(body, "no upstream account") {
		t.Fatalf("after alice disconnected: %d\n%s", resp.StatusCode, body)
	}
	if n := len(as.Revocations()) - revoked; n != 2 {
		t.Errorf("%d of alice's tokens revoked at the authorization server, want 2", n)
	}
	if got, isErr := g.whoami(t, alice); !isErr || !strings.Contains(got, "connect your account") {
		t.Errorf("alice after disconnecting: %q", got)
	}
	if got, _ := g.whoami(t, bob); got != "whoami: bob" {
		t.Errorf("bob after alice disconnected: %q", got)
	}
	if !hasAudit(c, map[string]any{"event": "upstream_disconnect", "owner": "alice", "upstream": "remote"}) {
		t.Error("no audit line for alice's disconnection")
	}
}
