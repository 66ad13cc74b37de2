package broker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/hostile"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// limitedGet serves body with contentType (and Content-Length when
// withLength) and reads it back through an answerLimit of max bytes.
func limitedRead(t *testing.T, method, contentType string, withLength bool, body []byte, max int64, budget *AnswerBudget) ([]byte, error) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		if !withLength {
			// Flushing first makes the body chunked: no Content-Length.
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
		}
		w.Write(body)
	}))
	defer srv.Close()
	c := &http.Client{Transport: newAnswerLimit(http.DefaultTransport, "up", max, budget)}
	ctx := context.Background()
	if method == listen {
		method, ctx = http.MethodPost, withEventLimit(ctx)
	}
	req, _ := http.NewRequestWithContext(ctx, method, srv.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// listen, as limitedRead's method, is the POST of a subscriptions/listen,
// whose stream the pass-through bounds per event.
const listen = "LISTEN"

func events(n, size int, end string) []byte {
	var b bytes.Buffer
	for range n {
		b.WriteString("data: " + strings.Repeat("e", size) + end + end)
	}
	return b.Bytes()
}

func TestAnswerLimit(t *testing.T) {
	const max = 64 << 10
	over := func(err error, event bool) bool {
		var tl *AnswerTooLargeError
		return errors.As(err, &tl) && tl.Upstream == "up" && tl.Limit == max && tl.Event == event
	}
	cases := []struct {
		name, method, ctype string
		length              bool
		body                []byte
		fail, event         bool
	}{
		{"json under", "POST", "application/json", false, bytes.Repeat([]byte(" "), max), false, false},
		{"json over", "POST", "application/json", false, bytes.Repeat([]byte(" "), max+1), true, false},
		{"json over, length known", "POST", "application/json", true, bytes.Repeat([]byte(" "), max+1), true, false},
		{"post stream, events together over", "POST", "text/event-stream", false, events(40, 2<<10, "\n"), true, false},
		{"get stream, many events under each", "GET", "text/event-stream", false, events(400, 2<<10, "\n"), false, false},
		{"get stream, events end with CRLF", "GET", "text/event-stream", false, events(400, 2<<10, "\r\n"), false, false},
		{"get stream, events end with CR", "GET", "text/event-stream", false, events(400, 2<<10, "\r"), false, false},
		{"get stream, one event of many lines", "GET", "text/event-stream", false, bytes.Repeat([]byte("data: "+strings.Repeat("l", 1<<10)+"\n"), 100), true, true},
		{"get stream, one endless line", "GET", "text/event-stream", false, bytes.Repeat([]byte("d"), max+1), true, true},
		// A client skips the byte-order mark, so the blank line after it
		// ends an event, and the next event starts its count afresh.
		{"get stream, a byte-order mark and a blank line, then an event of max bytes", "GET", "text/event-stream", false,
			append([]byte("\xEF\xBB\xBF\n"), append(append([]byte("data: "), bytes.Repeat([]byte("m"), max-len("data: \n\n"))...), "\n\n"...)...), false, false},
		{"get json over", "GET", "application/json", false, bytes.Repeat([]byte(" "), max+1), true, false},
		{"listen stream, many events under each", listen, "text/event-stream", false, events(400, 2<<10, "\n"), false, false},
		{"listen stream, one event over", listen, "text/event-stream", false, bytes.Repeat([]byte("data: "+strings.Repeat("l", 1<<10)+"\n"), 100), true, true},
		{"listen answered with json over", listen, "application/json", false, bytes.Repeat([]byte(" "), max+1), true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			budget := NewAnswerBudget(1 << 30)
			got, err := limitedRead(t, c.method, c.ctype, c.length, c.body, max, budget)
			switch {
			case c.fail && !over(err, c.event):
				t.Fatalf("read %d bytes, err %v; want the limit's error (event %v)", len(got), err, c.event)
			case !c.fail && (err != nil || !bytes.Equal(got, c.body)):
				t.Fatalf("read %d of %d bytes, err %v", len(got), len(c.body), err)
			}
			if err != nil && !strings.Contains(err.Error(), `"up"`) || err != nil && !strings.Contains(err.Error(), "64 KiB") {
				t.Errorf("error %q should name the upstream and the limit", err)
			}
			if u := budget.Used(); u != 0 {
				t.Errorf("budget holds %d bytes after the answer ended", u)
			}
		})
	}
}

// Two answers that each fit max_response but not the budget together: the
// second fails, and the budget is whole again once both end.
func TestAnswerBudget(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write(bytes.Repeat([]byte(" "), 48<<10))
		http.NewResponseController(w).Flush()
		<-release
	}))
	defer srv.Close()
	defer close(release)
	budget := NewAnswerBudget(64 << 10)
	c := &http.Client{Transport: newAnswerLimit(http.DefaultTransport, "up", 1<<20, budget)}
	first, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(first.Body, make([]byte, 48<<10)); err != nil {
		t.Fatal(err)
	}
	second, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadFull(second.Body, make([]byte, 48<<10))
	var be *AnswerBudgetError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "64 KiB") {
		t.Fatalf("second answer: %v; want the budget's error", err)
	}
	second.Body.Close()
	if u := budget.Used(); u != 48<<10 {
		t.Fatalf("budget holds %d bytes, want the first answer's %d", u, 48<<10)
	}
	first.Body.Close()
	if u := budget.Used(); u != 0 {
		t.Fatalf("budget holds %d bytes after both answers ended", u)
	}
}

// The aggregated route in front of an upstream that tries every hostile
// answer: each call gets a tool error that names the upstream and its
// max_response, the next call on the same downstream session works (on a
// new upstream session), and nothing stays reserved.
func TestAggregateHostileAnswers(t *testing.T) {
	hu := hostile.NewUpstream()
	hu.Max = 8 << 20
	srv := httptest.NewServer(hu)
	t.Cleanup(srv.Close)
	budget := NewAnswerBudget(0)
	_, url := aggServe(t, []Upstream{{Name: "evil", URL: srv.URL, MaxResponse: 1 << 20}}, AggregateOptions{AnswerBudget: budget})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, warm := range []bool{false, true} {
		for _, attack := range hostile.Attacks {
			name := attack + map[bool]string{false: " first call", true: " after a call"}[warm]
			t.Run(name, func(t *testing.T) {
				cs := aggConnect(t, url, nil)
				if warm {
					// The first call opens the upstream session with go-sdk;
					// later ones take the fast path.
					if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_evil_ok", Arguments: map[string]any{"text": "warm"}}); err != nil || res.IsError {
						t.Fatalf("ok: %v %+v", err, res)
					}
				}
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_evil_" + attack})
				if err != nil {
					t.Fatalf("%s: %v; want a tool error", attack, err)
				}
				if text := aggText(t, res); !res.IsError || !strings.Contains(text, `"evil"`) || !strings.Contains(text, "1 MiB") || !strings.Contains(text, "max_response") {
					t.Fatalf("%s: isError %v, %q; want a tool error naming the upstream and its max_response", attack, res.IsError, text)
				}
				res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_evil_ok", Arguments: map[string]any{"text": "after"}})
				if err != nil || res.IsError || aggText(t, res) != "after" {
					t.Fatalf("ok after %s: %v %+v", attack, err, res)
				}
			})
		}
	}
	if u := budget.Used(); u != 0 {
		t.Errorf("budget holds %d bytes after every call ended", u)
	}
}

// The pass-through route: a hostile answer on an event stream ends with the
// call's error as the stream's last event, and the upstream session is
// dropped; a JSON answer that says it is over the limit gets the error at
// once.
func TestPassThroughHostileAnswers(t *testing.T) {
	hu := hostile.NewUpstream()
	hu.Max = 8 << 20
	var mu sync.Mutex
	deleted := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			mu.Lock()
			deleted[r.Header.Get("Mcp-Session-Id")] = true
			mu.Unlock()
		}
		hu.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	pt, err := NewPassThrough(Upstream{Name: "evil", URL: srv.URL, MaxResponse: 1 << 20}, PassThroughOptions{SessionKey: testSessionKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pt.Close)
	front := newEdge(t, pt)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, attack := range []string{hostile.EndlessEvent, hostile.HugeLine, hostile.ManyEvents, hostile.HugeJSONLength} {
		t.Run(attack, func(t *testing.T) {
			cs := mustConnect(t, front.URL, aliceBearer, nil)
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: attack})
			if err != nil {
				t.Fatalf("%s: %v; want a tool error", attack, err)
			}
			if text := toolText(res); !res.IsError || !strings.Contains(text, `"evil"`) || !strings.Contains(text, "1 MiB") {
				t.Fatalf("%s: isError %v, %q; want a tool error naming the upstream and its max_response", attack, res.IsError, text)
			}
			// The upstream session was ended: the client's next request on
			// it is unknown to the upstream.
			_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: hostile.OKTool, Arguments: map[string]any{"text": "x"}})
			if err == nil {
				t.Fatalf("a call on the dropped session succeeded")
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deleted) < 4 {
		t.Errorf("the route ended %d upstream sessions, want one per hostile answer (4)", len(deleted))
	}
}

func toolText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// A GET answer that its reader takes whole is bounded by max_response as a
// whole, however many blank lines it holds: go-sdk's streamable client reads
// the body of a failed GET (a 500 that says text/event-stream) with
// io.ReadAll, and the pass-through reads an answer whose media type is not
// text/event-stream whole, even if its Content-Type holds those words. Only a
// successful event stream, which its reader takes event by event, is bounded
// per event.
func TestAnswerLimitGetReadWhole(t *testing.T) {
	const max = 64 << 10
	blankLines := bytes.Repeat([]byte("x\n\n"), 3*max) // many "events", 3 * max bytes each
	cases := []struct {
		name, ctype string
		status      int
	}{
		{"failed GET that says event stream", "text/event-stream", http.StatusInternalServerError},
		{"event-stream only in a parameter", "application/json; profile=text/event-stream", http.StatusOK},
		{"event-stream only in a suffix", "application/x-text/event-stream", http.StatusOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", c.ctype)
				w.WriteHeader(c.status)
				http.NewResponseController(w).Flush()
				w.Write(blankLines)
			}))
			defer srv.Close()
			budget := NewAnswerBudget(1 << 30)
			hc := &http.Client{Transport: newAnswerLimit(http.DefaultTransport, "up", max, budget)}
			resp, err := hc.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			var tl *AnswerTooLargeError
			if !errors.As(err, &tl) {
				t.Fatalf("read %d bytes of a %d-byte answer whole (err %v); want the max_response error past %d", len(got), len(blankLines), err, max)
			}
			if u := budget.Used(); u != 0 {
				t.Errorf("budget holds %d bytes after the answer was closed", u)
			}
		})
	}
}

// The pass-through holds a JSON answer whole until it has gone to the
// client; the budget holds its bytes as long, so that slow clients cannot
// make the route hold many answers past max_inflight_response.
func TestPassThroughBudgetHeldUntilWritten(t *testing.T) {
	const size = 256 << 10
	answer := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + strings.Repeat("a", size) + `"}]}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	}))
	defer srv.Close()
	budget := NewAnswerBudget(1 << 30)
	pt, err := NewPassThrough(Upstream{Name: "big", URL: srv.URL}, PassThroughOptions{SessionKey: testSessionKey, AnswerBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	defer pt.Close()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r = r.WithContext(policy.WithPrincipal(context.Background(), principals[aliceBearer]))
	w := &heldWriter{ResponseRecorder: httptest.NewRecorder(), budget: budget}
	pt.ServeHTTP(w, r)
	if w.Body.Len() < size {
		t.Fatalf("the client got %d bytes: %.200s", w.Body.Len(), w.Body.String())
	}
	if w.heldAtWrite < size {
		t.Errorf("while the %d-byte answer was written to the client the budget held %d bytes; want the answer's bytes held until then", len(answer), w.heldAtWrite)
	}
	if u := budget.Used(); u != 0 {
		t.Errorf("budget holds %d bytes after the request ended", u)
	}
}

// heldWriter notes what the budget holds when the body is written.
type heldWriter struct {
	*httptest.ResponseRecorder
	budget      *AnswerBudget
	heldAtWrite int64
}

func (w *heldWriter) Write(p []byte) (int, error) {
	if u := w.budget.Used(); u > w.heldAtWrite {
		w.heldAtWrite = u
	}
	return w.ResponseRecorder.Write(p)
}
