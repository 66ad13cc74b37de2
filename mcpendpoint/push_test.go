//lint:file-ignore SA1019 the tests receive session events as a real client does, through logging.

package mcpendpoint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// logs collects the notifications/message a go-sdk client receives.
func logs() (*mcp.ClientOptions, <-chan *mcp.LoggingMessageParams) {
	ch := make(chan *mcp.LoggingMessageParams, 64)
	return &mcp.ClientOptions{
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) { ch <- req.Params },
	}, ch
}

// next is the next log message, or a test failure when none comes.
func next(t *testing.T, ch <-chan *mcp.LoggingMessageParams) *mcp.LoggingMessageParams {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no notifications/message arrived")
		return nil
	}
}

// eventOf checks a session-event log message and returns its data.
func eventOf(t *testing.T, m *mcp.LoggingMessageParams) eventData {
	t.Helper()
	if m.Logger != "session-event" {
		t.Fatalf("logger %q, want session-event", m.Logger)
	}
	raw, _ := json.Marshal(m.Data)
	var d eventData
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("data %s: %v", raw, err)
	}
	return d
}

func TestEventPushWithoutSetLevel(t *testing.T) {
	h := newHarness(t)
	opts, ch := logs()
	cs := h.connect("alice-token", opts, nil)
	var c sessions.Created
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"}), &c)

	ev := h.engine.finish(c.SessionID, "fixed <it> & tested")
	m := next(t, ch)
	d := eventOf(t, m)
	if m.Level != "info" || d.Seq != ev.Seq || d.SessionID != c.SessionID || d.Status != sessions.EventDone {
		t.Errorf("pushed %+v at level %s, want %+v", d, m.Level, ev)
	}
	want := `<session-event session="` + c.SessionID + `" status="done" seq="1">turn finished: fixed &lt;it&gt; &amp; tested</session-event>`
	if d.Text != want {
		t.Errorf("text = %s\nwant   %s", d.Text, want)
	}
}

func TestEventPushAfterSetLevel(t *testing.T) {
	h := newHarness(t)
	opts, ch := logs()
	cs := h.connect("alice-token", opts, nil)
	if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	var c sessions.Created
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"}), &c)

	rid, _ := h.engine.ask(c.SessionID, sessions.KindPlan, "approve the plan?", map[string]any{"plan": "1. fix"})
	m := next(t, ch)
	d := eventOf(t, m)
	if m.Level != "warning" || d.Status != sessions.EventNeedsAttention || d.RequestID != rid ||
		!strings.Contains(d.Text, `status="needs-attention"`) || !strings.Contains(d.Text, `request="`+rid+`"`) {
		t.Errorf("pushed %+v at level %s", d, m.Level)
	}
}

func TestEventPushGoesToTheTargetSession(t *testing.T) {
	h := newHarness(t)
	optsA, chA := logs()
	optsB, chB := logs()
	a := h.connect("alice-token", optsA, nil)
	b := h.connect("alice-token", optsB, nil)
	var s1, s2 sessions.Created
	ok(t, call(t, a, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "one"}), &s1)
	ok(t, call(t, b, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "two"}), &s2)

	h.engine.finish(s1.SessionID, "one done")
	h.engine.finish(s2.SessionID, "two done")
	if d := eventOf(t, next(t, chA)); d.SessionID != s1.SessionID {
		t.Errorf("A got the event of %s first, want %s", d.SessionID, s1.SessionID)
	}
	if d := eventOf(t, next(t, chB)); d.SessionID != s2.SessionID {
		t.Errorf("B got the event of %s first, want %s", d.SessionID, s2.SessionID)
	}

	// B sends to s1: s1's events now go to B.
	ok(t, call(t, b, "sessions", map[string]any{"verb": "send", "sessionId": s1.SessionID, "prompt": "more"}), nil)
	h.engine.finish(s1.SessionID, "more done")
	if d := eventOf(t, next(t, chB)); d.SessionID != s1.SessionID || d.Seq != 3 {
		t.Errorf("B got %+v, want s1's third event", d)
	}
}

// wireTap records the bytes of the SSE streams a client's GET requests
// receive, to see notifications the go-sdk client does not surface.
type wireTap struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	grew chan struct{}
}

func newWireTap() *wireTap { return &wireTap{grew: make(chan struct{})} }

func (w *wireTap) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && r.Method == http.MethodGet && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = tapBody{resp.Body, w}
	}
	return resp, err
}

type tapBody struct {
	io.ReadCloser
	tap *wireTap
}

func (b tapBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.tap.mu.Lock()
	b.tap.buf.Write(p[:n])
	close(b.tap.grew)
	b.tap.grew = make(chan struct{})
	b.tap.mu.Unlock()
	return n, err
}

// line waits for an SSE data line that contains substr and returns it.
func (w *wireTap) line(t *testing.T, substr string) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		w.mu.Lock()
		sc := bufio.NewScanner(bytes.NewReader(w.buf.Bytes()))
		sc.Buffer(nil, 1<<20)
		grew := w.grew
		w.mu.Unlock()
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "data: ") && strings.Contains(l, substr) {
				return strings.TrimPrefix(l, "data: ")
			}
		}
		select {
		case <-grew:
		case <-deadline:
			w.mu.Lock()
			defer w.mu.Unlock()
			t.Fatalf("no SSE data line with %q arrived; got %q", substr, w.buf.String())
		}
	}
}

func TestChannelPushForClientsThatDeclareIt(t *testing.T) {
	h := newHarness(t)
	opts, ch := logs()
	opts.Capabilities = &mcp.ClientCapabilities{Experimental: map[string]any{"claude/channel": map[string]any{}}}
	tap := newWireTap()
	cs := h.connect("alice-token", opts, tap)
	var c sessions.Created
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"}), &c)

	rid, ev := h.engine.ask(c.SessionID, sessions.KindApproval, "run make?", map[string]any{})
	eventOf(t, next(t, ch)) // the logging notification still arrives

	var msg struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  channelParams   `json:"params"`
	}
	line := tap.line(t, `"method":"notifications/claude/channel"`)
	if err := json.Unmarshal([]byte(line), &msg); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"session_id": c.SessionID, "status": "needs-attention", "seq": "1", "kind": "needs-attention", "request_id": rid}
	if msg.JSONRPC != "2.0" || msg.ID != nil || msg.Params.Content != ev.Render() || !equalMaps(msg.Params.Meta, want) {
		t.Errorf("channel notification = %s", line)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestRewriteChannelEvent(t *testing.T) {
	channel := "event: message\nid: _0\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":{\"content\":\"hi\",\"meta\":{\"seq\":\"1\"}},\"level\":\"info\",\"logger\":\"claude/channel\"}}\n\n"
	out, ok := rewriteChannelEvent([]byte(channel))
	want := "event: message\nid: _0\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/claude/channel\",\"params\":{\"content\":\"hi\",\"meta\":{\"seq\":\"1\"}}}\n\n"
	if !ok || string(out) != want {
		t.Errorf("rewrite = %q, %v\nwant %q", out, ok, want)
	}
	// However the event is spelled, as a client reads it (see
	// internal/sse): the rewrite goes out with LF line ends.
	for _, spelled := range []string{
		strings.Replace(channel, "data: ", "data:", 1),
		strings.ReplaceAll(channel, "\n", "\r\n"),
		strings.ReplaceAll(channel, "\n", "\r"),
		strings.Replace(channel, `"params":`, "\ndata: \"params\":", 1), // the message over two data lines
	} {
		if out, ok := rewriteChannelEvent([]byte(spelled)); !ok || string(out) != want {
			t.Errorf("rewrite of %q = %q, %v\nwant %q", spelled, out, ok, want)
		}
	}
	for _, keep := range []string{
		": ok\n\n",
		"event: message\nid: _1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":{\"text\":\"\\\"logger\\\":\\\"claude/channel\\\"\"},\"level\":\"info\",\"logger\":\"session-event\"}}\n\n",
		"event: message\nid: _2\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"notifications/message\",\"params\":{\"logger\":\"claude/channel\",\"data\":{}}}\n\n",
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"logger\":\"claude/channel\"", // a split write
		channel + "event: message\n", // more than one event
	} {
		if out, ok := rewriteChannelEvent([]byte(keep)); ok {
			t.Errorf("rewrote %q into %q", keep, out)
		}
	}
}

func TestEventWithNoStreamOpenIsReplayedWhenOneOpens(t *testing.T) {
	h := newHarness(t)
	client := mcp.NewClient(&mcp.Implementation{Name: "no-stream", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:             h.srv.URL,
		HTTPClient:           &http.Client{Transport: bearer{"alice-token", http.DefaultTransport}},
		DisableStandaloneSSE: true,
	}, &mcp.ClientSessionOptions{ProtocolVersion: legacyVersion}) // the GET stream is 2025-11-25's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	var c sessions.Created
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"}), &c)
	ev := h.engine.finish(c.SessionID, "done while nobody listened")

	// The push runs on its own goroutine: wait until go-sdk's EventStore
	// holds it, with no stream open.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !stored(h.ep.eventStore, cs.ID(), ev.Summary) {
		select {
		case <-ctx.Done():
			t.Fatal("the pushed event never reached the EventStore")
		case <-time.After(5 * time.Millisecond):
		}
	}

	// A GET stream opened now replays it.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.srv.URL, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Authorization", "Bearer alice-token")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	tap := newWireTap()
	resp, err := (&http.Client{Transport: tap}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: status %d", resp.StatusCode)
	}
	go io.Copy(io.Discard, resp.Body) // feeds the tap until the body closes
	if line := tap.line(t, ev.Summary); !strings.Contains(line, `"logger":"session-event"`) {
		t.Errorf("replayed %s", line)
	}
}

// stored reports whether the standalone stream of an MCP session holds a
// message containing substr.
func stored(es *mcp.MemoryEventStore, sessionID, substr string) bool {
	for data, err := range es.After(context.Background(), sessionID, "", -1) {
		if err != nil {
			return false
		}
		if strings.Contains(string(data), substr) {
			return true
		}
	}
	return false
}
