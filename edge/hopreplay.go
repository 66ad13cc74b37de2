package edge

import (
	"net/http"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/replay"
)

// The hop's replay check: the nonces of the hops a node took, each kept
// until its hop is stale anyway (its time plus [HopFreshness]) and no
// longer, in the module's one replay check (internal/replay: sharded, each
// shard an expiry-ordered ring and a set, bounded by memory).
//
// The bound is memory, not a count per window: at most [MaxHopNonces]
// nonces, [HopNonceBytes] each at most, so at most MaxHopNonces ×
// HopNonceBytes (64 MiB). A node holds rate × lifetime nonces: about
// 52,000 hops a second at the usual lifetime of HopFreshness (sender and
// owner clocks in step), 26,000 at the worst of 2×HopFreshness. A hop
// that finds its shard full is refused 503 with Retry-After: never taken
// without its nonce kept, so never a replay taken.

// Bounds of the replay check.
const (
	// MaxHopNonces is the most nonces a node remembers at once (over all
	// the check's shards).
	MaxHopNonces = 1 << 19
	// HopNonceBytes bounds the memory one remembered nonce takes: its
	// set entry and its ring slot, with the slack of their growth.
	HopNonceBytes = replay.IDBytes
)

// checkNonce records the nonce of a hop from node from, dated at (Unix
// milliseconds), as received at now, and refuses one already recorded,
// one the check counts stale, and one that finds the check full.
func (k *HopKey) checkNonce(from string, nonce [16]byte, at int64, now time.Time) Verdict {
	switch k.replay.Take(from, nonce, at, now) {
	case replay.Replayed:
		return hopRefused("hop_replayed", "this forwarded request was received before: a replay")
	case replay.Stale:
		return hopRefused("hop_stale", "the forwarded request is older than this node's replay check remembers: a replay, or clocks that differ (run NTP on every replica)")
	case replay.Full:
		v := Refuse(http.StatusServiceUnavailable, "hop_busy", "this node holds as many recent forwarded requests as its memory bound for the replay check allows; retry in a second")
		v.RetryAfter = time.Second
		return v
	}
	return Verdict{}
}
