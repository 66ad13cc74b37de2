package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
)

// rotation is a load balancer without affinity whose hosts can be taken
// out, as its health checks would take out a replica that died.
type rotation struct {
	mu     sync.Mutex
	hosts  []string
	n      int
	counts map[string]int
}

func (rt *rotation) remove(host string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.hosts = slices.DeleteFunc(rt.hosts, func(h string) bool { return h == host })
}

func (rt *rotation) count(host string) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.counts[host]
}

func (rt *rotation) RoundTrip(r *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	host := rt.hosts[rt.n%len(rt.hosts)]
	rt.n++
	rt.counts[host]++
	rt.mu.Unlock()
	r = r.Clone(r.Context())
	r.URL.Host = host
	r.Host = host
	return http.DefaultTransport.RoundTrip(r)
}

// clusterAggregateReplica runs one replica of an aggregated route over
// upstream ev on NATS storage, as node id at its own loopback address.
func clusterAggregateReplica(t *testing.T, natsURL, upstream, node, clusterKey string) (c *Caddy, host string) {
	t.Helper()
	host = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c = startCaddy(t, fmt.Sprintf(`{
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
	}
}
`, AdminPlaceholder, natsURL, node, host, upstream, host), clusterKey)
	return c, host
}

// The aggregated route's 2025-11-25 sessions live in the memory of the
// replica that opened them; on NATS storage any replica serves them: it
// runs the edge and forwards the request to the session's replica (named,
// sealed, in the session id; found in the node registry), streaming the
// answer. One go-sdk session round-robined over three replicas runs
// initialize, its standalone GET stream, tools/list and tools/call (with
// progress notifications on the answer's SSE stream); a GET stream opened
// through a replica that does not hold the session streams, and a DELETE
// through another ends the session. When the
// replica that holds it is killed, the session gets 404 on the others and
// the client initializes again on a replica that lives.
func TestClusterForwardsAggregatedLegacySessions(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startEverythingServer(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	var replicas []*Caddy
	var hosts []string
	for i := range 3 {
		c, host := clusterAggregateReplica(t, natsURL, upstream, fmt.Sprintf("gw-%d", i), clusterKey)
		replicas = append(replicas, c)
		hosts = append(hosts, host)
	}
	token := createToken(t, replicas[0], "lb", "--scope", "mcp")
	for _, h := range hosts {
		waitStatus(t, "http://"+h+"/mcp", token, http.StatusOK, 20*time.Second)
	}
	rt := &rotation{hosts: slices.Clone(hosts), counts: map[string]int{}}
	hc := bearerClient(token, rt)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var progress atomic.Int64
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-forward", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
	})
	// The first request, initialize, goes to replica 0: the session is its.
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + hosts[0] + "/mcp", HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: legacyVersion})
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	defer cs.Close()
	if v := cs.InitializeResult().ProtocolVersion; v != legacyVersion {
		t.Fatalf("negotiated %q, want %s", v, legacyVersion)
	}
	sid := cs.ID()
	for i := range 6 {
		tools, err := cs.ListTools(ctx, nil)
		if err != nil || !slices.ContainsFunc(tools.Tools, func(tl *mcp.Tool) bool { return tl.Name == "mcp_ev_test_simple_text" }) {
			t.Fatalf("tools/list %d: %v", i, err)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_ev_test_simple_text"})
		if err != nil || res.IsError {
			t.Fatalf("tools/call %d: %v %+v", i, err, res)
		}
	}
	before := progress.Load()
	for i := range 3 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_ev_test_tool_with_progress", Meta: mcp.Meta{"progressToken": fmt.Sprintf("p%d", i)}})
		if err != nil || res.IsError {
			t.Fatalf("tools/call with progress %d: %v %+v", i, err, res)
		}
	}
	if progress.Load() == before {
		t.Fatal("no progress notification reached the client through the replicas")
	}
	for i, h := range hosts {
		if rt.count(h) < 3 {
			t.Fatalf("replica %d got %d requests: the load balancer did not spread them", i, rt.count(h))
		}
	}
	t.Logf("one session, requests per replica: %d %d %d; %d progress notifications", rt.count(hosts[0]), rt.count(hosts[1]), rt.count(hosts[2]), progress.Load()-before)

	// The go-sdk client holds its session's one GET stream (opened through
	// whichever replica came next). Another session, opened on replica 0,
	// gets a GET stream through replica 2, which does not hold it: its
	// headers arrive while it is open, so it streams.
	raw := post(t, "http://"+hosts[0]+"/mcp", token, initializeBody)
	rawSID := raw.header.Get("Mcp-Session-Id")
	if raw.status != http.StatusOK || rawSID == "" {
		t.Fatalf("initialize on replica 0: %d", raw.status)
	}
	post(t, "http://"+hosts[1]+"/mcp", token, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", rawSID, "Mcp-Protocol-Version", legacyVersion)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+hosts[2]+"/mcp", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", rawSID)
	req.Header.Set("Mcp-Protocol-Version", legacyVersion)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET stream through replica 2: %v", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("GET stream through replica 2: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp.Body.Close()
	// DELETE through replica 1 ends that session on replica 0: replica 2
	// then gets 404 for it.
	del, _ := http.NewRequestWithContext(ctx, http.MethodDelete, "http://"+hosts[1]+"/mcp", nil)
	del.Header.Set("Authorization", "Bearer "+token)
	del.Header.Set("Mcp-Session-Id", rawSID)
	del.Header.Set("Mcp-Protocol-Version", legacyVersion)
	dresp, err := shortClient.Do(del)
	if err != nil || dresp.StatusCode >= 300 {
		t.Fatalf("DELETE through replica 1: %v %v", err, dresp)
	}
	dresp.Body.Close()
	if got := post(t, "http://"+hosts[2]+"/mcp", token, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, "Mcp-Session-Id", rawSID, "Mcp-Protocol-Version", legacyVersion); got.status != http.StatusNotFound {
		t.Fatalf("the deleted session through replica 2: %d, want 404", got.status)
	}

	// Another token does not reach the session through another replica.
	other := createToken(t, replicas[0], "other", "--scope", "mcp")
	waitStatus(t, "http://"+hosts[1]+"/mcp", other, http.StatusOK, 20*time.Second)
	got := post(t, "http://"+hosts[1]+"/mcp", other, `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)
	if got.status != http.StatusNotFound {
		t.Fatalf("the session with another token through replica 1: %d, want 404", got.status)
	}
	// Without a token, the edge refuses it before any forwarding.
	if got := post(t, "http://"+hosts[1]+"/mcp", "", `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion); got.status != http.StatusUnauthorized {
		t.Fatalf("the session without a token through replica 1: %d, want 401", got.status)
	}

	// Replica 0 dies; the load balancer takes it out.
	_ = syscall.Kill(-replicas[0].proc.cmd.Process.Pid, syscall.SIGKILL)
	rt.remove(hosts[0])
	for _, h := range hosts[1:] {
		got := post(t, "http://"+h+"/mcp", token, `{"jsonrpc":"2.0","id":10,"method":"tools/list"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)
		if got.status != http.StatusNotFound || !strings.Contains(got.body, "initializ") {
			t.Fatalf("the dead replica's session through %s: %d %s, want 404 telling to initialize again", h, got.status, got.body)
		}
	}
	// Within the registry's TTL the others know it dead, and answer
	// without trying it.
	killed := time.Now()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := post(t, "http://"+hosts[1]+"/mcp", token, `{"jsonrpc":"2.0","id":11,"method":"tools/list"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)
		if got.status == http.StatusNotFound && strings.Contains(got.body, "is gone") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica 1 still tries the dead replica 20s after it died: %d %s", got.status, got.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the dead replica known gone by replica 1 %v after the kill", time.Since(killed).Round(100*time.Millisecond))
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_ev_test_simple_text"}); err == nil {
		t.Fatal("a call on the dead replica's session succeeded")
	}
	// The client initializes again, on a replica that lives, and goes on
	// round-robin over the two.
	cs2, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + hosts[1] + "/mcp", HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: legacyVersion})
	if err != nil {
		t.Fatalf("initialize again after the replica died: %v", err)
	}
	defer cs2.Close()
	for i := range 6 {
		if res, err := cs2.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_ev_test_simple_text"}); err != nil || res.IsError {
			t.Fatalf("tools/call %d on the new session: %v %+v", i, err, res)
		}
	}
}

// A request carrying the replicas' hop headers from a client (made up, or
// a real hop's headers replayed with another body) is refused 401 with an
// audit line, on the aggregated route and on any other site.
func TestClusterHopHeadersFromAClientAreRefused(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startEverythingServer(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	a, hostA := clusterAggregateReplica(t, natsURL, upstream, "gw-a", clusterKey)
	_, hostB := clusterAggregateReplica(t, natsURL, upstream, "gw-b", clusterKey)
	token := createToken(t, a, "c", "--scope", "mcp")
	waitStatus(t, "http://"+hostB+"/mcp", token, http.StatusOK, 20*time.Second)
	init := post(t, "http://"+hostA+"/mcp", token, initializeBody)
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != http.StatusOK || sid == "" {
		t.Fatalf("initialize on A: %d", init.status)
	}
	for name, hop := range map[string]string{
		"made up": "v3;from=gw-b;to=gw-a;t=" + fmt.Sprint(time.Now().UnixMilli()) + ";n=0123456789abcdef0123456789abcdef;c=127.0.0.1;mac=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"garbage": "let me in",
	} {
		t.Run(name, func(t *testing.T) {
			// Straight to the owner, with no token: the hop headers are
			// the only credential.
			got := post(t, "http://"+hostA+"/mcp", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
				"Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion,
				"Zidane-Hop", hop, "Zidane-Hop-Principal", base64.RawURLEncoding.EncodeToString([]byte(`{"id":"tok_admin","scopes":["mcp","admin"]}`)))
			if got.status != http.StatusUnauthorized || strings.Contains(got.body, "tools") && !strings.Contains(got.body, "error") {
				t.Fatalf("a client's hop headers: %d %s, want 401", got.status, got.body)
			}
		})
	}
	a.WaitForLog(t, `"reason":"hop_forged"`, 10*time.Second)
	a.WaitForLog(t, `"reason":"hop_malformed"`, 10*time.Second)
}

// An aggregated route on NATS storage needs advertise: without it the
// other replicas could not reach its sessions.
func TestClusterAggregateNeedsAdvertise(t *testing.T) {
	natsURL := startNATSServer(t)
	c := startCaddy(t, fmt.Sprintf("{\n\tadmin %s\n}\n\nhttp://127.0.0.1:%d {\n\trespond ok\n}\n", AdminPlaceholder, freePort(t)),
		"ZIDANE_CLUSTER_KEY="+base64.StdEncoding.EncodeToString([]byte(randomHex(16))))
	out, err := c.TryReload(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
		}
		upstream ev http://127.0.0.1:9/mcp
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate ev
	}
}
`, AdminPlaceholder, natsURL, freePort(t)))
	if err == nil || !strings.Contains(out, "set advertise") {
		t.Fatalf("an aggregated route on NATS storage without advertise: %v\n%s", err, out)
	}
}

// testHop signs hops as a replica does, written here from the wire format
// (not with the gateway's code), with the cluster key the test gave the
// replicas: what a peer holding the key could send. principal is the
// Zidane-Hop-Principal header (hopPrincipal), credential a JWT principal's
// access token ("" for none).
type testHop struct {
	key   []byte
	route string
}

func (h testHop) sign(t *testing.T, req *http.Request, body, from, to string, at time.Time, nonce, principal, credential string) {
	t.Helper()
	m := hmac.New(sha256.New, h.key)
	field := func(s string) {
		m.Write(binary.AppendUvarint(nil, uint64(len(s))))
		m.Write([]byte(s))
	}
	ts := strconv.FormatInt(at.UnixMilli(), 10)
	// The client's address as the sending edge saw it: for the owner's
	// audit lines.
	const client = "127.0.0.9"
	field("zidane aggregate hop v3")
	for _, s := range []string{req.Method, req.URL.RequestURI(), h.route, req.Header.Get("Mcp-Session-Id"), from, to, ts, nonce, principal, credential, client} {
		field(s)
	}
	d := sha256.Sum256([]byte(body))
	field(string(d[:]))
	for _, name := range []string{"Accept", "Content-Type", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID", "Mcp-Method", "Mcp-Name", "DPoP"} {
		vs := req.Header.Values(name)
		field(strconv.Itoa(len(vs)))
		for _, v := range vs {
			field(v)
		}
	}
	// Then every Mcp-Param-* header, by canonical name, sorted.
	var params []string
	for name := range req.Header {
		if strings.HasPrefix(name, "Mcp-Param-") {
			params = append(params, name)
		}
	}
	slices.Sort(params)
	field(strconv.Itoa(len(params)))
	for _, name := range params {
		field(name)
		field(strconv.Itoa(len(req.Header[name])))
		for _, v := range req.Header[name] {
			field(v)
		}
	}
	// Then, when the hop names one, the approval or round that settled
	// an approved call.
	if vs := req.Header.Values("Zidane-Hop-Settled"); len(vs) > 0 {
		field("settled")
		field(strconv.Itoa(len(vs)))
		for _, v := range vs {
			field(v)
		}
	}
	req.Header.Set("Zidane-Hop", "v3;from="+from+";to="+to+";t="+ts+";n="+nonce+";c="+client+";mac="+base64.RawURLEncoding.EncodeToString(m.Sum(nil)))
	req.Header.Set("Zidane-Hop-Principal", principal)
	if credential != "" {
		req.Header.Set("Zidane-Hop-Credential", credential)
	}
}

// Session ids that name a node are refused 404 unless the cluster key
// sealed them for this route and a live node. Hops signed here with the
// cluster key, straight to the owner: a
// correctly signed hop from a registered node is served (so the signer is
// right, and the refusals below are the owner's checks); the session stays
// bound to its token even then (another token's principal gets 404); the
// same hop again, a hop from a node the registry does not know, one with
// its body altered, one dated outside the window, one meant for another
// node or another route are refused, each with an audit line.
func TestClusterHopChecks(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startEverythingServer(t)
	rawKey := []byte(randomHex(16))
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(rawKey)
	a, hostA := clusterAggregateReplica(t, natsURL, upstream, "gw-a", clusterKey)
	_, hostB := clusterAggregateReplica(t, natsURL, upstream, "gw-b", clusterKey)
	token := createToken(t, a, "c", "--scope", "mcp")
	createToken(t, a, "d", "--scope", "mcp")
	waitStatus(t, "http://"+hostB+"/mcp", token, http.StatusOK, 20*time.Second)
	list, _, err := a.Run(t, "zidane", "token", "list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var toks []struct{ ID, Name string }
	if err := json.Unmarshal([]byte(list), &toks); err != nil {
		t.Fatalf("token list: %v\n%s", err, list)
	}
	tokenID, otherID := "", ""
	for _, tk := range toks {
		switch tk.Name {
		case "c":
			tokenID = tk.ID
		case "d":
			otherID = tk.ID
		}
	}
	init := post(t, "http://"+hostA+"/mcp", token, initializeBody)
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != http.StatusOK || sid == "" || tokenID == "" {
		t.Fatalf("initialize on A: %d (token id %q)", init.status, tokenID)
	}
	post(t, "http://"+hostA+"/mcp", token, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion)

	// Session ids that name a node without the cluster key's seal name
	// none: refused 404 on B, never forwarded. One sealed with the key
	// for a node the registry does not know gets 404 too.
	sk, err := cluster.Derive(rawKey, "session ids")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := sessionid.New(sk)
	if err != nil {
		t.Fatal(err)
	}
	flipped := []byte(sid)
	flipped[len(flipped)/2] ^= 1
	for _, tc := range []struct{ name, sid, reason string }{
		{"a node id in plain text", "gw-a/" + randomHex(16), "session_unknown"},
		{"base64 of a node id", base64.RawURLEncoding.EncodeToString([]byte("gw-a/" + randomHex(16))), "session_unknown"},
		{"A's session id altered", string(flipped), "session_unknown"},
		{"sealed for A on another route", ids.Seal("gw-a/"+randomHex(16), "", "aggregate-node|/mcp||other"), "session_unknown"},
		{"sealed for an unknown node", ids.Seal("gw-x/"+randomHex(16), "", "aggregate-node|/mcp||ev"), "session_node_gone"},
	} {
		got := post(t, "http://"+hostB+"/mcp", token, `{"jsonrpc":"2.0","id":4,"method":"tools/list"}`, "Mcp-Session-Id", tc.sid, "Mcp-Protocol-Version", legacyVersion)
		if got.status != http.StatusNotFound || !strings.Contains(got.body, `"reason":"`+tc.reason+`"`) {
			t.Errorf("%s through B: %d %s, want 404 %s", tc.name, got.status, tail(got.body, 200), tc.reason)
		}
	}

	hk, err := cluster.Derive(rawKey, "aggregate hop v1")
	if err != nil {
		t.Fatal(err)
	}
	hop := testHop{key: hk, route: "aggregate-node|/mcp||ev"}
	principal := func(id string) string { return hopPrincipal(id, "mcp") }
	const body = `{"jsonrpc":"2.0","id":5,"method":"tools/list"}`
	send := func(sign func(req *http.Request), sentBody string) rawAnswer {
		req, _ := http.NewRequest(http.MethodPost, "http://"+hostA+"/mcp", strings.NewReader(sentBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", legacyVersion)
		sign(req)
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return rawAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}
	nonce := func() string { return randomHex(16) }

	// B is registered once A sees it: wait for a signed hop from B to pass.
	var ok rawAnswer
	var okHop http.Header
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok = send(func(req *http.Request) {
			hop.sign(t, req, body, "gw-b", "gw-a", time.Now(), nonce(), principal(tokenID), "")
			okHop = req.Header.Clone()
		}, body)
		if ok.status != http.StatusForbidden || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ok.status != http.StatusOK || !strings.Contains(ok.body, "mcp_ev_test_simple_text") {
		t.Fatalf("a correctly signed hop from gw-b: %d %s", ok.status, tail(ok.body, 400))
	}
	for _, tc := range []struct {
		name   string
		sign   func(req *http.Request)
		body   string
		status int
		reason string
	}{
		{"the same hop again", func(req *http.Request) {
			req.Header.Set("Zidane-Hop", okHop.Get("Zidane-Hop"))
			req.Header.Set("Zidane-Hop-Principal", okHop.Get("Zidane-Hop-Principal"))
		}, body, http.StatusUnauthorized, "hop_replayed"},
		{"from a node not in the registry", func(req *http.Request) {
			hop.sign(t, req, body, "gw-x", "gw-a", time.Now(), nonce(), principal(tokenID), "")
		}, body, http.StatusForbidden, "hop_unknown_node"},
		{"its body altered", func(req *http.Request) {
			hop.sign(t, req, body, "gw-b", "gw-a", time.Now(), nonce(), principal(tokenID), "")
		}, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"mcp_ev_test_simple_text"}}`, http.StatusUnauthorized, "hop_forged"},
		{"dated a minute ago", func(req *http.Request) {
			hop.sign(t, req, body, "gw-b", "gw-a", time.Now().Add(-time.Minute), nonce(), principal(tokenID), "")
		}, body, http.StatusUnauthorized, "hop_stale"},
		{"meant for gw-b", func(req *http.Request) {
			hop.sign(t, req, body, "gw-b", "gw-b", time.Now(), nonce(), principal(tokenID), "")
		}, body, http.StatusUnauthorized, "hop_misdirected"},
		{"for another route", func(req *http.Request) {
			testHop{key: hk, route: "aggregate-node|/mcp||other"}.sign(t, req, body, "gw-b", "gw-a", time.Now(), nonce(), principal(tokenID), "")
		}, body, http.StatusUnauthorized, "hop_forged"},
		{"another token's principal", func(req *http.Request) {
			hop.sign(t, req, body, "gw-b", "gw-a", time.Now(), nonce(), principal(otherID), "")
		}, body, http.StatusNotFound, ""},
		{"a token no replica made", func(req *http.Request) {
			hop.sign(t, req, body, "gw-b", "gw-a", time.Now(), nonce(), principal("tok_someoneelse"), "")
		}, body, http.StatusUnauthorized, "hop_principal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := send(tc.sign, tc.body)
			if got.status != tc.status || !strings.Contains(got.body, tc.reason) {
				t.Fatalf("%d %s, want %d %s", got.status, tail(got.body, 300), tc.status, tc.reason)
			}
			if tc.reason != "" {
				a.WaitForLog(t, `"reason":"`+tc.reason+`"`, 10*time.Second)
			}
		})
	}

	// Whatever shares a replica's address (an agent's shell on its host)
	// sends bad hops until that address's bucket is empty: bad hops are
	// then refused 429, and a hop that verifies is still served.
	limited := false
	for range 40 {
		got := send(func(req *http.Request) {
			hop.sign(t, req, body, "gw-b", "gw-a", time.Now(), nonce(), principal(tokenID), "")
			req.Header.Set("Zidane-Hop", strings.Replace(req.Header.Get("Zidane-Hop"), "mac=", "mac=00", 1))
		}, body)
		if got.status == http.StatusTooManyRequests {
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("40 bad hops from one address were never rate limited")
	}
	if got := send(func(req *http.Request) {
		hop.sign(t, req, body, "gw-b", "gw-a", time.Now(), nonce(), principal(tokenID), "")
	}, body); got.status != http.StatusOK {
		t.Fatalf("a correctly signed hop after bad ones from its address: %d %s", got.status, tail(got.body, 300))
	}
}

// A 2026-07-28 client needs no affinity on the aggregated route even when
// a call to a 2025-11-25 upstream asks it for input: the pending call lives
// on the replica that made it, whose node the requestState seals (with a
// key every replica derives from the cluster key), and a retry that reaches
// another replica is forwarded there over the hop. A go-sdk client
// round-robined over two replicas has its elicitation answered and the
// call completed; a retry of another token's state, through the replica
// that does not hold it, is refused by the one that does.
func TestClusterBridgedRetryOnAnotherReplica(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startEverythingServer(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	a, hostA := clusterAggregateReplica(t, natsURL, upstream, "gw-a", clusterKey)
	_, hostB := clusterAggregateReplica(t, natsURL, upstream, "gw-b", clusterKey)
	token := createToken(t, a, "mrtr", "--scope", "mcp")
	other := createToken(t, a, "other", "--scope", "mcp")
	const tool = "mcp_ev_test_input_required_result_elicitation"
	for _, h := range []string{hostA, hostB} {
		waitStatus(t, "http://"+h+"/mcp", token, http.StatusOK, 20*time.Second)
		waitStatus(t, "http://"+h+"/mcp", other, http.StatusOK, 20*time.Second)
		waitForAggregate(t, "http://"+h+"/mcp", token, tool)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	rt := &rotation{hosts: []string{hostA, hostB}, counts: map[string]int{}}
	asked := 0
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-mrtr", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked++
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "Ada"}}, nil
		}}).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + hostA + "/mcp", HTTPClient: bearerClient(token, rt), MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: modernVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for i := range 3 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool})
		if err != nil || res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "Ada") {
			t.Fatalf("call %d round-robined over two replicas: %v %+v", i, err, res)
		}
	}
	if asked != 3 || rt.count(hostA) == 0 || rt.count(hostB) == 0 {
		t.Fatalf("asked %d times (want 3); requests to A %d, to B %d", asked, rt.count(hostA), rt.count(hostB))
	}

	// By hand: the first call through A, the retry through B.
	modern := []string{"Mcp-Protocol-Version", modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", tool}
	first := post(t, "http://"+hostA+"/mcp", token, modernCall(tool, ""), modern...)
	var res struct {
		Result struct {
			RequestState  string                     `json:"requestState"`
			InputRequests map[string]json.RawMessage `json:"inputRequests"`
		} `json:"result"`
	}
	data := first.body
	if i := strings.Index(data, "data: "); i >= 0 { // an SSE answer: its one message
		data, _, _ = strings.Cut(data[i+len("data: "):], "\n")
	}
	if err := json.Unmarshal([]byte(data), &res); err != nil || res.Result.RequestState == "" || len(res.Result.InputRequests) != 1 {
		t.Fatalf("first call through A: %d %s", first.status, first.body)
	}
	var key string
	for k := range res.Result.InputRequests {
		key = k
	}
	retry := modernCall(tool, fmt.Sprintf(`,"requestState":%q,"inputResponses":{%q:{"action":"accept","content":{"name":"Grace"}}}`, res.Result.RequestState, key))
	// Another token's retry through B reaches A, which refuses it.
	if got := post(t, "http://"+hostB+"/mcp", other, retry, modern...); got.rpc.Error.Code != -32602 || !strings.Contains(got.rpc.Error.Message, "another token") {
		t.Fatalf("another token's retry through B: %d %s", got.status, got.body)
	}
	if got := post(t, "http://"+hostB+"/mcp", token, retry, modern...); got.status != http.StatusOK || !strings.Contains(got.body, "Grace") {
		t.Fatalf("the retry through B: %d %s", got.status, got.body)
	}
}
