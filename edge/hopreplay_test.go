package edge

import (
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/replay"
)

// A node whose replay check is full refuses new hops 503 with
// Retry-After, and still refuses every hop it took when replayed: it
// never makes room by forgetting a nonce whose hop is not stale. Once the
// window passes, hops are taken again.
func TestHopReplayCacheIsBounded(t *testing.T) {
	k := testHopKey(t)
	k.replay = replay.New(replay.Shards*4, HopFreshness)
	now := time.Now()
	var taken []*http.Request
	for i, full := 0, false; !full; i++ {
		if i > 100*replay.Shards {
			t.Fatalf("%d hops taken by a check bounded to %d nonces", len(taken), replay.Shards*4)
		}
		r := signedHop(t, k, http.MethodGet, "", now)
		switch _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now); {
		case v.Allowed():
			taken = append(taken, r)
		case v.Status == http.StatusServiceUnavailable && v.Reason == "hop_busy" && v.RetryAfter > 0:
			full = true
		default:
			t.Fatalf("hop %d: %d %q", i, v.Status, v.Reason)
		}
	}
	if len(taken) > replay.Shards*4 {
		t.Fatalf("%d hops taken by a check bounded to %d nonces", len(taken), replay.Shards*4)
	}
	for i, r := range taken {
		if _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now); v.Reason != "hop_replayed" {
			t.Fatalf("hop %d replayed into a full check: %d %q, want hop_replayed", i, v.Status, v.Reason)
		}
	}
	// Once the window passes, hops are taken again: the shard a hop
	// reaches forgets its stale nonces first.
	later := now.Add(HopFreshness + time.Second)
	again := signedHop(t, k, http.MethodGet, "", later)
	if _, v := k.Verify(again, again.URL.RequestURI(), nil, "b", hopRoute, later); !v.Allowed() {
		t.Fatalf("a hop after the window: %+v", v)
	}
}

// A hop whose nonce the check forgot (stale on the clock of a later hop)
// is refused as stale when it comes again on a clock read a moment
// earlier, never taken as new.
func TestHopForgottenNonceIsStale(t *testing.T) {
	k := testHopKey(t)
	at := time.Now()
	first := signedHop(t, k, http.MethodGet, "", at)
	c, v := k.Verify(first, first.URL.RequestURI(), nil, "b", hopRoute, at)
	if !v.Allowed() {
		t.Fatal(v)
	}
	// A later hop on the same shard (the check picks it by the nonce's
	// first byte), checked once the first is stale, forgets the first.
	late := at.Add(HopFreshness + time.Second)
	for i := 0; ; i++ {
		if i == 100*replay.Shards {
			t.Fatalf("no hop of %d signed reached the first hop's shard", i)
		}
		r := signedHop(t, k, http.MethodGet, "", late)
		if hopShard(t, r.Header.Get(HopHeader)) != hopShard(t, first.Header.Get(HopHeader)) {
			continue
		}
		if _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, late); !v.Allowed() {
			t.Fatal(v)
		}
		break
	}
	if _, v := k.Verify(first, first.URL.RequestURI(), nil, "b", hopRoute, at.Add(HopFreshness)); v.Status != http.StatusUnauthorized || v.Reason != "hop_stale" {
		t.Fatalf("hop %s again, on a clock read before its nonce was forgotten: %d %q, want 401 hop_stale", c.Nonce, v.Status, v.Reason)
	}
}

// hopShard is the replay check's shard of the nonce in a Zidane-Hop header.
func hopShard(t *testing.T, header string) int {
	t.Helper()
	for p := range strings.SplitSeq(header, ";") {
		if n, ok := strings.CutPrefix(p, "n="); ok {
			b, err := hex.DecodeString(n)
			if err != nil || len(b) != 16 {
				t.Fatalf("nonce %q", n)
			}
			return int(b[0]) % replay.Shards
		}
	}
	t.Fatalf("no nonce in %q", header)
	return 0
}
