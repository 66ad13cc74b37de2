package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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

func TestRPCSeenIsBounded(t *testing.T) {
	r := &RPC{seen: map[string]time.Time{}}
	now := time.Now()
	for i := range maxRPCSeen {
		if !r.take(strconv.Itoa(i), now) {
			t.Fatalf("request %d refused", i)
		}
	}
	if r.take("one more", now) {
		t.Fatal("a request past the bound was taken")
	}
	if r.take("0", now.Add(2*rpcFreshness+time.Second)) != true {
		t.Fatal("an id forgotten after its time was refused")
	}
	if len(r.seen) != 1 {
		t.Fatalf("%d ids kept after they aged out", len(r.seen))
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
