package broker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

type aggUp struct {
	name   string
	server *mcp.Server
	http   *httptest.Server

	mu    sync.Mutex
	auths []string
}

func (u *aggUp) sawAuth() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.auths)
}

type aggIn struct {
	Text string `json:"text"`
}

// newAggUp starts a real go-sdk upstream on 127.0.0.1 with tools echo and
// secret, a prompt, a resource and instructions.
func newAggUp(t *testing.T, name string) *aggUp {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ServerOptions{
		Instructions:       "Use " + name + " wisely.",
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		CompletionHandler: func(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{name + ":" + req.Params.Ref.Name + req.Params.Ref.URI}}}, nil
		},
	})
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echo of " + name}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + ":" + in.Text}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "secret"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "secret"}}}, nil, nil
	})
	s.AddPrompt(&mcp.Prompt{Name: "greet"}, func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "hello from " + name}}}}, nil
	})
	uri := "test://" + name + "/doc"
	s.AddResource(&mcp.Resource{URI: uri, Name: "doc"}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, Text: "doc of " + name}}}, nil
	})
	u := &aggUp{name: name, server: s}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	u.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.auths = append(u.auths, r.Header.Get("Authorization"))
		u.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(u.http.Close)
	return u
}

func (u *aggUp) config() Upstream {
	return Upstream{Name: u.name, URL: u.http.URL, Headers: map[string]string{"Authorization": "Bearer upstream-" + u.name}}
}

type aggAuthRT struct{ next http.RoundTripper }

func (a aggAuthRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer client-token")
	return a.next.RoundTrip(r)
}

// aggServe builds the aggregate and serves it behind a middleware that sets
// the principal, as the edge does.
func aggServe(t *testing.T, ups []Upstream, opts AggregateOptions) (*Aggregate, string) {
	t.Helper()
	a, err := NewAggregate(ups, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := "tok-1"
		if h := r.Header.Get("X-Test-Token"); h != "" {
			id = h
		}
		r = r.WithContext(policy.WithPrincipal(r.Context(), policy.Principal{TokenID: id, Name: "alice"}))
		a.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		a.Close()
		srv.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	return a, srv.URL
}

// aggConnect connects a 2025-11-25 client (a session).
func aggConnect(t *testing.T, url string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	return aggConnectAt(t, url, "2025-11-25", opts)
}

// aggConnectAt connects a go-sdk client asking for version (empty: the
// SDK's choice, 2026-07-28 where it is served).
func aggConnectAt(t *testing.T, url, version string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "downstream", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: aggAuthRT{http.DefaultTransport}}, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func aggText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func aggToolNames(t *testing.T, ctx context.Context, cs *mcp.ClientSession) []string {
	t.Helper()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

func TestAggregateRoutes(t *testing.T) {
	upA, upAB := newAggUp(t, "a"), newAggUp(t, "a_b")
	cfgA := upA.config()
	cfgA.ToolsDeny = []string{"secret"}
	var mu sync.Mutex
	var recs []CallRecord
	_, url := aggServe(t, []Upstream{cfgA, upAB.config()}, AggregateOptions{OnCall: func(r CallRecord) {
		mu.Lock()
		recs = append(recs, r)
		mu.Unlock()
	}})
	cs := aggConnect(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if got, want := cs.InitializeResult().Instructions, "## a\nUse a wisely.\n\n## a_b\nUse a_b wisely."; got != want {
		t.Errorf("instructions = %q, want %q", got, want)
	}
	if got, want := aggToolNames(t, ctx, cs), []string{"mcp_a_b_echo", "mcp_a_b_secret", "mcp_a_echo"}; !slices.Equal(got, want) {
		t.Fatalf("tools = %v, want %v", got, want)
	}
	for name, want := range map[string]string{"mcp_a_echo": "a:hi", "mcp_a_b_echo": "a_b:hi"} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"text": "hi"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := aggText(t, res); got != want || res.IsError {
			t.Errorf("%s = %q (isError %v), want %q", name, got, res.IsError, want)
		}
	}

	var prompts []string
	for p, err := range cs.Prompts(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		prompts = append(prompts, p.Name)
	}
	slices.Sort(prompts)
	if want := []string{"mcp_a_b_greet", "mcp_a_greet"}; !slices.Equal(prompts, want) {
		t.Errorf("prompts = %v, want %v", prompts, want)
	}
	pr, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "mcp_a_b_greet"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pr.Messages[0].Content.(*mcp.TextContent).Text; got != "hello from a_b" {
		t.Errorf("prompt = %q", got)
	}

	var uris []string
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, r.URI)
	}
	slices.Sort(uris)
	if want := []string{"test://a/doc", "test://a_b/doc"}; !slices.Equal(uris, want) {
		t.Errorf("resources = %v, want %v", uris, want)
	}
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://a_b/doc"})
	if err != nil {
		t.Fatal(err)
	}
	if got := rr.Contents[0].Text; got != "doc of a_b" {
		t.Errorf("read = %q", got)
	}

	mu.Lock()
	var sawCall bool
	for _, r := range recs {
		if r.Method == "tools/call" && r.Upstream == "a_b" && r.Tool == "echo" {
			sawCall = true
			if r.Route != "aggregate" || r.Outcome != OutcomeOK || r.TokenID != "tok-1" {
				t.Errorf("record = %+v", r)
			}
		}
	}
	mu.Unlock()
	if !sawCall {
		t.Error("no audit record for the call to a_b")
	}

	for _, u := range []*aggUp{upA, upAB} {
		for _, auth := range u.sawAuth() {
			if auth != "Bearer upstream-"+u.name {
				t.Errorf("upstream %s saw Authorization %q", u.name, auth)
			}
		}
	}
}

func TestAggregateToolServer(t *testing.T) {
	upA, upAB := newAggUp(t, "a"), newAggUp(t, "a_b")
	a, _ := aggServe(t, []Upstream{upA.config(), upAB.config()}, AggregateOptions{})
	for name, want := range map[string][2]string{"mcp_a_echo": {"a", "echo"}, "mcp_a_b_echo": {"a_b", "echo"}} {
		s, tool, ok := a.ToolServer(name)
		if !ok || s != want[0] || tool != want[1] {
			t.Errorf("ToolServer(%q) = %q, %q, %v", name, s, tool, ok)
		}
	}
}

func TestAggregateProgressSamplingCancel(t *testing.T) {
	up := newAggUp(t, "a")
	canceled := make(chan struct{})
	started := make(chan struct{})
	mcp.AddTool(up.server, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: "half"})
		}
		//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
		res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10, Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "question"}}}})
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "answer:" + res.Content.(*mcp.TextContent).Text}}}, nil, nil
	})
	mcp.AddTool(up.server, &mcp.Tool{Name: "block"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		close(started)
		<-ctx.Done()
		close(canceled)
		return nil, nil, ctx.Err()
	})
	_, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{})
	progress := make(chan *mcp.ProgressNotificationParams, 4)
	cs := aggConnect(t, url, &mcp.ClientOptions{
		//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "42"}}, nil
		},
		ProgressNotificationHandler: func(ctx context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	params := &mcp.CallToolParams{Name: "mcp_a_ask", Arguments: map[string]any{"text": "q"}}
	params.SetProgressToken("tok-7")
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if got := aggText(t, res); got != "answer:42" {
		t.Errorf("result = %q (isError %v)", got, res.IsError)
	}
	select {
	case p := <-progress:
		if p.ProgressToken != "tok-7" || p.Message != "half" {
			t.Errorf("progress = %+v", p)
		}
	case <-time.After(5 * time.Second):
		t.Error("no progress notification reached the client")
	}

	cctx, ccancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "mcp_a_block", Arguments: map[string]any{"text": "q"}})
		errc <- err
	}()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream tool did not start")
	}
	ccancel()
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("cancellation did not reach the upstream handler")
	}
	<-errc
}

func TestAggregateListChanged(t *testing.T) {
	up := newAggUp(t, "a")
	_, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{})
	changed := make(chan struct{}, 8)
	cs := aggConnect(t, url, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		changed <- struct{}{}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = aggToolNames(t, ctx, cs)
	mcp.AddTool(up.server, &mcp.Tool{Name: "fresh"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "new"}}}, nil, nil
	})
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-changed:
		case <-deadline:
			t.Fatal("no tools/list_changed with the new tool")
		}
		if slices.Contains(aggToolNames(t, ctx, cs), "mcp_a_fresh") {
			break
		}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_fresh", Arguments: map[string]any{"text": "q"}})
	if err != nil || aggText(t, res) != "new" {
		t.Fatalf("call fresh: %v %v", res, err)
	}
}

func TestAggregateUnreachable(t *testing.T) {
	up := newAggUp(t, "down")
	_, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{})
	cs := aggConnect(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if names := aggToolNames(t, ctx, cs); !slices.Contains(names, "mcp_down_echo") {
		t.Fatalf("tools = %v", names)
	}
	up.http.CloseClientConnections()
	up.http.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_down_echo", Arguments: map[string]any{"text": "x"}})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	// The call ends on the refused connection, not on a deadline or after
	// retries that outlast it: the error says the upstream was refused.
	if text := aggText(t, res); !res.IsError || !strings.Contains(text, `"down" could not be reached`) || !strings.Contains(text, "connection refused") {
		t.Errorf("result = %q (isError %v), want a tool error naming the upstream and the refused connection", text, res.IsError)
	}
}

func TestAggregateNeverConnected(t *testing.T) {
	// A port nothing listens on: construction does not block, Ready
	// returns after the first failed attempt, and no tools are offered.
	l := httptest.NewServer(http.NotFoundHandler())
	dead := l.URL
	l.Close()
	_, url := aggServe(t, []Upstream{{Name: "gone", URL: dead}}, AggregateOptions{})
	cs := aggConnect(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if names := aggToolNames(t, ctx, cs); len(names) != 0 {
		t.Errorf("tools = %v", names)
	}
}

func TestAggregateConditionalPrefix(t *testing.T) {
	up := newAggUp(t, "solo")
	a, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{Prefix: PrefixConditional})
	cs := aggConnect(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, want := aggToolNames(t, ctx, cs), []string{"echo", "secret"}; !slices.Equal(got, want) {
		t.Fatalf("tools = %v, want %v", got, want)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "x"}})
	if err != nil || aggText(t, res) != "solo:x" {
		t.Fatalf("call: %v %v", res, err)
	}
	if s, tool, ok := a.ToolServer("echo"); !ok || s != "solo" || tool != "echo" {
		t.Errorf("ToolServer = %q %q %v", s, tool, ok)
	}
}

func TestAggregateRefusals(t *testing.T) {
	if _, err := NewAggregate([]Upstream{{Name: "s", Command: "${AGG_TEST_UNSET_COMMAND}"}}, AggregateOptions{Lookup: func(string) (string, bool) { return "", false }}); err == nil || !strings.Contains(err.Error(), "placeholder") {
		t.Errorf("stdio command with an unset placeholder: %v", err)
	}
	if _, err := NewAggregate([]Upstream{{Name: "s", URL: "http://127.0.0.1:1/mcp"}}, AggregateOptions{Prefix: "sometimes"}); err == nil {
		t.Error("bad prefix accepted")
	}
	a, err := NewAggregate([]Upstream{{Name: "s", URL: "http://127.0.0.1:1/mcp"}}, AggregateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest("POST", "/", strings.NewReader("{}")))
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("no principal: status %d", rec.Code)
	}
}

func TestAggregateCompleteSubscribeBinding(t *testing.T) {
	upA, upAB := newAggUp(t, "a"), newAggUp(t, "a_b")
	_, url := aggServe(t, []Upstream{upA.config(), upAB.config()}, AggregateOptions{})
	updated := make(chan string, 4)
	cs := aggConnect(t, url, &mcp.ClientOptions{ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
		updated <- req.Params.URI
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	res, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "mcp_a_b_greet"}, Argument: mcp.CompleteParamsArgument{Name: "x", Value: "y"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Completion.Values; len(got) != 1 || got[0] != "a_b:greet" {
		t.Errorf("completion = %v", got)
	}
	res, err = cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "test://a/doc"}, Argument: mcp.CompleteParamsArgument{Name: "x", Value: "y"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Completion.Values; len(got) != 1 || got[0] != "a:test://a/doc" {
		t.Errorf("completion = %v", got)
	}

	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://a_b/doc"}); err != nil {
		t.Fatal(err)
	}
	_ = upAB.server.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://a_b/doc"})
	select {
	case uri := <-updated:
		if uri != "test://a_b/doc" {
			t.Errorf("updated %q", uri)
		}
	case <-time.After(5 * time.Second):
		t.Error("no resources/updated reached the subscriber")
	}

	// The session is bound to tok-1: another token presenting its id gets 404.
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("X-Test-Token", "tok-2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("other token on a bound session: status %d, want 404", resp.StatusCode)
	}
}

func TestAggregateElicitAndLog(t *testing.T) {
	up := newAggUp(t, "a")
	mcp.AddTool(up.server, &mcp.Tool{Name: "confirm"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
		_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "working"})
		res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "sure?", RequestedSchema: map[string]any{"type": "object"}})
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Action}}}, nil, nil
	})
	_, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{})
	logs := make(chan any, 4)
	cs := aggConnect(t, url, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
		},
		//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) { logs <- req.Params.Data },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_confirm", Arguments: map[string]any{"text": "q"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := aggText(t, res); got != "accept" {
		t.Errorf("result = %q (isError %v)", got, res.IsError)
	}
	select {
	case d := <-logs:
		if d != "working" {
			t.Errorf("log = %v", d)
		}
	case <-time.After(5 * time.Second):
		t.Error("no log message reached the client")
	}
}

// A resource URI belongs to the upstream that lists it, else to every
// upstream whose template matches it; each template is compiled once.
func TestResourceOwnersByTemplate(t *testing.T) {
	a := &Aggregate{
		resOwner:  map[string]string{"file:///listed": "c"},
		tmplOwner: map[string]string{"file:///{path}": "a", "db://{table}/rows": "b", "file:///{+rest}": "b", "bad{": "c"},
		tmplMatch: map[string]*regexp.Regexp{},
	}
	for range 2 { // the second time from the compiled templates
		if got := a.ResourceOwners("file:///etc"); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("file:///etc: %v, want [a b]", got)
		}
		if got := a.ResourceOwners("db://users/rows"); !slices.Equal(got, []string{"b"}) {
			t.Fatalf("db://users/rows: %v, want [b]", got)
		}
		if got := a.ResourceOwners("file:///listed"); !slices.Equal(got, []string{"c"}) {
			t.Fatalf("a listed resource: %v, want its lister", got)
		}
		if got := a.ResourceOwners("http://elsewhere/"); len(got) != 0 {
			t.Fatalf("a URI no template matches: %v", got)
		}
	}
	if len(a.tmplMatch) != 4 {
		t.Fatalf("compiled %d templates, want each of the 4 once", len(a.tmplMatch))
	}
}

// AggregateOptions.Instructions decides what the route merges of each
// upstream's instructions: it is told each upstream's own as its catalog
// connects (before any client asks), and the route serves what it
// returns, at both protocol versions.
func TestAggregateInstructionsAreDecided(t *testing.T) {
	a, b := newAggUp(t, "a"), newAggUp(t, "b")
	var mu sync.Mutex
	seen := map[string]string{}
	decide := func(upstream, instructions string) string {
		mu.Lock()
		seen[upstream] = instructions
		mu.Unlock()
		if upstream == "b" {
			return "Use b as pinned."
		}
		return instructions
	}
	_, url := aggServe(t, []Upstream{a.config(), b.config()}, AggregateOptions{Instructions: decide})
	mu.Lock()
	if seen["a"] != "Use a wisely." || seen["b"] != "Use b wisely." {
		t.Errorf("told at connection: %q", seen)
	}
	mu.Unlock()
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		cs := aggConnectAt(t, url, version, nil)
		if got, want := cs.InitializeResult().Instructions, "## a\nUse a wisely.\n\n## b\nUse b as pinned."; got != want {
			t.Errorf("%s: instructions = %q, want %q", version, got, want)
		}
	}
}
