package confine

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
)

// Policy is what a confined command may do besides reading the system
// directories (SystemRead) and using the device files (Devices).
type Policy struct {
	// Read are directories or files the command may read and execute.
	Read []string
	// Write are directories or files it may also write, create, rename
	// inside and remove.
	Write []string
	// Deny are paths no rule may reach (the gateway's data and config
	// directories, its secret files), even when a Read or Write path, the
	// command's directory or a system directory holds them.
	Deny []string
	// Connect are the TCP ports it may connect to, on any address.
	Connect []uint16
	// ConnectAny lifts the network rule.
	ConnectAny bool
	// BestEffort confines as far as the kernel allows, down to not at all,
	// instead of failing on a kernel without Landlock ABI 4.
	BestEffort bool
}

// SystemRead are the directories every confined command may read and
// execute from: programs, libraries, /etc, and the kernel's /proc and
// /sys. /proc/<pid> of a process outside the sandbox stays closed all the
// same (see the package documentation).
var SystemRead = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt", "/proc", "/sys", "/run"}

// SystemDeny are paths that hold credentials on common systems, kept from
// agents even where SystemRead's directories hold them: systemd's
// LoadCredential= and container runtimes' secrets, and the files only root
// may read, which an agent that runs as root (no `user`) could otherwise:
// password hashes and TLS private keys.
var SystemDeny = []string{"/run/credentials", "/run/secrets",
	"/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssl/private"}

// Devices are the device files a confined command may read and write. The
// rest of /dev can only be listed: a raw disk or /dev/mem would give a
// process running as root what the rules keep from it.
var Devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx"}

// DeviceDirs are the device directories a confined command may write in:
// pseudo-terminals and shared memory.
var DeviceDirs = []string{"/dev/pts", "/dev/shm"}

// Args writes p as the flags that Parse reads.
func (p Policy) Args() []string {
	var args []string
	for _, r := range p.Read {
		args = append(args, "--read", r)
	}
	for _, w := range p.Write {
		args = append(args, "--write", w)
	}
	for _, d := range p.Deny {
		args = append(args, "--deny", d)
	}
	for _, c := range p.Connect {
		args = append(args, "--connect", strconv.Itoa(int(c)))
	}
	if p.ConnectAny {
		args = append(args, "--connect-any")
	}
	if p.BestEffort {
		args = append(args, "--best-effort")
	}
	return args
}

// Parse reads the flags that Args writes, then "--" and the command.
func Parse(args []string) (Policy, []string, error) {
	var p Policy
	for i := 0; i < len(args); i++ {
		flag := args[i]
		value := func() (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", flag)
			}
			i++
			return args[i], nil
		}
		var err error
		var v string
		switch flag {
		case "--":
			if i+1 >= len(args) {
				return p, nil, errors.New("no command after --: give the command to confine")
			}
			return p, args[i+1:], nil
		case "--read", "--write", "--deny":
			if v, err = value(); err == nil {
				if !filepath.IsAbs(v) {
					return p, nil, fmt.Errorf("%s %q: give an absolute path", flag, v)
				}
				switch flag {
				case "--read":
					p.Read = append(p.Read, v)
				case "--write":
					p.Write = append(p.Write, v)
				default:
					p.Deny = append(p.Deny, v)
				}
			}
		case "--connect":
			if v, err = value(); err == nil {
				n, perr := strconv.ParseUint(v, 10, 16)
				if perr != nil || n == 0 {
					return p, nil, fmt.Errorf("--connect %q: give a TCP port from 1 to 65535", v)
				}
				p.Connect = append(p.Connect, uint16(n))
			}
		case "--connect-any":
			p.ConnectAny = true
		case "--best-effort":
			p.BestEffort = true
		default:
			return p, nil, fmt.Errorf("unknown flag %q: use --read, --write, --deny, --connect, --connect-any, --best-effort, then -- and the command", flag)
		}
		if err != nil {
			return p, nil, err
		}
	}
	return p, nil, errors.New("no -- before the command: write the flags, --, then the command")
}

// Main is the confine command: it parses args as Parse does, confines
// this process and replaces it with the command. It returns only on
// failure, with the exit status to use, after saying why on stderr.
func Main(args []string) int {
	p, argv, err := Parse(args)
	if err == nil {
		err = Exec(p, argv)
	}
	fmt.Fprintf(os.Stderr, "confine: %v\n", err)
	return 126
}

// rule grants access to one path (a directory and what is beneath it, or
// one file).
type rule struct {
	path  string // resolved: Landlock holds the inode the path leads to
	dir   bool
	write bool
}

// plan turns p, with the system paths and the command's own directories,
// into rules: every path resolved, none reaching a denied path.
func plan(p Policy, argv []string) ([]rule, error) {
	deny := make([]string, 0, len(p.Deny)+len(SystemDeny))
	for _, d := range append(slices.Clone(p.Deny), SystemDeny...) {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("denied path %q is not absolute", d)
		}
		if r, err := filepath.EvalSymlinks(d); err == nil {
			d = r
		}
		deny = append(deny, filepath.Clean(d))
	}
	pl := &planner{deny: deny, seen: map[string]bool{}}
	for _, r := range SystemRead {
		if err := pl.add(r, false, false); err != nil {
			return nil, err
		}
	}
	for _, r := range CommandPaths(argv) {
		if err := pl.add(r, false, true); err != nil {
			return nil, fmt.Errorf("the command's directory: %w", err)
		}
	}
	for _, r := range p.Read {
		if err := pl.add(r, false, true); err != nil {
			return nil, err
		}
	}
	for _, w := range p.Write {
		if err := pl.add(w, true, true); err != nil {
			return nil, err
		}
	}
	return pl.rules, nil
}

type planner struct {
	deny  []string
	seen  map[string]bool // resolved path + access already planned
	rules []rule
}

// add plans access to path. explicit paths must exist and must not be
// denied; the system paths, and the entries of a directory split around a
// denied path, are skipped when they do not exist or are denied.
func (pl *planner) add(path string, write, explicit bool) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		if !explicit && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	key := fmt.Sprint(real, write)
	if pl.seen[key] {
		return nil
	}
	pl.seen[key] = true
	for _, d := range pl.deny {
		if pathtree.Within(real, d) {
			if !explicit {
				return nil
			}
			if real != path {
				return fmt.Errorf("%s (%s) is inside %s, which the sandbox keeps from agents", path, real, d)
			}
			return fmt.Errorf("%s is inside %s, which the sandbox keeps from agents", path, d)
		}
	}
	fi, err := os.Stat(real)
	if err != nil {
		if !explicit {
			return nil
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	if fi.IsDir() {
		for _, d := range pl.deny {
			if pathtree.Within(d, real) {
				return pl.split(real, write)
			}
		}
	}
	pl.rules = append(pl.rules, rule{path: real, dir: fi.IsDir(), write: write})
	return nil
}

// split plans access to each entry of dir, which holds a denied path,
// rather than to dir itself. Entries made later are not covered.
func (pl *planner) split(dir string, write bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("listing %s, which holds a denied path: %w", dir, err)
	}
	for _, e := range entries {
		if err := pl.add(filepath.Join(dir, e.Name()), write, false); err != nil {
			return err
		}
	}
	return nil
}

// CommandPaths are the directories a command needs to read to run: the
// directory of its program (found in PATH, symlinks followed), of the
// interpreter its #! line names, and of every argument that is an
// absolute path to a file (a script). A file under node_modules brings the
// directory that holds that node_modules, where the package's dependencies
// and its package.json are found.
func CommandPaths(argv []string) []string {
	if len(argv) == 0 {
		return nil
	}
	var out []string
	addFile := func(p string) {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return
		}
		if fi, err := os.Stat(real); err != nil || fi.IsDir() {
			return
		}
		dir := filepath.Dir(real)
		if i := strings.LastIndex(dir+"/", "/node_modules/"); i >= 0 {
			dir = filepath.Dir(dir[:i+len("/node_modules")])
		}
		if !slices.Contains(out, dir) {
			out = append(out, dir)
		}
	}
	prog, err := exec.LookPath(argv[0])
	if err == nil {
		prog, _ = filepath.Abs(prog)
		addFile(prog)
		if interp := interpreter(prog); interp != "" {
			addFile(interp)
		}
	}
	for _, a := range argv[1:] {
		if filepath.IsAbs(a) {
			addFile(a)
		}
	}
	return out
}

// interpreter returns the program a script's #! line runs (through
// /usr/bin/env too), or "".
func interpreter(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" || !strings.HasPrefix(line, "#!") {
		return ""
	}
	fields := strings.Fields(line[2:])
	if len(fields) == 0 {
		return ""
	}
	prog := fields[0]
	if filepath.Base(prog) == "env" {
		for _, f := range fields[1:] {
			if strings.HasPrefix(f, "-") || strings.Contains(f, "=") {
				continue
			}
			if p, err := exec.LookPath(f); err == nil {
				return p
			}
			return ""
		}
		return ""
	}
	return prog
}
