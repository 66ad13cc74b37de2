package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// setUserID names who the request acts for in Caddy's access log (its
// user_id field), through the placeholder Caddy's own authentication
// handler sets: the owner id, which is a token's owner (a token id or its
// --owner) or "jwt:<sub>", never a secret. A child token logs its
// parent's owner, the person or orchestrator it acts for.
func setUserID(r *http.Request, p policy.Principal) {
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set("http.auth.user.id", p.OwnerID())
	}
}
