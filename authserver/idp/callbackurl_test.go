package idp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

// TestCallbackURLAsDocumented: the redirect_uri the gateway sends the IdP
// is the site's origin as written, then CallbackPath, which is what the
// operator registers at the IdP (docs/signin.md). IdPs compare redirect
// URIs exactly, so a default port the operator never wrote (":443") is a
// sign-in every IdP refuses.
func TestCallbackURLAsDocumented(t *testing.T) {
	var idpURL string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/openid-configuration" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer": idpURL, "authorization_endpoint": idpURL + "/auth", "token_endpoint": idpURL + "/token",
			"jwks_uri": idpURL + "/jwks", "code_challenge_methods_supported": []string{"S256"},
			"id_token_signing_alg_values_supported": []string{"ES256"},
		})
	}))
	defer srv.Close()
	idpURL = srv.URL
	for site, want := range map[string]string{
		"https://gw.example.com":       "https://gw.example.com" + CallbackPath,
		"https://gw.example.com/":      "https://gw.example.com" + CallbackPath,
		"https://gw.example.com:8443":  "https://gw.example.com:8443" + CallbackPath,
		"http://127.0.0.1:8080":        "http://127.0.0.1:8080" + CallbackPath,
		"https://gw.example.com:443":   "https://gw.example.com" + CallbackPath,
		"https://GW.example.com":       "https://gw.example.com" + CallbackPath,
		"http://localhost":             "http://localhost" + CallbackPath,
		"http://127.0.0.1:80":          "http://127.0.0.1" + CallbackPath,
		"https://[::1]:9443":           "https://[::1]:9443" + CallbackPath,
		"https://gw.example.com:00443": "https://gw.example.com" + CallbackPath,
	} {
		s := newService(t, Config{Site: site, OIDC: &OIDC{Issuer: idpURL, ClientID: "gw", ClientSecret: "s3cret",
			Claims: Claims{Rules: []Rule{{Claim: "groups", Value: "eng", Scopes: []string{"chat"}}}}}})
		rec := httptest.NewRecorder()
		s.SignIn(rec, httptest.NewRequest(http.MethodGet, "/zidane/signin/authorize?x=1", nil), "/zidane/signin/authorize?x=1")
		loc, err := url.Parse(rec.Header().Get("Location"))
		if rec.Code != http.StatusSeeOther || err != nil {
			t.Fatalf("site %s: SignIn answered %d, Location %q", site, rec.Code, rec.Header().Get("Location"))
		}
		if got := loc.Query().Get("redirect_uri"); got != want {
			t.Errorf("site %s: the IdP is sent redirect_uri %q, want %q, the URL the operator registers", site, got, want)
		}
	}
}
