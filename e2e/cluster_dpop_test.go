package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
)

// aggregateDPoPReplica is aggregateJWTReplica with DPoP nonces on.
func aggregateDPoPReplica(t *testing.T, natsURL, upstream, node, clusterKey, resource string, p *idp) string {
	t.Helper()
	host := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startCaddy(t, fmt.Sprintf(`{
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
		dpop_nonce
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
	}
}
`, AdminPlaceholder, natsURL, node, host, upstream, host, resource, p.issuer, p.jwksURL), clusterKey)
	return host
}

// dpopCaller is a client of a DPoP-bound token, keeping the last nonce
// each replica gave it, as a DPoP client library does.
type dpopCaller struct {
	key      dpopKey
	token    string
	resource string
	nonce    string
}

// post sends body to url with a fresh proof, signing again once with the
// nonce of a use_dpop_nonce answer (RFC 9449 §9). It returns the answer
// and the proof it sent last.
func (c *dpopCaller) post(t *testing.T, url, body string, headers ...string) (rawAnswer, string) {
	t.Helper()
	for range 2 {
		proof := c.key.proof(t, "POST", c.resource, c.token, c.nonce)
		a := postDPoPWith(t, url, "DPoP "+c.token, []string{proof}, body, headers...)
		if n := a.header.Get("DPoP-Nonce"); n != "" {
			c.nonce = n
		}
		if ch, ok := dpopChallenge(t, a); !ok || ch.Params["error"] != "use_dpop_nonce" {
			return a, proof
		}
	}
	t.Fatal("refused use_dpop_nonce twice in a row")
	return rawAnswer{}, ""
}

// postDPoPWith is postDPoP with extra headers, name then value.
func postDPoPWith(t *testing.T, url, authz string, proofs []string, body string, headers ...string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", authz)
	for _, p := range proofs {
		req.Header.Add("DPoP", p)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return sendRaw(t, req)
}

// sendWith is send with extra request headers, name then value, which the
// hop's MAC covers.
func (s hopSender) sendWith(t *testing.T, sid, body, principal, jwtCredential string, headers ...string) rawAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", legacyVersion)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	s.hop.sign(t, req, body, s.from, s.to, time.Now(), randomHex(16), principal, jwtCredential)
	return sendRaw(t, req)
}

// Two replicas behind one resource, on a real nats-server, with nonces:
// a nonce one replica issued is taken by the other (the key derives from
// the cluster key); a proof taken on one is a replay on the other; Alice's
// session on gw-a is served through gw-b, whose hop carries her proof,
// which gw-a checks again. A holder of the cluster key who signs hops with
// Alice's stolen bound token is refused without her proof, with another
// key's, and with the proof gw-b forwarded already.
func TestClusterDPoP(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startEverythingServer(t)
	p := startIDP(t)
	rawKey := []byte(randomHex(16))
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(rawKey)
	const resource = "https://mcp.example.test/mcp"
	hostA := aggregateDPoPReplica(t, natsURL, upstream, "gw-a", clusterKey, resource, p)
	hostB := aggregateDPoPReplica(t, natsURL, upstream, "gw-b", clusterKey, resource, p)
	urlA, urlB := "http://"+hostA+"/mcp", "http://"+hostB+"/mcp"
	owner, thief := newDPoPKey(t), newDPoPKey(t)
	now := time.Now()
	alice := p.token(t, jwt.MapClaims{"iss": p.issuer, "aud": resource, "sub": "alice", "scope": "mcp",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "cnf": map[string]any{"jkt": owner.jkt}})
	c := &dpopCaller{key: owner, token: alice, resource: resource}

	// A nonce from gw-a is good on gw-b: no use_dpop_nonce there.
	if a, _ := c.post(t, urlA, initializeBody); a.status != http.StatusOK {
		t.Fatalf("initialize on gw-a: %d %s", a.status, tail(a.body, 300))
	}
	if a := postDPoPWith(t, urlB, "DPoP "+alice, []string{owner.proof(t, "POST", resource, alice, c.nonce)}, initializeBody); a.status != http.StatusOK {
		t.Fatalf("gw-b with gw-a's nonce: %d %q %s", a.status, a.header.Values("WWW-Authenticate"), tail(a.body, 300))
	}

	// A proof taken on one replica is a replay on the other.
	a, taken := c.post(t, urlA, initializeBody)
	if a.status != http.StatusOK {
		t.Fatalf("initialize on gw-a: %d %s", a.status, tail(a.body, 300))
	}
	replay := postDPoPWith(t, urlB, "DPoP "+alice, []string{taken}, initializeBody)
	if ch, ok := dpopChallenge(t, replay); replay.status != http.StatusUnauthorized || !ok || ch.Params["error"] != "invalid_dpop_proof" || !strings.Contains(replay.rpc.Error.Message, "used already") {
		t.Fatalf("gw-a's proof replayed on gw-b: %d %q %s; want 401 invalid_dpop_proof, used already", replay.status, replay.header.Values("WWW-Authenticate"), tail(replay.body, 300))
	}

	// Alice's session is gw-a's; gw-b forwards her calls with her proof.
	sid := a.header.Get("Mcp-Session-Id")
	c.post(t, urlA, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)
	const list = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	var forwarded string
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, proof := c.post(t, urlB, list, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)
		if got.status == http.StatusOK && strings.Contains(got.body, "mcp_ev_test_simple_text") {
			forwarded = proof
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
	hops := hopSender{hop: testHop{key: hk, route: "aggregate-node|" + resource + "||ev"}, from: "gw-b", to: "gw-a", url: urlA}
	send := func(proof string) rawAnswer {
		if proof == "" {
			return hops.send(t, sid, list, hopPrincipal("jwt:alice", "mcp"), alice)
		}
		return hops.sendWith(t, sid, list, hopPrincipal("jwt:alice", "mcp"), alice, "DPoP", proof)
	}
	for _, tc := range []struct{ name, proof, says string }{
		{"no proof", "", "one proof"},
		{"another key's proof", thief.proof(t, "POST", resource, alice, c.nonce), "another key"},
		{"the proof gw-b forwarded already", forwarded, "used already"},
	} {
		t.Run("a hop with the stolen token and "+tc.name, func(t *testing.T) {
			got := send(tc.proof)
			if got.status != http.StatusUnauthorized || !strings.Contains(got.body, "invalid_dpop_proof") || !strings.Contains(got.body, tc.says) {
				t.Fatalf("%d %s; want 401 invalid_dpop_proof saying %q", got.status, tail(got.body, 400), tc.says)
			}
		})
	}
	// What refuses these is the proof: the same hop with one Alice signed
	// is served.
	if got := send(owner.proof(t, "POST", resource, alice, c.nonce)); got.status != http.StatusOK || !strings.Contains(got.body, "mcp_ev_test_simple_text") {
		t.Fatalf("a hop with a proof of Alice's key: %d %s", got.status, tail(got.body, 400))
	}
}
