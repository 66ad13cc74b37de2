package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Multi-round-trip requests (MCP 2026-07-28, SEP-2322) through the
// aggregated route.
//
// The broker's upstream clients run with go-sdk's multi-round-trip
// middleware disabled, so an upstream's input-required answer (inputRequests
// and an opaque requestState) comes back to the route as it is, and the
// route decides what to do with it by the downstream client's version:
//
//   - A 2026-07-28 client gets the answer unchanged. Its retry is a new
//     tools/call of the same namespaced tool, so it reaches the same
//     upstream, is authorized by the edge as any call is, and carries
//     inputResponses and requestState to the upstream untouched.
//   - An older client cannot read an input-required answer. The route
//     fulfils the input requests itself by asking that client over its
//     session (elicitation/create, sampling/createMessage, roots/list, on
//     the stream of the call), and retries the call on the same upstream
//     session with the answers and the requestState, until the upstream
//     answers without input requests, at most aggMaxRounds times. A client
//     that did not declare the capability a request needs gets go-sdk's
//     refusal for it, which fails the call with a tool error naming the
//     upstream.

// aggMaxRounds bounds the rounds of one multi-round-trip call that the
// route fulfils for an older client (go-sdk's own client stops at 10).
const aggMaxRounds = 10

// modernSession reports whether ss is a 2026-07-28 client's request
// session (the stateless handler's, one per request).
func modernSession(ss *mcp.ServerSession) bool {
	if ss == nil {
		return false
	}
	ip := ss.InitializeParams()
	return ip != nil && ip.ProtocolVersion >= protocolModern
}

// knowTools makes sure cs has listed its upstream's tools when it speaks
// 2026-07-28: go-sdk's client sends a tool's Mcp-Param-* headers (SEP-2243),
// which such an upstream requires for the arguments it binds, only for a
// tool it has listed in that session. A listing still fresh is answered
// from go-sdk's cache; a failed one leaves the call to fail as it would.
func knowTools(ctx context.Context, cs *mcp.ClientSession) {
	if ir := cs.InitializeResult(); ir == nil || ir.ProtocolVersion < protocolModern {
		return
	}
	_, _ = cs.ListTools(ctx, nil)
}

// protocolModern is MCP 2026-07-28, the stateless protocol.
const protocolModern = "2026-07-28"

// callRounds calls the tool on cs and, for an older downstream client,
// fulfils the upstream's input requests through ss and retries, at most
// aggMaxRounds times. For a 2026-07-28 client it returns the first answer,
// input-required or not.
func callRounds(ctx context.Context, cs *mcp.ClientSession, ss *mcp.ServerSession, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	knowTools(ctx, cs)
	res, err := cs.CallTool(ctx, params)
	if err != nil || res == nil || !res.NeedsInput() || modernSession(ss) {
		return res, err
	}
	for round := 1; ; round++ {
		if len(res.InputRequests) == 0 {
			return nil, &inputError{errors.New("it is busy (it asked for no input, and to retry); try again later")}
		}
		if round >= aggMaxRounds {
			return nil, &inputError{fmt.Errorf("it asked for input more than %d times in one call", aggMaxRounds)}
		}
		responses, err := fulfilInputRequests(ctx, ss, res.InputRequests)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &inputError{err}
		}
		next := *params
		next.InputResponses = responses
		next.RequestState = res.RequestState
		res, err = cs.CallTool(ctx, &next)
		if err != nil || res == nil || !res.NeedsInput() {
			return res, err
		}
	}
}

// inputError is a multi-round-trip call the route could not complete for
// an older client: the client could not answer (it lacks the capability,
// or failed), or the upstream asked too often.
type inputError struct{ err error }

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

// inputFailed is the tool result of a call that failed with an inputError.
func inputFailed(up *aggUpstream, err *inputError) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("the upstream MCP server %q asked for input the gateway could not get from this client: %s", up.cfg.Name, safeError(err.err))}},
	}
}

// fulfilInputRequests asks the downstream client of ss each of requests,
// concurrently, on the stream of the request ctx belongs to.
func fulfilInputRequests(ctx context.Context, ss *mcp.ServerSession, requests mcp.InputRequestMap) (mcp.InputResponseMap, error) {
	if ss == nil {
		return nil, errors.New("no downstream session to ask")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu        sync.Mutex
		wg        sync.WaitGroup
		firstErr  error
		responses = make(mcp.InputResponseMap, len(requests))
	)
	for id, ir := range requests {
		wg.Go(func() {
			resp, err := fulfilInputRequest(ctx, ss, ir)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("asking the client for input %q: %w", id, err)
					cancel()
				}
				return
			}
			responses[id] = resp
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return responses, nil
}

func fulfilInputRequest(ctx context.Context, ss *mcp.ServerSession, ir mcp.InputRequest) (mcp.InputResponse, error) {
	switch p := ir.(type) {
	case *mcp.ElicitParams:
		// As the session relay does: the client checks what it is shown,
		// the upstream what comes back.
		return elicitAsIs(ctx, ss, p)
	//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	case *mcp.CreateMessageParams:
		//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		return ss.CreateMessageWithTools(ctx, samplingWithTools(p))
	//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	case *mcp.CreateMessageWithToolsParams:
		//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		return ss.CreateMessageWithTools(ctx, p)
	//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	case *mcp.ListRootsParams:
		//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		return ss.ListRoots(ctx, p)
	default:
		return nil, fmt.Errorf("input request of unknown kind %T", ir)
	}
}

// samplingWithTools is p as the sampling request that carries a list of
// content blocks per message (go-sdk's own server-side fulfilment does the
// same).
//
//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
func samplingWithTools(p *mcp.CreateMessageParams) *mcp.CreateMessageWithToolsParams {
	//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	msgs := make([]*mcp.SamplingMessageV2, 0, len(p.Messages))
	for _, m := range p.Messages {
		//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		msgs = append(msgs, &mcp.SamplingMessageV2{Content: []mcp.Content{m.Content}, Role: m.Role})
	}
	//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
	return &mcp.CreateMessageWithToolsParams{
		Meta:             p.Meta,
		IncludeContext:   p.IncludeContext,
		MaxTokens:        p.MaxTokens,
		Messages:         msgs,
		Metadata:         p.Metadata,
		ModelPreferences: p.ModelPreferences,
		StopSequences:    p.StopSequences,
		SystemPrompt:     p.SystemPrompt,
		Temperature:      p.Temperature,
	}
}

// upstreamMeta is the _meta a downstream request's params carry upstream.
// The 2026-07-28 per-request keys describe the downstream client's own
// exchange (its version and identity), so they are dropped and the
// broker's client sets its own; the client capabilities stay when the
// upstream speaks 2026-07-28 too, since they tell it which input requests
// the client can answer (go-sdk's client keeps a key the params hold), but
// for the Tasks extension: go-sdk's client reads no CreateTaskResult (see
// aggregate_tasks.go). A 2026-07-28 request that declares none declares
// none upstream either, rather than the broker client's. Nothing else of
// meta is changed; meta itself is not modified.
func upstreamMeta(meta mcp.Meta, cs *mcp.ClientSession, ss *mcp.ServerSession) mcp.Meta {
	upModern := false
	if ir := cs.InitializeResult(); ir != nil && ir.ProtocolVersion >= protocolModern {
		upModern = true
	}
	_, v := meta[mcp.MetaKeyProtocolVersion]
	_, i := meta[mcp.MetaKeyClientInfo]
	caps, c := meta[mcp.MetaKeyClientCapabilities]
	none := upModern && !c && modernSession(ss)
	tasks := c && declaresTasks(caps)
	if !v && !i && !(c && !upModern) && !none && !tasks {
		return meta
	}
	out := make(mcp.Meta, len(meta)+1)
	for k, x := range meta {
		out[k] = x
	}
	delete(out, mcp.MetaKeyProtocolVersion)
	delete(out, mcp.MetaKeyClientInfo)
	if !upModern {
		delete(out, mcp.MetaKeyClientCapabilities)
	} else if tasks {
		out[mcp.MetaKeyClientCapabilities] = withoutTasks(caps)
	}
	if none {
		out[mcp.MetaKeyClientCapabilities] = map[string]any{}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
