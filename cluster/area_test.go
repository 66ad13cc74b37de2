package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// followAll follows area "directory" of s, taking every value that opens.
func followAll(t *testing.T, s *Storage, hook func(string)) *NodeArea {
	t.Helper()
	a, err := s.FollowNodeArea("directory", func(node, name string, v []byte) (any, bool) { return node + "|" + name + "|" + string(v), true }, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.beforeApply = hook
	a.mu.Unlock()
	t.Cleanup(a.Close)
	return a
}

func contents(a *NodeArea) map[string]bool {
	out := map[string]bool{}
	a.Each(func(_, _ string, v any) { out[v.(string)] = true })
	return out
}

// Sync returns only once the copy holds what was written before it began:
// while the watch holds back an entry, Sync does not return before its
// context ends, and once the entry is in, it returns at once.
func TestNodeAreaSyncWaitsForTheWatch(t *testing.T) {
	url := startNATS(t)
	w, _ := newStorage(t, url, StorageOptions{Owner: "gw-a"})
	r, _ := newStorage(t, url, StorageOptions{Owner: "gw-b"})
	if err := w.Store(testCtx(t), "zidane/nodes/gw-a/directory/sessions/one", []byte("1")); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}, 1), make(chan struct{})
	target, _ := kvKey("zidane/nodes/gw-a/directory/sessions/two")
	a := followAll(t, r, func(k string) {
		if k == target {
			held <- struct{}{}
			<-release
		}
	})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before a.Close, even if the test fails
	if err := a.Sync(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := contents(a); !got["gw-a|sessions/one|1"] || len(got) != 1 {
		t.Fatalf("the copy holds %v", got)
	}
	if err := w.Store(testCtx(t), "zidane/nodes/gw-a/directory/sessions/two", []byte("2")); err != nil {
		t.Fatal(err)
	}
	<-held // the watch has the entry, and holds it back
	ctx, cancel := context.WithTimeout(testCtx(t), 500*time.Millisecond)
	err := a.Sync(ctx)
	cancel()
	if !errors.Is(err, ErrAreaBehind) {
		t.Fatalf("Sync while the watch holds back an entry written before it: %v; want ErrAreaBehind", err)
	}
	once.Do(func() { close(release) })
	if err := a.Sync(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := contents(a); !got["gw-a|sessions/two|2"] {
		t.Fatalf("after Sync the copy holds %v", got)
	}
	// A delete takes the value out.
	if err := w.Delete(testCtx(t), "zidane/nodes/gw-a/directory/sessions/one"); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := contents(a); got["gw-a|sessions/one|1"] || len(got) != 1 {
		t.Fatalf("after the delete the copy holds %v", got)
	}
}

// A value counts only under the key it was sealed for: the same sealed
// bytes put at another key (another name, another node's prefix) by a NATS
// user without the cluster key are left out, whatever accept would say;
// so is a value sealed under another cluster key, and what is not sealed.
func TestNodeAreaKeepsOnlyValuesSealedForTheirKey(t *testing.T) {
	url := startNATS(t)
	w, nc := newStorage(t, url, StorageOptions{Owner: "gw-a"})
	other := make([]byte, KeySize)
	other[0] = 1
	stranger, _ := newStorage(t, url, StorageOptions{Owner: "gw-x", Key: other})
	r, _ := newStorage(t, url, StorageOptions{Owner: "gw-b"})
	a := followAll(t, r, nil)
	if err := w.Store(testCtx(t), "zidane/nodes/gw-a/directory/sessions/one", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := stranger.Store(testCtx(t), "zidane/nodes/gw-a/directory/sessions/three", []byte("3")); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(testCtx(t), "zidane")
	if err != nil {
		t.Fatal(err)
	}
	from, _ := kvKey("zidane/nodes/gw-a/directory/sessions/one")
	e, err := kv.Get(testCtx(t), from)
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"zidane/nodes/gw-a/directory/sessions/two", "zidane/nodes/gw-b/directory/sessions/one", "zidane/nodes/gw-a/directory/pending/one"} {
		k, _ := kvKey(to)
		if _, err := kv.Put(testCtx(t), k, e.Value()); err != nil {
			t.Fatal(err)
		}
	}
	k, _ := kvKey("zidane/nodes/gw-a/directory/sessions/four")
	if _, err := kv.Put(testCtx(t), k, []byte("\x004")); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := contents(a); !got["gw-a|sessions/one|1"] || len(got) != 1 {
		t.Fatalf("the copy holds %v; want only the value sealed for its key", got)
	}
}
