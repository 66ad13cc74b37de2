package connect

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Where connect links and the authorizations they started are kept, each
// under the hex SHA-256 of its secret (the link's, or the authorization's
// state): storage never holds either.
const (
	LinkKeyPrefix = "zidane/connect/links/"
	FlowKeyPrefix = "zidane/connect/flows/"
	// DoneKeyPrefix notes a completed elicitation (under the hash of its
	// id) with its owner, until FlowLifetime after: a replica other than
	// the one the callback landed on learns of it there.
	DoneKeyPrefix = "zidane/connect/done/"
	// OwnerKeyPrefix holds, per owner (under the hex SHA-256 of the
	// owner), the keys of their live links, so that one owner's calls
	// cannot fill storage with links: past MaxLinksPerOwner the oldest
	// goes.
	OwnerKeyPrefix = "zidane/connect/owners/"
)

const (
	// DefaultLifetime is a connect link's lifetime.
	DefaultLifetime = 10 * time.Minute
	// MaxLifetime bounds it: the link is for the call in progress.
	MaxLifetime = time.Hour
	// FlowLifetime is how long an authorization started from a link
	// awaits its callback, as long as the upstream OAuth client's own
	// pending login.
	FlowLifetime = 10 * time.Minute
	// MaxLinksPerOwner bounds an owner's live links: a client that calls
	// in a loop gets new links, and the oldest stop working.
	MaxLinksPerOwner = 8
	// maxRecord bounds a record read back from storage.
	maxRecord = 4 << 10
	// maxPrune bounds how many stored records one Create looks at to
	// delete the expired ones.
	maxPrune = 1000
)

// linkSecretPrefix starts every link secret, so that one found in a paste
// or a scan says what it is.
const linkSecretPrefix = "zcl_"

// Errors of a link or a flow that cannot be used. Which of unknown or used
// a refused secret was is not told: storage keeps neither.
var (
	ErrUnknown = errors.New("this connect link is unknown or was used already")
	ErrExpired = errors.New("this connect link has expired")
	// ErrOwner: the browser is signed in as someone else than the person
	// whose call made the link.
	ErrOwner = errors.New("this connect link belongs to another person")
)

// record is a link, or an authorization started from one: whose, for
// which upstream, for which elicitation, until when.
type record struct {
	Owner       string    `json:"owner"`
	Upstream    string    `json:"upstream"`
	Elicitation string    `json:"elicitation"`
	Expires     time.Time `json:"expires"`
	// At is when a completion was noted (DoneKeyPrefix records).
	At time.Time `json:"at,omitzero"`
}

// records is one kind of record in storage, each under the hash of its
// secret, taken once under the storage lock.
type records struct {
	store  storage.Storage
	prefix string
	now    func() time.Time
	mu     sync.Mutex // queues this process's takes ahead of the storage lock, as storage.Update does
}

func (rs *records) key(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return rs.prefix + hex.EncodeToString(sum[:])
}

func (rs *records) put(ctx context.Context, secret string, rec record) error {
	rs.prune(ctx)
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return rs.store.Store(ctx, rs.key(secret), b)
}

// read decodes a stored record; anything unreadable is unknown.
func (rs *records) read(ctx context.Context, key string) (record, error) {
	raw, err := rs.store.Load(ctx, key)
	if storage.IsNotExist(err) {
		return record{}, ErrUnknown
	}
	if err != nil {
		return record{}, fmt.Errorf("the connect link could not be read (%v); try again", err)
	}
	var rec record
	if len(raw) > maxRecord || json.Unmarshal(raw, &rec) != nil || rec.Owner == "" || rec.Upstream == "" {
		return record{}, ErrUnknown
	}
	return rec, nil
}

// ownerLink is one entry of an owner's index of live links.
type ownerLink struct {
	Key         string    `json:"key"`
	Upstream    string    `json:"upstream"`
	Made        time.Time `json:"made,omitzero"`
	Elicitation string    `json:"elicitation"`
	Expires     time.Time `json:"expires"`
}

// putOwned stores the link of secret, and notes it in its owner's index:
// expired entries leave the index, and past MaxLinksPerOwner the oldest
// link is deleted.
func (rs *records) putOwned(ctx context.Context, secret string, rec record) error {
	index := ownerIndexKey(rec.Owner)
	now := rs.now()
	return storage.Update(ctx, rs.store, index, func(old []byte) ([]byte, error) {
		var live []ownerLink
		if len(old) > maxRecord*4 || (old != nil && json.Unmarshal(old, &live) != nil) {
			live = nil // unreadable: its links expire on their own
		}
		live = slices.DeleteFunc(live, func(l ownerLink) bool { return !now.Before(l.Expires) || !strings.HasPrefix(l.Key, rs.prefix) })
		slices.SortStableFunc(live, func(a, b ownerLink) int { return a.Expires.Compare(b.Expires) })
		for len(live) >= MaxLinksPerOwner {
			_ = rs.store.Delete(ctx, live[0].Key)
			live = live[1:]
		}
		if err := rs.put(ctx, secret, rec); err != nil {
			return nil, err
		}
		return json.Marshal(append(live, ownerLink{Key: rs.key(secret), Upstream: rec.Upstream, Made: now, Elicitation: rec.Elicitation, Expires: rec.Expires}))
	})
}

func ownerIndexKey(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return OwnerKeyPrefix + hex.EncodeToString(sum[:])
}

// issued reports whether owner's index lists the elicitation id, made
// for upstream, with a link still live (used or not: the retry of a call
// comes after its person used the link), and when that link was made.
func (rs *records) issued(ctx context.Context, owner, upstream, elicitation string) (made time.Time, ok bool) {
	raw, err := rs.store.Load(ctx, ownerIndexKey(owner))
	var live []ownerLink
	if err != nil || len(raw) > maxRecord*4 || json.Unmarshal(raw, &live) != nil {
		return time.Time{}, false
	}
	now := rs.now()
	i := slices.IndexFunc(live, func(l ownerLink) bool {
		return l.Elicitation == elicitation && l.Upstream == upstream && now.Before(l.Expires)
	})
	if i < 0 {
		return time.Time{}, false
	}
	return live[i].Made, true
}

// upstreamOf is the upstream of owner's live link of the elicitation id.
func (rs *records) upstreamOf(ctx context.Context, owner, elicitation string) (string, bool) {
	raw, err := rs.store.Load(ctx, ownerIndexKey(owner))
	var live []ownerLink
	if err != nil || len(raw) > maxRecord*4 || json.Unmarshal(raw, &live) != nil {
		return "", false
	}
	now := rs.now()
	for _, l := range live {
		if l.Elicitation == elicitation && now.Before(l.Expires) && l.Upstream != "" {
			return l.Upstream, true
		}
	}
	return "", false
}

// elicitations are the ids of owner's live links for upstream, oldest
// first.
func (rs *records) elicitations(ctx context.Context, owner, upstream string) []string {
	raw, err := rs.store.Load(ctx, ownerIndexKey(owner))
	var live []ownerLink
	if err != nil || len(raw) > maxRecord*4 || json.Unmarshal(raw, &live) != nil {
		return nil
	}
	now := rs.now()
	var ids []string
	for _, l := range live {
		if l.Upstream == upstream && now.Before(l.Expires) {
			ids = append(ids, l.Elicitation)
		}
	}
	return ids
}

// peek returns the record of secret without using it up.
func (rs *records) peek(ctx context.Context, secret string) (record, error) {
	rec, err := rs.read(ctx, rs.key(secret))
	if err != nil {
		return record{}, err
	}
	if !rs.now().Before(rec.Expires) {
		return rec, ErrExpired
	}
	return rec, nil
}

// take uses the record of secret up, if it is owner's and unexpired. A
// record of another owner is left in place (ErrOwner), so that a browser
// signed in as the wrong person cannot burn the owner's link; an expired
// one is deleted. Of two takes on any process sharing the storage, one
// wins.
func (rs *records) take(ctx context.Context, secret, owner string) (record, error) {
	key := rs.key(secret)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if err := rs.store.Lock(ctx, key); err != nil {
		return record{}, fmt.Errorf("the connect link could not be checked (storage lock: %v); try again", err)
	}
	defer rs.store.Unlock(context.WithoutCancel(ctx), key)
	rec, err := rs.read(ctx, key)
	if err != nil {
		return record{}, err
	}
	if !rs.now().Before(rec.Expires) {
		_ = rs.store.Delete(ctx, key)
		return rec, ErrExpired
	}
	if rec.Owner != owner {
		return rec, ErrOwner
	}
	if err := rs.store.Delete(ctx, key); err != nil {
		return record{}, fmt.Errorf("the connect link could not be used up (%v); try again", err)
	}
	return rec, nil
}

// prune deletes expired records, looking at no more than maxPrune; each
// is deleted under its lock, so that pruning and taking never both read
// one. Failures are left for the next put.
func (rs *records) prune(ctx context.Context) {
	keys, err := rs.store.List(ctx, strings.TrimSuffix(rs.prefix, "/"), false)
	if err != nil {
		return
	}
	now := rs.now()
	for i, key := range keys {
		if i == maxPrune || ctx.Err() != nil {
			return
		}
		if !strings.HasPrefix(key, rs.prefix) {
			continue
		}
		rec, err := rs.read(ctx, key)
		if err != nil || now.Before(rec.Expires) {
			continue
		}
		if rs.store.Lock(ctx, key) == nil {
			_ = rs.store.Delete(ctx, key)
			_ = rs.store.Unlock(context.WithoutCancel(ctx), key)
		}
	}
}

// newSecret is a link secret: the prefix and 32 random bytes in unpadded
// base64url.
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return linkSecretPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// validSecret reports whether s has the shape of a link secret.
func validSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, linkSecretPrefix)
	if !ok || len(rest) != 43 {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	return err == nil && len(b) == 32
}

// newElicitationID is an elicitation's id: 16 random bytes in base64url.
func newElicitationID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
