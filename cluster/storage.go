package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Errors a lock holder gets when its lock no longer protects it.
var (
	// ErrLockLost: the holder's lock lapsed (it could not renew it within
	// its TTL) or was taken by another holder; what the holder writes under
	// that lock is refused.
	ErrLockLost = errors.New("storage lock lost: it lapsed or another holder took it")
	// ErrFenced: another holder wrote the key after this holder read it
	// under its lock; the write is refused so that no update is lost.
	ErrFenced = errors.New("storage write fenced: another holder wrote this key since it was read under the lock")
)

// StorageOptions configure a [Storage].
type StorageOptions struct {
	// Bucket names the KV bucket of values; "<Bucket>_locks" holds the
	// locks and "<Bucket>_blobs" (an object store) the values too large for
	// one NATS message. Default "zidane".
	Bucket string
	// Replicas of each bucket: 3 on a three-node cluster. Default 1.
	Replicas int
	// Owner names this holder in the locks it takes (a node id). A random
	// suffix is added, so two Storages never mistake each other's locks.
	Owner string
	// LockTTL is how long a lock outlives its holder's last renewal, at
	// least (the locks bucket keeps the longest TTL a replica asked for).
	// Default 15 s; the holder renews every third of it.
	LockTTL time.Duration
	// LockPoll bounds how long a waiting Lock goes without trying again
	// (a lock that lapses makes no event to wake on). Default 1 s.
	LockPoll time.Duration
	// Key is the cluster key (KeySize bytes): every value is sealed with a
	// key derived from it. Required.
	Key []byte
	// Name says which storage this is, for String (and so for pooling what
	// is kept per storage across config reloads).
	Name string
	// InlineMax is the largest value kept in the KV bucket itself; larger
	// ones go to the object store, in chunks. Default: half the server's
	// max payload, at most 512 KiB.
	InlineMax int
	// Logger gets a line each time a watch is made again after NATS went
	// away or lost its consumer (see Storage.Watch). Default: the Conn's
	// logger for a Storage opened by Conn.Storage, else none.
	Logger *slog.Logger
}

// Storage is a certmagic.Storage (and so a storage.Storage) on JetStream:
// values in a KV bucket, large values in an object store, locks in a KV
// bucket whose entries expire after the lock TTL. See the package doc.
type Storage struct {
	data   jetstream.KeyValue
	locks  jetstream.KeyValue
	blobs  jetstream.ObjectStore
	opts   StorageOptions
	holder string
	seal   *sealer
	conn   *Conn // when opened by Conn.Storage
	js     jetstream.JetStream
	log    *slog.Logger          // nil: none
	nodes  atomic.Pointer[Nodes] // the node registry started on this storage, if any

	// leader reads the data bucket's stream from its leader (see
	// loadEntry); nats.go's KeyValue reads by direct get only.
	leader nats.JetStreamContext

	mu   sync.Mutex
	held map[string]*heldLock // lock name -> the lock this Storage holds

	// beforeWait, in tests, runs when a Lock that found the lock taken is
	// about to wait for it.
	beforeWait func()

	// stalled, in tests, stops renewals the way a paused process would:
	// no renewal runs and none fails.
	stalled atomic.Bool

	// watchResync, in tests, replaces WatchResync.
	watchResync time.Duration
}

type heldLock struct {
	key  string // KV key in the locks bucket
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex
	rev  uint64            // the lock entry's revision after the last renewal
	lost bool              // renewal failed for good
	seen map[string]uint64 // storage key -> data revision read under this lock (0: absent)
}

// value tags: the first byte of every value in the data bucket.
const (
	tagInline = 0x00
	tagBlob   = 0x01
)

// blobRef is what the data bucket holds for a value in the object store.
type blobRef struct {
	Object string `json:"o"`
	Size   int64  `json:"n"`
}

// lockValue is what a lock entry holds.
type lockValue struct {
	Holder string    `json:"holder"`
	At     time.Time `json:"at"`
}

// NewStorage opens (creating them if need be) the buckets of a Storage on
// js. maxPayload is the server's max payload (nats.Conn.MaxPayload), which
// bounds what one KV value may hold.
func NewStorage(ctx context.Context, js jetstream.JetStream, maxPayload int64, opts StorageOptions) (*Storage, error) {
	if opts.Bucket == "" {
		opts.Bucket = "zidane"
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.LockTTL == 0 {
		opts.LockTTL = 15 * time.Second
	}
	if opts.LockPoll == 0 {
		opts.LockPoll = time.Second
	}
	if opts.InlineMax == 0 {
		opts.InlineMax = int(min(maxPayload/2, 512<<10))
	}
	if opts.InlineMax <= 0 || int64(opts.InlineMax) >= maxPayload {
		return nil, fmt.Errorf("cluster storage: inline max %d must be positive and under the server's max payload (%d)", opts.InlineMax, maxPayload)
	}
	sl, err := newSealer(opts.Key, "storage v1")
	if err != nil {
		return nil, fmt.Errorf("cluster storage: %w", err)
	}
	if opts.LockTTL < time.Second {
		return nil, fmt.Errorf("cluster storage: lock TTL %v is under 1s; JetStream expires entries about once a second", opts.LockTTL)
	}
	data, err := setUp(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: opts.Bucket, History: 1, Replicas: opts.Replicas,
			Description: "caddy-zidane-mcp storage: values",
		})
	})
	if err != nil {
		return nil, fmt.Errorf("cluster storage: KV bucket %q: %w", opts.Bucket, err)
	}
	locks, err := setUp(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
		return openLocks(ctx, js, opts)
	})
	if err != nil {
		return nil, fmt.Errorf("cluster storage: KV bucket %q: %w", opts.Bucket+"_locks", err)
	}
	blobs, err := setUp(ctx, func(ctx context.Context) (jetstream.ObjectStore, error) {
		return js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket: opts.Bucket + "_blobs", Replicas: opts.Replicas,
			Description: "caddy-zidane-mcp storage: values over the inline limit",
		})
	})
	if err != nil {
		return nil, fmt.Errorf("cluster storage: object store %q: %w", opts.Bucket+"_blobs", err)
	}
	jo := js.Options()
	prefix := nats.APIPrefix(jo.APIPrefix)
	if jo.Domain != "" {
		prefix = nats.Domain(jo.Domain)
	}
	leader, err := js.Conn().JetStream(prefix)
	if err != nil {
		return nil, fmt.Errorf("cluster storage: %w", err)
	}
	return &Storage{
		data: data, leader: leader, locks: locks, blobs: blobs, opts: opts, seal: sl, js: js, log: opts.Logger,
		holder: opts.Owner + "#" + randomHex(8),
		held:   map[string]*heldLock{},
	}, nil
}

// openLocks creates or updates the locks bucket. Its TTL is the longest
// any replica asked for: one with a shorter lock_ttl renews more often
// than it must, while lowering the TTL under a replica that renews every
// third of a longer one would make its locks lapse while it holds them.
// The TTL there is read on each attempt: a replica that started at the
// same instant may have just created the bucket.
func openLocks(ctx context.Context, js jetstream.JetStream, opts StorageOptions) (jetstream.KeyValue, error) {
	ttl := opts.LockTTL
	kv, err := js.KeyValue(ctx, opts.Bucket+"_locks")
	switch {
	case err == nil:
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, err
		}
		ttl = max(ttl, st.TTL())
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, err
	}
	return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: opts.Bucket + "_locks", History: 1, Replicas: opts.Replicas, TTL: ttl,
		Description: "caddy-zidane-mcp storage: locks, each expiring one TTL after its last renewal",
	})
}

// DeriveKey returns the key for purpose derived from the cluster key this
// storage seals with: what one replica seals or signs for that purpose,
// every replica opens.
func (s *Storage) DeriveKey(purpose string) ([]byte, error) { return Derive(s.opts.Key, purpose) }

// SecretFiles are the files that authenticate this storage's connection to
// NATS ([Conn.SecretFiles]); none for a storage opened without one.
func (s *Storage) SecretFiles() []string {
	if s.conn == nil {
		return nil
	}
	return s.conn.SecretFiles()
}

// Connected says whether the storage's NATS connection is up now.
func (s *Storage) Connected() bool { return s.conn != nil && s.conn.nc.IsConnected() }

// String names the storage: stable for as long as its options are.
func (s *Storage) String() string { return "zidane_nats:" + s.opts.Name + "/" + s.opts.Bucket }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Store puts value at key.
func (s *Storage) Store(ctx context.Context, key string, value []byte) error {
	k, err := kvKey(key)
	if err != nil {
		return err
	}
	stored, blob, err := s.encode(ctx, key, value)
	if err != nil {
		return err
	}
	old, _, _ := retry(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return s.data.Get(ctx, k) }) // to free the old blob, if any
	if err := s.write(ctx, key, k, stored); err != nil {
		if blob != "" {
			_ = s.blobs.Delete(context.WithoutCancel(ctx), blob)
		}
		return err
	}
	s.freeBlob(ctx, old, blob)
	return nil
}

// write stores an encoded value: fenced by the revision read under this
// Storage's lock named key, when there is one.
func (s *Storage) write(ctx context.Context, key, k string, stored []byte) error {
	s.mu.Lock()
	hl := s.held[key]
	s.mu.Unlock()
	if hl == nil {
		_, _, err := retry(ctx, func(ctx context.Context) (uint64, error) { return s.data.Put(ctx, k, stored) })
		return wrapNATS("store", key, err)
	}
	hl.mu.Lock()
	defer hl.mu.Unlock()
	if hl.lost {
		return fmt.Errorf("store %q: %w", key, ErrLockLost)
	}
	rev, seen := hl.seen[key]
	var err error
	var next uint64
	var tried int
	switch {
	case !seen:
		next, _, err = retry(ctx, func(ctx context.Context) (uint64, error) { return s.data.Put(ctx, k, stored) })
	default:
		next, tried, err = retry(ctx, func(ctx context.Context) (uint64, error) {
			if rev == 0 {
				return s.data.Create(ctx, k, stored)
			}
			return s.data.Update(ctx, k, stored, rev)
		})
		if errors.Is(err, jetstream.ErrKeyExists) || isRevisionMismatch(err) {
			// After an attempt that got no answer, the compare-and-set may
			// have landed and its retry found it: the entry is then ours,
			// byte for byte (every sealing has its own nonce).
			if tried > 1 {
				if e, gerr := s.data.Get(ctx, k); gerr == nil && bytes.Equal(e.Value(), stored) {
					hl.seen[key] = e.Revision()
					return nil
				}
			}
			return fmt.Errorf("store %q: %w", key, ErrFenced)
		}
	}
	if err != nil {
		return wrapNATS("store", key, err)
	}
	hl.seen[key] = next
	return nil
}

func isRevisionMismatch(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164)
}

// encode turns a value into what the data bucket holds: a tag byte, then
// the value sealed, or a sealed reference to an object holding the value
// sealed.
func (s *Storage) encode(ctx context.Context, key string, value []byte) (stored []byte, blob string, err error) {
	if len(value)+1+sealOverhead <= s.opts.InlineMax {
		return s.seal.seal([]byte{tagInline}, value, s.valueAD(key, tagInline)), "", nil
	}
	blob = randomHex(16)
	sealed := s.seal.seal(nil, value, where("blob", s.opts.Bucket, blob))
	if _, _, err := retryEach(ctx, blobAttemptTimeout, func(ctx context.Context) (*jetstream.ObjectInfo, error) { return s.blobs.PutBytes(ctx, blob, sealed) }); err != nil {
		return nil, "", wrapNATS("store", key, err)
	}
	ref, _ := json.Marshal(blobRef{Object: blob, Size: int64(len(value))})
	return s.seal.seal([]byte{tagBlob}, ref, s.valueAD(key, tagBlob)), blob, nil
}

// valueAD binds a sealed entry to its bucket, its key and its tag.
func (s *Storage) valueAD(key string, tag byte) []byte {
	return append(where("value", s.opts.Bucket, key), 0, tag)
}

// openRef opens the reference an entry of key holds, if it holds one.
func (s *Storage) openRef(key string, v []byte) (blobRef, bool) {
	var ref blobRef
	if len(v) == 0 || v[0] != tagBlob {
		return ref, false
	}
	raw, err := s.seal.open(v[1:], s.valueAD(key, tagBlob))
	if err != nil || json.Unmarshal(raw, &ref) != nil || ref.Object == "" {
		return ref, false
	}
	return ref, true
}

// sealOverhead is what sealing adds: a 12-byte nonce and a 16-byte tag.
const sealOverhead = 12 + 16

// freeBlob deletes the object an overwritten or deleted entry referred to.
func (s *Storage) freeBlob(ctx context.Context, old jetstream.KeyValueEntry, keep string) {
	if old == nil {
		return
	}
	sk, err := storageKey(old.Key())
	if err != nil {
		return
	}
	ref, ok := s.openRef(sk, old.Value())
	if ok && ref.Object != keep {
		_ = s.blobs.Delete(context.WithoutCancel(ctx), ref.Object)
	}
}

// Load returns the value at key; fs.ErrNotExist when there is none.
func (s *Storage) Load(ctx context.Context, key string) ([]byte, error) {
	k, err := kvKey(key)
	if err != nil {
		return nil, err
	}
	// A value being replaced may lose its object between reading the
	// reference and the object: read the reference again, a few times.
	fromLeader := s.holds(key)
	for range 3 {
		e, _, err := retry(ctx, func(ctx context.Context) (entry, error) { return s.loadEntry(ctx, k, fromLeader) })
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			s.noteRead(key, 0)
			return nil, fmt.Errorf("load %q: %w", key, fs.ErrNotExist)
		}
		if err != nil {
			return nil, wrapNATS("load", key, err)
		}
		v, again, err := s.decode(ctx, key, e.value)
		if again {
			continue
		}
		if err != nil {
			return nil, err
		}
		s.noteRead(key, e.rev)
		return v, nil
	}
	return nil, fmt.Errorf("load %q: its value kept changing while it was read; try again", key)
}

// entry is a data bucket entry as Load reads it.
type entry struct {
	value []byte
	rev   uint64
}

// holds says whether this Storage holds the lock named key.
func (s *Storage) holds(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[key] != nil
}

// loadEntry reads the entry of KV key k; jetstream.ErrKeyNotFound when
// there is none. fromLeader reads it from the stream's leader: a direct
// get (what KeyValue.Get does) is answered by whichever replica of the
// stream is nearest, and a follower may not yet have applied a write the
// leader acknowledged. A read under the key's lock starts a
// read-modify-write whose last writer may have been another replica an
// instant ago, just before it released the lock: from a follower, it
// could get the value before that write, and act on it (redeem a rotated
// refresh token again, miss a pending login just stored) before the
// fenced write-back refuses the rest.
func (s *Storage) loadEntry(ctx context.Context, k string, fromLeader bool) (entry, error) {
	if !fromLeader {
		e, err := s.data.Get(ctx, k)
		if err != nil {
			return entry{}, err
		}
		return entry{e.Value(), e.Revision()}, nil
	}
	m, err := s.leader.GetLastMsg("KV_"+s.opts.Bucket, "$KV."+s.opts.Bucket+"."+k, nats.Context(ctx))
	if errors.Is(err, nats.ErrMsgNotFound) {
		return entry{}, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return entry{}, err
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return entry{}, jetstream.ErrKeyNotFound
	}
	return entry{m.Data, m.Sequence}, nil
}

// noteRead records, under this Storage's lock named key, the revision of
// key that its holder read, for write and Delete to fence on. The first
// read under the lock sets the fence and later reads leave it (the
// holder's own writes move it): a read that sees another holder's write
// (another goroutine of this process, a token sync woken by that write)
// must not make a stale holder's write-back look fresh.
func (s *Storage) noteRead(key string, rev uint64) {
	s.mu.Lock()
	hl := s.held[key]
	s.mu.Unlock()
	if hl == nil {
		return
	}
	hl.mu.Lock()
	if _, ok := hl.seen[key]; !ok {
		hl.seen[key] = rev
	}
	hl.mu.Unlock()
}

func (s *Storage) decode(ctx context.Context, key string, v []byte) (value []byte, again bool, err error) {
	if len(v) == 0 {
		return nil, false, fmt.Errorf("load %q: the stored entry is empty; it was not written by this storage", key)
	}
	switch v[0] {
	case tagInline:
		p, err := s.seal.open(v[1:], s.valueAD(key, tagInline))
		if err != nil {
			return nil, false, fmt.Errorf("load %q: %w", key, err)
		}
		return p, false, nil
	case tagBlob:
		ref, ok := s.openRef(key, v)
		if !ok {
			return nil, false, fmt.Errorf("load %q: %w", key, ErrUnsealed)
		}
		b, _, err := retryEach(ctx, blobAttemptTimeout, func(ctx context.Context) ([]byte, error) { return s.readBlob(ctx, ref) })
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return nil, true, nil
		}
		if errors.Is(err, ErrUnsealed) {
			return nil, false, fmt.Errorf("load %q: its object: %w", key, err)
		}
		if err != nil {
			return nil, false, wrapNATS("load", key, err)
		}
		p, err := s.seal.open(b, where("blob", s.opts.Bucket, ref.Object))
		if err != nil || int64(len(p)) != ref.Size {
			return nil, false, fmt.Errorf("load %q: its object: %w", key, ErrUnsealed)
		}
		return p, false, nil
	}
	return nil, false, fmt.Errorf("load %q: the stored entry has unknown tag %#x; it was not written by this storage", key, v[0])
}

// blobReadTimeout bounds the reading of one object.
const blobReadTimeout = time.Minute

// readBlob reads the object ref names, as this storage wrote it: an object
// of the size ref gives (sealed), not a link. Whoever can write the object
// store's metadata can make it a link, which nats.go follows (a link to
// itself until the context ends), or an object of any size, which
// GetBytes would read whole: neither is read.
func (s *Storage) readBlob(ctx context.Context, ref blobRef) ([]byte, error) {
	want := uint64(ref.Size) + sealOverhead
	ours := func(info *jetstream.ObjectInfo) bool {
		return info != nil && info.Name == ref.Object && (info.Opts == nil || info.Opts.Link == nil) && info.Size == want
	}
	ctx, cancel := context.WithTimeout(ctx, blobReadTimeout)
	defer cancel()
	info, err := s.blobs.GetInfo(ctx, ref.Object)
	if err != nil {
		return nil, err
	}
	if !ours(info) {
		return nil, ErrUnsealed
	}
	// What changed since GetInfo is checked again on what Get read; a link
	// made in between is followed only until blobReadTimeout.
	res, err := s.blobs.Get(ctx, ref.Object)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Close() }()
	if i, err := res.Info(); err != nil || !ours(i) {
		return nil, ErrUnsealed
	}
	b := make([]byte, 0, want)
	buf := bytes.NewBuffer(b)
	if _, err := buf.ReadFrom(io.LimitReader(res, int64(want)+1)); err != nil {
		return nil, err
	}
	if uint64(buf.Len()) != want {
		return nil, ErrUnsealed
	}
	return buf.Bytes(), nil
}

// keysUnder lists the storage keys at or under prefix ("" for all).
func (s *Storage) keysUnder(ctx context.Context, prefix string) (exact bool, under []string, err error) {
	filter := ">"
	var pk string
	if prefix != "" {
		if pk, err = kvKey(prefix); err != nil {
			return false, nil, err
		}
		filter = pk + ".>"
	}
	filters := []string{filter}
	if pk != "" {
		filters = append(filters, pk)
	}
	// Not through retry: the lister reads its keys after the call, on
	// the call's context.
	lister, err := s.data.ListKeysFiltered(ctx, filters...)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, wrapNATS("list", prefix, err)
	}
	defer func() { _ = lister.Stop() }()
	for k := range lister.Keys() {
		if k == pk {
			exact = true
			continue
		}
		sk, err := storageKey(k)
		if err != nil {
			return false, nil, err
		}
		under = append(under, sk)
	}
	return exact, under, ctx.Err()
}

// List returns the keys under prefix, as certmagic.FileStorage does: with
// recursive, every key and every "directory" on the way to one; without,
// the prefix's immediate children. fs.ErrNotExist when prefix is neither a
// key nor a directory.
func (s *Storage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	prefix = strings.TrimSuffix(prefix, "/")
	exact, under, err := s.keysUnder(ctx, prefix)
	if err != nil {
		return nil, err
	}
	if !exact && len(under) == 0 {
		return nil, fmt.Errorf("list %q: %w", prefix, fs.ErrNotExist)
	}
	set := map[string]struct{}{}
	base := prefix
	if base != "" {
		base += "/"
	}
	for _, k := range under {
		rest := strings.TrimPrefix(k, base)
		segs := strings.Split(rest, "/")
		if !recursive {
			set[base+segs[0]] = struct{}{}
			continue
		}
		for i := range segs {
			set[base+strings.Join(segs[:i+1], "/")] = struct{}{}
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

// Exists says whether key is a key or a directory.
func (s *Storage) Exists(ctx context.Context, key string) bool {
	exact, under, err := s.keysUnder(ctx, strings.TrimSuffix(key, "/"))
	return err == nil && (exact || len(under) > 0)
}

// Stat describes key.
func (s *Storage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	k, err := kvKey(key)
	if err != nil {
		return certmagic.KeyInfo{}, err
	}
	e, _, err := retry(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return s.data.Get(ctx, k) })
	switch {
	case err == nil:
		info := certmagic.KeyInfo{Key: key, Modified: e.Created(), IsTerminal: true, Size: int64(len(e.Value())) - 1 - sealOverhead}
		if ref, ok := s.openRef(key, e.Value()); ok {
			info.Size = ref.Size
		}
		return info, nil
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return certmagic.KeyInfo{}, wrapNATS("stat", key, err)
	}
	if _, under, err := s.keysUnder(ctx, key); err != nil {
		return certmagic.KeyInfo{}, err
	} else if len(under) > 0 {
		return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
	}
	return certmagic.KeyInfo{}, fmt.Errorf("stat %q: %w", key, fs.ErrNotExist)
}

// Delete deletes key and every key under it. A missing key is not an error.
func (s *Storage) Delete(ctx context.Context, key string) error {
	key = strings.TrimSuffix(key, "/")
	exact, under, err := s.keysUnder(ctx, key)
	if err != nil {
		return err
	}
	if exact || s.readUnderLock(key) {
		// A key this Storage read under its lock is deleted fenced even
		// when it is gone: another holder took it meanwhile.
		under = append(under, key)
	}
	for _, sk := range under {
		k, err := kvKey(sk)
		if err != nil {
			return err
		}
		if err := s.deleteKey(ctx, sk, k); err != nil {
			return err
		}
	}
	return nil
}

// readUnderLock says whether this Storage holds the lock named key and
// read key under it.
func (s *Storage) readUnderLock(key string) bool {
	s.mu.Lock()
	hl := s.held[key]
	s.mu.Unlock()
	if hl == nil {
		return false
	}
	hl.mu.Lock()
	defer hl.mu.Unlock()
	_, seen := hl.seen[key]
	return seen
}

// deleteKey deletes one key: fenced, like write, by the revision read
// under this Storage's lock named key, when there is one, so that a holder
// that stalled past its TTL neither takes twice what another holder took
// (a pending login, read and deleted under its lock) nor deletes what
// another holder wrote since.
func (s *Storage) deleteKey(ctx context.Context, key, k string) error {
	s.mu.Lock()
	hl := s.held[key]
	s.mu.Unlock()
	old, _ := s.data.Get(ctx, k) // to free its blob, if any
	if hl == nil {
		if err := retry0(ctx, func(ctx context.Context) error { return s.data.Delete(ctx, k) }); err != nil {
			return wrapNATS("delete", key, err)
		}
		s.freeBlob(ctx, old, "")
		return nil
	}
	hl.mu.Lock()
	defer hl.mu.Unlock()
	if hl.lost {
		return fmt.Errorf("delete %q: %w", key, ErrLockLost)
	}
	rev, seen := hl.seen[key]
	switch {
	case !seen:
		if err := retry0(ctx, func(ctx context.Context) error { return s.data.Delete(ctx, k) }); err != nil {
			return wrapNATS("delete", key, err)
		}
	case rev == 0:
		// Absent when the holder read it: another holder made it since.
		if old != nil {
			return fmt.Errorf("delete %q: %w", key, ErrFenced)
		}
		return nil
	default:
		err := s.data.Delete(ctx, k, jetstream.LastRevision(rev))
		if errors.Is(err, jetstream.ErrKeyExists) || isRevisionMismatch(err) {
			return fmt.Errorf("delete %q: %w", key, ErrFenced)
		}
		if err != nil {
			return wrapNATS("delete", key, err)
		}
	}
	hl.seen[key] = 0
	s.freeBlob(ctx, old, "")
	return nil
}

// Lock takes the lock named name, waiting while another holder has it. The
// lock lapses one TTL after its holder last renewed it; this Storage renews
// it until Unlock.
func (s *Storage) Lock(ctx context.Context, name string) error {
	for {
		ok, err := s.TryLock(ctx, name)
		if err != nil || ok {
			return err
		}
		if err := s.waitLock(ctx, name); err != nil {
			return err
		}
	}
}

// waitLock returns when the lock named name may be free: it was deleted,
// or a poll interval passed (a lapse makes no event). The watch starts
// with the lock's entry as it is now, so a holder that unlocked after the
// caller's try and before the watch began wakes it at once: the entry is
// then a delete, or gone.
func (s *Storage) waitLock(ctx context.Context, name string) error {
	lk, _ := lockKey(name)
	wctx, cancel := context.WithTimeout(ctx, s.opts.LockPoll)
	defer cancel()
	if s.beforeWait != nil {
		s.beforeWait()
	}
	w, err := s.locks.Watch(wctx, lk)
	if err != nil {
		<-wctx.Done()
		return ctx.Err()
	}
	defer func() { _ = w.Stop() }()
	held := false // the entry the watch started with is a holder's
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return ctx.Err()
			}
			switch {
			case e == nil: // the end of the entry as it is now
				if !held {
					return nil
				}
			case e.Operation() != jetstream.KeyValuePut:
				return nil
			default:
				held = true // taken, or renewed
			}
		case <-wctx.Done():
			return ctx.Err()
		}
	}
}

// TryLock takes the lock named name if it is free.
func (s *Storage) TryLock(ctx context.Context, name string) (bool, error) {
	lk, err := lockKey(name)
	if err != nil {
		return false, err
	}
	val, _ := json.Marshal(lockValue{Holder: s.holder, At: time.Now()})
	rev, _, err := retry(ctx, func(ctx context.Context) (uint64, error) {
		rev, err := s.locks.Create(ctx, lk, val)
		if !errors.Is(err, jetstream.ErrKeyExists) && isRevisionMismatch(err) {
			// Create over a deleted lock compares with the delete's
			// revision: a mismatch is a race lost to another holder, or a
			// server that has not yet noticed it lost its quorum. Try
			// again: the first ends as ErrKeyExists, the second as
			// ErrUnavailable.
			err = fmt.Errorf("%w: %w", errStaleView, err)
		}
		return rev, err
	})
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, wrapNATS("lock", name, err)
	}
	hl := &heldLock{key: lk, rev: rev, stop: make(chan struct{}), done: make(chan struct{}), seen: map[string]uint64{}}
	s.mu.Lock()
	s.held[name] = hl
	s.mu.Unlock()
	go s.renew(hl)
	return true, nil
}

// renew keeps hl alive until it is unlocked, or marks it lost when a
// renewal finds it taken or no renewal succeeds within the TTL.
func (s *Storage) renew(hl *heldLock) {
	defer close(hl.done)
	every := s.opts.LockTTL / 3
	last := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-hl.stop:
			return
		case <-t.C:
		}
		if s.stalled.Load() {
			continue
		}
		if !s.renewOnce(hl) {
			if time.Since(last) >= s.opts.LockTTL {
				hl.mu.Lock()
				hl.lost = true
				hl.mu.Unlock()
				return
			}
			continue
		}
		last = time.Now()
	}
}

// renewOnce renews hl once: false when it could not (hl is then marked
// lost if another holder has it).
func (s *Storage) renewOnce(hl *heldLock) bool {
	hl.mu.Lock()
	defer hl.mu.Unlock()
	if hl.lost {
		return false
	}
	val, _ := json.Marshal(lockValue{Holder: s.holder, At: time.Now()})
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.LockTTL/3)
	defer cancel()
	rev, err := s.locks.Update(ctx, hl.key, val, hl.rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || isRevisionMismatch(err) || errors.Is(err, jetstream.ErrKeyNotFound) {
			hl.lost = true
		}
		return false
	}
	hl.rev = rev
	return true
}

// RenewLockLease renews the lock named name now (certmagic's
// LockLeaseRenewer); the lease is this Storage's lock TTL, whatever
// leaseDuration asks.
func (s *Storage) RenewLockLease(_ context.Context, name string, _ time.Duration) error {
	s.mu.Lock()
	hl := s.held[name]
	s.mu.Unlock()
	if hl == nil {
		return fmt.Errorf("renew lock %q: this storage does not hold it", name)
	}
	if !s.renewOnce(hl) {
		return fmt.Errorf("renew lock %q: %w", name, ErrLockLost)
	}
	return nil
}

// Unlock releases the lock named name. A lock that lapsed and was taken by
// another holder is left to it, and Unlock says the lock was lost.
func (s *Storage) Unlock(ctx context.Context, name string) error {
	s.mu.Lock()
	hl := s.held[name]
	delete(s.held, name)
	s.mu.Unlock()
	if hl == nil {
		return fmt.Errorf("unlock %q: this storage does not hold that lock", name)
	}
	close(hl.stop)
	<-hl.done
	hl.mu.Lock()
	defer hl.mu.Unlock()
	if hl.lost {
		return fmt.Errorf("unlock %q: %w", name, ErrLockLost)
	}
	err := retry0(ctx, func(ctx context.Context) error { return s.locks.Delete(ctx, hl.key, jetstream.LastRevision(hl.rev)) })
	if err != nil && (isRevisionMismatch(err) || errors.Is(err, jetstream.ErrKeyExists)) {
		return fmt.Errorf("unlock %q: %w", name, ErrLockLost)
	}
	return wrapNATS("unlock", name, err)
}

func wrapNATS(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %q: NATS: %w", op, key, err)
}

// Interface guards.
var (
	_ certmagic.Storage          = (*Storage)(nil)
	_ certmagic.TryLocker        = (*Storage)(nil)
	_ certmagic.LockLeaseRenewer = (*Storage)(nil)
)
