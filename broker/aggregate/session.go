package aggregate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// aggSession is the broker's state for one downstream session: its
// upstream client sessions, opened on first use. A principal's session
// (see principalSession) has no ss: it holds the upstream sessions that
// serve the 2026-07-28 requests of one token.
type aggSession struct {
	a  *Aggregate
	ss *mcp.ServerSession

	mu    sync.Mutex
	conns map[string]*aggConn
	//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	level  mcp.LoggingLevel
	closed bool                 // closeAll ran: no new upstream sessions
	fast   map[string]*fastCall // tools/call in flight on the fast path, by request id

	idleKey string // a principal session's key in Aggregate.pidle (a person session's in Aggregate.peopleIdle)

	// owner, for a person session (see person.go), is the person whose
	// own upstream sessions it holds; every request on them is marked
	// with that person.
	owner string
	uses  int // a person session's calls in flight (under Aggregate.mu)

	ended chan struct{} // closed by closeAll; nil until asked for (see endedCh)

	// untold are elicitation ids whose completion no GET stream was open
	// to carry (see untell), for the session's next one. Under untoldMu
	// alone: go-sdk asks for them while holding its stream's lock, which
	// a holder of mu may be waiting for.
	untoldMu sync.Mutex
	untold   []string
}

// endedCh is closed when the session's closeAll runs.
func (s *aggSession) endedCh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended == nil {
		s.ended = make(chan struct{})
		if s.closed {
			close(s.ended)
		}
	}
	return s.ended
}

// aggConn is one upstream client session of a downstream session.
type aggConn struct {
	done chan struct{} // closed when the connection attempt ended
	cs   *mcp.ClientSession
	err  error

	mu       sync.Mutex
	progress map[string]context.Context // progress token -> downstream request ctx
	calls    []context.Context          // downstream request ctxs in flight
	shared   bool                       // a lease of a shared stdio upstream's catalog session
	home     *aggSession                // the session whose conns hold it (nil for a lease)
	bridges  []*bridgeCall              // pending calls of 2026-07-28 clients (see aggregate_bridge.go)
	callers  map[string]int             // a person session's: token id -> its calls in flight (see soleCaller)

	client *mcp.Client // the client of cs (nil for a lease): roots changes are announced through it

	// overLimit is the failure of an answer on cs over max_response or the
	// answer budget, which also closed cs.
	overLimit atomic.Pointer[error]
	closeOnce sync.Once

	received *atomic.Int64 // log and progress notifications read on cs (see awaitNotes); nil: not counted
	handled  noteGate      // and forwarded by the handlers (or dropped)

	fwdOnce  sync.Once
	stopOnce sync.Once
	fwd      chan func()   // notifications waiting to go downstream, in order
	fwdStop  chan struct{} // closed when the upstream session ended
	dropped  atomic.Int64  // notifications dropped: the downstream client read too slowly
	rootMu   sync.Mutex
	marker   bool // the marker root is held (see notifyRootsChanged)
}

// session returns the state of ss, creating it (and its cleanup) on first
// use.
func (a *Aggregate) session(ss *mcp.ServerSession) *aggSession {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sessions[ss]
	if s == nil {
		s = &aggSession{a: a, ss: ss, conns: map[string]*aggConn{}}
		a.sessions[ss] = s
		if id := ss.ID(); id != "" {
			a.byID[id] = s
		}
		if !a.closed {
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				ss.Wait()
				a.dropSession(ss)
			}()
		}
	}
	return s
}

// dropSession forgets a closed downstream session, closes its upstream
// sessions and releases its subscriptions.
func (a *Aggregate) dropSession(ss *mcp.ServerSession) {
	a.idle.Closed(ss.ID())
	a.mu.Lock()
	s := a.sessions[ss]
	delete(a.sessions, ss)
	delete(a.bindings, ss.ID())
	delete(a.per.sessionOwner, ss.ID())
	if a.byID[ss.ID()] == s {
		delete(a.byID, ss.ID())
	}
	var empty []string
	for uri, set := range a.subs {
		if set[ss] {
			delete(set, ss)
			if len(set) == 0 {
				delete(a.subs, uri)
				empty = append(empty, uri)
			}
		}
	}
	a.mu.Unlock()
	if s != nil {
		s.closeAll()
	}
	for _, uri := range empty {
		a.upstreamUnsubscribe(uri)
	}
}

// closeAll closes the session's upstream sessions, after their connection
// attempts end, and waits for them to close (for stdio, for the processes
// to exit). No upstream session is opened for it afterwards.
func (s *aggSession) closeAll() {
	s.mu.Lock()
	conns := s.conns
	s.conns = map[string]*aggConn{}
	if s.ended != nil && !s.closed {
		close(s.ended)
	}
	s.closed = true
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			<-c.done
			if c.cs != nil {
				s.a.endBridges(c)
				c.cs.Close()
			}
		})
	}
	wg.Wait()
}

// setLevel records the downstream session's logging level and passes it to
// its open upstream sessions.
//
//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
func (s *aggSession) setLevel(ctx context.Context, level mcp.LoggingLevel) {
	s.mu.Lock()
	s.level = level
	var open []*mcp.ClientSession
	for _, c := range s.conns {
		select {
		case <-c.done:
			if c.cs != nil {
				open = append(open, c.cs)
			}
		default:
		}
	}
	s.mu.Unlock()
	for _, cs := range open {
		//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		_ = cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level})
	}
}

// conn returns the downstream session's upstream session to up, opening it
// on first use, or for a shared stdio upstream a lease of its one session
// (started if it was closed for idleness). The wait is bounded by ctx.
// Call release when the call ends.
func (a *Aggregate) conn(ctx context.Context, ss *mcp.ServerSession, up *aggUpstream) (c *aggConn, release func(), err error) {
	if ss == nil {
		return nil, nil, errors.New("no downstream session")
	}
	if up.shared {
		return a.sharedConn(ctx, up)
	}
	if a.per.upstreams[up.cfg.Name] {
		// Never a session's or a token's: the person's own.
		owner, token := a.callerOf(ctx, ss)
		return a.personConn(ctx, owner, token, up)
	}
	if modernSession(ss) {
		s, done, err := a.principalSession(ctx)
		if err != nil {
			return nil, nil, err
		}
		c, err = a.connOf(ctx, s, up)
		if err != nil {
			done()
			return nil, nil, err
		}
		return c, done, nil
	}
	c, err = a.ownConn(ctx, ss, up)
	return c, func() {}, err
}

func (a *Aggregate) ownConn(ctx context.Context, ss *mcp.ServerSession, up *aggUpstream) (*aggConn, error) {
	return a.connOf(ctx, a.session(ss), up)
}

func (a *Aggregate) connOf(ctx context.Context, s *aggSession, up *aggUpstream) (*aggConn, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("the downstream session is closed")
	}
	if a.per.upstreams[up.cfg.Name] != (s.owner != "") {
		// A per-person upstream is reached on its person's session
		// alone, and a person session reaches no other upstream.
		s.mu.Unlock()
		return nil, fmt.Errorf("upstream %q: %w", up.cfg.Name, errNoPerson)
	}
	c := s.conns[up.cfg.Name]
	if c == nil {
		c = &aggConn{done: make(chan struct{}), progress: map[string]context.Context{}, home: s}
		s.conns[up.cfg.Name] = c
		go s.open(up, c)
	}
	s.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if c.err != nil {
		return nil, c.err
	}
	return c, nil
}

// forgetIn drops c from the connections of the session that opened it,
// if it is still there (a lease of a shared session has none).
func (c *aggConn) forgetIn(name string) {
	if c.home != nil {
		c.home.forget(name, c)
	}
}

// forget drops c from the session's connections if it is still there, so
// that the next call opens a new one.
func (s *aggSession) forget(name string, c *aggConn) {
	s.mu.Lock()
	if s.conns[name] == c {
		delete(s.conns, name)
	}
	s.mu.Unlock()
}

// open connects c to up, forwarding the upstream's requests and
// notifications to this downstream session. A principal's session (ss
// nil, see principalSession) forwards progress to the 2026-07-28 request it
// belongs to, drops log messages (that protocol has no session log level)
// and offers the upstream no server-to-client requests: its clients are
// asked for input through input-required answers instead.
func (s *aggSession) open(up *aggUpstream, c *aggConn) {
	a, ss := s.a, s.ss
	opts := &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		LoggingMessageHandler: func(ctx context.Context, req *mcp.LoggingMessageRequest) {
			down := context.WithoutCancel(c.requestCtx(ctx, nil))
			target := downSession(down, ss)
			c.forward(func() {
				if target != nil && target == ss {
					//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
					_ = target.Log(down, req.Params)
				}
			})
		},
		ProgressNotificationHandler: func(ctx context.Context, req *mcp.ProgressNotificationClientRequest) {
			if s.owner != "" {
				c.personProgress(ctx, req.Params)
				return
			}
			down := context.WithoutCancel(c.requestCtx(ctx, req.Params.ProgressToken))
			target := downSession(down, ss)
			c.forward(func() {
				if target != nil {
					_ = target.NotifyProgress(down, req.Params)
				}
			})
		},
	}
	down := downCapabilities(ss)
	//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	if down != nil && down.Sampling != nil {
		//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		opts.Capabilities.Sampling = &mcp.SamplingCapabilities{}
		//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		opts.CreateMessageHandler = func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
			return ss.CreateMessage(c.requestCtx(ctx, nil), req.Params)
		}
	}
	if down != nil && down.Elicitation != nil {
		e := *down.Elicitation
		opts.Capabilities.Elicitation = &e
		// Declares the capability; the requests themselves are relayed by
		// the middleware below, before go-sdk's client checks them.
		opts.ElicitationHandler = func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return elicitAsIs(c.requestCtx(ctx, nil), ss, req.Params)
		}
	}
	//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	if down != nil && down.RootsV2 != nil {
		//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		opts.Capabilities.RootsV2 = &mcp.RootCapabilities{ListChanged: down.RootsV2.ListChanged}
	}
	if ss == nil {
		// A principal session: to a 2025-11-25 upstream it offers what a
		// 2026-07-28 client can answer through input-required results
		// (see aggregate_bridge.go). A 2026-07-28 upstream gets each
		// request's own client capabilities instead.
		opts.Capabilities = &mcp.ClientCapabilities{
			Elicitation: &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}},
			//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
			Sampling: &mcp.SamplingCapabilities{},
			//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
			RootsV2: &mcp.RootCapabilities{},
		}
	}
	// Input-required answers come back to the route (see aggregate_mrtr.go).
	opts.MultiRoundTrip = &mcp.MultiRoundTripOptions{Disabled: true}
	client := mcp.NewClient(&mcp.Implementation{Name: "zidane-mcp-broker", Version: "1"}, opts)
	if ss == nil {
		client.AddReceivingMiddleware(bridgeMiddleware(c))
	} else {
		client.AddReceivingMiddleware(relayMiddleware(ss, c, down))
	}
	c.client = client
	cs, err := a.dialOn(up, client, s.transportFor(up))
	if err == nil {
		s.applyLevel(up, cs)
	}
	if err == nil && up.notes != nil {
		c.received = up.notes.counter(cs.ID())
	}
	unwatch := func() {}
	if err == nil {
		unwatch = up.tr.WatchLimit(cs.ID(), func(err error) { c.overLimit.Store(&err) })
	}
	c.cs, c.err = cs, err
	if err != nil {
		// Forgotten before the waiters wake: a caller that sees the
		// failure finds the session without it (a person session that
		// holds nothing is let go at once, see releasePerson).
		s.forget(up.cfg.Name, c)
		close(c.done)
		return
	}
	close(c.done)
	go func() {
		cs.Wait()
		c.stopForwarding()
		unwatch()
		if up.notes != nil {
			up.notes.forget(cs.ID())
		}
		s.forget(up.cfg.Name, c)
	}()
}

// applyLevel sets, on cs, the log level the downstream client set on the
// session, if it set one.
func (s *aggSession) applyLevel(up *aggUpstream, cs *mcp.ClientSession) {
	s.mu.Lock()
	level := s.level
	s.mu.Unlock()
	if level == "" {
		return
	}
	ctx, cancel := context.WithTimeout(s.a.ctx, up.timeout)
	defer cancel()
	//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	_ = cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level})
}

// downCapabilities are the capabilities the downstream client of ss
// declared, or nil (for a principal's session, ss nil, as well).
func downCapabilities(ss *mcp.ServerSession) *mcp.ClientCapabilities {
	if ss == nil {
		return nil
	}
	if ip := ss.InitializeParams(); ip != nil {
		return ip.Capabilities
	}
	return nil
}

// relayMiddleware answers two of the upstream's requests with the
// downstream client's answers, as they are:
//
//   - elicitation/create goes to the downstream client without go-sdk's
//     client-side schema check, which refuses schemas the spec allows (a
//     titled multi-select whose items carry both "type" and "anyOf", as in
//     the conformance suite's SEP-1330 scenario); the downstream client
//     checks what it is shown, and the upstream checks what comes back;
//   - roots/list is the downstream client's own list (go-sdk's client would
//     answer with its own, empty, list).
func relayMiddleware(ss *mcp.ServerSession, c *aggConn, down *mcp.ClientCapabilities) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			switch method {
			case "elicitation/create":
				if r, ok := req.(*mcp.ElicitRequest); ok && down != nil && down.Elicitation != nil {
					return elicitAsIs(c.requestCtx(ctx, nil), ss, r.Params)
				}
			case "roots/list":
				//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
				if down != nil && down.RootsV2 != nil {
					//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
					return ss.ListRoots(c.requestCtx(ctx, nil), &mcp.ListRootsParams{})
				}
			}
			return next(ctx, method, req)
		}
	}
}

// elicitAsIs sends params to the downstream client and returns its answer
// as it came. go-sdk's ServerSession.Elicit checks an accepted answer
// against the schema with the same rules as its client, and refuses the
// answer to a schema it does not know how to check; the upstream that asked
// checks the answer itself. [elicitResultHolder] (a sending middleware on
// the aggregate's server) keeps the answer and hands Elicit one without
// content, which it returns unchecked.
func elicitAsIs(ctx context.Context, ss *mcp.ServerSession, params *mcp.ElicitParams) (*mcp.ElicitResult, error) {
	h := new(elicitHeld)
	res, err := ss.Elicit(context.WithValue(ctx, elicitHeldKey{}, h), params)
	if err != nil {
		return nil, err
	}
	if h.res != nil {
		return h.res, nil
	}
	return res, nil
}

type elicitHeldKey struct{}

type elicitHeld struct{ res *mcp.ElicitResult }

// elicitResultHolder is the sending middleware of [elicitAsIs].
func elicitResultHolder(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		h, ok := ctx.Value(elicitHeldKey{}).(*elicitHeld)
		r, isElicit := res.(*mcp.ElicitResult)
		if err != nil || !ok || !isElicit || r == nil {
			return res, err
		}
		h.res = r
		return &mcp.ElicitResult{Action: r.Action}, nil
	}
}

// rootsChanged tells every open upstream session of the downstream
// session that its roots changed, so the upstreams ask again.
func (s *aggSession) rootsChanged() {
	s.mu.Lock()
	var open []*aggConn
	for _, c := range s.conns {
		select {
		case <-c.done:
			if c.cs != nil && c.client != nil {
				open = append(open, c)
			}
		default:
		}
	}
	s.mu.Unlock()
	for _, c := range open {
		c.notifyRootsChanged()
	}
}

// rootsMarker is the one root the broker's client holds, only so that
// go-sdk sends notifications/roots/list_changed: it has no API to send it
// otherwise. roots/list never returns it (see relayMiddleware).
//
//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
var rootsMarker = &mcp.Root{URI: "urn:zidane:roots-changed", Name: "roots changed"}

// notifyRootsChanged sends one notifications/roots/list_changed on c's
// upstream session: adding the marker root and removing it each notify
// once.
func (c *aggConn) notifyRootsChanged() {
	c.rootMu.Lock()
	defer c.rootMu.Unlock()
	if c.marker {
		//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		c.client.RemoveRoots(rootsMarker.URI)
	} else {
		//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		c.client.AddRoots(rootsMarker)
	}
	c.marker = !c.marker
}

// track registers a downstream request in flight on c, so that the
// upstream's progress and requests for it reach its stream.
func (c *aggConn) track(ctx context.Context, token any) func() {
	key := ""
	if token != nil {
		key = fmt.Sprint(token)
	}
	c.mu.Lock()
	if key != "" {
		c.progress[key] = ctx
	}
	c.calls = append(c.calls, ctx)
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		if key != "" && c.progress[key] == ctx {
			delete(c.progress, key)
		}
		for i, x := range c.calls {
			if x == ctx {
				c.calls = append(c.calls[:i], c.calls[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
	}
}

// requestCtx returns a context for a message forwarded downstream: the
// cancellation of ctx (the upstream's handler), with the values of the
// downstream request it belongs to (the request with this progress token,
// else the latest in flight), which tell go-sdk which stream to send it on.
func (c *aggConn) requestCtx(ctx context.Context, token any) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	var down context.Context
	if token != nil {
		down = c.progress[fmt.Sprint(token)]
	}
	if down == nil && len(c.calls) > 0 {
		down = c.calls[len(c.calls)-1]
	}
	if down == nil {
		return ctx
	}
	return valuesFrom{Context: ctx, values: down}
}

// clientProgressKey holds, in a call's tracked context on a person's
// session, the progress token its client chose.
type clientProgressKey struct{}

// ownProgressToken returns meta with a progress token of the route's own
// in place of the client's, and that token.
func ownProgressToken(meta mcp.Meta) (mcp.Meta, string) {
	ours := fmt.Sprintf("zidane-%d", sharedTokens.Add(1))
	out := make(mcp.Meta, len(meta)+1)
	for k, v := range meta {
		out[k] = v
	}
	out["progressToken"] = ours
	return out, ours
}

// personProgress forwards the upstream's progress on a person's session
// to the one call whose own token it carries, under its client's token;
// progress under any other token is dropped (the latest call, which other
// sessions' progress falls back to, may be another client's).
func (c *aggConn) personProgress(ctx context.Context, params *mcp.ProgressNotificationParams) {
	c.mu.Lock()
	call := c.progress[fmt.Sprint(params.ProgressToken)]
	c.mu.Unlock()
	if call == nil {
		return
	}
	token := call.Value(clientProgressKey{})
	target, _ := call.Value(downSessionKey{}).(*mcp.ServerSession)
	if token == nil || target == nil {
		return
	}
	p := *params
	p.ProgressToken = token
	down := context.WithoutCancel(valuesFrom{Context: ctx, values: call})
	c.forward(func() { _ = target.NotifyProgress(down, &p) })
}

// valuesFrom is ctx's deadline and cancellation with values's values.
type valuesFrom struct {
	context.Context
	values context.Context
}

func (v valuesFrom) Value(key any) any {
	if x := v.values.Value(key); x != nil {
		return x
	}
	return v.Context.Value(key)
}

// unreachable is the tool result for an upstream that could not be used.
func (a *Aggregate) unreachable(up *aggUpstream, err error) *mcp.CallToolResult {
	if a.per.upstreams[up.cfg.Name] {
		text := fmt.Sprintf("the upstream MCP server %q could not be reached: %s; try again later", up.cfg.Name, upstream.SafeError(err))
		switch {
		case errors.Is(err, upstreamauth.ErrConnectRequired) && a.per.connectRequired == nil:
			text = fmt.Sprintf("%q takes your own account, and yours is not connected there; this gateway makes no links to connect one (it signs no one in): ask its operator", up.cfg.Name)
		case errors.Is(err, upstreamauth.ErrConnectRequired):
			text = fmt.Sprintf("%q takes your own account, and yours is not connected there: call %s to get a link to connect it, then list tools again",
				up.cfg.Name, a.publicName(up, ConnectToolName))
		case errors.Is(err, errTooManyPeople):
			text = fmt.Sprintf("%q: %s", up.cfg.Name, errTooManyPeople)
		case errors.Is(err, upstreamauth.ErrSignInRequired):
			// The person's token comes from their sign-in, which gave
			// none: what to do is sign in again, not try later.
			var sre *upstreamauth.SignInRequiredError
			if errors.As(err, &sre) {
				text = sre.Error()
			}
		}
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
	}
	if errors.Is(err, upstreamauth.ErrAuthRequired) || (a.authRequired != nil && a.authRequired(up.cfg.Name)) {
		return &mcp.CallToolResult{
			IsError: true,
			Content: []mcp.Content{&mcp.TextContent{Text: upstreamauth.LoginRequiredMessage(up.cfg.Name, err)}},
		}
	}
	return &mcp.CallToolResult{
		IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("the upstream MCP server %q could not be reached: %s; try again later, and if it persists ask the operator to check the broker log", up.cfg.Name, upstream.SafeError(err))}},
	}
}

func (a *Aggregate) toolHandler(up *aggUpstream, orig string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		start := time.Now()
		if req.Extra != nil {
			ctx = upstream.TraceFromHeader(ctx, req.Extra.Header)
		}
		rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: "tools/call", Tool: orig}
		rec.TokenID, rec.TokenName = a.principal(ctx, req.Session, req.Extra)
		rec.ClientIP = upstream.ExtraClientIP(req.Extra)
		c, release, err := a.conn(ctx, req.Session, up)
		if err != nil {
			rec.Outcome, rec.Detail = outcome(ctx, err)
			if errors.Is(err, upstreamauth.ErrConnectRequired) {
				rec.Outcome = upstream.OutcomeConnectRequired
			}
			a.record(rec, start)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return a.unreachable(up, err), nil
		}
		defer release()
		meta := req.Params.Meta
		if c.shared {
			var unroute func()
			meta, unroute = a.sharedProgressToken(ctx, up, req.Session, meta, req.Params.GetProgressToken())
			defer unroute()
		} else {
			tctx, token := trackCtx(ctx, req.Session), req.Params.GetProgressToken()
			if c.home != nil && c.home.owner != "" && token != nil {
				// A person's session serves all their tokens, whose
				// clients choose progress tokens that may meet: the call
				// gets one of the route's own, and its progress goes back
				// under the client's (see personProgress).
				tctx = context.WithValue(tctx, clientProgressKey{}, token)
				meta, token = ownProgressToken(meta)
			}
			untrack := c.track(tctx, token)
			defer untrack()
		}
		params := &mcp.CallToolParams{Meta: upstreamMeta(meta, c.cs, req.Session), Name: orig,
			InputResponses: req.Params.InputResponses, RequestState: req.Params.RequestState}
		if len(req.Params.Arguments) > 0 {
			params.Arguments = req.Params.Arguments
		}
		var res *mcp.CallToolResult
		if bridged(req.Session, c) {
			res, err = a.bridgeCallTool(ctx, c, req.Params.Name, params)
		} else {
			res, err = callRounds(ctx, c.cs, req.Session, params)
		}
		// The answer goes out after the log and progress notifications
		// the upstream sent before it.
		c.awaitNotes(ctx)
		rec.Outcome, rec.Detail = outcome(ctx, err)
		if errors.Is(err, upstreamauth.ErrConnectRequired) {
			rec.Outcome = upstream.OutcomeConnectRequired
		}
		if err == nil && res != nil && res.IsError {
			rec.Outcome = upstream.OutcomeError
			rec.Detail = "the tool reported an error"
		}
		a.record(rec, start)
		var ie *inputError
		rpcErr := upstreamRPCError(err)
		switch {
		case err == nil:
			if res != nil {
				res.Content = upstream.NormalizeContent(res.Content)
			}
			return res, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case c.overLimit.Load() != nil:
			c.forgetIn(up.cfg.Name)
			return overLimitResult(c.limitFailure()), nil
		case errors.Is(err, upstreamauth.ErrAuthRequired):
			// go-sdk reports the transport's refusal as a JSON-RPC error;
			// the caller gets the tool error that says how to log in.
			return a.unreachable(up, err), nil
		case rpcErr != nil:
			return nil, rpcErr
		case errors.As(err, &ie):
			return inputFailed(up, ie), nil
		case answerlimit.Exceeded(err):
			// A 2026-07-28 upstream has no session id to watch the limit
			// by: the failure comes back as the call's error.
			c.forgetIn(up.cfg.Name)
			return overLimitResult(err), nil
		default:
			if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) {
				c.forgetIn(up.cfg.Name)
			}
			return a.unreachable(up, err), nil
		}
	}
}

// forwardErr turns an upstream failure into the error a downstream request
// gets: the upstream's JSON-RPC error as it is, else one naming it.
func forwardErr(ctx context.Context, up *aggUpstream, err error) error {
	if ctx.Err() != nil {
		return err
	}
	if rpcErr := upstreamRPCError(err); rpcErr != nil {
		return rpcErr
	}
	if answerlimit.Exceeded(err) {
		return errors.New(upstream.LimitMessage(err))
	}
	return fmt.Errorf("the upstream MCP server %q could not be reached: %s", up.cfg.Name, upstream.SafeError(err))
}

func (a *Aggregate) promptHandler(up *aggUpstream, orig string) mcp.PromptHandler {
	return func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		start := time.Now()
		rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: "prompts/get"}
		rec.TokenID, rec.TokenName = a.principal(ctx, req.Session, req.Extra)
		rec.ClientIP = upstream.ExtraClientIP(req.Extra)
		res, err := withConnT(a, ctx, req.Session, up, func(c *aggConn) (*mcp.GetPromptResult, error) {
			// A multi-round-trip retry's answers and state go to the
			// upstream as they came (go-sdk's server fulfils an older
			// client's input requests and calls this handler again with
			// them).
			params := &mcp.GetPromptParams{Meta: upstreamMeta(req.Params.Meta, c.cs, req.Session), Name: orig, Arguments: req.Params.Arguments,
				InputResponses: req.Params.InputResponses, RequestState: req.Params.RequestState}
			if bridged(req.Session, c) {
				return bridgeDo(a, ctx, c, "prompts/get "+req.Params.Name, params.RequestState, params.InputResponses,
					func(ctx context.Context) (*mcp.GetPromptResult, error) { return c.cs.GetPrompt(ctx, params) },
					func(reqs mcp.InputRequestMap, state string) *mcp.GetPromptResult {
						return &mcp.GetPromptResult{InputRequests: reqs, RequestState: state}
					})
			}
			return c.cs.GetPrompt(ctx, params)
		})
		rec.Outcome, rec.Detail = outcome(ctx, err)
		a.record(rec, start)
		if err != nil {
			return nil, forwardErr(ctx, up, err)
		}
		return res, nil
	}
}

func (a *Aggregate) resourceHandler(up *aggUpstream) mcp.ResourceHandler {
	return func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		start := time.Now()
		rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: "resources/read"}
		rec.TokenID, rec.TokenName = a.principal(ctx, req.Session, req.Extra)
		rec.ClientIP = upstream.ExtraClientIP(req.Extra)
		res, err := withConnT(a, ctx, req.Session, up, func(c *aggConn) (*mcp.ReadResourceResult, error) {
			params := &mcp.ReadResourceParams{Meta: upstreamMeta(req.Params.Meta, c.cs, req.Session), URI: req.Params.URI,
				InputResponses: req.Params.InputResponses, RequestState: req.Params.RequestState}
			if bridged(req.Session, c) {
				return bridgeDo(a, ctx, c, "resources/read "+req.Params.URI, params.RequestState, params.InputResponses,
					func(ctx context.Context) (*mcp.ReadResourceResult, error) { return c.cs.ReadResource(ctx, params) },
					func(reqs mcp.InputRequestMap, state string) *mcp.ReadResourceResult {
						return &mcp.ReadResourceResult{InputRequests: reqs, RequestState: state}
					})
			}
			return c.cs.ReadResource(ctx, params)
		})
		rec.Outcome, rec.Detail = outcome(ctx, err)
		a.record(rec, start)
		if err != nil {
			return nil, forwardErr(ctx, up, err)
		}
		return res, nil
	}
}

// withConn runs fn on the session's upstream session to up.
func withConnT[T any](a *Aggregate, ctx context.Context, ss *mcp.ServerSession, up *aggUpstream, fn func(*aggConn) (T, error)) (T, error) {
	var zero T
	c, release, err := a.conn(ctx, ss, up)
	if err != nil {
		return zero, err
	}
	defer release()
	untrack := c.track(trackCtx(ctx, ss), nil)
	defer untrack()
	res, err := fn(c)
	if err != nil && ctx.Err() == nil {
		if lerr := c.limitFailure(); lerr != nil {
			c.forgetIn(up.cfg.Name)
			return zero, lerr
		}
	}
	if err != nil && (errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing)) {
		c.forgetIn(up.cfg.Name)
	}
	return res, err
}

// limitFailure is the answer-limit failure that closed c's upstream
// session, or nil. The session is closed as well, so the upstream frees
// what it holds for it.
func (c *aggConn) limitFailure() error {
	p := c.overLimit.Load()
	if p == nil {
		return nil
	}
	if c.cs != nil && !c.shared {
		c.closeOnce.Do(func() { go c.cs.Close() })
	}
	return *p
}

// overLimitResult is the tool result of a call whose answer was over a
// limit: an error that names the upstream and the limit.
func overLimitResult(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: upstream.LimitMessage(err)}},
	}
}

// complete routes completion/complete by its reference: a prompt name or a
// resource URI (or URI template).
func (a *Aggregate) complete(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	ref := req.Params.Ref
	var (
		up  *aggUpstream
		out = *ref
	)
	a.mu.Lock()
	switch ref.Type {
	case "ref/prompt":
		if q, ok := a.prompts[ref.Name]; ok {
			up = a.byName[q.Server]
			out.Name = q.Name
		}
	case "ref/resource":
		if owner, ok := a.completionResourceLocked(ref.URI); ok {
			up = a.byName[owner]
		}
	}
	a.mu.Unlock()
	if up == nil {
		return nil, fmt.Errorf("completion: no upstream offers %s %q", ref.Type, ref.Name+ref.URI)
	}
	start := time.Now()
	rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: "completion/complete"}
	rec.TokenID, rec.TokenName = a.principal(ctx, req.Session, req.Extra)
	rec.ClientIP = upstream.ExtraClientIP(req.Extra)
	params := *req.Params
	params.Ref = &out
	res, err := withConnT(a, ctx, req.Session, up, func(c *aggConn) (*mcp.CompleteResult, error) {
		p := params
		p.Meta = upstreamMeta(params.Meta, c.cs, req.Session)
		return c.cs.Complete(ctx, &p)
	})
	rec.Outcome, rec.Detail = outcome(ctx, err)
	a.record(rec, start)
	if err != nil {
		return nil, forwardErr(ctx, up, err)
	}
	return res, nil
}

// subscribe forwards a resource subscription through the owner's catalog
// session, once per URI; the server fans its updates out to subscribers.
func (a *Aggregate) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	uri := req.Params.URI
	a.mu.Lock()
	owner, ok := a.resOwner[uri]
	a.mu.Unlock()
	if !ok {
		return fmt.Errorf("resource %q is not offered by any upstream", uri)
	}
	if modernSession(req.Session) && a.mayUse != nil {
		// subscriptions/listen: the edge did not see this resource.
		if p, ok := policy.PrincipalFrom(ctx); !ok || !a.mayUse(p, owner) {
			return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
				"resource %q: this token may not use the upstream that offers it (it needs the scope %s); subscribe to what the token may read", uri, policy.UpstreamScope(owner))}
		}
	}
	up := a.byName[owner]
	a.session(req.Session)
	a.mu.Lock()
	set := a.subs[uri]
	first := len(set) == 0
	if set == nil {
		set = map[*mcp.ServerSession]bool{}
		a.subs[uri] = set
	}
	set[req.Session] = true
	a.mu.Unlock()
	start := time.Now()
	rec := upstream.CallRecord{Upstream: owner, Method: "resources/subscribe"}
	rec.TokenID, rec.TokenName = a.principal(ctx, req.Session, req.Extra)
	rec.ClientIP = upstream.ExtraClientIP(req.Extra)
	var err error
	if first {
		up.mu.Lock()
		cs := up.catalog
		up.mu.Unlock()
		if cs == nil {
			err = errors.New("its catalog session is not connected")
		} else {
			err = cs.Subscribe(ctx, &mcp.SubscribeParams{Meta: upstreamMeta(req.Params.Meta, cs, req.Session), URI: uri})
		}
	}
	rec.Outcome, rec.Detail = outcome(ctx, err)
	a.record(rec, start)
	if err != nil {
		a.mu.Lock()
		delete(a.subs[uri], req.Session)
		if len(a.subs[uri]) == 0 {
			delete(a.subs, uri)
		}
		a.mu.Unlock()
		return forwardErr(ctx, up, err)
	}
	return nil
}

func (a *Aggregate) unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	uri := req.Params.URI
	a.mu.Lock()
	set := a.subs[uri]
	last := set[req.Session] && len(set) == 1
	delete(set, req.Session)
	if len(set) == 0 {
		delete(a.subs, uri)
	}
	a.mu.Unlock()
	if last {
		a.upstreamUnsubscribe(uri)
	}
	return nil
}

// upstreamUnsubscribe ends the catalog's subscription to uri.
func (a *Aggregate) upstreamUnsubscribe(uri string) {
	a.mu.Lock()
	owner := a.resOwner[uri]
	a.mu.Unlock()
	up := a.byName[owner]
	if up == nil {
		return
	}
	up.mu.Lock()
	cs := up.catalog
	up.mu.Unlock()
	if cs == nil {
		return
	}
	ctx, cancel := context.WithTimeout(a.ctx, up.timeout)
	defer cancel()
	_ = cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri})
}

// maxQueuedNotes bounds the notifications an upstream session has waiting
// to go downstream.
const maxQueuedNotes = 256

// forward runs send (a notification going downstream) on c's forwarding
// goroutine, in the order given. go-sdk runs notification handlers one by
// one and queues what arrives meanwhile without bound: a handler that waits
// on a downstream client that reads nothing (a GET stream it never reads)
// would let an upstream's flood pile up in that queue. So the handlers only
// hand over, and past maxQueuedNotes waiting, a notification is dropped.
func (c *aggConn) forward(send func()) {
	c.fwdOnce.Do(func() {
		c.fwd = make(chan func(), maxQueuedNotes)
		if c.fwdStop == nil {
			c.fwdStop = make(chan struct{})
		}
		go c.runForward()
	})
	select {
	case c.fwd <- send:
	default:
		c.dropped.Add(1)
		c.handled.done()
	}
}

func (c *aggConn) runForward() {
	for {
		select {
		case send := <-c.fwd:
			send()
			c.handled.done()
		case <-c.fwdStop:
			return
		}
	}
}

// stopForwarding ends the forwarding goroutine once the upstream session
// has ended; what still waits is dropped.
func (c *aggConn) stopForwarding() {
	c.fwdOnce.Do(func() {}) // no goroutine starts after this
	c.stopOnce.Do(func() {
		if c.fwdStop == nil {
			c.fwdStop = make(chan struct{})
		}
		close(c.fwdStop)
	})
}
