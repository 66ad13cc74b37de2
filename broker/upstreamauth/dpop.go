package upstreamauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// Values of Config.DPoP: whether the gateway asks for DPoP-bound tokens
// (RFC 9449, SEP-1932).
const (
	// DPoPAuto (the default, also ""): when the authorization server lists
	// ES256 in dpop_signing_alg_values_supported, or the resource's
	// metadata says dpop_bound_access_tokens_required.
	DPoPAuto = "auto"
	// DPoPOff: never; tokens are Bearer.
	DPoPOff = "off"
	// DPoPRequired: always, and a token that comes back as Bearer is
	// refused, so a token the gateway holds is useless without its key.
	DPoPRequired = "required"
)

// dpopAlg is the one algorithm the gateway signs proofs with.
const dpopAlg = "ES256"

// maxNonce bounds a DPoP-Nonce a server hands out; a longer one is not
// kept, nor echoed.
const maxNonce = 512

// dpopKey is the key one grant's tokens are bound to: a P-256 key made by
// the gateway for that grant. Its private half lives in memory and, sealed
// with the record (internal/seal), in storage, so that every replica
// proves possession with the same key; it never appears in a log, an
// error or a listing.
type dpopKey struct {
	der    []byte // PKCS #8, as sealed in the record
	jkt    string // RFC 7638 SHA-256 thumbprint of the public key
	signer jose.Signer
}

// newDPoPKey makes a key for a new grant.
func newDPoPKey() (*dpopKey, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	return dpopKeyOf(priv, der)
}

// parseDPoPKey reads a key sealed with a record.
func parseDPoPKey(der []byte) (*dpopKey, error) {
	der = slices.Clone(der) // the record's copy is cleared when it is replaced
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, errors.New("the stored DPoP key does not parse")
	}
	priv, ok := k.(*ecdsa.PrivateKey)
	if !ok || priv.Curve != elliptic.P256() {
		return nil, errors.New("the stored DPoP key is not a P-256 key")
	}
	return dpopKeyOf(priv, der)
}

// dpopKeyOf builds the signer and thumbprint with go-jose, whose JWK
// encoding and RFC 7638 thumbprint are what authorization servers compare
// with cnf.jkt; writing them here would be a second, untested encoding.
func dpopKeyOf(priv *ecdsa.PrivateKey, der []byte) (*dpopKey, error) {
	pub := jose.JSONWebKey{Key: &priv.PublicKey}
	tp, err := pub.Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, err
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: priv}, (&jose.SignerOptions{EmbedJWK: true}).WithType("dpop+jwt"))
	if err != nil {
		return nil, err
	}
	return &dpopKey{der: der, jkt: base64.RawURLEncoding.EncodeToString(tp), signer: signer}, nil
}

// dpopClaims are the claims of a proof (RFC 9449 §4.2).
type dpopClaims struct {
	JTI   string `json:"jti"`
	HTM   string `json:"htm"`
	HTU   string `json:"htu"`
	IAT   int64  `json:"iat"`
	ATH   string `json:"ath,omitempty"`
	Nonce string `json:"nonce,omitempty"`
}

// proof signs a fresh proof for a request of method to u: a new jti each
// time, so no proof is ever presented twice, htu without query and
// fragment, ath when it goes with an access token (ath: the hash of it),
// and the server's nonce when it gave one.
func (k *dpopKey) proof(method string, u *url.URL, ath, nonce string, now time.Time) (string, error) {
	htu := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	payload, err := json.Marshal(dpopClaims{JTI: rand.Text(), HTM: method, HTU: htu.String(), IAT: now.Unix(), ATH: ath, Nonce: nonce})
	if err != nil {
		return "", err
	}
	jws, err := k.signer.Sign(payload)
	if err != nil {
		return "", errors.New("signing the DPoP proof failed")
	}
	return jws.CompactSerialize()
}

// accessTokenHash is a proof's ath for token (RFC 9449 §4.2).
func accessTokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// validNonce reports whether s is a nonce as RFC 9449 §8.1 defines it
// (1*NQCHAR), of bounded length.
func validNonce(s string) bool {
	if s == "" || len(s) > maxNonce {
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

// Roles of the servers whose nonces are kept apart: the authorization
// server's and the upstream's, even on one origin.
const (
	nonceAS = "as"
	nonceRS = "rs"
)

// nonces keeps the last nonce each server handed out (RFC 9449 §8, §9),
// by role and origin: a nonce goes back only to the server that gave it.
type nonces struct {
	mu sync.Mutex
	m  map[string]string
}

func nonceKey(role string, u *url.URL) string { return role + " " + pinnedfetch.Origin(u) }

// get returns the nonce to send with a proof for u ("" when none).
func (n *nonces) get(role string, u *url.URL) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.m[nonceKey(role, u)]
}

// note keeps the DPoP-Nonce of an answer from u, when it holds a valid
// one, and returns it ("" otherwise).
func (n *nonces) note(role string, u *url.URL, h http.Header) string {
	values := h.Values("DPoP-Nonce")
	if len(values) != 1 || !validNonce(values[0]) {
		return ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[string]string{}
	}
	if _, ok := n.m[nonceKey(role, u)]; !ok && len(n.m) >= 2*maxOrigins {
		clear(n.m)
	}
	n.m[nonceKey(role, u)] = values[0]
	return values[0]
}

// rsNonceChallenge reports whether resp is an upstream's 401 asking for a
// DPoP nonce (RFC 9449 §9): a DPoP challenge with error="use_dpop_nonce".
func rsNonceChallenge(resp *http.Response) bool {
	if resp.StatusCode != http.StatusUnauthorized {
		return false
	}
	cs, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(cs, func(c oauthex.Challenge) bool { return c.Scheme == "dpop" && c.Params["error"] == "use_dpop_nonce" })
}

// dpopMode is the configured mode, DPoPAuto when unset.
func (c Config) dpopMode() string {
	if c.DPoP == "" {
		return DPoPAuto
	}
	return c.DPoP
}

// wantDPoP decides whether to ask an authorization server for
// DPoP-bound tokens, from what it lists in
// dpop_signing_alg_values_supported (algs) and whether the resource
// requires bound tokens. known is false when the server's metadata was not
// read (token_url without discovery).
func (c *Client) wantDPoP(algs []string, resourceRequires, known bool) (bool, error) {
	switch c.cfg.dpopMode() {
	case DPoPOff:
		return false, nil
	case DPoPRequired:
		if known && !slices.Contains(algs, dpopAlg) {
			if len(algs) == 0 {
				return false, errors.New("dpop required, but the authorization server does not offer DPoP (no dpop_signing_alg_values_supported in its metadata); set dpop auto or off for it")
			}
			return false, fmt.Errorf("dpop required, but the authorization server takes DPoP proofs signed with %s only, and the gateway signs %s; set dpop auto or off for it", clip(strings.Join(algs, " "), 100), dpopAlg)
		}
		return true, nil
	}
	return slices.Contains(algs, dpopAlg) || resourceRequires, nil
}

// checkTokenType applies the binding rules to a token response: a DPoP
// token only when a proof was sent (it could not be used otherwise), and,
// with dpop required, nothing else.
func (c *Client) checkTokenType(tr *tokenResponse, key *dpopKey, endpoint string) error {
	dpop := strings.EqualFold(tr.TokenType, "DPoP")
	switch {
	case dpop && key == nil:
		return fmt.Errorf("POST %s: the authorization server issued a DPoP-bound token, but no DPoP proof was sent; set dpop auto or required for it", shown(endpoint))
	case !dpop && key != nil && c.cfg.dpopMode() == DPoPRequired:
		return fmt.Errorf("POST %s: the authorization server issued a %s token where dpop required asks for a DPoP-bound one; the token is not used", shown(endpoint), clip(tr.TokenType, 32))
	case !dpop && key != nil:
		c.logger.Info("upstream oauth: the authorization server ignored the DPoP proof and issued a Bearer token", "upstream", c.name)
	}
	return nil
}
