//go:build linux

// Command confineprobe is an agent command of the e2e confinement test: run
// by the gateway in front of a real agent (`confineprobe <agent
// command…>`), it tries, from where an agent runs, every read and write an
// attacker's agent did, writes what happened to probe-report.json in its
// working directory (the session's cwd), and then execs the agent, so that
// the session goes on as usual. The targets (the gateway's pid, admin
// address, files) come from probe-targets.json beside it, which the test
// writes before it creates the session.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Targets is probe-targets.json.
type Targets struct {
	CaddyPID int      `json:"caddyPid"`
	Admin    string   `json:"admin"` // host:port of Caddy's admin API
	Read     []string `json:"read"`  // files of the gateway's: autosave.json, tokens.json, the admin key
	List     []string `json:"list"`  // directories of the gateway's
	Write    []string `json:"write"` // files outside the session's directories
}

// Probe is one line of the report.
type Probe struct {
	Name string `json:"name"`
	// Done is true when the operation succeeded: for the attacks, a
	// failure of the sandbox.
	Done   bool   `json:"done"`
	Detail string `json:"detail"`
}

// Report is probe-report.json.
type Report struct {
	UID    int               `json:"uid"`
	PPID   int               `json:"ppid"`
	Env    map[string]string `json:"env"`
	Probes []Probe           `json:"probes"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: confineprobe <agent command…>")
		os.Exit(2)
	}
	raw, err := os.ReadFile("probe-targets.json")
	if err == nil {
		var tg Targets
		if err := json.Unmarshal(raw, &tg); err != nil {
			fmt.Fprintln(os.Stderr, "confineprobe:", err)
			os.Exit(2)
		}
		rep := run(tg)
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile("probe-report.json", b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "confineprobe: writing the report:", err)
			os.Exit(2)
		}
	}
	prog, err := exec.LookPath(os.Args[1])
	if err == nil {
		err = syscall.Exec(prog, os.Args[1:], os.Environ())
	}
	fmt.Fprintln(os.Stderr, "confineprobe:", err)
	os.Exit(2)
}

func run(tg Targets) Report {
	rep := Report{UID: os.Getuid(), PPID: os.Getppid(), Env: map[string]string{}}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		rep.Env[k] = v
	}
	add := func(name string, err error, detail string) {
		p := Probe{Name: name, Done: err == nil, Detail: detail}
		if err != nil {
			p.Detail = err.Error()
		}
		rep.Probes = append(rep.Probes, p)
	}
	readFile := func(name, path string) {
		b, err := os.ReadFile(path)
		add(name, err, fmt.Sprintf("read %d bytes", len(b)))
	}

	for _, pid := range []int{rep.PPID, tg.CaddyPID} {
		proc := "/proc/" + strconv.Itoa(pid)
		readFile("read "+proc+"/environ", proc+"/environ")
		mem, err := os.Open(proc + "/mem")
		if err == nil {
			buf := make([]byte, 16)
			_, err = mem.ReadAt(buf, 0x400000)
			mem.Close()
		}
		add("read "+proc+"/mem", err, "read caddy's memory")
		link, err := os.Readlink(proc + "/cwd")
		add("readlink "+proc+"/cwd", err, link)
		// Listing the fd directory shows numbers only (allowed to the same
		// uid); opening one would give caddy's files and sockets.
		fds := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
		if entries, err := os.ReadDir(proc + "/fd"); err == nil {
			fds = fds[:0]
			for _, e := range entries {
				fds = append(fds, e.Name())
			}
		}
		var opened []string
		var lastErr error
		for _, fd := range fds {
			f, err := os.Open(proc + "/fd/" + fd)
			if err != nil {
				lastErr = err
				continue
			}
			f.Close()
			opened = append(opened, fd)
		}
		if len(opened) > 0 {
			add("open "+proc+"/fd/*", nil, "opened fds "+strings.Join(opened, ","))
		} else {
			add("open "+proc+"/fd/*", lastErr, "")
		}
		add(fmt.Sprintf("signal %d", pid), syscall.Kill(pid, 0), "kill -0")
	}

	client := &http.Client{Timeout: 5 * time.Second}
	admin := "http://" + tg.Admin
	for _, req := range []struct{ method, path, body string }{
		{http.MethodGet, "/config/", ""},
		{http.MethodPost, "/zidane/tokens", `{"name":"stolen","scopes":["chat","mcp"]}`},
		{http.MethodPost, "/load", `{"apps":{}}`},
	} {
		r, _ := http.NewRequest(req.method, admin+req.path, strings.NewReader(req.body))
		r.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(r)
		detail := ""
		if err == nil {
			detail = resp.Status
			resp.Body.Close()
		}
		add(req.method+" admin "+req.path, err, detail)
	}
	// The same through a Multipath TCP socket, which Landlock's TCP rule
	// does not see.
	add("mptcp connect admin", mptcpConnect(tg.Admin), "")

	for _, f := range tg.Read {
		readFile("read "+f, f)
		readFile("read "+f+" through /proc/caddy/root", filepath.Join("/proc", strconv.Itoa(tg.CaddyPID), "root", f))
	}
	for _, d := range tg.List {
		entries, err := os.ReadDir(d)
		add("list "+d, err, fmt.Sprintf("%d entries", len(entries)))
	}
	for _, f := range tg.Write {
		add("write "+f, os.WriteFile(f, []byte("escaped"), 0o644), "")
	}

	// What an agent needs must still work.
	add("control: write $HOME", os.WriteFile(filepath.Join(os.Getenv("HOME"), "probe"), []byte("x"), 0o600), os.Getenv("HOME"))
	add("control: write $TMPDIR", os.WriteFile(filepath.Join(os.Getenv("TMPDIR"), "probe"), []byte("x"), 0o600), os.Getenv("TMPDIR"))
	add("control: write cwd", os.WriteFile("probe-control", []byte("x"), 0o644), "")
	_, err := os.ReadFile("/etc/passwd")
	add("control: read /etc/passwd", err, "")
	return rep
}

// mptcpConnect connects to addr over Multipath TCP.
func mptcpConnect(addr string) error {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port, _ := strconv.Atoi(portStr)
	ip := net.ParseIP(host).To4()
	if ip == nil {
		return fmt.Errorf("not an IPv4 address: %s", host)
	}
	const ipprotoMPTCP = 262
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, ipprotoMPTCP)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	sa := &syscall.SockaddrInet4{Port: port}
	copy(sa.Addr[:], ip)
	return syscall.Connect(fd, sa)
}
