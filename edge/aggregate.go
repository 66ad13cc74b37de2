package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// Catalog says which upstream of an aggregated route owns what a call
// names (package broker's Aggregate).
type Catalog interface {
	// Upstreams are the route's upstreams, in config order.
	Upstreams() []string
	// ToolServer resolves a tool as the route offers it.
	ToolServer(name string) (server, tool string, ok bool)
	// PromptServer resolves a prompt as the route offers it.
	PromptServer(name string) (server, prompt string, ok bool)
	// ResourceOwners are the upstreams that could serve a resources/read
	// of uri: the owner of that resource, else the owners of every
	// template it matches.
	ResourceOwners(uri string) []string
	// TemplateOwner is the upstream that offers a resource template.
	TemplateOwner(uriTemplate string) (string, bool)
	// CompletionResource is the upstream that serves a completion of a
	// ref/resource reference.
	CompletionResource(uri string) (string, bool)
}

// Aggregate is the aggregated route: several upstreams on one endpoint.
// Every call is authorized against the upstream that owns what it names —
// a tool or prompt by its name, a resource by its uri, a completion by its
// ref — and listings show only what the principal may use. Methods that
// name nothing (listings, logging/setLevel) need some upstream; initialize,
// ping and notifications need none.
type Aggregate struct {
	Catalog Catalog
	// Allows reports whether p may use the named upstream.
	Allows func(p policy.Principal, upstream string) bool
	// Handler serves the route (aggregate.Aggregate).
	Handler http.Handler
	// Rules are the operator's rules over calls (see Authorize).
	Rules *rules.Set
	// Params is what the route learned of its tools' x-mcp-header
	// bindings (by the names it lists them under), to check Mcp-Param-*
	// headers against; the zero value starts empty.
	Params ParamHeaders
	// SharedParams, when set, is used instead of Params: a store kept
	// across config reloads, so that a reload does not forget what the
	// route learned and refuse its clients' Mcp-Param-* headers until they
	// list tools again.
	SharedParams *ParamHeaders
	// Pins, when set, pins what each upstream gives a model to read under
	// the namespace AggregatePinNS(upstream), by the upstream's own name
	// for a tool or prompt (see package pins); its instructions are
	// pinned where the route merges them (AggregateInstructions). Not the
	// pass-through route's namespace: this route lists a tool as go-sdk
	// decoded and wrote it again (annotations completed, numbers as
	// float64), so the same definition has another digest here, and one
	// namespace would take each route's listing for a change of the
	// other's.
	Pins *pins.Store
	// Tasks, when set, binds the upstreams' task ids (MCP 2026-07-28's
	// Tasks extension) to the token, Route (the name the route's handles
	// carry) and the upstream that holds the task (see tasks.go).
	Tasks *taskid.Sealer
	Route string
}

func (a *Aggregate) bindsTasks() bool { return a.Tasks != nil }

// creator is the upstream that offers tool: a task its call creates is
// that upstream's.
func (a *Aggregate) creator(tool string) string {
	server, _, _ := a.Catalog.ToolServer(tool)
	return server
}

// mayUse refuses a task method whose handle names an upstream the
// principal may no longer use, or that the route no longer has.
func (a *Aggregate) mayUse(p policy.Principal, upstream string, c message.Call) *RefusalError {
	if !slices.Contains(a.Catalog.Upstreams(), upstream) {
		return unknownTask(c)
	}
	if !a.Allows(p, upstream) {
		v := NeedScope(p, c, []string{policy.UpstreamScope(upstream)})
		return &RefusalError{v}
	}
	return nil
}

// AggregatePinNS is the pin namespace of upstream's tools on the
// aggregated route.
func AggregatePinNS(upstream string) string { return "aggregate:" + upstream }

func (a *Aggregate) pin(kind Kind, name string) (*pins.Store, string, string) {
	var (
		server string
		ok     bool
	)
	switch kind {
	case KindTool:
		server, name, ok = a.Catalog.ToolServer(name)
	case KindPrompt:
		server, name, ok = a.Catalog.PromptServer(name)
	case KindResource:
		if owners := a.Catalog.ResourceOwners(name); len(owners) > 0 {
			server, ok = owners[0], true
		}
	case KindResourceTemplate:
		server, ok = a.Catalog.TemplateOwner(name)
	}
	if !ok || a.Pins == nil {
		return nil, "", ""
	}
	return a.Pins, AggregatePinNS(server), name
}

// pinServer: the route answers initialize with its own serverInfo and
// the upstreams' instructions merged, each pinned where it is merged
// (AggregateInstructions).
func (a *Aggregate) pinServer() (*pins.Store, string) { return nil, "" }

// pinSets: an upstream whose catalog has not connected lists nothing, so
// only the upstreams whose tools a listing holds have their set listed.
func (a *Aggregate) pinSets() (*pins.Store, []string) { return nil, nil }

// AggregateInstructions returns what the aggregated route merges of an
// upstream's instructions (aggregate.Options.Instructions): the
// upstream's own when they are its pinned ones (pinned on first sight, in
// the namespace AggregatePinNS), else the pinned ones, or none. Nil with
// no store.
func AggregateInstructions(st *pins.Store) func(upstream, instructions string) string {
	if st == nil {
		return nil
	}
	return func(upstream, instructions string) string {
		ns := AggregatePinNS(upstream)
		obj := map[string]json.RawMessage{}
		if instructions != "" {
			obj["instructions"], _ = json.Marshal(instructions)
		}
		if v, _ := st.Listed(ns, pins.Server, pins.ServerInstructions, obj); v == pins.Shown {
			return instructions
		}
		var pinned string
		_ = json.Unmarshal(st.Pinned(ns, pins.Server, pins.ServerInstructions)["instructions"], &pinned)
		return pinned
	}
}

func (a *Aggregate) paramHeaders() *ParamHeaders {
	if a.SharedParams != nil {
		return a.SharedParams
	}
	return &a.Params
}

// Admit admits every authenticated principal; Authorize decides.
func (*Aggregate) Admit(policy.Principal) Verdict { return Verdict{} }

// ClientAddressed marks the route as one whose upstream calls are audited
// with the client's address.
func (*Aggregate) ClientAddressed() {}

// Authorize decides c against its owner, then by the rules, which read
// that owner as the upstream. An allow rule grants a call that one
// upstream serves, and nothing else: never a call that names no upstream
// (a listing, an unknown tool) or that several could serve, which would
// admit the principal to an upstream the rule did not read.
func (a *Aggregate) Authorize(p policy.Principal, c message.Call) Verdict {
	v, owners := a.authorize(p, c)
	if a.Rules.Len() == 0 {
		return v
	}
	if len(owners) == 1 {
		return ruleVerdict(a.Rules, RuleRouteAggregate, p, c, owners[0], true, v)
	}
	if namesUpstream(c) {
		// Several upstreams could serve c, or none offers it now and any
		// may by the time the route looks it up: c reaches one the
		// decision cannot name, so a rule that refuses it for any of them
		// refuses it (a deny rule over upstream holds for each).
		if len(owners) == 0 {
			owners = a.Catalog.Upstreams()
		}
		for _, o := range owners {
			if r := ruleVerdict(a.Rules, RuleRouteAggregate, p, c, o, false, v); r.Reason == ReasonRule {
				return r
			}
		}
	}
	return ruleVerdict(a.Rules, RuleRouteAggregate, p, c, "", false, v)
}

// namesUpstream reports whether c names what one upstream serves (a tool,
// a prompt, a resource, a completion's ref), as against a listing or a
// setup call that the route answers from all of them.
func namesUpstream(c message.Call) bool {
	switch c.Method {
	case "tools/call", "prompts/get", "resources/read", "resources/subscribe", "resources/unsubscribe":
		return true
	case "completion/complete":
		return c.Ref.Type == "ref/prompt" || c.Ref.Type == "ref/resource"
	}
	return false
}

// authorize decides c by its owners' scopes, and says who they are.
func (a *Aggregate) authorize(p policy.Principal, c message.Call) (Verdict, []string) {
	if c.IsResponse() || slices.Contains(policy.SetupMethods, c.Method) || strings.HasPrefix(c.Method, "notifications/") {
		return Verdict{}, nil
	}
	var owners []string
	switch c.Method {
	case "tools/call":
		if server, _, ok := a.Catalog.ToolServer(c.Tool); ok {
			owners = []string{server}
		}
		// Else no upstream offers it now; one might by the time go-sdk
		// looks it up, so it is refused as an unknown resource is.
		return a.owners(p, c, owners), owners
	case "prompts/get":
		if server, _, ok := a.Catalog.PromptServer(c.Prompt); ok {
			owners = []string{server}
		}
		return a.owners(p, c, owners), owners
	case "resources/read", "resources/subscribe", "resources/unsubscribe":
		owners = a.Catalog.ResourceOwners(c.URI)
		return a.owners(p, c, owners), owners
	case "completion/complete":
		switch c.Ref.Type {
		case "ref/prompt":
			if server, _, ok := a.Catalog.PromptServer(c.Ref.Name); ok {
				owners = []string{server}
			}
			return a.owners(p, c, owners), owners
		case "ref/resource":
			if owner, ok := a.Catalog.CompletionResource(c.Ref.URI); ok {
				owners = []string{owner}
			}
			return a.owners(p, c, owners), owners
		}
	}
	// Listings and the rest name no upstream: some upstream will do, and
	// listings are filtered.
	var need []string
	for _, name := range a.Catalog.Upstreams() {
		if a.Allows(p, name) {
			return Verdict{}, nil
		}
		need = append(need, policy.UpstreamScope(name))
	}
	return NeedScope(p, c, need), nil
}

// owners allows c when p may use every upstream that could serve it. What
// no upstream offers (a tool, prompt or resource not listed, a completion
// of neither) is refused to a principal that may not use every upstream:
// the catalog may change before the call is served, and what it does not
// see and what does not exist look alike.
func (a *Aggregate) owners(p policy.Principal, c message.Call, owners []string) Verdict {
	if len(owners) == 0 {
		for _, name := range a.Catalog.Upstreams() {
			if !a.Allows(p, name) {
				return Refuse(http.StatusForbidden, ReasonScope,
					fmt.Sprintf("%s: no upstream that token %q may use offers what it names", c.Method, p.Name))
			}
		}
		return Verdict{}
	}
	var need []string
	for _, o := range owners {
		if !a.Allows(p, o) {
			need = append(need, policy.UpstreamScope(o))
		}
	}
	if len(need) > 0 {
		return NeedScope(p, c, need)
	}
	return Verdict{}
}

// Visible shows an item when p may use its owner, as the rules say.
func (a *Aggregate) Visible(p policy.Principal, it Item) bool {
	var owners []string
	switch it.Kind {
	case KindTool:
		if server, _, ok := a.Catalog.ToolServer(it.Name); ok {
			owners = []string{server}
		}
	case KindPrompt:
		if server, _, ok := a.Catalog.PromptServer(it.Name); ok {
			owners = []string{server}
		}
	case KindResource:
		owners = a.Catalog.ResourceOwners(it.Name)
	case KindResourceTemplate:
		if owner, ok := a.Catalog.TemplateOwner(it.Name); ok {
			owners = []string{owner}
		}
	}
	shown := len(owners) > 0
	for _, o := range owners {
		shown = shown && a.Allows(p, o)
	}
	if len(owners) != 1 {
		// An item several upstreams serve is hidden when a rule hides it
		// for any of them, as a call of it is refused (see Authorize).
		for _, o := range owners {
			if !ruleVisible(a.Rules, RuleRouteAggregate, p, it, o, false, true) {
				return false
			}
		}
		return ruleVisible(a.Rules, RuleRouteAggregate, p, it, "", false, shown)
	}
	return ruleVisible(a.Rules, RuleRouteAggregate, p, it, owners[0], true, shown)
}

// Serve opens r's task handles, naming the upstream that holds each task,
// and hands r to the aggregated route.
func (a *Aggregate) Serve(w http.ResponseWriter, r *http.Request, _ Next) error {
	if a.Tasks != nil {
		var err error
		if r, err = openTasks(w, r, a.Tasks, a.Route, a); err != nil {
			return err
		}
	}
	a.Handler.ServeHTTP(w, r)
	return nil
}
