package pinnedfetch

import (
	"net/url"
	"strings"
)

// Action is what the pinned transport did with one hop of a request.
type Action string

const (
	// ActionSend is the initial request of a chain (hop 0).
	ActionSend Action = "send"
	// ActionFollow is a redirect that was followed.
	ActionFollow Action = "follow"
	// ActionRefuse is a request or redirect that was not sent; Reason says why.
	ActionRefuse Action = "refuse"
)

// Decision records one decision of the pinned transport, for audit. It names
// headers but never holds their values, and its URLs carry no userinfo, query
// values or fragment.
type Decision struct {
	// Hop is 0 for the initial request and n for the n-th redirect.
	Hop int
	// From is the URL that answered with a redirect; empty on hop 0.
	From string
	// To is the URL this hop goes (or would have gone) to.
	To string
	// Status is the redirect status that led to this hop; 0 on hop 0.
	Status int
	// Action is what was done.
	Action Action
	// Reason explains the action in words meant for an operator.
	Reason string
	// Credentials reports whether the hop carried credentials: the caller's
	// sensitive headers and whatever WithCredentials adds.
	Credentials bool
	// StrippedHeaders lists, in canonical form, the sensitive headers the
	// caller had set that were removed from this hop.
	StrippedHeaders []string
}

// redactURL renders u for errors and decisions: scheme, host and path only.
// Userinfo is dropped and the query is replaced by "?…", because both are
// common places for secrets (tokens in ?api_key=, passwords in user:pass@).
func redactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	var b strings.Builder
	if u.Scheme != "" {
		b.WriteString(u.Scheme)
		b.WriteString(":")
	}
	if u.Opaque != "" {
		// An opaque part (mailto:x, https:secret) is not a path; keep none of it.
		b.WriteString("…")
		return b.String()
	}
	if u.Host != "" || u.Scheme != "" {
		b.WriteString("//")
		b.WriteString(u.Host)
	}
	b.WriteString(u.EscapedPath())
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteString("?…")
	}
	return b.String()
}
