package mcpendpoint

import (
	"fmt"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// The token's roots reach the engine with the owner, from the principal
// of each call.
func TestTokenRootsReachTheEngine(t *testing.T) {
	principals["confined-token"] = policy.Principal{TokenID: "tok-confined", Name: "confined", Kind: policy.KindUser, Scopes: []string{"chat"}, Source: "token", Roots: []string{"/srv/work"}}
	t.Cleanup(func() { delete(principals, "confined-token") })
	h := newHarness(t)
	cs := h.connect("confined-token", nil, nil)
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/srv/work/app", "prompt": "go"}), nil)
	h.engine.mu.Lock()
	owner := h.engine.lastOwner
	h.engine.mu.Unlock()
	if owner.TokenID != "tok-confined" || fmt.Sprint(owner.Roots) != "[/srv/work]" {
		t.Errorf("owner = %+v, want the token's roots", owner)
	}
}

// The engine's refusals for quotas and roots reach the model as tool
// errors with their own codes and the engine's words.
func TestQuotaAndRootsRefusals(t *testing.T) {
	for _, tc := range []struct {
		err        error
		code, says string
	}{
		{fmt.Errorf("%w: token \"alice\" has 100 live sessions, the most one token may keep (max_sessions_per_token)", sessions.ErrQuota), "quota", "max_sessions_per_token"},
		{fmt.Errorf("%w: 64 agent processes are running", sessions.ErrBusy), "busy", "64 agent processes"},
		{fmt.Errorf("%w: cwd /etc is outside this gateway's allowed roots (/srv/work)", sessions.ErrBadRequest), "bad_request", "allowed roots (/srv/work)"},
	} {
		h := newHarness(t)
		h.engine.createErr = tc.err
		cs := h.connect("alice-token", nil, nil)
		res := call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/etc", "prompt": "go"})
		failed(t, res, tc.says)
		if got := errorCodeOf(res); got != tc.code {
			t.Errorf("%v: code %q, want %q", tc.err, got, tc.code)
		}
	}
}
