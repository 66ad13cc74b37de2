package idp

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
)

const testIssuer = "https://idp.example.com"

// signer signs ID tokens as an IdP's key would.
type signer struct {
	key *ecdsa.PrivateKey
	s   jose.Signer
}

func newSigner(t *testing.T) *signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &signer{key: k, s: s}
}

func (s *signer) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	raw, _ := json.Marshal(claims)
	jws, err := s.s.Sign(raw)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCheckIDToken: an ID token is taken only when go-oidc accepts its
// signature, issuer, audience and expiry and its nonce is this browser's;
// a token for several audiences must be authorized for this client.
func TestCheckIDToken(t *testing.T) {
	idp, other := newSigner(t), newSigner(t)
	v := oidc.NewVerifier(testIssuer, &oidc.StaticKeySet{PublicKeys: []crypto.PublicKey{&idp.key.PublicKey}},
		&oidc.Config{ClientID: "gw", SupportedSigningAlgs: []string{"ES256"}})
	now := time.Now()
	good := func() map[string]any {
		return map[string]any{"iss": testIssuer, "sub": "u1", "aud": "gw", "exp": now.Add(5 * time.Minute).Unix(),
			"iat": now.Unix(), "nonce": "n-1", "groups": []string{"eng"}}
	}
	with := func(k string, v any) map[string]any {
		c := good()
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	claims, _, err := checkIDToken(context.Background(), v, "gw", idp.sign(t, good()), "n-1")
	if err != nil || !strings.Contains(string(claims), `"groups":["eng"]`) {
		t.Fatalf("good token: %s, %v", claims, err)
	}
	for _, tc := range []struct {
		name  string
		token string
		nonce string
		word  string
	}{
		{"nonce of another sign-in", idp.sign(t, good()), "n-2", "nonce"},
		{"no nonce", idp.sign(t, with("nonce", nil)), "n-1", "nonce"},
		{"empty nonce on both sides", idp.sign(t, with("nonce", "")), "", "nonce"},
		{"for another client", idp.sign(t, with("aud", "other")), "n-1", "audience"},
		{"several audiences, no azp", idp.sign(t, with("aud", []string{"gw", "other"})), "n-1", "azp"},
		{"several audiences, azp another", idp.sign(t, with("azp", "other")), "n-1", "azp"},
		{"from another issuer", idp.sign(t, with("iss", "https://evil.example")), "n-1", "different provider"},
		{"expired", idp.sign(t, with("exp", now.Add(-time.Minute).Unix())), "n-1", "expired"},
		{"signed by another key", other.sign(t, good()), "n-1", "signature"},
		{"not a JWT", "abc.def.ghi", "n-1", "refused"},
		{"alg none", unsigned(good()), "n-1", "refused"},
	} {
		_, _, err := checkIDToken(context.Background(), v, "gw", tc.token, tc.nonce)
		if !errors.Is(err, errIDToken) || !strings.Contains(err.Error(), tc.word) {
			t.Errorf("%s: %v, want a refusal with %q", tc.name, err, tc.word)
		}
	}
	multi := with("aud", []string{"gw", "other"})
	multi["azp"] = "gw"
	if _, _, err := checkIDToken(context.Background(), v, "gw", idp.sign(t, multi), "n-1"); err != nil {
		t.Fatalf("several audiences, azp this client: %v", err)
	}
}

func unsigned(claims map[string]any) string {
	raw, _ := json.Marshal(claims)
	enc := base64URL
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(raw) + "."
}

// TestCheckIss: RFC 9207. An authorization response from another issuer,
// or without iss from an IdP that always sends one, is refused.
func TestCheckIss(t *testing.T) {
	for _, tc := range []struct {
		name     string
		got      []string
		required bool
		ok       bool
	}{
		{"same issuer", []string{testIssuer}, true, true},
		{"absent, IdP does not send it", nil, false, true},
		{"absent, IdP sends it", nil, true, false},
		{"another issuer", []string{"https://evil.example"}, false, false},
		{"trailing slash", []string{testIssuer + "/"}, true, false},
		{"case differs", []string{"https://IDP.example.com"}, true, false},
		{"twice", []string{testIssuer, testIssuer}, true, false},
	} {
		err := checkIss(tc.got, testIssuer, tc.required)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errIssuer)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// oidcService is a Service with an IdP that is never reached: the
// refusals below all come before the token exchange.
func oidcService(t *testing.T, audit func(Refusal)) *Service {
	return newService(t, Config{Audit: audit, OIDC: &OIDC{Issuer: "http://127.0.0.1:1", ClientID: "gw", ClientSecret: "s3cret",
		Claims: Claims{Rules: []Rule{{Claim: "groups", Value: "eng", Scopes: []string{"chat"}}}}}})
}

// startFlow is what SignIn leaves in a browser before it goes to the IdP.
func startFlow(t *testing.T, s *Service, b browser) flowValue {
	t.Helper()
	f := flowValue{Kind: "oidc", State: randomString(), Nonce: randomString(), Verifier: randomVerifier(), Return: "/back"}
	rec := httptest.NewRecorder()
	if err := s.jar.startFlow(rec, f); err != nil {
		t.Fatal(err)
	}
	b.take(rec.Result())
	return f
}

func callback(query string) *http.Request {
	return httptest.NewRequest("GET", "https://gw.example.com"+CallbackPath+"?"+query, nil)
}

// TestCallbackRefusals: a sign-in response is taken only in the browser
// that started that sign-in, once, read one way; each refusal is audited
// and signs no one in.
func TestCallbackRefusals(t *testing.T) {
	var audit []Refusal
	s := oidcService(t, func(r Refusal) { audit = append(audit, r) })
	victim, attacker := browser{}, browser{}
	fv := startFlow(t, s, victim)
	fa := startFlow(t, s, attacker)
	for _, tc := range []struct {
		name   string
		r      *http.Request
		status int
		reason string
	}{
		{"no sign-in under way", callback("code=c&state=" + fv.State), 400, "no_flow"},
		{"the attacker's response in the victim's browser (login CSRF)", victim.send(callback("code=c&state=" + fa.State)), 400, "state"},
		{"no state", victim.send(callback("code=c")), 400, "state"},
		{"state twice", victim.send(callback("code=c&state=" + fv.State + "&state=" + fa.State)), 400, "query"},
		{"code twice", victim.send(callback("code=a&code=b&state=" + fv.State)), 400, "query"},
		{"iss twice", victim.send(callback("code=c&iss=a&iss=b&state=" + fv.State)), 400, "query"},
		{"a query that does not read", victim.send(callback("code=%zz&state=" + fv.State)), 400, "query"},
		{"a flow cookie altered", browser{"__Host-zidane-signin-flow": victim["__Host-zidane-signin-flow"] + "A"}.send(callback("state=" + fv.State)), 400, "no_flow"},
	} {
		resp := serve(s.ServeHTTP, tc.r)
		b := body(t, resp)
		if resp.StatusCode != tc.status || len(audit) == 0 || audit[len(audit)-1].Reason != tc.reason {
			t.Errorf("%s: %d (audit %+v), want %d %s", tc.name, resp.StatusCode, audit, tc.status, tc.reason)
		}
		for _, c := range resp.Cookies() {
			if c.Name == "__Host-zidane-signin" {
				t.Errorf("%s: signed in", tc.name)
			}
		}
		if !strings.Contains(b, "Start again") {
			t.Errorf("%s: the page does not say what to do: %s", tc.name, b)
		}
	}
	// The victim's own response goes on to the IdP (which this test does
	// not run, so it fails there) and uses the state up: the same
	// response again, cookie and all, is a replay.
	replayed := victim.send(callback("code=c&state=" + fv.State))
	resp := serve(s.ServeHTTP, replayed)
	if resp.StatusCode != 502 || audit[len(audit)-1].Reason != "idp_unavailable" {
		t.Fatalf("first use: %d %+v", resp.StatusCode, audit[len(audit)-1])
	}
	if !strings.Contains(resp.Header.Get("Set-Cookie"), "__Host-zidane-signin-flow=;") {
		t.Errorf("the flow cookie was not cleared: %q", resp.Header.Values("Set-Cookie"))
	}
	resp = serve(s.ServeHTTP, victim.send(callback("code=c&state="+fv.State)))
	if resp.StatusCode != 400 || audit[len(audit)-1].Reason != "replayed" {
		t.Fatalf("replay: %d %+v", resp.StatusCode, audit[len(audit)-1])
	}
	for _, a := range audit {
		if strings.Contains(a.Detail, "s3cret") || strings.Contains(a.Detail, fv.State) {
			t.Errorf("audit holds a secret: %+v", a)
		}
	}
	resp = serve(s.ServeHTTP, httptest.NewRequest("POST", CallbackPath, nil))
	if resp.StatusCode != 405 {
		t.Fatalf("POST callback: %d", resp.StatusCode)
	}
}

// TestOIDCConfig: what a relying party refuses to be set up with.
func TestOIDCConfig(t *testing.T) {
	base := OIDC{Issuer: testIssuer, ClientID: "gw", ClientSecret: "x"}
	for _, tc := range []struct {
		name string
		edit func(*OIDC)
	}{
		{"plain http issuer off loopback", func(o *OIDC) { o.Issuer = "http://idp.example.com" }},
		{"issuer with a query", func(o *OIDC) { o.Issuer = testIssuer + "?a=b" }},
		{"no client id", func(o *OIDC) { o.ClientID = "" }},
		{"no client secret", func(o *OIDC) { o.ClientSecret = "" }},
		{"a scope with a space", func(o *OIDC) { o.Scopes = []string{"a b"} }},
		{"a rule without scopes", func(o *OIDC) { o.Claims.Rules = []Rule{{Claim: "groups", Value: "eng"}} }},
	} {
		cfg := base
		tc.edit(&cfg)
		_, err := New(Config{Site: "https://gw.example.com", Key: testKey, OIDC: &cfg})
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else if strings.Contains(err.Error(), "x") && cfg.ClientSecret == "x" && strings.Contains(err.Error(), `"x"`) {
			t.Errorf("%s: the error shows the secret: %v", tc.name, err)
		}
	}
}

// TestIdPAnswerBounded: a discovery document larger than the bound is
// refused, not read whole.
func TestIdPAnswerBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"issuer":"` + "http://" + r.Host + `","pad":"`))
		_, _ = w.Write([]byte(strings.Repeat("a", maxIdPBody)))
		_, _ = w.Write([]byte(`"}`))
	}))
	defer srv.Close()
	s := newService(t, Config{OIDC: &OIDC{Issuer: srv.URL, ClientID: "gw", ClientSecret: "x"}})
	_, err := s.rp.discover(context.Background())
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("discover: %v", err)
	}
}

// TestIdPErrorBounded: what an IdP answers with an error (a 404 page of
// any size) reaches the page and the audit log cut short.
func TestIdPErrorBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, strings.Repeat("not here ", 50_000), http.StatusNotFound)
	}))
	defer srv.Close()
	var audit []Refusal
	s := newService(t, Config{Audit: func(r Refusal) { audit = append(audit, r) }, OIDC: &OIDC{Issuer: srv.URL, ClientID: "gw", ClientSecret: "x"}})
	resp := serve(func(w http.ResponseWriter, r *http.Request) { s.SignIn(w, r, "/") }, httptest.NewRequest("GET", "/", nil))
	b := body(t, resp)
	if resp.StatusCode != http.StatusBadGateway || len(audit) != 1 || audit[0].Reason != "idp_unavailable" {
		t.Fatalf("%d %+v", resp.StatusCode, audit)
	}
	if len(audit[0].Detail) > 600 || len(b) > 2000 || !strings.Contains(audit[0].Detail, "404") {
		t.Fatalf("the IdP's error page reached the audit (%d bytes) and the page (%d bytes): %.300s", len(audit[0].Detail), len(b), audit[0].Detail)
	}
}
