package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TestJWTChildrenCanBeRevoked: the issue found that the tokens derived for
// a JWT principal's sessions could not be revoked at all. They are listed
// under the JWT subject, expire with the JWT, are revoked by session, and
// `token revoke jwt:<sub>` deletes them and refuses the subject's access
// tokens issued until then, while a fresh one is accepted.
func TestJWTChildrenCanBeRevoked(t *testing.T) {
	p := startIDP(t)
	port := freePort(t)
	resource := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
		resource %s
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
		# The test polls with refused JWTs, which count against the address.
		rate_limit {
			per_token 500/s 1000
			per_ip 50/s 100
		}
	}
}
`, AdminPlaceholder, port, resource, p.issuer, p.jwksURL))
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	aliceJWT := func() string {
		return p.token(t, jwt.MapClaims{"iss": p.issuer, "aud": resource, "sub": "alice", "scope": "chat",
			"iat": time.Now().Unix(), "exp": exp.Unix()})
	}
	old := aliceJWT()
	a := connectGoSessions(t, resource, old, "alice (jwt)")
	dir := t.TempDir()
	call := func(args string) string { return "mcp: call zidane sessions " + args }

	orch := createSession(t, a, dir, "mcp", "tools", []string{"list"}).SessionID
	if v := settleIn(t, a, orch, "idle"); !strings.Contains(v.LastMessage, "zidane") {
		t.Fatalf("the orchestrator was not given the endpoint: %+v", v)
	}
	second := createSession(t, a, dir, "ready", "tools", []string{"list"}).SessionID
	settleIn(t, a, second, "idle")

	t.Run("listed under the subject, expiring with the JWT", func(t *testing.T) {
		mine := sessionTokens(tokenList(t, c), orch)
		if len(mine) != 1 || mine[0].Parent != "jwt:alice" || mine[0].Owner != "jwt:alice" || mine[0].Expires == nil || !mine[0].Expires.Equal(exp) {
			t.Fatalf("the orchestrator's tokens: %+v, want one under jwt:alice expiring at the JWT's exp %v", mine, exp)
		}
		out, _, err := c.Run(t, "zidane", "token", "list")
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(out, "jwt:alice")
		j := strings.Index(out, "  orchestrator-"+orch)
		if i < 0 || j < i {
			t.Fatalf("the orchestrator's token is not listed under the subject:\n%s", out)
		}
	})

	t.Run("revoked by session", func(t *testing.T) {
		out, stderr, err := c.Run(t, "zidane", "token", "revoke", "--session", second)
		if err != nil || !strings.Contains(out, "Revoked 1 token(s) of session "+second) {
			t.Fatalf("revoke --session: %v\n%s%s", err, out, stderr)
		}
		if got := agentAnswer(t, a, second, call(`{"verb":"list"}`)); !strings.Contains(got, "failed") || strings.Contains(got, "Result of") {
			t.Fatalf("an orchestrator whose token was revoked called the endpoint: %s", got)
		}
		if got := agentAnswer(t, a, orch, call(`{"verb":"list"}`)); !strings.Contains(got, "Result of sessions on zidane") {
			t.Fatalf("the other orchestrator lost its token too: %s", got)
		}
		if _, stderr, err := c.Run(t, "zidane", "token", "revoke", "--session", "ses_nosuchsession00"); err == nil || !strings.Contains(stderr, "minted none for it") {
			t.Fatalf("revoke --session of a session without tokens: %v\n%s", err, stderr)
		}
	})

	t.Run("revoked with the subject", func(t *testing.T) {
		out, stderr, err := c.Run(t, "zidane", "token", "revoke", "jwt:alice")
		if err != nil || !strings.Contains(out, `Revoked JWT subject "alice"`) || !strings.Contains(out, "2 token(s) derived from it were deleted") {
			t.Fatalf("revoke jwt:alice: %v\n%s%s", err, out, stderr)
		}
		if n := len(sessionTokens(tokenList(t, c), orch)) + len(sessionTokens(tokenList(t, c), second)); n != 0 {
			t.Fatalf("%d tokens of alice's sessions left", n)
		}
		r := post(t, resource, old, initializeBody)
		if r.status != http.StatusUnauthorized || !strings.Contains(r.rpc.Error.Message, "sign in again") {
			t.Fatalf("alice's JWT issued before the revocation: %d %s", r.status, r.body)
		}
		// An access token issued after it is accepted (the identity
		// provider decides whether alice gets one): poll until the second
		// of the revocation has passed.
		var fresh string
		deadline := time.Now().Add(10 * time.Second)
		for {
			fresh = aliceJWT()
			if r := post(t, resource, fresh, initializeBody); r.status == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("a JWT issued after the revocation is still refused")
			}
			time.Sleep(100 * time.Millisecond)
		}
		f := connectGoSessions(t, resource, fresh, "alice (fresh jwt)")
		// Her sessions are still hers; the orchestrator's agent holds a
		// token that is gone.
		if got := agentAnswer(t, f, orch, call(`{"verb":"list"}`)); !strings.Contains(got, "failed") || strings.Contains(got, "Result of") {
			t.Fatalf("an orchestrator of a revoked subject called the endpoint: %s", got)
		}
	})
}
