package caddymodule

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/passthrough"
	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// egressRoute is one upstream offered to the sessions on this host: the
// broker's pass-through route, reached with a per-session machine token.
type egressRoute struct {
	pt    *passthrough.PassThrough
	route *edge.Upstream
}

// buildEgress sets up a pass-through route for each of the app's
// session_upstreams.
func (a *App) buildEgress(log *slog.Logger) (map[string]*egressRoute, error) {
	routes := map[string]*egressRoute{}
	for _, name := range a.SessionUpstreams {
		u, ok := a.Upstream(name)
		if !ok {
			return nil, fmt.Errorf("session_upstreams: no upstream %q is configured", name)
		}
		route := "egress:" + name
		pt, err := passthrough.New(u, passthrough.Options{
			SessionKey:   brokerSessionKey,
			Route:        route,
			AnswerBudget: a.answerBudget,
			OnDecision:   func(d pinnedfetch.Decision) { auditRedirect(auditLogger(), name, d) },
			OnCall:       func(c upstream.CallRecord) { auditUpstreamCall(auditLogger(), c) },
			OnRefusal: func(r upstream.Refusal) {
				metricRefusals.WithLabelValues(r.Reason).Inc()
				auditBrokerRefusal(auditLogger(), r)
			},
			Logger:          log,
			Credentials:     a.credentials(name),
			ConnectRequired: a.connectRequired,
			Retry:           a.connectRetry(name, route),
			Connected:       a.connectHold(name),
			Store:           a.storage,
		})
		if err != nil {
			return nil, fmt.Errorf("session_upstreams: %w", err)
		}
		scopes, err := policy.NewScopeMap([]policy.Rule{{Scope: policy.UpstreamScope(name), Tools: []string{"*"}, Methods: []string{"*"}}}, false)
		if err != nil {
			return nil, err
		}
		// The sessions' view of the upstream is pinned as every route's
		// is: an agent reads tool descriptions as instructions too.
		octx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		a.pins.open(octx, name, u.PinPolicy())
		cancel()
		tasks, err := taskid.New(brokerSessionKey)
		if err != nil {
			return nil, err
		}
		// The global rules decide the agents' calls too, as the
		// broker's (route "broker", upstream its name): an agent must not
		// do through its egress what a rule refuses its person. Their
		// allow rules grant nothing there (edge.Upstream.Egress).
		routes[name] = &egressRoute{pt: pt, route: &edge.Upstream{Config: u, Scopes: scopes.Strict(), Rules: a.policy, Egress: true, Handler: pt, Pins: a.pins.store,
			Tasks: tasks, Route: route}}
	}
	return routes, nil
}

// egressServers gives a session the upstreams sessions may use, each as an
// MCP server of this gateway, with a machine token of its own that grants
// only those upstreams. The agent never sees an upstream's credential: the
// broker attaches it. The token is derived from the session creator's
// (revoking that revokes it, and it expires with it), is renewed, not
// added to, at a relaunch, and is deleted when the session ends. Its
// scopes are the operator's grant to every session (session_upstreams),
// not its parent's: a machine token, it never drives sessions.
func (s *sessionsState) egressServers(tokens *policy.TokenStore, info sessions.SessionInfo, log *slog.Logger) []sessions.McpServer {
	if len(s.egress) == 0 {
		return nil
	}
	if info.Base == "" {
		log.Error("a session has no address of this gateway to reach it at; it runs without upstreams", "session", info.SessionID)
		return nil
	}
	names := make([]string, 0, len(s.egress))
	scopes := make([]string, 0, len(s.egress))
	for name := range s.egress {
		names = append(names, name)
	}
	sortStrings(names)
	for _, n := range names {
		scopes = append(scopes, policy.UpstreamScope(n))
	}
	secret, _, ok := s.mintChild(tokens, info, policy.PurposeEgress, scopes, log)
	if !ok {
		return nil
	}
	out := make([]sessions.McpServer, 0, len(names))
	for _, n := range names {
		out = append(out, sessions.McpServer{
			Name:    n,
			URL:     edge.EgressURL(info.Base, n),
			Headers: map[string]string{"Authorization": "Bearer " + secret},
		})
	}
	return out
}
