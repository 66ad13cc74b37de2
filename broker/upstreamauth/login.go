package upstreamauth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"github.com/Tahul/caddy-zidane-mcp/internal/configfile"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Bounds of the pending logins.
const (
	// MaxPendingLogins is how many logins may await their callback at
	// once; a new one evicts the oldest.
	MaxPendingLogins = 8
	// LoginTimeout is how long a login awaits its callback.
	LoginTimeout = 10 * time.Minute
)

// PendingPrefix is where the logins awaiting their callback are kept, in
// storage, so that the callback may land on any replica that shares it:
// PendingPrefix + upstream + "/" + a hash of the login's state. Each is
// sealed like the upstream's record, bound to that key, and taken (read
// and deleted under the storage lock) by the one callback that uses it.
const PendingPrefix = "zidane/upstream-oauth-pending/"

// pendingLogin is a login between BeginLogin and Callback.
type pendingLogin struct {
	Created  time.Time     `json:"created"`
	Verifier string        `json:"verifier"`
	Scopes   []string      `json:"scopes,omitempty"`
	Srv      *server       `json:"server"`
	Reg      *registration `json:"registration"` // the client used (CIMD, DCR, or the configured one: Kind "")
	// DPoPKey is the PKCS #8 key the code was requested for (dpop_jkt),
	// when the tokens are to be DPoP-bound; sealed like the rest.
	DPoPKey []byte `json:"dpop_key,omitempty"`
}

// pendingDir is the storage directory of this upstream's pending logins.
func (c *Client) pendingDir() string {
	if c.owner != "" {
		return OwnerPendingPrefix + c.name + "/" + c.ownerHash
	}
	return PendingPrefix + c.name
}

// pendingKey is the storage key of the login whose state is state. The
// state is hashed: it is the login's CSRF secret, and storage keys show in
// listings.
func (c *Client) pendingKey(state string) string {
	h := sha256.Sum256([]byte(state))
	return c.pendingDir() + "/" + hex.EncodeToString(h[:16])
}

// savePending stores p under state, first deleting the expired pending
// logins and, past MaxPendingLogins, the oldest.
func (c *Client) savePending(ctx context.Context, state string, p *pendingLogin) error {
	dir := c.pendingDir()
	if err := c.store.Lock(ctx, dir); err != nil {
		return err
	}
	defer c.store.Unlock(context.WithoutCancel(ctx), dir)
	keys, err := c.store.List(ctx, dir, false)
	if err != nil && !storage.IsNotExist(err) {
		return err
	}
	type entry struct {
		key     string
		created time.Time
	}
	var live []entry
	now := c.now()
	for _, k := range keys {
		var old pendingLogin
		b, err := c.store.Load(ctx, k)
		if err != nil || c.seal.openValue(b, "pending\x00"+k, &old) != nil || now.Sub(old.Created) > LoginTimeout {
			_ = c.store.Delete(ctx, k) // expired, or not ours to read
			continue
		}
		live = append(live, entry{k, old.Created})
	}
	slices.SortFunc(live, func(a, b entry) int { return a.created.Compare(b.created) })
	for len(live) >= MaxPendingLogins {
		_ = c.store.Delete(ctx, live[0].key)
		live = live[1:]
	}
	key := c.pendingKey(state)
	b, err := c.seal.sealValue(p, "pending\x00"+key)
	if err != nil {
		return err
	}
	return c.store.Store(ctx, key, b)
}

// takePending returns and deletes the pending login of state: nil when
// there is none (unknown, already used, or evicted). Two callbacks with
// one state, on two replicas, take it once between them.
func (c *Client) takePending(ctx context.Context, state string) (*pendingLogin, error) {
	key := c.pendingKey(state)
	if err := c.store.Lock(ctx, key); err != nil {
		return nil, err
	}
	defer c.store.Unlock(context.WithoutCancel(ctx), key)
	b, err := c.store.Load(ctx, key)
	if storage.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := c.store.Delete(ctx, key); err != nil {
		return nil, err
	}
	var p pendingLogin
	if err := c.seal.openValue(b, "pending\x00"+key, &p); err != nil || p.Srv == nil || p.Reg == nil {
		return nil, nil
	}
	return &p, nil
}

// BeginLogin starts an authorization-code login and returns the URL the
// operator opens in a browser. It discovers the authorization server,
// registers the gateway when needed (Client ID Metadata Document,
// pre-registration, else dynamic registration, whose result is stored),
// chooses the scopes (the upstream's challenge, else its scopes_supported,
// else none; plus any step-up scopes and the granted ones, and
// offline_access when the server lists it), makes a DPoP key when the
// tokens are to be bound to one (the code is requested for it: dpop_jkt,
// RFC 9449 §10), and remembers the PKCE verifier and the key under a
// random state for [Client.Callback].
func (c *Client) BeginLogin(ctx context.Context) (string, error) {
	if !c.logsIn() {
		return "", fmt.Errorf("upstream %q uses the %s grant, which needs no login", c.name, c.cfg.grant())
	}
	wrap := func(err error) error {
		return fmt.Errorf("upstream %q: login: %s", c.name, c.redact(err.Error()))
	}
	if err := c.load(ctx); err != nil && !errors.Is(err, errUnseal) {
		// An unreadable record (a changed key) is what a new login
		// replaces; a storage failure is not.
		return "", wrap(err)
	}
	ch := c.probe(ctx)
	if ch == nil {
		c.mu.Lock()
		ch = c.lastChal
		c.mu.Unlock()
	}
	srv, err := c.discover(ctx, ch)
	if err != nil {
		return "", wrap(err)
	}
	if srv.Meta.AuthorizationEndpoint == "" {
		return "", wrap(errors.New("the authorization server metadata has no authorization_endpoint"))
	}
	if !srv.NoMeta && !slices.Contains(srv.Meta.CodeChallengeMethodsSupported, "S256") {
		return "", wrap(fmt.Errorf("the authorization server %s does not list PKCE S256 in code_challenge_methods_supported; the MCP spec forbids logging in without it", shown(srv.Meta.Issuer)))
	}
	useDPoP, err := c.wantDPoP(srv.Meta.DPoPSigningAlgValuesSupported, srv.DPoPRequired, !srv.NoMeta)
	if err != nil {
		return "", wrap(fmt.Errorf("authorization server %s: %w", shown(srv.Meta.Issuer), err))
	}
	reg, err := c.register(ctx, srv)
	if err != nil {
		return "", wrap(err)
	}

	rec := c.current()
	if reg.Kind == "" && c.cfg.AuthorizationServer == "" && rec != nil && rec.Issuer != "" && !issuersEqual(rec.Issuer, srv.Meta.Issuer) {
		// The configured client was issued by the server of the last
		// login, not by whichever one the upstream's metadata names now:
		// the secret sent there could be presented where it is valid, as
		// the workload JWT of jwt_bearer could (SEP-2352).
		return "", wrap(fmt.Errorf("the upstream now names the authorization server %s, not %s, where the gateway logged in with client_id %q; a pre-registered client's credentials go only to the server that issued them: if the upstream moved on purpose, set authorization_server %s in its oauth block, with the client_id and client_secret that server issued",
			shown(srv.Meta.Issuer), shown(rec.Issuer), c.cfg.ClientID, shown(srv.Meta.Issuer)))
	}
	var scopes []string
	switch {
	case len(c.cfg.Scopes) > 0:
		scopes = slices.Clone(c.cfg.Scopes)
	case ch != nil && len(ch.Scopes) > 0:
		scopes = ch.Scopes
	default:
		scopes = srv.PRMScopes
	}
	if rec != nil {
		scopes = union(union(scopes, rec.Scopes), rec.NeedScopes)
	}
	scopes = slices.DeleteFunc(slices.Clone(scopes), func(s string) bool { return s == "offline_access" })
	if slices.Contains(srv.Meta.ScopesSupported, "offline_access") {
		// SEP-2207: ask for a refresh token where the server offers it.
		scopes = append(scopes, "offline_access")
	}

	verifier := oauth2.GenerateVerifier()
	state := rand.Text()
	cfg := oauth2.Config{
		ClientID:    reg.ClientID,
		Endpoint:    oauth2.Endpoint{AuthURL: srv.Meta.AuthorizationEndpoint},
		RedirectURL: c.cfg.RedirectURL,
		Scopes:      scopes,
	}
	params := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("resource", srv.Resource)}
	pending := &pendingLogin{Created: c.now(), Verifier: verifier, Scopes: scopes, Srv: srv, Reg: reg}
	if useDPoP {
		key, err := newDPoPKey()
		if err != nil {
			return "", wrap(err)
		}
		pending.DPoPKey = key.der
		params = append(params, oauth2.SetAuthURLParam("dpop_jkt", key.jkt))
	}
	authURL := cfg.AuthCodeURL(state, params...)

	if err := c.savePending(ctx, state, pending); err != nil {
		return "", wrap(fmt.Errorf("keeping the login until its callback: %w", err))
	}
	c.logger.Info("upstream oauth: login started", "upstream", c.name, "issuer", srv.Meta.Issuer, "scopes", strings.Join(scopes, " "), "client", reg.Kind, "dpop", useDPoP)
	return authURL, nil
}

// defaultClientName is the client name the gateway registers with when
// the config gives none.
const defaultClientName = "caddy-zidane-mcp"

// ClientMetadataDocument returns the gateway's Client ID Metadata Document
// for this upstream, the JSON to serve at the configured
// client_metadata_url (which is its client_id), and false when none is
// configured. It names the login callback and the grants the gateway uses,
// and no secret: a CIMD client authenticates with none.
func (c *Client) ClientMetadataDocument() ([]byte, bool) {
	if c.cfg.ClientMetadataURL == "" || !c.logsIn() {
		return nil, false
	}
	name := c.cfg.ClientName
	if name == "" {
		name = defaultClientName
	}
	doc, err := json.Marshal(map[string]any{
		"client_id":                  c.cfg.ClientMetadataURL,
		"client_name":                name,
		"redirect_uris":              []string{c.cfg.RedirectURL},
		"grant_types":                []string{"authorization_code", "refresh_token"},
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": AuthNone,
		"application_type":           c.applicationType(),
	})
	if err != nil {
		return nil, false
	}
	return doc, true
}

// applicationType is what kind of client the gateway registers as
// (SEP-837, OpenID Connect Dynamic Registration §2): "native" when its
// callback is on loopback, where a web client's redirect URIs may not be,
// and "web" for an https callback.
func (c *Client) applicationType() string {
	if u, err := url.Parse(c.cfg.RedirectURL); err == nil && u.Scheme == "http" && pinnedfetch.IsLoopbackHost(u.Hostname()) {
		return "native"
	}
	return "web"
}

// register returns the client to log in with, in the order of the MCP
// spec: the gateway's Client ID Metadata Document when the server supports
// it, the pre-registered client, then dynamic registration (RFC 7591),
// reusing a registration stored earlier for the same server and callback.
func (c *Client) register(ctx context.Context, srv *server) (*registration, error) {
	if c.parent != nil {
		// Every person logs in through the one client the gateway
		// registered for the upstream, kept in its shared record.
		return c.parent.register(ctx, srv)
	}
	issuer := srv.Meta.Issuer
	if c.cfg.ClientMetadataURL != "" && srv.Meta.ClientIDMetadataDocumentSupported {
		return &registration{Kind: "cimd", Issuer: issuer, ClientID: c.cfg.ClientMetadataURL, AuthMethod: AuthNone, RedirectURL: c.cfg.RedirectURL}, nil
	}
	if c.cfg.ClientID != "" {
		auth := c.grantAuth(nil, issuer, srv.Meta.TokenEndpoint, srv.Meta.TokenEndpointAuthMethodsSupported)
		return &registration{Issuer: issuer, ClientID: c.cfg.ClientID, AuthMethod: auth.method}, nil
	}
	if rec := c.current(); rec != nil && rec.Client != nil && rec.Client.Kind == "dcr" &&
		issuersEqual(rec.Client.Issuer, issuer) && rec.Client.RedirectURL == c.cfg.RedirectURL {
		return rec.Client, nil
	}
	if srv.Meta.RegistrationEndpoint == "" {
		return nil, fmt.Errorf("the authorization server %s supports neither Client ID Metadata Documents (or client_metadata_url is not set) nor dynamic client registration: register the gateway there and set client_id (and client_secret) in the oauth block", shown(issuer))
	}
	method := AuthNone
	for _, m := range []string{AuthClientSecretBasic, AuthClientSecretPost, AuthNone} {
		if slices.Contains(srv.Meta.TokenEndpointAuthMethodsSupported, m) {
			method = m
			break
		}
	}
	meta := &oauthex.ClientRegistrationMetadata{
		RedirectURIs:            []string{c.cfg.RedirectURL},
		TokenEndpointAuthMethod: method,
		GrantTypes:              []string{"authorization_code", "refresh_token"},
		ResponseTypes:           []string{"code"},
		ClientName:              c.cfg.ClientName,
		ApplicationType:         c.applicationType(),
	}
	if meta.ClientName == "" {
		meta.ClientName = defaultClientName
	}
	// oauthex.RegisterClient is not used: when a 2xx answer does not
	// decode, its error quotes the body, which holds the client secret.
	status, body, err := c.egress.postJSON(ctx, srv.Meta.RegistrationEndpoint, meta)
	if err != nil {
		return nil, fmt.Errorf("dynamic client registration: %v", err)
	}
	if status != http.StatusCreated && status != http.StatusOK {
		var e oauthex.ClientRegistrationError
		json.Unmarshal(body, &e)
		return nil, fmt.Errorf("dynamic client registration at %s answered HTTP %d %s %s", shown(srv.Meta.RegistrationEndpoint), status, clip(e.ErrorCode, 64), clip(c.redact(e.ErrorDescription), 200))
	}
	var resp oauthex.ClientRegistrationResponse
	if err := json.Unmarshal(body, &resp); err != nil || resp.ClientID == "" {
		return nil, fmt.Errorf("dynamic client registration at %s: the answer is not a registration with a client_id", shown(srv.Meta.RegistrationEndpoint))
	}
	reg := &registration{
		Kind:         "dcr",
		Issuer:       issuer,
		RedirectURL:  c.cfg.RedirectURL,
		ClientID:     resp.ClientID,
		ClientSecret: resp.ClientSecret,
		AuthMethod:   resp.TokenEndpointAuthMethod,
	}
	if reg.AuthMethod == "" {
		reg.AuthMethod = method
		if reg.ClientSecret != "" && method == AuthNone {
			reg.AuthMethod = AuthClientSecretBasic // RFC 7591 §2 default
		}
	}
	c.addSecrets(reg.ClientSecret)
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()
	if _, err := c.update(ctx, func(rec *record) (*record, error) {
		if rec == nil {
			rec = &record{}
		}
		rec.Client = reg
		return rec, nil
	}); err != nil {
		return nil, fmt.Errorf("storing the client registration: %v", err)
	}
	c.logger.Info("upstream oauth: registered a client", "upstream", c.name, "issuer", issuer, "client_id", reg.ClientID)
	return reg, nil
}

// checkCallback checks an authorization response: its state names a login
// under way (taken, so that it is used once) that has not expired, the
// server did not refuse, the issuer is the one the login went to (RFC
// 9207), and it carries a code; it returns the login, the code and the
// login's DPoP key.
func (c *Client) checkCallback(ctx context.Context, query url.Values) (p *pendingLogin, code string, key *dpopKey, err error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("upstream %q: %w: %s", c.name, ErrLogin, c.redact(fmt.Sprintf(format, args...)))
	}
	for _, k := range []string{"state", "code", "iss", "error"} {
		if len(query[k]) > 1 {
			// Which one counts is a guess two readers could make
			// differently; the login stays under way for the real answer.
			return nil, "", nil, refuse("the authorization response has %s more than once; it is not from the authorization server as sent", k)
		}
	}
	state := query.Get("state")
	if state != "" {
		if p, err = c.takePending(ctx, state); err != nil {
			return nil, "", nil, fmt.Errorf("upstream %q: login: reading the login under way: %s", c.name, c.redact(err.Error()))
		}
	}
	if p == nil {
		return nil, "", nil, refuse("the state does not belong to a login under way (unknown, already used, or evicted); run the login again")
	}
	if c.now().Sub(p.Created) > LoginTimeout {
		return nil, "", nil, refuse("the login expired after %v; run it again", LoginTimeout)
	}
	if e := query.Get("error"); e != "" {
		return nil, "", nil, refuse("the authorization server refused: %s %s", clip(e, 64), clip(query.Get("error_description"), 200))
	}
	// RFC 9207 / SEP-2468: an iss present must be the issuer's; one
	// advertised must be present.
	iss := query.Get("iss")
	switch {
	case iss != "" && iss != p.Srv.Meta.Issuer:
		return nil, "", nil, refuse("the authorization response comes from issuer %q, not %s (RFC 9207); a mix-up attack is possible, so the code is not redeemed", clip(iss, 200), p.Srv.Meta.Issuer)
	case iss == "" && p.Srv.Meta.AuthorizationResponseIssParameterSupported:
		return nil, "", nil, refuse("the authorization server advertises the iss parameter (RFC 9207) but the response has none; the code is not redeemed")
	}
	code = query.Get("code")
	if code == "" {
		return nil, "", nil, refuse("the authorization response has no code")
	}
	if p.DPoPKey != nil {
		k, err := parseDPoPKey(p.DPoPKey)
		if err != nil {
			return nil, "", nil, refuse("%v; run the login again", err)
		}
		key = k
	}
	return p, code, key, nil
}

// Callback completes a login with the query of the authorization
// response (the redirect to redirect_url): it checks the state (known,
// unexpired, used once) and the iss parameter (RFC 9207), redeems the code
// with the PKCE verifier and the resource indicator, and stores the
// tokens. Its refusals wrap [ErrLogin].
func (c *Client) Callback(ctx context.Context, query url.Values) error {
	if !c.logsIn() {
		return fmt.Errorf("upstream %q uses the %s grant, which needs no login", c.name, c.cfg.grant())
	}
	p, code, key, err := c.checkCallback(ctx, query)
	if err != nil {
		return err
	}

	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	var failure error
	_, err = c.update(ctx, func(rec *record) (*record, error) {
		if rec == nil {
			rec = &record{}
		}
		form := url.Values{
			"grant_type":    {"authorization_code"},
			"code":          {code},
			"redirect_uri":  {c.cfg.RedirectURL},
			"code_verifier": {p.Verifier},
		}
		if p.Srv.Resource != "" {
			form.Set("resource", p.Srv.Resource)
		}
		auth := c.grantAuth(p.Reg, p.Srv.Meta.Issuer, p.Srv.Meta.TokenEndpoint, p.Srv.Meta.TokenEndpointAuthMethodsSupported)
		tr, err := c.requestToken(ctx, p.Srv.Meta.TokenEndpoint, form, auth, key)
		if err != nil {
			failure = err
			return nil, errNoChange
		}
		rec.RefreshToken = ""
		c.storeToken(rec, tr, p.Scopes, key)
		rec.Resource = p.Srv.Resource
		rec.Issuer = p.Srv.Meta.Issuer
		rec.TokenEndpoint = p.Srv.Meta.TokenEndpoint
		rec.RevocationEndpoint = p.Srv.Meta.RevocationEndpoint
		rec.AuthMethods = slices.Clone(p.Srv.Meta.TokenEndpointAuthMethodsSupported)
		rec.DPoPAlgs, rec.DPoPRequired = slices.Clone(p.Srv.Meta.DPoPSigningAlgValuesSupported), p.Srv.DPoPRequired
		if p.Reg.Kind != "" {
			rec.Client = p.Reg
		} else if rec.Client != nil && rec.Client.Kind == "cimd" {
			rec.Client = nil
		}
		// The login asked for the step-up scopes: if the server granted
		// fewer, the upstream's next 403 says so, and counts as another
		// step-up.
		rec.NeedScopes = nil
		rec.Owner = c.owner
		return rec, nil
	})
	if err == nil {
		err = failure
	}
	if err != nil {
		return fmt.Errorf("upstream %q: login: redeeming the code: %s", c.name, c.redact(err.Error()))
	}
	c.mu.Lock()
	c.failed = nil
	c.mu.Unlock()
	st := c.State()
	c.logger.Info("upstream oauth: logged in", "upstream", c.name, "scopes", strings.Join(st.Scopes, " "), "expiry", st.Expiry)
	return nil
}

// idJAG obtains an Identity Assertion JWT Authorization Grant for the
// upstream's authorization server from the enterprise IdP (RFC 8693 token
// exchange of the gateway's ID token; SEP-990).
//
// For a person (credentials per_user) the ID token is theirs, from their
// sign-in, and the ID-JAG the IdP answers is checked before it is
// presented (see [Client.checkIDJAG]).
func (c *Client) idJAG(ctx context.Context, rec *record, scopes []string) (string, error) {
	var idToken string
	if c.owner != "" {
		if c.cfg.TokenURL == "" && (c.cfg.AuthorizationServer == "" || !issuersEqual(rec.Issuer, c.cfg.AuthorizationServer)) {
			return "", fmt.Errorf("the upstream's metadata leads to the authorization server %s, not the configured authorization_server %s; no ID-JAG is asked for it", shown(rec.Issuer), shown(c.cfg.AuthorizationServer))
		}
		t, err := c.subjectToken(ctx)
		if err != nil {
			return "", err
		}
		idToken = t
	} else {
		raw, err := configfile.Read(c.cfg.IDTokenFile)
		if err != nil {
			return "", fmt.Errorf("id_token_file: %v", err)
		}
		idToken = strings.TrimSpace(string(raw))
		if idToken == "" {
			return "", fmt.Errorf("id_token_file %s is empty", c.cfg.IDTokenFile)
		}
		c.addSecrets(idToken)
	}
	endpoint := c.cfg.IDPTokenURL
	if endpoint == "" {
		meta, err := c.authServerMeta(ctx, c.cfg.IDPIssuer)
		if err != nil {
			return "", fmt.Errorf("IdP discovery: %v", err)
		}
		if meta == nil {
			return "", fmt.Errorf("the IdP %s publishes no metadata; set idp_token_url", shown(c.cfg.IDPIssuer))
		}
		endpoint = meta.TokenEndpoint
	}
	audience := rec.Issuer
	if audience == "" {
		audience = rec.TokenEndpoint
	}
	form := url.Values{
		"grant_type":           {oauthex.GrantTypeTokenExchange},
		"requested_token_type": {oauthex.TokenTypeIDJAG},
		"audience":             {audience},
		"resource":             {rec.Resource},
		"subject_token":        {idToken},
		"subject_token_type":   {oauthex.TokenTypeIDToken},
	}
	if len(scopes) > 0 {
		form.Set("scope", strings.Join(scopes, " "))
	}
	auth := &clientAuth{clientID: c.cfg.IDPClientID, secret: c.cfg.IDPClientSecret, method: AuthNone}
	if c.cfg.IDPClientSecret != "" {
		auth.method = AuthClientSecretBasic
	}
	tr, err := c.egress.requestToken(ctx, endpoint, form, auth, nil, c.now(), c.redact)
	if err != nil {
		return "", fmt.Errorf("token exchange at the IdP: %w", err)
	}
	if tr.IssuedTokenType != oauthex.TokenTypeIDJAG {
		return "", fmt.Errorf("token exchange at the IdP: issued_token_type is %q, not an ID-JAG", clip(tr.IssuedTokenType, 100))
	}
	c.addSecrets(tr.AccessToken)
	if c.owner != "" {
		if err := c.checkIDJAG(tr.AccessToken, rec); err != nil {
			return "", err
		}
	}
	return tr.AccessToken, nil
}
