package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/broker"
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

	tokens       *policy.TokenStore
	scopes       *policy.ScopeMap
	origins      *policy.Origins
	tokenLimit   *policy.Limiter
	ipLimit      *policy.Limiter
	limitKey     string
	jwt          jwtVerifier
	resURL       *url.URL // absolute when configured so, else path only
	sess         *sessionsState
	sessKey      string
	upstream     broker.Upstream
	passThrough  *broker.PassThrough
	aggregate    *broker.Aggregate
	aggUpstreams map[string]broker.Upstream
	app          *App // this config's zidane app (upstream OAuth logins)
	logger       *zap.Logger
	audit        *zap.Logger
}

// SessionsMode configures the sessions endpoint. Agents are configured in
// the zidane app (global option).
type SessionsMode struct{}

// Guard configures guard mode.
type Guard struct {
	// UpstreamHeaders are set on every request passed on, after the
	// client's Authorization is removed: an upstream credential, for
	// example. Values may use placeholders such as {env.UPSTREAM_TOKEN}.
	UpstreamHeaders map[string]string `json:"upstream_headers,omitempty"`
}

// RateLimit configures the token buckets.
type RateLimit struct {
	// PerToken limits each authenticated principal.
	PerToken *policy.Limit `json:"per_token,omitempty"`
	// PerIP limits requests from one client IP that carry no credential or
	// a failed one, which slows brute force. The client IP follows the
	// server's trusted_proxies setting.
	PerIP *policy.Limit `json:"per_ip,omitempty"`
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
	allowedCORSHeaders = "Authorization, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Last-Event-ID"
)

var (
	defaultTokenLimit = policy.Limit{Rate: 20, Burst: 40}
	defaultIPLimit    = policy.Limit{Rate: 1, Burst: 10}
)

// Provision builds the policy objects and looks up the shared state.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.audit = h.logger.Named("audit")
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
	h.limitKey = fmt.Sprintf("limits|%s|%v|%v", h.Resource, tokenLimit, ipLimit)
	lv, _, err := limiterPool.LoadOrNew(h.limitKey, func() (caddy.Destructor, error) {
		return &limiters{token: policy.NewLimiter(tokenLimit), ip: policy.NewLimiter(ipLimit)}, nil
	})
	if err != nil {
		return err
	}
	h.tokenLimit, h.ipLimit = lv.(*limiters).token, lv.(*limiters).ip
	if h.JWT != nil {
		if h.jwt, err = h.JWT.build(ctx, h.resURL); err != nil {
			return fmt.Errorf("jwt: %w", err)
		}
	}
	if h.Broker != "" {
		if err := h.buildBroker(ctx, appIface.(*App)); err != nil {
			return err
		}
	}
	if len(h.Aggregate) > 0 {
		if err := h.buildAggregate(ctx, appIface.(*App)); err != nil {
			return err
		}
	}
	if h.Sessions != nil {
		base := ""
		if h.resURL.IsAbs() {
			base = h.resURL.Scheme + "://" + h.resURL.Host
		}
		if h.sess, h.sessKey, err = appIface.(*App).loadSessions(ctx, base, h.resURL.Path, base != ""); err != nil {
			return err
		}
	}
	return nil
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
		return errors.New("zidane_mcp: choose one mode: `sessions` serves the sessions endpoint; `broker NAME` offers a configured upstream; `aggregate NAME...` offers several together; `guard` passes authorized requests to the next handler (for example reverse_proxy)")
	}
	return nil
}

// Cleanup releases this config's hold on the shared buckets.
func (h *Handler) Cleanup() error {
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

type limiters struct{ token, ip *policy.Limiter }

func (*limiters) Destruct() error { return nil }

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

// ServeHTTP sequences the decisions; each belongs to a policy object.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	rf := refusal{clientIP: clientIP(r), origin: r.Header.Get("Origin"), method: r.Method}

	// 1. Host and Origin. On a loopback listener, a Host that is not
	// loopback is a DNS-rebinding attempt (the spec's localhost rule).
	if !h.DisableLocalhostProtection && onLoopbackListener(r) && !policy.HostIsLoopback(r.Host) {
		return h.refuse(w, r, rf, http.StatusForbidden, "host",
			fmt.Sprintf("Host %q is not this machine: this endpoint listens on loopback only; if a proxy in front sets another Host, set disable_localhost_protection", r.Host))
	}
	if !h.origins.Allowed(rf.origin, r.Host) {
		return h.refuse(w, r, rf, http.StatusForbidden, "origin",
			fmt.Sprintf("Origin %q is not allowed to call this MCP endpoint; an operator can add it to allowed_origins", rf.origin))
	}
	if rf.origin != "" {
		setCORS(w.Header(), rf.origin)
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			w.Header().Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
			w.Header().Set("Access-Control-Allow-Headers", allowedCORSHeaders)
			w.Header().Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
	}
	if strings.HasPrefix(r.URL.Path, wellKnownResource) && h.servesMetadata(r.URL.Path) {
		return h.serveMetadata(w, r)
	}
	if h.sess != nil && strings.HasPrefix(r.URL.Path, sessionpage.PathPrefix) {
		// A session page carries its own capability, bound to one session.
		h.sess.page.ServeHTTP(w, r)
		return nil
	}
	if h.app != nil && h.app.serveClientMetadata(w, r) {
		// The gateway's Client ID Metadata Document, for an upstream's
		// authorization server: public.
		return nil
	}
	if strings.HasPrefix(r.URL.Path, OAuthCallbackPath) {
		// An upstream login's callback carries its own capability: the
		// state of a login that this gateway began.
		return h.serveOAuthCallback(w, r)
	}

	// 2. Authenticate.
	now := time.Now()
	if h.ipLimit.Empty(rf.clientIP, now) {
		_, retry := h.ipLimit.Allow(rf.clientIP, now)
		metricRateLimited.WithLabelValues("ip").Inc()
		return h.refuseRateLimited(w, r, rf, "rate_limited_ip", retry,
			"too many requests without a valid token from this address; wait and retry with a valid token")
	}
	p, reason, msg := h.authenticate(r, now)
	if reason == "jwt_keys_unavailable" {
		// The identity provider's keys could not be fetched: not the
		// client's fault, so no 401 and no charge to its address. The
		// detail (URL, network error) goes to the log only.
		h.logger.Error("JWT signing keys unavailable", zap.String("detail", msg))
		w.Header().Set("Retry-After", "30")
		return h.refuse(w, r, rf, http.StatusServiceUnavailable, reason,
			"the identity provider's signing keys are unavailable right now; retry later")
	}
	if reason != "" {
		h.ipLimit.Allow(rf.clientIP, now)
		return h.refuse(w, r, rf, http.StatusUnauthorized, reason, msg)
	}
	rf.p = p
	// A session's agent reaches the upstreams it was given through the
	// sessions endpoint's egress paths, with a machine token.
	var egress *egressRoute
	if h.sess != nil {
		var isEgress bool
		if egress, isEgress = h.sess.egressFor(r.URL.Path); isEgress && egress == nil {
			return h.refuse(w, r, rf, http.StatusNotFound, "no_upstream",
				"no upstream is offered to sessions at this path; see session_upstreams in the zidane global option")
		}
	}
	if h.sess != nil && egress == nil && p.Kind == policy.KindMachine {
		return h.refuse(w, r, rf, http.StatusForbidden, "machine_token",
			fmt.Sprintf("token %q is a machine token, and machine tokens may not use the sessions endpoint: use a user token", p.Name))
	}

	// 3. Inspect the JSON-RPC body.
	var calls []policy.Call
	if r.Method == http.MethodPost {
		body, status, err := readBody(r, h.MaxBodyBytes)
		if err != nil {
			reason := "malformed"
			if status == http.StatusRequestEntityTooLarge {
				reason = "too_large"
			}
			return h.refuse(w, r, rf, status, reason, err.Error())
		}
		if calls, _, err = policy.Inspect(body); err != nil {
			return h.refuse(w, r, rf, http.StatusBadRequest, "malformed", err.Error()+"; send a JSON-RPC 2.0 message or batch")
		}
	}

	// 4. Authorize.
	scopes := h.scopes
	if egress != nil {
		scopes = egress.scopes
	}
	for _, c := range calls {
		if egress != nil && c.IsToolCall() && !egress.upstream.AllowsTool(c.Tool) {
			rf.call = c
			return h.refuse(w, r, rf, http.StatusForbidden, "tool_not_offered",
				fmt.Sprintf("tool %q of upstream %q is not offered through this gateway (tools allow/deny)", c.Tool, egress.upstream.Name))
		}
		if h.passThrough != nil && c.IsToolCall() && !h.upstream.AllowsTool(c.Tool) {
			rf.call = c
			return h.refuse(w, r, rf, http.StatusForbidden, "tool_not_offered",
				fmt.Sprintf("tool %q of upstream %q is not offered through this gateway (tools allow/deny)", c.Tool, h.upstream.Name))
		}
		if h.aggregate != nil {
			if ok, need := h.aggregateDecide(p, c); !ok {
				rf.call = c
				return h.refuseScope(w, r, rf, need)
			}
			continue
		}
		if d := scopes.Decide(p, c); !d.Allowed {
			rf.call = c
			if d.Machine {
				return h.refuse(w, r, rf, http.StatusForbidden, "machine_token",
					fmt.Sprintf("token %q is a machine token, and machine tokens may not drive coding-agent sessions: use a user token", p.Name))
			}
			return h.refuseScope(w, r, rf, d.Need)
		}
	}

	// 5. Rate limit.
	if ok, retry := h.tokenLimit.Allow(p.TokenID, now); !ok {
		if len(calls) > 0 {
			rf.call = calls[0]
		}
		metricRateLimited.WithLabelValues("token").Inc()
		return h.refuseRateLimited(w, r, rf, "rate_limited", retry,
			"rate limit for this token exceeded; retry after the Retry-After delay")
	}

	// 6. Route.
	metricRequests.WithLabelValues("allowed").Inc()
	metricTokenRequests.WithLabelValues(p.Name).Inc()
	var listIDs map[string]bool
	for _, c := range calls {
		if c.IsToolCall() {
			logToolCall(h.audit, p, c, rf.clientIP)
		}
		if c.Method == "tools/list" && c.ID != nil {
			if listIDs == nil {
				listIDs = map[string]bool{}
			}
			listIDs[string(c.ID)] = true
		}
	}
	ctx, cancel := context.WithCancel(policy.WithPrincipal(r.Context(), p))
	defer cancel()
	// Streams end when the process exits, and a revoked token's open
	// requests and streams end at once.
	defer context.AfterFunc(processExit(), cancel)()
	if p.Source == "token" {
		defer h.tokens.Hold(p.TokenID, cancel)()
	}
	r = r.WithContext(ctx)
	switch {
	case egress != nil:
		r.Header.Del("Authorization")
		if listIDs == nil {
			egress.pt.ServeHTTP(w, r)
			return nil
		}
		fw := &toolsListWriter{
			ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
			ids:                   listIDs,
			visible:               egress.upstream.AllowsTool,
		}
		egress.pt.ServeHTTP(fw, r)
		return fw.close()
	case h.sess != nil:
		return h.serveSessions(w, r, p, listIDs)
	case h.passThrough != nil:
		return h.serveBroker(w, r, p, listIDs)
	case h.aggregate != nil:
		r.Header.Del("Authorization")
		if listIDs == nil {
			h.aggregate.ServeHTTP(w, r)
			return nil
		}
		fw := h.toolsListWriter(w, p, listIDs)
		h.aggregate.ServeHTTP(fw, r)
		return fw.close()
	}
	return h.guard(w, r, next, p, listIDs)
}

// serveBroker hands r to the pass-through route, without the client's
// credential.
func (h *Handler) serveBroker(w http.ResponseWriter, r *http.Request, p policy.Principal, listIDs map[string]bool) error {
	r.Header.Del("Authorization")
	if listIDs == nil {
		h.passThrough.ServeHTTP(w, r)
		return nil
	}
	fw := h.toolsListWriter(w, p, listIDs)
	h.passThrough.ServeHTTP(fw, r)
	return fw.close()
}

// serveSessions hands r to the sessions endpoint.
func (h *Handler) serveSessions(w http.ResponseWriter, r *http.Request, p policy.Principal, listIDs map[string]bool) error {
	h.sess.setBase(requestOrigin(r))
	// go-sdk keeps the context of the request that created an MCP session
	// for the session's whole life. Caddy's request context holds the whole
	// request (headers, variables, the replacer), which an idle session has
	// no use for, so the endpoint gets a lean one: the same cancellation,
	// only the values it reads. This halves what an idle session costs.
	ctx, cancel := context.WithCancel(policy.WithPrincipal(context.Background(), p))
	defer cancel()
	defer context.AfterFunc(r.Context(), cancel)()
	for _, key := range []any{http.LocalAddrContextKey, http.ServerContextKey} {
		if v := r.Context().Value(key); v != nil {
			ctx = context.WithValue(ctx, key, v)
		}
	}
	r = r.WithContext(ctx)
	if listIDs == nil {
		h.sess.endpoint.ServeHTTP(w, r)
		return nil
	}
	fw := h.toolsListWriter(w, p, listIDs)
	h.sess.endpoint.ServeHTTP(fw, r)
	return fw.close()
}

// guard passes r to next without the client's credential.
func (h *Handler) guard(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, p policy.Principal, listIDs map[string]bool) error {
	r.Header.Del("Authorization")
	if len(h.Guard.UpstreamHeaders) > 0 {
		repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		for k, v := range h.Guard.UpstreamHeaders {
			if repl != nil {
				v = repl.ReplaceAll(v, "")
			}
			r.Header.Set(k, v)
		}
	}
	if listIDs == nil {
		return next.ServeHTTP(w, r)
	}
	fw := h.toolsListWriter(w, p, listIDs)
	err := next.ServeHTTP(fw, r)
	if cerr := fw.close(); err == nil {
		err = cerr
	}
	return err
}

func (h *Handler) toolsListWriter(w http.ResponseWriter, p policy.Principal, listIDs map[string]bool) *toolsListWriter {
	return &toolsListWriter{
		ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		ids:                   listIDs,
		visible: func(tool string) bool {
			if h.aggregate != nil {
				server, _, ok := h.aggregate.ToolServer(tool)
				return ok && h.aggregateAllows(p, server)
			}
			return h.scopes.ToolVisible(p, tool) && (h.passThrough == nil || h.upstream.AllowsTool(tool))
		},
	}
}

// authenticate returns the principal of r's bearer token, or a refusal
// reason and message.
func (h *Handler) authenticate(r *http.Request, now time.Time) (policy.Principal, string, string) {
	authz := r.Header.Get("Authorization")
	if authz == "" {
		return policy.Principal{}, "no_token", "this MCP endpoint needs a bearer token: send Authorization: Bearer <token>"
	}
	scheme, tok, ok := strings.Cut(authz, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return policy.Principal{}, "invalid_token", "send the token as Authorization: Bearer <token>"
	}
	if h.jwt != nil && policy.LooksLikeJWT(tok) {
		p, err := h.jwt.Verify(r.Context(), tok)
		if errors.Is(err, policy.ErrKeysUnavailable) {
			return policy.Principal{}, "jwt_keys_unavailable", err.Error()
		}
		if err != nil {
			return policy.Principal{}, "invalid_token", err.Error()
		}
		return p, "", ""
	}
	p, err := h.tokens.Check(tok, now)
	if err != nil {
		msg := "the token is not valid here: check it, or ask the operator for a new one"
		if errors.Is(err, policy.ErrTokenRevoked) || errors.Is(err, policy.ErrTokenExpired) {
			msg = err.Error() + ": ask the operator for a new token"
		}
		return policy.Principal{}, "invalid_token", msg
	}
	return p, "", ""
}

// readBody reads and restores a bounded request body.
func readBody(r *http.Request, max int64) ([]byte, int, error) {
	if r.ContentLength > max {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body of %d bytes is over the %d-byte limit", r.ContentLength, max)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("reading the request body: %v", err)
	}
	if int64(len(body)) > max {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body is over the %d-byte limit", max)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return body, 0, nil
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
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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
