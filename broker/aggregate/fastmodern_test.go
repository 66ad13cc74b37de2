package aggregate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// modernUp is a stateless go-sdk server (it speaks 2026-07-28 and
// 2025-11-25) that records the headers and body of each tools/call POST.
type modernUp struct {
	name string
	url  string
	mu   sync.Mutex
	seen []seenCall
}

type seenCall struct {
	header http.Header
	body   []byte
}

func (u *modernUp) calls() []seenCall {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenCall(nil), u.seen...)
}

func newModernUp(t *testing.T, name string) *modernUp {
	t.Helper()
	u := &modernUp{name: name}
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, nil)
	echoSchema := &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{
		"text":   {Type: "string"},
		"region": {Type: "string", Extra: map[string]any{"x-mcp-header": "Region"}},
	}}
	s.AddTool(&mcp.Tool{Name: "echo", InputSchema: echoSchema}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args struct{ Text, Region string }
		_ = json.Unmarshal(req.Params.Arguments, &args)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + ":" + args.Text + "@" + args.Region}}}, nil
	})
	obj := &jsonschema.Schema{Type: "object"}
	s.AddTool(&mcp.Tool{Name: "fail", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "it broke"}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "image", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "a picture"},
			&mcp.ImageContent{Data: []byte("png"), MIMEType: "image/png"},
		}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "big", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", 64<<10)}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "http500", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "never served"}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "progress", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Message: "half", Progress: 1, Total: 2}); err != nil {
				return nil, err
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
	})
	nameSchema := &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{"name": {Type: "string"}}, Required: []string{"name"}}
	s.AddTool(&mcp.Tool{Name: "ask", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if req.Params.RequestState == "" {
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"who": &mcp.ElicitParams{Message: "name?", RequestedSchema: nameSchema}}, RequestState: "st-1"}, nil
		}
		er, _ := req.Params.InputResponses["who"].(*mcp.ElicitResult)
		got := ""
		if er != nil {
			got, _ = er.Content["name"].(string)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "hello " + got + " state=" + req.Params.RequestState}}}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Method") == "tools/call" {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			u.mu.Lock()
			u.seen = append(u.seen, seenCall{header: r.Header.Clone(), body: body})
			u.mu.Unlock()
			if r.Header.Get("Mcp-Name") == "http500" {
				http.Error(w, "boom", http.StatusInternalServerError)
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u.url = srv.URL
	return u
}

// aggServeEdge is aggServe with the edge's one reading of the body in the
// request context, as the edge puts it there.
func aggServeEdge(t *testing.T, ups []upstream.Config, opts Options) (*Aggregate, string) {
	t.Helper()
	a, err := New(ups, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := "tok-1"
		if h := r.Header.Get("X-Test-Token"); h != "" {
			id = h
		}
		ctx := policy.WithPrincipal(r.Context(), policy.Principal{TokenID: id, Name: "alice"})
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if b, err := message.Read(body); err == nil {
				ctx = message.NewContext(ctx, b)
			}
		}
		a.ServeHTTP(w, r.WithContext(ctx))
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

// outcome is what a client sees of a call: the result as JSON, or the
// error.
func callOutcome(t *testing.T, cs *mcp.ClientSession, params *mcp.CallToolParams) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		var re *jsonrpc.Error
		if errors.As(err, &re) {
			return fmt.Sprintf("JSON-RPC error %d", re.Code)
		}
		return "error: " + err.Error()
	}
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// The same calls through the fast path and through go-sdk give the client
// the same outcomes, and the fast path was taken for each.
func TestAggregateModernFastMatchesSlow(t *testing.T) {
	a1 := newModernUp(t, "a")
	b1 := newModernUp(t, "b")
	var recMu sync.Mutex
	var recs []upstream.CallRecord
	a, url := aggServeEdge(t, []upstream.Config{
		{Name: "a", URL: a1.url, MaxResponse: 16 << 10},
		{Name: "b", URL: b1.url},
	}, Options{OnCall: func(r upstream.CallRecord) { recMu.Lock(); recs = append(recs, r); recMu.Unlock() }})
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})

	// The first call opens the principal session: the go-sdk path's.
	if got := callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "warm"}}); !strings.Contains(got, "a:warm@") {
		t.Fatalf("warm-up call: %s", got)
	}
	// And the catalog of b is connected, but not the principal's session
	// to b: open it.
	if got := callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_b_echo", Arguments: map[string]any{"text": "warm"}}); !strings.Contains(got, "b:warm@") {
		t.Fatalf("warm-up call to b: %s", got)
	}

	cases := []struct {
		name   string
		params *mcp.CallToolParams
		want   string // in the outcome
		// The fast path's tool error is of the same shape as go-sdk's and
		// names the same upstream, but says more: go-sdk's client loses
		// the answer limit's error ("request terminated without
		// response"), the fast path names max_response.
		sameShape bool
	}{
		{"text", &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "hi"}}, `a:hi@`, false},
		{"other upstream", &mcp.CallToolParams{Name: "mcp_b_echo", Arguments: map[string]any{"text": "hi"}}, `b:hi@`, false},
		{"tool error", &mcp.CallToolParams{Name: "mcp_a_fail"}, `"isError":true`, false},
		{"normalized content", &mcp.CallToolParams{Name: "mcp_a_image"}, `"image/png"`, false},
		{"input required", &mcp.CallToolParams{Name: "mcp_a_ask"}, `"requestState":"st-1"`, false},
		{"retry", &mcp.CallToolParams{Name: "mcp_a_ask", RequestState: "st-1",
			InputResponses: mcp.InputResponseMap{"who": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "bo"}}}}, `hello bo state=st-1`, false},
		{"upstream HTTP error", &mcp.CallToolParams{Name: "mcp_a_http500"}, `JSON-RPC error -32005`, false},
		{"over max_response", &mcp.CallToolParams{Name: "mcp_a_big"}, `max_response`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A call over a limit drops the principal's upstream session;
			// the go-sdk path opens another, which the fast path needs.
			warm := func() {
				a.noModernFast.Store(true)
				callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "w"}})
				a.noModernFast.Store(false)
			}
			warm()
			before := a.modernFastCalls.Load()
			fast := callOutcome(t, cs, c.params)
			if a.modernFastCalls.Load() != before+1 {
				t.Fatalf("the call did not take the fast path: %s", fast)
			}
			warm()
			a.noModernFast.Store(true)
			slow := callOutcome(t, cs, c.params)
			a.noModernFast.Store(false)
			if a.modernFastCalls.Load() != before+1 {
				t.Fatalf("the go-sdk call took the fast path")
			}
			if c.sameShape {
				if shape(t, fast) != shape(t, slow) {
					t.Fatalf("fast path:\n%s\ngo-sdk path:\n%s", fast, slow)
				}
			} else if fast != slow {
				t.Fatalf("fast path:\n%s\ngo-sdk path:\n%s", fast, slow)
			}
			if !strings.Contains(fast, c.want) {
				t.Fatalf("outcome %s, want %q in it", fast, c.want)
			}
		})
	}
	// The audit records of the fast calls name the upstream and the tool.
	recMu.Lock()
	defer recMu.Unlock()
	var failOK bool
	for _, r := range recs {
		if r.Upstream == "a" && r.Tool == "fail" && r.Outcome == upstream.OutcomeError && r.TokenID == "tok-1" {
			failOK = true
		}
	}
	if !failOK {
		t.Fatalf("no audit record of the tool error: %+v", recs)
	}
}

// shape is a tool error's outcome without its text: isError, resultType,
// serverInfo, and whether the text names upstream "a".
func shape(t *testing.T, outcome string) string {
	t.Helper()
	var res struct {
		Meta       map[string]any `json:"_meta"`
		Content    []struct{ Type, Text string }
		IsError    bool   `json:"isError"`
		ResultType string `json:"resultType"`
	}
	if err := json.Unmarshal([]byte(outcome), &res); err != nil || len(res.Content) != 1 {
		t.Fatalf("not a tool result with one block: %s", outcome)
	}
	return fmt.Sprint(res.Meta, res.Content[0].Type, res.IsError, res.ResultType, strings.Contains(res.Content[0].Text, `upstream MCP server "a"`))
}

// modernPost sends a raw 2026-07-28 tools/call, with extra headers.
func modernPost(t *testing.T, url, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", protocolModern)
	req.Header.Set("Mcp-Method", "tools/call")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

const modernMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`

// The fast path forwards the client's Mcp-Param-* headers and no other
// header of the client, renames the tool for the upstream only, and keeps
// the client's id.
func TestAggregateModernFastHeaders(t *testing.T) {
	up := newModernUp(t, "a")
	a, url := aggServeEdge(t, []upstream.Config{{Name: "a", URL: up.url}}, Options{})
	cs := modernClient(t, url, "tok-1", nil)
	callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "warm"}})

	before := a.modernFastCalls.Load()
	code, body := modernPost(t, url, `{"jsonrpc":"2.0","id":"client-7","method":"tools/call","params":{`+modernMeta+`,"name":"mcp_a_echo","arguments":{"text":"t","region":"eu"}}}`,
		map[string]string{"Mcp-Name": "mcp_a_echo", "Mcp-Param-Region": "eu", "X-Secret": "s3cret", "Authorization": "Bearer client-token", "Cookie": "c=1"})
	if code != http.StatusOK || !strings.Contains(body, `"id":"client-7"`) || !strings.Contains(body, `a:t@eu`) {
		t.Fatalf("HTTP %d %s", code, body)
	}
	if a.modernFastCalls.Load() != before+1 {
		t.Fatal("the call did not take the fast path")
	}
	calls := up.calls()
	last := calls[len(calls)-1]
	if got := last.header.Get("Mcp-Param-Region"); got != "eu" {
		t.Fatalf("Mcp-Param-Region upstream = %q, want eu", got)
	}
	for _, h := range []string{"X-Secret", "Authorization", "Cookie", "X-Test-Token"} {
		if v := last.header.Get(h); v != "" {
			t.Fatalf("the client's %s header reached the upstream: %q", h, v)
		}
	}
	if got := last.header.Get("Mcp-Name"); got != "echo" {
		t.Fatalf("Mcp-Name upstream = %q, want echo", got)
	}
	var sent struct {
		ID     json.RawMessage `json:"id"`
		Params struct {
			Name string          `json:"name"`
			Meta json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	if err := json.Unmarshal(last.body, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.Params.Name != "echo" || string(sent.ID) != `"client-7"` || !bytes.Contains(sent.Params.Meta, []byte(`"raw"`)) {
		t.Fatalf("the upstream got %s", last.body)
	}
}

// The rename cannot reach a tool the route does not offer: an unprefixed
// name, another upstream's prefix stacked on, a name spelled with escapes,
// or params the fast path does not carry all go to go-sdk, which answers
// as it does for any call.
func TestAggregateModernFastRenameRefusals(t *testing.T) {
	up := newModernUp(t, "a")
	other := newModernUp(t, "b")
	a, url := aggServeEdge(t, []upstream.Config{{Name: "a", URL: up.url}, {Name: "b", URL: other.url}}, Options{})
	cs := modernClient(t, url, "tok-1", nil)
	callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "warm"}})
	callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_b_echo", Arguments: map[string]any{"text": "warm"}})
	upBefore, otherBefore := len(up.calls()), len(other.calls())

	for _, c := range []struct{ name, params string }{
		{"echo", `"name":"echo"`},
		{"mcp_a_mcp_b_echo", `"name":"mcp_a_mcp_b_echo"`},
		{"mcp_b_echo", `"na\u006de":"mcp_b_echo"`},
		{"mcp_a_echo", `"name":"mcp_a_echo","task":{"ttl":1}`},
	} {
		before := a.modernFastCalls.Load()
		code, body := modernPost(t, url, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{`+modernMeta+`,`+c.params+`,"arguments":{"text":"x"}}}`,
			map[string]string{"Mcp-Name": c.name})
		if a.modernFastCalls.Load() != before {
			t.Fatalf("%s: the fast path took it (HTTP %d %s)", c.params, code, body)
		}
		if c.name == "echo" || c.name == "mcp_a_mcp_b_echo" {
			if strings.Contains(body, ":x@") {
				t.Fatalf("%s reached a tool: %s", c.params, body)
			}
		}
	}
	// The unknown names reached no upstream at all.
	if n := len(up.calls()) - upBefore; n > 1 {
		t.Fatalf("upstream a got %d calls, want at most the one of the call with a task", n)
	}
	for _, c := range other.calls()[otherBefore:] {
		if !bytes.Contains(c.body, []byte(`"name":"echo"`)) {
			t.Fatalf("upstream b got %s", c.body)
		}
	}
}

// The upstream's progress for a call on the fast path reaches the client's
// request, with the client's own progress token.
func TestAggregateModernFastProgress(t *testing.T) {
	up := newModernUp(t, "a")
	a, url := aggServeEdge(t, []upstream.Config{{Name: "a", URL: up.url}}, Options{})
	progress := make(chan any, 4)
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params.ProgressToken
		},
	})
	callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "warm"}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := a.modernFastCalls.Load()
	params := &mcp.CallToolParams{Name: "mcp_a_progress"}
	params.SetProgressToken("p-7")
	res, err := cs.CallTool(ctx, params)
	if err != nil || aggText(t, res) != "done" {
		t.Fatalf("progress tool: %v %v", res, err)
	}
	if a.modernFastCalls.Load() != before+1 {
		t.Fatal("the call did not take the fast path")
	}
	select {
	case tok := <-progress:
		if tok != "p-7" {
			t.Fatalf("progress token %v, want p-7", tok)
		}
	case <-ctx.Done():
		t.Fatal("no progress reached the client")
	}
}

// An answer that does not fit in the answer budget fails alike on both
// paths: a tool error naming the upstream, and the budget is given back.
func TestAggregateModernFastAnswerBudget(t *testing.T) {
	up := newModernUp(t, "a")
	budget := answerlimit.NewBudget(1 << 20)
	a, url := aggServeEdge(t, []upstream.Config{{Name: "a", URL: up.url}}, Options{AnswerBudget: budget})
	cs := modernClient(t, url, "tok-1", nil)
	warm := func() {
		a.noModernFast.Store(true)
		if got := callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "w"}}); !strings.Contains(got, "a:w@") {
			t.Fatalf("warm-up call: %s", got)
		}
		a.noModernFast.Store(false)
	}
	warm()
	// All but 32 KiB of the budget is held: the 64 KiB answer of "big"
	// cannot fit, small answers can.
	held := int64(1<<20 - 32<<10)
	if !budget.Take(held) {
		t.Fatal("could not hold the budget")
	}
	defer budget.Give(held)
	used := budget.Used()
	before := a.modernFastCalls.Load()
	fast := callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_a_big"})
	if a.modernFastCalls.Load() != before+1 {
		t.Fatalf("the call did not take the fast path: %s", fast)
	}
	if !strings.Contains(fast, "max_inflight_response") || !strings.Contains(fast, `\"a\"`) {
		t.Fatalf("fast path: %s", fast)
	}
	warm()
	a.noModernFast.Store(true)
	slow := callOutcome(t, cs, &mcp.CallToolParams{Name: "mcp_a_big"})
	a.noModernFast.Store(false)
	if shape(t, fast) != shape(t, slow) {
		t.Fatalf("fast path:\n%s\ngo-sdk path:\n%s", fast, slow)
	}
	if got := budget.Used(); got != used {
		t.Fatalf("the budget holds %d bytes after the calls, want %d", got, used)
	}
}
