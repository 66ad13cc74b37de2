package cluster

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
)

// KeySize is the size of the cluster key.
const KeySize = 32

// ErrUnsealed: a stored value did not open under this storage's key: it was
// written with another key, altered, or moved from another key.
var ErrUnsealed = errors.New("stored value does not open under the cluster key: written with another key, altered, or moved from another key")

// sealer seals what the storage writes with a key derived from the cluster
// key, so that a NATS user who can read the buckets learns nothing of the
// values (private keys of TLS certificates, transcripts) and one who can
// write them cannot make a value this storage accepts (a token, say).
// Each value is bound to where it is stored.
type sealer struct {
	aead cipher.AEAD
}

// Derive returns the key for purpose derived from the cluster key: every
// use of the cluster key has its own.
func Derive(clusterKey []byte, purpose string) ([]byte, error) {
	if len(clusterKey) != KeySize {
		return nil, fmt.Errorf("the cluster key must be %d bytes, not %d", KeySize, len(clusterKey))
	}
	return hkdf.Key(sha256.New, clusterKey, nil, "caddy-zidane-mcp "+purpose, KeySize)
}

func newSealer(clusterKey []byte) (*sealer, error) {
	aead, err := aeadFor(clusterKey, "storage v1")
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

// where is the additional data that binds a sealed value to its place.
func where(kind, bucket, name string) []byte {
	return []byte(kind + "\x00" + bucket + "\x00" + name)
}

func (s *sealer) seal(dst, plain, ad []byte) []byte { return s.aead.Seal(dst, nil, plain, ad) }

func (s *sealer) open(sealed, ad []byte) ([]byte, error) {
	p, err := s.aead.Open(nil, nil, sealed, ad)
	if err != nil {
		return nil, ErrUnsealed
	}
	return p, nil
}

// aeadFor is AES-256-GCM, with random nonces, under the key derived from
// clusterKey for purpose: every sealed thing the replicas share has a
// purpose, and so a key, of its own.
func aeadFor(clusterKey []byte, purpose string) (cipher.AEAD, error) {
	k, err := Derive(clusterKey, purpose)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCMWithRandomNonce(block)
}
