package aggregate

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

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// rawPost sends one JSON-RPC message on the aggregated route as a bare
// HTTP client, reads the whole answer, and returns the status, the session
// id header and the body.
func rawPost(t *testing.T, url, sid, body string) (int, string, string) {
	t.Helper()
	status, id, answer, err := tryRawPost(url, sid, body)
	if err != nil {
		t.Fatal(err)
	}
	return status, id, answer
}

func tryRawPost(url, sid, body string) (int, string, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer client-token")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), string(b), nil
}

const aggInitialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"forgetful","version":"1"}}}`

// forgetful opens a downstream session, has it call a tool (so that it
// holds an upstream session of its own), and leaves it.
func forgetful(t *testing.T, url string) string {
	t.Helper()
	sid, err := tryForgetful(url)
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

// tryForgetful is forgetful for goroutines other than the test's.
func tryForgetful(url string) (string, error) {
	status, sid, body, err := tryRawPost(url, "", aggInitialize)
	if err != nil || status != http.StatusOK || sid == "" {
		return "", fmt.Errorf("initialize: %d %q %s %v", status, sid, body, err)
	}
	if status, _, body, err := tryRawPost(url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil || status != http.StatusAccepted {
		return "", fmt.Errorf("notifications/initialized: %d %s %v", status, body, err)
	}
	if status, _, body, err := tryRawPost(url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"mcp_a_echo","arguments":{"text":"hi"}}}`); err != nil || status != http.StatusOK || !strings.Contains(body, "a:hi") {
		return "", fmt.Errorf("tools/call: %d %s %v", status, body, err)
	}
	return sid, nil
}

// held is what the route keeps for downstream sessions.
type held struct{ sessions, byID, bindings, subs, tracked, server, upstream int }

func (a *Aggregate) held(up *mcp.Server) held {
	var h held
	a.mu.Lock()
	h.sessions, h.byID, h.bindings, h.subs = len(a.sessions), len(a.byID), len(a.bindings), len(a.subs)
	a.mu.Unlock()
	h.tracked = a.idle.Len()
	for range a.server.Sessions() {
		h.server++
	}
	for range up.Sessions() {
		h.upstream++
	}
	return h
}

func awaitHeld(t *testing.T, a *Aggregate, up *mcp.Server, want held) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := a.held(up)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the route holds %+v after 30s, want %+v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settledHeap closes the idle HTTP connections of the test's client and
// of the route's egress (a pool that keeps up to 256 for 90s, whatever
// the sessions), waits (bounded) until at most maxGoroutines goroutines
// are left, or 0 for no wait, and returns the live heap after a GC and
// the goroutine count.
func settledHeap(t *testing.T, a *Aggregate, maxGoroutines int) (uint64, int) {
	t.Helper()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	for _, up := range a.ups {
		up.tr.CloseIdle()
	}
	deadline := time.Now().Add(10 * time.Second)
	for maxGoroutines > 0 && runtime.NumGoroutine() > maxGoroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, runtime.NumGoroutine()
}

// TestAggregateIdleSessionsAreReleased: downstream sessions left after a
// tool call are closed after the timeout, and everything the route held
// for them goes: the sessions and byID maps, the token bindings, go-sdk's
// server sessions, and their upstream client sessions (the upstream is
// left with the catalog's one), and the heap they took.
func TestAggregateIdleSessionsAreReleased(t *testing.T) {
	up := newFastUp(t, "a", false)
	a, url := aggServe(t, []upstream.Config{up.config()}, Options{SessionTimeout: 3 * time.Second})
	forgetful(t, url) // the first session's one-time costs go in "before"
	awaitHeld(t, a, up.server, held{upstream: 1})
	before, gBefore := settledHeap(t, a, 0)
	const n = 100
	ids := make([]string, n)
	// Opened by a few clients at once, well within the timeout, so that
	// "peak" has them all.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				ids[i], errs[i] = tryForgetful(url)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	peak, gPeak := settledHeap(t, a, 0)
	h := a.held(up.server)
	if h.bindings == 0 || h.upstream < 2 {
		t.Fatalf("after opening %d sessions the route holds %+v", n, h)
	}
	awaitHeld(t, a, up.server, held{upstream: 1})
	after, gAfter := settledHeap(t, a, gBefore+2)
	t.Logf("live heap (route and upstream): %d KiB before, %d KiB with %d idle sessions (%.1f KiB each), %d KiB after the timeout; goroutines %d, %d, %d",
		before>>10, peak>>10, n, float64(peak-before)/1024/n, after>>10, gBefore, gPeak, gAfter)
	if grew := int64(peak) - int64(before); grew < 512<<10 || int64(after)-int64(before) > grew/5 {
		t.Errorf("heap grew %d KiB for %d sessions and is still %d KiB above the start after they closed; want under a fifth of it",
			grew>>10, n, (int64(after)-int64(before))>>10)
	}
	if status, _, body := rawPost(t, url, ids[0], `{"jsonrpc":"2.0","id":3,"method":"ping"}`); status != http.StatusNotFound {
		t.Errorf("a closed session's ping: %d %s, want 404", status, body)
	}
}

// TestAggregateHalfOpenSessionIsReleased: a client that sends initialize
// and nothing else leaves a token binding and a server session; both go
// after the timeout.
func TestAggregateHalfOpenSessionIsReleased(t *testing.T) {
	up := newFastUp(t, "a", false)
	a, url := aggServe(t, []upstream.Config{up.config()}, Options{SessionTimeout: 200 * time.Millisecond})
	if status, sid, body := rawPost(t, url, "", aggInitialize); status != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d %s", status, body)
	}
	awaitHeld(t, a, up.server, held{upstream: 1})
}

// TestAggregateFastPathKeepsASession: a client whose calls all take the
// fast path (which go-sdk's handler never sees) keeps its session while a
// session opened after it, and so idle for less time, is closed.
func TestAggregateFastPathKeepsASession(t *testing.T) {
	up := newFastUp(t, "a", false)
	a, url := aggServe(t, []upstream.Config{up.config()}, Options{SessionTimeout: time.Second})
	c := mcp.NewClient(&mcp.Implementation{Name: "busy", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	busy, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: aggAuthRT{http.DefaultTransport}},
		MaxRetries: -1, DisableStandaloneSSE: true}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	call := func() {
		t.Helper()
		res, err := busy.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "still here"}})
		if err != nil || aggText(t, res) != "a:still here" {
			t.Fatalf("the busy session's call: %v %v", res, err)
		}
	}
	call() // opens its upstream session; the next ones take the fast path
	fastBefore := up.fast.Load()
	forgotten := forgetful(t, url)
	for {
		call()
		a.mu.Lock()
		_, open := a.bindings[forgotten]
		a.mu.Unlock()
		if !open {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the forgotten session was not closed within 30s")
		}
	}
	call()
	if up.fast.Load() <= fastBefore {
		t.Fatal("the busy session's calls did not take the fast path, so this test shows nothing about it")
	}
}
