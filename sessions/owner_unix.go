//go:build unix

package sessions

import (
	"io/fs"
	"os/exec"
	"syscall"
)

// fileOwner is the uid that owns fi.
func fileOwner(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// runAs makes cmd run as user.
func runAs(cmd *exec.Cmd, user *User) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: user.UID, Gid: user.GID, Groups: user.Groups}}
	return nil
}
