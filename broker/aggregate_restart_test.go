//go:build linux

package broker

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func aggTextOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestAggregateRestartSharedStdio(t *testing.T) {
	logs := &upstreamtest.LogCapture{}
	dir := t.TempDir()
	a, url := aggServe(t, []Upstream{stdioUpstream(t)}, AggregateOptions{Logger: slog.New(logs), StdioIdle: -1, PIDDir: dir})
	ctx := upstreamtest.Ctx(t)
	cs := aggConnect(t, url, nil)
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "one"); got != "stdio: one" {
		t.Fatalf("first call: %q", got)
	}
	pids := waitPids(t, ctx, logs, "local", 1)
	first := pids[0]

	if err := a.Restart(ctx, "local"); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	waitGone(t, ctx, first, "the shared process after Restart")
	// Its listing stays offered meanwhile.
	if got := aggToolNames(t, ctx, cs); !slices.Contains(got, "mcp_local_echo") {
		t.Fatalf("tools after Restart: %v", got)
	}
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "two"); got != "stdio: two" {
		t.Fatalf("call after Restart: %q", got)
	}
	pids = waitPids(t, ctx, logs, "local", 2)
	if pids[len(pids)-1] == first {
		t.Fatalf("pids = %v, want a new process after Restart", pids)
	}
	if upstreamtest.Alive(first) {
		t.Fatalf("the first process %d still runs", first)
	}

	// A second restart while calls run: those may fail, the next succeeds.
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_local_echo", Arguments: map[string]any{"text": "busy"}})
			if err == nil && res.IsError && !strings.Contains(aggTextOf(res), `"local"`) {
				err = fmt.Errorf("tool error not naming the upstream: %q", aggTextOf(res))
			}
			errs <- err
		}()
	}
	if err := a.Restart(ctx, "local"); err != nil {
		t.Fatalf("second Restart: %v", err)
	}
	for range 4 {
		select {
		case err := <-errs:
			if err != nil && strings.Contains(err.Error(), "not naming") {
				t.Error(err)
			}
		case <-ctx.Done():
			t.Fatal("calls in flight during Restart did not end")
		}
	}
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "three"); got != "stdio: three" {
		t.Fatalf("call after the second Restart: %q", got)
	}
}

func TestAggregateRestartUnknownAndUpstreams(t *testing.T) {
	ups := []Upstream{stdioUpstream(t), stdioUpstream(t), stdioUpstream(t)}
	ups[0].Name, ups[1].Name, ups[2].Name = "zeta", "alpha", "mid"
	a, _ := aggServe(t, ups, AggregateOptions{StdioIdle: -1})
	if got, want := a.Upstreams(), []string{"zeta", "alpha", "mid"}; !slices.Equal(got, want) {
		t.Fatalf("Upstreams = %v, want %v", got, want)
	}
	ctx := upstreamtest.Ctx(t)
	err := a.Restart(ctx, "nosuch")
	if err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Fatalf("Restart of an unknown upstream: %v, want an error naming it", err)
	}
}

// Retire stops a shared stdio upstream's process and starts none until a
// call needs it; Restart, by contrast, has the catalog start a new one.
func TestAggregateRetireSharedStdio(t *testing.T) {
	logs := &upstreamtest.LogCapture{}
	a, url := aggServe(t, []Upstream{stdioUpstream(t)}, AggregateOptions{Logger: slog.New(logs), StdioIdle: -1})
	ctx := upstreamtest.Ctx(t)
	cs := aggConnect(t, url, nil)
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "one"); got != "stdio: one" {
		t.Fatalf("first call: %q", got)
	}
	first := waitPids(t, ctx, logs, "local", 1)[0]
	if err := a.Retire(ctx, "local"); err != nil {
		t.Fatalf("Retire: %v", err)
	}
	waitGone(t, ctx, first, "the shared process after Retire")
	// Longer than the catalog's reconnect delay after a restart (500ms):
	// a restarted upstream would have a new process by now.
	time.Sleep(1500 * time.Millisecond)
	if pids := stdioPids(logs, "local"); len(pids) != 1 {
		t.Fatalf("a process started after Retire without a call: pids %v", pids)
	}
	if got := aggToolNames(t, ctx, cs); !slices.Contains(got, "mcp_local_echo") {
		t.Fatalf("tools after Retire: %v", got)
	}
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "two"); got != "stdio: two" {
		t.Fatalf("call after Retire: %q", got)
	}
	if pids := waitPids(t, ctx, logs, "local", 2); pids[1] == first {
		t.Fatalf("pids = %v, want a new process for the call after Retire", pids)
	}
}
