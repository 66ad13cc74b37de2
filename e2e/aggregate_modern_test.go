package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The aggregated route in every combination of client and upstream
// protocol (issue 14, items 3 and 5): go-sdk v1.8.0 clients pinned at
// 2025-11-25 and at 2026-07-28, over the go-sdk everything-server in
// stateless mode (gs: both versions), in stateful mode (gf: 2025-11-25
// only) and the TypeScript server-everything (ts: 2025-11-25).

// aggregateModernCaddyfile serves one aggregated route per upstream (their
// resources share URIs, which an aggregate gives to one owner), on ports
// pgs, pgf and pts.
func aggregateModernCaddyfile(pgs, pgf, pts int, gs, gf, ts string) string {
	site := func(port int, name string) string {
		return fmt.Sprintf(`
http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate %s
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, port, name)
	}
	return fmt.Sprintf(`{
	admin %s
	zidane {
		upstream gs %s
		upstream gf %s
		upstream ts %s
	}
}
`, AdminPlaceholder, gs, gf, ts) + site(pgs, "gs") + site(pgf, "gf") + site(pts, "ts")
}

// aggClient is a go-sdk client of the aggregated route, with handlers
// that answer every input request and record the notifications.
type aggClient struct {
	cs      *mcp.ClientSession
	changed chan struct{}
	updated chan string

	mu    sync.Mutex
	asked []string
}

// fillSchema answers an elicitation: every property of the requested
// schema, a string "v-<name>" or true.
func fillSchema(p *mcp.ElicitParams) map[string]any {
	out := map[string]any{}
	if s, ok := p.RequestedSchema.(map[string]any); ok {
		props, _ := s["properties"].(map[string]any)
		for name, v := range props {
			typ, _ := v.(map[string]any)["type"].(string)
			if typ == "boolean" {
				out[name] = true
			} else {
				out[name] = "v-" + name
			}
		}
	}
	return out
}

func connectAggClient(t *testing.T, url, token, version string) *aggClient {
	t.Helper()
	c := &aggClient{changed: make(chan struct{}, 64), updated: make(chan string, 64)}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-agg-" + version, Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			c.mu.Lock()
			c.asked = append(c.asked, req.Params.Message)
			c.mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: fillSchema(req.Params)}, nil
		},
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Role: "assistant", Model: "e2e", Content: &mcp.TextContent{Text: "Paris"}}, nil
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case c.changed <- struct{}{}:
			default:
			}
		},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			select {
			case c.updated <- req.Params.URI:
			default:
			}
		},
	})
	client.AddRoots(&mcp.Root{URI: "file:///e2e", Name: "e2e"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bearerClient(token, nil), MaxRetries: -1}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	c.cs = cs
	return c
}

func callText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mrtrWant is what each multi-round-trip tool of the go-sdk
// everything-server answers once the client gave what it asked, with the
// client above.
var mrtrWant = map[string]string{
	"test_input_required_result_elicitation":     "Hello, v-name!",
	"test_input_required_result_sampling":        "Sampling response: Paris",
	"test_input_required_result_list_roots":      "Client exposed 1 root(s): file:///e2e",
	"test_input_required_result_request_state":   "state-ok",
	"test_input_required_result_multiple_inputs": "Paris v-name — 1 root(s) visible",
	"test_input_required_result_multi_round":     "Multi-round complete: v-name likes v-color",
	"test_input_required_result_tampered_state":  "state-ok",
	"test_input_required_result_capabilities":    "Capability-aware input requests fulfilled",
}

func TestAggregatedRouteBothProtocols(t *testing.T) {
	gs := startStatelessEverythingServer(t)
	gf := startEverythingServer(t)
	ts := startNodeEverythingServer(t)
	pgs, pgf, pts := freePort(t), freePort(t), freePort(t)
	c := startCaddy(t, aggregateModernCaddyfile(pgs, pgf, pts, gs, gf, ts))
	all := createToken(t, c, "all", "--scope", "upstream:gs", "--scope", "upstream:gf", "--scope", "upstream:ts")
	at := func(port int) string { return fmt.Sprintf("http://127.0.0.1:%d/mcp", port) }

	type upstream struct {
		name, url, simple, args, want string
		mrtr, listChanged, watched    bool
	}
	ups := []upstream{
		{"gs", at(pgs), "test_simple_text", "", "This is a simple text response", true, true, true},
		{"gf", at(pgf), "test_simple_text", "", "This is a simple text response", true, true, true},
		{"ts", at(pts), "echo", "through the aggregate", "Echo: through the aggregate", false, false, false},
	}
	for _, u := range ups {
		waitForAggregate(t, u.url, all, "mcp_"+u.name+"_"+u.simple)
	}
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		for _, u := range ups {
			t.Run("client "+version+", upstream "+u.name, func(t *testing.T) {
				ac := connectAggClient(t, u.url, all, version)
				if got := ac.cs.InitializeResult().ProtocolVersion; got != version {
					t.Fatalf("the client negotiated %q with the aggregated route, want %q", got, version)
				}
				if version == "2026-07-28" && ac.cs.ID() != "" {
					t.Fatalf("a 2026-07-28 client got a session id %q", ac.cs.ID())
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				tools, err := ac.cs.ListTools(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if tools.CacheScope != "private" {
					t.Errorf("tools/list cacheScope %q, want private (it is filtered for the token)", tools.CacheScope)
				}
				tool := "mcp_" + u.name + "_" + u.simple
				if names := toolNamesOf(tools); !slices.Contains(names, tool) {
					t.Fatalf("tools/list lacks %s: %v", tool, names)
				}
				params := &mcp.CallToolParams{Name: tool}
				if u.args != "" {
					params.Arguments = map[string]any{"message": u.args}
				}
				res, err := ac.cs.CallTool(ctx, params)
				if err != nil || res.IsError || !strings.Contains(callText(res), u.want) {
					t.Fatalf("%s: %v %q", tool, err, callTextOrNil(res))
				}
				if u.mrtr {
					for _, name := range slices.Sorted(maps.Keys(mrtrWant)) {
						want := mrtrWant[name]
						t.Run(name, func(t *testing.T) {
							res, err := ac.cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_" + u.name + "_" + name})
							if err != nil {
								t.Fatalf("%v", err)
							}
							if res.IsError || !strings.Contains(callText(res), want) {
								t.Fatalf("answer %q (isError %v), want %q in it", callText(res), res.IsError, want)
							}
						})
					}
				}
				if u.listChanged {
					t.Run("list_changed", func(t *testing.T) {
						drain(ac.changed)
						res, err := ac.cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_" + u.name + "_test_trigger_tool_change"})
						if err != nil || res.IsError {
							t.Fatalf("trigger: %v %q", err, callTextOrNil(res))
						}
						select {
						case <-ac.changed:
						case <-time.After(20 * time.Second):
							t.Fatal("no notifications/tools/list_changed reached the client within 20s")
						}
					})
				}
				if u.watched {
					t.Run("resource subscription", func(t *testing.T) {
						if err := ac.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched-resource"}); err != nil {
							t.Fatal(err)
						}
						defer ac.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "test://watched-resource"})
						// The server updates it every 3 seconds.
						select {
						case uri := <-ac.updated:
							if uri != "test://watched-resource" {
								t.Fatalf("updated %q", uri)
							}
						case <-time.After(20 * time.Second):
							t.Fatal("no notifications/resources/updated within 20s")
						}
					})
				}
			})
		}
	}
}

func drain(ch chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func callTextOrNil(res *mcp.CallToolResult) string {
	if res == nil {
		return ""
	}
	return callText(res)
}
