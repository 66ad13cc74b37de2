package mcpendpoint

import "context"

type baseKey struct{}

// WithBase returns a context that carries base: where the agents of the
// sessions created in it reach this gateway (scheme://host:port). The edge
// sets it from its configuration or the listener a request arrived on,
// never from the request's Host, because the MCP server URLs handed to an
// agent carry its tokens.
func WithBase(ctx context.Context, base string) context.Context {
	return context.WithValue(ctx, baseKey{}, base)
}

// BaseFrom returns the base ctx carries, or "".
func BaseFrom(ctx context.Context) string {
	b, _ := ctx.Value(baseKey{}).(string)
	return b
}
