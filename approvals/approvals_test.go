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

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T) (*Store, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	s, err := New(Options{Store: &certmagic.FileStorage{Path: t.TempDir()}, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func deploy() Call {
	return Call{
		Rule: "mcp.example.com policy, rule 2", Message: "production deploys need a second person",
		Site: "https://mcp.example.com/mcp", Route: "guard", Method: "tools/call", Tool: "deploy",
		Owner: "alice", Credential: "tok_alice",
		Arguments: []byte(`{"environment":"production","version":"1.2.3"}`),
	}
}

var bob = Answerer{Owner: "bob", Credential: "tok_bob"}

func mayAll(Approval) bool { return true }

// TestAttacks: a table of what a caller (or someone else) does with an
// approval, each refused with its error and a word of the reason.
func TestAttacks(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// run holds deploy(), answers it as answer says (when set), then
		// does the attack and returns its error.
		answer func(*Store, *clock, Approval)
		attack func(*Store, *clock, Approval) error
		want   error
		word   string
	}{
		{
			name:   "one byte of an argument changed",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				c := deploy()
				c.Arguments = []byte(`{"environment":"production","version":"1.2.4"}`)
				_, err := s.Consume(ctx, a.ID, c)
				return err
			},
			want: ErrMismatch, word: "not the call",
		},
		{
			name:   "the arguments' keys in another order",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				c := deploy()
				c.Arguments = []byte(`{"version":"1.2.3","environment":"production"}`)
				_, err := s.Consume(ctx, a.ID, c)
				return err
			},
			want: ErrMismatch, word: "not the call",
		},
		{
			name:   "whitespace added to the arguments",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				c := deploy()
				c.Arguments = []byte(`{"environment": "production","version":"1.2.3"}`)
				_, err := s.Consume(ctx, a.ID, c)
				return err
			},
			want: ErrMismatch, word: "not the call",
		},
		{
			name:   "another tool with the same arguments",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				c := deploy()
				c.Tool = "deploy_all"
				_, err := s.Consume(ctx, a.ID, c)
				return err
			},
			want: ErrMismatch, word: "not the call",
		},
		{
			name:   "another upstream",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				c := deploy()
				c.Upstream = "prod"
				_, err := s.Consume(ctx, a.ID, c)
				return err
			},
			want: ErrMismatch, word: "not the call",
		},
		{
			name:   "a replay after the approval was used",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				if _, err := s.Consume(ctx, a.ID, deploy()); err != nil {
					t.Fatalf("the approved call: %v", err)
				}
				_, err := s.Consume(ctx, a.ID, deploy())
				return err
			},
			want: ErrUsed, word: "used",
		},
		{
			name:   "another person retries with the approval",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				c := deploy()
				c.Owner, c.Credential = "mallory", "tok_mallory"
				_, err := s.Consume(ctx, a.ID, c)
				return err
			},
			want: ErrCaller, word: "another caller",
		},
		{
			name:   "another credential of the same person retries",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				c := deploy()
				c.Credential = "tok_alice_2"
				_, err := s.Consume(ctx, a.ID, c)
				return err
			},
			want: ErrCaller, word: "another caller",
		},
		{
			name:   "a retry before anyone answered",
			attack: func(s *Store, _ *clock, a Approval) error { _, err := s.Consume(ctx, a.ID, deploy()); return err },
			want:   ErrPending, word: "awaits",
		},
		{
			name: "a denied approval",
			answer: func(s *Store, _ *clock, a Approval) {
				if _, err := s.Answer(ctx, a.ID, bob, false, mayAll); err != nil {
					t.Fatal(err)
				}
			},
			attack: func(s *Store, _ *clock, a Approval) error { _, err := s.Consume(ctx, a.ID, deploy()); return err },
			want:   ErrDenied, word: "denied",
		},
		{
			name:   "an approved one retried after its lifetime",
			answer: approve,
			attack: func(s *Store, c *clock, a Approval) error {
				c.add(DefaultApprovedLifetime + time.Second)
				_, err := s.Consume(ctx, a.ID, deploy())
				return err
			},
			want: ErrExpired, word: "expired",
		},
		{
			name: "a pending one approved after its lifetime",
			attack: func(s *Store, c *clock, a Approval) error {
				c.add(DefaultPendingLifetime + time.Second)
				_, err := s.Answer(ctx, a.ID, bob, true, mayAll)
				return err
			},
			want: ErrExpired, word: "expired",
		},
		{
			name: "the caller approves their own call",
			attack: func(s *Store, _ *clock, a Approval) error {
				_, err := s.Answer(ctx, a.ID, Answerer{Owner: "alice", Credential: "tok_alice"}, true, mayAll)
				return err
			},
			want: ErrSelf, word: "own",
		},
		{
			name: "another credential of the caller's owner approves",
			attack: func(s *Store, _ *clock, a Approval) error {
				_, err := s.Answer(ctx, a.ID, Answerer{Owner: "alice", Credential: "tok_alice_ci"}, true, mayAll)
				return err
			},
			want: ErrSelf, word: "own",
		},
		{
			name: "an approver without the right for the site",
			attack: func(s *Store, _ *clock, a Approval) error {
				_, err := s.Answer(ctx, a.ID, bob, true, func(Approval) bool { return false })
				return err
			},
			want: ErrNotApprover, word: "approve",
		},
		{
			name:   "a second answer after the first",
			answer: approve,
			attack: func(s *Store, _ *clock, a Approval) error {
				_, err := s.Answer(ctx, a.ID, Answerer{Owner: "carol", Credential: "tok_carol"}, false, mayAll)
				return err
			},
			want: ErrAnswered, word: "answered",
		},
		{
			name: "an id that was never issued",
			attack: func(s *Store, _ *clock, _ Approval) error {
				_, err := s.Consume(ctx, "apv_AAAAAAAAAAAAAAAAAAAAAA", deploy())
				return err
			},
			want: ErrUnknown, word: "unknown",
		},
		{
			name: "an id that is a path",
			attack: func(s *Store, _ *clock, _ Approval) error {
				_, err := s.Consume(ctx, "apv_../../tokens/x", deploy())
				return err
			},
			want: ErrUnknown, word: "unknown",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, c := newStore(t)
			a, err := s.Hold(ctx, deploy())
			if err != nil {
				t.Fatal(err)
			}
			if a.State != Pending || !strings.HasPrefix(a.ID, "apv_") {
				t.Fatalf("held: %+v", a)
			}
			if tc.answer != nil {
				tc.answer(s, c, a)
			}
			err = tc.attack(s, c, a)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.word) {
				t.Fatalf("%q does not say %q", err, tc.word)
			}
		})
	}
}

func approve(s *Store, _ *clock, a Approval) {
	if _, err := s.Answer(context.Background(), a.ID, bob, true, mayAll); err != nil {
		panic(err)
	}
}

// TestApprovedCallRunsOnce: the same call made again (with the id, or
// without it as a 2025-11-25 client retries) finds its approval; once
// used, the call is held anew.
func TestApprovedCallRunsOnce(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	a, err := s.Hold(ctx, deploy())
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Hold(ctx, deploy())
	if err != nil || again.ID != a.ID || again.State != Pending {
		t.Fatalf("the same call held again: %+v %v, want the same pending approval %s", again, err, a.ID)
	}
	if a.Digest != Digest(deploy()) || len(a.Digest) != 64 {
		t.Fatalf("digest %q", a.Digest)
	}
	ans, err := s.Answer(ctx, a.ID, bob, true, mayAll)
	if err != nil || ans.State != Approved || ans.AnsweredBy != "bob" {
		t.Fatalf("answer: %+v %v", ans, err)
	}
	found, err := s.Hold(ctx, deploy())
	if err != nil || found.ID != a.ID || found.State != Approved {
		t.Fatalf("the retry without its id: %+v %v", found, err)
	}
	used, err := s.Consume(ctx, found.ID, deploy())
	if err != nil || used.State != Consumed {
		t.Fatalf("consume: %+v %v", used, err)
	}
	next, err := s.Hold(ctx, deploy())
	if err != nil || next.ID == a.ID || next.State != Pending {
		t.Fatalf("the call made a second time after its approval was used: %+v %v, want a new pending approval", next, err)
	}
}

// TestSelfRule: a rule that says self lets the caller approve their own call.
func TestSelfRule(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	c := deploy()
	c.Self = true
	a, err := s.Hold(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Answer(ctx, a.ID, Answerer{Owner: "alice", Credential: "tok_alice"}, true, mayAll); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Consume(ctx, a.ID, deploy()); !errors.Is(err, ErrMismatch) {
		t.Fatalf("the call without self: %v (self is part of what was approved)", err)
	}
	if _, err := s.Consume(ctx, a.ID, c); err != nil {
		t.Fatal(err)
	}
}

// TestPendingBound: a caller holds at most MaxPendingPerCaller approvals
// pending; the next is refused, and one answered frees a place.
func TestPendingBound(t *testing.T) {
	ctx := context.Background()
	s, c := newStore(t)
	var first Approval
	for i := range MaxPendingPerCaller {
		call := deploy()
		call.Arguments = []byte(`{"n":` + string(rune('0'+i%10)) + `,"i":"` + strings.Repeat("x", i) + `"}`)
		a, err := s.Hold(ctx, call)
		if err != nil {
			t.Fatalf("approval %d: %v", i, err)
		}
		if i == 0 {
			first = a
		}
	}
	over := deploy()
	over.Arguments = []byte(`{"over":true}`)
	if _, err := s.Hold(ctx, over); !errors.Is(err, ErrTooMany) || !strings.Contains(err.Error(), "waiting") {
		t.Fatalf("one past the bound: %v", err)
	}
	other := deploy()
	other.Owner, other.Credential = "carol", "tok_carol"
	if _, err := s.Hold(ctx, other); err != nil {
		t.Fatalf("another caller is not bounded by alice's: %v", err)
	}
	if _, err := s.Answer(ctx, first.ID, bob, false, mayAll); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Hold(ctx, over); err != nil {
		t.Fatalf("after one was answered: %v", err)
	}
	c.add(DefaultPendingLifetime + time.Second)
	if _, err := s.Hold(ctx, over); err != nil {
		t.Fatalf("after they expired: %v", err)
	}
	list, err := s.List(ctx, mayAll)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || string(list[0].Arguments) != `{"over":true}` {
		t.Fatalf("pending after expiry: %d, want the one held since", len(list))
	}
}

// TestList: List shows the pending approvals the approver may answer,
// with the call's arguments to read, and never another state.
func TestList(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	a, _ := s.Hold(ctx, deploy())
	other := deploy()
	other.Site = "https://other.example.com/mcp"
	b, _ := s.Hold(ctx, other)
	onlyFirst := func(x Approval) bool { return x.Site == deploy().Site }
	list, err := s.List(ctx, onlyFirst)
	if err != nil || len(list) != 1 || list[0].ID != a.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	if string(list[0].Arguments) != string(deploy().Arguments) || list[0].Tool != "deploy" || list[0].Owner != "alice" {
		t.Fatalf("an approver reads what they approve: %+v", list[0])
	}
	if _, err := s.Answer(ctx, b.ID, bob, true, mayAll); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.List(ctx, mayAll); len(list) != 1 {
		t.Fatalf("an answered approval is still listed: %+v", list)
	}
}

// TestAnswersAudited: every answer, and every refused answer, is an event.
func TestAnswersAudited(t *testing.T) {
	ctx := context.Background()
	var events []Event
	c := &clock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	s, err := New(Options{Store: &certmagic.FileStorage{Path: t.TempDir()}, Now: c.now, Audit: func(e Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.Hold(ctx, deploy())
	_, _ = s.Answer(ctx, a.ID, Answerer{Owner: "alice", Credential: "tok_alice"}, true, mayAll)
	_, _ = s.Answer(ctx, a.ID, bob, true, mayAll)
	if len(events) != 2 || events[0].Action != "refused" || !errors.Is(events[0].Err, ErrSelf) ||
		events[1].Action != "approved" || events[1].By != "bob" || events[1].ID != a.ID || events[1].Rule != deploy().Rule {
		t.Fatalf("events: %+v", events)
	}
}
