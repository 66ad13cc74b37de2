package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The URLs handed to agents (their MCP servers, with a bearer token in the
// headers) come from the site's configuration or the listener a session
// was created on, never from a request's Host. A token holder who sends
// requests with the Host of a port of theirs, while other users' agents
// launch, gets no agent's token on that port.
func TestSessionsAgentURLsIgnoreHost(t *testing.T) {
	upstream := startEverythingServer(t)
	port := freePort(t)

	// The attacker's listener, on loopback: every connection it gets is a
	// leak.
	rec, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int32
	go func() {
		for {
			conn, err := rec.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			conn.Close()
		}
	}()
	t.Cleanup(func() { rec.Close() })
	poisoned := rec.Addr().String()

	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream everything %s
		session_upstreams everything
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		sessions
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, upstream, port))
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	gateway := fmt.Sprintf("http://127.0.0.1:%d/", port)

	// The attacker: every request it sends names its own port as Host.
	attacker := createToken(t, c, "attacker", "--scope", "chat")
	withHost := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Host = poisoned
		return http.DefaultTransport.RoundTrip(r)
	})
	acs, err := connectGo(t, url, bearerClient(attacker, withHost))
	if err != nil {
		t.Fatal(err)
	}
	victim := createToken(t, c, "victim", "--scope", "chat")
	vcs, err := connectGo(t, url, bearerClient(victim, nil))
	if err != nil {
		t.Fatal(err)
	}

	// Both create sessions at once, the victim's an orchestrator too (its
	// agent gets the sessions endpoint with a child token), while the
	// attacker keeps sending.
	var wg sync.WaitGroup
	ids := make([]string, 4)
	errs := make([]error, 4)
	for i := range ids {
		cs := vcs
		args := map[string]any{"verb": "create", "cwd": t.TempDir(), "prompt": "mcp", "tools": []string{"read", "list"}}
		if i%2 == 1 {
			cs = acs
			args = map[string]any{"verb": "create", "cwd": t.TempDir(), "prompt": "mcp"}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, created, err := callSessions(t, cs, "sessions", args)
			if err != nil {
				errs[i] = err
				return
			}
			ids[i], _ = created["sessionId"].(string)
		}()
	}
	// (tools/list: go-sdk's client at 2026-07-28, which it chose here, has
	// no ping.)
	for range 20 {
		if _, err := acs.ListTools(t.Context(), nil); err != nil {
			t.Fatalf("the attacker's tools/list: %v", err)
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	for i, id := range ids {
		cs := vcs
		if i%2 == 1 {
			cs = acs
		}
		tr := transcriptText(t, cs, id)
		// The demo agent's `mcp` prompt lists the MCP servers it was given.
		if !strings.Contains(tr, gateway+"zidane/upstream/everything/mcp") {
			t.Errorf("session %d was not given the upstream on the gateway's listener:\n%s", i, tr)
		}
		if i%2 == 0 && !strings.Contains(tr, gateway+"mcp") {
			t.Errorf("orchestrator session %d was not given the sessions endpoint on the gateway's listener:\n%s", i, tr)
		}
		if strings.Contains(tr, poisoned) {
			t.Errorf("session %d was handed a URL on the Host the attacker sent:\n%s", i, tr)
		}
	}
	// The links of the sessions, listed by the attacker, point at the
	// gateway too.
	text, _, err := callSessions(t, acs, "sessions", map[string]any{"verb": "list"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text, poisoned) {
		t.Errorf("a session's link names the attacker's Host:\n%s", text)
	}
	// The agents used what they were given: their upstream calls went
	// through the gateway.
	sendAndWait(t, acs, ids[1], "mcp: tools everything", "test_simple_text")
	if n := reached.Load(); n != 0 {
		t.Fatalf("the attacker's listener got %d connections", n)
	}
}

// A sessions endpoint on an https site without an absolute `resource`
// cannot tell its agents where it is: the config is refused, and says what
// to set.
func TestSessionsHTTPSNeedsResource(t *testing.T) {
	port, tlsPort := freePort(t), freePort(t)
	site := func(resource string) string {
		return fmt.Sprintf(`{
	admin %s
	https_port %d
	local_certs
	skip_install_trust
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		sessions
	}
}

https://localhost:%d {
	bind 127.0.0.1
	zidane_mcp {
		sessions
		%s
	}
}
`, AdminPlaceholder, tlsPort, port, tlsPort, resource)
	}
	c := startCaddy(t, site(fmt.Sprintf("resource https://localhost:%d/mcp", tlsPort)))
	out, err := c.TryReload(t, site(""))
	if err == nil || !strings.Contains(out, "needs `resource https://") {
		t.Fatalf("an https sessions site without resource was accepted (%v):\n%s", err, out)
	}
}

// sendAndWait sends prompt to a session and waits for its answer to contain want.
func sendAndWait(t *testing.T, cs *mcp.ClientSession, id, prompt, want string) {
	t.Helper()
	if _, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": prompt}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		text, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id, "turns": 1, "full": true})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(text, "prompt: "+prompt) && strings.Contains(text, "(end_turn)") {
			if !strings.Contains(text, want) {
				t.Fatalf("the answer to %q lacks %q:\n%s", prompt, want, text)
			}
			return
		}
		callSessions(t, cs, "sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 5})
	}
	t.Fatalf("no answer to %q", prompt)
}
