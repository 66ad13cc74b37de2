package mcpendpoint

import (
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// OrchestratorScopes are the scopes of the token an orchestrator session's
// agent gets at a launch (see [policy.OrchestratorScopes]): a verb scope
// for each verb of tools that its creator, o, may call now on every one of
// sites, the running config's sessions sites, and in dropped those it may
// no longer call. The creator is taken as it stands: a stored token's
// current record, as a request with it would be authenticated now
// ([policy.TokenStore.Lookup]: refused when it, or a token it was derived
// from, is revoked, expired or gone), or a JWT subject with the scopes of
// its latest call. ok is false when the creator is refused: its agent
// gets no token at all.
func OrchestratorScopes(tokens *policy.TokenStore, sites []Site, o sessions.Owner, tools []string, now time.Time) (scopes, dropped []string, ok bool) {
	creator, ok := creatorNow(tokens, o, now)
	if !ok {
		return nil, nil, false
	}
	scopes, dropped = policy.OrchestratorScopes(tools, func(tool, verb string) bool { return sitesGrantVerb(sites, creator, tool, verb) })
	return scopes, dropped, true
}

// creatorNow is the principal of a session's creator as it stands now.
func creatorNow(tokens *policy.TokenStore, o sessions.Owner, now time.Time) (policy.Principal, bool) {
	if policy.IsJWTID(o.TokenID) {
		return policy.Principal{TokenID: o.TokenID, Name: o.TokenName, Kind: policy.KindUser, Scopes: o.Scopes, Source: "jwt",
			Owner: o.ID, Expires: o.Expires, Issued: o.Issued}, true
	}
	p, err := tokens.Lookup(o.TokenID, now)
	return p, err == nil
}

// sitesGrantVerb reports whether every one of sites lets p call tool with
// verb; no site grants nothing.
func sitesGrantVerb(sites []Site, p policy.Principal, tool, verb string) bool {
	if len(sites) == 0 {
		return false
	}
	for _, site := range sites {
		if !site.Access.Scopes.GrantsVerb(p, tool, verb) {
			return false
		}
	}
	return true
}
