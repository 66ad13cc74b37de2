package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/broker/aggregate"
	"github.com/Tahul/caddy-zidane-mcp/broker/passthrough"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// What a zidane_mcp site offers behind its edge is a guest module in this
// namespace, chosen by the "mode" key of the handler's "route" object, as
// reverse_proxy chooses its transport: sessions, guard, broker or
// aggregate. Each provisions, validates and cleans up what it holds; the
// handler loads one and serves through it without asking which it is.
const routesNamespace = "http.handlers.zidane_mcp.routes"

func init() {
	caddy.RegisterModule(Sessions{})
	caddy.RegisterModule(Guard{})
	caddy.RegisterModule(Broker{})
	caddy.RegisterModule(Aggregate{})
}

// routeModule is a guest module of the handler's "route".
type routeModule interface {
	caddy.Module
	caddy.Provisioner
	caddy.CleanerUpper
	// routing is what the handler serves through, built in Provision.
	routing() routing
}

// routing is what a route module gives its handler: the same shape for
// every mode, so that the handler never asks which mode it serves.
type routing struct {
	route edge.Route
	span  spanning
	// egress, on the sessions endpoint, are the routes of the upstreams
	// offered to sessions, under egressPrefix<name>/.
	egress map[string]edge.Route
	// page, on the sessions endpoint, serves the read-only session pages
	// behind their links.
	page http.Handler
	// handsOutURLs is set where the route hands agents URLs on this site
	// (the sessions endpoint), which need an address (checkAgentBases).
	handsOutURLs bool
	// answerMax is Listing.Max of every answer: a guard's max_response
	// when the next handler answers, else 0 (the pass-through and the
	// aggregated route bound what their upstreams send themselves).
	answerMax int64
	// scopes are the scopes the route grants beyond the site's rules
	// (upstream:<name> and an upstream's own scope), which the site
	// offers with its own.
	scopes []string
	// urlElicitation, where the route remembers it (the broker's
	// pass-through), reports whether a request's session declared URL
	// elicitation at its initialize.
	urlElicitation func(*http.Request, policy.Principal) bool
}

// egressSpan is how the span of a request to an upstream offered to
// sessions is made: as the broker's pass-through route, which it is.
var egressSpan = spanning{name: "broker"}

// site is what a route module takes from its handler: the handler's
// policy, which it builds before it loads its route.
type site struct {
	resource string   // as configured, or the default
	resURL   *url.URL // absolute when configured so, else path only
	maxBody  int64
	rules    []policy.Rule // the handler's extra scope rules
	defaults bool          // whether the built-in scope rules are on
	scopes   *policy.ScopeMap
	// policy is the operator's rules over calls: the global ones, then
	// the site's (nil: none).
	policy *rules.Set
	authn  policy.Authenticator
	app    *App
	audit  *zap.Logger
	logger *zap.Logger // the handler's, under whose name routes log
	// agentBase is where the agents of sessions a request creates reach
	// this gateway (Handler.agentBase).
	agentBase func(*http.Request) string
}

type siteKey struct{}

// siteOf is the site that loads the route module being provisioned.
func siteOf(ctx caddy.Context) (*site, error) {
	s, ok := ctx.Value(siteKey{}).(*site)
	if !ok {
		return nil, errors.New("a zidane_mcp route is loaded by the zidane_mcp handler: give it as the handler's \"route\"")
	}
	return s, nil
}

// routeBase is what every route module holds: its site, what it gives the
// handler, and its holds on the shared learned bindings and pins, which
// its Cleanup releases.
type routeBase struct {
	site      *site
	out       routing
	paramsKey string   // this route's hold on paramsPool
	pinNS     []string // the pin namespaces this route opened
}

func (b *routeBase) routing() routing { return b.out }

// release lets go of what the route holds in the shared pools.
func (b *routeBase) release() {
	if b.paramsKey != "" {
		_, _ = paramsPool.Delete(b.paramsKey)
		b.paramsKey = ""
	}
	b.closePins()
}

// Sessions serves the sessions endpoint: the `sessions` and `interactions`
// MCP tools that drive coding-agent sessions on this host, and the
// read-only session pages behind their links. It takes no option: agents
// are configured in the zidane app (global option).
type Sessions struct {
	routeBase
	state    *sessionsState
	stateKey string // this route's hold on sessionsPool
}

// CaddyModule returns the Caddy module information.
func (Sessions) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: routesNamespace + ".sessions", New: func() caddy.Module { return new(Sessions) }}
}

// Provision opens the sessions endpoint that the app's storage shares.
func (m *Sessions) Provision(ctx caddy.Context) error {
	s, err := siteOf(ctx)
	if err != nil {
		return err
	}
	m.site = s
	m.out.span = spanning{name: m.CaddyModule().ID.Name()}
	m.out.handsOutURLs = true
	return m.build(ctx)
}

// Cleanup releases this config's hold on the sessions endpoint.
func (m *Sessions) Cleanup() error {
	m.release()
	if m.stateKey == "" {
		return nil
	}
	_, err := sessionsPool.Delete(m.stateKey)
	m.stateKey = ""
	return err
}

// Guard passes authorized requests on, with the client's Authorization
// header removed: to the next handler, such as reverse_proxy, or with
// Upstream to that MCP server.
type Guard struct {
	routeBase
	pt *passthrough.PassThrough

	// UpstreamHeaders are set on every request passed on, after the
	// client's Authorization is removed: an upstream credential, for
	// example, given as a placeholder such as {env.UPSTREAM_TOKEN}. A
	// literal value is refused (the admin API and autosave.json would show
	// it), but for Accept, Accept-Language, Content-Type, User-Agent and
	// Mcp-Protocol-Version.
	UpstreamHeaders map[string]string `json:"upstream_headers,omitempty"`

	// MaxResponse bounds what the guarded server may send in answer to
	// one request, in bytes; past it the client gets a JSON-RPC error and
	// the answer is ended. A GET stream is bounded per event (8 MiB).
	// Default: 16 MiB.
	MaxResponse int64 `json:"max_response,omitempty"`

	// Upstream, when set, is the guarded MCP server's streamable HTTP URL:
	// the guard sends what it allowed there itself, through the broker's
	// pass-through (origin-pinned, plain http only to loopback, session
	// ids sealed, only the MCP transport's headers), and the next handler
	// is not called. Unset, authorized requests go to the next handler,
	// such as reverse_proxy.
	Upstream string `json:"upstream,omitempty"`

	// Pin is what the guard does when one of the server's tools changes
	// its definition after it was first listed (package pins): "strict"
	// (the default: withhold it until an operator approves), "warn" or
	// "off".
	Pin string `json:"pin,omitempty"`

	// NewTools is what the guard does with a tool the server lists after
	// its tools were listed whole (package pins): "hold" (withheld until
	// an operator approves it, with pin strict) or "allow" (pinned on
	// first sight). Default: hold, but allow for an Upstream on loopback
	// (reverse_proxy's server is not known to the guard, so it holds).
	NewTools string `json:"new_tools,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Guard) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: routesNamespace + ".guard", New: func() caddy.Module { return new(Guard) }}
}

// Provision builds the guard's route. Caddy validates a module after
// Provision; the guard checks its options first, so that nothing is built
// of a bad one (a literal credential never reaches the pass-through).
func (g *Guard) Provision(ctx caddy.Context) error {
	s, err := siteOf(ctx)
	if err != nil {
		return err
	}
	if err := g.Validate(); err != nil {
		return err
	}
	g.site = s
	g.out.span = spanning{name: g.CaddyModule().ID.Name(), client: true}
	return g.build(ctx)
}

// Validate checks the guard's options.
func (g *Guard) Validate() error {
	if err := checkGuardHeaders(g.UpstreamHeaders); err != nil {
		return err
	}
	if g.Upstream != "" {
		if err := checkGuardUpstream(g.Upstream); err != nil {
			return err
		}
	}
	if g.MaxResponse < 0 {
		return fmt.Errorf("guard max_response %d is negative; give a size such as 16MiB", g.MaxResponse)
	}
	_, err := g.pinPolicy()
	return err
}

// Cleanup closes the pass-through and releases the guard's holds.
func (g *Guard) Cleanup() error {
	if g.pt != nil {
		g.pt.Close()
		g.pt = nil
	}
	g.release()
	return nil
}

// Broker offers an upstream configured in the zidane app unchanged: the
// pass-through route. The client's token is checked at the edge and
// removed; the upstream's credentials are attached by the broker, on its
// configured origin only.
type Broker struct {
	routeBase
	pt *passthrough.PassThrough

	// Upstream names the upstream (global zidane option) to offer.
	Upstream string `json:"upstream"`
}

// CaddyModule returns the Caddy module information.
func (Broker) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: routesNamespace + ".broker", New: func() caddy.Module { return new(Broker) }}
}

// Provision builds the pass-through to the named upstream.
func (b *Broker) Provision(ctx caddy.Context) error {
	s, err := siteOf(ctx)
	if err != nil {
		return err
	}
	if err := b.Validate(); err != nil {
		return err
	}
	b.site = s
	b.out.span = spanning{name: b.CaddyModule().ID.Name()}
	return b.build(ctx)
}

// Validate checks that an upstream is named.
func (b *Broker) Validate() error {
	if b.Upstream == "" {
		return errors.New("broker: name the upstream to offer, one configured in the global zidane option")
	}
	return nil
}

// Cleanup closes the pass-through and releases the route's holds.
func (b *Broker) Cleanup() error {
	if b.pt != nil {
		b.pt.Close()
		b.pt = nil
	}
	b.release()
	return nil
}

// Aggregate offers several upstreams configured in the zidane app together
// on one endpoint, their tools and prompts namespaced
// mcp_<upstream>_<name>.
type Aggregate struct {
	routeBase
	agg *aggregate.Aggregate

	// Upstreams names the upstreams (global zidane option) to offer.
	Upstreams []string `json:"upstreams"`

	// Prefix is the naming: "always" (default), or "conditional", which
	// leaves names as they are when there is one upstream.
	Prefix string `json:"prefix,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Aggregate) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: routesNamespace + ".aggregate", New: func() caddy.Module { return new(Aggregate) }}
}

// Provision builds the aggregated route and starts connecting to its
// upstreams.
func (a *Aggregate) Provision(ctx caddy.Context) error {
	s, err := siteOf(ctx)
	if err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return err
	}
	a.site = s
	a.out.span = spanning{name: a.CaddyModule().ID.Name(), readsTrace: true}
	return a.build(ctx)
}

// Validate checks that upstreams are named and the prefix is known.
func (a *Aggregate) Validate() error {
	if len(a.Upstreams) == 0 {
		return errors.New("aggregate: name the upstreams to offer, configured in the global zidane option")
	}
	if a.Prefix != "" && a.Prefix != "always" && a.Prefix != "conditional" {
		return errors.New("aggregate: prefix takes always or conditional")
	}
	return nil
}

// Cleanup stops the aggregated route and releases its holds.
func (a *Aggregate) Cleanup() error {
	if a.agg != nil {
		liveAggregates.remove(a.agg)
		a.agg.Close()
		a.agg = nil
	}
	a.release()
	return nil
}

// Interface guards.
var (
	_ routeModule     = (*Sessions)(nil)
	_ routeModule     = (*Guard)(nil)
	_ routeModule     = (*Broker)(nil)
	_ routeModule     = (*Aggregate)(nil)
	_ caddy.Validator = (*Guard)(nil)
	_ caddy.Validator = (*Broker)(nil)
	_ caddy.Validator = (*Aggregate)(nil)
)
