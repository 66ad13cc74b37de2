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
// with any other key, and the grant's refresh token sent as a bearer
// token, are refused; revoking the grant on one replica (`token revoke
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
