package oauthtest

import (
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Client authentication methods at the token and revocation endpoints, as
// RFC 8414 names them in token_endpoint_auth_methods_supported.
const (
	ClientSecretBasic = "client_secret_basic"
	ClientSecretPost  = "client_secret_post"
	PrivateKeyJWT     = "private_key_jwt"
	AuthNone          = "none"
)

// Values of [AuthServerOptions.Iss]: what the authorization response says
// in its iss parameter (RFC 9207).
const (
	IssOmitted = ""        // no iss parameter
	IssCorrect = "correct" // the server's issuer
	IssWrong   = "wrong"   // another issuer, as in a mix-up attack
	// IssNormalized is the issuer with a trailing slash: equal to it
	// after URL normalization, not under the simple string comparison
	// RFC 9207 §2.4 asks for.
	IssNormalized = "normalized"
)

// Grant types and token types of the token endpoint.
const (
	GrantAuthorizationCode = "authorization_code"
	GrantRefreshToken      = "refresh_token"
	GrantClientCredentials = "client_credentials"
	GrantTokenExchange     = "urn:ietf:params:oauth:grant-type:token-exchange"
	GrantJWTBearer         = "urn:ietf:params:oauth:grant-type:jwt-bearer"

	tokenTypeIDToken = "urn:ietf:params:oauth:token-type:id_token"
	tokenTypeIDJAG   = "urn:ietf:params:oauth:token-type:id-jag"
	assertionJWT     = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
)

// DefaultAccessTokenTTL is the lifetime of access tokens unless
// [AuthServerOptions.AccessTokenTTL] or [AuthServer.SetAccessTokenTTL] says
// otherwise.
const DefaultAccessTokenTTL = time.Hour

// AuthServerOptions configures [NewAuthServer]. The zero value is a server
// with registration and revocation, no iss parameter, and one-hour access
// tokens on the real clock.
type AuthServerOptions struct {
	// Now is the server's clock (token expiry, client assertions).
	// Default: time.Now.
	Now func() time.Time
	// AccessTokenTTL is the lifetime of the access tokens issued (its
	// expires_in). Default: DefaultAccessTokenTTL.
	AccessTokenTTL time.Duration
	// AuthMethods is token_endpoint_auth_methods_supported (omitted when
	// empty). The server accepts every method whatever it lists.
	AuthMethods []string
	// ScopesSupported is scopes_supported (omitted when empty).
	ScopesSupported []string
	// Iss is the iss parameter of authorization responses: IssOmitted,
	// IssCorrect or IssWrong.
	Iss string
	// IssAdvertised sets authorization_response_iss_parameter_supported.
	IssAdvertised bool
	// NoRegistration and NoRevocation leave out the registration and
	// revocation endpoints.
	NoRegistration bool
	NoRevocation   bool
	// EchoSecret puts the client secret presented in the error
	// description of a failed client authentication, as a careless server
	// might.
	EchoSecret bool
	// GrantScopes, when set, decides the scopes granted from those
	// requested (default: what was requested).
	GrantScopes func(requested []string) []string
	// DPoP advertises dpop_signing_alg_values_supported (ES256) and binds
	// the tokens of a token request that carries a valid DPoP proof (RFC
	// 9449) to the proof's key: token_type DPoP, a refresh token that only
	// a proof of the same key redeems, and an [MCPServer] that accepts the
	// access token only with the DPoP scheme and a fresh proof of that
	// key. A code requested with dpop_jkt is redeemed only with a proof of
	// that key. Without DPoP, proofs are ignored and tokens are Bearer.
	DPoP bool
	// DPoPNonce makes the token endpoint require a nonce of its own in
	// the proofs (RFC 9449 §8): a proof without it gets 400
	// use_dpop_nonce with the nonce in a DPoP-Nonce header.
	DPoPNonce bool
	// LoginPage makes an authorization request without login_hint get a
	// page that asks who signs in (a login_hint field, id "user", and a
	// button, id "approve") instead of the code at once, as a real
	// server's login would: a browser test then picks the upstream user.
	LoginPage bool
}

// TokenRequest is one request the token endpoint received.
type TokenRequest struct {
	GrantType  string // grant_type
	AuthMethod string // how the client authenticated ("" if it could not be told)
	Scope      string // scope
	Resource   string // resource (RFC 8707)
	Error      string // the OAuth error code answered; "" when tokens were issued
	// DPoP is the DPoP proof the request carried (zero: none), with Err
	// set when it was refused. Only a server with AuthServerOptions.DPoP
	// reads proofs.
	DPoP DPoPProof
	// Assertion is the assertion of a jwt-bearer grant.
	Assertion string
	// SubjectToken and RequestedTokenType are those of a token exchange
	// (RFC 8693).
	SubjectToken       string
	RequestedTokenType string
	// ActorToken is a token exchange's actor_token.
	ActorToken string
}

// Registration is one dynamic client registration request (RFC 7591).
type Registration struct {
	RedirectURIs    []string
	ApplicationType string // application_type (SEP-837); "" when left out
	AuthMethod      string // token_endpoint_auth_method
}

// RefreshToken is what the server knows of a refresh token it issued.
type RefreshToken struct {
	Token    string
	Redeemed int  // refresh_token grants that presented it (more than 1: a reuse)
	Revoked  bool // revoked, or its grant revoked for a reuse
}

type asClient struct {
	secret string
	pub    crypto.PublicKey
}

type asCode struct {
	client, challenge, redirect, resource string
	scopes                                []string
	jkt                                   string // dpop_jkt of the authorization request
	user                                  string // login_hint of the authorization request
}

type asAccess struct {
	scopes  []string
	expiry  time.Time
	revoked bool
	jkt     string // the DPoP key it is bound to; "" for a Bearer token
	user    string // the user who authorized it; "" for a machine grant
}

type asRefresh struct {
	token     string
	client    string
	scopes    []string
	resource  string
	redeemed  int
	revoked   bool
	issuedFor string // the access token issued with it
	grant     int    // the authorization it descends from, by rotation
	jkt       string // the DPoP key it is bound to
	user      string // the user who authorized its grant
}

// AuthServer is an OAuth 2.1 authorization server on 127.0.0.1. It is safe
// for concurrent use.
type AuthServer struct {
	// URL is the server's base URL, which is also its issuer identifier.
	URL string

	srv  *httptest.Server
	now  func() time.Time
	opts AuthServerOptions

	mu        sync.Mutex
	ttl       time.Duration
	clients   map[string]*asClient
	codes     map[string]*asCode
	access    map[string]*asAccess
	accessSeq []string // access tokens in the order issued
	refresh   []*asRefresh
	grants    int      // authorizations that issued a refresh token
	reuses    int      // refresh_token grants that presented a rotated token
	issued    []string // every secret handed out
	allCodes  []string // every authorization code handed out
	revoked   []string // tokens presented at the revocation endpoint
	requests  []TokenRequest
	authorize []url.Values
	regs      int
	pkceOK    int               // codes redeemed with a matching verifier
	idToken   string            // the ID token the IdP side accepts
	jags      map[string]string // ID-JAG -> resource
	nonce     string            // the DPoP nonce the token endpoint requires
	jtis      map[string]bool   // jti of every DPoP proof accepted
	workloads []crypto.PublicKey
	regReqs   []Registration
	idp       idpState
	// exchangedUsers are the users tokens were issued for by exchange.
	exchangedUsers []string
}

// NewAuthServer starts an authorization server on 127.0.0.1. Close it when
// done.
func NewAuthServer(opts AuthServerOptions) *AuthServer {
	as := &AuthServer{
		opts: opts, now: opts.Now, ttl: opts.AccessTokenTTL,
		clients: map[string]*asClient{}, codes: map[string]*asCode{},
		access: map[string]*asAccess{}, jags: map[string]string{}, jtis: map[string]bool{},
		idp: newIdPState(),
	}
	if opts.DPoPNonce {
		as.nonce = NewSecret("as-nonce")
	}
	if as.now == nil {
		as.now = time.Now
	}
	if as.ttl <= 0 {
		as.ttl = DefaultAccessTokenTTL
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", as.metadata)
	mux.HandleFunc("GET /authorize", as.handleAuthorize)
	mux.HandleFunc("POST /token", as.handleToken)
	mux.HandleFunc("GET /jwks", as.handleJWKS)
	if !opts.NoRegistration {
		mux.HandleFunc("POST /register", as.handleRegister)
	}
	if !opts.NoRevocation {
		mux.HandleFunc("POST /revoke", as.handleRevoke)
	}
	as.srv = httptest.NewServer(mux)
	as.URL = as.srv.URL
	return as
}

// Close shuts the server down.
func (as *AuthServer) Close() { as.srv.Close() }

// AddClient registers a client: a confidential one with a secret
// (client_secret_basic or client_secret_post) or a public key
// (private_key_jwt, RS256 or ES256), or a public one with neither.
func (as *AuthServer) AddClient(id, secret string, pub crypto.PublicKey) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.clients[id] = &asClient{secret: secret, pub: pub}
}

// SetIDToken sets the ID token that the token-exchange grant (the IdP side
// of cross-app access) accepts as subject_token.
func (as *AuthServer) SetIDToken(token string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.idToken = token
}

// SetAccessTokenTTL changes the lifetime of the access tokens issued from
// now on.
func (as *AuthServer) SetAccessTokenTTL(d time.Duration) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.ttl = d
}

func (as *AuthServer) metadata(w http.ResponseWriter, r *http.Request) {
	m := map[string]any{
		"issuer":                           as.URL,
		"authorization_endpoint":           as.URL + "/authorize",
		"token_endpoint":                   as.URL + "/token",
		"response_types_supported":         []string{"code"},
		"grant_types_supported":            []string{GrantAuthorizationCode, GrantRefreshToken, GrantClientCredentials},
		"code_challenge_methods_supported": []string{"S256"},
		"jwks_uri":                         as.JWKSURL(),
	}
	if len(as.opts.AuthMethods) > 0 {
		m["token_endpoint_auth_methods_supported"] = as.opts.AuthMethods
	}
	if len(as.opts.ScopesSupported) > 0 {
		m["scopes_supported"] = as.opts.ScopesSupported
	}
	if !as.opts.NoRegistration {
		m["registration_endpoint"] = as.URL + "/register"
	}
	if !as.opts.NoRevocation {
		m["revocation_endpoint"] = as.URL + "/revoke"
	}
	if as.opts.IssAdvertised {
		m["authorization_response_iss_parameter_supported"] = true
	}
	if as.opts.DPoP {
		m["dpop_signing_alg_values_supported"] = []string{"ES256"}
	}
	writeJSON(w, http.StatusOK, m)
}

// loginPage asks who signs in, keeping the authorization request's
// parameters.
var loginPage = template.Must(template.New("login").Parse(`<!DOCTYPE html><title>Sign in</title>
<form method="get" action="/authorize">{{range $k, $v := .}}{{range $v}}<input type="hidden" name="{{$k}}" value="{{.}}">{{end}}{{end}}
<input id="user" name="login_hint"><button id="approve" type="submit">Approve</button></form>`))

// handleAuthorize approves every well-formed request of a known client at
// once: it redirects to redirect_uri with a code bound to the PKCE
// challenge, the redirect_uri, the resource and the scopes.
func (as *AuthServer) handleAuthorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if as.opts.LoginPage && q.Get("login_hint") == "" {
		loginPage.Execute(w, q)
		return
	}
	as.mu.Lock()
	as.authorize = append(as.authorize, q)
	_, known := as.clients[q.Get("client_id")]
	as.mu.Unlock()
	redirect, err := url.Parse(q.Get("redirect_uri"))
	if err != nil || redirect.Scheme == "" || q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || !known {
		http.Error(w, "bad authorization request", http.StatusBadRequest)
		return
	}
	code := NewSecret("code")
	as.mu.Lock()
	as.codes[code] = &asCode{client: q.Get("client_id"), challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri"), resource: q.Get("resource"), scopes: strings.Fields(q.Get("scope")), jkt: q.Get("dpop_jkt"), user: q.Get("login_hint")}
	as.issued = append(as.issued, code)
	as.allCodes = append(as.allCodes, code)
	as.mu.Unlock()
	rq := redirect.Query()
	rq.Set("code", code)
	rq.Set("state", q.Get("state"))
	switch as.opts.Iss {
	case IssCorrect:
		rq.Set("iss", as.URL)
	case IssWrong:
		rq.Set("iss", "https://evil.example.com")
	case IssNormalized:
		rq.Set("iss", as.URL+"/")
	}
	redirect.RawQuery = rq.Encode()
	// The browser leaves no trace of the code behind (RFC 9700 §4.2.4).
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, redirect.String(), http.StatusFound)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func oauthErr(w http.ResponseWriter, status int, code, desc string) {
	writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
}

// authenticate checks the client authentication of a token or revocation
// request and returns the client id and the method it used.
func (as *AuthServer) authenticate(r *http.Request) (string, string, error) {
	if id, secret, ok := r.BasicAuth(); ok {
		// RFC 6749 §2.3.1: both are form-encoded before Basic.
		id, _ = url.QueryUnescape(id)
		secret, _ = url.QueryUnescape(secret)
		as.mu.Lock()
		cl := as.clients[id]
		as.mu.Unlock()
		if cl == nil || cl.secret == "" || cl.secret != secret {
			return id, ClientSecretBasic, fmt.Errorf("bad client secret %s", secret)
		}
		return id, ClientSecretBasic, nil
	}
	id := r.PostForm.Get("client_id")
	as.mu.Lock()
	cl := as.clients[id]
	as.mu.Unlock()
	if cl == nil {
		return id, "", fmt.Errorf("unknown client")
	}
	if secret := r.PostForm.Get("client_secret"); secret != "" {
		if cl.secret != secret {
			return id, ClientSecretPost, fmt.Errorf("bad client secret %s", secret)
		}
		return id, ClientSecretPost, nil
	}
	if a := r.PostForm.Get("client_assertion"); a != "" {
		if r.PostForm.Get("client_assertion_type") != assertionJWT || cl.pub == nil {
			return id, PrivateKeyJWT, fmt.Errorf("bad assertion type")
		}
		tok, err := jwt.ParseWithClaims(a, &jwt.RegisteredClaims{}, func(*jwt.Token) (any, error) { return cl.pub, nil },
			jwt.WithValidMethods([]string{"RS256", "ES256"}), jwt.WithAudience(as.URL), jwt.WithIssuer(id), jwt.WithSubject(id),
			jwt.WithTimeFunc(as.now), jwt.WithExpirationRequired())
		if err != nil || !tok.Valid {
			return id, PrivateKeyJWT, fmt.Errorf("bad assertion: %v", err)
		}
		return id, PrivateKeyJWT, nil
	}
	if cl.secret != "" || cl.pub != nil {
		return id, AuthNone, fmt.Errorf("confidential client without credentials")
	}
	return id, AuthNone, nil
}

// issue answers a token request with a new access token (and, when
// grant is not noRefresh, a refresh token of that grant: newGrant for a
// new authorization, or the grant of the refresh token it rotates).
func (as *AuthServer) issue(w http.ResponseWriter, client string, scopes []string, resource string, grant int, jkt, user string) {
	if as.opts.GrantScopes != nil {
		scopes = as.opts.GrantScopes(scopes)
	}
	at := NewSecret("at")
	as.mu.Lock()
	ttl := as.ttl
	resp := map[string]any{"access_token": at, "token_type": "Bearer", "expires_in": int(ttl / time.Second)}
	if jkt != "" {
		resp["token_type"] = "DPoP"
	}
	if len(scopes) > 0 {
		resp["scope"] = strings.Join(scopes, " ")
	}
	as.access[at] = &asAccess{scopes: scopes, expiry: as.now().Add(ttl), jkt: jkt, user: user}
	as.accessSeq = append(as.accessSeq, at)
	as.issued = append(as.issued, at)
	if grant != noRefresh {
		if grant == newGrant {
			as.grants++
			grant = as.grants
		}
		rt := NewSecret("rt")
		as.refresh = append(as.refresh, &asRefresh{token: rt, client: client, scopes: scopes, resource: resource, issuedFor: at, grant: grant, jkt: jkt, user: user})
		as.issued = append(as.issued, rt)
		resp["refresh_token"] = rt
	}
	as.mu.Unlock()
	writeJSON(w, http.StatusOK, resp)
}

// Values of issue's grant that name no grant.
const (
	noRefresh = -1 // no refresh token (a machine grant)
	newGrant  = 0  // a new authorization
)

// refused records the error of the last token request and answers it.
func (as *AuthServer) refused(w http.ResponseWriter, status int, code, desc string) {
	as.mu.Lock()
	as.requests[len(as.requests)-1].Error = code
	as.mu.Unlock()
	oauthErr(w, status, code, desc)
}

func (as *AuthServer) findRefresh(token string) *asRefresh {
	for _, rt := range as.refresh {
		if rt.token == token {
			return rt
		}
	}
	return nil
}

func (as *AuthServer) handleToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		oauthErr(w, http.StatusBadRequest, "invalid_request", "form")
		return
	}
	f := r.PostForm
	client, method, err := as.authenticate(r)
	as.mu.Lock()
	as.requests = append(as.requests, TokenRequest{GrantType: f.Get("grant_type"), AuthMethod: method, Scope: f.Get("scope"), Resource: f.Get("resource"), Assertion: f.Get("assertion"),
		SubjectToken: f.Get("subject_token"), RequestedTokenType: f.Get("requested_token_type"), ActorToken: f.Get("actor_token")})
	as.mu.Unlock()
	if err != nil {
		desc := "client authentication failed"
		if as.opts.EchoSecret {
			desc += ": " + err.Error()
		}
		as.refused(w, http.StatusUnauthorized, "invalid_client", desc)
		return
	}
	jkt, ok := as.tokenProof(w, r)
	if !ok {
		return
	}
	switch f.Get("grant_type") {
	case GrantAuthorizationCode:
		as.grantCode(w, f, client, jkt)
	case GrantRefreshToken:
		as.grantRefresh(w, f, client, jkt)
	case GrantClientCredentials:
		as.issue(w, client, strings.Fields(f.Get("scope")), f.Get("resource"), noRefresh, jkt, "")
	case GrantTokenExchange:
		if !as.exchangeForPerson(w, f, client) {
			as.grantExchange(w, f)
		}
	case GrantJWTBearer:
		if !as.redeemIDJAG(w, f, client, jkt) {
			as.grantJWTBearer(w, f, client, jkt)
		}
	default:
		as.refused(w, http.StatusBadRequest, "unsupported_grant_type", f.Get("grant_type"))
	}
}

// grantCode redeems an authorization code, once, checking its PKCE
// verifier, redirect URI, resource and DPoP key.
func (as *AuthServer) grantCode(w http.ResponseWriter, f url.Values, client, jkt string) {
	as.mu.Lock()
	code := as.codes[f.Get("code")]
	delete(as.codes, f.Get("code")) // used once, whatever the outcome
	as.mu.Unlock()
	sum := sha256.Sum256([]byte(f.Get("code_verifier")))
	switch {
	case code == nil || code.client != client:
		as.refused(w, http.StatusBadRequest, "invalid_grant", "unknown code")
	case base64.RawURLEncoding.EncodeToString(sum[:]) != code.challenge:
		as.refused(w, http.StatusBadRequest, "invalid_grant", "PKCE verification failed")
	case f.Get("redirect_uri") != code.redirect:
		as.refused(w, http.StatusBadRequest, "invalid_grant", "redirect_uri mismatch")
	case f.Get("resource") != code.resource:
		as.refused(w, http.StatusBadRequest, "invalid_target", "resource mismatch")
	case code.jkt != "" && jkt != code.jkt:
		as.refused(w, http.StatusBadRequest, "invalid_grant", "the code was requested with dpop_jkt for another DPoP key")
	default:
		as.mu.Lock()
		as.pkceOK++
		as.mu.Unlock()
		as.issue(w, client, code.scopes, code.resource, newGrant, jkt, code.user)
	}
}

// grantRefresh redeems a refresh token, once: one that comes back revokes
// its whole grant.
func (as *AuthServer) grantRefresh(w http.ResponseWriter, f url.Values, client, jkt string) {
	as.mu.Lock()
	rt := as.findRefresh(f.Get("refresh_token"))
	ok := rt != nil && rt.client == client && !rt.revoked && rt.redeemed == 0 && f.Get("resource") == rt.resource
	if rt != nil {
		rt.redeemed++
		if rt.redeemed > 1 {
			// A rotated refresh token came back: two parties hold
			// the grant (a theft, or a client that raced itself).
			// OAuth 2.1 §4.3.1: revoke the grant, every token of it.
			as.reuses++
			as.revokeGrantLocked(rt.grant)
		}
	}
	as.mu.Unlock()
	if !ok {
		as.refused(w, http.StatusBadRequest, "invalid_grant", "refresh token unknown, revoked or already used")
		return
	}
	if rt.jkt != "" && jkt != rt.jkt {
		as.refused(w, http.StatusBadRequest, "invalid_grant", "the refresh token is bound to another DPoP key")
		return
	}
	as.issue(w, client, rt.scopes, rt.resource, rt.grant, jkt, rt.user)
}

// grantExchange is the IdP side of SEP-990: an ID token for an ID-JAG.
func (as *AuthServer) grantExchange(w http.ResponseWriter, f url.Values) {
	as.mu.Lock()
	ok := f.Get("subject_token") == as.idToken && as.idToken != "" && f.Get("audience") == as.URL && f.Get("resource") != "" &&
		f.Get("subject_token_type") == tokenTypeIDToken && f.Get("requested_token_type") == tokenTypeIDJAG
	jag := NewSecret("jag")
	if ok {
		as.jags[jag] = f.Get("resource")
		as.issued = append(as.issued, jag)
	}
	as.mu.Unlock()
	if !ok {
		as.refused(w, http.StatusBadRequest, "invalid_request", "bad token exchange")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"access_token": jag, "issued_token_type": tokenTypeIDJAG, "token_type": "N_A"})
}

// grantJWTBearer redeems an ID-JAG, or a workload's own JWT (RFC 7523).
func (as *AuthServer) grantJWTBearer(w http.ResponseWriter, f url.Values, client, jkt string) {
	as.mu.Lock()
	resource, ok := as.jags[f.Get("assertion")]
	delete(as.jags, f.Get("assertion"))
	as.mu.Unlock()
	if !ok {
		// RFC 7523 §2.1 with a workload's own JWT (SEP-1933).
		if err := as.checkWorkload(f.Get("assertion")); err != nil {
			as.refused(w, http.StatusBadRequest, "invalid_grant", err.Error())
			return
		}
		resource = f.Get("resource")
	}
	as.issue(w, client, strings.Fields(f.Get("scope")), resource, noRefresh, jkt, "")
}

func (as *AuthServer) handleRegister(w http.ResponseWriter, r *http.Request) {
	var meta struct {
		RedirectURIs    []string `json:"redirect_uris"`
		Method          string   `json:"token_endpoint_auth_method"`
		ApplicationType string   `json:"application_type"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&meta); err != nil || len(meta.RedirectURIs) == 0 {
		oauthErr(w, http.StatusBadRequest, "invalid_client_metadata", "redirect_uris")
		return
	}
	as.mu.Lock()
	as.regReqs = append(as.regReqs, Registration{RedirectURIs: meta.RedirectURIs, ApplicationType: meta.ApplicationType, AuthMethod: meta.Method})
	as.mu.Unlock()
	id, secret := NewSecret("dcr-client"), ""
	if meta.Method != AuthNone {
		secret = NewSecret("dcr-secret")
	}
	as.mu.Lock()
	as.regs++
	as.clients[id] = &asClient{secret: secret}
	if secret != "" {
		as.issued = append(as.issued, secret)
	}
	as.mu.Unlock()
	resp := map[string]any{"client_id": id, "redirect_uris": meta.RedirectURIs, "token_endpoint_auth_method": meta.Method}
	if secret != "" {
		resp["client_secret"] = secret
	}
	writeJSON(w, http.StatusCreated, resp)
}

func (as *AuthServer) handleRevoke(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		oauthErr(w, http.StatusBadRequest, "invalid_request", "form")
		return
	}
	if _, _, err := as.authenticate(r); err != nil {
		oauthErr(w, http.StatusUnauthorized, "invalid_client", "client authentication failed")
		return
	}
	tok := r.PostForm.Get("token")
	as.mu.Lock()
	defer as.mu.Unlock()
	as.revoked = append(as.revoked, tok)
	if at := as.access[tok]; at != nil {
		at.revoked = true
	}
	if rt := as.findRefresh(tok); rt != nil {
		rt.revoked = true
		if at := as.access[rt.issuedFor]; at != nil {
			at.revoked = true
		}
	}
}

// revokeGrantLocked revokes every refresh token of grant and the access
// tokens issued with them. as.mu is held.
func (as *AuthServer) revokeGrantLocked(grant int) {
	for _, rt := range as.refresh {
		if rt.grant == grant {
			rt.revoked = true
			if at := as.access[rt.issuedFor]; at != nil {
				at.revoked = true
			}
		}
	}
}

// Valid reports whether an access token is usable now (issued here, not
// revoked, not expired), and its scopes.
func (as *AuthServer) Valid(accessToken string) (scopes []string, ok bool) {
	scopes, _, ok = as.bound(accessToken)
	return scopes, ok
}

// bound is Valid, with the thumbprint of the DPoP key the token is bound
// to ("" for a Bearer token).
func (as *AuthServer) bound(accessToken string) (scopes []string, jkt string, ok bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	t := as.access[accessToken]
	if t == nil || t.revoked || !as.now().Before(t.expiry) {
		return nil, "", false
	}
	return slices.Clone(t.scopes), t.jkt, true
}

// UserOf returns the user who authorized a valid access token: the
// login_hint of the authorization request its grant began with, which
// stands for the person who signed in at this server ("" for a machine
// grant, or a login without one).
func (as *AuthServer) UserOf(accessToken string) (string, bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	t := as.access[accessToken]
	if t == nil || t.revoked || !as.now().Before(t.expiry) {
		return "", false
	}
	return t.user, true
}

// RevokeAll makes every access and refresh token invalid at once, as if
// the server forgot its grants.
func (as *AuthServer) RevokeAll() {
	as.RevokeAccessTokens()
	as.RevokeRefreshTokens()
}

// RevokeAccessTokens makes the access tokens issued so far invalid and
// keeps the refresh tokens, as when the resource server lost its cache or
// a key rotated.
func (as *AuthServer) RevokeAccessTokens() {
	as.mu.Lock()
	defer as.mu.Unlock()
	for _, t := range as.access {
		t.revoked = true
	}
}

// RevokeRefreshTokens makes the refresh tokens issued so far invalid and
// keeps the access tokens, which work until they expire: the next refresh
// gets invalid_grant.
func (as *AuthServer) RevokeRefreshTokens() {
	as.mu.Lock()
	defer as.mu.Unlock()
	for _, t := range as.refresh {
		t.revoked = true
	}
}

// Secrets returns every secret the server handed out so far:
// authorization codes, access and refresh tokens, registered client
// secrets and ID-JAGs.
func (as *AuthServer) Secrets() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.issued)
}

// AuthorizationCodes returns the authorization codes handed out, in order
// (they are among Secrets too).
func (as *AuthServer) AuthorizationCodes() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.allCodes)
}

// TokenRequests returns the requests the token endpoint received, in
// order.
func (as *AuthServer) TokenRequests() []TokenRequest {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.requests)
}

// Grants returns the grant_type of each token request, in order.
func (as *AuthServer) Grants() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	out := make([]string, len(as.requests))
	for i, r := range as.requests {
		out[i] = r.GrantType
	}
	return out
}

// AuthorizationRequests returns the query of each request the
// authorization endpoint received, in order.
func (as *AuthServer) AuthorizationRequests() []url.Values {
	as.mu.Lock()
	defer as.mu.Unlock()
	out := make([]url.Values, len(as.authorize))
	for i, q := range as.authorize {
		out[i] = url.Values{}
		for k, v := range q {
			out[i][k] = slices.Clone(v)
		}
	}
	return out
}

// Registrations returns how many clients registered dynamically.
func (as *AuthServer) Registrations() int {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.regs
}

// PKCEVerified returns how many authorization codes were redeemed with a
// code_verifier that matched their S256 code_challenge (and so got
// tokens).
func (as *AuthServer) PKCEVerified() int {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.pkceOK
}

// Revocations returns the tokens presented at the revocation endpoint by
// an authenticated client, in order.
func (as *AuthServer) Revocations() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.revoked)
}

// AccessTokens returns the access tokens issued, in order.
func (as *AuthServer) AccessTokens() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.accessSeq)
}

// RefreshReuses returns how many refresh_token grants presented a refresh
// token that had been redeemed before. Each revoked the grant it belongs
// to: its refresh tokens and the access tokens issued with them.
func (as *AuthServer) RefreshReuses() int {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.reuses
}

// RefreshTokens returns the refresh tokens issued, in order.
func (as *AuthServer) RefreshTokens() []RefreshToken {
	as.mu.Lock()
	defer as.mu.Unlock()
	out := make([]RefreshToken, len(as.refresh))
	for i, rt := range as.refresh {
		out[i] = RefreshToken{Token: rt.token, Redeemed: rt.redeemed, Revoked: rt.revoked}
	}
	return out
}

// tokenProof reads the DPoP proof of a token request, when the server
// speaks DPoP, and returns the thumbprint of its key ("" without a
// proof). A proof that is not valid, replayed, or without the server's
// nonce is answered (false).
func (as *AuthServer) tokenProof(w http.ResponseWriter, r *http.Request) (string, bool) {
	proofs := r.Header.Values("DPoP")
	if !as.opts.DPoP || len(proofs) == 0 {
		return "", true
	}
	record := func(p DPoPProof) {
		as.mu.Lock()
		as.requests[len(as.requests)-1].DPoP = p
		as.mu.Unlock()
	}
	if len(proofs) > 1 {
		record(DPoPProof{Err: "more than one DPoP header"})
		as.refused(w, http.StatusBadRequest, "invalid_dpop_proof", "more than one DPoP header")
		return "", false
	}
	p, err := checkProof(proofs[0], http.MethodPost, as.URL+"/token", "", as.now())
	as.mu.Lock()
	if err == nil && as.jtis[p.JTI] {
		err = errors.New("the proof's jti was seen before")
	}
	if err == nil && as.nonce != "" && p.Nonce != as.nonce {
		err = errUseNonce
	}
	if err == nil {
		as.jtis[p.JTI] = true
	}
	nonce := as.nonce
	as.mu.Unlock()
	if err != nil {
		p.Err = err.Error()
	}
	record(p)
	switch {
	case errors.Is(err, errUseNonce):
		w.Header().Set("DPoP-Nonce", nonce)
		as.refused(w, http.StatusBadRequest, "use_dpop_nonce", "the authorization server requires a DPoP nonce")
		return "", false
	case err != nil:
		as.refused(w, http.StatusBadRequest, "invalid_dpop_proof", err.Error())
		return "", false
	}
	return p.JKT, true
}

var errUseNonce = errors.New("the proof lacks the server's nonce")

// TrustWorkloadKey makes the jwt-bearer grant accept a workload's JWT
// (SEP-1933) signed by pub (RS256 or ES256) whose audience is the server.
func (as *AuthServer) TrustWorkloadKey(pub crypto.PublicKey) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.workloads = append(as.workloads, pub)
}

// checkWorkload verifies a workload's JWT as an RFC 7523 assertion.
func (as *AuthServer) checkWorkload(assertion string) error {
	as.mu.Lock()
	keys := slices.Clone(as.workloads)
	as.mu.Unlock()
	var last error = errors.New("unknown assertion")
	for _, k := range keys {
		_, err := jwt.ParseWithClaims(assertion, &jwt.RegisteredClaims{}, func(*jwt.Token) (any, error) { return k, nil },
			jwt.WithValidMethods([]string{"RS256", "ES256"}), jwt.WithAudience(as.URL), jwt.WithTimeFunc(as.now), jwt.WithExpirationRequired())
		if err == nil {
			return nil
		}
		last = fmt.Errorf("assertion refused: %v", err)
	}
	return last
}

// DPoPNonce returns the nonce the token endpoint requires ("" when
// AuthServerOptions.DPoPNonce is not set).
func (as *AuthServer) DPoPNonce() string { return as.nonce }

// RegistrationRequests returns the dynamic registration requests, in
// order.
func (as *AuthServer) RegistrationRequests() []Registration {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.regReqs)
}
