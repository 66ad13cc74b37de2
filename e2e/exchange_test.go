package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/authserver"
	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// exchangeGateway is a gateway that signs people in through the company
// IdP (panva's oidc-provider), in front of an upstream (an oauthtest MCP
// server whose whoami says which user a token acts for) whose
// authorization server trusts that IdP; the upstream's credentials are
// per_user, each person's token had from their sign-in with oauth lines.
type exchangeGateway struct {
	c        *Caddy
	as       *oauthtest.AuthServer
	up       *oauthtest.MCPServer
	idp      *testIdP
	base     string
	mcpURL   string
	client   *manualClient
	callback <-chan url.Values
}

func startExchangeGateway(t *testing.T, oauth func(idp *testIdP, base string) string) *exchangeGateway {
	t.Helper()
	return startExchangeRoute(t, "broker remote", oauth)
}

// startExchangeRoute is startExchangeGateway with route the site's
// zidane_mcp route.
func startExchangeRoute(t *testing.T, route string, oauth func(idp *testIdP, base string) string) *exchangeGateway {
	t.Helper()
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	idp := startIdP(t, base+signinidp.CallbackPath)
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
	t.Cleanup(up.Close)
	secret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", secret, nil)
	// The upstream's authorization server trusts the company IdP: its ID
	// tokens for the gateway's client, and its ID-JAGs.
	as.TrustIdP(idp.Issuer, idp.Issuer+"/jwks", idp.ClientID)
	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
			registration dynamic
			oidc {
				issuer %[2]s
				client_id %[3]s
				client_secret {env.OIDC_CLIENT_SECRET}
				idp_scopes profile groups
				scopes groups eng mcp
				scopes groups sales mcp
			}
		}
		upstream remote %[4]s {
			oauth {
				credentials per_user
				client_id zidane-gateway
				client_secret ${REMOTE_SECRET}
%[5]s
			}
		}
	}
}

%[1]s {
	zidane_mcp {
		%[6]s
		resource %[1]s/mcp
	}
}
`, base, idp.Issuer, idp.ClientID, up.URL, oauth(idp, base), route), "OIDC_CLIENT_SECRET="+idp.ClientSecret, "REMOTE_SECRET="+secret,
		"IDP_CLIENT_SECRET="+idp.ClientSecret, "UPSTREAM_AS="+as.URL, "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))
	redirect, callback := loopbackCallback(t)
	m := &manualClient{t: t, base: base, redirect: redirect}
	body := `{"client_name":"laptop","redirect_uris":["` + redirect + `"],"token_endpoint_auth_method":"none"}`
	resp, err := http.Post(base+authserver.RegisterPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		ClientID string `json:"client_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&reg); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("registration: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	m.id = reg.ClientID
	return &exchangeGateway{c: c, as: as, up: up, idp: idp, base: base, mcpURL: base + "/mcp", client: m, callback: callback}
}

// grant signs login in to the gateway in a browser of its own, through
// the IdP, consents for the client, and returns the grant's tokens.
func (g *exchangeGateway) grant(t *testing.T, login string) map[string]any {
	t.Helper()
	b := newBrowser(t)
	verifier := randomHex(32)
	q := g.client.authorizeQuery(verifier, g.mcpURL)
	q.Set("scope", "mcp")
	b.do(t, "opening the authorization URL", chromedp.Navigate(g.base+authserver.AuthorizePath+"?"+q.Encode()))
	b.idpLogin(t, login)
	b.do(t, "allowing on the consent page", chromedp.WaitVisible(chromedp.CSS(`button[value="allow"]`)),
		chromedp.Click(chromedp.CSS(`button[value="allow"]`)), chromedp.WaitVisible(chromedp.ID("done")))
	var back url.Values
	select {
	case back = <-g.callback:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s's code never reached the client's callback", login)
	}
	status, tok := g.client.redeem(back.Get("code"), verifier, g.mcpURL)
	if status != http.StatusOK {
		t.Fatalf("redeeming %s's code: %d %v", login, status, tok)
	}
	return tok
}

// whoami calls the upstream's whoami on the broker route with token.
func (g *exchangeGateway) whoami(t *testing.T, token string) (string, bool) {
	t.Helper()
	return (&perUserGateway{brokerURL: g.mcpURL}).whoami(t, token)
}

// keptSignIns counts the people's sign-ins the gateway keeps in storage.
func (g *exchangeGateway) keptSignIns(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(g.c.DataDir, filepath.FromSlash(signinidp.TokenPrefix)))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestExchangeGivesEachPersonTheirUpstreamToken: alice and bob sign in to
// the gateway through the company IdP (their only browser step) and call
// a per_user upstream whose authorization server trusts that IdP; each
// call runs upstream as its caller, by RFC 8693 token exchange of the
// person's ID token and by an ID-JAG (SEP-990) that the IdP issues for
// the person, with no authorization request at the upstream's server.
// Revoking alice's grant ends her access and deletes her connection and
// her kept sign-in, and leaves bob's; no token reaches the log.
func TestExchangeGivesEachPersonTheirUpstreamToken(t *testing.T) {
	for _, tc := range []struct {
		name  string
		oauth func(idp *testIdP, base string) string
		grant string // at the upstream's authorization server
	}{
		{"token_exchange", func(*testIdP, string) string { return "grant token_exchange\nauthorization_server {$UPSTREAM_AS}" }, oauthtest.GrantTokenExchange},
		{"cross_app_access", func(idp *testIdP, _ string) string {
			return "grant cross_app_access\nauthorization_server {$UPSTREAM_AS}\nidp_issuer " + idp.Issuer + "\nidp_client_id " + idp.ClientID + "\nidp_client_secret ${IDP_CLIENT_SECRET}"
		}, oauthtest.GrantJWTBearer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startExchangeGateway(t, tc.oauth)
			alice, bob := g.grant(t, "alice"), g.grant(t, "bob")
			if n := g.keptSignIns(t); n != 2 {
				t.Fatalf("%d sign-ins kept, want alice's and bob's", n)
			}
			for _, call := range []struct {
				tok  map[string]any
				want string
			}{{alice, "whoami: alice"}, {bob, "whoami: bob"}, {alice, "whoami: alice"}} {
				if got, isErr := g.whoami(t, call.tok["access_token"].(string)); isErr || got != call.want {
					t.Fatalf("got %q (error %v), want %q", got, isErr, call.want)
				}
			}
			if n := len(g.as.AuthorizationRequests()); n != 0 {
				t.Errorf("%d authorization requests at the upstream's server: a browser step", n)
			}
			var grants []string
			for _, r := range g.as.TokenRequests() {
				grants = append(grants, r.GrantType)
			}
			if !slices.Equal(grants, []string{tc.grant, tc.grant}) || !slices.Equal(g.as.ExchangedUsers(), []string{"alice", "bob"}) {
				t.Errorf("token requests %v for %v, want one %s for alice then bob", grants, g.as.ExchangedUsers(), tc.grant)
			}

			// Alice signs out (RFC 7009 with her refresh token): her last
			// grant is revoked.
			resp, err := http.PostForm(g.base+authserver.RevokePath, url.Values{"token": {alice["refresh_token"].(string)}, "client_id": {g.client.id}})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("revoke: %d", resp.StatusCode)
			}
			before := g.up.Credentialed()
			if got, _ := listToolsStatus(t, g.mcpURL, alice["access_token"].(string)); got != http.StatusUnauthorized {
				t.Errorf("alice's access token after her grant's revocation: %d", got)
			}
			waitFor(t, 10*time.Second, func() bool {
				return hasAudit(g.c, map[string]any{"event": "upstream_disconnect", "owner": "alice", "upstream": "remote"}) && g.keptSignIns(t) == 1
			})
			if after := g.up.Credentialed(); after != before {
				t.Errorf("alice's refused call reached the upstream with a credential")
			}
			list, stderr, err := g.c.Run(t, "zidane", "connections", "list")
			if err != nil || strings.Contains(list, "alice") || !strings.Contains(list, "bob") {
				t.Errorf("connections after alice's revocation: %v\n%s%s", err, list, stderr)
			}
			if got, isErr := g.whoami(t, bob["access_token"].(string)); isErr || got != "whoami: bob" {
				t.Errorf("bob after alice's revocation: %q (error %v)", got, isErr)
			}

			logs := g.c.Logs()
			secrets := g.as.Secrets()
			for _, r := range g.as.TokenRequests() {
				secrets = append(secrets, r.SubjectToken, r.Assertion)
			}
			for _, s := range secrets {
				if s != "" && strings.Contains(logs+list, s) {
					sum := sha256.Sum256([]byte(s))
					t.Errorf("a token (sha256 %x) is in the log or the listing", sum[:6])
				}
			}
		})
	}
}

// TestExchangeFallback: a person the gateway holds no sign-in token of
// (carol, whose token an operator made, never signed in through the IdP)
// gets, on a per_user token_exchange upstream, a refusal that says to
// sign in through the company IdP (fallback none), or the connect link
// (fallback connect), through which she connects her account in her
// browser, and her next call runs as her. Neither call before reaches
// the upstream with any credential, nor asks its authorization server
// for a token.
func TestExchangeFallback(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		g := startExchangeGateway(t, func(*testIdP, string) string { return "grant token_exchange\nauthorization_server {$UPSTREAM_AS}" })
		carol := createToken(t, g.c, "carol-laptop", "--scope", "mcp", "--owner", "carol")
		text, isErr := g.whoami(t, carol)
		if !isErr || !strings.Contains(text, "sign in to the gateway again") || !strings.Contains(text, "could not be had") {
			t.Errorf("carol without a sign-in token: %q (error %v), want a refusal saying to sign in", text, isErr)
		}
		if n := g.up.Credentialed(); n != 0 {
			t.Errorf("%d requests reached the upstream with a credential", n)
		}
		if n := len(g.as.TokenRequests()); n != 0 {
			t.Errorf("%d token requests at the upstream's server", n)
		}
	})
	t.Run("connect", func(t *testing.T) {
		g := startExchangeGateway(t, func(_ *testIdP, base string) string {
			return "grant token_exchange\nauthorization_server {$UPSTREAM_AS}\nfallback connect\nredirect_url " + base + "/zidane/oauth/callback/remote"
		})
		carol := createToken(t, g.c, "carol-laptop", "--scope", "mcp", "--owner", "carol")
		text, isErr := g.whoami(t, carol)
		link := regexp.MustCompile(regexp.QuoteMeta(g.base) + `/zidane/connect/zcl_[A-Za-z0-9_-]{43}`).FindString(text)
		if !isErr || link == "" {
			t.Fatalf("carol without a sign-in token: %q (error %v), want the connect link", text, isErr)
		}
		if n := g.up.Credentialed(); n != 0 {
			t.Errorf("%d requests reached the upstream with a credential", n)
		}
		b := newFormBrowser(t, g.base)
		b.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		if resp, body := b.post(signinidp.LinkPath, url.Values{"secret": {signInLink(t, g.c, "carol", "mcp")}}); resp.StatusCode != http.StatusOK {
			t.Fatalf("carol's sign-in: %d %s", resp.StatusCode, body)
		}
		resp, _ := b.post(strings.TrimPrefix(link, g.base), url.Values{"connect": {"1"}})
		authURL := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(authURL, g.as.URL+"/authorize?") {
			t.Fatalf("the press: %d to %q", resp.StatusCode, authURL)
		}
		pg := &perUserGateway{callback: g.base + "/zidane/oauth/callback/remote"}
		q := pg.signIn(t, authURL, "carol-upstream")
		if resp, body := b.get(pg.callback + "?" + q.Encode()); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Go back to your MCP client") {
			t.Fatalf("carol's callback: %d %s", resp.StatusCode, body)
		}
		if got, isErr := g.whoami(t, carol); isErr || got != "whoami: carol-upstream" {
			t.Errorf("carol once connected: %q (error %v)", got, isErr)
		}
	})
}

// TestExchangeOnTheAggregatedRoute: on the aggregated route, the same
// upstream's tools run as each person, with the token their sign-in gave
// by exchange: go-sdk's client of alice and of bob, each with the grant
// of their own sign-in through the IdP. A person with no sign-in to
// exchange gets a tool error saying to sign in again (it said "could not
// be reached … try again later" before), and nothing reaches the upstream.
func TestExchangeOnTheAggregatedRoute(t *testing.T) {
	g := startExchangeRoute(t, "aggregate remote", func(*testIdP, string) string {
		return "grant token_exchange\nauthorization_server {$UPSTREAM_AS}"
	})
	alice, bob := g.grant(t, "alice"), g.grant(t, "bob")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(who string, tok map[string]any) *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: who + "-client", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: g.mcpURL, MaxRetries: -1, HTTPClient: bearerClient(tok["access_token"].(string), nil)}, nil)
		if err != nil {
			t.Fatalf("%s connects: %v", who, err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	pa, pb := connect("alice", alice), connect("bob", bob)
	for _, step := range []struct {
		cs   *mcp.ClientSession
		want string
	}{{pa, "whoami: alice"}, {pb, "whoami: bob"}, {pa, "whoami: alice"}} {
		res, err := step.cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_remote_whoami", Arguments: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		var text string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
		if res.IsError || text != step.want {
			t.Errorf("got %q (error %v), want %q", text, res.IsError, step.want)
		}
	}
	if n := len(g.as.AuthorizationRequests()); n != 0 {
		t.Errorf("%d authorization requests at the upstream's server: a browser step", n)
	}
	if got := g.as.ExchangedUsers(); !slices.Equal(got, []string{"alice", "bob"}) {
		t.Errorf("tokens exchanged for %v, want alice then bob", got)
	}

	// carol, whose token an operator made, has no sign-in to exchange:
	// her call is refused with what to do, and reaches no one upstream.
	before := g.up.Credentialed()
	pc := connect("carol", map[string]any{"access_token": createToken(t, g.c, "carol-laptop", "--scope", "mcp", "--owner", "carol")})
	res, err := pc.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_remote_whoami", Arguments: map[string]any{}})
	var text string
	if err == nil {
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
	}
	if err != nil || !res.IsError || !strings.Contains(text, "sign in to the gateway again") || strings.Contains(text, "could not be reached") {
		t.Errorf("carol's call: %v %q; want a tool error saying to sign in again", err, text)
	}
	if after := g.up.Credentialed(); after != before {
		t.Errorf("carol's call reached the upstream with a credential")
	}
}
