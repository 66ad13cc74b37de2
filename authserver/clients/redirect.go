package clients

import (
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// MaxRedirectURILength bounds one redirect URI, in bytes.
const MaxRedirectURILength = 2048

// loopbackHosts are the hosts of the redirect URIs that may use plain http
// and any port (RFC 8252 §7.3, §8.3), spelled exactly so. localhost is
// NOT RECOMMENDED by RFC 8252 but is what several MCP clients register;
// it is its own host, never equal to 127.0.0.1 (a name can resolve
// elsewhere, and a browser may treat the two differently).
var loopbackHosts = map[string]bool{"127.0.0.1": true, "::1": true, "localhost": true}

// reservedQuery are the parameters the authorization response adds to a
// redirect URI (RFC 6749 §4.1.2, RFC 9207): a registered URI that already
// carries one would give the client two of them to choose between.
var reservedQuery = []string{"code", "state", "iss", "error", "error_description", "error_uri"}

// redirectURI is a redirect URI that passed the rules.
type redirectURI struct {
	scheme   string
	host     string // as written, without brackets
	loopback bool   // http on a loopback host: any port matches
	// portless is the URI with the port taken out of its authority; two
	// loopback URIs match when their portless forms are equal.
	portless string
}

// CheckRedirectURI says what is wrong with uri as a redirect URI to
// register, as an *[Error] with code invalid_redirect_uri, or nil.
//
// A redirect URI is an absolute https URI, or an http URI on a loopback
// host written exactly 127.0.0.1, [::1] or localhost. It has no fragment,
// no userinfo, no dot segments, no code, state, iss or error parameters,
// a host in lower case and in its one spelling (a numeric host is a
// dotted IPv4 address or a canonical IPv6 address; 127.1 or 0x7f.0.0.1,
// which browsers read as 127.0.0.1, are refused), a port from 1 to 65535
// without leading zeros, and only printable ASCII other than a backslash
// (which browsers read as a slash). Private-use schemes (cursor://,
// vscode://) are not accepted.
func CheckRedirectURI(uri string) error {
	_, err := parseRedirect(uri)
	return err
}

// MatchRedirect says whether requested, the redirect_uri of an
// authorization request, is the registered redirect URI, as an *[Error]
// with code invalid_redirect_uri when it is not.
//
// Both are read once by [CheckRedirectURI]'s rules, then compared as
// strings: exactly, except that for a loopback http URI (RFC 8252 §7.3)
// the port is left out of the comparison, so a native client may listen
// on any port, while scheme, host, path and query must still be equal.
// Nothing is normalized: https://host/cb and https://host:443/cb differ,
// and localhost is not 127.0.0.1.
func MatchRedirect(registered, requested string) error {
	req, err := parseRedirect(requested)
	if err != nil {
		return err
	}
	reg, err := parseRedirect(registered)
	if err != nil {
		return err
	}
	if reg.loopback && req.loopback && reg.portless == req.portless {
		return nil
	}
	if !reg.loopback && requested == registered {
		return nil
	}
	return refuse(CodeInvalidRedirectURI, "mismatch",
		"the redirect_uri is not one the client registered; send one of its registered redirect URIs exactly (only a loopback http URI may change its port)")
}

func badRedirect(reason, description string) *Error {
	return refuse(CodeInvalidRedirectURI, reason, "redirect URI: "+description)
}

func parseRedirect(raw string) (redirectURI, error) {
	if raw == "" {
		return redirectURI{}, badRedirect("empty", "empty; give an absolute https URI, or http://127.0.0.1, http://[::1] or http://localhost with a path")
	}
	if len(raw) > MaxRedirectURILength {
		return redirectURI{}, badRedirect("length", "longer than "+strconv.Itoa(MaxRedirectURILength)+" bytes")
	}
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '#' {
			return redirectURI{}, badRedirect("fragment", "has a fragment (#); a redirect URI must not have one (RFC 6749 §3.1.2)")
		}
		if c <= ' ' || c >= 0x7f || c == '\\' {
			return redirectURI{}, badRedirect("characters", "has a character outside printable ASCII, a space or a backslash; percent-encode it")
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return redirectURI{}, badRedirect("parse", "does not parse as a URI")
	}
	var scheme string
	switch {
	case strings.HasPrefix(raw, "https://"):
		scheme = "https"
	case strings.HasPrefix(raw, "http://"):
		scheme = "http"
	default:
		return redirectURI{}, badRedirect("scheme", "must start with https:// (or http:// on a loopback host), in lower case; private-use schemes are not accepted")
	}
	if u.User != nil {
		return redirectURI{}, badRedirect("userinfo", "has userinfo (user@ or user:password@); remove it")
	}
	host := u.Hostname()
	if why := checkHost(u.Host, host); why != "" {
		return redirectURI{}, badRedirect("host", why)
	}
	if why := checkPort(u.Host, u.Port()); why != "" {
		return redirectURI{}, badRedirect("port", why)
	}
	if hasDotSegment(u.EscapedPath()) {
		return redirectURI{}, badRedirect("path", "has a . or .. path segment; write the path as the browser will request it")
	}
	if u.RawQuery != "" || u.ForceQuery {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return redirectURI{}, badRedirect("query", "has a query that does not parse (a semicolon, or a bad escape)")
		}
		for _, k := range reservedQuery {
			if q.Has(k) {
				return redirectURI{}, badRedirect("query", "has a "+k+" parameter, which the authorization response adds itself; remove it")
			}
		}
	}
	r := redirectURI{scheme: scheme, host: host}
	if scheme == "http" {
		if !loopbackHosts[host] {
			return redirectURI{}, badRedirect("http_off_loopback", "plain http is accepted only on a loopback host (127.0.0.1, [::1] or localhost); use https")
		}
		r.loopback = true
		rest := raw[len("http://"):]
		authority := rest
		if i := strings.IndexAny(rest, "/?"); i >= 0 {
			authority, rest = rest[:i], rest[i:]
		} else {
			rest = ""
		}
		hostPart := authority
		if p := u.Port(); p != "" {
			hostPart = strings.TrimSuffix(authority, ":"+p)
		}
		r.portless = "http://" + hostPart + rest
	}
	return r, nil
}

// checkHost says what is wrong with the host of a URI (hostport as in
// url.URL.Host, host without brackets), or "". It accepts one spelling
// of each host, so that the host a browser goes to is the host compared.
func checkHost(hostport, host string) string {
	if host == "" {
		return "has no host"
	}
	if strings.HasPrefix(hostport, "[") {
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || ip.Zone() != "" || ip.String() != host {
			return "has an IPv6 host not in its canonical form (RFC 5952) or with a zone; write it as [::1]"
		}
		return ""
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		return ""
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if l == "" {
			return "has an empty label or a trailing dot in its host"
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return "has a host with a character other than a-z, 0-9, - and . (write the host in lower case, IDNs in punycode)"
			}
		}
	}
	// Browsers (the WHATWG URL parser) read a host whose last label is a
	// number as an IPv4 address in some spelling: 127.1, 0x7f.1, 2130706433.
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return "has a numeric host that is not a dotted IPv4 address (browsers read it as one); write the address as a.b.c.d"
	}
	return ""
}

// checkPort says what is wrong with the port of a URI, or "".
func checkPort(hostport, port string) string {
	if port == "" {
		if strings.HasSuffix(hostport, ":") {
			return "has a colon with no port after it"
		}
		return ""
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || port[0] == '0' {
		return "has a port that is not a number from 1 to 65535 without leading zeros"
	}
	return ""
}

// hasDotSegment reports whether an escaped path has a . or .. segment,
// escaped dots included.
func hasDotSegment(escaped string) bool {
	for seg := range strings.SplitSeq(escaped, "/") {
		s := strings.ReplaceAll(strings.ToLower(seg), "%2e", ".")
		if s == "." || s == ".." {
			return true
		}
	}
	return false
}
