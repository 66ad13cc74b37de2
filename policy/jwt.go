package policy

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// ErrTokenInvalid is wrapped by every error that [JWTVerifier.Verify]
// returns, so the edge can answer 401 with errors.Is. The rest of the message
// says what is wrong with the token.
var ErrTokenInvalid = errors.New("invalid token")

// ErrKeysUnavailable is wrapped, together with [ErrTokenInvalid], when a JWT
// could not be checked because the identity provider's signing keys could not
// be fetched. The token may well be valid; the edge may answer 503 instead of
// 401 so that clients retry rather than ask the user to sign in again.
var ErrKeysUnavailable = errors.New("signing keys unavailable")

// PEMError is the error of [NewJWTVerifier] and [JWTConfig.Validate] about
// [JWTConfig.PublicKeyPEM]: it holds a private key, a block that is not a
// public key or does not parse, a key of a refused type or size, or no PEM
// block at all. Reason says what is wrong and what to give instead, so
// that a caller can name where the PEM came from.
type PEMError struct{ Reason string }

func (e *PEMError) Error() string { return "jwt: " + e.Reason }

// Limits and timings of JWT verification. They are constants rather than
// options because each one is a safety bound, not a matter of taste.
const (
	// jwtDefaultLeeway absorbs ordinary clock skew between this host and the
	// identity provider.
	jwtDefaultLeeway = 30 * time.Second
	// jwtMaxLeeway keeps a typo ("30m" for "30s") from quietly extending
	// every token's life.
	jwtMaxLeeway = 5 * time.Minute
	// jwtMaxBytes bounds the work done for one bearer. Real access tokens are
	// a few KiB, even with group claims.
	jwtMaxBytes = 32 << 10
	// jwtMaxHeaderSegment bounds what LooksLikeJWT decodes on every request.
	jwtMaxHeaderSegment = 4 << 10
	// jwtMinRSABits refuses RSA keys that are too short to be trusted.
	jwtMinRSABits = 2048

	// jwksFetchTimeout bounds one JWKS fetch, the initial fetch in
	// NewJWTVerifier, and how long a Verify call waits for keys.
	jwksFetchTimeout = 10 * time.Second
	// jwksRefreshInterval is how often the key set is fetched in the
	// background, so that keys the provider publishes ahead of a rotation are
	// known before the first token signed with them arrives.
	jwksRefreshInterval = time.Hour
	// jwksUnknownKIDInterval is the least time between two fetches caused by
	// tokens: a token whose kid is not cached, or any token while no keys are
	// cached. Anyone can send a token with an invented kid, so this is what
	// keeps the edge from hammering the identity provider.
	jwksUnknownKIDInterval = time.Minute
	// jwksMaxBytes bounds a JWKS response. Real key sets are a few KiB.
	jwksMaxBytes = 1 << 20
	// jwksMaxRedirects bounds the redirects the default JWKS client follows.
	jwksMaxRedirects = 5
)

// jwtDefaultAlgorithms is used when JWTConfig.Algorithms is empty: the two
// algorithms that identity providers issue access tokens with by default.
var jwtDefaultAlgorithms = []string{"RS256", "ES256"}

// jwtSupportedAlgorithms are the asymmetric JWS algorithms a verifier can be
// configured with.
var jwtSupportedAlgorithms = []string{
	"RS256", "RS384", "RS512",
	"PS256", "PS384", "PS512",
	"ES256", "ES384", "ES512",
	"EdDSA",
}

// JWTConfig configures the verification of JWT access tokens issued by an
// external identity provider (Auth0, Okta, Entra ID, Keycloak, …).
//
// Exactly one of JWKSURL and PublicKeyPEM must be set.
type JWTConfig struct {
	// Issuer is the identity provider's issuer identifier. A token's `iss`
	// claim must equal it exactly, including any trailing slash. Required.
	Issuer string

	// Audiences are the audience values this resource answers to, normally
	// its own URL (for MCP, the canonical URL of the /mcp endpoint). A
	// token's `aud` claim must name at least one of them; a token with no
	// `aud` is refused. Required: at least one.
	Audiences []string

	// Algorithms lists the JWS algorithms accepted in a token's `alg`
	// header: any of RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384,
	// ES512 and EdDSA. Empty means RS256 and ES256.
	//
	// "none" is always refused. HS256, HS384 and HS512 are refused too:
	// checking an HMAC token needs the provider's signing secret, and whoever
	// holds that secret can mint tokens for anyone, so a leak of this
	// configuration would be a leak of every user's access. Allowing HS* next
	// to public keys is also what makes the classic key-confusion attack
	// possible (a token "signed" with the public key as HMAC secret).
	Algorithms []string

	// JWKSURL is the URL of the provider's JSON Web Key Set, usually the
	// `jwks_uri` of its OpenID or OAuth metadata. It must be https, except on
	// a loopback host. Keys are cached: the set is fetched when the verifier
	// is built, every hour in the background, and again when a token names a
	// key id (`kid`) that is not cached, at most once a minute. A failed
	// fetch at start-up is not an error: tokens are refused with
	// [ErrKeysUnavailable] until a later fetch succeeds.
	JWKSURL string

	// PublicKeyPEM holds the provider's public key(s) in PEM instead of a
	// JWKS URL: "PUBLIC KEY" (RSA, ECDSA P-256/P-384/P-521 or Ed25519),
	// "RSA PUBLIC KEY", or "CERTIFICATE" blocks. Several blocks may follow
	// one another, for a key rotation. Private keys are refused. RSA keys
	// must have at least 2048 bits.
	PublicKeyPEM []byte

	// Leeway is the clock skew allowed when checking `exp`, `nbf` and
	// `iat`. Zero means 30s; at most 5m.
	Leeway time.Duration

	// MachineScope, when set, marks every token that carries this scope as
	// held by a machine. Without it, a token is a machine's when it comes
	// from a client-credentials grant, which is recognised by: `gty` is
	// "client-credentials" (Auth0); `sub` equals `client_id` (RFC 9068) or
	// `cid` (Okta); or `idtyp` is "app" (Entra ID). Any other token is a
	// user's.
	MachineScope string

	// Logger receives a warning when a JWKS fetch fails. Nil means such
	// failures are not logged; they still show in Verify's errors.
	Logger *slog.Logger
}

// Validate checks the configuration without fetching anything and says what
// to change.
func (c JWTConfig) Validate() error {
	_, _, err := c.check()
	return err
}

// check validates c and returns the algorithm allow-list and the static
// public keys, if any.
func (c JWTConfig) check() ([]string, []crypto.PublicKey, error) {
	if strings.TrimSpace(c.Issuer) == "" {
		return nil, nil, errors.New("jwt: issuer is required: set it to the identity provider's issuer identifier (the `issuer` of its metadata)")
	}
	if len(c.Audiences) == 0 {
		return nil, nil, errors.New("jwt: at least one audience is required: set it to this resource's URL, as the identity provider puts it in `aud`")
	}
	for _, a := range c.Audiences {
		if strings.TrimSpace(a) == "" {
			return nil, nil, errors.New("jwt: audiences contains an empty value: remove it")
		}
	}
	algs, err := jwtAlgorithms(c.Algorithms)
	if err != nil {
		return nil, nil, err
	}
	// The scope claim is a space-separated list: a machine scope with a
	// space in it could never be found there.
	if strings.ContainsFunc(c.MachineScope, unicode.IsSpace) {
		return nil, nil, fmt.Errorf("jwt: machine_scope %q: give one scope, without spaces", c.MachineScope)
	}
	if c.Leeway < 0 || c.Leeway > jwtMaxLeeway {
		return nil, nil, fmt.Errorf("jwt: leeway %s is out of range: give a duration between 0 and %s (0 means %s)", c.Leeway, jwtMaxLeeway, jwtDefaultLeeway)
	}
	switch {
	case c.JWKSURL == "" && len(c.PublicKeyPEM) == 0:
		return nil, nil, errors.New("jwt: no signing keys configured: set jwks_url to the identity provider's JWKS URL, or give its public key in PEM")
	case c.JWKSURL != "" && len(c.PublicKeyPEM) != 0:
		return nil, nil, errors.New("jwt: both jwks_url and a PEM public key are configured: keep only one")
	case c.JWKSURL != "":
		if err := jwksCheckURL(c.JWKSURL); err != nil {
			return nil, nil, err
		}
		return algs, nil, nil
	}
	keys, err := jwtParsePublicKeys(c.PublicKeyPEM)
	if err != nil {
		return nil, nil, err
	}
	// A key that no allowed algorithm can use means every token would be
	// refused; say so now rather than at the first request.
	for _, k := range keys {
		if !slices.ContainsFunc(algs, func(alg string) bool { return jwtKeyFits(alg, k) }) {
			return nil, nil, fmt.Errorf("jwt: the %s public key cannot verify any of the allowed algorithms %s: add %s to algorithms",
				jwtKeyKind(k), strings.Join(algs, ", "), jwtAlgsForKey(k))
		}
	}
	return algs, keys, nil
}

// jwtAlgorithms returns the allow-list for configured, or an error naming
// the first algorithm that cannot be allowed.
func jwtAlgorithms(configured []string) ([]string, error) {
	if len(configured) == 0 {
		return slices.Clone(jwtDefaultAlgorithms), nil
	}
	algs := make([]string, 0, len(configured))
	for _, alg := range configured {
		switch {
		case strings.EqualFold(alg, "none"):
			return nil, errors.New(`jwt: algorithm "none" means unsigned tokens and is never accepted: remove it from algorithms`)
		case strings.HasPrefix(strings.ToUpper(alg), "HS"):
			return nil, fmt.Errorf("jwt: algorithms: %q is symmetric: verifying it needs the provider's signing secret, which could then forge tokens; configure the provider to sign access tokens with RS256, ES256 or EdDSA", alg)
		case !slices.Contains(jwtSupportedAlgorithms, alg):
			return nil, fmt.Errorf("jwt: algorithms: unsupported algorithm %q: use one of %s (names are case-sensitive)", alg, strings.Join(jwtSupportedAlgorithms, ", "))
		}
		if !slices.Contains(algs, alg) {
			algs = append(algs, alg)
		}
	}
	return algs, nil
}

// jwksCheckURL refuses a JWKS URL whose keys an on-path attacker could
// replace, by the one remote-URL rule of pinnedfetch: https anywhere, plain
// http only to loopback.
func jwksCheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("jwt: jwks_url does not parse: %v", err)
	}
	if err := pinnedfetch.CheckRemoteURL(u); err != nil {
		return fmt.Errorf("jwt: jwks_url: %w", err)
	}
	return nil
}

// jwtParsePublicKeys reads every PEM block of data as a public key. Its
// errors are PEMErrors.
func jwtParsePublicKeys(data []byte) ([]crypto.PublicKey, error) {
	var keys []crypto.PublicKey
	rest := data
	for {
		block, next := pem.Decode(rest)
		if block == nil {
			break
		}
		rest = next
		var key crypto.PublicKey
		var err error
		switch block.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			cert, err = x509.ParseCertificate(block.Bytes)
			if err == nil {
				key = cert.PublicKey
			}
		default:
			if strings.Contains(block.Type, "PRIVATE KEY") {
				return nil, &PEMError{fmt.Sprintf("the PEM holds a private key (%s): give the public key instead, such as the output of `openssl pkey -in key.pem -pubout`", block.Type)}
			}
			return nil, &PEMError{fmt.Sprintf("PEM block %q is not a public key: give PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE blocks", block.Type)}
		}
		if err != nil {
			return nil, &PEMError{fmt.Sprintf("PEM block %d (%s) does not parse: %v", len(keys)+1, block.Type, err)}
		}
		if err := jwtCheckKey(key); err != nil {
			return nil, &PEMError{fmt.Sprintf("PEM block %d: %v", len(keys)+1, err)}
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, &PEMError{"the public key PEM holds no PEM block: give the identity provider's public key as -----BEGIN PUBLIC KEY-----"}
	}
	return keys, nil
}

// jwtCheckKey refuses key types and sizes no allowed algorithm should use.
func jwtCheckKey(key crypto.PublicKey) error {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < jwtMinRSABits {
			return fmt.Errorf("RSA key has %d bits, fewer than the %d required", n, jwtMinRSABits)
		}
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
		default:
			return fmt.Errorf("ECDSA curve %s is not one of P-256, P-384, P-521", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return fmt.Errorf("unsupported key type %T: use RSA, ECDSA or Ed25519", key)
	}
	return nil
}

// jwtKeyFits reports whether alg verifies with key, so that an RSA key is
// never offered to an ECDSA token and the other way round.
func jwtKeyFits(alg string, key any) bool {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return (strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")) && k.N.BitLen() >= jwtMinRSABits
	case *ecdsa.PublicKey:
		switch alg {
		case "ES256":
			return k.Curve == elliptic.P256()
		case "ES384":
			return k.Curve == elliptic.P384()
		case "ES512":
			return k.Curve == elliptic.P521()
		}
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

func jwtKeyKind(key any) string {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return "RSA"
	case *ecdsa.PublicKey:
		return "ECDSA " + k.Curve.Params().Name
	case ed25519.PublicKey:
		return "Ed25519"
	}
	return fmt.Sprintf("%T", key)
}

func jwtAlgsForKey(key any) string {
	var fit []string
	for _, alg := range jwtSupportedAlgorithms {
		if jwtKeyFits(alg, key) {
			fit = append(fit, alg)
		}
	}
	return strings.Join(fit, " or ")
}

// JWTVerifier checks JWT access tokens against one issuer's keys. It is safe
// for concurrent use.
type JWTVerifier struct {
	issuer       string
	audiences    []string
	algorithms   []string
	leeway       time.Duration
	machineScope string
	parser       *jwt.Parser

	static []crypto.PublicKey // set when keys come from PEM
	jwks   *jwksKeys          // set when keys come from a JWKS URL
	stop   context.CancelFunc
}

// NewJWTVerifier builds a verifier for cfg. With a JWKS URL it fetches the key
// set once before returning, waiting at most 10s or until ctx ends; if that
// fetch fails the verifier is still returned (so that an identity provider
// outage does not stop the server from starting), and tokens are refused with
// [ErrKeysUnavailable] until a later fetch succeeds. It returns an error when
// cfg is invalid or ctx ends before the initial fetch is done.
//
// client is used for every JWKS fetch; pass one whose egress policy suits the
// deployment. Nil means a client that times out after 10s and follows at most
// 5 redirects, never from https to http. Responses larger than 1 MiB are
// refused either way.
//
// Call Close when the verifier is no longer used, to stop the background
// refresh.
func NewJWTVerifier(ctx context.Context, cfg JWTConfig, client *http.Client) (*JWTVerifier, error) {
	algs, static, err := cfg.check()
	if err != nil {
		return nil, err
	}
	leeway := cfg.Leeway
	if leeway == 0 {
		leeway = jwtDefaultLeeway
	}
	v := &JWTVerifier{
		issuer:       cfg.Issuer,
		audiences:    slices.Clone(cfg.Audiences),
		algorithms:   algs,
		leeway:       leeway,
		machineScope: cfg.MachineScope,
		parser: jwt.NewParser(
			jwt.WithValidMethods(algs),
			jwt.WithIssuer(cfg.Issuer),
			jwt.WithAudience(cfg.Audiences...),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithLeeway(leeway),
		),
		static: static,
		stop:   func() {},
	}
	if cfg.JWKSURL == "" {
		return v, nil
	}

	// The background refresh lives until Close, not until ctx ends: ctx
	// only bounds the initial fetch, so it is cut off from ctx as soon as
	// construction is done.
	hc, err := jwksClient(client, cfg.JWKSURL)
	if err != nil {
		return nil, err
	}
	life, stop := context.WithCancel(context.WithoutCancel(ctx))
	detach := context.AfterFunc(ctx, stop)
	keys, err := newJWKSKeys(life, cfg.JWKSURL, hc, cfg.Logger)
	if !detach() {
		stop()
		return nil, fmt.Errorf("jwt: fetching the JWKS from %s was interrupted: %w", cfg.JWKSURL, context.Cause(ctx))
	}
	if err != nil {
		stop()
		return nil, err
	}
	v.jwks = keys
	v.stop = stop
	return v, nil
}

// Close stops the background refresh of the key set and cancels a fetch in
// flight. After Close, Verify still accepts tokens signed with cached keys but
// never fetches the key set again. Close may be called more than once, and
// on a nil verifier.
func (v *JWTVerifier) Close() {
	if v != nil && v.stop != nil {
		v.stop()
	}
}

// Verify checks raw, a JWT access token, and returns the principal it
// stands for. It checks the signature with an allowed algorithm, `iss`,
// `aud`, `exp` (required), `nbf` and `iat` (when present, within the
// leeway) and `sub` (required), and refuses a token whose header lists a
// critical extension (`crit`, RFC 7515 section 4.1.11): it implements none.
//
// Every error wraps [ErrTokenInvalid] and says what is wrong; none contains
// the token. When the signing keys cannot be fetched the error also wraps
// [ErrKeysUnavailable]. Verify returns within about 10s even when the
// identity provider does not answer, or sooner if ctx ends.
//
// The principal's TokenID and Owner are "jwt:" followed by `sub`, its
// Expires is `exp` and its Issued `iat`, its Source is "jwt",
// and its Scopes are the union of the `scope` claim (space-separated) and the
// `scp` claim (a string or an array). Its Name is `sub` for a user; for a
// machine (see JWTConfig.MachineScope) it is the first of `client_id`, `cid`,
// `azp` and `sub` that is set. Its JKT is `cnf.jkt` for a DPoP-bound token
// (see jwtConfirmation): the edge then asks every request for a proof.
func (v *JWTVerifier) Verify(ctx context.Context, raw string) (Principal, error) {
	if len(raw) > jwtMaxBytes {
		return Principal{}, jwtInvalid(fmt.Sprintf("the token is %d bytes, more than the %d this server accepts", len(raw), jwtMaxBytes))
	}
	var claims jwtAccessClaims
	suspects, _ := ctx.Value(suspectKey{}).(*SuspectQueue)
	entered := false
	tok, err := v.parser.ParseWithClaims(raw, &claims, func(t *jwt.Token) (any, error) {
		key, err := v.key(ctx, t)
		if err != nil || suspects == nil {
			return key, err
		}
		// The signature check comes next: a suspect request waits for its
		// turn (Authenticator.AuthenticateSuspect), once its key is found,
		// so that no slot is held through a JWKS fetch.
		if err := suspects.enter(ctx); err != nil {
			return nil, &jwtKeyError{jwtInvalid("the request ended while its token waited to be checked")}
		}
		entered = true
		return key, nil
	})
	if entered {
		suspects.leave()
	}
	if err != nil {
		return Principal{}, v.explain(tok, &claims, err)
	}
	jkt, err := jwtConfirmation(raw, claims.Cnf)
	if err != nil {
		return Principal{}, err
	}
	p := v.principal(&claims)
	p.JKT = jkt
	// The payload the signature covers, which golang-jwt has decoded
	// and checked: the claims the operator's rules read.
	_, rest, _ := strings.Cut(raw, ".")
	if payload, _, ok := strings.Cut(rest, "."); ok {
		p.Claims = payload
	}
	return p, nil
}

// jwtJKTLen is the length of a SHA-256 RFC 7638 thumbprint in base64url.
const jwtJKTLen = 43

// jwtConfirmation is the DPoP key thumbprint a verified token is bound to
// (cnf.jkt, RFC 9449 §6.1), or "" for a bearer token (no cnf at all). The
// edge then takes the token only with a proof signed by that key.
//
// A confirmation it cannot hold a request to is refused, never read as no
// binding: the issuer meant the token bound, and a bearer reading would
// let whoever holds it in without the key. That is a cnf that is not an
// object, one without jkt (an mTLS certificate's x5t#S256, which this
// server does not check), a jkt that is no thumbprint; and one reading:
// encoding/json, which reads the claims here, matches "CNF" or "\u0063nf"
// as cnf and keeps the last of two, where a reader that matches names
// exactly or keeps the first would find another binding, or none. So a
// payload that may spell cnf (or jkt) otherwise, or twice, passes
// message.Validate, the repository's one check of that rule, and then an
// exact-spelling check of the two names. The payload is decoded again only
// for that, and only when it holds "cnf" in some case or an escape.
func jwtConfirmation(raw string, cnf json.RawMessage) (string, error) {
	_, rest, _ := strings.Cut(raw, ".")
	seg, _, _ := strings.Cut(rest, ".")
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(seg, "="))
	if err != nil {
		return "", jwtInvalid("the token's claims do not decode as base64url")
	}
	if cnf != nil || jwtContainsFold(payload, "cnf") || strings.Contains(string(payload), `\u`) {
		if err := message.Validate(payload); err != nil {
			return "", jwtInvalid("the token's claims are JSON that readers could read differently (a member twice, or spelled in another case): " + jwtValidateReason(err))
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(payload, &top); err != nil {
			return "", jwtInvalid("the token's claims are not a JSON object")
		}
		for name := range top {
			if name != "cnf" && strings.EqualFold(name, "cnf") {
				return "", jwtInvalid("the token spells its cnf claim in another letter case; the identity provider must write cnf")
			}
		}
	}
	if cnf == nil {
		return "", nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(cnf, &members); err != nil || members == nil {
		return "", jwtInvalid("the token's cnf claim is not a JSON object; a DPoP-bound token carries cnf: {\"jkt\": <thumbprint>}")
	}
	for name := range members {
		if name != "jkt" && strings.EqualFold(name, "jkt") {
			return "", jwtInvalid("the token's cnf spells jkt in another letter case; the identity provider must write jkt")
		}
	}
	rawJKT, ok := members["jkt"]
	if !ok {
		return "", jwtInvalid("the token is bound (cnf) by a method other than a DPoP key (no cnf.jkt), which this server cannot check; ask the identity provider for a DPoP-bound or a bearer token")
	}
	var jkt string
	if err := json.Unmarshal(rawJKT, &jkt); err != nil {
		return "", jwtInvalid("the token's cnf.jkt is not a string")
	}
	if b, err := base64.RawURLEncoding.DecodeString(jkt); err != nil || len(jkt) != jwtJKTLen || len(b) != 32 {
		return "", jwtInvalid("the token's cnf.jkt is not a SHA-256 JWK thumbprint (43 base64url characters, RFC 7638)")
	}
	return jkt, nil
}

// jwtContainsFold reports whether b holds s in any letter case (s is ASCII).
func jwtContainsFold(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if strings.EqualFold(string(b[i:i+len(s)]), s) {
			return true
		}
	}
	return false
}

// jwtValidateReason is message.Validate's reason, which never quotes the
// input.
func jwtValidateReason(err error) string {
	var e *message.Error
	if errors.As(err, &e) {
		return e.Msg
	}
	return "not JSON"
}

// key finds the verification key for t, whose alg is already allowed, once
// its header passes jwtCheckCrit.
func (v *JWTVerifier) key(ctx context.Context, t *jwt.Token) (any, error) {
	if err := jwtCheckCrit(t.Header); err != nil {
		return nil, &jwtKeyError{err}
	}
	alg := t.Method.Alg()
	if v.jwks != nil {
		return v.jwks.key(ctx, t, alg)
	}
	set := jwt.VerificationKeySet{}
	for _, k := range v.static {
		if jwtKeyFits(alg, k) {
			set.Keys = append(set.Keys, k)
		}
	}
	if len(set.Keys) == 0 {
		return nil, &jwtKeyError{jwtInvalid(fmt.Sprintf("no configured public key can verify %s; the token was not signed by the configured issuer's key", alg))}
	}
	return set, nil
}

// jwtCritExtensions are the JWS extensions this verifier implements, which
// a token may list in its crit header: none.
var jwtCritExtensions = map[string]bool{}

// jwtHeaderParams are the header parameters JWS defines itself (RFC 7515
// section 4.1), which crit must not list.
var jwtHeaderParams = map[string]bool{
	"alg": true, "jku": true, "jwk": true, "kid": true, "x5u": true, "x5c": true,
	"x5t": true, "x5t#S256": true, "typ": true, "cty": true, "crit": true,
}

// jwtCheckCrit refuses a header whose crit (RFC 7515 section 4.1.11) lists
// an extension this verifier does not implement: the issuer marked it as
// one the token must not be read without, and golang-jwt does not look. A
// crit that breaks the section's rules (not a non-empty array of distinct
// names of parameters the header carries, beyond those JWS defines) is
// refused too.
func jwtCheckCrit(h map[string]any) error {
	raw, present := h["crit"]
	if !present {
		return nil
	}
	const rule = " (RFC 7515 section 4.1.11)"
	notNames := jwtInvalid(`the JWT header's "crit" is not an array of header parameter names` + rule)
	list, ok := raw.([]any)
	if !ok {
		return notNames
	}
	if len(list) == 0 {
		return jwtInvalid(`the JWT header's "crit" is empty, which is not allowed` + rule + "; the identity provider must leave it out")
	}
	names := make([]string, 0, len(list))
	for _, v := range list {
		name, ok := v.(string)
		if !ok {
			return notNames
		}
		if slices.Contains(names, name) {
			return jwtInvalid(fmt.Sprintf(`the JWT header's "crit" names %s twice`+rule, jwtQuote(name)))
		}
		names = append(names, name)
	}
	for _, name := range names {
		_, carried := h[name]
		switch {
		case jwtHeaderParams[name]:
			return jwtInvalid(fmt.Sprintf(`the JWT header's "crit" names %s, which JWS defines itself and crit must not list`+rule, jwtQuote(name)))
		case !carried:
			return jwtInvalid(fmt.Sprintf(`the JWT header's "crit" names %s, which the header does not carry`+rule, jwtQuote(name)))
		case !jwtCritExtensions[name]:
			return jwtInvalid(fmt.Sprintf(`the JWT header's "crit" names %s, an extension this server does not implement, so it cannot read the token as its issuer meant`+rule+"; ask the identity provider for access tokens without it", jwtQuote(name)))
		}
	}
	return nil
}

// principal turns verified claims into the principal they stand for.
func (v *JWTVerifier) principal(c *jwtAccessClaims) Principal {
	scopes := make([]string, 0, len(c.Scope)+len(c.Scp))
	for _, s := range slices.Concat(c.Scope, c.Scp) {
		if !slices.Contains(scopes, s) {
			scopes = append(scopes, s)
		}
	}
	p := Principal{
		TokenID: JWTPrefix + c.Subject,
		Name:    c.Subject,
		Kind:    KindUser,
		Scopes:  scopes,
		Source:  "jwt",
		Owner:   JWTPrefix + c.Subject,
	}
	// exp bounds the tokens derived for the sessions this principal
	// creates; iat says whether an operator's revocation of the subject
	// came after the token was issued.
	if c.ExpiresAt != nil {
		exp := c.ExpiresAt.UTC()
		p.Expires = &exp
	}
	if c.IssuedAt != nil {
		iat := c.IssuedAt.UTC()
		p.Issued = &iat
	}
	// Each rule recognises a client-credentials token of one provider. Being
	// generous here is the safe side: a user mistaken for a machine loses the
	// sessions endpoint, while a machine mistaken for a user would gain it.
	machine := slices.Contains(c.Gty, "client-credentials") ||
		(c.ClientID != "" && c.ClientID == c.Subject) ||
		(c.Cid != "" && c.Cid == c.Subject) ||
		c.Idtyp == "app" ||
		(v.machineScope != "" && p.HasScope(v.machineScope))
	if machine {
		p.Kind = KindMachine
		for _, name := range []string{c.ClientID, c.Cid, c.Azp} {
			if name != "" {
				p.Name = name
				break
			}
		}
	}
	return p
}

// explain turns a parse failure into an error that says what is wrong and
// wraps ErrTokenInvalid. It never quotes the token.
func (v *JWTVerifier) explain(tok *jwt.Token, c *jwtAccessClaims, err error) error {
	var ke *jwtKeyError
	if errors.As(err, &ke) {
		return ke.err
	}
	var alg string
	if tok != nil {
		alg, _ = tok.Header["alg"].(string)
	}
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		// The decoder's message may quote a claim value; keep it short.
		detail := strings.TrimPrefix(err.Error(), jwt.ErrTokenMalformed.Error()+": ")
		if len(detail) > 200 {
			detail = detail[:200] + "…"
		}
		return jwtInvalid(fmt.Sprintf("not a well-formed JWT (%s)", detail))
	case alg == "none":
		return jwtInvalid(`alg "none" (an unsigned token) is never accepted`)
	case errors.Is(err, jwt.ErrTokenUnverifiable) && alg == "":
		return jwtInvalid(`the JWT header has no "alg"`)
	case errors.Is(err, jwt.ErrTokenUnverifiable) || tok != nil && tok.Method != nil && !slices.Contains(v.algorithms, alg):
		return jwtInvalid(fmt.Sprintf("algorithm %s is not allowed; this server accepts %s", jwtQuote(alg), strings.Join(v.algorithms, ", ")))
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return jwtInvalid(fmt.Sprintf("the %s signature does not verify with the issuer's key; the token was altered or signed by someone else", alg))
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		return jwtInvalid(v.claimProblems(c, err))
	}
	return jwtInvalid("verification failed: " + err.Error())
}

// claimProblems lists every claim check that failed, in one sentence each.
func (v *JWTVerifier) claimProblems(c *jwtAccessClaims, err error) string {
	var problems []string
	if errors.Is(err, jwt.ErrTokenExpired) {
		problems = append(problems, fmt.Sprintf("expired at %s (leeway %s); get a new access token", jwtTime(c.ExpiresAt), v.leeway))
	}
	if errors.Is(err, jwt.ErrTokenNotValidYet) {
		problems = append(problems, fmt.Sprintf("not valid before %s (leeway %s)", jwtTime(c.NotBefore), v.leeway))
	}
	if errors.Is(err, jwt.ErrTokenUsedBeforeIssued) {
		problems = append(problems, fmt.Sprintf("issued in the future (iat %s, leeway %s); check the clocks of this host and the identity provider", jwtTime(c.IssuedAt), v.leeway))
	}
	switch {
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing) && c.Issuer == "":
		problems = append(problems, fmt.Sprintf("no iss claim; this server accepts tokens from issuer %q only", v.issuer))
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		problems = append(problems, fmt.Sprintf("issuer %s is not the configured issuer %q", jwtQuote(c.Issuer), v.issuer))
	}
	if errors.Is(err, jwt.ErrTokenInvalidAudience) || errors.Is(err, jwt.ErrTokenRequiredClaimMissing) && len(c.Audience) == 0 {
		problems = append(problems, fmt.Sprintf("audience %s does not name this resource; request a token for %s (RFC 8707 resource parameter)", jwtQuoteList(c.Audience), jwtQuoteList(v.audiences)))
	}
	if errors.Is(err, jwt.ErrTokenRequiredClaimMissing) && c.ExpiresAt == nil {
		problems = append(problems, "no exp claim; this server accepts only access tokens that expire")
	}
	if errors.Is(err, errJWTNoSubject) {
		problems = append(problems, errJWTNoSubject.Error())
	}
	if len(problems) == 0 {
		return "claims check failed: " + err.Error()
	}
	return strings.Join(problems, "; ")
}

func jwtInvalid(msg string) error {
	return fmt.Errorf("%w: %s", ErrTokenInvalid, msg)
}

func jwtUnavailable(msg string) error {
	return fmt.Errorf("%w: %w: %s", ErrTokenInvalid, ErrKeysUnavailable, msg)
}

// jwtKeyError carries a finished error out of a keyfunc, through the jwt
// package's wrapping, to explain.
type jwtKeyError struct{ err error }

func (e *jwtKeyError) Error() string { return e.err.Error() }

func jwtTime(d *jwt.NumericDate) string {
	if d == nil {
		return "(unset)"
	}
	return d.UTC().Format(time.RFC3339)
}

// jwtQuote quotes a value taken from an unverified token, cut short so that a
// hostile token cannot flood the logs the error ends up in.
func jwtQuote(s string) string {
	const limit = 80
	if len(s) > limit {
		return fmt.Sprintf("%q…", s[:limit])
	}
	return fmt.Sprintf("%q", s)
}

func jwtQuoteList(list []string) string {
	if len(list) == 0 {
		return "(none)"
	}
	const limit = 5
	quoted := make([]string, 0, min(len(list), limit))
	for _, s := range list[:min(len(list), limit)] {
		quoted = append(quoted, jwtQuote(s))
	}
	if len(list) > limit {
		quoted = append(quoted, "…")
	}
	return strings.Join(quoted, ", ")
}

var errJWTNoSubject = errors.New("no sub claim; this server needs a subject to know who the token acts for")

// jwtAccessClaims are the claims Verify reads. Decoding into a struct, not a
// map, keeps Verify's allocations low.
type jwtAccessClaims struct {
	jwt.RegisteredClaims
	Scope    jwtStringList `json:"scope"`
	Scp      jwtStringList `json:"scp"`
	Gty      jwtStringList `json:"gty"`
	ClientID string        `json:"client_id"`
	Cid      string        `json:"cid"`
	Azp      string        `json:"azp"`
	Idtyp    string        `json:"idtyp"`
	// Cnf is the confirmation (RFC 7800), read by jwtConfirmation.
	Cnf json.RawMessage `json:"cnf"`
}

// Validate is called by the jwt package after the registered claims checks.
func (c *jwtAccessClaims) Validate() error {
	if c.Subject == "" {
		return errJWTNoSubject
	}
	return nil
}

// jwtStringList decodes a claim that providers send either as a
// space-separated string (`scope`) or as an array of strings (Okta's `scp`,
// Auth0's `gty` after a refresh).
type jwtStringList []string

func (l *jwtStringList) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*l = strings.Fields(s)
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return errors.New("the scope, scp and gty claims must each be a string or an array of strings")
	}
	*l = slices.DeleteFunc(list, func(s string) bool { return s == "" })
	return nil
}

// LooksLikeJWT reports whether raw has the shape of a signed JWT: three
// base64url segments separated by dots, the first of which decodes to a JSON
// object with a string "alg". The edge uses it to send a bearer to
// [JWTVerifier.Verify] rather than to the opaque-token store; it proves
// nothing about the token. Unsigned tokens (alg "none", empty signature)
// look like JWTs, so that Verify refuses them with a clear message.
func LooksLikeJWT(raw string) bool {
	header, rest, ok := strings.Cut(raw, ".")
	if !ok {
		return false
	}
	payload, sig, ok := strings.Cut(rest, ".")
	if !ok || header == "" || payload == "" || len(header) > jwtMaxHeaderSegment {
		return false
	}
	for _, seg := range []string{header, payload, sig} {
		if !jwtBase64URL(seg) {
			return false
		}
	}
	decoded, err := base64.RawURLEncoding.DecodeString(header)
	if err != nil {
		return false
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(decoded, &fields) != nil {
		return false
	}
	var alg string
	return json.Unmarshal(fields["alg"], &alg) == nil && alg != ""
}

// jwtBase64URL reports whether s holds only unpadded base64url characters.
func jwtBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// jwksKeys is a cached JWKS and the rules for fetching it again.
type jwksKeys struct {
	url   string
	cache *jwksCache
	kf    keyfunc.Keyfunc
	life  context.Context // ends with Close
	// fetching admits one Verify at a time to a lookup that may fetch the
	// key set, so that when a provider rotates its key, the requests that
	// arrive during the fetch wait for it and then find the new key, instead
	// of being refused by the rate limit the first one used up.
	fetching chan struct{}
}

func newJWKSKeys(life context.Context, jwksURL string, client *http.Client, logger *slog.Logger) (*jwksKeys, error) {
	cache := &jwksCache{Storage: jwkset.NewMemoryStorage()}
	onError := func(_ context.Context, err error) {
		if life.Err() != nil {
			return // cancelled by Close: not the provider's fault
		}
		cache.failed(err)
		if logger != nil {
			logger.Warn("fetching the JWKS failed; tokens signed with keys not yet cached are refused until a fetch succeeds",
				"url", jwksURL, "error", err)
		}
	}
	store, err := jwkset.NewStorageFromHTTP(jwksURL, jwkset.HTTPClientStorageOptions{
		Client:                    client,
		Ctx:                       life,
		HTTPTimeout:               jwksFetchTimeout,
		NoErrorReturnFirstHTTPReq: true,
		RefreshErrorHandler:       onError,
		RefreshInterval:           jwksRefreshInterval,
		Storage:                   cache,
	})
	if err != nil {
		return nil, fmt.Errorf("jwt: jwks_url %s: %w", jwksURL, err)
	}
	storage, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
		HTTPURLs: map[string]jwkset.Storage{jwksURL: store},
		// This bounds both the wait for the limiter and the fetch after it.
		// A wait the limiter knows to be longer fails at once.
		RateLimitWaitMax:  jwksFetchTimeout,
		RefreshUnknownKID: rate.NewLimiter(rate.Every(jwksUnknownKIDInterval), 1),
	})
	if err != nil {
		return nil, fmt.Errorf("jwt: jwks_url %s: %w", jwksURL, err)
	}
	kf, err := keyfunc.New(keyfunc.Options{
		Ctx:     life,
		Storage: storage,
		// Keys marked for encryption never verify signatures; keys with no
		// "use" are the common case and are accepted.
		UseWhitelist: []jwkset.USE{jwkset.UseSig, ""},
	})
	if err != nil {
		return nil, fmt.Errorf("jwt: jwks_url %s: %w", jwksURL, err)
	}
	return &jwksKeys{
		url:      jwksURL,
		cache:    cache,
		kf:       kf,
		life:     life,
		fetching: make(chan struct{}, 1),
	}, nil
}

// key returns the key(s) that may verify t. A key missing from the cache
// makes it fetch the key set, rate-limited, and never for longer than
// jwksFetchTimeout.
func (k *jwksKeys) key(ctx context.Context, t *jwt.Token, alg string) (any, error) {
	kid, hasKID := t.Header["kid"].(string)
	if _, present := t.Header["kid"]; present && !hasKID {
		return nil, &jwtKeyError{jwtInvalid(`the JWT header's "kid" is not a string`)}
	}
	if !k.cached(kid, hasKID) {
		wait, cancel := context.WithTimeout(ctx, jwksFetchTimeout)
		defer cancel()
		select {
		case k.fetching <- struct{}{}:
			defer func() { <-k.fetching }()
		case <-wait.Done():
			return nil, &jwtKeyError{k.missing(wait, kid, hasKID)}
		}
		if k.life.Err() != nil {
			return nil, &jwtKeyError{k.missing(ctx, kid, hasKID)}
		}
		if !hasKID && !k.cached(kid, hasKID) {
			// jwkset only fetches on a kid lookup that misses; a lookup of
			// the empty kid in an empty cache is one, and is rate-limited
			// like any other. keyfunc then reads whatever was fetched.
			_, _ = k.kf.Storage().KeyRead(wait, "")
		}
		ctx = wait
	}
	got, err := k.kf.KeyfuncCtx(ctx)(t)
	if err != nil {
		if !k.cached(kid, hasKID) {
			return nil, &jwtKeyError{k.missing(ctx, kid, hasKID)}
		}
		// The key is cached but keyfunc refused it: its JWK names another
		// alg, or it is marked for encryption.
		return nil, &jwtKeyError{jwtInvalid(fmt.Sprintf("the JWKS key %s cannot verify this token (%s)", jwtQuote(kid), strings.TrimPrefix(err.Error(), keyfunc.ErrKeyfunc.Error()+": ")))}
	}
	if set, ok := got.(jwt.VerificationKeySet); ok {
		fit := jwt.VerificationKeySet{}
		for _, key := range set.Keys {
			if jwtKeyFits(alg, key) {
				fit.Keys = append(fit.Keys, key)
			}
		}
		if len(fit.Keys) == 0 && !k.cached("", false) {
			return nil, &jwtKeyError{k.missing(ctx, kid, hasKID)}
		}
		if len(fit.Keys) == 0 {
			return nil, &jwtKeyError{jwtInvalid(fmt.Sprintf("the token has no kid and no key in the JWKS at %s can verify %s", k.url, alg))}
		}
		return fit, nil
	}
	if !jwtKeyFits(alg, got) {
		return nil, &jwtKeyError{jwtInvalid(fmt.Sprintf("the JWKS key %s (%s) cannot verify %s: wrong key type, or an RSA key under %d bits", jwtQuote(kid), jwtKeyKind(got), alg, jwtMinRSABits))}
	}
	return got, nil
}

// cached reports whether the key for kid is in the cache, without fetching;
// for a token without kid, whether any key is.
func (k *jwksKeys) cached(kid string, hasKID bool) bool {
	if !hasKID {
		all, err := k.cache.KeyReadAll(context.Background())
		return err == nil && len(all) > 0
	}
	_, err := k.cache.KeyRead(context.Background(), kid)
	return err == nil
}

// missing explains why no key was found for kid.
func (k *jwksKeys) missing(ctx context.Context, kid string, hasKID bool) error {
	fetched, lastErr := k.cache.status()
	empty := !k.cached("", false)
	var why string
	switch {
	case k.life.Err() != nil:
		return jwtUnavailable("the JWT verifier was closed (its configuration was unloaded); retry the request")
	case ctx.Err() != nil && empty:
		return jwtUnavailable(fmt.Sprintf("no keys from %s yet, and the request ended while waiting for them (%v)", k.url, ctx.Err()))
	case empty && fetched.IsZero() && lastErr != nil:
		return jwtUnavailable(fmt.Sprintf("no keys could be fetched from %s: %v; check jwks_url and that the identity provider is reachable from this server (fetches are retried at most once a minute)", k.url, lastErr))
	case empty && fetched.IsZero():
		return jwtUnavailable(fmt.Sprintf("no keys fetched from %s yet; retry shortly", k.url))
	case empty:
		return jwtUnavailable(fmt.Sprintf("the JWKS at %s holds no usable signing key (fetched %s); check the identity provider's key configuration", k.url, fetched.UTC().Format(time.RFC3339)))
	case !hasKID:
		return jwtInvalid(fmt.Sprintf("the token has no kid and no key from %s verifies it", k.url))
	case ctx.Err() != nil:
		why = fmt.Sprintf("; the request ended while waiting for a refresh (%v)", ctx.Err())
	case lastErr != nil:
		why = fmt.Sprintf("; the last fetch failed: %v", lastErr)
	default:
		why = "; the key set is fetched again for an unknown kid at most once a minute"
	}
	return jwtInvalid(fmt.Sprintf("unknown key id %s: not in the JWKS at %s (fetched %s)%s. The token was signed by another issuer or with a key the provider has not published", jwtQuote(kid), k.url, fetched.UTC().Format(time.RFC3339), why))
}

// jwksCache is the in-memory key set jwkset refreshes. It records when a
// fetch last succeeded and why the last one failed, for Verify's errors.
type jwksCache struct {
	jwkset.Storage

	mu      sync.Mutex
	fetched time.Time
	lastErr error
}

// KeyReplaceAll is how jwkset stores a freshly fetched key set, so it marks
// a successful fetch.
func (c *jwksCache) KeyReplaceAll(ctx context.Context, keys []jwkset.JWK) error {
	if err := c.Storage.KeyReplaceAll(ctx, keys); err != nil {
		return err
	}
	c.mu.Lock()
	c.fetched, c.lastErr = time.Now(), nil
	c.mu.Unlock()
	return nil
}

func (c *jwksCache) failed(err error) {
	c.mu.Lock()
	c.lastErr = err
	c.mu.Unlock()
}

func (c *jwksCache) status() (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fetched, c.lastErr
}

// jwksClient returns the client for JWKS fetches: base, or else the
// origin-pinned client of pinnedfetch for jwksURL, with a timeout (a JWKS
// fetch is no stream), and response bodies capped at jwksMaxBytes.
func jwksClient(base *http.Client, jwksURL string) (*http.Client, error) {
	var c http.Client
	if base != nil {
		c = *base
	} else {
		pinned, err := pinnedfetch.New(jwksURL, nil, pinnedfetch.WithMaxRedirects(jwksMaxRedirects))
		if err != nil {
			return nil, fmt.Errorf("jwt: jwks_url: %w", err)
		}
		c = *pinned
		c.Timeout = jwksFetchTimeout
	}
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	c.Transport = jwksCappedTransport{rt}
	return &c, nil
}

// jwksCappedTransport caps response bodies, because jwkset decodes the JWKS
// response without a limit.
type jwksCappedTransport struct{ base http.RoundTripper }

func (t jwksCappedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &jwksCappedBody{ReadCloser: resp.Body, left: jwksMaxBytes + 1}
	return resp, nil
}

type jwksCappedBody struct {
	io.ReadCloser
	left int64
}

func (b *jwksCappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("the JWKS response is larger than %d bytes", jwksMaxBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
