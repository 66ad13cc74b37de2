package clients

import (
	"net/url"
	"testing"
)

// FuzzMatchRedirect checks what a match means, on any pair of strings:
// the two URIs have one scheme, host, path and query as Go reads them;
// they differ only by the port of a loopback http URI; and an accepted
// URI has no userinfo or fragment and is https, or http on loopback.
func FuzzMatchRedirect(f *testing.F) {
	for _, s := range [][2]string{
		{"https://app.example.com/cb", "https://app.example.com/cb"},
		{"http://127.0.0.1/cb", "http://127.0.0.1:5000/cb"},
		{"http://[::1]:80/cb?a=1", "http://[::1]:81/cb?a=1"},
		{"http://localhost/cb", "http://127.0.0.1/cb"},
		{"https://app.example.com/cb", "https://app.example.com:443/cb"},
		{"http://127.0.0.1/cb", "http://127.0.0.1:80@evil.example.com/cb"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, registered, requested string) {
		for _, s := range []string{registered, requested} {
			if CheckRedirectURI(s) != nil {
				continue
			}
			u, err := url.Parse(s)
			if err != nil || u.User != nil || u.Fragment != "" || u.Host == "" {
				t.Fatalf("accepted %q: %+v %v", s, u, err)
			}
			if u.Scheme != "https" && !(u.Scheme == "http" && loopbackHosts[u.Hostname()]) {
				t.Fatalf("accepted %q off https and loopback", s)
			}
		}
		if MatchRedirect(registered, requested) != nil {
			return
		}
		a, _ := url.Parse(registered)
		b, _ := url.Parse(requested)
		if a.Scheme != b.Scheme || a.Hostname() != b.Hostname() || a.EscapedPath() != b.EscapedPath() || a.RawQuery != b.RawQuery {
			t.Fatalf("%q matched %q", requested, registered)
		}
		if registered != requested && !(a.Scheme == "http" && loopbackHosts[a.Hostname()]) {
			t.Fatalf("%q matched %q without being it", requested, registered)
		}
	})
}
