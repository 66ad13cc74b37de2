package rules

import (
	"errors"
	"strings"
	"testing"
)

// The issue's own example, as a set.
func exampleSet(t *testing.T) *Set {
	t.Helper()
	s, err := Compile([]Spec{
		{Effect: Deny, Expr: "tool.name == 'drop_table'", Message: "dropping tables is not allowed here", Where: "rule 1"},
		{Effect: Approve, Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "production deploys need a second person", Where: "rule 2"},
		{Effect: Allow, Expr: `'db' in principal.scopes && !args.query.matches('(?i)\\b(drop|truncate)\\b')`, Where: "rule 3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func call(tool, args string, scopes ...string) Input {
	return Input{Principal: Principal{Owner: "alice", Token: "tok_a", Kind: "user", Source: "token", Scopes: scopes},
		Method: "tools/call", Tool: tool, Arguments: []byte(args)}
}

func TestDecide(t *testing.T) {
	s := exampleSet(t)
	cases := []struct {
		name   string
		in     Input
		effect Effect
		rule   string
		failed bool
	}{
		{"a denied tool", call("drop_table", `{}`, "db", "mcp"), Deny, "rule 1", false},
		{"a production deploy is held", call("deploy", `{"environment":"production"}`, "mcp"), Approve, "rule 2", false},
		{"the neighbouring staging deploy goes to the scopes", call("deploy", `{"environment":"staging"}`, "mcp"), "", "", false},
		{"a production deploy spelled with an escape is the same call", call("deploy", `{"environment":"produ\u0063tion"}`, "mcp"), Approve, "rule 2", false},
		{"a deploy without the argument fails closed", call("deploy", `{}`, "mcp"), Deny, "rule 2", true},
		// A value of another type equals no string: the rule does not
		// hold. docs/policy.md says to deny the other types where a
		// backend would take them (type(args.environment) != string).
		{"a deploy with the argument of another type is not that value", call("deploy", `{"environment":["production"]}`, "mcp"), "", "", false},
		{"a read query by a db principal is allowed", call("run_query", `{"query":"select 1"}`, "db"), Allow, "rule 3", false},
		{"a drop query is not allowed by the rule", call("run_query", `{"query":"DROP table x"}`, "db"), "", "", false},
		{"a drop query in another case", call("run_query", `{"query":"Truncate x"}`, "db"), "", "", false},
		{"a query by a principal without db", call("run_query", `{"query":"select 1"}`, "read"), "", "", false},
		{"an allow rule missing its argument does not hold", call("list_tables", `{}`, "db"), "", "", false},
		{"arguments that are an array deny", call("run_query", `[1]`, "db"), Deny, "rule 1", true},
		{"arguments that are a string deny", call("run_query", `"x"`, "db"), Deny, "rule 1", true},
		{"no arguments is an empty object", call("list_tables", ``, "db"), "", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := s.Decide(c.in)
			if v.Effect != c.effect {
				t.Fatalf("effect %q (%v), want %q", v.Effect, v.Err, c.effect)
			}
			if c.rule == "" && v.Rule != nil || c.rule != "" && (v.Rule == nil || v.Rule.Where != c.rule) {
				t.Fatalf("rule %+v, want %q", v.Rule, c.rule)
			}
			if (v.Err != nil) != c.failed {
				t.Fatalf("err %v, want failed=%v", v.Err, c.failed)
			}
		})
	}
}

func TestDenyWinsWhateverTheOrder(t *testing.T) {
	s, err := Compile([]Spec{
		{Effect: Allow, Expr: "true", Where: "allow all"},
		{Effect: Approve, Expr: "true", Message: "held", Where: "approve all"},
		{Effect: Deny, Expr: "tool.name == 'x'", Message: "no x", Where: "deny x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := s.Decide(call("x", `{}`)); v.Effect != Deny || v.Rule.Where != "deny x" {
		t.Fatalf("%+v", v)
	}
	if v := s.Decide(call("y", `{}`)); v.Effect != Approve {
		t.Fatalf("approve does not win over allow: %+v", v)
	}
}

// TestEveryVariable: each variable reads what the input holds.
func TestEveryVariable(t *testing.T) {
	in := Input{
		Principal: Principal{Owner: "alice@example.com", Token: "grt_1", Kind: "user", Source: "grant", Client: "https://app.example/c.json",
			Scopes: []string{"db", "deploy"}},
		Claims: map[string]any{"groups": []any{"eng", "admin"}, "email_verified": true},
		Method: "tools/call", Tool: "deploy", Prompt: "", URI: "",
		Arguments: []byte(`{"environment":"production","replicas":3,"ratio":0.5,"tags":["a","b"],"spec":{"image":"x:1"}}`),
		Upstream:  "ci", Route: "broker",
	}
	holds := []string{
		"principal.owner == 'alice@example.com'",
		"principal.token == 'grt_1'",
		"principal.kind == 'user'",
		"principal.source == 'grant'",
		"principal.client.startsWith('https://app.example/')",
		"'deploy' in principal.scopes && size(principal.scopes) == 2",
		"'admin' in claims.groups",
		"claims.email_verified == true",
		"method == 'tools/call'",
		"tool.name == 'deploy'",
		"prompt.name == ''",
		"resource.uri == ''",
		"upstream == 'ci' && route == 'broker'",
		"args.replicas == 3 && args.replicas > 2 && args.replicas < 3.5",
		"args.ratio == 0.5 && args.ratio < 1",
		"args.tags.exists(t, t == 'b')",
		"args.spec.image.endsWith(':1')",
		"has(args.environment) && !has(args.region)",
		"args.?region.orValue('eu') == 'eu'",
	}
	for _, e := range holds {
		s, err := Compile([]Spec{{Effect: Allow, Expr: e, Where: e}})
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		if v := s.Decide(in); v.Effect != Allow {
			t.Errorf("%s does not hold: %+v", e, v)
		}
	}
	prompt := Input{Method: "prompts/get", Prompt: "summarize", Arguments: []byte(`{"topic":"x"}`)}
	res := Input{Method: "resources/read", URI: "file:///etc/passwd"}
	for e, in := range map[string]Input{
		"prompt.name == 'summarize' && args.topic == 'x'": prompt,
		"resource.uri.startsWith('file:///etc/')":         res,
	} {
		s, err := Compile([]Spec{{Effect: Deny, Expr: e, Message: "no", Where: e}})
		if err != nil {
			t.Fatal(err)
		}
		if v := s.Decide(in); v.Effect != Deny || v.Err != nil {
			t.Errorf("%s: %+v", e, v)
		}
	}
}

// TestCompileRefusals: every rule the config could get wrong is refused
// when it loads, naming the rule and what is wrong.
func TestCompileRefusals(t *testing.T) {
	cases := []struct {
		spec Spec
		want string
	}{
		{Spec{Effect: Deny, Expr: "tool.name == ", Message: "m"}, "does not compile"},
		{Spec{Effect: Deny, Expr: "tol.name == 'x'", Message: "m"}, "undeclared reference to 'tol'"},
		{Spec{Effect: Deny, Expr: "tool.nom == 'x'", Message: "m"}, "undefined field 'nom'"},
		{Spec{Effect: Deny, Expr: "principal.email == 'x'", Message: "m"}, "undefined field 'email'"},
		{Spec{Effect: Deny, Expr: "tool.name", Message: "m"}, "not a bool"},
		{Spec{Effect: Deny, Expr: "tool.name == 1", Message: "m"}, "does not compile"},
		{Spec{Effect: Deny, Expr: "true"}, "needs a message"},
		{Spec{Effect: Approve, Expr: "true", Message: "  "}, "needs a message"},
		{Spec{Effect: "permit", Expr: "true"}, "is no effect"},
		{Spec{Effect: Deny, Expr: "true", Message: "m", Self: true}, "self applies to approve"},
		{Spec{Effect: Allow, Expr: " "}, "no expression"},
		{Spec{Effect: Allow, Expr: "args.q.matches('(')"}, "error parsing regexp"},
	}
	for _, c := range cases {
		c.spec.Where = "site policy, rule 4"
		_, err := Compile([]Spec{c.spec})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "site policy, rule 4") {
			t.Errorf("%q: %v, want %q and the rule's place", c.spec.Expr, err, c.want)
		}
	}
}

// TestCostLimitDenies: a rule that would loop over a large argument is
// stopped at the limit, and denies, whatever its effect.
func TestCostLimitDenies(t *testing.T) {
	items := "[" + strings.Repeat(`"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",`, 20000) + `"a"]`
	for _, effect := range []Effect{Allow, Deny, Approve} {
		s, err := Compile([]Spec{{Effect: effect, Expr: "args.items.all(x, args.items.all(y, y != x + 'b'))", Message: "m", Where: "heavy"}})
		if err != nil {
			t.Fatal(err)
		}
		v := s.Decide(call("t", `{"items":`+items+`}`))
		if v.Effect != Deny || v.Err == nil || !overCost(v.Err) {
			t.Fatalf("%s: %+v, want a deny over the cost limit", effect, v)
		}
	}
}

func TestBigNumbersFailClosed(t *testing.T) {
	s, err := Compile([]Spec{{Effect: Deny, Expr: "args.n > 10", Message: "too many", Where: "n"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"11", "10.5", "9223372036854775808", "1e400"} {
		v := s.Decide(call("t", `{"n":`+n+`}`))
		if v.Effect != Deny {
			t.Errorf("n=%s: %+v, want deny", n, v)
		}
	}
	if v := s.Decide(call("t", `{"n":3}`)); v.Effect != "" {
		t.Errorf("n=3: %+v", v)
	}
}

func TestListed(t *testing.T) {
	s, err := Compile([]Spec{
		{Effect: Deny, Expr: "tool.name == 'drop_table'", Message: "m", Where: "1"},
		{Effect: Deny, Expr: "principal.kind == 'machine' && tool.name.startsWith('deploy')", Message: "m", Where: "2"},
		{Effect: Deny, Expr: "tool.name == 'delete' && args.force == true", Message: "m", Where: "3"},
		{Effect: Approve, Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "m", Where: "4"},
		{Effect: Allow, Expr: "'db' in principal.scopes && tool.name == 'run_query' && !args.query.matches('drop')", Where: "5"},
	})
	if err != nil {
		t.Fatal(err)
	}
	list := func(tool, kind string, scopes ...string) Input {
		return Input{Principal: Principal{Kind: kind, Scopes: scopes}, Method: "tools/call", Tool: tool}
	}
	cases := []struct {
		in   Input
		want Effect
	}{
		{list("drop_table", "user", "mcp"), Deny},
		{list("deploy_prod", "machine", "mcp"), Deny},
		{list("deploy", "user", "mcp"), ""},
		{list("delete", "user", "mcp"), ""},
		{list("run_query", "user", "db"), Allow},
		{list("run_query", "user", "read"), ""},
		{list("other", "user"), ""},
	}
	for _, c := range cases {
		if got := s.Listed(c.in); got != c.want {
			t.Errorf("%s as %s %v: %q, want %q", c.in.Tool, c.in.Principal.Kind, c.in.Principal.Scopes, got, c.want)
		}
	}
}

func TestJoinKeepsGlobalRulesFirst(t *testing.T) {
	g, err := Compile([]Spec{{Effect: Approve, Expr: "true", Message: "global", Where: "global"}})
	if err != nil {
		t.Fatal(err)
	}
	site, err := Compile([]Spec{{Effect: Approve, Expr: "true", Message: "site", Where: "site"}})
	if err != nil {
		t.Fatal(err)
	}
	if v := Join(g, site).Decide(call("t", `{}`)); v.Rule.Where != "global" {
		t.Fatalf("%+v", v)
	}
	if Join(nil, site) != site || Join(g, nil) != g || Join(nil, nil).Len() != 0 {
		t.Fatal("joining an empty set changed the other")
	}
	if v := (*Set)(nil).Decide(call("t", `{}`)); v.Effect != "" {
		t.Fatalf("no rules decided: %+v", v)
	}
}

// TestArgumentsError: arguments that do not read (which the edge's reader
// never passes on) fail every rule that reads them closed.
func TestArgumentsError(t *testing.T) {
	s := exampleSet(t)
	v := s.Decide(call("deploy", `{"environment":`))
	if v.Effect != Deny || v.Rule.Where != "rule 2" || !errors.Is(v.Err, ErrArguments) {
		t.Fatalf("%+v", v)
	}
	if v := s.Decide(call("run_query", `{"query":`, "db")); v.Effect != "" {
		t.Fatalf("an allow rule held on arguments that do not read: %+v", v)
	}
}

// BenchmarkDecide measures the rules on a call: one typical rule over one
// argument, and five rules, against no rules (the baseline in the same
// run).
func BenchmarkDecide(b *testing.B) {
	in := call("deploy", `{"environment":"staging","service":"api","replicas":3}`, "mcp", "deploy")
	one, err := Compile([]Spec{{Effect: Approve, Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "m", Where: "1"}})
	if err != nil {
		b.Fatal(err)
	}
	five, err := Compile([]Spec{
		{Effect: Deny, Expr: "tool.name == 'drop_table'", Message: "m", Where: "1"},
		{Effect: Deny, Expr: "principal.kind == 'machine' && tool.name.startsWith('deploy')", Message: "m", Where: "2"},
		{Effect: Approve, Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "m", Where: "3"},
		{Effect: Deny, Expr: "tool.name == 'deploy' && args.?replicas.orValue(1) > 10", Message: "m", Where: "4"},
		{Effect: Allow, Expr: "'deploy' in principal.scopes && args.?service.orValue('') in ['api', 'web']", Where: "5"},
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		set  *Set
	}{{"none", nil}, {"one", one}, {"five", five}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = c.set.Decide(in)
			}
		})
	}
}
