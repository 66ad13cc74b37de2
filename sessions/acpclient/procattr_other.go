//go:build !unix

package acpclient

import "os/exec"

func setProcessGroup(*exec.Cmd) {}

// Without process groups only the agent itself can be stopped.
func terminate(cmd *exec.Cmd) { kill(cmd) }

func kill(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}
