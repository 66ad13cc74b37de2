package idp

import (
	"errors"
	"net/url"
	"strings"
)

// maxReturnTo bounds a return path (an /authorize request with its query
// fits with room to spare).
const maxReturnTo = 4096

// ErrReturnTo is the refusal of a return path that is not a path on this
// site.
var ErrReturnTo = errors.New("the return address is not a path on this site")

// CheckReturnTo accepts a path on this site to send the browser back to
// after it signs in: it starts with one "/", and holds no backslash (which
// browsers read as "/", so "/\evil.example" leaves the site), no control
// character or space, no fragment, no scheme or host however spelled, at
// most maxReturnTo bytes. Anything else is an open redirect waiting to
// happen, and is refused rather than cleaned.
func CheckReturnTo(p string) error {
	if p == "" || len(p) > maxReturnTo || p[0] != '/' {
		return ErrReturnTo
	}
	if len(p) > 1 && (p[1] == '/' || p[1] == '\\') {
		return ErrReturnTo
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c == 0x7f || c == '\\' || c == '#' || c >= 0x80 {
			return ErrReturnTo
		}
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
		return ErrReturnTo
	}
	// A path whose escapes decode to "//" or "\" is the same trap once a
	// server or a browser decodes it.
	if dec, err := url.PathUnescape(u.EscapedPath()); err != nil || strings.HasPrefix(dec, "//") || strings.Contains(dec, "\\") {
		return ErrReturnTo
	}
	return nil
}
