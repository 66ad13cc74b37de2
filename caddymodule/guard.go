package caddymodule

import (
	"cmp"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"
	"github.com/Tahul/caddy-zidane-mcp/edge"
)

// build sets up the guard's route: to the next handler, or with Upstream
// through the broker's pass-through.
func (g *Guard) build(ctx caddy.Context) error {
	s := g.site
	key, err := sessionIDKey(ctx.Storage())
	if err != nil {
		return err
	}
	ids, err := sessionid.New(key)
	if err != nil {
		return err
	}
	pol, err := g.pinPolicy()
	if err != nil {
		return err
	}
	shared, err := s.app.claimGuardResource(s.resource, g.Upstream)
	if err != nil {
		return err
	}
	if shared {
		s.logger.Warn("another guard site of this config has the same resource; what a guard keeps of its server (pinned tool definitions, learned Mcp-Param-* bindings, the route its session ids are sealed to) is kept under its resource, so if the two guard different servers, give each its own absolute resource",
			zap.String("resource", s.resource))
	}
	tasks, err := taskid.New(key)
	if err != nil {
		return err
	}
	// Sealed ids name the site by its resource, so one guarded site's id
	// opens on no other with another resource.
	ns := "guard:" + s.resource
	eg := &edge.Guard{Scopes: s.scopes, Rules: s.policy, Prepare: g.setHeaders, IDs: ids, Route: "guard:" + s.resource,
		SharedParams: g.sharedParams(ctx, "params|guard|"+s.resource), Pins: g.openPins(ctx, ns, pol), PinNS: ns, Tasks: tasks}
	if g.Upstream == "" {
		g.out.route = eg
		g.out.answerMax = cmp.Or(g.MaxResponse, answerlimit.DefaultMaxResponse)
		return nil
	}
	// The pass-through bounds the server's answers itself, with
	// max_response, as on the broker's route.
	g.out.route, err = g.buildUpstream(ctx, eg, key)
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
