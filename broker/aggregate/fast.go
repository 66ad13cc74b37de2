package aggregate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/sse"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The tools/call fast path of the aggregated route.
//
// Through go-sdk, a tools/call crosses four codecs: the downstream server
// session decodes the request, the upstream client session encodes it
// again, decodes the upstream's answer into an mcp.CallToolResult, and
// the server session encodes that once more. go-sdk's decoder allocates a
// 32 KiB buffer for every message it reads (and reads each one several
// times), so on a busy route the codecs and the garbage they leave cost
// most of the route's CPU time.
//
// The fast path forwards a downstream tools/call as JSON bytes instead: it
// rewrites the tool's name (and the request id, so that it cannot collide
// with the ids of the broker's own client session) and POSTs it on the
// downstream session's own upstream session, with that session's id and
// protocol version, through the same pinned, origin-guarded egress client.
// It decodes only what it must: the request's envelope and params, the
// answer's envelope, and the type of each content block. A result with
// blocks other than text goes through the same decoding and
// [upstream.NormalizeContent] as the go-sdk path; text-only results pass as the
// upstream wrote them.
//
// It takes a request only when nothing of the go-sdk path is missed:
//
//   - a single JSON-RPC request (no batch) for tools/call, on a session
//     that this route has initialized, bound to this token, with headers
//     that go-sdk would accept (Content-Type, Accept, a supported
//     Mcp-Protocol-Version, a loopback Host on a loopback listener);
//   - a tool registered on the route (the allow/deny lists apply at
//     registration), of a streamable-HTTP upstream that is not a shared
//     stdio process;
//   - a downstream client that offers neither sampling nor elicitation, so
//     that the upstream cannot need one of those requests forwarded to it
//     (its session was opened without those capabilities); the upstream's
//     ping is answered, and its roots/list gets the downstream client's
//     roots, as on the go-sdk path (see relayMiddleware);
//   - no multi-round-trip fields (inputResponses, requestState).
//
// Everything else goes to go-sdk unchanged, as does the first call of a
// session to an upstream whose connection failed. What the go-sdk path
// does, the fast path does too: the audit [CallRecord], tool errors naming
// an unreachable upstream, the upstream's JSON-RPC errors passed on,
// forgetting a connection the upstream no longer knows (HTTP 404).
// Progress and log notifications that the upstream sends on the call's
// stream are relayed on the downstream request's stream (as SSE from the
// first one; a call without any is answered as application/json), logs
// filtered by the session's logging level. Cancellation: a downstream
// notifications/cancelled for a call in flight here is sent upstream for
// the upstream's id, and so is a downstream request that goes away before
// its answer, since nobody is left to receive it.

// fastIDs numbers the ids the fast path gives upstream requests; they are
// strings, and go-sdk's client numbers its own, so they cannot collide.
var fastIDs atomic.Uint64

// fastCall is a tools/call the fast path has in flight.
type fastCall struct {
	upID   string // the upstream request's id, as JSON
	up     *aggUpstream
	c      *aggConn
	cancel context.CancelFunc
	sent   atomic.Bool // notifications/cancelled went upstream
}

// fastRequest is the tools/call sent upstream: id, the upstream's tool
// name, and the downstream request's _meta and arguments (raw JSON that
// has been parsed already, or nil to leave them out), as go-sdk's client
// would send them.
func fastRequest(id []byte, name string, meta, args json.RawMessage) ([]byte, error) {
	quoted, err := json.Marshal(name)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 80+len(id)+len(quoted)+len(meta)+len(args))
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, id...)
	out = append(out, `,"method":"tools/call","params":{`...)
	if meta != nil {
		out = append(out, `"_meta":`...)
		out = append(out, meta...)
		out = append(out, ',')
	}
	out = append(out, `"name":`...)
	out = append(out, quoted...)
	if args != nil {
		out = append(out, `,"arguments":`...)
		out = append(out, args...)
	}
	return append(out, "}}"...), nil
}

// serveFast serves r on the fast path and reports true, or reports false
// and leaves r (its body restored) to go-sdk. sid is the request's session
// id, already checked against the token.
func (a *Aggregate) serveFast(w http.ResponseWriter, r *http.Request, sid string) bool {
	if r.Method != http.MethodPost || !fastHeaders(r) {
		return false
	}
	a.mu.Lock()
	s := a.byID[sid]
	a.mu.Unlock()
	if s == nil {
		return false
	}
	// The edge's one reading of the body; without the edge in front (a
	// test), the same reader's.
	b, ok := message.FromContext(r.Context())
	if !ok {
		body, read := a.peekBody(r)
		if !read {
			return false
		}
		var err error
		if b, err = message.Read(body); err != nil {
			return false
		}
	}
	if b.Batch || len(b.Calls) != 1 {
		return false
	}
	switch c := b.Calls[0]; c.Method {
	case "tools/call":
		return a.fastToolCall(w, r, s, c)
	case "notifications/cancelled":
		return a.fastCancel(w, s, c)
	}
	return false
}

// fastHeaders reports whether go-sdk would accept r's headers, so that the
// fast path answers only what go-sdk would have served.
func fastHeaders(r *http.Request) bool {
	switch r.Header.Get(upstream.HeaderProtocolVersion) {
	case "", "2025-11-25", "2025-06-18", "2025-03-26":
	default:
		return false
	}
	return fastTransportHeaders(r)
}

// fastTransportHeaders reports whether go-sdk would accept r's
// Content-Type, Accept and Host.
func fastTransportHeaders(r *http.Request) bool {
	if mt, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";"); !strings.EqualFold(strings.TrimSpace(mt), "application/json") {
		return false
	}
	if !acceptsBoth(r.Header.Values("Accept")) {
		return false
	}
	// go-sdk's DNS rebinding protection: a loopback listener serves only a
	// loopback Host.
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la != nil {
		if pinnedfetch.IsLoopbackSocket(la) && !policy.HostIsLoopback(r.Host) {
			return false
		}
	}
	return true
}

// acceptsBoth reports whether Accept values take both application/json and
// text/event-stream (or wildcards that cover them).
func acceptsBoth(values []string) bool {
	jsonOK, sseOK := false, false
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, _ := strings.Cut(part, ";")
			switch strings.ToLower(strings.TrimSpace(mt)) {
			case "application/json":
				jsonOK = true
			case "text/event-stream":
				sseOK = true
			case "*/*":
				jsonOK, sseOK = true, true
			case "application/*":
				jsonOK = true
			case "text/*":
				sseOK = true
			}
		}
	}
	return jsonOK && sseOK
}

// peekBody reads r's body (bounded like go-sdk's) and puts it back for
// go-sdk, which reads it when the fast path declines.
func (a *Aggregate) peekBody(r *http.Request) ([]byte, bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false
	}
	limit := a.maxBody
	if limit <= 0 {
		limit = upstream.DefaultMaxBody
	}
	if r.ContentLength > limit {
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	rest := r.Body
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), errReader{err}, rest), rest}
	if err != nil || int64(len(body)) > limit {
		return nil, false
	}
	return body, true
}

// errReader replays a read error after the bytes read before it.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}

// fastToolCall serves a tools/call, or reports false when it is not one
// the fast path takes.
func (a *Aggregate) fastToolCall(w http.ResponseWriter, r *http.Request, s *aggSession, call message.Call) bool {
	if call.ID.IsZero() || call.InputResponses {
		return false
	}
	callID := call.ID.Raw()
	if ip := s.ss.InitializeParams(); ip == nil || ip.Capabilities == nil ||
		//lint:ignore SA1019 SEP-2577 deprecates sampling, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		ip.Capabilities.Sampling != nil || ip.Capabilities.Elicitation != nil {
		return false
	}
	adm, ok := a.admitFast(s, call.Tool, false)
	if !ok {
		return false
	}
	q, up, c, ir := adm.q, adm.up, adm.c, adm.ir
	sessionID := c.cs.ID()

	start := time.Now()
	rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: "tools/call", Tool: q.Name}
	var extra *mcp.RequestExtra
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		extra = &mcp.RequestExtra{TokenInfo: ti}
	}
	rec.TokenID, rec.TokenName = a.principal(r.Context(), s.ss, extra)
	rec.ClientIP = upstream.ClientIP(r.Header)

	upID := strconv.AppendQuote(make([]byte, 0, 24), "zidane-"+strconv.FormatUint(fastIDs.Add(1), 10))
	out, err := fastRequest(upID, q.Name, nullToNil(call.Meta), nullToNil(call.Arguments))
	if err != nil {
		return false
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	fc := &fastCall{upID: string(upID), up: up, c: c, cancel: cancel}
	untrack, ok := s.trackFast(call.ID.Key(), fc)
	if !ok {
		return false // go-sdk answers a duplicate id
	}
	defer untrack()

	fw := &fastWriter{w: w}
	upMsgID, err := message.ParseID(upID)
	if err != nil {
		return false
	}
	res, rpcErr, err := a.fastExchange(ctx, s, up, c, sessionID, ir.ProtocolVersion, out, upMsgID, fw)
	switch {
	case err == nil && rpcErr != nil:
		var e jsonrpc.Error
		_ = json.Unmarshal(rpcErr, &e)
		rec.Outcome, rec.Detail = upstream.OutcomeError, upstream.SafeError(&e)
		a.record(rec, start)
		fw.respond(callID, "error", rpcErr)
	case err == nil:
		res, isError, nerr := normalizeFastResult(res)
		if nerr != nil {
			rec.Outcome, rec.Detail = upstream.OutcomeError, upstream.SafeError(nerr)
			a.record(rec, start)
			fw.respondTool(callID, a.unreachable(up, nerr))
			break
		}
		rec.Outcome = upstream.OutcomeOK
		if isError {
			rec.Outcome, rec.Detail = upstream.OutcomeError, "the tool reported an error"
		}
		a.record(rec, start)
		fw.respond(callID, "result", res)
	case ctx.Err() != nil:
		// Cancelled by the client (notifications/cancelled, or its request
		// went away): the upstream is told, and no answer is sent.
		rec.Outcome = upstream.OutcomeCanceled
		a.record(rec, start)
		a.fastCancelUpstream(fc, sessionID, ir.ProtocolVersion, "the client cancelled the request")
		fw.end()
	default:
		rec.Outcome, rec.Detail = upstream.OutcomeError, upstream.SafeError(err)
		a.record(rec, start)
		if answerlimit.Exceeded(err) {
			// The upstream session is dropped: the next call opens another.
			s.forget(up.cfg.Name, c)
			go c.cs.Close()
			fw.respondTool(callID, overLimitResult(err))
			break
		}
		if errors.Is(err, mcp.ErrSessionMissing) {
			s.forget(up.cfg.Name, c)
			go c.cs.Close()
		}
		fw.respondTool(callID, a.unreachable(up, err))
	}
	return true
}

// trackFast registers fc as the fast call of the client's request id key,
// so that its cancellation finds it, until untrack; ok is false, and
// nothing registered, when a call of that id is in flight.
func (s *aggSession) trackFast(key string, fc *fastCall) (untrack func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fast == nil {
		s.fast = map[string]*fastCall{}
	}
	if _, dup := s.fast[key]; dup {
		return nil, false
	}
	s.fast[key] = fc
	return func() {
		s.mu.Lock()
		if s.fast[key] == fc {
			delete(s.fast, key)
		}
		s.mu.Unlock()
	}, true
}

// nullToNil drops an absent or null raw value, so that it is omitted.
func nullToNil(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	return raw
}

// fastExchange sends the request out on the upstream session and returns
// its answer: the raw result, or the raw JSON-RPC error object, or an
// error when the upstream could not be used. Notifications that come on
// the call's stream are relayed through fw, and the upstream's requests
// answered.
func (a *Aggregate) fastExchange(ctx context.Context, s *aggSession, up *aggUpstream, c *aggConn, sessionID, version string, out []byte, upID message.ID, fw *fastWriter) (result, rpcErr json.RawMessage, err error) {
	resp, err := a.fastPost(ctx, up, sessionID, version, out)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil, fmt.Errorf("the upstream no longer knows the session (HTTP 404): %w", mcp.ErrSessionMissing)
	}
	return readAnswer(resp, upID, func(body io.Reader) (json.RawMessage, json.RawMessage, error) {
		return a.fastStream(ctx, s, up, sessionID, version, body, upID, fw)
	})
}

// readAnswer reads a fast path's answer to the call upID, after the
// status each path decides on itself: a JSON-RPC error in a failed
// answer, a JSON answer, or an event stream, which stream reads.
func readAnswer(resp *http.Response, upID message.ID, stream func(io.Reader) (result, rpcErr json.RawMessage, err error)) (result, rpcErr json.RawMessage, err error) {
	mt, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	switch {
	case resp.StatusCode < 200 || resp.StatusCode >= 300:
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if rpcErr := errorAnswer(data); rpcErr != nil {
			return nil, rpcErr, nil
		}
		return nil, nil, fmt.Errorf("the upstream answered HTTP %d", resp.StatusCode)
	case mt == "application/json":
		// The body fails past max_response (see answerlimit.Transport).
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, nil, err
		}
		return fastAnswer(data, upID)
	case mt == "text/event-stream":
		return stream(resp.Body)
	}
	return nil, nil, fmt.Errorf("the upstream answered with content type %q", mt)
}

// fastPost POSTs one JSON-RPC message on the upstream session.
func (a *Aggregate) fastPost(ctx context.Context, up *aggUpstream, sessionID, version string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(fastRead(ctx), http.MethodPost, up.tr.Expanded.URL, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Accept"] = []string{"application/json, text/event-stream"}
	req.Header[upstream.HeaderSessionID] = []string{sessionID}
	req.Header[upstream.HeaderProtocolVersion] = []string{version}
	resp, err := up.tr.HTTP.Do(req)
	if err != nil {
		if r := up.tr.Refusal(); r != nil {
			return nil, r
		}
		return nil, err
	}
	return resp, nil
}

// errorAnswer is the JSON-RPC error of an upstream's answer with a failure
// status, which is the answer, as go-sdk takes it; nil when it holds none.
// Its id is often null: the server could not read the request's.
func errorAnswer(data []byte) json.RawMessage {
	if b, err := message.ReadAnswer(data); err == nil && !b.Batch && b.Calls[0].Error != nil {
		return b.Calls[0].Error
	}
	return nil
}

// fastAnswer reads the upstream's answer to the request upID, with the
// reader the edge uses: an answer two readers could read differently is
// refused, and ids compare as values.
func fastAnswer(data []byte, upID message.ID) (result, rpcErr json.RawMessage, err error) {
	b, err := message.ReadAnswer(data)
	if err != nil {
		return nil, nil, fmt.Errorf("the upstream's answer could not be read: %w", err)
	}
	c := b.Calls[0]
	if b.Batch || !c.IsResponse() || c.ID.Key() != upID.Key() {
		return nil, nil, errors.New("the upstream answered another request than the one sent")
	}
	return answerOf(c)
}

// answerOf is the result or error of an answer.
func answerOf(c message.Call) (result, rpcErr json.RawMessage, err error) {
	if c.Error != nil && string(c.Error) != "null" {
		return nil, c.Error, nil
	}
	if c.Result == nil {
		return nil, nil, errors.New("the upstream's answer has neither result nor error")
	}
	return c.Result, nil, nil
}

// fastStream reads the upstream's event stream for the request upID until
// its answer: notifications are relayed downstream, requests answered.
func (a *Aggregate) fastStream(ctx context.Context, s *aggSession, up *aggUpstream, sessionID, version string, body io.Reader, upID message.ID, fw *fastWriter) (result, rpcErr json.RawMessage, err error) {
	return readStream(ctx, up, body, upID, func(event []byte, env message.Call) {
		switch {
		case !env.IsResponse() && !env.ID.IsZero():
			go a.fastAnswerUpstream(ctx, s, up, sessionID, version, env)
		case env.Method == "notifications/progress":
			fw.event(event)
		case env.Method == "notifications/message":
			if s.logs(env.Params) {
				fw.event(event)
			}
		}
	})
}

// readStream reads an upstream's event stream, one whole event at a time,
// until the answer to id, and hands every other message to other: the one
// reader of both fast paths' streams. It reads events as a client does
// (see internal/sse).
func readStream(ctx context.Context, up *aggUpstream, body io.Reader, id message.ID, other func(event []byte, env message.Call)) (result, rpcErr json.RawMessage, err error) {
	// The body fails past max_response (see answerlimit.Transport) before an event
	// could reach the reader's own bound.
	bound := int(up.tr.LimitMax())
	if bound > 0 {
		bound++
	}
	r := sse.NewReader(body, bound)
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		event, ok := ev.Message()
		if !ok || len(event) == 0 {
			continue
		}
		b, err := message.ReadAnswer(event)
		if err != nil || b.Batch {
			continue
		}
		env := b.Calls[0]
		if env.IsResponse() && env.ID.Key() == id.Key() {
			return answerOf(env)
		}
		other(event, env)
	}
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	return nil, nil, errors.New("the upstream ended its stream without answering")
}

// fastAnswerUpstream answers a request the upstream sent on a call's
// stream, as the broker's go-sdk client answers it for a session opened
// without sampling and elicitation: ping; roots/list with the downstream
// client's roots when it offers roots, else none; "method not found" for
// the rest.
func (a *Aggregate) fastAnswerUpstream(ctx context.Context, s *aggSession, up *aggUpstream, sessionID, version string, req message.Call) {
	type answer struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  any             `json:"result,omitempty"`
		Error   *jsonrpc.Error  `json:"error,omitempty"`
	}
	ans := answer{JSONRPC: "2.0", ID: req.ID.Raw()}
	switch req.Method {
	case "ping":
		ans.Result = struct{}{}
	case "roots/list":
		ans.Result = map[string]any{"roots": []any{}}
		//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		if ip := s.ss.InitializeParams(); ip != nil && ip.Capabilities != nil && ip.Capabilities.RootsV2 != nil {
			rctx, cancel := context.WithTimeout(ctx, up.timeout)
			//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
			res, err := s.ss.ListRoots(rctx, &mcp.ListRootsParams{})
			cancel()
			if err != nil {
				ans.Result = nil
				ans.Error = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the client's roots could not be listed: " + err.Error()}
			} else {
				ans.Result = res
			}
		}
	default:
		ans.Error = &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("method %q is not offered to this upstream", req.Method)}
	}
	data, err := json.Marshal(ans)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(a.ctx, up.timeout)
	defer cancel()
	if resp, err := a.fastPost(ctx, up, sessionID, version, data); err == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}
}

// fastCancelUpstream tells the upstream that the call fc is cancelled,
// once, in the background.
func (a *Aggregate) fastCancelUpstream(fc *fastCall, sessionID, version, reason string) {
	if !fc.sent.CompareAndSwap(false, true) {
		return
	}
	data, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled",
		"params": map[string]any{"requestId": json.RawMessage(fc.upID), "reason": reason}})
	if err != nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(a.ctx, fc.up.timeout)
		defer cancel()
		if resp, err := a.fastPost(ctx, fc.up, sessionID, version, data); err == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
	}()
}

// fastCancel takes a downstream notifications/cancelled for a call in
// flight on the fast path: it goes upstream for the upstream's id, and the
// call ends without an answer. Other cancellations go to go-sdk.
func (a *Aggregate) fastCancel(w http.ResponseWriter, s *aggSession, c message.Call) bool {
	if !c.ID.IsZero() || c.Cancelled.IsZero() {
		return false
	}
	s.mu.Lock()
	fc := s.fast[c.Cancelled.Key()]
	s.mu.Unlock()
	if fc == nil {
		return false
	}
	if ir := fc.c.cs.InitializeResult(); ir != nil {
		a.fastCancelUpstream(fc, fc.c.cs.ID(), ir.ProtocolVersion, "the client cancelled the request")
	}
	fc.cancel()
	w.WriteHeader(http.StatusAccepted)
	return true
}

// logs reports whether a notifications/message with these params passes
// the session's logging level, as go-sdk's ServerSession.Log decides.
func (s *aggSession) logs(params json.RawMessage) bool {
	s.mu.Lock()
	level := s.level
	s.mu.Unlock()
	if level == "" {
		return false
	}
	var p struct {
		//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		Level mcp.LoggingLevel `json:"level"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	return logSeverity(p.Level) >= logSeverity(level)
}

// logSeverity orders MCP logging levels (RFC 5424's, least severe first).
//
//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
func logSeverity(l mcp.LoggingLevel) int {
	switch l {
	case "debug":
		return 0
	case "info":
		return 1
	case "notice":
		return 2
	case "warning":
		return 3
	case "error":
		return 4
	case "critical":
		return 5
	case "alert":
		return 6
	case "emergency":
		return 7
	}
	return -1
}

// normalizeFastResult returns a tools/call result as the go-sdk path
// would pass it: a result whose blocks are all text as it came (with an
// empty content list when it had none), any other through go-sdk's decoding
// and [upstream.NormalizeContent]. It also says whether the tool reported an error.
func normalizeFastResult(raw json.RawMessage) (json.RawMessage, bool, error) {
	if textOnly, isError, ok := scanTextResult(raw); ok && textOnly {
		return raw, isError, nil
	}
	// One pass reads what decides: every block's type (decoded as
	// go-sdk decodes it) and isError. Anything unexpected (no content
	// list, a block that is not an object) takes the go-sdk path below,
	// which reports it.
	var head struct {
		Content *[]struct {
			Type string `json:"type"`
		} `json:"content"`
		IsError bool `json:"isError"`
	}
	if err := json.Unmarshal(raw, &head); err == nil && head.Content != nil {
		textOnly := true
		for _, b := range *head.Content {
			if b.Type != "text" {
				textOnly = false
				break
			}
		}
		if textOnly {
			return raw, head.IsError, nil
		}
	}
	// The go-sdk path's decoding and normalization.
	var res mcp.CallToolResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, false, fmt.Errorf("decoding the upstream's result: %w", err)
	}
	res.Content = upstream.NormalizeContent(res.Content)
	data, err := json.Marshal(&res)
	if err != nil {
		return nil, false, err
	}
	return data, res.IsError, nil
}

// fastWriter writes the downstream answer of a fast call: one
// application/json response, or, once a notification has to go first, an
// event stream.
type fastWriter struct {
	w       http.ResponseWriter
	started bool // the event stream's headers went out
	done    bool
}

func (f *fastWriter) headers(contentType string) {
	h := f.w.Header()
	h["Content-Type"] = []string{contentType}
	h["Cache-Control"] = []string{"no-cache, no-transform"}
}

// event relays one message as an SSE event.
func (f *fastWriter) event(data []byte) {
	if f.done {
		return
	}
	if !f.started {
		f.headers("text/event-stream")
		f.w.WriteHeader(http.StatusOK)
		f.started = true
	}
	if bytes.ContainsAny(data, "\r\n") {
		// An event's data is one line: JSON has line breaks only between
		// tokens, which compacting drops.
		var b bytes.Buffer
		if json.Compact(&b, data) != nil {
			return
		}
		data = b.Bytes()
	}
	buf := make([]byte, 0, len(data)+24)
	buf = append(buf, "event: message\ndata: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	f.w.Write(buf)
	_ = http.NewResponseController(f.w).Flush()
}

// respond writes the response to the downstream request id: kind is
// "result" or "error", value its raw JSON.
func (f *fastWriter) respond(id json.RawMessage, kind string, value json.RawMessage) {
	f.respondStatus(id, kind, value, http.StatusOK)
}

// respondStatus is respond with the HTTP status of an answer that is no
// event stream; one whose stream went out (its status with it) ends with
// the answer as its last event.
func (f *fastWriter) respondStatus(id json.RawMessage, kind string, value json.RawMessage, status int) {
	buf := make([]byte, 0, len(value)+len(id)+40)
	buf = append(buf, `{"jsonrpc":"2.0","id":`...)
	buf = append(buf, id...)
	buf = append(buf, `,"`...)
	buf = append(buf, kind...)
	buf = append(buf, `":`...)
	buf = append(buf, value...)
	buf = append(buf, '}')
	if f.started {
		f.event(buf)
		f.done = true
		return
	}
	f.headers("application/json")
	f.w.Header()["Content-Length"] = []string{strconv.Itoa(len(buf))}
	f.w.WriteHeader(status)
	f.w.Write(buf)
	f.done = true
}

// respondTool writes a tool result of the broker's own.
func (f *fastWriter) respondTool(id json.RawMessage, res *mcp.CallToolResult) {
	data, err := json.Marshal(res)
	if err != nil {
		data = []byte(`{"content":[],"isError":true}`)
	}
	f.respond(id, "result", data)
}

// end finishes a call that gets no answer: an event stream with no events,
// which a client reads as a stream that ended (it abandoned the call).
func (f *fastWriter) end() {
	if !f.started && !f.done {
		f.headers("text/event-stream")
		f.w.WriteHeader(http.StatusOK)
	}
	f.done = true
}
