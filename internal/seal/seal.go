// Package seal is the one way this module seals a value: AES-256-GCM with
// a random 96-bit nonce (crypto/cipher's NewGCMWithRandomNonce) under a
// 32-byte key, with the key's purpose bound in as associated data. Every
// sealed thing the gateway keeps or sends (cluster storage values and
// messages, upstream OAuth records, session ids, the aggregated route's
// requestStates) goes through a Sealer, so there is one nonce rule and one
// binding rule to get right, not four.
//
// A sealed value is the nonce, then the ciphertext and tag. A random nonce
// is safe for 2^32 seals under one key; each key here seals far fewer
// (the cluster derives a key per purpose, the other keys seal one kind of
// value each).
//
// The purpose is in the associated data, so a value sealed for one
// purpose never opens for another, even under the same key. Values sealed
// before this package (the same cipher and layout, with the associated
// data alone) open with [Sealer.OpenUnbound]; nothing seals that way any
// more.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
)

// KeySize is the size of a key: AES-256.
const KeySize = 32

// ErrOpen is every failure to open: the value was sealed under another
// key, for another purpose or other associated data, or was altered. Which
// one is not knowable, and no caller should guess.
var ErrOpen = errors.New("the sealed value does not open under this key and purpose")

// Sealer seals and opens values for one purpose under one key. It is safe
// for concurrent use.
type Sealer struct {
	aead    cipher.AEAD
	purpose []byte // the purpose, length-prefixed: the head of every associated data
}

// New returns a Sealer for purpose (a short fixed string such as "session
// id", never empty) under key, which must be KeySize bytes.
func New(key []byte, purpose string) (*Sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("a sealing key is %d bytes, not %d", KeySize, len(key))
	}
	if purpose == "" {
		return nil, errors.New("a sealing key needs a purpose")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, err
	}
	head := binary.AppendUvarint(nil, uint64(len(purpose)))
	return &Sealer{aead: aead, purpose: append(head, purpose...)}, nil
}

// Overhead is how many bytes sealing adds: the nonce and the tag.
func (s *Sealer) Overhead() int { return s.aead.NonceSize() + s.aead.Overhead() }

// Seal appends to dst the sealing of plaintext, bound to the purpose and
// to ad (where the value is kept, whose it is), and returns the result.
// Each call draws a new nonce, so sealing one plaintext twice gives two
// different values.
func (s *Sealer) Seal(dst, plaintext, ad []byte) []byte {
	return s.aead.Seal(dst, nil, plaintext, s.bind(ad))
}

// Open appends to dst what sealed holds, if it was sealed by a Sealer of
// the same key and purpose with the same ad; otherwise it returns ErrOpen.
func (s *Sealer) Open(dst, sealed, ad []byte) ([]byte, error) {
	if len(sealed) < s.Overhead() {
		return nil, ErrOpen
	}
	p, err := s.aead.Open(dst, nil, sealed, s.bind(ad))
	if err != nil {
		return nil, ErrOpen
	}
	return p, nil
}

// OpenUnbound opens a value that this module sealed before the purpose was
// bound in: the same cipher, key and layout, with ad alone as associated
// data. It exists so that values kept by earlier releases still open;
// nothing seals that way now.
func (s *Sealer) OpenUnbound(dst, sealed, ad []byte) ([]byte, error) {
	if len(sealed) < s.Overhead() {
		return nil, ErrOpen
	}
	p, err := s.aead.Open(dst, nil, sealed, ad)
	if err != nil {
		return nil, ErrOpen
	}
	return p, nil
}

// bind is the associated data of ad under this purpose: the length-
// prefixed purpose, then ad. The prefix makes the pair unambiguous, so no
// (purpose, ad) reads as another.
func (s *Sealer) bind(ad []byte) []byte {
	out := make([]byte, 0, len(s.purpose)+len(ad))
	return append(append(out, s.purpose...), ad...)
}

// AD joins parts into associated data that no other parts give: each is
// length-prefixed.
func AD(parts ...string) []byte {
	n := 0
	for _, p := range parts {
		n += binary.MaxVarintLen64 + len(p)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = binary.AppendUvarint(out, uint64(len(p)))
		out = append(out, p...)
	}
	return out
}
