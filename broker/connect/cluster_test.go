package connect

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
)

// TestConnectAcrossReplicas: on NATS storage (a real nats-server), a
// link made on one replica is used once across two: of presses racing on
// both, one starts an authorization; its answer is finished on the other
// replica, in the owner's browser, once; and a wait on the first replica
// sees it.
func TestConnectAcrossReplicas(t *testing.T) {
	ns := natstest.JetStream(t)
	key := make([]byte, cluster.KeySize)
	_, _ = rand.Read(key)
	f := newFixture(t)
	replica := func() *Service {
		conn, err := cluster.Dial(cluster.ConnConfig{URLs: []string{ns.ClientURL()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		st, err := conn.Storage(context.Background(), cluster.StorageOptions{Key: key, LockTTL: 2 * time.Second, LockPoll: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{Site: site, Store: st, People: f.signin, Authorizer: f.auth, Now: f.clock.now, Audit: func(Refusal) {}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := replica(), replica()
	alice := browser{}
	f.signIn(alice, "alice")
	press := func(s *Service, path string) int {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader("connect=1"))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", site)
		for n, v := range alice {
			r.AddCookie(&http.Cookie{Name: n, Value: v})
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, r)
		return rec.Code
	}
	for round := range 3 {
		l, err := a.Create(context.Background(), "alice", "github")
		if err != nil {
			t.Fatal(err)
		}
		path := strings.TrimPrefix(l.URL, site)
		codes := make(chan int, 6)
		for i := range 6 {
			go func() {
				s := a
				if i%2 == 1 {
					s = b
				}
				codes <- press(s, path)
			}()
		}
		won := 0
		for range 6 {
			switch c := <-codes; c {
			case http.StatusSeeOther:
				won++
			case http.StatusForbidden:
			default:
				t.Errorf("round %d: a press answered %d", round, c)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d presses of one link started an authorization across two replicas", round, won)
		}
	}
	// The answer of an authorization started on A is finished on B.
	l, err := a.Create(context.Background(), "alice", "github")
	if err != nil {
		t.Fatal(err)
	}
	path := strings.TrimPrefix(l.URL, site)
	fa := &fixture{t: t, svc: a, clock: f.clock, auth: f.auth}
	fb := &fixture{t: t, svc: b, clock: f.clock, auth: f.auth}
	callback := fa.authorizeFrom(fa.post(alice, path, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	seen := make(chan bool, 1)
	go func() { seen <- a.Wait(ctx, "alice", l.Elicitation) }()
	if resp := fb.get(alice, callback); resp.StatusCode != http.StatusOK {
		t.Fatalf("callback on the other replica: %d %s", resp.StatusCode, readBody(resp))
	}
	if resp := fa.get(alice, callback); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the answer again on the first replica: %d", resp.StatusCode)
	}
	if !<-seen {
		t.Fatal("the wait on the first replica did not see the connection on the other")
	}
}
