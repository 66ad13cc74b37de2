package broker

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mrtrUp is a real go-sdk upstream, stateless (it speaks 2026-07-28 and
// 2025-11-25) or stateful (2025-11-25 only), with multi-round-trip tools,
// recording the protocol version and requestState of every call it sees.
type mrtrUp struct {
	failed chan struct{}   // an ask_classic whose elicitation failed
	stop   context.Context // done when the test ends
	mu     sync.Mutex
	seen   []string // "<version> <tool> state=<requestState>"
	ups    Upstream
}

func (u *mrtrUp) saw() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

func newMRTRUp(t *testing.T, name string, stateless bool) *mrtrUp {
	t.Helper()
	u := &mrtrUp{failed: make(chan struct{}, 64)}
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, nil)
	nameSchema := &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{"name": {Type: "string"}}, Required: []string{"name"}}
	accepted := func(r mcp.InputResponseMap, key string) map[string]any {
		er, ok := r[key].(*mcp.ElicitResult)
		if !ok || er == nil || er.Action != "accept" {
			return nil
		}
		return er.Content
	}
	record := func(req *mcp.CallToolRequest) {
		v := ""
		if ip := req.Session.InitializeParams(); ip != nil {
			v = ip.ProtocolVersion
		}
		u.mu.Lock()
		u.seen = append(u.seen, fmt.Sprintf("%s %s state=%s", v, req.Params.Name, req.Params.RequestState))
		u.mu.Unlock()
	}
	// Two rounds, the state carrying what round one answered (as the
	// conformance server's test_input_required_result_multi_round).
	mcp.AddTool(s, &mcp.Tool{Name: "two_rounds"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		record(req)
		switch st := req.Params.RequestState; {
		case st == "":
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"step1": &mcp.ElicitParams{Message: "name?", RequestedSchema: nameSchema}}, RequestState: "round=1"}, nil, nil
		case st == "round=1":
			n, _ := accepted(req.Params.InputResponses, "step1")["name"].(string)
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"step2": &mcp.ElicitParams{Message: "again?", RequestedSchema: nameSchema}}, RequestState: "round=2;" + n}, nil, nil
		case strings.HasPrefix(st, "round=2;"):
			n, _ := accepted(req.Params.InputResponses, "step2")["name"].(string)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done " + strings.TrimPrefix(st, "round=2;") + "+" + n}}}, nil, nil
		}
		return nil, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "bad requestState " + req.Params.RequestState}
	})
	mcp.AddTool(s, &mcp.Tool{Name: "roots_and_sampling"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		record(req)
		//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
		roots, rok := req.Params.InputResponses["roots"].(*mcp.ListRootsResult)
		//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
		sample, sok := req.Params.InputResponses["sample"].(*mcp.CreateMessageWithToolsResult)
		if rok && sok && req.Params.RequestState == "rs" {
			text := ""
			for _, c := range sample.Content {
				if tc, ok := c.(*mcp.TextContent); ok {
					text += tc.Text
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("roots=%d sample=%s", len(roots.Roots), text)}}}, nil, nil
		}
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
			//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
			"roots": &mcp.ListRootsParams{},
			//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
			"sample": &mcp.CreateMessageParams{Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "hi"}}}, MaxTokens: 10},
		}, RequestState: "rs"}, nil, nil
	})
	// A 2025-11-25 server's way: a request to the client during the call.
	mcp.AddTool(s, &mcp.Tool{Name: "ask_classic"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		record(req)
		// Bounded by the test too: go-sdk's server waits for a handler
		// whose request to the client got no answer (a client that left)
		// before it ends the session.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(u.stop, cancel)
		defer stop()
		er, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "classic?", RequestedSchema: nameSchema})
		if err != nil {
			u.mu.Lock()
			u.seen = append(u.seen, "ask_classic failed: "+err.Error())
			u.mu.Unlock()
			select {
			case u.failed <- struct{}{}:
			default:
			}
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("got %v", er.Content["name"])}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: stateless})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	stopCtx, stop := context.WithCancel(context.Background())
	u.stop = stopCtx
	t.Cleanup(stop) // before srv.Close
	u.ups = Upstream{Name: name, URL: srv.URL}
	return u
}

//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
func legacyClient(t *testing.T, url string, opts *mcp.ClientOptions, roots ...*mcp.Root) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "downstream", Version: "1"}, opts)
	//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
	c.AddRoots(roots...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// A 2025-11-25 client through the aggregate to a 2026-07-28 upstream: the
// upstream's input requests are put to the client over its session, round
// after round, and each retry carries the requestState the upstream gave.
func TestAggregateLegacyClientModernUpstreamMRTR(t *testing.T) {
	up := newMRTRUp(t, "m", true)
	_, url := aggServe(t, []Upstream{up.ups}, AggregateOptions{})
	var asked []string
	var mu sync.Mutex
	cs := legacyClient(t, url, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			asked = append(asked, req.Params.Message)
			n := len(asked)
			mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": fmt.Sprintf("n%d", n)}}, nil
		},
		//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			//lint:ignore SA1019 the test checks that the aggregated route still relays sampling, which SEP-2577 deprecates but earlier protocol versions use
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "sampled"}}, nil
		},
		//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
	}, &mcp.Root{URI: "file:///a"}, &mcp.Root{URI: "file:///b"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_m_two_rounds"})
	if err != nil {
		t.Fatal(err)
	}
	if got := aggText(t, res); res.IsError || got != "done n1+n2" {
		t.Fatalf("two_rounds = %q (isError %v), want \"done n1+n2\"", got, res.IsError)
	}
	if len(asked) != 2 || asked[0] != "name?" || asked[1] != "again?" {
		t.Fatalf("the client was asked %q, want the two rounds' questions", asked)
	}
	want := []string{"2026-07-28 two_rounds state=", "2026-07-28 two_rounds state=round=1", "2026-07-28 two_rounds state=round=2;n1"}
	if got := up.saw(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the upstream saw %q, want %q", got, want)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_m_roots_and_sampling"})
	if err != nil {
		t.Fatal(err)
	}
	if got := aggText(t, res); res.IsError || got != "roots=2 sample=sampled" {
		t.Fatalf("roots_and_sampling = %q (isError %v)", got, res.IsError)
	}
}

// A client that declared no elicitation capability is not asked: the call
// fails with a tool error that names the upstream, and the upstream sees
// no retry.
func TestAggregateLegacyClientWithoutElicitationMRTR(t *testing.T) {
	up := newMRTRUp(t, "m", true)
	_, url := aggServe(t, []Upstream{up.ups}, AggregateOptions{})
	cs := legacyClient(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_m_two_rounds"})
	if err == nil && !res.IsError {
		t.Fatalf("the call succeeded (%q) for a client that cannot answer an elicitation", aggText(t, res))
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	} else {
		msg = aggText(t, res)
	}
	if !strings.Contains(msg, "elicitation") {
		t.Fatalf("the failure %q does not say the client lacks elicitation", msg)
	}
	if got := up.saw(); len(got) != 1 {
		t.Fatalf("the upstream saw %q, want only the first call", got)
	}
}

// The downstream client's per-request _meta keys never reach an upstream
// as the broker client's; its capabilities reach a 2026-07-28 upstream
// only, and a 2026-07-28 request that declares none declares none there.
func TestUpstreamMetaKeys(t *testing.T) {
	modernUp, legacyUp := newMRTRUp(t, "m", true), newMRTRUp(t, "l", false)
	connect := func(u Upstream) *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "b", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: u.URL, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	mcs, lcs := connect(modernUp.ups), connect(legacyUp.ups)
	if mcs.InitializeResult().ProtocolVersion != protocolModern || lcs.InitializeResult().ProtocolVersion >= protocolModern {
		t.Fatalf("versions %s %s", mcs.InitializeResult().ProtocolVersion, lcs.InitializeResult().ProtocolVersion)
	}
	caps := map[string]any{"elicitation": map[string]any{}}
	full := mcp.Meta{mcp.MetaKeyProtocolVersion: "2026-07-28", mcp.MetaKeyClientInfo: map[string]any{"name": "x"}, mcp.MetaKeyClientCapabilities: caps, "progressToken": "p"}
	got := upstreamMeta(full, mcs, nil)
	if _, ok := got[mcp.MetaKeyProtocolVersion]; ok || got["progressToken"] != "p" || got[mcp.MetaKeyClientCapabilities] == nil {
		t.Errorf("to a 2026-07-28 upstream: %v", got)
	}
	if _, ok := got[mcp.MetaKeyClientInfo]; ok {
		t.Errorf("clientInfo forwarded: %v", got)
	}
	got = upstreamMeta(full, lcs, nil)
	if len(got) != 1 || got["progressToken"] != "p" {
		t.Errorf("to a 2025-11-25 upstream: %v, want only the progress token", got)
	}
	if _, ok := full[mcp.MetaKeyProtocolVersion]; !ok {
		t.Error("upstreamMeta changed its argument")
	}
	plain := mcp.Meta{"progressToken": "p"}
	if got := upstreamMeta(plain, lcs, nil); len(got) != 1 {
		t.Errorf("a plain _meta to a legacy upstream: %v", got)
	}

	// go-sdk's client reads no CreateTaskResult: a call it makes never
	// declares the Tasks extension, whatever the client declared, and
	// keeps the client's other capabilities and extensions.
	tasks := map[string]any{"elicitation": map[string]any{}, "extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}, "x/other": map[string]any{}}}
	for _, m := range []mcp.Meta{
		{mcp.MetaKeyClientCapabilities: tasks},
		{mcp.MetaKeyProtocolVersion: "2026-07-28", mcp.MetaKeyClientCapabilities: tasks},
	} {
		got := upstreamMeta(m, mcs, nil)
		c, _ := got[mcp.MetaKeyClientCapabilities].(map[string]any)
		ext, _ := c["extensions"].(map[string]any)
		if _, ok := ext["io.modelcontextprotocol/tasks"]; ok || ext["x/other"] == nil || c["elicitation"] == nil {
			t.Errorf("the go-sdk path forwards %v, want the client's capabilities without the Tasks extension", got)
		}
	}
	if _, ok := tasks["extensions"].(map[string]any)["io.modelcontextprotocol/tasks"]; !ok {
		t.Error("upstreamMeta changed the client's capabilities")
	}
}
