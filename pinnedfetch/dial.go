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
// ip is a public unicast address. IPv4-mapped, IPv4-compatible and NAT64
// (64:ff9b::/96) IPv6 forms are judged by the IPv4 address they carry, so
// [::ffff:10.0.0.1] is as private as 10.0.0.1.
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

var (
	metadataV6 = netip.MustParseAddr("fd00:ec2::254")
	nat64      = netip.MustParsePrefix("64:ff9b::/96")
	v4compat   = netip.MustParsePrefix("::/96")
	uniqueLoc  = netip.MustParsePrefix("fc00::/7")
	siteLocal  = netip.MustParsePrefix("fec0::/10")
)

// v4Rules lists refused IPv4 ranges, most specific first, so the cloud
// metadata address is named as such rather than as link-local.
var v4Rules = []struct {
	prefix netip.Prefix
	rule   string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "cloud metadata address"},
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified address (0.0.0.0/8)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private address (RFC 1918)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private address (RFC 1918)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private address (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared CGNAT address (RFC 6598)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved or broadcast address (240.0.0.0/4)"},
}

func checkV4(ip netip.Addr) string {
	for _, r := range v4Rules {
		if r.prefix.Contains(ip) {
			return r.rule
		}
	}
	return ""
}

func checkV6(ip netip.Addr) string {
	switch {
	case ip == metadataV6:
		return "cloud metadata address"
	case ip.IsUnspecified():
		return "unspecified address"
	case ip.IsLoopback():
		return "loopback address"
	case ip.IsLinkLocalUnicast():
		return "link-local address"
	case ip.IsMulticast():
		return "multicast address"
	case uniqueLoc.Contains(ip):
		return "private address (unique local, fc00::/7)"
	case siteLocal.Contains(ip):
		return "private address (site-local, fec0::/10)"
	case nat64.Contains(ip), v4compat.Contains(ip):
		// The last 32 bits are an IPv4 address that a NAT64 gateway (or a
		// legacy stack) would reach for us.
		b := ip.As16()
		if r := checkV4(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); r != "" {
			return r + " embedded in IPv6"
		}
	}
	return ""
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
