package message

import "context"

type contextKey struct{}

// NewContext returns ctx carrying b, the body the edge read and decided
// on, for the route that serves it: the route forwards b.Raw and reads
// b.Calls, and reads the body no second time.
func NewContext(ctx context.Context, b *Body) context.Context {
	return context.WithValue(ctx, contextKey{}, b)
}

// FromContext returns the Body that NewContext put in ctx.
func FromContext(ctx context.Context) (*Body, bool) {
	b, ok := ctx.Value(contextKey{}).(*Body)
	return b, ok && b != nil
}
