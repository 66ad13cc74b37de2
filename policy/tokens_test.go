package policy

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

func newFileStore(t *testing.T) (*certmagic.FileStorage, *TokenStore) {
	t.Helper()
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	s, err := OpenTokenStore(context.Background(), fs)
	if err != nil {
		t.Fatal(err)
	}
	return fs, s
}

func TestTokenSecretFormat(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		sec := NewTokenSecret()
		rest, ok := strings.CutPrefix(sec, "zds_")
		if !ok {
			t.Fatalf("token %q lacks the zds_ prefix", sec)
		}
		raw, err := base64.RawURLEncoding.DecodeString(rest)
		if err != nil || len(raw) < 32 {
			t.Fatalf("token body decodes to %d bytes (%v), want >= 32 URL-safe bytes", len(raw), err)
		}
		if seen[sec] {
			t.Fatal("token repeated")
		}
		seen[sec] = true
	}
}

func TestCreateCheckRevoke(t *testing.T) {
	ctx := context.Background()
	fs, s := newFileStore(t)
	secret, tok, err := s.Create(ctx, TokenSpec{Name: "laptop", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Check(secret, time.Now())
	if err != nil {
		t.Fatalf("fresh token refused: %v", err)
	}
	if p.TokenID != tok.ID || p.Name != "laptop" || p.Kind != KindUser || !p.HasScope("chat") {
		t.Fatalf("principal = %+v", p)
	}
	if _, err := s.Check(secret+"x", time.Now()); !errors.Is(err, ErrTokenUnknown) {
		t.Fatalf("altered token: err = %v, want unknown", err)
	}
	if _, err := s.Check("Bearer "+secret, time.Now()); !errors.Is(err, ErrTokenUnknown) {
		t.Fatalf("token with junk prefix: err = %v, want unknown", err)
	}

	// The secret is nowhere in storage; only its hash is.
	assertNoSecretOnDisk(t, fs.Path, secret)
	raw, _ := os.ReadFile(filepath.Join(fs.Path, TokensKey))
	if !bytes.Contains(raw, []byte(HashSecret(secret))) {
		t.Fatal("stored file lacks the token hash")
	}

	cancelled := make(chan struct{})
	defer s.Hold(tok.ID, func() { close(cancelled) }).Release()
	var hooked []string
	s.OnRevoke(func(t Token) { hooked = append(hooked, t.Name) })

	if _, err := s.Revoke(ctx, "laptop"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check(secret, time.Now()); !errors.Is(err, ErrTokenRevoked) {
		t.Fatalf("revoked token: err = %v, want revoked", err)
	}
	select {
	case <-cancelled:
	default:
		t.Fatal("revoking did not cancel the held request")
	}
	if len(hooked) != 1 || hooked[0] != "laptop" {
		t.Fatalf("revoke hooks saw %v", hooked)
	}
	if _, err := s.Revoke(ctx, "laptop"); err == nil || !strings.Contains(err.Error(), "already revoked") {
		t.Fatalf("second revoke: err = %v", err)
	}
	if _, err := s.Revoke(ctx, "nope"); !errors.Is(err, ErrTokenNotFound) {
		t.Fatalf("revoke of unknown name: err = %v", err)
	}
}

func TestCreateRefusesBadInput(t *testing.T) {
	_, s := newFileStore(t)
	ctx := context.Background()
	for _, spec := range []TokenSpec{
		{Name: "", Scopes: []string{"chat"}},
		{Name: "has space", Scopes: []string{"chat"}},
		{Name: "ok"},
		{Name: "ok", Scopes: []string{"bad scope"}},
		{Name: "ok", Scopes: []string{"chat"}, Kind: "robot"},
	} {
		if _, _, err := s.Create(ctx, spec); err == nil {
			t.Errorf("Create(%+v) succeeded, want an error", spec)
		}
	}
	if _, _, err := s.Create(ctx, TokenSpec{Name: "dup", Scopes: []string{"chat"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Create(ctx, TokenSpec{Name: "dup", Scopes: []string{"chat"}}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("duplicate name: err = %v", err)
	}
	if got := len(s.List()); got != 1 {
		t.Fatalf("List has %d tokens after refused creates, want 1", got)
	}
}

func TestExpiry(t *testing.T) {
	_, s := newFileStore(t)
	secret, _, err := s.Create(context.Background(), TokenSpec{Name: "short", Scopes: []string{"read"}, Expires: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check(secret, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check(secret, time.Now().Add(2*time.Hour)); !errors.Is(err, ErrTokenExpired) {
		t.Fatalf("err = %v, want expired", err)
	}
	for in, want := range map[string]time.Duration{"30d": 720 * time.Hour, "12h": 12 * time.Hour, "": 0} {
		if got, err := ParseExpiry(in); err != nil || got != want {
			t.Errorf("ParseExpiry(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1h", "0d", "xd", "soon"} {
		if _, err := ParseExpiry(bad); err == nil {
			t.Errorf("ParseExpiry(%q) succeeded", bad)
		}
	}
}

// A second store over the same storage stands for the offline CLI: what it
// writes, the server's store sees on its next Sync, revoke hooks included.
func TestSyncSeesOtherWriter(t *testing.T) {
	ctx := context.Background()
	fs, server := newFileStore(t)
	cli, err := OpenTokenStore(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	secret, tok, err := cli.Create(ctx, TokenSpec{Name: "ci", Scopes: []string{"deploy"}, Kind: KindMachine})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := server.Check(secret, time.Now()); !errors.Is(err, ErrTokenUnknown) {
		t.Fatalf("before sync: err = %v", err)
	}
	if err := server.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := server.Check(secret, time.Now())
	if err != nil || p.Kind != KindMachine {
		t.Fatalf("after sync: %+v, %v", p, err)
	}
	closed := make(chan struct{})
	server.Hold(tok.ID, func() { close(closed) })
	if _, err := cli.Revoke(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if err := server.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	default:
		t.Fatal("a revocation by another process did not cancel held work")
	}
	if _, err := server.Check(secret, time.Now()); !errors.Is(err, ErrTokenRevoked) {
		t.Fatalf("after revoke sync: err = %v", err)
	}
}

func TestLastUsedFlushKeepsConcurrentChanges(t *testing.T) {
	ctx := context.Background()
	fs, server := newFileStore(t)
	secret, tok, _ := server.Create(ctx, TokenSpec{Name: "a", Scopes: []string{"chat"}})
	if _, err := server.Check(secret, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Another process creates a token between the check and the flush.
	cli, _ := OpenTokenStore(ctx, fs)
	if _, _, err := cli.Create(ctx, TokenSpec{Name: "b", Scopes: []string{"chat"}}); err != nil {
		t.Fatal(err)
	}
	if err := server.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cli.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	list := cli.List()
	if len(list) != 2 {
		t.Fatalf("after flush the file has %d tokens, want 2 (a flush lost a token)", len(list))
	}
	for _, l := range list {
		if l.ID == tok.ID && l.LastUsed == nil {
			t.Fatal("last_used was not flushed")
		}
	}
}

func TestCorruptFileIsNeverOverwritten(t *testing.T) {
	ctx := context.Background()
	fs, s := newFileStore(t)
	secret, _, _ := s.Create(ctx, TokenSpec{Name: "a", Scopes: []string{"chat"}})
	path := filepath.Join(fs.Path, TokensKey)
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err == nil {
		t.Fatal("Sync accepted a corrupt file")
	}
	// The last good index keeps serving.
	if _, err := s.Check(secret, time.Now()); err != nil {
		t.Fatalf("corrupt file dropped a good token from memory: %v", err)
	}
	if _, _, err := s.Create(ctx, TokenSpec{Name: "b", Scopes: []string{"chat"}}); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("Create over a corrupt file: err = %v", err)
	}
	raw, _ := os.ReadFile(path)
	if string(raw) != "{not json" {
		t.Fatal("a corrupt token file was overwritten")
	}
}

func TestRevokeParentRevokesChild(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	_, parent, _ := s.Create(ctx, TokenSpec{Name: "parent", Scopes: []string{"chat"}})
	childSecret, _, err := s.CreateChild(ctx, ChildSpec{Parent: parent.Principal(), Session: "ses_1", Purpose: PurposeOrchestrator, Scopes: []string{"sessions:read"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Revoke(ctx, "parent"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check(childSecret, time.Now()); !errors.Is(err, ErrTokenRevoked) {
		t.Fatalf("child of a revoked parent: err = %v", err)
	}
}

func assertNoSecretOnDisk(t *testing.T, root, secret string) {
	t.Helper()
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(path)
		if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, []byte(strings.TrimPrefix(secret, TokenPrefix))) {
			t.Errorf("%s contains the token secret", path)
		}
		return nil
	})
}

func BenchmarkTokenCheck(b *testing.B) {
	fs := &certmagic.FileStorage{Path: b.TempDir()}
	s, _ := OpenTokenStore(context.Background(), fs)
	for i := 0; i < 100; i++ {
		if _, _, err := s.Create(context.Background(), TokenSpec{Name: "t" + itoa(i), Scopes: []string{"chat"}}); err != nil {
			b.Fatal(err)
		}
	}
	secret, _, _ := s.Create(context.Background(), TokenSpec{Name: "bench", Scopes: []string{"chat"}})
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Check(secret, now); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTokenCheckParallel is the check under concurrent requests for
// many tokens, where a lock on the hot path would show.
func BenchmarkTokenCheckParallel(b *testing.B) {
	fs := &certmagic.FileStorage{Path: b.TempDir()}
	s, _ := OpenTokenStore(context.Background(), fs)
	var secrets []string
	for i := 0; i < 16; i++ {
		secret, _, err := s.Create(context.Background(), TokenSpec{Name: "p" + itoa(i), Scopes: []string{"chat"}})
		if err != nil {
			b.Fatal(err)
		}
		secrets = append(secrets, secret)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.Check(secrets[i%len(secrets)], time.Now()); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

func itoa(i int) string {
	return string([]byte{byte('0' + i/100%10), byte('0' + i/10%10), byte('0' + i%10)})
}

// storeOfTwo is a file store with two chat tokens, named a and b.
func storeOfTwo(t *testing.T) (*TokenStore, Token, Token) {
	t.Helper()
	_, s := newFileStore(t)
	var toks [2]Token
	for i, name := range []string{"a", "b"} {
		_, tok, err := s.Create(context.Background(), TokenSpec{Name: name, Scopes: []string{"chat"}})
		if err != nil {
			t.Fatal(err)
		}
		toks[i] = tok
	}
	return s, toks[0], toks[1]
}

// Revoking a token ends the requests of that token that are still held,
// whichever shard holds them, and no request of another token, nor one
// already released.
func TestRevokeEndsOnlyThatTokensHeldRequests(t *testing.T) {
	ctx := context.Background()
	s, a, b := storeOfTwo(t)
	var mu sync.Mutex
	ended := map[string]int{}
	end := func(who string) func() {
		return func() { mu.Lock(); ended[who]++; mu.Unlock() }
	}
	// More requests than there are shards, the two tokens' interleaved.
	var heldB []Held
	for i := 0; i < 3*holdShards; i++ {
		s.Hold(a.ID, end("a"))
		heldB = append(heldB, s.Hold(b.ID, end("b")))
	}
	s.Hold(a.ID, end("a released")).Release()
	if _, err := s.Revoke(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ended["a"] != 3*holdShards || ended["b"] != 0 || ended["a released"] != 0 {
		t.Fatalf("revoking a ended %v, want every held request of a (%d) and nothing else", ended, 3*holdShards)
	}
	for _, h := range heldB {
		h.Release()
	}
	if _, err := s.Revoke(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if ended["b"] != 0 {
		t.Fatalf("revoking b cancelled %d released requests", ended["b"])
	}
}

// A request that passed the token check just before its token was revoked,
// and takes its hold only after the revocation has ended what was held,
// ends at once: its hold finds the revocation's mark. A JWT subject's
// revocation leaves no such mark, since its later tokens are good.
func TestHoldAfterRevocationEndsAtOnce(t *testing.T) {
	ctx := context.Background()
	s, a, b := storeOfTwo(t)
	if _, err := s.Revoke(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeSubject(ctx, JWTPrefix+"alice"); err != nil {
		t.Fatal(err)
	}
	ended := map[string]bool{}
	for _, id := range []string{a.ID, b.ID, JWTPrefix + "alice"} {
		s.Hold(id, func() { ended[id] = true })
	}
	if !ended[a.ID] || ended[b.ID] || ended[JWTPrefix+"alice"] {
		t.Fatalf("holds taken after the revocations ended: %v; want only the revoked token's", ended)
	}
	// The revoked token's hold was also let go: a second revocation of
	// everything finds only b's and alice's.
	n := 0
	for _, cancel := range s.takeHolds("", true) {
		cancel()
		n++
	}
	if n != 2 {
		t.Fatalf("%d holds left, want 2", n)
	}
}

// The ended marks are swept once per endedFor, of those older than it: a
// mark stays while it can matter, and many revocations at once sweep once.
func TestEndedMarksAreSwept(t *testing.T) {
	_, s := newFileStore(t)
	t0 := time.Unix(1_000_000, 0)
	s.markEnded("tok_old", t0)
	s.markEnded("tok_recent", t0.Add(endedFor/2))
	marked := func(id string) bool { _, ok := s.ended.Load(id); return ok }
	if !marked("tok_old") || !marked("tok_recent") {
		t.Fatal("a fresh mark is gone")
	}
	// Past endedFor since the last sweep: this mark sweeps what is older.
	s.markEnded("tok_new", t0.Add(endedFor+time.Second))
	if marked("tok_old") || !marked("tok_recent") || !marked("tok_new") {
		t.Fatalf("after a sweep: old %v, recent %v, new %v; want only the old one gone", marked("tok_old"), marked("tok_recent"), marked("tok_new"))
	}
	// Within endedFor of that sweep, no other sweep: tok_recent, now
	// older than endedFor, waits for the next one.
	s.markEnded("tok_next", t0.Add(endedFor+endedFor/2+time.Second))
	if !marked("tok_recent") {
		t.Fatal("swept twice within endedFor")
	}
	var cancelled bool
	s.Hold("tok_old", func() { cancelled = true }).Release()
	if cancelled {
		t.Fatal("a swept mark still ends a hold")
	}
}

// A request whose body took longer than endedFor, so that its token's
// mark is swept before it takes its hold, still ends at once: the token's
// record says it was revoked.
func TestHoldLongAfterRevocationEndsAtOnce(t *testing.T) {
	ctx := context.Background()
	s, a, _ := storeOfTwo(t)
	if _, err := s.Revoke(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	s.ended.Delete(a.ID) // as a sweep endedFor later would
	var cancelled bool
	s.Hold(a.ID, func() { cancelled = true }).Release()
	if !cancelled {
		t.Fatal("a hold taken after the mark was swept outlived its token's revocation")
	}
}

// When the process exits, the store ends every request it holds, of every
// token, so that no open stream keeps caddy from stopping; releasing one
// afterwards is harmless.
func TestCancelHoldsEndsEveryHeldRequest(t *testing.T) {
	_, s := newFileStore(t)
	var ended []string
	heldA := s.Hold("tok_a", func() { ended = append(ended, "a") })
	heldB := s.Hold("tok_b", func() { ended = append(ended, "b") })
	s.CancelHolds()
	if len(ended) != 2 {
		t.Fatalf("ended %v, want both requests", ended)
	}
	heldA.Release()
	heldB.Release()
	s.Hold("tok_c", func() { ended = append(ended, "c") }).Release()
	s.CancelHolds()
	if len(ended) != 2 {
		t.Fatalf("a released request was cancelled: %v", ended)
	}
}

// gatedStorage holds up the next Load of the token file once it has read
// it, until release is closed.
type gatedStorage struct {
	*certmagic.FileStorage
	armed   atomic.Bool
	loaded  chan struct{}
	release chan struct{}
}

func (g *gatedStorage) Load(ctx context.Context, key string) ([]byte, error) {
	raw, err := g.FileStorage.Load(ctx, key)
	if key == TokensKey && g.armed.CompareAndSwap(true, false) {
		close(g.loaded)
		<-g.release
	}
	return raw, err
}

// A sync that read the token file just before a revocation wrote it must
// not install that older file after the revocation's own install: the
// revoked token would work again until the next sync (on NATS storage a
// watch and the periodic sync both run Sync, so they cross too).
func TestSyncDoesNotUndoAConcurrentRevoke(t *testing.T) {
	ctx := context.Background()
	g := &gatedStorage{FileStorage: &certmagic.FileStorage{Path: t.TempDir()}, loaded: make(chan struct{}), release: make(chan struct{})}
	s, err := OpenTokenStore(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	secret, tok, err := s.Create(ctx, TokenSpec{Name: "ops", Scopes: []string{"mcp"}})
	if err != nil {
		t.Fatal(err)
	}
	// Another process changes the file, so that Sync has something to
	// install: its last-used time, say.
	other, _ := OpenTokenStore(ctx, g.FileStorage)
	if _, _, err := other.Create(ctx, TokenSpec{Name: "other", Scopes: []string{"mcp"}}); err != nil {
		t.Fatal(err)
	}

	g.armed.Store(true)
	synced := make(chan error, 1)
	go func() { synced <- s.Sync(ctx) }()
	<-g.loaded // the sync holds the file as it was: ops not revoked
	revoked := make(chan error, 1)
	go func() { _, err := s.Revoke(ctx, tok.ID); revoked <- err }()
	// The revocation writes the file and then installs it, or waits to;
	// the sync then goes on with what it read.
	deadline := time.Now().Add(10 * time.Second)
	for {
		raw, _ := g.FileStorage.Load(ctx, TokensKey)
		if bytes.Contains(raw, []byte(`"revoked"`)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if err := <-revoked; err != nil {
		t.Fatal(err)
	}
	if _, err := s.Check(secret, time.Now()); err == nil {
		t.Fatal("a revoked token works again: a sync installed the file as it was before the revocation")
	}
}
