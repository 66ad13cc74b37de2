package dpop

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// A nonce is good in the period it was issued in and the next, and never
// after, before, under another key, or altered.
func TestNonces(t *testing.T) {
	const period = time.Minute
	n := mustNonces(t, strings.Repeat("a", 32))
	start := time.Unix(1_800_000_000, 0).Truncate(period)
	nonce := n.Issue(start.Add(10 * time.Second))
	for _, tt := range []struct {
		at   time.Duration
		want bool
	}{
		{0, true},
		{period - time.Nanosecond, true},
		{period, true}, // the previous period's nonce
		{2*period - time.Nanosecond, true},
		{2 * period, false},       // two periods old
		{-time.Nanosecond, false}, // issued in a period that has not begun
	} {
		if got := n.Valid(nonce, start.Add(tt.at)); got != tt.want {
			t.Errorf("Valid at start+%s = %v, want %v", tt.at, got, tt.want)
		}
	}
	if mustNonces(t, strings.Repeat("b", 32)).Valid(nonce, start) {
		t.Error("a nonce of another key is valid")
	}
	b := []byte(nonce)
	b[len(b)-2] ^= 1
	if n.Valid(string(b), start) {
		t.Error("an altered nonce is valid")
	}
	// An old nonce given a current period: the MAC covers the period.
	old, err := base64.RawURLEncoding.DecodeString(n.Issue(start.Add(-2 * period)))
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := base64.RawURLEncoding.DecodeString(nonce)
	copy(old[:8], cur[:8])
	if n.Valid(base64.RawURLEncoding.EncodeToString(old), start) {
		t.Error("an old nonce restamped with the current period is valid")
	}
	for _, bad := range []string{"", "x", nonce + "A", strings.Repeat("A", len(nonce))} {
		if n.Valid(bad, start) {
			t.Errorf("Valid(%q) = true", bad)
		}
	}
	if n.Issue(start) != n.Issue(start.Add(period-time.Nanosecond)) || n.Issue(start) == n.Issue(start.Add(period)) {
		t.Error("a nonce is not one per period")
	}
}

func TestNoncesKey(t *testing.T) {
	if _, err := NewNonces(make([]byte, 31), 0); err == nil {
		t.Fatal("a 31-byte key is accepted")
	}
	n, err := NewNonces(make([]byte, 32), 0)
	if err != nil {
		t.Fatal(err)
	}
	if n.period != DefaultNoncePeriod {
		t.Fatalf("period %s", n.period)
	}
}
