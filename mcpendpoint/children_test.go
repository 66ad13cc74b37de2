package mcpendpoint

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// At each launch an orchestrator's agent gets only the verbs its creator
// may still call on every sessions site of the running config: a creator
// that lost a verb, or a site that no longer grants it, drops it; a
// creator whose token was revoked gets its agent no token; a JWT subject
// holds the scopes of its latest call.
func TestOrchestratorScopesFollowTheCreatorNow(t *testing.T) {
	ctx := context.Background()
	tokens, err := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, lead, err := tokens.Create(ctx, policy.TokenSpec{Name: "lead", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	_, gone, err := tokens.Create(ctx, policy.TokenSpec{Name: "gone", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Revoke(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	chat, err := policy.NewScopeMap(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	// A second site where chat grants the sessions tool only.
	narrow, err := policy.NewScopeMap([]policy.Rule{{Scope: "chat", Tools: []string{"sessions"}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	site := func(m *policy.ScopeMap) Site { return Site{Access: Access{Scopes: m}} }
	tools := []string{"create", "read", "answer", "pending"}
	now := time.Now()
	for _, c := range []struct {
		name    string
		owner   sessions.Owner
		sites   []Site
		ok      bool
		scopes  []string
		dropped []string
	}{
		{"a token, one site", sessions.Owner{TokenID: lead.ID}, []Site{site(chat)}, true,
			[]string{"sessions:create", "sessions:read", "interactions:answer", "interactions:pending"}, nil},
		{"a site that grants less", sessions.Owner{TokenID: lead.ID}, []Site{site(chat), site(narrow)}, true,
			[]string{"sessions:create", "sessions:read"}, []string{"interactions answer", "interactions pending"}},
		{"no site", sessions.Owner{TokenID: lead.ID}, nil, true,
			nil, []string{"sessions create", "sessions read", "interactions answer", "interactions pending"}},
		{"a revoked creator", sessions.Owner{TokenID: gone.ID}, []Site{site(chat)}, false, nil, nil},
		{"a JWT subject that reads only", sessions.Owner{TokenID: "jwt:alice", ID: "jwt:alice", Scopes: []string{"read"}}, []Site{site(chat)}, true,
			[]string{"sessions:read", "interactions:pending"}, []string{"sessions create", "interactions answer"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			scopes, dropped, ok := OrchestratorScopes(tokens, c.sites, c.owner, tools, now)
			if ok != c.ok || !slices.Equal(scopes, c.scopes) || !slices.Equal(dropped, c.dropped) {
				t.Fatalf("%v %v %v, want %v %v %v", scopes, dropped, ok, c.scopes, c.dropped, c.ok)
			}
		})
	}
}
