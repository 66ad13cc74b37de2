package authserver

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// TestMetadata: the document says what the server does (S256 alone, iss
// in responses, DPoP algorithms, CIMD), names the registration endpoint
// only when registration is on, and carries no empty jwks_uri.
func TestMetadata(t *testing.T) {
	for _, register := range []bool{false, true} {
		f := newFixture(t, func(_ *fixture, c *Config) {
			if register {
				c.Register = http.NotFoundHandler()
			}
		})
		resp := f.do(httptest.NewRequest(http.MethodGet, testIssuer+WellKnown, nil))
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{
			"issuer":                 testIssuer,
			"authorization_endpoint": testIssuer + AuthorizePath,
			"token_endpoint":         testIssuer + TokenPath,
			"revocation_endpoint":    testIssuer + RevokePath,
			"authorization_response_iss_parameter_supported": true,
			"client_id_metadata_document_supported":          true,
		}
		for k, v := range want {
			if m[k] != v {
				t.Errorf("%s = %v, want %v", k, m[k], v)
			}
		}
		for k, v := range map[string]string{
			"code_challenge_methods_supported":      "S256",
			"response_types_supported":              "code",
			"token_endpoint_auth_methods_supported": "none",
			"grant_types_supported":                 "authorization_code refresh_token",
			"dpop_signing_alg_values_supported":     "ES256 ES384 EdDSA RS256 PS256",
			"scopes_supported":                      "sessions tools:call tools:read",
		} {
			var got []string
			for _, x := range m[k].([]any) {
				got = append(got, x.(string))
			}
			if strings.Join(got, " ") != v {
				t.Errorf("%s = %v, want %s", k, got, v)
			}
		}
		if _, ok := m["jwks_uri"]; ok {
			t.Error("the document has a jwks_uri, for keys the server does not have")
		}
		if _, ok := m["registration_endpoint"]; ok != register {
			t.Errorf("registration_endpoint present %v with registration %v", ok, register)
		}
	}
}

// TestMetadataGoSDK: go-sdk's client fetches the document, checks its
// issuer against where it fetched it, and finds PKCE S256.
func TestMetadataGoSDK(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + ln.Addr().String()
	f := newFixture(t, func(_ *fixture, c *Config) { c.Issuer = issuer })
	hs := httptest.NewUnstartedServer(f.srv)
	hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	defer hs.Close()
	m, err := oauthex.GetAuthServerMeta(context.Background(), issuer+WellKnown, issuer, hs.Client())
	if err != nil {
		t.Fatal(err)
	}
	if m.Issuer != issuer || !slices.Equal(m.CodeChallengeMethodsSupported, []string{"S256"}) || !m.AuthorizationResponseIssParameterSupported {
		t.Errorf("go-sdk read %+v", m)
	}
}

// TestIssuer: the issuer is an origin, https or loopback http, written as
// clients will compare it.
func TestIssuer(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{"https://mcp.example.com", ""},
		{"https://mcp.example.com/", ""},
		{"http://127.0.0.1:8080", ""},
		{"http://mcp.example.com", "loopback address only"},
		{"https://mcp.example.com/tenant", "no path"},
		{"https://mcp.example.com?x=1", "no user information, query"},
		{"https://MCP.example.com", "lower case"},
		{"mcp.example.com", "absolute https URL"},
		{"ftp://mcp.example.com", "absolute https URL"},
	} {
		got, err := CheckIssuer(tc.in)
		if tc.err == "" {
			if err != nil || got != strings.TrimSuffix(tc.in, "/") {
				t.Errorf("CheckIssuer(%q) = %q, %v", tc.in, got, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("CheckIssuer(%q) error %v, want it to say %q", tc.in, err, tc.err)
		}
	}
}

// TestMetadataMethod: the document is read with GET or HEAD; a POST is
// refused 405 with Allow, and audited.
func TestMetadataMethod(t *testing.T) {
	f := newFixture(t)
	resp := f.do(httptest.NewRequest(http.MethodPost, testIssuer+WellKnown, nil))
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if a := f.lastAudit(); a.Endpoint != WellKnown || !strings.Contains(a.Reason, "GET") {
		t.Errorf("audited %+v", a)
	}
}

// TestCORS: a client in a browser may read the metadata and call the
// token endpoint from any origin (no cookie is read there); the
// authorization and consent endpoints, which a browser navigates to, and
// registration get no CORS header.
func TestCORS(t *testing.T) {
	f := newFixture(t, func(_ *fixture, c *Config) { c.Register = http.NotFoundHandler() })
	pre := httptest.NewRequest(http.MethodOptions, testIssuer+TokenPath, nil)
	pre.Header.Set("Origin", "https://inspector.example")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Access-Control-Request-Headers", "content-type, dpop")
	resp := f.do(pre)
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "DPoP") || resp.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("preflight of the token endpoint: %d %v", resp.StatusCode, resp.Header)
	}
	get := httptest.NewRequest(http.MethodGet, testIssuer+WellKnown, nil)
	get.Header.Set("Origin", "https://inspector.example")
	if resp := f.do(get); resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("metadata from a page: %v", resp.Header)
	}
	for _, path := range []string{AuthorizePath, ConsentPath, RegisterPath} {
		r := httptest.NewRequest(http.MethodOptions, testIssuer+path, nil)
		r.Header.Set("Origin", "https://evil.example")
		r.Header.Set("Access-Control-Request-Method", "POST")
		if resp := f.do(r); resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s answers a preflight: %v", path, resp.Header)
		}
	}
}
