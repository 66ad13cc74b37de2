package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/mcpendpoint"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// agentState is a sessionsState with what the MCPServers hook uses: the
// endpoint's address, one upstream offered to sessions, and sessions that
// all live.
func agentState(alive func(string) bool) *sessionsState {
	st := &sessionsState{endpointPath: "/mcp", egress: map[string]*egressRoute{"github": nil}, alive: alive}
	m, err := policy.NewScopeMap(nil, true)
	if err != nil {
		panic(err)
	}
	st.sites.Store(sitesOf(m))
	return st
}

// sitesOf is one sessions site with the scope map m.
func sitesOf(m *policy.ScopeMap) *[]mcpendpoint.Site {
	return &[]mcpendpoint.Site{{Access: mcpendpoint.Access{Scopes: m}}}
}

func bearerOf(t *testing.T, s sessions.McpServer) string {
	t.Helper()
	secret, ok := strings.CutPrefix(s.Headers["Authorization"], "Bearer ")
	if !ok {
		t.Fatalf("server %s has no bearer token: %v", s.Name, s.Headers)
	}
	return secret
}

// The issue counted 75 of 90 tokens left over by one run: every launch of
// an agent minted two more. A hundred relaunches of an orchestrator with
// upstreams leave its two tokens, each with the latest launch's secret.
func TestRelaunchesKeepTheTokenCountBounded(t *testing.T) {
	ctx := context.Background()
	tokens, err := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, human, err := tokens.Create(ctx, policy.TokenSpec{Name: "human", Scopes: []string{"chat"}, Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	st := agentState(func(string) bool { return true })
	info := sessions.SessionInfo{SessionID: "ses_orchestrator", Tools: []string{"create", "read"}, Base: "http://127.0.0.1:9",
		Owner: sessions.Owner{TokenID: human.ID, TokenName: human.Name, ID: "alice"}}
	log := slog.New(slog.DiscardHandler)
	var old []string
	var latest []string
	for range 100 {
		servers := append(st.orchestratorServers(tokens, info, log), st.egressServers(tokens, info, log)...)
		if len(servers) != 2 {
			t.Fatalf("servers = %+v", servers)
		}
		old = append(old, latest...)
		latest = []string{bearerOf(t, servers[0]), bearerOf(t, servers[1])}
	}
	list := tokens.List()
	if len(list) != 3 {
		t.Fatalf("after 100 launches the store holds %d tokens, want 3 (the human's, the orchestrator's, the egress one)", len(list))
	}
	for _, secret := range old {
		if _, err := tokens.Check(secret, time.Now()); !errors.Is(err, policy.ErrTokenUnknown) {
			t.Fatalf("a secret of an earlier launch: %v", err)
		}
	}
	for _, secret := range latest {
		p, err := tokens.Check(secret, time.Now())
		if err != nil || p.OwnerID() != "alice" || p.Parent != human.ID {
			t.Fatalf("the latest launch's token: %+v, %v", p, err)
		}
	}
	// token list shows them under their parent.
	rows := tokenTree(list)
	if len(rows) != 3 || rows[0].token.ID != human.ID || rows[1].depth != 1 || rows[2].depth != 1 {
		t.Fatalf("token tree: %+v", rows)
	}
}

// A session that ended while its agent was being launched keeps no token.
func TestASessionThatEndedAtLaunchKeepsNoToken(t *testing.T) {
	ctx := context.Background()
	tokens, _ := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: t.TempDir()})
	_, human, _ := tokens.Create(ctx, policy.TokenSpec{Name: "human", Scopes: []string{"chat"}})
	st := agentState(func(string) bool { return false })
	info := sessions.SessionInfo{SessionID: "ses_gone", Tools: []string{"create"}, Base: "http://127.0.0.1:9", Owner: sessions.Owner{TokenID: human.ID}}
	log := slog.New(slog.DiscardHandler)
	if servers := append(st.orchestratorServers(tokens, info, log), st.egressServers(tokens, info, log)...); len(servers) != 0 {
		t.Fatalf("an ended session's agent got %+v", servers)
	}
	if n := len(tokens.List()); n != 1 {
		t.Fatalf("%d tokens, want the human's only", n)
	}
}

// Tokens derived from a JWT sit under a line for its subject.
func TestTokenTreeShowsJWTSubjects(t *testing.T) {
	now := time.Now()
	list := []policy.Token{
		{ID: "tok_w", Name: "egress-ses_w", Parent: "tok_o", Created: now},
		{ID: "tok_o", Name: "orchestrator-ses_o", Parent: "jwt:alice", Created: now.Add(-time.Second)},
		{ID: "tok_h", Name: "human", Created: now.Add(-time.Hour)},
	}
	rows := tokenTree(list)
	var got []string
	for _, r := range rows {
		name := r.token.Name
		if r.subject != "" {
			name = r.subject
		}
		got = append(got, strings.Repeat(">", r.depth)+name)
	}
	if strings.Join(got, " ") != "human jwt:alice >orchestrator-ses_o >>egress-ses_w" {
		t.Fatalf("tree = %v", got)
	}
}

// An orchestrator's token is minted again at each launch of its agent, and
// holds only the verbs its creator may call then: after a reload whose scope
// map grants the creator's scope less, or for a JWT creator whose latest
// call carried fewer scopes, the relaunched agent's token holds less.
func TestRelaunchHoldsOnlyWhatTheCreatorMayCallNow(t *testing.T) {
	ctx := context.Background()
	tokens, err := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, human, err := tokens.Create(ctx, policy.TokenSpec{Name: "human", Scopes: []string{"team"}})
	if err != nil {
		t.Fatal(err)
	}
	mapOf := func(rules ...policy.Rule) *policy.ScopeMap {
		m, err := policy.NewScopeMap(rules, true)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	st := agentState(func(string) bool { return true })
	st.sites.Store(sitesOf(mapOf(policy.Rule{Scope: "team", Tools: []string{"sessions"}})))
	info := sessions.SessionInfo{SessionID: "ses_orch", Tools: []string{"create", "cancel", "read"}, Base: "http://127.0.0.1:9",
		Owner: sessions.Owner{TokenID: human.ID, TokenName: human.Name}}
	log := slog.New(slog.DiscardHandler)
	scopesOf := func(servers []sessions.McpServer) []string {
		t.Helper()
		if len(servers) != 1 {
			t.Fatalf("servers = %+v", servers)
		}
		p, err := tokens.Check(bearerOf(t, servers[0]), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return p.Scopes
	}
	if got := scopesOf(st.orchestratorServers(tokens, info, log)); len(got) != 3 {
		t.Fatalf("first launch: %v, want the three verbs", got)
	}
	// A reload: team may now only read.
	st.sites.Store(sitesOf(mapOf(policy.Rule{Scope: "team", Tools: []string{"sessions"}, Verbs: []string{"read"}})))
	if got := scopesOf(st.orchestratorServers(tokens, info, log)); len(got) != 1 || got[0] != "sessions:read" {
		t.Fatalf("after the reload: %v, want sessions:read alone", got)
	}

	// A JWT creator whose latest call carried read only.
	exp := time.Now().Add(time.Hour)
	jwtInfo := sessions.SessionInfo{SessionID: "ses_jwt", Tools: []string{"create", "read"}, Base: "http://127.0.0.1:9",
		Owner: sessions.Owner{TokenID: policy.JWTPrefix + "alice", TokenName: "alice", Expires: &exp, Scopes: []string{"read"}}}
	st.sites.Store(sitesOf(mapOf()))
	if got := scopesOf(st.orchestratorServers(tokens, jwtInfo, log)); len(got) != 1 || got[0] != "sessions:read" {
		t.Fatalf("a JWT creator with read: %v, want sessions:read alone", got)
	}
	// A creator token that was revoked gets its orchestrator nothing.
	if _, err := tokens.Revoke(ctx, human.ID); err != nil {
		t.Fatal(err)
	}
	if servers := st.orchestratorServers(tokens, info, log); len(servers) != 0 {
		t.Fatalf("a revoked creator's orchestrator got %+v", servers)
	}
}

// The creator of an orchestrator session is judged at each launch as a
// request with its token would be: a token derived from one that is not on
// record is refused, though its own record is neither revoked nor
// expired. The store deletes a token's descendants with it, so only a
// token file restored from a backup, or edited by hand, holds one; here
// ses_three's creator is ses_two's token, whose parent is gone, and the
// log says that the creator is gone.
func TestRelaunchRefusesACreatorWhoseParentIsGone(t *testing.T) {
	ctx := context.Background()
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	created := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	file, err := json.Marshal(map[string]any{"version": 1, "tokens": []policy.Token{{
		ID: "tok_0000000000000002", Name: "orchestrator-ses_two", SHA256: strings.Repeat("ab", 32),
		Scopes: []string{"sessions:create", "sessions:read"}, Kind: policy.KindUser, Created: created,
		Parent: "tok_0000000000000001", Session: "ses_two", Purpose: policy.PurposeOrchestrator,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Store(ctx, policy.TokensKey, file); err != nil {
		t.Fatal(err)
	}
	tokens, err := policy.OpenTokenStore(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	st := agentState(func(string) bool { return true })
	info := sessions.SessionInfo{SessionID: "ses_three", Tools: []string{"create", "read"}, Base: "http://127.0.0.1:9",
		Owner: sessions.Owner{TokenID: "tok_0000000000000002", TokenName: "orchestrator-ses_two"}}
	var logged strings.Builder
	log := slog.New(slog.NewTextHandler(&logged, nil))
	if servers := st.orchestratorServers(tokens, info, log); len(servers) != 0 {
		t.Fatalf("an orchestrator whose creator's parent is gone got %+v", servers)
	}
	if !strings.Contains(logged.String(), "the creator of an orchestrator session is gone") {
		t.Fatalf("the log says %q; want that the creator is gone", logged.String())
	}
}
