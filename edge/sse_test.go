package edge

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// What the event-stream filter holds of an unfinished event stays within a
// small multiple of its bytes on the wire, however the event is cut into
// lines: an event of one-byte lines must not cost a slice and an allocation
// per line (some 30 bytes of memory for every 2 on the wire, about 250 MiB
// for the 8 MiB an event may hold).
func TestSSEFilterHoldsEventCompactly(t *testing.T) {
	f := NewListing(&Guard{}, policy.Principal{TokenID: "t"}, nil, nil)
	s := newSSEFilter(f)
	const wire = 4 << 20
	chunk := bytes.Repeat([]byte("a\n"), 32<<10)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for sent := 0; sent < wire; sent += len(chunk) {
		if out := s.write(chunk); len(out) != 0 {
			t.Fatalf("an event went out before its blank line")
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	runtime.KeepAlive(s)
	if held > 3*wire {
		t.Fatalf("the filter holds %d MiB for an unfinished event of %d MiB on the wire; want at most 3 times its bytes", held>>20, wire>>20)
	}
}
