package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

// loopbackCallback is a native client's redirect URI: a listener on
// 127.0.0.1 that takes the authorization response the browser brings.
func loopbackCallback(t *testing.T) (redirect string, got <-chan url.Values) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan url.Values, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case ch <- r.URL.Query():
		default:
		}
		fmt.Fprint(w, `<!DOCTYPE html><title>done</title><h1 id="done">You may close this page.</h1>`)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/callback", ch
}

// TestSigninIdPInChromium is the whole flow as a person sees it: go-sdk's
// client, given a bare URL, registers and opens headless Chromium on the
// gateway's authorization endpoint; the person signs in at the company IdP
// (panva's oidc-provider, OpenID Certified), whose groups claim the rules
// turn into scopes, and allows on the gateway's consent page, unticking
// one scope; the browser lands on the client's loopback callback with the
// code, state and iss, and the client calls a tool with its token.
func TestSigninIdPInChromium(t *testing.T) {
	b := newBrowser(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	idp := startIdP(t, base+signinidp.CallbackPath)
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
				scopes groups eng chat read
			}
		}
	}
}

%[1]s {
	zidane_mcp {
		sessions
		resource %[1]s/mcp
	}
}
`, base, idp.Issuer, idp.ClientID), "OIDC_CLIENT_SECRET="+idp.ClientSecret)

	redirect, callback := loopbackCallback(t)
	fetcher := func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
		b.do(t, "signing in at the IdP",
			chromedp.Navigate(args.URL),
			chromedp.WaitVisible(chromedp.CSS(`input[name="login"]`)),
			chromedp.SendKeys(chromedp.CSS(`input[name="login"]`), "alice"),
			chromedp.SendKeys(chromedp.CSS(`input[name="password"]`), idpPassword),
			chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
			chromedp.WaitReady(chromedp.CSS(`input[name="prompt"][value="consent"]`)),
			chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
			chromedp.WaitVisible(chromedp.CSS(`button[value="allow"]`)),
		)
		loc, text := b.page(t)
		if !strings.HasPrefix(loc, base+"/zidane/signin/authorize?") || !strings.Contains(text, "Alice Example") ||
			!strings.Contains(text, "e2e chromium client") || !strings.Contains(text, base+"/mcp") {
			t.Errorf("the consent page at %s says:\n%s", loc, text)
		}
		b.do(t, "allowing on the consent page, without chat",
			chromedp.Click(chromedp.CSS(`input[name="scope"][value="chat"]`)),
			chromedp.Click(chromedp.CSS(`button[value="allow"]`)),
			chromedp.WaitVisible(chromedp.ID("done")),
		)
		select {
		case q := <-callback:
			return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	h, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		DynamicClientRegistrationConfig: &auth.DynamicClientRegistrationConfig{
			Metadata: &oauthex.ClientRegistrationMetadata{
				ClientName:              "e2e chromium client",
				RedirectURIs:            []string{redirect},
				GrantTypes:              []string{"authorization_code", "refresh_token"},
				TokenEndpointAuthMethod: "none",
			},
		},
		AuthorizationCodeFetcher: fetcher,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-chromium", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: base + "/mcp", OAuthHandler: h, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect through the sign-in: %v", err)
	}
	defer cs.Close()
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("tools/list with the issued token: %v", err)
	}
	out, stderr, err := c.Run(t, "zidane", "token", "list", "--owner", "alice")
	if err != nil {
		t.Fatalf("token list: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, `"e2e chromium client"`) || !strings.Contains(out, " read ") || strings.Contains(out, "chat") {
		t.Errorf("alice's grant, with read and without chat, is not listed:\n%s", out)
	}
}
