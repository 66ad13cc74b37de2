package cluster

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// waitFor polls cond, bounded: true once it holds.
func waitFor(bound time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func startNode(t *testing.T, url, node string, ttl time.Duration, key []byte) (*Nodes, *Storage) {
	t.Helper()
	st, nc := newStorage(t, url, StorageOptions{Bucket: "nodes", Key: key})
	st.conn = &Conn{nc: nc}
	n, err := st.StartNodes(testCtx(t), NodeOptions{Node: node, Advertise: "http://127.0.0.1:1/" + node, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n, st
}

// rawNodes is the registry bucket as a NATS user without the cluster key
// sees it.
func rawNodes(t *testing.T, url string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(testCtx(t), "nodes_nodes")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// Nodes see each other through the registry, and a node that stops
// heartbeating (its process died: its NATS connection is gone, nothing
// deleted its entry) is known dead within the TTL; one that closes its
// registry is known gone at once.
func TestNodesSeeEachOtherAndTheDead(t *testing.T) {
	url := startNATS(t)
	a, _ := startNode(t, url, "a", time.Second, nil)
	b, stB := startNode(t, url, "b", time.Second, nil)
	c, _ := startNode(t, url, "c", time.Second, nil)
	if !waitFor(10*time.Second, func() bool {
		_, ab := a.Lookup("b")
		_, ac := a.Lookup("c")
		_, ba := b.Lookup("a")
		return ab && ac && ba
	}) {
		t.Fatal("the nodes did not see each other within 10s")
	}
	if addr, _ := a.Lookup("b"); addr != "http://127.0.0.1:1/b" {
		t.Fatalf("a sees b at %q", addr)
	}
	if _, self := a.Lookup("a"); self {
		t.Fatal("a node's own entry is in its view")
	}
	// b dies: its connection closes, its heartbeats stop, its entry stays.
	stB.conn.nc.Close()
	killed := time.Now()
	if !waitFor(10*time.Second, func() bool { _, alive := a.Lookup("b"); return !alive }) {
		t.Fatal("a still takes b for alive 10s after b died")
	}
	t.Logf("b known dead %v after it died (TTL 1s)", time.Since(killed).Round(time.Millisecond))
	// c closes: its entry goes at once.
	c.Close()
	if !waitFor(10*time.Second, func() bool { _, alive := a.Lookup("c"); return !alive }) {
		t.Fatal("a still takes c for alive after c closed")
	}
	if _, alive := a.Lookup("nosuch"); alive {
		t.Fatal("a node never registered is alive")
	}
}

// A NATS user without the cluster key cannot add a node, move a node's
// entry under another id, or put back an old entry of a dead node; a node
// with another cluster key is not seen.
func TestNodesRefuseForgedEntries(t *testing.T) {
	url := startNATS(t)
	a, _ := startNode(t, url, "a", time.Second, nil)
	b, _ := startNode(t, url, "b", time.Second, nil)
	if !waitFor(10*time.Second, func() bool { _, ok := a.Lookup("b"); return ok }) {
		t.Fatal("a did not see b")
	}
	kv := rawNodes(t, url)
	ctx := testCtx(t)
	entry, err := kv.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	old := entry.Value()
	junk := make([]byte, 64)
	_, _ = rand.Read(junk)
	if _, err := kv.Put(ctx, "evil", junk); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "moved", old); err != nil { // b's sealed entry under another id
		t.Fatal(err)
	}
	otherKey := make([]byte, KeySize)
	_, _ = rand.Read(otherKey)
	startNode(t, url, "other", time.Second, otherKey)

	// b closes, and after more than a TTL its old entry is put back.
	b.Close()
	if !waitFor(10*time.Second, func() bool { _, alive := a.Lookup("b"); return !alive }) {
		t.Fatal("a still takes b for alive after b closed")
	}
	time.Sleep(1500 * time.Millisecond) // older than the TTL: what a replay of it is
	if _, err := kv.Put(ctx, "b", old); err != nil {
		t.Fatal(err)
	}
	// A barrier: a node that registers after the forgeries is seen once
	// a's watch has passed them all.
	startNode(t, url, "late", time.Second, nil)
	if !waitFor(10*time.Second, func() bool { _, ok := a.Lookup("late"); return ok }) {
		t.Fatal("a did not see the late node")
	}
	for _, id := range []string{"evil", "moved", "other", "b"} {
		if addr, alive := a.Lookup(id); alive {
			t.Errorf("a takes %q for alive at %q: a forged, moved, foreign or replayed entry", id, addr)
		}
	}
}

func TestCheckNodeID(t *testing.T) {
	for _, ok := range []string{"a", "gw-1", "node_2.internal", strings.Repeat("x", MaxNodeIDLen)} {
		if err := CheckNodeID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", ".a", "a/b", "a b", "a*", "a>", "é", strings.Repeat("x", MaxNodeIDLen+1)} {
		if err := CheckNodeID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A registry is refused without what it needs.
func TestNodesOptions(t *testing.T) {
	url := startNATS(t)
	st, _ := newStorage(t, url, StorageOptions{Bucket: "opts"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, o := range []NodeOptions{
		{Node: "", Advertise: "http://127.0.0.1:1"},
		{Node: "a/b", Advertise: "http://127.0.0.1:1"},
		{Node: "a"},
		{Node: "a", Advertise: "http://127.0.0.1:1", TTL: 10 * time.Millisecond},
	} {
		if n, err := st.StartNodes(ctx, o); err == nil {
			n.Close()
			t.Errorf("%+v accepted", o)
		}
	}
}

// Two processes heartbeating under one node id (a copied config) are told
// apart by their instance, and each logs that the other is there.
func TestNodesDuplicateIDIsLogged(t *testing.T) {
	url := startNATS(t)
	logs := &recordLog{}
	for _, inst := range []string{"one", "two"} {
		st, nc := newStorage(t, url, StorageOptions{Bucket: "nodes"})
		st.conn = &Conn{nc: nc}
		n, err := st.StartNodes(testCtx(t), NodeOptions{Node: "gw-1", Advertise: "http://127.0.0.1:1", TTL: time.Second, Logger: slog.New(logs), instance: inst})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
	}
	if !waitFor(10*time.Second, func() bool {
		for _, m := range logs.all() {
			if strings.Contains(m, "another process heartbeats under this node's id") && strings.Contains(m, "node=gw-1") {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no duplicate logged: %v", logs.all())
	}
}

// A config reload onto other NATS settings opens a second registry for
// the node before the first closes: closing the first leaves the entry
// the second wrote, so the node is never gone for the others.
func TestNodesCloseLeavesANewerRegistrysEntry(t *testing.T) {
	url := startNATS(t)
	old, _ := startNode(t, url, "gw-1", time.Second, nil)
	newer, _ := startNode(t, url, "gw-1", time.Second, nil)
	old.Close()
	kv := rawNodes(t, url)
	e, err := kv.Get(testCtx(t), "gw-1")
	if err != nil {
		t.Fatalf("the newer registry's entry is gone after the old one closed: %v", err)
	}
	if e.Revision() < newer.lastRev.Load() {
		t.Fatalf("the entry is at revision %d, before the newer registry's %d", e.Revision(), newer.lastRev.Load())
	}
	// The newer one, closing last, removes it.
	newer.Close()
	if _, err := kv.Get(testCtx(t), "gw-1"); err == nil {
		t.Fatal("the entry outlived the last registry of its node")
	}
}

// What a node serves is in its sealed entry: AliveServing lists a node for
// a service once it serves it, and no longer once it stops.
func TestNodesServices(t *testing.T) {
	url := startNATS(t)
	a, _ := startNode(t, url, "a", time.Second, nil)
	b, _ := startNode(t, url, "b", time.Second, nil)
	if !waitFor(10*time.Second, func() bool { return len(a.Alive()) == 1 }) {
		t.Fatal("a never saw b")
	}
	if got := a.AliveServing("sessions"); len(got) != 0 {
		t.Fatalf("b serves nothing yet, a lists %v", got)
	}
	stop := b.Serve("sessions")
	if !waitFor(10*time.Second, func() bool { return len(a.AliveServing("sessions")) == 1 }) {
		t.Fatal("a never saw that b serves sessions")
	}
	if got := a.AliveServing("other"); len(got) != 0 {
		t.Fatalf("b serves sessions only, a lists it for other: %v", got)
	}
	stop()
	if !waitFor(10*time.Second, func() bool { return len(a.AliveServing("sessions")) == 0 }) {
		t.Fatal("a still lists b for sessions after b stopped serving them")
	}
	if len(a.Alive()) != 1 {
		t.Fatal("b stopped serving sessions and left the registry")
	}
}
