package edge

import (
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// mapReplayCheck is the replay check this package had before the sharded
// one: one map of every nonce under one mutex, capped at 65,536, and
// scanned whole when full. It is kept here, and only here, so that
// BenchmarkHopReplayCheck measures the new check against it in one run.
type mapReplayCheck struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

const mapReplayMax = 1 << 16

func (k *mapReplayCheck) fresh(id string, now time.Time) Verdict {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, seen := k.seen[id]; seen {
		return hopRefused("hop_replayed", "this forwarded request was received before: a replay")
	}
	if len(k.seen) >= mapReplayMax {
		for n, until := range k.seen {
			if now.After(until) {
				delete(k.seen, n)
			}
		}
		if len(k.seen) >= mapReplayMax {
			v := Refuse(http.StatusServiceUnavailable, "hop_busy", "this node holds as many recent forwarded requests as it checks for replays; retry in a few seconds")
			v.RetryAfter = HopFreshness
			return v
		}
	}
	k.seen[id] = now.Add(2 * HopFreshness)
	return Verdict{}
}

// BenchmarkHopReplayCheck is the cost of the replay check of one hop, from
// 8 goroutines at once, for the check before (map, one mutex) and now
// (sharded rings), on the same hops: each goroutine sends hops with new
// random nonces, dated by a clock shared by all that advances 1/3,000 s
// per hop, from one of three senders. Each is given what Verify has: the
// sender, the nonce as sent (hex), the hop's time and the receiver's
// clock. At 3,000 hops a second the old map stays under its cap, so both
// take every hop and the figures compare the cost of the check alone.
// (The few the new check refuses, refused/op, are refused as stale: a
// goroutine preempted while 30,000 hops pass has its hop 10 s old by the
// benchmark's clock, and a shard that forgot nonces at a later reading
// of that clock refuses it rather than risk a replay.) Above about 3,300
// hops a second the old check fills, then scans its whole map under its
// lock on every hop and refuses it (TestHopReplayCheckTakesAHighRate shows
// the new one taking them).
func BenchmarkHopReplayCheck(b *testing.B) {
	senders := []string{"gw-0", "gw-1", "gw-2"}
	// Eight goroutines however many CPUs: RunParallel starts
	// parallelism × GOMAXPROCS.
	parallelism := max(1, 8/runtime.GOMAXPROCS(0))
	for _, rate := range []int{3_000} {
		for _, impl := range []string{"map-one-mutex", "sharded-ring"} {
			b.Run(impl+"/rate="+strconv.Itoa(rate), func(b *testing.B) {
				var check func(from, nonce string, at int64, now time.Time) Verdict
				switch impl {
				case "map-one-mutex":
					old := &mapReplayCheck{seen: map[string]time.Time{}}
					check = func(from, nonce string, _ int64, now time.Time) Verdict { return old.fresh(from+"|"+nonce, now) }
				default:
					k := NewHopKey(make([]byte, 32))
					check = func(from, nonce string, at int64, now time.Time) Verdict {
						var nb [16]byte
						if _, err := hex.Decode(nb[:], []byte(nonce)); err != nil {
							b.Fatal(err)
						}
						return k.checkNonce(from, nb, at, now)
					}
				}
				start := time.Now()
				step := time.Second / time.Duration(rate)
				var clock, refused atomic.Int64
				var seed atomic.Uint64
				b.SetParallelism(parallelism)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					rng := rand.New(rand.NewPCG(seed.Add(1), 0x5eed))
					var nb [16]byte
					buf := make([]byte, 32)
					for pb.Next() {
						now := start.Add(time.Duration(clock.Add(1)) * step)
						for i := 0; i < 16; i += 8 {
							v := rng.Uint64()
							for j := range 8 {
								nb[i+j] = byte(v >> (8 * j))
							}
						}
						hex.Encode(buf, nb[:])
						if !check(senders[nb[1]%3], string(buf), now.UnixMilli(), now).Allowed() {
							refused.Add(1)
						}
					}
				})
				b.ReportMetric(float64(refused.Load())/float64(b.N), "refused/op")
			})
		}
	}
}
