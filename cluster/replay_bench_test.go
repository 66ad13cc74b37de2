package cluster

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
)

// BenchmarkReplayClaim is what the cluster's replay check adds to a DPoP
// proof per request, on a real nats-server on loopback (one replica, file
// storage): one KV create, beside dpop.Local, the check of a single node.
func BenchmarkReplayClaim(b *testing.B) {
	url := startNATS(b)
	s, _ := newStorage(b, url, StorageOptions{})
	ctx := testCtx(b)
	r, err := s.Replay(ctx, dpop.DefaultWindow)
	if err != nil {
		b.Fatal(err)
	}
	keys := func(n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = dpop.ReplayKey("0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I", rand.Text())
		}
		return ks
	}
	claim := func(b *testing.B, rp dpop.Replay) {
		ks := keys(b.N)
		until := time.Now().Add(time.Minute)
		b.ResetTimer()
		for i := range b.N {
			if fresh, err := rp.Claim(ctx, ks[i], until); err != nil || !fresh {
				b.Fatalf("claim %d: %v %v", i, fresh, err)
			}
		}
	}
	b.Run("nats", func(b *testing.B) { claim(b, r) })
	b.Run("local", func(b *testing.B) { claim(b, dpop.NewLocal(1<<20, 0)) })
}
