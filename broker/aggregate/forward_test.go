package aggregate

import (
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
	deadline := time.Now().Add(10 * time.Second)
	for c.handled.Load() < flood+1 {
		if time.Now().After(deadline) {
			t.Fatalf("handled %d of %d", c.handled.Load(), flood+1)
		}
		time.Sleep(time.Millisecond)
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
