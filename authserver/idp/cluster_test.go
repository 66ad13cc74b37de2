package idp

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
)

// TestLinksAcrossReplicas: on NATS storage (a real nats-server), a link
// made through one replica is redeemed on another, once: of redemptions
// racing on two replicas, one wins, since each takes the cluster-wide
// storage lock.
func TestLinksAcrossReplicas(t *testing.T) {
	ns := natstest.JetStream(t)
	key := make([]byte, cluster.KeySize)
	_, _ = rand.Read(key)
	replica := func() *Links {
		conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{ns.ClientURL()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		st, err := conn.Storage(context.Background(), cluster.StorageOptions{Key: key, LockTTL: 2 * time.Second, LockPoll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return NewLinks(st, nil)
	}
	a, b := replica(), replica()
	ctx := context.Background()
	for round := range 3 {
		secret, _, err := a.Create(ctx, LinkSpec{Owner: "alice", Scopes: []string{"chat"}})
		if err != nil {
			t.Fatal(err)
		}
		results := make(chan error, 6)
		for i := range 6 {
			go func() {
				l := a
				if i%2 == 1 {
					l = b
				}
				_, err := l.Redeem(ctx, secret)
				results <- err
			}()
		}
		won := 0
		for range 6 {
			switch err := <-results; {
			case err == nil:
				won++
			case !errors.Is(err, ErrLinkUnknown):
				t.Errorf("round %d: %v", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d redemptions of one link succeeded across two replicas", round, won)
		}
	}
}
