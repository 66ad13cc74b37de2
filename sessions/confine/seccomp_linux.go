package confine

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccompData offsets: int nr, u32 arch, u64 ip, u64 args[6].
const (
	offNr    = 0
	offArch  = 4
	offArg2  = 16 + 2*8 // the low half on little-endian machines
	x32Flag  = 0x40000000
	retAllow = unix.SECCOMP_RET_ALLOW
)

func retErrno(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }

// archs are the machines the filter is written for, with their socket
// system call.
var archs = map[string]struct {
	audit  uint32
	socket uint32
}{
	"amd64": {unix.AUDIT_ARCH_X86_64, 41},
	"arm64": {unix.AUDIT_ARCH_AARCH64, 198},
}

// filterSyscalls installs, on the calling thread, a seccomp filter that
// refuses what Landlock's network rule does not see:
//   - socket(…, IPPROTO_MPTCP) gets EPROTONOSUPPORT, as on a kernel
//     without Multipath TCP, so programs fall back to TCP;
//   - io_uring_setup gets ENOSYS (io_uring can open sockets without the
//     socket system call); programs fall back to plain system calls;
//   - any system call of another ABI (i386 or x32 on amd64, where
//     socketcall hides its arguments from the filter) gets ENOSYS.
//
// It needs no_new_privs, which Landlock has already set.
func filterSyscalls(bestEffort bool) error {
	a, ok := archs[runtime.GOARCH]
	if !ok {
		if bestEffort {
			return nil
		}
		return fmt.Errorf("no filter for %s; set `sandbox { best_effort }` to run without it", runtime.GOARCH)
	}
	const ioUringSetup = 425 // the same number on every architecture
	jeq := func(k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: jt, Jf: jf, K: k}
	}
	load := func(off uint32) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: off}
	}
	ret := func(k uint32) unix.SockFilter { return unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: k} }
	prog := []unix.SockFilter{
		/* 0 */ load(offArch),
		/* 1 */ jeq(a.audit, 1, 0),
		/* 2 */ ret(retErrno(unix.ENOSYS)),
		/* 3 */ load(offNr),
		/* 4 */ {Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, Jt: 0, Jf: 1, K: x32Flag},
		/* 5 */ ret(retErrno(unix.ENOSYS)),
		/* 6 */ jeq(ioUringSetup, 0, 1),
		/* 7 */ ret(retErrno(unix.ENOSYS)),
		/* 8 */ jeq(a.socket, 0, 3),
		/* 9 */ load(offArg2),
		/* 10 */ jeq(unix.IPPROTO_MPTCP, 0, 1),
		/* 11 */ ret(retErrno(unix.EPROTONOSUPPORT)),
		/* 12 */ ret(retAllow),
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return errno
	}
	return nil
}
