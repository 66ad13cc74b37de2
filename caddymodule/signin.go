package caddymodule

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/accounts"
	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/approvals/approvalpage"
	"github.com/Tahul/caddy-zidane-mcp/authserver"
	"github.com/Tahul/caddy-zidane-mcp/authserver/clients"
	"github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/broker/connect"
	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/dpop"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Values of SigninConfig.Registration.
const (
	registrationDynamic = "dynamic"
	registrationOff     = "off"
)

// SigninConfig is the `signin` block of the zidane app: the gateway as the
// OAuth authorization server of its MCP clients (package authserver), on
// every site that runs zidane_mcp. A person signs in in the browser their
// client opens, consents, and the client gets this gateway's tokens for
// one resource.
type SigninConfig struct {
	// Issuer is the authorization server's issuer identifier: the https
	// origin the sites are reached at, such as https://mcp.example.com
	// (http only on a loopback address). Every URL the server gives out
	// is built from it, never from a request's Host. Required.
	Issuer string `json:"issuer"`

	// AccessLifetime is how long an access token lasts, at most 24h.
	// Default: the token store's (10m).
	AccessLifetime caddy.Duration `json:"access_lifetime,omitempty"`

	// RefreshLifetime is how long a refresh token stays good unused;
	// each refresh rotates it, and a grant ends after 90 days whatever
	// its refreshes. Default: the token store's (14 days).
	RefreshLifetime caddy.Duration `json:"refresh_lifetime,omitempty"`

	// Registration is "dynamic" to let clients register themselves (RFC
	// 7591, which MCP keeps for compatibility), or "off" (the default):
	// clients then name themselves by a Client ID Metadata Document.
	Registration string `json:"registration,omitempty"`

	// SessionLifetime is how long a person's sign-in on a browser lasts,
	// 1m to 24h. Default: 1h.
	SessionLifetime caddy.Duration `json:"session_lifetime,omitempty"`

	// OIDC is the company IdP people sign in through (see SigninOIDC).
	// Without it, people sign in with the one-time links of `caddy zidane
	// signin-link`.
	OIDC *SigninOIDC `json:"oidc,omitempty"`
}

// signinLocalKey is the key of a node without a cluster, from which the
// sign-in's keys are derived: held in memory for the process, never
// written to storage (agents on the host can read the gateway's files). A
// restart voids the consent forms on screen and the browsers' sign-ins;
// codes and grants are in storage and stay good.
var signinLocalKey = func() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
}()

// signinKey is the key for purpose: on a cluster, derived from the cluster
// key, so that every replica opens what another sealed.
func signinKey(st storage.Storage, purpose string) ([]byte, error) {
	if cs, ok := st.(*cluster.Storage); ok {
		return cs.DeriveKey(purpose)
	}
	return cluster.Derive(signinLocalKey, purpose)
}

// signin is a config's authorization server, with the sign-in of persons
// and the resolution of clients it stands on.
type signin struct {
	server    *authserver.Server
	people    *idp.Service
	clients   *clients.Registry
	resources *signinResources
	// accounts is the page of a person's connected upstream accounts;
	// nil when no upstream has credentials per_user.
	accounts *accounts.Page
	// connect serves the connect links of per_user upstreams; nil with
	// none.
	connect *connect.Service
	// approvals serves the status pages of held calls.
	approvals *approvalpage.Page
}

// signinResources are the resources of the config's zidane_mcp sites,
// which tokens may be issued for; each handler adds its own at Provision.
type signinResources struct {
	mu   sync.RWMutex
	list []authserver.Resource
}

func (rs *signinResources) add(res authserver.Resource) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for i, r := range rs.list {
		if r.URL == res.URL {
			// Two sites of one resource: the scopes either knows.
			for _, sc := range res.Scopes {
				if !slices.Contains(r.Scopes, sc) {
					rs.list[i].Scopes = append(rs.list[i].Scopes, sc)
				}
			}
			return
		}
	}
	rs.list = append(rs.list, res)
}

func (rs *signinResources) Resource(uri string) (authserver.Resource, bool) {
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	for _, r := range rs.list {
		if r.URL == uri {
			return r, true
		}
	}
	return authserver.Resource{}, false
}

func (rs *signinResources) All() []authserver.Resource {
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	return slices.Clone(rs.list)
}

// registryClients adapts the clients package's registry to the
// authorization server's interface.
type registryClients struct{ r *clients.Registry }

func (c registryClients) Resolve(ctx context.Context, id string) (authserver.Client, error) {
	cl, err := c.r.Resolve(ctx, id)
	var ce *clients.Error
	switch {
	case errors.As(err, &ce) && ce.Code == clients.CodeTemporarilyUnavailable:
		return nil, fmt.Errorf("%w: %w", authserver.ErrClientUnavailable, err)
	case err != nil:
		return nil, err
	}
	return cl, nil
}

// idpPeople adapts the sign-in service to the authorization server's
// interface.
type idpPeople struct{ s *idp.Service }

func (p idpPeople) Current(r *http.Request) (authserver.Person, bool) {
	per, ok := p.s.Current(r)
	return authserver.Person{Owner: per.Owner, Name: per.Name, Scopes: per.Scopes}, ok
}

func (p idpPeople) SignIn(w http.ResponseWriter, r *http.Request, returnTo string) {
	p.s.SignIn(w, r, returnTo)
}

// provisionSignin builds the config's authorization server, when the app
// has a signin block.
func (a *App) provisionSignin(ctx caddy.Context) error {
	c := a.Signin
	if c == nil {
		return nil
	}
	issuer, err := authserver.CheckIssuer(c.Issuer)
	if err != nil {
		return fmt.Errorf("zidane signin: %w", err)
	}
	switch c.Registration {
	case "", registrationOff, registrationDynamic:
	default:
		return fmt.Errorf("zidane signin: registration %q: write `registration dynamic` to let clients register themselves (RFC 7591), or `registration off`", c.Registration)
	}
	for name, d := range map[string]caddy.Duration{"access_lifetime": c.AccessLifetime, "refresh_lifetime": c.RefreshLifetime, "session_lifetime": c.SessionLifetime} {
		if d < 0 {
			return fmt.Errorf("zidane signin: %s is negative; give a duration such as 15m", name)
		}
	}
	if err := policy.CheckGrantLifetimes(time.Duration(c.AccessLifetime), time.Duration(c.RefreshLifetime)); err != nil {
		return fmt.Errorf("zidane signin: access_lifetime or refresh_lifetime: %w", err)
	}
	reg, err := clients.New(clients.Config{
		Storage:      a.storage,
		Registration: c.Registration == registrationDynamic,
		ClientIP:     clientIP,
		OnRefusal: func(rf clients.Refusal) {
			metricRefusals.WithLabelValues("signin_client").Inc()
			auditLogger().Warn("signin client refused", zap.String("event", "signin_refused"), zap.String("step", rf.Kind),
				zap.String("error", rf.Code), zap.String("reason", rf.Reason), zap.String("client_id", rf.ClientID), zap.String("client_ip", rf.Address))
		},
	})
	if err != nil {
		return fmt.Errorf("zidane signin: %w", err)
	}
	peopleKey, err := signinKey(a.storage, "signin people v1")
	if err != nil {
		return err
	}
	var rp *idp.OIDC
	if c.OIDC != nil {
		if rp, err = c.OIDC.relyingParty(); err != nil {
			return fmt.Errorf("zidane signin: %w", err)
		}
	}
	var keep storage.Storage
	if a.keepsSignIns() {
		keep = a.storage
	}
	people, err := idp.New(idp.Config{
		Site:            issuer,
		Key:             peopleKey,
		SessionLifetime: time.Duration(c.SessionLifetime),
		OIDC:            rp,
		Links:           a.storage,
		KeepSignIns:     keep,
		Audit: func(rf idp.Refusal) {
			metricRefusals.WithLabelValues("signin_person").Inc()
			auditLogger().Warn("signin refused", zap.String("event", "signin_refused"), zap.String("step", rf.Step),
				zap.String("reason", rf.Reason), zap.String("detail", rf.Detail), zap.String("owner", rf.Owner), zap.Int("status", rf.Status))
		},
	})
	if err != nil {
		return fmt.Errorf("zidane signin: %w", err)
	}
	consentKey, err := signinKey(a.storage, "signin consent v1")
	if err != nil {
		return err
	}
	verifier := &dpop.Verifier{Window: dpop.DefaultWindow, Replay: dpopLocal}
	if cs, ok := a.storage.(*cluster.Storage); ok {
		r, err := clusterReplay(cs)
		if err != nil {
			return fmt.Errorf("zidane signin: %w", err)
		}
		verifier.Replay = r
	}
	resources := new(signinResources)
	cfg := authserver.Config{
		Issuer:          issuer,
		Resources:       resources,
		Clients:         registryClients{reg},
		People:          idpPeople{people},
		Grants:          a.tokens.store,
		AccessLifetime:  time.Duration(c.AccessLifetime),
		RefreshLifetime: time.Duration(c.RefreshLifetime),
		Storage:         a.storage,
		Key:             consentKey,
		DPoP:            verifier,
		ClientIP:        clientIP,
		Audit: func(rf authserver.Refusal) {
			// One label per source, not per reason: the metric's labels
			// stay a fixed set whatever a refusal says.
			metricRefusals.WithLabelValues("signin").Inc()
			auditLogger().Warn("signin refused", zap.String("event", "signin_refused"), zap.String("step", rf.Endpoint),
				zap.String("error", rf.Error), zap.String("reason", rf.Reason), zap.String("client_id", rf.Client),
				zap.String("owner", rf.Owner), zap.String("resource", rf.Resource), zap.String("remote", rf.Remote))
		},
	}
	if reg.RegistrationEnabled() {
		cfg.Register = http.HandlerFunc(reg.Register)
	}
	srv, err := authserver.New(cfg)
	if err != nil {
		return fmt.Errorf("zidane signin: %w", err)
	}
	a.signin = &signin{server: srv, people: people, clients: reg, resources: resources}
	if a.signin.accounts, err = a.accountsPage(issuer, people); err != nil {
		return fmt.Errorf("zidane signin: %w", err)
	}
	if a.signin.connect, err = a.connectService(issuer, people); err != nil {
		return fmt.Errorf("zidane signin: %w", err)
	}
	if a.signin.approvals, err = a.approvalPage(issuer, people); err != nil {
		return fmt.Errorf("zidane signin: %w", err)
	}
	go sweepSignin(ctx, srv, reg, people)
	return nil
}

// signinSweep is how often expired codes and unused registrations are
// deleted from storage.
const signinSweep = 5 * time.Minute

// sweepSignin deletes what expired, until the config stops.
func sweepSignin(ctx context.Context, srv *authserver.Server, reg *clients.Registry, people *idp.Service) {
	t := time.NewTicker(signinSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := srv.Sweep(ctx); err != nil && ctx.Err() == nil {
				auditLogger().Warn("signin codes could not be swept", zap.String("event", "signin_sweep"), zap.Error(err))
			}
			if _, err := reg.Sweep(ctx); err != nil && ctx.Err() == nil {
				auditLogger().Warn("registered clients could not be swept", zap.String("event", "signin_sweep"), zap.Error(err))
			}
			if _, err := people.SweepKept(ctx); err != nil && ctx.Err() == nil {
				auditLogger().Warn("kept sign-ins could not be swept", zap.String("event", "signin_sweep"), zap.Error(err))
			}
		}
	}
}

// serves says whether path is the sign-in's: the authorization server's
// endpoints and metadata, and the person's sign-in under the same prefix.
func (s *signin) serves(path string) bool {
	return s.server.Handles(path) || strings.HasPrefix(path, authserver.Base) || (s.connect != nil && strings.HasPrefix(path, connect.PathPrefix)) ||
		(s.approvals != nil && strings.HasPrefix(path, approvalpage.PathPrefix))
}

func (s *signin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.connect != nil && strings.HasPrefix(r.URL.Path, connect.PathPrefix) {
		s.connect.ServeHTTP(w, r)
		return
	}
	if s.approvals != nil && strings.HasPrefix(r.URL.Path, approvalpage.PathPrefix) {
		s.approvals.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == accounts.Path && s.accounts != nil {
		s.accounts.ServeHTTP(w, r)
		return
	}
	if s.server.Handles(r.URL.Path) {
		s.server.ServeHTTP(w, r)
		return
	}
	s.people.ServeHTTP(w, r)
}

// signinResource adds a site's resource to those tokens may be issued
// for. With a signin block, a resource must be absolute: it is what a
// token is bound to, and a path alone would take its host from the
// client's Host header.
func (a *App) signinResource(resource string, absolute bool, scopes []string) error {
	if a.signin == nil {
		return nil
	}
	if !absolute {
		return fmt.Errorf("zidane_mcp: resource %q: with a signin block, give the resource as an absolute URL, such as %s/mcp: tokens are issued for one resource, named by its URL", resource, a.signin.server.Issuer())
	}
	if err := policy.CheckGrantResource(resource); err != nil {
		return fmt.Errorf("zidane_mcp: with a signin block, grants name the resource: %w", err)
	}
	a.signin.resources.add(authserver.Resource{URL: resource, Scopes: scopes})
	return nil
}

// signinIssuer is the issuer sites name in their RFC 9728 metadata, or "".
func (a *App) signinIssuer() string {
	if a == nil || a.signin == nil {
		return ""
	}
	return a.signin.server.Issuer()
}

// parseSignin reads the signin block of the zidane global option:
//
//	signin {
//		issuer <https origin>
//		access_lifetime <duration>
//		refresh_lifetime <duration>
//		session_lifetime <duration>
//		registration dynamic|off
//		oidc { … }                    # see unmarshalSigninOIDC
//	}
func parseSignin(d *caddyfile.Dispenser) (*SigninConfig, error) {
	c := new(SigninConfig)
	if d.NextArg() {
		return nil, d.Err("signin takes no argument, only a block: signin { issuer https://mcp.example.com … }")
	}
	for d.NextBlock(1) {
		switch opt := d.Val(); opt {
		case "issuer":
			if !d.Args(&c.Issuer) || d.NextArg() {
				return nil, d.Err("signin issuer takes one value: the https origin the sites are reached at, such as https://mcp.example.com")
			}
		case "registration":
			if !d.Args(&c.Registration) || d.NextArg() || (c.Registration != registrationDynamic && c.Registration != registrationOff) {
				return nil, d.Err("signin registration takes one value: dynamic (clients may register themselves, RFC 7591) or off")
			}
		case "access_lifetime", "refresh_lifetime", "session_lifetime":
			var s string
			if !d.Args(&s) || d.NextArg() {
				return nil, d.Errf("signin %s takes one value: a positive duration such as 15m", opt)
			}
			dur, err := caddy.ParseDuration(s)
			if err != nil || dur <= 0 {
				return nil, d.Errf("signin %s %q: give a positive duration such as 15m", opt, s)
			}
			*map[string]*caddy.Duration{"access_lifetime": &c.AccessLifetime, "refresh_lifetime": &c.RefreshLifetime, "session_lifetime": &c.SessionLifetime}[opt] = caddy.Duration(dur)
		case "oidc":
			if c.OIDC != nil {
				return nil, d.Err("signin: oidc is given twice; give one block with every setting")
			}
			var err error
			if c.OIDC, err = unmarshalSigninOIDC(d); err != nil {
				return nil, err
			}
		default:
			return nil, d.Errf("unknown signin option %q", opt)
		}
	}
	if c.Issuer == "" {
		return nil, d.Err("signin needs its issuer: issuer https://mcp.example.com, the origin the sites are reached at")
	}
	return c, nil
}

// approvalPage is the status page of held calls on the sign-in site
// issuer: people signed in through people answer them there when their
// scopes hold the approve scope for the call's site (policy.MayApprove).
func (a *App) approvalPage(issuer string, people *idp.Service) (*approvalpage.Page, error) {
	key, err := signinKey(a.storage, "signin approvals v1")
	if err != nil {
		return nil, err
	}
	return approvalpage.New(approvalpage.Options{
		Origin: issuer,
		Key:    key,
		Store:  a.approvals,
		Current: func(r *http.Request) (approvalpage.Person, bool) {
			p, ok := people.Current(r)
			return approvalpage.Person{Owner: p.Owner, Name: p.Name, Scopes: p.Scopes}, ok
		},
		May: func(p approvalpage.Person, ap approvals.Approval) bool {
			return policy.MayApprove(policy.Principal{Owner: p.Owner, Scopes: p.Scopes}, ap.Site)
		},
		Audit: func(e approvalpage.Event) {
			metricRefusals.WithLabelValues("approval_page").Inc()
			auditLogger().Warn("approval page refused", zap.String("event", "refused"), zap.String("reason", e.Reason),
				zap.String("approval", e.ID), zap.String("owner", e.Owner), zap.Int("status", e.Status), zap.String("detail", e.Detail))
		},
	})
}
