package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// taskUpstream is a scripted upstream of the Tasks extension behind a
// broker-like route: it records what reaches it, and answers as told.
type taskUpstream struct {
	bodies []string
	names  []string // the Mcp-Name header of each request
	answer func(c message.Call) (contentType, body string)
}

func (u *taskUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	u.bodies = append(u.bodies, string(raw))
	u.names = append(u.names, r.Header.Get("Mcp-Name"))
	b, _ := message.FromContext(r.Context())
	if b == nil || !bytes.Equal(b.Raw, raw) {
		// What the route forwards is what the edge read (again).
		http.Error(w, "the body in the context is not the body", http.StatusTeapot)
		return
	}
	ct, body := u.answer(b.Calls[0])
	w.Header().Set("Content-Type", ct)
	io.WriteString(w, body)
}

const tasksRoute = "broker:tasks"

var (
	taskAlice = policy.Principal{TokenID: "tok_alice", Name: "taskAlice", Kind: policy.KindUser, Scopes: []string{"upstream:tasks"}}
	taskBob   = policy.Principal{TokenID: "tok_bob", Name: "taskBob", Kind: policy.KindUser, Scopes: []string{"upstream:tasks"}}
)

func newTaskRoute(t *testing.T, up *taskUpstream) (*Upstream, *broker.TaskIDs) {
	t.Helper()
	ids, err := broker.NewTaskIDs(bytes.Repeat([]byte{3}, broker.SessionKeySize))
	if err != nil {
		t.Fatal(err)
	}
	scopes, err := policy.NewScopeMap([]policy.Rule{{Scope: "upstream:tasks", Tools: []string{"*"}, Methods: []string{"*"}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	return &Upstream{Config: broker.Upstream{Name: "tasks"}, Scopes: scopes.Strict(), Handler: up, Tasks: ids, Route: tasksRoute}, ids
}

// modernTask is a 2026-07-28 request of method with params (a JSON object's
// members), declaring the Tasks extension when declare is set, and its
// headers, Mcp-Name being name.
func modernTask(method, params, name string, declare bool) (string, http.Header) {
	caps := `{}`
	if declare {
		caps = `{"extensions":{"io.modelcontextprotocol/tasks":{}}}`
	}
	if params != "" {
		params += ","
	}
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":%q,"params":{%s"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":%s}}}`, method, params, caps)
	h := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {method}}
	if name != "" {
		h["Mcp-Name"] = []string{name}
	}
	return body, h
}

// edgeAnswer is what the client of the edge got.
type edgeAnswer struct {
	verdict Verdict // a refusal, by the edge or the route
	body    string
	drops   []Drop
}

// edgeThrough runs the edge's steps for a request to route as p: the
// decision, the route behind the listing filter.
func edgeThrough(t *testing.T, route Route, p policy.Principal, header http.Header, body string) edgeAnswer {
	t.Helper()
	d := Decide(route, p, http.MethodPost, header, []byte(body))
	if !d.Allowed() {
		return edgeAnswer{verdict: d.Verdict}
	}
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	r.Header = header.Clone()
	r = r.WithContext(message.NewContext(policy.WithPrincipal(r.Context(), p), d.Body))
	var a edgeAnswer
	rec := httptest.NewRecorder()
	w, closeFilter := NewListing(route, p, d.Body, func(d Drop) { a.drops = append(a.drops, d) }).Wrap(rec)
	if err := route.Serve(w, r, nil); err != nil {
		var re *RefusalError
		if !errors.As(err, &re) {
			t.Fatalf("Serve: %v", err)
		}
		return edgeAnswer{verdict: re.Verdict}
	}
	if err := closeFilter(); err != nil {
		t.Fatal(err)
	}
	a.body = rec.Body.String()
	return a
}

// result reads the JSON-RPC result of a JSON answer, or of the last data
// event of a stream.
func result(t *testing.T, a edgeAnswer) map[string]any {
	t.Helper()
	data := a.body
	if i := strings.LastIndex(data, "data: "); i >= 0 {
		data, _, _ = strings.Cut(data[i+len("data: "):], "\n")
	}
	var msg struct {
		Result map[string]any `json:"result"`
	}
	if err := json.Unmarshal([]byte(data), &msg); err != nil || msg.Result == nil {
		t.Fatalf("no result in %q (verdict %+v, drops %v)", a.body, a.verdict, a.drops)
	}
	return msg.Result
}

const createTask = `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"up-1","status":"working","createdAt":"2026-12-06T00:00:00Z","lastUpdatedAt":"2026-12-06T00:00:00Z","ttlMs":60000}}`

func TestTaskHandles(t *testing.T) {
	up := &taskUpstream{answer: func(c message.Call) (string, string) {
		if c.Method == "tools/call" {
			return "application/json", createTask
		}
		return "application/json", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","taskId":%q,"status":"working"}}`, c.TaskID)
	}}
	route, ids := newTaskRoute(t, up)

	body, h := modernTask("tools/call", `"name":"slow","arguments":{}`, "slow", true)
	handle, _ := result(t, edgeThrough(t, route, taskAlice, h, body))["taskId"].(string)
	if handle == "" || handle == "up-1" {
		t.Fatalf("the client got task id %q: the upstream's own, or none", handle)
	}
	if _, id, err := ids.Open(handle, taskAlice.TokenID, tasksRoute); err != nil || id != "up-1" {
		t.Fatalf("the handle opens to %q, %v", id, err)
	}

	for _, method := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
		params := fmt.Sprintf(`"taskId":%q`, handle)
		if method == "tasks/update" {
			params += `,"inputResponses":{}`
		}
		body, h := modernTask(method, params, handle, true)
		res := result(t, edgeThrough(t, route, taskAlice, h, body))
		last := up.bodies[len(up.bodies)-1]
		if !strings.Contains(last, `"taskId":"up-1"`) || strings.Contains(last, handle) || up.names[len(up.names)-1] != "up-1" {
			t.Errorf("%s: the upstream got %s with Mcp-Name %q, want its own id in both", method, last, up.names[len(up.names)-1])
		}
		if res["taskId"] != handle {
			t.Errorf("%s: the client's answer names %v, want its own handle back", method, res["taskId"])
		}
	}
}

// TestTaskHandleAttacks: what another token, or anyone with an altered,
// forged, raw or foreign handle, gets for each task method: the edge's
// -32602, and nothing reaches the upstream.
func TestTaskHandleAttacks(t *testing.T) {
	up := &taskUpstream{answer: func(message.Call) (string, string) { return "application/json", createTask }}
	route, ids := newTaskRoute(t, up)
	body, h := modernTask("tools/call", `"name":"slow"`, "slow", true)
	handle, _ := result(t, edgeThrough(t, route, taskAlice, h, body))["taskId"].(string)

	altered := []byte(handle)
	altered[len(altered)/2] ^= 1
	otherRoute, _ := ids.Seal("", "up-1", taskAlice.TokenID, "guard:/mcp")
	aggregate, _ := ids.Seal("tasks", "up-1", taskAlice.TokenID, tasksRoute)
	sessions, _ := broker.NewSessionIDs(bytes.Repeat([]byte{3}, broker.SessionKeySize))
	for _, c := range []struct {
		name   string
		p      policy.Principal
		handle string
	}{
		{"another token with the handle", taskBob, handle},
		{"an altered handle", taskAlice, string(altered)},
		{"the upstream's own id", taskAlice, "up-1"},
		{"a handle of another route", taskAlice, otherRoute},
		{"a handle that names an upstream, on a route of one", taskAlice, aggregate},
		{"a session id sealed under the same key", taskAlice, sessions.Seal("up-1", taskAlice.TokenID, tasksRoute)},
		{"a forged handle", taskAlice, strings.Repeat("A", len(handle))},
	} {
		for _, method := range []string{"tasks/get", "tasks/update", "tasks/cancel", "subscriptions/listen"} {
			params := fmt.Sprintf(`"taskId":%q`, c.handle)
			name := c.handle
			if method == "subscriptions/listen" {
				params, name = fmt.Sprintf(`"notifications":{"taskIds":[%q]}`, c.handle), ""
			}
			body, h := modernTask(method, params, name, true)
			n := len(up.bodies)
			a := edgeThrough(t, route, c.p, h, body)
			if a.verdict.Status != http.StatusBadRequest || a.verdict.Code != message.CodeInvalidParams || a.verdict.Reason != "task_unknown" {
				t.Errorf("%s, %s: %+v, want 400 task_unknown (-32602)", c.name, method, a.verdict)
			}
			if len(up.bodies) != n {
				t.Errorf("%s, %s: the upstream got %s", c.name, method, up.bodies[n])
			}
		}
	}
}

// TestTaskAnswersBound: the upstream chooses every byte of its answers,
// and cannot tell one token's tasks from another's. What a client gets
// names only the tasks its own request named or created.
func TestTaskAnswersBound(t *testing.T) {
	var answer string
	up := &taskUpstream{answer: func(message.Call) (string, string) { return "text/event-stream", answer }}
	route, ids := newTaskRoute(t, up)
	handle, _ := ids.Seal("", "up-1", taskAlice.TokenID, tasksRoute)
	event := func(msg string) string { return "event: message\ndata: " + msg + "\n\n" }

	t.Run("a tasks/get answer about another task is withheld", func(t *testing.T) {
		answer = event(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","taskId":"up-2","status":"completed","result":{"content":[]}}}`)
		body, h := modernTask("tasks/get", fmt.Sprintf(`"taskId":%q`, handle), handle, true)
		a := edgeThrough(t, route, taskAlice, h, body)
		if strings.Contains(a.body, "up-2") || len(a.drops) != 1 || a.drops[0].Reason != "task_not_named" {
			t.Fatalf("client got %q, drops %v", a.body, a.drops)
		}
	})
	t.Run("a CreateTaskResult to another method is withheld", func(t *testing.T) {
		answer = event(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"up-2","status":"working"}}`)
		body, h := modernTask("prompts/get", `"name":"p"`, "p", true)
		a := edgeThrough(t, route, taskAlice, h, body)
		if strings.Contains(a.body, "up-2") || len(a.drops) != 1 || a.drops[0].Reason != "task_not_named" {
			t.Fatalf("client got %q, drops %v", a.body, a.drops)
		}
	})
	t.Run("status notifications name the listened tasks only", func(t *testing.T) {
		answer = event(`{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"notifications":{"taskIds":["up-1","up-2"]}}}`) +
			event(`{"jsonrpc":"2.0","method":"notifications/tasks","params":{"taskId":"up-1","status":"completed"}}`) +
			event(`{"jsonrpc":"2.0","method":"notifications/tasks","params":{"taskId":"up-2","status":"completed","result":{"content":[{"type":"text","text":"bob's secret"}]}}}`)
		body, h := modernTask("subscriptions/listen", fmt.Sprintf(`"notifications":{"taskIds":[%q]}`, handle), "", true)
		a := edgeThrough(t, route, taskAlice, h, body)
		if !strings.Contains(up.bodies[len(up.bodies)-1], `"taskIds":["up-1"]`) {
			t.Errorf("the upstream's listen names %s", up.bodies[len(up.bodies)-1])
		}
		want := fmt.Sprintf(`"taskIds":[%q]`, handle)
		if !strings.Contains(a.body, want) || !strings.Contains(a.body, fmt.Sprintf(`"taskId":%q`, handle)) ||
			strings.Contains(a.body, "up-1") || strings.Contains(a.body, "up-2") || strings.Contains(a.body, "bob's secret") {
			t.Fatalf("client got %q", a.body)
		}
		if len(a.drops) != 1 || a.drops[0].Reason != "task_not_named" {
			t.Errorf("drops %v", a.drops)
		}
	})
	t.Run("a task id past the bound is withheld", func(t *testing.T) {
		answer = event(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":%q,"status":"working"}}`, strings.Repeat("x", broker.MaxUpstreamTaskID+1)))
		body, h := modernTask("tools/call", `"name":"slow"`, "slow", true)
		a := edgeThrough(t, route, taskAlice, h, body)
		if strings.Contains(a.body, "xxxx") || len(a.drops) != 1 || a.drops[0].Reason != "task_id_invalid" {
			t.Fatalf("client got %q, drops %v", a.body, a.drops)
		}
	})
}

// TestTaskVerdicts: on a route that binds tasks, the extension's removed
// methods get -32601 (404 at 2026-07-28), and its methods from a request
// that does not declare it -32021, with the capability in the data, as
// the extension has servers answer, before any handle is looked at. A
// 2025-11-25 request, which declares nothing per request, is not refused
// for it; a route that binds no tasks decides none of this.
func TestTaskVerdicts(t *testing.T) {
	route, _ := newTaskRoute(t, &taskUpstream{})
	for _, c := range []struct {
		name         string
		method       string
		params       string
		declare      bool
		status, code int
	}{
		{"tasks/get undeclared", "tasks/get", `"taskId":"x"`, false, http.StatusBadRequest, message.CodeMissingClientCapability},
		{"tasks/update undeclared", "tasks/update", `"taskId":"x","inputResponses":{}`, false, http.StatusBadRequest, message.CodeMissingClientCapability},
		{"tasks/cancel undeclared", "tasks/cancel", `"taskId":"x"`, false, http.StatusBadRequest, message.CodeMissingClientCapability},
		{"listening to tasks undeclared", "subscriptions/listen", `"notifications":{"taskIds":["x"]}`, false, http.StatusBadRequest, message.CodeMissingClientCapability},
		{"tasks/result", "tasks/result", `"taskId":"x"`, true, http.StatusNotFound, message.CodeMethodNotFound},
		{"tasks/list", "tasks/list", ``, true, http.StatusNotFound, message.CodeMethodNotFound},
	} {
		name := ""
		if message.IsTaskMethod(c.method) {
			name = "x"
		}
		body, h := modernTask(c.method, c.params, name, c.declare)
		d := Decide(route, taskAlice, http.MethodPost, h, []byte(body))
		if d.Status != c.status || d.Code != c.code {
			t.Errorf("%s: %+v, want %d with %d", c.name, d.Verdict, c.status, c.code)
		}
		if c.code == message.CodeMissingClientCapability && d.Data["requiredCapabilities"] == nil {
			t.Errorf("%s: no requiredCapabilities in the data", c.name)
		}
	}
	legacy := `{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"x"}}`
	if d := Decide(route, taskAlice, http.MethodPost, http.Header{}, []byte(legacy)); !d.Allowed() {
		t.Errorf("a 2025-11-25 tasks/get: %+v", d.Verdict)
	}
	if d := Decide(route, taskAlice, http.MethodPost, http.Header{}, []byte(`{"jsonrpc":"2.0","id":1,"method":"tasks/list"}`)); d.Status != http.StatusBadRequest || d.Code != message.CodeMethodNotFound {
		t.Errorf("a 2025-11-25 tasks/list: %+v, want 400 with -32601", d.Verdict)
	}
	plain := &Upstream{Config: route.Config, Scopes: route.Scopes, Handler: route.Handler}
	body, h := modernTask("tasks/list", ``, "", false)
	if d := Decide(plain, taskAlice, http.MethodPost, h, []byte(body)); !d.Allowed() {
		t.Errorf("a route that binds no tasks refused tasks/list: %+v", d.Verdict)
	}
}

// Most answers name no task: they pass the filter unread, as before.
func TestMayTask(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"the task is done"}]}}`, false},
		{`{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"x"}}`, true},
		{`{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"notifications":{"TASKIDS":[]}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"result":{"t\u0061skId":"x"}}`, true},
	} {
		if got := mayTask([]byte(c.msg)); got != c.want {
			t.Errorf("mayTask(%s) = %v", c.msg, got)
		}
	}
}

// TestAggregateTaskHandles: on the aggregated route a handle names the
// upstream that holds the task, which the request then goes to; one whose
// upstream the token may not use is refused as a use of that upstream,
// and one that names no upstream the route has, none at all, or a
// CreateTaskResult's creator, is as unknown as any other.
func TestAggregateTaskHandles(t *testing.T) {
	ids, err := broker.NewTaskIDs(bytes.Repeat([]byte{4}, broker.SessionKeySize))
	if err != nil {
		t.Fatal(err)
	}
	up := &taskUpstream{answer: func(c message.Call) (string, string) {
		if c.Method == "tools/call" {
			return "application/json", createTask
		}
		return "application/json", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","taskId":%q,"status":"working"}}`, c.TaskID)
	}}
	allows := func(p policy.Principal, name string) bool { return p.HasScope(policy.UpstreamScope(name)) }
	route := &Aggregate{Catalog: testCatalog(), Allows: allows, Handler: up, Tasks: ids, Route: "aggregate|/mcp"}
	both := policy.Principal{TokenID: "tok_both", Name: "both", Kind: policy.KindUser, Scopes: []string{"upstream:a", "upstream:b"}}
	bOnly := policy.Principal{TokenID: "tok_b", Name: "b-only", Kind: policy.KindUser, Scopes: []string{"upstream:b"}}

	body, h := modernTask("tools/call", `"name":"mcp_a_secret"`, "mcp_a_secret", true)
	handle, _ := result(t, edgeThrough(t, route, both, h, body))["taskId"].(string)
	if upstream, id, err := ids.Open(handle, both.TokenID, "aggregate|/mcp"); err != nil || upstream != "a" || id != "up-1" {
		t.Fatalf("the handle of a task of mcp_a_secret opens to %q, %q, %v; want upstream a's up-1", upstream, id, err)
	}
	body, h = modernTask("tasks/get", fmt.Sprintf(`"taskId":%q`, handle), handle, true)
	if res := result(t, edgeThrough(t, route, both, h, body)); res["taskId"] != handle || !strings.Contains(up.bodies[len(up.bodies)-1], `"taskId":"up-1"`) {
		t.Fatalf("tasks/get: the client got %v, the upstream %s", res, up.bodies[len(up.bodies)-1])
	}

	forB, _ := ids.Seal("a", "up-1", bOnly.TokenID, "aggregate|/mcp")
	gone, _ := ids.Seal("c", "up-1", both.TokenID, "aggregate|/mcp")
	none, _ := ids.Seal("", "up-1", both.TokenID, "aggregate|/mcp")
	for _, c := range []struct {
		name   string
		p      policy.Principal
		handle string
		status int
		reason string
	}{
		{"a task of an upstream the token may not use", bOnly, forB, http.StatusForbidden, ReasonScope},
		{"an upstream the route does not have", both, gone, http.StatusBadRequest, "task_unknown"},
		{"a handle that names no upstream", both, none, http.StatusBadRequest, "task_unknown"},
		{"another token's handle", bOnly, handle, http.StatusBadRequest, "task_unknown"},
	} {
		n := len(up.bodies)
		body, h := modernTask("tasks/cancel", fmt.Sprintf(`"taskId":%q`, c.handle), c.handle, true)
		a := edgeThrough(t, route, c.p, h, body)
		if a.verdict.Status != c.status || a.verdict.Reason != c.reason || len(up.bodies) != n {
			t.Errorf("%s: %+v (the upstream got %d requests), want %d %s", c.name, a.verdict, len(up.bodies)-n, c.status, c.reason)
		}
	}
}

// An upstream's task id never reaches the client unsealed, whatever the
// spelling of its key: encoding/json reads taskId with a long s (U+017F)
// or a Kelvin sign (U+212A) for k as taskId, as it reads "TASKID".
func TestTaskIDKeyFoldedToNonASCII(t *testing.T) {
	var answer string
	up := &taskUpstream{answer: func(message.Call) (string, string) { return "application/json", answer }}
	route, _ := newTaskRoute(t, up)
	for _, key := range []string{"TASKID", "ta\u017fkId", "tas\u212aId"} {
		answer = `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","` + key + `":"up-raw","status":"working"}}`
		body, h := modernTask("tools/call", `"name":"slow"`, "slow", true)
		a := edgeThrough(t, route, taskAlice, h, body)
		if strings.Contains(a.body, "up-raw") {
			t.Errorf("%s: the client got the upstream's task id: %s", key, a.body)
		}
	}
}
