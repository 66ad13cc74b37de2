package policy

import (
	"fmt"
	"net/url"
	"strings"
	"unicode"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Rule grants one scope access to tools, verbs and methods. A principal may
// do what any rule for one of its scopes grants; everything else is refused.
type Rule struct {
	// Scope is the scope this rule grants to.
	Scope string `json:"scope"`
	// Tools are tool-name patterns for tools/call; `*` matches any run of
	// characters, so "deploy_*" grants every tool that starts with deploy_.
	Tools []string `json:"tools,omitempty"`
	// Verbs, when set, limit the granted tools to calls whose `verb`
	// argument is listed (the sessions and interactions tools take one).
	Verbs []string `json:"verbs,omitempty"`
	// Methods are MCP method patterns other than tools/call that the scope
	// may use, such as "resources/read" or "prompts/*".
	Methods []string `json:"methods,omitempty"`
}

// DefaultRules are in force unless an operator turns them off:
//
//   - chat: every verb of the sessions and interactions tools;
//   - read: sessions read, list, transcript, wait and events; interactions pending;
//   - mcp: every tool and method, for guarding an MCP server as a whole.
//
// Besides the rules, a scope "sessions:<verb>" or "interactions:<verb>"
// always grants that one verb (see VerbScope), and "sessions:any" or
// "interactions:any" lets the verbs granted reach other owners' sessions
// (see AnyOwnerScope).
func DefaultRules() []Rule {
	return []Rule{
		{Scope: "chat", Tools: []string{"sessions", "interactions"}},
		{Scope: "read", Tools: []string{"sessions"}, Verbs: readVerbs("sessions")},
		{Scope: "read", Tools: []string{"interactions"}, Verbs: readVerbs("interactions")},
		{Scope: "mcp", Tools: []string{"*"}, Methods: []string{"*"}},
	}
}

// OpenMethods need no scope beyond being authenticated on the sessions
// endpoint and in guard mode: they set a session up, or list what the
// session may see (listing answers are filtered).
var OpenMethods = []string{
	"initialize", "ping", "tools/list", "prompts/list", "resources/list",
	"resources/templates/list", "logging/setLevel",
	// Newer protocol versions: a client asks what the server supports
	// before it initializes, and listens for list changes.
	"server/discover", "subscriptions/listen",
}

// SetupMethods need no scope on a route that offers an upstream: they set
// a session up and say nothing of what the upstream offers. Everything
// else there, listings included, needs a scope (see [ScopeMap.Strict]).
var SetupMethods = []string{"initialize", "ping", "server/discover"}

// listUse is what a listing lists: on a strict map a token may list the
// items of a kind when it may use some item of that kind.
var listUse = map[string]string{
	"tools/list":               "tools/call",
	"prompts/list":             "prompts/get",
	"resources/list":           "resources/read",
	"resources/templates/list": "resources/read",
}

// VerbScope is the scope that grants one verb of a sessions-endpoint tool,
// such as "sessions:read". Child tokens of orchestrator sessions carry such
// scopes, one per verb they were given.
func VerbScope(tool, verb string) string { return tool + ":" + verb }

// AnyOwner is the word of the scopes "sessions:any" and "interactions:any"
// (see [AnyOwnerScope]). It is no verb: such a scope grants no call.
const AnyOwner = "any"

// AnyOwnerScope is the scope that lets a principal's verbs of tool reach
// the sessions of every owner, not only its own owner's: "sessions:any"
// (read, send, steer, cancel … any session) or "interactions:any" (see and
// answer any session's interactions). It grants no verb by itself, and a
// machine token never drives sessions whatever it holds.
func AnyOwnerScope(tool string) string { return tool + ":" + AnyOwner }

// UpstreamScope is the scope that grants every tool and method of one
// upstream of the broker, "upstream:<name>".
func UpstreamScope(name string) string { return "upstream:" + name }

// UpstreamAllows says whether p may use the upstream name on an
// aggregated route: with the scope upstream:<name> ([UpstreamScope]), the
// upstream's own scope (own, when the operator gave it one), or, with the
// default rules on, mcp. An upstream without a name is no one's.
func UpstreamAllows(p Principal, name, own string, defaults bool) bool {
	if name == "" {
		return false
	}
	return p.HasScope(UpstreamScope(name)) || (own != "" && p.HasScope(own)) || (defaults && p.HasScope("mcp"))
}

// ScopeMap decides calls.
type ScopeMap struct {
	rules []Rule
	// open are the methods any authenticated principal may call.
	open map[string]bool
	// strict: a listing needs a scope that grants an item it lists.
	strict bool
}

// NewScopeMap builds a scope map from the operator's rules, after the
// defaults when withDefaults is set.
func NewScopeMap(rules []Rule, withDefaults bool) (*ScopeMap, error) {
	var all []Rule
	if withDefaults {
		all = DefaultRules()
	}
	for i, r := range rules {
		if !scopePattern.MatchString(r.Scope) {
			return nil, fmt.Errorf("scope rule %d: scope %q: use letters, digits and ':._*-'", i, r.Scope)
		}
		if len(r.Verbs) > 0 && len(r.Tools) == 0 {
			return nil, fmt.Errorf("scope rule for %q lists verbs but no tool they belong to", r.Scope)
		}
		if len(r.Tools) == 0 && len(r.Methods) == 0 {
			return nil, fmt.Errorf("scope rule for %q grants nothing: name at least one tool or method", r.Scope)
		}
		all = append(all, r)
	}
	return &ScopeMap{rules: all, open: setOf(OpenMethods)}, nil
}

// Strict returns a copy of m for a route that offers an upstream: only
// [SetupMethods] are open, and a listing is allowed to a principal that may
// use some item of what it lists (a tool, a prompt, a resource), so that a
// token without the upstream's scope learns nothing of what it offers but
// its name and capabilities (initialize). The sessions endpoint's grants do
// not hold there: the rules that grant only its tools (the default chat and
// read), and the sessions:<verb> scopes, which would otherwise reach an
// upstream's tool that happens to be called sessions.
func (m *ScopeMap) Strict() *ScopeMap {
	var rules []Rule
	for _, r := range m.rules {
		if len(r.Methods) == 0 && len(r.Tools) > 0 && onlySessionTools(r.Tools) {
			continue
		}
		rules = append(rules, r)
	}
	return &ScopeMap{rules: rules, open: setOf(SetupMethods), strict: true}
}

// onlySessionTools reports whether every pattern names a sessions-endpoint
// tool.
func onlySessionTools(tools []string) bool {
	for _, t := range tools {
		if !contains(SessionTools, t) {
			return false
		}
	}
	return true
}

func setOf(list []string) map[string]bool {
	s := make(map[string]bool, len(list))
	for _, v := range list {
		s[v] = true
	}
	return s
}

// Decision is the outcome of Decide.
type Decision struct {
	Allowed bool
	// Need lists the scopes that would grant a refused call, for the
	// WWW-Authenticate scope parameter. Empty when no scope grants it.
	Need []string
	// Machine is set when the call was refused because a machine token
	// may never make it, whatever its scopes.
	Machine bool
}

// SessionTools are the tools of the sessions endpoint. They start and steer
// coding agents on the host, so only a person's token may call them.
var SessionTools = []string{"sessions", "interactions"}

// Decide says whether p may make call c. Responses to a server's requests
// and notifications need no scope.
func (m *ScopeMap) Decide(p Principal, c message.Call) Decision {
	if c.IsResponse() || m.open[c.Method] || strings.HasPrefix(c.Method, "notifications/") {
		return Decision{Allowed: true}
	}
	if use, listing := listUse[c.Method]; listing && m.strict {
		if use == "tools/call" {
			if m.anyTool(p) {
				return Decision{Allowed: true}
			}
			return Decision{Need: m.scopesFor(func(r Rule) bool { return len(r.Tools) > 0 })}
		}
		return m.Decide(p, message.Call{Method: use})
	}
	if p.Kind == KindMachine && c.IsToolCall() && contains(SessionTools, c.Tool) {
		return Decision{Machine: true}
	}
	if message.IsTaskMethod(c.Method) && m.anyTool(p) {
		// tasks/get, tasks/update and tasks/cancel go on with a tools/call
		// that was allowed: they name its task by a handle bound to the
		// token that made the call (package edge), so a token that may
		// call some tool may follow its own tasks.
		return Decision{Allowed: true}
	}
	if !m.strict && c.IsToolCall() && contains(SessionTools, c.Tool) && c.Verb != "" && c.Verb != AnyOwner && p.HasScope(VerbScope(c.Tool, c.Verb)) {
		return Decision{Allowed: true}
	}
	var need []string
	if c.Method == "completion/complete" {
		// A completion shows values of a prompt's arguments or a
		// template's variables: it needs what using them needs.
		use := message.Call{Method: "prompts/get", Prompt: c.Ref.Name}
		if c.Ref.Type == "ref/resource" {
			use = message.Call{Method: "resources/read", URI: c.Ref.URI}
		}
		d := m.Decide(p, use)
		if d.Allowed {
			return d
		}
		need = d.Need
	}
	for _, r := range m.rules {
		if r.grants(c) && p.HasScope(r.Scope) {
			return Decision{Allowed: true}
		}
	}
	// Refused: the scopes that would have allowed it, collected only now
	// so that an allowed call builds no list.
	for _, r := range m.rules {
		if r.grants(c) {
			need = appendUnique(need, r.Scope)
		}
	}
	return Decision{Need: need}
}

// GrantsVerb reports whether p may call tool (sessions or interactions)
// with verb. The sessions endpoint asks it of an orchestrator's tools at
// create: a child's verbs can only narrow what its creator may call.
func (m *ScopeMap) GrantsVerb(p Principal, tool, verb string) bool {
	return m.Decide(p, message.Call{Method: "tools/call", Tool: tool, Verb: verb}).Allowed
}

// anyTool reports whether p may call some tool.
func (m *ScopeMap) anyTool(p Principal) bool {
	for _, sc := range p.Scopes {
		if m.strict {
			break
		}
		for _, tool := range SessionTools {
			if strings.HasPrefix(sc, tool+":") && sc != AnyOwnerScope(tool) && p.Kind != KindMachine {
				return true
			}
		}
	}
	for _, r := range m.rules {
		if len(r.Tools) > 0 && p.HasScope(r.Scope) {
			return true
		}
	}
	return false
}

// Names lists the scopes m's rules know, each once, in the order of the
// rules (the defaults first): what the protected-resource metadata
// advertises as scopes_supported.
func (m *ScopeMap) Names() []string {
	return m.scopesFor(func(Rule) bool { return true })
}

// scopesFor lists the scopes of the rules keep selects.
func (m *ScopeMap) scopesFor(keep func(Rule) bool) []string {
	var need []string
	for _, r := range m.rules {
		if keep(r) {
			need = appendUnique(need, r.Scope)
		}
	}
	return need
}

// ToolVisible reports whether p may call tool with some verb, which is what
// decides whether a tools/list answer shows the tool.
func (m *ScopeMap) ToolVisible(p Principal, tool string) bool {
	if p.Kind == KindMachine && contains(SessionTools, tool) {
		return false
	}
	if contains(SessionTools, tool) && !m.strict {
		for _, sc := range p.Scopes {
			if strings.HasPrefix(sc, tool+":") && sc != AnyOwnerScope(tool) {
				return true
			}
		}
	}
	for _, r := range m.rules {
		if p.HasScope(r.Scope) && matchAny(r.Tools, tool) {
			return true
		}
	}
	return false
}

func (r Rule) grants(c message.Call) bool {
	if c.IsToolCall() {
		if !matchAny(r.Tools, c.Tool) {
			return false
		}
		return len(r.Verbs) == 0 || contains(r.Verbs, c.Verb)
	}
	return matchAny(r.Methods, c.Method)
}

func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if Glob(p, s) {
			return true
		}
	}
	return false
}

// FoldName is the form in which two names that an upstream could resolve
// to one item (a tool, a prompt) are equal: compatibility-normalized
// (NFKC: full-width letters, ligatures) and case-folded, then normalized
// again, as Unicode's NFKC_Casefold does. An upstream that looks a name up
// without case, or after normalizing it, finds the same item for every
// name of one FoldName. The folding is Unicode's full case folding (ß and
// ss, ſ and s, K and k alike), which x/text implements and
// strings.EqualFold does not (it folds one rune to one rune only); a Caser
// holds state, so each call makes its own. Each rune is first upper- and
// then lower-cased as Go's unicode package maps it: Unicode's folding
// keeps ı (U+0131) and folds İ (U+0130) to i and a combining dot, where a
// server in Go that compares strings.ToUpper or strings.ToLower of names
// reads both as i.
func FoldName(s string) string {
	s = strings.Map(func(r rune) rune { return unicode.ToLower(unicode.ToUpper(r)) }, s)
	return norm.NFKC.String(cases.Fold().String(norm.NFKC.String(s)))
}

// GlobFold is Glob on the FoldName of pattern and s: what a pattern that
// keeps names away (a deny list, a withheld item) matches, so that no
// spelling an upstream reads as a denied name gets past it. A pattern
// that lets names through matches as spelled (Glob).
func GlobFold(pattern, s string) bool { return Glob(FoldName(pattern), FoldName(s)) }

// Glob matches s against pattern, where `*` stands for any run of
// characters and everything else for itself. path.Match would treat '/' and
// '[' specially, which tool and method names must not be.
func Glob(pattern, s string) bool {
	first, rest, wild := strings.Cut(pattern, "*")
	if !wild {
		return pattern == s
	}
	if !strings.HasPrefix(s, first) {
		return false
	}
	s = s[len(first):]
	// Each middle part at its first place, then the last at the end; by
	// strings.Cut, with no allocation (it runs for every rule on every call).
	for {
		part, more, ok := strings.Cut(rest, "*")
		if !ok {
			return strings.HasSuffix(s, part)
		}
		i := strings.Index(s, part)
		if i < 0 {
			return false
		}
		s, rest = s[i+len(part):], more
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func appendUnique(list []string, s string) []string {
	if contains(list, s) {
		return list
	}
	return append(list, s)
}

// ApproveScope lets its holder answer the calls that approve rules hold
// (package approvals) on every site; ApproveScope+":"+host (the host, and
// port when it has one, of the site's resource URL, as scopes cannot
// hold a URL) on that host's sites alone. A site configured with a
// path-only resource is answered with ApproveScope alone.
const ApproveScope = "approve"

// MayApprove reports whether p may answer the held calls of site (the
// approval's resource URL). Whether p may answer a given call (never
// their own, unless the rule says self) is the approval's own check.
func MayApprove(p Principal, site string) bool {
	if p.HasScope(ApproveScope) {
		return true
	}
	u, err := url.Parse(site)
	return err == nil && u.IsAbs() && u.Host != "" && p.HasScope(ApproveScope+":"+u.Host)
}
