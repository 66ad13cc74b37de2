package policy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func orchestratorSpec(parent Principal, session string, scopes ...string) ChildSpec {
	return ChildSpec{Parent: parent, Session: session, Purpose: PurposeOrchestrator, Scopes: scopes}
}

func mustChild(t *testing.T, s *TokenStore, spec ChildSpec) (string, Token) {
	t.Helper()
	secret, tok, err := s.CreateChild(context.Background(), spec)
	if err != nil {
		t.Fatalf("CreateChild %+v: %v", spec, err)
	}
	return secret, tok
}

// The attack of the issue: an orchestrator given only create made a worker
// with every verb. Each row is a parent and the scopes a child asks for.
func TestChildScopesOnlyNarrowTheParents(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	_, chat, _ := s.Create(ctx, TokenSpec{Name: "human", Scopes: []string{"chat"}})
	_, narrow := mustChild(t, s, orchestratorSpec(chat.Principal(), "ses_orch", "sessions:create"))
	for _, tc := range []struct {
		name    string
		spec    ChildSpec
		refused string // "" when allowed
	}{
		{"a chat parent grants any verb", orchestratorSpec(chat.Principal(), "ses_a", "sessions:create", "sessions:cancel", "interactions:answer"), ""},
		{"a create-only parent grants create", orchestratorSpec(narrow.Principal(), "ses_b", "sessions:create"), ""},
		{"a create-only parent does not grant cancel", orchestratorSpec(narrow.Principal(), "ses_c", "sessions:create", "sessions:cancel"), "can only narrow"},
		{"no child reaches other owners' sessions", orchestratorSpec(chat.Principal(), "ses_d", "sessions:any"), "not a verb"},
		{"an orchestrator token holds verbs only", orchestratorSpec(chat.Principal(), "ses_e", "mcp"), "not a verb"},
		{"an egress token holds upstreams only", ChildSpec{Parent: chat.Principal(), Session: "ses_f", Purpose: PurposeEgress, Scopes: []string{"sessions:create"}}, "not an upstream scope"},
		{"an unknown purpose", ChildSpec{Parent: chat.Principal(), Session: "ses_g", Purpose: "admin", Scopes: []string{"chat"}}, "unknown purpose"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, tok, err := s.CreateChild(ctx, tc.spec)
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if !slices.Equal(tok.Scopes, tc.spec.Scopes) {
					t.Fatalf("scopes = %v", tok.Scopes)
				}
				return
			}
			if !errors.Is(err, ErrNoChild) || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("err = %v, want ErrNoChild saying %q", err, tc.refused)
			}
		})
	}
}

func TestChildInheritsOwnerAndExpiresWithItsParent(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	_, laptop, err := s.Create(ctx, TokenSpec{Name: "laptop", Scopes: []string{"chat"}, Owner: "alice", Expires: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	secret, child := mustChild(t, s, orchestratorSpec(laptop.Principal(), "ses_1", "sessions:list"))
	_, grandchild := mustChild(t, s, ChildSpec{Parent: child.Principal(), Session: "ses_2", Purpose: PurposeEgress, Scopes: []string{"upstream:github"}})
	for _, tok := range []Token{child, grandchild} {
		if tok.Owner != "alice" || tok.Expires == nil || !tok.Expires.Equal(*laptop.Expires) {
			t.Errorf("%s: owner %q, expires %v; want alice and the parent's %v", tok.Name, tok.Owner, tok.Expires, laptop.Expires)
		}
	}
	if grandchild.Kind != KindMachine || child.Kind != KindUser {
		t.Errorf("kinds: orchestrator %s, egress %s", child.Kind, grandchild.Kind)
	}
	p, err := s.Check(secret, time.Now())
	if err != nil || p.OwnerID() != "alice" || p.Parent != laptop.ID || p.Expires == nil {
		t.Fatalf("child principal = %+v, %v", p, err)
	}
	if _, err := s.Check(secret, laptop.Expires.Add(time.Second)); !errors.Is(err, ErrTokenExpired) {
		t.Fatalf("child after its parent's expiry: %v", err)
	}
	// A token without --owner is its own owner.
	_, solo, _ := s.Create(ctx, TokenSpec{Name: "solo", Scopes: []string{"chat"}})
	if solo.Principal().OwnerID() != solo.ID {
		t.Fatalf("owner of a token without one = %q", solo.Principal().OwnerID())
	}
	if _, _, err := s.Create(ctx, TokenSpec{Name: "bad", Scopes: []string{"chat"}, Owner: "has space"}); err == nil || !strings.Contains(err.Error(), "owner") {
		t.Fatalf("owner with a space: %v", err)
	}
}

// Check walks the parents: a child is refused once any of them is revoked,
// expired or gone, whatever its own record says.
func TestChildRefusedWhenAParentIsNoLongerActive(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(parent *Token)
		want   error
		says   string
	}{
		{"revoked", func(p *Token) { now := time.Now(); p.Revoked = &now }, ErrTokenRevoked, "revoked"},
		{"expired", func(p *Token) { past := time.Now().Add(-time.Minute); p.Expires = &past }, ErrTokenExpired, "expired"},
		{"gone", func(p *Token) { p.ID = "tok_elsewhere" }, ErrTokenRevoked, "no longer exists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, s := newFileStore(t)
			_, human, _ := s.Create(ctx, TokenSpec{Name: "human", Scopes: []string{"chat"}})
			_, orch := mustChild(t, s, orchestratorSpec(human.Principal(), "ses_1", "sessions:create"))
			worker, _ := mustChild(t, s, orchestratorSpec(orch.Principal(), "ses_2", "sessions:create"))
			// Changed behind the store's back, as a file edited by hand
			// or another version would leave it: only the chain walk
			// can tell.
			err := s.update(ctx, func(f *tokenFile) error {
				for _, tok := range f.Tokens {
					if tok.ID == human.ID {
						tc.change(tok)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Check(worker, time.Now())
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("grandchild of a %s token: %v", tc.name, err)
			}
		})
	}
}

// A relaunch renews the session's one token: the old secret stops working,
// nothing is added, and what was derived from it stays attached.
func TestRelaunchRotatesTheTokenNeverAddsOne(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	_, human, _ := s.Create(ctx, TokenSpec{Name: "human", Scopes: []string{"chat"}})
	first, orch := mustChild(t, s, orchestratorSpec(human.Principal(), "ses_orch", "sessions:create"))
	workerEgress, _ := mustChild(t, s, ChildSpec{Parent: orch.Principal(), Session: "ses_worker", Purpose: PurposeEgress, Scopes: []string{"upstream:github"}})
	var events []string
	var mu sync.Mutex
	s.OnEvent(func(ev TokenEvent) { mu.Lock(); events = append(events, ev.Action); mu.Unlock() })
	latest := first
	for range 100 {
		secret, again := mustChild(t, s, orchestratorSpec(human.Principal(), "ses_orch", "sessions:create"))
		mustChild(t, s, ChildSpec{Parent: human.Principal(), Session: "ses_orch", Purpose: PurposeEgress, Scopes: []string{"upstream:github"}})
		if again.ID != orch.ID || again.Name != "orchestrator-ses_orch" {
			t.Fatalf("relaunch made %s %q, want the record %s again", again.ID, again.Name, orch.ID)
		}
		latest = secret
	}
	if n := len(s.List()); n != 4 {
		t.Fatalf("after 100 relaunches the store holds %d tokens, want 4 (human, the orchestrator's, its egress, the worker's egress)", n)
	}
	if _, err := s.Check(first, time.Now()); !errors.Is(err, ErrTokenUnknown) {
		t.Fatalf("the first launch's secret after a relaunch: %v", err)
	}
	if _, err := s.Check(latest, time.Now()); err != nil {
		t.Fatalf("the latest secret: %v", err)
	}
	if _, err := s.Check(workerEgress, time.Now()); err != nil {
		t.Fatalf("a worker's token after its orchestrator relaunched: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The egress token was first made at the first of these launches.
	if len(events) != 200 || events[1] != "created" || slices.ContainsFunc(append(events[:1:1], events[2:]...), func(a string) bool { return a != "rotated" }) {
		t.Fatalf("audit events of the relaunches: %d, %v…", len(events), events[:min(3, len(events))])
	}
}

func TestSessionEndDeletesItsTokensAndTheirDescendants(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	_, human, _ := s.Create(ctx, TokenSpec{Name: "human", Scopes: []string{"chat"}})
	orchSecret, orch := mustChild(t, s, orchestratorSpec(human.Principal(), "ses_orch", "sessions:create"))
	workerSecret, _ := mustChild(t, s, ChildSpec{Parent: orch.Principal(), Session: "ses_worker", Purpose: PurposeEgress, Scopes: []string{"upstream:github"}})
	var fired []string
	s.OnRevoke(func(tok Token) { fired = append(fired, tok.Name) })

	gone, err := s.DeleteSession(ctx, "ses_orch")
	if err != nil || len(gone) != 2 {
		t.Fatalf("DeleteSession: %v, %+v", err, gone)
	}
	for _, secret := range []string{orchSecret, workerSecret} {
		if _, err := s.Check(secret, time.Now()); !errors.Is(err, ErrTokenUnknown) {
			t.Fatalf("a token of an ended session: %v", err)
		}
	}
	if n := len(s.List()); n != 1 {
		t.Fatalf("%d tokens left, want the human's", n)
	}
	slices.Sort(fired)
	if !slices.Equal(fired, []string{"egress-ses_worker", "orchestrator-ses_orch"}) {
		t.Fatalf("revoke hooks ran for %v", fired)
	}
	if gone, err := s.DeleteSession(ctx, "ses_none"); err != nil || gone != nil {
		t.Fatalf("a session without tokens: %v %v", gone, err)
	}
}

func TestRevokeSessionIsNotUndoneByARelaunch(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	_, human, _ := s.Create(ctx, TokenSpec{Name: "human", Scopes: []string{"chat"}})
	secret, _ := mustChild(t, s, orchestratorSpec(human.Principal(), "ses_1", "sessions:create"))
	r, err := s.RevokeSession(ctx, "ses_1")
	if err != nil || len(r.Tokens) != 1 || r.Tokens[0].SHA256 != "" {
		t.Fatalf("RevokeSession: %+v %v", r, err)
	}
	if _, err := s.Check(secret, time.Now()); !errors.Is(err, ErrTokenRevoked) {
		t.Fatalf("revoked session token: %v", err)
	}
	if _, _, err := s.CreateChild(ctx, orchestratorSpec(human.Principal(), "ses_1", "sessions:create")); !errors.Is(err, ErrNoChild) || !strings.Contains(err.Error(), "not renewed") {
		t.Fatalf("relaunch after RevokeSession: %v", err)
	}
	if _, err := s.RevokeSession(ctx, "ses_other"); !errors.Is(err, ErrTokenNotFound) {
		t.Fatalf("a session without tokens: %v", err)
	}
	// The parent's revocation: no renewal either.
	_, other, _ := s.Create(ctx, TokenSpec{Name: "other", Scopes: []string{"chat"}})
	s.Revoke(ctx, "other")
	if _, _, err := s.CreateChild(ctx, orchestratorSpec(other.Principal(), "ses_2", "sessions:create")); !errors.Is(err, ErrNoChild) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("child of a revoked token: %v", err)
	}
}

// fixedVerifier is a JWT verifier that returns p for any token.
type fixedVerifier struct{ p *Principal }

func (v fixedVerifier) Verify(context.Context, string) (Principal, error) { return *v.p, nil }

func TestRevokingAJWTSubject(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	issued := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	alice := Principal{TokenID: "jwt:alice", Name: "alice", Kind: KindUser, Scopes: []string{"chat"}, Source: "jwt", Owner: "jwt:alice", Expires: &exp, Issued: &issued}
	secret, child := mustChild(t, s, orchestratorSpec(alice, "ses_1", "sessions:create"))
	if child.Parent != "jwt:alice" || child.Owner != "jwt:alice" || child.Expires == nil || !child.Expires.Equal(exp) {
		t.Fatalf("child of a JWT = %+v, want parent and owner jwt:alice, expiring with the JWT", child)
	}
	// A JWT that expired gets no child.
	past := time.Now().Add(-time.Second)
	late := alice
	late.Expires = &past
	if _, _, err := s.CreateChild(ctx, orchestratorSpec(late, "ses_2", "sessions:create")); !errors.Is(err, ErrNoChild) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("child of an expired JWT: %v", err)
	}

	var fired []string
	s.OnRevoke(func(tok Token) { fired = append(fired, tok.ID) })
	r, err := s.RevokeSubject(ctx, "jwt:alice")
	if err != nil || len(r.Tokens) != 1 || r.Tokens[0].ID != child.ID {
		t.Fatalf("RevokeSubject: %+v %v", r, err)
	}
	if _, err := s.Check(secret, time.Now()); !errors.Is(err, ErrTokenUnknown) {
		t.Fatalf("child after its subject's revocation: %v", err)
	}
	if !slices.Contains(fired, "jwt:alice") || !slices.Contains(fired, child.ID) {
		t.Fatalf("revoke hooks ran for %v, want the subject (its sessions and streams) and its child", fired)
	}
	if _, _, err := s.CreateChild(ctx, orchestratorSpec(alice, "ses_1", "sessions:create")); !errors.Is(err, ErrNoChild) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a relaunch with the JWT issued before the revocation: %v", err)
	}

	// The subject's JWTs issued until the revocation are refused; a fresh
	// one is not.
	a := Authenticator{Tokens: s, JWT: fixedVerifier{&alice}}
	const jwtLike = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln"
	if _, err := a.Authenticate(ctx, "Bearer "+jwtLike, time.Now()); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "sign in again") {
		t.Fatalf("a JWT issued before its subject's revocation: %v", err)
	}
	at, _ := s.SubjectRevoked("jwt:alice")
	fresh := at.Add(time.Second)
	alice.Issued = &fresh
	if _, err := a.Authenticate(ctx, "Bearer "+jwtLike, time.Now()); err != nil {
		t.Fatalf("a JWT issued after: %v", err)
	}
	if _, _, err := s.CreateChild(ctx, orchestratorSpec(alice, "ses_1", "sessions:create")); err != nil {
		t.Fatalf("a relaunch after the owner's call with a fresh JWT: %v", err)
	}
	if _, err := s.RevokeSubject(ctx, "alice"); err == nil {
		t.Fatal("a subject without jwt: was accepted")
	}
}

// Another process (the CLI, offline) revokes a subject: the running
// store's next sync refuses the subject's JWTs and runs the hooks.
func TestSubjectRevocationReachesOtherProcesses(t *testing.T) {
	ctx := context.Background()
	fs, s := newFileStore(t)
	offline, err := OpenTokenStore(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	var fired []string
	s.OnRevoke(func(tok Token) { fired = append(fired, tok.ID) })
	if _, err := offline.RevokeSubject(ctx, "jwt:bob"); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.SubjectRevoked("jwt:bob"); !ok || !slices.Equal(fired, []string{"jwt:bob"}) {
		t.Fatalf("after sync: revoked %v, hooks %v", ok, fired)
	}
	// Reopening the file runs no hook: nothing changed.
	again, err := OpenTokenStore(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := again.SubjectRevoked("jwt:bob"); !ok {
		t.Fatal("the revocation did not survive a reopen")
	}
}

func TestPruneDerivedKeepsOnlyLiveSessions(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	_, human, _ := s.Create(ctx, TokenSpec{Name: "human", Scopes: []string{"chat"}})
	liveSecret, _ := mustChild(t, s, orchestratorSpec(human.Principal(), "ses_live", "sessions:create"))
	mustChild(t, s, orchestratorSpec(human.Principal(), "ses_dead", "sessions:create"))
	// A child from before tokens recorded their session.
	s.update(ctx, func(f *tokenFile) error {
		f.Tokens = append(f.Tokens, &Token{ID: "tok_legacy", Name: "orchestrator-ses_x-123", SHA256: HashSecret("zds_legacy"), Scopes: []string{"sessions:read"}, Kind: KindUser, Parent: human.ID, Created: time.Now()})
		return nil
	})
	gone, err := s.PruneDerived(ctx, func(id string) bool { return id == "ses_live" })
	if err != nil || len(gone) != 2 {
		t.Fatalf("PruneDerived: %v %+v", err, gone)
	}
	if _, err := s.Check(liveSecret, time.Now()); err != nil {
		t.Fatalf("a live session's token: %v", err)
	}
	if n := len(s.List()); n != 2 {
		t.Fatalf("%d tokens left, want the human's and the live session's", n)
	}
}

func TestScopesForOtherOwners(t *testing.T) {
	m, err := NewScopeMap(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	anyOnly := Principal{Kind: KindUser, Scopes: []string{AnyOwnerScope("sessions")}}
	if m.GrantsVerb(anyOnly, "sessions", AnyOwner) || m.GrantsVerb(anyOnly, "sessions", "cancel") || m.ToolVisible(anyOnly, "sessions") {
		t.Fatal("sessions:any granted a call by itself")
	}
	narrow := Principal{Kind: KindUser, Scopes: []string{"sessions:create"}}
	if !m.GrantsVerb(narrow, "sessions", "create") || m.GrantsVerb(narrow, "sessions", "cancel") {
		t.Fatal("GrantsVerb of a create-only token")
	}
	chat := Principal{Kind: KindUser, Scopes: []string{"chat"}}
	if !m.GrantsVerb(chat, "interactions", "answer") {
		t.Fatal("chat does not grant answer")
	}
}

// A derived token's principal names the top of its chain as the credential
// whose quotas it counts against: the first token without a parent, or the
// JWT subject the chain was minted from. Others count against themselves.
func TestDerivedPrincipalsCountAgainstTheirChainsTop(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	topSecret, top, err := s.Create(ctx, TokenSpec{Name: "laptop", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	childSecret, child := mustChild(t, s, orchestratorSpec(top.Principal(), "ses_1", "sessions:create"))
	grandSecret, _ := mustChild(t, s, orchestratorSpec(child.Principal(), "ses_2", "sessions:create"))
	now := time.Now()
	for _, c := range []struct{ name, secret string }{{"the token", topSecret}, {"its child", childSecret}, {"its grandchild", grandSecret}} {
		p, err := s.Check(c.secret, now)
		if err != nil {
			t.Fatal(err)
		}
		if p.QuotaID() != top.ID {
			t.Errorf("%s counts against %q, want the chain's top %q", c.name, p.QuotaID(), top.ID)
		}
	}
	exp := now.Add(time.Hour)
	jwt := Principal{TokenID: JWTPrefix + "alice", Name: "alice", Kind: KindUser, Scopes: []string{"chat"}, Source: "jwt", Expires: &exp}
	jwtChild, _ := mustChild(t, s, orchestratorSpec(jwt, "ses_3", "sessions:create"))
	if p, err := s.Check(jwtChild, now); err != nil || p.QuotaID() != JWTPrefix+"alice" {
		t.Errorf("a JWT's child counts against %q (%v), want jwt:alice", p.QuotaID(), err)
	}
}
