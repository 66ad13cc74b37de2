package edge

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Failed attempts are charged to the client's address, and an IPv6 client
// holds a whole prefix: every address of one /64 draws on one bucket, so
// that cycling through them buys no extra guesses, while another /64 has
// its own.
func TestFailedAttemptsAreChargedPerIPv6Prefix(t *testing.T) {
	for _, tt := range []struct {
		name       string
		prefix     int
		sameBucket []string // after two guesses from the first, the rest get 429
		ownBucket  string   // gets 401
	}{
		{"default /64", policy.DefaultIPv6Prefix,
			[]string{"2001:db8:1:2::a", "2001:db8:1:2::b", "2001:db8:1:2:8000::1"}, "2001:db8:1:3::a"},
		{"ipv6_prefix 48", 48,
			[]string{"2001:db8:1:2::a", "2001:db8:1:ffff::b"}, "2001:db8:2::a"},
		{"ipv6_prefix 128", 128,
			[]string{"2001:db8:1:2::a", "2001:db8:1:2::a"}, "2001:db8:1:2::b"},
		{"IPv4-mapped is the IPv4 client", policy.DefaultIPv6Prefix,
			[]string{"192.0.2.7", "::ffff:192.0.2.7"}, "192.0.2.8"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := Authentication{Failures: policy.NewLimiter(policy.Limit{Rate: 1.0 / 60, Burst: 2}), IPv6Prefix: tt.prefix}
			now := time.Unix(1000, 0)
			guess := func(ip string) int {
				_, v, _ := a.Authenticate(context.Background(), "", ip, now)
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
	idp, v := newTestJWT(t)
	forger, _ := newTestJWT(t)
	const burst = 3
	a := Authentication{Failures: policy.NewLimiter(policy.Limit{Rate: 1.0 / 3600, Burst: burst}), IPv6Prefix: policy.DefaultIPv6Prefix,
		Authn: policy.Authenticator{Tokens: tokens, JWT: v}}
	now := time.Unix(1000, 0)
	call := func(ip, authz string) (int, string, time.Duration) {
		_, v, _ := a.Authenticate(ctx, authz, ip, now)
		return v.Status, v.Reason, v.RetryAfter
	}
	for _, attacker := range []struct{ name, ip, authz string }{
		{"no credential", "127.0.0.1", ""},
		{"a wrong opaque token", "127.0.0.2", "Bearer " + policy.NewTokenSecret()},
		{"a JWT signed by another key", "::1", "Bearer " + forger.token(t, "alice", "mcp")},
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
			for i, authz := range []string{"Bearer " + secret, "Bearer " + idp.token(t, "alice", "mcp"), "Bearer " + secret, "Bearer " + idp.token(t, "bob", "mcp")} {
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

// Each failed credential has its status and reason, and a message without
// the sentinel's prefix that says what to do: no credential 401 no_token,
// a bad one 401 invalid_token.
func TestAuthenticationVerdicts(t *testing.T) {
	ctx := context.Background()
	tokens, err := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	a := Authentication{Failures: policy.NewLimiter(policy.Limit{Rate: 1, Burst: 100}), IPv6Prefix: policy.DefaultIPv6Prefix,
		Authn: policy.Authenticator{Tokens: tokens}}
	for _, tc := range []struct {
		authz, reason, says string
	}{
		{"", ReasonNoToken, "this MCP endpoint needs a bearer token"},
		{"Basic dXNlcjpwYXNz", ReasonInvalidToken, "send the token as Authorization: Bearer <token>"},
		{"Bearer " + policy.NewTokenSecret(), ReasonInvalidToken, "the token is not valid here"},
	} {
		_, v, err := a.Authenticate(ctx, tc.authz, "192.0.2.1", time.Now())
		if v.Status != http.StatusUnauthorized || v.Reason != tc.reason || !strings.HasPrefix(v.Message, tc.says) || err == nil {
			t.Errorf("%q: %d %q %q (%v), want 401 %s saying %q first", tc.authz, v.Status, v.Reason, v.Message, err, tc.reason, tc.says)
		}
	}
}

// An identity provider whose keys cannot be fetched is not the client's
// fault: a JWT is answered 503 with a Retry-After, the address is not
// charged for it, and the detail (which names the key URL) is the caller's
// to log, never the client's to read.
func TestKeysUnavailableIsNotCharged(t *testing.T) {
	ctx := context.Background()
	idp := httptest.NewServer(http.NotFoundHandler())
	url := idp.URL + "/jwks.json"
	idp.Close()
	v, err := policy.NewJWTVerifier(ctx, policy.JWTConfig{Issuer: "https://idp.example/", Audiences: []string{"https://edge.example/mcp"},
		Algorithms: []string{"ES256"}, JWKSURL: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	signer, _ := newTestJWT(t)
	a := Authentication{Failures: policy.NewLimiter(policy.Limit{Rate: 1.0 / 3600, Burst: 1}), IPv6Prefix: policy.DefaultIPv6Prefix,
		Authn: policy.Authenticator{JWT: v}}
	now := time.Unix(1000, 0)
	for i := range 3 {
		_, verdict, err := a.Authenticate(ctx, "Bearer "+signer.token(t, "alice", "mcp"), "192.0.2.9", now)
		if verdict.Status != http.StatusServiceUnavailable || verdict.Reason != ReasonKeysUnavailable || verdict.RetryAfter <= 0 {
			t.Fatalf("attempt %d: %+v, want 503 %s with a Retry-After", i, verdict, ReasonKeysUnavailable)
		}
		if strings.Contains(verdict.Message, idp.URL) || err == nil || !strings.Contains(err.Error(), url) {
			t.Fatalf("attempt %d: message %q, detail %v: the URL belongs in the detail only", i, verdict.Message, err)
		}
	}
	if a.Failures.Empty(policy.AddressKey("192.0.2.9", policy.DefaultIPv6Prefix), now) {
		t.Error("refusals for the identity provider's keys emptied the client's bucket")
	}
}

// A hop that does not verify is charged to its address like a failed
// credential, and once the bucket is empty refused 429; other refusals
// are no guess and cost nothing.
func TestChargeRefusedHop(t *testing.T) {
	a := Authentication{Failures: policy.NewLimiter(policy.Limit{Rate: 1.0 / 3600, Burst: 2}), IPv6Prefix: policy.DefaultIPv6Prefix}
	now := time.Unix(1000, 0)
	bad := Refuse(http.StatusUnauthorized, "hop_signature", "bad MAC")
	notFound := Refuse(http.StatusNotFound, "session_unknown", "initialize again")
	for i := range 4 {
		if got := a.ChargeRefusedHop("192.0.2.5", now, notFound); got.Status != http.StatusNotFound || got.Reason != "session_unknown" {
			t.Fatalf("a 404 is no guess, %d: %+v", i, got)
		}
	}
	for i := range 2 {
		if got := a.ChargeRefusedHop("192.0.2.5", now, bad); got.Status != http.StatusUnauthorized || got.Reason != "hop_signature" {
			t.Fatalf("refused hop %d within the burst: %+v, want it as refused", i, got)
		}
	}
	forbidden := Refuse(http.StatusForbidden, "hop_unknown_node", "who?")
	if got := a.ChargeRefusedHop("192.0.2.5", now, forbidden); got.Status != http.StatusTooManyRequests || got.Reason != ReasonRateLimitedIP || got.RetryAfter <= 0 {
		t.Fatalf("a refused hop past the burst: %+v, want 429 %s with a Retry-After", got, ReasonRateLimitedIP)
	}
	if got := a.ChargeRefusedHop("192.0.2.6", now, bad); got.Status != http.StatusUnauthorized {
		t.Errorf("another address: %+v, want its own bucket", got)
	}
}
