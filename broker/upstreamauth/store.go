package upstreamauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
)

// KeyPrefix is the storage key prefix of the upstream OAuth records; the
// record of upstream u is at KeyPrefix + u.
const KeyPrefix = "zidane/upstream-oauth/"

// StorageKey returns the storage key of an upstream's record.
func StorageKey(upstream string) string { return KeyPrefix + upstream }

// sealVersion is the first byte of a sealed record: 2, sealed by
// internal/seal with its purpose bound in; 1 is the earlier releases'
// record (the same cipher and layout without the purpose), which still
// opens and is sealed again as 2 when the record next changes.
const (
	sealVersion        = 2
	sealVersionUnbound = 1
)

// record is what the gateway keeps about one upstream, sealed with
// AES-256-GCM under the caller's key before it reaches storage: the tokens,
// the client registration, and what discovery found, so that a restarted
// gateway (or another replica) can refresh without discovering again.
type record struct {
	// Tokens.
	AccessToken  string    `json:"access_token,omitempty"`
	RefreshToken string    `json:"refresh_token,omitempty"`
	TokenType    string    `json:"token_type,omitempty"` // "Bearer" or "DPoP"
	Expiry       time.Time `json:"expiry,omitzero"`
	IssuedAt     time.Time `json:"issued_at,omitzero"`
	Scopes       []string  `json:"scopes,omitempty"` // granted
	// DPoPKey is the PKCS #8 private key a DPoP token (and its refresh
	// token) is bound to. It is sealed with the rest of the record, so
	// every replica proves possession with the same key.
	DPoPKey []byte `json:"dpop_key,omitempty"`

	// Discovery.
	Resource           string   `json:"resource,omitempty"`
	Issuer             string   `json:"issuer,omitempty"`
	TokenEndpoint      string   `json:"token_endpoint,omitempty"`
	RevocationEndpoint string   `json:"revocation_endpoint,omitempty"`
	AuthMethods        []string `json:"auth_methods,omitempty"` // token_endpoint_auth_methods_supported
	// DPoPAlgs is the server's dpop_signing_alg_values_supported, and
	// DPoPRequired the resource's dpop_bound_access_tokens_required: what
	// the machine grants decide DPoP from.
	DPoPAlgs     []string `json:"dpop_algs,omitempty"`
	DPoPRequired bool     `json:"dpop_required,omitempty"`

	// Registration (dynamic, or the CIMD URL) at Issuer for RedirectURL.
	Client *registration `json:"client,omitempty"`

	// NeedScopes are scopes the upstream asked for (403
	// insufficient_scope) that the next login must request.
	NeedScopes []string `json:"need_scopes,omitempty"`
	// Reason, when there are no tokens, says why (for State after a
	// restart).
	Reason string `json:"reason,omitempty"`

	// Owner is the person a per-person record belongs to (empty for the
	// upstream's shared record). Its storage key names the owner only by
	// a keyed hash; the name is here, sealed, for the listings.
	Owner string `json:"owner,omitempty"`
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
	c.DPoPKey = slices.Clone(r.DPoPKey)
	c.DPoPAlgs = slices.Clone(r.DPoPAlgs)
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
	clear(r.DPoPKey)
	r.DPoPKey = nil
	r.Expiry, r.IssuedAt = time.Time{}, time.Time{}
	r.Scopes = nil
	r.Reason = reason
}

// sealer seals records with the module's one sealer (internal/seal); the
// upstream's name is in the associated data, so a record copied to
// another upstream's key does not open.
type sealer struct {
	s        *seal.Sealer
	upstream string
	// owner, for a person's record, is the keyed hash of the person that
	// names the record's storage key: bound in too, so that a record
	// copied under another person's key does not open.
	owner   string
	unbound []byte // the associated data of a version 1 record (earlier releases)
}

// sealPurpose is the purpose the storage key seals records for.
const sealPurpose = "upstream oauth record"

func newSealer(key []byte, upstream string) (*sealer, error) {
	if len(key) != seal.KeySize {
		return nil, fmt.Errorf("upstreamauth: the storage key must be 32 bytes (AES-256), got %d", len(key))
	}
	sl, err := seal.New(key, sealPurpose)
	if err != nil {
		return nil, err
	}
	return &sealer{s: sl, upstream: upstream, unbound: []byte("zidane upstream-oauth v1\x00" + upstream)}, nil
}

// forOwner returns the sealer of the person whose keyed hash is owner:
// the same key, with the owner bound in.
func (s *sealer) forOwner(owner string) *sealer {
	return &sealer{s: s.s, upstream: s.upstream, owner: owner}
}

// ad is the associated data of what, for this upstream (and owner).
func (s *sealer) ad(what string) []byte {
	if s.owner == "" {
		return seal.AD(s.upstream, what)
	}
	return seal.AD(s.upstream, what, "owner", s.owner)
}

func (s *sealer) seal(r *record) ([]byte, error) { return s.sealValue(r, "") }

// sealValue seals v's JSON; what is a record, what a pending login (and
// whose) is told apart by what, which is bound to the sealed bytes.
func (s *sealer) sealValue(v any, what string) ([]byte, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1, 1+len(plain)+s.s.Overhead())
	out[0] = sealVersion
	out = s.s.Seal(out, plain, s.ad(what))
	clear(plain)
	return out, nil
}

// unboundAD is the associated data a version 1 record was sealed with.
func (s *sealer) unboundAD(what string) []byte {
	if what == "" {
		return s.unbound
	}
	return append(append(slices.Clone(s.unbound), 0), what...)
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
	if len(b) < 1+s.s.Overhead() {
		return errUnseal
	}
	var plain []byte
	var err error
	switch b[0] {
	case sealVersion:
		plain, err = s.s.Open(nil, b[1:], s.ad(what))
	case sealVersionUnbound:
		if s.owner != "" {
			// Per-person records came after version 1.
			return errUnseal
		}
		plain, err = s.s.OpenUnbound(nil, b[1:], s.unboundAD(what))
	default:
		return errUnseal
	}
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
