package aggregate

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The bridge: a 2026-07-28 client's call (tools/call, prompts/get,
// resources/read) to an upstream that speaks only 2025-11-25.
//
// Such an upstream asks for input by sending requests to the gateway's
// client (elicitation/create, sampling/createMessage, roots/list) while the
// call is pending. A 2026-07-28 client cannot be sent requests, so the
// route turns them into a multi-round-trip answer: the call stays pending
// upstream, and the client gets an input-required result holding the
// upstream's requests and a requestState the gateway sealed. The client's
// retry (a new request for the same tool, prompt or resource, authorized
// by the edge as any) carries the answers and that state; the route opens the state,
// answers the upstream's requests with them, and waits for the call's
// result or for its next requests.
//
// The sealed state is AES-GCM under a key the route draws at start: it
// names the token that made the call, the method and tool, prompt or
// resource as the client named them, and the pending call, so a state that
// is altered, forged, replayed by another token or sent with another
// request is refused (JSON-RPC -32602,
// "call the tool again without requestState"). A requestState the gateway
// did not seal (one the upstream gave) goes to the upstream untouched.
//
// Bounds: a pending call waits at most bridgeRoundWait for each retry
// (then it is cancelled upstream and its state opens nothing), each token
// has at most bridgeMaxPerToken pending calls, and the route
// bridgeMaxPending. The upstream's requests during a call go to the
// token's latest pending call to that upstream: calls of one token in
// parallel to one 2025-11-25 upstream may see each other's questions, as
// the calls of one session may on the session route.

const (
	bridgeRoundWait   = 2 * time.Minute
	bridgeMaxPerToken = 16
	bridgeMaxPending  = 1024
	// bridgeSealPrefix starts every requestState the gateway seals with
	// internal/seal; bridgeUnboundPrefix, those of earlier releases (the
	// same cipher without the purpose bound in), which still open.
	bridgeSealPrefix    = "zidane-mrtr.2."
	bridgeUnboundPrefix = "zidane-mrtr.1."
	// bridgeSealPurpose is the purpose the bridge key seals states for.
	bridgeSealPurpose = "aggregate requestState"
)

// bridge holds the pending calls of one aggregate.
type bridge struct {
	sealer    *seal.Sealer
	node      string        // named in the states sealed here: a cluster's node id, or empty
	roundWait time.Duration // bridgeRoundWait; tests shorten it

	mu      sync.Mutex
	pending map[string]*bridgeCall
	byToken map[string]int
}

// newBridge seals with key, or a key drawn now when key is nil; node is
// named in every state it seals.
func newBridge(key []byte, node string) *bridge {
	if key == nil {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			panic("aggregate: no randomness for the multi-round-trip seal: " + err.Error())
		}
	}
	sl, err := seal.New(key, bridgeSealPurpose)
	if err != nil {
		panic("aggregate: the multi-round-trip seal's key: " + err.Error())
	}
	return &bridge{sealer: sl, node: node, roundWait: bridgeRoundWait, pending: map[string]*bridgeCall{}, byToken: map[string]int{}}
}

// bridgeCall is one pending upstream call of a 2026-07-28 client.
type bridgeCall struct {
	id, token, call string
	c               *aggConn
	cancel          context.CancelFunc
	done            chan bridgeOutcome // the upstream call's end, once
	ended           chan struct{}      // closed by bridgeEnd
	endOnce         sync.Once

	mu     sync.Mutex
	asks   map[string]*bridgeAsk
	seq    int
	asked  chan struct{} // signalled when an ask is added
	timer  *time.Timer   // the wait for the next retry
	over   bool
	result *bridgeOutcome
}

type bridgeOutcome struct {
	res mcp.Result
	err error
}

// bridgeAsk is one request of the upstream waiting for the client.
type bridgeAsk struct {
	params mcp.InputRequest
	answer chan mcp.InputResponse // buffered 1
	sent   bool
}

// sealed is what a sealed requestState holds.
type sealed struct {
	Token string `json:"t"`
	Call  string `json:"n"` // the method and what it names, as the client sent them
	ID    string `json:"i"`
	// Node holds the pending call (in a cluster).
	Node string `json:"o,omitempty"`
}

func (b *bridge) seal(s sealed) string {
	plain, _ := json.Marshal(s)
	return bridgeSealPrefix + base64.RawURLEncoding.EncodeToString(b.sealer.Seal(nil, plain, []byte(bridgeSealPrefix)))
}

// BridgeNode is the node that holds the pending call a requestState the
// route sealed names, when the route runs in a cluster: "" for a state
// that is not one it sealed, or that names no node.
func (a *Aggregate) BridgeNode(state string) string {
	if !bridgeState(state) {
		return ""
	}
	s, err := a.bridge.open(state)
	if err != nil {
		return ""
	}
	return s.Node
}

// open returns the sealed state's content; an error when it does not open.
func (b *bridge) open(state string) (sealed, error) {
	var s sealed
	var plain []byte
	var err error
	switch {
	case strings.HasPrefix(state, bridgeSealPrefix):
		var raw []byte
		if raw, err = base64.RawURLEncoding.DecodeString(state[len(bridgeSealPrefix):]); err == nil {
			plain, err = b.sealer.Open(nil, raw, []byte(bridgeSealPrefix))
		}
	case strings.HasPrefix(state, bridgeUnboundPrefix):
		var raw []byte
		if raw, err = base64.RawURLEncoding.DecodeString(state[len(bridgeUnboundPrefix):]); err == nil {
			plain, err = b.sealer.OpenUnbound(nil, raw, []byte(bridgeUnboundPrefix))
		}
	default:
		return s, errors.New("it is not one the gateway sealed")
	}
	if err != nil {
		return s, errors.New("it is not one the gateway sealed, or it was altered")
	}
	if err := json.Unmarshal(plain, &s); err != nil {
		return s, errors.New("it is not one the gateway sealed")
	}
	return s, nil
}

// bridgeState reports whether state is one the gateway sealed (or claims
// to be): such a state is the gateway's to open, never the upstream's.
func bridgeState(state string) bool {
	return strings.HasPrefix(state, bridgeSealPrefix) || strings.HasPrefix(state, bridgeUnboundPrefix)
}

// refusedState is the error of a retry whose sealed requestState the
// route refuses.
func refusedState(why string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
		Message: "requestState refused: " + why + "; call the tool again without requestState and inputResponses"}
}

// bridged reports whether calls of ss on c go through the bridge: a
// 2026-07-28 request on a principal session to a 2025-11-25 upstream.
func bridged(ss *mcp.ServerSession, c *aggConn) bool {
	if !modernSession(ss) || c.shared || c.cs == nil || c.home == nil || c.home.ss != nil {
		return false
	}
	ir := c.cs.InitializeResult()
	return ir != nil && ir.ProtocolVersion < protocolModern
}

// bridgeDo serves a 2026-07-28 client's request on c (see bridged): a
// first request, or a retry that carries a sealed requestState (state,
// with the client's answers). call is what names the request (method and
// tool, prompt or resource), run makes it upstream, and needInput builds
// the input-required result of a round.
func bridgeDo[R mcp.Result](a *Aggregate, ctx context.Context, c *aggConn, call, state string, answers mcp.InputResponseMap,
	run func(context.Context) (R, error), needInput func(mcp.InputRequestMap, string) R) (R, error) {
	var zero R
	p, _ := policy.PrincipalFrom(ctx)
	b := a.bridge
	if bridgeState(state) {
		s, err := b.open(state)
		if err != nil {
			return zero, refusedState(err.Error())
		}
		if s.Token != p.TokenID {
			return zero, refusedState("it was given to another token")
		}
		if s.Call != call {
			return zero, refusedState(fmt.Sprintf("it was given for %s", s.Call))
		}
		b.mu.Lock()
		bc := b.pending[s.ID]
		b.mu.Unlock()
		if bc == nil || bc.c != c {
			return zero, refusedState("its call is over (answered, cancelled, or not retried within " + bridgeRoundWait.String() + ")")
		}
		bc.answer(answers)
		return bridgeWait(a, ctx, bc, needInput)
	}
	b.mu.Lock()
	if len(b.pending) >= bridgeMaxPending || b.byToken[p.TokenID] >= bridgeMaxPerToken {
		b.mu.Unlock()
		return zero, &inputError{fmt.Errorf("too many calls wait for input (at most %d per token); answer or abandon one first", bridgeMaxPerToken)}
	}
	id := rand.Text()
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	bc := &bridgeCall{id: id, token: p.TokenID, call: call, c: c, cancel: cancel,
		done: make(chan bridgeOutcome, 1), ended: make(chan struct{}), asks: map[string]*bridgeAsk{}, asked: make(chan struct{}, 1)}
	b.pending[id] = bc
	b.byToken[p.TokenID]++
	b.mu.Unlock()
	c.setBridge(bc)
	go func() {
		res, err := run(callCtx)
		c.clearBridge(bc)
		bc.done <- bridgeOutcome{res, err}
	}()
	return bridgeWait(a, ctx, bc, needInput)
}

// bridgeCallTool is bridgeDo for tools/call.
func (a *Aggregate) bridgeCallTool(ctx context.Context, c *aggConn, tool string, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	return bridgeDo(a, ctx, c, "tools/call "+tool, params.RequestState, params.InputResponses,
		func(ctx context.Context) (*mcp.CallToolResult, error) { return c.cs.CallTool(ctx, params) },
		func(reqs mcp.InputRequestMap, state string) *mcp.CallToolResult {
			return &mcp.CallToolResult{InputRequests: reqs, RequestState: state}
		})
}

// bridgeWait waits, bounded by ctx, for bc's result or for the upstream's
// requests that are not yet with the client, which it returns as an
// input-required result.
func bridgeWait[R mcp.Result](a *Aggregate, ctx context.Context, bc *bridgeCall, needInput func(mcp.InputRequestMap, string) R) (R, error) {
	outcome := func(r bridgeOutcome) (R, error) {
		res, _ := r.res.(R)
		return res, r.err
	}
	bc.mu.Lock()
	if bc.timer != nil {
		bc.timer.Stop()
	}
	if r := bc.result; r != nil {
		bc.mu.Unlock()
		a.bridgeEnd(bc)
		return outcome(*r)
	}
	bc.mu.Unlock()
	for {
		if reqs := bc.unsent(); len(reqs) > 0 {
			bc.mu.Lock()
			bc.timer = time.AfterFunc(a.bridge.roundWait, func() { a.bridgeEnd(bc) })
			bc.mu.Unlock()
			return needInput(reqs, a.bridge.seal(sealed{Token: bc.token, Call: bc.call, ID: bc.id, Node: a.bridge.node})), nil
		}
		select {
		case r := <-bc.done:
			bc.mu.Lock()
			bc.result = &r
			bc.mu.Unlock()
			a.bridgeEnd(bc)
			return outcome(r)
		case <-bc.asked:
		case <-bc.ended:
			var zero R
			return zero, refusedState("its call is over (answered, cancelled, or not retried within " + bridgeRoundWait.String() + ")")
		case <-ctx.Done():
			// The client went away: the upstream call is abandoned.
			a.bridgeEnd(bc)
			var zero R
			return zero, ctx.Err()
		}
	}
}

// bridgeEnd forgets bc and cancels its upstream call if it still runs.
func (a *Aggregate) bridgeEnd(bc *bridgeCall) {
	b := a.bridge
	b.mu.Lock()
	if b.pending[bc.id] == bc {
		delete(b.pending, bc.id)
		if b.byToken[bc.token]--; b.byToken[bc.token] <= 0 {
			delete(b.byToken, bc.token)
		}
	}
	b.mu.Unlock()
	bc.mu.Lock()
	bc.over = true
	if bc.timer != nil {
		bc.timer.Stop()
	}
	bc.mu.Unlock()
	bc.endOnce.Do(func() { close(bc.ended) })
	bc.cancel()
}

// unsent returns the asks not yet given to the client, marking them
// given, and the given ones still unanswered (the client's retry left them
// out), which it asks again.
func (bc *bridgeCall) unsent() mcp.InputRequestMap {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	var out mcp.InputRequestMap
	fresh := false
	for _, ask := range bc.asks {
		if !ask.sent {
			fresh = true
		}
	}
	if !fresh {
		return nil
	}
	for key, ask := range bc.asks {
		if out == nil {
			out = mcp.InputRequestMap{}
		}
		out[key] = ask.params
		ask.sent = true
	}
	return out
}

// ask adds a request of the upstream and waits, bounded by ctx (the
// upstream's request), for the client's answer.
func (bc *bridgeCall) ask(ctx context.Context, params mcp.InputRequest) (mcp.InputResponse, error) {
	bc.mu.Lock()
	if bc.over {
		bc.mu.Unlock()
		return nil, errors.New("the call is over")
	}
	bc.seq++
	key := "upstream-" + strconv.Itoa(bc.seq)
	ask := &bridgeAsk{params: params, answer: make(chan mcp.InputResponse, 1)}
	bc.asks[key] = ask
	bc.mu.Unlock()
	select {
	case bc.asked <- struct{}{}:
	default:
	}
	defer func() {
		bc.mu.Lock()
		delete(bc.asks, key)
		bc.mu.Unlock()
	}()
	select {
	case r := <-ask.answer:
		return r, nil
	case <-bc.ended:
		return nil, errors.New("the call is over: the client did not answer")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// endBridges ends the pending calls on c, before its session closes (go-sdk
// waits for the upstream's requests in flight, which wait for the client).
func (a *Aggregate) endBridges(c *aggConn) {
	c.mu.Lock()
	pending := append([]*bridgeCall(nil), c.bridges...)
	c.mu.Unlock()
	for _, bc := range pending {
		a.bridgeEnd(bc)
	}
}

// answer hands the client's answers to the asks given to it.
func (bc *bridgeCall) answer(responses mcp.InputResponseMap) {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	for key, r := range responses {
		if ask, ok := bc.asks[key]; ok && ask.sent && r != nil {
			select {
			case ask.answer <- r:
			default:
			}
		}
	}
}

// setBridge makes bc the call that c's upstream requests go to.
func (c *aggConn) setBridge(bc *bridgeCall) {
	c.mu.Lock()
	c.bridges = append(c.bridges, bc)
	c.mu.Unlock()
}

func (c *aggConn) clearBridge(bc *bridgeCall) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.bridges {
		if x == bc {
			c.bridges = append(c.bridges[:i], c.bridges[i+1:]...)
			return
		}
	}
}

// enter and leave count a call of token in flight on c, a person
// session's upstream session (see soleCaller).
func (c *aggConn) enter(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.callers == nil {
		c.callers = map[string]int{}
	}
	c.callers[token]++
}

func (c *aggConn) leave(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.callers[token]--; c.callers[token] <= 0 {
		delete(c.callers, token)
	}
}

// soleCaller reports whether every call pending or in flight on c came
// with token. A person's upstream session serves all their tokens (their
// clients, their sessions' agents), and the upstream's request to the
// client names no call: with two tokens at work it could reach the wrong
// one (an agent answering the question a person's own client was meant to
// see), so it goes to none.
func (c *aggConn) soleCaller(token string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.bridges {
		if b.token != token {
			return false
		}
	}
	for t := range c.callers {
		if t != token {
			return false
		}
	}
	return true
}

func (c *aggConn) currentBridge() *bridgeCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bridges) == 0 {
		return nil
	}
	return c.bridges[len(c.bridges)-1]
}

// bridgeMiddleware answers a 2025-11-25 upstream's requests to a principal
// session's client through the pending call they belong to.
func bridgeMiddleware(c *aggConn) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			var params mcp.InputRequest
			switch method {
			case "elicitation/create", "sampling/createMessage", "roots/list":
				switch p := req.GetParams().(type) {
				case *mcp.ElicitParams:
					params = p
				//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
				case *mcp.CreateMessageParams:
					params = p
				//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
				case *mcp.CreateMessageWithToolsParams:
					params = p
				//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
				case *mcp.ListRootsParams:
					params = p
				}
			default:
				return next(ctx, method, req)
			}
			bc := c.currentBridge()
			if bc == nil || params == nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: method + ": no call of this client is waiting for it"}
			}
			if !c.soleCaller(bc.token) {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: method + ": calls of more than one client of this person are under way on this upstream, and the request does not say which it is for"}
			}
			resp, err := bc.ask(ctx, params)
			if err != nil {
				return nil, err
			}
			res, ok := resp.(mcp.Result)
			if !ok {
				return nil, fmt.Errorf("%s: the client's answer is of kind %T", method, resp)
			}
			return res, nil
		}
	}
}
