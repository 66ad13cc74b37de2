package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
