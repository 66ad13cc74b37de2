package edge

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/internal/hostile"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func toolCall(name, args string) hostile.Call {
	return hostile.Call{Method: "tools/call", Params: `{"name":"` + name + `","arguments":` + args + `}`}
}

// hostileTargets are the attacks of the end-to-end test, against the
// routes of testRoutes and their attackers.
var hostileTargets = map[string]hostile.Target{
	"guard": {
		Allowed: toolCall("test_simple_text", "{}"),
		Forbidden: []hostile.Call{
			toolCall("test_embedded_resource", "{}"),
			{Method: "resources/read", Params: `{"uri":"test://static-text"}`},
			{Method: "prompts/get", Params: `{"name":"test_simple_prompt"}`},
		},
	},
	"sessions": {
		Allowed:   toolCall("sessions", `{"verb":"list"}`),
		Forbidden: []hostile.Call{toolCall("sessions", `{"verb":"create","prompt":"hi","cwd":"/tmp"}`)},
	},
	"passthrough": {
		Allowed: hostile.Call{Method: "ping"},
		Forbidden: []hostile.Call{
			toolCall("echo", `{"text":"hi"}`),
			{Method: "resources/read", Params: `{"uri":"file:///a/secret"}`},
			{Method: "prompts/get", Params: `{"name":"plan"}`},
			{Method: "completion/complete", Params: `{"ref":{"type":"ref/prompt","name":"plan"},"argument":{"name":"a","value":""}}`},
			{Method: "tools/list"}, {Method: "prompts/list"}, {Method: "resources/list"}, {Method: "resources/templates/list"},
		},
	},
	// A rule over an argument: the same tool with another value is
	// allowed, so every case smuggles the argument.
	"guard rules": {
		Allowed:         toolCall("deploy", `{"environment":"staging"}`),
		Forbidden:       []hostile.Call{toolCall("deploy", `{"environment":"production"}`)},
		ForbiddenReason: hostile.ReasonRule,
	},
	"aggregate": {
		Allowed: toolCall("mcp_b_echo", `{"text":"hi"}`),
		AlsoAllowed: []hostile.Call{
			{Method: "resources/read", Params: `{"uri":"file:///b/readme"}`},
			{Method: "prompts/get", Params: `{"name":"mcp_b_greet"}`},
			{Method: "resources/subscribe", Params: `{"uri":"file:///b/readme"}`},
		},
		Forbidden: []hostile.Call{
			toolCall("mcp_a_secret", `{"text":"hi"}`),
			{Method: "resources/read", Params: `{"uri":"file:///a/secret"}`},
			{Method: "resources/read", Params: `{"uri":"a://1"}`},
			{Method: "prompts/get", Params: `{"name":"mcp_a_plan"}`},
			{Method: "resources/subscribe", Params: `{"uri":"file:///a/secret"}`},
			{Method: "completion/complete", Params: `{"ref":{"type":"ref/prompt","name":"mcp_a_plan"},"argument":{"name":"a","value":""}}`},
		},
	},
}

// TestDecideHostile runs every hostile case of the end-to-end attack test
// through the steps of package edge that decide on it (CheckSingleHeaders,
// CheckRequest, ReadBody, Decide), on each kind of route: each must be answered as the
// case says, and a case passed on must be passed on with the body as sent.
func TestDecideHostile(t *testing.T) {
	routes := testRoutes(t)
	for name, target := range hostileTargets {
		rt := routes[name]
		cases := hostile.Cases(target)
		if len(cases) < 40 {
			t.Fatalf("%s: %d hostile cases, want at least 40", name, len(cases))
		}
		for _, hc := range cases {
			t.Run(name+"/"+hc.Name, func(t *testing.T) {
				r := httptest.NewRequest(hc.HTTPMethod(), "/mcp", bytes.NewReader(hc.Body))
				r.Header.Set("Content-Type", "application/json")
				for k, v := range hc.Header {
					r.Header[k] = v
				}
				status, reason, code := decideRequest(rt.route, rt.p, r)
				wantStatus := hc.Status
				if wantStatus/100 == 2 {
					wantStatus = 0
				}
				if status != wantStatus || reason != hc.Reason || (hc.Code != 0 && code != hc.Code) {
					t.Errorf("got %d %q code %d, want %d %q code %d\nbody: %q", status, reason, code, hc.Status, hc.Reason, hc.Code, hc.Body)
				}
			})
		}
	}
}

// decideRequest is what the handler does before a request is served, but
// for the Origin check and authentication.
func decideRequest(route Route, p policy.Principal, r *http.Request) (status int, reason string, code int) {
	if v := CheckSingleHeaders(r); !v.Allowed() {
		return v.Status, v.Reason, v.Code
	}
	if v := CheckRequest(r); !v.Allowed() {
		return v.Status, v.Reason, v.Code
	}
	var body []byte
	if r.Method == http.MethodPost {
		var v Verdict
		if body, v = ReadBody(r, 1<<20); !v.Allowed() {
			return v.Status, v.Reason, v.Code
		}
	}
	d := Decide(route, p, r.Method, r.Header, body)
	return d.Status, d.Reason, d.Code
}
