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
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// TestPerUserAggregate: a per_user upstream on the aggregated route, with
// two people and go-sdk's client at 2025-11-25 and 2026-07-28. Before
// connecting, a person's list shows the upstream's connect tool and not
// its tools, and a call reaches nothing upstream; the call's answer is
// the connect link (the -32042 error at 2025-11-25, an input_required URL
// elicitation at 2026-07-28), which the person follows in their own
// signed-in browser; then the call goes on (2026-07-28: the client's
// retry; 2025-11-25: after notifications/elicitation/complete and
// tools/list_changed), the list shows the upstream's tools, and each
// person's call runs upstream as that person. A revoked connection ends
// the person's access at once, and no one else's.
func TestPerUserAggregate(t *testing.T) {
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
		aggregate remote
		resource %[1]s/mcp
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, base, up.URL), "REMOTE_SECRET="+secret, "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))
	g := &perUserGateway{c: c, as: as, up: up, callback: base + "/zidane/oauth/callback/remote"}

	// follow connects who's account through the connect link, in their
	// own browser signed in to the gateway.
	follow := func(t *testing.T, who, link string) {
		t.Helper()
		if !strings.HasPrefix(link, base+"/zidane/connect/zcl_") {
			t.Fatalf("%s's link: %q", who, link)
		}
		b := newFormBrowser(t, base)
		b.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		if resp, body := b.post("/zidane/signin/link", url.Values{"secret": {signInLink(t, c, who, "upstream:remote")}}); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s's sign-in: %d %s", who, resp.StatusCode, body)
		}
		resp, _ := b.post(strings.TrimPrefix(link, base), url.Values{"connect": {"1"}})
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("%s's press: %d", who, resp.StatusCode)
		}
		q := g.signIn(t, resp.Header.Get("Location"), who)
		if resp, body := b.get(g.callback + "?" + q.Encode()); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s's callback: %d %s", who, resp.StatusCode, body)
		}
	}

	type person struct {
		cs       *mcp.ClientSession
		links    chan string // URL elicitations the client was asked to follow
		complete chan string // elicitations the gateway said are complete
		changed  chan struct{}
		decline  atomic.Bool // the person declines the next links
	}
	open := func(t *testing.T, ctx context.Context, who, version string) *person {
		t.Helper()
		token := createToken(t, c, who+"-"+version, "--scope", "upstream:remote", "--owner", who)
		p := &person{links: make(chan string, 4), complete: make(chan string, 4), changed: make(chan struct{}, 16)}
		client := mcp.NewClient(&mcp.Implementation{Name: who + "-client", Version: "1"}, &mcp.ClientOptions{
			Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
			ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				if req.Params.Mode != "url" {
					return nil, fmt.Errorf("a %q elicitation", req.Params.Mode)
				}
				p.links <- req.Params.URL
				if p.decline.Load() {
					return &mcp.ElicitResult{Action: "decline"}, nil
				}
				return &mcp.ElicitResult{Action: "accept"}, nil
			},
			ElicitationCompleteHandler: func(_ context.Context, req *mcp.ElicitationCompleteNotificationRequest) {
				p.complete <- req.Params.ElicitationID
			},
			ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
				select {
				case p.changed <- struct{}{}:
				default:
				}
			},
		})
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", MaxRetries: -1, HTTPClient: bearerClient(token, nil)},
			&mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatalf("%s connects at %s: %v", who, version, err)
		}
		t.Cleanup(func() { cs.Close() })
		p.cs = cs
		return p
	}
	names := func(t *testing.T, ctx context.Context, p *person) []string {
		t.Helper()
		res, err := p.cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tool := range res.Tools {
			out = append(out, tool.Name)
		}
		slices.Sort(out)
		return out
	}
	whoami := func(ctx context.Context, p *person) (string, error) {
		res, err := p.cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_remote_whoami", Arguments: map[string]any{}})
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, ct := range res.Content {
			if tc, ok := ct.(*mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		if res.IsError {
			return "", errors.New("tool error: " + b.String())
		}
		return b.String(), nil
	}

	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			alice, bob := "alice-"+version, "bob-"+version
			pa, pb := open(t, ctx, alice, version), open(t, ctx, bob, version)

			before, _ := up.Stats()
			if got := names(t, ctx, pa); !slices.Equal(got, []string{"mcp_remote_connect_account"}) {
				t.Errorf("%s's list before connecting: %v, want the connect tool alone", alice, got)
			}
			if after, _ := up.Stats(); after != before {
				t.Errorf("listing for a person not connected reached the upstream (%d requests)", after-before)
			}

			for _, who := range []struct {
				name string
				p    *person
			}{{alice, pa}, {bob, pb}} {
				before, _ := up.Stats()
				if version == "2025-11-25" {
					_, err := whoami(ctx, who.p)
					var rpcErr *jsonrpc.Error
					if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired {
						t.Fatalf("%s's first call: %v, want -32042", who.name, err)
					}
					if after, _ := up.Stats(); after != before {
						t.Fatalf("%s's call before connecting reached the upstream", who.name)
					}
					var data struct {
						Elicitations []*mcp.ElicitParams `json:"elicitations"`
					}
					if err := json.Unmarshal(rpcErr.Data, &data); err != nil || len(data.Elicitations) != 1 {
						t.Fatalf("the elicitation: %s (%v)", rpcErr.Data, err)
					}
					follow(t, who.name, data.Elicitations[0].URL)
					select {
					case id := <-who.p.complete:
						if id != data.Elicitations[0].ElicitationID {
							t.Errorf("elicitation/complete for %q, want %q", id, data.Elicitations[0].ElicitationID)
						}
					case <-ctx.Done():
						t.Fatalf("no notifications/elicitation/complete for %s", who.name)
					}
					select {
					case <-who.p.changed:
					case <-ctx.Done():
						t.Fatalf("no notifications/tools/list_changed for %s", who.name)
					}
					if got, err := whoami(ctx, who.p); err != nil || got != "whoami: "+who.name {
						t.Errorf("%s's call once connected: %q %v", who.name, got, err)
					}
					continue
				}
				// 2026-07-28: the client follows the input_required URL
				// elicitation and retries; the retry waits for the person.
				type answer struct {
					text string
					err  error
				}
				done := make(chan answer, 1)
				go func() {
					text, err := whoami(ctx, who.p)
					done <- answer{text, err}
				}()
				select {
				case link := <-who.p.links:
					follow(t, who.name, link)
				case a := <-done:
					t.Fatalf("%s's first call ended without a link: %q %v", who.name, a.text, a.err)
				case <-ctx.Done():
					t.Fatalf("%s's client was never asked to open a link", who.name)
				}
				select {
				case a := <-done:
					if a.err != nil || a.text != "whoami: "+who.name {
						t.Errorf("%s's call, retried once connected: %q %v", who.name, a.text, a.err)
					}
				case <-ctx.Done():
					t.Fatalf("%s's retried call never ended", who.name)
				}
			}

			for _, p := range []*person{pa, pb} {
				if got := names(t, ctx, p); !slices.Equal(got, []string{"mcp_remote_admin_op", "mcp_remote_echo", "mcp_remote_whoami"}) {
					t.Errorf("a list once connected: %v, want the upstream's tools", got)
				}
			}
			for _, step := range []struct {
				p    *person
				want string
			}{{pa, "whoami: " + alice}, {pb, "whoami: " + bob}, {pa, "whoami: " + alice}} {
				if got, err := whoami(ctx, step.p); err != nil || got != step.want {
					t.Errorf("call: %q %v, want %q", got, err, step.want)
				}
			}

			out, stderr, err := c.Run(t, "zidane", "connections", "revoke", "--owner", alice)
			if err != nil {
				t.Fatalf("connections revoke: %v\n%s%s", err, out, stderr)
			}
			before, _ = up.Stats()
			pa.decline.Store(true)
			_, err = whoami(ctx, pa)
			var rpcErr *jsonrpc.Error
			switch {
			case version == "2025-11-25":
				if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired || !strings.Contains(string(rpcErr.Data), base+"/zidane/connect/zcl_") {
					t.Errorf("%s's call after the revocation: %v, want -32042 with a new connect link", alice, err)
				}
			default:
				// The client was shown a new link, the person declined
				// it, and the call ended saying so.
				select {
				case link := <-pa.links:
					if !strings.HasPrefix(link, base+"/zidane/connect/zcl_") {
						t.Errorf("the new link: %q", link)
					}
				default:
					t.Errorf("%s's call after the revocation: %v, and no new connect link", alice, err)
				}
				if err == nil || !strings.Contains(err.Error(), "declined") {
					t.Errorf("%s's declined call: %v, want a tool error saying she declined", alice, err)
				}
			}
			if after, _ := up.Stats(); after != before {
				t.Errorf("%s's call after the revocation reached the upstream", alice)
			}
			if got, err := whoami(ctx, pb); err != nil || got != "whoami: "+bob {
				t.Errorf("%s after %s's revocation: %q %v", bob, alice, got, err)
			}
		})
	}
	if !hasAudit(c, map[string]any{"event": "upstream_call", "upstream": "remote", "route": "aggregate", "outcome": "connect_required"}) {
		t.Error("no audit line for a call answered with a connect link (upstream_call, outcome connect_required)")
	}
	for _, s := range as.Secrets() {
		if strings.Contains(c.Logs(), s) {
			t.Errorf("a token of the authorization server (%.8s…) is in the log", s)
		}
	}
}
