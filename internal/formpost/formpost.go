// Package formpost reads a form that a browser posts from one of this
// gateway's own pages (a sign-in link, a connect link, the connected
// accounts page, the consent page). Each of those pages decided the same
// questions on its own, and one copy had already drifted (an origin
// compared as a string refused an issuer written with :443); here they are
// answered once:
//
//   - did the POST come from a page of this site? A browser says so in
//     Sec-Fetch-Site, or in Origin (sent on every POST by browsers that have
//     no Sec-Fetch-Site). Origins compare as pinnedfetch compares them, so
//     a default port written in the config matches the browser's spelling.
//   - is it a form, with nothing in its address, in a bounded body?
//
// What the form must carry, and what each refusal tells the person, stays
// with each page.
package formpost

import (
	"mime"
	"net/http"
	"net/url"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// Refusal is why a form post was not read: its Reason is the audit word
// and Status the HTTP status to answer.
type Refusal struct {
	Reason string
	Status int
}

// The reasons [Read] gives.
var (
	CrossOrigin = &Refusal{Reason: "cross_origin", Status: http.StatusForbidden}
	Query       = &Refusal{Reason: "query", Status: http.StatusBadRequest}
	ContentType = &Refusal{Reason: "content_type", Status: http.StatusUnsupportedMediaType}
	Unreadable  = &Refusal{Reason: "form", Status: http.StatusBadRequest}
)

// OriginIs reports whether an Origin header's value is the origin of the
// URL site (as written in the config: a default port or the case of the
// host makes no difference, as pinnedfetch.Origin compares them). "null",
// and anything with a path, a query or user information, is not.
func OriginIs(header, site string) bool {
	u, err := url.Parse(header)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return false
	}
	s, err := url.Parse(site)
	want := ""
	if err == nil {
		want = pinnedfetch.Origin(s)
	}
	return want != "" && pinnedfetch.Origin(u) == want
}

// SameOrigin reports whether r came from a page of site (a URL): one
// Sec-Fetch-Site of same-origin, one Origin that is origin, and not the
// two disagreeing. A request with neither header is no browser's form
// post and is refused.
func SameOrigin(r *http.Request, site string) bool {
	fetch, orig := r.Header.Values("Sec-Fetch-Site"), r.Header.Values("Origin")
	if len(fetch) > 1 || len(orig) > 1 || (len(fetch) == 0 && len(orig) == 0) {
		return false
	}
	if len(fetch) == 1 && fetch[0] != "same-origin" {
		return false
	}
	return len(orig) == 0 || OriginIs(orig[0], site)
}

// Read checks that r is a same-origin form post (see [SameOrigin]) with
// an empty query and an application/x-www-form-urlencoded body of at most
// maxBody bytes, and returns its fields. The checks run in that order, so
// a cross-site post is refused before its body is read.
func Read(w http.ResponseWriter, r *http.Request, site string, maxBody int64) (url.Values, *Refusal) {
	if !SameOrigin(r, site) {
		return nil, CrossOrigin
	}
	if r.URL.RawQuery != "" {
		return nil, Query
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		return nil, ContentType
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		return nil, Unreadable
	}
	return r.PostForm, nil
}
