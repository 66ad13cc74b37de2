//go:build linux

package broker

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func stdioUpstream(t *testing.T) Upstream {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	return Upstream{Name: "local", Command: exe, Env: map[string]string{"BROKER_STDIO_SERVER": "1"}}
}

func pidFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestAggregateSharedStdio(t *testing.T) {
	logs := &logCapture{}
	dir := t.TempDir()
	a, url := aggServe(t, []Upstream{stdioUpstream(t)}, AggregateOptions{Logger: slog.New(logs), StdioIdle: -1, PIDDir: dir})
	ctx := testCtx(t)
	pid := waitPids(t, ctx, logs, "local", 1)[0]

	// Its pid file holds its command line.
	file := filepath.Join(dir, fmt.Sprintf("local-%d.pid", pid))
	rec, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("pid file: %v (files %v)", err, pidFiles(t, dir))
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
	if !alive(pid) {
		t.Fatal("the shared process ended with a downstream session")
	}

	a.Close()
	waitGone(t, ctx, pid, "the shared process after Close")
	if got := pidFiles(t, dir); len(got) != 0 {
		t.Fatalf("pid files after Close: %v", got)
	}
}

func TestAggregateSharedStdioIdle(t *testing.T) {
	logs := &logCapture{}
	dir := t.TempDir()
	_, url := aggServe(t, []Upstream{stdioUpstream(t)}, AggregateOptions{Logger: slog.New(logs), StdioIdle: 20 * time.Millisecond, PIDDir: dir})
	ctx := testCtx(t)
	first := waitPids(t, ctx, logs, "local", 1)[0]
	cs := aggConnect(t, url, nil)
	if got := aggCallText(t, ctx, cs, "mcp_local_echo", "one"); got != "stdio: one" {
		t.Fatalf("first call: %q", got)
	}
	// No call: the process is closed, its pid file removed, its tools
	// still offered.
	waitGone(t, ctx, first, "the idle shared process")
	for len(pidFiles(t, dir)) != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("pid files after the idle close: %v", pidFiles(t, dir))
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
	logs := &logCapture{}
	dir := t.TempDir()
	_, url := aggServe(t, []Upstream{stdioUpstream(t)}, AggregateOptions{Logger: slog.New(logs), StdioIdle: -1, PIDDir: dir})
	ctx := testCtx(t)
	first := waitPids(t, ctx, logs, "local", 1)[0]
	cs := aggConnect(t, url, nil)
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_local_exit", Arguments: map[string]any{}}); err != nil {
		t.Logf("exit call: %v", err)
	}
	waitGone(t, ctx, first, "the exited shared process")
	for len(pidFiles(t, dir)) != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("pid files after the process exited: %v", pidFiles(t, dir))
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

func TestCleanOrphans(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	ctx := testCtx(t)

	// A leftover stdio server (its stdin stays open, so it keeps running).
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = []string{"BROKER_STDIO_SERVER=1"}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		<-exited
	})
	// Start returns once the exec has begun, which can be before the kernel
	// shows the new command line: wait for it, as a gateway restarting
	// later would see it.
	want := cmdlineBytes(cmd.Args)
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		if bytes.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan's command line is %q, want %q", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	orphan := filepath.Join(dir, fmt.Sprintf("old-server-%d.pid", cmd.Process.Pid))
	if err := os.WriteFile(orphan, cmdlineBytes(cmd.Args), 0o600); err != nil {
		t.Fatal(err)
	}
	// A pid file whose pid (this test's) now runs another command.
	self := os.Getpid()
	unrelated := filepath.Join(dir, fmt.Sprintf("other-%d.pid", self))
	if err := os.WriteFile(unrelated, cmdlineBytes([]string{"/usr/bin/some-mcp-server", "--stdio"}), 0o600); err != nil {
		t.Fatal(err)
	}

	killed, err := CleanOrphans(dir, nil)
	if err != nil {
		t.Fatalf("CleanOrphans: %v", err)
	}
	if killed != 1 {
		t.Fatalf("killed = %d, want 1", killed)
	}
	select {
	case <-exited:
	case <-ctx.Done():
		t.Fatal("the orphan still runs")
	}
	if !alive(self) {
		t.Fatal("unreachable: this process is gone")
	}
	if got := pidFiles(t, dir); len(got) != 0 {
		t.Fatalf("pid files left: %v", got)
	}
	// A missing directory is no error.
	if _, err := CleanOrphans(filepath.Join(dir, "none"), nil); err != nil {
		t.Fatalf("missing dir: %v", err)
	}
}
