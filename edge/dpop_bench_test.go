package edge

import (
	"context"
	"crypto/rand"
	"net/http"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// BenchmarkAuthenticateDPoP is step 2 of one request in the same run:
// today's opaque zds_ token, a grant's zda_ access token and an ES256 JWT
// as Bearer, and the same grant and JWT bound to an ES256 DPoP key with a
// fresh proof each (nonce and replay check on, one node). The DPoP rows
// over their Bearer rows are what a proof costs per request.
func BenchmarkAuthenticateDPoP(b *testing.B) {
	s := newDPoPSite(b, false, true)
	c := newDPoPClient(b)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := s.a.Authn.Tokens.SetGrantKey(key); err != nil {
		b.Fatal(err)
	}
	grant := func(jkt string) string {
		iss, err := s.a.Authn.Tokens.CreateGrant(context.Background(), policy.GrantSpec{Owner: "alice", Client: "https://client.example/metadata.json",
			Resource: dpopResource, Scopes: []string{"mcp"}, JKT: jkt, AccessTTL: time.Hour}, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		return iss.Access
	}
	nonce := s.a.DPoP.Verifier.Nonces.Issue(time.Now())
	bearer := func(authz string) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, v := s.check(authz); !v.Allowed() {
					b.Fatal(v)
				}
			}
		}
	}
	bound := func(tok string) func(b *testing.B) {
		return func(b *testing.B) {
			// A fresh proof per request, signed before the clock runs.
			proofs := make([]string, 1024)
			for i := range proofs {
				proofs[i] = c.proofFor(b, http.MethodPost, dpopResource, tok, nonce)
			}
			s.a.DPoP.Verifier.Replay = dpop.NewLocal(1<<20, 0)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i == len(proofs) {
					b.StopTimer()
					s.a.DPoP.Verifier.Replay = dpop.NewLocal(1<<20, 0)
					i = 0
					b.StartTimer()
				}
				if _, v := s.check("DPoP "+tok, proofs[i]); !v.Allowed() {
					b.Fatal(v)
				}
				i++
			}
		}
	}
	b.Run("bearer/zds", bearer("Bearer "+s.opaque))
	b.Run("bearer/zda", bearer("Bearer "+grant("")))
	b.Run("dpop/zda", bound(grant(c.jkt)))
	b.Run("bearer/jwt", bearer("Bearer "+s.issuer.token(b, "alice", "mcp")))
	b.Run("dpop/jwt", bound(s.issuer.boundToken(b, "alice", "mcp", c.jkt)))
}
