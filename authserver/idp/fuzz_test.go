package idp

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzCheckReturnTo: whatever CheckReturnTo accepts stays on the site once
// resolved against it, raw and once more after its escapes are decoded (as
// a server or proxy in front may do), and has no byte a browser could read
// as a second slash or a scheme.
func FuzzCheckReturnTo(f *testing.F) {
	for _, seed := range []string{"/", "/zidane/authorize?x=1", "//evil.example", "/\\evil.example", "/%2F%2Fevil", "/%5C", "https://evil.example", "/a?next=//evil.example", "/.//evil.example", "/%09/evil"} {
		f.Add(seed)
	}
	base, _ := url.Parse("https://gw.example.com/zidane/signin/idp/callback")
	f.Fuzz(func(t *testing.T, p string) {
		if CheckReturnTo(p) != nil {
			return
		}
		ref, err := url.Parse(p)
		if err != nil {
			t.Fatalf("accepted %q, which does not parse: %v", p, err)
		}
		if got := base.ResolveReference(ref); got.Host != base.Host || got.Scheme != base.Scheme {
			t.Fatalf("accepted %q, which leaves the site: %s", p, got)
		}
		dec, err := url.PathUnescape(ref.EscapedPath())
		if err != nil || strings.HasPrefix(dec, "//") || strings.ContainsAny(dec, "\\") {
			t.Fatalf("accepted %q, whose path decodes to %q", p, dec)
		}
		if strings.ContainsAny(p, "\\\t\r\n #") {
			t.Fatalf("accepted %q", p)
		}
	})
}
