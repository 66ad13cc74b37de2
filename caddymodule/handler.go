package caddymodule

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/aggregate"
	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/passthrough"
	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"golang.org/x/net/http/httpguts"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
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
	// Sessions serves the sessions endpoint: the `sessions` and
	// `interactions` MCP tools that drive coding-agent sessions on this
	// host, and the read-only session pages behind their links.
	Sessions *SessionsMode `json:"sessions,omitempty"`

	// Broker names an upstream (global zidane option) to offer on this
	// route unchanged: the pass-through route. The client's token is
	// checked here and removed; the upstream's credentials are attached by
	// the broker, on its configured origin only.
	Broker string `json:"broker,omitempty"`

	// Aggregate names upstreams to offer together on one endpoint, their
	// tools and prompts namespaced mcp_<upstream>_<name>.
	Aggregate []string `json:"aggregate,omitempty"`

	// Prefix is the aggregated route's naming: "always" (default), or
	// "conditional", which leaves names as they are when there is one
	// upstream.
	Prefix string `json:"prefix,omitempty"`

	// Guard turns on guard mode: authorized requests go to the next handler
	// with the client's Authorization header removed.
	Guard *Guard `json:"guard,omitempty"`

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

	authn      policy.Authenticator
	tokens     *policy.TokenStore
	scopes     *policy.ScopeMap
	origins    *policy.Origins
	tokenLimit *policy.Limiter
	ipLimit    *policy.Limiter
	ipv6Prefix int // the prefix length by which ipLimit keys IPv6 clients
	limitKey   string
	paramsKey  string   // this handler's hold on paramsPool
	pinNS      []string // the pin namespaces this handler opened
	jwt        *policy.JWTVerifier
	resURL     *url.URL // absolute when configured so, else path only
	// route is this site's mode; egress, in sessions mode, the routes of
	// the upstreams offered to sessions, under egressPrefix<name>/.
	route       edge.Route
	answerMax   int64 // Listing.Max of every answer: guard max_response; 0 elsewhere
	egress      map[string]edge.Route
	sess        *sessionsState
	sessKey     string
	passThrough *passthrough.PassThrough
	aggregate   *aggregate.Aggregate
	app         *App   // this config's zidane app (upstream OAuth logins)
	releaseOwn  func() // this handler's hold on agentDeny
	logger      *zap.Logger
	audit       *zap.Logger
}

// SessionsMode configures the sessions endpoint. Agents are configured in
// the zidane app (global option).
type SessionsMode struct{}

// Guard configures guard mode.
type Guard struct {
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
	defaultMaxBody     = 1 << 20
	defaultResource    = "/mcp"
	wellKnownResource  = "/.well-known/oauth-protected-resource"
	mcpSessionHeader   = "Mcp-Session-Id"
	protocolHeader     = "Mcp-Protocol-Version"
	allowedCORSHeaders = "Authorization, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Last-Event-ID, Mcp-Method, Mcp-Name"
)

var (
	defaultTokenLimit = policy.Limit{Rate: 20, Burst: 40}
	defaultIPLimit    = policy.Limit{Rate: 1, Burst: 10}
)

// Provision builds the policy objects and looks up the shared state.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.audit = auditLoggerOf(ctx)
	// The files this handler reads secrets from (a guard's upstream_header
	// {file.…}, the JWT public key) are no agent's, read or write: one
	// who rewrites the JWT key signs its own tokens.
	own := gatewayfiles.PlaceholderFiles(h)
	if h.JWT != nil && h.JWT.PublicKeyFile != "" {
		own = append(own, gatewayfiles.File{Path: h.JWT.PublicKeyFile, Why: whyJWTKey})
	}
	h.releaseOwn = agentDeny.Hold(own)
	if h.Guard != nil {
		if err := checkGuardHeaders(h.Guard.UpstreamHeaders); err != nil {
			return err
		}
		if h.Guard.Upstream != "" {
			if err := checkGuardUpstream(h.Guard.Upstream); err != nil {
				return err
			}
		}
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	appIface, err := ctx.App("zidane")
	if err != nil {
		return err
	}
	h.tokens = appIface.(*App).Tokens()
	h.app = appIface.(*App)

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
	if h.origins, err = policy.NewOrigins(h.AllowedOrigins); err != nil {
		return err
	}
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
	h.authn = policy.Authenticator{Tokens: h.tokens, Suspects: suspectQueue}
	if h.JWT != nil {
		v, err := h.JWT.build(ctx, h.resURL)
		if err != nil {
			return err
		}
		h.jwt, h.authn.JWT = v, v
	}
	switch {
	case h.Broker != "":
		err = h.buildBroker(ctx, appIface.(*App))
	case len(h.Aggregate) > 0:
		err = h.buildAggregate(ctx, appIface.(*App))
	case h.Sessions != nil:
		err = h.buildSessions(ctx, appIface.(*App))
	case h.Guard != nil:
		key, kerr := sessionIDKey(ctx.Storage())
		if kerr != nil {
			return kerr
		}
		ids, ierr := sessionid.New(key)
		if ierr != nil {
			return ierr
		}
		// Sealed ids name the site by its resource, so one guarded site's
		// id opens on no other with another resource.
		pol, perr := h.Guard.pinPolicy()
		if perr != nil {
			return perr
		}
		if h.Guard.MaxResponse < 0 {
			return fmt.Errorf("guard max_response %d is negative; give a size such as 16MiB", h.Guard.MaxResponse)
		}
		shared, cerr := h.app.claimGuardResource(h.Resource, h.Guard.Upstream)
		if cerr != nil {
			return cerr
		}
		if shared {
			h.logger.Warn("another guard site of this config has the same resource; what a guard keeps of its server (pinned tool definitions, learned Mcp-Param-* bindings, the route its session ids are sealed to) is kept under its resource, so if the two guard different servers, give each its own absolute resource",
				zap.String("resource", h.Resource))
		}
		ns := "guard:" + h.Resource
		tasks, terr := taskid.New(key)
		if terr != nil {
			return terr
		}
		g := &edge.Guard{Scopes: h.scopes, Prepare: h.Guard.setHeaders, IDs: ids, Route: "guard:" + h.Resource,
			SharedParams: h.sharedParams(ctx, "params|guard|"+h.Resource), Pins: h.openPins(ctx, ns, pol), PinNS: ns, Tasks: tasks}
		h.route = g
		if h.Guard.Upstream == "" {
			h.answerMax = cmp.Or(h.Guard.MaxResponse, answerlimit.DefaultMaxResponse)
			break
		}
		// The pass-through bounds the server's answers itself, with
		// max_response, as on the broker's route.
		if h.route, err = h.buildGuardUpstream(ctx, appIface.(*App), g, key); err != nil {
			return err
		}
	}
	return err
}

// Validate checks that a mode is chosen.
func (h *Handler) Validate() error {
	modes := 0
	for _, on := range []bool{h.Guard != nil, h.Sessions != nil, h.Broker != "", len(h.Aggregate) > 0} {
		if on {
			modes++
		}
	}
	if modes != 1 {
		return errors.New("zidane_mcp: choose one mode: `sessions` serves the sessions endpoint; `broker NAME` offers a configured upstream; `aggregate NAME...` offers several together; `guard` passes authorized requests to the next handler (for example reverse_proxy), or with guard { upstream URL } to that MCP server")
	}
	return nil
}

// Cleanup releases this config's hold on the shared buckets.
func (h *Handler) Cleanup() error {
	if h.releaseOwn != nil {
		h.releaseOwn()
	}
	if h.jwt != nil {
		h.jwt.Close()
	}
	if h.passThrough != nil {
		h.passThrough.Close()
	}
	if h.aggregate != nil {
		liveAggregates.remove(h.aggregate)
		h.aggregate.Close()
	}
	var err error
	if h.paramsKey != "" {
		_, _ = paramsPool.Delete(h.paramsKey)
	}
	h.closePins()
	if h.limitKey != "" {
		_, err = limiterPool.Delete(h.limitKey)
	}
	if h.sessKey != "" {
		if _, derr := sessionsPool.Delete(h.sessKey); err == nil {
			err = derr
		}
	}
	return err
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
	if r.Header[edge.HopHeader] != nil || r.Header[edge.HopPrincipalHeader] != nil || r.Header[edge.HopCredentialHeader] != nil {
		return h.serveHop(w, r, rf)
	}
	if v := h.checkHostOrigin(r); !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	if h.preflight(w, r, rf.origin) || h.servePublic(w, r) {
		return nil
	}
	route, v := h.routeFor(r.URL.Path)
	if !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}

	// 2. Authenticate.
	now := time.Now()
	p, v := h.authenticate(r, rf.clientIP, now)
	if !v.Allowed() {
		return h.refuse(w, r, rf, v)
	}
	rf.p = p
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
	if !d.Allowed() {
		rf.call = d.Call
		return h.refuse(w, r, rf, d.Verdict)
	}
	var traced []attribute.KeyValue // the principal and the call, for the step events after auth
	if tr.on() {
		traced = append(principalAttrs(p), callAttrs(d.Body)...)
		tr.event("inspect", "allowed", "", traced...)
		tr.event("decide", "allowed", "", traced...)
	}

	// 5. Rate limit.
	if ok, retry := h.tokenLimit.Allow(p.TokenID, now); !ok {
		if d.Body != nil {
			rf.call = d.Body.Calls[0]
		}
		metricRateLimited.WithLabelValues("token").Inc()
		return h.refuseRateLimited(w, r, rf, "rate_limited", retry,
			"rate limit for this token exceeded; retry after the Retry-After delay")
	}
	tr.event("limit", "allowed", "", traced...)

	// A replica that is shutting down finishes the sessions it holds and
	// opens none.
	if draining() && opensLegacySession(r, d.Body) {
		rf.call = d.Body.Calls[0]
		w.Header().Set("Retry-After", "1")
		return h.refuse(w, r, rf, drainingVerdict())
	}

	// 6. Serve.
	return h.serve(w, r, route, p, d.Body, rf, tr, next)
}

// checkHostOrigin is step 1: on a loopback listener, a Host that is not
// loopback is a DNS-rebinding attempt (the spec's localhost rule); a
// browser Origin must be allowed.
func (h *Handler) checkHostOrigin(r *http.Request) edge.Verdict {
	if !h.DisableLocalhostProtection && onLoopbackListener(r) && !policy.HostIsLoopback(r.Host) {
		return edge.Refuse(http.StatusForbidden, "host",
			fmt.Sprintf("Host %q is not this machine: this endpoint listens on loopback only; if a proxy in front sets another Host, set disable_localhost_protection", r.Host))
	}
	if origin := r.Header.Get("Origin"); !h.origins.Allowed(origin, r.Host) {
		return edge.Refuse(http.StatusForbidden, "origin",
			fmt.Sprintf("Origin %q is not allowed to call this MCP endpoint; an operator can add it to allowed_origins", origin))
	}
	return edge.Verdict{}
}

// maxCORSParamHeaders bounds the Mcp-Param-* names a preflight is allowed.
const maxCORSParamHeaders = 64

// corsAllowHeaders is what a preflight allows: the MCP headers, and the
// Mcp-Param-* headers (2026-07-28, one per x-mcp-header binding, so no
// fixed list names them) that the browser asks for, each a plain header
// name; the edge checks their values against the body like any client's.
func corsAllowHeaders(requested []string) string {
	out := allowedCORSHeaders
	n := 0
	for _, line := range requested {
		for name := range strings.SplitSeq(line, ",") {
			name = strings.TrimSpace(name)
			if n < maxCORSParamHeaders && len(name) <= 128 && len(name) > len("mcp-param-") &&
				strings.EqualFold(name[:len("mcp-param-")], "mcp-param-") && httpguts.ValidHeaderFieldName(name) {
				out += ", " + name
				n++
			}
		}
	}
	return out
}

// preflight sets the CORS headers of an allowed browser Origin, and
// answers its preflight request.
func (h *Handler) preflight(w http.ResponseWriter, r *http.Request, origin string) bool {
	if origin == "" {
		return false
	}
	setCORS(w.Header(), origin)
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	w.Header().Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
	w.Header().Set("Access-Control-Allow-Headers", corsAllowHeaders(r.Header.Values("Access-Control-Request-Headers")))
	w.Header().Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// servePublic serves what needs no bearer token, each behind its own
// capability or none: the RFC 9728 metadata, a session's page (a link
// bound to one session), the gateway's OAuth client metadata document and
// an upstream login's callback (its one-time state).
func (h *Handler) servePublic(w http.ResponseWriter, r *http.Request) bool {
	switch path := r.URL.Path; {
	case strings.HasPrefix(path, wellKnownResource) && h.servesMetadata(path):
		if err := h.serveMetadata(w, r); err != nil {
			writeHandlerError(w, err)
		}
	case h.sess != nil && strings.HasPrefix(path, sessionpage.PathPrefix):
		h.sess.page.ServeHTTP(w, r)
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

// writeHandlerError answers a handler error that carries its status.
func writeHandlerError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		status = he.StatusCode
	}
	http.Error(w, http.StatusText(status), status)
}

// routeFor is the route of a request path: a session's egress route under
// egressPrefix<name>/ on the sessions endpoint, else the site's own.
func (h *Handler) routeFor(path string) (edge.Route, edge.Verdict) {
	if h.egress == nil {
		return h.route, edge.Verdict{}
	}
	rest, ok := strings.CutPrefix(path, egressPrefix)
	if !ok {
		return h.route, edge.Verdict{}
	}
	name, _, _ := strings.Cut(rest, "/")
	if r, ok := h.egress[name]; ok {
		return r, edge.Verdict{}
	}
	return nil, edge.Refuse(http.StatusNotFound, "no_upstream",
		"no upstream is offered to sessions at this path; see session_upstreams in the zidane global option")
}

// authenticate is step 2. A request without a valid credential is charged
// to its address (an IPv6 client's prefix), and once the address's bucket
// is empty it is refused 429 rather than 401, so that guessing slows down.
// The bucket is consulted after the credential, never for a valid one: an
// address is shared (an agent that guesses and the orchestrator on its
// host; in a cluster, the usage reaches every replica), and one client's
// guesses must not lock the others out. While the bucket is empty, a JWT's
// signature check waits its turn in suspectQueue, which bounds the CPU
// that such addresses can have spent on checking signatures.
func (h *Handler) authenticate(r *http.Request, clientIP string, now time.Time) (policy.Principal, edge.Verdict) {
	ip := policy.AddressKey(clientIP, h.ipv6Prefix)
	authenticate := h.authn.Authenticate
	if h.authn.JWT != nil && h.ipLimit.Empty(ip, now) {
		authenticate = h.authn.AuthenticateSuspect
	}
	p, err := authenticate(r.Context(), r.Header.Get("Authorization"), now)
	switch {
	case err == nil:
		return p, edge.Verdict{}
	case errors.Is(err, policy.ErrKeysUnavailable):
		// Not the client's fault, so no 401 and no charge to its address.
		// The detail (URL, network error) goes to the log only.
		h.logger.Error("JWT signing keys unavailable", zap.String("detail", err.Error()))
		v := edge.Refuse(http.StatusServiceUnavailable, "jwt_keys_unavailable",
			"the identity provider's signing keys are unavailable right now; retry later")
		v.RetryAfter = 30 * time.Second
		return policy.Principal{}, v
	}
	if ok, retry := h.ipLimit.Allow(ip, now); !ok {
		metricRateLimited.WithLabelValues("ip").Inc()
		v := edge.Refuse(http.StatusTooManyRequests, "rate_limited_ip",
			"too many requests without a valid token from this address; wait and retry with a valid token")
		v.RetryAfter = retry
		return policy.Principal{}, v
	}
	if errors.Is(err, policy.ErrNoCredential) {
		return policy.Principal{}, edge.Refuse(http.StatusUnauthorized, "no_token", errMessage(err, policy.ErrNoCredential))
	}
	return policy.Principal{}, edge.Refuse(http.StatusUnauthorized, "invalid_token", errMessage(err, policy.ErrTokenInvalid))
}

// suspectQueue is where the JWT signature checks of requests from an
// address whose bucket of failed attempts is empty wait their turn (see
// policy.Authenticator.AuthenticateSuspect): one process-wide queue, so that however
// many addresses guess at once, they keep at most a quarter of the CPUs
// (at least one) busy verifying signatures.
var suspectQueue = policy.NewSuspectQueue(runtime.GOMAXPROCS(0) / 4)

// errMessage is err's message without the sentinel's prefix.
func errMessage(err, sentinel error) string {
	return strings.TrimPrefix(err.Error(), sentinel.Error()+": ")
}

// serve is step 6: the route serves the request with the principal and
// the body it was allowed on in its context, without the client's
// credential, and behind the listing filter, which every answer passes. tr
// is the request's step tracer, looked up once in ServeHTTP.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, route edge.Route, p policy.Principal, b *message.Body, rf refusal, tr steps, next caddyhttp.Handler) (err error) {
	ip := rf.clientIP
	metricAllowed.Inc()
	metricTokenRequests.WithLabelValues(p.Name).Inc()
	if b != nil {
		for _, c := range b.Calls {
			if c.IsToolCall() {
				logToolCall(h.audit, p, c, ip)
			}
		}
	}
	ctx, span := tr.routeSpan(r.Context(), r, routeName(route), p, b)
	defer func() { endRoute(span, err) }()
	ctx, cancel := context.WithCancel(policy.WithPrincipal(ctx, p))
	defer cancel()
	if b != nil {
		ctx = message.NewContext(ctx, b)
	}
	if _, ok := route.(forwardedRoute); ok && policy.IsJWTID(p.TokenID) {
		// The replica that holds the request's session, or runs the agent
		// session it acts on, verifies a JWT principal's access token
		// itself (see edge.HopKey.Sign, clustersessions).
		ctx = policy.WithJWT(ctx, policy.BearerJWT(r.Header.Get("Authorization")))
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
	// Every answer goes through the listing filter, which reads it: ask
	// for it uncompressed (an `encode` in front still compresses what the
	// client gets).
	delete(r.Header, "Accept-Encoding")
	if _, ok := route.(edge.ClientAddressed); ok {
		r.Header[upstream.ClientIPHeader] = []string{ip}
	}
	f := edge.NewListing(route, p, b, func(d edge.Drop) { h.auditDrop(r, d) })
	f.Max = h.answerMax
	f.Budget = h.app.answerBudget
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

// setHeaders sets the guard's upstream headers on a request passed on,
// after the client's Authorization is removed.
func (g *Guard) setHeaders(r *http.Request) {
	if len(g.UpstreamHeaders) == 0 {
		return
	}
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	for k, v := range g.UpstreamHeaders {
		if repl != nil {
			v = repl.ReplaceAll(v, "")
		}
		r.Header.Set(k, v)
	}
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

// onLoopbackListener reports whether r arrived on a loopback address.
func onLoopbackListener(r *http.Request) bool {
	addr, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return pinnedfetch.IsLoopbackSocket(addr)
}

func setCORS(h http.Header, origin string) {
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Expose-Headers", "Mcp-Session-Id, WWW-Authenticate, Retry-After")
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// agentBase is where the agents of sessions that r creates reach this
// gateway: the configured resource's origin, else the listener r arrived on
// (scheme://ip:port, which the client cannot choose), never r's Host or
// X-Forwarded-* headers. The URLs handed to agents carry their tokens.
// Empty when neither gives one (a unix socket; the app refuses to start
// such a site, see checkAgentBases).
func (h *Handler) agentBase(r *http.Request) string {
	if h.resURL.IsAbs() {
		return h.resURL.Scheme + "://" + h.resURL.Host
	}
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	if !ok {
		return ""
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(addr.IP.String(), strconv.Itoa(addr.Port))
}
