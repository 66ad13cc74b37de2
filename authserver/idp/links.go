package idp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// LinkKeyPrefix is where links are kept in storage, each under the hex
// SHA-256 of its secret: storage never holds a secret, so whoever reads
// it cannot sign in.
const LinkKeyPrefix = "zidane/signin/links/"

// linkSecretPrefix starts every link secret, so that one found in a
// paste or a scan says what it is.
const linkSecretPrefix = "zsl_"

const (
	// DefaultLinkLifetime is a link's lifetime when none is asked.
	DefaultLinkLifetime = 10 * time.Minute
	// MaxLinkLifetime bounds it: a link travels in chat and mail.
	MaxLinkLifetime = 24 * time.Hour
	// maxLinkRecord bounds a stored link read back.
	maxLinkRecord = 16 << 10
	// maxPrune bounds how many stored links one Create looks at to
	// delete the expired ones.
	maxPrune = 1000
)

// Errors of [Links.Redeem]. Which of unknown or used a refused secret was
// is not told: storage keeps neither.
var (
	ErrLinkUnknown = errors.New("this sign-in link is unknown or was used already; ask for a new one")
	ErrLinkExpired = errors.New("this sign-in link has expired; ask for a new one")
)

// LinkSpec is what a new link signs a browser in as, and for how long the
// link is good.
type LinkSpec struct {
	Owner   string
	Name    string
	Scopes  []string
	Expires time.Duration // DefaultLinkLifetime when zero
}

type linkRecord struct {
	Owner   string    `json:"owner"`
	Name    string    `json:"name,omitempty"`
	Scopes  []string  `json:"scopes"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// Links makes and redeems one-time sign-in links for a host without an
// IdP. A link is single use across every process on the same storage: it
// is deleted under the storage lock before it signs anyone in.
type Links struct {
	store storage.Storage
	now   func() time.Time
	mu    sync.Mutex // queues this process's redemptions ahead of the storage lock, as storage.Update does
}

// NewLinks returns the links kept in store; now is time.Now when nil.
func NewLinks(store storage.Storage, now func() time.Time) *Links {
	if now == nil {
		now = time.Now
	}
	return &Links{store: store, now: now}
}

// Create stores a link for spec and returns its secret, once, and when it
// expires. Expired links left unused are deleted on the way.
func (l *Links) Create(ctx context.Context, spec LinkSpec) (secret string, expires time.Time, err error) {
	if err := spec.Check(); err != nil {
		return "", time.Time{}, err
	}
	life := spec.Expires
	if life == 0 {
		life = DefaultLinkLifetime
	}
	p := Person{Owner: spec.Owner, Scopes: sortedUnique(spec.Scopes)}
	l.prune(ctx)
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", time.Time{}, err
	}
	secret = linkSecretPrefix + base64.RawURLEncoding.EncodeToString(b)
	now := l.now().UTC()
	rec, err := json.Marshal(linkRecord{Owner: p.Owner, Name: displayName(spec.Name, p.Owner), Scopes: p.Scopes, Created: now, Expires: now.Add(life)})
	if err != nil {
		return "", time.Time{}, err
	}
	if err := l.store.Store(ctx, linkKey(secret), rec); err != nil {
		return "", time.Time{}, fmt.Errorf("keeping the sign-in link: %w", err)
	}
	return secret, now.Add(life), nil
}

// Check says what is wrong with spec: an owner policy refuses for a
// person, no scope or one twice, a lifetime out of bounds.
func (spec LinkSpec) Check() error {
	if spec.Expires < 0 || spec.Expires > MaxLinkLifetime {
		return fmt.Errorf("a sign-in link lasts between 1s and %s; asked %s", MaxLinkLifetime, spec.Expires)
	}
	p := Person{Owner: spec.Owner, Scopes: sortedUnique(spec.Scopes)}
	if len(p.Scopes) != len(spec.Scopes) {
		return fmt.Errorf("a scope is given twice: give each once")
	}
	return p.check()
}

// Redeem uses the link of secret: it is deleted, and the person it names
// returned, if it exists and has not expired. Of two redemptions of one
// link, on any process sharing the storage, one wins.
func (l *Links) Redeem(ctx context.Context, secret string) (Person, error) {
	if !validSecret(secret) {
		return Person{}, ErrLinkUnknown
	}
	key := linkKey(secret)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.store.Lock(ctx, key); err != nil {
		return Person{}, fmt.Errorf("the sign-in link could not be checked (storage lock: %v); try again", err)
	}
	defer l.store.Unlock(context.WithoutCancel(ctx), key)
	raw, err := l.store.Load(ctx, key)
	if storage.IsNotExist(err) {
		return Person{}, ErrLinkUnknown
	}
	if err != nil {
		return Person{}, fmt.Errorf("the sign-in link could not be read (%v); try again", err)
	}
	if err := l.store.Delete(ctx, key); err != nil {
		return Person{}, fmt.Errorf("the sign-in link could not be used up (%v); try again", err)
	}
	var rec linkRecord
	if len(raw) > maxLinkRecord || json.Unmarshal(raw, &rec) != nil {
		return Person{}, ErrLinkUnknown
	}
	if !l.now().Before(rec.Expires) {
		return Person{}, ErrLinkExpired
	}
	p := Person{Owner: rec.Owner, Name: displayName(rec.Name, rec.Owner), Scopes: rec.Scopes}
	if err := p.check(); err != nil {
		return Person{}, ErrLinkUnknown
	}
	return p, nil
}

// prune deletes expired links, looking at no more than maxPrune. A link
// is deleted under its lock, so that pruning and redeeming never both
// read one; failures are left for the next Create.
func (l *Links) prune(ctx context.Context) {
	keys, err := l.store.List(ctx, strings.TrimSuffix(LinkKeyPrefix, "/"), false)
	if err != nil {
		return
	}
	now := l.now()
	for i, key := range keys {
		if i == maxPrune || ctx.Err() != nil {
			return
		}
		if !strings.HasPrefix(key, LinkKeyPrefix) {
			continue
		}
		raw, err := l.store.Load(ctx, key)
		var rec linkRecord
		if err != nil || len(raw) > maxLinkRecord || json.Unmarshal(raw, &rec) != nil || now.Before(rec.Expires) {
			continue
		}
		if l.store.Lock(ctx, key) == nil {
			_ = l.store.Delete(ctx, key)
			_ = l.store.Unlock(context.WithoutCancel(ctx), key)
		}
	}
}

func linkKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return LinkKeyPrefix + hex.EncodeToString(sum[:])
}

// validSecret reports whether s has the shape of a link secret: the
// prefix and 32 bytes in unpadded base64url.
func validSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, linkSecretPrefix)
	if !ok || len(rest) != 43 {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	return err == nil && len(b) == 32
}

// LinkURL is the link a person opens: the site's origin, [LinkPath], and
// the secret in the fragment, which a browser never sends in a request
// (so it reaches no access log, proxy or Referer). The page reads it and
// posts it when the person presses the button.
func LinkURL(site, secret string) string {
	return strings.TrimSuffix(site, "/") + LinkPath + "#" + secret
}
