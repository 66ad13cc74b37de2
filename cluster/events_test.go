package cluster

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

type followed struct {
	mu   sync.Mutex
	seqs []uint64
	msgs []string
}

func (f *followed) add(seq uint64, _ time.Time, body []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seqs = append(f.seqs, seq)
	f.msgs = append(f.msgs, string(body))
}

func (f *followed) snapshot() ([]uint64, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seqs), slices.Clone(f.msgs)
}

// Two nodes publish to one stream; each follower sees every message once,
// in one order, numbered alike. A message a NATS user without the key adds
// is skipped; a follower that starts late gets the last ones kept.
func TestEventStreamNumbersForTheCluster(t *testing.T) {
	url := startNATS(t)
	a, _ := newStorage(t, url, StorageOptions{Bucket: "ev"})
	b, _ := newStorage(t, url, StorageOptions{Bucket: "ev"})
	ea, err := a.OpenEventStream(testCtx(t), "events", 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := b.OpenEventStream(testCtx(t), "events", 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	var fa, fb followed
	stopA, err := ea.Follow(testCtx(t), 0, fa.add)
	if err != nil {
		t.Fatal(err)
	}
	defer stopA()
	stopB, err := eb.Follow(testCtx(t), 0, fb.add)
	if err != nil {
		t.Fatal(err)
	}
	defer stopB()
	var want []uint64
	for i := range 10 {
		e := ea
		if i%2 == 1 {
			e = eb
		}
		seq, err := e.Publish(testCtx(t), fmt.Sprint("m", i), []byte(fmt.Sprint("event ", i)))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, seq)
	}
	// A retried publish under the same id is kept once.
	if seq, err := ea.Publish(testCtx(t), "m0", []byte("event 0")); err != nil || seq != want[0] {
		t.Fatalf("a retried publish got seq %d (%v), want %d", seq, err, want[0])
	}
	// A NATS user without the key adds one.
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(testCtx(t), "zidane.stream.ev.events", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	last, err := ea.Publish(testCtx(t), "after", []byte("after"))
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, last)
	for _, f := range []*followed{&fa, &fb} {
		if !waitFor(10*time.Second, func() bool { s, _ := f.snapshot(); return len(s) > 0 && s[len(s)-1] == last }) {
			s, _ := f.snapshot()
			t.Fatalf("a follower saw %v, want up to %d", s, last)
		}
		seqs, msgs := f.snapshot()
		if !slices.Equal(seqs, want) {
			t.Fatalf("a follower saw %v, want %v", seqs, want)
		}
		if msgs[0] != "event 0" || msgs[9] != "event 9" || slices.Contains(msgs, "forged") {
			t.Fatalf("a follower saw %q", msgs)
		}
	}
	// A late follower asks for the last 3 kept: the forged one is among
	// the stream's, not among what it gets.
	var late followed
	stopL, err := eb.Follow(testCtx(t), 3, late.add)
	if err != nil {
		t.Fatal(err)
	}
	defer stopL()
	if !waitFor(10*time.Second, func() bool { s, _ := late.snapshot(); return len(s) == 2 }) {
		s, _ := late.snapshot()
		t.Fatalf("the late follower saw %v, want the last 2 authentic of the last 3", s)
	}
	if s, _ := late.snapshot(); !slices.Equal(s, want[9:]) {
		t.Fatalf("the late follower saw %v, want %v", s, want[9:])
	}
}
