package mcpendpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// openRaw opens an MCP session as a client that then forgets it would:
// initialize and notifications/initialized, no GET stream, no DELETE.
func openRaw(t *testing.T, url, token string) string {
	t.Helper()
	id, err := tryOpenRaw(url, token)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// tryOpenRaw is openRaw for goroutines other than the test's.
func tryOpenRaw(url, token string) (string, error) {
	send := func(sid, body string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		req.Header.Set("Authorization", "Bearer "+token)
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		// Read the answer: a client that hangs up first cancels its
		// initialize.
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, nil
	}
	resp, err := send("", initializeBody)
	if err != nil {
		return "", err
	}
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		return "", fmt.Errorf("initialize: status %d, session %q", resp.StatusCode, id)
	}
	if resp, err = send(id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
		return "", fmt.Errorf("notifications/initialized: %v", err)
	}
	if resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("notifications/initialized: status %d", resp.StatusCode)
	}
	return id, nil
}

func (h *harness) liveSessions() (server, peers, tracked int) {
	for range h.ep.server.Sessions() {
		server++
	}
	h.ep.mu.Lock()
	peers = len(h.ep.peers)
	h.ep.mu.Unlock()
	return server, peers, h.ep.idle.Len()
}

// awaitNoSessions waits, bounded, until the endpoint holds no MCP session.
func (h *harness) awaitNoSessions(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, p, n := h.liveSessions()
		if s == 0 && p == 0 && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %d go-sdk sessions, %d peers, %d tracked; want none", s, p, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestIdleMCPSessionsAreClosedAndFreed: sessions a client opened and left
// are closed after the timeout, and what they held is given back: go-sdk's
// sessions, the peers, the tracker's entries and the heap they took.
func TestIdleMCPSessionsAreClosedAndFreed(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.SessionTimeout = 3 * time.Second })
	const n = 300
	before := liveHeap()
	ids := make([]string, n)
	// Opened by a few clients at once, well within the timeout, so that
	// "peak" has them all.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				ids[i], errs[i] = tryOpenRaw(h.srv.URL, "alice-token")
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	peak := liveHeap()
	if s, p, tr := h.liveSessions(); s+p+tr > 3*n || s == 0 {
		t.Fatalf("after opening %d: %d go-sdk sessions, %d peers, %d tracked", n, s, p, tr)
	}
	h.awaitNoSessions(t)
	after := liveHeap()
	t.Logf("live heap: %d KiB before, %d KiB with %d idle MCP sessions (%.1f KiB each), %d KiB after the timeout",
		before>>10, peak>>10, n, float64(peak-before)/1024/n, after>>10)
	if grew := int64(peak) - int64(before); grew < 1<<20 || int64(after)-int64(before) > grew/5 {
		t.Errorf("heap grew %d KiB for %d sessions and is still %d KiB above the start after they closed; want under a fifth of it",
			grew>>10, n, (int64(after)-int64(before))>>10)
	}
	status, body := post(t, h.srv.URL, "alice-token", ids[0], `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if status != http.StatusNotFound {
		t.Errorf("a closed session's ping: %d %s, want 404 (the client initializes again)", status, body)
	}
}

// TestAnOpenStreamKeepsASession: a client that listens on its GET stream
// and sends nothing keeps its session; one without a stream, opened after
// it and so idle for less time, is closed; requests of another token with
// the listener's id do not count.
func TestAnOpenStreamKeepsASession(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.SessionTimeout = time.Second })
	opts, events := logs()
	listener := h.connect("alice-token", opts, nil) // go-sdk opens its GET stream
	forgotten := openRaw(t, h.srv.URL, "alice-token")
	for {
		post(t, h.srv.URL, "bob-token", listener.ID(), `{"jsonrpc":"2.0","id":9,"method":"ping"}`) // 403, and no use
		if h.peer(forgotten) == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
		if h.ep.idle.Len() == 0 {
			t.Fatal("the listener was closed too")
		}
	}
	if err := listener.Ping(context.Background(), nil); err != nil {
		t.Fatalf("the listening session was closed: %v", err)
	}
	// And it still gets its pushes.
	h.engine.mu.Lock()
	s := &memSession{target: listener.ID()}
	s.view.SessionID = "s-push"
	h.engine.emitLocked(s, "done", "finished", "pushed after the timeout", "")
	h.engine.mu.Unlock()
	if m := next(t, events); !strings.Contains(eventOf(t, m).Summary, "pushed after the timeout") {
		t.Errorf("push = %+v", m)
	}
}
