package policy

// Verb is one verb of a sessions-endpoint tool ([SessionTools]).
type Verb struct {
	// Tool is the tool it belongs to: "sessions" or "interactions".
	Tool string
	// Name is the verb, unique across both tools: an orchestrator's
	// `tools` list names verbs alone.
	Name string
	// Reads says the verb only reads what a session did (the default
	// read scope grants it).
	Reads bool
}

// verbs is the one table of the sessions endpoint's verbs, in the order
// the tools list them: the scopes, the tools' schemas and argument checks
// (package mcpendpoint) and the child tokens of orchestrator sessions all
// read it.
var verbs = []Verb{
	{"sessions", "create", false},
	{"sessions", "send", false},
	{"sessions", "steer", false},
	{"sessions", "cancel", false},
	{"sessions", "read", true},
	{"sessions", "list", true},
	{"sessions", "transcript", true},
	{"sessions", "wait", true},
	{"sessions", "events", true},
	{"interactions", "pending", true},
	{"interactions", "answer", false},
}

// Verbs lists the verbs of both sessions-endpoint tools, in order.
func Verbs() []Verb { return append([]Verb(nil), verbs...) }

// VerbNames lists the names of tool's verbs, or of both tools' when tool
// is "", in order.
func VerbNames(tool string) []string {
	var out []string
	for _, v := range verbs {
		if tool == "" || v.Tool == tool {
			out = append(out, v.Name)
		}
	}
	return out
}

// readVerbs lists the names of tool's verbs that only read.
func readVerbs(tool string) []string {
	var out []string
	for _, v := range verbs {
		if v.Tool == tool && v.Reads {
			out = append(out, v.Name)
		}
	}
	return out
}

// VerbTool is the tool whose verb name is; false for no verb of either.
func VerbTool(name string) (string, bool) {
	for _, v := range verbs {
		if v.Name == name {
			return v.Tool, true
		}
	}
	return "", false
}

// OrchestratorScopes are the scopes of the token an orchestrator
// session's agent gets: a [VerbScope] for each verb of the session's
// tools that grants says its creator may call now, and in dropped
// ("<tool> <verb>") each one it may no longer call; a name that is no verb
// is skipped. The session's create checked that its creator may call
// every listed verb, but at a relaunch the creator may hold less (a JWT
// with fewer scopes) or the config grant less (a reload), and the child
// never holds more than its creator.
func OrchestratorScopes(tools []string, grants func(tool, verb string) bool) (scopes, dropped []string) {
	for _, v := range tools {
		tool, ok := VerbTool(v)
		if !ok {
			continue
		}
		if !grants(tool, v) {
			dropped = append(dropped, tool+" "+v)
			continue
		}
		scopes = append(scopes, VerbScope(tool, v))
	}
	return scopes, dropped
}
