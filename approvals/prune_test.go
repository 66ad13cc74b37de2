package approvals

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Prune, which the gateway runs on a timer, deletes the approvals and the
// rounds past their lifetime, with what they kept (the call's arguments,
// the backend's state), and keeps every live one; nothing else needs to
// be written for them to go.
func TestPruneDeletesWhatExpired(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	g := approvedGrant(t, s)
	r, err := s.IssueRound(ctx, g, "the backend's state", true)
	if err != nil {
		t.Fatal(err)
	}
	c.add(time.Minute)
	other := deploy()
	other.Owner, other.Credential = "carol", "tok_carol"
	live, err := s.Hold(ctx, other) // pending for DefaultPendingLifetime from now
	if err != nil {
		t.Fatal(err)
	}
	count := func(prefix string) int {
		keys, _ := s.opts.Store.List(ctx, strings.TrimSuffix(prefix, "/"), false)
		return len(keys)
	}
	s.Prune(ctx)
	if count(CallKeyPrefix) != 2 || count(RoundKeyPrefix) != 1 {
		t.Fatalf("before anything expired, Prune left %d approvals and %d rounds, want 2 and 1", count(CallKeyPrefix), count(RoundKeyPrefix))
	}
	c.add(DefaultApprovedLifetime) // the approved call's approval and its round expire; carol's pending one lives
	s.Prune(ctx)
	if _, err := s.Get(ctx, g.Approval); !errors.Is(err, ErrUnknown) {
		t.Errorf("the expired approval after Prune: %v, want unknown", err)
	}
	if n := count(RoundKeyPrefix); n != 0 {
		t.Errorf("%d rounds kept after their approval expired (round %s)", n, r.ID)
	}
	if got, err := s.Get(ctx, live.ID); err != nil || got.State != Pending {
		t.Errorf("the live approval after Prune: %+v %v", got, err)
	}
}
