package aggregate

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// tokenRT sends every request as the test token tok (see aggServe).
type tokenRT struct{ tok string }

func (t tokenRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Test-Token", t.tok)
	return http.DefaultTransport.RoundTrip(r)
}

// modernClient connects a go-sdk client left to choose (2026-07-28) as
// token tok.
func modernClient(t *testing.T, url, tok string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "modern", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: tokenRT{tok}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	if v := cs.InitializeResult().ProtocolVersion; v != protocolModern {
		t.Fatalf("the client negotiated %q with the aggregate, want %s", v, protocolModern)
	}
	if cs.ID() != "" {
		t.Fatalf("a 2026-07-28 client got session id %q", cs.ID())
	}
	return cs
}

// sessionCounter counts the distinct upstream sessions (Mcp-Session-Id)
// that carried tools/call to a stateful upstream.
type sessionCounter struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (s *sessionCounter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get(upstream.HeaderSessionID); id != "" && r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"tools/call"`)) {
				s.mu.Lock()
				s.seen[id] = true
				s.mu.Unlock()
			}
		}
		h.ServeHTTP(w, r)
	})
}

func (s *sessionCounter) n() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// A 2026-07-28 client beside a 2025-11-25 one on the same route, over a
// 2026-07-28 upstream and a 2025-11-25-only one.
func TestAggregateModernClient(t *testing.T) {
	modern := newMRTRUp(t, "m", true)
	legacy := newAggUp(t, "l") // go-sdk stateful: 2025-11-25 only
	counter := &sessionCounter{seen: map[string]bool{}}
	legacy.http.Config.Handler = counter.wrap(legacy.http.Config.Handler)
	_, url := aggServe(t, []upstream.Config{modern.ups, legacy.config()}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var asked []string
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked = append(asked, req.Params.Message)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "x"}}, nil
		},
	})
	old := aggConnect(t, url, nil)

	for _, c := range []*mcp.ClientSession{cs, old} {
		names := aggToolNames(t, ctx, c)
		for _, want := range []string{"mcp_l_echo", "mcp_m_two_rounds"} {
			if !slices.Contains(names, want) {
				t.Fatalf("tools/list = %v, want %s in it", names, want)
			}
		}
	}
	for i := range 3 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_l_echo", Arguments: map[string]any{"text": "q"}})
		if err != nil || aggText(t, res) != "l:q" {
			t.Fatalf("call %d to the legacy upstream: %v %v", i, res, err)
		}
	}
	// The token's calls share one upstream session (the principal
	// session); another token gets its own.
	if n := counter.n(); n != 1 {
		t.Fatalf("three 2026-07-28 calls of one token used %d upstream sessions, want 1", n)
	}
	other := modernClient(t, url, "tok-2", nil)
	if res, err := other.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_l_echo", Arguments: map[string]any{"text": "z"}}); err != nil || aggText(t, res) != "l:z" {
		t.Fatalf("tok-2's call: %v %v", res, err)
	}
	if n := counter.n(); n != 2 {
		t.Fatalf("two tokens used %d upstream sessions, want 2", n)
	}

	// MRTR end to end: go-sdk's client fulfils the input requests the
	// aggregate passed on, and retries with the upstream's requestState.
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_m_two_rounds"})
	if err != nil || aggText(t, res) != "done x+x" {
		t.Fatalf("two_rounds: %v %v", res, err)
	}
	if len(asked) != 2 {
		t.Fatalf("the client was asked %q, want two rounds", asked)
	}
	want := []string{"2026-07-28 two_rounds state=", "2026-07-28 two_rounds state=round=1", "2026-07-28 two_rounds state=round=2;x"}
	if got := modern.saw(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the upstream saw %q, want %q", got, want)
	}
}

// The input-required answer reaches a 2026-07-28 client as the upstream
// gave it, and the client's own retry, with the requestState it chooses,
// reaches the upstream untouched.
func TestAggregateModernClientGetsInputRequiredUnchanged(t *testing.T) {
	modern := newMRTRUp(t, "m", true)
	_, url := aggServe(t, []upstream.Config{modern.ups}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_m_two_rounds"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.NeedsInput() || res.RequestState != "round=1" || len(res.InputRequests) != 1 {
		t.Fatalf("first answer: needsInput %v, state %q, %d requests; want the upstream's input-required answer", res.NeedsInput(), res.RequestState, len(res.InputRequests))
	}
	ep, ok := res.InputRequests["step1"].(*mcp.ElicitParams)
	if !ok || ep.Message != "name?" {
		t.Fatalf("input request step1 = %#v", res.InputRequests["step1"])
	}
	// A retry the client alters: the upstream, not the gateway, judges it.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_m_two_rounds", RequestState: "round=1",
		InputResponses: mcp.InputResponseMap{"step1": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "own"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.NeedsInput() || res.RequestState != "round=2;own" {
		t.Fatalf("second answer: needsInput %v, state %q", res.NeedsInput(), res.RequestState)
	}
	if got := modern.saw(); len(got) != 2 || got[1] != "2026-07-28 two_rounds state=round=1" {
		t.Fatalf("the upstream saw %q", got)
	}
}

// list_changed and resources/updated reach a 2026-07-28 client through
// subscriptions/listen.
func TestAggregateModernClientListens(t *testing.T) {
	up := newAggUp(t, "a")
	_, url := aggServe(t, []upstream.Config{up.config()}, Options{})
	changed := make(chan struct{}, 8)
	updated := make(chan string, 8)
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) { updated <- req.Params.URI },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = aggToolNames(t, ctx, cs)
	mcp.AddTool(up.server, &mcp.Tool{Name: "fresh"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "new"}}}, nil, nil
	})
	for !slices.Contains(aggToolNames(t, ctx, cs), "mcp_a_fresh") {
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("no tools/list_changed with the new tool")
		}
	}
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://a/doc"}); err != nil {
		t.Fatal(err)
	}
	// The subscription reaches the upstream when the client's listen
	// stream is open; update until one arrives.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_ = up.server.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://a/doc"})
		select {
		case uri := <-updated:
			if uri != "test://a/doc" {
				t.Fatalf("updated %q", uri)
			}
			return
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("no resources/updated reached the 2026-07-28 subscriber")
		}
	}
}

// server/discover answers with both generations and the merged
// instructions.
func TestAggregateDiscover(t *testing.T) {
	a, b := newAggUp(t, "a"), newMRTRUp(t, "b", true)
	_, url := aggServe(t, []upstream.Config{a.config(), b.ups}, Options{})
	body := `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	req := httptest.NewRequest("POST", url, strings.NewReader(body))
	req.RequestURI = ""
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "server/discover")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	out := string(data)
	for _, want := range []string{`"2026-07-28"`, `"2025-11-25"`, "Use a wisely."} {
		if !strings.Contains(out, want) {
			t.Fatalf("server/discover answered %s; want %s in it", out, want)
		}
	}
}

// subscriptions/listen names resources the edge does not check: each is
// checked against its owner, and one of an upstream the token may not use
// fails the listen request.
func TestAggregateListenChecksResourceOwners(t *testing.T) {
	a, b := newAggUp(t, "a"), newAggUp(t, "b")
	_, url := aggServe(t, []upstream.Config{a.config(), b.config()}, Options{
		MayUse: func(p policy.Principal, upstream string) bool { return p.TokenID == "tok-1" && upstream == "a" },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	updated := make(chan string, 8)
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) { updated <- req.Params.URI },
	})
	// The listen request itself, as the client sends it: an error that
	// names the scope, not an acknowledgement.
	body := `{"jsonrpc":"2.0","id":5,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["test://b/doc"]},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	req.Header.Set("X-Test-Token", "tok-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(data), `"error"`) || !strings.Contains(string(data), "upstream:b") || strings.Contains(string(data), "acknowledged") {
		t.Fatalf("listen for b's resource with a token for a only answered %s; want an error naming upstream:b", data)
	}
	// go-sdk's client listens in the background and reports nothing: what
	// shows is that b's updates never come, while a's do.
	_ = cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://b/doc"})
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://a/doc"}); err != nil {
		t.Fatalf("subscribing to a's resource: %v", err)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_ = b.server.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://b/doc"})
		_ = a.server.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://a/doc"})
		select {
		case uri := <-updated:
			if uri != "test://a/doc" {
				t.Fatalf("the client got an update of %q", uri)
			}
			return
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("no update of a's resource")
		}
	}
}

// When a 2026-07-28 upstream's list-changed stream ends (here: the
// upstream ends it), the catalog connects again and listens again: a tool
// the upstream adds afterwards reaches the aggregate's listing.
func TestAggregateCatalogListensAgain(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "m", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "first"}, func(context.Context, *mcp.CallToolRequest, any) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	var mu sync.Mutex
	var listens []context.CancelFunc
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Method") == "subscriptions/listen" {
			ctx, cancel := context.WithCancel(r.Context())
			mu.Lock()
			listens = append(listens, cancel)
			mu.Unlock()
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	listening := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(listens)
	}
	_, url := aggServe(t, []upstream.Config{{Name: "m", URL: srv.URL}}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if n := listening(); n != 1 {
		t.Fatalf("%d listen streams after the catalog connected, want 1", n)
	}
	mu.Lock()
	listens[0]() // the upstream ends the stream
	mu.Unlock()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for listening() < 2 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("the catalog did not listen again after its stream ended")
		}
	}
	mcp.AddTool(s, &mcp.Tool{Name: "second"}, func(context.Context, *mcp.CallToolRequest, any) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	cs := modernClient(t, url, "tok-1", nil)
	for !slices.Contains(aggToolNames(t, ctx, cs), "mcp_m_second") {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("the tool added after the stream ended never reached the aggregate")
		}
	}
}

// An upstream's progress for a 2026-07-28 request reaches that request's
// stream, through the token's principal session.
func TestAggregateModernClientProgress(t *testing.T) {
	up := newFastUp(t, "l", false)
	_, url := aggServe(t, []upstream.Config{up.config()}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	progress := make(chan string, 4)
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params.Message
		},
	})
	params := &mcp.CallToolParams{Name: "mcp_l_progress", Arguments: map[string]any{"text": "x"}}
	params.SetProgressToken("p-1")
	res, err := cs.CallTool(ctx, params)
	if err != nil || aggText(t, res) != "done" {
		t.Fatalf("progress tool: %v %v", res, err)
	}
	select {
	case m := <-progress:
		if m != "half" {
			t.Fatalf("progress %q", m)
		}
	case <-ctx.Done():
		t.Fatal("no progress reached the 2026-07-28 client")
	}
}
