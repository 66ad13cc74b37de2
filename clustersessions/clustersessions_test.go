package clustersessions_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/clustersessions"
	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
	"github.com/Tahul/caddy-zidane-mcp/mcpendpoint"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessionpage"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
	"github.com/Tahul/caddy-zidane-mcp/sessions/demoagent"
)

func TestMain(m *testing.M) {
	if os.Getenv("CLUSTERSESSIONS_DEMOAGENT") == "1" {
		os.Exit(demoagent.Main(context.Background()))
	}
	os.Exit(m.Run())
}

func startNATS(t testing.TB) string {
	t.Helper()
	return startNATSServer(t).ClientURL()
}

func startNATSServer(t testing.TB) *server.Server {
	t.Helper()
	return natstest.JetStream(t)
}

var key = func() []byte {
	k := make([]byte, cluster.KeySize)
	_, _ = rand.Read(k)
	return k
}()

// node is one replica: its engine and the cluster's sessions on it.
type node struct {
	id     string
	engine *sessions.Engine
	cs     *clustersessions.Sessions
	tokens *policy.TokenStore  // its view of the gateway's tokens
	events chan sessions.Event // what its subscribers get
}

type peers struct {
	mu    sync.Mutex
	alive map[string]bool
	url   string // the cluster's NATS

	ownersMu sync.Mutex
	tokens   *policy.TokenStore        // the gateway's tokens, as an operator creates them
	owners   map[string]sessions.Owner // by token name
}

// owner is the engine's Owner for the token named name (scope chat) as
// this cluster's edge authenticates it, the token created on first use.
func (p *peers) owner(t testing.TB, name string) sessions.Owner {
	t.Helper()
	p.ownersMu.Lock()
	defer p.ownersMu.Unlock()
	if o, ok := p.owners[name]; ok {
		return o
	}
	if p.tokens == nil {
		p.mu.Lock()
		url := p.url
		p.mu.Unlock()
		tokens, err := policy.OpenTokenStore(ctxT(t), keyedStorage(t, url, key))
		if err != nil {
			t.Fatal(err)
		}
		p.tokens, p.owners = tokens, map[string]sessions.Owner{}
	}
	secret, _, err := p.tokens.Create(ctxT(t), policy.TokenSpec{Name: name, Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := p.tokens.Check(secret, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	o := mcpendpoint.OwnerOf(pr, false)
	o.MCPSession = "mcp-" + name
	p.owners[name] = o
	return o
}

func (p *peers) of(self string) func() []string {
	return func() []string {
		p.mu.Lock()
		defer p.mu.Unlock()
		var out []string
		for n, up := range p.alive {
			if up && n != self {
				out = append(out, n)
			}
		}
		return out
	}
}

func startNode(t *testing.T, url, id string, p *peers) *node {
	t.Helper()
	return startNodeWith(t, url, id, p, nodeConfig{})
}

// nodeConfig is what a test changes of a node.
type nodeConfig struct {
	limits sessions.Limits
	// link gives the engine and the directory's reader the same links.
	link func(id, base string) string
	// refused hears of the requests of other replicas the node refuses.
	refused func(clustersessions.Refusal)
}

// pages signs and checks the session pages' capabilities, with the key
// every replica derives from the cluster key.
var pages = func() *sessionpage.Signer {
	k, err := cluster.Derive(key, "session page links v1")
	if err == nil {
		var s *sessionpage.Signer
		if s, err = sessionpage.NewSignerKey(k, time.Hour); err == nil {
			return s
		}
	}
	panic(err)
}()

// resolver establishes the callers of other replicas' requests on a node
// whose token store is tokens, as the gateway's does for a sessions site
// with the default scopes: a session page's reader by its capability, any
// other by its credential.
func resolver(t testing.TB, tokens *policy.TokenStore) clustersessions.Resolver {
	scopes, err := policy.NewScopeMap(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	sites := []mcpendpoint.Site{{Authn: policy.Authenticator{Tokens: tokens}, Access: mcpendpoint.Access{Scopes: scopes}}}
	return func(ctx context.Context, c clustersessions.Caller, u clustersessions.Use) (sessions.Owner, error) {
		if c.TokenID == "" {
			return pages.ForwardedReader(c.Credential, u.ID, u.Tool, u.Verbs)
		}
		return mcpendpoint.ForwardedOwner(ctx, sites, c.TokenID, c.Scopes, c.Credential, u.Tool, u.Verbs, time.Now())
	}
}

func startNodeWith(t testing.TB, url, id string, p *peers, nc nodeConfig) *node {
	t.Helper()
	conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{url}, Name: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := conn.Storage(ctx, cluster.StorageOptions{Key: key, Owner: id})
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.url = url
	p.mu.Unlock()
	// The node's own view of the gateway's tokens, over the shared
	// storage: the ones created after it opened are loaded on a miss.
	tokens, err := policy.OpenTokenStore(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	engine, err := sessions.NewEngine(ctx, sessions.Config{
		Agents: map[string]sessions.AgentConfig{"demo": {Command: []string{exe}, Env: map[string]string{
			"CLUSTERSESSIONS_DEMOAGENT": "1", "GORACE": "atexit_sleep_ms=0"}}},
		DefaultAgent: "demo", Storage: st, Node: id, Limits: nc.limits, LinkFor: nc.link,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.Close() })
	cs, err := clustersessions.New(ctx, clustersessions.Options{Local: engine, Listings: engine, Node: id, Storage: st, Peers: p.of(id), Relay: engine.RelayEvent, LastEvent: engine.LastEventSeq, LinkFor: nc.link,
		Resolve: resolver(t, tokens), OnRefusal: nc.refused})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cs.Close)
	n := &node{id: id, engine: engine, cs: cs, tokens: tokens, events: make(chan sessions.Event, 100)}
	unsub := cs.Subscribe(func(ev sessions.Event) { n.events <- ev })
	t.Cleanup(unsub)
	p.mu.Lock()
	p.alive[id] = true
	p.mu.Unlock()
	return n
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func settle(t testing.TB, n *node, o sessions.Owner, id string) sessions.SessionView {
	t.Helper()
	for range 20 {
		v, err := n.cs.Wait(ctxT(t), o, id, 5*time.Second)
		if err != nil {
			t.Fatalf("wait %s on %s: %v", id, n.id, err)
		}
		if v.State != sessions.StateRunning {
			return v
		}
	}
	t.Fatalf("session %s still runs", id)
	return sessions.SessionView{}
}

// eventFor waits for n's subscribers to get an event of session id.
func eventFor(t *testing.T, n *node, id string, status sessions.EventStatus) sessions.Event {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev := <-n.events:
			if ev.SessionID == id && ev.Status == status {
				return ev
			}
		case <-timeout:
			t.Fatalf("node %s got no %s event of %s in 30s", n.id, status, id)
		}
	}
}

// Every verb works from a replica that does not run the session, with the
// owning engine's decisions (ownership, errors) as on a single node.
func TestEveryVerbFromAnotherReplica(t *testing.T) {
	a, b, p, _ := twoNodes(t)
	sam, eve := p.owner(t, "sam"), p.owner(t, "eve")

	c := create(t, a, sam, "hello")
	if sessions.NodeOf(c.SessionID) != "gw-a" {
		t.Fatalf("session %s is not gw-a's", c.SessionID)
	}
	if v := settle(t, b, sam, c.SessionID); v.State != sessions.StateIdle || v.LastMessage != "You said: hello" {
		t.Fatalf("read through gw-b: %+v", v)
	}
	if _, err := b.cs.Send(ctxT(t), sam, c.SessionID, "again"); err != nil {
		t.Fatalf("send through gw-b: %v", err)
	}
	settle(t, b, sam, c.SessionID)
	turns, err := b.cs.Transcript(sam, c.SessionID, 0, false)
	if err != nil || len(turns) != 2 || turns[1].Answer != "You said: again" {
		t.Fatalf("transcript through gw-b: %+v, %v", turns, err)
	}
	if mode, err := b.cs.Steer(ctxT(t), sam, c.SessionID, "go left"); err != nil || mode == "" {
		t.Fatalf("steer through gw-b: %q, %v", mode, err)
	}
	settle(t, b, sam, c.SessionID)

	// Another owner is refused by the owning engine, and the refusal is
	// the engine's error on the other replica too.
	if _, err := b.cs.Read(eve, c.SessionID, false); !errors.Is(err, sessions.ErrNotOwner) {
		t.Fatalf("eve reads sam's session through gw-b: %v", err)
	}
	if _, err := b.cs.Send(ctxT(t), eve, c.SessionID, "rm -rf"); !errors.Is(err, sessions.ErrNotOwner) {
		t.Fatalf("eve sends to sam's session through gw-b: %v", err)
	}
	if _, err := b.cs.Events(eve, sessions.EventFilter{SessionID: c.SessionID}); !errors.Is(err, sessions.ErrNotOwner) {
		t.Fatalf("eve's events of sam's session through gw-b: %v", err)
	}
	if err := b.cs.Cancel(ctxT(t), sam, c.SessionID); !errors.Is(err, sessions.ErrNotRunning) {
		t.Fatalf("cancel of an idle session through gw-b: %v", err)
	}
	// An id that names gw-b but that gw-b never made.
	if _, err := a.cs.Read(sam, "ses_aaaaaaaaaaaaaaaa.gw-b", false); !errors.Is(err, sessions.ErrNoSession) {
		t.Fatalf("an unknown session of gw-b through gw-a: %v", err)
	}

	// list on either replica shows both nodes' sessions, once each.
	cb := create(t, b, sam, "hi")
	settle(t, a, sam, cb.SessionID)
	for _, n := range []*node{a, b} {
		list, partial := n.cs.List(sam, 10)
		if len(list) != 2 || partial || list[0].SessionID != cb.SessionID || list[1].SessionID != c.SessionID {
			t.Fatalf("list on %s: %+v (partial %v)", n.id, list, partial)
		}
		if list, _ := n.cs.List(eve, 10); len(list) != 0 {
			t.Fatalf("eve lists sam's sessions on %s: %+v", n.id, list)
		}
		if list, partial := n.cs.List(sam, 1); len(list) != 1 || !partial || list[0].SessionID != cb.SessionID {
			t.Fatalf("list of 1 on %s: %+v (partial %v)", n.id, list, partial)
		}
	}

	// A node that is down (gone from the registry): a verb on its
	// sessions says so, and list still shows them, unreachable.
	a.cs.Close()
	p.mu.Lock()
	p.alive["gw-a"] = false
	p.mu.Unlock()
	if _, err := b.cs.Read(sam, c.SessionID, false); !errors.Is(err, sessions.ErrNoSession) || !errors.Is(err, sessions.ErrUnreachable) {
		t.Fatalf("read of a session whose node is down: %v", err)
	}
	if list, partial := b.cs.List(sam, 10); len(list) != 2 || partial || list[0].SessionID != cb.SessionID || list[0].Unreachable ||
		list[1].SessionID != c.SessionID || !list[1].Unreachable || list[1].LastMessage != "You said: go left" {
		t.Fatalf("list with a node down: %+v (partial %v); want both, gw-a's unreachable", list, partial)
	}
}

// Events are numbered by the stream: one sequence for the cluster, the
// same on every replica, and each replica's subscribers get every node's.
func TestEventsAreNumberedForTheCluster(t *testing.T) {
	a, b, p, url := twoNodes(t)
	sam := p.owner(t, "sam")
	ca := create(t, a, sam, "hello")
	evA := eventFor(t, b, ca.SessionID, sessions.EventDone)
	if ev := eventFor(t, a, ca.SessionID, sessions.EventDone); ev.Seq != evA.Seq {
		t.Fatalf("one event has seq %d on gw-a and %d on gw-b", ev.Seq, evA.Seq)
	}
	cb := create(t, b, sam, "hello")
	evB := eventFor(t, a, cb.SessionID, sessions.EventDone)
	if ev := eventFor(t, b, cb.SessionID, sessions.EventDone); ev.Seq != evB.Seq {
		t.Fatalf("one event has seq %d on gw-b and %d on gw-a", ev.Seq, evB.Seq)
	}
	if evB.Seq <= evA.Seq {
		t.Fatalf("gw-b's later event has seq %d, gw-a's earlier one %d", evB.Seq, evA.Seq)
	}
	if evA.Target != "mcp-sam" || evA.Owner != sam.OwnerID() {
		t.Fatalf("an event lost its target or owner on the way: %+v", evA)
	}
	for _, n := range []*node{a, b} {
		evs, err := n.cs.Events(sam, sessions.EventFilter{Status: sessions.EventDone})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 2 || evs[0].Seq != evB.Seq || evs[1].Seq != evA.Seq {
			t.Fatalf("events on %s: %+v; want seqs %d, %d", n.id, evs, evB.Seq, evA.Seq)
		}
		if evs, _ := n.cs.Events(sam, sessions.EventFilter{Since: evA.Seq}); len(evs) == 0 || evs[len(evs)-1].Seq <= evA.Seq {
			t.Fatalf("events since %d on %s: %+v", evA.Seq, n.id, evs)
		}
		if evs, _ := n.cs.Events(p.owner(t, "eve"), sessions.EventFilter{}); len(evs) != 0 {
			t.Fatalf("eve sees sam's events on %s: %+v", n.id, evs)
		}
	}
	// A node that starts late reads the log back, with the same numbers.
	c := startNode(t, url, "gw-c", p)
	evs, err := c.cs.Events(sam, sessions.EventFilter{Status: sessions.EventDone})
	for range 100 {
		if err != nil || len(evs) == 2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
		evs, err = c.cs.Events(sam, sessions.EventFilter{Status: sessions.EventDone})
	}
	if err != nil || len(evs) != 2 || evs[0].Seq != evB.Seq || evs[1].Seq != evA.Seq {
		t.Fatalf("events on a node started later: %+v, %v", evs, err)
	}
	select {
	case ev := <-c.events:
		t.Fatalf("a node started later pushed an old event again: %+v", ev)
	default:
	}
}

// Pending interactions of every node show on each; answers go to the
// interaction's node, where the first one wins.
func TestFirstAnswerWinsAcrossReplicas(t *testing.T) {
	a, b, p, _ := twoNodes(t)
	sam := p.owner(t, "sam")
	c := create(t, a, sam, "approve: ship it")
	ev := eventFor(t, b, c.SessionID, sessions.EventNeedsAttention)
	var pending []sessions.Interaction
	var err error
	for range 100 {
		if pending, err = b.cs.Pending(sam, ""); err != nil || len(pending) == 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || len(pending) != 1 || pending[0].RequestID != ev.RequestID || sessions.NodeOf(ev.RequestID) != "gw-a" {
		t.Fatalf("pending on gw-b: %+v, %v (event %+v)", pending, err, ev)
	}
	if mine, err := b.cs.Pending(sam, c.SessionID); err != nil || len(mine) != 1 {
		t.Fatalf("the session's pending on gw-b: %+v, %v", mine, err)
	}
	if theirs, err := b.cs.Pending(p.owner(t, "eve"), ""); err != nil || len(theirs) != 0 {
		t.Fatalf("eve's pending on gw-b: %+v, %v", theirs, err)
	}
	if err := b.cs.Answer(ctxT(t), p.owner(t, "eve"), ev.RequestID, sessions.Answer{Decision: "allow"}); !errors.Is(err, sessions.ErrNotOwner) {
		t.Fatalf("eve answers sam's interaction through gw-b: %v", err)
	}
	// Two answers at once, one through each replica.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, n := range []*node{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.cs.Answer(ctxT(t), sam, ev.RequestID, sessions.Answer{Decision: "allow"})
		}()
	}
	wg.Wait()
	won, lost := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, sessions.ErrAlreadyAnswered):
			lost++
		default:
			t.Fatalf("an answer failed: %v", err)
		}
	}
	if won != 1 || lost != 1 {
		t.Fatalf("%d answers won and %d lost; want 1 and 1", won, lost)
	}
	if v := settle(t, b, sam, c.SessionID); v.State != sessions.StateIdle || !strings.Contains(v.LastMessage, "ship it") {
		t.Fatalf("after the answer: %+v", v)
	}
}

// An orchestrator subscribed to its workers gets their events as prompts
// wherever they run: a worker its token created on another node.
func TestOrchestratorHearsWorkersOnOtherNodes(t *testing.T) {
	a, b, p, _ := twoNodes(t)
	sam := p.owner(t, "sam")
	orch := create(t, a, sam, "orchestrate")
	settle(t, a, sam, orch.SessionID)
	a.engine.Relay("tok-child", orch.SessionID)
	child := sessions.Owner{TokenID: "tok-child", ID: sam.OwnerID(), MCPSession: "mcp-child"}
	w := create(t, b, child, "work")
	done := eventFor(t, a, w.SessionID, sessions.EventDone)
	for range 100 {
		turns, err := a.cs.Transcript(sam, orch.SessionID, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, turn := range turns {
			if strings.Contains(turn.Prompt, `<session-event session="`+w.SessionID+`" status="done" seq="`+strconv.FormatInt(done.Seq, 10)+`"`) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the orchestrator on gw-a never got the event of its worker %s on gw-b", w.SessionID)
}

// One owner's waits on a node's sessions, from another replica, hold at
// most maxWaitsPerOwner of the node's request slots, so another owner's
// verbs go on; and waits whose callers gave up end on the node, so the
// owner may wait again.
func TestWaitsFromAnotherReplicaAreBounded(t *testing.T) {
	a, b, p, _ := twoNodes(t)
	sam, eve := p.owner(t, "sam"), p.owner(t, "eve")
	long := create(t, a, sam, "sleep: 5m")
	hers := create(t, a, eve, "hello")
	settle(t, b, eve, hers.SessionID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	refusedOwner := make(chan error, 300)
	var wg sync.WaitGroup
	for range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.cs.Wait(ctx, sam, long.SessionID, 50*time.Second); err != nil && strings.Contains(err.Error(), "waits of this owner") {
				refusedOwner <- err
			}
		}()
	}
	select {
	case <-refusedOwner:
	case <-time.After(30 * time.Second):
		t.Fatal("300 waits of one owner were all taken")
	}
	if _, err := b.cs.Read(eve, hers.SessionID, false); err != nil {
		t.Fatalf("eve's read of her own session through gw-b while sam waits: %v", err)
	}
	cancel()
	wg.Wait()
	// The node hears that the callers gave up: sam may wait again.
	for i := 0; ; i++ {
		short, stop := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := b.cs.Wait(short, sam, long.SessionID, time.Second)
		stop()
		if err == nil {
			break
		}
		if i == 100 || !strings.Contains(err.Error(), "waits of this owner") {
			t.Fatalf("a wait after the others were abandoned: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A node that restarts with fewer events stored than it published (a
// crash before the engine's asynchronous events.json write landed,
// simulated by deleting it) numbers its next events again from there: they
// are another process's, which the stream's readers and its duplicate
// window tell apart, so every replica, itself included, takes them.
func TestEventsOfANodeRestartedWithFewerStoredEvents(t *testing.T) {
	a, b, p, url := twoNodes(t)
	sam := p.owner(t, "sam")
	c1 := create(t, a, sam, "hello")
	eventFor(t, b, c1.SessionID, sessions.EventDone)
	settle(t, a, sam, c1.SessionID)
	a.cs.Close()
	if err := a.engine.Close(); err != nil {
		t.Fatal(err)
	}
	// What a crash leaves: the stream has the events, storage not.
	conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{url}, Name: "crash"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := conn.Storage(ctxT(t), cluster.StorageOptions{Key: key, Owner: "crash"})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctxT(t), "zidane/nodes/gw-a/sessions/"+c1.SessionID+"/events.json"); err != nil {
		t.Fatal(err)
	}
	// A raw subscriber sees every publish to the stream's subject.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	published := make(chan struct{}, 100)
	sub, err := nc.Subscribe("zidane.stream.>", func(*nats.Msg) { published <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	a2 := startNode(t, url, "gw-a", p)
	c2 := create(t, a2, sam, "hello")
	settle(t, a2, sam, c2.SessionID)
	local, err := a2.engine.Events(sam, sessions.EventFilter{SessionID: c2.SessionID})
	if err != nil || len(local) == 0 {
		t.Fatalf("gw-a's engine has no events of %s: %v", c2.SessionID, err)
	}
	for range local {
		select {
		case <-published:
		case <-time.After(30 * time.Second):
			t.Fatal("gw-a did not publish its events")
		}
	}
	// A later event on gw-b comes after gw-a's in the stream.
	c3 := create(t, b, sam, "hello")
	eventFor(t, b, c3.SessionID, sessions.EventDone)
	eventFor(t, a2, c3.SessionID, sessions.EventDone)
	for _, n := range []*node{b, a2} {
		if evs, _ := n.cs.Events(sam, sessions.EventFilter{SessionID: c2.SessionID}); len(evs) == 0 {
			t.Errorf("%s's log holds none of the %d events of gw-a's new session %s (engine numbers %d..%d)", n.id, len(local), c2.SessionID, local[len(local)-1].Seq, local[0].Seq)
		}
	}
}

// A prompt the owning node accepts (under MaxPromptBytes, 256 KiB) may grow
// past NATS's max payload once JSON-escaped: through another replica it is
// refused with what is wrong, not as a session that is gone.
func TestLargePromptFromAnotherReplica(t *testing.T) {
	a, b, p, _ := twoNodes(t)
	sam := p.owner(t, "sam")
	c := create(t, a, sam, "hello")
	settle(t, a, sam, c.SessionID)
	prompt := strings.Repeat("<", 200<<10)
	if _, err := a.cs.Send(ctxT(t), sam, c.SessionID, prompt); err != nil {
		t.Fatalf("the owning node refused the prompt: %v", err)
	}
	settle(t, a, sam, c.SessionID)
	if _, err := b.cs.Send(ctxT(t), sam, c.SessionID, prompt); err == nil || errors.Is(err, sessions.ErrNoSession) || !strings.Contains(err.Error(), "send less") {
		t.Errorf("the same prompt through gw-b: %v", err)
	}
}

// twoNodes starts a nats-server and the nodes gw-a and gw-b on it, whose
// liveness p says; url is the server's.
func twoNodes(t *testing.T) (a, b *node, p *peers, url string) {
	t.Helper()
	url = startNATS(t)
	p = &peers{alive: map[string]bool{}}
	return startNode(t, url, "gw-a", p), startNode(t, url, "gw-b", p), p, url
}

// create makes o a session on n that starts with prompt, or fails the test.
func create(t testing.TB, n *node, o sessions.Owner, prompt string) sessions.Created {
	t.Helper()
	c, err := n.cs.Create(ctxT(t), o, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: prompt})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A node keeps the tokens of another node's sessions (that node judges
// them) and judges its own, and those whose id names no node, by its
// engine.
func TestAliveJudgesOnlyThisNodesSessions(t *testing.T) {
	local := map[string]bool{"ses_0123456789abcdef.gw-1": true, "ses_0123456789abcdef": true}
	alive := clustersessions.Alive("gw-1", func(id string) bool { return local[id] })
	for id, want := range map[string]bool{
		"ses_0123456789abcdef.gw-1": true,  // this node's, running
		"ses_fedcba9876543210.gw-1": false, // this node's, ended
		"ses_0123456789abcdef":      true,  // from before the cluster, running here
		"ses_fedcba9876543210":      false, // from before the cluster, ended
		"ses_fedcba9876543210.gw-2": true,  // another node's: its own to judge
		"ses_fedcba9876543210.-bad": false, // no node id: judged here
	} {
		if got := alive(id); got != want {
			t.Errorf("%s: %v, want %v", id, got, want)
		}
	}
}
