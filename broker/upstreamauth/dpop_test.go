package upstreamauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// dpopEnv is an env whose authorization server binds tokens to DPoP keys
// (RFC 9449), each server requiring a nonce of its own when asked to, with
// a public client "gw" registered.
func dpopEnv(t *testing.T, asNonce, rsNonce bool) *env {
	t.Helper()
	e := newEnvWith(t, oauthtest.AuthServerOptions{DPoP: true, DPoPNonce: asNonce, ScopesSupported: []string{"mcp:read", "offline_access"}},
		oauthtest.MCPOptions{ScopesSupported: []string{"mcp:read"}, DPoPNonce: rsNonce})
	e.as.AddClient("gw", "", nil)
	return e
}

// proofsOK fails unless every proof the upstream saw is valid, of key
// jkt, and fresh (no jti twice), and returns how many there were.
func proofsOK(t *testing.T, e *env, jkt string) int {
	t.Helper()
	proofs := e.mcp.DPoPProofs()
	jtis := map[string]bool{}
	for i, p := range proofs {
		if p.Err != "" {
			t.Errorf("proof %d refused by the upstream: %s", i, p.Err)
		}
		if p.JKT != jkt {
			t.Errorf("proof %d is of key %s, not the token's %s", i, p.JKT, jkt)
		}
		if jtis[p.JTI] {
			t.Errorf("proof %d reuses jti %s", i, p.JTI)
		}
		jtis[p.JTI] = true
	}
	return len(proofs)
}

// An authorization server that advertises DPoP gets tokens bound to a key
// of the gateway's: the code is requested for that key (dpop_jkt), the
// token request proves it, every request to the upstream carries the DPoP
// scheme and a fresh proof, and another replica refreshes with the same
// key, which only the sealed record can have given it.
func TestDPoPLoginBindsTokensToTheGatewaysKey(t *testing.T) {
	e := dpopEnv(t, false, false)
	c := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	q, authURL := e.authorize(c)
	u, _ := url.Parse(authURL)
	jkt := u.Query().Get("dpop_jkt")
	if jkt == "" {
		t.Fatalf("the authorization request names no DPoP key (dpop_jkt): %s", u.RawQuery)
	}
	if err := c.Callback(context.Background(), q); err != nil {
		t.Fatalf("Callback: %v", err)
	}
	reqs := e.as.TokenRequests()
	if len(reqs) != 1 || reqs[0].DPoP.JKT != jkt || reqs[0].DPoP.Err != "" {
		t.Fatalf("token requests %+v; want one with a valid proof of %s", reqs, jkt)
	}
	for i := range 2 {
		if err := e.callEcho(c, fmt.Sprint("hi ", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range e.mcp.Schemes() {
		if s != "DPoP" {
			t.Errorf("a request used the %s scheme", s)
		}
	}
	if n := proofsOK(t, e, jkt); n < 4 {
		t.Errorf("%d proofs for two sessions", n)
	}

	e.clock.Advance(time.Hour)
	replica := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	if err := e.callEcho(replica, "replica"); err != nil {
		t.Fatalf("another replica after expiry: %v", err)
	}
	reqs = e.as.TokenRequests()
	if len(reqs) != 2 || reqs[1].GrantType != "refresh_token" || reqs[1].DPoP.JKT != jkt || reqs[1].Error != "" {
		t.Fatalf("token requests %+v; want a refresh proven with the same key", reqs)
	}
	proofsOK(t, e, jkt)
	leakCheck(t, e, e.as.Secrets(), fmt.Sprint(c.State()), c.String())
}

// The machine grants get DPoP-bound tokens too where the server offers
// them.
func TestDPoPClientCredentials(t *testing.T) {
	e := dpopEnv(t, false, false)
	secret := oauthtest.NewSecret("cs")
	e.as.AddClient("machine", secret, nil)
	c := e.client(Config{Grant: GrantClientCredentials, ClientID: "machine", ClientSecret: secret})
	if err := e.callEcho(c, "x"); err != nil {
		t.Fatal(err)
	}
	reqs := e.as.TokenRequests()
	if len(reqs) != 1 || reqs[0].DPoP.JKT == "" || reqs[0].DPoP.Err != "" {
		t.Fatalf("token requests %+v; want one with a valid proof", reqs)
	}
	proofsOK(t, e, reqs[0].DPoP.JKT)
	if s := e.mcp.Schemes(); len(s) == 0 || slices.ContainsFunc(s, func(s string) bool { return s != "DPoP" }) {
		t.Errorf("schemes %v", s)
	}
}

// Each server's nonce (RFC 9449 §8, §9) is answered with one retry and a
// fresh proof, kept for the next requests to that server, and never shown
// to the other one.
func TestDPoPNonces(t *testing.T) {
	e := dpopEnv(t, true, true)
	c := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	e.login(c)
	asNonce, rsNonce := e.as.DPoPNonce(), e.mcp.DPoPNonce()
	reqs := e.as.TokenRequests()
	if len(reqs) != 2 || reqs[0].Error != "use_dpop_nonce" || reqs[1].Error != "" || reqs[1].DPoP.Nonce != asNonce ||
		reqs[0].DPoP.JTI == reqs[1].DPoP.JTI {
		t.Fatalf("token requests %+v; want a nonce challenge, then one retry with the nonce and a new jti", reqs)
	}
	for i := range 3 {
		if err := e.callEcho(c, fmt.Sprint("hi ", i)); err != nil {
			t.Fatal(err)
		}
	}
	challenged := 0
	jtis := map[string]bool{}
	for _, p := range e.mcp.DPoPProofs() {
		if p.Err != "" {
			challenged++
		}
		if jtis[p.JTI] {
			t.Errorf("jti %s sent twice", p.JTI)
		}
		jtis[p.JTI] = true
		if p.Nonce == asNonce {
			t.Error("the authorization server's nonce was sent to the upstream")
		}
	}
	if challenged != 1 {
		t.Errorf("%d nonce challenges at the upstream; want one, the nonce kept afterwards", challenged)
	}
	// The refresh presents the nonce it was given at once.
	e.clock.Advance(time.Hour)
	if err := e.callEcho(c, "after expiry"); err != nil {
		t.Fatal(err)
	}
	reqs = e.as.TokenRequests()
	if len(reqs) != 3 || reqs[2].GrantType != "refresh_token" || reqs[2].Error != "" || reqs[2].DPoP.Nonce != asNonce {
		t.Fatalf("token requests %+v; want one refresh with the nonce already known", reqs)
	}
	for _, r := range reqs {
		if r.DPoP.Nonce == rsNonce {
			t.Error("the upstream's nonce was sent to the authorization server")
		}
	}
}

// An upstream that asks for a new nonce on every request gets one retry
// per request, not a loop, and the token is neither refreshed nor
// dropped: the nonce is the server's problem, not the token's. A nonce
// that is not one (a space, a quote, a backslash, too long, empty) is not
// echoed at all.
func TestDPoPNonceChallengesAreBounded(t *testing.T) {
	e := dpopEnv(t, false, false)
	c := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	e.login(c)
	var mu sync.Mutex
	var seen []string
	nonce := func() string { return oauthtest.NewSecret("n") }
	e.mcp.Override(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("DPoP"))
		mu.Unlock()
		w.Header().Set("WWW-Authenticate", `DPoP error="use_dpop_nonce"`)
		w.Header().Set("DPoP-Nonce", nonce())
		http.Error(w, "use_dpop_nonce", http.StatusUnauthorized)
	}))
	status, err := e.post(c, true)
	if err != nil || status != http.StatusUnauthorized {
		t.Fatalf("post: %d %v; want the upstream's 401", status, err)
	}
	mu.Lock()
	if len(seen) != 2 || seen[0] == "" || seen[0] == seen[1] {
		t.Errorf("the upstream got %d requests; want the first and one retry with a new proof", len(seen))
	}
	seen = nil
	mu.Unlock()
	if grants, _ := e.counts(); len(grants) != 1 {
		t.Errorf("grants %v: the token was renewed for a nonce", grants)
	}
	if st := c.State(); st.State != StateReady {
		t.Errorf("state %+v: the token was dropped for a nonce", st)
	}

	for _, bad := range []string{"two words", `quo"te`, `back\slash`, strings.Repeat("n", 5000), ""} {
		nonce = func() string { return bad }
		status, err := e.post(c, true)
		if err != nil || status != http.StatusUnauthorized {
			t.Fatalf("post: %d %v", status, err)
		}
		mu.Lock()
		if len(seen) != 1 {
			t.Errorf("nonce %.20q: %d requests; a nonce that is not one is not retried with", bad, len(seen))
		}
		seen = nil
		mu.Unlock()
	}
}

// The proof and the token stay on the upstream's origin: a redirect to
// another origin carries neither.
func TestDPoPNeverLeavesTheOrigin(t *testing.T) {
	e := dpopEnv(t, false, false)
	c := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	e.login(c)
	var mu sync.Mutex
	var got []http.Header
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer elsewhere.Close()
	e.mcp.Override(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/mcp", http.StatusTemporaryRedirect)
	}))
	if _, err := e.post(c, true); err != nil {
		t.Logf("post: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("the other origin got %d requests; the redirect was to be followed once, without credentials", len(got))
	}
	for _, h := range []string{"Authorization", "Dpop"} {
		if v := got[0].Get(h); v != "" {
			t.Errorf("the other origin got %s: %.12s…", h, v)
		}
	}
}

// The DPoP private key is sealed with the record: neither the stored
// bytes nor the logs hold it, in any of its encodings, and the pending
// login that made it is sealed too.
func TestDPoPKeyIsSealed(t *testing.T) {
	e := dpopEnv(t, false, false)
	c := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	e.login(c)
	if err := e.callEcho(c, "x"); err != nil {
		t.Fatal(err)
	}
	rec, err := c.seal.open(e.stored())
	if err != nil {
		t.Fatal(err)
	}
	if rec.TokenType != "DPoP" || len(rec.DPoPKey) == 0 {
		t.Fatalf("record: token type %q, %d key bytes", rec.TokenType, len(rec.DPoPKey))
	}
	k, err := x509.ParsePKCS8PrivateKey(rec.DPoPKey)
	if err != nil {
		t.Fatal(err)
	}
	d, err := k.(*ecdsa.PrivateKey).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{string(rec.DPoPKey), string(d), base64.RawURLEncoding.EncodeToString(d), base64.RawURLEncoding.EncodeToString(rec.DPoPKey)}
	leakCheck(t, e, append(secrets, e.as.Secrets()...), fmt.Sprint(c.State()), c.String(), fmt.Sprintf("%+v", c.cfg))
}

// With dpop required, an authorization server that does not offer DPoP,
// or issues a Bearer token anyway, gives the gateway no token: a token
// usable without the key is what the setting rules out.
func TestDPoPRequiredRefusesBearerTokens(t *testing.T) {
	t.Run("login", func(t *testing.T) {
		e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
		e.as.AddClient("gw", "", nil)
		c := e.client(Config{ClientID: "gw", RedirectURL: redirect, DPoP: DPoPRequired})
		_, err := c.BeginLogin(context.Background())
		if err == nil || !strings.Contains(err.Error(), "dpop required") {
			t.Fatalf("BeginLogin: %v", err)
		}
		if n := len(e.as.AuthorizationRequests()); n != 0 {
			t.Errorf("%d authorization requests", n)
		}
	})
	t.Run("machine, no discovery", func(t *testing.T) {
		e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
		secret := oauthtest.NewSecret("cs")
		e.as.AddClient("machine", secret, nil)
		c := e.client(Config{Grant: GrantClientCredentials, ClientID: "machine", ClientSecret: secret, TokenURL: e.as.URL + "/token", DPoP: DPoPRequired})
		err := e.callEcho(c, "x")
		if err == nil || !strings.Contains(err.Error(), "dpop required") {
			t.Fatalf("call: %v", err)
		}
		if _, authorized := e.mcp.Stats(); authorized != 0 {
			t.Errorf("%d requests reached the upstream with the Bearer token", authorized)
		}
		if st := c.State(); st.State != StateError {
			t.Errorf("state %+v", st)
		}
	})
	t.Run("off", func(t *testing.T) {
		e := dpopEnv(t, false, false)
		c := e.client(Config{ClientID: "gw", RedirectURL: redirect, DPoP: DPoPOff})
		e.login(c)
		if err := e.callEcho(c, "x"); err != nil {
			t.Fatal(err)
		}
		if r := e.as.TokenRequests(); len(r) != 1 || r[0].DPoP.JKT != "" {
			t.Errorf("token requests %+v; dpop off sends no proof", r)
		}
		if s := e.mcp.Schemes(); len(s) == 0 || slices.ContainsFunc(s, func(s string) bool { return s != "Bearer" }) {
			t.Errorf("schemes %v", s)
		}
	})
}

// A Bearer token stored before dpop became required (logged in with dpop
// off, or before the server offered DPoP) is not renewed as Bearer: its
// refresh token, which is not bound to a key, is not redeemed, since the
// server would answer with one more token usable without the key, which
// the setting rules out. The upstream asks for a login instead, which
// binds the next tokens to a key.
func TestDPoPRequiredDoesNotRenewABearerToken(t *testing.T) {
	e := dpopEnv(t, false, false)
	off := e.client(Config{ClientID: "gw", RedirectURL: redirect, DPoP: DPoPOff})
	e.login(off)
	if r := e.as.TokenRequests(); len(r) != 1 || r[0].DPoP.JKT != "" {
		t.Fatalf("token requests %+v; want one login without a proof", r)
	}
	required := e.client(Config{ClientID: "gw", RedirectURL: redirect, DPoP: DPoPRequired})
	for range 3 {
		if err := e.callEcho(required, "x"); !errors.Is(err, ErrAuthRequired) {
			t.Fatalf("call with a stored Bearer token under dpop required: %v, want a login required", err)
		}
		e.clock.Advance(time.Minute) // past the failure backoff
	}
	if r := e.as.TokenRequests(); len(r) != 1 {
		t.Fatalf("token requests %+v; the Bearer refresh token was redeemed under dpop required", r[1:])
	}
	if _, authorized := e.mcp.Stats(); authorized != 0 {
		t.Errorf("%d requests reached the upstream with a Bearer token", authorized)
	}
	e.login(required)
	if err := e.callEcho(required, "y"); err != nil {
		t.Fatalf("after a login: %v", err)
	}
	if s := e.mcp.Schemes(); len(s) == 0 || slices.ContainsFunc(s, func(s string) bool { return s != "DPoP" }) {
		t.Errorf("schemes %v after the login under dpop required", s)
	}
}

// A token endpoint that asks for a new nonce on every request gets one
// retry per grant, and the error says what it answered.
func TestDPoPTokenEndpointNonceIsBounded(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	var mu sync.Mutex
	var proofs []string
	tokenURL := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		proofs = append(proofs, r.Header.Get("DPoP"))
		mu.Unlock()
		w.Header().Set("DPoP-Nonce", oauthtest.NewSecret("n"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"use_dpop_nonce"}`)
	}))
	defer tokenURL.Close()
	c := e.client(Config{Grant: GrantClientCredentials, ClientID: "machine", ClientSecret: "not-used-here", TokenURL: tokenURL.URL, DPoP: DPoPRequired})
	err := e.callEcho(c, "x")
	if err == nil || !strings.Contains(err.Error(), "use_dpop_nonce") {
		t.Fatalf("call: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(proofs) != 2 || proofs[0] == "" || proofs[0] == proofs[1] {
		t.Errorf("%d token requests; want one and a retry with a new proof", len(proofs))
	}
}

// BenchmarkTransportAttachDPoP is BenchmarkTransportAttach with a
// DPoP-bound token: the cost of a fresh proof (an ES256 signature) on
// every request.
func BenchmarkTransportAttachDPoP(b *testing.B) {
	c, err := New(context.Background(), "bench", "https://upstream.example.com/mcp", Config{Grant: GrantClientCredentials, ClientID: "c", ClientSecret: "s"},
		Options{Storage: &certmagic.FileStorage{Path: b.TempDir()}, Key: make([]byte, 32)})
	if err != nil {
		b.Fatal(err)
	}
	key, err := newDPoPKey()
	if err != nil {
		b.Fatal(err)
	}
	c.adopt(&record{AccessToken: "at-bench", TokenType: "DPoP", DPoPKey: key.der, Expiry: time.Now().Add(time.Hour), IssuedAt: time.Now()})
	rt := c.Transport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("DPoP") == "" {
			b.Fatal("no proof")
		}
		return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}}, nil
	}))
	req, _ := http.NewRequest(http.MethodPost, "https://upstream.example.com/mcp", nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := rt.RoundTrip(req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
