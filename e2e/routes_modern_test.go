package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mrtrTools are the go-sdk everything-server's multi-round-trip tools
// (SEP-2322).
var mrtrTools = []string{
	"test_input_required_result_elicitation",
	"test_input_required_result_sampling",
	"test_input_required_result_list_roots",
	"test_input_required_result_request_state",
	"test_input_required_result_multiple_inputs",
	"test_input_required_result_multi_round",
	"test_input_required_result_tampered_state",
	"test_input_required_result_capabilities",
}

// tap is a loopback reverse proxy in front of an upstream that records
// what reaches it: each POST's MCP headers and body, and the JSON-RPC
// messages of its answer.
type tap struct {
	srv *httptest.Server
	mu  sync.Mutex
	log []exchangeSeen
}

// exchangeSeen is one POST as one side saw it.
type exchangeSeen struct {
	header   http.Header // the MCP headers: Mcp-Method, Mcp-Name, Mcp-Param-*, Mcp-Protocol-Version
	body     string
	messages []string // the answer's JSON-RPC messages (a JSON body, or each event's data)
}

func mcpHeaders(h http.Header) http.Header {
	out := http.Header{}
	for k, v := range h {
		if k == "Mcp-Method" || k == "Mcp-Name" || k == "Mcp-Protocol-Version" || strings.HasPrefix(k, "Mcp-Param-") {
			out[k] = v
		}
	}
	return out
}

// answerMessages splits an answer body into its JSON-RPC messages.
func answerMessages(contentType string, body []byte) []string {
	if !strings.HasPrefix(contentType, "text/event-stream") {
		if len(bytes.TrimSpace(body)) == 0 {
			return nil
		}
		return []string{string(bytes.TrimSpace(body))}
	}
	var out []string
	var data []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 {
				out = append(out, strings.Join(data, "\n"))
			}
			data = nil
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	return out
}

// teeBody passes an answer's body on as it is read, and hands what was
// read to done once it ends or is closed: a client reads an event stream
// as it comes (a server's request on it waits for the client's answer).
type teeBody struct {
	rc   io.ReadCloser
	buf  bytes.Buffer
	once sync.Once
	done func([]byte)
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.buf.Write(p[:n])
	if err != nil {
		b.once.Do(func() { b.done(b.buf.Bytes()) })
	}
	return n, err
}

func (b *teeBody) Close() error {
	err := b.rc.Close()
	b.once.Do(func() { b.done(b.buf.Bytes()) })
	return err
}

// recordExchange has record called with a POST once its answer has been
// read; a subscriptions/listen, which lasts, is not recorded.
func recordExchange(header http.Header, body []byte, resp *http.Response, record func(exchangeSeen)) {
	if bytes.Contains(body, []byte(`"subscriptions/listen"`)) {
		return
	}
	header, ct := mcpHeaders(header), resp.Header.Get("Content-Type")
	resp.Body = &teeBody{rc: resp.Body, done: func(answer []byte) {
		record(exchangeSeen{header: header, body: string(body), messages: answerMessages(ct, answer)})
	}}
}

func startTap(t *testing.T, upstream string) *tap {
	t.Helper()
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	proxy.ModifyResponse = func(resp *http.Response) error {
		req := resp.Request
		if req.Method != http.MethodPost || req.GetBody == nil {
			return nil
		}
		rb, _ := req.GetBody()
		body, _ := io.ReadAll(rb)
		recordExchange(req.Header, body, resp, func(ex exchangeSeen) {
			tp.mu.Lock()
			tp.log = append(tp.log, ex)
			tp.mu.Unlock()
		})
		return nil
	}
	tp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
			r.ContentLength = int64(len(body))
		}
		r.Host = target.Host
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(tp.srv.Close)
	return tp
}

func (tp *tap) url() string { return tp.srv.URL + "/mcp" }

// reset forgets what was recorded: clients of two subtests send the same
// bodies.
func (tp *tap) reset() {
	tp.mu.Lock()
	tp.log = nil
	tp.mu.Unlock()
}

// seen returns what reached the upstream with the exact body b.
func (tp *tap) seen(b string) (exchangeSeen, bool) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, ex := range tp.log {
		if ex.body == b {
			return ex, true
		}
	}
	return exchangeSeen{}, false
}

// clientTap records what a client sends and receives, on its side of the
// gateway; rewrite, when set, changes a request before it goes.
type clientTap struct {
	mu      sync.Mutex
	log     []exchangeSeen
	rewrite func(r *http.Request, body []byte) []byte
}

func (ct *clientTap) client(token string) *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+token)
		var body []byte
		if r.Method == http.MethodPost && r.Body != nil {
			body, _ = io.ReadAll(r.Body)
			if ct.rewrite != nil {
				body = ct.rewrite(r, body)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil || r.Method != http.MethodPost || resp.StatusCode != http.StatusOK {
			return resp, err
		}
		recordExchange(r.Header, body, resp, func(ex exchangeSeen) {
			ct.mu.Lock()
			ct.log = append(ct.log, ex)
			ct.mu.Unlock()
		})
		return resp, nil
	})}
}

func (ct *clientTap) calls() []exchangeSeen {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return slices.Clone(ct.log)
}

// peer is a go-sdk v1.8.0 client with every handler the everything
// servers exercise, and channels for what they notify.
type peer struct {
	cs               *mcp.ClientSession
	toolsChanged     chan struct{}
	resourcesChanged chan struct{}
	updated          chan string
}

// elicitContent accepts an elicitation with a value for every property
// its schema asks for.
func elicitContent(schema any) map[string]any {
	raw, _ := json.Marshal(schema)
	var s struct {
		Properties map[string]struct {
			Type string `json:"type"`
		} `json:"properties"`
	}
	json.Unmarshal(raw, &s)
	out := map[string]any{}
	for name, p := range s.Properties {
		switch p.Type {
		case "boolean":
			out[name] = true
		case "integer", "number":
			out[name] = 1
		default:
			out[name] = "e2e-" + name
		}
	}
	return out
}

func connectPeer(t *testing.T, endpoint string, hc *http.Client, version string) (*peer, error) {
	t.Helper()
	p := &peer{toolsChanged: make(chan struct{}, 64), resourcesChanged: make(chan struct{}, 64), updated: make(chan string, 64)}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-routes", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: elicitContent(req.Params.RequestedSchema)}, nil
		},
		//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
			return &mcp.CreateMessageResult{Role: "assistant", Model: "e2e", Content: &mcp.TextContent{Text: "Paris"}}, nil
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case p.toolsChanged <- struct{}{}:
			default:
			}
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			select {
			case p.resourcesChanged <- struct{}{}:
			default:
			}
		},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			select {
			case p.updated <- req.Params.URI:
			default:
			}
		},
	})
	//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
	client.AddRoots(&mcp.Root{URI: "file:///e2e-root", Name: "e2e"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { cs.Close() })
	p.cs = cs
	return p, nil
}

// outcome is what a tool call came to, in a form two routes compare by.
// An error names the first input request the client failed to fulfil,
// which is one of a map's: the name is left out.
func outcome(res *mcp.CallToolResult, err error) string {
	if err != nil {
		return "error: " + inputRequestName.ReplaceAllString(err.Error(), `fulfilling input request: `)
	}
	var texts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			texts = append(texts, tc.Text)
		}
	}
	return fmt.Sprintf("isError=%v needsInput=%v %s", res.IsError, res.NeedsInput(), strings.Join(texts, " | "))
}

var inputRequestName = regexp.MustCompile(`fulfilling input request "[^"]*": .*`)

func callRouteTool(cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, error) {
	if args == nil {
		args = map[string]any{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
}

func waitChan[T any](t *testing.T, ch <-chan T, what string, timeout time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("no %s within %v", what, timeout)
	}
	var zero T
	return zero
}

// routesModernCaddyfile offers each upstream through guard and through
// pass-through, each on its own loopback port; each guard site has a
// resource of its own, as guard sites of different servers in one caddy
// need. The scope onlystate grants
// one multi-round-trip tool only, on every route.
func routesModernCaddyfile(ports map[string]int, upstreams map[string]string) string {
	var sites strings.Builder
	for _, up := range []string{"stateless", "stateful", "node"} {
		fmt.Fprintf(&sites, `
http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		scope onlystate tools test_input_required_result_request_state
		rate_limit {
			per_token 1000/s 1000
			per_ip 1000/s 1000
		}
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		broker %s
		scope onlystate tools test_input_required_result_request_state
		rate_limit {
			per_token 1000/s 1000
			per_ip 1000/s 1000
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			upstream %s
		}
		resource http://127.0.0.1:%d/mcp
		scope onlystate tools test_input_required_result_request_state
		rate_limit {
			per_token 1000/s 1000
			per_ip 1000/s 1000
		}
	}
}
`, ports["guard/"+up], ports["guard/"+up], strings.TrimSuffix(strings.TrimPrefix(upstreams[up], "http://"), "/mcp"), ports["passthrough/"+up], up,
			ports["guardupstream/"+up], upstreams[up], ports["guardupstream/"+up])
	}
	return fmt.Sprintf(`{
	admin %s
	zidane {
		upstream stateless %s
		upstream stateful %s
		upstream node %s
	}
}
%s`, AdminPlaceholder, upstreams["stateless"], upstreams["stateful"], upstreams["node"], sites.String())
}

// TestRoutesModern drives guard (with reverse_proxy, and with an upstream
// of its own) and pass-through with go-sdk v1.8.0
// clients pinned at each protocol version, in front of the go-sdk
// everything-server (stateless: both versions; stateful: 2025-11-25) and
// the TypeScript server-everything (2025-11-25). In every combination that
// applies: listing tools, a tool call, each multi-round-trip tool (the
// same outcome as the upstream gives directly, and for 2026-07-28 a
// completed one), a list_changed (through subscriptions/listen for
// 2026-07-28, the GET stream for 2025-11-25) and a resource subscription.
// For 2026-07-28 the upstream receives the very headers and body the client
// sent, and the client the very messages the upstream answered.
func TestRoutesModern(t *testing.T) {
	statelessDirect := startStatelessEverythingServer(t)
	stateless := startTap(t, statelessDirect)
	upstreams := map[string]string{
		"stateless": stateless.url(),
		"stateful":  startEverythingServer(t),
		"node":      startNodeEverythingServer(t),
	}
	ports := map[string]int{}
	routes := []string{"guard", "passthrough", "guardupstream"}
	for _, route := range routes {
		for up := range upstreams {
			ports[route+"/"+up] = freePort(t)
		}
	}
	c := startCaddy(t, routesModernCaddyfile(ports, upstreams))
	token := createToken(t, c, "all", "--scope", "mcp")
	scoped := createToken(t, c, "onlystate", "--scope", "onlystate")

	combos := []struct{ up, version string }{
		{"stateless", modernVersion},
		{"stateless", legacyVersion},
		{"stateful", legacyVersion},
		{"node", legacyVersion},
	}
	for _, route := range routes {
		for _, combo := range combos {
			t.Run(route+"/"+combo.up+"/"+combo.version, func(t *testing.T) {
				endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[route+"/"+combo.up])
				ct := &clientTap{}
				stateless.reset()
				p, err := connectPeer(t, endpoint, ct.client(token), combo.version)
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				if got := p.cs.InitializeResult().ProtocolVersion; got != combo.version {
					t.Fatalf("negotiated %q through %s, want %q", got, route, combo.version)
				}
				checkRouteCombo(t, p, combo.up, combo.version, upstreams[combo.up], statelessDirect)
				if combo.version == modernVersion {
					checkFaithful(t, ct, stateless)
				}
			})
		}
		t.Run(route+"/Mcp-Param attacks", func(t *testing.T) {
			checkParamHeaderAttacks(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[route+"/stateless"]), token, stateless)
		})
		t.Run(route+"/scoped retry", func(t *testing.T) {
			checkScopedRetry(t, c, fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[route+"/stateless"]), scoped, stateless)
		})
	}
}

// checkRouteCombo runs one combination's calls.
func checkRouteCombo(t *testing.T, p *peer, up, version, upstream, statelessDirect string) {
	ctx := context.Background()
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tools, err := p.cs.ListTools(lctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	names := toolNamesOf(tools)
	goSDK := up != "node"
	if goSDK {
		for _, want := range append([]string{"test_simple_text", "test_x_mcp_header", "test_trigger_tool_change"}, mrtrTools...) {
			if !slices.Contains(names, want) {
				t.Fatalf("tools/list lacks %s: %v", want, names)
			}
		}
		res, err := callRouteTool(p.cs, "test_simple_text", nil)
		if err != nil || res.IsError || outcome(res, nil) != "isError=false needsInput=false This is a simple text response for testing." {
			t.Fatalf("test_simple_text: %s", outcome(res, err))
		}
		// An argument mirrored into Mcp-Param-Region (2026-07-28), which
		// the edge checks against the body and the server checks again.
		res, err = callRouteTool(p.cs, "test_x_mcp_header", map[string]any{"region": "eu-west1", "level": 3})
		if err != nil || res.IsError {
			t.Fatalf("test_x_mcp_header: %s", outcome(res, err))
		}
	} else {
		res, err := callRouteTool(p.cs, "echo", map[string]any{"message": "through the gateway"})
		if err != nil || res.IsError || !strings.Contains(outcome(res, nil), "through the gateway") {
			t.Fatalf("echo: %s", outcome(res, err))
		}
	}

	if goSDK {
		// The same client, straight to the upstream, gives each
		// multi-round-trip tool's outcome without the gateway.
		directURL := upstream
		if up == "stateless" {
			directURL = statelessDirect
		}
		direct, err := connectPeer(t, directURL, http.DefaultClient, version)
		if err != nil {
			t.Fatalf("connect directly: %v", err)
		}
		for _, tool := range mrtrTools {
			want := outcome(callRouteTool(direct.cs, tool, nil))
			got := outcome(callRouteTool(p.cs, tool, nil))
			if got != want {
				t.Errorf("%s through the route: %s; directly: %s", tool, got, want)
			}
			if version == modernVersion && tool != "test_input_required_result_tampered_state" && !strings.HasPrefix(got, "isError=false needsInput=false") {
				t.Errorf("%s did not complete: %s", tool, got)
			}
		}
	}

	// A list_changed, and a resource subscription. A stateless server
	// has no GET stream for a 2025-11-25 client: neither applies there.
	if up == "stateless" && version == legacyVersion {
		return
	}
	switch up {
	case "node":
		// Registering a session resource (from a data: URL, no network)
		// sends notifications/resources/list_changed on the GET stream.
		res, err := callRouteTool(p.cs, "gzip-file-as-resource", map[string]any{"name": "e2e.txt.gz", "data": "data:text/plain;base64,aGVsbG8gZTJl", "outputType": "resourceLink"})
		if err != nil || res.IsError {
			t.Fatalf("gzip-file-as-resource: %s", outcome(res, err))
		}
		waitChan(t, p.resourcesChanged, "notifications/resources/list_changed", 20*time.Second)
	default:
		res, err := callRouteTool(p.cs, "test_trigger_tool_change", nil)
		if err != nil || res.IsError {
			t.Fatalf("test_trigger_tool_change: %s", outcome(res, err))
		}
		waitChan(t, p.toolsChanged, "notifications/tools/list_changed", 20*time.Second)
	}

	uri := "test://watched-resource" // updated every 3 seconds
	if up == "node" {
		uri = "demo://resource/static/document/architecture.md"
	}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if err := p.cs.Subscribe(sctx, &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatalf("subscribe %s: %v", uri, err)
	}
	if up == "node" {
		// Its updates start when the session asks for them (every 5 s).
		if res, err := callRouteTool(p.cs, "toggle-subscriber-updates", nil); err != nil || res.IsError {
			t.Fatalf("toggle-subscriber-updates: %s", outcome(res, err))
		}
	}
	if got := waitChan(t, p.updated, "notifications/resources/updated", 30*time.Second); got != uri {
		t.Errorf("resources/updated for %q, want %q", got, uri)
	}
}

// checkFaithful: every POST the client's side recorded (2026-07-28) reached
// the upstream with the same body and the same MCP headers, and its answer
// reached the client as the same JSON-RPC messages.
func checkFaithful(t *testing.T, ct *clientTap, up *tap) {
	t.Helper()
	calls := ct.calls()
	var retries, params int
	for _, sent := range calls {
		got, ok := up.seen(sent.body)
		// The upstream's side is recorded once the gateway has closed its
		// answer, which may come just after the client has it whole.
		for deadline := time.Now().Add(5 * time.Second); !ok && time.Now().Before(deadline); got, ok = up.seen(sent.body) {
			time.Sleep(20 * time.Millisecond)
		}
		if !ok {
			t.Errorf("the upstream never received %s as the client sent it", clip(sent.body))
			continue
		}
		if !headersEqual(sent.header, got.header) {
			t.Errorf("%s: the client sent %v, the upstream received %v", clip(sent.body), sent.header, got.header)
		}
		if !slices.Equal(sent.messages, got.messages) {
			t.Errorf("%s: the upstream answered %q, the client received %q", clip(sent.body), got.messages, sent.messages)
		}
		if strings.Contains(sent.body, `"requestState"`) && strings.Contains(sent.body, `"inputResponses"`) {
			retries++
		}
		if len(sent.header.Values("Mcp-Param-Region")) > 0 {
			params++
		}
	}
	if retries == 0 || params == 0 {
		t.Errorf("of %d calls, %d were multi-round-trip retries and %d carried Mcp-Param-Region; want some of each", len(calls), retries, params)
	}
}

func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// checkScopedRetry: a token whose scope grants one multi-round-trip tool
// completes it, retry included; the same retry renamed to another tool
// (its requestState and inputResponses kept, the Mcp-Name header changed
// with the body so the headers check passes) is refused with 403, as a
// first call to that tool is, and never reaches the upstream.
func checkScopedRetry(t *testing.T, c *Caddy, endpoint, token string, up *tap) {
	const allowed, other = "test_input_required_result_request_state", "test_input_required_result_tampered_state"
	up.reset()
	ct := &clientTap{}
	p, err := connectPeer(t, endpoint, ct.client(token), modernVersion)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome(callRouteTool(p.cs, allowed, nil)); got != "isError=false needsInput=false state-ok: requestState received and confirmation accepted" {
		t.Fatalf("%s with its scope: %s", allowed, got)
	}
	if _, err := callRouteTool(p.cs, other, nil); err == nil {
		t.Fatalf("%s without its scope was allowed", other)
	}

	var renamed int
	var mu sync.Mutex
	ct.rewrite = func(r *http.Request, body []byte) []byte {
		if !bytes.Contains(body, []byte(`"requestState"`)) {
			return body
		}
		var msg map[string]any
		if json.Unmarshal(body, &msg) != nil {
			return body
		}
		params, _ := msg["params"].(map[string]any)
		if params == nil || params["name"] != allowed {
			return body
		}
		params["name"] = other
		r.Header.Set("Mcp-Name", other)
		out, _ := json.Marshal(msg)
		mu.Lock()
		renamed++
		mu.Unlock()
		return out
	}
	before := strings.Count(c.Logs(), `"reason":"insufficient_scope"`)
	if got := outcome(callRouteTool(p.cs, allowed, nil)); !strings.HasPrefix(got, "error:") {
		t.Fatalf("the retry renamed to %s: %s; want a refusal", other, got)
	}
	mu.Lock()
	n := renamed
	mu.Unlock()
	if n == 0 {
		t.Fatal("no retry was sent")
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(c.Logs(), `"reason":"insufficient_scope"`) <= before {
		if time.Now().After(deadline) {
			t.Fatal("the renamed retry was not audited as insufficient_scope")
		}
		time.Sleep(50 * time.Millisecond)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for _, ex := range up.log {
		if strings.Contains(ex.body, `"`+other+`"`) && strings.Contains(ex.body, `"requestState"`) {
			t.Errorf("the renamed retry reached the upstream: %s", clip(ex.body))
		}
	}
}

// checkParamHeaderAttacks sends 2026-07-28 tools/call requests whose
// Mcp-Param-Region (test_x_mcp_header binds its region argument to it)
// disagrees with the body, as a client that is not an SDK would: each gets
// 400 with JSON-RPC -32020 from the edge, and never reaches the upstream;
// the agreeing one is served. The route learned the binding from the
// tools/list answers it passed on before. (A name spelled with _, which
// the edge refuses too, never reaches it here: caddy 2.11 drops every
// request header whose name holds an underscore.)
func checkParamHeaderAttacks(t *testing.T, endpoint, token string, up *tap) {
	body := func(args string) string {
		return `{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"test_x_mcp_header","arguments":` + args +
			`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	}
	send := func(b string, header http.Header) rawAnswer {
		req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Mcp-Protocol-Version", modernVersion)
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "test_x_mcp_header")
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		a := rawAnswer{status: resp.StatusCode, header: resp.Header, body: string(raw)}
		json.Unmarshal(raw, &a.rpc)
		return a
	}
	up.reset()
	for _, c := range []struct {
		name   string
		args   string
		header http.Header
	}{
		{"other value", `{"region":"us-east1"}`, http.Header{"Mcp-Param-Region": {"eu-west1"}}},
		{"missing header", `{"region":"us-east1"}`, nil},
		{"header twice", `{"region":"us-east1"}`, http.Header{"Mcp-Param-Region": {"us-east1", "eu-west1"}}},
		{"unbound argument", `{"region":"us-east1","level":3}`, http.Header{"Mcp-Param-Region": {"us-east1"}, "Mcp-Param-Level": {"3"}}},
		{"absent argument", `{}`, http.Header{"Mcp-Param-Region": {"eu-west1"}}},
		{"base64 of another value", `{"region":"us-east1"}`, http.Header{"Mcp-Param-Region": {"=?base64?ZXU=?="}}},
		{"a second base64 encoding of the value (pad bits set)", `{"region":"eu"}`, http.Header{"Mcp-Param-Region": {"=?base64?ZXV=?="}}},
		{"base64 without its padding", `{"region":"eu"}`, http.Header{"Mcp-Param-Region": {"=?base64?ZXU?="}}},
		{"base64 with characters outside its alphabet", `{"region":"eu"}`, http.Header{"Mcp-Param-Region": {"=?base64?Z!XU=?="}}},
	} {
		a := send(body(c.args), c.header)
		if a.status != http.StatusBadRequest || a.rpc.Error.Code != -32020 {
			t.Errorf("%s: %d %s; want 400 with JSON-RPC -32020", c.name, a.status, clip(a.body))
		}
	}
	up.mu.Lock()
	reached := len(up.log)
	up.mu.Unlock()
	if reached != 0 {
		t.Errorf("%d refused calls reached the upstream", reached)
	}
	for _, c := range []struct{ args, value string }{
		{`{"region":"日本"}`, "=?base64?5pel5pys?="},
		// SEP-2243: servers decode any value in base64.
		{`{"region":"eu"}`, "=?base64?ZXU=?="},
	} {
		if a := send(body(c.args), http.Header{"Mcp-Param-Region": {c.value}}); a.status != http.StatusOK || strings.Contains(a.body, `"error"`) {
			t.Errorf("an agreeing header %s for %s: %d %s", c.value, c.args, a.status, clip(a.body))
		}
	}
}

// TestListenOutlastsMaxResponse: a subscriptions/listen stream lasts as
// long as its client listens, so max_response bounds each of its events,
// not the stream: through guard and pass-through, both with a
// max_response of 12 KiB, a 2026-07-28 client keeps getting list_changed
// notifications long past 12 KiB of them (150 of about 150 bytes each).
func TestListenOutlastsMaxResponse(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	guardPort, brokerPort := freePort(t), freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream stateless %s {
			max_response 12KiB
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			max_response 12KiB
		}
		rate_limit {
			per_token 1000/s 1000
			per_ip 1000/s 1000
		}
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		broker stateless
		rate_limit {
			per_token 1000/s 1000
			per_ip 1000/s 1000
		}
	}
}
`, AdminPlaceholder, upstream, guardPort, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp"), brokerPort))
	token := createToken(t, c, "all", "--scope", "mcp")
	for name, port := range map[string]int{"guard": guardPort, "passthrough": brokerPort} {
		t.Run(name, func(t *testing.T) {
			p, err := connectPeer(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(token, nil), modernVersion)
			if err != nil {
				t.Fatal(err)
			}
			if v := p.cs.InitializeResult().ProtocolVersion; v != modernVersion {
				t.Fatalf("negotiated %q", v)
			}
			const n = 150
			for i := range n {
				// Only a notification sent after this trigger counts.
				for len(p.toolsChanged) > 0 {
					<-p.toolsChanged
				}
				if res, err := callRouteTool(p.cs, "test_trigger_tool_change", nil); err != nil || res.IsError {
					t.Fatalf("trigger %d: %s", i, outcome(res, err))
				}
				waitChan(t, p.toolsChanged, fmt.Sprintf("list_changed %d of %d on the listen stream", i+1, n), 10*time.Second)
			}
		})
	}
}

// A config reload keeps what a route learned of its tools' x-mcp-header
// bindings: a 2026-07-28 client that listed tools before the reload goes on
// calling a tool with a Mcp-Param-* header after it, without listing again.
func TestParamBindingsSurviveReload(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	port := freePort(t)
	conf := func(rate int) string {
		return fmt.Sprintf(`{
	admin %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		rate_limit {
			per_token %d/s 1000
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, rate, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp"))
	}
	c := startCaddy(t, conf(1000))
	token := createToken(t, c, "params", "--scope", "mcp")
	cs, err := connectGoAt(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(token, nil), modernVersion)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	call := func(when string) {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_x_mcp_header", Arguments: map[string]any{"region": "eu-west1"}})
		if err != nil || res.IsError {
			t.Fatalf("%s: %+v %v", when, res, err)
		}
	}
	call("before the reload")
	c.Reload(t, conf(999))
	call("after the reload, without listing tools again")
}
