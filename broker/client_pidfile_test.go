package broker

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
)

func TestCleanOrphans(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	ctx := upstreamtest.Ctx(t)

	// A leftover stdio server (its stdin stays open, so it keeps running).
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = []string{upstreamtest.StdioEnv + "=1"}
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
	if !upstreamtest.Alive(self) {
		t.Fatal("unreachable: this process is gone")
	}
	if got := upstreamtest.PIDFiles(t, dir); len(got) != 0 {
		t.Fatalf("pid files left: %v", got)
	}
	// A missing directory is no error.
	if _, err := CleanOrphans(filepath.Join(dir, "none"), nil); err != nil {
		t.Fatalf("missing dir: %v", err)
	}
}
