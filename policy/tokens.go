package policy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// TokenPrefix starts every opaque token this edge issues, so a leaked token
// is recognisable by secret scanners.
const TokenPrefix = "zds_"

// tokenSecretBytes is how many random bytes follow the prefix.
const tokenSecretBytes = 32

// TokensKey is the storage key of the token file.
const TokensKey = "zidane/tokens.json"

// Token is the stored record of an opaque token. It holds the SHA-256 of the
// secret, never the secret itself.
type Token struct {
	ID       string     `json:"id"`
	Name     string     `json:"name"`
	SHA256   string     `json:"sha256,omitempty"`
	Scopes   []string   `json:"scopes"`
	Kind     Kind       `json:"kind"`
	Created  time.Time  `json:"created"`
	Expires  *time.Time `json:"expires,omitempty"`
	LastUsed *time.Time `json:"last_used,omitempty"`
	Revoked  *time.Time `json:"revoked,omitempty"`
	// Owner is who the token acts for (see [Principal.Owner]): set by the
	// operator (--owner), or inherited from the parent. Empty means the
	// token is its own owner (see [Token.OwnerID]).
	Owner string `json:"owner,omitempty"`
	// Parent is the id of the token this one was derived from, or
	// "jwt:<sub>" for a token derived from a JWT. Revoking the parent
	// revokes it, and Check refuses it once the parent is revoked, expired
	// or gone.
	Parent string `json:"parent,omitempty"`
	// Roots confine the sessions the token creates to these directory
	// trees, inside the gateway's roots. A child token has its parent's
	// roots, or roots inside them.
	Roots []string `json:"roots,omitempty"`
	// Session and Purpose say which session's agent a derived token was
	// minted for, and to do what: a session holds at most one token per
	// purpose, and its tokens are deleted when it ends.
	Session string  `json:"session,omitempty"`
	Purpose Purpose `json:"purpose,omitempty"`
	// Client, ClientName, Resource and JKT are set on the record of a
	// grant (see grants.go): the OAuth client it was issued to and the
	// name the client gives itself, the one resource its tokens are for,
	// and the DPoP key thumbprint they are bound to (empty: bearer). A
	// token derived from a grant, at any depth, has its Resource too: it
	// is for that resource alone (see CreateChild).
	Client     string `json:"client,omitempty"`
	ClientName string `json:"client_name,omitempty"`
	Resource   string `json:"resource,omitempty"`
	JKT        string `json:"jkt,omitempty"`
	// Refresh is a grant's refresh state: hashes only.
	Refresh *RefreshState `json:"refresh,omitempty"`
}

// Purpose says what a derived token is for.
type Purpose string

const (
	// PurposeOrchestrator is the token of an orchestrator session's agent,
	// which calls the sessions endpoint with the verbs it was given.
	PurposeOrchestrator Purpose = "orchestrator"
	// PurposeEgress is the machine token of a session's agent, which
	// reaches the upstreams given to sessions through the broker.
	PurposeEgress Purpose = "egress"
)

// Active reports whether t may authenticate at now, by its own record (Check
// also refuses a token whose parent is no longer active).
func (t Token) Active(now time.Time) bool {
	return t.Revoked == nil && (t.Expires == nil || now.Before(*t.Expires))
}

// OwnerID is who t acts for: its Owner, or its own id when it has none.
func (t Token) OwnerID() string {
	if t.Owner != "" {
		return t.Owner
	}
	return t.ID
}

// Principal is what t authenticates as.
func (t Token) Principal() Principal {
	p := Principal{TokenID: t.ID, Name: t.Name, Kind: t.Kind, Scopes: t.Scopes, Source: "token", Roots: t.Roots,
		Owner: t.OwnerID(), Parent: t.Parent, Expires: t.Expires, Resource: t.Resource}
	if t.IsGrant() {
		p.Source, p.Client, p.JKT = "grant", t.Client, t.JKT
	}
	return p
}

// TokenSpec is what an operator asks for when creating a token. Tokens
// derived for a session's agent are made by [TokenStore.CreateChild].
type TokenSpec struct {
	Name    string        `json:"name"`
	Scopes  []string      `json:"scopes"`
	Kind    Kind          `json:"kind,omitempty"`
	Expires time.Duration `json:"expires,omitempty"`
	// Roots are absolute paths that confine the sessions the token
	// creates (see Token.Roots).
	Roots []string `json:"roots,omitempty"`
	// Owner is who the token acts for; tokens with the same owner see and
	// drive the same sessions. Empty makes the token its own owner.
	Owner string `json:"owner,omitempty"`
}

// Errors returned by TokenStore. Check wraps them, so errors.Is works.
var (
	ErrTokenUnknown  = errors.New("token not recognised")
	ErrTokenRevoked  = errors.New("token revoked")
	ErrTokenExpired  = errors.New("token expired")
	ErrTokenNotFound = errors.New("no such token")
	// ErrNoChild is returned by CreateChild when no token may be derived:
	// the parent is revoked, expired or gone, the scopes are wider than
	// the parent's, or the operator revoked the session's token.
	ErrNoChild = errors.New("no token may be derived")
)

var (
	namePattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	scopePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9:._*-]{0,63}$`)
	// ownerPattern admits the names operators give people and the forms
	// owners take otherwise ("tok_…", "jwt:<sub>", whose subjects may hold
	// '|' or '@').
	ownerPattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9:@|+._-]{0,127}$`)
	sessionPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
)

// maxParentChain bounds the walk up a derived token's parents. Orchestrators
// of orchestrators nest a few levels; a longer chain is refused.
const maxParentChain = 16

// ValidateSpec checks a token request and says what is wrong with it.
func ValidateSpec(spec TokenSpec) error {
	if !namePattern.MatchString(spec.Name) {
		return fmt.Errorf("token name %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", spec.Name)
	}
	if len(spec.Scopes) == 0 {
		return fmt.Errorf("token %q: give at least one scope (for example --scope chat)", spec.Name)
	}
	for _, s := range spec.Scopes {
		if !scopePattern.MatchString(s) {
			return fmt.Errorf("scope %q: use letters, digits and ':._*-', at most 64 characters", s)
		}
	}
	switch spec.Kind {
	case "", KindUser, KindMachine:
	default:
		return fmt.Errorf("token kind %q: use %q or %q", spec.Kind, KindUser, KindMachine)
	}
	if spec.Expires < 0 {
		return fmt.Errorf("token %q: expiry must be in the future", spec.Name)
	}
	if len(spec.Roots) > maxTokenRoots {
		return fmt.Errorf("token %q: %d roots given; at most %d", spec.Name, len(spec.Roots), maxTokenRoots)
	}
	for _, r := range spec.Roots {
		if !filepath.IsAbs(r) {
			return fmt.Errorf("root %q: give an absolute path, such as /srv/projects", r)
		}
	}
	if spec.Owner != "" && !ownerPattern.MatchString(spec.Owner) {
		return fmt.Errorf("owner %q: use 1-128 letters, digits and ':@|+._-', starting with a letter or digit", spec.Owner)
	}
	return nil
}

// maxTokenRoots bounds a token's roots.
const maxTokenRoots = 64

// narrowRoots returns the roots of a child token asking for want, whose
// parent has parent: the parent's when want is empty, else want if each
// of its roots lies inside one of the parent's (compared as written: the
// sessions engine resolves symlinks when it checks a path against both).
func narrowRoots(parent, want []string) ([]string, error) {
	if len(want) == 0 || len(parent) == 0 {
		if len(want) == 0 {
			return append([]string(nil), parent...), nil
		}
		return want, nil
	}
	for _, w := range want {
		inside := false
		for _, p := range parent {
			if pathtree.Within(w, p) {
				inside = true
				break
			}
		}
		if !inside {
			return nil, fmt.Errorf("root %s is not inside the parent token's roots (%s): a child token's roots can only narrow its parent's", w, strings.Join(parent, ", "))
		}
	}
	return want, nil
}

// ParseExpiry parses a token lifetime: a Go duration ("12h", "90m") or a
// whole number of days ("30d"). An empty string means no expiry.
func ParseExpiry(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("expiry %q: write a positive number of days such as 30d, or a duration such as 12h", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("expiry %q: write a positive duration such as 12h or 30d", s)
	}
	return d, nil
}

// NewTokenSecret returns a fresh token: TokenPrefix followed by 32 random
// bytes in unpadded URL-safe base64.
func NewTokenSecret() string {
	b := make([]byte, tokenSecretBytes)
	rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// HashSecret is the stored form of a token secret.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func newTokenID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "tok_" + hex.EncodeToString(b)
}

// tokenFile is the stored document.
type tokenFile struct {
	Version int      `json:"version"`
	Tokens  []*Token `json:"tokens"`
	// Subjects are the JWT subjects an operator revoked: their JWTs issued
	// until then are refused. One entry per subject, so it stays small.
	Subjects []SubjectRevocation `json:"revoked_subjects,omitempty"`
}

// SubjectRevocation records that an operator revoked a JWT subject: the
// subject's access tokens issued until Revoked are refused, and what was
// derived from them is deleted.
type SubjectRevocation struct {
	Subject string    `json:"subject"` // "jwt:<sub>"
	Revoked time.Time `json:"revoked"`
}

// TokenEvent is a token lifecycle change, for the audit log.
type TokenEvent struct {
	// Action is created, rotated (a derived token got a new secret when
	// its agent was relaunched), revoked, deleted (a derived token whose
	// session ended, or whose JWT subject was revoked) or seen_revoked (a
	// token gone from the token file when it was read again).
	Action string
	Token  Token
}

// TokenStore holds the opaque tokens: an in-memory index over the token file
// in storage. Check never touches storage; Create and Revoke write through
// under the storage lock; Sync picks up changes that another process (the
// CLI, offline) wrote.
type TokenStore struct {
	st storage.Storage

	// installMu orders what install is given: a Sync's load and install
	// happen under it, so a Sync that loaded the file before a write cannot
	// install that older file after the write's own install (which would
	// bring a just-revoked token back until the next sync), and two Syncs
	// (the periodic one and a storage watch's) do not cross either.
	installMu sync.Mutex

	mu      sync.RWMutex
	byHash  map[[32]byte]*Token
	byID    map[string]*Token
	lastRaw [32]byte
	loaded  bool
	loadErr error

	subjects map[string]time.Time // revoked JWT subjects
	// used maps a token id to its last use not yet flushed (a time.Time).
	// A sync.Map, written at most once a second per token, keeps the
	// check free of any exclusive lock.
	used sync.Map
	// holds are the cancel functions of the requests in flight (see
	// Hold), spread over shards with locks of their own: every allowed
	// request takes one twice, and must neither wait on the requests of
	// other shards nor contend with the check's read lock on mu.
	holds    [holdShards]holdShard
	nextHold atomic.Uint64
	// ended maps the id of a token whose holds were cancelled (revoked,
	// or deleted) to when (a time.Time), for at least endedFor: a request
	// that passed the check just before and takes its hold just after
	// ends at once too.
	ended      sync.Map
	endedSwept atomic.Int64 // when ended was last swept of old marks, in Unix nanoseconds

	hookMu   sync.Mutex
	onRevoke []func(Token)
	onEvent  func(TokenEvent)

	// grantKey authenticates the access tokens of grants (see
	// SetGrantKey); nil until set, and then no access token is accepted.
	grantKey atomic.Pointer[grantKey]
}

// OpenTokenStore loads the token file from st. A missing file is an empty
// store; an unreadable one is an error, so that nothing overwrites it.
func OpenTokenStore(ctx context.Context, st storage.Storage) (*TokenStore, error) {
	s := &TokenStore{
		st:       st,
		byHash:   map[[32]byte]*Token{},
		byID:     map[string]*Token{},
		subjects: map[string]time.Time{},
	}
	if err := s.Sync(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// OnEvent sets the function that receives token lifecycle events.
func (s *TokenStore) OnEvent(fn func(TokenEvent)) {
	s.hookMu.Lock()
	s.onEvent = fn
	s.hookMu.Unlock()
}

// OnRevoke registers fn to run when a token is revoked, here or in another
// process. The sessions engine uses it to cancel what the token started.
// The returned function unregisters fn.
func (s *TokenStore) OnRevoke(fn func(Token)) (remove func()) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.onRevoke = append(s.onRevoke, fn)
	idx := len(s.onRevoke) - 1
	return func() {
		s.hookMu.Lock()
		defer s.hookMu.Unlock()
		if idx < len(s.onRevoke) {
			s.onRevoke[idx] = nil
		}
	}
}

// holdShards spreads the requests in flight over independent locks.
const holdShards = 16

// holdShard holds some of the requests in flight, by their hold number.
type holdShard struct {
	mu sync.Mutex
	m  map[uint64]held
}

type held struct {
	token  string
	cancel func()
}

// Held is a request held by [TokenStore.Hold]; Release it when its work
// ends.
type Held struct {
	sh *holdShard
	n  uint64
}

// Release forgets the request: revoking its token no longer cancels it.
// Releasing twice, or after the store cancelled it, is harmless.
func (h Held) Release() {
	if h.sh == nil {
		return
	}
	h.sh.mu.Lock()
	delete(h.sh.m, h.n)
	h.sh.mu.Unlock()
}

// Hold ties cancel to the token with id: when the token is revoked, cancel
// runs. The edge holds every request it lets through, so a revoked token's
// open streams close at once. Release the hold when the work ends.
//
// A request takes one shard's lock, never a lock of the token's: every
// request of a token (an agent's, a busy client's) would wait on one.
// Revocation, which is rare, looks through every shard instead.
//
// A token's revocation marks it ended before it cancels what is held, and
// Hold looks for that mark after it holds: either the revocation finds the
// hold, or the hold finds the mark, and the request ends at once. (A JWT
// subject is not marked: its tokens issued after the revocation are good.)
func (s *TokenStore) Hold(id string, cancel func()) Held {
	n := s.nextHold.Add(1)
	sh := &s.holds[n%holdShards]
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = map[uint64]held{}
	}
	sh.m[n] = held{id, cancel}
	sh.mu.Unlock()
	h := Held{sh, n}
	if s.endedID(id) {
		h.Release()
		cancel()
	}
	return h
}

// endedID reports whether the token with id was revoked or deleted: its
// mark, or its record. The record counts too because a request can take
// longer than endedFor from its check to its hold (a body sent slowly).
func (s *TokenStore) endedID(id string) bool {
	if _, ended := s.ended.Load(id); ended {
		return true
	}
	if IsJWTID(id) {
		return false
	}
	s.mu.RLock()
	t := s.byID[id]
	s.mu.RUnlock()
	return t != nil && t.Revoked != nil
}

// endedFor is how long a token stays marked ended: far longer than a
// request takes from its check to its hold.
const endedFor = time.Minute

// markEnded marks the token with id ended (see Hold), and forgets the
// marks older than endedFor, looking for them at most once per endedFor:
// a revocation of many tokens at once (a parent's descendants, pruned
// derived tokens) sweeps once, not once per token.
func (s *TokenStore) markEnded(id string, now time.Time) {
	s.ended.Store(id, now)
	last := s.endedSwept.Load()
	if now.UnixNano()-last < int64(endedFor) || !s.endedSwept.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	s.ended.Range(func(k, v any) bool {
		if now.Sub(v.(time.Time)) > endedFor {
			s.ended.CompareAndDelete(k, v)
		}
		return true
	})
}

// takeHolds removes the holds of the token with id (every token's when
// all) and returns their cancel functions.
func (s *TokenStore) takeHolds(id string, all bool) []func() {
	var out []func()
	for i := range s.holds {
		sh := &s.holds[i]
		sh.mu.Lock()
		for n, h := range sh.m {
			if all || h.token == id {
				out = append(out, h.cancel)
				delete(sh.m, n)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// CancelHolds runs the cancel function of every request held (see Hold),
// for every token: the process is exiting, and open streams must end.
func (s *TokenStore) CancelHolds() {
	for _, cancel := range s.takeHolds("", true) {
		cancel()
	}
}

// Check authenticates secret: an operator's token (TokenPrefix) or a
// grant's access token (AccessPrefix); anything else, a grant's refresh
// token included, is unknown. It does not touch storage: the last-used
// time is recorded in memory and written by Flush.
func (s *TokenStore) Check(secret string, now time.Time) (Principal, error) {
	if strings.HasPrefix(secret, AccessPrefix) {
		return s.checkAccess(secret, now)
	}
	if !strings.HasPrefix(secret, TokenPrefix) {
		return Principal{}, ErrTokenUnknown
	}
	// Hashed from a buffer on the stack: the conversion of a token
	// longer than 32 bytes would otherwise allocate on every request.
	var buf [128]byte
	var sum [sha256.Size]byte
	if len(secret) <= len(buf) {
		sum = sha256.Sum256(append(buf[:0], secret...))
	} else {
		sum = sha256.Sum256([]byte(secret))
	}
	s.mu.RLock()
	t := s.byHash[sum]
	s.mu.RUnlock()
	if t == nil {
		return Principal{}, ErrTokenUnknown
	}
	// The index is keyed by the SHA-256 of the secret, so a hit is an exact
	// match; what the lookup's timing could reveal is the hash of a guess,
	// which the guesser already knows.
	p, err := s.principalOf(t, now)
	if err != nil {
		return Principal{}, err
	}
	if v, ok := s.used.Load(t.ID); !ok || now.Sub(v.(time.Time)) >= time.Second {
		s.used.Store(t.ID, now)
	}
	return p, nil
}

// Lookup is the principal of the stored token id as Check would
// authenticate it at now: errors wrap [ErrTokenUnknown] for no such token,
// and [ErrTokenRevoked] or [ErrTokenExpired] for one that, or one of whose
// parents, is revoked, expired or gone. A replica asks it for the token a
// request another replica forwarded acts for (see
// [Authenticator.Forwarded]), and the gateway for the creator of an
// orchestrator session at each launch of its agent; it records no use,
// which the replica that checked the secret did.
func (s *TokenStore) Lookup(id string, now time.Time) (Principal, error) {
	s.mu.RLock()
	t := s.byID[id]
	s.mu.RUnlock()
	if t == nil {
		return Principal{}, fmt.Errorf("%w: no token has id %q here", ErrTokenUnknown, id)
	}
	return s.principalOf(t, now)
}

// principalOf is what the stored token t authenticates as at now, or why
// it does not.
func (s *TokenStore) principalOf(t *Token, now time.Time) (Principal, error) {
	if t.Revoked != nil {
		return Principal{}, fmt.Errorf("%w: %q was revoked at %s", ErrTokenRevoked, t.Name, t.Revoked.UTC().Format(time.RFC3339))
	}
	if t.Expires != nil && !now.Before(*t.Expires) {
		return Principal{}, fmt.Errorf("%w: %q expired at %s", ErrTokenExpired, t.Name, t.Expires.UTC().Format(time.RFC3339))
	}
	var top string
	if t.Parent != "" {
		s.mu.RLock()
		err := s.parentProblem(t, now)
		top = chainTop(s.byID, t)
		s.mu.RUnlock()
		if err != nil {
			return Principal{}, err
		}
	}
	p := t.Principal()
	p.Quota = top
	return p, nil
}

// chainTop is the credential at the top of t's parent chain: the first
// token without a parent, or the JWT subject ("jwt:<sub>") the chain was
// minted from. A chain that breaks off (a parent no longer stored) ends at
// the last token found; parentProblem refuses such a token anyway.
func chainTop(byID map[string]*Token, t *Token) string {
	top := t.ID
	for range maxParentChain + 1 {
		if t.Parent == "" {
			return top
		}
		if strings.HasPrefix(t.Parent, JWTPrefix) {
			return t.Parent
		}
		next := byID[t.Parent]
		if next == nil {
			return top
		}
		t, top = next, next.ID
	}
	return top
}

// parentProblem says why t may not authenticate because of its parents (see
// chainProblem). The caller holds s.mu.
func (s *TokenStore) parentProblem(t *Token, now time.Time) error {
	return chainProblem(s.byID, s.subjects, t, now)
}

// SubjectRevoked reports when an operator revoked the JWT subject id
// ("jwt:<sub>"), if they did: the subject's access tokens issued until then
// are refused (see [Authenticator]).
func (s *TokenStore) SubjectRevoked(id string) (time.Time, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	at, ok := s.subjects[id]
	return at, ok
}

// List returns every token record, newest first. Records hold no secret,
// and a grant's no refresh hashes.
func (s *TokenStore) List() []Token {
	s.mu.RLock()
	out := make([]Token, 0, len(s.byID))
	for _, t := range s.byID {
		c := *t
		if c.Refresh != nil {
			sha := c.SHA256
			c = c.redacted()
			c.SHA256 = sha
		}
		if v, ok := s.used.Load(t.ID); ok {
			u := v.(time.Time)
			c.LastUsed = &u
		}
		out = append(out, c)
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.After(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Create issues a token. The secret is returned once and never stored.
func (s *TokenStore) Create(ctx context.Context, spec TokenSpec) (string, Token, error) {
	if err := ValidateSpec(spec); err != nil {
		return "", Token{}, err
	}
	if spec.Kind == "" {
		spec.Kind = KindUser
	}
	secret := NewTokenSecret()
	now := time.Now().UTC().Truncate(time.Second)
	tok := Token{
		ID:      newTokenID(),
		Name:    spec.Name,
		SHA256:  HashSecret(secret),
		Scopes:  append([]string(nil), spec.Scopes...),
		Kind:    spec.Kind,
		Created: now,
		Owner:   spec.Owner,
	}
	for _, r := range spec.Roots {
		tok.Roots = append(tok.Roots, filepath.Clean(r))
	}
	if spec.Expires > 0 {
		exp := now.Add(spec.Expires)
		tok.Expires = &exp
	}
	err := s.update(ctx, func(f *tokenFile) error {
		if err := nameFree(f, tok.Name); err != nil {
			return err
		}
		f.Tokens = append(f.Tokens, &tok)
		return nil
	})
	if err != nil {
		return "", Token{}, err
	}
	s.emit(TokenEvent{Action: "created", Token: tok})
	return secret, tok, nil
}

// Revoke revokes the token named or identified by nameOrID, and every token
// derived from it. Revoking is immediate: Check refuses the token as soon as
// Revoke returns, and what the token holds is cancelled. A grant is named
// by its id only: grants' names are labels, which many share.
func (s *TokenStore) Revoke(ctx context.Context, nameOrID string) (Token, error) {
	var revoked []Token
	var target Token
	err := s.update(ctx, func(f *tokenFile) error {
		revoked = revoked[:0]
		var match *Token
		for _, t := range f.Tokens {
			if t.ID == nameOrID || (t.Name == nameOrID && t.Revoked == nil && !t.IsGrant()) {
				match = t
				break
			}
		}
		if match == nil {
			for _, t := range f.Tokens {
				if t.Name == nameOrID && !t.IsGrant() {
					return fmt.Errorf("token %q is already revoked", nameOrID)
				}
			}
			return fmt.Errorf("%w %q: see `caddy zidane token list` for names and ids", ErrTokenNotFound, nameOrID)
		}
		if match.Revoked != nil {
			return fmt.Errorf("token %q is already revoked", nameOrID)
		}
		now := time.Now().UTC().Truncate(time.Second)
		ids := map[string]bool{match.ID: true}
		withDescendants(f, ids) // children, grandchildren
		for _, t := range f.Tokens {
			if ids[t.ID] && t.Revoked == nil {
				t.Revoked = &now
				revoked = append(revoked, *t)
			}
		}
		target = match.redacted()
		return nil
	})
	if err != nil {
		return Token{}, err
	}
	s.announceRevoked(revoked)
	return target, nil
}

// update applies fn to the stored token file under the storage lock, then
// swaps the in-memory index to the result.
func (s *TokenStore) update(ctx context.Context, fn func(*tokenFile) error) error {
	var written []byte
	err := storage.Update(ctx, s.st, TokensKey, func(old []byte) ([]byte, error) {
		f, err := decodeTokenFile(old)
		if err != nil {
			return nil, err
		}
		if err := fn(f); err != nil {
			return nil, err
		}
		pruneGrants(f, time.Now())
		mergeLastUsed(f, s.usedSnapshot())
		written, err = json.MarshalIndent(f, "", "  ")
		return written, err
	})
	if err != nil {
		return err
	}
	s.installMu.Lock()
	s.install(written)
	s.installMu.Unlock()
	return nil
}

func decodeTokenFile(raw []byte) (*tokenFile, error) {
	f := &tokenFile{Version: 1}
	if len(raw) == 0 {
		return f, nil
	}
	if err := json.Unmarshal(raw, f); err != nil {
		return nil, fmt.Errorf("token file %s is not valid JSON (%v): fix or restore it; nothing was changed", TokensKey, err)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("token file %s has version %d; this build reads version 1", TokensKey, f.Version)
	}
	return f, nil
}

func mergeLastUsed(f *tokenFile, used map[string]time.Time) {
	for _, t := range f.Tokens {
		if u, ok := used[t.ID]; ok && (t.LastUsed == nil || u.After(*t.LastUsed)) {
			u := u.UTC().Truncate(time.Second)
			t.LastUsed = &u
		}
	}
}

// install replaces the in-memory index with the parsed raw file and returns
// the tokens that became revoked (or disappeared) since the last install,
// and a record for each JWT subject newly revoked.
func (s *TokenStore) install(raw []byte) []Token {
	f, err := decodeTokenFile(raw)
	if err != nil {
		s.mu.Lock()
		s.loadErr = err
		s.mu.Unlock()
		return nil
	}
	byHash := make(map[[32]byte]*Token, len(f.Tokens))
	byID := make(map[string]*Token, len(f.Tokens))
	for _, t := range f.Tokens {
		var h [32]byte
		if b, err := hex.DecodeString(t.SHA256); err == nil && len(b) == 32 {
			copy(h[:], b)
			byHash[h] = t
		}
		byID[t.ID] = t
	}
	subjects := make(map[string]time.Time, len(f.Subjects))
	for _, r := range f.Subjects {
		subjects[r.Subject] = r.Revoked
	}
	s.mu.Lock()
	var gone []Token
	for id, at := range subjects {
		if old, ok := s.subjects[id]; s.loaded && (!ok || at.After(old)) {
			gone = append(gone, subjectToken(id, at))
		}
	}
	for id, old := range s.byID {
		nt := byID[id]
		if old.Revoked == nil && (nt == nil || nt.Revoked != nil) {
			if nt != nil {
				gone = append(gone, *nt)
			} else {
				gone = append(gone, *old)
			}
		}
	}
	s.byHash, s.byID, s.subjects, s.loadErr = byHash, byID, subjects, nil
	s.lastRaw = sha256.Sum256(raw)
	s.loaded = true
	s.mu.Unlock()
	return gone
}

// Sync reloads the token file if it changed, and runs the revoke hooks for
// tokens that another process revoked or deleted. A corrupt file leaves the
// last good index in place and is reported.
func (s *TokenStore) Sync(ctx context.Context) error {
	s.installMu.Lock()
	defer s.installMu.Unlock()
	raw, err := s.st.Load(ctx, TokensKey)
	if err != nil && !storage.IsNotExist(err) {
		return fmt.Errorf("loading tokens: %w", err)
	}
	s.mu.RLock()
	same := s.loaded && s.loadErr == nil && sha256.Sum256(raw) == s.lastRaw
	s.mu.RUnlock()
	if same {
		return nil
	}
	gone := s.install(raw)
	s.mu.RLock()
	loadErr := s.loadErr
	s.mu.RUnlock()
	if loadErr != nil {
		return loadErr
	}
	for _, t := range gone {
		s.emit(TokenEvent{Action: "seen_revoked", Token: t})
		s.fireRevoke(t)
	}
	return nil
}

// Flush writes the last-used times recorded since the previous flush.
func (s *TokenStore) Flush(ctx context.Context) error {
	snap := s.usedSnapshot()
	if len(snap) == 0 {
		return nil
	}
	err := s.update(ctx, func(*tokenFile) error { return nil })
	if err == nil {
		// A use recorded since the snapshot stays for the next flush.
		for id, t := range snap {
			s.used.CompareAndDelete(id, t)
		}
	}
	return err
}

func (s *TokenStore) usedSnapshot() map[string]time.Time {
	snap := map[string]time.Time{}
	s.used.Range(func(k, v any) bool {
		snap[k.(string)] = v.(time.Time)
		return true
	})
	return snap
}

// Run syncs every syncEvery and flushes last-used times every flushEvery
// until ctx ends, then flushes once more. report receives errors.
func (s *TokenStore) Run(ctx context.Context, syncEvery, flushEvery time.Duration, report func(error)) {
	syncT := time.NewTicker(syncEvery)
	defer syncT.Stop()
	flushT := time.NewTicker(flushEvery)
	defer flushT.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := s.Flush(context.Background()); err != nil && report != nil {
				report(err)
			}
			return
		case <-syncT.C:
			if err := s.Sync(ctx); err != nil && report != nil && ctx.Err() == nil {
				report(err)
			}
		case <-flushT.C:
			if err := s.Flush(ctx); err != nil && report != nil && ctx.Err() == nil {
				report(err)
			}
		}
	}
}

func (s *TokenStore) emit(ev TokenEvent) {
	s.hookMu.Lock()
	fn := s.onEvent
	s.hookMu.Unlock()
	if fn != nil {
		fn(ev)
	}
}

func (s *TokenStore) fireRevoke(t Token) {
	if !IsJWTID(t.ID) {
		s.markEnded(t.ID, time.Now())
	}
	for _, cancel := range s.takeHolds(t.ID, false) {
		cancel()
	}
	s.hookMu.Lock()
	hooks := append([]func(Token){}, s.onRevoke...)
	s.hookMu.Unlock()
	for _, fn := range hooks {
		if fn != nil {
			fn(t)
		}
	}
}
