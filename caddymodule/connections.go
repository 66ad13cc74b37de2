package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/accounts"
	"github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func init() {
	zidaneSubcommands = append(zidaneSubcommands, connectionsCommand)
}

// perUserClients returns the OAuth clients of the running config's
// upstreams with credentials per_user, by name; upstream, when not empty,
// keeps that one, and is an admin error when it is not such an upstream.
func perUserClients(app *App, upstream string) (map[string]*upstreamauth.Client, error) {
	out := map[string]*upstreamauth.Client{}
	if upstream != "" {
		c, err := oauthClientOf(upstream)
		if err != nil {
			return nil, err
		}
		if !app.perUser(upstream) {
			return nil, caddy.APIError{HTTPStatus: http.StatusBadRequest,
				Err: fmt.Errorf("upstream %q has credentials shared: it holds one token for everyone (see `caddy zidane logout %s`), not people's connections", upstream, upstream)}
		}
		out[upstream] = c
		return out, nil
	}
	for name, c := range app.oauth {
		if app.perUser(name) {
			out[name] = c
		}
	}
	return out, nil
}

// connectionRequest is the body of POST /zidane/connections/revoke, /login
// and /callback.
type connectionRequest struct {
	Owner    string `json:"owner,omitempty"`
	Upstream string `json:"upstream,omitempty"`
	// Query is the query of the authorization response (callback only).
	Query string `json:"query,omitempty"`
}

// handleConnections answers the people's upstream connections:
//
//	GET  /zidane/connections[?owner=NAME&upstream=NAME] -> {"connections": […]}, no token
//	POST /zidane/connections/revoke {"owner"?, "upstream"?} -> {"revoked": […]}
//	POST /zidane/connections/login {"owner", "upstream"} -> {"authorization_url"}
//	POST /zidane/connections/callback {"owner", "upstream", "query"}
//
// login and callback run a person's authorization code login from the
// operator's side: the operator vouches that the browser which approves is
// the person's. The person's own way is the connect page.
func (a *adminAPI) handleConnections(w http.ResponseWriter, r *http.Request) error {
	app := liveApp()
	if app == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no zidane app is running")}
	}
	action := strings.Trim(strings.TrimPrefix(r.URL.Path, "/zidane/connections"), "/")
	switch {
	case action == "" && r.Method == http.MethodGet:
		q := r.URL.Query()
		for _, name := range []string{"owner", "upstream"} {
			if len(q[name]) > 1 {
				return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("give %s at most once", name)}
			}
		}
		conns, err := listConnections(r.Context(), app, q.Get("owner"), q.Get("upstream"))
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, map[string]any{"connections": conns})
	case r.Method != http.MethodPost || (action != "revoke" && action != "login" && action != "callback"):
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed,
			Err: errors.New("use GET /zidane/connections[?owner=NAME&upstream=NAME], or POST /zidane/connections/revoke, /login or /callback")}
	}
	var req connectionRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("decoding the request: %v", err)}
	}
	if action == "revoke" {
		if req.Owner == "" && req.Upstream == "" {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest,
				Err: errors.New("name the owner, the upstream, or both: revoking every connection of every person takes one request per upstream")}
		}
		revoked, err := revokeConnections(r.Context(), app, req.Owner, req.Upstream, "operator")
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, map[string]any{"revoked": revoked})
	}
	if req.Owner == "" || req.Upstream == "" {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%s needs the owner and the upstream", action)}
	}
	clients, err := perUserClients(app, req.Upstream)
	if err != nil {
		return err
	}
	oc, err := clients[req.Upstream].ForOwner(req.Owner)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	audit := auditLogger()
	if action == "login" {
		u, err := oc.BeginLogin(r.Context())
		if err != nil {
			audit.Warn("upstream connection refused", zap.String("event", "upstream_connect"), zap.String("upstream", req.Upstream),
				zap.String("owner", req.Owner), zap.String("outcome", "error"), zap.String("detail", err.Error()))
			return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: err}
		}
		audit.Info("upstream connection started", zap.String("event", "upstream_connect"), zap.String("upstream", req.Upstream),
			zap.String("owner", req.Owner), zap.String("outcome", "started"), zap.String("by", "operator"))
		return writeJSON(w, http.StatusOK, map[string]string{"upstream": req.Upstream, "owner": req.Owner, "authorization_url": u})
	}
	query, err := url.ParseQuery(req.Query)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("query is not a URL query")}
	}
	if err := oc.Callback(r.Context(), query); err != nil {
		audit.Warn("upstream connection refused", zap.String("event", "upstream_connect"), zap.String("upstream", req.Upstream),
			zap.String("owner", req.Owner), zap.String("outcome", "refused"), zap.String("detail", err.Error()))
		status := http.StatusBadGateway
		if errors.Is(err, upstreamauth.ErrLogin) {
			status = http.StatusBadRequest
		}
		return caddy.APIError{HTTPStatus: status, Err: err}
	}
	st := oc.State()
	audit.Info("upstream connection completed", zap.String("event", "upstream_connect"), zap.String("upstream", req.Upstream),
		zap.String("owner", req.Owner), zap.String("outcome", "ok"), zap.Strings("scopes", st.Scopes))
	return writeJSON(w, http.StatusOK, st)
}

// listConnections lists the people's connections of the running config,
// sorted by upstream and owner.
func listConnections(ctx context.Context, app *App, owner, upstream string) ([]upstreamauth.Connection, error) {
	clients, err := perUserClients(app, upstream)
	if err != nil {
		return nil, err
	}
	out := []upstreamauth.Connection{}
	for _, c := range clients {
		conns, err := c.Connections(ctx, owner)
		if err != nil {
			return nil, caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		out = append(out, conns...)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Upstream != out[j].Upstream {
			return out[i].Upstream < out[j].Upstream
		}
		return out[i].Owner < out[j].Owner
	})
	return out, nil
}

// revokedConnection is one entry of a revocation's answer.
type revokedConnection struct {
	Upstream string `json:"upstream"`
	Owner    string `json:"owner"`
	// Warning says what failed at the upstream's authorization server,
	// when its revocation did; the gateway deleted the tokens all the same.
	Warning string `json:"warning,omitempty"`
}

// revokeConnections revokes (at the authorization server, where it
// supports RFC 7009) and deletes the connections of owner (every one when
// empty) to upstream (every per_user upstream when empty), and audits each
// with by, who ended it.
func revokeConnections(ctx context.Context, app *App, owner, upstream, by string) ([]revokedConnection, error) {
	clients, err := perUserClients(app, upstream)
	if err != nil {
		return nil, err
	}
	owners := map[string][]string{} // upstream -> owners
	for name, c := range clients {
		if owner != "" {
			owners[name] = []string{owner}
			continue
		}
		conns, err := c.Connections(ctx, "")
		if err != nil {
			return nil, caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
		}
		for _, cn := range conns {
			owners[name] = append(owners[name], cn.Owner)
		}
	}
	out := []revokedConnection{}
	audit := auditLogger()
	for name, list := range owners {
		for _, o := range list {
			oc, err := clients[name].ForOwner(o)
			if err != nil {
				return nil, caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
			}
			found, err := oc.Revoke(ctx)
			if !found && err == nil {
				continue
			}
			rc := revokedConnection{Upstream: name, Owner: o}
			fields := []zap.Field{zap.String("event", "upstream_disconnect"), zap.String("upstream", name), zap.String("owner", o), zap.String("by", by)}
			if err != nil {
				rc.Warning = err.Error()
				audit.Warn("upstream connection revoked", append(fields, zap.String("detail", err.Error()))...)
			} else {
				audit.Info("upstream connection revoked", fields...)
			}
			out = append(out, rc)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Upstream != out[j].Upstream {
			return out[i].Upstream < out[j].Upstream
		}
		return out[i].Owner < out[j].Owner
	})
	return out, nil
}

// hookGrantRevocations ends a person's upstream connections when the last
// of their live grants (the clients they signed in) is revoked, here or on
// another replica: a person the gateway no longer lets in keeps no way to
// act upstream through it. Revoking one of several grants (one client of
// theirs) leaves the connections, which no client ever held; so does a
// grant displaced by a newer sign-in of the same client. It returns the
// function that unhooks it.
func (a *App) hookGrantRevocations() func() {
	if a.tokens == nil || a.tokens.store == nil {
		return nil
	}
	per := false
	for name := range a.oauth {
		per = per || a.perUser(name)
	}
	if !per {
		return nil
	}
	store := a.tokens.store
	return store.OnRevoke(func(t policy.Token) {
		owner, ok := lastGrantRevoked(store, t, time.Now())
		if !ok {
			return
		}
		// The revocations at the authorization server take a while:
		// not on the path of the revocation that fired the hook.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The kept sign-in first: with it, the next call would get
			// the person a new token by exchange.
			if a.signin != nil && a.signin.people != nil {
				if err := a.signin.people.ForgetSignIn(ctx, owner); err != nil {
					auditLogger().Warn("kept sign-in not deleted", zap.String("event", "signin_forget"),
						zap.String("owner", owner), zap.String("by", "grant revoked: "+t.ID), zap.Error(err))
				}
			}
			if _, err := revokeConnections(ctx, a, owner, "", "grant revoked: "+t.ID); err != nil {
				auditLogger().Warn("upstream connections not revoked", zap.String("event", "upstream_disconnect"),
					zap.String("owner", owner), zap.String("by", "grant revoked: "+t.ID), zap.Error(err))
			}
		}()
	})
}

// accountsPage is the connected accounts page of the sign-in site issuer,
// for people signed in through people; nil when no upstream has
// credentials per_user.
func (a *App) accountsPage(issuer string, people *idp.Service) (*accounts.Page, error) {
	per := map[string]*upstreamauth.Client{}
	for name, c := range a.oauth {
		if a.perUser(name) {
			per[name] = c
		}
	}
	if len(per) == 0 {
		return nil, nil
	}
	key, err := signinKey(a.storage, "signin accounts v1")
	if err != nil {
		return nil, err
	}
	return accounts.New(accounts.Options{
		Origin: issuer,
		Key:    key,
		Current: func(r *http.Request) (accounts.Person, bool) {
			p, ok := people.Current(r)
			return accounts.Person{Owner: p.Owner, Name: p.Name}, ok
		},
		SignIn:    people.SignIn,
		Upstreams: func() map[string]*upstreamauth.Client { return per },
		Audit: func(e accounts.Event) {
			fields := []zap.Field{zap.String("owner", e.Owner), zap.String("upstream", e.Upstream), zap.String("by", "the person")}
			if e.Action == "disconnected" {
				fields = append([]zap.Field{zap.String("event", "upstream_disconnect")}, fields...)
				if e.Detail != "" {
					auditLogger().Warn("upstream connection revoked", append(fields, zap.String("detail", e.Detail))...)
				} else {
					auditLogger().Info("upstream connection revoked", fields...)
				}
				return
			}
			metricRefusals.WithLabelValues("accounts").Inc()
			auditLogger().Warn("connected accounts refused", append([]zap.Field{zap.String("event", "refused"), zap.String("reason", e.Reason),
				zap.Int("status", e.Status), zap.String("detail", e.Detail)}, fields[:2]...)...)
		},
	})
}

// lastGrantRevoked reports whether the revocation of t leaves its owner
// with no live grant at now, and names the owner.
func lastGrantRevoked(store *policy.TokenStore, t policy.Token, now time.Time) (string, bool) {
	if !t.IsGrant() {
		return "", false
	}
	owner := t.OwnerID()
	for _, o := range store.List() {
		if o.IsGrant() && o.OwnerID() == owner && o.Active(now) {
			return owner, false
		}
	}
	return owner, true
}

// connectionsCommand is `caddy zidane connections list|revoke`.
func connectionsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "connections list|revoke [--owner NAME] [--upstream NAME]",
		Short: "Lists or revokes people's own connections to upstreams with credentials per_user",
	}
	list := &cobra.Command{
		Use:   "list [--owner NAME] [--upstream NAME]",
		Short: "Lists who has connected their account to which upstream: owner, scopes, expiry; never a token",
		Args:  cobra.NoArgs,
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
			admin, err := runningAdmin(fl, "the connections are read through the running server")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			q := url.Values{}
			for _, f := range []string{"owner", "upstream"} {
				if v := fl.String(f); v != "" {
					q.Set(f, v)
				}
			}
			var res struct {
				Connections []upstreamauth.Connection `json:"connections"`
			}
			if err := adminJSON(admin, http.MethodGet, "/zidane/connections?"+q.Encode(), nil, &res); err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if len(res.Connections) == 0 {
				fmt.Println("No connections.")
				return caddy.ExitCodeSuccess, nil
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "UPSTREAM\tOWNER\tSTATE\tSCOPES\tEXPIRES\tREFRESH")
			for _, cn := range res.Connections {
				exp := "-"
				if !cn.Expiry.IsZero() {
					exp = cn.Expiry.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%t\n", cn.Upstream, cn.Owner, cn.State, orNone(cn.Scopes), exp, cn.Refreshable)
			}
			tw.Flush()
			return caddy.ExitCodeSuccess, nil
		}),
	}
	revoke := &cobra.Command{
		Use:   "revoke [--owner NAME] [--upstream NAME]",
		Short: "Revokes people's connections at the upstream (where it supports RFC 7009) and deletes them",
		Args:  cobra.NoArgs,
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
			admin, err := runningAdmin(fl, "revoking needs the running server")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			body, _ := json.Marshal(connectionRequest{Owner: fl.String("owner"), Upstream: fl.String("upstream")})
			var res struct {
				Revoked []revokedConnection `json:"revoked"`
			}
			if err := adminJSON(admin, http.MethodPost, "/zidane/connections/revoke", body, &res); err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if len(res.Revoked) == 0 {
				fmt.Println("No connection matched; nothing was revoked.")
			}
			for _, rc := range res.Revoked {
				fmt.Printf("Revoked %s's connection to %s.\n", rc.Owner, rc.Upstream)
				if rc.Warning != "" {
					fmt.Printf("  warning: %s\n", rc.Warning)
				}
			}
			return caddy.ExitCodeSuccess, nil
		}),
	}
	for _, sub := range []*cobra.Command{list, revoke} {
		sub.Flags().String("owner", "", "Only this person's connections (a token's owner, a JWT's jwt:<sub>, a signed-in person)")
		sub.Flags().String("upstream", "", "Only the connections to this upstream")
		adminFlags(sub)
		c.AddCommand(sub)
	}
	return c
}
