package edge

import (
	"encoding/binary"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// nonceN is the n-th test nonce: its first byte (which picks the shard)
// cycles through the shards, the rest tells it apart.
func nonceN(n int) [16]byte {
	var b [16]byte
	b[0] = byte(n % replayShards)
	binary.BigEndian.PutUint64(b[8:], uint64(n))
	return b
}

// A node whose replay check is full refuses new hops 503 with
// Retry-After, and still refuses every hop it took when replayed: it
// never makes room by forgetting a nonce whose hop is not stale. Once the
// window passes, hops are taken again.
func TestHopReplayCacheIsBounded(t *testing.T) {
	k := testHopKey(t)
	k.replay = newReplayCheck(replayShards * 4)
	now := time.Now()
	var taken []*http.Request
	for i, full := 0, false; !full; i++ {
		if i > 100*replayShards {
			t.Fatalf("%d hops taken by a check bounded to %d nonces", len(taken), replayShards*4)
		}
		r := signedHop(t, k, http.MethodGet, "", now)
		switch _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now); {
		case v.Allowed():
			taken = append(taken, r)
		case v.Status == http.StatusServiceUnavailable && v.Reason == "hop_busy" && v.RetryAfter > 0:
			full = true
		default:
			t.Fatalf("hop %d: %d %q", i, v.Status, v.Reason)
		}
	}
	if len(taken) > replayShards*4 {
		t.Fatalf("%d hops taken by a check bounded to %d nonces", len(taken), replayShards*4)
	}
	for i, r := range taken {
		if _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now); v.Reason != "hop_replayed" {
			t.Fatalf("hop %d replayed into a full check: %d %q, want hop_replayed", i, v.Status, v.Reason)
		}
	}
	// Once the window passes, hops are taken again.
	later := now.Add(HopFreshness + time.Second)
	k.replay.expire(later, false)
	again := signedHop(t, k, http.MethodGet, "", later)
	if _, v := k.Verify(again, again.URL.RequestURI(), nil, "b", hopRoute, later); !v.Allowed() {
		t.Fatalf("a hop after the window: %+v", v)
	}
}

// Nonces are forgotten once their hops are stale, and the memory they
// took is given back: after 200,000 hops in one second and the window
// past, the check holds nothing, and the heap is back where it started.
func TestHopReplayExpiryFreesMemory(t *testing.T) {
	c := newReplayCheck(MaxHopNonces)
	start := time.Now()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	const n = 200_000
	for i := range n {
		now := start.Add(time.Duration(i) * time.Second / n)
		if v := c.check("a", nonceN(i), now.UnixMilli(), now); !v.Allowed() {
			t.Fatalf("nonce %d: %+v", i, v)
		}
	}
	if c.size() != n {
		t.Fatalf("%d nonces held, want %d", c.size(), n)
	}
	full := heap()
	// Half a second's hops stale: the check shrinks to what is left.
	mid := start.Add(HopFreshness + time.Second/2)
	left := c.expire(mid, false)
	if left < n/2-n/100 || left > n/2+n/100 {
		t.Fatalf("%d nonces held after half of them expired, want about %d", left, n/2)
	}
	// All of them stale.
	if left := c.expire(start.Add(HopFreshness+2*time.Second), false); left != 0 {
		t.Fatalf("%d nonces held after the window, want 0", left)
	}
	after := heap()
	t.Logf("heap: %d bytes before, %d with %d nonces (%d a nonce), %d after they expired", before, full, n, (full-before)/n, after)
	if full < before+n*32 {
		t.Fatalf("the heap grew by %d bytes for %d nonces: the measure does not see them", full-before, n)
	}
	if after > before+(full-before)/20 {
		t.Fatalf("the heap holds %d bytes more than before once every nonce expired (%d with them): memory not given back", after-before, full-before)
	}
	for i := range c.shards {
		if sh := &c.shards[i]; sh.seen != nil || sh.ring != nil {
			t.Fatalf("shard %d keeps its set or ring once empty", i)
		}
	}
}

// At the bound, a nonce takes at most HopNonceBytes: MaxHopNonces of
// them fit in the memory the README states.
func TestHopReplayMemoryPerNonce(t *testing.T) {
	if testing.Short() {
		t.Skip("fills the replay check to its bound")
	}
	c := newReplayCheck(MaxHopNonces)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	now := time.Now()
	before := heap()
	for i := range MaxHopNonces {
		if v := c.check("a", nonceN(i), now.UnixMilli(), now); !v.Allowed() {
			t.Fatalf("nonce %d of %d: %+v", i, MaxHopNonces, v)
		}
	}
	if v := c.check("a", nonceN(MaxHopNonces), now.UnixMilli(), now); v.Reason != "hop_busy" {
		t.Fatalf("a nonce over the bound: %+v, want hop_busy", v)
	}
	per := (heap() - before) / MaxHopNonces
	t.Logf("%d nonces: %d bytes a nonce, %d MiB", MaxHopNonces, per, per*MaxHopNonces>>20)
	if per > HopNonceBytes {
		t.Fatalf("a nonce takes %d bytes at the bound, over the %d stated", per, HopNonceBytes)
	}
	runtime.KeepAlive(c)
}

// A nonce forgotten by one check (its hop stale on that check's clock) is
// refused as stale by a check whose clock was read a moment earlier,
// never taken as new.
func TestHopReplayForgottenNonceIsStale(t *testing.T) {
	c := newReplayCheck(MaxHopNonces)
	at := time.Now()
	if v := c.check("a", nonceN(1), at.UnixMilli(), at); !v.Allowed() {
		t.Fatal(v)
	}
	// Another hop, on the same shard, checked once the first is stale.
	late := at.Add(HopFreshness + time.Second)
	if v := c.check("a", nonceN(1+replayShards), late.UnixMilli(), late); !v.Allowed() {
		t.Fatal(v)
	}
	if v := c.check("a", nonceN(1), at.UnixMilli(), at.Add(HopFreshness)); v.Reason != "hop_stale" {
		t.Fatalf("the forgotten nonce again, on a clock read before it was forgotten: %+v, want hop_stale", v)
	}
	// Another sender's hop with the same nonce is another hop.
	if v := c.check("b", nonceN(1+replayShards), late.UnixMilli(), late); !v.Allowed() {
		t.Fatalf("the same nonce from another node: %+v", v)
	}
}

// Eight goroutines check the same 20,000 hops, each in its own order:
// every hop is taken exactly once (run under -race).
func TestHopReplayConcurrent(t *testing.T) {
	c := newReplayCheck(MaxHopNonces)
	const n, workers = 20_000, 8
	now := time.Now()
	var taken [n]atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for j := range n {
				i := (j*7919 + w*2503) % n // 7919 is prime to n: each goroutine visits every hop
				if v := c.check("a", nonceN(i), now.UnixMilli(), now); v.Allowed() {
					taken[i].Add(1)
				} else if v.Reason != "hop_replayed" {
					t.Errorf("hop %d: %+v", i, v)
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range taken {
		if got := taken[i].Load(); got != 1 {
			t.Fatalf("hop %d taken %d times by %d goroutines, want once", i, got, workers)
		}
	}
}

// A node that stops taking hops forgets their nonces all the same: the
// sweep leaves alone the shards hops reached since the last sweep, and
// empties them at the next one.
func TestHopReplaySweepForgetsIdleShards(t *testing.T) {
	c := newReplayCheck(MaxHopNonces)
	past := time.Now().Add(-3 * HopFreshness) // stale by the sweep's clock
	for i := range 1000 {
		if v := c.check("a", nonceN(i), past.UnixMilli(), past); !v.Allowed() {
			t.Fatal(v)
		}
	}
	c.sweep()
	if got := c.size(); got != 1000 {
		t.Fatalf("%d nonces after the first sweep, want the 1000 that shards checked since the last one hold", got)
	}
	c.sweep()
	if got := c.size(); got != 0 {
		t.Fatalf("%d nonces after a sweep of idle shards, want 0", got)
	}
	for i := range c.shards {
		if sh := &c.shards[i]; sh.seen != nil || sh.ring != nil {
			t.Fatalf("shard %d keeps its set or ring once empty", i)
		}
	}
}
