package edge

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
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Forwarding a route's 2025-11-25 sessions between replicas.
//
// The aggregated route and the sessions endpoint hold a 2025-11-25 session
// (its go-sdk server session, its upstream client sessions, stdio
// processes of its own, its pushed events) in the memory of the replica
// that opened it. In cluster mode that replica's node id is sealed in the
// session id it gives out (with a key derived from the cluster key, bound
// to the route), so any replica reads, and none can be made to believe,
// which node holds a session. A replica that gets a request for another
// node's session runs the whole edge on it as usual (authentication,
// authorization, rate limit, the listing filter on the answer), then sends
// it to that node's advertised address, found in the node registry (never
// in the request's Host or X-Forwarded-* headers), over a hop signed with
// a key derived from the cluster key (see hop.go), and streams the answer
// back. A node that is not alive in the registry, or that cannot be
// reached, has its sessions answered 404, the spec's answer for an unknown
// session, so clients initialize again.
//
// The hop carries the request's method, path, forwarded headers and body,
// who the edge authenticated (a token id, or a JWT subject with its access
// token; never an opaque token) and the scopes it found, under an
// HMAC-SHA256 with the sending and the receiving node, the route, the
// session id, a time and a random nonce. The owner takes a hop only if the
// MAC holds, it names this node and this route, its time is within
// HopFreshness of the owner's clock, its nonce is new, and the sender is
// alive in the registry; anything else is refused (401, 403 for a sender
// it does not know) with an audit line. A client cannot send a hop: the
// headers are refused from anyone without the cluster key. Whoever has the
// key can, so the owner takes only an identity from a hop: the token from
// its own store, the JWT verified itself, the scopes found there narrowed
// to the hop's ([HopClaims.Principal]).

// hopDialTimeout bounds a hop's dial and TLS handshake. There is no bound
// on the answer's headers: go-sdk writes a POST's SSE headers with its
// first message, which a long tool call sends last. The client's request
// (and its token's revocation) bounds the hop.
const hopDialTimeout = 5 * time.Second

// hopAnswerHeaders are the only answer headers passed back to the client.
var hopAnswerHeaders = []string{"Content-Type", "Mcp-Session-Id", "Cache-Control", "Retry-After", "Allow", "WWW-Authenticate"}

// HopNodes is the node registry as forwarding reads it (a cluster's
// registry of nodes is one).
type HopNodes interface {
	// Self is this node's id.
	Self() string
	// Lookup is a node's advertised address, and whether it is alive.
	Lookup(node string) (addr string, alive bool)
}

// ForwardEvent is what forwarding tells the audit: a hop that failed
// (session_forward_failed), that the owner refused
// (session_forward_refused), or whose answer did not carry its tag
// (session_forward_untagged).
type ForwardEvent struct {
	Event   string
	Node    string
	TokenID string // on a failed hop
	Reason  string // the owner's, on a refused hop
	Status  int    // the answer's, on a refused or untagged hop
	Err     string // on a failed hop
}

// ForwardOptions configure a [Forward].
type ForwardOptions struct {
	// IDs seal the node ids in the route's session ids.
	IDs *sessionid.Sealer
	// Route is the route's identity, the same on every replica.
	Route string
	Nodes HopNodes
	Hop   *HopKey
	// CheckNode checks a node id read from a session id.
	CheckNode func(string) error
	// URL is a request's URL as the client sent it, before any rewrite
	// by the server in front; nil takes the request's own.
	URL func(*http.Request) *url.URL
	// ClientIP is the client's address as the edge saw it; nil takes the
	// request's remote address.
	ClientIP func(*http.Request) string
	// OnEvent, when set, audits what went wrong with a hop.
	OnEvent func(ForwardEvent)
}

// Forward is a route's cluster side: the node ids sealed in its session
// ids, the registry, and the hop.
type Forward struct {
	o      ForwardOptions
	client *http.Client
}

// NewForward returns the forwarding of a route.
func NewForward(o ForwardOptions) *Forward {
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
	if o.OnEvent == nil {
		o.OnEvent = func(ForwardEvent) {}
	}
	if o.URL == nil {
		o.URL = func(r *http.Request) *url.URL { return r.URL }
	}
	if o.ClientIP == nil {
		o.ClientIP = remoteIP
	}
	return &Forward{o: o, client: &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Self is this node's id.
func (f *Forward) Self() string { return f.o.Nodes.Self() }

// Route is the route's identity.
func (f *Forward) Route() string { return f.o.Route }

// Mint is the route's next session id: this node's id and 128 random
// bits, sealed.
func (f *Forward) Mint() string {
	return f.o.IDs.Seal(f.o.Nodes.Self()+"/"+rand.Text(), "", f.o.Route)
}

// Owner is the node that holds session sid, if sid is one this cluster's
// route gave out.
func (f *Forward) Owner(sid string) (string, bool) {
	plain, err := f.o.IDs.Open(sid, "", f.o.Route)
	if err != nil {
		return "", false
	}
	node, _, ok := strings.Cut(plain, "/")
	return node, ok && (f.o.CheckNode == nil || f.o.CheckNode(node) == nil)
}

// HoldsSession says whether r's 2025-11-25 session is this node's.
func (f *Forward) HoldsSession(r *http.Request) bool {
	node, ok := f.Owner(r.Header.Get("Mcp-Session-Id"))
	return ok && node == f.o.Nodes.Self()
}

// UnknownSession is the 404 of a session this replica cannot serve, with
// the code of an unknown session, so that the client initializes again.
func UnknownSession(reason, msg string) *RefusalError {
	v := Refuse(http.StatusNotFound, reason, msg)
	v.Code = message.CodeUnknownSession
	return &RefusalError{Verdict: v}
}

// Approvals of forwarded calls. A call that an approve rule holds runs
// on the node that holds its session, which decides every forwarded
// request again (it trusts no other node's decision: see hop.go). So that
// node settles the approval too, once, where the call runs: the replica
// that got the request forwards the held call unsettled
// ([SettledByOwner]), marked in its context ([WithOwnerSettles]) so that
// it is never served anywhere else. Had the first replica consumed the
// approval, the owner would find the call held on a used approval and
// refuse it: the approved call would never run.

type ownerSettlesKey struct{}

// SettledByOwner reports whether route sends r to another node, the one
// that holds its 2025-11-25 session, whose settlement of an approval
// holds: the same reading of the session id that [Forward.ServeLegacy]
// makes.
func SettledByOwner(route Route, r *http.Request) bool {
	fr, ok := route.(ForwardedRoute)
	if !ok || modernRequest(r) {
		return false
	}
	f := fr.Forwarder()
	node, ok := f.Owner(r.Header.Get("Mcp-Session-Id"))
	return ok && node != f.o.Nodes.Self()
}

// WithOwnerSettles marks a held call that [SettledByOwner] sends on
// unsettled: the route may only forward it.
func WithOwnerSettles(ctx context.Context) context.Context {
	return context.WithValue(ctx, ownerSettlesKey{}, true)
}

// OwnerSettles reports whether ctx's call is held, for the node that
// holds its session to settle.
func OwnerSettles(ctx context.Context) bool {
	v, _ := ctx.Value(ownerSettlesKey{}).(bool)
	return v
}

// servedHereUnsettled refuses to serve here a call held for the owner to
// settle: [SettledByOwner] and the route read the session id alike, so
// this is never reached but by a bug.
func servedHereUnsettled(r *http.Request) error {
	if !OwnerSettles(r.Context()) {
		return nil
	}
	return &RefusalError{Verdict: Refuse(http.StatusForbidden, ReasonApproval,
		"this call needs a person's approval, which the replica that holds its session settles, and it could not be sent there; make the call again")}
}

// UnknownSessionOf is the refusal that [Forward.ServeLegacy] gives r when
// route forwards 2025-11-25 sessions and r's session id names no node of
// the route's (sealed with another key or for another route, or naming no
// valid node), and the zero Verdict otherwise. A held call is checked so
// before its approval is settled: settled first, the approval would be
// used up on a call that no replica runs.
func UnknownSessionOf(route Route, r *http.Request) Verdict {
	fr, ok := route.(ForwardedRoute)
	sid := r.Header.Get("Mcp-Session-Id")
	if !ok || modernRequest(r) || sid == "" {
		return Verdict{}
	}
	if _, ok := fr.Forwarder().Owner(sid); ok {
		return Verdict{}
	}
	return UnknownSession("session_unknown", "unknown session: start a new session by initializing again without Mcp-Session-Id").Verdict
}

// ServeLegacy serves a 2025-11-25 request on route here when its session
// is this node's (or it has none: an initialize), or forwards it to the
// node that holds it.
func (f *Forward) ServeLegacy(w http.ResponseWriter, r *http.Request, next Next, route Route) error {
	sid := r.Header.Get("Mcp-Session-Id")
	if sid == "" {
		if err := servedHereUnsettled(r); err != nil {
			return err
		}
		return route.Serve(w, r, next)
	}
	node, ok := f.Owner(sid)
	if !ok {
		return UnknownSession("session_unknown", "unknown session: start a new session by initializing again without Mcp-Session-Id")
	}
	if node == f.o.Nodes.Self() {
		if err := servedHereUnsettled(r); err != nil {
			return err
		}
		return route.Serve(w, r, next)
	}
	addr, alive := f.o.Nodes.Lookup(node)
	if !alive {
		return UnknownSession("session_node_gone", fmt.Sprintf("unknown session: the replica that held it (node %q) is gone; start a new session by initializing again without Mcp-Session-Id", node))
	}
	return f.Send(w, r, sid, node, addr)
}

// Send sends r to node at addr and streams its answer to w.
func (f *Forward) Send(w http.ResponseWriter, r *http.Request, sid, node, addr string) error {
	return f.sendFrom(w, r, sid, f.o.Nodes.Self(), node, addr)
}

// sendFrom sends r from node self to node at addr.
func (f *Forward) sendFrom(w http.ResponseWriter, r *http.Request, sid, self, node, addr string) error {
	p, _ := policy.PrincipalFrom(r.Context())
	var body []byte
	if r.Body != nil {
		// The edge read the body already (bounded): this is its copy.
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return &RefusalError{Verdict: Refuse(http.StatusBadRequest, ReasonMalformed, "the request body could not be read; send it again")}
		}
	}
	target, err := url.Parse(addr)
	if err != nil {
		return UnknownSession("session_node_gone", "unknown session: its replica's address does not parse; start a new session")
	}
	// The path the client asked for, before any rewrite here: the owner's
	// server routes it as this one did.
	orig := f.o.URL(r)
	target.Path, target.RawPath, target.RawQuery = orig.Path, orig.RawPath, orig.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target.String(), bytes.NewReader(body))
	if err != nil {
		return UnknownSession("session_node_gone", "unknown session: its replica's address is not usable; start a new session")
	}
	// The owner's site is the one the client reached here: the same Host,
	// so that the owner routes the hop to the same site. The target
	// address is the registry's, whatever the Host.
	out.Host = r.Host
	out.ContentLength = int64(len(body))
	for _, name := range HopForwardedHeaders {
		for _, v := range r.Header.Values(name) {
			out.Header.Add(name, v)
		}
	}
	for _, name := range HopParamHeaders(r.Header) {
		out.Header[name] = append([]string(nil), r.Header[name]...)
	}
	out.Header.Del("DPoP")
	if proof := ProofFrom(r.Context()); proof != "" {
		out.Header.Set("DPoP", proof)
	}
	if s, ok := settlementFrom(r.Context()); ok {
		// The call runs on node on an approval (or a round of one)
		// consumed here: marked for node in storage, which node checks.
		if err := s.Mark(r.Context(), node); err != nil {
			return &RefusalError{Verdict: Refuse(http.StatusServiceUnavailable, "hop_failed", "this approved call cannot be sent to the replica that holds its upstream call ("+err.Error()+")")}
		}
		out.Header.Set(HopSettledHeader, s.ID)
	}
	nonce, err := f.o.Hop.Sign(out, f.o.Route, self, node, p, policy.JWTFrom(r.Context()), f.o.ClientIP(r), body, time.Now())
	if err != nil {
		return &RefusalError{Verdict: Refuse(http.StatusBadGateway, "hop_failed", "this request cannot be forwarded to the replica that holds its session: "+err.Error())}
	}
	resp, err := f.client.Do(out)
	if err != nil {
		if r.Context().Err() != nil {
			return nil // the client went away
		}
		f.o.OnEvent(ForwardEvent{Event: "session_forward_failed", Node: node, TokenID: p.TokenID, Err: err.Error()})
		if modernRequest(r) {
			// A bridged call's retry: there is no session to initialize.
			return &RefusalError{Verdict: Refuse(http.StatusBadGateway, "call_node_unreachable",
				fmt.Sprintf("the replica that holds this call (node %q) does not answer; call the tool again without requestState and inputResponses", node))}
		}
		return UnknownSession("session_node_unreachable", fmt.Sprintf("unknown session: the replica that held it (node %q) does not answer; start a new session by initializing again without Mcp-Session-Id", node))
	}
	defer resp.Body.Close()
	if reason := resp.Header.Get(HopRefusedHeader); reason != "" {
		f.o.OnEvent(ForwardEvent{Event: "session_forward_refused", Node: node, Reason: reason, Status: resp.StatusCode})
		return &RefusalError{Verdict: hopRefusedVerdict(node, reason, resp.Header.Get("Retry-After"))}
	}
	if !f.o.Hop.CheckAnswer(resp.Header.Get(HopAnswerHeader), self, node, nonce) {
		// Something answered at the advertised address, but not the route
		// the hop was for: relay none of it.
		f.o.OnEvent(ForwardEvent{Event: "session_forward_untagged", Node: node, Status: resp.StatusCode})
		v := Refuse(http.StatusBadGateway, "hop_untagged", fmt.Sprintf("the replica that holds this session (node %q) did not answer through its aggregated route; the operator should check that its advertise address reaches this same site", node))
		return &RefusalError{Verdict: v}
	}
	for _, name := range hopAnswerHeaders {
		for _, v := range resp.Header.Values(name) {
			w.Header().Add(name, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	relay(w, resp.Body)
	return nil
}

// hopRefusedVerdict is what the client is told of a hop the owner refused
// for reason. An owner whose replay check is at its memory bound says
// hop_busy: the client may retry once it has room, after the owner's
// Retry-After (1 to 60 s; else 1 s). Any other refusal is the cluster's
// configuration, which the message sends the operator to check.
func hopRefusedVerdict(node, reason, retryAfter string) Verdict {
	if reason == "hop_busy" {
		v := Refuse(http.StatusServiceUnavailable, "hop_busy", fmt.Sprintf("the replica that holds this session (node %q) takes no more forwarded requests for now; retry after the Retry-After delay", node))
		v.RetryAfter = time.Second
		if s, err := strconv.Atoi(retryAfter); err == nil && s > 0 && s <= 60 {
			v.RetryAfter = time.Duration(s) * time.Second
		}
		return v
	}
	return Refuse(http.StatusBadGateway, "hop_refused", fmt.Sprintf("the replica that holds this session (node %q) refused the forwarded request (%s); the operator should check that every replica has the same cluster key and configuration, and synchronized clocks", node, reason))
}

// relay streams the owner's answer to the client, flushing each read, until
// either side ends it.
func relay(w http.ResponseWriter, body io.Reader) {
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the client went away
			}
			if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return
			}
		}
		if rerr != nil {
			return // the owner ended the answer, or went away: the client sees the stream end
		}
	}
}

// ForwardedRoute is a route that takes requests other replicas forward.
type ForwardedRoute interface {
	Route
	// Forwarder is the route's forwarding.
	Forwarder() *Forward
	// Holds says whether this node serves the forwarded request r (its
	// message decided, in its context).
	Holds(r *http.Request) bool
	// ServeForwarded serves a forwarded request here.
	ServeForwarded(w http.ResponseWriter, r *http.Request) error
}

// ClusterAggregate is the aggregated route in cluster mode: a request for
// another node's 2025-11-25 session goes there, as does a 2026-07-28
// retry of a call bridged to a 2025-11-25 upstream on another node.
type ClusterAggregate struct {
	*Aggregate
	// BridgeNode is the node that holds the pending call a requestState
	// names, "" for none.
	BridgeNode func(state string) string
	Fwd        *Forward
}

// Serve serves r here, or forwards it to the node that holds its session,
// or the pending call its requestState names.
func (c *ClusterAggregate) Serve(w http.ResponseWriter, r *http.Request, next Next) error {
	if modernRequest(r) {
		if err := servedHereUnsettled(r); err != nil {
			return err
		}
		// A 2026-07-28 retry of a call bridged to a 2025-11-25 upstream:
		// the node that sealed its requestState holds the pending call.
		if node := c.bridgeNode(r); node != "" && node != c.Fwd.Self() {
			if addr, alive := c.Fwd.o.Nodes.Lookup(node); alive {
				return c.Fwd.Send(w, r, "", node, addr)
			}
			// Its node is gone, and the call with it: served here, the
			// state is refused with "call the tool again".
		}
		return c.Aggregate.Serve(w, r, next)
	}
	return c.Fwd.ServeLegacy(w, r, next, c.Aggregate)
}

// Holds says whether this node serves the forwarded request r: a
// 2026-07-28 retry of a call it holds, or a request of a 2025-11-25
// session it holds.
func (c *ClusterAggregate) Holds(r *http.Request) bool {
	if modernRequest(r) {
		return c.bridgeNode(r) == c.Fwd.Self()
	}
	return c.Fwd.HoldsSession(r)
}

// Forwarder is the route's forwarding.
func (c *ClusterAggregate) Forwarder() *Forward { return c.Fwd }

// ServeForwarded serves a forwarded request here.
func (c *ClusterAggregate) ServeForwarded(w http.ResponseWriter, r *http.Request) error {
	return c.Aggregate.Serve(w, r, nil)
}

// bridgeNode is the node that holds the pending call r's requestState
// names, as the one reader read it from the message the edge decided on;
// "" when it names none. A misreading here could only send the retry to a
// node that does not hold the call, which refuses the state: the node
// decides the request again on the same body.
func (c *ClusterAggregate) bridgeNode(r *http.Request) string {
	b, ok := message.FromContext(r.Context())
	if !ok || b.Batch || len(b.Calls) != 1 || b.Calls[0].RequestState == "" {
		return ""
	}
	return c.BridgeNode(b.Calls[0].RequestState)
}

// ClusterSessions is the sessions endpoint in cluster mode: its 2025-11-25
// MCP sessions live in the memory of the replica that opened them (their
// pushed events, their streams), so a request for another node's goes
// there, as the aggregated route's do. Its 2026-07-28 requests are served
// here: the sessions they act on are reached wherever they run (package
// clustersessions).
type ClusterSessions struct {
	*Sessions
	Fwd *Forward
}

// Serve serves r here, or forwards it to the node that holds its session.
func (c *ClusterSessions) Serve(w http.ResponseWriter, r *http.Request, next Next) error {
	if modernRequest(r) {
		if err := servedHereUnsettled(r); err != nil {
			return err
		}
		return c.Sessions.Serve(w, r, next)
	}
	return c.Fwd.ServeLegacy(w, r, next, c.Sessions)
}

// Holds says whether this node holds the forwarded request's 2025-11-25
// session.
func (c *ClusterSessions) Holds(r *http.Request) bool {
	return !modernRequest(r) && c.Fwd.HoldsSession(r)
}

// Forwarder is the route's forwarding.
func (c *ClusterSessions) Forwarder() *Forward { return c.Fwd }

// ServeForwarded serves a forwarded request here.
func (c *ClusterSessions) ServeForwarded(w http.ResponseWriter, r *http.Request) error {
	return c.Sessions.Serve(w, r, nil)
}

// Verify checks a hop another replica sent this node for this route (see
// [HopKey.Verify]).
func (f *Forward) Verify(r *http.Request, uri string, body []byte, now time.Time) (HopClaims, Verdict) {
	return f.o.Hop.Verify(r, uri, body, f.o.Nodes.Self(), f.o.Route, now)
}

// CheckSender refuses a checked hop whose sender is not alive in the node
// registry: 403 hop_unknown_node.
func (f *Forward) CheckSender(c HopClaims) Verdict {
	if _, alive := f.o.Nodes.Lookup(c.From); !alive {
		return Refuse(http.StatusForbidden, "hop_unknown_node",
			fmt.Sprintf("the forwarded request comes from node %q, which is not alive in the node registry", c.From))
	}
	return Verdict{}
}

// AnswerTag is the tag of this node's answer to the hop c (see
// [HopKey.AnswerTag]).
func (f *Forward) AnswerTag(c HopClaims) string { return f.o.Hop.AnswerTag(c) }

// HopRoute is route as a route that takes requests other replicas
// forward, or the refusal (403 hop_refused) of the replicas' hop headers
// on a site whose route takes none.
func HopRoute(route Route) (ForwardedRoute, Verdict) {
	if fr, ok := route.(ForwardedRoute); ok {
		return fr, Verdict{}
	}
	return nil, Refuse(http.StatusForbidden, "hop_refused",
		"Zidane-Hop headers are the replicas' own, and this site takes no forwarded requests; send the request without them")
}

// HeldHere refuses a forwarded request that this node does not hold: a
// 2025-11-25 request of a session another node holds (404
// session_unknown, so that the client initializes again), or a 2026-07-28
// request that is not the retry of a call this node holds (400
// hop_misdirected: a 2026-07-28 request is forwarded for nothing else).
// For the latter, r carries its decided message in its context.
func HeldHere(route ForwardedRoute, r *http.Request) Verdict {
	if !modernRequest(r) {
		if !route.Forwarder().HoldsSession(r) {
			return UnknownSession("session_unknown", "unknown session: start a new session by initializing again without Mcp-Session-Id").Verdict
		}
		return Verdict{}
	}
	if !route.Holds(r) {
		return Refuse(http.StatusBadRequest, "hop_misdirected",
			"this replica holds no pending call that the forwarded request's requestState names; call the tool again without requestState and inputResponses")
	}
	return Verdict{}
}

// modernRequest reports whether r is a 2026-07-28 request (or later), by
// its protocol version header, as the aggregated route tells them apart.
func modernRequest(r *http.Request) bool {
	return r.Header.Get(versionHeader) >= modernVersion
}
