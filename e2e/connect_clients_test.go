package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// connectSite is a gateway that signs people in through the company IdP
// (panva's oidc-provider) and serves a broker route (brokerURL) and an
// aggregated route (aggregateURL, on a site of its own) to remote, a real
// OAuth-protected MCP server whose whoami tool says which of its users a
// token acts for, with credentials per_user. Its authorization server asks
// who signs in (a page), so that the browser picks the upstream user.
type connectSite struct {
	*perUserGateway
	base         string
	aggregateURL string
	// browsers are the people's headless Chromium, each signed in to the
	// gateway as its person once.
	mu       sync.Mutex
	browsers map[string]*personBrowser
	// t is the test the browsers live as long as.
	t *testing.T
}

type personBrowser struct {
	b        *browserSession
	signedIn bool
}

func startConnectSite(t *testing.T) *connectSite {
	t.Helper()
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{LoginPage: true})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
	t.Cleanup(up.Close)
	secret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", secret, nil)
	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	aggregate := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	idp := startIdP(t, base+signinidp.CallbackPath)
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
			oidc {
				issuer %[2]s
				client_id %[3]s
				client_secret {env.OIDC_CLIENT_SECRET}
				idp_scopes profile groups
				scopes groups eng upstream:remote
				scopes groups sales upstream:remote
			}
		}
		upstream remote %[4]s {
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
		rate_limit {
			per_token 1000/s 1000
		}
	}
}

%[5]s {
	zidane_mcp {
		aggregate remote
		resource %[5]s/mcp
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, base, idp.Issuer, idp.ClientID, up.URL, aggregate), "OIDC_CLIENT_SECRET="+idp.ClientSecret, "REMOTE_SECRET="+secret,
		"ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))
	return &connectSite{base: base, aggregateURL: aggregate + "/mcp", browsers: map[string]*personBrowser{}, t: t,
		perUserGateway: &perUserGateway{c: c, as: as, up: up, brokerURL: base + "/mcp", callback: base + "/zidane/oauth/callback/remote"}}
}

// connectInChromium is the person's part of a connect link, in who's
// headless Chromium: the link's page (signing in at the IdP as who the
// first time), its button, the upstream's login as the upstream user
// upstreamUser, and the gateway's last page, which says the account is
// connected.
func (s *connectSite) connectInChromium(t *testing.T, link, who, upstreamUser string) {
	t.Helper()
	if !strings.HasPrefix(link, s.base+"/zidane/connect/zcl_") {
		t.Fatalf("the connect link %q is not on the gateway's site", link)
	}
	s.mu.Lock()
	pb := s.browsers[who]
	if pb == nil {
		pb = &personBrowser{b: newBrowser(s.t)}
		s.browsers[who] = pb
	}
	s.mu.Unlock()
	b := pb.b
	b.do(t, "opening the connect link", chromedp.Navigate(link))
	if !pb.signedIn {
		b.idpLogin(t, who)
		pb.signedIn = true
	}
	b.do(t, "reaching the link's page", chromedp.WaitVisible(chromedp.ID("connect")))
	if _, text := b.page(t); !strings.Contains(text, "remote") || !strings.Contains(text, who) {
		t.Errorf("the link's page says:\n%s", text)
	}
	b.do(t, "pressing Connect", chromedp.Click(chromedp.ID("connect")), chromedp.WaitVisible(chromedp.ID("user")))
	b.do(t, "signing in at the upstream as "+upstreamUser,
		chromedp.SendKeys(chromedp.ID("user"), upstreamUser),
		chromedp.Click(chromedp.ID("approve")),
		chromedp.WaitVisible(chromedp.ID("title")))
	if loc, text := b.page(t); !strings.HasPrefix(loc, s.base+"/") || !strings.Contains(text, "is connected") || !strings.Contains(text, "Go back to your MCP client") {
		t.Fatalf("the last page, at %s, says:\n%s", loc, text)
	}
}

// revokeAll ends every person's connection, so that the next client meets
// people who have not connected.
func (s *connectSite) revokeAll(t *testing.T) {
	t.Helper()
	if st := s.admin(t, "/zidane/connections/revoke", map[string]string{"upstream": "remote"}, nil); st != 200 {
		t.Fatalf("revoking the connections: HTTP %d", st)
	}
}

// upstreamBearers is how many requests reached the upstream with a token.
func (s *connectSite) upstreamRequests() int {
	n, _ := s.up.Stats()
	return n
}

// TestPerUserClientsFollowTheElicitation: through the built gateway, real
// MCP clients of two people, alice and bob, meet a per_user upstream
// before either has connected their account there: each client connects
// and lists (an empty list) without the upstream being reached with any
// credential, its first tool call carries the connect link by URL
// elicitation, the person follows it in headless Chromium (the company
// IdP's sign-in, the link's page, the upstream's own login), and the
// client's retry runs at the upstream as that person: alice's calls as
// alice, bob's as bob. go-sdk's client at 2026-07-28 (input_required,
// retried with the requestState), go-sdk's at 2025-11-25 (-32042, then
// notifications/elicitation/complete on the session's GET stream), and
// the TypeScript SDK's (2025-11-25, as its example application does), the
// last on the broker route and on the aggregated route, where the list
// before connecting holds the upstream's connect tool alone and the
// elicitation's completion also changes the list.
func TestPerUserClientsFollowTheElicitation(t *testing.T) {
	s := startConnectSite(t)
	tokens := map[string]string{}
	for _, who := range []string{"alice", "bob"} {
		tokens[who] = createToken(t, s.c, who+"-laptop", "--scope", "upstream:remote", "--owner", who)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	urlCaps := &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}
	whoami := func(t *testing.T, res *mcp.CallToolResult, err error, who string) {
		t.Helper()
		if err != nil || res.IsError || len(res.Content) != 1 {
			t.Fatalf("%s's call: %v %+v", who, err, res)
		}
		if tc, ok := res.Content[0].(*mcp.TextContent); !ok || tc.Text != "whoami: "+who {
			t.Fatalf("%s's call ran as %+v", who, res.Content[0])
		}
	}
	before := func(t *testing.T, cs *mcp.ClientSession, start int) {
		t.Helper()
		if res, err := cs.ListTools(ctx, nil); err != nil || len(res.Tools) != 0 {
			t.Fatalf("the tools before connecting: %v %+v", err, res)
		}
		if n := s.upstreamRequests(); n != start {
			t.Fatalf("the upstream got %d requests from a person not connected", n-start)
		}
	}

	t.Run("go-sdk 2026-07-28", func(t *testing.T) {
		defer s.revokeAll(t)
		for _, who := range []string{"alice", "bob"} {
			// The elicitation handler hands the link to the test, which
			// drives the browser, and answers accept once it is done.
			links, accepted := make(chan string, 1), make(chan struct{})
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-connect", Version: "1"}, &mcp.ClientOptions{
				Capabilities: urlCaps,
				ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					if r.Params.Mode != "url" {
						return &mcp.ElicitResult{Action: "decline"}, nil
					}
					links <- r.Params.URL
					select {
					case <-accepted:
						return &mcp.ElicitResult{Action: "accept"}, nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				},
			}).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.brokerURL, MaxRetries: -1, HTTPClient: bearerClient(tokens[who], nil)}, nil)
			if err != nil {
				t.Fatalf("%s's handshake before connecting: %v", who, err)
			}
			if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
				t.Errorf("protocol version %q", v)
			}
			start := s.upstreamRequests()
			before(t, cs, start)
			type answer struct {
				res *mcp.CallToolResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
				done <- answer{res, err}
			}()
			select {
			case link := <-links:
				if n := s.upstreamRequests(); n != start {
					t.Fatalf("the upstream got %d requests from a person not connected", n-start)
				}
				s.connectInChromium(t, link, who, who)
				close(accepted)
			case a := <-done:
				t.Fatalf("%s's call was answered without an elicitation: %v %+v", who, a.err, a.res)
			}
			a := <-done
			whoami(t, a.res, a.err, who)
			if res, err := cs.ListTools(ctx, nil); err != nil || len(res.Tools) == 0 {
				t.Fatalf("the tools once connected: %v %+v", err, res)
			}
			cs.Close()
		}
	})

	t.Run("go-sdk 2025-11-25", func(t *testing.T) {
		defer s.revokeAll(t)
		for _, who := range []string{"alice", "bob"} {
			completed := make(chan string, 8)
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-connect", Version: "1"}, &mcp.ClientOptions{
				Capabilities: urlCaps,
				ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					return &mcp.ElicitResult{Action: "decline"}, nil
				},
				ElicitationCompleteHandler: func(_ context.Context, r *mcp.ElicitationCompleteNotificationRequest) {
					completed <- r.Params.ElicitationID
				},
			}).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.brokerURL, MaxRetries: -1, HTTPClient: bearerClient(tokens[who], nil)},
				&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
			if err != nil {
				t.Fatalf("%s's handshake before connecting: %v", who, err)
			}
			start := s.upstreamRequests()
			before(t, cs, start)
			_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
			var rpcErr *jsonrpc.Error
			var data struct {
				Elicitations []*mcp.ElicitParams `json:"elicitations"`
			}
			if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired || json.Unmarshal(rpcErr.Data, &data) != nil || len(data.Elicitations) != 1 {
				t.Fatalf("%s's first call: %v", who, err)
			}
			s.connectInChromium(t, data.Elicitations[0].URL, who, who)
			// The stream tells of every live elicitation of the person's
			// at the upstream (each a call that asked); this call's is
			// among them.
			for got := ""; got != data.Elicitations[0].ElicitationID; {
				select {
				case got = <-completed:
				case <-ctx.Done():
					t.Fatalf("no notifications/elicitation/complete for %s on the session's GET stream", data.Elicitations[0].ElicitationID)
				}
			}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
			whoami(t, res, err, who)
			cs.Close()
		}
	})

	// The TypeScript SDK's client, on the broker route and on the
	// aggregated route, where a person not connected lists the upstream's
	// connect tool alone and calls its tools by their prefixed names.
	for _, route := range []struct {
		name, url, tool string
		before          []any
		after           float64
	}{
		{"TypeScript SDK", s.brokerURL, "whoami", []any{}, 3},
		{"TypeScript SDK aggregated", s.aggregateURL, "mcp_remote_whoami", []any{"mcp_remote_connect_account"}, 3},
	} {
		t.Run(route.name, func(t *testing.T) {
			defer s.revokeAll(t)
			for _, who := range []string{"alice", "bob"} {
				start := s.upstreamRequests()
				ts := startLineScript(t, ctx, false, "tsconnect.mjs", "--url", route.url, "--token", tokens[who], "--tool", route.tool)
				if got := ts.line(t); got["tools"] != float64(len(route.before)) || !reflect.DeepEqual(got["names"], route.before) {
					t.Fatalf("%s's tools before connecting: %v, want %v", who, got, route.before)
				}
				if n := s.upstreamRequests(); n != start {
					t.Fatalf("the upstream got %d requests from a person not connected", n-start)
				}
				link, _ := ts.line(t)["elicit"].(string)
				if n := s.upstreamRequests(); n != start {
					t.Fatalf("%s's call before connecting reached the upstream (%d requests)", who, n-start)
				}
				s.connectInChromium(t, link, who, who)
				got := ts.line(t)
				if got["tool"] != "whoami: "+who || got["isError"] != false || got["listChanged"] != true || got["toolsAfter"] != route.after {
					t.Errorf("the TypeScript client of %s ended with %v", who, got)
				}
				if err := ts.wait(); err != nil {
					t.Errorf("tsconnect.mjs: %v\nstderr:\n%s", err, ts.stderr.String())
				}
			}
		})
	}

	for _, sec := range s.as.Secrets() {
		if strings.Contains(s.c.Logs(), sec) {
			t.Errorf("a token of the upstream's authorization server (%.8s…) is in the log", sec)
		}
	}
}
