package policy

import (
	"testing"
)

// Each access token a grant is given is a token of its own, even when two
// are minted in the same second with the same scopes: a client that
// refreshes can tell its new token from the old one, and a token seen in
// one place (a log, a proxy) is not every token of the grant that second.
func TestAccessTokensAreEachTheirOwn(t *testing.T) {
	e := newGrantEnv(t, GrantSpec{})
	next, err := e.refresh(e.first.Refresh, e.now)
	if err != nil {
		t.Fatal(err)
	}
	if next.Access == e.first.Access {
		t.Fatalf("the refresh in the same second gave the same access token %q", next.Access)
	}
	for _, tok := range []string{e.first.Access, next.Access} {
		if p, err := e.s.Check(tok, e.now); err != nil || p.TokenID != e.first.GrantID {
			t.Errorf("access token of the grant: %+v, %v", p, err)
		}
	}
}
