package edge

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// The RFC 9728 document names the resource as configured, or for a path
// alone where the client asked; the authorization servers whose tokens it
// takes; its scopes; bearer tokens in the header only. It is served at the
// well-known path and at that path followed by the resource's, read with
// GET or HEAD.
func TestProtectedResourceMetadata(t *testing.T) {
	abs, _ := url.Parse("https://mcp.example.com/mcp")
	for _, c := range []struct {
		name     string
		res      ProtectedResource
		resource string
	}{
		{"absolute, with an issuer", ProtectedResource{URL: abs, AuthorizationServers: []string{"https://idp.example/"}, Scopes: []string{"chat", "mcp"}}, "https://mcp.example.com/mcp"},
		{"a path alone", ProtectedResource{URL: &url.URL{Path: "/mcp"}, Scopes: []string{"read"}}, "http://gw.test:8080/mcp"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, path := range []string{WellKnownResource, WellKnownResource + "/mcp"} {
				if !c.res.ServesMetadata(path) {
					t.Fatalf("%s is not served", path)
				}
				w := httptest.NewRecorder()
				c.res.ServeMetadata(w, httptest.NewRequest(http.MethodGet, "http://gw.test:8080"+path, nil))
				var doc oauthex.ProtectedResourceMetadata
				if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
					t.Fatal(err)
				}
				if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "max-age=300" ||
					doc.Resource != c.resource || !slices.Equal(doc.AuthorizationServers, c.res.AuthorizationServers) ||
					!slices.Equal(doc.ScopesSupported, c.res.Scopes) || !slices.Equal(doc.BearerMethodsSupported, []string{"header"}) || doc.ResourceName != "caddy-zidane-mcp" {
					t.Errorf("%s: %d %s", path, w.Code, w.Body)
				}
			}
			for _, path := range []string{WellKnownResource + "/other", WellKnownResource + "/mcp/x", "/mcp"} {
				if c.res.ServesMetadata(path) {
					t.Errorf("%s is served", path)
				}
			}
			w := httptest.NewRecorder()
			c.res.ServeMetadata(w, httptest.NewRequest(http.MethodPost, "http://gw.test:8080"+WellKnownResource, nil))
			if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("POST: %d Allow %q, want 405 naming GET, HEAD", w.Code, w.Header().Get("Allow"))
			}
		})
	}
}

// The address handed to agents is the configured resource's origin, else
// the listener the request came in on: never the Host a client chose.
func TestAgentBaseIgnoresHost(t *testing.T) {
	abs, _ := url.Parse("https://mcp.example.com/mcp")
	listener := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	for _, c := range []struct {
		name     string
		res      *url.URL
		listener net.Addr
		tls      bool
		want     string
	}{
		{"absolute resource", abs, listener, false, "https://mcp.example.com"},
		{"a path: the listener", &url.URL{Path: "/mcp"}, listener, false, "http://127.0.0.1:8080"},
		{"a path over TLS", &url.URL{Path: "/mcp"}, &net.TCPAddr{IP: net.ParseIP("::1"), Port: 8443}, true, "https://[::1]:8443"},
		{"a unix socket", &url.URL{Path: "/mcp"}, &net.UnixAddr{Name: "/run/gw.sock", Net: "unix"}, false, ""},
	} {
		r := httptest.NewRequest(http.MethodPost, "http://evil.example/mcp", nil)
		r.Header.Set("X-Forwarded-Host", "evil.example")
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, c.listener))
		if c.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if got := (ProtectedResource{URL: c.res}).AgentBase(r); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
