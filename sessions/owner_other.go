//go:build !unix

package sessions

import (
	"errors"
	"io/fs"
	"os/exec"
)

// fileOwner is unknown where files have no uid.
func fileOwner(fs.FileInfo) (int, bool) { return 0, false }

// runAs fails: switching users needs a Unix system.
func runAs(*exec.Cmd, *User) error {
	return errors.New("running git as the agent's user needs a Unix system")
}
