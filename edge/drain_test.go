package edge

import (
	"net/http"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// A replica that is shutting down refuses what would open a 2025-11-25
// session there, with a Retry-After and a message that sends the client
// to another replica, and lets through everything that opens none.
func TestDrainRefusesOnlyNewLegacySessions(t *testing.T) {
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for _, c := range []struct {
		name    string
		method  string
		session string
		body    string
		refused bool
	}{
		{"initialize", http.MethodPost, "", initialize, true},
		{"initialize in a batch", http.MethodPost, "", `[{"jsonrpc":"2.0","id":2,"method":"ping"},` + initialize + `]`, true},
		{"initialize on a session", http.MethodPost, "s-1", initialize, false},
		{"a call on a session", http.MethodPost, "s-1", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, false},
		{"a 2026-07-28 call", http.MethodPost, "", `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, false},
		{"the GET stream", http.MethodGet, "s-1", "", false},
		{"ending a session", http.MethodDelete, "s-1", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			if c.session != "" {
				h.Set("Mcp-Session-Id", c.session)
			}
			var b *message.Body
			if c.body != "" {
				var err error
				if b, err = message.Read([]byte(c.body)); err != nil {
					t.Fatal(err)
				}
			}
			v := Drain(c.method, h, b)
			if !c.refused {
				if !v.Allowed() {
					t.Fatalf("refused: %+v", v)
				}
				return
			}
			if v.Status != http.StatusServiceUnavailable || v.Reason != ReasonDraining || v.RetryAfter <= 0 || !strings.Contains(v.Message, "another replica") {
				t.Fatalf("%+v, want 503 draining with a Retry-After, sending the client to another replica", v)
			}
		})
	}
}
