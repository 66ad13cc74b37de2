package aggregate

import (
	"context"
	"testing"
	"time"
)

// A downstream client that reads nothing holds the forwarding goroutine:
// what the upstream sends meanwhile waits up to maxQueuedNotes, in order,
// and the rest is dropped instead of piling up; every notification counts
// as handled, so a call's answer does not wait for the dropped ones.
func TestForwardIsBounded(t *testing.T) {
	c := &aggConn{}
	started, release := make(chan struct{}), make(chan struct{})
	var sent []int
	c.forward(func() { close(started); <-release; sent = append(sent, -1) })
	<-started
	const flood = maxQueuedNotes + 44
	for i := range flood {
		c.forward(func() { sent = append(sent, i) })
	}
	if got := c.dropped.Load(); got != flood-maxQueuedNotes {
		t.Fatalf("dropped %d, want %d", got, flood-maxQueuedNotes)
	}
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.handled.wait(ctx, flood+1, time.Hour)
	if got := c.handled.count(); got < flood+1 {
		t.Fatalf("handled %d of %d", got, flood+1)
	}
	c.stopForwarding()
	if len(sent) != maxQueuedNotes+1 || sent[0] != -1 {
		t.Fatalf("sent %d notifications, want the first and %d queued", len(sent), maxQueuedNotes)
	}
	for i, v := range sent[1:] {
		if v != i {
			t.Fatalf("notification %d went out as %d: out of order", i, v)
		}
	}
	// After the session ended, nothing more goes out.
	c.forward(func() { t.Error("forwarded after stop") })
}

// A call's answer waits for the notifications read before it, and goes
// out as the last one is handled: the wait ends on that event, not on the
// bound, nor on a later poll.
func TestNoteGateWakesAtTheCount(t *testing.T) {
	var g noteGate
	g.done()
	g.wait(context.Background(), 1, time.Hour) // reached already: no wait

	woke := make(chan struct{})
	go func() {
		g.wait(context.Background(), 3, time.Hour)
		close(woke)
	}()
	g.done()
	g.done()
	select {
	case <-woke:
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end when the count was reached (its bound is an hour)")
	}

	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		g.wait(ctx, 100, time.Hour)
		close(ended)
	}()
	cancel()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end with its request")
	}
}
