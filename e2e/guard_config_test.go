package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingUpstream is an HTTP server on loopback that keeps the headers it
// saw and answers every request with a JSON-RPC initialize result, or, when
// redirect is set, with a 307 there.
type recordingUpstream struct {
	mu       sync.Mutex
	seen     []http.Header
	addr     string
	url      string // its MCP endpoint, http://addr/mcp
	redirect string
}

func startRecordingUpstream(t *testing.T) *recordingUpstream {
	return startRedirectingUpstream(t, "")
}

func startRedirectingUpstream(t *testing.T, redirect string) *recordingUpstream {
	t.Helper()
	u := &recordingUpstream{redirect: redirect}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Header.Clone())
		u.mu.Unlock()
		if u.redirect != "" {
			http.Redirect(w, r, u.redirect, http.StatusTemporaryRedirect)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"recorder","version":"1"}}}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	u.addr = ln.Addr().String()
	u.url = "http://" + u.addr + "/mcp"
	return u
}

func (u *recordingUpstream) last(t *testing.T) http.Header {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) == 0 {
		t.Fatal("the upstream saw no request")
	}
	return u.seen[len(u.seen)-1]
}

func TestGuardReplacesTheClientCredential(t *testing.T) {
	up := startRecordingUpstream(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://%s {
	zidane_mcp {
		guard {
			upstream_header Authorization "Bearer {env.UPSTREAM_SECRET}"
			upstream_header X-Api-Key {env.UPSTREAM_API_KEY}
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, site, up.addr), "UPSTREAM_SECRET=upstream-s3cret", "UPSTREAM_API_KEY=static-key")
	token := createToken(t, c, "client", "--scope", "mcp")
	if a := post(t, "http://"+site+"/mcp", token, initializeBody); a.status != http.StatusOK {
		t.Fatalf("%d %s", a.status, a.body)
	}
	h := up.last(t)
	if got := h.Get("Authorization"); got != "Bearer upstream-s3cret" {
		t.Fatalf("upstream Authorization = %q, want the configured upstream credential", got)
	}
	if h.Get("X-Api-Key") != "static-key" {
		t.Fatalf("upstream X-Api-Key = %q", h.Get("X-Api-Key"))
	}
	for name, values := range h {
		for _, v := range values {
			if strings.Contains(v, token) || strings.Contains(v, strings.TrimPrefix(token, "zds_")) {
				t.Fatalf("the client's token reached the upstream in %s", name)
			}
		}
	}
}

// The per-IP limit for failed attempts follows the server's trusted_proxies:
// behind a trusted proxy, each forwarded client has its own bucket, and an
// untrusted peer cannot pick its bucket by sending X-Forwarded-For.
func TestGuardClientIPFollowsTrustedProxies(t *testing.T) {
	up := startRecordingUpstream(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := func(trusted string) string {
		return fmt.Sprintf(`{
	admin %s
	servers {
		%s
	}
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_ip 1/m 2
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, trusted, site, up.addr)
	}
	guess := func(xff string) int {
		return post(t, "http://"+site+"/mcp", "zds_wrong", initializeBody, "X-Forwarded-For", xff).status
	}
	caddy := startCaddy(t, c("trusted_proxies static 127.0.0.1/32"))
	for _, ip := range []string{"203.0.113.1", "203.0.113.2"} {
		got := []int{guess(ip), guess(ip), guess(ip)}
		if fmt.Sprint(got) != "[401 401 429]" {
			t.Fatalf("forwarded client %s: %v, want its own bucket of 2 then 429", ip, got)
		}
	}
	lines := auditLines(caddy)
	found := false
	for _, l := range lines {
		found = found || l["client_ip"] == "203.0.113.2"
	}
	if !found {
		t.Fatal("audit lines do not name the forwarded client IP")
	}

	caddy.Reload(t, c("trusted_proxies static 10.0.0.0/8"))
	// Not trusted: the header is ignored and every guess shares the peer's bucket.
	got := []int{guess("198.51.100.1"), guess("198.51.100.2"), guess("198.51.100.3")}
	if fmt.Sprint(got) != "[401 401 429]" {
		t.Fatalf("untrusted X-Forwarded-For: %v, want one shared bucket", got)
	}
}

// An IPv6 client holds every address of its /64, so failed attempts from
// any of them draw on one bucket; another /64 has its own. rate_limit
// ipv6_prefix changes the prefix, and caddy refuses a length outside 1..128.
func TestGuardCountsIPv6ClientsByPrefix(t *testing.T) {
	up := startRecordingUpstream(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := func(option string) string {
		return fmt.Sprintf(`{
	admin %s
	servers {
		trusted_proxies static 127.0.0.1/32
	}
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_ip 1/m 2
			%s
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, site, option, up.addr)
	}
	guess := func(xff string) int {
		return post(t, "http://"+site+"/mcp", "zds_wrong", initializeBody, "X-Forwarded-For", xff).status
	}
	caddy := startCaddy(t, c(""))
	got := []int{guess("2001:db8:1:2::a"), guess("2001:db8:1:2::b"), guess("2001:db8:1:2:ffff::c")}
	if fmt.Sprint(got) != "[401 401 429]" {
		t.Fatalf("three addresses of one /64: %v, want one bucket of 2 then 429", got)
	}
	if got := guess("2001:db8:1:3::a"); got != http.StatusUnauthorized {
		t.Fatalf("another /64: %d, want 401 from its own bucket", got)
	}

	caddy.Reload(t, c("ipv6_prefix 128"))
	got = []int{guess("2001:db8:9:9::1"), guess("2001:db8:9:9::2"), guess("2001:db8:9:9::3")}
	if fmt.Sprint(got) != "[401 401 401]" {
		t.Fatalf("ipv6_prefix 128: %v, want a bucket per address", got)
	}
	out, err := caddy.TryReload(t, c("ipv6_prefix 0"))
	if err == nil || !strings.Contains(out, "ipv6_prefix") || !strings.Contains(out, "from 1 to 128") {
		t.Fatalf("ipv6_prefix 0 was not refused with the range: %v\n%s", err, out)
	}
}

// Offline, the CLI writes storage directly, and the running server picks
// the change up when it reads the tokens again, every token_sync (1s by
// default): nothing else tells it. offlineHangGuard only bounds the waits.
func TestTokenCreatedOfflineIsSeenByTheRunningServer(t *testing.T) {
	up := startRecordingUpstream(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://%s {
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, site, up.addr))
	// An admin address where nothing listens: the CLI goes offline.
	offline := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	stdout, stderr, err := c.Run(t, "zidane", "token", "create", "--name", "offline", "--scope", "mcp", "--address", offline)
	if err != nil || !strings.Contains(stderr, "No server answers") {
		t.Fatalf("offline create: %v %q", err, stderr)
	}
	token := strings.TrimSpace(stdout)
	const offlineHangGuard = 30 * time.Second
	deadline := time.Now().Add(offlineHangGuard)
	status := 0
	for time.Now().Before(deadline) {
		if status = post(t, "http://"+site+"/mcp", token, initializeBody).status; status == http.StatusOK {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status != http.StatusOK {
		t.Fatalf("a token created offline was not accepted within %s: %d", offlineHangGuard, status)
	}
	if _, stderr, err := c.Run(t, "zidane", "token", "revoke", "offline", "--address", offline); err != nil {
		t.Fatalf("offline revoke: %v %s", err, stderr)
	}
	deadline = time.Now().Add(offlineHangGuard)
	for time.Now().Before(deadline) {
		if status = post(t, "http://"+site+"/mcp", token, initializeBody).status; status == http.StatusUnauthorized {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status != http.StatusUnauthorized {
		t.Fatalf("a token revoked offline still works after %s: %d", offlineHangGuard, status)
	}
}
