package broker

import (
	"testing"
	"time"
)

// Each delay lies between half and all of Min·2ⁿ, capped at Max; zero
// bounds take the defaults.
func TestBackoffDelay(t *testing.T) {
	for _, c := range []struct {
		name     string
		b        Backoff
		n        int
		min, max time.Duration
	}{
		{"first", Backoff{Min: 100 * time.Millisecond, Max: time.Second}, 0, 50 * time.Millisecond, 100 * time.Millisecond},
		{"doubles", Backoff{Min: 100 * time.Millisecond, Max: time.Second}, 2, 200 * time.Millisecond, 400 * time.Millisecond},
		{"capped", Backoff{Min: 100 * time.Millisecond, Max: time.Second}, 40, 500 * time.Millisecond, time.Second},
		{"defaults", Backoff{}, 0, DefaultBackoffMin / 2, DefaultBackoffMin},
		{"default cap", Backoff{}, 1000, DefaultBackoffMax / 2, DefaultBackoffMax},
		{"max below min", Backoff{Min: time.Second, Max: time.Millisecond}, 3, 500 * time.Millisecond, time.Second},
	} {
		for range 200 {
			if d := c.b.Delay(c.n); d < c.min || d > c.max {
				t.Fatalf("%s: Delay(%d) = %v, want within [%v, %v]", c.name, c.n, d, c.min, c.max)
			}
		}
	}
}
