package dpop

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// resource is the configured resource URL the proofs are checked against.
var resource = mustURL("https://mcp.example.com/mcp")

const token = "zds_test-access-token"

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func ath(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return b64(sum[:])
}

// baseClaims are those of a proof that passes: POST to resource, now,
// with the token's ath and nonce.
func baseClaims(now time.Time, nonce string) map[string]any {
	c := map[string]any{"jti": rand.Text(), "htm": "POST", "htu": resource.String(), "iat": now.Unix(), "ath": ath(token)}
	if nonce != "" {
		c["nonce"] = nonce
	}
	return c
}

// sign makes a proof as a client does, with go-jose: typ dpop+jwt, the
// public key embedded.
func sign(t testing.TB, alg jose.SignatureAlgorithm, key any, claims map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, (&jose.SignerOptions{EmbedJWK: true}).WithType("dpop+jwt"))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// raw builds a compact JWS by hand, for headers no honest signer writes:
// header and claims as given, the signature from signer over the
// signing input.
func raw(t testing.TB, header, claims map[string]any, signer func([]byte) []byte) string {
	t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	c, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	in := b64(h) + "." + b64(c)
	return in + "." + b64(signer([]byte(in)))
}

// rawJSON builds a compact JWS from header and claims JSON byte for byte:
// for members twice, which no map holds.
func rawJSON(header, claims []byte, signer func([]byte) []byte) string {
	in := b64(header) + "." + b64(claims)
	return in + "." + b64(signer([]byte(in)))
}

// prepend puts member ("name":value) first in the JSON object obj.
func prepend(member string, obj []byte) []byte {
	return append([]byte("{"+member+","), obj[1:]...)
}

// appendMember puts member ("name":value) last in the JSON object obj.
func appendMember(obj []byte, member string) []byte {
	return append(obj[:len(obj)-1:len(obj)-1], ","+member+"}"...)
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func es256Signer(k *ecdsa.PrivateKey) func([]byte) []byte {
	return func(in []byte) []byte {
		h := sha256.Sum256(in)
		r, s, err := ecdsa.Sign(rand.Reader, k, h[:])
		if err != nil {
			panic(err)
		}
		out := make([]byte, 64)
		r.FillBytes(out[:32])
		s.FillBytes(out[32:])
		return out
	}
}

// jwkOf is key as a JWK object (public or private, as given).
func jwkOf(t testing.TB, key any) map[string]any {
	t.Helper()
	b, err := json.Marshal(jose.JSONWebKey{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func ecKey(t testing.TB, c elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fixture is a verifier as a server sets it up: nonces required, a local
// replay check, and a key to sign with.
type fixture struct {
	v      *Verifier
	nonces *Nonces
	key    *ecdsa.PrivateKey
	now    time.Time
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	nonces, err := NewNonces([]byte(strings.Repeat("k", 32)), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{
		v:      &Verifier{Nonces: nonces, Replay: NewLocal(1<<12, DefaultWindow)},
		nonces: nonces,
		key:    ecKey(t, elliptic.P256()),
		// The wall clock: Local's replay check forgets by it.
		now: time.Now(),
	}
}

func (f *fixture) req(proof string) Request {
	return Request{Proof: proof, Method: "POST", URL: resource, AccessToken: token, Now: f.now}
}

// Each row is what an attacker (or a careless client) sends, one thing
// changed from a proof that passes; each must be refused, with the kind
// that tells the client what to do.
func TestAttacks(t *testing.T) {
	f := newFixture(t)
	nonce := f.nonces.Issue(f.now)
	other := ecKey(t, elliptic.P256())
	hmacKey := []byte(strings.Repeat("s", 32))
	header := func(alg string, jwk map[string]any) map[string]any {
		return map[string]any{"alg": alg, "typ": "dpop+jwt", "jwk": jwk}
	}
	with := func(k string, v any) map[string]any {
		c := baseClaims(f.now, nonce)
		c[k] = v
		return c
	}
	without := func(k string) map[string]any {
		c := baseClaims(f.now, nonce)
		delete(c, k)
		return c
	}
	staleNonces, foreignNonces := f.nonces, mustNonces(t, strings.Repeat("x", 32))
	// Members twice: the first is what a reader that keeps the first
	// would take, the last (the honest one) what encoding/json and
	// go-jose take; so each proof passes on the last reading.
	goodHeader := mustJSON(t, header("ES256", jwkOf(t, &f.key.PublicKey)))
	goodClaims := func() []byte { return mustJSON(t, baseClaims(f.now, nonce)) }
	twice := func(header, claims []byte) string { return rawJSON(header, claims, es256Signer(f.key)) }
	otherJWK := mustJSON(t, jwkOf(t, &other.PublicKey))

	tests := []struct {
		name  string
		proof func() string
		req   func(*Request)
		want  error
	}{
		{"alg none", func() string {
			return raw(t, header("none", jwkOf(t, &f.key.PublicKey)), baseClaims(f.now, nonce), func([]byte) []byte { return nil })
		}, nil, ErrInvalidProof},
		{"alg HS256 with an oct jwk", func() string {
			return raw(t, header("HS256", map[string]any{"kty": "oct", "k": b64(hmacKey)}), baseClaims(f.now, nonce), func(in []byte) []byte {
				m := hmac.New(sha256.New, hmacKey)
				m.Write(in)
				return m.Sum(nil)
			})
		}, nil, ErrInvalidProof},
		{"alg ES256 with an oct jwk", func() string {
			return raw(t, header("ES256", map[string]any{"kty": "oct", "k": b64(hmacKey)}), baseClaims(f.now, nonce), es256Signer(f.key))
		}, nil, ErrInvalidProof},
		{"private jwk", func() string {
			return raw(t, header("ES256", jwkOf(t, f.key)), baseClaims(f.now, nonce), es256Signer(f.key))
		}, nil, ErrInvalidProof},
		{"typ missing", func() string {
			return raw(t, map[string]any{"alg": "ES256", "jwk": jwkOf(t, &f.key.PublicKey)}, baseClaims(f.now, nonce), es256Signer(f.key))
		}, nil, ErrInvalidProof},
		{"typ JWT", func() string {
			return raw(t, map[string]any{"alg": "ES256", "typ": "JWT", "jwk": jwkOf(t, &f.key.PublicKey)}, baseClaims(f.now, nonce), es256Signer(f.key))
		}, nil, ErrInvalidProof},
		{"jwk missing", func() string {
			return raw(t, map[string]any{"alg": "ES256", "typ": "dpop+jwt"}, baseClaims(f.now, nonce), es256Signer(f.key))
		}, nil, ErrInvalidProof},
		{"signed by a key other than the jwk header's", func() string {
			return raw(t, header("ES256", jwkOf(t, &f.key.PublicKey)), baseClaims(f.now, nonce), es256Signer(other))
		}, nil, ErrInvalidProof},
		{"htm GET for a POST", func() string { return sign(t, jose.ES256, f.key, with("htm", "GET")) }, nil, ErrInvalidProof},
		{"htm lower case", func() string { return sign(t, jose.ES256, f.key, with("htm", "post")) }, nil, ErrInvalidProof},
		{"htu another host", func() string { return sign(t, jose.ES256, f.key, with("htu", "https://evil.example.com/mcp")) }, nil, ErrInvalidProof},
		{"htu another path", func() string { return sign(t, jose.ES256, f.key, with("htu", "https://mcp.example.com/other")) }, nil, ErrInvalidProof},
		{"htu another scheme", func() string { return sign(t, jose.ES256, f.key, with("htu", "http://mcp.example.com/mcp")) }, nil, ErrInvalidProof},
		{"htu another port", func() string { return sign(t, jose.ES256, f.key, with("htu", "https://mcp.example.com:8443/mcp")) }, nil, ErrInvalidProof},
		{"htu with a query", func() string { return sign(t, jose.ES256, f.key, with("htu", "https://mcp.example.com/mcp?x=1")) }, nil, ErrInvalidProof},
		{"htu with a fragment", func() string { return sign(t, jose.ES256, f.key, with("htu", "https://mcp.example.com/mcp#x")) }, nil, ErrInvalidProof},
		{"htu path in another case", func() string { return sign(t, jose.ES256, f.key, with("htu", "https://mcp.example.com/MCP")) }, nil, ErrInvalidProof},
		{"htu with user info", func() string { return sign(t, jose.ES256, f.key, with("htu", "https://u@mcp.example.com/mcp")) }, nil, ErrInvalidProof},
		{"htu relative", func() string { return sign(t, jose.ES256, f.key, with("htu", "/mcp")) }, nil, ErrInvalidProof},
		{"htu missing", func() string { return sign(t, jose.ES256, f.key, without("htu")) }, nil, ErrInvalidProof},
		{"iat past the window", func() string { return sign(t, jose.ES256, f.key, with("iat", f.now.Add(-2*DefaultWindow).Unix())) }, nil, ErrInvalidProof},
		{"iat future past the window", func() string { return sign(t, jose.ES256, f.key, with("iat", f.now.Add(2*DefaultWindow).Unix())) }, nil, ErrInvalidProof},
		{"iat missing", func() string { return sign(t, jose.ES256, f.key, without("iat")) }, nil, ErrInvalidProof},
		{"iat a string", func() string { return sign(t, jose.ES256, f.key, with("iat", "now")) }, nil, ErrInvalidProof},
		{"jti missing", func() string { return sign(t, jose.ES256, f.key, without("jti")) }, nil, ErrInvalidProof},
		{"jti empty", func() string { return sign(t, jose.ES256, f.key, with("jti", "")) }, nil, ErrInvalidProof},
		{"jti oversize", func() string { return sign(t, jose.ES256, f.key, with("jti", strings.Repeat("j", MaxJTI+1))) }, nil, ErrInvalidProof},
		{"ath of another token", func() string { return sign(t, jose.ES256, f.key, with("ath", ath("another token"))) }, nil, ErrInvalidProof},
		{"ath missing with a token", func() string { return sign(t, jose.ES256, f.key, without("ath")) }, nil, ErrInvalidProof},
		{"nonce missing when required", func() string { return sign(t, jose.ES256, f.key, without("nonce")) }, nil, ErrUseNonce},
		{"nonce two periods old", func() string {
			return sign(t, jose.ES256, f.key, with("nonce", staleNonces.Issue(f.now.Add(-2*time.Minute))))
		}, nil, ErrUseNonce},
		{"nonce of another key", func() string { return sign(t, jose.ES256, f.key, with("nonce", foreignNonces.Issue(f.now))) }, nil, ErrUseNonce},
		{"nonce garbage", func() string { return sign(t, jose.ES256, f.key, with("nonce", "not-a-nonce")) }, nil, ErrUseNonce},
		{"two signatures (JSON serialization)", func() string {
			s, err := jose.NewMultiSigner([]jose.SigningKey{{Algorithm: jose.ES256, Key: f.key}, {Algorithm: jose.ES256, Key: other}},
				(&jose.SignerOptions{EmbedJWK: true}).WithType("dpop+jwt"))
			if err != nil {
				t.Fatal(err)
			}
			payload, _ := json.Marshal(baseClaims(f.now, nonce))
			jws, err := s.Sign(payload)
			if err != nil {
				t.Fatal(err)
			}
			return jws.FullSerialize()
		}, nil, ErrInvalidProof},
		{"JSON serialization of one signature", func() string {
			s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: f.key}, (&jose.SignerOptions{EmbedJWK: true}).WithType("dpop+jwt"))
			if err != nil {
				t.Fatal(err)
			}
			payload, _ := json.Marshal(baseClaims(f.now, nonce))
			jws, err := s.Sign(payload)
			if err != nil {
				t.Fatal(err)
			}
			return jws.FullSerialize()
		}, nil, ErrInvalidProof},
		{"oversize proof", func() string { return sign(t, jose.ES256, f.key, with("pad", strings.Repeat("p", DefaultMaxSize))) }, nil, ErrInvalidProof},
		{"empty", func() string { return "" }, nil, ErrInvalidProof},
		{"claims not JSON", func() string {
			h, _ := json.Marshal(header("ES256", jwkOf(t, &f.key.PublicKey)))
			in := b64(h) + "." + b64([]byte("not json"))
			return in + "." + b64(es256Signer(f.key)([]byte(in)))
		}, nil, ErrInvalidProof},
		{"two htu, another host first", func() string {
			return twice(goodHeader, prepend(`"htu":"https://evil.example.com/mcp"`, goodClaims()))
		}, nil, ErrInvalidProof},
		{"htu and HTU", func() string {
			return twice(goodHeader, prepend(`"HTU":"https://evil.example.com/mcp"`, goodClaims()))
		}, nil, ErrInvalidProof},
		{"two jti", func() string { return twice(goodHeader, prepend(`"jti":"another-jti"`, goodClaims())) }, nil, ErrInvalidProof},
		{"HTU alone, htu in upper case", func() string {
			return twice(goodHeader, bytes.Replace(goodClaims(), []byte(`"htu":`), []byte(`"HTU":`), 1))
		}, nil, ErrInvalidProof},
		{"two jwk, another key first", func() string {
			return twice(prepend(`"jwk":`+string(otherJWK), goodHeader), goodClaims())
		}, nil, ErrInvalidProof},
		{"two x in the jwk", func() string {
			jwk := prepend(`"x":"`+jwkOf(t, &other.PublicKey)["x"].(string)+`"`, mustJSON(t, jwkOf(t, &f.key.PublicKey)))
			return twice([]byte(`{"alg":"ES256","typ":"dpop+jwt","jwk":`+string(jwk)+`}`), goodClaims())
		}, nil, ErrInvalidProof},
		{"two typ, JWT first", func() string { return twice(prepend(`"typ":"JWT"`, goodHeader), goodClaims()) }, nil, ErrInvalidProof},
		// Case variants: go-jose matches header and jwk members exactly
		// and ignores these; encoding/json, which folds case, would take
		// the last for typ or x.
		{"typ and TYP", func() string { return twice(appendMember(goodHeader, `"TYP":"JWT"`), goodClaims()) }, nil, ErrInvalidProof},
		{"x and X in the jwk", func() string {
			jwk := appendMember(mustJSON(t, jwkOf(t, &f.key.PublicKey)), `"X":"`+jwkOf(t, &other.PublicKey)["x"].(string)+`"`)
			return twice([]byte(`{"alg":"ES256","typ":"dpop+jwt","jwk":`+string(jwk)+`}`), goodClaims())
		}, nil, ErrInvalidProof},
		{"short RSA key", func() string {
			k, err := rsa.GenerateKey(rand.Reader, 1024)
			if err != nil {
				t.Fatal(err)
			}
			return sign(t, jose.RS256, k, baseClaims(f.now, nonce))
		}, nil, ErrInvalidProof},
	}
	// why is the check that must refuse each row (a word of its
	// reason), so that a row refused by an earlier check for another
	// reason does not pass unnoticed.
	const (
		parse    = "does not parse as a JWS"
		htu      = "htu is not"
		iat      = "iat is more than"
		noJTI    = "no jti"
		badNonce = "stale or not this server's"
		format   = "not a JWS in compact serialization"
		claims   = "claims are not a JSON object"
		dupH     = "protected header is JSON that readers could read differently"
		dupC     = "claims are JSON that readers could read differently"
	)
	why := map[string]string{
		"alg none": parse, "alg HS256 with an oct jwk": parse, "alg ES256 with an oct jwk": parse, "private jwk": parse,
		"typ missing": "typ", "typ JWT": "typ", "jwk missing": "no jwk header",
		"signed by a key other than the jwk header's": "signature does not verify",
		"htm GET for a POST":                          "htm", "htm lower case": "htm",
		"htu another host": htu, "htu another path": htu, "htu another scheme": htu, "htu another port": htu,
		"htu with a query": htu, "htu with a fragment": htu, "htu path in another case": htu, "htu with user info": htu,
		"htu relative": htu, "htu missing": htu,
		"iat past the window": iat, "iat future past the window": iat, "iat missing": "no iat", "iat a string": claims,
		"jti missing": noJTI, "jti empty": noJTI, "jti oversize": "jti is over",
		"ath of another token": "ath is not", "ath missing with a token": "no ath",
		"nonce missing when required": "requires a nonce", "nonce two periods old": badNonce, "nonce of another key": badNonce,
		"nonce garbage":                       badNonce,
		"two signatures (JSON serialization)": format, "JSON serialization of one signature": format,
		"oversize proof": "over 8192 bytes", "empty": "no DPoP proof", "claims not JSON": claims,
		"short RSA key":               "shorter than 2048",
		"two htu, another host first": dupC, "htu and HTU": dupC, "two jti": dupC, "HTU alone, htu in upper case": "in lower case",
		"two jwk, another key first": dupH, "two x in the jwk": dupH, "two typ, JWT first": dupH,
		"typ and TYP": dupH, "x and X in the jwk": dupH,
	}
	for _, tt := range tests {
		if why[tt.name] == "" {
			t.Fatalf("row %q has no reason", tt.name)
		}
		t.Run(tt.name, func(t *testing.T) {
			proof := tt.proof()
			r := f.req(proof)
			if tt.req != nil {
				tt.req(&r)
			}
			_, err := f.v.Verify(context.Background(), r)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), why[tt.name]) {
				t.Fatalf("refused for another reason than %q: %v", why[tt.name], err)
			}
			if (why[tt.name] == dupH || why[tt.name] == dupC) && !strings.Contains(err.Error(), "send each key once") {
				t.Fatalf("a member twice is refused without saying what to fix: %v", err)
			}
			var e *Error
			if !errors.As(err, &e) || e.Reason == "" {
				t.Fatalf("error %v is not an *Error with a reason", err)
			}
			if len(proof) > 0 && strings.Contains(err.Error(), proof[:min(len(proof), 20)]) {
				t.Fatalf("the error echoes the proof: %v", err)
			}
		})
	}
	// The control: the base proof passes, so each refusal above is the
	// one change it made.
	if _, err := f.v.Verify(context.Background(), f.req(sign(t, jose.ES256, f.key, baseClaims(f.now, nonce)))); err != nil {
		t.Fatalf("the unchanged proof is refused: %v", err)
	}
}

func mustNonces(t testing.TB, key string) *Nonces {
	t.Helper()
	n, err := NewNonces([]byte(key), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A proof is taken once: presented again (the same jti by the same key)
// it is refused, while a refused proof does not use up its jti.
func TestReplayedProof(t *testing.T) {
	f := newFixture(t)
	nonce := f.nonces.Issue(f.now)
	c := baseClaims(f.now, nonce)
	proof := sign(t, jose.ES256, f.key, c)
	// Refused first for another reason: its jti stays free.
	bad := f.req(proof)
	bad.Method = "GET"
	if _, err := f.v.Verify(context.Background(), bad); !errors.Is(err, ErrInvalidProof) {
		t.Fatalf("GET with a POST proof: %v", err)
	}
	p, err := f.v.Verify(context.Background(), f.req(proof))
	if err != nil {
		t.Fatalf("first use: %v", err)
	}
	if p.JTI != c["jti"] {
		t.Fatalf("jti %q, want %q", p.JTI, c["jti"])
	}
	if _, err := f.v.Verify(context.Background(), f.req(proof)); !errors.Is(err, ErrInvalidProof) || !strings.Contains(err.Error(), "used already") {
		t.Fatalf("replayed proof: %v", err)
	}
	// The same jti, signed again (a new signature): still the same key
	// and jti, still a replay.
	if _, err := f.v.Verify(context.Background(), f.req(sign(t, jose.ES256, f.key, c))); !errors.Is(err, ErrInvalidProof) {
		t.Fatalf("re-signed proof with the same jti: %v", err)
	}
	// Another key may use the same jti: the key is jkt and jti together.
	if _, err := f.v.Verify(context.Background(), f.req(sign(t, jose.ES256, ecKey(t, elliptic.P256()), c))); err != nil {
		t.Fatalf("the same jti by another key: %v", err)
	}
}

// A full replay check refuses proofs as unavailable (the server's state,
// not the client's fault) rather than taking one it cannot remember.
func TestReplayFull(t *testing.T) {
	f := newFixture(t)
	f.v.Replay = NewLocal(1, DefaultWindow) // one id per shard
	nonce := f.nonces.Issue(f.now)
	var unavailable int
	for range 200 {
		_, err := f.v.Verify(context.Background(), f.req(sign(t, jose.ES256, f.key, baseClaims(f.now, nonce))))
		switch {
		case err == nil:
		case errors.Is(err, ErrUnavailable):
			unavailable++
		default:
			t.Fatalf("Verify: %v", err)
		}
	}
	if unavailable == 0 {
		t.Fatal("200 proofs into a check of 64 ids: none refused as unavailable")
	}
}

// Every algorithm offered is accepted with its own key type, and the
// proof names the RFC 7638 thumbprint of the key, as a token's cnf.jkt
// will.
func TestAlgorithms(t *testing.T) {
	f := newFixture(t)
	nonce := f.nonces.Issue(f.now)
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		alg jose.SignatureAlgorithm
		key any
		pub any
	}{
		{jose.ES256, f.key, &f.key.PublicKey},
		{jose.ES384, ecKey(t, elliptic.P384()), nil},
		{jose.EdDSA, edKey, edKey.Public()},
		{jose.RS256, rsaKey, &rsaKey.PublicKey},
		{jose.PS256, rsaKey, &rsaKey.PublicKey},
	} {
		t.Run(string(tt.alg), func(t *testing.T) {
			c := baseClaims(f.now, nonce)
			p, err := f.v.Verify(context.Background(), f.req(sign(t, tt.alg, tt.key, c)))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			pub := tt.pub
			if pub == nil {
				pub = &tt.key.(*ecdsa.PrivateKey).PublicKey
			}
			want, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
			if err != nil {
				t.Fatal(err)
			}
			if p.JKT != b64(want) || p.JTI != c["jti"] || p.IAT.Unix() != f.now.Unix() {
				t.Fatalf("proof %+v, want jkt %s jti %s iat %d", p, b64(want), c["jti"], f.now.Unix())
			}
		})
	}
}

// The htu rule of RFC 9449 §4.3: scheme and host compared without case,
// a default port the same as none, the resource's own query ignored.
func TestHTUNormalization(t *testing.T) {
	f := newFixture(t)
	f.v.Nonces = nil
	for _, tt := range []struct{ htu, resource string }{
		{"HTTPS://MCP.Example.COM/mcp", "https://mcp.example.com/mcp"},
		{"https://mcp.example.com:443/mcp", "https://mcp.example.com/mcp"},
		{"https://mcp.example.com/mcp", "https://mcp.example.com:443/mcp?session=1"},
		{"https://mcp.example.com", "https://mcp.example.com/"},
		{"http://127.0.0.1:8080/mcp", "http://127.0.0.1:8080/mcp"},
		{"https://[::1]/mcp", "https://[::1]:443/mcp"},
	} {
		c := baseClaims(f.now, "")
		c["htu"] = tt.htu
		r := f.req(sign(t, jose.ES256, f.key, c))
		r.URL = mustURL(tt.resource)
		if _, err := f.v.Verify(context.Background(), r); err != nil {
			t.Errorf("htu %s for %s: %v", tt.htu, tt.resource, err)
		}
	}
}

// At a token endpoint there is no access token: ath is not asked for.
// The package-level Verify checks with the defaults.
func TestWithoutToken(t *testing.T) {
	key := ecKey(t, elliptic.P256())
	now := time.Now()
	c := baseClaims(now, "")
	delete(c, "ath")
	p, err := Verify(sign(t, jose.ES256, key, c), "POST", resource, "", now)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if p.JTI != c["jti"] {
		t.Fatalf("jti %q", p.JTI)
	}
	// With a token, the same proof lacks ath.
	if _, err := Verify(sign(t, jose.ES256, key, c), "POST", resource, token, now); !errors.Is(err, ErrInvalidProof) {
		t.Fatalf("no ath with a token: %v", err)
	}
}

// A configured window is the one used both ways.
func TestWindow(t *testing.T) {
	key := ecKey(t, elliptic.P256())
	now := time.Now()
	v := &Verifier{Window: 5 * time.Minute}
	for _, d := range []time.Duration{-4 * time.Minute, 4 * time.Minute} {
		c := baseClaims(now, "")
		c["iat"] = now.Add(d).Unix()
		if _, err := v.Verify(context.Background(), Request{Proof: sign(t, jose.ES256, key, c), Method: "POST", URL: resource, AccessToken: token, Now: now}); err != nil {
			t.Errorf("iat %s from now in a 5 min window: %v", d, err)
		}
	}
	for _, d := range []time.Duration{-6 * time.Minute, 6 * time.Minute} {
		c := baseClaims(now, "")
		c["iat"] = now.Add(d).Unix()
		if _, err := v.Verify(context.Background(), Request{Proof: sign(t, jose.ES256, key, c), Method: "POST", URL: resource, AccessToken: token, Now: now}); !errors.Is(err, ErrInvalidProof) {
			t.Errorf("iat %s from now in a 5 min window: %v", d, err)
		}
	}
}
