package caddymodule

import (
	"net/http"
	"strings"
	"testing"
)

// A replica that is shutting down answers its health check with 503 and
// refuses to open a new 2025-11-25 session (503, Retry-After), while a
// request that opens none still goes through.
func TestDrainingRefusesNewSessionsAndFailsHealthCheck(t *testing.T) {
	e := newGuardEdge(t)
	health := func() (int, string) {
		t.Helper()
		_, status, body := e.send(t, edgeInput{http.MethodGet, HealthzPath, "", nil, 0})
		return status, body
	}
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	const list = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`

	if status, body := health(); status != http.StatusOK || !strings.Contains(body, `"status":"ok"`) || !strings.Contains(body, `"storage":"local"`) {
		t.Fatalf("health while serving: %d %s", status, body)
	}
	if got, status, _ := e.send(t, edgeInput{http.MethodPost, "/mcp", "", []byte(initialize), credAll | flagContentType}); status != http.StatusOK || got == nil {
		t.Fatalf("initialize while serving: %d", status)
	}

	draining = func() bool { return true }
	t.Cleanup(func() { draining = caddyExiting })
	if status, body := health(); status != http.StatusServiceUnavailable || !strings.Contains(body, `"status":"draining"`) {
		t.Fatalf("health while draining: %d %s", status, body)
	}
	r, err := parseRequest(e.raw(edgeInput{http.MethodPost, "/mcp", "", []byte(initialize), credAll | flagContentType}))
	if err != nil {
		t.Fatal(err)
	}
	got, w := e.serve(t, r, credAll|flagContentType)
	if w.Code != http.StatusServiceUnavailable || got != nil || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "another replica") {
		t.Fatalf("initialize while draining: %d (reached: %v) Retry-After %q %s", w.Code, got != nil, w.Header().Get("Retry-After"), w.Body.String())
	}
	if got, status, body := e.send(t, edgeInput{http.MethodPost, "/mcp", "", []byte(list), credAll | flagContentType}); status != http.StatusOK || got == nil {
		t.Fatalf("a request that opens no session, while draining: %d %s", status, body)
	}
	if _, status, _ := e.send(t, edgeInput{http.MethodPost, HealthzPath, "", nil, 0}); status != http.StatusMethodNotAllowed {
		t.Fatalf("POST %s: %d, want 405", HealthzPath, status)
	}
}
