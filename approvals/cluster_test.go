package approvals

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
)

// TestAcrossReplicas: on NATS storage (a real nats-server), a call held
// on one replica is listed and answered on the other; of answers racing
// on both, one wins; of the approved call made on both at once, one runs;
// a denied one runs on neither.
func TestAcrossReplicas(t *testing.T) {
	ns := natstest.JetStream(t)
	key := make([]byte, cluster.KeySize)
	_, _ = rand.Read(key)
	replica := func() *Store {
		conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{ns.ClientURL()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		st, err := conn.Storage(context.Background(), cluster.StorageOptions{Key: key, LockTTL: 2 * time.Second, LockPoll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Options{Store: st})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := replica(), replica()
	ctx := context.Background()
	for round := range 3 {
		call := deploy()
		call.Arguments = []byte(`{"environment":"production","round":` + string(rune('0'+round)) + `}`)
		held, err := a.Hold(ctx, call)
		if err != nil {
			t.Fatal(err)
		}
		list, err := b.List(ctx, mayAll)
		if err != nil || len(list) != 1 || list[0].ID != held.ID {
			t.Fatalf("round %d: the other replica lists %+v %v", round, list, err)
		}
		type result struct {
			approve bool
			err     error
		}
		answers := make(chan result, 4)
		for i := range 4 {
			go func() {
				s, approve := a, round != 2 // rounds 0 and 1 approve, round 2 denies
				if i >= 2 {
					s = b
				}
				_, err := s.Answer(ctx, held.ID, Answerer{Owner: "approver" + string(rune('0'+i)), Credential: "tok"}, approve, mayAll)
				answers <- result{approve, err}
			}()
		}
		won, approved := 0, false
		for range 4 {
			r := <-answers
			switch {
			case r.err == nil:
				won++
				approved = r.approve
			case !errors.Is(r.err, ErrAnswered):
				t.Fatalf("round %d: an answer: %v", round, r.err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d answers won", round, won)
		}
		if !approved {
			if _, err := b.Consume(ctx, held.ID, call); !errors.Is(err, ErrDenied) {
				t.Fatalf("round %d: a denied call: %v", round, err)
			}
			continue
		}
		runs := make(chan error, 6)
		for i := range 6 {
			go func() {
				s := a
				if i%2 == 1 {
					s = b
				}
				_, err := s.Consume(ctx, held.ID, call)
				runs <- err
			}()
		}
		ran := 0
		for range 6 {
			switch err := <-runs; {
			case err == nil:
				ran++
			case !errors.Is(err, ErrUsed):
				t.Fatalf("round %d: a consume: %v", round, err)
			}
		}
		if ran != 1 {
			t.Fatalf("round %d: the approved call ran %d times across two replicas", round, ran)
		}
	}
}

// TestRoundsAcrossReplicas: on NATS storage (a real nats-server), the
// retries of one round of an approved call, sent at once to two replicas,
// run once; of two replicas forwarding the call the round let run, one
// marks it; of hops taking the mark on both (a hop signed again by a
// holder of the cluster key, to the node it was marked for), one takes it.
func TestRoundsAcrossReplicas(t *testing.T) {
	ns := natstest.JetStream(t)
	key := make([]byte, cluster.KeySize)
	_, _ = rand.Read(key)
	replica := func() *Store {
		conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{ns.ClientURL()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		st, err := conn.Storage(context.Background(), cluster.StorageOptions{Key: key, LockTTL: 2 * time.Second, LockPoll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Options{Store: st})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := replica(), replica()
	ctx := context.Background()
	race := func(what string, f func(s *Store) error, refused error) {
		t.Helper()
		errs := make(chan error, 6)
		for i := range 6 {
			go func() {
				s := a
				if i%2 == 1 {
					s = b
				}
				errs <- f(s)
			}()
		}
		won := 0
		for range 6 {
			switch err := <-errs; {
			case err == nil:
				won++
			case !errors.Is(err, refused):
				t.Fatalf("%s: %v", what, err)
			}
		}
		if won != 1 {
			t.Fatalf("%s on two replicas at once: %d succeeded, want 1", what, won)
		}
	}
	g := approvedGrant(t, a)
	for n := range 3 {
		r, err := a.IssueRound(ctx, g, "backend-S"+string(rune('0'+n)), true)
		if err != nil {
			t.Fatal(err)
		}
		var got Round
		race("the retry of one round", func(s *Store) error {
			used, err := s.ConsumeRound(ctx, r.ID, deploy())
			if err == nil {
				got = used
			}
			return err
		}, ErrUsed)
		if got.State != "backend-S"+string(rune('0'+n)) || got.N != n+1 {
			t.Fatalf("round %d gave back %+v", n+1, got)
		}
		race("the forward of the call it let run", func(s *Store) error { return s.MarkHop(ctx, r.ID, "gw-c") }, ErrHop)
		race("a hop taking its mark", func(s *Store) error { return s.TakeHop(ctx, r.ID, "gw-c", deploy()) }, ErrHop)
		g = got.Grant()
	}
}
