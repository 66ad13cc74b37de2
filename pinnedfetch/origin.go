package pinnedfetch

import (
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// Origin returns the normalized origin of u as "scheme://host:port", or ""
// when u has no scheme or no host. Normalization lowercases the scheme and
// host, drops trailing dots from names, writes IPv6 addresses in canonical
// form, and makes the default port explicit (80 for http, 443 for https), so
// https://API.Example.com./x and https://api.example.com:443/y have the same
// origin.
//
// Nothing else is folded: a name and the address it resolves to are different
// origins (localhost is not 127.0.0.1), an IPv4-mapped IPv6 address is not the
// IPv4 address, and a subdomain is not its parent.
func Origin(u *url.URL) string {
	if u == nil || u.Scheme == "" {
		return ""
	}
	host := normalizeHost(u.Hostname())
	if host == "" {
		return ""
	}
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if len(port) > 1 && port[0] == '0' {
		if n, err := strconv.Atoi(port); err == nil {
			port = strconv.Itoa(n)
		}
	}
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		default:
			return scheme + "://" + bracket(host)
		}
	}
	return scheme + "://" + bracket(host) + ":" + port
}

// SameOrigin reports whether a and b have the same [Origin]. A URL without a
// scheme or host has no origin and is the same origin as nothing, not even
// itself: a hop to nowhere never keeps credentials.
func SameOrigin(a, b *url.URL) bool {
	oa := Origin(a)
	return oa != "" && oa == Origin(b)
}

func normalizeHost(host string) string {
	if strings.Contains(host, ":") {
		if ip, err := netip.ParseAddr(host); err == nil {
			return ip.String()
		}
		return strings.ToLower(host)
	}
	return strings.TrimRight(strings.ToLower(host), ".")
}

func bracket(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}
