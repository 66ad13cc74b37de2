package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// UpstreamTokenKeyEnv is the environment variable read for the upstream
// token key when upstream_token_key is not set.
const UpstreamTokenKeyEnv = "ZIDANE_UPSTREAM_TOKEN_KEY"

// oauthPool holds one OAuth client per storage, upstream and OAuth config,
// so a reload keeps its token in memory; a changed config gets a new
// client (the stored token, and the logins awaiting their callback, which
// are in storage too, stay).
var oauthPool = caddy.NewUsagePool()

type oauthEntry struct {
	client *upstreamauth.Client
	stop   context.CancelFunc // the storage watch, on NATS storage
}

func (e *oauthEntry) Destruct() error {
	if e.stop != nil {
		e.stop()
	}
	e.client.Close()
	return nil
}

// watchRecord, on NATS storage, has c read its stored record again each
// time another replica writes it (a login, a logout, a renewal), so that
// a logout on one replica stops the token's use on every other at once; a
// write the watch missed (NATS restarted) is read within
// cluster.WatchCheck (2 s), and the record is read again every
// cluster.WatchResync (30 s) whatever happened, after a read that failed.
func watchRecord(st storage.Storage, name string, c *upstreamauth.Client, logger *zap.Logger) context.CancelFunc {
	cs, ok := st.(*cluster.Storage)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	go cs.Watch(ctx, upstreamauth.StorageKey(name), func() {
		if err := c.Reload(ctx); err != nil && ctx.Err() == nil {
			logger.Warn("upstream oauth: could not read the record another replica wrote", zap.String("upstream", name), zap.Error(err))
		}
	})
	return cancel
}

// watchOwnerRecords, on NATS storage, watches a person's record for the
// OAuth client that holds it in memory (see watchRecord): a person's
// connection revoked on one replica stops their token's use on every
// other at once. Nil on other storage, where one process holds it.
func watchOwnerRecords(st storage.Storage) func(key string, changed func()) func() {
	cs, ok := st.(*cluster.Storage)
	if !ok {
		return nil
	}
	return func(key string, changed func()) func() {
		ctx, cancel := context.WithCancel(context.Background())
		go cs.Watch(ctx, key, changed)
		return cancel
	}
}

// upstreamTokenKey decodes the key that seals upstream tokens.
func (a *App) upstreamTokenKey() ([]byte, error) {
	raw := a.UpstreamTokenKey
	where := "upstream_token_key"
	if raw == "" {
		raw, where = os.Getenv(UpstreamTokenKeyEnv), UpstreamTokenKeyEnv
	} else {
		raw = caddy.NewReplacer().ReplaceKnown(raw, "")
	}
	raw = strings.TrimSpace(raw)
	if raw == "" && a.UpstreamTokenKey != "" {
		return nil, fmt.Errorf("upstream_token_key %s is empty: an upstream has an oauth block, so its tokens are stored encrypted; set that variable in caddy's environment to 32 random bytes in base64, e.g. the output of `openssl rand -base64 32`", a.UpstreamTokenKey)
	}
	if raw == "" {
		return nil, fmt.Errorf("an upstream has an oauth block, so its tokens are stored encrypted: set %s (or upstream_token_key in the global zidane option) to 32 random bytes in base64, e.g. the output of `openssl rand -base64 32`", UpstreamTokenKeyEnv)
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		key, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(raw, "="))
	}
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("%s must be 32 bytes in base64 (e.g. `openssl rand -base64 32`); the value given is not", where)
	}
	return key, nil
}

// provisionOAuth gets (or shares) the OAuth client of every upstream with
// an oauth block.
func (a *App) provisionOAuth(ctx caddy.Context) error {
	names := make([]string, 0, len(a.upstreams))
	for name, u := range a.upstreams {
		if u.OAuth != nil {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	a.ctx = ctx
	if ev, err := ctx.AppIfConfigured("events"); err == nil {
		a.events, _ = ev.(*caddyevents.App)
	}
	key, err := a.upstreamTokenKey()
	if err != nil {
		return fmt.Errorf("zidane: %w", err)
	}
	logger := ctx.Logger().Named("upstream_oauth")
	a.oauth = map[string]*upstreamauth.Client{}
	for _, name := range names {
		u := a.upstreams[name]
		e, warnings := u.Expanded(nil)
		for _, w := range warnings {
			logger.Warn("upstream oauth", zap.String("warning", w))
		}
		cfg := *e.OAuth
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("upstream %q: %w", name, err)
		}
		if err := a.checkExchange(name, cfg); err != nil {
			return err
		}
		endpoint, err := e.Endpoint()
		if err != nil {
			return fmt.Errorf("upstream %q: %w", name, err)
		}
		poolKey := oauthPoolKey(a.tokensKey, name, endpoint.String(), cfg, key)
		audit := auditLogger()
		val, _, err := oauthPool.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
			nctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := upstreamauth.New(nctx, name, endpoint.String(), cfg, upstreamauth.Options{
				Storage: a.storage,
				Key:     key,
				Logger:  slog.New(zapslog.NewHandler(logger.With(zap.String("upstream", name)).Core())),
				HTTPOptions: []pinnedfetch.Option{pinnedfetch.WithDecisions(func(d pinnedfetch.Decision) {
					auditRedirect(audit, name+" (oauth)", d)
				})},
				OnState:      func(st upstreamauth.Status) { oauthStateChanged(name, st) },
				WatchOwner:   watchOwnerRecords(a.storage),
				SubjectToken: personSignInToken,
			})
			if err != nil {
				return nil, err
			}
			return &oauthEntry{client: c, stop: watchRecord(a.storage, name, c, logger)}, nil
		})
		if err != nil {
			a.cleanupOAuth()
			return fmt.Errorf("upstream %q: oauth: %w", name, err)
		}
		a.oauthKeys = append(a.oauthKeys, poolKey)
		a.oauth[name] = val.(*oauthEntry).client
		if u, err := url.Parse(cfg.ClientMetadataURL); err == nil && cfg.ClientMetadataURL != "" {
			if a.cimd == nil {
				a.cimd = map[string]*upstreamauth.Client{}
			}
			a.cimd[strings.ToLower(u.Hostname())+u.EscapedPath()] = a.oauth[name]
		}
	}
	a.unhookGrants = a.hookGrantRevocations()
	return nil
}

// oauthPoolKey identifies an OAuth client: the storage, the upstream, its
// endpoint, and a hash of its expanded config and the sealing key (held
// only in memory).
func oauthPoolKey(storageKey, name, endpoint string, cfg upstreamauth.Config, key []byte) string {
	h := sha256.New()
	b, _ := json.Marshal(cfg)
	h.Write(b)
	h.Write(key)
	return storageKey + "|oauth|" + name + "|" + endpoint + "|" + hex.EncodeToString(h.Sum(nil))
}

func (a *App) cleanupOAuth() {
	if a.unhookGrants != nil {
		a.unhookGrants()
		a.unhookGrants = nil
	}
	for _, k := range a.oauthKeys {
		_, _ = oauthPool.Delete(k)
	}
	a.oauthKeys = nil
}

// OAuthClient returns the OAuth client of upstream name, or nil when it has
// no oauth block.
func (a *App) OAuthClient(name string) *upstreamauth.Client { return a.oauth[name] }

// credentials returns the egress credentials layer of upstream name: its
// OAuth client's transport, or nil. For credentials per_user it attaches
// the calling person's own token (the request's principal's owner), and
// never the shared one.
func (a *App) credentials(name string) func(next http.RoundTripper) http.RoundTripper {
	c := a.oauth[name]
	if c == nil {
		return nil
	}
	if u, ok := a.upstreams[name]; ok && u.OAuth != nil && u.OAuth.PerUser() {
		return c.OwnerTransport(callerOwner)
	}
	return c.Transport
}

// callerOwner is the person a request acts for: its principal's owner (a
// grant's person, a JWT's subject, a token's owner, inherited by the
// tokens derived from it, such as a session agent's), or the person of
// the upstream session it goes on (the aggregated route's per-person
// sessions, upstreamauth.WithCallOwner); "" with neither, or when the two
// name different people (one reading, or none).
func callerOwner(ctx context.Context) string {
	p, hasPrincipal := policy.PrincipalFrom(ctx)
	if o, ok := upstreamauth.CallOwner(ctx); ok {
		if hasPrincipal && p.OwnerID() != o {
			return ""
		}
		return o
	}
	if !hasPrincipal {
		return ""
	}
	return p.OwnerID()
}

// exchanges reports whether cfg gets each person's token from their
// sign-in through the IdP, without a browser.
func exchanges(cfg *upstreamauth.Config) bool { return cfg != nil && cfg.Exchanges() }

// checkExchange refuses an upstream that would get each person's token
// from their sign-in through the company IdP where the gateway signs no
// one in through one: no person's call could ever get a token, whatever
// the fallback (which alone is the authorization_code grant).
func (a *App) checkExchange(name string, cfg upstreamauth.Config) error {
	if !exchanges(&cfg) || (a.Signin != nil && a.Signin.OIDC != nil) {
		return nil
	}
	return fmt.Errorf("upstream %q: oauth grant %s with credentials per_user exchanges each person's sign-in token from the company IdP, and this gateway signs no one in through one: configure signin { oidc … } with the IdP the upstream trusts, or use grant authorization_code (each person connects through the link)", name, cfg.Grant)
}

// personSignInToken is the ID token kept of owner's sign-in through the
// running config's IdP (see idp.Service.SubjectToken).
func personSignInToken(ctx context.Context, owner string) (string, error) {
	app := liveApp()
	if app == nil || app.signin == nil || app.signin.people == nil {
		return "", errors.New("this gateway signs no one in through a company IdP (signin { oidc … })")
	}
	return app.signin.people.SubjectToken(ctx, owner)
}

// keepsSignIns reports whether an upstream exchanges people's sign-ins,
// so that the sign-in keeps them.
func (a *App) keepsSignIns() bool {
	for _, u := range a.upstreams {
		if exchanges(u.OAuth) {
			return true
		}
	}
	return false
}

// perUser reports whether upstream name attaches each caller's own token.
func (a *App) perUser(name string) bool {
	u, ok := a.upstreams[name]
	return ok && u.OAuth != nil && u.OAuth.PerUser()
}

// authRequired reports whether upstream name waits for an operator's
// login.
func (a *App) authRequired(name string) bool {
	c := a.oauth[name]
	return c != nil && c.State().State == upstreamauth.StateAuthRequired
}

// oauthStateChanged records a change of an upstream's OAuth state: an
// audit line, and the Caddy event "upstream_auth_required" or
// "upstream_auth_ready" (or "upstream_auth_error") for event handlers. It
// runs under the OAuth client's lock, so the event is emitted from a
// goroutine.
func oauthStateChanged(upstream string, st upstreamauth.Status) {
	fields := []zap.Field{zap.String("event", "upstream_auth"), zap.String("upstream", upstream),
		zap.String("state", st.State), zap.Strings("scopes", st.Scopes)}
	if st.Err != "" {
		fields = append(fields, zap.String("detail", st.Err))
	}
	if st.State == upstreamauth.StateReady {
		auditLogger().Info("upstream auth state", fields...)
	} else {
		auditLogger().Warn("upstream auth state", fields...)
	}
	go func() {
		app := liveApp()
		if app == nil || app.events == nil {
			return
		}
		app.events.Emit(app.ctx, "upstream_auth_"+strings.ReplaceAll(st.State, "-", "_"), map[string]any{
			"upstream": upstream, "state": st.State, "scopes": st.Scopes, "detail": st.Err,
		})
	}()
}

// serveClientMetadata answers a GET for an upstream's client_metadata_url
// with the gateway's Client ID Metadata Document for it, and reports
// whether it did. The authorization server fetches it to learn the
// gateway's callback; it holds no secret.
func (a *App) serveClientMetadata(w http.ResponseWriter, r *http.Request) bool {
	if len(a.cimd) == 0 || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		return false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	c := a.cimd[strings.ToLower(strings.Trim(host, "[]"))+r.URL.EscapedPath()]
	if c == nil {
		return false
	}
	doc, ok := c.ClientMetadataDocument()
	if !ok {
		return false
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		w.Write(doc)
	}
	return true
}
