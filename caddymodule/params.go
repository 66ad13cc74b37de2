package caddymodule

import (
	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/edge"
)

// paramsPool keeps each route's learned x-mcp-header bindings (see
// edge.ParamHeaders) across config reloads, keyed by what the route
// fronts: a reload that keeps the route keeps what it learned.
var paramsPool = caddy.NewUsagePool()

type paramsEntry struct{ ph *edge.ParamHeaders }

func (*paramsEntry) Destruct() error { return nil }

// sharedParams returns the pooled bindings store under key; the handler
// releases it in Cleanup.
func (h *Handler) sharedParams(key string) *edge.ParamHeaders {
	v, _, _ := paramsPool.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &paramsEntry{ph: new(edge.ParamHeaders)}, nil
	})
	h.paramsKey = key
	return v.(*paramsEntry).ph
}
