//go:build linux

package broker

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func stdioUpstream(t *testing.T) Upstream {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	return Upstream{Name: "local", Command: exe, Env: map[string]string{upstreamtest.StdioEnv: "1"}}
}

func TestAggregateSharedStdio(t *testing.T) {
	logs := &upstreamtest.LogCapture{}
	dir := t.TempDir()
	a, url := aggServe(t, []Upstream{stdioUpstream(t)}, AggregateOptions{Logger: slog.New(logs), StdioIdle: -1, PIDDir: dir})
	ctx := upstreamtest.Ctx(t)
	pid := waitPids(t, ctx, logs, "local", 1)[0]

	// Its pid file holds its command line.
	file := filepath.Join(dir, fmt.Sprintf("local-%d.pid", pid))
	rec, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("pid file: %v (files %v)", err, upstreamtest.PIDFiles(t, dir))
	}
	proc, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Equal(rec, proc) {
		t.Fatalf("pid file holds %q, /proc cmdline %q (%v)", rec, proc, err)
	}

	cs1 := aggConnect(t, url, nil)
	cs2 := aggConnect(t, url, nil)
	for i, cs := range []*mcp.ClientSession{cs1, cs2, cs1, cs2} {
		text := fmt.Sprint("call ", i)
		if got := aggCallText(t, ctx, cs, "mcp_local_echo", text); got != "stdio: "+text {
			t.Fatalf("call %d = %q", i, got)
		}
	}
	if got := stdioPids(logs, "local"); !slices.Equal(got, []int{pid}) {
		t.Fatalf("stdio processes = %v, want the one shared process %d", got, pid)
	}
	// A downstream session's end leaves the shared process running.
	cs1.Close()
	if got := aggCallText(t, ctx, cs2, "mcp_local_echo", "after"); got != "stdio: after" {
		t.Fatalf("after the first session closed: %q", got)
	}
	if !upstreamtest.Alive(pid) {
		t.Fatal("the shared process ended with a downstream session")
	}

	a.Close()
	waitGone(t, ctx, pid, "the shared process after Close")
	if got := upstreamtest.PIDFiles(t, dir); len(got) != 0 {
		t.Fatalf("pid files after Close: %v", got)
	}
}

func TestAggregateSharedStdioIdle(t *testing.T) {
	logs := &upstreamtest.LogCapture{}
	dir := t.TempDir()
	_, url := aggServe(t, []Upstream{stdioUpstream(t)}, AggregateOptions{Logger: slog.New(logs), StdioIdle: 20 * time.Millisecond, PIDDir: dir})
	ctx := upstreamtest.Ctx(t)
	first := waitPids(t, ctx, logs, "local", 1)[0]
	cs := aggConnect(t, url, nil)
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "one"); got != "stdio: one" {
		t.Fatalf("first call: %q", got)
	}
	// No call: the process is closed, its pid file removed, its tools
	// still offered.
	waitGone(t, ctx, first, "the idle shared process")
	for len(upstreamtest.PIDFiles(t, dir)) != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("pid files after the idle close: %v", upstreamtest.PIDFiles(t, dir))
		case <-time.After(5 * time.Millisecond):
		}
	}
	if got := aggToolNames(t, ctx, cs); !slices.Contains(got, "mcp_local_echo") {
		t.Fatalf("tools while closed for idleness: %v", got)
	}
	// The next call starts it again.
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "two"); got != "stdio: two" {
		t.Fatalf("call after the idle close: %q", got)
	}
	pids := waitPids(t, ctx, logs, "local", 2)
	if pids[1] == first {
		t.Fatalf("pids = %v, want a new process", pids)
	}
}

// A shared process that exits by itself loses its pid file, and the next
// call gets a new one.
func TestAggregateSharedStdioExit(t *testing.T) {
	logs := &upstreamtest.LogCapture{}
	dir := t.TempDir()
	_, url := aggServe(t, []Upstream{stdioUpstream(t)}, AggregateOptions{Logger: slog.New(logs), StdioIdle: -1, PIDDir: dir})
	ctx := upstreamtest.Ctx(t)
	first := waitPids(t, ctx, logs, "local", 1)[0]
	cs := aggConnect(t, url, nil)
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_local_exit", Arguments: map[string]any{}}); err != nil {
		t.Logf("exit call: %v", err)
	}
	waitGone(t, ctx, first, "the exited shared process")
	for len(upstreamtest.PIDFiles(t, dir)) != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("pid files after the process exited: %v", upstreamtest.PIDFiles(t, dir))
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Until the broker has seen the process end, a call may still fail
	// fast with a tool error naming the upstream; then it starts a new one.
	for {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_local_echo", Arguments: map[string]any{"text": "again"}})
		if err != nil {
			t.Fatalf("call after the exit: %v", err)
		}
		if !res.IsError {
			if got := aggTextOf(res); got != "stdio: again" {
				t.Fatalf("call after the exit: %q", got)
			}
			break
		}
		if got := aggTextOf(res); !strings.Contains(got, `"local"`) {
			t.Fatalf("call after the exit: tool error %q does not name the upstream", got)
		}
		select {
		case <-ctx.Done():
			t.Fatal("calls never succeeded after the shared process exited")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if pids := waitPids(t, ctx, logs, "local", 2); pids[1] == first {
		t.Fatalf("pids = %v, want a new process", pids)
	}
}
