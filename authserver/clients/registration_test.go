package clients

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

const goodRegistration = `{"client_name":"Test Client","redirect_uris":["http://127.0.0.1/callback"],"token_endpoint_auth_method":"none","grant_types":["authorization_code","refresh_token"],"response_types":["code"]}`

// register posts body to r's registration endpoint from addr.
func register(r *Registry, addr, contentType, method, body string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "https://gateway.example.com/oauth/register", strings.NewReader(body))
	req.RemoteAddr = addr + ":50000"
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	r.Register(w, req)
	return w
}

type oauthError struct {
	Error       string `json:"error"`
	Description string `json:"error_description"`
}

func decodeError(t *testing.T, w *httptest.ResponseRecorder) oauthError {
	t.Helper()
	var e oauthError
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
		t.Fatalf("answer %d is not an OAuth error: %q", w.Code, w.Body.String())
	}
	if e.Description == "" {
		t.Errorf("error %s has no description", e.Error)
	}
	if w.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", w.Header().Get("Cache-Control"))
	}
	return e
}

// TestRegistrationAttacks is what a caller of the registration endpoint
// can send, and what it must get: status, OAuth error, the audit reason,
// and nothing stored.
func TestRegistrationAttacks(t *testing.T) {
	tests := []struct {
		name        string
		cfg         Config
		method      string
		contentType string
		body        string
		status      int
		code        string
		reason      string
	}{
		{"registration off", Config{}, "POST", "application/json", goodRegistration, 403, CodeAccessDenied, "registration_off"},
		{"GET", Config{Registration: true}, "GET", "", "", 405, CodeInvalidClientMetadata, "method"},
		{"form body", Config{Registration: true}, "POST", "application/x-www-form-urlencoded", "redirect_uris=x", 415, CodeInvalidClientMetadata, "content_type"},
		{"oversize", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["http://127.0.0.1/cb"],"x":"` + strings.Repeat("a", MaxMetadataBytes) + `"}`, 413, CodeInvalidClientMetadata, "too_large"},
		{"not JSON", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":`, 400, CodeInvalidClientMetadata, "json"},
		{"duplicate redirect_uris", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["http://127.0.0.1/cb"],"redirect_uris":["https://evil.example.com/cb"]}`, 400, CodeInvalidClientMetadata, "ambiguous"},
		{"case-variant redirect_uris", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["http://127.0.0.1/cb"],"Redirect_URIs":["https://evil.example.com/cb"]}`, 400, CodeInvalidClientMetadata, "ambiguous"},
		{"no redirect_uris", Config{Registration: true}, "POST", "application/json", `{"client_name":"x"}`, 400, CodeInvalidClientMetadata, "redirect_uris"},
		{"http redirect off loopback", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["http://app.example.com/cb"]}`, 400, CodeInvalidRedirectURI, "http_off_loopback"},
		{"redirect with a fragment", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["https://app.example.com/cb#f"]}`, 400, CodeInvalidRedirectURI, "fragment"},
		{"redirect with userinfo", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["https://u:p@app.example.com/cb"]}`, 400, CodeInvalidRedirectURI, "userinfo"},
		{"secret auth method", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["http://127.0.0.1/cb"],"token_endpoint_auth_method":"client_secret_post"}`, 400, CodeInvalidClientMetadata, "auth_method"},
		{"a client_secret", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["http://127.0.0.1/cb"],"client_secret":"s3cret-value"}`, 400, CodeInvalidClientMetadata, "secret"},
		{"too many redirect URIs", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["http://127.0.0.1/cb"` + strings.Repeat(`,"http://127.0.0.1/cb"`, MaxRedirectURIs) + `]}`, 400, CodeInvalidClientMetadata, "redirect_uris"},
		{"client_credentials grant", Config{Registration: true}, "POST", "application/json", `{"redirect_uris":["http://127.0.0.1/cb"],"grant_types":["client_credentials"]}`, 400, CodeInvalidClientMetadata, "grant_types"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _, rec := testRegistry(t, tt.cfg)
			w := register(r, "203.0.113.7", tt.contentType, tt.method, tt.body)
			if w.Code != tt.status {
				t.Fatalf("status %d (%s), want %d", w.Code, w.Body.String(), tt.status)
			}
			e := decodeError(t, w)
			if e.Error != tt.code {
				t.Errorf("error %q (%s), want %q", e.Error, e.Description, tt.code)
			}
			if strings.Contains(w.Body.String(), "s3cret") || strings.Contains(w.Body.String(), "evil") {
				t.Errorf("the answer quotes the request: %s", w.Body.String())
			}
			evs := rec.all()
			if len(evs) != 1 || evs[0].Kind != "registration" || evs[0].Reason != tt.reason || evs[0].Address != "203.0.113.7" {
				t.Errorf("audit = %+v, want one registration refusal for %s", evs, tt.reason)
			}
			if keys, _ := r.cfg.Storage.List(context.Background(), StoragePrefix, false); len(keys) != 0 {
				t.Errorf("stored %v", keys)
			}
		})
	}
}

// TestRegistrationPerAddressLimit: an address over its limit gets 429
// with Retry-After; X-Forwarded-For does not buy it a new bucket, and
// another address is not affected.
func TestRegistrationPerAddressLimit(t *testing.T) {
	r, _, rec := testRegistry(t, Config{Registration: true, RegistrationLimit: policy.Limit{Rate: 1.0 / 3600, Burst: 2}})
	for i := range 2 {
		if w := register(r, "198.51.100.9", "application/json", "POST", goodRegistration); w.Code != 201 {
			t.Fatalf("registration %d: %d %s", i, w.Code, w.Body.String())
		}
	}
	w := register(r, "198.51.100.9", "application/json", "POST", goodRegistration, "X-Forwarded-For", "192.0.2.1")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q: want 429 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	if e := decodeError(t, w); e.Error != CodeTemporarilyUnavailable {
		t.Errorf("error %q", e.Error)
	}
	if evs := rec.all(); len(evs) != 1 || evs[0].Reason != "rate_limited" {
		t.Errorf("audit = %+v", evs)
	}
	if w := register(r, "198.51.100.10", "application/json", "POST", goodRegistration); w.Code != 201 {
		t.Errorf("another address: %d %s", w.Code, w.Body.String())
	}
}

// TestRegistrationTotalBound: once MaxRegistered clients are kept, the
// next registration is refused, until unused ones expire and are swept.
func TestRegistrationTotalBound(t *testing.T) {
	r, clk, rec := testRegistry(t, Config{Registration: true, MaxRegistered: 2, RegisteredTTL: 48 * time.Hour})
	var ids []string
	for i := range 2 {
		w := register(r, "198.51.100.1", "application/json", "POST", goodRegistration)
		if w.Code != 201 {
			t.Fatalf("registration %d: %d %s", i, w.Code, w.Body.String())
		}
		var resp struct {
			ClientID string `json:"client_id"`
		}
		json.Unmarshal(w.Body.Bytes(), &resp)
		ids = append(ids, resp.ClientID)
	}
	w := register(r, "198.51.100.2", "application/json", "POST", goodRegistration)
	if w.Code != http.StatusForbidden {
		t.Fatalf("status %d, want 403", w.Code)
	}
	if e := decodeError(t, w); e.Error != CodeAccessDenied || !strings.Contains(e.Description, "metadata document") {
		t.Errorf("error %+v", e)
	}
	if evs := rec.all(); len(evs) != 1 || evs[0].Reason != "store_full" {
		t.Errorf("audit = %+v", evs)
	}
	// The first client is used on day 2; the second is not, and expires.
	clk.advance(25 * time.Hour)
	if _, err := r.Resolve(context.Background(), ids[0]); err != nil {
		t.Fatal(err)
	}
	clk.advance(24 * time.Hour)
	if w := register(r, "198.51.100.2", "application/json", "POST", goodRegistration); w.Code != 201 {
		t.Fatalf("after expiry: %d %s", w.Code, w.Body.String())
	}
	if _, err := r.Resolve(context.Background(), ids[1]); Reason(err) != "unknown_client" {
		t.Errorf("the unused client: %v, want it swept", err)
	}
	if _, err := r.Resolve(context.Background(), ids[0]); err != nil {
		t.Errorf("the used client: %v", err)
	}
}

// TestRegisteredClientExpires: a registered client unused for longer than
// RegisteredTTL is refused and deleted.
func TestRegisteredClientExpires(t *testing.T) {
	r, clk, _ := testRegistry(t, Config{Registration: true, RegisteredTTL: 2 * time.Hour})
	w := register(r, "198.51.100.1", "application/json", "POST", goodRegistration)
	var resp struct {
		ClientID string `json:"client_id"`
	}
	json.Unmarshal(w.Body.Bytes(), &resp)
	clk.advance(2*time.Hour + time.Second)
	if _, err := r.Resolve(context.Background(), resp.ClientID); Reason(err) != "expired" || codeOf(err) != CodeInvalidClient {
		t.Fatalf("got %v, want expired", err)
	}
	if _, err := r.cfg.Storage.Load(context.Background(), registeredKey(resp.ClientID)); err == nil {
		t.Errorf("the expired client is still stored")
	}
}

// TestRegistrationWithGoSDK registers through go-sdk's RFC 7591 client,
// as an MCP client does, then resolves the client it was given.
func TestRegistrationWithGoSDK(t *testing.T) {
	r, _, rec := testRegistry(t, Config{Registration: true})
	srv := httptest.NewServer(http.HandlerFunc(r.Register))
	defer srv.Close()
	got, err := oauthex.RegisterClient(context.Background(), srv.URL, &oauthex.ClientRegistrationMetadata{
		RedirectURIs:            []string{"http://localhost:6274/oauth/callback"},
		TokenEndpointAuthMethod: "none",
		GrantTypes:              []string{"authorization_code", "refresh_token"},
		ResponseTypes:           []string{"code"},
		ClientName:              "go-sdk test client",
		ClientURI:               "https://app.example.com",
	}, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got.ClientID, registeredPrefix) || got.ClientSecret != "" || got.TokenEndpointAuthMethod != "none" || got.ClientIDIssuedAt.IsZero() {
		t.Errorf("registration answer %+v", got)
	}
	c, err := r.Resolve(context.Background(), got.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != SourceRegistered || c.DisplayName() != "go-sdk test client" || c.ClientURI != "https://app.example.com" {
		t.Errorf("client %+v", c)
	}
	if !c.AllowsRedirect("http://localhost:39999/oauth/callback") || c.AllowsRedirect("http://127.0.0.1:39999/oauth/callback") {
		t.Errorf("redirects not as registered")
	}
	if evs := rec.all(); len(evs) != 0 {
		t.Errorf("refusals: %+v", evs)
	}
	// The stored record holds no secret and reads back as registered.
	raw, _ := r.cfg.Storage.Load(context.Background(), registeredKey(got.ClientID))
	if bytes.Contains(raw, []byte("secret")) {
		t.Errorf("stored %s", raw)
	}
}

// TestRegistrationAnswer is the 201 answer's shape (RFC 7591 §3.2.1).
func TestRegistrationAnswer(t *testing.T) {
	r, _, _ := testRegistry(t, Config{Registration: true})
	w := register(r, "198.51.100.1", "application/json; charset=utf-8", "POST", goodRegistration)
	if w.Code != http.StatusCreated || w.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v %s", w.Code, w.Header(), w.Body.String())
	}
	body, _ := io.ReadAll(w.Body)
	var m map[string]any
	json.Unmarshal(body, &m)
	for _, k := range []string{"client_id", "client_id_issued_at", "redirect_uris", "grant_types", "response_types", "token_endpoint_auth_method"} {
		if _, ok := m[k]; !ok {
			t.Errorf("answer lacks %s: %s", k, body)
		}
	}
	if _, ok := m["client_secret"]; ok {
		t.Errorf("answer has a client_secret: %s", body)
	}
}

// TestUnnamedClientShownByID: a client that gives no client_name is shown
// by its client_id, never by an empty name.
func TestUnnamedClientShownByID(t *testing.T) {
	r, _, _ := testRegistry(t, Config{Registration: true})
	w := register(r, "198.51.100.1", "application/json", "POST", `{"redirect_uris":["http://127.0.0.1/cb"]}`)
	var resp struct {
		ClientID string `json:"client_id"`
	}
	json.Unmarshal(w.Body.Bytes(), &resp)
	c, err := r.Resolve(context.Background(), resp.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	if c.DisplayName() != resp.ClientID || c.Host() != "" {
		t.Errorf("display %q, host %q; want the client_id and no host", c.DisplayName(), c.Host())
	}
}

// TestRegistrationLimiterOutlivesReload: a registry built on a kept
// limiter (as after a config reload) finds the address's bucket as the
// previous registry left it.
func TestRegistrationLimiterOutlivesReload(t *testing.T) {
	kept := policy.NewLimiter(policy.Limit{Rate: 1.0 / 3600, Burst: 1})
	before, _, _ := testRegistry(t, Config{Registration: true, Limiter: kept})
	if w := register(before, "198.51.100.9", "application/json", "POST", goodRegistration); w.Code != 201 {
		t.Fatalf("%d %s", w.Code, w.Body.String())
	}
	after, _, _ := testRegistry(t, Config{Registration: true, Limiter: kept})
	if w := register(after, "198.51.100.9", "application/json", "POST", goodRegistration); w.Code != http.StatusTooManyRequests {
		t.Fatalf("after the reload: %d, want 429", w.Code)
	}
}
