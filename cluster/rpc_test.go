package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/Tahul/caddy-zidane-mcp/internal/replay"
)

// rpcNode serves service "svc" as node on a connection of its own; calls
// counts the requests its handler carried out.
func rpcNode(t *testing.T, url, node string, key []byte, handler RPCHandler) (*RPC, *nats.Conn) {
	t.Helper()
	st, nc := newStorage(t, url, StorageOptions{Bucket: "rpc", Key: key})
	st.conn = &Conn{nc: nc}
	r, err := st.ServeRPC("svc", node, handler, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, nc
}

func echo(calls *atomic.Int64) RPCHandler {
	return func(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
		calls.Add(1)
		if method == "fail" {
			return nil, errors.New("it failed")
		}
		return json.Marshal(map[string]any{"method": method, "body": body})
	}
}

func TestRPCCallsAnotherNode(t *testing.T) {
	url := startNATS(t)
	var aCalls, bCalls atomic.Int64
	a, _ := rpcNode(t, url, "a", nil, echo(&aCalls))
	rpcNode(t, url, "b", nil, echo(&bCalls))
	got, err := a.Call(testCtx(t), "b", "read", json.RawMessage(`{"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != `{"body":{"x":1},"method":"read"}` {
		t.Fatalf("reply %s", got)
	}
	if bCalls.Load() != 1 || aCalls.Load() != 0 {
		t.Fatalf("b served %d, a %d; want 1, 0", bCalls.Load(), aCalls.Load())
	}
	if _, err := a.Call(testCtx(t), "b", "fail", nil); err == nil || !strings.Contains(err.Error(), "it failed") {
		t.Fatalf("a handler's error came back as %v", err)
	}
	short, cancel := context.WithTimeout(testCtx(t), 500*time.Millisecond)
	defer cancel()
	if _, err := a.Call(short, "nosuch", "read", nil); !errors.Is(err, ErrRPCUnreachable) || !errors.Is(err, ErrRPCNotServing) {
		t.Fatalf("a node that does not serve: %v", err)
	}
	if _, err := a.Call(testCtx(t), "b.*", "read", nil); err == nil {
		t.Fatal("a wildcard node id was sent")
	}
}

// A NATS client without the cluster key cannot drive a node: what it
// sends is dropped, and a request it recorded and replays is carried out
// once. A request sealed for one node is not carried out by another.
func TestRPCRefusesForgedAndReplayedRequests(t *testing.T) {
	url := startNATS(t)
	var calls atomic.Int64
	a, _ := rpcNode(t, url, "a", nil, echo(&calls))
	rpcNode(t, url, "b", nil, echo(&calls))
	other := make([]byte, KeySize)
	copy(other, testKey)
	other[0] ^= 1
	stranger, _ := rpcNode(t, url, "s", other, echo(new(atomic.Int64)))
	short, cancel := context.WithTimeout(testCtx(t), 500*time.Millisecond)
	defer cancel()
	if _, err := stranger.Call(short, "b", "read", nil); !errors.Is(err, ErrRPCUnreachable) {
		t.Fatalf("a node with another key was answered: %v", err)
	}
	if calls.Load() != 0 {
		t.Fatalf("b carried out %d requests sealed with another key", calls.Load())
	}

	// A spy records a's request to b and replays it, and sends it to c.
	spy := connect(t, url)
	recorded, stop := recordFirst(t, spy, "zidane.rpc.rpc.svc.b")
	defer stop()
	if _, err := a.Call(testCtx(t), "b", "answer", json.RawMessage(`"allow"`)); err != nil {
		t.Fatal(err)
	}
	m := <-recorded
	if calls.Load() != 1 {
		t.Fatalf("b served %d", calls.Load())
	}
	// The spy replays it to b, sends it to c (whose subject it was not
	// sealed for), and sends garbage, each asking for a reply on its inbox.
	var cCalls atomic.Int64
	rpcNode(t, url, "c", nil, echo(&cCalls))
	inbox := nats.NewInbox()
	replies, err := spy.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	for _, send := range []struct {
		subject string
		data    []byte
	}{
		{"zidane.rpc.rpc.svc.b", m.Data},
		{"zidane.rpc.rpc.svc.c", m.Data},
		{"zidane.rpc.rpc.svc.b", []byte(`{"i":"x","m":"answer"}`)},
	} {
		if err := spy.PublishRequest(send.subject, inbox, send.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	// A node takes its requests in order of arrival: once a's next call is
	// answered, b has dropped or taken the spy's.
	if _, err := a.Call(testCtx(t), "b", "read", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Call(testCtx(t), "c", "read", nil); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := replies.Pending(); n != 0 {
		m, _ := replies.NextMsg(time.Second)
		t.Fatalf("the spy got %d replies: %q %v", n, m.Data, m.Header)
	}
	if calls.Load() != 2 || cCalls.Load() != 1 {
		t.Fatalf("b carried out %d requests (want 2: a's two), c %d (want 1: a's)", calls.Load(), cCalls.Load())
	}
}

// A reply answers only its request: a reply sealed for another request,
// or one that does not open (a NATS client without the key answering
// first), is skipped, and the node's own reply after it is taken.
func TestRPCReplyIsBoundToItsRequest(t *testing.T) {
	url := startNATS(t)
	a, _ := rpcNode(t, url, "a", nil, echo(new(atomic.Int64)))
	var calls atomic.Int64
	junkSent := make(chan struct{})
	b, nc := rpcNode(t, url, "b", nil, func(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
		<-junkSent // the node answers after the spy
		calls.Add(1)
		return json.RawMessage(`"done"`), nil
	})
	spy := connect(t, url)
	var once atomic.Bool
	sub, err := spy.Subscribe("zidane.rpc.rpc.svc.b", func(m *nats.Msg) {
		if !once.CompareAndSwap(false, true) {
			return
		}
		_ = spy.Publish(m.Reply, []byte("not sealed"))
		other, _ := json.Marshal(rpcReply{ID: "other", Body: json.RawMessage(`"forged"`)})
		_ = nc.Publish(m.Reply, b.sealer.seal(nil, other, []byte("reply other")))
		_ = spy.Flush()
		_ = nc.Flush()
		close(junkSent)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := a.Call(testCtx(t), "b", "answer", json.RawMessage(`"allow"`))
	if err != nil || string(got) != `"done"` || calls.Load() != 1 {
		t.Fatalf("a call answered first by a spy: %s, %v (b served %d)", got, err, calls.Load())
	}
}

// A request recorded and replayed to the node's next process (a restart
// under the same id) is dropped: it was sealed before that process started.
func TestRPCReplayToARestartedNodeIsDropped(t *testing.T) {
	url := startNATS(t)
	var calls atomic.Int64
	a, _ := rpcNode(t, url, "a", nil, echo(new(atomic.Int64)))
	b, _ := rpcNode(t, url, "b", nil, echo(&calls))
	spy := connect(t, url)
	recorded, stop := recordFirst(t, spy, "zidane.rpc.rpc.svc.b")
	if _, err := a.Call(testCtx(t), "b", "send", json.RawMessage(`"rm -rf"`)); err != nil {
		t.Fatal(err)
	}
	m := <-recorded
	stop()
	b.Close()
	// The request was sealed in a millisecond before this one ends.
	sealedBy := time.Now().UnixMilli()
	waitFor(time.Second, func() bool { return time.Now().UnixMilli() > sealedBy })
	rpcNode(t, url, "b", nil, echo(&calls)) // b restarts under the same id
	inbox := nats.NewInbox()
	replies, err := spy.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.PublishRequest("zidane.rpc.rpc.svc.b", inbox, m.Data); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	// The node takes its requests in order: once a's next call is
	// answered, it has dropped or taken the replay.
	if _, err := a.Call(testCtx(t), "b", "read", nil); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 {
		t.Fatalf("the restarted node served %d requests (want 2: the call before the restart and the one after, not the replay)", calls.Load())
	}
	_ = replies // it may be told to send again: a refusal, sealed
}

// The same replay, where the caller's clock runs ahead of the node's by
// less than rpcFreshness, which the node accepts: the caller dates its
// request after the moment the node's next process starts, if the restart
// comes within that lead. Recorded before the restart and replayed after
// it, the request must still be dropped, not carried out a second time by
// a process that has no record of it.
func TestRPCReplayToARestartedNodeFromACallerAheadIsDropped(t *testing.T) {
	const ahead = 5 * time.Second // inside rpcFreshness: the node takes a's requests
	url := startNATS(t)
	st, nc := newStorage(t, url, StorageOptions{Bucket: "rpc"})
	st.conn = &Conn{nc: nc}
	a, err := st.serveRPC("svc", "a", echo(new(atomic.Int64)), nil, func() time.Time { return time.Now().Add(ahead) }, maxRPCIDs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	var calls atomic.Int64
	b, _ := rpcNode(t, url, "b", nil, echo(&calls))
	spy := connect(t, url)
	recorded, stop := recordFirst(t, spy, "zidane.rpc.rpc.svc.b")
	if _, err := a.Call(testCtx(t), "b", "send", json.RawMessage(`"rm -rf"`)); err != nil {
		t.Fatal(err)
	}
	m := <-recorded
	stop()
	b.Close()
	rpcNode(t, url, "b", nil, echo(&calls)) // b restarts under the same id, within a's lead
	inbox := nats.NewInbox()
	replies, err := spy.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.PublishRequest("zidane.rpc.rpc.svc.b", inbox, m.Data); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	// Once a's next call is answered, b has dropped or taken the replay.
	if _, err := a.Call(testCtx(t), "b", "read", nil); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 {
		t.Fatalf("the restarted node served %d requests (want 2: the call before the restart and the one after, not the replay of the first)", calls.Load())
	}
	_ = replies
}

// A caller that gives up tells the node: the handler's context ends, and
// its slot is free again.
func TestRPCCallerThatGivesUpEndsTheHandler(t *testing.T) {
	url := startNATS(t)
	a, _ := rpcNode(t, url, "a", nil, echo(new(atomic.Int64)))
	started, ended := make(chan struct{}, 1), make(chan error, 1)
	rpcNode(t, url, "b", nil, func(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
		started <- struct{}{}
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithCancel(testCtx(t))
	go func() {
		<-started
		cancel()
	}()
	if _, err := a.Call(ctx, "b", "wait", nil); !errors.Is(err, ErrRPCUnreachable) {
		t.Fatalf("a call its caller gave up on: %v", err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the handler's context ended with %v, want the caller's cancel", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler still runs 30s after its caller gave up")
	}
}

// The handler's context ends with the caller's deadline, and with Close.
func TestRPCDeadlineReachesTheHandler(t *testing.T) {
	url := startNATS(t)
	ended := make(chan error, 1)
	a, _ := rpcNode(t, url, "a", nil, echo(new(atomic.Int64)))
	rpcNode(t, url, "b", nil, func(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	if _, err := a.Call(ctx, "b", "wait", nil); err == nil {
		t.Fatalf("a call past its deadline: %v", err)
	}
	select {
	case err := <-ended:
		// Its deadline, or the caller's abort when its own came first.
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Fatalf("the handler's context ended with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler still runs 30s after its caller's deadline")
	}
}

// A node whose replay check is full refuses a new request with a reply
// that tells its caller to try again, and still drops every request it
// took when it comes again: it never makes room by forgetting an id whose
// request is not stale. Once the window passes, requests are taken again.
func TestRPCFullReplayCheckRefusesClearly(t *testing.T) {
	clock := &testClock{start: time.Now(), step: time.Millisecond}
	url := startNATS(t)
	var calls atomic.Int64
	st, nc := newStorage(t, url, StorageOptions{Bucket: "rpc"})
	st.conn = &Conn{nc: nc}
	b, err := st.serveRPC("svc", "b", echo(&calls), nil, clock.now, replay.Shards)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	send := connect(t, url)
	inbox := nats.NewInbox()
	replies, err := send.SubscribeSync(inbox + ".*")
	if err != nil {
		t.Fatal(err)
	}
	const subject = "zidane.rpc.rpc.svc.b"
	// request sends a new request, sealed as Call seals it, and returns
	// its bytes and b's answer.
	request := func() ([]byte, rpcReply) {
		t.Helper()
		id := randomHex(16)
		req, _ := json.Marshal(rpcRequest{ID: id, From: "a", To: b.incarnation, At: clock.tick().UnixMilli(), Method: "read"})
		sealed := b.sealer.seal(nil, req, []byte(subject))
		if err := send.PublishRequest(subject, inbox+"."+id, sealed); err != nil {
			t.Fatal(err)
		}
		m, err := replies.NextMsgWithContext(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		var rep rpcReply
		plain, err := b.sealer.open(m.Data, []byte("reply "+id))
		if err != nil || m.Subject != inbox+"."+id || json.Unmarshal(plain, &rep) != nil || rep.ID != id {
			t.Fatalf("an answer on %s that is not b's to request %s: %v", m.Subject, id, err)
		}
		return sealed, rep
	}
	var taken [][]byte
	for {
		if len(taken) > 100*replay.Shards {
			t.Fatalf("%d requests taken by a check bounded to %d ids", len(taken), replay.Shards)
		}
		sealed, rep := request()
		if rep.Err != "" {
			if !strings.Contains(rep.Err, "try again in a second") || !strings.Contains(rep.Err, "memory bound") {
				t.Fatalf("a request into a full check: %q, want a refusal that says to try again", rep.Err)
			}
			break
		}
		taken = append(taken, sealed)
	}
	if len(taken) > replay.Shards {
		t.Fatalf("%d requests taken by a check bounded to %d ids", len(taken), replay.Shards)
	}
	for _, sealed := range taken {
		if err := send.PublishRequest(subject, inbox+".replay", sealed); err != nil {
			t.Fatal(err)
		}
	}
	// b reads them before the request after them on this connection,
	// which it answers (taking it if its shard has room).
	if _, rep := request(); rep.Err == "" {
		taken = append(taken, nil)
	}
	// Once the window passes, requests are taken again: the shard a
	// request reaches forgets its stale ids first.
	clock.ticks.Add(int64((rpcFreshness + time.Second) / clock.step))
	if _, rep := request(); rep.Err != "" {
		t.Fatalf("a request after the window: %q", rep.Err)
	}
	b.Close() // its handlers have all returned
	if calls.Load() != int64(len(taken))+1 {
		t.Fatalf("b carried out %d requests, want the %d it took and the one after the window, not the replays", calls.Load(), len(taken)+1)
	}
	if pending, _, _ := replies.Pending(); pending != 0 {
		m, _ := replies.NextMsg(time.Second)
		t.Fatalf("%d answers to replayed requests, first on %s", pending, m.Subject)
	}
}

// An answer too large for one NATS message comes back as an error that
// says so, not as silence.
func TestRPCAnswerOverThePayloadLimit(t *testing.T) {
	url := startNATS(t)
	a, nc := rpcNode(t, url, "a", nil, echo(new(atomic.Int64)))
	rpcNode(t, url, "b", nil, func(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
		return json.Marshal(strings.Repeat("x", int(nc.MaxPayload())))
	})
	_, err := a.Call(testCtx(t), "b", "transcript", nil)
	if err == nil || !strings.Contains(err.Error(), "ask for less") || errors.Is(err, ErrRPCUnreachable) {
		t.Fatalf("an answer over the limit: %v", err)
	}
}

// NATS's "no responders" status, which anyone who can publish to a reply
// inbox can forge, ends no call: the node's sealed reply is taken, and the
// node's handler is not aborted.
func TestRPCForgedNoRespondersEndsNothing(t *testing.T) {
	url := startNATS(t)
	a, _ := rpcNode(t, url, "a", nil, echo(new(atomic.Int64)))
	forged := make(chan struct{})
	var handlerErr atomic.Value
	rpcNode(t, url, "b", nil, func(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
		<-forged
		handlerErr.Store(fmt.Sprint(ctx.Err()))
		return json.RawMessage(`"done"`), nil
	})
	spy := connect(t, url)
	var once atomic.Bool
	sub, err := spy.Subscribe("zidane.rpc.rpc.svc.b", func(m *nats.Msg) {
		if !once.CompareAndSwap(false, true) {
			return
		}
		status := nats.NewMsg(m.Reply)
		status.Header.Set("Status", "503")
		_ = spy.PublishMsg(status)
		_ = spy.Flush()
		close(forged)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := a.Call(testCtx(t), "b", "send", nil)
	if err != nil || string(got) != `"done"` {
		t.Fatalf("a call answered first by a forged no-responders status: %s, %v", got, err)
	}
	if e := handlerErr.Load(); e != "<nil>" {
		t.Fatalf("the handler's context was ended: %v", e)
	}
}

// recordFirst has spy record the first message on subject, as a NATS user
// who may subscribe to it would, once the server has the subscription;
// stop ends it.
func recordFirst(t *testing.T, spy *nats.Conn, subject string) (recorded <-chan *nats.Msg, stop func()) {
	t.Helper()
	ch := make(chan *nats.Msg, 1)
	sub, err := spy.Subscribe(subject, func(m *nats.Msg) {
		select {
		case ch <- m:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch, func() { _ = sub.Unsubscribe() }
}

// testClock is a clock that a test moves: each tick is one request's
// share of a second at the rate the test drives.
type testClock struct {
	start time.Time
	step  time.Duration
	ticks atomic.Int64
}

func (c *testClock) now() time.Time  { return c.start.Add(time.Duration(c.ticks.Load()) * c.step) }
func (c *testClock) tick() time.Time { return c.start.Add(time.Duration(c.ticks.Add(1)) * c.step) }

// A node takes requests at a rate far above what a fixed count of ids for
// the window allows (65,536 ids kept 20 s capped it at about 3,200 a
// second): 80,000 requests from 8 senders over 20 s of the node's clock,
// 4,000 a second, are all answered, and one in 1,000, recorded and sent
// again about 1,000 requests (a quarter of a second) later as a spy would,
// is dropped. The senders seal their requests as Call does, each on a tick
// of the clock, and send them 16 at a time, for the test to take seconds,
// not minutes: 8 senders × 16 requests, twice over for those answered
// whose slot is not free yet, stay within the 256 a node serves at once.
func TestRPCTakesAHighRate(t *testing.T) {
	const rate, seconds, senders, batch = 4_000, 20, 8, 16
	const n = rate * seconds
	clock := &testClock{start: time.Now(), step: time.Second / rate}
	url := startNATS(t)
	var calls atomic.Int64
	st, nc := newStorage(t, url, StorageOptions{Bucket: "rpc"})
	st.conn = &Conn{nc: nc}
	b, err := st.serveRPC("svc", "b", echo(&calls), nil, clock.now, maxRPCIDs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	const subject = "zidane.rpc.rpc.svc.b"
	ctx := testCtx(t)
	var answered, replayed atomic.Int64
	errs := make(chan error, senders)
	for w := range senders {
		go func() {
			errs <- func() error {
				send := connect(t, url)
				// Each request is answered on an inbox of its own id.
				inbox := nats.NewInbox()
				replies, err := send.SubscribeSync(inbox + ".*")
				if err != nil {
					return err
				}
				var recorded []byte
				for sent := 0; sent < n/senders; {
					waiting := map[string]bool{}
					for range batch {
						id := randomHex(16)
						req, _ := json.Marshal(rpcRequest{ID: id, From: "a", To: b.incarnation, At: clock.tick().UnixMilli(), Method: "read"})
						sealed := b.sealer.seal(nil, req, []byte(subject))
						if err := send.PublishRequest(subject, inbox+"."+id, sealed); err != nil {
							return err
						}
						waiting[id] = true
						switch sent % 1000 {
						case 0:
							recorded = sealed
						case 1000 / senders:
							// The recorded one again: b reads it before the
							// requests sent after it on this connection.
							if err := send.PublishRequest(subject, inbox+".replay", recorded); err != nil {
								return err
							}
							replayed.Add(1)
						}
						sent++
					}
					for len(waiting) > 0 {
						m, err := replies.NextMsgWithContext(ctx)
						if err != nil {
							return fmt.Errorf("sender %d: %d of %d requests answered: %w", w, answered.Load(), n, err)
						}
						id := strings.TrimPrefix(m.Subject, inbox+".")
						if !waiting[id] {
							return fmt.Errorf("sender %d: an answer on %s, to no request waiting for one (a replay carried out?)", w, m.Subject)
						}
						delete(waiting, id)
						plain, err := b.sealer.open(m.Data, []byte("reply "+id))
						var rep rpcReply
						if err != nil || json.Unmarshal(plain, &rep) != nil || rep.ID != id || rep.Err != "" {
							return fmt.Errorf("sender %d, request %d, at %v of the clock (%d a second): %q (%v)", w, sent, clock.now().Sub(clock.start).Round(time.Millisecond), rate, rep.Err, err)
						}
						answered.Add(1)
					}
				}
				if pending, _, _ := replies.Pending(); pending != 0 {
					return fmt.Errorf("sender %d: %d answers to replayed requests", w, pending)
				}
				return nil
			}()
		}()
	}
	for range senders {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	b.Close() // its handlers have all returned
	if calls.Load() != n || answered.Load() != n {
		t.Fatalf("b carried out %d requests and answered %d of the %d sent (and %d replays)", calls.Load(), answered.Load(), n, replayed.Load())
	}
	if replayed.Load() != n/1000 {
		t.Fatalf("%d replays sent, want %d", replayed.Load(), n/1000)
	}
}
