package pinnedfetch

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

func TestCheckAddress(t *testing.T) {
	tests := map[string]string{
		"93.184.216.34":          "",
		"8.8.8.8":                "",
		"2606:4700::1111":        "",
		"100.63.255.255":         "",
		"100.128.0.0":            "",
		"172.32.0.1":             "",
		"10.0.0.5":               "private address (RFC 1918)",
		"172.16.0.1":             "private address (RFC 1918)",
		"172.31.255.255":         "private address (RFC 1918)",
		"192.168.1.1":            "private address (RFC 1918)",
		"127.0.0.1":              "loopback address",
		"127.8.9.10":             "loopback address",
		"169.254.169.254":        "cloud metadata address",
		"169.254.1.1":            "link-local address",
		"100.64.0.1":             "shared CGNAT address (RFC 6598)",
		"100.127.255.255":        "shared CGNAT address (RFC 6598)",
		"0.0.0.0":                "unspecified address (0.0.0.0/8)",
		"224.0.0.1":              "multicast address",
		"255.255.255.255":        "reserved or broadcast address (240.0.0.0/4)",
		"::":                     "unspecified address",
		"::1":                    "loopback address",
		"fe80::1":                "link-local address",
		"fe80::1%eth0":           "link-local address",
		"fc00::1":                "private address (unique local, fc00::/7)",
		"fd12:3456::1":           "private address (unique local, fc00::/7)",
		"fd00:ec2::254":          "cloud metadata address",
		"fec0::1":                "private address (site-local, fec0::/10)",
		"ff02::1":                "multicast address",
		"::ffff:10.0.0.1":        "private address (RFC 1918) in IPv4-mapped IPv6 form",
		"::ffff:127.0.0.1":       "loopback address in IPv4-mapped IPv6 form",
		"::ffff:169.254.169.254": "cloud metadata address in IPv4-mapped IPv6 form",
		"::ffff:93.184.216.34":   "",
		"64:ff9b::10.0.0.1":      "private address (RFC 1918) embedded in IPv6",
		"64:ff9b::93.184.216.34": "",
		"::10.0.0.1":             "private address (RFC 1918) embedded in IPv6",
	}
	for in, want := range tests {
		if got := CheckAddress(netip.MustParseAddr(in)); got != want {
			t.Errorf("CheckAddress(%s) = %q, want %q", in, got, want)
		}
	}
	if CheckAddress(netip.Addr{}) == "" {
		t.Error("the zero Addr passes")
	}
}

// TestControlRunsBeforeConnect dials a private address with the guard as
// the dialer's Control. net.Dialer calls Control after socket(2) and before
// connect(2), so a refusal here means nothing was sent; the address is one
// nothing on this machine would answer.
func TestControlRunsBeforeConnect(t *testing.T) {
	d := &net.Dialer{ControlContext: func(ctx context.Context, network, address string, c syscall.RawConn) error {
		if err := guardControl(ctx, network, address, c); err != nil {
			return err
		}
		return errSafetyNet
	}}
	c, err := d.DialContext(context.Background(), "tcp", "10.255.255.1:9")
	if c != nil {
		c.Close()
		t.Fatal("connected to 10.255.255.1")
	}
	var de *DialError
	if !errors.As(err, &de) {
		t.Fatalf("got %v, want the guard to refuse before connecting", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" {
		t.Errorf("got %#v, want a dial *net.OpError wrapping the refusal", err)
	}
	if want := "pinnedfetch: refusing to dial 10.255.255.1:9: private address (RFC 1918)"; !strings.HasPrefix(de.Error(), want) {
		t.Errorf("message %q, want it to start with %q", de.Error(), want)
	}
}

func TestDialGuard(t *testing.T) {
	e := newEnv(t, nil)
	tests := []struct {
		resolved string // what the name resolves to
		rule     string
		ipv6     bool
	}{
		{"10.255.255.1:443", "private address (RFC 1918)", false},
		{"192.168.0.10:443", "private address (RFC 1918)", false},
		{"169.254.169.254:443", "cloud metadata address", false},
		{"100.64.0.1:443", "shared CGNAT address (RFC 6598)", false},
		{"0.0.0.0:443", "unspecified address (0.0.0.0/8)", false},
		{"224.0.0.1:443", "multicast address", false},
		{"[::ffff:10.0.0.1]:443", "private address (RFC 1918)", false},
		// A real listener: the guard must refuse loopback even though
		// something would answer.
		{"127.0.0.1:" + port(e.S), "loopback address", false},
		{"[fd00:ec2::254]:443", "cloud metadata address", true},
		{"[fc00::1]:443", "private address (unique local, fc00::/7)", true},
		{"[fe80::1]:443", "link-local address", true},
	}
	for _, tt := range tests {
		t.Run(tt.resolved, func(t *testing.T) {
			if tt.ipv6 && e.S6 == nil {
				t.Skip("no IPv6 on this machine")
			}
			ap := netip.MustParseAddrPort(tt.resolved)
			c, err := New("https://internal.example.com/", nil,
				withLookup(func(context.Context, string, string) ([]netip.AddrPort, error) {
					return []netip.AddrPort{ap}, nil
				}), loopbackOnly)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Get("https://internal.example.com/mcp")
			var de *DialError
			if !errors.As(err, &de) {
				t.Fatalf("got %v, want a *DialError", err)
			}
			if !strings.Contains(de.Rule, tt.rule) {
				t.Errorf("rule %q, want %q", de.Rule, tt.rule)
			}
			if de.Address.Port() != ap.Port() {
				t.Errorf("error names %s, want port %d", de.Address, ap.Port())
			}
			if !strings.Contains(err.Error(), "DenyPrivateAddresses(false)") {
				t.Errorf("error %q does not say what to do", err)
			}
		})
	}
	e.checkHits(nil)
}

// TestDNSRebinding has a name answer with a public address when a caller
// checks it, then with a private one when the client dials: the guard judges
// the dialed address, so the check-then-use gap does not help.
func TestDNSRebinding(t *testing.T) {
	var calls atomic.Int32
	lookup := func(context.Context, string, string) ([]netip.AddrPort, error) {
		if calls.Add(1) == 1 {
			return []netip.AddrPort{netip.MustParseAddrPort("93.184.216.34:443")}, nil
		}
		return []netip.AddrPort{netip.MustParseAddrPort("10.0.0.5:443")}, nil
	}
	checked, _ := lookup(context.Background(), "rebind.example.com", "443")
	if rule := CheckAddress(checked[0].Addr()); rule != "" {
		t.Fatalf("time-of-check address refused: %s", rule)
	}
	c, err := New("https://rebind.example.com/", nil, withLookup(lookup), loopbackOnly)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Get("https://rebind.example.com/mcp")
	var de *DialError
	if !errors.As(err, &de) || de.Address.String() != "10.0.0.5:443" {
		t.Fatalf("got %v, want the dial to 10.0.0.5:443 refused", err)
	}
	if calls.Load() != 2 {
		t.Errorf("lookup ran %d times, want 2", calls.Load())
	}
}

func TestGuardDefaults(t *testing.T) {
	e := newEnv(t, nil)
	trust := WithTLSConfig(&tls.Config{RootCAs: e.pool})
	tests := []struct {
		name    string
		pinned  string
		opts    []Option
		refused bool
	}{
		{"loopback configured URL: guard off", "http://127.0.0.1:{hport}/", nil, false},
		{"localhost configured URL: guard off", "http://localhost:{hport}/", nil, false},
		{"public configured URL: guard on", "https://example.com/", nil, true},
		{"guard forced on for loopback", "http://127.0.0.1:{hport}/", []Option{DenyPrivateAddresses(true)}, true},
		{"guard forced off", "https://example.com/", []Option{DenyPrivateAddresses(false)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pinned := e.expand(tt.pinned)
			opts := append([]Option{trust, withLookup(e.lookup), loopbackOnly}, tt.opts...)
			c, err := New(pinned, nil, opts...)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Get(pinned)
			if resp != nil {
				resp.Body.Close()
			}
			var de *DialError
			if refused := errors.As(err, &de); refused != tt.refused {
				t.Fatalf("refused = %v (%v), want %v", refused, err, tt.refused)
			}
			if !tt.refused && err != nil {
				t.Fatal(err)
			}
		})
	}
}
