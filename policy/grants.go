package policy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
)

// Grants. When a person signs an OAuth client in (the gateway acting as its
// clients' authorization server), the gateway records a grant: a token of
// this store, of kind user, whose Owner is the person, with the client it
// was issued to, the one resource (RFC 8707) it is for, the DPoP key it is
// bound to, if any, and its refresh state. Being a token of the store, a
// grant is revoked as any token is (Revoke, `token revoke <id>`): what its
// requests hold ends, the revoke hooks end its agent sessions, and other
// replicas see the revocation through the token file. Its sessions belong
// to the Owner, whichever client made them.
//
// A grant hands its client two credentials:
//
//   - an access token, AccessPrefix then the base64url of a payload (grant
//     id, expiry, resource, DPoP thumbprint, scopes) and its HMAC-SHA256
//     under the grant key. It is stateless: checking it is one MAC and a
//     look-up in the in-memory index, with no read or write of storage,
//     which every request of every client would otherwise cost. It lives
//     minutes (see DefaultAccessTTL), and is refused at once when its grant
//     is revoked, since the check finds the grant in the index.
//   - a refresh token, RefreshPrefix + "<grant>_<generation>_<secret>",
//     stored only as a hash. Each use rotates it (a new secret, the next
//     generation) under the storage lock, so one refresh token is redeemed
//     once across a cluster. The hashes of the last spent generations are
//     kept: presenting one again (a stolen token used after its owner
//     refreshed, or the other way round) revokes the whole grant, while a
//     token that matches no hash changes nothing, so knowing a grant's id
//     is no way to revoke it.

// AccessPrefix starts the access tokens of grants, RefreshPrefix their
// refresh tokens; TokenPrefix starts the operator's tokens. Each prefix is
// one kind of credential: a refresh token presented as an access token is
// refused, and an access token is never redeemed for another.
const (
	AccessPrefix  = "zda_"
	RefreshPrefix = "zdr_"
)

// Default and longest lifetimes of a grant's credentials. Access tokens are
// short because they are bearer (or DPoP) credentials checked without
// storage; the refresh token lapses when unused for its idle lifetime; the
// grant ends at its absolute lifetime whatever its use, and the person
// signs in again.
const (
	DefaultAccessTTL  = 10 * time.Minute
	DefaultRefreshTTL = 14 * 24 * time.Hour
	DefaultGrantTTL   = 90 * 24 * time.Hour
	// MaxAccessTTL and MaxGrantTTL bound what a configuration may ask.
	MaxAccessTTL = 24 * time.Hour
	MaxGrantTTL  = 400 * 24 * time.Hour
)

// grantIDPrefix starts the id of a grant's token record, which has a fixed
// length (grantIDLen) so that a refresh token parses one way only.
const (
	grantIDPrefix = "grt_"
	grantIDBytes  = 8
	grantIDLen    = len(grantIDPrefix) + 2*grantIDBytes
)

// spentKept is how many spent refresh generations a grant remembers: a
// spent token presented again within that many refreshes revokes the
// grant; an older one is refused as unknown (its grant has long rotated).
const spentKept = 16

// maxGrantsPerClient bounds the live grants one owner holds for one client
// and resource: signing the same client in again and again (a client that
// loses its tokens) revokes the oldest rather than growing the token file.
const maxGrantsPerClient = 8

// grantKeptAfter is how long a revoked or expired grant stays in the token
// file, listed as such, before a write prunes it (with the tokens derived
// from it): long enough for an operator to see what happened.
const grantKeptAfter = 7 * 24 * time.Hour

// Bounds of what a grant records.
const (
	maxClientLen      = 2048
	maxClientNameLen  = 200
	maxResourceLen    = 2048
	maxGrantScopes    = 64
	maxAccessTokenLen = 8192
	jktLen            = 43 // base64url of a SHA-256 (RFC 7638 thumbprint)
	refreshSecretLen  = 43 // base64url of 32 random bytes
)

// Errors of grants, for the token endpoint to map to OAuth errors: the
// first two and ErrRefreshInvalid are invalid_grant, ErrScopeWidened is
// invalid_scope, ErrTargetInvalid is invalid_target (RFC 8707), and
// ErrClientMismatch is a revocation request for another client's token
// (RFC 7009 §2.1: refused).
var (
	// ErrGrantReused is a spent refresh token presented again: the grant
	// was revoked, with every token derived from it.
	ErrGrantReused = errors.New("refresh token already used: the grant is revoked")
	// ErrRefreshInvalid is a refresh token that is not this gateway's, does
	// not match its grant, or whose grant is revoked or expired, or a
	// refresh by another client or with another DPoP key.
	ErrRefreshInvalid = errors.New("refresh token invalid")
	// ErrScopeWidened is a refresh asking for a scope the grant lacks.
	ErrScopeWidened = errors.New("scope not granted")
	// ErrTargetInvalid is a refresh for another resource than the grant's.
	ErrTargetInvalid = errors.New("resource not granted")
	// ErrClientMismatch is a revocation of a token issued to another client.
	ErrClientMismatch = errors.New("token issued to another client")
	// ErrNoGrantKey is a grant operation on a store given no grant key.
	ErrNoGrantKey = errors.New("no grant key")
)

// RefreshState is the refresh side of a grant's record. It holds hashes
// only; [TokenStore.List] leaves them out.
type RefreshState struct {
	// Generation counts the refreshes: the current token is of this one.
	Generation uint64 `json:"generation"`
	// SHA256 is the hash of the current refresh token.
	SHA256 string `json:"sha256,omitempty"`
	// Spent are the hashes of the last spentKept refresh tokens, newest
	// last.
	Spent []string `json:"spent,omitempty"`
	// Expires is when the current refresh token lapses unused (the idle
	// lifetime), never after the grant's Expires.
	Expires time.Time `json:"expires"`
	// Refreshed is when the grant was last refreshed.
	Refreshed *time.Time `json:"refreshed,omitempty"`
	// AccessSeconds and IdleSeconds are the lifetimes the grant was given,
	// which its refreshes keep.
	AccessSeconds int64 `json:"access_seconds"`
	IdleSeconds   int64 `json:"idle_seconds"`
}

// IsGrant reports whether t is the record of a grant.
func (t Token) IsGrant() bool { return t.Client != "" }

// GrantSpec is what the authorization server records when a person signs a
// client in. Zero lifetimes take DefaultAccessTTL, DefaultRefreshTTL (idle)
// and DefaultGrantTTL (absolute).
type GrantSpec struct {
	// Owner is the person; their sessions are the grant's.
	Owner string
	// Name labels the grant in listings (default "grant"); names of grants
	// need not be unique, and `token revoke` takes a grant by id.
	Name string
	// Client is the client_id (a Client ID Metadata Document URL or a
	// registered id); ClientName what the client calls itself.
	Client, ClientName string
	// Resource is the one absolute URL the tokens are for (RFC 8707).
	Resource string
	Scopes   []string
	// JKT is the DPoP key thumbprint the grant is bound to, or empty.
	JKT string

	AccessTTL, RefreshTTL, GrantTTL time.Duration
}

// Issued is what a grant's client receives: an access token and a refresh
// token, each with its expiry. The secrets are in no record.
type Issued struct {
	GrantID        string
	Access         string
	AccessExpires  time.Time
	Refresh        string
	RefreshExpires time.Time
	Scopes         []string
	// JKT is the DPoP key the access token is bound to (token_type DPoP),
	// or empty (Bearer).
	JKT string
}

// RefreshRequest is a refresh_token grant at the token endpoint: the token,
// the client presenting it, the resource asked for (empty: the grant's),
// the thumbprint of the DPoP proof's key (empty: no proof), and the scopes
// asked for, which may only narrow the grant's (empty: the grant's).
type RefreshRequest struct {
	Refresh, Client, Resource, JKT string
	Scopes                         []string
}

// grantKey is the MAC key of access tokens, with a pool of MACs keyed by
// it: a keyed HMAC costs two hash blocks and allocations to set up, which
// every check would otherwise pay.
type grantKey struct {
	key  []byte
	macs sync.Pool
}

func newGrantKey(key []byte) *grantKey {
	k := &grantKey{key: slices.Clone(key)}
	k.macs.New = func() any { return &pooledMAC{h: hmac.New(sha256.New, k.key)} }
	return k
}

// pooledMAC is a keyed HMAC, room for its sum, and a copy of what it
// hashes, reused across checks. The payload is copied before it is hashed
// because what a call through the hash.Hash interface is given escapes to
// the heap: the check's decoding buffer would be allocated on every call.
type pooledMAC struct {
	h   hash.Hash
	sum [sha256.Size]byte
	in  []byte
}

// of hashes payload and returns the MAC, which stays m's.
func (m *pooledMAC) of(payload []byte) []byte {
	m.in = append(m.in[:0], payload...)
	m.h.Reset()
	m.h.Write(m.in)
	return m.h.Sum(m.sum[:0])
}

// sum appends the MAC of payload to dst.
func (k *grantKey) sum(dst, payload []byte) []byte {
	m := k.macs.Get().(*pooledMAC)
	dst = append(dst, m.of(payload)...)
	k.macs.Put(m)
	return dst
}

// verify reports whether mac is the MAC of payload, in constant time.
func (k *grantKey) verify(payload, mac []byte) bool {
	m := k.macs.Get().(*pooledMAC)
	ok := hmac.Equal(mac, m.of(payload))
	k.macs.Put(m)
	return ok
}

// SetGrantKey sets the key that authenticates the access tokens of grants
// (32 bytes). Access tokens made under another key are refused, so every
// replica of a cluster needs the same key, and a process given a new one
// refuses the access tokens it made before: their clients refresh, which
// needs no key, since refresh tokens are stored hashed.
func (s *TokenStore) SetGrantKey(key []byte) error {
	if len(key) != 32 {
		return fmt.Errorf("a grant key is 32 bytes, not %d", len(key))
	}
	s.grantKey.Store(newGrantKey(key))
	return nil
}

// checkGrantSpec validates spec and fills its defaults.
func checkGrantSpec(spec *GrantSpec) error {
	if !ownerPattern.MatchString(spec.Owner) {
		return fmt.Errorf("grant owner %q: use 1-128 letters, digits and ':@|+._-', starting with a letter or digit", spec.Owner)
	}
	if spec.Name == "" {
		spec.Name = "grant"
	}
	if !namePattern.MatchString(spec.Name) {
		return fmt.Errorf("grant name %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", spec.Name)
	}
	if spec.Client == "" || len(spec.Client) > maxClientLen || !printable(spec.Client) {
		return fmt.Errorf("grant client id: give 1-%d printable characters without spaces", maxClientLen)
	}
	if len(spec.ClientName) > maxClientNameLen || !printableText(spec.ClientName) {
		return fmt.Errorf("grant client name: at most %d printable characters", maxClientNameLen)
	}
	if err := checkResource(spec.Resource); err != nil {
		return err
	}
	if len(spec.Scopes) == 0 || len(spec.Scopes) > maxGrantScopes {
		return fmt.Errorf("a grant holds 1-%d scopes, not %d", maxGrantScopes, len(spec.Scopes))
	}
	for i, sc := range spec.Scopes {
		if !scopePattern.MatchString(sc) {
			return fmt.Errorf("scope %q: use letters, digits and ':._*-', at most 64 characters", sc)
		}
		if slices.Contains(spec.Scopes[:i], sc) {
			return fmt.Errorf("scope %q is given twice", sc)
		}
	}
	if spec.JKT != "" && !isThumbprint(spec.JKT) {
		return fmt.Errorf("DPoP key thumbprint %q: want the %d-character base64url SHA-256 thumbprint of RFC 7638", spec.JKT, jktLen)
	}
	if spec.AccessTTL < 0 || spec.RefreshTTL < 0 || spec.GrantTTL < 0 {
		return errors.New("grant lifetimes must be positive (zero takes the default)")
	}
	if spec.AccessTTL == 0 {
		spec.AccessTTL = DefaultAccessTTL
	}
	if spec.RefreshTTL == 0 {
		spec.RefreshTTL = DefaultRefreshTTL
	}
	if spec.GrantTTL == 0 {
		spec.GrantTTL = DefaultGrantTTL
	}
	if spec.GrantTTL > MaxGrantTTL {
		return fmt.Errorf("a grant lives at most %s, not %s", MaxGrantTTL, spec.GrantTTL)
	}
	if spec.AccessTTL > MaxAccessTTL || spec.AccessTTL < time.Second {
		return fmt.Errorf("an access token lives 1s to %s, not %s", MaxAccessTTL, spec.AccessTTL)
	}
	if spec.RefreshTTL < time.Second {
		return fmt.Errorf("a refresh token lives at least 1s, not %s", spec.RefreshTTL)
	}
	return nil
}

// checkResource accepts an absolute http(s) URL with a host and no user
// info, query or fragment (RFC 8707 §2), written in its one canonical form
// (no escape a path does not need): resources are compared as strings, so
// a second spelling of one would be a second resource.
func checkResource(r string) error {
	u, err := url.Parse(r)
	if err != nil || len(r) > maxResourceLen || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" ||
		u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(r, "#?") ||
		u.RawPath != "" || u.String() != r {
		return fmt.Errorf("grant resource %q: give one absolute http(s) URL without user info, query or fragment, its path unescaped, at most %d characters", r, maxResourceLen)
	}
	return nil
}

// printable reports whether s is visible ASCII without spaces.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// printableText reports whether s is valid UTF-8 without control
// characters (a client's name is shown on consent pages and listings).
func printableText(s string) bool {
	for _, r := range s {
		if r == unicode.ReplacementChar || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return false
		}
	}
	return true
}

// isThumbprint reports whether s is a base64url SHA-256 without padding.
func isThumbprint(s string) bool {
	if len(s) != jktLen {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	return err == nil && len(b) == sha256.Size
}

// newGrantID returns a fresh grant id: grantIDPrefix and 16 hex digits.
func newGrantID() string {
	b := make([]byte, grantIDBytes)
	rand.Read(b)
	return grantIDPrefix + hex.EncodeToString(b)
}

// newRefreshToken is the refresh token of generation gen of grant id.
func newRefreshToken(id string, gen uint64) string {
	b := make([]byte, 32)
	rand.Read(b)
	return RefreshPrefix + id + "_" + strconv.FormatUint(gen, 10) + "_" + base64.RawURLEncoding.EncodeToString(b)
}

// parseRefresh reads a refresh token in its one form, returning its grant
// id, or false for anything else.
func parseRefresh(tok string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(tok, RefreshPrefix)
	if !ok || len(rest) < grantIDLen+1 || rest[grantIDLen] != '_' {
		return "", false
	}
	id = rest[:grantIDLen]
	if !validGrantID(id) {
		return "", false
	}
	gen, secret, ok := strings.Cut(rest[grantIDLen+1:], "_")
	if !ok || gen == "" || len(gen) > 20 || (gen[0] == '0') || len(secret) != refreshSecretLen {
		return "", false
	}
	if _, err := strconv.ParseUint(gen, 10, 64); err != nil {
		return "", false
	}
	if b, err := base64.RawURLEncoding.Strict().DecodeString(secret); err != nil || len(b) != 32 {
		return "", false
	}
	return id, true
}

// validGrantID reports whether id is grantIDPrefix and 16 lower-case hex
// digits.
func validGrantID(id string) bool {
	raw, ok := strings.CutPrefix(id, grantIDPrefix)
	if !ok || len(raw) != 2*grantIDBytes {
		return false
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// accessClaims is what an access token says.
type accessClaims struct {
	grant    string
	expires  time.Time
	resource string
	jkt      string
	scopes   []string
}

// accessVersion is the first byte of an access token's payload.
const accessVersion = 1

// mintAccess makes the access token of c under key k: the payload
//
//	version | grant id (8 bytes) | expiry (Unix seconds, 8 bytes) |
//	resource | jkt | scope count | scopes      (strings uvarint-length-prefixed)
//
// then its HMAC-SHA256, in unpadded base64url after AccessPrefix.
func mintAccess(k *grantKey, c accessClaims) (string, error) {
	raw, err := hex.DecodeString(strings.TrimPrefix(c.grant, grantIDPrefix))
	if err != nil || len(raw) != grantIDBytes {
		return "", fmt.Errorf("grant id %q is not one this gateway makes", c.grant)
	}
	p := append(make([]byte, 0, 128), accessVersion)
	p = append(p, raw...)
	p = binary.BigEndian.AppendUint64(p, uint64(c.expires.Unix()))
	p = appendString(p, c.resource)
	p = appendString(p, c.jkt)
	p = binary.AppendUvarint(p, uint64(len(c.scopes)))
	for _, sc := range c.scopes {
		p = appendString(p, sc)
	}
	p = k.sum(p, p)
	return AccessPrefix + base64.RawURLEncoding.EncodeToString(p), nil
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// accessEncoding decodes access tokens strictly: a token whose last
// character carries bits the payload does not use is refused, so that no
// two strings are one token.
var accessEncoding = base64.RawURLEncoding.Strict()

// accessView is an authenticated access token, read in place: its byte
// slices point into the decoded token, so that a check allocates nothing
// for what it only compares.
type accessView struct {
	grant    [len(grantIDPrefix) + 2*grantIDBytes]byte // the grant id, spelled out
	expires  int64                                     // Unix seconds: a time.Time holds a pointer, which would tie the check's buffer to the principal
	resource []byte
	jkt      []byte
	scopes   []byte // the scope list as encoded: count, then each scope
}

// grantID is the id of the grant v names.
func (v *accessView) grantID() string { return string(v.grant[:]) }

// hasScope reports whether v grants sc.
func (v *accessView) hasScope(sc string) bool {
	n, used := binary.Uvarint(v.scopes)
	rest := v.scopes[used:]
	for range n {
		var b []byte
		b, rest, _ = readBytes(rest)
		if string(b) == sc {
			return true
		}
	}
	return false
}

// openAccess authenticates the access token tok under k and reads it,
// decoding it into buf, or returns false. The MAC is checked before any of
// the payload is read.
func openAccess(k *grantKey, tok string, buf []byte) (v accessView, ok bool) {
	body, ok := strings.CutPrefix(tok, AccessPrefix)
	if !ok || len(tok) > maxAccessTokenLen {
		return v, false
	}
	// Decoded from a copy on the stack: converting the string would
	// allocate on every request.
	var src [512]byte
	in := src[:0]
	if len(body) > len(src) {
		in = make([]byte, 0, len(body))
	}
	in = append(in, body...)
	raw, err := accessEncoding.AppendDecode(buf[:0], in)
	if err != nil || len(raw) < 1+grantIDBytes+8+sha256.Size {
		return v, false
	}
	payload, mac := raw[:len(raw)-sha256.Size], raw[len(raw)-sha256.Size:]
	if !k.verify(payload, mac) {
		return v, false
	}
	if payload[0] != accessVersion {
		return v, false
	}
	copy(v.grant[:], grantIDPrefix)
	hex.Encode(v.grant[len(grantIDPrefix):], payload[1:1+grantIDBytes])
	v.expires = int64(binary.BigEndian.Uint64(payload[1+grantIDBytes:]))
	rest := payload[1+grantIDBytes+8:]
	if v.resource, rest, ok = readBytes(rest); !ok {
		return v, false
	}
	if v.jkt, rest, ok = readBytes(rest); !ok {
		return v, false
	}
	v.scopes = rest
	n, used := binary.Uvarint(rest)
	if used <= 0 || n > maxGrantScopes {
		return v, false
	}
	rest = rest[used:]
	for range n {
		if _, rest, ok = readBytes(rest); !ok {
			return v, false
		}
	}
	return v, len(rest) == 0
}

func readBytes(b []byte) ([]byte, []byte, bool) {
	n, used := binary.Uvarint(b)
	if used <= 0 || n > uint64(len(b)-used) {
		return nil, nil, false
	}
	return b[used : used+int(n)], b[used+int(n):], true
}

// checkAccess authenticates a grant's access token: its MAC, its expiry,
// and its grant in the index, active. It reads no storage.
func (s *TokenStore) checkAccess(tok string, now time.Time) (Principal, error) {
	k := s.grantKey.Load()
	if k == nil {
		return Principal{}, ErrTokenUnknown
	}
	var buf [384]byte
	v, ok := openAccess(k, tok, buf[:])
	if !ok {
		return Principal{}, ErrTokenUnknown
	}
	expires := time.Unix(v.expires, 0)
	if !now.Before(expires) {
		return Principal{}, fmt.Errorf("%w: the access token expired at %s", ErrTokenExpired, expires.UTC().Format(time.RFC3339))
	}
	s.mu.RLock()
	t := s.byID[string(v.grant[:])]
	s.mu.RUnlock()
	// A token made under this key names a grant this gateway recorded;
	// one whose grant is gone (pruned) or does not match was made for
	// another record, and is refused as unknown.
	if t == nil || !t.IsGrant() || t.Resource != string(v.resource) || t.JKT != string(v.jkt) {
		return Principal{}, ErrTokenUnknown
	}
	if t.Revoked != nil {
		return Principal{}, fmt.Errorf("%w: the grant %s was revoked at %s", ErrTokenRevoked, t.ID, t.Revoked.UTC().Format(time.RFC3339))
	}
	if t.Expires != nil && !now.Before(*t.Expires) {
		return Principal{}, fmt.Errorf("%w: the grant %s expired at %s", ErrTokenExpired, t.ID, t.Expires.UTC().Format(time.RFC3339))
	}
	p := t.Principal()
	// The grant may have been narrowed since the token was made: the token
	// holds what both grant. Most often that is all the grant holds, and
	// the principal shares the record's list, as an operator token's does.
	held := 0
	for _, sc := range t.Scopes {
		if v.hasScope(sc) {
			held++
		}
	}
	if held < len(t.Scopes) {
		p.Scopes = make([]string, 0, held)
		for _, sc := range t.Scopes {
			if v.hasScope(sc) {
				p.Scopes = append(p.Scopes, sc)
			}
		}
	}
	p.Expires = earlier(&expires, t.Expires)
	if u, ok := s.used.Load(t.ID); !ok || now.Sub(u.(time.Time)) >= time.Second {
		s.used.Store(t.ID, now)
	}
	return p, nil
}

// issue mints the access token of grant t at now, and says what the client
// receives with refresh, the refresh token.
func issue(k *grantKey, t *Token, refresh string, now time.Time) (Issued, error) {
	exp := now.Add(time.Duration(t.Refresh.AccessSeconds) * time.Second)
	if t.Expires != nil && t.Expires.Before(exp) {
		exp = *t.Expires
	}
	exp = exp.Truncate(time.Second)
	scopes := slices.Clone(t.Scopes)
	access, err := mintAccess(k, accessClaims{grant: t.ID, expires: exp, resource: t.Resource, jkt: t.JKT, scopes: scopes})
	if err != nil {
		return Issued{}, err
	}
	return Issued{GrantID: t.ID, Access: access, AccessExpires: exp, Refresh: refresh,
		RefreshExpires: t.Refresh.Expires, Scopes: scopes, JKT: t.JKT}, nil
}

// CreateGrant records a grant of spec at now and issues its first access and
// refresh tokens. An owner holds at most maxGrantsPerClient live grants for
// one client and resource: a new one beyond that revokes the oldest.
func (s *TokenStore) CreateGrant(ctx context.Context, spec GrantSpec, now time.Time) (Issued, error) {
	k := s.grantKey.Load()
	if k == nil {
		return Issued{}, fmt.Errorf("%w: the gateway set none for its grants", ErrNoGrantKey)
	}
	if err := checkGrantSpec(&spec); err != nil {
		return Issued{}, err
	}
	now = now.UTC().Truncate(time.Second)
	id := newGrantID()
	refresh := newRefreshToken(id, 1)
	expires := now.Add(spec.GrantTTL)
	t := Token{
		ID: id, Name: spec.Name, Scopes: slices.Clone(spec.Scopes), Kind: KindUser, Created: now, Expires: &expires,
		Owner: spec.Owner, Client: spec.Client, ClientName: spec.ClientName, Resource: spec.Resource, JKT: spec.JKT,
		Refresh: &RefreshState{
			Generation: 1, SHA256: HashSecret(refresh), Expires: earlierTime(now.Add(spec.RefreshTTL), expires),
			AccessSeconds: int64(spec.AccessTTL / time.Second), IdleSeconds: int64(spec.RefreshTTL / time.Second),
		},
	}
	var displaced []Token
	err := s.update(ctx, func(f *tokenFile) error {
		displaced = displaced[:0]
		var live []*Token
		for _, o := range f.Tokens {
			if o.ID == id {
				return errors.New("grant id taken: try again")
			}
			if o.IsGrant() && o.Owner == spec.Owner && o.Client == spec.Client && o.Resource == spec.Resource && o.Active(now) {
				live = append(live, o)
			}
		}
		slices.SortFunc(live, func(a, b *Token) int { return a.Created.Compare(b.Created) })
		for len(live) >= maxGrantsPerClient {
			displaced = append(displaced, revokeInFile(f, live[0].ID, now)...)
			live = live[1:]
		}
		rec := t
		f.Tokens = append(f.Tokens, &rec)
		return nil
	})
	if err != nil {
		return Issued{}, err
	}
	s.announceRevoked(displaced)
	s.emit(TokenEvent{Action: "grant_created", Token: t.redacted()})
	return issue(k, &t, refresh, now)
}

// RefreshGrant redeems a refresh token at now: under the storage lock, with
// the token file read afresh, so that one refresh token is redeemed once
// across every replica. The grant's next refresh token replaces it.
//
// A spent refresh token revokes the grant and returns ErrGrantReused. Other
// refusals wrap ErrRefreshInvalid (the token matches nothing, its grant is
// revoked or expired, its client or DPoP key is not the grant's),
// ErrTargetInvalid or ErrScopeWidened, and change nothing. Scopes asked
// for narrow the grant for good: a client that gives a scope up does not
// get it back by refreshing again.
func (s *TokenStore) RefreshGrant(ctx context.Context, req RefreshRequest, now time.Time) (Issued, error) {
	k := s.grantKey.Load()
	if k == nil {
		return Issued{}, fmt.Errorf("%w: the gateway set none for its grants", ErrNoGrantKey)
	}
	id, ok := parseRefresh(req.Refresh)
	if !ok {
		return Issued{}, fmt.Errorf("%w: it is not a refresh token of this gateway", ErrRefreshInvalid)
	}
	now = now.UTC().Truncate(time.Second)
	sum := sha256.Sum256([]byte(req.Refresh))
	next := ""
	var (
		out     Token
		reused  bool
		revoked []Token
	)
	err := s.update(ctx, func(f *tokenFile) error {
		reused, revoked, next = false, nil, ""
		t := grantIn(f, id)
		if t == nil {
			return fmt.Errorf("%w: it matches no grant", ErrRefreshInvalid)
		}
		switch refreshMatch(t.Refresh, sum) {
		case matchSpent:
			if t.Revoked != nil {
				return fmt.Errorf("%w: it was already used, and its grant is revoked: sign in again", ErrGrantReused)
			}
			reused = true
			out = *t
			revoked = revokeInFile(f, t.ID, now)
			return nil
		case matchNone:
			return fmt.Errorf("%w: it matches no grant", ErrRefreshInvalid)
		}
		switch {
		case t.Revoked != nil:
			return fmt.Errorf("%w: its grant was revoked at %s: sign in again", ErrRefreshInvalid, t.Revoked.UTC().Format(time.RFC3339))
		case t.Expires != nil && !now.Before(*t.Expires):
			return fmt.Errorf("%w: its grant expired at %s: sign in again", ErrRefreshInvalid, t.Expires.UTC().Format(time.RFC3339))
		case !now.Before(t.Refresh.Expires):
			return fmt.Errorf("%w: it lapsed unused at %s: sign in again", ErrRefreshInvalid, t.Refresh.Expires.UTC().Format(time.RFC3339))
		case req.Client != t.Client:
			return fmt.Errorf("%w: it was issued to another client", ErrRefreshInvalid)
		case req.Resource != "" && req.Resource != t.Resource:
			return fmt.Errorf("%w: the grant is for %s, not %s", ErrTargetInvalid, t.Resource, req.Resource)
		case t.JKT != "" && req.JKT != t.JKT:
			// RFC 9449 §5: a bound grant's refresh token is bound too;
			// only a proof of the same key redeems it.
			return fmt.Errorf("%w: the grant is bound to a DPoP key: send a DPoP proof signed with that key", ErrRefreshInvalid)
		}
		scopes := t.Scopes
		if len(req.Scopes) > 0 {
			var wider []string
			for _, sc := range req.Scopes {
				if !slices.Contains(t.Scopes, sc) {
					wider = append(wider, sc)
				}
			}
			if len(wider) > 0 {
				return fmt.Errorf("%w: the grant holds %s, not %s: a refresh may only narrow it", ErrScopeWidened,
					strings.Join(t.Scopes, " "), strings.Join(wider, " "))
			}
			scopes = slices.DeleteFunc(slices.Clone(t.Scopes), func(sc string) bool { return !slices.Contains(req.Scopes, sc) })
		}
		r := *t.Refresh
		r.Spent = append(slices.Clone(r.Spent), r.SHA256)
		if len(r.Spent) > spentKept {
			r.Spent = r.Spent[len(r.Spent)-spentKept:]
		}
		r.Generation++
		next = newRefreshToken(t.ID, r.Generation)
		r.SHA256 = HashSecret(next)
		r.Expires = now.Add(time.Duration(r.IdleSeconds) * time.Second)
		if t.Expires != nil {
			r.Expires = earlierTime(r.Expires, *t.Expires)
		}
		r.Refreshed = &now
		t.Refresh = &r
		t.Scopes = scopes
		out = *t
		return nil
	})
	if err != nil {
		return Issued{}, err
	}
	if reused {
		s.emit(TokenEvent{Action: "grant_refresh_reused", Token: out.redacted()})
		s.announceRevoked(revoked)
		return Issued{}, fmt.Errorf("%w: the refresh token was already used, so it may have been stolen; every token of the grant is revoked: sign in again", ErrGrantReused)
	}
	s.emit(TokenEvent{Action: "grant_refreshed", Token: out.redacted()})
	return issue(k, &out, next, now)
}

// RevokeCredential is a revocation request (RFC 7009) from client: an
// access or refresh token of a grant issued to client revokes the grant.
// A token that is not authentic (no MAC, or a refresh token that matches
// no hash), an expired access token, and an already revoked grant are no
// error and change nothing (RFC 7009 §2.2); a token of another client is
// refused with ErrClientMismatch.
func (s *TokenStore) RevokeCredential(ctx context.Context, token, client string) error {
	var id string
	switch {
	case strings.HasPrefix(token, AccessPrefix):
		k := s.grantKey.Load()
		if k == nil {
			return nil
		}
		v, ok := openAccess(k, token, make([]byte, 0, 512))
		if !ok || time.Now().Unix() >= v.expires {
			return nil
		}
		id = v.grantID()
	case strings.HasPrefix(token, RefreshPrefix):
		var ok bool
		if id, ok = parseRefresh(token); !ok {
			return nil
		}
	default:
		return nil
	}
	sum := sha256.Sum256([]byte(token))
	now := time.Now().UTC().Truncate(time.Second)
	var revoked []Token
	err := s.update(ctx, func(f *tokenFile) error {
		revoked = nil
		t := grantIn(f, id)
		if t == nil || t.Revoked != nil {
			return errNothing
		}
		if strings.HasPrefix(token, RefreshPrefix) && refreshMatch(t.Refresh, sum) == matchNone {
			return errNothing
		}
		if t.Client != client {
			return fmt.Errorf("%w: revoke a token with the client it was issued to", ErrClientMismatch)
		}
		revoked = revokeInFile(f, t.ID, now)
		return nil
	})
	if errors.Is(err, errNothing) {
		return nil
	}
	if err != nil {
		return err
	}
	s.announceRevoked(revoked)
	return nil
}

// errNothing ends an update that has nothing to write.
var errNothing = errors.New("nothing to change")

// grantIn is the grant with id in f, or nil.
func grantIn(f *tokenFile, id string) *Token {
	for _, t := range f.Tokens {
		if t.ID == id {
			if !t.IsGrant() || t.Refresh == nil {
				return nil
			}
			return t
		}
	}
	return nil
}

type match int

const (
	matchNone match = iota
	matchCurrent
	matchSpent
)

// refreshMatch says whether sum is the hash of r's current refresh token,
// of a spent one, or of none.
func refreshMatch(r *RefreshState, sum [sha256.Size]byte) match {
	h := []byte(hex.EncodeToString(sum[:]))
	if subtle.ConstantTimeCompare(h, []byte(r.SHA256)) == 1 {
		return matchCurrent
	}
	for _, sp := range r.Spent {
		if subtle.ConstantTimeCompare(h, []byte(sp)) == 1 {
			return matchSpent
		}
	}
	return matchNone
}

// revokeInFile revokes the token id of f and every token derived from it,
// at now, and returns those it revoked.
func revokeInFile(f *tokenFile, id string, now time.Time) []Token {
	ids := map[string]bool{id: true}
	withDescendants(f, ids)
	var out []Token
	for _, t := range f.Tokens {
		if ids[t.ID] && t.Revoked == nil {
			t.Revoked = &now
			out = append(out, *t)
		}
	}
	return out
}

// announceRevoked audits each revoked token (a grant as grant_revoked) and
// runs the revoke hooks, which end what it holds.
func (s *TokenStore) announceRevoked(list []Token) {
	for _, t := range list {
		action := "revoked"
		if t.IsGrant() {
			action = "grant_revoked"
		}
		s.emit(TokenEvent{Action: action, Token: t.redacted()})
		s.fireRevoke(t)
	}
}

// redacted is t without hashes: what listings and events show.
func (t Token) redacted() Token {
	t.SHA256 = ""
	if t.Refresh != nil {
		r := *t.Refresh
		r.SHA256, r.Spent = "", nil
		t.Refresh = &r
	}
	t.Scopes = slices.Clone(t.Scopes)
	return t
}

// pruneGrants deletes from f the grants revoked, expired or lapsed more than
// grantKeptAfter before now, with the tokens derived from them.
func pruneGrants(f *tokenFile, now time.Time) {
	ids := map[string]bool{}
	for _, t := range f.Tokens {
		if !t.IsGrant() {
			continue
		}
		ended := t.Revoked
		if t.Expires != nil {
			ended = earlier(ended, t.Expires)
		}
		if t.Refresh != nil {
			lapsed := t.Refresh.Expires
			ended = earlier(ended, &lapsed)
		}
		if ended != nil && now.Sub(*ended) > grantKeptAfter {
			ids[t.ID] = true
		}
	}
	if len(ids) == 0 {
		return
	}
	withDescendants(f, ids)
	deleteIDs(f, ids)
}

func earlierTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// FilterTokens keeps the tokens of list that act for owner (when owner is
// not empty) and that are grants to client or derive from one (when client
// is not empty), in their order: what `token list --owner --client` shows.
func FilterTokens(list []Token, owner, client string) []Token {
	parent := make(map[string]string, len(list))
	grantClient := map[string]string{}
	for _, t := range list {
		parent[t.ID] = t.Parent
		if t.IsGrant() {
			grantClient[t.ID] = t.Client
		}
	}
	// clientOf is the client of the grant at the top of t's chain.
	clientOf := func(t Token) string {
		id := t.ID
		for range maxParentChain + 1 {
			if c, ok := grantClient[id]; ok {
				return c
			}
			if id = parent[id]; id == "" {
				break
			}
		}
		return ""
	}
	var out []Token
	for _, t := range list {
		if owner != "" && t.OwnerID() != owner {
			continue
		}
		if client != "" && clientOf(t) != client {
			continue
		}
		out = append(out, t)
	}
	return out
}
