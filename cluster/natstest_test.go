package cluster

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
)

// startNATS runs a real nats-server with JetStream, embedded, on a free
// loopback port, and returns its URL.
func startNATS(t testing.TB) string {
	t.Helper()
	return natstest.JetStream(t).ClientURL()
}

// connect opens a NATS connection of its own (one per simulated replica).
func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// testKey is the cluster key the tests' replicas share.
var testKey = func() []byte {
	k := make([]byte, KeySize)
	_, _ = rand.Read(k)
	return k
}()

// newStorage opens a Storage on a connection of its own, with testKey
// unless opts has a key.
func newStorage(t testing.TB, url string, opts StorageOptions) (*Storage, *nats.Conn) {
	t.Helper()
	if opts.Key == nil {
		opts.Key = testKey
	}
	nc := connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := NewStorage(ctx, js, nc.MaxPayload(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, nc
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
