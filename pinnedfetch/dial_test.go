package pinnedfetch

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestCheckAddress walks the IANA IPv4 and IPv6 Special-Purpose Address
// Registries entry by entry, with an address inside each entry and the
// guard's verdict on it ("" passes), plus the public controls that must pass.
// The guard refuses every entry that is not globally reachable. It also
// refuses entries the registries mark as globally reachable but that
// answer at a nearby device rather than across the Internet: the PCP, TURN
// and DNS-SD anycast addresses, and the ORCHIDv2 and DRIP identifiers,
// which are routed by an overlay on the host rather than as locators. It
// lets through the globally reachable AS112, AMT and NAT64 well-known
// entries, NAT64, 6to4 and Teredo judged by the IPv4 addresses they carry.
func TestCheckAddress(t *testing.T) {
	tests := []struct {
		entry string // the registry entry, or what the row shows
		addr  string
		want  string
	}{
		// Public controls.
		{"public IPv4", "8.8.8.8", ""},
		{"public IPv4", "93.184.216.34", ""},
		{"public IPv4", "1.1.1.1", ""},
		{"public IPv6", "2606:4700::1111", ""},
		{"public IPv6", "2001:4860:4860::8888", ""},
		{"just outside 100.64.0.0/10", "100.63.255.255", ""},
		{"just outside 100.64.0.0/10", "100.128.0.0", ""},
		{"just outside 172.16.0.0/12", "172.32.0.1", ""},
		{"just outside 192.0.0.0/24", "192.0.1.1", ""},
		{"just outside 198.18.0.0/15", "198.17.255.255", ""},
		{"just outside 198.18.0.0/15", "198.20.0.0", ""},
		{"just outside 2001::/23", "2001:200::1", ""},
		{"just outside 3fff::/20", "3fff:1000::1", ""},

		// IANA IPv4 Special-Purpose Address Registry.
		{"0.0.0.0/8 this network, RFC 791", "0.1.2.3", "this-network address (0.0.0.0/8, RFC 791)"},
		{"0.0.0.0/32 this host on this network, RFC 1122", "0.0.0.0", "this-network address (0.0.0.0/8, RFC 791)"},
		{"10.0.0.0/8 private-use, RFC 1918", "10.0.0.5", "private address (RFC 1918)"},
		{"100.64.0.0/10 shared address space, RFC 6598", "100.64.0.1", "shared CGNAT address (RFC 6598)"},
		{"100.64.0.0/10 shared address space, RFC 6598", "100.127.255.255", "shared CGNAT address (RFC 6598)"},
		{"127.0.0.0/8 loopback, RFC 1122", "127.0.0.1", "loopback address (RFC 1122)"},
		{"127.0.0.0/8 loopback, RFC 1122", "127.8.9.10", "loopback address (RFC 1122)"},
		{"169.254.0.0/16 link local, RFC 3927", "169.254.1.1", "link-local address (RFC 3927)"},
		{"169.254.169.254, the cloud metadata service", "169.254.169.254", "cloud metadata address"},
		{"172.16.0.0/12 private-use, RFC 1918", "172.16.0.1", "private address (RFC 1918)"},
		{"172.16.0.0/12 private-use, RFC 1918", "172.31.255.255", "private address (RFC 1918)"},
		{"192.0.0.0/24 IETF protocol assignments, RFC 6890", "192.0.0.200", "IETF protocol assignment (192.0.0.0/24, RFC 6890)"},
		{"192.0.0.0/29 IPv4 service continuity prefix, RFC 7335", "192.0.0.1", "IPv4 service continuity address (192.0.0.0/29, RFC 7335)"},
		{"192.0.0.8/32 IPv4 dummy address, RFC 7600", "192.0.0.8", "IPv4 dummy address (192.0.0.8, RFC 7600)"},
		// Globally reachable in the registry, but anycast to the nearest
		// PCP server or TURN relay: a device of the local network.
		{"192.0.0.9/32 PCP anycast, RFC 7723", "192.0.0.9", "PCP anycast address (192.0.0.9, RFC 7723): it answers at a nearby gateway"},
		{"192.0.0.10/32 TURN anycast, RFC 8155", "192.0.0.10", "TURN anycast address (192.0.0.10, RFC 8155): it answers at a nearby relay"},
		{"192.0.0.170/32 NAT64/DNS64 discovery, RFC 8880", "192.0.0.170", "NAT64/DNS64 discovery address (RFC 8880)"},
		{"192.0.0.171/32 NAT64/DNS64 discovery, RFC 8880", "192.0.0.171", "NAT64/DNS64 discovery address (RFC 8880)"},
		{"192.0.2.0/24 documentation (TEST-NET-1), RFC 5737", "192.0.2.1", "documentation address (TEST-NET-1, RFC 5737)"},
		// Globally reachable, and anycast across the Internet.
		{"192.31.196.0/24 AS112-v4, RFC 7535", "192.31.196.1", ""},
		{"192.52.193.0/24 AMT, RFC 7450", "192.52.193.1", ""},
		{"192.88.99.0/24 deprecated 6to4 relay anycast, RFC 7526", "192.88.99.1", "6to4 relay anycast address (192.88.99.0/24, deprecated by RFC 7526)"},
		{"192.88.99.2/32 6a44 relay anycast, RFC 6751", "192.88.99.2", "6to4 relay anycast address (192.88.99.0/24, deprecated by RFC 7526)"},
		{"192.168.0.0/16 private-use, RFC 1918", "192.168.1.1", "private address (RFC 1918)"},
		{"192.175.48.0/24 AS112 direct delegation, RFC 7534", "192.175.48.1", ""},
		{"198.18.0.0/15 benchmarking, RFC 2544", "198.18.0.1", "benchmarking address (198.18.0.0/15, RFC 2544)"},
		{"198.18.0.0/15 benchmarking, RFC 2544", "198.19.255.255", "benchmarking address (198.18.0.0/15, RFC 2544)"},
		{"198.51.100.0/24 documentation (TEST-NET-2), RFC 5737", "198.51.100.7", "documentation address (TEST-NET-2, RFC 5737)"},
		{"203.0.113.0/24 documentation (TEST-NET-3), RFC 5737", "203.0.113.9", "documentation address (TEST-NET-3, RFC 5737)"},
		{"224.0.0.0/4 multicast (IPv4 multicast registry), RFC 5771", "224.0.0.1", "multicast address (RFC 5771)"},
		{"224.0.0.0/4 multicast (IPv4 multicast registry), RFC 5771", "239.255.255.250", "multicast address (RFC 5771)"},
		{"240.0.0.0/4 reserved, RFC 1112", "240.0.0.1", "reserved address (240.0.0.0/4, RFC 1112)"},
		{"255.255.255.255/32 limited broadcast, RFC 919", "255.255.255.255", "limited broadcast address (RFC 919)"},

		// IANA IPv6 Special-Purpose Address Registry.
		{"::1/128 loopback, RFC 4291", "::1", "loopback address (::1, RFC 4291)"},
		{"::/128 unspecified, RFC 4291", "::", "unspecified address (::, RFC 4291)"},
		{"::ffff:0:0/96 IPv4-mapped, RFC 4291: judged as IPv4", "::ffff:10.0.0.1", "private address (RFC 1918) in IPv4-mapped IPv6 form"},
		{"::ffff:0:0/96 IPv4-mapped, RFC 4291: judged as IPv4", "::ffff:127.0.0.1", "loopback address (RFC 1122) in IPv4-mapped IPv6 form"},
		{"::ffff:0:0/96 IPv4-mapped, RFC 4291: judged as IPv4", "::ffff:169.254.169.254", "cloud metadata address in IPv4-mapped IPv6 form"},
		{"::ffff:0:0/96 IPv4-mapped, RFC 4291: judged as IPv4", "::ffff:198.18.0.1", "benchmarking address (198.18.0.0/15, RFC 2544) in IPv4-mapped IPv6 form"},
		{"::ffff:0:0/96 IPv4-mapped, RFC 4291: judged as IPv4", "::ffff:93.184.216.34", ""},
		// ::ffff:0:a.b.c.d, not the mapped ::ffff:a.b.c.d: a stateless
		// translator on the path turns it into a.b.c.d.
		{"::ffff:0:0:0/96 IPv4-translated, RFC 2765", "::ffff:0:10.0.0.1", "private address (RFC 1918) embedded in an IPv4-translated IPv6 address (::ffff:0:0:0/96, RFC 2765)"},
		{"::ffff:0:0:0/96 IPv4-translated, RFC 2765", "::ffff:0:127.0.0.1", "loopback address (RFC 1122) embedded in an IPv4-translated IPv6 address (::ffff:0:0:0/96, RFC 2765)"},
		{"::ffff:0:0:0/96 IPv4-translated, RFC 2765", "::ffff:0:8.8.8.8", "IPv4-translated IPv6 address (::ffff:0:0:0/96, RFC 2765): dial the IPv4 address itself"},
		{"::/96 IPv4-compatible, deprecated by RFC 4291", "::10.0.0.1", "private address (RFC 1918) embedded in an IPv4-compatible IPv6 address (::/96, deprecated by RFC 4291)"},
		{"::/96 IPv4-compatible, deprecated by RFC 4291", "::8.8.8.8", "IPv4-compatible IPv6 address (::/96, deprecated by RFC 4291): dial the IPv4 address itself"},
		{"64:ff9b::/96 IPv4-IPv6 translation, RFC 6052", "64:ff9b::10.0.0.1", "private address (RFC 1918) embedded in a NAT64 address (64:ff9b::/96, RFC 6052)"},
		{"64:ff9b::/96 IPv4-IPv6 translation, RFC 6052", "64:ff9b::169.254.169.254", "cloud metadata address embedded in a NAT64 address (64:ff9b::/96, RFC 6052)"},
		{"64:ff9b::/96 IPv4-IPv6 translation, RFC 6052", "64:ff9b::192.0.0.170", "NAT64/DNS64 discovery address (RFC 8880) embedded in a NAT64 address (64:ff9b::/96, RFC 6052)"},
		{"64:ff9b::/96 IPv4-IPv6 translation, RFC 6052", "64:ff9b::93.184.216.34", ""},
		{"64:ff9b:1::/48 local-use IPv4/IPv6 translation, RFC 8215", "64:ff9b:1::8.8.8.8", "local-use NAT64 address (64:ff9b:1::/48, RFC 8215)"},
		{"100::/64 discard-only, RFC 6666", "100::1", "discard-only address (100::/64, RFC 6666)"},
		{"100:0:0:1::/64 dummy IPv6 prefix, RFC 9780", "100:0:0:1::1", "dummy IPv6 address (100:0:0:1::/64, RFC 9780)"},
		{"2001::/23 IETF protocol assignments, RFC 2928", "2001:1ff::1", "IETF protocol assignment (2001::/23, RFC 2928)"},
		{"2001::/23 IETF protocol assignments, RFC 2928", "2001:5::1", "IETF protocol assignment (2001::/23, RFC 2928)"},
		{"2001::/32 Teredo, RFC 4380: public server and client", teredo("65.54.227.120", "8.8.8.8"), ""},
		{"2001::/32 Teredo, RFC 4380: private client", teredo("65.54.227.120", "10.0.0.1"), "private address (RFC 1918) as the client of a Teredo address (2001::/32, RFC 4380)"},
		{"2001::/32 Teredo, RFC 4380: loopback client", teredo("65.54.227.120", "127.0.0.1"), "loopback address (RFC 1122) as the client of a Teredo address (2001::/32, RFC 4380)"},
		{"2001::/32 Teredo, RFC 4380: metadata client", teredo("65.54.227.120", "169.254.169.254"), "cloud metadata address as the client of a Teredo address (2001::/32, RFC 4380)"},
		{"2001::/32 Teredo, RFC 4380: private server", teredo("192.168.0.1", "8.8.8.8"), "private address (RFC 1918) as the server of a Teredo address (2001::/32, RFC 4380)"},
		{"2001:1::1/128 PCP anycast, RFC 7723", "2001:1::1", "PCP anycast address (2001:1::1, RFC 7723): it answers at a nearby gateway"},
		{"2001:1::2/128 TURN anycast, RFC 8155", "2001:1::2", "TURN anycast address (2001:1::2, RFC 8155): it answers at a nearby relay"},
		{"2001:1::3/128 DNS-SD service registration anycast, RFC 9665", "2001:1::3", "DNS-SD service registration anycast address (2001:1::3, RFC 9665): it answers at a nearby server"},
		{"2001:2::/48 benchmarking, RFC 5180", "2001:2::1", "benchmarking address (2001:2::/48, RFC 5180)"},
		{"2001:3::/32 AMT, RFC 7450", "2001:3::1", ""},
		{"2001:4:112::/48 AS112-v6, RFC 7535", "2001:4:112::1", ""},
		{"2001:10::/28 deprecated ORCHID, RFC 4843", "2001:10::1", "ORCHID identifier (2001:10::/28, deprecated by RFC 4843)"},
		{"2001:20::/28 ORCHIDv2, RFC 7343", "2001:20::1", "ORCHIDv2 identifier (2001:20::/28, RFC 7343): an overlay identifier, not an Internet address"},
		{"2001:30::/28 DRIP entity tags, RFC 9374", "2001:30::1", "DRIP entity tag (2001:30::/28, RFC 9374): an overlay identifier, not an Internet address"},
		{"2001:db8::/32 documentation, RFC 3849", "2001:db8::1", "documentation address (2001:db8::/32, RFC 3849)"},
		// 6to4 carries the IPv4 address of the relay router in bits
		// 16-48; one on the Internet passes, like the IPv4 address.
		{"2002::/16 6to4, RFC 3056: public IPv4", "2002:808:808::1", ""},
		{"2002::/16 6to4, RFC 3056: private IPv4", "2002:a00:1::1", "private address (RFC 1918) embedded in a 6to4 address (2002::/16, RFC 3056)"},
		{"2002::/16 6to4, RFC 3056: loopback IPv4", "2002:7f00:1::1", "loopback address (RFC 1122) embedded in a 6to4 address (2002::/16, RFC 3056)"},
		{"2002::/16 6to4, RFC 3056: metadata IPv4", "2002:a9fe:a9fe::1", "cloud metadata address embedded in a 6to4 address (2002::/16, RFC 3056)"},
		{"2002::/16 6to4, RFC 3056: this-network IPv4", "2002::1", "this-network address (0.0.0.0/8, RFC 791) embedded in a 6to4 address (2002::/16, RFC 3056)"},
		{"2620:4f:8000::/48 AS112 direct delegation, RFC 7534", "2620:4f:8000::1", ""},
		{"3fff::/20 documentation, RFC 9637", "3fff::1", "documentation address (3fff::/20, RFC 9637)"},
		{"5f00::/16 SRv6 SIDs, RFC 9602", "5f00::1", "SRv6 segment identifier (5f00::/16, RFC 9602)"},
		{"fc00::/7 unique local, RFC 4193", "fc00::1", "private address (unique local fc00::/7, RFC 4193)"},
		{"fc00::/7 unique local, RFC 4193", "fd12:3456::1", "private address (unique local fc00::/7, RFC 4193)"},
		{"fd00:ec2::254, the cloud metadata service", "fd00:ec2::254", "cloud metadata address"},
		{"fe80::/10 link-local unicast, RFC 4291", "fe80::1", "link-local address (fe80::/10, RFC 4291)"},
		{"fe80::/10 link-local unicast, RFC 4291", "fe80::1%eth0", "link-local address (fe80::/10, RFC 4291)"},
		{"fec0::/10 site-local, deprecated by RFC 3879", "fec0::1", "site-local address (fec0::/10, deprecated by RFC 3879)"},
		{"ff00::/8 multicast, RFC 4291", "ff02::1", "multicast address (ff00::/8, RFC 4291)"},
		{"ff00::/8 multicast, RFC 4291", "ff0e::1", "multicast address (ff00::/8, RFC 4291)"},
		// Outside 2000::/3, the only global unicast space, nothing is
		// reachable across the Internet.
		{"reserved by the IETF, RFC 4291", "400::1", "reserved address outside global unicast 2000::/3 (RFC 4291)"},
		{"reserved by the IETF, RFC 4291", "64:ff9b:0:0:1::1", "reserved address outside global unicast 2000::/3 (RFC 4291)"},
		{"reserved by the IETF, RFC 4291", "e000::1", "reserved address outside global unicast 2000::/3 (RFC 4291)"},
	}
	for _, tt := range tests {
		if got := CheckAddress(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("%s: CheckAddress(%s) = %q, want %q", tt.entry, tt.addr, got, tt.want)
		}
	}
	// A range added to the guard comes with a row here.
	for _, r := range slices.Concat(v4Rules, v6Rules) {
		if !slices.ContainsFunc(tests, func(tt struct{ entry, addr, want string }) bool {
			a := netip.MustParseAddr(tt.addr).WithZone("")
			return r.prefix.Contains(a) && tt.want == r.rule
		}) {
			t.Errorf("no row shows %s (%q)", r.prefix, r.rule)
		}
	}
	if CheckAddress(netip.Addr{}) == "" {
		t.Error("the zero Addr passes")
	}
}

// teredo builds a Teredo address (RFC 4380 section 4): the prefix, the
// server's IPv4 address, flags, the client's port and the client's IPv4
// address, both obfuscated by inverting every bit.
func teredo(server, client string) string {
	s, c := netip.MustParseAddr(server).As4(), netip.MustParseAddr(client).As4()
	b := [16]byte{0x20, 0x01, 0, 0, s[0], s[1], s[2], s[3], 0x80, 0, 0x63, 0xbf}
	for i := range c {
		b[12+i] = c[i] ^ 0xff
	}
	return netip.AddrFrom16(b).String()
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
		{"0.0.0.0:443", "this-network address (0.0.0.0/8, RFC 791)", false},
		{"224.0.0.1:443", "multicast address", false},
		{"198.18.0.1:443", "benchmarking address (198.18.0.0/15, RFC 2544)", false},
		{"192.0.0.170:443", "NAT64/DNS64 discovery address (RFC 8880)", false},
		{"[::ffff:10.0.0.1]:443", "private address (RFC 1918)", false},
		// A real listener: the guard must refuse loopback even though
		// something would answer.
		{"127.0.0.1:" + port(e.S), "loopback address", false},
		{"[fd00:ec2::254]:443", "cloud metadata address", true},
		{"[fc00::1]:443", "private address (unique local fc00::/7, RFC 4193)", true},
		{"[fe80::1]:443", "link-local address", true},
		{"[64:ff9b:1::a00:1]:443", "local-use NAT64 address (64:ff9b:1::/48, RFC 8215)", true},
		{"[2002:a00:1::1]:443", "private address (RFC 1918) embedded in a 6to4 address", true},
		{"[" + teredo("65.54.227.120", "10.0.0.1") + "]:443", "private address (RFC 1918) as the client of a Teredo address", true},
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
