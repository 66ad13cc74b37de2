package policy

import (
	"slices"
	"testing"
)

// A verb names one tool's verb: an orchestrator's tools list verbs alone,
// so no name is a verb of both tools, and each finds its tool.
func TestVerbTable(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range Verbs() {
		if seen[v.Name] {
			t.Errorf("verb %q is listed twice", v.Name)
		}
		seen[v.Name] = true
		if !slices.Contains(SessionTools, v.Tool) {
			t.Errorf("verb %q belongs to %q, no sessions-endpoint tool", v.Name, v.Tool)
		}
		if tool, ok := VerbTool(v.Name); !ok || tool != v.Tool {
			t.Errorf("VerbTool(%q) = %q %v, want %q", v.Name, tool, ok, v.Tool)
		}
	}
	for _, name := range []string{"", "any", "sessions", "delete"} {
		if tool, ok := VerbTool(name); ok {
			t.Errorf("VerbTool(%q) = %q: no verb has that name", name, tool)
		}
	}
	if got := VerbNames(""); len(got) != len(Verbs()) || !slices.Equal(got[:len(VerbNames("sessions"))], VerbNames("sessions")) {
		t.Errorf("VerbNames(\"\") = %v: both tools' verbs, the sessions tool's first", got)
	}
}

// The default read scope grants exactly the verbs that only read: a read
// token sees sessions and what waits on them, and drives nothing.
func TestReadScopeGrantsTheReadingVerbs(t *testing.T) {
	m, err := NewScopeMap(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	reader := Principal{TokenID: "r", Name: "reader", Kind: KindUser, Scopes: []string{"read"}}
	var granted []string
	for _, v := range Verbs() {
		if m.GrantsVerb(reader, v.Tool, v.Name) {
			granted = append(granted, v.Tool+" "+v.Name)
		}
	}
	want := []string{"sessions read", "sessions list", "sessions transcript", "sessions wait", "sessions events", "interactions pending"}
	if !slices.Equal(granted, want) {
		t.Errorf("read grants %v, want %v", granted, want)
	}
}

// An orchestrator's agent gets a verb scope for each of its tools that its
// creator may call now, never one its creator may no longer call, and
// nothing for a name that is no verb.
func TestOrchestratorScopes(t *testing.T) {
	creator := map[string]bool{"sessions create": true, "sessions read": true, "interactions answer": true}
	grants := func(tool, verb string) bool { return creator[tool+" "+verb] }
	scopes, dropped := OrchestratorScopes([]string{"create", "read", "cancel", "answer", "pending", "nonsense", "any"}, grants)
	if want := []string{"sessions:create", "sessions:read", "interactions:answer"}; !slices.Equal(scopes, want) {
		t.Errorf("scopes %v, want %v", scopes, want)
	}
	if want := []string{"sessions cancel", "interactions pending"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped %v, want %v", dropped, want)
	}
	if scopes, dropped := OrchestratorScopes(nil, grants); scopes != nil || dropped != nil {
		t.Errorf("no tools: %v %v, want none", scopes, dropped)
	}
}
