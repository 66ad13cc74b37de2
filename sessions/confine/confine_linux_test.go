package confine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the confiner (CONFINE_TEST=confine, as
// `caddy zidane confine` runs) and as the confined command (its first
// argument "probe"), which tries what the environment names and prints
// what happened as JSON.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		os.Exit(probe())
	}
	if os.Getenv("CONFINE_TEST") == "confine" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// probeTargets is what the confined probe tries, from the environment.
type probeTargets struct {
	Read, Write        []string
	Connect            []string // host:port
	Environ            []int    // pids whose /proc/<pid>/environ to read
	Signal             []int    // pids to send signal 0
	MPTCP, Caps, Kcore bool
}

func probe() int {
	var tg probeTargets
	if err := json.Unmarshal([]byte(os.Getenv("CONFINE_PROBE")), &tg); err != nil {
		fmt.Println(err)
		return 2
	}
	out := map[string]string{}
	res := func(k string, err error) {
		if err == nil {
			out[k] = "ok"
		} else {
			out[k] = err.Error()
		}
	}
	for _, p := range tg.Read {
		_, err := os.ReadFile(p)
		res("read "+p, err)
	}
	for _, p := range tg.Write {
		res("write "+p, os.WriteFile(p, []byte("x"), 0o600))
	}
	for _, a := range tg.Connect {
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err == nil {
			c.Close()
		}
		res("connect "+a, err)
	}
	for _, pid := range tg.Environ {
		_, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		res(fmt.Sprintf("environ %d", pid), err)
	}
	for _, pid := range tg.Signal {
		res(fmt.Sprintf("signal %d", pid), syscall.Kill(pid, 0))
	}
	if tg.MPTCP {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)
		if err == nil {
			unix.Close(fd)
		}
		res("mptcp", err)
	}
	if tg.Caps {
		status, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "CapEff:") || strings.HasPrefix(l, "CapBnd:") {
				out[strings.TrimSuffix(strings.Fields(l)[0], ":")] = strings.Fields(l)[1]
			}
		}
	}
	if tg.Kcore {
		f, err := os.Open("/proc/kcore")
		if err == nil {
			f.Close()
		}
		res("kcore", err)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	return 0
}

// runConfined runs the probe under p and returns what it reported.
func runConfined(t *testing.T, p Policy, tg probeTargets) map[string]string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tgJSON, _ := json.Marshal(tg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, append(p.Args(), "--", exe, "probe")...)
	cmd.Env = append(os.Environ(), "CONFINE_TEST=confine", "CONFINE_PROBE="+string(tgJSON))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("confined probe: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	out := map[string]string{}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("probe output %q: %v (stderr %s)", stdout.String(), err, stderr.String())
	}
	return out
}

func requireLandlock(t *testing.T) {
	t.Helper()
	if err := Check(); err != nil {
		t.Skipf("no sandbox on this kernel: %v", err)
	}
}

// TestConfinedProcess runs a command under a policy and checks each rule
// from inside: what it may touch works, the rest is refused by the kernel.
func TestConfinedProcess(t *testing.T) {
	requireLandlock(t)
	// The executable's own directory is readable; the test's temporary
	// directories must not sit under it.
	base := t.TempDir()
	readable := filepath.Join(base, "readable")
	denied := filepath.Join(readable, "secret")
	work := filepath.Join(base, "work")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{denied, work, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(readable, "note"), filepath.Join(denied, "key"), filepath.Join(outside, "file")} {
		if err := os.WriteFile(f, []byte("v"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	allowedLn, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer allowedLn.Close()
	otherLn, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer otherLn.Close()
	for _, ln := range []net.Listener{allowedLn, otherLn} {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	allowedPort := uint16(allowedLn.Addr().(*net.TCPAddr).Port)

	p := Policy{Read: []string{readable}, Write: []string{work}, Deny: []string{denied}, Connect: []uint16{allowedPort}}
	tg := probeTargets{
		Read:    []string{filepath.Join(readable, "note"), filepath.Join(denied, "key"), filepath.Join(outside, "file"), "/etc/hostname", "/etc/shadow"},
		Write:   []string{filepath.Join(work, "new"), filepath.Join(readable, "new"), filepath.Join(outside, "new"), "/dev/null"},
		Connect: []string{allowedLn.Addr().String(), otherLn.Addr().String()},
		Environ: []int{os.Getpid()},
		Signal:  []int{os.Getpid()},
		MPTCP:   true,
		Caps:    true,
		Kcore:   true,
	}
	got := runConfined(t, p, tg)
	t.Logf("probe: %v", got)

	denyErr := func(k string) {
		t.Helper()
		if v, ok := got[k]; !ok || v == "ok" {
			t.Errorf("%s: %q, want it refused", k, v)
		}
	}
	allowOK := func(k string) {
		t.Helper()
		if got[k] != "ok" {
			t.Errorf("%s: %q, want ok", k, got[k])
		}
	}
	allowOK("read " + filepath.Join(readable, "note"))
	allowOK("read /etc/hostname")
	allowOK("write " + filepath.Join(work, "new"))
	allowOK("write /dev/null")
	allowOK("connect " + allowedLn.Addr().String())
	denyErr("read " + filepath.Join(denied, "key"))
	denyErr("read " + filepath.Join(outside, "file"))
	denyErr("write " + filepath.Join(readable, "new"))
	denyErr("write " + filepath.Join(outside, "new"))
	denyErr("connect " + otherLn.Addr().String())
	// Landlock refuses ptrace access to processes outside the sandbox,
	// which /proc/<pid>/environ needs, whatever the uid.
	denyErr(fmt.Sprintf("environ %d", os.Getpid()))
	if got["mptcp"] != unix.EPROTONOSUPPORT.Error() {
		t.Errorf("an MPTCP socket: %q, want %q", got["mptcp"], unix.EPROTONOSUPPORT.Error())
	}
	if os.Geteuid() == 0 {
		if got["CapEff"] != "0000000000000000" || got["CapBnd"] != "0000000000000000" {
			t.Errorf("capabilities of a confined root process: effective %s, bounding %s; want none", got["CapEff"], got["CapBnd"])
		}
		denyErr("kcore")
		// Root reads the password hashes unconfined; a confined root
		// process does not, though /etc is readable (SystemDeny).
		if _, err := os.ReadFile("/etc/shadow"); err == nil {
			denyErr("read /etc/shadow")
		}
	}
	if ABI() >= 6 {
		denyErr(fmt.Sprintf("signal %d", os.Getpid()))
	}
	for _, f := range []string{filepath.Join(readable, "new"), filepath.Join(outside, "new")} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after a refused write: %v", f, err)
		}
	}

	t.Run("connect any", func(t *testing.T) {
		got := runConfined(t, Policy{ConnectAny: true}, probeTargets{Connect: []string{otherLn.Addr().String()}})
		if got["connect "+otherLn.Addr().String()] != "ok" {
			t.Errorf("connect with ConnectAny: %v", got)
		}
	})
}

// TestExecFailsBeforeRunning: a policy that cannot be applied stops the
// launch with a message, and the command never runs.
func TestExecFailsBeforeRunning(t *testing.T) {
	requireLandlock(t)
	exe, _ := os.Executable()
	dir := t.TempDir()
	cmd := exec.Command(exe, append(Policy{Write: []string{dir}, Deny: []string{dir}}.Args(), "--", exe, "probe")...)
	cmd.Env = append(os.Environ(), "CONFINE_TEST=confine", "CONFINE_PROBE={}")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 126 || !strings.Contains(string(out), "keeps from agents") || strings.Contains(string(out), "{}") {
		t.Fatalf("a denied write path: %v\n%s", err, out)
	}
}
