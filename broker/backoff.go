package broker

import (
	"math/rand/v2"
	"time"
)

// Default reconnect backoff of a [Conn].
const (
	DefaultBackoffMin = 100 * time.Millisecond
	DefaultBackoffMax = 30 * time.Second
)

// Backoff bounds the delay between reconnection attempts: it starts at Min
// and doubles up to Max, each delay drawn at random between half and all of
// its value. Zero values take the defaults ([DefaultBackoffMin],
// [DefaultBackoffMax]).
type Backoff struct {
	Min, Max time.Duration
}

// withDefaults fills in the zero bounds, and raises Max to Min.
func (b Backoff) withDefaults() Backoff {
	if b.Min <= 0 {
		b.Min = DefaultBackoffMin
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoffMax
	}
	b.Max = max(b.Max, b.Min)
	return b
}

// Delay is the wait before the attempt that follows n failed ones:
// Min·2ⁿ capped at Max, drawn at random between half and all of it, so that
// the clients of an upstream that failed them all at once do not come back
// all at once. It is the one backoff of the upstream side: a [Conn]'s
// reconnections and the aggregated route's catalog sessions both take it.
func (b Backoff) Delay(n int) time.Duration {
	b = b.withDefaults()
	d := b.Min
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	return half + rand.N(d-half+1)
}
