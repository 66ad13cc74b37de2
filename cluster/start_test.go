package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
)

// startReplica opens what a replica of the gateway opens at start on nc,
// in the order the zidane app does: its storage (the values, locks and
// blobs buckets), the node registry, and an event stream. ctx is the
// caller's bound, as the app gives it (30 s).
func startReplica(ctx context.Context, t *testing.T, nc *nats.Conn, i int, opts StorageOptions) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	opts.Key = testKey
	opts.Owner = fmt.Sprintf("gw-%d", i)
	s, err := NewStorage(ctx, js, nc.MaxPayload(), opts)
	if err != nil {
		return err
	}
	nodes, err := s.StartNodes(ctx, NodeOptions{Node: opts.Owner, Advertise: fmt.Sprintf("http://127.0.0.1:%d", 1000+i)})
	if err != nil {
		return err
	}
	t.Cleanup(nodes.Close)
	_, err = s.OpenEventStream(ctx, "sessions", 1000, nil)
	return err
}

// Three replicas started at the same instant on a three-server NATS
// cluster all come up, 20 times in a row: the first time with the cluster
// itself just started (no JetStream meta leader yet), then each time on
// buckets and streams of a fresh name, which the three create together.
// One of them asks for a longer lock TTL, as during a rolling change of
// lock_ttl, so the three do not create the locks bucket alike. Each
// replica has the 30 s the zidane app gives its storage set-up.
func TestReplicasStartTogether(t *testing.T) {
	servers := natstest.Cluster(t, 3)
	for run := range 20 {
		bucket := fmt.Sprintf("start%d", run)
		errs := make([]error, len(servers))
		took := make([]time.Duration, len(servers))
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i, srv := range servers {
			nc := connect(t, srv.ClientURL())
			ttl := 15 * time.Second
			if i == 2 {
				ttl = 30 * time.Second
			}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				<-gate
				start := time.Now()
				errs[i] = startReplica(ctx, t, nc, i, StorageOptions{Bucket: bucket, Replicas: 3, LockTTL: ttl})
				took[i] = time.Since(start).Round(time.Millisecond)
			})
		}
		close(gate)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("run %d of 20: a replica did not start (took %v): %v", run+1, took, err)
		}
		t.Logf("run %d: the three replicas started in %v", run+1, took)
	}
}

// The set-up tries again on what a peer's concurrent create or a young
// cluster gives, and on nothing else: a bucket that no update can make
// into the one asked for, or more replicas than the NATS servers can
// hold, fails with the server's reason and what to check, not as "NATS
// did not answer".
func TestStartRefusesWhatNoRetryMends(t *testing.T) {
	for _, tt := range []struct {
		name    string
		servers func(t testing.TB) string
		opts    StorageOptions
		want    []string
	}{
		{"a locks bucket in memory storage", func(t testing.TB) string {
			url := startNATS(t)
			js, err := jetstream.New(connect(t, url))
			if err != nil {
				t.Fatal(err)
			}
			// JetStream cannot change a stream's storage type.
			if _, err := js.CreateKeyValue(testCtx(t), jetstream.KeyValueConfig{Bucket: "zidane_locks", Storage: jetstream.MemoryStorage}); err != nil {
				t.Fatal(err)
			}
			return url
		}, StorageOptions{}, []string{`KV bucket "zidane_locks"`, "storage type"}},
		{"replicas 3 on a lone server", startNATS, StorageOptions{Replicas: 3},
			[]string{`KV bucket "zidane"`, "replicas > 1 not supported"}},
		{"replicas 3 on a cluster of two", func(t testing.TB) string {
			return natstest.Cluster(t, 2)[0].ClientURL()
		}, StorageOptions{Replicas: 3}, []string{`KV bucket "zidane"`, "no suitable peers", "fewer JetStream servers than `replicas`"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc := connect(t, tt.servers(t))
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			opts := tt.opts
			opts.Key = testKey
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = NewStorage(ctx, js, nc.MaxPayload(), opts)
			if err == nil || errors.Is(err, ErrUnavailable) {
				t.Fatalf("NewStorage: %v; want the server's refusal", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("NewStorage: %v; want it to say %q", err, w)
				}
			}
		})
	}
}
