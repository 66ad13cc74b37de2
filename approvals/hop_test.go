package approvals

import (
	"context"
	"errors"
	"testing"
)

// TestHopAttacks: a replica that serves a forwarded approved call takes
// the sender's settlement only as storage holds it: what a holder of the
// cluster key could claim on a hop is refused, ErrHop each.
func TestHopAttacks(t *testing.T) {
	ctx := context.Background()
	mallory := func() Call { c := deploy(); c.Owner, c.Credential = "mallory", "tok_mallory"; return c }
	changed := func() Call { c := deploy(); c.Arguments = []byte(`{"environment":"moon","version":"1.2.3"}`); return c }
	cases := []struct {
		name string
		// run gets an approval consumed for deploy() and a round of it,
		// and does the attack.
		run func(s *Store, c *clock, approval, round string) error
	}{
		{"an approval consumed but never marked (served where it was settled)", func(s *Store, _ *clock, approval, _ string) error {
			return s.TakeHop(ctx, approval, "gw-b", deploy())
		}},
		{"a mark taken by another node", func(s *Store, _ *clock, _, round string) error {
			if err := s.MarkHop(ctx, round, "gw-b"); err != nil {
				t.Fatal(err)
			}
			return s.TakeHop(ctx, round, "gw-c", deploy())
		}},
		{"a mark taken twice (a hop signed again)", func(s *Store, _ *clock, _, round string) error {
			if err := s.MarkHop(ctx, round, "gw-b"); err != nil {
				t.Fatal(err)
			}
			if err := s.TakeHop(ctx, round, "gw-b", deploy()); err != nil {
				t.Fatalf("the forwarded call: %v", err)
			}
			return s.TakeHop(ctx, round, "gw-b", deploy())
		}},
		{"a mark made twice", func(s *Store, _ *clock, _, round string) error {
			if err := s.MarkHop(ctx, round, "gw-b"); err != nil {
				t.Fatal(err)
			}
			return s.MarkHop(ctx, round, "gw-c")
		}},
		{"another caller's call on the mark", func(s *Store, _ *clock, _, round string) error {
			if err := s.MarkHop(ctx, round, "gw-b"); err != nil {
				t.Fatal(err)
			}
			return s.TakeHop(ctx, round, "gw-b", mallory())
		}},
		{"a changed call on the mark", func(s *Store, _ *clock, approval, _ string) error {
			if err := s.MarkHop(ctx, approval, "gw-b"); err != nil {
				t.Fatal(err)
			}
			return s.TakeHop(ctx, approval, "gw-b", changed())
		}},
		{"a mark past the approval's lifetime", func(s *Store, c *clock, _, round string) error {
			if err := s.MarkHop(ctx, round, "gw-b"); err != nil {
				t.Fatal(err)
			}
			c.add(DefaultApprovedLifetime)
			return s.TakeHop(ctx, round, "gw-b", deploy())
		}},
		{"a round not used yet", func(s *Store, _ *clock, approval, _ string) error {
			g, err := s.Get(ctx, approval)
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.IssueRound(ctx, GrantOf(g), "s", true)
			if err != nil {
				t.Fatal(err)
			}
			return s.MarkHop(ctx, r.ID, "gw-b")
		}},
		{"a pending approval", func(s *Store, _ *clock, _, _ string) error {
			c := deploy()
			c.Tool = "rollback"
			a, err := s.Hold(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			return s.MarkHop(ctx, a.ID, "gw-b")
		}},
		{"a made-up id", func(s *Store, _ *clock, _, _ string) error {
			return s.TakeHop(ctx, "apr_AAAAAAAAAAAAAAAAAAAAAA", "gw-b", deploy())
		}},
		{"a path as an id", func(s *Store, _ *clock, _, _ string) error {
			return s.TakeHop(ctx, "../calls/x", "gw-b", deploy())
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, c := newStore(t)
			g := approvedGrant(t, s)
			r, err := s.IssueRound(ctx, g, "backend-S", true)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.ConsumeRound(ctx, r.ID, deploy()); err != nil {
				t.Fatal(err)
			}
			if err := tc.run(s, c, g.Approval, r.ID); !errors.Is(err, ErrHop) {
				t.Fatalf("got %v, want ErrHop", err)
			}
		})
	}
}

// TestHopTaken: a round (or an approval) consumed on one replica and
// marked for another is taken there once, for the same call by the same
// caller.
func TestHopTaken(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	g := approvedGrant(t, s)
	if err := s.MarkHop(ctx, g.Approval, "gw-b"); err != nil {
		t.Fatal(err)
	}
	if err := s.TakeHop(ctx, g.Approval, "gw-b", deploy()); err != nil {
		t.Fatalf("the approval's forwarded call: %v", err)
	}
	r, err := s.IssueRound(ctx, g, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ConsumeRound(ctx, r.ID, deploy()); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkHop(ctx, r.ID, "gw-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.TakeHop(ctx, r.ID, "gw-a", deploy()); err != nil {
		t.Fatalf("the round's forwarded call: %v", err)
	}
}
