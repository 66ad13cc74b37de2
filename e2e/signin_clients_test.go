package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

// signinAccessLifetime is the access tokens' lifetime in
// TestSigninClientsInChromium: short, so that each client refreshes within
// the test.
const signinAccessLifetime = 5 * time.Second

// consentInChromium is the person's part of a sign-in, in headless
// Chromium: the authorization URL, the company IdP's login and consent,
// and Allow on the gateway's consent page, which must name the client,
// the resource and the person, and warn that the grant goes to a loopback
// redirect URI; the browser then lands on the client's
// loopback callback, whose page has the id "done".
func consentInChromium(t *testing.T, b *browserSession, authURL, base, client string) {
	t.Helper()
	b.do(t, "opening the authorization URL", chromedp.Navigate(authURL))
	b.idpLogin(t, "alice")
	b.do(t, "reaching the consent page", chromedp.WaitVisible(chromedp.CSS(`button[value="allow"]`)))
	loc, text := b.page(t)
	if !strings.HasPrefix(loc, base+"/") || !strings.Contains(text, "Alice Example") || !strings.Contains(text, client) ||
		!strings.Contains(text, base+"/mcp") || !strings.Contains(text, "on your own computer") {
		t.Errorf("the consent page at %s says:\n%s", loc, text)
	}
	b.do(t, "allowing", chromedp.Click(chromedp.CSS(`button[value="allow"]`)), chromedp.WaitVisible(chromedp.ID("done")))
}

// TestSigninClientsInChromium: real MCP clients, each given a bare URL,
// go through the whole flow to tool calls, the person's steps in headless
// Chromium (the company IdP, panva's oidc-provider, then the gateway's
// consent page): go-sdk's client at its default protocol version
// (2026-07-28) and pinned to 2025-11-25, and the TypeScript SDK's client
// serving its own loopback redirect URI. Each registers itself, checks
// the state and iss of the authorization response, calls a tool through
// a guard site, and keeps calling after its access token expired, the SDK
// refreshing the grant.
func TestSigninClientsInChromium(t *testing.T) {
	// go-sdk's everything server without sessions, which speaks both
	// protocol versions.
	upstream := startStatelessEverythingServer(t)
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	idp := startIdP(t, base+signinidp.CallbackPath)
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
			registration dynamic
			access_lifetime %[4]s
			oidc {
				issuer %[2]s
				client_id %[3]s
				client_secret {env.OIDC_CLIENT_SECRET}
				idp_scopes profile groups
				scopes groups eng mcp
			}
		}
	}
}

%[1]s {
	zidane_mcp {
		guard
		resource %[1]s/mcp
	}
	reverse_proxy %[5]s
}
`, base, idp.Issuer, idp.ClientID, signinAccessLifetime, up), "OIDC_CLIENT_SECRET="+idp.ClientSecret)

	for _, tc := range []struct{ name, pin, want string }{
		{"go-sdk default version", "", "2026-07-28"},
		{"go-sdk pinned 2025-11-25", "2025-11-25", "2025-11-25"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBrowser(t)
			client := "e2e " + tc.name
			redirect, callback := loopbackCallback(t)
			fetcher := func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
				consentInChromium(t, b, args.URL, base, client)
				select {
				case q := <-callback:
					if q.Get("iss") != base {
						t.Errorf("the authorization response's iss is %q, want %q", q.Get("iss"), base)
					}
					return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			h, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
				DynamicClientRegistrationConfig: &auth.DynamicClientRegistrationConfig{
					Metadata: &oauthex.ClientRegistrationMetadata{
						ClientName:              client,
						RedirectURIs:            []string{redirect},
						GrantTypes:              []string{"authorization_code", "refresh_token"},
						TokenEndpointAuthMethod: "none",
					},
				},
				RedirectURL:              redirect,
				RequestRefreshToken:      true,
				AuthorizationCodeFetcher: fetcher,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			from := c.LogSize()
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-chromium", Version: "1"}, nil).Connect(ctx,
				&mcp.StreamableClientTransport{Endpoint: base + "/mcp", OAuthHandler: h, MaxRetries: -1},
				&mcp.ClientSessionOptions{ProtocolVersion: tc.pin})
			if err != nil {
				t.Fatalf("connect through the sign-in: %v", err)
			}
			defer cs.Close()
			if got := cs.InitializeResult().ProtocolVersion; got != tc.want {
				t.Errorf("protocol version %q, want %q", got, tc.want)
			}
			if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"}); err != nil || res.IsError {
				t.Fatalf("tool call with the issued token: %v %+v", err, res)
			}
			// Calls until the SDK has refreshed the grant, one a second,
			// for at most four access token lifetimes (x/oauth2, under
			// go-sdk, takes a token for expired 10s early, so it refreshes
			// a 5s one before its next request).
			refreshed := false
			for i := 0; i < 4*int(signinAccessLifetime/time.Second) && !refreshed; i++ {
				time.Sleep(time.Second)
				if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"}); err != nil || res.IsError {
					t.Fatalf("tool call %d: %v %+v", i, err, res)
				}
				refreshed = strings.Contains(c.Logs()[from:], `"event":"grant_refreshed"`)
			}
			if !refreshed {
				t.Errorf("no refresh of the grant in %d calls over its access tokens' lifetime", 4*int(signinAccessLifetime/time.Second))
			}
			if out := listGrants(t, c, "--owner", "alice"); !strings.Contains(out, `"`+client+`"`) {
				t.Errorf("alice's grant to %q is not listed:\n%s", client, out)
			}
		})
	}

	t.Run("TypeScript SDK", func(t *testing.T) {
		b := newBrowser(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ts := startLineScript(t, ctx, false, "tsbrowser.mjs", "--url", base+"/mcp", "--issuer", base, "--tool", "test_simple_text")
		authURL, _ := ts.line(t)["authorize"].(string)
		if !strings.HasPrefix(authURL, base+"/") {
			t.Fatalf("the client was sent to %q, not the gateway", authURL)
		}
		consentInChromium(t, b, authURL, base, "e2e ts browser client")
		got := ts.line(t)
		if got["tool"] == "" || got["again"] == "" || got["token_type"] != "Bearer" || got["scope"] != "mcp" || got["refreshed"] != true {
			t.Errorf("the TypeScript client ended with %v", got)
		}
		if out := listGrants(t, c, "--owner", "alice"); !strings.Contains(out, `"e2e ts browser client"`) {
			t.Errorf("alice's grant to the TypeScript client is not listed:\n%s", out)
		}
	})
}
