package policy

import (
	"slices"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

func TestDefaultScopes(t *testing.T) {
	m, err := NewScopeMap(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	chat := Principal{Scopes: []string{"chat"}}
	read := Principal{Scopes: []string{"read"}}
	none := Principal{Scopes: []string{"other"}}
	call := func(tool, verb string) message.Call {
		return message.Call{Method: "tools/call", Tool: tool, Verb: verb}
	}

	for _, verb := range []string{"create", "send", "steer", "cancel", "read", "list", "transcript", "wait", "events"} {
		if !m.Decide(chat, call("sessions", verb)).Allowed {
			t.Errorf("chat refused sessions %s", verb)
		}
	}
	for _, verb := range []string{"pending", "answer"} {
		if !m.Decide(chat, call("interactions", verb)).Allowed {
			t.Errorf("chat refused interactions %s", verb)
		}
	}
	for _, verb := range []string{"read", "list", "transcript", "wait", "events"} {
		if !m.Decide(read, call("sessions", verb)).Allowed {
			t.Errorf("read refused sessions %s", verb)
		}
	}
	for _, verb := range []string{"create", "send", "steer", "cancel", ""} {
		d := m.Decide(read, call("sessions", verb))
		if d.Allowed {
			t.Errorf("read allowed sessions %q", verb)
		}
		if !slices.Contains(d.Need, "chat") {
			t.Errorf("refusal of sessions %q names %v, want chat among them", verb, d.Need)
		}
	}
	if m.Decide(read, call("interactions", "answer")).Allowed {
		t.Error("read allowed interactions answer")
	}
	if !m.Decide(read, call("interactions", "pending")).Allowed {
		t.Error("read refused interactions pending")
	}
	for _, method := range []string{"initialize", "ping", "tools/list", "notifications/initialized", "notifications/cancelled", ""} {
		if !m.Decide(none, message.Call{Method: method}).Allowed {
			t.Errorf("open method %q refused", method)
		}
	}
	for _, method := range []string{"resources/read", "prompts/get", "resources/subscribe"} {
		if m.Decide(chat, message.Call{Method: method}).Allowed {
			t.Errorf("chat allowed %s", method)
		}
		if !m.Decide(Principal{Scopes: []string{"mcp"}}, message.Call{Method: method}).Allowed {
			t.Errorf("mcp refused %s", method)
		}
	}
}

func TestOperatorRules(t *testing.T) {
	m, err := NewScopeMap([]Rule{
		{Scope: "deploy", Tools: []string{"deploy_*"}},
		{Scope: "docs", Methods: []string{"resources/*"}},
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	deploy := Principal{Scopes: []string{"deploy"}}
	if !m.Decide(deploy, message.Call{Method: "tools/call", Tool: "deploy_prod"}).Allowed {
		t.Error("deploy refused deploy_prod")
	}
	d := m.Decide(deploy, message.Call{Method: "tools/call", Tool: "delete_everything"})
	if d.Allowed || len(d.Need) != 0 {
		t.Errorf("ungranted tool: %+v", d)
	}
	if m.Decide(deploy, message.Call{Method: "tools/call", Tool: "sessions", Verb: "read"}).Allowed {
		t.Error("defaults off, yet sessions allowed")
	}
	if !m.ToolVisible(deploy, "deploy_staging") || m.ToolVisible(deploy, "echo") {
		t.Error("ToolVisible disagrees with the rules")
	}
	if !m.Decide(Principal{Scopes: []string{"docs"}}, message.Call{Method: "resources/read"}).Allowed {
		t.Error("docs refused resources/read")
	}
	for _, bad := range [][]Rule{
		{{Scope: "x"}},
		{{Scope: "bad scope", Tools: []string{"a"}}},
		{{Scope: "x", Verbs: []string{"read"}}},
	} {
		if _, err := NewScopeMap(bad, false); err == nil {
			t.Errorf("NewScopeMap(%+v) accepted", bad)
		}
	}
}

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"deploy_*", "deploy_prod", true},
		{"deploy_*", "deploy_", true},
		{"deploy_*", "undeploy_x", false},
		{"*", "", true},
		{"*_read", "files_read", true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "acb", false},
		{"a*a", "a", false},
		{"files/[x]", "files/[x]", true},
		{"exact", "exact", true},
		{"exact", "exactly", false},
		{"a*b*c*", "abcx", true},
		{"*b*", "abc", true},
		{"a**c", "ac", true},
		{"*ab", "aab", true},
		{"a*bc", "abcbc", true},
		{"a*bc", "abcb", false},
	} {
		if got := Glob(c.p, c.s); got != c.want {
			t.Errorf("Glob(%q, %q) = %v", c.p, c.s, got)
		}
	}
}

func TestMachineTokensNeverDriveSessions(t *testing.T) {
	m, _ := NewScopeMap(nil, true)
	machine := Principal{Kind: KindMachine, Scopes: []string{"chat", "mcp"}}
	for _, tool := range []string{"sessions", "interactions"} {
		d := m.Decide(machine, message.Call{Method: "tools/call", Tool: tool, Verb: "read"})
		if d.Allowed || !d.Machine {
			t.Errorf("machine token with chat scope: %s decision %+v, want refused as machine", tool, d)
		}
		if m.ToolVisible(machine, tool) {
			t.Errorf("%s listed for a machine token", tool)
		}
	}
	if !m.Decide(machine, message.Call{Method: "tools/call", Tool: "echo"}).Allowed {
		t.Error("machine token with mcp scope refused an ordinary tool")
	}
}

func TestVerbScopes(t *testing.T) {
	m, _ := NewScopeMap(nil, false)
	child := Principal{Kind: KindUser, Scopes: []string{VerbScope("sessions", "create"), VerbScope("sessions", "read"), VerbScope("interactions", "answer")}}
	for _, c := range []struct {
		tool, verb string
		want       bool
	}{
		{"sessions", "create", true}, {"sessions", "read", true}, {"sessions", "cancel", false},
		{"interactions", "answer", true}, {"interactions", "pending", false}, {"sessions", "", false}, {"other", "create", false},
	} {
		if got := m.Decide(child, message.Call{Method: "tools/call", Tool: c.tool, Verb: c.verb}).Allowed; got != c.want {
			t.Errorf("%s %s: allowed = %v", c.tool, c.verb, got)
		}
	}
	if !m.ToolVisible(child, "sessions") || !m.ToolVisible(child, "interactions") || m.ToolVisible(child, "echo") {
		t.Error("ToolVisible disagrees with verb scopes")
	}
	machine := child
	machine.Kind = KindMachine
	if m.Decide(machine, message.Call{Method: "tools/call", Tool: "sessions", Verb: "read"}).Allowed {
		t.Error("a machine token drives sessions through a verb scope")
	}
}

// On a route that offers an upstream, the sessions endpoint's grants do
// not hold: a chat, read or sessions:<verb> token reaches none of the
// upstream's tools, not even one called sessions.
func TestStrictDropsSessionGrants(t *testing.T) {
	m, err := NewScopeMap([]Rule{{Scope: UpstreamScope("remote"), Tools: []string{"*"}, Methods: []string{"*"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	strict := m.Strict()
	for _, scopes := range [][]string{{"chat"}, {"read"}, {VerbScope("sessions", "list")}, {VerbScope("interactions", "pending")}} {
		p := Principal{Name: "x", Kind: KindUser, Scopes: scopes}
		for _, c := range []message.Call{
			{Method: "tools/list"},
			{Method: "tools/call", Tool: "sessions", Verb: "list"},
			{Method: "tools/call", Tool: "interactions", Verb: "pending"},
		} {
			if strict.Decide(p, c).Allowed {
				t.Errorf("%v: %s %s allowed on an upstream route", scopes, c.Method, c.Tool)
			}
		}
		if strict.ToolVisible(p, "sessions") {
			t.Errorf("%v: an upstream's sessions tool is listed", scopes)
		}
		// On the sessions endpoint they hold as before.
		if scopes[0] == "chat" && !m.Decide(p, message.Call{Method: "tools/call", Tool: "sessions", Verb: "list"}).Allowed {
			t.Error("chat refused sessions list on the sessions endpoint")
		}
	}
	owner := Principal{Name: "o", Kind: KindUser, Scopes: []string{UpstreamScope("remote")}}
	if !strict.Decide(owner, message.Call{Method: "tools/call", Tool: "sessions", Verb: "list"}).Allowed || !strict.Decide(owner, message.Call{Method: "tools/list"}).Allowed {
		t.Error("the upstream's scope no longer grants its tools")
	}
}

// A completion needs what using its reference needs.
func TestCompletionNeedsItsReference(t *testing.T) {
	m, err := NewScopeMap([]Rule{{Scope: "simple", Tools: []string{"echo"}}, {Scope: "prompts", Methods: []string{"prompts/get"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	simple := Principal{Kind: KindUser, Scopes: []string{"simple"}}
	prompts := Principal{Kind: KindUser, Scopes: []string{"prompts"}}
	prompt := message.Call{Method: "completion/complete", Ref: message.Ref{Type: "ref/prompt", Name: "p"}}
	resource := message.Call{Method: "completion/complete", Ref: message.Ref{Type: "ref/resource", URI: "x://{y}"}}
	if m.Decide(simple, prompt).Allowed || m.Decide(simple, resource).Allowed {
		t.Error("a tool-only token completes a prompt or a template")
	}
	if !m.Decide(prompts, prompt).Allowed || m.Decide(prompts, resource).Allowed {
		t.Error("completion disagrees with prompts/get and resources/read")
	}
	if !m.Decide(Principal{Kind: KindUser, Scopes: []string{"mcp"}}, resource).Allowed {
		t.Error("mcp refused a completion")
	}
}

// A token that may call some tool may follow the tasks its calls created
// (tasks/get, tasks/update, tasks/cancel): the edge binds each task to the
// token that made the call. One that may call no tool may not, and the
// extension's removed methods are granted by no tool.
func TestTaskMethodsFollowTools(t *testing.T) {
	m, err := NewScopeMap([]Rule{
		{Scope: "deploy", Tools: []string{"deploy_*"}},
		{Scope: "docs", Methods: []string{"resources/*"}},
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, strict := range []*ScopeMap{m, m.Strict()} {
		for _, method := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
			if !strict.Decide(Principal{Scopes: []string{"deploy"}}, message.Call{Method: method}).Allowed {
				t.Errorf("strict=%v: a token that may call deploy_* may not %s", strict.strict, method)
			}
			if strict.Decide(Principal{Scopes: []string{"docs"}}, message.Call{Method: method}).Allowed {
				t.Errorf("strict=%v: a token that may call no tool may %s", strict.strict, method)
			}
		}
		if strict.Decide(Principal{Scopes: []string{"deploy"}}, message.Call{Method: "tasks/list"}).Allowed {
			t.Errorf("strict=%v: tasks/list allowed by a tool scope", strict.strict)
		}
	}
}

// The scopes a site advertises are those its rules know, each once, the
// defaults first, and none of the defaults once they are turned off.
func TestScopeMapNames(t *testing.T) {
	extra := []Rule{{Scope: "deploy", Tools: []string{"deploy_*"}}, {Scope: "read", Tools: []string{"x"}}, {Scope: "deploy", Methods: []string{"prompts/get"}}}
	for _, c := range []struct {
		defaults bool
		want     []string
	}{
		{true, []string{"chat", "read", "mcp", "deploy"}},
		{false, []string{"deploy", "read"}},
	} {
		m, err := NewScopeMap(extra, c.defaults)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Names(); !slices.Equal(got, c.want) {
			t.Errorf("defaults %v: %v, want %v", c.defaults, got, c.want)
		}
	}
}

// On an aggregated route an upstream is used with its own upstream:<name>
// scope, the scope the operator gave it, or mcp while the default rules
// are on; never with another upstream's scope, and an unnamed upstream
// (one the route does not have) by no one.
func TestUpstreamAllows(t *testing.T) {
	p := func(scopes ...string) Principal { return Principal{TokenID: "t", Scopes: scopes} }
	for _, c := range []struct {
		name     string
		p        Principal
		upstream string
		own      string
		defaults bool
		allowed  bool
	}{
		{"its upstream scope", p("upstream:gh"), "gh", "", true, true},
		{"another upstream's scope", p("upstream:linear"), "gh", "", true, false},
		{"its own scope", p("code"), "gh", "code", false, true},
		{"no own scope to hold", p(""), "gh", "", false, false},
		{"mcp with the defaults", p("mcp"), "gh", "", true, true},
		{"mcp without them", p("mcp"), "gh", "", false, false},
		{"chat is no upstream scope", p("chat", "read"), "gh", "", true, false},
		{"an unnamed upstream", p("mcp", "upstream:"), "", "", true, false},
	} {
		if got := UpstreamAllows(c.p, c.upstream, c.own, c.defaults); got != c.allowed {
			t.Errorf("%s: %v, want %v", c.name, got, c.allowed)
		}
	}
}

// TestMayApprove: the approve scope answers every site's held calls;
// approve:<host> that host's alone; a path-only site needs the first.
func TestMayApprove(t *testing.T) {
	cases := []struct {
		scopes []string
		site   string
		want   bool
	}{
		{[]string{"approve"}, "https://mcp.example.com/mcp", true},
		{[]string{"approve"}, "/mcp", true},
		{[]string{"approve:mcp.example.com"}, "https://mcp.example.com/mcp", true},
		{[]string{"approve:mcp.example.com"}, "https://mcp.example.com:8443/mcp", false},
		{[]string{"approve:127.0.0.1:8443"}, "http://127.0.0.1:8443/mcp", true},
		{[]string{"approve:mcp.example.com"}, "https://other.example.com/mcp", false},
		{[]string{"approve:mcp.example.com"}, "/mcp", false},
		{[]string{"approve:"}, "/mcp", false},
		{[]string{"mcp", "chat"}, "https://mcp.example.com/mcp", false},
	}
	for _, c := range cases {
		if got := MayApprove(Principal{TokenID: "t", Scopes: c.scopes}, c.site); got != c.want {
			t.Errorf("%v on %s: %v, want %v", c.scopes, c.site, got, c.want)
		}
	}
}
