package upstream

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Pid files of stdio upstream processes.
//
// A pid file is <dir>/<upstream>-<pid>.pid; it holds the process's command
// line as /proc/<pid>/cmdline shows it (the arguments, each ended by a NUL
// byte), so that [CleanOrphans] can tell the process from an unrelated one
// that reused the pid. A process that rewrites its own argv (setting its
// title) no longer matches and is never ended by CleanOrphans.

// orphanStopWait is how long CleanOrphans waits for a process to exit after
// SIGTERM before it sends SIGKILL.
const orphanStopWait = 5 * time.Second

// livePIDFiles holds the pid files of processes this process runs, which
// CleanOrphans leaves alone (a Caddy reload builds the new route while the
// old one still runs, in the same process, maybe over the same directory).
var livePIDFiles sync.Map // path -> struct{}

// cmdlineBytes is argv as /proc/<pid>/cmdline shows it.
func cmdlineBytes(argv []string) []byte {
	var b bytes.Buffer
	for _, a := range argv {
		b.WriteString(a)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// writePIDFile records the process pid of upstream name, started with argv.
func writePIDFile(dir, name string, pid int, argv []string) (string, error) {
	safe := strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator || r == 0 {
			return '_'
		}
		return r
	}, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	file := filepath.Join(dir, fmt.Sprintf("%s-%d.pid", safe, pid))
	livePIDFiles.Store(file, struct{}{})
	if err := os.WriteFile(file, cmdlineBytes(argv), 0o600); err != nil {
		livePIDFiles.Delete(file)
		return "", err
	}
	return file, nil
}

func removePIDFile(file string) {
	_ = os.Remove(file)
	livePIDFiles.Delete(file)
}

// pidOf parses the pid out of a pid file's name (<upstream>-<pid>.pid).
func pidOf(name string) (int, bool) {
	base, ok := strings.CutSuffix(name, ".pid")
	if !ok {
		return 0, false
	}
	i := strings.LastIndexByte(base, '-')
	if i < 0 {
		return 0, false
	}
	pid, err := strconv.Atoi(base[i+1:])
	if err != nil || pid <= 1 {
		return 0, false
	}
	return pid, true
}

// runs reports whether process pid exists and its command line is cmdline
// (a zombie's, or an exited process's, is empty, so it does not match).
func runs(pid int, cmdline []byte) bool {
	got, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && len(got) > 0 && bytes.Equal(got, cmdline)
}

// CleanOrphans ends the stdio upstream processes named by the pid files
// left in dir (by a broker that did not stop them, e.g. a crashed Caddy),
// then removes those files. A process is ended only if /proc/<pid>/cmdline
// still matches the command line recorded in its file: a pid reused by an
// unrelated process is left alone (as is everything on a system without
// /proc). Ending is SIGTERM, then SIGKILL if the process is still there 5
// seconds later. Pid files of processes this process runs are left alone.
// It returns how many processes it ended; a missing dir is no error.
func CleanOrphans(dir string, log *slog.Logger) (killed int, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("reading the pid directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		pid, ok := pidOf(e.Name())
		if !ok {
			continue
		}
		file := filepath.Join(dir, e.Name())
		if _, live := livePIDFiles.Load(file); live {
			continue
		}
		cmdline, rerr := os.ReadFile(file)
		if rerr != nil {
			errs = append(errs, rerr)
			continue
		}
		if len(cmdline) > 0 && runs(pid, cmdline) {
			if stopOrphan(pid, cmdline) {
				killed++
				log.Warn("ended an orphaned stdio upstream process", "pid", pid, "pid_file", file)
			} else {
				errs = append(errs, fmt.Errorf("process %d (from %s) did not end", pid, file))
				continue
			}
		} else {
			log.Debug("stale pid file: its process is gone or is another program", "pid", pid, "pid_file", file)
		}
		if rerr := os.Remove(file); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			errs = append(errs, rerr)
		}
	}
	return killed, errors.Join(errs...)
}

// stopOrphan sends SIGTERM to pid, then SIGKILL if it still runs cmdline
// after [orphanStopWait], and reports whether it is gone.
func stopOrphan(pid int, cmdline []byte) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return true
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return !runs(pid, cmdline)
	}
	if waitExit(pid, cmdline, orphanStopWait) {
		return true
	}
	if runs(pid, cmdline) {
		_ = p.Kill()
	}
	return waitExit(pid, cmdline, orphanStopWait)
}

func waitExit(pid int, cmdline []byte, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for runs(pid, cmdline) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
