//go:build linux

package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type memToolCache struct {
	mu     sync.Mutex
	m      map[string][]byte
	stores int
}

func (c *memToolCache) Load(_ context.Context, upstream string) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.m[upstream]; ok {
		return b, nil
	}
	return nil, errors.New("not cached")
}

func (c *memToolCache) Store(_ context.Context, upstream string, data []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string][]byte{}
	}
	c.m[upstream] = data
	c.stores++
	return nil
}

// A gateway that listed a shared stdio upstream once offers its tools at the
// next start without starting it; the first call starts it.
func TestAggregateToolCacheLazyStdio(t *testing.T) {
	cache := &memToolCache{}
	up := stdioUpstream(t)
	ctx := upstreamtest.Ctx(t)

	first, url := aggServe(t, []Upstream{up}, AggregateOptions{ToolCache: cache, StdioIdle: -1})
	cs := aggConnect(t, url, nil)
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "one"); got != "stdio: one" {
		t.Fatalf("first gateway: %q", got)
	}
	cs.Close()
	first.Close()
	if _, err := cache.Load(ctx, "local"); err != nil {
		t.Fatal("the listing was not cached")
	}

	logs := &upstreamtest.LogCapture{}
	_, url = aggServe(t, []Upstream{up}, AggregateOptions{ToolCache: cache, StdioIdle: -1, Logger: slog.New(logs)})
	cs = aggConnect(t, url, nil)
	if got := aggToolNames(t, ctx, cs); !slices.Contains(got, "mcp_local_echo") {
		t.Fatalf("tools from the cache: %v", got)
	}
	if pids := stdioPids(logs, "local"); len(pids) != 0 {
		t.Fatalf("the stdio upstream started before any call: pids %v", pids)
	}
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "two"); got != "stdio: two" {
		t.Fatalf("call on the lazily started upstream: %q", got)
	}
	if pids := waitPids(t, ctx, logs, "local", 1); len(pids) != 1 {
		t.Fatalf("pids %v, want one process started by the call", pids)
	}
	stores := cache.stores
	if stores != 1 {
		t.Fatalf("%d cache writes for an unchanged listing, want 1", stores)
	}

	// Another command under the same name is another server: its cached
	// listing is not offered.
	other := up
	other.Args = append(slices.Clone(up.Args), "--other")
	if c := (&Aggregate{cache: cache, ctx: ctx, logger: slog.New(slog.DiscardHandler)}).loadCachedTools(&aggUpstream{cfg: mustNormalize(t, other), timeout: time.Second}); c != nil {
		t.Fatalf("a listing cached for another command was used: %d tools", len(c))
	}
}

// An unreachable remote upstream with a cached listing: its tools are
// offered, and a call gets a tool error naming it.
func TestAggregateToolCacheUnreachableUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("http://%s/mcp", ln.Addr())
	ln.Close()
	u := Upstream{Name: "remote", URL: dead}
	cache := &memToolCache{}
	data := fmt.Sprintf(`{"config":%q,"tools":[{"name":"search","inputSchema":{"type":"object"}}]}`, toolCacheKey(mustNormalize(t, u)))
	cache.Store(context.Background(), "remote", []byte(data))

	_, url := aggServe(t, []Upstream{u}, AggregateOptions{ToolCache: cache})
	cs := aggConnect(t, url, nil)
	ctx := upstreamtest.Ctx(t)
	if got := aggToolNames(t, ctx, cs); !slices.Equal(got, []string{"mcp_remote_search"}) {
		t.Fatalf("tools = %v, want the cached listing", got)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_remote_search", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(aggTextOf(res), `"remote"`) {
		t.Fatalf("call to the unreachable upstream: isError %v %q, want a tool error naming it", res.IsError, aggTextOf(res))
	}
}

func mustNormalize(t *testing.T, u Upstream) Upstream {
	t.Helper()
	n, err := Normalize(u)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
