package policy

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
)

const (
	testIssuer   = "https://idp.example/"
	testAudience = "https://edge.example/mcp"
)

// testKey is a signing key of the test identity provider.
type testKey struct {
	kid    string
	method jwt.SigningMethod
	priv   crypto.Signer
}

// RSA keys take a while to generate, so the tests share two.
var (
	testRSAKeyA = sync.OnceValue(func() *rsa.PrivateKey { return mustRSA(2048) })
	testRSAKeyB = sync.OnceValue(func() *rsa.PrivateKey { return mustRSA(2048) })
)

func mustRSA(bits int) *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		panic(err)
	}
	return k
}

func rsaKey(kid string, priv *rsa.PrivateKey) testKey {
	return testKey{kid: kid, method: jwt.SigningMethodRS256, priv: priv}
}

func ecKey(t testing.TB, kid string) testKey {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return testKey{kid: kid, method: jwt.SigningMethodES256, priv: priv}
}

func edKey(t testing.TB, kid string) testKey {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return testKey{kid: kid, method: jwt.SigningMethodEdDSA, priv: priv}
}

// claims are valid claims for a user token; tests change what they check.
func claims(mod func(jwt.MapClaims)) jwt.MapClaims {
	now := time.Now()
	c := jwt.MapClaims{
		"iss":   testIssuer,
		"aud":   testAudience,
		"sub":   "user-1",
		"iat":   now.Unix(),
		"exp":   now.Add(time.Hour).Unix(),
		"scope": "mcp:read mcp:write",
	}
	if mod != nil {
		mod(c)
	}
	return c
}

func (k testKey) sign(t testing.TB, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(k.method, c)
	if k.kid != "" {
		tok.Header["kid"] = k.kid
	}
	raw, err := tok.SignedString(k.priv)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func (k testKey) jwk(t testing.TB) jwkset.JWKMarshal {
	t.Helper()
	j, err := jwkset.NewJWKFromKey(k.priv.Public(), jwkset.JWKOptions{
		Metadata: jwkset.JWKMetadataOptions{KID: k.kid, ALG: jwkset.ALG(k.method.Alg()), USE: jwkset.UseSig},
	})
	if err != nil {
		t.Fatal(err)
	}
	return j.Marshal()
}

func (k testKey) pem(t testing.TB) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k.priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// testIdP serves a JWKS over a real HTTP server and counts the fetches.
type testIdP struct {
	t       testing.TB
	srv     *httptest.Server
	fetches atomic.Int32

	mu       sync.Mutex
	keys     []jwkset.JWKMarshal
	failNext int    // answer this many fetches with 503
	hang     bool   // never answer until the client gives up
	body     []byte // served instead of the key set when set
}

func newTestIdP(t testing.TB, keys ...testKey) *testIdP {
	idp := &testIdP{t: t}
	idp.publish(keys...)
	idp.srv = httptest.NewServer(http.HandlerFunc(idp.serve))
	t.Cleanup(idp.srv.Close)
	return idp
}

func (idp *testIdP) url() string { return idp.srv.URL + "/.well-known/jwks.json" }

func (idp *testIdP) publish(keys ...testKey) {
	set := make([]jwkset.JWKMarshal, 0, len(keys))
	for _, k := range keys {
		set = append(set, k.jwk(idp.t))
	}
	idp.mu.Lock()
	idp.keys = set
	idp.mu.Unlock()
}

func (idp *testIdP) serve(w http.ResponseWriter, r *http.Request) {
	idp.fetches.Add(1)
	idp.mu.Lock()
	hang, keys, body := idp.hang, idp.keys, idp.body
	fail := idp.failNext > 0
	if fail {
		idp.failNext--
	}
	idp.mu.Unlock()
	switch {
	case hang:
		<-r.Context().Done()
	case fail:
		http.Error(w, "identity provider unavailable", http.StatusServiceUnavailable)
	case body != nil:
		_, _ = w.Write(body)
	default:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(jwkset.JWKSMarshal{Keys: keys})
	}
}

func (idp *testIdP) set(fn func(*testIdP)) {
	idp.mu.Lock()
	fn(idp)
	idp.mu.Unlock()
}

// testCtx is a safety net against a hang, never a timing assertion.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newVerifier(t testing.TB, cfg JWTConfig) *JWTVerifier {
	t.Helper()
	if cfg.Issuer == "" {
		cfg.Issuer = testIssuer
	}
	if cfg.Audiences == nil {
		cfg.Audiences = []string{testAudience}
	}
	v, err := NewJWTVerifier(testCtx(t), cfg, nil)
	if err != nil {
		t.Fatalf("NewJWTVerifier: %v", err)
	}
	t.Cleanup(v.Close)
	return v
}

// mustRefuse checks that err is a refusal that says want and does not
// contain the token.
func mustRefuse(t *testing.T, err error, raw, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("token accepted; want an error saying %q", want)
	}
	t.Logf("refused: %v", err)
	if !errors.Is(err, ErrTokenInvalid) {
		t.Errorf("error %q does not wrap ErrTokenInvalid", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	parts := strings.Split(raw, ".")
	for _, leak := range []string{raw, parts[len(parts)-1]} {
		if len(leak) > 8 && strings.Contains(err.Error(), leak) {
			t.Errorf("error contains the token: %q", err)
		}
	}
}

func TestJWTVerifyValidPerAlgorithm(t *testing.T) {
	keys := []testKey{rsaKey("rsa-1", testRSAKeyA()), ecKey(t, "ec-1"), edKey(t, "ed-1")}
	idp := newTestIdP(t, keys...)
	v := newVerifier(t, JWTConfig{JWKSURL: idp.url(), Algorithms: []string{"RS256", "ES256", "EdDSA"}})
	for _, k := range keys {
		t.Run(k.method.Alg(), func(t *testing.T) {
			p, err := v.Verify(testCtx(t), k.sign(t, claims(nil)))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			want := Principal{TokenID: "jwt:user-1", Name: "user-1", Kind: KindUser, Scopes: []string{"mcp:read", "mcp:write"}, Source: "jwt"}
			if p.TokenID != want.TokenID || p.Name != want.Name || p.Kind != want.Kind || p.Source != want.Source || !slices.Equal(p.Scopes, want.Scopes) {
				t.Errorf("principal = %+v, want %+v", p, want)
			}
		})
	}
	if n := idp.fetches.Load(); n != 1 {
		t.Errorf("JWKS fetched %d times for cached keys, want 1", n)
	}
}

func TestJWTScopes(t *testing.T) {
	k := ecKey(t, "ec-1")
	v := newVerifier(t, JWTConfig{JWKSURL: newTestIdP(t, k).url()})
	tests := []struct {
		name string
		set  map[string]any
		want []string
	}{
		{"scope string", map[string]any{"scope": "a b  c"}, []string{"a", "b", "c"}},
		{"scp array", map[string]any{"scope": nil, "scp": []string{"mcp:read", "mcp:admin"}}, []string{"mcp:read", "mcp:admin"}},
		{"scp string", map[string]any{"scope": nil, "scp": "x y"}, []string{"x", "y"}},
		{"scope and scp united", map[string]any{"scope": "a b", "scp": []string{"b", "c"}}, []string{"a", "b", "c"}},
		{"none", map[string]any{"scope": nil}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := k.sign(t, claims(func(c jwt.MapClaims) {
				for name, val := range tt.set {
					if val == nil {
						delete(c, name)
					} else {
						c[name] = val
					}
				}
			}))
			p, err := v.Verify(testCtx(t), raw)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if !slices.Equal(p.Scopes, tt.want) {
				t.Errorf("scopes = %q, want %q", p.Scopes, tt.want)
			}
		})
	}
	t.Run("scope of the wrong type", func(t *testing.T) {
		raw := k.sign(t, claims(func(c jwt.MapClaims) { c["scope"] = 42 }))
		_, err := v.Verify(testCtx(t), raw)
		mustRefuse(t, err, raw, "must each be a string or an array of strings")
	})
}

func TestJWTClaims(t *testing.T) {
	k := rsaKey("rsa-1", testRSAKeyA())
	v := newVerifier(t, JWTConfig{
		JWKSURL:   newTestIdP(t, k).url(),
		Audiences: []string{testAudience, "https://edge.example/other"},
	})
	now := time.Now()
	tests := []struct {
		name    string
		mod     func(jwt.MapClaims)
		wantErr string // empty: accepted
	}{
		{"several audiences, one matches", func(c jwt.MapClaims) { c["aud"] = []string{"https://api.example", testAudience} }, ""},
		{"second configured audience", func(c jwt.MapClaims) { c["aud"] = "https://edge.example/other" }, ""},
		{"expired within leeway", func(c jwt.MapClaims) { c["exp"] = now.Add(-10 * time.Second).Unix() }, ""},
		{"wrong issuer", func(c jwt.MapClaims) { c["iss"] = "https://evil.example/" }, `issuer "https://evil.example/" is not the configured issuer "https://idp.example/"`},
		{"no issuer", func(c jwt.MapClaims) { delete(c, "iss") }, `no iss claim; this server accepts tokens from issuer "https://idp.example/" only`},
		{"wrong audience", func(c jwt.MapClaims) { c["aud"] = "https://api.example" }, `request a token for "https://edge.example/mcp"`},
		{"several audiences, none matches", func(c jwt.MapClaims) { c["aud"] = []string{"a", "b"} }, `audience "a", "b" does not name this resource`},
		{"no audience", func(c jwt.MapClaims) { delete(c, "aud") }, "audience (none) does not name this resource"},
		{"expired", func(c jwt.MapClaims) { c["exp"] = now.Add(-2 * time.Minute).Unix() }, "expired at"},
		{"not valid yet", func(c jwt.MapClaims) { c["nbf"] = now.Add(10 * time.Minute).Unix() }, "not valid before"},
		{"issued in the future", func(c jwt.MapClaims) { c["iat"] = now.Add(10 * time.Minute).Unix() }, "issued in the future"},
		{"no exp", func(c jwt.MapClaims) { delete(c, "exp") }, "no exp claim"},
		{"no sub", func(c jwt.MapClaims) { delete(c, "sub") }, "no sub claim"},
		{"exp of the wrong type", func(c jwt.MapClaims) { c["exp"] = "tomorrow" }, "not a well-formed JWT"},
		{"several problems", func(c jwt.MapClaims) {
			c["iss"] = "https://evil.example/"
			c["exp"] = now.Add(-time.Hour).Unix()
		}, "expired at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := k.sign(t, claims(tt.mod))
			p, err := v.Verify(testCtx(t), raw)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if p.TokenID != "jwt:user-1" {
					t.Errorf("TokenID = %q", p.TokenID)
				}
				return
			}
			mustRefuse(t, err, raw, tt.wantErr)
		})
	}
}

func TestJWTAlgorithmsRefused(t *testing.T) {
	rsa1 := rsaKey("rsa-1", testRSAKeyA())
	ec1 := ecKey(t, "ec-1")
	idp := newTestIdP(t, rsa1, ec1)
	jwks := newVerifier(t, JWTConfig{JWKSURL: idp.url(), Algorithms: []string{"RS256"}})
	static := newVerifier(t, JWTConfig{PublicKeyPEM: rsa1.pem(t), Algorithms: []string{"RS256"}})

	hmacWith := func(secret []byte) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims(nil))
		tok.Header["kid"] = "rsa-1"
		raw, err := tok.SignedString(secret)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	der, err := x509.MarshalPKIXPublicKey(&testRSAKeyA().PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	unsigned := jwt.NewWithClaims(jwt.SigningMethodNone, claims(nil))
	unsigned.Header["kid"] = "rsa-1"
	none, err := unsigned.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	valid := rsa1.sign(t, claims(nil))
	parts := strings.Split(valid, ".")
	forged := rsa1.sign(t, claims(func(c jwt.MapClaims) { c["sub"] = "admin" }))
	tampered := parts[0] + "." + strings.Split(forged, ".")[1] + "." + parts[2]
	impostor := rsaKey("rsa-1", testRSAKeyB()) // same kid, other key

	tests := []struct {
		name string
		raw  string
		want string
	}{
		{"ES256 when only RS256 is allowed", ec1.sign(t, claims(nil)), `algorithm "ES256" is not allowed; this server accepts RS256`},
		{"alg none", none, `alg "none" (an unsigned token) is never accepted`},
		{"HS256 with the PEM public key as secret", hmacWith(rsa1.pem(t)), `algorithm "HS256" is not allowed`},
		{"HS256 with the DER public key as secret", hmacWith(der), `algorithm "HS256" is not allowed`},
		{"payload swapped under a valid signature", tampered, "signature does not verify"},
		{"signed by another key under a known kid", impostor.sign(t, claims(nil)), "signature does not verify"},
		{"unknown alg", jwtTestToken(`{"alg":"XYZ","kid":"rsa-1"}`, `{"sub":"x"}`, "c2ln"), `algorithm "XYZ" is not allowed`},
		{"no alg", jwtTestToken(`{"kid":"rsa-1"}`, `{"sub":"x"}`, "c2ln"), `no "alg"`},
		{"garbage", "not.a.jwt", "not a well-formed JWT"},
		{"two segments", "eyJhbGciOiJSUzI1NiJ9.e30", "not a well-formed JWT"},
	}
	for name, v := range map[string]*JWTVerifier{"jwks": jwks, "pem": static} {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				_, err := v.Verify(testCtx(t), tt.raw)
				mustRefuse(t, err, tt.raw, tt.want)
			})
		}
	}
	if _, err := jwks.Verify(testCtx(t), valid); err != nil {
		t.Errorf("valid RS256 token refused: %v", err)
	}
}

// jwtTestToken assembles a token from raw JSON, for headers the jwt package
// would not produce.
func jwtTestToken(header, payload, sig string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(header)) + "." + enc([]byte(payload)) + "." + sig
}

func TestJWTKeyRotation(t *testing.T) {
	a := rsaKey("key-a", testRSAKeyA())
	b := ecKey(t, "key-b")
	c := ecKey(t, "key-c")
	idp := newTestIdP(t, a)
	v := newVerifier(t, JWTConfig{JWKSURL: idp.url()})
	ctx := testCtx(t)

	if _, err := v.Verify(ctx, a.sign(t, claims(nil))); err != nil {
		t.Fatalf("token of the cached key: %v", err)
	}
	if n := idp.fetches.Load(); n != 1 {
		t.Fatalf("fetches after start = %d, want 1", n)
	}

	idp.publish(a, b)
	if _, err := v.Verify(ctx, b.sign(t, claims(nil))); err != nil {
		t.Fatalf("token of the rotated-in key: %v", err)
	}
	if n := idp.fetches.Load(); n != 2 {
		t.Fatalf("fetches after an unknown kid = %d, want 2", n)
	}

	unknown := c.sign(t, claims(nil))
	for range 20 {
		_, err := v.Verify(ctx, unknown)
		mustRefuse(t, err, unknown, `unknown key id "key-c"`)
		if errors.Is(err, ErrKeysUnavailable) {
			t.Fatalf("unknown kid reported as keys unavailable: %v", err)
		}
	}
	if n := idp.fetches.Load(); n != 2 {
		t.Errorf("fetches after 20 more unknown kids within the rate limit = %d, want 2", n)
	}
	if _, err := v.Verify(ctx, b.sign(t, claims(nil))); err != nil {
		t.Errorf("rotated-in key no longer accepted: %v", err)
	}
}

func TestJWTKeyRotationConcurrent(t *testing.T) {
	a := ecKey(t, "key-a")
	b := ecKey(t, "key-b")
	idp := newTestIdP(t, a)
	v := newVerifier(t, JWTConfig{JWKSURL: idp.url()})
	idp.publish(a, b)
	raw := b.sign(t, claims(nil))

	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			_, err := v.Verify(testCtx(t), raw)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a request that arrived during the rotation was refused: %v", err)
		}
	}
	if n := idp.fetches.Load(); n != 2 {
		t.Errorf("fetches = %d, want 2 (start and one refresh)", n)
	}
}

func TestJWTKeysUnavailable(t *testing.T) {
	k := ecKey(t, "ec-1")
	idp := newTestIdP(t, k)
	url := idp.url()
	idp.srv.Close()

	v := newVerifier(t, JWTConfig{JWKSURL: url})
	noKID := k
	noKID.kid = ""
	for i, raw := range []string{k.sign(t, claims(nil)), k.sign(t, claims(nil)), noKID.sign(t, claims(nil))} {
		_, err := v.Verify(testCtx(t), raw)
		mustRefuse(t, err, raw, "no keys could be fetched from "+url)
		if !errors.Is(err, ErrKeysUnavailable) {
			t.Errorf("attempt %d: error does not wrap ErrKeysUnavailable: %v", i, err)
		}
		if !strings.Contains(err.Error(), "reachable") {
			t.Errorf("error does not say what to check: %v", err)
		}
	}
}

func TestJWTInitialFetchRetriedLazily(t *testing.T) {
	for _, withKID := range []bool{true, false} {
		name := map[bool]string{true: "kid", false: "no kid"}[withKID]
		t.Run(name, func(t *testing.T) {
			k := ecKey(t, "ec-1")
			if !withKID {
				k.kid = ""
			}
			idp := newTestIdP(t, k)
			idp.set(func(idp *testIdP) { idp.failNext = 1 })
			v := newVerifier(t, JWTConfig{JWKSURL: idp.url()})
			if n := idp.fetches.Load(); n != 1 {
				t.Fatalf("fetches at start = %d, want 1", n)
			}
			if _, err := v.Verify(testCtx(t), k.sign(t, claims(nil))); err != nil {
				t.Fatalf("Verify after the provider came back: %v", err)
			}
			if n := idp.fetches.Load(); n != 2 {
				t.Errorf("fetches = %d, want 2", n)
			}
		})
	}
}

func TestJWTInitialFetchBoundedByContext(t *testing.T) {
	idp := newTestIdP(t, ecKey(t, "ec-1"))
	idp.set(func(idp *testIdP) { idp.hang = true })
	ctx, cancel := context.WithTimeout(testCtx(t), 100*time.Millisecond)
	defer cancel()
	v, err := NewJWTVerifier(ctx, JWTConfig{Issuer: testIssuer, Audiences: []string{testAudience}, JWKSURL: idp.url()}, nil)
	if err == nil {
		v.Close()
		t.Fatal("NewJWTVerifier returned a verifier although its context ended during the initial fetch")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("error = %v, want an interrupted fetch", err)
	}
}

func TestJWTVerifyBoundedByContext(t *testing.T) {
	a := ecKey(t, "key-a")
	b := ecKey(t, "key-b")
	idp := newTestIdP(t, a)
	v := newVerifier(t, JWTConfig{JWKSURL: idp.url()})
	idp.set(func(idp *testIdP) { idp.hang = true })

	ctx, cancel := context.WithTimeout(testCtx(t), 100*time.Millisecond)
	defer cancel()
	raw := b.sign(t, claims(nil))
	_, err := v.Verify(ctx, raw)
	mustRefuse(t, err, raw, `unknown key id "key-b"`)
	if !strings.Contains(err.Error(), "deadline exceeded") {
		t.Errorf("error does not say the wait was cut short: %v", err)
	}
	if _, err := v.Verify(testCtx(t), a.sign(t, claims(nil))); err != nil {
		t.Errorf("cached key refused while the provider hangs: %v", err)
	}
}

func TestJWTOversizedJWKS(t *testing.T) {
	k := ecKey(t, "ec-1")
	idp := newTestIdP(t, k)
	idp.set(func(idp *testIdP) {
		idp.body = []byte(`{"keys":[` + strings.Repeat(" ", 2<<20) + `]}`)
	})
	v := newVerifier(t, JWTConfig{JWKSURL: idp.url()})
	raw := k.sign(t, claims(nil))
	_, err := v.Verify(testCtx(t), raw)
	mustRefuse(t, err, raw, "larger than 1048576 bytes")
	if !errors.Is(err, ErrKeysUnavailable) {
		t.Errorf("error does not wrap ErrKeysUnavailable: %v", err)
	}
}

func TestJWTEmptyJWKS(t *testing.T) {
	k := ecKey(t, "ec-1")
	v := newVerifier(t, JWTConfig{JWKSURL: newTestIdP(t).url()})
	raw := k.sign(t, claims(nil))
	_, err := v.Verify(testCtx(t), raw)
	mustRefuse(t, err, raw, "holds no usable signing key")
	if !errors.Is(err, ErrKeysUnavailable) {
		t.Errorf("error does not wrap ErrKeysUnavailable: %v", err)
	}
}

func TestJWTNoKID(t *testing.T) {
	k := ecKey(t, "")
	other := rsaKey("", testRSAKeyA())
	v := newVerifier(t, JWTConfig{JWKSURL: newTestIdP(t, k).url()})
	if _, err := v.Verify(testCtx(t), k.sign(t, claims(nil))); err != nil {
		t.Fatalf("token without kid: %v", err)
	}
	raw := other.sign(t, claims(nil))
	_, err := v.Verify(testCtx(t), raw)
	mustRefuse(t, err, raw, "no key in the JWKS at")
}

func TestJWTCloseStopsFetching(t *testing.T) {
	a := ecKey(t, "key-a")
	idp := newTestIdP(t, a)
	v := newVerifier(t, JWTConfig{JWKSURL: idp.url()})
	v.Close()
	v.Close()
	if _, err := v.Verify(testCtx(t), a.sign(t, claims(nil))); err != nil {
		t.Errorf("cached key refused after Close: %v", err)
	}
	raw := ecKey(t, "key-b").sign(t, claims(nil))
	_, err := v.Verify(testCtx(t), raw)
	mustRefuse(t, err, raw, "closed")
	if n := idp.fetches.Load(); n != 1 {
		t.Errorf("fetches after Close = %d, want 1", n)
	}
}

func TestJWTOversizedToken(t *testing.T) {
	k := ecKey(t, "ec-1")
	v := newVerifier(t, JWTConfig{JWKSURL: newTestIdP(t, k).url()})
	raw := k.sign(t, claims(func(c jwt.MapClaims) { c["pad"] = strings.Repeat("x", 40<<10) }))
	_, err := v.Verify(testCtx(t), raw)
	mustRefuse(t, err, raw, "more than the 32768 this server accepts")
}

func TestJWTStaticPEM(t *testing.T) {
	rsaA := rsaKey("", testRSAKeyA())
	ec := ecKey(t, "")
	ed := edKey(t, "")
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&testRSAKeyA().PublicKey)})
	tests := []struct {
		name string
		pem  []byte
		algs []string
		key  testKey
	}{
		{"RSA PKIX", rsaA.pem(t), nil, rsaA},
		{"RSA PKCS1", pkcs1, []string{"RS256"}, rsaA},
		{"EC P-256", ec.pem(t), []string{"ES256"}, ec},
		{"Ed25519", ed.pem(t), []string{"EdDSA"}, ed},
		{"certificate", selfSignedCert(t, ec.priv), nil, ec},
		{"second of two keys", append(rsaA.pem(t), ec.pem(t)...), nil, ec},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newVerifier(t, JWTConfig{PublicKeyPEM: tt.pem, Algorithms: tt.algs})
			p, err := v.Verify(testCtx(t), tt.key.sign(t, claims(nil)))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if p.Source != "jwt" || p.Name != "user-1" {
				t.Errorf("principal = %+v", p)
			}
			raw := ecKey(t, "").sign(t, claims(nil))
			if _, err := v.Verify(testCtx(t), raw); err == nil {
				t.Error("token signed by an unconfigured key was accepted")
			}
		})
	}
}

func selfSignedCert(t *testing.T, priv crypto.Signer) []byte {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "idp.example"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, priv.Public(), priv)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestJWTMachineKind(t *testing.T) {
	k := ecKey(t, "ec-1")
	v := newVerifier(t, JWTConfig{JWKSURL: newTestIdP(t, k).url(), MachineScope: "machine"})
	tests := []struct {
		name     string
		set      map[string]any
		wantKind Kind
		wantName string
	}{
		{"user", map[string]any{"client_id": "cursor", "azp": "cursor"}, KindUser, "user-1"},
		{"auth0 client credentials", map[string]any{"sub": "abc@clients", "gty": "client-credentials", "azp": "abc"}, KindMachine, "abc"},
		{"auth0 gty array", map[string]any{"gty": []string{"refresh_token", "password"}}, KindUser, "user-1"},
		{"RFC 9068 client_id equals sub", map[string]any{"sub": "ci-bot", "client_id": "ci-bot"}, KindMachine, "ci-bot"},
		{"okta cid equals sub", map[string]any{"sub": "0oa1", "cid": "0oa1"}, KindMachine, "0oa1"},
		{"entra app token", map[string]any{"sub": "9f1c", "idtyp": "app", "azp": "c0ffee"}, KindMachine, "c0ffee"},
		{"machine scope", map[string]any{"scope": "mcp:read machine"}, KindMachine, "user-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := k.sign(t, claims(func(c jwt.MapClaims) {
				for name, val := range tt.set {
					c[name] = val
				}
			}))
			p, err := v.Verify(testCtx(t), raw)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if p.Kind != tt.wantKind || p.Name != tt.wantName {
				t.Errorf("kind, name = %s, %q; want %s, %q", p.Kind, p.Name, tt.wantKind, tt.wantName)
			}
			sub := "user-1"
			if s, ok := tt.set["sub"].(string); ok {
				sub = s
			}
			if p.TokenID != "jwt:"+sub {
				t.Errorf("TokenID = %q, want %q", p.TokenID, "jwt:"+sub)
			}
		})
	}
}

// A caller that read the PEM from a file names the file: every error about
// the PEM is a PEMError, whose Reason says what to give instead.
func TestJWTPEMErrorsAreTyped(t *testing.T) {
	ec := ecKey(t, "")
	der, err := x509.MarshalPKCS8PrivateKey(ec.priv)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		pem  []byte
		want string
	}{
		"private key":         {pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), "holds a private key (PRIVATE KEY): give the public key instead"},
		"EC private key":      {pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), "holds a private key (EC PRIVATE KEY)"},
		"not PEM":             {[]byte(`{"kty":"EC"}`), "holds no PEM block"},
		"not a public key":    {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), "is not a public key"},
		"public then private": {append(ec.pem(t), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})...), "holds a private key"},
	} {
		cfg := JWTConfig{Issuer: testIssuer, Audiences: []string{testAudience}, PublicKeyPEM: c.pem}
		_, err := NewJWTVerifier(testCtx(t), cfg, nil)
		var pe *PEMError
		if !errors.As(err, &pe) || !strings.Contains(pe.Reason, c.want) {
			t.Errorf("%s: NewJWTVerifier error = %v; want a PEMError saying %q", name, err, c.want)
		}
	}
}

func TestJWTConfigErrors(t *testing.T) {
	ec := ecKey(t, "")
	small := rsaKey("", mustRSA(1024))
	ok := JWTConfig{Issuer: testIssuer, Audiences: []string{testAudience}, JWKSURL: "https://idp.example/jwks"}
	tests := []struct {
		name string
		mod  func(*JWTConfig)
		want string
	}{
		{"no issuer", func(c *JWTConfig) { c.Issuer = "" }, "issuer is required"},
		{"no audience", func(c *JWTConfig) { c.Audiences = nil }, "at least one audience is required"},
		{"empty audience", func(c *JWTConfig) { c.Audiences = []string{""} }, "empty value"},
		{"neither JWKS nor PEM", func(c *JWTConfig) { c.JWKSURL = "" }, "no signing keys configured"},
		{"both JWKS and PEM", func(c *JWTConfig) { c.PublicKeyPEM = ec.pem(t) }, "keep only one"},
		{"bad PEM", func(c *JWTConfig) { c.JWKSURL, c.PublicKeyPEM = "", []byte("not pem") }, "holds no PEM block"},
		{"corrupt PEM", func(c *JWTConfig) {
			c.JWKSURL, c.PublicKeyPEM = "", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("junk")})
		}, "does not parse"},
		{"private key PEM", func(c *JWTConfig) {
			der, _ := x509.MarshalPKCS8PrivateKey(ec.priv)
			c.JWKSURL, c.PublicKeyPEM = "", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
		}, "holds a private key"},
		{"short RSA key", func(c *JWTConfig) { c.JWKSURL, c.PublicKeyPEM = "", small.pem(t) }, "1024 bits, fewer than the 2048 required"},
		{"key no algorithm fits", func(c *JWTConfig) {
			c.JWKSURL, c.PublicKeyPEM, c.Algorithms = "", ec.pem(t), []string{"RS256"}
		}, "add ES256 to algorithms"},
		{"alg none", func(c *JWTConfig) { c.Algorithms = []string{"RS256", "none"} }, `"none" means unsigned tokens`},
		{"HS256", func(c *JWTConfig) { c.Algorithms = []string{"HS256"} }, `"HS256" is symmetric`},
		{"unknown algorithm", func(c *JWTConfig) { c.Algorithms = []string{"rs256"} }, `unsupported algorithm "rs256"`},
		{"plain http JWKS", func(c *JWTConfig) { c.JWKSURL = "http://idp.example/jwks" }, "plain http is allowed only to"},
		{"relative JWKS URL", func(c *JWTConfig) { c.JWKSURL = "/jwks" }, "use https://"},
		{"negative leeway", func(c *JWTConfig) { c.Leeway = -time.Second }, "leeway -1s is out of range"},
		{"huge leeway", func(c *JWTConfig) { c.Leeway = time.Hour }, "leeway 1h0m0s is out of range"},
		{"machine scope with a space", func(c *JWTConfig) { c.MachineScope = "agent machine" }, "give one scope, without spaces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.mod(&cfg)
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error saying %q", err, tt.want)
			}
			v, err := NewJWTVerifier(testCtx(t), cfg, nil)
			if err == nil || v != nil {
				t.Fatalf("NewJWTVerifier = %v, %v; want an error", v, err)
			}
		})
	}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
	// Closing the verifier that a failed NewJWTVerifier did not return is
	// what a Caddy cleanup after a failed provision does.
	var never *JWTVerifier
	never.Close()
	loopback := ok
	loopback.JWKSURL = "http://127.0.0.1:1/jwks"
	if err := loopback.Validate(); err != nil {
		t.Errorf("plain http to loopback refused: %v", err)
	}
}

func TestLooksLikeJWT(t *testing.T) {
	real := ecKey(t, "ec-1").sign(t, claims(nil))
	tests := []struct {
		raw  string
		want bool
	}{
		{real, true},
		{jwtTestToken(`{"alg":"none"}`, `{"sub":"x"}`, ""), true},
		{"zds_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG", false},
		{"", false},
		{"a.b", false},
		{real + ".x.y", false},
		{jwtTestToken(`not json`, `{}`, "c2ln"), false},
		{jwtTestToken(`{"typ":"JWT"}`, `{}`, "c2ln"), false},
		{jwtTestToken(`{"alg":5}`, `{}`, "c2ln"), false},
		{jwtTestToken(`{"alg":""}`, `{}`, "c2ln"), false},
		{jwtTestToken(`["alg"]`, `{}`, "c2ln"), false},
		{"eyJhbGciOiJSUzI1NiJ9=.e30.c2ln", false},
		{"eyJhbGciOiJSUzI1NiJ9..c2ln", false},
		{"eyJhbGciOiJSUzI1NiJ9.e3+0.c2ln", false},
	}
	for _, tt := range tests {
		if got := LooksLikeJWT(tt.raw); got != tt.want {
			t.Errorf("LooksLikeJWT(%.40q) = %v, want %v", tt.raw, got, tt.want)
		}
	}
}

func BenchmarkJWTVerify(b *testing.B) {
	for _, k := range []testKey{rsaKey("rsa-1", testRSAKeyA()), ecKey(b, "ec-1"), edKey(b, "ed-1")} {
		b.Run(k.method.Alg(), func(b *testing.B) {
			idp := newTestIdP(b, k)
			v := newVerifier(b, JWTConfig{JWKSURL: idp.url(), Algorithms: []string{k.method.Alg()}})
			raw := k.sign(b, claims(nil))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(ctx, raw); err != nil {
					b.Fatal(err)
				}
			}
			if n := idp.fetches.Load(); n != 1 {
				b.Errorf("fetches = %d, want 1: the key was not served from the cache", n)
			}
		})
	}
}

// A JWS header's crit lists extensions the recipient must understand, or
// refuse the token (RFC 7515 section 4.1.11). This verifier implements
// none, and golang-jwt ignores crit, so a token whose issuer relies on one
// (b64: false, RFC 7797, changes what the signature covers) must not be
// read as if it had none. Every token here is signed by the issuer's key.
func TestJWTCritHeader(t *testing.T) {
	k := rsaKey("rsa-1", testRSAKeyA())
	jwks := newVerifier(t, JWTConfig{JWKSURL: newTestIdP(t, k).url()})
	static := newVerifier(t, JWTConfig{PublicKeyPEM: k.pem(t)})
	signWith := func(header map[string]any) string {
		tok := jwt.NewWithClaims(k.method, claims(nil))
		tok.Header["kid"] = k.kid
		for name, v := range header {
			tok.Header[name] = v
		}
		raw, err := tok.SignedString(k.priv)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	tests := []struct {
		name   string
		header map[string]any
		want   string // "" is accepted
	}{
		{"no crit", nil, ""},
		{"an extension this verifier does not implement", map[string]any{"crit": []string{"b64"}, "b64": false},
			`"crit" names "b64", an extension this server does not implement`},
		{"a private extension", map[string]any{"crit": []string{"https://idp.example/bind"}, "https://idp.example/bind": "x"},
			`"crit" names "https://idp.example/bind", an extension this server does not implement`},
		{"the first of several extensions", map[string]any{"crit": []string{"exp2", "b64"}, "exp2": 1, "b64": false},
			`"crit" names "exp2", an extension this server does not implement`},
		{"empty", map[string]any{"crit": []string{}}, `"crit" is empty`},
		{"a string, not an array", map[string]any{"crit": "b64", "b64": false}, `"crit" is not an array of header parameter names`},
		{"an array of numbers", map[string]any{"crit": []any{1}}, `"crit" is not an array of header parameter names`},
		{"null", map[string]any{"crit": nil}, `"crit" is not an array of header parameter names`},
		{"an object", map[string]any{"crit": map[string]any{"b64": true}, "b64": false}, `"crit" is not an array of header parameter names`},
		{"a parameter the header lacks", map[string]any{"crit": []string{"ext"}}, `"crit" names "ext", which the header does not carry`},
		{"a parameter of JWS itself", map[string]any{"crit": []string{"alg"}}, `"crit" names "alg", which JWS defines itself`},
		{"the same name twice", map[string]any{"crit": []string{"ext", "ext"}, "ext": 1}, `"crit" names "ext" twice`},
	}
	for name, v := range map[string]*JWTVerifier{"jwks": jwks, "pem": static} {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				raw := signWith(tt.header)
				p, err := v.Verify(testCtx(t), raw)
				if tt.want == "" {
					if err != nil || p.TokenID != "jwt:user-1" {
						t.Fatalf("Verify: %+v %v", p, err)
					}
					return
				}
				mustRefuse(t, err, raw, tt.want)
				if !strings.Contains(err.Error(), "RFC 7515") {
					t.Errorf("error %q does not name the rule", err)
				}
			})
		}
	}
}
