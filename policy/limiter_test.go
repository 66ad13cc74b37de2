package policy

import (
	"fmt"
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
