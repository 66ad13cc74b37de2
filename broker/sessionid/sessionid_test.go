package sessionid

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func newTestSessionIDs(t testing.TB) *Sealer {
	t.Helper()
	ids, err := New(bytes.Repeat([]byte{7}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestSessionIDsRoundTrip(t *testing.T) {
	ids := newTestSessionIDs(t)
	for _, upstream := range []string{"a", "5TQK2VZ3E4B6NYS7RBSUXVGZ3M", "0196f0e2-6f2a-7c1e-9b7e-3f6a2c1d4e5f", strings.Repeat("x", MaxUpstream)} {
		sealed := ids.Seal(upstream, "tok_alice", "broker:github")
		if len(upstream) > 8 && strings.Contains(sealed, upstream) {
			t.Errorf("sealed id %q shows the upstream id", sealed)
		}
		if sealed == "" || strings.IndexFunc(sealed, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			t.Errorf("sealed id %q is not a valid Mcp-Session-Id (visible ASCII)", sealed)
		}
		got, err := ids.Open(sealed, "tok_alice", "broker:github")
		if err != nil || got != upstream {
			t.Errorf("Open(Seal(%q)) = %q, %v", upstream, got, err)
		}
	}
}

func TestSessionIDsFreshNonce(t *testing.T) {
	ids := newTestSessionIDs(t)
	a := ids.Seal("s-1", "tok_alice", "broker:github")
	b := ids.Seal("s-1", "tok_alice", "broker:github")
	if a == b {
		t.Fatal("sealing one upstream id twice gave the same id: the nonce is not fresh")
	}
}

func TestSessionIDsRefuse(t *testing.T) {
	ids := newTestSessionIDs(t)
	sealed := ids.Seal("s-1", "tok_alice", "broker:github")
	raw, _ := base64.RawURLEncoding.DecodeString(sealed)
	flipped := bytes.Clone(raw)
	flipped[len(flipped)-1] ^= 1
	version := bytes.Clone(raw)
	version[0] = 3
	other, err := New(bytes.Repeat([]byte{8}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	// Opened once for its own token and route first: what Open remembers
	// of it must open it for no other.
	if got, err := ids.Open(sealed, "tok_alice", "broker:github"); err != nil || got != "s-1" {
		t.Fatalf("Open for its own token = %q, %v", got, err)
	}

	for _, tc := range []struct {
		name, id, principal, route string
	}{
		{"another token", sealed, "tok_bob", "broker:github"},
		{"another route", sealed, "tok_alice", "broker:linear"},
		{"token and route boundary moved", ids.Seal("s-1", "tok_alice\x00broker:", "github"), "tok_alice", "broker:github"},
		{"another key", other.Seal("s-1", "tok_alice", "broker:github"), "tok_alice", "broker:github"},
		{"bit flipped", base64.RawURLEncoding.EncodeToString(flipped), "tok_alice", "broker:github"},
		{"unknown version", base64.RawURLEncoding.EncodeToString(version), "tok_alice", "broker:github"},
		{"truncated", sealed[:len(sealed)-4], "tok_alice", "broker:github"},
		{"upstream id as is", "s-1", "tok_alice", "broker:github"},
		{"not base64", sealed[:10] + "!*" + sealed[12:], "tok_alice", "broker:github"},
		{"padded base64", sealed + "==", "tok_alice", "broker:github"},
		{"empty", "", "tok_alice", "broker:github"},
		{"too long", strings.Repeat("A", 4096), "tok_alice", "broker:github"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ids.Open(tc.id, tc.principal, tc.route)
			if !errors.Is(err, ErrUnknown) {
				t.Fatalf("Open = %q, %v; want ErrUnknownSession", got, err)
			}
			if got != "" {
				t.Errorf("Open returned %q with its error", got)
			}
		})
	}
	if got, err := ids.Open(sealed, "tok_alice", "broker:github"); err != nil || got != "s-1" {
		t.Fatalf("Open for its own token after the refusals = %q, %v", got, err)
	}
}

// TestSessionIDsOpenMany opens more ids than Open remembers, each several
// times and interleaved with other principals' attempts: every one opens to
// its own upstream id for its own principal only, whichever were forgotten.
func TestSessionIDsOpenMany(t *testing.T) {
	ids := newTestSessionIDs(t)
	n := 3 * openedSlots
	sealed := make([]string, n)
	for i := range sealed {
		sealed[i] = ids.Seal(fmt.Sprintf("up-%d", i), fmt.Sprintf("tok_%d", i%7), "guard:a")
	}
	for round := range 3 {
		for i, id := range sealed {
			got, err := ids.Open(id, fmt.Sprintf("tok_%d", i%7), "guard:a")
			if err != nil || got != fmt.Sprintf("up-%d", i) {
				t.Fatalf("round %d: Open(id %d) = %q, %v", round, i, got, err)
			}
			if got, err := ids.Open(id, fmt.Sprintf("tok_%d", (i+1)%7), "guard:a"); err == nil {
				t.Fatalf("round %d: id %d opened for another token: %q", round, i, got)
			}
			if got, err := ids.Open(id, fmt.Sprintf("tok_%d", i%7), "guard:b"); err == nil {
				t.Fatalf("round %d: id %d opened on another route: %q", round, i, got)
			}
		}
	}
}

func TestNewSessionIDsKeySize(t *testing.T) {
	for _, n := range []int{0, 16, 31, 33, 64} {
		if _, err := New(make([]byte, n)); err == nil || !strings.Contains(err.Error(), "32 random bytes") {
			t.Errorf("key of %d bytes: err = %v, want one that asks for 32 random bytes", n, err)
		}
	}
}

func FuzzSessionIDsOpen(f *testing.F) {
	ids := newTestSessionIDs(f)
	f.Add(ids.Seal("s-1", "tok_alice", "broker:github"))
	f.Add("")
	f.Add("AQ")
	f.Fuzz(func(t *testing.T, id string) {
		// Whatever a client sends, Open answers without panicking, and
		// only an id it sealed for this principal and route opens.
		if got, err := ids.Open(id, "tok_bob", "broker:github"); err == nil {
			t.Fatalf("Open(%q) for a principal nobody sealed for = %q", id, got)
		}
	})
}

// TestSessionIDsOpenConcurrent opens ids from several goroutines at once,
// each for its own token and for another's, over fewer slots than ids: what
// one goroutine stores never opens an id for another's token.
func TestSessionIDsOpenConcurrent(t *testing.T) {
	ids := newTestSessionIDs(t)
	const tokens, perToken = 4, 600 // 2400 ids, more than openedSlots
	sealed := make([][]string, tokens)
	for tk := range sealed {
		for i := range perToken {
			sealed[tk] = append(sealed[tk], ids.Seal(fmt.Sprintf("up-%d-%d", tk, i), fmt.Sprintf("tok_%d", tk), "guard:a"))
		}
	}
	errs := make(chan error, 2*tokens)
	var wg sync.WaitGroup
	for g := range 2 * tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, other := g%tokens, (g+1)%tokens
			for round := range 3 {
				for i, id := range sealed[tk] {
					if got, err := ids.Open(id, fmt.Sprintf("tok_%d", tk), "guard:a"); err != nil || got != fmt.Sprintf("up-%d-%d", tk, i) {
						errs <- fmt.Errorf("round %d: token %d id %d opened as %q, %v", round, tk, i, got, err)
						return
					}
					if got, err := ids.Open(id, fmt.Sprintf("tok_%d", other), "guard:a"); err == nil {
						errs <- fmt.Errorf("round %d: token %d's id %d opened for token %d: %q", round, tk, i, other, got)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// BenchmarkSessionIDOpen opens a client's id again, as every request after
// its first does ("again"), and a new id each time ("first": the AES-GCM
// opening, plus the table's lookup and store).
func BenchmarkSessionIDOpen(b *testing.B) {
	ids := newTestSessionIDs(b)
	b.Run("again", func(b *testing.B) {
		sealed := ids.Seal(rand.Text(), "tok_0123456789abcdef", "broker:github")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ids.Open(sealed, "tok_0123456789abcdef", "broker:github"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("first", func(b *testing.B) {
		sealed := make([]string, 4096)
		for i := range sealed {
			sealed[i] = ids.Seal(rand.Text(), "tok_0123456789abcdef", "broker:github")
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			// 4096 ids through 1024 slots: most are no longer there.
			if _, err := ids.Open(sealed[i%len(sealed)], "tok_0123456789abcdef", "broker:github"); err != nil {
				b.Fatal(err)
			}
			i += 1021
		}
	})
}

func BenchmarkSessionIDSeal(b *testing.B) {
	ids := newTestSessionIDs(b)
	upstream := rand.Text()
	b.ReportAllocs()
	for b.Loop() {
		ids.Seal(upstream, "tok_0123456789abcdef", "broker:github")
	}
}

// An id sealed by an earlier release (version 1, the same cipher without
// the purpose bound in) still opens, for its token and route only, so a
// client keeps its session across the upgrade. This one was sealed by
// that code under the key 32 bytes of 7.
func TestSessionIDsOfEarlierReleasesOpen(t *testing.T) {
	const earlier = "Af7euYpmia_vAJ99wffxUv8shp3VkriaSbxa2H8C0KXygZIdA3UlGBfOQRrMwc0"
	s, err := New(bytes.Repeat([]byte{7}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Open(earlier, "tok_1", "broker:github"); err != nil || got != "upstream-session-1" {
		t.Fatalf("the earlier release's id: %q, %v", got, err)
	}
	for _, c := range [][2]string{{"tok_2", "broker:github"}, {"tok_1", "broker:linear"}} {
		if _, err := s.Open(earlier, c[0], c[1]); !errors.Is(err, ErrUnknown) {
			t.Errorf("opened for %v: %v", c, err)
		}
	}
	// Today's ids are version 2; one relabelled version 1 does not open.
	now := s.Seal("upstream-session-1", "tok_1", "broker:github")
	raw, _ := base64.RawURLEncoding.DecodeString(now)
	if raw[0] != 2 {
		t.Fatalf("version %d, want 2", raw[0])
	}
	raw[0] = 1
	if _, err := s.Open(base64.RawURLEncoding.EncodeToString(raw), "tok_1", "broker:github"); !errors.Is(err, ErrUnknown) {
		t.Errorf("a version 2 id relabelled 1 opened: %v", err)
	}
}
