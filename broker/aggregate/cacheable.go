package aggregate

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Cache hints (MCP 2026-07-28, SEP-2549) of the aggregated route's
// listings.
//
// A listing of the aggregate is made of its upstreams' listings, so it is
// fresh no longer than the freshest-expiring of them: its ttlMs is the
// smallest ttlMs that the upstreams of that kind gave on their last
// listing (upstreams that speak 2025-11-25, which has no ttlMs, give none;
// with none at all it is 0, immediately stale). Its cacheScope is always
// "private": behind the edge, every listing of this route is filtered for
// the token that asked (edge.Listing shows a principal only the items of
// the upstreams it may use), so no cache may serve it to anyone else.

// The kinds of listing, indices of aggUpstream.ttl.
const (
	kindTools = iota
	kindPrompts
	kindResources
	kindTemplates
	numKinds
)

// setTTL records the ttlMs of up's last listing of kind: ttl < 0 or a
// failed listing is none.
func (up *aggUpstream) setTTL(kind, ttl int, err error) {
	up.mu.Lock()
	defer up.mu.Unlock()
	if err != nil || ttl < 0 {
		up.ttlKnown[kind] = false
		return
	}
	up.ttl[kind], up.ttlKnown[kind] = ttl, true
}

// listingTTL is the smallest recorded ttlMs of kind across the upstreams,
// and whether any upstream gave one.
func (a *Aggregate) listingTTL(kind int) (int, bool) {
	best, found := 0, false
	for _, up := range a.ups {
		up.mu.Lock()
		ttl, known := up.ttl[kind], up.ttlKnown[kind]
		up.mu.Unlock()
		if known && (!found || ttl < best) {
			best, found = ttl, true
		}
	}
	return best, found
}

// setCacheable is the server's [mcp.ServerOptions.SetCacheable].
func (a *Aggregate) setCacheable(_ context.Context, req mcp.Request, c *mcp.Cacheable) {
	kind := -1
	switch req.GetParams().(type) {
	case *mcp.ListToolsParams:
		kind = kindTools
	case *mcp.ListPromptsParams:
		kind = kindPrompts
	case *mcp.ListResourcesParams:
		kind = kindResources
	case *mcp.ListResourceTemplatesParams:
		kind = kindTemplates
	}
	if kind < 0 {
		return
	}
	c.TTLMs = 0
	if ttl, ok := a.listingTTL(kind); ok {
		c.TTLMs = ttl
	}
	c.CacheScope = "private"
}
