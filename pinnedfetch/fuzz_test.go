package pinnedfetch

import (
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

func FuzzIsAllowedRemoteURL(f *testing.F) {
	for _, s := range []string{
		"https://api.example.com/mcp",
		"http://localhost:8080/",
		"http://127.0.0.1/",
		"http://[::1]:3000/",
		"http://localhost.evil.com/",
		"http://127.0.0.1.nip.io/",
		"http://2130706433/",
		"http://0177.0.0.1/",
		"http://0x7f.0.0.1/",
		"http://[::ffff:10.0.0.1]/",
		"http://[::ffff:127.0.0.1]/",
		"https://user:pass@example.com/",
		"file:///etc/passwd",
		"http://169.254.169.254/",
		"https://example.com./",
		"HTTP://LOCALHOST/",
		"http://[fe80::1%25lo]/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		err = CheckRemoteURL(u)
		allowed := IsAllowedRemoteURL(u)
		if allowed != (err == nil) {
			t.Fatalf("IsAllowedRemoteURL = %v, CheckRemoteURL = %v", allowed, err)
		}
		if !allowed {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error: %q", err)
			}
			ue, ok := err.(*URLError)
			if !ok {
				t.Fatalf("got %T, want *URLError", err)
			}
			if u.User != nil && u.User.String() != "" && strings.Contains(ue.URL, u.User.String()+"@") {
				t.Fatalf("error %q leaks the userinfo", err)
			}
			return
		}
		host := u.Hostname()
		scheme := strings.ToLower(u.Scheme)
		switch {
		case u.User != nil:
			t.Fatalf("allowed with userinfo: %q", s)
		case host == "":
			t.Fatalf("allowed without host: %q", s)
		case scheme != "https" && !(scheme == "http" && IsLoopbackHost(host)):
			t.Fatalf("allowed %q: scheme %q to host %q", s, u.Scheme, host)
		case Origin(u) == "":
			t.Fatalf("allowed %q has no origin", s)
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			if ip.Is4In6() || ip.Zone() != "" {
				t.Fatalf("allowed %q with a mapped or zoned address", s)
			}
			if scheme == "http" && !ip.IsLoopback() {
				t.Fatalf("allowed plain http to %s", ip)
			}
		} else if strings.Contains(host, ":") {
			t.Fatalf("allowed %q whose host %q is neither an IP nor a name", s, host)
		} else if net.ParseIP(host) != nil {
			t.Fatalf("allowed %q: net.ParseIP reads %q as an address but netip does not", s, host)
		}
		// The decision must survive a round trip through the string form,
		// which is what gets logged, stored and re-read.
		again, err := url.Parse(u.String())
		if err != nil {
			t.Fatalf("allowed %q does not re-parse: %v", u.String(), err)
		}
		if !IsAllowedRemoteURL(again) || !SameOrigin(u, again) {
			t.Fatalf("allowed %q but its string form %q is not allowed or not the same origin", s, u.String())
		}
	})
}

func FuzzSameOrigin(f *testing.F) {
	for _, p := range [][2]string{
		{"https://example.com", "https://example.com:443/x"},
		{"https://example.com", "https://EXAMPLE.com./"},
		{"https://example.com", "https://api.example.com"},
		{"http://localhost:8080", "http://127.0.0.1:8080"},
		{"https://[::1]:8443", "https://[0::1]:8443"},
		{"https://example.com", "http://example.com"},
		{"https://example.com:8443", "https://example.com:08443"},
		{"//example.com", "//example.com"},
		{"wss://example.com", "wss://example.com:443"},
	} {
		f.Add(p[0], p[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ua, err := url.Parse(a)
		if err != nil {
			return
		}
		ub, err := url.Parse(b)
		if err != nil {
			return
		}
		oa := Origin(ua)
		if SameOrigin(ua, ua) != (oa != "") {
			t.Fatalf("SameOrigin(%q, itself) = %v with origin %q", a, SameOrigin(ua, ua), oa)
		}
		if SameOrigin(ua, ub) != SameOrigin(ub, ua) {
			t.Fatalf("SameOrigin not symmetric for %q, %q", a, b)
		}
		if oa == "" {
			return
		}
		// Origin is a fixed point: the origin of an origin is itself.
		if uo, err := url.Parse(oa); err == nil && Origin(uo) != oa {
			t.Fatalf("Origin(%q) = %q, but Origin(%q) = %q", a, oa, oa, Origin(uo))
		}
		for name, v := range variants(ua) {
			if !SameOrigin(ua, v) {
				t.Fatalf("%s of %q (%q) is not the same origin", name, a, v.String())
			}
		}
	})
}

// variants returns spellings of u's origin that must compare equal: an
// uppercase host, a trailing dot, and an explicit default port.
func variants(u *url.URL) map[string]*url.URL {
	host, port := u.Hostname(), u.Port()
	out := map[string]*url.URL{}
	add := func(name, h, p string) {
		v := *u
		v.Host = h
		if strings.Contains(h, ":") {
			v.Host = "[" + h + "]"
		}
		if p != "" {
			v.Host = net.JoinHostPort(h, p)
		}
		// Skip spellings that do not split back into the same parts: the
		// variant would then be a different URL, not another spelling.
		if v.Hostname() != h || v.Port() != p {
			return
		}
		out[name] = &v
	}
	ascii := true
	for i := 0; i < len(host); i++ {
		if host[i] >= 0x80 {
			ascii = false
		}
	}
	if ascii && !strings.Contains(host, "%") {
		add("uppercase host", strings.ToUpper(host), port)
	}
	if host != "" && !strings.Contains(host, ":") {
		add("trailing dot", host+".", port)
	}
	if port == "" {
		switch strings.ToLower(u.Scheme) {
		case "http":
			add("explicit port", host, "80")
		case "https":
			add("explicit port", host, "443")
		}
	}
	return out
}
