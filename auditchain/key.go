package auditchain

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

var base64Std = base64.StdEncoding

// Signer signs checkpoints.
type Signer struct {
	priv ed25519.PrivateKey
	id   string
}

// ParseSigningKey reads a signing key: the 32-byte Ed25519 seed in base64
// (standard or URL alphabet, padded or not), as `openssl rand -base64 32`
// prints one. Its errors never show the value.
func ParseSigningKey(v string) (*Signer, error) {
	seed, err := decodeBase64(strings.TrimSpace(v))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("must be an Ed25519 seed of %d bytes in base64 (`openssl rand -base64 32`); the value given is not", ed25519.SeedSize)
	}
	return NewSigner(ed25519.NewKeyFromSeed(seed)), nil
}

// NewSigner signs with priv.
func NewSigner(priv ed25519.PrivateKey) *Signer {
	return &Signer{priv: priv, id: KeyID(priv.Public().(ed25519.PublicKey))}
}

// KeyID is the id a checkpoint names its key by.
func (s *Signer) KeyID() string { return s.id }

// Public is the key that verifies s's checkpoints.
func (s *Signer) Public() ed25519.PublicKey { return s.priv.Public().(ed25519.PublicKey) }

// KeyID names a public key: the first 8 bytes of its SHA-256, in hex.
func KeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:8])
}

// EncodePublicKey is pub in base64, the form ParsePublicKey reads.
func EncodePublicKey(pub ed25519.PublicKey) string { return base64Std.EncodeToString(pub) }

// ParsePublicKey reads a public key: 32 bytes in base64, or a PEM "PUBLIC
// KEY" block (as `openssl pkey -pubout` writes an Ed25519 key).
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	data = bytes.TrimSpace(data)
	if block, _ := pem.Decode(data); block != nil {
		if block.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("the PEM block is a %q, not a PUBLIC KEY: give the public key, never the signing key", block.Type)
		}
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("the PEM public key does not parse: %v", err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("the PEM public key is a %T, not an Ed25519 key", k)
		}
		return pub, nil
	}
	b, err := decodeBase64(string(data))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("give an Ed25519 public key: %d bytes in base64 (as `caddy zidane audit public-key` prints it), or a PEM PUBLIC KEY", ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

func decodeBase64(s string) ([]byte, error) {
	if s == "" {
		return nil, errors.New("empty")
	}
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}
