package aggregate

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/internal/mcpidle"
	"github.com/Tahul/caddy-zidane-mcp/internal/sse"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Per-person upstreams ([Options.PerUser], credentials per_user): such an
// upstream is reached only with the calling person's own token, so the
// route keeps no catalog session for it (one would carry someone's token,
// and its listing would be that someone's) and caches no listing of it.
// Instead each person gets a person session ([aggSession] with owner set)
// holding their own upstream sessions, whose every request is marked with
// that person ([upstreamauth.WithCallOwner]), and nobody else's:
//
//   - tools/list answers the shared upstreams' tools, and for each
//     per-person upstream the tools it lists on the caller's own session,
//     asked at that moment (nothing of one person's listing is kept for
//     another). A person who has not connected their account there sees
//     one tool instead, [ConnectToolName] under the upstream's prefix,
//     whose call (like a call of any of that upstream's tools) answers
//     with the connect link: at 2025-11-25 the -32042 error, at 2026-07-28
//     an input_required result carrying the URL elicitation, for a client
//     without URL elicitation a tool error naming the link
//     ([Options.ConnectRequired]). Once the person has connected, the
//     2025-11-25 session that asked gets notifications/elicitation/complete,
//     and every session notifications/tools/list_changed, so that clients
//     list again and see the person's own tools.
//   - tools/call of such an upstream's tool goes on the caller's session
//     to it, opened at the first call, through go-sdk (never the fast
//     paths, which serve the shared sessions).
//   - Prompts, resources and completions of a per-person upstream are not
//     offered: they are listed by the catalog, which such an upstream does
//     not have.
//
// Bounds: at most [Options.MaxPeople] person sessions at once (a person
// beyond them is told to try again later; one who has not connected holds
// none), each closed with its upstream sessions after [Options.PersonIdle]
// without a call. A person's upstream session whose connection is no
// longer usable ([Options.Connected]: the person disconnected, an operator
// revoked it, or their gateway grant was revoked, on this replica or
// another) is closed within personSweep, or at the person's next call.

// perUsers is the route's state of its per-person upstreams.
type perUsers struct {
	upstreams       map[string]bool // their names (Options.PerUser)
	max             int             // Options.MaxPeople
	idle            *mcpidle.Sessions
	connectRequired func(ctx context.Context, owner, upstream string, c message.Call, initCaps []byte) ([]byte, error)
	settle          func(ctx context.Context, owner string, c message.Call) bool
	awaitConnect    func(ctx context.Context, owner, elicitation string) bool
	connected       func(upstream, owner string) bool
	connectState    func(requestState string) bool

	// Under Aggregate.mu:
	people       map[string]*aggSession // owner -> their person session
	sessionOwner map[string]string      // downstream session id -> the owner of its token
}

func newPerUsers(opts Options) perUsers {
	p := perUsers{
		upstreams:       map[string]bool{},
		max:             opts.MaxPeople,
		connectRequired: opts.ConnectRequired,
		settle:          opts.Settle,
		awaitConnect:    opts.AwaitConnect,
		connected:       opts.Connected,
		connectState:    opts.ConnectState,
		people:          map[string]*aggSession{},
		sessionOwner:    map[string]string{},
	}
	if p.max <= 0 {
		p.max = DefaultMaxPeople
	}
	idle := opts.PersonIdle
	if idle <= 0 {
		idle = DefaultPersonIdle
	}
	p.idle = mcpidle.New(idle)
	return p
}

// DefaultMaxPeople is the default of [Options.MaxPeople].
const DefaultMaxPeople = 256

// DefaultPersonIdle is the default of [Options.PersonIdle].
const DefaultPersonIdle = 10 * time.Minute

// personSweep is how often the person sessions are checked against
// [Options.Connected]. It reads memory only (the OAuth clients' state,
// which a revocation on any replica updates).
const personSweep = time.Second

// ConnectToolName is the upstream's own name of the tool a person who has
// not connected their account at a per-person upstream sees in its place.
const ConnectToolName = "connect_account"

// connectWait bounds how long a 2025-11-25 session that got a connect
// link waits for its person to connect before it stops listening: the
// link's own default lifetime.
const connectWait = 10 * time.Minute

// errTooManyPeople refuses a person session beyond Options.MaxPeople.
var errTooManyPeople = errors.New("too many people have their own upstream sessions open on this gateway right now; try again in a few minutes")

// errNoPerson refuses a per-person upstream session for a call that acts
// for no person.
var errNoPerson = fmt.Errorf("the call acts for no person: %w", upstreamauth.ErrConnectRequired)

// ConnectRefusal is what [Options.ConnectRequired] returns for a caller
// who can never connect (a credential of no person who can sign in): the
// route answers the call with this JSON-RPC error and HTTP status, rather
// than as a link that could not be made this time.
type ConnectRefusal struct {
	Status  int
	Code    int
	Message string
}

func (r *ConnectRefusal) Error() string { return r.Message }

// ownerMark marks every request of a person's upstream session with the
// person (see upstreamauth.WithCallOwner).
type ownerMark struct {
	owner string
	next  http.RoundTripper
}

func (t ownerMark) RoundTrip(r *http.Request) (*http.Response, error) {
	return t.next.RoundTrip(r.WithContext(upstreamauth.WithCallOwner(r.Context(), t.owner)))
}

// personTransport is a new go-sdk transport to up for owner's session: the
// upstream's egress client (origin guard, limits, its credentials layer)
// with every request marked as owner's.
func (up *aggUpstream) personTransport(owner string) mcp.Transport {
	hc := *up.tr.HTTP
	hc.Transport = ownerMark{owner: owner, next: up.tr.HTTP.Transport}
	if up.tr.Expanded.Transport == upstream.TransportSSE {
		return &mcp.SSEClientTransport{Endpoint: up.tr.Expanded.URL, HTTPClient: &hc}
	}
	return &mcp.StreamableClientTransport{Endpoint: up.tr.Expanded.URL, HTTPClient: &hc, MaxRetries: up.tr.MaxRetries}
}

// transportFor is the transport of s's session to up: a person's own for
// a person session, the upstream's otherwise.
func (s *aggSession) transportFor(up *aggUpstream) mcp.Transport {
	if s.owner != "" {
		return up.personTransport(s.owner)
	}
	return up.transport()
}

// callerOf is the person a request of downstream session ss acts for and
// the token it came with: a 2026-07-28 request's principal's, else those
// of the token the session is bound to.
func (a *Aggregate) callerOf(ctx context.Context, ss *mcp.ServerSession) (owner, token string) {
	if ss == nil || modernSession(ss) {
		if p, ok := policy.PrincipalFrom(ctx); ok {
			return p.OwnerID(), p.TokenID
		}
		return "", ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.per.sessionOwner[ss.ID()], a.bindings[ss.ID()]
}

// personSession returns owner's person session, creating it on first use
// (at most maxPeople at once), and marks a call in flight on it until done
// is called.
func (a *Aggregate) personSession(owner string) (s *aggSession, done func(), err error) {
	if owner == "" {
		return nil, nil, errNoPerson
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, nil, errors.New("the route is closed")
	}
	s = a.per.people[owner]
	if s == nil {
		if len(a.per.people) >= a.per.max {
			a.mu.Unlock()
			return nil, nil, errTooManyPeople
		}
		s = &aggSession{a: a, conns: map[string]*aggConn{}, idleKey: "person:" + rand.Text(), owner: owner}
		a.per.people[owner] = s
		a.per.idle.Opened(s.idleKey, owner, func() { a.dropPerson(owner, s) })
	}
	s.uses++
	a.mu.Unlock()
	idleDone := a.per.idle.Use(s.idleKey, owner)
	var once sync.Once
	return s, func() {
		once.Do(func() {
			idleDone()
			a.releasePerson(owner, s)
		})
	}, nil
}

// releasePerson ends a call's use of owner's person session s, and drops
// s when no call uses it and it holds no upstream session: a person who
// has not connected (whose every attempt fails) holds no place among
// Options.MaxPeople.
func (a *Aggregate) releasePerson(owner string, s *aggSession) {
	a.mu.Lock()
	s.uses--
	drop := false
	if s.uses == 0 && a.per.people[owner] == s {
		s.mu.Lock()
		if len(s.conns) == 0 {
			drop, s.closed = true, true
		}
		s.mu.Unlock()
		if drop {
			delete(a.per.people, owner)
		}
	}
	a.mu.Unlock()
	if drop {
		a.per.idle.Closed(s.idleKey)
	}
}

// dropPerson closes a person session, idle for PersonIdle.
func (a *Aggregate) dropPerson(owner string, s *aggSession) {
	a.mu.Lock()
	if a.per.people[owner] == s {
		delete(a.per.people, owner)
	}
	a.mu.Unlock()
	a.per.idle.Closed(s.idleKey)
	s.closeAll()
	a.logger.Debug("aggregate: a person's upstream sessions closed after being idle")
}

// personConn returns owner's session to the per-person upstream up,
// opening it on first use, for a call that came with token; release ends
// the call's use of it.
func (a *Aggregate) personConn(ctx context.Context, owner, token string, up *aggUpstream) (*aggConn, func(), error) {
	s, done, err := a.personSession(owner)
	if err != nil {
		return nil, nil, err
	}
	c, err := a.connOf(ctx, s, up)
	if err != nil {
		done()
		return nil, nil, err
	}
	if a.per.connected != nil && !a.per.connected(up.cfg.Name, owner) {
		// Revoked since the session opened, and the sweep has not come
		// by yet: end it now rather than send what cannot go.
		done()
		a.endRevoked(owner, s)
		return nil, nil, &upstreamauth.ConnectRequiredError{Upstream: up.cfg.Name, Reason: "the connection was revoked"}
	}
	c.enter(token)
	return c, func() { c.leave(token); done() }, nil
}

// perUserTool resolves name to a per-person upstream and the upstream's
// own name of the tool, or nil.
func (a *Aggregate) perUserTool(name string) (*aggUpstream, string) {
	if len(a.per.upstreams) == 0 {
		return nil, ""
	}
	server, tool, ok := a.ns.Resolve(name)
	if a.conditional {
		server, tool, ok = a.ups[0].cfg.Name, name, true
	}
	if !ok || !a.per.upstreams[server] {
		return nil, ""
	}
	up := a.byName[server]
	if tool != ConnectToolName && !up.cfg.AllowsTool(tool) {
		// Kept back by the operator's tools allow/deny: not offered, so
		// go-sdk refuses it as an unknown tool, as it does a shared
		// upstream's (whose kept-back tools are never registered).
		return nil, ""
	}
	return up, tool
}

// connectTool is the tool a person who has not connected their account at
// up is listed in place of up's tools.
func (a *Aggregate) connectTool(up *aggUpstream) *mcp.Tool {
	return &mcp.Tool{
		Name: a.publicName(up, ConnectToolName),
		Description: fmt.Sprintf("Connect your own account at %s, so that its tools act as you. Call this tool: it answers with a link to open in your browser. Once connected, list tools again to see %s's tools.",
			up.cfg.Name, up.cfg.Name),
		InputSchema: map[string]any{"type": "object"},
	}
}

// personTools are the tools ctx's person sees of the per-person upstreams:
// each one's own listing on the person's session, or its connect tool when
// the person has no usable connection there. An upstream that failed
// otherwise lists nothing (its calls get a tool error naming it).
func (a *Aggregate) personTools(ctx context.Context, ss *mcp.ServerSession) []*mcp.Tool {
	owner, token := a.callerOf(ctx, ss)
	var out []*mcp.Tool
	for _, up := range a.ups {
		if !a.per.upstreams[up.cfg.Name] {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, aggInitWait)
		listed, err := a.personListing(lctx, owner, token, up)
		cancel()
		switch {
		case errors.Is(err, upstreamauth.ErrConnectRequired):
			out = append(out, a.connectTool(up))
		case err != nil:
			a.logger.Warn("aggregate: a person's own listing of a per_user upstream failed", "upstream", up.cfg.Name, "error", upstream.SafeError(err))
		default:
			out = append(out, listed...)
		}
	}
	return out
}

// listForPerson makes lr, a page of the shared server's tools/list, the
// caller's: the registered connect tools leave it, and its last page gets
// the caller's tools of the per-person upstreams (personTools).
func (a *Aggregate) listForPerson(ctx context.Context, ss *mcp.ServerSession, lr *mcp.ListToolsResult) {
	connect := map[string]bool{}
	for _, up := range a.ups {
		if a.per.upstreams[up.cfg.Name] {
			connect[a.publicName(up, ConnectToolName)] = true
		}
	}
	kept := make([]*mcp.Tool, 0, len(lr.Tools))
	for _, t := range lr.Tools {
		if t != nil && !connect[t.Name] {
			kept = append(kept, t)
		}
	}
	lr.Tools = kept
	// The person's listing changes when they connect or are revoked, and
	// a client that has no subscriptions/listen stream hears of neither:
	// it is stale at once (private, as every listing of the route).
	lr.TTLMs = 0
	if lr.NextCursor == "" {
		lr.Tools = append(lr.Tools, a.personTools(ctx, ss)...)
	}
}

// personListing lists up's tools on owner's own session, named as the
// route offers them.
func (a *Aggregate) personListing(ctx context.Context, owner, token string, up *aggUpstream) ([]*mcp.Tool, error) {
	c, release, err := a.personConn(ctx, owner, token, up)
	if err != nil {
		return nil, err
	}
	defer release()
	listed, _, err := listAll(ctx, a, up, c.cs, "tools", toolPage(c.cs))
	if err != nil {
		if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) || errors.Is(err, upstreamauth.ErrConnectRequired) {
			c.forgetIn(up.cfg.Name)
			go c.cs.Close()
		}
		return nil, err
	}
	out := make([]*mcp.Tool, 0, len(listed))
	for _, t := range listed {
		if t == nil || !up.cfg.AllowsTool(t.Name) {
			continue
		}
		nt := *t
		nt.Name = a.publicName(up, t.Name)
		out = append(out, &nt)
	}
	return out, nil
}

// personToolCall serves a tools/call of a per-person upstream's tool
// through go-sdk on the caller's own session (see [Aggregate.conn]).
func (a *Aggregate) personToolCall(ctx context.Context, req mcp.Request, up *aggUpstream, orig string, p *mcp.CallToolParamsRaw) (mcp.Result, error) {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	if orig == ConnectToolName {
		// The connect tool, called once connected: unless the upstream
		// has a tool of that name itself that its lists offer, which is
		// then called, say so.
		owner, token := a.callerOf(ctx, ss)
		c, release, err := a.personConn(ctx, owner, token, up)
		if err != nil {
			return a.unreachable(up, err), nil
		}
		listed, _, err := listAll(ctx, a, up, c.cs, "tools", toolPage(c.cs))
		release()
		own := up.cfg.AllowsTool(ConnectToolName) && slices.ContainsFunc(listed, func(t *mcp.Tool) bool { return t != nil && t.Name == ConnectToolName })
		if err == nil && !own {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
				"Your account at %s is connected: list tools again to see its tools.", up.cfg.Name)}}}, nil
		}
	}
	if p.RequestState != "" && a.per.connectState != nil && a.per.connectState(p.RequestState) {
		// The retry of the gateway's connect answer: its state and answers
		// were the gateway's, and the upstream gets the call afresh.
		fresh := *p
		fresh.RequestState, fresh.InputResponses = "", nil
		p = &fresh
	}
	return a.toolHandler(up, orig)(ctx, &mcp.CallToolRequest{Session: ss, Params: p, Extra: req.GetExtra()})
}

// servePersonConnect answers, before go-sdk sees it, a tools/call of a
// per-person upstream's tool whose person has no usable connection there:
// with the connect link ([Options.ConnectRequired]). A 2026-07-28 retry
// of a call so answered first waits, bounded, for the person to finish
// connecting ([Options.Settle]). It reports whether it answered.
func (a *Aggregate) servePersonConnect(w http.ResponseWriter, r *http.Request, p policy.Principal, sid string) bool {
	if len(a.per.upstreams) == 0 || a.per.connectRequired == nil {
		return false
	}
	body, ok := message.FromContext(r.Context())
	if !ok || len(body.Calls) != 1 || body.Calls[0].Method != "tools/call" {
		return false
	}
	call := body.Calls[0]
	up, _ := a.perUserTool(call.Tool)
	if up == nil {
		return false
	}
	owner := p.OwnerID()
	ctx := r.Context()
	declined := false
	if a.per.settle != nil && call.HasMetaVersion {
		declined = a.per.settle(ctx, owner, call)
	}
	if !declined {
		_, release, err := a.personConn(ctx, owner, p.TokenID, up)
		if err == nil {
			release()
			return false // connected: go-sdk's path serves it
		}
		if !errors.Is(err, upstreamauth.ErrConnectRequired) {
			return false // go-sdk's path reports it as a tool error
		}
	}
	var initCaps []byte
	var ss *mcp.ServerSession
	if sid != "" {
		a.mu.Lock()
		if s := a.byID[sid]; s != nil {
			ss = s.ss
		}
		a.mu.Unlock()
		if caps := downCapabilities(ss); caps != nil {
			initCaps, _ = json.Marshal(caps)
		}
	}
	answer, err := a.per.connectRequired(ctx, owner, up.cfg.Name, call, initCaps)
	rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: "tools/call", Tool: call.Tool, Outcome: upstream.OutcomeConnectRequired,
		TokenID: p.TokenID, TokenName: p.Name, ClientIP: r.Header.Get(upstream.ClientIPHeader), Detail: "the person has not connected their account"}
	a.record(rec, time.Now())
	var refusal *ConnectRefusal
	switch {
	case errors.As(err, &refusal):
		upstream.WriteRPCError(w, refusal.Status, call.ID.Raw(), refusal.Code, refusal.Message)
		return true
	case err != nil:
		upstream.WriteRPCError(w, http.StatusServiceUnavailable, call.ID.Raw(), message.CodeUnavailable,
			fmt.Sprintf("your account at %s is not connected, and a link to connect it could not be made (%s); try again", up.cfg.Name, upstream.SafeError(err)))
		return true
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(answer)
	if ss != nil && a.per.awaitConnect != nil {
		if id := answerElicitation(answer); id != "" {
			a.mu.Lock()
			if !a.closed {
				a.wg.Add(1) // under a.mu: never after Close's Wait began
				go a.afterConnect(ss, owner, id)
			}
			a.mu.Unlock()
		}
	}
	return true
}

// afterConnect waits, bounded, for owner to finish connecting through the
// link of elicitation id that session ss was given, and then tells ss
// (notifications/elicitation/complete, on which a 2025-11-25 client
// retries) and every session (tools/list_changed: the person's listing
// changed).
func (a *Aggregate) afterConnect(ss *mcp.ServerSession, owner, id string) {
	defer a.wg.Done()
	ctx, cancel := context.WithTimeout(a.ctx, connectWait)
	defer cancel()
	ended := a.session(ss).endedCh()
	go func() {
		// Ends with the wait: the session's end, or the wait's.
		select {
		case <-ended:
			cancel()
		case <-ctx.Done():
		}
	}()
	if !a.per.awaitConnect(ctx, owner, id) {
		return
	}
	if err := ss.NotifyElicitationComplete(ctx, &mcp.ElicitationCompleteParams{ElicitationID: id}); err != nil && ctx.Err() == nil {
		// go-sdk drops a notification no GET stream is open to carry (the
		// route keeps no event store): the session's next stream does.
		s := a.session(ss)
		s.untell(id)
		// A stream that opened between the two took nothing from untell
		// and missed the notification: once it is open, this reaches it.
		if ss.NotifyElicitationComplete(ctx, &mcp.ElicitationCompleteParams{ElicitationID: id}) == nil {
			s.takeUntold()
		} else {
			a.logger.Debug("aggregate: no GET stream was open to carry notifications/elicitation/complete; the session's next one carries it",
				"session", ss.ID())
		}
	}
	a.personListChanged()
}

// maxUntold bounds the completions a session keeps for its next stream.
const maxUntold = 8

// untell keeps elicitation id, whose completion s's client was not told
// for want of a GET stream, for its next one.
func (s *aggSession) untell(id string) {
	s.untoldMu.Lock()
	defer s.untoldMu.Unlock()
	if len(s.untold) == maxUntold {
		s.untold = s.untold[1:]
	}
	s.untold = append(s.untold, id)
}

// takeUntold returns, as event stream messages, the completions kept by
// untell and notifications/tools/list_changed (go-sdk dropped that too),
// and forgets them; nothing when there are none.
func (s *aggSession) takeUntold() []byte {
	s.untoldMu.Lock()
	ids := s.untold
	s.untold = nil
	s.untoldMu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	var out []byte
	for _, id := range ids {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/elicitation/complete", "params": map[string]string{"elicitationId": id}})
		out = sse.AppendMessage(out, b)
	}
	return sse.AppendMessage(out, []byte(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`))
}

// tellingWriter is the response of a session's GET stream: go-sdk
// flushes the stream's headers while it holds the stream's lock, before
// the stream takes messages, and at that first flush what untell kept is
// written, ahead of anything go-sdk sends on it. A GET go-sdk refuses
// (another stream is open) never flushes, and leaves it kept.
type tellingWriter struct {
	http.ResponseWriter
	s    *aggSession
	told bool
}

func (t *tellingWriter) FlushError() error {
	if !t.told {
		t.told = true
		if msgs := t.s.takeUntold(); msgs != nil {
			if _, err := t.ResponseWriter.Write(msgs); err != nil {
				return err
			}
		}
	}
	return http.NewResponseController(t.ResponseWriter).Flush()
}

func (t *tellingWriter) Flush() { _ = t.FlushError() }

func (t *tellingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// personListChanged sends notifications/tools/list_changed to every
// session: a person's listing changed. go-sdk sends it when a tool is
// added, so the first per-person upstream's connect tool (which the route
// registers) is added again, unchanged.
func (a *Aggregate) personListChanged() {
	for _, up := range a.ups {
		if a.per.upstreams[up.cfg.Name] {
			a.server.AddTool(a.connectTool(up), a.connectToolHandler(up))
			return
		}
	}
}

// connectToolHandler serves the connect tool when go-sdk gets its call
// (the middleware takes every call of a per-person upstream's tools first).
func (a *Aggregate) connectToolHandler(up *aggUpstream) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		res, err := a.personToolCall(ctx, req, up, ConnectToolName, req.Params)
		if err != nil {
			return nil, err
		}
		r, _ := res.(*mcp.CallToolResult)
		return r, nil
	}
}

// answerElicitation is the elicitation id a connect answer carries: in
// the -32042 error's data, or an input_required result's requestState.
func answerElicitation(answer []byte) string {
	var v struct {
		Error *struct {
			Data struct {
				Elicitations []struct {
					ElicitationID string `json:"elicitationId"`
				} `json:"elicitations"`
			} `json:"data"`
		} `json:"error"`
	}
	if json.Unmarshal(answer, &v) != nil || v.Error == nil || len(v.Error.Data.Elicitations) != 1 {
		return ""
	}
	return v.Error.Data.Elicitations[0].ElicitationID
}

// sweepPeople closes, every personSweep, the person's upstream sessions
// whose connection is no longer usable (Options.Connected).
func (a *Aggregate) sweepPeople() {
	defer a.wg.Done()
	t := time.NewTicker(personSweep)
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		people := make(map[string]*aggSession, len(a.per.people))
		for o, s := range a.per.people {
			people[o] = s
		}
		a.mu.Unlock()
		for owner, s := range people {
			a.endRevoked(owner, s)
		}
	}
}

// endRevoked closes s's upstream sessions (of person owner) whose
// connection is no longer usable.
func (a *Aggregate) endRevoked(owner string, s *aggSession) {
	s.mu.Lock()
	open := make(map[string]*aggConn, len(s.conns))
	for name, c := range s.conns {
		select {
		case <-c.done:
			if c.cs != nil {
				open[name] = c
			}
		default: // still opening
		}
	}
	s.mu.Unlock()
	// Asked without s.mu: the answer may need the person's OAuth client
	// made again (and, on NATS, its record watched).
	for name := range open {
		if a.per.connected(name, owner) {
			delete(open, name)
		}
	}
	var ended []*aggConn
	s.mu.Lock()
	for name, c := range open {
		if s.conns[name] == c {
			delete(s.conns, name)
			ended = append(ended, c)
		}
	}
	s.mu.Unlock()
	for _, c := range ended {
		a.endBridges(c)
		c.cs.Close()
		a.logger.Info("aggregate: a person's upstream session closed: their connection was revoked or disconnected")
	}
	if len(ended) > 0 {
		a.personListChanged() // their listing is the connect tool again
	}
}
