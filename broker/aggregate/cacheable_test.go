package aggregate

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ttlUp is a stateless (2026-07-28) go-sdk upstream whose listings carry
// ttlMs ttl.
func ttlUp(t *testing.T, name string, ttl int) upstream.Config {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ServerOptions{
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) { c.TTLMs = ttl },
	})
	mcp.AddTool(s, &mcp.Tool{Name: "t"}, func(context.Context, *mcp.CallToolRequest, any) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(srv.Close)
	return upstream.Config{Name: name, URL: srv.URL}
}

// The aggregate's tools/list is fresh for the smallest ttlMs of its
// upstreams' (a 2025-11-25 upstream gives none) and is private, for
// clients of both generations.
func TestAggregateListingCacheHints(t *testing.T) {
	legacy := newAggUp(t, "l")
	_, url := aggServe(t, []upstream.Config{ttlUp(t, "slow", 5000), ttlUp(t, "fast", 2000), legacy.config()}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, cs := range []*mcp.ClientSession{modernClient(t, url, "tok-1", nil), aggConnect(t, url, nil)} {
		res, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.TTLMs != 2000 || res.CacheScope != "private" {
			t.Errorf("%s client: tools/list ttlMs %d cacheScope %q; want 2000, private", cs.InitializeResult().ProtocolVersion, res.TTLMs, res.CacheScope)
		}
	}
	// With only a 2025-11-25 upstream there is no hint: 0, still private.
	_, url2 := aggServe(t, []upstream.Config{newAggUp(t, "only").config()}, Options{})
	res, err := modernClient(t, url2, "tok-1", nil).ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.TTLMs != 0 || res.CacheScope != "private" {
		t.Errorf("tools/list over a legacy upstream: ttlMs %d cacheScope %q; want 0, private", res.TTLMs, res.CacheScope)
	}
}
