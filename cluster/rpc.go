package cluster

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/Tahul/caddy-zidane-mcp/internal/replay"
)

// Bounds of an RPC service.
const (
	// rpcFreshness is how far a request's time may be from the receiver's
	// clock; the receiver remembers every request id it took until the
	// request's time plus that (the module's replay check,
	// internal/replay), so none is carried out twice.
	rpcFreshness = 10 * time.Second
	// maxRPCIDs bounds the request ids a node remembers, and so their
	// memory: maxRPCIDs × replay.IDBytes (64 MiB). A node holds rate ×
	// lifetime ids: about 52,000 requests a second at the usual lifetime
	// of rpcFreshness (clocks in step), 26,000 at the worst of twice that.
	// Past it, a new request is refused, its caller told to try again.
	maxRPCIDs = 1 << 19
	// maxRPCInFlight bounds the requests a node serves at once; one over
	// it is refused at once rather than queued.
	maxRPCInFlight = 256
	// MaxRPCWait bounds how long a request may run on the node that serves
	// it, whatever deadline its caller gave.
	MaxRPCWait = 2 * time.Minute
)

// ErrRPCUnreachable says the node a request was for did not answer: it is
// down, or not serving. The caller may tell it from a refusal.
var ErrRPCUnreachable = errors.New("the node did not answer")

// ErrRPCNotServing says that no process serves the node's subject (NATS
// has no responder for it): the node is down, or serves no such service.
// It comes with ErrRPCUnreachable.
var ErrRPCNotServing = errors.New("the node serves no such requests")

// rpcFromKey carries, in a handler's context, the node a request says it
// comes from.
type rpcFromKey struct{}

// RPCFrom is the node that the request an RPCHandler serves says it comes
// from: for the handler's logs and audit lines. Any holder of the cluster
// key can say any node, so it is no identity to act on.
func RPCFrom(ctx context.Context) string {
	from, _ := ctx.Value(rpcFromKey{}).(string)
	return from
}

// RPCHandler serves one request: method and body as the caller sent them.
// What it returns goes back as the reply's body; an error it returns goes
// back as a message, for faults of the service, not of the request (a
// service that has answers about the request puts them in the body).
type RPCHandler func(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error)

// RPC is request/reply between the nodes of a cluster on core NATS: each
// node serves its requests on "zidane.rpc.<bucket>.<service>.<node>".
// Requests and replies are sealed (AES-256-GCM) with a key derived from
// the cluster key for the service: a request is bound to its subject, so
// it reaches only the node it was sealed for, and carries a random id and
// its time; a reply is bound to that id, so it answers only that request.
// A NATS client without the cluster key reads neither, and makes neither a
// request a node carries out nor a reply a caller takes. A request over
// rpcFreshness old or new, or whose id the node already took (a replay),
// is dropped unanswered; one that finds the node's replay check at its
// memory bound (maxRPCIDs) is refused with a reply that says to try
// again, never carried out without its id kept.
//
// Each serving process has an incarnation (random, made at start), and a
// request names the incarnation it is for: the node refuses one for
// another with a sealed reply that gives its own, and the caller sends the
// request again, under a new id, to that one. So a request recorded before
// a node restarted, whose id the new process has no record of, is never
// carried out by it, whatever the caller's clock said when it was sealed
// (a clock ahead of the node's dates a request after the restart).
type RPC struct {
	nc      *nats.Conn
	sealer  *sealer
	prefix  string // subject up to the node
	self    string
	handler RPCHandler
	log     *slog.Logger
	sub     *nats.Subscription
	slots   chan struct{}

	ctx         context.Context // ends at Close: the handlers' base
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	now         func() time.Time // the clock requests are dated and checked by
	incarnation string           // this process's: 64 random bits, hex: 64 random bits, hex

	incMu        sync.Mutex
	incarnations map[string]string // node -> the incarnation it last gave

	flightMu sync.Mutex
	inFlight map[string]context.CancelFunc // request id -> its handler's cancel

	seen *replay.Check // the ids of the requests taken
}

type rpcRequest struct {
	ID       string          `json:"i"`           // 128 random bits, hex
	Abort    bool            `json:"x,omitempty"` // the caller gave up on request ID
	From     string          `json:"f"`
	To       string          `json:"n,omitempty"` // the node's incarnation, as the caller last heard it
	At       int64           `json:"t"`           // Unix milliseconds
	Deadline int64           `json:"d"`           // Unix milliseconds; 0 means MaxRPCWait
	Method   string          `json:"m"`
	Body     json.RawMessage `json:"b"`
}

type rpcReply struct {
	ID   string          `json:"i"`
	Body json.RawMessage `json:"b,omitempty"`
	Err  string          `json:"e,omitempty"`
	// Inc is the node's incarnation, given with a refusal of a request
	// for another: the caller sends it again to this one.
	Inc string `json:"n,omitempty"`
}

// ServeRPC serves this node's requests of service (a NATS subject token:
// letters, digits, - and _) with handler, and returns the RPC through which
// this node calls the others'. Close stops serving.
func (s *Storage) ServeRPC(service, node string, handler RPCHandler, log *slog.Logger) (*RPC, error) {
	return s.serveRPC(service, node, handler, log, time.Now, maxRPCIDs)
}

// serveRPC is ServeRPC on the clock now, remembering at most maxIDs
// request ids: tests drive a node at rates over many seconds of a clock
// of their own, and fill a small replay check.
func (s *Storage) serveRPC(service, node string, handler RPCHandler, log *slog.Logger, now func() time.Time, maxIDs int) (*RPC, error) {
	if s.conn == nil {
		return nil, errors.New("cluster rpc: this storage was not opened on a cluster connection")
	}
	if err := CheckNodeID(node); err != nil {
		return nil, fmt.Errorf("cluster rpc: %w", err)
	}
	for _, c := range service {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return nil, fmt.Errorf("cluster rpc: service %q is not one subject token", service)
		}
	}
	sl, err := newSealer(s.opts.Key, "rpc v1 "+service)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &RPC{
		nc: s.conn.nc, sealer: sl, prefix: "zidane.rpc." + s.opts.Bucket + "." + service + ".", self: node,
		handler: handler, log: log, slots: make(chan struct{}, maxRPCInFlight),
		ctx: ctx, cancel: cancel, seen: replay.New(maxIDs, rpcFreshness), now: now, incarnation: randomHex(8), inFlight: map[string]context.CancelFunc{},
		incarnations: map[string]string{},
	}
	// Not a queue subscription: a node's subject is its own, and two
	// processes under one node id (a misconfiguration the node registry
	// logs) would both carry out a request.
	r.sub, err = r.nc.Subscribe(r.prefix+node, r.serve)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("cluster rpc: subscribing: %w", err)
	}
	// Serving once this returns: the server has the subscription.
	if err := r.nc.FlushTimeout(10 * time.Second); err != nil {
		r.Close()
		return nil, fmt.Errorf("cluster rpc: subscribing: %w", err)
	}
	return r, nil
}

// Self is the node this RPC serves.
func (r *RPC) Self() string { return r.self }

// Close stops serving, ends the requests being served and waits for them.
func (r *RPC) Close() {
	_ = r.sub.Unsubscribe()
	r.cancel()
	r.wg.Wait()
}

// Call sends method and body to node and returns the reply's body. It
// waits until ctx ends, or MaxRPCWait; a node that does not answer gives
// ErrRPCUnreachable. A caller that gives up tells the node, which ends the
// request's handler. A request too large for one NATS message is refused
// before it is sent.
func (r *RPC) Call(ctx context.Context, node, method string, body json.RawMessage) (json.RawMessage, error) {
	if err := CheckNodeID(node); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, MaxRPCWait)
	defer cancel()
	// A node that does not know the caller's idea of its incarnation (the
	// first call to it, or it restarted) refuses the request and gives its
	// own: the request goes again, once, to that one. A node that
	// restarts again in between refuses again, and the caller is told.
	for try := 0; ; try++ {
		r.incMu.Lock()
		inc := r.incarnations[node]
		r.incMu.Unlock()
		rep, err := r.call(ctx, node, inc, method, body)
		if err != nil {
			return nil, err
		}
		if rep.Inc != "" && rep.Inc != inc {
			r.incMu.Lock()
			r.incarnations[node] = rep.Inc
			r.incMu.Unlock()
			if try == 0 {
				continue
			}
		}
		if rep.Err != "" {
			return nil, fmt.Errorf("node %s: %s", node, rep.Err)
		}
		return rep.Body, nil
	}
}

// call sends one request, for incarnation inc of node, and returns its
// reply.
func (r *RPC) call(ctx context.Context, node, inc, method string, body json.RawMessage) (rpcReply, error) {
	deadline, _ := ctx.Deadline()
	req := rpcRequest{ID: randomHex(16), From: r.self, To: inc, At: r.now().UnixMilli(), Deadline: deadline.UnixMilli(), Method: method, Body: body}
	data, _ := json.Marshal(req)
	subject := r.prefix + node
	sealed := r.sealer.seal(nil, data, []byte(subject))
	if limit := r.nc.MaxPayload(); int64(len(sealed)) > limit {
		return rpcReply{}, fmt.Errorf("the request is %d bytes, over the %d a NATS message carries between replicas: send less, or send it to the replica that runs the session (node %s)", len(sealed), limit, node)
	}
	// Replies come to an inbox of this call's own, where whatever does not
	// open under the cluster key as the reply to this request (a NATS
	// client without the key answering first) is skipped: the first
	// message on the inbox is not taken for the node's.
	inbox := r.nc.NewRespInbox()
	sub, err := r.nc.SubscribeSync(inbox)
	if err != nil {
		return rpcReply{}, fmt.Errorf("%w: node %s: %v", ErrRPCUnreachable, node, err)
	}
	// One reply is expected: what a flood of others leaves pending is
	// bounded (nats.go drops past it, and the sealed reply is the one
	// that matters).
	_ = sub.SetPendingLimits(64, 4<<20)
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.nc.PublishMsg(&nats.Msg{Subject: subject, Reply: inbox, Data: sealed}); err != nil {
		return rpcReply{}, fmt.Errorf("%w: node %s: %v", ErrRPCUnreachable, node, err)
	}
	// NATS's "no responders" status is not sealed: anyone who can publish
	// to the inbox can send one. It ends nothing here; a caller that must
	// know which nodes serve a service asks the node registry
	// (Nodes.AliveServing), whose entries are sealed.
	noResponders := false
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		if errors.Is(err, nats.ErrNoResponders) {
			noResponders = true
			continue
		}
		if err != nil {
			r.abort(subject, inc, req.ID)
			if noResponders {
				return rpcReply{}, fmt.Errorf("%w: %w: node %s is not serving", ErrRPCUnreachable, ErrRPCNotServing, node)
			}
			return rpcReply{}, fmt.Errorf("%w: node %s did not answer in time", ErrRPCUnreachable, node)
		}
		plain, err := r.sealer.open(msg.Data, []byte("reply "+req.ID))
		if err != nil {
			continue // not the node's reply to this request
		}
		var rep rpcReply
		if json.Unmarshal(plain, &rep) != nil || rep.ID != req.ID {
			continue
		}
		return rep, nil
	}
}

// abort tells incarnation inc of the node that the caller of request id
// gave up on it.
func (r *RPC) abort(subject, inc, id string) {
	data, _ := json.Marshal(rpcRequest{ID: id, Abort: true, From: r.self, To: inc, At: r.now().UnixMilli()})
	_ = r.nc.Publish(subject, r.sealer.seal(nil, data, []byte(subject)))
}

func (r *RPC) serve(msg *nats.Msg) {
	plain, err := r.sealer.open(msg.Data, []byte(msg.Subject))
	if err != nil {
		return // not from a node of this cluster, or sealed for another node
	}
	var req rpcRequest
	var id [16]byte
	if json.Unmarshal(plain, &req) != nil || len(req.ID) != hex.EncodedLen(len(id)) {
		return
	}
	if _, err := hex.Decode(id[:], []byte(req.ID)); err != nil {
		return
	}
	now := r.now()
	at := time.UnixMilli(req.At)
	if at.Before(now.Add(-rpcFreshness)) || at.After(now.Add(rpcFreshness)) {
		return
	}
	if req.Abort && req.To == r.incarnation {
		r.flightMu.Lock()
		cancel := r.inFlight[req.ID]
		r.flightMu.Unlock()
		if cancel != nil {
			cancel()
		}
		return
	}
	if req.Abort || msg.Reply == "" {
		return
	}
	reply := func(rep rpcReply) {
		rep.ID = req.ID
		data, _ := json.Marshal(rep)
		// Sealing adds a nonce and a tag; NATS refuses a message over its
		// max payload, which would leave the caller waiting for nothing.
		if limit := r.nc.MaxPayload(); int64(len(data))+64 > limit {
			data, _ = json.Marshal(rpcReply{ID: req.ID, Err: fmt.Sprintf("the answer is %d bytes, over the %d a NATS message carries between replicas; ask for less (fewer turns, or not in full), or ask the replica that runs the session", len(data), limit)})
		}
		if err := msg.Respond(r.sealer.seal(nil, data, []byte("reply "+req.ID))); err != nil {
			r.log.Warn("answering another node failed", "from", req.From, "method", req.Method, "error", err)
		}
	}
	switch r.seen.Take(req.From, id, req.At, now) {
	case replay.Replayed, replay.Stale:
		return // a replay: carried out once already, or too old to tell
	case replay.Full:
		// Not taken, since its id could not be kept: the caller may send
		// it again once older ones expire.
		reply(rpcReply{Err: "this node holds as many recent requests from other replicas as its memory bound for the replay check allows; try again in a second"})
		return
	}
	if req.To != r.incarnation {
		// For another process under this node id: the caller's first
		// request to it, one that crossed a restart, or a replay of a
		// request to the node's previous process, which has no record of
		// it here. Refused, not carried out; the caller learns this
		// process's incarnation and sends it again.
		reply(rpcReply{Err: "this node restarted after the request was sent; send it again", Inc: r.incarnation})
		return
	}
	select {
	case r.slots <- struct{}{}:
	default:
		reply(rpcReply{Err: "this node is serving too many requests at once; try again shortly"})
		return
	}
	deadline := now.Add(MaxRPCWait)
	if d := time.UnixMilli(req.Deadline); req.Deadline != 0 && d.Before(deadline) {
		deadline = d
	}
	// In flight before the next message is read: an abort that follows
	// the request on the subject finds it.
	ctx, cancel := context.WithDeadline(r.ctx, deadline)
	r.flightMu.Lock()
	r.inFlight[req.ID] = cancel
	r.flightMu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() { <-r.slots }()
		defer cancel()
		defer func() {
			r.flightMu.Lock()
			delete(r.inFlight, req.ID)
			r.flightMu.Unlock()
		}()
		body, err := r.handler(context.WithValue(ctx, rpcFromKey{}, req.From), req.Method, req.Body)
		if err != nil {
			reply(rpcReply{Err: err.Error()})
			return
		}
		reply(rpcReply{Body: body})
	}()
}
