package pinnedfetch

import (
	"context"
	"crypto/tls"
	"errors"
	"net/netip"
	"testing"
)

// TestResolverDoesNotBypassTheGuard points a name at a private address
// through WithResolver: the guard refuses the dial, and the dial check
// under it never sees the address.
func TestResolverDoesNotBypassTheGuard(t *testing.T) {
	var checked []string
	c, err := New("https://private.example.com/doc", nil,
		WithResolver(func(context.Context, string, string) ([]netip.AddrPort, error) {
			return []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:443")}, nil
		}),
		WithDialCheck(func(address string) error {
			checked = append(checked, address)
			return errSafetyNet
		}))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get("https://private.example.com/doc")
	if resp != nil {
		resp.Body.Close()
	}
	var de *DialError
	if !errors.As(err, &de) || de.Address.String() != "10.0.0.1:443" {
		t.Fatalf("got %v, want the dial to 10.0.0.1:443 refused by the guard", err)
	}
	if len(checked) != 0 {
		t.Errorf("the dial check saw %v: the guard let a private address through", checked)
	}
}

// TestResolverReachesLoopbackWithGuardOff is the tests' way to a local
// server under a public name: WithResolver maps it, the guard is off, and
// WithDialCheck sees the loopback address.
func TestResolverReachesLoopbackWithGuardOff(t *testing.T) {
	e := newEnv(t, nil)
	var checked []string
	c, err := New("https://example.com/", nil, WithTLSConfig(&tls.Config{RootCAs: e.pool}),
		WithResolver(e.lookup), DenyPrivateAddresses(false),
		WithDialCheck(func(address string) error {
			checked = append(checked, address)
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get("https://example.com/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(checked) == 0 || !netip.MustParseAddrPort(checked[0]).Addr().IsLoopback() {
		t.Errorf("dial check saw %v, want a loopback address", checked)
	}
}
