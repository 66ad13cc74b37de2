package pinnedfetch

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// DialError reports a connection the address guard refused. It is returned
// (wrapped in *net.OpError and *url.Error) before any packet is sent.
type DialError struct {
	// Address is the resolved address that was about to be dialed.
	Address netip.AddrPort
	// Rule names the address class, e.g. "private address (RFC 1918)".
	Rule string
}

func (e *DialError) Error() string {
	return "pinnedfetch: refusing to dial " + e.Address.String() + ": " + e.Rule +
		"; this client reaches public addresses only (build it with DenyPrivateAddresses(false) if the upstream is meant to be internal)"
}

// CheckAddress returns why the address guard refuses to dial ip, or "" when
// ip is reachable across the Internet.
//
// It follows the IANA IPv4 and IPv6 Special-Purpose Address Registries and
// refuses every entry that is not globally reachable: private, shared
// (CGNAT), loopback, link-local, documentation, benchmarking, discard-only,
// reserved, multicast and broadcast ranges, the IETF protocol assignments
// (192.0.0.0/24, 2001::/23), local-use NAT64 (64:ff9b:1::/48), SRv6
// identifiers (5f00::/16), and every IPv6 address outside the global
// unicast range 2000::/3. It also refuses the cloud metadata addresses
// (169.254.169.254, fd00:ec2::254), and entries the registries mark as
// globally reachable that answer at a nearby device rather than across the
// Internet: the PCP, TURN and DNS-SD anycast addresses (192.0.0.9,
// 192.0.0.10, 2001:1::1-3) and the ORCHID and DRIP overlay identifiers
// (2001:10::/28, 2001:20::/28, 2001:30::/28). AS112 and AMT anycast pass.
//
// An IPv6 form that hands an IPv4 address to a translator or a tunnel is
// judged by that address: IPv4-mapped (::ffff:a.b.c.d) and NAT64
// (64:ff9b::a.b.c.d) addresses by the IPv4 address they carry, 6to4
// (2002::/16) by the relay's address in bits 16-48, and Teredo (2001::/32)
// by both the server's address and the client's (the last 32 bits,
// inverted). So [::ffff:10.0.0.1], [64:ff9b::a00:1] and [2002:a00:1::1] are
// as private as 10.0.0.1, and those forms pass when the address they carry
// does. The IPv4-compatible (::a.b.c.d, deprecated) and IPv4-translated
// (::ffff:0:a.b.c.d, RFC 2765) forms are refused whatever they carry: no
// server is reached that way, and a client dials the IPv4 address itself.
//
// Each refusal names its rule and the RFC that defines the range.
func CheckAddress(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid address"
	}
	ip = ip.WithZone("")
	if ip.Is4In6() {
		if r := checkV4(ip.Unmap()); r != "" {
			return r + " in IPv4-mapped IPv6 form"
		}
		return ""
	}
	if ip.Is4() {
		return checkV4(ip)
	}
	return checkV6(ip)
}

// addressRule is one refused range. An empty rule lets the range through:
// it is a globally reachable entry inside a wider refused one.
type addressRule struct {
	prefix netip.Prefix
	rule   string
}

func addrRule(prefix, why string) addressRule {
	return addressRule{netip.MustParsePrefix(prefix), why}
}

// v4Rules are the refused IPv4 ranges, most specific first, so that the
// cloud metadata address is named as such rather than as link-local, and
// the entries of 192.0.0.0/24 by their own names.
var v4Rules = []addressRule{
	addrRule("169.254.169.254/32", "cloud metadata address"),
	addrRule("0.0.0.0/8", "this-network address (0.0.0.0/8, RFC 791)"),
	addrRule("10.0.0.0/8", "private address (RFC 1918)"),
	addrRule("100.64.0.0/10", "shared CGNAT address (RFC 6598)"),
	addrRule("127.0.0.0/8", "loopback address (RFC 1122)"),
	addrRule("169.254.0.0/16", "link-local address (RFC 3927)"),
	addrRule("172.16.0.0/12", "private address (RFC 1918)"),
	addrRule("192.0.0.0/29", "IPv4 service continuity address (192.0.0.0/29, RFC 7335)"),
	addrRule("192.0.0.8/32", "IPv4 dummy address (192.0.0.8, RFC 7600)"),
	addrRule("192.0.0.9/32", "PCP anycast address (192.0.0.9, RFC 7723): it answers at a nearby gateway"),
	addrRule("192.0.0.10/32", "TURN anycast address (192.0.0.10, RFC 8155): it answers at a nearby relay"),
	addrRule("192.0.0.170/31", "NAT64/DNS64 discovery address (RFC 8880)"),
	addrRule("192.0.0.0/24", "IETF protocol assignment (192.0.0.0/24, RFC 6890)"),
	addrRule("192.0.2.0/24", "documentation address (TEST-NET-1, RFC 5737)"),
	addrRule("192.88.99.0/24", "6to4 relay anycast address (192.88.99.0/24, deprecated by RFC 7526)"),
	addrRule("192.168.0.0/16", "private address (RFC 1918)"),
	addrRule("198.18.0.0/15", "benchmarking address (198.18.0.0/15, RFC 2544)"),
	addrRule("198.51.100.0/24", "documentation address (TEST-NET-2, RFC 5737)"),
	addrRule("203.0.113.0/24", "documentation address (TEST-NET-3, RFC 5737)"),
	addrRule("224.0.0.0/4", "multicast address (RFC 5771)"),
	addrRule("255.255.255.255/32", "limited broadcast address (RFC 919)"),
	addrRule("240.0.0.0/4", "reserved address (240.0.0.0/4, RFC 1112)"),
}

// v6Rules are the refused IPv6 ranges, most specific first. The forms that
// carry an IPv4 address are judged before these, in checkV6.
var v6Rules = []addressRule{
	addrRule("fd00:ec2::254/128", "cloud metadata address"),
	addrRule("::/128", "unspecified address (::, RFC 4291)"),
	addrRule("::1/128", "loopback address (::1, RFC 4291)"),
	addrRule("64:ff9b:1::/48", "local-use NAT64 address (64:ff9b:1::/48, RFC 8215)"),
	addrRule("100::/64", "discard-only address (100::/64, RFC 6666)"),
	addrRule("100:0:0:1::/64", "dummy IPv6 address (100:0:0:1::/64, RFC 9780)"),
	addrRule("2001:1::1/128", "PCP anycast address (2001:1::1, RFC 7723): it answers at a nearby gateway"),
	addrRule("2001:1::2/128", "TURN anycast address (2001:1::2, RFC 8155): it answers at a nearby relay"),
	addrRule("2001:1::3/128", "DNS-SD service registration anycast address (2001:1::3, RFC 9665): it answers at a nearby server"),
	addrRule("2001:2::/48", "benchmarking address (2001:2::/48, RFC 5180)"),
	addrRule("2001:3::/32", ""),     // AMT anycast (RFC 7450), globally reachable
	addrRule("2001:4:112::/48", ""), // AS112-v6 (RFC 7535), globally reachable
	addrRule("2001:10::/28", "ORCHID identifier (2001:10::/28, deprecated by RFC 4843)"),
	addrRule("2001:20::/28", "ORCHIDv2 identifier (2001:20::/28, RFC 7343): an overlay identifier, not an Internet address"),
	addrRule("2001:30::/28", "DRIP entity tag (2001:30::/28, RFC 9374): an overlay identifier, not an Internet address"),
	addrRule("2001::/23", "IETF protocol assignment (2001::/23, RFC 2928)"),
	addrRule("2001:db8::/32", "documentation address (2001:db8::/32, RFC 3849)"),
	addrRule("3fff::/20", "documentation address (3fff::/20, RFC 9637)"),
	addrRule("5f00::/16", "SRv6 segment identifier (5f00::/16, RFC 9602)"),
	addrRule("fc00::/7", "private address (unique local fc00::/7, RFC 4193)"),
	addrRule("fe80::/10", "link-local address (fe80::/10, RFC 4291)"),
	addrRule("fec0::/10", "site-local address (fec0::/10, deprecated by RFC 3879)"),
	addrRule("ff00::/8", "multicast address (ff00::/8, RFC 4291)"),
}

var (
	v4Compatible  = netip.MustParsePrefix("::/96")
	v4Translated  = netip.MustParsePrefix("::ffff:0:0:0/96")
	nat64         = netip.MustParsePrefix("64:ff9b::/96")
	teredoPrefix  = netip.MustParsePrefix("2001::/32")
	sixToFour     = netip.MustParsePrefix("2002::/16")
	globalUnicast = netip.MustParsePrefix("2000::/3")
)

func checkV4(ip netip.Addr) string {
	return firstRule(v4Rules, ip)
}

// firstRule is the rule of the first range of rules that holds ip, "" if
// none does.
func firstRule(rules []addressRule, ip netip.Addr) string {
	for _, r := range rules {
		if r.prefix.Contains(ip) {
			return r.rule
		}
	}
	return ""
}

func checkV6(ip netip.Addr) string {
	b := ip.As16()
	v4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte(b[i : i+4])) }
	switch {
	case ip.IsUnspecified(), ip.IsLoopback():
		// Inside ::/96, but named as themselves.
	case v4Compatible.Contains(ip):
		return carriedOnly(v4(12), "IPv4-compatible IPv6 address (::/96, deprecated by RFC 4291)")
	case v4Translated.Contains(ip):
		return carriedOnly(v4(12), "IPv4-translated IPv6 address (::ffff:0:0:0/96, RFC 2765)")
	case nat64.Contains(ip):
		// A NAT64 gateway reaches the last 32 bits for us.
		if r := checkV4(v4(12)); r != "" {
			return r + " embedded in a NAT64 address (64:ff9b::/96, RFC 6052)"
		}
		return ""
	case sixToFour.Contains(ip):
		// A 6to4 host tunnels to the IPv4 address in bits 16-48.
		if r := checkV4(v4(2)); r != "" {
			return r + " embedded in a 6to4 address (2002::/16, RFC 3056)"
		}
		return ""
	case teredoPrefix.Contains(ip):
		// A Teredo client sends to the server's address (bits 32-64) and
		// straight to the client's (the last 32 bits, inverted).
		if r := checkV4(v4(4)); r != "" {
			return r + " as the server of a Teredo address (2001::/32, RFC 4380)"
		}
		client := [4]byte(b[12:16])
		for i := range client {
			client[i] ^= 0xff
		}
		if r := checkV4(netip.AddrFrom4(client)); r != "" {
			return r + " as the client of a Teredo address (2001::/32, RFC 4380)"
		}
		return ""
	}
	if r := firstRule(v6Rules, ip); r != "" {
		return r
	}
	if !globalUnicast.Contains(ip) {
		return "reserved address outside global unicast 2000::/3 (RFC 4291)"
	}
	return ""
}

// carriedOnly judges an obsolete IPv6 form of an IPv4 address: refused
// whatever it carries, and named by what it carries when that is refused.
func carriedOnly(v4 netip.Addr, form string) string {
	if r := checkV4(v4); r != "" {
		return r + " embedded in an " + form
	}
	return form + ": dial the IPv4 address itself"
}

// guardControl is a net.Dialer.ControlContext. The dialer calls it with the
// resolved address after the socket is created and before connect(2), once
// per address it tries, so the address judged is the address used: a name
// that re-resolves to a private address between a check and the dial
// (DNS rebinding) is still refused.
func guardControl(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &DialError{Rule: "unparseable address " + address}
	}
	if rule := CheckAddress(ap.Addr()); rule != "" {
		return &DialError{Address: ap, Rule: rule}
	}
	return nil
}

// lookupFunc resolves a host and port to the addresses to dial. Only tests
// set one, to map test names onto loopback listeners without touching the
// system resolver; the guard still judges every address it returns.
type lookupFunc func(ctx context.Context, host, port string) ([]netip.AddrPort, error)

// newDialContext returns the DialContext of the pinned transport. lookup and
// safetyNet are set by tests only: safetyNet runs after the guard and lets
// tests refuse any address off loopback, so that a broken guard fails a
// test instead of sending a packet out.
func newDialContext(deny bool, lookup lookupFunc, safetyNet func(address string) error) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if deny {
		d.ControlContext = guardControl
	}
	if safetyNet != nil {
		guard := d.ControlContext
		d.ControlContext = func(ctx context.Context, network, address string, c syscall.RawConn) error {
			if guard != nil {
				if err := guard(ctx, network, address, c); err != nil {
					return err
				}
			}
			return safetyNet(address)
		}
	}
	if lookup == nil {
		return d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if _, err := netip.ParseAddr(host); err == nil {
			return d.DialContext(ctx, network, addr)
		}
		addrs, err := lookup(ctx, host, port)
		if err != nil {
			return nil, err
		}
		if len(addrs) == 0 {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		var first error
		for _, a := range addrs {
			c, err := d.DialContext(ctx, network, a.String())
			if err == nil {
				return c, nil
			}
			if first == nil {
				first = err
			}
		}
		return nil, first
	}
}
