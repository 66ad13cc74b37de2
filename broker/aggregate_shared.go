package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// The shared stdio pool: a shared stdio upstream's catalog session is its
// one process, leased by every downstream session's calls (see
// [Aggregate]). A call takes a lease ([Aggregate.sharedConn]); when the
// last lease ends, an idle timer is armed, and when it fires with no call
// in between (and no resource subscription to keep) the session is closed.
// The catalog supervisor then waits for the next call to start it again.

// sharedProgress routes a shared upstream's progress notifications for one
// call: the downstream request and the progress token it gave.
type sharedProgress struct {
	ctx   context.Context
	ss    *mcp.ServerSession
	token any
}

var sharedTokens atomic.Uint64

// notifyLocked wakes the waiters for up's catalog. up.mu is held.
func (up *aggUpstream) notifyLocked() {
	close(up.changed)
	up.changed = make(chan struct{})
}

// sharedConn leases the shared catalog session of up, asking the
// supervisor to start it when it is closed, and waiting for it bounded by
// ctx. It fails when a connection attempt fails meanwhile. Call release
// when the call ends.
func (a *Aggregate) sharedConn(ctx context.Context, up *aggUpstream) (c *aggConn, release func(), err error) {
	up.mu.Lock()
	start := up.failures
	for up.catalog == nil {
		if up.failures != start {
			msg := up.lastErr
			up.mu.Unlock()
			return nil, nil, errors.New(msg)
		}
		ch := up.changed
		up.mu.Unlock()
		select {
		case up.wake <- struct{}{}:
		default:
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-a.ctx.Done():
			return nil, nil, errors.New("the broker route is closed")
		}
		up.mu.Lock()
	}
	cs := up.catalog
	up.inflight++
	up.idleGen++ // disarms the idle timer
	up.mu.Unlock()
	done := make(chan struct{})
	close(done)
	c = &aggConn{done: done, cs: cs, progress: map[string]context.Context{}, shared: true}
	var once sync.Once
	return c, func() { once.Do(func() { a.release(up) }) }, nil
}

// release ends a lease of up's shared session.
func (a *Aggregate) release(up *aggUpstream) {
	up.mu.Lock()
	up.inflight--
	a.armIdleLocked(up)
	up.mu.Unlock()
}

// armIdleLocked (re)starts the idle timer of up's shared session if no
// call holds it. up.mu is held.
func (a *Aggregate) armIdleLocked(up *aggUpstream) {
	up.idleGen++
	if !up.shared || up.idle <= 0 || up.inflight > 0 || up.catalog == nil {
		return
	}
	gen, cs := up.idleGen, up.catalog
	time.AfterFunc(up.idle, func() { a.idleFire(up, cs, gen) })
}

// idleFire closes up's shared session cs if it had no call since the timer
// of generation gen was armed.
func (a *Aggregate) idleFire(up *aggUpstream, cs *mcp.ClientSession, gen int) {
	if a.ctx.Err() != nil {
		return
	}
	subscribed := a.subscribedTo(up)
	up.mu.Lock()
	if up.idleGen != gen || up.inflight > 0 || up.catalog != cs {
		up.mu.Unlock()
		return
	}
	if subscribed {
		// A downstream session follows one of its resources: keep it.
		a.armIdleLocked(up)
		up.mu.Unlock()
		return
	}
	up.catalog = nil
	up.idleClosed = true
	up.notifyLocked()
	select {
	case <-up.wake: // a stale request to start
	default:
	}
	up.mu.Unlock()
	a.logger.Info("aggregate: closing the idle shared stdio upstream; the next call starts it again", "upstream", up.cfg.Name, "idle", up.idle)
	cs.Close()
}

// subscribedTo reports whether a downstream session is subscribed to a
// resource of up.
func (a *Aggregate) subscribedTo(up *aggUpstream) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for uri, set := range a.subs {
		if len(set) > 0 && a.resOwner[uri] == up.cfg.Name {
			return true
		}
	}
	return false
}

// sharedProgressToken gives a call on a shared session a progress token of
// the broker's own (downstream sessions may use the same tokens), routing
// the upstream's notifications for it back to the caller. It returns the
// meta to send and the function that ends the routing.
func (a *Aggregate) sharedProgressToken(ctx context.Context, up *aggUpstream, ss *mcp.ServerSession, meta mcp.Meta, token any) (mcp.Meta, func()) {
	if token == nil || ss == nil {
		return meta, func() {}
	}
	ours := fmt.Sprintf("zidane-%d", sharedTokens.Add(1))
	out := make(mcp.Meta, len(meta))
	for k, v := range meta {
		out[k] = v
	}
	out["progressToken"] = ours
	up.progress.Store(ours, &sharedProgress{ctx: ctx, ss: ss, token: token})
	return out, func() { up.progress.Delete(ours) }
}

// sharedClientOptions adds to the catalog client's options of a shared
// upstream the routing of progress and the dropping of log messages.
func (a *Aggregate) sharedClientOptions(up *aggUpstream, opts *mcp.ClientOptions) {
	opts.ProgressNotificationHandler = func(ctx context.Context, req *mcp.ProgressNotificationClientRequest) {
		v, ok := up.progress.Load(fmt.Sprint(req.Params.ProgressToken))
		if !ok {
			a.logger.Debug("aggregate: dropped a progress notification of a shared stdio upstream: no call has its token", "upstream", up.cfg.Name)
			return
		}
		p := v.(*sharedProgress)
		params := *req.Params
		params.ProgressToken = p.token
		_ = p.ss.NotifyProgress(valuesFrom{Context: ctx, values: p.ctx}, &params)
	}
	//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	opts.LoggingMessageHandler = func(ctx context.Context, req *mcp.LoggingMessageRequest) {
		a.logger.Debug("aggregate: dropped a log message of a shared stdio upstream: it cannot be attributed to one client", "upstream", up.cfg.Name)
	}
}

// refuseSharedRequests answers a shared upstream's sampling and elicitation
// requests with an error: they cannot be attributed to one client.
func refuseSharedRequests(up *aggUpstream) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			switch method {
			case "sampling/createMessage", "elicitation/create":
				return nil, &jsonrpc.Error{
					Code: message.CodeMethodNotFound,
					Message: fmt.Sprintf("%s is not available: the broker runs %q as one process shared by all its clients, and cannot tell which client this request is for; set \"shared\": false for this upstream to give each client its own process",
						method, up.cfg.Name),
				}
			}
			return next(ctx, method, req)
		}
	}
}
