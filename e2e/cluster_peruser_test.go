package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// revocationBound is how soon a revocation on one replica must be seen on
// every other (issue 36: "unusable on all within 2 s").
const revocationBound = 2 * time.Second

// perUserCluster is three gateway replicas on one nats-server (storage
// zidane_nats), each with a broker route to the per_user upstream remote,
// sharing one signin issuer: replica 0's site. Every replica serves the
// sign-in, connect and callback paths of that issuer, as behind a load
// balancer; the test picks the replica of each step.
type perUserCluster struct {
	as       *oauthtest.AuthServer
	up       *oauthtest.MCPServer
	issuer   string
	replicas []*perUserGateway
	sites    []string
}

func startPerUserCluster(t *testing.T, asOpts oauthtest.AuthServerOptions) *perUserCluster {
	t.Helper()
	natsURL := startNATSServer(t)
	as := oauthtest.NewAuthServer(asOpts)
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
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
	pc := &perUserCluster{as: as, up: up}
	for i := range 3 {
		site := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		if i == 0 {
			pc.issuer = site
		}
		c := startCaddy(t, fmt.Sprintf(`{
	admin %[1]s
	storage zidane_nats
	zidane {
		cluster {
			url %[2]s
			lock_ttl 5s
		}
		signin {
			issuer %[3]s
			registration dynamic
		}
		upstream remote %[4]s {
			oauth {
				client_id zidane-gateway
				client_secret ${REMOTE_SECRET}
				redirect_url %[3]s/zidane/oauth/callback/remote
				credentials per_user
			}
		}
	}
}

%[5]s {
	zidane_mcp {
		broker remote
		resource %[3]s/mcp
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, natsURL, pc.issuer, up.URL, site), env...)
		pc.sites = append(pc.sites, site)
		pc.replicas = append(pc.replicas, &perUserGateway{c: c, as: as, up: up, brokerURL: site + "/mcp",
			callback: pc.issuer + "/zidane/oauth/callback/remote"})
	}
	return pc
}

// whoamiAt calls the upstream's whoami tool through base's broker route
// with token, as whoami does, but safe to run from many goroutines: it
// returns the tool's text, whether it is an error, or why the call failed.
func whoamiAt(base, token string) (text string, isError bool, err error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/mcp",
		strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return "", false, err
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
	if err := json.Unmarshal(b, &msg); err != nil || msg.Result == nil {
		return "", false, fmt.Errorf("%s: HTTP %d %s", base, resp.StatusCode, b)
	}
	var sb strings.Builder
	for _, c := range msg.Result.Content {
		sb.WriteString(c.Text)
	}
	return sb.String(), msg.Result.IsError, nil
}

// awaitEveryReplica waits until pred holds of each replica's answer to
// token's whoami, for at most bound from start, and returns how long each
// replica took from start.
func (pc *perUserCluster) awaitEveryReplica(t *testing.T, token, what string, start time.Time, bound time.Duration, pred func(text string, isError bool) bool) []time.Duration {
	t.Helper()
	lags := make([]time.Duration, len(pc.sites))
	for i, site := range pc.sites {
		var last string
		for {
			text, isErr, err := whoamiAt(site, token)
			if err == nil && pred(text, isErr) {
				lags[i] = time.Since(start).Round(time.Millisecond)
				break
			}
			last = fmt.Sprintf("%q (error %v, %v)", text, isErr, err)
			if time.Since(start) > bound {
				t.Fatalf("replica %d: %s not seen %v after it was done; it answered %s", i, what, bound, last)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return lags
}

// connectLink is the connect link a call by token on replica i answered
// with, its person not connected: the call reaches nothing upstream.
func (pc *perUserCluster) connectLink(t *testing.T, i int, token string) string {
	t.Helper()
	before, _ := pc.up.Stats()
	text, isErr, err := whoamiAt(pc.sites[i], token)
	link := regexp.MustCompile(regexp.QuoteMeta(pc.issuer) + `/zidane/connect/zcl_[A-Za-z0-9_-]{43}`).FindString(text)
	if err != nil || !isErr || link == "" {
		t.Fatalf("a call on replica %d before connecting: %q (error %v, %v), want a tool error with a connect link", i, text, isErr, err)
	}
	if after, _ := pc.up.Stats(); after != before {
		t.Fatalf("the call on replica %d, its person not connected, reached the upstream", i)
	}
	return link
}

// useLink has browser b (signed in to the gateway as the link's person)
// open the connect link on replica open and press its button there, and
// returns where it sends the browser: the upstream's authorization.
func (pc *perUserCluster) useLink(t *testing.T, b *formBrowser, link string, open int) (authURL string) {
	t.Helper()
	path := strings.TrimPrefix(link, pc.issuer)
	b.base, b.origin = pc.sites[open], pc.issuer
	if resp, body := b.get(pc.sites[open] + path); resp.StatusCode != http.StatusOK || !strings.Contains(body, "stop here") {
		t.Fatalf("the connect link opened on replica %d: %d\n%s", open, resp.StatusCode, body)
	}
	resp, body := b.post(path, url.Values{"connect": {"1"}})
	authURL = resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(authURL, pc.as.URL+"/authorize?") {
		t.Fatalf("the link pressed on replica %d: %d to %q\n%s", open, resp.StatusCode, authURL, body)
	}
	return authURL
}

// authorize signs in at the upstream's authorization server as user and
// brings its answer to the callback on replica back, in browser b; it
// returns the answer's query.
func (pc *perUserCluster) authorize(t *testing.T, b *formBrowser, authURL string, back int, user string) url.Values {
	t.Helper()
	q := pc.replicas[back].signIn(t, authURL, user)
	if resp, body := b.get(pc.sites[back] + "/zidane/oauth/callback/remote?" + q.Encode()); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Go back to your MCP client") {
		t.Fatalf("the upstream's callback on replica %d: %d\n%s", back, resp.StatusCode, body)
	}
	return q
}

// awaitExpiry waits until the authorization server no longer takes
// access token tok: it expired.
func awaitExpiry(t *testing.T, as *oauthtest.AuthServer, tok string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, valid := as.Valid(tok); !valid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the upstream's access token did not expire")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// refreshGrants is the refresh_token grants the authorization server saw,
// and how many it refused.
func refreshGrants(as *oauthtest.AuthServer) (all, refused int) {
	for _, r := range as.TokenRequests() {
		if r.GrantType == oauthtest.GrantRefreshToken {
			all++
			if r.Error != "" {
				refused++
			}
		}
	}
	return all, refused
}

// TestPerUserAcrossReplicas: a person's own upstream credentials in a
// cluster of three replicas. Frank signs in to the gateway (his MCP
// client gets a grant); his call on replica A answers with a connect link,
// which he opens and presses on replica B, and the upstream's
// authorization comes back to A; his calls then run upstream as him on
// every replica, including B and C, which had answered him "connect your
// account" moments before; the upstream's answer replayed on C redeems
// nothing. His upstream token, expired, is refreshed by a
// call on C, and B uses what C obtained; expired again, calls on B and C
// at once refresh it once (the authorization server rotates refresh
// tokens and would refuse a second use). The operator's `connections
// revoke` on A, with an authorization server that has no revocation
// endpoint (so only the gateway can stop the token), is refused on all
// three within 2 s, and bob's connection stays. His next link, pressed
// on B and C at once, starts one authorization; once reconnected,
// revoking his grant on B refuses his client on all three, and deletes his
// connection everywhere, within 2 s.
//
// With an authorization server that binds tokens to a DPoP key, the same
// holds with the key the person's login made, kept sealed in their record:
// C refreshes with it, and every call on every replica proves it.
func TestPerUserAcrossReplicas(t *testing.T) {
	for _, dpop := range []bool{false, true} {
		t.Run(map[bool]string{false: "bearer", true: "dpop"}[dpop], func(t *testing.T) { perUserAcrossReplicas(t, dpop) })
	}
}

func perUserAcrossReplicas(t *testing.T, dpop bool) {
	// The login's access token lives 6 s (the gateway refreshes at half
	// its life), the first refresh's 20 s, so B's call after C's refresh
	// has 10 s before it would renew it itself.
	pc := startPerUserCluster(t, oauthtest.AuthServerOptions{AccessTokenTTL: 6 * time.Second, NoRevocation: true, DPoP: dpop})
	a, b, c := pc.replicas[0], pc.replicas[1], pc.replicas[2]
	const frank = "frank"

	// Frank signs in and his MCP client gets a grant for the site.
	secret := signInLink(t, a.c, frank, "upstream:remote")
	m := registerClient(t, pc.issuer)
	browser := newFormBrowser(t, pc.issuer)
	code, verifier := m.code(browser, secret, pc.issuer+"/mcp")
	status, tok := m.redeem(code, verifier, pc.issuer+"/mcp")
	if status != http.StatusOK {
		t.Fatalf("frank's client redeeming its code: %d %v", status, tok)
	}
	access := tok["access_token"].(string)
	// From here on the browser follows no redirect on its own.
	browser.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	// bob connects through the admin API of C, with a token of his.
	bob := createToken(t, a.c, "bob-laptop", "--scope", "upstream:remote", "--owner", "bob")
	c.connect(t, "bob", "bob")

	// Frank, not connected, is told so on every replica; B and C keep
	// that answer for a moment (no storage read per refused call).
	linkB := pc.connectLink(t, 1, access)
	pc.connectLink(t, 2, access)
	link := pc.connectLink(t, 0, access)
	if link == linkB {
		t.Fatal("two calls answered with one connect link")
	}

	// The link made on A, used on B, the upstream's answer back on A.
	answer := pc.authorize(t, browser, pc.useLink(t, browser, link, 1), 0, frank)
	if !hasAudit(a.c, map[string]any{"event": "upstream_connect", "owner": frank, "upstream": "remote"}) {
		t.Error("no audit line on A for frank's connection")
	}
	login := pc.as.AccessTokens()
	connected := time.Now()
	lags := pc.awaitEveryReplica(t, access, "frank's call running as him", connected, 20*time.Second, func(text string, isErr bool) bool {
		return !isErr && text == "whoami: frank"
	})
	t.Logf("frank connected on A: his calls ran as him on A, B and C after %v", lags)
	// The key of frank's proofs, on the three replicas' calls.
	var frankKey string
	if dpop {
		proofs := pc.up.DPoPProofs()
		frankKey = proofs[len(proofs)-1].JKT
		for _, p := range proofs[len(proofs)-len(pc.sites):] {
			if p.JKT != frankKey || p.Err != "" {
				t.Fatalf("frank's calls on A, B and C proved keys %+v, want one key, his", proofs[len(proofs)-len(pc.sites):])
			}
		}
	}
	for _, base := range pc.sites {
		if text, isErr, err := whoamiAt(base, bob); err != nil || isErr || text != "whoami: bob" {
			t.Errorf("bob's call at %s: %q (error %v, %v)", base, text, isErr, err)
		}
	}

	// The upstream's answer again, on C: refused, and no code redeemed.
	// (Its flow used up, the state is no connect link's any more, and the
	// operator's login callback, which shares the address, refuses it,
	// telling a person what to do too.)
	codes, _ := codeGrants(pc.as)
	if resp, body := browser.get(pc.sites[2] + "/zidane/oauth/callback/remote?" + answer.Encode()); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(body, "unknown, already used") || !strings.Contains(body, "If you were connecting your own account") {
		t.Errorf("the upstream's answer replayed on C: %d\n%s", resp.StatusCode, body)
	}
	if n, _ := codeGrants(pc.as); n != codes {
		t.Errorf("the replayed answer redeemed a code (%d redemptions, was %d)", n, codes)
	}

	// Refreshed on C; B uses C's token.
	pc.as.SetAccessTokenTTL(20 * time.Second)
	awaitExpiry(t, pc.as, login[len(login)-1])
	before, _ := refreshGrants(pc.as)
	if text, isErr, err := whoamiAt(pc.sites[2], access); err != nil || isErr || text != "whoami: frank" {
		t.Fatalf("frank on C after his token expired: %q (error %v, %v)", text, isErr, err)
	}
	if n, refused := refreshGrants(pc.as); n != before+1 || refused != 0 {
		t.Fatalf("after frank's call on C past his token's expiry, %d refresh grants (%d refused), want %d", n, refused, before+1)
	}
	issued := pc.as.AccessTokens()
	fromC := issued[len(issued)-1]
	if got := pc.up.Bearers(); got[len(got)-1] != fromC {
		t.Error("C's call did not carry the token C's refresh obtained")
	}
	if text, isErr, err := whoamiAt(pc.sites[1], access); err != nil || isErr || text != "whoami: frank" {
		t.Fatalf("frank on B after C refreshed: %q (error %v, %v)", text, isErr, err)
	}
	if got := pc.up.Bearers(); got[len(got)-1] != fromC {
		t.Error("B's call did not carry the token C's refresh obtained")
	}
	if n, _ := refreshGrants(pc.as); n != before+1 {
		t.Errorf("B refreshed again after C (%d refresh grants, want %d)", n, before+1)
	}

	// Expired again: calls on B and C at once refresh it once.
	pc.as.SetAccessTokenTTL(time.Hour)
	awaitExpiry(t, pc.as, fromC)
	before, _ = refreshGrants(pc.as)
	sent, proved := len(pc.up.Bearers()), len(pc.up.DPoPProofs())
	const calls = 24
	errs := make([]error, calls)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			<-start
			site := pc.sites[1+i%2]
			text, isErr, err := whoamiAt(site, access)
			if err == nil && (isErr || text != "whoami: frank") {
				err = fmt.Errorf("%s: %q (error %v)", site, text, isErr)
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d of the burst on B and C: %v", i, err)
		}
	}
	n, refused := refreshGrants(pc.as)
	if n != before+1 || refused != 0 || pc.as.RefreshReuses() != 0 {
		t.Errorf("%d calls on B and C at once past the expiry: %d refresh grants (%d refused, %d reuses), want exactly 1",
			calls, n-before, refused, pc.as.RefreshReuses())
	}
	issued = pc.as.AccessTokens()
	for _, tok := range pc.up.Bearers()[sent:] {
		if tok != issued[len(issued)-1] {
			t.Errorf("a call of the burst carried a token (%.8s…) other than the one refresh's", tok)
			break
		}
	}
	if dpop {
		for _, s := range pc.up.Schemes()[sent:] {
			if s != "DPoP" {
				t.Errorf("a call of the burst used the %s scheme, want DPoP", s)
				break
			}
		}
		proofs := pc.up.DPoPProofs()[proved:]
		if len(proofs) < calls {
			t.Errorf("%d proofs for the %d calls of the burst", len(proofs), calls)
		}
		for _, p := range proofs {
			if p.JKT != frankKey || p.Err != "" {
				t.Errorf("a call of the burst proved another key than frank's login's, or a bad proof: %+v", p)
				break
			}
		}
	}

	// The operator revokes frank's connection on A: no replica uses his
	// token after 2 s, though the authorization server still takes it.
	out, stderr, err := a.c.Run(t, "zidane", "connections", "revoke", "--owner", frank)
	if err != nil || !strings.Contains(out, frank) {
		t.Fatalf("connections revoke on A: %v\n%s%s", err, out, stderr)
	}
	revoked := time.Now()
	lags = pc.awaitEveryReplica(t, access, "the refusal of frank's revoked connection", revoked, revocationBound, func(text string, isErr bool) bool {
		return isErr && strings.Contains(text, "connect your account")
	})
	t.Logf("frank's connection revoked on A: refused on A, B and C after %v", lags)
	if _, valid := pc.as.Valid(issued[len(issued)-1]); !valid {
		t.Fatal("the authorization server no longer takes frank's token: the gateway's own revocation is not what is tested")
	}
	reached, _ := pc.up.Stats()
	for i, base := range pc.sites {
		if text, isErr, err := whoamiAt(base, access); err != nil || !isErr || !strings.Contains(text, "connect your account") {
			t.Errorf("frank on replica %d after the revocation: %q (error %v, %v)", i, text, isErr, err)
		}
		if text, isErr, err := whoamiAt(base, bob); err != nil || isErr || text != "whoami: bob" {
			t.Errorf("bob on replica %d after frank's revocation: %q (error %v, %v)", i, text, isErr, err)
		}
	}
	if now, _ := pc.up.Stats(); now != reached+len(pc.sites) {
		t.Errorf("the upstream saw %d requests for 3 of bob's calls and 3 of frank's refused ones, want 3", now-reached)
	}

	// Reconnected with a link made on C, which the browser sends to B and
	// C at once (two tabs, a double click behind a load balancer): one
	// press goes on, the other is refused; the answer comes back on B.
	link = pc.connectLink(t, 2, access)
	path := strings.TrimPrefix(link, pc.issuer)
	type press struct {
		status   int
		location string
		body     string
		err      error
	}
	presses := make([]press, 2)
	ready := make(chan struct{})
	var pw sync.WaitGroup
	for i := range presses {
		pw.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, pc.sites[1+i]+path, strings.NewReader("connect=1"))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", pc.issuer)
			<-ready
			resp, err := browser.hc.Do(req)
			if err != nil {
				presses[i].err = err
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			presses[i] = press{resp.StatusCode, resp.Header.Get("Location"), string(b), nil}
		})
	}
	close(ready)
	pw.Wait()
	var authURL string
	for i, p := range presses {
		switch {
		case p.err == nil && p.status == http.StatusSeeOther && strings.HasPrefix(p.location, pc.as.URL+"/authorize?"):
			if authURL != "" {
				t.Fatalf("one connect link pressed on B and C at once started two authorizations")
			}
			authURL = p.location
		case p.err == nil && p.status == http.StatusForbidden && strings.Contains(p.body, "used already"):
		default:
			t.Fatalf("the link pressed on replica %d at the same time as on the other: %d %v\n%s", 1+i, p.status, p.err, p.body)
		}
	}
	if authURL == "" {
		t.Fatal("one connect link pressed on B and C at once: both refused")
	}
	pc.authorize(t, browser, authURL, 1, frank)
	pc.awaitEveryReplica(t, access, "frank's call once reconnected", time.Now(), 20*time.Second, func(text string, isErr bool) bool {
		return !isErr && text == "whoami: frank"
	})

	// The operator revokes frank's grant on B: his client is refused on
	// every replica, and his connection (his last grant gone) is deleted
	// everywhere, which a token of his own made by the operator shows.
	frankToken := createToken(t, a.c, "frank-script", "--scope", "upstream:remote", "--owner", frank)
	if text, isErr, err := whoamiAt(pc.sites[0], frankToken); err != nil || isErr || text != "whoami: frank" {
		t.Fatalf("frank's own token before the grant's revocation: %q (error %v, %v)", text, isErr, err)
	}
	list, _, err := b.c.Run(t, "zidane", "token", "list", "--owner", frank, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var toks []struct{ ID string }
	if err := json.Unmarshal([]byte(list), &toks); err != nil {
		t.Fatalf("token list: %v\n%s", err, list)
	}
	grants := slices.DeleteFunc(toks, func(tk struct{ ID string }) bool { return !strings.HasPrefix(tk.ID, "grt_") })
	if len(grants) != 1 {
		t.Fatalf("frank's grants listed on B: %s", list)
	}
	if _, stderr, err := b.c.Run(t, "zidane", "token", "revoke", grants[0].ID); err != nil {
		t.Fatalf("token revoke %s on B: %v\n%s", grants[0].ID, err, stderr)
	}
	revoked = time.Now()
	for i, site := range pc.sites {
		for {
			if st := post(t, site+"/mcp", access, initializeBody).status; st == http.StatusUnauthorized {
				break
			}
			if time.Since(revoked) > revocationBound {
				t.Fatalf("replica %d still takes frank's client's token %v after its grant was revoked on B", i, revocationBound)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	lags = pc.awaitEveryReplica(t, frankToken, "frank's connection deleted with his last grant", revoked, revocationBound, func(text string, isErr bool) bool {
		return isErr && strings.Contains(text, "connect your account")
	})
	t.Logf("frank's grant revoked on B: his client refused everywhere, and his connection gone on A, B and C after %v", lags)
	if out, _, _ := c.c.Run(t, "zidane", "connections", "list", "--owner", frank); !strings.Contains(out, "No connections") {
		t.Errorf("frank's connections after his grant's revocation:\n%s", out)
	}
	for i, base := range pc.sites {
		if text, isErr, err := whoamiAt(base, bob); err != nil || isErr || text != "whoami: bob" {
			t.Errorf("bob on replica %d after frank's grant's revocation: %q (error %v, %v)", i, text, isErr, err)
		}
	}
	for _, s := range pc.as.Secrets() {
		for i, r := range pc.replicas {
			if strings.Contains(r.c.Logs(), s) {
				t.Errorf("a token of the authorization server (%.8s…) is in replica %d's log", s, i)
			}
		}
	}
}
