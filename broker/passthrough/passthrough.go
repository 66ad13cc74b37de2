package passthrough

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	connectlink "github.com/Tahul/caddy-zidane-mcp/broker/connect"
	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Options configures [New].
type Options struct {
	// Lookup reads the environment variables of the upstream's ${VAR}
	// placeholders; nil means os.LookupEnv. A config marked FromUntrusted
	// never calls it.
	Lookup func(string) (string, bool)

	// AnswerBudget, when set, bounds the bytes of upstream answers held at
	// once (see [answerlimit.Budget]); the route holds only events being read.
	AnswerBudget *answerlimit.Budget

	// SessionKey seals the session ids given to clients (see
	// [sessionid.Sealer]): 32 random bytes. Keep it across config reloads, or
	// every open session's client must initialize again.
	SessionKey []byte

	// Route is the route identity bound into session ids, so an id given
	// out on one route opens on no other. Default: "broker:" + the
	// upstream's name.
	Route string

	// MaxBodyBytes bounds a request body; a larger one gets 413. Give the
	// edge's own limit. Default: [upstream.DefaultMaxBody].
	MaxBodyBytes int64

	// DenyPrivateAddresses, when set, turns pinnedfetch's dial-time address
	// guard on or off. Unset keeps its default: on, except for an upstream
	// URL on loopback.
	DenyPrivateAddresses *bool

	// Headers are more headers for every request to the upstream, attached
	// as the upstream's configured headers are (on its origin only), with
	// values already resolved: they are never expanded, so a value may
	// hold "${". Names are refused as configured ones are, and so is one
	// that the upstream's config has too.
	Headers map[string]string

	// NoRedirects makes the egress client follow no redirect: an upstream
	// answer of 301, 302, 303, 307 or 308 is a failed call (502), as
	// pinnedfetch.WithMaxRedirects(0) makes it. Then the client dials only
	// the configured URL's host.
	NoRedirects bool

	// OnDecision receives every redirect decision of the egress client
	// (each hop sent, followed or refused), for audit.
	OnDecision func(pinnedfetch.Decision)

	// OnCall receives a record of every exchange with the upstream, when
	// it ends.
	OnCall func(upstream.CallRecord)

	// OnRefusal receives a record of every request refused before an
	// upstream call.
	OnRefusal func(upstream.Refusal)

	// Logger receives warnings (unset variables, upstream failures). Nil
	// discards them.
	Logger *slog.Logger

	// Credentials, when set, wraps the egress transport for hops on the
	// upstream's origin, after the configured headers are added: the
	// upstream's OAuth client (see package upstreamauth) adds its bearer
	// token there. pinnedfetch never sends a hop off the origin through it.
	Credentials func(next http.RoundTripper) http.RoundTripper

	// ConnectRequired answers a request that was not sent because the
	// upstream takes each person's own token (credentials per_user) and
	// the caller has none: err names the upstream and why. Nil:
	// [RefuseConnectRequired]. The handshake and the listings of such a
	// person are answered by the route itself (see unconnected.go).
	ConnectRequired ConnectRequiredFunc

	// Retry, when set, sees a call whose requestState is a connect
	// answer's (connectlink.IsConnectState: the 2026-07-28 retry of a call
	// that asked its person to connect) before it is sent: it waits for
	// the person to connect and reports false, or answers w itself (a
	// decline, a requestState not the caller's) and reports true.
	Retry func(w http.ResponseWriter, r *http.Request, c message.Call) (answered bool)

	// Connected, when set, blocks until the person calling r connects
	// their account at the upstream, at since or later, or ctx ends; it
	// returns the ids of their elicitations for it. A GET stream of a
	// person not connected waits on it; without it, such a stream is
	// refused.
	Connected func(ctx context.Context, r *http.Request, since time.Time) (elicitations []string, ok bool)

	// Elicitations, when set, returns at once the ids of the live
	// elicitations of the person calling r for the upstream (each a call
	// that asked them to connect). A GET stream of a session begun before
	// its person connected, that comes once they have, tells of them.
	Elicitations func(ctx context.Context, r *http.Request) []string

	// Store keeps the upstream session ids of pending sessions (those
	// begun before their person connected), so that every replica
	// sharing it continues them. Nil: this process alone.
	Store storage.Storage
}

// ConnectRequiredFunc answers, in w, the request r (the JSON-RPC id rpcID,
// empty for a notification; method its method) refused because the
// calling person has not connected their account to the upstream.
// initCaps are the client capabilities of the session's initialize, when
// the session remembers them (nil otherwise).
type ConnectRequiredFunc func(w http.ResponseWriter, r *http.Request, rpcID json.RawMessage, method string, err *upstreamauth.ConnectRequiredError, initCaps []byte)

// RefuseConnectRequired is the default [Options.ConnectRequired]: a tool
// call gets a tool error (which an agent reads and reports), any other
// request HTTP 403 with a JSON-RPC error; both say that the person must
// connect their account to the upstream.
func RefuseConnectRequired(w http.ResponseWriter, r *http.Request, rpcID json.RawMessage, method string, err *upstreamauth.ConnectRequiredError, _ []byte) {
	msg := err.Error()
	if method == "tools/call" && len(rpcID) > 0 {
		writeToolError(w, rpcID, msg)
		return
	}
	upstream.WriteRPCError(w, http.StatusForbidden, rpcID, message.CodeUpstream, msg)
}

// PassThrough is the pass-through route: one streamable-HTTP upstream
// offered unchanged behind the edge. It is an http.Handler for requests the
// edge has already authenticated and authorized; it forwards each one at the
// HTTP level, so every MCP feature passes as it is (tools, resources,
// prompts, completion, logging, progress, cancellation, subscriptions, the
// server's sampling and elicitation requests over SSE, GET streams, DELETE,
// resumption with Last-Event-ID).
//
// What it changes on the way:
//
//   - Every request, whatever its path under the route, goes to the
//     configured URL, through a pinnedfetch client that adds the upstream's
//     configured headers on hops to its origin only.
//   - Request headers pass through an allow-list: Content-Type, Accept,
//     Mcp-Protocol-Version, Last-Event-ID, Mcp-Method, Mcp-Name,
//     Mcp-Param-*, Traceparent and Tracestate. Nothing else leaves the
//     edge: not the client's Authorization, Cookie or Proxy-Authorization,
//     not Origin, User-Agent or X-Forwarded-*, no hop-by-hop header.
//   - Mcp-Session-Id is translated both ways: the client gets a sealed id
//     bound to its token and this route ([sessionid.Sealer]), never the
//     upstream's.
//   - Response headers pass through an allow-list too (Content-Type,
//     Content-Encoding, Cache-Control, Retry-After, Allow): Set-Cookie and
//     WWW-Authenticate stay behind. An upstream 401, 403 or 407 refused the
//     gateway's credentials, not the client's, and becomes 502.
//   - Event-stream answers go to the client event by event, each flushed
//     as soon as it is whole, so it arrives when the upstream sent it.
//     Other answers are read whole first.
//   - Every answer is bounded by the upstream's max_response (a POST's
//     answer whole, a GET stream per event) and by the in-flight answer
//     budget. Past either, the request gets an error that names the
//     upstream and the limit (a tool error for a tools/call; on a stream,
//     as its last event), and the upstream session is dropped: the
//     client's next request on it gets 404, and the session is ended
//     upstream.
//
// A PassThrough is safe for concurrent use. Close releases its idle
// connections.
type PassThrough struct {
	name          string
	route         string
	endpoint      string // expanded: may hold a key in its query, never logged
	client        *http.Client
	ids           *sessionid.Sealer
	maxBody       int64
	headerTimeout time.Duration
	onCall        func(upstream.CallRecord)
	onRefusal     func(upstream.Refusal)
	connect       ConnectRequiredFunc
	retry         func(http.ResponseWriter, *http.Request, message.Call) bool
	connected     func(context.Context, *http.Request, time.Time) ([]string, bool)
	elicitations  func(context.Context, *http.Request) []string
	pending       pendingSessions
	legacy        atomic.Bool // the upstream refused a server/discover: it speaks no 2026-07-28
	logger        *slog.Logger

	droppedMu sync.Mutex
	dropped   map[string]bool // upstream sessions dropped after an answer over a limit
}

// New builds the pass-through route for u, which must be a
// streamable-HTTP ("http") upstream. It expands u's placeholders here,
// where the transport is built, and refuses a URL or a header value that
// still holds one, a header the route sets itself (Content-Type, Accept,
// Mcp-*, Last-Event-ID, framing headers), and a session key that is not 32
// bytes. Errors name the upstream and say what to change; they never quote
// a header value.
func New(u upstream.Config, opts Options) (*PassThrough, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n, err := upstream.Normalize(u)
	if err != nil {
		return nil, err
	}
	if n.Transport != upstream.TransportHTTP {
		return nil, fmt.Errorf("%s: transport %q cannot use the pass-through route, which relays streamable HTTP unchanged; serve sse and stdio upstreams with the aggregated route (zidane_mcp { aggregate %s }, with prefix conditional to keep its names), or give the server's streamable HTTP url", upstream.Describe(n), n.Transport, n.Name)
	}
	e, warnings := n.Expanded(opts.Lookup)
	for _, w := range warnings {
		logger.Warn(w)
	}
	if _, err := e.Endpoint(); err != nil {
		return nil, err
	}
	headers, err := upstream.ConfiguredHeaders(e)
	if err != nil {
		return nil, err
	}
	if headers, err = withResolvedHeaders(headers, opts.Headers, upstream.Describe(n)); err != nil {
		return nil, err
	}
	ids, err := sessionid.New(opts.SessionKey)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", upstream.Describe(n), err)
	}
	maxBody := cmp.Or(opts.MaxBodyBytes, upstream.DefaultMaxBody)
	if maxBody < 0 {
		return nil, fmt.Errorf("%s: MaxBodyBytes %d is negative; give a positive limit, or 0 for the default", upstream.Describe(n), maxBody)
	}

	client, err := upstream.PinnedClient(e.URL, headers, opts.OnDecision, opts.DenyPrivateAddresses, opts.Credentials, opts.NoRedirects)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", upstream.Describe(n), err)
	}
	connect := opts.ConnectRequired
	if connect == nil {
		connect = RefuseConnectRequired
	}
	// A JSON answer is held whole and an event until it is whole (see
	// answer and relayEvents): max_response and the budget bound both.
	client.Transport = &upstream.TraceTransport{Upstream: n.Name, Next: answerlimit.NewTransport(client.Transport, n.Name, n.MaxResponse, opts.AnswerBudget)}
	return &PassThrough{
		name:          n.Name,
		route:         cmp.Or(opts.Route, "broker:"+n.Name),
		endpoint:      e.URL,
		client:        client,
		ids:           ids,
		maxBody:       maxBody,
		headerTimeout: cmp.Or(n.Timeout, upstream.DefaultHeaderTimeout),
		onCall:        opts.OnCall,
		onRefusal:     opts.OnRefusal,
		connect:       connect,
		retry:         opts.Retry,
		connected:     opts.Connected,
		elicitations:  opts.Elicitations,
		pending:       pendingSessions{store: opts.Store},
		logger:        logger,
	}, nil
}

// Route returns the route identity bound into this route's session ids.
func (pt *PassThrough) Route() string { return pt.route }

// Close closes the idle upstream connections. Requests and streams under
// way keep running until they end.
func (pt *PassThrough) Close() { pt.client.CloseIdleConnections() }

// withResolvedHeaders adds the resolved headers of
// [Options.Headers] to the configured ones. Errors name the
// header, never its value.
func withResolvedHeaders(headers []upstream.Header, resolved map[string]string, who string) ([]upstream.Header, error) {
	if len(resolved) == 0 {
		return headers, nil
	}
	for _, name := range slices.Sorted(maps.Keys(resolved)) {
		canonical := http.CanonicalHeaderKey(name)
		if !upstream.ValidHeaderName(name) {
			return nil, fmt.Errorf("%s: header %q is not a valid HTTP header name", who, name)
		}
		if upstream.ReservedUpstreamHeader(canonical) {
			return nil, fmt.Errorf("%s: header %s is set by the pass-through route for each request; remove it", who, canonical)
		}
		if slices.ContainsFunc(headers, func(h upstream.Header) bool { return h.Name == canonical }) {
			return nil, fmt.Errorf("%s: header %s is given twice; give it once", who, canonical)
		}
		if strings.ContainsAny(resolved[name], "\r\n\x00") {
			return nil, fmt.Errorf("%s: header %s: the value holds a line break or NUL; fix where it comes from", who, canonical)
		}
		headers = append(headers, upstream.Header{Name: canonical, Value: resolved[name]})
	}
	slices.SortFunc(headers, func(a, b upstream.Header) int { return strings.Compare(a.Name, b.Name) })
	return headers, nil
}

var errHeaderTimeout = errors.New("no response headers in time")

// ServeHTTP forwards one MCP request to the upstream and relays its answer.
// It expects the edge's [policy.Principal] in the request context and
// answers 500 without one.
//
// Status codes of its own: 404 with a JSON-RPC error for a session id that
// does not open for this token on this route (the spec's unknown session:
// the client initializes again); 400 for more than one Mcp-Session-Id; 405
// for methods other than POST, GET and DELETE; 413 for a body over the
// limit; 502 when the upstream cannot be reached, refuses the gateway's
// credentials (401, 403, 407), answers a redirect the egress client does
// not follow, or hands out an invalid session id; 504 when its headers do
// not come within the upstream's Timeout (default
// [DefaultHeaderTimeout]). An upstream 404 for a session is passed on as
// it is, so the client initializes again; every other upstream status
// passes too.
func (pt *PassThrough) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	p, ok := policy.PrincipalFrom(r.Context())
	if !ok || p.TokenID == "" {
		pt.refuse(w, r, p, exchange{}, http.StatusInternalServerError, message.CodeInternalError, "no_principal",
			"the request reached the broker route without an authenticated principal",
			"the broker route is misconfigured (it must sit behind the zidane_mcp edge); ask the operator to check the server log")
		return
	}
	ex, ok := pt.admit(w, r, p)
	if !ok {
		return
	}
	ex.start = start
	if _, inCtx := message.FromContext(r.Context()); !inCtx && ex.msg != nil {
		// Whoever answers for the route reads the one reading.
		r = r.WithContext(message.NewContext(r.Context(), ex.msg))
	}
	rec := upstream.CallRecord{Upstream: pt.name, Route: pt.route, HTTPMethod: r.Method, Method: ex.method, Tool: ex.tool,
		TokenID: p.TokenID, TokenName: p.Name, ClientIP: upstream.ClientIP(r.Header)}
	defer func() {
		rec.Duration = time.Since(start)
		if pt.onCall != nil {
			pt.onCall(rec)
		}
	}()
	if ex.method == "subscriptions/listen" && len(ex.rpcID) > 0 {
		// A listen's stream lasts as long as the client listens: its
		// events are bounded one by one (max_response each), not in all.
		r = r.WithContext(answerlimit.WithEventLimit(r.Context()))
	}
	if ex.pending != nil && r.Method == http.MethodDelete {
		// Ending a pending session starts no upstream session: only one
		// that started is ended there.
		sid, started := pt.lookup(r.Context(), p, ex.pending)
		pt.forget(r.Context(), ex.pending)
		if !started || sid == "" {
			ownAnswer(w)
			w.WriteHeader(http.StatusOK)
			rec.Outcome = upstream.OutcomeOK
			return
		}
		ex.pending, ex.upstreamSID = nil, sid
	}
	if ex.pending != nil {
		// A session begun before its person connected: it goes on with
		// an upstream session of its own once they have.
		sid, before, err := pt.startPending(r, p, ex.pending)
		if err != nil {
			pt.failed(w, r, p, &rec, ex, err)
			return
		}
		ex.upstreamSID = sid
		if !before && r.Method == http.MethodGet {
			// The session had not started when this stream came, so its
			// client may still wait to hear that its person connected:
			// late, or held up behind the client's own POST while the
			// person connected (storage locks poll), it tells them as a
			// stream held from before would have.
			rec.Outcome, rec.Status = upstream.OutcomeOK, http.StatusOK
			pt.startedStream(w, r, ex)
			return
		}
	}
	if pt.retry != nil && ex.msg != nil {
		for _, c := range ex.msg.Calls {
			if !connectlink.IsConnectState(c.RequestState) {
				continue
			}
			if ex.msg.Batch {
				rec.Outcome = upstream.OutcomeError
				pt.refuse(w, r, p, ex, http.StatusBadRequest, message.CodeInvalidRequest, "request_state_in_batch",
					"a batch carried the retry of a connect elicitation", "send the retry of a call on its own, not in a batch")
				return
			}
			if pt.retry(w, r, c) {
				rec.Outcome = upstream.OutcomeConnectRequired
				return
			}
			body, err := withoutConnectState(ex.body)
			if err != nil {
				pt.refuse(w, r, p, ex, http.StatusBadRequest, message.CodeInvalidRequest, "malformed", err.Error(),
					"the retry's params could not be read again; send the call again without requestState and inputResponses")
				return
			}
			ex.body = body
		}
	}
	resp, err := pt.send(r, ex.body, ex.upstreamSID)
	if err != nil {
		pt.failed(w, r, p, &rec, ex, err)
		return
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	pt.answer(w, r, p, ex, resp, &rec)
}

// exchange is what the route learned from a client request it admitted.
type exchange struct {
	body        []byte          // the whole request body, for a POST
	rpcID       json.RawMessage // the id of a single JSON-RPC request, for errors
	method      string          // the JSON-RPC method of the first message
	tool        string          // the tool of the first tools/call
	clientSID   string          // the sealed Mcp-Session-Id the client sent
	upstreamSID string          // what it opened to
	msg         *message.Body   // a POST's body, as read once
	start       time.Time       // when the request came
	urlCapable  bool            // its client declared URL elicitation at initialize
	pending     *pendingSession // a session begun before its person connected
}

// urlCaps are client capabilities that declare URL elicitation.
var urlCaps = []byte(`{"elicitation":{"url":{}}}`)

// initCaps are the capabilities the session's initialize declared, as far
// as the session id remembers them: URL elicitation, or nothing.
func (ex exchange) initCaps() []byte {
	if ex.urlCapable {
		return urlCaps
	}
	return nil
}

// admit checks the method, reads a POST's body and opens the session id.
// It answers and reports a refusal itself, returning false.
func (pt *PassThrough) admit(w http.ResponseWriter, r *http.Request, p policy.Principal) (exchange, bool) {
	var ex exchange
	switch r.Method {
	case http.MethodPost:
		// The edge read the body once and decided on it: forward exactly
		// those bytes, and name the call from that one reading (for audit
		// and for the id of an error).
		b, read := message.FromContext(r.Context())
		if !read {
			var err error
			if ex.body, err = readBody(r, pt.maxBody); err != nil {
				if errors.Is(err, errBodyTooLarge) {
					msg := fmt.Sprintf("the request body is over the %d-byte limit of this route; send a smaller request", pt.maxBody)
					pt.refuse(w, r, p, ex, http.StatusRequestEntityTooLarge, message.CodeInvalidRequest, "body_too_large", msg, msg)
					return ex, false
				}
				pt.refuse(w, r, p, ex, http.StatusBadRequest, message.CodeInvalidRequest, "body_unreadable",
					"reading the request body: "+err.Error(), "the request body could not be read; send it again")
				return ex, false
			}
			if b, err = message.Read(ex.body); err != nil {
				pt.refuse(w, r, p, ex, http.StatusBadRequest, message.CodeInvalidRequest, "malformed", err.Error(), err.Error())
				return ex, false
			}
		}
		ex.body, ex.msg = b.Raw, b
		ex.method = b.Calls[0].Method
		if !b.Batch {
			ex.rpcID = b.Calls[0].ID.Raw()
		}
		if i := slices.IndexFunc(b.Calls, message.Call.IsToolCall); i >= 0 {
			ex.tool = b.Calls[i].Tool
		}
	case http.MethodGet, http.MethodDelete:
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		pt.refuse(w, r, p, ex, http.StatusMethodNotAllowed, message.CodeInvalidRequest, "method_not_allowed",
			"method "+r.Method+" is not part of MCP's streamable HTTP transport",
			"this MCP endpoint takes POST, GET and DELETE")
		return ex, false
	}

	// Session binding: the id the client holds opens to the upstream's id
	// only for this token on this route.
	switch values := r.Header.Values(upstream.HeaderSessionID); {
	case len(values) > 1:
		pt.refuse(w, r, p, ex, http.StatusBadRequest, message.CodeInvalidRequest, "session_repeated",
			"the request carried more than one Mcp-Session-Id", "send one Mcp-Session-Id header")
		return ex, false
	case len(values) == 1:
		payload, err := pt.ids.Open(values[0], p.TokenID, pt.route)
		upstreamSID, urlCapable, pending := openPayload(payload)
		if err == nil && upstreamSID == "" && pending == nil {
			err = sessionid.ErrUnknown
		}
		if err == nil && pt.takeDropped(upstreamSID) {
			pt.endUpstreamSession(upstreamSID)
			pt.refuse(w, r, p, ex, http.StatusNotFound, message.CodeUnknownSession, "session_dropped",
				"the upstream session was dropped after an answer over the upstream's max_response",
				"unknown session: the gateway ended this session after the upstream sent an answer over its limit; start a new session by initializing again without Mcp-Session-Id")
			return ex, false
		}
		if err != nil {
			pt.refuse(w, r, p, ex, http.StatusNotFound, message.CodeUnknownSession, "session_unknown", err.Error(),
				"unknown session: this Mcp-Session-Id was not issued to this token on this route, or is no longer valid; start a new session by initializing again without Mcp-Session-Id")
			return ex, false
		}
		ex.clientSID, ex.upstreamSID, ex.urlCapable, ex.pending = values[0], upstreamSID, urlCapable, pending
	}
	return ex, true
}

// answer relays the upstream's answer to the client: its status, the
// allow-listed headers and the translated session id, and its body as it
// arrives. Refusals of the gateway's credentials, redirects and invalid
// session ids become 502 instead.
func (pt *PassThrough) answer(w http.ResponseWriter, r *http.Request, p policy.Principal, ex exchange, resp *http.Response, rec *upstream.CallRecord) {
	if ex.method == "server/discover" && len(ex.rpcID) > 0 {
		pt.noteDiscover(resp)
	}
	if pt.refusedStatus(w, ex, resp.StatusCode, rec) {
		return
	}
	if sid := resp.Header.Get(upstream.HeaderSessionID); sid != "" {
		switch {
		case sid == ex.upstreamSID:
			// Echo the client's own id: clients treat a changed id on a
			// later response as an error, and some servers repeat theirs
			// on every response.
			w.Header().Set(upstream.HeaderSessionID, ex.clientSID)
		case !sessionid.Valid(sid):
			rec.Outcome, rec.Detail = upstream.OutcomeError, "upstream gave a session id that is not 1 to 512 visible ASCII characters"
			upstream.WriteRPCError(w, http.StatusBadGateway, ex.rpcID, message.CodeUpstream,
				fmt.Sprintf("the upstream MCP server %q gave an invalid session id; ask the operator to check the server", pt.name))
			return
		default:
			payload := sid
			if _, url := initializeCall(r); url && ex.method == "initialize" && len(sid) < sessionid.MaxUpstream {
				// The session remembers that its client takes URL
				// elicitation, for a later call that needs its person
				// to connect.
				payload = string(markURL) + sid
			}
			w.Header().Set(upstream.HeaderSessionID, pt.ids.Seal(payload, p.TokenID, pt.route))
		}
	}
	sse := answerlimit.IsEventStream(resp.Header.Get("Content-Type"))
	var body []byte
	if !sse {
		// Held whole before a byte goes out, within max_response and the
		// answer budget: an answer over a limit then gets a proper error
		// instead of a cut body (clients read JSON whole anyway).
		var err error
		if body, err = io.ReadAll(resp.Body); err != nil {
			if answerlimit.Exceeded(err) {
				w.Header().Del(upstream.HeaderSessionID)
				pt.overLimit(w, rec, ex, cmp.Or(resp.Header.Get(upstream.HeaderSessionID), ex.upstreamSID), err)
				return
			}
			if r.Context().Err() != nil {
				rec.Outcome = upstream.OutcomeCanceled
				return
			}
			rec.Outcome, rec.Detail = upstream.OutcomeError, "upstream broke off its answer: "+upstream.SafeError(err)
			pt.logger.Warn("upstream broke off its answer", "upstream", pt.name, "route", pt.route, "error", rec.Detail)
			w.Header().Del(upstream.HeaderSessionID)
			upstream.WriteRPCError(w, http.StatusBadGateway, ex.rpcID, message.CodeUpstream,
				fmt.Sprintf("the upstream MCP server %q broke off its answer; try again", pt.name))
			return
		}
	}
	copyResponseHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)

	var (
		readErr    error
		clientGone bool
	)
	if sse {
		rc := http.NewResponseController(w)
		readErr, clientGone = relayEvents(w, resp.Body, func() error {
			if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return err
			}
			return nil
		})
	} else if _, werr := w.Write(body); werr != nil {
		clientGone = true
	}
	switch {
	case answerlimit.Exceeded(readErr) && !clientGone && r.Context().Err() == nil:
		rec.Outcome, rec.Detail = upstream.OutcomeError, readErr.Error()
		pt.logger.Warn("upstream answer over its limit; dropping the upstream session", "upstream", pt.name, "route", pt.route, "error", rec.Detail)
		if len(ex.rpcID) > 0 {
			// The events before it went out whole; the request's answer is
			// the error, on the same stream.
			w.Write(sseMessage(pt.limitAnswer(ex, readErr)))
		}
		pt.drop(cmp.Or(resp.Header.Get(upstream.HeaderSessionID), ex.upstreamSID))
	case readErr != nil && !clientGone && r.Context().Err() == nil:
		// The status has gone out; ending the body early is all that is
		// left, and the client reads it as a dropped stream.
		rec.Outcome, rec.Detail = upstream.OutcomeError, "upstream broke off its answer: "+upstream.SafeError(readErr)
		pt.logger.Warn("upstream broke off its answer", "upstream", pt.name, "route", pt.route, "error", rec.Detail)
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		rec.Outcome = upstream.OutcomeOK
	default:
		rec.Outcome = http.StatusText(resp.StatusCode)
	}
}

// send makes the upstream request for r. It runs under r's context, so a
// client that goes away ends it, and bounds only the wait for response
// headers, so streams stay open.
func (pt *PassThrough) send(r *http.Request, body []byte, upstreamSID string) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(r.Context())
	var reader io.Reader
	if len(body) > 0 {
		// A bytes.Reader gives the request GetBody, so pinnedfetch can
		// replay the body on a 307/308.
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, pt.endpoint, reader)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	copyRequestHeaders(req.Header, r.Header)
	if upstreamSID != "" {
		req.Header.Set(upstream.HeaderSessionID, upstreamSID)
	}
	timer := time.AfterFunc(pt.headerTimeout, func() { cancel(errHeaderTimeout) })
	resp, err := pt.client.Do(req)
	if !timer.Stop() {
		// The timer fired, perhaps just as the headers came: the context is
		// cancelled either way, so the body could not be read.
		if err == nil {
			resp.Body.Close()
		}
		cancel(nil)
		return nil, errHeaderTimeout
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose releases the request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel(nil)
	return err
}

// failed answers a request whose upstream call failed.
func (pt *PassThrough) failed(w http.ResponseWriter, r *http.Request, p policy.Principal, rec *upstream.CallRecord, ex exchange, err error) {
	rpcID, upstreamSID := ex.rpcID, ex.upstreamSID
	if r.Context().Err() != nil {
		// The client went away; nobody is left to answer.
		rec.Outcome = upstream.OutcomeCanceled
		return
	}
	rec.Outcome = upstream.OutcomeError
	if errors.Is(err, errHeaderTimeout) {
		rec.Detail = fmt.Sprintf("no response headers within %v", pt.headerTimeout)
		pt.logger.Warn("upstream did not answer in time", "upstream", pt.name, "route", pt.route, "timeout", pt.headerTimeout)
		upstream.WriteRPCError(w, http.StatusGatewayTimeout, rpcID, message.CodeUpstream,
			fmt.Sprintf("the upstream MCP server %q did not answer within %v; try again later, or ask the operator to raise its timeout", pt.name, pt.headerTimeout))
		return
	}
	rec.Detail = upstream.SafeError(err)
	var cre *upstreamauth.ConnectRequiredError
	if errors.As(err, &cre) {
		// Not sent: the calling person has no token of their own for
		// the upstream, and nobody else's may go in its place.
		rec.Outcome = upstream.OutcomeConnectRequired
		pt.unconnected(w, r, p, ex, cre)
		return
	}
	var sre *upstreamauth.SignInRequiredError
	if errors.As(err, &sre) {
		// Not sent: the person's token comes from their sign-in, which
		// could not give one; the person is told to sign in again.
		rec.Outcome = upstream.OutcomeConnectRequired
		if rec.Method == "tools/call" && len(rpcID) > 0 {
			writeToolError(w, rpcID, sre.Error())
			return
		}
		upstream.WriteRPCError(w, http.StatusForbidden, rpcID, message.CodeUpstream, sre.Error())
		return
	}
	if errors.Is(err, upstreamauth.ErrAuthRequired) {
		// Not sent: the gateway holds no usable token for the upstream.
		rec.Outcome = upstream.OutcomeAuthRequired
		pt.logger.Warn("upstream needs an OAuth login", "upstream", pt.name, "route", pt.route, "error", rec.Detail)
		msg := upstreamauth.LoginRequiredMessage(pt.name, err) + "; your own token is fine"
		if rec.Method == "tools/call" && len(rpcID) > 0 {
			// A tool call gets a tool error, which an agent reads and
			// reports, rather than a protocol failure.
			writeToolError(w, rpcID, msg)
			return
		}
		upstream.WriteRPCError(w, http.StatusServiceUnavailable, rpcID, message.CodeUpstream, msg)
		return
	}
	if answerlimit.Exceeded(err) {
		pt.overLimit(w, rec, exchange{rpcID: rpcID, method: rec.Method}, upstreamSID, err)
		return
	}
	pt.logger.Warn("upstream request failed", "upstream", pt.name, "route", pt.route, "error", rec.Detail)
	msg := fmt.Sprintf("the gateway could not reach the upstream MCP server %q; try again later, and if it persists ask the operator to check the broker log", pt.name)
	var re *pinnedfetch.RedirectError
	if errors.As(err, &re) {
		msg = fmt.Sprintf("the upstream MCP server %q redirected the gateway where it does not follow; ask the operator to check the broker log", pt.name)
	}
	upstream.WriteRPCError(w, http.StatusBadGateway, rpcID, message.CodeUpstream, msg)
}

// refuse answers a request refused before any upstream call and reports
// it. detail is for the audit record; message for the client.
func (pt *PassThrough) refuse(w http.ResponseWriter, r *http.Request, p policy.Principal, ex exchange, status, code int, reason, detail, message string) {
	if reason == "no_principal" {
		pt.logger.Error("broker route called without a principal in the request context; it must sit behind the zidane_mcp edge", "upstream", pt.name, "route", pt.route)
	}
	if pt.onRefusal != nil {
		pt.onRefusal(upstream.Refusal{
			Upstream: pt.name, Route: pt.route, HTTPMethod: r.Method, Method: ex.method,
			TokenID: p.TokenID, TokenName: p.Name,
			Reason: reason, Status: status, Detail: detail,
		})
	}
	upstream.WriteRPCError(w, status, ex.rpcID, code, message)
}

// limitAnswer is the answer to the request of ex that an answer over a limit
// replaces: a tool error for a tools/call, else a JSON-RPC error.
func (pt *PassThrough) limitAnswer(ex exchange, err error) []byte {
	if ex.method == "tools/call" {
		if b, merr := toolErrorAnswer(ex.rpcID, upstream.LimitMessage(err)); merr == nil {
			return b
		}
	}
	return upstream.RPCErrorAnswer(ex.rpcID, message.CodeUpstream, upstream.LimitMessage(err))
}

// refusedStatus answers, and reports true for, an upstream status the
// route does not relay: a refusal of the gateway's credentials, or a
// redirect pinnedfetch did not follow.
func (pt *PassThrough) refusedStatus(w http.ResponseWriter, ex exchange, status int, rec *upstream.CallRecord) bool {
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusProxyAuthRequired:
		// The client's own token passed the edge; what the upstream
		// refused is the gateway's credential for it. Its challenge
		// (WWW-Authenticate, resource metadata) would steer the client to
		// the upstream's authorization server, so none of it is relayed.
		rec.Outcome = http.StatusText(status)
		pt.logger.Warn("upstream refused the gateway's credentials", "upstream", pt.name, "route", pt.route, "status", status)
		upstream.WriteRPCError(w, http.StatusBadGateway, ex.rpcID, message.CodeUpstream,
			fmt.Sprintf("the upstream MCP server %q refused the gateway's credentials for it (HTTP %d); your own token is fine: ask the operator to check the credentials configured for this upstream", pt.name, status))
		return true
	case status >= 300 && status < 400:
		// pinnedfetch follows the redirects it allows; one that reaches
		// here had no usable Location.
		rec.Outcome, rec.Detail = upstream.OutcomeError, fmt.Sprintf("upstream answered %d without a usable Location", status)
		upstream.WriteRPCError(w, http.StatusBadGateway, ex.rpcID, message.CodeUpstream,
			fmt.Sprintf("the upstream MCP server %q answered with a redirect the gateway cannot follow; ask the operator to configure its final URL", pt.name))
		return true
	}
	return false
}

// overLimit answers a request whose answer broke a limit before any of it
// went out: a tool error for a tools/call, else a JSON-RPC error, both
// naming the upstream and the limit. The upstream session is dropped.
func (pt *PassThrough) overLimit(w http.ResponseWriter, rec *upstream.CallRecord, ex exchange, upstreamSID string, err error) {
	rec.Outcome, rec.Detail = upstream.OutcomeError, err.Error()
	pt.logger.Warn("upstream answer over its limit; dropping the upstream session", "upstream", pt.name, "route", pt.route, "error", rec.Detail)
	pt.drop(upstreamSID)
	if ex.method == "tools/call" && len(ex.rpcID) > 0 {
		writeToolError(w, ex.rpcID, upstream.LimitMessage(err))
		return
	}
	upstream.WriteRPCError(w, http.StatusBadGateway, ex.rpcID, message.CodeUpstream, upstream.LimitMessage(err))
}

// maxDropped bounds the upstream sessions remembered as dropped.
const maxDropped = 4096

// drop marks the upstream session sid as dropped after an answer of it
// broke a limit. The client's next request on it gets 404, which tells it
// to initialize again, and the gateway then ends the session upstream
// (DELETE). Not at once: the client may still be reading the events that
// came before the error, and a client such as go-sdk's takes its GET
// stream ending for the end of the whole session, failing the call whose
// error it had not read yet.
func (pt *PassThrough) drop(sid string) {
	if sid == "" {
		return
	}
	pt.droppedMu.Lock()
	defer pt.droppedMu.Unlock()
	if pt.dropped == nil || len(pt.dropped) >= maxDropped {
		// Forgetting is safe: the session then lives until the
		// upstream's own timeout, as any session a client abandons.
		pt.dropped = map[string]bool{}
	}
	pt.dropped[sid] = true
}

// takeDropped reports whether sid was dropped, and forgets it.
func (pt *PassThrough) takeDropped(sid string) bool {
	pt.droppedMu.Lock()
	defer pt.droppedMu.Unlock()
	if !pt.dropped[sid] {
		return false
	}
	delete(pt.dropped, sid)
	return true
}

// endUpstreamSession ends the upstream session sid (DELETE), in the
// background, bounded by the header timeout.
func (pt *PassThrough) endUpstreamSession(sid string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), pt.headerTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, pt.endpoint, nil)
		if err != nil {
			return
		}
		req.Header.Set(upstream.HeaderSessionID, sid)
		resp, err := pt.client.Do(req)
		if err != nil {
			return
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()
}
