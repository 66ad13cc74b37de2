package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A reload that changes the storage zidane_nats block of a replica that
// runs agent sessions (lock_ttl here) would give it a new NATS connection
// and close the old one, on which its engine, its requests from other
// replicas and its event stream run; a second engine under the same node
// id would run its agents twice. The reload is refused, with a message
// that says to restart, and the replica's sessions go on; a reload with
// the same block is taken.
func TestClusterSessionsStorageReload(t *testing.T) {
	nats := startNATS(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	config := func(node, site, lockTTL string) string {
		return fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			node %s
			advertise http://%s
			lock_ttl %s
		}
	}
}

http://%s {
	zidane_mcp {
		sessions
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, nats.url, node, site, lockTTL, site)
	}
	siteA := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	siteB := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	a := startCaddy(t, config("gw-a", siteA, "15s"), clusterKey)
	startCaddy(t, config("gw-b", siteB, "15s"), clusterKey)
	token := createToken(t, a, "sam", "--scope", "chat")
	waitStatus(t, "http://"+siteB+"/mcp", token, 200, 20*time.Second)
	csA, err := connectGo(t, "http://"+siteA+"/mcp", bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	csB, err := connectGo(t, "http://"+siteB+"/mcp", bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	_, data, err := callSessions(t, csA, "sessions", map[string]any{"verb": "create", "cwd": t.TempDir(), "prompt": "hello"})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := data["sessionId"].(string)
	if !strings.HasSuffix(id, ".gw-a") {
		t.Fatalf("created %v", data)
	}
	if text, _, err := callSessions(t, csB, "sessions", map[string]any{"verb": "read", "sessionId": id}); err != nil {
		t.Fatalf("read through gw-b before the reload: %v %s", err, text)
	}
	out, err := a.TryReload(t, config("gw-a", siteA, "20s"))
	if err == nil || !strings.Contains(out, "restart caddy") || !strings.Contains(out, "gw-a") {
		t.Fatalf("a reload that changes the storage block under running sessions: %v\n%q\n%s", err, out, tail(a.Logs(), 2000))
	}
	a.Reload(t, config("gw-a", siteA, "15s"))
	for _, cs := range []*mcp.ClientSession{csA, csB} {
		if text, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": "again"}); err != nil {
			t.Fatalf("send after the reloads: %v %s", err, text)
		}
	}
	if text, _, err := callSessions(t, csB, "sessions", map[string]any{"verb": "wait", "sessionId": id}); err != nil {
		t.Fatalf("wait through gw-b after the reloads: %v %s", err, text)
	}
	// The token store is on the same connection: a token made now works.
	other := createToken(t, a, "after-reload", "--scope", "chat")
	waitStatus(t, "http://"+siteB+"/mcp", other, 200, 20*time.Second)
}

// A reload that changes the storage zidane_nats block opens another
// connection, and what is kept per storage (the token store) follows it:
// a reload of lock_ttl that fails leaves the admin API working on the
// running config's storage (Caddy keeps the failed config's admin routes,
// whose storage its failure closed), and one that succeeds leaves tokens
// working once the old connection has closed.
func TestClusterStorageBlockReloads(t *testing.T) {
	nats := startNATS(t)
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	config := func(ttl, mode string) string {
		return fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			%s
		}
	}
}

http://%s {
	zidane_mcp {
		%s
	}
	reverse_proxy %s
}
`, AdminPlaceholder, nats.url, ttl, site, mode, up.addr)
	}
	a := startCaddy(t, config("", "guard"), clusterKey)
	createToken(t, a, "one", "--scope", "mcp")
	if out, err := a.TryReload(t, config("lock_ttl 20s", "aggregate nosuch")); err == nil || !strings.Contains(out, "nosuch") {
		t.Fatalf("a reload onto an unknown upstream: %v %s", err, out)
	}
	two := createToken(t, a, "two", "--scope", "mcp")
	a.Reload(t, config("lock_ttl 20s", "guard"))
	three := createToken(t, a, "three", "--scope", "mcp")
	for _, tok := range []string{two, three} {
		waitStatus(t, "http://"+site+"/mcp", tok, http.StatusOK, 20*time.Second)
	}
	if _, stderr, err := a.Run(t, "zidane", "token", "revoke", "two"); err != nil {
		t.Fatalf("revoke after the reloads: %v %s", err, stderr)
	}
	waitStatus(t, "http://"+site+"/mcp", two, http.StatusUnauthorized, 20*time.Second)
}
