package idp

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// An on-premises IdP (Keycloak on 10.x) is reachable only when the
// operator says so (private_network): by default the gateway's requests
// to the IdP are refused at dial time on a private address, like every
// egress; with it, the address is dialed. The name is resolved by the
// test to 10.0.0.1, and the dial check under the guard refuses every
// address, so no packet leaves this host either way.
func TestIdPOnAPrivateNetwork(t *testing.T) {
	for _, allow := range []bool{false, true} {
		var dialed []string
		resolve := pinnedfetch.WithResolver(func(ctx context.Context, host, port string) ([]netip.AddrPort, error) {
			return []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:" + port)}, nil
		})
		net := pinnedfetch.WithDialCheck(func(address string) error {
			dialed = append(dialed, address)
			return errors.New("the test dials nothing")
		})
		c, err := idpClient("https://idp.corp.test", allow, resolve, net)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Get("https://idp.corp.test/.well-known/openid-configuration")
		switch {
		case err == nil:
			t.Fatalf("private_network %v: the request went through", allow)
		case !allow && (len(dialed) != 0 || !strings.Contains(err.Error(), "private address")):
			t.Errorf("without private_network: dialed %v, error %v; want refused by the guard, naming the private address", dialed, err)
		case allow && (len(dialed) != 1 || dialed[0] != "10.0.0.1:443"):
			t.Errorf("with private_network: dialed %v (%v); want 10.0.0.1:443 dialed", dialed, err)
		}
	}
}
