package edge

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// catalog is an aggregated route's catalog as data: which upstream owns
// which tool, prompt, resource and template.
type catalog struct {
	upstreams []string
	tools     map[string]string
	prompts   map[string]string
	resources map[string]string
	templates map[string]string // template -> owner
	matches   map[string][]string
}

func (c catalog) Upstreams() []string { return c.upstreams }
func (c catalog) ToolServer(name string) (string, string, bool) {
	s, ok := c.tools[name]
	return s, name, ok
}
func (c catalog) PromptServer(name string) (string, string, bool) {
	s, ok := c.prompts[name]
	return s, name, ok
}
func (c catalog) ResourceOwners(uri string) []string {
	if o, ok := c.resources[uri]; ok {
		return []string{o}
	}
	return c.matches[uri]
}
func (c catalog) TemplateOwner(t string) (string, bool) { o, ok := c.templates[t]; return o, ok }
func (c catalog) CompletionResource(uri string) (string, bool) {
	if o, ok := c.resources[uri]; ok {
		return o, true
	}
	return c.TemplateOwner(uri)
}

func testCatalog() catalog {
	return catalog{
		upstreams: []string{"a", "b"},
		tools:     map[string]string{"mcp_a_secret": "a", "mcp_b_echo": "b"},
		prompts:   map[string]string{"mcp_a_plan": "a", "mcp_b_greet": "b"},
		resources: map[string]string{"file:///a/secret": "a", "file:///b/readme": "b"},
		templates: map[string]string{"a://{id}": "a", "b://{id}": "b", "any://{x}": "a"},
		matches:   map[string][]string{"a://1": {"a"}, "b://1": {"b"}, "any://1": {"a", "b"}},
	}
}

// routes are one of each route kind, as the edge builds them, with the
// principal an attacker holds on it.
func testRoutes(t testing.TB) map[string]struct {
	route Route
	p     policy.Principal
} {
	t.Helper()
	defaults, err := policy.NewScopeMap([]policy.Rule{{Scope: "simple", Tools: []string{"test_simple_text"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	up := upstream.Config{Name: "a", ToolsDeny: []string{"drop_*"}}
	upScopes, err := policy.NewScopeMap([]policy.Rule{{Scope: policy.UpstreamScope("a"), Tools: []string{"*"}, Methods: []string{"*"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	allows := func(p policy.Principal, name string) bool { return p.HasScope(policy.UpstreamScope(name)) }
	ops, err := policy.NewScopeMap([]policy.Rule{{Scope: "ops", Tools: []string{"deploy"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	deployRule, err := rules.Compile([]rules.Spec{{Effect: rules.Deny, Expr: "tool.name == 'deploy' && args.environment == 'production'",
		Message: "production deploys are refused here", Where: "site policy, rule 1"}})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]struct {
		route Route
		p     policy.Principal
	}{
		"guard rules": {&Guard{Scopes: ops, Rules: deployRule}, policy.Principal{TokenID: "t5", Name: "ops", Kind: policy.KindUser, Scopes: []string{"ops"}}},
		"guard":       {&Guard{Scopes: defaults}, policy.Principal{TokenID: "t1", Name: "simple", Kind: policy.KindUser, Scopes: []string{"simple"}}},
		"sessions":    {&Sessions{Scopes: defaults}, policy.Principal{TokenID: "t2", Name: "reader", Kind: policy.KindUser, Scopes: []string{"read"}}},
		"passthrough": {&Upstream{Config: up, Scopes: upScopes.Strict()}, policy.Principal{TokenID: "t3", Name: "other", Kind: policy.KindUser, Scopes: []string{"upstream:b"}}},
		"aggregate":   {&Aggregate{Catalog: testCatalog(), Allows: allows}, policy.Principal{TokenID: "t4", Name: "b-only", Kind: policy.KindUser, Scopes: []string{"upstream:b"}}},
	}
}

func TestDecide(t *testing.T) {
	routes := testRoutes(t)
	cases := []struct {
		route  string
		body   string
		status int // 0: allowed
		reason string
	}{
		// Guard: one tool.
		{"guard", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text"}}`, 0, ""},
		{"guard", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_error_handling"}}`, 403, ReasonScope},
		{"guard", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 0, ""},
		{"guard", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"x://y"}}`, 403, ReasonScope},
		{"guard", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text","Name":"test_error_handling"}}`, 400, ReasonAmbiguous},
		{"guard", `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text"}},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_error_handling"}}]`, 403, ReasonScope},
		{"guard", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text"}} {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}`, 400, ReasonAmbiguous},
		{"guard", `{"jsonrpc":"2.0","id":7.0,"method":"tools/list"}`, 400, ReasonAmbiguous},
		{"guard", `not json`, 400, ReasonMalformed},
		// Sessions: a read token may list, not create.
		{"sessions", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"list"}}}`, 0, ""},
		{"sessions", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"create","prompt":"hi"}}}`, 403, ReasonScope},
		{"sessions", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"list"},"Arguments":{"verb":"create"}}}`, 400, ReasonAmbiguous},
		{"sessions", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"list","Verb":"create"}}}`, 400, ReasonAmbiguous},
		{"sessions", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"Verb":"create"}}}`, 400, ReasonAmbiguous},
		{"sessions", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{}}}`, 403, ReasonScope},
		// Pass-through: a token without the upstream's scope learns nothing.
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, 0, ""},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, 0, ""},
		{"passthrough", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, 0, ""},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"result":{}}`, 0, ""},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 403, ReasonScope},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"prompts/list"}`, 403, ReasonScope},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"resources/list"}`, 403, ReasonScope},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"resources/templates/list"}`, 403, ReasonScope},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"a","value":""}}}`, 403, ReasonScope},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}`, 403, ReasonScope},
		{"passthrough", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}`, 403, ReasonScope},
		// Aggregate: each call against its owner.
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mcp_b_echo"}}`, 0, ""},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mcp_a_secret"}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"mcp_b_greet"}}`, 0, ""},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"mcp_a_plan"}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///b/readme"}}`, 0, ""},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a/secret"}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":"file:///a/secret"}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"a://1"}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"b://1"}}`, 0, ""},
		// A uri two upstreams' templates match: both must be allowed.
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"any://1"}}`, 403, ReasonScope},
		// Offered by nobody: refused to a token that may not use every upstream.
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///nowhere"}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"mcp_a_plan"},"argument":{"name":"x","value":""}}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/resource","uri":"a://{id}"},"argument":{"name":"id","value":""}}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/resource","uri":"b://{id}"},"argument":{"name":"id","value":""}}}`, 0, ""},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 0, ""},
		// Offered by no upstream yet: refused, since one may offer it by
		// the time it is served.
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mcp_c_later"}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"mcp_c_later"}}`, 403, ReasonScope},
		// A completion of a resource goes where the route sends it: the
		// resource's owner before a template's.
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/resource","uri":"file:///a/secret"},"argument":{"name":"x","value":""}}}`, 403, ReasonScope},
		// Guard: a completion needs what its reference needs.
		{"guard", `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"x","value":""}}}`, 403, ReasonScope},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///b/readme","URI":"file:///a/secret"}}`, 400, ReasonAmbiguous},
		{"aggregate", `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"mcp_b_greet","n\u0061me":"mcp_a_plan"}}`, 400, ReasonAmbiguous},
	}
	for _, tc := range cases {
		rt := routes[tc.route]
		d := Decide(rt.route, rt.p, http.MethodPost, http.Header{}, []byte(tc.body))
		if d.Status != tc.status || d.Reason != tc.reason {
			t.Errorf("%s %s: got %d %q (%s), want %d %q", tc.route, tc.body, d.Status, d.Reason, d.Message, tc.status, tc.reason)
		}
		if tc.status == 0 && (d.Body == nil || len(d.Body.Calls) == 0) {
			t.Errorf("%s %s: allowed without the body it read", tc.route, tc.body)
		}
	}
}

func TestDecideAdmit(t *testing.T) {
	routes := testRoutes(t)
	machine := policy.Principal{TokenID: "m", Name: "bot", Kind: policy.KindMachine, Scopes: []string{"chat", "mcp"}}
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		d := Decide(routes["sessions"].route, machine, method, http.Header{}, []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		if d.Status != http.StatusForbidden || d.Reason != ReasonMachine {
			t.Errorf("machine token %s on the sessions endpoint: %d %q", method, d.Status, d.Reason)
		}
	}
	if d := Decide(routes["guard"].route, machine, http.MethodGet, http.Header{}, nil); !d.Allowed() {
		t.Errorf("machine token GET in guard mode: %+v", d.Verdict)
	}
}

// modern is the headers of a 2026-07-28 request; an empty method or name
// leaves that header out.
func modern(method, name string) http.Header {
	h := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}}
	if method != "" {
		h.Set("Mcp-Method", method)
	}
	if name != "" {
		h.Set("Mcp-Name", name)
	}
	return h
}

// metaCall is a tools/call whose _meta carries the protocol version v.
func metaCall(v string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text","_meta":{"io.modelcontextprotocol/protocolVersion":"` + v + `"}}}`
}

func TestDecideHeaders(t *testing.T) {
	rt := testRoutes(t)["guard"]
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text"}}`
	cases := []struct {
		header http.Header
		body   string
		ok     bool
	}{
		{http.Header{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"test_simple_text"}}, call, true},
		{http.Header{"Mcp-Method": {"tools/list"}}, call, false},
		{http.Header{"Mcp-Name": {"test_error_handling"}}, call, false},
		{http.Header{"Mcp-Method": {"tools/call", "tools/call"}}, call, false},
		{http.Header{"Mcp-Name": {"x"}}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, false},
		{http.Header{"Mcp-Method": {"tools/list"}}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, true},
		// Spelled with _ (as Go's server keeps it), which CGI-style servers
		// read as Mcp-Method or Mcp-Name.
		{http.Header{"Mcp_method": {"tools/list"}}, call, false},
		{http.Header{"Mcp-Method": {"tools/call"}, "MCP_NAME": {"test_error_handling"}}, call, false},
		{http.Header{"X_other": {"v"}}, call, true},
		{http.Header{"Mcp_protocol_version": {"2026-07-28"}}, call, false},

		// 2026-07-28: the version in the header and in _meta agree, and a
		// request on its own names its method and subject in the headers.
		{modern("tools/call", "test_simple_text"), metaCall("2026-07-28"), true},
		{modern("tools/call", "test_simple_text"), call, true}, // no _meta version: the server's to refuse
		{modern("tools/call", "test_simple_text"), metaCall("2025-11-25"), false},
		{http.Header{"Mcp-Protocol-Version": {"2025-11-25"}}, metaCall("2026-07-28"), false},
		{http.Header{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"test_simple_text"}}, metaCall("2026-07-28"), false},
		// The version's value may be escaped: every reader decodes it.
		{modern("tools/call", "test_simple_text"), strings.Replace(metaCall("2026-07-28"), "07-28", `07\u002d28`, 1), true},
		{modern("tools/call", "test_simple_text"), strings.Replace(metaCall("2026-07-28"), `"2026-07-28"`, `7`, 1), false},
		{modern("", ""), call, false},
		{modern("tools/call", ""), call, false},
		{modern("tools/list", ""), `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, true},
		{http.Header{"Mcp-Protocol-Version": {"2026-07-28"}}, `[` + call + `]`, true}, // a batch: go-sdk checks no headers either
		{http.Header{"Mcp-Protocol-Version": {"2025-11-25"}}, call, true},
	}
	// The version's key spelled with escapes or in another case: readers
	// that match raw key bytes, fold case, or decode differ on whether it
	// is the version, so the body is refused as ambiguous, whatever the
	// header says.
	for _, body := range []string{
		strings.Replace(metaCall("2025-11-25"), "protocolVersion", `protocol\u0056ersion`, 1),
		strings.Replace(metaCall("2026-07-28"), "protocolVersion", `protocol\u0056ersion`, 1),
		strings.Replace(metaCall("2026-07-28"), "protocolVersion", `ProtocolVersion`, 1),
		strings.Replace(metaCall("2026-07-28"), "io.modelcontextprotocol/", `io.modelcontextprotocol\/`, 1),
	} {
		d := Decide(rt.route, rt.p, http.MethodPost, modern("tools/call", "test_simple_text"), []byte(body))
		if d.Allowed() || d.Status != http.StatusBadRequest || d.Reason != "ambiguous_body" {
			t.Errorf("%s: allowed %v, %d %q, want 400 ambiguous_body", body, d.Allowed(), d.Status, d.Reason)
		}
	}
	for _, tc := range cases {
		d := Decide(rt.route, rt.p, http.MethodPost, tc.header, []byte(tc.body))
		if d.Allowed() != tc.ok {
			t.Errorf("%v %s: allowed %v (%s)", tc.header, tc.body, d.Allowed(), d.Message)
		}
		if !tc.ok && (d.Status != http.StatusBadRequest || d.Code != message.CodeHeaderMismatch || d.Reason != "header_mismatch") {
			t.Errorf("%v: refusal %d %d %q, want 400 -32020 header_mismatch", tc.header, d.Status, d.Code, d.Reason)
		}
	}
}

// A 2026-07-28 request of a method that version removed (initialize,
// ping, logging/setLevel, resources/subscribe and resources/unsubscribe)
// is answered 404 with -32601 on every route, as a 2026-07-28 server
// answers it (the conformance suite's server-stateless): the edge does not
// read what the method took (a subscription's URI), and it passes nothing
// on, so no route authorizes or serves a call it cannot read. The same
// methods at 2025-11-25 are read and decided as ever.
func TestDecideRemovedMethods(t *testing.T) {
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
	req := func(method, params string) string {
		return `{"jsonrpc":"2.0","id":500,"method":"` + method + `","params":{` + params + `}}`
	}
	for name, rt := range testRoutes(t) {
		for _, c := range []struct{ method, params string }{
			{"initialize", meta},
			{"ping", meta},
			{"logging/setLevel", `"level":"debug",` + meta},
			{"resources/subscribe", meta},
			{"resources/unsubscribe", meta},
			{"resources/subscribe", `"uri":"file:///a/secret",` + meta},
		} {
			d := Decide(rt.route, rt.p, http.MethodPost, modern(c.method, ""), []byte(req(c.method, c.params)))
			if d.Status != http.StatusNotFound || d.Code != message.CodeMethodNotFound || d.Reason != ReasonMethodNotFound ||
				!strings.Contains(d.Message, c.method) || d.Call.Method != c.method {
				t.Errorf("%s: 2026-07-28 %s: %d %d %q (%s), want 404 -32601 %s naming the method", name, c.method, d.Status, d.Code, d.Reason, d.Message, ReasonMethodNotFound)
			}
		}
		// In a batch, the body is refused whole.
		batch := `[` + strings.Replace(req("tools/list", meta), "500", "501", 1) + `,` + req("resources/subscribe", meta) + `]`
		if d := Decide(rt.route, rt.p, http.MethodPost, http.Header{"Mcp-Protocol-Version": {"2026-07-28"}}, []byte(batch)); d.Status != http.StatusNotFound {
			t.Errorf("%s: a batch with a removed method: %d %q", name, d.Status, d.Reason)
		}
		// At 2025-11-25 the methods are there: decided by the route, and
		// a subscription without a URI is malformed.
		legacy := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}`
		hdr := http.Header{"Mcp-Protocol-Version": {"2025-11-25"}}
		if d := Decide(rt.route, rt.p, http.MethodPost, hdr, []byte(req("ping", legacy))); d.Status == http.StatusNotFound {
			t.Errorf("%s: 2025-11-25 ping answered 404", name)
		}
		if d := Decide(rt.route, rt.p, http.MethodPost, hdr, []byte(req("resources/subscribe", legacy))); d.Status != http.StatusBadRequest || d.Reason != ReasonMalformed {
			t.Errorf("%s: 2025-11-25 resources/subscribe without a uri: %d %q", name, d.Status, d.Reason)
		}
	}
	// A version in _meta that the header does not carry is a mismatch
	// before it is anything else.
	rt := testRoutes(t)["guard"]
	d := Decide(rt.route, rt.p, http.MethodPost, http.Header{}, []byte(req("resources/subscribe", meta)))
	if d.Code != message.CodeHeaderMismatch {
		t.Errorf("a removed method without the version header: %d %d %q", d.Status, d.Code, d.Reason)
	}
}

func TestVisibleAgreesWithAuthorize(t *testing.T) {
	routes := testRoutes(t)
	agg := routes["aggregate"]
	c := testCatalog()
	for name := range c.tools {
		it := Item{Kind: KindTool, Name: name}
		if agg.route.Visible(agg.p, it) != agg.route.Authorize(agg.p, it.Use()).Allowed() {
			t.Errorf("tool %s: Visible and Authorize disagree", name)
		}
	}
	for name := range c.prompts {
		it := Item{Kind: KindPrompt, Name: name}
		if agg.route.Visible(agg.p, it) != agg.route.Authorize(agg.p, it.Use()).Allowed() {
			t.Errorf("prompt %s: Visible and Authorize disagree", name)
		}
	}
	for uri := range c.resources {
		it := Item{Kind: KindResource, Name: uri}
		if agg.route.Visible(agg.p, it) != agg.route.Authorize(agg.p, it.Use()).Allowed() {
			t.Errorf("resource %s: Visible and Authorize disagree", uri)
		}
	}
	var shown []string
	for tmpl := range c.templates {
		if agg.route.Visible(agg.p, Item{Kind: KindResourceTemplate, Name: tmpl}) {
			shown = append(shown, tmpl)
		}
	}
	if !slices.Equal(shown, []string{"b://{id}"}) {
		t.Errorf("templates shown to an upstream:b token: %v", shown)
	}
	pt := routes["passthrough"]
	if pt.route.Visible(pt.p, Item{Kind: KindTool, Name: "echo"}) {
		t.Error("pass-through shows a tool to a token without the upstream's scope")
	}
	owner := policy.Principal{TokenID: "o", Name: "owner", Kind: policy.KindUser, Scopes: []string{"upstream:a"}}
	if !pt.route.Visible(owner, Item{Kind: KindTool, Name: "echo"}) || pt.route.Visible(owner, Item{Kind: KindTool, Name: "drop_all"}) {
		t.Error("pass-through visibility disagrees with the scope and the deny list")
	}
	if v := pt.route.Authorize(owner, Item{Kind: KindTool, Name: "drop_all"}.Use()); v.Reason != "tool_not_offered" {
		t.Errorf("a denied tool: %+v", v)
	}
}
