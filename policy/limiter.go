package policy

import (
	"fmt"
	"math"
	"sync"
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
}

type limiterShard struct {
	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
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
	return true, 0
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
		if now.Sub(b.seen) >= refill {
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
