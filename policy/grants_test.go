package policy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

const (
	resourceA = "https://a.example/mcp"
	resourceB = "https://b.example/mcp"
	clientCC  = "https://claude.example/oauth/client.json"
)

// thumb is a valid-looking RFC 7638 thumbprint of some key.
func thumb(seed string) string {
	s := sha256.Sum256([]byte(seed))
	return base64.RawURLEncoding.EncodeToString(s[:])
}

func randomKey(t testing.TB) []byte {
	t.Helper()
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

// grantEnv is a token store with a grant key over file storage, and the
// first grant issued in it.
type grantEnv struct {
	fs    *certmagic.FileStorage
	s     *TokenStore
	key   []byte
	now   time.Time
	spec  GrantSpec
	first Issued
}

func newGrantEnv(t *testing.T, spec GrantSpec) *grantEnv {
	t.Helper()
	fs, s := newFileStore(t)
	e := &grantEnv{fs: fs, s: s, key: randomKey(t), now: time.Now().Truncate(time.Second)}
	if err := s.SetGrantKey(e.key); err != nil {
		t.Fatal(err)
	}
	if spec.Owner == "" {
		spec = GrantSpec{Owner: "alice", Name: "claude", Client: clientCC, ClientName: "Claude Code", Resource: resourceA, Scopes: []string{"chat", "admin"}}
	}
	e.spec = spec
	iss, err := s.CreateGrant(context.Background(), spec, e.now)
	if err != nil {
		t.Fatal(err)
	}
	e.first = iss
	return e
}

// another opens a second token store over e's storage, as another replica
// of the cluster would, with key.
func (e *grantEnv) another(t *testing.T, key []byte) *TokenStore {
	t.Helper()
	s, err := OpenTokenStore(context.Background(), e.fs)
	if err != nil {
		t.Fatal(err)
	}
	if key != nil {
		if err := s.SetGrantKey(key); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (e *grantEnv) refresh(tok string, at time.Time) (Issued, error) {
	return e.s.RefreshGrant(context.Background(), RefreshRequest{Refresh: tok, Client: e.spec.Client, Resource: e.spec.Resource, JKT: e.spec.JKT}, at)
}

// grantRecord is the stored record of grant id, read from storage.
func (e *grantEnv) grantRecord(t *testing.T, id string) Token {
	t.Helper()
	raw, err := e.fs.Load(context.Background(), TokensKey)
	if err != nil {
		t.Fatal(err)
	}
	var f tokenFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	for _, tok := range f.Tokens {
		if tok.ID == id {
			return *tok
		}
	}
	t.Fatalf("grant %s is not in the token file", id)
	return Token{}
}

// mustStayActive asserts that the grant still works: its current access
// token authenticates.
func (e *grantEnv) mustStayActive(t *testing.T, access string) {
	t.Helper()
	if _, err := e.s.Check(access, e.now); err != nil {
		t.Fatalf("the grant was harmed by the attack: its access token is refused: %v", err)
	}
	if rec := e.grantRecord(t, e.first.GrantID); rec.Revoked != nil {
		t.Fatal("the grant was revoked by the attack")
	}
}

// flipAt returns tok with the character at i replaced by another of the
// base64url alphabet.
func flipAt(tok string, i int) string {
	b := []byte(tok)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// TestGrantAttacks is what a holder of a grant's tokens, or of nothing but
// a grant's id, can try; each row asserts the refusal (its error and a word
// of the message the client is told) and what the attack leaves standing.
func TestGrantAttacks(t *testing.T) {
	ctx := context.Background()
	rows := []struct {
		name string
		spec GrantSpec // zero: alice's Claude Code grant for resource A, chat and admin
		// attack runs the attack and returns the error of its last step.
		attack func(t *testing.T, e *grantEnv) error
		want   error
		word   string
		// after asserts what the attack leaves standing.
		after func(t *testing.T, e *grantEnv)
	}{
		{
			name: "forged MAC",
			attack: func(t *testing.T, e *grantEnv) error {
				raw, _ := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(e.first.Access, AccessPrefix))
				raw[len(raw)-1] ^= 1
				_, err := e.s.Check(AccessPrefix+base64.RawURLEncoding.EncodeToString(raw), e.now)
				return err
			},
			want: ErrTokenUnknown, word: "not recognised",
		},
		{
			name: "payload widened under the old MAC (scopes rewritten)",
			attack: func(t *testing.T, e *grantEnv) error {
				raw, _ := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(e.first.Access, AccessPrefix))
				forged := bytes.Replace(raw, []byte("chat"), []byte("root"), 1)
				_, err := e.s.Check(AccessPrefix+base64.RawURLEncoding.EncodeToString(forged), e.now)
				return err
			},
			want: ErrTokenUnknown, word: "not recognised",
		},
		{
			name: "truncated token, by one character and by the whole MAC",
			attack: func(t *testing.T, e *grantEnv) error {
				if _, err := e.s.Check(e.first.Access[:len(e.first.Access)-1], e.now); !errors.Is(err, ErrTokenUnknown) {
					t.Fatalf("one character short: %v", err)
				}
				_, err := e.s.Check(e.first.Access[:len(e.first.Access)-43], e.now)
				return err
			},
			want: ErrTokenUnknown, word: "not recognised",
		},
		{
			name: "token made by another gateway (another key) for a grant of this one",
			attack: func(t *testing.T, e *grantEnv) error {
				other := e.another(t, randomKey(t))
				iss, err := other.CreateGrant(ctx, e.spec, e.now)
				if err != nil {
					t.Fatal(err)
				}
				if err := e.s.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				_, err = e.s.Check(iss.Access, e.now)
				return err
			},
			want: ErrTokenUnknown, word: "not recognised",
		},
		{
			name: "every other character at every position, for tokens of each length modulo 3",
			attack: func(t *testing.T, e *grantEnv) error {
				const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
				// Resources of three lengths give payloads of three lengths
				// modulo 3, so the last character carries 0, 2 or 4 bits no
				// byte uses: a second spelling of one token, unless refused.
				for _, res := range []string{resourceA, resourceA + "1", resourceA + "12"} {
					spec := e.spec
					spec.Resource = res
					iss, err := e.s.CreateGrant(ctx, spec, e.now)
					if err != nil {
						t.Fatal(err)
					}
					tok := []byte(iss.Access)
					for i := len(AccessPrefix); i < len(tok); i++ {
						orig := tok[i]
						for _, c := range []byte(alphabet) {
							if c == orig {
								continue
							}
							tok[i] = c
							if p, err := e.s.Check(string(tok), e.now); !errors.Is(err, ErrTokenUnknown) {
								t.Fatalf("character %d of %d changed to %q: %+v, %v: want unknown", i, len(tok), c, p, err)
							}
						}
						tok[i] = orig
					}
				}
				_, err := e.s.Check(flipAt(e.first.Access, len(e.first.Access)-1), e.now)
				return err
			},
			want: ErrTokenUnknown, word: "not recognised",
		},
		{
			name: "expired access token",
			attack: func(t *testing.T, e *grantEnv) error {
				_, err := e.s.Check(e.first.Access, e.first.AccessExpires)
				return err
			},
			want: ErrTokenExpired, word: "expired",
		},
		{
			name: "grant revoked: its access token refused, its held request cancelled, another replica told",
			attack: func(t *testing.T, e *grantEnv) error {
				p, err := e.s.Check(e.first.Access, e.now)
				if err != nil {
					t.Fatal(err)
				}
				cancelled := make(chan struct{})
				defer e.s.Hold(p.TokenID, func() { close(cancelled) }).Release()
				replica := e.another(t, e.key)
				seen := make(chan string, 4)
				replica.OnRevoke(func(tok Token) { seen <- tok.ID })
				if _, err := e.s.Revoke(ctx, e.first.GrantID); err != nil {
					t.Fatal(err)
				}
				select {
				case <-cancelled:
				case <-time.After(5 * time.Second):
					t.Fatal("the request held on the grant was not cancelled")
				}
				if err := replica.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				select {
				case id := <-seen:
					if id != e.first.GrantID {
						t.Fatalf("the replica's revoke hook got %s", id)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the other replica's revoke hook did not run")
				}
				if _, err := replica.Check(e.first.Access, e.now); !errors.Is(err, ErrTokenRevoked) {
					t.Fatalf("the replica accepts the revoked grant's token: %v", err)
				}
				_, err = e.s.Check(e.first.Access, e.now)
				return err
			},
			want: ErrTokenRevoked, word: "revoked",
		},
		{
			name: "resource A's token presented: the principal says A (the edge compares)",
			attack: func(t *testing.T, e *grantEnv) error {
				p, err := e.s.Check(e.first.Access, e.now)
				if err != nil {
					t.Fatal(err)
				}
				if p.Resource != resourceA || p.Source != "grant" || p.Client != clientCC || p.Owner != "alice" || p.Kind != KindUser {
					t.Fatalf("principal = %+v", p)
				}
				return errors.New("resource " + p.Resource)
			},
			want: nil, word: resourceA,
		},
		{
			name: "prefix confusion: zda_, zds_ and zdr_ bodies under one another's prefix",
			attack: func(t *testing.T, e *grantEnv) error {
				op, _, err := e.s.Create(ctx, TokenSpec{Name: "laptop", Scopes: []string{"chat"}})
				if err != nil {
					t.Fatal(err)
				}
				body := func(tok string) string { return tok[4:] }
				for _, c := range []string{
					TokenPrefix + body(e.first.Access), TokenPrefix + body(e.first.Refresh),
					AccessPrefix + body(op), AccessPrefix + body(e.first.Refresh),
					e.first.Refresh, body(e.first.Access), strings.ToUpper(e.first.Access[:4]) + body(e.first.Access),
				} {
					if p, err := e.s.Check(c, e.now); err == nil {
						t.Fatalf("%q… authenticates as %+v", c[:8], p)
					}
				}
				for _, c := range []string{e.first.Access, op, RefreshPrefix + body(e.first.Access), RefreshPrefix + body(op)} {
					if _, err := e.refresh(c, e.now); !errors.Is(err, ErrRefreshInvalid) {
						t.Fatalf("%q… redeemed at the token endpoint: %v", c[:8], err)
					}
				}
				_, err = Authenticator{Tokens: e.s}.Authenticate(ctx, "Bearer "+e.first.Refresh, e.now)
				return err
			},
			want: ErrTokenInvalid, word: "refresh token",
			after: func(t *testing.T, e *grantEnv) { e.mustStayActive(t, e.first.Access) },
		},
		{
			name: "refresh token reused: the grant is revoked, and its new access token refused at once",
			attack: func(t *testing.T, e *grantEnv) error {
				p, _ := e.s.Check(e.first.Access, e.now)
				cancelled := make(chan struct{})
				defer e.s.Hold(p.TokenID, func() { close(cancelled) }).Release()
				next, err := e.refresh(e.first.Refresh, e.now)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := e.s.Check(next.Access, e.now); err != nil {
					t.Fatal(err)
				}
				_, err = e.refresh(e.first.Refresh, e.now) // the thief, or the client after the thief
				if _, cerr := e.s.Check(next.Access, e.now); !errors.Is(cerr, ErrTokenRevoked) {
					t.Fatalf("the newest access token of a reused grant: %v, want revoked", cerr)
				}
				if _, rerr := e.refresh(next.Refresh, e.now); !errors.Is(rerr, ErrRefreshInvalid) {
					t.Fatalf("the newest refresh token of a reused grant: %v, want invalid", rerr)
				}
				select {
				case <-cancelled:
				case <-time.After(5 * time.Second):
					t.Fatal("the request held on the reused grant was not cancelled")
				}
				return err
			},
			want: ErrGrantReused, word: "revoked",
		},
		{
			name: "refresh by another client",
			attack: func(t *testing.T, e *grantEnv) error {
				_, err := e.s.RefreshGrant(ctx, RefreshRequest{Refresh: e.first.Refresh, Client: "https://evil.example/client.json"}, e.now)
				return err
			},
			want: ErrRefreshInvalid, word: "another client",
			after: func(t *testing.T, e *grantEnv) {
				if _, err := e.refresh(e.first.Refresh, e.now); err != nil {
					t.Fatalf("the refused attempt spent the client's refresh token: %v", err)
				}
			},
		},
		{
			name: "refresh for another resource",
			attack: func(t *testing.T, e *grantEnv) error {
				_, err := e.s.RefreshGrant(ctx, RefreshRequest{Refresh: e.first.Refresh, Client: clientCC, Resource: resourceB}, e.now)
				return err
			},
			want: ErrTargetInvalid, word: resourceA,
			after: func(t *testing.T, e *grantEnv) { e.mustStayActive(t, e.first.Access) },
		},
		{
			name: "bound grant refreshed with another DPoP key, and with none",
			spec: GrantSpec{Owner: "alice", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}, JKT: thumb("k1")},
			attack: func(t *testing.T, e *grantEnv) error {
				if _, err := e.s.RefreshGrant(ctx, RefreshRequest{Refresh: e.first.Refresh, Client: clientCC}, e.now); !errors.Is(err, ErrRefreshInvalid) {
					t.Fatalf("without a proof: %v", err)
				}
				_, err := e.s.RefreshGrant(ctx, RefreshRequest{Refresh: e.first.Refresh, Client: clientCC, JKT: thumb("k2")}, e.now)
				return err
			},
			want: ErrRefreshInvalid, word: "DPoP",
			after: func(t *testing.T, e *grantEnv) {
				next, err := e.refresh(e.first.Refresh, e.now)
				if err != nil || next.JKT != thumb("k1") {
					t.Fatalf("the same key's refresh: %+v %v", next, err)
				}
				if p, err := e.s.Check(next.Access, e.now); err != nil || p.JKT != thumb("k1") {
					t.Fatalf("the refreshed access token is not bound: %+v %v", p, err)
				}
			},
		},
		{
			name: "refresh widening scopes",
			spec: GrantSpec{Owner: "alice", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}},
			attack: func(t *testing.T, e *grantEnv) error {
				_, err := e.s.RefreshGrant(ctx, RefreshRequest{Refresh: e.first.Refresh, Client: clientCC, Scopes: []string{"chat", "admin"}}, e.now)
				return err
			},
			want: ErrScopeWidened, word: "only narrow",
			after: func(t *testing.T, e *grantEnv) { e.mustStayActive(t, e.first.Access) },
		},
		{
			name: "refresh token forged for a real grant id (any generation): refused, and the grant not revoked",
			attack: func(t *testing.T, e *grantEnv) error {
				for _, gen := range []uint64{1, 2, 99} {
					forged := newRefreshToken(e.first.GrantID, gen)
					if _, err := e.refresh(forged, e.now); !errors.Is(err, ErrRefreshInvalid) {
						t.Fatalf("generation %d: %v", gen, err)
					}
					if err := e.s.RevokeCredential(ctx, forged, clientCC); err != nil {
						t.Fatalf("revocation of a forged token: %v, want no error (RFC 7009)", err)
					}
				}
				_, err := e.refresh(newRefreshToken(e.first.GrantID, 1), e.now)
				return err
			},
			want: ErrRefreshInvalid, word: "matches no grant",
			after: func(t *testing.T, e *grantEnv) { e.mustStayActive(t, e.first.Access) },
		},
		{
			name: "two concurrent refreshes of one token on two replicas: exactly one wins",
			attack: func(t *testing.T, e *grantEnv) error {
				stores := []*TokenStore{e.s, e.another(t, e.key)}
				errs := make([]error, 2)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i, s := range stores {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						_, errs[i] = s.RefreshGrant(ctx, RefreshRequest{Refresh: e.first.Refresh, Client: clientCC}, e.now)
					}()
				}
				close(start)
				wg.Wait()
				wins := 0
				var lost error
				for _, err := range errs {
					if err == nil {
						wins++
					} else {
						lost = err
					}
				}
				if wins != 1 {
					t.Fatalf("%d of 2 refreshes won (%v)", wins, errs)
				}
				// The loser presented a spent token, which is a reuse.
				return lost
			},
			want: ErrGrantReused, word: "already used",
		},
		{
			name: "expired grant: neither its access token nor its refresh token",
			spec: GrantSpec{Owner: "alice", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}, GrantTTL: time.Hour, AccessTTL: 2 * time.Hour},
			attack: func(t *testing.T, e *grantEnv) error {
				if !e.first.AccessExpires.Equal(e.now.Add(time.Hour)) || !e.first.RefreshExpires.Equal(e.now.Add(time.Hour)) {
					t.Fatalf("the tokens outlive the grant: access %s, refresh %s", e.first.AccessExpires, e.first.RefreshExpires)
				}
				if _, err := e.s.Check(e.first.Access, e.now.Add(time.Hour)); !errors.Is(err, ErrTokenExpired) {
					t.Fatalf("access token of an expired grant: %v", err)
				}
				_, err := e.refresh(e.first.Refresh, e.now.Add(time.Hour))
				return err
			},
			want: ErrRefreshInvalid, word: "expired",
		},
		{
			name: "refresh token unused past its idle lifetime",
			spec: GrantSpec{Owner: "alice", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}, RefreshTTL: time.Hour},
			attack: func(t *testing.T, e *grantEnv) error {
				_, err := e.refresh(e.first.Refresh, e.now.Add(time.Hour))
				return err
			},
			want: ErrRefreshInvalid, word: "lapsed",
		},
		{
			name: "revocation (RFC 7009) of alice's token by another client",
			attack: func(t *testing.T, e *grantEnv) error {
				if err := e.s.RevokeCredential(ctx, "zda_bm90IGEgdG9rZW4", clientCC); err != nil {
					t.Fatalf("an unknown token: %v, want no error", err)
				}
				return e.s.RevokeCredential(ctx, e.first.Access, "https://evil.example/client.json")
			},
			want: ErrClientMismatch, word: "another client",
			after: func(t *testing.T, e *grantEnv) {
				e.mustStayActive(t, e.first.Access)
				if err := e.s.RevokeCredential(ctx, e.first.Refresh, clientCC); err != nil {
					t.Fatal(err)
				}
				if _, err := e.s.Check(e.first.Access, e.now); !errors.Is(err, ErrTokenRevoked) {
					t.Fatalf("the client revoked its refresh token, and its access token still works: %v", err)
				}
			},
		},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			e := newGrantEnv(t, row.spec)
			err := row.attack(t, e)
			switch {
			case row.want == nil:
				if err == nil || !strings.Contains(err.Error(), row.word) {
					t.Fatalf("got %v, want a note with %q", err, row.word)
				}
			case !errors.Is(err, row.want):
				t.Fatalf("err = %v, want %v", err, row.want)
			case !strings.Contains(err.Error(), row.word):
				t.Fatalf("err = %q, want it to say %q", err, row.word)
			}
			for _, secret := range []string{e.first.Access, e.first.Refresh} {
				if err != nil && strings.Contains(err.Error(), secret) {
					t.Fatal("the error repeats a secret")
				}
			}
			if row.after != nil {
				row.after(t, e)
			}
		})
	}
}

// A grant, issued and refreshed, is stored as hashes only; the listing and
// the events show its owner and client, and no secret or hash.
func TestGrantStoredAndListedWithoutSecrets(t *testing.T) {
	ctx := context.Background()
	e := newGrantEnv(t, GrantSpec{})
	var events []TokenEvent
	e.s.OnEvent(func(ev TokenEvent) { events = append(events, ev) })
	next, err := e.refresh(e.first.Refresh, e.now)
	if err != nil {
		t.Fatal(err)
	}
	if next.Refresh == e.first.Refresh || !strings.HasPrefix(next.Refresh, RefreshPrefix+e.first.GrantID+"_2_") {
		t.Fatalf("refresh token not rotated to generation 2: %q", next.Refresh[:30])
	}
	for _, secret := range []string{e.first.Access, e.first.Refresh, next.Access, next.Refresh} {
		assertNoSecretOnDisk(t, e.fs.Path, secret)
	}
	rec := e.grantRecord(t, e.first.GrantID)
	if rec.Refresh.SHA256 != HashSecret(next.Refresh) || len(rec.Refresh.Spent) != 1 || rec.Refresh.Generation != 2 {
		t.Fatalf("stored refresh state = %+v", rec.Refresh)
	}
	list := e.s.List()
	if len(list) != 1 || list[0].Owner != "alice" || list[0].Client != clientCC || list[0].ClientName != "Claude Code" || list[0].Resource != resourceA {
		t.Fatalf("list = %+v", list)
	}
	raw, _ := json.Marshal(list)
	for _, h := range append(rec.Refresh.Spent, rec.Refresh.SHA256) {
		if bytes.Contains(raw, []byte(h)) {
			t.Fatal("the listing shows a refresh hash")
		}
	}
	if _, err := e.s.Revoke(ctx, e.first.GrantID); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, ev := range events {
		actions = append(actions, ev.Action)
		if ev.Token.Refresh != nil && (ev.Token.Refresh.SHA256 != "" || len(ev.Token.Refresh.Spent) > 0) {
			t.Fatalf("event %s carries refresh hashes", ev.Action)
		}
	}
	if !slices.Equal(actions, []string{"grant_refreshed", "grant_revoked"}) {
		t.Fatalf("events = %v", actions)
	}
}

// Narrowing a grant at a refresh narrows the access tokens issued before
// it: a principal holds the scopes its token and its grant both grant.
func TestGrantNarrowedNeverWidensOlderAccessToken(t *testing.T) {
	e := newGrantEnv(t, GrantSpec{})
	next, err := e.s.RefreshGrant(context.Background(), RefreshRequest{Refresh: e.first.Refresh, Client: clientCC, Scopes: []string{"chat"}}, e.now)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(next.Scopes, []string{"chat"}) {
		t.Fatalf("narrowed refresh issued %v", next.Scopes)
	}
	p, err := e.s.Check(e.first.Access, e.now)
	if err != nil || !slices.Equal(p.Scopes, []string{"chat"}) {
		t.Fatalf("the older access token authenticates with %v (%v), want chat alone", p.Scopes, err)
	}
	if _, err := e.s.RefreshGrant(context.Background(), RefreshRequest{Refresh: next.Refresh, Client: clientCC, Scopes: []string{"admin"}}, e.now); !errors.Is(err, ErrScopeWidened) {
		t.Fatalf("a scope given up came back: %v", err)
	}
}

// A grant's sessions are its owner's, and another replica that a request
// is forwarded to finds the grant's principal by id.
func TestGrantLookupAndOwner(t *testing.T) {
	e := newGrantEnv(t, GrantSpec{})
	replica := e.another(t, nil)
	p, err := replica.Lookup(e.first.GrantID, e.now)
	if err != nil || p.Owner != "alice" || p.OwnerID() != "alice" || p.Source != "grant" || p.Client != clientCC || p.Resource != resourceA {
		t.Fatalf("lookup = %+v, %v", p, err)
	}
	if _, err := replica.Check(e.first.Access, e.now); !errors.Is(err, ErrTokenUnknown) {
		t.Fatalf("a store without the grant key accepts an access token: %v", err)
	}
}

// Revoked or expired grants leave the token file a while after they end,
// with what derives from them; live ones stay.
func TestGrantsPruned(t *testing.T) {
	ctx := context.Background()
	e := newGrantEnv(t, GrantSpec{})
	live, err := e.s.CreateGrant(ctx, GrantSpec{Owner: "bob", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}}, e.now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Revoke(ctx, e.first.GrantID); err != nil {
		t.Fatal(err)
	}
	f, _ := decodeTokenFile(mustLoad(t, e))
	pruneGrants(f, time.Now().Add(grantKeptAfter/2))
	if len(f.Tokens) != 2 {
		t.Fatalf("a grant revoked a moment ago was pruned: %d tokens", len(f.Tokens))
	}
	pruneGrants(f, time.Now().Add(grantKeptAfter+time.Hour))
	if len(f.Tokens) != 1 || f.Tokens[0].ID != live.GrantID {
		t.Fatalf("after the keep period: %+v", f.Tokens)
	}
	pruneGrants(f, e.now.Add(DefaultRefreshTTL+grantKeptAfter+time.Hour))
	if len(f.Tokens) != 0 {
		t.Fatalf("a grant whose refresh token lapsed long ago stays: %+v", f.Tokens)
	}
}

func mustLoad(t *testing.T, e *grantEnv) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.fs.Path, TokensKey))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// One owner signing one client in over and over holds a bounded number of
// live grants: the oldest are revoked.
func TestGrantsPerClientBounded(t *testing.T) {
	e := newGrantEnv(t, GrantSpec{})
	for range maxGrantsPerClient {
		if _, err := e.s.CreateGrant(context.Background(), e.spec, e.now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.s.Check(e.first.Access, e.now); !errors.Is(err, ErrTokenRevoked) {
		t.Fatalf("the oldest grant beyond the bound: %v, want revoked", err)
	}
	active := 0
	for _, tok := range e.s.List() {
		if tok.Active(e.now) {
			active++
		}
	}
	if active != maxGrantsPerClient {
		t.Fatalf("%d live grants, want %d", active, maxGrantsPerClient)
	}
}

// Bad grant requests are refused with a message saying what is wrong.
func TestGrantSpecRefused(t *testing.T) {
	_, s := newFileStore(t)
	base := GrantSpec{Owner: "alice", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}}
	if _, err := s.CreateGrant(context.Background(), base, time.Now()); !errors.Is(err, ErrNoGrantKey) {
		t.Fatalf("without a key: %v", err)
	}
	if err := s.SetGrantKey(make([]byte, 16)); err == nil {
		t.Fatal("a 16-byte grant key was accepted")
	}
	s.SetGrantKey(randomKey(t))
	for _, c := range []struct {
		edit func(*GrantSpec)
		word string
	}{
		{func(g *GrantSpec) { g.Owner = "" }, "owner"},
		{func(g *GrantSpec) { g.Client = "" }, "client id"},
		{func(g *GrantSpec) { g.Client = "a b" }, "client id"},
		{func(g *GrantSpec) { g.ClientName = "Claude\u202eedoC" }, "client name"},
		{func(g *GrantSpec) { g.Resource = "/mcp" }, "resource"},
		{func(g *GrantSpec) { g.Resource = "https://a.example/mcp#x" }, "resource"},
		{func(g *GrantSpec) { g.Resource = "https://u@a.example/mcp" }, "resource"},
		{func(g *GrantSpec) { g.Resource = "https://a.example/m%63p" }, "resource"},
		{func(g *GrantSpec) { g.Scopes = nil }, "scopes"},
		{func(g *GrantSpec) { g.Scopes = []string{"chat", "chat"} }, "twice"},
		{func(g *GrantSpec) { g.JKT = "abc" }, "thumbprint"},
		{func(g *GrantSpec) { g.AccessTTL = 48 * time.Hour }, "access token lives"},
		{func(g *GrantSpec) { g.GrantTTL = -time.Hour }, "positive"},
		{func(g *GrantSpec) { g.GrantTTL = 500 * 24 * time.Hour }, "a grant lives at most"},
		{func(g *GrantSpec) { g.RefreshTTL = time.Millisecond }, "at least 1s"},
	} {
		spec := base
		spec.Scopes = slices.Clone(base.Scopes)
		c.edit(&spec)
		if _, err := s.CreateGrant(context.Background(), spec, time.Now()); err == nil || !strings.Contains(err.Error(), c.word) {
			t.Errorf("%+v: err = %v, want it to say %q", spec, err, c.word)
		}
	}
}

// FuzzGrantCheck feeds Check arbitrary strings, alone and as variations of
// real credentials: it never panics, and only the exact credentials it
// issued authenticate.
func FuzzGrantCheck(f *testing.F) {
	fs := &certmagic.FileStorage{Path: f.TempDir()}
	s, err := OpenTokenStore(context.Background(), fs)
	if err != nil {
		f.Fatal(err)
	}
	s.SetGrantKey(randomKey(f))
	now := time.Now()
	iss, err := s.CreateGrant(context.Background(), GrantSpec{Owner: "alice", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}, JKT: thumb("k")}, now)
	if err != nil {
		f.Fatal(err)
	}
	op, _, err := s.Create(context.Background(), TokenSpec{Name: "op", Scopes: []string{"chat"}})
	if err != nil {
		f.Fatal(err)
	}
	issued := map[string]bool{iss.Access: true, op: true}
	for _, seed := range []string{iss.Access, iss.Refresh, op, "zda_", "zdr_", "zds_", "zda_AAAA", iss.Access + "A", iss.Access[:len(iss.Access)-2]} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		p, err := s.Check(tok, now)
		if err == nil && !issued[tok] {
			t.Fatalf("%q authenticates as %+v", tok, p)
		}
		if err == nil && strings.HasPrefix(tok, AccessPrefix) && (p.Source != "grant" || p.JKT != thumb("k")) {
			t.Fatalf("access token principal = %+v", p)
		}
		if _, err := s.RefreshGrant(context.Background(), RefreshRequest{Refresh: tok, Client: clientCC, JKT: thumb("k")}, now); err == nil && tok != iss.Refresh {
			t.Fatalf("%q redeemed as a refresh token", tok)
		}
	})
}

// BenchmarkGrantCheck measures a grant's access token check beside an
// operator token's, in one run, over a store of 100 tokens and 100 grants.
func BenchmarkGrantCheck(b *testing.B) {
	ctx := context.Background()
	fs := &certmagic.FileStorage{Path: b.TempDir()}
	s, _ := OpenTokenStore(ctx, fs)
	s.SetGrantKey(randomKey(b))
	now := time.Now()
	var op string
	var access Issued
	for i := 0; i < 100; i++ {
		sec, _, err := s.Create(ctx, TokenSpec{Name: "t" + itoa(i), Scopes: []string{"chat"}})
		if err != nil {
			b.Fatal(err)
		}
		iss, err := s.CreateGrant(ctx, GrantSpec{Owner: "u" + itoa(i), Client: clientCC, Resource: resourceA, Scopes: []string{"chat", "admin"}}, now)
		if err != nil {
			b.Fatal(err)
		}
		op, access = sec, iss
	}
	check := func(tok string) func(*testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Check(tok, now); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("zds", check(op))
	b.Run("zda", check(access.Access))
	// ratio alternates batches of both checks, so that both meet the same
	// load on the machine, and reports what a zda_ check costs in zds_
	// checks.
	b.Run("ratio", func(b *testing.B) {
		const batch = 256
		var zds, zda time.Duration
		for b.Loop() {
			for _, c := range []struct {
				tok string
				sum *time.Duration
			}{{op, &zds}, {access.Access, &zda}} {
				start := time.Now()
				for range batch {
					if _, err := s.Check(c.tok, now); err != nil {
						b.Fatal(err)
					}
				}
				*c.sum += time.Since(start)
			}
		}
		b.ReportMetric(float64(zda)/float64(max(zds, 1)), "zda/zds")
	})
}

// The Authenticator takes a grant's access token as it takes an operator's
// token, and tells a client with a refused one what to do: refresh, sign
// in again, or send the access token rather than the refresh token.
func TestAuthenticateGrant(t *testing.T) {
	ctx := context.Background()
	e := newGrantEnv(t, GrantSpec{Owner: "alice", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}, JKT: thumb("k")})
	a := Authenticator{Tokens: e.s}
	p, err := a.Authenticate(ctx, "Bearer "+e.first.Access, e.now)
	if err != nil || p.Source != "grant" || p.TokenID != e.first.GrantID || p.OwnerID() != "alice" || p.Client != clientCC ||
		p.Resource != resourceA || p.JKT != thumb("k") || p.Kind != KindUser || !slices.Equal(p.Scopes, []string{"chat"}) ||
		p.Expires == nil || !p.Expires.Equal(e.first.AccessExpires) {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}
	for _, c := range []struct {
		authz string
		at    time.Time
		word  string
	}{
		{"Bearer " + e.first.Refresh, e.now, "send the access token"},
		{"Bearer " + e.first.Access, e.first.AccessExpires, "refresh it"},
		{"Bearer " + flipAt(e.first.Access, 10), e.now, "sign in again"},
	} {
		if _, err := a.Authenticate(ctx, c.authz, c.at); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), c.word) {
			t.Errorf("%.12s…: err = %v, want invalid saying %q", c.authz, err, c.word)
		}
	}
	if _, err := e.s.Revoke(ctx, e.first.GrantID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, "Bearer "+e.first.Access, e.now); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked grant: %v", err)
	}
}

// helperEnv, when set, makes the test binary a contender of
// TestGrantRefreshOnceAcrossProcesses: the storage directory, the grant key
// and the refresh token, separated by spaces.
const helperEnv = "ZIDANE_GRANT_REFRESH_CONTENDER"

// Processes of their own (the CLI, other gateways on one file storage) do
// not share this process's lock on the token file: only the storage lock
// orders them. Three processes redeem one refresh token at once; exactly
// one gets tokens, and the others, presenting a spent token, revoke the
// grant.
func TestGrantRefreshOnceAcrossProcesses(t *testing.T) {
	if v := os.Getenv(helperEnv); v != "" {
		refreshContender(t, v)
		return
	}
	e := newGrantEnv(t, GrantSpec{})
	start := filepath.Join(t.TempDir(), "start")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var outs [2]bytes.Buffer
	var cmds [2]*exec.Cmd
	for i := range cmds {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestGrantRefreshOnceAcrossProcesses$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join([]string{e.fs.Path, hex.EncodeToString(e.key), e.first.Refresh, start}, " "))
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	if err := os.WriteFile(start, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wins := 0
	if _, err := e.refresh(e.first.Refresh, e.now); err == nil {
		wins++
	} else if !errors.Is(err, ErrGrantReused) {
		t.Fatalf("this process lost with %v, want reused", err)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("contender %d: %v\n%s", i, err, outs[i].String())
		}
		switch out := outs[i].String(); {
		case strings.Contains(out, "CONTENDER WON"):
			wins++
		case !strings.Contains(out, "CONTENDER LOST reused"):
			t.Fatalf("contender %d said:\n%s", i, out)
		}
	}
	if wins != 1 {
		t.Fatalf("%d of 3 processes redeemed one refresh token", wins)
	}
	if err := e.s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Check(e.first.Access, e.now); !errors.Is(err, ErrTokenRevoked) {
		t.Fatalf("after the reuse the grant's access token: %v, want revoked", err)
	}
}

// refreshContender is one contender process: it waits for the start file,
// redeems the refresh token and says whether it won.
func refreshContender(t *testing.T, v string) {
	parts := strings.Split(v, " ")
	if len(parts) != 4 {
		t.Fatalf("%s=%q", helperEnv, v)
	}
	s, err := OpenTokenStore(context.Background(), &certmagic.FileStorage{Path: parts[0]})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := hex.DecodeString(parts[1])
	if err := s.SetGrantKey(key); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if _, err := os.Stat(parts[3]); err == nil {
			break
		}
		if i > 10000 {
			t.Fatal("the start file never came")
		}
		time.Sleep(time.Millisecond)
	}
	_, err = s.RefreshGrant(context.Background(), RefreshRequest{Refresh: parts[2], Client: clientCC}, time.Now())
	switch {
	case err == nil:
		fmt.Println("CONTENDER WON")
	case errors.Is(err, ErrGrantReused):
		fmt.Println("CONTENDER LOST reused")
	default:
		fmt.Println("CONTENDER LOST", err)
	}
}

// TestGrantChildEndsWhenTheGrantLapses: a grant whose refresh token
// lapsed unused is over (its client can get no new access token, and
// `token list` says it lapsed); the tokens derived from it for a
// session's agent end with it then, not when a later write prunes it.
func TestGrantChildEndsWhenTheGrantLapses(t *testing.T) {
	e := newGrantEnv(t, GrantSpec{Owner: "alice", Client: clientCC, Resource: resourceA, Scopes: []string{"chat"}, RefreshTTL: time.Hour})
	grant, err := e.s.Check(e.first.Access, e.now)
	if err != nil {
		t.Fatal(err)
	}
	secret, _, err := e.s.CreateChild(context.Background(), ChildSpec{Parent: grant, Session: "ses_lapse1", Purpose: PurposeOrchestrator, Scopes: []string{"sessions:create"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Check(secret, e.now.Add(59*time.Minute)); err != nil {
		t.Fatalf("the child while its grant can still be refreshed: %v", err)
	}
	if _, err := e.refresh(e.first.Refresh, e.now.Add(61*time.Minute)); !errors.Is(err, ErrRefreshInvalid) || !strings.Contains(err.Error(), "lapsed") {
		t.Fatalf("the lapsed grant's refresh: %v", err)
	}
	_, err = e.s.Check(secret, e.now.Add(61*time.Minute))
	if !errors.Is(err, ErrTokenExpired) || !strings.Contains(err.Error(), "lapsed") {
		t.Errorf("the child of a lapsed grant: %v, want it expired, saying the grant lapsed", err)
	}
}
