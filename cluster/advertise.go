package cluster

import (
	"fmt"
	"net"
	"net/url"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// CheckAdvertise checks the address other replicas forward to (a node's
// advertise): an http(s) URL with a host, nothing else; http only to
// loopback, since a hop carries the sessions' messages.
func CheckAdvertise(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("advertise %q: give the URL other replicas reach this one at, such as https://gw-1.internal:8443", raw)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("advertise %q: give a scheme, host and port only, such as https://gw-1.internal:8443 (no user, path or query)", raw)
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("advertise %q: %s is no address another replica can reach; give this replica's own address or name", raw, u.Hostname())
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !pinnedfetch.IsLoopbackHost(u.Hostname()) {
			return fmt.Errorf("advertise %q: plain http to a host that is not loopback would carry sessions' messages in the clear; use https://", raw)
		}
	default:
		return fmt.Errorf("advertise %q: the scheme must be https:// (or http:// to loopback)", raw)
	}
	return nil
}
