package aggregate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// serveUpstream serves s over streamable HTTP on 127.0.0.1 as upstream name.
func serveUpstream(t *testing.T, name string, s *mcp.Server) upstream.Config {
	t.Helper()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return upstream.Config{Name: name, URL: srv.URL}
}

// The SEP-1330 enum schemas, as the conformance suite's scenario has them:
// go-sdk's client-side check refuses the titled multi-select (items with
// both "type" and "anyOf"), so the broker must relay without it.
func TestAggregateRelaysElicitationSchemasAsTheyAre(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"untitledSingle": map[string]any{"type": "string", "enum": []string{"option1", "option2"}},
			"titledSingle": map[string]any{"type": "string", "oneOf": []map[string]any{
				{"const": "value1", "title": "First"}, {"const": "value2", "title": "Second"}}},
			"legacyEnum": map[string]any{"type": "string", "enum": []string{"opt1", "opt2"}, "enumNames": []string{"One", "Two"}},
			"titledMulti": map[string]any{"type": "array", "minItems": 1, "items": map[string]any{
				"type": "string", "anyOf": []map[string]any{{"const": "value1", "title": "First"}, {"const": "value2", "title": "Second"}}}},
		},
	}
	mcp.AddTool(s, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "pick", RequestedSchema: schema})
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Action + " " + strings.Join(toStrings(res.Content["titledMulti"]), ",")}}}, nil, nil
	})
	up := serveUpstream(t, "up", s)
	_, url := aggServe(t, []upstream.Config{up}, Options{})

	// The downstream client answers as the conformance suite's TypeScript
	// client does: go-sdk's own client would refuse the schema itself, so
	// this one takes elicitation/create before that check.
	var shown any
	c := mcp.NewClient(&mcp.Implementation{Name: "downstream", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return nil, errors.New("not reached: the middleware answers")
		},
	})
	c.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if r, ok := req.(*mcp.ElicitRequest); ok {
				shown = r.Params.RequestedSchema
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"titledMulti": []any{"value2"}}}, nil
			}
			return next(ctx, method, req)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func(endpoint, tool string) string {
		t.Helper()
		shown = nil
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: aggAuthRT{http.DefaultTransport}}, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool})
		if err != nil {
			t.Fatal(err)
		}
		props, _ := shown.(map[string]any)["properties"].(map[string]any)
		if _, ok := props["titledMulti"]; !ok || len(props) != 4 {
			t.Fatalf("the client was shown %v, want the upstream's four properties", shown)
		}
		return fmt.Sprintf("isError=%v %s", res.IsError, aggText(t, res))
	}
	direct := call(up.URL, "ask")
	through := call(url, "mcp_up_ask")
	// go-sdk's upstream refuses the accepted answer to the schema it sent
	// (it checks with its client's rules); what matters is that the
	// aggregate changes nothing: the upstream, not the broker, decides.
	if through != direct {
		t.Fatalf("through the aggregate: %q\ndirect: %q", through, direct)
	}
}

func toStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, x := range l {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// An upstream asking for roots gets the downstream client's roots, and a
// change of them reaches the upstream as notifications/roots/list_changed.
func TestAggregateForwardsRoots(t *testing.T) {
	changed := make(chan struct{}, 4)
	s := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
		//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
		RootsListChangedHandler: func(context.Context, *mcp.RootsListChangedRequest) { changed <- struct{}{} },
	})
	mcp.AddTool(s, &mcp.Tool{Name: "roots"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
		res, err := req.Session.ListRoots(ctx, nil)
		if err != nil {
			return nil, nil, err
		}
		var uris []string
		for _, r := range res.Roots {
			uris = append(uris, r.URI)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Join(uris, " ")}}}, nil, nil
	})
	_, url := aggServe(t, []upstream.Config{serveUpstream(t, "up", s)}, Options{})
	c := mcp.NewClient(&mcp.Implementation{Name: "downstream", Version: "1"}, nil)
	//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
	c.AddRoots(&mcp.Root{URI: "file:///work/a"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: aggAuthRT{http.DefaultTransport}}, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func() string {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_up_roots"})
		if err != nil || res.IsError {
			t.Fatalf("roots: %v %+v", err, res)
		}
		return aggText(t, res)
	}
	if got := call(); got != "file:///work/a" {
		t.Fatalf("upstream saw roots %q, want the downstream client's", got)
	}
	//lint:ignore SA1019 the test checks that the aggregated route still relays roots, which SEP-2577 deprecates but earlier protocol versions use
	c.AddRoots(&mcp.Root{URI: "file:///work/b"})
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("the upstream was not told that the roots changed")
	}
	if got := strings.Fields(call()); !slices.Equal(got, []string{"file:///work/a", "file:///work/b"}) {
		t.Fatalf("after the change the upstream saw %v", got)
	}
}

// Log messages an upstream sends just before its answer reach the client:
// the broker writes the answer only after forwarding them (go-sdk hands
// notifications to a queue, answers straight to the caller).
func TestAggregateForwardsLogsBeforeTheAnswer(t *testing.T) {
	const perCall, calls = 50, 10
	s := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "chatty"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		// Many at once, so that the broker's handler queue is still busy
		// when the answer arrives.
		for i := range perCall {
			//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
			_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: fmt.Sprint("step ", i)})
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	_, url := aggServe(t, []upstream.Config{serveUpstream(t, "up", s)}, Options{})
	var mu sync.Mutex
	logs := 0
	// Offering elicitation keeps these calls on the go-sdk path, where
	// the reordering happens.
	cs := aggConnect(t, url, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "decline"}, nil
		},
		//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
		LoggingMessageHandler: func(context.Context, *mcp.LoggingMessageRequest) {
			mu.Lock()
			logs++
			mu.Unlock()
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	for range calls {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_up_chatty"})
		if err != nil || res.IsError {
			t.Fatalf("call: %v %+v", err, res)
		}
	}
	// The client's own handler runs after its calls return, as the
	// broker's does: give it a moment, bounded.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := logs
		mu.Unlock()
		if n == perCall*calls {
			return
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("%d log messages reached the client, want %d", logs, perCall*calls)
}

// The same, from an upstream whose JSON has a space after each colon, as
// many JSON encoders write it: its log messages are counted and waited for
// all the same.
func TestAggregateForwardsSpacedLogsBeforeTheAnswer(t *testing.T) {
	const perCall, calls = 50, 10
	s := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "chatty"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		for i := range perCall {
			//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
			_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: fmt.Sprint("step ", i)})
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	up := serveUpstream(t, "up", s)
	up.URL = respellEvents(t, up.URL, func(_, answer []byte) []byte {
		return bytes.ReplaceAll(answer, []byte(`"method":"`), []byte(`"method": "`))
	})
	_, url := aggServe(t, []upstream.Config{up}, Options{})
	var mu sync.Mutex
	logs := 0
	cs := aggConnect(t, url, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "decline"}, nil
		},
		//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
		LoggingMessageHandler: func(context.Context, *mcp.LoggingMessageRequest) {
			mu.Lock()
			logs++
			mu.Unlock()
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	//lint:ignore SA1019 the test checks that the aggregated route still relays logging, which SEP-2577 deprecates but earlier protocol versions use
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	for range calls {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_up_chatty"})
		if err != nil || res.IsError {
			t.Fatalf("call: %v %+v", err, res)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := logs
		mu.Unlock()
		if n == perCall*calls {
			return
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("%d log messages reached the client, want %d", logs, perCall*calls)
}

// noteCount is how many log and progress notifications the broker counts
// in stream, an upstream's event-stream answer on one session.
func noteCount(t *testing.T, stream string) int64 {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, stream)
	}))
	defer srv.Close()
	n := &noteCounter{next: http.DefaultTransport}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set(upstream.HeaderSessionID, "s1")
	resp, err := (&http.Client{Transport: n}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, iotest.OneByteReader(resp.Body))
	resp.Body.Close()
	return n.counter("s1").Load()
}

// The broker counts the notifications a client would read in an
// upstream's stream, however the stream and its JSON are spelled, and
// nothing else: a count too low loses log messages after the answer, one
// too high holds the answer for the wait's whole bound.
func TestNoteCounterCountsWhatAClientReads(t *testing.T) {
	const note = `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}`
	for _, c := range []struct {
		name, stream string
		want         int64
	}{
		{"compact", "event: message\ndata: " + note + "\n\n", 1},
		{"progress", `data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}` + "\n\n", 1},
		{"a space after the colon", `data: {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}` + "\n\n", 1},
		{"the method after long params", `data: {"jsonrpc":"2.0","params":{"level":"info","data":"` + strings.Repeat("p", 400) + `"},"method":"notifications/message"}` + "\n\n", 1},
		{"no space after data:", "data:" + note + "\n\n", 1},
		{"a byte-order mark", "\xEF\xBB\xBFdata: " + note + "\n\n", 1},
		{"CRLF", "data: " + note + "\r\n\r\n", 1},
		{"data over two lines", "data: {\"jsonrpc\":\"2.0\",\ndata: \"method\":\"notifications/message\",\"params\":{}}\n\n", 1},
		{"an answer that holds the words", `data: {"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"method":"notifications/message"}}}` + "\n\n", 0},
		{"another notification", `data: {"jsonrpc":"2.0","method":"notifications/tools/list_changed"}` + "\n\n", 0},
		{"a comment", ": " + note + "\n\n", 0},
		{"an event of another type", "event: other\ndata: " + note + "\n\n", 0},
		{"three", "data: " + note + "\n\ndata: " + note + "\n\ndata: " + note + "\n\n", 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := noteCount(t, c.stream); got != c.want {
				t.Fatalf("counted %d notifications; want %d", got, c.want)
			}
		})
	}
}

// The broker's go-sdk client reads an upstream's event streams as a client
// does too (see internal/sse), not by go-sdk's own rules (LF line ends
// only, spaces trimmed, a line without ':' fatal, a last event taken
// without its blank line): the stream is read once and handed to go-sdk
// in one plain spelling.
func TestAggregateGoSDKPathReadsEventsAsClients(t *testing.T) {
	for name, spell := range map[string]func([]byte) []byte{
		"lone CR": func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r")) },
		"a byte-order mark": func(b []byte) []byte {
			return append([]byte("\xEF\xBB\xBF"), bytes.ReplaceAll(b, []byte("event: message\n"), nil)...)
		},
		"a field without colon": func(b []byte) []byte { return append([]byte("x-note\n\n"), b...) },
		"an unended last event": func(b []byte) []byte { return append(b, "data: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}"...) },
		"an answer of another type first": func(b []byte) []byte {
			fake := bytes.Replace(b, []byte("event: message"), []byte("event: other"), 1)
			return append(bytes.Replace(fake, []byte(`"a:`), []byte(`"fake:`), 1), b...)
		},
	} {
		t.Run(name, func(t *testing.T) {
			up := newFastUp(t, "a", false)
			respelled := respellEvents(t, up.http.URL, func(_, answer []byte) []byte { return spell(answer) })
			_, url := aggServe(t, []upstream.Config{{Name: "a", URL: respelled}}, Options{})
			// Offering elicitation keeps the calls on the go-sdk path.
			cs := aggConnect(t, url, &mcp.ClientOptions{
				ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					return &mcp.ElicitResult{Action: "decline"}, nil
				},
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, text := range []string{"one", "two"} {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": text}})
				if err != nil {
					t.Fatal(err)
				}
				if got := aggText(t, res); got != "a:"+text || res.IsError {
					t.Fatalf("call %q answered %q (error %v)", text, got, res.IsError)
				}
			}
			if up.fast.Load() != 0 {
				t.Fatal("a call took the fast path")
			}
		})
	}
}

// What go-sdk's client gets of an upstream's stream: each event as a
// client reads it, in one plain spelling.
func TestNoteReaderHandsGoSDKPlainEvents(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "\xEF\xBB\xBF: c\rid: 7\rretry: 100\rretry: 1x\rdata: a\rdata:b\r\r"+
			"event: other\ndata: x\nid: 8\n\nx-field\n\n"+
			"event: message\r\ndata:  c\r\n\r\ndata: unended")
	}))
	defer srv.Close()
	n := &noteCounter{next: http.DefaultTransport}
	resp, err := (&http.Client{Transport: n}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(iotest.OneByteReader(resp.Body))
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := "id: 7\nretry: 100\ndata: a\ndata: b\n\nid: 8\n\ndata:  c\n\n"; string(got) != want {
		t.Fatalf("go-sdk gets %q\nwant %q", got, want)
	}
}
