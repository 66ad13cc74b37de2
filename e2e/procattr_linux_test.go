package e2e

import (
	"os/exec"
	"syscall"
)

// setProcAttrs puts cmd in its own process group, so that cleanup can kill
// whatever it spawned, and has the kernel kill it if the test binary dies
// first (a panic or a -timeout), so that no child outlives the run.
func setProcAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
