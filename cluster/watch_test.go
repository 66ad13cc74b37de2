package cluster

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
)

// restartableNATS is a nats-server with JetStream that can be stopped and
// started again on the same address with the same store, as an upgrade of
// NATS restarts it.
type restartableNATS struct {
	url  string
	port int
	dir  string
	ns   *server.Server
}

func startRestartableNATS(t *testing.T) *restartableNATS {
	t.Helper()
	r := &restartableNATS{dir: t.TempDir()}
	r.ns = natstest.Start(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: r.dir})
	r.port = r.ns.Addr().(*net.TCPAddr).Port
	r.url = r.ns.ClientURL()
	return r
}

// restart stops the server, then starts it again with what it stored; it
// returns once the new one takes connections.
func (r *restartableNATS) restart(t *testing.T) {
	t.Helper()
	r.ns.Shutdown()
	r.ns.WaitForShutdown()
	r.ns = natstest.Start(t, &server.Options{Host: "127.0.0.1", Port: r.port, JetStream: true, StoreDir: r.dir})
}

// dialStorage opens a Storage as a replica does: on a connection of its
// own made by Dial, which reconnects.
func dialStorage(t *testing.T, url string, opts StorageOptions) *Storage {
	t.Helper()
	c, err := Dial(ConnConfig{URLs: []string{url}, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if opts.Key == nil {
		opts.Key = testKey
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Storage(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// watchRecoverBound is how long after a write made once NATS is back a
// watcher on another replica may take to hear of it: the reconnection
// (nats.go tries again each second), a new watch, and one read.
const watchRecoverBound = 5 * time.Second

// values follows what a watcher re-reads each time its watch fires.
type values struct {
	mu   sync.Mutex
	seen []string
	ch   chan struct{}
}

func (v *values) add(s string) {
	v.mu.Lock()
	v.seen = append(v.seen, s)
	v.mu.Unlock()
	select {
	case v.ch <- struct{}{}:
	default:
	}
}

// wait waits until want has been read, at most bound; it says how long
// that took, or fails the test.
func (v *values) wait(t *testing.T, want string, bound time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		v.mu.Lock()
		got := slices.Contains(v.seen, want)
		seen := slices.Clone(v.seen)
		v.mu.Unlock()
		if got {
			return time.Since(start)
		}
		select {
		case <-v.ch:
		case <-timer.C:
			t.Fatalf("%s: the watcher did not read %q within %v of it being written (it read %q)", what, want, bound, seen)
		}
	}
}

// A watch survives a NATS restart: a write made as soon as NATS is back
// (while the watcher's old subscription has no consumer behind it) and
// one made after both reach the watcher on another replica, each within
// watchRecoverBound of being written.
func TestWatchRecoversAfterNATSRestart(t *testing.T) {
	srv := startRestartableNATS(t)
	a := dialStorage(t, srv.url, StorageOptions{})
	b := dialStorage(t, srv.url, StorageOptions{})
	const key = "zidane/tokens.json"
	ctx := testCtx(t)
	got := watchStorage(t, b, key)
	storeUntilWatched(t, a, key, got)

	srv.restart(t)
	back := time.Now()
	if err := a.Store(ctx, key, []byte("gap")); err != nil {
		t.Fatalf("a write once NATS is back: %v", err)
	}
	t.Logf("the write once NATS was back took %v", time.Since(back).Round(time.Millisecond))
	lag := got.wait(t, "gap", watchRecoverBound, "a write just after the restart")
	t.Logf("the watcher read the write made just after the restart %v after it was written (%v after NATS was back)", lag.Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	if err := a.Store(ctx, key, []byte("after")); err != nil {
		t.Fatal(err)
	}
	lag = got.wait(t, "after", watchRecoverBound, "a write after the restart")
	t.Logf("the watcher read the next write %v after it was written", lag.Round(time.Millisecond))
}

// watchStorage starts a watch on key of s whose fn reads the key, and
// returns what it reads.
func watchStorage(t *testing.T, s *Storage, key string) *values {
	t.Helper()
	got := &values{ch: make(chan struct{}, 1)}
	wctx, stop := context.WithCancel(testCtx(t))
	done := make(chan struct{})
	t.Cleanup(func() { stop(); <-done })
	go func() {
		defer close(done)
		s.Watch(wctx, key, func() {
			lctx, cancel := context.WithTimeout(wctx, 10*time.Second)
			defer cancel()
			if v, err := s.Load(lctx, key); err == nil {
				got.add(string(v))
			}
		})
	}()
	return got
}

// storeUntilWatched writes key through w until the watcher has read a
// value (the watch starts on its own goroutine, maybe after a first
// write), then until it has read the last value written: no event of
// these writes is still on its way.
func storeUntilWatched(t *testing.T, w *Storage, key string, got *values) {
	t.Helper()
	for i := 0; ; i++ {
		v := fmt.Sprintf("before-%d", i)
		if err := w.Store(testCtx(t), key, []byte(v)); err != nil {
			t.Fatal(err)
		}
		got.mu.Lock()
		n := len(got.seen)
		got.mu.Unlock()
		if n > 0 {
			got.wait(t, v, 10*time.Second, "the last write before the test")
			return
		}
		select {
		case <-got.ch:
		case <-time.After(200 * time.Millisecond):
		}
		if i == 100 {
			t.Fatal("the watch never fired")
		}
	}
}

// dropConsumers deletes every consumer of stream, as NATS loses them when
// the server that held them goes (a consumer of a watch lives on one
// server, in memory) while the watcher's own connection stays up.
func dropConsumers(t *testing.T, url, stream string) int {
	t.Helper()
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	lister := st.ConsumerNames(ctx)
	for name := range lister.Name() {
		names = append(names, name)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if err := st.DeleteConsumer(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	return len(names)
}

// A watch whose consumer NATS lost without the connection going (its
// server died in a NATS cluster) still tells of a write: nats.go's ordered
// consumer notices only after two missed heartbeats (10 to 20 s), and
// Watch's own check of the key's revision comes first.
func TestWatchCatchesAWriteItsConsumerLost(t *testing.T) {
	url := startNATS(t)
	a := dialStorage(t, url, StorageOptions{})
	b := dialStorage(t, url, StorageOptions{})
	const key = "zidane/params.json"
	got := watchStorage(t, b, key)
	storeUntilWatched(t, a, key, got)
	if n := dropConsumers(t, url, "KV_zidane"); n == 0 {
		t.Fatal("the watch has no consumer to lose")
	}
	if err := a.Store(testCtx(t), key, []byte("lost")); err != nil {
		t.Fatal(err)
	}
	lag := got.wait(t, "lost", WatchCheck+watchRecoverBound, "a write after the watch's consumer was lost")
	t.Logf("the watcher read the write %v after it was written", lag.Round(time.Millisecond))
}

// The copy of a node area is up to date again soon after NATS restarts:
// a value written once NATS is back is in it after a Sync bounded by
// watchRecoverBound, where the watch's consumer went with the server.
func TestNodeAreaRecoversAfterNATSRestart(t *testing.T) {
	srv := startRestartableNATS(t)
	w := dialStorage(t, srv.url, StorageOptions{Owner: "gw-a"})
	r := dialStorage(t, srv.url, StorageOptions{Owner: "gw-b"})
	a := followAll(t, r, nil)
	if err := w.Store(testCtx(t), "zidane/nodes/gw-a/directory/sessions/one", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	srv.restart(t)
	if err := w.Store(testCtx(t), "zidane/nodes/gw-a/directory/sessions/two", []byte("2")); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	ctx, cancel := context.WithTimeout(testCtx(t), watchRecoverBound)
	defer cancel()
	if err := a.Sync(ctx); err != nil {
		t.Fatalf("Sync after NATS restarted: %v", err)
	}
	if got := contents(a); !got["gw-a|sessions/two|2"] || !got["gw-a|sessions/one|1"] {
		t.Fatalf("after the restart the copy holds %v", got)
	}
	t.Logf("the copy held the value written after the restart %v after it was written", time.Since(written).Round(time.Millisecond))
}

// A node area whose watch lost its consumer without the connection going
// catches up all the same, within two checks.
func TestNodeAreaRecoversWhenItsConsumerIsLost(t *testing.T) {
	url := startNATS(t)
	w := dialStorage(t, url, StorageOptions{Owner: "gw-a"})
	r := dialStorage(t, url, StorageOptions{Owner: "gw-b"})
	a := followAll(t, r, nil)
	if err := w.Store(testCtx(t), "zidane/nodes/gw-a/directory/sessions/one", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n := dropConsumers(t, url, "KV_zidane"); n == 0 {
		t.Fatal("the area's watch has no consumer to lose")
	}
	if err := w.Store(testCtx(t), "zidane/nodes/gw-a/directory/sessions/two", []byte("2")); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	ctx, cancel := context.WithTimeout(testCtx(t), 2*WatchCheck+watchRecoverBound)
	defer cancel()
	if err := a.Sync(ctx); err != nil {
		t.Fatalf("Sync after the area's consumer was lost: %v", err)
	}
	if got := contents(a); !got["gw-a|sessions/two|2"] {
		t.Fatalf("the copy holds %v", got)
	}
	t.Logf("the copy held the value %v after it was written", time.Since(written).Round(time.Millisecond))
}

// startDialedNode starts node in the registry of a storage on a
// connection that reconnects, as a replica's does.
func startDialedNode(t *testing.T, url, node string, ttl time.Duration) *Nodes {
	t.Helper()
	st := dialStorage(t, url, StorageOptions{Bucket: "nodes"})
	n, err := st.StartNodes(testCtx(t), NodeOptions{Node: node, Advertise: "http://127.0.0.1:1/" + node, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// The node registry follows the other nodes again soon after NATS
// restarts: a node that starts once NATS is back is seen within
// watchRecoverBound, and the nodes that were there stay alive.
func TestNodesRecoverAfterNATSRestart(t *testing.T) {
	srv := startRestartableNATS(t)
	const ttl = 3 * time.Second
	a := startDialedNode(t, srv.url, "a", ttl)
	startDialedNode(t, srv.url, "b", ttl)
	if !waitFor(10*time.Second, func() bool { return slices.Equal(a.Alive(), []string{"b"}) }) {
		t.Fatalf("a sees %v before the restart", a.Alive())
	}
	srv.restart(t)
	startDialedNode(t, srv.url, "c", ttl)
	started := time.Now()
	if !waitFor(watchRecoverBound, func() bool { return slices.Equal(a.Alive(), []string{"b", "c"}) }) {
		t.Fatalf("%v after NATS restarted and c started, a sees %v; want [b c]", watchRecoverBound, a.Alive())
	}
	t.Logf("a saw c %v after it started", time.Since(started).Round(time.Millisecond))
}

// The node registry whose watch lost its consumer without the connection
// going sees a new node all the same: its own heartbeat, which it no
// longer hears, tells it the watch is gone.
func TestNodesRecoverWhenTheirConsumerIsLost(t *testing.T) {
	url := startNATS(t)
	const ttl = 3 * time.Second
	a := startDialedNode(t, url, "a", ttl)
	startDialedNode(t, url, "b", ttl)
	if !waitFor(10*time.Second, func() bool { return slices.Equal(a.Alive(), []string{"b"}) }) {
		t.Fatalf("a sees %v", a.Alive())
	}
	if n := dropConsumers(t, url, "KV_nodes_nodes"); n == 0 {
		t.Fatal("the registries' watches have no consumer to lose")
	}
	startDialedNode(t, url, "c", ttl)
	started := time.Now()
	if !waitFor(ttl+watchRecoverBound, func() bool { return slices.Equal(a.Alive(), []string{"b", "c"}) }) {
		t.Fatalf("a sees %v after its watch lost its consumer and c started; want [b c]", a.Alive())
	}
	t.Logf("a saw c %v after it started", time.Since(started).Round(time.Millisecond))
}

// Watch calls fn again every WatchResync though nothing was written, so a
// read of fn's that failed is done again: here the read fn makes when the
// watch is up fails (as when NATS answers nothing for longer than the read
// waits), nothing is written after, and the value is read all the same
// within the resync period.
func TestWatchReadsAgainAfterAFailedRead(t *testing.T) {
	url := startNATS(t)
	a := dialStorage(t, url, StorageOptions{})
	b := dialStorage(t, url, StorageOptions{})
	const resync = time.Second
	b.watchResync = resync
	const key = "zidane/oauth/up.json"
	if err := a.Store(testCtx(t), key, []byte("stored")); err != nil {
		t.Fatal(err)
	}
	got := &values{ch: make(chan struct{}, 1)}
	failed := make(chan struct{})
	calls := 0
	wctx, stop := context.WithCancel(testCtx(t))
	done := make(chan struct{})
	t.Cleanup(func() { stop(); <-done })
	go func() {
		defer close(done)
		b.Watch(wctx, key, func() {
			calls++
			lctx, cancel := context.WithTimeout(wctx, 10*time.Second)
			defer cancel()
			if calls == 1 {
				cancel()
			}
			v, err := b.Load(lctx, key)
			switch {
			case calls == 1 && err == nil:
				t.Error("a read with an ended context succeeded")
			case calls == 1:
				close(failed)
			case err == nil:
				got.add(string(v))
			}
		})
	}()
	<-failed
	lag := got.wait(t, "stored", WatchCheck+resync+watchRecoverBound, "a value whose first read failed")
	t.Logf("read again %v after the read that failed", lag.Round(time.Millisecond))
}
