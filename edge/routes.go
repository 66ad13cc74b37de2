package edge

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/Tahul/caddy-zidane-mcp/mcpendpoint"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// scopeVerdict is the verdict of a scope map on one call.
func scopeVerdict(m *policy.ScopeMap, p policy.Principal, c message.Call) Verdict {
	d := m.Decide(p, c)
	switch {
	case d.Allowed:
		return Verdict{}
	case d.Machine:
		return Refuse(http.StatusForbidden, ReasonMachine,
			fmt.Sprintf("token %q is a machine token, and machine tokens may not drive coding-agent sessions: use a user token", p.Name))
	}
	return NeedScope(p, c, d.Need)
}

// scopeVisible says whether a scope map lets p use a listed item.
func scopeVisible(m *policy.ScopeMap, p policy.Principal, it Item) bool {
	if it.Kind == KindTool {
		return m.ToolVisible(p, it.Name)
	}
	return m.Decide(p, it.Use()).Allowed
}

// Sessions is the sessions endpoint: the sessions and interactions tools,
// which drive coding agents on this host, for people's tokens only.
type Sessions struct {
	Scopes *policy.ScopeMap
	// Rules are the operator's rules over calls (see ruleVerdict); an
	// allow rule never admits a machine token, which Admit refuses.
	Rules *rules.Set
	// Endpoint serves MCP (package mcpendpoint).
	Endpoint http.Handler
	// Base says where the agents of sessions a request creates reach this
	// gateway (see mcpendpoint.WithBase): from configuration or the
	// request's listener, never from its Host.
	Base func(*http.Request) string
}

// Admit refuses machine tokens: they may not start or steer agents.
func (*Sessions) Admit(p policy.Principal) Verdict {
	if p.Kind == policy.KindMachine {
		return Refuse(http.StatusForbidden, ReasonMachine,
			fmt.Sprintf("token %q is a machine token, and machine tokens may not use the sessions endpoint: use a user token", p.Name))
	}
	return Verdict{}
}

// Authorize decides c by the scope map: verbs, mostly. The endpoint's only
// resources are the sessions' events (MCP 2026-07-28), so reading one, or
// subscribing to one, is decided as `sessions events` is, whatever the URI
// (the endpoint then decides whose session it is): no resource method
// reaches an agent, and a token that may not call events gets none.
func (s *Sessions) Authorize(p policy.Principal, c message.Call) Verdict {
	return ruleVerdict(s.Rules, RuleRouteSessions, p, c, "", true, s.authorize(p, c))
}

func (s *Sessions) authorize(p policy.Principal, c message.Call) Verdict {
	switch c.Method {
	case "resources/read", "resources/subscribe", "resources/unsubscribe":
		if v := scopeVerdict(s.Scopes, p, sessionEvents); !v.Allowed() {
			if len(v.Need) == 0 {
				return v
			}
			v.Message = fmt.Sprintf("token %q may not read sessions' events (%s of a resource is decided as sessions events): it needs one of %s",
				p.Name, c.Method, strings.Join(v.Need, ", "))
			return v
		}
		return Verdict{}
	}
	return scopeVerdict(s.Scopes, p, c)
}

// sessionEvents is the call a sessions-endpoint resource is decided as.
var sessionEvents = message.Call{Method: "tools/call", Tool: "sessions", Verb: "events"}

// Visible shows the tools p may call with some verb, and the events
// resources to whoever may call sessions events.
func (s *Sessions) Visible(p policy.Principal, it Item) bool {
	var shown bool
	if it.Kind == KindResource || it.Kind == KindResourceTemplate {
		shown = s.Scopes.Decide(p, sessionEvents).Allowed
	} else {
		shown = scopeVisible(s.Scopes, p, it)
	}
	return ruleVisible(s.Rules, RuleRouteSessions, p, it, "", true, shown)
}

// Serve hands r to the endpoint, on a lean context. go-sdk keeps the
// context of the request that created an MCP session for the session's
// whole life; Caddy's request context holds the whole request (headers,
// variables, the replacer), which an idle session has no use for, so the
// endpoint gets the same cancellation and only the values it reads (and,
// on a cluster, a JWT principal's access token: policy.WithJWT). This
// halves what an idle session costs.
func (s *Sessions) Serve(w http.ResponseWriter, r *http.Request, _ Next) error {
	p, _ := policy.PrincipalFrom(r.Context())
	ctx, cancel := context.WithCancel(policy.WithPrincipal(context.Background(), p))
	defer cancel()
	defer context.AfterFunc(r.Context(), cancel)()
	for _, key := range []any{http.LocalAddrContextKey, http.ServerContextKey} {
		if v := r.Context().Value(key); v != nil {
			ctx = context.WithValue(ctx, key, v)
		}
	}
	if s.Base != nil {
		ctx = mcpendpoint.WithBase(ctx, s.Base(r))
	}
	if jwt := policy.JWTFrom(r.Context()); jwt != "" {
		// On a cluster, for the replica that runs a session this request
		// acts on, which verifies a JWT principal's token itself.
		ctx = policy.WithJWT(ctx, jwt)
	}
	s.Endpoint.ServeHTTP(w, r.WithContext(ctx))
	return nil
}

// Upstream is one upstream offered through the broker: an operator's
// pass-through route (`broker NAME`), or a session's egress to an upstream
// it was given (with a machine token that holds upstream:NAME). A
// principal without a scope that grants the upstream learns nothing of it:
// the scope map is strict (see [policy.ScopeMap.Strict]), so only
// initialize, ping and notifications need no scope.
type Upstream struct {
	// Config is the upstream: its name, and its tools allow and deny lists.
	Config upstream.Config
	// Scopes decide calls; strict.
	Scopes *policy.ScopeMap
	// Rules are the operator's rules over calls (see ruleVerdict), which
	// read the upstream's name.
	Rules *rules.Set
	// Egress marks a session_upstream's egress route, for the sessions'
	// agents, whose tokens the gateway mints with the upstream's scope:
	// an allow rule grants nothing there, so that one written for another
	// route never opens the upstream to a token reaching the path
	// directly (a person's, on the sessions site).
	Egress bool
	// Handler is the broker's route to the upstream.
	Handler http.Handler
	// Params is what the route learned of the upstream's x-mcp-header
	// bindings, to check Mcp-Param-* headers against; the zero value
	// starts empty.
	Params ParamHeaders
	// SharedParams, when set, is used instead of Params: a store kept
	// across config reloads, so that a reload does not forget what the
	// route learned and refuse its clients' Mcp-Param-* headers until they
	// list tools again.
	SharedParams *ParamHeaders
	// Pins, when set, pins what the upstream gives a model to read under
	// its name (see package pins).
	Pins *pins.Store
	// Tasks, when set, binds the upstream's task ids (MCP 2026-07-28's
	// Tasks extension) to the token and Route, the name the route's
	// handles carry (see tasks.go).
	Tasks *taskid.Sealer
	Route string
}

func (u *Upstream) bindsTasks() bool { return u.Tasks != nil }

func (u *Upstream) pin(_ Kind, name string) (*pins.Store, string, string) {
	return u.Pins, u.Config.Name, name
}

func (u *Upstream) pinServer() (*pins.Store, string) { return u.Pins, u.Config.Name }

func (u *Upstream) pinSets() (*pins.Store, []string) { return u.Pins, []string{u.Config.Name} }

func (u *Upstream) paramHeaders() *ParamHeaders {
	if u.SharedParams != nil {
		return u.SharedParams
	}
	return &u.Params
}

// Admit admits every authenticated principal; Authorize decides.
func (*Upstream) Admit(policy.Principal) Verdict { return Verdict{} }

// ClientAddressed marks the route as one whose upstream calls are audited
// with the client's address.
func (*Upstream) ClientAddressed() {}

// Authorize refuses a tool the upstream's allow/deny lists keep back, and
// decides the rest by the scope map.
func (u *Upstream) Authorize(p policy.Principal, c message.Call) Verdict {
	if c.IsToolCall() && !u.Config.AllowsTool(c.Tool) {
		return Refuse(http.StatusForbidden, "tool_not_offered",
			fmt.Sprintf("tool %q of upstream %q is not offered through this gateway (tools allow/deny)", c.Tool, u.Config.Name))
	}
	return ruleVerdict(u.Rules, RuleRouteBroker, p, c, u.Config.Name, !u.Egress, scopeVerdict(u.Scopes, p, c))
}

// Visible shows what p may use and the upstream's lists offer.
func (u *Upstream) Visible(p policy.Principal, it Item) bool {
	if it.Kind == KindTool && !u.Config.AllowsTool(it.Name) {
		return false
	}
	return ruleVisible(u.Rules, RuleRouteBroker, p, it, u.Config.Name, !u.Egress, scopeVisible(u.Scopes, p, it))
}

// Serve opens r's task handles and hands r to the broker.
func (u *Upstream) Serve(w http.ResponseWriter, r *http.Request, _ Next) error {
	if u.Tasks != nil {
		var err error
		if r, err = openTasks(w, r, u.Tasks, u.Route, nil); err != nil {
			return err
		}
	}
	u.Handler.ServeHTTP(w, r)
	return nil
}

// Interface guards.
var (
	_ Route = (*Guard)(nil)
	_ Route = (*Sessions)(nil)
	_ Route = (*Upstream)(nil)
	_ Route = (*Aggregate)(nil)
)
