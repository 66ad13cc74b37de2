package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestLimiterBurstThenRefill(t *testing.T) {
	l := NewLimiter(Limit{Rate: 2, Burst: 3})
	now := time.Unix(1000, 0)
	for i := 0; i < 3; i++ {
		if ok, _ := l.Allow("tok", now); !ok {
			t.Fatalf("request %d within burst refused", i)
		}
	}
	ok, retry := l.Allow("tok", now)
	if ok {
		t.Fatal("request over burst allowed")
	}
	if retry <= 0 || retry > time.Second {
		t.Fatalf("retry after %v, want (0, 500ms] at 2/s", retry)
	}
	if ok, _ := l.Allow("other", now); !ok {
		t.Fatal("another key shares the bucket")
	}
	if !l.Empty("tok", now) || l.Empty("fresh", now) {
		t.Fatal("Empty is wrong")
	}
	if ok, _ := l.Allow("tok", now.Add(retry)); !ok {
		t.Fatal("refused after waiting the advised retry time")
	}
}

func TestLimiterEvictsIdleBuckets(t *testing.T) {
	l := NewLimiter(Limit{Rate: 10, Burst: 10})
	now := time.Unix(1000, 0)
	for i := 0; i < 10000; i++ {
		l.Allow(fmt.Sprint("ip-", i), now)
	}
	if l.Len() != 10000 {
		t.Fatalf("Len = %d", l.Len())
	}
	l.Sweep(now.Add(500 * time.Millisecond))
	if l.Len() != 10000 {
		t.Fatal("buckets that are still refilling were evicted")
	}
	// Traffic later sweeps the idle buckets on its own.
	later := now.Add(2 * time.Second)
	for i := 0; i < 1000; i++ {
		l.Allow(fmt.Sprint("new-", i), later)
	}
	if n := l.Len(); n != 1000 {
		t.Fatalf("Len = %d after idle buckets aged out, want 1000", n)
	}
}

func TestLimitValidate(t *testing.T) {
	for _, bad := range []Limit{{0, 1}, {-1, 1}, {1, 0}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if (Limit{Rate: 0.5, Burst: 1}).Validate() != nil {
		t.Error("valid limit refused")
	}
}

func BenchmarkLimiterAllow(b *testing.B) {
	l := NewLimiter(Limit{Rate: 1e9, Burst: 1 << 30})
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		l.Allow("tok_0123456789abcdef", now)
	}
}

// One IPv6 subscriber holds a whole /64 (or more): keyed by the full
// address, it would have 2^64 buckets for failed attempts. Addresses in one
// prefix share a bucket, another prefix has its own, and an IPv4 client
// written as IPv4-mapped IPv6 shares the bucket of its IPv4 form.
func TestAddressKeyGroupsIPv6ClientsByPrefix(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name       string
		ipv6Prefix int
		first      string
		then       string
		shared     bool
	}{
		{"two addresses of one /64", 64, "2001:db8:1:2::a", "2001:db8:1:2:ffff:ffff:ffff:ffff", true},
		{"another /64", 64, "2001:db8:1:2::a", "2001:db8:1:3::a", false},
		{"a zone does not make a new bucket", 64, "fe80::1", "fe80::2%eth0", true},
		{"two /64s of one /56", 56, "2001:db8:1:200::a", "2001:db8:1:2ff::b", true},
		{"another /56", 56, "2001:db8:1:200::a", "2001:db8:1:300::a", false},
		{"per address at /128", 128, "2001:db8::1", "2001:db8::2", false},
		{"IPv4-mapped is IPv4", 64, "192.0.2.1", "::ffff:192.0.2.1", true},
		{"IPv4 per address", 64, "192.0.2.1", "192.0.2.2", false},
		{"IPv4 is not the IPv6 prefix that maps it", 64, "192.0.2.1", "::ffff:192.0.2.2", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter(Limit{Rate: 1, Burst: 1})
			if ok, _ := l.Allow(AddressKey(tt.first, tt.ipv6Prefix), now); !ok {
				t.Fatal("first attempt refused")
			}
			ok, _ := l.Allow(AddressKey(tt.then, tt.ipv6Prefix), now)
			if shared := !ok; shared != tt.shared {
				t.Errorf("%s after %s at /%d: shared bucket = %v, want %v (keys %q, %q)", tt.then, tt.first, tt.ipv6Prefix,
					shared, tt.shared, AddressKey(tt.first, tt.ipv6Prefix), AddressKey(tt.then, tt.ipv6Prefix))
			}
		})
	}
	if got := AddressKey("@unix-socket", 64); got != "@unix-socket" {
		t.Errorf("a peer that is no IP address is keyed %q, want itself", got)
	}
}

func TestCheckIPv6Prefix(t *testing.T) {
	for _, ok := range []int{1, 48, 56, 64, 128} {
		if err := CheckIPv6Prefix(ok); err != nil {
			t.Errorf("CheckIPv6Prefix(%d) = %v", ok, err)
		}
	}
	for _, bad := range []int{0, -1, 129, 1000} {
		err := CheckIPv6Prefix(bad)
		if err == nil || !strings.Contains(err.Error(), "from 1 to 128") {
			t.Errorf("CheckIPv6Prefix(%d) = %v, want it to say the range", bad, err)
		}
	}
}

// Another replica's usage, debited, empties a bucket past zero: nothing
// gets through until it has refilled past zero, and a sweep keeps it.
func TestLimiterDebit(t *testing.T) {
	l := NewLimiter(Limit{Rate: 10, Burst: 5})
	now := time.Unix(1000, 0)
	l.Debit("tok", 12, now) // 5 - 12 = -7 events
	if ok, _ := l.Allow("tok", now); ok {
		t.Fatal("a debited bucket let an event through")
	}
	l.Sweep(now.Add(time.Second)) // idle for the refill time, but not full
	if ok, _ := l.Allow("tok", now.Add(750*time.Millisecond)); ok {
		t.Fatal("let an event through at -7 + 7.5 = 0.5")
	}
	if ok, _ := l.Allow("tok", now.Add(850*time.Millisecond)); !ok {
		t.Fatal("refused an event at -7 + 8.5 = 1.5")
	}
	l.Debit("new", 2, now) // an unknown key starts full
	for i := range 3 {
		if ok, _ := l.Allow("new", now); !ok {
			t.Fatalf("event %d of the 3 left after a debit of 2 from 5 was refused", i+1)
		}
	}
	if ok, _ := l.Allow("new", now); ok {
		t.Fatal("a fourth event got through")
	}
}

// With usage recorded, TakeUsage hands over what got through per key, once.
func TestLimiterTakeUsage(t *testing.T) {
	l := NewLimiter(Limit{Rate: 1, Burst: 3})
	now := time.Unix(1000, 0)
	l.Allow("a", now) // before recording: not counted
	l.RecordUsage()
	for range 4 { // 2 get through: a's bucket had 2 left
		l.Allow("a", now)
	}
	l.Allow("b", now)
	got := l.TakeUsage()
	if len(got) != 2 || got["a"] != 2 || got["b"] != 1 {
		t.Fatalf("usage = %v, want a:2 b:1 (refused events are not usage)", got)
	}
	if again := l.TakeUsage(); again != nil {
		t.Fatalf("usage taken twice: %v", again)
	}
}
