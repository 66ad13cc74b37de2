package sessionid

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"

	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
)

// KeySize is the length of the key [New] takes: 32 bytes,
// an AES-256 key.
const KeySize = 32

// MaxUpstream bounds the upstream session id that [Sealer.Seal]
// is given by the pass-through route. The MCP spec asks only for visible
// ASCII; real servers use a UUID or a short random string.
const MaxUpstream = 512

// sessionIDVersion is the first byte of every sealed id, so that the format
// can change (a new cipher, a key id for rotation) without a new header.
// Version 2 is sealed by internal/seal, with the purpose bound in; version
// 1, from earlier releases, is the same cipher and layout without it, and
// still opens.
const (
	sessionIDVersion        = 2
	sessionIDVersionUnbound = 1
)

// sessionIDPurpose is the purpose the key seals session ids for.
const sessionIDPurpose = "session id"

// ErrUnknown is wrapped by every [Sealer.Open] failure. The
// transport answers it as the spec's unknown session (HTTP 404), which tells
// a client to initialize again.
var ErrUnknown = errors.New("unknown session")

// Sealer seals an upstream's Mcp-Session-Id into the id the gateway gives
// out, and opens it again, bound to one principal and one route.
//
// A sealed id is base64url (no padding) of a version byte and the
// upstream id sealed by internal/seal (a fresh random 96-bit nonce and the
// AES-256-GCM sealing). The associated data is the purpose, the version,
// the principal's token id and the route, each length-prefixed so that no
// pair of (token id, route) can be read as another. An id therefore opens only for the token and the route it was
// sealed for: presented with another token, on another route, altered or
// forged, it fails to open, and the caller cannot tell these cases apart
// (nor can an attacker). The upstream id never reaches a client.
//
// Each Seal is one AES-GCM operation with a key expanded once by
// [New]: no key derivation per request. Open is one too, the
// first time it opens an id for a principal and route: what it opened is
// kept in a small table (see opened), since a client sends its id on every
// request. A Sealer is safe for concurrent use.
type Sealer struct {
	sealer *seal.Sealer
	// opened remembers ids that opened: Open is a function of the id, the
	// principal and the route under this key, which never changes, so a
	// remembered answer is the one AES-GCM would give. A slot holds the
	// last id that opened among those its hash picks; an id found there
	// for another principal or route is opened as if it were not there
	// (and fails). The hash's seed is this process's, so no client can
	// choose ids that share a slot; sharing one costs only an AES-GCM
	// operation. Its memory is bounded by openedSlots ids.
	opened [openedSlots]atomic.Pointer[openedID]
	seed   maphash.Seed
	maxLen int // the longest id Seal gives out, for the longest upstream id
}

// openedSlots is how many opened ids a Sealer remembers at most.
const openedSlots = 1024

type openedID struct{ id, principal, route, upstream string }

// New returns a Sealer for a 32-byte key. Keep the key across
// config reloads (and share it between replicas): ids sealed under a key that
// is gone no longer open, and their clients must initialize again.
func New(key []byte) (*Sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("session key is %d bytes; give %d random bytes (crypto/rand), kept across reloads", len(key), KeySize)
	}
	sl, err := seal.New(key, sessionIDPurpose)
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	return &Sealer{sealer: sl, seed: maphash.MakeSeed(),
		maxLen: base64.RawURLEncoding.EncodedLen(1 + MaxUpstream + sl.Overhead())}, nil
}

// Seal returns the id to give a client for upstreamID, bound to principal
// (the token id of the [policy.Principal] the session belongs to) and route
// (such as "broker:github"). Every call uses a fresh nonce, so sealing one
// upstream id twice gives two different ids that both open to it.
func (s *Sealer) Seal(upstreamID, principal, route string) string {
	raw := make([]byte, 1, 1+len(upstreamID)+s.sealer.Overhead())
	raw[0] = sessionIDVersion
	raw = s.sealer.Seal(raw, []byte(upstreamID), associatedData(sessionIDVersion, principal, route))
	return base64.RawURLEncoding.EncodeToString(raw)
}

// Open returns the upstream session id sealed in id, if id was sealed by
// [Sealer.Seal] under the same key for the same principal and route.
// Every failure wraps [ErrUnknown]; the error says whether id was
// malformed or did not open, never which of principal, route or key was
// wrong (that is not knowable).
func (s *Sealer) Open(id, principal, route string) (string, error) {
	if len(id) > s.maxLen {
		// Refused before it is hashed: no id this long was given out.
		return s.open(id, principal, route)
	}
	slot := &s.opened[maphash.String(s.seed, id)%openedSlots]
	if o := slot.Load(); o != nil && o.id == id && o.principal == principal && o.route == route {
		return o.upstream, nil
	}
	upstream, err := s.open(id, principal, route)
	if err == nil {
		slot.Store(&openedID{id: id, principal: principal, route: route, upstream: upstream})
	}
	return upstream, err
}

// open is Open without the table of opened ids.
func (s *Sealer) open(id, principal, route string) (string, error) {
	if len(id) > s.maxLen {
		return "", fmt.Errorf("%w: the session id is too long to be one this gateway gave out", ErrUnknown)
	}
	raw, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(raw) < 1+s.sealer.Overhead() {
		return "", fmt.Errorf("%w: the session id is not one this gateway gives out", ErrUnknown)
	}
	var plain []byte
	switch raw[0] {
	case sessionIDVersion:
		plain, err = s.sealer.Open(nil, raw[1:], associatedData(sessionIDVersion, principal, route))
	case sessionIDVersionUnbound:
		plain, err = s.sealer.OpenUnbound(nil, raw[1:], associatedData(sessionIDVersionUnbound, principal, route))
	default:
		return "", fmt.Errorf("%w: the session id is not one this gateway gives out", ErrUnknown)
	}
	if err != nil {
		return "", fmt.Errorf("%w: the session id was not given to this token on this route", ErrUnknown)
	}
	return string(plain), nil
}

// associatedData binds a sealed id to its principal and route. The lengths
// make the encoding unambiguous even if a token id holds a NUL byte (a JWT
// subject can).
func associatedData(version byte, principal, route string) []byte {
	ad := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(principal)+len(route))
	ad = append(ad, version)
	ad = binary.AppendUvarint(ad, uint64(len(principal)))
	ad = append(ad, principal...)
	ad = binary.AppendUvarint(ad, uint64(len(route)))
	return append(ad, route...)
}

// Valid reports whether an upstream's Mcp-Session-Id is one the
// gateway seals: 1 to [MaxUpstream] visible ASCII characters
// (0x21 to 0x7E), as the MCP spec requires.
func Valid(s string) bool {
	if s == "" || len(s) > MaxUpstream {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
