package rules

import (
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"
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
		{Spec{Effect: Deny, Expr: "tol.name == 'x'", Message: "m"}, "undeclared reference to 'tol.name' (did you mean 'tool.name'?)"},
		{Spec{Effect: Deny, Expr: "tool.nom == 'x'", Message: "m"}, "undeclared reference to 'tool.nom' (did you mean 'tool.name'?)"},
		{Spec{Effect: Deny, Expr: "principal.email == 'x'", Message: "m"}, "undeclared reference to 'principal.email' (did you mean"},
		{Spec{Effect: Deny, Expr: "principal == 'x'", Message: "m"}, "(the variables are principal.owner, .token, .kind, .source, .client and .scopes)"},
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

// TestArgumentsAsTheBackendReadsThem: the arguments are read as every
// backend reads them, or the rules reading them fail closed.
func TestArgumentsAsTheBackendReadsThem(t *testing.T) {
	s, err := Compile([]Spec{
		{Effect: Deny, Expr: "tool.name == 'deploy' && has(args.environment) && args.environment == 'production'", Message: "no production", Where: "env"},
		{Effect: Deny, Expr: "tool.name == 'cfg' && has(args.config.env) && args.config.env == 'prod'", Message: "no prod", Where: "nested"},
		{Effect: Deny, Expr: "tool.name == 'scale' && args.replicas > 10", Message: "too many", Where: "number"},
		{Effect: Deny, Expr: "tool.name == 'one' && args.n == 1", Message: "not one", Where: "one"},
		{Effect: Deny, Expr: "tool.name == 'tag' && args.tags.exists(t, t == 'prod')", Message: "no prod tag", Where: "list"},
		{Effect: Deny, Expr: "tool.name == 'keys' && args.exists(k, k.startsWith('danger'))", Message: "no danger", Where: "keys"},
		{Effect: Allow, Expr: "tool.name == 'read' && args.path.startsWith('/srv/public/')", Where: "path"},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		in     Input
		effect Effect
		rule   string
		failed bool
	}{
		{"the key as the rule spells it", call("deploy", `{"environment":"production"}`), Deny, "env", false},
		{"another value", call("deploy", `{"environment":"staging"}`), "", "", false},
		{"an escaped key is the key", call("deploy", `{"\u0065nvironment":"production"}`), Deny, "env", false},
		{"an escaped value is the value", call("deploy", `{"environment":"produ\u0063tion"}`), Deny, "env", false},
		{"a key in another case fails closed", call("deploy", `{"Environment":"production"}`), Deny, "env", true},
		{"a key with a long s, which Go folds to s, fails closed", call("scale", `{"replica\u017f":11}`), Deny, "number", true},
		{"a nested key in another case fails closed", call("cfg", `{"config":{"ENV":"prod"}}`), Deny, "nested", true},
		{"a nested key", call("cfg", `{"config":{"env":"prod"}}`), Deny, "nested", false},
		{"a key given twice fails closed", call("deploy", `{"environment":"staging","environment":"production"}`), Deny, "env", true},
		{"an int", call("scale", `{"replicas":11}`), Deny, "number", false},
		{"a number spelled with an exponent", call("scale", `{"replicas":1.1e1}`), Deny, "number", false},
		{"a number with a fraction", call("scale", `{"replicas":10.5}`), Deny, "number", false},
		{"a number beyond a double fails closed", call("scale", `{"replicas":1e400}`), Deny, "number", true},
		{"a string where a number is read fails closed", call("scale", `{"replicas":"11"}`), Deny, "number", true},
		{"1e0 is 1", call("one", `{"n":1e0}`), Deny, "one", false},
		{"1.0 is 1", call("one", `{"n":1.0}`), Deny, "one", false},
		{"-0 is not 1", call("one", `{"n":-0}`), "", "", false},
		{"a list", call("tag", `{"tags":["dev","prod"]}`), Deny, "list", false},
		{"the keys", call("keys", `{"safe":1,"danger_zone":2}`), Deny, "keys", false},
		{"a path the allow rule holds for", call("read", `{"path":"/srv/public/a.txt"}`), Allow, "path", false},
		{"a path it does not", call("read", `{"path":"/etc/passwd"}`), "", "", false},
		{"a path in another case grants nothing", call("read", `{"Path":"/srv/public/a.txt"}`), "", "", false},
		{"a path of another type grants nothing", call("read", `{"path":["/srv/public/a.txt"]}`), "", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := s.Decide(c.in)
			if v.Effect != c.effect || (v.Rule == nil) != (c.rule == "") || (v.Rule != nil && v.Rule.Where != c.rule) || (v.Err != nil) != c.failed {
				t.Fatalf("got %q %+v (err %v), want %q by %q failed=%v", v.Effect, v.Rule, v.Err, c.effect, c.rule, c.failed)
			}
		})
	}
}

// TestClaims: a JWT's claims are read as the arguments are.
func TestClaims(t *testing.T) {
	s, err := Compile([]Spec{{Effect: Deny, Expr: "claims.department != 'ops'", Message: "ops only", Where: "dept"}})
	if err != nil {
		t.Fatal(err)
	}
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, c := range []struct {
		payload string
		effect  Effect
		failed  bool
	}{
		{`{"sub":"a","department":"ops"}`, "", false},
		{`{"sub":"a","department":"sales"}`, Deny, false},
		{`{"sub":"a"}`, Deny, true},
		{`{"sub":"a","Department":"ops"}`, Deny, true},
		{`{"sub":"a","department":"sales","department":"ops"}`, Deny, true},
		{`[1]`, Deny, true},
	} {
		v := s.Decide(Input{Method: "tools/call", Tool: "x", ClaimsJWT: enc(c.payload)})
		if v.Effect != c.effect || (v.Err != nil) != c.failed {
			t.Errorf("%s: %q (err %v), want %q failed=%v", c.payload, v.Effect, v.Err, c.effect, c.failed)
		}
	}
	// Claims two readers read differently fail every rule over claims
	// closed, iterating ones too, which read an object with a key twice
	// as empty: the token's verifier (encoding/json) takes the last of
	// two keys.
	s, err = Compile([]Spec{{Effect: Deny, Expr: "claims.exists(k, k == 'suspended') || claims.roles.exists(r, r == 'guest')", Message: "not you", Where: "iter"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		payload string
		effect  Effect
		failed  bool
	}{
		{`{"sub":"a","roles":["dev"]}`, "", false},
		{`{"sub":"a","roles":["guest"]}`, Deny, false},
		{`{"sub":"a","suspended":true,"roles":["dev"]}`, Deny, false},
		{`{"sub":"a","suspended":true,"suspended":true,"roles":["dev"]}`, Deny, true},
		{`{"sub":"a","roles":["dev"],"x":{"y":1,"y":2}}`, Deny, true},
		{`{"sub":"a","roles":["dev"],"__proto__":{}}`, Deny, true},
	} {
		v := s.Decide(Input{Method: "tools/call", Tool: "x", ClaimsJWT: enc(c.payload)})
		if v.Effect != c.effect || (v.Err != nil) != c.failed {
			t.Errorf("%s: %q (err %v), want %q failed=%v", c.payload, v.Effect, v.Err, c.effect, c.failed)
		}
	}
}

// TestToolTerms: a rule that names its tools in a term of a conjunction is
// not evaluated for other tools, and decides every call as it would if it
// were.
func TestToolTerms(t *testing.T) {
	specs := []Spec{
		{Effect: Deny, Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "m", Where: "eq"},
		{Effect: Deny, Expr: "args.force == true && 'drop' == tool.name", Message: "m", Where: "eq reversed"},
		{Effect: Deny, Expr: "method == 'tools/call' && tool.name in ['rm', 'mv'] && args.path.startsWith('/etc')", Message: "m", Where: "in"},
		{Effect: Allow, Expr: "tool.name == 'q' || args.x == 1", Where: "or"},
		{Effect: Deny, Expr: "!(tool.name == 'safe') && args.y == 2", Message: "m", Where: "not"},
		{Effect: Deny, Expr: "!(tool.name != 'kill') && args.z == 3", Message: "m", Where: "not not"},
		{Effect: Deny, Expr: "tool.name in args.banned", Message: "m", Where: "in args"},
		{Effect: Deny, Expr: "(tool.name == 'a' || args.w == 4) && args.v == 5", Message: "m", Where: "or in and"},
	}
	s, err := Compile(specs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"eq": {"deploy"}, "eq reversed": {"drop"}, "in": {"rm", "mv"}}
	for _, r := range s.rules {
		if !slices.Equal(r.tools, want[r.Where]) {
			t.Errorf("%s: tools %v, want %v", r.Where, r.tools, want[r.Where])
		}
	}
	// The same rules with no tool terms: every rule evaluated.
	full, err := Compile(specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range full.rules {
		r.tools = nil
	}
	for _, in := range []Input{
		call("deploy", `{"environment":"production"}`), call("deploy", `{}`), call("other", `{}`),
		call("drop", `{"force":true}`), call("rm", `{"path":"/etc/x"}`), call("mv", `{}`), call("cp", `{"path":"/etc"}`),
		call("q", `{}`), call("safe", `{"y":2}`), call("other", `{"y":2}`), call("other", `{"x":1}`),
		call("kill", `{"z":3}`), call("other", `{"z":3}`), call("other", `{"banned":["other"]}`),
		call("b", `{"w":4,"v":5}`), call("a", `{"v":5}`),
	} {
		a, b := s.Decide(in), full.Decide(in)
		if a.Effect != b.Effect || a.Rule != nil && b.Rule != nil && a.Rule.Where != b.Rule.Where || (a.Err == nil) != (b.Err == nil) {
			t.Errorf("%s %s: %q %v, evaluated whole %q %v", in.Tool, in.Arguments, a.Effect, a.Err, b.Effect, b.Err)
		}
	}
}

// TestIntegersReadersRound: JavaScript (the TypeScript SDK's server reads
// with JSON.parse) rounds an integer beyond ±(2^53-1) to a double, where Go
// and Python read it exactly. A rule comparing such an integer cannot read
// it as every backend does, so it fails closed: a caller sending a
// neighbour of a denied id, which a JavaScript server reads as that id, is
// refused, and no allow rule holds on one.
func TestIntegersReadersRound(t *testing.T) {
	s, err := Compile([]Spec{
		{Effect: Deny, Expr: "tool.name == 'post' && args.channel == 1234567890123456768", Message: "not that channel", Where: "channel"},
		{Effect: Deny, Expr: "tool.name == 'any' && 1234567890123456768 in args.channels", Message: "not that channel", Where: "list"},
		{Effect: Allow, Expr: "tool.name == 'read' && args.id == 1234567890123456790", Where: "allow id"},
		{Effect: Deny, Expr: "tool.name == 'small' && args.n == 9007199254740991", Message: "not n", Where: "small"},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		in     Input
		effect Effect
		failed bool
	}{
		{"a neighbour that JavaScript reads as the denied id", call("post", `{"channel":1234567890123456790}`), Deny, true},
		{"the denied id itself", call("post", `{"channel":1234567890123456768}`), Deny, true},
		{"a negative one", call("post", `{"channel":-9007199254740993}`), Deny, true},
		{"in a list", call("any", `{"channels":[1,1234567890123456790]}`), Deny, true},
		{"an allow rule holds on no such integer", call("read", `{"id":1234567890123456790}`), "", false},
		{"the largest integer every reader reads alike", call("small", `{"n":9007199254740991}`), Deny, false},
		{"the same as a double", call("small", `{"n":9007199254740991.0}`), Deny, false},
		{"another small integer", call("small", `{"n":9007199254740990}`), "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := s.Decide(c.in)
			if v.Effect != c.effect || (v.Err != nil) != c.failed {
				t.Fatalf("got %q (err %v), want %q failed=%v", v.Effect, v.Err, c.effect, c.failed)
			}
		})
	}
}

// TestRuleErrorsHoldNoValues: why a rule failed goes to the audit line;
// the caller's values (a token passed as an argument) never do.
func TestRuleErrorsHoldNoValues(t *testing.T) {
	s, err := Compile([]Spec{
		{Effect: Deny, Expr: "tool.name == 'conv' && int(args.n) > 5", Message: "too many", Where: "conv"},
		{Effect: Deny, Expr: "tool.name == 're' && args.x.matches(args.p)", Message: "no match", Where: "re"},
		{Effect: Deny, Expr: "tool.name == 'idx' && args[args.k] == 1", Message: "no idx", Where: "idx"},
		{Effect: Deny, Expr: "tool.name == 'ts' && timestamp(args.t) > timestamp('2020-01-01T00:00:00Z')", Message: "no ts", Where: "ts"},
		{Effect: Deny, Expr: "tool.name == 'case' && args.environment == 'x'", Message: "no env", Where: "case"},
	})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "sk_live_s3cr3t"
	for _, in := range []Input{
		call("conv", `{"n":"`+secret+`"}`),
		call("re", `{"x":"a","p":"(`+secret+`"}`),
		call("idx", `{"k":"`+secret+`"}`),
		call("ts", `{"t":"`+secret+`"}`),
		call("case", `{"Environment`+secret+`":1,"ENVIRONMENT":"`+secret+`"}`),
	} {
		v := s.Decide(in)
		if v.Effect != Deny || v.Err == nil {
			t.Errorf("%s: %q (err %v), want a deny that failed closed", in.Tool, v.Effect, v.Err)
			continue
		}
		if strings.Contains(v.Err.Error(), secret) || strings.Contains(v.Err.Error(), "s3cr3t") {
			t.Errorf("%s: the error %q holds the caller's value", in.Tool, v.Err)
		}
	}
}

// TestLookupsScanOnce: a rule whose cost CEL bounds runs untracked, yet
// each read of an argument reads the object's text: a rule reading one
// argument in a loop over a list it writes (a deny list of values, of
// keys) must not scan a large body once per element, which would make a
// caller's 1 MiB body cost the gateway gigabytes of reading per call.
func TestLookupsScanOnce(t *testing.T) {
	values := make([]string, 2000)
	for i := range values {
		values[i] = "'v" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "'"
	}
	list := "[" + strings.Join(values, ",") + "]"
	args := `{"pad":"` + strings.Repeat("p", 64<<10) + `","x":"zzz","cfg":{"env":"dev"}}`
	for _, expr := range []string{
		list + ".exists(e, args.x == e)",
		list + ".exists(e, e in args)",
		list + ".exists(e, args.cfg.env == e)",
	} {
		s, err := Compile([]Spec{{Effect: Deny, Expr: expr, Message: "m", Where: "1"}})
		if err != nil {
			t.Fatal(err)
		}
		act := &activation{in: call("t", args), withArgs: true}
		out, _, err := s.rules[0].prg.Eval(act)
		if holds, failed := result(out, err); holds || failed != nil {
			t.Fatalf("%.40s…: holds %v, failed %v", expr, holds, failed)
		}
		if n := act.args.(*jsonObject).scans; n > scansBeforeIndex+1 {
			t.Errorf("%.40s…: the arguments were scanned %d times for 2000 reads", expr, n)
		}
	}
}

// TestIndexAnswersAsLookup: past its first lookups an object is indexed;
// the index answers each key as reading the text does, errors included.
func TestIndexAnswersAsLookup(t *testing.T) {
	for _, obj := range []string{
		`{}`, `{"environment":"production"}`, `{"Environment":"production"}`, `{"environment":1,"environment":2}`,
		`{"replica\u017f":11}`, `{"kelvin":1}`, `{"\u212aelvin":1}`, `{"a":{"b":1},"A":2}`, `{"big":9007199254740993,"x":"y"}`,
	} {
		ix := indexMembers([]byte(obj))
		for _, key := range []string{"environment", "Environment", "replicas", "kelvin", "Kelvin", "a", "A", "b", "big", "x", "missing"} {
			want, wantFound := lookup([]byte(obj), key)
			got, gotFound := ix.lookup(key)
			same := wantFound == gotFound && types.IsError(want) == types.IsError(got)
			if same && wantFound && !types.IsError(want) {
				same = got.Equal(want) == types.True
			}
			if !same {
				t.Errorf("%s[%q]: index %v %v, text %v %v", obj, key, got, gotFound, want, wantFound)
			}
		}
	}
}

// TestKeyByNameFailsClosed: the rule the docs give for denying on a key
// (naming it) holds, or fails closed, for every spelling a Go backend
// reads as that key, where iterating the keys would not.
func TestKeyByNameFailsClosed(t *testing.T) {
	s, err := Compile([]Spec{{Effect: Deny, Expr: "'skip_checks' in args || has(args.kill)", Message: "no skipping", Where: "1"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range []string{`{"skip_checks":true}`, `{"Skip_Checks":true}`, `{"\u017fkip_checks":true}`, `{"KILL":1}`, `{"\u212aill":1}`} {
		if v := s.Decide(call("t", args)); v.Effect != Deny {
			t.Errorf("%s: %q (err %v), want deny", args, v.Effect, v.Err)
		}
	}
	if v := s.Decide(call("t", `{"skip":true}`)); v.Effect != "" {
		t.Errorf("another key: %q", v.Effect)
	}
}

// TestValuesNamedToPass: the docs' rule for a backend that reads values
// loosely passes the values it names and nothing else, whatever the
// spelling or type.
func TestValuesNamedToPass(t *testing.T) {
	s, err := Compile([]Spec{{Effect: Deny, Expr: "tool.name == 'deploy' && !(args.environment in ['staging', 'dev'])", Message: "m", Where: "1"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range []string{`"staging"`, `"dev"`} {
		if v := s.Decide(call("deploy", `{"environment":`+env+`}`)); v.Effect != "" {
			t.Errorf("%s: %q", env, v.Effect)
		}
	}
	for _, env := range []string{`"production"`, `"Production"`, `" production"`, `"product\u0131on"`, `["staging"]`, `1`, `null`} {
		if v := s.Decide(call("deploy", `{"environment":`+env+`}`)); v.Effect != Deny {
			t.Errorf("%s: %q (err %v), want deny", env, v.Effect, v.Err)
		}
	}
	if v := s.Decide(call("deploy", `{}`)); v.Effect != Deny {
		t.Errorf("no environment: %q, want deny", v.Effect)
	}
}
