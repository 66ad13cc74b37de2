package caddymodule

import (
	"errors"

	"golang.org/x/sys/unix"
)

// canSwitchUser reports why this process cannot run a child as another
// user: it needs CAP_SETUID and CAP_SETGID (root has them).
func canSwitchUser() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	const need = 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID
	if data[0].Effective&need != need {
		return errors.New("caddy cannot switch users: it lacks CAP_SETUID and CAP_SETGID")
	}
	return nil
}

// setNonDumpable keeps processes of Caddy's uid (an unconfined agent run
// as the same user) out of /proc/<caddy>/environ, mem and fd/, and disables
// core dumps, which would hold the secrets in memory. It does not stop
// root; the agents' sandbox does.
func setNonDumpable() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}
