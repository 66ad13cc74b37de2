package policy

import (
	"fmt"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Limit is a token-bucket rate: Rate events per second on average, with
// bursts of up to Burst.
type Limit struct {
	Rate  float64 `json:"rate"`
	Burst int     `json:"burst"`
}

// Validate says what is wrong with l.
func (l Limit) Validate() error {
	if l.Rate <= 0 || math.IsInf(l.Rate, 0) || math.IsNaN(l.Rate) {
		return fmt.Errorf("rate %v: give a positive number of requests per second", l.Rate)
	}
	if l.Burst < 1 {
		return fmt.Errorf("burst %d: give at least 1", l.Burst)
	}
	return nil
}

// DefaultIPv6Prefix is the prefix length by which [AddressKey] groups IPv6
// clients: a /64 is the smallest network an IPv6 subscriber is given, and
// every address in it is the subscriber's to use.
const DefaultIPv6Prefix = 64

// CheckIPv6Prefix says what is wrong with an IPv6 prefix length for
// [AddressKey].
func CheckIPv6Prefix(bits int) error {
	if bits < 1 || bits > 128 {
		return fmt.Errorf("prefix length %d: give a number of bits from 1 to 128, such as 64 (the default), 56 or 48", bits)
	}
	return nil
}

// AddressKey is the key of a client address in a per-address [Limiter]. An
// IPv4 address, written as IPv4 or IPv4-mapped IPv6, is its own key. An
// IPv6 address is keyed by its first ipv6Prefix bits (outside 1..128,
// [DefaultIPv6Prefix]), zone dropped, because one client holds every
// address of its prefix and would otherwise get a fresh bucket with each.
// A peer that is no IP address (a unix socket) is its own key.
func AddressKey(ip string, ipv6Prefix int) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	if a.Is4() {
		// ParseAddr takes an IPv4 address only in its one spelling
		// (no leading zeros), so ip is already that spelling.
		return ip
	}
	a = a.Unmap()
	if a.Is4() {
		return a.String()
	}
	if CheckIPv6Prefix(ipv6Prefix) != nil {
		ipv6Prefix = DefaultIPv6Prefix
	}
	p, _ := a.WithZone("").Prefix(ipv6Prefix)
	return p.String()
}

// limiterShards spreads keys over independent locks so that concurrent
// requests for different tokens or IPs rarely wait on each other.
const limiterShards = 32

// Limiter keeps one token bucket per key (a token id, a client IP). Buckets
// that have been idle long enough to refill completely are evicted: a new
// bucket starts full, so forgetting a full one changes no decision, and
// memory stays bounded by the keys active within one refill time.
type Limiter struct {
	limit  Limit
	refill time.Duration // time for an empty bucket to fill
	shards [limiterShards]limiterShard
	// recording says whether Allow counts what it lets through, for
	// TakeUsage (replicas that share their usage; see Debit).
	recording atomic.Bool
}

type limiterShard struct {
	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
	usage     map[string]int // events let through since the last TakeUsage, when recording
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// NewLimiter returns a limiter for l. l must be valid.
func NewLimiter(l Limit) *Limiter {
	refill := time.Duration(float64(l.Burst) / l.Rate * float64(time.Second))
	if refill < time.Second {
		refill = time.Second
	}
	lm := &Limiter{limit: l, refill: refill}
	for i := range lm.shards {
		lm.shards[i].buckets = map[string]*bucket{}
	}
	return lm
}

// Allow takes one event from key's bucket at now. When the bucket is empty
// it returns false and how long until an event would be allowed.
func (l *Limiter) Allow(key string, now time.Time) (bool, time.Duration) {
	sh := &l.shards[fnv32(key)%limiterShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if now.Sub(sh.lastSweep) > l.refill {
		sh.sweep(now, l.refill)
	}
	b := sh.buckets[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(rate.Limit(l.limit.Rate), l.limit.Burst)}
		sh.buckets[key] = b
	}
	b.seen = now
	r := b.lim.ReserveN(now, 1)
	if !r.OK() {
		return false, l.refill
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	if l.recording.Load() {
		if sh.usage == nil {
			sh.usage = map[string]int{}
		}
		sh.usage[key]++
	}
	return true, 0
}

// RecordUsage makes Allow count, per key, the events it lets through, for
// TakeUsage to hand to other replicas.
func (l *Limiter) RecordUsage() { l.recording.Store(true) }

// TakeUsage returns the events let through per key since the last call, and
// starts counting again. Nil when there were none.
func (l *Limiter) TakeUsage() map[string]int {
	var out map[string]int
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		u := sh.usage
		sh.usage = nil
		sh.mu.Unlock()
		if len(u) == 0 {
			continue
		}
		if out == nil {
			out = make(map[string]int, len(u))
		}
		for k, n := range u {
			out[k] += n
		}
	}
	return out
}

// Debit takes n events from key's bucket at now, as events another replica
// let through: the bucket may go below empty, and then lets nothing
// through until it has refilled past zero. So replicas that debit each
// other's usage hold one budget between them, give or take what each let
// through before it heard of the others'.
func (l *Limiter) Debit(key string, n int, now time.Time) {
	if n <= 0 {
		return
	}
	sh := &l.shards[fnv32(key)%limiterShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := sh.buckets[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(rate.Limit(l.limit.Rate), l.limit.Burst)}
		sh.buckets[key] = b
	}
	b.seen = now
	// A reservation of at most the burst is always granted, as a wait, and
	// takes its events from the bucket: never cancelled, it is the debit.
	for n > 0 {
		k := min(n, l.limit.Burst)
		b.lim.ReserveN(now, k)
		n -= k
	}
}

// Empty reports whether key's bucket has no event left at now, without
// taking one. An unknown key has a full bucket.
func (l *Limiter) Empty(key string, now time.Time) bool {
	sh := &l.shards[fnv32(key)%limiterShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := sh.buckets[key]
	return b != nil && b.lim.TokensAt(now) < 1
}

// Len is the number of buckets held.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += len(sh.buckets)
		sh.mu.Unlock()
	}
	return n
}

// Sweep evicts every bucket idle for a full refill time.
func (l *Limiter) Sweep(now time.Time) {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.sweep(now, l.refill)
		sh.mu.Unlock()
	}
}

func (sh *limiterShard) sweep(now time.Time, refill time.Duration) {
	for k, b := range sh.buckets {
		// A bucket that Debit took below empty takes longer than refill
		// to be full again: it is kept until it is.
		if now.Sub(b.seen) >= refill && b.lim.TokensAt(now) >= float64(b.lim.Burst()) {
			delete(sh.buckets, k)
		}
	}
	sh.lastSweep = now
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}
