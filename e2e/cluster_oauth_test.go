package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// oauthCluster is three gateway replicas on a three-node NATS cluster
// (storage zidane_nats, replicas 3), each offering the OAuth-protected
// upstream remote on a pass-through route, behind a Caddy load balancer
// that holds the login's redirect_url. The load balancer sends the
// callback to replica 1 and everything else round robin: a login started
// on replica 0 completes on another replica, as behind any load balancer.
type oauthCluster struct {
	as       *oauthtest.AuthServer
	up       *oauthtest.MCPServer
	replicas []*Caddy
	sites    []string // each replica's http://host:port
	lb       string   // the load balancer's http://host:port
	token    string   // a downstream client's token (upstream:remote)
	kv       jetstream.KeyValue
}

// callbackReplica is the replica the load balancer sends callbacks to.
const callbackReplica = 1

func startOAuthCluster(t *testing.T, asOpts oauthtest.AuthServerOptions) *oauthCluster {
	t.Helper()
	_, natsURLs := startNATSCluster(t)
	as := oauthtest.NewAuthServer(asOpts)
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{ScopesSupported: []string{"mcp:read"}, EchoScope: "mcp:read"})
	t.Cleanup(up.Close)
	secret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", secret, nil)

	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	env := []string{
		"ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16))),
		"ZIDANE_UPSTREAM_TOKEN_KEY=" + base64.StdEncoding.EncodeToString(rawKey),
		"REMOTE_SECRET=" + secret,
	}
	g := &oauthCluster{as: as, up: up}
	lbAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	g.lb = "http://" + lbAddr
	var hosts []string
	for range 3 {
		site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		g.replicas = append(g.replicas, startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			replicas 3
		}
		upstream remote %s {
			oauth {
				grant authorization_code
				client_id zidane-gateway
				client_secret ${REMOTE_SECRET}
				redirect_url %s/zidane/oauth/callback/remote
			}
		}
	}
}

http://%s {
	zidane_mcp {
		broker remote
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, strings.Join(natsURLs, " "), up.URL, g.lb, site), env...))
		g.sites = append(g.sites, "http://"+site)
		hosts = append(hosts, site)
	}
	startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://%s {
	handle /zidane/oauth/callback/* {
		reverse_proxy %s
	}
	handle {
		reverse_proxy %s {
			lb_policy round_robin
			health_uri /zidane/healthz
			health_interval 250ms
		}
	}
}
`, AdminPlaceholder, lbAddr, hosts[callbackReplica], strings.Join(hosts, " ")))

	// The token, made on replica 0, is known on every replica once a call
	// there gets as far as the upstream's want of a login.
	g.token = createToken(t, g.replicas[0], "agent", "--scope", "upstream:remote")
	for i, s := range g.sites {
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := g.echo(s, "before")
			if err != nil && strings.Contains(err.Error(), loginHint) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d before the login: %v, want a tool error saying `%s`", i, err, loginHint)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	nc, err := nats.Connect(strings.Join(natsURLs, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if g.kv, err = js.KeyValue(ctx, "zidane"); err != nil {
		t.Fatalf("the replicas' KV bucket: %v", err)
	}
	return g
}

// startLogin runs `caddy zidane login remote --wait 0` on replica i and
// returns the authorization URL it printed.
func (g *oauthCluster) startLogin(t *testing.T, i int) string {
	t.Helper()
	stdout, stderr, err := g.replicas[i].Run(t, "zidane", "login", "remote", "--wait", "0")
	if err != nil {
		t.Fatalf("zidane login on replica %d: %v\n%s%s", i, err, stdout, stderr)
	}
	for _, f := range strings.Fields(stdout) {
		if strings.HasPrefix(f, g.as.URL+"/authorize?") {
			return f
		}
	}
	t.Fatalf("zidane login on replica %d printed no authorization URL of %s:\n%s", i, g.as.URL, stdout)
	return ""
}

// noRedirects is the operator's browser, step by step.
var noRedirects = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// authorize opens the authorization URL (the authorization server
// approves at once) and returns the callback URL it redirects to, on the
// load balancer.
func (g *oauthCluster) authorize(t *testing.T, authURL string) *url.URL {
	t.Helper()
	resp, err := noRedirects.Get(authURL)
	if err != nil {
		t.Fatalf("opening the authorization URL: %v", err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || err != nil || loc.Scheme+"://"+loc.Host != g.lb || loc.Path != "/zidane/oauth/callback/remote" {
		t.Fatalf("authorization endpoint answered %d, Location %q; want a redirect to the callback on the load balancer", resp.StatusCode, resp.Header.Get("Location"))
	}
	return loc
}

// deliver GETs the callback at base (the load balancer or a replica) and
// returns the status and the page.
func deliver(callback *url.URL, base string) (int, string, error) {
	resp, err := noRedirects.Get(base + callback.RequestURI())
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(page), nil
}

// echo calls the upstream's echo tool through base's pass-through route
// with one raw JSON-RPC request, and returns an error unless the answer is
// the tool's result "echo: <text>".
func (g *oauthCluster) echo(base, text string) error {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call",
		"params": map[string]any{"name": "echo", "arguments": map[string]any{"text": text}}})
	req, err := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var msg struct {
		Result *struct {
			IsError bool `json:"isError"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(b, &msg); err != nil || msg.Result == nil || msg.Result.IsError ||
		len(msg.Result.Content) != 1 || msg.Result.Content[0].Text != "echo: "+text {
		return fmt.Errorf("%s: HTTP %d %s", base, resp.StatusCode, b)
	}
	return nil
}

// replicaAuth is a replica's status of remote, from its admin API.
type replicaAuth struct {
	authStatus
	Expiry time.Time `json:"expiry"`
}

// auth is replica i's status of remote, from its admin API.
func (g *oauthCluster) auth(t *testing.T, i int) replicaAuth {
	t.Helper()
	resp, err := shortClient.Get(g.replicas[i].AdminURL("/zidane/upstreams/remote/auth"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st replicaAuth
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("replica %d: GET /zidane/upstreams/remote/auth: %d %v", i, resp.StatusCode, err)
	}
	return st
}

// awaitToken waits until every replica holds a token other than the one
// that expires at prev (zero: none): a login's record reaches the other
// replicas through their storage watch. It returns how long each took,
// from the call, and the expiry they agree on. A replica that refused a
// call for want of a login in the last moments answers the next ones from
// that refusal until its watch delivers the record (see
// upstreamauth.Client.Reload): calls are made after this.
func (g *oauthCluster) awaitToken(t *testing.T, prev time.Time) ([]time.Duration, time.Time) {
	t.Helper()
	start := time.Now()
	lags := make([]time.Duration, len(g.replicas))
	var expiry time.Time
	for i := range g.replicas {
		for {
			st := g.auth(t, i)
			if st.State == "ready" && !st.Expiry.IsZero() && !st.Expiry.Equal(prev) {
				lags[i] = time.Since(start).Round(time.Millisecond)
				if i > 0 && !st.Expiry.Equal(expiry) {
					t.Fatalf("replica %d holds a token expiring at %v, replica 0 one expiring at %v", i, st.Expiry, expiry)
				}
				expiry = st.Expiry
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("replica %d does not hold the new token 10s after the login completed: %+v", i, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return lags, expiry
}

// pendingLogins counts the logins awaiting their callback in the shared
// storage (zidane/upstream-oauth-pending/remote/…).
func (g *oauthCluster) pendingLogins(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lister, err := g.kv.ListKeysFiltered(ctx, "zidane.upstream-oauth-pending.remote.*")
	if err != nil {
		t.Fatal(err)
	}
	defer lister.Stop()
	n := 0
	for range lister.Keys() {
		n++
	}
	return n
}

// recordRevision is the KV revision of remote's stored token record (0:
// none): it moves on every write.
func (g *oauthCluster) recordRevision(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := g.kv.Get(ctx, "zidane.upstream-oauth.remote")
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0
		}
		t.Fatal(err)
	}
	return e.Revision()
}

// codeGrants counts the authorization_code redemptions the authorization
// server saw, and how many it refused.
func codeGrants(as *oauthtest.AuthServer) (all, refused int) {
	for _, r := range as.TokenRequests() {
		if r.GrantType == oauthtest.GrantAuthorizationCode {
			all++
			if r.Error != "" {
				refused++
			}
		}
	}
	return all, refused
}

// An upstream login started on one replica completes on another: the
// authorization server's redirect reaches replica 1 through the load
// balancer, replica 1 takes the pending login from the shared storage and
// redeems the code, and at once every replica calls the upstream with the
// token. The same callback again, on any replica, is refused and stores
// nothing; the same callback delivered to all three at once completes
// once.
func TestClusterOAuthCallbackOnAnotherReplica(t *testing.T) {
	g := startOAuthCluster(t, oauthtest.AuthServerOptions{AuthMethods: []string{oauthtest.ClientSecretBasic}})

	authURL := g.startLogin(t, 0)
	if n := g.pendingLogins(t); n != 1 {
		t.Fatalf("%d pending logins in the shared storage after the login started, want 1", n)
	}
	callback := g.authorize(t, authURL)
	status, page, err := deliver(callback, g.lb)
	if err != nil || status != http.StatusOK || !strings.Contains(page, "Logged in to remote") {
		t.Fatalf("the callback through the load balancer: %d %v\n%s", status, err, page)
	}
	if !hasAudit(g.replicas[callbackReplica], map[string]any{"event": "upstream_login", "upstream": "remote", "outcome": "ok"}) {
		t.Fatalf("replica %d, where the load balancer sends callbacks, has no audit line of the completed login", callbackReplica)
	}
	if hasAudit(g.replicas[0], map[string]any{"event": "upstream_login", "outcome": "ok"}) {
		t.Fatal("replica 0 completed the login: the callback was to land on another replica")
	}
	if n := g.pendingLogins(t); n != 0 {
		t.Errorf("%d pending logins left in the shared storage after the callback, want 0", n)
	}

	// On every replica and through the load balancer.
	lags, expiry := g.awaitToken(t, time.Time{})
	for i := range g.replicas {
		if err := g.echo(g.sites[i], fmt.Sprintf("replica %d", i)); err != nil {
			t.Errorf("replica %d after the callback on replica %d: %v", i, callbackReplica, err)
		}
	}
	for i := range 6 {
		if err := g.echo(g.lb, fmt.Sprintf("lb %d", i)); err != nil {
			t.Errorf("through the load balancer: %v", err)
		}
	}
	issued := g.as.AccessTokens()
	if len(issued) != 1 {
		t.Fatalf("the authorization server issued %d access tokens, want the login's 1", len(issued))
	}
	bearers := g.up.Bearers()
	if len(bearers) != 9 {
		t.Errorf("the upstream saw %d authorized calls, want 9", len(bearers))
	}
	for _, b := range bearers {
		if b != issued[0] {
			t.Errorf("the upstream saw a bearer token (%.8s…) other than the one the login obtained", b)
		}
	}
	for i := range g.replicas {
		if st := g.auth(t, i); st.State != "ready" || !slices.Equal(st.Scopes, []string{"mcp:read"}) {
			t.Errorf("replica %d: auth status %+v, want ready with mcp:read", i, st)
		}
	}

	// The same callback again, on every replica and through the load
	// balancer: refused, and nothing is stored or redeemed.
	rev := g.recordRevision(t)
	if rev == 0 {
		t.Fatal("no token record in the shared storage after the login")
	}
	for _, base := range append(slices.Clone(g.sites), g.lb) {
		status, page, err := deliver(callback, base)
		if err != nil || status != http.StatusBadRequest || !strings.Contains(page, "Login to remote failed") ||
			!strings.Contains(page, "does not belong to a login under way (unknown, already used, or evicted); run the login again. Run `"+loginHint+"` to try again.") {
			t.Errorf("the callback replayed at %s: %d %v\n%s", base, status, err, page)
		}
	}
	if all, _ := codeGrants(g.as); all != 1 {
		t.Errorf("the authorization server saw %d code redemptions after the replays, want the login's 1", all)
	}
	if got := g.recordRevision(t); got != rev {
		t.Errorf("the replays wrote the token record (revision %d, then %d)", rev, got)
	}
	for i, c := range g.replicas {
		if !hasAudit(c, map[string]any{"event": "upstream_login", "upstream": "remote", "outcome": "refused"}) {
			t.Errorf("replica %d has no audit line of the refused replay", i)
		}
		if err := g.echo(g.sites[i], "after the replays"); err != nil {
			t.Errorf("replica %d after the replays: %v", i, err)
		}
	}

	// A second login, from replica 2 this time, whose callback three
	// browsers (or an attacker racing the operator) deliver to the three
	// replicas at once: one completes it, the two others are refused.
	authURL = g.startLogin(t, 2)
	callback = g.authorize(t, authURL)
	type outcome struct {
		status int
		page   string
		err    error
	}
	outcomes := make([]outcome, len(g.sites))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range g.sites {
		wg.Go(func() {
			<-start
			status, page, err := deliver(callback, s)
			outcomes[i] = outcome{status, page, err}
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	for i, o := range outcomes {
		switch {
		case o.err == nil && o.status == http.StatusOK && strings.Contains(o.page, "Logged in to remote"):
			ok++
		case o.err == nil && o.status == http.StatusBadRequest && strings.Contains(o.page, "does not belong to a login under way"):
		default:
			t.Errorf("replica %d, given the callback at the same time as the others: %d %v\n%s", i, o.status, o.err, o.page)
		}
	}
	statuses := []int{outcomes[0].status, outcomes[1].status, outcomes[2].status}
	if ok != 1 {
		t.Errorf("the same callback delivered to three replicas at once completed %d times (statuses %v), want once", ok, statuses)
	}
	if all, refused := codeGrants(g.as); all != 2 || refused != 0 {
		t.Errorf("the authorization server saw %d code redemptions (%d refused), want 2 and none refused", all, refused)
	}
	if n := g.pendingLogins(t); n != 0 {
		t.Errorf("%d pending logins left in the shared storage, want 0", n)
	}
	issued = g.as.AccessTokens()
	lags2, _ := g.awaitToken(t, expiry)
	before := len(g.up.Bearers())
	for i := range g.replicas {
		if err := g.echo(g.sites[i], "after the second login"); err != nil {
			t.Errorf("replica %d after the second login: %v", i, err)
		}
	}
	for _, b := range g.up.Bearers()[before:] {
		if b != issued[len(issued)-1] {
			t.Errorf("after the second login the upstream saw a bearer token (%.8s…) other than the one it obtained", b)
		}
	}
	all, _ := codeGrants(g.as)
	t.Logf("login started on replica 0, callback through the load balancer on replica %d: 200, token held by replicas 0..2 after %v; replays on 3 replicas and the load balancer: 400; one callback on 3 replicas at once: statuses %v, token held after %v; code redemptions %d",
		callbackReplica, lags, statuses, lags2, all)
}

// Three replicas hold one upstream token that expires; 60 concurrent tool
// calls spread over them, after the expiry, all succeed, and the
// authorization server (which rotates refresh tokens, and refuses a
// rotated one presented again and revokes its grant) saw exactly one
// refresh: the replicas renew under one cluster-wide storage lock, and
// those that wait for it adopt the token the first one stored.
func TestClusterOAuthRefreshOnceAcrossReplicas(t *testing.T) {
	// The login's token lives 8 s (the gateway refreshes it at
	// half-life); the refreshed one lives an hour, so one refresh covers
	// the burst.
	g := startOAuthCluster(t, oauthtest.AuthServerOptions{AccessTokenTTL: 8 * time.Second, AuthMethods: []string{oauthtest.ClientSecretBasic}})
	callback := g.authorize(t, g.startLogin(t, 0))
	if status, page, err := deliver(callback, g.lb); err != nil || status != http.StatusOK {
		t.Fatalf("the callback through the load balancer: %d %v\n%s", status, err, page)
	}
	g.as.SetAccessTokenTTL(time.Hour)
	login := g.as.AccessTokens()
	if len(login) != 1 {
		t.Fatalf("%d access tokens issued by the login, want 1", len(login))
	}
	g.awaitToken(t, time.Time{})
	for i := range g.replicas {
		if err := g.echo(g.sites[i], "warm"); err != nil {
			t.Fatalf("replica %d after the login: %v", i, err)
		}
	}
	if n := refreshes(g.as); n != 0 {
		t.Fatalf("%d refreshes before the token's half-life: the calls after the login took longer than 4 s; nothing is measured", n)
	}
	// Wait for the expiry, as the authorization server sees it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, valid := g.as.Valid(login[0]); !valid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the login's access token did not expire")
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := len(g.up.Bearers())

	const calls = 60
	errs := make([]error, calls)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			<-start
			errs[i] = g.echo(g.sites[i%len(g.sites)], fmt.Sprintf("burst %d", i))
		})
	}
	close(start)
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			t.Errorf("call %d (replica %d): %v", i, i%len(g.sites), err)
		}
	}

	var grants, refused []oauthtest.TokenRequest
	for _, r := range g.as.TokenRequests() {
		if r.GrantType == oauthtest.GrantRefreshToken {
			grants = append(grants, r)
			if r.Error != "" {
				refused = append(refused, r)
			}
		}
	}
	if len(grants) != 1 || len(refused) != 0 {
		t.Errorf("the authorization server saw %d refresh_token grants (%d refused: %+v), want exactly 1", len(grants), len(refused), refused)
	}
	if n := g.as.RefreshReuses(); n != 0 {
		t.Errorf("the authorization server saw a rotated refresh token presented again %d times", n)
	}
	for _, rt := range g.as.RefreshTokens() {
		if rt.Redeemed > 1 {
			t.Errorf("refresh token %.8s… redeemed %d times", rt.Token, rt.Redeemed)
		}
	}
	issued := g.as.AccessTokens()
	if len(issued) != 2 {
		t.Errorf("%d access tokens issued, want the login's and the refresh's", len(issued))
	}
	burst := g.up.Bearers()[before:]
	if len(burst) != calls {
		t.Errorf("the upstream saw %d authorized calls in the burst, want %d", len(burst), calls)
	}
	for _, b := range burst {
		if b != issued[len(issued)-1] {
			t.Errorf("a call of the burst reached the upstream with a bearer token (%.8s…) other than the refreshed one", b)
			break
		}
	}
	var expiries []time.Time
	for i := range g.replicas {
		st := g.auth(t, i)
		if st.State != "ready" {
			t.Errorf("replica %d after the burst: %+v", i, st)
		}
		expiries = append(expiries, st.Expiry)
	}
	t.Logf("%d concurrent calls over 3 replicas after the expiry: %d failed; refresh_token grants at the authorization server: %d (%d refused), reuses %d; expiry per replica %v",
		calls, failed, len(grants), len(refused), g.as.RefreshReuses(), expiries)
}
