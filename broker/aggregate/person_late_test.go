package aggregate

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
)

// TestAggregatePerUserStreamOpenedAfterConnecting: a 2025-11-25 session
// whose GET stream is not open when its person connects (a client that
// opens it late, or is reopening it) hears of the completion and of the
// changed list on the next GET stream it opens: go-sdk drops a
// notification that no stream is there to carry, and the client would
// wait for it forever.
func TestAggregatePerUserStreamOpenedAfterConnecting(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{}}
	connected := make(chan struct{})
	logs := &upstreamtest.LogCapture{}
	url := personServe(t, pu, ppl, Options{Logger: slog.New(logs), AwaitConnect: func(ctx context.Context, owner, elicitation string) bool {
		select {
		case <-connected:
			return owner == "carol" && elicitation == "el-carol"
		case <-ctx.Done():
			return false
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := carolAsksToConnect(t, ctx, url, &mcp.ClientOptions{}, true)
	ppl.set("carol", true)
	close(connected)
	// The route found no stream to tell.
	for logs.Find(func(m map[string]string) bool { return strings.Contains(m["msg"], "no GET stream") }) == nil {
		select {
		case <-ctx.Done():
			t.Fatal("the route did not report a completion it could not send")
		case <-time.After(5 * time.Millisecond):
		}
	}
	get := func(who string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", cs.ID())
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		resp, err := (&http.Client{Transport: personRT{token: "tok-" + who, owner: who}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// Another token with carol's session id gets nothing, and takes
	// nothing of what was kept for her.
	resp := get("mallory")
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("mallory's GET of carol's session: HTTP %d, want 404", resp.StatusCode)
	}
	resp = get("carol")
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the GET stream: HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	var got []string
	for len(got) < 2 && sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			got = append(got, data)
		}
	}
	if len(got) != 2 || !strings.Contains(got[0], `"notifications/elicitation/complete"`) || !strings.Contains(got[0], `"elicitationId":"el-carol"`) ||
		!strings.Contains(got[1], `"notifications/tools/list_changed"`) {
		t.Fatalf("the stream opened after connecting carried %q (%v)", got, sc.Err())
	}
	if got, isErr := callText(t, cs, "mcp_people_whoami"); isErr || got != "whoami: carol" {
		t.Errorf("carol once connected: %q", got)
	}
}
