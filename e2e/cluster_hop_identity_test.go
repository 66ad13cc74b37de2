package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
)

// The hop between replicas carries who a request acts for, never what it
// may do: the replica that takes a hop looks the token up in its own store
// (or verifies the JWT the hop carries) and uses the scopes it finds,
// never more than the hop claims. Here the attacker holds the cluster key
// (read from a file an agent could reach, say) and signs hops itself.

// tokenIDOf is the id of the token named name, from the CLI's listing.
func tokenIDOf(t *testing.T, c *Caddy, name string) string {
	t.Helper()
	for _, tk := range tokenList(t, c) {
		if tk.Name == name {
			return tk.ID
		}
	}
	t.Fatalf("no token named %q in the listing", name)
	return ""
}

// hopPrincipal is a hop's principal header claiming token id with scopes.
func hopPrincipal(id string, scopes ...string) string {
	b, _ := json.Marshal(map[string]any{"id": id, "scopes": scopes})
	return base64.RawURLEncoding.EncodeToString(b)
}

// hopSender sends hops signed with the cluster key to one replica.
type hopSender struct {
	hop      testHop
	from, to string
	url      string
}

// send posts body as a hop for MCP session sid, acting for principal;
// jwtCredential, when set, is the access token a hop for a JWT principal
// carries.
func (s hopSender) send(t *testing.T, sid, body, principal, jwtCredential string) rawAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", legacyVersion)
	s.hop.sign(t, req, body, s.from, s.to, time.Now(), randomHex(16), principal, jwtCredential)
	resp, err := shortClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// untilRegistered sends hops until the receiver knows the sender alive
// in its registry (it answers 403 hop_unknown_node until then), and
// returns the first answer that is not that.
func (s hopSender) untilRegistered(t *testing.T, sid, body, principal, jwtCredential string) rawAnswer {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := s.send(t, sid, body, principal, jwtCredential)
		if !strings.Contains(got.body, "hop_unknown_node") || time.Now().After(deadline) {
			return got
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Two replicas of the sessions endpoint. Alice's session runs on gw-b.
// Mallory, with a chat token and the cluster key, signs hops from gw-a to
// gw-b on her own MCP session there:
//   - claiming her own token and her own scopes, the hop is served, and
//     lists none of Alice's sessions (the signer is right);
//   - claiming her own token plus sessions:any, it is refused 403 with an
//     audit line on gw-b, and Alice's session stays out of her reach;
//   - claiming a token revoked through gw-a, once gw-b refuses that token
//     itself, it is refused 401 with an audit line.
func TestClusterHopCarriesIdentityNotAuthority(t *testing.T) {
	natsURL := startNATSServer(t)
	rawKey := []byte(randomHex(16))
	key := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(rawKey)
	hostA := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	hostB := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	a := startCaddy(t, sessionsReplicaCaddyfile([]string{natsURL}, replicaIdentity("gw-a", hostA), hostA), key)
	b := startCaddy(t, sessionsReplicaCaddyfile([]string{natsURL}, replicaIdentity("gw-b", hostB), hostB), key)
	urlB := "http://" + hostB + "/mcp"
	alice := createToken(t, a, "alice", "--scope", "chat")
	mallory := createToken(t, a, "mallory", "--scope", "chat")
	carol := createToken(t, a, "carol", "--scope", "chat")
	for _, tok := range []string{alice, mallory, carol} {
		waitStatus(t, urlB, tok, http.StatusOK, 20*time.Second)
	}
	mallorysID, carolsID := tokenIDOf(t, a, "mallory"), tokenIDOf(t, a, "carol")

	aliceOnB := connectGoSessions(t, urlB, alice, "alice-on-b")
	secret := createSession(t, aliceOnB, t.TempDir(), "alice's own work").SessionID
	if !sessionIDOn("gw-b").MatchString(secret) {
		t.Fatalf("alice's session %q does not run on gw-b", secret)
	}

	// An MCP session on gw-b for each of Mallory and Carol, opened with
	// their own tokens.
	legacySession := func(token string) string {
		init := post(t, urlB, token, initializeBody)
		sid := init.header.Get("Mcp-Session-Id")
		if init.status != http.StatusOK || sid == "" {
			t.Fatalf("initialize on gw-b: %d %s", init.status, tail(init.body, 300))
		}
		post(t, urlB, token, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)
		return sid
	}
	mallorysSession, carolsSession := legacySession(mallory), legacySession(carol)

	hk, err := cluster.Derive(rawKey, "aggregate hop v1")
	if err != nil {
		t.Fatal(err)
	}
	hops := hopSender{hop: testHop{key: hk, route: "sessions-node|v1"}, from: "gw-a", to: "gw-b", url: urlB}
	const list = `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"list"}}}`

	own := hops.untilRegistered(t, mallorysSession, list, hopPrincipal(mallorysID, "chat"), "")
	if own.status != http.StatusOK || !strings.Contains(own.body, "result") {
		t.Fatalf("a hop claiming mallory's own token and scopes: %d %s", own.status, tail(own.body, 400))
	}
	if strings.Contains(own.body, secret) {
		t.Fatalf("mallory's own list shows alice's session: %s", tail(own.body, 400))
	}

	t.Run("a hop claiming more scopes than its token holds", func(t *testing.T) {
		got := hops.send(t, mallorysSession, list, hopPrincipal(mallorysID, "chat", "sessions:any"), "")
		if strings.Contains(got.body, secret) {
			t.Fatalf("a hop claiming sessions:any for mallory's chat token listed alice's session: %d %s", got.status, tail(got.body, 400))
		}
		if got.status != http.StatusForbidden || !strings.Contains(got.body, "hop_scopes") || !strings.Contains(got.body, "sessions:any") {
			t.Fatalf("a hop claiming sessions:any for a chat token: %d %s, want 403 hop_scopes naming sessions:any", got.status, tail(got.body, 400))
		}
		b.WaitForLog(t, `"reason":"hop_scopes"`, 10*time.Second)
	})

	t.Run("a hop for a token revoked on another replica", func(t *testing.T) {
		if _, stderr, err := a.Run(t, "zidane", "token", "revoke", "carol"); err != nil {
			t.Fatalf("token revoke on gw-a: %v %s", err, stderr)
		}
		// gw-b knows it revoked once it refuses the token itself.
		waitStatus(t, urlB, carol, http.StatusUnauthorized, 20*time.Second)
		got := hops.send(t, carolsSession, `{"jsonrpc":"2.0","id":6,"method":"tools/list"}`, hopPrincipal(carolsID, "chat"), "")
		if got.status != http.StatusUnauthorized || !strings.Contains(got.body, "hop_principal") || !strings.Contains(got.body, "revoked") {
			t.Fatalf("a hop for carol's revoked token: %d %s, want 401 hop_principal saying it was revoked", got.status, tail(got.body, 400))
		}
		b.WaitForLog(t, `"reason":"hop_principal"`, 10*time.Second)
	})

	t.Run("a hop for a token no replica knows", func(t *testing.T) {
		got := hops.send(t, mallorysSession, list, hopPrincipal("tok_00000000deadbeef", "chat"), "")
		if got.status != http.StatusUnauthorized || !strings.Contains(got.body, "hop_principal") {
			t.Fatalf("a hop for an unknown token: %d %s, want 401 hop_principal", got.status, tail(got.body, 400))
		}
	})
}

// aggregateJWTReplica runs one replica of an aggregated route over
// upstream that takes the identity provider p's JWTs for resource (the
// same on every replica, as behind one public name).
func aggregateJWTReplica(t *testing.T, natsURL, upstream, node, clusterKey, resource string, p *idp) (*Caddy, string) {
	t.Helper()
	host := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			node %s
			advertise http://%s
		}
		upstream ev %s
	}
}

http://%s {
	zidane_mcp {
		aggregate ev
		resource %s
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
	}
}
`, AdminPlaceholder, natsURL, node, host, upstream, host, resource, p.issuer, p.jwksURL), clusterKey)
	return c, host
}

// A JWT principal's hop carries its access token, which the replica that
// takes it verifies itself. Alice's session opened on gw-a is served
// through gw-b (forwarded with her JWT); a hop claiming jwt:alice without
// a JWT, or with Bob's, or claiming more scopes than her JWT grants, is
// refused.
func TestClusterHopVerifiesForwardedJWT(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startEverythingServer(t)
	p := startIDP(t)
	rawKey := []byte(randomHex(16))
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(rawKey)
	const resource = "https://mcp.example.test/mcp"
	a, hostA := aggregateJWTReplica(t, natsURL, upstream, "gw-a", clusterKey, resource, p)
	_, hostB := aggregateJWTReplica(t, natsURL, upstream, "gw-b", clusterKey, resource, p)
	now := time.Now()
	jwtOf := func(sub string) string {
		return p.token(t, jwt.MapClaims{"iss": p.issuer, "aud": resource, "sub": sub, "scope": "mcp",
			"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()})
	}
	alice, bob := jwtOf("alice"), jwtOf("bob")
	for _, h := range []string{hostA, hostB} {
		waitStatus(t, "http://"+h+"/mcp", alice, http.StatusOK, 20*time.Second)
	}
	// Alice's session is gw-a's; her requests through gw-b go there.
	init := post(t, "http://"+hostA+"/mcp", alice, initializeBody)
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != http.StatusOK || sid == "" {
		t.Fatalf("initialize on gw-a: %d %s", init.status, tail(init.body, 300))
	}
	post(t, "http://"+hostA+"/mcp", alice, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)
	const list = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	deadline := time.Now().Add(20 * time.Second)
	for {
		// gw-b forwards once gw-a knows it alive in the registry.
		got := post(t, "http://"+hostB+"/mcp", alice, list, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)
		if got.status == http.StatusOK && strings.Contains(got.body, "mcp_ev_test_simple_text") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's session through gw-b: %d %s", got.status, tail(got.body, 400))
		}
		time.Sleep(100 * time.Millisecond)
	}

	hk, err := cluster.Derive(rawKey, "aggregate hop v1")
	if err != nil {
		t.Fatal(err)
	}
	hops := hopSender{hop: testHop{key: hk, route: "aggregate-node|" + resource + "||ev"}, from: "gw-b", to: "gw-a", url: "http://" + hostA + "/mcp"}
	if got := hops.untilRegistered(t, sid, list, hopPrincipal("jwt:alice", "mcp"), alice); got.status != http.StatusOK || !strings.Contains(got.body, "mcp_ev_test_simple_text") {
		t.Fatalf("a hop for jwt:alice carrying her JWT: %d %s", got.status, tail(got.body, 400))
	}
	for _, tc := range []struct {
		name, principal, credential string
		status                      int
		reason                      string
	}{
		{"without the JWT", hopPrincipal("jwt:alice", "mcp"), "", http.StatusUnauthorized, "hop_principal"},
		{"with another subject's JWT", hopPrincipal("jwt:alice", "mcp"), bob, http.StatusUnauthorized, "hop_principal"},
		{"claiming scopes the JWT does not grant", hopPrincipal("jwt:alice", "mcp", "admin"), alice, http.StatusForbidden, "hop_scopes"},
		{"an opaque token in place of the JWT", hopPrincipal("jwt:alice", "mcp"), "zds_" + randomHex(16), http.StatusUnauthorized, "hop_principal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := hops.send(t, sid, list, tc.principal, tc.credential)
			if got.status != tc.status || !strings.Contains(got.body, tc.reason) {
				t.Fatalf("%d %s, want %d %s", got.status, tail(got.body, 400), tc.status, tc.reason)
			}
			a.WaitForLog(t, `"reason":"`+tc.reason+`"`, 10*time.Second)
		})
	}
}
