package authserver

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// FuzzAuthorize: whatever query the authorization endpoint is sent, it
// answers without failing, and its only redirects are to the sign-in, or
// an error to a redirect URI a client registered (by the clients' rule:
// exactly, but for a loopback one's port), with iss; never to one the
// query chose. A signed-in person with a good request gets the consent
// page, not a redirect.
func FuzzAuthorize(f *testing.F) {
	fx := newFixture(f, func(_ *fixture, c *Config) { c.Limit = policy.Limit{Rate: 1e9, Burst: 1 << 30} })
	p := newPKCE(fx)
	good := fx.authzQuery(p).Encode()
	f.Add(good)
	f.Add(good + "&redirect_uri=https%3A%2F%2Fevil.example%2F")
	f.Add(strings.Replace(good, "redirect_uri=", "Redirect_uri=", 1))
	f.Add("client_id=https%3A%2F%2Fclient-b.example%2Fclient.json&redirect_uri=https%3A%2F%2Fclient-b.example%2Fcb&response_type=token")
	f.Add("client_id=" + clientA + "&redirect_uri=http%3A%2F%2F127.0.0.1%3A1%2Fcallback%23x")
	f.Add("%zz;&&==")
	f.Add("client_id=https%3A%2F%2Fplain.example%2Fc.json&redirect_uri=http%3A%2F%2Fplain.example%2Fcb")
	clients := fx.srv.cfg.Clients.(testClients)
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest(http.MethodGet, testIssuer+AuthorizePath, nil)
		r.URL.RawQuery = raw
		r.RemoteAddr = "127.0.0.1:1"
		r.AddCookie(&http.Cookie{Name: "test-person", Value: "alice"})
		w := httptest.NewRecorder()
		fx.srv.ServeHTTP(w, r)
		loc := w.Header().Get("Location")
		if loc == "" || strings.HasPrefix(loc, "/test-signin?") {
			return
		}
		// The redirect URI is what comes before the answer's parameters,
		// which the server appends after it (and after its own query).
		i := strings.Index(loc, "error=")
		if i < 1 || (loc[i-1] != '?' && loc[i-1] != '&') {
			t.Fatalf("query %q redirected to %q, with no error", raw, loc)
		}
		uri := loc[:i-1]
		if strings.HasPrefix(uri, "http://plain.example") {
			t.Fatalf("query %q redirected to %q, plain http off loopback", raw, loc)
		}
		ok := false
		for _, c := range clients {
			ok = ok || c.AllowsRedirect(uri)
		}
		if !ok {
			t.Fatalf("query %q redirected to %q, a redirect URI no client registered", raw, loc)
		}
		if !strings.HasPrefix(loc, "/test-signin?") && !strings.Contains(loc, "iss=") {
			t.Fatalf("query %q redirected without iss: %q", raw, loc)
		}
	})
}
