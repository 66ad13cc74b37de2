package sessionpage

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
	"github.com/Tahul/caddy-zidane-mcp/sessions/demoagent"
)

// The page reads a real engine's session, run by the demo agent: this test
// binary re-executed with SESSIONPAGE_DEMOAGENT=1.
func TestMain(m *testing.M) {
	if os.Getenv("SESSIONPAGE_DEMOAGENT") == "1" {
		os.Exit(demoagent.Main(context.Background()))
	}
	os.Exit(m.Run())
}

// TestPageHeadersExact pins every header of a session's page, and of its
// refusals (plain text, written by net/http), as they were before the
// pages shared internal/htmlpage. The capability is in the page's address:
// no referrer at all, and no form.
func TestPageHeadersExact(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	engine, err := sessions.NewEngine(ctx, sessions.Config{
		Agents: map[string]sessions.AgentConfig{"demo": {Command: []string{exe},
			Env: map[string]string{"SESSIONPAGE_DEMOAGENT": "1", "GORACE": "atexit_sleep_ms=0"}}},
		DefaultAgent: "demo",
		Storage:      &certmagic.FileStorage{Path: t.TempDir()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.Close() })
	owner := sessions.Owner{TokenID: "tok-alice", TokenName: "alice", MCPSession: "mcp-alice"}
	c, err := engine.Create(ctx, owner, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "hello from the page test"})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := engine.Wait(ctx, owner, c.SessionID, 30*time.Second); err != nil || v.State != sessions.StateIdle {
		t.Fatalf("the session did not settle idle: %+v, %v", v, err)
	}
	signer := NewSigner(time.Minute)
	p := &Page{Sessions: engine, Signer: signer}
	link := signer.Link("https://gw.example.com", c.SessionID)
	serve := func(method, target string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest(method, target, nil))
		return w
	}
	html := "text/html; charset=utf-8"
	text := "text/plain; charset=utf-8"
	for _, tc := range []struct {
		name        string
		w           *httptest.ResponseRecorder
		status      int
		contentType string
		word        string
		allow       bool
	}{
		{"the page", serve(http.MethodGet, link), http.StatusOK, html, "hello from the page test", false},
		{"wrong method", serve(http.MethodPost, link), http.StatusMethodNotAllowed, text, "read-only", true},
		{"another session's capability", serve(http.MethodGet, strings.Replace(link, c.SessionID, "ses_0123456789abcdef", 1)), http.StatusForbidden, text, "another session", false},
		{"no session id", serve(http.MethodGet, "https://gw.example.com"+PathPrefix), http.StatusNotFound, text, "no such session page", false},
	} {
		if tc.w.Code != tc.status || !strings.Contains(tc.w.Body.String(), tc.word) {
			t.Fatalf("%s: status %d, want %d with %q: %s", tc.name, tc.w.Code, tc.status, tc.word, tc.w.Body)
		}
		want := map[string]string{
			"Content-Type":            tc.contentType,
			"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
			"X-Frame-Options":         "DENY",
			"X-Content-Type-Options":  "nosniff",
			"Cache-Control":           "no-store",
			"Referrer-Policy":         "no-referrer",
		}
		if tc.allow {
			want["Allow"] = "GET, HEAD"
		}
		h := tc.w.Result().Header
		for k, v := range h {
			if w, ok := want[k]; !ok || len(v) != 1 || v[0] != w {
				t.Errorf("%s: %s: %q, want %q", tc.name, k, v, w)
			}
		}
		for k, w := range want {
			if _, ok := h[k]; !ok {
				t.Errorf("%s: no %s, want %q", tc.name, k, w)
			}
		}
	}
}
