package upstreamauth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// A person's token without a browser (credentials per_user, grant
// token_exchange or cross_app_access): the gateway holds, for each person
// who signed in to it through the company IdP, the ID token of that
// sign-in (Options.SubjectToken gives it), and trades it for the person's
// token at the upstream's authorization server:
//
//   - token_exchange (RFC 8693): subject_token is the person's ID token,
//     subject_token_type id_token, requested_token_type access_token, with
//     the resource (and audience, when configured); the gateway
//     authenticates as its client there, the actor. The answer must say it
//     issued an access token.
//   - cross_app_access (SEP-990): the person's ID token is exchanged at the
//     IdP for an ID-JAG naming the upstream's authorization server and
//     resource, checked here before it is presented, then redeemed there
//     with the jwt-bearer grant (RFC 7523).
//
// The subject token is never sent once it has expired. The exchange runs
// as every renewal does, single flight across goroutines and, under the
// storage lock, across replicas; its result is sealed under (upstream,
// person) like a connected person's token, listed, revoked and deleted the
// same way. When no token can be had, the person gets the connect link
// with fallback connect, or a refusal saying what to do.

// tokenTypeAccessToken is RFC 8693's token type of an access token.
const tokenTypeAccessToken = "urn:ietf:params:oauth:token-type:access_token"

// subjectSkew is how close to its expiry a person's ID token may still be
// sent: the authorization server checks it a moment later.
const subjectSkew = 10 * time.Second

// subjectToken is the calling person's ID token from their sign-in,
// checked to be a JWT that has not expired.
func (c *Client) subjectToken(ctx context.Context) (string, error) {
	up := c
	if c.parent != nil {
		up = c.parent
	}
	if up.subjects == nil {
		return "", errors.New("the gateway keeps no person's sign-in token (people sign in to it through the company IdP, signin { oidc … })")
	}
	tok, err := up.subjects(ctx, c.owner)
	if err != nil {
		return "", fmt.Errorf("your sign-in token cannot be used: %v", err)
	}
	if tok == "" {
		return "", errors.New("no sign-in token of yours is held: sign in to the gateway again through the company IdP")
	}
	c.addSecrets(tok)
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(tok, &claims); err != nil {
		return "", errors.New("your sign-in token is not a JWT, so it cannot be exchanged")
	}
	if claims.ExpiresAt == nil || !c.now().Add(subjectSkew).Before(claims.ExpiresAt.Time) {
		return "", errors.New("your sign-in token expired, and it is not sent: sign in to the gateway again through the company IdP")
	}
	return tok, nil
}

// exchangeForm fills form with the RFC 8693 exchange of the person's ID
// token for their access token, at rec's token endpoint: token_url, or
// that of the configured authorization_server, never a server only the
// upstream's metadata named.
func (c *Client) exchangeForm(ctx context.Context, rec *record, form url.Values) error {
	if c.cfg.TokenURL == "" && (c.cfg.AuthorizationServer == "" || !issuersEqual(rec.Issuer, c.cfg.AuthorizationServer)) {
		return fmt.Errorf("the upstream's metadata leads to the authorization server %s, not the configured authorization_server %s; the person's ID token is not sent there", shown(rec.Issuer), shown(c.cfg.AuthorizationServer))
	}
	subject, err := c.subjectToken(ctx)
	if err != nil {
		return err
	}
	form.Set("grant_type", oauthex.GrantTypeTokenExchange)
	form.Set("subject_token", subject)
	form.Set("subject_token_type", oauthex.TokenTypeIDToken)
	form.Set("requested_token_type", tokenTypeAccessToken)
	if c.cfg.Audience != "" {
		form.Set("audience", c.cfg.Audience)
	}
	if c.cfg.ActorTokenFile != "" {
		actor, err := c.audienceJWT(c.cfg.ActorTokenFile, "actor_token_file", "whatever issues the gateway's JWT has not written it yet", rec)
		if err != nil {
			return err
		}
		form.Set("actor_token", actor)
		form.Set("actor_token_type", tokenTypeJWT)
	}
	return nil
}

// tokenTypeJWT is RFC 8693's token type of a JWT.
const tokenTypeJWT = "urn:ietf:params:oauth:token-type:jwt"

// idJAGClaims are the claims of an ID-JAG this side checks.
type idJAGClaims struct {
	jwt.RegisteredClaims
	Resource string `json:"resource"`
}

// checkIDJAG checks, without its signature (the authorization server's
// part), that the ID-JAG the IdP issued for a person may be presented at
// rec's authorization server: it names that server as its audience and
// the upstream as its resource, and it has not expired. An ID-JAG for
// another server or resource would be a grant that server could present
// elsewhere, or one for the wrong upstream.
func (c *Client) checkIDJAG(raw string, rec *record) error {
	var claims idJAGClaims
	if _, _, err := jwt.NewParser().ParseUnverified(raw, &claims); err != nil {
		return errors.New("the IdP's ID-JAG is not a JWT; it is not presented")
	}
	want := cmp.Or(rec.Issuer, rec.TokenEndpoint)
	if !slices.ContainsFunc(claims.Audience, func(a string) bool {
		return (rec.Issuer != "" && issuersEqual(a, rec.Issuer)) || a == rec.TokenEndpoint
	}) {
		return fmt.Errorf("the IdP's ID-JAG has audience %q, not this upstream's authorization server %s; it is not presented", clip(strings.Join(claims.Audience, " "), 200), shown(want))
	}
	if claims.Resource != rec.Resource {
		return fmt.Errorf("the IdP's ID-JAG is for resource %q, not this upstream's %s; it is not presented", clip(claims.Resource, 200), shown(rec.Resource))
	}
	if claims.ExpiresAt == nil || !c.now().Before(claims.ExpiresAt.Time) {
		return errors.New("the IdP's ID-JAG has expired (or has no exp); it is not presented")
	}
	return nil
}

// exchangeFailed is the error of a person's call when their token could
// not be had by exchange: the connect link with fallback connect, else a
// [*SignInRequiredError] saying what failed and what to do. The person's
// client keeps its state: the next call tries again (after the failure
// backoff).
func (c *Client) exchangeFailed(err error) error {
	msg := c.redact(err.Error())
	c.logger.Warn("upstream oauth: a person's token could not be had by exchange", "upstream", c.name, "owner", c.ownerHash, "grant", c.cfg.grant(), "error", msg)
	if c.cfg.Fallback == FallbackConnect {
		return &ConnectRequiredError{Upstream: c.name, Reason: "your token could not be had from your sign-in: " + msg}
	}
	return &SignInRequiredError{Upstream: c.name, Reason: msg}
}
