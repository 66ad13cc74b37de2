package upstreamauth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// KeyPrefix is the storage key prefix of the upstream OAuth records; the
// record of upstream u is at KeyPrefix + u.
const KeyPrefix = "zidane/upstream-oauth/"

// StorageKey returns the storage key of an upstream's record.
func StorageKey(upstream string) string { return KeyPrefix + upstream }

// sealVersion is the first byte of a sealed record.
const sealVersion = 1

// record is what the gateway keeps about one upstream, sealed with
// AES-256-GCM under the caller's key before it reaches storage: the tokens,
// the client registration, and what discovery found, so that a restarted
// gateway (or another replica) can refresh without discovering again.
type record struct {
	// Tokens.
	AccessToken  string    `json:"access_token,omitempty"`
	RefreshToken string    `json:"refresh_token,omitempty"`
	TokenType    string    `json:"token_type,omitempty"`
	Expiry       time.Time `json:"expiry,omitzero"`
	IssuedAt     time.Time `json:"issued_at,omitzero"`
	Scopes       []string  `json:"scopes,omitempty"` // granted

	// Discovery.
	Resource           string   `json:"resource,omitempty"`
	Issuer             string   `json:"issuer,omitempty"`
	TokenEndpoint      string   `json:"token_endpoint,omitempty"`
	RevocationEndpoint string   `json:"revocation_endpoint,omitempty"`
	AuthMethods        []string `json:"auth_methods,omitempty"` // token_endpoint_auth_methods_supported

	// Registration (dynamic, or the CIMD URL) at Issuer for RedirectURL.
	Client *registration `json:"client,omitempty"`

	// NeedScopes are scopes the upstream asked for (403
	// insufficient_scope) that the next login must request.
	NeedScopes []string `json:"need_scopes,omitempty"`
	// Reason, when there are no tokens, says why (for State after a
	// restart).
	Reason string `json:"reason,omitempty"`
}

// registration is a client registered by the gateway itself.
type registration struct {
	Issuer       string `json:"issuer"`
	RedirectURL  string `json:"redirect_url,omitempty"`
	ClientID     string `json:"client_id"`
	ClientSecret string `json:"client_secret,omitempty"`
	AuthMethod   string `json:"auth_method,omitempty"`
	// Kind is "dcr" or "cimd".
	Kind string `json:"kind"`
}

func (r *record) clone() *record {
	if r == nil {
		return nil
	}
	c := *r
	c.Scopes = slices.Clone(r.Scopes)
	c.AuthMethods = slices.Clone(r.AuthMethods)
	c.NeedScopes = slices.Clone(r.NeedScopes)
	if r.Client != nil {
		cl := *r.Client
		c.Client = &cl
	}
	return &c
}

// clearTokens forgets the tokens, keeping the registration and discovery.
func (r *record) clearTokens(reason string) {
	r.AccessToken, r.RefreshToken, r.TokenType = "", "", ""
	r.Expiry, r.IssuedAt = time.Time{}, time.Time{}
	r.Scopes = nil
	r.Reason = reason
}

// sealer encrypts records with AES-256-GCM; the upstream's name is the
// associated data, so a record copied to another upstream's key does not
// open.
type sealer struct {
	aead cipher.AEAD
	ad   []byte
}

func newSealer(key []byte, upstream string) (*sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("upstreamauth: the storage key must be 32 bytes (AES-256), got %d", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead, ad: []byte("zidane upstream-oauth v1\x00" + upstream)}, nil
}

func (s *sealer) seal(r *record) ([]byte, error) { return s.sealValue(r, "") }

// sealValue seals v's JSON; what is a record, what a pending login (and
// whose) is told apart by what, which is bound to the sealed bytes.
func (s *sealer) sealValue(v any, what string) ([]byte, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+s.aead.NonceSize(), 1+s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	out[0] = sealVersion
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, err
	}
	out = s.aead.Seal(out, out[1:1+s.aead.NonceSize()], plain, s.adFor(what))
	clear(plain)
	return out, nil
}

func (s *sealer) adFor(what string) []byte {
	if what == "" {
		return s.ad
	}
	return append(append(slices.Clone(s.ad), 0), what...)
}

var errUnseal = errors.New("the stored OAuth record does not decrypt with the configured key (was the key changed, or the record copied from another upstream?); run the login again, which replaces it")

func (s *sealer) open(b []byte) (*record, error) {
	var r record
	if err := s.openValue(b, "", &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// openValue opens what sealValue sealed with the same what, into v.
func (s *sealer) openValue(b []byte, what string, v any) error {
	n := s.aead.NonceSize()
	if len(b) < 1+n+s.aead.Overhead() || b[0] != sealVersion {
		return errUnseal
	}
	plain, err := s.aead.Open(nil, b[1:1+n], b[1+n:], s.adFor(what))
	if err != nil {
		return errUnseal
	}
	err = json.Unmarshal(plain, v)
	clear(plain)
	if err != nil {
		return errUnseal
	}
	return nil
}
