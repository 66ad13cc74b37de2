// Package htmlpage holds what the gateway's HTML pages (sign-in, consent,
// connect link, connected accounts, approval status, session) have in
// common:
//
//   - the headers every page carries: HTML, not sniffed, never framed
//     (X-Frame-Options DENY, and frame-ancestors 'none' in its policy),
//     never stored by a cache, and the referrer policy the page chose;
//   - a Content-Security-Policy that starts from default-src 'none', with
//     frame-ancestors 'none' and base-uri 'none' always in it, and whatever
//     else the page allows (a style, a script, where its forms post)
//     written out at the page's own call site, in the page's order;
//   - the hash by which such a policy lets one inline style or script run;
//   - a page's form: the origin it must be posted from, and the token that
//     binds it to the person it was shown to (and, on the approval page,
//     to the approval).
//
// It never writes a page's body and never reads a form: the pages own
// their templates, and internal/formpost reads what their forms post.
package htmlpage

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
)

// Referrer is a page's Referrer-Policy.
type Referrer string

// The referrer policies a page chooses between.
const (
	// NoReferrer sends no referrer at all: for a page whose address is
	// a capability (a session page) or that posts no form.
	NoReferrer Referrer = "no-referrer"
	// SameOrigin sends a referrer to this site alone: for a page whose
	// form posts back here. Under no-referrer a browser sends the POST
	// with "Origin: null" (Fetch §3.1: the referrer policy applies to
	// Origin), which is also what a sandboxed frame on any site sends,
	// and formpost could no longer tell the page's own form from one
	// posted elsewhere.
	SameOrigin Referrer = "same-origin"
)

// CSP is a page's Content-Security-Policy, made by [MustCSP]: nothing
// loads but what it names, and no site frames the page.
type CSP struct{ value string }

// The directives every page's policy holds: default-src comes first,
// from MustCSP itself; the other two the page writes where it wants them.
const (
	defaultSrc     = "default-src 'none'"
	frameAncestors = "frame-ancestors 'none'"
	baseURI        = "base-uri 'none'"
)

// MustCSP returns the policy "default-src 'none'; " followed by
// directives, in their order. They must hold frame-ancestors 'none' and
// base-uri 'none', name no directive twice (a browser would obey the
// first and drop the other: two readings of one header) and none of them
// default-src, and hold no ';' or ',' (which would start another
// directive or another policy) nor a control character. It panics
// otherwise: the pages make their policies from constants when their
// package is loaded, so a broken one fails every test of the page.
func MustCSP(directives ...string) CSP {
	c, err := newCSP(directives)
	if err != nil {
		panic("htmlpage: " + err.Error())
	}
	return c
}

func newCSP(directives []string) (CSP, error) {
	seen := map[string]bool{"default-src": true}
	for _, d := range directives {
		if strings.ContainsAny(d, ";,") || strings.ContainsFunc(d, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return CSP{}, fmt.Errorf("directive %q holds a separator or a control character", d)
		}
		name, _, _ := strings.Cut(strings.TrimSpace(d), " ")
		name = strings.ToLower(name)
		if name == "" || seen[name] {
			return CSP{}, fmt.Errorf("directive %q is empty, default-src, or given twice", d)
		}
		seen[name] = true
	}
	for _, must := range []string{frameAncestors, baseURI} {
		found := false
		for _, d := range directives {
			found = found || d == must
		}
		if !found {
			return CSP{}, fmt.Errorf("the policy has no %s", must)
		}
	}
	return CSP{value: strings.Join(append([]string{defaultSrc}, directives...), "; ")}, nil
}

// With returns c with one more directive at its end, under the rules of
// [MustCSP] (it panics where MustCSP would): for a page that allows what
// its siblings do and one thing more.
func (c CSP) With(directive string) CSP {
	directives := strings.Split(c.value, "; ")[1:]
	return MustCSP(append(directives, directive)...)
}

// String is the header's value.
func (c CSP) String() string { return c.value }

// Hash is the source expression ('sha256-…', CSP3 §2.3.1) that lets the
// inline style or script s run under a policy, and nothing else inline.
func Hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// SetHeaders sets on h the headers a page carries: its type (HTML in
// UTF-8), csp, X-Frame-Options DENY for browsers without frame-ancestors,
// nosniff, Cache-Control no-store (a page may show a form's token, a
// person's name, a session's transcript) and the referrer policy ref.
// What else a page sets (Pragma, Allow, Content-Length) stays with it.
// A page answered with http.Error afterwards is plain text: http.Error
// sets its own Content-Type.
func SetHeaders(h http.Header, csp CSP, ref Referrer) {
	if csp.value == "" {
		// The zero CSP would send a page with no policy at all.
		panic("htmlpage: a page's policy is made by MustCSP")
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", csp.value)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", string(ref))
}
