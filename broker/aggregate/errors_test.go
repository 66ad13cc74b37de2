package aggregate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// capabilityUp is a stateless go-sdk server whose tool and prompt answer
// MCP 2026-07-28's MissingRequiredClientCapabilityError: -32021 whose data
// names the capability the call needs (SEP-2575), as go-sdk's
// everything-server answers a client that did not declare sampling.
func capabilityUp(t *testing.T) string {
	t.Helper()
	missing := func() error {
		return &jsonrpc.Error{Code: mcp.CodeMissingRequiredClientCapabilities, Message: "sampling capability required but not declared by client",
			Data: json.RawMessage(`{"requiredCapabilities":{"sampling":{}}}`)}
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "caps", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "needs_sampling", InputSchema: &jsonschema.Schema{Type: "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, missing()
	})
	s.AddPrompt(&mcp.Prompt{Name: "needs_sampling"}, func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return nil, missing()
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// An upstream's JSON-RPC error reaches the aggregated route's client as
// the upstream answered it: its code, its message and its data (here
// -32021 with the ClientCapabilities it needs, which the conformance
// suite's server-stateless checks), on tools/call and prompts/get, by the
// 2026-07-28 fast path, by go-sdk's path, and to a 2025-11-25 client.
func TestAggregateUpstreamErrorsAsAnswered(t *testing.T) {
	a, url := aggServeEdge(t, []upstream.Config{{Name: "a", URL: capabilityUp(t)}}, Options{})
	modern := modernClient(t, url, "tok-1", nil)
	legacy := legacyClient(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wantData := `{"requiredCapabilities":{"sampling":{}}}`
	check := func(what string, err error) {
		t.Helper()
		var re *jsonrpc.Error
		if !errors.As(err, &re) {
			t.Errorf("%s: %v, want the upstream's JSON-RPC error", what, err)
			return
		}
		var got, want any
		if json.Unmarshal(re.Data, &got) != nil || json.Unmarshal([]byte(wantData), &want) != nil || !jsonEqual(got, want) {
			t.Errorf("%s: data %s, want %s", what, re.Data, wantData)
		}
		if re.Code != mcp.CodeMissingRequiredClientCapabilities || re.Message != "sampling capability required but not declared by client" {
			t.Errorf("%s: error %d %q, want the upstream's -32021 and its message", what, re.Code, re.Message)
		}
	}
	call := &mcp.CallToolParams{Name: "mcp_a_needs_sampling"}
	// The first call opens the principal's upstream session: go-sdk's path.
	_, err := modern.CallTool(ctx, call)
	check("2026-07-28 tools/call, first", err)
	before := a.modernFastCalls.Load()
	_, err = modern.CallTool(ctx, call)
	check("2026-07-28 tools/call, fast path", err)
	if a.modernFastCalls.Load() != before+1 {
		t.Error("the second call did not take the fast path")
	}
	a.noModernFast.Store(true)
	_, err = modern.CallTool(ctx, call)
	a.noModernFast.Store(false)
	check("2026-07-28 tools/call, go-sdk's path", err)
	_, err = modern.GetPrompt(ctx, &mcp.GetPromptParams{Name: "mcp_a_needs_sampling"})
	check("2026-07-28 prompts/get", err)
	_, err = legacy.CallTool(ctx, call)
	check("2025-11-25 tools/call", err)
	_, err = legacy.GetPrompt(ctx, &mcp.GetPromptParams{Name: "mcp_a_needs_sampling"})
	check("2025-11-25 prompts/get", err)
}

// jsonEqual compares two decoded JSON values.
func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// A 2026-07-28 error answer carries the HTTP status SEP-2575 gives its
// code, on both of the route's paths as go-sdk's server sends it: 400 for
// the upstream's -32021 (the conformance suite's
// MissingCapabilityHttp400), with the upstream's error in the body.
func TestAggregateModernErrorStatus(t *testing.T) {
	a, url := aggServeEdge(t, []upstream.Config{{Name: "a", URL: capabilityUp(t)}}, Options{})
	body := `{"jsonrpc":"2.0","id":401,"method":"tools/call","params":{` + modernMeta + `,"name":"mcp_a_needs_sampling","arguments":{}}}`
	hdr := map[string]string{"Mcp-Name": "mcp_a_needs_sampling"}
	for _, path := range []string{"go-sdk's, first", "fast", "go-sdk's"} {
		before := a.modernFastCalls.Load()
		a.noModernFast.Store(path == "go-sdk's")
		code, answer := modernPost(t, url, body, hdr)
		a.noModernFast.Store(false)
		if fast := a.modernFastCalls.Load() != before; fast != (path == "fast") {
			t.Errorf("%s path: the fast path took the call: %v", path, fast)
		}
		var msg struct {
			ID    int `json:"id"`
			Error struct {
				Code int             `json:"code"`
				Data json.RawMessage `json:"data"`
			} `json:"error"`
		}
		if code != http.StatusBadRequest || json.Unmarshal([]byte(answer), &msg) != nil || msg.ID != 401 ||
			msg.Error.Code != mcp.CodeMissingRequiredClientCapabilities || string(msg.Error.Data) != `{"requiredCapabilities":{"sampling":{}}}` {
			t.Errorf("%s path: HTTP %d %s; want 400 with the upstream's -32021 and its data", path, code, answer)
		}
	}
}
