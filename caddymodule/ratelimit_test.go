package caddymodule

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Failed attempts are charged to the client's address, and an IPv6 client
// holds a whole prefix: every address of one /64 draws on one bucket, so
// that cycling through them buys no extra guesses, while another /64 has
// its own.
func TestFailedAttemptsAreChargedPerIPv6Prefix(t *testing.T) {
	for _, tt := range []struct {
		name       string
		rateLimit  *RateLimit
		sameBucket []string // after two guesses from the first, the rest get 429
		ownBucket  string   // gets 401
	}{
		{"default /64", nil,
			[]string{"2001:db8:1:2::a", "2001:db8:1:2::b", "2001:db8:1:2:8000::1"}, "2001:db8:1:3::a"},
		{"ipv6_prefix 48", &RateLimit{IPv6Prefix: 48},
			[]string{"2001:db8:1:2::a", "2001:db8:1:ffff::b"}, "2001:db8:2::a"},
		{"ipv6_prefix 128", &RateLimit{IPv6Prefix: 128},
			[]string{"2001:db8:1:2::a", "2001:db8:1:2::a"}, "2001:db8:1:2::b"},
		{"IPv4-mapped is the IPv4 client", nil,
			[]string{"192.0.2.7", "::ffff:192.0.2.7"}, "192.0.2.8"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prefix, err := tt.rateLimit.ipv6Prefix()
			if err != nil {
				t.Fatal(err)
			}
			h := &Handler{ipLimit: policy.NewLimiter(policy.Limit{Rate: 1.0 / 60, Burst: 2}), ipv6Prefix: prefix, logger: zap.NewNop()}
			now := time.Unix(1000, 0)
			guess := func(ip string) int {
				r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
				_, v := h.authenticate(r, ip, now)
				return v.Status
			}
			first := tt.sameBucket[0]
			for i := range 2 {
				if got := guess(first); got != http.StatusUnauthorized {
					t.Fatalf("guess %d from %s: %d, want 401", i, first, got)
				}
			}
			for _, ip := range tt.sameBucket[1:] {
				if got := guess(ip); got != http.StatusTooManyRequests {
					t.Errorf("%s after two guesses from %s: %d, want 429 (one bucket)", ip, first, got)
				}
			}
			if got := guess(tt.ownBucket); got != http.StatusUnauthorized {
				t.Errorf("%s: %d, want 401 (its own bucket)", tt.ownBucket, got)
			}
		})
	}
}

func TestRateLimitIPv6PrefixConfig(t *testing.T) {
	for _, bad := range []int{-1, 129} {
		_, err := (&RateLimit{IPv6Prefix: bad}).ipv6Prefix()
		if err == nil || !strings.Contains(err.Error(), "rate_limit ipv6_prefix") || !strings.Contains(err.Error(), "from 1 to 128") {
			t.Errorf("ipv6_prefix %d: %v, want an error naming the option and the range", bad, err)
		}
	}
	for rl, want := range map[*RateLimit]int{nil: 64, {}: 64, {IPv6Prefix: 56}: 56} {
		if got, err := rl.ipv6Prefix(); err != nil || got != want {
			t.Errorf("%+v: %d %v, want %d", rl, got, err, want)
		}
	}
}

// jwtIssuer signs ES256 access tokens for a verifier that trusts its key.
type jwtIssuer struct {
	key *ecdsa.PrivateKey
	pem []byte
}

func newJWTIssuer(t *testing.T) jwtIssuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return jwtIssuer{key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})}
}

const testIssuer, testAudience = "https://idp.example.test/", "https://mcp.example.test/mcp"

func (i jwtIssuer) token(t *testing.T, sub string) string {
	t.Helper()
	now := time.Now()
	s, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{
		"iss": testIssuer, "aud": testAudience, "sub": sub, "scope": "mcp",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}).SignedString(i.key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A valid credential is never refused for its address. Failed ones from
// one address (a loopback agent guessing, every client behind one NAT)
// empty its bucket and then get 429 rate_limited_ip with Retry-After;
// every client on that address with a valid opaque token or JWT is still
// served, and failed guesses stay limited.
func TestValidCredentialIsNeverRefusedForItsAddress(t *testing.T) {
	ctx := context.Background()
	tokens, err := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	secret, _, err := tokens.Create(ctx, policy.TokenSpec{Name: "orchestrator", Scopes: []string{"mcp"}})
	if err != nil {
		t.Fatal(err)
	}
	idp, forger := newJWTIssuer(t), newJWTIssuer(t)
	v, err := policy.NewJWTVerifier(ctx, policy.JWTConfig{Issuer: testIssuer, Audiences: []string{testAudience}, PublicKeyPEM: idp.pem}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	const burst = 3
	h := &Handler{ipLimit: policy.NewLimiter(policy.Limit{Rate: 1.0 / 3600, Burst: burst}), ipv6Prefix: policy.DefaultIPv6Prefix,
		authn: policy.Authenticator{Tokens: tokens, JWT: v}, logger: zap.NewNop()}
	now := time.Unix(1000, 0)
	call := func(ip, authz string) (int, string, time.Duration) {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		if authz != "" {
			r.Header.Set("Authorization", authz)
		}
		_, v := h.authenticate(r, ip, now)
		return v.Status, v.Reason, v.RetryAfter
	}
	for _, attacker := range []struct{ name, ip, authz string }{
		{"no credential", "127.0.0.1", ""},
		{"a wrong opaque token", "127.0.0.2", "Bearer " + policy.NewTokenSecret()},
		{"a JWT signed by another key", "::1", "Bearer " + forger.token(t, "alice")},
	} {
		t.Run(attacker.name, func(t *testing.T) {
			ip := attacker.ip
			refused := 0
			for i := range 2 * burst {
				status, reason, retry := call(ip, attacker.authz)
				if status == http.StatusTooManyRequests {
					if reason != "rate_limited_ip" || retry <= 0 {
						t.Fatalf("guess %d: 429 %q Retry-After %v, want rate_limited_ip with a delay", i, reason, retry)
					}
					refused = i
					break
				}
				if status != http.StatusUnauthorized {
					t.Fatalf("guess %d: %d %q, want 401 until the bucket is empty", i, status, reason)
				}
			}
			if refused != burst {
				t.Fatalf("the first 429 came after %d failed guesses, want %d (the burst)", refused, burst)
			}
			for i, authz := range []string{"Bearer " + secret, "Bearer " + idp.token(t, "alice"), "Bearer " + secret, "Bearer " + idp.token(t, "bob")} {
				if status, reason, _ := call(ip, authz); status != 0 {
					t.Errorf("valid credential %d from the guessing address: %d %q, want it served", i, status, reason)
				}
			}
			if status, reason, _ := call(ip, attacker.authz); status != http.StatusTooManyRequests || reason != "rate_limited_ip" {
				t.Errorf("a failed guess after the valid calls: %d %q, want 429 rate_limited_ip: the limit on guesses stays", status, reason)
			}
		})
	}
}
