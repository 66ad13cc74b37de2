package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/broker/aggregate"
	"github.com/Tahul/caddy-zidane-mcp/broker/connect"
	"github.com/Tahul/caddy-zidane-mcp/broker/passthrough"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// connectAuthorizer runs the per-owner logins of the app's per_user
// upstreams for the connect links.
type connectAuthorizer map[string]*upstreamauth.Client

func (c connectAuthorizer) owner(owner, up string) (*upstreamauth.OwnerClient, error) {
	cl := c[up]
	if cl == nil {
		return nil, fmt.Errorf("upstream %q takes no person's own account", up)
	}
	return cl.ForOwner(owner)
}

func (c connectAuthorizer) Begin(ctx context.Context, owner, up string) (string, error) {
	oc, err := c.owner(owner, up)
	if err != nil {
		return "", err
	}
	return oc.BeginLogin(ctx)
}

func (c connectAuthorizer) Finish(ctx context.Context, owner, up string, q url.Values) error {
	oc, err := c.owner(owner, up)
	if err != nil {
		return err
	}
	return oc.Callback(ctx, q)
}

// connectService is the connect links of the app's per_user upstreams, on
// the sign-in's site; nil when no upstream is per_user.
func (a *App) connectService(issuer string, people *idp.Service) (*connect.Service, error) {
	per := connectAuthorizer{}
	for name, c := range a.oauth {
		// A person of an upstream that exchanges their sign-in token
		// connects through the link only with fallback connect.
		if cfg := a.upstreams[name].OAuth; !a.perUser(name) || (exchanges(cfg) && cfg.Fallback != upstreamauth.FallbackConnect) {
			continue
		}
		if err := checkConnectRedirect(name, a.upstreams[name].OAuth.RedirectURL, issuer); err != nil {
			return nil, err
		}
		per[name] = c
	}
	if len(per) == 0 {
		return nil, nil
	}
	return connect.New(connect.Config{
		Site:       issuer,
		Store:      a.storage,
		People:     people,
		Authorizer: per,
		ClientIP:   clientIP,
		Audit: func(rf connect.Refusal) {
			metricRefusals.WithLabelValues("connect").Inc()
			auditLogger().Warn("connect refused", zap.String("event", "connect_refused"), zap.String("step", rf.Step),
				zap.String("reason", rf.Reason), zap.String("owner", rf.Owner), zap.String("browser", rf.Browser),
				zap.String("upstream", rf.Upstream), zap.Int("status", rf.Status), zap.String("detail", rf.Detail))
		},
		Connected: func(c connect.Connection) {
			auditLogger().Info("upstream account connected", zap.String("event", "upstream_connect"),
				zap.String("owner", c.Owner), zap.String("upstream", c.Upstream))
		},
	})
}

// checkConnectRedirect refuses a per_user upstream whose redirect_url is
// not on the signin issuer's site: the upstream sends the person's browser
// there, and the connect flow finishes only with the sign-in cookie of the
// issuer's site, so every person's connection would fail at its last step.
func checkConnectRedirect(name, redirect, issuer string) error {
	want := strings.TrimSuffix(issuer, "/") + "/zidane/oauth/callback/" + name
	ru, err1 := url.Parse(redirect)
	iu, err2 := url.Parse(issuer)
	if err1 == nil && err2 == nil && ru.IsAbs() && pinnedfetch.Origin(ru) == pinnedfetch.Origin(iu) {
		return nil
	}
	return fmt.Errorf("upstream %q has credentials per_user, and its redirect_url %s is not on the signin issuer's site, where the person's browser carries their sign-in: set redirect_url %s", name, redirect, want)
}

// connectRequired answers a per_user call whose person has not connected
// their account: with a connect link carried by URL elicitation when the
// gateway signs people in, else passthrough's refusal.
func (a *App) connectRequired(w http.ResponseWriter, r *http.Request, rpcID json.RawMessage, method string, err *upstreamauth.ConnectRequiredError, initCaps []byte) {
	if a.signin == nil || a.signin.connect == nil {
		passthrough.RefuseConnectRequired(w, r, rpcID, method, err, initCaps)
		return
	}
	a.signin.connect.Respond(w, r, callerOwner(r.Context()), err.Upstream, rpcID, method, initCaps)
}

// connectRetry decides, on route, the 2026-07-28 retry c of a call to
// upstream name that asked its person to connect (connect.Service.Settle): it waits for
// the connection and lets the call go on, or answers a decline, or
// refuses a requestState that is not the caller's for this upstream.
func (a *App) connectRetry(name, route string) func(w http.ResponseWriter, r *http.Request, c message.Call) bool {
	return func(w http.ResponseWriter, r *http.Request, c message.Call) bool {
		var svc *connect.Service
		if a.signin != nil {
			svc = a.signin.connect
		}
		err := connect.ErrRetryNotYours
		if svc != nil {
			err = svc.Settle(r.Context(), callerOwner(r.Context()), name, c)
		}
		if err == nil {
			return false
		}
		if errors.Is(err, connect.ErrRetryNotYours) {
			metricRefusals.WithLabelValues("request_state").Inc()
			p, _ := policy.PrincipalFrom(r.Context())
			auditBrokerRefusal(auditLogger(), upstream.Refusal{Upstream: name, Route: route, HTTPMethod: r.Method, Method: c.Method,
				TokenID: p.TokenID, TokenName: p.Name, Reason: "request_state", Status: http.StatusForbidden, Detail: err.Error()})
		}
		status, body := connect.RetryAnswer(c, name, err)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(status)
		_, _ = w.Write(body)
		return true
	}
}

// connectHold is, for upstream name, the wait of a person's GET stream for
// their connection (connect.Service.WaitConnected); nil when the gateway
// makes no connect links, it waits for nothing.
func (a *App) connectHold(name string) func(ctx context.Context, r *http.Request, since time.Time) ([]string, bool) {
	return func(ctx context.Context, r *http.Request, since time.Time) ([]string, bool) {
		if a.signin == nil || a.signin.connect == nil {
			// No link can connect this person: the stream stays open,
			// quiet, until it ends.
			<-ctx.Done()
			return nil, false
		}
		return a.signin.connect.WaitConnected(ctx, callerOwner(r.Context()), name, since)
	}
}

// connectElicitations gives the route of the per_user upstream name the
// ids of the calling person's live elicitations for it, at once.
func (a *App) connectElicitations(name string) func(ctx context.Context, r *http.Request) []string {
	return func(ctx context.Context, r *http.Request) []string {
		if a.signin == nil || a.signin.connect == nil {
			return nil
		}
		return a.signin.connect.Elicitations(ctx, callerOwner(r.Context()), name)
	}
}

// connects is the config's connect links, or nil without them (no
// signin, or no per_user upstream).
func (a *App) connects() *connect.Service {
	if a.signin == nil {
		return nil
	}
	return a.signin.connect
}

// connectAnswer is the aggregated route's answer to owner's call c of a
// per_user upstream's tool, owner not having connected there: the connect
// link (connect.Service.Refuse). Set only with connect links.
func (a *App) connectAnswer(ctx context.Context, owner, upstream string, c message.Call, initCaps []byte) ([]byte, error) {
	b, err := a.connects().Refuse(ctx, owner, upstream, c, initCaps)
	if errors.Is(err, connect.ErrNotPerson) {
		return nil, &aggregate.ConnectRefusal{Status: http.StatusForbidden, Code: message.CodeForbidden,
			Message: fmt.Sprintf("%s takes each person's own account, and this credential does not belong to a person who can sign in to the gateway to connect one (%v); use a credential of your own, signed in", upstream, err)}
	}
	return b, err
}

// connectSettle lets the 2026-07-28 retry of a call answered with a
// connect link wait, bounded, for its person (connect.Service.Settle).
// Set only with connect links.
func (a *App) connectSettle(ctx context.Context, owner string, c message.Call) bool {
	return a.connects().SettleAny(ctx, owner, c)
}

// connectWait waits until owner has connected through the link of
// elicitation (connect.Service.Wait).
func (a *App) connectWait(ctx context.Context, owner, elicitation string) bool {
	return a.connects().Wait(ctx, owner, elicitation)
}

// personConnected reports whether owner's connection at per_user upstream
// name is usable, as this replica knows it (in memory: a revocation on any
// replica reaches it through the record's watch).
func (a *App) personConnected(name, owner string) bool {
	c := a.oauth[name]
	if c == nil {
		return false
	}
	oc, err := c.ForOwner(owner)
	return err == nil && oc.State().State == upstreamauth.StateReady
}
