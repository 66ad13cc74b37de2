package idp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/go-jose/go-jose/v4"
)

// tokenIdP is an IdP on loopback: discovery, keys, and a token endpoint
// that answers the authorization code grant and the refresh token grant
// with an ID token for its current subject.
type tokenIdP struct {
	srv   *httptest.Server
	key   *signer
	clock *clock

	mu       sync.Mutex
	sub      string        // the subject of the ID tokens issued
	ttl      time.Duration // their lifetime
	nonce    string        // the nonce of the code grant's ID token
	refresh  string        // the refresh token issued ("": none)
	refuse   bool          // refresh_token grants get invalid_grant
	refreshN int           // refresh_token grants received
}

func newTokenIdP(t *testing.T, clk *clock) *tokenIdP {
	p := &tokenIdP{key: newSigner(t), clock: clk, sub: "alice", ttl: 5 * time.Minute}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"issuer": p.srv.URL, "authorization_endpoint": p.srv.URL + "/auth",
			"token_endpoint": p.srv.URL + "/token", "jwks_uri": p.srv.URL + "/jwks", "id_token_signing_alg_values_supported": []string{"ES256"}})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &p.key.key.PublicKey, Algorithm: "ES256", Use: "sig"}}})
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		p.mu.Lock()
		defer p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		claims := map[string]any{"iss": p.srv.URL, "sub": p.sub, "aud": "gw", "iat": p.clock.t.Unix(), "exp": p.clock.t.Add(p.ttl).Unix(), "groups": []string{"eng"}}
		switch r.PostForm.Get("grant_type") {
		case "authorization_code":
			claims["nonce"] = p.nonce
		case "refresh_token":
			p.refreshN++
			if p.refuse || r.PostForm.Get("refresh_token") != p.refresh {
				w.WriteHeader(http.StatusBadRequest)
				w.Write([]byte(`{"error":"invalid_grant"}`))
				return
			}
			p.refresh = "rt-" + randomString()
		}
		out := map[string]any{"access_token": "at-" + randomString(), "token_type": "Bearer", "id_token": p.key.sign(t, claims)}
		if p.refresh != "" {
			out["refresh_token"] = p.refresh
		}
		json.NewEncoder(w).Encode(out)
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

// signIn runs a sign-in of the browser b through the IdP, as sub.
func (p *tokenIdP) signIn(t *testing.T, s *Service, sub string) {
	t.Helper()
	b := browser{}
	f := startFlow(t, s, b)
	p.mu.Lock()
	p.sub, p.nonce = sub, f.Nonce
	p.mu.Unlock()
	resp := serve(s.ServeHTTP, b.send(callback("state="+f.State+"&code=c-"+randomString())))
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in of %s: %d %s", sub, resp.StatusCode, body(t, resp))
	}
}

// keepingService is a Service that keeps sign-ins, on the clock clk.
func keepingService(t *testing.T, p *tokenIdP, clk *clock, audit func(Refusal)) (*Service, *fileStore) {
	st := &fileStore{fileStorage(t)}
	s := newService(t, Config{Audit: audit, KeepSignIns: st, Now: clk.now, OIDC: &OIDC{Issuer: p.srv.URL, ClientID: "gw", ClientSecret: "s3cret",
		Claims: Claims{Rules: []Rule{{Claim: "groups", Value: "eng", Scopes: []string{"chat"}}}}}})
	return s, st
}

// A person's sign-in is kept for them alone, for as long as it can be
// renewed, and not a moment beyond: each way to get another person's, an
// expired one or a forgotten one is refused, saying to sign in again.
func TestKeptSignIn(t *testing.T) {
	clk := &clock{t: time.Now()}
	p := newTokenIdP(t, clk)
	var audit []Refusal
	s, st := keepingService(t, p, clk, func(r Refusal) { audit = append(audit, r) })
	ctx := context.Background()

	p.signIn(t, s, "alice")
	p.signIn(t, s, "bob")
	aliceTok, err := s.SubjectToken(ctx, "alice")
	if err != nil || !strings.Contains(aliceTok, ".") {
		t.Fatalf("Alice's kept sign-in: %q %v", aliceTok, err)
	}
	bobTok, err := s.SubjectToken(ctx, "bob")
	if err != nil || bobTok == aliceTok {
		t.Fatalf("Bob's kept sign-in: %v (the same as Alice's: %v)", err, bobTok == aliceTok)
	}
	// Nothing of the token is in the keys, or in the stored bytes.
	for k, v := range st.all(t) {
		if strings.Contains(k, "alice") || strings.Contains(string(v), aliceTok[:40]) {
			t.Errorf("the kept sign-in shows in storage at %s", k)
		}
	}

	for _, tc := range []struct {
		name  string
		setup func()
		owner string
		want  string
	}{
		{"nobody kept", func() {}, "carol", "sign in to the gateway again"},
		{"another person's record copied to this person's key", func() {
			b, err := st.Load(ctx, s.kept.keyOf("bob"))
			if err != nil {
				t.Fatal(err)
			}
			st.Store(ctx, s.kept.keyOf("mallory"), b)
		}, "mallory", "sign in to the gateway again"},
		{"expired, without a refresh token", func() { clk.t = clk.t.Add(10 * time.Minute) }, "alice", "expired"},
		{"forgotten (the last grant revoked)", func() {
			if err := s.ForgetSignIn(ctx, "bob"); err != nil {
				t.Fatal(err)
			}
		}, "bob", "sign in to the gateway again"},
	} {
		tc.setup()
		tok, err := s.SubjectToken(ctx, tc.owner)
		if !errors.Is(err, ErrNoSignIn) || !strings.Contains(err.Error(), tc.want) || tok != "" {
			t.Errorf("%s: %q %v; want ErrNoSignIn saying %q", tc.name, tok, err, tc.want)
		}
		if _, err := st.Load(ctx, s.kept.keyOf(tc.owner)); err == nil {
			t.Errorf("%s: the record is still stored", tc.name)
		}
	}
	if len(audit) != 0 {
		t.Errorf("audit: %+v", audit)
	}
}

// The sweep deletes the kept sign-ins that can give no token any more,
// read or not, and keeps the others.
func TestKeptSignInSweep(t *testing.T) {
	clk := &clock{t: time.Now()}
	p := newTokenIdP(t, clk)
	s, st := keepingService(t, p, clk, nil)
	ctx := context.Background()
	p.signIn(t, s, "alice") // expires in 5 minutes, no refresh token
	p.refresh = "rt-bob"
	p.signIn(t, s, "bob") // renewable
	st.Store(ctx, TokenPrefix+"garbage", []byte("not sealed"))
	if n, err := s.SweepKept(ctx); err != nil || n != 1 {
		t.Fatalf("first sweep: %d %v, want the unsealed record alone", n, err)
	}
	clk.t = clk.t.Add(10 * time.Minute)
	if n, err := s.SweepKept(ctx); err != nil || n != 1 {
		t.Fatalf("sweep after alice's ID token expired: %d %v", n, err)
	}
	if _, err := st.Load(ctx, s.kept.keyOf("alice")); err == nil {
		t.Error("alice's expired sign-in is still stored")
	}
	if _, err := st.Load(ctx, s.kept.keyOf("bob")); err != nil {
		t.Errorf("bob's renewable sign-in was swept: %v", err)
	}
	clk.t = clk.t.Add(MaxKeptSignIn)
	if n, err := s.SweepKept(ctx); err != nil || n != 1 {
		t.Fatalf("sweep after the longest keep: %d %v", n, err)
	}
}

// With a refresh token (offline_access), an ID token about to expire is
// renewed at the IdP; a renewal the IdP refuses, or whose ID token names
// another person, ends what is kept.
func TestKeptSignInRenewal(t *testing.T) {
	clk := &clock{t: time.Now()}
	p := newTokenIdP(t, clk)
	p.refresh = "rt-first"
	s, st := keepingService(t, p, clk, nil)
	ctx := context.Background()
	p.signIn(t, s, "alice")
	first, err := s.SubjectToken(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(4*time.Minute + 30*time.Second)
	renewed, err := s.SubjectToken(ctx, "alice")
	if err != nil || renewed == first || p.refreshN != 1 {
		t.Fatalf("renewal: %v (renewed: %v, refresh grants %d)", err, renewed != first, p.refreshN)
	}
	if again, err := s.SubjectToken(ctx, "alice"); err != nil || again != renewed || p.refreshN != 1 {
		t.Errorf("a fresh renewed token was renewed again: %v, %d grants", err, p.refreshN)
	}

	// The IdP's renewal names someone else: refused, and forgotten.
	clk.t = clk.t.Add(4*time.Minute + 30*time.Second)
	p.mu.Lock()
	p.sub = "bob"
	p.mu.Unlock()
	if tok, err := s.SubjectToken(ctx, "alice"); !errors.Is(err, ErrNoSignIn) || !strings.Contains(err.Error(), "another person") || tok != "" {
		t.Errorf("a renewal for another person: %q %v", tok, err)
	}
	if _, err := st.Load(ctx, s.kept.keyOf("alice")); err == nil {
		t.Error("the record is still stored")
	}

	// The IdP refuses the refresh token: forgotten.
	p.mu.Lock()
	p.sub, p.refuse = "alice", false
	p.mu.Unlock()
	p.signIn(t, s, "alice")
	clk.t = clk.t.Add(4*time.Minute + 30*time.Second)
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
	if _, err := s.SubjectToken(ctx, "alice"); !errors.Is(err, ErrNoSignIn) || !strings.Contains(err.Error(), "invalid_grant") {
		t.Errorf("a refused renewal: %v", err)
	}
}

// fileStore is a file storage whose whole contents a test can read.
type fileStore struct{ *certmagic.FileStorage }

func (f *fileStore) all(t *testing.T) map[string][]byte {
	t.Helper()
	keys, err := f.List(context.Background(), "zidane", true)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, k := range keys {
		if b, err := f.Load(context.Background(), k); err == nil {
			out[k] = b
		}
	}
	return out
}
