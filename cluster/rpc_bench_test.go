package cluster

import (
	"encoding/hex"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/replay"
)

// mapRPCSeen is the replay check the node RPC had before it took the
// module's one (internal/replay): every request id in one map under one
// mutex, capped at 65,536, each kept 20 s after it came. It is kept here,
// and only here, so that BenchmarkRPCReplayCheck measures the new check
// against it in one run.
type mapRPCSeen struct {
	mu    sync.Mutex
	seen  map[string]time.Time
	order []mapRPCSeenID
}

type mapRPCSeenID struct {
	id     string
	forget time.Time
}

const mapRPCSeenMax = 65536

func (r *mapRPCSeen) take(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.order) > 0 && now.After(r.order[0].forget) {
		if r.seen[r.order[0].id] == r.order[0].forget {
			delete(r.seen, r.order[0].id)
		}
		r.order = r.order[1:]
	}
	if _, dup := r.seen[id]; dup || len(r.seen) >= mapRPCSeenMax {
		return false
	}
	forget := now.Add(2 * rpcFreshness)
	r.seen[id] = forget
	r.order = append(r.order, mapRPCSeenID{id, forget})
	return true
}

// BenchmarkRPCReplayCheck is the cost of the replay check of one request
// a node takes, from 8 goroutines at once, for the check before (one map
// under one mutex) and now (internal/replay), on the same kind of
// requests, in one run: it reports each one's ns/take and their ratio,
// old/new (its ns/op is the two together). The two take turns, in ten
// rounds of b.N/10 requests each, the first of a round alternating, so
// that a machine busy with other work slows both alike. Each goroutine
// takes requests with new random ids from one of three senders, dated by
// a clock of each check's, shared by its goroutines, that advances one
// request's share of a second at the rate; each check is given what serve
// has (the id as sent, hex, the sender, the request's time and the node's
// clock). At 3,000 a second the old check stays under its cap and both
// take every request, so old/new is the cost of the check alone; at
// 10,000 a second the old one fills after 6.5 s of the clock and refuses
// most of what follows (old-refused/take), which the new one takes.
func BenchmarkRPCReplayCheck(b *testing.B) {
	const goroutines, rounds, grain = 8, 10, 64
	senders := []string{"gw-0", "gw-1", "gw-2"}
	for _, rate := range []int{3_000, 10_000} {
		b.Run("rate="+strconv.Itoa(rate), func(b *testing.B) {
			old := &mapRPCSeen{seen: map[string]time.Time{}}
			c := replay.New(maxRPCIDs, rpcFreshness)
			type impl struct {
				check    func(from, id string, at int64, now time.Time) bool
				clock    atomic.Int64
				spent    time.Duration
				refusals atomic.Int64
			}
			impls := [2]*impl{
				{check: func(_, id string, _ int64, now time.Time) bool { return old.take(id, now) }},
				{check: func(from, id string, at int64, now time.Time) bool {
					var nb [16]byte
					if _, err := hex.Decode(nb[:], []byte(id)); err != nil {
						panic(err)
					}
					return c.Take(from, nb, at, now) == replay.Taken
				}},
			}
			start := time.Now()
			step := time.Second / time.Duration(rate)
			var seed atomic.Uint64
			// run has goroutines take n requests through im.
			run := func(im *impl, n int) {
				var next atomic.Int64
				var wg sync.WaitGroup
				began := time.Now()
				for range goroutines {
					wg.Go(func() {
						rng := rand.New(rand.NewPCG(seed.Add(1), 0x5eed))
						var nb [16]byte
						buf := make([]byte, 32)
						// Requests in batches, as RunParallel hands them
						// out: one counter for every request would be a
						// line the goroutines contend for, measured with
						// the checks.
						for {
							from := next.Add(grain) - grain
							if from >= int64(n) {
								return
							}
							for range min(grain, int64(n)-from) {
								now := start.Add(time.Duration(im.clock.Add(1)) * step)
								for i := 0; i < 16; i += 8 {
									v := rng.Uint64()
									for j := range 8 {
										nb[i+j] = byte(v >> (8 * j))
									}
								}
								hex.Encode(buf, nb[:])
								if !im.check(senders[nb[1]%3], string(buf), now.UnixMilli(), now) {
									im.refusals.Add(1)
								}
							}
						}
					})
				}
				wg.Wait()
				im.spent += time.Since(began)
			}
			b.ResetTimer()
			for round := range rounds {
				n := b.N / rounds
				if round < b.N%rounds {
					n++
				}
				first := round % 2
				run(impls[first], n)
				run(impls[1-first], n)
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(float64(impls[0].spent.Nanoseconds())/n, "old-ns/take")
			b.ReportMetric(float64(impls[1].spent.Nanoseconds())/n, "new-ns/take")
			b.ReportMetric(float64(impls[0].spent)/float64(impls[1].spent), "old/new")
			b.ReportMetric(float64(impls[0].refusals.Load())/n, "old-refused/take")
			b.ReportMetric(float64(impls[1].refusals.Load())/n, "new-refused/take")
		})
	}
}
