package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
)

// The requests between replicas about agent sessions (package
// clustersessions, over NATS) carry whom a request acts for, never what it
// may do: the replica that runs the session looks the token up in its own
// store (or verifies the JWT, or the page's capability) and uses what it
// finds there. Here the attacker holds the cluster key (read from a file
// an agent could reach, say) and sends the requests itself.

// sessionsRPCService is the service of those requests (clustersessions.Service),
// written out as an attacker reads it in the README: its NATS subject is
// zidane.rpc.<bucket>.<service>.<node>.
const sessionsRPCService = "sessions-v2"

// sessionsRPC sends requests about agent sessions as a replica does, with
// the cluster key, from a node of its own that serves none.
type sessionsRPC struct {
	rpc     *cluster.RPC
	natsURL string
}

func newSessionsRPC(t *testing.T, natsURL string, clusterKey []byte) *sessionsRPC {
	t.Helper()
	conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{natsURL}, Name: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := conn.Storage(ctx, cluster.StorageOptions{Key: clusterKey, Owner: "gw-evil"})
	if err != nil {
		t.Fatal(err)
	}
	rpc, err := st.ServeRPC(sessionsRPCService, "gw-evil", func(context.Context, string, json.RawMessage) (json.RawMessage, error) {
		return nil, errors.New("serves nothing")
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rpc.Close)
	return &sessionsRPC{rpc: rpc, natsURL: natsURL}
}

// rpcAnswer is a node's answer to one request.
type rpcAnswer struct {
	Result json.RawMessage `json:"result"`
	Code   string          `json:"code"`
	Error  string          `json:"error"`
}

// call sends verb with body to node.
func (s *sessionsRPC) call(t *testing.T, node, verb string, body map[string]any) rpcAnswer {
	t.Helper()
	raw, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := s.rpc.Call(ctx, node, verb, raw)
	if err != nil {
		t.Fatalf("%s to %s: %v", verb, node, err)
	}
	var a rpcAnswer
	if err := json.Unmarshal(out, &a); err != nil {
		t.Fatalf("%s to %s: an answer that does not decode: %s", verb, node, out)
	}
	return a
}

// earlierReleaseListens reports whether anything takes requests on node's
// subject of the earlier release (service "sessions"), whose requests
// carried the caller's engine access: NATS answers at once that nothing
// does, or a subscriber stays silent to what is not sealed.
func (s *sessionsRPC) earlierReleaseListens(t *testing.T, node string) bool {
	t.Helper()
	nc, err := nats.Connect(s.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, err = nc.Request("zidane.rpc.zidane.sessions."+node, []byte("not sealed"), 5*time.Second)
	return !errors.Is(err, nats.ErrNoResponders)
}

// earlierRelease sends verb to node as a replica of the earlier release
// did, with the caller's engine Owner.
func earlierRelease(t *testing.T, natsURL string, clusterKey []byte, node, verb string, body map[string]any) rpcAnswer {
	t.Helper()
	conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{natsURL}, Name: "mallory-old"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := conn.Storage(ctx, cluster.StorageOptions{Key: clusterKey, Owner: "gw-old"})
	if err != nil {
		t.Fatal(err)
	}
	rpc, err := st.ServeRPC("sessions", "gw-old", func(context.Context, string, json.RawMessage) (json.RawMessage, error) {
		return nil, errors.New("serves nothing")
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rpc.Close()
	raw, _ := json.Marshal(body)
	out, err := rpc.Call(ctx, node, verb, raw)
	if err != nil {
		t.Fatalf("%s to %s in the earlier release's form: %v", verb, node, err)
	}
	var a rpcAnswer
	json.Unmarshal(out, &a)
	return a
}

// Two replicas of the sessions endpoint; Alice's session runs on gw-b and
// waits for an approval. Through gw-a, Alice reads it and its page opens
// (both asked of gw-b over NATS), and Mallory (a chat token) is refused it
// by gw-b's engine. Mallory, with the cluster key, then asks gw-b herself
// for Alice's session: her token claiming sessions:any, her token claiming
// the reach of that scope, a token revoked through gw-a, a token no
// replica knows, a page's reader without a capability, and the earlier
// release's form, which carried the caller's access. Each is refused, with
// an audit line on gw-b naming the reason, and Alice's session is as she
// left it.
func TestClusterSessionRequestsCarryIdentityNotAuthority(t *testing.T) {
	natsURL := startNATSServer(t)
	rawKey := []byte(randomHex(16))
	key := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(rawKey)
	hostA := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	hostB := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	a := startCaddy(t, sessionsReplicaCaddyfile([]string{natsURL}, replicaIdentity("gw-a", hostA), hostA), key)
	b := startCaddy(t, sessionsReplicaCaddyfile([]string{natsURL}, replicaIdentity("gw-b", hostB), hostB), key)
	urlA, urlB := "http://"+hostA+"/mcp", "http://"+hostB+"/mcp"
	alice := createToken(t, a, "alice", "--scope", "chat")
	mallory := createToken(t, a, "mallory", "--scope", "chat")
	carol := createToken(t, a, "carol", "--scope", "chat")
	for _, tok := range []string{alice, mallory, carol} {
		waitStatus(t, urlB, tok, http.StatusOK, 20*time.Second)
	}
	mallorysID, carolsID := tokenIDOf(t, a, "mallory"), tokenIDOf(t, a, "carol")

	aliceOnB := connectGoSessions(t, urlB, alice, "alice-on-b")
	secret := createSession(t, aliceOnB, t.TempDir(), "approve: ship it")
	if !sessionIDOn("gw-b").MatchString(secret.SessionID) {
		t.Fatalf("alice's session %q does not run on gw-b", secret.SessionID)
	}
	settleIn(t, aliceOnB, secret.SessionID, "blocked")
	it := onlyPending(t, aliceOnB, secret.SessionID)

	// Through gw-a, as replicas ask each other for a caller their edge
	// authenticated.
	aliceOnA := connectGoSessions(t, urlA, alice, "alice-on-a")
	if v := readSession(t, aliceOnA, secret.SessionID, false); v.State != "blocked" {
		t.Fatalf("alice reads her session through gw-a: %+v", v)
	}
	malloryOnA := connectGoSessions(t, urlA, mallory, "mallory-on-a")
	callRefused(t, malloryOnA, "sessions", map[string]any{"verb": "read", "sessionId": secret.SessionID}, "not_owner")
	page, err := url.Parse(secret.Link)
	if err != nil || secret.Link == "" {
		t.Fatalf("alice's session link %q: %v", secret.Link, err)
	}
	page.Host = hostA
	resp, err := shortClient.Get(page.String())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), secret.SessionID) || !strings.Contains(string(body), it.RequestID) {
		t.Fatalf("alice's session page through gw-a: %d %s", resp.StatusCode, tail(string(body), 300))
	}

	rpc := newSessionsRPC(t, natsURL, rawKey)
	read := func(caller map[string]any) map[string]any {
		return map[string]any{"caller": caller, "id": secret.SessionID, "full": true}
	}
	t.Run("the earlier release's form", func(t *testing.T) {
		owner := map[string]any{"TokenID": mallorysID, "TokenName": "mallory", "ID": mallorysID, "OtherSessions": 2, "OtherInteractions": 2}
		if rpc.earlierReleaseListens(t, "gw-b") {
			got := earlierRelease(t, natsURL, rawKey, "gw-b", "read", map[string]any{"owner": owner, "id": secret.SessionID})
			t.Fatalf("gw-b takes the earlier release's requests, and answered mallory claiming the engine's access to every session: %s %s %s", got.Code, got.Error, got.Result)
		}
		got := rpc.call(t, "gw-b", "read", map[string]any{"owner": owner, "id": secret.SessionID})
		if got.Code != "caller_refused" || strings.Contains(string(got.Result), secret.SessionID) {
			t.Fatalf("the earlier release's form on this release's subject: %+v, want caller_refused", got)
		}
		b.WaitForLog(t, `"rpc_verb":"read"`, 10*time.Second)
	})
	for _, tc := range []struct {
		name   string
		caller map[string]any
		reason string
		says   string
	}{
		{"her token claiming sessions:any", map[string]any{"token": mallorysID, "scopes": []string{"chat", "sessions:any"}, "sessions": 2}, "rpc_scopes", "sessions:any"},
		{"her token claiming the reach of sessions:any", map[string]any{"token": mallorysID, "scopes": []string{"chat"}, "sessions": 2}, "rpc_scopes", "every owner's sessions"},
		{"a token no replica knows", map[string]any{"token": "tok_00000000deadbeef", "scopes": []string{"chat"}}, "rpc_principal", "tok_00000000deadbeef"},
		{"a page's reader without a capability", map[string]any{"sessions": 1, "interactions": 1}, "rpc_principal", "capability"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rpc.call(t, "gw-b", "read", read(tc.caller))
			if got.Code != "caller_refused" || !strings.Contains(got.Error, tc.says) || len(got.Result) > 0 {
				t.Fatalf("%+v, want caller_refused saying %q", got, tc.says)
			}
			b.WaitForLog(t, `"reason":"`+tc.reason+`"`, 10*time.Second)
		})
	}
	t.Run("a token revoked through the other replica", func(t *testing.T) {
		if _, stderr, err := a.Run(t, "zidane", "token", "revoke", "carol"); err != nil {
			t.Fatalf("token revoke on gw-a: %v %s", err, stderr)
		}
		// gw-b knows it revoked once it refuses the token itself.
		waitStatus(t, urlB, carol, http.StatusUnauthorized, 20*time.Second)
		got := rpc.call(t, "gw-b", "read", read(map[string]any{"token": carolsID, "scopes": []string{"chat"}}))
		if got.Code != "caller_refused" || !strings.Contains(got.Error, "revoked") {
			t.Fatalf("%+v, want caller_refused saying revoked", got)
		}
	})
	t.Run("her token, as she holds it, acting on alice's session", func(t *testing.T) {
		mine := map[string]any{"token": mallorysID, "scopes": []string{"chat"}}
		for verb, args := range map[string]map[string]any{
			"send":   {"caller": mine, "id": secret.SessionID, "text": "mallory was here"},
			"answer": {"caller": mine, "id": it.RequestID, "answer": map[string]any{"decision": "allow"}},
			"cancel": {"caller": mine, "id": secret.SessionID},
		} {
			if got := rpc.call(t, "gw-b", verb, args); got.Code != "not_owner" {
				t.Fatalf("%s: %+v, want the engine's not_owner", verb, got)
			}
		}
	})

	// Alice's session is as she left it.
	if v := readSession(t, aliceOnB, secret.SessionID, false); v.State != "blocked" || v.Queued != 0 {
		t.Fatalf("alice's session after mallory's requests: %+v", v)
	}
	if still := onlyPending(t, aliceOnB, secret.SessionID); still.RequestID != it.RequestID {
		t.Fatalf("alice's interaction after mallory's requests: %+v", still)
	}
	for _, turn := range transcriptOf(t, aliceOnB, secret.SessionID, nil).Turns {
		if strings.Contains(turn.Prompt, "mallory") {
			t.Fatalf("mallory's prompt reached alice's session: %+v", turn)
		}
	}
}

// sessionsJWTReplicaCaddyfile is sessionsReplicaCaddyfile taking the
// identity provider p's JWTs for resource, the same on every replica.
func sessionsJWTReplicaCaddyfile(natsURL, identity, host, resource string, p *idp) string {
	return fmt.Sprintf(`{
	admin %s
	grace_period 3s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			%s
		}
		default_agent demo
	}
}

http://%s {
	zidane_mcp {
		sessions
		resource %s
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
	}
}
`, AdminPlaceholder, natsURL, identity, host, resource, p.issuer, p.jwksURL)
}

// A JWT principal's requests to the replica that runs its session carry
// its access token, which that replica verifies itself. Alice's session,
// created with her JWT through gw-b, is read and steered through gw-a;
// with the cluster key, a request for jwt:alice without her JWT, with
// Bob's, or claiming a scope her JWT does not grant, is refused by gw-b.
func TestClusterSessionRequestsVerifyJWT(t *testing.T) {
	natsURL := startNATSServer(t)
	p := startIDP(t)
	rawKey := []byte(randomHex(16))
	key := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(rawKey)
	const resource = "https://mcp.example.test/mcp"
	hostA := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	hostB := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startCaddy(t, sessionsJWTReplicaCaddyfile(natsURL, replicaIdentity("gw-a", hostA), hostA, resource, p), key)
	b := startCaddy(t, sessionsJWTReplicaCaddyfile(natsURL, replicaIdentity("gw-b", hostB), hostB, resource, p), key)
	urlA, urlB := "http://"+hostA+"/mcp", "http://"+hostB+"/mcp"
	now := time.Now()
	jwtOf := func(sub string) string {
		return p.token(t, jwt.MapClaims{"iss": p.issuer, "aud": resource, "sub": sub, "scope": "chat",
			"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()})
	}
	alice, bob := jwtOf("alice"), jwtOf("bob")
	for _, u := range []string{urlA, urlB} {
		waitStatus(t, u, alice, http.StatusOK, 20*time.Second)
	}
	onB := connectGoSessions(t, urlB, alice, "alice-on-b")
	s := createSession(t, onB, t.TempDir(), "hello")
	if !sessionIDOn("gw-b").MatchString(s.SessionID) {
		t.Fatalf("alice's session %q does not run on gw-b", s.SessionID)
	}
	settleIn(t, onB, s.SessionID, "idle")
	onA := connectGoSessions(t, urlA, alice, "alice-on-a")
	if v := readSession(t, onA, s.SessionID, false); v.SessionID != s.SessionID {
		t.Fatalf("alice reads her session through gw-a: %+v", v)
	}
	sendPrompt(t, onA, s.SessionID, "again, through gw-a")
	if v := settleIn(t, onA, s.SessionID, "idle"); v.LastMessage != "You said: again, through gw-a" {
		t.Fatalf("alice's prompt through gw-a: %+v", v)
	}

	rpc := newSessionsRPC(t, natsURL, rawKey)
	for _, tc := range []struct {
		name   string
		caller map[string]any
		reason string
	}{
		{"without the JWT", map[string]any{"token": "jwt:alice", "scopes": []string{"chat"}}, "rpc_principal"},
		{"with another subject's JWT", map[string]any{"token": "jwt:alice", "scopes": []string{"chat"}, "credential": bob}, "rpc_principal"},
		{"claiming a scope the JWT does not grant", map[string]any{"token": "jwt:alice", "scopes": []string{"chat", "sessions:any"}, "credential": alice, "sessions": 2}, "rpc_scopes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rpc.call(t, "gw-b", "read", map[string]any{"caller": tc.caller, "id": s.SessionID})
			if got.Code != "caller_refused" || len(got.Result) > 0 {
				t.Fatalf("%+v, want caller_refused", got)
			}
			b.WaitForLog(t, `"reason":"`+tc.reason+`"`, 10*time.Second)
		})
	}
}
