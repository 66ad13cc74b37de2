package idp

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// OIDC is the company IdP the gateway signs people in through.
type OIDC struct {
	// Issuer is the IdP's issuer URL, exactly as its discovery document
	// and ID tokens spell it (https, or http on loopback).
	Issuer string `json:"issuer"`
	// ClientID is the gateway's client at the IdP.
	ClientID string `json:"client_id"`
	// ClientSecret is its secret, already expanded from its placeholder.
	// It goes to the IdP's token endpoint and nowhere else.
	ClientSecret string `json:"-"`
	// Scopes are asked besides openid (e.g. profile, email, groups).
	Scopes []string `json:"scopes,omitempty"`
	// Claims map the ID token to a person.
	Claims Claims `json:"claims"`
	// PrivateNetwork lets the gateway reach the IdP (its issuer, and the
	// endpoints and keys its discovery document names) at private
	// addresses: an on-premises IdP. Off, those requests are refused at
	// dial time like every egress of the gateway; the operator, who
	// configured the IdP and trusts it with every person's identity,
	// turns it on.
	PrivateNetwork bool `json:"private_network,omitempty"`
}

const (
	// idpTimeout bounds one request to the IdP, its answer read whole.
	idpTimeout = 10 * time.Second
	// maxIdPBody bounds an answer of the IdP (discovery, keys, token).
	maxIdPBody = 1 << 20
	// rediscoverAfter spaces attempts at discovery after one failed, so a
	// down IdP is not asked once per browser.
	rediscoverAfter = 5 * time.Second
)

// relyingParty is the gateway as the IdP's OpenID Connect client.
type relyingParty struct {
	cfg      OIDC
	redirect string
	client   *http.Client // pinned to the issuer's origin

	mu       sync.Mutex
	disc     *discovered
	failedAt time.Time
	failure  error
}

// discovered is what the IdP's discovery document set up.
type discovered struct {
	oauth    *oauth2.Config
	verifier *oidc.IDTokenVerifier
	issParam bool         // the IdP sends iss in its authorization responses (RFC 9207)
	token    *http.Client // pinned to the token endpoint's origin: the secret's only destination
}

// Check says what is wrong with o, without reaching the IdP.
func (o OIDC) Check() error {
	u, err := url.Parse(o.Issuer)
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("oidc issuer %q: write the issuer's URL, such as https://login.example.com", o.Issuer)
	}
	if err := pinnedfetch.CheckRemoteURL(u); err != nil {
		return fmt.Errorf("oidc issuer: %w", err)
	}
	if o.ClientID == "" {
		return errors.New("oidc: give the client_id the IdP registered for this gateway")
	}
	if o.ClientSecret == "" {
		return errors.New("oidc: give the client_secret, as a placeholder such as {env.OIDC_CLIENT_SECRET}")
	}
	for _, s := range o.Scopes {
		if s == "" || strings.ContainsAny(s, " \t\r\n\"\\") {
			return fmt.Errorf("oidc scope %q: one scope per word", s)
		}
	}
	if err := o.Claims.check(); err != nil {
		return fmt.Errorf("oidc: %w", err)
	}
	return nil
}

func newRelyingParty(cfg OIDC, redirect string) (*relyingParty, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	client, err := idpClient(cfg.Issuer, cfg.PrivateNetwork)
	if err != nil {
		return nil, err
	}
	return &relyingParty{cfg: cfg, redirect: redirect, client: client}, nil
}

// idpClient is a pinnedfetch client to rawURL's origin whose every request
// is bounded in time and in the size of its answer: go-oidc reads
// discovery documents and key sets whole. With private, the dial-time
// guard lets private addresses through (see [OIDC.PrivateNetwork]).
func idpClient(rawURL string, private bool, opts ...pinnedfetch.Option) (*http.Client, error) {
	if private {
		opts = append(opts, pinnedfetch.DenyPrivateAddresses(false))
	}
	c, err := pinnedfetch.New(rawURL, nil, opts...)
	if err != nil {
		return nil, err
	}
	c.Transport = bounded{next: c.Transport}
	return c, nil
}

// discover reads the IdP's discovery document once (again after a
// failure, at most every rediscoverAfter).
func (rp *relyingParty) discover(ctx context.Context) (*discovered, error) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.disc != nil {
		return rp.disc, nil
	}
	if !rp.failedAt.IsZero() && time.Since(rp.failedAt) < rediscoverAfter {
		return nil, rp.failure
	}
	d, err := rp.load(ctx)
	if err != nil {
		rp.failedAt, rp.failure = time.Now(), err
		return nil, err
	}
	rp.disc = d
	return d, nil
}

func (rp *relyingParty) load(ctx context.Context) (*discovered, error) {
	ctx, cancel := context.WithTimeout(ctx, idpTimeout)
	defer cancel()
	provider, err := oidc.NewProvider(oidc.ClientContext(ctx, rp.client), rp.cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("the IdP's discovery document at %s could not be used: %w", rp.cfg.Issuer, redact(err))
	}
	var meta struct {
		IssParam      bool     `json:"authorization_response_iss_parameter_supported"`
		PKCE          []string `json:"code_challenge_methods_supported"`
		TokenAuth     []string `json:"token_endpoint_auth_methods_supported"`
		ResponseModes []string `json:"response_modes_supported"`
	}
	if err := provider.Claims(&meta); err != nil {
		return nil, fmt.Errorf("the IdP's discovery document: %w", err)
	}
	if len(meta.PKCE) > 0 && !slices.Contains(meta.PKCE, "S256") {
		return nil, errors.New("the IdP does not support PKCE with S256 (code_challenge_methods_supported); this gateway signs in with nothing less")
	}
	ep := provider.Endpoint()
	for _, e := range []string{ep.AuthURL, ep.TokenURL} {
		u, err := url.Parse(e)
		if err != nil || pinnedfetch.CheckRemoteURL(u) != nil {
			return nil, fmt.Errorf("the IdP's endpoint %q is not https (or http on loopback)", e)
		}
	}
	switch {
	case len(meta.TokenAuth) == 0 || slices.Contains(meta.TokenAuth, "client_secret_basic"):
		ep.AuthStyle = oauth2.AuthStyleInHeader
	case slices.Contains(meta.TokenAuth, "client_secret_post"):
		ep.AuthStyle = oauth2.AuthStyleInParams
	default:
		return nil, fmt.Errorf("the IdP takes none of client_secret_basic and client_secret_post at its token endpoint (it takes %s)", strings.Join(meta.TokenAuth, ", "))
	}
	token, err := idpClient(ep.TokenURL, rp.cfg.PrivateNetwork)
	if err != nil {
		return nil, err
	}
	// The key set's fetches use the issuer's pinned client, and no
	// request's context: go-oidc keeps the key set beyond one request.
	keys := oidc.ClientContext(context.Background(), rp.client)
	return &discovered{
		oauth: &oauth2.Config{
			ClientID:     rp.cfg.ClientID,
			ClientSecret: rp.cfg.ClientSecret,
			Endpoint:     ep,
			RedirectURL:  rp.redirect,
			Scopes:       append([]string{oidc.ScopeOpenID}, rp.cfg.Scopes...),
		},
		verifier: provider.VerifierContext(keys, &oidc.Config{ClientID: rp.cfg.ClientID}),
		issParam: meta.IssParam,
		token:    token,
	}, nil
}

// authURL is where the browser goes to sign in.
func (d *discovered) authURL(state, nonce, verifier string) string {
	return d.oauth.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier))
}

// Errors of the callback, each told the person with what to do.
var (
	errIssuer   = errors.New("the sign-in response names another issuer than this gateway's IdP")
	errIDToken  = errors.New("the IdP's ID token was refused")
	errExchange = errors.New("the IdP did not exchange the code")
)

// checkIss applies RFC 9207: an authorization response's iss, when given,
// is the issuer; an IdP that says it sends one must send it.
func checkIss(got []string, issuer string, required bool) error {
	switch {
	case len(got) == 0 && required:
		return fmt.Errorf("%w: it has no iss, which this IdP always sends", errIssuer)
	case len(got) == 0:
		return nil
	case len(got) > 1 || got[0] != issuer:
		return errIssuer
	}
	return nil
}

// exchange trades code for the ID token's claims, checked: go-oidc checks
// its signature, iss, aud and exp; here the nonce, and azp when the token
// names more audiences than this client.
func (d *discovered) exchange(ctx context.Context, clientID, code, verifier, nonce string) (*signedIn, error) {
	ctx, cancel := context.WithTimeout(ctx, idpTimeout)
	defer cancel()
	tok, err := d.oauth.Exchange(oidc.ClientContext(ctx, d.token), code, oauth2.VerifierOption(verifier))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && re.ErrorCode != "" {
			return nil, fmt.Errorf("%w: it answered %s", errExchange, safeCode(re.ErrorCode))
		}
		return nil, fmt.Errorf("%w: %v", errExchange, redact(err))
	}
	raw, ok := tok.Extra("id_token").(string)
	if !ok || raw == "" {
		return nil, fmt.Errorf("%w: the IdP sent no ID token (is openid among the client's scopes?)", errIDToken)
	}
	claims, exp, err := checkIDToken(ctx, d.verifier, clientID, raw, nonce)
	if err != nil {
		return nil, err
	}
	return &signedIn{claims: claims, idToken: raw, refreshToken: tok.RefreshToken, expiry: exp}, nil
}

// signedIn is what a sign-in at the IdP brought: the ID token's claims,
// checked, and the tokens the gateway may keep.
type signedIn struct {
	claims       []byte
	idToken      string
	refreshToken string
	expiry       time.Time
}

// checkIDToken verifies raw with v (signature, iss, aud, exp) and checks
// its nonce and azp; it returns the claims.
func checkIDToken(ctx context.Context, v *oidc.IDTokenVerifier, clientID, raw, nonce string) ([]byte, time.Time, error) {
	idt, err := v.Verify(ctx, raw)
	if err != nil {
		var exp *oidc.TokenExpiredError
		if errors.As(err, &exp) {
			return nil, time.Time{}, fmt.Errorf("%w: it expired", errIDToken)
		}
		return nil, time.Time{}, fmt.Errorf("%w: %v", errIDToken, redact(err))
	}
	if nonce == "" || subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(nonce)) != 1 {
		return nil, time.Time{}, fmt.Errorf("%w: its nonce is not the one this browser's sign-in sent", errIDToken)
	}
	var claims struct {
		AZP *string `json:"azp"`
	}
	if err := idt.Claims(&claims); err != nil {
		return nil, time.Time{}, fmt.Errorf("%w: its claims do not read", errIDToken)
	}
	if len(idt.Audience) > 1 && (claims.AZP == nil || *claims.AZP != clientID) {
		return nil, time.Time{}, fmt.Errorf("%w: it names several audiences and is not authorized for this client (azp)", errIDToken)
	}
	if claims.AZP != nil && *claims.AZP != clientID {
		return nil, time.Time{}, fmt.Errorf("%w: it was issued to another client (azp)", errIDToken)
	}
	var raw2 rawClaims
	if err := idt.Claims(&raw2); err != nil {
		return nil, time.Time{}, fmt.Errorf("%w: its claims do not read", errIDToken)
	}
	return raw2, idt.Expiry, nil
}

// rawClaims keeps the claims' JSON as the IdP wrote it.
type rawClaims []byte

func (r *rawClaims) UnmarshalJSON(b []byte) error {
	*r = append((*r)[:0], b...)
	return nil
}

// safeCode is an OAuth error code fit to show: its own characters, or
// "an error".
func safeCode(code string) string {
	if code == "" || len(code) > 64 {
		return "an error"
	}
	for _, c := range code {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return "an error"
		}
	}
	return code
}

// maxCause bounds the cause of an IdP failure that reaches a page or the
// audit log: go-oidc puts an error answer's whole body in its error.
const maxCause = 200

// redact drops the URL net/http puts in a request's error (a token
// endpoint's query could carry something), keeps the cause, cut to
// maxCause bytes of printable text.
func redact(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	msg := strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, err.Error())
	if len(msg) <= maxCause {
		return errors.New(msg)
	}
	cut := maxCause
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return errors.New(msg[:cut] + "…")
}

// bounded bounds one request in time (headers and body) and its answer in
// size.
type bounded struct{ next http.RoundTripper }

func (b bounded) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), idpTimeout)
	resp, err := b.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cappedBody{r: resp.Body, left: maxIdPBody, cancel: cancel}
	return resp, nil
}

var errIdPTooLarge = fmt.Errorf("the IdP's answer is larger than %d bytes", maxIdPBody)

type cappedBody struct {
	r      io.ReadCloser
	left   int64
	cancel context.CancelFunc
}

func (c *cappedBody) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// One byte more tells a body of exactly the bound from a longer one.
		var one [1]byte
		if n, _ := io.ReadFull(c.r, one[:]); n > 0 {
			return 0, errIdPTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *cappedBody) Close() error {
	err := c.r.Close()
	c.cancel()
	return err
}
