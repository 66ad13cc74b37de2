package cluster

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
)

var _ dpop.Replay = (*Replay)(nil)

// A proof taken on one replica is a replay on every other: two replicas,
// each on its own connection to a real nats-server, claim the same keys.
func TestReplayAcrossReplicas(t *testing.T) {
	url := startNATS(t)
	a, _ := newStorage(t, url, StorageOptions{})
	b, _ := newStorage(t, url, StorageOptions{})
	ctx := testCtx(t)
	ra, err := a.Replay(ctx, dpop.DefaultWindow)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Replay(ctx, dpop.DefaultWindow)
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Minute)
	for i := range 20 {
		key := dpop.ReplayKey(rand.Text()+rand.Text()[:17], rand.Text())
		first, second := ra, rb
		if i%2 == 1 {
			first, second = rb, ra
		}
		if fresh, err := first.Claim(ctx, key, until); err != nil || !fresh {
			t.Fatalf("proof %d, first claim: fresh %v, %v", i, fresh, err)
		}
		if fresh, err := second.Claim(ctx, key, until); err != nil || fresh {
			t.Fatalf("proof %d on the other replica: fresh %v, %v; want a replay", i, fresh, err)
		}
		if fresh, err := first.Claim(ctx, key, until); err != nil || fresh {
			t.Fatalf("proof %d again on the first replica: fresh %v, %v; want a replay", i, fresh, err)
		}
	}
}

// Replicas with another cluster key keep their own claims (the keys are
// MACs under the cluster key): one cluster's proofs are not another's.
func TestReplayKeyedByClusterKey(t *testing.T) {
	url := startNATS(t)
	other := make([]byte, KeySize)
	_, _ = rand.Read(other)
	a, _ := newStorage(t, url, StorageOptions{})
	b, _ := newStorage(t, url, StorageOptions{Key: other})
	ctx := testCtx(t)
	ra, err := a.Replay(ctx, dpop.DefaultWindow)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Replay(ctx, dpop.DefaultWindow)
	if err != nil {
		t.Fatal(err)
	}
	key := dpop.ReplayKey("k", "jti")
	for _, r := range []*Replay{ra, rb} {
		if fresh, err := r.Claim(ctx, key, time.Now()); err != nil || !fresh {
			t.Fatalf("fresh %v, %v; want each cluster key's first claim fresh", fresh, err)
		}
	}
}

// A claim is forgotten once its proof is stale (the bucket's max age, two
// windows): the bucket does not grow with every proof ever taken.
func TestReplayForgetsStaleProofs(t *testing.T) {
	url := startNATS(t)
	a, _ := newStorage(t, url, StorageOptions{})
	ctx := testCtx(t)
	r, err := a.Replay(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	key := dpop.ReplayKey("k", rand.Text())
	if fresh, err := r.Claim(ctx, key, time.Now().Add(time.Second)); err != nil || !fresh {
		t.Fatalf("first claim: %v %v", fresh, err)
	}
	for {
		fresh, err := r.Claim(ctx, key, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if fresh {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim was never forgotten")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// A NATS that is gone makes the check unavailable (an error, which the
// verifier turns into a refusal), never a fresh claim.
func TestReplayUnavailable(t *testing.T) {
	url := startNATS(t)
	a, nc := newStorage(t, url, StorageOptions{})
	ctx := testCtx(t)
	r, err := a.Replay(ctx, dpop.DefaultWindow)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	fresh, err := r.Claim(context.Background(), dpop.ReplayKey("k", "j"), time.Now())
	if err == nil || fresh {
		t.Fatalf("fresh %v, %v; want an error", fresh, err)
	}
}
