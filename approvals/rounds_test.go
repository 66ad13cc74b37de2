package approvals

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// approvedGrant holds deploy(), has bob approve it, consumes it, and
// returns its grant, as the edge does when the approved call runs.
func approvedGrant(t *testing.T, s *Store) Grant {
	t.Helper()
	ctx := context.Background()
	a, err := s.Hold(ctx, deploy())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Answer(ctx, a.ID, bob, true, mayAll); err != nil {
		t.Fatal(err)
	}
	used, err := s.Consume(ctx, a.ID, deploy())
	if err != nil {
		t.Fatal(err)
	}
	return GrantOf(used)
}

// TestRoundAttacks: what a caller (or someone else) does with a round of
// an approved call, each refused with its error and a word of why, and
// audited naming the approval when the round is known.
func TestRoundAttacks(t *testing.T) {
	ctx := context.Background()
	other := func(f func(*Call)) Call { c := deploy(); f(&c); return c }
	cases := []struct {
		name   string
		attack func(*Store, *clock, Round) error
		want   error
		word   string
		named  bool // the audit names the approval
	}{
		{"a changed argument", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Arguments = []byte(`{"environment":"moon","version":"1.2.3"}`) }))
			return err
		}, ErrMismatch, "not the call", true},
		{"another tool", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Tool = "rollback" }))
			return err
		}, ErrMismatch, "not the call", true},
		{"another rule", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Rule = "global policy, rule 1" }))
			return err
		}, ErrMismatch, "not the call", true},
		{"another site", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Site = "https://other.example.com/mcp" }))
			return err
		}, ErrMismatch, "not the call", true},
		{"another route of the site", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Route = "broker" }))
			return err
		}, ErrMismatch, "not the call", true},
		{"another upstream of the aggregate", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Upstream = "ev2" }))
			return err
		}, ErrMismatch, "not the call", true},
		{"another method", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Method, c.Tool, c.Prompt = "prompts/get", "", "deploy" }))
			return err
		}, ErrMismatch, "not the call", true},
		{"another person", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Owner, c.Credential = "mallory", "tok_mallory" }))
			return err
		}, ErrCaller, "another caller", true},
		{"the same person's other credential", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.ID, other(func(c *Call) { c.Credential = "tok_alice_laptop" }))
			return err
		}, ErrCaller, "another caller", true},
		{"a replay", func(s *Store, _ *clock, r Round) error {
			if _, err := s.ConsumeRound(ctx, r.ID, deploy()); err != nil {
				t.Fatalf("the round: %v", err)
			}
			_, err := s.ConsumeRound(ctx, r.ID, deploy())
			return err
		}, ErrUsed, "used", true},
		{"past the approval's lifetime", func(s *Store, c *clock, r Round) error {
			c.add(DefaultApprovedLifetime)
			_, err := s.ConsumeRound(ctx, r.ID, deploy())
			return err
		}, ErrExpired, "expired", true},
		{"a made-up round", func(s *Store, _ *clock, _ Round) error {
			_, err := s.ConsumeRound(ctx, "apr_AAAAAAAAAAAAAAAAAAAAAA", deploy())
			return err
		}, ErrCaller, "another caller", false},
		{"an approval's id as a round", func(s *Store, _ *clock, r Round) error {
			_, err := s.ConsumeRound(ctx, r.Approval, deploy())
			return err
		}, ErrCaller, "another caller", false},
		{"a path as a round", func(s *Store, _ *clock, _ Round) error {
			_, err := s.ConsumeRound(ctx, "apr_../../calls/x", deploy())
			return err
		}, ErrCaller, "another caller", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var events []Event
			c := &clock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
			s, err := New(Options{Store: &certmagic.FileStorage{Path: t.TempDir()}, Now: c.now, Audit: func(e Event) {
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
			}})
			if err != nil {
				t.Fatal(err)
			}
			g := approvedGrant(t, s)
			r, err := s.IssueRound(ctx, g, "backend-S", true)
			if err != nil || r.Approval != g.Approval || r.N != 1 || !r.Expires.Equal(g.Expires) {
				t.Fatalf("issue: %+v %v", r, err)
			}
			err = tc.attack(s, c, r)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.word) {
				t.Fatalf("got %v, want %v saying %q", err, tc.want, tc.word)
			}
			mu.Lock()
			defer mu.Unlock()
			last := events[len(events)-1]
			if last.Action != "round_refused" || !errors.Is(last.Err, tc.want) || (last.ID == g.Approval) != tc.named {
				t.Fatalf("the audit: %+v, want round_refused naming the approval: %v", last, tc.named)
			}
		})
	}
}

// TestRoundRuns: a round consumed gives back the backend's state and binds
// the next round, each once; issuing is bounded by the state's size, the
// number of rounds and the approval's lifetime; two replicas' retries of
// one round (one storage) consume it once.
func TestRoundRuns(t *testing.T) {
	ctx := context.Background()
	s, c := newStore(t)
	g := approvedGrant(t, s)
	r1, err := s.IssueRound(ctx, g, "", false)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.ConsumeRound(ctx, r1.ID, deploy())
	if err != nil || got.HasState || got.State != "" {
		t.Fatalf("a round without the backend's state: %+v %v", got, err)
	}
	r2, err := s.IssueRound(ctx, got.Grant(), "round=2", true)
	if err != nil || r2.N != 2 || r2.ID == r1.ID {
		t.Fatalf("the second round: %+v %v", r2, err)
	}
	var wins, used int
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 4 {
		wg.Go(func() {
			r, err := s.ConsumeRound(ctx, r2.ID, deploy())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && r.State == "round=2" && r.HasState:
				wins++
			case errors.Is(err, ErrUsed):
				used++
			}
		})
	}
	wg.Wait()
	if wins != 1 || used != 3 {
		t.Fatalf("four retries of one round: %d ran, %d used, want 1 and 3", wins, used)
	}

	if _, err := s.IssueRound(ctx, g, strings.Repeat("s", MaxStateBytes+1), true); !errors.Is(err, ErrStateTooLarge) {
		t.Errorf("a state over the bound: %v", err)
	}
	many := g
	many.Rounds = MaxRounds
	if _, err := s.IssueRound(ctx, many, "s", true); !errors.Is(err, ErrTooManyRounds) {
		t.Errorf("a round past MaxRounds: %v", err)
	}
	c.add(DefaultApprovedLifetime)
	if _, err := s.IssueRound(ctx, g, "s", true); !errors.Is(err, ErrExpired) {
		t.Errorf("a round past the approval's lifetime: %v", err)
	}
	// The expired rounds are pruned as the next is issued.
	c.add(DefaultApprovedLifetime)
	g2 := approvedGrant(t, s)
	if _, err := s.IssueRound(ctx, g2, "s", true); err != nil {
		t.Fatal(err)
	}
	keys, _ := s.opts.Store.List(ctx, strings.TrimSuffix(RoundKeyPrefix, "/"), false)
	if len(keys) != 1 {
		t.Errorf("rounds kept after their approval expired: %v, want only the new one", keys)
	}
}
