//go:build unix && !linux

package e2e

import (
	"os/exec"
	"syscall"
)

// setProcAttrs puts cmd in its own process group, so that cleanup can kill
// whatever it spawned.
func setProcAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
