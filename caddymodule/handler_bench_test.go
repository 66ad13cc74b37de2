package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// echoAnswer is what the server behind answers to every call in
// BenchmarkGuardHandler: a tools/call result as the bench's echo tool gives.
const echoAnswer = `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hello"}]}}`

// BenchmarkGuardHandler measures what the guard's handler costs a tools/call
// in-process, against the server behind alone ("next only") in the same run:
// authentication, reading and deciding the body, the rate limit, the route
// and the answer's filter. It is the part of the guard's overhead over
// reverse_proxy that this repository's code owns.
func BenchmarkGuardHandler(b *testing.B) {
	e := newGuardEdge(b)
	behind := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, err := io.WriteString(w, echoAnswer)
		return err
	})
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","arguments":{"text":"hello"}}}`
	modern := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","arguments":{"text":"hello"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	request := func(body string, version string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+e.toolA)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("Mcp-Protocol-Version", version)
		if version == "2026-07-28" {
			r.Header.Set("Mcp-Method", "tools/call")
			r.Header.Set("Mcp-Name", "a")
		}
		return r
	}
	run := func(b *testing.B, body, version string, h func(http.ResponseWriter, *http.Request) error) {
		b.ReportAllocs()
		for b.Loop() {
			w := httptest.NewRecorder()
			if err := h(w, request(body, version)); err != nil {
				b.Fatal(err)
			}
			if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"hello"`) {
				b.Fatalf("answered %d: %s", w.Code, w.Body.String())
			}
		}
	}
	guard := func(w http.ResponseWriter, r *http.Request) error { return e.h.ServeHTTP(w, r, behind) }
	b.Run("next only", func(b *testing.B) { run(b, call, "2025-11-25", behind.ServeHTTP) })
	b.Run("guard 2025-11-25", func(b *testing.B) { run(b, call, "2025-11-25", guard) })
	b.Run("guard 2026-07-28", func(b *testing.B) { run(b, modern, "2026-07-28", guard) })
}

// BenchmarkGuardHandlerRules is BenchmarkGuardHandler's guard with the
// five rules of `go run ./bench -rules` (none holds for the call, so all
// five decide it), against the same guard without them in the same run.
func BenchmarkGuardHandlerRules(b *testing.B) {
	behind := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, err := io.WriteString(w, echoAnswer)
		return err
	})
	five := []PolicyRule{
		{Effect: "deny", Expr: "tool.name == 'drop_table'", Message: "dropping tables is not allowed here"},
		{Effect: "deny", Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "production deploys are not allowed here"},
		{Effect: "deny", Expr: `tool.name == 'a' && args.text.matches('(?i)\\b(drop|truncate)\\b')`, Message: "no destructive statements"},
		{Effect: "deny", Expr: "'readonly' in principal.scopes && tool.name.startsWith('write_')", Message: "this token is read-only"},
		{Effect: "allow", Expr: "'db' in principal.scopes && tool.name == 'run_query'"},
	}
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","arguments":{"text":"hello"}}}`
	for _, c := range []struct {
		name  string
		rules []PolicyRule
	}{{"no rules", nil}, {"five rules", five}} {
		e := newGuardEdgeWith(b, c.rules)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", strings.NewReader(call))
				r.Header.Set("Authorization", "Bearer "+e.toolA)
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Accept", "application/json, text/event-stream")
				w := httptest.NewRecorder()
				if err := e.h.ServeHTTP(w, r, behind); err != nil || w.Code != http.StatusOK {
					b.Fatalf("answered %d (%v): %s", w.Code, err, w.Body.String())
				}
			}
		})
		_ = caddy.Stop()
	}
}
