package cluster

import (
	"errors"
	"fmt"
	"strings"
)

// A storage key is a slash-separated path ("certificates/acme/example.com/
// example.com.crt"); a JetStream KV key is a dot-separated list of tokens
// drawn from [-/_=.A-Za-z0-9], where the dot separates tokens and a token
// may not be empty. Each path segment becomes one token: bytes outside
// [-_A-Za-z0-9] are written as '=' and two upper-case hex digits, so the
// mapping is one-to-one, a segment's dots never split it into two tokens,
// and the subject wildcards ('*', '>') never reach NATS from a key.

// errEmptySegment is the error for a key with an empty path segment
// ("a//b", "/a", "a/"), which no file path has either.
var errEmptySegment = errors.New("storage key has an empty path segment")

const hexDigits = "0123456789ABCDEF"

func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// escapeSegment writes one path segment as one KV token.
func escapeSegment(b *strings.Builder, seg string) {
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if plainByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xF])
	}
}

// kvKey is the KV key of a storage key.
func kvKey(key string) (string, error) {
	if key == "" {
		return "", errors.New("storage key is empty")
	}
	var b strings.Builder
	b.Grow(len(key) + 8)
	for i, seg := range strings.Split(key, "/") {
		if seg == "" {
			return "", fmt.Errorf("%w: %q", errEmptySegment, key)
		}
		if i > 0 {
			b.WriteByte('.')
		}
		escapeSegment(&b, seg)
	}
	return b.String(), nil
}

// lockKey is the KV key of a lock name: the whole name is one token, so a
// lock named "a/b" is not a child of one named "a".
func lockKey(name string) (string, error) {
	if name == "" {
		return "", errors.New("lock name is empty")
	}
	var b strings.Builder
	escapeSegment(&b, name)
	return b.String(), nil
}

// storageKey is the storage key of a KV key that kvKey wrote.
func storageKey(k string) (string, error) {
	var b strings.Builder
	b.Grow(len(k))
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '.':
			b.WriteByte('/')
		case c == '=':
			if i+2 >= len(k) {
				return "", fmt.Errorf("KV key %q: truncated escape", k)
			}
			hi, lo := unhex(k[i+1]), unhex(k[i+2])
			if hi < 0 || lo < 0 {
				return "", fmt.Errorf("KV key %q: bad escape", k)
			}
			b.WriteByte(byte(hi<<4 | lo))
			i += 2
		case plainByte(c):
			b.WriteByte(c)
		default:
			return "", fmt.Errorf("KV key %q: byte %q is not one this storage writes", k, c)
		}
	}
	return b.String(), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
