package authserver

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// withGrants gives the fixture the real token store, on its storage,
// and a DPoP verifier with a replay check.
func withGrants(f *fixture, c *Config) {
	{
		st, err := policy.OpenTokenStore(context.Background(), f.store)
		if err != nil {
			f.t.Fatal(err)
		}
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		if err := st.SetGrantKey(key); err != nil {
			f.t.Fatal(err)
		}
		f.grants = st
		c.Grants = st
		c.DPoP = &dpop.Verifier{Replay: dpop.NewLocal(1000, dpop.DefaultWindow)}
	}
}

// dpopKey signs proofs as a client would.
type dpopKey struct {
	priv *ecdsa.PrivateKey
	jkt  string
}

func newDPoPKey(t testing.TB) dpopKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := (&jose.JSONWebKey{Key: &k.PublicKey}).Thumbprint(crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return dpopKey{k, base64.RawURLEncoding.EncodeToString(tp)}
}

func (k dpopKey) proof(t testing.TB, htu string, now time.Time) string {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k.priv},
		(&jose.SignerOptions{EmbedJWK: true}).WithType("dpop+jwt"))
	if err != nil {
		t.Fatal(err)
	}
	claims, _ := json.Marshal(map[string]any{"jti": randText(), "htm": "POST", "htu": htu, "iat": now.Unix()})
	jws, err := signer.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	s, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tokenAnswer is what the token endpoint said.
type tokenAnswer struct {
	status int
	header http.Header
	body   map[string]any
}

func (a tokenAnswer) str(k string) string { s, _ := a.body[k].(string); return s }

func (f *fixture) post(path string, vals url.Values, edit ...func(*http.Request)) tokenAnswer {
	r := httptest.NewRequest(http.MethodPost, testIssuer+path, strings.NewReader(vals.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, e := range edit {
		e(r)
	}
	resp := f.do(r)
	a := tokenAnswer{status: resp.StatusCode, header: resp.Header}
	_ = json.NewDecoder(resp.Body).Decode(&a.body)
	for _, k := range []string{"access_token", "refresh_token"} {
		f.secret(a.str(k))
	}
	return a
}

func withProof(p string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Add("DPoP", p) }
}

func codeRequest(code string, p pkce) url.Values {
	return url.Values{
		"grant_type":    {"authorization_code"},
		"code":          {code},
		"code_verifier": {p.verifier},
		"redirect_uri":  {redirectA},
		"client_id":     {clientA},
		"resource":      {testResource},
	}
}

// TestTokenAttacks: what a client, or whoever stole a code, may send to
// the token endpoint. Each refusal is an RFC 6749 §5.2 error, never
// cached.
func TestTokenAttacks(t *testing.T) {
	type attack struct {
		name   string
		run    func(f *fixture, code string, p pkce) tokenAnswer
		status int
		err    string
		reason string
	}
	set := func(k, v string) func(url.Values) { return func(q url.Values) { q.Set(k, v) } }
	send := func(mods ...func(url.Values)) func(f *fixture, code string, p pkce) tokenAnswer {
		return func(f *fixture, code string, p pkce) tokenAnswer {
			v := codeRequest(code, p)
			for _, m := range mods {
				m(v)
			}
			return f.post(TokenPath, v)
		}
	}
	for _, tc := range []attack{
		{"PKCE wrong verifier", send(set("code_verifier", strings.Repeat("a", 43))), 400, "invalid_grant", "code_verifier does not match"},
		{"PKCE verifier missing", send(func(v url.Values) { v.Del("code_verifier") }), 400, "invalid_request", "code_verifier"},
		{"PKCE verifier too short", send(set("code_verifier", "abc")), 400, "invalid_request", "43 to 128"},
		{"PKCE verifier is the challenge", func(f *fixture, code string, p pkce) tokenAnswer {
			v := codeRequest(code, p)
			v.Set("code_verifier", p.challenge)
			return f.post(TokenPath, v)
		}, 400, "invalid_grant", "code_verifier does not match"},
		{"redeemed by another client", send(set("client_id", clientB)), 400, "invalid_grant", "another client"},
		{"another redirect_uri", send(set("redirect_uri", "http://127.0.0.1:33418/other")), 400, "invalid_grant", "redirect_uri"},
		{"no redirect_uri", send(func(v url.Values) { v.Del("redirect_uri") }), 400, "invalid_request", "redirect_uri"},
		{"expired", func(f *fixture, code string, p pkce) tokenAnswer {
			f.now = f.now.Add(DefaultCodeLifetime + time.Second)
			return f.post(TokenPath, codeRequest(code, p))
		}, 400, "invalid_grant", "expired"},
		{"unknown code", send(set("code", "nonsense")), 400, "invalid_grant", "unknown"},
		{"resource different at token", send(set("resource", "http://127.0.0.1:8443/other")), 400, "invalid_target", "not the one the code was issued for"},
		{"resource unknown at token", send(set("resource", "https://elsewhere.example/mcp")), 400, "invalid_target", "not one this server"},
		{"resource twice at token", send(func(v url.Values) { v.Add("resource", testResource) }), 400, "invalid_request", "resource is given more than once"},
		{"code twice", send(func(v url.Values) { v.Add("code", "other") }), 400, "invalid_request", "code is given more than once"},
		{"client_secret", send(set("client_secret", "hunter2")), 401, "invalid_client", "public"},
		{"Basic authentication", func(f *fixture, code string, p pkce) tokenAnswer {
			return f.post(TokenPath, codeRequest(code, p), func(r *http.Request) { r.SetBasicAuth(clientA, "hunter2") })
		}, 401, "invalid_client", "public"},
		{"no client_id", send(func(v url.Values) { v.Del("client_id") }), 400, "invalid_request", "client_id"},
		{"grant type password", send(set("grant_type", "password")), 400, "unsupported_grant_type", "authorization_code and refresh_token"},
		{"parameters in the query", func(f *fixture, code string, p pkce) tokenAnswer {
			return f.post(TokenPath, codeRequest(code, p), func(r *http.Request) { r.URL.RawQuery = "code=" + code })
		}, 400, "invalid_request", "no query string"},
		{"JSON body", func(f *fixture, code string, p pkce) tokenAnswer {
			return f.post(TokenPath, codeRequest(code, p), func(r *http.Request) { r.Header.Set("Content-Type", "application/json") })
		}, 400, "invalid_request", "x-www-form-urlencoded"},
		{"DPoP proof for another URL", func(f *fixture, code string, p pkce) tokenAnswer {
			return f.post(TokenPath, codeRequest(code, p), withProof(newDPoPKey(f.t).proof(f.t, "https://evil.example/token", f.now)))
		}, 400, "invalid_dpop_proof", "htu"},
		{"two DPoP proofs", func(f *fixture, code string, p pkce) tokenAnswer {
			k := newDPoPKey(f.t)
			return f.post(TokenPath, codeRequest(code, p), withProof(k.proof(f.t, testIssuer+TokenPath, f.now)), withProof(k.proof(f.t, testIssuer+TokenPath, f.now)))
		}, 400, "invalid_dpop_proof", "one DPoP header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			p := newPKCE(f)
			code := f.consentCode(p)
			a := tc.run(f, code, p)
			if a.status != tc.status || a.str("error") != tc.err || !strings.Contains(a.str("error_description"), tc.reason) {
				t.Errorf("got %d %v, want %d %s saying %q", a.status, a.body, tc.status, tc.err, tc.reason)
			}
			if a.header.Get("Cache-Control") != "no-store" {
				t.Error("the refusal may be cached")
			}
			if a := f.lastAudit(); a.Error != tc.err || !strings.Contains(a.Reason, tc.reason) {
				t.Errorf("audited %+v", a)
			}
			if len(f.grants.List()) != 0 {
				t.Error("a grant was recorded")
			}
		})
	}
}

// TestTokenCodeOnce: a code that failed once, for any reason, is spent;
// a code redeemed twice revokes the grant issued from the first
// redemption (RFC 6749 §4.1.2).
func TestTokenCodeOnce(t *testing.T) {
	t.Run("reused", func(t *testing.T) {
		f := newFixture(t)
		p := newPKCE(f)
		code := f.consentCode(p)
		a := f.post(TokenPath, codeRequest(code, p))
		if a.status != 200 {
			t.Fatalf("first redemption: %d %v", a.status, a.body)
		}
		access := a.str("access_token")
		if _, err := f.grants.Check(access, f.now); err != nil {
			t.Fatalf("the access token does not authenticate: %v", err)
		}
		again := f.post(TokenPath, codeRequest(code, p))
		if again.status != 400 || again.str("error") != "invalid_grant" || !strings.Contains(again.str("error_description"), "already used") {
			t.Fatalf("second redemption: %d %v", again.status, again.body)
		}
		if _, err := f.grants.Check(access, f.now); err == nil {
			t.Error("the grant issued from a reused code still authenticates")
		}
		refresh := f.post(TokenPath, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {a.str("refresh_token")}, "client_id": {clientA}})
		if refresh.str("error") != "invalid_grant" {
			t.Errorf("the grant's refresh token after the code's reuse: %v", refresh.body)
		}
	})
	t.Run("spent by a failed try", func(t *testing.T) {
		f := newFixture(t)
		p := newPKCE(f)
		code := f.consentCode(p)
		bad := codeRequest(code, p)
		bad.Set("code_verifier", strings.Repeat("b", 43))
		f.post(TokenPath, bad)
		a := f.post(TokenPath, codeRequest(code, p))
		if a.status != 400 || !strings.Contains(a.str("error_description"), "already used") {
			t.Errorf("the code after a wrong verifier: %d %v, want it spent", a.status, a.body)
		}
	})
}

// TestTokenBearer: a request without a proof gets Bearer tokens of alice's
// grant to client A, for the resource and the scopes she ticked.
func TestTokenBearer(t *testing.T) {
	f := newFixture(t)
	p := newPKCE(f)
	code := f.consentCode(p)
	a := f.post(TokenPath, codeRequest(code, p))
	if a.status != 200 || a.str("token_type") != "Bearer" || a.str("scope") != "tools:read tools:call" || a.body["expires_in"] == nil {
		t.Fatalf("got %d %v", a.status, a.body)
	}
	if a.header.Get("Cache-Control") != "no-store" {
		t.Error("the tokens may be cached")
	}
	pr, err := f.grants.Check(a.str("access_token"), f.now)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Owner != "alice" || pr.Client != clientA || pr.Resource != testResource || pr.JKT != "" || strings.Join(pr.Scopes, " ") != "tools:read tools:call" {
		t.Errorf("principal %+v", pr)
	}
	if g := f.grants.List(); len(g) != 1 || g[0].ClientName != "Client A" {
		t.Errorf("grants %+v, want one, named as the client calls itself", g)
	}
}

// TestTokenDPoP: a proof makes the tokens DPoP-bound to its key; a code
// asked for with dpop_jkt is redeemed with that key alone (RFC 9449 §10).
func TestTokenDPoP(t *testing.T) {
	f := newFixture(t)
	k := newDPoPKey(t)
	p := newPKCE(f)
	code := f.consentCode(p)
	a := f.post(TokenPath, codeRequest(code, p), withProof(k.proof(t, testIssuer+TokenPath, f.now)))
	if a.status != 200 || a.str("token_type") != "DPoP" {
		t.Fatalf("got %d %v", a.status, a.body)
	}
	pr, err := f.grants.Check(a.str("access_token"), f.now)
	if err != nil || pr.JKT != k.jkt {
		t.Fatalf("principal %+v, %v; want bound to %s", pr, err, k.jkt)
	}
	// A refresh of a bound grant needs a proof of the same key.
	rv := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {a.str("refresh_token")}, "client_id": {clientA}}
	if r := f.post(TokenPath, rv); r.str("error") != "invalid_grant" {
		t.Errorf("refresh of a bound grant without a proof: %v", r.body)
	}
	if r := f.post(TokenPath, rv, withProof(newDPoPKey(t).proof(t, testIssuer+TokenPath, f.now))); r.str("error") != "invalid_grant" {
		t.Errorf("refresh of a bound grant with another key: %v", r.body)
	}

	for _, tc := range []struct {
		name  string
		proof func() string
		ok    bool
	}{
		{"no proof", func() string { return "" }, false},
		{"another key", func() string { return newDPoPKey(t).proof(t, testIssuer+TokenPath, f.now) }, false},
		{"the key", func() string { return k.proof(t, testIssuer+TokenPath, f.now) }, true},
	} {
		t.Run("dpop_jkt, "+tc.name, func(t *testing.T) {
			p := newPKCE(f)
			code := f.consentCode(p, func(q url.Values) { q.Set("dpop_jkt", k.jkt) })
			var edit []func(*http.Request)
			if pf := tc.proof(); pf != "" {
				edit = append(edit, withProof(pf))
			}
			a := f.post(TokenPath, codeRequest(code, p), edit...)
			if tc.ok != (a.status == 200) {
				t.Errorf("got %d %v", a.status, a.body)
			}
			if !tc.ok && !strings.Contains(a.str("error_description"), "dpop_jkt") {
				t.Errorf("the refusal does not say why: %v", a.body)
			}
		})
	}
}

// TestTokenRefresh: rotation, narrowing, and what a refresh may not do.
func TestTokenRefresh(t *testing.T) {
	f := newFixture(t)
	p := newPKCE(f)
	a := f.post(TokenPath, codeRequest(f.consentCode(p), p))
	first := a.str("refresh_token")
	refresh := func(tok string, mods ...func(url.Values)) tokenAnswer {
		v := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok}, "client_id": {clientA}}
		for _, m := range mods {
			m(v)
		}
		return f.post(TokenPath, v)
	}
	if r := refresh(first, func(v url.Values) { v.Set("scope", "tools:read sessions") }); r.str("error") != "invalid_scope" {
		t.Errorf("scope widened at refresh: %v", r.body)
	}
	if r := refresh(first, func(v url.Values) { v.Set("resource", "http://127.0.0.1:8443/other") }); r.str("error") != "invalid_target" {
		t.Errorf("another resource at refresh: %v", r.body)
	}
	if r := refresh(first, func(v url.Values) { v.Set("client_id", clientB) }); r.str("error") != "invalid_grant" {
		t.Errorf("refresh by another client: %v", r.body)
	}
	r := refresh(first, func(v url.Values) { v.Set("scope", "tools:read") })
	if r.status != 200 || r.str("scope") != "tools:read" || r.str("refresh_token") == first {
		t.Fatalf("narrowing refresh: %d %v", r.status, r.body)
	}
	if again := refresh(first); again.str("error") != "invalid_grant" {
		t.Fatalf("a spent refresh token again: %v", again.body)
	}
	if _, err := f.grants.Check(r.str("access_token"), f.now); err == nil {
		t.Error("the grant still authenticates after its refresh token was reused")
	}
}

// TestRevoke: RFC 7009, for the client the token was issued to.
func TestRevoke(t *testing.T) {
	f := newFixture(t)
	p := newPKCE(f)
	a := f.post(TokenPath, codeRequest(f.consentCode(p), p))
	if r := f.post(RevokePath, url.Values{"token": {a.str("refresh_token")}, "client_id": {clientB}}); r.str("error") != "unauthorized_client" {
		t.Errorf("revocation by another client: %d %v", r.status, r.body)
	}
	if _, err := f.grants.Check(a.str("access_token"), f.now); err != nil {
		t.Fatalf("another client's revocation revoked the grant: %v", err)
	}
	if r := f.post(RevokePath, url.Values{"token": {"zdr_nonsense"}, "client_id": {clientA}}); r.status != 200 {
		t.Errorf("an unknown token: %d %v, want 200", r.status, r.body)
	}
	if r := f.post(RevokePath, url.Values{"token": {a.str("refresh_token")}, "client_id": {clientA}}); r.status != 200 {
		t.Fatalf("revocation: %d %v", r.status, r.body)
	}
	if _, err := f.grants.Check(a.str("access_token"), f.now); err == nil {
		t.Error("the access token authenticates after its grant was revoked")
	}
	if r := f.post(RevokePath, url.Values{"client_id": {clientA}}); r.str("error") != "invalid_request" {
		t.Errorf("no token: %v", r.body)
	}
}

// TestRateLimit: an address past its bucket is refused 429 with
// Retry-After, at the browser's endpoints on a page and at the client's in
// JSON; another address is not.
func TestRateLimit(t *testing.T) {
	f := newFixture(t, func(_ *fixture, c *Config) { c.Limit = policy.Limit{Rate: 1, Burst: 2} })
	q := f.authzQuery(newPKCE(f)).Encode()
	for i := 0; i < 2; i++ {
		f.authorize(q, "alice")
	}
	resp := f.authorize(q, "alice")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || resp.Header.Get("Location") != "" {
		t.Errorf("authorization past the limit: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if a := f.post(TokenPath, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {"x"}, "client_id": {clientA}}); a.status != http.StatusTooManyRequests || a.str("error") != "temporarily_unavailable" {
		t.Errorf("token request past the limit: %d %v", a.status, a.body)
	}
	if a := f.lastAudit(); a.Error != "temporarily_unavailable" || a.Remote != "127.0.0.1" {
		t.Errorf("audited %+v", a)
	}
	r := httptest.NewRequest(http.MethodGet, testIssuer+AuthorizePath+"?"+q, nil)
	r.AddCookie(&http.Cookie{Name: "test-person", Value: "alice"})
	w := httptest.NewRecorder()
	r.RemoteAddr = "127.0.0.2:1234"
	f.srv.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Errorf("another address: %d", w.Code)
	}
	// The metadata is not limited.
	if resp := f.do(httptest.NewRequest(http.MethodGet, testIssuer+WellKnown, nil)); resp.StatusCode != http.StatusOK {
		t.Errorf("metadata past the limit: %d", resp.StatusCode)
	}
}
