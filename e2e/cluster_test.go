package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var (
	natsServerOnce sync.Once
	natsServerBin  string
	natsServerErr  error
)

// natsServer is a real nats-server process with JetStream.
type natsServer struct {
	url, addr, dir string
	p              *process
}

// startNATSServer runs a real nats-server (built from the version go.mod
// pins, on first use) with JetStream on a free loopback port, and returns
// its client URL.
func startNATSServer(t testing.TB) string {
	t.Helper()
	return startNATS(t).url
}

// buildNATSServer builds nats-server once for the run.
func buildNATSServer(t testing.TB) {
	t.Helper()
	natsServerOnce.Do(func() {
		natsServerBin = filepath.Join(filepath.Dir(caddyBin), "nats-server")
		natsServerErr = goBuild(natsServerBin, "github.com/nats-io/nats-server/v2")
	})
	if natsServerErr != nil {
		t.Fatalf("building nats-server: %v", natsServerErr)
	}
}

func startNATS(t testing.TB) *natsServer {
	t.Helper()
	buildNATSServer(t)
	n := &natsServer{addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), dir: t.TempDir()}
	n.url = "nats://" + n.addr
	n.start(t)
	t.Cleanup(func() {
		if n.p != nil {
			n.p.stop(2 * time.Second)
			n.p.dumpIfFailed(t)
		}
	})
	return n
}

// start starts the server on its address and store directory.
func (n *natsServer) start(t testing.TB) {
	t.Helper()
	host, port, _ := strings.Cut(n.addr, ":")
	cmd := exec.Command(natsServerBin, "-a", host, "-p", port, "-js", "-sd", filepath.Join(n.dir, "js"))
	cmd.Dir = n.dir
	n.p = startProcess(t, "nats-server", cmd, filepath.Join(n.dir, "nats-server.log"))
	waitListening(t, n.p, n.addr, startTimeout)
}

// stop stops the server; start brings it back with what it stored.
func (n *natsServer) stop() {
	n.p.stop(2 * time.Second)
	n.p = nil
}

// waitStatus polls url with token until it answers want, for at most
// bound, and returns how long that took.
func waitStatus(t *testing.T, url, token string, want int, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	status := 0
	for time.Since(start) < bound {
		if status = post(t, url, token, initializeBody).status; status == want {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s answered %d for %s, want %d", url, status, bound, want)
	return 0
}

// Two replicas on one NATS storage (storage zidane_nats) share their
// tokens: one made on A works on B, and one revoked on A stops working on
// B. The CLI refuses to write the local storage behind their backs, and a
// sessions site is refused on shared storage without a node id and
// address, where the replicas could not tell whose sessions are whose.
func TestClusterStorageSharesTokens(t *testing.T) {
	natsURL := startNATSServer(t)
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
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
	}
	reverse_proxy %s
}
`, AdminPlaceholder, natsURL, site, up.addr), clusterKey)
		return c, "http://" + site + "/mcp"
	}
	a, urlA := replica()
	b, urlB := replica()

	stdout, stderr, err := a.Run(t, "zidane", "token", "create", "--name", "shared", "--scope", "mcp")
	if err != nil {
		t.Fatalf("token create on A: %v %s", err, stderr)
	}
	token := strings.TrimSpace(stdout)
	if got := post(t, urlA, token, initializeBody).status; got != http.StatusOK {
		t.Fatalf("A refused its own token: %d", got)
	}
	made := waitStatus(t, urlB, token, http.StatusOK, 20*time.Second)

	if _, stderr, err := a.Run(t, "zidane", "token", "revoke", "shared"); err != nil {
		t.Fatalf("token revoke on A: %v %s", err, stderr)
	}
	revoked := waitStatus(t, urlB, token, http.StatusUnauthorized, 20*time.Second)
	t.Logf("a token made on A worked on B after %v; revoked on A, it failed on B after %v", made.Round(time.Millisecond), revoked.Round(time.Millisecond))

	// Offline, the CLI would write the local file storage, which neither
	// replica reads: it refuses, and says what to do.
	offline := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	_, stderr, err = b.Run(t, "zidane", "token", "create", "--name", "offline", "--scope", "mcp", "--address", offline)
	if err == nil || !strings.Contains(stderr, "NATS") || !strings.Contains(stderr, "--address") {
		t.Fatalf("offline token create on a NATS-storage host: err %v, stderr %q; want a refusal that names NATS and --address", err, stderr)
	}
	list, _, err := a.Run(t, "zidane", "token", "list", "--json")
	if err != nil || strings.Contains(list, `"offline"`) {
		t.Fatalf("token list after the refused offline create: %v %s", err, list)
	}

	out, err := a.TryReload(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			lock_ttl 5s
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
	}
}
`, AdminPlaceholder, natsURL, freePort(t)))
	if err == nil || !strings.Contains(out, "set `node`") || !strings.Contains(out, "`advertise`") {
		t.Fatalf("a sessions site on NATS storage without a node was not refused: %v\n%s", err, out)
	}
	if got := post(t, urlA, "", initializeBody).status; got != http.StatusUnauthorized {
		t.Fatalf("A's config after the refused reload: %d, want its guard's 401", got)
	}
}

// Cluster mode is storage zidane_nats with the cluster's settings, in its
// block or (the former shape) in the zidane option's cluster block. Bad
// cluster settings (given twice: TestClusterStorageExportImport), and the
// cluster block without the storage or the storage without settings are refused before
// anything connects, with what to set: the cluster block on the file
// storage would keep TLS certificates, and anything else that Caddy keeps,
// per replica; the storage line alone has nothing to connect to.
func TestClusterStorageBadSettings(t *testing.T) {
	c := startCaddy(t, fmt.Sprintf("{\n\tadmin %s\n}\n\nhttp://127.0.0.1:%d {\n\trespond ok\n}\n", AdminPlaceholder, freePort(t)))
	cluster := func(lines string) string {
		return "storage zidane_nats\n\tzidane {\n\t\tcluster {\n\t\t" + lines + "\n\t\t}\n\t}"
	}
	for _, bad := range []struct{ globals, want string }{
		{cluster("url nats://10.0.0.9:4222"), "not loopback"},
		{cluster("url nats://user:secret@127.0.0.1:4222"), "creds file"},
		{cluster("url http://127.0.0.1:4222"), "scheme"},
		{cluster("url tls://n1:4222\n\t\ttls_cert /c.pem"), "tls_key"},
		{cluster("url tls://n1:4222\n\t\treplicas 7"), "1 to 5"},
		{cluster("url tls://n1:4222\n\t\tlock_ttl 10ms"), "1s or more"},
		{cluster("url tls://n1:4222\n\t\tbogus 1"), "unknown option"},
		{cluster("url nats://127.0.0.1:1"), "no cluster key"},
		{cluster("url nats://127.0.0.1:1\n\t\tkey {env.ZIDANE_E2E_UNSET_KEY}"), "no cluster key"},
		{cluster("url nats://127.0.0.1:1\n\t\tkey c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI="), "literal"},
		{cluster("url nats://127.0.0.1:1\n\t\tkey c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI={env.ZIDANE_E2E_UNSET_KEY}"), "literal"},
		{"zidane {\n\t\tcluster {\n\t\t\turl nats://127.0.0.1:1\n\t\t}\n\t}", "add `storage zidane_nats` to the global options"},
		{"storage zidane_nats", "storage zidane_nats has no settings"},
		{"storage zidane_nats\n\tzidane {\n\t\ttoken_sync 2s\n\t}", "storage zidane_nats has no settings"},
		{"storage zidane_nats {\n\t\turl nats://127.0.0.1:1\n\t}", "no cluster key"},
	} {
		out, err := c.TryReload(t, fmt.Sprintf("{\n\tadmin %s\n\t%s\n}\n\nhttp://127.0.0.1:%d {\n\trespond ok\n}\n", AdminPlaceholder, bad.globals, freePort(t)))
		if err == nil || !strings.Contains(out, bad.want) {
			t.Errorf("%q: %v, want a refusal saying %q\n%s", bad.globals, err, bad.want, out)
		}
		if strings.Contains(out, "secret") || strings.Contains(out, "c2VjcmV0") {
			t.Errorf("the refusal shows a secret it was given: %s", out)
		}
	}
}

// roundRobin sends each request to the next of hosts in turn: an ordinary
// load balancer without affinity.
func roundRobin(hosts []string, counts []atomic.Int64) http.RoundTripper {
	var n atomic.Uint64
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		i := int(n.Add(1)-1) % len(hosts)
		counts[i].Add(1)
		r = r.Clone(r.Context())
		r.URL.Host = hosts[i]
		r.Host = hosts[i]
		return http.DefaultTransport.RoundTrip(r)
	})
}

// On NATS storage the key that seals upstream session ids is derived from
// the cluster key, so a 2025-11-25 session opened through one replica goes
// on through the other, on the guard and on the pass-through route, with
// no affinity. A replica with another cluster key opens none of them.
func TestClusterSessionIDsOpenOnEveryReplica(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startEverythingServer(t) // stateful: every call needs its session
	key := func() string {
		return "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	}
	shared := key()
	replica := func(env string, bucket string) (c *Caddy, guard, pass string) {
		g, p := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c = startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			bucket %s
		}
		upstream ev %s
	}
}

http://%s {
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}

http://%s {
	zidane_mcp {
		broker ev
	}
}
`, AdminPlaceholder, natsURL, bucket, upstream, g, strings.TrimPrefix(strings.TrimSuffix(upstream, "/mcp"), "http://"), p), env)
		return c, g, p
	}
	a, guardA, passA := replica(shared, "zidane")
	_, guardB, passB := replica(shared, "zidane")
	token := createToken(t, a, "lb", "--scope", "mcp", "--scope", "upstream:ev")
	waitStatus(t, "http://"+guardB+"/mcp", token, http.StatusOK, 20*time.Second) // B has read the token

	for _, route := range []struct {
		name  string
		hosts []string
	}{
		{"guard", []string{guardA, guardB}},
		{"pass-through", []string{passA, passB}},
	} {
		t.Run(route.name, func(t *testing.T) {
			counts := make([]atomic.Int64, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			client := mcp.NewClient(&mcp.Implementation{Name: "e2e-lb", Version: "1"}, nil)
			cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
				Endpoint: "http://" + route.hosts[0] + "/mcp", HTTPClient: bearerClient(token, roundRobin(route.hosts, counts)), MaxRetries: -1,
			}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
			if err != nil {
				t.Fatalf("connect through both replicas: %v", err)
			}
			defer cs.Close()
			for i := range 6 {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"})
				if err != nil || res.IsError {
					t.Fatalf("call %d: %v %+v", i, err, res)
				}
			}
			if counts[0].Load() == 0 || counts[1].Load() == 0 {
				t.Fatalf("requests per replica: %d and %d; the load balancer did not use both", counts[0].Load(), counts[1].Load())
			}
			t.Logf("%s: %d requests through A, %d through B, one session", route.name, counts[0].Load(), counts[1].Load())
		})
	}

	// A token revoked on A ends its open stream on B.
	streamToken := createToken(t, a, "streamer", "--scope", "mcp")
	waitStatus(t, "http://"+guardB+"/mcp", streamToken, http.StatusOK, 20*time.Second)
	init0 := post(t, "http://"+guardB+"/mcp", streamToken, initializeBody)
	sid0 := init0.header.Get("Mcp-Session-Id")
	if sid0 == "" {
		t.Fatalf("initialize on B: %d", init0.status)
	}
	post(t, "http://"+guardB+"/mcp", streamToken, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid0, "Mcp-Protocol-Version", "2025-11-25")
	req, _ := http.NewRequest(http.MethodGet, "http://"+guardB+"/mcp", nil)
	req.Header.Set("Authorization", "Bearer "+streamToken)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid0)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET stream on B: %v %v", err, resp)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	if _, stderr, err := a.Run(t, "zidane", "token", "revoke", "streamer"); err != nil {
		t.Fatalf("revoke on A: %v %s", err, stderr)
	}
	revokedAt := time.Now()
	select {
	case <-ended:
		t.Logf("the stream on B ended %v after the revocation on A", time.Since(revokedAt).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("a stream on B outlived its token's revocation on A by 10s")
	}

	// A replica with another cluster key (and so its own bucket: it could
	// not open the shared one's values) does not open the others' ids.
	c, guardC, _ := replica(key(), "other")
	tokenC := createToken(t, c, "c", "--scope", "mcp")
	init := post(t, "http://"+guardA+"/mcp", token, initializeBody)
	sid := init.header.Get("Mcp-Session-Id")
	if init.status != http.StatusOK || sid == "" {
		t.Fatalf("initialize on A: %d, session %q", init.status, sid)
	}
	if got := post(t, "http://"+guardC+"/mcp", tokenC, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25"); got.status != http.StatusNotFound {
		t.Fatalf("A's session id on a replica with another cluster key: %d, want 404", got.status)
	}
}

// Three replicas on one NATS share their rate-limit usage: a token limited
// to 20/s with a burst of 40 (the default), sent 100 requests a second for
// 10 s round-robin across them, gets between 200 and 264 through (one
// node's budget is 40 + 10 × 20 = 240), not three budgets.
func TestClusterRateLimitIsShared(t *testing.T) {
	nats := startNATS(t)
	natsURL := nats.url
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	var sites []string
	var first *Caddy
	for range 3 {
		site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
		}
	}
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_token 20/s 40
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, natsURL, site, up.addr), clusterKey)
		if first == nil {
			first = c
		}
		sites = append(sites, "http://"+site+"/mcp")
	}
	token := createToken(t, first, "load", "--scope", "mcp")
	// Tokens live in one stored list: once a token made after the load
	// token works on a replica, that replica knows the load token too,
	// whose budget is still whole.
	probe := createToken(t, first, "probe", "--scope", "mcp")
	for _, s := range sites {
		waitStatus(t, s, probe, http.StatusOK, 20*time.Second)
	}

	const rate, seconds = 100, 10
	client := &http.Client{Timeout: 10 * time.Second}
	var ok, limited, other atomic.Int64
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for i := range rate * seconds {
		<-tick.C
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, sites[i%len(sites)], strings.NewReader(initializeBody))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := client.Do(req)
			if err != nil {
				other.Add(1)
				return
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				limited.Add(1)
			default:
				other.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d requests at %d/s over 3 replicas: %d admitted, %d limited, %d other", rate*seconds, rate, ok.Load(), limited.Load(), other.Load())
	if other.Load() != 0 {
		t.Fatalf("%d requests failed otherwise than 429", other.Load())
	}
	if n := ok.Load(); n < 200 || n > 264 {
		t.Fatalf("%d admitted; one budget of 20/s with a burst of 40 over 10 s admits 240 (200 to 264 allowed)", n)
	}

	// NATS away: each replica limits on its own, says so, and keeps
	// serving the tokens it knows; NATS back: sharing again, said too.
	healthz := func() (int, string) {
		t.Helper()
		resp, err := http.Get(strings.TrimSuffix(sites[0], "/mcp") + "/zidane/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := healthz(); code != http.StatusOK || !strings.Contains(body, `"nats":"connected"`) {
		t.Fatalf("health check with NATS up: %d %s", code, body)
	}
	nats.stop()
	first.WaitForLog(t, "NATS is away: rate limits now hold per replica", 30*time.Second)
	waitStatus(t, sites[0], probe, http.StatusOK, 20*time.Second)
	// NATS away fails no health check: every replica loses it at once.
	if code, body := healthz(); code != http.StatusOK || !strings.Contains(body, `"nats":"away"`) {
		t.Fatalf("health check with NATS away: %d %s", code, body)
	}
	nats.start(t)
	first.WaitForLog(t, "NATS is back: rate limits are shared across replicas again", 30*time.Second)
}

// An operator's upstream retire on one replica reaches the others: the
// stdio process each replica runs for the upstream ends on both.
func TestClusterUpstreamActionsReachEveryReplica(t *testing.T) {
	natsURL := startNATSServer(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	var replicas []*Caddy
	var urls []string
	for i := range 2 {
		port := freePort(t)
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			node gw-%d
			advertise http://127.0.0.1:%d
		}
		upstream local {
			command %s
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate local
	}
}
`, AdminPlaceholder, natsURL, i, port, everythingServerBin, port), clusterKey)
		replicas = append(replicas, c)
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d/mcp", port))
	}
	token := createToken(t, replicas[0], "ops", "--scope", "mcp")
	waitStatus(t, urls[1], token, http.StatusOK, 20*time.Second)
	pidFiles := func(c *Caddy) []string {
		m, _ := filepath.Glob(filepath.Join(c.DataDir, "zidane", "stdio", "local-*.pid"))
		return m
	}
	for i, u := range urls {
		cs, err := connectGo(t, u, bearerClient(token, nil))
		if err != nil {
			t.Fatal(err)
		}
		if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mcp_local_test_simple_text"}); err != nil || res.IsError {
			t.Fatalf("replica %d: %+v %v", i, res, err)
		}
		if len(pidFiles(replicas[i])) != 1 {
			t.Fatalf("replica %d runs no stdio process for the upstream", i)
		}
	}
	out, stderr, err := replicas[0].Run(t, "zidane", "upstream", "retire", "local")
	if err != nil {
		t.Fatalf("retire on A: %v %s\n%s", err, stderr, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(pidFiles(replicas[1])) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("B still runs the upstream retired on A: %v\n%s", pidFiles(replicas[1]), tail(replicas[1].Logs(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(pidFiles(replicas[0])) != 0 {
		t.Fatal("A still runs the upstream it retired")
	}
	replicas[1].WaitForLog(t, "upstream action from another replica", 10*time.Second)
}

// A replica whose NATS storage settings change on a config reload (a NATS
// URL added) shares its rate-limit usage on the new connection: the old
// one closes with the old config. A token's burst used up on B is then
// refused on A, reloaded, and on C, which was not.
func TestClusterRateLimitSharedAfterStorageReload(t *testing.T) {
	nats := startNATS(t)
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	config := func(urls, site string) string {
		return fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
		}
	}
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_token 1/h 5
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, urls, site, up.addr)
	}
	var cs []*Caddy
	var sites []string
	for range 3 {
		site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		cs = append(cs, startCaddy(t, config(nats.url, site), clusterKey))
		sites = append(sites, site)
	}
	a, urlA, urlB, urlC := cs[0], "http://"+sites[0]+"/mcp", "http://"+sites[1]+"/mcp", "http://"+sites[2]+"/mcp"
	token := createToken(t, a, "load", "--scope", "mcp")
	probe := createToken(t, a, "probe", "--scope", "mcp")
	for _, u := range []string{urlA, urlB, urlC} {
		waitStatus(t, u, probe, http.StatusOK, 20*time.Second) // knows the load token too
	}

	// The same server under a second name: a new connection for A.
	a.Reload(t, config(nats.url+" nats://localhost:"+strings.TrimPrefix(nats.addr, "127.0.0.1:"), sites[0]))

	for i := range 5 {
		if got := post(t, urlB, token, initializeBody).status; got != http.StatusOK {
			t.Fatalf("request %d of the burst on B: %d", i+1, got)
		}
	}
	// C, not reloaded, is the witness that B's usage went out: once it
	// refuses the token, B's message has been delivered.
	waitStatus(t, urlC, token, http.StatusTooManyRequests, 20*time.Second)
	admitted := 0
	for post(t, urlA, token, initializeBody).status == http.StatusOK {
		if admitted++; admitted == 5 {
			t.Fatalf("A, reloaded onto a new NATS connection, admitted the token's whole burst after B used it: its limiter still listens on the connection the reload closed\n%s", tail(a.Logs(), 3000))
		}
	}
	if admitted > 2 {
		t.Fatalf("A admitted %d of the token's requests after B used its burst; want at most 2 (B's usage on its way)", admitted)
	}
	t.Logf("after B used the burst, A (reloaded onto a new NATS connection) admitted %d", admitted)
}

// The CLI run offline where a Caddyfile on NATS storage lies (the one
// `caddy` would read, with no --config given) refuses, on a host that
// has no marker of a server on NATS (another user's, an operator's
// machine): a revocation written to a local storage that no replica reads
// would say it was done while every replica still accepts the token.
func TestClusterOfflineCLIReadsTheCaddyfileHere(t *testing.T) {
	dir := t.TempDir()
	caddyfile := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tstorage zidane_nats\n\tzidane {\n\t\tcluster {\n\t\t\turl nats://127.0.0.1:%d\n\t\t}\n\t}\n}\n\nhttp://127.0.0.1:%d {\n\trespond ok\n}\n", freePort(t), freePort(t), freePort(t))
	if err := os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := boundedCommand(ctx, caddyBin, "zidane", "token", "create", "--name", "offline", "--scope", "mcp")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(dir, "home"), "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "NATS") {
		t.Fatalf("offline token create beside a Caddyfile on NATS storage: %v\n%s\nwant a refusal that names NATS", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "caddy", "zidane")); err == nil {
		t.Fatal("the refused command wrote the local storage")
	}
}
