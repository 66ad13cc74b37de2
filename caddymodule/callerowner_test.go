package caddymodule

import (
	"context"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// TestCallerOwnerOneReading: the person a per_user upstream request acts
// for is read once: a request that names two people (its principal's and
// the upstream session's) acts for nobody, so no token is attached.
func TestCallerOwnerOneReading(t *testing.T) {
	alice := policy.Principal{TokenID: "tok-a", Owner: "alice"}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"no principal, no session person", context.Background(), ""},
		{"principal only", policy.WithPrincipal(context.Background(), alice), "alice"},
		{"session person only (a 2025-11-25 session's handler)", upstreamauth.WithCallOwner(context.Background(), "alice"), "alice"},
		{"both, the same person", upstreamauth.WithCallOwner(policy.WithPrincipal(context.Background(), alice), "alice"), "alice"},
		{"attack: bob's session carrying alice's request", upstreamauth.WithCallOwner(policy.WithPrincipal(context.Background(), alice), "bob"), ""},
		{"attack: an empty session person", upstreamauth.WithCallOwner(policy.WithPrincipal(context.Background(), alice), ""), ""},
	} {
		if got := callerOwner(tc.ctx); got != tc.want {
			t.Errorf("%s: callerOwner = %q, want %q", tc.name, got, tc.want)
		}
	}
}
