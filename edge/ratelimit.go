package edge

import (
	"net/http"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// ReasonRateLimited refuses a principal whose bucket is empty.
const ReasonRateLimited = "rate_limited"

// RateLimit is step 5: a call of the principal tokenID draws on its bucket
// in l (local, or shared in a cluster), and once the bucket is empty it is
// refused 429 with a Retry-After that says when a call will be allowed.
func RateLimit(l *policy.Limiter, tokenID string, now time.Time) Verdict {
	ok, retry := l.Allow(tokenID, now)
	if ok {
		return Verdict{}
	}
	v := Refuse(http.StatusTooManyRequests, ReasonRateLimited, "rate limit for this token exceeded; retry after the Retry-After delay")
	v.RetryAfter = retry
	return v
}
