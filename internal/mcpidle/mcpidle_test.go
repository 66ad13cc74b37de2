package mcpidle

import (
	"sync"
	"testing"
	"time"
)

// fakeTimer is armed or not; the test fires it by hand, as the clock would.
type fakeTimer struct {
	mu    sync.Mutex
	armed bool
	f     func()
}

func (t *fakeTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

func (t *fakeTimer) Reset(time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.armed
	t.armed = true
	return was
}

// fire runs the timer's function if it is armed, and reports whether it
// was.
func (t *fakeTimer) fire() bool {
	t.mu.Lock()
	armed := t.armed
	t.armed = false
	t.mu.Unlock()
	if armed {
		t.f()
	}
	return armed
}

func withFakeTimers(s *Sessions) map[string]*fakeTimer {
	timers := map[string]*fakeTimer{}
	var n int
	s.newTimer = func(_ time.Duration, f func()) timer {
		n++
		t := &fakeTimer{armed: true, f: f}
		timers[string(rune('a'-1+n))] = t
		return t
	}
	return timers
}

func TestIdleSessionIsClosed(t *testing.T) {
	s := New(time.Minute)
	timers := withFakeTimers(s)
	closed := map[string]int{}
	s.Opened("s1", "tok", func() { closed["s1"]++ })
	s.Opened("s1", "tok", func() { closed["s1"] += 100 }) // ignored
	if s.Len() != 1 {
		t.Fatalf("tracked %d", s.Len())
	}
	if !timers["a"].fire() || closed["s1"] != 1 || s.Len() != 0 {
		t.Fatalf("after the timeout: closed %v, tracked %d", closed, s.Len())
	}
}

func TestRequestsInFlightKeepASessionOpen(t *testing.T) {
	s := New(time.Minute)
	timers := withFakeTimers(s)
	closed := 0
	s.Opened("s1", "tok", func() { closed++ })
	get := s.Use("s1", "tok")  // a GET stream
	post := s.Use("s1", "tok") // a POST meanwhile
	if timers["a"].fire() || closed != 0 {
		t.Fatal("the timer ran while requests were in flight")
	}
	post()
	post() // a second call changes nothing
	if timers["a"].fire() || closed != 0 {
		t.Fatal("the timer ran while the GET stream was open")
	}
	get()
	if !timers["a"].fire() || closed != 1 {
		t.Fatalf("after the last request ended and the timeout passed: closed %d", closed)
	}
}

// The timer fires just as a request begins: the request wins, and the
// timeout runs again from its end.
func TestTimerRacingARequest(t *testing.T) {
	s := New(time.Minute)
	timers := withFakeTimers(s)
	closed := 0
	s.Opened("s1", "tok", func() { closed++ })
	done := s.Use("s1", "tok")
	s.expire("s1", s.m["s1"]) // what the fired timer's function does
	if closed != 0 || s.Len() != 1 {
		t.Fatalf("closed %d, tracked %d, with a request in flight", closed, s.Len())
	}
	done()
	if !timers["a"].fire() || closed != 1 {
		t.Fatalf("closed %d after the request", closed)
	}
}

func TestOtherTokensAndUnknownIDsKeepNothingAlive(t *testing.T) {
	s := New(time.Minute)
	timers := withFakeTimers(s)
	closed := 0
	s.Opened("s1", "victim", func() { closed++ })
	defer s.Use("s1", "attacker")()
	defer s.Use("nope", "victim")()
	if !timers["a"].fire() || closed != 1 {
		t.Fatalf("another token's request kept the session open: closed %d", closed)
	}
}

func TestClosedAndStop(t *testing.T) {
	s := New(time.Minute)
	timers := withFakeTimers(s)
	closed := 0
	s.Opened("s1", "tok", func() { closed++ })
	s.Opened("s2", "tok", func() { closed++ })
	s.Closed("s1")
	if timers["a"].fire() || s.Len() != 1 {
		t.Fatalf("a session that closed otherwise is still tracked (%d) or its timer armed", s.Len())
	}
	s.Stop()
	s.Opened("s3", "tok", func() { closed++ })
	if timers["b"].fire() || s.Len() != 0 || closed != 0 {
		t.Fatalf("after Stop: tracked %d, closed %d", s.Len(), closed)
	}
}

func TestNilTracksNothing(t *testing.T) {
	var s *Sessions = New(0)
	if s != nil {
		t.Fatal("New(0) is not nil")
	}
	s.Opened("s1", "tok", func() { t.Fatal("closed") })
	s.Use("s1", "tok")()
	s.Closed("s1")
	s.Stop()
	if s.Len() != 0 {
		t.Fatal("nil tracks")
	}
}

// With the real clock: a session left alone is closed after the timeout.
func TestRealTimer(t *testing.T) {
	s := New(10 * time.Millisecond)
	closed := make(chan struct{})
	s.Opened("s1", "tok", func() { close(closed) })
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("not closed within 10s of a 10ms timeout")
	}
}
