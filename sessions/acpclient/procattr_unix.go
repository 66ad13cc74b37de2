//go:build unix

package acpclient

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts the agent in a process group of its own, so that
// stopping it also stops the tools and servers it spawned, and runs it as
// user when one is given.
func setProcAttr(cmd *exec.Cmd, user *User) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if user != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: user.UID, Gid: user.GID, Groups: user.Groups}
	}
	return nil
}

// signalGroup sends sig to the agent's whole process group.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.Process == nil {
		return
	}
	// The group id is the leader's pid; a negative pid addresses the group.
	_ = syscall.Kill(-cmd.Process.Pid, sig)
}

func terminate(cmd *exec.Cmd) { signalGroup(cmd, syscall.SIGTERM) }
func kill(cmd *exec.Cmd)      { signalGroup(cmd, syscall.SIGKILL) }
