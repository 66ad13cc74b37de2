package policy

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// Origins is the browser-Origin allow-list. The MCP spec requires a
// Streamable HTTP server to refuse a present, invalid Origin, since a page
// in a browser (or a DNS-rebinding attack) could otherwise drive the
// endpoint with the user's network position. A request without Origin is
// not from a browser page and is not judged here.
type Origins struct {
	allowed map[string]bool
}

// NewOrigins builds the allow-list. Each entry is an origin such as
// "https://app.example.com" or "http://localhost:6274"; "null" and
// wildcards are refused, because they would allow any page.
func NewOrigins(list []string) (*Origins, error) {
	o := &Origins{allowed: map[string]bool{}}
	for _, s := range list {
		norm, ok := NormalizeOrigin(s)
		if !ok {
			return nil, fmt.Errorf("allowed origin %q: write scheme://host[:port], such as https://app.example.com, with no path", s)
		}
		o.allowed[norm] = true
	}
	return o, nil
}

// Allowed reports whether a request with this Origin header value, sent to
// host (the request's Host header), may proceed. An absent Origin is
// allowed. Besides the list, a loopback Origin is allowed on a request whose
// Host is loopback too: that page is served from this machine, and a
// DNS-rebinding page can fake neither (its Origin and Host carry the
// attacker's name).
func (o *Origins) Allowed(origin, host string) bool {
	if origin == "" {
		return true
	}
	norm, ok := NormalizeOrigin(origin)
	if !ok {
		return false
	}
	if o.allowed[norm] {
		return true
	}
	u, _ := url.Parse(norm)
	return pinnedfetch.IsLoopbackHost(u.Hostname()) && HostIsLoopback(host)
}

// HostIsLoopback reports whether a Host header value (host[:port]) names
// this machine: localhost, 127.0.0.0/8 or [::1].
func HostIsLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	return host != "" && pinnedfetch.IsLoopbackHost(host)
}

// NormalizeOrigin lower-cases an origin and drops a default port, so that
// "HTTPS://App.Example.com:443" and "https://app.example.com" compare equal.
func NormalizeOrigin(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", false
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return "", false
	}
	host := strings.ToLower(u.Hostname())
	if host == "" || strings.Contains(host, "*") {
		return "", false
	}
	port := u.Port()
	if (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		port = ""
	}
	if port != "" {
		return scheme + "://" + net.JoinHostPort(host, port), true
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return scheme + "://" + host, true
}
