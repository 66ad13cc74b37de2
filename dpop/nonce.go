package dpop

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"
)

// DefaultNoncePeriod is how long a nonce is issued for when [NewNonces] is
// given no period: a nonce is accepted for one to two periods after it was
// issued.
const DefaultNoncePeriod = 5 * time.Minute

// nonceLen is a nonce's length in bytes before base64url: the period's
// number (8) and its HMAC-SHA256 (32).
const nonceLen = 8 + sha256.Size

// nonceLabel keeps these MACs apart from any other made with the same key.
const nonceLabel = "caddy-zidane-mcp dpop nonce v1\x00"

// Nonces issues and checks server nonces (RFC 9449 §8) without storing
// any: a nonce is base64url(period || HMAC(key, period)), where period is
// the number of the time period it was issued in. Any holder of the key
// (every replica of a cluster) checks any nonce, and nothing is kept per
// nonce or per client, so a flood of requests costs no memory. The
// price is that a nonce is not single-use: it limits how far ahead a
// client can sign proofs (a proof is good only with a nonce of the
// current or the previous period), while each proof's single use is the
// jti's replay check.
type Nonces struct {
	key    []byte
	period time.Duration
}

// NewNonces returns nonces MACed with key (at least 32 bytes, secret,
// the same on every replica), issued for period (DefaultNoncePeriod when
// zero).
func NewNonces(key []byte, period time.Duration) (*Nonces, error) {
	if len(key) < 32 {
		return nil, errors.New("dpop: the nonce key must be at least 32 bytes")
	}
	if period <= 0 {
		period = DefaultNoncePeriod
	}
	return &Nonces{key: append([]byte(nil), key...), period: period}, nil
}

// Issue returns the nonce of now's period, for a DPoP-Nonce header.
func (n *Nonces) Issue(now time.Time) string {
	return base64.RawURLEncoding.EncodeToString(n.make(n.bucket(now)))
}

// Valid reports whether nonce was issued by a holder of the key in now's
// period or the one before: never a nonce from further back, nor one from
// a period that has not begun.
func (n *Nonces) Valid(nonce string, now time.Time) bool {
	if base64.RawURLEncoding.EncodedLen(nonceLen) != len(nonce) {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(nonce)
	if err != nil || len(b) != nonceLen {
		return false
	}
	cur := n.bucket(now)
	got := binary.BigEndian.Uint64(b)
	if got != cur && got+1 != cur {
		return false
	}
	return hmac.Equal(b, n.make(got))
}

func (n *Nonces) bucket(now time.Time) uint64 {
	return uint64(now.UnixNano() / int64(n.period))
}

func (n *Nonces) make(bucket uint64) []byte {
	b := make([]byte, 8, nonceLen)
	binary.BigEndian.PutUint64(b, bucket)
	m := hmac.New(sha256.New, n.key)
	m.Write([]byte(nonceLabel))
	m.Write(b)
	return m.Sum(b)
}
