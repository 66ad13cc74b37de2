package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// brokerCaddyfile offers upstream url as `broker everything` on port, with
// an upstream credential from the environment.
func brokerCaddyfile(port int, url string) string {
	return fmt.Sprintf(`{
	admin %s
	zidane {
		upstream everything %s {
			header X-Upstream-Key ${UPSTREAM_KEY}
		}
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		broker everything
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, url, port)
}

const upstreamKey = "upstream-key-8d3f"

// TestBrokerPassThrough: the broker's pass-through route with an upstream
// credential of the operator's. (TestConformanceServerRoutes runs the
// conformance suite through it.)
func TestBrokerPassThrough(t *testing.T) {
	upstream := startEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, brokerCaddyfile(port, upstream), "UPSTREAM_KEY="+upstreamKey)
	token := createToken(t, c, "agent", "--scope", "upstream:everything")
	brokerURL := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)

	t.Run("go-sdk and TypeScript clients", func(t *testing.T) {
		cs, err := connectGo(t, brokerURL, bearerClient(token, nil))
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"})
		if err != nil || res.IsError {
			t.Fatalf("call: %+v %v", res, err)
		}
		if out, err := tsClient(t, brokerURL, token, "list-tools"); err != nil || !strings.Contains(out, "test_simple_text") {
			t.Fatalf("TS client: %v %s", err, out)
		}
	})

	t.Run("a session id replayed with another token is refused", func(t *testing.T) {
		other := createToken(t, c, "other", "--scope", "upstream:everything")
		init := post(t, brokerURL, token, initializeBody)
		sid := init.header.Get("Mcp-Session-Id")
		if init.status != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %d %q", init.status, sid)
		}
		if a := post(t, brokerURL, token, `{"jsonrpc":"2.0","id":2,"method":"ping"}`, "Mcp-Session-Id", sid); a.status != http.StatusOK {
			t.Fatalf("own session: %d %s", a.status, a.body)
		}
		if a := post(t, brokerURL, other, `{"jsonrpc":"2.0","id":2,"method":"ping"}`, "Mcp-Session-Id", sid); a.status != http.StatusNotFound {
			t.Fatalf("replayed with another token: %d %s", a.status, a.body)
		}
		if a := post(t, brokerURL, token, `{"jsonrpc":"2.0","id":2,"method":"ping"}`, "Mcp-Session-Id", sid+"x"); a.status != http.StatusNotFound {
			t.Fatalf("forged: %d %s", a.status, a.body)
		}
		found := false
		for _, l := range auditLines(c) {
			found = found || (l["event"] == "refused" && l["token_name"] == "other" && l["upstream"] == "everything")
		}
		if !found {
			t.Fatal("no audit line for the replayed session id")
		}
	})

	t.Run("a token without the upstream's scope is refused", func(t *testing.T) {
		chat := createToken(t, c, "chat-only", "--scope", "chat")
		if a := post(t, brokerURL, chat, toolCallBody("test_simple_text")); a.status != http.StatusForbidden {
			t.Fatalf("%d %s", a.status, a.body)
		}
	})

	t.Run("caddy zidane upstream list shows placeholders, never secrets", func(t *testing.T) {
		for _, args := range [][]string{{"zidane", "upstream", "list"}, {"zidane", "upstream", "list", "--json"}} {
			out, stderr, err := c.Run(t, args...)
			if err != nil || !strings.Contains(out, "everything") || strings.Contains(out, upstreamKey) {
				t.Fatalf("%v: %v %s\n%s", args, err, stderr, out)
			}
		}
		out, _, _ := c.Run(t, "zidane", "upstream", "list", "--json")
		if !strings.Contains(out, "${UPSTREAM_KEY}") {
			t.Fatalf("the listing lost the placeholder:\n%s", out)
		}
	})

	t.Run("upstream calls are audited and nothing secret is written", func(t *testing.T) {
		calls := 0
		for _, l := range auditLines(c) {
			if l["event"] == "upstream_call" && l["upstream"] == "everything" {
				calls++
			}
		}
		if calls == 0 {
			t.Fatal("no upstream_call audit line")
		}
		assertNoSecretsUnder(t, c.Dir, []string{token, upstreamKey})
	})
}

func TestBrokerRedirectOffOriginCarriesNoCredential(t *testing.T) {
	elsewhere := startRecordingUpstream(t)
	redirecting := startRedirectingUpstream(t, elsewhere.url)
	port := freePort(t)
	c := startCaddy(t, brokerCaddyfile(port, redirecting.url), "UPSTREAM_KEY="+upstreamKey)
	token := createToken(t, c, "agent", "--scope", "upstream:everything")
	post(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), token, initializeBody)

	redirecting.mu.Lock()
	defer redirecting.mu.Unlock()
	elsewhere.mu.Lock()
	defer elsewhere.mu.Unlock()
	if len(redirecting.seen) == 0 || redirecting.seen[0].Get("X-Upstream-Key") != upstreamKey {
		t.Fatalf("the configured upstream did not get its credential: %v", redirecting.seen)
	}
	for _, h := range elsewhere.seen {
		if h.Get("X-Upstream-Key") != "" || h.Get("Authorization") != "" {
			t.Fatalf("a credential followed the redirect off the upstream's origin: %v", h)
		}
	}
	found := false
	for _, l := range auditLines(c) {
		found = found || (l["event"] == "redirect" && l["upstream"] == "everything")
	}
	if !found {
		t.Fatal("no audit line for the redirect decision")
	}
}
