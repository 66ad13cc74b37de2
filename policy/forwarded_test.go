package policy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// A request another replica forwarded acts for the identity it names, with
// what this replica's store or its own check of the JWT grants: a claim of
// more is refused, a token that is no longer good is refused, and nothing
// but the identity and an upper bound on the scopes is taken from the
// claim. Each row is what a holder of the cluster key could send.
func TestForwardedTakesIdentityNotAuthority(t *testing.T) {
	ctx := context.Background()
	fs, s := newFileStore(t)
	_, alice, err := s.Create(ctx, TokenSpec{Name: "alice", Scopes: []string{"chat", "mcp"}, Owner: "alice-person", Roots: []string{"/srv/alice"}})
	if err != nil {
		t.Fatal(err)
	}
	_, short, _ := s.Create(ctx, TokenSpec{Name: "short", Scopes: []string{"chat"}, Expires: time.Hour})
	_, gone, _ := s.Create(ctx, TokenSpec{Name: "gone", Scopes: []string{"chat"}})
	_, parent, _ := s.Create(ctx, TokenSpec{Name: "parent", Scopes: []string{"chat"}})
	_, child := mustChild(t, s, orchestratorSpec(parent.Principal(), "ses_1", "sessions:create"))
	if _, err := s.Revoke(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	// Another replica on the same storage creates a token this one has
	// not loaded yet.
	other, err := OpenTokenStore(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	_, fresh, _ := other.Create(ctx, TokenSpec{Name: "fresh", Scopes: []string{"chat"}})

	key := ecKey(t, "k1")
	a := Authenticator{Tokens: s, JWT: newVerifier(t, JWTConfig{PublicKeyPEM: key.pem(t), Algorithms: []string{"ES256"}})}
	userJWT := key.sign(t, claims(nil)) // jwt:user-1, mcp:read mcp:write
	now := time.Now()

	for _, tc := range []struct {
		name    string
		id      string
		claimed []string
		jwt     string
		at      time.Time
		scopes  []string // the principal's, when taken
		refused error    // else
		says    string
	}{
		{"a token with its own scopes", alice.ID, []string{"chat", "mcp"}, "", now, []string{"chat", "mcp"}, nil, ""},
		{"a token narrowed to what the sender claims", alice.ID, []string{"mcp"}, "", now, []string{"mcp"}, nil, ""},
		{"a token claiming sessions:any", alice.ID, []string{"chat", "sessions:any"}, "", now, nil, ErrScopesClaimed, "sessions:any"},
		{"a token claiming admin", alice.ID, []string{"admin"}, "", now, nil, ErrScopesClaimed, "admin"},
		{"a revoked token", gone.ID, []string{"chat"}, "", now, nil, ErrTokenInvalid, "revoked"},
		{"an expired token", short.ID, []string{"chat"}, "", now.Add(2 * time.Hour), nil, ErrTokenInvalid, "expired"},
		{"an unknown token", "tok_00000000deadbeef", []string{"chat"}, "", now, nil, ErrTokenInvalid, "no token has id"},
		{"a token created on another replica a moment ago", fresh.ID, []string{"chat"}, "", now, []string{"chat"}, nil, ""},
		{"a child of a good parent", child.ID, []string{"sessions:create"}, "", now, []string{"sessions:create"}, nil, ""},
		{"a token carrying a credential", alice.ID, []string{"chat"}, userJWT, now, nil, ErrTokenInvalid, "only for a JWT subject"},
		{"a JWT subject with its JWT", "jwt:user-1", []string{"mcp:read", "mcp:write"}, userJWT, now, []string{"mcp:read", "mcp:write"}, nil, ""},
		{"a JWT subject narrowed", "jwt:user-1", []string{"mcp:read"}, userJWT, now, []string{"mcp:read"}, nil, ""},
		{"a JWT subject claiming more than its JWT", "jwt:user-1", []string{"mcp:read", "admin"}, userJWT, now, nil, ErrScopesClaimed, "admin"},
		{"a JWT subject without its JWT", "jwt:user-1", []string{"mcp:read"}, "", now, nil, ErrTokenInvalid, "without carrying the access token"},
		{"a JWT subject with another's JWT", "jwt:user-2", []string{"mcp:read"}, userJWT, now, nil, ErrTokenInvalid, "user-1"},
		{"a JWT subject with an opaque token for JWT", "jwt:user-1", []string{"mcp:read"}, "zds_notajwt", now, nil, ErrTokenInvalid, "without carrying the access token"},
		{"a JWT subject with an expired JWT", "jwt:user-1", []string{"mcp:read"}, key.sign(t, claims(func(c jwt.MapClaims) {
			c["iat"], c["exp"] = now.Add(-2*time.Hour).Unix(), now.Add(-time.Hour).Unix()
		})), now, nil, ErrTokenInvalid, "expired"},
		{"a JWT subject with a JWT signed by another key", "jwt:user-1", []string{"mcp:read"}, ecKey(t, "k1").sign(t, claims(nil)), now, nil, ErrTokenInvalid, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := a.Forwarded(ctx, tc.id, tc.claimed, tc.jwt, tc.at)
			if tc.refused != nil {
				if !errors.Is(err, tc.refused) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("%+v, %v; want a refusal wrapping %q saying %q", p, err, tc.refused, tc.says)
				}
				return
			}
			if err != nil || p.TokenID != tc.id || !slices.Equal(p.Scopes, tc.scopes) {
				t.Fatalf("%+v, %v; want %s with scopes %v", p, err, tc.id, tc.scopes)
			}
		})
	}

	// Everything but the identity and the scopes is this replica's.
	p, err := a.Forwarded(ctx, alice.ID, []string{"chat"}, "", now)
	if err != nil || p.Owner != "alice-person" || !slices.Equal(p.Roots, []string{"/srv/alice"}) || p.Name != "alice" || p.Kind != KindUser || p.Source != "token" {
		t.Fatalf("alice forwarded: %+v %v", p, err)
	}
	p, err = a.Forwarded(ctx, child.ID, []string{"sessions:create"}, "", now)
	if err != nil || p.Parent != parent.ID || p.QuotaID() != parent.ID || p.OwnerID() != parent.ID {
		t.Fatalf("a child forwarded: %+v %v; want its parent, quota and owner from the store", p, err)
	}
	// The parent revoked: the child goes with it.
	if _, err := s.Revoke(ctx, "parent"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Forwarded(ctx, child.ID, []string{"sessions:create"}, "", now); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a child of a revoked parent: %v, want refused as revoked", err)
	}
	// The operator revokes the JWT subject: its JWTs issued until then are
	// refused on the hop as at the edge.
	if _, err := s.RevokeSubject(ctx, "jwt:user-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Forwarded(ctx, "jwt:user-1", []string{"mcp:read"}, userJWT, now); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a revoked subject's JWT: %v", err)
	}
	// A replica that takes no JWTs takes no JWT subject.
	if _, err := (Authenticator{Tokens: s}).Forwarded(ctx, "jwt:user-2", []string{"mcp:read"}, key.sign(t, claims(func(c jwt.MapClaims) { c["sub"] = "user-2" })), now); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "takes no JWTs") {
		t.Fatalf("a JWT subject on a replica without jwt: %v", err)
	}
}

// BearerJWT forwards only a JWT, never an opaque token.
func TestBearerJWT(t *testing.T) {
	jwtLike := ecKey(t, "k").sign(t, claims(nil))
	for authz, want := range map[string]string{
		"Bearer " + jwtLike:          jwtLike,
		"bearer  " + jwtLike:         jwtLike,
		"Bearer " + NewTokenSecret(): "",
		"Basic " + jwtLike:           "",
		"":                           "",
		jwtLike:                      "",
	} {
		if got := BearerJWT(authz); got != want {
			t.Errorf("BearerJWT(%.20q…) = %.20q…, want %.20q…", authz, got, want)
		}
	}
}
