package pinnedfetch

import (
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// URLError reports a URL that breaks the remote-URL rule. It never holds
// userinfo or query values: URL is the redacted form.
type URLError struct {
	// URL is the refused URL without userinfo, query values or fragment.
	URL string
	// Reason says what is wrong and what to write instead.
	Reason string
}

func (e *URLError) Error() string {
	return "pinnedfetch: remote URL " + e.URL + " is not allowed: " + e.Reason
}

// IsAllowedRemoteURL reports whether u may be fetched at all. It is the
// boolean form of [CheckRemoteURL]; see there for the rule.
func IsAllowedRemoteURL(u *url.URL) bool {
	return CheckRemoteURL(u) == nil
}

// CheckRemoteURL is the single encoding of the remote-URL rule. It returns nil
// when u may be fetched, and a *[URLError] saying what to change otherwise.
//
// The rule:
//   - https:// goes to any host;
//   - http:// goes only to a loopback host: localhost, 127.0.0.0/8 or [::1];
//   - no other scheme, no userinfo (user:password@), no empty host, no port 0.
//
// Hosts are read strictly, the way a browser would not: an IPv4 address must
// be a dotted quad without leading zeros, so integer, octal and hex spellings
// (2130706433, 0177.0.0.1, 0x7f.0.0.1, 127.1) are refused whatever the scheme,
// because resolvers and URL parsers disagree about what they mean. Names must
// be plain ASCII DNS names (use the xn-- form for IDNs). An IPv4-mapped IPv6
// literal such as [::ffff:127.0.0.1] or [::ffff:10.0.0.1] is refused too: it
// is another spelling of an IPv4 address, so it is never loopback for this
// rule; write 127.0.0.1 instead. IPv6 zones ([fe80::1%eth0]) are refused.
//
// The rule looks only at the URL. Where a name resolves to is checked when
// the connection is dialed (see [DenyPrivateAddresses]).
func CheckRemoteURL(u *url.URL) error {
	if u == nil {
		return &URLError{URL: "<nil>", Reason: "no URL given; configure an absolute https:// URL"}
	}
	refuse := func(reason string) error {
		return &URLError{URL: redactURL(u), Reason: reason}
	}
	if u.User != nil {
		return refuse("it carries userinfo (user:password@); send credentials in a configured header, never in the URL")
	}
	if u.Opaque != "" {
		return refuse("it is not a hierarchical URL; write scheme://host/path")
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "https" && scheme != "http" {
		return refuse("scheme " + strconv.Quote(u.Scheme) + " is not allowed; use https:// (or http:// to localhost, 127.0.0.0/8 or [::1])")
	}
	host := u.Hostname()
	if host == "" {
		return refuse("it has no host; write an absolute URL such as https://api.example.com/mcp")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return refuse("port " + strconv.Quote(p) + " is out of range; use a port from 1 to 65535")
		}
	}
	if reason := checkHost(host); reason != "" {
		return refuse(reason)
	}
	if scheme == "http" && !IsLoopbackHost(host) {
		return refuse("plain http is allowed only to localhost, 127.0.0.0/8 or [::1]; use https://")
	}
	return nil
}

// IsLoopbackHost reports whether host, as returned by [url.URL.Hostname], is
// a loopback host for the remote-URL rule: "localhost" in any case, an IPv4
// address in 127.0.0.0/8 written as a dotted quad, or ::1. Names under
// localhost ("a.localhost", "localhost.evil.com") and IPv4-mapped forms are
// not loopback here.
//
// It is the one loopback predicate of this module: every rule that lets
// plain traffic go to loopback only (the remote-URL rule, the cluster's
// nats:// URLs and advertised addresses, a loopback listener's Host check)
// asks it, so that no spelling is loopback to one rule and not to another.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return false
	}
	return IsLoopbackAddr(ip)
}

// IsLoopbackAddr reports whether ip is in 127.0.0.0/8 or is ::1. An
// IPv4-mapped address (::ffff:127.0.0.1) is not: as a spelling someone
// wrote, it is refused like every other IPv4 address written as IPv6.
func IsLoopbackAddr(ip netip.Addr) bool {
	if ip.Is4() {
		return ip.As4()[0] == 127
	}
	return ip == netip.IPv6Loopback()
}

// IsLoopbackSocket reports whether a socket's address, as the kernel
// reports it (a listener's local address, a peer's remote address), is
// loopback. Unlike a written host, a socket address in IPv4-mapped form
// is an IPv4 connection on a dual-stack socket, and is judged as that
// IPv4 address.
func IsLoopbackSocket(addr net.Addr) bool {
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.TCPAddr:
		if a == nil {
			return false
		}
		ip, _ = netip.AddrFromSlice(a.IP)
	case nil:
		return false
	default:
		ap, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return false
		}
		ip = ap.Addr()
	}
	return ip.IsValid() && ip.Zone() == "" && IsLoopbackAddr(ip.Unmap())
}

// checkHost returns why host is not a strictly spelled IP literal or DNS
// name, or "" when it is one.
func checkHost(host string) string {
	if strings.Contains(host, ":") {
		ip, err := netip.ParseAddr(host)
		switch {
		case err != nil:
			return "host " + strconv.Quote(host) + " is not a valid IPv6 address"
		case ip.Zone() != "":
			return "IPv6 zones (%" + ip.Zone() + ") are not allowed in a remote URL; use a routable address"
		case ip.Is4In6():
			return "IPv4-mapped IPv6 address [" + host + "] is refused; write the IPv4 address " + ip.Unmap().String()
		}
		return ""
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		return ""
	}
	return checkName(host)
}

// checkName accepts an ASCII DNS name with at most one trailing dot, and
// refuses names whose last label is a number: browsers and some resolvers
// read those as IPv4 addresses (the WHATWG "ends in a number" rule).
func checkName(host string) string {
	name := strings.TrimSuffix(host, ".")
	if name == "" || len(name) > 253 {
		return "host " + strconv.Quote(host) + " is not a valid DNS name"
	}
	last := name
	for rest := name; ; {
		label, after, more := strings.Cut(rest, ".")
		if !validLabel(label) {
			return "host " + strconv.Quote(host) + " is not a valid ASCII DNS name; write IDNs in their xn-- form"
		}
		if !more {
			last = label
			break
		}
		rest = after
	}
	if isNumericLabel(last) {
		return "host " + strconv.Quote(host) + " reads as a number, not a dotted-quad IPv4 address (integer, octal and hex spellings are refused); write the address as a.b.c.d without leading zeros"
	}
	return ""
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

func isNumericLabel(l string) bool {
	digits := l
	isHex := false
	if len(l) >= 2 && l[0] == '0' && (l[1] == 'x' || l[1] == 'X') {
		digits, isHex = l[2:], true
		if digits == "" {
			return true
		}
	}
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		switch {
		case '0' <= c && c <= '9':
		case isHex && ('a' <= c && c <= 'f' || 'A' <= c && c <= 'F'):
		default:
			return false
		}
	}
	return true
}
