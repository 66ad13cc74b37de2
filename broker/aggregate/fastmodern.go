package aggregate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/jsonscan"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The 2026-07-28 tools/call fast path of the aggregated route.
//
// A 2026-07-28 client's tools/call otherwise crosses go-sdk's stateless
// handler (a temporary server session per POST) and the token's principal
// session to the upstream: four codecs and two sessions per call. When the
// upstream speaks 2026-07-28 too, the call is one stateless POST upstream,
// so the fast path sends it as the pass-through route would, changing only
// what the aggregate must:
//
//   - params.name becomes the upstream's own tool name, and the Mcp-Name
//     header with it;
//   - the rest of params (_meta, arguments, inputResponses, requestState)
//     and the JSON-RPC id pass as the client sent them (the upstream POST
//     carries this one request, so its id cannot collide with another);
//   - the headers sent are Content-Type, Accept, MCP-Protocol-Version,
//     Mcp-Method, Mcp-Name and the client's Mcp-Param-* headers (the
//     arguments are unchanged, so headers the edge checked against them
//     stay valid for the upstream tool), and no other header of the client;
//     the credentials are those of the upstream's egress client.
//
// The answer (JSON, or an event stream whose progress notifications are
// relayed) goes through max_response and the answer budget; its result is
// passed as the upstream wrote it when its content blocks are all text or it
// is an input-required result, and otherwise decoded and normalized as on
// the go-sdk path ([upstream.NormalizeContent]). Tool errors naming the upstream, the
// audit record and the upstream's JSON-RPC errors (with the HTTP status
// SEP-2575 gives their code) are as on the go-sdk path.
//
// It takes a request only when the edge's reading of the body is in the
// context (message.FromContext), it is a single tools/call (no batch) with
// the headers go-sdk would accept, whose params hold nothing but _meta,
// name, arguments, inputResponses and requestState, for a tool registered on
// the route of a streamable-HTTP upstream (not a shared stdio process) that
// the token's principal session is already connected to at 2026-07-28.
// Anything else goes to go-sdk, before anything is sent upstream.

// modernFastParams are the params keys the fast path passes on.
var modernFastParams = map[string]bool{"_meta": true, "name": true, "arguments": true, "inputResponses": true, "requestState": true}

// serveModernFast serves r, a 2026-07-28 request, on the fast path and
// reports true, or reports false and leaves r untouched for go-sdk.
func (a *Aggregate) serveModernFast(w http.ResponseWriter, r *http.Request) bool {
	if a.noModernFast.Load() || r.Method != http.MethodPost || !fastModernHeaders(r) {
		return false
	}
	b, ok := message.FromContext(r.Context())
	if !ok || b == nil || b.Batch || len(b.Calls) != 1 {
		return false
	}
	call := b.Calls[0]
	if call.Method != "tools/call" || call.ID.IsZero() || call.Tool == "" ||
		r.Header.Get("Mcp-Method") != "tools/call" || r.Header.Get("Mcp-Name") != call.Tool {
		return false
	}
	p, ok := policy.PrincipalFrom(r.Context())
	if !ok || p.TokenID == "" {
		return false
	}
	if call.DeclaresTasks {
		if !a.tasks {
			// go-sdk's path, which forwards no Tasks extension.
			return false
		}
		a.taskDeclaringCall(r.Context(), call.Tool)
	}
	a.mu.Lock()
	s := a.principals[p.TokenID]
	a.mu.Unlock()
	adm, ok := a.admitFast(s, call.Tool, true)
	if !ok {
		return false
	}
	q, up, c := adm.q, adm.up, adm.c
	out, ok := modernCallBody(call, q.Name)
	if !ok {
		return false
	}

	// From here on the call is the fast path's.
	a.modernFastCalls.Add(1)
	done := a.pidle.Use(s.idleKey, p.TokenID)
	defer done()
	start := time.Now()
	rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: "tools/call", Tool: q.Name}
	rec.TokenID, rec.TokenName = modernCaller(r, p)
	rec.ClientIP = upstream.ClientIP(r.Header)
	callID := call.ID.Raw()
	fw := &fastWriter{w: w}
	ctx := r.Context()
	res, rpcErr, err := a.modernExchange(ctx, up, modernCallHeaders(r, q.Name), out, call.ID, fw)
	switch {
	case err == nil && rpcErr != nil:
		var e jsonrpc.Error
		_ = json.Unmarshal(rpcErr, &e)
		rec.Outcome, rec.Detail = upstream.OutcomeError, upstream.SafeError(&e)
		a.record(rec, start)
		fw.respondStatus(callID, "error", rpcErr, modernErrorStatus(e.Code))
	case err == nil && call.DeclaresTasks && isCreateTask(res):
		// The task's id is the upstream's: the edge seals it.
		rec.Outcome = upstream.OutcomeOK
		a.record(rec, start)
		fw.respond(callID, "result", res)
	case err == nil:
		res, isError, nerr := normalizeModernResult(res)
		if nerr != nil {
			rec.Outcome, rec.Detail = upstream.OutcomeError, upstream.SafeError(nerr)
			a.record(rec, start)
			fw.respond(callID, "result", modernOwnResult(a.unreachable(up, nerr)))
			break
		}
		rec.Outcome = upstream.OutcomeOK
		if isError {
			rec.Outcome, rec.Detail = upstream.OutcomeError, "the tool reported an error"
		}
		a.record(rec, start)
		fw.respond(callID, "result", modernAnnotate(res))
	case ctx.Err() != nil:
		rec.Outcome = upstream.OutcomeCanceled
		a.record(rec, start)
		fw.end()
	default:
		rec.Outcome, rec.Detail = upstream.OutcomeError, upstream.SafeError(err)
		a.record(rec, start)
		if answerlimit.Exceeded(err) {
			// As on the go-sdk path: the next call opens another upstream
			// session.
			s.forget(up.cfg.Name, c)
			fw.respond(callID, "result", modernOwnResult(overLimitResult(err)))
			break
		}
		fw.respond(callID, "result", modernOwnResult(a.unreachable(up, err)))
	}
	return true
}

// modernCallBody is the tools/call the fast path sends upstream for call:
// its id and params as the client sent them, but for the tool's name
// upstream, or false when its params are not the fast path's (see
// renameParams).
func modernCallBody(call message.Call, name string) ([]byte, bool) {
	params, ok := renameParams(call.Params, name)
	if !ok {
		return nil, false
	}
	out := make([]byte, 0, len(params)+len(call.ID.Raw())+64)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, call.ID.Raw()...)
	out = append(out, `,"method":"tools/call","params":`...)
	out = append(out, params...)
	return append(out, '}'), true
}

// modernCallHeaders are the headers the fast path sends upstream for a
// call of the tool name: Mcp-Method, Mcp-Name and the client's
// Mcp-Param-* headers.
func modernCallHeaders(r *http.Request, name string) http.Header {
	hdr := http.Header{}
	hdr["Mcp-Method"] = []string{"tools/call"}
	hdr["Mcp-Name"] = []string{name}
	// In the one spelling the edge checks (it refuses the others).
	for k, v := range r.Header {
		if len(k) > len("Mcp-Param-") && strings.HasPrefix(k, "Mcp-Param-") {
			hdr[k] = v
		}
	}
	return hdr
}

// modernCaller is the token id and name a fast call's record carries, as
// principal decides them for a 2026-07-28 request's session.
func modernCaller(r *http.Request, p policy.Principal) (id, name string) {
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		return tokenInfoPrincipal(ti)
	}
	return p.TokenID, p.Name
}

// fastModernHeaders reports whether go-sdk's stateless handler would accept
// r's headers for a 2026-07-28 POST.
func fastModernHeaders(r *http.Request) bool {
	if r.Header.Get(upstream.HeaderProtocolVersion) != protocolModern || r.Header.Get(upstream.HeaderSessionID) != "" {
		return false
	}
	return fastTransportHeaders(r)
}

// renameParams returns a tools/call params object with name set to name
// and every other member as it was, or false when params holds a member the
// fast path does not pass on, a key that is not plain, or is not an object.
func renameParams(params []byte, name string) ([]byte, bool) {
	quoted, err := json.Marshal(name)
	if err != nil {
		return nil, false
	}
	out := make([]byte, 0, len(params)+len(quoted))
	out = append(out, '{')
	s := &jsonscan.Scanner{B: params}
	first, named := true, false
	ok := s.Object(func(key string) bool {
		if !modernFastParams[key] {
			return false
		}
		s.WS()
		from := s.I
		if !s.SkipValue(1) {
			return false
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = strconv.AppendQuote(out, key)
		out = append(out, ':')
		if key == "name" {
			named = true
			out = append(out, quoted...)
		} else {
			out = append(out, params[from:s.I]...)
		}
		return true
	}, true)
	if !ok || !named {
		return nil, false
	}
	s.WS()
	if s.I != len(params) {
		return nil, false
	}
	return append(out, '}'), true
}

// modernExchange POSTs the request upstream and returns its answer, as
// fastExchange does for a session.
func (a *Aggregate) modernExchange(ctx context.Context, up *aggUpstream, hdr http.Header, out []byte, id message.ID, fw *fastWriter) (result, rpcErr json.RawMessage, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.tr.Expanded.URL, bytes.NewReader(out))
	if err != nil {
		return nil, nil, err
	}
	req.Header = hdr
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Accept"] = []string{"application/json, text/event-stream"}
	req.Header[upstream.HeaderProtocolVersion] = []string{protocolModern}
	resp, err := up.tr.HTTP.Do(req)
	if err != nil {
		if r := up.tr.Refusal(); r != nil {
			return nil, nil, r
		}
		return nil, nil, err
	}
	defer resp.Body.Close()
	if transientStatus(resp.StatusCode) {
		// As go-sdk's client reports it, whatever the body: a JSON-RPC
		// error (-32005, "rejected by transport"), here naming the upstream.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil, rejectedError(up, resp.StatusCode), nil
	}
	return readAnswer(resp, id, func(body io.Reader) (json.RawMessage, json.RawMessage, error) {
		return modernStream(ctx, up, body, id, fw)
	})
}

// modernStream reads the upstream's event stream until the answer to id:
// progress notifications are relayed (their token is the client's own),
// log messages dropped (as the principal session drops them), anything
// else ignored.
func modernStream(ctx context.Context, up *aggUpstream, body io.Reader, id message.ID, fw *fastWriter) (result, rpcErr json.RawMessage, err error) {
	return readStream(ctx, up, body, id, func(event []byte, env message.Call) {
		if env.ID.IsZero() && env.Method == "notifications/progress" {
			fw.event(event)
		}
	})
}

// normalizeModernResult is normalizeFastResult, except that an
// input-required result passes as it came.
func normalizeModernResult(raw json.RawMessage) (json.RawMessage, bool, error) {
	if textOnly, isError, ok := scanTextResult(raw); ok && textOnly {
		return raw, isError, nil
	}
	var head struct {
		ResultType    string          `json:"resultType"`
		InputRequests json.RawMessage `json:"inputRequests"`
	}
	if err := json.Unmarshal(raw, &head); err == nil &&
		(head.ResultType == "input_required" || (len(head.InputRequests) > 0 && string(head.InputRequests) != "null")) {
		return raw, false, nil
	}
	return normalizeFastResult(raw)
}

// modernErrorStatus is the HTTP status SEP-2575 gives a 2026-07-28 error
// answer by its code, as go-sdk's server sends it (extractErrorStatus):
// 404 for a method not found; 400 for invalid params, an unsupported
// protocol version and a missing client capability; otherwise 200.
func modernErrorStatus(code int64) int {
	switch code {
	case message.CodeMethodNotFound:
		return http.StatusNotFound
	case message.CodeInvalidParams, message.CodeUnsupportedProtocolVersion, message.CodeMissingClientCapability:
		return http.StatusBadRequest
	}
	return http.StatusOK
}

// transientStatus is go-sdk's client's isTransientHTTPStatus: statuses it
// reports as a rejected request rather than a broken connection.
func transientStatus(code int) bool {
	switch code {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable,
		http.StatusGatewayTimeout, http.StatusTooManyRequests:
		return true
	}
	return false
}

// rejectedError is the JSON-RPC error of an upstream POST refused with a
// transient HTTP status (go-sdk's code for it).
func rejectedError(up *aggUpstream, code int) json.RawMessage {
	data, _ := json.Marshal(&jsonrpc.Error{Code: message.CodeTransportRejected, Message: fmt.Sprintf(
		"the upstream MCP server %q rejected the call: HTTP %d %s; try again later", up.cfg.Name, code, http.StatusText(code))})
	return data
}

var (
	serverInfoKey = []byte(`"` + mcp.MetaKeyServerInfo + `"`)
	resultTypeKey = []byte(`"resultType"`)
)

// modernAnnotate is a result as go-sdk's server sends it to a 2026-07-28
// client: with a resultType and the server's identity in _meta, the
// upstream's when it gave one (as go-sdk keeps it), else the route's. A
// result that has both keys somewhere passes as it is (an upstream that
// speaks 2026-07-28 sets both).
func modernAnnotate(raw json.RawMessage) json.RawMessage {
	if bytes.Contains(raw, serverInfoKey) && bytes.Contains(raw, resultTypeKey) {
		return raw
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return raw
	}
	return modernOwnResult(&res)
}

// modernOwnResult encodes res as go-sdk's server sends a result to a
// 2026-07-28 client (see modernAnnotate).
func modernOwnResult(res *mcp.CallToolResult) json.RawMessage {
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	if _, ok := res.Meta[mcp.MetaKeyServerInfo]; !ok {
		res.Meta[mcp.MetaKeyServerInfo] = aggImplementation
	}
	data, err := json.Marshal(res)
	if err != nil {
		return json.RawMessage(`{"content":[],"isError":true,"resultType":"complete"}`)
	}
	var head struct {
		ResultType *string `json:"resultType"`
	}
	if json.Unmarshal(data, &head) == nil && head.ResultType == nil && len(data) > 1 {
		kind := "complete"
		if res.InputRequests != nil {
			kind = "input_required"
		}
		data = append(data[:len(data)-1], `,"resultType":"`+kind+`"}`...)
	}
	return data
}
