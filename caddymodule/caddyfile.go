package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("zidane_mcp", parseHandler)
	httpcaddyfile.RegisterDirectiveOrder("zidane_mcp", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterGlobalOption("zidane", parseGlobal)
}

func parseHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	zidane_mcp {
//		sessions
//		broker <upstream>
//		aggregate <upstream...>
//		prefix always|conditional
//		guard {
//			upstream <url>
//			upstream_header <name> <value>
//			max_response <size>
//		}
//		resource <url|path>
//		max_body <size>
//		allowed_origins <origin...>
//		scope <name> [tools <pattern...>] {
//			tools <pattern...>
//			verbs <verb...>
//			methods <pattern...>
//		}
//		no_default_scopes
//		disable_localhost_protection
//		rate_limit {
//			per_token <n>/<s|m|h> <burst>
//			per_ip <n>/<s|m|h> <burst>
//			ipv6_prefix <bits>
//		}
//		jwt {
//			issuer <url>
//			audience <url...>
//			algorithms <alg...>
//			jwks_url <url>
//			public_key_file <path>
//			leeway <duration>
//			machine_scope <scope>
//		}
//		dpop optional|required
//		dpop_nonce
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.Err("zidane_mcp takes no argument, only a block of options: zidane_mcp { guard }")
	}
	var m caddyfileRoute
	for d.NextBlock(0) {
		switch d.Val() {
		case "guard":
			if m.guard != nil {
				return d.Err("guard given twice")
			}
			g, err := parseGuard(d)
			if err != nil {
				return err
			}
			m.guard = g
		case "sessions":
			if d.NextArg() {
				return d.Err("sessions takes no value; agents are configured in the global zidane option")
			}
			m.sessions = true
		case "broker":
			if !d.Args(&m.broker) || d.NextArg() {
				return d.Err("broker takes the name of an upstream configured in the global zidane option")
			}
		case "aggregate":
			names := d.RemainingArgs()
			if len(names) == 0 {
				return d.Err("aggregate takes the names of upstreams configured in the global zidane option")
			}
			m.aggregate = append(m.aggregate, names...)
		case "prefix":
			if !d.Args(&m.prefix) || d.NextArg() || (m.prefix != "always" && m.prefix != "conditional") {
				return d.Err("prefix takes always or conditional")
			}
		case "resource":
			if !d.Args(&h.Resource) || d.NextArg() {
				return d.Err("resource takes one URL or path, such as https://mcp.example.com/mcp or /mcp")
			}
		case "max_body":
			var s string
			if !d.Args(&s) || d.NextArg() {
				return d.Err("max_body takes one size, such as 1MiB")
			}
			n, err := humanize.ParseBytes(s)
			if err != nil || n == 0 || n > 1<<40 {
				return d.Errf("max_body %q: give a size such as 1MiB, at most 1TiB", s)
			}
			h.MaxBodyBytes = int64(n)
		case "allowed_origins":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.Err("allowed_origins takes one or more origins, such as https://app.example.com")
			}
			for _, o := range args {
				if _, ok := policy.NormalizeOrigin(o); !ok {
					return d.Errf("allowed_origins %q: write scheme://host[:port], such as https://app.example.com, with no path", o)
				}
			}
			h.AllowedOrigins = append(h.AllowedOrigins, args...)
		case "scope":
			r, err := parseScopeRule(d)
			if err != nil {
				return err
			}
			h.Scopes = append(h.Scopes, r)
		case "disable_localhost_protection":
			if d.NextArg() {
				return d.Err("disable_localhost_protection takes no value")
			}
			h.DisableLocalhostProtection = true
		case "no_default_scopes":
			if d.NextArg() {
				return d.Err("no_default_scopes takes no value")
			}
			h.NoDefaultScopes = true
		case "rate_limit":
			if d.NextArg() {
				return d.Err("rate_limit takes a block: rate_limit { per_token 20/s 40 }")
			}
			if h.RateLimit == nil {
				h.RateLimit = &RateLimit{}
			}
			for d.NextBlock(1) {
				kind := d.Val()
				if kind == "ipv6_prefix" {
					n, err := parseIPv6Prefix(d)
					if err != nil {
						return err
					}
					h.RateLimit.IPv6Prefix = n
					continue
				}
				var rateArg, burstArg string
				if !d.Args(&rateArg, &burstArg) || d.NextArg() {
					return d.Errf("%s takes a rate such as 20/s and a burst such as 40", kind)
				}
				l, err := parseLimit(rateArg, burstArg)
				if err != nil {
					return d.Errf("%s: %v", kind, err)
				}
				switch kind {
				case "per_token":
					h.RateLimit.PerToken = &l
				case "per_ip":
					h.RateLimit.PerIP = &l
				default:
					return d.Errf("unknown rate_limit option %q: use per_token, per_ip or ipv6_prefix", kind)
				}
			}
		case "jwt":
			j, err := parseJWT(d)
			if err != nil {
				return err
			}
			h.JWT = j
		case "dpop":
			if !d.Args(&h.DPoP) || d.NextArg() {
				return d.Err("dpop takes optional or required: `dpop required` takes DPoP-bound tokens only")
			}
			if err := checkDPoPOption(h.DPoP, false, &url.URL{Scheme: "https", Host: "h"}); err != nil {
				return d.Err(err.Error())
			}
		case "dpop_nonce":
			if d.NextArg() {
				return d.Err("dpop_nonce takes no value: with it, every DPoP proof must carry a nonce this server issued")
			}
			h.DPoPNonce = true
		case "policy":
			if h.Policy != nil {
				return d.Err("policy given twice; give every rule of the site in one policy block")
			}
			list, err := parsePolicy(d)
			if err != nil {
				return err
			}
			h.Policy = list
		default:
			return d.Errf("unknown zidane_mcp option %q", d.Val())
		}
	}
	if h.DPoP != "" || h.DPoPNonce {
		res := h.Resource
		if res == "" {
			res = defaultResource
		}
		u, err := parseResource(res)
		if err != nil {
			return d.Err(err.Error())
		}
		if err := checkDPoPOption(h.DPoP, h.DPoPNonce, u); err != nil {
			return d.Err(err.Error())
		}
	}
	raw, err := m.json()
	if err != nil {
		return d.Err(err.Error())
	}
	h.RouteRaw = raw
	return nil
}

// caddyfileRoute is the route the Caddyfile's mode options give, which
// are words of the handler's block there and a guest module in JSON.
type caddyfileRoute struct {
	guard     *Guard
	sessions  bool
	broker    string
	aggregate []string
	prefix    string
}

// json is the handler's route: nil when no mode is given (Validate says
// so when the config loads, as for a JSON config without one).
func (m caddyfileRoute) json() (json.RawMessage, error) {
	var mode caddy.Module
	n := 0
	if m.guard != nil {
		mode, n = m.guard, n+1
	}
	if m.sessions {
		mode, n = &Sessions{}, n+1
	}
	if m.broker != "" {
		mode, n = &Broker{Upstream: m.broker}, n+1
	}
	if len(m.aggregate) > 0 {
		mode, n = &Aggregate{Upstreams: m.aggregate, Prefix: m.prefix}, n+1
	}
	switch {
	case n > 1:
		return nil, errors.New(chooseOneMode)
	case m.prefix != "" && len(m.aggregate) == 0:
		return nil, errors.New("prefix is an option of the aggregated route: give it with aggregate <upstream...>")
	case n == 0:
		return nil, nil
	}
	return caddyconfig.JSONModuleObject(mode, "mode", mode.CaddyModule().ID.Name(), nil), nil
}

// parseGuard reads the guard's block.
func parseGuard(d *caddyfile.Dispenser) (*Guard, error) {
	g := &Guard{}
	if d.NextArg() {
		return nil, d.Err("guard takes no value; give the headers it sets in a block: guard { upstream_header <name> <value> }")
	}
	for d.NextBlock(1) {
		switch d.Val() {
		case "upstream":
			if g.Upstream != "" {
				return nil, d.Err("guard upstream given twice: a guard sends to one MCP server")
			}
			if !d.Args(&g.Upstream) || d.NextArg() {
				return nil, d.Err("guard upstream takes the MCP server's URL, such as http://127.0.0.1:9000/mcp")
			}
			if err := checkGuardUpstream(g.Upstream); err != nil {
				return nil, d.Err(err.Error())
			}
		case "upstream_header":
			var name, value string
			if !d.Args(&name, &value) || d.NextArg() {
				return nil, d.Err("upstream_header takes a header name and a value")
			}
			if g.UpstreamHeaders == nil {
				g.UpstreamHeaders = map[string]string{}
			}
			for k := range g.UpstreamHeaders {
				if http.CanonicalHeaderKey(k) == http.CanonicalHeaderKey(name) {
					return nil, d.Errf("guard upstream_header %s given twice (names are not case-sensitive); give it once", name)
				}
			}
			g.UpstreamHeaders[name] = value
			if err := checkGuardHeaders(map[string]string{name: value}); err != nil {
				return nil, d.Err(err.Error())
			}
		case "max_response":
			var v string
			if !d.Args(&v) || d.NextArg() {
				return nil, d.Err("max_response takes one size, such as 16MiB")
			}
			n, err := humanize.ParseBytes(v)
			if err != nil || n == 0 || n > 1<<40 {
				return nil, d.Errf("guard max_response %q: give a size such as 16MiB, at most 1TiB", v)
			}
			g.MaxResponse = int64(n)
		case "pin":
			if !d.Args(&g.Pin) || d.NextArg() {
				return nil, d.Err("pin takes one value: strict, warn or off")
			}
			if _, err := pins.ParseMode(g.Pin); err != nil {
				return nil, d.Errf("guard %v", err)
			}
		case "new_tools":
			if !d.Args(&g.NewTools) || d.NextArg() {
				return nil, d.Err("new_tools takes one value: allow or hold")
			}
			if _, err := pins.ParseNewTools(g.NewTools); err != nil {
				return nil, d.Errf("guard %v", err)
			}
		default:
			return nil, d.Errf("unknown guard option %q", d.Val())
		}
	}
	return g, nil
}

func parseScopeRule(d *caddyfile.Dispenser) (policy.Rule, error) {
	var r policy.Rule
	if !d.NextArg() {
		return r, d.Err("scope needs a name, such as: scope deploy tools deploy_*")
	}
	r.Scope = d.Val()
	addList := func(kind string, vals []string) error {
		if len(vals) == 0 {
			return d.Errf("scope %s: %s needs at least one value", r.Scope, kind)
		}
		switch kind {
		case "tools":
			r.Tools = append(r.Tools, vals...)
		case "verbs":
			r.Verbs = append(r.Verbs, vals...)
		case "methods":
			r.Methods = append(r.Methods, vals...)
		default:
			return d.Errf("scope %s: unknown option %q: use tools, verbs or methods", r.Scope, kind)
		}
		return nil
	}
	if d.NextArg() {
		if err := addList(d.Val(), d.RemainingArgs()); err != nil {
			return r, err
		}
	}
	for d.NextBlock(1) {
		if err := addList(d.Val(), d.RemainingArgs()); err != nil {
			return r, err
		}
	}
	return r, nil
}

// parseIPv6Prefix reads ipv6_prefix's prefix length.
func parseIPv6Prefix(d *caddyfile.Dispenser) (int, error) {
	var bits string
	if !d.Args(&bits) || d.NextArg() {
		return 0, d.Err("ipv6_prefix takes a prefix length in bits, such as 64")
	}
	n, err := strconv.Atoi(bits)
	if err != nil {
		return 0, d.Errf("ipv6_prefix %q: give a prefix length as a number of bits from 1 to 128, such as 64", bits)
	}
	if err := policy.CheckIPv6Prefix(n); err != nil {
		return 0, d.Errf("ipv6_prefix: %v", err)
	}
	return n, nil
}

// parseLimit reads "20/s" (or /m, /h) and a burst.
func parseLimit(rateArg, burstArg string) (policy.Limit, error) {
	num, unit, ok := strings.Cut(rateArg, "/")
	if !ok {
		return policy.Limit{}, fmt.Errorf("rate %q: write events per unit, such as 20/s, 600/m or 100/h", rateArg)
	}
	n, err := strconv.ParseFloat(num, 64)
	if errors.Is(err, strconv.ErrRange) {
		return policy.Limit{}, fmt.Errorf("rate %q: %q is out of range; give a positive number of events per unit, such as 20/s", rateArg, num)
	}
	if err != nil {
		return policy.Limit{}, fmt.Errorf("rate %q: %q is not a number", rateArg, num)
	}
	per := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}[unit]
	if per == 0 {
		return policy.Limit{}, fmt.Errorf("rate %q: the unit is s, m or h", rateArg)
	}
	burst, err := strconv.Atoi(burstArg)
	if err != nil {
		return policy.Limit{}, fmt.Errorf("burst %q is not a whole number", burstArg)
	}
	l := policy.Limit{Rate: n / per.Seconds(), Burst: burst}
	return l, l.Validate()
}

func parseJWT(d *caddyfile.Dispenser) (*JWTConfig, error) {
	j := &JWTConfig{}
	if d.NextArg() {
		return nil, d.Err("jwt takes no argument, only a block: jwt { issuer <url> … }")
	}
	one := func(dst *string, what string) error {
		if opt := d.Val(); !d.Args(dst) || d.NextArg() {
			return d.Errf("jwt %s takes one value: %s", opt, what)
		}
		return nil
	}
	some := func(dst *[]string, what string) error {
		vals := d.RemainingArgs()
		if len(vals) == 0 {
			return d.Errf("jwt %s takes one or more values: %s", d.Val(), what)
		}
		*dst = append(*dst, vals...)
		return nil
	}
	for d.NextBlock(1) {
		var err error
		switch d.Val() {
		case "issuer":
			err = one(&j.Issuer, "the identity provider's issuer identifier, such as https://idp.example.com/")
		case "audience":
			err = some(&j.Audiences, "the aud values accepted, such as https://mcp.example.com/mcp")
		case "algorithms":
			err = some(&j.Algorithms, "such as RS256 ES256")
		case "jwks_url":
			err = one(&j.JWKSURL, "the provider's JWKS URL, such as https://idp.example.com/.well-known/jwks.json")
		case "public_key_file":
			err = one(&j.PublicKeyFile, "the path of the provider's PEM public key")
		case "machine_scope":
			err = one(&j.MachineScope, "the scope that marks machine tokens")
		case "leeway":
			var s string
			if err = one(&s, "a duration such as 30s, at most 5m"); err == nil {
				dur, perr := caddy.ParseDuration(s)
				if perr != nil {
					return nil, d.Errf("leeway %q: give a duration such as 30s, at most 5m", s)
				}
				j.Leeway = caddy.Duration(dur)
			}
		default:
			return nil, d.Errf("unknown jwt option %q", d.Val())
		}
		if err != nil {
			return nil, err
		}
	}
	if j.Issuer == "" {
		return nil, d.Err("jwt needs an issuer")
	}
	return j, nil
}

// parseGlobal sets up the zidane app from the global option:
//
//	{
//		zidane {
//			token_sync <duration>
//			last_used_flush <duration>
//			agent <name> {
//				command <program> [<args...>]
//				env <name> <value>
//				user <name>
//				sandbox off
//				sandbox {
//					read <path...>
//					write <path...>
//					connect <port...>|any
//					best_effort
//					off
//				}
//			}
//			default_agent <name>
//			worktree_root <path>
//			link_ttl <duration>
//			max_agents <n>
//			max_sessions <n>
//			agent_idle_timeout <duration>
//			max_sessions_per_token <n>
//			max_agents_per_token <n>
//			mcp_session_idle_timeout <duration>
//			roots <path...>
//			share_sessions [true|false]
//			upstream <name> [<url>] {
//				url <url>
//				transport http|sse|stdio
//				header <name> <value>
//				bearer <token>              # a static token: header Authorization "Bearer <token>"
//				command <program> [<args...>]
//				env <name> <value>
//				tools allow|deny <pattern...>
//				scope <scope>
//				timeout <duration>
//				max_response <size>
//				shared true|false
//				oauth {
//					grant authorization_code|client_credentials|cross_app_access|jwt_bearer|token_exchange
//					client_id <id>
//					client_secret <secret>
//					token_endpoint_auth_method client_secret_basic|client_secret_post|private_key_jwt|none
//					private_key_file <path>
//					signing_algorithm RS256|ES256
//					key_id <kid>
//					scopes <scope...>
//					redirect_url <url>
//					client_metadata_url <url>
//					client_name <name>
//					authorization_server <issuer>
//					token_url <url>
//					max_step_up <n>
//					idp_issuer|idp_token_url|idp_client_id|idp_client_secret|id_token_file <value>
//					assertion_file <path>
//					dpop auto|off|required
//					credentials shared|per_user   # per_user: each person's own token
//					fallback none|connect         # per_user token_exchange, cross_app_access
//					audience <value>              # token_exchange
//					actor_token_file <path>       # token_exchange: the gateway's JWT as actor_token
//				}
//			}
//			upstream_token_key <base64 key or {env.VAR}>
//			max_inflight_response <size>
//			upstreams_file <path>
//			session_upstreams <name...>
//			signin {                      # the gateway as its MCP clients' authorization server
//				issuer <https origin>
//				access_lifetime|refresh_lifetime|session_lifetime <duration>
//				registration dynamic|off
//				oidc { … }
//			}
//			cluster {                     # the former place of storage zidane_nats's settings; still read
//				url <nats url...>
//				creds|tls_ca|tls_cert|tls_key <file>
//				bucket <name>
//				replicas <n>
//				lock_ttl <duration>
//				key {env.VAR}
//				node <id>
//				advertise <url>
//			}
//		}
//	}
func parseGlobal(d *caddyfile.Dispenser, existing any) (any, error) {
	app := new(App)
	if existing != nil {
		return nil, d.Err("the zidane global option is given twice")
	}
	d.Next() // option name
	if d.NextArg() {
		return nil, d.Err("zidane takes no argument, only a block of options: zidane { … }")
	}
	for d.NextBlock(0) {
		opt := d.Val()
		switch opt {
		case "agent":
			var name string
			if !d.Args(&name) || d.NextArg() {
				return nil, d.Err("agent takes a name and a block: agent claude { command claude-agent-acp }")
			}
			ac := &AgentConfig{}
			for d.NextBlock(1) {
				switch d.Val() {
				case "command":
					ac.Command = d.RemainingArgs()
					if len(ac.Command) == 0 {
						return nil, d.Errf("agent %s: command needs the program to run", name)
					}
				case "env":
					var k, v string
					if !d.Args(&k, &v) || d.NextArg() {
						return nil, d.Errf("agent %s: env takes a name and a value", name)
					}
					if ac.Env == nil {
						ac.Env = map[string]string{}
					}
					ac.Env[k] = v
					if err := checkAgentEnv(name, map[string]string{k: v}); err != nil {
						return nil, d.Err(err.Error())
					}
				case "user":
					if !d.Args(&ac.User) || d.NextArg() {
						return nil, d.Errf("agent %s: user takes the name of an account of this host", name)
					}
				case "sandbox":
					if ac.Sandbox != nil {
						return nil, d.Errf("agent %s: sandbox is given twice", name)
					}
					sb, err := parseSandbox(d, name)
					if err != nil {
						return nil, err
					}
					ac.Sandbox = sb
				default:
					return nil, d.Errf("agent %s: unknown option %q: use command, env, user or sandbox", name, d.Val())
				}
			}
			if len(ac.Command) == 0 {
				return nil, d.Errf("agent %s: give its command", name)
			}
			if app.Agents == nil {
				app.Agents = map[string]*AgentConfig{}
			}
			if _, dup := app.Agents[name]; dup {
				return nil, d.Errf("agent %s is configured twice", name)
			}
			app.Agents[name] = ac
			continue
		case "upstream":
			u, err := parseUpstream(d)
			if err != nil {
				return nil, err
			}
			if err := checkUpstreamSecrets(u); err != nil {
				return nil, d.Err(err.Error())
			}
			app.Upstreams = append(app.Upstreams, u)
			continue
		case "session_upstreams":
			names := d.RemainingArgs()
			if len(names) == 0 {
				return nil, d.Err("session_upstreams takes the names of configured upstreams")
			}
			app.SessionUpstreams = append(app.SessionUpstreams, names...)
			continue
		case "share_sessions":
			v := "true"
			if d.NextArg() {
				v = d.Val()
			}
			if d.NextArg() || (v != "true" && v != "false") {
				return nil, d.Err("share_sessions takes no value, or true or false")
			}
			app.ShareSessions = v == "true"
			continue
		case "max_inflight_response":
			var v string
			if !d.Args(&v) || d.NextArg() {
				return nil, d.Err("max_inflight_response takes one size, such as 256MiB")
			}
			n, err := humanize.ParseBytes(v)
			if err != nil || n == 0 || n > 1<<40 {
				return nil, d.Errf("max_inflight_response %q: give a size such as 256MiB, at most 1TiB", v)
			}
			app.MaxInflightResponse = int64(n)
			continue
		case "upstream_token_key":
			if !d.Args(&app.UpstreamTokenKey) || d.NextArg() || app.UpstreamTokenKey == "" {
				return nil, d.Err("upstream_token_key takes one value, such as {env.ZIDANE_UPSTREAM_TOKEN_KEY}")
			}
			if err := checkTokenKey(app.UpstreamTokenKey); err != nil {
				return nil, d.Err(err.Error())
			}
			continue
		case "upstreams_file":
			var path string
			if !d.Args(&path) || d.NextArg() || path == "" {
				return nil, d.Err("upstreams_file takes one path, of an mcp.json file")
			}
			app.UpstreamsFiles = append(app.UpstreamsFiles, path)
			continue
		case "max_agents", "max_sessions", "max_sessions_per_token", "max_agents_per_token":
			var v string
			if !d.Args(&v) || d.NextArg() {
				return nil, d.Errf("%s takes one value: give a positive whole number", opt)
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, d.Errf("%s %q: give a positive whole number", opt, v)
			}
			switch opt {
			case "max_agents":
				app.MaxAgents = n
			case "max_sessions":
				app.MaxSessions = n
			case "max_sessions_per_token":
				app.MaxSessionsPerToken = n
			default:
				app.MaxAgentsPerToken = n
			}
			continue
		case "roots":
			paths := d.RemainingArgs()
			if len(paths) == 0 {
				return nil, d.Err("roots takes one or more absolute paths: roots /srv/projects /home/me/code")
			}
			for _, p := range paths {
				if !filepath.IsAbs(p) {
					return nil, d.Errf("roots: %q is not an absolute path; give it from /", p)
				}
			}
			app.Roots = append(app.Roots, paths...)
			continue
		case "default_agent":
			if !d.Args(&app.DefaultAgent) || d.NextArg() {
				return nil, d.Err("default_agent takes the name of an agent: demo, or one configured with agent <name> { … }")
			}
			continue
		case "cluster":
			if app.Cluster != nil {
				return nil, d.Err("zidane: cluster is given twice; give one block with every setting")
			}
			app.Cluster = new(ClusterConfig)
			if err := app.Cluster.unmarshalCaddyfile(d, 1); err != nil {
				return nil, err
			}
			continue
		case "signin":
			if app.Signin != nil {
				return nil, d.Err("zidane: signin is given twice; give one block with every setting")
			}
			var err error
			if app.Signin, err = parseSignin(d); err != nil {
				return nil, err
			}
			continue
		case "policy":
			if app.Policy != nil {
				return nil, d.Err("policy given twice in the zidane option; give every global rule in one policy block")
			}
			list, err := parsePolicy(d)
			if err != nil {
				return nil, err
			}
			app.Policy = list
			continue
		case "worktree_root":
			if !d.Args(&app.WorktreeRoot) || d.NextArg() {
				return nil, d.Err("worktree_root takes one absolute path, such as /srv/worktrees")
			}
			if !filepath.IsAbs(app.WorktreeRoot) {
				return nil, d.Errf("worktree_root %q: give an absolute path, such as /srv/worktrees", app.WorktreeRoot)
			}
			continue
		}
		durations := map[string]*caddy.Duration{
			"token_sync":               &app.TokenSync,
			"last_used_flush":          &app.LastUsedFlush,
			"link_ttl":                 &app.LinkTTL,
			"agent_idle_timeout":       &app.AgentIdleTimeout,
			"mcp_session_idle_timeout": &app.MCPSessionIdleTimeout,
			"approval_pending":         &app.ApprovalPending,
			"approval_approved":        &app.ApprovalApproved,
		}
		dst, ok := durations[opt]
		switch {
		case !ok:
			return nil, d.Errf("unknown zidane option %q", opt)
		}
		var s string
		if !d.Args(&s) || d.NextArg() {
			return nil, d.Errf("%s takes one value: give a positive duration such as 1s", opt)
		}
		dur, err := caddy.ParseDuration(s)
		if err != nil || dur <= 0 {
			return nil, d.Errf("%s %q: give a positive duration such as 1s", opt, s)
		}
		*dst = caddy.Duration(dur)
	}
	return httpcaddyfile.App{Name: "zidane", Value: caddyconfig.JSON(app, nil)}, nil
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)

func parseUpstream(d *caddyfile.Dispenser) (upstream.Config, error) {
	var u upstream.Config
	if !d.NextArg() {
		return u, d.Err("upstream takes a name, then a URL or a block: upstream github https://api.githubcopilot.com/mcp/")
	}
	u.Name = d.Val()
	if d.NextArg() {
		u.URL = d.Val()
	}
	if d.NextArg() {
		return u, d.Errf("upstream takes a name, then a URL or a block: upstream %s https://mcp.example.com/mcp", u.Name)
	}
	for d.NextBlock(1) {
		opt := d.Val()
		args := d.RemainingArgs()
		one := func() (string, error) {
			if len(args) != 1 {
				return "", d.Errf("upstream %s: %s takes one value", u.Name, opt)
			}
			return args[0], nil
		}
		var err error
		switch opt {
		case "url":
			u.URL, err = one()
		case "transport":
			u.Transport, err = one()
		case "scope":
			u.Scope, err = one()
		case "pin":
			if u.Pin, err = one(); err == nil {
				if _, perr := pins.ParseMode(u.Pin); perr != nil {
					return u, d.Errf("upstream %s: %v", u.Name, perr)
				}
			}
		case "new_tools":
			if u.NewTools, err = one(); err == nil {
				if _, perr := pins.ParseNewTools(u.NewTools); perr != nil {
					return u, d.Errf("upstream %s: %v", u.Name, perr)
				}
			}
		case "header", "env":
			if len(args) != 2 {
				return u, d.Errf("upstream %s: %s takes a name and a value", u.Name, opt)
			}
			m := &u.Headers
			if opt == "env" {
				m = &u.Env
			}
			if *m == nil {
				*m = map[string]string{}
			}
			(*m)[args[0]] = args[1]
		case "bearer":
			// A static bearer token: the Authorization header, usually
			// with a placeholder (bearer ${GITHUB_TOKEN}).
			var v string
			if v, err = one(); err == nil {
				if u.Headers == nil {
					u.Headers = map[string]string{}
				}
				if _, dup := u.Headers["Authorization"]; dup {
					return u, d.Errf("upstream %s: bearer sets the Authorization header, which is given twice", u.Name)
				}
				u.Headers["Authorization"] = "Bearer " + v
			}
		case "command":
			if len(args) == 0 {
				return u, d.Errf("upstream %s: command needs the program to run", u.Name)
			}
			u.Command, u.Args = args[0], args[1:]
		case "tools":
			if len(args) < 2 || (args[0] != "allow" && args[0] != "deny") {
				return u, d.Errf("upstream %s: write tools allow <pattern...> or tools deny <pattern...>", u.Name)
			}
			if args[0] == "allow" {
				u.ToolsAllow = append(u.ToolsAllow, args[1:]...)
			} else {
				u.ToolsDeny = append(u.ToolsDeny, args[1:]...)
			}
		case "max_response":
			if len(args) != 1 {
				return u, d.Errf("upstream %s: max_response takes one size, such as 16MiB", u.Name)
			}
			n, perr := humanize.ParseBytes(args[0])
			if perr != nil || n == 0 || n > 1<<40 {
				return u, d.Errf("upstream %s: max_response %q: give a size such as 16MiB, at most 1TiB", u.Name, args[0])
			}
			u.MaxResponse = int64(n)
		case "timeout":
			if len(args) != 1 {
				return u, d.Errf("upstream %s: timeout takes one value: give a positive duration such as 30s", u.Name)
			}
			dur, perr := caddy.ParseDuration(args[0])
			if perr != nil || dur <= 0 {
				return u, d.Errf("upstream %s: timeout %q: give a positive duration such as 30s", u.Name, args[0])
			}
			u.Timeout = dur
		case "shared":
			var v string
			if v, err = one(); err == nil {
				b, perr := strconv.ParseBool(v)
				if perr != nil {
					return u, d.Errf("upstream %s: shared takes true or false", u.Name)
				}
				u.Shared = &b
			}
		case "oauth":
			if len(args) != 0 {
				return u, d.Errf("upstream %s: oauth takes a block: oauth { grant client_credentials … }", u.Name)
			}
			if u.OAuth != nil {
				return u, d.Errf("upstream %s: oauth is given twice", u.Name)
			}
			u.OAuth, err = parseOAuth(d, u.Name)
		default:
			return u, d.Errf("upstream %s: unknown option %q", u.Name, opt)
		}
		if err != nil {
			return u, err
		}
	}
	return u, nil
}

// parseOAuth reads an upstream's oauth block. Each option takes one value,
// given once (a second would silently win over the first, which the reader
// of the file may take for the one in force), except scopes, which takes
// one or more and may be repeated.
func parseOAuth(d *caddyfile.Dispenser, upstream string) (*upstreamauth.Config, error) {
	c := &upstreamauth.Config{}
	fields := map[string]*string{
		"grant":                      &c.Grant,
		"client_id":                  &c.ClientID,
		"client_secret":              &c.ClientSecret,
		"token_endpoint_auth_method": &c.TokenEndpointAuthMethod,
		"private_key":                &c.PrivateKey,
		"private_key_file":           &c.PrivateKeyFile,
		"signing_algorithm":          &c.SigningAlgorithm,
		"key_id":                     &c.KeyID,
		"redirect_url":               &c.RedirectURL,
		"client_metadata_url":        &c.ClientMetadataURL,
		"client_name":                &c.ClientName,
		"authorization_server":       &c.AuthorizationServer,
		"token_url":                  &c.TokenURL,
		"idp_issuer":                 &c.IDPIssuer,
		"idp_token_url":              &c.IDPTokenURL,
		"idp_client_id":              &c.IDPClientID,
		"idp_client_secret":          &c.IDPClientSecret,
		"id_token_file":              &c.IDTokenFile,
		"assertion_file":             &c.AssertionFile,
		"dpop":                       &c.DPoP,
		"credentials":                &c.Credentials,
		"fallback":                   &c.Fallback,
		"audience":                   &c.Audience,
		"actor_token_file":           &c.ActorTokenFile,
	}
	seen := map[string]bool{}
	for d.NextBlock(2) {
		opt := d.Val()
		args := d.RemainingArgs()
		if opt != "scopes" && seen[opt] {
			return nil, d.Errf("upstream %s: oauth %s is given twice; give it once", upstream, opt)
		}
		seen[opt] = true
		switch opt {
		case "scopes":
			if len(args) == 0 {
				return nil, d.Errf("upstream %s: oauth scopes takes one or more scopes", upstream)
			}
			c.Scopes = append(c.Scopes, args...)
		case "max_step_up":
			n, err := strconv.Atoi(strings.Join(args, " "))
			if len(args) != 1 || err != nil {
				return nil, d.Errf("upstream %s: oauth max_step_up takes a whole number", upstream)
			}
			c.MaxStepUp = n
		default:
			p, ok := fields[opt]
			if !ok {
				return nil, d.Errf("upstream %s: unknown oauth option %q", upstream, opt)
			}
			if len(args) != 1 {
				return nil, d.Errf("upstream %s: oauth %s takes one value", upstream, opt)
			}
			*p = args[0]
		}
	}
	return c, nil
}

// parseSandbox reads an agent's `sandbox off` or sandbox block.
func parseSandbox(d *caddyfile.Dispenser, agent string) (*SandboxConfig, error) {
	sb := &SandboxConfig{}
	args := d.RemainingArgs()
	switch {
	case len(args) == 1 && args[0] == "off":
		sb.Off = true
		if d.NextBlock(2) {
			return nil, d.Errf("agent %s: sandbox off takes no block", agent)
		}
		return sb, nil
	case len(args) != 0:
		return nil, d.Errf("agent %s: write sandbox off, or a sandbox block: sandbox { read <path...>; write <path...>; connect <port...>|any; best_effort; off }", agent)
	}
	for d.NextBlock(2) {
		opt := d.Val()
		vals := d.RemainingArgs()
		switch opt {
		case "read", "write":
			if len(vals) == 0 {
				return nil, d.Errf("agent %s: sandbox %s takes one or more absolute paths", agent, opt)
			}
			for _, v := range vals {
				if !filepath.IsAbs(v) {
					return nil, d.Errf("agent %s: sandbox %s %q: give an absolute path", agent, opt, v)
				}
			}
			if opt == "read" {
				sb.Read = append(sb.Read, vals...)
			} else {
				sb.Write = append(sb.Write, vals...)
			}
		case "connect":
			if len(vals) == 0 {
				return nil, d.Errf("agent %s: sandbox connect takes TCP ports, or any", agent)
			}
			for _, v := range vals {
				if v == "any" {
					sb.ConnectAny = true
					continue
				}
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 || n > 65535 {
					return nil, d.Errf("agent %s: sandbox connect %q: give a TCP port (1 to 65535) or any", agent, v)
				}
				sb.Connect = append(sb.Connect, n)
			}
		case "best_effort", "off":
			if len(vals) != 0 {
				return nil, d.Errf("agent %s: sandbox %s takes no value", agent, opt)
			}
			if opt == "off" {
				sb.Off = true
			} else {
				sb.BestEffort = true
			}
		default:
			return nil, d.Errf("agent %s: unknown sandbox option %q: use read, write, connect, best_effort or off", agent, opt)
		}
	}
	return sb, nil
}
