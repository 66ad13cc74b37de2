package clustersessions_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// link is the link both the engines and the directory's readers make.
func link(id, base string) string { return base + "/session/" + id }

const base = "http://127.0.0.1:9"

func ids(list []sessions.SessionView) []string {
	out := make([]string, len(list))
	for i, v := range list {
		out[i] = v.SessionID
	}
	return out
}

// list and pending on one replica show the sessions and interactions of
// the others from the directory at once, after the verb or event that made
// them, with the engine's rule of who sees what.
func TestListAndPendingFromTheDirectory(t *testing.T) {
	url := startNATS(t)
	p := &peers{alive: map[string]bool{}}
	cfg := nodeConfig{link: link}
	a := startNodeWith(t, url, "gw-a", p, cfg)
	b := startNodeWith(t, url, "gw-b", p, cfg)
	c := startNodeWith(t, url, "gw-c", p, cfg)
	sam, eve := p.owner(t, "sam"), p.owner(t, "eve")
	samsOtherToken := sessions.Owner{TokenID: "tok-sam-2", TokenName: "sam-2", ID: sam.OwnerID()}
	shared := sessions.Owner{TokenID: "tok-ops", TokenName: "ops", OtherSessions: sessions.AccessRead, OtherInteractions: sessions.AccessRead}
	anyone := sessions.Owner{TokenID: "tok-root", TokenName: "root", OtherSessions: sessions.AccessAll, OtherInteractions: sessions.AccessAll}

	ca, err := a.cs.Create(ctxT(t), sam, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "hello", Base: base})
	if err != nil {
		t.Fatal(err)
	}
	// At once, on every other replica: Create returned after the entry
	// was written, and list waits until the directory has it.
	for _, n := range []*node{b, c} {
		list, partial := n.cs.List(sam, 10)
		if len(list) != 1 || partial || list[0].SessionID != ca.SessionID || list[0].Unreachable || !list[0].Worker || list[0].Foreign {
			t.Fatalf("list on %s right after create on gw-a: %+v (partial %v)", n.id, list, partial)
		}
		if list[0].Link != ca.Link || ca.Link == "" {
			t.Fatalf("link on %s: %q; gw-a's engine gave %q", n.id, list[0].Link, ca.Link)
		}
	}
	settle(t, a, sam, ca.SessionID)
	want, err := a.engine.Read(sam, ca.SessionID, false)
	if err != nil {
		t.Fatal(err)
	}
	list, _ := b.cs.List(sam, 10)
	if got := list[0]; got.State != want.State || got.LastMessage != want.LastMessage || got.Turns != want.Turns || !got.Updated.Equal(want.Updated) || got.Title != want.Title || got.Cwd != want.Cwd {
		t.Fatalf("gw-b lists %+v; gw-a's engine reads %+v", got, want)
	}

	// Who sees what is the engine's rule, on every replica.
	for _, n := range []*node{a, b, c} {
		if list, _ := n.cs.List(eve, 10); len(list) != 0 {
			t.Fatalf("eve lists sam's session on %s: %+v", n.id, list)
		}
		if list, _ := n.cs.List(samsOtherToken, 10); len(list) != 1 || list[0].Worker || list[0].Foreign {
			t.Fatalf("another token of sam's lists on %s: %+v; want the session, not worker, not foreign", n.id, list)
		}
		for _, o := range []sessions.Owner{shared, anyone} {
			if list, _ := n.cs.List(o, 10); len(list) != 1 || !list[0].Foreign || list[0].Worker {
				t.Fatalf("%s (reaches others' sessions) lists on %s: %+v; want sam's, foreign", o.TokenName, n.id, list)
			}
		}
	}

	// Sessions of every node, in the engine's order.
	cb := create(t, b, sam, "hello")
	cc := create(t, c, sam, "approve: ship it")
	order := []string{cc.SessionID, cb.SessionID, ca.SessionID}
	for _, n := range []*node{a, b, c} {
		if list, partial := n.cs.List(sam, 10); !slices.Equal(ids(list), order) || partial {
			t.Fatalf("list on %s: %v (partial %v); want %v", n.id, ids(list), partial, order)
		}
		if list, partial := n.cs.List(sam, 2); !slices.Equal(ids(list), order[:2]) || !partial {
			t.Fatalf("list of 2 on %s: %v (partial %v); want %v, partial", n.id, ids(list), partial, order[:2])
		}
	}

	// pending on another replica has the interaction as soon as the event
	// that tells of it arrives.
	ev := eventFor(t, a, cc.SessionID, sessions.EventNeedsAttention)
	pending, err := a.cs.Pending(sam, "")
	if err != nil || len(pending) != 1 || pending[0].RequestID != ev.RequestID || pending[0].SessionID != cc.SessionID || pending[0].Unreachable {
		t.Fatalf("pending on gw-a right after the event: %+v, %v (event %+v)", pending, err, ev)
	}
	onC, _ := c.engine.Pending(sam, "")
	if len(onC) != 1 || string(onC[0].Payload) != string(pending[0].Payload) || onC[0].Summary != pending[0].Summary || onC[0].Kind != pending[0].Kind {
		t.Fatalf("gw-a's pending %+v; gw-c's engine has %+v", pending, onC)
	}
	for _, o := range []sessions.Owner{eve, {TokenID: "tok-ops2", OtherSessions: sessions.AccessRead}} {
		if got, err := b.cs.Pending(o, ""); err != nil || len(got) != 0 {
			t.Fatalf("%s's pending on gw-b: %+v, %v; want none", o.TokenID, got, err)
		}
	}
	for _, o := range []sessions.Owner{shared, anyone, samsOtherToken} {
		if got, err := b.cs.Pending(o, ""); err != nil || len(got) != 1 {
			t.Fatalf("%s's pending on gw-b: %+v, %v; want sam's one", o.TokenID, got, err)
		}
	}
	// Answered through gw-b: gone from pending on gw-a at once.
	if err := b.cs.Answer(ctxT(t), sam, ev.RequestID, sessions.Answer{Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	if got, err := a.cs.Pending(sam, ""); err != nil || len(got) != 0 {
		t.Fatalf("pending on gw-a after the answer: %+v, %v", got, err)
	}
}

// A session whose node is down is listed from what its node last wrote,
// unreachable, and so are its interactions; the node, restarted,
// rewrites its entries and deletes those of sessions and interactions it
// no longer has.
func TestDirectoryOfANodeThatIsDownAndRestarts(t *testing.T) {
	a, b, p, url := twoNodes(t)
	sam := p.owner(t, "sam")
	c1 := create(t, a, sam, "hello")
	settle(t, a, sam, c1.SessionID)
	c2 := create(t, a, sam, "approve: ship it")
	ev := eventFor(t, b, c2.SessionID, sessions.EventNeedsAttention)

	// What a crash leaves: entries no one takes back, and one of a
	// session the node dropped while its delete did not reach NATS.
	a.cs.Close()
	p.mu.Lock()
	p.alive["gw-a"] = false
	p.mu.Unlock()
	if err := a.engine.Close(); err != nil {
		t.Fatal(err)
	}
	st := keyedStorage(t, url, key)
	gone := "ses_" + strings.ToLower(rand.Text()[:16]) + ".gw-a"
	storeJSON(t, st, "zidane/nodes/gw-a/directory/sessions/"+gone, map[string]any{
		"view": sessions.SessionView{SessionID: gone, Title: "dropped", State: sessions.StateEnded, Created: time.Now()}, "owner": sam.OwnerID()})

	list, partial := b.cs.List(sam, 10)
	if got := ids(list); partial || !slices.Equal(got, []string{gone, c2.SessionID, c1.SessionID}) {
		t.Fatalf("list on gw-b with gw-a down: %v (partial %v)", got, partial)
	}
	for _, v := range list {
		if !v.Unreachable {
			t.Fatalf("a session of gw-a, which is down, is not marked unreachable: %+v", v)
		}
	}
	if list[1].State != sessions.StateBlocked {
		t.Fatalf("gw-a's blocked session is listed %s", list[1].State)
	}
	pending, err := b.cs.Pending(sam, "")
	if err != nil || len(pending) != 1 || pending[0].RequestID != ev.RequestID || !pending[0].Unreachable {
		t.Fatalf("pending on gw-b with gw-a down: %+v, %v", pending, err)
	}
	if err := b.cs.Answer(ctxT(t), sam, ev.RequestID, sessions.Answer{Decision: "allow"}); !errors.Is(err, sessions.ErrUnreachable) {
		t.Fatalf("an answer to an interaction of a node that is down: %v", err)
	}

	// Back under the same id: it has both sessions (resumed), no
	// interaction, and never had the dropped one.
	startNode(t, url, "gw-a", p)
	list, partial = b.cs.List(sam, 10)
	if got := ids(list); partial || !slices.Equal(got, []string{c2.SessionID, c1.SessionID}) {
		t.Fatalf("list on gw-b once gw-a is back: %v (partial %v)", got, partial)
	}
	for _, v := range list {
		if v.Unreachable || v.State == sessions.StateBlocked {
			t.Fatalf("gw-a is back, and lists %+v", v)
		}
	}
	if pending, err := b.cs.Pending(sam, ""); err != nil || len(pending) != 0 {
		t.Fatalf("pending on gw-b once gw-a is back: %+v, %v; its interactions ended with its process", pending, err)
	}
}

// A session the engine drops (past MaxSessions) leaves the directory.
func TestForgottenSessionLeavesTheDirectory(t *testing.T) {
	url := startNATS(t)
	p := &peers{alive: map[string]bool{}}
	a := startNodeWith(t, url, "gw-a", p, nodeConfig{limits: sessions.Limits{MaxSessions: 2, MaxSessionsPerToken: 10}})
	b := startNode(t, url, "gw-b", p)
	sam := p.owner(t, "sam")
	dead := create(t, a, sam, "crash")
	if v := settle(t, a, sam, dead.SessionID); v.State != sessions.StateError {
		t.Fatalf("the crashing session is %s", v.State)
	}
	live := create(t, a, sam, "hello")
	if list, _ := b.cs.List(sam, 10); !slices.Equal(ids(list), []string{live.SessionID, dead.SessionID}) || list[1].State != sessions.StateError {
		t.Fatalf("list on gw-b: %+v", list)
	}
	third := create(t, a, sam, "hello")
	if _, err := a.engine.Read(sam, dead.SessionID, false); !errors.Is(err, sessions.ErrNoSession) {
		t.Fatalf("gw-a did not drop the ended session: %v", err)
	}
	if list, _ := b.cs.List(sam, 10); !slices.Equal(ids(list), []string{third.SessionID, live.SessionID}) {
		t.Fatalf("list on gw-b after gw-a dropped %s: %v", dead.SessionID, ids(list))
	}
}

// An entry counts only as the value its node sealed for its key: a NATS
// user without the cluster key cannot move one to another key (another
// session's, another node's) nor make one, and a holder of the key cannot
// put a session of one node under another's prefix.
func TestDirectoryEntriesCannotBeForgedOrMoved(t *testing.T) {
	a, b, p, url := twoNodes(t)
	sam := p.owner(t, "sam")
	anyone := sessions.Owner{TokenID: "tok-root", OtherSessions: sessions.AccessAll, OtherInteractions: sessions.AccessAll}
	c := create(t, a, sam, "approve: ship it")
	ev := eventFor(t, b, c.SessionID, sessions.EventNeedsAttention)

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctxT(t), "zidane")
	if err != nil {
		t.Fatal(err)
	}
	raw := func(key string) []byte {
		e, err := kv.Get(ctxT(t), kvKey(key))
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return e.Value()
	}
	sessionValue := raw("zidane/nodes/gw-a/directory/sessions/" + c.SessionID)
	pendingValue := raw("zidane/nodes/gw-a/directory/pending/" + ev.RequestID)
	other := func(node string) string { return "ses_" + strings.ToLower(rand.Text()[:16]) + "." + node }
	otherReq := func(node string) string { return "req_" + strings.ToLower(rand.Text()[:16]) + "." + node }
	// Without the key: sealed values copied to other keys, and made up.
	moved := map[string][]byte{
		"zidane/nodes/gw-a/directory/sessions/" + other("gw-a"):       sessionValue, // another session of the same node
		"zidane/nodes/gw-b/directory/sessions/" + c.SessionID:         sessionValue, // the same session under another node
		"zidane/nodes/gw-c/directory/sessions/" + other("gw-c"):       sessionValue, // a node that never ran
		"zidane/nodes/gw-a/directory/pending/" + otherReq("gw-a"):     pendingValue,
		"zidane/nodes/gw-a/directory/sessions/" + ev.RequestID:        pendingValue, // a pending entry as a session's
		"zidane/nodes/gw-a/directory/pending/" + c.SessionID:          sessionValue,
		"zidane/nodes/gw-a/directory/sessions/" + other("gw-a") + "x": []byte(`{"view":{"sessionId":"x"},"owner":"tok-sam"}`),
		"zidane/nodes/gw-a/directory/sessions/" + other("gw-a"):       append([]byte{0}, make([]byte, 64)...),
	}
	for k, v := range moved {
		if _, err := kv.Put(ctxT(t), kvKey(k), v); err != nil {
			t.Fatal(err)
		}
	}
	// With another cluster key: sealed, but not under this cluster's.
	strange := make([]byte, cluster.KeySize)
	_, _ = rand.Read(strange)
	foreign := other("gw-a")
	storeJSON(t, keyedStorage(t, url, strange), "zidane/nodes/gw-a/directory/sessions/"+foreign, map[string]any{
		"view": sessions.SessionView{SessionID: foreign, Created: time.Now()}, "owner": sam.OwnerID()})
	// With the key, but a session or an interaction of one node under
	// another's prefix, or an entry that names no owner.
	st := keyedStorage(t, url, key)
	wrongNode := other("gw-a")
	storeJSON(t, st, "zidane/nodes/gw-b/directory/sessions/"+wrongNode, map[string]any{
		"view": sessions.SessionView{SessionID: wrongNode, Created: time.Now()}, "owner": sam.OwnerID()})
	wrongReq := otherReq("gw-a")
	storeJSON(t, st, "zidane/nodes/gw-b/directory/pending/"+wrongReq, map[string]any{
		"interaction": sessions.Interaction{RequestID: wrongReq, SessionID: c.SessionID}, "owner": sam.OwnerID()})
	mixedReq := otherReq("gw-b")
	storeJSON(t, st, "zidane/nodes/gw-b/directory/pending/"+mixedReq, map[string]any{
		"interaction": sessions.Interaction{RequestID: mixedReq, SessionID: c.SessionID}, "owner": sam.OwnerID()})
	ownerless := other("gw-b")
	storeJSON(t, st, "zidane/nodes/gw-b/directory/sessions/"+ownerless, map[string]any{
		"view": sessions.SessionView{SessionID: ownerless, Created: time.Now()}})
	// The directory is read up to what was written last: all of the above.
	for _, n := range []*node{a, b} {
		list, partial := n.cs.List(anyone, 100)
		if partial || !slices.Equal(ids(list), []string{c.SessionID}) {
			t.Fatalf("list on %s after the forgeries: %v (partial %v); want only %s", n.id, ids(list), partial, c.SessionID)
		}
		pending, err := n.cs.Pending(anyone, "")
		if err != nil || len(pending) != 1 || pending[0].RequestID != ev.RequestID {
			t.Fatalf("pending on %s after the forgeries: %+v, %v; want only %s", n.id, pending, err, ev.RequestID)
		}
	}
}

// With NATS away, list and pending give what this node's engine holds,
// and list says it is partial.
func TestListWhenNATSIsAway(t *testing.T) {
	ns := startNATSServer(t)
	url := ns.ClientURL()
	p := &peers{alive: map[string]bool{}}
	a := startNode(t, url, "gw-a", p)
	b := startNode(t, url, "gw-b", p)
	sam := p.owner(t, "sam")
	ca := create(t, a, sam, "hello")
	cb := create(t, b, sam, "hello")
	settle(t, b, sam, cb.SessionID)
	if list, partial := b.cs.List(sam, 10); partial || !slices.Equal(ids(list), []string{cb.SessionID, ca.SessionID}) {
		t.Fatalf("list on gw-b: %v (partial %v)", ids(list), partial)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	list, partial := b.cs.List(sam, 10)
	if !partial || !slices.Equal(ids(list), []string{cb.SessionID}) {
		t.Fatalf("list on gw-b with NATS away: %v (partial %v); want gw-b's own, partial", ids(list), partial)
	}
	if pending, err := b.cs.Pending(sam, ""); err != nil || len(pending) != 0 {
		t.Fatalf("pending on gw-b with NATS away: %+v, %v", pending, err)
	}
}

// BenchmarkListFromTheDirectory measures list on one replica of three
// whose engines hold 200 sessions between them: go test -run '^$' -bench
// ListFromTheDirectory ./clustersessions/
func BenchmarkListFromTheDirectory(b *testing.B) {
	url := startNATS(b)
	p := &peers{alive: map[string]bool{}}
	cfg := nodeConfig{limits: sessions.Limits{MaxAgents: 4, MaxSessionsPerToken: 1000}}
	nodes := []*node{startNodeWith(b, url, "gw-a", p, cfg), startNodeWith(b, url, "gw-b", p, cfg), startNodeWith(b, url, "gw-c", p, cfg)}
	sam := p.owner(b, "sam")
	dir := b.TempDir()
	for i := range 200 {
		n := nodes[i%3]
		c, err := n.cs.Create(ctxT(b), sam, sessions.CreateRequest{Cwd: dir, Prompt: fmt.Sprintf("hello %d", i)})
		if err != nil {
			b.Fatal(err)
		}
		settle(b, n, sam, c.SessionID)
	}
	if list, partial := nodes[0].cs.List(sam, 100); len(list) != 100 || !partial {
		b.Fatalf("list: %d sessions, partial %v", len(list), partial)
	}
	b.ResetTimer()
	for b.Loop() {
		nodes[0].cs.List(sam, 100)
	}
}

// keyedStorage opens the cluster's storage with clusterKey, as another
// process would.
func keyedStorage(t testing.TB, url string, clusterKey []byte) *cluster.Storage {
	t.Helper()
	conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{url}, Name: "writer"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	st, err := conn.Storage(ctxT(t), cluster.StorageOptions{Key: clusterKey, Owner: "writer"})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func storeJSON(t testing.TB, st *cluster.Storage, key string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Store(ctx, key, b); err != nil {
		t.Fatal(err)
	}
}

// kvKey is the KV key of a storage key, as package cluster writes it: one
// token per path segment, each byte outside [-_A-Za-z0-9] as =XX.
func kvKey(key string) string {
	var b strings.Builder
	for i, seg := range strings.Split(key, "/") {
		if i > 0 {
			b.WriteByte('.')
		}
		for j := 0; j < len(seg); j++ {
			c := seg[j]
			if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
				b.WriteByte(c)
			} else {
				fmt.Fprintf(&b, "=%02X", c)
			}
		}
	}
	return b.String()
}
