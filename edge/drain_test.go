package edge

import (
	"net/http"
	"net/http/httptest"
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

// A load balancer's health check: 200 while the replica takes new work,
// 503 once it drains; on a cluster it says whether NATS is reachable
// without failing on it; it is read with GET or HEAD, never cached.
func TestServeHealth(t *testing.T) {
	for _, c := range []struct {
		h      Health
		status int
		body   string
	}{
		{Health{}, http.StatusOK, `{"status":"ok","storage":"local"}`},
		{Health{Draining: true}, http.StatusServiceUnavailable, `{"status":"draining","storage":"local"}`},
		{Health{Cluster: true, Connected: true}, http.StatusOK, `{"nats":"connected","status":"ok","storage":"nats"}`},
		{Health{Cluster: true}, http.StatusOK, `{"nats":"away","status":"ok","storage":"nats"}`},
		{Health{Cluster: true, Draining: true}, http.StatusServiceUnavailable, `{"nats":"away","status":"draining","storage":"nats"}`},
	} {
		w := httptest.NewRecorder()
		ServeHealth(w, httptest.NewRequest(http.MethodGet, HealthPath, nil), c.h)
		if w.Code != c.status || strings.TrimSpace(w.Body.String()) != c.body || w.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("%+v: %d %s, want %d %s", c.h, w.Code, w.Body, c.status, c.body)
		}
	}
	w := httptest.NewRecorder()
	ServeHealth(w, httptest.NewRequest(http.MethodPost, HealthPath, nil), Health{})
	if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d Allow %q", w.Code, w.Header().Get("Allow"))
	}
}
