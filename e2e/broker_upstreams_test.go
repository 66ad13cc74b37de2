package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// headerRecorder is a reverse proxy on 127.0.0.1 in front of an upstream
// that records the headers of every request it forwards (streams included:
// it flushes at once).
type headerRecorder struct {
	mu   sync.Mutex
	seen []http.Header
}

func recordHeaders(t *testing.T, target string) (*headerRecorder, string) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rec := &headerRecorder{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.seen = append(rec.seen, r.Header.Clone())
		rec.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return rec, srv.URL
}

func (r *headerRecorder) values(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, h := range r.seen {
		out = append(out, h.Values(name)...)
	}
	return out
}

// The TypeScript reference server over legacy SSE, behind the aggregated
// route of the built binary: its tools are listed and called by the go-sdk
// and TypeScript clients, the upstream gets its configured secret on every
// request and never the client's token.
func TestAggregatedRouteWithAnSSEUpstream(t *testing.T) {
	base := startNodeEverythingServerIn(t, "sse")
	rec, front := recordHeaders(t, base)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream legacy %s/sse {
			transport sse
			header X-Upstream-Key ${UPSTREAM_KEY}
		}
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate legacy
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, front, port), "UPSTREAM_KEY="+upstreamKey)
	token := createToken(t, c, "agent", "--scope", "upstream:legacy")
	gw := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)

	cs, err := connectGo(t, gw, bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if names := toolNamesOf(tools); !slices.Contains(names, "mcp_legacy_echo") {
		t.Fatalf("tools over the SSE upstream = %v", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_legacy_echo", Arguments: map[string]any{"message": "over legacy sse"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "over legacy sse") {
		t.Fatalf("go-sdk client: %+v %v", res, err)
	}
	out, err := tsClient(t, gw, token, "call", "mcp_legacy_echo", `{"message":"from typescript"}`)
	if err != nil || !strings.Contains(out, "from typescript") {
		t.Fatalf("TypeScript client: %v\n%s", err, out)
	}

	keys := rec.values("X-Upstream-Key")
	if len(keys) == 0 {
		t.Fatal("the SSE upstream saw no request with the configured header")
	}
	for _, k := range keys {
		if k != upstreamKey {
			t.Fatalf("the upstream got X-Upstream-Key %q", k)
		}
	}
	for _, a := range rec.values("Authorization") {
		if strings.Contains(a, token) {
			t.Fatal("the client's token reached the SSE upstream")
		}
	}
	assertNoSecretsUnder(t, c.Dir, []string{token, upstreamKey})
}

// Behind the pass-through route an upstream that restarts forgets its
// sessions: the client gets the spec's 404 for its session (go-sdk:
// ErrSessionMissing), initializes again on the same gateway URL and works,
// without the gateway restarting.
func TestPassThroughUpstreamRestartMidSession(t *testing.T) {
	up := startRestartableUpstream(t)
	port := freePort(t)
	c := startCaddy(t, brokerCaddyfile(port, "http://"+up.addr+"/mcp"), "UPSTREAM_KEY="+upstreamKey)
	token := createToken(t, c, "agent", "--scope", "upstream:everything")
	gw := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	call := func(cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"})
	}
	// go-sdk's default retries: its standalone SSE stream, cut when the
	// upstream dies, is opened again and learns that the session is gone.
	connect := func() (*mcp.ClientSession, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-go", Version: "1"}, nil)
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: gw, HTTPClient: bearerClient(token, nil)}, nil)
		if err == nil {
			t.Cleanup(func() { cs.Close() })
		}
		return cs, err
	}
	cs, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	if res, err := call(cs); err != nil || res.IsError {
		t.Fatalf("before the restart: %+v %v", res, err)
	}

	up.restart()
	_, err = call(cs)
	if !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("after the upstream restarted, the old session got %v; want the spec's 404 (mcp.ErrSessionMissing)", err)
	}
	again, err := connect()
	if err != nil {
		t.Fatalf("initializing again through the gateway: %v", err)
	}
	if res, err := call(again); err != nil || res.IsError {
		t.Fatalf("after initializing again: %+v %v", res, err)
	}
}
