package edge

import (
	"hash/maphash"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The hop's replay check: the nonces of the hops a node took, each kept
// until its hop is stale anyway (its time plus [HopFreshness]) and no
// longer.
//
// The nonces are spread over replayShards shards by their first byte (128
// random bits from the sender), each with its own lock, so that no one
// mutex serializes every hop an owner takes. A shard holds a set of its
// nonces and a ring of them in the order they came, with when each may be
// forgotten. Senders stamp hops with clocks that agree to within the
// window, so that order is nearly the order of expiry: a check forgets,
// from the ring's head, the nonces whose hops are stale, which costs O(1)
// amortized per hop; a nonce behind one that expires later waits for it,
// at most 2×HopFreshness after it came. A timer forgets them in the shards
// no hop reaches any more, and the set and the ring are rebuilt smaller once they hold a
// quarter of their peak, since a Go map never shrinks: memory follows the
// rate of the last window, not the highest ever.
//
// The bound is memory, not a count per window: at most [MaxHopNonces]
// nonces, [HopNonceBytes] each at most, so at most MaxHopNonces ×
// HopNonceBytes (64 MiB). A node holds rate × lifetime nonces: about
// 52,000 hops a second at the usual lifetime of HopFreshness (sender and
// owner clocks in step), 26,000 at the worst of 2×HopFreshness. A hop
// that finds its shard full is refused 503 with Retry-After: never taken
// without its nonce kept, so never a replay taken.
//
// A shard also keeps the latest clock reading that made it forget: a hop
// whose nonce would expire before it is refused as stale, so that a check
// running on a clock read a moment earlier than another's cannot take a
// hop whose nonce the other just forgot.

// Bounds of the replay check.
const (
	// MaxHopNonces is the most nonces a node remembers at once (over all
	// its shards, replayShards × MaxHopNonces/replayShards).
	MaxHopNonces = 1 << 19
	// HopNonceBytes bounds the memory one remembered nonce takes: its
	// set entry and its ring slot, with the slack of their growth
	// (measured by TestHopReplayMemoryPerNonce).
	HopNonceBytes = 128

	replayShards = 64
	// replayMinRing is the smallest ring a shard keeps once it holds
	// nonces; below it, shrinking saves nothing worth the copy.
	replayMinRing = 64
)

// replayKey is a remembered nonce: the sender's node (hashed; a clash
// only refuses a hop, never takes one) and its 128 random bits.
type replayKey struct {
	from  uint64
	nonce [16]byte
}

// replayEntry is a nonce in a shard's ring, with the Unix millisecond
// after which its hop is stale.
type replayEntry struct {
	key     replayKey
	expires int64
}

type replayShard struct {
	mu   sync.Mutex
	seen map[replayKey]struct{}
	ring []replayEntry // a ring buffer: n entries from head
	head int
	n    int
	peak int // the most entries since seen was last made
	// horizon is the latest Unix millisecond this shard forgot nonces
	// at: every nonce that expires at or after it is still in seen.
	horizon int64
	// checked says a hop reached the shard since the last sweep, which
	// leaves the shard to the hops' own clock readings then.
	checked bool
	_       [64]byte // keeps neighbouring shards' locks off one cache line
}

// replayCheck remembers nonces for [HopKey.Verify].
type replayCheck struct {
	seed     maphash.Seed
	perShard int // the bound, per shard
	shards   [replayShards]replayShard
	swept    atomic.Bool // a sweep is scheduled
}

func newReplayCheck(limit int) *replayCheck {
	return &replayCheck{seed: maphash.MakeSeed(), perShard: max(1, limit/replayShards)}
}

// check records the nonce of a hop from node from, dated at (Unix
// milliseconds), as received at now, and refuses one already recorded,
// one whose shard counts it stale, and one that finds its shard full.
func (c *replayCheck) check(from string, nonce [16]byte, at int64, now time.Time) Verdict {
	key := replayKey{from: maphash.String(c.seed, from), nonce: nonce}
	expires := at + HopFreshness.Milliseconds()
	sh := &c.shards[int(nonce[0])%replayShards]
	sh.mu.Lock()
	sh.checked = true
	sh.forget(now.UnixMilli())
	switch _, seen := sh.seen[key]; {
	case seen:
		sh.mu.Unlock()
		return hopRefused("hop_replayed", "this forwarded request was received before: a replay")
	case expires < sh.horizon:
		sh.mu.Unlock()
		return hopRefused("hop_stale", "the forwarded request is older than this node's replay check remembers: a replay, or clocks that differ (run NTP on every replica)")
	case sh.n >= c.perShard:
		sh.mu.Unlock()
		v := Refuse(http.StatusServiceUnavailable, "hop_busy", "this node holds as many recent forwarded requests as its memory bound for the replay check allows; retry in a second")
		v.RetryAfter = time.Second
		return v
	}
	sh.add(key, expires)
	sh.mu.Unlock()
	// Loaded first: a compare-and-swap on every hop would make the flag
	// the one line every hop contends for.
	if !c.swept.Load() && c.swept.CompareAndSwap(false, true) {
		time.AfterFunc(HopFreshness, c.sweep)
	}
	return Verdict{}
}

// sweep forgets the stale nonces of the shards no hop reached since the
// last sweep, for a node that takes no more hops, and comes again while
// any remain.
func (c *replayCheck) sweep() {
	if c.expire(time.Now(), true) > 0 {
		time.AfterFunc(HopFreshness, c.sweep)
		return
	}
	c.swept.Store(false)
	// A nonce recorded between the count and the store found a sweep
	// scheduled and scheduled none: look again.
	if c.size() > 0 && c.swept.CompareAndSwap(false, true) {
		time.AfterFunc(HopFreshness, c.sweep)
	}
}

// expire forgets the nonces stale at now in every shard (when idle, only
// in those no hop reached since the last call), and returns how many
// remain.
func (c *replayCheck) expire(now time.Time, idle bool) int {
	left := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		if !idle || !sh.checked {
			sh.forget(now.UnixMilli())
		}
		sh.checked = false
		left += sh.n
		sh.mu.Unlock()
	}
	return left
}

// size is how many nonces are remembered.
func (c *replayCheck) size() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// forget drops, from the ring's head, the nonces that expired before now
// (Unix milliseconds), and gives memory back once the shard holds far
// fewer than it did. The caller holds sh.mu.
func (sh *replayShard) forget(now int64) {
	if now > sh.horizon {
		sh.horizon = now
	}
	for sh.n > 0 {
		e := &sh.ring[sh.head]
		if e.expires >= now {
			break
		}
		delete(sh.seen, e.key)
		*e = replayEntry{}
		sh.head = (sh.head + 1) % len(sh.ring)
		sh.n--
	}
	switch {
	case sh.n == 0:
		sh.seen, sh.ring, sh.head, sh.peak = nil, nil, 0, 0
	case sh.n < sh.peak/4 && len(sh.ring) > replayMinRing:
		// A rebuild copies n entries after at least 3n were forgotten
		// since the last one: O(1) amortized per nonce.
		sh.resize(max(replayMinRing, 2*sh.n))
		sh.seen = make(map[replayKey]struct{}, sh.n)
		for i := range sh.n {
			sh.seen[sh.ring[i].key] = struct{}{}
		}
		sh.peak = sh.n
	}
}

// add records key, which expires at expires. The caller holds sh.mu.
func (sh *replayShard) add(key replayKey, expires int64) {
	if sh.seen == nil {
		sh.seen = map[replayKey]struct{}{}
	}
	if sh.n == len(sh.ring) {
		sh.resize(max(replayMinRing, 2*len(sh.ring)))
	}
	sh.ring[(sh.head+sh.n)%len(sh.ring)] = replayEntry{key: key, expires: expires}
	sh.n++
	sh.seen[key] = struct{}{}
	if sh.n > sh.peak {
		sh.peak = sh.n
	}
}

// resize moves the ring's entries, in order, to a ring of size slots.
func (sh *replayShard) resize(size int) {
	ring := make([]replayEntry, size)
	for i := range sh.n {
		ring[i] = sh.ring[(sh.head+i)%len(sh.ring)]
	}
	sh.ring, sh.head = ring, 0
}
