package caddymodule

import (
	"context"
	"net/http"
	"net/url"
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
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The wiring of edge.Forward, which forwards a route's 2025-11-25
// sessions between replicas (see edge/forward.go): the node registry and
// the sealing key of cluster storage, the request's URL before Caddy's
// rewrites, the client's address as Caddy's trusted_proxies give it, and
// the audit lines of the hops that go wrong. A request another replica
// forwarded arrives at serveHop.

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

// newForward wires the forwarding of the route whose session ids ids
// seals, to the registry nodes, with hop.
func newForward(ids *sessionid.Sealer, route string, nodes edge.HopNodes, hop *edge.HopKey, audit *zap.Logger) *edge.Forward {
	if audit == nil {
		audit = zap.NewNop()
	}
	return edge.NewForward(edge.ForwardOptions{IDs: ids, Route: route, Nodes: nodes, Hop: hop, CheckNode: cluster.CheckNodeID,
		URL: hopURL, ClientIP: clientIP, OnEvent: func(e edge.ForwardEvent) { auditForward(audit, e) }})
}

// auditForward writes the audit line of a hop that went wrong.
func auditForward(l *zap.Logger, e edge.ForwardEvent) {
	switch e.Event {
	case "session_forward_failed":
		l.Warn("session forward failed", zap.String("event", e.Event), zap.String("node", e.Node), zap.String("token_id", e.TokenID), zap.String("error", e.Err))
	case "session_forward_refused":
		l.Error("a replica refused a forwarded request", zap.String("event", e.Event), zap.String("node", e.Node), zap.String("reason", e.Reason), zap.Int("status", e.Status))
	default:
		l.Error("a replica's advertised address answered without the route's tag", zap.String("event", e.Event), zap.String("node", e.Node), zap.Int("status", e.Status))
	}
}

// bridgeKey is the key of an aggregated route's sealed requestStates, the
// same on every replica of the route and another for another route.
func bridgeKey(cs *cluster.Storage, f *edge.Forward) ([]byte, error) {
	return cs.DeriveKey("aggregate bridge v1|" + f.Route())
}

// serveHop serves a request another replica forwarded: an aggregated
// route's 2025-11-25 session that this node holds. The sender ran the edge
// on it; this node checks the hop (see verify), that the sender is alive
// in the registry and that the session is this node's, establishes whom
// it acts for from the identity the hop names (its own token store, its
// own check of a JWT; the hop's scopes only narrow what it finds), holds a
// DPoP-bound principal to the client's proof the hop carries
// (edge.DPoP.CheckForwarded), decides the request again as the sender did,
// and serves it with that principal in its context. A refused hop is
// answered 401 (403 for a sender the registry does not know) and audited,
// and its address charged like a failed credential; a principal refused
// here is answered as the route's own refusal (401 hop_principal, 403
// hop_scopes, 401 invalid_dpop_proof), audited.
func (h *Handler) serveHop(w http.ResponseWriter, r *http.Request, rf refusal) error {
	now := time.Now()
	auth := edge.Authentication{Authn: h.authn, Failures: h.ipLimit, IPv6Prefix: h.ipv6Prefix}
	refuse := func(v edge.Verdict) error {
		v = auth.ChargeRefusedHop(rf.clientIP, now, v)
		w.Header().Set(edge.HopRefusedHeader, v.Reason)
		return h.refuse(w, r, rf, v)
	}
	ca, v := edge.HopRoute(h.route.route)
	if !v.Allowed() {
		return refuse(v)
	}
	var body []byte
	if r.Method == http.MethodPost {
		if body, v = edge.ReadBody(r, h.MaxBodyBytes); !v.Allowed() {
			return h.refuse(w, r, rf, v)
		}
	} else if v := edge.NoBody(r); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	f := ca.Forwarder()
	claims, v := f.Verify(r, hopURI(r), body, now)
	if !v.Allowed() {
		return refuse(v)
	}
	// Until it is established here, the audit lines name the identity the
	// hop claims; they name the client the sender's edge saw, and the
	// replica it came through.
	rf.p = policy.Principal{TokenID: claims.TokenID}
	rf.via, rf.clientIP = rf.clientIP, claims.Client
	if v := f.CheckSender(claims); !v.Allowed() {
		return refuse(v)
	}
	// From here on this node answers for the route, refusals included
	// (an unknown session's 404, a revoked token's 401 reach the client
	// as such).
	w.Header().Set(edge.HopAnswerHeader, f.AnswerTag(claims))
	p, v := claims.Principal(r.Context(), h.authn, now)
	if !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	if v := h.dpop.CheckForwarded(r.Context(), p, r.Header.Values("DPoP"), r.Method, hopURL(r).EscapedPath(), claims.JWT, now); !v.Allowed() {
		rf.p = p
		return h.refuse(w, r, rf, v)
	}
	rf.p = p
	modern := aggregate.ModernRequest(r)
	if !modern {
		if v := edge.HeldHere(ca, r); !v.Allowed() {
			return h.refuse(w, r, rf, v)
		}
	}
	if v := edge.CheckRequest(r); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	d := edge.Decide(h.route.route, p, r.Method, r.Header, body)
	// A call an approve rule holds came unsettled (edge.SettledByOwner):
	// settled here, where it runs, and audited here once it is allowed
	// (the sender, which rate limited it, wrote no line for it).
	held := d.Reason == edge.ReasonApproval
	if id := r.Header.Get(edge.HopSettledHeader); held && modern && id != "" {
		// A 2026-07-28 call is settled by the replica that got it
		// (edge.SettledByOwner is false for it), which consumed its
		// approval or round, audited it, and marked it in storage for
		// this node: checked there, and taken once.
		d.Verdict, held = h.approvals.SettleForwarded(r.Context(), d, id, f.Self()), false
	} else {
		h.settle(r, h.route.route, p, &d)
	}
	if !d.Allowed() {
		rf.call = d.Call
		return h.refuse(w, r, rf, d.Verdict)
	}
	for _, rd := range d.Ruled {
		logRuleAllowed(h.audit, p, rd, rf.clientIP)
	}
	if held && d.Body != nil {
		for _, c := range d.Body.Calls {
			if c.IsToolCall() {
				logToolCall(h.audit, p, c, rf.clientIP)
			}
		}
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
	if modern {
		// A 2026-07-28 request is held by its pending call, which its
		// decided message names.
		if v := edge.HeldHere(ca, r.WithContext(ctx)); !v.Allowed() {
			return h.refuse(w, r, rf, v)
		}
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
	r.Header.Del(edge.HopSettledHeader)
	r.Header.Del("Authorization")
	r.Header.Del("DPoP")
	// The address the sender's edge saw, which its signature covers.
	r.Header[upstream.ClientIPHeader] = []string{claims.Client}
	h.audit.Debug("forwarded request", zap.String("event", "session_forwarded_in"), zap.String("from", claims.From),
		zap.String("token_id", p.TokenID), zap.String("http_method", r.Method), zap.String("client_ip", claims.Client), zap.String("via", rf.via))
	// The sender's edge filters the answer (its listing filter): served
	// here as the route serves its own requests.
	return ca.ServeForwarded(w, r)
}
