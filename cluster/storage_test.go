package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	neturl "net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// The keys the contract test stores: what certmagic and this project
// write, and keys whose bytes a naive mapping to NATS subjects would get
// wrong (dots, wildcards, spaces, '=', non-ASCII).
var contractKeys = []string{
	"certificates/acme-v02.api.letsencrypt.org-directory/example.com/example.com.crt",
	"certificates/acme-v02.api.letsencrypt.org-directory/example.com/example.com.key",
	"certificates/acme-v02.api.letsencrypt.org-directory/*.example.com/wildcard_.example.com.json",
	"zidane/tokens/tok_1.json",
	"zidane/tokens/tok_2.json",
	"zidane/sessions/s1/transcript.jsonl",
	"zidane/sessions/s1/meta.json",
	"zidane/sessions/s 2/meta=3D.json",
	"zidane/sessions/ü>x/meta.json",
	"zidane/top.json",
}

// TestStorageMatchesFileStorage runs the same operations on certmagic's
// FileStorage (the storage a single node uses) and on the JetStream
// storage, and requires the same answers.
func TestStorageMatchesFileStorage(t *testing.T) {
	ctx := testCtx(t)
	fsys := &certmagic.FileStorage{Path: t.TempDir()}
	nats, _ := newStorage(t, startNATS(t), StorageOptions{})
	stores := map[string]certmagic.Storage{"file": fsys, "nats": nats}

	for name, s := range stores {
		for i, k := range contractKeys {
			if err := s.Store(ctx, k, []byte(fmt.Sprintf("value %d of %s", i, k))); err != nil {
				t.Fatalf("%s: Store(%q): %v", name, k, err)
			}
		}
	}
	for _, k := range contractKeys {
		f, err1 := fsys.Load(ctx, k)
		n, err2 := nats.Load(ctx, k)
		if err1 != nil || err2 != nil || !bytes.Equal(f, n) {
			t.Errorf("Load(%q): file %q %v, nats %q %v", k, f, err1, n, err2)
		}
	}
	for _, c := range []struct {
		prefix    string
		recursive bool
	}{
		{"zidane", false}, {"zidane", true}, {"zidane/sessions", false}, {"zidane/sessions", true},
		{"zidane/sessions/s1", false}, {"certificates", true}, {"zidane/top.json", false},
	} {
		f, err1 := fsys.List(ctx, c.prefix, c.recursive)
		n, err2 := nats.List(ctx, c.prefix, c.recursive)
		slices.Sort(f)
		slices.Sort(n)
		if err1 != nil || err2 != nil || !slices.Equal(f, n) {
			t.Errorf("List(%q, %v):\n file %q %v\n nats %q %v", c.prefix, c.recursive, f, err1, n, err2)
		}
	}
	for _, missing := range []string{"nope", "zidane/tokens/tok_3.json", "zidane/sess"} {
		for name, s := range stores {
			if _, err := s.Load(ctx, missing); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: Load(%q) = %v, want fs.ErrNotExist", name, missing, err)
			}
			if _, err := s.Stat(ctx, missing); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: Stat(%q) = %v, want fs.ErrNotExist", name, missing, err)
			}
			if s.Exists(ctx, missing) {
				t.Errorf("%s: Exists(%q) = true", name, missing)
			}
		}
		if _, err := nats.List(ctx, missing, true); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("nats: List(%q) = %v, want fs.ErrNotExist", missing, err)
		}
	}
	for _, k := range []string{"zidane/tokens/tok_1.json", "zidane/sessions"} {
		f, err1 := fsys.Stat(ctx, k)
		n, err2 := nats.Stat(ctx, k)
		if err1 != nil || err2 != nil || f.Key != n.Key || f.IsTerminal != n.IsTerminal || (f.IsTerminal && f.Size != n.Size) {
			t.Errorf("Stat(%q): file %+v %v, nats %+v %v", k, f, err1, n, err2)
		}
	}
	for name, s := range stores {
		if err := s.Delete(ctx, "zidane/sessions"); err != nil {
			t.Fatalf("%s: Delete(dir): %v", name, err)
		}
		if err := s.Delete(ctx, "zidane/never-was"); err != nil {
			t.Errorf("%s: Delete(missing) = %v, want nil", name, err)
		}
	}
	f, _ := fsys.List(ctx, "zidane", true)
	n, _ := nats.List(ctx, "zidane", true)
	slices.Sort(f)
	slices.Sort(n)
	if !slices.Equal(f, n) || slices.Contains(n, "zidane/sessions/s1/meta.json") {
		t.Errorf("after deleting zidane/sessions:\n file %q\n nats %q", f, n)
	}
}

var kvKeyPattern = regexp.MustCompile(`^[-/_=A-Za-z0-9]+(\.[-/_=A-Za-z0-9]+)*$`)

// FuzzKeyMapping: every key maps to a valid KV key with one token per
// segment, and back to itself, so no two keys share a KV key and no key
// reaches NATS as a wildcard.
func FuzzKeyMapping(f *testing.F) {
	for _, k := range contractKeys {
		f.Add(k)
	}
	f.Add("a.b/c")
	f.Add("a/*/>")
	f.Fuzz(func(t *testing.T, key string) {
		k, err := kvKey(key)
		if err != nil {
			return
		}
		if !kvKeyPattern.MatchString(k) {
			t.Fatalf("kvKey(%q) = %q: not a valid KV key", key, k)
		}
		back, err := storageKey(k)
		if err != nil || back != key {
			t.Fatalf("storageKey(kvKey(%q)) = %q, %v", key, back, err)
		}
		if bytes.Count([]byte(k), []byte(".")) != bytes.Count([]byte(key), []byte("/")) {
			t.Fatalf("kvKey(%q) = %q: tokens do not match segments", key, k)
		}
	})
}

func TestBadKeysAreRefused(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newStorage(t, startNATS(t), StorageOptions{})
	for _, k := range []string{"", "/a", "a/", "a//b"} {
		if err := s.Store(ctx, k, []byte("x")); err == nil {
			t.Errorf("Store(%q) succeeded", k)
		}
	}
}

// TestLargeValues: values past one NATS message go to the object store,
// come back whole, and leave no object behind once replaced or deleted.
func TestLargeValues(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newStorage(t, startNATS(t), StorageOptions{})
	big := make([]byte, 5<<20+17) // a transcript of several MiB
	_, _ = rand.Read(big)
	if err := s.Store(ctx, "zidane/sessions/s1/transcript.jsonl", big); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx, "zidane/sessions/s1/transcript.jsonl")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("Load: %d bytes, %v; want the %d stored", len(got), err, len(big))
	}
	info, err := s.Stat(ctx, "zidane/sessions/s1/transcript.jsonl")
	if err != nil || info.Size != int64(len(big)) || !info.IsTerminal {
		t.Fatalf("Stat = %+v, %v", info, err)
	}
	objects := func() int {
		l, err := s.blobs.List(ctx)
		if err != nil {
			return 0 // jetstream.ErrNoObjectsFound
		}
		return len(l)
	}
	if n := objects(); n != 1 {
		t.Fatalf("%d objects after one large store, want 1", n)
	}
	big2 := bytes.Repeat([]byte("y"), 2<<20)
	if err := s.Store(ctx, "zidane/sessions/s1/transcript.jsonl", big2); err != nil {
		t.Fatal(err)
	}
	if n := objects(); n != 1 {
		t.Fatalf("%d objects after replacing a large value, want 1", n)
	}
	if err := s.Store(ctx, "zidane/sessions/s1/transcript.jsonl", []byte("small")); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Load(ctx, "zidane/sessions/s1/transcript.jsonl"); string(got) != "small" {
		t.Fatalf("Load after small store = %q", got)
	}
	if n := objects(); n != 0 {
		t.Fatalf("%d objects after replacing with a small value, want 0", n)
	}
	if err := s.Store(ctx, "zidane/sessions/s1/transcript.jsonl", big); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "zidane/sessions"); err != nil {
		t.Fatal(err)
	}
	if n := objects(); n != 0 {
		t.Fatalf("%d objects after delete, want 0", n)
	}
}

// TestLockExclusiveAcrossConnections: three storages, each on a NATS
// connection of its own (three replicas), increment one stored counter
// under the lock through storage.Update; no two are ever inside at once
// and no increment is lost.
func TestLockExclusiveAcrossConnections(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	var replicas []*Storage
	for i := range 3 {
		s, _ := newStorage(t, url, StorageOptions{Owner: fmt.Sprintf("node%d", i), LockPoll: 50 * time.Millisecond})
		replicas = append(replicas, s)
	}
	const perWorker = 8
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 6*perWorker)
	for w := range 6 {
		s := replicas[w%3]
		wg.Go(func() {
			for range perWorker {
				err := storage.Update(ctx, s, "zidane/counter", func(old []byte) ([]byte, error) {
					n := inside.Add(1)
					defer inside.Add(-1)
					for {
						m := maxInside.Load()
						if n <= m || maxInside.CompareAndSwap(m, n) {
							break
						}
					}
					var c int
					if old != nil {
						fmt.Sscan(string(old), &c)
					}
					return []byte(fmt.Sprint(c + 1)), nil
				})
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got, err := replicas[0].Load(ctx, "zidane/counter")
	if err != nil || string(got) != fmt.Sprint(6*perWorker) {
		t.Fatalf("counter = %q, %v; want %d", got, err, 6*perWorker)
	}
	if m := maxInside.Load(); m != 1 {
		t.Fatalf("%d holders were inside the lock at once", m)
	}
}

// TestLockFreedWhenHolderDies: a holder whose connection dies holds the
// lock no longer than its TTL; another replica then takes it.
func TestLockFreedWhenHolderDies(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	opts := StorageOptions{LockTTL: time.Second, LockPoll: 100 * time.Millisecond}
	a, aConn := newStorage(t, url, opts)
	b, _ := newStorage(t, url, opts)
	if err := a.Lock(ctx, "issue_cert_example.com"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TryLock(ctx, "issue_cert_example.com"); ok || err != nil {
		t.Fatalf("TryLock while another holds it = %v, %v", ok, err)
	}
	aConn.Close() // the holder dies without unlocking
	if err := b.Lock(ctx, "issue_cert_example.com"); err != nil {
		t.Fatalf("Lock after the holder died: %v", err)
	}
	if err := b.Unlock(ctx, "issue_cert_example.com"); err != nil {
		t.Fatal(err)
	}
}

// TestStaleHolderIsFenced: a holder that stalls past its lock's TTL (a
// paused process) comes back to find another holder has written the key:
// its write is refused, the other's value stays, and its Unlock does not
// free the other's lock.
func TestStaleHolderIsFenced(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	opts := StorageOptions{LockTTL: time.Second, LockPoll: 100 * time.Millisecond}
	a, _ := newStorage(t, url, opts)
	b, _ := newStorage(t, url, opts)
	c, _ := newStorage(t, url, opts)
	const key = "zidane/tokens/index.json"
	if err := a.Store(ctx, key, []byte("v0")); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Load(ctx, key); err != nil {
		t.Fatal(err)
	}
	a.stalled.Store(true)

	if err := b.Lock(ctx, key); err != nil { // waits out a's TTL
		t.Fatal(err)
	}
	if _, err := b.Load(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := b.Store(ctx, key, []byte("from b")); err != nil {
		t.Fatal(err)
	}

	err := a.Store(ctx, key, []byte("from a, stale"))
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("stale holder's Store = %v, want ErrFenced", err)
	}
	if got, _ := c.Load(ctx, key); string(got) != "from b" {
		t.Fatalf("value = %q, want b's", got)
	}
	if err := a.Unlock(ctx, key); !errors.Is(err, ErrLockLost) {
		t.Fatalf("stale holder's Unlock = %v, want ErrLockLost", err)
	}
	if ok, _ := c.TryLock(ctx, key); ok {
		t.Fatal("the stale holder's Unlock freed the current holder's lock")
	}
	if err := b.Unlock(ctx, key); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.TryLock(ctx, key); !ok || err != nil {
		t.Fatalf("TryLock after release = %v, %v", ok, err)
	}
	_ = c.Unlock(ctx, key)
}

// TestStaleHolderWithoutReadIsRefused: a holder whose renewal finds its
// lock taken writes nothing more under it, even keys it never read.
func TestLostLockRefusesWrites(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	opts := StorageOptions{LockTTL: time.Second, LockPoll: 100 * time.Millisecond}
	a, _ := newStorage(t, url, opts)
	b, _ := newStorage(t, url, opts)
	const key = "zidane/upstreams/github.json"
	if err := a.Lock(ctx, key); err != nil {
		t.Fatal(err)
	}
	a.stalled.Store(true)
	if err := b.Lock(ctx, key); err != nil {
		t.Fatal(err)
	}
	a.stalled.Store(false)
	a.mu.Lock()
	hl := a.held[key]
	a.mu.Unlock()
	if a.renewOnce(hl) {
		t.Fatal("renewal of a lock another holder took succeeded")
	}
	if err := a.Store(ctx, key, []byte("x")); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Store under a lost lock = %v, want ErrLockLost", err)
	}
	if _, err := b.Load(ctx, key); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the lost holder's write landed: %v", err)
	}
	_ = b.Unlock(ctx, key)
}

// A stale holder takes nothing twice: a holder that read a key under its
// lock, stalled past the TTL while another took the lock and deleted the
// key (a pending login taken once), has its own Delete refused; and one
// whose key another holder rewrote does not delete that write.
func TestStaleHolderDeleteIsFenced(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	opts := StorageOptions{LockTTL: time.Second, LockPoll: 100 * time.Millisecond}
	for _, other := range []string{"deletes", "rewrites"} {
		t.Run(other, func(t *testing.T) {
			a, _ := newStorage(t, url, opts)
			b, _ := newStorage(t, url, opts)
			key := "zidane/upstream-oauth-pending/gh/" + other
			if err := a.Store(ctx, key, []byte("pending")); err != nil {
				t.Fatal(err)
			}
			if err := a.Lock(ctx, key); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Load(ctx, key); err != nil {
				t.Fatal(err)
			}
			a.stalled.Store(true)
			if err := b.Lock(ctx, key); err != nil { // waits out a's TTL
				t.Fatal(err)
			}
			if _, err := b.Load(ctx, key); err != nil {
				t.Fatal(err)
			}
			var err error
			if other == "deletes" {
				err = b.Delete(ctx, key)
			} else {
				err = b.Store(ctx, key, []byte("from b"))
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Delete(ctx, key); !errors.Is(err, ErrFenced) {
				t.Fatalf("stale holder's Delete after b %s the key = %v, want ErrFenced", other, err)
			}
			if other == "rewrites" {
				if got, err := b.Load(ctx, key); err != nil || string(got) != "from b" {
					t.Fatalf("b's write after the stale Delete: %q, %v", got, err)
				}
			}
			_ = b.Unlock(ctx, key)
			_ = a.Unlock(ctx, key)
		})
	}
}

// The fence is the revision the holder first read under its lock: a later
// read of the key in the same process (another goroutine: a token sync
// woken by the other holder's write) does not move it, so the stale
// holder's read-modify-write is still refused.
func TestStaleHolderRereadIsFenced(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	opts := StorageOptions{LockTTL: time.Second, LockPoll: 100 * time.Millisecond}
	a, _ := newStorage(t, url, opts)
	b, _ := newStorage(t, url, opts)
	const key = "zidane/tokens/index.json"
	if err := a.Store(ctx, key, []byte("v0")); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Load(ctx, key); err != nil {
		t.Fatal(err)
	}
	a.stalled.Store(true)
	if err := b.Lock(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Load(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := b.Store(ctx, key, []byte("from b")); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Load(ctx, key); err != nil || string(got) != "from b" {
		t.Fatalf("a's second read: %q, %v", got, err)
	}
	if err := a.Store(ctx, key, []byte("v0 changed by a, stale")); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale holder's Store after a re-read = %v, want ErrFenced", err)
	}
	if got, _ := b.Load(ctx, key); string(got) != "from b" {
		t.Fatalf("value = %q, want b's", got)
	}
	_ = b.Unlock(ctx, key)
	_ = a.Unlock(ctx, key)
}

// Replicas configured with different lock TTLs share one locks bucket,
// whose entries expire after one TTL: a replica with a shorter one must
// not lower it under a holder that renews every third of a longer one
// (its locks would lapse while it holds them).
func TestShorterLockTTLDoesNotShortenOthersLocks(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	a, _ := newStorage(t, url, StorageOptions{LockTTL: 6 * time.Second})
	newStorage(t, url, StorageOptions{LockTTL: time.Second})
	st, err := a.locks.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 6*time.Second {
		t.Fatalf("locks bucket TTL = %v after a replica with lock_ttl 1s started; a's locks (6s, renewed every 2s) would lapse while held", st.TTL())
	}
	c, _ := newStorage(t, url, StorageOptions{LockTTL: 9 * time.Second})
	if st, err = c.locks.Status(ctx); err != nil || st.TTL() != 9*time.Second {
		t.Fatalf("locks bucket TTL = %v, %v after a replica with lock_ttl 9s started; want 9s", st.TTL(), err)
	}
}

func TestConnConfigCheck(t *testing.T) {
	for _, c := range []struct {
		cfg  ConnConfig
		want string // "" when the config is accepted
	}{
		{ConnConfig{URLs: []string{"nats://127.0.0.1:4222", "nats://[::1]:4222", "nats://localhost:4222"}}, ""},
		{ConnConfig{URLs: []string{"tls://nats-1.internal:4222"}}, ""},
		{ConnConfig{URLs: []string{"nats://nats-1.internal:4222"}, TLSCA: "/ca.pem"}, ""},
		{ConnConfig{}, "no NATS URL"},
		{ConnConfig{URLs: []string{"nats://10.1.2.3:4222"}}, "not loopback"},
		// pinnedfetch's loopback rule, not net.IP's: a mapped spelling is
		// not loopback.
		{ConnConfig{URLs: []string{"nats://[::ffff:127.0.0.1]:4222"}}, "not loopback"},
		{ConnConfig{URLs: []string{"nats://[::ffff:7f00:1]:4222"}}, "not loopback"},
		{ConnConfig{URLs: []string{"nats://u:pw@127.0.0.1:4222"}}, "creds file"},
		{ConnConfig{URLs: []string{"ws://127.0.0.1:4222"}}, "scheme"},
		{ConnConfig{URLs: []string{"127.0.0.1:4222"}}, "is not a URL"},
		{ConnConfig{URLs: []string{"tls://n:4222"}, TLSKey: "/k.pem"}, "go together"},
	} {
		err := c.cfg.Check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.cfg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.want)
		case err != nil && strings.Contains(err.Error(), "pw"):
			t.Errorf("the error shows the password: %v", err)
		}
	}
}

// TestValuesAreSealed: a NATS user who can read and write the buckets but
// has no cluster key reads no value and makes none this storage accepts:
// not a forged one, not one moved from another key, not one with its tag
// changed, not one sealed with another key.
func TestValuesAreSealed(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	s, _ := newStorage(t, url, StorageOptions{})
	secret := []byte(`{"tokens":[{"name":"ops","hash":"very-secret-material"}]}`)
	big := bytes.Repeat([]byte("very-secret-material "), 100_000)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Store(ctx, "zidane/tokens.json", secret))
	must(s.Store(ctx, "zidane/other.json", []byte(`{"tokens":[]}`)))
	must(s.Store(ctx, "zidane/sessions/s1/transcript.jsonl", big))
	must(s.Store(ctx, "zidane/sessions/s2/transcript.jsonl", big[:len(big)/2]))

	raw := func(key string) []byte {
		k, _ := kvKey(key)
		e, err := s.data.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return e.Value()
	}
	put := func(key string, v []byte) {
		k, _ := kvKey(key)
		if _, err := s.data.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if bytes.Contains(raw("zidane/tokens.json"), []byte("secret")) {
		t.Fatal("the KV bucket holds the value in plaintext")
	}
	objs, err := s.blobs.List(ctx)
	if err != nil || len(objs) != 2 {
		t.Fatalf("objects: %d, %v", len(objs), err)
	}
	for _, o := range objs {
		b, _ := s.blobs.GetBytes(ctx, o.Name)
		if bytes.Contains(b, []byte("secret")) {
			t.Fatal("the object store holds a value in plaintext")
		}
	}

	other, _ := newStorage(t, url, StorageOptions{Key: bytes.Repeat([]byte{7}, KeySize)})
	if _, err := other.Load(ctx, "zidane/tokens.json"); !errors.Is(err, ErrUnsealed) {
		t.Fatalf("a storage with another key: Load = %v, want ErrUnsealed", err)
	}

	refuse := func(what, key string) {
		t.Helper()
		if v, err := s.Load(ctx, key); !errors.Is(err, ErrUnsealed) {
			t.Errorf("%s: Load = %q, %v; want ErrUnsealed", what, v, err)
		}
	}
	put("zidane/forged.json", append([]byte{tagInline}, `{"tokens":[{"name":"me"}]}`...))
	refuse("a forged value", "zidane/forged.json")

	put("zidane/other.json", raw("zidane/tokens.json"))
	refuse("a value moved from another key", "zidane/other.json")

	flipped := bytes.Clone(raw("zidane/tokens.json"))
	flipped[0] = tagBlob
	put("zidane/flipped.json", flipped)
	refuse("a value whose tag was changed", "zidane/flipped.json")

	put("zidane/sessions/s2/transcript.jsonl", raw("zidane/sessions/s1/transcript.jsonl"))
	refuse("a reference moved from another key", "zidane/sessions/s2/transcript.jsonl")

	// The object behind a reference swapped for another object.
	ref, ok := s.openRef("zidane/sessions/s1/transcript.jsonl", raw("zidane/sessions/s1/transcript.jsonl"))
	if !ok {
		t.Fatal("no reference")
	}
	var otherObj string
	for _, o := range objs {
		if o.Name != ref.Object {
			otherObj = o.Name
		}
	}
	b, _ := s.blobs.GetBytes(ctx, otherObj)
	if _, err := s.blobs.PutBytes(ctx, ref.Object, b); err != nil {
		t.Fatal(err)
	}
	refuse("an object swapped for another", "zidane/sessions/s1/transcript.jsonl")

	if got, err := s.Load(ctx, "zidane/tokens.json"); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("the untouched value: %q, %v", got, err)
	}
}

// A NATS user without the key who rewrites the object store's metadata
// makes a replica neither follow a link (nats.go follows one, and a link
// to itself recurses until the context ends) nor read an object of a size
// the sealed reference does not give: the value is refused at once.
func TestObjectsAreNotFollowed(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	s, nc := newStorage(t, url, StorageOptions{})
	big := bytes.Repeat([]byte("transcript line\n"), 100_000)
	const key, other = "zidane/sessions/s1/transcript.jsonl", "zidane/sessions/s2/transcript.jsonl"
	for _, k := range []string{key, other} {
		if err := s.Store(ctx, k, big); err != nil {
			t.Fatal(err)
		}
	}
	ref := func(k string) string {
		kk, _ := kvKey(k)
		e, err := s.data.Get(ctx, kk)
		if err != nil {
			t.Fatal(err)
		}
		r, ok := s.openRef(k, e.Value())
		if !ok {
			t.Fatal("no reference")
		}
		return r.Object
	}
	js, _ := jetstream.New(nc)
	bucket := s.opts.Bucket + "_blobs"
	putMeta := func(name string, link *jetstream.ObjectLink) {
		t.Helper()
		info := jetstream.ObjectInfo{Bucket: bucket, NUID: "forged", ObjectMeta: jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{Link: link}}}
		raw, _ := json.Marshal(info)
		msg := nats.NewMsg("$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name)))
		msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		msg.Data = raw
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	load := func(what, k string) {
		t.Helper()
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if v, err := s.Load(lctx, k); !errors.Is(err, ErrUnsealed) {
			t.Errorf("%s: Load = %d bytes, %v; want ErrUnsealed", what, len(v), err)
		}
	}

	name := ref(key)
	putMeta(name, &jetstream.ObjectLink{Bucket: bucket, Name: name})
	load("the object made a link to itself", key)

	// An object of another size than the reference gives (a huge one, in
	// an attack) is not read.
	if _, err := s.blobs.PutBytes(ctx, ref(other), append(bytes.Clone(big), big...)); err != nil {
		t.Fatal(err)
	}
	load("the object replaced by a larger one", other)
}

func TestStorageNeedsTheClusterKey(t *testing.T) {
	url := startNATS(t)
	nc := connect(t, url)
	js, _ := jetstream.New(nc)
	for _, key := range [][]byte{nil, make([]byte, 16)} {
		if _, err := NewStorage(testCtx(t), js, nc.MaxPayload(), StorageOptions{Key: key}); err == nil || !strings.Contains(err.Error(), "cluster key must be 32 bytes") {
			t.Errorf("key of %d bytes: %v", len(key), err)
		}
	}
}

// Watch tells one replica of every write another makes to a key, and of
// nothing else.
func TestWatchSeesOtherReplicasWrites(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	a, _ := newStorage(t, url, StorageOptions{})
	b, _ := newStorage(t, url, StorageOptions{})
	fired := make(chan struct{}, 16)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	go func() {
		close(ready)
		b.Watch(wctx, "zidane/tokens.json", func() { fired <- struct{}{} })
	}()
	<-ready
	// The watch may start after a first write: write until it fires.
	deadline := time.Now().Add(20 * time.Second)
	for got := false; !got; {
		if err := a.Store(ctx, "zidane/tokens.json", []byte("v")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-fired:
			got = true
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("the watch never fired")
			}
		}
	}
	for len(fired) > 0 {
		<-fired
	}
	// A watch tells at least once per change: the write that ended the
	// loop above may still be told (by the watch, or by its periodic
	// check) after the drain. So the other key is written many times: a
	// watch that fired for it would tell each of them before the delete.
	const others = 10
	for i := range others {
		if err := a.Store(ctx, "zidane/other.json", []byte{byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Delete(ctx, "zidane/tokens.json"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fired: // the delete, or a late telling of the last write
	case <-time.After(20 * time.Second):
		t.Fatal("the watch missed a delete")
	}
	if n := len(fired); n > 2 {
		t.Fatalf("the watch fired %d more times after %d writes to another key and one delete of its own", n, others)
	}
}

// A connection in the clear (nats:// to loopback, no TLS) stays with the
// servers it was given: a NATS server advertises its cluster's other
// servers, and nats.go would fail over to them with the same scheme, in
// the clear across the network, carrying what the replicas share.
func TestPlainConnectionIgnoresDiscoveredServers(t *testing.T) {
	start := func(opts *server.Options) *server.Server { return natstest.Start(t, opts) }
	a := start(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		Cluster: server.ClusterOpts{Name: "zc", Host: "127.0.0.1", Port: -1}})
	routeURL, _ := neturl.Parse(fmt.Sprintf("nats://%s", a.ClusterAddr()))
	// b advertises an address off this host (never dialled here: a stays up
	// until the connections close).
	start(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, ClientAdvertise: "nats-b.example:4222",
		Cluster: server.ClusterOpts{Name: "zc", Host: "127.0.0.1", Port: -1}, Routes: []*neturl.URL{routeURL}})
	// A connection of nats.go's own hears of b once the route is up.
	control := connect(t, a.ClientURL())
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(control.DiscoveredServers(), "nats://nats-b.example:4222") {
		if time.Now().After(deadline) {
			t.Fatalf("the control connection never heard of b: %v", control.DiscoveredServers())
		}
		time.Sleep(20 * time.Millisecond)
	}

	c, err := Dial(ConnConfig{URLs: []string{a.ClientURL()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if got := c.nc.Servers(); len(got) != 1 || slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "nats-b.example") }) {
		t.Fatalf("a plain connection's servers: %v; want the one it was given, not b's advertised address", got)
	}
}

// TestLockedReadsComeFromTheStreamLeader: a key read under the lock of the
// same name (the read of a read-modify-write: a token refresh, a pending
// login taken once) is read from the stream's leader, which has applied
// every write it acknowledged; a direct get may be answered by a follower
// that has not applied the write another replica made just before it
// released the lock. Other reads stay direct gets, which any replica
// answers.
func TestLockedReadsComeFromTheStreamLeader(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	s, _ := newStorage(t, url, StorageOptions{})
	if err := s.Store(ctx, "zidane/upstream-oauth/remote", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	// The JetStream API requests of the reads, as a NATS user sees them.
	spy := connect(t, url)
	requests := make(chan string, 64)
	for _, subj := range []string{"$JS.API.DIRECT.GET.KV_zidane.>", "$JS.API.STREAM.MSG.GET.KV_zidane"} {
		if _, err := spy.Subscribe(subj, func(m *nats.Msg) { requests <- m.Subject + " " + string(m.Data) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		select {
		case r := <-requests:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no JetStream API request seen for the read")
			return ""
		}
	}
	const leaderGet = "$JS.API.STREAM.MSG.GET.KV_zidane "
	k := "$KV.zidane.zidane.upstream-oauth.remote"

	if got, err := s.Load(ctx, "zidane/upstream-oauth/remote"); err != nil || string(got) != "v1" {
		t.Fatalf("Load = %q, %v", got, err)
	}
	if r := next(); r != "$JS.API.DIRECT.GET.KV_zidane."+k+" " {
		t.Errorf("a read without the lock went as %q, want a direct get", r)
	}

	if err := s.Lock(ctx, "zidane/upstream-oauth/remote"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load(ctx, "zidane/upstream-oauth/remote"); err != nil || string(got) != "v1" {
		t.Fatalf("Load under the lock = %q, %v", got, err)
	}
	if r := next(); !strings.HasPrefix(r, leaderGet) || !strings.Contains(r, `"last_by_subj":"`+k+`"`) {
		t.Errorf("a read under the lock of its key went as %q, want a get from the stream leader", r)
	}
	// Absent and deleted keys read under their lock are absent.
	for _, key := range []string{"zidane/upstream-oauth-pending/remote/gone", "zidane/upstream-oauth-pending/remote/never"} {
		if key == "zidane/upstream-oauth-pending/remote/gone" {
			if err := s.Store(ctx, key, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Lock(ctx, key); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Load(ctx, key); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Load of %s under its lock: %v, want fs.ErrNotExist", key, err)
		}
		if err := s.Unlock(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	// The write back is fenced on the revision the leader gave.
	if err := s.Store(ctx, "zidane/upstream-oauth/remote", []byte("v2")); err != nil {
		t.Fatalf("Store under the lock after a leader read: %v", err)
	}
	if err := s.Unlock(ctx, "zidane/upstream-oauth/remote"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load(ctx, "zidane/upstream-oauth/remote"); err != nil || string(got) != "v2" {
		t.Fatalf("Load after the locked write = %q, %v", got, err)
	}
}

// TestLockWaiterWakesOnAnUnlockBeforeItsWatch: a holder that unlocks
// between a waiter's failed try and the start of its watch wakes the
// waiter at once, not one LockPoll later (an hour here).
func TestLockWaiterWakesOnAnUnlockBeforeItsWatch(t *testing.T) {
	ctx := testCtx(t)
	url := startNATS(t)
	a, _ := newStorage(t, url, StorageOptions{})
	b, _ := newStorage(t, url, StorageOptions{LockPoll: time.Hour})
	if err := a.Lock(ctx, "zidane/upstream-oauth/remote"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	b.beforeWait = func() {
		once.Do(func() {
			if err := a.Unlock(ctx, "zidane/upstream-oauth/remote"); err != nil {
				t.Error(err)
			}
		})
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Lock(wctx, "zidane/upstream-oauth/remote"); err != nil {
		t.Fatalf("Lock after the holder unlocked before the waiter watched: %v", err)
	}
	if err := b.Unlock(ctx, "zidane/upstream-oauth/remote"); err != nil {
		t.Fatal(err)
	}
}

// Values sealed before the module had one sealer (internal/seal, which
// binds the purpose into the associated data) still open: these were
// sealed by that code, under the cluster key 32 bytes of 3. A value sealed
// now opens, and does not open for another purpose under the same key.
func TestValuesSealedByEarlierReleasesOpen(t *testing.T) {
	key := bytes.Repeat([]byte{3}, KeySize)
	for _, c := range []struct {
		purpose, sealedHex, ad, want string
	}{
		{"storage v1", "97ab9bd0be4a22afc0b672283727d18e6a8741adfa59740a8018b65aceebba42fb16e55fd1f3203433", string(where("value", "zidane", "zidane/tokens.json")), `{"tokens":[]}`},
		{"node registry v1", "ac1920a13666fa4eac99239cc0f69c3a41f0e8dff1b205d31b5951fde000cb0af6a00add4862c3bd17", "where-n1", `{"node":"n1"}`},
	} {
		s, err := newSealer(key, c.purpose)
		if err != nil {
			t.Fatal(err)
		}
		sealed, _ := hex.DecodeString(c.sealedHex)
		if got, err := s.open(sealed, []byte(c.ad)); err != nil || string(got) != c.want {
			t.Errorf("%s: the earlier release's value: %q, %v", c.purpose, got, err)
		}
		now := s.seal(nil, []byte(c.want), []byte(c.ad))
		if got, err := s.open(now, []byte(c.ad)); err != nil || string(got) != c.want {
			t.Errorf("%s: %q, %v", c.purpose, got, err)
		}
		other, _ := newSealer(key, c.purpose+" other")
		if _, err := other.open(now, []byte(c.ad)); !errors.Is(err, ErrUnsealed) {
			t.Errorf("%s: opened for another purpose: %v", c.purpose, err)
		}
	}
}
