package caddymodule

import (
	"strings"
	"testing"
)

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
