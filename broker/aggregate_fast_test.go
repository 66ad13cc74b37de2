package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fastUp is a go-sdk upstream whose requests are counted by the id they
// carry: the fast path's ids are strings "zidane-N", go-sdk's are numbers.
type fastUp struct {
	name   string
	server *mcp.Server
	http   *httptest.Server
	fast   atomic.Int64 // tools/call requests with a fast-path id
	sdk    atomic.Int64 // tools/call requests with another id

	canceled chan struct{}
	started  chan struct{}
}

// newFastUp starts an upstream with tools echo, image (a PNG declared as
// JPEG), fail (a JSON-RPC error), progress (a progress notification and a
// log message before its answer), empty (no content) and block (waits for
// its cancellation). jsonResponse picks application/json answers over
// event streams.
func newFastUp(t *testing.T, name string, jsonResponse bool) *fastUp {
	t.Helper()
	u := &fastUp{name: name, canceled: make(chan struct{}, 8), started: make(chan struct{}, 8)}
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + ":" + in.Text}}}, nil, nil
	})
	png := upstreamtest.PNGBytes(t)
	mcp.AddTool(s, &mcp.Tool{Name: "image"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "look"}, &mcp.ImageContent{Data: png, MIMEType: "image/jpeg"}}}, nil, nil
	})
	s.AddTool(&mcp.Tool{Name: "fail", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "fail refuses " + name}
	})
	s.AddTool(&mcp.Tool{Name: "empty", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{IsError: true}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "progress"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: "half"})
		}
		//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
		_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "working"})
		//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
		_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "debug", Data: "noise"})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "block"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		u.started <- struct{}{}
		<-ctx.Done()
		u.canceled <- struct{}{}
		return nil, nil, ctx.Err()
	})
	u.server = s
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{JSONResponse: jsonResponse})
	u.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"tools/call"`)) {
				if bytes.Contains(body, []byte(`"id":"zidane-`)) {
					u.fast.Add(1)
				} else {
					u.sdk.Add(1)
				}
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(u.http.Close)
	return u
}

func (u *fastUp) config() Upstream { return Upstream{Name: u.name, URL: u.http.URL} }

// recorder collects call records.
type recorder struct {
	mu   sync.Mutex
	recs []CallRecord
}

func (r *recorder) add(c CallRecord) { r.mu.Lock(); r.recs = append(r.recs, c); r.mu.Unlock() }

func (r *recorder) last(tool string) (CallRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.recs) - 1; i >= 0; i-- {
		if r.recs[i].Tool == tool {
			return r.recs[i], true
		}
	}
	return CallRecord{}, false
}

// TestAggregateFastPath calls every kind of tool through a client that
// offers neither sampling nor elicitation (the fast path, after the first
// call opens the upstream session) and through one that offers
// elicitation (go-sdk all the way), against upstreams answering with event
// streams and with JSON, and wants the same answers and records from both.
func TestAggregateFastPath(t *testing.T) {
	for _, mode := range []struct {
		name string
		json bool
	}{{"sse", false}, {"json", true}} {
		t.Run(mode.name, func(t *testing.T) {
			up := newFastUp(t, "a", mode.json)
			rec := &recorder{}
			_, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{OnCall: rec.add})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			type answer struct {
				text, mime string
				isError    bool
				err        string
				rec        CallRecord
			}
			run := func(cs *mcp.ClientSession) map[string]answer {
				out := map[string]answer{}
				for _, tool := range []string{"echo", "echo", "image", "fail", "empty"} {
					res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_" + tool, Arguments: map[string]any{"text": "hi"}})
					var a answer
					if err != nil {
						a.err = err.Error()
					} else {
						a.text, a.isError = aggText(t, res), res.IsError
						if res.Content == nil {
							a.text = "<nil content>"
						}
						for _, c := range res.Content {
							if ic, ok := c.(*mcp.ImageContent); ok {
								a.mime = ic.MIMEType
							}
						}
					}
					r, ok := rec.last(tool)
					if !ok {
						t.Errorf("no call record for %s", tool)
					}
					r.Duration = 0
					a.rec = r
					out[tool] = a
				}
				return out
			}

			fast := aggConnect(t, url, nil)
			before := up.fast.Load()
			got := run(fast)
			if n := up.fast.Load() - before; n < 4 {
				t.Errorf("%d calls took the fast path, want at least 4 of 5", n)
			}
			slowBefore := up.fast.Load()
			slow := aggConnect(t, url, &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "decline"}, nil
			}})
			want := run(slow)
			if n := up.fast.Load() - slowBefore; n != 0 {
				t.Errorf("%d calls of a client that offers elicitation took the fast path", n)
			}
			// go-sdk's server re-wraps an upstream's JSON-RPC error in its
			// client's message ("calling ...: ", and drops its data); the
			// fast path passes it as the upstream gave it.
			const wrap = `calling "tools/call": `
			if w := want["fail"]; strings.HasPrefix(w.rec.Detail, wrap) {
				w.rec.Detail = strings.TrimPrefix(w.rec.Detail, wrap)
				w.err = strings.Replace(w.err, wrap+wrap, wrap, 1)
				want["fail"] = w
			}
			for tool, w := range want {
				if g := got[tool]; g != w {
					t.Errorf("%s: fast path %+v, go-sdk path %+v", tool, g, w)
				}
			}
			if a := got["echo"]; a.text != "a:hi" || a.isError || a.rec.Outcome != OutcomeOK || a.rec.TokenID != "tok-1" || a.rec.Route != RouteAggregate || a.rec.Upstream != "a" {
				t.Errorf("echo = %+v", a)
			}
			if a := got["image"]; a.mime != "image/png" {
				t.Errorf("image = %+v, want its media type repaired to image/png", a)
			}
			if a := got["fail"]; !strings.Contains(a.err, "fail refuses a") || a.rec.Outcome != OutcomeError {
				t.Errorf("fail = %+v, want the upstream's JSON-RPC error", a)
			}
			if a := got["empty"]; !a.isError || a.text != "" || a.rec.Detail != "the tool reported an error" {
				t.Errorf("empty = %+v", a)
			}
		})
	}
}

// TestAggregateFastPathProgressLogCancel relays the upstream's progress
// and log notifications of a fast call, and its cancellation both ways.
func TestAggregateFastPathProgressLogCancel(t *testing.T) {
	up := newFastUp(t, "a", false)
	rec := &recorder{}
	_, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{OnCall: rec.add})
	progress := make(chan *mcp.ProgressNotificationParams, 4)
	logs := make(chan any, 4)
	cs := aggConnect(t, url, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) { progress <- req.Params },
		//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) { logs <- req.Params.Data },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	// The first call opens the upstream session (go-sdk path).
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "x"}}); err != nil {
		t.Fatal(err)
	}
	before := up.fast.Load()
	params := &mcp.CallToolParams{Name: "mcp_a_progress", Arguments: map[string]any{"text": "q"}}
	params.SetProgressToken("tok-7")
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if up.fast.Load() == before {
		t.Fatal("the call did not take the fast path")
	}
	if got := aggText(t, res); got != "done" {
		t.Errorf("result = %q", got)
	}
	select {
	case p := <-progress:
		if p.ProgressToken != "tok-7" || p.Message != "half" {
			t.Errorf("progress = %+v", p)
		}
	case <-ctx.Done():
		t.Fatal("no progress notification reached the client")
	}
	select {
	case d := <-logs:
		if d != "working" {
			t.Errorf("log = %v, want the info message only", d)
		}
	case <-ctx.Done():
		t.Fatal("no log message reached the client")
	}
	select {
	case d := <-logs:
		t.Errorf("a log message below the session's level reached the client: %v", d)
	default:
	}

	cctx, ccancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "mcp_a_block", Arguments: map[string]any{"text": "q"}})
		errc <- err
	}()
	select {
	case <-up.started:
	case <-ctx.Done():
		t.Fatal("the upstream tool did not start")
	}
	ccancel()
	select {
	case <-up.canceled:
	case <-ctx.Done():
		t.Fatal("cancellation did not reach the upstream handler")
	}
	if err := <-errc; err == nil {
		t.Error("the cancelled call succeeded")
	}
	// The session is still usable.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "after"}})
	if err != nil || aggText(t, res) != "a:after" {
		t.Fatalf("call after the cancellation: %v, %v", res, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, ok := rec.last("block")
		if ok && r.Outcome == OutcomeCanceled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record of the cancelled call = %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAggregateFastPathLostSession: when the upstream forgets the session
// (HTTP 404), the fast call gets a tool error naming the upstream and the
// next call opens a new session; when the upstream is gone, a tool error.
func TestAggregateFastPathLostSession(t *testing.T) {
	up := newFastUp(t, "a", true)
	_, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{})
	cs := aggConnect(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := func(text string) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": text}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	call("open")
	before := up.fast.Load()
	res := call("x")
	if up.fast.Load() == before || res.IsError {
		t.Fatalf("a call on the open session: fast %v, %q", up.fast.Load() != before, aggText(t, res))
	}
	// The upstream forgets every session (the catalog's too, which
	// reconnects by itself).
	for ss := range up.server.Sessions() {
		ss.Close()
	}
	// The call either finds the session gone (a tool error naming the
	// upstream) or, when the broker noticed first (its upstream session's
	// stream ended), runs on a new session.
	res = call("lost")
	if got := aggText(t, res); !(res.IsError && strings.Contains(got, `"a"`)) && !(!res.IsError && got == "a:lost") {
		t.Errorf("call on a forgotten session = %q (isError %v), want a tool error naming the upstream or the call's answer", got, res.IsError)
	}
	if res := call("again"); res.IsError || aggText(t, res) != "a:again" {
		t.Errorf("call after a lost session = %q (isError %v)", aggText(t, res), res.IsError)
	}

	up.http.CloseClientConnections()
	up.http.Close()
	res = call("down")
	if !res.IsError || !strings.Contains(aggText(t, res), `"a"`) {
		t.Errorf("call to a stopped upstream = %q (isError %v), want a tool error naming it", aggText(t, res), res.IsError)
	}
}

// The fast path reads an upstream's answer as the edge's filter does
// (message.ReadAnswer): its id is a value, however the server spells it.
func TestFastAnswerReadsTheIDAsAValue(t *testing.T) {
	upID, err := message.ParseID([]byte(`"zidane-7"`))
	if err != nil {
		t.Fatal(err)
	}
	res, rpcErr, err := fastAnswer([]byte(`{"jsonrpc":"2.0","id":"zidane-\u0037","result":{"content":[]}}`), upID)
	if err != nil || rpcErr != nil || string(res) != `{"content":[]}` {
		t.Errorf("an escaped spelling of the id: result %s, error %s, %v", res, rpcErr, err)
	}
	if _, _, err := fastAnswer([]byte(`{"jsonrpc":"2.0","id":"zidane-8","result":{}}`), upID); err == nil {
		t.Error("an answer to another id was taken")
	}
	// A 4xx whose body is a JSON-RPC error with a null id (the server could
	// not read the request's) is that error, as go-sdk reads it.
	if e := errorAnswer([]byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad request"}}`)); !strings.Contains(string(e), "bad request") {
		t.Errorf("the error of a 4xx answer with a null id: %s", e)
	}
}

// A 2026-07-28 upstream is not served by the fast path (which speaks the
// session protocol only): a session client's calls to it go through go-sdk,
// with the headers and _meta that protocol needs, while calls to a
// 2025-11-25 upstream beside it keep the fast path.
func TestAggregateFastPathLeavesModernUpstreams(t *testing.T) {
	type seen struct{ id, method, name, meta string }
	var mu sync.Mutex
	var calls []seen
	s := mcp.NewServer(&mcp.Implementation{Name: "m", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "m:" + in.Text}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"tools/call"`)) {
			var m struct {
				ID     json.RawMessage `json:"id"`
				Params struct {
					Meta map[string]any `json:"_meta"`
				} `json:"params"`
			}
			_ = json.Unmarshal(body, &m)
			v, _ := m.Params.Meta["io.modelcontextprotocol/protocolVersion"].(string)
			mu.Lock()
			calls = append(calls, seen{string(m.ID), r.Header.Get("Mcp-Method"), r.Header.Get("Mcp-Name"), v})
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	legacy := newFastUp(t, "l", true)
	_, url := aggServe(t, []Upstream{{Name: "m", URL: srv.URL}, legacy.config()}, AggregateOptions{})
	cs := aggConnect(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		for _, tool := range []string{"mcp_m_echo", "mcp_l_echo"} {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"text": "q"}})
			if err != nil || res.IsError || !strings.HasSuffix(aggText(t, res), ":q") {
				t.Fatalf("call %d of %s: %v %v", i, tool, res, err)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 3 {
		t.Fatalf("the 2026-07-28 upstream saw %d calls, want 3", len(calls))
	}
	for _, c := range calls {
		if strings.Contains(c.id, "zidane-") || c.method != "tools/call" || c.name != "echo" || c.meta != "2026-07-28" {
			t.Errorf("a call reached the 2026-07-28 upstream as %+v; want go-sdk's, with Mcp-Method, Mcp-Name and _meta", c)
		}
	}
	if n := legacy.fast.Load(); n < 2 {
		t.Errorf("%d calls to the 2025-11-25 upstream took the fast path, want at least 2 of 3", n)
	}
}

// The fast path reads an upstream's event stream as a client does (see
// internal/sse): an answer whose lines end with a lone CR, or whose stream
// starts with a byte-order mark, is the answer all the same.
func TestAggregateFastPathReadsEventsAsClients(t *testing.T) {
	for name, spell := range map[string]func([]byte) []byte{
		"lone CR": func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r")) },
		"CRLF":    func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n")) },
		"byte-order mark before data": func(b []byte) []byte {
			b = bytes.ReplaceAll(b, []byte("event: message\n"), nil)
			b = bytes.ReplaceAll(b, []byte("id: "), []byte(": "))
			return append([]byte("\xEF\xBB\xBF"), b...)
		},
		"no space": func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("data: "), []byte("data:")) },
		// Clients take messages from events of type message only: an
		// answer in an event of another type is not the answer.
		"an answer of another type first": func(b []byte) []byte {
			fake := bytes.Replace(b, []byte("event: message"), []byte("event: other"), 1)
			fake = bytes.Replace(fake, []byte(`"a:fast"`), []byte(`"a:fake"`), 1)
			return append(fake, b...)
		},
	} {
		t.Run(name, func(t *testing.T) {
			up := newFastUp(t, "a", false)
			// The upstream's answers to the fast path's requests are
			// spelled the other way; go-sdk's, which open the session, are
			// left as they are.
			respell := respellEvents(t, up.http.URL, func(req, answer []byte) []byte {
				if bytes.Contains(req, []byte(`"id":"zidane-`)) {
					return spell(answer)
				}
				return answer
			})
			_, url := aggServe(t, []Upstream{{Name: "a", URL: respell}}, AggregateOptions{})
			cs := aggConnect(t, url, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, text := range []string{"opens", "fast"} {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": text}})
				if err != nil {
					t.Fatal(err)
				}
				if got := aggText(t, res); got != "a:"+text || res.IsError {
					t.Fatalf("call %q answered %q (error %v)", text, got, res.IsError)
				}
			}
			if up.fast.Load() == 0 {
				t.Fatal("no call took the fast path")
			}
		})
	}
}

// respellEvents serves a proxy to the MCP server at target that passes
// each event-stream answer to a POST through spell (with the request's
// body) before it goes on. It holds answers whole, so it offers no GET
// stream.
func respellEvents(t *testing.T, target string, spell func(req, answer []byte) []byte) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, target, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		answer, _ := io.ReadAll(resp.Body)
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			answer = spell(body, answer)
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(resp.StatusCode)
		w.Write(answer)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The fast path relays the notifications of its calls' streams itself, so
// they leave nothing for the session's go-sdk handlers to catch up on: a
// count of them as waiting would hold each later go-sdk call of the
// session for noteWait.
func TestAggregateFastPathNotesLeaveNoWait(t *testing.T) {
	up := newFastUp(t, "a", false)
	a, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{})
	progress := make(chan struct{}, 4)
	cs := aggConnect(t, url, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress <- struct{}{} },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "x"}}); err != nil {
		t.Fatal(err)
	}
	before := up.fast.Load()
	params := &mcp.CallToolParams{Name: "mcp_a_progress", Arguments: map[string]any{"text": "q"}}
	params.SetProgressToken("tok")
	if _, err := cs.CallTool(ctx, params); err != nil {
		t.Fatal(err)
	}
	if up.fast.Load() == before {
		t.Fatal("the call did not take the fast path")
	}
	select {
	case <-progress:
	case <-ctx.Done():
		t.Fatal("no progress notification reached the client")
	}
	a.mu.Lock()
	s := a.byID[cs.ID()]
	a.mu.Unlock()
	if s == nil {
		t.Fatal("no downstream session")
	}
	s.mu.Lock()
	c := s.conns["a"]
	s.mu.Unlock()
	if c == nil || c.received == nil {
		t.Fatal("no counted upstream session")
	}
	if waiting := c.received.Load() - c.handled.count(); waiting > 0 {
		t.Fatalf("%d notifications of the fast path's stream wait for go-sdk's handlers, which never see them", waiting)
	}
}
