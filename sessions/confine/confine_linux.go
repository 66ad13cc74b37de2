package confine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// MinABI is the Landlock ABI a policy needs unless BestEffort: 4, the
// first with network rules (Linux 6.7).
const MinABI = 4

// maxABI is the newest ABI whose restrictions this package applies; see
// the package documentation for why not 9 and 10.
const maxABI = 7

// ABI returns the Landlock ABI version of the running kernel, 0 when
// Landlock is missing or disabled.
func ABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}

// Check reports why this kernel cannot enforce a policy that is not
// BestEffort, or nil when it can.
func Check() error {
	switch abi := ABI(); {
	case abi == 0:
		return errors.New("this kernel has no Landlock (it needs Linux 5.13 or later with landlock in the lsm= boot list), so agents cannot be confined")
	case abi < MinABI:
		return fmt.Errorf("this kernel's Landlock is ABI %d; the sandbox needs ABI %d (Linux 6.7 or later) for its network rule", abi, MinABI)
	}
	return nil
}

// Exec confines this process by p and replaces it with argv, looked up in
// PATH. It returns only on failure; nothing has run then.
func Exec(p Policy, argv []string) error {
	if len(argv) == 0 {
		return errors.New("no command to run")
	}
	prog, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	// Capabilities and the seccomp filter are per thread, and the exec
	// keeps those of the thread that calls it: stay on one.
	runtime.LockOSThread()
	if err := Apply(p, argv); err != nil {
		return err
	}
	return syscall.Exec(prog, argv, os.Environ())
}

// Apply confines the calling process: Landlock on every thread, then, on
// the calling thread (lock it: Exec does), the capabilities and the
// seccomp filter. argv is the command that will run, whose directories
// become readable.
func Apply(p Policy, argv []string) error {
	rules, err := plan(p, argv)
	if err != nil {
		return err
	}
	if err := restrict(p, rules); err != nil {
		return err
	}
	if err := dropCapabilities(); err != nil {
		return fmt.Errorf("dropping capabilities: %w", err)
	}
	if err := filterSyscalls(p.BestEffort); err != nil {
		return fmt.Errorf("seccomp filter: %w", err)
	}
	return nil
}

func restrict(p Policy, rules []rule) error {
	abi := ABI()
	var cfg landlock.Config
	switch {
	case p.BestEffort:
		cfg = landlock.V7.BestEffort()
	case abi < MinABI:
		return fmt.Errorf("%w; upgrade the kernel, or set `sandbox { best_effort }` on the agent to confine it as far as this kernel allows, or `sandbox off`", Check())
	default:
		cfg = []landlock.Config{landlock.V4, landlock.V5, landlock.V6, landlock.V7}[min(abi, maxABI)-MinABI]
	}
	// Only connect is restricted: an agent may listen (a dev server, a
	// test), which reaches nothing of the gateway's.
	cfg.HandledAccessNet = landlock.AccessNetSet(ll.AccessNetConnectTCP)
	if p.ConnectAny {
		cfg.HandledAccessNet = 0
	}
	var opts []landlock.Rule
	for _, r := range rules {
		switch {
		case r.dir && r.write:
			opts = append(opts, landlock.RWDirs(r.path).WithRefer())
		case r.dir:
			opts = append(opts, landlock.RODirs(r.path))
		case r.write:
			opts = append(opts, landlock.RWFiles(r.path))
		default:
			opts = append(opts, landlock.ROFiles(r.path))
		}
	}
	// /dev itself may be listed; only the listed device files opened. The
	// terminals get their ioctls.
	opts = append(opts,
		landlock.PathAccess(landlock.AccessFSSet(ll.AccessFSReadDir), "/dev"),
		landlock.RWFiles(Devices...).WithIoctlDev().IgnoreIfMissing(),
		landlock.RWDirs(DeviceDirs...).WithIoctlDev().IgnoreIfMissing(),
	)
	if !p.ConnectAny {
		for _, port := range p.Connect {
			opts = append(opts, landlock.ConnectTCP(port))
		}
	}
	if err := cfg.Restrict(opts...); err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	return nil
}

// dropCapabilities empties the calling thread's capability sets, the
// bounding set first so that an exec cannot bring them back. A process
// without capabilities has nothing to drop and no right to: it is left as
// it is.
func dropCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	if data[0].Effective == 0 && data[1].Effective == 0 && data[0].Permitted == 0 && data[1].Permitted == 0 {
		return nil
	}
	last := 40
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("PR_CAPBSET_DROP %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	data = [2]unix.CapUserData{}
	return unix.Capset(&hdr, &data[0])
}
