package broker

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
)

// SessionKeySize is the length of the key [NewSessionIDs] takes: 32 bytes,
// an AES-256 key.
const SessionKeySize = 32

// MaxUpstreamSessionID bounds the upstream session id that [SessionIDs.Seal]
// is given by the pass-through route. The MCP spec asks only for visible
// ASCII; real servers use a UUID or a short random string.
const MaxUpstreamSessionID = 512

// sessionIDVersion is the first byte of every sealed id, so that the format
// can change (a new cipher, a key id for rotation) without a new header.
const sessionIDVersion = 1

// ErrUnknownSession is wrapped by every [SessionIDs.Open] failure. The
// transport answers it as the spec's unknown session (HTTP 404), which tells
// a client to initialize again.
var ErrUnknownSession = errors.New("unknown session")

// SessionIDs seals an upstream's Mcp-Session-Id into the id the gateway gives
// out, and opens it again, bound to one principal and one route.
//
// A sealed id is base64url (no padding) of a version byte, a fresh random
// 96-bit nonce and the AES-256-GCM sealing of the upstream id. The
// associated data is the version, the principal's token id and the route,
// each length-prefixed so that no pair of (token id, route) can be read as
// another. An id therefore opens only for the token and the route it was
// sealed for: presented with another token, on another route, altered or
// forged, it fails to open, and the caller cannot tell these cases apart
// (nor can an attacker). The upstream id never reaches a client.
//
// Each Seal is one AES-GCM operation with a key expanded once by
// [NewSessionIDs]: no key derivation per request. Open is one too, the
// first time it opens an id for a principal and route: what it opened is
// kept in a small table (see opened), since a client sends its id on every
// request. A SessionIDs is safe for concurrent use.
type SessionIDs struct {
	aead cipher.AEAD
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

// openedSlots is how many opened ids a SessionIDs remembers at most.
const openedSlots = 1024

type openedID struct{ id, principal, route, upstream string }

// NewSessionIDs returns a SessionIDs for a 32-byte key. Keep the key across
// config reloads (and share it between replicas): ids sealed under a key that
// is gone no longer open, and their clients must initialize again.
func NewSessionIDs(key []byte) (*SessionIDs, error) {
	if len(key) != SessionKeySize {
		return nil, fmt.Errorf("session key is %d bytes; give %d random bytes (crypto/rand), kept across reloads", len(key), SessionKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	return &SessionIDs{aead: aead, seed: maphash.MakeSeed(),
		maxLen: base64.RawURLEncoding.EncodedLen(1 + aead.NonceSize() + MaxUpstreamSessionID + aead.Overhead())}, nil
}

// Seal returns the id to give a client for upstreamID, bound to principal
// (the token id of the [policy.Principal] the session belongs to) and route
// (such as "broker:github"). Every call uses a fresh nonce, so sealing one
// upstream id twice gives two different ids that both open to it.
func (s *SessionIDs) Seal(upstreamID, principal, route string) string {
	ns := s.aead.NonceSize()
	raw := make([]byte, 1+ns, 1+ns+len(upstreamID)+s.aead.Overhead())
	raw[0] = sessionIDVersion
	rand.Read(raw[1 : 1+ns]) // never fails: crypto/rand.Read panics rather than return short
	raw = s.aead.Seal(raw, raw[1:1+ns], []byte(upstreamID), associatedData(principal, route))
	return base64.RawURLEncoding.EncodeToString(raw)
}

// Open returns the upstream session id sealed in id, if id was sealed by
// [SessionIDs.Seal] under the same key for the same principal and route.
// Every failure wraps [ErrUnknownSession]; the error says whether id was
// malformed or did not open, never which of principal, route or key was
// wrong (that is not knowable).
func (s *SessionIDs) Open(id, principal, route string) (string, error) {
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
func (s *SessionIDs) open(id, principal, route string) (string, error) {
	ns, overhead := s.aead.NonceSize(), s.aead.Overhead()
	if len(id) > s.maxLen {
		return "", fmt.Errorf("%w: the session id is too long to be one this gateway gave out", ErrUnknownSession)
	}
	raw, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(raw) < 1+ns+overhead || raw[0] != sessionIDVersion {
		return "", fmt.Errorf("%w: the session id is not one this gateway gives out", ErrUnknownSession)
	}
	plain, err := s.aead.Open(raw[1+ns:1+ns], raw[1:1+ns], raw[1+ns:], associatedData(principal, route))
	if err != nil {
		return "", fmt.Errorf("%w: the session id was not given to this token on this route", ErrUnknownSession)
	}
	return string(plain), nil
}

// associatedData binds a sealed id to its principal and route. The lengths
// make the encoding unambiguous even if a token id holds a NUL byte (a JWT
// subject can).
func associatedData(principal, route string) []byte {
	ad := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(principal)+len(route))
	ad = append(ad, sessionIDVersion)
	ad = binary.AppendUvarint(ad, uint64(len(principal)))
	ad = append(ad, principal...)
	ad = binary.AppendUvarint(ad, uint64(len(route)))
	return append(ad, route...)
}
