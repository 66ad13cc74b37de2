// Package confine runs one command in a sandbox, so that a coding agent
// (or the git that makes its worktree) cannot reach the gateway that
// started it: its storage, its memory, its admin API.
//
// The sandbox is applied by the process itself, just before it replaces
// itself with the command ([Exec], which `caddy zidane confine` calls):
//
//   - Landlock (Linux 5.13 and later; the network rules need ABI 4, Linux
//     6.7): reads and executes only under the system directories (see
//     [SystemRead]), a few device files, the command's own directories and
//     Policy.Read; writes, creates and removes only under Policy.Write and
//     those device files; TCP connect only to Policy.Connect unless
//     ConnectAny. From ABI 6, signals and abstract unix sockets stop at the
//     sandbox's edge. Landlock also keeps the process and its children from
//     ptrace-ing anything outside the sandbox, which is what
//     /proc/<pid>/environ, mem, cwd, root and fd/ require, even as root.
//   - Policy.Deny: paths that no rule may reach. A Read or Write path at or
//     inside one is an error; a rule on a directory that holds one is split
//     into rules on its entries, so the denied path stays out.
//   - A seccomp filter that refuses Multipath TCP sockets (Landlock's TCP
//     rules do not cover them, and they connect to plain TCP listeners),
//     io_uring (which could create one without the socket system call), and
//     foreign system-call ABIs (i386 and x32 on amd64), whose socketcall
//     cannot be inspected.
//   - When it runs as root: every capability dropped, bounding set
//     included, so that uid 0 cannot read raw devices or kernel memory
//     (/proc/kcore), which Landlock does not cover. A root-owned file is
//     still the owner's: Landlock's rules are what keep those out.
//
// What it never does: pick the paths. The caller (the session engine)
// says which directories belong to the command; this package only makes
// the kernel hold to it. Landlock's ABI 9 (pathname unix sockets) and 10
// (UDP) are not used: a gateway whose admin API listens on a unix socket
// is reachable from a sandbox on kernels before ABI 9 anyway, so keep the
// admin API on TCP (Caddy's default, localhost:2019).
package confine
