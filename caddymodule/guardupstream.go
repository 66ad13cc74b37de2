package caddymodule

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// guardUpstreamName names the guarded server in the pass-through's
// messages and its upstream_call and redirect audit lines.
const guardUpstreamName = "guard"

// buildUpstream sets up `guard { upstream URL }`: the broker's
// pass-through to the guarded server in place of the next handler, under
// the guard's route identity (so its sealed session ids are the guard's),
// with the guard's upstream headers and max_response. Caddy's
// reverse_proxy would forward every header of the client's but
// Authorization; the pass-through sends only the MCP transport's, and the
// operator's upstream headers, to the configured URL only.
func (g *Guard) buildUpstream(ctx caddy.Context, eg *edge.Guard, sessionKey []byte) (edge.Route, error) {
	s := g.site
	u := broker.Upstream{Name: guardUpstreamName, URL: g.Upstream, MaxResponse: g.MaxResponse}
	for _, k := range sortedMapKeys(g.UpstreamHeaders) {
		if broker.ReservedUpstreamHeader(http.CanonicalHeaderKey(k)) {
			return nil, fmt.Errorf("guard upstream_header %s: with upstream, the guard sets or passes this header itself (the MCP transport's headers and framing); remove the upstream_header", k)
		}
	}
	// The values are resolved here, once, and handed over as they are:
	// the pass-through attaches them in its egress client, on the pinned
	// origin only, and never expands them.
	headers, err := guardHeaderValues(g.UpstreamHeaders)
	if err != nil {
		return nil, err
	}
	logger := s.logger.Named("guard")
	// The guard dials the one host the operator configured, whatever
	// address it resolves to, as the reverse_proxy it replaces would; it
	// follows no redirect, so no answer of the server's can send it to
	// another host.
	allowPrivate := false
	pt, err := broker.NewPassThrough(u, broker.PassThroughOptions{
		Headers: headers,
		// The URL holds no placeholder (checkGuardUpstream): nothing to
		// look up.
		Lookup:               func(string) (string, bool) { return "", false },
		NoRedirects:          true,
		DenyPrivateAddresses: &allowPrivate,
		SessionKey:           sessionKey,
		Route:                eg.Route,
		MaxBodyBytes:         s.maxBody,
		AnswerBudget:         s.app.answerBudget,
		OnDecision:           func(d pinnedfetch.Decision) { auditRedirect(s.audit, u.Name, d) },
		OnCall:               func(c broker.CallRecord) { auditUpstreamCall(s.audit, c) },
		OnRefusal: func(r broker.Refusal) {
			metricRefusals.WithLabelValues(r.Reason).Inc()
			auditBrokerRefusal(s.audit, r)
		},
		Logger: slog.New(zapslog.NewHandler(logger.Core())),
	})
	if err != nil {
		return nil, fmt.Errorf("guard upstream: %w", err)
	}
	g.pt = pt
	for _, k := range sortedMapKeys(headers) {
		if headers[k] == "" {
			logger.Warn("guard upstream_header is empty, and is sent so", zap.String("header", k))
		}
	}
	return &edge.GuardUpstream{Guard: eg, Handler: pt}, nil
}

// guardHeaderValues resolves the guard's upstream headers once. Only
// placeholders known before any request (such as {env.VAR} and
// {file.PATH}) can be: a request's placeholder would let the client choose
// what the server is sent. A placeholder that resolves empty is refused:
// "Bearer {env.UNSET}" would send "Bearer ". Errors name the header and
// the placeholder, never a value.
func guardHeaderValues(headers map[string]string) (map[string]string, error) {
	if len(headers) == 0 {
		return nil, nil
	}
	repl := caddy.NewReplacer()
	out := make(map[string]string, len(headers))
	for _, k := range sortedMapKeys(headers) {
		v, err := repl.ReplaceOrErr(headers[k], true, true)
		if err != nil {
			return nil, fmt.Errorf("guard upstream_header %s: with upstream, its value is read once, when Caddy starts, so give a placeholder known then and not empty, such as {env.VAR} or {file.PATH}: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

// claimGuardResource records a guard handler of this config under its
// resource, with the upstream URL it sends to ("" for the next handler).
// What a guard keeps of its server (its pinned tool definitions, the
// Mcp-Param-* bindings it learned, the route its session ids are sealed
// to) is kept under its resource, so two guards of one resource share it.
// Two that send to different upstream URLs guard two servers, and are
// refused. Any other pair may be one server reached twice (two listeners
// in front of one reverse_proxy), and shared reports it so that the caller
// can warn; two with the same upstream URL are one server, and are not
// reported.
func (a *App) claimGuardResource(resource, upstream string) (shared bool, err error) {
	gs := a.guardSites
	gs.mu.Lock()
	defer gs.mu.Unlock()
	others := gs.byResource[resource]
	for _, o := range others {
		switch {
		case o != "" && upstream != "" && o != upstream:
			return false, fmt.Errorf("guard: resource %s is also the resource of another guard site, which sends to another upstream; "+
				"what a guard keeps of its server (pinned tool definitions, learned Mcp-Param-* bindings, the route its session ids are sealed to) "+
				"is kept under its resource, so the two servers would share it: give each guard site its own absolute resource, such as resource https://tools.example.com/mcp", resource)
		case o == "" || upstream == "":
			shared = true
		}
	}
	gs.byResource[resource] = append(others, upstream)
	return shared, nil
}

// guardSites are one config's guard handlers: by resource, the upstream
// URL of each, or "" for one that calls the next handler.
type guardSites struct {
	mu         sync.Mutex
	byResource map[string][]string
}
