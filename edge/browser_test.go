package edge

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// A browser's preflight for a 2026-07-28 request is allowed the headers it
// carries: Mcp-Method, Mcp-Name and the Mcp-Param-* it names (bounded),
// and no other header it asks for.
func TestPreflightAllowsModernHeaders(t *testing.T) {
	got := corsAllowHeaders([]string{"mcp-method, Mcp-Name, Mcp-Param-Region", "mcp-param-level,X-Evil, mcp-param-, Mcp-Param-Bad Name"})
	for _, want := range []string{"Mcp-Method", "Mcp-Name", "Mcp-Param-Region", "mcp-param-level", "Mcp-Session-Id"} {
		if !strings.Contains(got, want) {
			t.Errorf("preflight allows %q; want %s among them", got, want)
		}
	}
	for _, name := range strings.Split(got, ", ") {
		if name == "X-Evil" || name == "mcp-param-" || strings.Contains(name, " ") {
			t.Errorf("preflight allows %q, which holds %q", got, name)
		}
	}
	many := strings.Repeat("Mcp-Param-A,", 1000)
	if n := strings.Count(corsAllowHeaders([]string{many}), "Mcp-Param-A"); n != maxCORSParamHeaders {
		t.Errorf("%d Mcp-Param names allowed from one preflight, want at most %d", n, maxCORSParamHeaders)
	}
}

// Step 1: on a loopback listener only a loopback Host is served, unless
// the operator turned the protection off (a proxy in front on this
// machine); a browser's Origin must be allowed, and a request without one
// (no browser) is not affected.
func TestCheckHostOrigin(t *testing.T) {
	origins, err := policy.NewOrigins([]string{"https://app.example"})
	if err != nil {
		t.Fatal(err)
	}
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	public := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 443}
	for _, c := range []struct {
		name       string
		listener   net.Addr
		host       string
		origin     string
		protection bool
		reason     string
	}{
		{"loopback Host on loopback", loopback, "127.0.0.1:8080", "", true, ""},
		{"localhost on loopback", loopback, "localhost:8080", "", true, ""},
		{"a rebinding name on loopback", loopback, "evil.example:8080", "", true, "host"},
		{"the same, protection off", loopback, "evil.example:8080", "", false, ""},
		{"any Host on a public listener", public, "mcp.example", "", true, ""},
		{"an allowed Origin", public, "mcp.example", "https://app.example", true, ""},
		{"another Origin", public, "mcp.example", "https://evil.example", true, "origin"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "http://"+c.host+"/mcp", nil)
			r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, c.listener))
			if c.origin != "" {
				r.Header.Set("Origin", c.origin)
			}
			v := CheckHostOrigin(r, origins, c.protection)
			if v.Reason != c.reason || (c.reason != "" && v.Status != http.StatusForbidden) {
				t.Fatalf("%d %q %q, want reason %q", v.Status, v.Reason, v.Message, c.reason)
			}
		})
	}
}

// A browser's request gets the CORS headers of its Origin, and only its
// preflight (OPTIONS with Access-Control-Request-Method) is answered here.
func TestPreflight(t *testing.T) {
	r := httptest.NewRequest(http.MethodOptions, "http://mcp.example/mcp", nil)
	r.Header.Set("Origin", "https://app.example")
	r.Header.Set("Access-Control-Request-Method", "POST")
	r.Header.Set("Access-Control-Request-Headers", "authorization, mcp-param-region")
	w := httptest.NewRecorder()
	if !Preflight(w, r) || w.Code != http.StatusNoContent || w.Header().Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.HasSuffix(w.Header().Get("Access-Control-Allow-Headers"), ", mcp-param-region") || w.Header().Get("Access-Control-Max-Age") != "600" {
		t.Fatalf("preflight: %d %v", w.Code, w.Header())
	}
	r = httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", nil)
	r.Header.Set("Origin", "https://app.example")
	w = httptest.NewRecorder()
	if Preflight(w, r) || w.Header().Get("Access-Control-Allow-Origin") != "https://app.example" || w.Header().Get("Access-Control-Allow-Methods") != "" {
		t.Fatalf("a browser's POST: answered, or without its CORS headers: %v", w.Header())
	}
	w = httptest.NewRecorder()
	if Preflight(w, httptest.NewRequest(http.MethodOptions, "http://mcp.example/mcp", nil)) || len(w.Header()) != 0 {
		t.Fatalf("no Origin: %v", w.Header())
	}
}
