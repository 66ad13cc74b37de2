package cluster

import (
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
)

// KeySize is the size of the cluster key.
const KeySize = 32

// ErrUnsealed: a stored value did not open under this storage's key: it was
// written with another key, altered, or moved from another key.
var ErrUnsealed = errors.New("stored value does not open under the cluster key: written with another key, altered, or moved from another key")

// Derive returns the key for purpose derived from the cluster key: every
// use of the cluster key has its own.
func Derive(clusterKey []byte, purpose string) ([]byte, error) {
	if len(clusterKey) != KeySize {
		return nil, fmt.Errorf("the cluster key must be %d bytes, not %d", KeySize, len(clusterKey))
	}
	return hkdf.Key(sha256.New, clusterKey, nil, "caddy-zidane-mcp "+purpose, KeySize)
}

// sealer seals what the replicas share for one purpose (the storage's
// values, a bus's messages, the node registry, an event stream) with the
// module's one sealer (internal/seal), under the key derived from the
// cluster key for that purpose: a NATS user who can read the buckets and
// subjects learns nothing of the values (private keys of TLS
// certificates, transcripts), and one who can write them cannot make a
// value a replica accepts (a token, say). Each value is bound to where it
// is kept or sent by its associated data.
type sealer struct{ s *seal.Sealer }

func newSealer(clusterKey []byte, purpose string) (*sealer, error) {
	k, err := Derive(clusterKey, purpose)
	if err != nil {
		return nil, err
	}
	s, err := seal.New(k, purpose)
	if err != nil {
		return nil, err
	}
	return &sealer{s: s}, nil
}

// where is the additional data that binds a sealed value to its place.
func where(kind, bucket, name string) []byte {
	return []byte(kind + "\x00" + bucket + "\x00" + name)
}

func (s *sealer) seal(dst, plain, ad []byte) []byte { return s.s.Seal(dst, plain, ad) }

// open opens what seal sealed with ad. It also opens what this package
// sealed before the purpose was bound into the associated data (the same
// key, cipher and layout), so that values stored by earlier releases, and
// messages from replicas not yet upgraded, still open.
func (s *sealer) open(sealed, ad []byte) ([]byte, error) {
	p, err := s.s.Open(nil, sealed, ad)
	if err != nil {
		p, err = s.s.OpenUnbound(nil, sealed, ad)
	}
	if err != nil {
		return nil, ErrUnsealed
	}
	return p, nil
}
