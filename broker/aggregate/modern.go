package aggregate

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

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
// [Options.SessionTimeout] (10 minutes when unset) without a call
// in flight. Such an upstream session speaks 2026-07-28 to an upstream that
// does, and then the request's own client capabilities go with each call,
// so the upstream asks for input it can get (an input-required answer
// passes to the client unchanged, see aggregate_mrtr.go). To an upstream
// that speaks only 2025-11-25 it offers no sampling, elicitation or roots,
// since a stateless client cannot be sent requests.

// principalIdle is how long a principal session lasts without a call when
// [Options.SessionTimeout] is unset.
const principalIdle = 10 * time.Minute

// modernRequest reports whether r is a 2026-07-28 request.
// ModernRequest says whether the aggregated route serves r at 2026-07-28,
// without a session, as it does every request whose MCP-Protocol-Version
// is that or later (whatever its Mcp-Session-Id).
func ModernRequest(r *http.Request) bool { return modernRequest(r) }

func modernRequest(r *http.Request) bool {
	return r.Header.Get(upstream.HeaderProtocolVersion) >= protocolModern
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
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, nil, errors.New("the route is closed")
	}
	s = a.principals[p.TokenID]
	created := s == nil
	if created {
		// Its idle key is its own: one that replaces a closing one is
		// tracked afresh.
		s = &aggSession{a: a, conns: map[string]*aggConn{}, idleKey: "principal:" + rand.Text()}
		a.principals[p.TokenID] = s
		// Opened under a.mu, so that dropPrincipal's Closed, which runs
		// after the map lets go of s, never precedes it.
		a.pidle.Opened(s.idleKey, p.TokenID, func() { a.dropPrincipal(p.TokenID, s) })
	}
	a.mu.Unlock()
	return s, a.pidle.Use(s.idleKey, p.TokenID), nil
}

// dropPrincipal closes a principal session, idle for its timeout.
func (a *Aggregate) dropPrincipal(tokenID string, s *aggSession) {
	a.mu.Lock()
	if a.principals[tokenID] == s {
		delete(a.principals, tokenID)
	}
	a.mu.Unlock()
	a.pidle.Closed(s.idleKey)
	s.closeAll()
	a.logger.Debug("aggregate: a token's 2026-07-28 upstream sessions closed after being idle")
}

// trackCtx is the context a call of ss is tracked under on its upstream
// session: one that names ss, where the upstream's progress for it goes
// when that upstream session serves more than ss (a principal's session
// for 2026-07-28 requests, a person's for every request of theirs; a
// session's own upstream sessions send to their own ss).
func trackCtx(ctx context.Context, ss *mcp.ServerSession) context.Context {
	if ss != nil {
		return context.WithValue(ctx, downSessionKey{}, ss)
	}
	return ctx
}

// The catalog of a 2026-07-28 upstream learns of list changes through the
// subscriptions/listen stream that go-sdk's client opens when it connects.
// A stateless upstream has no session whose end the client would see: when
// that stream ends (the upstream restarted, the connection broke), go-sdk
// says nothing and the catalog would stay deaf. listenWatch ends the
// catalog session when it does, so that the catalog reconnects, lists again
// and listens again (with the backoff of any reconnection).

// listenWatch is an HTTP transport that calls onEnd when the body of the
// first subscriptions/listen POST it carries ends.
type listenWatch struct {
	next  http.RoundTripper
	armed atomic.Bool
	onEnd func()
}

func (l *listenWatch) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || r.Header.Get("Mcp-Method") != "subscriptions/listen" || !l.armed.CompareAndSwap(true, false) {
		return l.next.RoundTrip(r)
	}
	resp, err := l.next.RoundTrip(r)
	if err != nil {
		l.onEnd()
		return resp, err
	}
	resp.Body = &endBody{ReadCloser: resp.Body, onEnd: l.onEnd}
	return resp, nil
}

func (l *listenWatch) CloseIdleConnections() {
	if ci, ok := l.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

type endBody struct {
	io.ReadCloser
	once  sync.Once
	onEnd func()
}

func (b *endBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(b.onEnd)
	}
	return n, err
}

func (b *endBody) Close() error {
	b.once.Do(b.onEnd)
	return b.ReadCloser.Close()
}

// catalogTransport is the transport of up's catalog session: for a
// streamable-HTTP upstream, one whose list-changed stream is watched
// (onEnd runs when it ends).
func (up *aggUpstream) catalogTransport(onEnd func()) mcp.Transport {
	t := up.tr.NewTransport()
	st, ok := t.(*mcp.StreamableClientTransport)
	if !ok || st.HTTPClient == nil {
		return t
	}
	hc := *st.HTTPClient
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	w := &listenWatch{next: next, onEnd: onEnd}
	w.armed.Store(true)
	hc.Transport = w
	st.HTTPClient = &hc
	return st
}
