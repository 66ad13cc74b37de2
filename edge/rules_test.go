package edge

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// ruleSet is the operator's rules of the tests below.
func ruleSet(t testing.TB) *rules.Set {
	t.Helper()
	s, err := rules.Compile([]rules.Spec{
		{Effect: rules.Deny, Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "production deploys are refused here", Where: "global policy, rule 1"},
		{Effect: rules.Deny, Expr: "tool.name == 'drop_table'", Message: "dropping tables is not allowed here", Where: "global policy, rule 2"},
		{Effect: rules.Deny, Expr: "prompt.name == 'plan' && args.target == 'prod'", Message: "no plans for prod", Where: "global policy, rule 3"},
		{Effect: rules.Allow, Expr: `'db' in principal.scopes && tool.name in ['run_query', 'mcp_a_secret', 'echo', 'drop_all'] && !args.query.matches('(?i)\\b(drop|truncate)\\b')`, Where: "site policy, rule 1"},
		{Effect: rules.Allow, Expr: "tool.name == 'sessions' && args.verb == 'create' && 'creator' in principal.scopes", Where: "site policy, rule 2"},
		{Effect: rules.Deny, Expr: "has(claims.env) && claims.env == 'prod' && tool.name == 'test_simple_text'", Message: "not from prod", Where: "site policy, rule 3"},
		{Effect: rules.Allow, Expr: "resource.uri == 'any://1' || method == 'tools/list'", Where: "site policy, rule 4"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ruledRoutes(t testing.TB) map[string]Route {
	t.Helper()
	set := ruleSet(t)
	scopes, err := policy.NewScopeMap([]policy.Rule{{Scope: "ops", Tools: []string{"deploy", "drop_table", "test_simple_text"}}, {Scope: "ops", Methods: []string{"prompts/get"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	up := upstream.Config{Name: "a", ToolsDeny: []string{"drop_*"}}
	upScopes, err := policy.NewScopeMap([]policy.Rule{{Scope: policy.UpstreamScope("a"), Tools: []string{"*"}, Methods: []string{"*"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	allows := func(p policy.Principal, name string) bool { return p.HasScope(policy.UpstreamScope(name)) }
	return map[string]Route{
		"guard":       &Guard{Scopes: scopes, Rules: set},
		"sessions":    &Sessions{Scopes: scopes, Rules: set},
		"passthrough": &Upstream{Config: up, Scopes: upScopes.Strict(), Rules: set},
		"egress":      &Upstream{Config: up, Scopes: upScopes.Strict(), Rules: set, Egress: true},
		"aggregate":   &Aggregate{Catalog: testCatalog(), Allows: allows, Rules: set},
	}
}

func principal(kind policy.Kind, scopes ...string) policy.Principal {
	return policy.Principal{TokenID: "t", Name: "tok", Kind: kind, Scopes: scopes}
}

func call(tool, args string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
}

// TestRulesDecide is the attacks on the operator's rules, route by route:
// each body either is refused by the one reader, or is decided on what the
// reader read, which is what the backend executes.
func TestRulesDecide(t *testing.T) {
	routes := ruledRoutes(t)
	ops := principal(policy.KindUser, "ops")
	db := principal(policy.KindUser, "db")
	cases := []struct {
		name, route string
		p           policy.Principal
		body        string
		header      http.Header
		status      int
		reason      string
		rule        string // the deciding rule, allowed or not
	}{
		{"a production deploy is denied", "guard", ops, call("deploy", `{"environment":"production"}`), nil, 403, ReasonRule, "global policy, rule 1"},
		{"its neighbour goes to the scopes", "guard", ops, call("deploy", `{"environment":"staging"}`), nil, 0, "", ""},
		{"an escaped spelling is the same value", "guard", ops, call("deploy", `{"environment":"produ\u0063tion"}`), nil, 403, ReasonRule, "global policy, rule 1"},
		{"a duplicate key is refused by the reader", "guard", ops, call("deploy", `{"environment":"staging","environment":"production"}`), nil, 400, ReasonAmbiguous, ""},
		{"a case-variant key is refused by the reader", "guard", ops, call("deploy", `{"environment":"staging","Environment":"production"}`), nil, 400, ReasonAmbiguous, ""},
		{"an escaped key is refused by the reader", "guard", ops, call("deploy", `{"environment":"staging","\u0065nvironment":"production"}`), nil, 400, ReasonAmbiguous, ""},
		{"__proto__ is refused by the reader", "guard", ops, call("deploy", `{"__proto__":{"environment":"production"},"environment":"staging"}`), nil, 400, ReasonAmbiguous, ""},
		{"a missing argument fails the deny rule closed", "guard", ops, call("deploy", `{}`), nil, 403, ReasonRule, "global policy, rule 1"},
		{"arguments null fail the deny rule closed", "guard", ops, call("deploy", `null`), nil, 403, ReasonRule, "global policy, rule 1"},
		{"a production deploy in a batch refuses the batch", "guard", ops, `[` + call("deploy", `{"environment":"staging"}`) + `,` + strings.Replace(call("deploy", `{"environment":"production"}`), `"id":1`, `"id":2`, 1) + `]`, nil, 403, ReasonRule, "global policy, rule 1"},
		{"a denied tool whatever the arguments", "guard", ops, call("drop_table", `{}`), nil, 403, ReasonRule, "global policy, rule 2"},
		{"a denied prompt on its arguments", "guard", ops, `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"plan","arguments":{"target":"prod"}}}`, nil, 403, ReasonRule, "global policy, rule 3"},
		{"its neighbouring prompt", "guard", ops, `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"plan","arguments":{"target":"dev"}}}`, nil, 0, "", ""},
		{"a prompt's case-variant arguments are refused", "guard", ops, `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"plan","arguments":{"target":"dev"},"Arguments":{"target":"prod"}}}`, nil, 400, ReasonAmbiguous, ""},
		{"an allow rule grants what the scopes refuse", "guard", db, call("run_query", `{"query":"select 1"}`), nil, 0, "", "site policy, rule 1"},
		{"and not the call it does not hold for", "guard", db, call("run_query", `{"query":"DROP TABLE x"}`), nil, 403, ReasonScope, ""},
		{"nor for a principal without the scope it reads", "guard", ops, call("run_query", `{"query":"select 1"}`), nil, 403, ReasonScope, ""},
		{"an allow rule missing its argument grants nothing", "guard", db, call("run_query", `{}`), nil, 403, ReasonScope, ""},
		{"an allow rule over an argument of another type grants nothing", "guard", db, call("run_query", `{"query":["select 1"]}`), nil, 403, ReasonScope, ""},
		{"a 2026-07-28 Mcp-Name that differs is refused", "guard", ops, call("deploy", `{"environment":"production"}`), modern("tools/call", "test_simple_text"), 400, "header_mismatch", ""},
		{"a JWT's claims deny", "guard", policy.Principal{TokenID: "jwt:a", Kind: policy.KindUser, Scopes: []string{"ops"}, Claims: b64(`{"sub":"a","env":"prod"}`)}, call("test_simple_text", `{}`), nil, 403, ReasonRule, "site policy, rule 3"},
		{"other claims do not", "guard", policy.Principal{TokenID: "jwt:a", Kind: policy.KindUser, Scopes: []string{"ops"}, Claims: b64(`{"sub":"a","env":"dev"}`)}, call("test_simple_text", `{}`), nil, 0, "", ""},
		// Sessions: an allow rule never admits a machine token.
		{"an allow rule grants a verb", "sessions", principal(policy.KindUser, "read", "creator"), call("sessions", `{"verb":"create","prompt":"hi"}`), nil, 0, "", "site policy, rule 2"},
		{"never to a machine token", "sessions", principal(policy.KindMachine, "read", "creator"), call("sessions", `{"verb":"create","prompt":"hi"}`), nil, 403, ReasonMachine, ""},
		// Pass-through: an allow rule never offers what the lists keep back.
		{"an allow rule admits to the route's upstream", "passthrough", db, call("echo", `{"query":"select 1"}`), nil, 0, "", "site policy, rule 1"},
		{"never a tool its lists keep back", "passthrough", db, call("drop_all", `{"query":"select 1"}`), nil, 403, "tool_not_offered", ""},
		{"a deny rule holds for a token with every scope", "passthrough", principal(policy.KindUser, "upstream:a"), call("deploy", `{"environment":"production"}`), nil, 403, ReasonRule, "global policy, rule 1"},
		// Egress: an allow rule never opens a session_upstream to a token
		// that is not its sessions' agents'; a deny rule still holds.
		{"an allow rule grants nothing on an egress route", "egress", db, call("echo", `{"query":"select 1"}`), nil, 403, ReasonScope, ""},
		{"a deny rule holds on an egress route", "egress", principal(policy.KindMachine, "upstream:a"), call("deploy", `{"environment":"production"}`), nil, 403, ReasonRule, "global policy, rule 1"},
		// Aggregate: an allow rule grants a call of one upstream only.
		{"an allow rule admits to the tool's upstream", "aggregate", principal(policy.KindUser, "db", "upstream:b"), call("mcp_a_secret", `{"query":"select 1"}`), nil, 0, "", "site policy, rule 1"},
		{"never a resource two upstreams may serve", "aggregate", principal(policy.KindUser, "upstream:b"), `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"any://1"}}`, nil, 403, ReasonScope, ""},
		{"never a listing of no upstream", "aggregate", principal(policy.KindUser, "db"), `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, nil, 403, ReasonScope, ""},
		{"never a tool no upstream offers", "aggregate", principal(policy.KindUser, "db"), call("echo", `{"query":"select 1"}`), nil, 403, ReasonScope, ""},
	}
	for _, tc := range cases {
		t.Run(tc.route+"/"+tc.name, func(t *testing.T) {
			header := tc.header
			if header == nil {
				header = http.Header{}
			}
			d := Decide(routes[tc.route], tc.p, http.MethodPost, header, []byte(tc.body))
			if d.Status != tc.status || d.Reason != tc.reason {
				t.Fatalf("got %d %q (%s), want %d %q", d.Status, d.Reason, d.Message, tc.status, tc.reason)
			}
			rule := d.Rule
			if d.Allowed() && len(d.Ruled) > 0 {
				rule = d.Ruled[0].Rule
			}
			if rule != tc.rule {
				t.Fatalf("decided by %q, want %q", rule, tc.rule)
			}
			if d.Reason == ReasonRule && (strings.Contains(d.Message, "args.") || strings.Contains(d.Message, "==")) {
				t.Fatalf("the refusal shows the rule: %s", d.Message)
			}
		})
	}
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// TestRulesRefusalSaysTheMessage: the caller reads the rule's message and
// nothing of its expression; the audit gets the rule's place.
func TestRulesRefusalSaysTheMessage(t *testing.T) {
	routes := ruledRoutes(t)
	d := Decide(routes["guard"], principal(policy.KindUser, "ops"), http.MethodPost, http.Header{}, []byte(call("deploy", `{"environment":"production"}`)))
	if d.Message != "production deploys are refused here" || d.RuleEffect != "deny" || d.Rule != "global policy, rule 1" {
		t.Fatalf("%+v", d.Verdict)
	}
}

// TestRulesVisibleAgreesWithAuthorize: with the rules on, an item is
// listed when a call of it may be allowed, on every route.
func TestRulesVisibleAgreesWithAuthorize(t *testing.T) {
	routes := ruledRoutes(t)
	cases := []struct {
		route string
		p     policy.Principal
		item  Item
		shown bool
	}{
		{"guard", principal(policy.KindUser, "ops"), Item{KindTool, "drop_table"}, false},    // denied whatever the arguments
		{"guard", principal(policy.KindUser, "ops"), Item{KindTool, "deploy"}, true},         // denied on some arguments only
		{"guard", principal(policy.KindUser, "db"), Item{KindTool, "run_query"}, true},       // an allow rule may hold
		{"guard", principal(policy.KindUser, "ops"), Item{KindTool, "run_query"}, false},     // no scope, no rule
		{"guard", principal(policy.KindUser, "ops"), Item{KindPrompt, "plan"}, true},         // denied on some arguments only
		{"passthrough", principal(policy.KindUser, "db"), Item{KindTool, "echo"}, true},      // the allow rule
		{"passthrough", principal(policy.KindUser, "db"), Item{KindTool, "drop_all"}, false}, // the deny list
		{"aggregate", principal(policy.KindUser, "db"), Item{KindTool, "mcp_a_secret"}, true},
		{"aggregate", principal(policy.KindUser, "db"), Item{KindTool, "mcp_b_echo"}, false},
		{"aggregate", principal(policy.KindUser, "upstream:b"), Item{KindResource, "file:///b/readme"}, true},
		{"sessions", principal(policy.KindUser, "creator"), Item{KindTool, "sessions"}, true},
	}
	for _, tc := range cases {
		rt := routes[tc.route]
		if got := rt.Visible(tc.p, tc.item); got != tc.shown {
			t.Errorf("%s %v to %v: shown %v, want %v", tc.route, tc.item, tc.p.Scopes, got, tc.shown)
		}
		if tc.item.Kind == KindTool && tc.item.Name != "deploy" && tc.item.Name != "run_query" && tc.item.Name != "mcp_a_secret" && tc.item.Name != "echo" && tc.item.Name != "sessions" {
			// A call that reads no argument: the listing and the call agree.
			if got := rt.Authorize(tc.p, tc.item.Use()).Allowed(); got != tc.shown {
				t.Errorf("%s %v: Authorize %v, Visible %v", tc.route, tc.item, got, tc.shown)
			}
		}
	}
}

// benchRuleSet is the five rules of the benchmark (bench -rules).
func benchRuleSet(b testing.TB) *rules.Set {
	s, err := rules.Compile([]rules.Spec{
		{Effect: rules.Deny, Expr: "tool.name == 'drop_table'", Message: "m", Where: "r1"},
		{Effect: rules.Deny, Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "m", Where: "r2"},
		{Effect: rules.Deny, Expr: `tool.name == 'echo' && args.message.matches('(?i)\\b(drop|truncate)\\b')`, Message: "m", Where: "r3"},
		{Effect: rules.Deny, Expr: "'readonly' in principal.scopes && tool.name.startsWith('write_')", Message: "m", Where: "r4"},
		{Effect: rules.Allow, Expr: "'db' in principal.scopes && tool.name == 'run_query'", Where: "r5"},
	})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkGuardAuthorizeRules is what five rules add to a guard's
// decision of one tool call: the same call without rules, then with.
func BenchmarkGuardAuthorizeRules(b *testing.B) {
	scopes, err := policy.NewScopeMap(nil, true)
	if err != nil {
		b.Fatal(err)
	}
	p := principal(policy.KindUser, "mcp")
	body := []byte(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hello"}}}`)
	for _, bc := range []struct {
		name string
		set  *rules.Set
	}{{"none", nil}, {"five", benchRuleSet(b)}} {
		g := &Guard{Scopes: scopes, Rules: bc.set}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if d := Decide(g, p, http.MethodPost, http.Header{}, body); !d.Allowed() {
					b.Fatal(d.Message)
				}
			}
		})
	}
}

// TestRulesAggregateUpstreamOfEveryOwner: on the aggregated route, a call
// that several upstreams could serve (a resource two upstreams claim), or
// that no upstream offers yet (one may by the time the route looks it
// up), reaches an upstream the decision did not name. A deny rule over
// `upstream` refuses it when it refuses it for any upstream that could
// serve it, and hides such a resource from the listing.
func TestRulesAggregateUpstreamOfEveryOwner(t *testing.T) {
	set, err := rules.Compile([]rules.Spec{{Effect: rules.Deny, Expr: "upstream == 'a'", Message: "nothing goes to a here", Where: "global policy, rule 1"}})
	if err != nil {
		t.Fatal(err)
	}
	allows := func(p policy.Principal, name string) bool { return p.HasScope(policy.UpstreamScope(name)) }
	agg := &Aggregate{Catalog: testCatalog(), Allows: allows, Rules: set}
	both := principal(policy.KindUser, "upstream:a", "upstream:b")
	cases := []struct {
		name, body string
		status     int
		reason     string
	}{
		{"a resource a and b may serve", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"any://1"}}`, 403, ReasonRule},
		{"a subscription to it", `{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":"any://1"}}`, 403, ReasonRule},
		{"a tool no upstream offers yet", call("mcp_a_new", `{}`), 403, ReasonRule},
		{"a prompt no upstream offers yet", `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"mcp_a_new"}}`, 403, ReasonRule},
		{"a tool of a", call("mcp_a_secret", `{}`), 403, ReasonRule},
		{"a tool of b alone goes on", call("mcp_b_echo", `{}`), 0, ""},
		{"a resource of b alone goes on", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"b://1"}}`, 0, ""},
		{"a listing goes on (its items are filtered)", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(agg, both, http.MethodPost, http.Header{}, []byte(tc.body))
			if d.Status != tc.status || d.Reason != tc.reason {
				t.Fatalf("got %d %q (%s), want %d %q", d.Status, d.Reason, d.Message, tc.status, tc.reason)
			}
		})
	}
	if agg.Visible(both, Item{Kind: KindResource, Name: "any://1"}) {
		t.Error("a resource a may serve is listed")
	}
	if !agg.Visible(both, Item{Kind: KindResource, Name: "b://1"}) {
		t.Error("a resource of b alone is hidden")
	}
}
