package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/authserver"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// TestSigninOffersTheUpstreamScope: at a broker site, upstream:<name> is
// the scope that grants its upstream, so the site's RFC 9728 document
// lists it and its sign-in grants it: a person whose scopes are
// upstream:remote (what an operator gives the people of a per_user
// upstream) signs in with a client that asks no scope, or asks
// upstream:remote by name, and the grant reaches the route (the call
// answers with the person's connect link, not 403). A scope the site
// knows nothing of is still refused.
func TestSigninOffersTheUpstreamScope(t *testing.T) {
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
	t.Cleanup(up.Close)
	secret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", secret, nil)
	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	aggSite := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
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
		upstream plain %[2]s {
			scope plain:all
		}
	}
}

%[1]s {
	zidane_mcp {
		broker remote
		resource %[1]s/mcp
	}
}

%[3]s {
	zidane_mcp {
		aggregate plain
		resource %[3]s/mcp
	}
}
`, base, up.URL, aggSite), "REMOTE_SECRET="+secret, "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))

	for _, tc := range []struct {
		site string
		want []string
	}{{base, []string{"upstream:remote"}}, {aggSite, []string{"upstream:plain", "plain:all"}}} {
		resp, err := shortClient.Get(tc.site + "/.well-known/oauth-protected-resource/mcp")
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Scopes []string `json:"scopes_supported"`
		}
		json.NewDecoder(resp.Body).Decode(&meta)
		resp.Body.Close()
		for _, w := range tc.want {
			if !slices.Contains(meta.Scopes, w) {
				t.Errorf("%s: scopes_supported %v lack %s, a scope that grants its upstream", tc.site, meta.Scopes, w)
			}
		}
	}

	m := registerClient(t, base)
	for _, asked := range []string{"", "upstream:remote"} {
		secret := signInLink(t, c, "gina", "upstream:remote")
		b := newFormBrowser(t, base)
		verifier := randomHex(32)
		q := m.authorizeQuery(verifier, base+"/mcp")
		if asked != "" {
			q.Set("scope", asked)
		}
		resp, body := b.get(base + authserver.AuthorizePath + "?" + q.Encode())
		if resp.StatusCode == http.StatusUnauthorized {
			resp, body = b.post("/zidane/signin/link", url.Values{"secret": {secret}})
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "upstream:remote") {
			t.Fatalf("scope %q asked: the authorization answered %d, Location %q, want the consent page offering upstream:remote:\n%s",
				asked, resp.StatusCode, resp.Header.Get("Location"), body)
		}
		back := b.consent(body)
		status, tok := m.redeem(back.Query().Get("code"), verifier, base+"/mcp")
		if status != http.StatusOK || !strings.Contains(fmt.Sprint(tok["scope"]), "upstream:remote") {
			t.Fatalf("scope %q asked: the code redeemed: %d %v", asked, status, tok)
		}
		a := post(t, base+"/mcp", tok["access_token"].(string), `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`,
			"Mcp-Protocol-Version", "2025-11-25")
		if a.status != http.StatusOK || !strings.Contains(a.body, "/zidane/connect/zcl_") {
			t.Errorf("scope %q asked: gina's call with her grant: %d %s, want her connect link", asked, a.status, a.body)
		}
	}

	q := m.authorizeQuery(randomHex(32), base+"/mcp")
	q.Set("scope", "upstream:other")
	b := newFormBrowser(t, base)
	b.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, _ := b.get(base + authserver.AuthorizePath + "?" + q.Encode())
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || loc == nil || loc.Query().Get("error") != "invalid_scope" {
		t.Errorf("scope upstream:other asked: %d, Location %q, want invalid_scope", resp.StatusCode, resp.Header.Get("Location"))
	}
}
