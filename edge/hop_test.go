package edge

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func testHopKey(t *testing.T) *HopKey {
	t.Helper()
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return NewHopKey(k)
}

const (
	hopRoute = "aggregate-node|/mcp||a,b"
	hopSID   = "sid-1"
)

// signedHop is a hop from node a to node b, as the owner receives it.
func signedHop(t *testing.T, k *HopKey, method, body string, at time.Time) *http.Request {
	t.Helper()
	out := httptest.NewRequest(method, "http://127.0.0.1:9/mcp", strings.NewReader(body))
	out.Header.Set("Content-Type", "application/json")
	out.Header.Set("Accept", "application/json, text/event-stream")
	out.Header.Set("Mcp-Session-Id", hopSID)
	out.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	p := policy.Principal{TokenID: "tok_1", Name: "alice", Scopes: []string{"mcp"}}
	if _, err := k.Sign(out, hopRoute, "a", "b", p, "", "192.0.2.7", []byte(body), at); err != nil {
		t.Fatal(err)
	}
	return out
}

// Every alteration of a signed hop, a replay, a stale one, one meant for
// another node or route, and one signed with another key are refused; the
// hop as signed is taken once, with its principal.
func TestHopRefusesForgedAlteredReplayed(t *testing.T) {
	k := testHopKey(t)
	now := time.Now()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	verify := func(r *http.Request, body, self, route string) (HopClaims, string) {
		c, v := k.Verify(r, r.URL.RequestURI(), []byte(body), self, route, now)
		return c, v.Reason
	}
	for _, tc := range []struct {
		name   string
		change func(r *http.Request) (body, self, route string)
		want   string
	}{
		{"another body", func(r *http.Request) (string, string, string) {
			return strings.Replace(body, "tools/list", "tools/call", 1), "b", hopRoute
		}, "hop_forged"},
		{"another method", func(r *http.Request) (string, string, string) {
			r.Method = http.MethodDelete
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another path", func(r *http.Request) (string, string, string) { r.URL.Path = "/other"; return body, "b", hopRoute }, "hop_forged"},
		{"another session", func(r *http.Request) (string, string, string) {
			r.Header.Set("Mcp-Session-Id", "sid-2")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another protocol version", func(r *http.Request) (string, string, string) {
			r.Header.Set("Mcp-Protocol-Version", "2025-06-18")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"a Last-Event-ID added", func(r *http.Request) (string, string, string) {
			r.Header.Set("Last-Event-ID", "0")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"an Mcp-Name added", func(r *http.Request) (string, string, string) {
			r.Header.Set("Mcp-Name", "delete_everything")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"an Mcp-Param header added", func(r *http.Request) (string, string, string) {
			r.Header.Set("Mcp-Param-Region", "eu")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"an approved call's settlement added", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopSettledHeader, "apr_AAAAAAAAAAAAAAAAAAAAAA")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another principal", func(r *http.Request) (string, string, string) {
			other := signedHop(t, k, http.MethodPost, body, now)
			other.Header.Set(HopPrincipalHeader, "eyJUb2tlbklEIjoidG9rX2FkbWluIiwiU2NvcGVzIjpbImFkbWluIl19")
			r.Header.Set(HopPrincipalHeader, other.Header.Get(HopPrincipalHeader))
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another sender named", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "from=a", "from=c", 1))
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another route", func(r *http.Request) (string, string, string) { return body, "b", "aggregate-node|/mcp||a" }, "hop_forged"},
		{"another client address", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "c=192.0.2.7", "c=198.51.100.1", 1))
			return body, "b", hopRoute
		}, "hop_forged"},
		{"no client address", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), ";c=192.0.2.7", "", 1))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"a client address spelled another way", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "c=192.0.2.7", "c=192.0.2.07", 1))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"a client that is no address", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "c=192.0.2.7", "c=example.com", 1))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"the last version's header", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "v3;", "v2;", 1))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"a credential added", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopCredentialHeader, "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2ln")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"two credentials", func(r *http.Request) (string, string, string) {
			r.Header.Add(HopCredentialHeader, "a.b.c")
			r.Header.Add(HopCredentialHeader, "a.b.c")
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"received by another node", func(r *http.Request) (string, string, string) { return body, "c", hopRoute }, "hop_misdirected"},
		{"another cluster key", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, testHopKey(t), http.MethodPost, body, now)
			return body, "b", hopRoute
		}, "hop_forged"},
		{"stale", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, k, http.MethodPost, body, now.Add(-HopFreshness-time.Second))
			return body, "b", hopRoute
		}, "hop_stale"},
		{"from the future", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, k, http.MethodPost, body, now.Add(HopFreshness+time.Second))
			return body, "b", hopRoute
		}, "hop_stale"},
		{"no principal header", func(r *http.Request) (string, string, string) {
			r.Header.Del(HopPrincipalHeader)
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"two hop headers", func(r *http.Request) (string, string, string) {
			r.Header.Add(HopHeader, r.Header.Get(HopHeader))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"a made-up header", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, "v3;from=a;to=b;t=1;n=00000000000000000000000000000000;c=;mac=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"garbage", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, "let me in")
			return body, "b", hopRoute
		}, "hop_malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := signedHop(t, k, http.MethodPost, body, now)
			b, self, route := tc.change(r)
			if _, reason := verify(r, b, self, route); reason != tc.want {
				t.Fatalf("refused with %q, want %q", reason, tc.want)
			}
		})
	}

	r := signedHop(t, k, http.MethodPost, body, now)
	c, reason := verify(r, body, "b", hopRoute)
	if reason != "" || c.From != "a" || c.TokenID != "tok_1" || !slices.Equal(c.Scopes, []string{"mcp"}) || c.JWT != "" || c.Client != "192.0.2.7" {
		t.Fatalf("the hop as signed: %q %+v", reason, c)
	}
	if _, reason := verify(r, body, "b", hopRoute); reason != "hop_replayed" {
		t.Fatalf("the same hop again: %q, want hop_replayed", reason)
	}
	// GET and DELETE hops, without a body, are signed and checked alike.
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		r := signedHop(t, k, m, "", now)
		if _, reason := verify(r, "", "b", hopRoute); reason != "" {
			t.Fatalf("%s hop: %q", m, reason)
		}
	}
}

// A sender with no address that parses (a unix socket's) sends none, and
// the hop still holds; an IPv6 address goes in its one spelling.
func TestHopClientAddress(t *testing.T) {
	k := testHopKey(t)
	now := time.Now()
	for client, want := range map[string]string{"@": "", "": "", "2001:DB8::1": "2001:db8::1", "::ffff:192.0.2.1": "::ffff:192.0.2.1"} {
		out := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:9/mcp", nil)
		out.Header.Set("Mcp-Session-Id", hopSID)
		if _, err := k.Sign(out, hopRoute, "a", "b", policy.Principal{TokenID: "tok_1"}, "", client, nil, now); err != nil {
			t.Fatal(err)
		}
		c, v := k.Verify(out, out.URL.RequestURI(), nil, "b", hopRoute, now)
		if !v.Allowed() || c.Client != want {
			t.Errorf("client %q: %+v, client %q; want %q", client, v, c.Client, want)
		}
	}
}

// The answer tag binds the answer to its hop: another hop's nonce, other
// nodes, another key do not check.
func TestHopAnswerTag(t *testing.T) {
	k := testHopKey(t)
	c := HopClaims{From: "a", To: "b", Nonce: "0123456789abcdef0123456789abcdef"}
	tag := k.AnswerTag(c)
	if !k.CheckAnswer(tag, "a", "b", c.Nonce) {
		t.Fatal("the tag of the hop does not check")
	}
	for name, ok := range map[string]bool{
		"another nonce":  k.CheckAnswer(tag, "a", "b", "ffffffffffffffffffffffffffffffff"),
		"other nodes":    k.CheckAnswer(tag, "b", "a", c.Nonce),
		"another key":    testHopKey(t).CheckAnswer(tag, "a", "b", c.Nonce),
		"no tag":         k.CheckAnswer("", "a", "b", c.Nonce),
		"a made-up tag":  k.CheckAnswer("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "a", "b", c.Nonce),
		"not base64url!": k.CheckAnswer("***", "a", "b", c.Nonce),
	} {
		if ok {
			t.Errorf("%s: checks", name)
		}
	}
}

// The Mcp-Param-* headers a hop carries are under its MAC, by name and
// value: one changed, renamed or dropped is refused.
func TestHopCoversParamHeaders(t *testing.T) {
	k := testHopKey(t)
	now := time.Now()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"region":"us"}}}`
	sign := func() *http.Request {
		out := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:9/mcp", strings.NewReader(body))
		out.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		out.Header.Set("Mcp-Method", "tools/call")
		out.Header.Set("Mcp-Name", "t")
		out.Header.Set("Mcp-Param-Region", "us")
		if _, err := k.Sign(out, hopRoute, "a", "b", policy.Principal{TokenID: "tok_1"}, "", "127.0.0.1", []byte(body), now); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for name, change := range map[string]func(http.Header){
		"value changed": func(h http.Header) { h.Set("Mcp-Param-Region", "eu") },
		"renamed":       func(h http.Header) { h.Del("Mcp-Param-Region"); h.Set("Mcp-Param-Zone", "us") },
		"dropped":       func(h http.Header) { h.Del("Mcp-Param-Region") },
		"doubled":       func(h http.Header) { h.Add("Mcp-Param-Region", "eu") },
		"method":        func(h http.Header) { h.Set("Mcp-Method", "tools/list") },
	} {
		r := sign()
		change(r.Header)
		if _, v := k.Verify(r, r.URL.RequestURI(), []byte(body), "b", hopRoute, now); v.Reason != "hop_forged" {
			t.Errorf("%s: %+v, want hop_forged", name, v)
		}
	}
	r := sign()
	if _, v := k.Verify(r, r.URL.RequestURI(), []byte(body), "b", hopRoute, now); !v.Allowed() {
		t.Fatalf("the hop as signed: %+v", v)
	}
}

// An owner takes forwarded requests at a rate far above what a fixed count
// of nonces for the window allows (65,536 for 20 s capped it at about
// 3,300 a second): 100,000 distinct hops over 10 s of the owner's clock,
// 10,000 a second, are all taken, and one in 1,000, replayed half a window
// later, is refused.
func TestHopReplayCheckTakesAHighRate(t *testing.T) {
	k := testHopKey(t)
	start := time.Now()
	const n, rate = 100_000, 10_000
	step := time.Second / rate
	replayed := 0
	for i := range n {
		now := start.Add(time.Duration(i) * step)
		r := signedHop(t, k, http.MethodGet, "", now)
		if _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now); !v.Allowed() {
			t.Fatalf("hop %d of %d at %d a second: refused %d %q (%s)", i, n, rate, v.Status, v.Reason, v.Message)
		}
		if i%1000 == 0 {
			if _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now.Add(HopFreshness/2)); v.Reason != "hop_replayed" {
				t.Fatalf("hop %d replayed: %d %q, want hop_replayed", i, v.Status, v.Reason)
			}
			replayed++
		}
	}
	if replayed != n/1000 {
		t.Fatalf("%d replays checked, want %d", replayed, n/1000)
	}
}

// testJWT signs access tokens for a JWT verifier of its own key.
type testJWT struct {
	key *ecdsa.PrivateKey
}

func newTestJWT(t testing.TB) (testJWT, *policy.JWTVerifier) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := policy.NewJWTVerifier(ctx, policy.JWTConfig{Issuer: "https://idp.example/", Audiences: []string{"https://edge.example/mcp"},
		Algorithms: []string{"ES256"}, PublicKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return testJWT{key}, v
}

func (j testJWT) token(t testing.TB, sub, scope string) string {
	t.Helper()
	now := time.Now()
	raw, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": "https://idp.example/", "aud": "https://edge.example/mcp",
		"sub": sub, "scope": scope, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}).SignedString(j.key)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// A hop carries a credential only for a JWT principal, and only a JWT:
// Sign refuses to put an opaque token, or any credential of a token of
// the store, on a hop, and a JWT principal goes with its JWT.
func TestHopSignCarriesOnlyAJWT(t *testing.T) {
	k := testHopKey(t)
	issuer, _ := newTestJWT(t)
	alice := issuer.token(t, "alice", "mcp")
	out := func() *http.Request {
		r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:9/mcp", nil)
		r.Header.Set("Mcp-Session-Id", hopSID)
		return r
	}
	now := time.Now()
	for name, tc := range map[string]struct {
		p   policy.Principal
		jwt string
	}{
		"a token with an opaque token":  {policy.Principal{TokenID: "tok_1"}, policy.NewTokenSecret()},
		"a token with a JWT":            {policy.Principal{TokenID: "tok_1"}, alice},
		"a JWT subject without its JWT": {policy.Principal{TokenID: "jwt:alice"}, ""},
		"a JWT subject with an opaque":  {policy.Principal{TokenID: "jwt:alice"}, policy.NewTokenSecret()},
	} {
		r := out()
		if _, err := k.Sign(r, hopRoute, "a", "b", tc.p, tc.jwt, "127.0.0.1", nil, now); err == nil || r.Header.Get(HopCredentialHeader) != "" || r.Header.Get(HopHeader) != "" {
			t.Errorf("%s: signed (%v), credential header %q", name, err, r.Header.Get(HopCredentialHeader))
		}
	}
	r := out()
	if _, err := k.Sign(r, hopRoute, "a", "b", policy.Principal{TokenID: "jwt:alice", Scopes: []string{"mcp"}}, alice, "127.0.0.1", nil, now); err != nil {
		t.Fatal(err)
	}
	c, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now)
	if !v.Allowed() || c.TokenID != "jwt:alice" || c.JWT != alice {
		t.Fatalf("a JWT subject's hop: %+v %+v", v, c)
	}
}

// The receiver of a checked hop acts for the identity it names, as its own
// store or its own check of the JWT has it: each refusal has its status,
// reason and a message that says why.
func TestHopPrincipal(t *testing.T) {
	ctx := context.Background()
	tokens, err := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, mallory, err := tokens.Create(ctx, policy.TokenSpec{Name: "mallory", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	_, carol, _ := tokens.Create(ctx, policy.TokenSpec{Name: "carol", Scopes: []string{"chat"}})
	if _, err := tokens.Revoke(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	issuer, verifier := newTestJWT(t)
	a := policy.Authenticator{Tokens: tokens, JWT: verifier}
	alice := issuer.token(t, "alice", "mcp")
	now := time.Now()
	for _, tc := range []struct {
		name   string
		claims HopClaims
		status int
		reason string
		says   string
	}{
		{"mallory as she is", HopClaims{TokenID: mallory.ID, Scopes: []string{"chat"}}, 0, "", ""},
		{"mallory with sessions:any", HopClaims{TokenID: mallory.ID, Scopes: []string{"chat", "sessions:any"}}, http.StatusForbidden, "hop_scopes", "sessions:any"},
		{"carol, revoked", HopClaims{TokenID: carol.ID, Scopes: []string{"chat"}}, http.StatusUnauthorized, "hop_principal", "revoked"},
		{"a token no replica made", HopClaims{TokenID: "tok_00000000deadbeef", Scopes: []string{"chat"}}, http.StatusUnauthorized, "hop_principal", "no token has id"},
		{"alice with her JWT", HopClaims{TokenID: "jwt:alice", Scopes: []string{"mcp"}, JWT: alice}, 0, "", ""},
		{"alice without it", HopClaims{TokenID: "jwt:alice", Scopes: []string{"mcp"}}, http.StatusUnauthorized, "hop_principal", "access token"},
		{"bob with alice's JWT", HopClaims{TokenID: "jwt:bob", Scopes: []string{"mcp"}, JWT: alice}, http.StatusUnauthorized, "hop_principal", "alice"},
		{"alice with admin", HopClaims{TokenID: "jwt:alice", Scopes: []string{"mcp", "admin"}, JWT: alice}, http.StatusForbidden, "hop_scopes", "admin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, v := tc.claims.Principal(ctx, a, now)
			if tc.status == 0 {
				if !v.Allowed() || p.TokenID != tc.claims.TokenID || !slices.Equal(p.Scopes, tc.claims.Scopes) {
					t.Fatalf("%+v %+v", v, p)
				}
				return
			}
			if v.Status != tc.status || v.Reason != tc.reason || !strings.Contains(v.Message, tc.says) || p.TokenID != "" {
				t.Fatalf("%d %q %q (principal %+v), want %d %s saying %q", v.Status, v.Reason, v.Message, p, tc.status, tc.reason, tc.says)
			}
		})
	}
}

// Any one of the hop headers makes a request a hop, to be checked by its
// signature: a client cannot slip one past the edge by sending it alone.
func TestIsHop(t *testing.T) {
	for _, name := range []string{"zidane-hop", "Zidane-Hop-Principal", "ZIDANE-HOP-CREDENTIAL"} {
		h := http.Header{}
		h.Set(name, "x")
		if !IsHop(h) {
			t.Errorf("%s alone is not taken as a hop", name)
		}
	}
	if IsHop(http.Header{"Authorization": {"Bearer x"}, "Zidane-Hop-Answer": {"x"}}) {
		t.Error("a request without hop headers is taken as a hop")
	}
}
