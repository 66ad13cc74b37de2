package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

const (
	claudeClient = "https://claude.example/oauth/client.json"
	cursorClient = "https://cursor.example/oauth/client.json"
)

// seedGrants records three grants in c's storage, as the gateway's
// authorization server does when people sign clients in: alice's Claude
// Code and Cursor, bob's Cursor. It returns them by owner and client.
func seedGrants(t *testing.T, c *Caddy) map[string]policy.Issued {
	t.Helper()
	ctx := context.Background()
	store, err := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: c.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	rand.Read(key)
	if err := store.SetGrantKey(key); err != nil {
		t.Fatal(err)
	}
	out := map[string]policy.Issued{}
	for _, g := range []struct{ owner, client, name string }{
		{"alice", claudeClient, "Claude Code"}, {"alice", cursorClient, "Cursor"}, {"bob", cursorClient, "Cursor"},
	} {
		iss, err := store.CreateGrant(ctx, policy.GrantSpec{Owner: g.owner, Name: "signin", Client: g.client, ClientName: g.name,
			Resource: "http://127.0.0.1:1/mcp", Scopes: []string{"chat"}}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		out[g.owner+" "+g.name] = iss
	}
	// carol signed in two hours ago, and her client never refreshed within
	// the hour its refresh token lived.
	iss, err := store.CreateGrant(ctx, policy.GrantSpec{Owner: "carol", Client: claudeClient, Resource: "http://127.0.0.1:1/mcp",
		Scopes: []string{"chat"}, RefreshTTL: time.Hour}, time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	out["carol lapsed"] = iss
	return out
}

// listGrants runs `token list` with args and returns what it printed.
func listGrants(t *testing.T, c *Caddy, args ...string) string {
	t.Helper()
	out, stderr, err := c.Run(t, append([]string{"zidane", "token", "list"}, args...)...)
	if err != nil {
		t.Fatalf("token list %v: %v\n%s", args, err, stderr)
	}
	return out
}

// TestGrantsListedAndRevoked: `caddy zidane token list` shows the grants
// people gave OAuth clients, with their owner and client, filtered by
// --owner and --client, online (through the admin API) and offline
// (storage read directly), and never a secret or hash; `token revoke
// <grant id>` revokes one, audited as grant_revoked.
func TestGrantsListedAndRevoked(t *testing.T) {
	for _, online := range []bool{false, true} {
		name := "offline"
		if online {
			name = "online"
		}
		t.Run(name, func(t *testing.T) {
			c := newCaddy(t, "{\n\tadmin {{ADMIN}}\n}\n")
			grants := seedGrants(t, c)
			if online {
				c.start(t)
			}
			createToken(t, c, "laptop", "--scope", "chat", "--owner", "alice")

			all := listGrants(t, c)
			header, _, _ := strings.Cut(all, "\n")
			if !strings.Contains(header, "OWNER") || !strings.Contains(header, "CLIENT") {
				t.Fatalf("token list header = %q, want OWNER and CLIENT columns", header)
			}
			for _, iss := range grants {
				if !strings.Contains(all, iss.GrantID) {
					t.Fatalf("token list lacks grant %s:\n%s", iss.GrantID, all)
				}
			}
			if !strings.Contains(all, `"Claude Code" `+claudeClient) || !strings.Contains(all, "laptop") {
				t.Fatalf("token list does not name the client of a grant, or lacks the operator's token:\n%s", all)
			}

			for _, line := range strings.Split(all, "\n") {
				if strings.HasPrefix(line, grants["carol lapsed"].GrantID) && !strings.HasSuffix(strings.TrimSpace(line), "lapsed") {
					t.Fatalf("a grant whose refresh token lapsed is listed as %q", line)
				}
				if strings.HasPrefix(line, grants["alice Cursor"].GrantID) && !strings.HasSuffix(strings.TrimSpace(line), "active") {
					t.Fatalf("a live grant is listed as %q", line)
				}
			}
			alice := listGrants(t, c, "--owner", "alice")
			if strings.Contains(alice, grants["bob Cursor"].GrantID) || !strings.Contains(alice, grants["alice Cursor"].GrantID) || !strings.Contains(alice, "laptop") {
				t.Fatalf("token list --owner alice:\n%s", alice)
			}
			cursor := listGrants(t, c, "--client", cursorClient)
			if strings.Contains(cursor, grants["alice Claude Code"].GrantID) || strings.Contains(cursor, "laptop") ||
				!strings.Contains(cursor, grants["bob Cursor"].GrantID) || !strings.Contains(cursor, grants["alice Cursor"].GrantID) {
				t.Fatalf("token list --client %s:\n%s", cursorClient, cursor)
			}
			both := listGrants(t, c, "--owner", "bob", "--client", cursorClient, "--json")
			var rows []policy.Token
			if err := json.Unmarshal([]byte(both), &rows); err != nil || len(rows) != 1 || rows[0].ID != grants["bob Cursor"].GrantID ||
				rows[0].Client != cursorClient || rows[0].Resource == "" || rows[0].Owner != "bob" {
				t.Fatalf("token list --owner bob --client … --json = %v %s", err, both)
			}

			stored, err := os.ReadFile(filepath.Join(c.DataDir, policy.TokensKey))
			if err != nil {
				t.Fatal(err)
			}
			var file struct{ Tokens []policy.Token }
			if err := json.Unmarshal(stored, &file); err != nil {
				t.Fatal(err)
			}
			jsonAll := listGrants(t, c, "--json")
			for _, tok := range file.Tokens {
				if tok.Refresh == nil {
					continue
				}
				if tok.Refresh.SHA256 == "" || strings.Contains(all+jsonAll, tok.Refresh.SHA256) {
					t.Fatalf("the listing shows a grant's refresh hash (or storage holds none): %q", tok.Refresh.SHA256)
				}
			}
			for _, iss := range grants {
				for _, secret := range []string{iss.Access, iss.Refresh} {
					if strings.Contains(string(stored)+all+jsonAll, secret) {
						t.Fatal("a grant's token is in storage or a listing")
					}
				}
			}

			victim := grants["alice Cursor"].GrantID
			from := 0
			if online {
				from = c.LogSize()
			}
			out, stderr, err := c.Run(t, "zidane", "token", "revoke", victim)
			if err != nil || !strings.Contains(out, "Revoked grant "+victim+" of alice to client "+cursorClient) {
				t.Fatalf("token revoke %s: %v\n%s%s", victim, err, out, stderr)
			}
			if online {
				c.WaitForLogFrom(t, from, `"event":"grant_revoked"`, 10*time.Second)
			}
			var after []policy.Token
			if err := json.Unmarshal([]byte(listGrants(t, c, "--json", "--owner", "alice")), &after); err != nil {
				t.Fatal(err)
			}
			for _, tok := range after {
				if (tok.ID == victim) != (tok.Revoked != nil) {
					t.Fatalf("after revoking %s: %s revoked = %v", victim, tok.ID, tok.Revoked)
				}
			}
			if _, stderr, err := c.Run(t, "zidane", "token", "revoke", "signin"); err == nil || !strings.Contains(stderr, "no such token") {
				t.Fatalf("token revoke by a grant's name (a label many grants share): %v %s, want refused", err, stderr)
			}
		})
	}
}
