package upstreamauth

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// onNATS puts e's storage on a real nats-server (embedded), as replicas
// in cluster mode share it.
func (e *env) onNATS() {
	e.t.Helper()
	ns := natstest.JetStream(e.t)
	conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{ns.ClientURL()}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(conn.Close)
	key := make([]byte, cluster.KeySize)
	rand.Read(key)
	st, err := conn.Storage(context.Background(), cluster.StorageOptions{Key: key, LockTTL: 2 * time.Second, LockPoll: 50 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	e.store = st
}

// On file storage and on NATS storage: a login begun on one replica
// completes on another (the callback lands where the load balancer sends
// it), once: the same callback, on either replica, or on both at once, is
// refused after that.
func TestCallbackOnAnotherReplica(t *testing.T) {
	for _, onNATS := range []bool{false, true} {
		name := "file"
		if onNATS {
			name = "nats"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
			e.as.AddClient("gw", "", nil)
			if onNATS {
				e.onNATS()
			}
			a := e.client(Config{ClientID: "gw", RedirectURL: redirect})
			b := e.client(Config{ClientID: "gw", RedirectURL: redirect})
			q, _ := e.authorize(a)
			if err := b.Callback(context.Background(), q); err != nil {
				t.Fatalf("callback on the other replica: %v", err)
			}
			if err := b.callEchoOn(e, "landed on b"); err != nil {
				t.Fatal(err)
			}
			for _, c := range []*Client{a, b} {
				if err := c.Callback(context.Background(), q); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "state") {
					t.Fatalf("the used callback again: %v", err)
				}
			}

			// Two callbacks with one state, on both replicas at once:
			// one redeems the code.
			q2, _ := e.authorize(b)
			before := len(e.as.TokenRequests())
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i, c := range []*Client{a, b} {
				wg.Go(func() { errs[i] = c.Callback(context.Background(), q2) })
			}
			wg.Wait()
			if (errs[0] == nil) == (errs[1] == nil) {
				t.Fatalf("two callbacks with one state: %v and %v; want one to succeed", errs[0], errs[1])
			}
			if n := len(e.as.TokenRequests()) - before; n != 1 {
				t.Fatalf("%d token requests for one code, want 1", n)
			}
		})
	}
}

func (c *Client) callEchoOn(e *env, msg string) error { return e.callEcho(c, msg) }

// The pending login in storage is sealed: no verifier and no state in
// plaintext, nor in its key; one moved to another login's key, or
// forged, is not used.
func TestPendingLoginIsSealed(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	e.as.AddClient("gw", "", nil)
	a := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	q1, authURL := e.authorize(a)
	u, _ := url.Parse(authURL)
	state := u.Query().Get("state")
	ctx := context.Background()
	keys, err := e.store.List(ctx, PendingPrefix+testUpstream, false)
	if err != nil || len(keys) != 1 {
		t.Fatalf("pending logins in storage: %v %v", keys, err)
	}
	raw, _ := e.store.Load(ctx, keys[0])
	if strings.Contains(keys[0], state) || bytes.Contains(raw, []byte(state)) || bytes.Contains(raw, []byte("verifier")) {
		t.Fatalf("the pending login shows its state or verifier: %s %q", keys[0], raw)
	}
	// Another login's sealed entry copied under this login's key.
	q2, _ := e.authorize(a)
	keys, _ = e.store.List(ctx, PendingPrefix+testUpstream, false)
	var other string
	for _, k := range keys {
		if k != a.pendingKey(state) {
			other = k
		}
	}
	otherRaw, _ := e.store.Load(ctx, other)
	if err := e.store.Store(ctx, a.pendingKey(state), otherRaw); err != nil {
		t.Fatal(err)
	}
	if err := a.Callback(ctx, q1); !errors.Is(err, ErrLogin) {
		t.Fatalf("a pending login moved to another key was used: %v", err)
	}
	if err := a.Callback(ctx, q2); err != nil {
		t.Fatalf("the untouched login: %v", err)
	}
}

// At most MaxPendingLogins await their callback, across replicas: a new
// one evicts the oldest; and one expires after LoginTimeout.
func TestPendingLoginsBounded(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	e.as.AddClient("gw", "", nil)
	a := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	b := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	var qs []url.Values
	for i := range MaxPendingLogins + 1 {
		c := a
		if i%2 == 1 {
			c = b
		}
		q, _ := e.authorize(c)
		qs = append(qs, q)
		e.clock.Advance(time.Second)
	}
	keys, _ := e.store.List(context.Background(), PendingPrefix+testUpstream, false)
	if len(keys) != MaxPendingLogins {
		t.Fatalf("%d pending logins stored, want %d", len(keys), MaxPendingLogins)
	}
	if err := a.Callback(context.Background(), qs[0]); !errors.Is(err, ErrLogin) {
		t.Fatalf("the evicted oldest login: %v", err)
	}
	e.clock.Advance(LoginTimeout)
	if err := b.Callback(context.Background(), qs[len(qs)-1]); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("a login past LoginTimeout: %v", err)
	}
}

// The refresh across replicas, on NATS storage: one refresh per expiry
// between two replicas, each refresh token redeemed once.
func TestRefreshSingleFlightAcrossReplicasOnNATS(t *testing.T) {
	testRefreshSingleFlight(t, true)
}

// A logout on one replica ends the token's use on another once it reads
// the record again (on NATS storage a watch calls Reload on every write),
// and a login on one is usable on another at once, even while that one was
// answering from a recent failure.
func TestReloadSeesAnotherReplicasLoginAndLogout(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	e.as.AddClient("gw", "", nil)
	e.onNATS()
	a := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	b := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	if err := e.callEcho(b, "before"); !errors.Is(err, ErrAuthRequired) {
		t.Fatalf("b before any login: %v", err)
	}
	e.login(a)
	if err := b.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.callEcho(b, "after a's login"); err != nil {
		t.Fatalf("b after a's login and a reload: %v", err)
	}
	if err := a.Logout(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := b.State(); st.State != StateAuthRequired {
		t.Fatalf("b after a's logout: %+v", st)
	}
	before, _ := e.mcp.Stats()
	if err := e.callEcho(b, "after a's logout"); !errors.Is(err, ErrAuthRequired) {
		t.Fatalf("b after a's logout: %v", err)
	}
	if after, _ := e.mcp.Stats(); after != before {
		t.Fatal("b sent the logged-out token upstream")
	}
}

// lockWatch is a storage that records, for each Load, whether the caller
// held the lock named after the key.
type lockWatch struct {
	storage.Storage
	mu    sync.Mutex
	held  map[string]int
	loads []bool // per Load of key: under its lock
	ofKey string
}

func (l *lockWatch) Lock(ctx context.Context, name string) error {
	if err := l.Storage.Lock(ctx, name); err != nil {
		return err
	}
	l.mu.Lock()
	l.held[name]++
	l.mu.Unlock()
	return nil
}

func (l *lockWatch) Unlock(ctx context.Context, name string) error {
	l.mu.Lock()
	l.held[name]--
	l.mu.Unlock()
	return l.Storage.Unlock(ctx, name)
}

func (l *lockWatch) Load(ctx context.Context, key string) ([]byte, error) {
	l.mu.Lock()
	if key == l.ofKey {
		l.loads = append(l.loads, l.held[key] > 0)
	}
	l.mu.Unlock()
	return l.Storage.Load(ctx, key)
}

// Reload, which a replica runs when its watch sees another replica write
// the record, reads the record under its storage lock: on NATS storage
// that read comes from the stream leader, where a plain read may come from
// a follower that has not yet applied the write that woke the watch, and
// leave the replica on the state before a login (refusing calls) or a
// logout (using the revoked token) with no further event to correct it.
func TestReloadReadsUnderTheStorageLock(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	e.as.AddClient("gw", "", nil)
	e.onNATS()
	a := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	lw := &lockWatch{Storage: e.store, held: map[string]int{}, ofKey: StorageKey(testUpstream)}
	e.store = lw
	b := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	e.login(a)
	lw.mu.Lock()
	lw.loads = nil
	lw.mu.Unlock()
	if err := b.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	lw.mu.Lock()
	loads := slices.Clone(lw.loads)
	lw.mu.Unlock()
	if len(loads) == 0 || slices.Contains(loads, false) {
		t.Fatalf("Reload's reads of the record, under its lock or not: %v; want every one under it", loads)
	}
	if st := b.State(); st.State != StateReady {
		t.Fatalf("b after a's login and a reload: %+v", st)
	}
	if err := e.callEcho(b, "after the reload"); err != nil {
		t.Fatal(err)
	}
}
