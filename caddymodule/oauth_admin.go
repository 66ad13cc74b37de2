package caddymodule

import (
	"errors"
	"fmt"
	"html"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/internal/htmlpage"
)

// liveApp returns the zidane app of the running config, or nil.
func liveApp() *App {
	appIface, err := caddy.ActiveContext().AppIfConfigured("zidane")
	if err != nil {
		return nil
	}
	app, _ := appIface.(*App)
	return app
}

// oauthClientOf returns the running config's OAuth client of upstream
// name, or an admin error that says why there is none.
func oauthClientOf(name string) (*upstreamauth.Client, error) {
	app := liveApp()
	if app == nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no zidane app is running")}
	}
	if _, ok := app.Upstream(name); !ok {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no upstream %q is configured", name)}
	}
	c := app.OAuthClient(name)
	if c == nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusBadRequest,
			Err: fmt.Errorf("upstream %q has no oauth block: its credentials are the headers configured for it", name)}
	}
	return c, nil
}

// handleUpstreamAuth answers the OAuth actions on an upstream:
//
//	POST /zidane/upstreams/<name>/login   -> {"authorization_url": …}
//	POST /zidane/upstreams/<name>/logout  -> the new status
//	GET  /zidane/upstreams/<name>/auth    -> the status (state, scopes, expiry)
func (a *adminAPI) handleUpstreamAuth(w http.ResponseWriter, r *http.Request, name, action string) error {
	c, err := oauthClientOf(name)
	if err != nil {
		return err
	}
	audit := auditLogger()
	switch {
	case action == "auth" && r.Method == http.MethodGet:
		return writeJSON(w, http.StatusOK, c.State())
	case action == "login" && r.Method == http.MethodPost:
		if !c.LogsIn() {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest,
				Err: fmt.Errorf("upstream %q obtains its tokens with its own client credentials: it needs no login", name)}
		}
		u, err := c.BeginLogin(r.Context())
		if err != nil {
			audit.Warn("upstream login refused", zap.String("event", "upstream_login"), zap.String("upstream", name),
				zap.String("outcome", "error"), zap.String("detail", err.Error()))
			return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: err}
		}
		audit.Info("upstream login started", zap.String("event", "upstream_login"), zap.String("upstream", name),
			zap.String("outcome", "started"))
		return writeJSON(w, http.StatusOK, map[string]string{"upstream": name, "authorization_url": u})
	case action == "logout" && r.Method == http.MethodPost:
		if err := c.Logout(r.Context()); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: err}
		}
		audit.Info("upstream logout", zap.String("event", "upstream_logout"), zap.String("upstream", name))
		return writeJSON(w, http.StatusOK, c.State())
	default:
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed,
			Err: fmt.Errorf("use POST /zidane/upstreams/<name>/login or /logout, or GET /zidane/upstreams/<name>/auth")}
	}
}

// OAuthCallbackPath is where an upstream login's callback lands, on every
// site that zidane_mcp serves: <site>/zidane/oauth/callback/<upstream> is
// the redirect_url to configure.
const OAuthCallbackPath = "/zidane/oauth/callback/"

// oauthCallbackCSP is the callback page's policy: it loads nothing and
// posts no form.
var oauthCallbackCSP = htmlpage.MustCSP("base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'")

// serveOAuthCallback answers GET /zidane/oauth/callback/<name>: the
// authorization server sends the operator's browser here after a login.
// No bearer token: the state, which only the gateway's own login knows and
// which opens once, is the capability. It stores the tokens and tells the
// operator, in a page with no secret, whether it worked. The query (code,
// state) goes in no log line of this module.
func (h *Handler) serveOAuthCallback(w http.ResponseWriter, r *http.Request) error {
	name := strings.TrimPrefix(r.URL.Path, OAuthCallbackPath)
	page := func(status int, title, body string) error {
		htmlpage.SetHeaders(w.Header(), oauthCallbackCSP, htmlpage.NoReferrer)
		w.WriteHeader(status)
		_, err := fmt.Fprintf(w, "<!doctype html><meta charset=utf-8><title>%s</title><h1>%s</h1><p>%s</p>\n",
			html.EscapeString(title), html.EscapeString(title), html.EscapeString(body))
		return err
	}
	var c *upstreamauth.Client
	if h.app != nil && name != "" && !strings.Contains(name, "/") {
		c = h.app.OAuthClient(name)
	}
	if c == nil {
		return page(http.StatusNotFound, "No login here", "No upstream of this gateway logs in through this address.")
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		return page(http.StatusMethodNotAllowed, "Use GET", "The authorization server sends the browser here with GET.")
	}
	if h.app.perUser(name) && h.app.signin != nil && h.app.signin.connect != nil && h.app.signin.connect.Handles(r) {
		// A person's login, started from a connect link: finished only
		// in a browser signed in as that person.
		h.app.signin.connect.ServeCallback(w, r)
		return nil
	}
	audit := auditLogger()
	if err := c.Callback(r.Context(), r.URL.Query()); err != nil {
		audit.Warn("upstream login refused", zap.String("event", "upstream_login"), zap.String("upstream", name),
			zap.String("outcome", "refused"), zap.String("client_ip", clientIP(r)), zap.String("detail", err.Error()))
		again := ". Run `caddy zidane login " + name + "` to try again."
		if h.app.perUser(name) {
			// The address also takes people's connections, whose answer,
			// once used, belongs to no flow and lands here.
			again += " If you were connecting your own account, call the tool again from your MCP client for a new link."
		}
		return page(http.StatusBadRequest, "Login to "+name+" failed", strings.TrimRight(err.Error(), ". ")+again)
	}
	liveAggregates.reconnect(name)
	st := c.State()
	audit.Info("upstream login completed", zap.String("event", "upstream_login"), zap.String("upstream", name),
		zap.String("outcome", "ok"), zap.String("client_ip", clientIP(r)), zap.Strings("scopes", st.Scopes))
	return page(http.StatusOK, "Logged in to "+name, "The gateway holds the upstream's token now; you can close this window.")
}
