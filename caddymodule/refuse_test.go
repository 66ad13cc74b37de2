package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Each refusal's JSON-RPC code is the table's code for what happened, and
// a code tells one thing: a client refused for its credential and one
// whose session is unknown are not told the same code (they were, -32001).
func TestRefusalCodes(t *testing.T) {
	h := &Handler{audit: zap.NewNop(), logger: zap.NewNop()}
	unknown := unknownSession("session_unknown", "initialize again")
	for _, c := range []struct {
		name string
		v    edge.Verdict
		want int
	}{
		{"no token", edge.Refuse(http.StatusUnauthorized, "no_token", "send a token"), message.CodeUnauthorized},
		{"unknown session", unknown.Verdict, message.CodeUnknownSession},
		{"scope", edge.Refuse(http.StatusForbidden, edge.ReasonScope, "ask for the scope"), message.CodeForbidden},
		{"rate", edge.Refuse(http.StatusTooManyRequests, "rate_limited", "wait"), message.CodeRateLimited},
		{"too large", edge.Refuse(http.StatusRequestEntityTooLarge, "too_large", "send less"), message.CodeTooLarge},
		{"keys", edge.Refuse(http.StatusServiceUnavailable, "jwt_keys_unavailable", "retry"), message.CodeUnavailable},
		{"bad method", edge.Refuse(http.StatusMethodNotAllowed, "method_not_allowed", "use POST"), message.CodeInvalidRequest},
	} {
		w := httptest.NewRecorder()
		rf := refusal{status: c.v.Status, reason: c.v.Reason, message: c.v.Message}
		if err := h.writeRefusal(w, rf, c.v.Code, c.v.Data); err != nil {
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
	h := &Handler{audit: zap.NewNop(), logger: zap.NewNop()}
	v := edge.Verdict{Status: http.StatusBadRequest, Reason: "missing_capability", Code: message.CodeMissingClientCapability,
		Message: "declare the extension", Data: map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}}}
	w := httptest.NewRecorder()
	if err := h.writeRefusal(w, refusal{status: v.Status, reason: v.Reason, message: v.Message}, v.Code, v.Data); err != nil {
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
