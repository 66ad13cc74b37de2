package caddymodule

import (
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// checkAgentBases refuses a config in which a sessions endpoint has no
// address to hand its agents: the URLs of their MCP servers, which carry
// their tokens, are built from the site's `resource` when it is absolute,
// else from the listener a session was created on (see edge.ProtectedResource.AgentBase), never
// from a request's Host. A listener's address is a name an agent can reach
// over plain HTTP; over TLS, the address is an IP that the site's
// certificate does not name, and a unix socket has none. (Behind the
// proxy_protocol listener wrapper, a connection's local address is what a
// trusted PROXY header says; the README asks for an absolute resource
// there: the loaded server no longer shows its wrappers' config.)
func (a *App) checkAgentBases() error {
	httpApp, err := a.ctx.AppIfConfigured("http")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return nil
	}
	if err != nil {
		return err
	}
	servers := httpApp.(*caddyhttp.App).Servers
	for name, srv := range servers {
		var errs []error
		walkHandlers(srv.Routes, srv.Errors, srv.NamedRoutes, func(h *Handler) {
			if !h.route.handsOutURLs || h.resURL.IsAbs() {
				return
			}
			switch {
			case len(srv.TLSConnPolicies) > 0:
				errs = append(errs, fmt.Errorf("server %s: the sessions endpoint on an https site needs `resource https://<this site's name>%s` in its zidane_mcp block: agents are handed URLs on it, and never one built from a request's Host", name, h.resURL.Path))
			case anyUnix(srv.Listen):
				errs = append(errs, fmt.Errorf("server %s: the sessions endpoint listens on a unix socket, which has no address its agents could reach: set `resource http(s)://<host:port>%s` in its zidane_mcp block", name, h.resURL.Path))
			}
		})
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
	}
	return nil
}

// walkHandlers calls fn on every zidane_mcp handler of a server's routes,
// its error routes and its named routes, in subroutes too.
func walkHandlers(routes caddyhttp.RouteList, errs *caddyhttp.HTTPErrorConfig, named map[string]*caddyhttp.Route, fn func(*Handler)) {
	var walk func(caddyhttp.RouteList)
	walk = func(rl caddyhttp.RouteList) {
		for _, r := range rl {
			for _, mh := range r.Handlers {
				switch h := mh.(type) {
				case *Handler:
					fn(h)
				case *caddyhttp.Subroute:
					walk(h.Routes)
					if h.Errors != nil {
						walk(h.Errors.Routes)
					}
				}
			}
		}
	}
	walk(routes)
	if errs != nil {
		walk(errs.Routes)
	}
	for _, r := range named {
		walk(caddyhttp.RouteList{*r})
	}
}

// anyUnix reports whether one of a server's listen addresses is a unix
// socket.
func anyUnix(listen []string) bool {
	for _, l := range listen {
		if na, err := caddy.ParseNetworkAddress(l); err == nil && na.IsUnixNetwork() {
			return true
		}
	}
	return false
}
