//go:build !unix

package acpclient

import (
	"errors"
	"os/exec"
)

func setProcAttr(_ *exec.Cmd, user *User) error {
	if user != nil {
		return errors.New("running an agent as another user needs a Unix system")
	}
	return nil
}

// Without process groups only the agent itself can be stopped.
func terminate(cmd *exec.Cmd) { kill(cmd) }

func kill(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}
