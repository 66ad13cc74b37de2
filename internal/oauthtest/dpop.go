package oauthtest

import (
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// DPoPProof is what a server made of one DPoP proof (RFC 9449) it was
// given: the proof's claims and the thumbprint of its key, or why it was
// refused.
type DPoPProof struct {
	JKT   string // RFC 7638 SHA-256 thumbprint of the proof's key
	JTI   string
	HTM   string
	HTU   string
	Nonce string
	Err   string // "" when the proof was accepted
}

// dpopAlgs are the proof algorithms the servers accept: asymmetric only
// (RFC 9449 §4.2).
var dpopAlgs = []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.RS256, jose.PS256, jose.EdDSA}

// dpopWindow bounds how far a proof's iat may be from the server's clock.
const dpopWindow = 5 * time.Minute

// checkProof verifies a DPoP proof for a request of method to htu at now
// (RFC 9449 §4.3): a dpop+jwt signed by the public key in its jwk header,
// htm and htu those of the request, a jti, an iat near now, and, when
// accessToken is set, an ath that hashes it. The nonce is returned for
// the caller to judge.
func checkProof(proof, method, htu, accessToken string, now time.Time) (DPoPProof, error) {
	var p DPoPProof
	jws, err := jose.ParseSignedCompact(proof, dpopAlgs)
	if err != nil {
		return p, fmt.Errorf("not a JWS with an asymmetric algorithm: %v", err)
	}
	if len(jws.Signatures) != 1 {
		return p, errors.New("not one signature")
	}
	h := jws.Signatures[0].Header
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != "dpop+jwt" {
		return p, fmt.Errorf("typ %q is not dpop+jwt", typ)
	}
	if h.JSONWebKey == nil || !h.JSONWebKey.IsPublic() {
		return p, errors.New("no public jwk header")
	}
	payload, err := jws.Verify(h.JSONWebKey)
	if err != nil {
		return p, errors.New("the signature does not verify with the jwk header")
	}
	tp, err := h.JSONWebKey.Thumbprint(crypto.SHA256)
	if err != nil {
		return p, err
	}
	p.JKT = base64.RawURLEncoding.EncodeToString(tp)
	var c struct {
		JTI   string `json:"jti"`
		HTM   string `json:"htm"`
		HTU   string `json:"htu"`
		IAT   *int64 `json:"iat"`
		ATH   string `json:"ath"`
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return p, errors.New("the claims are not JSON")
	}
	p.JTI, p.HTM, p.HTU, p.Nonce = c.JTI, c.HTM, c.HTU, c.Nonce
	switch {
	case c.JTI == "":
		return p, errors.New("no jti")
	case c.HTM != method:
		return p, fmt.Errorf("htm %q is not %s", c.HTM, method)
	case c.HTU != htu:
		return p, fmt.Errorf("htu %q is not %s", c.HTU, htu)
	case c.IAT == nil || now.Sub(time.Unix(*c.IAT, 0)).Abs() > dpopWindow:
		return p, errors.New("iat missing or too far from now")
	}
	if accessToken != "" {
		sum := sha256.Sum256([]byte(accessToken))
		if c.ATH != base64.RawURLEncoding.EncodeToString(sum[:]) {
			return p, errors.New("ath does not hash the access token")
		}
	}
	return p, nil
}
