package edge

import (
	"net/http"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Each principal has its own bucket: once it is empty, the principal's
// calls are refused 429 with a Retry-After, and another's are not.
func TestRateLimitPerPrincipal(t *testing.T) {
	l := policy.NewLimiter(policy.Limit{Rate: 1.0 / 60, Burst: 2})
	now := time.Unix(1000, 0)
	for i := range 2 {
		if v := RateLimit(l, "tok_a", now); !v.Allowed() {
			t.Fatalf("call %d within the burst: %+v", i, v)
		}
	}
	v := RateLimit(l, "tok_a", now)
	if v.Status != http.StatusTooManyRequests || v.Reason != ReasonRateLimited || v.RetryAfter <= 0 {
		t.Fatalf("past the burst: %+v, want 429 %s with a Retry-After", v, ReasonRateLimited)
	}
	if v := RateLimit(l, "tok_b", now); !v.Allowed() {
		t.Errorf("another principal: %+v", v)
	}
	if v := RateLimit(l, "tok_a", now.Add(time.Minute)); !v.Allowed() {
		t.Errorf("after the Retry-After delay: %+v", v)
	}
}
