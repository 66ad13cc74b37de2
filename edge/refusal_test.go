package edge

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Each refusal's JSON-RPC code is the table's code for what happened, and
// a code tells one thing: a client refused for its credential and one
// whose session is unknown are not told the same code (they were, -32001).
func TestRefusalCodes(t *testing.T) {
	unknown := Refuse(http.StatusNotFound, "session_unknown", "initialize again")
	unknown.Code = message.CodeUnknownSession
	res := ProtectedResource{URL: &url.URL{Path: "/mcp"}}
	for _, c := range []struct {
		name string
		v    Verdict
		want int
	}{
		{"no token", Refuse(http.StatusUnauthorized, "no_token", "send a token"), message.CodeUnauthorized},
		{"unknown session", unknown, message.CodeUnknownSession},
		{"scope", Refuse(http.StatusForbidden, ReasonScope, "ask for the scope"), message.CodeForbidden},
		{"rate", Refuse(http.StatusTooManyRequests, "rate_limited", "wait"), message.CodeRateLimited},
		{"too large", Refuse(http.StatusRequestEntityTooLarge, "too_large", "send less"), message.CodeTooLarge},
		{"keys", Refuse(http.StatusServiceUnavailable, "jwt_keys_unavailable", "retry"), message.CodeUnavailable},
		{"bad method", Refuse(http.StatusMethodNotAllowed, "method_not_allowed", "use POST"), message.CodeInvalidRequest},
	} {
		w := httptest.NewRecorder()
		if err := WriteRefusal(w, httptest.NewRequest(http.MethodPost, "/mcp", nil), res, c.v, nil); err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v: %s", c.name, err, w.Body)
		}
		if body.Error.Code != c.want {
			t.Errorf("%s: code %d, want %d", c.name, body.Error.Code, c.want)
		}
	}
	if message.CodeUnauthorized == message.CodeUnknownSession {
		t.Error("a failed credential and an unknown session share a code")
	}
}

// A refusal's data carries what its code promises there beside the
// reason: -32021's requiredCapabilities (MCP 2026-07-28).
func TestRefusalData(t *testing.T) {
	v := Verdict{Status: http.StatusBadRequest, Reason: "missing_capability", Code: message.CodeMissingClientCapability,
		Message: "declare the extension", Data: map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}}}
	w := httptest.NewRecorder()
	if err := WriteRefusal(w, httptest.NewRequest(http.MethodPost, "/mcp", nil), ProtectedResource{URL: &url.URL{Path: "/mcp"}}, v, nil); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct {
			Code int `json:"code"`
			Data struct {
				Reason               string `json:"reason"`
				RequiredCapabilities struct {
					Extensions map[string]any `json:"extensions"`
				} `json:"requiredCapabilities"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if _, ok := body.Error.Data.RequiredCapabilities.Extensions["io.modelcontextprotocol/tasks"]; !ok || body.Error.Data.Reason != "missing_capability" || body.Error.Code != message.CodeMissingClientCapability {
		t.Fatalf("refusal body: %s", w.Body)
	}
}

// What a client sees of a refusal, byte for byte: the challenge that
// tells a missing credential from a bad one and from a missing scope
// (with error=, which go-sdk's own does not write), pointing at the
// metadata of the resource as configured or, for a path alone, where the
// client asked; the body with the call's id; the headers of the status.
func TestRefusalOnTheWire(t *testing.T) {
	abs, _ := url.Parse("https://mcp.example.com/mcp")
	retry := Refuse(http.StatusTooManyRequests, "rate_limited", "rate limit for this token exceeded")
	retry.RetryAfter = 1500 * time.Millisecond
	method := Refuse(http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
	method.Allow = "GET, POST, DELETE"
	scope := Refuse(http.StatusForbidden, ReasonScope, `token "ci" lacks a scope for tool deploy: it needs one of "deploy", mcp`)
	scope.Need = []string{"deploy", "mcp"}
	tool := Verdict{Status: http.StatusForbidden, Reason: "pin_changed", Message: "tool x changed", ToolError: true}
	for _, c := range []struct {
		name      string
		res       *url.URL
		v         Verdict
		id        json.RawMessage
		challenge string
		header    map[string]string
		body      string
		status    int
	}{
		{"no token, path resource", &url.URL{Path: "/mcp/"}, Refuse(http.StatusUnauthorized, ReasonNoToken, "send a token"), nil,
			`Bearer resource_metadata="http://gw.test:8080/.well-known/oauth-protected-resource/mcp"`, nil,
			`{"jsonrpc":"2.0","id":null,"error":{"code":-32010,"message":"send a token","data":{"reason":"no_token"}}}`, 401},
		{"bad token, absolute resource", abs, Refuse(http.StatusUnauthorized, ReasonInvalidToken, "token \"x\"\nrevoked\\"), json.RawMessage(`7`),
			`Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp", error="invalid_token", error_description="token 'x''revoked'"`, nil,
			`{"jsonrpc":"2.0","id":7,"error":{"code":-32010,"message":"token \"x\"\nrevoked\\","data":{"reason":"invalid_token"}}}`, 401},
		{"missing scope", abs, scope, json.RawMessage(`"a"`),
			`Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp", error="insufficient_scope", scope="deploy mcp", error_description="token 'ci' lacks a scope for tool deploy: it needs one of 'deploy', mcp"`, nil,
			`{"jsonrpc":"2.0","id":"a","error":{"code":-32003,"message":"token \"ci\" lacks a scope for tool deploy: it needs one of \"deploy\", mcp","data":{"reason":"insufficient_scope"}}}`, 403},
		{"rate limited", abs, retry, nil, "", map[string]string{"Retry-After": "2"},
			`{"jsonrpc":"2.0","id":null,"error":{"code":-32029,"message":"rate limit for this token exceeded","data":{"reason":"rate_limited"}}}`, 429},
		{"method", abs, method, nil, "", map[string]string{"Allow": "GET, POST, DELETE"},
			`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"use POST","data":{"reason":"method_not_allowed"}}}`, 405},
		{"tool error", abs, tool, json.RawMessage(`3`), "", nil,
			`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"tool x changed"}],"isError":true}}`, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "http://gw.test:8080/mcp", nil)
			w := httptest.NewRecorder()
			if err := WriteRefusal(w, r, ProtectedResource{URL: c.res}, c.v, c.id); err != nil {
				t.Fatal(err)
			}
			if got := w.Header().Get("WWW-Authenticate"); got != c.challenge {
				t.Errorf("WWW-Authenticate:\n got %s\nwant %s", got, c.challenge)
			}
			for k, want := range c.header {
				if got := w.Header().Get(k); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			if w.Code != c.status || w.Body.String() != c.body || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
				t.Errorf("%d %s %q %q\nwant %d %s", w.Code, w.Body, w.Header().Get("Content-Type"), w.Header().Get("Cache-Control"), c.status, c.body)
			}
		})
	}
}
