package upstreamauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"slices"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/internal/configfile"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// Grants the gateway can use to obtain a token for an upstream.
const (
	// GrantAuthorizationCode: an operator logs in once (BeginLogin and
	// Callback, behind `caddy zidane login <upstream>`); the gateway
	// then refreshes the token on its own.
	GrantAuthorizationCode = "authorization_code"
	// GrantClientCredentials: the gateway is itself the OAuth client
	// (machine to machine); no login.
	GrantClientCredentials = "client_credentials"
	// GrantCrossAppAccess: Enterprise-Managed Authorization (SEP-990): an
	// ID token from the enterprise IdP is exchanged at the IdP for an
	// ID-JAG (RFC 8693), which the upstream's authorization server trades
	// for an access token (RFC 7523 jwt-bearer grant). No login.
	GrantCrossAppAccess = "cross_app_access"
	// GrantJWTBearer: workload identity federation (SEP-1933): the
	// workload's own JWT, issued by its platform (a Kubernetes service
	// account token, a CI job's OIDC token, a SPIFFE JWT-SVID) and kept
	// in a file, is presented as an RFC 7523 assertion. No login, no
	// secret of the gateway's own.
	GrantJWTBearer = "jwt_bearer"
	// GrantTokenExchange: token exchange (RFC 8693) for a person
	// (credentials per_user): the ID token the person's sign-in to the
	// gateway brought from the company IdP is the subject token, and the
	// gateway, authenticated as its client at the upstream's authorization
	// server, is the actor. No browser step.
	GrantTokenExchange = "token_exchange"
)

// Values of [Config.Fallback].
const (
	// FallbackNone: a person whose token cannot be had by exchange is
	// refused, with what to do.
	FallbackNone = "none"
	// FallbackConnect: such a person is sent the connect link, and
	// connects their account through the upstream's authorization code
	// grant (redirect_url).
	FallbackConnect = "connect"
)

// Whose token a call carries ([Config.Credentials]).
const (
	CredentialsShared  = "shared"
	CredentialsPerUser = "per_user"
)

// PerUser reports whether each caller's own token is attached, rather
// than the upstream's one shared token.
func (c Config) PerUser() bool { return c.Credentials == CredentialsPerUser }

// Exchanges reports whether each person's token comes from their sign-in
// through the company IdP, without a browser: credentials per_user with
// the token_exchange or cross_app_access grant.
func (c Config) Exchanges() bool {
	return c.PerUser() && (c.grant() == GrantTokenExchange || c.grant() == GrantCrossAppAccess)
}

// Client authentication methods at the token endpoint.
const (
	AuthClientSecretBasic = "client_secret_basic"
	AuthClientSecretPost  = "client_secret_post"
	AuthPrivateKeyJWT     = "private_key_jwt"
	AuthNone              = "none"
)

// Defaults.
const (
	// DefaultMaxStepUp bounds the step-up rounds (403 insufficient_scope
	// followed by a new token) in a row before the upstream is put in the
	// error state rather than asking for yet another login.
	DefaultMaxStepUp = 2
	// MaxScopes bounds the scopes of one request.
	MaxScopes = 64
)

// Config is the `oauth { … }` block of one upstream: how the gateway, as
// an OAuth client, obtains the access token it adds to the requests it
// sends that upstream.
//
// Secrets (ClientSecret, PrivateKey, IDPClientSecret) never appear in the
// errors of [Config.Validate] nor in [Config.String].
type Config struct {
	// Grant is "authorization_code" (the default), "client_credentials",
	// "cross_app_access", "jwt_bearer" or "token_exchange" (credentials
	// per_user only).
	Grant string `json:"grant,omitempty"`

	// ClientID is a pre-registered client id. For authorization_code it is
	// optional: without it the gateway uses its Client ID Metadata
	// Document (ClientMetadataURL) or dynamic client registration.
	ClientID string `json:"client_id,omitempty"`
	// ClientSecret goes with ClientID for client_secret_basic and
	// client_secret_post.
	ClientSecret string `json:"client_secret,omitempty"`
	// TokenEndpointAuthMethod is client_secret_basic, client_secret_post,
	// private_key_jwt or none. Empty chooses from what is configured (a
	// key: private_key_jwt; a secret: the method the authorization server
	// lists, client_secret_basic first; else none).
	TokenEndpointAuthMethod string `json:"token_endpoint_auth_method,omitempty"`
	// PrivateKey is a PEM private key (RSA or EC P-256) for
	// private_key_jwt; PrivateKeyFile names a file holding one instead.
	PrivateKey     string `json:"private_key,omitempty"`
	PrivateKeyFile string `json:"private_key_file,omitempty"`
	// SigningAlgorithm is RS256 or ES256; empty follows the key type.
	SigningAlgorithm string `json:"signing_algorithm,omitempty"`
	// KeyID, when set, is the kid header of the client assertion.
	KeyID string `json:"key_id,omitempty"`

	// Scopes, when set, are requested instead of the discovered ones
	// (the WWW-Authenticate challenge, else the resource's
	// scopes_supported, else none). Step-up scopes are added to them.
	Scopes []string `json:"scopes,omitempty"`

	// RedirectURL is the gateway's OAuth callback URL (authorization_code,
	// required): https, or http on loopback.
	RedirectURL string `json:"redirect_url,omitempty"`
	// ClientMetadataURL is the URL of the gateway's Client ID Metadata
	// Document (an https URL with a path), used as client_id with
	// authorization servers that support it.
	ClientMetadataURL string `json:"client_metadata_url,omitempty"`
	// ClientName is sent in dynamic client registration. Default:
	// "caddy-zidane-mcp".
	ClientName string `json:"client_name,omitempty"`

	// AuthorizationServer picks the issuer to use when the resource lists
	// several; it must be one of them.
	AuthorizationServer string `json:"authorization_server,omitempty"`
	// TokenURL, for the grants without a login, is the token endpoint to
	// use without discovery.
	TokenURL string `json:"token_url,omitempty"`

	// MaxStepUp bounds the step-up rounds in a row (default
	// DefaultMaxStepUp).
	MaxStepUp int `json:"max_step_up,omitempty"`

	// DPoP is whether the gateway asks for DPoP-bound tokens (RFC 9449):
	// "auto" (the default) when the authorization server offers them
	// (ES256 in dpop_signing_alg_values_supported) or the resource
	// requires them, "off" never, "required" always, refusing a token
	// issued as Bearer. A bound token is sent with a fresh proof of the
	// gateway's key on every request, so a copy of the token alone is
	// useless.
	DPoP string `json:"dpop,omitempty"`

	// Credentials is whose token a call carries: "shared" (the default),
	// the one token of the upstream, obtained by an operator's login or by
	// the gateway's own grant, for every caller; or "per_user", each
	// calling person's own token, obtained when that person connects their
	// account (authorization_code) or from their sign-in through the
	// company IdP (token_exchange, cross_app_access), never another
	// person's and never the shared one. A per_user call by a person with
	// no token is refused without reaching the upstream.
	Credentials string `json:"credentials,omitempty"`

	// Fallback, for credentials per_user with the token_exchange or
	// cross_app_access grant, is what a person gets when no token can be
	// had without a browser (no sign-in token is held for them, or the
	// exchange is refused): "none" (the default), a refusal saying what
	// to do, or "connect", the connect link, through which the person
	// logs in to the upstream (authorization code, with redirect_url).
	Fallback string `json:"fallback,omitempty"`
	// Audience (token_exchange) is the RFC 8693 audience sent with the
	// exchange: the logical name of the upstream at its authorization
	// server, when it wants one besides the resource.
	Audience string `json:"audience,omitempty"`
	// ActorTokenFile (token_exchange) names the file holding the
	// gateway's own current JWT (a workload identity, kept fresh by its
	// platform), sent as the exchange's actor_token (RFC 8693 §2.1, type
	// jwt), so that the token issued names the gateway as the party
	// acting for the person. It is read at each exchange and sent only to
	// the authorization server its audience names, before it expires.
	// Without it the actor is the gateway's authenticated client.
	ActorTokenFile string `json:"actor_token_file,omitempty"`

	// Cross-app access (SEP-990): the enterprise IdP.
	IDPIssuer       string `json:"idp_issuer,omitempty"`
	IDPTokenURL     string `json:"idp_token_url,omitempty"`
	IDPClientID     string `json:"idp_client_id,omitempty"`
	IDPClientSecret string `json:"idp_client_secret,omitempty"`
	// IDTokenFile names the file holding the current ID token issued by the
	// IdP to the gateway (kept fresh by whatever issues it); it is read at
	// each exchange. With credentials per_user it is not given: the ID
	// token is the calling person's, from their sign-in.
	IDTokenFile string `json:"id_token_file,omitempty"`

	// AssertionFile (jwt_bearer) names the file holding the workload's
	// current JWT, kept fresh by its platform; it is read at each grant,
	// and the JWT is sent only to the authorization server its audience
	// names, before it expires.
	AssertionFile string `json:"assertion_file,omitempty"`
}

// String describes c without its secrets.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "oauth{grant=%s", c.grant())
	if c.ClientID != "" {
		fmt.Fprintf(&b, " client_id=%s", c.ClientID)
	}
	if c.ClientSecret != "" {
		b.WriteString(" client_secret=<redacted>")
	}
	if c.TokenEndpointAuthMethod != "" {
		fmt.Fprintf(&b, " auth=%s", c.TokenEndpointAuthMethod)
	}
	if c.DPoP != "" {
		fmt.Fprintf(&b, " dpop=%s", c.DPoP)
	}
	if c.Credentials != "" {
		fmt.Fprintf(&b, " credentials=%s", c.Credentials)
	}
	if c.Fallback != "" {
		fmt.Fprintf(&b, " fallback=%s", c.Fallback)
	}
	if c.Audience != "" {
		fmt.Fprintf(&b, " audience=%s", c.Audience)
	}
	if c.PrivateKey != "" {
		b.WriteString(" private_key=<redacted>")
	}
	if c.PrivateKeyFile != "" {
		fmt.Fprintf(&b, " private_key_file=%s", c.PrivateKeyFile)
	}
	if len(c.Scopes) > 0 {
		fmt.Fprintf(&b, " scopes=%q", strings.Join(c.Scopes, " "))
	}
	if c.RedirectURL != "" {
		fmt.Fprintf(&b, " redirect_url=%s", c.RedirectURL)
	}
	if c.ClientMetadataURL != "" {
		fmt.Fprintf(&b, " client_metadata_url=%s", c.ClientMetadataURL)
	}
	if c.IDPIssuer != "" {
		fmt.Fprintf(&b, " idp_issuer=%s", c.IDPIssuer)
	}
	if c.IDPClientSecret != "" {
		b.WriteString(" idp_client_secret=<redacted>")
	}
	if c.AssertionFile != "" {
		fmt.Fprintf(&b, " assertion_file=%s", c.AssertionFile)
	}
	if c.ActorTokenFile != "" {
		fmt.Fprintf(&b, " actor_token_file=%s", c.ActorTokenFile)
	}
	b.WriteString("}")
	return b.String()
}

// GoString is String, so %#v does not print the secrets either.
func (c Config) GoString() string { return c.String() }

func (c Config) grant() string {
	if c.Grant == "" {
		return GrantAuthorizationCode
	}
	return c.Grant
}

func (c Config) maxStepUp() int {
	if c.MaxStepUp <= 0 {
		return DefaultMaxStepUp
	}
	return c.MaxStepUp
}

// Validate checks c and returns the first problem, in words that say what
// to write instead. It never quotes a secret.
func (c Config) Validate() error {
	for _, check := range []func() error{c.validateClient, c.validateSettings, c.validateGrant} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateClient checks the grant and how the client authenticates.
func (c Config) validateClient() error {
	switch c.grant() {
	case GrantAuthorizationCode, GrantClientCredentials, GrantCrossAppAccess, GrantJWTBearer, GrantTokenExchange:
	default:
		return fmt.Errorf("oauth: grant %q is not supported; use authorization_code, client_credentials, cross_app_access, jwt_bearer or token_exchange", c.Grant)
	}
	switch c.TokenEndpointAuthMethod {
	case "", AuthClientSecretBasic, AuthClientSecretPost, AuthPrivateKeyJWT, AuthNone:
	default:
		return fmt.Errorf("oauth: token_endpoint_auth_method %q is not supported; use client_secret_basic, client_secret_post, private_key_jwt or none", c.TokenEndpointAuthMethod)
	}
	if c.ClientSecret != "" && (c.PrivateKey != "" || c.PrivateKeyFile != "") {
		return errors.New("oauth: give either client_secret or a private key (private_key, private_key_file), not both")
	}
	if c.PrivateKey != "" && c.PrivateKeyFile != "" {
		return errors.New("oauth: give either private_key or private_key_file, not both")
	}
	if (c.ClientSecret != "" || c.PrivateKey != "" || c.PrivateKeyFile != "") && c.ClientID == "" {
		return errors.New("oauth: client_secret and private keys belong to a pre-registered client: set client_id too")
	}
	switch c.TokenEndpointAuthMethod {
	case AuthClientSecretBasic, AuthClientSecretPost:
		if c.ClientSecret == "" {
			return fmt.Errorf("oauth: token_endpoint_auth_method %s needs client_secret", c.TokenEndpointAuthMethod)
		}
	case AuthPrivateKeyJWT:
		if c.PrivateKey == "" && c.PrivateKeyFile == "" {
			return errors.New("oauth: token_endpoint_auth_method private_key_jwt needs private_key or private_key_file")
		}
	case AuthNone:
		if c.ClientSecret != "" || c.PrivateKey != "" || c.PrivateKeyFile != "" {
			return errors.New("oauth: token_endpoint_auth_method none sends no credential: remove client_secret and the private key, or choose another method")
		}
	}
	if c.PrivateKey != "" || c.PrivateKeyFile != "" {
		if _, _, err := c.signingKey(); err != nil {
			return err
		}
	} else if c.SigningAlgorithm != "" || c.KeyID != "" {
		return errors.New("oauth: signing_algorithm and key_id apply to private_key_jwt: give private_key or private_key_file")
	}
	return nil
}

// validateSettings checks the settings every grant shares: DPoP, scopes,
// step-up and URLs.
func (c Config) validateSettings() error {
	switch c.DPoP {
	case "", DPoPAuto, DPoPOff, DPoPRequired:
	default:
		return fmt.Errorf("oauth: dpop %q is not supported; use auto (the default), off or required", c.DPoP)
	}
	if len(c.Scopes) > MaxScopes {
		return fmt.Errorf("oauth: %d scopes is too many; give at most %d", len(c.Scopes), MaxScopes)
	}
	for _, s := range c.Scopes {
		if !validScope(s) {
			return fmt.Errorf("oauth: scopes: %q is not a valid OAuth scope (printable ASCII without spaces, quotes or backslashes)", s)
		}
	}
	switch c.Credentials {
	case "", CredentialsShared:
	case CredentialsPerUser:
		switch c.grant() {
		case GrantAuthorizationCode, GrantTokenExchange, GrantCrossAppAccess:
		default:
			return fmt.Errorf("oauth: credentials per_user needs grant authorization_code (each person logs in to the upstream as themselves), token_exchange or cross_app_access (each person's sign-in token is exchanged); the %s grant gives the gateway one identity for everyone: use credentials shared", c.grant())
		}
	default:
		return fmt.Errorf("oauth: credentials %q is not supported; use shared (the default: one token for every caller) or per_user (each person's own token)", c.Credentials)
	}
	switch c.Fallback {
	case "", FallbackNone:
	case FallbackConnect:
		if !c.PerUser() || (c.grant() != GrantTokenExchange && c.grant() != GrantCrossAppAccess) {
			return errors.New("oauth: fallback connect applies to credentials per_user with grant token_exchange or cross_app_access (with authorization_code every person connects through the link already)")
		}
		if c.RedirectURL == "" {
			return errors.New("oauth: fallback connect needs redirect_url, the gateway's callback for the person's login to the upstream")
		}
	default:
		return fmt.Errorf("oauth: fallback %q is not supported; use none (the default: a person whose token cannot be exchanged is refused) or connect (they get the connect link)", c.Fallback)
	}
	if c.Audience != "" && c.grant() != GrantTokenExchange {
		return errors.New("oauth: audience applies to grant token_exchange")
	}
	if c.ActorTokenFile != "" {
		if c.grant() != GrantTokenExchange {
			return errors.New("oauth: actor_token_file applies to grant token_exchange")
		}
		// As for assertion_file: the platform may write it only later.
		if err := configfile.Check(c.ActorTokenFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("oauth: actor_token_file: %v; give the path of the file that holds the gateway's JWT", err)
		}
	}
	if c.MaxStepUp < 0 || c.MaxStepUp > 10 {
		return fmt.Errorf("oauth: max_step_up %d is out of range; give 1 to 10, or 0 for the default %d", c.MaxStepUp, DefaultMaxStepUp)
	}
	for _, u := range []struct{ name, value string }{
		{"redirect_url", c.RedirectURL},
		{"authorization_server", c.AuthorizationServer},
		{"token_url", c.TokenURL},
		{"idp_issuer", c.IDPIssuer},
		{"idp_token_url", c.IDPTokenURL},
	} {
		if u.value == "" {
			continue
		}
		if err := checkURL(u.value); err != nil {
			return fmt.Errorf("oauth: %s: %v", u.name, err)
		}
	}
	return nil
}

// validateGrant checks what the grant needs, and refuses what belongs to
// another grant.
func (c Config) validateGrant() error {
	switch c.grant() {
	case GrantAuthorizationCode:
		if c.RedirectURL == "" {
			return errors.New("oauth: authorization_code needs redirect_url, the gateway's OAuth callback URL")
		}
		if c.ClientMetadataURL != "" {
			u, err := url.Parse(c.ClientMetadataURL)
			if err != nil || u.Scheme != "https" || u.Host == "" || u.Path == "" || u.Path == "/" || u.User != nil || u.Fragment != "" {
				return errors.New("oauth: client_metadata_url must be an https URL with a path, such as https://gateway.example.com/oauth/client.json")
			}
		}
		if s := c.firstSet("token_url", "idp_issuer", "idp_token_url", "idp_client_id", "idp_client_secret", "id_token_file", "assertion_file"); s != "" {
			return fmt.Errorf("oauth: %s applies to client_credentials, cross_app_access and jwt_bearer, not authorization_code", s)
		}
	case GrantClientCredentials:
		if c.ClientID == "" {
			return errors.New("oauth: client_credentials needs client_id, and client_secret or a private key")
		}
		if c.ClientSecret == "" && c.PrivateKey == "" && c.PrivateKeyFile == "" {
			return errors.New("oauth: client_credentials needs a client credential: client_secret, private_key or private_key_file")
		}
		if c.RedirectURL != "" || c.ClientMetadataURL != "" {
			return errors.New("oauth: redirect_url and client_metadata_url apply to authorization_code, not client_credentials")
		}
		if s := c.firstSet("idp_issuer", "idp_token_url", "idp_client_id", "idp_client_secret", "id_token_file"); s != "" {
			return fmt.Errorf("oauth: %s applies to cross_app_access, not client_credentials", s)
		}
		if c.AssertionFile != "" {
			return errors.New("oauth: assertion_file applies to jwt_bearer, not client_credentials")
		}
	case GrantCrossAppAccess:
		if c.ClientID == "" {
			return errors.New("oauth: cross_app_access needs client_id (the gateway's client at the upstream's authorization server)")
		}
		if c.IDPIssuer == "" && c.IDPTokenURL == "" {
			return errors.New("oauth: cross_app_access needs idp_issuer or idp_token_url, the enterprise IdP")
		}
		if c.IDPClientID == "" {
			return errors.New("oauth: cross_app_access needs idp_client_id, the gateway's client at the IdP")
		}
		switch {
		case c.PerUser() && c.TokenURL == "" && c.AuthorizationServer == "":
			// The ID-JAG's audience is the upstream's authorization
			// server: the config names it, never the upstream's metadata.
			return errors.New("oauth: grant cross_app_access with credentials per_user asks the IdP for an ID-JAG for the upstream's authorization server, which the config names, never the upstream's metadata: set authorization_server <issuer> (or token_url)")
		case c.PerUser() && c.IDTokenFile != "":
			return errors.New("oauth: id_token_file is the gateway's own ID token; with credentials per_user each person's ID token from their sign-in is exchanged: remove id_token_file")
		case !c.PerUser() && c.IDTokenFile == "":
			return errors.New("oauth: cross_app_access needs id_token_file, the file that holds the gateway's current ID token from the IdP (or credentials per_user, to exchange each person's)")
		}
		// The file is read at each exchange, and whatever keeps it fresh
		// may write it only later; but a path that holds something else
		// than a file would fail every exchange.
		if c.IDTokenFile != "" {
			if err := configfile.Check(c.IDTokenFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("oauth: id_token_file: %v; give the path of the file that holds the ID token", err)
			}
		}
		if (c.RedirectURL != "" || c.ClientMetadataURL != "") && c.Fallback != FallbackConnect {
			return errors.New("oauth: redirect_url and client_metadata_url apply to authorization_code, not cross_app_access (or to its fallback connect)")
		}
		if c.AssertionFile != "" {
			return errors.New("oauth: assertion_file applies to jwt_bearer; cross_app_access reads id_token_file")
		}
	case GrantTokenExchange:
		if !c.PerUser() {
			return errors.New("oauth: grant token_exchange exchanges each person's sign-in token: it needs credentials per_user")
		}
		if c.ClientID == "" || (c.ClientSecret == "" && c.PrivateKey == "" && c.PrivateKeyFile == "") {
			return errors.New("oauth: grant token_exchange needs client_id and a client credential (client_secret, private_key or private_key_file): the gateway authenticates as the actor of the exchange")
		}
		if c.TokenURL == "" && c.AuthorizationServer == "" {
			// The upstream's metadata names its authorization server: a
			// hostile or compromised upstream would collect everyone's ID
			// tokens at a server of its choosing.
			return errors.New("oauth: grant token_exchange sends each person's ID token to the upstream's authorization server, which the config names, never the upstream's metadata: set authorization_server <issuer> (or token_url)")
		}
		if (c.RedirectURL != "" || c.ClientMetadataURL != "") && c.Fallback != FallbackConnect {
			return errors.New("oauth: redirect_url and client_metadata_url apply to authorization_code, not token_exchange (or to its fallback connect)")
		}
		if s := c.firstSet("idp_issuer", "idp_token_url", "idp_client_id", "idp_client_secret", "id_token_file", "assertion_file"); s != "" {
			return fmt.Errorf("oauth: %s does not apply to token_exchange, which sends the person's ID token to the upstream's authorization server itself", s)
		}
	case GrantJWTBearer:
		if c.AssertionFile == "" {
			return errors.New("oauth: jwt_bearer needs assertion_file, the file that holds the workload's current JWT")
		}
		// As for id_token_file: the platform may write it only later.
		if err := configfile.Check(c.AssertionFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("oauth: assertion_file: %v; give the path of the file that holds the workload's JWT", err)
		}
		if c.RedirectURL != "" || c.ClientMetadataURL != "" {
			return errors.New("oauth: redirect_url and client_metadata_url apply to authorization_code, not jwt_bearer")
		}
		if s := c.firstSet("idp_issuer", "idp_token_url", "idp_client_id", "idp_client_secret", "id_token_file"); s != "" {
			return fmt.Errorf("oauth: %s applies to cross_app_access, not jwt_bearer", s)
		}
	}
	return nil
}

// firstSet returns the first of the named settings that is set, or "".
func (c Config) firstSet(names ...string) string {
	values := map[string]string{
		"token_url": c.TokenURL, "idp_issuer": c.IDPIssuer, "idp_token_url": c.IDPTokenURL,
		"idp_client_id": c.IDPClientID, "idp_client_secret": c.IDPClientSecret, "id_token_file": c.IDTokenFile,
		"assertion_file": c.AssertionFile,
	}
	for _, n := range names {
		if values[n] != "" {
			return n
		}
	}
	return ""
}

// checkURL applies the egress rule (https anywhere, http to loopback only)
// to an absolute URL of the config.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("it does not parse as a URL; write an absolute URL such as https://auth.example.com")
	}
	if err := pinnedfetch.CheckRemoteURL(u); err != nil {
		var ue *pinnedfetch.URLError
		if errors.As(err, &ue) {
			return errors.New(ue.Reason)
		}
		return err
	}
	if u.Fragment != "" {
		return errors.New("it has a #fragment; remove it")
	}
	return nil
}

// validScope reports whether s is a scope-token of RFC 6749 §3.3.
func validScope(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// signingKey loads the private key for private_key_jwt and the algorithm
// to sign with. Errors name the setting, never the key material.
func (c Config) signingKey() (crypto.Signer, string, error) {
	data := []byte(c.PrivateKey)
	where := "private_key"
	if c.PrivateKeyFile != "" {
		where = "private_key_file"
		b, err := configfile.Read(c.PrivateKeyFile)
		if err != nil {
			return nil, "", fmt.Errorf("oauth: private_key_file: %v; give the path of a PEM private key", err)
		}
		data = b
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, "", fmt.Errorf("oauth: %s holds no PEM block; give a PEM private key (-----BEGIN PRIVATE KEY-----)", where)
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, "", fmt.Errorf("oauth: %s holds a PEM block of type %q; give a PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY", where, block.Type)
	}
	if err != nil {
		return nil, "", fmt.Errorf("oauth: %s: the PEM %s does not parse as a private key", where, block.Type)
	}
	var alg string
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, "", fmt.Errorf("oauth: %s: only EC keys on P-256 (ES256) are supported", where)
		}
		alg = "ES256"
	case *rsa.PrivateKey:
		if k.N.BitLen() < 2048 {
			return nil, "", fmt.Errorf("oauth: %s: the RSA key has %d bits; use at least 2048", where, k.N.BitLen())
		}
		alg = "RS256"
	default:
		return nil, "", fmt.Errorf("oauth: %s: only RSA (RS256) and EC P-256 (ES256) keys are supported", where)
	}
	if c.SigningAlgorithm != "" && c.SigningAlgorithm != alg {
		if !slices.Contains([]string{"RS256", "ES256"}, c.SigningAlgorithm) {
			return nil, "", fmt.Errorf("oauth: signing_algorithm %q is not supported; use RS256 or ES256", c.SigningAlgorithm)
		}
		return nil, "", fmt.Errorf("oauth: signing_algorithm %s does not fit the key in %s, which signs %s", c.SigningAlgorithm, where, alg)
	}
	return key.(crypto.Signer), alg, nil
}
