//go:build !linux

package caddymodule

import (
	"errors"
	"os"
	"runtime"
)

// canSwitchUser reports why this process cannot run a child as another
// user: on Unix systems other than Linux, only root can.
func canSwitchUser() error {
	if runtime.GOOS == "windows" {
		return errors.New("agents can run as another user on Unix only")
	}
	if os.Geteuid() != 0 {
		return errors.New("caddy cannot switch users: it does not run as root")
	}
	return nil
}

// setNonDumpable has no counterpart here: PR_SET_DUMPABLE is Linux's.
func setNonDumpable() error { return nil }
