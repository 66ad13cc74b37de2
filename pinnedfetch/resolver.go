package pinnedfetch

import (
	"context"
	"net/netip"
)

// WithResolver replaces DNS resolution for host names (an IP literal is
// dialed as it is): fn returns the addresses to dial for host and port,
// tried in order. The address guard, when on, still judges each address fn
// returns, at dial time, so a resolver never lets a private address
// through.
//
// It exists for tests of code that fetches through a pinned client: they
// point a name at a loopback listener (with the guard off), or at a private
// address that the guard must refuse before any packet is sent.
func WithResolver(fn func(ctx context.Context, host, port string) ([]netip.AddrPort, error)) Option {
	return func(o *options) { o.lookup = fn }
}

// WithDialCheck runs fn on every address about to be dialed ("ip:port"),
// after the address guard and before connect(2); an error from fn refuses
// the dial. fn never runs for an address the guard refused.
//
// It exists as a test's net under the guard: a test that refuses every
// address off loopback here fails, instead of sending a packet out, when
// the guard it relies on is broken.
func WithDialCheck(fn func(address string) error) Option {
	return func(o *options) { o.safetyNet = fn }
}
