package broker

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// MCP 2026-07-28 clients on the aggregated route.
//
// The route serves both generations on one URL, chosen per request by the
// MCP-Protocol-Version header: 2026-07-28 requests go to a stateless go-sdk
// handler over the same server (one temporary session per POST, no
// Mcp-Session-Id, GET and DELETE answered 405), every other request to the
// stateful handler. The edge has already checked that header against the
// request's _meta, and go-sdk checks it again.
//
// A 2026-07-28 request has no session of its own, so its calls go through
// the gateway's own upstream sessions for its token: one per token and
// upstream (a "principal session"), opened on first use, shared by that
// token's requests only, and closed with its upstream sessions after
// [AggregateOptions.SessionTimeout] (10 minutes when unset) without a call
// in flight. Such an upstream session speaks 2026-07-28 to an upstream that
// does, and then the request's own client capabilities go with each call,
// so the upstream asks for input it can get (an input-required answer
// passes to the client unchanged, see aggregate_mrtr.go). To an upstream
// that speaks only 2025-11-25 it offers no sampling, elicitation or roots,
// since a stateless client cannot be sent requests.

// principalIdle is how long a principal session lasts without a call when
// [AggregateOptions.SessionTimeout] is unset.
const principalIdle = 10 * time.Minute

// modernRequest reports whether r is a 2026-07-28 request.
func modernRequest(r *http.Request) bool {
	return r.Header.Get(headerProtocolVersion) >= protocolModern
}

// downSessionKey holds, in a tracked request's context, the temporary
// session of the 2026-07-28 request it belongs to.
type downSessionKey struct{}

// downSession is the downstream session a message forwarded under ctx
// goes to: ss for a session's own upstream sessions, else the 2026-07-28
// request's (nil when none is in flight).
func downSession(ctx context.Context, ss *mcp.ServerSession) *mcp.ServerSession {
	if ss != nil {
		return ss
	}
	d, _ := ctx.Value(downSessionKey{}).(*mcp.ServerSession)
	return d
}

// principalSession returns the principal session of the token ctx acts
// for, creating it on first use, and marks a call in flight on it until
// done is called.
func (a *Aggregate) principalSession(ctx context.Context) (s *aggSession, done func(), err error) {
	p, ok := policy.PrincipalFrom(ctx)
	if !ok || p.TokenID == "" {
		return nil, nil, errors.New("the request carries no principal")
	}
	key := "principal:" + p.TokenID
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, nil, errors.New("the route is closed")
	}
	s = a.principals[p.TokenID]
	created := s == nil
	if created {
		s = &aggSession{a: a, conns: map[string]*aggConn{}}
		a.principals[p.TokenID] = s
	}
	a.mu.Unlock()
	if created {
		a.pidle.Opened(key, p.TokenID, func() { a.dropPrincipal(p.TokenID, s) })
	}
	return s, a.pidle.Use(key, p.TokenID), nil
}

// dropPrincipal closes a principal session, idle for its timeout.
func (a *Aggregate) dropPrincipal(tokenID string, s *aggSession) {
	a.mu.Lock()
	if a.principals[tokenID] == s {
		delete(a.principals, tokenID)
	}
	a.mu.Unlock()
	a.pidle.Closed("principal:" + tokenID)
	s.closeAll()
	a.logger.Debug("aggregate: a token's 2026-07-28 upstream sessions closed after being idle")
}

// trackCtx is the context a call of ss is tracked under on its upstream
// session: for a 2026-07-28 request, one that names its session, where the
// upstream's progress for it goes.
func trackCtx(ctx context.Context, ss *mcp.ServerSession) context.Context {
	if modernSession(ss) {
		return context.WithValue(ctx, downSessionKey{}, ss)
	}
	return ctx
}
