package aggregate

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Tasks (MCP 2026-07-28's Tasks extension, SEP-2663) on the aggregated
// route, with [Options.Tasks] set.
//
// The edge binds every task handle to the token, the route and the
// upstream that holds the task (package edge): a client names a task by a
// handle, and the edge opens it, puts the upstream's id in the request and
// names the upstream in its context ([taskid.WithUpstream]). The route then:
//
//   - offers the extension in server/discover and initialize when an
//     upstream offers it;
//   - sends a tools/call that declares the extension on the 2026-07-28 fast
//     path (connecting the token's principal session first if need be),
//     which passes a CreateTaskResult on as the upstream wrote it, for the
//     edge to seal;
//   - sends tasks/get, tasks/update and tasks/cancel to the upstream the
//     context names, as one POST with the client's params (and the
//     upstream's id, in Mcp-Name too), and passes the answer on;
//   - removes the extension from the client capabilities of every call it
//     makes through go-sdk (an upstream it reaches over stdio or SSE, or at
//     2025-11-25), whose client reads no CreateTaskResult: the upstream
//     then answers as it does to a client without tasks.
//
// Without the option, no call carries the extension upstream.

// serveTask serves a 2026-07-28 task method on the upstream the context
// names and reports true, or reports false and leaves r to go-sdk (which
// does not know the method).
func (a *Aggregate) serveTask(w http.ResponseWriter, r *http.Request) bool {
	if !a.tasks || r.Method != http.MethodPost || !fastModernHeaders(r) {
		return false
	}
	b, ok := message.FromContext(r.Context())
	if !ok || b == nil || b.Batch || len(b.Calls) != 1 || !message.IsTaskMethod(b.Calls[0].Method) || b.Calls[0].ID.IsZero() {
		return false
	}
	call := b.Calls[0]
	p, _ := policy.PrincipalFrom(r.Context())
	name, named := taskid.UpstreamFrom(r.Context())
	up := a.byName[name]
	if !named || up == nil || up.cfg.Transport != upstream.TransportHTTP || call.TaskIDRaw == nil {
		upstream.WriteRPCError(w, http.StatusBadRequest, call.ID.Raw(), message.CodeInvalidParams,
			call.Method+" needs params.taskId: the id of a task this endpoint gave, from the CreateTaskResult of a tools/call")
		return true
	}
	out := make([]byte, 0, len(call.Params)+len(call.ID.Raw())+64)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, call.ID.Raw()...)
	out = append(out, `,"method":`...)
	out, _ = appendJSON(out, call.Method)
	out = append(out, `,"params":`...)
	out = append(out, call.Params...)
	out = append(out, '}')
	hdr := http.Header{"Mcp-Method": {call.Method}, "Mcp-Name": {call.TaskID}}

	start := time.Now()
	rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: call.Method, TokenID: p.TokenID, TokenName: p.Name, ClientIP: upstream.ClientIP(r.Header)}
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		rec.TokenID, rec.TokenName = tokenInfoPrincipal(ti)
	}
	fw := &fastWriter{w: w}
	res, rpcErr, err := a.modernExchange(r.Context(), up, hdr, out, call.ID, fw)
	switch {
	case err == nil && rpcErr != nil:
		var e jsonrpc.Error
		_ = json.Unmarshal(rpcErr, &e)
		rec.Outcome, rec.Detail = upstream.OutcomeError, upstream.SafeError(&e)
		fw.respond(call.ID.Raw(), "error", rpcErr)
	case err == nil:
		rec.Outcome = upstream.OutcomeOK
		fw.respond(call.ID.Raw(), "result", res)
	case r.Context().Err() != nil:
		rec.Outcome = upstream.OutcomeCanceled
		fw.end()
	default:
		rec.Outcome, rec.Detail = upstream.OutcomeError, upstream.SafeError(err)
		e := &jsonrpc.Error{Code: message.CodeUpstream, Message: "the upstream MCP server " + quote(up.cfg.Name) + " could not be reached: " + upstream.SafeError(err) + "; try again later"}
		data, _ := json.Marshal(e)
		fw.respond(call.ID.Raw(), "error", data)
	}
	a.record(rec, start)
	return true
}

// appendJSON appends v encoded.
func appendJSON(out []byte, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	return append(out, data...), err
}

func quote(s string) string {
	q, _ := json.Marshal(s)
	return string(q)
}

// taskDeclaringCall prepares the fast path for a tools/call that declares
// the extension: the token's principal session to the tool's upstream is
// connected first, as the go-sdk path would connect it, since only the
// fast path carries a CreateTaskResult back.
func (a *Aggregate) taskDeclaringCall(ctx context.Context, tool string) {
	a.mu.Lock()
	q, ok := a.tools[tool]
	a.mu.Unlock()
	if !ok {
		return
	}
	up := a.byName[q.Server]
	if up == nil || up.shared || up.cfg.Transport != upstream.TransportHTTP {
		return
	}
	s, done, err := a.principalSession(ctx)
	if err != nil {
		return
	}
	defer done()
	_, _ = a.connOf(ctx, s, up)
}

// isCreateTask reports whether a tools/call result is a CreateTaskResult.
func isCreateTask(raw json.RawMessage) bool {
	var head struct {
		ResultType string `json:"resultType"`
	}
	return json.Unmarshal(raw, &head) == nil && head.ResultType == "task"
}

// offerTasks adds the extension to caps when the route binds tasks and an
// upstream whose catalog is connected offers it. caps is the server's copy
// for one answer.
func (a *Aggregate) offerTasks(caps *mcp.ServerCapabilities) {
	if !a.tasks || caps == nil {
		return
	}
	for _, up := range a.ups {
		up.mu.Lock()
		cs := up.catalog
		up.mu.Unlock()
		if cs == nil {
			continue
		}
		if ir := cs.InitializeResult(); ir != nil && ir.Capabilities != nil {
			if _, ok := ir.Capabilities.Extensions[message.TasksExtension]; ok {
				caps.Extensions = maps.Clone(caps.Extensions)
				if caps.Extensions == nil {
					caps.Extensions = map[string]any{}
				}
				caps.Extensions[message.TasksExtension] = map[string]any{}
				return
			}
		}
	}
}

// declaresTasks reports whether client capabilities, as go-sdk decoded
// them from a request's _meta, name the Tasks extension.
func declaresTasks(caps any) bool {
	c, _ := caps.(map[string]any)
	ext, _ := c["extensions"].(map[string]any)
	_, ok := ext[message.TasksExtension]
	return ok
}

// withoutTasks returns client capabilities, as go-sdk decoded them from a
// request's _meta, without the Tasks extension: what the go-sdk path
// forwards. caps itself is not modified.
func withoutTasks(caps any) any {
	if !declaresTasks(caps) {
		return caps
	}
	c := caps.(map[string]any)
	out := maps.Clone(c)
	ext := maps.Clone(c["extensions"].(map[string]any))
	delete(ext, message.TasksExtension)
	out["extensions"] = ext
	return out
}
