package aggregate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ToolCache keeps each upstream's last tool listing across restarts of the
// gateway, so the aggregated route offers an upstream's tools before the
// upstream answers: a shared stdio upstream with a cached listing is not
// started until a call needs it (lazy connect), and an unreachable remote
// upstream's tools are listed, their calls getting a tool error that names
// it, until it comes back and lists again. Keys are upstream names. Load
// returns an error (any) when nothing is cached.
type ToolCache interface {
	Load(ctx context.Context, upstream string) ([]byte, error)
	Store(ctx context.Context, upstream string, data []byte) error
}

// cachedTools is what a [ToolCache] holds for one upstream.
type cachedTools struct {
	// Config identifies the upstream's config the listing came from
	// ([toolCacheKey]): a listing of another server of the same name is
	// not used.
	Config string      `json:"config"`
	Tools  []*mcp.Tool `json:"tools"`
}

// toolCacheKey fingerprints what decides which server an upstream is:
// transport, URL, command and arguments as configured (placeholders
// unexpanded), and the names, never the values, of its headers and
// environment variables.
func toolCacheKey(n upstream.Config) string {
	h := sha256.New()
	write := func(s string) { h.Write([]byte(s)); h.Write([]byte{0}) }
	write(n.Transport)
	write(n.URL)
	write(n.Command)
	for _, a := range n.Args {
		write(a)
	}
	for _, m := range []map[string]string{n.Headers, n.Env} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, strings.ToLower(k))
		}
		slices.Sort(keys)
		write(strings.Join(keys, ","))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// loadCachedTools returns up's cached listing, or nil when there is none
// for its current config.
func (a *Aggregate) loadCachedTools(up *aggUpstream) []*mcp.Tool {
	if a.cache == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(a.ctx, up.timeout)
	defer cancel()
	data, err := a.cache.Load(ctx, up.cfg.Name)
	if err != nil || len(data) == 0 {
		return nil
	}
	var c cachedTools
	if err := json.Unmarshal(data, &c); err != nil {
		a.logger.Warn("aggregate: ignoring an unreadable cached tool listing", "upstream", up.cfg.Name, "error", err.Error())
		return nil
	}
	if c.Config != toolCacheKey(up.cfg) {
		return nil
	}
	up.mu.Lock()
	up.cachedJSON = data
	up.mu.Unlock()
	return c.Tools
}

// storeCachedTools records up's listing when it differs from what is
// cached. A failure is logged: the cache only speeds up the next start.
func (a *Aggregate) storeCachedTools(ctx context.Context, up *aggUpstream, listed []*mcp.Tool) {
	if a.cache == nil {
		return
	}
	data, err := json.Marshal(cachedTools{Config: toolCacheKey(up.cfg), Tools: listed})
	if err != nil {
		return
	}
	up.mu.Lock()
	same := bytes.Equal(up.cachedJSON, data)
	up.mu.Unlock()
	if same {
		return
	}
	if err := a.cache.Store(ctx, up.cfg.Name, data); err != nil {
		a.logger.Warn("aggregate: caching the tool listing failed", "upstream", up.cfg.Name, "error", err.Error())
		return
	}
	up.mu.Lock()
	up.cachedJSON = data
	up.mu.Unlock()
}
