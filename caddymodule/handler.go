package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/approvals/approvalpage"
	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
	"github.com/Tahul/caddy-zidane-mcp/sessionpage"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is `zidane_mcp`, the edge in front of MCP: it checks the browser
// Origin, the bearer token and its scopes, applies rate limits, audits every
// refusal, and then routes what it allowed. In guard mode the route is the
// next handler, such as reverse_proxy to an existing MCP server.
//
// It also serves RFC 9728 protected-resource metadata at
// /.well-known/oauth-protected-resource and at that path followed by the
// resource path, so leave the directive without a path matcher.
type Handler struct {
	// Route is what the site offers behind the edge: one of the modules
	// in namespace http.handlers.zidane_mcp.routes, chosen by its "mode":
	// "sessions" serves the sessions endpoint, "guard" passes authorized
	// requests on, "broker" offers one upstream unchanged, and
	// "aggregate" offers several together.
	RouteRaw json.RawMessage `json:"route,omitempty" caddy:"namespace=http.handlers.zidane_mcp.routes inline_key=mode"`

	// Resource is this MCP server's URL as clients know it, such as
	// https://mcp.example.com/mcp. It is the `resource` of the metadata and
	// the audience JWTs must name. A path alone ("/mcp") takes scheme and
	// host from each request. Default: /mcp.
	Resource string `json:"resource,omitempty"`

	// MaxBodyBytes bounds a JSON-RPC request body. Larger bodies get 413.
	// Default: 1 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`

	// AllowedOrigins lists the browser origins (scheme://host[:port]) that
	// may call the endpoint. A request with any other Origin header gets
	// 403; requests without Origin (non-browser clients) are not affected.
	AllowedOrigins []string `json:"allowed_origins,omitempty"`

	// Scopes are extra rules mapping a scope to the tools, verbs and methods
	// it grants, such as scope "deploy" for tools "deploy_*".
	Scopes []policy.Rule `json:"scopes,omitempty"`

	// Policy is the site's rules over calls, after the global ones
	// (docs/policy.md): deny, approve or allow, each a CEL expression over
	// the principal, the call and its arguments.
	Policy []PolicyRule `json:"policy,omitempty"`

	// NoDefaultScopes turns off the built-in chat, read and mcp rules.
	NoDefaultScopes bool `json:"no_default_scopes,omitempty"`

	// RateLimit sets the token buckets. Default: per token 20/s with a burst
	// of 40; per client IP for missing or failed credentials 1/s with a
	// burst of 10.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`

	// DisableLocalhostProtection lets requests with a non-loopback Host reach
	// a loopback listener, for when another proxy on this machine forwards
	// to it. Off by default: such requests are refused as DNS rebinding.
	DisableLocalhostProtection bool `json:"disable_localhost_protection,omitempty"`

	// JWT, when set, also accepts JWT access tokens from an external
	// identity provider.
	JWT *JWTConfig `json:"jwt,omitempty"`

	// DPoP is how the site treats DPoP (RFC 9449): "optional" (the
	// default) takes bearer tokens, and a DPoP-bound token (a JWT with
	// cnf.jkt, a grant issued to a client that sent a proof) only with the
	// DPoP scheme and a proof signed by its key on every request;
	// "required" takes DPoP-bound tokens only, and the RFC 9728 metadata
	// says dpop_bound_access_tokens_required. Proofs are checked against
	// Resource, which must then be an absolute URL: with a path alone,
	// bound tokens are refused. Each proof is taken once (across the
	// cluster on zidane_nats storage).
	DPoP string `json:"dpop,omitempty"`

	// DPoPNonce makes every DPoP proof carry a nonce this server issued
	// (RFC 9449 §8): answers carry a DPoP-Nonce header, and a proof
	// without a current nonce is refused use_dpop_nonce, which clients
	// retry with it. Needs Resource as an absolute URL.
	DPoPNonce bool `json:"dpop_nonce,omitempty"`

	authn      policy.Authenticator
	tokens     *policy.TokenStore
	scopes     *policy.ScopeMap
	offered    []string // what the RFC 9728 document lists and the sign-in grants: the rules' scopes and the route's own
	origins    *policy.Origins
	tokenLimit *policy.Limiter
	ipLimit    *policy.Limiter
	ipv6Prefix int // the prefix length by which ipLimit keys IPv6 clients
	limitKey   string
	jwt        *policy.JWTVerifier
	dpop       edge.DPoP
	resURL     *url.URL // absolute when configured so, else path only
	approvals  *edge.Approvals
	route      routing // what the route module gives to serve
	app        *App    // this config's zidane app (upstream OAuth logins)
	releaseOwn func()  // this handler's hold on agentDeny
	logger     *zap.Logger
	audit      *zap.Logger
}

// RateLimit configures the token buckets.
type RateLimit struct {
	// PerToken limits each authenticated principal.
	PerToken *policy.Limit `json:"per_token,omitempty"`
	// PerIP limits requests from one client IP that carry no credential or
	// a failed one, which slows brute force: once its bucket is empty, they
	// get 429 instead of 401. It is consulted after the credential, and a
	// valid one is never refused for its address. The client IP follows
	// the server's trusted_proxies setting; IPv6 clients are counted per
	// prefix (see IPv6Prefix), IPv4-mapped IPv6 ones as IPv4.
	PerIP *policy.Limit `json:"per_ip,omitempty"`
	// IPv6Prefix is the prefix length, in bits from 1 to 128, by which
	// PerIP counts IPv6 clients: one client holds every address of its
	// prefix. Default 64.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`
}

// ipv6Prefix is the configured IPv6Prefix, or the default.
func (rl *RateLimit) ipv6Prefix() (int, error) {
	if rl == nil || rl.IPv6Prefix == 0 {
		return policy.DefaultIPv6Prefix, nil
	}
	if err := policy.CheckIPv6Prefix(rl.IPv6Prefix); err != nil {
		return 0, fmt.Errorf("rate_limit ipv6_prefix: %w", err)
	}
	return rl.IPv6Prefix, nil
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.zidane_mcp", New: func() caddy.Module { return new(Handler) }}
}

const (
	defaultMaxBody    = 1 << 20
	defaultResource   = "/mcp"
	wellKnownResource = edge.WellKnownResource
	mcpSessionHeader  = "Mcp-Session-Id"
	protocolHeader    = "Mcp-Protocol-Version"
)

var (
	defaultTokenLimit = policy.Limit{Rate: 20, Burst: 40}
	defaultIPLimit    = policy.Limit{Rate: 1, Burst: 10}
)

// Provision builds the policy objects, looks up the shared state, and
// loads the route, which builds on them.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.audit = auditLoggerOf(ctx)
	// The files this handler reads secrets from (a guard's upstream_header
	// {file.…}, in the route's JSON, the JWT public key) are no agent's,
	// read or write: one who rewrites the JWT key signs its own tokens.
	own := gatewayfiles.PlaceholderFiles(h)
	if h.JWT != nil && h.JWT.PublicKeyFile != "" {
		own = append(own, gatewayfiles.File{Path: h.JWT.PublicKeyFile, Why: whyJWTKey})
	}
	h.releaseOwn = agentDeny.Hold(own)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	appIface, err := ctx.App("zidane")
	if err != nil {
		return err
	}
	h.app = appIface.(*App)
	h.tokens = h.app.Tokens()

	if h.MaxBodyBytes == 0 {
		h.MaxBodyBytes = defaultMaxBody
	}
	if h.Resource == "" {
		h.Resource = defaultResource
	}
	if h.resURL, err = parseResource(h.Resource); err != nil {
		return err
	}
	if h.scopes, err = policy.NewScopeMap(h.Scopes, !h.NoDefaultScopes); err != nil {
		return err
	}
	h.offered = h.scopes.Names()
	if h.app.approvals != nil {
		h.approvals = &edge.Approvals{Store: h.app.approvals, Site: h.resURL.String()}
		if iss := h.app.signinIssuer(); iss != "" {
			h.approvals.StatusPage = func(id string) string { return approvalpage.URL(iss, id) }
		}
	}
	if err := h.app.signinResource(h.resURL.String(), h.resURL.IsAbs(), h.offered); err != nil {
		return err
	}
	if h.origins, err = policy.NewOrigins(h.AllowedOrigins); err != nil {
		return err
	}
	if err := h.provisionLimits(ctx); err != nil {
		return err
	}
	if err := h.provisionDPoP(ctx); err != nil {
		return err
	}
	h.authn = policy.Authenticator{Tokens: h.tokens, Suspects: suspectQueue}
	if h.JWT != nil {
		v, err := h.JWT.build(ctx, h.resURL)
		if err != nil {
			return err
		}
		h.jwt, h.authn.JWT = v, v
	}
	if h.RouteRaw == nil {
		return nil // Validate says what is missing
	}
	// The route builds on this handler's policy, which it finds in its
	// context: Caddy gives a guest module nothing else.
	sitePolicy, err := compilePolicy(h.Resource+" policy", h.Policy)
	if err != nil {
		return err
	}
	s := &site{resource: h.Resource, resURL: h.resURL, maxBody: h.MaxBodyBytes, rules: h.Scopes, defaults: !h.NoDefaultScopes,
		scopes: h.scopes, policy: rules.Join(h.app.policy, sitePolicy), authn: h.authn, app: h.app, audit: h.audit, logger: h.logger, agentBase: edge.ProtectedResource{URL: h.resURL}.AgentBase}
	mod, err := ctx.WithValue(siteKey{}, s).LoadModule(h, "RouteRaw")
	if err != nil {
		return fmt.Errorf("loading the route: %w", err)
	}
	m, ok := mod.(routeModule)
	if !ok {
		return fmt.Errorf("module %T is no zidane_mcp route", mod)
	}
	h.route = m.routing()
	// A route that grants scopes of its own (upstream:<name>) offers
	// them too: the sign-in grants no scope its resource does not name,
	// so a person given upstream:<name> could not sign in for the upstream.
	for _, sc := range h.route.scopes {
		if !slices.Contains(h.offered, sc) {
			h.offered = append(h.offered, sc)
		}
	}
	return h.app.signinResource(h.resURL.String(), h.resURL.IsAbs(), h.offered)
}

// provisionLimits sets up the token buckets, shared by every handler of
// the same resource and limits (and, on NATS storage, every replica).
func (h *Handler) provisionLimits(ctx caddy.Context) error {
	tokenLimit, ipLimit := defaultTokenLimit, defaultIPLimit
	if h.RateLimit != nil {
		if h.RateLimit.PerToken != nil {
			tokenLimit = *h.RateLimit.PerToken
		}
		if h.RateLimit.PerIP != nil {
			ipLimit = *h.RateLimit.PerIP
		}
	}
	for name, l := range map[string]policy.Limit{"per_token": tokenLimit, "per_ip": ipLimit} {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("rate_limit %s: %w", name, err)
		}
	}
	var err error
	if h.ipv6Prefix, err = h.RateLimit.ipv6Prefix(); err != nil {
		return err
	}
	// The usage is shared under a name of the resource and the limits,
	// which every replica gives alike; the pooled limiters are kept per
	// NATS storage too, whose connection their sharing uses: a reload onto
	// other NATS settings closes the old connection with the old config.
	shareName := fmt.Sprintf("limits|%s|%v|%v", h.Resource, tokenLimit, ipLimit)
	h.limitKey = shareName
	if _, shared := ctx.Storage().(*cluster.Storage); shared {
		h.limitKey += "|" + storageKey(ctx.Storage())
	}
	lv, _, err := limiterPool.LoadOrNew(h.limitKey, func() (caddy.Destructor, error) {
		l := &limiters{token: policy.NewLimiter(tokenLimit), ip: policy.NewLimiter(ipLimit)}
		return l, l.share(ctx, shareName)
	})
	if err != nil {
		return err
	}
	h.tokenLimit, h.ipLimit = lv.(*limiters).token, lv.(*limiters).ip
	return nil
}

// chooseOneMode is the error of a handler with no route, or in the
// Caddyfile with more than one mode.
const chooseOneMode = "zidane_mcp: choose one mode: `sessions` serves the sessions endpoint; `broker NAME` offers a configured upstream; `aggregate NAME...` offers several together; `guard` passes authorized requests to the next handler (for example reverse_proxy), or with guard { upstream URL } to that MCP server"

// Validate checks that a route is given.
func (h *Handler) Validate() error {
	if h.route.route == nil {
		return errors.New(chooseOneMode)
	}
	return nil
}

// Cleanup releases this config's hold on the shared buckets. Caddy cleans
// up the route module itself, as every module it loaded.
func (h *Handler) Cleanup() error {
	if h.releaseOwn != nil {
		h.releaseOwn()
	}
	if h.jwt != nil {
		h.jwt.Close()
	}
	if h.limitKey != "" {
		_, err := limiterPool.Delete(h.limitKey)
		return err
	}
	return nil
}

// limiterPool keeps rate-limit buckets across reloads, keyed by the
// resource and the limits, so a reload that keeps the limits keeps what
// each bucket has left.
var limiterPool = caddy.NewUsagePool()

type limiters struct {
	token, ip *policy.Limiter
	shares    []*cluster.LimitShare // on NATS storage: the usage shared with the other replicas
}

// limitSharePeriod is how often a replica tells the others what its
// limiters let through. Off the request path; what replicas let through
// before they hear of each other's usage is what a shared budget can be
// over by.
const limitSharePeriod = 100 * time.Millisecond

// share, on NATS storage, shares both limiters' usage with every replica
// whose site has the same resource and limits.
func (l *limiters) share(ctx caddy.Context, key string) error {
	cs, ok := ctx.Storage().(*cluster.Storage)
	if !ok {
		return nil
	}
	log := slog.New(zapslog.NewHandler(ctx.Logger().Named("limits").Core()))
	for name, lim := range map[string]*policy.Limiter{"token": l.token, "ip": l.ip} {
		s, err := cs.ShareLimits(key+"|"+name, lim, limitSharePeriod, log)
		if err != nil {
			_ = l.Destruct()
			return fmt.Errorf("zidane_mcp rate_limit: %w", err)
		}
		l.shares = append(l.shares, s)
	}
	return nil
}

func (l *limiters) Destruct() error {
	for _, s := range l.shares {
		s.Close()
	}
	l.shares = nil
	return nil
}

func parseResource(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("resource %q: %v", s, err)
	}
	if u.IsAbs() {
		if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("resource %q: give an http(s) URL such as https://mcp.example.com/mcp, or a path such as /mcp", s)
		}
	} else if !strings.HasPrefix(u.Path, "/") || u.Host != "" {
		return nil, fmt.Errorf("resource %q: give an http(s) URL such as https://mcp.example.com/mcp, or a path such as /mcp", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("resource %q: a resource URL has no query or fragment", s)
	}
	return u, nil
}

// ServeHTTP sequences the six steps of the request path; each decision
// belongs to a core object (package edge, package policy, the route).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	rf := refusal{clientIP: clientIP(r), origin: r.Header.Get("Origin"), method: r.Method}
	// The client's address reaches the broker's routes from the edge
	// alone (see serve): a client's copy is no one's to read.
	delete(r.Header, upstream.ClientIPHeader)

	// 1. Host and Origin, once Origin and Authorization are known to be
	// sent once each.
	if v := edge.CheckSingleHeaders(r); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	// A request another replica forwarded (forward.go) is checked by its
	// signature, which no client can make, and nothing else.
	if edge.IsHop(r.Header) {
		return h.serveHop(w, r, rf)
	}
	// The sign-in's endpoints are before the Origin check: a browser
	// posts the consent form from the issuer's origin, which need not be
	// one of the MCP endpoint's allowed_origins, and the authorization
	// server checks that Origin itself. They read no Host.
	if h.app != nil && h.app.signin != nil && h.app.signin.serves(r.URL.Path) {
		if v := edge.CheckHost(r, !h.DisableLocalhostProtection); !v.Allowed() {
			return h.refuse(w, r, rf, v)
		}
		h.app.signin.ServeHTTP(w, r)
		return nil
	}
	if v := edge.CheckHostOrigin(r, h.origins, !h.DisableLocalhostProtection); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	if edge.Preflight(w, r) || h.servePublic(w, r) {
		return nil
	}
	route, span, v := h.routeFor(r.URL.Path)
	if !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}

	// 2. Authenticate.
	now := time.Now()
	if n := h.dpop.Nonce(now); n != "" {
		// On every answer from here, so that a client keeps a current
		// nonce without a refusal to learn it from.
		w.Header().Set("DPoP-Nonce", n)
	}
	p, v := h.authenticate(r, rf.clientIP, now)
	if !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	rf.p = p
	setUserID(r, p)
	tr := traceSteps(r)
	if tr.on() {
		tr.event("auth", "allowed", "", principalAttrs(p)...)
	}

	// 3. Read the message once; 4. authorize it.
	if v := edge.CheckRequest(r); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	var body []byte
	if r.Method == http.MethodPost {
		if body, v = edge.ReadBody(r, h.MaxBodyBytes); !v.Allowed() {
			return h.refuse(w, r, rf, v)
		}
	} else if v := edge.NoBody(r); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	d := edge.Decide(route, p, r.Method, r.Header, body)
	limited := false
	if d.Reason == edge.ReasonApproval {
		// A held call costs storage work: it is rate limited before it
		// is held, as an allowed call is before it is served.
		if v := edge.RateLimit(h.tokenLimit, p.TokenID, now); !v.Allowed() {
			rf.call = d.Call
			metricRateLimited.WithLabelValues("token").Inc()
			return h.refuse(w, r, rf, v)
		}
		limited = true
		if v := edge.UnknownSessionOf(route, r); !v.Allowed() {
			// No replica runs it: its approval is not settled (used up).
			rf.call = d.Call
			return h.refuse(w, r, rf, v)
		}
		if edge.SettledByOwner(route, r) {
			// Its session is another replica's, which decides it again
			// and runs it: that replica settles its approval (serveHop).
			d.Verdict = edge.Verdict{}
			r = r.WithContext(edge.WithOwnerSettles(r.Context()))
		}
	}
	if !edge.OwnerSettles(r.Context()) {
		h.settle(r, route, p, &d)
	}
	if !d.Allowed() {
		rf.call = d.Call
		return h.refuse(w, r, rf, d.Verdict)
	}
	for _, rd := range d.Ruled {
		logRuleAllowed(h.audit, p, rd, rf.clientIP)
	}
	var traced []attribute.KeyValue // the principal and the call, for the step events after auth
	if tr.on() {
		traced = append(principalAttrs(p), callAttrs(d.Body)...)
		tr.event("inspect", "allowed", "", traced...)
		tr.event("decide", "allowed", "", traced...)
	}

	// 5. Rate limit (a held call was, before it was held).
	if v := (edge.Verdict{}); !limited {
		if v = edge.RateLimit(h.tokenLimit, p.TokenID, now); !v.Allowed() {
			if d.Body != nil {
				rf.call = d.Body.Calls[0]
			}
			metricRateLimited.WithLabelValues("token").Inc()
			return h.refuse(w, r, rf, v)
		}
	}
	tr.event("limit", "allowed", "", traced...)

	// A replica that is shutting down finishes the sessions it holds and
	// opens none.
	if draining() {
		if v := edge.Drain(r.Method, r.Header, d.Body); !v.Allowed() {
			rf.call = d.Body.Calls[0]
			return h.refuse(w, r, rf, v)
		}
	}

	// 6. Serve.
	var rounds *edge.Continuation
	if d.Grant != nil && d.Body != nil {
		rounds = h.approvals.Continuation(r.Context(), d.Grant, d.Body.Calls[0])
		if s, ok := h.approvals.Settlement(d.Verdict); ok {
			// For a hop that sends the call to another replica.
			r = r.WithContext(edge.WithSettlement(r.Context(), s))
		}
	}
	return h.serve(w, r, route, span, p, d.Body, rounds, rf, tr, next)
}

// settle decides a call that an approve rule holds (d.Reason
// edge.ReasonApproval) on the approvals of the site (edge.Approvals.
// Settle), on the replica that runs it: an approved call is allowed, its
// rule to be audited; any other is refused. The retry of an approval's
// input_required answer (d.StripState), or a call no rule holds now that
// carries an approval's state (the rules changed between the rounds, or a
// client copied it), loses its requestState and inputResponses, which are
// the gateway's, never the backend's; the retry of an approved call's
// round (d.Round) gets the backend's requestState back, and keeps its
// inputResponses, which answer the backend.
func (h *Handler) settle(r *http.Request, route edge.Route, p policy.Principal, d *edge.Decision) {
	if d.Reason == edge.ReasonApproval {
		if h.route.urlElicitation != nil && route == h.route.route {
			d.URLElicitation = h.route.urlElicitation(r, p)
		}
		d.Verdict = h.approvals.Settle(r.Context(), *d)
		if d.Allowed() {
			d.Ruled = append(d.Ruled, edge.RuleDecision{Call: d.Call, Rule: d.Rule, Effect: d.RuleEffect})
		}
	}
	if d.Allowed() && d.Body != nil && !d.Body.Batch && len(d.Body.Calls) == 1 && edge.IsApprovalState(d.Body.Calls[0].RequestState) {
		var nb *message.Body
		var err error
		if d.Round != nil {
			nb, err = edge.RestoreRequestState(r, d.Body, *d.Round)
		} else {
			nb, err = edge.WithoutRequestState(r, d.Body)
		}
		if err != nil {
			d.Call = d.Body.Calls[0]
			d.Verdict = edge.Verdict{Status: http.StatusBadRequest, Reason: edge.ReasonMalformed, Code: message.CodeInvalidRequest,
				Message: "the retry could not be read again (" + err.Error() + "); send the call again without requestState and inputResponses"}
			return
		}
		d.Body = nb
	}
}

// servePublic serves what needs no bearer token, each behind its own
// capability or none: the RFC 9728 metadata, a session's page (a link
// bound to one session), the gateway's OAuth client metadata document and
// an upstream login's callback (its one-time state).
func (h *Handler) servePublic(w http.ResponseWriter, r *http.Request) bool {
	switch path := r.URL.Path; {
	case strings.HasPrefix(path, wellKnownResource) && (edge.ProtectedResource{URL: h.resURL}).ServesMetadata(path):
		h.protectedResource().ServeMetadata(w, r)
	case h.route.page != nil && strings.HasPrefix(path, sessionpage.PathPrefix):
		h.route.page.ServeHTTP(w, r)
	case h.app != nil && h.app.serveClientMetadata(w, r):
	case strings.HasPrefix(path, OAuthCallbackPath):
		_ = h.serveOAuthCallback(w, r)
	case path == HealthzPath:
		h.serveHealthz(w, r)
	default:
		return false
	}
	return true
}

// routeFor is the route of a request path (edge.EgressRoute), and how its
// span is made: a session's egress route under edge.EgressPrefix<name>/ on
// the sessions endpoint, else the site's own.
func (h *Handler) routeFor(path string) (edge.Route, spanning, edge.Verdict) {
	route, v := edge.EgressRoute(path, h.route.route, h.route.egress)
	switch {
	case !v.Allowed():
		return nil, spanning{}, v
	case route != h.route.route:
		return route, egressSpan, v
	}
	return route, h.route.span, v
}

// absoluteResource is the site's resource URL as grants name it, or ""
// when the resource is configured as a path alone.
func (h *Handler) absoluteResource() string {
	if h.resURL == nil || !h.resURL.IsAbs() {
		return ""
	}
	return h.resURL.String()
}

// authenticate is step 2 (edge.Authentication): the credential's
// principal, or its refusal; a refusal for the identity provider's keys
// logs their detail, and one for the address's bucket is counted.
func (h *Handler) authenticate(r *http.Request, clientIP string, now time.Time) (policy.Principal, edge.Verdict) {
	a := edge.Authentication{Authn: h.authn, Failures: h.ipLimit, IPv6Prefix: h.ipv6Prefix, DPoP: h.dpop, PerToken: h.tokenLimit,
		Resource: h.absoluteResource()}
	c := edge.CredentialOf(r)
	c.Path = hopURL(r).EscapedPath() // the path the client sent, which its proof names
	p, v, err := a.Check(r.Context(), c, clientIP, now)
	switch v.Reason {
	case edge.ReasonKeysUnavailable:
		h.logger.Error("JWT signing keys unavailable", zap.String("detail", err.Error()))
	case edge.ReasonRateLimitedIP:
		metricRateLimited.WithLabelValues("ip").Inc()
	}
	return p, v
}

// suspectQueue is where the JWT signature checks of requests from an
// address whose bucket of failed attempts is empty wait their turn (see
// policy.Authenticator.AuthenticateSuspect): one process-wide queue, so that however
// many addresses guess at once, they keep at most a quarter of the CPUs
// (at least one) busy verifying signatures.
var suspectQueue = policy.NewSuspectQueue(runtime.GOMAXPROCS(0) / 4)

// serve is step 6: the route serves the request with the principal and
// the body it was allowed on in its context, without the client's
// credential, and behind the listing filter, which every answer passes
// (and which binds the next round of an approved call, rounds). tr is the
// request's step tracer, looked up once in ServeHTTP.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, route edge.Route, span spanning, p policy.Principal, b *message.Body, rounds *edge.Continuation, rf refusal, tr steps, next caddyhttp.Handler) (err error) {
	ip := rf.clientIP
	countAllowed(p)
	if b != nil && !edge.OwnerSettles(r.Context()) { // else the owner audits it, once it has settled it
		for _, c := range b.Calls {
			if c.IsToolCall() {
				logToolCall(h.audit, p, c, ip)
			}
		}
	}
	ctx, rs := tr.routeSpan(r.Context(), r, span, p, b)
	defer func() { endRoute(rs, err) }()
	ctx, cancel := context.WithCancel(policy.WithPrincipal(ctx, p))
	defer cancel()
	if b != nil {
		ctx = message.NewContext(ctx, b)
	}
	if _, ok := route.(edge.ForwardedRoute); ok && policy.IsJWTID(p.TokenID) {
		// The replica that holds the request's session, or runs the agent
		// session it acts on, verifies a JWT principal's access token
		// itself (see edge.HopKey.Sign, clustersessions).
		ctx = policy.WithJWT(ctx, policy.BearerJWT(r.Header.Get("Authorization")))
	}
	if _, ok := route.(edge.ForwardedRoute); ok && p.JKT != "" {
		// And checks a bound principal's proof again (edge.DPoP.CheckForwarded).
		ctx = edge.WithProof(ctx, r.Header.Get("DPoP"))
	}
	// A revoked token's (or JWT subject's) open requests and streams end at
	// once, and every one ends when the process exits: the token store
	// cancels what it holds then (see loadTokens); a request that arrives
	// after that ends at once.
	defer h.tokens.Hold(p.TokenID, cancel).Release()
	select {
	case <-processExit().Done():
		cancel()
	default:
	}
	r = r.WithContext(ctx)
	delete(r.Header, "Authorization") // canonical names: Header.Del would only canonicalize them again
	delete(r.Header, "Dpop")          // a proof is for this edge, as the token is
	// Every answer goes through the listing filter, which reads it: ask
	// for it uncompressed (an `encode` in front still compresses what the
	// client gets).
	delete(r.Header, "Accept-Encoding")
	if _, ok := route.(edge.ClientAddressed); ok {
		r.Header[upstream.ClientIPHeader] = []string{ip}
	}
	f := edge.NewListing(route, p, b, func(d edge.Drop) { h.auditDrop(r, d) })
	f.Max = h.route.answerMax
	f.Budget = h.app.answerBudget
	f.Rounds = rounds
	fw, closeFilter := f.Wrap(w)
	if err = route.Serve(fw, r, next); err != nil {
		if re := (*edge.RefusalError)(nil); errors.As(err, &re) {
			// Refused before anything was written: answered and audited
			// as the edge's own refusals are.
			if b != nil {
				rf.call = b.Calls[0]
			}
			return h.refuse(w, r, rf, re.Verdict)
		}
	}
	if cerr := closeFilter(); err == nil {
		err = cerr
	}
	return err
}

func clientIP(r *http.Request) string {
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok && ip != "" {
		return ip
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
