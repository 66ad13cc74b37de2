package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
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
		//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
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
	//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
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
				if u.mrtr {
					t.Run("test_input_required_result_prompt", func(t *testing.T) {
						res, err := ac.cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "mcp_" + u.name + "_test_input_required_result_prompt"})
						if err != nil {
							t.Fatal(err)
						}
						text := ""
						for _, m := range res.Messages {
							if tc, ok := m.Content.(*mcp.TextContent); ok {
								text += tc.Text
							}
						}
						if text != "Context: v-context" {
							t.Fatalf("prompt messages %q, want \"Context: v-context\"", text)
						}
					})
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

// modernCall is a raw 2026-07-28 tools/call body: its _meta carries the
// protocol version, and extra (JSON members) follows the name.
func modernCall(tool, extra string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":%q,"arguments":{}%s,`+
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}}}`, tool, extra)
}

// Attacks on the aggregated route's 2026-07-28 side, through the binary.
func TestAggregatedRouteModernAttacks(t *testing.T) {
	gs := startStatelessEverythingServer(t)
	gf := startEverythingServer(t)
	ts := startNodeEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream gs %s
		upstream gf %s
		upstream ts %s
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate gs gf ts
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, gs, gf, ts, port))
	all := createToken(t, c, "all", "--scope", "upstream:gs", "--scope", "upstream:gf", "--scope", "upstream:ts")
	other := createToken(t, c, "other", "--scope", "upstream:gs", "--scope", "upstream:gf", "--scope", "upstream:ts")
	gsOnly := createToken(t, c, "gs-only", "--scope", "upstream:gs")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	waitForAggregate(t, url, all, "mcp_gs_test_simple_text", "mcp_gf_test_simple_text", "mcp_ts_echo")
	modern := []string{"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/call"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("a retry for a tool the token may not call is refused", func(t *testing.T) {
		tool := "mcp_gf_test_input_required_result_request_state"
		body := modernCall(tool, `,"requestState":"request_state","inputResponses":{"confirm":{"action":"accept","content":{"ok":true}}}`)
		a := post(t, url, gsOnly, body, append(modern, "Mcp-Name", tool)...)
		if a.status != http.StatusForbidden || !strings.Contains(a.header.Get("WWW-Authenticate"), `scope="upstream:gf"`) {
			t.Fatalf("%d %q %s", a.status, a.header.Get("WWW-Authenticate"), a.body)
		}
		// The same retry from a token that may call it is served.
		a = post(t, url, all, body, append(modern, "Mcp-Name", tool)...)
		if a.status != http.StatusOK || !strings.Contains(a.body, "state-ok") {
			t.Fatalf("the allowed retry: %d %s", a.status, a.body)
		}
	})

	t.Run("headers that disagree with the body are refused", func(t *testing.T) {
		tool := "mcp_gs_test_simple_text"
		for _, tc := range []struct {
			name, body string
			headers    []string
		}{
			{"Mcp-Name names another tool", modernCall(tool, ""), append(modern, "Mcp-Name", "mcp_gf_test_simple_text")},
			{"Mcp-Method names another method", modernCall(tool, ""), []string{"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "prompts/get", "Mcp-Name", tool}},
			{"no Mcp-Method", modernCall(tool, ""), []string{"Mcp-Protocol-Version", "2026-07-28", "Mcp-Name", tool}},
			{"_meta version is not the header's", strings.Replace(modernCall(tool, ""), `"2026-07-28"`, `"2025-11-25"`, 1), append(modern, "Mcp-Name", tool)},
		} {
			a := post(t, url, all, tc.body, tc.headers...)
			if a.status != http.StatusBadRequest || a.rpc.Error.Code != -32020 {
				t.Errorf("%s: %d %s; want 400 with -32020", tc.name, a.status, a.body)
			}
		}
	})

	t.Run("a sealed requestState opens only for its token and unaltered", func(t *testing.T) {
		tool := "mcp_gf_test_input_required_result_elicitation"
		ac := connectAggClientOpts(t, url, all, &mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return nil, fmt.Errorf("not asked")
			}})
		res, err := ac.CallTool(ctx, &mcp.CallToolParams{Name: tool})
		if err != nil || !res.NeedsInput() || len(res.InputRequests) != 1 {
			t.Fatalf("first call: %v %+v", err, res)
		}
		state := res.RequestState
		var key string
		for k := range res.InputRequests {
			key = k
		}
		answer := fmt.Sprintf(`,"inputResponses":{%q:{"action":"accept","content":{"name":"Ada"}}}`, key)
		altered := []byte(state)
		altered[len(altered)-3] ^= 1
		for _, tc := range []struct{ name, token, state string }{
			{"another token replays it", other, state},
			{"altered", all, string(altered)},
			{"forged", all, "zidane-mrtr.1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
		} {
			body := modernCall(tool, fmt.Sprintf(`,"requestState":%q`, tc.state)+answer)
			a := post(t, url, tc.token, body, append(modern, "Mcp-Name", tool)...)
			if a.rpc.Error.Code != -32602 || !strings.Contains(a.rpc.Error.Message, "requestState refused") {
				t.Errorf("%s: %d %s; want -32602 requestState refused", tc.name, a.status, a.body)
			}
		}
		a := post(t, url, all, modernCall(tool, fmt.Sprintf(`,"requestState":%q`, state)+answer), append(modern, "Mcp-Name", tool)...)
		if a.status != http.StatusOK || !strings.Contains(a.body, "Hello, Ada!") {
			t.Fatalf("the right retry: %d %s", a.status, a.body)
		}
	})

	t.Run("listening to a resource of an upstream the token may not use is refused", func(t *testing.T) {
		ac := connectAggClientOpts(t, url, all, nil)
		var uri string
		for r, err := range ac.Resources(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(r.URI, "demo://") {
				uri = r.URI
				break
			}
		}
		if uri == "" {
			t.Fatal("the TypeScript upstream lists no demo:// resource")
		}
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":4,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":[%q]},`+
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, uri)
		a := post(t, url, gsOnly, body, "Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "subscriptions/listen")
		if !strings.Contains(a.body, `"error"`) || !strings.Contains(a.body, "upstream:ts") {
			t.Fatalf("%d %s; want an error naming upstream:ts", a.status, a.body)
		}
	})
}

func connectAggClientOpts(t *testing.T, url, token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-agg-attack", Version: "1"}, opts).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bearerClient(token, nil), MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Fatalf("negotiated %q, want 2026-07-28", v)
	}
	return cs
}

// connectGoAt is connectGo with the client asking for version.
func connectGoAt(t *testing.T, url string, hc *http.Client, version string) (*mcp.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-go", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

// A 2026-07-28 client's first call through the aggregated route to a tool
// that binds an argument to a Mcp-Param-* header (the everything-server's
// test_x_mcp_header) succeeds: the gateway's own session to the upstream
// sends the header the upstream requires, as the later (fast-path) calls
// pass on the client's.
func TestAggregatedModernParamHeaderTool(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream ev %s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate ev
	}
}
`, AdminPlaceholder, upstream, port))
	token := createToken(t, c, "params", "--scope", "mcp")
	cs, err := connectGoAt(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(token, nil), modernVersion)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // the first goes through go-sdk, the rest may take the fast path
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mcp_ev_test_x_mcp_header", Arguments: map[string]any{"region": "eu-west1"}})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %+v %v", i, res, err)
		}
	}
}
