// Package replay is the one replay check of the module: it remembers the
// 128-bit random ids of the requests a node took from its senders, each
// until its request is stale anyway (its time plus the check's window) and
// no longer, and says of each new one whether it is taken, replayed,
// stale or over the bound. The hop between replicas (edge) checks its
// nonces with it, and the cluster's node RPC its request ids.
//
// The ids are spread over [Shards] shards by their first byte (random
// bits from the sender), each with its own lock, so that no one mutex
// serializes every request a node takes. A shard holds a set of its ids
// and a ring of them in the order they came, with when each may be
// forgotten. Senders date requests with clocks that agree to within the
// window, so that order is nearly the order of expiry: a check forgets,
// from the ring's head, the ids whose requests are stale, which costs O(1)
// amortized per request; an id behind one that expires later waits for
// it, at most twice the window after it came. A timer forgets them in the
// shards no request reaches any more, and the set and the ring are
// rebuilt smaller once they hold a quarter of their peak, since a Go map
// never shrinks: memory follows the rate of the last window, not the
// highest ever.
//
// The bound is memory, not a count per window: at most the limit given to
// [New], [IDBytes] each at most. A node holds rate × lifetime ids (the
// lifetime is the window when sender and receiver clocks agree, twice it
// at worst). An id that finds its shard full is answered [Full]: never
// taken without being kept, so never a replay taken. (This is why the
// check is not a cache from a library: an LRU or TTL cache makes room by
// evicting an entry, and an id evicted before its request is stale is a
// replay let in.)
//
// A shard also keeps the latest expiry of the ids it forgot: an id that
// expires at or before it is answered [Stale], so that a check running on a
// clock read a moment earlier than another's cannot take a request whose id
// the other just forgot. It is the forgotten ids' own time, not the clock
// reading that forgot them: a clock that jumped ahead and was set right
// again would otherwise leave every new request stale until real time
// caught up with the jump.
package replay

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Answer is what a [Check] says of a request's id.
type Answer uint8

const (
	// Taken: the id is new, and now remembered; the request may be
	// carried out.
	Taken Answer = iota
	// Replayed: the id was taken before, within its window.
	Replayed
	// Stale: the request is older than what the check still remembers
	// (a replay, or clocks that differ by more than the window).
	Stale
	// Full: the id's shard holds as many ids as the bound allows. It is
	// not taken; the sender may try again once older ids expire (a second
	// or so).
	Full
)

func (a Answer) String() string {
	switch a {
	case Taken:
		return "taken"
	case Replayed:
		return "replayed"
	case Stale:
		return "stale"
	case Full:
		return "full"
	}
	return "unknown"
}

const (
	// IDBytes bounds the memory one remembered id takes: its set entry
	// and its ring slot, with the slack of their growth (measured by
	// TestMemoryPerID).
	IDBytes = 128
	// Shards is how many shards a check spreads its ids and its bound
	// over: a limit below it is one id a shard.
	Shards = 64

	// minRing is the smallest ring a shard keeps once it holds ids; below
	// it, shrinking saves nothing worth the copy.
	minRing = 64
)

// key is a remembered id: the sender (hashed; a clash only refuses a
// request, never takes one) and its 128 random bits.
type key struct {
	from uint64
	id   [16]byte
}

// entry is an id in a shard's ring, with the Unix millisecond after which
// its request is stale.
type entry struct {
	key     key
	expires int64
}

type shard struct {
	mu   sync.Mutex
	seen map[key]struct{}
	ring []entry // a ring buffer: n entries from head
	head int
	n    int
	peak int // the most entries since seen was last made
	// horizon is the latest expiry (Unix milliseconds) of the ids this
	// shard forgot: every id that expires after it is still in seen.
	horizon int64
	// checked says a request reached the shard since the last sweep,
	// which leaves the shard to the requests' own clock readings then.
	checked bool
	_       [64]byte // keeps neighbouring shards' locks off one cache line
}

// Check remembers request ids; its zero value is not usable (see [New]).
type Check struct {
	seed     maphash.Seed
	window   time.Duration
	perShard int // the bound, per shard
	shards   [Shards]shard
	swept    atomic.Bool // a sweep is scheduled
}

// New returns a check that keeps an id until its request's time plus
// window, and at most limit ids at once (over all its shards: Shards ×
// limit/Shards), which bounds its memory to limit × IDBytes.
func New(limit int, window time.Duration) *Check {
	return &Check{seed: maphash.MakeSeed(), window: window, perShard: max(1, limit/Shards)}
}

// Take records id, which sender from sent dated at (Unix milliseconds),
// as received at now, unless it was taken already, its shard counts it
// stale, or its shard is full. The caller has refused a request dated
// more than the window from now.
func (c *Check) Take(from string, id [16]byte, at int64, now time.Time) Answer {
	k := key{from: maphash.String(c.seed, from), id: id}
	expires := at + c.window.Milliseconds()
	sh := &c.shards[int(id[0])%Shards]
	sh.mu.Lock()
	sh.checked = true
	sh.forget(now.UnixMilli())
	switch _, seen := sh.seen[k]; {
	case seen:
		sh.mu.Unlock()
		return Replayed
	case expires <= sh.horizon:
		sh.mu.Unlock()
		return Stale
	case sh.n >= c.perShard:
		sh.mu.Unlock()
		return Full
	}
	sh.add(k, expires)
	sh.mu.Unlock()
	// Loaded first: a compare-and-swap on every request would make the
	// flag the one line every request contends for.
	if !c.swept.Load() && c.swept.CompareAndSwap(false, true) {
		time.AfterFunc(c.window, c.sweep)
	}
	return Taken
}

// Len is how many ids are remembered.
func (c *Check) Len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// sweep forgets the stale ids of the shards no request reached since the
// last sweep, for a node that takes no more requests, and comes again
// while any remain.
func (c *Check) sweep() {
	if c.expire(time.Now(), true) > 0 {
		time.AfterFunc(c.window, c.sweep)
		return
	}
	c.swept.Store(false)
	// An id recorded between the count and the store found a sweep
	// scheduled and scheduled none: look again.
	if c.Len() > 0 && c.swept.CompareAndSwap(false, true) {
		time.AfterFunc(c.window, c.sweep)
	}
}

// expire forgets the ids stale at now in every shard (when idle, only in
// those no request reached since the last call), and returns how many
// remain.
func (c *Check) expire(now time.Time, idle bool) int {
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

// forget drops, from the ring's head, the ids that expired before now
// (Unix milliseconds), and gives memory back once the shard holds far
// fewer than it did. The caller holds sh.mu.
func (sh *shard) forget(now int64) {
	for sh.n > 0 {
		e := &sh.ring[sh.head]
		if e.expires >= now {
			break
		}
		sh.horizon = max(sh.horizon, e.expires)
		delete(sh.seen, e.key)
		*e = entry{}
		sh.head = (sh.head + 1) % len(sh.ring)
		sh.n--
	}
	switch {
	case sh.n == 0:
		sh.seen, sh.ring, sh.head, sh.peak = nil, nil, 0, 0
	case sh.n < sh.peak/4 && len(sh.ring) > minRing:
		// A rebuild copies n entries after at least 3n were forgotten
		// since the last one: O(1) amortized per id.
		sh.resize(max(minRing, 2*sh.n))
		sh.seen = make(map[key]struct{}, sh.n)
		for i := range sh.n {
			sh.seen[sh.ring[i].key] = struct{}{}
		}
		sh.peak = sh.n
	}
}

// add records k, which expires at expires. The caller holds sh.mu.
func (sh *shard) add(k key, expires int64) {
	if sh.seen == nil {
		sh.seen = map[key]struct{}{}
	}
	if sh.n == len(sh.ring) {
		sh.resize(max(minRing, 2*len(sh.ring)))
	}
	sh.ring[(sh.head+sh.n)%len(sh.ring)] = entry{key: k, expires: expires}
	sh.n++
	sh.seen[k] = struct{}{}
	if sh.n > sh.peak {
		sh.peak = sh.n
	}
}

// resize moves the ring's entries, in order, to a ring of size slots.
func (sh *shard) resize(size int) {
	ring := make([]entry, size)
	for i := range sh.n {
		ring[i] = sh.ring[(sh.head+i)%len(sh.ring)]
	}
	sh.ring, sh.head = ring, 0
}
