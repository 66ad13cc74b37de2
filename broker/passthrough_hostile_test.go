package broker

import (
	"context"
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
