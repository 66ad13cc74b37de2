package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An upstream that floods its catalog session with list_changed
// notifications gets at most a re-listing under way and one waiting, not a
// goroutine per notification: each notification is some 60 bytes on the
// wire, its goroutine a few KiB, and each would list the upstream again.
func TestAggregateCoalescesListChanged(t *testing.T) {
	const flood = 2000
	s := mcp.NewServer(&mcp.Implementation{Name: "flood", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "t", Description: "a tool"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	var lists atomic.Int32
	fire := make(chan struct{})
	pinged := make(chan struct{})
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			// The catalog session's stream: the flood, then a ping whose
			// answer says every notification before it was handled.
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			select {
			case <-fire:
			case <-r.Context().Done():
				return
			}
			var b bytes.Buffer
			for range flood {
				b.WriteString("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n")
			}
			b.WriteString("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"flood-done\",\"method\":\"ping\"}\n\n")
			w.Write(b.Bytes())
			http.NewResponseController(w).Flush()
			<-r.Context().Done()
			return
		case http.MethodPost:
			body, _ := io.ReadAll(r.Body)
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			json.Unmarshal(body, &msg)
			switch {
			case string(msg.ID) == `"flood-done"` && msg.Method == "":
				close(pinged)
				w.WriteHeader(http.StatusAccepted)
				return
			case msg.Method == "tools/list" && lists.Add(1) > 1:
				// Re-listings wait: the goroutines behind them pile up.
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	aggServe(t, []Upstream{{Name: "flood", URL: up.URL}}, AggregateOptions{})
	t.Cleanup(func() {
		close(release)
		up.CloseClientConnections()
	})
	before := runtime.NumGoroutine()
	close(fire)
	select {
	case <-pinged:
	case <-time.After(30 * time.Second):
		t.Fatal("the broker did not answer the upstream's ping after the flood")
	}
	if n := runtime.NumGoroutine() - before; n > 50 {
		t.Fatalf("after %d list_changed notifications the broker runs %d more goroutines; want the re-listings coalesced", flood, n)
	}
}

// An upstream whose tools/list never stops paging (each page well within
// max_response) does not make the broker gather pages without end: it takes
// at most maxListed tools over every page.
func TestAggregateBoundsEndlessPagination(t *testing.T) {
	const perPage, safety = 50, 300 // the upstream stops paging at safety pages
	s := mcp.NewServer(&mcp.Implementation{Name: "pages", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "t", Description: "a tool"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	var pages atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			json.Unmarshal(body, &msg)
			if msg.Method == "tools/list" {
				n := pages.Add(1)
				var b bytes.Buffer
				fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%s,"result":{"tools":[`, msg.ID)
				for i := range perPage {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, `{"name":"p%d_%d","inputSchema":{"type":"object"}}`, n, i)
				}
				b.WriteString(`]`)
				if n < safety {
					fmt.Fprintf(&b, `,"nextCursor":"c%d"`, n)
				}
				b.WriteString(`}}`)
				w.Header().Set("Content-Type", "application/json")
				w.Write(b.Bytes())
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	aggServe(t, []Upstream{{Name: "pages", URL: up.URL}}, AggregateOptions{})
	if n := int(pages.Load()); n*perPage > 10000+perPage {
		t.Fatalf("the broker read %d pages (%d tools) of an endless listing; want it to stop after %d tools", n, n*perPage, 10000)
	}
}
