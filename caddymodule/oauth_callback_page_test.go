package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The upstream login's callback page carries the headers of every other
// page of the gateway: never framed, never sniffed, never stored, no
// referrer, nothing loaded.
func TestOAuthCallbackPageHeaders(t *testing.T) {
	h := &Handler{}
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		w := httptest.NewRecorder()
		if err := h.serveOAuthCallback(w, httptest.NewRequest(method, OAuthCallbackPath+"nowhere", nil)); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"Content-Type":            "text/html; charset=utf-8",
			"Content-Security-Policy": "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
			"X-Frame-Options":         "DENY",
			"X-Content-Type-Options":  "nosniff",
			"Cache-Control":           "no-store",
			"Referrer-Policy":         "no-referrer",
		}
		for name, v := range want {
			if got := w.Header().Get(name); got != v {
				t.Errorf("%s %s: %q, want %q", method, name, got, v)
			}
		}
		if len(w.Header()) != len(want) {
			t.Errorf("%s: headers %v, want exactly %v", method, w.Header(), want)
		}
		if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "No login here") {
			t.Errorf("%s: %d %s", method, w.Code, w.Body)
		}
	}
}
