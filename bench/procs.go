package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// moduleRoot finds the directory holding go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("run the harness from inside the caddy-zidane-mcp module")
	}
	return filepath.Dir(gomod), nil
}

// build compiles pkg of the module into dir and returns the binary's path.
func build(ctx context.Context, root, dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

// proc is a started child process.
type proc struct {
	cmd  *exec.Cmd
	logs *bytes.Buffer
}

func start(ctx context.Context, bin string, env []string, args ...string) (*proc, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &proc{cmd: cmd, logs: &logs}, nil
}

func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// startUpstream runs the upstream MCP server and returns its address.
func startUpstream(ctx context.Context, bin string, args ...string) (*proc, string, error) {
	return startListening(ctx, bin, append([]string{"-addr", "127.0.0.1:0"}, args...)...)
}

// startListening runs bin with args and returns its address, which it
// reports on its first line of stderr as "listening on ADDR".
func startListening(ctx context.Context, bin string, args ...string) (*proc, string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	p := &proc{cmd: cmd, logs: new(bytes.Buffer)}
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil {
		p.stop()
		return nil, "", fmt.Errorf("%s did not report its address: %v", filepath.Base(bin), err)
	}
	go io.Copy(io.Discard, stderr)
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if !ok {
		p.stop()
		return nil, "", fmt.Errorf("%s said %q", filepath.Base(bin), line)
	}
	return p, addr, nil
}

// freePort returns a loopback port nothing listens on, and never the same
// one twice in a run. The kernel may hand a just-closed port out again, and
// caddy binds with SO_REUSEPORT: two sites (or a site and the admin API)
// given one port would both bind it and split its connections between them.
func freePort() (int, error) {
	issuedMu.Lock()
	defer issuedMu.Unlock()
	for range 1000 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !issued[port] {
			issued[port] = true
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free loopback port this run has not handed out already")
}

var (
	issuedMu sync.Mutex
	issued   = map[int]bool{}
)

func waitListening(ctx context.Context, addr string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("nothing listens on %s after a minute", addr)
}

// cpuTime is the user+system CPU time of pid, from /proc.
func cpuTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const userHZ = 100
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

// rss is the resident set size of pid in bytes, from /proc.
func rss(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// children are the processes whose parent is pid, with their state letter
// ('Z' for a zombie not yet reaped), from /proc. Processes that end while it
// reads are skipped.
func children(pid int) map[int]byte {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	kids := map[int]byte{}
	parent := strconv.Itoa(pid)
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(raw, ')')
		if i < 0 || i+2 > len(raw) {
			continue
		}
		fields := strings.Fields(string(raw[i+2:]))
		if len(fields) > 1 && fields[1] == parent && len(fields[0]) > 0 {
			kids[child] = fields[0][0]
		}
	}
	return kids
}

// runs reports whether pid is alive and runs the program bin.
func runs(pid int, bin string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	if resolved, err := filepath.EvalSymlinks(bin); err == nil {
		bin = resolved
	}
	return exe == bin
}

// mcpGoPeerRoute names the mcp-go aggregator stand-in's route in the table.
const mcpGoPeerRoute = "mcp-go proxy stand-in (2 upstreams)"

// startMCPGoPeer builds and runs bench/peer/mcpgoproxy over the two
// upstreams, with a token of its own, and returns its route.
func startMCPGoPeer(ctx context.Context, work, upstream, second string) (*proc, route, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return nil, route{}, err
	}
	fmt.Fprintln(os.Stderr, "bench: building the mcp-go peer…")
	bin, err := build(ctx, root, work, "mcpgoproxy", "./bench/peer/mcpgoproxy")
	if err != nil {
		return nil, route{}, err
	}
	token := strconv.FormatInt(time.Now().UnixNano(), 36) + "-peer"
	p, addr, err := startListening(ctx, bin, "-addr", "127.0.0.1:0", "-token", token,
		"-upstream", "bench=http://"+upstream+"/mcp", "-upstream", "bench2=http://"+second+"/mcp")
	if err != nil {
		return nil, route{}, err
	}
	return p, route{name: mcpGoPeerRoute, url: "http://" + addr + "/mcp", token: token, prefix: "mcp_bench_", pid: p.cmd.Process.Pid}, nil
}

// memStats is what the bench reads of a Go process's memory statistics.
type memStats struct {
	Mallocs    uint64 // heap objects allocated, cumulative
	TotalAlloc uint64 // heap bytes allocated, cumulative
}

// readMemStats reads caddy's runtime.MemStats from its admin API
// (/debug/vars, expvar's memstats).
func readMemStats(ctx context.Context, admin string) (memStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/debug/vars", nil)
	if err != nil {
		return memStats{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return memStats{}, fmt.Errorf("reading caddy's memory statistics: %w", err)
	}
	defer resp.Body.Close()
	var vars struct {
		Memstats *memStats `json:"memstats"`
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&vars)
	switch {
	case resp.StatusCode != http.StatusOK:
		return memStats{}, fmt.Errorf("reading caddy's memory statistics: the admin API answered %s", resp.Status)
	case err != nil:
		return memStats{}, fmt.Errorf("reading caddy's memory statistics: %w", err)
	case vars.Memstats == nil:
		return memStats{}, errors.New("reading caddy's memory statistics: /debug/vars holds no memstats")
	}
	return *vars.Memstats, nil
}
