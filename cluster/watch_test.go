package cluster

import (
	"context"
	"fmt"
	"log/slog"
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

// watchHangGuard only bounds the waits below, so that a watch that never
// recovers fails the test rather than hangs it. What shows that a watch
// was made again by this package, not by nats.go (which makes a lost
// consumer again 10 to 20 s later on its own), is the log line that
// keepWatching writes: the tests wait for it, not for a time.
const watchHangGuard = 30 * time.Second

// remade gives what a storage's log says of the watches it made again,
// as "watch|reason" (see keepWatching), through a [values].
type remade struct{ v *values }

func newRemade() (*remade, *slog.Logger) {
	r := &remade{&values{ch: make(chan struct{}, 1)}}
	return r, slog.New(r)
}

func (r *remade) Enabled(context.Context, slog.Level) bool { return true }
func (r *remade) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *remade) WithGroup(string) slog.Handler            { return r }

func (r *remade) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != "NATS watch made again" {
		return nil
	}
	var watch, reason string
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "watch":
			watch = a.Value.String()
		case "reason":
			reason = a.Value.String()
		}
		return true
	})
	r.v.add(watch + "|" + reason)
	return nil
}

// wait waits until the log says watch was made again for reason.
func (r *remade) wait(t *testing.T, watch string, reason watchEnd, what string) {
	t.Helper()
	r.v.wait(t, watch+"|"+reason.reason(), watchHangGuard, what+": the watch made again")
}

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

func (v *values) has(s string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Contains(v.seen, s)
}

func (v *values) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.seen)
}

// wait waits until want has been read, at most bound (a hang guard); it
// says how long that took, or fails the test.
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
			t.Fatalf("%s: %q not seen within %v (seen: %q)", what, want, bound, seen)
		}
	}
}

// A watch survives a NATS restart: the watcher on another replica makes
// its watch again itself once its connection is back, and says so; a
// write made as soon as NATS is back (while the watcher's old
// subscription has no consumer behind it) and one made after both reach
// it. The lags are logged, not asserted.
func TestWatchRecoversAfterNATSRestart(t *testing.T) {
	srv := startRestartableNATS(t)
	a := dialStorage(t, srv.url, StorageOptions{})
	log, logger := newRemade()
	b := dialStorage(t, srv.url, StorageOptions{Logger: logger})
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
	written := time.Now()
	log.wait(t, key, watchBack, "the connection back")
	got.wait(t, "gap", watchHangGuard, "a write just after the restart")
	t.Logf("the watcher read the write made just after the restart %v after it was written (%v after NATS was back)", time.Since(written).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	if err := a.Store(ctx, key, []byte("after")); err != nil {
		t.Fatal(err)
	}
	lag := got.wait(t, "after", watchHangGuard, "a write after the restart")
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
// Watch's own check of the key's revision comes first: it tells the write,
// and at the next check makes the watch again, which it logs.
func TestWatchCatchesAWriteItsConsumerLost(t *testing.T) {
	url := startNATS(t)
	a := dialStorage(t, url, StorageOptions{})
	log, logger := newRemade()
	b := dialStorage(t, url, StorageOptions{Logger: logger})
	const key = "zidane/params.json"
	got := watchStorage(t, b, key)
	storeUntilWatched(t, a, key, got)
	if n := dropConsumers(t, url, "KV_zidane"); n == 0 {
		t.Fatal("the watch has no consumer to lose")
	}
	if err := a.Store(testCtx(t), key, []byte("lost")); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	log.wait(t, key, watchBehind, "the consumer lost")
	if !got.has("lost") {
		t.Fatalf("the check made the watch again without telling the write it missed (the watcher read %q)", got.all())
	}
	t.Logf("the watcher read the write, and made its watch again %v after it was written", time.Since(written).Round(time.Millisecond))
}

// followLogged is followAll with the area's log going to log.
func followLogged(t *testing.T, s *Storage, log *slog.Logger) *NodeArea {
	t.Helper()
	a, err := s.FollowNodeArea("directory", func(node, name string, v []byte) (any, bool) { return node + "|" + name + "|" + string(v), true }, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

const directoryWatch = "the nodes' directory area"

// The copy of a node area is up to date again after NATS restarts, where
// the watch's consumer went with the server: the area makes its watch
// again itself once the connection is back, and says so; a value written
// once NATS is back is then in it after a Sync.
func TestNodeAreaRecoversAfterNATSRestart(t *testing.T) {
	srv := startRestartableNATS(t)
	w := dialStorage(t, srv.url, StorageOptions{Owner: "gw-a"})
	r := dialStorage(t, srv.url, StorageOptions{Owner: "gw-b"})
	log, logger := newRemade()
	a := followLogged(t, r, logger)
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
	log.wait(t, directoryWatch, watchBack, "the connection back")
	ctx, cancel := context.WithTimeout(testCtx(t), watchHangGuard)
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
// catches up all the same: its check finds it behind and makes the watch
// again, and says so.
func TestNodeAreaRecoversWhenItsConsumerIsLost(t *testing.T) {
	url := startNATS(t)
	w := dialStorage(t, url, StorageOptions{Owner: "gw-a"})
	r := dialStorage(t, url, StorageOptions{Owner: "gw-b"})
	log, logger := newRemade()
	a := followLogged(t, r, logger)
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
	log.wait(t, directoryWatch, watchBehind, "the consumer lost")
	ctx, cancel := context.WithTimeout(testCtx(t), watchHangGuard)
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
// connection that reconnects, as a replica's does; the registry logs to
// log (nil: nowhere).
func startDialedNode(t *testing.T, url, node string, ttl time.Duration, log *slog.Logger) *Nodes {
	t.Helper()
	st := dialStorage(t, url, StorageOptions{Bucket: "nodes"})
	n, err := st.StartNodes(testCtx(t), NodeOptions{Node: node, Advertise: "http://127.0.0.1:1/" + node, TTL: ttl, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

const registryWatch = "the node registry"

// The node registry follows the other nodes again after NATS restarts:
// it makes its watch again itself once the connection is back, and says
// so; a node that starts once NATS is back is seen, and the nodes that
// were there stay alive.
func TestNodesRecoverAfterNATSRestart(t *testing.T) {
	srv := startRestartableNATS(t)
	const ttl = 3 * time.Second
	log, logger := newRemade()
	a := startDialedNode(t, srv.url, "a", ttl, logger)
	startDialedNode(t, srv.url, "b", ttl, nil)
	if !waitFor(10*time.Second, func() bool { return slices.Equal(a.Alive(), []string{"b"}) }) {
		t.Fatalf("a sees %v before the restart", a.Alive())
	}
	srv.restart(t)
	startDialedNode(t, srv.url, "c", ttl, nil)
	started := time.Now()
	log.wait(t, registryWatch, watchBack, "the connection back")
	if !waitFor(watchHangGuard, func() bool { return slices.Equal(a.Alive(), []string{"b", "c"}) }) {
		t.Fatalf("after NATS restarted and c started, a sees %v; want [b c]", a.Alive())
	}
	t.Logf("a saw c %v after it started", time.Since(started).Round(time.Millisecond))
}

// The node registry whose watch lost its consumer without the connection
// going sees a new node all the same: its own heartbeat, which it no
// longer hears, tells it the watch is gone, and it makes the watch again
// and says so.
func TestNodesRecoverWhenTheirConsumerIsLost(t *testing.T) {
	url := startNATS(t)
	const ttl = 3 * time.Second
	log, logger := newRemade()
	a := startDialedNode(t, url, "a", ttl, logger)
	startDialedNode(t, url, "b", ttl, nil)
	if !waitFor(10*time.Second, func() bool { return slices.Equal(a.Alive(), []string{"b"}) }) {
		t.Fatalf("a sees %v", a.Alive())
	}
	if n := dropConsumers(t, url, "KV_nodes_nodes"); n == 0 {
		t.Fatal("the registries' watches have no consumer to lose")
	}
	startDialedNode(t, url, "c", ttl, nil)
	started := time.Now()
	log.wait(t, registryWatch, watchBehind, "the consumer lost")
	if !waitFor(watchHangGuard, func() bool { return slices.Equal(a.Alive(), []string{"b", "c"}) }) {
		t.Fatalf("a sees %v after its watch lost its consumer and c started; want [b c]", a.Alive())
	}
	t.Logf("a saw c %v after it started", time.Since(started).Round(time.Millisecond))
}

// Watch calls fn again every WatchResync though nothing was written, so a
// read of fn's that failed is done again: here the read fn makes when the
// watch is up fails (as when NATS answers nothing for longer than the read
// waits), nothing is written after, and the value is read all the same:
// only the resync (1 s here) calls fn again. The lag is logged.
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
	lag := got.wait(t, "stored", watchHangGuard, "a value whose first read failed")
	t.Logf("read again %v after the read that failed", lag.Round(time.Millisecond))
}
