package caddymodule

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/aggregate"
	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Forwarding the aggregated route's 2025-11-25 sessions between replicas.
//
// The aggregated route holds a 2025-11-25 session (its go-sdk server
// session, its upstream client sessions, stdio processes of its own) in
// the memory of the replica that opened it. In cluster mode that replica's
// node id is sealed in the session id it gives out (with a key derived from
// the cluster key, bound to the route), so any replica reads, and none can
// be made to believe, which node holds a session. A replica that gets a
// request for another node's session runs the whole edge on it as usual
// (authentication, authorization, rate limit, the listing filter on the
// answer), then sends it to that node's advertised address, found in the
// node registry (never in the request's Host or X-Forwarded-* headers),
// over a hop signed with a key derived from the cluster key, and streams
// the answer back. A node that is not alive in the registry, or that
// cannot be reached, has its sessions answered 404, the spec's answer for
// an unknown session, so clients initialize again.
//
// The hop carries the request's method, path, forwarded headers and body,
// who the edge authenticated (a token id, or a JWT subject with its access
// token; never an opaque token) and the scopes it found, under an
// HMAC-SHA256 with the sending and the receiving node, the route, the
// session id, a time and a random nonce. The owner takes a hop only if the
// MAC holds, it names this node and this route, its time is within
// edge.HopFreshness of the owner's clock, its nonce is new, and the sender
// is alive in the registry; anything else is refused (401, 403 for a
// sender it does not know) with an audit line. A client cannot send a hop:
// the headers are refused from anyone without the cluster key. Whoever
// has the key can, so the owner takes only an identity from a hop: the
// token from its own store, the JWT verified itself, the scopes found
// there narrowed to the hop's (edge.HopClaims.Principal).

// Bounds of the forwarding.
const (
	// No bound on the answer's headers: go-sdk writes a POST's SSE
	// headers with its first message, which a long tool call sends last.
	// The client's request (and its token's revocation) bounds the hop.
	hopDialTimeout = 5 * time.Second
)

// hopAnswerHeaders are the only answer headers passed back to the client.
var hopAnswerHeaders = []string{"Content-Type", "Mcp-Session-Id", "Cache-Control", "Retry-After", "Allow", "WWW-Authenticate"}

// hopURL is r's URL as the client sent it, before Caddy's rewrites.
func hopURL(r *http.Request) *url.URL {
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		return orig.URL
	}
	return r.URL
}

// hopURI is the request URI a hop is signed over.
func hopURI(r *http.Request) string { return hopURL(r).RequestURI() }

// hopKeys holds one HopKey per hop key for the life of the process, so
// that a config reload keeps the nonces seen: a hop taken before a reload
// is a replay after it. (A process that restarts forgets them, and with
// them every session a replayed hop could name.) One entry per cluster
// key the process has run with.
var hopKeys sync.Map // string(key) -> *edge.HopKey

func sharedHopKey(key []byte) *edge.HopKey {
	v, _ := hopKeys.LoadOrStore(string(key), edge.NewHopKey(key))
	return v.(*edge.HopKey)
}

// aggForward is an aggregated route's cluster side: the node ids sealed in
// its session ids, the registry, and the hop.
type aggForward struct {
	ids    *sessionid.Sealer
	route  string // the route's identity, the same on every replica
	nodes  *cluster.Nodes
	hop    *edge.HopKey
	client *http.Client
	audit  *zap.Logger
}

func newAggForward(ids *sessionid.Sealer, route string, nodes *cluster.Nodes, hop *edge.HopKey, audit *zap.Logger) *aggForward {
	tr := &http.Transport{
		Proxy:               nil, // a hop goes to the registry's address, never through a proxy from the environment
		DialContext:         (&net.Dialer{Timeout: hopDialTimeout}).DialContext,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: hopDialTimeout,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
		DisableCompression:  true,
	}
	if audit == nil {
		audit = zap.NewNop()
	}
	return &aggForward{ids: ids, route: route, nodes: nodes, hop: hop, audit: audit, client: &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// bridgeKey is the key of the route's sealed requestStates, the same on
// every replica of the route and another for another route.
func (f *aggForward) bridgeKey(cs *cluster.Storage) ([]byte, error) {
	return cs.DeriveKey("aggregate bridge v1|" + f.route)
}

// mint is the route's next session id: this node's id and 128 random
// bits, sealed.
func (f *aggForward) mint() string {
	return f.ids.Seal(f.nodes.Self()+"/"+rand.Text(), "", f.route)
}

// owner is the node that holds session sid, if sid is one this cluster's
// aggregated route gave out.
func (f *aggForward) owner(sid string) (string, bool) {
	plain, err := f.ids.Open(sid, "", f.route)
	if err != nil {
		return "", false
	}
	node, _, ok := strings.Cut(plain, "/")
	return node, ok && cluster.CheckNodeID(node) == nil
}

func unknownSession(reason, msg string) *edge.RefusalError {
	v := edge.Refuse(http.StatusNotFound, reason, msg)
	v.Code = message.CodeUnknownSession
	return &edge.RefusalError{Verdict: v}
}

// clusterAggregate is the aggregated route in cluster mode: a request for
// another node's 2025-11-25 session goes there.
type clusterAggregate struct {
	*edge.Aggregate
	agg *aggregate.Aggregate
	fwd *aggForward
}

// Serve serves r here, or forwards it to the node that holds its session,
// or the pending call its requestState names.
func (c *clusterAggregate) Serve(w http.ResponseWriter, r *http.Request, next edge.Next) error {
	if aggregate.ModernRequest(r) {
		// A 2026-07-28 retry of a call bridged to a 2025-11-25 upstream:
		// the node that sealed its requestState holds the pending call.
		if node := c.bridgeNode(r); node != "" && node != c.fwd.nodes.Self() {
			if addr, alive := c.fwd.nodes.Lookup(node); alive {
				return c.fwd.forward(w, r, "", node, addr)
			}
			// Its node is gone, and the call with it: served here, the
			// state is refused with "call the tool again".
		}
		return c.Aggregate.Serve(w, r, next)
	}
	return c.fwd.serveLegacy(w, r, next, c.Aggregate)
}

// serveLegacy serves a 2025-11-25 request on route here when its session
// is this node's (or it has none: an initialize), or forwards it to the
// node that holds it.
func (f *aggForward) serveLegacy(w http.ResponseWriter, r *http.Request, next edge.Next, route edge.Route) error {
	sid := r.Header.Get(mcpSessionHeader)
	if sid == "" {
		return route.Serve(w, r, next)
	}
	node, ok := f.owner(sid)
	if !ok {
		return unknownSession("session_unknown", "unknown session: start a new session by initializing again without Mcp-Session-Id")
	}
	if node == f.nodes.Self() {
		return route.Serve(w, r, next)
	}
	addr, alive := f.nodes.Lookup(node)
	if !alive {
		return unknownSession("session_node_gone", fmt.Sprintf("unknown session: the replica that held it (node %q) is gone; start a new session by initializing again without Mcp-Session-Id", node))
	}
	return f.forward(w, r, sid, node, addr)
}

// holds says whether this node serves the forwarded request r (its
// message decided, in its context): a 2026-07-28 retry of a call it holds,
// or a request of a 2025-11-25 session it holds.
func (c *clusterAggregate) holds(r *http.Request) bool {
	if aggregate.ModernRequest(r) {
		return c.bridgeNode(r) == c.fwd.nodes.Self()
	}
	return c.fwd.holdsSession(r)
}

func (c *clusterAggregate) forwarder() *aggForward { return c.fwd }

func (c *clusterAggregate) serveForwarded(w http.ResponseWriter, r *http.Request) error {
	return c.Aggregate.Serve(w, r, nil)
}

// holdsSession says whether r's 2025-11-25 session is this node's.
func (f *aggForward) holdsSession(r *http.Request) bool {
	node, ok := f.owner(r.Header.Get(mcpSessionHeader))
	return ok && node == f.nodes.Self()
}

// clusterSessions is the sessions endpoint in cluster mode: its 2025-11-25
// MCP sessions live in the memory of the replica that opened them (their
// pushed events, their streams), so a request for another node's goes
// there, as the aggregated route's do. Its 2026-07-28 requests are served
// here: the sessions they act on are reached wherever they run (package
// clustersessions).
type clusterSessions struct {
	*edge.Sessions
	fwd *aggForward
}

func (c *clusterSessions) Serve(w http.ResponseWriter, r *http.Request, next edge.Next) error {
	if aggregate.ModernRequest(r) {
		return c.Sessions.Serve(w, r, next)
	}
	return c.fwd.serveLegacy(w, r, next, c.Sessions)
}

func (c *clusterSessions) holds(r *http.Request) bool {
	return !aggregate.ModernRequest(r) && c.fwd.holdsSession(r)
}

func (c *clusterSessions) forwarder() *aggForward { return c.fwd }

func (c *clusterSessions) serveForwarded(w http.ResponseWriter, r *http.Request) error {
	return c.Sessions.Serve(w, r, nil)
}

// forwardedRoute is a route that takes requests other replicas forward.
type forwardedRoute interface {
	edge.Route
	forwarder() *aggForward
	holds(r *http.Request) bool
	serveForwarded(w http.ResponseWriter, r *http.Request) error
}

// bridgeNode is the node that holds the pending call r's requestState
// names, as the one reader read it from the message the edge decided on;
// "" when it names none. A misreading here could only send the retry to a
// node that does not hold the call, which refuses the state: the node
// decides the request again on the same body.
func (c *clusterAggregate) bridgeNode(r *http.Request) string {
	b, ok := message.FromContext(r.Context())
	if !ok || b.Batch || len(b.Calls) != 1 || b.Calls[0].RequestState == "" {
		return ""
	}
	return c.agg.BridgeNode(b.Calls[0].RequestState)
}

// forward sends r to node at addr and streams its answer to w.
func (f *aggForward) forward(w http.ResponseWriter, r *http.Request, sid, node, addr string) error {
	return f.forwardTo(w, r, sid, f.nodes.Self(), node, addr)
}

// forwardTo sends r from node self to node at addr.
func (f *aggForward) forwardTo(w http.ResponseWriter, r *http.Request, sid, self, node, addr string) error {
	p, _ := policy.PrincipalFrom(r.Context())
	var body []byte
	if r.Body != nil {
		// The edge read the body already (bounded): this is its copy.
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return &edge.RefusalError{Verdict: edge.Refuse(http.StatusBadRequest, edge.ReasonMalformed, "the request body could not be read; send it again")}
		}
	}
	target, err := url.Parse(addr)
	if err != nil {
		return unknownSession("session_node_gone", "unknown session: its replica's address does not parse; start a new session")
	}
	// The path the client asked for, before any rewrite here: the owner's
	// Caddy routes it as this one did.
	orig := hopURL(r)
	target.Path, target.RawPath, target.RawQuery = orig.Path, orig.RawPath, orig.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target.String(), bytes.NewReader(body))
	if err != nil {
		return unknownSession("session_node_gone", "unknown session: its replica's address is not usable; start a new session")
	}
	// The owner's site is the one the client reached here: the same Host,
	// so that Caddy routes the hop to the same site block there. The
	// target address is the registry's, whatever the Host.
	out.Host = r.Host
	out.ContentLength = int64(len(body))
	for _, name := range edge.HopForwardedHeaders {
		for _, v := range r.Header.Values(name) {
			out.Header.Add(name, v)
		}
	}
	for _, name := range edge.HopParamHeaders(r.Header) {
		out.Header[name] = append([]string(nil), r.Header[name]...)
	}
	nonce, err := f.hop.Sign(out, f.route, self, node, p, policy.JWTFrom(r.Context()), clientIP(r), body, time.Now())
	if err != nil {
		return &edge.RefusalError{Verdict: edge.Refuse(http.StatusBadGateway, "hop_failed", "this request cannot be forwarded to the replica that holds its session: "+err.Error())}
	}
	resp, err := f.client.Do(out)
	if err != nil {
		if r.Context().Err() != nil {
			return nil // the client went away
		}
		f.audit.Warn("session forward failed", zap.String("event", "session_forward_failed"), zap.String("node", node), zap.String("token_id", p.TokenID), zap.String("error", err.Error()))
		if aggregate.ModernRequest(r) {
			// A bridged call's retry: there is no session to initialize.
			return &edge.RefusalError{Verdict: edge.Refuse(http.StatusBadGateway, "call_node_unreachable",
				fmt.Sprintf("the replica that holds this call (node %q) does not answer; call the tool again without requestState and inputResponses", node))}
		}
		return unknownSession("session_node_unreachable", fmt.Sprintf("unknown session: the replica that held it (node %q) does not answer; start a new session by initializing again without Mcp-Session-Id", node))
	}
	defer resp.Body.Close()
	if resp.Header.Get(edge.HopRefusedHeader) != "" {
		reason := resp.Header.Get(edge.HopRefusedHeader)
		f.audit.Error("a replica refused a forwarded request", zap.String("event", "session_forward_refused"), zap.String("node", node), zap.String("reason", reason), zap.Int("status", resp.StatusCode))
		if reason == "hop_busy" {
			// The owner's replay check is at its memory bound: the
			// client may retry once it has room, as the owner says.
			v := edge.Refuse(http.StatusServiceUnavailable, "hop_busy", fmt.Sprintf("the replica that holds this session (node %q) takes no more forwarded requests for now; retry after the Retry-After delay", node))
			v.RetryAfter = time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 && s <= 60 {
				v.RetryAfter = time.Duration(s) * time.Second
			}
			return &edge.RefusalError{Verdict: v}
		}
		v := edge.Refuse(http.StatusBadGateway, "hop_refused", fmt.Sprintf("the replica that holds this session (node %q) refused the forwarded request (%s); the operator should check that every replica has the same cluster key and configuration, and synchronized clocks", node, reason))
		return &edge.RefusalError{Verdict: v}
	}
	if !f.hop.CheckAnswer(resp.Header.Get(edge.HopAnswerHeader), self, node, nonce) {
		// Something answered at the advertised address, but not the route
		// the hop was for: relay none of it.
		f.audit.Error("a replica's advertised address answered without the route's tag", zap.String("event", "session_forward_untagged"), zap.String("node", node), zap.Int("status", resp.StatusCode))
		v := edge.Refuse(http.StatusBadGateway, "hop_untagged", fmt.Sprintf("the replica that holds this session (node %q) did not answer through its aggregated route; the operator should check that its advertise address reaches this same site", node))
		return &edge.RefusalError{Verdict: v}
	}
	for _, name := range hopAnswerHeaders {
		for _, v := range resp.Header.Values(name) {
			w.Header().Add(name, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil // the client went away
			}
			if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return nil
			}
		}
		if rerr != nil {
			return nil // the owner ended the answer, or went away: the client sees the stream end
		}
	}
}

// checkAdvertise checks the address replicas forward to: an http(s) URL
// with a host, nothing else; http only to loopback, since a hop carries
// the session's messages.
func checkAdvertise(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("advertise %q: give the URL other replicas reach this one at, such as https://gw-1.internal:8443", raw)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("advertise %q: give a scheme, host and port only, such as https://gw-1.internal:8443 (no user, path or query)", raw)
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("advertise %q: %s is no address another replica can reach; give this replica's own address or name", raw, u.Hostname())
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !pinnedfetch.IsLoopbackHost(u.Hostname()) {
			return fmt.Errorf("advertise %q: plain http to a host that is not loopback would carry sessions' messages in the clear; use https://", raw)
		}
	default:
		return fmt.Errorf("advertise %q: the scheme must be https:// (or http:// to loopback)", raw)
	}
	return nil
}

// serveHop serves a request another replica forwarded: an aggregated
// route's 2025-11-25 session that this node holds. The sender ran the edge
// on it; this node checks the hop (see verify), that the sender is alive
// in the registry and that the session is this node's, establishes whom
// it acts for from the identity the hop names (its own token store, its
// own check of a JWT; the hop's scopes only narrow what it finds), decides
// the request again as the sender did, and serves it with that principal
// in its context. A refused hop is answered 401 (403 for a sender the
// registry does not know) and audited, and its address charged like a
// failed credential; a principal refused here is answered as the route's
// own refusal (401 hop_principal, 403 hop_scopes), audited.
func (h *Handler) serveHop(w http.ResponseWriter, r *http.Request, rf refusal) error {
	now := time.Now()
	auth := edge.Authentication{Authn: h.authn, Failures: h.ipLimit, IPv6Prefix: h.ipv6Prefix}
	refuse := func(v edge.Verdict) error {
		v = auth.ChargeRefusedHop(rf.clientIP, now, v)
		w.Header().Set(edge.HopRefusedHeader, v.Reason)
		return h.refuse(w, r, rf, v)
	}
	ca, ok := h.route.route.(forwardedRoute)
	if !ok {
		return refuse(edge.Refuse(http.StatusForbidden, "hop_refused",
			"Zidane-Hop headers are the replicas' own, and this site takes no forwarded requests; send the request without them"))
	}
	var body []byte
	var v edge.Verdict
	if r.Method == http.MethodPost {
		if body, v = edge.ReadBody(r, h.MaxBodyBytes); !v.Allowed() {
			return h.refuse(w, r, rf, v)
		}
	} else if v := edge.NoBody(r); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	f := ca.forwarder()
	claims, v := f.hop.Verify(r, hopURI(r), body, f.nodes.Self(), f.route, now)
	if !v.Allowed() {
		return refuse(v)
	}
	// Until it is established here, the audit lines name the identity the
	// hop claims; they name the client the sender's edge saw, and the
	// replica it came through.
	rf.p = policy.Principal{TokenID: claims.TokenID}
	rf.via, rf.clientIP = rf.clientIP, claims.Client
	if _, alive := f.nodes.Lookup(claims.From); !alive {
		return refuse(edge.Refuse(http.StatusForbidden, "hop_unknown_node",
			fmt.Sprintf("the forwarded request comes from node %q, which is not alive in the node registry", claims.From)))
	}
	// From here on this node answers for the route, refusals included
	// (an unknown session's 404, a revoked token's 401 reach the client
	// as such).
	w.Header().Set(edge.HopAnswerHeader, f.hop.AnswerTag(claims))
	p, v := claims.Principal(r.Context(), h.authn, now)
	if !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	rf.p = p
	modern := aggregate.ModernRequest(r)
	if !modern && !f.holdsSession(r) {
		return h.refuse(w, r, rf, unknownSession("session_unknown", "unknown session: start a new session by initializing again without Mcp-Session-Id").Verdict)
	}
	if v := edge.CheckRequest(r); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	d := edge.Decide(h.route.route, p, r.Method, r.Header, body)
	if !d.Allowed() {
		rf.call = d.Call
		return h.refuse(w, r, rf, d.Verdict)
	}
	ctx, cancel := context.WithCancel(policy.WithPrincipal(r.Context(), p))
	defer cancel()
	if d.Body != nil {
		ctx = message.NewContext(ctx, d.Body)
	}
	if claims.JWT != "" {
		// The JWT this node verified goes on with the request, as the
		// edge's would: an agent session it acts on may run on a third
		// replica, which verifies it itself (clustersessions).
		ctx = policy.WithJWT(ctx, claims.JWT)
	}
	if modern && !ca.holds(r.WithContext(ctx)) {
		// A 2026-07-28 request is forwarded only as the retry of a call
		// this node holds (Serve): anything else is no hop's to make.
		return h.refuse(w, r, rf, edge.Refuse(http.StatusBadRequest, "hop_misdirected",
			"this replica holds no pending call that the forwarded request's requestState names; call the tool again without requestState and inputResponses"))
	}
	defer h.tokens.Hold(p.TokenID, cancel).Release()
	select {
	case <-processExit().Done():
		cancel()
	default:
	}
	r = r.WithContext(ctx)
	r.Header.Del(edge.HopHeader)
	r.Header.Del(edge.HopPrincipalHeader)
	r.Header.Del(edge.HopCredentialHeader)
	r.Header.Del("Authorization")
	// The address the sender's edge saw, which its signature covers.
	r.Header[upstream.ClientIPHeader] = []string{claims.Client}
	h.audit.Debug("forwarded request", zap.String("event", "session_forwarded_in"), zap.String("from", claims.From),
		zap.String("token_id", p.TokenID), zap.String("http_method", r.Method), zap.String("client_ip", claims.Client), zap.String("via", rf.via))
	// The sender's edge filters the answer (its listing filter): served
	// here as the route serves its own requests.
	return ca.serveForwarded(w, r)
}
