package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/authserver"
)

// TestSigninSessionsBelongToThePerson: agent sessions started through
// the gateway's sign-in belong to the person, whichever client they used:
// alice signs in two clients, starts a session with one (its turn waits
// on her approval) and sees, reads and answers it with the other; bob,
// signed in with the same client, neither sees nor reaches it. Revoking
// the grant that started it (RFC 7009, the client signing out) cancels
// its work, as for any token, and the session stays hers.
func TestSigninSessionsBelongToThePerson(t *testing.T) {
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		default_agent demo
		signin {
			issuer %[1]s
			registration dynamic
		}
	}
}

%[1]s {
	zidane_mcp {
		sessions
		resource %[1]s/mcp
	}
}
`, base))
	mcpURL := base + "/mcp"
	aliceLink, bobLink := signInLink(t, c, "alice", "chat"), signInLink(t, c, "bob", "chat")
	laptop, phone := registerClient(t, base), registerClient(t, base)
	aliceBrowser, bobBrowser := newFormBrowser(t, base), newFormBrowser(t, base)
	bobBrowser.hc.Transport = fromAddress("127.0.0.2")
	grant := func(m *manualClient, b *formBrowser, link string) map[string]any {
		t.Helper()
		code, verifier := m.code(b, link, mcpURL)
		status, tok := m.redeem(code, verifier, mcpURL)
		if status != http.StatusOK {
			t.Fatalf("redeem: %d %v", status, tok)
		}
		return tok
	}
	aliceLaptop := grant(laptop, aliceBrowser, aliceLink)
	alicePhone := grant(phone, aliceBrowser, aliceLink)
	bobLaptop := grant(laptop, bobBrowser, bobLink)

	a := connectGoSessions(t, mcpURL, aliceLaptop["access_token"].(string), "alice's laptop")
	id := createSession(t, a, t.TempDir(), "approve: rm -rf /srv/prod").SessionID
	settleIn(t, a, id, "blocked")

	p := connectGoSessions(t, mcpURL, alicePhone["access_token"].(string), "alice's phone")
	var l listView
	sessionsCall(t, p, "list", nil).decode(t, &l)
	if len(l.Sessions) != 1 || l.Sessions[0].SessionID != id {
		t.Fatalf("alice's phone lists %+v, want the session her laptop started", l.Sessions)
	}
	it := onlyPending(t, p, id)

	b := connectGoSessions(t, mcpURL, bobLaptop["access_token"].(string), "bob's laptop")
	sessionsCall(t, b, "list", nil).decode(t, &l)
	if len(l.Sessions) != 0 {
		t.Errorf("bob, signed in with the same client, lists %+v", l.Sessions)
	}
	callRefused(t, b, "sessions", map[string]any{"verb": "read", "sessionId": id}, "not_owner")
	if ans := answerInteraction(t, b, it.RequestID, map[string]any{"decision": "allow"}); !ans.IsError {
		t.Errorf("bob answered alice's interaction: %s", ans.Text)
	}

	// The laptop signs out: its grant is revoked, and the turn it started,
	// waiting on an approval, is cancelled; the session stays alice's.
	resp, err := http.PostForm(base+authserver.RevokePath, url.Values{"token": {aliceLaptop["refresh_token"].(string)}, "client_id": {laptop.id}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	// The cancel reaches the agent before its pending interactions end
	// (the order ACP prescribes), so the revoke's answer can come first:
	// wait for the cancelled turn, then look.
	eventsWhen(t, p, map[string]any{"sessionId": id}, "the turn cancelled by the revocation", func(evs []eventView) bool {
		for _, ev := range evs {
			if ev.Status == "cancelled" && strings.Contains(ev.Summary, "revoked") {
				return true
			}
		}
		return false
	})
	if v := settle(t, p, id); v.State == "blocked" {
		t.Fatalf("the session of a revoked grant still waits on its approval: %+v", v)
	}
	if n := len(pendingOf(t, p, id)); n != 0 {
		t.Errorf("%d interactions still pending after the grant that started them was revoked", n)
	}
	if got, _ := listToolsStatus(t, mcpURL, aliceLaptop["access_token"].(string)); got != http.StatusUnauthorized {
		t.Errorf("the revoked grant's access token: %d", got)
	}
	if v := readSession(t, p, id, false); v.SessionID != id || !strings.HasPrefix(id, "ses_") {
		t.Errorf("alice's phone reads %+v after the laptop signed out", v)
	}
}
