package clients

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// TestRegistrationAcrossReplicas runs two replicas on one real
// nats-server's storage: registrations sent to both at once stop at the
// bound between them (the count is taken under the cluster-wide lock),
// and a client registered on one replica resolves on the other.
func TestRegistrationAcrossReplicas(t *testing.T) {
	ns := natstest.JetStream(t)
	key := make([]byte, cluster.KeySize)
	rand.Read(key)
	replica := func() storage.Storage {
		conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{ns.ClientURL()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		st, err := conn.Storage(context.Background(), cluster.StorageOptions{Key: key, LockTTL: 5 * time.Second, LockPoll: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	const bound = 3
	a, _, _ := testRegistry(t, Config{Storage: replica(), Registration: true, MaxRegistered: bound})
	b, _, _ := testRegistry(t, Config{Storage: replica(), Registration: true, MaxRegistered: bound})

	var wg sync.WaitGroup
	codes := make(chan int, 2*bound)
	ids := make(chan string, 2*bound)
	for i := range 2 * bound {
		r := a
		if i%2 == 1 {
			r = b
		}
		wg.Go(func() {
			w := register(r, "198.51.100."+strconv.Itoa(i+1), "application/json", "POST", goodRegistration)
			codes <- w.Code
			if w.Code == 201 {
				var resp struct {
					ClientID string `json:"client_id"`
				}
				json.Unmarshal(w.Body.Bytes(), &resp)
				ids <- resp.ClientID
			}
		})
	}
	wg.Wait()
	close(codes)
	close(ids)
	created, full := 0, 0
	for c := range codes {
		switch c {
		case 201:
			created++
		case 403:
			full++
		default:
			t.Errorf("status %d", c)
		}
	}
	if created != bound || full != bound {
		t.Errorf("%d registered and %d refused as full, want %d and %d", created, full, bound, bound)
	}
	for id := range ids {
		for _, r := range []*Registry{a, b} {
			if c, err := r.Resolve(context.Background(), id); err != nil || c.ClientID() != id {
				t.Errorf("resolve %s: %+v %v", id, c, err)
			}
		}
	}
}
