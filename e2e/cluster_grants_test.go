package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// A grant's access token made with the key derived from the cluster key is
// accepted by every replica, with no storage read per request; one made
// with any other key, one for another resource, and the grant's refresh
// token sent as a bearer token, are refused; revoking the grant on one replica (`token revoke
// grt_…`) refuses its access token on the other. The grant is recorded
// here as the gateway's authorization server records one, through the
// token store on the cluster's NATS storage.
func TestClusterGrantTokensOnEveryReplica(t *testing.T) {
	natsURL := startNATSServer(t)
	up := startRecordingUpstream(t)
	rawKey := []byte(randomHex(16))
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(rawKey)
	const resource = "https://mcp.example.test/mcp"
	replica := func() (*Caddy, string) {
		site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			lock_ttl 5s
		}
	}
}

http://%s {
	zidane_mcp {
		guard
		resource %s
	}
	reverse_proxy %s
}
`, AdminPlaceholder, natsURL, site, resource, up.addr), clusterKey)
		return c, "http://" + site + "/mcp"
	}
	a, urlA := replica()
	b, urlB := replica()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{natsURL}, Name: "grants test"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := conn.Storage(ctx, cluster.StorageOptions{Key: rawKey, LockTTL: 5 * time.Second, Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := policy.OpenTokenStore(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	grantKey, err := cluster.Derive(rawKey, "grant tokens")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SetGrantKey(grantKey); err != nil {
		t.Fatal(err)
	}
	spec := policy.GrantSpec{Owner: "alice", Client: claudeClient, ClientName: "Claude Code", Resource: resource, Scopes: []string{"mcp"}}
	iss, err := store.CreateGrant(ctx, spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, urlA, iss.Access, http.StatusOK, 20*time.Second)
	waitStatus(t, urlB, iss.Access, http.StatusOK, 20*time.Second)
	if got := up.last(t).Get("Authorization"); got != "" {
		t.Fatalf("the guard forwarded the client's access token upstream: %q", got)
	}

	elsewhere := spec
	elsewhere.Resource = "https://other.example.test/mcp"
	foreign, err := store.CreateGrant(ctx, elsewhere, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	otherKey := make([]byte, 32)
	rand.Read(otherKey)
	if err := store.SetGrantKey(otherKey); err != nil {
		t.Fatal(err)
	}
	forged, err := store.CreateGrant(ctx, spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, token string }{
		{"an access token made with another key, for a grant the cluster holds", forged.Access},
		{"the refresh token as a bearer token", iss.Refresh},
		{"an access token of this cluster for another resource", foreign.Access},
	} {
		for _, url := range []string{urlA, urlB} {
			got := post(t, url, c.token, initializeBody)
			if got.status != http.StatusUnauthorized || !strings.Contains(got.header.Get("WWW-Authenticate"), "invalid_token") {
				t.Fatalf("%s at %s: %d %q, want 401 invalid_token", c.name, url, got.status, got.header.Get("WWW-Authenticate"))
			}
		}
	}

	out, stderr, err := b.Run(t, "zidane", "token", "list", "--client", claudeClient)
	if err != nil || !strings.Contains(out, iss.GrantID) || !strings.Contains(out, "alice") {
		t.Fatalf("token list --client on B: %v\n%s%s", err, out, stderr)
	}
	if _, stderr, err := a.Run(t, "zidane", "token", "revoke", iss.GrantID); err != nil {
		t.Fatalf("token revoke %s on A: %v\n%s", iss.GrantID, err, stderr)
	}
	if got := post(t, urlA, iss.Access, initializeBody).status; got != http.StatusUnauthorized {
		t.Fatalf("A, which revoked the grant, answered its access token %d", got)
	}
	revoked := waitStatus(t, urlB, iss.Access, http.StatusUnauthorized, 20*time.Second)
	t.Logf("a grant revoked on A refused its access token on B after %v", revoked.Round(time.Millisecond))
}

// A grant acts for its person: the session alice creates through one
// client (Claude Code) is hers through another (Cursor), and not bob's;
// revoking the grant of the client that created it cancels what its agent
// was doing (a turn blocked on an interaction), refuses that client's
// access token, and leaves the session to alice through her other client.
// The gateway is one replica on NATS storage, whose grant key derives
// from the cluster key, so the test issues the grants as the gateway's
// authorization server would.
func TestClusterGrantSessionsBelongToThePerson(t *testing.T) {
	natsURL := startNATSServer(t)
	rawKey := []byte(randomHex(16))
	host := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	resource := "http://" + host + "/mcp"
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	grace_period 3s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			node gw-0
			advertise http://%s
		}
		default_agent demo
	}
}

http://%s {
	zidane_mcp {
		sessions
		resource %s
	}
}
`, AdminPlaceholder, natsURL, host, host, resource), "ZIDANE_CLUSTER_KEY="+base64.StdEncoding.EncodeToString(rawKey))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{natsURL}, Name: "grants test"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := conn.Storage(ctx, cluster.StorageOptions{Key: rawKey, Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := policy.OpenTokenStore(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	grantKey, err := cluster.Derive(rawKey, "grant tokens")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SetGrantKey(grantKey); err != nil {
		t.Fatal(err)
	}
	grant := func(owner, client string) policy.Issued {
		iss, err := store.CreateGrant(ctx, policy.GrantSpec{Owner: owner, Client: client, Resource: resource, Scopes: []string{"chat"}}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return iss
	}
	aliceClaude, aliceCursor, bob := grant("alice", claudeClient), grant("alice", cursorClient), grant("bob", cursorClient)
	waitStatus(t, resource, bob.Access, http.StatusOK, 20*time.Second)

	viaClaude := connectGoSessions(t, resource, aliceClaude.Access, "alice-claude")
	viaCursor := connectGoSessions(t, resource, aliceCursor.Access, "alice-cursor")
	asBob := connectGoSessions(t, resource, bob.Access, "bob")
	id := createSession(t, viaClaude, t.TempDir(), "approve: rm -rf /srv/prod").SessionID
	settleIn(t, viaClaude, id, "blocked")

	type listed struct {
		Sessions []struct {
			SessionID string `json:"sessionId"`
			Foreign   bool   `json:"foreign"`
		} `json:"sessions"`
	}
	var l listed
	sessionsCall(t, viaCursor, "list", nil).decode(t, &l)
	if len(l.Sessions) != 1 || l.Sessions[0].SessionID != id || l.Sessions[0].Foreign {
		t.Fatalf("alice's list through her other client: %+v, want her session %s", l.Sessions, id)
	}
	l = listed{}
	sessionsCall(t, asBob, "list", nil).decode(t, &l)
	if len(l.Sessions) != 0 {
		t.Fatalf("bob lists alice's session: %+v", l.Sessions)
	}

	if _, stderr, err := c.Run(t, "zidane", "token", "revoke", aliceClaude.GrantID); err != nil {
		t.Fatalf("token revoke %s: %v\n%s", aliceClaude.GrantID, err, stderr)
	}
	eventsWhen(t, viaCursor, map[string]any{"sessionId": id}, "the turn cancelled by the revocation", func(evs []eventView) bool {
		for _, ev := range evs {
			if ev.Status == "cancelled" && strings.Contains(ev.Summary, "revoked") {
				return true
			}
		}
		return false
	})
	if v := settle(t, viaCursor, id); v.State == "blocked" {
		t.Fatalf("the session still waits on the revoked client's interaction: %+v", v)
	}
	if got := post(t, resource, aliceClaude.Access, initializeBody); got.status != http.StatusUnauthorized {
		t.Fatalf("the revoked grant's access token: %d, want 401", got.status)
	}
}
