package edge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Task handles (MCP 2026-07-28's Tasks extension, SEP-2663).
//
// An upstream may answer a tools/call with a task (a CreateTaskResult), and
// the client then names it by its id in tasks/get, tasks/update and
// tasks/cancel, and in a subscriptions/listen for its status. Every client
// of a route reaches the upstream with the gateway's one credential, so the
// upstream cannot tell one token's tasks from another's: the route binds
// them. The client never sees the upstream's task id, only a handle sealed
// to its token and the route ([taskid.Sealer]); a request's handle is
// opened before it goes on, and one that does not open for this token on
// this route is refused (-32602, what the extension answers for an
// unknown task), so the upstream only ever sees ids of the token's own
// tasks. Nothing is kept per task.
//
// Before that, [Decide] refuses, on a route that binds tasks, tasks/result
// and tasks/list (removed by SEP-2663; a list would show one token's tasks
// to another) with -32601, and a 2026-07-28 task method (or a listen for
// task status) of a request that does not declare the extension with
// -32021, as the extension has servers do.
//
// On the way back the listing filter, which reads every answer, seals the
// task id of a CreateTaskResult answering the request's tools/call, puts
// the client's own handle back where the upstream names the task the
// request named (a tasks/get answer, a task status notification on the
// listen stream, the listen's acknowledgement), and withholds an answer or
// notification that names any other task: the upstream's ids of other
// tokens' tasks never reach a client, sealed or not.
//
// Every route that reaches upstreams binds tasks here: the guard routes,
// the broker's pass-through, a session's egress and the aggregated route,
// whose handles also name the upstream that holds the task (the one that
// offers the tool the call named), where no client can change it; the
// request goes to that upstream (taskid.WithUpstream), if the token
// may still use it.

// offersTasks is a route that binds task handles: Decide refuses the
// extension's removed methods, and undeclared task methods, on it.
type offersTasks interface {
	bindsTasks() bool
}

// routeOffersTasks reports whether route binds task handles.
func routeOffersTasks(route Route) bool {
	o, ok := route.(offersTasks)
	return ok && o.bindsTasks()
}

// tasksExtensionData is the data of a -32021 refusal: the capability the
// request lacks, as SEP-2663 shows it.
var tasksExtensionData = map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{message.TasksExtension: map[string]any{}}}}

// taskVerdict decides a call of the Tasks extension's methods on a route
// that binds tasks (see the package's task handles).
func taskVerdict(c message.Call, version string) Verdict {
	modern := version >= modernVersion
	switch {
	case c.Method == "tasks/result" || c.Method == "tasks/list":
		v := Verdict{Status: http.StatusBadRequest, Reason: "method_removed", Code: message.CodeMethodNotFound,
			Message: fmt.Sprintf("%s is not offered through this gateway: the Tasks extension (SEP-2663) removed it, and tasks/get carries a task's result; a list of tasks would show one token's tasks to another", c.Method)}
		if modern {
			// SEP-2575: method not found is 404.
			v.Status = http.StatusNotFound
		}
		return v
	case !modern:
		return Verdict{}
	case message.IsTaskMethod(c.Method) && !c.DeclaresTasks, c.Method == "subscriptions/listen" && len(c.ListenTasks) > 0 && !c.DeclaresTasks:
		return Verdict{Status: http.StatusBadRequest, Reason: "missing_capability", Code: message.CodeMissingClientCapability,
			Message: fmt.Sprintf("%s needs the %s extension: declare it in the request's _meta client capabilities (%s.extensions)", c.Method, message.TasksExtension, message.ClientCapabilitiesKey),
			Data:    tasksExtensionData}
	}
	return Verdict{}
}

// unknownTask is the refusal of a handle that does not open.
func unknownTask(c message.Call) *RefusalError {
	return &RefusalError{Verdict{Status: http.StatusBadRequest, Reason: "task_unknown", Code: message.CodeInvalidParams,
		Message: fmt.Sprintf("%s: unknown task: this taskId was not given to this token on this endpoint (task ids are bound to the token that created the task), or was altered", c.Method)}}
}

// taskBinding is what one request's answers need to bind its tasks: the
// route's sealer and name, the principal, and the tasks the request named.
type taskBinding struct {
	ids       *taskid.Sealer
	route     string
	principal string
	// named maps the upstream's id of each task the request named to the
	// handle the client named it by.
	named map[string]string
	// calls maps the id of each task method of the request to the
	// upstream's id of the task it named.
	calls map[message.ID]string
	// creators maps the id of each tools/call of the request, on the
	// aggregated route, to the upstream that offers its tool: the task it
	// may create is that upstream's.
	creators map[message.ID]string
}

// taskAnswers is the listing filter's writer, which seals a request's
// answers by its binding.
type taskAnswers interface {
	bindTasks(*taskBinding)
}

func (w *listingWriter) bindTasks(b *taskBinding) { w.f.tasks = b }

// upstreams are the aggregated route's side of openTasks: which upstream
// offers a tool, and whether the principal may use an upstream that a
// handle names (nil refuses).
type upstreams interface {
	creator(tool string) string
	mayUse(p policy.Principal, upstream string, c message.Call) *RefusalError
}

// openTasks opens the task handles r's body names for the principal on
// the route of ids and name, and returns r with the body (and the
// Mcp-Name routing header) naming the upstream's ids instead; it hands
// the binding to w, the listing filter, for the answers. A handle that
// does not open refuses the request. ups is the aggregated route's (nil
// elsewhere, where a handle names no upstream): the request then goes to
// the one upstream its handles name.
func openTasks(w http.ResponseWriter, r *http.Request, ids *taskid.Sealer, name string, ups upstreams) (*http.Request, error) {
	p, _ := policy.PrincipalFrom(r.Context())
	tb := &taskBinding{ids: ids, route: name, principal: p.TokenID}
	if ta, ok := w.(taskAnswers); ok {
		ta.bindTasks(tb)
	}
	b, ok := message.FromContext(r.Context())
	if !ok {
		return r, nil
	}
	type replacement struct {
		span []byte
		with string
	}
	var (
		repl   []replacement
		target string // the upstream the handles name, on the aggregated route
	)
	open := func(c message.Call, handle string, span []byte) (string, error) {
		up, id, err := ids.Open(handle, p.TokenID, name)
		switch {
		case err != nil, (ups == nil) != (up == ""), target != "" && up != target:
			// Handles of two upstreams in one request: there is no one
			// upstream to send it to.
			return "", unknownTask(c)
		case ups != nil:
			if re := ups.mayUse(p, up, c); re != nil {
				return "", re
			}
			target = up
		}
		if tb.named == nil {
			tb.named, tb.calls = map[string]string{}, map[message.ID]string{}
		}
		tb.named[id] = handle
		repl = append(repl, replacement{span, id})
		return id, nil
	}
	for _, c := range b.Calls {
		if ups != nil && c.IsToolCall() && !c.ID.IsZero() {
			if tb.creators == nil {
				tb.creators = map[message.ID]string{}
			}
			tb.creators[c.ID] = ups.creator(c.Tool)
		}
		if message.IsTaskMethod(c.Method) && c.TaskIDRaw != nil {
			id, err := open(c, c.TaskID, c.TaskIDRaw)
			if err != nil {
				return nil, err
			}
			if !c.ID.IsZero() {
				tb.calls[c.ID] = id
			}
		}
		for _, s := range c.ListenTasks {
			if _, err := open(c, s.Value, s.Raw); err != nil {
				return nil, err
			}
		}
	}
	if len(repl) == 0 {
		return r, nil
	}
	// The spans are sub-slices of the body: put the upstream's ids in
	// their places, and read the result again, so that what the route
	// forwards is a body the one reader read.
	at := func(span []byte) int { return cap(b.Raw) - cap(span) }
	slices.SortFunc(repl, func(x, y replacement) int { return at(x.span) - at(y.span) })
	out := make([]byte, 0, len(b.Raw)+len(repl)*64)
	last := 0
	for _, x := range repl {
		quoted, _ := json.Marshal(x.with)
		out = append(append(out, b.Raw[last:at(x.span)]...), quoted...)
		last = at(x.span) + len(x.span)
	}
	out = append(out, b.Raw[last:]...)
	nb, err := message.Read(out)
	if err != nil {
		return nil, fmt.Errorf("edge: the body with the upstream's task ids does not read again: %w", err)
	}
	ctx := message.NewContext(r.Context(), nb)
	if target != "" {
		ctx = taskid.WithUpstream(ctx, target)
	}
	r = r.WithContext(ctx)
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(out)), int64(len(out))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(out)), nil }
	if !nb.Batch && message.IsTaskMethod(nb.Calls[0].Method) && r.Header.Get(nameHeader) != "" {
		// The routing header says what the body says (the edge checked
		// that it did); a new slice, as the request's may be shared.
		r.Header[nameHeader] = []string{nb.Calls[0].TaskID}
	}
	return r, nil
}

// mayTask reports whether a message might name a task, in any spelling:
// an escape, "taskid" in any case (taskId, taskIds), or a long s or a
// Kelvin sign, which encoding/json reads as s and k in a key. Most answers
// hold none of them, and pass unread.
func mayTask(b []byte) bool {
	if bytes.IndexByte(b, '\\') >= 0 || bytes.Contains(b, longS) || bytes.Contains(b, kelvin) {
		return true
	}
	for i, c := range b {
		if c|0x20 == 't' && hasFoldAt(b, i, "taskid") {
			return true
		}
	}
	return false
}

// The two letters outside ASCII that fold to a letter of "taskid".
var (
	longS  = []byte("\u017f")
	kelvin = []byte("\u212a")
)

// taskMessage binds the tasks one message the server sent names (see the
// package's task handles): it returns the message to pass on, whether to
// pass it, and whether it named a task at all. method is the method of
// the body's request the message answers ("" when it answers none the
// filter knows).
func (f *Listing) taskMessage(c message.Call, method string) (out []byte, keep, named bool) {
	tb := f.tasks
	switch {
	case c.IsResponse() && c.Result != nil:
		res, ok := decodeObject(c.Result)
		if !ok {
			return c.Raw, true, false
		}
		raw, ok, ambiguous := member(res, "taskId")
		if ambiguous {
			f.drop(Drop{Reason: "ambiguous_answer", ID: clip(c.ID.String())})
			return nil, false, true
		}
		if !ok {
			return c.Raw, true, false
		}
		var id string
		if json.Unmarshal(raw, &id) != nil {
			f.drop(Drop{Reason: "task_id_invalid", ID: clip(c.ID.String())})
			return nil, false, true
		}
		var handle string
		if sent, asked := tb.calls[c.ID]; asked && message.IsTaskMethod(method) {
			if sent != id {
				f.drop(Drop{Reason: "task_not_named", ID: clip(c.ID.String())})
				return nil, false, true
			}
			handle = tb.named[id]
		} else {
			var kind string
			_ = json.Unmarshal(res["resultType"], &kind)
			if kind != "task" || (method != "tools/call" && f.ids != nil) {
				// A task this request did not create or name.
				f.drop(Drop{Reason: "task_not_named", ID: clip(c.ID.String())})
				return nil, false, true
			}
			var err error
			if handle, err = tb.ids.Seal(tb.creators[c.ID], id, tb.principal, tb.route); err != nil {
				f.drop(Drop{Reason: "task_id_invalid", ID: clip(c.ID.String())})
				return nil, false, true
			}
		}
		res["taskId"], _ = json.Marshal(handle)
		return replaceMember(c.Raw, "result", res)
	case c.Method != "" && strings.HasPrefix(c.Method, "notifications/"):
		params, ok := decodeObject(c.Params)
		if !ok {
			return c.Raw, true, false
		}
		if c.Method == "notifications/subscriptions/acknowledged" {
			return f.taskAcknowledged(c, params)
		}
		raw, ok, ambiguous := member(params, "taskId")
		var id string
		switch {
		case ambiguous:
			f.drop(Drop{Reason: "ambiguous_answer"})
			return nil, false, true
		case !ok:
			return c.Raw, true, false
		case json.Unmarshal(raw, &id) != nil || tb.named[id] == "":
			// A task the request did not name: another token's,
			// perhaps, which the upstream cannot tell apart.
			f.drop(Drop{Reason: "task_not_named"})
			return nil, false, true
		}
		params["taskId"], _ = json.Marshal(tb.named[id])
		return replaceMember(c.Raw, "params", params)
	}
	return c.Raw, true, false
}

// taskAcknowledged binds the task ids of a subscriptions/listen's
// acknowledgement: the request's handles for the tasks it named, and none
// of the others.
func (f *Listing) taskAcknowledged(c message.Call, params map[string]json.RawMessage) ([]byte, bool, bool) {
	notes, ok := decodeObject(params["notifications"])
	if !ok {
		return c.Raw, true, false
	}
	raw, ok, ambiguous := member(notes, "taskIds")
	if ambiguous {
		f.drop(Drop{Reason: "ambiguous_answer"})
		return nil, false, true
	}
	if !ok {
		return c.Raw, true, false
	}
	var ids []string
	_ = json.Unmarshal(raw, &ids)
	handles := make([]string, 0, len(ids))
	for _, id := range ids {
		if h := f.tasks.named[id]; h != "" {
			handles = append(handles, h)
		}
	}
	notes["taskIds"], _ = json.Marshal(handles)
	params["notifications"], _ = json.Marshal(notes)
	return replaceMember(c.Raw, "params", params)
}

// decodeObject decodes a JSON object's members.
func decodeObject(raw []byte) (map[string]json.RawMessage, bool) {
	if len(raw) == 0 {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

// member returns m's member key, and whether m holds another key that a
// case-insensitive reader would take for it.
func member(m map[string]json.RawMessage, key string) (raw json.RawMessage, ok, ambiguous bool) {
	for k := range m {
		if k != key && strings.EqualFold(k, key) {
			return nil, false, true
		}
	}
	raw, ok = m[key]
	return raw, ok, false
}

// replaceMember returns the message msg with its member key set to v.
func replaceMember(msg []byte, key string, v map[string]json.RawMessage) ([]byte, bool, bool) {
	m, ok := decodeObject(msg)
	if !ok {
		return nil, false, true
	}
	m[key], _ = json.Marshal(v)
	out, err := json.Marshal(m)
	return out, err == nil, true
}
