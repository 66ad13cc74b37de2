// Package upstreamauth is the gateway's OAuth client for the upstream MCP
// servers it brokers: for each upstream, the gateway (never a human's MCP
// client, never an agent) obtains, stores, refreshes and attaches the
// access token.
//
// A [Client] serves one upstream. Its [Client.Transport] wraps the
// broker's origin-pinned egress (PassThroughOptions.Credentials,
// ConnOptions.Credentials, AggregateOptions.Credentials) and adds
// `Authorization: Bearer` to the hops on the upstream's origin. Grants:
//
//   - authorization_code with PKCE (S256), for upstreams that act on an
//     operator's behalf: [Client.BeginLogin] and [Client.Callback] (behind
//     `caddy zidane login <upstream>`) discover the authorization server
//     (RFC 9728, RFC 8414 / OpenID, the 2025-03-26 fallbacks), register
//     the gateway (Client ID Metadata Document, pre-registration or
//     dynamic registration) and redeem the code; the gateway then
//     refreshes on its own.
//   - client_credentials (client_secret_basic, client_secret_post,
//     private_key_jwt), cross_app_access (SEP-990) and jwt_bearer (a
//     workload's own JWT, RFC 7523 and SEP-1933), which need no login.
//
// An upstream with credentials per_user holds each person's own token
// instead: [Client.ForOwner] gives the person's [OwnerClient] (their
// login, callback, transport and revocation), sealed under (upstream, a
// keyed hash of the person), and [Client.OwnerTransport] attaches the
// calling person's token, never another's nor the shared one, refusing a
// call with none ([ErrConnectRequired]) before it is sent. With the
// token_exchange (RFC 8693) or cross_app_access (SEP-990) grant, a
// person's token comes without a browser from the ID token of their
// sign-in to the gateway (Options.SubjectToken; see exchange.go), falling
// back to the connect link where the config allows it.
//
// Where the authorization server offers it, tokens are DPoP-bound (RFC
// 9449): each request carries a fresh proof of a key the gateway made for
// the grant, and the servers' nonces are answered.
//
// Tokens, DPoP keys, the dynamic registration and what discovery found are
// stored through storage.Storage, sealed with AES-256-GCM. Refreshes are single
// flight across goroutines and, through the storage lock, across replicas:
// a refresh token is never redeemed twice. Every discovery, registration,
// token and revocation request goes through a pinnedfetch client pinned to
// the origin of its own URL. Tokens, secrets and keys never appear in
// errors, logs or String output.
//
// go-sdk's auth.AuthorizationCodeHandler is not used: it keeps its
// resolved configuration (registration, endpoints, scopes) private, cannot
// persist tokens or refresh across restarts and replicas, and runs the
// browser step inside a request. The flow is driven here with oauthex (its
// metadata types and WWW-Authenticate parser) and x/oauth2 (PKCE).
package upstreamauth

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// States of an upstream, as [Client.State] reports them.
const (
	StateReady        = "ready"
	StateAuthRequired = "auth-required"
	StateError        = "error"
)

// failureBackoff is how long a failure to obtain a token is returned to
// new requests without asking the authorization server again.
const failureBackoff = 2 * time.Second

// DefaultRefreshSkew is how long before its expiry a token is refreshed
// (less for tokens that live less than twice as long).
const DefaultRefreshSkew = 60 * time.Second

// Status is what [Client.State] reports. It holds no secret.
type Status struct {
	// State is "ready", "auth-required" or "error".
	State string `json:"state"`
	// Scopes are the scopes granted to the current token.
	Scopes []string `json:"scopes,omitempty"`
	// Expiry is when the current access token expires (zero: unknown).
	Expiry time.Time `json:"expiry,omitzero"`
	// Err says what is wrong, and what to do, in the other states.
	Err string `json:"error,omitempty"`
}

// Options configures [New].
type Options struct {
	// Storage keeps the sealed record (required).
	Storage storage.Storage
	// Key seals the record: 32 random bytes (AES-256-GCM), the same on
	// every replica. Keep it secret and stable: a new key makes stored
	// tokens unreadable, and the upstream needs a new login.
	Key []byte
	// Logger receives state changes and failures, never a secret. Nil
	// discards them.
	Logger *slog.Logger
	// HTTPOptions are added to every pinnedfetch client of the OAuth
	// traffic (e.g. WithTLSConfig for a private CA, WithDecisions for
	// audit).
	HTTPOptions []pinnedfetch.Option
	// RefreshSkew overrides DefaultRefreshSkew.
	RefreshSkew time.Duration
	// Now overrides the clock (tests).
	Now func() time.Time
	// OnState, when set, is told every change of state after New returns
	// (for audit and events). It is called with the Client's lock held:
	// it must not call the Client, and should not block.
	OnState func(Status)
	// WatchOwner, when set, is called for each person's client made (see
	// [Client.ForOwner]) with the storage key of that person's record: it
	// calls changed each time another replica writes or deletes the record
	// (a connection, a refresh, a revocation), until stop is called (the
	// client is dropped, or the Client closed). On shared storage (NATS)
	// it keeps a person's revocation on one replica from leaving their
	// token in use on another.
	WatchOwner func(key string, changed func()) (stop func())
	// SubjectToken, for credentials per_user with the token_exchange or
	// cross_app_access grant, returns the ID token the person owner's
	// sign-in to the gateway brought from the company IdP (renewed when
	// it can be), or an error that says what the person must do (sign in
	// again). The person's client calls it only when it needs a new
	// token: a warm call does not. Nil: no person has one.
	SubjectToken func(ctx context.Context, owner string) (string, error)
}

// Client is the OAuth client of one upstream. It is safe for concurrent
// use.
type Client struct {
	name   string
	mcpURL string
	cfg    Config
	store  storage.Storage
	key    string // storage key
	seal   *sealer
	logger *slog.Logger
	egress *egress
	skew   time.Duration
	now    func() time.Time

	signer crypto.Signer // private_key_jwt
	alg    string

	// hot is the token the Transport attaches, read without locks.
	hot atomic.Pointer[hotToken]

	// flight serializes the work that changes the token: refresh, fetch,
	// callback, logout. Goroutines that queue on it re-check the token
	// when they get it.
	flight chan struct{}

	onState func(Status)

	mu          sync.Mutex
	started     bool    // New returned: state changes go to onState
	rec         *record // the last record read or written; nil: none
	loaded      bool
	state       string
	errMsg      string
	lastChal    *challenge
	failed      error     // the last failure to obtain a token
	failedUntil time.Time // ... returned as it is until then
	stepUps     int       // step-ups in a row for stepKey
	stepKey     string    // the scopes of the last step-up, sorted
	stepGen     uint64    // the token generation it was counted for
	tokenGen    uint64    // incremented for each new access token
	hotAccess   string    // the access token of tokenGen
	stepAt      time.Time // when it came
	secretsSet  []string  // known secrets, for redaction
	// refusedAssertion is the hash of the last workload JWT (with its
	// scopes) the authorization server refused: it is not presented again.
	refusedAssertion [32]byte

	// A person's client (see [Client.ForOwner]) has its upstream's client
	// as parent, the person as owner, and their keyed hash as ownerHash.
	// The upstream's client has ownerMAC, the key of those hashes, and
	// the people's clients it made.
	parent    *Client
	owner     string
	ownerHash string
	ownerMAC  []byte
	ownersMu  sync.Mutex
	owners    map[string]*Client
	// watchOwner is Options.WatchOwner; unwatch stops a person's
	// client's watch.
	watchOwner func(key string, changed func()) (stop func())
	unwatch    func()
	// subjects is Options.SubjectToken (on the upstream's client).
	subjects func(ctx context.Context, owner string) (string, error)
}

// hotToken is what the Transport needs on its hot path.
type hotToken struct {
	gen       uint64 // tokenGen when it was adopted
	access    string
	header    string // "Bearer " + access, or "DPoP " + access
	refreshAt time.Time
	dpop      *dpopKey // the key a DPoP token is bound to; nil for Bearer
	ath       string   // the proofs' hash of access
}

// New returns the OAuth client of upstream name, whose MCP endpoint is
// mcpURL (the resource the tokens are for). It checks cfg and loads what
// is stored, bounded by ctx; a storage failure there is not fatal (the
// state says it, and the next use loads again).
func New(ctx context.Context, name, mcpURL string, cfg Config, opts Options) (*Client, error) {
	if name == "" {
		return nil, errors.New("upstreamauth: the upstream needs a name")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("upstream %q: %w", name, err)
	}
	if err := checkURL(mcpURL); err != nil {
		return nil, fmt.Errorf("upstream %q: url %s: %v", name, shown(mcpURL), err)
	}
	if opts.Storage == nil {
		return nil, fmt.Errorf("upstream %q: upstreamauth needs a storage for its tokens", name)
	}
	seal, err := newSealer(opts.Key, name)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", name, err)
	}
	c := &Client{
		name:    name,
		mcpURL:  mcpURL,
		cfg:     cfg,
		store:   opts.Storage,
		key:     StorageKey(name),
		seal:    seal,
		logger:  opts.Logger,
		egress:  newEgress(opts.HTTPOptions),
		skew:    opts.RefreshSkew,
		now:     opts.Now,
		flight:  make(chan struct{}, 1),
		onState: opts.OnState,

		watchOwner: opts.WatchOwner,
		subjects:   opts.SubjectToken,
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if c.skew <= 0 {
		c.skew = DefaultRefreshSkew
	}
	if c.now == nil {
		c.now = time.Now
	}
	if cfg.PrivateKey != "" || cfg.PrivateKeyFile != "" {
		if c.signer, c.alg, err = cfg.signingKey(); err != nil {
			return nil, fmt.Errorf("upstream %q: %w", name, err)
		}
	}
	if c.ownerMAC, err = ownerMACKey(opts.Key); err != nil {
		return nil, fmt.Errorf("upstream %q: %w", name, err)
	}
	c.addSecrets(cfg.ClientSecret, cfg.IDPClientSecret)
	if c.interactive() {
		c.state, c.errMsg = StateAuthRequired, "no token yet"
	} else {
		c.state = StateReady
	}
	if err := c.load(ctx); err != nil {
		c.logger.Warn("upstream oauth: cannot load the stored token", "upstream", name, "error", err.Error())
	}
	c.mu.Lock()
	c.started = true
	c.mu.Unlock()
	return c, nil
}

// acquire takes the flight lock, bounded by ctx.
func (c *Client) acquire(ctx context.Context) error {
	select {
	case c.flight <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &UnavailableError{Upstream: c.name, Err: fmt.Errorf("waiting for the token being renewed: %w", ctx.Err())}
	}
}

func (c *Client) release() { <-c.flight }

// Name returns the upstream's name.
func (c *Client) Name() string { return c.name }

// String describes the client without secrets.
func (c *Client) String() string {
	return fmt.Sprintf("upstreamauth.Client{upstream=%s state=%s}", c.name, c.State().State)
}

// interactive reports whether tokens come from an operator's login.
func (c *Client) interactive() bool { return c.cfg.grant() == GrantAuthorizationCode }

// logsIn reports whether a login (BeginLogin, Callback) may run: for the
// authorization code grant, and for a person's exchange grant whose
// fallback is the connect link.
func (c *Client) logsIn() bool {
	return c.interactive() || (c.cfg.Fallback == FallbackConnect && c.cfg.PerUser())
}

// exchanges reports whether a person's token comes from their sign-in
// (see [Config.Exchanges]).
func (c *Client) exchanges() bool { return c.cfg.Exchanges() }

// LogsIn reports whether the upstream's tokens come from an operator's
// login (the authorization code grant), rather than from the gateway's
// own credentials.
func (c *Client) LogsIn() bool { return c.interactive() }

// Close releases idle connections, and stops the watches of the people's
// clients.
func (c *Client) Close() {
	c.ownersMu.Lock()
	for k, oc := range c.owners {
		if oc.unwatch != nil {
			oc.unwatch()
		}
		delete(c.owners, k)
	}
	c.ownersMu.Unlock()
	c.egress.closeIdle()
}

// State reports the upstream's authorization state.
func (c *Client) State() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statusLocked()
}

func (c *Client) statusLocked() Status {
	s := Status{State: c.state, Err: c.errMsg}
	if c.rec != nil && c.rec.AccessToken != "" {
		s.Scopes = slices.Clone(c.rec.Scopes)
		s.Expiry = c.rec.Expiry
	}
	if s.State == StateReady {
		s.Err = ""
	}
	return s
}

// load reads the stored record, if not done yet. The caller may hold
// flight, never mu.
func (c *Client) load(ctx context.Context) error {
	c.mu.Lock()
	done := c.loaded
	c.mu.Unlock()
	if done {
		return nil
	}
	b, err := c.store.Load(ctx, c.key)
	if storage.IsNotExist(err) {
		b, err = nil, nil
	}
	return c.adoptStored(b, err)
}

// adoptStored adopts the sealed record b read from storage (nil: none), or
// records the failure err to read it; the next use reads again then.
func (c *Client) adoptStored(b []byte, err error) error {
	if err != nil {
		c.mu.Lock()
		c.loaded = false
		c.mu.Unlock()
		c.setState(StateError, "cannot read the stored token: "+err.Error())
		return err
	}
	var rec *record
	if b != nil {
		if rec, err = c.seal.open(b); err != nil {
			c.setState(StateError, err.Error())
			return err
		}
	}
	c.mu.Lock()
	c.loaded = true
	c.mu.Unlock()
	c.adopt(rec)
	return nil
}

// Reload reads the stored record again and adopts it, dropping any
// failure it was answering from: another replica logged in, logged out or
// renewed the token. It reads under the storage lock, as a renewal does:
// on NATS storage that read comes from the stream's leader, which holds
// the write that woke the watch, where a plain read may be answered by a
// follower that has not applied it yet, and leave this replica on the
// state before it with no further event to correct it.
func (c *Client) Reload(ctx context.Context) error {
	c.mu.Lock()
	c.failed = nil
	c.mu.Unlock()
	var stored []byte
	err := storage.Update(ctx, c.store, c.key, func(old []byte) ([]byte, error) {
		stored = old
		return nil, errNoChange
	})
	if errors.Is(err, errNoChange) {
		err = nil
	}
	return c.adoptStored(stored, err)
}

// adopt makes rec the current record (nil: none) and derives the state.
func (c *Client) adopt(rec *record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rec = rec
	if rec != nil {
		c.addSecretsLocked(rec.AccessToken, rec.RefreshToken)
		if rec.Client != nil {
			c.addSecretsLocked(rec.Client.ClientSecret)
		}
	}
	if rec == nil || rec.AccessToken == "" {
		c.hot.Store(nil)
		if c.interactive() {
			reason := "no token yet"
			if rec != nil && rec.Reason != "" {
				reason = rec.Reason
			}
			c.setStateLocked(StateAuthRequired, reason)
		} else if c.state != StateError {
			c.setStateLocked(StateReady, "")
		}
		return
	}
	h, err := c.hotOf(rec)
	if err != nil {
		c.hot.Store(nil)
		if c.interactive() {
			c.setStateLocked(StateAuthRequired, err.Error())
		} else {
			c.setStateLocked(StateError, err.Error())
		}
		return
	}
	if c.hotAccess != rec.AccessToken {
		c.hotAccess = rec.AccessToken
		c.tokenGen++
	}
	h.gen = c.tokenGen
	c.hot.Store(h)
	if c.interactive() && len(rec.NeedScopes) > 0 && !covers(rec.Scopes, rec.NeedScopes) {
		c.setStateLocked(StateAuthRequired, "the upstream asks for scopes the token lacks: "+strings.Join(rec.NeedScopes, " "))
		c.hot.Store(nil)
		return
	}
	c.setStateLocked(StateReady, "")
}

// hotOf is what the Transport attaches for rec's access token, or why the
// token cannot be used: a DPoP token whose key does not parse, or a
// Bearer token where dpop required wants a bound one (stored before the
// setting changed).
func (c *Client) hotOf(rec *record) (*hotToken, error) {
	h := &hotToken{access: rec.AccessToken, header: "Bearer " + rec.AccessToken, refreshAt: c.refreshAt(rec)}
	if rec.TokenType != "DPoP" {
		if c.cfg.dpopMode() == DPoPRequired {
			return nil, errors.New("the stored token is not DPoP-bound and dpop is required; a new token is needed")
		}
		return h, nil
	}
	if prev := c.hot.Load(); prev != nil && prev.dpop != nil && bytes.Equal(prev.dpop.der, rec.DPoPKey) {
		h.dpop = prev.dpop
	} else {
		k, err := parseDPoPKey(rec.DPoPKey)
		if err != nil {
			return nil, fmt.Errorf("%v; a new token is needed", err)
		}
		h.dpop = k
	}
	h.header, h.ath = "DPoP "+rec.AccessToken, accessTokenHash(rec.AccessToken)
	return h, nil
}

// usable reports whether rec holds an access token the Transport can
// attach.
func (c *Client) usable(rec *record) bool {
	if rec == nil || rec.AccessToken == "" {
		return false
	}
	_, err := c.hotOf(rec)
	return err == nil
}

// refreshAt is when rec's access token is refreshed: skew before its
// expiry, or half its lifetime before when it lives less than 2·skew.
func (c *Client) refreshAt(rec *record) time.Time {
	if rec.Expiry.IsZero() {
		return time.Time{}
	}
	skew := c.skew
	if !rec.IssuedAt.IsZero() {
		if life := rec.Expiry.Sub(rec.IssuedAt); life < 2*skew {
			skew = life / 2
		}
	}
	return rec.Expiry.Add(-skew)
}

func (c *Client) setState(state, msg string) {
	c.mu.Lock()
	c.setStateLocked(state, c.redactLocked(msg))
	c.mu.Unlock()
}

// setStateLocked sets the state and, when it changes after New returned,
// tells Options.OnState. c.mu is held.
func (c *Client) setStateLocked(state, msg string) {
	changed := state != c.state
	c.state, c.errMsg = state, msg
	if changed && c.started && c.onState != nil {
		c.onState(c.statusLocked())
	}
}

func (c *Client) addSecrets(s ...string) {
	c.mu.Lock()
	c.addSecretsLocked(s...)
	c.mu.Unlock()
}

func (c *Client) addSecretsLocked(s ...string) {
	for _, v := range s {
		// Short values would redact ordinary words.
		if len(v) >= 8 && !slices.Contains(c.secretsSet, v) {
			c.secretsSet = append(c.secretsSet, v)
			if len(c.secretsSet) > 64 {
				c.secretsSet = c.secretsSet[1:]
			}
		}
	}
}

// redact removes every secret the client knows from a message that came
// from elsewhere (a server's error description, a transport error).
func (c *Client) redact(s string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.redactLocked(s)
}

func (c *Client) redactLocked(s string) string {
	for _, v := range c.secretsSet {
		if strings.Contains(s, v) {
			s = strings.ReplaceAll(s, v, "<redacted>")
		}
	}
	return s
}

func (c *Client) current() *record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec.clone()
}

// update changes the stored record under the storage lock: fn receives
// the record as stored now (nil: none) and returns the one to store, or
// errNoChange to store nothing. What is stored becomes current.
func (c *Client) update(ctx context.Context, fn func(rec *record) (*record, error)) (*record, error) {
	var out *record
	err := storage.Update(ctx, c.store, c.key, func(old []byte) ([]byte, error) {
		var rec *record
		if old != nil {
			r, err := c.seal.open(old)
			if err != nil {
				// Unreadable (a changed key): a login replaces it; a
				// refresh cannot use it.
				r = nil
			}
			rec = r
		}
		next, err := fn(rec.clone())
		if err != nil {
			out = rec
			return nil, err
		}
		if next != nil && c.owner != "" {
			next.Owner = c.owner
		}
		out = next
		return c.seal.seal(next)
	})
	if errors.Is(err, errNoChange) {
		c.mu.Lock()
		c.loaded = true
		c.mu.Unlock()
		c.adopt(out)
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.loaded = true
	c.mu.Unlock()
	c.adopt(out)
	return out, nil
}

var errNoChange = errors.New("no change")

// grantAuth returns the client authentication for the token endpoint of
// meta, given the registration in use.
func (c *Client) grantAuth(reg *registration, issuer, tokenEndpoint string, supported []string) *clientAuth {
	a := &clientAuth{key: c.signer, alg: c.alg, kid: c.cfg.KeyID, audience: issuer}
	if a.audience == "" {
		a.audience = tokenEndpoint
	}
	if reg != nil && reg.Kind != "" {
		a.clientID, a.secret, a.method = reg.ClientID, reg.ClientSecret, reg.AuthMethod
		if a.method == "" {
			a.method = AuthNone
			if a.secret != "" {
				a.method = AuthClientSecretBasic
			}
		}
		return a
	}
	a.clientID, a.secret = c.cfg.ClientID, c.cfg.ClientSecret
	a.method = c.cfg.TokenEndpointAuthMethod
	if a.method == "" {
		a.method = chooseAuthMethod(c.cfg.ClientSecret != "", c.signer != nil, supported)
	}
	return a
}

// chooseAuthMethod picks the client authentication from what is
// configured and what the server lists: a key means private_key_jwt; a
// secret, the first of client_secret_basic and client_secret_post the
// server lists (basic, the RFC 8414 default, when it lists neither);
// otherwise none.
func chooseAuthMethod(secret, key bool, supported []string) string {
	switch {
	case key:
		return AuthPrivateKeyJWT
	case secret:
		if slices.Contains(supported, AuthClientSecretBasic) || !slices.Contains(supported, AuthClientSecretPost) {
			return AuthClientSecretBasic
		}
		return AuthClientSecretPost
	}
	return AuthNone
}

// requestToken posts a grant to a token endpoint, with key a DPoP proof,
// and checks the token type against the binding asked for.
func (c *Client) requestToken(ctx context.Context, endpoint string, form url.Values, auth *clientAuth, key *dpopKey) (*tokenResponse, error) {
	tr, err := c.egress.requestToken(ctx, endpoint, form, auth, key, c.now(), c.redact)
	if err != nil {
		return nil, err
	}
	if err := c.checkTokenType(tr, key, endpoint); err != nil {
		return nil, err
	}
	return tr, nil
}

// storeToken writes tr into rec (a fresh grant or a refresh), with key the
// DPoP key its proof was made with (nil: none).
func (c *Client) storeToken(rec *record, tr *tokenResponse, requested []string, key *dpopKey) {
	now := c.now()
	rec.AccessToken = tr.AccessToken
	rec.TokenType = "Bearer"
	clear(rec.DPoPKey)
	rec.DPoPKey = nil
	if key != nil && strings.EqualFold(tr.TokenType, "DPoP") {
		rec.TokenType, rec.DPoPKey = "DPoP", slices.Clone(key.der)
	}
	if tr.RefreshToken != "" {
		rec.RefreshToken = tr.RefreshToken
	}
	rec.IssuedAt = now
	rec.Expiry = time.Time{}
	if d := tr.expiresIn(); d > 0 {
		rec.Expiry = now.Add(d)
	}
	if tr.Scope != "" {
		rec.Scopes = validScopes(strings.Fields(tr.Scope))
	} else if requested != nil {
		rec.Scopes = slices.Clone(requested)
	}
	rec.Reason = ""
	if covers(rec.Scopes, rec.NeedScopes) {
		rec.NeedScopes = nil
	}
	c.addSecrets(tr.AccessToken, tr.RefreshToken)
}

// token returns the access token to attach, refreshing or fetching one
// when it is missing or about to expire. rejected, when set, is a token
// the upstream refused (401): a new one is needed even if it has not
// expired.
func (c *Client) token(ctx context.Context, rejected string) (*hotToken, error) {
	if h := c.hot.Load(); h != nil && h.access != rejected && (h.refreshAt.IsZero() || c.now().Before(h.refreshAt)) {
		return h, nil
	}
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()
	if err := c.load(ctx); err != nil {
		return nil, &UnavailableError{Upstream: c.name, Err: errors.New(c.redact(err.Error()))}
	}
	// Another goroutine may have done the work while this one queued.
	if h := c.hot.Load(); h != nil && h.access != rejected && (h.refreshAt.IsZero() || c.now().Before(h.refreshAt)) {
		return h, nil
	}
	c.mu.Lock()
	failed, until := c.failed, c.failedUntil
	c.mu.Unlock()
	if failed != nil && c.now().Before(until) {
		// The last attempt failed moments ago: do not hammer the
		// authorization server with every request.
		return nil, failed
	}
	err := c.renew(ctx, rejected)
	if err == nil {
		if h := c.hot.Load(); h != nil {
			c.mu.Lock()
			c.failed = nil
			c.mu.Unlock()
			return h, nil
		}
		err = c.authRequired()
	}
	var (
		ue  *UnavailableError
		are *AuthRequiredError
		cre *ConnectRequiredError
		sre *SignInRequiredError
	)
	if (errors.As(err, &ue) || errors.As(err, &are) || errors.As(err, &cre) || errors.As(err, &sre)) && ctx.Err() == nil {
		// Answer the next requests from this for a moment: no storage
		// read and no token request per request while the upstream is
		// unusable. A login here clears it at once; one on another
		// replica is seen when it expires.
		c.mu.Lock()
		c.failed, c.failedUntil = err, c.now().Add(failureBackoff)
		c.mu.Unlock()
	}
	return nil, err
}

// authRequired is the error of a request refused for want of a login:
// the operator's, or for a person's client, the person's.
func (c *Client) authRequired() error {
	st := c.State()
	if st.State == StateError {
		return &UnavailableError{Upstream: c.name, Err: errors.New(st.Err)}
	}
	var need []string
	if rec := c.current(); rec != nil {
		need = rec.NeedScopes
	}
	if c.owner != "" {
		return &ConnectRequiredError{Upstream: c.name, Reason: st.Err, Scopes: need}
	}
	return &AuthRequiredError{Upstream: c.name, Reason: st.Err, Scopes: need}
}

// renew obtains a new access token under the storage lock: it re-reads the
// record, adopts a token another replica (or goroutine) already obtained,
// and otherwise refreshes (authorization_code) or fetches one (the other
// grants). c.flight is held.
func (c *Client) renew(ctx context.Context, rejected string) error {
	var failure error
	_, err := c.update(ctx, func(rec *record) (*record, error) {
		now := c.now()
		if c.usable(rec) && rec.AccessToken != rejected {
			if at := c.refreshAt(rec); at.IsZero() || now.Before(at) {
				return rec, errNoChange // someone else renewed it
			}
		}
		// A person who connected through the fallback link holds a
		// refresh token of that login: it is refreshed as such.
		if !c.interactive() && !(c.owner != "" && rec != nil && rec.RefreshToken != "") {
			if rec == nil {
				rec = &record{}
			}
			if err := c.fetch(ctx, rec, nil); err != nil {
				failure = err
				return nil, errNoChange
			}
			return rec, nil
		}
		if rec != nil && rec.RefreshToken != "" && rec.TokenType != "DPoP" && c.cfg.dpopMode() == DPoPRequired {
			// A refresh token issued with a Bearer token is bound to no
			// key: redeemed, it gives one more token usable without the
			// key, which dpop required rules out. A login binds the next.
			rec.clearTokens("the stored token is not DPoP-bound and dpop is required; log in again for a token bound to the gateway's key")
			return rec, nil
		}
		if rec == nil || rec.RefreshToken == "" {
			if rec != nil && rec.AccessToken != "" {
				reason := "the access token expired and the authorization server gave no refresh token"
				if rec.AccessToken == rejected {
					reason = "the upstream refused the access token (HTTP 401) and there is no refresh token"
				}
				rec.clearTokens(reason)
				return rec, nil
			}
			return rec, errNoChange
		}
		if err := c.refresh(ctx, rec); err != nil {
			if isInvalidGrant(err) {
				c.logger.Warn("upstream oauth: refresh token refused; login required", "upstream", c.name, "error", err.Error())
				rec.clearTokens("the authorization server refused the refresh token: " + err.Error())
				return rec, nil
			}
			failure = err
			return nil, errNoChange
		}
		return rec, nil
	})
	if err == nil {
		err = failure
	}
	if err != nil {
		if c.owner != "" && c.exchanges() {
			return c.exchangeFailed(err)
		}
		return c.unavailable(err, !c.interactive())
	}
	if c.hot.Load() == nil {
		return c.authRequired()
	}
	if !c.interactive() {
		c.setState(StateReady, "")
	}
	return nil
}

// refresh redeems rec's refresh token (RFC 6749 §6) with the resource
// indicator, and writes the new tokens into rec.
func (c *Client) refresh(ctx context.Context, rec *record) error {
	if rec.TokenEndpoint == "" {
		return errors.New("the stored record has no token endpoint; run the login again")
	}
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rec.RefreshToken}}
	if rec.Resource != "" {
		form.Set("resource", rec.Resource)
	}
	auth := c.grantAuth(rec.Client, rec.Issuer, rec.TokenEndpoint, rec.AuthMethods)
	// A refresh token issued with a DPoP token is bound to its key (RFC
	// 9449 §5): it is redeemed with a proof of that key, whatever the
	// setting says now.
	var key *dpopKey
	if rec.TokenType == "DPoP" {
		k, err := parseDPoPKey(rec.DPoPKey)
		if err != nil {
			return fmt.Errorf("refresh: %v", err)
		}
		key = k
	}
	tr, err := c.requestToken(ctx, rec.TokenEndpoint, form, auth, key)
	if err != nil {
		return fmt.Errorf("refresh: %w", err)
	}
	c.storeToken(rec, tr, rec.Scopes, key)
	c.logger.Info("upstream oauth: token refreshed", "upstream", c.name, "expiry", rec.Expiry)
	return nil
}

// jwtBearer is the grant type of RFC 7523 §2.1.
const jwtBearer = "urn:ietf:params:oauth:grant-type:jwt-bearer"

// fetch obtains a token with a machine grant (client_credentials,
// cross_app_access or jwt_bearer) into rec, discovering the endpoints first when rec
// has none. extra are scopes the upstream asked for (step-up).
func (c *Client) fetch(ctx context.Context, rec *record, extra []string) error {
	if rec.TokenEndpoint == "" || (c.cfg.TokenURL != "" && rec.TokenEndpoint != c.cfg.TokenURL) {
		if err := c.discoverMachine(ctx, rec); err != nil {
			return err
		}
	}
	scopes := slices.Clone(c.cfg.Scopes)
	if scopes == nil {
		scopes = rec.Scopes
	}
	scopes = union(union(scopes, rec.NeedScopes), extra)
	auth := c.grantAuth(nil, rec.Issuer, rec.TokenEndpoint, rec.AuthMethods)
	form := url.Values{}
	if len(scopes) > 0 {
		form.Set("scope", strings.Join(scopes, " "))
	}
	if rec.Resource != "" {
		form.Set("resource", rec.Resource)
	}
	use, err := c.wantDPoP(rec.DPoPAlgs, rec.DPoPRequired, c.cfg.TokenURL == "")
	if err != nil {
		return err
	}
	var key *dpopKey
	if use {
		if key, err = newDPoPKey(); err != nil {
			return err
		}
	}
	switch c.cfg.grant() {
	case GrantClientCredentials:
		form.Set("grant_type", "client_credentials")
	case GrantCrossAppAccess:
		jag, err := c.idJAG(ctx, rec, scopes)
		if err != nil {
			return err
		}
		form.Set("grant_type", jwtBearer)
		form.Set("assertion", jag)
	case GrantTokenExchange:
		if err := c.exchangeForm(ctx, rec, form); err != nil {
			return err
		}
	}
	var assertion [32]byte
	if c.cfg.grant() == GrantJWTBearer {
		jwt, h, err := c.workloadAssertion(rec, scopes)
		if err != nil {
			return err
		}
		form.Set("grant_type", jwtBearer)
		form.Set("assertion", jwt)
		assertion = h
	}
	tr, err := c.requestToken(ctx, rec.TokenEndpoint, form, auth, key)
	var oe *oauthError
	if errors.As(err, &oe) && c.cfg.grant() == GrantJWTBearer {
		c.mu.Lock()
		c.refusedAssertion = assertion
		c.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("%s grant: %w", c.cfg.grant(), err)
	}
	if c.cfg.grant() == GrantTokenExchange && tr.IssuedTokenType != tokenTypeAccessToken {
		// RFC 8693 §2.2.1: the answer says what it issued; anything
		// but an access token (a refresh token, an ID token passed
		// back) is not attached to the person's calls.
		return fmt.Errorf("token_exchange grant: the authorization server issued a token of type %q, not an access token (%s); it is not used", clip(tr.IssuedTokenType, 100), tokenTypeAccessToken)
	}
	rec.RefreshToken = ""
	c.storeToken(rec, tr, scopes, key)
	// A machine grant gets no refresh token worth keeping: the grant is
	// simply repeated.
	rec.RefreshToken = ""
	c.logger.Info("upstream oauth: token obtained", "upstream", c.name, "grant", c.cfg.grant(), "expiry", rec.Expiry)
	return nil
}

// discoverMachine fills rec's endpoints for a machine grant: token_url when
// configured, else discovery as for a login.
func (c *Client) discoverMachine(ctx context.Context, rec *record) error {
	if c.cfg.TokenURL != "" {
		rec.TokenEndpoint, rec.Issuer, rec.Resource = c.cfg.TokenURL, c.cfg.AuthorizationServer, c.mcpURL
		return nil
	}
	c.mu.Lock()
	ch := c.lastChal
	c.mu.Unlock()
	if ch == nil {
		ch = c.probe(ctx)
	}
	srv, err := c.discover(ctx, ch)
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	rec.TokenEndpoint = srv.Meta.TokenEndpoint
	rec.Issuer = srv.Meta.Issuer
	rec.RevocationEndpoint = srv.Meta.RevocationEndpoint
	rec.AuthMethods = slices.Clone(srv.Meta.TokenEndpointAuthMethodsSupported)
	rec.DPoPAlgs, rec.DPoPRequired = slices.Clone(srv.Meta.DPoPSigningAlgValuesSupported), srv.DPoPRequired
	rec.Resource = srv.Resource
	if len(c.cfg.Scopes) == 0 && len(rec.Scopes) == 0 {
		switch {
		case ch != nil && len(ch.Scopes) > 0:
			rec.Scopes = slices.Clone(ch.Scopes)
		default:
			rec.Scopes = slices.Clone(srv.PRMScopes)
		}
	}
	return nil
}

// Logout revokes the tokens at the authorization server (RFC 7009) when it
// has a revocation endpoint, and deletes them from storage; the client
// registration is kept. A failed revocation is returned, after the tokens
// are deleted.
func (c *Client) Logout(ctx context.Context) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	var revokeErr error
	_, err := c.update(ctx, func(rec *record) (*record, error) {
		if rec == nil {
			return nil, errNoChange
		}
		revokeErr = c.revokeTokens(ctx, rec)
		rec.clearTokens("logged out")
		rec.NeedScopes = nil
		return rec, nil
	})
	if err != nil {
		return fmt.Errorf("upstream %q: logout: %s", c.name, c.redact(err.Error()))
	}
	c.mu.Lock()
	c.stepUps, c.stepKey, c.failed = 0, "", nil
	c.mu.Unlock()
	if !c.interactive() {
		c.setState(StateReady, "")
	}
	c.logger.Info("upstream oauth: logged out", "upstream", c.name)
	if revokeErr != nil {
		return fmt.Errorf("upstream %q: the stored tokens are deleted, but %s", c.name, c.redact(revokeErr.Error()))
	}
	return nil
}

// unavailable reports a failure to obtain a token that a login does not
// fix: logged and returned redacted, and, with setError, the error state.
func (c *Client) unavailable(err error, setError bool) error {
	msg := c.redact(err.Error())
	c.logger.Warn("upstream oauth: cannot obtain a token", "upstream", c.name, "error", msg)
	if setError {
		c.setState(StateError, msg)
	}
	return &UnavailableError{Upstream: c.name, Err: errors.New(msg)}
}
