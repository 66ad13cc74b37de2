package replay

import (
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// window is the hop's and the node RPC's: 10 s.
const window = 10 * time.Second

// limit is the bound the hop and the node RPC give.
const limit = 1 << 19

// idN is the n-th test id: its first byte (which picks the shard) cycles
// through the shards, the rest tells it apart.
func idN(n int) [16]byte {
	var b [16]byte
	b[0] = byte(n % Shards)
	binary.BigEndian.PutUint64(b[8:], uint64(n))
	return b
}

// A full check refuses new ids, and still answers every id it took as
// replayed: it never makes room by forgetting an id whose request is not
// stale. Once the window passes, ids are taken again.
func TestFullNeverForgetsAFreshID(t *testing.T) {
	c := New(Shards*4, window)
	now := time.Now()
	taken := 0
	for i := range Shards * 5 {
		switch a := c.Take("a", idN(i), now.UnixMilli(), now); {
		case i < Shards*4 && a != Taken:
			t.Fatalf("id %d of a check bounded to %d: %v", i, Shards*4, a)
		case i >= Shards*4 && a != Full:
			t.Fatalf("id %d over a check bounded to %d: %v, want full", i, Shards*4, a)
		case a == Taken:
			taken++
		}
	}
	for i := range taken {
		if a := c.Take("a", idN(i), now.UnixMilli(), now.Add(window)); a != Replayed {
			t.Fatalf("id %d again into a full check: %v, want replayed", i, a)
		}
	}
	later := now.Add(window + time.Second)
	if a := c.Take("a", idN(Shards*5), later.UnixMilli(), later); a != Taken {
		t.Fatalf("an id after the window: %v", a)
	}
}

// Ids are forgotten once their requests are stale, and the memory they
// took is given back: after 200,000 ids in one second and the window
// past, the check holds nothing, and the heap is back where it started.
func TestExpiryFreesMemory(t *testing.T) {
	c := New(limit, window)
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
		if a := c.Take("a", idN(i), now.UnixMilli(), now); a != Taken {
			t.Fatalf("id %d: %v", i, a)
		}
	}
	if c.Len() != n {
		t.Fatalf("%d ids held, want %d", c.Len(), n)
	}
	full := heap()
	// Half a second's requests stale: the check shrinks to what is left.
	mid := start.Add(window + time.Second/2)
	left := c.expire(mid, false)
	if left < n/2-n/100 || left > n/2+n/100 {
		t.Fatalf("%d ids held after half of them expired, want about %d", left, n/2)
	}
	// All of them stale.
	if left := c.expire(start.Add(window+2*time.Second), false); left != 0 {
		t.Fatalf("%d ids held after the window, want 0", left)
	}
	after := heap()
	t.Logf("heap: %d bytes before, %d with %d ids (%d an id), %d after they expired", before, full, n, (full-before)/n, after)
	if full < before+n*32 {
		t.Fatalf("the heap grew by %d bytes for %d ids: the measure does not see them", full-before, n)
	}
	if after > before+(full-before)/20 {
		t.Fatalf("the heap holds %d bytes more than before once every id expired (%d with them): memory not given back", after-before, full-before)
	}
	for i := range c.shards {
		if sh := &c.shards[i]; sh.seen != nil || sh.ring != nil {
			t.Fatalf("shard %d keeps its set or ring once empty", i)
		}
	}
}

// At the bound, an id takes at most IDBytes: the bound the hop and the
// node RPC give fits in the memory the README states.
func TestMemoryPerID(t *testing.T) {
	if testing.Short() {
		t.Skip("fills the check to its bound")
	}
	c := New(limit, window)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	now := time.Now()
	before := heap()
	for i := range limit {
		if a := c.Take("a", idN(i), now.UnixMilli(), now); a != Taken {
			t.Fatalf("id %d of %d: %v", i, limit, a)
		}
	}
	if a := c.Take("a", idN(limit), now.UnixMilli(), now); a != Full {
		t.Fatalf("an id over the bound: %v, want full", a)
	}
	per := (heap() - before) / limit
	t.Logf("%d ids: %d bytes an id, %d MiB", limit, per, per*limit>>20)
	if per > IDBytes {
		t.Fatalf("an id takes %d bytes at the bound, over the %d stated", per, IDBytes)
	}
	runtime.KeepAlive(c)
}

// An id forgotten by one check (its request stale on that check's clock)
// is answered stale by a check whose clock was read a moment earlier,
// never taken as new.
func TestForgottenIDIsStale(t *testing.T) {
	c := New(limit, window)
	at := time.Now()
	if a := c.Take("a", idN(1), at.UnixMilli(), at); a != Taken {
		t.Fatal(a)
	}
	// Another request, on the same shard, checked once the first is stale.
	late := at.Add(window + time.Second)
	if a := c.Take("a", idN(1+Shards), late.UnixMilli(), late); a != Taken {
		t.Fatal(a)
	}
	if a := c.Take("a", idN(1), at.UnixMilli(), at.Add(window)); a != Stale {
		t.Fatalf("the forgotten id again, on a clock read before it was forgotten: %v, want stale", a)
	}
	// Another sender's request with the same id is another request.
	if a := c.Take("b", idN(1+Shards), late.UnixMilli(), late); a != Taken {
		t.Fatalf("the same id from another sender: %v", a)
	}
}

// A node whose clock jumped an hour ahead (a VM resumed with a stale
// clock, say) and was then set right again must take new requests at once,
// not answer each one stale until real time has caught up with the jump:
// that would refuse every request for an hour. What it forgot while its
// clock was ahead is still never taken again.
func TestClockSetRightAfterAJumpTakesNewIDs(t *testing.T) {
	c := New(limit, window)
	now := time.Now()
	if a := c.Take("a", idN(1), now.UnixMilli(), now); a != Taken {
		t.Fatal(a)
	}
	// A request dated by a clock an hour ahead, checked on that clock (the
	// sweep does the same with the node's own clock): id 1 is stale by it,
	// and forgotten.
	ahead := now.Add(time.Hour)
	if a := c.Take("a", idN(1+Shards), ahead.UnixMilli(), ahead); a != Taken {
		t.Fatal(a)
	}
	// The clocks are set right: a second after the first request, a new one.
	right := now.Add(time.Second)
	if a := c.Take("a", idN(1+2*Shards), right.UnixMilli(), right); a != Taken {
		t.Fatalf("a new request once the clock is set right: %v, want taken", a)
	}
	for id, at := range map[int]time.Time{1: now, 1 + Shards: ahead, 1 + 2*Shards: right} {
		if a := c.Take("a", idN(id), at.UnixMilli(), right); a == Taken {
			t.Fatalf("id %d again: taken twice", id)
		}
	}
}

// Eight goroutines check the same 20,000 ids, each in its own order:
// every id is taken exactly once (run under -race).
func TestConcurrent(t *testing.T) {
	c := New(limit, window)
	const n, workers = 20_000, 8
	now := time.Now()
	var taken [n]atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for j := range n {
				i := (j*7919 + w*2503) % n // 7919 is prime to n: each goroutine visits every id
				switch a := c.Take("a", idN(i), now.UnixMilli(), now); a {
				case Taken:
					taken[i].Add(1)
				case Replayed:
				default:
					t.Errorf("id %d: %v", i, a)
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range taken {
		if got := taken[i].Load(); got != 1 {
			t.Fatalf("id %d taken %d times by %d goroutines, want once", i, got, workers)
		}
	}
}

// A node that stops taking requests forgets their ids all the same: the
// sweep leaves alone the shards requests reached since the last sweep,
// and empties them at the next one.
func TestSweepForgetsIdleShards(t *testing.T) {
	c := New(limit, window)
	past := time.Now().Add(-3 * window) // stale by the sweep's clock
	for i := range 1000 {
		if a := c.Take("a", idN(i), past.UnixMilli(), past); a != Taken {
			t.Fatal(a)
		}
	}
	c.sweep()
	if got := c.Len(); got != 1000 {
		t.Fatalf("%d ids after the first sweep, want the 1000 that shards checked since the last one hold", got)
	}
	c.sweep()
	if got := c.Len(); got != 0 {
		t.Fatalf("%d ids after a sweep of idle shards, want 0", got)
	}
	for i := range c.shards {
		if sh := &c.shards[i]; sh.seen != nil || sh.ring != nil {
			t.Fatalf("shard %d keeps its set or ring once empty", i)
		}
	}
}
