package hostile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The answers a hostile upstream gives to a tools/call of the tool of the
// same name. Each tries to make the gateway hold more than it should.
const (
	// EndlessEvent is an event stream with one event that never ends:
	// data lines of 64 KiB without a blank line.
	EndlessEvent = "endless_event"
	// HugeLine is an event stream with one data line that never ends.
	HugeLine = "huge_line"
	// HugeJSON is a JSON answer whose one string never ends, sent
	// without Content-Length.
	HugeJSON = "huge_json"
	// HugeJSONLength is a huge JSON answer that says its length first.
	HugeJSONLength = "huge_json_length"
	// ManyEvents is an event stream of small notifications that never
	// gets to the answer.
	ManyEvents = "many_events"
	// EndlessBody is a JSON answer that is whitespace forever.
	EndlessBody = "endless_body"
)

// Attacks lists every hostile tool of [Upstream].
var Attacks = []string{EndlessEvent, HugeLine, HugeJSON, HugeJSONLength, ManyEvents, EndlessBody}

// OKTool is the tool of [Upstream] that answers as a server should: its
// result's text is its "text" argument.
const OKTool = "ok"

// Upstream is a streamable-HTTP MCP server on go-sdk whose tools in
// [Attacks] answer with the hostile answer of their name instead of a
// result. Everything else (initialize, tools/list, the GET stream, OKTool)
// is go-sdk's. Each hostile answer is bounded by Max bytes, so a test
// ends even if the gateway in front does not cut it; it stops as soon as
// the gateway hangs up.
type Upstream struct {
	// Max bounds each hostile answer; 0 means 256 MiB.
	Max int64
	// Sent counts the bytes of hostile answers written.
	Sent atomic.Int64
	// Cut counts hostile answers the reader hung up on before Max.
	Cut atomic.Int64

	mcp http.Handler
}

// NewUpstream returns the hostile upstream.
func NewUpstream() *Upstream {
	s := mcp.NewServer(&mcp.Implementation{Name: "hostile", Version: "1"}, nil)
	type okArgs struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: OKTool, Description: "answers its text"}, func(_ context.Context, _ *mcp.CallToolRequest, a okArgs) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
	})
	for _, name := range Attacks {
		// Listed like any tool; their calls never reach go-sdk.
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: "a hostile answer: " + name}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return nil, nil, fmt.Errorf("%s reached the server's handler", name)
		})
	}
	return &Upstream{mcp: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)}
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		u.mcp.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" && isAttack(msg.Params.Name) {
		u.attack(w, r, msg.Params.Name, msg.ID)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	u.mcp.ServeHTTP(w, r)
}

func isAttack(name string) bool {
	for _, a := range Attacks {
		if a == name {
			return true
		}
	}
	return false
}

// attack writes the hostile answer name until max bytes or the reader
// hangs up.
func (u *Upstream) attack(w http.ResponseWriter, r *http.Request, name string, id json.RawMessage) {
	max := u.Max
	if max <= 0 {
		max = 256 << 20
	}
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		w.Header().Set("Mcp-Session-Id", sid)
	}
	var head, unit []byte
	switch name {
	case EndlessEvent:
		w.Header().Set("Content-Type", "text/event-stream")
		unit = append(append([]byte("data: "), bytes.Repeat([]byte("x"), 64<<10)...), '\n')
	case HugeLine:
		w.Header().Set("Content-Type", "text/event-stream")
		head = []byte(`data: {"jsonrpc":"2.0","id":` + string(id) + `,"result":{"content":[{"type":"text","text":"`)
		unit = bytes.Repeat([]byte("y"), 64<<10)
	case HugeJSON, HugeJSONLength:
		w.Header().Set("Content-Type", "application/json")
		head = []byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":{"content":[{"type":"text","text":"`)
		unit = bytes.Repeat([]byte("z"), 64<<10)
		if name == HugeJSONLength {
			w.Header().Set("Content-Length", fmt.Sprint(max))
		}
	case ManyEvents:
		w.Header().Set("Content-Type", "text/event-stream")
		note := `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"` + strings.Repeat("n", 900) + `"}}`
		unit = []byte("event: message\ndata: " + note + "\n\n")
	case EndlessBody:
		w.Header().Set("Content-Type", "application/json")
		unit = bytes.Repeat([]byte(" "), 64<<10)
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var sent int64
	write := func(b []byte) bool {
		if int64(len(b)) > max-sent {
			b = b[:max-sent]
		}
		n, err := w.Write(b)
		sent += int64(n)
		u.Sent.Add(int64(n))
		if err != nil || r.Context().Err() != nil {
			u.Cut.Add(1)
			return false
		}
		return sent < max
	}
	if len(head) > 0 && !write(head) {
		return
	}
	for write(unit) {
		if name == ManyEvents || name == EndlessEvent {
			_ = rc.Flush()
		}
	}
}
