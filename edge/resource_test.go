package edge

import (
	"context"
	"crypto/rand"
	"net/http"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// A grant is for one resource (RFC 8707): its access token, stolen or
// replayed by a client at another zidane_mcp site of the same gateway
// (same token store), is refused there 401 without being served, whatever
// the scopes match. A site whose resource is a path alone cannot tell
// which resource it is, and so takes no grant.
func TestGrantAtAnotherResourceIsRefused(t *testing.T) {
	s := newDPoPSite(t, false, false)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := s.a.Authn.Tokens.SetGrantKey(key); err != nil {
		t.Fatal(err)
	}
	issue := func(resource string) string {
		iss, err := s.a.Authn.Tokens.CreateGrant(context.Background(), policy.GrantSpec{Owner: "alice",
			Client: "https://client.example/metadata.json", Resource: resource, Scopes: []string{"mcp"}}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return iss.Access
	}
	here := issue(dpopResource)
	elsewhere := issue("https://other.example/mcp")
	trailing := issue(dpopResource + "/")

	s.a.Resource = dpopResource
	if p, v := s.check("Bearer " + here); !v.Allowed() || p.Resource != dpopResource {
		t.Fatalf("the grant for this resource: %+v, principal %+v", v, p)
	}
	for name, tok := range map[string]string{"another site": elsewhere, "a trailing slash": trailing} {
		p, v := s.check("Bearer " + tok)
		if v.Status != http.StatusUnauthorized || v.Reason != ReasonWrongResource || p.TokenID != "" {
			t.Errorf("a grant for %s: %+v, principal %+v; want 401 %s", name, v, p, ReasonWrongResource)
		}
	}
	s.a.Resource = ""
	if _, v := s.check("Bearer " + here); v.Status != http.StatusUnauthorized || v.Reason != ReasonWrongResource {
		t.Errorf("a grant at a site whose resource is a path alone: %+v; want 401 %s", v, ReasonWrongResource)
	}
	if p, v := s.check("Bearer " + s.opaque); !v.Allowed() || p.Source != "token" {
		t.Errorf("an operator's token, which names no resource: %+v", v)
	}
}

// The token the gateway derives for the agent of a session a grant
// created (its orchestrator or egress token) is for the grant's resource
// too: handed to an agent, which is hostile code on the host, it is taken
// where the session runs and refused at every other zidane_mcp site of the
// gateway, which the person never let the client reach. So is the token
// derived from that one (a session the agent creates).
func TestGrantChildAtAnotherResourceIsRefused(t *testing.T) {
	s := newDPoPSite(t, false, false)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	store := s.a.Authn.Tokens
	if err := store.SetGrantKey(key); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	iss, err := store.CreateGrant(ctx, policy.GrantSpec{Owner: "alice",
		Client: "https://client.example/metadata.json", Resource: dpopResource, Scopes: []string{"chat"}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	grant, err := store.Check(iss.Access, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	orch, child, err := store.CreateChild(ctx, policy.ChildSpec{Parent: grant, Session: "ses_grant1", Purpose: policy.PurposeOrchestrator, Scopes: []string{"sessions:create"}})
	if err != nil {
		t.Fatal(err)
	}
	egress, _, err := store.CreateChild(ctx, policy.ChildSpec{Parent: grant, Session: "ses_grant1", Purpose: policy.PurposeEgress, Scopes: []string{policy.UpstreamScope("github")}})
	if err != nil {
		t.Fatal(err)
	}
	worker, _, err := store.CreateChild(ctx, policy.ChildSpec{Parent: child.Principal(), Session: "ses_grant2", Purpose: policy.PurposeOrchestrator, Scopes: []string{"sessions:create"}})
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{"orchestrator": orch, "egress": egress, "a worker's orchestrator": worker}
	s.a.Resource = dpopResource
	for name, tok := range tokens {
		if p, v := s.check("Bearer " + tok); !v.Allowed() || p.Resource != dpopResource || p.Owner != "alice" {
			t.Errorf("the %s token at the grant's resource: %+v, principal %+v", name, v, p)
		}
	}
	for _, here := range []string{"https://other.example/mcp", ""} {
		s.a.Resource = here
		for name, tok := range tokens {
			if p, v := s.check("Bearer " + tok); v.Status != http.StatusUnauthorized || v.Reason != ReasonWrongResource || p.TokenID != "" {
				t.Errorf("the %s token at a site of resource %q: %+v, principal %+v; want 401 %s", name, here, v, p, ReasonWrongResource)
			}
		}
	}
}
