package mcpendpoint

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// Site is one sessions site of this gateway as a replica of a cluster
// that runs sessions for the others sees it: how the site authenticates a
// credential, and its rules.
type Site struct {
	Authn  policy.Authenticator
	Access Access
}

// ForwardedOwner is the engine's Owner, on this replica, for a caller
// that another replica authenticated and that asks to call tool with one
// of verbs on a session this replica runs (package clustersessions). It
// takes from the other replica only whom the caller is, since whoever
// holds the cluster key can send such a request: id, a token of the store
// or "jwt:<sub>" with jwt, its access token, is established as a site of
// this replica would establish it ([policy.Authenticator.Forwarded]: a
// token from this replica's own store, a JWT verified here, the scopes
// found there narrowed to claimed), and that site's scope map must let it
// call one of verbs, as the sending replica's edge did. The Owner is what
// that site's endpoint would make of the principal ([OwnerOf]).
//
// The first site that takes the caller decides, since the caller came
// through one of them on its replica and every replica has the same
// sites. The error is the first site's: one wrapping
// [policy.ErrScopesClaimed] for scopes or verbs the credential is not
// granted here, and [policy.ErrTokenInvalid] for a caller this replica
// does not take.
func ForwardedOwner(ctx context.Context, sites []Site, id string, claimed []string, jwt, tool string, verbs []string, now time.Time) (sessions.Owner, error) {
	var first error
	for _, site := range sites {
		p, err := site.Authn.Forwarded(ctx, id, claimed, jwt, now)
		if err == nil {
			if site.Access.Scopes != nil && slices.ContainsFunc(verbs, func(v string) bool { return site.Access.Scopes.GrantsVerb(p, tool, v) }) {
				return OwnerOf(p, site.Access.ShareSessions), nil
			}
			err = fmt.Errorf("%w: it asks for %s %s, which %q may not call here", policy.ErrScopesClaimed, tool, strings.Join(verbs, " or "), id)
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = fmt.Errorf("%w: this replica has no sessions site to take the request on", policy.ErrTokenInvalid)
	}
	return sessions.Owner{}, first
}
